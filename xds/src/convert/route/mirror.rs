//! A route action's `request_mirror_policies` (Istio's VirtualService `mirror` / `mirrors`
//! with `mirrorPercentage`).

use super::fault::fraction;
use crate::model::fault::Fraction;
use crate::model::route::MirrorPolicy;
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::route::v3::route_action::RequestMirrorPolicy;

/// Every policy of a route action (`path` is the action's).
pub(super) fn mirror_policies(
    policies: &[RequestMirrorPolicy],
    path: &str,
) -> Result<Vec<MirrorPolicy>, Fault> {
    policies
        .iter()
        .enumerate()
        .map(|(i, p)| mirror_policy(p, &format!("{path}.request_mirror_policies[{i}]")))
        .collect()
}

fn mirror_policy(p: &RequestMirrorPolicy, path: &str) -> Result<MirrorPolicy, Fault> {
    // `cluster_header` is refused by the field check; Envoy needs one of the two.
    if p.cluster.is_empty() {
        return Err(Fault::new(
            format!("{path}.cluster"),
            "a mirror needs a cluster",
        ));
    }
    // Remora makes no trace spans, so a shadow's span is never sampled: `false` (what istiod
    // writes) and unset (the parent's decision, which is "none here") are honoured; asking
    // for a sampled span is not.
    if p.trace_sampled.as_ref().is_some_and(|b| b.value) {
        return Err(Fault::new(
            format!("{path}.trace_sampled"),
            "a sampled shadow span is not supported (Remora makes no trace spans)",
        ));
    }
    let fraction = match &p.runtime_fraction {
        // Envoy mirrors every request when no fraction is given.
        None => Fraction::ALL,
        Some(r) => {
            let at = format!("{path}.runtime_fraction.default_value");
            // Envoy's constraint: the default is required (a runtime key alone is not
            // enough, and Remora has no runtime: the key is refused by the field check).
            let Some(d) = &r.default_value else {
                return Err(Fault::new(at, "required"));
            };
            fraction(Some(d), &at)?
        }
    };
    Ok(MirrorPolicy {
        cluster: p.cluster.clone(),
        fraction,
        shadow_suffix: !p.disable_shadow_host_suffix_append,
    })
}

#[cfg(test)]
mod tests {
    use crate::convert::from_json;
    use crate::model::route::{Action, MirrorPolicy, RouteConfiguration};
    use serde_json::{json, Value};

    type RouteProto = envoy_types::pb::envoy::config::route::v3::RouteConfiguration;

    fn convert(policies: Value) -> Result<RouteConfiguration, String> {
        let v = json!({"name": "9080", "virtual_hosts": [{"name": "vh", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"cluster": "c", "request_mirror_policies": policies}}]}]});
        from_json::<RouteProto>(&v)
            .map(|c| c.model)
            .map_err(|r| r.to_string())
    }

    fn mirrors(policies: Value) -> Vec<MirrorPolicy> {
        let table = convert(policies).expect("accepted");
        match &table.virtual_hosts[0].routes[0].action {
            Action::Forward(f) => f.mirrors.to_vec(),
            other => panic!("{other:?}"),
        }
    }

    /// What istiod writes for `mirror` with `mirrorPercentage: {value: 25}`, and for a bare
    /// `mirror` (no percentage: every request).
    #[test]
    fn istiods_mirror_policies_are_read() {
        let m = mirrors(json!([
            {"cluster": "outbound|80|v2|httpbin.default.svc.cluster.local",
             "runtime_fraction": {"default_value": {"numerator": 250_000, "denominator": "MILLION"}},
             "trace_sampled": false},
            {"cluster": "other"}
        ]));
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[0].cluster,
            "outbound|80|v2|httpbin.default.svc.cluster.local"
        );
        assert_eq!(m[0].fraction.per_million(), 250_000);
        assert!(m[0].shadow_suffix);
        assert_eq!(m[1].fraction.per_million(), 1_000_000);
        let none = mirrors(json!([{"cluster": "m", "runtime_fraction": {"default_value": {}}}]));
        assert_eq!(none[0].fraction.per_million(), 0);
        let plain = mirrors(json!([{"cluster": "m", "disable_shadow_host_suffix_append": true}]));
        assert!(!plain[0].shadow_suffix);
    }

    #[test]
    fn the_shadow_host_gets_its_suffix_before_the_port() {
        let m = |suffix| MirrorPolicy {
            cluster: "m".into(),
            fraction: crate::model::fault::Fraction::ALL,
            shadow_suffix: suffix,
        };
        assert_eq!(m(true).shadow_host("httpbin:8000"), "httpbin-shadow:8000");
        assert_eq!(m(true).shadow_host("httpbin"), "httpbin-shadow");
        assert_eq!(m(true).shadow_host("[::1]:80"), "[::1]-shadow:80");
        assert_eq!(m(true).shadow_host("[::1]"), "[::1]-shadow");
        assert_eq!(m(false).shadow_host("httpbin:8000"), "httpbin:8000");
    }

    #[test]
    fn what_remora_cannot_honour_is_refused_by_name() {
        let at = "route 9080: virtual_hosts[0].routes[0].route.request_mirror_policies[0]";
        let cases = [
            (
                json!([{"cluster": "m", "trace_sampled": true}]),
                "trace_sampled",
            ),
            (
                json!([{"runtime_fraction": {"default_value": {"numerator": 1}}}]),
                "cluster: a mirror needs a cluster",
            ),
            (
                json!([{"cluster": "m", "runtime_fraction": {"default_value": {"numerator": 101}}}]),
                "runtime_fraction.default_value.numerator: 101 over 100 is not a percentage",
            ),
            (
                json!([{"cluster": "m", "runtime_fraction": {"runtime_key": "k", "default_value": {"numerator": 1}}}]),
                "runtime_fraction.runtime_key: field not supported",
            ),
            (
                json!([{"cluster": "m", "runtime_fraction": {}}]),
                "runtime_fraction.default_value: required",
            ),
            (
                json!([{"cluster_header": "x-mirror"}]),
                "cluster_header: field not supported",
            ),
            (
                json!([{"cluster": "m", "host_rewrite_literal": "h"}]),
                "host_rewrite_literal: field not supported",
            ),
            (
                json!([{"cluster": "m", "request_headers_mutations": [{"remove": "x"}]}]),
                "request_headers_mutations: field not supported",
            ),
        ];
        for (policies, want) in cases {
            let err = convert(policies).expect_err(want);
            assert!(err.starts_with(at), "{err}");
            assert!(err.contains(want), "{err} (want {want})");
        }
    }
}
