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

/// Envoy's text for an aborted request (its body, and a gRPC client's `grpc-message`).
const ABORT_TEXT: &str = "fault filter abort";

/// Serve the fault's delay if this request draws it, then draw the abort: the abort's
/// answer if it fires. Each draw is independent, as Envoy's runtime draws them.
pub async fn inject(fault: &FaultPolicy, flags: &mut Flags) -> Option<AbortStatus> {
    if let Some(delay) = fault.delay.as_ref() {
        if delay.fraction.hits(fastrand::u64(..)) {
            flags.insert(Flags::DI);
            tokio::time::sleep(delay.duration).await;
        }
    }
    let abort = fault.abort.as_ref()?;
    abort
        .fraction
        .hits(fastrand::u64(..))
        .then_some(abort.status)
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
        let mut flags = Flags::default();
        let started = tokio::time::Instant::now();
        let abort = inject(&policy(Some(1_000_000), Some(1_000_000)), &mut flags).await;
        assert_eq!(abort, Some(AbortStatus::Http(503)));
        assert_eq!(started.elapsed(), Duration::from_millis(200));
        // FI is the answer's (`abort_reply`).
        assert_eq!(flags.to_string(), "DI");
        let mut flags = Flags::default();
        let started = tokio::time::Instant::now();
        assert_eq!(inject(&policy(Some(0), Some(0)), &mut flags).await, None);
        assert!(flags.is_empty());
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn aborts_in_proportion() {
        let half = policy(None, Some(500_000));
        let mut aborted = 0;
        for _ in 0..2000 {
            if inject(&half, &mut Flags::default()).await.is_some() {
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
