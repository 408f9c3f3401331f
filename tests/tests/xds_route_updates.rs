//! A route update under load: clients send requests without pause over keep-alive
//! connections through Remora while the route table switches the service from cluster A to
//! cluster B and back, several times. Not one request may fail, and the traffic must follow
//! each switch (on the same client connections: routing is per request).

use remora_e2e::backend;
use remora_e2e::envoy_xds::Resources;
use remora_e2e::http_client::Client;
use remora_e2e::xds_resources::{eds_cluster, tcp_listener};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

const BACKEND_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const HOST: &str = "web.test.svc.cluster.local";
const A: &str = "outbound|80|a|web.test.svc.cluster.local";
const B: &str = "outbound|80|b|web.test.svc.cluster.local";
/// Client connections sending at once.
const CLIENTS: usize = 4;
/// A→B→A round trips.
const SWITCHES: usize = 3;
/// Bound on the traffic following one switch (the directory is polled every second).
const FOLLOW_TIME: Duration = Duration::from_secs(10);

fn resources(cluster: &str) -> Resources {
    let assignment = |cluster: &str, port: u16| {
        json!({"cluster_name": cluster, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": BACKEND_IP.to_string(), "port_value": port}}}}]}]})
    };
    let mut listeners = vec![json!({
        "name": "0.0.0.0_80", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
        "traffic_direction": "OUTBOUND", "bind_to_port": false,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "outbound_0.0.0.0_80",
            "rds": {"config_source": {"ads": {}}, "route_config_name": "80"},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]})];
    // A TCP listener too, so the listener set is istiod's mix; it takes no traffic here.
    listeners.push(tcp_listener(SocketAddr::from(([10, 96, 0, 20], 9000)), A));
    Resources {
        listeners: Value::Array(listeners),
        clusters: json!([eds_cluster(A), eds_cluster(B)]),
        routes: json!([{"name": "80", "virtual_hosts": [{"name": "web", "domains": [HOST],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster}}]}]}]),
        endpoints: json!([assignment(A, 8001), assignment(B, 8002)]),
    }
}

/// What the clients saw: answers per backend, and every failure.
#[derive(Default)]
struct Tally {
    answered: BTreeMap<String, u64>,
    failures: Vec<String>,
}

fn client_loop(
    ns: &remora_e2e::Netns,
    stop: &AtomicBool,
    tally: &Mutex<Tally>,
    last: &Mutex<String>,
) {
    let vip = SocketAddr::from(SocketAddrV4::new(VIP, 80));
    let mut client = match Client::connect(ns, vip) {
        Ok(c) => c,
        Err(e) => {
            let mut t = tally.lock().unwrap_or_else(PoisonError::into_inner);
            t.failures.push(format!("connect: {e}"));
            return;
        }
    };
    // Bounded by count as well as by `stop`: a test that never stops them has hung anyway.
    for _ in 0..1_000_000 {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let result = client.get(HOST, "/", &[]);
        let mut t = tally.lock().unwrap_or_else(PoisonError::into_inner);
        match result {
            Ok(r) if r.status == 200 => {
                let name = r.header("x-backend").unwrap_or("?").to_string();
                *t.answered.entry(name.clone()).or_default() += 1;
                *last.lock().unwrap_or_else(PoisonError::into_inner) = name;
            }
            Ok(r) => t.failures.push(format!("{} {}", r.status, r.text())),
            Err(e) => {
                t.failures.push(format!("{e}"));
                // Without its connection this client is done; the failure is recorded.
                return;
            }
        }
    }
}

/// Wait until every client's last answer came from `backend`.
fn wait_all_on(lasts: &[Arc<Mutex<String>>], backend: &str) -> bool {
    let deadline = Instant::now() + FOLLOW_TIME;
    while Instant::now() < deadline {
        if lasts
            .iter()
            .all(|l| *l.lock().unwrap_or_else(PoisonError::into_inner) == backend)
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn switch(dir: &Path, cluster: &str) {
    resources(cluster).write_for_remora(dir);
}

#[test]
fn switching_a_routes_cluster_under_load_fails_no_request() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    remora_e2e::sidecars::prepare(&net);
    let _a = backend::start(&net.peer, SocketAddr::from((BACKEND_IP, 8001)), "a");
    let _b = backend::start(&net.peer, SocketAddr::from((BACKEND_IP, 8002)), "b");
    let dir = net.binary().make_dir("xds");
    switch(&dir, A);
    let remora = net
        .remora()
        .config(&format!("xds:\n  resources_dir: {}\n", dir.display()))
        .start_ready();

    let stop = AtomicBool::new(false);
    let tally = Mutex::new(Tally::default());
    let lasts: Vec<Arc<Mutex<String>>> = (0..CLIENTS).map(|_| Arc::default()).collect();
    let mut phases = Vec::new();
    std::thread::scope(|scope| {
        for last in &lasts {
            let (ns, stop, tally) = (&net.pod, &stop, &tally);
            scope.spawn(move || client_loop(ns, stop, tally, last));
        }
        let before = || {
            tally
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .answered
                .clone()
        };
        let mut followed = wait_all_on(&lasts, "a");
        for _ in 0..SWITCHES {
            for (cluster, name) in [(B, "b"), (A, "a")] {
                if !followed {
                    break;
                }
                let start = before();
                switch(&dir, cluster);
                followed = wait_all_on(&lasts, name);
                // A moment on the new cluster, so the clients' connections carry it a while.
                std::thread::sleep(Duration::from_millis(300));
                phases.push((name, start, before()));
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(
            followed,
            "the traffic did not follow the switch; phases so far: {phases:?}\n{}",
            remora.stderr()
        );
    });
    let tally = tally.into_inner().unwrap_or_else(PoisonError::into_inner);
    println!("answered per backend: {:?}", tally.answered);
    assert!(
        tally.failures.is_empty(),
        "{} requests failed (answered: {:?}): {:?}\n{}",
        tally.failures.len(),
        tally.answered,
        &tally.failures[..tally.failures.len().min(10)],
        remora.stderr()
    );
    assert_eq!(phases.len(), SWITCHES * 2);
    // Every phase moved traffic to its cluster.
    for (name, start, end) in &phases {
        let gained = end.get(*name).copied().unwrap_or(0) - start.get(*name).copied().unwrap_or(0);
        assert!(
            gained > 0,
            "no request reached {name} in its phase: {phases:?}"
        );
    }
    // The clients never reconnect, so no failure also means that each kept its one
    // connection through every switch.
}
