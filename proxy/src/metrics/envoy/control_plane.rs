//! What istiod mode shares with the statistics, as Envoy names it: the ADS stream's state
//! (`control_plane.connected_state`), the per-type subscription counters of CDS and LDS
//! (`cluster_manager.cds.*`, `listener_manager.lds.*`), the per-resource ones of SDS, EDS and
//! RDS (`sds.<name>.*`, `cluster.<name>.update_*`, `http.<prefix>.rds.<name>.*`), and the
//! connection to istiod as Envoy's `xds-grpc` cluster's.

use super::{ControlPlane, EnvoyStat, Kind, Scope};

/// The stat name of Envoy's cluster for its xDS stream in an Istio sidecar (pilot-agent's
/// bootstrap gives it this `alt_stat_name`, so Istio's tags make the cluster a label:
/// `envoy_cluster_upstream_cx_active{cluster_name="xds-grpc"}`).
const XDS_CLUSTER: &str = "xds-grpc;";

/// Every statistic of the control plane onto `stats`.
pub(super) fn stats(stats: &mut Vec<EnvoyStat>, cp: &ControlPlane) {
    let g = |scope: Scope, stat, value: u64| EnvoyStat::new(Kind::Gauge, scope, stat, value);
    let c = |scope: Scope, stat, value: u64| EnvoyStat::new(Kind::Counter, scope, stat, value);
    let snap = cp.stats.snapshot();
    stats.push(g(
        Scope::ControlPlane,
        "connected_state",
        snap.connected_state,
    ));
    secret_stats(stats, cp);
    endpoint_and_route_stats(stats, cp);
    for (stat, gauge, value) in cp.connection.envoy_stats() {
        let scope = Scope::Cluster(XDS_CLUSTER.to_string());
        stats.push(match gauge {
            true => g(scope, stat, value),
            false => c(scope, stat, value),
        });
    }
    // NDS is pilot-agent's, not Envoy's: Envoy has no statistics of it to mirror.
    // Envoy counts SDS, EDS and RDS per resource (above), not per type.
    let envoys = snap.types.iter().filter(|t| {
        cp.stats.per_resource(t.type_url).is_none()
            && t.type_url != remora_xds::sink::type_url::NAME_TABLE
    });
    for t in envoys {
        let s = || Scope::Subscription(t.prefix);
        stats.push(c(s(), "update_attempt", t.update_attempt));
        stats.push(c(s(), "update_success", t.update_success));
        stats.push(c(s(), "update_rejected", t.update_rejected));
        stats.push(c(s(), "update_failure", t.update_failure));
        stats.push(g(s(), "update_time", t.update_time));
    }
}

/// Envoy's per-secret SDS statistics (`sds.<name>.*`): what the ADS client counted of each
/// subscribed secret, with the store's initial fetch timeouts (each also an attempt, as Envoy
/// counts it).
fn secret_stats(stats: &mut Vec<EnvoyStat>, cp: &ControlPlane) {
    let timeouts = cp.store.secret_fetch_timeouts();
    for (name, s) in cp.stats.secrets.snapshot() {
        let timed_out = timeouts.get(&name).copied().unwrap_or(0);
        let scope = Scope::Secret(remora_xds::ads::secret_stat_name(&name));
        let mut push = |stat, kind, value| {
            stats.push(EnvoyStat {
                scope: scope.clone(),
                stat,
                code: None,
                kind,
                value,
            })
        };
        push("init_fetch_timeout", Kind::Counter, timed_out);
        // Envoy counts rotations of secrets read from files; one from the control plane never.
        push("key_rotation_failed", Kind::Counter, 0);
        push(
            "update_attempt",
            Kind::Counter,
            s.update_attempt + timed_out,
        );
        push("update_failure", Kind::Counter, s.update_failure);
        push("update_rejected", Kind::Counter, s.update_rejected);
        push("update_success", Kind::Counter, s.update_success);
        push("update_time", Kind::Gauge, s.update_time);
        push("version", Kind::Gauge, s.version);
    }
}

/// Envoy's per-cluster EDS and per-route-table RDS subscription statistics: what the ADS
/// client counted of each endpoint name, under the stat name of each EDS cluster of the
/// snapshot in force that takes it (`cluster.<stat name>.update_*`), and of each route table,
/// in the scope of the first connection manager of the listeners in force that names it
/// (`http.<stat prefix>.rds.<name>.*`, where Envoy makes the table's subscription).
fn endpoint_and_route_stats(stats: &mut Vec<EnvoyStat>, cp: &ControlPlane) {
    use remora_xds::model::listener::{ChainKind, RouteSource};
    let snapshot = cp.store.snapshot();
    let endpoints = cp.stats.endpoints.snapshot();
    for entry in snapshot.clusters.values() {
        let cluster = &entry.model;
        let Some(s) = cluster.eds_service_name().and_then(|n| endpoints.get(n)) else {
            continue;
        };
        let name = cluster.alt_stat_name.as_deref().unwrap_or(&cluster.name);
        let scope = || Scope::Cluster(name.to_string());
        for (stat, kind, value) in [
            ("update_attempt", Kind::Counter, s.update_attempt),
            ("update_empty", Kind::Counter, s.update_empty),
            ("update_failure", Kind::Counter, s.update_failure),
            ("update_no_rebuild", Kind::Counter, s.update_no_rebuild),
            ("update_rejected", Kind::Counter, s.update_rejected),
            ("update_success", Kind::Counter, s.update_success),
            ("update_time", Kind::Gauge, s.update_time),
            ("version", Kind::Gauge, s.version),
        ] {
            stats.push(EnvoyStat::new(kind, scope(), stat, value));
        }
    }
    let routes = cp.stats.routes.snapshot();
    let mut scoped = std::collections::HashSet::new();
    for listener in snapshot.listeners() {
        for chain in listener.all_chains() {
            let ChainKind::Http(http) = &chain.kind else {
                continue;
            };
            let RouteSource::Rds(name) = &http.routes else {
                continue;
            };
            let Some(s) = routes.get(name).filter(|_| scoped.insert(name.clone())) else {
                continue;
            };
            let scope = || Scope::Rds {
                prefix: http.stat_prefix.to_string(),
                name: name.clone(),
            };
            for (stat, kind, value) in [
                ("config_reload", Kind::Counter, s.config_reload),
                ("config_reload_time_ms", Kind::Gauge, s.config_reload_time),
                ("update_attempt", Kind::Counter, s.update_attempt),
                ("update_failure", Kind::Counter, s.update_failure),
                ("update_rejected", Kind::Counter, s.update_rejected),
                ("update_success", Kind::Counter, s.update_success),
                ("update_time", Kind::Gauge, s.update_time),
                ("version", Kind::Gauge, s.version),
            ] {
                stats.push(EnvoyStat::new(kind, scope(), stat, value));
            }
        }
    }
}
