//! The connections of a cluster whose requests share them (an HTTP/2 upstream): as Envoy
//! counts them for such a cluster, each connection, not each request, holds one of the
//! cluster's connection slots (`max_connections`, and its host's `per_host_thresholds`) from
//! its dial until it closes. A request that finds every connection to its endpoint at the
//! peer's stream limit and no slot to open another waits as one of the cluster's pending
//! requests (`max_pending_requests`) until a stream or a slot is given back.

use super::outlier::HostState;
use super::state::ClusterState;
use super::{stats, InFlight, UpstreamError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Something woken when a stream of a shared connection is given back, for the requests
/// waiting for one.
pub trait StreamWaiters: std::fmt::Debug + Send + Sync {
    /// A stream was given back, or the peer allowed more.
    fn released(&self);
    /// The connection carried its `max_requests_per_connection` and takes no more
    /// (Envoy's `upstream_cx_max_requests`).
    fn retired_at_limit(&self) {}
}

/// One of the cluster's connection slots, held by an open shared connection; given back
/// (waking the pending requests) when dropped with it.
#[derive(Debug)]
pub struct ConnectionSlot {
    state: Arc<ClusterState>,
    host: Option<Arc<HostState>>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        if let Some(h) = &self.host {
            h.cx_active.fetch_sub(1, Ordering::AcqRel);
        }
        self.state.cx_active.fetch_sub(1, Ordering::AcqRel);
        self.state.cx_released.notify_waiters();
    }
}

/// The cluster's pending requests, as a shared connection's streams wake them.
#[derive(Debug)]
struct ClusterWaiters(Arc<ClusterState>);

impl StreamWaiters for ClusterWaiters {
    fn released(&self) {
        self.0.cx_released.notify_waiters();
    }

    fn retired_at_limit(&self) {
        stats::inc(&self.0.stats.cx_max_requests);
    }
}

impl InFlight {
    /// Whether this attempt holds a connection slot itself (an HTTP/1.1 attempt, a TCP
    /// connection); an HTTP/2 cluster's requests hold none, their connections do.
    pub fn holds_connection(&self) -> bool {
        self.connection
    }

    /// A connection slot for a new shared connection to the attempt's host, if the cluster
    /// and the host have one free.
    pub fn connection_slot(&self) -> Option<ConnectionSlot> {
        let s = &self.state;
        if s.cx_active.fetch_add(1, Ordering::AcqRel) >= s.limits.max_connections {
            s.cx_active.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let mut slot = ConnectionSlot {
            state: Arc::clone(s),
            host: None,
        };
        if let Some(host) = &self.host {
            let max = s.limits.per_host_max_connections.unwrap_or(u32::MAX);
            if host.cx_active.fetch_add(1, Ordering::AcqRel) >= max {
                host.cx_active.fetch_sub(1, Ordering::AcqRel);
                // Dropping the slot gives the cluster's back.
                return None;
            }
            slot.host = Some(Arc::clone(host));
        }
        Some(slot)
    }

    /// What a new shared connection wakes when its streams are given back.
    pub fn stream_waiters(&self) -> Arc<dyn StreamWaiters> {
        Arc::new(ClusterWaiters(Arc::clone(&self.state)))
    }

    /// A request opening a connection waits for it as one of its pool's pending requests
    /// (Envoy's `upstream_rq_pending_total` counts it).
    pub fn pending_for_connect(&self) {
        stats::inc(&self.state.stats.rq_pending_total);
    }

    /// Wait, as one of the cluster's pending requests, until `ready` finds a stream or a
    /// connection slot (Envoy's pool holds a request it has no ready connection for, while
    /// one is being opened or none may be). Past `max_pending_requests` waiting, the request overflows. The
    /// wait is bounded by the request's own (its timeout, or the client going away).
    /// `refused`: a connection slot was refused to it (counted, once it is pending, as the
    /// connection Envoy's pool could not open for it: `upstream_cx_overflow`).
    pub async fn wait_pending<T>(
        &self,
        mut ready: impl FnMut() -> Option<T>,
        refused: &AtomicBool,
    ) -> Result<T, UpstreamError> {
        let s = &self.state;
        if s.rq_pending.fetch_add(1, Ordering::AcqRel) >= s.limits.max_pending_requests {
            s.rq_pending.fetch_sub(1, Ordering::AcqRel);
            stats::inc(&s.stats.rq_pending_overflow);
            return Err(UpstreamError::Overflow(s.name()));
        }
        stats::inc(&s.stats.rq_pending_total);
        if refused.load(Ordering::Relaxed) {
            stats::inc(&s.stats.cx_overflow);
        }
        let _pending = super::Decrement(&s.rq_pending);
        loop {
            // Made before the look, so that a release between the two is not missed.
            let released = s.cx_released.notified();
            if let Some(found) = ready() {
                return Ok(found);
            }
            released.await;
        }
    }
}
