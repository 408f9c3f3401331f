//! The network `ext_authz` filter (AuthorizationPolicy CUSTOM on a TCP port; istiod writes it
//! only for gRPC providers): one `Check` per connection, carrying its source and destination
//! (and the peer's SPIFFE ID), before the connection goes upstream. OK lets it through; a
//! denial closes it; a failed check closes it unless `failure_mode_allow`. Counted as Envoy
//! counts it, per stat prefix ([`NetworkStats`]), and in the HTTP filter's counters as well.

use super::{grpc, Verdict};
use crate::http::{pool, ConnContext};
use crate::proxy::Proxy;
use crate::Direction;
use envoy_types::pb::envoy::service::auth::v3::{AttributeContext, CheckRequest};
use remora_config::Config;
use remora_xds::model::ext_authz::{ExtAuthz, Service};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

/// The connection as the check describes it.
pub struct Connection<'a> {
    pub peer: SocketAddr,
    pub destination: SocketAddr,
    /// The peer's SPIFFE ID, when mesh TLS proved one.
    pub principal: Option<&'a str>,
    pub connect_timeout: std::time::Duration,
}

/// Why the filter closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The authorizer denied it.
    Denied,
    /// The check failed and `failure_mode_allow` is unset.
    Failed,
}

impl Refused {
    /// Envoy's response code details for it (`%RESPONSE_CODE_DETAILS%` of the connection's
    /// access-log line).
    pub fn details(self) -> &'static str {
        match self {
            Refused::Denied => "ext_authz_denied",
            Refused::Failed => "ext_authz_error",
        }
    }
}

/// One stat prefix's counters: Envoy's `ext_authz.<stat_prefix>.*` of the network filter.
#[derive(Debug, Default)]
pub struct Counters {
    /// Checks sent.
    pub total: AtomicU64,
    pub ok: AtomicU64,
    pub denied: AtomicU64,
    /// Checks that failed (unreachable, timed out, a gRPC error).
    pub error: AtomicU64,
    /// Failed checks let through.
    pub failure_mode_allowed: AtomicU64,
    /// Connections the filter did not check (`filter_enabled_metadata` did not match).
    pub disabled: AtomicU64,
    /// Connections it closed.
    pub cx_closed: AtomicU64,
    /// Checks in flight (a gauge).
    pub active: AtomicI64,
}

impl Counters {
    fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Envoy's names and values, in the order Envoy's `/stats` prints them.
    pub fn values(&self) -> [(&'static str, u64); 7] {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("cx_closed", v(&self.cx_closed)),
            ("denied", v(&self.denied)),
            ("disabled", v(&self.disabled)),
            ("error", v(&self.error)),
            ("failure_mode_allowed", v(&self.failure_mode_allowed)),
            ("ok", v(&self.ok)),
            ("total", v(&self.total)),
        ]
    }

    /// The `active` gauge (checks in flight).
    pub fn active(&self) -> u64 {
        u64::try_from(self.active.load(Ordering::Relaxed)).unwrap_or(0)
    }
}

/// The counters of every network ext_authz filter that has seen a connection, by stat prefix
/// (filters with the same prefix share them, as in Envoy).
pub type NetworkStats = crate::metrics::per_prefix::PerPrefix<Counters>;

/// A check in flight, counted in the `active` gauge until dropped (also when the client goes
/// away during the check and the connection's future with it).
struct InFlight<'a>(&'a AtomicI64);

impl<'a> InFlight<'a> {
    fn start(gauge: &'a AtomicI64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        InFlight(gauge)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counted when the filter's shadow RBAC filters did not select the connection.
pub fn disabled(proxy: &Proxy, ext: &ExtAuthz) {
    Counters::inc(
        &proxy
            .metrics
            .network_ext_authz
            .of(&ext.stat_prefix)
            .disabled,
    );
}

/// Whether the authorizer lets the connection through (counted as Envoy counts it, and as the
/// HTTP filter's checks); why not otherwise.
pub async fn check(
    proxy: &Arc<Proxy>,
    config: &Arc<Config>,
    ext: &ExtAuthz,
    conn: &Connection<'_>,
) -> Result<(), Refused> {
    let Service::Grpc { cluster, authority } = &ext.service else {
        // The converter builds network filters with a gRPC service only.
        return Err(Refused::Failed);
    };
    let counters = proxy.metrics.network_ext_authz.of(&ext.stat_prefix);
    Counters::inc(&counters.total);
    let in_flight = InFlight::start(&counters.active);
    // The check is this proxy's own request: a context of its own, outbound, over HTTP/2.
    let key = pool::Key {
        destination: conn.destination,
        source: None,
        version: crate::detect::HttpVersion::Http2,
        tls: 0,
    };
    let ctx = ConnContext::new(
        Arc::clone(proxy),
        Arc::clone(config),
        Direction::Outbound,
        conn.peer,
        key,
        conn.connect_timeout,
    );
    let message = CheckRequest {
        attributes: Some(AttributeContext {
            source: Some(grpc::peer(conn.peer, conn.principal)),
            destination: Some(grpc::peer(conn.destination, None)),
            ..Default::default()
        }),
    };
    let verdict = grpc::send(&ctx, &message, (cluster, authority), ext.timeout).await;
    drop(in_flight);
    let stats = &proxy.metrics.ext_authz;
    let outcome = match verdict {
        Verdict::Ok(_) => {
            stats.ok.inc();
            Counters::inc(&counters.ok);
            Ok(())
        }
        Verdict::Denied(_) => {
            stats.denied.inc();
            Counters::inc(&counters.denied);
            tracing::debug!(peer = %conn.peer, "connection denied by the external authorizer");
            Err(Refused::Denied)
        }
        Verdict::Error(why) => {
            stats.error.inc();
            Counters::inc(&counters.error);
            tracing::debug!(peer = %conn.peer, error = %why, allow = ext.failure_mode_allow, "external authorizer failed");
            if ext.failure_mode_allow {
                stats.failure_mode_allowed.inc();
                Counters::inc(&counters.failure_mode_allowed);
                Ok(())
            } else {
                Err(Refused::Failed)
            }
        }
    };
    if outcome.is_err() {
        Counters::inc(&counters.cx_closed);
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_per_stat_prefix_and_shared_within_one() {
        let stats = NetworkStats::default();
        Counters::inc(&stats.of("tcp.").ok);
        Counters::inc(&stats.of("tcp.").ok);
        Counters::inc(&stats.of("other").denied);
        let value = |c: &Counters, name: &str| {
            c.values()
                .iter()
                .find_map(|(n, v)| (*n == name).then_some(*v))
        };
        let snapshot: Vec<(String, Option<u64>, Option<u64>)> = stats
            .each()
            .iter()
            .map(|(p, c)| (p.to_string(), value(c, "ok"), value(c, "denied")))
            .collect();
        assert_eq!(
            snapshot,
            [
                ("other".to_string(), Some(0), Some(1)),
                ("tcp.".to_string(), Some(2), Some(0))
            ]
        );
    }
}
