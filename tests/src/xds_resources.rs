//! Envoy resources in istiod's shape for the end-to-end tests that route by xDS, from files or
//! from the test control plane: EDS clusters with istiod's auto-mTLS sockets, their endpoints,
//! and TCP listeners.

use serde_json::{json, Value};
use std::net::SocketAddr;

/// An EDS cluster over ADS, Istio's default balancing.
pub fn eds_cluster(name: &str) -> Value {
    json!({"name": name, "type": "EDS", "connect_timeout": "2s", "lb_policy": "LEAST_REQUEST",
           "eds_cluster_config": {"eds_config": {"ads": {}}, "service_name": name}})
}

/// An EDS host, with istiod's `tlsMode` metadata when it has a sidecar.
pub fn endpoint(a: SocketAddr, tls_mode: Option<&str>) -> Value {
    let mut e = json!({"endpoint": {"address": {"socket_address": {
        "address": a.ip().to_string(), "port_value": a.port()}}},
        "health_status": "HEALTHY"});
    if let Some(mode) = tls_mode {
        e["metadata"] =
            json!({"filter_metadata": {"envoy.transport_socket_match": {"tlsMode": mode}}});
    }
    e
}

/// An EDS cluster with istiod's auto-mTLS sockets: Istio mTLS (this SNI, this SAN) for
/// endpoints with `tlsMode: istio`, plaintext for the rest.
pub fn mtls_cluster(name: &str, sni: &str, san: &str) -> Value {
    let sds = |name: &str| {
        json!({"name": name, "sds_config": {"api_config_source": {"api_type": "GRPC",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}],
            "transport_api_version": "V3"}, "resource_api_version": "V3"}})
    };
    let mut c = eds_cluster(name);
    c["transport_socket_matches"] = json!([
        {"name": "tlsMode-istio", "match": {"tlsMode": "istio"}, "transport_socket": {
            "name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": sni,
                "common_tls_context": {
                    "alpn_protocols": ["istio-peer-exchange", "istio"],
                    "tls_certificate_sds_secret_configs": [sds("default")],
                    "combined_validation_context": {
                        "default_validation_context": {"match_typed_subject_alt_names": [
                            {"san_type": "URI", "matcher": {"exact": san}}]},
                        "validation_context_sds_secret_config": sds("ROOTCA")}}}}},
        {"name": "tlsMode-disabled", "match": {}, "transport_socket": {
            "name": "envoy.transport_sockets.raw_buffer", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"}}}
    ]);
    c
}

/// istiod's outbound TCP listener for one service address: `<ip>_<port>`, tcp_proxy to
/// `cluster`.
pub fn tcp_listener(address: SocketAddr, cluster: &str) -> Value {
    json!({"name": format!("{}_{}", address.ip(), address.port()),
        "address": {"socket_address": {"address": address.ip().to_string(), "port_value": address.port()}},
        "traffic_direction": "OUTBOUND", "bind_to_port": false,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": cluster, "cluster": cluster}}]}]})
}
