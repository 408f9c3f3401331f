//! Upstream connections kept for the next client, end to end: HTTP/1.0 clients' requests on
//! a pooled upstream connection, and a pooled mesh connection the server's sidecar closed
//! replaced rather than used, and an upstream's HTTP/2 stream limit respected, with more
//! connections opened past it. Reuse within one client connection is in `http.rs` and `mtls.rs`.

use remora_e2e::certs::MeshCa;
use remora_e2e::mesh::{client_config, handshakes, server_config, two_pods, SERVER_ID};
use remora_e2e::peer::{self, any_addr, curl_ok};
use remora_e2e::service::http_origin as origin;
use remora_e2e::PodNet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Bound on one client exchange.
const CLIENT_TIME: Duration = Duration::from_secs(20);
/// Bound on a counter catching up with the traffic.
const METRICS_TIME: Duration = Duration::from_secs(5);
const HTTP_PORT: u16 = 8080;

/// HTTP/1.0 clients (one connection per request, as `ab` and many scripts send them) are
/// served upstream in HTTP/1.1, as Envoy's upstream codec always speaks: the upstream
/// connection stays pooled for the next client instead of closing after each request. The
/// client is still answered in HTTP/1.0: a chunked answer reaches it close-delimited, whole.
#[test]
fn http_1_0_clients_share_a_pooled_upstream_connection_and_get_1_0_answers() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().start_ready();
    let _origin = origin(&net.peer, net.peer_addr(HTTP_PORT));
    let base = format!("http://{}", net.peer_addr(HTTP_PORT));
    let http10 = |path: &str| {
        let out = peer::curl(
            &net.pod,
            &["-s", "--http1.0", &format!("{base}{path}")],
            CLIENT_TIME,
        );
        curl_ok(&out, &format!("HTTP/1.0 GET {path}"))
    };
    let before = http10("/connections");
    for _ in 0..3 {
        assert_eq!(http10("/hello"), "hello\n");
    }
    let after = http10("/connections");
    assert_eq!(
        after,
        before,
        "four HTTP/1.0 client connections opened upstream connections of their own; {}",
        remora.stderr()
    );

    let size = 100_000;
    let out = peer::curl(
        &net.pod,
        &[
            "-s",
            "--http1.0",
            "-o",
            "/dev/null",
            "-w",
            "%{http_version} %{size_download}",
            &format!("{base}/download?size={size}&chunked=1"),
        ],
        CLIENT_TIME,
    );
    assert_eq!(
        curl_ok(&out, "a chunked answer to an HTTP/1.0 client"),
        format!("1 {size}"),
        "the answer was not HTTP/1.0 with the whole body"
    );
}

/// A pooled mesh connection that the server's sidecar closed while it sat idle (here: that
/// sidecar was killed and started again) is not used again: the next client's request goes on
/// a new mesh connection and is answered. A POST, which is not repeated on another connection
/// once sent, would come back 503 had it gone on the dead one.
#[test]
fn a_pooled_mesh_connection_the_server_closed_is_replaced() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let ca = MeshCa::new("cluster.local");
    let (server_dir, client_dir) = two_pods(&net, &ca);
    let server_yaml = server_config(&server_dir, "permissive");
    let mut server = net.remora().config(&server_yaml).start_ready();
    let client = net
        .peer_remora()
        .config(&client_config(&client_dir, net.pod_ip, SERVER_ID))
        .start_ready();
    let _http = origin(&net.pod, any_addr(HTTP_PORT));
    let url = format!("http://{}/headers", net.pod_addr(HTTP_PORT));
    let ended = |m: &remora_e2e::metrics::Metrics| {
        m.value("remora_connections_active", &[("direction", "outbound")]) == 0.0
    };

    let (status, body) = peer::curl_status(&net.peer, &["-s", &url], CLIENT_TIME);
    assert_eq!(status, 200, "first request: {body}");
    client.wait_for_metrics("the first client connection ended", METRICS_TIME, ended);
    let before = handshakes(&client, "outbound", "ok");

    server.kill();
    let server = net.remora().config(&server_yaml).start_ready();
    let upload = format!("http://{}/upload", net.pod_addr(HTTP_PORT));
    let (status, body) = peer::curl_status(
        &net.peer,
        &[
            "-s",
            "-X",
            "POST",
            "--data-binary",
            "not repeatable",
            &upload,
        ],
        CLIENT_TIME,
    );
    assert_eq!(
        (status, body.trim()),
        (
            200,
            "14 09a76f0aa82f14198b0536a803cc121daac8c905203a2a5ff248069211a60c46"
        ),
        "the POST after the server's sidecar restarted\nclient sidecar:\n{}\nserver sidecar:\n{}",
        client.stderr(),
        server.stderr()
    );
    assert_eq!(
        handshakes(&client, "outbound", "ok"),
        before + 1.0,
        "the dead pooled connection was not replaced by one new mesh connection"
    );
}

/// The origin's HTTP/2 port, declared `http2`.
const H2_PORT: u16 = 8082;
/// The streams the HTTP/2 origin takes at once per connection (SETTINGS_MAX_CONCURRENT_STREAMS).
const ORIGIN_STREAM_LIMIT: u32 = 2;
/// How long the origin holds each stream before answering.
const ORIGIN_HOLD: Duration = Duration::from_millis(300);

/// Streams the origin holds now and held at most at once, on any one connection.
#[derive(Debug, Default)]
struct StreamCounts {
    connections: AtomicUsize,
    most_at_once: AtomicUsize,
    answered: AtomicUsize,
}

/// An h2c origin that advertises [`ORIGIN_STREAM_LIMIT`] and answers each stream after
/// [`ORIGIN_HOLD`], counting how many streams each connection carried at once.
async fn limited_origin(listener: std::net::TcpListener, counts: Arc<StreamCounts>) {
    listener.set_nonblocking(true).expect("non-blocking");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    while let Ok((socket, _)) = listener.accept().await {
        counts.connections.fetch_add(1, Ordering::SeqCst);
        let counts = Arc::clone(&counts);
        tokio::spawn(async move {
            let mut builder = h2::server::Builder::new();
            builder.max_concurrent_streams(ORIGIN_STREAM_LIMIT);
            let Ok(mut conn) = builder.handshake(socket).await else {
                return;
            };
            let at_once = Arc::new(AtomicUsize::new(0));
            while let Some(Ok((_, mut respond))) = conn.accept().await {
                let now = at_once.fetch_add(1, Ordering::SeqCst) + 1;
                counts.most_at_once.fetch_max(now, Ordering::SeqCst);
                let (counts, at_once) = (Arc::clone(&counts), Arc::clone(&at_once));
                tokio::spawn(async move {
                    tokio::time::sleep(ORIGIN_HOLD).await;
                    at_once.fetch_sub(1, Ordering::SeqCst);
                    let ok = http::Response::builder().status(200).body(());
                    if let Ok(mut body) = respond.send_response(ok.expect("response"), false) {
                        let _ = body.send_data(bytes::Bytes::from_static(b"ok"), true);
                        counts.answered.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
    }
}

/// An upstream that takes two streams at a time on a connection (its SETTINGS) gets no more
/// on any of the proxy's HTTP/2 connections, however many the client sends at once: the
/// requests past the limit go on other connections (as Envoy's pool opens another when every
/// connection is at its peer's limit), none is refused, and every one is answered.
#[test]
fn an_upstream_http2_stream_limit_is_respected_and_every_request_answered() {
    let Some(counts) = burst(true) else { return };
    // Eight at once cannot all go on one connection taking two.
    assert!(
        counts.connections >= REQUESTS / ORIGIN_STREAM_LIMIT as usize,
        "{} connections",
        counts.connections
    );
}

/// A cold burst on a port declared `http2` (no xDS) opens the connections the origin's
/// stream limit requires, one after another, not one per request: a request that finds no
/// room while another opens a connection waits for that one, as a routed request does.
#[test]
fn a_cold_http2_burst_without_xds_dials_per_stream_limit_not_per_request() {
    let Some(counts) = burst(false) else { return };
    assert!(
        counts.connections <= REQUESTS.div_ceil(ORIGIN_STREAM_LIMIT as usize),
        "{} upstream connections for {REQUESTS} requests to an origin taking \
         {ORIGIN_STREAM_LIMIT} at a time",
        counts.connections
    );
}

/// Requests sent at once by [`burst`].
const REQUESTS: usize = 8;

/// What the origin saw of a burst.
struct Seen {
    connections: usize,
}

/// [`REQUESTS`] requests at once over one client HTTP/2 connection to the origin behind a
/// port declared `http2`, after one request alone if `warm`; every one must be answered 200,
/// none past the origin's limit on a connection, and each reach the origin once.
fn burst(warm: bool) -> Option<Seen> {
    let net = PodNet::create_or_skip()?;
    net.capture_default();
    let _remora = net
        .remora()
        .config(&format!("ports:\n  {H2_PORT}: http2\n"))
        .start_ready();
    let counts = Arc::new(StreamCounts::default());
    let listener = net
        .peer
        .bind(net.peer_addr(H2_PORT))
        .expect("bind the origin");
    let origin_counts = Arc::clone(&counts);
    std::thread::spawn(move || runtime().block_on(limited_origin(listener, origin_counts)));
    let dst = net.peer_addr(H2_PORT);
    let socket = net.pod.connect(dst, CLIENT_TIME).expect("connect");
    socket.set_nonblocking(true).expect("non-blocking");
    let (statuses, took) = runtime().block_on(async move {
        let socket = tokio::net::TcpStream::from_std(socket).expect("tokio stream");
        let (send, conn) = h2::client::handshake(socket).await.expect("handshake");
        tokio::spawn(conn);
        if warm {
            // One request first, so that the proxy has its upstream connection pooled and
            // shares it with the requests that follow.
            let mut first = send.clone().ready().await.expect("ready");
            let request = http::Request::get(format!("http://{dst}/first"))
                .body(())
                .expect("request");
            let (response, _) = first.send_request(request, true).expect("send");
            let response = tokio::time::timeout(CLIENT_TIME, response).await;
            assert_eq!(response.expect("in time").expect("response").status(), 200);
        }
        let started = std::time::Instant::now();
        let requests = (0..REQUESTS).map(|i| {
            let send = send.clone();
            tokio::spawn(async move {
                let mut send = send.ready().await.expect("ready");
                let request = http::Request::get(format!("http://{dst}/{i}"))
                    .body(())
                    .expect("request");
                let (response, _) = send.send_request(request, true).expect("send");
                let response = tokio::time::timeout(CLIENT_TIME, response).await;
                response
                    .expect("answered in time")
                    .expect("response")
                    .status()
            })
        });
        let mut statuses = Vec::new();
        for r in requests.collect::<Vec<_>>() {
            statuses.push(r.await.expect("request task"));
        }
        (statuses, started.elapsed())
    });
    let [connections, most, answered] =
        [&counts.connections, &counts.most_at_once, &counts.answered]
            .map(|c| c.load(Ordering::SeqCst));
    eprintln!(
        "{REQUESTS} requests at once ({}) to an origin taking {ORIGIN_STREAM_LIMIT} streams \
         at a time: {statuses:?} in {took:?}; {connections} upstream connection(s), at most \
         {most} streams at once on one, {answered} answered",
        if warm { "warm" } else { "cold" }
    );
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert!(
        most <= ORIGIN_STREAM_LIMIT as usize,
        "{most} streams at once"
    );
    assert_eq!(
        answered,
        REQUESTS + usize::from(warm),
        "each request reached the origin once"
    );
    Some(Seen { connections })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}
