//! Micro-benchmarks of traffic management's per-request work, on resources shaped as istiod
//! writes them (`remora_benches::route_scale`), read through the real path: Envoy's JSON into
//! the xDS files source (protos, then `remora_xds`'s conversion into its model and a store's
//! snapshot), then the proxy's own functions.
//!
//! - `route_decision`: the route table of 1,000 virtual hosts and 10,000 routes, a request's
//!   route decision as `http/routed.rs` takes it (the table from the current snapshot, then
//!   `route::http_route`: virtual host by Host, first matching route, weighted pick), for a
//!   request hitting an early, a middle and a late route, and one matching no route.
//! - `cluster_pick`: one request's endpoint choice and bookkeeping in a cluster of 100
//!   endpoints with outlier detection and circuit breakers (`Upstreams::select_in`: the
//!   breakers' slots, the balancer over hosts outlier detection has not ejected; then the
//!   answer reported, which outlier detection counts; then the slots released), all answers
//!   200, or one in ten a 503 (outlier detection then ejects hosts, at most 10% of them).
//!
//! Quote ratios, not absolute numbers: the machines these run on are shared and noisy.

// Benchmark set-up fails loudly; there is no user input here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use criterion::{criterion_group, criterion_main, Criterion};
use remora::route::{self, HttpDecision};
use remora::upstream::{Avoid, Outcome, Upstreams};
use remora::xds_files::Source;
use remora_benches::route_scale::{self, CASES, CLUSTER, TABLE};
use remora_xds::model::route::RequestParts;
use remora_xds::store::Store;
use serde_json::Value;
use std::hint::black_box;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// A store holding these resources, read as `xds.resources_dir` is read.
fn store_of(name: &str, clusters: Vec<Value>, endpoints: Vec<Value>, routes: Vec<Value>) -> Store {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("remora-bench-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (file, list) in [
        ("clusters", clusters),
        ("endpoints", endpoints),
        ("listeners", Vec::new()),
        ("routes", routes),
    ] {
        std::fs::write(
            dir.join(format!("{file}.json")),
            Value::Array(list).to_string(),
        )
        .unwrap();
    }
    let store = Store::new();
    let synced = Source::new(dir.clone()).sync(&store, "1");
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(synced.errors.is_empty(), "{:?}", synced.errors);
    assert!(synced.refused.is_empty(), "{:?}", synced.refused);
    store
}

fn route_decision(c: &mut Criterion) {
    let store = store_of(
        "routes",
        Vec::new(),
        Vec::new(),
        vec![route_scale::route_table()],
    );
    let mut group = c.benchmark_group("route_decision_1000_vhosts_10000_routes");
    for case in CASES {
        let mut headers = http::HeaderMap::new();
        for (name, value) in case.headers {
            headers.insert(*name, http::HeaderValue::from_static(value));
        }
        let header = |name: &str| match name {
            ":authority" => Some(case.host),
            ":method" => Some("GET"),
            ":path" => Some(case.path),
            _ => headers.get(name).and_then(|v| v.to_str().ok()),
        };
        let values = |name: &str, visit: &mut dyn FnMut(&str) -> bool| match name {
            ":authority" | ":method" | ":path" => header(name).is_some_and(&mut *visit),
            _ => headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(visit),
        };
        let req = RequestParts {
            method: "GET",
            path_and_query: case.path,
            header: &header,
            values: &values,
        };
        // The case routes where it says, or the benchmark would time something else.
        let snapshot = store.current();
        let table = snapshot.route_configuration(TABLE).unwrap();
        let got = match route::http_route(table, case.host, &req, 0) {
            HttpDecision::Forward { cluster, .. } => Some(cluster),
            HttpDecision::NoRoute => None,
            other => panic!("{}: {other:?}", case.name),
        };
        assert_eq!(got, case.cluster, "{}", case.name);
        drop(snapshot);
        let mut pick = 0u64;
        group.bench_function(case.name, |b| {
            b.iter(|| {
                pick = pick.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let snapshot = store.current();
                let Some(table) = snapshot.route_configuration(TABLE) else {
                    return false;
                };
                let decision = route::http_route(table, black_box(case.host), &req, pick);
                matches!(black_box(decision), HttpDecision::Forward { .. })
            })
        });
    }
    group.finish();
}

fn cluster_pick(c: &mut Criterion) {
    let dst: SocketAddr = "10.96.0.1:8080".parse().unwrap();
    let mut group = c.benchmark_group("cluster_pick_100_endpoints_outlier_breakers");
    for policy in ["LEAST_REQUEST", "ROUND_ROBIN"] {
        let (cluster, cla) = route_scale::big_cluster(policy);
        let store = store_of("cluster", vec![cluster], vec![cla], Vec::new());
        let snapshot = store.snapshot();
        let cluster = Arc::clone(snapshot.cluster(CLUSTER).unwrap());
        // Five 503s in a row from one host eject it (at most the 10% the cluster allows), so
        // this case times a cluster where outlier detection is at work: hosts are ejected and
        // return while it runs.
        for (label, fail_every) in [("all_200", 0u64), ("one_in_ten_503", 10)] {
            let up = Arc::new(Upstreams::default());
            let state = up.state_of(&snapshot, &cluster);
            let mut n = 0u64;
            group.bench_function(format!("{policy}/{label}"), |b| {
                b.iter(|| {
                    n += 1;
                    let selected = up
                        .select_in(
                            snapshot.eds_of(&cluster),
                            &state,
                            &cluster,
                            dst,
                            Avoid::default(),
                        )
                        .unwrap();
                    let status = if fail_every > 0 && n.is_multiple_of(fail_every) {
                        503
                    } else {
                        200
                    };
                    selected.in_flight.report(Outcome::Status(status));
                    black_box(selected.address)
                })
            });
            // The bookkeeping was real: none left in flight, and no more ejected than
            // `max_ejection_percent` allows (none without a 503).
            let ejected = state.count_ejected(state.now_ms());
            assert!(
                ejected <= route_scale::ENDPOINTS / 10,
                "{policy}/{label}: {ejected}"
            );
            assert!(
                fail_every > 0 || ejected == 0,
                "{policy}/{label}: {ejected}"
            );
            eprintln!("{policy}/{label}: {ejected} hosts ejected at the end");
            assert_eq!(
                up.active("10.128.0.1:8080".parse().unwrap()),
                0,
                "{policy}/{label}"
            );
        }
    }
    group.finish();
}

criterion_group!(benches, route_decision, cluster_pick);
criterion_main!(benches);
