//! What the data path keeps per cluster, shared by every connection and worker: the circuit
//! breakers' counts, outlier detection's per-host state, the round-robin position and Envoy's
//! statistics. A cluster's state is made the first time a request or connection uses the
//! cluster as the snapshot now has it, and found again without a lock or an allocation (an
//! `ArcSwap`ed map by name); a new version of the cluster gets a fresh state (Envoy builds a
//! new cluster too), keeping its statistics.

use super::assignment::{Assignment, KeptLoads};
use super::outlier::HostState;
use super::stats::{Charge, ClusterStats};
use arc_swap::ArcSwap;
use remora_xds::model::circuit_breakers::CircuitBreakers;
use remora_xds::model::endpoint::ClusterLoadAssignment;
use remora_xds::model::outlier::OutlierDetection;
use remora_xds::model::Cluster;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// Statistics are kept for at most this many cluster names; past it, those of clusters gone
/// from the configuration are dropped (istiod may name clusters without end over a long life).
const MAX_STATS: usize = 4096;

/// A cluster's gauges, by Envoy's name.
pub type Gauges = Vec<(&'static str, u64)>;

/// Every cluster's state.
#[derive(Debug, Default)]
pub struct ClusterStates {
    /// foldhash, not SipHash: looked up on every request, keyed by what istiod names.
    by_name: ArcSwap<foldhash::HashMap<Box<str>, Arc<ClusterState>>>,
    /// By stat name, outliving the cluster versions that count into them.
    stats: Mutex<HashMap<Box<str>, Arc<ClusterStats>>>,
    /// Serializes the rare making of a state.
    write: Mutex<()>,
}

/// One version of one cluster at run time.
#[derive(Debug)]
pub struct ClusterState {
    /// The version this state is for (swapped for an equal one that a push rebuilt).
    config: ArcSwap<Cluster>,
    pub stats: Arc<ClusterStats>,
    pub limits: CircuitBreakers,
    pub outlier: Option<OutlierDetection>,
    /// The cluster speaks HTTP/2 upstream: its requests share connections.
    http2: bool,
    /// Requests (or TCP connections) in flight, for `max_requests`.
    pub rq_active: AtomicU32,
    /// Requests waiting for a connection, for `max_pending_requests`.
    pub rq_pending: AtomicU32,
    /// Connection slots in use, for `max_connections`.
    pub cx_active: AtomicU32,
    /// Retries in flight, for `max_retries`.
    pub retries_active: AtomicU32,
    /// Woken when a connection slot is given back, for the requests pending on one.
    pub cx_released: tokio::sync::Notify,
    pub round_robin: AtomicU64,
    /// A RING_HASH or MAGLEV cluster's table, for the candidates it was built over (built
    /// again when they change: endpoints, health, ejections).
    pub hash_table: arc_swap::ArcSwapOption<super::ring::HashTable>,
    /// The table before it: a cluster whose traffic spills over two priorities uses one table
    /// per priority (as Envoy keeps one per priority), and alternates between them.
    pub previous_hash_table: arc_swap::ArcSwapOption<super::ring::HashTable>,
    /// The priority loads of the assignment last picked from with no host ejected.
    kept_loads: arc_swap::ArcSwapOption<KeptLoads>,
    /// The clock of ejections (ms from here; outlier detection's interval ticks start here).
    started: Instant,
    /// foldhash, as `by_name`: looked up on every pick.
    hosts: ArcSwap<foldhash::HashMap<SocketAddr, Arc<HostState>>>,
    /// The latest end of any ejection (ms; only ever raised): until then a pick looks its
    /// hosts up, after it none can be out. No count that a racing pick could lower.
    pub ejected_until: AtomicU64,
    /// Hosts the cluster has (as of its last pick): the whole that `max_ejection_percent` is
    /// a share of.
    pub endpoints: AtomicU32,
    /// Serializes ejections (the share already out is part of the decision) and new hosts.
    pub ejecting: Mutex<()>,
}

impl ClusterStates {
    /// The state of `cluster` as the snapshot has it; `names` are the clusters the snapshot
    /// has (states of the others are dropped when a state is made).
    pub fn get(&self, cluster: &Arc<Cluster>, names: impl Fn(&str) -> bool) -> Arc<ClusterState> {
        if let Some(state) = self.by_name.load().get(cluster.name.as_str()) {
            let config = state.config.load();
            if Arc::ptr_eq(&config, cluster) {
                return Arc::clone(state);
            }
            // A push that rebuilt the cluster unchanged keeps its state.
            if **config == **cluster {
                state.config.store(Arc::clone(cluster));
                return Arc::clone(state);
            }
        }
        let _write = self.write.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.by_name.load();
        if let Some(state) = current.get(cluster.name.as_str()) {
            if **state.config.load() == **cluster {
                return Arc::clone(state);
            }
        }
        let stat_name = cluster.alt_stat_name.as_deref().unwrap_or(&cluster.name);
        let stats = {
            let mut all = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
            if all.len() >= MAX_STATS {
                all.retain(|name, _| current.values().any(|s| *s.stats.name == **name));
            }
            Arc::clone(
                all.entry(stat_name.into())
                    .or_insert_with(|| Arc::new(ClusterStats::new(stat_name))),
            )
        };
        let state = Arc::new(ClusterState::new(Arc::clone(cluster), stats));
        let mut next: foldhash::HashMap<Box<str>, Arc<ClusterState>> = current
            .iter()
            .filter(|(name, _)| names(name))
            .map(|(name, s)| (name.clone(), Arc::clone(s)))
            .collect();
        next.insert(cluster.name.as_str().into(), Arc::clone(&state));
        self.by_name.store(Arc::new(next));
        state
    }

    /// Whether an HTTP request to the cluster named `name` would find every connection slot
    /// in use (an HTTP/2 cluster's requests hold none).
    pub fn connections_full(&self, name: &str) -> bool {
        self.by_name
            .load()
            .get(name)
            .is_some_and(|s| s.connections_full())
    }

    /// The state of the cluster named `name` now, if it was ever used.
    pub fn find(&self, name: &str) -> Option<Arc<ClusterState>> {
        self.by_name.load().get(name).cloned()
    }

    /// The states now (admin pages).
    pub fn all(&self) -> Vec<Arc<ClusterState>> {
        self.by_name.load().values().cloned().collect()
    }

    /// Every cluster's statistics by stat name, with the gauges of its current state and
    /// whether it has outlier detection (Envoy makes `outlier_detection.*` only then; a
    /// cluster no longer in force keeps them).
    pub fn envoy_stats(&self) -> Vec<(Arc<ClusterStats>, Gauges, bool)> {
        let states = self.by_name.load();
        let all = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<_> = all
            .values()
            .map(|stats| {
                let state = states.values().find(|s| Arc::ptr_eq(&s.stats, stats));
                let gauges = state
                    .map(|s| s.gauges())
                    .unwrap_or_else(|| ClusterState::idle_gauges().to_vec());
                let outlier = state.is_none_or(|s| s.outlier.is_some());
                (Arc::clone(stats), gauges, outlier)
            })
            .collect();
        out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        out
    }
}

impl ClusterState {
    fn new(cluster: Arc<Cluster>, stats: Arc<ClusterStats>) -> Self {
        ClusterState {
            limits: cluster.circuit_breakers,
            outlier: cluster.outlier_detection,
            http2: cluster.http_protocol == remora_xds::model::cluster::UpstreamHttpProtocol::Http2,
            config: ArcSwap::new(cluster),
            stats,
            rq_active: AtomicU32::new(0),
            rq_pending: AtomicU32::new(0),
            cx_active: AtomicU32::new(0),
            retries_active: AtomicU32::new(0),
            cx_released: tokio::sync::Notify::new(),
            round_robin: AtomicU64::new(0),
            hash_table: arc_swap::ArcSwapOption::empty(),
            previous_hash_table: arc_swap::ArcSwapOption::empty(),
            kept_loads: arc_swap::ArcSwapOption::empty(),
            started: Instant::now(),
            hosts: ArcSwap::default(),
            ejected_until: AtomicU64::new(0),
            endpoints: AtomicU32::new(0),
            ejecting: Mutex::new(()),
        }
    }

    /// Charge an upstream answer's `status`: as the request's answer, or, `retried`, in Envoy's
    /// `retry.*` copy only.
    pub fn answer(&self, status: u16, charge: Charge, retried: bool) {
        match charge {
            Charge::None => {}
            _ if retried => self.stats.retried_response(status),
            Charge::External => self.stats.response(status, false),
            Charge::Internal => self.stats.response(status, true),
        }
    }

    /// Count what an attempt on `host` (none: an original destination, or not known) came to,
    /// and let outlier detection eject the host on it.
    /// Only HTTP requests are counted in the `upstream_rq_*` statistics (`charge`), as Envoy
    /// counts them: a request once it went out on a connection (`upstream_rq_total`), the
    /// code of an answer, and a timeout as its 504; an attempt whose connection failed, or
    /// that was reset, adds no code (Envoy charges its 503 only as the request's own answer).
    pub fn report(&self, host: Option<&HostState>, outcome: super::Outcome, charge: Charge) {
        use super::stats::inc;
        use super::Outcome;
        let internal = charge == Charge::Internal;
        match outcome {
            _ if charge == Charge::None => {}
            // Its code is charged when the router knows whether the answer is the request's
            // or retried ([`ClusterState::answer`]).
            Outcome::Status(_) => inc(&self.stats.rq_total),
            Outcome::LocalFailure => inc(&self.stats.rq_total),
            Outcome::Timeout => {
                inc(&self.stats.rq_timeout);
                self.stats.response(504, internal);
            }
            // As Envoy's router: the attempt went out, and is cut; its 504 is charged only
            // as the request's answer, if it is not retried.
            Outcome::PerTryTimeout => {
                inc(&self.stats.rq_total);
                inc(&self.stats.rq_per_try_timeout);
            }
            Outcome::ConnectFailed | Outcome::Connected | Outcome::ConnectedFinal => {}
        }
        let Some(host) = host else {
            return;
        };
        match outcome {
            Outcome::Status(_) | Outcome::LocalFailure | Outcome::PerTryTimeout => {
                inc(&host.rq_total)
            }
            Outcome::ConnectFailed => inc(&host.cx_connect_fail),
            _ => {}
        }
        if matches!(
            outcome,
            Outcome::ConnectFailed
                | Outcome::LocalFailure
                | Outcome::Timeout
                | Outcome::PerTryTimeout
        ) || matches!(outcome, Outcome::Status(c) if c >= 500)
        {
            inc(&host.rq_error);
        }
        let Some(od) = &self.outlier else {
            return;
        };
        for d in super::outlier::count(host, od, outcome)
            .into_iter()
            .flatten()
        {
            let _one = self.ejecting.lock().unwrap_or_else(PoisonError::into_inner);
            let now = self.now_ms();
            let out = self.count_ejected(now);
            let hosts = self
                .hosts
                .load()
                .len()
                .max(self.endpoints.load(Ordering::Relaxed) as usize);
            let roll = fastrand::u32(..100);
            if super::outlier::detect(host, od, d, &self.stats, now, out, hosts, roll) {
                self.ejected_until
                    .fetch_max(host.ejection_end(), Ordering::AcqRel);
                tracing::info!(cluster = %self.name(), host = %host.address, detector = ?d, "host ejected by outlier detection");
            }
        }
    }

    /// The cluster's name.
    pub fn name(&self) -> String {
        self.config.load().name.clone()
    }

    /// Whether an HTTP request to this cluster would find every connection slot in use (an
    /// HTTP/2 cluster's requests hold none).
    pub fn connections_full(&self) -> bool {
        !self.http2 && self.cx_active.load(Ordering::Acquire) >= self.limits.max_connections
    }

    /// Now, on the ejection clock (ms, never 0).
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    /// The state of the host at `address`, made the first time it is picked.
    pub fn host(&self, address: SocketAddr) -> Arc<HostState> {
        if let Some(h) = self.hosts.load().get(&address) {
            return Arc::clone(h);
        }
        let _write = self.ejecting.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.hosts.load();
        if let Some(h) = current.get(&address) {
            return Arc::clone(h);
        }
        let host = Arc::new(HostState::new(address));
        let mut next = HashMap::clone(&current);
        next.insert(address, Arc::clone(&host));
        self.hosts.store(Arc::new(next));
        host
    }

    /// The host at `address` if it was ever picked.
    pub fn known_host(&self, address: &SocketAddr) -> Option<Arc<HostState>> {
        self.hosts.load().get(address).cloned()
    }

    /// Whether some host may be ejected at `now`.
    pub fn any_ejected(&self, now: u64) -> bool {
        now < self.ejected_until.load(Ordering::Acquire)
    }

    /// Hosts out now (ends the ejections that are over).
    pub fn count_ejected(&self, now: u64) -> usize {
        self.hosts
            .load()
            .values()
            .filter(|h| h.ejected(now))
            .count()
    }

    /// `f` over the priority loads of `a` with no host ejected and the state of its hosts (in
    /// the assignment's order, which is how a pick reads whether a host is out):
    /// those kept when `a` is the assignment this cluster last picked from, else counted (and
    /// the states made) now, when the hosts `a` no longer has are forgotten too
    /// ([`ClusterState::note_assignment`]).
    pub fn with_loads<R>(
        &self,
        a: Assignment<'_>,
        panic_threshold: f64,
        f: impl FnOnce(&KeptLoads) -> R,
    ) -> R {
        let kept = self.kept_loads.load();
        if let Some(k) = kept.as_deref().filter(|k| k.are_of(a, panic_threshold)) {
            return f(k);
        }
        drop(kept);
        self.note_assignment(a.cla());
        let hosts = self.hosts_of(a.cla());
        let fresh = Arc::new(KeptLoads::new(a, panic_threshold, hosts));
        let out = f(&fresh);
        self.kept_loads.store(Some(fresh));
        out
    }

    /// The state of each endpoint of `cla`, in its order, made for those never picked (one
    /// copy of the map for all of them).
    fn hosts_of(&self, cla: &ClusterLoadAssignment) -> Box<[Arc<HostState>]> {
        let current = self.hosts.load();
        if cla
            .endpoints()
            .all(|(_, e)| current.contains_key(&e.address))
        {
            return cla
                .endpoints()
                .filter_map(|(_, e)| current.get(&e.address).cloned())
                .collect();
        }
        drop(current);
        let _write = self.ejecting.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = HashMap::clone(&self.hosts.load());
        let hosts = cla
            .endpoints()
            .map(|(_, e)| {
                Arc::clone(
                    next.entry(e.address)
                        .or_insert_with(|| Arc::new(HostState::new(e.address))),
                )
            })
            .collect();
        self.hosts.store(Arc::new(next));
        hosts
    }

    /// Take `cla` as the cluster's hosts: their number (the whole `max_ejection_percent` is a
    /// share of), and the state of hosts it no longer has forgotten.
    pub fn note_assignment(&self, cla: &ClusterLoadAssignment) {
        let total: usize = cla.localities.iter().map(|l| l.endpoints.len()).sum();
        let total_u32 = u32::try_from(total).unwrap_or(u32::MAX);
        if self.endpoints.load(Ordering::Relaxed) != total_u32 {
            self.endpoints.store(total_u32, Ordering::Relaxed);
        }
        self.prune_hosts(total, |a| cla.endpoints().any(|(_, e)| e.address == *a));
    }

    /// Forget hosts no longer in the cluster's endpoints (`keep`), when there are many more
    /// known than there are endpoints: their state goes, as Envoy's goes with the host.
    pub fn prune_hosts(&self, endpoints: usize, keep: impl Fn(&SocketAddr) -> bool) {
        if self.hosts.load().len() <= endpoints.saturating_mul(2).saturating_add(16) {
            return;
        }
        let _write = self.ejecting.lock().unwrap_or_else(PoisonError::into_inner);
        let next: foldhash::HashMap<_, _> = self
            .hosts
            .load()
            .iter()
            .filter(|(a, _)| keep(a))
            .map(|(a, h)| (*a, Arc::clone(h)))
            .collect();
        self.hosts.store(Arc::new(next));
    }

    /// The hosts ever picked (admin pages).
    pub fn hosts(&self) -> Vec<Arc<HostState>> {
        self.hosts.load().values().cloned().collect()
    }

    fn gauges(&self) -> Vec<(&'static str, u64)> {
        let v = |a: &AtomicU32| u64::from(a.load(Ordering::Relaxed));
        let ejected = self.count_ejected(self.now_ms());
        vec![
            ("upstream_rq_active", v(&self.rq_active)),
            ("upstream_rq_pending_active", v(&self.rq_pending)),
            ("upstream_cx_active", v(&self.cx_active)),
            (
                "outlier_detection.ejections_active",
                u64::try_from(ejected).unwrap_or(u64::MAX),
            ),
            (
                "circuit_breakers.default.cx_open",
                u64::from(self.cx_active.load(Ordering::Relaxed) >= self.limits.max_connections),
            ),
            (
                "circuit_breakers.default.rq_pending_open",
                u64::from(
                    self.rq_pending.load(Ordering::Relaxed) >= self.limits.max_pending_requests,
                ),
            ),
            (
                "circuit_breakers.default.rq_open",
                u64::from(self.rq_active.load(Ordering::Relaxed) >= self.limits.max_requests),
            ),
            (
                "circuit_breakers.default.rq_retry_open",
                u64::from(self.retries_active.load(Ordering::Relaxed) >= self.limits.max_retries),
            ),
        ]
    }

    pub fn idle_gauges() -> [(&'static str, u64); 4] {
        [
            ("upstream_rq_active", 0),
            ("upstream_rq_pending_active", 0),
            ("upstream_cx_active", 0),
            ("outlier_detection.ejections_active", 0),
        ]
    }
}
