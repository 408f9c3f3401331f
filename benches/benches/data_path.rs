//! Micro-benchmarks of the data path on loopback: what one proxied exchange costs Remora's copy
//! loop, beside the same exchange with no proxy. Quote the ratio, not the absolute numbers: the
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

/// A minimal proxy in front of `upstream` using Remora's copy loop.
async fn copy_proxy(upstream: std::net::SocketAddr) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (down, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let up = TcpStream::connect(upstream).await.unwrap();
                let _ = remora::tcp::copy_bidirectional(&down, &up).await;
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
    let (direct, proxied) = rt.block_on(async {
        let echo = echo_server().await;
        (echo, copy_proxy(echo).await)
    });
    let mut group = c.benchmark_group("1KiB_exchange");
    group.throughput(Throughput::Bytes(PAYLOAD as u64 * 2));
    for (name, addr) in [("no_proxy", direct), ("remora_copy", proxied)] {
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
            h.write_downstream(response, &[], false, &mut out);
            out.len()
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    exchanges,
    config_parse,
    request_framing,
    fast_path_heads
);
criterion_main!(benches);
