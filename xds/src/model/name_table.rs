//! istiod's name table (NDS, `istio.networking.nds.v1.NameTable`): the hostnames of the mesh's
//! services with their addresses (auto-allocated ones included), which the DNS proxy answers
//! from. Plain data as istiod sent it; what a query may be answered with (short names, search
//! domain expansions, wildcards) is the DNS proxy's business, which knows the pod's namespace
//! and resolv.conf.

use std::collections::BTreeMap;
use std::net::IpAddr;

/// The registry whose hosts get the Kubernetes short forms (`name`, `name.namespace`,
/// `name.namespace.svc`), as pilot-agent reads `NameInfo.registry`.
pub const KUBERNETES: &str = "Kubernetes";

/// The whole table: hostname (as istiod wrote it, without the trailing dot) to its facts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NameTable {
    pub hosts: BTreeMap<String, NameInfo>,
}

/// One hostname's addresses and, for a Kubernetes service, its name and namespace.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NameInfo {
    /// In istiod's order; IPv4 and IPv6 mixed (A and AAAA answers split them).
    pub ips: Vec<IpAddr>,
    /// `Kubernetes`, `External`…: only Kubernetes hosts get short forms.
    pub registry: String,
    /// The Kubernetes service name.
    pub shortname: String,
    /// The Kubernetes namespace.
    pub namespace: String,
    /// More names for the same addresses (deprecated in Istio, still honoured by its agent).
    pub alt_hosts: Vec<String>,
}

impl NameInfo {
    /// Whether the host comes from the Kubernetes registry.
    pub fn is_kubernetes(&self) -> bool {
        self.registry == KUBERNETES
    }
}
