//! Remora's own HTTP/1.1 exchange: the fast path for plain keep-alive traffic, in the clear or
//! inside mesh TLS terminated here.
//!
//! hyper serves a connection with two tasks and a channel per upstream exchange, parses every
//! head into a header map and writes it out again, and holds two 8 KiB buffers per connection
//! for its whole life. Most sidecar traffic is simpler than what that machinery is for: a
//! request head and a short body that arrive in one read, a response with a length or chunks.
//! Such a request is served here in the connection's own task: the head is parsed in place
//! ([`head`]), forwarded as received minus hop-by-hop lines plus the mesh's headers, and the
//! response is passed back as it comes ([`exchange`]), its framing followed ([`chunked`]) but
//! never rebuilt.
//! Buffers exist only while a request is in flight.
//!
//! The first request this path does not serve (an upgrade, CONNECT, a chunked or partly-read
//! body, HTTP/1.0, gRPC, a head that is malformed, over the limits or not all here; inbound, a
//! path to normalise or authorization policies to apply; over mesh TLS, a client's own
//! `x-forwarded-client-cert`, which hyper's path appends to) hands the connection, with every byte
//! not yet served, to hyper ([`super::serve`]) for the rest of its life. So every refusal,
//! limit and timeout keeps the one behaviour the general path gives it.
//!
//! On a connection routed by xDS, each request takes the general path's route decision and,
//! per attempt, the upstream layer's endpoint ([`super::routed`]): one decision and one
//! upstream layer for both paths; a route that edits heads goes to hyper, as above.
//!
//! What a request gets is the general path's: `x-request-id`, `x-forwarded-proto` (`https`
//! over mesh TLS, with the client sidecar's `x-forwarded-client-cert`), Istio's retries and
//! `x-envoy-attempt-count` outbound, `http.request_timeout`, Envoy's local
//! replies and flags, pooled upstream connections (a pool of raw sockets beside hyper's),
//! the same metrics, access-log lines and draining.

pub mod buffers;
pub(crate) mod chunked;
mod client;
mod exchange;
pub mod head;
mod log;
pub(crate) mod refused;
mod reply;
mod response;
mod route;
mod up;

use super::body::RequestEnd;
use super::errors::{ErrorKind, Flags};
use super::originate::MeshConn;
use super::pool::Pooled;
use super::ConnContext;
use crate::connect::Upstream;
use crate::Direction;
use bytes::{Buf, BytesMut};
pub use client::Client;
use exchange::{exchange, retries, Failed, Request, RoutedRequest};
use remora_config::PathNormalization;
use std::borrow::Cow;
use std::future::Future;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Room a read asks for: a request or a response head and a short body in one go.
const READ_SIZE: usize = buffers::SIZE;

/// What every connection on the fast path shares: idle upstream sockets and read buffers.
#[derive(Debug, Default)]
pub struct Shared {
    pub pool: Arc<super::pool::Pool<Upstream>>,
    /// Idle mesh connections to endpoints routed by xDS, by endpoint and TLS parameters.
    pub mesh: Arc<super::pool::Pool<MeshConn>>,
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

    fn let_go(&mut self, by_peer: bool) {
        if let Some(end) = self.registration_mut().end_mut() {
            end.remote |= by_peer;
        }
    }
}

/// An idle mesh connection to an xDS endpoint is closed as a mesh destination's is
/// ([`super::originate`]).
impl Pooled for MeshConn {
    fn is_closed(&self) -> bool {
        super::originate::closed_while_idle(&self.0)
    }

    fn share(&mut self) -> Option<Self> {
        None
    }

    fn let_go(&mut self, by_peer: bool) {
        if let Some(end) = self.1.end_mut() {
            end.remote |= by_peer;
        }
    }
}

/// Serve requests on `client` until it closes or a request needs hyper. `buf` holds the bytes
/// detection read; `early` is the upstream connection detection opened.
pub async fn serve<C: Client>(
    ctx: &Arc<ConnContext>,
    client: &mut C,
    mut buf: BytesMut,
    mut early: Option<Upstream>,
) -> Served {
    let http = &ctx.config.http;
    let mesh = MeshHeaders::of(ctx);
    let limits = limits_for(ctx, mesh.as_ref());
    let idle_timeout = http.idle_timeout;
    let mut last_active = tokio::time::Instant::now();
    // One timer for the connection's life, moved only when it fires early: the idle bound
    // costs no timer operation per request.
    let idle = tokio::time::sleep(idle_timeout);
    tokio::pin!(idle);
    let draining = ctx.drain_started();
    // Routed by xDS: closed once the drain time of a chain an update retired runs out.
    let cut = crate::chain_drain::deadline(ctx.chain_watch.as_ref(), ctx.config.drain.drain_time);
    tokio::pin!(draining, cut);
    let mut drained = false;
    let buffers = &ctx.proxy.h1.buffers;
    loop {
        if buf.is_empty() {
            // Nothing held while the connection waits.
            if buf.capacity() > 0 {
                buffers.give(std::mem::take(&mut buf));
            }
            let readable = client.holds_data()
                || loop {
                    tokio::select! {
                        biased;
                        r = client.socket().readable() => break r.is_ok(),
                        () = &mut idle => {
                            let due = last_active + idle_timeout;
                            if tokio::time::Instant::now() >= due {
                                idle_close(ctx);
                                break false;
                            }
                            idle.as_mut().reset(due);
                        }
                        () = &mut draining, if !drained => {
                            // The connection stays, and its next request is answered with
                            // `Connection: close`, as Envoy drains HTTP/1.1: a client cut here
                            // could lose the request it may be writing. A connection opened
                            // while draining (the listener accepts on) is served so too. It
                            // ends after that response, with the process, or idle.
                            drained = true;
                            ctx.closing.store(true, Ordering::Relaxed);
                        }
                        () = &mut cut => {
                            chain_drain_close(ctx);
                            break false;
                        }
                    }
                };
            if !readable {
                return Served::Ended(Ok(()));
            }
            buf = buffers.take();
            // A read, not a `try_read`: a read that leaves room in the buffer tells tokio the
            // socket is drained, which saves a system call that would find it empty. One look
            // first, not a wait: tokio's readiness can be stale (kept when another event for the
            // socket lands between a read and its clearing), and a read that waited would wait
            // without the idle timer. A look that finds nothing clears it, and the connection
            // goes back to the idle wait.
            let taken = client.socket_reads();
            let looked = {
                let mut reading = std::pin::pin!(client.read_buf(&mut buf));
                std::future::poll_fn(|cx| std::task::Poll::Ready(reading.as_mut().poll(cx))).await
            };
            let read = match looked {
                std::task::Poll::Ready(read) => read,
                std::task::Poll::Pending if client.socket_reads() == taken => continue,
                // Part of a TLS record came, and the read holds it (and its buffer): as long
                // as hyper's path waits for a head to start, then the connection is closed as
                // there.
                std::task::Poll::Pending => {
                    match tokio::time::timeout(http.header_read_timeout, client.read_buf(&mut buf))
                        .await
                    {
                        Ok(read) => read,
                        Err(_) => {
                            tracing::debug!(peer = %ctx.peer, "closing a connection stalled inside a TLS record");
                            return Served::Ended(Ok(()));
                        }
                    }
                }
            };
            match read {
                Ok(0) => return Served::Ended(Ok(())),
                Ok(n) => ctx.count_received(n),
                Err(e) => return Served::Ended(Err(e)),
            }
        }
        let Some(prepared) = prepare(ctx, &buf, &limits, mesh.as_ref()) else {
            if let Some(details) = refused::details(&buf, &limits) {
                // Answered here, as Envoy's codec answers it (its status's text as the body),
                // rather than by hyper (no body).
                refused::answer(ctx, client, details).await;
                return Served::Ended(Ok(()));
            }
            return Served::HandOff { prefix: buf, early };
        };
        let (total, client_close) = (prepared.total, prepared.close);
        // Boxed: a request's state (about 1.5 KiB across its awaits) is held only while it is
        // in flight, not for the connection's life.
        let exchange = request(ctx, client, &buf[..total], prepared, &mut early);
        let keep = tokio::select! {
            biased;
            keep = Box::pin(exchange) => keep,
            () = &mut cut => {
                // Mid-request: the client sees the connection close, as Envoy's does.
                chain_drain_close(ctx);
                return Served::Ended(Ok(()));
            }
        };
        buf.advance(total);
        last_active = tokio::time::Instant::now();
        if !keep || client_close || ctx.closing() {
            let _ = client.shutdown().await;
            return Served::Ended(Ok(()));
        }
    }
}

/// What the heads of a connection's requests are judged by: the configured limits, and what
/// its direction, mesh TLS and retries change about their headers.
fn limits_for(ctx: &ConnContext, mesh: Option<&MeshHeaders>) -> head::Limits {
    let http = &ctx.config.http;
    head::Limits {
        max_header_bytes: http.max_header_bytes,
        max_headers: http.max_headers,
        drop_client_cert: ctx.direction == Direction::Inbound && mesh.is_none(),
        mesh_tls: mesh.is_some(),
        // Routed by xDS, a route's retries add the count (a route without them hands a
        // client's own count to hyper: see `route`).
        drop_attempt_count: retries(ctx) > 0 || ctx.xds_routes.is_some(),
    }
}

/// What mesh TLS adds to every request of a connection, written once for its life: the
/// `x-forwarded-client-cert` line naming the client's sidecar, as the general path appends it.
struct MeshHeaders {
    /// The whole line; empty when the certificate gave a value no header may carry, which the
    /// general path leaves out too.
    client_cert: Vec<u8>,
}

impl MeshHeaders {
    /// `None` when mesh TLS was not terminated on the connection.
    fn of(ctx: &ConnContext) -> Option<MeshHeaders> {
        let (peer, ours) = ctx.mesh_peer.as_ref()?;
        let element = crate::tls::xfcc::element(ours, peer);
        let client_cert = match http::HeaderValue::from_str(&element) {
            Ok(_) => format!("{}: {element}\r\n", crate::tls::xfcc::XFCC).into_bytes(),
            Err(_) => Vec::new(),
        };
        Some(MeshHeaders { client_cert })
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
    /// Which metadata headers the client's sidecar sent, to answer in kind.
    described: crate::metadata_exchange::http::Received,
    is_head: bool,
    idempotent: bool,
    end: RequestEnd,
    /// Routed by xDS: where the route sends it (boxed: most connections are not routed).
    routed: Option<Box<RoutedRequest>>,
    /// Routed by xDS: answered here instead (no route: 404 `NR`).
    local: Option<ErrorKind>,
}

/// Judge the request at the start of `buf` and prepare it; `None` if hyper should serve it.
fn prepare(
    ctx: &Arc<ConnContext>,
    buf: &[u8],
    limits: &head::Limits,
    mesh: Option<&MeshHeaders>,
) -> Option<Prepared> {
    let started = Instant::now();
    // An access-log format reading headers the fast path does not keep: hyper's path logs them.
    if ctx.log_reads_other_headers() {
        return None;
    }
    // Without Host an HTTP/1.1 request is malformed: hyper's path answers it 400.
    let head = head::parse_request(buf, limits).filter(|h| h.host.is_some())?;
    // The body must be here whole; hyper streams a longer one.
    let total = usize::try_from(head.content_length)
        .ok()
        .and_then(|n| n.checked_add(head.len))
        .filter(|total| *total <= buf.len())?;
    if ctx.direction == Direction::Inbound && !inbound_as_is(ctx, head.target) {
        return None;
    }
    // An xDS connection manager that normalises paths (istiod's): hyper's path sends a path
    // that is not in normal form normalised.
    if ctx.direction == Direction::Outbound
        && ctx.xds_chain.normalize_path
        && !matches!(
            crate::authz::path::normalize(head.target, PathNormalization::Base),
            Ok(Cow::Borrowed(_))
        )
    {
        return None;
    }
    let (routed, local) = match &ctx.xds_routes {
        None => (None, None),
        // The fast path's requests meet no filter before the router.
        Some(routes) => match route::route(ctx, routes, buf, &head)? {
            Ok(routed) => {
                ctx.at_router(Some(routed.at_router()));
                let key = ctx.key;
                (Some(Box::new(RoutedRequest { routed, key })), None)
            }
            Err(kind) => {
                ctx.at_router(crate::http::routed::error_at_router(kind));
                (None, Some(kind))
            }
        },
    };
    ctx.proxy.metrics.http1_fast_path.inc();
    let mut end = RequestEnd::new(Arc::clone(ctx), None, false, started);
    if let Some(r) = &routed {
        end.routed = Some(r.routed.end());
    }
    // The client's sidecar describes itself in every request: decoded once per connection.
    if let Some(value) = head.peer_metadata {
        ctx.learn_client_value(value);
    }
    let body = &buf[head.len..total];
    if !body.is_empty() {
        end.received.data(body);
    }
    let id = head
        .request_id
        .is_none()
        .then(super::headers::request_id_bytes);
    let mut upstream_head = ctx.proxy.h1.buffers.take_vec();
    upstream_head.reserve(total + 128);
    let mut extra: [&[u8]; 7] = [b""; 7];
    if let Some(id) = &id {
        extra[0] = b"x-request-id: ";
        extra[1] = id;
        extra[2] = b"\r\n";
    }
    if !head.forwarded_proto {
        extra[3] = match mesh {
            None => b"x-forwarded-proto: http\r\n",
            Some(_) => b"x-forwarded-proto: https\r\n",
        };
    }
    if let Some(mesh) = mesh {
        extra[4] = &mesh.client_cert;
    }
    if ctx.originate.is_some() {
        // To a mesh server: Istio's metadata headers describe us.
        [extra[5], extra[6]] = ctx.proxy.mesh.exchange_headers.request_lines();
    }
    head.write_upstream(buf, &extra, &mut upstream_head);
    // The blank line goes back on per attempt, after the attempt count.
    upstream_head.truncate(upstream_head.len() - 2);
    if ctx.logging() {
        let mut log = Box::new(log::request_log(started, &head, id.as_ref(), &end));
        if let Some(r) = &routed {
            r.routed.log_to(&mut log);
        }
        end.log = Some(log);
    }
    Some(Prepared {
        total,
        head_len: head.len,
        described: crate::metadata_exchange::http::Received {
            id: head.peer_metadata_id,
            metadata: head.peer_metadata.is_some(),
        },
        close: head.close,
        upstream_head,
        is_head: head.is_head(),
        idempotent: head.idempotent(),
        end,
        routed,
        local,
    })
}

/// Serve one prepared request (`bytes` are its head and body as received); whether the
/// connection can take another. The request's metrics and log line are recorded when it ends.
// Not an `async fn`: one copies each argument into the body's own state and keeps both, and
// this state is boxed and copied whole for every request (see `exchange`).
#[allow(clippy::manual_async_fn)] // on purpose: see above
fn request<'a, C: Client>(
    ctx: &'a ConnContext,
    client: &'a mut C,
    bytes: &'a [u8],
    mut p: Prepared,
    early: &'a mut Option<Upstream>,
) -> impl Future<Output = bool> + 'a {
    async move {
        // The request's parts are used where they are: moved out into locals, they would take
        // room in the request's state beside the argument's own.
        // Routed by xDS, the route's timeout (none when unset), else the config file's.
        let timeout = match &p.routed {
            Some(r) => r.routed.timeout.unwrap_or_default(),
            None => ctx.config.http.request_timeout,
        };
        let request = Request {
            head: std::mem::take(&mut p.upstream_head),
            body: &bytes[p.head_len..],
            is_head: p.is_head,
            idempotent: p.idempotent,
            close: p.close,
            described: p.described,
            routed: p.routed.as_deref_mut(),
        };
        let end = &mut p.end;
        let outcome = match timeout {
            // Routed by xDS to nowhere: answered here, as the failures below are.
            _ if p.local.is_some() => Err(Failed::Local(p.local.unwrap_or(ErrorKind::NoRoute))),
            t if t.is_zero() => exchange(ctx, client, request, end, early).await,
            // Boxed: the timer would add to every request's state, and Istio sets no timeout.
            t => match Box::pin(tokio::time::timeout(
                t,
                exchange(ctx, client, request, end, early),
            ))
            .await
            .ok()
            {
                Some(outcome) => outcome,
                None if end.status == 0 => {
                    if let Some(r) = &p.routed {
                        crate::http::routed::timed_out(&r.routed);
                    }
                    Err(Failed::Local(ErrorKind::Timeout))
                }
                None => {
                    end.flags.insert(Flags::UT);
                    Err(Failed::Cut)
                }
            },
        };
        match outcome {
            Ok(keep) => keep,
            Err(Failed::Local(kind)) => {
                if let Some(r) = &p.routed {
                    crate::http::routed::charge_local_answer(&r.routed, kind);
                }
                local_reply(ctx, client, kind, end, p.close).await
            }
            Err(Failed::Cut) => false,
        }
    }
}

/// Whether an inbound request goes upstream as it came: no authorization policy to apply and a
/// path already in normal form. Otherwise hyper's path normalises and decides it.
fn inbound_as_is(ctx: &ConnContext, target: &str) -> bool {
    // Inbound by xDS, the chain's RBAC filters and its drain check are hyper's path's
    // (`http::authorize`).
    if ctx.proxy.authz.is_active() || ctx.xds_inbound.is_some() {
        return false;
    }
    let mode = ctx.config.authorization.path_normalization;
    matches!(
        crate::authz::path::normalize(target, mode),
        Ok(Cow::Borrowed(_))
    )
}

/// The connection had nothing to do for `http.idle_timeout`: it is closed, and counted.
fn idle_close(ctx: &ConnContext) {
    tracing::debug!(peer = %ctx.peer, "closing idle HTTP connection");
    let metrics = ctx.proxy.metrics.direction(ctx.direction);
    metrics.http_idle_timeouts.inc();
    ctx.closed_for(crate::metrics::http_conn_manager::ClosedFor::IdleTimeout);
}

/// The drain time of the connection's chain, which an xDS update retired, ran out.
fn chain_drain_close(ctx: &ConnContext) {
    tracing::info!(peer = %ctx.peer, "closing an HTTP connection whose filter chain an xDS update changed or removed: its drain time ran out");
    let metrics = ctx.proxy.metrics.direction(ctx.direction);
    metrics.chain_drain_closes.inc();
}

/// Whether responses should tell the client to close: inbound connections close as draining
/// starts (outbound ones keep serving: the application may still need its peers), and any
/// connection whose filter chain an xDS update retired.
fn closing(ctx: &ConnContext) -> bool {
    if ctx.closing() {
        return true;
    }
    let retired = ctx
        .chain_watch
        .as_ref()
        .is_some_and(crate::chain_drain::Watch::is_retired);
    let draining = retired || ctx.direction == Direction::Inbound && ctx.proxy.drain.is_draining();
    if draining {
        ctx.closing.store(true, Ordering::Relaxed);
    }
    draining
}

/// Answer for the proxy, as the general path does (Envoy's status, flag and text); whether
/// the connection can take another request.
async fn local_reply<C: Client>(
    ctx: &ConnContext,
    client: &mut C,
    kind: ErrorKind,
    end: &mut RequestEnd,
    close: bool,
) -> bool {
    let status = kind.status();
    let details = kind.reply_body(end.flags.contains(Flags::URX));
    let details = details.as_ref();
    // A request that asked to close the connection is told it is closing, as Envoy tells it.
    let keep = !close && !closing(ctx);
    // As Envoy's local replies: a content type only with a body (`NR`, `NC` have none).
    let typed = !kind.body().is_empty();
    let out = reply::bytes(ctx, status, details, typed, keep);
    end.flags.insert(kind.flag());
    end.status = status.as_u16();
    let routed = end.routed.is_some();
    if let Some(log) = &mut end.log {
        log.status = end.status;
        // Routed, the endpoint tried (if one was: none for `UH`, `NC`, `UO`) is recorded.
        if !routed {
            log.upstream = Some(ctx.key.destination);
        }
        log.envoy.details = kind.code_details();
    }
    match write_out(client, &out).await {
        Ok(()) => {
            ctx.count_sent(out.len());
            end.sent = details.len() as u64;
            end.complete = true;
            keep
        }
        Err(_) => false,
    }
}

/// Write `bytes` to the client whole. TLS may keep what it encrypted until flushed; a socket's
/// flush costs nothing.
async fn write_out<C: Client>(client: &mut C, bytes: &[u8]) -> io::Result<()> {
    client.write_all(bytes).await?;
    client.flush().await
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
