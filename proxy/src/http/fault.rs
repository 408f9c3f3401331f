//! Fault injection, as Envoy's fault filter does it with a route's config
//! ([`remora_xds::model::fault`]): before the request is forwarded (and before the route's
//! timeout starts, which Envoy's router starts after the filters before it), a delay on its
//! fraction of requests (flag `DI`), then, independently, an abort on its fraction (flag
//! `FI`), answered here and never sent upstream: the status with Envoy's body
//! `fault filter abort`, or for a gRPC abort HTTP 200 with the `grpc-status`; a gRPC client
//! gets a trailers-only answer either way.

use super::body::{RequestEnd, ResponseBody};
use super::errors::Flags;
use super::headers::{GRPC_MESSAGE, GRPC_STATUS};
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use remora_xds::model::fault::{AbortStatus, FaultPolicy};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Envoy's text for an aborted request (its body, and a gRPC client's `grpc-message`).
const ABORT_TEXT: &str = "fault filter abort";

/// Serve the fault's delay if this request draws it, then draw the abort: the abort's
/// answer if it fires. Each draw is independent, as Envoy's runtime draws them. Each fault
/// injected is counted in `counters` (the connection manager's, as Envoy's filter counts).
pub async fn inject(
    fault: &FaultPolicy,
    flags: &mut Flags,
    counters: Option<Arc<FaultCounters>>,
) -> Option<AbortStatus> {
    let count = |c: fn(&FaultCounters) -> &AtomicU64| {
        if let Some(counters) = &counters {
            c(counters).fetch_add(1, Ordering::Relaxed);
        }
    };
    if let Some(delay) = fault.delay.as_ref() {
        if delay.fraction.hits(fastrand::u64(..)) {
            flags.insert(Flags::DI);
            count(|c| &c.delays_injected);
            tokio::time::sleep(delay.duration).await;
        }
    }
    let abort = fault.abort.as_ref()?;
    let fired = abort.fraction.hits(fastrand::u64(..));
    if fired {
        count(|c| &c.aborts_injected);
    }
    fired.then_some(abort.status)
}

/// Envoy's fault filter statistics of one connection manager
/// (`http.<stat_prefix>.fault.delays_injected`, `aborts_injected`).
#[derive(Debug, Default)]
pub struct FaultCounters {
    pub delays_injected: AtomicU64,
    pub aborts_injected: AtomicU64,
}

/// The fault counters of every connection manager with the fault filter, by stat prefix,
/// made when a fault is first injected on one (as Envoy's appear with the filter).
pub type FaultStats = crate::metrics::per_prefix::PerPrefix<FaultCounters>;

impl FaultStats {
    /// Each connection manager's `(stat prefix, delays injected, aborts injected)`.
    pub fn snapshot(&self) -> Vec<(Arc<str>, u64, u64)> {
        let v = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.each()
            .into_iter()
            .map(|(p, c)| (p, v(&c.delays_injected), v(&c.aborts_injected)))
            .collect()
    }
}

/// The answer to an aborted request.
pub fn abort_reply(status: AbortStatus, grpc: bool, mut end: RequestEnd) -> Response<ResponseBody> {
    end.flags.insert(Flags::FI);
    let (http_status, grpc_status) = match status {
        AbortStatus::Http(s) => (s, http_to_grpc(s)),
        AbortStatus::Grpc(g) => (200, g),
    };
    let mut builder = Response::builder();
    let body = if grpc {
        builder = builder
            .status(StatusCode::OK)
            .header(CONTENT_TYPE, "application/grpc")
            .header(&GRPC_STATUS, HeaderValue::from(grpc_status))
            .header(&GRPC_MESSAGE, HeaderValue::from_static(ABORT_TEXT));
        end.status = 200;
        end.grpc_status = Some(grpc_status);
        Bytes::new()
    } else {
        builder = builder
            .status(http_status)
            .header(CONTENT_TYPE, "text/plain");
        end.status = http_status;
        Bytes::from_static(ABORT_TEXT.as_bytes())
    };
    if let Some(log) = &mut end.log {
        log.status = end.status;
        log.envoy.details = Some("fault_filter_abort");
    }
    match builder.body(()) {
        Ok(r) => r.map(|()| ResponseBody::local(body, end)),
        // The status is in [200, 600) (the converter's bound): unreachable in practice.
        Err(_) => Response::new(ResponseBody::local(body, end)),
    }
}

/// The gRPC status Envoy gives a local reply's HTTP status (`Grpc::Utility::httpToGrpcStatus`).
fn http_to_grpc(status: u16) -> u32 {
    match status {
        // INTERNAL
        400 => 13,
        // UNAUTHENTICATED
        401 => 16,
        // PERMISSION_DENIED
        403 => 7,
        // UNIMPLEMENTED
        404 => 12,
        // UNAVAILABLE
        429 | 502..=504 => 14,
        // UNKNOWN
        _ => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_xds::model::fault::{FaultAbort, FaultDelay, Fraction};
    use std::time::Duration;

    fn policy(delay: Option<u32>, abort: Option<u32>) -> FaultPolicy {
        FaultPolicy {
            delay: delay.map(|per_million| FaultDelay {
                duration: Duration::from_millis(200),
                fraction: Fraction::new(per_million, 1_000_000).expect("fraction"),
            }),
            abort: abort.map(|per_million| FaultAbort {
                status: AbortStatus::Http(503),
                fraction: Fraction::new(per_million, 1_000_000).expect("fraction"),
            }),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_delay_then_an_abort_with_both_flags() {
        let stats = FaultStats::default();
        let counters = || Some(stats.of(&Arc::from("outbound_0.0.0.0_80")));
        let mut flags = Flags::default();
        let started = tokio::time::Instant::now();
        let both = policy(Some(1_000_000), Some(1_000_000));
        let abort = inject(&both, &mut flags, counters()).await;
        assert_eq!(abort, Some(AbortStatus::Http(503)));
        assert_eq!(started.elapsed(), Duration::from_millis(200));
        // FI is the answer's (`abort_reply`).
        assert_eq!(flags.to_string(), "DI");
        let mut flags = Flags::default();
        let started = tokio::time::Instant::now();
        let never = policy(Some(0), Some(0));
        assert_eq!(inject(&never, &mut flags, counters()).await, None);
        assert!(flags.is_empty());
        assert_eq!(started.elapsed(), Duration::ZERO);
        // One delay and one abort counted, under the connection manager's prefix.
        assert_eq!(stats.snapshot(), [(Arc::from("outbound_0.0.0.0_80"), 1, 1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn aborts_in_proportion() {
        let half = policy(None, Some(500_000));
        let mut aborted = 0;
        for _ in 0..2000 {
            if inject(&half, &mut Flags::default(), None).await.is_some() {
                aborted += 1;
            }
        }
        // 1000 expected, a standard deviation of about 22: six of them either way.
        assert!((868..=1132).contains(&aborted), "{aborted} of 2000");
    }

    #[test]
    fn grpc_statuses_of_http_aborts_as_envoy_maps_them() {
        assert_eq!(http_to_grpc(503), 14);
        assert_eq!(http_to_grpc(400), 13);
        assert_eq!(http_to_grpc(404), 12);
        assert_eq!(http_to_grpc(500), 2);
    }
}
