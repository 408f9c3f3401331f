//! One request's trip: to the upstream on a pooled (or new) socket, with Istio's retries, and
//! its response back to the client in the framing it came in.

use super::head::{Framing, ResponseHead};
use super::response::{response_head, Body, ResponseError};
use super::up::Up;
use super::{closing, itoa_u32, write_out, Client, READ_SIZE};
use crate::connect::Upstream;
use crate::http::body::RequestEnd;
use crate::http::errors::{ErrorKind, Flags};
use crate::http::pool::Key;
use crate::http::routed::{self, Routed};
use crate::http::ConnContext;
use crate::upstream::dial::{self, Connected};
use crate::upstream::Selected;
use crate::Direction;
use bytes::{Buf, BytesMut};
use std::future::Future;

/// The retries an outbound request gets (Istio's default policy); inbound gets none.
pub(super) fn retries(ctx: &ConnContext) -> u32 {
    match ctx.direction {
        Direction::Outbound => ctx.config.http.retries,
        Direction::Inbound => 0,
    }
}

/// A request ready for the upstream: its head without the blank line, and its body.
pub(super) struct Request<'a> {
    /// The client asked to close after it.
    pub close: bool,
    pub head: Vec<u8>,
    pub body: &'a [u8],
    pub is_head: bool,
    pub idempotent: bool,
    /// Which metadata headers the client's sidecar sent (mesh TLS terminated).
    pub described: crate::metadata_exchange::http::Received,
    /// Routed by xDS: the cluster, whose endpoint each attempt selects, and the route's
    /// retry policy.
    pub routed: Option<&'a mut RoutedRequest>,
}

/// A request routed by xDS: its route, and the pool key of the endpoint its current attempt
/// went to. Kept beside the route (on the heap) rather than in the request's state, which
/// is copied whole per request (see `exchange`).
pub(super) struct RoutedRequest {
    pub routed: Routed,
    pub key: Key,
}

impl Request<'_> {
    /// How many times a failed attempt is tried again, and whether a 503 is such a failure:
    /// the route's policy, else Istio's default (outbound only).
    fn retry_policy(&self, ctx: &ConnContext) -> (u32, bool) {
        match &self.routed {
            Some(r) => (r.routed.retries, r.routed.retry_503),
            None => (retries(ctx), true),
        }
    }

    /// The pool key of the attempt's connection: the endpoint's (xDS), else the connection's.
    fn key(&self, ctx: &ConnContext) -> Key {
        self.routed.as_ref().map_or(ctx.key, |r| r.key)
    }
}

/// Why a request got no response from the upstream.
pub(super) enum Failed {
    /// Nothing was written to the client yet: answer for the proxy.
    Local(ErrorKind),
    /// The response was under way, or the client is gone: the connection ends.
    Cut,
}

/// Send the request upstream (retrying as Istio's default policy says) and pass the response
/// to the client. `Ok(keep)`: the response went out whole; `keep` says whether the client's
/// connection can take another request.
// Not an `async fn`, nor is `relay`: that would copy each argument into the body's own state
// and keep both, and every request's state is boxed and copied whole.
#[allow(clippy::manual_async_fn)] // on purpose: see above
pub(super) fn exchange<'a, C: Client>(
    ctx: &'a ConnContext,
    client: &'a mut C,
    mut req: Request<'a>,
    end: &'a mut RequestEnd,
    early: &'a mut Option<Upstream>,
) -> impl Future<Output = Result<bool, Failed>> + 'a {
    async move {
        // What the upstream's response is read into.
        let mut rbuf = ctx.proxy.h1.buffers.lend();
        let rbuf: &mut BytesMut = &mut rbuf;
        // Two steps, each its own future: the state of one request is the larger of the two
        // rather than what both hold across their awaits, which keeps it small enough for the
        // allocator's per-thread cache when it is boxed.
        let (up, response) = attempts(ctx, &mut req, end, early, rbuf).await?;
        relay(ctx, client, req, end, up, response, rbuf).await
    }
}

/// Send the request until an attempt gets a response head, into `rbuf`.
async fn attempts(
    ctx: &ConnContext,
    req: &mut Request<'_>,
    end: &mut RequestEnd,
    early: &mut Option<Upstream>,
    rbuf: &mut BytesMut,
) -> Result<(Up, ResponseHead), Failed> {
    let (retries, retry_503) = req.retry_policy(ctx);
    let base = req.head.len();
    let mut attempt: u32 = 1;
    if retries > 0 && ctx.take_early_failure() {
        backoff(ctx, attempt).await;
        attempt += 1;
    }
    // A pooled connection the server closed as we sent is tried again once on a new one, for
    // a request that is harmless to repeat.
    let mut stale_retry = req.idempotent;
    // After a stale pooled connection, the next attempt dials: its siblings are likely stale too.
    let mut dial = false;
    // The retry under way, held against the routed cluster's `max_retries`.
    let mut retrying: Option<crate::upstream::RetryGuard> = None;
    let (up, response) = loop {
        // Whether the request waited for a connection slot (counted pending already).
        let mut admitted_after_wait = false;
        if let Some(r) = req.routed.as_deref() {
            admitted_after_wait = routed::admit(ctx, &r.routed)
                .await
                .map_err(|e| Failed::Local(e.kind))?;
        }
        let next = match next_connection(ctx, req.routed.as_deref_mut(), early, dial, end) {
            Ok(next) => next,
            // No cluster or no healthy endpoint: answered at once, as hyper's path does.
            Err(kind) => return Err(Failed::Local(kind)),
        };
        let (mut up, reused) = match next {
            Next::Idle(up) => (up, true),
            // Boxed: a connect (inside mesh TLS, a handshake) is by far the largest state
            // a request can be in, and most requests take a pooled connection instead.
            Next::Open(selected) => {
                // Waiting for the connection it opens, the request is a pending one, as
                // Envoy's pool counts it.
                if let Some(s) = selected.as_deref().filter(|_| !admitted_after_wait) {
                    s.in_flight.pending_for_connect();
                }
                match Box::pin(open(ctx, selected, end)).await {
                    Ok(up) => (up, false),
                    Err(kind) => {
                        if kind.retryable() && retries > 0 {
                            if attempt <= retries {
                                // Past `max_retries`, the connect failure is the answer.
                                let Some(guard) = retry(req, &mut end.flags) else {
                                    return Err(Failed::Local(kind));
                                };
                                retrying = Some(guard);
                                backoff(ctx, attempt).await;
                                attempt += 1;
                                continue;
                            }
                            end.flags.insert(Flags::URX);
                        }
                        return Err(Failed::Local(kind));
                    }
                }
            }
        };
        if let Some(log) = end.log.as_mut().filter(|_| ctx.log_wants_upstream_local()) {
            log.envoy.upstream_local = up.local_addr();
        }
        req.head.truncate(base);
        // Routed by xDS, the upstream is told the attempt when the virtual host asks
        // (`include_request_attempt_count`) and the route's deadline (on a retry, what is left
        // of it), as hyper's routed path does; otherwise the count goes with retries.
        // (A block of its own: nothing here stays in the request's state across the send.)
        {
            let (count, deadline) = match req.routed.as_deref() {
                Some(r) => (
                    r.routed.attempt_count,
                    r.routed.timeout.filter(|t| !t.is_zero()),
                ),
                None => (retries > 0, None),
            };
            if count {
                req.head.extend_from_slice(b"x-envoy-attempt-count: ");
                req.head
                    .extend_from_slice(itoa_u32(attempt, &mut [0u8; 10]).as_bytes());
                req.head.extend_from_slice(b"\r\n");
            }
            if let Some(t) = deadline {
                let left = match attempt {
                    1 => t,
                    _ => t.saturating_sub(end.started.elapsed()),
                };
                let ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
                req.head.extend_from_slice(
                    format!("x-envoy-expected-rq-timeout-ms: {ms}\r\n").as_bytes(),
                );
            }
        }
        req.head.extend_from_slice(b"\r\n");
        req.head.extend_from_slice(req.body);
        rbuf.clear();
        // A mesh destination's sidecar describes itself in metadata headers, read here. An
        // endpoint routed by xDS gets them passed on, as hyper's routed path does.
        let mesh_server = matches!(up, Up::Mesh(_)) && req.routed.is_none();
        let answered = match up.send(&req.head).await {
            Ok(()) => response_head(&mut up, rbuf, req.is_head, mesh_server).await,
            Err(e) => Err(ResponseError::Io(e)),
        };
        let response = match answered {
            Ok(r) => {
                routed::report(end, crate::upstream::Outcome::Status(r.status));
                r
            }
            Err(e) => {
                if reused && stale_retry && rbuf.is_empty() && matches!(e, ResponseError::Io(_)) {
                    // A pooled connection the server had closed: not the host's failure (hyper's
                    // path resends such a request unreported too).
                    stale_retry = false;
                    dial = true;
                    // Envoy would have seen this close while the connection was idle.
                    if let Some(end) = up.end() {
                        end.active = false;
                    }
                    tracing::debug!(dst = %ctx.key.destination, "pooled connection closed; opening another");
                    continue;
                }
                tracing::debug!(dst = %ctx.key.destination, error = %e, "upstream request failed");
                routed::report(end, crate::upstream::Outcome::LocalFailure);
                return Err(Failed::Local(e.kind()));
            }
        };
        if retries > 0 && retry_503 && response.status == 503 {
            if attempt <= retries {
                // Past the cluster's `max_retries`, the 503 itself is the answer (flagged UO).
                let Some(guard) = retry(req, &mut end.flags) else {
                    break (up, response);
                };
                retrying = Some(guard);
                routed::answered(end, response.status, true);
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
    routed::answered(end, response.status, false);
    if let Some(r) = retrying.filter(|_| response.status < 500) {
        r.succeeded();
    }
    if let Some(log) = &mut end.log {
        log.status = response.status;
        log.upstream = Some(req.key(ctx).destination);
        log.upstream_time = Some(end.started.elapsed());
    }
    end.status = response.status;
    if let (Some((from, to)), Some(originate)) = (response.peer_metadata, &ctx.originate) {
        originate.learn_server_value(&rbuf[from as usize..to as usize]);
    }
    Ok((up, response))
}

/// Pass the response whose head is at the start of `rbuf` to the client: head and what came
/// with it in one write, then the rest as it arrives. The upstream connection goes back to the
/// pool if the response left it clean.
#[allow(clippy::manual_async_fn)] // on purpose: see `exchange`
fn relay<'a, C: Client>(
    ctx: &'a ConnContext,
    client: &'a mut C,
    mut req: Request<'a>,
    end: &'a mut RequestEnd,
    mut up: Up,
    response: ResponseHead,
    rbuf: &'a mut BytesMut,
) -> impl Future<Output = Result<bool, Failed>> + 'a {
    async move {
        let http = &ctx.config.http;
        let keep_client = response.framing != Framing::Close && !req.close && !closing(ctx);
        // The request's head is sent for good: its buffer takes the response's.
        let mut out = std::mem::take(&mut req.head);
        out.clear();
        out.reserve(rbuf.len() + 32);
        // Over mesh TLS, the client's sidecar is answered with our metadata headers.
        let extra = match &ctx.mesh_peer {
            Some(_) => ctx
                .proxy
                .mesh
                .exchange_headers
                .response_lines(req.described),
            None => [b"" as &[u8]; 2],
        };
        let server = ctx.xds_chain.server.as_ref();
        response.write_downstream(
            rbuf,
            &extra,
            server.map(|v| v.as_bytes()),
            // Routed by xDS, Envoy's router says how long the upstream took.
            req.routed
                .is_some()
                .then(|| super::super::headers::service_time_ms(end.started)),
            !keep_client,
            &mut out,
        );
        rbuf.advance(response.len);
        let mut body = Body::new(response.framing);
        // Nothing is written yet: a body that starts malformed is answered 502 like a bad head.
        let (now, mut done) = body
            .take(rbuf)
            .map_err(|_| Failed::Local(ErrorKind::UpstreamProtocol))?;
        out.extend_from_slice(&rbuf[..now]);
        let mut reusable = !response.close && now == rbuf.len();
        send(ctx, client, &out, end, now).await?;
        ctx.proxy.h1.buffers.give_vec(out);
        while !done {
            rbuf.clear();
            rbuf.reserve(READ_SIZE);
            let n = match up.read_buf(rbuf).await {
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
        if let Some(end) = up.end() {
            end.active = false;
        }
        if reusable {
            let key = req.key(ctx);
            match (up, ctx.originate.as_deref()) {
                (Up::Mesh(conn), Some(originate)) => originate.checkin_raw(ctx, conn),
                // An endpoint routed by xDS: pooled by endpoint and TLS parameters.
                (Up::Mesh(conn), None) => ctx.proxy.h1.mesh.checkin(
                    key,
                    conn,
                    http.pool_idle_timeout,
                    http.pool_max_idle_per_upstream,
                ),
                (Up::Plain(up), _) => ctx.proxy.h1.pool.checkin(
                    key,
                    up,
                    http.pool_idle_timeout,
                    http.pool_max_idle_per_upstream,
                ),
            }
        }
        Ok(keep_client)
    }
}

/// Where an attempt's connection comes from.
enum Next {
    /// An idle one: detection's, or pooled.
    Idle(Up),
    /// A new one: to the connection's destination, or to the endpoint selected (xDS; boxed,
    /// as the connect is, to keep the request's state small).
    Open(Option<Box<Selected>>),
}

/// The connection of an attempt: detection's, else an idle pooled one (of mesh connections,
/// to a mesh destination), else a new one; routed by xDS, to an endpoint the upstream layer
/// selects for this attempt (its pool keyed by endpoint and TLS parameters), which counts the
/// request against the endpoint until it ends. `Err`: no cluster or no healthy endpoint.
fn next_connection(
    ctx: &ConnContext,
    routed: Option<&mut RoutedRequest>,
    early: &mut Option<Upstream>,
    dial: bool,
    end: &mut RequestEnd,
) -> Result<Next, ErrorKind> {
    let Some(routed) = routed else {
        // Detection's connection counts as reused: it may have waited on a slow client for as
        // long as the server keeps idle connections open.
        if let Some(up) = early.take() {
            return Ok(Next::Idle(Up::Plain(up)));
        }
        // The request's start serves as now: microseconds old, and a clock read less.
        let (idle_timeout, now) = (ctx.config.http.pool_idle_timeout, end.started);
        let idle = match ctx.originate.as_deref() {
            _ if dial => None,
            Some(originate) => originate.checkout_raw(ctx).map(Up::Mesh),
            None => ctx
                .proxy
                .h1
                .pool
                .checkout(&ctx.key, now, idle_timeout)
                .map(Up::Plain),
        };
        return Ok(match idle {
            Some(up) => Next::Idle(up),
            None => Next::Open(None),
        });
    };
    let (selected, key) = routed::select(ctx, &routed.routed, false).map_err(|e| {
        tracing::debug!(peer = %ctx.peer, error = %e, "no upstream");
        e.kind
    })?;
    routed.key = key;
    let (idle_timeout, now) = (ctx.config.http.pool_idle_timeout, end.started);
    let idle = match &selected.transport {
        _ if dial => None,
        crate::upstream::Transport::Plaintext => ctx
            .proxy
            .h1
            .pool
            .checkout(&key, now, idle_timeout)
            .map(Up::Plain),
        crate::upstream::Transport::Mesh(_) | crate::upstream::Transport::Origin(_) => ctx
            .proxy
            .h1
            .mesh
            .checkout(&key, now, idle_timeout)
            .map(Up::Mesh),
    };
    Ok(match idle {
        Some(up) => {
            counting(end, selected.in_flight);
            Next::Idle(up)
        }
        None => Next::Open(Some(Box::new(selected))),
    })
}

/// The request counts against the selected endpoint until it ends (a retry's endpoint
/// replaces an earlier attempt's).
fn counting(end: &mut RequestEnd, in_flight: crate::upstream::InFlight) {
    if let Some(r) = &mut end.routed {
        r.in_flight = Some(in_flight);
    }
}

/// Open a new upstream connection: to the request's destination (inside mesh TLS for a mesh
/// destination), or to the endpoint selected for it, with the transport its cluster says.
async fn open(
    ctx: &ConnContext,
    selected: Option<Box<Selected>>,
    end: &mut RequestEnd,
) -> Result<Up, ErrorKind> {
    let opened = match (selected, ctx.originate.as_deref()) {
        (Some(selected), _) => {
            // As hyper's routed path offers it: the fast path's upstream speaks HTTP/1.1.
            let alpn = crate::http::protocol::mesh_alpn(http::Version::HTTP_11);
            selected
                .in_flight
                .connecting_http(crate::detect::HttpVersion::Http1);
            let dialled = dial::dial(
                &ctx.proxy,
                &ctx.config.tls,
                &selected,
                ctx.direction,
                Some(&alpn),
                ctx.key.source,
            )
            .await;
            counting(end, selected.in_flight);
            routed::report(
                end,
                match dialled {
                    Ok(_) => crate::upstream::Outcome::Connected,
                    Err(_) => crate::upstream::Outcome::ConnectFailed,
                },
            );
            if dialled.is_err() {
                if let Some(f) = end.routed.as_ref().and_then(|r| r.in_flight.as_ref()) {
                    f.connect_failed();
                }
            }
            match dialled {
                Ok(Connected::Plain(up)) => Ok(Up::Plain(up)),
                Ok(Connected::Mesh(tls, registration)) => {
                    Ok(Up::Mesh(Box::new((*tls, registration))))
                }
                Err(e) => {
                    tracing::debug!(error = %e, "upstream connect failed");
                    if let Some(log) = &mut end.log {
                        log.dial_failed(selected.address, &e);
                    }
                    Err(routed::dial_failure(&e))
                }
            }
        }
        (None, Some(originate)) => originate.connect(ctx).await.map(Up::Mesh).map_err(|e| {
            tracing::debug!(error = %e, "upstream connect failed");
            e.kind
        }),
        (None, None) => ctx.connect_upstream().await.map(Up::Plain).map_err(|e| {
            tracing::debug!(error = %e, "upstream connect failed");
            e.kind
        }),
    };
    if opened.is_err() {
        ctx.proxy
            .metrics
            .direction(ctx.direction)
            .connect_failures
            .inc();
    }
    opened
}

/// Write response bytes to the client, `body` of them body bytes.
async fn send<C: Client>(
    ctx: &ConnContext,
    client: &mut C,
    bytes: &[u8],
    end: &mut RequestEnd,
    body: usize,
) -> Result<(), Failed> {
    write_out(client, bytes).await.map_err(|e| {
        tracing::debug!(peer = %ctx.peer, error = %e, "client gone during the response");
        Failed::Cut
    })?;
    ctx.count_sent(bytes.len());
    end.sent += body as u64;
    Ok(())
}

/// A retry, counted against the routed cluster's `max_retries` (`None` past it).
fn retry(req: &Request<'_>, flags: &mut Flags) -> Option<crate::upstream::RetryGuard> {
    routed::retry_counted(req.routed.as_deref().map(|r| &r.routed), flags)
}

async fn backoff(ctx: &ConnContext, attempt: u32) {
    tokio::time::sleep(crate::http::retry::backoff(
        ctx.config.http.retry_backoff,
        attempt,
    ))
    .await;
}
