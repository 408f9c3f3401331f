//! What a route decides of every request it forwards to one of its clusters: the cluster,
//! the deadlines, the retry policy, the fault, the mirrors. None of it depends on the
//! request, so a connection works it out once per route and cluster and store generation
//! (kept by its [`super::memo::Memo`]) and each request shares it, as Envoy's route entries
//! hold what they compiled from the route once, not per request.

use super::RoutedCluster;
use crate::http::retry_policy::RetryRules;
use remora_xds::model::fault::FaultPolicy;
use remora_xds::model::route::{
    Forward, MirrorPolicy, RetryPolicy, Route, RouteConfiguration, VirtualHost,
};
use std::sync::Arc;
use std::time::Duration;

/// A forwarding route's decision for one of its clusters, shared by its requests.
#[derive(Debug)]
pub struct RoutePlan {
    /// The cluster, as the snapshot of the route decision holds it, and its run-time state;
    /// `None`: the snapshot has no cluster of the route's name, so each attempt fails `NC`
    /// (after the route's fault and with its header edits, as Envoy's router answers after
    /// the filters before it).
    pub cluster: Option<Arc<RoutedCluster>>,
    /// The route's timeout (`None`: no deadline).
    pub timeout: Option<Duration>,
    /// `max_stream_duration.grpc_timeout_header_max` (or `max_grpc_timeout`): a gRPC
    /// request's `grpc-timeout` replaces the route's timeout, bounded by this (zero: not
    /// bounded); `None`: the header is not read.
    pub grpc_timeout_header_max: Option<Duration>,
    /// `max_stream_duration.max_stream_duration`: the longest the request may take.
    pub max_stream_duration: Option<Duration>,
    /// How many times a failed attempt may be tried again: the route's (or virtual host's)
    /// `num_retries`, none without a policy.
    pub retries: u32,
    /// Whether a 503 is retried (what the HTTP/1.1 fast path's retries ask; current istiod's
    /// default policy lists no status code).
    pub retry_503: bool,
    /// Which failures are retried, each attempt's deadline and the back-off: the policy's.
    pub retry: RetryRules,
    /// The fault the route injects (`None` for nearly every route).
    pub fault: Option<Arc<FaultPolicy>>,
    /// Whether the upstream is told the attempt (`x-envoy-attempt-count`): the virtual
    /// host's `include_request_attempt_count`.
    pub attempt_count: bool,
    /// The policy's `previous_hosts` predicate: how many times a retry's pick of an endpoint
    /// already tried is made again (`None`: no predicate, a retry may pick any).
    pub avoid_previous: Option<u32>,
    /// The route's mirror policies ([`crate::http::mirror`]), shared with the route; `None`
    /// for nearly every route.
    pub mirrors: Option<Arc<[MirrorPolicy]>>,
    /// The route's `name`, kept only when requests are logged (Envoy's `%ROUTE_NAME%`).
    pub route_name: Option<Arc<str>>,
    /// Whether the route edits no header at any level (the picked weighted cluster's, the
    /// route's, the virtual host's, the table's).
    pub edits_none: bool,
    /// Whether the route and its cluster ask nothing the HTTP/1.1 fast path does not do (see
    /// [`super::Decided::fits_fast_path`]): plain pooled HTTP/1.1 upstream connections, no
    /// fault, no mirror, no per-try timeout, Istio's default retries or none, and no header
    /// edits at any level.
    pub fast: bool,
}

/// Where a forwarding decision's plan comes from: the route, its virtual host, the retry
/// policy in force (the route's or the virtual host's) and the cluster picked.
pub(super) struct Source<'a> {
    pub table: &'a RouteConfiguration,
    pub route: &'a Route,
    pub forward: &'a Forward,
    pub vhost: &'a VirtualHost,
    pub retry: Option<&'a RetryPolicy>,
    pub cluster: &'a str,
    /// Whether the connection's chain has the fault filter (istiod's outbound chains do).
    pub fault_filter: bool,
    /// Whether the connection's requests are logged.
    pub logging: bool,
}

impl RoutePlan {
    /// The plan of `source` for `target` (the cluster resolved, `None` when unknown).
    pub(super) fn new(source: &Source<'_>, target: Option<Arc<RoutedCluster>>) -> RoutePlan {
        let Source {
            table,
            route,
            forward,
            vhost,
            retry,
            cluster,
            fault_filter,
            logging,
        } = *source;
        let edits_none = super::edits::edits_none(table, vhost, route, forward, cluster);
        let rules = RetryRules::of(retry);
        let retries = retry.map_or(0, |r| r.num_retries);
        let fault = route.fault_for(cluster).filter(|_| fault_filter).cloned();
        let mirrors = (!forward.mirrors.is_empty()).then(|| Arc::clone(&forward.mirrors));
        let fast = target.as_ref().is_none_or(|c| c.plain_http1_upstream)
            && fault.is_none()
            && mirrors.is_none()
            && rules.per_try_timeout().is_none()
            && (retries == 0 || rules.is_istio_default())
            && edits_none;
        RoutePlan {
            cluster: target,
            timeout: forward.timeout,
            grpc_timeout_header_max: forward.grpc_timeout_header_max,
            max_stream_duration: forward.max_stream_duration.filter(|d| !d.is_zero()),
            retries,
            retry_503: rules.retries_503(),
            retry: rules,
            fault,
            attempt_count: vhost.include_request_attempt_count,
            avoid_previous: retry
                .filter(|r| r.avoid_previous_hosts)
                .map(|r| r.host_selection_retry_max_attempts),
            mirrors,
            route_name: route
                .name
                .as_deref()
                .filter(|n| !n.is_empty() && logging)
                .map(Arc::from),
            edits_none,
            fast,
        }
    }

    /// One attempt to `cluster` with no route around it: no timeout, retries, fault or
    /// mirrors (a mirror's copy, an external authorizer's check).
    pub fn single_attempt(cluster: RoutedCluster) -> RoutePlan {
        RoutePlan {
            cluster: Some(Arc::new(cluster)),
            timeout: None,
            grpc_timeout_header_max: None,
            max_stream_duration: None,
            retries: 0,
            retry_503: false,
            retry: RetryRules::default(),
            fault: None,
            attempt_count: false,
            avoid_previous: None,
            mirrors: None,
            route_name: None,
            edits_none: true,
            fast: false,
        }
    }
}
