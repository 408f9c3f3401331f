//! How often each cluster's host set changed, as Envoy counts `membership_change`: once for
//! every priority of a cluster that a host joined or left. A cluster put in force (new, or a
//! new version: Envoy makes a new cluster object, every host of which is added) counts one per
//! priority that has hosts; a later assignment counts the priorities whose addresses differ.
//! A change of weight, locality or health status alone counts nothing: the host stays.
//!
//! The store counts here as it publishes a snapshot, the one moment both the host sets before
//! and after are at hand. The clusters whose hosts are not in the snapshot are not counted
//! here: a DNS cluster's hosts are what its names resolve to (the proxy counts those), and an
//! ORIGINAL_DST cluster's are made per connection.

use crate::model::cluster::{Cluster, Discovery};
use crate::model::endpoint::ClusterLoadAssignment;
use crate::snapshot::Snapshot;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Per cluster in force, its `membership_change` count.
#[derive(Debug, Default)]
pub struct MembershipChanges {
    counts: Mutex<BTreeMap<String, u64>>,
}

impl MembershipChanges {
    /// Count what publishing `next` over `prev` changes; forget the clusters `next` no longer
    /// has in force (Envoy's statistics go with the cluster).
    pub(crate) fn count(&self, prev: &Snapshot, next: &Snapshot) {
        // Listener and route updates, the most frequent, leave both maps shared.
        if Arc::ptr_eq(&prev.clusters, &next.clusters)
            && Arc::ptr_eq(&prev.endpoints, &next.endpoints)
        {
            return;
        }
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.retain(|name, _| next.clusters.contains_key(name));
        for (name, entry) in next.clusters.iter() {
            let cluster = &entry.model;
            if !hosts_in_snapshot(cluster) {
                continue;
            }
            let now = next.endpoints_of(cluster);
            // The same cluster (not rebuilt by Envoy) keeps its hosts; any other starts empty.
            let before = prev
                .cluster(name)
                .filter(|p| Arc::ptr_eq(p, cluster) || ***p == **cluster)
                .and_then(|p| prev.endpoints_of(p));
            let changed = match (before, now) {
                (Some(b), Some(n)) if std::ptr::eq(b, n) => 0,
                (before, now) => changed_priorities(before, now),
            };
            if changed > 0 {
                *counts.entry(name.clone()).or_default() += changed;
            }
        }
    }

    /// The count of the cluster named `name` (0 when it never changed).
    pub fn get(&self, name: &str) -> u64 {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .copied()
            .unwrap_or(0)
    }
}

/// Whether the snapshot holds the cluster's hosts (EDS, or its own `load_assignment`).
fn hosts_in_snapshot(c: &Cluster) -> bool {
    matches!(c.discovery, Discovery::Eds { .. } | Discovery::Static)
}

/// How many priorities' addresses differ between two assignments (none: no hosts).
fn changed_priorities(
    before: Option<&ClusterLoadAssignment>,
    now: Option<&ClusterLoadAssignment>,
) -> u64 {
    let (before, now) = (by_priority(before), by_priority(now));
    let priorities: BTreeSet<&u32> = before.keys().chain(now.keys()).collect();
    let differ = priorities
        .into_iter()
        .filter(|p| before.get(p) != now.get(p))
        .count();
    u64::try_from(differ).unwrap_or(u64::MAX)
}

/// Each priority's addresses (priorities without hosts left out).
fn by_priority(cla: Option<&ClusterLoadAssignment>) -> BTreeMap<u32, BTreeSet<SocketAddr>> {
    let mut hosts: BTreeMap<u32, BTreeSet<SocketAddr>> = BTreeMap::new();
    for (locality, endpoint) in cla.into_iter().flat_map(|c| c.endpoints()) {
        hosts
            .entry(locality.priority)
            .or_default()
            .insert(endpoint.address);
    }
    hosts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::endpoint::{Endpoint, Health, LocalityEndpoints};

    fn cla(hosts: &[(u32, &str, Health, u32)]) -> ClusterLoadAssignment {
        ClusterLoadAssignment {
            cluster_name: "c".into(),
            localities: hosts
                .iter()
                .map(|(priority, address, health, weight)| LocalityEndpoints {
                    locality: Default::default(),
                    priority: *priority,
                    weight: None,
                    endpoints: vec![Endpoint {
                        address: address.parse().expect("address"),
                        health: *health,
                        weight: *weight,
                        tls_mode: None,
                        workload: None,
                    }],
                })
                .collect(),
            overprovisioning_factor: 140,
        }
    }

    #[test]
    fn each_priority_a_host_joins_or_leaves_counts_once() {
        let h = Health::Healthy;
        let first = cla(&[(0, "10.0.0.1:80", h, 1), (0, "10.0.0.2:80", h, 1)]);
        let two = cla(&[(0, "10.0.0.1:80", h, 1), (1, "10.0.0.3:80", h, 1)]);
        // A new cluster: every priority with hosts.
        assert_eq!(changed_priorities(None, Some(&two)), 2);
        assert_eq!(changed_priorities(None, Some(&cla(&[]))), 0);
        // 10.0.0.2 left priority 0, 10.0.0.3 joined priority 1.
        assert_eq!(changed_priorities(Some(&first), Some(&two)), 2);
        // Weight and health alone: the same hosts.
        let reweighed = cla(&[
            (0, "10.0.0.1:80", Health::Degraded, 5),
            (0, "10.0.0.2:80", Health::Draining, 1),
        ]);
        assert_eq!(changed_priorities(Some(&first), Some(&reweighed)), 0);
        // A host moving priority leaves one and joins the other.
        let moved = cla(&[(0, "10.0.0.1:80", h, 1), (1, "10.0.0.2:80", h, 1)]);
        assert_eq!(changed_priorities(Some(&first), Some(&moved)), 2);
        // Every host gone.
        assert_eq!(changed_priorities(Some(&two), None), 2);
    }
}
