//! Explicit listeners carrying Istio mutual TLS: two `remora run` processes back to back on
//! loopback (A originates, B terminates), with rcgen certificates; HTTP and TCP through them,
//! and peers with the wrong SPIFFE ID refused on both sides. No root needed.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;
use support::certs::MeshCa;
use support::{free_port, get, metric, wait_until, Ports, Remora, TempDir};

const A: &str = "spiffe://cluster.local/ns/test/sa/a";
const B: &str = "spiffe://cluster.local/ns/test/sa/b";
const OTHER: &str = "spiffe://cluster.local/ns/test/sa/other";

/// An HTTP/1.1 server that answers each request with its own request head as the body, so a
/// test can see the headers that reached it.
fn head_echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head: Vec<u8> = buf.drain(..end + 4).collect();
                        let reply =
                            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", head.len());
                        if conn.write_all(reply.as_bytes()).is_err()
                            || conn.write_all(&head).is_err()
                        {
                            return;
                        }
                    }
                    match conn.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    addr
}

/// A TCP server that echoes what it reads and half-closes when the client does.
fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut data = Vec::new();
                if conn.read_to_end(&mut data).is_ok() {
                    let _ = conn.write_all(&data);
                }
            });
        }
    });
    addr
}

/// One listener's YAML entry.
fn listener(address: u16, upstream: SocketAddr, protocol: &str, tls: &str) -> String {
    format!("  - address: 127.0.0.1:{address}\n    upstream: {upstream}\n    protocol: {protocol}\n    tls:\n{tls}")
}

/// A started `remora run` with `cert_dir` and `listeners`; its metrics port.
fn start(dir: &Path, name: &str, cert_dir: &Path, listeners: &[String]) -> (Remora, u16) {
    let ports = Ports::new();
    let extra = format!(
        "tls:\n  cert_dir: \"{}\"\nlisteners:\n{}",
        cert_dir.display(),
        listeners.concat()
    );
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, ports.config(&extra)).unwrap();
    let mut remora = Remora::start(&path);
    remora.wait_ready(&path, ports.readiness);
    (remora, ports.metrics)
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Whether `port` answered a GET with 200; a refused connection reads as closed or reset.
fn answered(port: u16) -> bool {
    matches!(get(port, "/"), Ok((200, _)))
}

#[test]
fn http_and_tcp_cross_two_remoras_over_mutual_tls() {
    let dir = TempDir::new("mesh-pair");
    let ca = MeshCa::new();
    ca.install(&dir.0.join("a"), A);
    ca.install(&dir.0.join("b"), B);
    let (http_app, tcp_app) = (head_echo_server(), echo_server());
    let (b_http, b_tcp, a_http, a_tcp) = (free_port(), free_port(), free_port(), free_port());

    let only_a = format!("      mode: terminate\n      identities: [\"{A}\"]\n");
    let (_b, b_metrics) = start(
        &dir.0,
        "b",
        &dir.0.join("b"),
        &[
            listener(b_http, http_app, "http", &only_a),
            listener(b_tcp, tcp_app, "tcp", "      mode: terminate\n"),
        ],
    );
    let to_b = format!(
        "      mode: originate\n      hostname: b.test.svc.cluster.local\n      identities: [\"{B}\"]\n"
    );
    let (_a, a_metrics) = start(
        &dir.0,
        "a",
        &dir.0.join("a"),
        &[
            listener(a_http, loopback(b_http), "http", &to_b),
            listener(a_tcp, loopback(b_tcp), "tcp", &to_b),
        ],
    );

    // HTTP: the application sees the client's identity in x-forwarded-client-cert.
    let (status, head) = get(a_http, "/hello").unwrap();
    assert_eq!(status, 200, "{head}");
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("get /hello http/1.1"), "{head}");
    let xfcc = head
        .lines()
        .find(|l| l.starts_with("x-forwarded-client-cert:"))
        .unwrap_or_else(|| panic!("no x-forwarded-client-cert in {head}"));
    assert!(xfcc.contains(&format!("by={B}")), "{xfcc}");
    assert!(xfcc.contains(&format!("uri={A}")), "{xfcc}");
    // A's listener served the application's plaintext request and said so, as Envoy's client
    // side does; B keeps what the client's sidecar set.
    assert!(head.contains("x-forwarded-proto: http\r\n"), "{head}");

    // TCP: bytes both ways, the half-close passed on.
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let mut s = TcpStream::connect(loopback(a_tcp)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&payload).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back).unwrap();
    assert!(back == payload, "the echo through both sidecars differs");

    // Both hops were mutual TLS, counted in each sidecar's direction.
    let ok =
        |dir: &str| format!("remora_tls_handshakes_total{{direction=\"{dir}\",result=\"ok\"}}");
    wait_until("B's handshakes", || {
        metric(b_metrics, &ok("inbound")) == Some(2)
    });
    assert_eq!(metric(a_metrics, &ok("outbound")), Some(2));
    let opened = "remora_connections_opened_total{direction=\"inbound\"}";
    assert_eq!(metric(b_metrics, opened), Some(2));
    // A reports the request as Istio's client side does, naming B by its certificate.
    let (_, exposition) = get(a_metrics, "/stats/prometheus").unwrap();
    let source_series = exposition.lines().find(|l| {
        l.starts_with("istio_requests_total{reporter=\"source\"")
            && l.contains(&format!("destination_principal=\"{B}\""))
            && l.contains("response_code=\"200\"")
    });
    assert!(
        source_series.is_some_and(|l| l.ends_with(" 1")),
        "{exposition}"
    );

    // B accepts nothing but mutual TLS: plaintext straight to it is closed unanswered.
    assert!(!answered(b_http), "B served plaintext");
    let mut s = TcpStream::connect(loopback(b_tcp)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(b"plaintext\n").unwrap();
    let mut buf = [0u8; 64];
    assert!(
        matches!(s.read(&mut buf), Ok(0) | Err(_)),
        "B's TCP listener passed plaintext"
    );
}

#[test]
fn a_peer_with_the_wrong_spiffe_id_is_refused_on_both_sides() {
    let dir = TempDir::new("mesh-wrong-id");
    let ca = MeshCa::new();
    ca.install(&dir.0.join("a"), A);
    ca.install(&dir.0.join("b"), B);
    ca.install(&dir.0.join("other"), OTHER);
    let http_app = head_echo_server();
    let (b_http, a_right, a_wrong, other) = (free_port(), free_port(), free_port(), free_port());

    let only_a = format!("      mode: terminate\n      identities: [\"{A}\"]\n");
    let (_b, b_metrics) = start(
        &dir.0,
        "b",
        &dir.0.join("b"),
        &[listener(b_http, http_app, "http", &only_a)],
    );
    let expect = |id: &str| format!("      mode: originate\n      identities: [\"{id}\"]\n");
    let (_a, a_metrics) = start(
        &dir.0,
        "a",
        &dir.0.join("a"),
        &[
            listener(a_right, loopback(b_http), "http", &expect(B)),
            // B's certificate chains to the roots but is not the server this listener expects.
            listener(a_wrong, loopback(b_http), "http", &expect(OTHER)),
        ],
    );
    // A client sidecar B does not accept, with a certificate from the same roots.
    let (_other, _) = start(
        &dir.0,
        "other",
        &dir.0.join("other"),
        &[listener(other, loopback(b_http), "http", &expect(B))],
    );

    assert!(answered(a_right), "the right pair must work");
    assert!(
        !answered(a_wrong),
        "A accepted a server with the wrong SPIFFE ID"
    );
    let wrong_san = |dir: &str| {
        format!("remora_tls_handshakes_total{{direction=\"{dir}\",result=\"wrong_san\"}}")
    };
    // A served the request itself: a refused handshake is a connect failure, tried again as
    // Istio's retry policy says (twice more by default) before the 503.
    assert_eq!(metric(a_metrics, &wrong_san("outbound")), Some(3));

    assert!(
        !answered(other),
        "B accepted a client with the wrong SPIFFE ID"
    );
    wait_until("B's refusal", || {
        metric(b_metrics, &wrong_san("inbound")) == Some(1)
    });
}
