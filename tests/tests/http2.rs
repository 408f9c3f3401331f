//! HTTP/2 stream and connection control through the sidecar, with peers built on the `h2` crate
//! so they can misbehave on purpose: RST_STREAM both ways (a stream reset on one side is reset
//! on the other, and the other streams of the connection carry on) and GOAWAY both ways (an
//! upstream going away finishes what it has in flight and new requests take a new connection;
//! a draining proxy sends GOAWAY to its clients and finishes theirs).

use bytes::Bytes;
use h2::{client, server, Reason, RecvStream};
use http::{Request, Response, StatusCode};
use remora_e2e::peer::any_addr;
use remora_e2e::{Netns, PodNet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// Bound on any one step of a test.
const STEP: Duration = Duration::from_secs(10);
/// The origin's port (not one Istio always treats as TCP: this one is detected).
const ORIGIN_PORT: u16 = 8082;
/// How long the origin takes over `/slow` and `/goaway`.
const SLOW: Duration = Duration::from_millis(700);

/// What the origin saw.
#[derive(Debug, Default)]
struct Seen {
    connections: AtomicUsize,
    /// Streams the client side reset while the origin was answering them.
    resets: AtomicUsize,
    requests: AtomicUsize,
}

/// An h2c origin: `/ok` answers, `/reset` resets the stream before answering, `/reset-mid`
/// resets it half way through the body, `/hang` answers headers and waits for the client to
/// reset the stream, `/test.Echo/Hang` (gRPC) waits for that without answering at all, `/slow`
/// answers after a while, and `/goaway` sends GOAWAY on its connection and then answers after a
/// while.
async fn origin(listener: std::net::TcpListener, seen: Arc<Seen>) {
    listener.set_nonblocking(true).expect("non-blocking");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    while let Ok((socket, _)) = listener.accept().await {
        seen.connections.fetch_add(1, Ordering::SeqCst);
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            let Ok(mut conn) = server::handshake(socket).await else {
                return;
            };
            while let Some(Ok((request, mut respond))) = conn.accept().await {
                seen.requests.fetch_add(1, Ordering::SeqCst);
                let path = request.uri().path().to_string();
                if path == "/goaway" {
                    conn.graceful_shutdown();
                }
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    let ok = || Response::builder().status(200).body(()).expect("response");
                    match path.as_str() {
                        "/reset" => respond.send_reset(Reason::INTERNAL_ERROR),
                        "/reset-mid" => {
                            if let Ok(mut body) = respond.send_response(ok(), false) {
                                let _ = body.send_data(Bytes::from_static(b"partial"), false);
                                tokio::time::sleep(Duration::from_millis(100)).await;
                                body.send_reset(Reason::INTERNAL_ERROR);
                            }
                        }
                        "/test.Echo/Hang" => {
                            // Never answers: only a reset ends it.
                            let reset = std::future::poll_fn(|cx| respond.poll_reset(cx)).await;
                            if reset.is_ok() {
                                seen.resets.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        "/hang" => {
                            if let Ok(mut body) = respond.send_response(ok(), false) {
                                let reset = std::future::poll_fn(|cx| body.poll_reset(cx)).await;
                                if reset.is_ok() {
                                    seen.resets.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                        }
                        _ => {
                            if path == "/slow" || path == "/goaway" {
                                tokio::time::sleep(SLOW).await;
                            }
                            if let Ok(mut body) = respond.send_response(ok(), false) {
                                let _ = body.send_data(Bytes::from(path.into_bytes()), true);
                            }
                        }
                    }
                });
            }
        });
    }
}

/// A prior-knowledge h2c client connection from `ns` to `addr`; the task drives it and ends
/// when the connection does.
async fn connect(ns: &Netns, addr: SocketAddr) -> (client::SendRequest<Bytes>, JoinHandle<()>) {
    let socket = ns.connect(addr, STEP).expect("connect");
    socket.set_nonblocking(true).expect("non-blocking");
    let socket = tokio::net::TcpStream::from_std(socket).expect("tokio stream");
    let (send, conn) = bounded("h2 handshake", client::handshake(socket))
        .await
        .expect("h2 handshake");
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    (send, driver)
}

async fn bounded<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(STEP, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {STEP:?}"))
}

/// Open a GET stream (its request side left open with `open_request`, to reset the stream with
/// later); returns the response head's status, its body, and the request side.
async fn open(
    send: &mut client::SendRequest<Bytes>,
    addr: SocketAddr,
    path: &str,
    open_request: bool,
) -> Result<(StatusCode, RecvStream, h2::SendStream<Bytes>), h2::Error> {
    let request = Request::get(format!("http://{addr}{path}"))
        .body(())
        .expect("request");
    let ready = bounded("stream capacity", send.clone().ready()).await?;
    let mut send_side = ready;
    let (response, stream) = send_side.send_request(request, !open_request)?;
    let response = bounded(path, response).await?;
    let status = response.status();
    Ok((status, response.into_body(), stream))
}

/// The whole body, or the error that ended it.
async fn body(mut body: RecvStream) -> Result<Vec<u8>, h2::Error> {
    let mut all = Vec::new();
    while let Some(chunk) = bounded("body", body.data()).await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        all.extend_from_slice(&chunk);
    }
    Ok(all)
}

/// GET `path` to the end; panics unless it is a 200 with the path as its body.
async fn get_ok(send: &mut client::SendRequest<Bytes>, addr: SocketAddr, path: &str) {
    let (status, recv, _) = open(send, addr, path, false)
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(status, StatusCode::OK, "{path}");
    let got = body(recv).await.unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(got, path.as_bytes(), "{path}");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + STEP;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn rst_stream_crosses_the_proxy_both_ways_and_spares_the_other_streams() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config("access_log:\n  enabled: true\n")
        .start_ready();
    let addr = net.peer_addr(ORIGIN_PORT);
    let listener = net.peer.bind(addr).expect("bind the origin");
    let seen = Arc::new(Seen::default());
    runtime().block_on(async {
        tokio::spawn(origin(listener, Arc::clone(&seen)));
        let (mut send, _driver) = connect(&net.pod, addr).await;

        // A stream held open by the origin while the others come and go.
        let (status, _hang_body, mut hang) =
            open(&mut send, addr, "/hang", true).await.expect("/hang");
        assert_eq!(status, StatusCode::OK);

        // Reset by the upstream before its headers: Envoy's 503 with UR.
        let (status, recv, _) = open(&mut send, addr, "/reset", false)
            .await
            .expect("/reset");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let text = body(recv).await.expect("the 503's body");
        assert!(
            String::from_utf8_lossy(&text).contains("reset reason: remote reset"),
            "{}",
            String::from_utf8_lossy(&text)
        );

        // Reset by the upstream half way through the body: the client's stream is reset too.
        let (status, recv, _) = open(&mut send, addr, "/reset-mid", false)
            .await
            .expect("/reset-mid");
        assert_eq!(status, StatusCode::OK);
        let ended = body(recv).await;
        let e = ended.expect_err("a body reset upstream must not end cleanly downstream");
        assert!(e.is_reset() || e.reason().is_some(), "{e:?}");

        // The connection and its other streams are unaffected.
        get_ok(&mut send, addr, "/ok").await;

        // The client resets its stream: the origin sees its stream reset.
        hang.send_reset(Reason::CANCEL);
        wait_until("the origin never saw the client's RST_STREAM", || {
            seen.resets.load(Ordering::SeqCst) == 1
        })
        .await;
        get_ok(&mut send, addr, "/ok").await;
    });
    remora.wait_for_access_log("\"GET /reset HTTP/2\" 503 UR");
}

#[test]
fn goaway_from_the_upstream_finishes_in_flight_and_moves_new_requests_to_a_new_connection() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().start_ready();
    let addr = net.peer_addr(ORIGIN_PORT);
    let listener = net.peer.bind(addr).expect("bind the origin");
    let seen = Arc::new(Seen::default());
    runtime().block_on(async {
        tokio::spawn(origin(listener, Arc::clone(&seen)));
        let (mut send, _driver) = connect(&net.pod, addr).await;
        get_ok(&mut send, addr, "/ok").await;
        assert_eq!(seen.connections.load(Ordering::SeqCst), 1);

        // The origin sends GOAWAY while this request is in flight, then answers it.
        get_ok(&mut send, addr, "/goaway").await;
        // The next request goes on a new upstream connection, on the same client connection.
        get_ok(&mut send, addr, "/ok").await;
        assert_eq!(
            seen.connections.load(Ordering::SeqCst),
            2,
            "after GOAWAY, a new upstream connection\n{}",
            remora.stderr()
        );
    });
}

#[test]
fn draining_sends_goaway_to_inbound_http2_clients_and_finishes_their_streams() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config("drain:\n  duration: 8s\n")
        .start_ready();
    let listener = net
        .pod
        .bind(any_addr(ORIGIN_PORT))
        .expect("bind the origin");
    let addr = net.pod_addr(ORIGIN_PORT);
    let seen = Arc::new(Seen::default());
    runtime().block_on(async {
        tokio::spawn(origin(listener, Arc::clone(&seen)));
        let (mut send, driver) = connect(&net.peer, addr).await;
        get_ok(&mut send, addr, "/ok").await;

        // SIGTERM while the origin has not answered yet.
        let request = Request::get(format!("http://{addr}/slow"))
            .body(())
            .expect("request");
        let mut ready = bounded("stream capacity", send.clone().ready())
            .await
            .expect("ready");
        let (response, _) = ready.send_request(request, true).expect("send /slow");
        let in_flight = tokio::spawn(async move {
            let response = response.await?;
            assert_eq!(response.status(), StatusCode::OK);
            body(response.into_body()).await
        });
        tokio::time::sleep(SLOW / 4).await;
        remora.terminate();

        // The stream in flight completes, then the proxy closes the connection gracefully,
        // well before the drain period ends.
        let got = bounded("the in-flight body", in_flight)
            .await
            .expect("join")
            .expect("the in-flight stream was cut by the drain");
        assert_eq!(got, b"/slow");
        bounded("the client connection to close after GOAWAY", driver)
            .await
            .expect("join");
        let refused = open(&mut send, addr, "/ok", false).await;
        assert!(refused.is_err(), "a new stream after GOAWAY was accepted");
    });
}

#[test]
fn grpc_timeout_is_answered_deadline_exceeded_by_the_proxy_and_the_upstream_stream_reset() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config("access_log:\n  enabled: true\n")
        .start_ready();
    let addr = net.peer_addr(ORIGIN_PORT);
    let listener = net.peer.bind(addr).expect("bind the origin");
    let seen = Arc::new(Seen::default());
    runtime().block_on(async {
        tokio::spawn(origin(listener, Arc::clone(&seen)));
        let (send, _driver) = connect(&net.pod, addr).await;
        // A client that leaves its deadline to the proxy: it sends grpc-timeout and waits.
        let request = Request::post(format!("http://{addr}/test.Echo/Hang"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("grpc-timeout", "300m")
            .body(())
            .expect("request");
        let mut ready = bounded("stream capacity", send.ready())
            .await
            .expect("ready");
        let started = tokio::time::Instant::now();
        let (response, mut req) = ready.send_request(request, false).expect("send");
        req.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true)
            .expect("an empty message");
        let response = bounded("the proxy's answer", response)
            .await
            .expect("a response, not a reset");
        let took = started.elapsed();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers().get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"4"[..]),
            "DEADLINE_EXCEEDED in a trailers-only response: {:?}",
            response.headers()
        );
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(5),
            "answered after {took:?}"
        );
        wait_until("the upstream stream was not reset at the deadline", || {
            seen.resets.load(Ordering::SeqCst) == 1
        })
        .await;
    });
    remora.wait_for_access_log("/test.Echo/Hang HTTP/2\" 200 UT");
}

#[test]
fn http2_request_headers_over_the_limits_are_431_and_never_forwarded() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config(
            "access_log:\n  enabled: true\nhttp:\n  max_header_bytes: 16384\n  max_headers: 20\n",
        )
        .start_ready();
    let addr = net.peer_addr(ORIGIN_PORT);
    let listener = net.peer.bind(addr).expect("bind the origin");
    let seen = Arc::new(Seen::default());
    runtime().block_on(async {
        tokio::spawn(origin(listener, Arc::clone(&seen)));
        let (send, _driver) = connect(&net.pod, addr).await;
        let many = (0..30).fold(Request::get(format!("http://{addr}/many")), |r, i| {
            r.header(format!("x-h{i}"), "v")
        });
        let big = Request::get(format!("http://{addr}/big")).header("x-big", "b".repeat(20 << 10));
        for (what, request) in [("30 headers", many), ("a 20 KiB header", big)] {
            let mut ready = bounded("stream capacity", send.clone().ready())
                .await
                .expect("ready");
            let (response, _) = ready
                .send_request(request.body(()).expect("request"), true)
                .expect("send");
            let response = bounded(what, response)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                response.status(),
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "{what}"
            );
        }
        // The connection serves on.
        let mut send = send;
        get_ok(&mut send, addr, "/ok").await;
        assert_eq!(
            seen.requests.load(Ordering::SeqCst),
            1,
            "a refused request reached the origin"
        );
    });
    remora.wait_for_access_log("\"GET /many HTTP/2\" 431 DPE");
}

/// nginx ends an HTTP/2 connection after `keepalive_requests` (100 here) requests with a
/// single GOAWAY whose last stream id leaves the streams already on their way unprocessed.
/// Those never reached the application, so they go again on a new connection, and without
/// spending a retry: before that, about 80 of these 600 requests failed with no retry at all,
/// and one in a run of about ten with two retries (refused on three connections in a row).
#[test]
fn streams_an_upstream_goaway_left_unprocessed_are_retried_on_a_new_connection() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    for tool in ["nginx", "h2load"] {
        if !remora_e2e::has_command(tool) {
            remora_e2e::skip::<()>(&format!(
                "{tool} is missing (scripts/install-test-deps installs it)"
            ));
            return;
        }
    }
    net.capture_default();
    // Each failed request is logged at debug: the assertion shows why.
    let remora = net
        .remora()
        .env("REMORA_LOG", "info,remora::http=debug")
        .start_ready();
    let dir = net.binary().make_dir("nginx");
    let conf = dir.join("nginx.conf");
    let origin = net.peer_addr(8446);
    let d = dir.display();
    std::fs::write(
        &conf,
        format!(
            // One process (no master): ending it by PID ends nginx, leaving no worker behind.
            "master_process off;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d};\n  proxy_temp_path {d};\n  \
             fastcgi_temp_path {d};\n  uwsgi_temp_path {d};\n  scgi_temp_path {d};\n  \
             server {{\n    listen {origin} http2;\n    keepalive_requests 100;\n    \
             location / {{ return 200 \"hello\\n\"; }}\n  }}\n}}\n"
        ),
    )
    .expect("write nginx.conf");
    let conf = conf.to_string_lossy().into_owned();
    let _nginx = remora_e2e::service::Service::start(&net.peer, "nginx", &["-c", &conf], origin);
    let mut h2load = net.pod.command("h2load");
    h2load.args([
        "-n",
        "600",
        "-c",
        "2",
        "-m",
        "10",
        &format!("http://{origin}/"),
    ]);
    let out =
        remora_e2e::process::run_bounded(&mut h2load, Duration::from_secs(60)).expect("run h2load");
    let report = String::from_utf8_lossy(&out.stdout);
    let succeeded = report
        .lines()
        .find_map(|l| l.strip_prefix("requests: "))
        .and_then(|l| l.split(", ").find_map(|f| f.strip_suffix(" succeeded")))
        .and_then(|n| n.parse::<u32>().ok());
    assert!(
        succeeded == Some(600),
        "requests failed across the origin's GOAWAYs:\n{report}\n{}",
        remora
            .stderr()
            .lines()
            .filter(|l| l.contains("request failed"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
