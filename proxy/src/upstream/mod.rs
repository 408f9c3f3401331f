//! The upstream layer, when xDS configures the proxy: a cluster name (from the route decision,
//! [`crate::route`]) becomes one endpoint, chosen among the cluster's healthy ones by its
//! balancing policy, with the transport Envoy would give that endpoint (plaintext, Istio
//! mTLS with the SNI, ALPN and SAN check of the cluster's matching transport socket, or a
//! DestinationRule's TLS origination with the pod's files, [`origin`]), and then an open
//! connection to it ([`dial`]).
//!
//! HTTP selects once per attempt, TCP once per connection. A selection first takes the
//! cluster's circuit-breaker slots ([`state`]; over a limit it is refused with Envoy's `UO`),
//! then a host that outlier detection has not ejected ([`outlier`], [`balance`]), of the
//! priority (and locality) Envoy's priority load gives the request ([`priority`]). The
//! [`InFlight`] it returns holds the slots and the host's in-flight count (what LEAST_REQUEST
//! compares) until dropped, and takes the attempt's outcome, which counts in Envoy's cluster
//! statistics ([`stats`]) and may eject the host at once.

use outlier::HostState;
use remora_xds::model::cluster::{Cluster, Discovery, LbPolicy};
use remora_xds::model::endpoint::{ClusterLoadAssignment, Endpoint};
use remora_xds::snapshot::Snapshot;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

pub mod assignment;
pub mod balance;
pub mod connection_end;
pub mod dial;
pub mod dns;
mod error;
pub mod hash;
mod in_flight;
pub mod membership;
pub mod multiplexed;
pub mod origin;
pub mod outlier;
pub mod priority;
pub mod ring;
pub mod state;
pub mod stats;
pub mod transport;

pub use error::UpstreamError;

pub use assignment::Assignment;
pub use in_flight::{InFlight, RetryGuard};
pub use multiplexed::{ConnectionSlot, StreamWaiters};
pub use outlier::Outcome;
pub use state::ClusterState;
pub use stats::Charge;
pub use transport::{MeshTls, OriginTls, Transport, TransportError};

/// TLS parameter sets and service peers are kept for at most this many; past it they
/// start again (istiod may name clusters without end over a long life).
const ROUND_ROBIN_CLUSTERS: usize = 4096;

/// Bound on the picks again of one retry's host selection (`host_selection_retry_max_attempts`,
/// istiod's is 5): a resource asking for billions would spin a request's task on them, and
/// past a few dozen a rejected pick is all but certain to be the only host left anyway.
const MAX_HOST_SELECTION_ATTEMPTS: u32 = 64;

/// The balancers' state, shared by every connection.
#[derive(Debug, Default)]
pub struct Upstreams {
    /// Per cluster: circuit breakers, outlier detection, in-flight counts per host (what
    /// LEAST_REQUEST compares), the round-robin position and Envoy's statistics.
    pub clusters: state::ClusterStates,
    /// A small number per set of TLS parameters, for the pool's key: connections made
    /// with one SNI and SAN check never serve a request that wants another.
    tls_ids: Mutex<TlsIds>,
    /// The client configs of DestinationRule originations, built from the pod's files.
    pub origins: origin::Origins,
    /// The server side of Istio's request metrics per service host a cluster stands for, made
    /// once and shared, so that a request's series is found without an allocation.
    service_peers: Mutex<foldhash::HashMap<String, Arc<crate::tls::Peer>>>,
    /// The DNS clusters' host sets, kept resolved by [`dns::run`].
    pub dns: Arc<dns::DnsHosts>,
}

#[derive(Debug, Default)]
struct TlsIds {
    ids: foldhash::HashMap<TlsParams, u32>,
    /// The last number given. Never reused: when the table is full it starts again with fresh
    /// numbers, so a pooled connection under an old number can never be taken for another's
    /// parameters. Starts above 0, which is plaintext's.
    last: u32,
}

/// What a pooled TLS connection was made with.
#[derive(Debug, PartialEq, Eq, Hash)]
enum TlsParams {
    Mesh(Arc<MeshTls>),
    Origin(Arc<OriginTls>),
}

/// The endpoint chosen for one request or connection.
#[derive(Debug)]
pub struct Selected {
    pub cluster: Arc<Cluster>,
    pub address: SocketAddr,
    pub transport: Transport,
    pub connect_timeout: Duration,
    /// Counts the request (or connection) against the endpoint and the cluster's circuit
    /// breakers until dropped; takes the attempt's outcome for outlier detection.
    pub in_flight: InFlight,
}

/// Hosts a retry should stay away from: Envoy's `previous_hosts` retry predicate, which
/// rejects a pick that was already tried and picks again, up to `attempts` more times, the
/// last pick standing when every one was rejected.
///
/// It carries the request's hash too ([`hash::request_hash`]), which a RING_HASH or MAGLEV
/// cluster picks by (`None`: a random pick, as Envoy's without one).
#[derive(Debug, Clone, Copy, Default)]
pub struct Avoid<'a> {
    pub hosts: &'a [SocketAddr],
    pub attempts: u32,
    pub hash: Option<u64>,
    /// Envoy's `previous_priorities` retry priority: every this many attempts (`hosts`), the
    /// priorities they went to are left out of the next picks' load.
    pub previous_priorities: Option<u32>,
}

impl Avoid<'_> {
    /// The priorities of `cla` a pick leaves out: those of the hosts tried, counted in whole
    /// rounds of the update frequency, as Envoy updates them. Allocates only when there are.
    #[inline]
    fn excluded_priorities(&self, cla: &ClusterLoadAssignment) -> Vec<u32> {
        let Some(every) = self.previous_priorities.filter(|f| *f > 0) else {
            return Vec::new();
        };
        let every = usize::try_from(every).unwrap_or(usize::MAX);
        let counted = self.hosts.len() / every * every;
        let mut out = Vec::new();
        for tried in &self.hosts[..counted] {
            if let Some((l, _)) = cla.endpoints().find(|(_, e)| e.address == *tried) {
                if !out.contains(&l.priority) {
                    out.push(l.priority);
                }
            }
        }
        out
    }
}

/// What a selection is for: an HTTP request attempt, or a TCP connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Traffic {
    Http,
    Tcp,
}

impl Upstreams {
    /// Choose an endpoint of `cluster` for a TCP connection whose original destination is
    /// `original_dst`.
    pub fn select(
        self: &Arc<Self>,
        snapshot: &Snapshot,
        cluster: &str,
        original_dst: SocketAddr,
    ) -> Result<Selected, UpstreamError> {
        self.select_hashed(snapshot, cluster, original_dst, None)
    }

    /// [`Upstreams::select`] with the connection's hash (`tcp_proxy`'s source-IP policy), for
    /// a RING_HASH or MAGLEV cluster.
    pub fn select_hashed(
        self: &Arc<Self>,
        snapshot: &Snapshot,
        cluster: &str,
        original_dst: SocketAddr,
        hash: Option<u64>,
    ) -> Result<Selected, UpstreamError> {
        let c = snapshot
            .cluster(cluster)
            .ok_or_else(|| UpstreamError::NoCluster(cluster.to_string()))?;
        let avoid = Avoid {
            hash,
            ..Avoid::default()
        };
        let state = self.state_of(snapshot, c);
        let eds = snapshot.eds_of(c);
        self.choose(eds, c, state, original_dst, avoid, Traffic::Tcp)
    }

    /// Choose an endpoint for one HTTP request attempt, avoiding the hosts already tried as
    /// `avoid` says.
    pub fn select_avoiding(
        self: &Arc<Self>,
        snapshot: &Snapshot,
        cluster: &str,
        original_dst: SocketAddr,
        avoid: Avoid<'_>,
    ) -> Result<Selected, UpstreamError> {
        let c = snapshot
            .cluster(cluster)
            .ok_or_else(|| UpstreamError::NoCluster(cluster.to_string()))?;
        let state = self.state_of(snapshot, c);
        let eds = snapshot.eds_of(c);
        self.choose(eds, c, state, original_dst, avoid, Traffic::Http)
    }

    /// [`Upstreams::select_avoiding`] of a cluster already found, with its state and its
    /// EDS endpoints (`eds`, as [`Snapshot::eds_of`] gives them): a request's route
    /// decision holds them, so each attempt need not look them up again.
    pub fn select_in(
        self: &Arc<Self>,
        eds: Option<&Arc<ClusterLoadAssignment>>,
        state: &Arc<ClusterState>,
        c: &Arc<Cluster>,
        original_dst: SocketAddr,
        avoid: Avoid<'_>,
    ) -> Result<Selected, UpstreamError> {
        self.choose(
            eds,
            c,
            Arc::clone(state),
            original_dst,
            avoid,
            Traffic::Http,
        )
    }

    /// The run-time state of `c` (breakers, outlier detection, statistics), as the snapshot
    /// has it: found once per request by its route decision.
    pub fn state_of(&self, snapshot: &Snapshot, c: &Arc<Cluster>) -> Arc<ClusterState> {
        self.clusters
            .get(c, |name| snapshot.cluster(name).is_some())
    }

    /// Circuit breakers first (a request over a limit never reaches a host), then the host:
    /// one of the cluster's endpoints: `eds` for an EDS cluster, its own for a static one.
    fn choose(
        self: &Arc<Self>,
        eds: Option<&Arc<ClusterLoadAssignment>>,
        c: &Arc<Cluster>,
        state: Arc<ClusterState>,
        original_dst: SocketAddr,
        avoid: Avoid<'_>,
        traffic: Traffic,
    ) -> Result<Selected, UpstreamError> {
        let cluster = c.name.as_str();
        let mut in_flight = InFlight::admit(state, c, traffic)?;
        let state = &in_flight.state;
        // Outlives the match: a DNS cluster's endpoint is borrowed from it.
        let dns_hosts;
        // The chosen host's state, when the pick found it without a look-up.
        let mut known = None;
        let (address, tls_mode) = match &c.discovery {
            Discovery::OriginalDst { port_override, .. } => {
                let port = port_override.unwrap_or(original_dst.port());
                (SocketAddr::new(original_dst.ip(), port), None)
            }
            Discovery::Eds { .. } | Discovery::Static => {
                let assignment = Assignment::of(c, eds);
                let excluded = assignment
                    .map(|a| avoid.excluded_priorities(a.cla()))
                    .unwrap_or_default();
                let pick = |a, attempt| pick_host(state, c, a, avoid.hash, &excluded, attempt);
                let mut endpoint = assignment.and_then(|a| pick(a, 0));
                for attempt in 1..=avoid.attempts.min(MAX_HOST_SELECTION_ATTEMPTS) {
                    match &endpoint {
                        Some((e, _)) if avoid.hosts.contains(&e.address) => {
                            endpoint = assignment.and_then(|a| pick(a, attempt));
                        }
                        _ => break,
                    }
                }
                let (endpoint, host) = endpoint
                    .ok_or_else(|| UpstreamError::NoHealthyUpstream(cluster.to_string()))?;
                known = host;
                (endpoint.address, endpoint.tls_mode.as_deref())
            }
            // Before its first resolution, as in Envoy, no host.
            Discovery::StrictDns(_) | Discovery::LogicalDns(_) => {
                dns_hosts = self.dns.get(cluster);
                let endpoint = dns_hosts
                    .as_ref()
                    .and_then(|cla| {
                        let excluded = avoid.excluded_priorities(cla);
                        pick(state, c, Assignment::Shared(cla), avoid.hash, &excluded, 0)
                    })
                    .ok_or_else(|| UpstreamError::NoHealthyUpstream(cluster.to_string()))?;
                (endpoint.address, endpoint.tls_mode.as_deref())
            }
        };
        let transport =
            transport::for_endpoint(c, tls_mode).map_err(|error| UpstreamError::Transport {
                cluster: cluster.to_string(),
                error,
            })?;
        // An original destination is no host of the cluster's: it has no state of its own
        // (the converter refuses per-host limits and outlier detection there).
        if !matches!(c.discovery, Discovery::OriginalDst { .. }) {
            in_flight.on_host(address, known)?;
        }
        Ok(Selected {
            cluster: Arc::clone(c),
            address,
            transport,
            connect_timeout: c.connect_timeout,
            in_flight,
        })
    }

    /// Wait, as one of the cluster's pending requests, until a connection slot is free
    /// (Envoy queues a request its pool cannot open a connection for). Past
    /// `max_pending_requests` waiting, the request overflows. The wait is bounded by the
    /// request's own (its timeout, or the client going away).
    pub async fn wait_for_connection(
        &self,
        snapshot: &Snapshot,
        cluster: &str,
    ) -> Result<(), UpstreamError> {
        let c = snapshot
            .cluster(cluster)
            .ok_or_else(|| UpstreamError::NoCluster(cluster.to_string()))?;
        let state = self
            .clusters
            .get(c, |name| snapshot.cluster(name).is_some());
        if state.rq_pending.fetch_add(1, Ordering::AcqRel) >= state.limits.max_pending_requests {
            state.rq_pending.fetch_sub(1, Ordering::AcqRel);
            stats::inc(&state.stats.rq_pending_overflow);
            return Err(UpstreamError::Overflow(cluster.to_string()));
        }
        stats::inc(&state.stats.rq_pending_total);
        // Envoy counts the connection its pool could not open for the pending request.
        stats::inc(&state.stats.cx_overflow);
        let _pending = Decrement(&state.rq_pending);
        loop {
            let released = state.cx_released.notified();
            if state.cx_active.load(Ordering::Acquire) < state.limits.max_connections {
                return Ok(());
            }
            released.await;
        }
    }

    /// The pool-key number of a transport: 0 for plaintext, one per set of TLS parameters
    /// otherwise.
    pub fn tls_id(&self, transport: &Transport) -> u32 {
        let params = match transport {
            Transport::Plaintext => return 0,
            Transport::Mesh(mesh) => TlsParams::Mesh(Arc::clone(mesh)),
            Transport::Origin(origin) => TlsParams::Origin(Arc::clone(origin)),
        };
        let mut t = self.tls_ids.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = t.ids.get(&params) {
            return *id;
        }
        if t.ids.len() >= ROUND_ROBIN_CLUSTERS {
            t.ids.clear();
        }
        // Four billion parameter sets would have to be seen before a number came back.
        t.last = t.last.checked_add(1).unwrap_or(1);
        let id = t.last;
        t.ids.insert(params, id);
        id
    }

    /// How Istio's metrics name the destination of a request to `cluster`: the service of its
    /// Istio metadata (`destination_service` and its siblings), when it has one.
    pub fn service_peer(&self, cluster: &Cluster) -> Option<Arc<crate::tls::Peer>> {
        let host = &cluster.istio.services.first()?.host;
        let mut peers = self
            .service_peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = peers.get(host) {
            return Some(Arc::clone(p));
        }
        if peers.len() >= ROUND_ROBIN_CLUSTERS {
            peers.clear();
        }
        let peer = Arc::new(crate::tls::Peer {
            spiffe_id: None,
            uri_sans: Vec::new(),
            cert_hash: String::new(),
            subject: String::new(),
            dns_sans: Vec::new(),
            alpn: None,
            metadata: None,
            service: Some(Arc::from(host.as_str())),
        });
        peers.insert(host.clone(), Arc::clone(&peer));
        Some(peer)
    }

    /// Whether an HTTP request to `cluster` would find every connection it may have in use.
    /// One look-up, no lock: asked before every routed HTTP attempt.
    pub fn connections_full(&self, cluster: &str) -> bool {
        self.clusters.connections_full(cluster)
    }

    /// Count a request to the cluster of `state` that timed out, against `host` its last
    /// attempt went to (`internal`: one of Remora's own requests).
    pub fn timed_out(state: &ClusterState, host: Option<SocketAddr>, internal: bool) {
        Self::timed_out_as(state, host, internal, Outcome::Timeout);
    }

    /// [`Self::timed_out`], as `outcome` (the request's timeout, or an attempt's).
    pub fn timed_out_as(
        state: &ClusterState,
        host: Option<SocketAddr>,
        internal: bool,
        outcome: Outcome,
    ) {
        let host = host.and_then(|h| state.known_host(&h));
        let charge = if internal {
            Charge::Internal
        } else {
            Charge::External
        };
        state.report(host.as_deref(), outcome, charge);
    }

    /// Count a retry to the cluster of `s`, if its `max_retries` allows one more in flight;
    /// the guard holds it until the retry is over. `None`: the breaker is open (counted as
    /// `upstream_rq_retry_overflow`).
    pub fn retry(s: &Arc<ClusterState>) -> Option<RetryGuard> {
        let s = Arc::clone(s);
        if s.retries_active.fetch_add(1, Ordering::AcqRel) >= s.limits.max_retries {
            s.retries_active.fetch_sub(1, Ordering::AcqRel);
            stats::inc(&s.stats.rq_retry_overflow);
            return None;
        }
        stats::inc(&s.stats.rq_retry);
        Some(RetryGuard(Some(s)))
    }

    /// What is in flight to `address`, over every cluster (tests).
    pub fn active(&self, address: SocketAddr) -> u32 {
        self.clusters
            .all()
            .iter()
            .filter_map(|c| c.known_host(&address))
            .map(|h| h.rq_active.load(Ordering::Relaxed))
            .sum()
    }
}

/// One endpoint of the priority (and with locality weighting, the locality) Envoy's loads
/// choose, among its healthy hosts not ejected (or every host of it, in panic mode), by the
/// cluster's policy. Allocates nothing, but for a
/// consistent-hash cluster whose candidates changed (its table is built again). `hash` is the
/// request's, for such a cluster; `attempt` counts a retry's picks again.
fn pick<'a>(
    state: &ClusterState,
    c: &Cluster,
    assignment: Assignment<'a>,
    hash: Option<u64>,
    excluded_priorities: &[u32],
    attempt: u32,
) -> Option<&'a Endpoint> {
    pick_host(state, c, assignment, hash, excluded_priorities, attempt).map(|(e, _)| e)
}

/// [`pick`], with the chosen host's state when the cluster's kept assignment had it (so that
/// it need not be looked up by address).
fn pick_host<'a>(
    state: &ClusterState,
    c: &Cluster,
    assignment: Assignment<'a>,
    hash: Option<u64>,
    excluded_priorities: &[u32],
    attempt: u32,
) -> Option<(&'a Endpoint, Option<Arc<HostState>>)> {
    let threshold = c
        .common_lb
        .healthy_panic_threshold
        .unwrap_or(balance::DEFAULT_PANIC_THRESHOLD);
    let cla = assignment.cla();
    // No clock read while no host was ever ejected (nearly every cluster, nearly always).
    let now = if state.ejected_until.load(Ordering::Acquire) == 0 {
        0
    } else {
        state.now_ms()
    };
    let any_ejected = state.any_ejected(now);
    // A consistent-hash cluster chooses its priority by the request's hash too, as Envoy's.
    let hashing = matches!(
        c.lb_policy,
        LbPolicy::RingHash { .. } | LbPolicy::Maglev { .. }
    );
    let draw = |rng: &mut fastrand::Rng| {
        let hash = hash.unwrap_or_else(|| rng.u64(..));
        let draws = balance::Draws {
            priority: if hashing { hash } else { rng.u64(..) },
            locality: rng.u64(..),
        };
        (hash, draws)
    };
    let locality_weighted = c.common_lb.locality_weighted;
    state.with_loads(assignment, threshold, |kept| {
        if !any_ejected && excluded_priorities.is_empty() {
            if let Some((e, host)) = kept.sole(cla, locality_weighted) {
                return Some((e, Some(Arc::clone(host))));
            }
            let mut rng = fastrand::Rng::new();
            let (hash, draws) = draw(&mut rng);
            let usable = |_: &Endpoint| true;
            let candidates =
                balance::Candidates::choose_by(cla, kept.loads(), locality_weighted, usable, draws);
            let chosen = choose_among(state, c, &candidates, hash, attempt, &mut rng)?;
            return Some((chosen, kept.host_of(cla, chosen).cloned()));
        }
        // The loads depend on the moment (which hosts are out) or on the request (the
        // priorities its retries left out): counted for this pick. Whether a host is out is
        // read from its state, found by its place in the assignment: a pick asks it of every
        // endpoint it walks, several times over, which a look-up by address made most of the
        // pick's time while hosts of a large cluster were out (the `traffic` bench).
        let usable = move |e: &Endpoint| {
            !any_ejected || kept.host_of(cla, e).is_none_or(|h| !h.ejected(now))
        };
        let spread = balance::Spread {
            panic_threshold: threshold,
            locality_weighted,
            excluded_priorities,
        };
        let mut rng = fastrand::Rng::new();
        let (hash, draws) = draw(&mut rng);
        let candidates = balance::Candidates::choose(cla, spread, usable, draws);
        let chosen = choose_among(state, c, &candidates, hash, attempt, &mut rng)?;
        Some((chosen, kept.host_of(cla, chosen).cloned()))
    })
}

/// The cluster's policy's pick among `candidates` (`None`: there are none).
fn choose_among<'a, U: Fn(&Endpoint) -> bool + Copy>(
    state: &ClusterState,
    c: &Cluster,
    candidates: &balance::Candidates<'a, U>,
    hash: u64,
    attempt: u32,
    rng: &mut fastrand::Rng,
) -> Option<&'a Endpoint> {
    if candidates.is_empty() {
        return None;
    }
    if candidates.panic() {
        stats::inc(&state.stats.lb_healthy_panic);
    }
    let hosts = candidates.iter();
    // One candidate is every policy's pick: no weights summed, loads read or table kept.
    // (`len` counts what `iter` yields: the level's hosts of the availability chosen, or the
    // locality's eligible ones.)
    if candidates.len() == 1 {
        #[allow(clippy::let_and_return)] // as below
        let only = hosts.clone().next();
        return only;
    }
    let index = match c.lb_policy {
        LbPolicy::RoundRobin => {
            let position = state.round_robin.fetch_add(1, Ordering::Relaxed);
            balance::round_robin(hosts.clone(), position)
        }
        LbPolicy::Random => balance::random(hosts.clone(), rng.u64(..)),
        LbPolicy::LeastRequest { choice_count } => {
            let load = |a: &SocketAddr| {
                state
                    .known_host(a)
                    .map_or(0, |h| h.rq_active.load(Ordering::Relaxed))
            };
            // `len` is what `hosts` yields (counted with the loads): no walk to count them.
            balance::least_request(hosts.clone(), candidates.len(), choice_count, &load, rng)
        }
        // Only ORIGINAL_DST clusters provide their host, and they do not get here.
        LbPolicy::ClusterProvided => balance::random(hosts.clone(), rng.u64(..)),
        LbPolicy::RingHash { .. } | LbPolicy::Maglev { .. } => {
            ring::choose_kept(state, c.lb_policy, hosts.clone(), hash, attempt).unwrap_or(0)
        }
    };
    // Bound before returning: the iterator borrows `usable`, which borrows `state`. (Past
    // the end only when a host was ejected by another request since the candidates were
    // counted: the first one then.)
    #[allow(clippy::let_and_return)]
    let chosen = hosts.clone().nth(index).or_else(|| hosts.clone().next());
    chosen
}

/// Subtracts one when dropped.
struct Decrement<'a>(&'a AtomicU32);

impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod kept_tests;
#[cfg(test)]
mod limits_tests;
#[cfg(test)]
mod tests;
