//! Requests routed by xDS: per request, the route decision ([`crate::route::http_route`]) over
//! the chain's route table picks a cluster (or answers locally: 404 `NR`, a direct response,
//! a redirect); per attempt, the upstream layer ([`crate::upstream`]) picks one of the
//! cluster's endpoints and its transport, and the request goes on a pooled connection to that
//! endpoint, keyed by the endpoint and its TLS parameters. So one keep-alive client connection
//! reaches every endpoint, and a retry may go to another.

use super::body::{RequestEnd, ResponseBody, UpstreamBody};
use super::errors::{ErrorKind, ProxyError};
use super::forward::{send_on, SendError, Upstreamed};
use super::pool::{self, Key, Sender};
use super::{originate, ConnContext};
use crate::route::{self, HttpDecision};
use crate::upstream::dial::{self, Connected};
use crate::upstream::{Transport, UpstreamError};
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Request, Response};
use remora_xds::model::listener::RouteSource;
use remora_xds::model::route::{
    ClusterTarget, Forward, HeaderEdit, PathMatch, RequestParts, Route, RouteConfiguration,
    VirtualHost,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Upstreamed {
    /// This response, its request counted against its endpoint until the request ends.
    pub(super) fn counting(mut self, in_flight: crate::upstream::InFlight) -> Self {
        self.in_flight = Some(in_flight);
        self
    }
}

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
    /// Whether a 503 is retried: the policy's `retriable_status_codes` lists it (current
    /// istiod's default lists none; the converter refuses other codes).
    pub retry_503: bool,
    /// The route's, virtual host's and table's response header edits.
    pub response_edits: Edits,
    /// The destination as Istio's metrics label it, from the cluster's Istio metadata.
    pub metrics_peer: Option<Arc<crate::tls::Peer>>,
}

/// The request and response header edits of a forwarded request: the picked weighted cluster's
/// own (most specific, so first, as Envoy applies them), then the route's, the virtual
/// host's and the table's.
fn edits(
    table: &RouteConfiguration,
    vhost: &VirtualHost,
    route: &Route,
    forward: &Forward,
    cluster: &str,
) -> (Edits, Edits) {
    let picked = match &forward.target {
        ClusterTarget::Weighted(set) => set.iter().find(|c| c.name == cluster),
        ClusterTarget::Cluster(_) => None,
    };
    let none: (&[HeaderEdit], &[String]) = (&[], &[]);
    let request = Edits::of([
        picked.map_or(none, |c| {
            (
                &c.request_headers_to_add[..],
                &c.request_headers_to_remove[..],
            )
        }),
        (
            &route.request_headers_to_add,
            &route.request_headers_to_remove,
        ),
        (
            &vhost.request_headers_to_add,
            &vhost.request_headers_to_remove,
        ),
        (
            &table.request_headers_to_add,
            &table.request_headers_to_remove,
        ),
    ]);
    let response = Edits::of([
        picked.map_or(none, |c| {
            (
                &c.response_headers_to_add[..],
                &c.response_headers_to_remove[..],
            )
        }),
        (
            &route.response_headers_to_add,
            &route.response_headers_to_remove,
        ),
        (
            &vhost.response_headers_to_add,
            &vhost.response_headers_to_remove,
        ),
        (
            &table.response_headers_to_add,
            &table.response_headers_to_remove,
        ),
    ]);
    (request, response)
}

/// Header edits of a route, its virtual host and its table, in Envoy's default order (the
/// most specific first, so the least specific's overwrite wins); removals before additions.
#[derive(Debug, Default)]
pub struct Edits {
    remove: Vec<String>,
    add: Vec<HeaderEdit>,
}

impl Edits {
    fn of<'a>(levels: impl IntoIterator<Item = (&'a [HeaderEdit], &'a [String])>) -> Edits {
        let mut edits = Edits::default();
        for (add, remove) in levels {
            edits.add.extend_from_slice(add);
            edits.remove.extend_from_slice(remove);
        }
        edits
    }

    /// Whether there is nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.add.is_empty()
    }

    /// Apply to `headers`. Values are taken literally (Envoy's `%…%` formatters are not
    /// expanded).
    pub fn apply(&self, headers: &mut HeaderMap) {
        for name in &self.remove {
            headers.remove(name.as_str());
        }
        for edit in &self.add {
            let (Ok(name), Ok(value)) = (
                HeaderName::try_from(edit.name.as_str()),
                HeaderValue::try_from(edit.value.as_str()),
            ) else {
                continue;
            };
            if edit.append {
                headers.append(name, value);
            } else {
                headers.insert(name, value);
            }
        }
    }
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

/// A forwarded request's route, before it is applied to the request: where it goes, and
/// what the route changes of the request.
#[derive(Debug)]
pub struct Decided {
    pub routed: Routed,
    pub request_edits: Edits,
    /// The path (with query) `prefix_rewrite` makes of the request's.
    pub path: Option<String>,
    /// `host_rewrite`'s Host.
    pub host: Option<String>,
}

impl Decided {
    /// Whether the route leaves the request's head and the response's as they are (the HTTP/1.1
    /// fast path forwards heads as received, so it serves only such routes).
    pub fn edits_nothing(&self) -> bool {
        self.request_edits.is_empty()
            && self.routed.response_edits.is_empty()
            && self.path.is_none()
            && self.host.is_none()
    }
}

impl Routed {
    /// What the request holds until it ends, to be counted under the cluster's service.
    pub fn end(&self) -> Box<super::body::RoutedEnd> {
        Box::new(super::body::RoutedEnd {
            in_flight: None,
            metrics_peer: self.metrics_peer.clone(),
        })
    }
}

/// The route decision for one request (its `host`, method, path and headers) by the
/// connection's table in the snapshot in force now: the one decision hyper's path and the
/// HTTP/1.1 fast path both take.
pub fn decide_request(
    ctx: &ConnContext,
    routes: &RouteSource,
    host: &str,
    req: &RequestParts<'_>,
) -> Result<Decided, Answer> {
    let Some(store) = &ctx.proxy.xds else {
        return Err(Answer::Error(ErrorKind::NoRoute));
    };
    let snapshot = store.current();
    let Some(table) = route::route_table(&snapshot, routes) else {
        return Err(Answer::Error(ErrorKind::NoRoute));
    };
    let decision = route::http_route(table, host, req, fastrand::u64(..));
    let (cluster, route, forward, retry, vhost) = match decision {
        HttpDecision::Forward {
            cluster,
            route,
            forward,
            retry,
            vhost,
        } => (cluster, route, forward, retry, vhost),
        other => return Err(answer(other, host, req.path_and_query)),
    };
    let (request_edits, response_edits) = edits(table, vhost, route, forward, cluster);
    let path = forward
        .prefix_rewrite
        .as_deref()
        .and_then(|to| rewrite_prefix(&route.matcher.path, req.path_and_query, to));
    let routed = Routed {
        cluster: cluster.to_string(),
        original_dst: ctx.key.destination,
        timeout: forward.timeout,
        retries: retry.map_or(0, |r| r.num_retries),
        retry_503: retry.is_some_and(|r| {
            r.retriable_status_codes.contains(&503)
                && r.retry_on.iter().any(|c| c == "retriable-status-codes")
        }),
        response_edits,
        metrics_peer: snapshot
            .cluster(cluster)
            .and_then(|c| ctx.proxy.upstreams.service_peer(c)),
    };
    Ok(Decided {
        routed,
        request_edits,
        path,
        host: forward.host_rewrite.clone(),
    })
}

/// Route one request by the connection's table in the snapshot in force now; a forwarded
/// one's end records what it holds until it ends.
pub fn decide(
    ctx: &ConnContext,
    routes: &RouteSource,
    parts: &mut Parts,
    end: &mut RequestEnd,
) -> Result<Routed, Answer> {
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
    let decided = decide_request(ctx, routes, host, &req)?;
    end.routed = Some(decided.routed.end());
    decided.request_edits.apply(&mut parts.headers);
    if let Some(path) = decided.path.and_then(|p| p.parse::<http::Uri>().ok()) {
        parts.uri = path;
    }
    if let Some(host) = decided.host.and_then(|h| HeaderValue::try_from(h).ok()) {
        parts.headers.insert(http::header::HOST, host);
    }
    Ok(decided.routed)
}

/// What a request that is not forwarded gets.
fn answer(decision: HttpDecision<'_>, host: &str, path_and_query: &str) -> Answer {
    match decision {
        HttpDecision::NoRoute | HttpDecision::NoRouteTable | HttpDecision::Forward { .. } => {
            Answer::Error(ErrorKind::NoRoute)
        }
        HttpDecision::DirectResponse { status, body } => Answer::Local {
            status,
            body: body.map(str::to_string),
            location: None,
        },
        HttpDecision::Redirect(r) => {
            let scheme = r.scheme.as_deref().unwrap_or("http");
            let host = r.host.as_deref().unwrap_or(host);
            let host = match r.port {
                Some(port) => format!("{}:{port}", host.split(':').next().unwrap_or(host)),
                None => host.to_string(),
            };
            let path = r.path.as_deref().unwrap_or(path_and_query);
            Answer::Local {
                status: r.status,
                body: None,
                location: Some(format!("{scheme}://{host}{path}")),
            }
        }
    }
}

/// Envoy's `prefix_rewrite`: what the route matched of the path is replaced (the whole path
/// for an exact match); regex routes are left as they are.
fn rewrite_prefix(matched: &PathMatch, path_and_query: &str, to: &str) -> Option<String> {
    let prefix = match matched {
        PathMatch::Prefix(p) | PathMatch::PathSeparatedPrefix(p) | PathMatch::Exact(p) => p,
        PathMatch::Regex(_) | PathMatch::Connect => return None,
    };
    let rest = path_and_query.get(prefix.len()..)?;
    path_and_query
        .get(..prefix.len())
        .filter(|head| head.eq_ignore_ascii_case(prefix))?;
    Some(format!("{to}{rest}"))
}

/// One attempt's endpoint of the routed cluster ([`crate::upstream`]'s choice, by the
/// snapshot in force now), and the pool key of connections to it: the endpoint and the TLS
/// parameters its transport takes. Both hyper's path and the HTTP/1.1 fast path select here.
pub(super) fn select(
    ctx: &ConnContext,
    routed: &Routed,
) -> Result<(crate::upstream::Selected, Key), ProxyError> {
    let Some(store) = &ctx.proxy.xds else {
        return Err(ProxyError::new(
            ErrorKind::NoRoute,
            routed.original_dst,
            "no xDS",
        ));
    };
    let selected = ctx
        .proxy
        .upstreams
        .select(&store.current(), &routed.cluster, routed.original_dst)
        .map_err(|e| {
            let kind = match e {
                UpstreamError::NoCluster(_) => ErrorKind::NoCluster,
                UpstreamError::NoHealthyUpstream(_) | UpstreamError::Transport { .. } => {
                    ErrorKind::NoHealthyUpstream
                }
            };
            ProxyError::new(kind, routed.original_dst, e)
        })?;
    let key = Key {
        destination: selected.address,
        source: None,
        version: ctx.key.version,
        tls: match &selected.transport {
            Transport::Plaintext => 0,
            Transport::Mesh(mesh) => ctx.proxy.upstreams.tls_id(mesh),
        },
    };
    Ok((selected, key))
}

/// What a failed dial of an endpoint answers (and whether it is retried).
pub(super) fn dial_failure(e: &dial::DialError) -> ErrorKind {
    match e.end() {
        crate::access_log::End::ConnectTimeout => ErrorKind::ConnectTimeout,
        _ => ErrorKind::ConnectFailed,
    }
}

/// One attempt of a routed request: an endpoint chosen now, a pooled connection to it if one
/// is idle, else a new one.
pub(super) async fn send(
    ctx: &ConnContext,
    routed: &Routed,
    mut req: Request<UpstreamBody>,
) -> Result<Upstreamed, ProxyError> {
    let (selected, key) = select(ctx, routed)?;
    let version = key.version;
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
    .map_err(|e| ProxyError::new(dial_failure(&e), selected.address, e))?;
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

/// The answer to a request the xDS route decision answers itself.
pub(super) fn reply(answer: Answer, grpc: bool, mut end: RequestEnd) -> Response<ResponseBody> {
    let (status, body, location) = match answer {
        Answer::Error(kind) => return super::forward::local_reply(kind, grpc, end),
        Answer::Local {
            status,
            body,
            location,
        } => (status, body, location),
    };
    end.status = status;
    if let Some(log) = &mut end.log {
        log.status = status;
    }
    let mut builder = Response::builder().status(status);
    if let Some(location) = location.and_then(|l| HeaderValue::try_from(l).ok()) {
        builder = builder.header(http::header::LOCATION, location);
    }
    let body = Bytes::from(body.unwrap_or_default());
    match builder.body(()) {
        Ok(r) => r.map(|()| ResponseBody::local(body, end)),
        // A status outside 100..=999 from the route: Envoy would have refused the table.
        Err(_) => Response::new(ResponseBody::local(Bytes::new(), end)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_rewrite_replaces_what_the_route_matched() {
        let prefix = PathMatch::Prefix("/api".into());
        assert_eq!(
            rewrite_prefix(&prefix, "/api/v1?x=1", "/").as_deref(),
            Some("//v1?x=1")
        );
        assert_eq!(
            rewrite_prefix(&prefix, "/API/v1", "/v2").as_deref(),
            Some("/v2/v1")
        );
        let exact = PathMatch::Exact("/old".into());
        assert_eq!(
            rewrite_prefix(&exact, "/old", "/new").as_deref(),
            Some("/new")
        );
    }

    /// A weighted destination's own header edits (VirtualService `route[].headers`) go with
    /// the cluster picked, and only with it.
    #[test]
    fn a_weighted_clusters_own_edits_follow_the_pick() {
        type Proto = envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
        let table = remora_xds::convert::from_json::<Proto>(&serde_json::json!({
            "name": "9080", "virtual_hosts": [{"name": "vh", "domains": ["*"], "routes": [
                {"match": {"prefix": "/"}, "route": {"weighted_clusters": {"clusters": [
                    {"name": "v1", "weight": 50, "request_headers_to_add": [
                        {"header": {"key": "x-subset", "value": "v1"}}]},
                    {"name": "v2", "weight": 50, "response_headers_to_add": [
                        {"header": {"key": "x-served", "value": "v2"}}]}]}},
                 "request_headers_to_add": [{"header": {"key": "x-route", "value": "yes"}}]}]}]
        }))
        .expect("accepted")
        .model;
        let vhost = &table.virtual_hosts[0];
        let route = &vhost.routes[0];
        let remora_xds::model::route::Action::Forward(forward) = &route.action else {
            panic!("{:?}", route.action)
        };
        let applied = |cluster: &str| {
            let (request, response) = edits(&table, vhost, route, forward, cluster);
            let (mut req, mut resp) = (HeaderMap::new(), HeaderMap::new());
            request.apply(&mut req);
            response.apply(&mut resp);
            (req, resp)
        };
        let (req, resp) = applied("v1");
        assert_eq!(req["x-subset"], "v1");
        assert_eq!(req["x-route"], "yes");
        assert!(resp.get("x-served").is_none());
        let (req, resp) = applied("v2");
        assert!(req.get("x-subset").is_none());
        assert_eq!(resp["x-served"], "v2");
    }

    #[test]
    fn edits_remove_then_add_most_specific_first() {
        let edit = |name: &str, value: &str, append: bool| HeaderEdit {
            name: name.into(),
            value: value.into(),
            append,
        };
        let route = [edit("x-a", "route", false), edit("x-b", "1", true)];
        let vhost = [edit("x-a", "vhost", false), edit("x-b", "2", true)];
        let remove = ["x-gone".to_string()];
        let edits = Edits::of([(&route[..], &remove[..]), (&vhost[..], &[][..])]);
        let mut headers = HeaderMap::new();
        headers.insert("x-gone", HeaderValue::from_static("y"));
        headers.insert("x-b", HeaderValue::from_static("0"));
        edits.apply(&mut headers);
        assert!(headers.get("x-gone").is_none());
        assert_eq!(headers["x-a"], "vhost");
        let b: Vec<&str> = headers
            .get_all("x-b")
            .iter()
            .map(|v| v.to_str().unwrap_or_default())
            .collect();
        assert_eq!(b, ["0", "1", "2"]);
    }
}
