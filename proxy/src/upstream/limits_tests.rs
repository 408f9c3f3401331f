//! Circuit breakers and outlier detection through [`Upstreams::select_avoiding`], on clusters
//! as istiod writes them for Istio's circuit-breaking and outlier-detection tasks.

use super::*;
use remora_xds::store::Store;
use serde_json::{json, Value};

const C: &str = "outbound|8000||httpbin.default.svc.cluster.local";

fn dst() -> SocketAddr {
    "10.96.0.20:8000".parse().expect("addr")
}

/// A cluster `C` with `extra` fields and three healthy plaintext endpoints.
fn store(extra: Value) -> Store {
    let mut cluster = json!({"name": C, "type": "EDS", "connect_timeout": "1s",
        "eds_cluster_config": {"eds_config": {"ads": {}}, "service_name": C},
        "lb_policy": "ROUND_ROBIN"});
    for (k, v) in extra.as_object().expect("object") {
        cluster[k] = v.clone();
    }
    let ep = |ip: &str| json!({"endpoint": {"address": {"socket_address": {"address": ip, "port_value": 8000}}}});
    let endpoints = json!([{"cluster_name": C, "endpoints": [{"lb_endpoints": [
        ep("10.0.5.1"), ep("10.0.5.2"), ep("10.0.5.3")]}]}]);
    crate::xds_files::store_of(json!([cluster]), endpoints, json!([]), json!([]))
}

fn http(up: &Arc<Upstreams>, s: &Snapshot) -> Result<Selected, UpstreamError> {
    up.select_avoiding(s, C, dst(), Avoid::default())
}

fn stat(up: &Upstreams, name: &str) -> u64 {
    let (stats, gauges, outlier) = up
        .clusters
        .envoy_stats()
        .into_iter()
        .find(|(s, _, _)| &*s.name == C)
        .expect("the cluster's stats");
    stats
        .envoy_stats(&gauges, outlier)
        .into_iter()
        .find(|s| s.stat == name && s.code.is_none())
        .map_or(0, |s| s.value)
}

fn thresholds(cx: u32, pending: u32, rq: u32) -> Value {
    json!({"circuit_breakers": {"thresholds": [{"max_connections": cx,
        "max_pending_requests": pending, "max_requests": rq, "max_retries": 4294967295u32}]}})
}

#[test]
fn max_requests_overflows_at_once_and_frees_with_the_request() {
    let store = store(thresholds(u32::MAX, u32::MAX, 2));
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let a = http(&up, &s).expect("first");
    let _b = http(&up, &s).expect("second");
    let e = http(&up, &s).expect_err("third overflows");
    assert_eq!(e.response_flag(), "UO");
    assert_eq!(stat(&up, "upstream_rq_pending_overflow"), 1);
    assert_eq!(stat(&up, "upstream_rq_active"), 2);
    assert_eq!(stat(&up, "circuit_breakers.default.rq_open"), 1);
    drop(a);
    // Counted once the request went out (Envoy's upstream_rq_total), not when admitted.
    assert_eq!(stat(&up, "upstream_rq_total"), 0);
    let c = http(&up, &s).expect("room again");
    c.in_flight.report(Outcome::Status(200));
    c.in_flight.report(Outcome::ConnectFailed);
    assert_eq!(stat(&up, "upstream_rq_total"), 1);
}

/// Istio's task: `maxConnections: 1`, `http1MaxPendingRequests: 1`. One request holds the
/// connection, one waits for it, the next overflows.
#[tokio::test]
async fn a_request_waits_for_a_connection_as_a_pending_one_and_the_next_overflows() {
    let store = store(thresholds(1, 1, u32::MAX));
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let first = http(&up, &s).expect("the connection");
    let e = http(&up, &s).expect_err("no second connection");
    assert_eq!(e, UpstreamError::ConnectionsFull(C.into()));
    assert_eq!(stat(&up, "upstream_cx_overflow"), 1);
    assert!(up.connections_full(C));
    let waiting = {
        let (up, s) = (Arc::clone(&up), Arc::clone(&s));
        tokio::spawn(async move { up.wait_for_connection(&s, C).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        !waiting.is_finished(),
        "pending until the connection is free"
    );
    assert_eq!(stat(&up, "upstream_rq_pending_active"), 1);
    let e = up
        .wait_for_connection(&s, C)
        .await
        .expect_err("one pending at most");
    assert_eq!(e.response_flag(), "UO");
    assert_eq!(stat(&up, "upstream_rq_pending_overflow"), 1);
    drop(first);
    waiting.await.expect("task").expect("admitted");
    http(&up, &s).expect("the connection again");
}

#[test]
fn per_host_connections_and_tcp_overflow() {
    let mut extra = thresholds(u32::MAX, u32::MAX, u32::MAX);
    extra["circuit_breakers"]["per_host_thresholds"] = json!([{"max_connections": 1}]);
    let store = store(extra);
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    // Round robin over three hosts: three connections, then the first host again.
    let held: Vec<_> = (0..3)
        .map(|_| up.select(&s, C, dst()).expect("tcp"))
        .collect();
    let e = up.select(&s, C, dst()).expect_err("host full");
    assert_eq!(e.response_flag(), "UO");
    drop(held);
    up.select(&s, C, dst()).expect("tcp again");
}

/// Istio's outlier-detection task as istiod writes it: one 5xx ejects; with the panic
/// threshold at istiod's 0, ejected hosts never take traffic, and none left is `UH`.
#[test]
fn a_failing_host_is_ejected_on_the_failure_and_never_picked() {
    let store = store(json!({
        "outlier_detection": {"consecutive_5xx": 1, "enforcing_consecutive_5xx": 100,
            "interval": "1s", "base_ejection_time": "30s", "max_ejection_percent": 100,
            "enforcing_success_rate": 0},
        "common_lb_config": {"healthy_panic_threshold": {}}
    }));
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let bad = http(&up, &s).expect("pick");
    let bad_host = bad.address;
    bad.in_flight.report(Outcome::Status(503));
    drop(bad);
    assert_eq!(stat(&up, "outlier_detection.ejections_active"), 1);
    assert_eq!(stat(&up, "outlier_detection.ejections_enforced_total"), 1);
    assert_eq!(
        stat(&up, "outlier_detection.ejections_enforced_consecutive_5xx"),
        1
    );
    for _ in 0..30 {
        let sel = http(&up, &s).expect("another host");
        assert_ne!(sel.address, bad_host);
        sel.in_flight.report(Outcome::Status(200));
    }
    // The two others fail too: nothing healthy is left, and panic is off.
    for _ in 0..2 {
        let sel = http(&up, &s).expect("a healthy host");
        sel.in_flight.report(Outcome::LocalFailure);
    }
    let e = http(&up, &s).expect_err("all ejected");
    assert_eq!(e.response_flag(), "UH");
    assert_eq!(stat(&up, "outlier_detection.ejections_active"), 3);
}

/// An ejected host is picked again once its ejection is over (the list of hosts out that a
/// pick reads is made again at the earliest end), and a second host ejected meanwhile stays
/// out until its own end.
#[test]
fn an_ejected_host_comes_back_when_its_time_is_over() {
    let store = store(json!({
        "outlier_detection": {"consecutive_5xx": 1, "enforcing_consecutive_5xx": 100,
            "interval": "0.25s", "base_ejection_time": "1s", "max_ejection_percent": 100,
            "enforcing_success_rate": 0},
        "common_lb_config": {"healthy_panic_threshold": {}}
    }));
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let first = http(&up, &s).expect("pick");
    let first_host = first.address;
    first.in_flight.report(Outcome::Status(503));
    drop(first);
    let picked = |up: &Arc<Upstreams>, n| {
        (0..n)
            .map(|_| {
                let sel = http(up, &s).expect("a host");
                sel.in_flight.report(Outcome::Status(200));
                sel.address
            })
            .collect::<Vec<_>>()
    };
    assert!(!picked(&up, 20).contains(&first_host));
    // Half-way through the first ejection, a second host goes out too.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let second = http(&up, &s).expect("pick");
    let second_host = second.address;
    assert_ne!(second_host, first_host);
    second.in_flight.report(Outcome::Status(503));
    drop(second);
    let hosts = picked(&up, 20);
    assert!(!hosts.contains(&second_host));
    // Past the first's end (1 s on, to the next 0.25 s tick: 1.25 s).
    std::thread::sleep(std::time::Duration::from_millis(1050));
    let hosts = picked(&up, 30);
    assert!(hosts.contains(&first_host), "{hosts:?}");
    // Past the second's end as well (1.3 s, to the 1.5 s tick).
    std::thread::sleep(std::time::Duration::from_millis(400));
    let hosts = picked(&up, 30);
    assert!(hosts.contains(&second_host), "{hosts:?}");
    assert_eq!(stat(&up, "outlier_detection.ejections_active"), 0);
}

#[test]
fn max_ejection_percent_keeps_hosts_in() {
    let store = store(json!({
        "outlier_detection": {"consecutive_5xx": 1, "enforcing_success_rate": 0}
    }));
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    // Envoy's default 10 % of three hosts allows none.
    let sel = http(&up, &s).expect("pick");
    sel.in_flight.report(Outcome::Status(500));
    assert_eq!(stat(&up, "outlier_detection.ejections_active"), 0);
    assert_eq!(stat(&up, "outlier_detection.ejections_overflow"), 1);
    assert_eq!(
        stat(&up, "outlier_detection.ejections_detected_consecutive_5xx"),
        1
    );
}

#[global_allocator]
static ALLOCATOR: remora_malloc::counting::Counting = remora_malloc::counting::Counting;

/// The pick of the routed fast path, with circuit breakers, outlier detection and a host
/// ejected, allocates nothing once the cluster's state exists.
#[test]
fn a_selection_allocates_nothing() {
    // The counter counts.
    let one = remora_malloc::counting::allocations_in(|| {
        std::hint::black_box(Vec::<u8>::with_capacity(16));
    });
    assert_eq!(one, 1);
    for policy in ["ROUND_ROBIN", "LEAST_REQUEST", "RANDOM"] {
        let mut extra = thresholds(100, 100, 100);
        extra["lb_policy"] = json!(policy);
        extra["outlier_detection"] = json!({"consecutive_5xx": 1, "max_ejection_percent": 50,
            "enforcing_success_rate": 0});
        let store = store(extra);
        let s = store.snapshot();
        let up = Arc::new(Upstreams::default());
        // The state and every host's are made on first use; one host is ejected.
        for _ in 0..30 {
            drop(http(&up, &s).expect("pick"));
        }
        http(&up, &s)
            .expect("pick")
            .in_flight
            .report(Outcome::Status(503));
        let allocations = remora_malloc::counting::allocations_in(|| {
            for _ in 0..1000 {
                let sel = http(&up, &s).expect("pick");
                sel.in_flight.report(Outcome::Status(200));
            }
        });
        assert_eq!(allocations, 0, "{policy}");
        assert_eq!(stat(&up, "outlier_detection.ejections_active"), 1);
    }
}

/// The cluster's statistics as `/stats` and `/stats/prometheus` print them: Envoy's dotted
/// names, and `envoy_cluster_<name>_*` with Istio's `response_code` and
/// `response_code_class` tags.
#[test]
fn cluster_stats_are_exported_as_envoys() {
    let store = store(thresholds(u32::MAX, u32::MAX, 1));
    let s = store.snapshot();
    let up = Arc::new(Upstreams::default());
    let m = crate::metrics::Metrics::default();
    m.set_clusters(Arc::clone(&up));
    let held = http(&up, &s).expect("pick");
    held.in_flight.report(Outcome::Status(503));
    held.in_flight.answered(503, false);
    http(&up, &s).expect_err("overflow");
    drop(held);
    let retried = http(&up, &s).expect("pick");
    retried.in_flight.report(Outcome::Status(502));
    retried.in_flight.answered(502, true);
    drop(retried);
    let last = http(&up, &s).expect("pick");
    last.in_flight.report(Outcome::Status(200));
    last.in_flight.answered(200, false);
    let dotted: Vec<(String, u64)> = m
        .envoy_stats()
        .into_iter()
        .map(|s| (s.dotted_name(), s.value))
        .collect();
    for (name, value) in [
        ("upstream_rq_total", 3),
        ("upstream_rq_completed", 2),
        ("upstream_rq_200", 1),
        ("upstream_rq_503", 1),
        ("upstream_rq_5xx", 1),
        ("upstream_rq_pending_overflow", 1),
        // The retried answer, in Envoy's `retry.*` copy only.
        ("retry.upstream_rq_completed", 1),
        ("retry.upstream_rq_502", 1),
        ("retry.upstream_rq_5xx", 1),
    ] {
        let name = format!("cluster.{C}.{name}");
        assert!(
            dotted.contains(&(name.clone(), value)),
            "{name}: {dotted:?}"
        );
    }
    let text = m.encode();
    // istiod writes no `alt_stat_name` (the mesh sets no `outboundClusterStatName`): the name
    // has no `;` for Istio's `cluster_name` tag to end at, and stays in the Prometheus name.
    let stem = "envoy_cluster_outbound_8000__httpbin_default_svc_cluster_local";
    for line in [
        format!("{stem}_upstream_rq_total 3\n"),
        format!("{stem}_retry_upstream_rq{{response_code=\"502\"}} 1\n"),
        format!("{stem}_upstream_rq{{response_code=\"503\"}} 1\n"),
        format!("{stem}_upstream_rq{{response_code_class=\"2xx\"}} 1\n"),
        format!("{stem}_upstream_rq_pending_overflow 1\n"),
    ] {
        assert!(text.contains(&line), "{line}: {text}");
    }
    // No outlier detection on this cluster: none of its statistics, as Envoy makes them only
    // for a cluster with a detector.
    assert!(
        !dotted
            .iter()
            .any(|(n, _)| n.contains(".outlier_detection.")),
        "{dotted:?}"
    );
    assert!(!text.contains("outlier_detection"), "{text}");
    // One family per name: the tagged codes and `upstream_rq_total` do not collide.
    assert_eq!(
        text.matches(&format!("# TYPE {stem}_upstream_rq counter\n"))
            .count(),
        1,
        "{text}"
    );
    // The ext_authz filter's counts on a request's route cluster: made at their first count,
    // as Envoy makes them, under the filter's stat prefix when it has one.
    assert!(
        !dotted.iter().any(|(n, _)| n.contains(".ext_authz")),
        "{dotted:?}"
    );
    let stats = &up.clusters.find(C).expect("in use").stats;
    crate::upstream::stats::inc(&stats.ext_authz("").ok);
    crate::upstream::stats::inc(&stats.ext_authz("waf").denied);
    let dotted: Vec<(String, u64)> = m
        .envoy_stats()
        .into_iter()
        .map(|s| (s.dotted_name(), s.value))
        .filter(|(n, _)| n.contains(".ext_authz"))
        .collect();
    let named = |n: &str| (format!("cluster.{C}.{n}"), 1);
    assert_eq!(
        dotted,
        [named("ext_authz.ok"), named("ext_authz.waf.denied")]
    );
    let text = m.encode();
    for line in [
        format!("{stem}_ext_authz_ok 1\n"),
        format!("{stem}_ext_authz_waf_denied 1\n"),
    ] {
        assert!(text.contains(&line), "{line}: {text}");
    }
}
