//! The pool's HTTP/2 connections against a real `h2` server that takes one stream at a time:
//! a request is given a connection with room, the next one another connection, none past
//! the limit, and a stream given back makes room again; what the pool keeps is never doubled.

use super::*;
use std::time::Duration;

/// A connection to an `h2` server taking `limit` streams at a time, over an in-memory pipe.
async fn connect(limit: u32) -> Sender {
    let (client, server) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let mut builder = h2::server::Builder::new();
        builder.max_concurrent_streams(limit);
        let Ok(mut conn) = builder.handshake::<_, bytes::Bytes>(server).await else {
            return;
        };
        // Streams are accepted and never answered: the test holds them itself.
        let mut held = Vec::new();
        while let Some(Ok(stream)) = conn.accept().await {
            held.push(stream);
        }
    });
    let sender = handshake_over(client, (), HttpVersion::Http2, LocalAddr::default(), None)
        .await
        .expect("handshake");
    // The connection's task reads the peer's SETTINGS: wait for them, as the routed path
    // does before sharing a new connection.
    let streams = Arc::clone(sender.streams().expect("HTTP/2"));
    tokio::time::timeout(Duration::from_secs(5), async {
        while !streams.peer_limit_known() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the peer's SETTINGS");
    sender
}

fn key() -> Key {
    Key {
        destination: "10.0.0.1:80".parse().expect("address"),
        source: None,
        version: HttpVersion::Http2,
        tls: 0,
    }
}

#[tokio::test]
async fn a_request_gets_a_connection_with_room_and_none_past_every_peers_limit() {
    let pool = Arc::new(Pool::<Sender, Key>::default());
    let idle = Duration::from_secs(30);
    let (a, b) = (connect(1).await, connect(1).await);
    pool.checkin(key(), a, idle, 64);
    pool.checkin(key(), b, idle, 64);
    assert_eq!(pool.idle_count(), 2);
    let first = pool
        .checkout(&key(), Instant::now(), idle)
        .expect("room on the first");
    let second = pool
        .checkout(&key(), Instant::now(), idle)
        .expect("room on the second");
    assert!(!first.same_connection(&second), "one stream each");
    assert!(
        pool.checkout(&key(), Instant::now(), idle).is_none(),
        "both at their peer's limit"
    );
    // A request's end gives its handle back: its stream is freed, the connection not doubled.
    pool.checkin(key(), first, idle, 64);
    assert_eq!(pool.idle_count(), 2);
    let again = pool
        .checkout(&key(), Instant::now(), idle)
        .expect("room again");
    assert!(!again.same_connection(&second), "the first's stream, freed");
    assert!(pool.checkout(&key(), Instant::now(), idle).is_none());
    drop((again, second));
    assert!(pool.checkout(&key(), Instant::now(), idle).is_some());
}

#[tokio::test]
async fn only_one_shared_connection_is_opened_to_a_destination_at_a_time() {
    let pool = Arc::new(Pool::<Sender, Key>::default());
    let dialing = pool.start_dial(key(), None).expect("the first dial");
    assert!(pool.is_dialing(&key()));
    assert!(pool.start_dial(key(), None).is_none(), "a second waits");
    drop(dialing);
    assert!(!pool.is_dialing(&key()));
}

/// A cold burst of `burst` requests through [`Pool::shared`] to a server taking `limit`
/// streams at a time, each request holding its stream: the connections dialled.
async fn cold_burst(burst: usize, limit: u32) -> usize {
    let pool = Arc::new(Pool::<Sender, Key>::default());
    let dials = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let idle = Duration::from_secs(30);
    let (held_tx, mut held_rx) = tokio::sync::mpsc::unbounded_channel();
    let tasks: Vec<_> = (0..burst)
        .map(|_| {
            let (pool, dials, held_tx) = (Arc::clone(&pool), Arc::clone(&dials), held_tx.clone());
            tokio::spawn(async move {
                let bound = Duration::from_secs(5);
                let sender = match pool.shared(&key(), idle, bound).await {
                    Shared::Pooled(sender) => sender,
                    Shared::Dial((), dialing) => {
                        assert!(dialing.is_some(), "a dial waited past its bound");
                        dials.fetch_add(1, Ordering::SeqCst);
                        // Not waiting for the peer's SETTINGS: share_new does.
                        let (client, server) = tokio::io::duplex(64 * 1024);
                        tokio::spawn(serve_held(server, limit));
                        let sender = handshake_over(
                            client,
                            (),
                            HttpVersion::Http2,
                            LocalAddr::default(),
                            None,
                        )
                        .await
                        .expect("handshake");
                        pool.share_new(key(), sender, idle, 64, dialing, bound)
                    }
                };
                let _ = held_tx.send(sender);
            })
        })
        .collect();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("every request given a connection in time")
            .expect("request task");
    }
    drop(held_tx);
    let mut held = Vec::new();
    while let Some(s) = held_rx.recv().await {
        held.push(s);
    }
    assert_eq!(held.len(), burst);
    dials.load(Ordering::SeqCst)
}

/// An `h2` server taking `limit` streams at a time that holds every stream.
async fn serve_held(io: tokio::io::DuplexStream, limit: u32) {
    let mut builder = h2::server::Builder::new();
    builder.max_concurrent_streams(limit);
    let Ok(mut conn) = builder.handshake::<_, bytes::Bytes>(io).await else {
        return;
    };
    let mut held = Vec::new();
    while let Some(Ok(stream)) = conn.accept().await {
        held.push(stream);
    }
}

/// A cold burst to one destination without a cluster (a port declared `http2`) waits for the
/// dial under way: one connection for a peer with room for the whole burst, as many as the
/// peer's limit requires for one without, never one per request.
#[tokio::test]
async fn a_cold_burst_dials_one_connection_per_peer_limit_not_per_request() {
    assert_eq!(cold_burst(8, 100).await, 1, "a peer taking 100 streams");
    assert_eq!(
        cold_burst(8, 2).await,
        4,
        "a peer taking 2 streams at a time"
    );
}
