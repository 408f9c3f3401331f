//! Envoy's priority load: how much of a cluster's traffic each priority takes, from the share
//! of its hosts that are healthy (or degraded), scaled by the overprovisioning factor, and
//! which priorities are in panic. Pure integer percentages, as Envoy computes them
//! (`LoadBalancerBase::recalculatePerPriorityState`, `recalculatePerPriorityPanic`,
//! `choosePriority`), so that the same hosts give the same split.
//!
//! - A priority's **health** is `min(100, factor × healthy / hosts)` (integer, the factor in
//!   percent, 140 by default), its **degraded availability** the same over degraded hosts.
//!   Healthy hosts are those EDS calls HEALTHY or UNKNOWN and outlier detection has not ejected.
//! - The **normalized total availability** is the sum of every priority's health and degraded
//!   availability, capped at 100. The traffic (100 %) is handed out in priority order: each
//!   priority takes `health × 100 / normalized` of it (no more than is left), then what is left
//!   goes the same way by degraded availability, and a rounding remainder to the first priority
//!   with any health (else the first with degraded hosts).
//! - A priority is in **panic** when the normalized availability is under 100 and its share of
//!   healthy plus degraded hosts (unscaled) is under the panic threshold; it then balances over
//!   all its hosts. When every priority is in panic, the traffic is split by host count instead.
//!   Nothing healthy anywhere with panic disabled (threshold 0): no host.
//! - A request takes a number from 1 to 100 (from a random draw, or a consistent-hash
//!   cluster's hash) and the priority whose cumulative load first reaches it.
//!
//! Priorities are named by their number; Envoy's empty levels between two used numbers take
//! no traffic and do not change which priorities panic, so only the used ones are kept.

use remora_xds::model::endpoint::{ClusterLoadAssignment, Endpoint, Health};

/// Distinct priorities held on the stack; more (istiod writes five at most for failover)
/// fall back to the heap.
const STACK_PRIORITIES: usize = 8;

/// Which of a priority's hosts a request may go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// Its healthy hosts.
    Healthy,
    /// Its degraded hosts (reached only once the healthy ones carry less than all the load).
    Degraded,
    /// Every host, healthy or not (panic mode).
    Panic,
}

impl Availability {
    /// Whether `e` is among the hosts of this kind, `usable` saying it is not ejected.
    pub fn admits(self, e: &Endpoint, usable: &impl Fn(&Endpoint) -> bool) -> bool {
        match self {
            Availability::Panic => true,
            Availability::Healthy => is_healthy(e.health) && usable(e),
            Availability::Degraded => e.health == Health::Degraded && usable(e),
        }
    }
}

/// Envoy's healthy: EDS HEALTHY or UNKNOWN (DEGRADED is a class of its own).
pub fn is_healthy(h: Health) -> bool {
    matches!(h, Health::Healthy | Health::Unknown)
}

/// One used priority's counts and its share of the traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Level {
    pub priority: u32,
    pub healthy: u64,
    pub degraded: u64,
    pub hosts: u64,
    /// Percent of the traffic to its healthy hosts.
    pub healthy_load: u32,
    /// Percent of the traffic to its degraded hosts.
    pub degraded_load: u32,
    pub panic: bool,
}

/// The used priorities of an assignment, lowest number (highest priority) first, with their
/// loads.
#[derive(Debug, Clone)]
pub struct Loads {
    stack: [Level; STACK_PRIORITIES],
    len: usize,
    heap: Vec<Level>,
}

impl Loads {
    /// Count the hosts of `cla` (those of weight 0 take no traffic and are left out) and hand
    /// out the load. `usable(e)`: not ejected. `panic_threshold` in percent.
    pub fn new(
        cla: &ClusterLoadAssignment,
        panic_threshold: f64,
        usable: impl Fn(&Endpoint) -> bool,
    ) -> Loads {
        let mut loads = Loads {
            stack: [Level::default(); STACK_PRIORITIES],
            len: 0,
            heap: Vec::new(),
        };
        for l in &cla.localities {
            let mut counts = Level {
                priority: l.priority,
                ..Level::default()
            };
            for e in l.endpoints.iter().filter(|e| e.weight > 0) {
                counts.hosts += 1;
                if usable(e) {
                    counts.healthy += u64::from(is_healthy(e.health));
                    counts.degraded += u64::from(e.health == Health::Degraded);
                }
            }
            if counts.hosts > 0 {
                loads.add(counts);
            }
        }
        let factor = u64::from(cla.overprovisioning_factor);
        // Envoy takes the threshold as a whole percent, rounded.
        let threshold = panic_threshold.round().clamp(0.0, 100.0);
        let levels = loads.levels_mut();
        levels.sort_unstable_by_key(|l| l.priority);
        distribute(levels, factor, threshold);
        loads
    }

    /// Envoy's `previous_priorities` retry: the load handed out again as if the `excluded`
    /// priorities had no healthy host, each keeping its panic mode. When that leaves nothing,
    /// the loads stay as they were (Envoy starts over with every priority).
    pub fn exclude(&mut self, excluded: &[u32], factor: u32) {
        if excluded.is_empty() {
            return;
        }
        let before = self.clone();
        let included = |l: &Level| !excluded.contains(&l.priority);
        if hand_out(self.levels_mut(), u64::from(factor), included) == 0 {
            *self = before;
        }
    }

    fn add(&mut self, counts: Level) {
        if let Some(l) = self
            .levels_mut()
            .iter_mut()
            .find(|l| l.priority == counts.priority)
        {
            l.healthy += counts.healthy;
            l.degraded += counts.degraded;
            l.hosts += counts.hosts;
        } else if !self.heap.is_empty() || self.len == STACK_PRIORITIES {
            if self.heap.is_empty() {
                self.heap.extend_from_slice(&self.stack[..self.len]);
            }
            self.heap.push(counts);
        } else {
            self.stack[self.len] = counts;
            self.len += 1;
        }
    }

    fn levels_mut(&mut self) -> &mut [Level] {
        if self.heap.is_empty() {
            &mut self.stack[..self.len]
        } else {
            &mut self.heap
        }
    }

    /// The used priorities, highest first.
    pub fn levels(&self) -> &[Level] {
        if self.heap.is_empty() {
            &self.stack[..self.len]
        } else {
            &self.heap
        }
    }

    /// The priority a request with `draw` goes to, and which of its hosts: Envoy's
    /// `choosePriority` over the number `draw % 100 + 1`. `None`: the cluster has no host.
    pub fn choose(&self, draw: u64) -> Option<(Level, Availability)> {
        let levels = self.levels();
        let first = *levels.first()?;
        let point = u32::try_from(draw % 100 + 1).unwrap_or(100);
        let mut cumulative = 0;
        let healthy = levels.iter().map(|l| (l, l.healthy_load, false));
        let degraded = levels.iter().map(|l| (l, l.degraded_load, true));
        for (level, load, is_degraded) in healthy.chain(degraded) {
            cumulative += load;
            if point <= cumulative {
                let availability = if level.panic {
                    Availability::Panic
                } else if is_degraded {
                    Availability::Degraded
                } else {
                    Availability::Healthy
                };
                return Some((*level, availability));
            }
        }
        // The loads always add up to 100, but for nothing healthy with panic disabled, where
        // Envoy gives it all to the first priority, which then has no host to offer.
        let availability = if first.panic {
            Availability::Panic
        } else {
            Availability::Healthy
        };
        Some((first, availability))
    }
}

/// A priority's health (or degraded availability) from `n` of its `hosts`, in whole percent.
fn scaled(factor: u64, n: u64, hosts: u64) -> u32 {
    // `hosts` is never 0: a priority is kept only with a host.
    u32::try_from((factor.saturating_mul(n) / hosts.max(1)).min(100)).unwrap_or(100)
}

/// Hand the traffic out over the `included` levels by their health, then their degraded
/// availability, the remainder to the first healthy one; the others take none. The normalized
/// availability, 0 when nothing was handed out.
fn hand_out(levels: &mut [Level], factor: u64, included: impl Fn(&Level) -> bool) -> u32 {
    let availability = levels
        .iter()
        .filter(|l| included(l))
        .map(|l| scaled(factor, l.healthy, l.hosts) + scaled(factor, l.degraded, l.hosts))
        .fold(0u32, u32::saturating_add)
        .min(100);
    let Some(share) = std::num::NonZeroU32::new(availability) else {
        return 0;
    };
    let mut left = 100u32;
    let (mut first_healthy, mut first_degraded) = (None, None);
    for (i, l) in levels.iter_mut().enumerate() {
        let h = if included(l) {
            scaled(factor, l.healthy, l.hosts)
        } else {
            0
        };
        if h > 0 && first_healthy.is_none() {
            first_healthy = Some(i);
        }
        l.healthy_load = (h * 100 / share).min(left);
        left -= l.healthy_load;
    }
    for (i, l) in levels.iter_mut().enumerate() {
        let d = if included(l) {
            scaled(factor, l.degraded, l.hosts)
        } else {
            0
        };
        if d > 0 && first_degraded.is_none() {
            first_degraded = Some(i);
        }
        l.degraded_load = (d * 100 / share).min(left);
        left -= l.degraded_load;
    }
    match (first_healthy, first_degraded) {
        (Some(i), _) => levels[i].healthy_load += left,
        (None, Some(i)) => levels[i].degraded_load += left,
        (None, None) => {}
    }
    availability
}

/// Envoy's per-priority health, load and panic, over `levels` sorted by priority.
fn distribute(levels: &mut [Level], factor: u64, threshold: f64) {
    let availability = hand_out(levels, factor, |_| true);
    if threshold == 0.0 && availability == 0 {
        return;
    }
    for l in levels.iter_mut() {
        let share = 100.0 * (l.healthy + l.degraded) as f64 / l.hosts.max(1) as f64;
        l.panic = availability < 100 && share < threshold;
    }
    if !levels.is_empty() && levels.iter().all(|l| l.panic) {
        // Total panic: by host count, healthy or not, the remainder to the first priority.
        let hosts: u64 = levels.iter().map(|l| l.hosts).sum();
        let mut left = 100u32;
        for l in levels.iter_mut() {
            l.healthy_load = u32::try_from(100 * l.hosts / hosts.max(1)).unwrap_or(100);
            l.degraded_load = 0;
            left = left.saturating_sub(l.healthy_load);
        }
        levels[0].healthy_load += left;
    }
}

#[cfg(test)]
#[path = "priority_tests.rs"]
mod tests;
