//! Load shedding's counters: connections refused at a connection limit, failed accepts (out of
//! descriptors or memory), and the limits in force.

use crate::Direction;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, &'static str)>;

/// The listeners whose accepts are counted, as the `listener` label names them.
pub const ACCEPTING_LISTENERS: [&str; 7] = [
    "outbound",
    "inbound",
    "explicit",
    "admin",
    "metrics",
    "readiness",
    "agent",
];

/// Counters of load shedding.
#[derive(Debug, Clone)]
pub struct OverloadMetrics {
    /// Connections refused at their listener's limit, by direction (Envoy's per-listener
    /// `downstream_cx_overflow`).
    listener_overflow: [Counter; 2],
    /// Connections refused at the global limit, by direction (Envoy's
    /// `downstream_global_cx_overflow`).
    global_overflow: [Counter; 2],
    /// Connections refused at the admin, metrics, readiness or agent port's own cap.
    pub side_port_overflow: Counter,
    /// Failed `accept(2)` calls, by [`ACCEPTING_LISTENERS`] index.
    accept_errors: Vec<Counter>,
    /// The limits in force (set at start, and again on reload).
    pub max_connections: Gauge,
    pub max_connections_per_listener: Gauge,
}

fn index(d: Direction) -> usize {
    match d {
        Direction::Outbound => 0,
        Direction::Inbound => 1,
    }
}

impl OverloadMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let overflow = Family::<Labels, Counter>::default();
        registry.register(
            "remora_connections_overflow",
            "Connections refused at a connection limit (overload.*), by direction and limit",
            overflow.clone(),
        );
        let of = |d: &'static str, limit: &'static str| {
            overflow
                .get_or_create(&vec![("direction", d), ("limit", limit)])
                .clone()
        };
        let accept = Family::<Labels, Counter>::default();
        registry.register(
            "remora_accept_errors",
            "Failed accepts (out of file descriptors or memory), by listener; each backs off",
            accept.clone(),
        );
        let m = OverloadMetrics {
            listener_overflow: [of("outbound", "listener"), of("inbound", "listener")],
            global_overflow: [of("outbound", "global"), of("inbound", "global")],
            side_port_overflow: Counter::default(),
            accept_errors: ACCEPTING_LISTENERS
                .iter()
                .map(|l| accept.get_or_create(&vec![("listener", *l)]).clone())
                .collect(),
            max_connections: Gauge::default(),
            max_connections_per_listener: Gauge::default(),
        };
        registry.register(
            "remora_side_port_connections_overflow",
            "Connections refused at the admin, metrics, readiness or agent port's own cap",
            m.side_port_overflow.clone(),
        );
        registry.register(
            "remora_max_connections",
            "Downstream connections open at once over all data-path listeners before new ones are refused",
            m.max_connections.clone(),
        );
        registry.register(
            "remora_max_connections_per_listener",
            "Downstream connections open at once on one data-path listener before new ones are refused",
            m.max_connections_per_listener.clone(),
        );
        m
    }

    /// A connection of `d` was refused at its listener's limit.
    pub fn listener_overflow(&self, d: Direction) -> &Counter {
        &self.listener_overflow[index(d)]
    }

    /// A connection of `d` was refused at the global limit.
    pub fn global_overflow(&self, d: Direction) -> &Counter {
        &self.global_overflow[index(d)]
    }

    /// Count a failed accept on `listener` (one of [`ACCEPTING_LISTENERS`]); returns the count.
    pub fn accept_error(&self, listener: &str) -> u64 {
        let i = ACCEPTING_LISTENERS
            .iter()
            .position(|l| *l == listener)
            .unwrap_or(0);
        self.accept_errors.get(i).map_or(0, |c| c.inc() + 1)
    }
}
