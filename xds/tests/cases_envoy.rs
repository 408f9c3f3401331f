//! Real Envoy 1.40 is the oracle for `xds/tests/cases/`: each case is put into a bootstrap as
//! static resources and checked with `envoy --mode validate`. Every case but `envoy-rejects`
//! must be accepted whole; each resource of `envoy-rejects` must be rejected on its own, for
//! the reason written next to it. The bootstrap holds the case's JSON as Remora's tests read
//! it: listeners as they are (their RDS names come over ADS, which the bootstrap configures),
//! clusters as they are (EDS ones keep ADS, and their TLS contexts keep `sds-grpc`, which the
//! bootstrap holds), each route table inline in a listener that is not bound, each
//! ClusterLoadAssignment as the `load_assignment` of a STATIC stand-in cluster named
//! `eds-check|<cluster_name>`.
//!
//! Envoy is `$ENVOY_BIN`, or the binary `scripts/install-envoy` caches (running it if needed).
//! Without one the test is skipped with its reason printed; under `CI=true` it fails.

mod cases_support;
mod envoy_support;

use cases_support::*;
use envoy_support::envoy_binary;
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};

/// A STATIC cluster on loopback speaking HTTP/2: what the bootstrap's ADS and SDS name.
fn grpc_cluster(name: &str, port: u16) -> Value {
    json!({
        "name": name, "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}
    })
}

/// A listener that is never bound, carrying a route table inline.
fn route_listener(i: usize, route_config: &Value) -> Value {
    json!({
        "name": format!("route-check-{i}"),
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000 + i}},
        "bind_to_port": false,
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "route_check",
                "route_config": route_config,
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
            }
        }]}]
    })
}

/// Istio's shape of bootstrap (ADS over `xds-grpc`, SDS over `sds-grpc`) holding the case's
/// `listeners` (their RDS names come over ADS), `clusters`, `routes` (inline, one listener
/// each) and `endpoints` (as stand-in clusters).
fn bootstrap(
    listeners: &[Value],
    clusters: &[Value],
    routes: &[Value],
    endpoints: &[Value],
) -> Value {
    let mut all = vec![
        grpc_cluster("xds-grpc", 15010),
        grpc_cluster("sds-grpc", 15012),
    ];
    all.extend(clusters.iter().cloned());
    all.extend(endpoints.iter().map(|cla| {
        json!({
            "name": format!("eds-check|{}", cla["cluster_name"].as_str().unwrap_or_default()),
            "type": "STATIC", "connect_timeout": "1s", "load_assignment": cla
        })
    }));
    let listeners: Vec<Value> = listeners
        .iter()
        .cloned()
        .chain(
            routes
                .iter()
                .enumerate()
                .map(|(i, rc)| route_listener(i, rc)),
        )
        .collect();
    json!({
        "node": {"id": "sidecar~10.244.0.5~sleep.default~default.svc.cluster.local", "cluster": "sleep.default"},
        "dynamic_resources": {"ads_config": {"api_type": "GRPC", "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}]}},
        "static_resources": {"clusters": all, "listeners": listeners}
    })
}

/// `envoy --mode validate` over a bootstrap: whether it passed, and Envoy's output.
fn validate(envoy: &Path, tag: &str, bootstrap: &Value) -> (bool, String) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join(format!("{tag}.json"));
    std::fs::write(&path, bootstrap.to_string()).expect("bootstrap written");
    let out = Command::new(envoy)
        .args(["--mode", "validate", "--log-level", "error", "-c"])
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", envoy.display()));
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), log)
}

#[test]
fn envoy_accepts_every_case_but_the_rejected_one() {
    let Some(envoy) = envoy_binary() else { return };
    for case in CASES.iter().filter(|c| **c != "envoy-rejects") {
        let (listeners, clusters, routes, endpoints) = (
            resources(case, "listeners"),
            resources(case, "clusters"),
            resources(case, "routes"),
            resources(case, "endpoints"),
        );
        assert!(
            !clusters.is_empty() || !routes.is_empty(),
            "{case}: nothing to check"
        );
        let (ok, log) = validate(
            &envoy,
            case,
            &bootstrap(&listeners, &clusters, &routes, &endpoints),
        );
        assert!(ok, "Envoy rejects case {case}:\n{log}");
        assert!(log.contains("OK"), "{case}: {log}");
        println!(
            "{case}: Envoy accepts {} listeners, {} clusters, {} route tables, {} load assignments",
            listeners.len(),
            clusters.len(),
            routes.len(),
            endpoints.len()
        );
    }
}

/// Each resource of `envoy-rejects`, and what Envoy 1.40 says of it.
const ENVOY_REJECTS: [(&str, &str); 4] = [
    ("bad-path-regex", "missing ): /api/(v[0-9]+"),
    ("bad-header-regex", "missing ): a(b"),
    (
        "zero-weights",
        "Sum of weights in the weighted_cluster must be greater than 0",
    ),
    (
        "direct-response-status-99",
        "value must be inside range [200, 600)",
    ),
];

#[test]
fn envoy_rejects_each_invalid_resource_for_its_reason() {
    let Some(envoy) = envoy_binary() else { return };
    let routes = resources("envoy-rejects", "routes");
    assert_eq!(routes.len(), ENVOY_REJECTS.len());
    // The bootstrap alone passes: each rejection below is the resource's fault.
    let (ok, log) = validate(&envoy, "bare", &bootstrap(&[], &[], &[], &[]));
    assert!(ok, "the bare bootstrap is rejected:\n{log}");
    for (rc, (name, reason)) in routes.iter().zip(ENVOY_REJECTS) {
        assert_eq!(rc["name"], name);
        let (ok, log) = validate(
            &envoy,
            name,
            &bootstrap(&[], &[], std::slice::from_ref(rc), &[]),
        );
        assert!(!ok, "Envoy accepts {name}:\n{log}");
        assert!(log.contains(reason), "{name}: want {reason:?} in:\n{log}");
    }
}
