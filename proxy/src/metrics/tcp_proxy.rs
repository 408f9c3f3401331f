//! Envoy's `tcp_proxy` statistics under xDS (`tcp.<stat_prefix>.*`): kept per stat prefix of
//! the chains that end in `tcp_proxy` (istiod writes the cluster's name, or
//! `PassthroughCluster`, `BlackHoleCluster`, `InboundPassthroughCluster`), shared by every
//! chain with the same prefix, made at 0 with the listener that holds the chain, as Envoy
//! makes them when it loads the listener. A connection looks its counters up once, when a
//! chain takes it, and adds when it ends (Envoy adds bytes as they pass: a connection still
//! open has not added its bytes yet).

use super::envoy::Kind;
use super::per_prefix::PerPrefix;
use std::sync::atomic::{AtomicU64, Ordering};

/// One stat prefix's counters.
#[derive(Debug, Default)]
pub struct TcpProxyCounters {
    /// Connections a chain with this prefix took.
    total: AtomicU64,
    /// Of them, those whose cluster does not exist.
    no_route: AtomicU64,
    /// Bytes read from the client.
    rx_bytes: AtomicU64,
    /// Bytes written to the client.
    tx_bytes: AtomicU64,
    /// Connections closed by the chain's idle timeout.
    idle_timeout: AtomicU64,
}

/// How a connection a chain took ended, as its counters see it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Closed {
    /// Bytes read from the client and written to it.
    pub received: u64,
    pub sent: u64,
    pub idle_timeout: bool,
    /// The chain's cluster does not exist.
    pub no_route: bool,
}

impl TcpProxyCounters {
    /// A chain took a connection.
    pub fn opened(&self) {
        self.total.fetch_add(1, Ordering::Relaxed);
    }

    /// The connection ended.
    pub fn closed(&self, c: Closed) {
        let add = |counter: &AtomicU64, n: u64| {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        };
        add(&self.rx_bytes, c.received);
        add(&self.tx_bytes, c.sent);
        add(&self.idle_timeout, u64::from(c.idle_timeout));
        add(&self.no_route, u64::from(c.no_route));
    }

    /// Envoy 1.40's names, kinds and values, in its order. Remora has none of what the ones
    /// it exports at 0 count: no early data, no per-route delay or connection duration
    /// (refused by the converter), no buffering past its copy, no overload actions and no
    /// flush after the client goes (both directions end together).
    pub fn values(&self) -> [(&'static str, Kind, u64); 16] {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (c, g) = (Kind::Counter, Kind::Gauge);
        [
            ("downstream_cx_drain_close", c, 0),
            ("downstream_cx_no_route", c, v(&self.no_route)),
            ("downstream_cx_overload_close", c, 0),
            ("downstream_cx_rx_bytes_buffered", g, 0),
            ("downstream_cx_rx_bytes_total", c, v(&self.rx_bytes)),
            ("downstream_cx_total", c, v(&self.total)),
            ("downstream_cx_tx_bytes_buffered", g, 0),
            ("downstream_cx_tx_bytes_total", c, v(&self.tx_bytes)),
            ("downstream_flow_control_paused_reading_total", c, 0),
            ("downstream_flow_control_resumed_reading_total", c, 0),
            ("early_data_received_count_total", c, 0),
            ("idle_timeout", c, v(&self.idle_timeout)),
            ("max_downstream_connection_duration", c, 0),
            ("route_delayed_total", c, 0),
            ("upstream_flush_active", g, 0),
            ("upstream_flush_total", c, 0),
        ]
    }
}

/// Every `tcp_proxy` stat prefix's counters.
pub type TcpProxyStats = PerPrefix<TcpProxyCounters>;

/// Make the counters of every chain of `snapshot`'s listeners that ends in `tcp_proxy`. Run
/// at a scrape, off the data path.
pub fn make_configured(stats: &TcpProxyStats, snapshot: &remora_xds::snapshot::Snapshot) {
    use remora_xds::model::listener::ChainKind;
    for listener in snapshot.listeners() {
        for chain in listener.all_chains() {
            if let ChainKind::Tcp(tcp) = &chain.kind {
                stats.of(&tcp.stat_prefix);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(stats: &TcpProxyStats, prefix: &str, name: &str) -> u64 {
        let (_, _, v) = stats
            .of(prefix)
            .values()
            .into_iter()
            .find(|(n, _, _)| *n == name)
            .expect("a name Envoy has");
        v
    }

    #[test]
    fn counted_per_prefix_when_connections_open_and_close() {
        let stats = TcpProxyStats::default();
        let echo = stats.of("outbound|9000||echo.default.svc.cluster.local");
        echo.opened();
        echo.closed(Closed {
            received: 5,
            sent: 15,
            ..Closed::default()
        });
        echo.opened();
        echo.closed(Closed {
            idle_timeout: true,
            ..Closed::default()
        });
        let hole = stats.of("BlackHoleCluster");
        hole.opened();
        hole.closed(Closed {
            no_route: true,
            ..Closed::default()
        });
        let echo = "outbound|9000||echo.default.svc.cluster.local";
        assert_eq!(value(&stats, echo, "downstream_cx_total"), 2);
        assert_eq!(value(&stats, echo, "downstream_cx_rx_bytes_total"), 5);
        assert_eq!(value(&stats, echo, "downstream_cx_tx_bytes_total"), 15);
        assert_eq!(value(&stats, echo, "idle_timeout"), 1);
        assert_eq!(value(&stats, echo, "downstream_cx_no_route"), 0);
        assert_eq!(
            value(&stats, "BlackHoleCluster", "downstream_cx_no_route"),
            1
        );
        assert_eq!(value(&stats, "BlackHoleCluster", "downstream_cx_total"), 1);
    }
}
