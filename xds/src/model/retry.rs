//! Retry policies, as Envoy's router reads a route's (or virtual host's) `retry_policy`.

use std::sync::Arc;
use std::time::Duration;

/// Envoy's `retry_on` conditions, as a set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RetryOn(u32);

impl RetryOn {
    /// Any 5xx response, and any reset, connect failure or per-try timeout.
    pub const FIVE_XX: RetryOn = RetryOn(1);
    /// A 502, 503 or 504 response, and any reset, connect failure or per-try timeout.
    pub const GATEWAY_ERROR: RetryOn = RetryOn(1 << 1);
    /// Any reset, connect failure or per-try timeout.
    pub const RESET: RetryOn = RetryOn(1 << 2);
    /// A reset before the request was sent (a connect failure).
    pub const RESET_BEFORE_REQUEST: RetryOn = RetryOn(1 << 3);
    pub const CONNECT_FAILURE: RetryOn = RetryOn(1 << 4);
    /// A 409.
    pub const RETRIABLE_4XX: RetryOn = RetryOn(1 << 5);
    /// An HTTP/2 REFUSED_STREAM.
    pub const REFUSED_STREAM: RetryOn = RetryOn(1 << 6);
    /// A status the policy's `retriable_status_codes` lists.
    pub const RETRIABLE_STATUS_CODES: RetryOn = RetryOn(1 << 7);
    /// A response with `x-envoy-ratelimited` (never retried otherwise).
    pub const ENVOY_RATELIMITED: RetryOn = RetryOn(1 << 8);
    /// HTTP/3 only: Remora never speaks HTTP/3 upstream, so it never arises.
    pub const HTTP3_POST_CONNECT_FAILURE: RetryOn = RetryOn(1 << 9);
    /// gRPC statuses in a response's headers (a trailers-only response).
    pub const GRPC_CANCELLED: RetryOn = RetryOn(1 << 10);
    pub const GRPC_DEADLINE_EXCEEDED: RetryOn = RetryOn(1 << 11);
    pub const GRPC_INTERNAL: RetryOn = RetryOn(1 << 12);
    pub const GRPC_RESOURCE_EXHAUSTED: RetryOn = RetryOn(1 << 13);
    pub const GRPC_UNAVAILABLE: RetryOn = RetryOn(1 << 14);

    /// Each condition by the name `retry_on` gives it.
    pub const NAMES: [(&'static str, RetryOn); 15] = [
        ("5xx", RetryOn::FIVE_XX),
        ("gateway-error", RetryOn::GATEWAY_ERROR),
        ("reset", RetryOn::RESET),
        ("reset-before-request", RetryOn::RESET_BEFORE_REQUEST),
        ("connect-failure", RetryOn::CONNECT_FAILURE),
        ("retriable-4xx", RetryOn::RETRIABLE_4XX),
        ("refused-stream", RetryOn::REFUSED_STREAM),
        ("retriable-status-codes", RetryOn::RETRIABLE_STATUS_CODES),
        ("envoy-ratelimited", RetryOn::ENVOY_RATELIMITED),
        (
            "http3-post-connect-failure",
            RetryOn::HTTP3_POST_CONNECT_FAILURE,
        ),
        ("cancelled", RetryOn::GRPC_CANCELLED),
        ("deadline-exceeded", RetryOn::GRPC_DEADLINE_EXCEEDED),
        ("internal", RetryOn::GRPC_INTERNAL),
        ("resource-exhausted", RetryOn::GRPC_RESOURCE_EXHAUSTED),
        ("unavailable", RetryOn::GRPC_UNAVAILABLE),
    ];

    /// Istio's default conditions (`route/retry/retry.go`).
    pub const ISTIO_DEFAULT: RetryOn = RetryOn(
        RetryOn::CONNECT_FAILURE.0
            | RetryOn::REFUSED_STREAM.0
            | RetryOn::GRPC_UNAVAILABLE.0
            | RetryOn::GRPC_CANCELLED.0
            | RetryOn::RETRIABLE_STATUS_CODES.0,
    );

    /// The condition named `name`.
    pub fn named(name: &str) -> Option<RetryOn> {
        RetryOn::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, c)| *c)
    }

    pub fn insert(&mut self, other: RetryOn) {
        self.0 |= other.0;
    }

    /// Whether any condition of `other` is in the set.
    pub fn any(self, other: RetryOn) -> bool {
        self.0 & other.0 != 0
    }

    /// The union of two sets.
    pub const fn or(self, other: RetryOn) -> RetryOn {
        RetryOn(self.0 | other.0)
    }

    pub fn bits(self) -> u32 {
        self.0
    }
}

/// A retry policy.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// `connect-failure`, `refused-stream`, `unavailable`, `cancelled`,
    /// `retriable-status-codes`, `5xx`, `gateway-error`, `reset`, … as written.
    pub retry_on: Vec<String>,
    /// The same, as a set.
    pub conditions: RetryOn,
    pub num_retries: u32,
    /// Each attempt's own deadline (`None`: the route's timeout bounds all tries together).
    pub per_try_timeout: Option<Duration>,
    /// Shared with each request that may retry on them (few, and usually none).
    pub retriable_status_codes: Arc<[u16]>,
    /// Avoid hosts already tried (`envoy.retry_host_predicates.previous_hosts`).
    pub avoid_previous_hosts: bool,
    /// How many times to pick again when the predicate rejects a host.
    pub host_selection_retry_max_attempts: u32,
    /// `envoy.retry_priorities.previous_priorities` (a VirtualService's
    /// `retryRemoteLocalities`, istiod's `update_frequency` 2): every this many attempts, the
    /// priorities they went to take no more of a retry's load.
    pub previous_priorities: Option<u32>,
    /// `retry_back_off`: the base interval and the cap (`None`: Envoy's 25 ms and ten times it).
    pub backoff_base: Option<Duration>,
    pub backoff_max: Option<Duration>,
}
