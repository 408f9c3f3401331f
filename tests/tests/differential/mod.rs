//! The resources of the differential test (`xds_differential.rs`): the addresses both
//! worlds share, and istiod-shaped listeners, clusters, route tables and endpoints, with a
//! route per behaviour the cases exercise.

pub mod cases;
pub mod traffic;
mod traffic_tests;

use remora_e2e::backend;
use remora_e2e::envoy_xds::Resources;
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

/// Where the backends listen, in each world's peer namespace.
pub const BACKEND_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);
/// The HTTP service's VIP (port 80) and the TCP service's.
pub const HTTP_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const TCP_VIP: &str = "10.96.0.20:9000";
/// TCP VIPs whose cluster has no endpoint, and whose cluster does not exist.
pub const TCP_NO_ENDPOINT: &str = "10.96.0.21:9000";
pub const TCP_NO_CLUSTER: &str = "10.96.0.22:9000";
/// A destination no listener names: `virtualOutbound`'s catch-all (BlackHoleCluster).
pub const NOWHERE: &str = "10.96.0.99:1234";
/// The backends: name and port.
pub const BACKENDS: [(&str, u16); 3] = [("a", 8001), ("b", 8002), ("c", 8003)];
/// A port nothing listens on: an endpoint that refuses.
pub const DEAD_PORT: u16 = 8009;
pub const ECHO_PORT: u16 = 9000;

pub const A: &str = "outbound|80|a|web.test.svc.cluster.local";
pub const B: &str = "outbound|80|b|web.test.svc.cluster.local";
/// One endpoint that refuses, one that answers (backend `c`).
pub const FLAKY: &str = "outbound|80|flaky|web.test.svc.cluster.local";
/// No endpoint at all.
pub const EMPTY: &str = "outbound|80|empty|web.test.svc.cluster.local";
/// One endpoint, which refuses.
pub const DEAD: &str = "outbound|80|dead|web.test.svc.cluster.local";
pub const MISSING: &str = "outbound|80|missing|web.test.svc.cluster.local";
pub const TCP: &str = "outbound|9000||echo.test.svc.cluster.local";
pub const WEB: &str = "web.test.svc.cluster.local";

/// Istio's default access-log format, which both proxies write.
pub use remora_e2e::envoy_xds::ISTIO_TEXT_FORMAT;

pub fn backend_addr(port: u16) -> SocketAddr {
    SocketAddrV4::new(BACKEND_IP, port).into()
}

fn endpoint(port: u16) -> Value {
    json!({"endpoint": {"address": {"socket_address": {
        "address": BACKEND_IP.to_string(), "port_value": port}}}, "health_status": "HEALTHY"})
}

fn assignment(cluster: &str, ports: &[u16]) -> Value {
    let lb: Vec<Value> = ports.iter().map(|p| endpoint(*p)).collect();
    json!({"cluster_name": cluster, "endpoints": [{"lb_endpoints": lb}]})
}

fn eds_cluster(name: &str) -> Value {
    remora_e2e::xds_resources::eds_cluster(name)
}

fn header(key: &str, value: &str) -> Value {
    json!({"header": {"key": key, "value": value}})
}

/// Istio's default retry policy, as istiod writes it on every HTTP route.
fn istio_retry_policy() -> Value {
    json!({
        "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
        "num_retries": 2,
        "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
        "host_selection_retry_max_attempts": "5"
    })
}

fn to(cluster: &str) -> Value {
    json!({"cluster": cluster, "retry_policy": istio_retry_policy()})
}

fn direct(status: u16, body: &str) -> Value {
    json!({"status": status, "body": {"inline_string": body}})
}

/// The route table: one virtual host per domain shape, a route per behaviour.
pub fn routes() -> Value {
    let any = json!({"prefix": "/"});
    let route = |m: Value, action: Value| {
        let mut r = json!({"match": m});
        if let (Some(r), Some(a)) = (r.as_object_mut(), action.as_object()) {
            r.extend(a.clone());
        }
        r
    };
    let to_b = |m: Value| route(m, json!({"route": to(B)}));
    let web_routes: Vec<Value> = vec![
        route(json!({"path": "/exact"}), json!({"route": to(B)})),
        route(json!({"prefix": "/prefix/"}), json!({"route": to(B)})),
        route(
            json!({"prefix": "/caseless/", "case_sensitive": false}),
            json!({"route": to(B)}),
        ),
        route(
            json!({"safe_regex": {"regex": "/re/[0-9]+"}}),
            json!({"route": to(B)}),
        ),
        route(
            json!({"path_separated_prefix": "/sep"}),
            json!({"route": to(B)}),
        ),
        route(
            json!({"prefix": "/hdr-present", "headers": [{"name": "x-flag", "present_match": true}]}),
            json!({"route": to(B)}),
        ),
        route(
            json!({"prefix": "/hdr-regex", "headers": [{"name": "x-user", "string_match": {"safe_regex": {"regex": "user-[0-9]+"}}}]}),
            json!({"route": to(B)}),
        ),
        route(
            json!({"prefix": "/hdr-invert", "headers": [{"name": "x-env", "string_match": {"exact": "prod"}, "invert_match": true}]}),
            json!({"route": to(B)}),
        ),
        to_b(
            json!({"prefix": "/hdr-prefix", "headers": [{"name": "x-user", "string_match": {"prefix": "user-"}}]}),
        ),
        to_b(
            json!({"prefix": "/hdr-suffix", "headers": [{"name": "x-host", "string_match": {"suffix": ".test"}}]}),
        ),
        to_b(
            json!({"prefix": "/hdr-contains", "headers": [{"name": "x-tag", "string_match": {"contains": "mid"}}]}),
        ),
        to_b(
            json!({"prefix": "/hdr-ignore-case", "headers": [{"name": "x-case", "string_match": {"exact": "value", "ignore_case": true}}]}),
        ),
        to_b(
            json!({"prefix": "/query-prefix", "query_parameters": [{"name": "p", "string_match": {"prefix": "ab", "ignore_case": true}}]}),
        ),
        to_b(json!({"path": "/exact-ci", "case_sensitive": false})),
        route(
            json!({"prefix": "/hdr", "headers": [{"name": "x-version", "string_match": {"exact": "v2"}}]}),
            json!({"route": to(B)}),
        ),
        route(
            json!({"prefix": "/query-present", "query_parameters": [{"name": "debug", "present_match": true}]}),
            json!({"route": to(B)}),
        ),
        route(
            json!({"prefix": "/query", "query_parameters": [{"name": "canary", "string_match": {"exact": "true"}}]}),
            json!({"route": to(B)}),
        ),
        route(
            json!({"path": "/old"}),
            json!({"redirect": {"path_redirect": "/new", "response_code": "FOUND"}}),
        ),
        route(
            json!({"prefix": "/v1/"}),
            json!({"redirect": {"prefix_rewrite": "/v2/"}}),
        ),
        route(
            json!({"prefix": "/to-https/"}),
            json!({"redirect": {"https_redirect": true}}),
        ),
        route(
            json!({"prefix": "/strip"}),
            json!({"redirect": {"path_redirect": "/stripped", "strip_query": true, "response_code": "TEMPORARY_REDIRECT"}}),
        ),
        route(
            json!({"prefix": "/own-query"}),
            json!({"redirect": {"path_redirect": "/q?mine=1", "strip_query": true}}),
        ),
        route(
            json!({"prefix": "/moved-host/"}),
            json!({"redirect": {"host_redirect": "elsewhere.test", "response_code": "PERMANENT_REDIRECT"}}),
        ),
        route(
            json!({"prefix": "/moved-port/"}),
            json!({"redirect": {"port_redirect": 8443}}),
        ),
        route(
            json!({"path": "/teapot"}),
            json!({"direct_response": direct(418, "I'm a teapot")}),
        ),
        route(
            json!({"path": "/empty-direct"}),
            json!({"direct_response": {"status": 204}}),
        ),
        route(
            json!({"path": "/unavailable"}),
            json!({"direct_response": direct(503, "down for maintenance")}),
        ),
        route(
            json!({"prefix": "/rewrite-exact"}),
            json!({"route": {"cluster": A, "prefix_rewrite": "/exactly"}}),
        ),
        route(
            json!({"prefix": "/rewrite"}),
            json!({"route": {"cluster": A, "prefix_rewrite": "/rewritten"}}),
        ),
        route(
            json!({"prefix": "/host-rewrite/"}),
            json!({"route": {"cluster": A, "host_rewrite_literal": "rewritten.test"}}),
        ),
        {
            let mut r = route(json!({"prefix": "/edits"}), json!({"route": to(A)}));
            r["request_headers_to_add"] = json!([
                header("x-route", "route"),
                header("x-both", "route"),
                {"header": {"key": "x-appended", "value": "route"}, "append_action": "APPEND_IF_EXISTS_OR_ADD"},
                {"header": {"key": "x-overwritten", "value": "route"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
            ]);
            r["request_headers_to_remove"] = json!(["x-remove-me"]);
            r["response_headers_to_add"] = json!([
                header("x-response-route", "route"),
                header("x-both", "route")
            ]);
            r["response_headers_to_remove"] = json!([backend::SECRET_HEADER]);
            r
        },
        {
            let mut r = route(json!({"prefix": "/slow"}), json!({"route": to(A)}));
            r["route"]["timeout"] = json!("0.5s");
            r
        },
        route(
            json!({"prefix": "/no-cluster"}),
            json!({"route": to(MISSING)}),
        ),
        route(
            json!({"prefix": "/no-endpoint"}),
            json!({"route": to(EMPTY)}),
        ),
        route(json!({"prefix": "/retry"}), json!({"route": to(FLAKY)})),
        route(json!({"prefix": "/dead"}), json!({"route": to(DEAD)})),
        route(
            json!({"prefix": "/503-once-retried"}),
            json!({"route": {"cluster": A, "retry_policy": {
            "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
            "num_retries": 2, "retriable_status_codes": [503]}}}),
        ),
        route(
            json!({"prefix": "/split"}),
            json!({"route": {"weighted_clusters": {"clusters": [
            {"name": A, "weight": 80,
             "request_headers_to_add": [header("x-subset", "a")],
             "response_headers_to_add": [header("x-split", "a")]},
            {"name": B, "weight": 20,
             "request_headers_to_add": [header("x-subset", "b")],
             "response_headers_to_add": [header("x-split", "b")],
             "response_headers_to_remove": [backend::SECRET_HEADER]}
        ]}, "retry_policy": istio_retry_policy()}}),
        ),
    ];
    let mut web_routes = web_routes;
    web_routes.extend(cors_routes());
    web_routes.extend(traffic::routes());
    web_routes.push(route(any.clone(), json!({"route": to(A)})));
    let answer = |name: &str| json!([{"match": any.clone(), "direct_response": direct(200, name)}]);
    json!([{
        "name": "80",
        "ignore_port_in_host_matching": true,
        "request_headers_to_add": [header("x-table", "table"), header("x-both", "table")],
        "response_headers_to_add": [header("x-response-table", "table")],
        "virtual_hosts": [
            {"name": "web.test.svc.cluster.local:80",
             "domains": [WEB, "web", "web.test", "web.test.svc", HTTP_VIP.to_string()],
             "include_request_attempt_count": true,
             "request_headers_to_add": [header("x-vhost", "vhost"), header("x-both", "vhost")],
             "response_headers_to_add": [header("x-response-vhost", "vhost")],
             "routes": web_routes},
            {"name": "suffix", "domains": ["*.wild.test"], "routes": answer("suffix")},
            {"name": "deeper", "domains": ["*.deep.wild.test"], "routes": answer("deeper")},
            {"name": "exact", "domains": ["exact.wild.test"], "routes": answer("exact")},
            {"name": "prefix", "domains": ["api.*"], "routes": answer("prefix")}
        ]
    }, {
        // The port counts here (istiod's tables for ports other than 80 and 443 keep it).
        "name": "8080",
        "virtual_hosts": [
            {"name": "with-port", "domains": ["web.test.svc.cluster.local:8080", "web:8080"],
             "routes": answer("with-port")},
            {"name": "without-port", "domains": [WEB], "routes": [
                {"match": {"prefix": "/flaky/"}, "route": to(A), "typed_per_filter_config": traffic::abort_all()},
                // No cors filter on this port: the policy does nothing.
                {"match": {"prefix": "/cors"}, "route": to(A), "typed_per_filter_config": cors_policy(json!({}))},
                {"match": {"prefix": "/"}, "route": to(A)}]},
            {"name": "allow_any", "domains": ["*"], "routes": answer("catch-all")}
        ]
    }])
}

/// istiod's cors config for a VirtualService's `corsPolicy` (`translateCORSPolicy`), with
/// `extra` fields over it.
fn cors_policy(extra: Value) -> Value {
    let mut policy = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy",
        "allow_origin_string_match": [{"exact": "https://a.example"}, {"prefix": "https://b."},
            {"safe_regex": {"regex": "https://c[0-9]+\\.example"}}],
        "allow_methods": "GET,PUT",
        "allow_headers": "x-custom,content-type",
        "expose_headers": "x-exposed",
        "max_age": "86400",
        "allow_credentials": true,
        "filter_enabled": {"default_value": {"numerator": 100, "denominator": "HUNDRED"}}
    });
    if let (Some(p), Some(e)) = (policy.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    json!({"envoy.filters.http.cors": policy})
}

/// Routes with a CORS policy: istiod's, one that answers preflights from other origins
/// (`unmatchedPreflights: IGNORE`) instead of forwarding them, one with a fault's abort, one
/// to a cluster that does not exist.
fn cors_routes() -> Vec<Value> {
    // With a fault that aborts every request too: the fault filter comes first.
    let mut faulty = cors_policy(json!({}));
    if let (Some(p), Some(f)) = (faulty.as_object_mut(), traffic::abort_all().as_object()) {
        p.extend(f.clone());
    }
    vec![
        json!({"match": {"prefix": "/cors-fault"}, "route": to(A), "typed_per_filter_config": faulty}),
        // The router's own reply (no such cluster).
        json!({"match": {"prefix": "/cors-no-cluster"}, "route": to(MISSING),
               "typed_per_filter_config": cors_policy(json!({}))}),
        json!({"match": {"prefix": "/cors-strict"}, "route": to(A),
               "typed_per_filter_config": cors_policy(json!({"forward_not_matching_preflights": false}))}),
        json!({"match": {"prefix": "/cors"}, "route": to(A),
               "typed_per_filter_config": cors_policy(json!({}))}),
    ]
}

/// istiod's outbound HTTP listener for a port: `0.0.0.0_<port>`, RDS `<port>`, with istiod's
/// access log.
fn http_listener(port: u16, access_log: &Value, fault_filter: bool) -> Value {
    let mut filters = vec![];
    if fault_filter {
        // istiod's outbound chains have the fault filter (without one, Envoy injects no route's
        // fault); port 8080's leaves it out to show that.
        filters.push(json!({"name": "envoy.filters.http.fault", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"}}));
        // After the fault filter, as istiod orders them; port 8080's leaves it out too.
        filters.push(json!({"name": "envoy.filters.http.cors", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"}}));
    }
    filters.push(
        json!({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}),
    );
    json!({"name": format!("0.0.0.0_{port}"),
     "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
     "traffic_direction": "OUTBOUND", "bind_to_port": false,
     "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": format!("outbound_0.0.0.0_{port}"),
        "normalize_path": true,
        "server_name": "istio-envoy",
        "rds": {"config_source": {"ads": {}, "resource_api_version": "V3"}, "route_config_name": port.to_string()},
        "access_log": access_log,
        "http_filters": filters}}]}]})
}

/// istiod's listeners: `virtualOutbound` (REGISTRY_ONLY: the catch-all goes to
/// BlackHoleCluster), `0.0.0.0_80` and `0.0.0.0_8080` (HTTP) and the TCP VIP's.
pub fn listeners() -> Value {
    let tcp_proxy = |cluster: &str| {
        json!({"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": cluster, "cluster": cluster}})
    };
    let access_log = json!([{"name": "envoy.access_loggers.file", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
        "path": "/dev/stdout",
        "log_format": {"text_format_source": {"inline_string": ISTIO_TEXT_FORMAT}}}}]);
    json!([
        {"name": "virtualOutbound", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
         "use_original_dst": true, "traffic_direction": "OUTBOUND",
         "filter_chains": [{"name": "virtualOutbound-catchall-tcp", "filters": [tcp_proxy("BlackHoleCluster")]}]},
        http_listener(80, &access_log, true),
        http_listener(8080, &access_log, false),
        remora_e2e::xds_resources::tcp_listener(TCP_VIP.parse().expect("addr"), TCP),
        remora_e2e::xds_resources::tcp_listener(TCP_NO_ENDPOINT.parse().expect("addr"), EMPTY),
        remora_e2e::xds_resources::tcp_listener(TCP_NO_CLUSTER.parse().expect("addr"), MISSING)
    ])
}

pub fn resources() -> Resources {
    let (a, b, c) = (BACKENDS[0].1, BACKENDS[1].1, BACKENDS[2].1);
    let clusters: Vec<Value> = [A, B, FLAKY, DEAD, EMPTY, TCP]
        .iter()
        .map(|n| eds_cluster(n))
        .collect();
    let mut clusters = clusters;
    clusters.push(json!({"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}));
    Resources {
        listeners: listeners(),
        clusters: Value::Array(clusters),
        routes: routes(),
        endpoints: json!([
            assignment(A, &[a]),
            assignment(B, &[b]),
            assignment(FLAKY, &[DEAD_PORT, c]),
            assignment(DEAD, &[DEAD_PORT]),
            assignment(EMPTY, &[]),
            assignment(TCP, &[ECHO_PORT])
        ]),
    }
}
