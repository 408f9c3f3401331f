//! Choosing among a cluster's endpoints: the candidates (healthy ones at the best priority) and
//! Envoy's policies over them. Pure: randomness and load come in as arguments.

use remora_xds::model::endpoint::{ClusterLoadAssignment, Endpoint};
use std::net::SocketAddr;

/// Envoy's panic threshold when a cluster sets none, in percent.
pub const DEFAULT_PANIC_THRESHOLD: f64 = 50.0;

/// The endpoints that may take traffic (HEALTHY, UNKNOWN or DEGRADED, as Envoy counts them) at
/// the highest priority that has any. Envoy spills part of the traffic to the next priority
/// as the share of healthy hosts falls under 100/overprovisioning; Remora moves only once a
/// priority has none left.
///
/// Panic mode, as Envoy's: when the priorities together are not healthy enough to carry all the
/// traffic (normalized availability under 100 %) and the chosen priority's healthy share is
/// under `panic_threshold` percent, health is disregarded and every host of that priority is a
/// candidate; with no healthy host anywhere, that is every host of the highest priority.
/// A threshold of 0 never panics.
pub fn candidates(cla: &ClusterLoadAssignment, panic_threshold: f64) -> Vec<&Endpoint> {
    let mut priorities: Vec<u32> = cla.localities.iter().map(|l| l.priority).collect();
    priorities.sort_unstable();
    priorities.dedup();
    let count = |p: u32| {
        let hosts = cla
            .localities
            .iter()
            .filter(|l| l.priority == p)
            .flat_map(|l| l.endpoints.iter())
            .filter(|e| e.weight > 0);
        let (mut healthy, mut total) = (0u64, 0u64);
        for e in hosts {
            total += 1;
            healthy += u64::from(e.health.takes_traffic());
        }
        (healthy, total)
    };
    let counts: Vec<(u32, u64, u64)> = priorities
        .iter()
        .map(|&p| {
            let (healthy, total) = count(p);
            (p, healthy, total)
        })
        .filter(|(_, _, total)| *total > 0)
        .collect();
    let factor = f64::from(cla.overprovisioning_factor) / 100.0;
    // Envoy's normalized total availability: each priority's healthy share scaled by the
    // overprovisioning factor, capped at 100 %, summed.
    let availability: f64 = counts
        .iter()
        .map(|(_, healthy, total)| (factor * 100.0 * *healthy as f64 / *total as f64).min(100.0))
        .sum();
    // The priority that takes the traffic: the best with a healthy host, else the best (all
    // of Envoy's load goes to priority 0 when nothing is healthy).
    let chosen = counts
        .iter()
        .find(|(_, healthy, _)| *healthy > 0)
        .or_else(|| counts.first());
    let Some(&(best, healthy, total)) = chosen else {
        return Vec::new();
    };
    let share = 100.0 * healthy as f64 / total as f64;
    let panic = availability < 100.0 && share < panic_threshold;
    cla.localities
        .iter()
        .filter(|l| l.priority == best)
        .flat_map(|l| l.endpoints.iter())
        .filter(|e| e.weight > 0 && (panic || e.health.takes_traffic()))
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
