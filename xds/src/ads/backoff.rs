//! Reconnect back-off, as Envoy's xDS streams do it: fully jittered exponential. The n-th retry
//! waits a uniformly random time in `[0, min(base * 2^n, max))`; any message from the control
//! plane resets it. Full jitter (rather than a fixed delay plus noise) is what spreads a whole
//! mesh of sidecars reconnecting after an istiod restart, instead of having them come back in
//! waves.

use std::time::Duration;

/// Envoy's default first interval for xDS streams (`SubscriptionFactory::RetryInitialDelayMs`).
pub const DEFAULT_BASE: Duration = Duration::from_millis(500);
/// Envoy's default cap (`SubscriptionFactory::RetryMaxDelayMs`, "do not cross more than 30s").
pub const DEFAULT_MAX: Duration = Duration::from_secs(30);

/// Jittered exponential back-off state.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    next_interval: Duration,
}

impl Backoff {
    /// A back-off starting at `base` and never exceeding `max` (raised to `base` if smaller).
    pub fn new(base: Duration, max: Duration) -> Self {
        let base = base.max(Duration::from_millis(1));
        Self {
            base,
            max: max.max(base),
            next_interval: base,
        }
    }

    /// The delay before the next attempt; doubles the interval for the one after.
    pub fn next_delay(&mut self) -> Duration {
        let interval = self.next_interval;
        self.next_interval = interval.saturating_mul(2).min(self.max);
        let millis = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(fastrand::u64(0..millis.max(1)))
    }

    /// The current interval the next delay is drawn from (for logs and tests).
    pub fn current_interval(&self) -> Duration {
        self.next_interval
    }

    /// Back to the first interval: the stream delivered a message, so the peer is healthy.
    pub fn reset(&mut self) {
        self.next_interval = self.base;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(DEFAULT_BASE, DEFAULT_MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_below_a_doubling_capped_interval() {
        let mut backoff = Backoff::default();
        let mut bound = DEFAULT_BASE;
        for _ in 0..20 {
            let delay = backoff.next_delay();
            assert!(delay < bound, "{delay:?} not below {bound:?}");
            bound = (bound * 2).min(DEFAULT_MAX);
        }
        assert_eq!(backoff.current_interval(), DEFAULT_MAX);
    }

    #[test]
    fn reset_returns_to_base() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        for _ in 0..5 {
            backoff.next_delay();
        }
        assert_eq!(backoff.current_interval(), Duration::from_secs(1));
        backoff.reset();
        assert_eq!(backoff.current_interval(), Duration::from_millis(100));
    }

    #[test]
    fn delays_are_jittered() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let mut backoff = Backoff::new(Duration::from_secs(10), Duration::from_secs(10));
            seen.insert(backoff.next_delay());
        }
        assert!(seen.len() > 10, "only {} distinct delays", seen.len());
    }
}
