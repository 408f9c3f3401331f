//! One request (or TCP connection) counted against its cluster while it lasts: the circuit
//! breakers' slots it holds, its endpoint's in-flight count (what LEAST_REQUEST compares), and
//! a retry's slot against `max_retries`; each given back when dropped. The attempt's outcome
//! goes through it to the cluster's statistics and outlier detection.

use super::connection_end::ConnectionEnd;
use super::outlier::{self, HostState};
use super::state::ClusterState;
use super::{stats, Charge, Outcome, Traffic, UpstreamError};
use remora_xds::model::cluster::{Cluster, UpstreamHttpProtocol};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One request or connection counted against its cluster's circuit breakers and its endpoint;
/// dropping it ends the counts. It takes the attempt's outcome for outlier detection and the
/// cluster's statistics.
#[derive(Debug)]
pub struct InFlight {
    pub(super) state: Arc<ClusterState>,
    pub(super) host: Option<Arc<outlier::HostState>>,
    /// Holds one of the cluster's requests (`max_requests`).
    request: bool,
    /// Holds one of the cluster's connection slots (`max_connections`).
    pub(super) connection: bool,
    /// One of Remora's own requests (a shadow, a check), as Envoy sends its own with
    /// `x-envoy-internal: true`: its answers are counted under the cluster's `internal.*`.
    pub internal: bool,
}

impl InFlight {
    /// Take the cluster-wide slots `traffic` needs, or overflow.
    pub(super) fn admit(
        state: Arc<ClusterState>,
        c: &Cluster,
        traffic: Traffic,
    ) -> Result<InFlight, UpstreamError> {
        let mut f = InFlight {
            state,
            host: None,
            request: false,
            connection: false,
            internal: false,
        };
        let s = &f.state;
        if traffic == Traffic::Http {
            // Envoy counts a request over `max_requests` as a pending overflow.
            if s.rq_active.fetch_add(1, Ordering::AcqRel) >= s.limits.max_requests {
                s.rq_active.fetch_sub(1, Ordering::AcqRel);
                stats::inc(&s.stats.rq_pending_overflow);
                return Err(UpstreamError::Overflow(c.name.clone()));
            }
            f.request = true;
        }
        // An HTTP/1.1 attempt holds a connection for itself; an HTTP/2 cluster's requests share
        // connections, each of which holds a slot of its own (`multiplexed`). A TCP
        // connection is one.
        let holds_connection =
            traffic == Traffic::Tcp || c.http_protocol != UpstreamHttpProtocol::Http2;
        if holds_connection && s.limits.limits_connections() {
            if s.cx_active.fetch_add(1, Ordering::AcqRel) >= s.limits.max_connections {
                s.cx_active.fetch_sub(1, Ordering::AcqRel);
                stats::inc(&s.stats.cx_overflow);
                return Err(match traffic {
                    Traffic::Http => UpstreamError::ConnectionsFull(c.name.clone()),
                    Traffic::Tcp => UpstreamError::Overflow(c.name.clone()),
                });
            }
            f.connection = true;
        }
        Ok(f)
    }

    /// The chosen endpoint (its state `known` when the pick found it): counted in flight, and
    /// against its per-host connection limit.
    pub(super) fn on_host(
        &mut self,
        address: SocketAddr,
        known: Option<Arc<HostState>>,
    ) -> Result<(), UpstreamError> {
        let host = known.unwrap_or_else(|| self.state.host(address));
        if let (true, Some(max)) = (self.connection, self.state.limits.per_host_max_connections) {
            // Not waited for: the next pick may well be another host.
            if host.cx_active.fetch_add(1, Ordering::AcqRel) >= max {
                host.cx_active.fetch_sub(1, Ordering::AcqRel);
                stats::inc(&self.state.stats.cx_overflow);
                return Err(UpstreamError::Overflow(self.state.name()));
            }
        } else if self.connection {
            host.cx_active.fetch_add(1, Ordering::AcqRel);
        }
        host.rq_active.fetch_add(1, Ordering::AcqRel);
        self.host = Some(host);
        Ok(())
    }

    /// Report what the attempt came to: counted in the cluster's statistics, and by outlier
    /// detection, which may eject the host now.
    pub fn report(&self, outcome: Outcome) {
        self.state
            .report(self.host.as_deref(), outcome, self.charge());
    }

    /// The attempt's answer had `status`: the request's own, or `retried` (Envoy's `retry.*`).
    /// Reported apart from its [`Outcome::Status`], which comes before the router decides.
    pub fn answered(&self, status: u16, retried: bool) {
        self.state.answer(status, self.charge(), retried);
    }

    fn charge(&self) -> Charge {
        match (self.request, self.internal) {
            (false, _) => Charge::None,
            (true, false) => Charge::External,
            (true, true) => Charge::Internal,
        }
    }

    /// A connection to the endpoint is being opened (Envoy's `upstream_cx_total`: every new
    /// connection, HTTP or TCP, counted as it starts, whether or not it opens).
    pub fn connecting(&self) {
        stats::inc(&self.state.stats.cx_total);
    }

    /// The connection being opened is to carry HTTP of `version` (Envoy's
    /// `upstream_cx_http1_total`, `_http2_total`: counted as its pool makes the connection's
    /// client, before the connect completes).
    pub fn connecting_http(&self, version: crate::detect::HttpVersion) {
        let protocol = match version {
            crate::detect::HttpVersion::Http1 => 0,
            crate::detect::HttpVersion::Http2 => 1,
        };
        stats::inc(&self.state.stats.cx_http[protocol]);
    }

    /// The connection failed to open (TCP, or an HTTP attempt's dial).
    pub fn connect_failed(&self) {
        stats::inc(&self.state.stats.cx_connect_fail);
    }

    /// What a connection of the cluster opened for this attempt (or TCP connection) carries
    /// to count its end (`upstream_cx_destroy*`).
    pub fn connection_end(&self) -> ConnectionEnd {
        ConnectionEnd::new(Arc::clone(&self.state.stats))
    }

    /// A connection that never opened: Envoy's pools count its end too, by the peer
    /// (`remote`: refused, reset in the handshake) or by itself (a connect timeout).
    pub fn never_opened(&self, remote: bool) {
        self.state.stats.cx_destroyed(remote, false);
    }
}

/// One retry in flight against the cluster's `max_retries`.
#[derive(Debug)]
pub struct RetryGuard(pub(super) Option<Arc<ClusterState>>);

impl RetryGuard {
    /// A retry of nothing counted (a request not routed by xDS).
    pub fn none() -> Self {
        RetryGuard(None)
    }

    /// The retry got an answer that ends the request well (`upstream_rq_retry_success`).
    pub fn succeeded(&self) {
        if let Some(s) = &self.0 {
            stats::inc(&s.stats.rq_retry_success);
        }
    }
}

impl Drop for RetryGuard {
    fn drop(&mut self) {
        if let Some(s) = &self.0 {
            s.retries_active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let s = &self.state;
        if self.request {
            s.rq_active.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(h) = &self.host {
            h.rq_active.fetch_sub(1, Ordering::AcqRel);
            if self.connection {
                h.cx_active.fetch_sub(1, Ordering::AcqRel);
            }
        }
        if self.connection {
            s.cx_active.fetch_sub(1, Ordering::AcqRel);
            s.cx_released.notify_one();
        }
    }
}
