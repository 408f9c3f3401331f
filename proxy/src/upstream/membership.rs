//! The hosts of each xDS cluster in force, with their health as EDS gives it and outlier
//! detection's verdict: what `/clusters` lists, and what Envoy's `membership_*` gauges count.

use remora_xds::model::cluster::Discovery;
use remora_xds::model::endpoint::Health;
use remora_xds::snapshot::Snapshot;
use remora_xds::store::Store;

/// One host of an xDS cluster, as `/clusters` shows it.
pub struct Host {
    pub address: std::net::SocketAddr,
    pub weight: u32,
    pub priority: u32,
    pub health: Health,
    pub locality: remora_xds::model::endpoint::Locality,
    /// Ejected by outlier detection now.
    pub ejected: bool,
    /// `cx_active`, `rq_active`, `rq_total`, `rq_error` (0 before the host's first pick).
    pub counters: [u64; 4],
}

/// Each xDS cluster with its endpoints (EDS, or the cluster's own `load_assignment`), in
/// name order.
pub fn cluster_hosts(
    snapshot: &Snapshot,
    dns: &super::dns::DnsHosts,
    balancers: &super::Upstreams,
) -> Vec<(String, Vec<Host>)> {
    use std::sync::atomic::Ordering::Relaxed;
    snapshot
        .clusters
        .keys()
        .map(|name| {
            let state = balancers.clusters.find(name);
            let now = state.as_ref().map_or(0, |s| s.now_ms());
            // A DNS cluster's hosts are what its names last resolved to.
            let resolved = dns.get(name);
            let hosts = snapshot
                .endpoints(name)
                .or(resolved.as_deref())
                .map(|cla| {
                    cla.endpoints()
                        .map(|(locality, e)| {
                            let host = state.as_ref().and_then(|s| s.known_host(&e.address));
                            let counters = host.as_ref().map_or([0; 4], |h| {
                                [
                                    u64::from(h.cx_active.load(Relaxed)),
                                    u64::from(h.rq_active.load(Relaxed)),
                                    h.rq_total.load(Relaxed),
                                    h.rq_error.load(Relaxed),
                                ]
                            });
                            Host {
                                address: e.address,
                                weight: e.weight,
                                priority: locality.priority,
                                health: e.health,
                                locality: locality.locality.clone(),
                                ejected: host.is_some_and(|h| h.ejected(now)),
                                counters,
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            (name.clone(), hosts)
        })
        .collect()
}

/// One cluster's membership, as Envoy's `cluster.<name>.membership_*` statistics count it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Membership {
    pub total: u64,
    /// Taking traffic: EDS says healthy (or nothing) and outlier detection has not ejected it.
    pub healthy: u64,
    /// EDS says degraded, and not ejected.
    pub degraded: u64,
    /// Left out of balancing: EDS says draining.
    pub excluded: u64,
    /// How often the host set changed (per priority a host joined or left).
    pub change: u64,
}

impl Membership {
    /// Count `hosts` as Envoy sorts them: an unhealthy flag (EDS unhealthy, timeout or
    /// draining; ejected) outranks degraded.
    fn of(hosts: &[Host], change: u64) -> Membership {
        let mut m = Membership {
            change,
            ..Membership::default()
        };
        for h in hosts {
            m.total += 1;
            let failed = h.ejected
                || matches!(
                    h.health,
                    Health::Unhealthy | Health::Timeout | Health::Draining
                );
            match h.health {
                _ if failed => {}
                Health::Degraded => m.degraded += 1,
                _ => m.healthy += 1,
            }
            if h.health == Health::Draining {
                m.excluded += 1;
            }
        }
        m
    }
}

/// The membership of each cluster in `snapshot` (the store's, in force), by the name its
/// statistics go under. ORIGINAL_DST clusters are left out: Envoy makes their hosts per
/// destination as connections come, and Remora keeps no such host set.
pub fn memberships(
    store: &Store,
    snapshot: &Snapshot,
    balancers: &super::Upstreams,
) -> Vec<(String, Membership)> {
    cluster_hosts(snapshot, &balancers.dns, balancers)
        .into_iter()
        .filter_map(|(name, hosts)| {
            let cluster = snapshot.cluster(&name)?;
            let change = match cluster.discovery {
                Discovery::OriginalDst { .. } => return None,
                Discovery::StrictDns(_) | Discovery::LogicalDns(_) => {
                    balancers.dns.membership_changes(&name)
                }
                Discovery::Eds { .. } | Discovery::Static => store.membership_changes(&name),
            };
            let stat_name = cluster.alt_stat_name.clone().unwrap_or(name);
            Some((stat_name, Membership::of(&hosts, change)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(health: Health, ejected: bool) -> Host {
        Host {
            address: "10.0.0.1:80".parse().expect("address"),
            weight: 1,
            priority: 0,
            health,
            locality: Default::default(),
            ejected,
            counters: [0; 4],
        }
    }

    /// Envoy 1.40's gauges for the same five hosts (a STATIC cluster: HEALTHY, DRAINING,
    /// DEGRADED, UNHEALTHY at priority 0, HEALTHY at priority 1) were total 5, healthy 2,
    /// degraded 1, excluded 1.
    #[test]
    fn hosts_are_counted_as_envoy_sorts_them() {
        let hosts = [
            host(Health::Healthy, false),
            host(Health::Draining, false),
            host(Health::Degraded, false),
            host(Health::Unhealthy, false),
            host(Health::Unknown, false),
        ];
        let m = Membership::of(&hosts, 2);
        let expected = Membership {
            total: 5,
            healthy: 2,
            degraded: 1,
            excluded: 1,
            change: 2,
        };
        assert_eq!(m, expected);
        // Ejected: neither healthy nor degraded.
        let out = [host(Health::Healthy, true), host(Health::Degraded, true)];
        let m = Membership::of(&out, 0);
        assert_eq!((m.total, m.healthy, m.degraded), (2, 0, 0));
    }
}
