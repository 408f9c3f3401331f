//! The model store: what the discovery client delivers ([`Sink::apply`]) becomes a new
//! [`Snapshot`], published whole through `arc-swap` for the data path to read without locks.
//! Per resource, as Envoy does: accepted ones replace or join what is held, refused ones keep
//! their previous version, and the rest of the update is applied regardless.

use crate::convert::{from_bytes, Resource};
use crate::sink::{type_url, Applied, Interest, Rejection, Resource as Delivered, Sink, Update};
use crate::snapshot::{Entry, Resources, Snapshot};
use crate::warming::{settle, Waits};
use arc_swap::ArcSwap;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Holds the current snapshot; the ADS client's [`Sink`].
#[derive(Debug, Default)]
pub struct Store {
    current: ArcSwap<Snapshot>,
    /// Counts the snapshots published: a reader that found something in generation `g` may
    /// keep it while this still says `g`, with no load of the snapshot itself.
    generation: AtomicU64,
    /// Serialises writers: each builds the next snapshot from the one it read. It guards the
    /// clocks of the secrets warming clusters wait for.
    writer: Mutex<Waits>,
    /// Wakes [`Store::run_warming_timeouts`] when a secret's clock may have started.
    warming_started: tokio::sync::Notify,
    /// Wakes whoever waits for the next listener update ([`Store::listeners_changed`]).
    listeners_published: tokio::sync::Notify,
    /// The secrets the clusters held want, for the ADS client to follow between responses
    /// ([`Sink::interest`]): a warming timeout can change them with no response applied.
    interest: tokio::sync::watch::Sender<Interest>,
    /// Per secret wanted, how many times its initial fetch timed out (Envoy's
    /// `sds.<name>.init_fetch_timeout`).
    secret_fetch_timeouts: Mutex<BTreeMap<String, u64>>,
    /// Per cluster in force, how often its hosts changed (Envoy's `membership_change`).
    membership: crate::membership::MembershipChanges,
    /// What the cluster and listener managers count of each change (Envoy's
    /// `cluster_manager.cluster_added`…).
    manager: crate::manager::ManagerChanges,
}

impl Store {
    /// An empty store.
    pub fn new() -> Store {
        Store::default()
    }

    /// An empty store whose warming clusters wait `timeout` at most for each SDS secret
    /// (Envoy's `initial_fetch_timeout`; `None`: for ever; zero: not at all, and then no
    /// cluster waits for its endpoints either: resources read from files).
    pub fn with_secret_fetch_timeout(timeout: Option<Duration>) -> Store {
        Store {
            writer: Mutex::new(Waits::new(timeout)),
            ..Store::default()
        }
    }

    /// Puts in force the warming clusters whose secrets' or endpoints' initial fetch has timed
    /// out by `now`, as Envoy's SDS and EDS init targets give up waiting; returns the next
    /// instant this has something to do.
    pub fn expire_waits(&self, now: Instant) -> Option<Instant> {
        let mut waits = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let current = self.current.load_full();
        if !current.warming_clusters.is_empty() {
            let mut next = Snapshot::clone(&current);
            if settle(&mut next, current.newest_clusters(), &mut waits, now) {
                tracing::info!(
                    warming = next.warming_clusters.len(),
                    "initial fetch of an SDS secret or of a cluster's endpoints timed out: its clusters are in force without them"
                );
                let wanted = next.wanted_secrets();
                self.publish(next, false);
                self.want_secrets(wanted);
            }
        }
        self.count_fetch_timeouts(&mut waits, now);
        waits.next_deadline(&self.current.load(), now)
    }

    /// Runs for ever: ends the warming of clusters whose secrets or endpoints did not arrive in
    /// time. The ADS glue spawns it beside the client.
    pub async fn run_warming_timeouts(&self) {
        loop {
            let started = self.warming_started.notified();
            tokio::pin!(started);
            started.as_mut().enable();
            match self.expire_waits(Instant::now()) {
                Some(deadline) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => {}
                        _ = started => {}
                    }
                }
                None => started.await,
            }
        }
    }

    /// Publishes `next` as the current snapshot.
    fn publish(&self, next: Snapshot, listeners: bool) {
        let prev = self.current.load();
        self.membership.count(&prev, &next);
        self.manager.count(&prev, &next);
        drop(prev);
        self.current.store(Arc::new(next));
        self.generation.fetch_add(1, Ordering::Release);
        if listeners {
            self.listeners_published.notify_waiters();
        }
    }

    /// Counts the secrets whose initial fetch timed out by `now`; forgets the counts of those
    /// no longer wanted (Envoy's statistics go with the secret's subscription).
    fn count_fetch_timeouts(&self, waits: &mut Waits, now: Instant) {
        let expired = waits.secrets_timing_out(&self.current.load(), now);
        let mut counts = self
            .secret_fetch_timeouts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let timed: BTreeSet<&String> = waits.timed_secrets().collect();
        counts.retain(|name, _| timed.contains(name));
        for name in expired {
            *counts.entry(name).or_default() += 1;
        }
    }

    /// How often the hosts of the cluster named `cluster` changed since it came in force
    /// (Envoy's `cluster.<name>.membership_change`; EDS and STATIC clusters only).
    pub fn membership_changes(&self, cluster: &str) -> u64 {
        self.membership.get(cluster)
    }

    /// The cluster and listener managers' change counts since start (Envoy's
    /// `cluster_manager.cluster_added`, `listener_manager.listener_modified`…).
    pub fn manager_counts(&self) -> crate::manager::ManagerCounts {
        self.manager.get()
    }

    /// Per secret, how many times its initial fetch timed out (Envoy's
    /// `sds.<name>.init_fetch_timeout`), for the secrets the clusters held still want.
    pub fn secret_fetch_timeouts(&self) -> BTreeMap<String, u64> {
        self.secret_fetch_timeouts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Tells the ADS client which secrets are wanted, waking it only when that changed.
    fn want_secrets(&self, wanted: BTreeSet<String>) {
        self.interest.send_if_modified(|interest| {
            let changed = interest
                .get(type_url::SECRET)
                .map_or(!wanted.is_empty(), |held| *held != wanted);
            if changed {
                interest.insert(type_url::SECRET, wanted);
            }
            changed
        });
    }

    /// The current snapshot, to keep (one atomic load and a reference count).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// The current snapshot for a short look, as a connection takes its decision (arc-swap's
    /// guard: no reference-count traffic between cores). Do not hold it across awaits.
    pub fn current(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.current.load()
    }

    /// How many snapshots have been published. Read before [`Store::current`], it is never
    /// newer than the snapshot that returns: what was found in that snapshot may be used for
    /// as long as this is unchanged.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Resolves when a snapshot with a listener update is published after this future is
    /// polled or [enabled](tokio::sync::futures::Notified::enable): enable it, look at the
    /// current snapshot, then await it, and no publication in between is missed. Only listener
    /// updates: they are what changes a connection's filter chain, and the other types come
    /// far more often.
    pub fn listeners_changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.listeners_published.notified()
    }
}

/// Apply one update of type `T` to `held`: which resources were refused, and the names now
/// held that the update says are gone.
fn apply_to<T: Resource>(
    held: &mut Resources<T>,
    update: Update,
    removal_by_absence: bool,
    now: SystemTime,
) -> Vec<Rejection> {
    let mut rejected = Vec::new();
    let mut present = BTreeSet::new();
    for Delivered {
        name,
        version,
        body,
    } in update.resources
    {
        match from_bytes::<T>(&body) {
            Ok(c) => {
                let resource_name = c.proto.name().to_string();
                // In delta the name comes with the resource; it must be the body's own.
                if !name.is_empty() && name != resource_name {
                    rejected.push(Rejection {
                        name: name.clone(),
                        reason: format!(
                            "{} {name}: the resource is named {resource_name:?}",
                            T::KIND
                        ),
                    });
                    present.insert(name);
                    continue;
                }
                present.insert(resource_name.clone());
                // The bytes as received are kept, not the decoded proto (see `Entry`).
                held.insert(
                    resource_name,
                    Arc::new(Entry::new(c.model, body, version, now)),
                );
            }
            Err(refusal) => {
                let name = if name.is_empty() {
                    refusal.name.clone()
                } else {
                    name
                };
                present.insert(name.clone());
                rejected.push(Rejection {
                    name,
                    reason: refusal.to_string(),
                });
            }
        }
    }
    for name in &update.removed {
        held.remove(name);
    }
    if update.complete && removal_by_absence {
        held.retain(|name, _| present.contains(name));
    }
    rejected
}

/// Drop what is no longer wanted (copying the map only when something goes).
fn prune<T: Resource>(held: &mut Arc<Resources<T>>, wanted: &BTreeSet<String>) {
    if held.keys().any(|name| !wanted.contains(name)) {
        Arc::make_mut(held).retain(|name, _| wanted.contains(name));
    }
}

impl Sink for Store {
    fn interest(&self) -> Option<tokio::sync::watch::Receiver<Interest>> {
        Some(self.interest.subscribe())
    }

    fn apply(&self, type_url: &str, update: Update) -> Applied {
        // A poisoned lock only means another writer panicked; the snapshot it guards is
        // immutable and still whole, so carry on.
        let mut waits = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut next = Snapshot::clone(&self.current.load_full());
        let now = SystemTime::now();
        let mut applied = Applied::default();
        match type_url {
            type_url::LISTENER => {
                let mut listeners = Resources::clone(&next.listeners);
                applied.rejected = apply_to(&mut listeners, update, true, now);
                next = next.with_listeners(listeners);
                let wanted = next.wanted_routes();
                prune(&mut next.routes, &wanted);
                applied.wanted.insert(type_url::ROUTE, wanted);
            }
            type_url::CLUSTER => {
                // The update applies to the newest version of each cluster, warming or not.
                let mut newest = next.newest_clusters();
                applied.rejected = apply_to(&mut newest, update, true, now);
                settle(&mut next, newest, &mut waits, Instant::now());
                let wanted = next.wanted_endpoints();
                prune(&mut next.endpoints, &wanted);
                applied.wanted.insert(type_url::ENDPOINT, wanted);
                let wanted = next.wanted_secrets();
                prune(&mut next.secrets, &wanted);
                applied.wanted.insert(type_url::SECRET, wanted);
            }
            // State of the world for RDS and EDS carries only what was asked: absence is no
            // removal; what no listener or cluster wants any more is pruned above.
            type_url::ROUTE => {
                applied.rejected = apply_to(Arc::make_mut(&mut next.routes), update, false, now);
            }
            type_url::ENDPOINT => {
                applied.rejected = apply_to(Arc::make_mut(&mut next.endpoints), update, false, now);
                // A cluster whose endpoints arrived initialises: now it wants its secrets (and
                // their clocks start).
                settle_warming(&mut next, &mut waits);
                applied
                    .wanted
                    .insert(type_url::SECRET, next.wanted_secrets());
            }
            // SDS is asked for by name as EDS is: absence is no removal.
            type_url::SECRET => {
                applied.rejected = apply_to(Arc::make_mut(&mut next.secrets), update, false, now);
                // Clusters warming on these secrets go in force.
                settle_warming(&mut next, &mut waits);
            }
            // One table, the whole of it each time (pilot-agent replaces its table whole).
            type_url::NAME_TABLE => {
                applied.rejected =
                    apply_to(Arc::make_mut(&mut next.name_tables), update, true, now);
            }
            other => {
                applied.rejected = update
                    .resources
                    .into_iter()
                    .map(|r| Rejection {
                        name: r.name,
                        reason: format!("resource type {other} not supported"),
                    })
                    .collect();
                return applied;
            }
        }
        // The interest in secrets is published under the writer lock, so that the watch
        // never goes back to an older set than the snapshot's.
        if let Some(secrets) = applied.wanted.get(type_url::SECRET) {
            self.want_secrets(secrets.clone());
        }
        drop(waits);
        self.publish(next, type_url == type_url::LISTENER);
        if matches!(type_url, type_url::CLUSTER | type_url::ENDPOINT) {
            self.warming_started.notify_waiters();
        }
        applied
    }
}

/// After an update of another type, the warming clusters settle again (nothing to do when none
/// warms).
fn settle_warming(next: &mut Snapshot, waits: &mut Waits) {
    if !next.warming_clusters.is_empty() {
        let newest = next.newest_clusters();
        settle(next, newest, waits, Instant::now());
    }
}

#[cfg(test)]
mod tests;
