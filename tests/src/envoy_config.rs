//! Envoy's configuration as the interop tests write it: Istio's shapes of listeners, filters,
//! clusters and TLS contexts for a real Envoy playing the other pod's sidecar.

use crate::envoy::ADMIN_PORT;
use serde_json::{json, Value};
use std::net::Ipv4Addr;
use std::path::Path;

/// Envoy's `address` for `ip:port`.
pub fn socket_address(ip: Ipv4Addr, port: u16) -> Value {
    json!({ "socket_address": { "address": ip.to_string(), "port_value": port } })
}

/// Istio's workload certificate files, as a `common_tls_context` with `alpn` and a SAN match on
/// `peer_id`.
pub fn common_tls(certs: &Path, alpn: &[&str], peer_id: &str) -> Value {
    let file = |f: &str| json!({ "filename": certs.join(f).to_string_lossy() });
    json!({
        "alpn_protocols": alpn,
        "tls_params": {
            "tls_minimum_protocol_version": "TLSv1_2",
            "tls_maximum_protocol_version": "TLSv1_3"
        },
        "tls_certificates": [{
            "certificate_chain": file("cert-chain.pem"),
            "private_key": file("key.pem")
        }],
        "validation_context": {
            "trusted_ca": file("root-cert.pem"),
            "match_typed_subject_alt_names": [{ "san_type": "URI", "matcher": { "exact": peer_id } }]
        }
    })
}

/// The admin API on the namespace's loopback, at [`ADMIN_PORT`].
pub fn admin() -> Value {
    json!({ "address": socket_address(Ipv4Addr::LOCALHOST, ADMIN_PORT) })
}

/// The HTTP filters of a plain connection manager: the router alone.
pub fn router() -> Value {
    json!([{
        "name": "envoy.filters.http.router",
        "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" }
    }])
}

/// An HTTP connection manager sending everything to `cluster`, with `extra` fields merged in.
pub fn http_connection_manager(stat_prefix: &str, cluster: &str, extra: Value) -> Value {
    let mut hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": stat_prefix,
        "route_config": { "virtual_hosts": [{
            "name": "all", "domains": ["*"],
            "routes": [{ "match": { "prefix": "/" }, "route": { "cluster": cluster } }]
        }]},
        "http_filters": router()
    });
    if let (Some(hcm), Some(extra)) = (hcm.as_object_mut(), extra.as_object()) {
        hcm.extend(extra.clone());
    }
    json!({ "name": "envoy.filters.network.http_connection_manager", "typed_config": hcm })
}

/// A `tcp_proxy` filter to `cluster`.
pub fn tcp_proxy(stat_prefix: &str, cluster: &str) -> Value {
    json!({
        "name": "envoy.filters.network.tcp_proxy",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": stat_prefix,
            "cluster": cluster
        }
    })
}

/// A STATIC cluster of one endpoint, in TLS when `tls` is an `UpstreamTlsContext`.
pub fn cluster(name: &str, ip: Ipv4Addr, port: u16, tls: Option<Value>) -> Value {
    let mut c = json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "5s",
        "load_assignment": { "cluster_name": name, "endpoints": [{ "lb_endpoints": [{
            "endpoint": { "address": socket_address(ip, port) }
        }]}]}
    });
    if let Some(tls) = tls {
        c["transport_socket"] = json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": tls
        });
    }
    c
}

/// The `x-forwarded-client-cert` an application received, from `http_server.py`'s `/headers`.
pub fn xfcc_of(body: &str) -> String {
    let headers: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    headers["x-forwarded-client-cert"]
        .as_str()
        .unwrap_or_else(|| panic!("no x-forwarded-client-cert: {body}"))
        .to_string()
}
