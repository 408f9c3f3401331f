use crate::convert::from_json;
use crate::model::matcher::HeaderMatch;
use crate::model::route::{Action, ClusterTarget, PathMatch, RouteConfiguration};
use serde_json::{json, Value};
use std::time::Duration;

type RouteProto = envoy_types::pb::envoy::config::route::v3::RouteConfiguration;

fn convert(routes: Value) -> Result<RouteConfiguration, String> {
    let v = json!({"name": "9080", "virtual_hosts": [{"name": "vh", "domains": ["*"], "routes": routes}]});
    from_json::<RouteProto>(&v)
        .map(|c| c.model)
        .map_err(|r| r.to_string())
}

/// istiod bounds direct responses at 1 MiB on every table; Envoy's default is 4 KiB. A
/// body over the bound refuses the table, as Envoy does.
#[test]
fn direct_response_bodies_are_bounded_as_envoy_bounds_them() {
    let table = |max: Option<u64>, body: usize| {
        let mut v = json!({"name": "9080", "virtual_hosts": [{"name": "vh", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "x".repeat(body)}}}]}]});
        if let Some(max) = max {
            v["max_direct_response_body_size_bytes"] = json!(max);
        }
        from_json::<RouteProto>(&v)
            .map(|c| c.model)
            .map_err(|r| r.to_string())
    };
    assert!(table(Some(1_048_576), 10_000).is_ok());
    assert!(table(None, 4096).is_ok());
    let err = table(None, 4097).expect_err("over Envoy's default");
    assert!(
        err.contains("over max_direct_response_body_size_bytes (4096)"),
        "{err}"
    );
    let err = table(Some(10), 11).expect_err("over the table's bound");
    assert!(
        err.contains("virtual_hosts[0].routes[0].direct_response.body"),
        "{err}"
    );
}

#[test]
fn timeouts_weights_headers_and_redirects() {
    let rc = convert(json!([
        {"match": {"prefix": "/", "headers": [{"name": "end-user", "string_match": {"exact": "jason"}}]},
         "route": {"weighted_clusters": {"clusters": [{"name": "v1", "weight": 90}, {"name": "v2", "weight": 10}]}}},
        {"match": {"safe_regex": {"regex": "/api/v[0-9]+/.*"}}, "route": {"cluster": "api", "timeout": "2.5s"}},
        {"match": {"path": "/old"}, "redirect": {"path_redirect": "/new", "response_code": "PERMANENT_REDIRECT"}},
        {"match": {"prefix": "/x"}, "direct_response": {"status": 503, "body": {"inline_string": "no"}}}
    ]))
    .expect("accepted");
    let routes = &rc.virtual_hosts[0].routes;
    let Action::Forward(f) = &routes[0].action else {
        panic!()
    };
    assert_eq!(
        f.timeout,
        Some(Duration::from_secs(15)),
        "unset is Envoy's 15 s"
    );
    let ClusterTarget::Weighted(w) = &f.target else {
        panic!()
    };
    assert_eq!((w[0].weight, w[1].name.as_str()), (90, "v2"));
    assert!(matches!(
        &routes[0].matcher.headers[0].kind,
        HeaderMatch::Value(_)
    ));
    assert!(matches!(&routes[1].matcher.path, PathMatch::Regex(p) if p.is_match("/api/v2/users")));
    let Action::Forward(f) = &routes[1].action else {
        panic!()
    };
    assert_eq!(f.timeout, Some(Duration::from_millis(2500)));
    let Action::Redirect(r) = &routes[2].action else {
        panic!()
    };
    assert_eq!((r.status, r.path.as_deref()), (308, Some("/new")));
    assert!(
        matches!(&routes[3].action, Action::DirectResponse { status: 503, body: Some(b) } if b == "no")
    );
}

#[test]
fn what_remora_cannot_honour_is_refused() {
    let cases = [
        (
            json!([{"match": {"prefix": "/"}, "route": {"cluster": "c", "retry_policy": {"retry_on": "5xx,bogus"}}}]),
            "unknown retry condition \"bogus\"",
        ),
        (
            json!([{"match": {"prefix": "/"}, "route": {"cluster": "c", "retry_policy": {"retry_on": "5xx,retriable-headers"}}}]),
            "retry condition \"retriable-headers\" not supported",
        ),
        (
            json!([{"match": {"prefix": "/"}, "route": {"cluster": "c", "retry_policy": {"retry_on": "5xx",
            "retry_priority": {"name": "envoy.retry_priorities.previous_priorities"}}}}]),
            "previous_priorities needs its update_frequency",
        ),
        (
            json!([{"match": {"prefix": "/"}, "route": {"cluster": "c", "retry_policy": {"retry_on": "5xx",
            "retry_priority": {"name": "envoy.retry_priorities.other"}}}}]),
            "retry priority \"envoy.retry_priorities.other\" not supported",
        ),
        (
            json!([{"match": {"prefix": "/"}, "route": {"cluster": "c", "retry_policy": {
            "retry_host_predicate": [{"name": "envoy.retry_host_predicates.omit_canary_hosts"}]}}}]),
            "omit_canary_hosts",
        ),
        (
            json!([{"match": {"prefix": "/"}, "route": {"cluster": "c", "hash_policy": [{"filter_state": {"key": "x"}}]}}]),
            "hash_policy[0].filter_state: field not supported",
        ),
        (
            json!([{"match": {"prefix": "/"}, "route": {"cluster": "c", "hash_policy": [{"cookie": {"name": "", "ttl": "60s"}}]}}]),
            "hash_policy[0].cookie.name: empty",
        ),
        (
            json!([{"match": {"prefix": "/"}, "route": {"cluster": "c", "hash_policy": [{"header": {"header_name": "x",
                "regex_rewrite": {"pattern": {"regex": "a"}, "substitution": "b"}}}]}}]),
            "hash_policy[0].header.regex_rewrite: field not supported",
        ),
        (
            json!([{"match": {"prefix": "/"}, "route": {"weighted_clusters": {"total_weight": 100,
                "clusters": [{"name": "a", "weight": 50}, {"name": "b", "weight": 40}]}}}]),
            "total_weight 100 is not the sum of the weights (90)",
        ),
        (
            json!([{"match": {"prefix": "/"}, "route": {"weighted_clusters": {
                "clusters": [{"name": "a", "weight": 0}, {"name": "b"}]}}}]),
            "weighted_clusters: the sum of the weights must be greater than 0",
        ),
        (
            json!([{"match": {"prefix": "/"}, "direct_response": {"status": 99}}]),
            "direct_response.status: status 99 is not in [200, 600)",
        ),
        (
            json!([{"match": {"prefix": "/"}, "route": {"cluster_header": "x-cluster"}}]),
            "cluster_header: field not supported",
        ),
    ];
    for (routes, want) in cases {
        let err = convert(routes).expect_err(want);
        assert!(err.contains(want), "{err} (want {want})");
        assert!(
            err.starts_with("route 9080: virtual_hosts[0].routes[0]"),
            "{err}"
        );
    }
}

#[test]
fn hash_policies_as_istiod_writes_them() {
    use crate::model::hash::{GeneratedCookie, HashKind, HashPolicy};
    let rc = convert(
        json!([{"match": {"prefix": "/"}, "route": {"cluster": "c", "hash_policy": [
            {"header": {"header_name": "X-User"}},
            {"cookie": {"name": "session", "path": "/"}, "terminal": true},
            {"connection_properties": {"source_ip": true}},
            {"connection_properties": {"source_ip": false}},
            {"query_parameter": {"name": "user"}},
            // DestinationRule httpCookie {name: sticky, path: /app, ttl: 3600.5s, attributes}.
            {"cookie": {"name": "sticky", "path": "/app", "ttl": "3600.500s",
                "attributes": [{"name": "SameSite", "value": "Strict"}, {"name": "Secure"}]}},
            {"cookie": {"name": "session-only", "ttl": "0s"}}
        ]}}]),
    )
    .expect("accepted");
    let Action::Forward(f) = &rc.virtual_hosts[0].routes[0].action else {
        panic!("forward")
    };
    let policy = |kind, terminal| HashPolicy { kind, terminal };
    assert_eq!(
        f.hash_policy,
        [
            policy(HashKind::Header("x-user".into()), false),
            policy(HashKind::Cookie("session".into()), true),
            policy(HashKind::SourceIp, false),
            policy(HashKind::QueryParameter("user".into()), false),
            policy(
                HashKind::GeneratedCookie(GeneratedCookie {
                    name: "sticky".into(),
                    ttl_seconds: 3600,
                    path: "/app".into(),
                    attributes: vec![
                        ("SameSite".into(), "Strict".into()),
                        ("Secure".into(), String::new())
                    ],
                }),
                false
            ),
            policy(
                HashKind::GeneratedCookie(GeneratedCookie {
                    name: "session-only".into(),
                    ttl_seconds: 0,
                    path: String::new(),
                    attributes: vec![],
                }),
                false
            ),
        ]
    );
}
