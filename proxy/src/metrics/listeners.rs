//! Envoy's per-listener connection statistics for the listeners `virtualOutbound` hands
//! connections to (`listener.0.0.0.0_80.downstream_cx_total`, `listener.10.96.0.20_9000.…`):
//! Envoy counts a connection on the listener that owns it after the original-destination
//! hand-off, so `virtualOutbound`'s own (`0.0.0.0_15001`) count only the connections none took
//! (PassthroughCluster, BlackHoleCluster). A connection finds its listener's counters once, by
//! address, and counts as it is handed on and as it ends.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// One listener's connections.
#[derive(Debug, Default)]
pub struct ListenerCounters {
    opened: AtomicU64,
    closed: AtomicU64,
}

impl ListenerCounters {
    /// Connections handed to the listener, and those of them that ended.
    pub fn counts(&self) -> (u64, u64) {
        // The ends first: a connection counted between the two reads is then not shown
        // closed without having opened.
        let closed = self.closed.load(Ordering::Relaxed);
        (self.opened.load(Ordering::Relaxed), closed)
    }
}

/// Counts a connection in on its listener; counts it out when dropped, however the
/// connection ends.
#[derive(Debug)]
pub struct OnListener(Arc<ListenerCounters>);

impl Drop for OnListener {
    fn drop(&mut self) {
        self.0.closed.fetch_add(1, Ordering::Relaxed);
    }
}

/// The listeners' counters, by address. Bounded by the listeners istiod sends (each made at
/// its first connection, or at a scrape while it is in force) and kept after, as Envoy's
/// statistics are.
#[derive(Debug, Default)]
pub struct ListenerStats(Mutex<HashMap<SocketAddr, Arc<ListenerCounters>>>);

impl ListenerStats {
    /// The counters of the listener at `address`, made the first time.
    fn of(&self, address: SocketAddr) -> Arc<ListenerCounters> {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(all.entry(address).or_default())
    }

    /// A connection handed to the listener at `address`.
    pub fn handed(&self, address: SocketAddr) -> OnListener {
        let counters = self.of(address);
        counters.opened.fetch_add(1, Ordering::Relaxed);
        OnListener(counters)
    }

    /// Make the counters of `addresses` (the listeners in force), for their names at 0.
    pub fn make(&self, addresses: impl IntoIterator<Item = SocketAddr>) {
        for a in addresses {
            self.of(a);
        }
    }

    /// Each listener's stat name with its counters, by name.
    pub fn each(&self) -> Vec<(String, Arc<ListenerCounters>)> {
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<_> = all
            .iter()
            .map(|(a, c)| (stat_name(*a), Arc::clone(c)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// Envoy's stat prefixes for the outbound and inbound listeners (`0.0.0.0_15001`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerNames {
    pub outbound: String,
    pub inbound: String,
}

impl Default for ListenerNames {
    fn default() -> Self {
        ListenerNames {
            outbound: "0.0.0.0_15001".into(),
            inbound: "0.0.0.0_15006".into(),
        }
    }
}

impl ListenerNames {
    /// Envoy's stat prefix for a listener bound to `addr`.
    pub fn prefix(addr: SocketAddr) -> String {
        stat_name(addr)
    }
}

/// The name Envoy files a listener's statistics under: its address, with the `:`s a stat
/// name cannot hold as `_` (`0.0.0.0_80`, `[__]_80`).
pub fn stat_name(address: SocketAddr) -> String {
    match address {
        SocketAddr::V4(a) => format!("{}_{}", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("[{}]_{}", a.ip().to_string().replace(':', "_"), a.port()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_counts_in_and_out_on_its_listener() {
        let stats = ListenerStats::default();
        let web: SocketAddr = "0.0.0.0:80".parse().expect("addr");
        let one = stats.handed(web);
        let two = stats.handed(web);
        drop(one);
        stats.make(["[fd00::1]:9000".parse().expect("addr")]);
        let each = stats.each();
        let names: Vec<&str> = each.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["0.0.0.0_80", "[fd00__1]_9000"]);
        assert_eq!(each[0].1.counts(), (2, 1));
        drop(two);
        assert_eq!(each[0].1.counts(), (2, 2));
        assert_eq!(each[1].1.counts(), (0, 0));
    }
}
