//! What the HTTP ext_authz filter counts: Envoy's statistics of the filter, kept per
//! connection manager and filter stat prefix ([`HttpStats`]:
//! `http.<manager's stat_prefix>.ext_authz.*`, or `….ext_authz.<filter's stat_prefix>.*` when
//! the filter has one, which istiod does not write; filters with the same names share them, as
//! in Envoy), where one check adds to them and to its route cluster's ([`Counted`]), and
//! Remora's own totals over every filter, HTTP and network ([`ExtAuthzStats`],
//! `remora_ext_authz_*`).

use crate::metrics::per_prefix::PerPrefix;
use crate::upstream::stats::{inc, ClusterStats, ExtAuthzCounts};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One connection manager's counters: Envoy's `http.<stat_prefix>.ext_authz.*`.
#[derive(Debug, Default)]
pub struct HttpCounters {
    /// Checks the authorizer allowed.
    pub ok: AtomicU64,
    /// Checks it denied (the request answered with its reply).
    pub denied: AtomicU64,
    /// Checks that failed (unreachable, timed out, a 5xx or a gRPC error).
    pub error: AtomicU64,
    /// Failed checks let through (`failure_mode_allow`).
    pub failure_mode_allowed: AtomicU64,
    /// Requests a filter did not check (`filter_enabled_metadata` did not match: the CUSTOM
    /// policy does not select them), one per filter.
    pub disabled: AtomicU64,
}

impl HttpCounters {
    /// Add one to `counter`.
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Envoy's names (under [`stems`]) and values, in Envoy's order. Envoy 1.40 makes eight
    /// more for every filter that Remora never counts: shadow mode, header limits, filter
    /// state, dynamic metadata and an answer Envoy finds invalid are not things Remora does
    /// (istiod writes none of them; an answer Remora cannot read is an `error`). They are
    /// exported as 0, so that a dashboard finds the names it knows.
    pub fn values(&self) -> [(&'static str, u64); 13] {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("denied", v(&self.denied)),
            ("disabled", v(&self.disabled)),
            ("error", v(&self.error)),
            ("failure_mode_allowed", v(&self.failure_mode_allowed)),
            ("filter_state_name_collision", 0),
            ("ignored_dynamic_metadata", 0),
            ("invalid", 0),
            ("ok", v(&self.ok)),
            ("omitted_response_headers", 0),
            ("request_header_limits_reached", 0),
            ("response_header_limits_reached", 0),
            ("shadow_denied", 0),
            ("shadow_error", 0),
        ]
    }
}

/// The counters of every connection manager whose ext_authz filters have seen a request, by
/// the manager's stat prefix, then the filter's. A connection looks up those of its first
/// filter once, at its first request through it, and keeps them
/// (`ConnContext::ext_authz_stats`): every filter istiod writes shares them.
pub type HttpStats = PerPrefix<PerPrefix<HttpCounters>>;

/// Each set of counters with the part of its names between `http.` and the counter's own
/// name (`inbound_0.0.0.0_8080.ext_authz`, or `….ext_authz.<filter's prefix>`).
pub fn stems(stats: &HttpStats) -> Vec<(String, Arc<HttpCounters>)> {
    let mut all = Vec::new();
    for (manager, filters) in stats.each() {
        for (filter, counters) in filters.each() {
            let stem = match filter.is_empty() {
                true => format!("{manager}.ext_authz"),
                false => format!("{manager}.ext_authz.{filter}"),
            };
            all.push((stem, counters));
        }
    }
    all
}

/// Make the counters of every HTTP ext_authz filter of `snapshot`'s inbound listener (the
/// only one istiod gives them), as Envoy makes them when it loads the listener: a filter that
/// has seen no request yet shows 0s. Run at a scrape, off the data path.
pub fn make_configured(stats: &HttpStats, snapshot: &remora_xds::snapshot::Snapshot) {
    use remora_xds::model::listener::HttpFilter;
    let Some(listener) = snapshot.inbound_listener() else {
        return;
    };
    for http in listener.http_chains() {
        for filter in &http.http_filters {
            if let HttpFilter::ExtAuthz(ext) = filter {
                stats.of(&http.stat_prefix).of(&ext.stat_prefix);
            }
        }
    }
}

/// The filters' outcomes summed over every filter, for `/stats/prometheus`
/// (`remora_ext_authz_*`).
#[derive(Debug, Default)]
pub struct ExtAuthzStats {
    pub ok: Counter,
    pub denied: Counter,
    pub error: Counter,
    pub failure_mode_allowed: Counter,
}

impl ExtAuthzStats {
    /// The counters, registered.
    pub fn register(registry: &mut Registry) -> Self {
        let stats = ExtAuthzStats::default();
        for (name, help, c) in [
            (
                "remora_ext_authz_ok",
                "Requests the external authorizer allowed",
                &stats.ok,
            ),
            (
                "remora_ext_authz_denied",
                "Requests the external authorizer denied",
                &stats.denied,
            ),
            (
                "remora_ext_authz_error",
                "Checks that failed (authorizer unreachable, timed out, 5xx or gRPC error)",
                &stats.error,
            ),
            (
                "remora_ext_authz_failure_mode_allowed",
                "Requests let through after a failed check (failure_mode_allow)",
                &stats.failure_mode_allowed,
            ),
        ] {
            registry.register(name, help, c.clone());
        }
        stats
    }
}

/// Where one check's outcome is counted: its filter's connection manager, and the request's
/// route cluster, its ext_authz counts and its own statistics (`None`: the route names none
/// that exists).
#[derive(Clone, Copy)]
pub(super) struct Counted<'a> {
    pub filter: &'a HttpCounters,
    pub cluster: Option<(&'a ExtAuthzCounts, &'a ClusterStats)>,
}

impl Counted<'_> {
    /// Add one to the filter's counter and the cluster's of the same name.
    pub fn count(
        &self,
        of_filter: impl Fn(&HttpCounters) -> &AtomicU64,
        of_cluster: impl Fn(&ExtAuthzCounts) -> &AtomicU64,
    ) {
        HttpCounters::inc(of_filter(self.filter));
        if let Some((c, _)) = self.cluster {
            inc(of_cluster(c));
        }
    }

    /// A denial's reply charged to the cluster's responses (`upstream_rq_<code>`, its class
    /// and `upstream_rq_completed`), as Envoy's filter charges it while
    /// `charge_cluster_response_stats` is on (istiod leaves it unset: on; Remora refuses the
    /// field). Envoy's filter charges it as an internal request's (`internal.*`).
    pub fn charge_denial(&self, status: http::StatusCode) {
        if let Some((_, stats)) = self.cluster {
            stats.response(status.as_u16(), true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoys_names_in_envoys_order_with_what_was_counted() {
        let stats = HttpStats::default();
        let a = stats.of("inbound_0.0.0.0_8080").of("");
        HttpCounters::inc(&a.ok);
        HttpCounters::inc(&stats.of("inbound_0.0.0.0_8080").of("").ok);
        HttpCounters::inc(&a.disabled);
        HttpCounters::inc(&stats.of("inbound_0.0.0.0_8080").of("mine").denied);
        HttpCounters::inc(&stats.of("inbound_0.0.0.0_8081").of("").error);
        let all: Vec<(String, Vec<(&str, u64)>)> = stems(&stats)
            .iter()
            .map(|(p, c)| {
                (
                    p.clone(),
                    c.values().into_iter().filter(|v| v.1 > 0).collect(),
                )
            })
            .collect();
        let expected: [(&str, &[(&str, u64)]); 3] = [
            (
                "inbound_0.0.0.0_8080.ext_authz",
                &[("disabled", 1), ("ok", 2)],
            ),
            ("inbound_0.0.0.0_8080.ext_authz.mine", &[("denied", 1)]),
            ("inbound_0.0.0.0_8081.ext_authz", &[("error", 1)]),
        ];
        let expected: Vec<(String, Vec<(&str, u64)>)> = expected
            .iter()
            .map(|(p, v)| (p.to_string(), v.to_vec()))
            .collect();
        assert_eq!(all, expected);
        let names: Vec<&str> = a.values().iter().map(|(n, _)| *n).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!((names.len(), &names), (13, &sorted));
    }

    #[test]
    fn exported_under_envoys_names_and_in_istios_prometheus_form() {
        let m = crate::metrics::Metrics::default();
        HttpCounters::inc(&m.http_ext_authz.of("inbound_0.0.0.0_8080").of("").ok);
        HttpCounters::inc(&m.http_ext_authz.of("outbound_0.0.0.0_80").of("mine").error);
        let dotted = m.dotted_stats(|n| n.contains(".ext_authz."));
        assert_eq!(dotted.len(), 2 * 13, "{dotted:?}");
        for stat in [
            ("http.inbound_0.0.0.0_8080.ext_authz.ok", 1),
            ("http.inbound_0.0.0.0_8080.ext_authz.shadow_error", 0),
            ("http.outbound_0.0.0.0_80.ext_authz.mine.error", 1),
        ] {
            assert!(dotted.contains(&(stat.0.to_string(), stat.1)), "{stat:?}");
        }
        let text = m.encode();
        for line in [
            "# TYPE envoy_http_inbound_0_0_0_0_8080_ext_authz_ok counter\n",
            "envoy_http_inbound_0_0_0_0_8080_ext_authz_ok 1\n",
            "envoy_http_outbound_0_0_0_0_80_ext_authz_mine_error 1\n",
            "envoy_http_inbound_0_0_0_0_8080_ext_authz{authz_dry_run_result=\"denied\"} 0\n",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
    }
}
