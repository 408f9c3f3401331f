//! What a routed request tells its cluster's circuit breakers and outlier detection, for
//! both HTTP paths: admission while connections are short (a pending request), each attempt's
//! outcome, retries against `max_retries`, and timeouts.

use super::Routed;
use crate::http::body::RequestEnd;
use crate::http::errors::{ErrorKind, Flags, ProxyError};
use crate::http::ConnContext;
use crate::upstream::{Outcome, RetryGuard, Selected};

/// `e`, after reporting it to the attempt's cluster: a failure before any answer is a local
/// one to outlier detection (Envoy's connect failures and resets).
pub(super) fn reported(selected: &Selected, e: ProxyError) -> ProxyError {
    selected.in_flight.report(Outcome::LocalFailure);
    e
}

/// `e`, a connection that could not be opened, after reporting it to the attempt's cluster.
pub(super) fn connect_failed(selected: &Selected, e: ProxyError) -> ProxyError {
    selected.in_flight.connect_failed();
    selected.in_flight.report(Outcome::ConnectFailed);
    e
}

/// Wait while every connection the routed cluster may have is in use, as Envoy's pool holds a
/// pending request (`max_connections`, `max_pending_requests`); both paths admit here.
/// Whether the request waited (and so was counted a pending request already).
pub(in crate::http) async fn admit(ctx: &ConnContext, routed: &Routed) -> Result<bool, ProxyError> {
    let Some(target) = routed
        .cluster
        .as_ref()
        .filter(|t| t.state.connections_full())
    else {
        return Ok(false);
    };
    let Some(store) = &ctx.proxy.xds else {
        return Ok(false);
    };
    let snapshot = store.current();
    ctx.proxy
        .upstreams
        .wait_for_connection(&snapshot, &target.model.name)
        .await
        .map_err(|e| ProxyError::new(ErrorKind::Overflow, ctx.key.destination, e))?;
    Ok(true)
}

/// Count a timeout of the routed request (Envoy's `upstream_rq_timeout`), and report it to
/// outlier detection against the host its last attempt went to.
pub(in crate::http) fn timed_out(routed: &Routed) {
    timed_out_as(routed, Outcome::Timeout);
}

/// Count an attempt cut by the route's per-try timeout (Envoy's `upstream_rq_per_try_timeout`,
/// and the attempt in `upstream_rq_total`; not `upstream_rq_timeout`), and report it to
/// outlier detection against its host.
pub(in crate::http) fn per_try_timed_out(routed: &Routed) {
    timed_out_as(routed, Outcome::PerTryTimeout);
}

/// The request's answer is the router's 504 for its last attempt's per-try timeout (Envoy's
/// `upstream_rq_504`), charged to its cluster.
pub(in crate::http) fn charge_per_try_answer(routed: &Routed) {
    if let Some(target) = &routed.cluster {
        target.state.stats.response(504, routed.internal);
    }
}

fn timed_out_as(routed: &Routed, outcome: Outcome) {
    let host = routed
        .tried
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_slice()
        .last()
        .copied();
    if let Some(target) = &routed.cluster {
        crate::upstream::Upstreams::timed_out_as(&target.state, host, routed.internal, outcome);
    }
}

/// A retry of the routed request, counted and held against its cluster's `max_retries`;
/// `Err` when the breaker is open (the request ends with what it has, flagged `UO`).
pub(in crate::http) fn retry(routed: Option<&Routed>) -> Result<Option<RetryGuard>, ()> {
    match routed.and_then(|r| r.cluster.as_ref()) {
        None => Ok(None),
        Some(target) => match crate::upstream::Upstreams::retry(&target.state) {
            Some(guard) => Ok(Some(guard)),
            None => Err(()),
        },
    }
}

/// Report an attempt's outcome to its cluster, through the request's count against it.
pub(in crate::http) fn report(end: &RequestEnd, outcome: Outcome) {
    if let Some(f) = end.routed.as_ref().and_then(|r| r.in_flight.as_ref()) {
        f.report(outcome);
    }
}

/// The request's attempt was answered `status`: its own answer, or one `retried`, charged to
/// the cluster as Envoy's router charges each (the fast path's counterpart of
/// `Upstreamed::charge_answer`).
pub(in crate::http) fn answered(end: &RequestEnd, status: u16, retried: bool) {
    if let Some(f) = end.routed.as_ref().and_then(|r| r.in_flight.as_ref()) {
        f.answered(status, retried);
    }
}

/// A retry of a request (counted against its routed cluster's `max_retries`); `None` past
/// it: the request ends with its last answer or failure, flagged `UO` as Envoy's router
/// flags it.
pub(in crate::http) fn retry_counted(
    routed: Option<&Routed>,
    flags: &mut Flags,
) -> Option<RetryGuard> {
    match retry(routed) {
        Ok(Some(guard)) => Some(guard),
        Ok(None) => Some(RetryGuard::none()),
        Err(()) => {
            flags.insert(Flags::UO);
            None
        }
    }
}

/// Charge the routed cluster with the code of the router's own answer to an upstream failure,
/// as Envoy's router does (`chargeUpstreamAbort` after the last attempt's connect failure,
/// reset or overflow; `sendNoHealthyUpstreamResponse`): the request's final answer counts in
/// `upstream_rq_<code>`, `upstream_rq_<class>` and `upstream_rq_completed`, though no request
/// went out (`upstream_rq_total` unchanged). A timeout is charged its 504 where it is counted
/// ([`timed_out`]); a route to no cluster has none to charge.
pub(in crate::http) fn charge_local_answer(routed: &Routed, kind: ErrorKind) {
    let upstream_failure = matches!(
        kind,
        ErrorKind::ConnectFailed
            | ErrorKind::ConnectTimeout
            | ErrorKind::ConnectionTerminated
            | ErrorKind::RefusedStream
            | ErrorKind::RemoteReset
            | ErrorKind::UpstreamProtocol
            | ErrorKind::NoHealthyUpstream
            | ErrorKind::Overflow
    );
    if let (true, Some(target)) = (upstream_failure, &routed.cluster) {
        target
            .state
            .stats
            .response(kind.status().as_u16(), routed.internal);
    }
}
