//! A cluster's circuit breakers: Envoy's `circuit_breakers.thresholds` at the default priority,
//! and the per-host connection limit. Every limit is a count shared by every connection and
//! worker of the proxy; past it a request is answered 503 `UO` at once.

/// Envoy's limit when a threshold leaves one unset (connections, pending and active requests).
pub const ENVOY_DEFAULT_LIMIT: u32 = 1024;
/// Envoy's limit on concurrent retries when a threshold leaves it unset.
pub const ENVOY_DEFAULT_RETRIES: u32 = 3;

/// The limits of one cluster (`u32::MAX`, istiod's default: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitBreakers {
    /// Upstream connections of the cluster (DestinationRule `tcp.maxConnections`).
    pub max_connections: u32,
    /// Requests waiting for a connection (`http.http1MaxPendingRequests`).
    pub max_pending_requests: u32,
    /// Requests in flight to the cluster (`http.http2MaxRequests`).
    pub max_requests: u32,
    /// Retries in flight to the cluster (`http.maxRetries`).
    pub max_retries: u32,
    /// `per_host_thresholds[].max_connections`: connections to any one endpoint (`None`: none).
    pub per_host_max_connections: Option<u32>,
}

impl Default for CircuitBreakers {
    /// A cluster without `circuit_breakers`: Envoy's own limits.
    fn default() -> Self {
        CircuitBreakers {
            max_connections: ENVOY_DEFAULT_LIMIT,
            max_pending_requests: ENVOY_DEFAULT_LIMIT,
            max_requests: ENVOY_DEFAULT_LIMIT,
            max_retries: ENVOY_DEFAULT_RETRIES,
            per_host_max_connections: None,
        }
    }
}

impl CircuitBreakers {
    /// istiod's thresholds when no DestinationRule sets a connection pool: no limit at all.
    pub const UNLIMITED: CircuitBreakers = CircuitBreakers {
        max_connections: u32::MAX,
        max_pending_requests: u32::MAX,
        max_requests: u32::MAX,
        max_retries: u32::MAX,
        per_host_max_connections: None,
    };

    /// Whether a connection bound applies (so the data path keeps count of connections).
    pub fn limits_connections(&self) -> bool {
        self.max_connections != u32::MAX || self.per_host_max_connections.is_some()
    }
}
