//! Choosing among a cluster's endpoints: the candidates (hosts that take traffic at the best
//! priority) and Envoy's policies over them. Pure: randomness, load and which hosts are
//! ejected come in as arguments. Nothing here allocates: the candidates are a view over the
//! endpoints, walked again by each policy, which is cheaper than a vector per request for the
//! handful of hosts a cluster has.

use remora_xds::model::endpoint::{ClusterLoadAssignment, Endpoint};
use std::net::SocketAddr;

/// Envoy's panic threshold when a cluster sets none, in percent.
pub const DEFAULT_PANIC_THRESHOLD: f64 = 50.0;

/// Distinct priorities counted on the stack; more (istiod writes a handful at most) spill to
/// the heap.
const STACK_PRIORITIES: usize = 8;

/// The endpoints that may take traffic at the highest priority that has any: a view over the
/// assignment, with no copy of it.
///
/// A host takes traffic when its EDS health does (HEALTHY, UNKNOWN or DEGRADED, as Envoy counts
/// them) and `usable` says so (not ejected by outlier detection). Envoy spills part of the
/// traffic to the next priority as the share of healthy hosts falls under
/// 100/overprovisioning; Remora moves only once a priority has none left.
///
/// Panic mode, as Envoy's: when the priorities together are not healthy enough to carry all the
/// traffic (normalized availability under 100 %) and the chosen priority's healthy share is
/// under `panic_threshold` percent, health is disregarded and every host of that priority is a
/// candidate; with no healthy host anywhere, that is every host of the highest priority.
/// A threshold of 0 never panics.
#[derive(Clone, Copy)]
pub struct Candidates<'a, U> {
    cla: &'a ClusterLoadAssignment,
    priority: u32,
    panic: bool,
    usable: U,
    len: usize,
}

impl<'a, U: Fn(&Endpoint) -> bool + Copy> Candidates<'a, U> {
    /// The candidates of `cla`, with `usable` excluding hosts beyond their EDS health.
    pub fn new(cla: &'a ClusterLoadAssignment, panic_threshold: f64, usable: U) -> Self {
        let healthy = |e: &Endpoint| e.health.takes_traffic() && usable(e);
        // (priority, healthy, total) per priority with a host of non-zero weight.
        let mut stack = [(0u32, 0u64, 0u64); STACK_PRIORITIES];
        let mut spilled: Vec<(u32, u64, u64)> = Vec::new();
        let mut n = 0;
        for l in &cla.localities {
            let (mut h, mut t) = (0u64, 0u64);
            for e in l.endpoints.iter().filter(|e| e.weight > 0) {
                t += 1;
                h += u64::from(healthy(e));
            }
            if t == 0 {
                continue;
            }
            let slot = stack[..n]
                .iter_mut()
                .chain(spilled.iter_mut())
                .find(|(p, _, _)| *p == l.priority);
            match slot {
                Some(s) => {
                    s.1 += h;
                    s.2 += t;
                }
                None if n < STACK_PRIORITIES => {
                    stack[n] = (l.priority, h, t);
                    n += 1;
                }
                None => spilled.push((l.priority, h, t)),
            }
        }
        let counts = || stack[..n].iter().chain(spilled.iter());
        let factor = f64::from(cla.overprovisioning_factor) / 100.0;
        // Envoy's normalized total availability: each priority's healthy share scaled by the
        // overprovisioning factor, capped at 100 %, summed.
        let availability: f64 = counts()
            .map(|(_, h, t)| (factor * 100.0 * *h as f64 / *t as f64).min(100.0))
            .sum();
        // The priority that takes the traffic: the best with a healthy host, else the best (all
        // of Envoy's load goes to priority 0 when nothing is healthy).
        let best_healthy = counts()
            .filter(|(_, h, _)| *h > 0)
            .min_by_key(|(p, _, _)| *p);
        let chosen = best_healthy.or_else(|| counts().min_by_key(|(p, _, _)| *p));
        let mut c = Candidates {
            cla,
            priority: 0,
            panic: false,
            usable,
            len: 0,
        };
        let Some(&(priority, h, t)) = chosen else {
            return c;
        };
        let share = 100.0 * h as f64 / t as f64;
        c.priority = priority;
        c.panic = availability < 100.0 && share < panic_threshold;
        c.len = if c.panic { t } else { h } as usize;
        c
    }

    /// The candidates, in the assignment's order.
    pub fn iter(&self) -> impl Iterator<Item = &'a Endpoint> + Clone + '_ {
        let (priority, panic, usable) = (self.priority, self.panic, &self.usable);
        self.cla
            .localities
            .iter()
            .filter(move |l| l.priority == priority)
            .flat_map(|l| l.endpoints.iter())
            .filter(move |e| e.weight > 0 && (panic || (e.health.takes_traffic() && usable(e))))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether health was disregarded (Envoy's panic mode).
    pub fn panic(&self) -> bool {
        self.panic
    }
}

/// The candidates as a vector, with no host ejected (tests and the admin pages).
pub fn candidates(cla: &ClusterLoadAssignment, panic_threshold: f64) -> Vec<&Endpoint> {
    Candidates::new(cla, panic_threshold, |_: &Endpoint| true)
        .iter()
        .collect()
}

fn weight(e: &Endpoint) -> u64 {
    u64::from(e.weight.max(1))
}

/// Weighted round robin: position `n` of a rotation in which each endpoint appears as often as
/// its weight.
pub fn round_robin<'a>(candidates: impl Iterator<Item = &'a Endpoint> + Clone, n: u64) -> usize {
    let total: u64 = candidates.clone().map(weight).sum();
    by_weight(candidates, n % total.max(1))
}

/// Weighted random, `r` uniformly random.
pub fn random<'a>(candidates: impl Iterator<Item = &'a Endpoint> + Clone, r: u64) -> usize {
    let total: u64 = candidates.clone().map(weight).sum();
    by_weight(candidates, r % total.max(1))
}

fn by_weight<'a>(candidates: impl Iterator<Item = &'a Endpoint>, mut at: u64) -> usize {
    for (i, e) in candidates.enumerate() {
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
pub fn least_request<'a>(
    candidates: impl Iterator<Item = &'a Endpoint> + Clone,
    choice_count: u32,
    load: &dyn Fn(&SocketAddr) -> u32,
    rng: &mut fastrand::Rng,
) -> usize {
    let mut all = candidates.clone();
    let Some(first) = all.next() else {
        return 0;
    };
    let len = 1 + all.clone().count();
    if len == 1 {
        return 0;
    }
    let equal = all.all(|e| e.weight == first.weight);
    let nth = |i: usize| candidates.clone().nth(i).map_or(0, |e| load(&e.address));
    if equal {
        let mut best = rng.usize(..len);
        let mut best_load = nth(best);
        for _ in 1..choice_count.max(2) {
            let other = rng.usize(..len);
            let other_load = nth(other);
            if other_load < best_load {
                best = other;
                best_load = other_load;
            }
        }
        return best;
    }
    // Scaled so that integer weights keep their ratio: weight × 2^20 / (active + 1).
    let effective = |e: &Endpoint| (weight(e) << 20) / (u64::from(load(&e.address)) + 1);
    let total: u64 = candidates.clone().map(effective).sum();
    let mut at = rng.u64(..total.max(1));
    for (i, e) in candidates.enumerate() {
        let w = effective(e);
        if at < w {
            return i;
        }
        at -= w;
    }
    0
}
