//! Request smuggling and request hygiene, raw bytes from a client through the sidecar to an
//! origin that records exactly what it receives: each shape is either refused (400 and the
//! connection closed, nothing forwarded) or reaches the origin as exactly the requests the
//! client meant, each normalised (CRLF lines, no folded or spaced header names, one framing).
//! Run on the HTTP/1.1 fast path and on hyper's path (`http.fast_path: false`).

#[path = "smuggling/origin.rs"]
mod origin;

use origin::{record, Received, Record};
use remora_e2e::peer;
use remora_e2e::{PodNet, Remora};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const ORIGIN_PORT: u16 = 8080;
/// How long a silent connection is waited on before its answers are taken as complete.
const QUIET: Duration = Duration::from_millis(700);

/// Send `bytes`, then read what comes back until the proxy closes or goes quiet; returns the
/// answers and whether the connection was closed.
fn exchange(net: &PodNet, to: SocketAddr, bytes: &[u8]) -> (String, bool) {
    let mut stream = peer::connect(&net.pod, to).expect("connect through the proxy");
    let _ = stream.write_all(bytes);
    stream
        .set_read_timeout(Some(QUIET))
        .expect("a read timeout");
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    let closed = loop {
        match stream.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
        if Instant::now() > deadline {
            break false;
        }
    };
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

/// What a shape must come to.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// 400 and the connection closed; nothing reaches the origin.
    Refused,
    /// Exactly these request lines reach the origin, each normalised; or (when `refusable`)
    /// it is refused as above.
    Requests(&'static [&'static str], bool),
    /// Refused, or cut: the origin may see the head, never a request it did not send
    /// whole, and nothing after the bad bytes.
    NoSmuggle,
}
use Expect::*;

const POST: &[&str] = &["POST /a HTTP/1.1"];
const GET: &[&str] = &["GET /a HTTP/1.1"];

/// The shapes, as (what, raw request bytes, expectation).
fn shapes() -> Vec<(&'static str, String, Expect)> {
    let h = "Host: origin\r\n";
    let smuggled = "GET /smuggled HTTP/1.1\r\nHost: origin\r\n\r\n";
    vec![
        // Transfer-Encoding and its obfuscations.
        ("TE chunked, valid", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), Requests(POST, false)),
        ("TE Chunked (case)", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), Requests(POST, true)),
        ("TE with a tab", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding:\tchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), Requests(POST, true)),
        ("TE xchunked", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n{smuggled}"), Refused),
        ("TE chunked, identity", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n{smuggled}"), Refused),
        ("TE twice", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n{smuggled}"), Refused),
        ("TE quoted", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: \"chunked\"\r\n\r\n5\r\nhello\r\n0\r\n\r\n{smuggled}"), Refused),
        ("TE space before colon", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\nhello"), Refused),
        ("TE folded", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding:\r\n chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), Refused),
        ("TE with Content-Length", format!("POST /a HTTP/1.1\r\n{h}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), Refused),
        ("TE on HTTP/1.0", format!("POST /a HTTP/1.0\r\n{h}Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello"), Refused),
        // Content-Length.
        ("CL twice, equal", format!("POST /a HTTP/1.1\r\n{h}Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello"), Requests(POST, true)),
        ("CL twice, different", format!("POST /a HTTP/1.1\r\n{h}Content-Length: 5\r\nContent-Length: 0\r\n\r\nhello"), Refused),
        ("CL list", format!("POST /a HTTP/1.1\r\n{h}Content-Length: 0, 5\r\n\r\nhello"), Refused),
        ("CL signed", format!("POST /a HTTP/1.1\r\n{h}Content-Length: +5\r\n\r\nhello"), Refused),
        ("CL hex", format!("POST /a HTTP/1.1\r\n{h}Content-Length: 0x5\r\n\r\nhello"), Refused),
        ("CL negative", format!("POST /a HTTP/1.1\r\n{h}Content-Length: -1\r\n\r\n{smuggled}"), Refused),
        ("CL overflowing", format!("POST /a HTTP/1.1\r\n{h}Content-Length: 99999999999999999999\r\n\r\nhello"), Refused),
        // Line endings and header syntax.
        ("bare LF everywhere", format!("GET /a HTTP/1.1\n{}\n\n", h.trim_end()), Requests(GET, true)),
        ("bare CR in a header", format!("GET /a HTTP/1.1\r\n{h}X-A: one\rX-B: two\r\n\r\n"), Refused),
        ("bare CR ending a header", format!("GET /a HTTP/1.1\r\n{h}X-A: one\r\r\n\r\n"), Refused),
        ("space before colon", format!("GET /a HTTP/1.1\r\n{h}X-A : one\r\n\r\n"), Refused),
        ("obs-fold", format!("GET /a HTTP/1.1\r\n{h}X-A: one\r\n two\r\n\r\n"), Refused),
        ("NUL in a value", format!("GET /a HTTP/1.1\r\n{h}X-A: o\0ne\r\n\r\n"), Refused),
        // Chunked bodies.
        ("chunk size negative", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n{smuggled}"), NoSmuggle),
        ("chunk size 0x", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n{smuggled}"), NoSmuggle),
        ("chunk size overflowing", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n10000000000000005\r\nhello\r\n0\r\n\r\n{smuggled}"), NoSmuggle),
        ("chunk size with a space", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n5 5\r\nhello\r\n0\r\n\r\n{smuggled}"), NoSmuggle),
        ("chunk data longer than its size", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n{smuggled}"), NoSmuggle),
        ("chunk extension", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n5;name=value\r\nhello\r\n0\r\n\r\n"), Requests(POST, true)),
        ("chunk extension with a bare LF", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n5;a\nb\r\nhello\r\n0\r\n\r\n{smuggled}"), NoSmuggle),
        ("chunk extension with a bare CR", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n5;a\rb\r\nhello\r\n0\r\n\r\n{smuggled}"), NoSmuggle),
        ("chunk size line ending in a bare LF", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n{smuggled}"), NoSmuggle),
        // Pipelining behind a body: both requests, each whole.
        ("pipelined behind a sized body", format!("POST /a HTTP/1.1\r\n{h}Content-Length: 5\r\n\r\nhelloGET /second HTTP/1.1\r\n{h}\r\n"), Requests(&["POST /a HTTP/1.1", "GET /second HTTP/1.1"], false)),
        ("pipelined behind a chunked body", format!("POST /a HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /second HTTP/1.1\r\n{h}\r\n"), Requests(&["POST /a HTTP/1.1", "GET /second HTTP/1.1"], false)),
        // A fragment in the target: stripped, as Envoy strips it under Istio's bootstrap
        // (`http_reject_path_with_fragment` off); the request behind it is a pipelined one.
        // Escaped, `#` is a path's.
        ("fragment", format!("GET /a#frag HTTP/1.1\r\n{h}\r\n"), Requests(GET, false)),
        ("fragment after a query", format!("GET /a?q=1#frag HTTP/1.1\r\n{h}\r\n{smuggled}"), Requests(&["GET /a?q=1 HTTP/1.1", "GET /smuggled HTTP/1.1"], false)),
        ("escaped #", format!("GET /a%23b HTTP/1.1\r\n{h}\r\n"), Requests(&["GET /a%23b HTTP/1.1"], false)),
        // Upgrades: h2c is not the proxy's to hand to the origin.
        ("Upgrade: h2c", format!("GET /a HTTP/1.1\r\n{h}Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"), Requests(GET, true)),
    ]
}

/// Whether a head the origin received is normalised: what the strict parser took, and no
/// hop-by-hop upgrade to h2c.
fn normalised(head: &str) -> Result<(), String> {
    let lower = head.to_ascii_lowercase();
    if lower.contains("upgrade: h2c") || lower.contains("http2-settings") {
        return Err("an h2c upgrade reached the origin".into());
    }
    Ok(())
}

fn check(net: &PodNet, remora: &Remora<'_>, rec: &Record, tag: &str) {
    let to = net.peer_addr(ORIGIN_PORT);
    let mut failures = Vec::new();
    for (what, bytes, expect) in shapes() {
        let before = record(rec).requests.len();
        let (answer, closed) = exchange(net, to, bytes.as_bytes());
        // The origin's side of it may still be arriving.
        std::thread::sleep(Duration::from_millis(100));
        let got: Vec<Received> = record(rec).requests[before..].to_vec();
        let lines: Vec<&str> = got
            .iter()
            .map(|r| r.head.split("\r\n").next().unwrap_or_default())
            .collect();
        let refused = answer.starts_with("HTTP/1.1 400") && closed && got.is_empty();
        let outcome = format!("answer {answer:?} closed {closed}; origin got {got:?}");
        let ok = match expect {
            Refused => refused,
            Requests(want, refusable) => {
                (refusable && refused)
                    || (lines == want
                        && got.iter().all(|r| normalised(&r.head).is_ok())
                        && answer.matches("HTTP/1.1 200 OK").count() == want.len())
            }
            NoSmuggle => {
                lines.iter().all(|l| !l.contains("/smuggled"))
                    && got.iter().all(|r| r.body.is_empty() || r.body == b"hello")
                    && !answer
                        .contains("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200")
            }
        };
        eprintln!("{tag} {what}: {}", if ok { "ok" } else { "FAILED" });
        if !ok {
            failures.push(format!("{tag} {what} (expected {expect:?}): {outcome}"));
        }
    }
    let garbage = &record(rec).garbage;
    assert!(
        failures.is_empty(),
        "{}\norigin garbage: {garbage:?}\n{}",
        failures.join("\n"),
        remora.stderr()
    );
}

fn run(fast_path: bool) {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config(&format!(
            "access_log:\n  enabled: true\nhttp:\n  fast_path: {fast_path}\n  retries: 0\n"
        ))
        .start_ready();
    let rec = origin::spawn(&net, net.peer_addr(ORIGIN_PORT));
    let tag = if fast_path { "fast path" } else { "hyper" };
    check(&net, &remora, &rec, tag);
    refused_websocket_upgrade_leaves_an_http_connection(&net, &remora, &rec, tag);
    cookies_over_the_header_limits_never_reach_the_origin(&net, &rec, tag);
}

/// HTTP/1.1's side of the cookie-crumb limits: many `Cookie` lines count one each against
/// `http.max_headers`, and their bytes against `http.max_header_bytes`.
fn cookies_over_the_header_limits_never_reach_the_origin(net: &PodNet, rec: &Record, tag: &str) {
    let to = net.peer_addr(ORIGIN_PORT);
    let many: String = (0..150).map(|i| format!("Cookie: c{i}=v\r\n")).collect();
    let big: String = (0..100)
        .map(|i| format!("Cookie: c{i}={}\r\n", "k".repeat(700)))
        .collect();
    for (what, cookies) in [("150 Cookie lines", many), ("70 KiB of Cookie lines", big)] {
        let before = record(rec).requests.len();
        let bytes = format!("GET /cookies HTTP/1.1\r\nHost: origin\r\n{cookies}\r\n");
        let (answer, closed) = exchange(net, to, bytes.as_bytes());
        assert!(
            answer.starts_with("HTTP/1.1 431") && closed,
            "{tag} {what}: {answer:?}"
        );
        assert_eq!(
            record(rec).requests.len(),
            before,
            "{tag} {what}: forwarded"
        );
    }
}

/// The origin refuses a WebSocket upgrade (403): the connection is still HTTP/1.1, so what
/// the client sends next is a request the proxy parses, checks and logs, not tunnelled bytes.
fn refused_websocket_upgrade_leaves_an_http_connection(
    net: &PodNet,
    remora: &Remora<'_>,
    rec: &Record,
    tag: &str,
) {
    let to = net.peer_addr(ORIGIN_PORT);
    let before = record(rec).requests.len();
    let bytes = "GET /refuse-upgrade HTTP/1.1\r\nHost: origin\r\nConnection: Upgrade\r\n\
                 Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
                 Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n\
                 GET /after-refusal HTTP/1.1\r\nHost: origin\r\nX-A : smuggled\r\n\r\n";
    let (answer, closed) = exchange(net, to, bytes.as_bytes());
    let got: Vec<Received> = record(rec).requests[before..].to_vec();
    assert!(answer.starts_with("HTTP/1.1 403"), "{tag}: {answer:?}");
    // The second head is malformed (space before the colon): parsed by the proxy, it is
    // refused; tunnelled, it would have reached the origin.
    assert_eq!(got.len(), 1, "{tag}: {got:?} {answer:?}");
    assert!(
        answer.contains("HTTP/1.1 400") && closed,
        "{tag}: the request after a refused upgrade was not parsed by the proxy: {answer:?}"
    );
    remora.wait_for_access_log("\"GET /refuse-upgrade HTTP/1.1\" 403");
}

#[test]
fn smuggling_shapes_are_refused_or_reach_the_origin_as_exactly_the_requests_sent_fast_path() {
    run(true);
}

#[test]
fn smuggling_shapes_are_refused_or_reach_the_origin_as_exactly_the_requests_sent_hyper() {
    run(false);
}
