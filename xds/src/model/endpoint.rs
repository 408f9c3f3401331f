//! EDS host sets: a cluster's endpoints by locality and priority, with their weights, health,
//! the `tlsMode` that picks their transport socket, and Istio's workload metadata.

use std::net::SocketAddr;

/// The endpoints of one cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterLoadAssignment {
    pub cluster_name: String,
    pub localities: Vec<LocalityEndpoints>,
    /// Envoy's overprovisioning factor in percent (140 when unset).
    pub overprovisioning_factor: u32,
}

/// Where an endpoint runs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Locality {
    pub region: String,
    pub zone: String,
    pub sub_zone: String,
}

/// The endpoints of one locality at one priority.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalityEndpoints {
    pub locality: Locality,
    /// 0 is the highest; higher ones take traffic only as lower ones become unhealthy.
    pub priority: u32,
    /// The locality's weight (locality-weighted balancing; `None` when unset).
    pub weight: Option<u32>,
    pub endpoints: Vec<Endpoint>,
}

/// One upstream host.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub address: SocketAddr,
    pub health: Health,
    /// Relative weight within the locality (1 when unset).
    pub weight: u32,
    /// `filter_metadata["envoy.transport_socket_match"].tlsMode` (`istio` when the workload
    /// has a sidecar and takes Istio mTLS).
    pub tls_mode: Option<String>,
    /// `filter_metadata.istio.workload`, split.
    pub workload: Option<Workload>,
}

/// Envoy's health statuses, as EDS reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Unknown,
    Healthy,
    Unhealthy,
    Draining,
    Timeout,
    Degraded,
}

impl Health {
    /// Whether balancing may send new traffic to it (Envoy treats UNKNOWN as healthy).
    pub fn takes_traffic(self) -> bool {
        matches!(self, Health::Unknown | Health::Healthy | Health::Degraded)
    }
}

/// Istio's `workload` endpoint metadata: `name;namespace;canonical service;revision;cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub name: String,
    pub namespace: String,
    pub canonical_service: String,
    pub canonical_revision: String,
    pub cluster_id: String,
}

impl Workload {
    /// Split istiod's `;`-joined form; fields it leaves out are empty.
    pub fn parse(raw: &str) -> Workload {
        let mut parts = raw.split(';').map(str::to_string);
        let mut next = || parts.next().unwrap_or_default();
        Workload {
            name: next(),
            namespace: next(),
            canonical_service: next(),
            canonical_revision: next(),
            cluster_id: next(),
        }
    }
}

impl ClusterLoadAssignment {
    /// Every endpoint, with the locality entry it is in.
    pub fn endpoints(&self) -> impl Iterator<Item = (&LocalityEndpoints, &Endpoint)> {
        self.localities
            .iter()
            .flat_map(|l| l.endpoints.iter().map(move |e| (l, e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_metadata_splits() {
        let w = Workload::parse("reviews-v3;default;reviews;v3;Kubernetes");
        assert_eq!(w.name, "reviews-v3");
        assert_eq!(w.canonical_revision, "v3");
        assert_eq!(w.cluster_id, "Kubernetes");
        let short = Workload::parse("a;b");
        assert_eq!(short.namespace, "b");
        assert_eq!(short.canonical_service, "");
        assert!(Health::Unknown.takes_traffic());
        assert!(!Health::Draining.takes_traffic());
    }
}
