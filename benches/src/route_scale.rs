//! istiod-shaped resources for the traffic-management micro-benchmarks (`benches/traffic.rs`):
//! one route table of 1,000 virtual hosts and 10,000 routes, and one cluster of 100 endpoints
//! with outlier detection and circuit breakers, as a sidecar in a large mesh is sent them.
//!
//! The table follows istiod's outbound RDS (pilot/pkg/networking/core/route): per HTTP service
//! `svc-<i>.ns.svc.cluster.local` a virtual host whose domains are the short, namespaced and full
//! names and the VIP, each also with `:8080`; per ServiceEntry host a wildcard domain
//! `*.ext-<i>.example.com`; then `allow_any`. Each virtual host has ten routes, as a
//! VirtualService compiles: a prefix with an `end-user` header to a 90/10 split of the `v1` and
//! `v2` subsets, an exact path, a regex path, a prefix with a present header, a case-insensitive
//! prefix, a header prefix match, a `path_separated_prefix`, a query parameter, a regex to a
//! 50/50 split, and last a catch-all to a 90/10 split (the service's) or, for a ServiceEntry
//! host, one more prefix (so that a request matching none of them is Envoy's 404 `NR`).
//! Every forwarding route carries Istio's default retry policy.
//!
//! [`Case`] names the requests the benchmark routes: one hitting the first route of the first
//! virtual host, one the middle route of a middle one, one the last route of the last service,
//! and one that misses every route of the last wildcard host.

use serde_json::{json, Value};

/// The route table's name (istiod names outbound tables by port).
pub const TABLE: &str = "8080";
/// Virtual hosts for services.
pub const SERVICES: usize = 900;
/// Virtual hosts for ServiceEntry wildcard hosts (after the services').
pub const WILDCARDS: usize = 100;
/// Routes in each virtual host (but `allow_any`'s one).
pub const ROUTES_PER_HOST: usize = 10;
/// Endpoints of the benchmarked cluster.
pub const ENDPOINTS: usize = 100;
/// The benchmarked cluster.
pub const CLUSTER: &str = "outbound|8080||big.ns.svc.cluster.local";

const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const CLA_TYPE: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// Istio's default retry policy, as istiod writes it on every route (route/retry/retry.go).
pub fn istio_retry_policy() -> Value {
    json!({
        "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
        "num_retries": 2,
        "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
        "host_selection_retry_max_attempts": "5",
        "retriable_status_codes": [503]
    })
}

fn host(i: usize) -> String {
    format!("svc-{i}.ns.svc.cluster.local")
}

fn subset(i: usize, subset: &str) -> String {
    format!("outbound|8080|{subset}|{}", host(i))
}

fn split(i: usize, v1: u32, v2: u32) -> Value {
    json!({"weighted_clusters": {"clusters": [
        {"name": subset(i, "v1"), "weight": v1},
        {"name": subset(i, "v2"), "weight": v2}
    ]}, "timeout": "0s", "retry_policy": istio_retry_policy(),
       "max_stream_duration": {"max_stream_duration": "0s", "grpc_timeout_header_max": "0s"}})
}

fn to(cluster: String) -> Value {
    json!({"cluster": cluster, "timeout": "0s", "retry_policy": istio_retry_policy(),
           "max_stream_duration": {"max_stream_duration": "0s", "grpc_timeout_header_max": "0s"}})
}

fn exact_header(name: &str, value: &str) -> Value {
    json!({"name": name, "string_match": {"exact": value}})
}

/// The ten routes of virtual host `i`; `wildcard` hosts end without a catch-all.
fn routes(i: usize, wildcard: bool) -> Vec<Value> {
    let service = format!("outbound|8080||{}", host(i));
    let last = if wildcard {
        json!({"name": "r9", "match": {"prefix": "/ext/"}, "route": to(service.clone())})
    } else {
        json!({"name": "r9", "match": {"prefix": "/"}, "route": split(i, 90, 10)})
    };
    vec![
        json!({"name": "r0", "match": {"prefix": "/api/v1/", "headers": [exact_header("end-user", "jason")]},
               "route": split(i, 90, 10)}),
        json!({"name": "r1", "match": {"path": "/login"}, "route": to(service.clone())}),
        json!({"name": "r2", "match": {"safe_regex": {"regex": "/products/[0-9]+"}},
               "route": to(subset(i, "v1"))}),
        json!({"name": "r3", "match": {"prefix": "/reviews", "headers": [{"name": "x-canary", "present_match": true}]},
               "route": to(subset(i, "v2"))}),
        json!({"name": "r4", "match": {"prefix": "/static/", "case_sensitive": false},
               "route": to(service.clone())}),
        json!({"name": "r5", "match": {"prefix": "/", "headers": [{"name": "x-version", "string_match": {"prefix": "v2"}}]},
               "route": to(subset(i, "v2"))}),
        json!({"name": "r6", "match": {"path_separated_prefix": "/ratings"},
               "route": to(subset(i, "v1"))}),
        json!({"name": "r7", "match": {"prefix": "/", "query_parameters": [{"name": "debug", "string_match": {"exact": "1"}}]},
               "route": to(subset(i, "v2"))}),
        json!({"name": "r8", "match": {"safe_regex": {"regex": "/api/v[23]/.*"}},
               "route": split(i, 50, 50)}),
        last,
    ]
}

/// The route table: [`SERVICES`] service hosts, [`WILDCARDS`] wildcard hosts, `allow_any`.
pub fn route_table() -> Value {
    let mut hosts: Vec<Value> = (0..SERVICES)
        .map(|i| {
            let short = format!("svc-{i}");
            let vip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
            let names = [
                host(i),
                short.clone(),
                format!("{short}.ns.svc"),
                format!("{short}.ns"),
                vip,
            ];
            let domains: Vec<String> = names
                .iter()
                .flat_map(|n| [n.clone(), format!("{n}:8080")])
                .collect();
            json!({"name": format!("{}:8080", host(i)), "domains": domains,
                   "routes": routes(i, false), "include_request_attempt_count": true})
        })
        .collect();
    hosts.extend((SERVICES..SERVICES + WILDCARDS).map(|i| {
        json!({"name": format!("*.ext-{i}.example.com:8080"),
               "domains": [format!("*.ext-{i}.example.com"), format!("*.ext-{i}.example.com:8080")],
               "routes": routes(i, true), "include_request_attempt_count": true})
    }));
    hosts.push(json!({"name": "allow_any", "domains": ["*"],
        "routes": [{"name": "allow_any", "match": {"prefix": "/"},
                    "route": {"cluster": "PassthroughCluster", "timeout": "0s"}}],
        "include_request_attempt_count": true}));
    json!({"@type": ROUTE_TYPE, "name": TABLE, "virtual_hosts": hosts,
           "validate_clusters": false, "ignore_port_in_host_matching": true})
}

/// A request the benchmark routes, and where it must go.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub name: &'static str,
    pub host: &'static str,
    pub path: &'static str,
    pub headers: &'static [(&'static str, &'static str)],
    /// The cluster it is forwarded to (for a split, the first), or `None`: 404 `NR`.
    pub cluster: Option<&'static str>,
}

/// The benchmark's requests: early, middle and late routes, and a miss.
pub const CASES: [Case; 4] = [
    Case {
        name: "early",
        host: "svc-0.ns.svc.cluster.local:8080",
        path: "/api/v1/items",
        headers: &[("end-user", "jason")],
        cluster: Some("outbound|8080|v1|svc-0.ns.svc.cluster.local"),
    },
    Case {
        name: "middle",
        host: "svc-450.ns",
        path: "/cart",
        headers: &[("x-version", "v2-beta")],
        cluster: Some("outbound|8080|v2|svc-450.ns.svc.cluster.local"),
    },
    Case {
        name: "late",
        host: "10.96.3.150:8080",
        path: "/other",
        headers: &[("user-agent", "bench")],
        cluster: Some("outbound|8080|v1|svc-899.ns.svc.cluster.local"),
    },
    Case {
        name: "miss",
        host: "api.ext-999.example.com",
        path: "/nothing/here",
        headers: &[("user-agent", "bench")],
        cluster: None,
    },
];

/// One cluster of [`ENDPOINTS`] endpoints as istiod writes a DestinationRule with
/// `outlierDetection` (consecutive 5xx and gateway errors, 10 s interval, 30 s base ejection,
/// at most 10% ejected) and a `connectionPool` (finite circuit breakers), balanced by
/// `lb_policy` (istiod's default: LEAST_REQUEST). Returns the cluster and its assignment.
pub fn big_cluster(lb_policy: &str) -> (Value, Value) {
    let cluster = json!({
        "@type": CLUSTER_TYPE, "name": CLUSTER, "type": "EDS",
        "eds_cluster_config": {"eds_config": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
                               "service_name": CLUSTER},
        "connect_timeout": "10s",
        "lb_policy": lb_policy,
        "circuit_breakers": {"thresholds": [{"max_connections": 1024, "max_pending_requests": 1024,
            "max_requests": 1024, "max_retries": 3, "track_remaining": true}]},
        "outlier_detection": {"consecutive_5xx": 5, "interval": "10s", "base_ejection_time": "30s",
            "max_ejection_percent": 10, "enforcing_consecutive_5xx": 100,
            "consecutive_gateway_failure": 5, "enforcing_consecutive_gateway_failure": 100,
            "enforcing_success_rate": 0},
        "common_lb_config": {"healthy_panic_threshold": {}},
        "metadata": {"filter_metadata": {"istio": {"default_original_port": 8080,
            "services": [{"host": "big.ns.svc.cluster.local", "name": "big", "namespace": "ns"}]}}}
    });
    let lb: Vec<Value> = (0..ENDPOINTS)
        .map(|k| {
            json!({"endpoint": {"address": {"socket_address": {
                        "address": format!("10.128.{}.{}", k / 250, k % 250 + 1), "port_value": 8080}}},
                   "health_status": "HEALTHY", "load_balancing_weight": 1})
        })
        .collect();
    let cla = json!({"@type": CLA_TYPE, "cluster_name": CLUSTER,
        "endpoints": [{"locality": {}, "lb_endpoints": lb}]});
    (cluster, cla)
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_xds::refusal::Kind;
    use remora_xds::validate::validate_one;

    #[test]
    fn sizes_are_the_issues() {
        let t = route_table();
        let hosts = t["virtual_hosts"].as_array().expect("hosts");
        assert_eq!(hosts.len(), SERVICES + WILDCARDS + 1);
        let routes: usize = hosts
            .iter()
            .map(|h| h["routes"].as_array().map_or(0, Vec::len))
            .sum();
        assert_eq!(routes, (SERVICES + WILDCARDS) * ROUTES_PER_HOST + 1);
        assert_eq!(SERVICES + WILDCARDS, 1_000);
    }

    /// A refusal would make the benchmark time an error path.
    #[test]
    fn remora_accepts_them() {
        let (cluster, cla) = big_cluster("LEAST_REQUEST");
        for (kind, v) in [
            (Kind::Route, route_table()),
            (Kind::Cluster, cluster),
            (Kind::Endpoint, cla),
        ] {
            let verdict = validate_one(kind, &v);
            assert!(verdict.refusal.is_none(), "{verdict}");
        }
    }
}
