//! AuthorizationPolicy's CUSTOM action: Envoy's `ext_authz` HTTP filter as istiod writes it
//! into `virtualInbound`, run where Envoy runs it among the chain's HTTP filters.
//!
//! The RBAC filters before it decide first ([`super::authorize`]). istiod's shadow RBAC filter
//! (stat prefix `istio_ext_authz_`) is among them: its shadow policies are the CUSTOM
//! policies' rules, and the id of the one that matched, written as Envoy's dynamic metadata
//! (`envoy.filters.http.rbac` / `istio_ext_authz_shadow_effective_policy_id`), is what the
//! filter's `filter_enabled_metadata` reads: only requests a CUSTOM policy selects are sent to
//! the authorizer ([`crate::authz::rbac::shadow_metadata`]). The authorizer is a cluster like
//! any other, reached through the upstream layer in one attempt: over gRPC
//! (`envoy.service.auth.v3.Authorization/Check`, [`grpc`]) or plain HTTP ([`http_service`]).
//! Its answer lets the request through with the headers it adds, or is the reply (its status,
//! headers and body; flag `UAEX`); its failure (unreachable, timed out, a 5xx, a gRPC error)
//! lets the request through with `failure_mode_allow`, else answers `status_on_error`.
//! The RBAC filters after it decide last. Each check and each request a filter does not
//! select is counted under Envoy's names, per connection manager ([`stats`]), and each check's
//! outcome also on the cluster of the request's route as it was when the check began
//! (`cluster.<name>.ext_authz.*`, [`crate::upstream::stats::ExtAuthzCounts`]), looked up
//! before the router chooses it ([`super::routed::matched`]). A request no route takes is not
//! checked, as Envoy's filter lets it through to the router's 404.

mod call;
mod grpc;
mod http_service;
pub mod network;
pub mod stats;

use stats::Counted;
pub use stats::{ExtAuthzStats, HttpCounters, HttpStats};

use super::authorize::attributes;
use super::body::{RequestEnd, ResponseBody, UpstreamBody};
use super::errors::{ErrorKind, Flags};
use super::mirror::{Buffered, ClientBody};
use super::routed::matched::{route_target, RouteTarget};
use super::ConnContext;
use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::request::Parts;
use http::{Response, StatusCode};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use remora_xds::model::ext_authz::{BodySettings, ExtAuthz, Service};
use remora_xds::model::listener::HttpFilter;
use std::sync::Arc;

/// Why a request is not forwarded.
#[derive(Debug)]
pub(super) enum Refused {
    /// A local reply of Remora's own (a body over the limit, a client gone).
    Kind(ErrorKind),
    /// An RBAC filter after the authorizer denied it: Envoy's details for the denial.
    Policy(Box<str>),
    /// The authorizer's answer.
    Reply(Denial),
    /// The check failed and failure is not allowed: `status_on_error`.
    Failed(Denial),
}

/// The reply the filter sends instead of forwarding.
#[derive(Debug)]
pub(super) struct Denial {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
}

/// What the authorizer said.
#[derive(Debug)]
pub(super) enum Verdict {
    /// Let through, with these edits to the request.
    Ok(Edits),
    Denied(Denial),
    /// It could not say (unreachable, timed out, a 5xx or a gRPC error).
    Error(String),
}

/// The authorizer's edits to an allowed request.
#[derive(Debug, Default)]
pub(super) struct Edits {
    /// Replace any value the request has.
    pub set: Vec<(HeaderName, HeaderValue)>,
    /// Added beside the request's own values.
    pub append: Vec<(HeaderName, HeaderValue)>,
    pub remove: Vec<HeaderName>,
    /// Query parameters replaced or added, and removed (gRPC `ok_response`).
    pub query_set: Vec<(String, String)>,
    pub query_remove: Vec<String>,
    /// Headers for the client's response (gRPC `response_headers_to_add`).
    pub response: ResponseHeaders,
}

/// Headers an allowed request's response gets from the authorizer: set (replacing the
/// response's), or added beside them.
#[derive(Debug, Default)]
pub struct ResponseHeaders {
    pub set: Vec<(HeaderName, HeaderValue)>,
    pub append: Vec<(HeaderName, HeaderValue)>,
    /// Set only where the response has none (`ADD_IF_ABSENT`).
    pub if_absent: Vec<(HeaderName, HeaderValue)>,
    /// Replace only where the response has one (`OVERWRITE_IF_EXISTS`).
    pub if_present: Vec<(HeaderName, HeaderValue)>,
}

impl ResponseHeaders {
    /// Onto the response going to the client.
    pub fn apply(&self, headers: &mut http::HeaderMap) {
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.append {
            headers.append(name.clone(), value.clone());
        }
        for (name, value) in &self.if_absent {
            if !headers.contains_key(name) {
                headers.insert(name.clone(), value.clone());
            }
        }
        for (name, value) in &self.if_present {
            if headers.contains_key(name) {
                headers.insert(name.clone(), value.clone());
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.set.is_empty()
            && self.append.is_empty()
            && self.if_absent.is_empty()
            && self.if_present.is_empty()
    }
}

impl Edits {
    /// Whether they change the request (its headers or query), not only the response.
    fn edits_request(&self) -> bool {
        !(self.set.is_empty()
            && self.append.is_empty()
            && self.remove.is_empty()
            && self.query_set.is_empty()
            && self.query_remove.is_empty())
    }

    /// Onto the request (headers, and the query when it changes one), giving back what the
    /// response gets.
    fn apply_to(mut self, parts: &mut Parts) -> ResponseHeaders {
        if !self.query_set.is_empty() || !self.query_remove.is_empty() {
            edit_query(parts, &self.query_set, &self.query_remove);
        }
        let response = std::mem::take(&mut self.response);
        self.apply(&mut parts.headers);
        response
    }

    fn apply(self, headers: &mut http::HeaderMap) {
        for name in self.remove {
            headers.remove(name);
        }
        for (name, _) in &self.set {
            headers.remove(name);
        }
        for (name, value) in self.set.into_iter().chain(self.append) {
            headers.append(name, value);
        }
    }
}

/// What the check is asked about: the request's head (as it would go upstream) and, with
/// `with_request_body`, its first bytes.
pub(super) struct CheckInput<'a> {
    pub ctx: &'a ConnContext,
    pub parts: &'a Parts,
    pub body: Option<&'a [u8]>,
    pub settings: Option<BodySettings>,
    /// The filter's `timeout`: the whole answer is due within it.
    pub timeout: std::time::Duration,
}

/// Run the chain's filters from its first ext_authz filter on (its RBAC filters before it
/// have allowed the request). `Ok` is the body to forward, which the filter may have read
/// ahead of the request to send the authorizer, and the headers the authorizer adds to the
/// response (boxed: rare).
pub(super) async fn inbound(
    ctx: &Arc<ConnContext>,
    parts: &mut Parts,
    body: Incoming,
) -> Result<Checked, Refused> {
    let Some(chain) = ctx.xds_inbound.as_ref() else {
        return Ok((ClientBody::Plain(body), None, None));
    };
    // The counters of the chain's first ext_authz filter, which every filter istiod writes
    // shares (none has a stat prefix of its own): looked up at the connection's first request.
    let manager = chain.http_stat_prefix().unwrap_or_default();
    let first_prefix = chain
        .from_ext_authz()
        .find_map(|f| match f {
            HttpFilter::ExtAuthz(ext) => Some(ext.stat_prefix.as_str()),
            _ => None,
        })
        .unwrap_or_default();
    let shared = ctx.ext_authz_stats.get_or_init(|| {
        ctx.proxy
            .metrics
            .http_ext_authz
            .of(manager)
            .of(first_prefix)
    });
    let mut body = ClientBody::Plain(body);
    let mut response: Option<Box<ResponseHeaders>> = None;
    // The request the route is chosen on: as it was before the first check (Envoy's filters
    // before it have chosen the route by then), or after the edits of an authorizer whose
    // filter clears the route cache (the route is chosen again at the next look, on the
    // request as it is then).
    let mut basis = RouteBasis::of(parts);
    let mut cleared = false;
    // The route of `basis`, looked up at the first filter (and again once `basis` is).
    let mut target: Option<RouteTarget> = None;
    // Every RBAC filter before the current one writes metadata; those after the last
    // ext_authz filter decide once it has.
    let mut rbac_before: Vec<_> = chain.http_rbac().collect();
    let mut rbac_after = Vec::new();
    for filter in chain.from_ext_authz() {
        match filter {
            HttpFilter::ExtAuthz(ext) => {
                // RBAC filters between two ext_authz filters decide before the second.
                check_rbac(ctx, parts, rbac_after.drain(..))?;
                if std::mem::take(&mut cleared) {
                    basis = RouteBasis::of(parts);
                    target = None;
                }
                let target = target.get_or_insert_with(|| route_target(ctx, &parts.method, &basis));
                if matches!(target, RouteTarget::None) {
                    // Envoy's filter skips a request without a route, counting nothing.
                    continue;
                }
                // Another stat prefix (not istiod's): its counters, looked up for the request.
                let own;
                let counters = if ext.stat_prefix == first_prefix {
                    shared
                } else {
                    own = ctx
                        .proxy
                        .metrics
                        .http_ext_authz
                        .of(manager)
                        .of(&ext.stat_prefix);
                    &own
                };
                let enabled = match &ext.enabled_by {
                    None => true,
                    Some(on) => {
                        let a = attributes(ctx, parts);
                        on.filter == crate::authz::rbac::HTTP_RBAC_METADATA
                            && crate::authz::rbac::shadow_metadata(
                                rbac_before.iter().copied(),
                                &a,
                                &on.key,
                            )
                            .is_some_and(|v| on.matcher.matches(v))
                    }
                };
                if enabled {
                    // Charged to the route's cluster, when it names one that exists.
                    let cluster = match target {
                        RouteTarget::Cluster(Some(c)) => {
                            let stats = &c.state.stats;
                            Some((stats.ext_authz(&ext.stat_prefix), &**stats))
                        }
                        _ => None,
                    };
                    let counted = Counted {
                        filter: counters,
                        cluster: cluster.as_ref().map(|(c, stats)| (&**c, *stats)),
                    };
                    let (checked, added, edited) = check(ctx, counted, ext, parts, body).await?;
                    // Envoy clears the route only when the authorizer edited the request.
                    cleared = ext.clear_route_cache && edited;
                    body = checked;
                    if let Some(added) = added {
                        let r = response.get_or_insert_with(Default::default);
                        r.set.extend(added.set);
                        r.append.extend(added.append);
                        r.if_absent.extend(added.if_absent);
                        r.if_present.extend(added.if_present);
                    }
                } else {
                    HttpCounters::inc(&counters.disabled);
                }
            }
            HttpFilter::Rbac(r) => {
                rbac_after.push(r);
                rbac_before.push(r);
            }
            _ => {}
        }
    }
    check_rbac(ctx, parts, rbac_after.into_iter())?;
    Ok((body, response, (!cleared).then_some(basis)))
}

/// What the checks let through: the body (read ahead or not), the authorizers' headers for
/// the response, and the request the route is chosen on when it is not the request as the
/// authorizers left it.
pub(super) type Checked = (
    ClientBody,
    Option<Box<ResponseHeaders>>,
    Option<Box<RouteBasis>>,
);

/// The parts of a request a route matches on, kept from before an authorizer's edits.
#[derive(Debug)]
pub struct RouteBasis {
    pub uri: http::Uri,
    pub headers: http::HeaderMap,
    /// The random number a weighted route picks its cluster by: the same for the filter's
    /// look at the route and the router's decision, as Envoy picks once per route choice.
    pub pick: u64,
}

impl RouteBasis {
    fn of(parts: &Parts) -> Box<RouteBasis> {
        Box::new(RouteBasis {
            uri: parts.uri.clone(),
            headers: parts.headers.clone(),
            pick: fastrand::u64(..),
        })
    }
}

fn check_rbac<'r>(
    ctx: &ConnContext,
    parts: &Parts,
    filters: impl Iterator<Item = &'r remora_xds::model::rbac::Rbac>,
) -> Result<(), Refused> {
    let mut filters = filters.peekable();
    if filters.peek().is_none() {
        return Ok(());
    }
    let counts = super::authorize::rbac_counts(ctx);
    match ctx
        .proxy
        .authz
        .check_rbac(filters, &attributes(ctx, parts), counts)
    {
        crate::authz::Verdict::Allowed => Ok(()),
        crate::authz::Verdict::Denied(details) => Err(Refused::Policy(details.into())),
    }
}

/// The query with `set` replacing (or adding) and `remove` taking out parameters, written back
/// in key order as Envoy's parameter map writes it.
fn edit_query(parts: &mut Parts, set: &[(String, String)], remove: &[String]) {
    let mut params: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (k, v) in form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes()) {
        params
            .entry(k.into_owned())
            .or_default()
            .push(v.into_owned());
    }
    for key in remove {
        params.remove(key);
    }
    for (key, value) in set {
        params.insert(key.clone(), vec![value.clone()]);
    }
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (key, values) in &params {
        for value in values {
            query.append_pair(key, value);
        }
    }
    let query = query.finish();
    let path = parts.uri.path();
    let target = if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{query}")
    };
    let mut uri = std::mem::take(&mut parts.uri).into_parts();
    uri.path_and_query = http::uri::PathAndQuery::try_from(target).ok();
    if let Ok(new) = http::Uri::from_parts(uri) {
        parts.uri = new;
    }
}

/// One ext_authz filter's check of the request: the body to forward, what the response
/// gets, and whether the authorizer edited the request.
async fn check(
    ctx: &Arc<ConnContext>,
    counted: Counted<'_>,
    ext: &ExtAuthz,
    parts: &mut Parts,
    body: ClientBody,
) -> Result<(ClientBody, Option<Box<ResponseHeaders>>, bool), Refused> {
    let (head, body) = match (ext.with_request_body, body) {
        (Some(settings), ClientBody::Plain(incoming)) => {
            let (head, body) = read_ahead(incoming, settings).await?;
            (Some(head), body)
        }
        (_, body) => (None, body),
    };
    let input = CheckInput {
        ctx,
        parts,
        body: head.as_deref(),
        settings: ext.with_request_body,
        timeout: ext.timeout,
    };
    let verdict = ask(&input, &ext.service).await;
    let stats = &ctx.proxy.metrics.ext_authz;
    match verdict {
        Verdict::Ok(edits) => {
            stats.ok.inc();
            counted.count(|f| &f.ok, |c| &c.ok);
            let edited = edits.edits_request();
            let response = edits.apply_to(parts);
            Ok((
                body,
                (!response.is_empty()).then(|| Box::new(response)),
                edited,
            ))
        }
        Verdict::Denied(d) => {
            stats.denied.inc();
            counted.count(|f| &f.denied, |c| &c.denied);
            counted.charge_denial(d.status);
            tracing::debug!(peer = %ctx.peer, status = %d.status, "denied by the external authorizer");
            Err(Refused::Reply(d))
        }
        Verdict::Error(why) => {
            stats.error.inc();
            counted.count(|f| &f.error, |c| &c.error);
            tracing::debug!(peer = %ctx.peer, error = %why, allow = ext.failure_mode_allow, "external authorizer failed");
            if ext.failure_mode_allow {
                stats.failure_mode_allowed.inc();
                counted.count(|f| &f.failure_mode_allowed, |c| &c.failure_mode_allowed);
                return Ok((body, None, false));
            }
            Err(Refused::Failed(Denial {
                status: StatusCode::from_u16(ext.status_on_error).unwrap_or(StatusCode::FORBIDDEN),
                headers: Vec::new(),
                body: Bytes::new(),
            }))
        }
    }
}

async fn ask(input: &CheckInput<'_>, service: &Service) -> Verdict {
    match service {
        Service::Grpc { cluster, authority } => grpc::check(input, cluster, authority).await,
        Service::Http(http) => http_service::check(input, http).await,
    }
}

/// Read the client's body until it ends or `settings.max_request_bytes` are in: the check's
/// bytes (cut to the limit when partial messages are allowed; over it, 413 as Envoy), and
/// the body to forward (what was read, then the rest).
async fn read_ahead(
    mut incoming: Incoming,
    settings: BodySettings,
) -> Result<(Bytes, ClientBody), Refused> {
    use http_body::Body as _;
    let max = settings.max_request_bytes as usize;
    let mut buf = BytesMut::new();
    let mut trailers = None;
    let mut ended = incoming.is_end_stream();
    while !ended && buf.len() < max.max(1) {
        match incoming.frame().await {
            None => ended = true,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => buf.extend_from_slice(&data),
                Err(frame) => {
                    trailers = frame.into_trailers().ok();
                    ended = true;
                }
            },
            Some(Err(_)) => return Err(Refused::Kind(ErrorKind::DownstreamAborted)),
        }
        ended = ended || incoming.is_end_stream();
    }
    let all = buf.freeze();
    let whole = ended && all.len() <= max;
    if !whole && !settings.allow_partial_message {
        return Err(Refused::Kind(ErrorKind::PayloadTooLarge));
    }
    let head = all.slice(..all.len().min(max));
    let body = ClientBody::Buffered(Box::new(Buffered {
        head: (!all.is_empty()).then_some(all),
        trailers,
        rest: (!ended).then_some(incoming),
    }));
    Ok((head, body))
}

/// The filter's reply: the authorizer's status, headers and body (or `status_on_error`), as
/// Envoy's local reply (a gRPC client gets the status as its gRPC equivalent).
pub(super) fn reply(d: Denial, grpc: bool, end: RequestEnd) -> Response<ResponseBody> {
    reply_with(d, grpc, end, "ext_authz_denied")
}

/// The reply to a failed check without `failure_mode_allow` (`status_on_error`).
pub(super) fn reply_failed(d: Denial, grpc: bool, end: RequestEnd) -> Response<ResponseBody> {
    reply_with(d, grpc, end, "ext_authz_error")
}

/// The filter's reply, logged with Envoy's `details`.
fn reply_with(
    d: Denial,
    grpc: bool,
    mut end: RequestEnd,
    details: &'static str,
) -> Response<ResponseBody> {
    end.flags.insert(Flags::UAEX);
    let mut response = Response::new(());
    if grpc {
        *response.status_mut() = StatusCode::OK;
        let h = response.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(
            super::headers::GRPC_STATUS.clone(),
            HeaderValue::from(grpc_status(d.status)),
        );
        // The body goes as the message, percent-encoded as gRPC says.
        if let Ok(message) = HeaderValue::try_from(grpc_message(&d.body)) {
            if !d.body.is_empty() {
                h.insert(super::headers::GRPC_MESSAGE.clone(), message);
            }
        }
        end.grpc_status = Some(grpc_status(d.status));
    } else {
        *response.status_mut() = d.status;
        if !d.body.is_empty() {
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        }
    }
    // The authorizer's headers, set on the reply (a gRPC client's keeps its content type).
    for (name, value) in d.headers {
        if is_hop_by_hop(&name) || (grpc && name == CONTENT_TYPE) {
            continue;
        }
        response.headers_mut().insert(name, value);
    }
    if end.conn.closing() {
        response
            .headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    end.status = response.status().as_u16();
    if let Some(log) = &mut end.log {
        log.status = end.status;
        log.envoy.details = Some(details);
    }
    let body = if grpc { Bytes::new() } else { d.body };
    response.map(|()| ResponseBody::local(body, end))
}

/// Headers of the authorizer's own connection, not the client's reply.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection" | "keep-alive" | "transfer-encoding" | "content-length" | "upgrade"
    )
}

/// gRPC's percent-encoding of a status message: bytes outside printable ASCII, and `%`.
fn grpc_message(body: &[u8]) -> String {
    let mut out = String::with_capacity(body.len());
    for &b in body {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Envoy's mapping of an HTTP status to a gRPC status for local replies.
fn grpc_status(status: StatusCode) -> u32 {
    match status.as_u16() {
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502..=504 => 14,
        _ => 2,
    }
}

/// The check request's body as it goes upstream.
fn check_body(bytes: Bytes) -> UpstreamBody {
    UpstreamBody::Check((!bytes.is_empty()).then_some(bytes))
}

#[cfg(test)]
mod tests;
