//! The idle timeout of one proxied stream: it fires once no byte has moved either way for the
//! timeout (Envoy's `tcp_proxy` `idle_timeout`).
//!
//! The copy keeps byte counters anyway, so the timer looks at them a few times per timeout
//! instead of being pushed back on every read, which would cost a clock read per read. The
//! state sits in the future of every plain TCP connection (and, as that future is the largest
//! one, in every connection's task), so it is kept to a few words: the timer itself, which is
//! large and cache-aligned, is on the heap.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// How many times per timeout the counters are looked at: a stream is closed between one and
/// 1 + 1/`CHECKS` timeouts after its last byte.
const CHECKS: u32 = 4;

#[derive(Debug)]
pub(super) struct IdleTimer {
    /// `None`: no timeout.
    timer: Option<Pin<Box<Sleep>>>,
    idle: Duration,
    /// The byte count at the last look, and how many looks in a row it has not moved.
    seen: u64,
    still: u32,
}

impl IdleTimer {
    pub(super) fn new(idle: Option<Duration>) -> Self {
        IdleTimer {
            timer: idle.map(|d| Box::pin(tokio::time::sleep(d / CHECKS))),
            idle: idle.unwrap_or_default(),
            seen: 0,
            still: 0,
        }
    }

    /// Ready with the timeout once `moved` (the bytes moved both ways so far, as of this poll)
    /// has stood still for it; never without a timeout.
    pub(super) fn poll_idle(&mut self, cx: &mut Context<'_>, moved: u64) -> Poll<Duration> {
        let Some(timer) = self.timer.as_mut() else {
            return Poll::Pending;
        };
        loop {
            ready!(timer.as_mut().poll(cx));
            if moved == self.seen {
                self.still += 1;
                if self.still >= CHECKS {
                    return Poll::Ready(self.idle);
                }
            } else {
                (self.seen, self.still) = (moved, 0);
            }
            timer.as_mut().reset(Instant::now() + self.idle / CHECKS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fires_after_the_counters_stand_still_for_the_timeout() {
        let mut t = IdleTimer::new(Some(Duration::from_secs(40)));
        let start = Instant::now();
        let mut moved = 0;
        // Bytes move before every look (every 10 s) for the first two minutes: the last one
        // is seen at 110 s.
        let fired = std::future::poll_fn(|cx| {
            if start.elapsed() < Duration::from_secs(120) {
                moved += 1;
            }
            t.poll_idle(cx, moved)
        })
        .await;
        assert_eq!(fired, Duration::from_secs(40));
        let at = start.elapsed();
        assert!(
            at >= Duration::from_secs(150) && at <= Duration::from_secs(160),
            "{at:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_timeout_never_fires() {
        let mut t = IdleTimer::new(None);
        let r = tokio::time::timeout(
            Duration::from_secs(86_400),
            std::future::poll_fn(|cx| t.poll_idle(cx, 0)),
        )
        .await;
        assert!(r.is_err());
    }
}
