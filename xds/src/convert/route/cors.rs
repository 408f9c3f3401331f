//! The cors filter's per-route config (`typed_per_filter_config["envoy.filters.http.cors"]`,
//! `envoy.extensions.filters.http.cors.v3.CorsPolicy`) into [`CorsPolicy`], as istiod writes
//! a VirtualService's `corsPolicy`. `shadow_enabled` (which only counts origins in Envoy's
//! statistics) and a `filter_enabled.runtime_key` are refused by the field check (`read/http.rs`).

use crate::convert::any::Unpacked;
use crate::convert::common::string_matcher;
use crate::model::cors::CorsPolicy;
use crate::model::fault::Fraction;
use crate::refusal::Fault;
use envoy_types::pb::envoy::extensions::filters::http::cors::v3 as pb;

/// The name istiod gives the cors filter, under which routes carry its config.
pub const CORS_FILTER: &str = "envoy.filters.http.cors";
const CORS_POLICY: &str = "envoy.extensions.filters.http.cors.v3.CorsPolicy";

/// One `CorsPolicy` (at `at`).
pub fn cors_policy(u: &Unpacked, at: &str) -> Result<CorsPolicy, Fault> {
    if u.message_name() != CORS_POLICY {
        return Err(Fault::new(at, "not a CorsPolicy").with_type(&u.type_url));
    }
    let p: pb::CorsPolicy = u.to(at)?;
    policy(&p, at).map_err(|e| e.with_type(&u.type_url))
}

fn policy(p: &pb::CorsPolicy, at: &str) -> Result<CorsPolicy, Fault> {
    let allow_origins = p
        .allow_origin_string_match
        .iter()
        .enumerate()
        .map(|(i, m)| string_matcher(m, &format!("{at}.allow_origin_string_match[{i}]")))
        .collect::<Result<_, _>>()?;
    let enabled = match p.filter_enabled.as_ref() {
        None => Fraction::ALL,
        // Envoy's constraint: the default is required.
        Some(f) => match f.default_value.as_ref() {
            None => {
                return Err(Fault::new(
                    format!("{at}.filter_enabled.default_value"),
                    "required",
                ))
            }
            d => super::fault::fraction(d, &format!("{at}.filter_enabled.default_value"))?,
        },
    };
    Ok(CorsPolicy {
        allow_origins,
        allow_methods: p.allow_methods.clone(),
        allow_headers: p.allow_headers.clone(),
        expose_headers: p.expose_headers.clone(),
        max_age: p.max_age.clone(),
        allow_credentials: p.allow_credentials.as_ref().map(|b| b.value),
        allow_private_network_access: p.allow_private_network_access.as_ref().map(|b| b.value),
        forward_not_matching_preflights: p
            .forward_not_matching_preflights
            .as_ref()
            .map(|b| b.value),
        enabled,
    })
}

#[cfg(test)]
mod tests {
    use crate::convert::from_json;
    use crate::model::cors::{CorsOutcome, CorsRequest};
    use crate::model::route::RouteConfiguration;
    use serde_json::{json, Value};

    type RouteProto = envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
    const TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy";

    fn convert(table: Value) -> Result<RouteConfiguration, String> {
        from_json::<RouteProto>(&table)
            .map(|c| c.model)
            .map_err(|r| r.to_string())
    }

    fn per_filter(mut policy: Value) -> Value {
        policy["@type"] = json!(TYPE);
        json!({"envoy.filters.http.cors": policy})
    }

    /// What istiod writes for a `corsPolicy` (`translateCORSPolicy`).
    fn istio_policy() -> Value {
        json!({
            "allow_origin_string_match": [{"exact": "https://a.example"}, {"prefix": "https://b."},
                {"safe_regex": {"regex": "https://c[0-9]+\\.example"}}],
            "allow_methods": "GET,POST",
            "allow_headers": "x-custom",
            "expose_headers": "x-exposed",
            "max_age": "86400",
            "allow_credentials": true,
            "filter_enabled": {"default_value": {"numerator": 100, "denominator": "HUNDRED"}}
        })
    }

    fn get(origin: &str) -> CorsRequest<'_> {
        CorsRequest {
            method: "GET",
            origin: Some(origin),
            ..CorsRequest::default()
        }
    }

    #[test]
    fn istiods_policy_is_honoured_most_specific_first() {
        let table = convert(json!({"name": "80", "virtual_hosts": [{"name": "vh", "domains": ["*"],
            "typed_per_filter_config": per_filter(istio_policy()),
            "routes": [
                {"match": {"prefix": "/own"}, "route": {"cluster": "c"},
                 "typed_per_filter_config": per_filter(json!({"allow_origin_string_match": [{"exact": "https://own"}]}))},
                {"match": {"prefix": "/"}, "route": {"cluster": "c"}}]}]}))
        .expect("accepted");
        let routes = &table.virtual_hosts[0].routes;
        let own = routes[0].cors.as_ref().expect("own policy");
        assert_eq!(own.policies.len(), 2);
        assert_eq!(
            own.evaluate(&get("https://a.example"), 0),
            CorsOutcome::Pass
        );
        assert!(matches!(
            own.evaluate(&get("https://own"), 0),
            CorsOutcome::Response(_)
        ));
        let inherited = routes[1].cors.as_ref().expect("virtual host's policy");
        for origin in ["https://a.example", "https://b.x", "https://c42.example"] {
            assert!(
                matches!(
                    inherited.evaluate(&get(origin), 0),
                    CorsOutcome::Response(_)
                ),
                "{origin}"
            );
        }
        assert_eq!(
            inherited.evaluate(&get("https://c.example"), 0),
            CorsOutcome::Pass
        );
    }

    #[test]
    fn what_is_not_honoured_is_refused_by_name() {
        let route_with = |policy: Value| {
            json!({"name": "80", "virtual_hosts": [{"name": "vh", "domains": ["*"], "routes": [
                {"match": {"prefix": "/"}, "route": {"cluster": "c"}, "typed_per_filter_config": per_filter(policy)}]}]})
        };
        let cases = [
            (
                json!({"shadow_enabled": {"default_value": {"numerator": 1}}}),
                "shadow_enabled",
            ),
            (
                json!({"filter_enabled": {"runtime_key": "k", "default_value": {"numerator": 1}}}),
                "runtime_key",
            ),
            (
                json!({"filter_enabled": {}}),
                "filter_enabled.default_value",
            ),
            (
                json!({"allow_origin_string_match": [{"safe_regex": {"regex": "("}}]}),
                "allow_origin_string_match[0]",
            ),
        ];
        for (policy, want) in cases {
            let err = convert(route_with(policy)).expect_err(want);
            assert!(err.contains(want), "{err} (want {want})");
            assert!(
                err.contains("typed_per_filter_config[envoy.filters.http.cors]"),
                "{err}"
            );
        }
        let weighted = json!({"name": "80", "virtual_hosts": [{"name": "vh", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"weighted_clusters": {"clusters": [
                {"name": "a", "weight": 1, "typed_per_filter_config": per_filter(istio_policy())}]}}}]}]});
        let err = convert(weighted).expect_err("weighted");
        assert!(
            err.contains("weighted cluster's cors config not supported"),
            "{err}"
        );
    }
}
