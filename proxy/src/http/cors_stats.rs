//! Envoy's cors filter statistics: per connection manager with the filter, how many requests
//! it judged (a route with an enabled CORS policy, a non-empty `Origin`, not aborted by the
//! fault filter before it) from an allowed origin and from one not allowed, preflight or not
//! (`http.<stat_prefix>.cors.origin_valid`, `origin_invalid`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

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
/// prefix, kept across config versions as Envoy keeps its stats. As many as the chains' stat
/// prefixes.
#[derive(Debug, Default)]
pub struct CorsStats(Mutex<BTreeMap<Arc<str>, Arc<CorsCounters>>>);

impl CorsStats {
    /// The counters of the connection manager `stat_prefix`.
    pub fn of(&self, stat_prefix: &Arc<str>) -> Arc<CorsCounters> {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(all.entry(Arc::clone(stat_prefix)).or_default())
    }

    /// Each connection manager's `(stat prefix, origin_valid, origin_invalid)`.
    pub fn snapshot(&self) -> Vec<(Arc<str>, u64, u64)> {
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.iter()
            .map(|(p, c)| {
                let v = |a: &AtomicU64| a.load(Ordering::Relaxed);
                (Arc::clone(p), v(&c.origin_valid), v(&c.origin_invalid))
            })
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
