//! What the sidecar refuses of HTTP/1.1, with a raw TCP client (curl will not misbehave on
//! purpose): malformed framing answered 400 `DPE` and never forwarded, both ways; request
//! header size and count answered 431 and never forwarded; the header read timeout cutting a
//! slowloris client with a 408 while idle keep-alive connections live by `http.idle_timeout`
//! alone.

use remora_e2e::peer::{self, any_addr};
use remora_e2e::service::http_origin;
use remora_e2e::{Netns, PodNet};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The origin's port on the peer.
const ORIGIN_PORT: u16 = 8080;

/// Send `request` and read everything until the proxy closes. The proxy may answer and close
/// before it has read all of an oversized head, so a failed write is not the test's failure:
/// the answer it wrote first is still there to read.
fn exchange(stream: &mut TcpStream, request: &[u8]) -> String {
    let _ = stream.write_all(request);
    let mut response = Vec::new();
    let _ = stream.take(1 << 16).read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

/// Read one response to a GET whose body is `Content-Length` bytes; returns its head and body.
fn read_response(stream: &mut TcpStream) -> io::Result<(String, String)> {
    let head = peer::read_request_head(stream)?;
    let head = String::from_utf8_lossy(&head).into_owned();
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    stream.read_exact(&mut body)?;
    Ok((head, String::from_utf8_lossy(&body).into_owned()))
}

/// How many requests reached the origin at `addr`, asked from `ns`.
fn requests_at(ns: &Netns, addr: SocketAddr) -> String {
    let out = peer::curl(
        ns,
        &[&format!("http://{addr}/requests")],
        Duration::from_secs(20),
    );
    peer::curl_ok(&out, "requests")
}

fn requests_served(net: &PodNet) -> String {
    requests_at(&net.pod, net.peer_addr(ORIGIN_PORT))
}

/// Every malformed shape the issue names, sent from `client` to the origin at `dst` (which
/// `origin_ns` can reach as `origin`); each must be answered 400 and none reach the origin.
fn assert_malformed_refused(
    remora: &remora_e2e::Remora,
    client: &Netns,
    dst: SocketAddr,
    (origin_ns, origin): (&Netns, SocketAddr),
    tag: &str,
) {
    let cases = [
        ("differing Content-Lengths", "POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd".to_string()),
        ("gzip transfer-encoding", "POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n".to_string()),
        ("gzip, chunked", "POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n".to_string()),
        ("obs-fold", "GET /hello HTTP/1.1\r\nHost: a\r\nX-Folded: one\r\n two\r\n\r\n".to_string()),
        ("invalid header name", "GET /hello HTTP/1.1\r\nHost: a\r\nBad Header: x\r\n\r\n".to_string()),
        ("no Host", "GET /hello HTTP/1.1\r\nAccept: */*\r\n\r\n".to_string()),
        ("Content-Length and Transfer-Encoding", format!("POST /{tag}-cl-te HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")),
        ("Transfer-Encoding and Content-Length", format!("POST /{tag}-te-cl HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n")),
    ];
    for (what, request) in &cases {
        let mut stream = peer::connect(client, dst).expect("connect");
        let response = exchange(&mut stream, request.as_bytes());
        assert!(
            response.starts_with("HTTP/1.1 400"),
            "{tag} {what}: expected 400, got {response:?}"
        );
    }
    // The smuggling shape hyper alone would accept is refused after a well-formed request on
    // the same connection too, and the body of that first request (which looks like a head
    // with both headers) is not mistaken for one.
    let body = "GET /x HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n";
    let mut stream = peer::connect(client, dst).expect("connect");
    let request = format!(
        "POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n{body}\
         POST /{tag}-second HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\
         Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        body.len()
    );
    let response = exchange(&mut stream, request.as_bytes());
    assert!(response.starts_with("HTTP/1.1 200"), "{tag}: {response:?}");
    assert!(
        response.contains(&format!("\r\n\r\n{} ", body.len())),
        "{tag}: the first request's body should reach the origin whole: {response:?}"
    );
    assert!(
        response.contains("HTTP/1.1 400 Bad Request\r\n"),
        "{tag}: the second request should be refused: {response:?}"
    );
    for path in ["cl-te", "te-cl", "second"] {
        remora.wait_for_access_log(&format!("\"POST /{tag}-{path} HTTP/1.1\" 400 DPE"));
    }
    // Heads hyper refused itself are logged as Envoy logs a codec error.
    remora.wait_for_access_log("\"- - HTTP/1.1\" 400 DPE");
    // Only the one well-formed upload reached the origin.
    assert_eq!(
        requests_at(origin_ns, origin),
        "1",
        "{tag}: {}",
        remora.stdout()
    );
}

#[test]
fn malformed_requests_are_answered_400_and_never_forwarded() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config("access_log:\n  enabled: true\n")
        .start_ready();
    let outbound = net.peer_addr(ORIGIN_PORT);
    let _outbound = http_origin(&net.peer, outbound);
    assert_malformed_refused(&remora, &net.pod, outbound, (&net.pod, outbound), "out");
    let _inbound = http_origin(&net.pod, any_addr(ORIGIN_PORT));
    let inbound = net.pod_addr(ORIGIN_PORT);
    assert_malformed_refused(&remora, &net.peer, inbound, (&net.peer, inbound), "in");
    // Istio's metrics, from each side's point of view, carry the flag.
    let m = remora.metrics();
    for reporter in ["source", "destination"] {
        let labels = [
            ("response_flags", "DPE"),
            ("response_code", "400"),
            ("reporter", reporter),
        ];
        // Seven malformed heads and one malformed request after a good one: those hyper
        // refuses itself are counted too.
        assert!(
            m.value("istio_requests_total", &labels) >= 8.0,
            "{reporter}: {m}"
        );
    }
}

#[test]
fn request_header_size_and_count_over_the_limits_are_431_and_never_forwarded() {
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
    let _origin = http_origin(&net.peer, net.peer_addr(ORIGIN_PORT));
    let dst = net.peer_addr(ORIGIN_PORT);
    let head = |headers: &str| format!("GET /hello HTTP/1.1\r\nHost: a\r\n{headers}\r\n");

    let big = format!("X-Big: {}\r\n", "b".repeat(20 << 10));
    let many: String = (0..30).map(|i| format!("X-H{i}: v\r\n")).collect();
    for (what, request) in [("20 KiB header", head(&big)), ("30 headers", head(&many))] {
        let mut stream = peer::connect(&net.pod, dst).expect("connect");
        let response = exchange(&mut stream, request.as_bytes());
        assert!(
            response.starts_with("HTTP/1.1 431"),
            "{what}: expected 431, got {response:?}\n{}",
            remora.stderr()
        );
    }
    assert_eq!(
        requests_served(&net),
        "0",
        "a refused request reached the origin"
    );
    let too_large = [("response_flags", "DPE"), ("response_code", "431")];
    let m = remora.metrics();
    assert_eq!(m.value("istio_requests_total", &too_large), 2.0, "{m}");
    remora.wait_for_access_log("\"- - HTTP/1.1\" 431 DPE");

    // Just under both limits: served, so the limits are the configured ones.
    let fits = format!("X-Big: {}\r\n", "b".repeat(12 << 10));
    let fits: String = fits
        + &(0..15)
            .map(|i| format!("X-H{i}: v\r\n"))
            .collect::<String>();
    let mut stream = peer::connect(&net.pod, dst).expect("connect");
    stream
        .write_all(head(&fits).as_bytes())
        .expect("send a head under the limits");
    let (head, body) = read_response(&mut stream).expect("a response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, "hello\n");
    assert_eq!(requests_served(&net), "1");
}

#[test]
fn an_idle_inbound_keep_alive_connection_is_answered_once_more_with_close_while_draining() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config("drain:\n  duration: 30s\n")
        .start_ready();
    let _app = http_origin(&net.pod, any_addr(ORIGIN_PORT));
    let get = b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n";
    let mut stream = peer::connect(&net.peer, net.pod_addr(ORIGIN_PORT)).expect("connect");
    stream.write_all(get).expect("first request");
    let (head, _) = read_response(&mut stream).expect("first response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );

    remora.terminate();
    let terminated = Instant::now();
    while remora.readiness() != Some(503) && terminated.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(remora.readiness(), Some(503), "readiness while draining");
    // Idle at SIGTERM, the connection was kept: its next request is served and told to close.
    stream.write_all(get).expect("request while draining");
    let (head, body) = read_response(&mut stream).unwrap_or_else(|e| {
        panic!(
            "no answer on a keep-alive connection while draining ({e})\n{}",
            remora.stderr()
        )
    });
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    assert_eq!(body, "hello\n");
    let mut rest = Vec::new();
    let end = stream.read_to_end(&mut rest);
    assert!(matches!(end, Ok(0)), "after the close response: {end:?}");
}

#[test]
fn idle_keep_alive_outlives_the_header_read_timeout_and_a_slowloris_head_is_cut_with_408() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config(
            "access_log:\n  enabled: true\nhttp:\n  header_read_timeout: 1s\n  idle_timeout: 3s\n",
        )
        .start_ready();
    let _origin = http_origin(&net.peer, net.peer_addr(ORIGIN_PORT));
    let dst = net.peer_addr(ORIGIN_PORT);
    let get = b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n";

    // A keep-alive connection idle for twice the header read timeout still serves.
    let mut stream = peer::connect(&net.pod, dst).expect("connect");
    stream.write_all(get).expect("first request");
    let (head, _) = read_response(&mut stream).expect("first response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    std::thread::sleep(Duration::from_secs(2));
    stream.write_all(get).expect("second request");
    let (head, body) = read_response(&mut stream).unwrap_or_else(|e| {
        panic!(
            "no answer after 2 s idle ({e}): the header read timeout cut a keep-alive \
             connection\n{}",
            remora.stderr()
        )
    });
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, "hello\n");
    // And the idle timeout does close it (after one to two times its 3 s).
    let idle_since = Instant::now();
    let mut rest = Vec::new();
    let read = stream.read_to_end(&mut rest);
    let idle_for = idle_since.elapsed();
    assert!(
        matches!(read, Ok(0)) && idle_for >= Duration::from_secs(2),
        "idle connection: {read:?} after {idle_for:?}"
    );

    // A head that trickles in, a line at a time, is cut about 1 s after its first byte, with a
    // 408, even though bytes keep arriving.
    let mut slow = peer::connect(&net.pod, dst).expect("connect");
    let started = Instant::now();
    slow.write_all(b"GET /hello HTTP/1.1\r\nHost: a\r\n")
        .expect("first line");
    let mut writes = 0;
    // Lines go out half way between multiples of 200 ms, so none races the cut at 1 s: a line
    // that arrives as the proxy closes makes the close a reset, which can cost the 408.
    std::thread::sleep(Duration::from_millis(100));
    while started.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_millis(200));
        if slow
            .write_all(format!("X-{writes}: v\r\n").as_bytes())
            .is_err()
        {
            break;
        }
        writes += 1;
        let mut probe = [0u8; 1];
        slow.set_nonblocking(true).expect("non-blocking");
        let probed = slow.read(&mut probe);
        slow.set_nonblocking(false).expect("blocking");
        let mut response = match probed {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Ok(n) => probe[..n].to_vec(),
            Err(_) => Vec::new(),
        };
        {
            let _ = slow.read_to_end(&mut response);
            let took = started.elapsed();
            let response = String::from_utf8_lossy(&response);
            assert!(response.starts_with("HTTP/1.1 408"), "{response:?}");
            assert!(
                took >= Duration::from_millis(800) && took < Duration::from_secs(5),
                "cut after {took:?}"
            );
            assert_eq!(requests_served(&net), "2");
            remora.wait_for_access_log("\"- - HTTP/1.1\" 408 - ");
            return;
        }
    }
    panic!(
        "a slowloris head ({writes} lines) was not cut within 8 s\n{}",
        remora.stderr()
    );
}
