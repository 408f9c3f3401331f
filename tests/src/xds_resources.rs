//! Envoy resources in istiod's shape for the end-to-end tests that route by xDS, from files or
//! from the test control plane: EDS clusters with istiod's auto-mTLS sockets, their endpoints,
//! TCP listeners and the outbound HTTP listeners of port 80.

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

/// istiod's outbound listeners for HTTP services on port 80: `virtualOutbound` (the capture
/// port 15001, whose catch-all sends what no listener takes to `BlackHoleCluster`) and
/// `0.0.0.0_80`, its connection manager routing by the RDS table `80` and writing
/// `access_log` when given.
pub fn outbound_http_listeners(access_log: Option<Value>) -> Vec<Value> {
    let mut manager = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "outbound_0.0.0.0_80",
        "rds": {"config_source": {"ads": {}, "resource_api_version": "V3"}, "route_config_name": "80"},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]});
    if let Some(access_log) = access_log {
        manager["access_log"] = access_log;
    }
    vec![
        json!({"name": "virtualOutbound", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
            "use_original_dst": true, "traffic_direction": "OUTBOUND",
            "filter_chains": [{"name": "virtualOutbound-catchall-tcp", "filters": [
                {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": "BlackHoleCluster", "cluster": "BlackHoleCluster"}}]}]}),
        json!({"name": "0.0.0.0_80",
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
            "traffic_direction": "OUTBOUND", "bind_to_port": false,
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                "typed_config": manager}]}]}),
    ]
}

/// An SDS secret reference as istiod writes it (`default`: the workload certificate, `ROOTCA`).
fn sds(name: &str) -> Value {
    json!({"name": name, "sds_config": {"api_config_source": {"api_type": "GRPC",
        "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}],
        "transport_api_version": "V3"}, "resource_api_version": "V3"}})
}

/// istiod's inbound cluster (`inbound|PORT||`, or `InboundPassthroughClusterIpv4`): the
/// original destination, dialled from `127.0.0.6`, which the capture rules let through.
pub fn inbound_cluster(name: &str) -> Value {
    json!({"name": name, "type": "ORIGINAL_DST", "connect_timeout": "10s",
        "lb_policy": "CLUSTER_PROVIDED",
        "upstream_bind_config": {"source_address": {"address": "127.0.0.6", "port_value": 0}}})
}

/// istiod's downstream mTLS context on `virtualInbound`'s chains: the workload certificate
/// and roots over SDS, a client certificate required from the trust domain, `alpn` offered.
pub fn inbound_tls(alpn: &[&str]) -> Value {
    json!({"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "common_tls_context": {
            "tls_params": {"tls_minimum_protocol_version": "TLSv1_2",
                "tls_maximum_protocol_version": "TLSv1_3"},
            "alpn_protocols": alpn,
            "tls_certificate_sds_secret_configs": [sds("default")],
            "combined_validation_context": {
                "default_validation_context": {"match_subject_alt_names": [{"prefix": "spiffe://cluster.local/"}]},
                "validation_context_sds_secret_config": sds("ROOTCA")}},
        "require_client_certificate": true}})
}

/// `istio_authn`, before every inbound chain's terminal filter.
fn istio_authn() -> Value {
    json!({"name": "istio_authn", "typed_config": {
        "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
        "type_url": "type.googleapis.com/io.istio.network.authn.Config"}})
}

/// An inbound HTTP connection manager for `port`: an inline route table sending everything
/// to `inbound|PORT||`, the `x-forwarded-client-cert` istiod asks for, and `http_filters`
/// (RBAC, as istiod compiles AuthorizationPolicies) before the router.
pub fn inbound_hcm(port: u16, http_filters: &[Value]) -> Value {
    let cluster = format!("inbound|{port}||");
    let mut filters = http_filters.to_vec();
    filters.push(
        json!({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}),
    );
    json!({"name": "envoy.filters.network.http_connection_manager", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": format!("inbound_0.0.0.0_{port}"),
        "route_config": {"name": cluster, "virtual_hosts": [{"name": format!("inbound|http|{port}"),
            "domains": ["*"], "routes": [{"name": "default", "match": {"prefix": "/"},
                "route": {"cluster": cluster, "timeout": "0s"}}]}]},
        "http_filters": filters,
        "use_remote_address": false,
        "forward_client_cert_details": "APPEND_FORWARD",
        "set_current_client_cert_details": {"subject": true, "dns": true, "uri": true},
        "normalize_path": true}})
}

/// A `tcp_proxy` to `cluster`.
fn tcp_proxy(cluster: &str) -> Value {
    json!({"name": "envoy.filters.network.tcp_proxy", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
        "stat_prefix": cluster, "cluster": cluster}})
}

/// istiod's `virtualInbound` for one HTTP `port` of the workload, with `http_filters` in its
/// connection managers: the port's mTLS chain (matched on Istio's ALPN values, ALPN
/// `h2`,`http/1.1`), in PERMISSIVE mode (`strict` false) a plaintext chain beside it, and the
/// catch-all chains to `InboundPassthroughClusterIpv4` for every other port (mTLS always,
/// plaintext when PERMISSIVE), with `tcp_filters` (network RBAC) before their `tcp_proxy`;
/// the TLS and HTTP inspectors off on 15006 itself.
pub fn virtual_inbound(
    port: u16,
    strict: bool,
    http_filters: &[Value],
    tcp_filters: &[Value],
) -> Value {
    let tcp = |cluster: &str| {
        let mut filters = vec![istio_authn()];
        filters.extend_from_slice(tcp_filters);
        filters.push(tcp_proxy(cluster));
        filters
    };
    let any = json!([{"address_prefix": "0.0.0.0", "prefix_len": 0}]);
    let passthrough = "InboundPassthroughClusterIpv4";
    let mut chains = vec![
        json!({"name": "virtualInbound-blackhole", "filter_chain_match": {"destination_port": 15006},
            "filters": [tcp_proxy("BlackHoleCluster")]}),
        json!({"name": format!("0.0.0.0_{port}"), "filter_chain_match": {"destination_port": port,
                "transport_protocol": "tls", "application_protocols":
                ["istio", "istio-peer-exchange", "istio-http/1.0", "istio-http/1.1", "istio-h2"]},
            "transport_socket": inbound_tls(&["h2", "http/1.1"]),
            "filters": [istio_authn(), inbound_hcm(port, http_filters)]}),
        json!({"name": "virtualInbound", "filter_chain_match": {"prefix_ranges": any,
                "transport_protocol": "tls", "application_protocols": ["istio-peer-exchange", "istio"]},
            "transport_socket": inbound_tls(&["istio-peer-exchange", "h2", "http/1.1"]),
            "filters": tcp(passthrough)}),
    ];
    if !strict {
        chains.push(
            json!({"name": format!("0.0.0.0_{port}"), "filter_chain_match": {
                "destination_port": port, "transport_protocol": "raw_buffer"},
            "filters": [istio_authn(), inbound_hcm(port, http_filters)]}),
        );
        chains.push(
            json!({"name": "virtualInbound", "filter_chain_match": {"prefix_ranges": any,
                "transport_protocol": "raw_buffer"},
            "filters": [istio_authn(), tcp_proxy(passthrough)]}),
        );
    }
    let inspector = |name: &str, ty: &str| {
        json!({"name": name, "typed_config": {"@type": ty},
            "filter_disabled": {"destination_port_range": {"start": 15006, "end": 15007}}})
    };
    json!({"name": "virtualInbound", "traffic_direction": "INBOUND",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
        "listener_filters": [
            {"name": "envoy.filters.listener.original_dst", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"}},
            inspector("envoy.filters.listener.tls_inspector",
                "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"),
            inspector("envoy.filters.listener.http_inspector",
                "type.googleapis.com/envoy.extensions.filters.listener.http_inspector.v3.HttpInspector")],
        "listener_filters_timeout": "0s", "continue_on_listener_filters_timeout": true,
        "filter_chains": chains})
}

/// istiod's clusters behind [`virtual_inbound`] for `port`.
pub fn inbound_clusters(port: u16) -> Vec<Value> {
    vec![
        inbound_cluster(&format!("inbound|{port}||")),
        inbound_cluster("InboundPassthroughClusterIpv4"),
        json!({"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}),
    ]
}

/// The RBAC rules istiod compiles an AuthorizationPolicy of `action` (`ALLOW`, `DENY`) into,
/// whose one rule names the peer by its SPIFFE ID (`source.principals`), as `istio_authn`'s
/// filter state carries it.
fn rbac_rules(action: &str, policy: &str, principal: &str) -> Value {
    json!({"action": action, "policies": {policy: {
        "permissions": [{"and_rules": {"rules": [{"any": true}]}}],
        "principals": [{"and_ids": {"ids": [{"or_ids": {"ids": [{"filter_state": {
            "key": "io.istio.peer_principal",
            "string_match": {"exact": principal}}}]}}]}}]}}})
}

/// That policy as the HTTP RBAC filter of an inbound connection manager.
pub fn http_rbac(action: &str, policy: &str, principal: &str) -> Value {
    json!({"name": "envoy.filters.http.rbac", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
        "rules": rbac_rules(action, policy, principal),
        "shadow_rules_stat_prefix": "istio_dry_run_allow_"}})
}

/// That policy as the network RBAC filter of an inbound TCP chain.
pub fn network_rbac(action: &str, policy: &str, principal: &str) -> Value {
    json!({"name": "envoy.filters.network.rbac", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC",
        "stat_prefix": "tcp.",
        "rules": rbac_rules(action, policy, principal),
        "shadow_rules_stat_prefix": "istio_dry_run_allow_"}})
}
