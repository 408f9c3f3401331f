//! Which failed attempts a route's retry policy tries again, as Envoy's router decides
//! (`retry_on`, the retriable status codes, gRPC statuses in a trailers-only response), the
//! per-try timeout, and the back-off between attempts. Copied per request from the route
//! ([`RetryRules::of`]): a few words, and the shared list of status codes only when the
//! policy names some.

use super::errors::{ErrorKind, ProxyError};
use super::headers;
use super::routed::Routed;
use http::{HeaderMap, StatusCode};
use remora_xds::model::retry::{RetryOn, RetryPolicy};
use std::sync::Arc;
use std::time::Duration;

/// Envoy's cap on the back-off when a policy sets none: ten times the base.
const DEFAULT_MAX_FACTOR: u32 = 10;

/// A route's retry rules, for one request. Every request's state holds them, so what only
/// some VirtualService policies set is boxed apart.
#[derive(Debug, Clone, Default)]
pub struct RetryRules {
    pub on: RetryOn,
    /// `retriable_status_codes` (`None` when it lists none, as Istio's default policy).
    pub codes: Option<Arc<[u16]>>,
    /// The per-try timeout and back-off, when the policy sets either.
    pub timing: Option<Box<RetryTiming>>,
}

/// What a VirtualService's `retries` may add to Istio's default policy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RetryTiming {
    /// Each attempt's deadline for its response head.
    pub per_try_timeout: Option<Duration>,
    /// `retry_back_off`: base and cap (`None`: Remora's `http.retry_backoff`, ten times it).
    pub backoff: Option<(Duration, Duration)>,
    /// `retryRemoteLocalities`: Envoy's `previous_priorities` update frequency (a retry's
    /// priority load leaves out the priorities earlier attempts went to).
    pub previous_priorities: Option<u32>,
}

impl RetryRules {
    /// The rules of a route's policy (none without one).
    pub fn of(policy: Option<&RetryPolicy>) -> RetryRules {
        let Some(p) = policy else {
            return RetryRules::default();
        };
        let timing = RetryTiming {
            per_try_timeout: p.per_try_timeout,
            backoff: p.backoff_base.map(|base| {
                (
                    base,
                    p.backoff_max
                        .unwrap_or(base.saturating_mul(DEFAULT_MAX_FACTOR)),
                )
            }),
            previous_priorities: p.previous_priorities,
        };
        RetryRules {
            on: p.conditions,
            codes: (!p.retriable_status_codes.is_empty())
                .then(|| Arc::clone(&p.retriable_status_codes)),
            timing: (timing != RetryTiming::default()).then(|| Box::new(timing)),
        }
    }

    /// Each attempt's deadline for its response head.
    pub fn per_try_timeout(&self) -> Option<Duration> {
        self.timing.as_ref().and_then(|t| t.per_try_timeout)
    }

    /// The `previous_priorities` update frequency, when the policy has one.
    pub fn previous_priorities(&self) -> Option<u32> {
        self.timing.as_ref().and_then(|t| t.previous_priorities)
    }

    /// Whether a 503 is retried (what the HTTP/1.1 fast path asks).
    pub fn retries_503(&self) -> bool {
        self.on.any(RetryOn::FIVE_XX.or(RetryOn::GATEWAY_ERROR))
            || (self.on.any(RetryOn::RETRIABLE_STATUS_CODES)
                && self.codes.as_deref().is_some_and(|c| c.contains(&503)))
    }

    /// Whether the rules are Istio's default ones, which the HTTP/1.1 fast path's own retries
    /// follow: its conditions, no per-try timeout, the default back-off, and no status codes
    /// but 503.
    pub fn is_istio_default(&self) -> bool {
        self.on == RetryOn::ISTIO_DEFAULT
            && self.timing.is_none()
            && self.codes.as_deref().is_none_or(|c| c == [503])
    }

    /// Whether a response head asks for another attempt (Envoy's `wouldRetryFromHeaders`).
    pub fn on_status(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        // A rate limit an upstream Envoy answered is retried only when the policy says so.
        if headers.contains_key("x-envoy-ratelimited") {
            return self.on.any(RetryOn::ENVOY_RATELIMITED);
        }
        let code = status.as_u16();
        if self.on.any(RetryOn::FIVE_XX) && status.is_server_error() {
            return true;
        }
        if self.on.any(RetryOn::GATEWAY_ERROR) && matches!(code, 502..=504) {
            return true;
        }
        if self.on.any(RetryOn::RETRIABLE_4XX) && code == 409 {
            return true;
        }
        if self.on.any(RetryOn::RETRIABLE_STATUS_CODES)
            && self.codes.as_deref().is_some_and(|c| c.contains(&code))
        {
            return true;
        }
        let grpc = match headers::grpc_status(headers) {
            Some(1) => RetryOn::GRPC_CANCELLED,
            Some(4) => RetryOn::GRPC_DEADLINE_EXCEEDED,
            Some(8) => RetryOn::GRPC_RESOURCE_EXHAUSTED,
            Some(13) => RetryOn::GRPC_INTERNAL,
            Some(14) => RetryOn::GRPC_UNAVAILABLE,
            _ => return false,
        };
        self.on.any(grpc)
    }

    /// Whether a failed attempt is tried again (Envoy's `wouldRetryFromReset`): any reset,
    /// connect failure or per-try timeout with `reset`, `5xx` or `gateway-error`; a connect
    /// failure with `connect-failure` or `reset-before-request`; a refused stream with
    /// `refused-stream`. No endpoint, no cluster, or the client's own failure is never retried.
    pub fn on_error(&self, kind: ErrorKind) -> bool {
        let any_reset = RetryOn::RESET
            .or(RetryOn::FIVE_XX)
            .or(RetryOn::GATEWAY_ERROR);
        match kind {
            ErrorKind::ConnectFailed | ErrorKind::ConnectTimeout => self.on.any(
                any_reset
                    .or(RetryOn::CONNECT_FAILURE)
                    .or(RetryOn::RESET_BEFORE_REQUEST),
            ),
            ErrorKind::RefusedStream => self.on.any(any_reset.or(RetryOn::REFUSED_STREAM)),
            ErrorKind::ConnectionTerminated
            | ErrorKind::RemoteReset
            | ErrorKind::UpstreamProtocol
            | ErrorKind::Timeout => self.on.any(any_reset),
            _ => false,
        }
    }

    /// How long to wait before retry number `retry` (from 1): `default` is Remora's
    /// `http.retry_backoff`, for a policy without `retry_back_off`.
    pub fn backoff(&self, retry: u32, default: Duration) -> Duration {
        let (base, max) = self
            .timing
            .as_ref()
            .and_then(|t| t.backoff)
            .unwrap_or((default, default.saturating_mul(DEFAULT_MAX_FACTOR)));
        jittered(base, max, retry)
    }
}

/// The route's per-try timeout, when it has one: an attempt whose response head has not come
/// by then fails as a timeout (`UT`), which the policy may retry.
pub(super) fn per_try(routed: Option<&Routed>) -> Option<(Duration, &Routed)> {
    routed.and_then(|r| r.retry.per_try_timeout().map(|t| (t, r)))
}

/// An attempt's per-try timeout expired (`upstream`: the connection's original destination).
pub(super) fn per_try_expired(upstream: std::net::SocketAddr) -> ProxyError {
    ProxyError {
        kind: ErrorKind::Timeout,
        upstream,
        source: None,
    }
}

impl Routed {
    /// The deadline an attempt made `elapsed` after the request started is told, as Envoy's
    /// router computes it: what is left of the route's timeout, no more than the per-try
    /// timeout (the per-try timeout alone without a route timeout); `None` when nothing is
    /// left or there is no deadline.
    pub fn expected_timeout(&self, elapsed: Duration) -> Option<Duration> {
        let per_try = self.retry.per_try_timeout();
        let left = match self.timeout.filter(|t| !t.is_zero()) {
            Some(t) if t <= elapsed => return None,
            Some(t) => Some(t - elapsed),
            None => None,
        };
        match (left, per_try) {
            (Some(l), Some(p)) => Some(l.min(p)),
            (l, p) => l.or(p),
        }
        .filter(|t| !t.is_zero())
    }
}

/// Envoy's jittered exponential back-off: retry `n` waits a uniformly random time below
/// `base × 2ⁿ⁻¹`, capped at `max`.
pub fn jittered(base: Duration, max: Duration, retry: u32) -> Duration {
    let interval = base
        .saturating_mul(1u32 << retry.saturating_sub(1).min(20))
        .min(max);
    let millis = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(fastrand::u64(0..millis.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(on: &[&str], codes: &[u16]) -> RetryRules {
        let mut set = RetryOn::default();
        for name in on {
            set.insert(RetryOn::named(name).expect("condition"));
        }
        RetryRules {
            on: set,
            codes: (!codes.is_empty()).then(|| codes.into()),
            ..RetryRules::default()
        }
    }

    fn status(r: &RetryRules, code: u16, grpc: Option<&str>) -> bool {
        let mut h = HeaderMap::new();
        if let Some(g) = grpc {
            h.insert("grpc-status", g.parse().expect("value"));
        }
        r.on_status(StatusCode::from_u16(code).expect("status"), &h)
    }

    #[test]
    fn istios_default_policy_retries_no_503_unless_listed() {
        let default = rules(
            &[
                "connect-failure",
                "refused-stream",
                "unavailable",
                "cancelled",
                "retriable-status-codes",
            ],
            &[],
        );
        assert!(default.is_istio_default());
        assert!(!status(&default, 503, None));
        assert!(!default.retries_503());
        assert!(status(&default, 200, Some("14")));
        assert!(status(&default, 200, Some("1")));
        assert!(!status(&default, 200, Some("13")));
        assert!(default.on_error(ErrorKind::ConnectFailed));
        assert!(default.on_error(ErrorKind::RefusedStream));
        assert!(!default.on_error(ErrorKind::ConnectionTerminated));
        assert!(!default.on_error(ErrorKind::Timeout));
        let earlier = rules(
            &[
                "connect-failure",
                "refused-stream",
                "unavailable",
                "cancelled",
                "retriable-status-codes",
            ],
            &[503],
        );
        assert!(earlier.is_istio_default() && earlier.retries_503());
    }

    #[test]
    fn each_condition_retries_what_envoy_retries() {
        let five = rules(&["5xx"], &[]);
        assert!(status(&five, 500, None) && status(&five, 503, None));
        assert!(!status(&five, 409, None) && !status(&five, 200, Some("14")));
        assert!(five.on_error(ErrorKind::ConnectionTerminated));
        assert!(five.on_error(ErrorKind::Timeout));
        assert!(five.on_error(ErrorKind::ConnectFailed));
        assert!(!five.on_error(ErrorKind::NoHealthyUpstream));
        assert!(!five.is_istio_default() && five.retries_503());
        let gateway = rules(&["gateway-error"], &[]);
        assert!(status(&gateway, 502, None) && status(&gateway, 504, None));
        assert!(!status(&gateway, 500, None));
        let four = rules(&["retriable-4xx"], &[]);
        assert!(status(&four, 409, None) && !status(&four, 404, None));
        let codes = rules(&["retriable-status-codes"], &[418]);
        assert!(status(&codes, 418, None) && !status(&codes, 503, None));
        let listed_only = rules(&["5xx"], &[418]);
        assert!(
            !status(&listed_only, 418, None),
            "codes need their condition"
        );
        let reset = rules(&["reset"], &[]);
        assert!(reset.on_error(ErrorKind::RemoteReset) && !status(&reset, 503, None));
        let connect = rules(&["connect-failure"], &[]);
        assert!(connect.on_error(ErrorKind::ConnectTimeout));
        assert!(!connect.on_error(ErrorKind::RemoteReset));
        let before = rules(&["reset-before-request"], &[]);
        assert!(before.on_error(ErrorKind::ConnectFailed));
        assert!(!before.on_error(ErrorKind::ConnectionTerminated));
        let grpc = rules(
            &["deadline-exceeded", "internal", "resource-exhausted"],
            &[],
        );
        assert!(status(&grpc, 200, Some("4")) && status(&grpc, 200, Some("13")));
        assert!(status(&grpc, 200, Some("8")) && !status(&grpc, 200, Some("14")));
        let mut limited = HeaderMap::new();
        limited.insert("x-envoy-ratelimited", "true".parse().expect("value"));
        assert!(!five.on_status(StatusCode::SERVICE_UNAVAILABLE, &limited));
        let ratelimited = rules(&["envoy-ratelimited"], &[]);
        assert!(ratelimited.on_status(StatusCode::TOO_MANY_REQUESTS, &limited));
    }

    #[test]
    fn backoff_doubles_within_its_cap() {
        let base = Duration::from_millis(25);
        let max = Duration::from_millis(250);
        for retry in 1..10 {
            let bound = (base * (1 << (retry - 1))).min(max);
            for _ in 0..50 {
                let d = jittered(base, max, retry);
                assert!(d < bound, "retry {retry}: {d:?} ≥ {bound:?}");
            }
        }
        let custom = RetryRules {
            timing: Some(Box::new(RetryTiming {
                per_try_timeout: None,
                backoff: Some((Duration::from_millis(100), Duration::from_millis(150))),
                previous_priorities: None,
            })),
            ..RetryRules::default()
        };
        assert!((0..50).all(|_| custom.backoff(5, base) < Duration::from_millis(150)));
        assert!((0..50).all(|_| RetryRules::default().backoff(1, base) < base));
    }
}
