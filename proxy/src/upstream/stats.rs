//! Envoy's per-cluster statistics (`cluster.<name>.upstream_rq_total`, `upstream_rq_200`,
//! `outlier_detection.ejections_active`, …) as atomics, one set per cluster name, kept across
//! versions of the cluster as Envoy keeps its stats. The data path only adds to them; the admin
//! pages read them ([`ClusterStats::envoy_stats`]).

use crate::metrics::per_prefix::PerPrefix;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The HTTP status codes counted one by one (`upstream_rq_<code>`).
const CODES: std::ops::RangeInclusive<u16> = 100..=599;

/// How an attempt's outcome is charged to its cluster's `upstream_rq_*` statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// Not at all: a TCP connection.
    None,
    /// A client's request (Envoy's `external.*` copies).
    External,
    /// One of Remora's own (a shadow, a check), as Envoy sends its own with
    /// `x-envoy-internal: true` (`internal.*`).
    Internal,
}

/// The answers charged to a cluster: how many, and by class and code.
#[derive(Debug)]
struct Responses {
    completed: AtomicU64,
    /// Per status class, 1xx to 5xx.
    class: [AtomicU64; 5],
    /// Per status code, 100 to 599.
    code: Box<[AtomicU64]>,
}

impl Default for Responses {
    fn default() -> Self {
        Responses {
            completed: AtomicU64::new(0),
            class: Default::default(),
            code: CODES.map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Responses {
    fn add(&self, status: u16) {
        inc(&self.completed);
        if let Some(c) = usize::from(status / 100)
            .checked_sub(1)
            .and_then(|i| self.class.get(i))
        {
            inc(c);
        }
        if let Some(c) = status
            .checked_sub(*CODES.start())
            .and_then(|i| self.code.get(usize::from(i)))
        {
            inc(c);
        }
    }

    /// `upstream_rq_completed`, then each class and code that is not 0 (Envoy makes a code's
    /// counter when it first counts it), named as `copy` names them; `minus` taken off each
    /// (the external copies are every answer less the internal ones).
    fn each(&self, copy: &Names, minus: Option<&Responses>) -> Vec<ClusterStat> {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let less = |c: &AtomicU64, of: Option<&AtomicU64>| v(c).saturating_sub(of.map_or(0, v));
        let stat = |stat, code, value| ClusterStat {
            stat,
            code,
            gauge: false,
            value,
        };
        let completed = less(&self.completed, minus.map(|m| &m.completed));
        let mut out = vec![stat(copy.completed, None, completed)];
        for (i, c) in self.class.iter().enumerate() {
            let value = less(c, minus.map(|m| &m.class[i]));
            if value != 0 {
                out.push(stat(copy.by_code, Some(format!("{}xx", i + 1)), value));
            }
        }
        for (i, (code, c)) in CODES.zip(self.code.iter()).enumerate() {
            let value = less(c, minus.and_then(|m| m.code.get(i)));
            if value != 0 {
                out.push(stat(copy.by_code, Some(code.to_string()), value));
            }
        }
        out
    }
}

/// The names of one copy of the answer statistics: Envoy's own, or its `external.` or
/// `internal.` copy.
struct Names {
    completed: &'static str,
    /// What a code or class is joined to (`upstream_rq` + `200`).
    by_code: &'static str,
}

const ALL: Names = Names {
    completed: "upstream_rq_completed",
    by_code: "upstream_rq",
};
const EXTERNAL: Names = Names {
    completed: "external.upstream_rq_completed",
    by_code: "external.upstream_rq",
};
const INTERNAL: Names = Names {
    completed: "internal.upstream_rq_completed",
    by_code: "internal.upstream_rq",
};
const RETRY: Names = Names {
    completed: "retry.upstream_rq_completed",
    by_code: "retry.upstream_rq",
};

/// Whether a copy, its completed count first, was ever charged (Envoy makes a copy's names
/// at its first count).
fn charged(copy: &[ClusterStat]) -> bool {
    copy.first().is_some_and(|s| s.value != 0)
}

/// One cluster's counters.
#[derive(Debug)]
pub struct ClusterStats {
    /// The name Envoy files them under: `alt_stat_name`, else the cluster's name.
    pub name: Box<str>,
    pub rq_total: AtomicU64,
    /// Every answer charged.
    responses: Responses,
    /// Those charged for Remora's own requests, made at the first (most clusters never have
    /// one); the rest are the client's (`external.*`).
    internal: std::sync::OnceLock<Box<Responses>>,
    /// Answers that were retried (Envoy's `retry.*` copy: not among the answers above, which
    /// are the requests' own), made at the first.
    retried: std::sync::OnceLock<Box<Responses>>,
    pub rq_retry: AtomicU64,
    pub rq_retry_success: AtomicU64,
    pub rq_retry_overflow: AtomicU64,
    pub rq_timeout: AtomicU64,
    /// Attempts cut by the route's per-try timeout (`upstream_rq_per_try_timeout`).
    pub rq_per_try_timeout: AtomicU64,
    pub rq_pending_overflow: AtomicU64,
    pub rq_pending_total: AtomicU64,
    pub cx_overflow: AtomicU64,
    pub cx_total: AtomicU64,
    /// Of them, HTTP connections by protocol (`upstream_cx_http1_total`, `_http2_total`).
    pub cx_http: [AtomicU64; 2],
    pub cx_connect_fail: AtomicU64,
    /// Connections retired at `max_requests_per_connection`.
    pub cx_max_requests: AtomicU64,
    /// Connections closed, by who closed them and whether a request was on them then
    /// ([`ClusterStats::cx_destroyed`]); Envoy's six `upstream_cx_destroy*` are sums of these.
    cx_destroyed: [AtomicU64; 4],
    /// Host picks made in panic mode, over every host of a priority, healthy or not.
    pub lb_healthy_panic: AtomicU64,
    pub outlier: OutlierStats,
    /// The HTTP ext_authz filters' outcomes for requests whose route named this cluster when
    /// they were checked (`ext_authz.*`), of filters without a stat prefix (istiod's)…
    ext_authz: Arc<ExtAuthzCounts>,
    /// … and of those with one (`ext_authz.<prefix>.*`), by prefix.
    ext_authz_named: PerPrefix<ExtAuthzCounts>,
}

/// What Envoy's HTTP ext_authz filter counts in the scope of the request's route cluster
/// (`cluster.<name>.ext_authz.ok`, …). Envoy makes each at its first count, so one that is
/// still 0 is not shown.
#[derive(Debug, Default)]
pub struct ExtAuthzCounts {
    pub ok: AtomicU64,
    pub denied: AtomicU64,
    pub error: AtomicU64,
    pub failure_mode_allowed: AtomicU64,
}

impl ExtAuthzCounts {
    /// Envoy's names and the values.
    fn values(&self) -> [(&'static str, u64); 4] {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("denied", v(&self.denied)),
            ("error", v(&self.error)),
            ("failure_mode_allowed", v(&self.failure_mode_allowed)),
            ("ok", v(&self.ok)),
        ]
    }
}

/// `outlier_detection.*`, as Envoy counts them.
#[derive(Debug, Default)]
pub struct OutlierStats {
    pub ejections_enforced_total: AtomicU64,
    pub ejections_enforced_consecutive_5xx: AtomicU64,
    pub ejections_enforced_consecutive_gateway_failure: AtomicU64,
    pub ejections_enforced_consecutive_local_origin_failure: AtomicU64,
    pub ejections_detected_consecutive_5xx: AtomicU64,
    pub ejections_detected_consecutive_gateway_failure: AtomicU64,
    pub ejections_detected_consecutive_local_origin_failure: AtomicU64,
    pub ejections_overflow: AtomicU64,
    /// Deprecated in Envoy, still printed: detections of consecutive 5xx (`ejections_total`
    /// counts those that passed the ejection-percent check).
    pub ejections_total: AtomicU64,
    pub ejections_consecutive_5xx: AtomicU64,
}

/// Add one.
pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl ClusterStats {
    pub fn new(name: &str) -> Self {
        ClusterStats {
            name: name.into(),
            rq_total: AtomicU64::new(0),
            responses: Responses::default(),
            internal: std::sync::OnceLock::new(),
            retried: std::sync::OnceLock::new(),
            rq_retry: AtomicU64::new(0),
            rq_retry_success: AtomicU64::new(0),
            rq_retry_overflow: AtomicU64::new(0),
            rq_timeout: AtomicU64::new(0),
            rq_per_try_timeout: AtomicU64::new(0),
            rq_pending_overflow: AtomicU64::new(0),
            rq_pending_total: AtomicU64::new(0),
            cx_overflow: AtomicU64::new(0),
            cx_total: AtomicU64::new(0),
            cx_http: Default::default(),
            cx_connect_fail: AtomicU64::new(0),
            cx_max_requests: AtomicU64::new(0),
            cx_destroyed: Default::default(),
            lb_healthy_panic: AtomicU64::new(0),
            outlier: OutlierStats::default(),
            ext_authz: Arc::default(),
            ext_authz_named: PerPrefix::default(),
        }
    }

    /// The ext_authz counts of filters with the stat prefix `prefix` (istiod's: empty,
    /// looked up without a lock).
    pub fn ext_authz(&self, prefix: &str) -> Arc<ExtAuthzCounts> {
        match prefix {
            "" => Arc::clone(&self.ext_authz),
            named => self.ext_authz_named.of(named),
        }
    }

    /// The ext_authz counts made so far, each as the part of its name after the cluster's
    /// (`ext_authz`, or `ext_authz.<filter's prefix>`), its own name and its value.
    pub fn ext_authz_stats(&self) -> Vec<(String, &'static str, u64)> {
        let named = self.ext_authz_named.each();
        let all = std::iter::once(("ext_authz".to_string(), &self.ext_authz)).chain(
            named
                .iter()
                .map(|(prefix, c)| (format!("ext_authz.{prefix}"), c)),
        );
        let mut out = Vec::new();
        for (stem, counts) in all {
            for (stat, value) in counts.values() {
                if value != 0 {
                    out.push((stem.clone(), stat, value));
                }
            }
        }
        out
    }

    /// A connection of the cluster closed: by the peer (`remote`) or by Remora, with a request
    /// on it (`active`) or not. One add, at the close.
    pub fn cx_destroyed(&self, remote: bool, active: bool) {
        inc(&self.cx_destroyed[usize::from(remote) * 2 + usize::from(active)]);
    }

    /// Envoy's `upstream_cx_destroy*`, each a sum of the closes counted.
    fn destroyed(&self) -> [(&'static str, u64); 6] {
        let [local, local_active, remote, remote_active] = self
            .cx_destroyed
            .each_ref()
            .map(|c| c.load(Ordering::Relaxed));
        [
            (
                "upstream_cx_destroy",
                local + local_active + remote + remote_active,
            ),
            ("upstream_cx_destroy_local", local + local_active),
            ("upstream_cx_destroy_remote", remote + remote_active),
            (
                "upstream_cx_destroy_with_active_rq",
                local_active + remote_active,
            ),
            ("upstream_cx_destroy_local_with_active_rq", local_active),
            ("upstream_cx_destroy_remote_with_active_rq", remote_active),
        ]
    }

    /// An upstream response (or Envoy's local answer for the upstream's failure) with
    /// `status`, to one of Remora's own requests (`internal`) or a client's.
    pub fn response(&self, status: u16, internal: bool) {
        self.responses.add(status);
        if internal {
            self.internal.get_or_init(Box::default).add(status);
        }
    }

    /// An upstream response with `status` that the router retried: Envoy counts it in its
    /// `retry.*` copy only (the request's own answer comes later).
    pub fn retried_response(&self, status: u16) {
        self.retried.get_or_init(Box::default).add(status);
    }

    /// Every counter with Envoy's name (`upstream_rq_200` as `("upstream_rq", Some("200"))`:
    /// Istio's bootstrap turns the code into a `response_code` or `response_code_class` tag),
    /// and the gauges given; `outlier_detection.*` only for a cluster with outlier detection
    /// (`outlier`), as Envoy makes them only for one.
    pub fn envoy_stats(&self, gauges: &[(&'static str, u64)], outlier: bool) -> Vec<ClusterStat> {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let o = &self.outlier;
        let counters = [
            ("upstream_rq_total", v(&self.rq_total)),
            ("upstream_rq_retry", v(&self.rq_retry)),
            ("upstream_rq_retry_success", v(&self.rq_retry_success)),
            ("upstream_rq_retry_overflow", v(&self.rq_retry_overflow)),
            ("upstream_rq_timeout", v(&self.rq_timeout)),
            ("upstream_rq_per_try_timeout", v(&self.rq_per_try_timeout)),
            ("upstream_rq_pending_overflow", v(&self.rq_pending_overflow)),
            ("upstream_rq_pending_total", v(&self.rq_pending_total)),
            ("upstream_cx_overflow", v(&self.cx_overflow)),
            ("upstream_cx_total", v(&self.cx_total)),
            ("upstream_cx_http1_total", v(&self.cx_http[0])),
            ("upstream_cx_http2_total", v(&self.cx_http[1])),
            ("upstream_cx_connect_fail", v(&self.cx_connect_fail)),
            ("upstream_cx_max_requests", v(&self.cx_max_requests)),
            ("lb_healthy_panic", v(&self.lb_healthy_panic)),
            (
                "outlier_detection.ejections_enforced_total",
                v(&o.ejections_enforced_total),
            ),
            (
                "outlier_detection.ejections_enforced_consecutive_5xx",
                v(&o.ejections_enforced_consecutive_5xx),
            ),
            (
                "outlier_detection.ejections_enforced_consecutive_gateway_failure",
                v(&o.ejections_enforced_consecutive_gateway_failure),
            ),
            (
                "outlier_detection.ejections_enforced_consecutive_local_origin_failure",
                v(&o.ejections_enforced_consecutive_local_origin_failure),
            ),
            (
                "outlier_detection.ejections_detected_consecutive_5xx",
                v(&o.ejections_detected_consecutive_5xx),
            ),
            (
                "outlier_detection.ejections_detected_consecutive_gateway_failure",
                v(&o.ejections_detected_consecutive_gateway_failure),
            ),
            (
                "outlier_detection.ejections_detected_consecutive_local_origin_failure",
                v(&o.ejections_detected_consecutive_local_origin_failure),
            ),
            (
                "outlier_detection.ejections_overflow",
                v(&o.ejections_overflow),
            ),
            ("outlier_detection.ejections_total", v(&o.ejections_total)),
            (
                "outlier_detection.ejections_consecutive_5xx",
                v(&o.ejections_consecutive_5xx),
            ),
        ];
        let mut out: Vec<ClusterStat> = counters
            .into_iter()
            .chain(self.destroyed())
            .map(|c| (c, false))
            .chain(gauges.iter().map(|&g| (g, true)))
            .filter(|((stat, _), _)| outlier || !stat.starts_with("outlier_detection."))
            .map(|((stat, value), gauge)| ClusterStat {
                stat,
                code: None,
                gauge,
                value,
            })
            .collect();
        // The answers, and Envoy's copies of them by who sent the request: `external.*` once
        // a client's has been charged, `internal.*` once one of Remora's own has.
        let internal = self.internal.get().map(|b| &**b);
        out.extend(self.responses.each(&ALL, None));
        let external = self.responses.each(&EXTERNAL, internal);
        let internal = internal.map_or_else(Vec::new, |i| i.each(&INTERNAL, None));
        let retried = self
            .retried
            .get()
            .map_or_else(Vec::new, |r| r.each(&RETRY, None));
        for copy in [external, internal, retried] {
            if charged(&copy) {
                out.extend(copy);
            }
        }
        out
    }
}

/// One of a cluster's statistics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStat {
    pub stat: &'static str,
    /// `200` or `2xx` for `upstream_rq_200` and `upstream_rq_2xx`.
    pub code: Option<String>,
    pub gauge: bool,
    pub value: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_classes_are_counted_as_seen() {
        let s = ClusterStats::new("c");
        s.response(200, false);
        s.response(200, false);
        s.response(503, false);
        s.response(42, false);
        let stats = s.envoy_stats(&[("upstream_rq_active", 1)], true);
        let get = |stat: &str, code: Option<&str>| {
            stats
                .iter()
                .find(|s| s.stat == stat && s.code.as_deref() == code)
                .map(|s| s.value)
        };
        assert_eq!(get("upstream_rq", Some("200")), Some(2));
        assert_eq!(get("upstream_rq", Some("2xx")), Some(2));
        assert_eq!(get("upstream_rq", Some("503")), Some(1));
        assert_eq!(get("upstream_rq", Some("5xx")), Some(1));
        assert_eq!(get("upstream_rq", Some("404")), None);
        assert_eq!(get("upstream_rq_completed", None), Some(4));
        assert_eq!(get("upstream_rq_active", None), Some(1));
        // All of them a client's: Envoy's external copies, and no internal ones yet.
        assert_eq!(get("external.upstream_rq", Some("200")), Some(2));
        assert_eq!(get("external.upstream_rq", Some("5xx")), Some(1));
        assert_eq!(get("external.upstream_rq_completed", None), Some(4));
        assert!(stats.iter().all(|s| !s.stat.starts_with("internal.")));
    }

    #[test]
    fn remoras_own_requests_are_counted_apart_as_envoys_internal_ones() {
        let s = ClusterStats::new("mirror");
        s.response(200, true);
        s.response(200, true);
        s.response(404, true);
        let stats = s.envoy_stats(&[], false);
        let names: Vec<String> = stats
            .iter()
            .filter(|s| s.stat.contains("rq_completed") || s.code.is_some())
            .map(|s| {
                format!(
                    "{}{} {}",
                    s.stat,
                    s.code.as_deref().map_or(String::new(), |c| format!("_{c}")),
                    s.value
                )
            })
            .collect();
        // Only shadows (or checks) so far: no external copy, as Envoy has none until a
        // client's request is charged.
        assert_eq!(
            names,
            [
                "upstream_rq_completed 3",
                "upstream_rq_2xx 2",
                "upstream_rq_4xx 1",
                "upstream_rq_200 2",
                "upstream_rq_404 1",
                "internal.upstream_rq_completed 3",
                "internal.upstream_rq_2xx 2",
                "internal.upstream_rq_4xx 1",
                "internal.upstream_rq_200 2",
                "internal.upstream_rq_404 1",
            ]
        );
        s.response(503, false);
        let stats = s.envoy_stats(&[], false);
        let external: Vec<(&str, Option<&str>, u64)> = stats
            .iter()
            .filter(|s| s.stat.starts_with("external."))
            .map(|s| (s.stat, s.code.as_deref(), s.value))
            .collect();
        assert_eq!(
            external,
            [
                ("external.upstream_rq_completed", None, 1),
                ("external.upstream_rq", Some("5xx"), 1),
                ("external.upstream_rq", Some("503"), 1),
            ]
        );
    }

    #[test]
    fn ext_authz_counts_are_shown_once_counted_by_filter_prefix() {
        let s = ClusterStats::new("inbound|8080||");
        assert_eq!(s.ext_authz_stats(), []);
        inc(&s.ext_authz("").ok);
        inc(&s.ext_authz("").ok);
        inc(&s.ext_authz("").error);
        inc(&s.ext_authz("").failure_mode_allowed);
        inc(&s.ext_authz("waf").denied);
        let stem = |s: &str| s.to_string();
        assert_eq!(
            s.ext_authz_stats(),
            [
                (stem("ext_authz"), "error", 1),
                (stem("ext_authz"), "failure_mode_allowed", 1),
                (stem("ext_authz"), "ok", 2),
                (stem("ext_authz.waf"), "denied", 1),
            ]
        );
        assert!(Arc::ptr_eq(&s.ext_authz("waf"), &s.ext_authz("waf")));
    }
}
