//! The whole proxy: any bytes a client sends through `Proxy::serve` (detection, the HTTP/1.1
//! fast path, hyper's HTTP/1.1 and HTTP/2, or the TCP copy) to an in-process upstream on
//! loopback, as linkerd2-proxy's inbound fuzzer does. The first byte picks the listener's
//! protocol (auto-detected, HTTP, TCP). A panic anywhere, in any task, aborts the run
//! (libfuzzer-sys's panic hook); a connection the proxy does not finish is cut after a bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora::proxy::{Proxy, Route};
use remora_config::{Config, ListenerConfig, ListenerProtocol};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

struct World {
    runtime: Runtime,
    proxy: Arc<Proxy>,
    listener: TcpListener,
    upstream: SocketAddr,
}

/// An upstream that answers every read with one small response, until the proxy closes.
async fn upstream(listener: TcpListener) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n) = conn.read(&mut buf).await {
                if n == 0 || conn.write_all(RESPONSE).await.is_err() {
                    break;
                }
            }
        });
    }
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let (listener, upstream) = runtime.block_on(async {
            let up = TcpListener::bind("127.0.0.1:0")
                .await
                .expect("upstream binds");
            let addr = up.local_addr().expect("an address");
            tokio::spawn(upstream(up));
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .expect("listener binds");
            (listener, addr)
        });
        let proxy = runtime.block_on(async { Proxy::for_tests(Config::default()) });
        World {
            runtime,
            proxy,
            listener,
            upstream,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let w = world();
    let protocol = match selector % 3 {
        0 => ListenerProtocol::Auto,
        1 => ListenerProtocol::Http,
        _ => ListenerProtocol::Tcp,
    };
    let route = Route::Fixed(Arc::new(ListenerConfig {
        address: w.listener.local_addr().expect("an address"),
        upstream: w.upstream,
        protocol,
        tls: None,
    }));
    w.runtime.block_on(async {
        let Ok(mut client) = TcpStream::connect(w.listener.local_addr().expect("addr")).await
        else {
            return;
        };
        let Ok((accepted, peer)) = w.listener.accept().await else {
            return;
        };
        let mut served = tokio::spawn(Arc::clone(&w.proxy).serve(accepted, peer, route));
        let _ = client.write_all(bytes).await;
        let _ = client.shutdown().await;
        let mut sink = vec![0u8; 64 * 1024];
        let read_all = async {
            while let Ok(n) = client.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_millis(500), read_all).await;
        drop(client);
        match tokio::time::timeout(Duration::from_secs(2), &mut served).await {
            Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Ok(_) => {}
            // Not finished: cut, as an idle timeout would.
            Err(_) => served.abort(),
        }
    });
});
