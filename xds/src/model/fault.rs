//! Fault injection per route, as Envoy's fault filter reads it from a route's (or virtual
//! host's, weighted cluster's, table's) `typed_per_filter_config["envoy.filters.http.fault"]`:
//! a fixed delay before the request is forwarded and an abort answered locally, each on its
//! own fraction of requests.

use std::time::Duration;

/// A fraction of requests, in millionths (Envoy's `FractionalPercent` over any of its
/// denominators: a hundred, ten thousand, a million; istiod writes millionths).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fraction {
    per_million: u32,
}

/// The denominator of [`Fraction`].
pub const MILLION: u32 = 1_000_000;

impl Fraction {
    /// `numerator` over `denominator` (100, 10,000 or 1,000,000); `None` above 100 %.
    pub fn new(numerator: u32, denominator: u32) -> Option<Fraction> {
        if numerator > denominator || denominator == 0 || !MILLION.is_multiple_of(denominator) {
            return None;
        }
        Some(Fraction {
            per_million: numerator * (MILLION / denominator),
        })
    }

    /// Every request.
    pub const ALL: Fraction = Fraction {
        per_million: MILLION,
    };

    /// In millionths.
    pub fn per_million(self) -> u32 {
        self.per_million
    }

    /// Whether a request with the uniformly random `roll` is in the fraction, as Envoy's
    /// runtime decides a `FractionalPercent` (`roll % denominator < numerator`).
    pub fn hits(self, roll: u64) -> bool {
        roll % u64::from(MILLION) < u64::from(self.per_million)
    }
}

/// What a route's fault filter config injects.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultPolicy {
    pub delay: Option<FaultDelay>,
    pub abort: Option<FaultAbort>,
}

/// Hold the request this long before it goes on (Envoy's `fixed_delay`; flag `DI`).
#[derive(Debug, Clone, PartialEq)]
pub struct FaultDelay {
    pub duration: Duration,
    pub fraction: Fraction,
}

/// Answer the request here instead (flag `FI`), never forwarding it.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultAbort {
    pub status: AbortStatus,
    pub fraction: Fraction,
}

/// The answer of an abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortStatus {
    /// This HTTP status (a gRPC client gets it as its gRPC equivalent).
    Http(u16),
    /// HTTP 200 with this `grpc-status` (trailers-only for a gRPC client).
    Grpc(u32),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_over_every_denominator() {
        assert_eq!(
            Fraction::new(50, 100).map(Fraction::per_million),
            Some(500_000)
        );
        assert_eq!(
            Fraction::new(5, 10_000).map(Fraction::per_million),
            Some(500)
        );
        assert_eq!(
            Fraction::new(1, MILLION).map(Fraction::per_million),
            Some(1)
        );
        assert_eq!(Fraction::new(101, 100), None);
        let half = Fraction::new(50, 100).expect("50%");
        let hits = (0..1000u64).filter(|r| half.hits(r * 1000)).count();
        assert_eq!(hits, 500);
        assert!(!Fraction::new(0, 100).expect("0%").hits(0));
        assert!(Fraction::ALL.hits(u64::MAX));
    }
}
