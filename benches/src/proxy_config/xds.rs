//! The `remora-xds` contender: the same Remora as the `remora` row, but each connection is
//! routed by xDS resources read from `xds.resources_dir`, as a sidecar routes what it captured
//! on its way to a service: the listener for the upstream's address, then (HTTP) the route
//! table, virtual host and route per request, and the cluster's endpoints balanced per request
//! (TCP: the `tcp_proxy` chain's cluster, an endpoint per connection).
//!
//! The resources are shaped as istiod writes them for one service `bench.ns.svc.cluster.local`
//! whose only endpoint is the benchmark's upstream (its address stands for the service's VIP
//! too): an EDS cluster `outbound|<port>||<host>` with LEAST_REQUEST, lifted circuit breakers
//! and Istio's metadata; its ClusterLoadAssignment; for HTTP the `0.0.0.0_<port>` listener
//! (HTTP connection manager over RDS, Passthrough default chain), the `<port>` route table
//! (the service's virtual host with istiod's default retry policy, then `allow_any`),
//! PassthroughCluster and BlackHoleCluster; for TCP a `<vip>_<port>` listener with `tcp_proxy`.
//! No mesh TLS: the endpoint carries no `tlsMode` label, so it is plaintext, as the `remora`
//! row's upstream is.
//!
//! Remora's explicit listener (`--protocol xds`) stands in for the capture rules: its
//! connections are routed as if captured on their way to `--upstream`, the one syscall
//! `SO_ORIGINAL_DST` would cost per connection aside.

use super::Mode;
use crate::xds_scale::Resources;
use serde_json::{json, Value};
use std::net::SocketAddr;

/// The service the upstream stands for.
pub const SERVICE: &str = "bench";
const NAMESPACE: &str = "ns";

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const CLA: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const TCP_PROXY: &str =
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
const HCM: &str =
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";

/// The service's host name.
pub fn host() -> String {
    format!("{SERVICE}.{NAMESPACE}.svc.cluster.local")
}

/// The service's cluster for `port`.
pub fn cluster_name(port: u16) -> String {
    format!("outbound|{port}||{}", host())
}

/// Every resource for routing `mode` to `upstream` by xDS.
pub fn resources(mode: Mode, upstream: SocketAddr) -> Resources {
    let port = upstream.port();
    let name = cluster_name(port);
    let mut r = Resources::default();
    r.clusters.push(service_cluster(&name, port));
    r.endpoints.push(json!({
        "@type": CLA,
        "cluster_name": name,
        "endpoints": [{"locality": {}, "lb_endpoints": [{
            "endpoint": {"address": {"socket_address": {
                "address": upstream.ip().to_string(), "port_value": port}}},
            "health_status": "HEALTHY",
            "metadata": {"filter_metadata": {"istio": {
                "workload": format!("{SERVICE}-v1;{NAMESPACE};{SERVICE};v1;Kubernetes")}}},
            "load_balancing_weight": 1
        }], "load_balancing_weight": 1}]
    }));
    r.clusters.push(json!({
        "@type": CLUSTER, "name": "PassthroughCluster", "type": "ORIGINAL_DST",
        "connect_timeout": "10s", "lb_policy": "CLUSTER_PROVIDED",
        "circuit_breakers": unlimited_circuit_breakers()
    }));
    r.clusters.push(json!({"@type": CLUSTER, "name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}));
    match mode {
        Mode::Tcp => r.listeners.push(json!({
            "@type": LISTENER,
            "name": format!("{}_{port}", upstream.ip()),
            "address": {"socket_address": {"address": upstream.ip().to_string(), "port_value": port}},
            "filter_chains": [{"filters": [tcp_proxy(&name)], "name": name}],
            "traffic_direction": "OUTBOUND",
            "bind_to_port": false
        })),
        Mode::Http1 | Mode::Grpc | Mode::H2c => {
            r.listeners.push(http_listener(port));
            r.routes.push(route_table(&name, upstream));
        }
    }
    r
}

pub(super) fn unlimited_circuit_breakers() -> Value {
    let max = u32::MAX;
    json!({"thresholds": [{"max_connections": max, "max_pending_requests": max,
        "max_requests": max, "max_retries": max, "track_remaining": true}]})
}

pub(super) fn service_cluster(name: &str, port: u16) -> Value {
    json!({
        "@type": CLUSTER,
        "name": name,
        "type": "EDS",
        "eds_cluster_config": {
            "eds_config": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
            "service_name": name
        },
        "connect_timeout": "10s",
        "lb_policy": "LEAST_REQUEST",
        "circuit_breakers": unlimited_circuit_breakers(),
        "metadata": {"filter_metadata": {"istio": {
            "default_original_port": port,
            "services": [{"host": host(), "name": SERVICE, "namespace": NAMESPACE}]
        }}}
    })
}

fn tcp_proxy(cluster: &str) -> Value {
    json!({"name": "envoy.filters.network.tcp_proxy",
           "typed_config": {"@type": TCP_PROXY, "stat_prefix": cluster, "cluster": cluster}})
}

pub(super) fn http_listener(port: u16) -> Value {
    let filter = |name: &str, ty: &str| json!({"name": name, "typed_config": {"@type": format!("type.googleapis.com/{ty}")}});
    let hcm = json!({
        "@type": HCM,
        "stat_prefix": format!("outbound_0.0.0.0_{port}"),
        "rds": {"config_source": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
                "route_config_name": port.to_string()},
        "http_filters": [
            filter("envoy.filters.http.router", "envoy.extensions.filters.http.router.v3.Router")
        ],
        "use_remote_address": false,
        "stream_idle_timeout": "0s",
        "normalize_path": true,
        "path_with_escaped_slashes_action": "KEEP_UNCHANGED"
    });
    json!({
        "@type": LISTENER,
        "name": format!("0.0.0.0_{port}"),
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
        "filter_chains": [{
            "filter_chain_match": {"transport_protocol": "raw_buffer", "application_protocols": ["http/1.1", "h2c"]},
            "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]
        }],
        "listener_filters": [
            filter("envoy.filters.listener.tls_inspector", "envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"),
            filter("envoy.filters.listener.http_inspector", "envoy.extensions.filters.listener.http_inspector.v3.HttpInspector")
        ],
        "listener_filters_timeout": "0s",
        "continue_on_listener_filters_timeout": true,
        "traffic_direction": "OUTBOUND",
        "default_filter_chain": {"filters": [tcp_proxy("PassthroughCluster")], "name": "PassthroughFilterChain"},
        "bind_to_port": false
    })
}

/// The `<port>` table: the service's virtual host (the load tools' `Host` values, the
/// upstream's address standing for its VIP) with istiod's default retry policy, then
/// `allow_any`.
fn route_table(cluster: &str, upstream: SocketAddr) -> Value {
    let port = upstream.port();
    let retry = json!({
        "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
        "num_retries": 2,
        "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
        "host_selection_retry_max_attempts": "5",
        "retriable_status_codes": [503]
    });
    let names = [
        host(),
        SERVICE.to_string(),
        format!("{SERVICE}.{NAMESPACE}.svc"),
        format!("{SERVICE}.{NAMESPACE}"),
        upstream.ip().to_string(),
    ];
    let domains: Vec<String> = names
        .iter()
        .flat_map(|n| [n.clone(), format!("{n}:{port}")])
        .collect();
    json!({
        "@type": ROUTE,
        "name": port.to_string(),
        "virtual_hosts": [
            {
                "name": format!("{}:{port}", host()),
                "domains": domains,
                "routes": [{
                    "name": "default",
                    "match": {"prefix": "/"},
                    "route": {"cluster": cluster, "timeout": "0s", "retry_policy": retry,
                              "max_stream_duration": {"max_stream_duration": "0s", "grpc_timeout_header_max": "0s"}},
                    "decorator": {"operation": format!("{}:{port}/*", host())}
                }],
                "include_request_attempt_count": true
            },
            {
                "name": "allow_any",
                "domains": ["*"],
                "routes": [{"name": "allow_any", "match": {"prefix": "/"},
                            "route": {"cluster": "PassthroughCluster", "timeout": "0s"}}],
                "include_request_attempt_count": true
            }
        ],
        "validate_clusters": false,
        "ignore_port_in_host_matching": true
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_xds::refusal::Kind;
    use remora_xds::validate::validate_one;

    /// Remora accepts every resource of both modes: a refusal would make the row measure
    /// something else (or nothing).
    #[test]
    fn remora_accepts_every_resource() {
        let upstream: SocketAddr = "127.0.0.1:40123".parse().expect("an address");
        for mode in [Mode::Http1, Mode::Tcp] {
            let r = resources(mode, upstream);
            let kinds = [
                (Kind::Cluster, &r.clusters),
                (Kind::Endpoint, &r.endpoints),
                (Kind::Listener, &r.listeners),
                (Kind::Route, &r.routes),
            ];
            let refused: Vec<String> = kinds
                .iter()
                .flat_map(|(kind, list)| list.iter().map(|v| validate_one(*kind, v)))
                .filter(|v| v.refusal.is_some())
                .map(|v| v.to_string())
                .collect();
            assert!(refused.is_empty(), "{mode:?}: {refused:#?}");
        }
    }

    /// The service's endpoint is the upstream, and the load tools' Host values reach its
    /// virtual host, not `allow_any`.
    #[test]
    fn the_service_is_the_upstream_and_its_host_names_match() {
        let upstream: SocketAddr = "127.0.0.1:40123".parse().expect("an address");
        let r = resources(Mode::Http1, upstream);
        let lb = &r.endpoints[0]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"];
        assert_eq!(lb["socket_address"]["port_value"], 40123);
        assert_eq!(r.listeners[0]["name"], "0.0.0.0_40123");
        let vhost = &r.routes[0]["virtual_hosts"][0];
        let domains: Vec<&str> = vhost["domains"]
            .as_array()
            .map(|d| d.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        // wrk's Host is the proxy's address (the port is ignored), the probe's is `bench`.
        assert!(domains.contains(&"127.0.0.1") && domains.contains(&"bench"));
        assert_eq!(
            vhost["routes"][0]["route"]["cluster"],
            "outbound|40123||bench.ns.svc.cluster.local"
        );
        let tcp = resources(Mode::Tcp, upstream);
        assert_eq!(tcp.listeners[0]["name"], "127.0.0.1_40123");
        assert!(tcp.routes.is_empty());
    }
}
