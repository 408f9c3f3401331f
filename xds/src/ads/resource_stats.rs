//! Envoy's per-resource subscription statistics. Envoy gives each SDS secret a cluster names,
//! each EDS cluster and each RDS route table a subscription of its own, with the subscription
//! counters under a scope named after it (`sds.<name>.*`, `cluster.<stat name>.*`,
//! `http.<stat prefix>.rds.<name>.*`); the ADS client counts the same per subscribed name:
//!
//! - `update_attempt`: the subscription starting, and each of the events below;
//! - `update_success`: a response carrying (or removing) the resource, accepted whole;
//! - `update_rejected`: a response of the type NACKed, whichever resource was refused and
//!   whether or not it carried this one (Envoy's mux fails every watch of the type). Where
//!   Envoy refuses a resource inside its subscription's update (a secret whose key does not
//!   match, a route table that does not build: [`Refusals::InUpdate`]), the refused one counts
//!   one attempt more in delta, the update it began (the client passes no such refusal in
//!   state of the world, where Envoy's mux counts none); where its refusals are the proto's constraints,
//!   checked as the response is decoded (endpoints: [`Refusals::AtDecode`]), none does
//!   (Envoy 1.40 seen doing both by `tests/tests/istiod_credential_tls.rs` and
//!   `tests/tests/istiod_subscription_stats.rs`);
//! - `update_failure`: the stream failing while the resource is subscribed;
//! - `update_time` (ms since the epoch of the last success) and `version` (Envoy's xxHash64 of
//!   the accepted response's version, the text kept as `version_text`);
//! - what the resource's owner counts of an accepted update: `update_empty` (an EDS cluster's
//!   assignment removed), `update_no_rebuild` (an EDS cluster's assignment the same as the one
//!   in force: nothing rebuilt) and `config_reload` with its time (an RDS route table that
//!   changed); "the same" is the same bytes as the last accepted.
//!
//! SDS's `init_fetch_timeout` is counted by the store, whose clocks time the initial fetch
//! ([`crate::store::Store::secret_fetch_timeouts`]); the exporter adds it, and one attempt each.
//!
//! A resource no longer subscribed loses its statistics, as Envoy's go with its subscription;
//! so each map is bounded by the names subscribed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Where Envoy refuses a resource of the type: that decides whether the refused one counts an
/// attempt more than the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Refusals {
    /// Inside its subscription's update (SDS, RDS): the refused resource's update was begun.
    #[default]
    InUpdate,
    /// As the response is decoded, before any subscription sees it (EDS).
    AtDecode,
}

/// One resource's counters, as Envoy names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceCounters {
    pub update_attempt: u64,
    pub update_success: u64,
    pub update_rejected: u64,
    pub update_failure: u64,
    /// Accepted updates that removed the resource.
    pub update_empty: u64,
    /// Accepted updates that left it as it was.
    pub update_no_rebuild: u64,
    /// Accepted updates that changed it, and when the last did (ms since the epoch).
    pub config_reload: u64,
    pub config_reload_time: u64,
    /// Milliseconds since the Unix epoch of the last success; 0 before one.
    pub update_time: u64,
    /// xxHash64 (seed 0) of the last accepted response's version, as Envoy's `version` gauge.
    pub version: u64,
    pub version_text: String,
    /// xxHash64 of the last accepted body, to tell a change from the same resource sent again.
    last_body: Option<u64>,
}

/// The counters of every resource of one type subscribed, by name.
#[derive(Debug, Default)]
pub struct ResourceStats {
    refusals: Refusals,
    resources: Mutex<BTreeMap<String, ResourceCounters>>,
}

/// What a response carried of one resource: its body's hash, or `None` for its removal.
pub type Carried<'a> = (&'a String, Option<u64>);

/// The hash a body is compared by.
pub fn body_hash(body: &[u8]) -> u64 {
    twox_hash::XxHash64::oneshot(0, body)
}

impl ResourceStats {
    /// Counters for a type whose refusals Envoy makes as `refusals` says.
    pub fn new(refusals: Refusals) -> ResourceStats {
        ResourceStats {
            refusals,
            resources: Mutex::default(),
        }
    }

    /// Every subscribed resource's counters, by name.
    pub fn snapshot(&self) -> BTreeMap<String, ResourceCounters> {
        self.lock().clone()
    }

    /// The subscription to the resources now `wanted` changed from `before`: new names start
    /// (one attempt each), names gone lose their counters.
    pub fn resubscribed(&self, before: &BTreeSet<String>, wanted: &BTreeSet<String>) {
        if before == wanted {
            return;
        }
        let mut resources = self.lock();
        resources.retain(|name, _| wanted.contains(name));
        for name in wanted.difference(before) {
            resources.entry(name.clone()).or_default().update_attempt += 1;
        }
    }

    /// A response carrying `carried` was answered: accepted whole, with `version`, or NACKed.
    /// A NACK counts against every resource subscribed, carried or not, and those `begun`
    /// (refused inside an update Envoy began: see [`Refusals`]) one attempt more; what it
    /// carried that was applied (not `refused`) is remembered as in force.
    pub fn answered<'a>(
        &self,
        carried: impl IntoIterator<Item = Carried<'a>>,
        version: &str,
        nacked: bool,
        refused: &BTreeSet<&String>,
        begun: &BTreeSet<&String>,
    ) {
        let mut resources = self.lock();
        if nacked {
            for s in resources.values_mut() {
                s.update_attempt += 1;
                s.update_rejected += 1;
            }
            if self.refusals == Refusals::InUpdate {
                for name in begun {
                    if let Some(s) = resources.get_mut(*name) {
                        s.update_attempt += 1;
                    }
                }
            }
            for (name, body) in carried {
                if let (Some(s), false) = (resources.get_mut(name), refused.contains(name)) {
                    s.last_body = body;
                }
            }
            return;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let hash = twox_hash::XxHash64::oneshot(0, version.as_bytes());
        for (name, body) in carried {
            // Only subscribed names have counters (a response names nothing else here).
            let Some(s) = resources.get_mut(name) else {
                continue;
            };
            s.update_attempt += 1;
            s.update_success += 1;
            s.update_time = now;
            s.version = hash;
            version.clone_into(&mut s.version_text);
            match body {
                None => s.update_empty += 1,
                Some(_) if body == s.last_body => s.update_no_rebuild += 1,
                Some(_) => {
                    s.config_reload += 1;
                    s.config_reload_time = now;
                }
            }
            s.last_body = body;
        }
    }

    /// The stream failed: every resource subscribed counts it.
    pub fn stream_failed(&self) {
        for s in self.lock().values_mut() {
            s.update_attempt += 1;
            s.update_failure += 1;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ResourceCounters>> {
        // Held only to bump counters; a panic in between leaves counts stale at worst.
        self.resources.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A secret's name as Envoy writes it in a stat name: `://`, `:/` and `:` (and NUL) become `_`
/// (`kubernetes://client-credential` → `kubernetes_client-credential`).
pub fn secret_stat_name(name: &str) -> String {
    name.replace("://", "_")
        .replace(":/", "_")
        .replace([':', '\0'], "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none<'a>() -> BTreeSet<&'a String> {
        BTreeSet::new()
    }

    fn names(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn each_secret_counts_its_own_successes_and_every_one_a_nack() {
        let stats = ResourceStats::default();
        let (a, b) = (
            "kubernetes://a".to_string(),
            "kubernetes://a-cacert".to_string(),
        );
        stats.resubscribed(
            &names(&[]),
            &names(&["kubernetes://a", "kubernetes://a-cacert"]),
        );
        stats.answered(
            [(&a, Some(1)), (&b, Some(2))],
            "v1",
            false,
            &none(),
            &none(),
        );
        // Only `a` rotated, and accepted: `b` counts nothing.
        stats.answered([(&a, Some(3))], "v2", false, &none(), &none());
        // `a`'s new key refused: the response is NACKed, and `b`, not carried, counts it too;
        // `a`, whose update was begun, one attempt more.
        let refused = [&a].into();
        stats.answered([(&a, Some(4))], "v3", true, &refused, &refused);
        stats.stream_failed();
        let snap = stats.snapshot();
        let sa = snap.get(&a).cloned().unwrap_or_default();
        let sb = snap.get(&b).cloned().unwrap_or_default();
        assert_eq!(
            (
                sa.update_attempt,
                sa.update_success,
                sa.update_rejected,
                sa.update_failure
            ),
            (6, 2, 1, 1)
        );
        assert_eq!(
            (
                sb.update_attempt,
                sb.update_success,
                sb.update_rejected,
                sb.update_failure
            ),
            (4, 1, 1, 1)
        );
        assert_eq!(
            (sa.version_text.as_str(), sb.version_text.as_str()),
            ("v2", "v1")
        );
        assert_eq!(sa.version, twox_hash::XxHash64::oneshot(0, b"v2"));
        assert_ne!(sa.version, sb.version);
        assert!(sa.update_time > 0);
    }

    #[test]
    fn a_secret_no_longer_subscribed_loses_its_counters_and_unknown_names_count_nothing() {
        let stats = ResourceStats::default();
        stats.resubscribed(&names(&[]), &names(&["a"]));
        stats.answered([(&"a".to_string(), Some(1))], "v1", false, &none(), &none());
        stats.resubscribed(&names(&["a"]), &names(&["b"]));
        stats.answered(
            [(&"stranger".to_string(), Some(1))],
            "v1",
            false,
            &none(),
            &none(),
        );
        let snap = stats.snapshot();
        assert_eq!(snap.keys().collect::<Vec<_>>(), ["b"]);
        assert_eq!(snap.get("b").map(|s| s.update_attempt), Some(1));
        // Wanted again: counted afresh, as a new SdsApi's are.
        stats.resubscribed(&names(&["b"]), &names(&["a", "b"]));
        assert_eq!(stats.snapshot().get("a").map(|s| s.update_success), Some(0));
    }

    #[test]
    fn endpoints_count_no_extra_attempt_for_a_refusal_and_tell_changes_from_resends() {
        let stats = ResourceStats::new(Refusals::AtDecode);
        let (a, b) = ("A".to_string(), "B".to_string());
        stats.resubscribed(&names(&[]), &names(&["A", "B"]));
        stats.answered(
            [(&a, Some(1)), (&b, Some(2))],
            "e1",
            false,
            &none(),
            &none(),
        );
        // A changed, B sent again as it was (state of the world sends both).
        stats.answered(
            [(&a, Some(3)), (&b, Some(2))],
            "e2",
            false,
            &none(),
            &none(),
        );
        // B refused: the same count for both.
        let refused = [&b].into();
        stats.answered([(&b, Some(9))], "e3", true, &refused, &refused);
        // B back as it was in force: nothing rebuilt; A removed.
        stats.answered([(&b, Some(2)), (&a, None)], "e4", false, &none(), &none());
        let snap = stats.snapshot();
        let counts = |n: &str| {
            let s = snap.get(n).cloned().unwrap_or_default();
            (
                s.update_attempt,
                s.update_success,
                s.update_rejected,
                s.update_no_rebuild,
                s.update_empty,
                s.config_reload,
            )
        };
        assert_eq!(counts("A"), (5, 3, 1, 0, 1, 2));
        assert_eq!(counts("B"), (5, 3, 1, 2, 0, 1));
    }

    #[test]
    fn a_refused_route_table_counts_its_begun_update_and_stays_as_in_force() {
        let stats = ResourceStats::new(Refusals::InUpdate);
        let r = "80".to_string();
        stats.resubscribed(&names(&[]), &names(&["80"]));
        stats.answered([(&r, Some(1))], "r1", false, &none(), &none());
        let refused = [&r].into();
        stats.answered([(&r, Some(2))], "r2", true, &refused, &refused);
        stats.answered([(&r, Some(1))], "r3", false, &none(), &none());
        let s = stats.snapshot().get("80").cloned().unwrap_or_default();
        assert_eq!(
            (s.update_attempt, s.update_rejected, s.config_reload),
            (5, 1, 1)
        );
        assert_eq!(s.update_no_rebuild, 1);
    }

    #[test]
    fn stat_names_replace_colons_as_envoy_does() {
        assert_eq!(
            secret_stat_name("kubernetes://client-credential"),
            "kubernetes_client-credential"
        );
        assert_eq!(secret_stat_name("a:/b"), "a_b");
        assert_eq!(secret_stat_name("a::b"), "a__b");
        assert_eq!(secret_stat_name("default"), "default");
    }
}
