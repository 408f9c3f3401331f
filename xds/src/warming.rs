//! Cluster warming, as Envoy's cluster manager does it: a new cluster is not put in force
//! until it has initialised. An EDS cluster initialises once its first ClusterLoadAssignment
//! has arrived (an empty one counts) or its EDS `initial_fetch_timeout` has passed (Envoy's
//! 15 s when unset; istiod writes `0s`, for ever); then a cluster whose transport sockets name
//! SDS secrets served by the control plane (a DestinationRule's `credentialName`) waits for
//! each of those secrets, or its initial fetch timeout. Until then the cluster is *warming*:
//! routing does not find it (Envoy answers 503 `NC`), or, for a new version of a cluster in
//! force, the old version keeps serving; `/config_dump` lists it under
//! `dynamic_warming_clusters`. A cluster whose endpoints timed out goes in force with none (503
//! `UH`) and fills in when they arrive.
//!
//! In Envoy each secret is an SDS subscription (`SdsApi`) whose init target sits in the
//! cluster's init manager; the subscription starts when the cluster initialises (for an EDS
//! cluster once its endpoints have arrived) and its `initial_fetch_timeout` (istiod's
//! `SDSAdsConfig` sets none: Envoy's 15 s default) marks it ready without a secret. Here the
//! clock of a secret starts when the held clusters first want it ([`Snapshot::wanted_secrets`])
//! and is forgotten when none does; a secret that timed out holds no cluster back any more
//! (its connections then fail `UF`, as Envoy's do once the cluster is active without it). The
//! clock of a cluster's endpoints starts when the cluster is first held without them and is
//! forgotten when they arrive or the cluster goes.

use crate::snapshot::{Resources, Snapshot};
use envoy_types::pb::envoy::config::cluster::v3::Cluster as ClusterProto;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Envoy's default `initial_fetch_timeout`, which applies to the SDS subscriptions istiod
/// writes for `credentialName` (`SDSAdsConfig` leaves it unset on purpose, so that a secret the
/// proxy may not read does not keep its cluster warming for ever).
pub const DEFAULT_SECRET_FETCH_TIMEOUT: Duration = Duration::from_secs(15);

/// When each wanted secret's, and each warming cluster's endpoints', initial fetch times out.
#[derive(Debug, Clone)]
pub struct Waits {
    /// `None`: for ever (Envoy's `0s`); zero: nothing warms at all (resources from files).
    timeout: Option<Duration>,
    deadlines: BTreeMap<String, Instant>,
    /// Secrets whose initial fetch has been counted as timed out (once per clock).
    expired: BTreeSet<String>,
    /// (cluster, EDS name) of a cluster held without its endpoints → its wait for them.
    endpoints: BTreeMap<(String, String), EndpointWait>,
}

/// A cluster's wait for its first assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EndpointWait {
    Until(Instant),
    /// Its `initial_fetch_timeout` is `0s`.
    Forever,
    /// Timed out: the cluster initialised without endpoints (and stays so while it waits).
    Over,
}

impl Default for Waits {
    fn default() -> Self {
        Waits::new(Some(DEFAULT_SECRET_FETCH_TIMEOUT))
    }
}

impl Waits {
    /// Waits for secrets bounded by `timeout`; `None` waits for ever (Envoy's `0s`),
    /// `Some(ZERO)` not at all, and then no cluster waits for its endpoints either (resources
    /// read from files: there is nothing to wait for). Endpoints are waited for as each
    /// cluster's EDS config says.
    pub fn new(timeout: Option<Duration>) -> Waits {
        Waits {
            timeout,
            deadlines: BTreeMap::new(),
            expired: BTreeSet::new(),
            endpoints: BTreeMap::new(),
        }
    }

    /// Nothing warms (resources read from files).
    fn never(&self) -> bool {
        self.timeout.is_some_and(|t| t.is_zero())
    }

    /// Whether the initial fetch of `name` has timed out at `now`.
    fn timed_out(&self, name: &str, now: Instant) -> bool {
        match self.timeout {
            None => false,
            Some(t) if t.is_zero() => true,
            Some(_) => self.deadlines.get(name).is_some_and(|d| *d <= now),
        }
    }

    /// Whether cluster `cluster`'s wait for the endpoints of `service` has timed out at `now`.
    fn endpoints_timed_out(&self, cluster: &str, service: &str, now: Instant) -> bool {
        self.never()
            || match self
                .endpoints
                .get(&(cluster.to_string(), service.to_string()))
            {
                Some(EndpointWait::Until(d)) => *d <= now,
                Some(EndpointWait::Over) => true,
                Some(EndpointWait::Forever) | None => false,
            }
    }

    /// The secrets whose initial fetch has timed out by `now` without their arriving in
    /// `snapshot`, each once per clock (Envoy's `init_fetch_timeout`, counted per secret).
    pub fn secrets_timing_out(&mut self, snapshot: &Snapshot, now: Instant) -> Vec<String> {
        if self.timeout.is_none_or(|t| t.is_zero()) {
            return Vec::new();
        }
        let expired: Vec<String> = self
            .deadlines
            .iter()
            .filter(|(name, d)| **d <= now && !snapshot.secrets.contains_key(*name))
            .filter(|(name, _)| !self.expired.contains(*name))
            .map(|(name, _)| name.clone())
            .collect();
        self.expired.extend(expired.iter().cloned());
        expired
    }

    /// The secrets whose clocks run (those the clusters held want).
    pub fn timed_secrets(&self) -> impl Iterator<Item = &String> {
        self.deadlines.keys()
    }

    /// The next instant a secret or a cluster's endpoints still missing from `snapshot` time
    /// out, after `now`: when [`settle`] may have a cluster to put in force without them.
    pub fn next_deadline(&self, snapshot: &Snapshot, now: Instant) -> Option<Instant> {
        let secrets = self
            .timeout
            .and(Some(&self.deadlines))
            .into_iter()
            .flatten()
            .filter(|(name, d)| **d > now && !snapshot.secrets.contains_key(*name))
            .map(|(_, d)| *d);
        let endpoints = self
            .endpoints
            .iter()
            .filter(|((_, service), _)| !snapshot.endpoints.contains_key(service))
            .filter_map(|(_, wait)| match wait {
                EndpointWait::Until(d) if *d > now => Some(*d),
                _ => None,
            });
        secrets.chain(endpoints).min()
    }
}

/// Splits `newest` (the newest version held of every cluster) into the clusters in force and
/// those warming, in `next`: a cluster is in force when it is already (the same version), or
/// when its endpoints (EDS) are held or timed out and each ADS secret its sockets name is held
/// or has timed out; otherwise it warms, and the version in force before (if any) stays. The
/// clocks start as the endpoints and secrets become wanted. Returns whether the clusters in
/// force or warming, or the secrets they want, changed.
pub fn settle(
    next: &mut Snapshot,
    newest: Resources<ClusterProto>,
    waits: &mut Waits,
    now: Instant,
) -> bool {
    let in_force = Arc::clone(&next.clusters);
    let warming_before = Arc::clone(&next.warming_clusters);
    // A cluster held without its endpoints starts their clock (once); those that arrived, or
    // whose cluster went, are forgotten.
    let mut endpoint_waits = BTreeMap::new();
    for (name, entry) in &newest {
        let Some((service, timeout)) = entry.model.eds_wait() else {
            continue;
        };
        if next.endpoints.contains_key(service) {
            continue;
        }
        let key = (name.clone(), service.to_string());
        let mut wait = match (waits.endpoints.remove(&key), timeout) {
            (Some(started), _) => started,
            (None, Some(t)) => EndpointWait::Until(now + t),
            (None, None) => EndpointWait::Forever,
        };
        if matches!(wait, EndpointWait::Until(d) if d <= now) {
            wait = EndpointWait::Over;
        }
        endpoint_waits.insert(key, wait);
    }
    waits.endpoints = endpoint_waits;
    // A cluster whose endpoints timed out has initialised without them: it wants its secrets.
    let timed_out: BTreeSet<String> = waits
        .endpoints
        .keys()
        .filter(|(cluster, service)| waits.endpoints_timed_out(cluster, service, now))
        .map(|(_, service)| service.clone())
        .collect();
    let initialised_now = timed_out != *next.endpoints_timed_out;
    if initialised_now {
        next.endpoints_timed_out = Arc::new(timed_out);
    }
    // The newest clusters want their secrets (an EDS one once initialised): their clocks
    // start now.
    next.clusters = Arc::new(newest.clone());
    next.warming_clusters = Arc::default();
    for name in next.wanted_secrets() {
        let deadline = now + waits.timeout.unwrap_or_default();
        waits.deadlines.entry(name).or_insert(deadline);
    }
    let mut active = Resources::new();
    let mut warming = Resources::new();
    for (name, entry) in newest {
        // A version in force stays so (Envoy's active cluster does not warm again when its
        // endpoints go).
        let initialised = in_force.get(&name).is_some_and(|e| Arc::ptr_eq(e, &entry));
        let endpoints = entry.model.eds_wait().is_none_or(|(service, _)| {
            next.endpoints.contains_key(service) || waits.endpoints_timed_out(&name, service, now)
        });
        let secrets = entry
            .model
            .ads_secrets()
            .all(|s| next.secrets.contains_key(s) || waits.timed_out(s, now));
        if initialised || (endpoints && secrets) {
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
    waits.expired.retain(|name| wanted.contains(name));
    // A cluster that initialised without endpoints wants its secrets: that too is news.
    changed || initialised_now
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
