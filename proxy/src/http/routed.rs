//! Requests routed by xDS: per request, the route decision ([`crate::route::http_route`]) over
//! the chain's route table picks a cluster (or answers locally: 404 `NR`, a direct response,
//! a redirect); per attempt, the upstream layer ([`crate::upstream`]) picks one of the
//! cluster's endpoints and its transport, and the request goes on a pooled connection to that
//! endpoint, keyed by the endpoint and its TLS parameters. So one keep-alive client connection
//! reaches every endpoint, and a retry may go to another.

use super::body::RequestEnd;
use super::errors::ErrorKind;
use super::forward::Upstreamed;
use super::pool::Sender;
use super::{header_format, protocol, ConnContext};
use crate::route::rewrite::{self, RedirectRequest};
use crate::route::{self, HttpDecision};
pub(super) use breakers::{
    admit, answered, charge_local_answer, charge_per_try_answer, per_try_timed_out, report, retry,
    retry_counted, timed_out,
};
use breakers::{connect_failed, reported};
use cors::cors_outcome;
pub use cors::count_cors;
pub use edits::Edits;
use edits::{edits, local_edits};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use remora_xds::model::cluster::Cluster;
use remora_xds::model::cors::CorsOutcome;
use remora_xds::model::listener::RouteSource;
use remora_xds::model::route::RequestParts;
use remora_xds::snapshot::Snapshot;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

impl Upstreamed {
    /// Charge this answer's code to its cluster: the request's own (`retried` false), or one
    /// the router retried (Envoy's `retry.*` copy). Every caller of [`send`] says which.
    pub(super) fn charge_answer(&self, retried: bool) {
        if let Some(f) = &self.in_flight {
            f.answered(self.response.status().as_u16(), retried);
        }
    }

    /// This response, its request counted against its endpoint until the request ends.
    pub(super) fn counting(mut self, in_flight: crate::upstream::InFlight) -> Self {
        self.in_flight = Some(in_flight);
        self
    }

    /// This response, whose HTTP/1.1 connection is pooled again for at most `idle` once it
    /// ends, unless it has carried `limit` requests (it then closes).
    pub(super) fn pooled_within(mut self, limit: Option<u32>, idle: Duration) -> Self {
        if let (Some((_, Sender::Http1(_, served, _))), Some(limit)) = (&self.pooled, limit) {
            if *served >= limit {
                self.pooled = None;
            }
        }
        self.pool_idle_timeout = Some(idle);
        self
    }
}

/// The deadline Envoy's router tells the upstream, in milliseconds.
static EXPECTED_TIMEOUT: HeaderName = HeaderName::from_static("x-envoy-expected-rq-timeout-ms");

/// Where a routed request goes: its route's plan ([`RoutePlan`], shared by the route's
/// requests on the connection, and read through this), and what this request adds to it.
#[derive(Debug)]
pub struct Routed {
    pub plan: Arc<RoutePlan>,
    /// The endpoints this request's attempts went to, for `avoid_previous` (one per attempt).
    pub tried: std::sync::Mutex<Tried>,
    /// The route's, virtual host's and table's response header edits.
    pub response_edits: Edits,
    /// The cors filter's response headers (`access-control-allow-origin`, …), set after
    /// `response_edits` on the upstream's response and the router's own replies, not on a
    /// fault's abort (the fault filter comes before the cors filter in istiod's chain).
    pub cors_response: Edits,
    /// The request's hash by the route's hash policies, for a RING_HASH or MAGLEV cluster
    /// (`None` for every other, and when no policy found its input: a random pick).
    pub hash: Option<u64>,
    /// The `Set-Cookie` values of hash cookies made for this request (a policy with a TTL
    /// whose cookie it lacked), added to the upstream's response after its edits, as Envoy's
    /// router adds them (not to local replies).
    pub set_cookies: Vec<http::HeaderValue>,
    /// The host (after the route's host rewrite, without the port) a TLS origination takes
    /// as SNI and SAN, for a cluster with `auto_sni` or `auto_san_validation`; `None` for
    /// every other.
    pub origin_host: Option<Arc<str>>,
    /// Sent as this proxy's own request (an external authorizer's check), not the client's:
    /// dialled as outbound, from no passthrough source, whichever way the client came.
    pub own_request: bool,
    /// Sent as Envoy sends its own requests, `x-envoy-internal: true` (a shadow, a check):
    /// its cluster counts its answers under `internal.*` as well, not `external.*`.
    pub internal: bool,
    /// Whether the cors filter found the request's origin allowed, when it judged it: counted
    /// once the fault filter before it has let the request go on ([`count_cors`]).
    pub cors_origin: Option<bool>,
}

/// A routed request reads its route's decisions (cluster, deadlines, retries, fault) as its
/// own: they are the same for every request of the route.
impl std::ops::Deref for Routed {
    type Target = RoutePlan;

    fn deref(&self) -> &RoutePlan {
        &self.plan
    }
}

impl Routed {
    /// A request of `plan`, with nothing of its own added yet.
    pub fn of(plan: Arc<RoutePlan>) -> Routed {
        Routed {
            plan,
            tried: std::sync::Mutex::default(),
            response_edits: Edits::default(),
            cors_response: Edits::default(),
            hash: None,
            set_cookies: Vec::new(),
            origin_host: None,
            own_request: false,
            internal: false,
            cors_origin: None,
        }
    }

    /// One attempt to `cluster` with no route around it: no timeout, retries, fault, edits or
    /// mirrors (a mirror's copy, an external authorizer's check).
    pub fn single_attempt(cluster: RoutedCluster) -> Routed {
        Routed::of(Arc::new(RoutePlan::single_attempt(cluster)))
    }

    /// The request's deadline, as Envoy's router computes it: the route's timeout, or for a
    /// gRPC request with `grpc_timeout_header_max` set, its `grpc-timeout` (`header`) bounded
    /// by that maximum (a zero header takes the maximum; zero everywhere is no deadline); then
    /// no longer than `max_stream_duration`.
    pub fn deadline(&self, grpc: bool, header: Option<Duration>) -> Option<Duration> {
        let mut deadline = self.timeout;
        if let (true, Some(max), Some(asked)) = (grpc, self.grpc_timeout_header_max, header) {
            let bounded = if !max.is_zero() && (asked.is_zero() || asked > max) {
                max
            } else {
                asked
            };
            deadline = Some(bounded).filter(|d| !d.is_zero());
        }
        match (deadline, self.max_stream_duration) {
            (Some(d), Some(m)) => Some(d.min(m)),
            (d, m) => d.or(m),
        }
    }
}

impl Routed {
    /// A retry tells the upstream what is left of the route's deadline, as Envoy's router
    /// does (the first attempt carries the whole of it, set by [`decide`]).
    pub(super) fn expect_remaining(&self, headers: &mut HeaderMap, elapsed: Duration) {
        if let Some(t) = self.expected_timeout(elapsed) {
            let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
            headers.insert(EXPECTED_TIMEOUT.clone(), HeaderValue::from(ms));
        }
    }
}

/// A routed request's cluster and its run-time state (breakers, outlier detection,
/// statistics), found once by the route decision (and kept by the connection's
/// [`memo::RouteMemo`] for its next requests).
#[derive(Debug)]
pub struct RoutedCluster {
    pub model: Arc<Cluster>,
    pub state: Arc<crate::upstream::ClusterState>,
    /// The destination as Istio's metrics label it, from the cluster's Istio metadata.
    pub metrics_peer: Option<Arc<crate::tls::Peer>>,
    /// Whether the cluster's upstream connections are what the HTTP/1.1 fast path's pool
    /// keeps (see [`Decided::plain_http1_upstream`]).
    pub plain_http1_upstream: bool,
    /// The store's generation it was resolved in, and the cluster's EDS endpoints then: an
    /// attempt made while the store is still at that generation selects among them.
    pub generation: u64,
    pub eds: Option<Arc<remora_xds::model::endpoint::ClusterLoadAssignment>>,
}

impl RoutedCluster {
    /// `model` of `snapshot` (of the store's `generation` or later), with its state and
    /// endpoints, for the requests of `ctx`.
    pub fn resolve(
        ctx: &ConnContext,
        snapshot: &Snapshot,
        model: &Arc<Cluster>,
        generation: u64,
    ) -> RoutedCluster {
        let c = &**model;
        RoutedCluster {
            generation,
            eds: snapshot.eds_of(c).cloned(),
            model: Arc::clone(model),
            state: ctx.proxy.upstreams.state_of(snapshot, model),
            metrics_peer: ctx.proxy.upstreams.service_peer(c),
            plain_http1_upstream: protocol::upstream_version(
                c.http_protocol,
                ctx.key.version,
                false,
            ) == crate::detect::HttpVersion::Http1
                && c.max_requests_per_connection.is_none()
                && pool_idle_timeout(c.http_idle_timeout, ctx.config.http.pool_idle_timeout)
                    == ctx.config.http.pool_idle_timeout,
        }
    }
}

/// The endpoints a request's attempts went to: the first held inline, so a request that is
/// not retried (nearly all) records its endpoint without an allocation.
#[derive(Debug, Clone, Default)]
pub struct Tried {
    first: Option<SocketAddr>,
    /// Every endpoint, the first included, once there is a second.
    all: Vec<SocketAddr>,
}

impl Tried {
    /// Record one more attempt's endpoint.
    pub fn push(&mut self, address: SocketAddr) {
        match self.first {
            None => self.first = Some(address),
            Some(first) => {
                if self.all.is_empty() {
                    self.all.push(first);
                }
                self.all.push(address);
            }
        }
    }

    /// The endpoints, in the order they were tried.
    pub fn as_slice(&self) -> &[SocketAddr] {
        match (&self.first, self.all.is_empty()) {
            (Some(first), true) => std::slice::from_ref(first),
            _ => &self.all,
        }
    }
}

/// A request answered here instead.
#[derive(Debug)]
pub enum Answer {
    Error(ErrorKind),
    /// A direct response, or a redirect (with its `location`), and the response header
    /// edits of its route.
    Local {
        status: u16,
        body: Option<String>,
        location: Option<String>,
        edits: Edits,
        /// The route's fault, injected before the answer as Envoy's fault filter does before
        /// its router answers.
        fault: Option<Arc<remora_xds::model::fault::FaultPolicy>>,
        /// Whether the cors filter found the request's origin allowed, when it judged it.
        cors_origin: Option<bool>,
    },
    /// A CORS preflight the cors filter answers: 200 with `headers`. `route_edits` are its
    /// forwarding route's response edits, for the abort of the route's `fault`.
    Preflight {
        headers: Edits,
        route_edits: Edits,
        fault: Option<Arc<remora_xds::model::fault::FaultPolicy>>,
        /// Whether the cors filter found the preflight's origin allowed.
        origin_valid: bool,
    },
    /// An upgrade (WebSocket) the route turns off: 403, with the route's response edits.
    UpgradeRefused {
        edits: Edits,
    },
    /// For the HTTP/1.1 fast path, which gives [`decide_request`] no request parts: the
    /// route needs them (header values to fill in, a local answer), so hyper's path serves
    /// the request.
    Handover,
}

impl Answer {
    /// Whether the cors filter found the request's origin allowed, when it judged it: counted
    /// once the fault filter before it has let the request go on.
    pub fn cors_origin(&self) -> Option<bool> {
        match self {
            Answer::Local { cors_origin, .. } => *cors_origin,
            Answer::Preflight { origin_valid, .. } => Some(*origin_valid),
            _ => None,
        }
    }

    /// What Envoy's router made of the request, when it reached the router: the fault filter
    /// and the cors filter come first (a preflight is answered by the latter), and the
    /// connection manager refuses an upgrade before any filter.
    pub fn at_router(&self) -> Option<crate::metrics::http_conn_manager::Routed> {
        use crate::metrics::http_conn_manager::Routed as R;
        match self {
            Answer::Error(kind) => error_at_router(*kind),
            Answer::Local { .. } => Some(R::DirectResponse),
            Answer::Preflight { .. } | Answer::UpgradeRefused { .. } | Answer::Handover => None,
        }
    }

    /// The fault to inject before answering.
    pub fn fault(&self) -> Option<&Arc<remora_xds::model::fault::FaultPolicy>> {
        match self {
            Answer::Local { fault, .. } | Answer::Preflight { fault, .. } => fault.as_ref(),
            _ => None,
        }
    }

    /// The response edits of the fault's abort, when it has any.
    pub fn abort_edits(&self) -> Option<&Edits> {
        match self {
            Answer::Preflight { route_edits, .. } => Some(route_edits),
            _ => None,
        }
    }
}

/// What Envoy's router made of a request the route decision answered with `kind`, when the
/// router is where that answer comes from.
pub fn error_at_router(kind: ErrorKind) -> Option<crate::metrics::http_conn_manager::Routed> {
    use crate::metrics::http_conn_manager::Routed as R;
    match kind {
        ErrorKind::NoRoute => Some(R::NoRoute),
        ErrorKind::NoCluster => Some(R::NoCluster),
        _ => None,
    }
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
    /// Whether the HTTP/1.1 fast path serves this request as hyper's path would: it forwards
    /// heads as received (so only routes that edit nothing) on its own pool of HTTP/1.1
    /// connections (so only clusters that ask nothing more of them), retrying as Istio's
    /// default policy says, injecting no fault and mirroring nothing (so only routes that ask
    /// no more): what the route's plan says ([`RoutePlan::fast`]), and nothing this request
    /// adds.
    pub fn fits_fast_path(&self) -> bool {
        self.routed.plan.fast
            && self.request_edits.is_empty()
            && self.routed.response_edits.is_empty()
            && self.routed.cors_response.is_empty()
            && self.routed.set_cookies.is_empty()
            && self.path.is_none()
            && self.host.is_none()
    }
}

impl Routed {
    /// What Envoy's router makes of the request: it forwards it, or answers 503 `NC` when its
    /// route's cluster is not known.
    pub fn at_router(&self) -> crate::metrics::http_conn_manager::Routed {
        use crate::metrics::http_conn_manager::Routed as R;
        match self.cluster {
            Some(_) => R::Forwarded,
            None => R::NoCluster,
        }
    }

    /// Tell the request's log record the route and cluster it went by.
    pub fn log_to(&self, log: &mut super::access_log::RequestLog) {
        log.envoy.cluster = self.cluster.as_ref().map(|c| Arc::clone(&c.model));
        log.envoy.route_name.clone_from(&self.route_name);
    }

    /// What the request holds until it ends, to be counted under the cluster's service.
    pub fn end(&self) -> super::body::RoutedEnd {
        super::body::RoutedEnd {
            in_flight: None,
            metrics_peer: self.cluster.as_ref().and_then(|c| c.metrics_peer.clone()),
        }
    }
}

/// The route decision for one request (its `host`, method, path and headers) by the
/// connection's table in the snapshot in force now: the one decision hyper's path and the
/// HTTP/1.1 fast path both take. Header values with Envoy's `%…%` formatters are filled in
/// from the request's `parts`; without them (the fast path, which has none) a request whose
/// route edits headers or answers locally is [`Answer::Handover`]. `pick` is the random
/// number a weighted route picks its cluster by.
pub fn decide_request(
    ctx: &ConnContext,
    routes: &RouteSource,
    host: &[u8],
    req: &RequestParts<'_>,
    parts: Option<&Parts>,
    pick: u64,
) -> Result<Decided, Answer> {
    let Some(store) = &ctx.proxy.xds else {
        return Err(Answer::Error(ErrorKind::NoRoute));
    };
    let mut memo = ctx.route_memo.lock();
    let Some((table, mut clusters)) = memo::Memo::of(&mut memo, store, routes).split(store, host)
    else {
        // Not UTF-8: hyper's path answers it.
        return Err(Answer::Handover);
    };
    let Some(memo::Table { table, vhost, host }) = table else {
        return Err(Answer::Error(ErrorKind::NoRoute));
    };
    let decision = route::http_route_in(vhost, req, pick);
    if let Some(parts) = parts.filter(|p| super::headers::wants_upgrade(&p.headers)) {
        if let Some(edits) = upgrades::refused(ctx, table, &decision, parts) {
            return Err(Answer::UpgradeRefused { edits });
        }
    }
    let (cluster, route, forward, retry, vhost) = match decision {
        HttpDecision::Forward {
            cluster,
            route,
            forward,
            retry,
            vhost,
        } => (cluster, route, forward, retry, vhost),
        HttpDecision::NoRoute | HttpDecision::NoRouteTable => {
            return Err(Answer::Error(ErrorKind::NoRoute))
        }
        other => {
            let Some(parts) = parts else {
                return Err(Answer::Handover);
            };
            let scheme = parts
                .headers
                .get("x-forwarded-proto")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("http");
            let request = RedirectRequest {
                host,
                path_and_query: req.path_and_query,
                scheme,
            };
            let format_request = header_format::Request {
                remote: ctx.peer,
                local: ctx.key.destination,
                started: SystemTime::now(),
                parts,
            };
            let mut local = answer(table, other, request, &format_request);
            if let Answer::Local { fault, .. } = &mut local {
                *fault = fault.take().filter(|_| ctx.xds_chain.fault_filter);
            }
            return Err(local);
        }
    };
    let (cors, cors_origin) = cors_outcome(ctx, route, parts)?;
    let plan = clusters.plan(
        ctx,
        &plan::Source {
            table,
            route,
            forward,
            vhost,
            retry,
            cluster,
            fault_filter: ctx.xds_chain.fault_filter,
            logging: ctx.logging(),
        },
    );
    let cors_headers = match &cors {
        CorsOutcome::Response(headers) => &headers[..],
        _ => &[],
    };
    let (request_edits, response_edits) = match parts {
        Some(parts) => {
            let format_request = header_format::Request {
                remote: ctx.peer,
                local: ctx.key.destination,
                started: SystemTime::now(),
                parts,
            };
            if let CorsOutcome::Preflight(headers) = &cors {
                // Answered by the cors filter, after the fault filter (first in istiod's
                // chain: its fault applies, its abort edited as this forwarding route's local
                // replies) and before the router (none of the route's edits on the answer).
                let mut answer = Edits::default();
                answer.set_after(headers);
                return Err(Answer::Preflight {
                    headers: answer,
                    route_edits: edits(table, vhost, route, forward, cluster, &format_request).1,
                    fault: plan.fault.clone(),
                    origin_valid: cors_origin == Some(true),
                });
            }
            edits(table, vhost, route, forward, cluster, &format_request)
        }
        // The fast path takes no upgrades (hyper's path checks them); edits it leaves to
        // hyper's path, which has the request's parts to fill their values in from.
        None if plan.edits_none => (Edits::default(), Edits::default()),
        None => return Err(Answer::Handover),
    };
    let mut cors_response = Edits::default();
    if !cors_headers.is_empty() {
        cors_response.set_after(cors_headers);
    }
    let path = forward
        .prefix_rewrite
        .as_deref()
        .and_then(|to| rewrite::prefix(&route.matcher.path, req.path_and_query, to));
    let target = plan.cluster.as_deref();
    let hashes = target.is_some_and(|c| c.model.lb_policy.hashes());
    let origin_host = target
        .filter(|c| c.model.auto_sni || c.model.auto_san_validation)
        .map(|_| {
            let authority = forward.host_rewrite.as_deref().unwrap_or(host);
            Arc::from(crate::upstream::transport::host_of(authority))
        });
    // Only a consistent-hash cluster reads it: no work for any other.
    let mut made = Vec::new();
    let hash = (hashes && !forward.hash_policy.is_empty())
        .then(|| {
            let conn = crate::upstream::hash::Downstream {
                peer: ctx.peer,
                local: ctx.key.destination,
            };
            let headers = parts.map(|p| &p.headers);
            crate::upstream::hash::request_hash(&forward.hash_policy, req, headers, conn, &mut made)
        })
        .flatten();
    // Nearly always none made: no collecting on the request's path then.
    let set_cookies = if made.is_empty() {
        Vec::new()
    } else {
        made.into_iter()
            .filter_map(|c| http::HeaderValue::try_from(c).ok())
            .collect()
    };
    Ok(Decided {
        routed: Routed {
            plan,
            tried: std::sync::Mutex::default(),
            response_edits,
            cors_response,
            hash,
            set_cookies,
            origin_host,
            own_request: false,
            internal: false,
            cors_origin,
        },
        request_edits,
        path,
        host: forward.host_rewrite.clone(),
    })
}

/// Route one request by the connection's table in the snapshot in force now; a forwarded
/// one's end records what it holds until it ends.
///
/// `basis`: the request the route is matched on when it is not `parts` (an external
/// authorizer edited it and its filter keeps the route chosen before), and the weighted pick
/// its filter's look at the route made ([`matched::route_target`]).
pub fn decide(
    ctx: &ConnContext,
    routes: &RouteSource,
    parts: &mut Parts,
    end: &mut RequestEnd,
    basis: Option<&super::ext_authz::RouteBasis>,
) -> Result<Routed, Answer> {
    let decided = {
        let p: &Parts = parts;
        let (uri, headers, pick) = match basis {
            Some(b) => (&b.uri, &b.headers, b.pick),
            None => (&p.uri, &p.headers, fastrand::u64(..)),
        };
        matched_on(&p.method, uri, headers, |host, req| {
            decide_request(ctx, routes, host.as_bytes(), req, Some(p), pick)
        })?
    };
    end.routed = Some(decided.routed.end());
    // Envoy's connection manager takes the internal headers off before its router.
    super::internal_headers::strip(&mut parts.headers);
    decided.request_edits.apply(&mut parts.headers);
    // Envoy's router tells the upstream its deadline (istiod's routes carry none by default).
    if let Some(t) = decided.routed.expected_timeout(Duration::ZERO) {
        let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
        parts
            .headers
            .insert(EXPECTED_TIMEOUT.clone(), HeaderValue::from(ms));
    }
    if let Some(path) = decided.path.and_then(|p| p.parse::<http::Uri>().ok()) {
        parts.uri = path;
    }
    if let Some(host) = decided.host.and_then(|h| HeaderValue::try_from(h).ok()) {
        parts.headers.insert(http::header::HOST, host);
    }
    Ok(decided.routed)
}

mod attempt;
mod breakers;
mod cors;
mod edits;
mod local;
pub mod matched;
pub mod memo;
mod plan;
mod upgrades;
use attempt::pool_idle_timeout;
pub(super) use attempt::{dial_failure, select, send};
use local::answer;
pub(super) use local::reply;
use matched::matched_on;
pub use plan::RoutePlan;
#[cfg(test)]
mod tests;
