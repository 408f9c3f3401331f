//! DNS clusters (STRICT_DNS and LOGICAL_DNS: istiod's ServiceEntries with `resolution: DNS` and
//! `DNS_ROUND_ROBIN`): their names resolved into a host set the balancer picks from as it picks
//! from EDS endpoints, and `/clusters` lists.
//!
//! Names are resolved with the system's resolver (`tokio::net::lookup_host`, i.e.
//! `getaddrinfo` on a blocking thread): it reads `/etc/hosts`, `resolv.conf` and its search
//! domains as c-ares does with istiod's resolver config (no custom resolvers; the converter
//! refuses those), and needs no new dependency. What it cannot give is a record's TTL, so
//! `respect_dns_ttl` is not honoured: the cluster is re-resolved every `dns_refresh_rate`
//! (plus up to `dns_jitter`), and a log line says so once per cluster.
//!
//! One task per DNS cluster resolves it, and is stopped when the cluster goes or changes. A
//! failed lookup keeps the name's previous addresses, as Envoy keeps them.

use remora_xds::model::cluster::{Cluster, Discovery, Dns, DnsLookupFamily, DnsTarget};
use remora_xds::model::endpoint::{ClusterLoadAssignment, Endpoint, Health, LocalityEndpoints};
use remora_xds::store::Store;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// A lookup taking longer than this fails (c-ares' default timeout).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the task looks for DNS clusters added, changed or removed.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// The host sets of the DNS clusters resolved so far, by cluster name. Bounded by the
/// clusters istiod sends: an entry goes when its cluster goes.
#[derive(Debug, Default)]
pub struct DnsHosts {
    resolved: Mutex<HashMap<String, Arc<ClusterLoadAssignment>>>,
    /// Per DNS cluster in force, how often its hosts changed (Envoy's `membership_change`):
    /// kept across a new version of the cluster, as Envoy's statistics outlive the cluster
    /// object; gone with the cluster.
    changes: Mutex<HashMap<String, u64>>,
}

impl DnsHosts {
    /// The cluster's hosts as last resolved (`None`: not resolved yet).
    pub fn get(&self, cluster: &str) -> Option<Arc<ClusterLoadAssignment>> {
        self.resolved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(cluster)
            .cloned()
    }

    /// Record a resolution of `cluster` (the resolver task's; tests').
    pub(crate) fn set(&self, cluster: &str, hosts: ClusterLoadAssignment) {
        self.resolved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(cluster.to_string(), Arc::new(hosts));
    }

    /// Record a resolution that changed `changes` of the cluster's host sets.
    fn set_changed(&self, cluster: &str, hosts: ClusterLoadAssignment, changes: u64) {
        if changes > 0 {
            *self
                .changes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(cluster.to_string())
                .or_default() += changes;
        }
        self.set(cluster, hosts);
    }

    /// How often the hosts of the DNS cluster `cluster` changed (Envoy's
    /// `membership_change`).
    pub fn membership_changes(&self, cluster: &str) -> u64 {
        self.changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(cluster)
            .copied()
            .unwrap_or(0)
    }

    fn forget(&self, cluster: &str) {
        self.resolved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(cluster);
    }
}

/// A lookup that failed.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("{host}: {source}")]
    Failed {
        host: String,
        source: std::io::Error,
    },
    #[error("{host}: no answer within {LOOKUP_TIMEOUT:?}")]
    Timeout { host: String },
    #[error("{host}: no address of the cluster's family ({family:?})")]
    NoAddress {
        host: String,
        family: DnsLookupFamily,
    },
}

/// Keep the DNS clusters of `store`'s snapshots resolved into `hosts`, for ever.
pub async fn run(store: Arc<Store>, hosts: Arc<DnsHosts>) {
    // Per cluster: the cluster as its task resolves it, and the task.
    let mut tasks: HashMap<String, (Arc<Cluster>, tokio::task::JoinHandle<()>)> = HashMap::new();
    loop {
        let snapshot = store.snapshot();
        tasks.retain(|name, (cluster, task)| {
            let same = snapshot
                .cluster(name)
                .is_some_and(|now| Arc::ptr_eq(now, cluster) || **now == **cluster);
            if !same {
                task.abort();
                hosts.forget(name);
            }
            same
        });
        hosts
            .changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|name, _| snapshot.cluster(name).is_some_and(|c| dns_of(c).is_some()));
        for (name, entry) in snapshot.clusters.iter() {
            let cluster = &entry.model;
            let Some((dns, strict)) = dns_of(cluster) else {
                continue;
            };
            if tasks.contains_key(name) {
                continue;
            }
            if dns.respect_dns_ttl {
                tracing::info!(
                    cluster = %name,
                    refresh = ?dns.refresh_rate,
                    "respect_dns_ttl: the system resolver gives no TTL; re-resolving every dns_refresh_rate"
                );
            }
            let task = tokio::spawn(resolve_for_ever(
                name.clone(),
                dns.clone(),
                strict,
                Arc::clone(&hosts),
            ));
            tasks.insert(name.clone(), (Arc::clone(cluster), task));
        }
        drop(snapshot);
        tokio::time::sleep(WATCH_INTERVAL).await;
    }
}

/// The DNS settings of a DNS cluster, and whether it is STRICT_DNS.
fn dns_of(c: &Cluster) -> Option<(&Dns, bool)> {
    match &c.discovery {
        Discovery::StrictDns(dns) => Some((dns, true)),
        Discovery::LogicalDns(dns) => Some((dns, false)),
        _ => None,
    }
}

async fn resolve_for_ever(name: String, dns: Dns, strict: bool, hosts: Arc<DnsHosts>) {
    // The last addresses of each target, kept when a later lookup of it fails.
    let mut last: Vec<Vec<SocketAddr>> = vec![Vec::new(); dns.targets.len()];
    // LOGICAL_DNS: Envoy's one logical host is added at the first answer, then only readdressed.
    let mut logical_host = false;
    loop {
        // Envoy updates a STRICT_DNS cluster's hosts per name resolved: each name whose
        // addresses changed is one membership change.
        let mut changes = 0;
        for (target, kept) in dns.targets.iter().zip(last.iter_mut()) {
            match lookup(target, dns.lookup_family).await {
                Ok(addresses) => {
                    if strict && !same_addresses(kept, &addresses) {
                        changes += 1;
                    }
                    *kept = addresses;
                }
                Err(e) => {
                    tracing::debug!(cluster = %name, error = %e, "DNS lookup failed; keeping the previous addresses");
                }
            }
        }
        let set = host_set(&name, &dns.targets, &last, strict);
        if !strict && !logical_host && set.endpoints().next().is_some() {
            logical_host = true;
            changes = 1;
        }
        hosts.set_changed(&name, set, changes);
        let jitter = match dns.refresh_jitter.as_millis() {
            0 => Duration::ZERO,
            max => Duration::from_millis(fastrand::u64(..=u64::try_from(max).unwrap_or(u64::MAX))),
        };
        tokio::time::sleep(dns.refresh_rate.max(Duration::from_millis(1)) + jitter).await;
    }
}

/// Whether two answers hold the same addresses, in any order.
fn same_addresses(a: &[SocketAddr], b: &[SocketAddr]) -> bool {
    a.len() == b.len() && a.iter().all(|x| b.contains(x))
}

/// The addresses `target` resolves to, of the family the cluster asks for.
pub async fn lookup(
    target: &DnsTarget,
    family: DnsLookupFamily,
) -> Result<Vec<SocketAddr>, LookupError> {
    let host = target.host.as_str();
    let found = tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host, target.port)))
        .await
        .map_err(|_| LookupError::Timeout {
            host: host.to_string(),
        })?
        .map_err(|source| LookupError::Failed {
            host: host.to_string(),
            source,
        })?;
    let mut all: Vec<SocketAddr> = Vec::new();
    for a in found {
        if !all.contains(&a) {
            all.push(a);
        }
    }
    let picked = by_family(&all, family);
    if picked.is_empty() {
        return Err(LookupError::NoAddress {
            host: host.to_string(),
            family,
        });
    }
    Ok(picked)
}

/// Envoy's `dns_lookup_family` over what the resolver found: AUTO prefers IPv6 and falls back
/// to IPv4, V4_PREFERRED the other way round, ALL keeps both.
fn by_family(all: &[SocketAddr], family: DnsLookupFamily) -> Vec<SocketAddr> {
    let v4: Vec<SocketAddr> = all.iter().copied().filter(SocketAddr::is_ipv4).collect();
    let v6: Vec<SocketAddr> = all.iter().copied().filter(SocketAddr::is_ipv6).collect();
    match family {
        DnsLookupFamily::V4Only => v4,
        DnsLookupFamily::V6Only => v6,
        DnsLookupFamily::Auto if v6.is_empty() => v4,
        DnsLookupFamily::Auto => v6,
        DnsLookupFamily::V4Preferred if v4.is_empty() => v6,
        DnsLookupFamily::V4Preferred => v4,
        DnsLookupFamily::All => v4.into_iter().chain(v6).collect(),
    }
}

/// The host set of a resolution: STRICT_DNS, every address of every name, each with its
/// name's weight and `tlsMode`; LOGICAL_DNS, only the first address (of its one name).
pub(crate) fn host_set(
    name: &str,
    targets: &[DnsTarget],
    addresses: &[Vec<SocketAddr>],
    strict: bool,
) -> ClusterLoadAssignment {
    // One locality entry per run of targets from the same `load_assignment` entry.
    let mut localities: Vec<LocalityEndpoints> = Vec::new();
    for (target, found) in targets.iter().zip(addresses) {
        let take = if strict { found.len() } else { 1 };
        let same = localities.last().is_some_and(|l| {
            l.locality == target.locality
                && l.priority == target.priority
                && l.weight == target.locality_weight
        });
        if !same {
            localities.push(LocalityEndpoints {
                locality: target.locality.clone(),
                priority: target.priority,
                weight: target.locality_weight,
                endpoints: Vec::new(),
            });
        }
        let Some(entry) = localities.last_mut() else {
            continue;
        };
        for address in found.iter().take(take) {
            entry.endpoints.push(Endpoint {
                address: *address,
                health: Health::Healthy,
                weight: target.weight.max(1),
                tls_mode: target.tls_mode.clone(),
                workload: None,
            });
        }
        if !strict && !entry.endpoints.is_empty() {
            break;
        }
    }
    ClusterLoadAssignment {
        cluster_name: name.to_string(),
        localities,
        overprovisioning_factor: 140,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_xds::model::endpoint::Locality;

    fn target(host: &str, port: u16) -> DnsTarget {
        DnsTarget {
            host: host.into(),
            port,
            weight: 3,
            tls_mode: Some("istio".into()),
            locality: Locality::default(),
            priority: 0,
            locality_weight: None,
        }
    }

    #[tokio::test]
    async fn localhost_resolves_by_family() {
        let v4 = lookup(&target("localhost", 8080), DnsLookupFamily::V4Only)
            .await
            .expect("localhost has an IPv4 address");
        assert_eq!(v4, ["127.0.0.1:8080".parse::<SocketAddr>().expect("addr")]);
        let literal = lookup(&target("127.0.0.9", 80), DnsLookupFamily::Auto)
            .await
            .expect("a literal resolves to itself");
        assert_eq!(
            literal,
            ["127.0.0.9:80".parse::<SocketAddr>().expect("addr")]
        );
        let e = lookup(&target("127.0.0.9", 80), DnsLookupFamily::V6Only)
            .await
            .expect_err("no IPv6 address");
        assert!(matches!(e, LookupError::NoAddress { .. }), "{e}");
        let e = lookup(&target("no-such-host.invalid", 80), DnsLookupFamily::Auto)
            .await
            .expect_err("RFC 6761: .invalid never resolves");
        assert!(e.to_string().contains("no-such-host.invalid"), "{e}");
    }

    #[test]
    fn lookup_families_as_envoy_reads_them() {
        let all: Vec<SocketAddr> = ["[::1]:1", "10.0.0.1:1", "[::2]:1", "10.0.0.2:1"]
            .iter()
            .map(|a| a.parse().expect("addr"))
            .collect();
        let show = |f| {
            by_family(&all, f)
                .iter()
                .map(|a| a.ip().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(show(DnsLookupFamily::V4Only), ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(show(DnsLookupFamily::Auto), ["::1", "::2"]);
        assert_eq!(show(DnsLookupFamily::V4Preferred), ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(show(DnsLookupFamily::All).len(), 4);
        let v4: Vec<SocketAddr> = all.iter().copied().filter(SocketAddr::is_ipv4).collect();
        assert_eq!(by_family(&v4, DnsLookupFamily::Auto), v4);
    }

    #[test]
    fn strict_takes_every_address_logical_the_first() {
        let targets = [target("a", 80), target("b", 80)];
        let found = vec![
            vec![
                "10.0.0.1:80".parse().expect("addr"),
                "10.0.0.2:80".parse().expect("addr"),
            ],
            vec!["10.0.0.3:80".parse().expect("addr")],
        ];
        let strict = host_set("c", &targets, &found, true);
        let hosts: Vec<String> = strict
            .endpoints()
            .map(|(_, e)| e.address.to_string())
            .collect();
        assert_eq!(hosts, ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]);
        assert!(strict
            .endpoints()
            .all(|(_, e)| e.weight == 3 && e.tls_mode.as_deref() == Some("istio")));
        let logical = host_set("c", &targets[..1], &found[..1], false);
        let hosts: Vec<String> = logical
            .endpoints()
            .map(|(_, e)| e.address.to_string())
            .collect();
        assert_eq!(hosts, ["10.0.0.1:80"]);
    }

    #[test]
    fn targets_keep_their_localitys_priority_and_weight() {
        let mut far = target("b", 80);
        far.locality.region = "region2".into();
        far.priority = 1;
        far.locality_weight = Some(5);
        let targets = [target("a", 80), target("a2", 80), far];
        let found = vec![
            vec!["10.0.0.1:80".parse().expect("addr")],
            vec!["10.0.0.2:80".parse().expect("addr")],
            vec!["10.0.0.3:80".parse().expect("addr")],
        ];
        let set = host_set("c", &targets, &found, true);
        let entries: Vec<(u32, Option<u32>, usize, &str)> = set
            .localities
            .iter()
            .map(|l| {
                (
                    l.priority,
                    l.weight,
                    l.endpoints.len(),
                    l.locality.region.as_str(),
                )
            })
            .collect();
        assert_eq!(entries, [(0, None, 2, ""), (1, Some(5), 1, "region2")]);
    }

    /// The resolver task follows the store: a STRICT_DNS cluster of two names gets their
    /// addresses, each name's first answer one membership change; a LOGICAL_DNS cluster's one
    /// host is one change. The counts go when the clusters go.
    #[tokio::test]
    async fn the_task_resolves_the_stores_dns_clusters() {
        let endpoint = |host: &str| serde_json::json!({"endpoint": {"address": {"socket_address": {"address": host, "port_value": 8080}}}});
        let cluster = |name: &str, kind: &str, hosts: &[&str]| {
            let endpoints: Vec<_> = hosts.iter().map(|h| endpoint(h)).collect();
            serde_json::json!({
                "name": name, "type": kind, "dns_lookup_family": "V4_ONLY",
                "dns_refresh_rate": "60s", "respect_dns_ttl": true,
                "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]}
            })
        };
        let (strict, logical) = ("outbound|80||local.test", "outbound|80||logical.test");
        let empty = serde_json::json!([]);
        let store = Arc::new(crate::xds_files::store_of(
            serde_json::json!([
                cluster(strict, "STRICT_DNS", &["localhost", "127.0.0.2"]),
                cluster(logical, "LOGICAL_DNS", &["localhost"])
            ]),
            empty.clone(),
            empty.clone(),
            empty.clone(),
        ));
        let hosts = Arc::new(DnsHosts::default());
        let task = tokio::spawn(run(Arc::clone(&store), Arc::clone(&hosts)));
        let mut resolved = None;
        for _ in 0..50 {
            resolved = hosts.get(strict).zip(hosts.get(logical));
            if resolved.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (cla, _) = resolved.expect("resolved");
        let hosts_found: Vec<String> = cla
            .endpoints()
            .map(|(_, e)| e.address.to_string())
            .collect();
        assert_eq!(hosts_found, ["127.0.0.1:8080", "127.0.0.2:8080"]);
        assert_eq!(hosts.membership_changes(strict), 2);
        assert_eq!(hosts.membership_changes(logical), 1);
        remora_xds::sink::Sink::apply(
            &*store,
            remora_xds::sink::type_url::CLUSTER,
            remora_xds::sink::Update {
                resources: vec![],
                removed: vec![],
                complete: true,
            },
        );
        for _ in 0..100 {
            if hosts.get(strict).is_none() && hosts.membership_changes(strict) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(hosts.get(strict).is_none(), "the cluster went");
        assert_eq!(hosts.membership_changes(strict), 0);
        assert_eq!(hosts.membership_changes(logical), 0);
        task.abort();
    }
}
