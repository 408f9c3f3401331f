//! One attempt of a routed request, for both HTTP paths: the endpoint the upstream layer
//! selects now and the pool key of connections to it, then (hyper's path) a pooled connection
//! or a new one.

use super::{admit, connect_failed, reported, Routed};
use crate::detect::HttpVersion;
use crate::http::body::UpstreamBody;
use crate::http::errors::{ErrorKind, ProxyError};
use crate::http::forward::{send_on, SendError, Upstreamed};
use crate::http::pool::{self, Dialing, Key, Sender, Shared};
use crate::http::{protocol, ConnContext};
use crate::upstream::dial::{self, Connected};
use crate::upstream::{Avoid, ConnectionSlot, Outcome, UpstreamError};
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
        selected.map(|mut s| {
            s.in_flight.internal = routed.internal;
            for_origin_host(s, routed)
        })
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

/// What an attempt goes out on: a pooled connection (holding a stream of it, for HTTP/2),
/// or a new one (for a shared HTTP/2 connection, with the cluster's connection slot it holds).
enum Connection {
    Pooled(Sender),
    New(Option<ConnectionSlot>, Option<Dialing<Key>>),
}

/// One attempt of a routed request: an endpoint chosen now, a pooled connection to it if one
/// is idle (HTTP/1.1) or has room for another stream (HTTP/2), else a new one. An HTTP/2
/// cluster's connections are shared, each holding one of the cluster's connection slots:
/// with every connection to the endpoint at its peer's stream limit the request opens another
/// if a slot is free, else waits for a stream or a slot as a pending request, as Envoy's
/// HTTP/2 pool does.
pub(in crate::http) async fn send(
    ctx: &ConnContext,
    routed: &Routed,
    mut req: Request<UpstreamBody>,
) -> Result<Upstreamed, ProxyError> {
    let upgrade = ctx.key.version == crate::detect::HttpVersion::Http1
        && crate::http::headers::wants_upgrade(req.headers());
    let admitted_after_wait = admit(ctx, routed).await?;
    let (selected, key) = select(ctx, routed, upgrade)?;
    let version = key.version;
    protocol::translate(&mut req, version);
    let idle_timeout = pool_idle_timeout(
        selected.cluster.http_idle_timeout,
        ctx.config.http.pool_idle_timeout,
    );
    // `max_requests_per_connection`: an HTTP/1.1 connection is retired once it has carried
    // that many; an HTTP/2 one once it was given that many streams.
    let limit = selected.cluster.max_requests_per_connection;
    // The connections hold the cluster's slots, not the requests.
    let multiplexed = version == HttpVersion::Http2 && !selected.in_flight.holds_connection();
    let mut use_pool = true;
    // Whether a connection slot was refused to the request (Envoy's `upstream_cx_overflow`,
    // counted once it is pending).
    let refused = std::sync::atomic::AtomicBool::new(false);
    // Whether it waited as a pending request (counted once, however it then goes out).
    let mut waited = false;
    let (slot, dialing) = loop {
        let pool = &ctx.proxy.pool;
        let found = if multiplexed {
            let look = || {
                let slot = || {
                    let slot = selected.in_flight.connection_slot();
                    if slot.is_none() {
                        refused.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    slot
                };
                let waiters = || selected.in_flight.stream_waiters();
                Some(
                    match pool.look_shared(&key, idle_timeout, use_pool, slot, waiters)? {
                        Shared::Pooled(sender) => Connection::Pooled(sender),
                        Shared::Dial(slot, dialing) => Connection::New(Some(slot), dialing),
                    },
                )
            };
            match look() {
                Some(found) => found,
                None => {
                    waited = true;
                    selected
                        .in_flight
                        .wait_pending(look, &refused)
                        .await
                        .map_err(|e| ProxyError::new(ErrorKind::Overflow, key.destination, e))?
                }
            }
        } else {
            use_pool
                .then(|| pool.checkout(&key, Instant::now(), idle_timeout))
                .flatten()
                .map_or(Connection::New(None, None), Connection::Pooled)
        };
        let sender = match found {
            Connection::Pooled(sender) => sender,
            Connection::New(slot, dialing) => break (slot, dialing),
        };
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
                use_pool = false;
            }
            Err(SendError::Failed(e)) => return Err(reported(&selected, e)),
        }
    };
    // A request that opens a connection waits for it as a pending request, as Envoy's pools
    // count it (HTTP/1.1 and HTTP/2), unless it was counted waiting already.
    if !waited && !admitted_after_wait {
        selected.in_flight.pending_for_connect();
    }
    selected.in_flight.connecting_http(version);
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
        Connected::Plain(up) => {
            let (io, mut registration) = up.into_parts();
            let local = pool::LocalAddr::new(io.local_addr().ok());
            let end = registration.take_end();
            pool::handshake_over(io, (registration, slot), version, local, end).await
        }
        Connected::Mesh(tls, mut registration) => {
            let local = pool::LocalAddr::new(tls.get_ref().0.local_addr().ok());
            let end = registration.take_end();
            pool::handshake_over(*tls, (registration, slot), version, local, end).await
        }
    }
    .map_err(|e| {
        let e = ProxyError::new(ErrorKind::ConnectFailed, selected.address, e);
        connect_failed(&selected, e)
    })?;
    if let Some(streams) = sender.streams() {
        let waiters = multiplexed.then(|| selected.in_flight.stream_waiters());
        streams.bind(
            limit,
            selected.cluster.http2_max_concurrent_streams,
            waiters,
        );
    }
    // An HTTP/2 connection is shared from now on by every request to this endpoint, while it
    // has room; the requests that waited for it look again once its peer's limit is known.
    let sender = ctx.proxy.pool.share_new(
        key,
        sender,
        idle_timeout,
        ctx.config.http.pool_max_idle_per_upstream,
        dialing,
        selected.connect_timeout,
    );
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
