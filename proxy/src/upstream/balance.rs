//! Choosing among a cluster's endpoints: the candidates (the hosts of one priority, and with
//! locality-weighted balancing of one locality, that a request may go to) and Envoy's policies
//! over them. Pure: randomness, load and which hosts are ejected come in as arguments. Nothing
//! here allocates for a cluster of up to eight priorities: the candidates are a view over the
//! endpoints, walked again by each policy, which is cheaper than a vector per request for the
//! handful of hosts a cluster has.

use super::priority::{Availability, Loads};
use remora_xds::model::endpoint::{ClusterLoadAssignment, Endpoint, LocalityEndpoints};
use std::net::SocketAddr;

/// Envoy's panic threshold when a cluster sets none, in percent.
pub const DEFAULT_PANIC_THRESHOLD: f64 = 50.0;

/// How a cluster spreads its traffic over priorities and localities.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread<'a> {
    /// `healthy_panic_threshold` in percent (Envoy's 50 when unset, 0 never panics).
    pub panic_threshold: f64,
    /// `locality_weighted_lb_config`: a locality is chosen first, by its effective weight.
    pub locality_weighted: bool,
    /// Priorities a retry's load leaves out (Envoy's `previous_priorities`); usually none.
    pub excluded_priorities: &'a [u32],
}

/// The random numbers (or hash) one pick spends choosing a priority and a locality.
#[derive(Debug, Clone, Copy, Default)]
pub struct Draws {
    pub priority: u64,
    pub locality: u64,
}

/// The endpoints one request may go to: a view over the assignment, with no copy of it.
///
/// The priority is Envoy's choice ([`super::priority`]): each takes a share of the traffic by
/// how healthy it is, scaled by the overprovisioning factor, so that a priority with fewer than
/// 1/1.4 of its hosts healthy (by default) passes part of its traffic to the next. A host is
/// healthy when its EDS health is HEALTHY or UNKNOWN and `usable` says so (not ejected by
/// outlier detection); DEGRADED hosts take what healthy ones cannot. In panic mode, every host
/// of the chosen priority is a candidate.
///
/// With locality-weighted balancing (and no panic), one locality of that priority is chosen,
/// at random in proportion to its effective weight as Envoy computes it: its
/// `load_balancing_weight` times `min(1, factor × eligible / hosts)`. A locality without a
/// weight takes nothing; when none has any effective weight, the whole priority is the set, as
/// in Envoy.
#[derive(Clone, Copy)]
pub struct Candidates<'a, U> {
    cla: &'a ClusterLoadAssignment,
    priority: u32,
    availability: Availability,
    /// The chosen locality entry (its index in the assignment), or every one of the priority.
    locality: Option<usize>,
    usable: U,
    len: usize,
}

impl<'a, U: Fn(&Endpoint) -> bool + Copy> Candidates<'a, U> {
    /// The candidates of `cla` for the first share of the traffic (the highest priority that
    /// takes any), with no locality weighting (what the tests look at).
    pub fn new(cla: &'a ClusterLoadAssignment, panic_threshold: f64, usable: U) -> Self {
        let spread = Spread {
            panic_threshold,
            locality_weighted: false,
            excluded_priorities: &[],
        };
        Self::choose(cla, spread, usable, Draws::default())
    }

    /// The candidates of `cla` for one request, its priority and locality chosen by `draws`.
    pub fn choose(
        cla: &'a ClusterLoadAssignment,
        spread: Spread<'_>,
        usable: U,
        draws: Draws,
    ) -> Self {
        let mut loads = Loads::new(cla, spread.panic_threshold, usable);
        loads.exclude(spread.excluded_priorities, cla.overprovisioning_factor);
        Self::choose_by(cla, &loads, spread.locality_weighted, usable, draws)
    }

    /// [`Candidates::choose`] with the priority loads already known: `loads` must be those of
    /// `cla` with `usable` (and the spread's excluded priorities), as [`Loads::new`] gives
    /// them. A cluster keeps the loads of its assignment while no host is ejected, so that a
    /// request need not count every host again.
    pub fn choose_by(
        cla: &'a ClusterLoadAssignment,
        loads: &Loads,
        locality_weighted: bool,
        usable: U,
        draws: Draws,
    ) -> Self {
        let mut c = Candidates {
            cla,
            priority: 0,
            availability: Availability::Healthy,
            locality: None,
            usable,
            len: 0,
        };
        let Some((level, availability)) = loads.choose(draws.priority) else {
            return c;
        };
        c.priority = level.priority;
        c.availability = availability;
        let count = match availability {
            Availability::Healthy => level.healthy,
            Availability::Degraded => level.degraded,
            Availability::Panic => level.hosts,
        };
        c.len = usize::try_from(count).unwrap_or(usize::MAX);
        if locality_weighted && availability != Availability::Panic {
            if let Some((index, eligible)) = c.choose_locality(draws.locality) {
                c.locality = Some(index);
                c.len = eligible;
            }
        }
        c
    }

    /// A locality entry of the chosen priority by effective weight, with how many eligible
    /// hosts it has; `None` when no locality has any effective weight.
    fn choose_locality(&self, draw: u64) -> Option<(usize, usize)> {
        let factor = f64::from(self.cla.overprovisioning_factor) / 100.0;
        let effective = |l: &LocalityEndpoints| -> (f64, usize) {
            let (mut eligible, mut hosts) = (0usize, 0usize);
            for e in l.endpoints.iter().filter(|e| e.weight > 0) {
                hosts += 1;
                eligible += usize::from(self.admits(e));
            }
            if hosts == 0 {
                return (0.0, 0);
            }
            let availability = (factor * eligible as f64 / hosts as f64).min(1.0);
            (f64::from(l.weight.unwrap_or(0)) * availability, eligible)
        };
        let at_priority = || {
            self.cla
                .localities
                .iter()
                .enumerate()
                .filter(|(_, l)| l.priority == self.priority)
        };
        let total: f64 = at_priority().map(|(_, l)| effective(l).0).sum();
        if total <= 0.0 {
            return None;
        }
        // A uniform point in [0, total) from the draw's top 53 bits.
        let mut at = (draw >> 11) as f64 / (1u64 << 53) as f64 * total;
        let mut last = None;
        for (i, l) in at_priority() {
            let (w, eligible) = effective(l);
            if w <= 0.0 {
                continue;
            }
            if at < w {
                return Some((i, eligible));
            }
            at -= w;
            last = Some((i, eligible));
        }
        last
    }

    fn admits(&self, e: &Endpoint) -> bool {
        e.weight > 0 && self.availability.admits(e, &self.usable)
    }

    /// The candidates, in the assignment's order.
    pub fn iter(&self) -> impl Iterator<Item = &'a Endpoint> + Clone + '_ {
        let (priority, locality) = (self.priority, self.locality);
        self.cla
            .localities
            .iter()
            .enumerate()
            .filter(move |(i, l)| l.priority == priority && locality.is_none_or(|c| c == *i))
            .flat_map(|(_, l)| l.endpoints.iter())
            .filter(move |e| self.admits(e))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether health was disregarded (Envoy's panic mode).
    pub fn panic(&self) -> bool {
        self.availability == Availability::Panic
    }

    /// The chosen priority.
    pub fn priority(&self) -> u32 {
        self.priority
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
    len: usize,
    choice_count: u32,
    load: &dyn Fn(&SocketAddr) -> u32,
    rng: &mut fastrand::Rng,
) -> usize {
    let mut all = candidates.clone();
    let Some(first) = all.next() else {
        return 0;
    };
    if len <= 1 {
        return 0;
    }
    let equal = all.all(|e| e.weight == first.weight);
    // `len` was counted before this walk: a host ejected meanwhile by another request makes
    // it one too many, and a place past the end must never win.
    let nth = |i: usize| {
        candidates
            .clone()
            .nth(i)
            .map_or(u32::MAX, |e| load(&e.address))
    };
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

#[cfg(test)]
#[path = "locality_tests.rs"]
mod locality_tests;
