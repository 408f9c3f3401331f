//! What an accept loop does when `accept(2)` fails. Out of file descriptors (`EMFILE`,
//! `ENFILE`) or kernel memory, the pending connection stays in the backlog and the listener
//! stays readable, so retrying at once would spin a core; the loop sleeps a little instead and
//! takes the connection once a descriptor is free. Each failure is counted; the log says so
//! at most once per [`LOG_EVERY`], with how many were not logged.

use crate::metrics::OverloadMetrics;
use std::io;
use std::time::{Duration, Instant};

/// Sleep after an exhaustion error: 20 attempts a second cost nothing, and a freed descriptor
/// is used within this long.
pub const BACKOFF: Duration = Duration::from_millis(50);

/// Least time between two log lines about failed accepts on one listener.
pub const LOG_EVERY: Duration = Duration::from_secs(5);

/// One listener's failed accepts.
#[derive(Debug)]
pub struct AcceptErrors {
    /// The `listener` label (one of [`crate::metrics::ACCEPTING_LISTENERS`]).
    listener: &'static str,
    metrics: OverloadMetrics,
    last_log: Option<Instant>,
    unlogged: u64,
}

impl AcceptErrors {
    /// Failed accepts of `listener`, counted in `metrics`.
    pub fn new(listener: &'static str, metrics: OverloadMetrics) -> Self {
        AcceptErrors {
            listener,
            metrics,
            last_log: None,
            unlogged: 0,
        }
    }

    /// Count and maybe log `e`, then wait before the next accept if the process or the system
    /// ran out of something.
    pub async fn failed(&mut self, e: &io::Error) {
        self.metrics.accept_error(self.listener);
        let due = self.last_log.is_none_or(|t| t.elapsed() >= LOG_EVERY);
        if due {
            tracing::warn!(
                listener = self.listener,
                error = %e,
                not_logged = self.unlogged,
                "accept failed; backing off"
            );
            self.last_log = Some(Instant::now());
            self.unlogged = 0;
        } else {
            self.unlogged += 1;
        }
        if exhausted(e) {
            tokio::time::sleep(BACKOFF).await;
        }
    }
}

/// Whether `e` says a resource ran out (then the same accept would fail again at once), as
/// opposed to one connection's trouble (`ECONNABORTED`: it was reset in the backlog).
fn exhausted(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    ) || e.raw_os_error().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn exhaustion_backs_off_and_a_reset_connection_does_not() {
        let metrics = crate::metrics::Metrics::default().overload.clone();
        let mut errors = AcceptErrors::new("outbound", metrics.clone());
        let started = tokio::time::Instant::now();
        errors
            .failed(&io::Error::from_raw_os_error(libc::EMFILE))
            .await;
        assert_eq!(started.elapsed(), BACKOFF);
        errors
            .failed(&io::Error::from_raw_os_error(libc::ECONNABORTED))
            .await;
        assert_eq!(started.elapsed(), BACKOFF);
        assert_eq!(errors.unlogged, 1);
        assert_eq!(metrics.accept_error("outbound"), 3);
    }
}
