//! Istio's TCP traffic-shifting task, as the xDS resources istiod writes for its VirtualService
//! (`tcp: [{route: [{destination: {subset: v1}, weight: 80}, {destination: {subset: v2},
//! weight: 20}]}]` on `tcp-echo:9000`), through Remora behind `remora capture` and through a
//! real Envoy 1.40 given the same resources.
//!
//! istiod writes the service's per-VIP listener (`<VIP>_9000`, `bind_to_port: false`, which
//! `virtualOutbound` hands the connection to) with a `tcp_proxy` over `weighted_clusters`, one
//! per subset. A cluster is chosen per connection: of 400 connections, each echoing through
//! the backend of the subset it reached, 80 % go to v1 (tolerance 70–90 %) and the rest to v2,
//! with every echo intact, in both proxies. Both count the connections and their bytes in
//! the same `tcp_proxy` statistics (`tcp.<stat_prefix>.*`, and under Istio's tags on
//! `/stats/prometheus`), a connection to no service (`virtualOutbound`'s `BlackHoleCluster`
//! chain) included.

use remora_e2e::envoy_xds::{istio_stats_config, nets_or_skip, Resources};
use remora_e2e::peer::{self, Server};
use remora_e2e::stat_deltas::{self, delta, prometheus_samples, Stats};
use remora_e2e::xds_resources::eds_cluster;
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::time::{Duration, Instant};

const BACKEND_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);
const VIP: &str = "10.96.0.30:9000";
const V1: &str = "outbound|9000|v1|tcp-echo.istio-io-tcp-traffic-shifting.svc.cluster.local";
const V2: &str = "outbound|9000|v2|tcp-echo.istio-io-tcp-traffic-shifting.svc.cluster.local";
const V1_PORT: u16 = 9001;
const V2_PORT: u16 = 9002;
const CONNECTIONS: usize = 400;

fn backend_addr(port: u16) -> SocketAddr {
    SocketAddrV4::new(BACKEND_IP, port).into()
}

fn resources() -> Resources {
    let vip: SocketAddr = VIP.parse().expect("addr");
    let endpoint = |port: u16| {
        json!({"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
            "address": BACKEND_IP.to_string(), "port_value": port}}}, "health_status": "HEALTHY"}]})
    };
    let listener: Value = json!({"name": format!("{}_{}", vip.ip(), vip.port()),
        "address": {"socket_address": {"address": vip.ip().to_string(), "port_value": vip.port()}},
        "traffic_direction": "OUTBOUND", "bind_to_port": false,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": "outbound|9000||tcp-echo.istio-io-tcp-traffic-shifting.svc.cluster.local",
            "weighted_clusters": {"clusters": [{"name": V1, "weight": 80}, {"name": V2, "weight": 20}]}}}]}]});
    Resources {
        listeners: json!([
            {"name": "virtualOutbound", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
             "use_original_dst": true, "traffic_direction": "OUTBOUND",
             "filter_chains": [{"name": "virtualOutbound-catchall-tcp", "filters": [
                {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": "BlackHoleCluster", "cluster": "BlackHoleCluster"}}]}]},
            listener
        ]),
        clusters: json!([eds_cluster(V1), eds_cluster(V2),
            {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]),
        routes: json!([]),
        endpoints: json!([
            {"cluster_name": V1, "endpoints": [endpoint(V1_PORT)]},
            {"cluster_name": V2, "endpoints": [endpoint(V2_PORT)]}
        ]),
    }
}

/// Istio's tcp-echo: reads a line, answers it prefixed with its version, closes.
fn tcp_echo(net: &PodNet, port: u16, prefix: &'static str) -> Server {
    Server::start(&net.peer, backend_addr(port), move |stream| {
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let mut stream = stream;
        stream.write_all(format!("{prefix} {line}").as_bytes())
    })
}

fn prepare(net: &PodNet) -> (Server, Server) {
    remora_e2e::sidecars::prepare(net);
    (tcp_echo(net, V1_PORT, "one"), tcp_echo(net, V2_PORT, "two"))
}

/// `CONNECTIONS` connections to the service, one after another: how many each version
/// answered, and the answers that were neither.
fn shift(net: &PodNet, who: &str) -> (usize, usize, Vec<String>) {
    let vip: SocketAddr = VIP.parse().expect("addr");
    let (mut one, mut two, mut other) = (0, 0, Vec::new());
    for i in 0..CONNECTIONS {
        let message = format!("hello {i}\n");
        let answer = peer::connect(&net.pod, vip).and_then(|mut s| {
            s.write_all(message.as_bytes())?;
            let mut line = String::new();
            BufReader::new(s).read_line(&mut line)?;
            Ok(line)
        });
        match answer {
            Ok(a) if a == format!("one {message}") => one += 1,
            Ok(a) if a == format!("two {message}") => two += 1,
            Ok(a) => other.push(format!("{who}: {i}: {a:?}")),
            Err(e) => other.push(format!("{who}: {i}: {e}")),
        }
    }
    (one, two, other)
}

fn check(who: &str, (one, two, other): &(usize, usize, Vec<String>)) {
    eprintln!(
        "{}: v1 {one}, v2 {two}",
        who.lines().next().unwrap_or_default()
    );
    assert!(other.is_empty(), "{who}: {other:?}");
    assert_eq!(one + two, CONNECTIONS, "{who}");
    // 80 % of 400 is 320; tolerance 70–90 %.
    assert!((280..=360).contains(one), "{who}: v1 {one}, v2 {two}");
}

const RX: &str = "tcp.outbound|9000||tcp-echo.istio-io-tcp-traffic-shifting.svc.cluster.local.downstream_cx_rx_bytes_total";
const TX: &str = "tcp.outbound|9000||tcp-echo.istio-io-tcp-traffic-shifting.svc.cluster.local.downstream_cx_tx_bytes_total";

/// The `tcp_proxy` statistics of the sidecar whose admin API is on `port`, and its listeners'
/// connection counts (Envoy counts a connection on the listener virtualOutbound hands it to).
fn tcp_proxy_stats(net: &PodNet, port: u16) -> Stats {
    stat_deltas::stats(net, port, |name| {
        let listener = name.starts_with("listener.")
            && name.contains(".downstream_cx_")
            && !name.contains(".worker_")
            && !name.starts_with("listener.admin.");
        listener || (name.starts_with("tcp.") && !name.starts_with("tcp.rbac."))
    })
}

/// What the shift and one connection to no service changed in the `tcp_proxy` statistics of
/// the sidecar whose admin API is on `admin`, every name it has after, and its
/// `envoy_tcp_*` samples (the RBAC filters' `envoy_tcp{…}` family left out).
fn counted(net: &PodNet, admin: u16, who: &str) -> (Vec<String>, Vec<String>, Vec<String>) {
    let before = tcp_proxy_stats(net, admin);
    let shifted = shift(net, who);
    check(who, &shifted);
    // Nothing listens for this address: virtualOutbound's catch-all chain takes it to
    // BlackHoleCluster, which has no endpoint, and the connection is closed.
    if let Ok(mut s) = peer::connect(&net.pod, "10.96.0.99:9000".parse().expect("addr")) {
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = std::io::Read::read(&mut s, &mut [0; 16]);
    }
    // A connection adds its bytes when it ends, just after the client has its answer: wait
    // for every byte each way (each answer is the line after a 4-byte version).
    let sent: usize = (0..CONNECTIONS).map(|i| format!("hello {i}\n").len()).sum();
    let expected = [(RX, sent), (TX, sent + 4 * CONNECTIONS)];
    let deadline = Instant::now() + Duration::from_secs(5);
    let after = loop {
        let after = tcp_proxy_stats(net, admin);
        let counted = |name: &str| {
            let value = |s: &Stats| s.get(name).copied().unwrap_or(0);
            value(&after) - value(&before)
        };
        // And every connection has ended on its listener.
        let ended = after
            .iter()
            .all(|(n, v)| !n.ends_with(".downstream_cx_active") || *v == 0);
        let all = ended && expected.iter().all(|&(n, v)| counted(n) == v as i64);
        if all || Instant::now() > deadline {
            break after;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let samples = prometheus_samples(net, admin, "envoy_tcp_");
    let changed = delta(&before, &after);
    let names = after
        .into_keys()
        .filter(|n| n.starts_with("tcp."))
        .collect();
    (changed, names, samples)
}

#[test]
fn tcp_traffic_shifting_has_envoys_distribution() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora_net, envoy_net) = (&nets.0, &nets.1);
    let _remora_backends = prepare(remora_net);
    let _envoy_backends = prepare(envoy_net);
    let remora = resources().start_remora(remora_net);
    let envoy = resources().start_envoy_with(envoy_net, Path::new(&binary), istio_stats_config);
    let expected = counted(envoy_net, remora_e2e::envoy::ADMIN_PORT, "envoy");
    let got = counted(remora_net, remora_e2e::ADMIN_PORT, "remora");
    let logs = || {
        format!(
            "envoy:\n{}\nremora:\n{}\n{}",
            envoy.logs(),
            remora.stdout(),
            remora.stderr()
        )
    };
    let (changed, names, samples) = &expected;
    assert!(
        changed.contains(&format!(
            "tcp.outbound|9000||tcp-echo.istio-io-tcp-traffic-shifting.svc.cluster.local.downstream_cx_total +{CONNECTIONS}"
        )) && changed.contains(&"tcp.BlackHoleCluster.downstream_cx_total +1".to_string()),
        "Envoy counted the connections otherwise: {changed:#?}\n{}",
        logs()
    );
    assert_eq!(&got.0, changed, "what the traffic changed\n{}", logs());
    assert_eq!(&got.1, names, "the tcp_proxy statistics\n{}", logs());
    assert_eq!(&got.2, samples, "in Prometheus form\n{}", logs());
}
