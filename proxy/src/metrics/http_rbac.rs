//! Envoy's HTTP RBAC filter statistics under xDS, as Envoy keeps them: per connection manager
//! (`http.<stat_prefix>.rbac.allowed|denied`), each filter counting its own decision, and the
//! shadow rules' outcomes under the filter's `shadow_rules_stat_prefix`
//! (`http.<stat_prefix>.rbac.istio_dry_run_allow_.shadow_denied`; without a prefix
//! `….rbac.shadow_denied`). Filters with the same names share the counters. The policy files
//! (config mode) are counted once per request instead ([`super::AuthzMetrics::envoy_rbac`]).

use super::per_prefix::PerPrefix;
use remora_xds::model::rbac::Rbac;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One name's pair of counters: `<stem>allowed` and `<stem>denied`.
#[derive(Debug, Default)]
pub struct Outcomes {
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
}

impl Outcomes {
    /// Count one decision.
    pub fn count(&self, allowed: bool) {
        let c = if allowed { &self.allowed } else { &self.denied };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// By connection manager stat prefix, then by stem (the name between the manager's prefix and
/// `allowed`/`denied`: `rbac.`, `rbac.shadow_`, `rbac.istio_dry_run_allow_.shadow_`).
pub type HttpRbacStats = PerPrefix<PerPrefix<Outcomes>>;

/// The stem of the enforced rules' counters (istiod sets no `rules_stat_prefix`).
pub const ENFORCED: &str = "rbac.";

/// The stem of the shadow rules' counters of a filter with `shadow_prefix`. Envoy joins a
/// counter's name to a prefix with a `.` unless the prefix is empty or ends with one.
pub fn shadow_stem(shadow_prefix: &str) -> String {
    let mut stem = format!("{ENFORCED}{shadow_prefix}");
    if !stem.ends_with('.') {
        stem.push('.');
    }
    stem.push_str("shadow_");
    stem
}

/// The counters of one chain's RBAC filters, looked up once per connection
/// (`ConnContext::rbac_stats`) so that a request only adds.
#[derive(Debug)]
pub struct ChainRbac {
    enforced: Arc<Outcomes>,
    /// By the filters' shadow stat prefix (one or two on a chain istiod writes).
    shadow: Box<[(Box<str>, Arc<Outcomes>)]>,
}

impl ChainRbac {
    /// The counters of `filters`, the RBAC filters of the connection manager `manager`.
    pub fn resolve<'r>(
        stats: &HttpRbacStats,
        manager: &str,
        filters: impl IntoIterator<Item = &'r Rbac>,
    ) -> Self {
        let of = stats.of(manager);
        let mut shadow: Vec<(Box<str>, Arc<Outcomes>)> = Vec::new();
        for f in filters {
            let prefix = f.shadow_rules_stat_prefix.as_str();
            if !shadow.iter().any(|(p, _)| &**p == prefix) {
                shadow.push((prefix.into(), of.of(&shadow_stem(prefix))));
            }
        }
        ChainRbac {
            enforced: of.of(ENFORCED),
            shadow: shadow.into(),
        }
    }

    /// Count a filter's enforced decision.
    pub fn enforced(&self, allowed: bool) {
        self.enforced.count(allowed);
    }

    /// Count what `filter`'s shadow rules would have decided.
    pub fn shadow(&self, filter: &Rbac, allowed: bool) {
        let prefix = filter.shadow_rules_stat_prefix.as_str();
        if let Some((_, c)) = self.shadow.iter().find(|(p, _)| &**p == prefix) {
            c.count(allowed);
        }
    }
}

/// Make the counters of every HTTP RBAC filter of `snapshot`'s inbound listener (the only one
/// istiod gives them), as Envoy makes all four names of a filter when it loads the listener.
/// Run at a scrape, off the data path.
pub fn make_configured(stats: &HttpRbacStats, snapshot: &remora_xds::snapshot::Snapshot) {
    use remora_xds::model::listener::HttpFilter;
    let Some(listener) = snapshot.inbound_listener() else {
        return;
    };
    for http in listener.http_chains() {
        let mut rbac = http
            .http_filters
            .iter()
            .filter_map(|f| match f {
                HttpFilter::Rbac(r) => Some(r),
                _ => None,
            })
            .peekable();
        // A chain without RBAC filters has none of their statistics.
        if rbac.peek().is_some() {
            ChainRbac::resolve(stats, &http.stat_prefix, rbac);
        }
    }
}

/// Every counter: the part of its name between `http.` and its last `.`
/// (`inbound_0.0.0.0_8080.rbac.istio_dry_run_allow_`), the rest, and its value.
pub fn each(stats: &HttpRbacStats) -> Vec<(String, &'static str, u64)> {
    let mut all = Vec::new();
    for (manager, stems) in stats.each() {
        for (stem, c) in stems.each() {
            let (head, shadow) = stem.rsplit_once('.').unwrap_or((&stem, ""));
            let names = match shadow {
                "" => ["allowed", "denied"],
                _ => ["shadow_allowed", "shadow_denied"],
            };
            for (name, counter) in names.into_iter().zip([&c.allowed, &c.denied]) {
                let v = counter.load(Ordering::Relaxed);
                all.push((format!("{manager}.{head}"), name, v));
            }
        }
    }
    all
}

/// The counters that are not 0, as `<name> <value>` (for tests).
#[cfg(test)]
pub(crate) fn counted(stats: &HttpRbacStats) -> Vec<String> {
    each(stats)
        .into_iter()
        .filter(|(_, _, v)| *v > 0)
        .map(|(s, n, v)| format!("{s}.{n} {v}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(shadow_prefix: &str) -> Rbac {
        Rbac {
            rules: None,
            shadow_rules: None,
            shadow_rules_stat_prefix: shadow_prefix.into(),
            stat_prefix: String::new(),
        }
    }

    #[test]
    fn named_as_envoy_joins_the_shadow_prefix() {
        assert_eq!(shadow_stem(""), "rbac.shadow_");
        assert_eq!(
            shadow_stem("istio_dry_run_allow_"),
            "rbac.istio_dry_run_allow_.shadow_"
        );
        assert_eq!(shadow_stem("mine."), "rbac.mine.shadow_");
    }

    #[test]
    fn counted_per_manager_and_shadow_prefix() {
        let stats = HttpRbacStats::default();
        let (dry, ext) = (filter("istio_dry_run_allow_"), filter("istio_ext_authz_"));
        let a = ChainRbac::resolve(&stats, "inbound_0.0.0.0_8080", [&dry, &ext]);
        let b = ChainRbac::resolve(&stats, "inbound_0.0.0.0_15006", [&dry]);
        a.enforced(true);
        a.enforced(true);
        a.shadow(&dry, false);
        a.shadow(&ext, true);
        b.enforced(false);
        // Another connection to the first chain shares its counters.
        ChainRbac::resolve(&stats, "inbound_0.0.0.0_8080", [&dry]).enforced(false);
        assert_eq!(
            counted(&stats),
            [
                "inbound_0.0.0.0_15006.rbac.denied 1",
                "inbound_0.0.0.0_8080.rbac.allowed 2",
                "inbound_0.0.0.0_8080.rbac.denied 1",
                "inbound_0.0.0.0_8080.rbac.istio_dry_run_allow_.shadow_denied 1",
                "inbound_0.0.0.0_8080.rbac.istio_ext_authz_.shadow_allowed 1",
            ]
        );
        // Every name a filter has, counted or not: 2 + 2 × 2 on 8080, 2 + 2 on 15006.
        assert_eq!(each(&stats).len(), 10);
    }

    #[test]
    fn exported_per_manager_and_in_istios_prometheus_form() {
        let m = crate::metrics::Metrics::default();
        let dry = filter("istio_dry_run_allow_");
        let chain = ChainRbac::resolve(&m.http_rbac, "inbound_0.0.0.0_8080", [&dry]);
        chain.enforced(false);
        chain.shadow(&dry, true);
        let dotted: Vec<(String, u64)> = m
            .envoy_stats()
            .into_iter()
            .map(|s| (s.dotted_name(), s.value))
            .filter(|(n, _)| n.contains(".rbac."))
            .collect();
        assert_eq!(
            dotted,
            [
                ("http.inbound_0.0.0.0_8080.rbac.allowed".to_string(), 0),
                ("http.inbound_0.0.0.0_8080.rbac.denied".to_string(), 1),
                (
                    "http.inbound_0.0.0.0_8080.rbac.istio_dry_run_allow_.shadow_allowed"
                        .to_string(),
                    1
                ),
                (
                    "http.inbound_0.0.0.0_8080.rbac.istio_dry_run_allow_.shadow_denied".to_string(),
                    0
                ),
            ]
        );
        let text = m.encode();
        for line in [
            "envoy_http_inbound_0_0_0_0_8080_rbac{authz_enforce_result=\"denied\"} 1\n",
            "envoy_http_inbound_0_0_0_0_8080_rbac{authz_dry_run_action=\"allow\",authz_dry_run_result=\"allowed\"} 1\n",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
    }
}
