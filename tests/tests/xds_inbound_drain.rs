//! The inbound side of a listener update that changes the filter chain an open TCP
//! connection took (issue #33: no request lost across a lifecycle event): istiod's
//! `virtualInbound` on 15006 with a plaintext TCP chain for each of two of the workload's
//! ports, each a `tcp_proxy` to its `inbound|PORT||` cluster (the original destination, dialled
//! from 127.0.0.6). A connection from the peer namespace is held open to each port of the pod
//! (captured inbound to 15006, then a line echo in the pod), then one update changes the first
//! port's chain (its `tcp_proxy`'s `stat_prefix`, as any change of the chain's filters: an
//! AuthorizationPolicy's RBAC filter, a PeerAuthentication's mode) and leaves the second's as
//! it was. As Envoy does, the first connection keeps going on its old chain for the drain time
//! (2 s: `drain.drain_time` here, `--drain-time-s` for Envoy), still echoing 1.5 s after the
//! update was written, then is closed with an end of stream; the second still echoes after the
//! first is gone: the rest of `virtualInbound` is not drained with the changed chain (Envoy
//! updates a listener whose chains alone changed in place). Run through Remora behind `remora
//! capture`, and through a real Envoy 1.40 given the same resources (its listeners over LDS
//! from a file), which must agree, down to each connection's access-log line (Envoy's format,
//! the pod's address masked: each proxy has a pod of its own).

mod chain_drain;

use chain_drain::*;
use remora_e2e::envoy_xds::{nets_or_skip, Resources};
use remora_e2e::peer;
use remora_e2e::xds_resources::inbound_cluster;
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

/// The workload's port whose chain the update changes.
const CHANGED_PORT: u16 = 7001;
/// The workload's port whose chain the update leaves as it was.
const KEPT_PORT: u16 = 7002;
/// The access-log line of each TCP connection: which chain's cluster it took and how it
/// ended, in Envoy's words.
const LOG_FORMAT: &str = "inbound-drain %DOWNSTREAM_LOCAL_ADDRESS% %UPSTREAM_CLUSTER% flags=%RESPONSE_FLAGS% details=%CONNECTION_TERMINATION_DETAILS%\n";

fn cluster(port: u16) -> String {
    format!("inbound|{port}||")
}

/// istiod's plaintext TCP chain for the workload's `port` (PERMISSIVE: `raw_buffer`), its
/// `tcp_proxy` under `stat_prefix`, each connection logged.
fn tcp_chain(port: u16, stat_prefix: &str) -> Value {
    json!({"name": format!("0.0.0.0_{port}"),
        "filter_chain_match": {"destination_port": port, "transport_protocol": "raw_buffer"},
        "filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": stat_prefix, "cluster": cluster(port),
            "access_log": stdout_access_log(LOG_FORMAT)}}]})
}

/// `virtualInbound` with the two ports' chains, the first's as of `generation` (its stat
/// prefix differs between generations: a changed chain), and the clusters behind them.
fn resources(generation: u8) -> Resources {
    let changed = tcp_chain(
        CHANGED_PORT,
        &format!("{}_{generation}", cluster(CHANGED_PORT)),
    );
    let blackhole = json!({"name": "virtualInbound-blackhole",
        "filter_chain_match": {"destination_port": 15006},
        "filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": "BlackHoleCluster", "cluster": "BlackHoleCluster"}}]});
    let virtual_inbound = json!({"name": "virtualInbound", "traffic_direction": "INBOUND",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
        "listener_filters": [
            {"name": "envoy.filters.listener.original_dst", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"}},
            {"name": "envoy.filters.listener.tls_inspector", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"},
             "filter_disabled": {"destination_port_range": {"start": 15006, "end": 15007}}}],
        "listener_filters_timeout": "0s", "continue_on_listener_filters_timeout": true,
        "filter_chains": [blackhole, changed, tcp_chain(KEPT_PORT, &cluster(KEPT_PORT))]});
    Resources {
        listeners: json!([virtual_inbound]),
        clusters: json!([inbound_cluster(&cluster(CHANGED_PORT)), inbound_cluster(&cluster(KEPT_PORT)),
            {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]),
        routes: json!([]),
        endpoints: json!([]),
    }
}

/// What a proxy did with the two connections.
#[derive(Debug)]
struct Seen {
    /// The changed chain's connection still echoed at [`STILL_OPEN_AT`].
    open_before_deadline: bool,
    /// When it was closed after the update was written, and how.
    closed: Option<(Duration, Close)>,
    /// The kept chain's connection still echoed after the other was closed.
    kept_open: bool,
}

/// Open a connection from the peer to each of the pod's ports, apply the update (`push`),
/// and watch them.
fn run(net: &PodNet, push: impl FnOnce()) -> Seen {
    let connect = |port: u16| {
        let to = SocketAddr::from((net.pod_ip, port));
        let mut s = peer::connect(&net.peer, to).expect("connect to the pod");
        echoes(&mut s, &format!("hello {port}")).expect("echo before the update");
        s
    };
    let (mut changed, mut kept) = (connect(CHANGED_PORT), connect(KEPT_PORT));
    // Taken before the write: the proxy cannot see the update earlier.
    let written = Instant::now();
    push();
    std::thread::sleep(STILL_OPEN_AT.saturating_sub(written.elapsed()));
    let open_before_deadline = echoes(&mut changed, "still here").is_ok();
    let closed = closed_after(&mut changed, written, CLOSED_BY);
    let kept_open = echoes(&mut kept, "after the drain").is_ok();
    Seen {
        open_before_deadline,
        closed,
        kept_open,
    }
}

fn check(who: &str, seen: &Seen, logs: impl Fn() -> String) {
    eprintln!("{who}: {seen:?}");
    assert!(
        seen.open_before_deadline,
        "{who}: the changed chain's connection was closed before its drain time\n{}",
        logs()
    );
    let Some((after, how)) = seen.closed else {
        panic!(
            "{who}: the changed chain's connection was still open {CLOSED_BY:?} after the update\n{}",
            logs()
        );
    };
    assert!(
        // A timer's own granularity aside (Envoy's are in milliseconds).
        after >= DRAIN_TIME - Duration::from_millis(20),
        "{who}: the changed chain's connection closed {after:?} after the update, before the drain time\n{}",
        logs()
    );
    // An end of stream: Envoy's close without flush is not a reset.
    assert_eq!(how, Close::End, "{who}: closed with a reset\n{}", logs());
    assert!(
        seen.kept_open,
        "{who}: the connection of the unchanged chain was closed with the changed one\n{}",
        logs()
    );
}

/// The two connections' access-log lines, the pod's address masked.
fn masked_lines(pod_ip: Ipv4Addr, logs: impl Fn() -> String) -> Vec<String> {
    let pod = pod_ip.to_string();
    log_lines("inbound-drain ", 2, logs)
        .into_iter()
        .map(|l| l.replace(&pod, "POD"))
        .collect()
}

#[test]
fn a_changed_inbound_chains_connection_closes_after_the_drain_time_as_envoys_does() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora_net, envoy_net) = (&nets.0, &nets.1);
    let mut echoes_in_pods = Vec::new();
    for net in [remora_net, envoy_net] {
        net.capture_default();
        for port in [CHANGED_PORT, KEPT_PORT] {
            echoes_in_pods.push(line_echo(&net.pod, peer::any_addr(port)));
        }
    }

    // The oracle first: Envoy as pilot-agent runs it, with the short drain time.
    let args = envoy_drain_args(DRAIN_TIME);
    let (envoy, dir) = resources(0).start_envoy_lds(
        envoy_net,
        Path::new(&binary),
        &args.each_ref().map(String::as_str),
    );
    let seen = run(envoy_net, || resources(1).write_envoy_listeners(&dir, "2"));
    check("envoy", &seen, || envoy.logs());
    let envoy_lines = masked_lines(envoy_net.pod_ip, || envoy.logs());
    eprintln!("envoy's lines: {envoy_lines:#?}");
    assert_eq!(envoy_lines.len(), 2, "envoy logged\n{}", envoy.logs());

    let (remora, dir) =
        resources(0).start_remora_with(remora_net, &remora_drain_config(DRAIN_TIME));
    let got = run(remora_net, || resources(1).write_for_remora(&dir));
    let logs = || format!("{}\n{}", remora.stdout(), remora.stderr());
    check("remora", &got, logs);
    // Logged as Envoy logs them: no response flag, no termination details.
    let remora_lines = masked_lines(remora_net.pod_ip, || remora.stdout());
    assert_eq!(remora_lines, envoy_lines, "access-log lines\n{}", logs());
    remora.wait_for_metrics("the close counted", Duration::from_secs(5), |m| {
        m.value(
            "remora_filter_chain_drain_closes_total",
            &[("direction", "inbound")],
        ) == 1.0
    });
}
