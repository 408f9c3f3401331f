//! Rapid Reset (CVE-2023-44487) on HTTP/2 client connections: a client that opens streams and
//! resets them at once pays a frame pair per stream, while the proxy pays a request to the
//! upstream each time. `max_concurrent_streams` does not bound it (a reset stream no longer
//! counts), and the h2 crate's own guard (`max_pending_accept_reset_streams`) only sees streams
//! reset before hyper accepted them: a client that waits a moment before each reset, long
//! enough for the request to be on its way upstream, passes it.
//!
//! So, as Envoy's connection manager does (`overload.premature_reset_total_stream_count` 500,
//! `overload.premature_reset_min_stream_lifetime_seconds` 1): a stream the client resets before
//! any response head, within its first seconds, is premature. Once 500 streams have closed on a
//! connection, it is closed if at least half of them were premature; before 500, as soon as 250
//! were (the share could no longer fall under half). The connection is closed at once (no
//! GOAWAY: hyper gives no way to send ENHANCE_YOUR_CALM, and Envoy aborts too), and counted in
//! `remora_http2_premature_reset_closes`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Streams closed on a connection before the share of premature resets is judged (Envoy's
/// `overload.premature_reset_total_stream_count`).
pub const TOTAL_STREAM_COUNT: u64 = 500;
/// A reset stream younger than this is premature (Envoy counts whole seconds not above 1).
pub const MIN_STREAM_LIFETIME: Duration = Duration::from_secs(2);

/// One HTTP/2 client connection's count of closed and prematurely reset streams.
#[derive(Debug, Default)]
pub struct PrematureResets {
    closed: AtomicU64,
    premature: AtomicU64,
    tripped: AtomicBool,
    notify: tokio::sync::Notify,
}

impl PrematureResets {
    /// A stream of this connection closed; `premature` when the client reset it before any
    /// response head, younger than [`MIN_STREAM_LIFETIME`]. Returns whether the connection has
    /// now crossed the line (once: later calls return false).
    pub fn stream_closed(&self, premature: bool) -> bool {
        let closed = self.closed.fetch_add(1, Ordering::Relaxed) + 1;
        let premature = if premature {
            self.premature.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.premature.load(Ordering::Relaxed)
        };
        if !over_the_line(closed, premature) {
            return false;
        }
        let first = !self.tripped.swap(true, Ordering::Relaxed);
        if first {
            // A stored permit: the connection's driver may be busy elsewhere right now.
            self.notify.notify_one();
        }
        first
    }

    /// Resolves once the connection has too many premature resets.
    pub async fn tripped(&self) {
        self.notify.notified().await;
    }
}

/// Envoy's rule: judged on the share once [`TOTAL_STREAM_COUNT`] streams have closed, and
/// before that as soon as half of that count were premature.
fn over_the_line(closed: u64, premature: u64) -> bool {
    if closed < TOTAL_STREAM_COUNT {
        premature * 2 >= TOTAL_STREAM_COUNT
    } else {
        premature * 2 >= closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closes_after_half_of_the_first_500_streams_were_reset_early() {
        let resets = PrematureResets::default();
        for _ in 0..249 {
            assert!(!resets.stream_closed(true));
        }
        assert!(resets.stream_closed(true), "the 250th premature reset");
        assert!(!resets.stream_closed(true), "tripped once");
    }

    #[test]
    fn a_busy_connection_with_some_resets_stays_open() {
        let resets = PrematureResets::default();
        for i in 0..10_000 {
            // One stream in three reset early: under half.
            assert!(!resets.stream_closed(i % 3 == 0), "at stream {i}");
        }
    }

    #[test]
    fn past_500_streams_the_share_decides() {
        let resets = PrematureResets::default();
        for _ in 0..400 {
            assert!(!resets.stream_closed(false));
        }
        // 400 good, then resets until they are half of all closed.
        let mut tripped_at = None;
        for i in 1..=500 {
            if resets.stream_closed(true) {
                tripped_at = Some(i);
                break;
            }
        }
        assert_eq!(tripped_at, Some(400));
    }
}
