//! The endpoints a pick chooses among, with what keeps them alive, and a cluster's priority
//! loads kept for them.
//!
//! Envoy computes a cluster's priority loads ([`super::priority`]) when its host set changes
//! (an EDS update, a health change, an ejection or its end), not per request. Remora keeps the
//! loads of the assignment a cluster last picked from with no host ejected, and counts the
//! hosts again only when another assignment comes (a push) or while a host is out, where the
//! loads depend on the moment. The assignment is named by its address; the entry holds the
//! `Arc` that owns it, so that no other assignment can take that address while the entry
//! lives. The entry also holds the state of each of its hosts, in the assignment's order, so
//! that the host a pick chooses is found by its place, not looked up by address.

use super::balance::{Candidates, Draws};
use super::outlier::HostState;
use super::priority::Loads;
use remora_xds::model::endpoint::{ClusterLoadAssignment, Endpoint};
use remora_xds::model::Cluster;
use std::sync::Arc;

/// The endpoints of one cluster as one pick sees them.
#[derive(Debug, Clone, Copy)]
pub enum Assignment<'a> {
    /// An EDS assignment, or a DNS cluster's resolution: shared, replaced whole on change.
    Shared(&'a Arc<ClusterLoadAssignment>),
    /// A static cluster's own `load_assignment`, which lives as long as its cluster.
    Inline(&'a Arc<Cluster>, &'a ClusterLoadAssignment),
}

impl<'a> Assignment<'a> {
    /// The assignment of `c`: EDS's (`eds`, as the snapshot has it for the cluster's service
    /// name) for an EDS cluster, else the cluster's own, as [`remora_xds::snapshot::Snapshot::endpoints_of`]
    /// decides.
    pub fn of(c: &'a Arc<Cluster>, eds: Option<&'a Arc<ClusterLoadAssignment>>) -> Option<Self> {
        match c.eds_service_name() {
            Some(_) => eds.map(Assignment::Shared),
            None => c
                .load_assignment
                .as_ref()
                .map(|cla| Assignment::Inline(c, cla)),
        }
    }

    pub fn cla(self) -> &'a ClusterLoadAssignment {
        match self {
            Assignment::Shared(cla) => cla,
            Assignment::Inline(_, cla) => cla,
        }
    }

    fn owner(self) -> Owner {
        match self {
            Assignment::Shared(cla) => Owner::Shared(Arc::clone(cla)),
            Assignment::Inline(c, _) => Owner::Inline(Arc::clone(c)),
        }
    }

    fn is(self, owner: &Owner) -> bool {
        match (self, owner) {
            (Assignment::Shared(a), Owner::Shared(b)) => Arc::ptr_eq(a, b),
            (Assignment::Inline(a, _), Owner::Inline(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// What keeps a kept assignment alive.
#[derive(Debug)]
enum Owner {
    Shared(Arc<ClusterLoadAssignment>),
    Inline(Arc<Cluster>),
}

/// The priority loads of one assignment with every host in, and its hosts' run-time state.
#[derive(Debug)]
pub struct KeptLoads {
    owner: Owner,
    panic_threshold: f64,
    loads: Loads,
    /// The state of each endpoint of the assignment, in its order (locality by locality), so
    /// that a pick finds the chosen host's without looking its address up.
    hosts: Box<[Arc<HostState>]>,
    /// Whether every pick with no host ejected chooses the assignment's one endpoint, healthy
    /// (not panic), without locality weighting and with it (indexed by that flag). An inbound
    /// cluster (the local workload) and a one-replica service are such: their picks then draw
    /// no random numbers and walk no loads.
    sole: [bool; 2],
}

impl KeptLoads {
    /// The loads of `a` with no host ejected, Envoy's panic threshold `panic_threshold`;
    /// `hosts`: the state of each endpoint of `a`, in its order.
    pub fn new(a: Assignment<'_>, panic_threshold: f64, hosts: Box<[Arc<HostState>]>) -> Self {
        let cla = a.cla();
        let loads = Loads::new(cla, panic_threshold, |_| true);
        let one = cla.endpoints().nth(1).is_none() && hosts.len() == 1;
        // With one endpoint, any draw lands on it or on none: a single draw tells which.
        let sole = [false, true].map(|locality_weighted| {
            let draws = Draws {
                priority: 0,
                locality: 0,
            };
            let candidates =
                Candidates::choose_by(cla, &loads, locality_weighted, |_: &Endpoint| true, draws);
            one && candidates.len() == 1 && !candidates.panic()
        });
        KeptLoads {
            owner: a.owner(),
            panic_threshold,
            loads,
            hosts,
            sole,
        }
    }

    /// The one endpoint every pick with no host ejected chooses, with its state, when the
    /// assignment (`cla`, the kept one's) has only that one and it is healthy.
    pub fn sole<'c>(
        &self,
        cla: &'c ClusterLoadAssignment,
        locality_weighted: bool,
    ) -> Option<(&'c Endpoint, &Arc<HostState>)> {
        if !self.sole[usize::from(locality_weighted)] {
            return None;
        }
        let (_, e) = cla.endpoints().next()?;
        Some((e, self.hosts.first()?))
    }

    /// The state of `e`, an endpoint of `cla` (the kept assignment's), found by its place in
    /// the assignment; `None` for an endpoint that is not one of its own.
    pub fn host_of(&self, cla: &ClusterLoadAssignment, e: &Endpoint) -> Option<&Arc<HostState>> {
        let at = std::ptr::from_ref(e) as usize;
        let size = std::mem::size_of::<Endpoint>().max(1);
        let mut offset = 0;
        for l in &cla.localities {
            let start = l.endpoints.as_ptr() as usize;
            let end = start + l.endpoints.len() * size;
            if (start..end).contains(&at) {
                return self.hosts.get(offset + (at - start) / size);
            }
            offset += l.endpoints.len();
        }
        None
    }

    /// Whether these are `a`'s loads with that threshold.
    pub fn are_of(&self, a: Assignment<'_>, panic_threshold: f64) -> bool {
        a.is(&self.owner) && self.panic_threshold == panic_threshold
    }

    pub fn loads(&self) -> &Loads {
        &self.loads
    }
}
