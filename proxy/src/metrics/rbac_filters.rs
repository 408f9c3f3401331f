//! Envoy's RBAC filter statistics under xDS, as Envoy keeps them, each filter counting its own
//! decision: an HTTP filter's per connection manager (`http.<stat_prefix>.rbac.allowed|denied`),
//! a network filter's under its own stat prefix (istiod's `tcp.`: `tcp.rbac.allowed|denied`),
//! and the shadow rules' outcomes under the filter's `shadow_rules_stat_prefix`
//! (`….rbac.istio_dry_run_allow_.shadow_denied`; without a prefix `….rbac.shadow_denied`).
//! Filters with the same names share the counters, so a chain with a DENY and an ALLOW filter
//! adds twice to `tcp.rbac.allowed`. The policy files (config mode) are counted once per
//! request or connection instead ([`super::AuthzMetrics::envoy_rbac`]).

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

/// By scope (what the names start with: a connection manager's stat prefix after `http.`, or
/// a network filter's stat prefix), then by stem (the name between the scope and
/// `allowed`/`denied`: `rbac.`, `rbac.shadow_`, `rbac.istio_dry_run_allow_.shadow_`).
pub type ByScope = PerPrefix<PerPrefix<Outcomes>>;

/// The counters of every RBAC filter under xDS.
#[derive(Debug, Default)]
pub struct RbacFilterStats {
    /// The HTTP filters', by connection manager (`http.<scope>.rbac.*`).
    pub http: ByScope,
    /// The network filters', by stat prefix (`<scope>.rbac.*`).
    pub network: ByScope,
}

/// Whose RBAC filters a chain's are.
#[derive(Debug, Clone, Copy)]
pub enum Filters<'a> {
    /// The HTTP filters of the connection manager with this stat prefix.
    Http(&'a str),
    /// A chain's network filters, each named by its own stat prefix.
    Network,
}

impl<'a> Filters<'a> {
    fn by_scope(self, stats: &RbacFilterStats) -> &ByScope {
        match self {
            Filters::Http(_) => &stats.http,
            Filters::Network => &stats.network,
        }
    }

    /// The scope of `filter`'s names. Envoy joins `rbac.` to a network filter's stat prefix
    /// with a `.` unless the prefix ends with one, so `tcp.` and `tcp` name the same counters.
    fn scope<'s>(self, filter: &'s Rbac) -> &'s str
    where
        'a: 's,
    {
        match self {
            Filters::Http(manager) => manager,
            Filters::Network => {
                let p = filter.stat_prefix.as_str();
                p.strip_suffix('.').unwrap_or(p)
            }
        }
    }
}

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

/// One filter's counters (shared by the chain's filters with the same names).
#[derive(Debug)]
struct Named {
    /// The filter's stat prefix and shadow rules' stat prefix, which name its counters.
    stat_prefix: Box<str>,
    shadow_prefix: Box<str>,
    enforced: Arc<Outcomes>,
    shadow: Arc<Outcomes>,
}

impl Named {
    fn of(&self, filter: &Rbac) -> bool {
        *self.stat_prefix == filter.stat_prefix
            && *self.shadow_prefix == filter.shadow_rules_stat_prefix
    }
}

/// The counters of one chain's RBAC filters, looked up once per connection (for HTTP,
/// `ConnContext::rbac_stats`) so that a decision only adds.
#[derive(Debug)]
pub struct ChainRbac {
    /// One or two on a chain istiod writes.
    named: Box<[Named]>,
}

impl ChainRbac {
    /// The counters of `filters`, the RBAC filters of `whose`.
    pub fn resolve<'r>(
        stats: &RbacFilterStats,
        whose: Filters<'_>,
        filters: impl IntoIterator<Item = &'r Rbac>,
    ) -> Self {
        let by_scope = whose.by_scope(stats);
        let mut named: Vec<Named> = Vec::new();
        for f in filters {
            if named.iter().any(|n| n.of(f)) {
                continue;
            }
            let stems = by_scope.of(whose.scope(f));
            let shadow_prefix = f.shadow_rules_stat_prefix.as_str();
            named.push(Named {
                stat_prefix: f.stat_prefix.as_str().into(),
                shadow_prefix: shadow_prefix.into(),
                enforced: stems.of(ENFORCED),
                shadow: stems.of(&shadow_stem(shadow_prefix)),
            });
        }
        ChainRbac {
            named: named.into(),
        }
    }

    /// Count `filter`'s enforced decision.
    pub fn enforced(&self, filter: &Rbac, allowed: bool) {
        if let Some(n) = self.named.iter().find(|n| n.of(filter)) {
            n.enforced.count(allowed);
        }
    }

    /// Count what `filter`'s shadow rules would have decided.
    pub fn shadow(&self, filter: &Rbac, allowed: bool) {
        if let Some(n) = self.named.iter().find(|n| n.of(filter)) {
            n.shadow.count(allowed);
        }
    }
}

/// Make the counters of every RBAC filter of `snapshot`'s inbound listener (the only one
/// istiod gives them), as Envoy makes all four names of a filter when it loads the listener.
/// Run at a scrape, off the data path.
pub fn make_configured(stats: &RbacFilterStats, snapshot: &remora_xds::snapshot::Snapshot) {
    use remora_xds::model::listener::{HttpFilter, NetworkFilter};
    let Some(listener) = snapshot.inbound_listener() else {
        return;
    };
    for chain in listener.all_chains() {
        let rbac = chain.filters.iter().filter_map(|f| match f {
            NetworkFilter::Rbac(r) => Some(r),
            _ => None,
        });
        make(stats, Filters::Network, rbac);
    }
    for http in listener.http_chains() {
        let rbac = http.http_filters.iter().filter_map(|f| match f {
            HttpFilter::Rbac(r) => Some(r),
            _ => None,
        });
        make(stats, Filters::Http(&http.stat_prefix), rbac);
    }
}

/// Make the counters of `filters`; a chain without RBAC filters has none of their statistics.
fn make<'r>(stats: &RbacFilterStats, whose: Filters<'_>, filters: impl Iterator<Item = &'r Rbac>) {
    let mut filters = filters.peekable();
    if filters.peek().is_some() {
        ChainRbac::resolve(stats, whose, filters);
    }
}

/// Every counter of `by_scope`: the part of its name before its last `.`
/// (`inbound_0.0.0.0_8080.rbac.istio_dry_run_allow_`, `tcp.rbac`), the rest, and its value.
pub fn each(by_scope: &ByScope) -> Vec<(String, &'static str, u64)> {
    let mut all = Vec::new();
    for (scope, stems) in by_scope.each() {
        for (stem, c) in stems.each() {
            let (head, shadow) = stem.rsplit_once('.').unwrap_or((&stem, ""));
            let names = match shadow {
                "" => ["allowed", "denied"],
                _ => ["shadow_allowed", "shadow_denied"],
            };
            let head = match &*scope {
                "" => head.to_string(),
                scope => format!("{scope}.{head}"),
            };
            for (name, counter) in names.into_iter().zip([&c.allowed, &c.denied]) {
                all.push((head.clone(), name, counter.load(Ordering::Relaxed)));
            }
        }
    }
    all
}

/// The counters that are not 0, as `<name> <value>` (for tests).
#[cfg(test)]
pub(crate) fn counted(by_scope: &ByScope) -> Vec<String> {
    each(by_scope)
        .into_iter()
        .filter(|(_, _, v)| *v > 0)
        .map(|(s, n, v)| format!("{s}.{n} {v}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(stat_prefix: &str, shadow_prefix: &str) -> Rbac {
        Rbac {
            rules: None,
            shadow_rules: None,
            shadow_rules_stat_prefix: shadow_prefix.into(),
            stat_prefix: stat_prefix.into(),
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
        let stats = RbacFilterStats::default();
        let (dry, ext) = (
            filter("", "istio_dry_run_allow_"),
            filter("", "istio_ext_authz_"),
        );
        let http = |m| Filters::Http(m);
        let a = ChainRbac::resolve(&stats, http("inbound_0.0.0.0_8080"), [&dry, &ext]);
        let b = ChainRbac::resolve(&stats, http("inbound_0.0.0.0_15006"), [&dry]);
        a.enforced(&dry, true);
        a.enforced(&ext, true);
        a.shadow(&dry, false);
        a.shadow(&ext, true);
        b.enforced(&dry, false);
        // Another connection to the first chain shares its counters.
        ChainRbac::resolve(&stats, http("inbound_0.0.0.0_8080"), [&dry]).enforced(&dry, false);
        assert_eq!(
            counted(&stats.http),
            [
                "inbound_0.0.0.0_15006.rbac.denied 1",
                "inbound_0.0.0.0_8080.rbac.allowed 2",
                "inbound_0.0.0.0_8080.rbac.denied 1",
                "inbound_0.0.0.0_8080.rbac.istio_dry_run_allow_.shadow_denied 1",
                "inbound_0.0.0.0_8080.rbac.istio_ext_authz_.shadow_allowed 1",
            ]
        );
        // Every name a filter has, counted or not: 2 + 2 × 2 on 8080, 2 + 2 on 15006.
        assert_eq!(each(&stats.http).len(), 10);
        assert!(each(&stats.network).is_empty());
    }

    #[test]
    fn network_filters_counted_under_their_own_stat_prefix() {
        let stats = RbacFilterStats::default();
        // istiod's DENY and ALLOW filters (`tcp.`), a dry-run one, and one of another prefix.
        let (deny, allow) = (filter("tcp.", ""), filter("tcp.", ""));
        let dry = filter("tcp.", "istio_dry_run_allow_");
        let other = filter("mine", "");
        let chain = ChainRbac::resolve(&stats, Filters::Network, [&deny, &dry, &allow, &other]);
        chain.shadow(&dry, false);
        chain.enforced(&deny, true);
        chain.enforced(&allow, true);
        chain.enforced(&other, false);
        // Without its trailing dot, the same names.
        let bare = filter("tcp", "");
        ChainRbac::resolve(&stats, Filters::Network, [&bare]).enforced(&bare, false);
        assert_eq!(
            counted(&stats.network),
            [
                "mine.rbac.denied 1",
                "tcp.rbac.allowed 2",
                "tcp.rbac.denied 1",
                "tcp.rbac.istio_dry_run_allow_.shadow_denied 1",
            ]
        );
        assert!(each(&stats.http).is_empty());
    }

    #[test]
    fn exported_per_scope_and_in_istios_prometheus_form() {
        let m = crate::metrics::Metrics::default();
        let dry = filter("", "istio_dry_run_allow_");
        let chain = ChainRbac::resolve(
            &m.rbac_filters,
            Filters::Http("inbound_0.0.0.0_8080"),
            [&dry],
        );
        chain.enforced(&dry, false);
        chain.shadow(&dry, true);
        let tcp = filter("tcp.", "istio_dry_run_allow_");
        let chain = ChainRbac::resolve(&m.rbac_filters, Filters::Network, [&tcp]);
        chain.enforced(&tcp, true);
        chain.shadow(&tcp, false);
        let dotted = m.dotted_stats(|n| n.contains("rbac."));
        let named = |n: &str, v| (n.to_string(), v);
        assert_eq!(
            dotted,
            [
                named("http.inbound_0.0.0.0_8080.rbac.allowed", 0),
                named("http.inbound_0.0.0.0_8080.rbac.denied", 1),
                named(
                    "http.inbound_0.0.0.0_8080.rbac.istio_dry_run_allow_.shadow_allowed",
                    1
                ),
                named(
                    "http.inbound_0.0.0.0_8080.rbac.istio_dry_run_allow_.shadow_denied",
                    0
                ),
                named("tcp.rbac.allowed", 1),
                named("tcp.rbac.denied", 0),
                named("tcp.rbac.istio_dry_run_allow_.shadow_allowed", 0),
                named("tcp.rbac.istio_dry_run_allow_.shadow_denied", 1),
            ]
        );
        let text = m.encode();
        let samples: Vec<&str> = (text.lines())
            .filter(|l| l.contains("_rbac{") || l.starts_with("envoy_tcp{"))
            .collect();
        let http = "envoy_http_inbound_0_0_0_0_8080_rbac";
        let dry = "authz_dry_run_action=\"allow\",authz_dry_run_result";
        let tcp_dry = "tcp_prefix=\"rbac.istio_dry_run_allow_\"";
        assert_eq!(
            samples,
            [
                format!("{http}{{authz_enforce_result=\"allowed\"}} 0"),
                format!("{http}{{authz_enforce_result=\"denied\"}} 1"),
                format!("{http}{{{dry}=\"allowed\"}} 1"),
                format!("{http}{{{dry}=\"denied\"}} 0"),
                "envoy_tcp{authz_enforce_result=\"allowed\",tcp_prefix=\"rbac\"} 1".into(),
                "envoy_tcp{authz_enforce_result=\"denied\",tcp_prefix=\"rbac\"} 0".into(),
                format!("envoy_tcp{{{dry}=\"allowed\",{tcp_dry}}} 0"),
                format!("envoy_tcp{{{dry}=\"denied\",{tcp_dry}}} 1"),
            ]
        );
    }
}
