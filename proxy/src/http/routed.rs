//! Requests routed by xDS: per request, the route decision ([`crate::route::http_route`]) over
//! the chain's route table picks a cluster (or answers locally: 404 `NR`, a direct response,
//! a redirect); per attempt, the upstream layer ([`crate::upstream`]) picks one of the
//! cluster's endpoints and its transport, and the request goes on a pooled connection to that
//! endpoint, keyed by the endpoint and its TLS parameters. So one keep-alive client connection
//! reaches every endpoint, and a retry may go to another.

use super::errors::{ErrorKind, ProxyError};
use super::forward::{send_on, SendError, Upstreamed};
use super::pool::{self, Key, Sender};
use super::{body::UpstreamBody, originate, ConnContext};
use crate::route::{self, HttpDecision};
use crate::upstream::dial::{self, Connected};
use crate::upstream::{Transport, UpstreamError};
use http::request::Parts;
use http::Request;
use remora_xds::model::listener::RouteSource;
use remora_xds::model::route::RequestParts;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Where a routed request goes.
#[derive(Debug)]
pub struct Routed {
    pub cluster: String,
    /// The connection's original destination (PassthroughCluster's endpoint).
    pub original_dst: SocketAddr,
    /// The route's timeout (`None`: no deadline).
    pub timeout: Option<Duration>,
    /// How many times a failed attempt may be tried again: the route's (or virtual host's)
    /// `num_retries`, none without a policy. Which failures are retried is Istio's default set
    /// (`retry_on` is not read yet).
    pub retries: u32,
}

/// A request answered here instead.
#[derive(Debug)]
pub enum Answer {
    Error(ErrorKind),
    /// A direct response, or a redirect (with its `location`).
    Local {
        status: u16,
        body: Option<String>,
        location: Option<String>,
    },
}

/// Route one request by the connection's table in the snapshot in force now.
pub fn decide(ctx: &ConnContext, routes: &RouteSource, parts: &Parts) -> Result<Routed, Answer> {
    let Some(store) = &ctx.proxy.xds else {
        return Err(Answer::Error(ErrorKind::NoRoute));
    };
    let snapshot = store.snapshot();
    let Some(table) = route::route_table(&snapshot, routes) else {
        return Err(Answer::Error(ErrorKind::NoRoute));
    };
    let host = parts
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| parts.uri.authority().map(|a| a.as_str()))
        .unwrap_or_default();
    let header = |name: &str| match name {
        ":authority" => Some(host),
        ":method" => Some(parts.method.as_str()),
        ":path" => parts.uri.path_and_query().map(|p| p.as_str()),
        _ => parts.headers.get(name).and_then(|v| v.to_str().ok()),
    };
    let req = RequestParts {
        method: parts.method.as_str(),
        path_and_query: parts.uri.path_and_query().map_or("/", |p| p.as_str()),
        header: &header,
    };
    match route::http_route(table, host, &req, fastrand::u64(..)) {
        HttpDecision::Forward {
            cluster,
            forward,
            retry,
            ..
        } => Ok(Routed {
            cluster: cluster.to_string(),
            original_dst: ctx.key.destination,
            timeout: forward.timeout,
            retries: retry.map_or(0, |r| r.num_retries),
        }),
        HttpDecision::NoRoute | HttpDecision::NoRouteTable => {
            Err(Answer::Error(ErrorKind::NoRoute))
        }
        HttpDecision::DirectResponse { status, body } => Err(Answer::Local {
            status,
            body: body.map(str::to_string),
            location: None,
        }),
        HttpDecision::Redirect(r) => {
            let scheme = r.scheme.as_deref().unwrap_or("http");
            let host = r.host.as_deref().unwrap_or(host);
            let host = match r.port {
                Some(port) => format!("{}:{port}", host.split(':').next().unwrap_or(host)),
                None => host.to_string(),
            };
            let path = r.path.as_deref().unwrap_or(req.path_and_query);
            Err(Answer::Local {
                status: r.status,
                body: None,
                location: Some(format!("{scheme}://{host}{path}")),
            })
        }
    }
}

/// One attempt of a routed request: an endpoint chosen now, a pooled connection to it if one
/// is idle, else a new one.
pub(super) async fn send(
    ctx: &ConnContext,
    routed: &Routed,
    mut req: Request<UpstreamBody>,
) -> Result<Upstreamed, ProxyError> {
    let snapshot = match &ctx.proxy.xds {
        Some(store) => store.snapshot(),
        None => {
            return Err(ProxyError::new(
                ErrorKind::NoRoute,
                routed.original_dst,
                "no xDS",
            ))
        }
    };
    let selected = ctx
        .proxy
        .upstreams
        .select(&snapshot, &routed.cluster, routed.original_dst)
        .map_err(|e| {
            let kind = match e {
                UpstreamError::NoCluster(_) => ErrorKind::NoCluster,
                UpstreamError::NoHealthyUpstream(_) | UpstreamError::Transport { .. } => {
                    ErrorKind::NoHealthyUpstream
                }
            };
            ProxyError::new(kind, routed.original_dst, e)
        })?;
    let version = ctx.key.version;
    let key = Key {
        destination: selected.address,
        source: None,
        version,
        tls: match &selected.transport {
            Transport::Plaintext => None,
            Transport::Mesh(mesh) => Some(ctx.proxy.upstreams.tls_id(mesh)),
        },
    };
    let idle_timeout = ctx.config.http.pool_idle_timeout;
    if let Some(sender) = ctx.proxy.pool.checkout(&key, Instant::now(), idle_timeout) {
        match send_on(ctx, key, sender, req).await {
            Ok(up) => return Ok(up.counting(selected.in_flight)),
            Err(SendError::Unsent(back, e)) => {
                tracing::debug!(endpoint = %key.destination, error = %e, "pooled connection closed; opening another");
                req = *back;
            }
            Err(SendError::Failed(e)) => return Err(e),
        }
    }
    let alpn = originate::alpn(version);
    let connected = Box::pin(dial::dial(
        &ctx.proxy,
        &ctx.config.tls,
        &selected,
        ctx.direction,
        Some(&alpn),
    ))
    .await
    .map_err(|e| {
        let kind = match e.end() {
            crate::access_log::End::ConnectTimeout => ErrorKind::ConnectTimeout,
            _ => ErrorKind::ConnectFailed,
        };
        ProxyError::new(kind, selected.address, e)
    })?;
    let sender = match connected {
        Connected::Plain(up) => pool::handshake(up, version).await,
        Connected::Mesh(tls, registration) => {
            pool::handshake_over(*tls, registration, version).await
        }
    }
    .map_err(|e| ProxyError::new(ErrorKind::ConnectFailed, selected.address, e))?;
    if let Sender::Http2(s) = &sender {
        // Shared from now on by every request to this endpoint.
        ctx.proxy.pool.checkin(
            key,
            Sender::Http2(s.clone()),
            idle_timeout,
            ctx.config.http.pool_max_idle_per_upstream,
        );
    }
    match send_on(ctx, key, sender, req).await {
        Ok(up) => Ok(up.counting(selected.in_flight)),
        Err(SendError::Unsent(_, e)) => Err(ProxyError::from_send(key.destination, e)),
        Err(SendError::Failed(e)) => Err(e),
    }
}
