//! Cluster warming on secrets, as Envoy's cluster manager does it: a cluster whose transport
//! sockets name SDS secrets served by the control plane (a DestinationRule's
//! `credentialName`) is not put in force until each of those secrets has arrived, or its
//! initial fetch has timed out. Until then the cluster is *warming*: routing does not find it
//! (Envoy answers 503 `NC`), or, for a new version of a cluster in force, the old version keeps
//! serving; `/config_dump` lists it under `dynamic_warming_clusters`.
//!
//! In Envoy each secret is an SDS subscription (`SdsApi`) whose init target sits in the
//! cluster's init manager; the subscription starts when the cluster initialises (for an EDS
//! cluster once its endpoints have arrived) and its `initial_fetch_timeout` (istiod's
//! `SDSAdsConfig` sets none: Envoy's 15 s default) marks it ready without a secret. Here the
//! clock of a secret starts when the held clusters first want it ([`Snapshot::wanted_secrets`])
//! and is forgotten when none does; a secret that timed out holds no cluster back any more
//! (its connections then fail `UF`, as Envoy's do once the cluster is active without it).

use crate::snapshot::{Resources, Snapshot};
use envoy_types::pb::envoy::config::cluster::v3::Cluster as ClusterProto;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Envoy's default `initial_fetch_timeout`, which applies to the SDS subscriptions istiod
/// writes for `credentialName` (`SDSAdsConfig` leaves it unset on purpose, so that a secret the
/// proxy may not read does not keep its cluster warming for ever).
pub const DEFAULT_SECRET_FETCH_TIMEOUT: Duration = Duration::from_secs(15);

/// When each wanted secret's initial fetch times out.
#[derive(Debug, Clone)]
pub struct SecretWaits {
    /// `None`: for ever (Envoy's `0s`).
    timeout: Option<Duration>,
    deadlines: BTreeMap<String, Instant>,
}

impl Default for SecretWaits {
    fn default() -> Self {
        SecretWaits::new(Some(DEFAULT_SECRET_FETCH_TIMEOUT))
    }
}

impl SecretWaits {
    /// Waits bounded by `timeout`; `None` waits for ever (Envoy's `0s`), `Some(ZERO)` not at
    /// all (resources read from files: there is nothing to wait for).
    pub fn new(timeout: Option<Duration>) -> SecretWaits {
        SecretWaits {
            timeout,
            deadlines: BTreeMap::new(),
        }
    }

    /// Whether the initial fetch of `name` has timed out at `now`.
    fn timed_out(&self, name: &str, now: Instant) -> bool {
        match self.timeout {
            None => false,
            Some(t) if t.is_zero() => true,
            Some(_) => self.deadlines.get(name).is_some_and(|d| *d <= now),
        }
    }

    /// The next instant a secret still missing from `snapshot` times out, after `now`: when
    /// [`settle`] may have a cluster to put in force without it.
    pub fn next_deadline(&self, snapshot: &Snapshot, now: Instant) -> Option<Instant> {
        self.timeout?;
        self.deadlines
            .iter()
            .filter(|(name, d)| **d > now && !snapshot.secrets.contains_key(*name))
            .map(|(_, d)| *d)
            .min()
    }
}

/// Splits `newest` (the newest version held of every cluster) into the clusters in force and
/// those warming, in `next`: a cluster is in force when each ADS secret its sockets name is
/// held or has timed out; otherwise it warms, and the version in force before (if any) stays.
/// The secrets' clocks start as they become wanted. Returns whether the clusters in force or
/// warming changed.
pub fn settle(
    next: &mut Snapshot,
    newest: Resources<ClusterProto>,
    waits: &mut SecretWaits,
    now: Instant,
) -> bool {
    let in_force = Arc::clone(&next.clusters);
    let warming_before = Arc::clone(&next.warming_clusters);
    // The newest clusters want their secrets (an EDS one once its endpoints are held): their
    // clocks start now.
    next.clusters = Arc::new(newest.clone());
    next.warming_clusters = Arc::default();
    for name in next.wanted_secrets() {
        let deadline = now + waits.timeout.unwrap_or_default();
        waits.deadlines.entry(name).or_insert(deadline);
    }
    let mut active = Resources::new();
    let mut warming = Resources::new();
    for (name, entry) in newest {
        let ready = entry
            .model
            .ads_secrets()
            .all(|s| next.secrets.contains_key(s) || waits.timed_out(s, now));
        if ready {
            active.insert(name, entry);
        } else {
            if let Some(previous) = in_force.get(&name) {
                active.insert(name.clone(), Arc::clone(previous));
            }
            warming.insert(name, entry);
        }
    }
    let changed = !same(&active, &in_force) || !same(&warming, &warming_before);
    // Unchanged maps keep their identity (and no copy is published).
    (next.clusters, next.warming_clusters) = match changed {
        true => (Arc::new(active), Arc::new(warming)),
        false => (in_force, warming_before),
    };
    // Forget the clocks of secrets no cluster held wants (a later want starts afresh, as a new
    // subscription would).
    let wanted = next.wanted_secrets();
    waits.deadlines.retain(|name, _| wanted.contains(name));
    changed
}

/// Whether two maps hold the same entries (by identity).
fn same(a: &Resources<ClusterProto>, b: &Resources<ClusterProto>) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b.iter())
            .all(|((na, ea), (nb, eb))| na == nb && Arc::ptr_eq(ea, eb))
}

#[cfg(test)]
mod tests;
