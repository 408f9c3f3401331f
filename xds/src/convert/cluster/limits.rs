//! A cluster's `circuit_breakers` and `outlier_detection` into
//! [`crate::model::circuit_breakers`] and [`crate::model::outlier`], with Envoy's defaults for
//! what is unset. What Remora would not enforce is refused by name.

use super::super::common::duration;
use crate::model::circuit_breakers::{CircuitBreakers, ENVOY_DEFAULT_LIMIT, ENVOY_DEFAULT_RETRIES};
use crate::model::outlier::{Consecutive, OutlierDetection};
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::cluster::v3 as pb;
use envoy_types::pb::envoy::config::core::v3::RoutingPriority;
use envoy_types::pb::google::protobuf::UInt32Value;

/// `circuit_breakers`: the thresholds of the default priority (istiod writes one, with every
/// limit at 4294967295 unless a DestinationRule's connectionPool sets some), and the per-host
/// connection limit. Thresholds of the HIGH priority are refused: Remora routes nothing at it.
pub(super) fn circuit_breakers(cb: &pb::CircuitBreakers) -> Result<CircuitBreakers, Fault> {
    let mut limits = CircuitBreakers::default();
    let mut seen_default = false;
    for (i, t) in cb.thresholds.iter().enumerate() {
        let at = format!("circuit_breakers.thresholds[{i}]");
        if RoutingPriority::try_from(t.priority) != Ok(RoutingPriority::Default) {
            return Err(Fault::new(
                format!("{at}.priority"),
                "thresholds of a priority other than DEFAULT not supported (Remora routes nothing at HIGH)",
            ));
        }
        if seen_default {
            // Envoy keeps the last one of a priority; two are a mistake worth naming.
            return Err(Fault::new(at, "a second threshold of the DEFAULT priority"));
        }
        seen_default = true;
        let or = |v: &Option<UInt32Value>, default: u32| v.as_ref().map_or(default, |v| v.value);
        limits.max_connections = or(&t.max_connections, ENVOY_DEFAULT_LIMIT);
        limits.max_pending_requests = or(&t.max_pending_requests, ENVOY_DEFAULT_LIMIT);
        limits.max_requests = or(&t.max_requests, ENVOY_DEFAULT_LIMIT);
        limits.max_retries = or(&t.max_retries, ENVOY_DEFAULT_RETRIES);
    }
    for (i, t) in cb.per_host_thresholds.iter().enumerate() {
        let at = format!("circuit_breakers.per_host_thresholds[{i}]");
        if RoutingPriority::try_from(t.priority) != Ok(RoutingPriority::Default) {
            return Err(Fault::new(
                format!("{at}.priority"),
                "thresholds of a priority other than DEFAULT not supported (Remora routes nothing at HIGH)",
            ));
        }
        // Envoy reads only max_connections per host; the others are refused rather than
        // accepted and ignored.
        for (field, value) in [
            ("max_pending_requests", &t.max_pending_requests),
            ("max_requests", &t.max_requests),
            ("max_retries", &t.max_retries),
        ] {
            if value.is_some() {
                return Err(Fault::new(
                    format!("{at}.{field}"),
                    "only max_connections is a per-host limit",
                ));
            }
        }
        limits.per_host_max_connections = t.max_connections.as_ref().map(|v| v.value);
    }
    Ok(limits)
}

/// `outlier_detection`, as istiod writes it for a DestinationRule's `outlierDetection`.
pub(super) fn outlier_detection(o: &pb::OutlierDetection) -> Result<OutlierDetection, Fault> {
    const AT: &str = "outlier_detection";
    let d = OutlierDetection::ENVOY_DEFAULT;
    let num = |v: &Option<UInt32Value>, default: u32| v.as_ref().map_or(default, |v| v.value);
    let percent = |v: &Option<UInt32Value>, default: u32, field: &str| {
        let p = num(v, default);
        if p > 100 {
            return Err(Fault::new(
                format!("{AT}.{field}"),
                "not a percentage in [0, 100]",
            ));
        }
        Ok(p)
    };
    let time = |v: &Option<envoy_types::pb::google::protobuf::Duration>,
                default: std::time::Duration,
                field: &str| {
        v.as_ref()
            .map(|t| duration(t, &format!("{AT}.{field}")))
            .transpose()
            .map(|t| t.unwrap_or(default))
    };
    // Success-rate and failure-percentage detection run on a timer over request statistics;
    // Remora does not compute them, so it accepts them only where they could eject nothing
    // (istiod's `enforcing_success_rate: 0`; Envoy enforces 100 % when it is unset).
    for (field, value, default) in [
        ("enforcing_success_rate", &o.enforcing_success_rate, 100),
        (
            "enforcing_failure_percentage",
            &o.enforcing_failure_percentage,
            0,
        ),
        (
            "enforcing_failure_percentage_local_origin",
            &o.enforcing_failure_percentage_local_origin,
            0,
        ),
    ] {
        if num(value, default) != 0 {
            return Err(Fault::new(
                format!("{AT}.{field}"),
                "success-rate and failure-percentage ejection not supported (only consecutive failures; set it to 0)",
            ));
        }
    }
    if o.split_external_local_origin_errors && num(&o.enforcing_local_origin_success_rate, 100) != 0
    {
        return Err(Fault::new(
            format!("{AT}.enforcing_local_origin_success_rate"),
            "success-rate and failure-percentage ejection not supported (only consecutive failures; set it to 0)",
        ));
    }
    if o.detect_degraded_hosts.as_ref().is_some_and(|v| v.value) {
        return Err(Fault::new(
            format!("{AT}.detect_degraded_hosts"),
            "degraded hosts not supported",
        ));
    }
    if o.max_ejection_time_jitter
        .as_ref()
        .is_some_and(|j| j.seconds != 0 || j.nanos != 0)
    {
        return Err(Fault::new(
            format!("{AT}.max_ejection_time_jitter"),
            "ejection time jitter not supported",
        ));
    }
    let base_ejection_time = time(
        &o.base_ejection_time,
        d.base_ejection_time,
        "base_ejection_time",
    )?;
    let max_ejection_time = time(
        &o.max_ejection_time,
        d.max_ejection_time.max(base_ejection_time),
        "max_ejection_time",
    )?;
    // Envoy refuses the cluster then, too.
    if max_ejection_time < base_ejection_time {
        return Err(Fault::new(
            format!("{AT}.max_ejection_time"),
            "smaller than base_ejection_time",
        ));
    }
    let interval = time(&o.interval, d.interval, "interval")?;
    if interval.is_zero() {
        return Err(Fault::new(format!("{AT}.interval"), "must be above zero"));
    }
    Ok(OutlierDetection {
        consecutive_5xx: Consecutive {
            threshold: num(&o.consecutive_5xx, d.consecutive_5xx.threshold),
            enforcing: percent(
                &o.enforcing_consecutive_5xx,
                d.consecutive_5xx.enforcing,
                "enforcing_consecutive_5xx",
            )?,
        },
        consecutive_gateway_failure: Consecutive {
            threshold: num(
                &o.consecutive_gateway_failure,
                d.consecutive_gateway_failure.threshold,
            ),
            enforcing: percent(
                &o.enforcing_consecutive_gateway_failure,
                d.consecutive_gateway_failure.enforcing,
                "enforcing_consecutive_gateway_failure",
            )?,
        },
        consecutive_local_origin_failure: Consecutive {
            threshold: num(
                &o.consecutive_local_origin_failure,
                d.consecutive_local_origin_failure.threshold,
            ),
            enforcing: percent(
                &o.enforcing_consecutive_local_origin_failure,
                d.consecutive_local_origin_failure.enforcing,
                "enforcing_consecutive_local_origin_failure",
            )?,
        },
        split_external_local_origin_errors: o.split_external_local_origin_errors,
        interval,
        base_ejection_time,
        max_ejection_time,
        max_ejection_percent: percent(
            &o.max_ejection_percent,
            d.max_ejection_percent,
            "max_ejection_percent",
        )?,
        always_eject_one_host: o.always_eject_one_host.as_ref().is_some_and(|v| v.value),
    })
}

#[cfg(test)]
mod tests {
    use crate::convert::from_json;
    use crate::model::circuit_breakers::CircuitBreakers;
    use crate::model::outlier::{Consecutive, OutlierDetection};
    use crate::model::Cluster;
    use serde_json::{json, Value};
    use std::time::Duration;

    type ClusterProto = envoy_types::pb::envoy::config::cluster::v3::Cluster;

    fn convert(v: Value) -> Result<Cluster, String> {
        from_json::<ClusterProto>(&v)
            .map(|c| c.model)
            .map_err(|r| r.to_string())
    }

    fn with(field: &str, value: Value) -> Result<Cluster, String> {
        convert(json!({"name": "c", "type": "STATIC", field: value}))
    }

    #[test]
    fn istiods_default_thresholds_limit_nothing() {
        let c = with(
            "circuit_breakers",
            json!({"thresholds": [{"max_connections": 4294967295u32,
                "max_pending_requests": 4294967295u32, "max_requests": 4294967295u32,
                "max_retries": 4294967295u32, "track_remaining": true}]}),
        )
        .expect("accepted");
        assert_eq!(c.circuit_breakers, CircuitBreakers::UNLIMITED);
        assert!(!c.circuit_breakers.limits_connections());
        // No circuit_breakers at all: Envoy's own limits.
        let c = convert(json!({"name": "c", "type": "STATIC"})).expect("accepted");
        assert_eq!(c.circuit_breakers, CircuitBreakers::default());
        assert_eq!(c.circuit_breakers.max_retries, 3);
    }

    /// Istio's circuit-breaking task: `tcp.maxConnections: 1`, `http1MaxPendingRequests: 1`,
    /// `maxRequestsPerConnection: 1`, as istiod writes them (the rest stay unlimited).
    #[test]
    fn a_destination_rules_connection_pool() {
        let c = with(
            "circuit_breakers",
            json!({"thresholds": [{"max_connections": 1, "max_pending_requests": 1,
                "max_requests": 4294967295u32, "max_retries": 4294967295u32,
                "track_remaining": true}],
                "per_host_thresholds": [{"max_connections": 7}]}),
        )
        .expect("accepted");
        assert_eq!(
            c.circuit_breakers,
            CircuitBreakers {
                max_connections: 1,
                max_pending_requests: 1,
                max_requests: u32::MAX,
                max_retries: u32::MAX,
                per_host_max_connections: Some(7),
            }
        );
        // Unset limits are Envoy's defaults.
        let c = with(
            "circuit_breakers",
            json!({"thresholds": [{"max_requests": 5}]}),
        )
        .expect("accepted");
        assert_eq!(c.circuit_breakers.max_requests, 5);
        assert_eq!(c.circuit_breakers.max_connections, 1024);
        assert_eq!(c.circuit_breakers.max_retries, 3);
    }

    #[test]
    fn limits_remora_does_not_enforce_are_refused_by_name() {
        let refused = |cb: Value, path: &str| {
            let err = with("circuit_breakers", cb).expect_err("refused");
            assert!(err.contains(path), "{path}: {err}");
        };
        refused(
            json!({"thresholds": [{"priority": "HIGH", "max_connections": 1}]}),
            "circuit_breakers.thresholds[0].priority",
        );
        refused(
            json!({"thresholds": [{}, {}]}),
            "a second threshold of the DEFAULT priority",
        );
        refused(
            json!({"per_host_thresholds": [{"max_requests": 1}]}),
            "circuit_breakers.per_host_thresholds[0].max_requests",
        );
        refused(
            json!({"thresholds": [{"retry_budget": {}}]}),
            "retry_budget",
        );
        refused(
            json!({"thresholds": [{"max_connection_pools": 3}]}),
            "max_connection_pools",
        );
    }

    /// Istio's outlier-detection task (`consecutive5xxErrors: 1`, `interval: 1s`,
    /// `baseEjectionTime: 3m`, `maxEjectionPercent: 100`), as istiod writes it.
    #[test]
    fn istiods_outlier_detection() {
        let c = with(
            "outlier_detection",
            json!({"consecutive_5xx": 1, "enforcing_consecutive_5xx": 100,
                "interval": "1s", "base_ejection_time": "180s", "max_ejection_percent": 100,
                "enforcing_success_rate": 0}),
        )
        .expect("accepted");
        let o = c.outlier_detection.expect("kept");
        assert_eq!(
            o.consecutive_5xx,
            Consecutive {
                threshold: 1,
                enforcing: 100
            }
        );
        // Unset: Envoy's defaults (gateway failures detected but not enforced).
        assert_eq!(
            o.consecutive_gateway_failure,
            OutlierDetection::ENVOY_DEFAULT.consecutive_gateway_failure
        );
        assert_eq!(o.interval, Duration::from_secs(1));
        assert_eq!(o.base_ejection_time, Duration::from_secs(180));
        // The default cap, 300 s, is raised to a larger base time.
        assert_eq!(o.max_ejection_time, Duration::from_secs(300));
        assert_eq!(o.max_ejection_percent, 100);
        let c = with(
            "outlier_detection",
            json!({"base_ejection_time": "600s", "enforcing_success_rate": 0,
                "split_external_local_origin_errors": true,
                "consecutive_local_origin_failure": 2,
                "enforcing_consecutive_local_origin_failure": 100,
                "enforcing_local_origin_success_rate": 0}),
        )
        .expect("accepted");
        let o = c.outlier_detection.expect("kept");
        assert_eq!(o.max_ejection_time, Duration::from_secs(600));
        assert!(o.split_external_local_origin_errors);
        assert_eq!(o.consecutive_local_origin_failure.threshold, 2);
    }

    #[test]
    fn detectors_remora_does_not_run_are_refused_by_name() {
        let refused = |od: Value, path: &str| {
            let err = with("outlier_detection", od).expect_err("refused");
            assert!(err.contains(path), "{path}: {err}");
        };
        // Envoy enforces success-rate ejection at 100 % when it is left unset.
        refused(json!({}), "outlier_detection.enforcing_success_rate");
        refused(
            json!({"enforcing_success_rate": 0, "enforcing_failure_percentage": 10}),
            "outlier_detection.enforcing_failure_percentage",
        );
        refused(
            json!({"enforcing_success_rate": 0,
                "enforcing_failure_percentage_local_origin": 10}),
            "outlier_detection.enforcing_failure_percentage_local_origin",
        );
        refused(
            json!({"enforcing_success_rate": 0, "split_external_local_origin_errors": true}),
            "outlier_detection.enforcing_local_origin_success_rate",
        );
        refused(
            json!({"enforcing_success_rate": 0, "max_ejection_time_jitter": "1s"}),
            "outlier_detection.max_ejection_time_jitter",
        );
        refused(
            json!({"enforcing_success_rate": 0, "detect_degraded_hosts": true}),
            "outlier_detection.detect_degraded_hosts",
        );
        refused(
            json!({"enforcing_success_rate": 0, "max_ejection_percent": 101}),
            "outlier_detection.max_ejection_percent",
        );
        refused(
            json!({"enforcing_success_rate": 0, "base_ejection_time": "60s",
                "max_ejection_time": "10s"}),
            "outlier_detection.max_ejection_time",
        );
        refused(
            json!({"enforcing_success_rate": 0, "monitors": [{"name": "m"}]}),
            "outlier_detection.monitors",
        );
        let err = convert(json!({"name": "c", "type": "ORIGINAL_DST",
            "lb_policy": "CLUSTER_PROVIDED",
            "outlier_detection": {"enforcing_success_rate": 0}}))
        .expect_err("refused");
        assert!(err.contains("ORIGINAL_DST"), "{err}");
    }
}
