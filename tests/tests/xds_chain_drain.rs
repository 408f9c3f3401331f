//! A listener update that removes or changes the filter chain an open TCP connection took:
//! as Envoy does, the connection keeps going on its old chain for the drain time
//! (`drain.drain_time` here, `--drain-time-s` for Envoy: pilot-agent's from ProxyConfig's
//! `drainDuration`), then is closed (`filter_chain_is_being_removed`); a connection whose chain
//! the update left as it was stays open.
//!
//! Three services of one TCP echo backend, each istiod's per-VIP outbound listener
//! (`bind_to_port: false`, reached through `virtualOutbound`): a connection is held open to
//! each, then one update removes the first listener, changes the cluster of the second's only
//! chain (Envoy's in-place filter chain update) and leaves the third alone. With a drain time
//! of 2 s, the first two connections still echo 1.5 s after the update was written and are
//! closed within a few seconds after the drain time (the update is picked up within Remora's
//! one-second poll of its directory, Envoy's inotify at once); the third still echoes after
//! they are gone, and each connection's access-log line (Envoy's format) is the same in both.
//! Run through Remora behind `remora capture`, and through a real Envoy 1.40 given the same
//! resources (its listeners over LDS from a file), which must agree.
//!
//! The same for HTTP/1.1 keep-alive connections on an HTTP chain the update changes: the next
//! request on one is answered with `connection: close`, and an idle one is closed when the
//! drain time has run out, as Envoy does. (After that answer Envoy 1.40 leaves the connection
//! to the client, closing it at the drain time; Remora closes it once the answer is written,
//! as on SIGTERM's drain.) And an HTTP/2 connection's stream still waiting for its answer is
//! cut when the connection is closed at the drain time, in both.

mod chain_drain;

use chain_drain::*;
use remora_e2e::backend;
use remora_e2e::envoy_xds::{nets_or_skip, Resources};
use remora_e2e::http_client::Client;
use remora_e2e::peer::{self, Server};
use remora_e2e::xds_resources::{eds_cluster, tcp_listener};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::time::{Duration, Instant};

const BACKEND_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);
const BACKEND_PORT: u16 = 9100;
const A: &str = "outbound|9000||a.test.svc.cluster.local";
const B: &str = "outbound|9000||b.test.svc.cluster.local";
/// Its listener is removed by the update.
const REMOVED: &str = "10.96.0.41:9000";
/// Its listener's chain goes to another cluster after the update.
const CHANGED: &str = "10.96.0.42:9000";
/// Its listener is the same after the update.
const KEPT: &str = "10.96.0.43:9000";
/// The access-log line of each TCP connection: how it ended, in Envoy's words.
const LOG_FORMAT: &str =
    "chain-drain %DOWNSTREAM_LOCAL_ADDRESS% flags=%RESPONSE_FLAGS% details=%CONNECTION_TERMINATION_DETAILS%\n";

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("addr")
}

/// The services' listeners: before the update all three to cluster A; after it, the first
/// gone and the second to cluster B.
fn resources(updated: bool) -> Resources {
    let endpoint = json!({"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
        "address": BACKEND_IP.to_string(), "port_value": BACKEND_PORT}}}, "health_status": "HEALTHY"}]});
    let mut listeners = vec![json!({"name": "virtualOutbound",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
        "use_original_dst": true, "traffic_direction": "OUTBOUND",
        "filter_chains": [{"name": "virtualOutbound-catchall-tcp", "filters": [
            {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "stat_prefix": "BlackHoleCluster", "cluster": "BlackHoleCluster"}}]}]})];
    let logged = |vip: &str, cluster: &str| {
        let mut l = tcp_listener(addr(vip), cluster);
        l["filter_chains"][0]["filters"][0]["typed_config"]["access_log"] =
            stdout_access_log(LOG_FORMAT);
        l
    };
    if !updated {
        listeners.push(logged(REMOVED, A));
    }
    listeners.push(logged(CHANGED, if updated { B } else { A }));
    listeners.push(logged(KEPT, A));
    Resources {
        listeners: Value::Array(listeners),
        clusters: json!([eds_cluster(A), eds_cluster(B),
            {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]),
        routes: json!([]),
        endpoints: json!([
            {"cluster_name": A, "endpoints": [endpoint.clone()]},
            {"cluster_name": B, "endpoints": [endpoint]}
        ]),
    }
}

/// What a proxy did with the three connections.
#[derive(Debug)]
struct Seen {
    /// Each retired chain's connection still echoed at [`STILL_OPEN_AT`].
    open_before_deadline: [bool; 2],
    /// When each was closed after the update was written.
    closed: [Option<(Duration, Close)>; 2],
    /// The kept chain's connection still echoed after both were closed.
    kept_open: bool,
}

/// Open a connection to each service, apply the update (`push`), and watch them.
fn run(net: &PodNet, push: impl FnOnce()) -> Seen {
    let connect = |vip: &str| {
        let mut s = peer::connect(&net.pod, addr(vip)).expect("connect through the proxy");
        echoes(&mut s, &format!("hello {vip}")).expect("echo before the update");
        s
    };
    let (mut removed, mut changed, mut kept) = (connect(REMOVED), connect(CHANGED), connect(KEPT));
    // Taken before the write: the proxy cannot see the update earlier.
    let written = Instant::now();
    push();
    std::thread::sleep(STILL_OPEN_AT.saturating_sub(written.elapsed()));
    let open_before_deadline = [
        echoes(&mut removed, "still here").is_ok(),
        echoes(&mut changed, "still here").is_ok(),
    ];
    let closed = [
        closed_after(&mut removed, written, CLOSED_BY),
        closed_after(&mut changed, written, CLOSED_BY),
    ];
    let kept_open = echoes(&mut kept, "after the drain").is_ok();
    Seen {
        open_before_deadline,
        closed,
        kept_open,
    }
}

fn check(who: &str, seen: &Seen, logs: impl Fn() -> String) {
    eprintln!("{who}: {seen:?}");
    assert_eq!(
        seen.open_before_deadline,
        [true, true],
        "{who}: a retired chain's connection was closed before its drain time\n{}",
        logs()
    );
    for (what, closed) in ["removed", "changed"].iter().zip(seen.closed) {
        let Some((after, _)) = closed else {
            panic!(
                "{who}: the connection of the {what} chain was still open {CLOSED_BY:?} after the update\n{}",
                logs()
            );
        };
        assert!(
            // A timer's own granularity aside (Envoy's are in milliseconds).
            after >= DRAIN_TIME - Duration::from_millis(20),
            "{who}: the {what} chain's connection closed {after:?} after the update, before the drain time\n{}",
            logs()
        );
    }
    assert!(
        seen.kept_open,
        "{who}: the connection of the unchanged chain was closed\n{}",
        logs()
    );
}

#[test]
fn a_retired_chains_connections_close_after_the_drain_time_as_envoys_do() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora_net, envoy_net) = (&nets.0, &nets.1);
    for net in [remora_net, envoy_net] {
        remora_e2e::sidecars::prepare(net);
    }
    let backend = SocketAddr::from(SocketAddrV4::new(BACKEND_IP, BACKEND_PORT));
    let _remora_backend = line_echo(&remora_net.peer, backend);
    let _envoy_backend = line_echo(&envoy_net.peer, backend);

    // The oracle first: Envoy as pilot-agent runs it, with the short drain time.
    let args = envoy_drain_args(DRAIN_TIME);
    let (envoy, dir) = resources(false).start_envoy_lds(
        envoy_net,
        Path::new(&binary),
        &args.each_ref().map(String::as_str),
    );
    let seen = run(envoy_net, || {
        resources(true).write_envoy_listeners(&dir, "2")
    });
    check("envoy", &seen, || envoy.logs());
    let envoy_lines = log_lines("chain-drain ", 3, || envoy.logs());

    let (remora, dir) =
        resources(false).start_remora_with(remora_net, &remora_drain_config(DRAIN_TIME));
    let got = run(remora_net, || resources(true).write_for_remora(&dir));
    let logs = || format!("{}\n{}", remora.stdout(), remora.stderr());
    check("remora", &got, logs);
    // Closed as Envoy closes them (an end of stream: Envoy's close without flush is not a
    // reset).
    let how = |s: &Seen| s.closed.map(|c| c.map(|(_, how)| how));
    assert_eq!(
        how(&got),
        how(&seen),
        "remora closed them otherwise than envoy\n{}",
        logs()
    );
    // Logged as Envoy logs them: no response flag, no termination details.
    let remora_lines = log_lines("chain-drain ", 3, || remora.stdout());
    assert_eq!(remora_lines, envoy_lines, "access-log lines\n{}", logs());
    remora.wait_for_metrics("the two closes counted", Duration::from_secs(5), |m| {
        m.value(
            "remora_filter_chain_drain_closes_total",
            &[("direction", "outbound")],
        ) == 2.0
    });
}

const HTTP_VIP: &str = "10.96.0.10:80";
const HOST: &str = "web.test.svc.cluster.local";
const HTTP_BACKEND_PORT: u16 = 8001;
/// Longer than [`DRAIN_TIME`]: the request on the connection to be told to go is sent
/// [`STILL_OPEN_AT`] after the update, well before this runs out.
const HTTP_DRAIN_TIME: Duration = Duration::from_secs(3);

/// istiod's outbound HTTP listener for port 80, its chain as of `generation` (the connection
/// manager's stat prefix differs between generations: a changed chain).
fn http_resources(generation: u8) -> Resources {
    Resources {
        listeners: json!([
            {"name": "virtualOutbound", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
             "use_original_dst": true, "traffic_direction": "OUTBOUND",
             "filter_chains": [{"name": "virtualOutbound-catchall-tcp", "filters": [
                {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": "BlackHoleCluster", "cluster": "BlackHoleCluster"}}]}]},
            {"name": "0.0.0.0_80", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
             "traffic_direction": "OUTBOUND", "bind_to_port": false,
             "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": format!("outbound_0.0.0.0_80_{generation}"),
                "rds": {"config_source": {"ads": {}}, "route_config_name": "80"},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}
        ]),
        clusters: json!([eds_cluster(A),
            {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]),
        routes: json!([{"name": "80", "virtual_hosts": [{"name": "web", "domains": [HOST],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": A}}]}]}]),
        endpoints: json!([{"cluster_name": A, "endpoints": [{"lb_endpoints": [{"endpoint": {"address":
            {"socket_address": {"address": BACKEND_IP.to_string(), "port_value": HTTP_BACKEND_PORT}}}}]}]}]),
    }
}

/// What a proxy did with two keep-alive connections on the changed chain.
#[derive(Debug)]
struct SeenHttp {
    /// The `connection` header of the answer to a request sent on the first after the
    /// update, before the drain time ran out (`None`: no answer).
    told: Option<Option<String>>,
    /// When the first was closed after the update: Envoy leaves it open until the client
    /// closes it or the drain time runs out, Remora closes it after that answer (as on
    /// SIGTERM's drain); either way by the drain time.
    told_closed: Option<Duration>,
    /// When the second, idle since before the update, was closed after the update.
    idle_closed: Option<Duration>,
}

/// Both pods made ready for a sidecar, each with the HTTP backend its chain routes to.
fn http_backends(remora_net: &PodNet, envoy_net: &PodNet) -> [Server; 2] {
    let backend_addr = SocketAddr::from(SocketAddrV4::new(BACKEND_IP, HTTP_BACKEND_PORT));
    [remora_net, envoy_net].map(|net| {
        remora_e2e::sidecars::prepare(net);
        backend::start(&net.peer, backend_addr, "a")
    })
}

fn run_http(net: &PodNet, push: impl FnOnce()) -> SeenHttp {
    let connect = || {
        let mut c = Client::connect(&net.pod, addr(HTTP_VIP)).expect("connect through the proxy");
        let r = c
            .get(HOST, "/before", &[])
            .expect("an answer before the update");
        assert_eq!(r.status, 200, "{}", r.text());
        c
    };
    let (mut told, idle) = (connect(), connect());
    let written = Instant::now();
    push();
    std::thread::sleep(STILL_OPEN_AT.saturating_sub(written.elapsed()));
    let answer = told.get(HOST, "/after", &[]);
    let told_header = answer
        .ok()
        .map(|r| r.header("connection").map(str::to_ascii_lowercase));
    let mut rest = told.into_inner();
    let told_closed = closed_after(&mut rest, written, CLOSED_BY).map(|(after, _)| after);
    let mut idle = idle.into_inner();
    let idle_closed = closed_after(&mut idle, written, CLOSED_BY).map(|(after, _)| after);
    SeenHttp {
        told: told_header,
        told_closed,
        idle_closed,
    }
}

fn check_http(who: &str, seen: &SeenHttp, logs: impl Fn() -> String) {
    eprintln!("{who}: {seen:?}");
    assert_eq!(
        seen.told,
        Some(Some("close".to_string())),
        "{who}: a request on a drained connection is answered with `connection: close`\n{}",
        logs()
    );
    assert!(
        seen.told_closed.is_some(),
        "{who}: the told connection outlived the drain time\n{}",
        logs()
    );
    let after = seen.idle_closed.unwrap_or_else(|| {
        panic!(
            "{who}: the idle connection was still open {CLOSED_BY:?} after the update\n{}",
            logs()
        )
    });
    assert!(
        after >= HTTP_DRAIN_TIME - Duration::from_millis(20),
        "{who}: the idle connection closed {after:?} after the update, before the drain time\n{}",
        logs()
    );
}

#[test]
fn a_changed_http_chains_connections_are_told_to_go_and_closed_after_the_drain_time() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora_net, envoy_net) = (&nets.0, &nets.1);
    let _backends = http_backends(remora_net, envoy_net);

    let args = envoy_drain_args(HTTP_DRAIN_TIME);
    let (envoy, dir) = http_resources(0).start_envoy_lds(
        envoy_net,
        Path::new(&binary),
        &args.each_ref().map(String::as_str),
    );
    let seen = run_http(envoy_net, || {
        http_resources(1).write_envoy_listeners(&dir, "2")
    });
    check_http("envoy", &seen, || envoy.logs());

    let (remora, dir) =
        http_resources(0).start_remora_with(remora_net, &remora_drain_config(HTTP_DRAIN_TIME));
    let got = run_http(remora_net, || http_resources(1).write_for_remora(&dir));
    check_http("remora", &got, || {
        format!("{}\n{}", remora.stdout(), remora.stderr())
    });
}

/// What a proxy did with an HTTP/2 connection on the changed chain.
#[derive(Debug)]
struct SeenH2 {
    /// A stream sent before the update to `/slow` (answered 3 s later, after the drain time):
    /// `Ok(status)`, or `Err(())` when the connection was closed under it.
    slow: Result<u16, ()>,
    /// A stream opened [`STILL_OPEN_AT`] after the update was refused. Not compared: Remora
    /// sends its GOAWAY when the update comes (and, as hyper does, the final one a round trip
    /// later), Envoy with the connection's next response, so Envoy serves this stream.
    told: bool,
    /// The connection ended by the drain time (and not before it).
    closed_at_drain_time: bool,
}

async fn h2_connection(socket: std::net::TcpStream, push: impl FnOnce()) -> SeenH2 {
    socket.set_nonblocking(true).expect("non-blocking");
    let socket = tokio::net::TcpStream::from_std(socket).expect("a tokio socket");
    let (send, conn) = h2::client::handshake(socket)
        .await
        .expect("an HTTP/2 handshake");
    let driver = tokio::spawn(conn);
    let get = |path: &str| {
        http::Request::get(format!("http://{HOST}{path}"))
            .body(())
            .expect("a request")
    };
    // Answered, so the connection is up and routed before the update.
    let (first, _) = send
        .clone()
        .ready()
        .await
        .expect("ready")
        .send_request(get("/before"), true)
        .expect("a stream");
    assert_eq!(first.await.expect("an answer").status(), 200);
    let (slow, _) = send
        .clone()
        .ready()
        .await
        .expect("ready")
        .send_request(get("/slow"), true)
        .expect("a stream");
    let slow = tokio::spawn(async move { slow.await.map(|r| r.status().as_u16()) });
    let written = Instant::now();
    push();
    tokio::time::sleep(STILL_OPEN_AT.saturating_sub(written.elapsed())).await;
    let told = match send.clone().ready().await {
        Err(_) => true,
        Ok(mut s) => match s.send_request(get("/after"), true) {
            Err(_) => true,
            Ok((r, _)) => match r.await {
                Ok(r) => r.status() != 200,
                Err(e) => e.is_go_away() || e.is_remote(),
            },
        },
    };
    let slow = match tokio::time::timeout(CLOSED_BY, slow).await {
        Ok(Ok(Ok(status))) => Ok(status),
        _ => Err(()),
    };
    let ended = tokio::time::timeout(CLOSED_BY, driver).await.is_ok();
    let at = written.elapsed();
    SeenH2 {
        slow,
        told,
        closed_at_drain_time: ended && at >= DRAIN_TIME - Duration::from_millis(20),
    }
}

fn run_h2(net: &PodNet, push: impl FnOnce()) -> SeenH2 {
    let socket = net
        .pod
        .connect(addr(HTTP_VIP), Duration::from_secs(5))
        .expect("connect through the proxy");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(h2_connection(socket, push))
}

#[test]
fn a_changed_http_chains_http2_connection_gets_goaway_and_its_stream_is_cut_at_the_drain_time() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora_net, envoy_net) = (&nets.0, &nets.1);
    let _backends = http_backends(remora_net, envoy_net);

    // Shorter than the slow answer takes (`backend::SLOW`), so the drain time cuts it.
    let args = envoy_drain_args(DRAIN_TIME);
    let (envoy, dir) = http_resources(0).start_envoy_lds(
        envoy_net,
        Path::new(&binary),
        &args.each_ref().map(String::as_str),
    );
    let expected = run_h2(envoy_net, || {
        http_resources(1).write_envoy_listeners(&dir, "2")
    });
    eprintln!("envoy: {expected:?}");
    let (remora, dir) =
        http_resources(0).start_remora_with(remora_net, &remora_drain_config(DRAIN_TIME));
    let got = run_h2(remora_net, || http_resources(1).write_for_remora(&dir));
    eprintln!("remora: {got:?}");
    assert_eq!(
        expected.slow,
        Err(()),
        "envoy cut the stream\n{}",
        envoy.logs()
    );
    assert!(expected.closed_at_drain_time, "{}", envoy.logs());
    // Remora's GOAWAY came when the update did (see `SeenH2::told`).
    assert!(got.told, "remora\n{}", remora.stderr());
    assert_eq!(
        (got.slow, got.closed_at_drain_time),
        (expected.slow, expected.closed_at_drain_time),
        "remora\n{}\n{}\nenvoy\n{}",
        remora.stdout(),
        remora.stderr(),
        envoy.logs()
    );
}
