//! Choosing among a cluster's endpoints: the candidates (healthy ones at the best priority) and
//! Envoy's policies over them. Pure: randomness and load come in as arguments.

use remora_xds::model::endpoint::{ClusterLoadAssignment, Endpoint};
use std::net::SocketAddr;

/// The endpoints that may take traffic (HEALTHY, UNKNOWN or DEGRADED, as Envoy counts them) at
/// the highest priority that has any. Envoy spills part of the traffic to the next priority
/// as the share of healthy hosts falls under 100/overprovisioning; Remora moves only once a
/// priority has none left.
pub fn healthy_of_best_priority(cla: &ClusterLoadAssignment) -> Vec<&Endpoint> {
    let best = cla
        .localities
        .iter()
        .filter(|l| l.endpoints.iter().any(|e| e.health.takes_traffic()))
        .map(|l| l.priority)
        .min();
    let Some(best) = best else {
        return Vec::new();
    };
    cla.localities
        .iter()
        .filter(|l| l.priority == best)
        .flat_map(|l| l.endpoints.iter())
        .filter(|e| e.health.takes_traffic() && e.weight > 0)
        .collect()
}

fn weight(e: &Endpoint) -> u64 {
    u64::from(e.weight.max(1))
}

/// Weighted round robin: position `n` of a rotation in which each endpoint appears as often as
/// its weight.
pub fn round_robin(candidates: &[&Endpoint], n: u64) -> usize {
    let total: u64 = candidates.iter().map(|e| weight(e)).sum();
    by_weight(candidates, n % total.max(1))
}

/// Weighted random, `r` uniformly random.
pub fn random(candidates: &[&Endpoint], r: u64) -> usize {
    let total: u64 = candidates.iter().map(|e| weight(e)).sum();
    by_weight(candidates, r % total.max(1))
}

fn by_weight(candidates: &[&Endpoint], mut at: u64) -> usize {
    for (i, e) in candidates.iter().enumerate() {
        let w = weight(e);
        if at < w {
            return i;
        }
        at -= w;
    }
    0
}

/// Envoy's LEAST_REQUEST. Equal weights: `choice_count` random picks (two by default), the
/// one with the fewest requests in flight wins. Unequal weights: weighted random with each
/// weight divided by its in-flight requests plus one (Envoy's EDF weights with the default
/// active-request bias of 1.0, drawn at random instead of scheduled).
pub fn least_request(
    candidates: &[&Endpoint],
    choice_count: u32,
    load: &dyn Fn(&SocketAddr) -> u32,
    rng: &mut fastrand::Rng,
) -> usize {
    if candidates.len() == 1 {
        return 0;
    }
    let equal = candidates.iter().all(|e| e.weight == candidates[0].weight);
    if equal {
        let mut best = rng.usize(..candidates.len());
        for _ in 1..choice_count.max(2) {
            let other = rng.usize(..candidates.len());
            if load(&candidates[other].address) < load(&candidates[best].address) {
                best = other;
            }
        }
        return best;
    }
    // Scaled so that integer weights keep their ratio: weight × 2^20 / (active + 1).
    let effective: Vec<u64> = candidates
        .iter()
        .map(|e| (weight(e) << 20) / (u64::from(load(&e.address)) + 1))
        .collect();
    let total: u64 = effective.iter().sum();
    let mut at = rng.u64(..total.max(1));
    for (i, w) in effective.iter().enumerate() {
        if at < *w {
            return i;
        }
        at -= w;
    }
    0
}
