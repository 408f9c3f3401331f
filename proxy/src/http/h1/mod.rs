//! Remora's own HTTP/1.1 exchange: the fast path for plain keep-alive traffic.
//!
//! hyper serves a connection with two tasks and a channel per upstream exchange, parses every
//! head into a header map and writes it out again, and holds two 8 KiB buffers per connection
//! for its whole life. Most sidecar traffic is simpler than what that machinery is for: a
//! request head and a short body that arrive in one read, a response with a length or chunks.
//! Such a request is served here in the connection's own task: the head is parsed in place
//! ([`head`]), forwarded as received minus hop-by-hop lines plus the mesh's headers, and the
//! response is passed back as it comes, its framing followed ([`chunked`]) but never rebuilt.
//! Buffers exist only while a request is in flight.
//!
//! The first request this path does not serve (an upgrade, CONNECT, a chunked or partly-read
//! body, HTTP/1.0, gRPC, a head that is malformed, over the limits or not all here; inbound, a
//! path to normalise or authorization policies to apply) hands the connection, with every byte
//! not yet served, to hyper ([`super::serve`]) for the rest of its life. So every refusal,
//! limit and timeout keeps the one behaviour the general path gives it.
//!
//! What a request gets is the general path's: `x-request-id`, `x-forwarded-proto`, Istio's
//! retries and `x-envoy-attempt-count` outbound, `http.request_timeout`, Envoy's local
//! replies and flags, pooled upstream connections (a pool of raw sockets beside hyper's),
//! the same metrics, access-log lines and draining.

pub mod buffers;
mod chunked;
pub mod head;

use super::access_log::RequestLog;
use super::body::RequestEnd;
use super::errors::{ErrorKind, Flags};
use super::pool::Pooled;
use super::ConnContext;
use crate::connect::{self, ConnectError, Upstream};
use crate::Direction;
use bytes::{Buf, BytesMut};
use chunked::ChunkedEnd;
use head::{Framing, ResponseHead};
use std::borrow::Cow;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Room a read asks for: a request or a response head and a short body in one go.
const READ_SIZE: usize = buffers::SIZE;

/// What every connection on the fast path shares: idle upstream sockets and read buffers.
#[derive(Debug, Default)]
pub struct Shared {
    pub pool: Arc<super::pool::Pool<Upstream>>,
    pub buffers: buffers::Buffers,
}

/// How a connection left the fast path.
#[derive(Debug)]
pub enum Served {
    /// It is over: closed by either side, or cut after an error.
    Ended(io::Result<()>),
    /// hyper serves the rest: the bytes read and not served yet come first, and the upstream
    /// connection detection opened, if no request used it.
    HandOff {
        prefix: BytesMut,
        early: Option<Upstream>,
    },
}

/// A raw upstream socket is closed when the reactor has seen it readable while idle (the
/// server's FIN, or bytes no request asked for): then a read does not block. Probing costs no
/// system call while the socket has been quiet.
impl Pooled for Upstream {
    fn is_closed(&self) -> bool {
        let mut probe = [0u8; 1];
        !matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    fn share(&mut self) -> Option<Self> {
        None
    }
}

/// Serve requests on `client` until it closes or a request needs hyper. `buf` holds the bytes
/// detection read; `early` is the upstream connection detection opened.
pub async fn serve(
    ctx: &Arc<ConnContext>,
    client: &mut TcpStream,
    mut buf: BytesMut,
    mut early: Option<Upstream>,
) -> Served {
    let http = &ctx.config.http;
    let limits = head::Limits {
        max_header_bytes: http.max_header_bytes,
        max_headers: http.max_headers,
        drop_client_cert: ctx.direction == Direction::Inbound,
        drop_attempt_count: retries(ctx) > 0,
    };
    // One timer for the connection's life, moved only when it fires early: the idle bound
    // costs no timer operation per request.
    let idle_timeout = http.idle_timeout;
    let mut last_active = tokio::time::Instant::now();
    // One timer for the connection's life, moved only when it fires early: the idle bound
    // costs no timer operation per request.
    let idle = tokio::time::sleep(idle_timeout);
    tokio::pin!(idle);
    let draining = async {
        match ctx.direction {
            Direction::Inbound => ctx.proxy.drain.started().await,
            Direction::Outbound => std::future::pending().await,
        }
    };
    tokio::pin!(draining);
    let mut drained = false;
    let buffers = &ctx.proxy.h1.buffers;
    loop {
        if buf.is_empty() {
            // Nothing held while the connection waits.
            if buf.capacity() > 0 {
                buffers.give(std::mem::take(&mut buf));
            }
            let readable = loop {
                tokio::select! {
                    biased;
                    r = client.readable() => break r.is_ok(),
                    () = &mut idle => {
                        let due = last_active + idle_timeout;
                        if tokio::time::Instant::now() >= due {
                            tracing::debug!(peer = %ctx.peer, "closing idle HTTP connection");
                            break false;
                        }
                        idle.as_mut().reset(due);
                    }
                    () = &mut draining, if !drained => {
                        drained = true;
                        ctx.closing.store(true, Ordering::Relaxed);
                        // A client that has not asked anything yet is answered, with close.
                        if ctx.served.load(Ordering::Relaxed) > 0 {
                            break false;
                        }
                    }
                }
            };
            if !readable {
                return Served::Ended(Ok(()));
            }
            buf = buffers.take();
            // A read, not a `try_read`: a read that leaves room in the buffer tells tokio the
            // socket is drained, which saves a system call that would find it empty.
            match client.read_buf(&mut buf).await {
                Ok(0) => return Served::Ended(Ok(())),
                Ok(n) => ctx.count_received(n),
                Err(e) => return Served::Ended(Err(e)),
            }
        }
        let Some(prepared) = prepare(ctx, &buf, &limits) else {
            return Served::HandOff { prefix: buf, early };
        };
        let (total, client_close) = (prepared.total, prepared.close);
        // Boxed: a request's state (several hundred bytes across its awaits) is held only while
        // it is in flight, not for the connection's life.
        let exchange = request(ctx, client, &buf[..total], prepared, &mut early);
        let keep = Box::pin(exchange).await;
        buf.advance(total);
        last_active = tokio::time::Instant::now();
        if !keep || client_close || ctx.closing() {
            let _ = client.shutdown().await;
            return Served::Ended(Ok(()));
        }
    }
}

/// A request the fast path serves, ready to go upstream.
struct Prepared {
    /// Bytes of the request (head and body) at the start of the buffer.
    total: usize,
    head_len: usize,
    /// The client asked to close after it.
    close: bool,
    /// Its head for the upstream, without the blank line.
    upstream_head: Vec<u8>,
    is_head: bool,
    idempotent: bool,
    end: RequestEnd,
}

/// Judge the request at the start of `buf` and prepare it; `None` if hyper should serve it.
fn prepare(ctx: &Arc<ConnContext>, buf: &[u8], limits: &head::Limits) -> Option<Prepared> {
    let start = (SystemTime::now(), Instant::now());
    let head = head::parse_request(buf, limits)?;
    // The body must be here whole; hyper streams a longer one.
    let total = usize::try_from(head.content_length)
        .ok()
        .and_then(|n| n.checked_add(head.len))
        .filter(|total| *total <= buf.len())?;
    if ctx.direction == Direction::Inbound && !inbound_as_is(ctx, head.target) {
        return None;
    }
    let mut end = RequestEnd::new(Arc::clone(ctx), None, false, start.1);
    let body = &buf[head.len..total];
    if !body.is_empty() {
        end.received.data(body);
    }
    let id = head
        .request_id
        .is_none()
        .then(super::headers::request_id_bytes);
    let mut upstream_head = Vec::with_capacity(total + 128);
    let mut extra: [&[u8]; 4] = [b""; 4];
    if let Some(id) = &id {
        extra[0] = b"x-request-id: ";
        extra[1] = id;
        extra[2] = b"\r\n";
    }
    if !head.forwarded_proto {
        extra[3] = b"x-forwarded-proto: http\r\n";
    }
    head.write_upstream(buf, &extra, &mut upstream_head);
    // The blank line goes back on per attempt, after the attempt count.
    upstream_head.truncate(upstream_head.len() - 2);
    if ctx.logging() {
        end.log = Some(Box::new(request_log(start, &head, id.as_ref(), &end)));
    }
    Some(Prepared {
        total,
        head_len: head.len,
        close: head.close,
        upstream_head,
        is_head: head.is_head(),
        idempotent: head.idempotent(),
        end,
    })
}

/// Serve one prepared request (`bytes` are its head and body as received); whether the
/// connection can take another. The request's metrics and log line are recorded when it ends.
async fn request(
    ctx: &ConnContext,
    client: &mut TcpStream,
    bytes: &[u8],
    p: Prepared,
    early: &mut Option<Upstream>,
) -> bool {
    let mut end = p.end;
    let request = Request {
        head: p.upstream_head,
        body: &bytes[p.head_len..],
        is_head: p.is_head,
        idempotent: p.idempotent,
        close: p.close,
    };
    let exchange = exchange(ctx, client, request, &mut end, early);
    let outcome = match ctx.config.http.request_timeout {
        t if t.is_zero() => exchange.await,
        t => match tokio::time::timeout(t, exchange).await.ok() {
            Some(outcome) => outcome,
            None if end.status == 0 => Err(Failed::Local(ErrorKind::Timeout)),
            None => {
                end.flags.insert(Flags::UT);
                Err(Failed::Cut)
            }
        },
    };
    match outcome {
        Ok(keep) => keep,
        Err(Failed::Local(kind)) => local_reply(ctx, client, kind, &mut end).await,
        Err(Failed::Cut) => false,
    }
}

/// Whether an inbound request goes upstream as it came: no authorization policy to apply and a
/// path already in normal form. Otherwise hyper's path normalises and decides it.
fn inbound_as_is(ctx: &ConnContext, target: &str) -> bool {
    if ctx.proxy.authz.is_active() {
        return false;
    }
    let mode = ctx.config.authorization.path_normalization;
    matches!(
        crate::authz::path::normalize(target, mode),
        Ok(Cow::Borrowed(_))
    )
}

/// Whether responses should tell the client to close: inbound connections close as draining
/// starts (outbound ones keep serving: the application may still need its peers).
fn closing(ctx: &ConnContext) -> bool {
    if ctx.closing() {
        return true;
    }
    let draining = ctx.direction == Direction::Inbound && ctx.proxy.drain.is_draining();
    if draining {
        ctx.closing.store(true, Ordering::Relaxed);
    }
    draining
}

/// The retries an outbound request gets (Istio's default policy); inbound gets none.
fn retries(ctx: &ConnContext) -> u32 {
    match ctx.direction {
        Direction::Outbound => ctx.config.http.retries,
        Direction::Inbound => 0,
    }
}

/// A request ready for the upstream: its head without the blank line, and its body.
struct Request<'a> {
    /// The client asked to close after it.
    close: bool,
    head: Vec<u8>,
    body: &'a [u8],
    is_head: bool,
    idempotent: bool,
}

/// Why a request got no response from the upstream.
enum Failed {
    /// Nothing was written to the client yet: answer for the proxy.
    Local(ErrorKind),
    /// The response was under way, or the client is gone: the connection ends.
    Cut,
}

/// Send the request upstream (retrying as Istio's default policy says) and pass the response
/// to the client. `Ok(keep)`: the response went out whole; `keep` says whether the client's
/// connection can take another request.
async fn exchange(
    ctx: &ConnContext,
    client: &mut TcpStream,
    mut req: Request<'_>,
    end: &mut RequestEnd,
    early: &mut Option<Upstream>,
) -> Result<bool, Failed> {
    let http = &ctx.config.http;
    let retries = retries(ctx);
    let base = req.head.len();
    let mut attempt: u32 = 1;
    // A pooled connection the server closed as we sent is tried again once on a new one, for
    // a request that is harmless to repeat.
    let mut stale_retry = req.idempotent;
    // After a stale pooled connection, the next attempt dials: its siblings are likely stale too.
    let mut dial = false;
    // What the upstream's response is read into.
    let mut rbuf = ctx.proxy.h1.buffers.lend();
    let rbuf: &mut BytesMut = &mut rbuf;
    let (mut up, response) = loop {
        // Detection's connection counts as reused: it may have waited on a slow client for as
        // long as the server keeps idle connections open.
        let (mut up, reused) = match early.take() {
            Some(up) => (up, true),
            None => match (!dial)
                .then(|| {
                    ctx.proxy
                        .h1
                        .pool
                        .checkout(&ctx.key, Instant::now(), http.pool_idle_timeout)
                })
                .flatten()
            {
                Some(up) => (up, true),
                None => match open(ctx).await {
                    Ok(up) => (up, false),
                    Err(kind) => {
                        if kind.retryable() && retries > 0 {
                            if attempt <= retries {
                                backoff(ctx, attempt).await;
                                attempt += 1;
                                continue;
                            }
                            end.flags.insert(Flags::URX);
                        }
                        return Err(Failed::Local(kind));
                    }
                },
            },
        };
        req.head.truncate(base);
        if retries > 0 {
            req.head.extend_from_slice(b"x-envoy-attempt-count: ");
            req.head
                .extend_from_slice(itoa_u32(attempt, &mut [0u8; 10]).as_bytes());
            req.head.extend_from_slice(b"\r\n");
        }
        req.head.extend_from_slice(b"\r\n");
        req.head.extend_from_slice(req.body);
        rbuf.clear();
        let answered = match up.stream.write_all(&req.head).await {
            Ok(()) => response_head(&mut up.stream, rbuf, req.is_head).await,
            Err(e) => Err(ResponseError::Io(e)),
        };
        let response = match answered {
            Ok(r) => r,
            Err(e) => {
                if reused && stale_retry && rbuf.is_empty() && matches!(e, ResponseError::Io(_)) {
                    stale_retry = false;
                    dial = true;
                    tracing::debug!(dst = %ctx.key.destination, "pooled connection closed; opening another");
                    continue;
                }
                tracing::debug!(dst = %ctx.key.destination, error = %e, "upstream request failed");
                return Err(Failed::Local(e.kind()));
            }
        };
        if retries > 0 && response.status == 503 {
            if attempt <= retries {
                // Its body is not read: the connection goes with it.
                drop(up);
                backoff(ctx, attempt).await;
                attempt += 1;
                continue;
            }
            end.flags.insert(Flags::URX);
        }
        break (up, response);
    };
    if let Some(log) = &mut end.log {
        log.status = response.status;
        log.upstream = Some(ctx.key.destination);
        log.upstream_time = Some(end.started.elapsed());
    }
    end.status = response.status;

    // The response: head and what came with it in one write, then the rest as it arrives.
    let keep_client = response.framing != Framing::Close && !req.close && !closing(ctx);
    let mut out = Vec::with_capacity(rbuf.len() + 32);
    response.write_downstream(rbuf, !keep_client, &mut out);
    rbuf.advance(response.len);
    let mut body = Body::new(response.framing);
    // Nothing is written yet: a body that starts malformed is answered 502 like a bad head.
    let (now, mut done) = body
        .take(rbuf)
        .map_err(|_| Failed::Local(ErrorKind::UpstreamProtocol))?;
    out.extend_from_slice(&rbuf[..now]);
    let mut reusable = !response.close && now == rbuf.len();
    send(ctx, client, &out, end, now).await?;
    drop(out);
    while !done {
        rbuf.clear();
        rbuf.reserve(READ_SIZE);
        let n = match up.stream.read_buf(rbuf).await {
            Ok(0) if body.framing == Framing::Close => {
                done = true;
                reusable = false;
                continue;
            }
            Ok(0) | Err(_) => {
                end.flags.insert(Flags::UR);
                return Err(Failed::Cut);
            }
            Ok(n) => n,
        };
        let (now, finished) = body.take(rbuf).map_err(|_| {
            end.flags.insert(Flags::UPE);
            Failed::Cut
        })?;
        reusable &= now == n;
        done = finished;
        send(ctx, client, &rbuf[..now], end, now).await?;
    }
    end.complete = true;
    if reusable {
        ctx.proxy.h1.pool.checkin(
            ctx.key,
            up,
            http.pool_idle_timeout,
            http.pool_max_idle_per_upstream,
        );
    }
    Ok(keep_client)
}

/// Write response bytes to the client, `body` of them body bytes.
async fn send(
    ctx: &ConnContext,
    client: &mut TcpStream,
    bytes: &[u8],
    end: &mut RequestEnd,
    body: usize,
) -> Result<(), Failed> {
    client.write_all(bytes).await.map_err(|e| {
        tracing::debug!(peer = %ctx.peer, error = %e, "client gone during the response");
        Failed::Cut
    })?;
    ctx.count_sent(bytes.len());
    end.sent += body as u64;
    Ok(())
}

/// How much of a response body is left.
struct Body {
    framing: Framing,
    remaining: u64,
    chunks: ChunkedEnd,
}

impl Body {
    fn new(framing: Framing) -> Self {
        Body {
            framing,
            remaining: match framing {
                Framing::Length(n) => n,
                _ => 0,
            },
            chunks: ChunkedEnd::default(),
        }
    }

    /// Of `bytes` just read, how many belong to the body, and whether it is over with them.
    fn take(&mut self, bytes: &[u8]) -> Result<(usize, bool), chunked::BadChunk> {
        Ok(match self.framing {
            Framing::None => (0, true),
            Framing::Length(_) => {
                let n = usize::try_from(self.remaining)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                self.remaining -= n as u64;
                (n, self.remaining == 0)
            }
            Framing::Chunked => match self.chunks.feed(bytes)? {
                Some(n) => (n, true),
                None => (bytes.len(), false),
            },
            Framing::Close => (bytes.len(), false),
        })
    }
}

/// Why no response head came back.
#[derive(Debug, thiserror::Error)]
enum ResponseError {
    #[error("upstream connection: {0}")]
    Io(io::Error),
    #[error("upstream closed the connection before the response")]
    Closed,
    #[error(transparent)]
    Bad(#[from] head::BadResponse),
}

impl ResponseError {
    fn kind(&self) -> ErrorKind {
        match self {
            ResponseError::Bad(_) => ErrorKind::UpstreamProtocol,
            ResponseError::Io(_) | ResponseError::Closed => ErrorKind::ConnectionTerminated,
        }
    }
}

/// Read the response head into `rbuf`, skipping interim (1xx) responses.
async fn response_head(
    up: &mut TcpStream,
    rbuf: &mut BytesMut,
    head_request: bool,
) -> Result<ResponseHead, ResponseError> {
    loop {
        if !rbuf.is_empty() {
            if let Some(head) = head::parse_response(&rbuf[..], head_request)? {
                if !head.interim() {
                    if head.status == 101 {
                        // No upgrade was asked for.
                        return Err(ResponseError::Bad(head::BadResponse));
                    }
                    return Ok(head);
                }
                rbuf.advance(head.len);
                continue;
            }
        }
        rbuf.reserve(READ_SIZE);
        match up.read_buf(rbuf).await {
            Ok(0) if rbuf.is_empty() => return Err(ResponseError::Closed),
            Ok(0) => return Err(ResponseError::Bad(head::BadResponse)),
            Ok(_) => {}
            Err(e) => return Err(ResponseError::Io(e)),
        }
    }
}

/// Open a new upstream connection to the request's destination.
async fn open(ctx: &ConnContext) -> Result<Upstream, ErrorKind> {
    let dst = ctx.key.destination;
    tracing::debug!(%dst, "opening an upstream HTTP/1.1 connection");
    connect::connect(
        dst,
        ctx.key.source,
        ctx.connect_timeout,
        &ctx.proxy.loop_guard,
    )
    .await
    .map_err(|e| {
        tracing::debug!(%dst, error = %e, "upstream connect failed");
        ctx.proxy
            .metrics
            .direction(ctx.direction)
            .connect_failures
            .inc();
        match e {
            ConnectError::Timeout { .. } => ErrorKind::ConnectTimeout,
            ConnectError::Io { .. } => ErrorKind::ConnectFailed,
        }
    })
}

async fn backoff(ctx: &ConnContext, attempt: u32) {
    tokio::time::sleep(super::retry::backoff(
        ctx.config.http.retry_backoff,
        attempt,
    ))
    .await;
}

/// Answer for the proxy, as the general path does (Envoy's status, flag and text); whether
/// the connection can take another request.
async fn local_reply(
    ctx: &ConnContext,
    client: &mut TcpStream,
    kind: ErrorKind,
    end: &mut RequestEnd,
) -> bool {
    let status = kind.status();
    let details = kind.details();
    let keep = !closing(ctx);
    let mut out = Vec::with_capacity(160 + details.len());
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\ncontent-type: text/plain\r\ncontent-length: ");
    out.extend_from_slice(itoa_u32(details.len() as u32, &mut [0u8; 10]).as_bytes());
    if !keep {
        out.extend_from_slice(b"\r\nconnection: close");
    }
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(details.as_bytes());
    end.flags.insert(kind.flag());
    end.status = status.as_u16();
    if let Some(log) = &mut end.log {
        log.status = end.status;
        log.upstream = Some(ctx.key.destination);
    }
    match client.write_all(&out).await {
        Ok(()) => {
            ctx.count_sent(out.len());
            end.sent = details.len() as u64;
            end.complete = true;
            keep
        }
        Err(_) => false,
    }
}

/// The access-log record of a request the fast path serves, as the general path records it.
fn request_log(
    start: (SystemTime, Instant),
    head: &head::RequestHead<'_>,
    id: Option<&[u8; 36]>,
    end: &RequestEnd,
) -> RequestLog {
    let value = |v: &[u8]| http::HeaderValue::from_bytes(v).ok();
    RequestLog {
        start: start.0,
        started: start.1,
        method: http::Method::from_bytes(head.method).ok(),
        uri: head.target.parse().ok(),
        version: http::Version::HTTP_11,
        authority: head.host.and_then(value),
        user_agent: head.user_agent.and_then(value),
        request_id: id.map(|id| &id[..]).or(head.request_id).and_then(value),
        forwarded_for: head.forwarded_for.and_then(value),
        status: 0,
        upstream: None,
        upstream_time: None,
        received: Arc::clone(&end.received),
    }
}

/// `n` in decimal, in `buf`.
fn itoa_u32(mut n: u32, buf: &mut [u8; 10]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&buf[i..]).unwrap_or("0")
}

#[cfg(test)]
mod tests;
