//! The DNS forwarder's counters, named as Istio's agent names them (`istio_agent_dns_*`), so
//! dashboards built for the agent read them unchanged.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// Counters of the DNS forwarder.
#[derive(Debug, Clone, Default)]
pub struct DnsMetrics {
    /// Queries received from the application, over UDP or TCP.
    pub requests: Counter,
    /// Exchanges with an upstream resolver (a query that fails over counts each attempt).
    pub upstream_requests: Counter,
    /// Upstream exchanges that failed or timed out.
    pub upstream_failures: Counter,
    /// Queries and TCP connections refused because the in-flight bound was reached.
    pub dropped: Counter,
}

impl DnsMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let m = DnsMetrics::default();
        registry.register(
            "istio_agent_dns_requests",
            "Total number of DNS requests",
            m.requests.clone(),
        );
        registry.register(
            "istio_agent_dns_upstream_requests",
            "Total number of DNS requests forwarded to upstream",
            m.upstream_requests.clone(),
        );
        registry.register(
            "istio_agent_dns_upstream_failures",
            "Total number of DNS failures",
            m.upstream_failures.clone(),
        );
        registry.register(
            "remora_dns_dropped",
            "DNS queries and TCP connections refused at the in-flight bound",
            m.dropped.clone(),
        );
        m
    }
}
