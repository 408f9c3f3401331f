//! One request, in three phases, as pingora names them:
//!
//! 1. **request**: refuse what is malformed (400 `DPE`, never forwarded), drop hop-by-hop
//!    headers, add `x-request-id` and `x-forwarded-proto`; inbound, normalise the path and
//!    apply the authorization policies (403, never forwarded); find the request's deadline;
//! 2. **upstream**: send it on a pooled connection to the original destination, opening one
//!    when none is idle, and retry as the route's policy says (`retry_policy`; without xDS,
//!    Istio's default policy), outbound only; a route's fault is injected first (`fault`);
//! 3. **response**: drop hop-by-hop headers and stream the body back, or answer locally with
//!    Envoy's status and flag (gRPC clients get HTTP 200 with a `grpc-status`).

use super::body::{RequestEnd, ResponseBody, UpstreamBody};
use super::counting::BodyCounter;
use super::errors::{ErrorKind, Flags, ProxyError};
use super::headers::{self, ATTEMPT_COUNT};
use super::pool::{self, Key, Sender};
use super::replies::local_reply;
use super::retry::{self, ReplayBody};
use super::{upgrade, ConnContext};
use crate::detect::HttpVersion;
use crate::metadata_exchange::http as exchange;
use crate::Direction;
use http::header::{HeaderValue, CONNECTION};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body::Body as _;
use hyper::body::Incoming;
use remora_config::PathNormalization;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

/// A response from the upstream, and the HTTP/1.1 connection it came on (to pool again once
/// the body is read).
pub(super) struct Upstreamed {
    pub(super) response: Response<Incoming>,
    pub(super) pooled: Option<(Key, Sender)>,
    /// The endpoint that answered.
    endpoint: std::net::SocketAddr,
    /// This side of the connection it answered on.
    local: pool::LocalAddr,
    /// xDS: the request counted against its endpoint until it ends (LEAST_REQUEST).
    pub(super) in_flight: Option<crate::upstream::InFlight>,
    /// xDS: how long the connection may stay pooled (the cluster's idle timeout).
    pub(super) pool_idle_timeout: Option<std::time::Duration>,
}

/// Serve one request.
pub async fn handle(
    ctx: Arc<ConnContext>,
    mut req: Request<Incoming>,
) -> Result<Response<ResponseBody>, Infallible> {
    let start = (SystemTime::now(), Instant::now());
    let grpc = headers::is_grpc(req.headers());
    let mut end = RequestEnd::new(Arc::clone(&ctx), None, grpc, start.1);

    // Phase 1: the request.
    origin_form(&mut req);
    let refused_head = ctx.refused(end.position);
    let refused = if let Some(head) = refused_head {
        Err(head.why.reply())
    } else if req.headers().len() > ctx.config.http.max_headers {
        // hyper refuses this on HTTP/1.1 before the request is ours; HTTP/2 bounds only the
        // size of the header list.
        Err(ErrorKind::HeadersTooLarge)
    } else {
        headers::check_request(req.headers())
            .map_err(ErrorKind::MalformedRequest)
            .and_then(|()| headers::check_target(&req))
    };
    if let Err(kind) = refused {
        if ctx.logging() {
            let (m, u, v) = (req.method(), req.uri(), req.version());
            end.log = Some(ctx.request_log(start, (m, u, v, req.headers())));
        }
        tracing::debug!(peer = %ctx.peer, reason = kind.details(), "request refused");
        return Ok(local_reply(kind, grpc, end));
    }
    let upgrade = ctx.key.version == HttpVersion::Http1 && headers::wants_upgrade(req.headers());
    let downstream_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    // Istio's metadata headers are the sidecars' own: taken from the client's request inbound,
    // added to ours for a mesh server.
    let mut described = exchange::Received::default();
    if ctx.direction == Direction::Inbound {
        mesh_identity_headers(&ctx, &mut parts.headers);
        let (received, value) = exchange::take(&mut parts.headers);
        if let Some(value) = value {
            ctx.learn_client_value(value.as_bytes());
        }
        described = received;
    }
    headers::prepare_request(&mut parts.headers, upgrade);
    if ctx.originate.is_some() {
        ctx.proxy
            .mesh
            .exchange_headers
            .add_to_request(&mut parts.headers);
    }
    let refused = match ctx.direction {
        Direction::Inbound => super::authorize::inbound(&ctx, &mut parts).err(),
        // istiod's connection managers normalise every path before routing (`normalize_path`).
        Direction::Outbound if ctx.xds_chain.normalize_path => {
            super::authorize::normalize_path(&mut parts, PathNormalization::Base)
                .err()
                .map(|k| (k, None))
        }
        Direction::Outbound => None,
    };
    if ctx.logging() {
        let (m, u, v, h) = (&parts.method, &parts.uri, parts.version, &parts.headers);
        end.log = Some(ctx.request_log(start, (m, u, v, h)));
    }
    if let Some((kind, details)) = refused {
        tracing::debug!(peer = %ctx.peer, reason = kind.details(), "inbound request refused");
        if let Some(log) = &mut end.log {
            log.envoy.denial = details;
        }
        return Ok(local_reply(kind, grpc, end));
    }
    // Not held across the awaits below (a policy's details would be).
    drop(refused);
    // The chain's external authorizer (AuthorizationPolicy CUSTOM) and the RBAC filters
    // after it, as Envoy runs its ext_authz filter. Boxed: only such chains pay for it.
    let (body, authz_response, route_basis) = if ctx.direction == Direction::Inbound
        && ctx.xds_inbound.as_ref().is_some_and(|c| c.has_ext_authz())
    {
        use super::ext_authz::{inbound, reply, Refused};
        match Box::pin(inbound(&ctx, &mut parts, body)).await {
            Ok(checked) => {
                // Envoy logs the request as the authorizer left it (its headers and query).
                if end.log.is_some() {
                    let (m, u, v, h) = (&parts.method, &parts.uri, parts.version, &parts.headers);
                    end.log = Some(ctx.request_log(start, (m, u, v, h)));
                }
                checked
            }
            Err(Refused::Kind(kind)) => return Ok(local_reply(kind, grpc, end)),
            Err(Refused::Policy(details)) => {
                if let Some(log) = &mut end.log {
                    log.envoy.denial = Some(details);
                }
                return Ok(local_reply(ErrorKind::AccessDenied, grpc, end));
            }
            Err(Refused::Reply(denial)) => return Ok(reply(denial, grpc, end)),
            Err(Refused::Failed(denial)) => {
                return Ok(super::ext_authz::reply_failed(denial, grpc, end))
            }
        }
    } else {
        (super::mirror::ClientBody::Plain(body), None, None)
    };
    if let Some(log) = &mut end.log {
        log.received = Arc::clone(&end.received);
    }
    let received = Some(Arc::clone(&end.received));
    // Routed by xDS: the route decides where, or answers here.
    // A redirect's or direct response's route may have a fault too: held (boxed: rare) until
    // the fault is served.
    let mut answered: Option<Box<super::routed::Answer>> = None;
    let routed = match &ctx.xds_routes {
        None => None,
        // Envoy's connection manager takes no HTTP/1.0 unless told to (`accept_http_10`,
        // which Remora does not read: a resource setting it is refused).
        Some(_) if parts.version == http::Version::HTTP_10 => {
            return Ok(super::routed::upgrade_required(end));
        }
        Some(routes) => {
            match super::routed::decide(&ctx, routes, &mut parts, &mut end, route_basis.as_deref())
            {
                Ok(routed) => Some(routed),
                Err(answer) if answer.fault().is_some() => {
                    answered = Some(Box::new(answer));
                    None
                }
                Err(answer) => {
                    super::routed::count_cors(&ctx, answer.cors_origin());
                    return Ok(super::routed::reply(answer, grpc, end));
                }
            }
        }
    };
    // Not held across the awaits below: a request's state is copied whole into its box.
    drop(route_basis);
    if let (Some(log), Some(r)) = (&mut end.log, &routed) {
        r.log_to(log);
    }
    // The route's fault, before the request goes on and before its timeout starts, as
    // Envoy's fault filter runs before its router. Boxed: only routes with a fault pay for it.
    let fault = match (&routed, &answered) {
        (Some(r), _) => r.fault.as_ref(),
        (None, Some(a)) => a.fault(),
        (None, None) => None,
    };
    if let Some(fault) = fault {
        let counters = ctx.xds_chain.fault_stats.as_ref();
        let counters = counters.map(|p| ctx.proxy.metrics.faults.of(p));
        if let Some(abort) = Box::pin(super::fault::inject(fault, &mut end.flags, counters)).await {
            let mut reply = super::fault::abort_reply(abort, grpc, end);
            // Envoy edits the fault filter's reply as a forwarding route's local replies (not
            // a redirect's or direct response's, which have no such route entry).
            if let Some(r) = &routed {
                r.response_edits.apply(reply.headers_mut());
            } else if let Some(edits) = answered.as_ref().and_then(|a| a.abort_edits()) {
                edits.apply(reply.headers_mut());
            }
            return Ok(reply);
        }
    }
    // The cors filter after the fault filter: it judged the origin of a request not aborted.
    match (&routed, &answered) {
        (Some(r), _) => super::routed::count_cors(&ctx, r.cors_origin),
        (None, Some(a)) => super::routed::count_cors(&ctx, a.cors_origin()),
        (None, None) => {}
    }
    if let Some(answer) = answered {
        return Ok(super::routed::reply(*answer, grpc, end));
    }
    let timeout = match &routed {
        Some(r) => r.deadline(grpc, headers::grpc_timeout(&parts.headers)),
        None => headers::grpc_timeout(&parts.headers)
            .filter(|_| grpc)
            .or(Some(ctx.config.http.request_timeout).filter(|t| !t.is_zero())),
    };
    // Allocated only for requests with a deadline; it also bounds the response body.
    let mut deadline = timeout.map(|t| Box::pin(tokio::time::sleep(t)));

    // Phase 2: upstream.
    headers::upstream_version(&mut parts);
    // The route's mirrors: copies of the head as it goes upstream, sent on their own.
    let body = match routed.as_ref().and_then(|r| r.mirrors.as_deref()) {
        None => body,
        Some(mirrors) => {
            let timeout = routed.as_ref().and_then(|r| r.timeout);
            super::mirror::shadow(&ctx, mirrors, &parts, body, timeout)
        }
    };
    let sending = attempts(
        &ctx,
        parts,
        body,
        received,
        upgrade,
        &mut end.flags,
        routed.as_ref(),
    );
    let result = match &mut deadline {
        Some(d) => tokio::select! {
            r = sending => r,
            () = d.as_mut() => {
                if let Some(routed) = &routed {
                    super::routed::timed_out(routed);
                }
                Err(ProxyError {
                    kind: ErrorKind::Timeout,
                    upstream: ctx.key.destination,
                    source: None,
                })
            }
        },
        None => sending.await,
    };

    // Phase 3: the response.
    let Upstreamed {
        mut response,
        pooled,
        endpoint,
        local,
        in_flight,
        pool_idle_timeout,
    } = match result {
        Ok(up) => up,
        Err(e) => {
            tracing::debug!(peer = %ctx.peer, error = %e, "request failed");
            if matches!(e.kind, ErrorKind::ConnectFailed | ErrorKind::ConnectTimeout) {
                ctx.proxy
                    .metrics
                    .direction(ctx.direction)
                    .connect_failures
                    .inc();
            }
            end.flags.insert(e.kind.flag());
            if let Some(log) = &mut end.log {
                log.upstream = Some(ctx.key.destination);
                if routed.is_some() {
                    log.upstream = None;
                    if let Some(dial) = e.source.as_deref().and_then(|s| s.downcast_ref()) {
                        log.dial_failed(e.upstream, dial);
                    }
                }
            }
            let mut reply = local_reply(e.kind, grpc, end);
            // Envoy's router edits its own replies as it edits the upstream's.
            if let Some(routed) = &routed {
                super::routed::charge_local_answer(routed, e.kind);
                routed.response_edits.apply(reply.headers_mut());
                routed.cors_response.apply(reply.headers_mut());
            }
            if let Some(added) = &authz_response {
                added.apply(reply.headers_mut());
            }
            return Ok(reply);
        }
    };
    let upgraded = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    let tunnel = match (upgraded, downstream_upgrade) {
        (true, Some(downstream)) => Some((downstream, hyper::upgrade::on(&mut response))),
        _ => None,
    };
    let (mut parts, body) = response.into_parts();
    headers::prepare_response(&mut parts.headers, upgraded);
    if let Some(routed) = &routed {
        routed.response_edits.apply(&mut parts.headers);
        for cookie in &routed.set_cookies {
            parts
                .headers
                .append(http::header::SET_COOKIE, cookie.clone());
        }
        routed.cors_response.apply(&mut parts.headers);
    }
    // The external authorizer's headers for the client: its filter adds them as the response
    // passes it, after the router's edits.
    if let Some(added) = &authz_response {
        added.apply(&mut parts.headers);
    }
    if let Some(originate) = &ctx.originate {
        if let (_, Some(value)) = exchange::take(&mut parts.headers) {
            originate.learn_server_value(value.as_bytes());
        }
    } else if ctx.mesh_peer.is_some() {
        ctx.proxy
            .mesh
            .exchange_headers
            .add_to_response(described, &mut parts.headers);
    }
    end.status = parts.status.as_u16();
    // A trailers-only gRPC response carries its status in the headers.
    end.grpc_status = headers::grpc_status(&parts.headers);
    if let Some(log) = &mut end.log {
        log.status = parts.status.as_u16();
        log.upstream = Some(endpoint);
        log.upstream_time = Some(start.1.elapsed());
        log.envoy.upstream_local = local.get();
    }
    if ctx.closing() && ctx.key.version == HttpVersion::Http1 && !upgraded {
        parts
            .headers
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    // An upgraded connection belongs to the tunnel now, and so does the request's end.
    // Routed by xDS, the cluster's idle timeout bounds the connection's stay in the pool.
    let idle_timeout = pool_idle_timeout.filter(|_| end.routed.is_some());
    end.pooled = pooled.filter(|_| !upgraded).map(|(key, sender)| {
        Box::new(crate::http::body::ToPool {
            key,
            sender,
            idle_timeout,
        })
    });
    if let Some(r) = &mut end.routed {
        r.in_flight = in_flight;
    }
    if let Some((downstream, upstream)) = tunnel {
        upgrade::tunnel(downstream, upstream, ctx.proxy.drain.track(), end);
        return Ok(Response::from_parts(parts, ResponseBody::upgraded(body)));
    }
    Ok(Response::from_parts(
        parts,
        ResponseBody::upstream(body, deadline, end),
    ))
}

/// Send the request, retrying as the route's policy says (xDS), else as Istio's default
/// policy says (up to `http.retries` more attempts on a connect failure, a refused stream, a
/// 503 or a gRPC UNAVAILABLE/CANCELLED): outbound only, for a request whose body can be sent
/// again, each attempt within the policy's per-try timeout.
async fn attempts(
    ctx: &ConnContext,
    parts: Parts,
    body: super::mirror::ClientBody,
    received: Option<Arc<BodyCounter>>,
    upgrade: bool,
    flags: &mut Flags,
    routed: Option<&super::routed::Routed>,
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
        // Boxed: only routes with a per-try timeout pay for its timer.
        return match super::retry_policy::per_try(routed) {
            None => send(ctx, req, routed).await,
            Some((t, _)) => Box::pin(tokio::time::timeout(t, send(ctx, req, routed)))
                .await
                .unwrap_or_else(|_| Err(super::retry_policy::per_try_expired(ctx.key.destination))),
        };
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
        let result = match super::retry_policy::per_try(routed) {
            None => send(ctx, req, routed).await,
            Some((t, _)) => Box::pin(tokio::time::timeout(t, send(ctx, req, routed)))
                .await
                .unwrap_or_else(|_| Err(super::retry_policy::per_try_expired(ctx.key.destination))),
        };
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
            return result;
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
            return result;
        }
        // The cluster's `max_retries` (counted as Envoy's `upstream_rq_retry`): past it, the
        // request ends with what it has, flagged as Envoy's router flags it.
        match super::routed::retry(routed) {
            Ok(guard) => retrying = guard,
            Err(()) => {
                flags.insert(Flags::UO);
                return result;
            }
        }
        // Dropping a 503's body closes its HTTP/1.1 connection, which is what we want of a
        // connection that just refused us.
        drop(result);
        tokio::time::sleep(backoff(attempt)).await;
        attempt += 1;
    }
}

/// An HTTP/1.1 request in absolute form (`GET http://host/path`) goes on in origin form, with
/// the target's authority as its Host (RFC 9112 §3.2.2), as Envoy forwards it: the application
/// and the authorization policies see one shape of request.
fn origin_form<B>(req: &mut Request<B>) {
    if req.version() != http::Version::HTTP_11 || req.uri().scheme().is_none() {
        return;
    }
    let Some(authority) = req.uri().authority() else {
        return;
    };
    let Ok(host) = HeaderValue::from_str(authority.as_str()) else {
        return;
    };
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    if let Ok(uri) = target.parse() {
        *req.uri_mut() = uri;
        req.headers_mut().insert(http::header::HOST, host);
    }
}

/// Why a request did not get a response from one connection.
pub(super) enum SendError {
    /// The connection was closed before the request was written: it can go on another.
    Unsent(Box<Request<UpstreamBody>>, hyper::Error),
    Failed(ProxyError),
}

/// One attempt: a pooled connection if one is idle, else a new one. A pooled connection the
/// server closed meanwhile gives the request back unsent, and it goes on a new connection.
async fn send(
    ctx: &ConnContext,
    req: Request<UpstreamBody>,
    routed: Option<&super::routed::Routed>,
) -> Result<Upstreamed, ProxyError> {
    if let Some(routed) = routed {
        return Box::pin(super::routed::send(ctx, routed, req)).await;
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

pub(super) async fn send_on(
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
    match sent {
        Ok(response) => Ok(Upstreamed {
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

/// What an Istio sidecar tells the application about the client: over mesh TLS,
/// `x-forwarded-proto: https` (unless set already) and this hop's `x-forwarded-client-cert` element; over plaintext,
/// no `x-forwarded-client-cert` at all, since a client could forge one.
fn mesh_identity_headers(ctx: &ConnContext, headers: &mut http::HeaderMap) {
    match &ctx.mesh_peer {
        Some((peer, ours)) => {
            // Kept when the client's sidecar set it, as Envoy keeps it.
            headers
                .entry(http::header::HeaderName::from_static("x-forwarded-proto"))
                .or_insert(HeaderValue::from_static("https"));
            crate::tls::xfcc::append(headers, ours, peer);
        }
        None => {
            headers.remove(&crate::tls::xfcc::XFCC);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future an async fn of two arguments returns, without making one.
    fn future_size<A, B, F>(_: impl FnOnce(A, B) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// A request's state is boxed when hyper takes it and copied whole into the box, so every
    /// request pays for its largest moment. The connect and handshake are boxed apart: inside
    /// mesh TLS that state alone is 6.5 KiB, and most requests take a pooled connection.
    #[test]
    fn a_requests_state_leaves_out_the_connect() {
        let size = future_size(handle);
        eprintln!("a request's state: {size} bytes");
        // 9,688 bytes with the connect inline; 4,672 once routed requests gained per-attempt
        // host avoidance, expected-timeout and cluster-protocol state (twenty-fourth session).
        assert!(size <= 4736, "a request's state is {size} bytes");
    }
}
