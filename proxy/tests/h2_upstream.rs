//! Raw HTTP/2 upstreams, through `remora run` as a process on loopback: the frames Remora
//! sends them, and what it does when they refuse requests with GOAWAY. A stream above a
//! GOAWAY's last stream id never reached the application, so Remora sends it again on a new
//! connection without spending one of Istio's two retries.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod support;

use support::Explicit;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
const END_STREAM: u8 = 0x1;
const END_STREAM_AND_HEADERS: u8 = 0x5;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Reads one frame: its type, flags, stream id and payload length (payload skipped); `None`
/// when the peer is gone.
fn read_frame(s: &mut TcpStream) -> Option<(u8, u8, u32, usize)> {
    let mut head = [0u8; 9];
    s.read_exact(&mut head).ok()?;
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).ok()?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Some((head[3], head[4], stream, len))
}

/// Starts a server on `s`: the preface checked and the settings exchanged; `false` if the
/// peer went away first.
fn start(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut preface = [0u8; 24];
    if s.read_exact(&mut preface).is_err() || preface != PREFACE {
        return false;
    }
    s.write_all(&frame(SETTINGS, 0, 0, &[])).is_ok()
}

/// A raw HTTP/2 server: the first `refusing` connections answer the first request with
/// GOAWAY(last stream id 0), which refuses it unprocessed; later ones answer every request
/// 200 with no body (`:status 200` is HPACK's static entry 8).
fn serve(listener: TcpListener, refusing: usize, connections: Arc<AtomicUsize>) {
    for conn in listener.incoming() {
        let Ok(mut s) = conn else { return };
        let n = connections.fetch_add(1, Ordering::SeqCst);
        std::thread::spawn(move || {
            if !start(&mut s) {
                return;
            }
            while let Some((kind, flags, stream, _)) = read_frame(&mut s) {
                let answer = match kind {
                    SETTINGS if flags & ACK == 0 => frame(SETTINGS, ACK, 0, &[]),
                    HEADERS if n < refusing => {
                        // Last stream id 0, NO_ERROR.
                        let _ = s.write_all(&frame(GOAWAY, 0, 0, &[0; 8]));
                        std::thread::sleep(Duration::from_millis(100));
                        return;
                    }
                    HEADERS => frame(HEADERS, END_STREAM_AND_HEADERS, stream, &[0x88]),
                    _ => continue,
                };
                if s.write_all(&answer).is_err() {
                    return;
                }
            }
        });
    }
}

/// An upstream served by `serve` on a thread of its own, and Remora in front of it on an
/// explicit HTTP listener.
fn through_remora(
    name: &str,
    serve: impl FnOnce(TcpListener) + Send + 'static,
) -> (std::net::SocketAddr, Explicit) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = listener.local_addr().unwrap();
    std::thread::spawn(move || serve(listener));
    (upstream, Explicit::start(name, upstream, "http"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// An HTTP/2 client of the proxy listening on `listen`, ready to send; its connection runs in
/// a task of its own.
async fn client(listen: u16) -> h2::client::SendRequest<bytes::Bytes> {
    let socket = tokio::net::TcpStream::connect(("127.0.0.1", listen))
        .await
        .unwrap();
    let (send, conn) = h2::client::handshake(socket).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send.ready().await.unwrap()
}

/// Three connections in a row refuse the request with GOAWAY: more than Istio's two retries
/// would cover, so a refusal that spent a retry would end in 503 URX.
/// The status of a response through Remora, bounded in time.
async fn status(response: h2::client::ResponseFuture) -> http::StatusCode {
    tokio::time::timeout(Duration::from_secs(20), response)
        .await
        .expect("an answer in time")
        .unwrap()
        .status()
}

#[test]
fn requests_refused_by_goaway_go_on_a_new_connection_without_spending_retries() {
    let connections = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&connections);
    let (upstream, proxy) = through_remora("goaway", move |l| serve(l, 3, seen));
    let listen = proxy.listen;

    let runtime = runtime();
    let status = runtime.block_on(async move {
        let mut send = client(listen).await;
        let request = http::Request::get(format!("http://{upstream}/"))
            .body(())
            .unwrap();
        let (response, _) = send.send_request(request, true).unwrap();
        status(response).await
    });
    assert_eq!(status, http::StatusCode::OK);
    assert_eq!(connections.load(Ordering::SeqCst), 4);
}

/// The frames of the first request on the first connection, as (type, flags, payload length),
/// sent back once the request has ended; the request is answered 200.
fn record_first_request(
    listener: TcpListener,
    frames: std::sync::mpsc::Sender<Vec<(u8, u8, usize)>>,
) {
    let Ok((mut s, _)) = listener.accept() else {
        return;
    };
    if !start(&mut s) {
        return;
    }
    let mut seen = Vec::new();
    while let Some((kind, flags, stream, len)) = read_frame(&mut s) {
        match kind {
            SETTINGS if flags & ACK == 0 => {
                let _ = s.write_all(&frame(SETTINGS, ACK, 0, &[]));
            }
            HEADERS | DATA if stream == 1 => {
                seen.push((kind, flags, len));
                if flags & END_STREAM != 0 {
                    let _ = s.write_all(&frame(HEADERS, END_STREAM_AND_HEADERS, 1, &[0x88]));
                    // Anything sent after the end of the stream would come within this time.
                    std::thread::sleep(Duration::from_millis(300));
                    s.set_nonblocking(true).unwrap();
                    while let Some((kind, flags, stream, len)) = read_frame(&mut s) {
                        if stream == 1 {
                            seen.push((kind, flags, len));
                        }
                    }
                    let _ = frames.send(seen);
                    return;
                }
            }
            _ => {}
        }
    }
}

/// A request body that arrived whole (a gRPC call's message) ends on its own DATA frame, as
/// the client sent it: no empty DATA frame after it to carry the end of the stream, which
/// would cost the upstream one more frame and Remora one more write per call. The request goes
/// through the retry policy's replayable body, as every outbound request with a body does.
#[test]
fn a_whole_request_body_ends_the_stream_on_its_last_data_frame() {
    let (tx, rx) = std::sync::mpsc::channel();
    let (upstream, proxy) = through_remora("h2frames", move |l| record_first_request(l, tx));
    let listen = proxy.listen;

    let runtime = runtime();
    let status = runtime.block_on(async move {
        let mut send = client(listen).await;
        let request = http::Request::post(format!("http://{upstream}/pkg.Service/Call"))
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        let (response, mut body) = send.send_request(request, false).unwrap();
        body.send_data(bytes::Bytes::from_static(b"hello"), true)
            .unwrap();
        status(response).await
    });
    assert_eq!(status, http::StatusCode::OK);
    let frames = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(
        frames,
        vec![(HEADERS, 0x4, frames[0].2), (DATA, END_STREAM, 5)],
        "HEADERS (END_HEADERS), then one DATA frame with the body and END_STREAM"
    );
}

/// Byte `i` of a patterned body: a byte lost, repeated or moved shows as a mismatch.
fn pattern(start: usize, len: usize) -> bytes::Bytes {
    (start..start + len)
        .map(|i| u8::try_from(i % 251).unwrap())
        .collect()
}

/// Reads a whole body, giving its flow-control capacity back as it goes.
async fn read_all(mut body: h2::RecvStream) -> Vec<u8> {
    let mut all = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        all.extend_from_slice(&chunk);
    }
    all
}

/// Sends `len` patterned bytes in chunks of `chunk`, waiting for flow-control capacity.
async fn send_all(stream: &mut h2::SendStream<bytes::Bytes>, len: usize, chunk: usize) {
    let mut at = 0;
    while at < len {
        let n = chunk.min(len - at);
        stream.reserve_capacity(n);
        let granted = std::future::poll_fn(|cx| stream.poll_capacity(cx))
            .await
            .unwrap()
            .unwrap();
        let n = granted.min(n);
        stream.send_data(pattern(at, n), at + n == len).unwrap();
        at += n;
    }
}

const UPLOAD: usize = 3 * 1024 * 1024 + 7;
const DOWNLOAD: usize = 5 * 1024 * 1024 + 13;

/// An h2 upstream that checks the request body's every byte and answers with a patterned body.
async fn bulk_origin(listener: tokio::net::TcpListener) {
    let (socket, _) = listener.accept().await.unwrap();
    let mut conn = h2::server::handshake(socket).await.unwrap();
    if let Some(Ok((request, mut respond))) = conn.accept().await {
        tokio::spawn(async move { while conn.accept().await.is_some() {} });
        let got = read_all(request.into_body()).await;
        let status = if got.len() == UPLOAD && got == pattern(0, UPLOAD) {
            200
        } else {
            400
        };
        let response = http::Response::builder().status(status).body(()).unwrap();
        let mut stream = respond.send_response(response, false).unwrap();
        send_all(&mut stream, DOWNLOAD, 16 * 1024).await;
    }
}

/// Megabytes each way through Remora's HTTP/2 client and server: every byte arrives once and
/// in order, across many turns whose writes are gathered (more than a turn may hold) and under
/// both sides' flow control.
#[test]
fn bulk_bodies_cross_http2_whole_and_in_order() {
    let runtime = runtime();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let upstream = listener.local_addr().unwrap();
    let proxy = Explicit::start("h2bulk", upstream, "http");
    let listen = proxy.listen;
    let (status, body) = runtime.block_on(async move {
        tokio::spawn(bulk_origin(listener));
        let mut send = client(listen).await;
        let request = http::Request::post(format!("http://{upstream}/bulk"))
            .body(())
            .unwrap();
        let (response, mut stream) = send.send_request(request, false).unwrap();
        let exchange = async {
            // Chunks larger than a frame, so Remora's writes come in several sizes.
            send_all(&mut stream, UPLOAD, 100_000).await;
            let response = response.await.unwrap();
            let status = response.status();
            (status, read_all(response.into_body()).await)
        };
        tokio::time::timeout(Duration::from_secs(60), exchange)
            .await
            .expect("the exchange in time")
    });
    assert_eq!(
        status,
        http::StatusCode::OK,
        "the upstream got the upload whole"
    );
    assert_eq!(body.len(), DOWNLOAD);
    assert!(
        body == pattern(0, DOWNLOAD),
        "the download arrived whole and in order"
    );
}
