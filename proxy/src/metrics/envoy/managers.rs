//! Envoy's listener and cluster managers' statistics: what is in force, and what each
//! configuration change did (`listener_manager.listener_added`, `cluster_manager.
//! cluster_modified`…), which the store counts as it publishes (`remora_xds::manager`). An
//! Istio sidecar's stats inclusion list keeps both managers' statistics.

use super::{EnvoyStat, EnvoyStats, Kind, Scope, ServerState};
use std::sync::atomic::Ordering;

impl EnvoyStats {
    /// The managers' statistics, onto `stats`.
    pub(super) fn manager_stats(&self, stats: &mut Vec<EnvoyStat>, state: ServerState) {
        let stat = EnvoyStat::new;
        let (c, g) = (Kind::Counter, Kind::Gauge);
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        let xds = self.xds.get();
        // Under xDS, the listeners in force, as Envoy counts its listeners; else the ones
        // bound from the config file.
        let listeners = match xds {
            Some(store) => count(store.current().listeners().count()),
            None => u64::from(self.server.listeners_active.load(Ordering::Relaxed)),
        };
        let (lm, cm) = (|| Scope::ListenerManager, || Scope::ClusterManager);
        stats.extend([
            stat(
                g,
                lm(),
                "workers_started",
                u64::from(state == ServerState::Live || state == ServerState::Draining),
            ),
            stat(g, lm(), "total_listeners_active", listeners),
            stat(
                g,
                cm(),
                "active_clusters",
                self.control_plane
                    .get()
                    .map_or(2, |cp| count(cp.store.snapshot().clusters.len())),
            ),
            stat(
                g,
                cm(),
                "warming_clusters",
                self.control_plane
                    .get()
                    .map_or(0, |cp| count(cp.store.snapshot().warming_clusters.len())),
            ),
        ]);
        let Some(store) = xds else {
            return;
        };
        let changes = store.manager_counts();
        // Envoy adds a listener, new or changed, to each worker; every worker serves every
        // listener in force here too.
        let workers = u64::from(self.server.concurrency.load(Ordering::Relaxed));
        let created = (changes.listener_added + changes.listener_modified) * workers;
        stats.extend([
            stat(c, cm(), "cluster_added", changes.cluster_added),
            stat(c, cm(), "cluster_modified", changes.cluster_modified),
            stat(c, cm(), "cluster_removed", changes.cluster_removed),
            stat(c, lm(), "listener_added", changes.listener_added),
            stat(c, lm(), "listener_modified", changes.listener_modified),
            stat(c, lm(), "listener_removed", changes.listener_removed),
            stat(
                c,
                lm(),
                "listener_in_place_updated",
                changes.listener_in_place_updated,
            ),
            stat(c, lm(), "listener_create_success", created),
        ]);
    }
}
