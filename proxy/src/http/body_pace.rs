//! The pace of an HTTP/1.1 request body, against slow bodies (slowloris in the body): a body
//! must arrive within `http.request_body_timeout`, extended by one second for every
//! `http.request_body_min_rate` bytes received (Apache's `mod_reqtimeout` rule), so a client
//! dribbling a byte a second is cut while an upload at any useful speed never is.
//!
//! Only time spent waiting for the client counts: from a read that found nothing until the
//! next read that returns bytes. While the upstream does not take the body (hyper stops
//! reading), the client is not to blame, and the clock stands still.

use std::time::Duration;
use tokio::time::Instant;

/// A request body took longer than its budget.
#[derive(Debug, thiserror::Error)]
#[error("request body not received at {min_rate} bytes/s after {timeout:?}")]
pub struct BodyReadTimeout {
    pub timeout: Duration,
    pub min_rate: u64,
    /// Whether the client was answered 408 (not when a response had begun).
    pub answered: bool,
}

/// One body's clock.
#[derive(Debug)]
pub struct BodyPace {
    timeout: Duration,
    min_rate: u64,
    /// Bytes of the body (and what followed it in the same reads) received so far.
    received: u64,
    /// Time spent waiting for the client, not counting the wait in progress.
    waited: Duration,
    /// When the wait in progress began (a read found nothing).
    waiting_since: Option<Instant>,
    /// Response bytes written when the body began: more since means a response has begun.
    pub sent_at_start: u64,
}

impl BodyPace {
    /// A body starting now, with the connection having written `sent` bytes so far.
    pub fn new(timeout: Duration, min_rate: u64, sent: u64) -> Self {
        BodyPace {
            timeout,
            min_rate: min_rate.max(1),
            received: 0,
            waited: Duration::ZERO,
            waiting_since: None,
            sent_at_start: sent,
        }
    }

    /// A read returned `n` bytes at `now`.
    pub fn received(&mut self, n: usize, now: Instant) {
        self.received = self.received.saturating_add(n as u64);
        if let Some(since) = self.waiting_since.take() {
            self.waited += now.saturating_duration_since(since);
        }
    }

    /// A read found nothing at `now`: the client is being waited for.
    pub fn waiting(&mut self, now: Instant) {
        self.waiting_since.get_or_insert(now);
    }

    /// The time waiting for the client may still take, as of `now`; zero when it is out.
    pub fn remaining(&self, now: Instant) -> Duration {
        let budget = self.timeout + Duration::from_millis(self.received * 1000 / self.min_rate);
        let waiting = self
            .waiting_since
            .map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
        budget.saturating_sub(self.waited + waiting)
    }

    /// The error for this body, `answered` or not.
    pub fn timed_out(&self, answered: bool) -> BodyReadTimeout {
        BodyReadTimeout {
            timeout: self.timeout,
            min_rate: self.min_rate,
            answered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_waiting_for_the_client_counts_and_bytes_extend_the_budget() {
        let t0 = Instant::now();
        let s = |secs| t0 + Duration::from_secs(secs);
        let mut pace = BodyPace::new(Duration::from_secs(10), 100, 0);
        // The upstream held the body back for a minute: not the client's time.
        pace.waiting(s(60));
        assert_eq!(pace.remaining(s(64)), Duration::from_secs(6));
        pace.received(200, s(64));
        // 4 s waited; 200 bytes bought 2 s more.
        assert_eq!(pace.remaining(s(100)), Duration::from_secs(8));
        pace.waiting(s(100));
        assert_eq!(pace.remaining(s(108)), Duration::ZERO);
        // A byte a second never catches up with a rate of 100.
        let mut dribble = BodyPace::new(Duration::from_secs(10), 100, 0);
        let mut t = 0;
        while dribble.remaining(s(t)) > Duration::ZERO {
            dribble.waiting(s(t));
            t += 1;
            dribble.received(1, s(t));
            assert!(t < 20, "a dribble outlived its budget");
        }
        assert!(t >= 10);
    }
}
