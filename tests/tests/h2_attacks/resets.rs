//! A client's reset reaches the upstream: a stream the client resets (RST_STREAM), or a client
//! connection that dies, has its upstream stream reset with CANCEL on the upstream HTTP/2
//! connection the proxy shares between clients, as Envoy does, while the other streams on that
//! connection go on. The origin streams each response slowly, so a stream left running
//! upstream would show.

use super::support::*;
use bytes::Bytes;
use h2::Reason;
use remora_e2e::Netns;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Between two chunks of a streamed response.
const CHUNK_EVERY: Duration = Duration::from_millis(50);
/// Chunks a streamed response has at most (the origin's own bound on a stream left running).
const CHUNKS: usize = 600;

/// What the origin saw of one stream, named by its request's `x-id`.
#[derive(Debug, Clone, Default)]
pub struct StreamLog {
    /// Which of the origin's connections carried it (from 1).
    pub connection: usize,
    pub chunks_sent: usize,
    /// How the proxy reset it, if it did.
    pub reset: Option<Reason>,
}

#[derive(Debug, Default)]
pub struct Streams {
    connections: AtomicUsize,
    log: Mutex<HashMap<String, StreamLog>>,
}

impl Streams {
    fn update(&self, id: &str, f: impl FnOnce(&mut StreamLog)) {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        f(log.entry(id.to_string()).or_default());
    }

    pub fn get(&self, id: &str) -> Option<StreamLog> {
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.get(id).cloned()
    }
}

/// An h2c origin that answers every stream with a chunk every [`CHUNK_EVERY`], and records
/// which connection carried it and how it was reset.
pub async fn streaming_origin(listener: std::net::TcpListener, streams: Arc<Streams>) {
    listener.set_nonblocking(true).expect("non-blocking");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    while let Ok((socket, _)) = listener.accept().await {
        let connection = streams.connections.fetch_add(1, Ordering::SeqCst) + 1;
        let streams = Arc::clone(&streams);
        tokio::spawn(async move {
            let Ok(mut conn) = h2::server::handshake(socket).await else {
                return;
            };
            while let Some(Ok((request, mut respond))) = conn.accept().await {
                let id = request
                    .headers()
                    .get("x-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                streams.update(&id, |s| s.connection = connection);
                let streams = Arc::clone(&streams);
                tokio::spawn(async move {
                    let head = http::Response::builder()
                        .status(200)
                        .body(())
                        .expect("response");
                    let Ok(mut body) = respond.send_response(head, false) else {
                        return;
                    };
                    for _ in 0..CHUNKS {
                        let reset = std::future::poll_fn(|cx| body.poll_reset(cx));
                        match tokio::time::timeout(CHUNK_EVERY, reset).await {
                            Ok(Ok(reason)) => {
                                streams.update(&id, |s| s.reset = Some(reason));
                                return;
                            }
                            Ok(Err(_)) => return,
                            Err(_) => {}
                        }
                        if body
                            .send_data(Bytes::from(vec![b's'; 1024]), false)
                            .is_err()
                        {
                            return;
                        }
                        streams.update(&id, |s| s.chunks_sent += 1);
                    }
                    let _ = body.send_data(Bytes::new(), true);
                });
            }
        });
    }
}

/// A client connection (the `h2` crate) through the proxy; its connection task is `task`.
struct Client {
    send: h2::client::SendRequest<Bytes>,
    task: tokio::task::JoinHandle<()>,
}

async fn connect(ns: &Netns, addr: SocketAddr) -> Client {
    let socket = ns.connect(addr, STEP).expect("connect");
    socket.set_nonblocking(true).expect("non-blocking");
    let socket = tokio::net::TcpStream::from_std(socket).expect("tokio stream");
    let (send, conn) = tokio::time::timeout(STEP, h2::client::handshake(socket))
        .await
        .expect("handshake in time")
        .expect("handshake");
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    Client { send, task }
}

/// A stream asking for the streamed response, once its head and a first chunk are in.
async fn open(
    client: &mut Client,
    addr: SocketAddr,
    id: &str,
) -> (h2::SendStream<Bytes>, h2::RecvStream) {
    let request = http::Request::get(format!("http://{addr}/stream"))
        .header("x-id", id)
        .body(())
        .expect("request");
    let mut send = client.send.clone().ready().await.expect("ready");
    let (response, stream) = send.send_request(request, true).expect("send");
    let response = tokio::time::timeout(STEP, response)
        .await
        .unwrap_or_else(|_| panic!("{id}: no response head"))
        .unwrap_or_else(|e| panic!("{id}: {e}"));
    assert_eq!(response.status(), 200, "{id}");
    let mut body = response.into_body();
    read_chunks(&mut body, 1, id).await;
    (stream, body)
}

/// Read `n` chunks of `body`, giving the window back.
async fn read_chunks(body: &mut h2::RecvStream, n: usize, id: &str) {
    for _ in 0..n {
        let chunk = tokio::time::timeout(STEP, body.data())
            .await
            .unwrap_or_else(|_| panic!("{id}: the response stalled"))
            .unwrap_or_else(|| panic!("{id}: the response ended"))
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        let _ = body.flow_control().release_capacity(chunk.len());
    }
}

/// Wait until the origin saw `id` reset, and say how.
async fn reset_upstream(streams: &Streams, id: &str) -> Reason {
    let deadline = Instant::now() + STEP;
    loop {
        if let Some(reason) = streams.get(id).and_then(|s| s.reset) {
            return reason;
        }
        assert!(
            Instant::now() < deadline,
            "{id}: its upstream stream was not reset: {:?}",
            streams.get(id)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One direction: a stream reset by its client, and a client connection that dies, each while
/// its response streams; a third stream on the same upstream connection reads on throughout.
pub async fn resets_reach_the_upstream(
    leg: &'static str,
    ns: &Netns,
    addr: SocketAddr,
    streams: &Streams,
) {
    let keep = format!("{leg}-keep");
    let cancelled = format!("{leg}-cancelled");
    let dies = format!("{leg}-dies");

    let mut a = connect(ns, addr).await;
    let (_keep_send, mut keep_body) = open(&mut a, addr, &keep).await;
    let (mut cancel_send, _cancel_body) = open(&mut a, addr, &cancelled).await;
    cancel_send.send_reset(Reason::CANCEL);
    assert_eq!(
        reset_upstream(streams, &cancelled).await,
        Reason::CANCEL,
        "{cancelled}"
    );
    read_chunks(&mut keep_body, 5, &keep).await;

    let mut b = connect(ns, addr).await;
    let (dies_send, dies_body) = open(&mut b, addr, &dies).await;
    // The client's connection ends without a frame: its task, socket and all, is dropped.
    b.task.abort();
    drop((dies_send, dies_body, b));
    assert_eq!(
        reset_upstream(streams, &dies).await,
        Reason::CANCEL,
        "{dies}"
    );
    read_chunks(&mut keep_body, 5, &keep).await;

    let [k, c, d] = [&keep, &cancelled, &dies].map(|id| streams.get(id).expect("seen upstream"));
    eprintln!("{leg}: keep {k:?}, cancelled {c:?}, dies {d:?}");
    assert_eq!(k.reset, None, "{keep} went on");
    assert_eq!(
        k.connection, c.connection,
        "{leg}: one upstream connection for one client's streams"
    );
    // The pool shares one upstream connection between the two clients (the same source).
    assert_eq!(
        k.connection, d.connection,
        "{leg}: the upstream connection is shared"
    );
    // The reset streams stopped upstream: no chunk is sent after a reset.
    let (c_sent, d_sent) = (c.chunks_sent, d.chunks_sent);
    tokio::time::sleep(CHUNK_EVERY * 4).await;
    let later = [&cancelled, &dies].map(|id| streams.get(id).expect("seen").chunks_sent);
    assert_eq!(
        later,
        [c_sent, d_sent],
        "{leg}: a reset stream went on upstream"
    );
    a.task.abort();
}
