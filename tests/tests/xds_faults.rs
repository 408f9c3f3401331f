//! A VirtualService fault through Remora behind `remora capture`, its route table updated
//! from `xds.resources_dir`: an abort answered without reaching the backend, a table whose
//! fault percentage is over 100 % refused with the field named while the previous table stays
//! in force, and a table without the fault serving the backend again. And the fault filter's
//! statistics, against Envoy 1.40 with the same resources and requests.

use remora_e2e::backend::{self, SEEN_HEADER};
use remora_e2e::envoy_xds::{nets_or_skip, Resources};
use remora_e2e::http_client;
use remora_e2e::xds_resources::eds_cluster;
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

const BACKEND_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const HOST: &str = "web.test.svc.cluster.local";
const A: &str = "outbound|80|a|web.test.svc.cluster.local";
/// How long a table update may take to apply (the directory is polled every second).
const FOLLOW_TIME: Duration = Duration::from_secs(10);

/// istiod's resources with the route's fault (`None`: no fault).
fn resources(fault: Option<Value>) -> Resources {
    let mut route = json!({"match": {"prefix": "/"}, "route": {"cluster": A, "timeout": "0s"}});
    if let Some(f) = fault {
        route["typed_per_filter_config"] = json!({"envoy.filters.http.fault": f});
    }
    Resources {
        listeners: json!([{
            "name": "0.0.0.0_80", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
            "traffic_direction": "OUTBOUND", "bind_to_port": false,
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "outbound_0.0.0.0_80",
                "rds": {"config_source": {"ads": {}}, "route_config_name": "80"},
                "http_filters": [
                    {"name": "envoy.filters.http.fault", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"}},
                    {"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}]),
        clusters: json!([eds_cluster(A)]),
        routes: json!([{"name": "80", "virtual_hosts": [{"name": "web", "domains": [HOST], "routes": [route]}]}]),
        endpoints: json!([{"cluster_name": A, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": BACKEND_IP.to_string(), "port_value": 8001}}}}]}]}]),
    }
}

fn abort(numerator: u32) -> Value {
    json!({"@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
        "abort": {"http_status": 503, "percentage": {"numerator": numerator, "denominator": "MILLION"}}})
}

/// Status, body and the backend's count of `path`, for a GET through the VIP.
fn get(net: &PodNet, path: &str) -> (u16, String, Option<String>) {
    let vip = SocketAddr::from((VIP, 80));
    match http_client::get_once(&net.pod, vip, HOST, path, &[]) {
        Ok(r) => (
            r.status,
            r.text(),
            r.header(SEEN_HEADER).map(str::to_string),
        ),
        Err(e) => (0, e.to_string(), None),
    }
}

fn write(dir: &Path, fault: Option<Value>) {
    resources(fault).write_for_remora(dir);
}

#[test]
fn a_fault_is_injected_and_a_bad_one_refused_by_field_keeping_the_previous() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    remora_e2e::sidecars::prepare(&net);
    let _a = backend::start(&net.peer, SocketAddr::from((BACKEND_IP, 8001)), "a");
    let dir = net.binary().make_dir("xds");
    write(&dir, Some(abort(1_000_000)));
    let remora = net
        .remora()
        .config(&format!("xds:\n  resources_dir: {}\n", dir.display()))
        .start_ready();
    // Every request aborted here: the backend never sees it.
    for i in 0..5 {
        let (status, body, _) = get(&net, &format!("/flaky/ok/{i}"));
        assert_eq!(
            (status, body.as_str()),
            (503, "fault filter abort"),
            "{}",
            remora.stderr()
        );
        let (_, _, seen) = get(&net, &format!("/seen/flaky/ok/{i}"));
        assert_eq!(
            seen, None,
            "the abort's answer is Remora's, not the backend's"
        );
    }
    // Over 100 %: refused by field; the previous table (abort at 100 %) stays.
    write(&dir, Some(abort(1_000_001)));
    let deadline = Instant::now() + FOLLOW_TIME;
    while !remora.stderr().contains("refused an xDS resource") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = remora.stderr();
    assert!(
        log.contains(
            "typed_per_filter_config[envoy.filters.http.fault].abort.percentage.numerator"
        ) && log.contains("1000001 over 1000000 is not a percentage in [0, 100]"),
        "{log}"
    );
    let (status, body, _) = get(&net, "/flaky/ok/after-refusal");
    assert_eq!((status, body.as_str()), (503, "fault filter abort"));
    // No fault: the backend answers again, having seen the request once.
    write(&dir, None);
    let deadline = Instant::now() + FOLLOW_TIME;
    let mut last = get(&net, "/flaky/ok/healed-0");
    let mut n = 0;
    while last.0 != 200 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        n += 1;
        last = get(&net, &format!("/flaky/ok/healed-{n}"));
    }
    assert_eq!(
        (last.0, last.2.as_deref()),
        (200, Some("1")),
        "{last:?}\n{}",
        remora.stderr()
    );
}

/// One proxy's `http.outbound_0.0.0.0_80.fault.*` statistics from its admin `/stats`
/// (`aborts_injected`, `delays_injected`; 0 when absent).
fn fault_stats(net: &PodNet, admin_port: u16) -> (u64, u64) {
    let url = format!("http://127.0.0.1:{admin_port}/stats");
    let (status, body) = remora_e2e::peer::curl_status(&net.pod, &[&url], Duration::from_secs(5));
    assert_eq!(status, 200, "{body}");
    let stat = |name: &str| {
        let full = format!("http.outbound_0.0.0.0_80.fault.{name}: ");
        body.lines()
            .find_map(|l| l.strip_prefix(&full))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (stat("aborts_injected"), stat("delays_injected"))
}

/// Envoy's fault filter statistics: with the same resources (a delay and an abort on every
/// request) and the same requests, Remora counts the faults it injected as Envoy does, under
/// the connection manager's stat prefix.
#[test]
fn fault_statistics_count_as_envoys() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let fault = json!({"@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
        "delay": {"fixed_delay": "0.010s", "percentage": {"numerator": 1_000_000, "denominator": "MILLION"}},
        "abort": {"http_status": 503, "percentage": {"numerator": 1_000_000, "denominator": "MILLION"}}});
    let mut counted = Vec::new();
    for (i, net) in [&nets.0, &nets.1].into_iter().enumerate() {
        net.capture_default();
        for (ns, args) in [
            (&net.pod, vec!["route", "add", "default", "dev", "eth0"]),
            (&net.peer, vec!["addr", "add", "10.1.0.2/32", "dev", "eth0"]),
        ] {
            let out = ns.command("ip").args(&args).output().expect("ip");
            assert!(out.status.success(), "ip {args:?}: {out:?}");
        }
        let _a = backend::start(&net.peer, SocketAddr::from((BACKEND_IP, 8001)), "a");
        let mut resources = resources(Some(fault.clone()));
        // Envoy reaches the service's listener through `virtualOutbound`, as istiod's sidecar.
        if let (Some(listeners), Some(clusters)) = (
            resources.listeners.as_array_mut(),
            resources.clusters.as_array_mut(),
        ) {
            listeners.push(json!({"name": "virtualOutbound",
                "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
                "use_original_dst": true, "traffic_direction": "OUTBOUND",
                "filter_chains": [{"name": "virtualOutbound-catchall-tcp", "filters": [
                    {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                        "stat_prefix": "BlackHoleCluster", "cluster": "BlackHoleCluster"}}]}]}));
            clusters.push(
                json!({"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}),
            );
        }
        let (_remora, _envoy, port) = if i == 0 {
            let r = resources.start_remora(net);
            (Some(r), None, remora_e2e::ADMIN_PORT)
        } else {
            let e = resources.start_envoy(net, &binary);
            (None, Some(e), remora_e2e::envoy::ADMIN_PORT)
        };
        for n in 0..3 {
            let (status, body, _) = get(net, &format!("/f/{n}"));
            assert_eq!(
                (status, body.as_str()),
                (503, "fault filter abort"),
                "world {i}"
            );
        }
        counted.push(fault_stats(net, port));
    }
    assert_eq!(counted[1], (3, 3), "envoy: aborts, delays");
    assert_eq!(counted[0], counted[1], "Remora's, then Envoy's");
}
