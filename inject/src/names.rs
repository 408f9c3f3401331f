//! The names injection reads and writes: Istio's annotations, labels and container names.
//!
//! They are Istio's on purpose. Users already write these annotations, Istio's CNI plugin and
//! tooling read the container names, and a pod injected by Remora should look like an
//! Istio-injected pod to everything around it.

/// The proxy container. Istio's CNI plugin only captures pods that have a container of this name.
pub const PROXY_CONTAINER: &str = "istio-proxy";
/// The capture init container that installs the rules (root, NET_ADMIN and NET_RAW).
pub const INIT_CONTAINER: &str = "istio-init";
/// The CNI-mode init container that only checks the rules the CNI plugin installed.
pub const VALIDATION_CONTAINER: &str = "istio-validation";

/// Annotation and label keys.
pub mod key {
    pub const INJECT: &str = "sidecar.istio.io/inject";
    pub const STATUS: &str = "sidecar.istio.io/status";
    pub const TEMPLATES: &str = "inject.istio.io/templates";
    pub const REVISION: &str = "istio.io/rev";
    pub const NATIVE_SIDECAR: &str = "sidecar.istio.io/nativeSidecar";
    pub const INTERCEPTION_MODE: &str = "sidecar.istio.io/interceptionMode";
    pub const STATUS_PORT: &str = "status.sidecar.istio.io/port";
    pub const READINESS_INITIAL_DELAY: &str =
        "readiness.status.sidecar.istio.io/initialDelaySeconds";
    pub const READINESS_PERIOD: &str = "readiness.status.sidecar.istio.io/periodSeconds";
    pub const READINESS_FAILURE_THRESHOLD: &str =
        "readiness.status.sidecar.istio.io/failureThreshold";
    pub const INCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/includeOutboundIPRanges";
    pub const EXCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/excludeOutboundIPRanges";
    pub const INCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeInboundPorts";
    pub const EXCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeInboundPorts";
    pub const INCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeOutboundPorts";
    pub const EXCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeOutboundPorts";
    pub const EXCLUDE_INTERFACES: &str = "traffic.sidecar.istio.io/excludeInterfaces";
    pub const KUBEVIRT_INTERFACES: &str = "traffic.sidecar.istio.io/kubevirtInterfaces";
    pub const REROUTE_VIRTUAL_INTERFACES: &str = "istio.io/reroute-virtual-interfaces";
    pub const AGENT_LOG_LEVEL: &str = "sidecar.istio.io/agentLogLevel";
    pub const PROXY_LOG_LEVEL: &str = "sidecar.istio.io/logLevel";
    pub const PROXY_CONFIG: &str = "proxy.istio.io/config";
    pub const PROXY_OVERRIDES: &str = "proxy.istio.io/overrides";
    pub const PROXY_IMAGE: &str = "sidecar.istio.io/proxyImage";
    pub const PROXY_CPU: &str = "sidecar.istio.io/proxyCPU";
    pub const PROXY_MEMORY: &str = "sidecar.istio.io/proxyMemory";
    pub const PROXY_CPU_LIMIT: &str = "sidecar.istio.io/proxyCPULimit";
    pub const PROXY_MEMORY_LIMIT: &str = "sidecar.istio.io/proxyMemoryLimit";
    pub const CAP_NET_BIND_SERVICE: &str = "sidecar.istio.io/capNetBindService";
    pub const REWRITE_APP_PROBERS: &str = "sidecar.istio.io/rewriteAppHTTPProbers";
    pub const USER_VOLUME: &str = "sidecar.istio.io/userVolume";
    pub const USER_VOLUME_MOUNT: &str = "sidecar.istio.io/userVolumeMount";
    pub const MERGE_METRICS: &str = "prometheus.istio.io/merge-metrics";
    pub const PROMETHEUS_SCRAPE: &str = "prometheus.io/scrape";
    pub const PROMETHEUS_PORT: &str = "prometheus.io/port";
    pub const PROMETHEUS_PATH: &str = "prometheus.io/path";
    pub const PROMETHEUS_SCRAPE_TARGETS: &str = "prometheus.istio.io/scrape-targets";
    pub const DEFAULT_CONTAINER: &str = "kubectl.kubernetes.io/default-container";
    pub const DEFAULT_LOGS_CONTAINER: &str = "kubectl.kubernetes.io/default-logs-container";
    pub const MULTUS_NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
    pub const TLS_MODE: &str = "security.istio.io/tlsMode";
    pub const CANONICAL_NAME: &str = "service.istio.io/canonical-name";
    pub const CANONICAL_REVISION: &str = "service.istio.io/canonical-revision";
    pub const WORKLOAD_NAME: &str = "service.istio.io/workload-name";
    pub const NETWORK: &str = "topology.istio.io/network";
    pub const APP_NAME: &str = "app.kubernetes.io/name";
    pub const APP_VERSION: &str = "app.kubernetes.io/version";
    pub const OPENSHIFT_UID_RANGE: &str = "openshift.io/sa.scc.uid-range";
    pub const OPENSHIFT_SUPPLEMENTAL_GROUPS: &str = "openshift.io/sa.scc.supplemental-groups";
}

/// Ports of the injected proxy, as Istio's sidecar has them.
pub mod port {
    /// Outbound capture (`-p`).
    pub const OUTBOUND: u16 = 15001;
    /// Inbound capture (`-z`).
    pub const INBOUND: u16 = 15006;
    /// Readiness: `GET /healthz/ready`.
    pub const READINESS: u16 = 15021;
    /// Proxy metrics: `GET /stats/prometheus`.
    pub const METRICS: u16 = 15090;
    /// The agent (Istio's status port): merged metrics and rewritten application probes.
    pub const AGENT: u16 = 15020;
    /// Ports the proxy itself listens on (admin, capture, tunnel, agent, readiness, metrics):
    /// an application cannot be scraped there.
    pub const RESERVED: [u16; 7] = [15000, 15001, 15006, 15008, 15020, 15021, 15090];
}
