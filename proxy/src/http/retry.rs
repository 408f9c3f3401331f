//! Istio's default retry policy for outbound requests, and the request body that makes a retry
//! possible.
//!
//! Istio retries up to twice on `connect-failure`, `refused-stream`, `unavailable`, `cancelled`
//! and `retriable-status-codes` (503). A request can only be sent again if its body can be: a
//! request without one always can; one with a body can while the body read so far fits in
//! `http.retry_buffer_bytes`. The body is still streamed to the first attempt as it arrives (no
//! added latency); a copy is kept on the side, and dropped as soon as it outgrows the bound.

use super::counting::BodyCounter;
use super::headers;
use super::mirror::ClientBody;
use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

/// Envoy's cap on the back-off between attempts (ten times the 25 ms base).
const MAX_BACKOFF_FACTOR: u32 = 10;

/// How many times one request may be sent again because the server's GOAWAY refused it,
/// beyond its retries: a connection that closes after a request limit (nginx's
/// `keepalive_requests`) can refuse the same request on each of a few new connections in a row
/// while many requests race for them.
pub const GO_AWAY_RESENDS: u32 = 3;

/// Whether a response asks for a retry: a 503 (when `retry_503`: Istio's default policy as
/// earlier istiods wrote it, and a route whose `retriable_status_codes` lists it), or a
/// trailers-only gRPC response with UNAVAILABLE (14) or CANCELLED (1).
pub fn retry_on_response<B>(response: &Response<B>, retry_503: bool) -> bool {
    (retry_503 && response.status() == StatusCode::SERVICE_UNAVAILABLE)
        || matches!(headers::grpc_status(response.headers()), Some(1 | 14))
}

/// How long to wait before retry number `retry` (1-based): exponential with full jitter,
/// as Envoy backs off.
pub fn backoff(base: Duration, retry: u32) -> Duration {
    let factor = (1u32 << retry.min(8))
        .saturating_sub(1)
        .min(MAX_BACKOFF_FACTOR);
    let max = base.saturating_mul(factor);
    let millis = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(fastrand::u64(0..=millis))
}

/// A request body that every attempt reads from the start. Clones share the client's body and
/// the copy kept of it.
#[derive(Debug)]
pub struct ReplayBody {
    shared: Arc<Mutex<Shared>>,
    /// Chunks this replica has yielded, counted from the start of the body.
    next: usize,
    trailers_sent: bool,
    exact_len: Option<u64>,
}

#[derive(Debug)]
struct Shared {
    inner: ClientBody,
    /// The chunks read so far, from chunk number `discarded` on.
    chunks: Vec<Bytes>,
    discarded: usize,
    buffered: usize,
    limit: usize,
    /// The body outgrew `limit`: the copy is gone and no new replica can replay it.
    overflowed: bool,
    trailers: Option<HeaderMap>,
    done: bool,
    /// Bytes read from the client, for the access log.
    received: Option<Arc<BodyCounter>>,
}

/// Why a replica cannot go on.
#[derive(Debug, thiserror::Error)]
#[error("request body longer than the retry buffer cannot be sent again")]
pub struct NotReplayable;

impl ReplayBody {
    /// Wrap the client's body, keeping at most `limit` bytes of it for replays.
    pub fn new(inner: ClientBody, limit: usize, received: Option<Arc<BodyCounter>>) -> Self {
        let exact_len = inner.size_hint().exact();
        ReplayBody {
            shared: Arc::new(Mutex::new(Shared {
                inner,
                chunks: Vec::new(),
                discarded: 0,
                buffered: 0,
                limit,
                overflowed: false,
                trailers: None,
                done: false,
                received,
            })),
            next: 0,
            trailers_sent: false,
            exact_len,
        }
    }

    /// A body for another attempt, from the start; `None` if the copy was given up.
    pub fn replay(&self) -> Option<ReplayBody> {
        let shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        if shared.overflowed {
            return None;
        }
        Some(ReplayBody {
            shared: Arc::clone(&self.shared),
            next: 0,
            trailers_sent: false,
            exact_len: self.exact_len,
        })
    }
}

impl Body for ReplayBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        // Held for this poll only, never across an await; the inner poll does not block.
        let mut s = this.shared.lock().unwrap_or_else(PoisonError::into_inner);
        if this.next < s.discarded {
            return Poll::Ready(Some(Err(NotReplayable.into())));
        }
        if let Some(chunk) = s.chunks.get(this.next - s.discarded) {
            this.next += 1;
            return Poll::Ready(Some(Ok(Frame::data(chunk.clone()))));
        }
        if s.done {
            if !this.trailers_sent {
                this.trailers_sent = true;
                if let Some(t) = &s.trailers {
                    return Poll::Ready(Some(Ok(Frame::trailers(t.clone()))));
                }
            }
            return Poll::Ready(None);
        }
        match Pin::new(&mut s.inner).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                s.done = true;
                this.trailers_sent = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(Some(Ok(frame))) => {
                let frame = match frame.into_data() {
                    Ok(data) => {
                        this.next += 1;
                        if let Some(counter) = &s.received {
                            counter.data(&data);
                        }
                        if !s.overflowed && s.buffered + data.len() <= s.limit {
                            s.buffered += data.len();
                            s.chunks.push(data.clone());
                        } else {
                            // Too long to keep: free the copy; this attempt streams on.
                            s.overflowed = true;
                            s.discarded += s.chunks.len() + 1;
                            s.chunks = Vec::new();
                            s.buffered = 0;
                        }
                        // Known now when the client's last frame carried the end of the
                        // stream: said at once, the upstream's last DATA frame carries it
                        // too, rather than an empty DATA frame (one more write) after it.
                        if s.inner.is_end_stream() {
                            s.done = true;
                        }
                        Frame::data(data)
                    }
                    Err(frame) => {
                        if let Some(t) = frame.trailers_ref() {
                            s.trailers = Some(t.clone());
                            s.done = true;
                            this.trailers_sent = true;
                        }
                        frame
                    }
                };
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        let s = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        s.done
            && self.next >= s.discarded + s.chunks.len()
            && (self.trailers_sent || s.trailers.is_none())
    }

    fn size_hint(&self) -> SizeHint {
        match self.exact_len {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_stays_within_envoys_bounds() {
        let base = Duration::from_millis(25);
        for retry in 1..6 {
            let d = backoff(base, retry);
            assert!(d <= base * MAX_BACKOFF_FACTOR, "{d:?}");
        }
        assert!(backoff(base, 1) <= base);
    }

    #[test]
    fn retriable_responses() {
        let r = |status: u16, grpc: Option<&str>| {
            let mut b = Response::builder().status(status);
            if let Some(g) = grpc {
                b = b.header("grpc-status", g);
            }
            retry_on_response(&b.body(()).unwrap(), true)
        };
        assert!(r(503, None));
        assert!(!r(502, None));
        assert!(!r(200, None));
        assert!(r(200, Some("14")));
        assert!(r(200, Some("1")));
        assert!(!r(200, Some("0")));
        assert!(!r(200, Some("13")));
        // A policy that lists no 503 (current istiod's default) does not retry one; gRPC's
        // UNAVAILABLE still is.
        let unlisted = |status: u16, grpc: Option<&str>| {
            let mut b = Response::builder().status(status);
            if let Some(g) = grpc {
                b = b.header("grpc-status", g);
            }
            retry_on_response(&b.body(()).unwrap(), false)
        };
        assert!(!unlisted(503, None));
        assert!(unlisted(200, Some("14")));
    }
}
