//! The set-up of the xDS routing tests (`xds_routing.rs`): the services' addresses, the
//! resources in istiod's shape written for `xds.resources_dir`, the pods' routes, and the
//! h2c origin of the upstream-protocol test.

mod h2c;

pub use h2c::h2c_origin;
use remora_e2e::xds_resources::{eds_cluster, endpoint};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// Bound on one curl run.
pub const CURL_TIME: Duration = Duration::from_secs(20);
/// The HTTP service's VIP, known only to the resources.
pub const HTTP_VIP: &str = "10.96.0.10";
/// The TCP service's VIP and port.
pub const TCP_VIP: &str = "10.96.0.20:9000";
pub const CLUSTER: &str = "outbound|80||web.test.svc.cluster.local";
pub const TCP_CLUSTER: &str = "outbound|9000||echo.test.svc.cluster.local";

pub fn assignment(name: &str, endpoints: &[SocketAddr]) -> Value {
    let lb: Vec<Value> = endpoints.iter().map(|a| endpoint(*a, None)).collect();
    json!({"cluster_name": name, "endpoints": [{"lb_endpoints": lb}]})
}

pub fn write_all(dir: &Path, listeners: Value, routes: Value, clusters: Value, endpoints: Value) {
    for (file, value) in [
        ("listeners.json", listeners),
        ("routes.json", routes),
        ("clusters.json", clusters),
        ("endpoints.json", endpoints),
    ] {
        std::fs::write(dir.join(file), value.to_string()).expect("write a resource file");
    }
}

/// istiod's listeners: `0.0.0.0_80` with an HCM and RDS `80`, `10.96.0.20_9000` with
/// tcp_proxy to `tcp_cluster`.
pub fn listeners(tcp_cluster: &str) -> Value {
    json!([
        {"name": "0.0.0.0_80", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
         "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "outbound_0.0.0.0_80",
            "rds": {"config_source": {"ads": {}}, "route_config_name": "80"},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]},
        {"name": "10.96.0.20_9000", "address": {"socket_address": {"address": "10.96.0.20", "port_value": 9000}},
         "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": tcp_cluster, "cluster": tcp_cluster}}]}]}
    ])
}

/// istiod's shape: `0.0.0.0_80` with an HCM and RDS `80`, `10.96.0.20_9000` with tcp_proxy.
pub fn write_resources(dir: &Path, web: &[SocketAddr], echo: SocketAddr) {
    let listeners = listeners(TCP_CLUSTER);
    let routes = json!([{"name": "80", "ignore_port_in_host_matching": true, "virtual_hosts": [{
    "name": "web.test.svc.cluster.local:80",
    "domains": ["web.test.svc.cluster.local", "web", HTTP_VIP],
    "routes": [
        {"match": {"path": "/missing"}, "route": {"cluster": "outbound|80||nowhere.test.svc.cluster.local"}},
        {"match": {"prefix": "/"}, "route": {"cluster": CLUSTER}}
    ]}]}]);
    let mut web_cluster = eds_cluster(CLUSTER);
    web_cluster["metadata"] = json!({"filter_metadata": {"istio": {"services": [
        {"host": "web.test.svc.cluster.local", "name": "web", "namespace": "test"}]}}});
    let clusters = json!([web_cluster, eds_cluster(TCP_CLUSTER)]);
    let endpoints = json!([assignment(CLUSTER, web), assignment(TCP_CLUSTER, &[echo])]);
    write_all(dir, listeners, routes, clusters, endpoints);
}

/// Poll `done` for up to five seconds.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// istiod's `virtualInbound` with only mTLS chains for `port` (STRICT) and both kinds for
/// every other port (PERMISSIVE), all to `InboundPassthroughClusterIpv4`.
pub fn strict_inbound(port: u16) -> Value {
    let sds = |name: &str| {
        json!({"name": name, "sds_config": {"api_config_source": {"api_type": "GRPC",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}],
            "transport_api_version": "V3"}, "resource_api_version": "V3"}})
    };
    let tls = json!({"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "common_tls_context": {
            "alpn_protocols": ["h2", "http/1.1"],
            "tls_certificate_sds_secret_configs": [sds("default")],
            "combined_validation_context": {
                "default_validation_context": {"match_subject_alt_names": [{"prefix": "spiffe://cluster.local/"}]},
                "validation_context_sds_secret_config": sds("ROOTCA")}},
        "require_client_certificate": true}});
    let tcp = json!([{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
        "stat_prefix": "InboundPassthroughClusterIpv4", "cluster": "InboundPassthroughClusterIpv4"}}]);
    let any = json!([{"address_prefix": "0.0.0.0", "prefix_len": 0}]);
    json!([{
    "name": "virtualInbound", "traffic_direction": "INBOUND",
    "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
    // Without the TLS inspector no connection is known to be TLS, in Envoy as here.
    "listener_filters": [{"name": "envoy.filters.listener.tls_inspector", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"}}],
    "filter_chains": [
        {"filter_chain_match": {"destination_port": port, "transport_protocol": "tls"},
         "transport_socket": tls.clone(), "filters": tcp.clone()},
        {"filter_chain_match": {"prefix_ranges": any.clone(), "transport_protocol": "tls"},
         "transport_socket": tls, "filters": tcp.clone()},
        {"filter_chain_match": {"prefix_ranges": any, "transport_protocol": "raw_buffer"},
         "filters": tcp}
    ]}])
}

/// A cluster with `HttpProtocolOptions` as istiod writes them: `explicit` HTTP/2 (a port
/// declared `grpc`/`http2`) or the downstream's protocol (an auto-detected port).
pub fn cluster_speaking(name: &str, protocol: Value) -> Value {
    let mut options = json!({
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "common_http_protocol_options": {"idle_timeout": "3600s"}});
    options
        .as_object_mut()
        .expect("object")
        .extend(protocol.as_object().expect("object").clone());
    let mut c = eds_cluster(name);
    c["typed_extension_protocol_options"] =
        json!({"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": options});
    c
}
