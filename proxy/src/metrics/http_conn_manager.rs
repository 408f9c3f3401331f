//! Envoy's HTTP connection manager statistics under xDS (`http.<stat_prefix>.downstream_*`,
//! its router's under the same prefix, `rq_total`, `no_route`…, and the per-listener copies of
//! the answers, `listener.<address>.http.<stat_prefix>.*`):
//! kept per stat prefix, shared by every chain with it, made at 0 with the listener that holds
//! the chain, as Envoy makes them when it loads the listener. A connection looks its counters
//! up once, when the chain takes it; a request adds one count as it starts, one if it reaches
//! the router, and two as it ends.
//! Totals, `_completed` and the gauges are sums and differences made at a scrape, so that the
//! data path counts each fact once.

use super::envoy::Kind;
use super::per_prefix::PerPrefix;
use crate::detect::HttpVersion;
use std::sync::atomic::{AtomicU64, Ordering};

/// One stat prefix's counters.
#[derive(Debug, Default)]
pub struct HcmCounters {
    /// Connections opened, and closed, by protocol (HTTP/1.1, HTTP/2).
    cx_opened: [AtomicU64; 2],
    cx_closed: [AtomicU64; 2],
    /// Of them, over mesh TLS.
    cx_tls_opened: AtomicU64,
    cx_tls_closed: AtomicU64,
    /// Bytes read from clients and written to them, added as each connection ends.
    rx_bytes: AtomicU64,
    tx_bytes: AtomicU64,
    /// Requests started, by protocol.
    rq_started: [AtomicU64; 2],
    /// Requests ended (answered or not).
    rq_ended: AtomicU64,
    /// Requests answered, by the class of the status sent (1xx to 5xx).
    rq_class: [AtomicU64; 5],
    /// Connections closed for having nothing to do for the idle timeout.
    idle_timeout: AtomicU64,
    /// HTTP/2 connections closed for too many streams the client reset early (Rapid Reset).
    premature_resets: AtomicU64,
    /// Upgrade requests refused because their route turns the upgrade off.
    ws_on_non_ws_route: AtomicU64,
    /// Requests whose target is not a path (`OPTIONS *`), answered 404.
    non_relative_path: AtomicU64,
    /// Requests that reached the router (after the fault, RBAC, ext_authz and cors filters
    /// let them on), by what it made of them: [`Routed`] in order.
    routed: [AtomicU64; 4],
}

/// What Envoy's router made of a request that reached it, as its `http.<prefix>.*`
/// statistics count it (`rq_total` is their sum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routed {
    /// Sent on to its route's cluster.
    Forwarded,
    /// Its route's cluster is not known: answered 503 `NC` (`no_cluster`).
    NoCluster,
    /// No route took it: answered 404 `NR` (`no_route`).
    NoRoute,
    /// Answered by its route's direct response or redirect (`rq_direct_response`).
    DirectResponse,
}

/// Why the connection manager closed a connection itself, as Envoy counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClosedFor {
    IdleTimeout,
    PrematureResets,
}

fn protocol(version: HttpVersion) -> usize {
    match version {
        HttpVersion::Http1 => 0,
        HttpVersion::Http2 => 1,
    }
}

impl HcmCounters {
    /// The chain took a connection speaking `version` (over mesh TLS: `tls`).
    pub fn connection_opened(&self, version: HttpVersion, tls: bool) {
        self.cx_opened[protocol(version)].fetch_add(1, Ordering::Relaxed);
        if tls {
            self.cx_tls_opened.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The connection ended, having read `received` bytes from the client and written `sent`.
    pub fn connection_closed(&self, version: HttpVersion, tls: bool, received: u64, sent: u64) {
        self.cx_closed[protocol(version)].fetch_add(1, Ordering::Relaxed);
        if tls {
            self.cx_tls_closed.fetch_add(1, Ordering::Relaxed);
        }
        self.rx_bytes.fetch_add(received, Ordering::Relaxed);
        self.tx_bytes.fetch_add(sent, Ordering::Relaxed);
    }

    /// The connection manager closed a connection, for `why`.
    pub fn closed_for(&self, why: ClosedFor) {
        let counter = match why {
            ClosedFor::IdleTimeout => &self.idle_timeout,
            ClosedFor::PrematureResets => &self.premature_resets,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A request reached the router, which made `what` of it.
    pub fn routed(&self, what: Routed) {
        self.routed[what as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// An upgrade request was refused: its route turns the upgrade off.
    pub fn upgrade_refused(&self) {
        self.ws_on_non_ws_route.fetch_add(1, Ordering::Relaxed);
    }

    /// A request whose target is not a path was answered 404.
    pub fn non_relative_path(&self) {
        self.non_relative_path.fetch_add(1, Ordering::Relaxed);
    }

    /// A request started on a connection speaking `version`.
    pub fn request_started(&self, version: HttpVersion) {
        self.rq_started[protocol(version)].fetch_add(1, Ordering::Relaxed);
    }

    /// A request ended, answered with `status` (0: no answer was sent). Envoy counts the
    /// answer's class as its headers go to the client: a request answered and then cut counts
    /// as answered.
    pub fn request_ended(&self, status: u16) {
        self.rq_ended.fetch_add(1, Ordering::Relaxed);
        if let Some(class) = (status / 100).checked_sub(1).map(usize::from) {
            if let Some(c) = self.rq_class.get(class) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The answers by class and their sum, as Envoy names them on the connection manager and
    /// on its listener.
    pub fn answers(&self) -> [(&'static str, u64); 6] {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let class: [u64; 5] = std::array::from_fn(|i| v(&self.rq_class[i]));
        [
            ("downstream_rq_1xx", class[0]),
            ("downstream_rq_2xx", class[1]),
            ("downstream_rq_3xx", class[2]),
            ("downstream_rq_4xx", class[3]),
            ("downstream_rq_5xx", class[4]),
            ("downstream_rq_completed", class.iter().sum()),
        ]
    }

    /// Envoy 1.40's names, kinds and values of what Remora keeps (Envoy has more: see
    /// docs/xds.md).
    pub fn values(&self) -> Vec<(&'static str, Kind, u64)> {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (c, g) = (Kind::Counter, Kind::Gauge);
        let [h1, h2] = [0, 1].map(|i| v(&self.cx_opened[i]));
        let [h1_closed, h2_closed] = [0, 1].map(|i| v(&self.cx_closed[i]));
        let [rq_h1, rq_h2] = [0, 1].map(|i| v(&self.rq_started[i]));
        // Read the ends after the starts: a request counted between the two reads shows as
        // ended without having started, hence the saturation.
        let rq_ended = v(&self.rq_ended);
        let (tls, tls_closed) = (v(&self.cx_tls_opened), v(&self.cx_tls_closed));
        let active = |opened: u64, closed: u64| opened.saturating_sub(closed);
        let mut values = vec![
            (
                "downstream_cx_active",
                g,
                active(h1 + h2, h1_closed + h2_closed),
            ),
            ("downstream_cx_destroy", c, h1_closed + h2_closed),
            ("downstream_cx_http1_active", g, active(h1, h1_closed)),
            ("downstream_cx_http1_total", c, h1),
            ("downstream_cx_http2_active", g, active(h2, h2_closed)),
            ("downstream_cx_http2_total", c, h2),
            ("downstream_cx_idle_timeout", c, v(&self.idle_timeout)),
            ("downstream_cx_rx_bytes_total", c, v(&self.rx_bytes)),
            ("downstream_cx_ssl_active", g, active(tls, tls_closed)),
            ("downstream_cx_ssl_total", c, tls),
            ("downstream_cx_total", c, h1 + h2),
            ("downstream_cx_tx_bytes_total", c, v(&self.tx_bytes)),
            ("downstream_rq_active", g, active(rq_h1 + rq_h2, rq_ended)),
            ("downstream_rq_http1_total", c, rq_h1),
            ("downstream_rq_http2_total", c, rq_h2),
            (
                "downstream_rq_too_many_premature_resets",
                c,
                v(&self.premature_resets),
            ),
            ("downstream_rq_total", c, rq_h1 + rq_h2),
            (
                "downstream_rq_ws_on_non_ws_route",
                c,
                v(&self.ws_on_non_ws_route),
            ),
            (
                "downstream_rq_non_relative_path",
                c,
                v(&self.non_relative_path),
            ),
        ];
        let routed: [u64; 4] = std::array::from_fn(|i| v(&self.routed[i]));
        values.extend([
            ("no_cluster", c, routed[Routed::NoCluster as usize]),
            ("no_route", c, routed[Routed::NoRoute as usize]),
            (
                "rq_direct_response",
                c,
                routed[Routed::DirectResponse as usize],
            ),
            ("rq_total", c, routed.iter().sum()),
        ]);
        values.extend(self.answers().map(|(name, value)| (name, c, value)));
        values
    }
}

/// Every connection manager's counters, by stat prefix.
pub type HcmStats = PerPrefix<HcmCounters>;

/// Make the counters of every HTTP chain of `snapshot`'s listeners; returns each listener's
/// stat name (`0.0.0.0_80`) with the prefixes of its HTTP chains. Run at a scrape, off the
/// data path.
pub fn make_configured(
    stats: &HcmStats,
    snapshot: &remora_xds::snapshot::Snapshot,
) -> Vec<(String, Vec<std::sync::Arc<str>>)> {
    use remora_xds::model::listener::ChainKind;
    snapshot
        .listeners()
        .map(|listener| {
            let mut prefixes: Vec<std::sync::Arc<str>> = Vec::new();
            for chain in listener.all_chains() {
                if let ChainKind::Http(http) = &chain.kind {
                    stats.of(&http.stat_prefix);
                    if !prefixes.contains(&http.stat_prefix) {
                        prefixes.push(std::sync::Arc::clone(&http.stat_prefix));
                    }
                }
            }
            (super::listeners::stat_name(listener.address), prefixes)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(c: &HcmCounters, name: &str) -> u64 {
        let (_, _, v) = c
            .values()
            .into_iter()
            .find(|(n, _, _)| *n == name)
            .expect("a name Envoy has");
        v
    }

    #[test]
    fn connections_and_requests_are_counted_as_envoy_names_them() {
        let stats = HcmStats::default();
        let c = stats.of("outbound_0.0.0.0_80");
        c.connection_opened(HttpVersion::Http1, false);
        c.request_started(HttpVersion::Http1);
        c.request_ended(200);
        c.request_started(HttpVersion::Http1);
        c.request_ended(404);
        c.connection_closed(HttpVersion::Http1, false, 100, 300);
        c.connection_opened(HttpVersion::Http2, true);
        c.request_started(HttpVersion::Http2);
        c.request_ended(503);
        // A client gone before any answer: ended, no class.
        c.request_started(HttpVersion::Http2);
        c.request_ended(0);
        c.request_started(HttpVersion::Http2);
        c.closed_for(ClosedFor::IdleTimeout);
        c.closed_for(ClosedFor::PrematureResets);
        for what in [Routed::Forwarded, Routed::Forwarded, Routed::NoRoute] {
            c.routed(what);
        }
        c.routed(Routed::DirectResponse);
        c.upgrade_refused();
        c.non_relative_path();
        for (name, expected) in [
            ("downstream_rq_non_relative_path", 1),
            ("rq_total", 4),
            ("no_route", 1),
            ("no_cluster", 0),
            ("rq_direct_response", 1),
            ("downstream_rq_ws_on_non_ws_route", 1),
            ("downstream_cx_idle_timeout", 1),
            ("downstream_rq_too_many_premature_resets", 1),
            ("downstream_cx_total", 2),
            ("downstream_cx_active", 1),
            ("downstream_cx_destroy", 1),
            ("downstream_cx_http1_total", 1),
            ("downstream_cx_http1_active", 0),
            ("downstream_cx_http2_active", 1),
            ("downstream_cx_ssl_total", 1),
            ("downstream_cx_ssl_active", 1),
            ("downstream_cx_rx_bytes_total", 100),
            ("downstream_cx_tx_bytes_total", 300),
            ("downstream_rq_total", 5),
            ("downstream_rq_http1_total", 2),
            ("downstream_rq_http2_total", 3),
            ("downstream_rq_active", 1),
            ("downstream_rq_2xx", 1),
            ("downstream_rq_4xx", 1),
            ("downstream_rq_5xx", 1),
            ("downstream_rq_completed", 3),
        ] {
            assert_eq!(value(&c, name), expected, "{name}");
        }
    }
}
