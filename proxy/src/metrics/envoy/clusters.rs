//! The xDS clusters' statistics (`cluster.<stat name>.*`): what the upstream layer counted of
//! each cluster it used, the same names at zero for a cluster in force not used yet (Envoy
//! makes them when it loads the cluster), and the membership gauges, read from the resources
//! in force and outlier detection's state at a scrape.

use super::{EnvoyStat, Kind, Scope};
use remora_xds::model::cluster::Discovery;
use remora_xds::store::Store;
use std::collections::HashSet;

/// Every xDS cluster's statistics onto `stats`. A name the fixed list already has
/// (PassthroughCluster's connect failures) is not given twice.
pub(super) fn cluster_stats(
    stats: &mut Vec<EnvoyStat>,
    upstreams: &crate::upstream::Upstreams,
    store: Option<&Store>,
) {
    let before: HashSet<String> = stats
        .iter()
        .filter(|s| matches!(s.scope, Scope::Cluster(_)))
        .map(EnvoyStat::dotted_name)
        .collect();
    let push = |stats: &mut Vec<EnvoyStat>, stat: EnvoyStat| {
        if !before.contains(&stat.dotted_name()) {
            stats.push(stat);
        }
    };
    let counted = upstreams.clusters.envoy_stats();
    let mut named: HashSet<&str> = HashSet::new();
    for (cluster, gauges, outlier) in &counted {
        named.insert(&cluster.name);
        for s in cluster.envoy_stats(gauges, *outlier) {
            push(stats, cluster_stat(&cluster.name, s));
        }
        for (stem, stat, value) in cluster.ext_authz_stats() {
            stats.push(EnvoyStat {
                scope: Scope::ClusterFilter(format!("{}.{stem}", cluster.name)),
                stat,
                code: None,
                kind: Kind::Counter,
                value,
            });
        }
    }
    let Some(store) = store else {
        return;
    };
    // Clusters in force not used yet. An ORIGINAL_DST cluster's are left to its first use:
    // its connections are counted elsewhere (PassthroughCluster's, above), and zeros beside
    // them would say no connection went.
    let snapshot = store.snapshot();
    // Every unused cluster's names and zeros are the same: made once, with and without
    // outlier detection's.
    let idle = crate::upstream::state::ClusterState::idle_gauges();
    let zeros = crate::upstream::stats::ClusterStats::new("");
    let zeros = [false, true].map(|outlier| zeros.envoy_stats(&idle, outlier));
    for entry in snapshot.clusters.values() {
        let cluster = &entry.model;
        let name = cluster.alt_stat_name.as_deref().unwrap_or(&cluster.name);
        if named.contains(name) || matches!(cluster.discovery, Discovery::OriginalDst { .. }) {
            continue;
        }
        let outlier = usize::from(cluster.outlier_detection.is_some());
        for s in &zeros[outlier] {
            push(stats, cluster_stat(name, s.clone()));
        }
    }
    for (name, m) in crate::upstream::membership::memberships(store, &snapshot, upstreams) {
        for (stat, kind, value) in [
            ("membership_total", Kind::Gauge, m.total),
            ("membership_healthy", Kind::Gauge, m.healthy),
            ("membership_degraded", Kind::Gauge, m.degraded),
            ("membership_excluded", Kind::Gauge, m.excluded),
            ("membership_change", Kind::Counter, m.change),
        ] {
            let stat = EnvoyStat {
                scope: Scope::Cluster(name.clone()),
                stat,
                code: None,
                kind,
                value,
            };
            push(stats, stat);
        }
    }
}

fn cluster_stat(name: &str, s: crate::upstream::stats::ClusterStat) -> EnvoyStat {
    EnvoyStat {
        scope: Scope::Cluster(name.to_string()),
        stat: s.stat,
        code: s.code,
        kind: if s.gauge { Kind::Gauge } else { Kind::Counter },
        value: s.value,
    }
}
