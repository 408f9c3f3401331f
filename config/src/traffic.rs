//! How proxied connections are handled once their protocol is known: opaque TCP (its idle
//! timeout) and HTTP (limits, timeouts, the upstream connection pool and retries).

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Opaque TCP connections (Envoy's `tcp_proxy`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TcpConfig {
    /// A connection over which no byte has moved either way for this long is closed, both
    /// sides; `0s` keeps idle connections for ever. Envoy's and Istio's default is one hour;
    /// Istio's `ISTIO_META_IDLE_TIMEOUT` in the environment sets it.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            idle_timeout: Duration::from_secs(3600),
        }
    }
}

impl TcpConfig {
    /// The idle timeout, if there is one.
    pub fn idle(&self) -> Option<Duration> {
        Some(self.idle_timeout).filter(|d| !d.is_zero())
    }
}

/// HTTP limits and timeouts, the upstream connection pool and the retry policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Bound on receiving an HTTP/1.1 request head, from its first byte to its end (against
    /// slowloris); a slower one is answered 408. The wait between requests is not counted.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Largest request header block, request line included (Envoy's `max_request_headers_kb`,
    /// 60 KiB). Larger is answered 431.
    pub max_header_bytes: usize,
    /// Most request headers (Envoy's `max_headers_count`, 100). More is answered 431.
    pub max_headers: usize,
    /// A downstream connection with no request in flight and no traffic for this long is
    /// closed; this alone bounds an idle keep-alive connection.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Concurrent streams a downstream HTTP/2 client may open.
    pub max_concurrent_streams: u32,
    /// Bound on a whole request, response headers included; `0s` is none, as in Istio.
    /// `grpc-timeout` applies per request in any case.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// An idle pooled upstream connection is closed after this long.
    #[serde(with = "humantime_serde")]
    pub pool_idle_timeout: Duration,
    /// Most idle HTTP/1.1 connections kept per upstream; more are closed when they come back.
    pub pool_max_idle_per_upstream: usize,
    /// Retries of an outbound request (Istio's default policy: 2). `0` turns retries off.
    pub retries: u32,
    /// Largest request body kept for replay; a longer request is not retried.
    pub retry_buffer_bytes: usize,
    /// First back-off between attempts; it doubles per retry, with jitter (Envoy's 25 ms).
    #[serde(with = "humantime_serde")]
    pub retry_backoff: Duration,
    /// Serve plain HTTP/1.1 requests with Remora's own exchange (one task, no buffers while
    /// idle) and hand anything else (upgrades, chunked or large request bodies, HTTP/1.0,
    /// malformed or slow heads) to the general HTTP server. `false` sends every connection
    /// through the general server.
    pub fast_path: bool,
    /// Bound on waiting for an HTTP/1.1 request body, from the end of its head, extended by
    /// one second per `request_body_min_rate` bytes received (against slow bodies); a body
    /// past it is cut, answered 408 if no response has begun. Only time spent waiting for the
    /// client counts. `0s` turns the bound off.
    #[serde(with = "humantime_serde")]
    pub request_body_timeout: Duration,
    /// The pace, in bytes per second, that earns a request body more time past
    /// `request_body_timeout`.
    pub request_body_min_rate: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            header_read_timeout: Duration::from_secs(30),
            max_header_bytes: 60 * 1024,
            max_headers: 100,
            idle_timeout: Duration::from_secs(3600),
            max_concurrent_streams: 1024,
            request_timeout: Duration::ZERO,
            pool_idle_timeout: Duration::from_secs(30),
            pool_max_idle_per_upstream: 64,
            retries: 2,
            retry_buffer_bytes: 64 * 1024,
            retry_backoff: Duration::from_millis(25),
            fast_path: true,
            request_body_timeout: Duration::from_secs(30),
            request_body_min_rate: 1024,
        }
    }
}
