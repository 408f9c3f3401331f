//! The model store: what the discovery client delivers ([`Sink::apply`]) becomes a new
//! [`Snapshot`], published whole through `arc-swap` for the data path to read without locks.
//! Per resource, as Envoy does: accepted ones replace or join what is held, refused ones keep
//! their previous version, and the rest of the update is applied regardless.

use crate::convert::{from_bytes, Resource};
use crate::sink::{type_url, Applied, Interest, Rejection, Resource as Delivered, Sink, Update};
use crate::snapshot::{Entry, Resources, Snapshot};
use crate::warming::{settle, Waits};
use arc_swap::ArcSwap;
use std::collections::BTreeSet;
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
        self.current.store(Arc::new(next));
        self.generation.fetch_add(1, Ordering::Release);
        if listeners {
            self.listeners_published.notify_waiters();
        }
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
mod tests {
    use super::*;
    use crate::json::from_json_typed;
    use serde_json::{json, Value};

    fn body<T: Resource>(value: Value) -> Vec<u8> {
        from_json_typed::<T>(&value, T::KIND.message_name())
            .expect("test resource reads")
            .encode_to_vec()
    }

    fn delivered<T: Resource>(name: &str, version: &str, value: Value) -> Delivered {
        Delivered {
            name: name.into(),
            version: version.into(),
            body: body::<T>(value),
        }
    }

    type ClusterProto = envoy_types::pb::envoy::config::cluster::v3::Cluster;
    type ListenerProto = envoy_types::pb::envoy::config::listener::v3::Listener;
    type ClaProto = envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;

    fn eds_cluster(name: &str, timeout: &str) -> Value {
        json!({
            "name": name,
            "type": "EDS",
            "eds_cluster_config": {"eds_config": {"ads": {}}, "service_name": name},
            "connect_timeout": timeout,
            "lb_policy": "LEAST_REQUEST"
        })
    }

    fn tcp_listener(name: &str, address: &str, port: u32, cluster: &str) -> Value {
        json!({
            "name": name,
            "address": {"socket_address": {"address": address, "port_value": port}},
            "traffic_direction": "OUTBOUND",
            "bind_to_port": false,
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.tcp_proxy",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": cluster, "cluster": cluster
                }
            }]}]
        })
    }

    fn http_listener(name: &str, port: u32, rds: &str) -> Value {
        json!({
            "name": name,
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
            "traffic_direction": "OUTBOUND",
            "bind_to_port": false,
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "outbound_0.0.0.0_9080",
                    "rds": {"config_source": {"ads": {}}, "route_config_name": rds},
                    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
                }
            }]}]
        })
    }

    fn update(resources: Vec<Delivered>, complete: bool) -> Update {
        Update {
            resources,
            removed: vec![],
            complete,
        }
    }

    #[test]
    fn a_listener_update_wakes_who_waits_for_one_and_other_types_do_not() {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        let store = Store::new();
        let waiting = store.listeners_changed();
        tokio::pin!(waiting);
        waiting.as_mut().enable();
        let mut cx = Context::from_waker(Waker::noop());
        store.apply(
            type_url::CLUSTER,
            update(
                vec![delivered::<ClusterProto>("a", "1", eds_cluster("a", "1s"))],
                true,
            ),
        );
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        store.apply(
            type_url::LISTENER,
            update(
                vec![delivered::<ListenerProto>(
                    "l",
                    "1",
                    tcp_listener("l", "0.0.0.0", 80, "a"),
                )],
                true,
            ),
        );
        assert_eq!(waiting.as_mut().poll(&mut cx), Poll::Ready(()));
    }

    #[test]
    fn a_refused_resource_keeps_its_previous_version_and_the_rest_applies() {
        let store = Store::new();
        let applied = store.apply(
            type_url::CLUSTER,
            update(
                vec![delivered::<ClusterProto>("a", "1", eds_cluster("a", "1s"))],
                true,
            ),
        );
        assert!(applied.rejected.is_empty(), "{:?}", applied.rejected);
        assert_eq!(
            applied.wanted.get(type_url::ENDPOINT),
            Some(&BTreeSet::from(["a".to_string()]))
        );
        let mut bad = eds_cluster("a", "2s");
        bad["outlier_detection"] = json!({"consecutive_5xx": 3});
        let applied = store.apply(
            type_url::CLUSTER,
            update(
                vec![
                    delivered::<ClusterProto>("a", "2", bad),
                    delivered::<ClusterProto>("b", "2", eds_cluster("b", "3s")),
                ],
                true,
            ),
        );
        assert_eq!(applied.rejected.len(), 1);
        assert_eq!(applied.rejected[0].name, "a");
        assert!(
            applied.rejected[0].reason.contains("outlier_detection"),
            "{}",
            applied.rejected[0].reason
        );
        // Both warm on their endpoints (see `crate::warming`): look at the newest versions.
        let newest = store.snapshot().newest_clusters();
        let a = &newest["a"];
        assert_eq!(a.version, "1");
        assert_eq!(a.model.connect_timeout, std::time::Duration::from_secs(1));
        assert_eq!(newest["b"].version, "2");
        // The refused one is still present in the world: a complete update without it would
        // have removed it; this one named it, so it stays.
        assert_eq!(newest.len(), 2);
    }

    #[test]
    fn complete_updates_remove_absent_and_delta_removes_named() {
        let store = Store::new();
        store.apply(
            type_url::CLUSTER,
            update(
                vec![
                    delivered::<ClusterProto>("", "1", eds_cluster("a", "1s")),
                    delivered::<ClusterProto>("", "1", eds_cluster("b", "1s")),
                ],
                true,
            ),
        );
        let cla = json!({"cluster_name": "a", "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": "10.0.0.1", "port_value": 80}}}}]}]});
        store.apply(
            type_url::ENDPOINT,
            update(vec![delivered::<ClaProto>("a", "1", cla)], true),
        );
        let snap = store.snapshot();
        let endpoints = snap.endpoints("a").expect("endpoints of a");
        assert_eq!(
            endpoints.localities[0].endpoints[0].address,
            "10.0.0.1:80".parse().expect("addr")
        );
        assert!(snap.endpoints("b").is_none());
        let applied = store.apply(
            type_url::CLUSTER,
            update(
                vec![delivered::<ClusterProto>("", "2", eds_cluster("b", "1s"))],
                true,
            ),
        );
        let snap = store.snapshot();
        assert!(snap.cluster("a").is_none());
        // Cluster a went, so its endpoints are no longer wanted nor held.
        assert!(!snap.endpoints.contains_key("a"));
        assert_eq!(
            applied.wanted.get(type_url::ENDPOINT),
            Some(&BTreeSet::from(["b".to_string()]))
        );
        store.apply(
            type_url::CLUSTER,
            Update {
                resources: vec![],
                removed: vec!["b".into()],
                complete: false,
            },
        );
        assert!(store.snapshot().clusters.is_empty());
    }

    #[test]
    fn outbound_listener_by_address_then_port_then_virtual_outbound() {
        let store = Store::new();
        let mut virtual_outbound =
            tcp_listener("virtualOutbound", "0.0.0.0", 15001, "PassthroughCluster");
        virtual_outbound["use_original_dst"] = json!(true);
        virtual_outbound["bind_to_port"] = json!(true);
        let applied = store.apply(
            type_url::LISTENER,
            update(
                vec![
                    delivered::<ListenerProto>("", "1", virtual_outbound),
                    delivered::<ListenerProto>(
                        "",
                        "1",
                        tcp_listener("10.96.0.1_443", "10.96.0.1", 443, "kube"),
                    ),
                    delivered::<ListenerProto>(
                        "",
                        "1",
                        http_listener("0.0.0.0_9080", 9080, "9080"),
                    ),
                ],
                true,
            ),
        );
        assert!(applied.rejected.is_empty(), "{:?}", applied.rejected);
        assert_eq!(
            applied.wanted.get(type_url::ROUTE),
            Some(&BTreeSet::from(["9080".to_string()]))
        );
        let snap = store.snapshot();
        let name = |dst: &str| {
            snap.outbound_listener(dst.parse().expect("addr"))
                .map(|l| l.name.clone())
                .unwrap_or_default()
        };
        assert_eq!(name("10.96.0.1:443"), "10.96.0.1_443");
        assert_eq!(name("10.1.2.3:9080"), "0.0.0.0_9080");
        assert_eq!(name("[::ffff:10.1.2.3]:9080"), "0.0.0.0_9080");
        assert_eq!(name("10.1.2.3:443"), "virtualOutbound");
        assert!(snap.inbound_listener().is_none());
    }

    #[test]
    fn an_update_copies_only_its_own_type() {
        let store = Store::new();
        store.apply(
            type_url::LISTENER,
            update(
                vec![delivered::<ListenerProto>(
                    "",
                    "1",
                    http_listener("0.0.0.0_80", 80, "80"),
                )],
                true,
            ),
        );
        let before = store.snapshot();
        store.apply(
            type_url::CLUSTER,
            update(
                vec![delivered::<ClusterProto>("", "1", eds_cluster("a", "1s"))],
                true,
            ),
        );
        let after = store.snapshot();
        assert!(Arc::ptr_eq(&before.listeners, &after.listeners));
        assert!(!Arc::ptr_eq(&before.clusters, &after.clusters));
        // The old snapshot is untouched: readers holding it see one consistent world.
        assert!(before.newest_clusters().is_empty());
        assert_eq!(after.newest_clusters().len(), 1, "warming on its endpoints");
        assert_eq!(
            after
                .outbound_listener("10.0.0.1:80".parse().expect("addr"))
                .map(|l| l.name.as_str()),
            Some("0.0.0.0_80")
        );
    }

    #[test]
    fn the_name_table_is_replaced_whole_and_a_refused_one_keeps_the_last() {
        use crate::convert::name_table::{NameInfoProto, NameTableProto};
        use prost::Message;
        let table = |host: &str, ip: &str| {
            let mut t = NameTableProto::default();
            t.table.insert(
                host.into(),
                NameInfoProto {
                    ips: vec![ip.into()],
                    ..Default::default()
                },
            );
            Delivered {
                name: String::new(),
                version: "v".into(),
                body: t.encode_to_vec(),
            }
        };
        let store = Store::new();
        assert!(store.snapshot().name_table().is_none());
        let applied = store.apply(
            type_url::NAME_TABLE,
            update(vec![table("a.example.com", "240.240.0.1")], true),
        );
        assert!(applied.rejected.is_empty(), "{:?}", applied.rejected);
        let first = Arc::clone(store.snapshot().name_table().expect("held"));
        assert!(first.model.hosts.contains_key("a.example.com"));
        let applied = store.apply(
            type_url::NAME_TABLE,
            update(vec![table("b.example.com", "not-an-ip")], true),
        );
        assert_eq!(applied.rejected.len(), 1);
        assert!(
            applied.rejected[0]
                .reason
                .contains("table[b.example.com].ips[0]"),
            "{}",
            applied.rejected[0].reason
        );
        let snap = store.snapshot();
        assert!(Arc::ptr_eq(snap.name_table().expect("kept"), &first));
        store.apply(
            type_url::NAME_TABLE,
            update(vec![table("b.example.com", "240.240.0.2")], true),
        );
        let snap = store.snapshot();
        let hosts = &snap.name_table().expect("held").model.hosts;
        assert!(hosts.contains_key("b.example.com") && !hosts.contains_key("a.example.com"));
    }

    #[test]
    fn unknown_types_and_misnamed_resources_are_refused() {
        let store = Store::new();
        let applied = store.apply(
            "type.googleapis.com/envoy.service.runtime.v3.Runtime",
            update(
                vec![Delivered {
                    name: "rt".into(),
                    version: "1".into(),
                    body: vec![],
                }],
                true,
            ),
        );
        assert_eq!(applied.rejected.len(), 1);
        assert!(applied.rejected[0].reason.contains("not supported"));
        let applied = store.apply(
            type_url::CLUSTER,
            update(
                vec![delivered::<ClusterProto>("x", "1", eds_cluster("y", "1s"))],
                false,
            ),
        );
        assert_eq!(applied.rejected[0].name, "x");
        assert!(store.current().clusters.is_empty());
        let garbage = store.apply(
            type_url::CLUSTER,
            update(
                vec![Delivered {
                    name: "g".into(),
                    version: "1".into(),
                    body: vec![0xff, 0xff, 0xff],
                }],
                false,
            ),
        );
        assert!(garbage.rejected[0].reason.contains("malformed"));
    }
}
