//! Why no endpoint was chosen for a request or connection.

use super::transport::TransportError;

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
    /// A circuit breaker is open: answered at once, never sent upstream.
    #[error("cluster {0}: circuit breaker open")]
    Overflow(String),
    /// Every connection the cluster may have is in use: an HTTP request waits for one as
    /// a pending request ([`super::Upstreams::wait_for_connection`]).
    #[error("cluster {0}: connection limit reached")]
    ConnectionsFull(String),
}

impl UpstreamError {
    /// Envoy's response flag for it.
    pub fn response_flag(&self) -> &'static str {
        match self {
            UpstreamError::NoCluster(_) => "NC",
            UpstreamError::NoHealthyUpstream(_) => "UH",
            UpstreamError::Transport { .. } => "UF",
            UpstreamError::Overflow(_) | UpstreamError::ConnectionsFull(_) => "UO",
        }
    }
}
