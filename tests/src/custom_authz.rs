//! AuthorizationPolicy's CUSTOM action as `xds_ext_authz.rs` and `xds_ext_authz_stats.rs` give
//! it to Remora and Envoy: istiod's `virtualInbound` for CUSTOM policies, one chain per case,
//! and the authorizers' clusters, as both proxies are given them; the pod's workload and the
//! peer's requests ([`client`]).

pub mod client;

use crate::envoy_xds::Resources;
use crate::ext_authz::{self, TcpChain, DENIED_TCP_PORT};
use crate::xds_resources::inbound_cluster;
use serde_json::{json, Value};

pub const AUTHZ_PORT: u16 = 9000;
/// Selected requests sent to the authorizer; it fails closed (403).
pub const UP: u16 = 8080;
/// The authorizer's cluster points where nothing listens; `status_on_error` 503.
pub const DOWN: u16 = 8081;
/// The same, with `failure_mode_allow`.
pub const DOWN_OPEN: u16 = 8082;
/// The gRPC authorizer, sent the first [`MAX_BODY`] bytes of the body.
pub const GRPC: u16 = 8083;
pub const GRPC_AUTHZ: &str = "10.1.0.2:9191";
pub const MAX_BODY: usize = 8000;
/// The HTTP authorizer with a DENY RBAC filter after it (paths under `/blocked`), and the body
/// sent along, at most [`SMALL_BODY`] bytes and no partial message (413 past it).
pub const ORDERED: u16 = 8084;
pub const SMALL_BODY: usize = 10;
/// The HTTP authorizer with a 500 ms timeout.
pub const HASTY: u16 = 8085;
/// The gRPC authorizer (which edits the query), then the HTTP one, which tells the workload
/// the path it was asked about.
pub const CHAINED: u16 = 8086;
/// The HTTP authorizer (whose allowed requests get `x-ext-authz-check-result: allowed`) before
/// a route matching that header, which answers `rerouted` itself: the filter keeps the route
/// chosen before its check (istiod's, `clear_route_cache` unset), or, on the second port,
/// clears it so the route is chosen again on the edited request.
pub const REROUTE: u16 = 8087;
pub const REROUTE_CLEARED: u16 = 8088;
/// A chain no policy applies to: no RBAC filter, no authorizer (and so no statistics of them).
pub const PLAIN: u16 = 8089;
/// TCP ports with the network ext_authz filter (the gRPC authorizer): allowed, denied.
pub const TCP_ALLOWED: u16 = 9100;
pub const TCP_DENIED: u16 = DENIED_TCP_PORT as u16;
/// A TCP port the CUSTOM policy does not select.
pub const TCP_UNSELECTED: u16 = 9102;
/// The HTTP services' ports, each behind its own inbound chain.
pub const HTTP_PORTS: [u16; 10] = [
    UP,
    DOWN,
    DOWN_OPEN,
    GRPC,
    ORDERED,
    HASTY,
    CHAINED,
    REROUTE,
    REROUTE_CLEARED,
    PLAIN,
];
/// The TCP services' ports.
pub const TCP_PORTS: [u16; 3] = [TCP_ALLOWED, TCP_DENIED, TCP_UNSELECTED];
/// Istio's default access-log format, which both proxies write; request line, status, flags
/// and response code details are compared.
pub const LOG_FORMAT: &str = crate::envoy_xds::ISTIO_TEXT_FORMAT;

/// `"METHOD PATH PROTOCOL" STATUS FLAGS DETAILS` of each request line of an access log.
pub fn access_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| {
            let start = l.find("\"GET ").or_else(|| l.find("\"POST "))?;
            let rest = &l[start..];
            let end = rest[1..].find('"')? + 2;
            let mut after = rest[end..].split_whitespace();
            let (status, flags, details) = (after.next()?, after.next()?, after.next()?);
            Some(format!("{} {status} {flags} {details}", &rest[..end]))
        })
        .collect()
}

fn authz_cluster(name: &str, address: &str, port: u16) -> Value {
    json!({"name": name, "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint":
            {"address": {"socket_address": {"address": address, "port_value": port}}}}]}]}})
}

/// istiod's ext_authz filter for an `envoyExtAuthzGrpc` provider with
/// `includeRequestBodyInCheck`.
fn grpc_ext_authz(cluster: &str) -> Value {
    json!({"name": "envoy.filters.http.ext_authz", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
        "grpc_service": {"envoy_grpc": {"cluster_name": cluster,
            "authority": cluster.replace('|', "_.")}, "timeout": "600s"},
        "with_request_body": {"max_request_bytes": MAX_BODY, "allow_partial_message": true},
        "transport_api_version": "V3",
        "filter_enabled_metadata": {"filter": "envoy.filters.http.rbac",
            "path": [{"key": "istio_ext_authz_shadow_effective_policy_id"}],
            "value": {"string_match": {"prefix": "istio-ext-authz"}}}}})
}

/// istiod's shadow RBAC filter for a CUSTOM policy selecting requests with `x-select: ext`
/// (`when: request.headers[x-select]`).
fn shadow_rbac() -> Value {
    json!({"name": "envoy.filters.http.rbac", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
        "shadow_rules": {"action": "DENY", "policies": {
            "istio-ext-authz-ns[server]-policy[ext]-rule[0]": {
                "permissions": [{"and_rules": {"rules": [{"or_rules": {"rules": [
                    {"header": {"name": "x-select", "string_match": {"exact": "ext"}}}]}}]}}],
                "principals": [{"and_ids": {"ids": [{"any": true}]}}]}}},
        "shadow_rules_stat_prefix": "istio_ext_authz_"}})
}

/// istiod's ext_authz filter for an `envoyExtAuthzHttp` provider.
fn ext_authz(cluster: &str, fail_open: bool, status_on_error: Option<u16>) -> Value {
    let mut config = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
        "http_service": {
            "server_uri": {"uri": "http://ext-authz.foo.svc.cluster.local", "cluster": cluster,
                "timeout": "600s"},
            "authorization_request": {"allowed_headers": {"patterns": [{"exact": "x-ext-authz"}]}},
            "authorization_response": {
                "allowed_upstream_headers": {"patterns": [{"exact": "x-ext-authz-check-result"}]},
                "allowed_client_headers": {"patterns": [{"exact": "x-ext-authz-check-result"}]}}},
        "failure_mode_allow": fail_open,
        "transport_api_version": "V3",
        "filter_enabled_metadata": {"filter": "envoy.filters.http.rbac",
            "path": [{"key": "istio_ext_authz_shadow_effective_policy_id"}],
            "value": {"string_match": {"prefix": "istio-ext-authz"}}}});
    if let Some(code) = status_on_error {
        config["status_on_error"] = json!({"code": code});
    }
    json!({"name": "envoy.filters.http.ext_authz", "typed_config": config})
}

/// A DENY policy on paths under `/blocked`, as istiod writes it after the CUSTOM filters.
fn deny_blocked() -> Value {
    json!({"name": "envoy.filters.http.rbac", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
        "rules": {"action": "DENY", "policies": {"ns[server]-policy[block]-rule[0]": {
            "permissions": [{"url_path": {"path": {"prefix": "/blocked"}}}],
            "principals": [{"any": true}]}}}}})
}

/// istiod's filter for a dry-run (`istio.io/dry-run`) policy of `action` on paths under
/// `path`: shadow rules only, counted under `istio_dry_run_<action>_`.
fn dry_run(action: &str, path: &str) -> Value {
    json!({"name": "envoy.filters.http.rbac", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
        "shadow_rules": {"action": action.to_uppercase(), "policies": {"ns[server]-policy[dry]-rule[0]": {
            "permissions": [{"url_path": {"path": {"prefix": path}}}],
            "principals": [{"any": true}]}}},
        "shadow_rules_stat_prefix": format!("istio_dry_run_{action}_")}})
}

/// A TCP chain with the network ext_authz filter; the CUSTOM policy selects ports 9100 and
/// 9101.
fn tcp_chain(port: u16, grpc: &str) -> Value {
    let chain = TcpChain {
        grpc,
        selected: &[(9100, 9102)],
        fail_open: false,
        access_log: None,
    };
    ext_authz::tcp_chain(port, chain)
}

/// A chain with the router only.
fn plain_chain(port: u16) -> Value {
    let mut chain = chain_with(port, &[]);
    let filters = "/filters/0/typed_config/http_filters";
    if let Some(Value::Array(filters)) = chain.pointer_mut(filters) {
        filters.remove(0);
    }
    chain
}

fn chain(port: u16, authz: Value) -> Value {
    chain_with(port, &[authz])
}

fn chain_with(port: u16, filters: &[Value]) -> Value {
    let mut http_filters = vec![shadow_rbac()];
    http_filters.extend_from_slice(filters);
    http_filters.push(
        json!({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}),
    );
    let cluster = format!("inbound|{port}||");
    json!({"name": format!("0.0.0.0_{port}"),
        "filter_chain_match": {"destination_port": port, "transport_protocol": "raw_buffer"},
        "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": format!("inbound_0.0.0.0_{port}"),
            "route_config": {"name": cluster, "virtual_hosts": [{"name": "inbound", "domains": ["*"],
                "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster, "timeout": "0s"}}]}]},
            "http_filters": http_filters,
            "access_log": [{"name": "envoy.access_loggers.file", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": "/dev/stdout",
                "log_format": {"text_format_source": {"inline_string": LOG_FORMAT}}}}]}}]})
}

pub fn resources() -> Resources {
    let up = "outbound|9000||ext-authz.foo.svc.cluster.local";
    let down = "outbound|9001||ext-authz-down.foo.svc.cluster.local";
    let grpc = "outbound|9191||ext-authz-grpc.foo.svc.cluster.local";
    let listener = json!({"name": "virtualInbound", "traffic_direction": "INBOUND",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
        "listener_filters": [{"name": "envoy.filters.listener.original_dst", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"}}],
        "filter_chains": [
            chain(UP, ext_authz(up, false, None)),
            chain(DOWN, ext_authz(down, false, Some(503))),
            chain(DOWN_OPEN, ext_authz(down, true, None)),
            chain(GRPC, grpc_ext_authz(grpc)),
            chain_with(
                ORDERED,
                &[small_body(ext_authz(up, false, None)), deny_blocked(), dry_run("allow", "/upload")],
            ),
            chain(HASTY, hasty(ext_authz(up, false, None))),
            chain_with(
                CHAINED,
                &[
                    grpc_ext_authz(grpc),
                    seen_path(ext_authz(up, false, None)),
                    deny_blocked(),
                    dry_run("deny", "/headers"),
                ],
            ),
            rerouting(REROUTE, ext_authz(up, false, None)),
            rerouting(REROUTE_CLEARED, clearing(ext_authz(up, false, None))),
            plain_chain(PLAIN),
            tcp_chain(TCP_ALLOWED, grpc),
            tcp_chain(TCP_DENIED, grpc),
            tcp_chain(TCP_UNSELECTED, grpc)]});
    let mut clusters: Vec<Value> = HTTP_PORTS
        .iter()
        .chain(&TCP_PORTS)
        .map(|p| inbound_cluster(&format!("inbound|{p}||")))
        .collect();
    clusters.push(authz_cluster(up, "127.0.0.1", AUTHZ_PORT));
    clusters.push(authz_cluster(down, "127.0.0.1", AUTHZ_PORT + 1));
    clusters.push(ext_authz::grpc_cluster(
        grpc,
        GRPC_AUTHZ.parse().expect("an address"),
    ));
    Resources {
        listeners: json!([listener]),
        clusters: Value::Array(clusters),
        routes: json!([]),
        endpoints: json!([]),
    }
}

/// `filter` passing the authorizer's `x-ext-authz-seen-path` to the workload too.
fn seen_path(mut filter: Value) -> Value {
    filter["typed_config"]["http_service"]["authorization_response"]["allowed_upstream_headers"]
        ["patterns"] =
        json!([{"exact": "x-ext-authz-check-result"}, {"exact": "x-ext-authz-seen-path"}]);
    filter
}

/// A chain with `authz` whose route table first sends a request carrying the authorizer's
/// `x-ext-authz-check-result: allowed` to a direct response (`rerouted`), and has no route
/// for any other outside `/hello`.
fn rerouting(port: u16, authz: Value) -> Value {
    let mut chain = chain(port, authz);
    let routes = "/filters/0/typed_config/route_config/virtual_hosts/0/routes";
    if let Some(Value::Array(routes)) = chain.pointer_mut(routes) {
        if let Some(to_cluster) = routes.first_mut() {
            to_cluster["match"] = json!({"prefix": "/hello"});
        }
        routes.insert(
            0,
            json!({"name": "authorized", "match": {"prefix": "/", "headers": [{
                "name": "x-ext-authz-check-result", "string_match": {"exact": "allowed"}}]},
                "direct_response": {"status": 200, "body": {"inline_string": "rerouted\n"}}}),
        );
    }
    chain
}

/// `filter` clearing the route cache when its authorizer allows.
fn clearing(mut filter: Value) -> Value {
    filter["typed_config"]["clear_route_cache"] = json!(true);
    filter
}

/// `filter` with a check timeout of 500 ms.
fn hasty(mut filter: Value) -> Value {
    filter["typed_config"]["http_service"]["server_uri"]["timeout"] = json!("0.5s");
    filter
}

/// `filter` sending at most [`SMALL_BODY`] bytes of the body, none past it.
fn small_body(mut filter: Value) -> Value {
    filter["typed_config"]["with_request_body"] = json!({"max_request_bytes": SMALL_BODY});
    filter
}
