//! HTTP/2 client connections: a bound over all streams on the response bytes queued inside the
//! connection and not yet written to the client's socket (Envoy's
//! `per_connection_buffer_limit_bytes`, whose default is [`CONNECTION_SEND_BUDGET`]).
//!
//! h2 bounds what it queues per stream (`max_send_buf_size`), not per connection, so a client
//! that grants every window and reads nothing could make Remora queue that much on each of
//! its streams. Each response body on an HTTP/2 client connection ([`Budgeted`]) takes a chunk
//! from its upstream only while the connection has less than the budget queued; bytes leave the
//! count as the connection writes them to the socket ([`SendBudget::written`]). A body that
//! waits for room does not poll its upstream, whose stream window then closes: what waits
//! upstream is bounded by the upstream connection's stream window ([`super::pool`]).
//!
//! The count is an estimate from two ends that do not see each other's bytes one for one:
//! - the socket also carries frame and header bytes, which make the count fall a little faster
//!   than the DATA leaves (it never goes below zero, so they cannot build up credit);
//! - a stream reset by the client has its queue dropped by h2 unwritten: its body, dropped
//!   before its end, gives back what it took, up to what h2 can have queued for one stream
//!   (without this a connection's count would leak towards the budget with each reset, and
//!   could stall the connection). What it gives back may already have been written, so a
//!   client that resets streams it read part of can bring the count below the truth; h2's
//!   per-stream bound still holds then.
//!
//! Streams polled in the same instant may each take a chunk past the budget, by at most a
//! chunk (a DATA frame of 16 KiB, or a read of an HTTP/1.1 upstream's 64 KiB) per worker thread.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

/// Response bytes an HTTP/2 client connection queues at most before its streams wait: Envoy's
/// default `per_connection_buffer_limit_bytes`, which Istio leaves for sidecars. It is sixteen
/// of h2's per-stream send buffers ([`super::h2_server::MAX_SEND_BUF`]), so that many streams, or one
/// stream with the socket as far behind, keep moving at full speed.
pub const CONNECTION_SEND_BUDGET: usize = 1 << 20;

/// The response bytes queued on one HTTP/2 client connection, and the streams waiting for room.
#[derive(Debug, Default)]
pub struct SendBudget {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    queued: usize,
    waiting: Vec<Waker>,
}

impl SendBudget {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a stream may take another chunk now; if not, `cx` is woken when it may.
    fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.lock();
        if state.queued < CONNECTION_SEND_BUDGET {
            return Poll::Ready(());
        }
        if !state.waiting.iter().any(|w| w.will_wake(cx.waker())) {
            state.waiting.push(cx.waker().clone());
        }
        Poll::Pending
    }

    fn take(&self, n: usize) {
        let mut state = self.lock();
        state.queued = state.queued.saturating_add(n);
    }

    /// `n` bytes left for the client's socket.
    pub fn written(&self, n: usize) {
        let woken = {
            let mut state = self.lock();
            if state.queued == 0 {
                return;
            }
            state.queued = state.queued.saturating_sub(n);
            if state.queued >= CONNECTION_SEND_BUDGET || state.waiting.is_empty() {
                return;
            }
            std::mem::take(&mut state.waiting)
        };
        // Woken outside the lock: a waker may run its task at once.
        for w in woken {
            w.wake();
        }
    }

    /// Bytes counted as queued now (tests).
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.lock().queued
    }
}

/// The most h2 queues for one stream: its send buffer and the chunk that went past it
/// (hyper hands h2 a whole chunk once the stream has any room).
const MAX_QUEUED_PER_STREAM: usize = super::h2_server::MAX_SEND_BUF + 64 * 1024;

/// A response body on an HTTP/2 client connection, which takes its chunks within the
/// connection's [`SendBudget`]; on an HTTP/1.1 connection (no budget), the body as it is.
#[derive(Debug)]
pub struct Budgeted<B> {
    inner: B,
    budget: Option<Arc<SendBudget>>,
    /// Bytes this body handed to h2.
    taken: usize,
    /// The body reached its end: whatever it handed to h2 is written in time.
    ended: bool,
}

impl<B: Body> Budgeted<B> {
    pub fn new(inner: B, budget: Option<Arc<SendBudget>>) -> Self {
        Budgeted {
            ended: inner.is_end_stream(),
            inner,
            budget,
            taken: 0,
        }
    }
}

impl<B> Body for Budgeted<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if let Some(budget) = &this.budget {
            std::task::ready!(budget.poll_room(cx));
        }
        let frame = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let (Some(d), Some(budget)) = (f.data_ref(), &this.budget) {
                    budget.take(d.len());
                    this.taken = this.taken.saturating_add(d.len());
                }
                this.ended = this.inner.is_end_stream();
            }
            None => this.ended = true,
            // hyper resets the stream: h2 drops its queue.
            Some(Err(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for Budgeted<B> {
    fn drop(&mut self) {
        // Dropped before its end: the stream was reset (by the client, or for an error), and
        // h2 dropped what it still held of it.
        if let (false, Some(budget)) = (self.ended, &self.budget) {
            budget.written(self.taken.min(MAX_QUEUED_PER_STREAM));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::convert::Infallible;
    use std::future::Future;

    /// `left` chunks of `size` bytes, each ready at once.
    struct Chunks {
        left: usize,
        size: usize,
    }

    impl Body for Chunks {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            let this = self.get_mut();
            if this.left == 0 {
                return Poll::Ready(None);
            }
            this.left -= 1;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![0u8; this.size])))))
        }
    }

    fn chunks(left: usize, size: usize) -> Chunks {
        Chunks { left, size }
    }

    fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
        Pin::new(f).poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn a_stream_waits_once_the_connection_has_its_budget_queued_and_goes_on_as_it_is_written() {
        let budget = Arc::new(SendBudget::default());
        let chunk = 16 * 1024;
        let mut a = Budgeted::new(chunks(100, chunk), Some(Arc::clone(&budget)));
        let mut b = Budgeted::new(chunks(100, chunk), Some(Arc::clone(&budget)));
        // Two streams share the budget: together they take it, and no more.
        let mut taken = 0;
        loop {
            let a_ready = poll_once(&mut a.frame()).is_ready();
            let b_ready = poll_once(&mut b.frame()).is_ready();
            taken += (usize::from(a_ready) + usize::from(b_ready)) * chunk;
            if !a_ready && !b_ready {
                break;
            }
        }
        assert_eq!(taken, CONNECTION_SEND_BUDGET);
        assert_eq!(budget.queued(), CONNECTION_SEND_BUDGET);
        budget.written(chunk);
        assert!(poll_once(&mut a.frame()).is_ready());
        assert!(poll_once(&mut b.frame()).is_pending());
    }

    #[test]
    fn a_stream_dropped_before_its_end_gives_back_what_it_queued_and_an_ended_one_does_not() {
        let budget = Arc::new(SendBudget::default());
        let mut reset = Budgeted::new(chunks(4, 1000), Some(Arc::clone(&budget)));
        let mut done = Budgeted::new(chunks(1, 1000), Some(Arc::clone(&budget)));
        for _ in 0..2 {
            assert!(poll_once(&mut reset.frame()).is_ready());
        }
        assert!(poll_once(&mut done.frame()).is_ready());
        assert!(matches!(poll_once(&mut done.frame()), Poll::Ready(None)));
        assert_eq!(budget.queued(), 3000);
        drop(reset);
        assert_eq!(
            budget.queued(),
            1000,
            "the reset stream's queue was dropped by h2"
        );
        drop(done);
        assert_eq!(
            budget.queued(),
            1000,
            "the ended stream's bytes are still to be written"
        );
        // Frame and header bytes written beyond the count build no credit.
        budget.written(5000);
        assert_eq!(budget.queued(), 0);
        budget.take(10);
        assert_eq!(budget.queued(), 10);
    }

    #[test]
    fn without_a_budget_the_body_is_as_it_is() {
        let mut body = Budgeted::new(chunks(200, 16 * 1024), None);
        for _ in 0..200 {
            assert!(poll_once(&mut body.frame()).is_ready());
        }
    }
}
