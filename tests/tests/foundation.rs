//! The foundation, end to end: capture rules written by `remora capture`, `remora run` as UID
//! 1337 in a pod namespace, and real clients and servers on both sides of a veth pair.

use remora_e2e::http_client::Client;
use remora_e2e::peer::{self, any_addr, curl_ok, Server};
use remora_e2e::{PodNet, DEFAULT_CAPTURE_ARGS};
use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

const OPENED: &str = "remora_connections_opened_total";
const CLOSED: &str = "remora_connections_closed_total";
const ACTIVE: &str = "remora_connections_active";
const LOOP_REFUSED: &str = "remora_loop_refused_total";
const OUTBOUND: (&str, &str) = ("direction", "outbound");
const INBOUND: (&str, &str) = ("direction", "inbound");

/// Bound on a counter catching up with traffic that has already finished.
const METRICS_SETTLE: Duration = Duration::from_secs(3);
/// Bound on one curl request.
const CURL_TIME: Duration = Duration::from_secs(5);
/// The app's port inside the pod, and the service port on the peer.
const APP_PORT: u16 = 8080;
/// A keep-alive HTTP/1.1 application in the pod (the SIGTERM test).
const WEB_PORT: u16 = 8081;

#[test]
fn outbound_http_from_the_pod_reaches_the_peer_through_the_outbound_listener() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().start_ready();
    let server = Server::http(&net.peer, net.peer_addr(APP_PORT), "hello from the peer\n");
    let before = remora.metrics().value(OPENED, &[OUTBOUND]);

    let out = peer::curl(
        &net.pod,
        &[&format!("http://{}/", server.addr())],
        CURL_TIME,
    );

    let body = curl_ok(&out, "outbound GET");
    assert_eq!(body, "hello from the peer\n");
    assert_eq!(server.peers().len(), 1, "the peer saw one connection");
    assert_eq!(server.peers()[0].ip(), IpAddr::V4(net.pod_ip));
    remora.wait_for_metrics(
        "the outbound connection counted as opened and closed",
        METRICS_SETTLE,
        |m| {
            m.value(OPENED, &[OUTBOUND]) >= before + 1.0
                && m.value(CLOSED, &[OUTBOUND]) >= 1.0
                && m.value(ACTIVE, &[OUTBOUND]) == 0.0
        },
    );
}

#[test]
fn two_megabyte_upload_with_half_close_is_echoed_back_byte_exact() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().start_ready();
    let echo = Server::echo(&net.peer, net.peer_addr(9000));
    let data = peer::pattern(2 << 20);

    // The client writes everything, then shuts down its write half and reads until the echo
    // server (which half-closes in turn) is done: the proxy must carry the FIN both ways and
    // not lose the bytes still in flight behind it.
    let echoed = peer::echo_exchange(&net.pod, echo.addr(), &data)
        .unwrap_or_else(|e| panic!("echo exchange: {e}\nremora stderr:\n{}", remora.stderr()));

    peer::assert_same_bytes("echoed upload", &data, &echoed);
    assert_eq!(echo.peers().len(), 1, "the echo server saw one connection");
    remora.wait_for_metrics("the upload counted as outbound", METRICS_SETTLE, |m| {
        m.value(OPENED, &[OUTBOUND]) >= 1.0 && m.value(ACTIVE, &[OUTBOUND]) == 0.0
    });
}

#[test]
fn inbound_http_reaches_the_app_from_127_0_0_6_through_the_inbound_listener() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().start_ready();
    let app = Server::http(&net.pod, any_addr(APP_PORT), "hello from the app\n");

    let out = peer::curl(
        &net.peer,
        &[&format!("http://{}/", net.pod_addr(APP_PORT))],
        CURL_TIME,
    );

    let body = curl_ok(&out, "inbound GET");
    assert_eq!(body, "hello from the app\n");
    assert_eq!(
        app.peers().iter().map(SocketAddr::ip).collect::<Vec<_>>(),
        vec![IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6))],
        "the app sees the proxy's inbound passthrough source, not the peer"
    );
    remora.wait_for_metrics("the connection counted as inbound", METRICS_SETTLE, |m| {
        m.value(OPENED, &[INBOUND]) >= 1.0 && m.value(ACTIVE, &[INBOUND]) == 0.0
    });
}

#[test]
fn outbound_traffic_from_the_pod_fails_once_the_proxy_is_killed() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let mut remora = net.remora().start_ready();
    let server = Server::http(&net.peer, net.peer_addr(APP_PORT), "hello\n");
    let url = format!("http://{}/", server.addr());
    curl_ok(
        &peer::curl(&net.pod, &[&url], CURL_TIME),
        "GET with the proxy up",
    );

    remora.kill();

    // The capture rules still send the connection to 15001, where nothing listens any more.
    match peer::connect(&net.pod, server.addr()) {
        Err(e) if matches!(
            e.kind(),
            io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
        ) => {}
        Err(e) => panic!("expected the connection to be refused, got: {e}"),
        Ok(stream) => panic!(
            "a connection from the pod succeeded without the proxy ({:?} -> {:?}); capture rules:\n{}",
            stream.local_addr(),
            stream.peer_addr(),
            net.pod_nat_rules()
        ),
    }
    let out = peer::curl(&net.pod, &[&url], CURL_TIME);
    assert!(!out.status.success(), "curl succeeded without the proxy");
    assert_eq!(
        server.peers().len(),
        1,
        "only the request made through the proxy reached the peer"
    );
}

#[test]
fn capture_without_owner_exclusion_is_stopped_by_the_own_upstream_loop_guard() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    // The injector's rules, but exempting UID/GID 4242 instead of the proxy's 1337: the proxy's
    // own upstream connection is captured again into 15001.
    let mut args: Vec<&str> = DEFAULT_CAPTURE_ARGS.to_vec();
    let uid = args
        .iter()
        .position(|a| *a == "-u")
        .expect("the default args name a UID")
        + 1;
    args[uid] = "4242";
    args.extend(["-g", "4242"]);
    net.capture(&args);
    let remora = net.remora().start_ready();
    let server = Server::http(&net.peer, net.peer_addr(APP_PORT), "hello\n");

    let started = Instant::now();
    // `--fail`: the proxy speaks HTTP here and answers the refused upstream with a 503.
    let out = peer::curl(
        &net.pod,
        &["--fail", &format!("http://{}/", server.addr())],
        CURL_TIME,
    );
    let took = started.elapsed();

    assert!(
        !out.status.success(),
        "the request succeeded although the proxy's upstream is captured; capture rules:\n{}",
        net.pod_nat_rules()
    );
    assert!(
        took < Duration::from_secs(3),
        "the client should fail promptly, took {took:?} (curl: {})",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(server.peers().is_empty(), "nothing should reach the peer");
    let refused = remora.wait_for_metrics("an own_upstream loop refusal", METRICS_SETTLE, |m| {
        m.value(LOOP_REFUSED, &[("guard", "own_upstream")]) >= 1.0
    });
    // No loop: a little later the count of opened connections has not moved and stays small.
    // The client's connection comes back once as a suspect, whose own upstream is refused.
    // Whether an attempt fails as a connect failure (retried by the built-in policy, two
    // retries) or as a reset (not retried) depends on when the refusal's RST lands, so each
    // of the two hops makes one to three attempts: at most 1 + 3 × (1 + 3) = 13 connections.
    std::thread::sleep(Duration::from_millis(500));
    let later = remora.metrics();
    let opened = later.value(OPENED, &[OUTBOUND]);
    assert!(
        opened <= 13.0,
        "{opened} outbound connections opened for one request:\n{later}"
    );
    assert_eq!(
        opened,
        refused.value(OPENED, &[OUTBOUND]),
        "outbound connections kept opening after the refusal:\n{later}"
    );
    assert_eq!(
        remora.readiness(),
        Some(200),
        "remora should still be ready; stderr:\n{}",
        remora.stderr()
    );
}

#[test]
fn sigterm_drains_an_inflight_transfer_serves_new_inbound_told_to_close_and_exits_zero() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let drain = Duration::from_secs(5);
    let mut remora = net
        .remora()
        .config(&format!("drain:\n  duration: {}s\n", drain.as_secs()))
        .start_ready();
    let data: Arc<[u8]> = peer::pattern(4 << 20).into();
    let app = Server::paced(
        &net.pod,
        any_addr(APP_PORT),
        data.clone(),
        Duration::from_millis(1500),
    );
    // The pod's keep-alive HTTP/1.1 application.
    let _web = remora_e2e::backend::start(&net.pod, any_addr(WEB_PORT), "web");
    let service = Server::http(&net.peer, net.peer_addr(APP_PORT), "still here\n");

    // An inbound download, well under way when SIGTERM arrives, and an inbound keep-alive
    // connection that has had one answer.
    let mut download = peer::connect(&net.peer, net.pod_addr(APP_PORT)).expect("inbound connect");
    let mut received = vec![0; 64 << 10];
    download
        .read_exact(&mut received)
        .unwrap_or_else(|e| panic!("first bytes of the download: {e}\n{}", remora.stderr()));
    let mut kept = Client::connect(&net.peer, net.pod_addr(WEB_PORT)).expect("inbound connect");
    let first = kept.get("web", "/", &[]).expect("a keep-alive answer");
    assert_eq!((first.status, first.header("connection")), (200, None));
    remora.terminate();
    let terminated = Instant::now();
    // Signal handling takes a moment: draining has begun once readiness says so.
    let deadline = Instant::now() + Duration::from_secs(3);
    while remora.readiness() != Some(503) {
        assert!(Instant::now() < deadline, "readiness not 503 after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }

    // The keep-alive connection's next answer tells it to go, and it is closed after.
    let told = kept
        .get("web", "/", &[])
        .expect("the next answer on the kept connection");
    assert_eq!(
        (told.status, told.header("connection")),
        (200, Some("close")),
        "{}",
        remora.stderr()
    );
    assert_closed(kept, "the kept connection after its `connection: close`");

    // As Envoy under Istio (`drain_listeners?inboundonly&graceful`), the inbound listener keeps
    // accepting: a client connecting now is served, told to go, and its connection closed.
    let mut late = Client::connect(&net.peer, net.pod_addr(WEB_PORT)).unwrap_or_else(|e| {
        panic!(
            "a new inbound connection while draining: {e}\n{}",
            remora.stderr()
        )
    });
    let answer = late.get("web", "/", &[]).expect("an answer while draining");
    assert_eq!(
        (answer.status, answer.header("connection")),
        (200, Some("close")),
        "{}",
        remora.stderr()
    );
    assert_closed(late, "a connection opened while draining, after its answer");
    // Opaque TCP is not told anything (Envoy's tcp_proxy ignores draining): a new inbound
    // download while draining completes too.
    let late_download = std::thread::scope(|scope| {
        let fetch = scope.spawn(|| {
            let mut s = peer::connect(&net.peer, net.pod_addr(APP_PORT))?;
            let mut got = Vec::new();
            s.read_to_end(&mut got).map(|_| got)
        });
        // Outbound keeps serving while draining.
        let out = peer::curl(
            &net.pod,
            &[&format!("http://{}/", service.addr())],
            CURL_TIME,
        );
        assert_eq!(curl_ok(&out, "outbound GET while draining"), "still here\n");
        fetch.join().expect("the download thread")
    });
    let late_download = late_download.unwrap_or_else(|e| {
        panic!(
            "a download started while draining: {e}\n{}",
            remora.stderr()
        )
    });
    peer::assert_same_bytes("download started while draining", &data, &late_download);

    // The download that was open at SIGTERM completes, byte-exact.
    download
        .read_to_end(&mut received)
        .unwrap_or_else(|e| panic!("rest of the download: {e}\n{}", remora.stderr()));
    peer::assert_same_bytes("download across SIGTERM", &data, &received);
    assert!(app
        .peers()
        .iter()
        .all(|p| p.ip() == IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6))));

    // Served until the end of the drain period, then exit 0.
    assert!(
        terminated.elapsed() < drain,
        "the checks outlasted the drain period"
    );
    let status = remora.wait_exit(Duration::from_secs(15));
    let exited_after = terminated.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "remora should exit 0 at the end of the drain period, got {status:?} after \
         {exited_after:?}; stderr:\n{}",
        remora.stderr()
    );
    assert!(
        exited_after >= drain - Duration::from_millis(100),
        "exited {exited_after:?} after SIGTERM, before the drain period {drain:?}"
    );
}

/// The proxy closed `client`'s connection: a read finds its end.
fn assert_closed(client: Client, what: &str) {
    let mut stream = client.into_inner();
    let mut rest = Vec::new();
    match stream.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "{what}: {} more bytes", rest.len()),
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Istio's `EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true` without `MINIMUM_DRAIN_DURATION`: as
/// pilot-agent, the connections are counted once a second after its default minimum (5 s), and
/// the first count finds none.
#[test]
fn exit_on_zero_active_connections_exits_well_before_the_drain_period() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let mut remora = net
        .remora()
        .config("drain:\n  duration: 60s\n")
        .env("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "true")
        .start_ready();

    remora.terminate();
    let terminated = Instant::now();

    let status = remora.wait_exit(Duration::from_secs(15));
    let exited_after = terminated.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "with no connection open, remora should exit 0 at the first count after pilot-agent's \
         minimum, got {status:?} after {exited_after:?}; stderr:\n{}",
        remora.stderr()
    );
    assert!(
        exited_after >= Duration::from_millis(5900) && exited_after <= Duration::from_secs(8),
        "exited {exited_after:?} after SIGTERM: expected at the count 1 s after the 5 s minimum"
    );
}
