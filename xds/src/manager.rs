//! What Envoy's cluster and listener managers count of each configuration change
//! (`cluster_manager.cluster_added|modified|removed`, `listener_manager.listener_added|
//! modified|removed|in_place_updated`), counted as the store publishes a snapshot: the one
//! moment both the resources before and after are at hand.
//!
//! As in Envoy, a resource is compared whole, as received: one sent again unchanged (a new
//! version of the same bytes) counts nothing. A cluster counts as added or modified when it is
//! received, warming or not (Envoy counts it before warming it). A listener whose update
//! changes its filter chains only is updated in place by Envoy, which counts it both as
//! modified and as `listener_in_place_updated`; any other change is a full update.
//!
//! Envoy also counts its bootstrap's static clusters and listeners (an Istio sidecar's
//! `prometheus_stats`, `xds-grpc`…); Remora has none of those to count.

use crate::convert::Resource;
use crate::snapshot::{Entry, Resources, Snapshot};
use envoy_types::pb::envoy::config::listener::v3::Listener as ListenerProto;
use prost::Message;
use std::sync::{Arc, Mutex, PoisonError};

/// The counts since start.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ManagerCounts {
    pub cluster_added: u64,
    pub cluster_modified: u64,
    pub cluster_removed: u64,
    pub listener_added: u64,
    pub listener_modified: u64,
    pub listener_removed: u64,
    pub listener_in_place_updated: u64,
}

/// The counts, kept by the store.
#[derive(Debug, Default)]
pub struct ManagerChanges {
    counts: Mutex<ManagerCounts>,
}

/// How a map of resources changed.
struct Diff<'a, T: Resource> {
    added: u64,
    removed: u64,
    /// Before and after, of each resource whose bytes changed.
    modified: Vec<(&'a Entry<T>, &'a Entry<T>)>,
}

impl ManagerChanges {
    /// Count what publishing `next` over `prev` changes.
    pub(crate) fn count(&self, prev: &Snapshot, next: &Snapshot) {
        let clusters_same = Arc::ptr_eq(&prev.clusters, &next.clusters)
            && Arc::ptr_eq(&prev.warming_clusters, &next.warming_clusters);
        let listeners_same = Arc::ptr_eq(&prev.listeners, &next.listeners);
        if clusters_same && listeners_same {
            // Route and endpoint updates, the most frequent, change neither.
            return;
        }
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if !clusters_same {
            // A cluster warming is the newest version held of it, as in Envoy's manager. Most
            // updates warm nothing: then the maps in force are compared as they are.
            let warming = !prev.warming_clusters.is_empty() || !next.warming_clusters.is_empty();
            let newest = warming.then(|| (prev.newest_clusters(), next.newest_clusters()));
            let (before, after) = match &newest {
                Some((before, after)) => (before, after),
                None => (&*prev.clusters, &*next.clusters),
            };
            let diff = diff(before, after);
            counts.cluster_added += diff.added;
            counts.cluster_removed += diff.removed;
            counts.cluster_modified += len(&diff.modified);
        }
        if !listeners_same {
            let diff = diff(&prev.listeners, &next.listeners);
            counts.listener_added += diff.added;
            counts.listener_removed += diff.removed;
            counts.listener_modified += len(&diff.modified);
            let in_place = diff
                .modified
                .iter()
                .filter(|(before, after)| filter_chains_only(before, after))
                .count();
            counts.listener_in_place_updated += u64::try_from(in_place).unwrap_or(u64::MAX);
        }
    }

    /// The counts now.
    pub fn get(&self) -> ManagerCounts {
        *self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn len<T>(items: &[T]) -> u64 {
    u64::try_from(items.len()).unwrap_or(u64::MAX)
}

/// Which resources `after` adds, removes and changes over `before`.
fn diff<'a, T: Resource>(before: &'a Resources<T>, after: &'a Resources<T>) -> Diff<'a, T> {
    let mut d = Diff {
        added: 0,
        removed: 0,
        modified: Vec::new(),
    };
    for (name, now) in after {
        match before.get(name) {
            None => d.added += 1,
            Some(was) if !Arc::ptr_eq(was, now) && was.encoded() != now.encoded() => {
                d.modified.push((was, now));
            }
            Some(_) => {}
        }
    }
    let removed = before.keys().filter(|name| !after.contains_key(*name));
    d.removed = u64::try_from(removed.count()).unwrap_or(u64::MAX);
    d
}

/// Whether Envoy updates the listener in place: the new version has filter chains, and only
/// they (its filter chains, default chain and chain matcher) differ. A listener that cannot
/// be decoded (never: it was decoded to be held) counts as a full update.
fn filter_chains_only(before: &Entry<ListenerProto>, after: &Entry<ListenerProto>) -> bool {
    let (Ok(mut before), Ok(mut after)) = (before.proto(), after.proto()) else {
        return false;
    };
    if after.filter_chains.is_empty() {
        return false;
    }
    for l in [&mut before, &mut after] {
        l.filter_chains.clear();
        l.default_filter_chain = None;
        l.filter_chain_matcher = None;
    }
    before.encode_to_vec() == after.encode_to_vec()
}

#[cfg(test)]
mod tests;
