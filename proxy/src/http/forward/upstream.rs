//! The upstream phase of a request: its attempts as the retry policy allows, each on a pooled
//! connection or a new one (`send`, `send_on`, `open`); what is judged about the request
//! before, and done with its response after, is `forward`'s.

use super::Upstreamed;
use crate::detect::HttpVersion;
use crate::http::body::UpstreamBody;
use crate::http::counting::BodyCounter;
use crate::http::errors::{ErrorKind, Flags, ProxyError};
use crate::http::headers::ATTEMPT_COUNT;
use crate::http::pool::{self, Key, Sender};
use crate::http::retry::{self, ReplayBody};
use crate::http::ConnContext;
use crate::Direction;
use http::header::HeaderValue;
use http::request::Parts;
use http::Request;
use http_body::Body as _;
use std::sync::Arc;
use std::time::Instant;

/// Send the request, retrying as the route's policy says (xDS), else as Istio's default
/// policy says (up to `http.retries` more attempts on a connect failure, a refused stream, a
/// 503 or a gRPC UNAVAILABLE/CANCELLED): outbound only, for a request whose body can be sent
/// again, each attempt within the policy's per-try timeout.
pub(super) async fn attempts(
    ctx: &ConnContext,
    parts: Parts,
    body: crate::http::mirror::ClientBody,
    received: Option<Arc<BodyCounter>>,
    upgrade: bool,
    flags: &mut Flags,
    routed: Option<&crate::http::routed::Routed>,
) -> Result<Upstreamed, ProxyError> {
    let http = &ctx.config.http;
    let retries = match ctx.direction {
        Direction::Outbound if !upgrade => routed.map_or(http.retries, |r| r.retries),
        _ => 0,
    };
    // Envoy tells the upstream which attempt it is only when the virtual host asks
    // (`include_request_attempt_count`, which istiod sets); without xDS, as istiod would.
    let count_attempts = routed.is_none_or(|r| r.attempt_count);
    if retries == 0 {
        let body = if body.is_end_stream() {
            UpstreamBody::Empty
        } else {
            UpstreamBody::Streamed {
                inner: body,
                received,
            }
        };
        let mut parts = parts;
        if routed.is_some_and(|r| r.attempt_count) {
            parts
                .headers
                .insert(ATTEMPT_COUNT.clone(), HeaderValue::from(1u32));
        }
        let req = Request::from_parts(parts, body);
        let (result, cut) = within_per_try(ctx, req, routed).await;
        return answered(result, cut, routed);
    }
    let replay =
        (!body.is_end_stream()).then(|| ReplayBody::new(body, http.retry_buffer_bytes, received));
    let started = Instant::now();
    let mut attempt: u32 = 1;
    // The route's back-off, else Remora's.
    let backoff = |attempt| match routed {
        Some(r) => r.retry.backoff(attempt, http.retry_backoff),
        None => retry::backoff(http.retry_backoff, attempt),
    };
    if ctx.take_early_failure() {
        tokio::time::sleep(backoff(attempt)).await;
        attempt += 1;
    }
    let mut resent_after_go_away: u32 = 0;
    // The retry under way, held against the cluster's `max_retries`.
    let mut retrying: Option<crate::upstream::RetryGuard> = None;
    loop {
        let body = match replay.as_ref().map(ReplayBody::replay) {
            None => UpstreamBody::Empty,
            Some(Some(r)) => UpstreamBody::Replay(r),
            // Checked before every retry; the first replica always exists.
            Some(None) => UpstreamBody::Empty,
        };
        let mut req = Request::new(body);
        *req.method_mut() = parts.method.clone();
        *req.uri_mut() = parts.uri.clone();
        *req.version_mut() = parts.version;
        *req.headers_mut() = parts.headers.clone();
        if count_attempts {
            req.headers_mut()
                .insert(ATTEMPT_COUNT.clone(), HeaderValue::from(attempt));
        }
        if let Some(routed) = routed.filter(|_| attempt > 1) {
            routed.expect_remaining(req.headers_mut(), started.elapsed());
        }
        let (result, cut) = within_per_try(ctx, req, routed).await;
        // The route's retry policy, else Istio's default as Remora's own config says it.
        let retriable = match (&result, routed) {
            (Ok(up), Some(r)) => r
                .retry
                .on_status(up.response.status(), up.response.headers()),
            (Err(e), Some(r)) => r.retry.on_error(e.kind),
            (Ok(up), None) => retry::retry_on_response(&up.response, true),
            (Err(e), None) => e.kind.retryable(),
        };
        if !retriable {
            if let (Some(r), Ok(up)) = (&retrying, &result) {
                if up.response.status().as_u16() < 500 {
                    r.succeeded();
                }
            }
            return answered(result, cut, routed);
        }
        let replayable = replay.as_ref().is_none_or(|r| r.replay().is_some());
        // A stream the server refused with its GOAWAY never reached the application (RFC 9113
        // §6.8): it was only waiting on a connection that was closing, so it goes on a new one
        // at once and without spending a retry, as Envoy's pool moves the requests still
        // pending on a draining connection. Bounded, so that a server that refuses everything
        // still ends in the usual retries.
        let go_away = matches!(&result, Err(e) if e.went_away());
        if go_away && replayable && resent_after_go_away < retry::GO_AWAY_RESENDS {
            resent_after_go_away += 1;
            drop(result);
            continue;
        }
        if attempt > retries || !replayable {
            if attempt > retries {
                flags.insert(Flags::URX);
            }
            return answered(result, cut, routed);
        }
        // The cluster's `max_retries` (counted as Envoy's `upstream_rq_retry`): past it, the
        // request ends with what it has, flagged as Envoy's router flags it.
        match crate::http::routed::retry(routed) {
            Ok(guard) => retrying = guard,
            Err(()) => {
                flags.insert(Flags::UO);
                return answered(result, cut, routed);
            }
        }
        // Retried: its answer counted apart, as Envoy's router counts a retried one.
        if let Ok(up) = &result {
            up.charge_answer(true);
        }
        // Dropping a 503's body closes its HTTP/1.1 connection, which is what we want of a
        // connection that just refused us (with the request on it, as Envoy counts it).
        if let Ok(Upstreamed {
            pooled: Some((_, sender)),
            ..
        }) = &result
        {
            sender.abandon();
        }
        drop(result);
        tokio::time::sleep(backoff(attempt)).await;
        attempt += 1;
    }
}

/// One attempt, within the route's per-try timeout when it has one (boxed: only such routes
/// pay for its timer); `true` with an attempt the timeout cut, counted against its cluster as
/// Envoy's router counts it.
async fn within_per_try(
    ctx: &ConnContext,
    req: Request<UpstreamBody>,
    routed: Option<&crate::http::routed::Routed>,
) -> (Result<Upstreamed, ProxyError>, bool) {
    match crate::http::retry_policy::per_try(routed) {
        None => (send(ctx, req, routed).await, false),
        Some((t, r)) => match Box::pin(tokio::time::timeout(t, send(ctx, req, routed))).await {
            Ok(result) => (result, false),
            Err(_) => {
                crate::http::routed::per_try_timed_out(r);
                let e = crate::http::retry_policy::per_try_expired(ctx.key.destination);
                (Err(e), true)
            }
        },
    }
}

/// The request's result from its last attempt: one the per-try timeout `cut` is answered
/// with the router's 504, charged to the cluster as Envoy charges it.
fn answered(
    result: Result<Upstreamed, ProxyError>,
    cut: bool,
    routed: Option<&crate::http::routed::Routed>,
) -> Result<Upstreamed, ProxyError> {
    if let (true, Some(r)) = (cut, routed) {
        crate::http::routed::charge_per_try_answer(r);
    }
    if let Ok(up) = &result {
        up.charge_answer(false);
    }
    result
}

/// Why a request did not get a response from one connection.
pub(in crate::http) enum SendError {
    /// The connection was closed before the request was written: it can go on another.
    Unsent(Box<Request<UpstreamBody>>, hyper::Error),
    Failed(ProxyError),
}

/// One attempt: a pooled connection if one is idle, else a new one. A pooled connection the
/// server closed meanwhile gives the request back unsent, and it goes on a new connection.
async fn send(
    ctx: &ConnContext,
    req: Request<UpstreamBody>,
    routed: Option<&crate::http::routed::Routed>,
) -> Result<Upstreamed, ProxyError> {
    if let Some(routed) = routed {
        return Box::pin(crate::http::routed::send(ctx, routed, req)).await;
    }
    let key = ctx.key;
    let dst = key.destination;
    let idle_timeout = ctx.config.http.pool_idle_timeout;
    let mut req = req;
    // A new HTTP/2 connection to this destination the requests that follow wait for.
    let mut dialing = None;
    let idle = match &ctx.originate {
        Some(originate) => originate.checkout(ctx),
        // Shared: a request that finds no room while another opens a connection waits for
        // that one, as a routed request does, so that a cold burst does not dial per stream.
        None if key.version == HttpVersion::Http2 => {
            let bound = ctx.connect_timeout.saturating_mul(2);
            match ctx.proxy.pool.shared(&key, idle_timeout, bound).await {
                pool::Shared::Pooled(sender) => Some(sender),
                pool::Shared::Dial((), d) => {
                    dialing = d;
                    None
                }
            }
        }
        None => ctx.proxy.pool.checkout(&key, Instant::now(), idle_timeout),
    };
    if let Some(sender) = idle {
        match send_on(ctx, key, sender, req).await {
            Ok(up) => return Ok(up),
            Err(SendError::Unsent(back, e)) => {
                tracing::debug!(%dst, error = %e, "pooled connection closed; opening another");
                req = *back;
            }
            Err(SendError::Failed(e)) => return Err(forget_if_gone(ctx, e)),
        }
    }
    // Boxed: a connect and handshake (6.5 KiB of state inside mesh TLS) would otherwise size
    // every request's state, and most requests take a pooled connection.
    let sender = match &ctx.originate {
        Some(originate) => Box::pin(originate.open(ctx)).await?,
        None => Box::pin(open(ctx)).await?,
    };
    let sender = match &ctx.originate {
        // Shared from now on by every request to this destination, while it has room.
        None => ctx.proxy.pool.share_new(
            key,
            sender,
            idle_timeout,
            ctx.config.http.pool_max_idle_per_upstream,
            dialing,
            ctx.connect_timeout,
        ),
        Some(_) => sender,
    };
    match send_on(ctx, key, sender, req).await {
        Ok(up) => Ok(up),
        Err(SendError::Unsent(_, e)) => Err(forget_if_gone(ctx, ProxyError::from_send(dst, e))),
        Err(SendError::Failed(e)) => Err(forget_if_gone(ctx, e)),
    }
}

/// `e`, after taking the shared HTTP/2 connection out of the pool if `e` says it went away:
/// otherwise the retry, and every request after it, would be given the same connection until
/// the server closes it.
fn forget_if_gone(ctx: &ConnContext, e: ProxyError) -> ProxyError {
    if ctx.originate.is_none() && e.went_away() {
        ctx.proxy.pool.forget_shared(&ctx.key);
    }
    e
}

pub(in crate::http) async fn send_on(
    ctx: &ConnContext,
    key: Key,
    sender: Sender,
    req: Request<UpstreamBody>,
) -> Result<Upstreamed, SendError> {
    let dst = key.destination;
    // A pooled connection becomes ready as soon as its last response is fully read; one that
    // stays busy longer than a connect may take is stuck.
    let bound = ctx.connect_timeout;
    let stuck = || {
        SendError::Failed(ProxyError::new(
            ErrorKind::ConnectionTerminated,
            dst,
            "upstream connection not ready in time",
        ))
    };
    let (sent, pooled) = match sender {
        Sender::Http1(mut tx, served, local) => {
            match tokio::time::timeout(bound, tx.ready()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(SendError::Unsent(Box::new(req), e)),
                Err(_) => return Err(stuck()),
            }
            let sent = tx.try_send_request(req).await;
            (
                sent,
                Some((key, Sender::Http1(tx, served.saturating_add(1), local))),
            )
        }
        Sender::Http2(mut tx, streams) => {
            match tokio::time::timeout(bound, tx.ready()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(SendError::Unsent(Box::new(req), e)),
                Err(_) => return Err(stuck()),
            }
            let sent = tx.try_send_request(req).await;
            (sent, Some((key, Sender::Http2(tx, streams))))
        }
        Sender::Http2Stream(mut tx, held) => {
            match tokio::time::timeout(bound, tx.ready()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(SendError::Unsent(Box::new(req), e)),
                Err(_) => return Err(stuck()),
            }
            // The stream is held until the request ends (given back to the pool then).
            let sent = tx.try_send_request(req).await;
            (sent, Some((key, Sender::Http2Stream(tx, held))))
        }
    };
    // hyper's HTTP/1.1 client takes framings Envoy's codec refuses; refused here as the fast
    // path refuses them, the connection not reused.
    let sent = sent.map(|mut response| {
        let refused = key.version == HttpVersion::Http1 && {
            let status = response.status();
            super::headers::refused_response_framing(status, response.headers_mut())
        };
        (response, refused)
    });
    match sent {
        Ok((_, true)) => Err(SendError::Failed(ProxyError::new(
            ErrorKind::UpstreamProtocol,
            dst,
            "response framing refused",
        ))),
        Ok((response, false)) => Ok(Upstreamed {
            response,
            // Read from the handle kept, not held across the send: a request's state is
            // sized by its largest moment.
            local: pooled
                .as_ref()
                .map(|(_, s)| s.local_addr())
                .unwrap_or_default(),
            pooled,
            endpoint: dst,
            in_flight: None,
            pool_idle_timeout: None,
        }),
        Err(mut e) => match e.take_message() {
            Some(req) => Err(SendError::Unsent(Box::new(req), e.into_error())),
            None => Err(SendError::Failed(ProxyError::from_send(
                dst,
                e.into_error(),
            ))),
        },
    }
}

/// Open a new upstream connection and start the HTTP client on it. An idle socket of the fast
/// path's pool serves as well as a new one, without a connect.
async fn open(ctx: &ConnContext) -> Result<Sender, ProxyError> {
    let dst = ctx.key.destination;
    if ctx.key.version == HttpVersion::Http1 {
        let idle_timeout = ctx.config.http.pool_idle_timeout;
        if let Some(up) = ctx
            .proxy
            .h1
            .pool
            .checkout(&ctx.key, Instant::now(), idle_timeout)
        {
            return pool::handshake(up, ctx.key.version)
                .await
                .map_err(|e| ProxyError::new(ErrorKind::ConnectFailed, dst, e));
        }
    }
    let up = ctx.connect_upstream().await?;
    pool::handshake(up, ctx.key.version)
        .await
        .map_err(|e| ProxyError::new(ErrorKind::ConnectFailed, dst, e))
}
