//! Per-direction connection metrics: Remora's `remora_connections_*`, `remora_tcp_*` and
//! connection-closing counters, and where each connection is counted in Istio's TCP series.

use super::{istio, IstioTcp, Labels};
use crate::workload::Workload;
use crate::Direction;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// The per-direction connection metrics.
#[derive(Debug, Clone)]
pub struct DirectionMetrics {
    pub opened: Counter,
    pub closed: Counter,
    pub active: Gauge,
    pub connect_failures: Counter,
    /// Opaque TCP connections closed by `tcp.idle_timeout`.
    pub idle_timeouts: Counter,
    /// HTTP client connections closed by `http.idle_timeout` (Envoy's
    /// `downstream_cx_idle_timeout`).
    pub http_idle_timeouts: Counter,
    /// HTTP/2 client connections closed for Rapid Reset (`http::premature_reset`).
    pub premature_reset_closes: Counter,
    /// Connections closed when the drain time of the filter chain they started on, which an
    /// xDS update changed or removed, ran out (`chain_drain`).
    pub chain_drain_closes: Counter,
    /// Bytes from downstream to upstream.
    pub sent_bytes: Counter,
    /// Bytes from upstream to downstream.
    pub received_bytes: Counter,
    istio: Arc<istio::TcpSeries>,
}

impl DirectionMetrics {
    /// A connection was accepted. Istio's open waits for [`DirectionMetrics::istio_opened`],
    /// when the peer is known.
    pub fn connection_opened(&self) {
        self.opened.inc();
        self.active.inc();
    }

    /// Count the connection open in Istio's metrics, in the series of `peer` (the mesh peer,
    /// `None` when unknown); the connection is closed where this says.
    pub fn istio_opened(&self, peer: Option<&crate::tls::Peer>) -> IstioOpen {
        match peer {
            None => {
                self.istio.unknown().opened();
                IstioOpen::Unknown
            }
            Some(peer) => {
                let series = self.istio.of(Some(peer));
                series.opened();
                IstioOpen::Peer(series)
            }
        }
    }

    /// A connection finished, with Envoy's response flag (`-` for none) and the bytes moved
    /// from downstream to upstream (`sent`) and back (`received`). `istio` is where Istio's
    /// open was counted; if it was not yet, open and close both go to the unknown peer's
    /// series, as Istio's proxies report a connection that ends before its peer is known. A
    /// connection served as HTTP is in none of Istio's TCP series.
    pub fn connection_closed(&self, istio: &IstioOpen, flag: &str, sent: u64, received: u64) {
        self.closed.inc();
        self.active.dec();
        self.sent_bytes.inc_by(sent);
        self.received_bytes.inc_by(received);
        let series = match istio {
            IstioOpen::NotTcp => return,
            IstioOpen::Peer(series) => series,
            IstioOpen::Unknown => self.istio.unknown(),
            IstioOpen::Pending => {
                self.istio.unknown().opened();
                self.istio.unknown()
            }
        };
        series.closed(flag, sent, received);
    }
}

/// Where a connection was counted open in Istio's TCP metrics, so its close lands in the same
/// series.
#[derive(Debug, Clone, Default)]
pub enum IstioOpen {
    /// Not yet: the connection is ending before its peer was known.
    #[default]
    Pending,
    /// For an unknown peer (plaintext, or mesh TLS not terminated).
    Unknown,
    /// In a mesh peer's series.
    Peer(Arc<IstioTcp>),
    /// Never: the connection was served as HTTP. Istio puts its TCP stats filter only on the
    /// filter chains that end in `tcp_proxy`, so its proxies report HTTP connections in the
    /// request metrics alone.
    NotTcp,
}

/// The families behind [`DirectionMetrics`], registered once and resolved per direction.
pub(super) struct Families {
    opened: Family<Labels, Counter>,
    closed: Family<Labels, Counter>,
    active: Family<Labels, Gauge>,
    connect_failures: Family<Labels, Counter>,
    idle_timeouts: Family<Labels, Counter>,
    http_idle_timeouts: Family<Labels, Counter>,
    premature_reset_closes: Family<Labels, Counter>,
    chain_drain_closes: Family<Labels, Counter>,
    sent: Family<Labels, Counter>,
    received: Family<Labels, Counter>,
}

impl Families {
    /// Register the connection families in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let opened = Family::<Labels, Counter>::default();
        let closed = Family::<Labels, Counter>::default();
        let active = Family::<Labels, Gauge>::default();
        let connect_failures = Family::<Labels, Counter>::default();
        let idle_timeouts = Family::<Labels, Counter>::default();
        let http_idle_timeouts = Family::<Labels, Counter>::default();
        let premature_reset_closes = Family::<Labels, Counter>::default();
        let chain_drain_closes = Family::<Labels, Counter>::default();
        let sent = Family::<Labels, Counter>::default();
        let received = Family::<Labels, Counter>::default();
        registry.register(
            "remora_connections_opened",
            "Connections accepted on a capture listener",
            opened.clone(),
        );
        registry.register(
            "remora_connections_closed",
            "Connections finished, whatever the outcome",
            closed.clone(),
        );
        registry.register(
            "remora_connections_active",
            "Connections open now",
            active.clone(),
        );
        registry.register(
            "remora_upstream_connect_failures",
            "Upstream connections that failed or timed out",
            connect_failures.clone(),
        );
        registry.register(
            "remora_tcp_idle_timeouts",
            "Opaque TCP connections closed after tcp.idle_timeout without a byte either way",
            idle_timeouts.clone(),
        );
        registry.register(
            "remora_http_idle_timeouts",
            "HTTP client connections closed after http.idle_timeout with no request in flight",
            http_idle_timeouts.clone(),
        );
        registry.register(
            "remora_http2_premature_reset_closes",
            "HTTP/2 client connections closed because the client reset too many streams early (Rapid Reset)",
            premature_reset_closes.clone(),
        );
        registry.register(
            "remora_filter_chain_drain_closes",
            "Connections closed at the end of drain.drain_time because an xDS update changed or removed their filter chain (Envoy's filter_chain_is_being_removed)",
            chain_drain_closes.clone(),
        );
        registry.register(
            "remora_tcp_sent_bytes",
            "Bytes copied from downstream to upstream",
            sent.clone(),
        );
        registry.register(
            "remora_tcp_received_bytes",
            "Bytes copied from upstream to downstream",
            received.clone(),
        );
        Families {
            opened,
            closed,
            active,
            connect_failures,
            idle_timeouts,
            http_idle_timeouts,
            premature_reset_closes,
            chain_drain_closes,
            sent,
            received,
        }
    }

    /// The metrics of direction `d`, with its Istio TCP series (`own` on this side).
    pub(super) fn direction(
        &self,
        istio_tcp: &istio::TcpFamilies,
        own: &Workload,
        d: Direction,
    ) -> DirectionMetrics {
        let l = vec![("direction", d.as_str())];
        DirectionMetrics {
            opened: self.opened.get_or_create(&l).clone(),
            closed: self.closed.get_or_create(&l).clone(),
            active: self.active.get_or_create(&l).clone(),
            connect_failures: self.connect_failures.get_or_create(&l).clone(),
            idle_timeouts: self.idle_timeouts.get_or_create(&l).clone(),
            http_idle_timeouts: self.http_idle_timeouts.get_or_create(&l).clone(),
            premature_reset_closes: self.premature_reset_closes.get_or_create(&l).clone(),
            chain_drain_closes: self.chain_drain_closes.get_or_create(&l).clone(),
            sent_bytes: self.sent.get_or_create(&l).clone(),
            received_bytes: self.received.get_or_create(&l).clone(),
            istio: Arc::new(istio_tcp.resolve(own, d)),
        }
    }
}
