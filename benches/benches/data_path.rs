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

criterion_group!(benches, exchanges, config_parse);
criterion_main!(benches);
