//! Configuration from istiod: the ADS client (`remora_xds::ads`) run over the istiod channel
//! with the per-call credentials, the pod's node, and the model store as its sink. The store is
//! the one `Proxy.xds` and the admin pages read; the client's statistics are Envoy's
//! control-plane stats; readiness waits for the first clusters and listeners, as pilot-agent
//! waits for Envoy's `cds`/`lds` `update_success` (or `update_rejected`: a received config
//! that was refused is still a received config, and pilot-agent counts it so).

use super::{AgentSettings, IstiodChannel, NodeInfo};
use crate::admin::Readiness;
use remora_xds::ads::{self, AdsClient, AdsConfig, MetadataError, Stats};
use remora_xds::sink::{type_url, Applied, Sink, Update};
use remora_xds::store::Store;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tonic::transport::Channel;

/// The readiness condition: istiod's first clusters and listeners received.
pub const FIRST_CONFIG: &str = "first clusters and listeners from istiod";

/// How often readiness looks at the client's counters until the first config is in. Polling
/// the counters pilot-agent reads keeps the client free of a readiness hook; 100 ms is far
/// inside kubelet's probe period and costs nothing once the condition is met (it stops).
const FIRST_CONFIG_POLL: Duration = Duration::from_millis(100);

/// The ADS client, ready to run.
pub struct XdsClient {
    client: AdsClient<Channel>,
    stats: Arc<Stats>,
    refusals: Arc<Refusals>,
    /// What the client delivers into, whose warming clusters' secret waits the client's run
    /// bounds in time.
    store: Arc<Store>,
}

/// One resource's last refused update, for the config dump's `error_state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The version offered and refused.
    pub version: String,
    pub reason: String,
    pub at: SystemTime,
}

/// The resources whose last update was refused, by type URL and name; an accepted or removed
/// resource leaves. Bounded by what istiod sends: one entry per resource it named.
#[derive(Debug, Default)]
pub struct Refusals {
    by_resource: Mutex<BTreeMap<(String, String), Refusal>>,
}

impl Refusals {
    /// The last refusal of `name` of `type_url`, while it stands.
    pub fn of(&self, type_url: &str, name: &str) -> Option<Refusal> {
        self.lock()
            .get(&(type_url.to_string(), name.to_string()))
            .cloned()
    }

    /// Every standing refusal of `type_url`, by name.
    pub fn all(&self, type_url: &str) -> Vec<(String, Refusal)> {
        self.lock()
            .iter()
            .filter(|((t, _), _)| t == type_url)
            .map(|((_, n), r)| (n.clone(), r.clone()))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), Refusal>> {
        // Plain data, whole after any panic.
        self.by_resource
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl XdsClient {
    /// A client for `settings` over `channel`, delivering into `store`; with `name_table`
    /// (the DNS proxy runs: DNS capture is on), istiod's name table is asked for too, as
    /// pilot-agent asks for it.
    pub fn new(
        settings: &AgentSettings,
        channel: &IstiodChannel,
        store: Arc<Store>,
        name_table: bool,
    ) -> XdsClient {
        let credentials = channel.credentials.clone();
        // Each new stream reads the token again (kubelet rotates it), as pilot-agent does.
        let metadata = move || credentials.metadata().map_err(MetadataError::new);
        let mut config = AdsConfig::new(ads_node(&settings.node), settings.xds_mode);
        config.name_table = name_table;
        let refusals = Arc::new(Refusals::default());
        let sink = LoggedStore {
            store: Arc::clone(&store),
            refusals: Arc::clone(&refusals),
        };
        let client = AdsClient::new(channel.channel.clone(), metadata, config, Arc::new(sink));
        let stats = client.stats();
        XdsClient {
            client,
            stats,
            refusals,
            store,
        }
    }

    /// The resources whose last update was refused, shared with the admin pages.
    pub fn refusals(&self) -> Arc<Refusals> {
        Arc::clone(&self.refusals)
    }

    /// Envoy's control-plane statistics, shared with metrics and admin.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// Keep the stream to istiod for the life of the process, and tell `readiness` when the
    /// first clusters and listeners are in. The caller has required [`FIRST_CONFIG`].
    pub async fn run(self, readiness: Arc<Readiness>) {
        let stats = Arc::clone(&self.stats);
        tokio::spawn(async move {
            while !first_config_received(&stats) {
                tokio::time::sleep(FIRST_CONFIG_POLL).await;
            }
            tracing::info!("first clusters and listeners from istiod applied");
            readiness.satisfy(FIRST_CONFIG);
        });
        // Clusters warming on an SDS secret that does not come go in force when its initial
        // fetch times out, as Envoy's do.
        let store = Arc::clone(&self.store);
        tokio::spawn(async move { store.run_warming_timeouts().await });
        // The process ends the stream: xDS stays up through a drain (outbound still serves).
        self.client.run(std::future::pending()).await;
    }
}

/// Whether CDS and LDS have each had an update applied or refused, pilot-agent's test of
/// Envoy's stats before it first reports ready.
pub fn first_config_received(stats: &Stats) -> bool {
    let received = |t| {
        stats.of(t).is_some_and(|s| {
            s.update_success.load(std::sync::atomic::Ordering::Relaxed)
                + s.update_rejected.load(std::sync::atomic::Ordering::Relaxed)
                > 0
        })
    };
    received(type_url::CLUSTER) && received(type_url::LISTENER)
}

/// The pod's node in the ADS client's terms.
pub fn ads_node(node: &NodeInfo) -> ads::NodeInfo {
    ads::NodeInfo {
        id: node.id.clone(),
        cluster: node.cluster.clone(),
        metadata: node.metadata.clone(),
        locality: None,
        user_agent_version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

/// The store, with a log line per applied update (the client logs its NACKs and, at debug,
/// its ACKs; this says what each update did to the configuration in force) and the refusals
/// kept per resource.
struct LoggedStore {
    store: Arc<Store>,
    refusals: Arc<Refusals>,
}

impl Sink for LoggedStore {
    fn interest(&self) -> Option<tokio::sync::watch::Receiver<remora_xds::sink::Interest>> {
        self.store.interest()
    }

    fn apply(&self, type_url: &str, update: Update) -> Applied {
        let received = update.resources.len();
        let removed = update.removed.len();
        let offered: Vec<(String, String)> = update
            .resources
            .iter()
            .map(|r| (r.name.clone(), r.version.clone()))
            .collect();
        let gone = update.removed.clone();
        // A whole set of clusters or listeners (state of the world) removes what it leaves out,
        // refusals included.
        let whole =
            update.complete && (type_url == type_url::CLUSTER || type_url == type_url::LISTENER);
        let applied = self.store.apply(type_url, update);
        // Decoding and converting an update leaves its transients free in the heap, below
        // what is kept; hand those pages back (see remora-malloc).
        remora_malloc::release_free_memory();
        {
            let now = SystemTime::now();
            let mut refusals = self.refusals.lock();
            for name in gone {
                refusals.remove(&(type_url.to_string(), name));
            }
            if whole {
                refusals.retain(|(t, n), _| t != type_url || offered.iter().any(|(o, _)| o == n));
            }
            for (name, version) in offered {
                let key = (type_url.to_string(), name.clone());
                match applied.rejected.iter().find(|r| r.name == name) {
                    Some(r) => {
                        refusals.insert(
                            key,
                            Refusal {
                                version,
                                reason: r.reason.clone(),
                                at: now,
                            },
                        );
                    }
                    None => {
                        refusals.remove(&key);
                    }
                }
            }
        }
        let kind = short_type(type_url);
        tracing::info!(
            kind,
            received,
            removed,
            refused = applied.rejected.len(),
            "xDS update applied"
        );
        for r in &applied.rejected {
            tracing::warn!(kind, resource = %r.name, "xDS resource refused, previous version kept: {}", r.reason);
        }
        applied
    }
}

/// Envoy's short names for the four types (and pilot-agent's NDS), for logs.
pub fn short_type(type_url: &str) -> &'static str {
    match type_url {
        type_url::NAME_TABLE => "NDS",
        type_url::CLUSTER => "CDS",
        type_url::LISTENER => "LDS",
        type_url::ROUTE => "RDS",
        type_url::ENDPOINT => "EDS",
        type_url::SECRET => "SDS",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn the_node_is_the_pods() {
        let mut metadata = std::collections::BTreeMap::new();
        metadata.insert("NAMESPACE".to_string(), serde_json::json!("client"));
        let node = NodeInfo {
            id: "sidecar~10.0.0.2~sleep-1.client~client.svc.cluster.local".into(),
            cluster: "sleep.client".into(),
            instance_ip: "10.0.0.2".into(),
            pod_name: "sleep-1".into(),
            namespace: "client".into(),
            service_account: "sleep".into(),
            dns_domain: "client.svc.cluster.local".into(),
            metadata,
        };
        let proto = ads_node(&node).to_node();
        assert_eq!(proto.id, node.id);
        assert_eq!(proto.cluster, "sleep.client");
        assert_eq!(proto.user_agent_name, "remora");
        assert!(proto
            .metadata
            .is_some_and(|m| m.fields.contains_key("NAMESPACE")));
    }

    #[test]
    fn first_config_needs_clusters_and_listeners_applied_or_refused() {
        let stats = Stats::default();
        assert!(!first_config_received(&stats));
        let count = |t, f: fn(&ads::TypeStats) -> &std::sync::atomic::AtomicU64| {
            if let Some(s) = stats.of(t) {
                f(s).fetch_add(1, Ordering::Relaxed);
            }
        };
        count(type_url::CLUSTER, |s| &s.update_success);
        assert!(!first_config_received(&stats));
        // A refused first LDS is still a received one, as pilot-agent reads Envoy's stats.
        count(type_url::LISTENER, |s| &s.update_rejected);
        assert!(first_config_received(&stats));
    }

    #[test]
    fn refusals_stand_until_the_resource_is_accepted_or_removed() {
        use remora_xds::sink::Resource as Delivered;
        let refusals = Arc::new(Refusals::default());
        let sink = LoggedStore {
            store: Arc::new(Store::new()),
            refusals: Arc::clone(&refusals),
        };
        let garbage = |version: &str| Delivered {
            name: "c".into(),
            version: version.into(),
            body: vec![0xff, 0xff, 0xff],
        };
        let update = |resources, removed| Update {
            resources,
            removed,
            complete: false,
        };
        sink.apply(type_url::CLUSTER, update(vec![garbage("2")], vec![]));
        let r = refusals.of(type_url::CLUSTER, "c").expect("refused");
        assert_eq!(r.version, "2");
        assert!(r.reason.contains("malformed"), "{}", r.reason);
        assert_eq!(refusals.all(type_url::CLUSTER).len(), 1);
        assert!(refusals.all(type_url::LISTENER).is_empty());
        sink.apply(type_url::CLUSTER, update(vec![], vec!["c".into()]));
        assert!(refusals.of(type_url::CLUSTER, "c").is_none());
    }

    #[test]
    fn short_names() {
        assert_eq!(short_type(type_url::CLUSTER), "CDS");
        assert_eq!(short_type(type_url::ENDPOINT), "EDS");
        assert_eq!(short_type("x"), "other");
    }
}
