//! The upstream layer, when xDS configures the proxy: a cluster name (from the route decision,
//! [`crate::route`]) becomes one endpoint, chosen among the cluster's healthy ones by its
//! balancing policy, with the transport Envoy would give that endpoint (plaintext, or Istio
//! mTLS with the SNI, ALPN and SAN check of the cluster's matching transport socket), and then
//! an open connection to it ([`dial`]).
//!
//! HTTP selects once per request, TCP once per connection: what is in flight per endpoint
//! ([`InFlight`]) is what LEAST_REQUEST compares.

use remora_xds::model::cluster::{Cluster, Discovery, LbPolicy};
use remora_xds::model::endpoint::{ClusterLoadAssignment, Endpoint};
use remora_xds::snapshot::Snapshot;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

pub mod balance;
pub mod dial;
pub mod dns;
pub mod transport;

pub use transport::{MeshTls, Transport, TransportError};

/// Round-robin positions are kept for at most this many clusters; past it they start again
/// (istiod may name clusters without end over a long life; a restart of a rotation costs
/// nothing but evenness for one turn).
const ROUND_ROBIN_CLUSTERS: usize = 4096;

/// Bound on the picks again of one retry's host selection (`host_selection_retry_max_attempts`,
/// istiod's is 5): a resource asking for billions would spin a request's task on them, and
/// past a few dozen a rejected pick is all but certain to be the only host left anyway.
const MAX_HOST_SELECTION_ATTEMPTS: u32 = 64;

/// The balancers' state, shared by every connection.
#[derive(Debug, Default)]
pub struct Upstreams {
    /// Requests (HTTP) or connections (TCP) in flight per endpoint. An entry lives only while
    /// something is in flight, so the map is bounded by what is in flight.
    active: Mutex<HashMap<SocketAddr, u32>>,
    /// The next position per round-robin cluster.
    round_robin: Mutex<HashMap<String, u64>>,
    /// A small number per set of mesh TLS parameters, for the pool's key: connections made
    /// with one SNI and SAN check never serve a request that wants another.
    tls_ids: Mutex<TlsIds>,
    /// The server side of Istio's request metrics per service host a cluster stands for, made
    /// once and shared, so that a request's series is found without an allocation.
    service_peers: Mutex<HashMap<String, Arc<crate::tls::Peer>>>,
    /// The DNS clusters' host sets, kept resolved by [`dns::run`].
    pub dns: Arc<dns::DnsHosts>,
}

#[derive(Debug, Default)]
struct TlsIds {
    ids: HashMap<Arc<MeshTls>, u32>,
    /// The last number given. Never reused: when the table is full it starts again with fresh
    /// numbers, so a pooled connection under an old number can never be taken for another's
    /// parameters. Starts above 0, which is plaintext's.
    last: u32,
}

/// The endpoint chosen for one request or connection.
#[derive(Debug)]
pub struct Selected {
    pub cluster: Arc<Cluster>,
    pub address: SocketAddr,
    pub transport: Transport,
    pub connect_timeout: Duration,
    /// Counts the request (or connection) against the endpoint until dropped.
    pub in_flight: InFlight,
}

/// Why no endpoint was chosen; each is one of Envoy's response flags.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UpstreamError {
    #[error("cluster {0} not found")]
    NoCluster(String),
    #[error("cluster {0} has no healthy endpoint")]
    NoHealthyUpstream(String),
    #[error("cluster {cluster}: {error}")]
    Transport {
        cluster: String,
        error: TransportError,
    },
}

impl UpstreamError {
    /// Envoy's response flag for it.
    pub fn response_flag(&self) -> &'static str {
        match self {
            UpstreamError::NoCluster(_) => "NC",
            UpstreamError::NoHealthyUpstream(_) => "UH",
            UpstreamError::Transport { .. } => "UF",
        }
    }
}

/// Hosts a retry should stay away from: Envoy's `previous_hosts` retry predicate, which
/// rejects a pick that was already tried and picks again, up to `attempts` more times, the
/// last pick standing when every one was rejected.
#[derive(Debug, Clone, Copy, Default)]
pub struct Avoid<'a> {
    pub hosts: &'a [SocketAddr],
    pub attempts: u32,
}

impl Upstreams {
    /// Choose an endpoint of `cluster` for a connection whose original destination is
    /// `original_dst`.
    pub fn select(
        self: &Arc<Self>,
        snapshot: &Snapshot,
        cluster: &str,
        original_dst: SocketAddr,
    ) -> Result<Selected, UpstreamError> {
        self.select_avoiding(snapshot, cluster, original_dst, Avoid::default())
    }

    /// [`Upstreams::select`] for a retry, avoiding the hosts already tried as `avoid` says.
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
        self.select_in(snapshot, c, original_dst, avoid)
    }

    /// [`Upstreams::select_avoiding`] of a cluster already found (a request's route decision
    /// holds its cluster, so each attempt need not look it up by name again).
    pub fn select_in(
        self: &Arc<Self>,
        snapshot: &Snapshot,
        c: &Arc<Cluster>,
        original_dst: SocketAddr,
        avoid: Avoid<'_>,
    ) -> Result<Selected, UpstreamError> {
        let cluster = c.name.as_str();
        // Outlives the match: a DNS cluster's endpoint is borrowed from it.
        let dns_hosts;
        let (address, tls_mode) = match &c.discovery {
            Discovery::OriginalDst { port_override, .. } => {
                let port = port_override.unwrap_or(original_dst.port());
                (SocketAddr::new(original_dst.ip(), port), None)
            }
            Discovery::Eds { .. } | Discovery::Static => {
                let cla = snapshot.endpoints_of(c);
                let mut endpoint = cla.and_then(|cla| self.pick(c, cla));
                for _ in 0..avoid.attempts.min(MAX_HOST_SELECTION_ATTEMPTS) {
                    match endpoint {
                        Some(e) if avoid.hosts.contains(&e.address) => {
                            endpoint = cla.and_then(|cla| self.pick(c, cla));
                        }
                        _ => break,
                    }
                }
                let endpoint = endpoint
                    .ok_or_else(|| UpstreamError::NoHealthyUpstream(cluster.to_string()))?;
                (endpoint.address, endpoint.tls_mode.as_deref())
            }
            // Before its first resolution, as in Envoy, no host.
            Discovery::StrictDns(_) | Discovery::LogicalDns(_) => {
                dns_hosts = self.dns.get(cluster);
                let endpoint = dns_hosts
                    .as_deref()
                    .and_then(|cla| self.pick(c, cla))
                    .ok_or_else(|| UpstreamError::NoHealthyUpstream(cluster.to_string()))?;
                (endpoint.address, endpoint.tls_mode.as_deref())
            }
        };
        let transport =
            transport::for_endpoint(c, tls_mode).map_err(|error| UpstreamError::Transport {
                cluster: cluster.to_string(),
                error,
            })?;
        Ok(Selected {
            cluster: Arc::clone(c),
            address,
            transport,
            connect_timeout: c.connect_timeout,
            in_flight: self.start(address),
        })
    }

    /// One endpoint of the highest priority that has a healthy one (or of every host of it, in
    /// panic mode), by the cluster's policy.
    fn pick<'a>(&self, c: &Cluster, cla: &'a ClusterLoadAssignment) -> Option<&'a Endpoint> {
        let threshold = c
            .common_lb
            .healthy_panic_threshold
            .unwrap_or(balance::DEFAULT_PANIC_THRESHOLD);
        let candidates = balance::candidates(cla, threshold);
        if candidates.is_empty() {
            return None;
        }
        let mut rng = fastrand::Rng::new();
        let index = match c.lb_policy {
            LbPolicy::RoundRobin => {
                let position = {
                    let mut rr = self
                        .round_robin
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    if rr.len() >= ROUND_ROBIN_CLUSTERS && !rr.contains_key(&c.name) {
                        rr.clear();
                    }
                    let next = rr.entry(c.name.clone()).or_insert(0);
                    let at = *next;
                    *next = next.wrapping_add(1);
                    at
                };
                balance::round_robin(&candidates, position)
            }
            LbPolicy::Random => balance::random(&candidates, rng.u64(..)),
            LbPolicy::LeastRequest { choice_count } => {
                let active = self.active.lock().unwrap_or_else(PoisonError::into_inner);
                let load = |a: &SocketAddr| active.get(a).copied().unwrap_or(0);
                balance::least_request(&candidates, choice_count, &load, &mut rng)
            }
            // Only ORIGINAL_DST clusters provide their host, and they do not get here.
            LbPolicy::ClusterProvided => balance::random(&candidates, rng.u64(..)),
        };
        candidates.get(index).copied()
    }

    fn start(self: &Arc<Self>, address: SocketAddr) -> InFlight {
        *self
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(address)
            .or_insert(0) += 1;
        InFlight {
            upstreams: Arc::clone(self),
            address,
        }
    }

    /// The pool-key number of these mesh TLS parameters (never 0).
    pub fn tls_id(&self, mesh: &Arc<MeshTls>) -> u32 {
        let mut t = self.tls_ids.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = t.ids.get(mesh) {
            return *id;
        }
        if t.ids.len() >= ROUND_ROBIN_CLUSTERS {
            t.ids.clear();
        }
        // Four billion parameter sets would have to be seen before a number came back.
        t.last = t.last.checked_add(1).unwrap_or(1);
        let id = t.last;
        t.ids.insert(Arc::clone(mesh), id);
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

    /// What is in flight to `address` (tests, `/clusters`).
    pub fn active(&self, address: SocketAddr) -> u32 {
        self.active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&address)
            .copied()
            .unwrap_or(0)
    }
}

/// One request or connection counted against its endpoint; dropping it ends the count.
#[derive(Debug)]
pub struct InFlight {
    upstreams: Arc<Upstreams>,
    address: SocketAddr,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut active = self
            .upstreams
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = active.get_mut(&self.address) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                active.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests;
