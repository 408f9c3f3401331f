//! A real HTTP/2 (h2c) origin with a stream limit: it advertises
//! `SETTINGS_MAX_CONCURRENT_STREAMS` and counts what a proxy's pool makes of it: the
//! connections opened, the streams each carried at once, the streams in flight over all
//! connections at once, and the requests answered. A path holding `slow` is answered after
//! the origin's hold; any other at once. Every answer names the connection it came on
//! (`x-connection: N`, from 1); a gRPC request is answered an empty message and
//! `grpc-status: 0`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the origin saw.
#[derive(Debug, Default)]
pub struct Counts {
    pub connections: AtomicUsize,
    /// The most streams one connection carried at once.
    pub most_per_connection: AtomicUsize,
    /// Streams in flight now, over every connection.
    pub in_flight: AtomicUsize,
    /// The most streams in flight at once, over every connection.
    pub most_in_flight: AtomicUsize,
    pub answered: AtomicUsize,
}

impl Counts {
    /// `(connections, most per connection, most in flight, answered)`.
    pub fn read(&self) -> (usize, usize, usize, usize) {
        (
            self.connections.load(Ordering::SeqCst),
            self.most_per_connection.load(Ordering::SeqCst),
            self.most_in_flight.load(Ordering::SeqCst),
            self.answered.load(Ordering::SeqCst),
        )
    }
}

/// An origin listening on `addr` inside `ns`, on a thread of its own for the test's life.
pub fn start(
    ns: &crate::netns::Netns,
    addr: SocketAddr,
    stream_limit: u32,
    hold: Duration,
) -> Arc<Counts> {
    let listener = ns.bind(addr).expect("bind the HTTP/2 origin");
    let counts = Arc::new(Counts::default());
    let theirs = Arc::clone(&counts);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(serve(listener, stream_limit, hold, theirs));
    });
    counts
}

async fn serve(
    listener: std::net::TcpListener,
    stream_limit: u32,
    hold: Duration,
    counts: Arc<Counts>,
) {
    listener.set_nonblocking(true).expect("non-blocking");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    while let Ok((socket, _)) = listener.accept().await {
        let number = counts.connections.fetch_add(1, Ordering::SeqCst) + 1;
        let counts = Arc::clone(&counts);
        tokio::spawn(async move {
            let mut builder = h2::server::Builder::new();
            builder.max_concurrent_streams(stream_limit);
            let Ok(mut conn) = builder.handshake(socket).await else {
                return;
            };
            let at_once = Arc::new(AtomicUsize::new(0));
            while let Some(Ok((request, mut respond))) = conn.accept().await {
                let now = at_once.fetch_add(1, Ordering::SeqCst) + 1;
                counts.most_per_connection.fetch_max(now, Ordering::SeqCst);
                let all = counts.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                counts.most_in_flight.fetch_max(all, Ordering::SeqCst);
                let slow = request.uri().path().contains("slow");
                let grpc = request
                    .headers()
                    .get("content-type")
                    .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
                let (counts, at_once) = (Arc::clone(&counts), Arc::clone(&at_once));
                tokio::spawn(async move {
                    if slow {
                        tokio::time::sleep(hold).await;
                    }
                    at_once.fetch_sub(1, Ordering::SeqCst);
                    counts.in_flight.fetch_sub(1, Ordering::SeqCst);
                    let mut ok = http::Response::builder()
                        .status(200)
                        .header("x-connection", number.to_string());
                    if grpc {
                        ok = ok.header("content-type", "application/grpc");
                    }
                    let ok = ok.body(()).expect("response");
                    let Ok(mut body) = respond.send_response(ok, false) else {
                        return;
                    };
                    if grpc {
                        // An empty message, then `grpc-status: 0` in the trailers.
                        let _ = body.send_data(bytes::Bytes::from_static(&[0; 5]), false);
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                        let _ = body.send_trailers(trailers);
                    } else {
                        let _ = body.send_data(bytes::Bytes::from_static(b"ok"), true);
                    }
                    counts.answered.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
    }
}
