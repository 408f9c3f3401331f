//! Envoy's cors filter statistics: per connection manager with the filter, how many requests
//! it judged (a route with an enabled CORS policy, a non-empty `Origin`, not aborted by the
//! fault filter before it) from an allowed origin and from one not allowed, preflight or not
//! (`http.<stat_prefix>.cors.origin_valid`, `origin_invalid`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One connection manager's counters.
#[derive(Debug, Default)]
pub struct CorsCounters {
    pub origin_valid: AtomicU64,
    pub origin_invalid: AtomicU64,
}

impl CorsCounters {
    /// Count one judged origin.
    pub fn count(&self, valid: bool) {
        let counter = if valid {
            &self.origin_valid
        } else {
            &self.origin_invalid
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The counters of every connection manager whose cors filter has judged an origin, by stat
/// prefix.
pub type CorsStats = crate::metrics::per_prefix::PerPrefix<CorsCounters>;

impl CorsStats {
    /// Each connection manager's `(stat prefix, origin_valid, origin_invalid)`.
    pub fn snapshot(&self) -> Vec<(Arc<str>, u64, u64)> {
        let v = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.each()
            .into_iter()
            .map(|(p, c)| (p, v(&c.origin_valid), v(&c.origin_invalid)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_per_connection_manager() {
        let stats = CorsStats::default();
        let (a, b): (Arc<str>, Arc<str>) = ("outbound_0.0.0.0_80".into(), "inbound_8080".into());
        stats.of(&a).count(true);
        stats.of(&a).count(true);
        stats.of(&a).count(false);
        stats.of(&b).count(false);
        assert_eq!(stats.snapshot(), vec![(b, 0, 1), (a, 2, 1)],);
    }
}
