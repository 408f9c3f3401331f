//! Envoy's per-secret SDS statistics (`sds.<name>.*`): Envoy gives each secret a cluster names
//! its own subscription (`SdsApi`), with the subscription counters under a scope named after
//! the secret, and the ADS client counts the same per subscribed name:
//!
//! - `update_attempt`: the subscription starting, and each of the events below;
//! - `update_success`: a response carrying (or removing) the secret, accepted whole;
//! - `update_rejected`: a response of the type NACKed, whichever secret was refused and
//!   whether or not it carried this one (Envoy's mux fails every watch of the type; Envoy 1.40
//!   counts it on the `-cacert` secret of a refused certificate, seen by
//!   `tests/tests/istiod_credential_tls.rs`);
//! - `update_failure`: the stream failing while the secret is subscribed;
//! - `init_fetch_timeout`: counted by the store, whose clocks time the initial fetch
//!   ([`crate::store::Store::secret_fetch_timeouts`]); the exporter adds it, and one attempt
//!   each, to these;
//! - `update_time` (ms since the epoch of the last success) and `version` (Envoy's xxHash64 of
//!   the accepted response's version, the text kept as `version_text`).
//!
//! A secret no cluster names any more loses its statistics, as Envoy's go with its `SdsApi`;
//! so the map is bounded by the names subscribed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// One secret's counters, as Envoy names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretCounters {
    pub update_attempt: u64,
    pub update_success: u64,
    pub update_rejected: u64,
    pub update_failure: u64,
    /// Milliseconds since the Unix epoch of the last success; 0 before one.
    pub update_time: u64,
    /// xxHash64 (seed 0) of the last accepted response's version, as Envoy's `version` gauge.
    pub version: u64,
    pub version_text: String,
}

/// The counters of every secret subscribed, by name.
#[derive(Debug, Default)]
pub struct SecretStats {
    secrets: Mutex<BTreeMap<String, SecretCounters>>,
}

impl SecretStats {
    /// Every subscribed secret's counters, by name.
    pub fn snapshot(&self) -> BTreeMap<String, SecretCounters> {
        self.lock().clone()
    }

    /// The subscription to the secrets now `wanted` changed from `before`: new names start
    /// (one attempt each), names gone lose their counters.
    pub fn resubscribed(&self, before: &BTreeSet<String>, wanted: &BTreeSet<String>) {
        if before == wanted {
            return;
        }
        let mut secrets = self.lock();
        secrets.retain(|name, _| wanted.contains(name));
        for name in wanted.difference(before) {
            secrets.entry(name.clone()).or_default().update_attempt += 1;
        }
    }

    /// A response carrying (or removing) `carried` was answered: accepted whole, with
    /// `version`, or NACKed. A NACK counts against every secret subscribed, carried or not:
    /// Envoy's mux fails every watch of the type when a response is refused. A secret
    /// `refused` itself counts one attempt more: Envoy began its update (one attempt) before
    /// refusing it (the failure is another).
    pub fn answered<'a>(
        &self,
        carried: impl IntoIterator<Item = &'a String>,
        version: &str,
        nacked: bool,
        refused: impl IntoIterator<Item = &'a String>,
    ) {
        let mut secrets = self.lock();
        if nacked {
            for s in secrets.values_mut() {
                s.update_attempt += 1;
                s.update_rejected += 1;
            }
            for name in refused {
                if let Some(s) = secrets.get_mut(name) {
                    s.update_attempt += 1;
                }
            }
            return;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let hash = twox_hash::XxHash64::oneshot(0, version.as_bytes());
        for name in carried {
            // Only subscribed names have counters (a response names nothing else here).
            let Some(s) = secrets.get_mut(name) else {
                continue;
            };
            s.update_attempt += 1;
            s.update_success += 1;
            s.update_time = now;
            s.version = hash;
            version.clone_into(&mut s.version_text);
        }
    }

    /// The stream failed: every secret subscribed counts it.
    pub fn stream_failed(&self) {
        for s in self.lock().values_mut() {
            s.update_attempt += 1;
            s.update_failure += 1;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SecretCounters>> {
        // Held only to bump counters; a panic in between leaves counts stale at worst.
        self.secrets.lock().unwrap_or_else(|e| e.into_inner())
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

    fn names(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn each_secret_counts_its_own_successes_and_every_one_a_nack() {
        let stats = SecretStats::default();
        let (a, b) = (
            "kubernetes://a".to_string(),
            "kubernetes://a-cacert".to_string(),
        );
        stats.resubscribed(
            &names(&[]),
            &names(&["kubernetes://a", "kubernetes://a-cacert"]),
        );
        stats.answered([&a, &b], "v1", false, []);
        // Only `a` rotated, and accepted: `b` counts nothing.
        stats.answered([&a], "v2", false, []);
        // `a`'s new key refused: the response is NACKed, and `b`, not carried, counts it too;
        // `a`, whose update was begun, one attempt more.
        stats.answered([&a], "v3", true, [&a]);
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
        let stats = SecretStats::default();
        stats.resubscribed(&names(&[]), &names(&["a"]));
        stats.answered([&"a".to_string()], "v1", false, []);
        stats.resubscribed(&names(&["a"]), &names(&["b"]));
        stats.answered([&"stranger".to_string()], "v1", false, []);
        let snap = stats.snapshot();
        assert_eq!(snap.keys().collect::<Vec<_>>(), ["b"]);
        assert_eq!(snap.get("b").map(|s| s.update_attempt), Some(1));
        // Wanted again: counted afresh, as a new SdsApi's are.
        stats.resubscribed(&names(&["b"]), &names(&["a", "b"]));
        assert_eq!(stats.snapshot().get("a").map(|s| s.update_success), Some(0));
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
