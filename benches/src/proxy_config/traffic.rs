//! The traffic-management scenario's resources (`scenarios/traffic.rs`): the `remora-xds`
//! contender's service ([`super::xds`]) split by a VirtualService 90/10 over its `v1` and `v2`
//! subsets, with Istio's default retry policy on the route and a DestinationRule's outlier
//! detection on both subset clusters, as istiod writes them. Both subsets' one endpoint is the
//! benchmark's upstream (so each split's leg does the same work; what is measured is the
//! proxy's).
//!
//! Remora reads the resources from a directory; Envoy gets the very same resources in a
//! bootstrap ([`envoy_bootstrap`]): the clusters as they are, their EDS and the listener's RDS
//! pointed at files holding the same load assignments and route table (Envoy's filesystem
//! subscription), and the listener bound to the address the clients use (istiod's is
//! `bind_to_port: false` behind `virtualOutbound`, which Remora's `--protocol xds` listener
//! stands in for).

use super::xds::{cluster_name, host, http_listener, service_cluster, SERVICE};
use crate::route_scale::istio_retry_policy;
use crate::xds_scale::{discovery_response, Resources};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const CLA: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

/// The split: (subset, weight).
pub const SPLIT: [(&str, u32); 2] = [("v1", 90), ("v2", 10)];

/// The cluster of one subset for `port`, as istiod names it.
pub fn subset_cluster(port: u16, subset: &str) -> String {
    format!("outbound|{port}|{subset}|{}", host())
}

/// A DestinationRule's `outlierDetection` (consecutive 5xx errors 5, interval 10 s, base
/// ejection 30 s, at most half the hosts) compiled as istiod compiles it, with the panic
/// threshold it sets from `minHealthPercent` (0).
fn with_outlier_detection(mut cluster: Value) -> Value {
    cluster["outlier_detection"] = json!({
        "consecutive_5xx": 5, "interval": "10s", "base_ejection_time": "30s",
        "max_ejection_percent": 50, "enforcing_consecutive_5xx": 100, "enforcing_success_rate": 0
    });
    cluster["common_lb_config"] = json!({"healthy_panic_threshold": {}});
    cluster
}

fn assignment(name: &str, upstream: SocketAddr) -> Value {
    json!({
        "@type": CLA,
        "cluster_name": name,
        "endpoints": [{"locality": {}, "lb_endpoints": [{
            "endpoint": {"address": {"socket_address": {
                "address": upstream.ip().to_string(), "port_value": upstream.port()}}},
            "health_status": "HEALTHY",
            "metadata": {"filter_metadata": {"istio": {
                "workload": format!("{SERVICE}-v1;ns;{SERVICE};v1;Kubernetes")}}},
            "load_balancing_weight": 1
        }], "load_balancing_weight": 1}]
    })
}

/// Every resource: the HTTP listener on the upstream's port, the two subset clusters (and
/// the service's own, which istiod writes beside them), their assignments, the route table,
/// PassthroughCluster and BlackHoleCluster.
pub fn resources(upstream: SocketAddr) -> Resources {
    let port = upstream.port();
    let mut r = Resources::default();
    let service = cluster_name(port);
    r.clusters.push(service_cluster(&service, port));
    r.endpoints.push(assignment(&service, upstream));
    for (subset, _) in SPLIT {
        let name = subset_cluster(port, subset);
        r.clusters
            .push(with_outlier_detection(service_cluster(&name, port)));
        r.endpoints.push(assignment(&name, upstream));
    }
    r.clusters.push(json!({
        "@type": CLUSTER, "name": "PassthroughCluster", "type": "ORIGINAL_DST",
        "connect_timeout": "10s", "lb_policy": "CLUSTER_PROVIDED",
        "circuit_breakers": super::xds::unlimited_circuit_breakers()
    }));
    r.clusters.push(json!({"@type": CLUSTER, "name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}));
    r.listeners.push(http_listener(port));
    r.routes.push(route_table(upstream));
    r
}

/// The `<port>` table: the service's virtual host (the load tools' Host values, the upstream's
/// address standing for its VIP) with the weighted route, then `allow_any`.
fn route_table(upstream: SocketAddr) -> Value {
    let port = upstream.port();
    let names = [
        host(),
        SERVICE.to_string(),
        format!("{SERVICE}.ns.svc"),
        format!("{SERVICE}.ns"),
        upstream.ip().to_string(),
    ];
    let domains: Vec<String> = names
        .iter()
        .flat_map(|n| [n.clone(), format!("{n}:{port}")])
        .collect();
    let clusters: Vec<Value> = SPLIT
        .iter()
        .map(|(subset, weight)| json!({"name": subset_cluster(port, subset), "weight": weight}))
        .collect();
    json!({
        "@type": ROUTE,
        "name": port.to_string(),
        "virtual_hosts": [
            {
                "name": format!("{}:{port}", host()),
                "domains": domains,
                "routes": [{
                    "name": "split",
                    "match": {"prefix": "/"},
                    "route": {"weighted_clusters": {"clusters": clusters}, "timeout": "0s",
                              "retry_policy": istio_retry_policy(),
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

fn file_source(path: &Path) -> Value {
    json!({"path_config_source": {"path": path.display().to_string()}, "resource_api_version": "V3"})
}

fn without_type(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("@type");
    }
    v
}

/// Envoy's bootstrap holding `r` (see the module's notes), its listener on `listen` and its
/// admin on 127.0.0.1:`admin_port`; the route table and assignments are written into `dir`.
pub fn envoy_bootstrap(
    r: &Resources,
    dir: &Path,
    listen: SocketAddr,
    admin_port: u16,
) -> std::io::Result<Value> {
    let rds = dir.join("rds.json");
    std::fs::write(&rds, serde_json::to_vec(&discovery_response(&r.routes, 1))?)?;
    let mut clusters = Vec::new();
    for c in &r.clusters {
        let mut c = without_type(c);
        if let Some(service) = c["eds_cluster_config"]["service_name"].as_str() {
            let file = dir.join(format!("eds-{}.json", clusters.len()));
            let cla: Vec<Value> = r
                .endpoints
                .iter()
                .filter(|e| e["cluster_name"] == service)
                .cloned()
                .collect();
            std::fs::write(&file, serde_json::to_vec(&discovery_response(&cla, 1))?)?;
            c["eds_cluster_config"]["eds_config"] = file_source(&file);
        }
        clusters.push(c);
    }
    let mut listeners = Vec::new();
    for l in &r.listeners {
        let mut l = without_type(l);
        l["address"] = json!({"socket_address": {"address": listen.ip().to_string(), "port_value": listen.port()}});
        if let Some(o) = l.as_object_mut() {
            o.remove("bind_to_port");
        }
        if let Some(chains) = l["filter_chains"].as_array_mut() {
            for chain in chains {
                if let Some(filters) = chain["filters"].as_array_mut() {
                    for f in filters {
                        let rds_source = f.pointer_mut("/typed_config/rds/config_source");
                        if let Some(source) = rds_source {
                            *source = file_source(&rds);
                        }
                    }
                }
            }
        }
        listeners.push(l);
    }
    Ok(json!({
        "node": {"id": "sidecar~127.0.0.1~bench.ns~ns.svc.cluster.local", "cluster": "bench.ns"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {"listeners": listeners, "clusters": clusters}
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_xds::refusal::Kind;
    use remora_xds::validate::validate_one;

    #[test]
    fn remora_accepts_every_resource() {
        let r = resources("127.0.0.1:40123".parse().expect("an address"));
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
        assert!(refused.is_empty(), "{refused:#?}");
    }

    /// Envoy's bootstrap carries the same clusters and listener, only its sources and the
    /// listener's address changed, and every EDS file holds its own cluster's assignment.
    #[test]
    fn envoy_gets_the_same_resources() {
        let dir = std::env::temp_dir().join(format!("remora-traffic-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let upstream: SocketAddr = "127.0.0.1:40123".parse().expect("an address");
        let r = resources(upstream);
        let listen: SocketAddr = "127.0.0.1:40999".parse().expect("an address");
        let b = envoy_bootstrap(&r, &dir, listen, 40998).expect("written");
        let clusters = b["static_resources"]["clusters"]
            .as_array()
            .expect("clusters");
        assert_eq!(clusters.len(), r.clusters.len());
        let v2 = subset_cluster(40123, "v2");
        let c = clusters.iter().find(|c| c["name"] == v2).expect("v2");
        assert_eq!(c["outlier_detection"]["consecutive_5xx"], 5);
        let eds = c["eds_cluster_config"]["eds_config"]["path_config_source"]["path"]
            .as_str()
            .expect("a file");
        let held: Value = serde_json::from_slice(&std::fs::read(eds).expect("read")).expect("json");
        assert_eq!(held["resources"][0]["cluster_name"], v2.as_str());
        let l = &b["static_resources"]["listeners"][0];
        assert_eq!(l["address"]["socket_address"]["port_value"], 40999);
        assert!(l.get("bind_to_port").is_none());
        let hcm = &l["filter_chains"][0]["filters"][0]["typed_config"];
        assert!(hcm["rds"]["config_source"]["path_config_source"].is_object());
        let route = &r.routes[0]["virtual_hosts"][0]["routes"][0]["route"];
        assert_eq!(route["weighted_clusters"]["clusters"][0]["weight"], 90);
        assert_eq!(route["retry_policy"]["num_retries"], 2);
        std::fs::remove_dir_all(&dir).expect("cleaned up");
    }
}
