//! An HTTP/2 upstream that refuses requests with GOAWAY, through `remora run` as a process on
//! loopback. A stream above a GOAWAY's last stream id never reached the application, so Remora
//! sends it again on a new connection without spending one of Istio's two retries.

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
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
const END_STREAM_AND_HEADERS: u8 = 0x5;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Reads one frame: its type, flags and stream id (payload skipped); `None` when the peer is
/// gone.
fn read_frame(s: &mut TcpStream) -> Option<(u8, u8, u32)> {
    let mut head = [0u8; 9];
    s.read_exact(&mut head).ok()?;
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).ok()?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Some((head[3], head[4], stream))
}

/// A raw HTTP/2 server: the first `refusing` connections answer the first request with
/// GOAWAY(last stream id 0), which refuses it unprocessed; later ones answer every request
/// 200 with no body (`:status 200` is HPACK's static entry 8).
fn serve(listener: TcpListener, refusing: usize, connections: Arc<AtomicUsize>) {
    for conn in listener.incoming() {
        let Ok(mut s) = conn else { return };
        let n = connections.fetch_add(1, Ordering::SeqCst);
        std::thread::spawn(move || {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut preface = [0u8; 24];
            if s.read_exact(&mut preface).is_err() || preface != PREFACE {
                return;
            }
            if s.write_all(&frame(SETTINGS, 0, 0, &[])).is_err() {
                return;
            }
            while let Some((kind, flags, stream)) = read_frame(&mut s) {
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

/// Three connections in a row refuse the request with GOAWAY: more than Istio's two retries
/// would cover, so a refusal that spent a retry would end in 503 URX.
#[test]
fn requests_refused_by_goaway_go_on_a_new_connection_without_spending_retries() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&connections);
    std::thread::spawn(move || serve(listener, 3, seen));
    let proxy = Explicit::start("goaway", upstream, "http");
    let listen = proxy.listen;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let status = runtime.block_on(async move {
        let socket = tokio::net::TcpStream::connect(("127.0.0.1", listen))
            .await
            .unwrap();
        let (send, conn) = h2::client::handshake(socket).await.unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut send = send.ready().await.unwrap();
        let request = http::Request::get(format!("http://{upstream}/"))
            .body(())
            .unwrap();
        let (response, _) = send.send_request(request, true).unwrap();
        tokio::time::timeout(Duration::from_secs(20), response)
            .await
            .expect("an answer in time")
            .unwrap()
            .status()
    });
    assert_eq!(status, http::StatusCode::OK);
    assert_eq!(connections.load(Ordering::SeqCst), 4);
}
