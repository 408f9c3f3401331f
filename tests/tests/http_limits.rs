//! HTTP/1.1 limits through the sidecar, with a raw TCP client (curl will not misbehave on
//! purpose): request header size and count answered 431 and never forwarded; the header read
//! timeout cutting a slowloris client with a 408 while idle keep-alive connections live by
//! `http.idle_timeout` alone.

use remora_e2e::peer;
use remora_e2e::service::http_origin;
use remora_e2e::PodNet;
use std::io::{self, Read, Write};
use std::net::TcpStream;
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

fn requests_served(net: &PodNet) -> String {
    let out = peer::curl(
        &net.pod,
        &[&format!("http://{}/requests", net.peer_addr(ORIGIN_PORT))],
        Duration::from_secs(20),
    );
    peer::curl_ok(&out, "requests")
}

#[test]
fn request_header_size_and_count_over_the_limits_are_431_and_never_forwarded() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config("http:\n  max_header_bytes: 16384\n  max_headers: 20\n")
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
fn idle_keep_alive_outlives_the_header_read_timeout_and_a_slowloris_head_is_cut_with_408() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config("http:\n  header_read_timeout: 1s\n  idle_timeout: 3s\n")
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
            return;
        }
    }
    panic!(
        "a slowloris head ({writes} lines) was not cut within 8 s\n{}",
        remora.stderr()
    );
}
