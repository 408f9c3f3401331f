//! Connection limits, checked at accept: one over every data-path listener and one per
//! listener (Envoy's overload manager's `global_downstream_max_connections` and its listener
//! connection limit). A connection past either is accepted and reset at once, as Envoy closes
//! it at once: the client learns straight away (a reset, not a connect that hangs in the
//! backlog), the socket costs no `TIME_WAIT`, and the accept loop keeps draining the backlog
//! so that a connection is taken the moment one closes. Connections already open are not
//! touched.

use crate::metrics::OverloadMetrics;
use crate::Direction;
use arc_swap::ArcSwap;
use remora_config::Config;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// Connections open at once on each admin, metrics, readiness or agent port. These ports stay
/// outside the data-path limits (as Envoy's admin and Istio's health listeners ignore the
/// global one), so that probes and scrapes are still answered when the data path is full; a
/// few are in use at a time (kubelet, Prometheus, istioctl), and this cap keeps a flood on
/// them from taking the descriptors the data path needs.
pub const SIDE_PORT_MAX_CONNECTIONS: usize = 64;

/// Counts of open connections: one shared by every data-path listener, and the listener's own.
#[derive(Debug, Clone)]
pub struct Admission {
    config: Arc<ArcSwap<Config>>,
    /// The open-file limit the defaults are computed from.
    nofile: u64,
    global: Arc<AtomicU32>,
    listener: Arc<AtomicU32>,
    direction: Direction,
    metrics: OverloadMetrics,
}

/// Which limit refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Listener,
    Global,
}

/// One admitted connection: its places in the counts, given back when dropped.
#[derive(Debug)]
pub struct Admitted {
    global: Arc<AtomicU32>,
    listener: Arc<AtomicU32>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.listener.fetch_sub(1, Ordering::AcqRel);
        self.global.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The count every data-path listener shares; one per process.
#[derive(Debug, Clone)]
pub struct GlobalCount {
    config: Arc<ArcSwap<Config>>,
    nofile: u64,
    open: Arc<AtomicU32>,
    metrics: OverloadMetrics,
}

impl GlobalCount {
    /// The global count, with limits from the current `config` (read at each accept, so a
    /// reload changes them) and defaults from the open-file limit now.
    pub fn new(config: Arc<ArcSwap<Config>>, metrics: OverloadMetrics) -> Self {
        let nofile = rlimit::getrlimit(rlimit::Resource::NOFILE)
            .map(|(soft, _)| soft)
            .unwrap_or(1024);
        let count = GlobalCount {
            config,
            nofile,
            open: Arc::default(),
            metrics,
        };
        let (global, per_listener) = count.config.load().overload.limits(nofile);
        tracing::info!(
            nofile,
            max_connections = global,
            max_connections_per_listener = per_listener,
            "connection limits"
        );
        count.metrics.max_connections.set(i64::from(global));
        count
            .metrics
            .max_connections_per_listener
            .set(i64::from(per_listener));
        count
    }

    /// A new listener's own count, sharing this global one. The addresses of one port (IPv4
    /// and IPv6) share one listener count.
    pub fn listener(&self, direction: Direction) -> Admission {
        Admission {
            config: Arc::clone(&self.config),
            nofile: self.nofile,
            global: Arc::clone(&self.open),
            listener: Arc::default(),
            direction,
            metrics: self.metrics.clone(),
        }
    }
}

impl Admission {
    /// Take a place for one more connection, or say which limit is reached (and count it).
    pub fn admit(&self) -> Result<Admitted, Refused> {
        let (global, per_listener) = self.config.load().overload.limits(self.nofile);
        self.publish(global, per_listener);
        if self.listener.fetch_add(1, Ordering::AcqRel) >= per_listener {
            self.listener.fetch_sub(1, Ordering::AcqRel);
            self.metrics.listener_overflow(self.direction).inc();
            return Err(Refused::Listener);
        }
        if self.global.fetch_add(1, Ordering::AcqRel) >= global {
            self.global.fetch_sub(1, Ordering::AcqRel);
            self.listener.fetch_sub(1, Ordering::AcqRel);
            self.metrics.global_overflow(self.direction).inc();
            return Err(Refused::Global);
        }
        Ok(Admitted {
            global: Arc::clone(&self.global),
            listener: Arc::clone(&self.listener),
        })
    }

    /// Keep the limit gauges true (written only when a reload changed a limit).
    fn publish(&self, global: u32, per_listener: u32) {
        for (gauge, v) in [
            (&self.metrics.max_connections, global),
            (&self.metrics.max_connections_per_listener, per_listener),
        ] {
            if gauge.get() != i64::from(v) {
                gauge.set(i64::from(v));
            }
        }
    }
}

/// Refuse an accepted connection: reset it (`SO_LINGER` 0), so the client sees the refusal at
/// once and no `TIME_WAIT` is left here.
pub fn reset(stream: TcpStream) {
    if let Err(e) = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO)) {
        tracing::debug!(error = %e, "cannot set SO_LINGER on a refused connection");
    }
    drop(stream);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    fn limited(global: u32, per_listener: u32) -> (GlobalCount, Arc<ArcSwap<Config>>) {
        let mut c = Config::default();
        c.overload.max_connections = NonZeroU32::new(global);
        c.overload.max_connections_per_listener = NonZeroU32::new(per_listener);
        let config = Arc::new(ArcSwap::from_pointee(c));
        let metrics = crate::metrics::Metrics::default().overload.clone();
        (GlobalCount::new(Arc::clone(&config), metrics), config)
    }

    #[test]
    fn each_limit_refuses_past_it_and_a_closed_connection_frees_its_place() {
        let (global, _) = limited(3, 2);
        let inbound = global.listener(Direction::Inbound);
        let outbound = global.listener(Direction::Outbound);
        let a = inbound.admit().unwrap();
        let _b = inbound.admit().unwrap();
        assert_eq!(inbound.admit().unwrap_err(), Refused::Listener);
        let _c = outbound.admit().unwrap();
        assert_eq!(outbound.admit().unwrap_err(), Refused::Global);
        let m = &global.metrics;
        assert_eq!(m.listener_overflow(Direction::Inbound).get(), 1);
        assert_eq!(m.global_overflow(Direction::Outbound).get(), 1);
        assert_eq!(m.max_connections.get(), 3);
        drop(a);
        let _d = outbound.admit().unwrap();
        assert_eq!(inbound.admit().unwrap_err(), Refused::Global);
    }

    #[test]
    fn a_reload_changes_the_limits_for_the_next_accept() {
        let (global, config) = limited(1, 1);
        let l = global.listener(Direction::Outbound);
        let _a = l.admit().unwrap();
        assert!(l.admit().is_err());
        let mut c = Config::clone(&config.load());
        c.overload.max_connections = NonZeroU32::new(2);
        c.overload.max_connections_per_listener = NonZeroU32::new(2);
        config.store(Arc::new(c));
        let _b = l.admit().unwrap();
        assert_eq!(global.metrics.max_connections_per_listener.get(), 2);
    }
}
