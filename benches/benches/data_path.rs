//! Micro-benchmarks of the data path's hot spots, in the order a connection meets them: the
//! original destination, protocol detection, HTTP/1.1 framing and heads, Istio's metrics per
//! request and per connection, and the copy loop on loopback beside the same exchange with no
//! proxy (plus the config parse a reload costs). Quote ratios, not absolute numbers: the
//! machines these run on are shared and noisy.

// Benchmark set-up fails loudly; there is no user input here.
#![allow(clippy::unwrap_used)]

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PAYLOAD: usize = 1024; // Istio's sidecar benchmark: 1 KiB

/// An echo server: answers every PAYLOAD-byte request with the same bytes.
async fn echo_server() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = vec![0u8; PAYLOAD];
                while s.read_exact(&mut buf).await.is_ok() {
                    if s.write_all(&buf).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Which of Remora's two copy loops a bench proxy runs.
#[derive(Clone, Copy)]
enum CopyLoop {
    /// Opaque TCP between two sockets (`tcp::copy_bidirectional`).
    Sockets,
    /// Between any two byte streams (`tcp::relay`): mesh TLS and upgraded tunnels.
    Streams,
}

/// A minimal proxy in front of `upstream` using one of Remora's copy loops.
async fn copy_proxy(upstream: std::net::SocketAddr, how: CopyLoop) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut down, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let mut up = TcpStream::connect(upstream).await.unwrap();
                // A reset or a closed peer ends the connection; the bench's own reads notice.
                match how {
                    CopyLoop::Sockets => drop(remora::tcp::copy_bidirectional(&down, &up).await),
                    CopyLoop::Streams => drop(remora::tcp::relay(&mut down, &mut up).await),
                }
            });
        }
    });
    addr
}

fn exchanges(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (direct, sockets, streams) = rt.block_on(async {
        let echo = echo_server().await;
        let sockets = copy_proxy(echo, CopyLoop::Sockets).await;
        (echo, sockets, copy_proxy(echo, CopyLoop::Streams).await)
    });
    let mut group = c.benchmark_group("1KiB_exchange");
    group.throughput(Throughput::Bytes(PAYLOAD as u64 * 2));
    for (name, addr) in [
        ("no_proxy", direct),
        ("remora_copy", sockets),
        ("remora_relay", streams),
    ] {
        let mut stream = rt.block_on(TcpStream::connect(addr)).unwrap();
        stream.set_nodelay(true).unwrap();
        let req = vec![7u8; PAYLOAD];
        let mut resp = vec![0u8; PAYLOAD];
        group.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(async {
                    stream.write_all(&req).await.unwrap();
                    stream.read_exact(&mut resp).await.unwrap();
                })
            })
        });
    }
    group.finish();
}

fn config_parse(c: &mut Criterion) {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/config.md"))
        .ok()
        .and_then(|md| {
            md.split("```yaml\n")
                .nth(1)
                .map(|s| s.split("```").next().unwrap_or("").to_string())
        })
        .unwrap_or_default();
    c.bench_function("config_parse_full_schema", |b| {
        b.iter(|| remora_config::parse(&text, Path::new("config.md")).unwrap())
    });
}

/// A browser-like request head of 14 headers.
fn browser_get() -> &'static [u8] {
    b"GET /api/v1/items?page=2 HTTP/1.1\r\nHost: reviews.default.svc.cluster.local:9080\r\n\
        User-Agent: Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/128.0\r\n\
        Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n\
        Accept-Language: en-GB,en;q=0.5\r\nAccept-Encoding: gzip, deflate, br\r\n\
        Connection: keep-alive\r\nCookie: session=0123456789abcdef0123456789abcdef\r\n\
        Upgrade-Insecure-Requests: 1\r\nCache-Control: max-age=0\r\n\
        x-request-id: 5c3b1f2e-8a4d-4c6b-9e7f-0a1b2c3d4e5f\r\n\
        traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n\
        x-b3-traceid: 80f198ee56343ba864fe8b2a57d3eff7\r\nx-b3-sampled: 1\r\n\r\n"
}

/// What following HTTP/1.1 framing adds per request in front of hyper's own parse: a browser-like
/// head of 14 headers, and a POST whose 1 KiB body is skipped by its length.
fn request_framing(c: &mut Criterion) {
    let get = browser_get();
    let mut post = b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n\
        Content-Length: 1024\r\n\r\n"
        .to_vec();
    post.resize(post.len() + PAYLOAD, b'x');
    let mut group = c.benchmark_group("request_framing");
    for (name, bytes) in [("get_14_headers", get), ("post_1k_body", &post[..])] {
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_function(name, |b| {
            let mut framing = remora::http::framing::RequestFraming::new();
            b.iter(|| {
                assert_eq!(framing.feed(std::hint::black_box(bytes)), None);
                assert!(!framing.in_head());
            })
        });
    }
    group.finish();
}

/// The fast path's work on heads per request: the browser-like GET judged and written for the
/// upstream (x-request-id kept, x-forwarded-proto added), and a response head read and written
/// for the client.
fn fast_path_heads(c: &mut Criterion) {
    use remora::http::h1::head;
    let get = browser_get();
    let limits = head::Limits {
        max_header_bytes: 60 * 1024,
        max_headers: 100,
        drop_client_cert: false,
        mesh_tls: false,
        drop_attempt_count: true,
    };
    let response = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
        content-length: 1024\r\ndate: Sun, 22 Nov 2026 00:00:00 GMT\r\n\
        x-envoy-upstream-service-time: 3\r\nserver: istio-envoy\r\n\r\n";
    let mut group = c.benchmark_group("fast_path_heads");
    group.throughput(Throughput::Bytes(get.len() as u64));
    group.bench_function("request_14_headers", |b| {
        let mut out = Vec::with_capacity(1024);
        b.iter(|| {
            out.clear();
            let h = head::parse_request(std::hint::black_box(get), &limits).unwrap();
            h.write_upstream(get, &[b"x-forwarded-proto: http\r\n"], &mut out);
            out.len()
        })
    });
    group.throughput(Throughput::Bytes(response.len() as u64));
    group.bench_function("response_6_headers", |b| {
        let mut out = Vec::with_capacity(1024);
        b.iter(|| {
            out.clear();
            let h = head::parse_response(std::hint::black_box(&response[..]), false)
                .unwrap()
                .unwrap();
            // Routed by xDS: the router's service time in place of the upstream's.
            h.write_downstream(response, &[], None, Some(3), false, &mut out);
            out.len()
        })
    });
    group.finish();
}

/// `SO_ORIGINAL_DST` on an accepted loopback connection. Nothing NATed it, so the kernel finds no
/// conntrack record and the local address is the answer: the same two system calls as under
/// `remora capture`'s REDIRECT (the socket's address, then the option), without the conntrack
/// lookup itself.
fn original_destination(c: &mut Criterion) {
    use remora::orig_dst;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (accepted, addr, _client) = rt.block_on(async {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = l.accept().await.unwrap();
        (accepted, addr, client)
    });
    assert_eq!(
        orig_dst::original_dst(&accepted).unwrap(),
        (addr, orig_dst::Source::LocalAddress)
    );
    let mut group = c.benchmark_group("original_destination");
    group.bench_function("so_original_dst_loopback", |b| {
        b.iter(|| orig_dst::original_dst(std::hint::black_box(&accepted)).unwrap())
    });
    let mapped: std::net::SocketAddr = "[::ffff:10.1.2.3]:9080".parse().unwrap();
    group.bench_function("canonical_v4_mapped", |b| {
        b.iter(|| orig_dst::canonical(std::hint::black_box(mapped)))
    });
    group.finish();
}

/// A mesh sidecar's ClientHello, as rustls writes it: Istio's SNI and ALPN values.
fn mesh_client_hello() -> Vec<u8> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"istio-peer-exchange".to_vec(), b"istio".to_vec()];
    let name = "outbound_.9080_._.reviews.default.svc.cluster.local"
        .try_into()
        .unwrap();
    let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    hello
}

/// Protocol detection on a client's first bytes: HTTP/1.1, the HTTP/2 preface, a TLS
/// ClientHello (read to its ALPN), and a database's binary start that is none of them.
fn detection(c: &mut Criterion) {
    use remora::detect::{classify, HttpVersion, Verdict};
    let mut h2 = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    h2.extend_from_slice(&[
        0, 0, 12, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100, 0, 4, 0, 1, 0, 0,
    ]);
    // A PostgreSQL startup message: length, protocol 3.0, then key/value pairs.
    let params = b"user\0postgres\0database\0orders\0\0";
    let mut postgres = u32::try_from(8 + params.len())
        .unwrap()
        .to_be_bytes()
        .to_vec();
    postgres.extend_from_slice(&[0, 3, 0, 0]);
    postgres.extend_from_slice(params);
    let hello = mesh_client_hello();
    let cases: [(&str, &[u8], Verdict); 4] = [
        (
            "http1_get",
            browser_get(),
            Verdict::Http(HttpVersion::Http1),
        ),
        ("h2_preface", &h2, Verdict::Http(HttpVersion::Http2)),
        ("tls_client_hello", &hello, Verdict::Tls),
        ("postgres_startup", &postgres, Verdict::Opaque),
    ];
    let mut group = c.benchmark_group("detection");
    for (name, bytes, expected) in cases {
        assert_eq!(classify(bytes), Some(expected), "{name}");
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_function(name, |b| b.iter(|| classify(std::hint::black_box(bytes))));
    }
    group.finish();
}

/// Istio's metrics: one request recorded in its connection's cached series (what every request
/// after a connection's first costs), one resolved from the families (a connection's first, or a
/// new status), and one TCP connection's open and close.
fn metric_recording(c: &mut Criterion) {
    use remora::metrics::{ListenerNames, Metrics, RequestOutcome, SeriesCache};
    use remora::Direction;
    let metrics = Metrics::new(
        &remora::workload::Workload::default(),
        ListenerNames::default(),
    );
    let outcome = RequestOutcome {
        mesh_peer: None,
        direction: Direction::Inbound,
        grpc: false,
        code: 200,
        grpc_status: None,
        flags: remora::http::errors::Flags::default(),
        duration: std::time::Duration::from_micros(850),
        request_bytes: 0,
        response_bytes: PAYLOAD as u64,
        request_messages: 0,
        response_messages: 0,
    };
    let series = SeriesCache::default();
    let tcp = metrics.direction(Direction::Outbound);
    let tcp_connection = || {
        tcp.connection_opened();
        let open = tcp.istio_opened(None);
        tcp.connection_closed(&open, "-", PAYLOAD as u64, PAYLOAD as u64);
    };
    // Checked before measuring (and whether or not a filter skips this group): each input
    // lands in Istio's families.
    metrics.request_finished(&series, &outcome);
    tcp_connection();
    let text = metrics.encode();
    assert!(
        text.contains("istio_requests_total{")
            && text.contains("istio_tcp_connections_closed_total{"),
        "the benchmark's inputs record into Istio's families"
    );
    let mut group = c.benchmark_group("metric_recording");
    group.bench_function("istio_request_cached_series", |b| {
        b.iter(|| metrics.request_finished(&series, std::hint::black_box(&outcome)))
    });
    group.bench_function("istio_request_first_of_connection", |b| {
        b.iter(|| metrics.request_finished(&SeriesCache::default(), std::hint::black_box(&outcome)))
    });
    group.bench_function("istio_tcp_connection_open_close", |b| {
        b.iter(tcp_connection)
    });
    group.finish();
}

criterion_group!(
    benches,
    original_destination,
    detection,
    request_framing,
    fast_path_heads,
    metric_recording,
    exchanges,
    config_parse
);
criterion_main!(benches);
