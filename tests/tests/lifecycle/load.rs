//! Well-behaved clients for the lifecycle tests, counting everything that happens to them.
//!
//! - HTTP/1.1 keep-alive: requests one after another on one connection; a response carrying
//!   `connection: close` ends the connection (the client closes it and opens another). One of
//!   them asks for `/./`, which inbound is served by hyper's HTTP/1.1 rather than Remora's own.
//! - HTTP/1.1 one connection per request (`connection: close` sent), so that connections, and
//!   with mesh TLS handshakes, are opened all the time.
//! - HTTP/2: a few streams at once on one connection (the `h2` crate). Its reads go through
//!   [`FrameSniffer`], which records every GOAWAY frame the server sends (last stream id and
//!   error code); after GOAWAY the client opens no new stream there and takes a new
//!   connection.
//!
//! A *failure* is a request written on a connection that did not get a whole 200 back
//! (refused, reset, cut, another status), or a connection that broke without a GOAWAY or a
//! `connection: close` telling the client first; so is a refused `connect()`. Once the test
//! says a drain has begun, connections opened from then on that were served and then told to
//! go are counted apart too.

use bytes::Bytes;
use remora_e2e::http_client::Client;
use remora_e2e::Netns;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bound on one HTTP/2 step (handshake, a response, a body).
const H2_STEP: Duration = Duration::from_secs(10);
/// Requests one client sends at most: a test that never stops its clients has hung anyway.
const MAX_REQUESTS: u64 = 1_000_000;

/// One GOAWAY frame as received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoAway {
    pub last_stream_id: u32,
    pub error_code: u32,
}

/// What the clients saw, shared by all of them.
#[derive(Debug, Default)]
pub struct Tally {
    /// Requests answered 200 in full.
    pub ok: AtomicU64,
    /// Connections opened.
    pub connections: AtomicU64,
    /// Of the failures, those that were a connection reset.
    pub resets: AtomicU64,
    /// Keep-alive responses that carried `connection: close` (the client did not ask for it).
    pub closes: AtomicU64,
    /// HTTP/2 connections that received a GOAWAY.
    pub h2_goaway_connections: AtomicU64,
    /// Answers to the `/./` client whose backend saw `/`: the proxy normalised the path (inbound),
    /// so that client's connection was on hyper's HTTP/1.1.
    pub normalised: AtomicU64,
    /// HTTP/1.1 answers by the backend that gave them (`x-backend`, the routing tests' backend).
    pub backends: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Every GOAWAY frame received.
    pub goaways: Mutex<Vec<GoAway>>,
    /// What went wrong, one line per failure.
    pub failures: Mutex<Vec<String>>,
    /// Set by the test as it starts a drain (SIGTERM): connections opened from then on are
    /// counted apart below.
    pub signalled: AtomicBool,
    /// Keep-alive HTTP/1.1 connections opened once `signalled`, answered 200 and then told
    /// `connection: close`.
    pub late_h1_told: AtomicU64,
    /// HTTP/2 connections opened once `signalled`, answered 200 and then given GOAWAY.
    pub late_h2_told: AtomicU64,
    /// Set by the test to stop every client after its current request.
    pub stop: AtomicBool,
}

impl Tally {
    fn fail(&self, what: String) {
        self.failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(what);
    }

    fn fail_io(&self, what: &str, e: &io::Error) {
        if matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
        ) {
            self.resets.fetch_add(1, Ordering::Relaxed);
        }
        self.fail(format!("{what}: {e} ({:?})", e.kind()));
    }

    /// Failures so far.
    pub fn failures(&self) -> Vec<String> {
        self.failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The counts as one line for the test's output.
    pub fn summary(&self) -> String {
        format!(
            "ok={} failures={} resets={} connections={} closes={} h2_goaway_connections={} late_h1_told={} late_h2_told={} backends={:?} goaways={:?}",
            self.ok.load(Ordering::Relaxed),
            self.failures.lock().unwrap_or_else(PoisonError::into_inner).len(),
            self.resets.load(Ordering::Relaxed),
            self.connections.load(Ordering::Relaxed),
            self.closes.load(Ordering::Relaxed),
            self.h2_goaway_connections.load(Ordering::Relaxed),
            self.late_h1_told.load(Ordering::Relaxed),
            self.late_h2_told.load(Ordering::Relaxed),
            self.backends.lock().unwrap_or_else(PoisonError::into_inner),
            self.goaways.lock().unwrap_or_else(PoisonError::into_inner).iter().take(8).collect::<Vec<_>>(),
        )
    }

    /// Requests answered so far.
    pub fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// How an HTTP/1.1 client uses its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum H1 {
    KeepAlive,
    /// Keep-alive, asking for `/./` rather than `/`: inbound, a path to normalise hands the
    /// connection from Remora's own HTTP/1.1 exchange to hyper's, so that both are drained.
    KeepAliveDotted,
    ConnectionPerRequest,
}

/// An HTTP/1.1 client from `ns` to `addr`, until told to stop or `deadline`.
pub fn http1_client(
    ns: &Netns,
    addr: SocketAddr,
    host: &str,
    mode: H1,
    tally: &Tally,
    deadline: Instant,
) {
    let mut sent = 0;
    while !tally.stopped() && Instant::now() < deadline && sent < MAX_REQUESTS {
        let mut client = match Client::connect(ns, addr) {
            Ok(c) => c,
            Err(e) => {
                tally.fail_io("connect", &e);
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        tally.connections.fetch_add(1, Ordering::Relaxed);
        let late = tally.signalled.load(Ordering::Relaxed);
        let headers: &[(&str, &str)] = match mode {
            H1::KeepAlive | H1::KeepAliveDotted => &[],
            H1::ConnectionPerRequest => &[("connection", "close")],
        };
        let path = match mode {
            H1::KeepAliveDotted => "/./",
            _ => "/",
        };
        let mut on_this = 0;
        while !tally.stopped() && Instant::now() < deadline && sent < MAX_REQUESTS {
            sent += 1;
            on_this += 1;
            match client.get(host, path, headers) {
                Ok(r) if r.status == 200 => {
                    tally.ok.fetch_add(1, Ordering::Relaxed);
                    if mode == H1::KeepAliveDotted {
                        let seen: Option<serde_json::Value> = serde_json::from_slice(&r.body).ok();
                        if seen.is_some_and(|v| v["path"] == "/") {
                            tally.normalised.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if let Some(name) = r.header("x-backend") {
                        *tally
                            .backends
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .entry(name.to_string())
                            .or_default() += 1;
                    }
                    let close = r
                        .header("connection")
                        .is_some_and(|c| c.eq_ignore_ascii_case("close"));
                    if close && mode != H1::ConnectionPerRequest {
                        tally.closes.fetch_add(1, Ordering::Relaxed);
                        if late {
                            tally.late_h1_told.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if close {
                        break;
                    }
                }
                Ok(r) => {
                    tally.fail(format!("HTTP/1.1 {}: {}", r.status, r.text()));
                    break;
                }
                Err(e) => {
                    let what = format!("HTTP/1.1 request {on_this} on a {mode:?} connection");
                    tally.fail_io(&what, &e);
                    break;
                }
            }
        }
    }
}

/// An HTTP/2 client from `ns` to `addr` with `streams` requests in flight at a time, taking a
/// new connection after each GOAWAY, until told to stop or `deadline`. It runs a runtime of its own on the calling thread.
pub fn http2_client(
    ns: &Netns,
    addr: SocketAddr,
    authority: &str,
    streams: usize,
    tally: &Arc<Tally>,
    deadline: Instant,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    while !tally.stopped() && Instant::now() < deadline {
        let socket = match ns.connect(addr, H2_STEP) {
            Ok(s) => s,
            Err(e) => {
                tally.fail_io("connect", &e);
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        tally.connections.fetch_add(1, Ordering::Relaxed);
        let result = runtime.block_on(http2_connection(
            socket, authority, streams, tally, deadline,
        ));
        if let Err(e) = result {
            tally.fail(e);
        }
    }
}

/// One HTTP/2 connection, used until GOAWAY, the test's stop or `deadline`.
async fn http2_connection(
    socket: std::net::TcpStream,
    authority: &str,
    streams: usize,
    tally: &Arc<Tally>,
    deadline: Instant,
) -> Result<(), String> {
    let late = tally.signalled.load(Ordering::Relaxed);
    let answered_here = Arc::new(AtomicU64::new(0));
    socket.set_nonblocking(true).map_err(|e| e.to_string())?;
    let socket = tokio::net::TcpStream::from_std(socket).map_err(|e| e.to_string())?;
    let goaways = Arc::new(Mutex::new(Vec::new()));
    let sniffer = FrameSniffer::new(socket, Arc::clone(&goaways));
    let (send, conn) = tokio::time::timeout(H2_STEP, h2::client::handshake(sniffer))
        .await
        .map_err(|_| "h2 handshake: no answer".to_string())?
        .map_err(|e| format!("h2 handshake: {e}"))?;
    let driver = tokio::spawn(conn);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..streams {
        let (send, tally, goaways) = (send.clone(), Arc::clone(tally), Arc::clone(&goaways));
        let answered = Arc::clone(&answered_here);
        let uri = format!("http://{authority}/");
        tasks.spawn(async move {
            let seen_goaway = || {
                !goaways
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .is_empty()
            };
            for _ in 0..MAX_REQUESTS {
                if tally.stopped() || Instant::now() >= deadline {
                    return;
                }
                // A well-behaved client opens no stream once the server has said GOAWAY.
                if seen_goaway() {
                    return;
                }
                let mut ready = match tokio::time::timeout(H2_STEP, send.clone().ready()).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(e)) if seen_goaway() || e.is_go_away() => return,
                    Ok(Err(e)) => return tally.fail(format!("h2 ready: {e}")),
                    Err(_) => return tally.fail("h2 ready: no capacity in time".into()),
                };
                let request = http::Request::get(&uri).body(()).expect("a request");
                let response = match ready.send_request(request, true) {
                    Ok((response, _)) => response,
                    // Refused locally before anything was sent: the GOAWAY arrived between
                    // the check and the send.
                    Err(e) if seen_goaway() || e.is_go_away() => return,
                    Err(e) => return tally.fail(format!("h2 send: {e}")),
                };
                match tokio::time::timeout(H2_STEP, answer(response)).await {
                    Ok(Ok(http::StatusCode::OK)) => {
                        tally.ok.fetch_add(1, Ordering::Relaxed);
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Ok(status)) => return tally.fail(format!("h2 status {status}")),
                    Ok(Err(e)) => {
                        if e.is_io() || e.reason() == Some(h2::Reason::CANCEL) {
                            tally.resets.fetch_add(1, Ordering::Relaxed);
                        }
                        return tally.fail(format!("h2 stream: {e}"));
                    }
                    Err(_) => return tally.fail("h2 stream: no answer in time".into()),
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    drop(send);
    let seen: Vec<GoAway> = goaways
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    if !seen.is_empty() {
        tally.h2_goaway_connections.fetch_add(1, Ordering::Relaxed);
        if late && answered_here.load(Ordering::Relaxed) > 0 {
            tally.late_h2_told.fetch_add(1, Ordering::Relaxed);
        }
        tally
            .goaways
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(seen);
        // After GOAWAY the server closes once its streams are done: the driver ends.
        match tokio::time::timeout(H2_STEP, driver).await {
            Ok(_) => {}
            Err(_) => tally.fail("h2 connection still open after GOAWAY".into()),
        }
    } else {
        driver.abort();
    }
    Ok(())
}

/// A response, read to its end; its status.
async fn answer(response: h2::client::ResponseFuture) -> Result<http::StatusCode, h2::Error> {
    let response = response.await?;
    let status = response.status();
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    Ok(status)
}

/// The client's socket, reading the server's frames as they pass to note each GOAWAY: the
/// `h2` client does not say when one arrives.
pub struct FrameSniffer<T> {
    inner: T,
    goaways: Arc<Mutex<Vec<GoAway>>>,
    header: [u8; 9],
    header_len: usize,
    /// Payload bytes of the current frame still to come.
    remaining: usize,
    /// The current frame is a GOAWAY: its first 8 payload bytes.
    goaway: Option<Vec<u8>>,
}

impl<T> FrameSniffer<T> {
    pub fn new(inner: T, goaways: Arc<Mutex<Vec<GoAway>>>) -> Self {
        FrameSniffer {
            inner,
            goaways,
            header: [0; 9],
            header_len: 0,
            remaining: 0,
            goaway: None,
        }
    }

    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len());
                if let Some(g) = &mut self.goaway {
                    let want = 8usize.saturating_sub(g.len()).min(n);
                    g.extend_from_slice(&data[..want]);
                }
                self.remaining -= n;
                data = &data[n..];
                if self.remaining == 0 {
                    self.end_frame();
                }
                continue;
            }
            let n = (9 - self.header_len).min(data.len());
            self.header[self.header_len..self.header_len + n].copy_from_slice(&data[..n]);
            self.header_len += n;
            data = &data[n..];
            if self.header_len == 9 {
                self.header_len = 0;
                let h = self.header;
                self.remaining =
                    usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                self.goaway = (h[3] == 0x7).then(Vec::new);
                if self.remaining == 0 {
                    self.end_frame();
                }
            }
        }
    }

    fn end_frame(&mut self) {
        if let Some(g) = self.goaway.take() {
            let word = |i: usize| {
                g.get(i..i + 4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            };
            let frame = GoAway {
                last_stream_id: word(0).unwrap_or(u32::MAX) & 0x7fff_ffff,
                error_code: word(4).unwrap_or(u32::MAX),
            };
            self.goaways
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(frame);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FrameSniffer<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = result {
            let new = buf.filled()[before..].to_vec();
            self.feed(&new);
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FrameSniffer<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// An h2c origin answering every request 200 with a short body after `delay` (so that
/// streams are in flight when a lifecycle event lands).
pub async fn h2_origin(listener: std::net::TcpListener, delay: Duration) {
    listener.set_nonblocking(true).expect("non-blocking");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    while let Ok((socket, _)) = listener.accept().await {
        tokio::spawn(async move {
            let Ok(mut conn) = h2::server::handshake(socket).await else {
                return;
            };
            while let Some(Ok((_request, mut respond))) = conn.accept().await {
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let response = http::Response::builder()
                        .status(200)
                        .body(())
                        .expect("response");
                    if let Ok(mut body) = respond.send_response(response, false) {
                        let _ = body.send_data(Bytes::from_static(b"ok\n"), true);
                    }
                });
            }
        });
    }
}
