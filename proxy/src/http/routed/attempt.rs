//! One attempt of a routed request, for both HTTP paths: the endpoint the upstream layer
//! selects now and the pool key of connections to it, then (hyper's path) a pooled connection
//! or a new one.

use super::{admit, connect_failed, reported, Routed};
use crate::http::body::UpstreamBody;
use crate::http::errors::{ErrorKind, ProxyError};
use crate::http::forward::{send_on, SendError, Upstreamed};
use crate::http::pool::{self, Key, Sender};
use crate::http::{protocol, ConnContext};
use crate::upstream::dial::{self, Connected};
use crate::upstream::{Avoid, Outcome, UpstreamError};
use http::Request;
use std::time::{Duration, Instant};

/// One attempt's endpoint of the routed cluster ([`crate::upstream`]'s choice, by the
/// snapshot in force now, avoiding the hosts earlier attempts tried as the retry policy's
/// `previous_hosts` says), and the pool key of connections to it: the endpoint, the source
/// the connection is bound to, the cluster's upstream HTTP version (`upgrade`: the request
/// asks for one, which only HTTP/1.1 carries) and the TLS parameters its transport takes.
/// Both hyper's path and the HTTP/1.1 fast path select here.
pub(in crate::http) fn select(
    ctx: &ConnContext,
    routed: &Routed,
    upgrade: bool,
) -> Result<(crate::upstream::Selected, Key), ProxyError> {
    let Some(store) = &ctx.proxy.xds else {
        return Err(ProxyError::new(
            ErrorKind::NoRoute,
            ctx.key.destination,
            "no xDS",
        ));
    };
    let Some(target) = &routed.cluster else {
        return Err(ProxyError::new(
            ErrorKind::NoCluster,
            ctx.key.destination,
            "the route's cluster is not known",
        ));
    };
    // The endpoints the decision found while no push came since; else the store's now.
    let now;
    let eds = if store.generation() == target.generation {
        target.eds.as_ref()
    } else {
        now = store.current();
        now.eds_of(&target.model)
    };
    let selected = {
        let mut tried = routed
            .tried
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let avoid = Avoid {
            hosts: tried.as_slice(),
            attempts: routed.avoid_previous.unwrap_or(0),
            hash: routed.hash,
            previous_priorities: routed.retry.previous_priorities(),
        };
        let selected = ctx.proxy.upstreams.select_in(
            eds,
            &target.state,
            &target.model,
            ctx.key.destination,
            avoid,
        );
        if let Ok(s) = &selected {
            tried.push(s.address);
        }
        selected.map(|s| for_origin_host(s, routed))
    }
    .map_err(|e| {
        let kind = match e {
            UpstreamError::NoCluster(_) => ErrorKind::NoCluster,
            UpstreamError::NoHealthyUpstream(_) | UpstreamError::Transport { .. } => {
                ErrorKind::NoHealthyUpstream
            }
            // Waited for by `admit` first; one taken meanwhile by another request overflows.
            UpstreamError::Overflow(_) | UpstreamError::ConnectionsFull(_) => ErrorKind::Overflow,
        };
        ProxyError::new(kind, ctx.key.destination, e)
    })?;
    let version =
        protocol::upstream_version(selected.cluster.http_protocol, ctx.key.version, upgrade);
    let key = Key {
        destination: selected.address,
        source: dial::source(&selected, source(ctx, routed)),
        version,
        tls: ctx.proxy.upstreams.tls_id(&selected.transport),
    };
    Ok((selected, key))
}

/// A TLS origination of a cluster with `auto_sni` / `auto_san_validation` takes the request's
/// host as SNI and SAN; the pool key then keeps its connections apart from another host's.
fn for_origin_host(
    mut selected: crate::upstream::Selected,
    routed: &Routed,
) -> crate::upstream::Selected {
    if let (Some(host), crate::upstream::Transport::Origin(tls)) =
        (&routed.origin_host, &selected.transport)
    {
        let c = &selected.cluster;
        let tls = tls.for_host(host, c.auto_sni, c.auto_san_validation);
        selected.transport = crate::upstream::Transport::Origin(std::sync::Arc::new(tls));
    }
    selected
}

/// Where an attempt is dialled from: the client's passthrough source (inbound, 127.0.0.6),
/// but none for a request of this proxy's own.
fn source(ctx: &ConnContext, routed: &Routed) -> Option<crate::connect::Source> {
    if routed.own_request {
        None
    } else {
        ctx.key.source
    }
}

/// What a failed dial of an endpoint answers (and whether it is retried).
pub(in crate::http) fn dial_failure(e: &dial::DialError) -> ErrorKind {
    match e.end() {
        crate::access_log::End::ConnectTimeout => ErrorKind::ConnectTimeout,
        _ => ErrorKind::ConnectFailed,
    }
}

/// One attempt of a routed request: an endpoint chosen now, a pooled connection to it if one
/// is idle, else a new one.
pub(in crate::http) async fn send(
    ctx: &ConnContext,
    routed: &Routed,
    mut req: Request<UpstreamBody>,
) -> Result<Upstreamed, ProxyError> {
    let upgrade = ctx.key.version == crate::detect::HttpVersion::Http1
        && crate::http::headers::wants_upgrade(req.headers());
    admit(ctx, routed).await?;
    let (selected, key) = select(ctx, routed, upgrade)?;
    let version = key.version;
    protocol::translate(&mut req, version);
    let idle_timeout = pool_idle_timeout(
        selected.cluster.http_idle_timeout,
        ctx.config.http.pool_idle_timeout,
    );
    // `max_requests_per_connection`: an HTTP/1.1 connection is retired once it has carried
    // that many; an HTTP/2 one, whose streams are not counted, is then not shared at all, so
    // none carries more than the limit.
    let limit = selected.cluster.max_requests_per_connection;
    let pooled = ctx.proxy.pool.checkout(&key, Instant::now(), idle_timeout);
    if let Some(sender) = pooled {
        match send_on(ctx, key, sender, req).await {
            Ok(up) => {
                selected
                    .in_flight
                    .report(Outcome::Status(up.response.status().as_u16()));
                let up = up.counting(selected.in_flight);
                return Ok(up.pooled_within(limit, idle_timeout));
            }
            Err(SendError::Unsent(back, e)) => {
                tracing::debug!(endpoint = %key.destination, error = %e, "pooled connection closed; opening another");
                req = *back;
            }
            Err(SendError::Failed(e)) => return Err(reported(&selected, e)),
        }
    }
    let alpn = protocol::mesh_alpn(req.version());
    let connected = Box::pin(dial::dial(
        &ctx.proxy,
        &ctx.config.tls,
        &selected,
        if routed.own_request {
            crate::Direction::Outbound
        } else {
            ctx.direction
        },
        Some(&alpn),
        source(ctx, routed),
    ))
    .await
    .map_err(|e| {
        let e = ProxyError::new(dial_failure(&e), selected.address, e);
        connect_failed(&selected, e)
    })?;
    selected.in_flight.report(Outcome::Connected);
    let sender = match connected {
        Connected::Plain(up) => pool::handshake(up, version).await,
        Connected::Mesh(tls, registration) => {
            let local = pool::LocalAddr::new(tls.get_ref().0.local_addr().ok());
            pool::handshake_over(*tls, registration, version, local).await
        }
    }
    .map_err(|e| {
        let e = ProxyError::new(ErrorKind::ConnectFailed, selected.address, e);
        connect_failed(&selected, e)
    })?;
    if let (Sender::Http2(s, local), None) = (&sender, limit) {
        // Shared from now on by every request to this endpoint.
        ctx.proxy.pool.checkin(
            key,
            Sender::Http2(s.clone(), local.clone()),
            idle_timeout,
            ctx.config.http.pool_max_idle_per_upstream,
        );
    }
    match send_on(ctx, key, sender, req).await {
        Ok(up) => {
            selected
                .in_flight
                .report(Outcome::Status(up.response.status().as_u16()));
            Ok(up
                .counting(selected.in_flight)
                .pooled_within(limit, idle_timeout))
        }
        Err(SendError::Unsent(_, e)) => Err(reported(
            &selected,
            ProxyError::from_send(key.destination, e),
        )),
        Err(SendError::Failed(e)) => Err(reported(&selected, e)),
    }
}

/// How long a pooled connection of a cluster may stay idle: the cluster's
/// `common_http_protocol_options.idle_timeout` (zero: none), and never longer than Remora's
/// own `http.pool_idle_timeout` (servers close idle keep-alive connections on timers of their
/// own; istiod's default of an hour would outlive most of them).
pub(in crate::http) fn pool_idle_timeout(cluster: Option<Duration>, remora: Duration) -> Duration {
    cluster
        .filter(|t| !t.is_zero())
        .map_or(remora, |t| t.min(remora))
}
