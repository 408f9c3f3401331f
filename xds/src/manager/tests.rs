use super::*;
use crate::json::from_json_typed;
use crate::sink::{type_url, Resource as Delivered, Sink, Update};
use crate::store::Store;
use envoy_types::pb::envoy::config::cluster::v3::Cluster as ClusterProto;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment as ClaProto;
use serde_json::{json, Value};

fn delivered<T: Resource>(name: &str, version: &str, value: &Value) -> Delivered {
    Delivered {
        name: name.into(),
        version: version.into(),
        body: from_json_typed::<T>(value, T::KIND.message_name())
            .expect("test resource reads")
            .encode_to_vec(),
    }
}

/// A state-of-the-world push of `resources` (name, resource) at `version`.
fn push<T: Resource>(store: &Store, type_url: &str, version: &str, resources: &[(&str, Value)]) {
    let applied = store.apply(
        type_url,
        Update {
            resources: resources
                .iter()
                .map(|(name, r)| delivered::<T>(name, version, r))
                .collect(),
            removed: vec![],
            complete: true,
        },
    );
    assert!(applied.rejected.is_empty(), "{:?}", applied.rejected);
}

fn cluster(name: &str, timeout: &str) -> Value {
    json!({"name": name, "type": "STATIC", "connect_timeout": timeout,
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "10.0.0.1", "port_value": 80}}}}]}]}})
}

fn listener(address: &str, port: u32, stat_prefix: &str) -> Value {
    json!({
        "name": format!("{address}_{port}"),
        "address": {"socket_address": {"address": address, "port_value": port}},
        "bind_to_port": false,
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.tcp_proxy",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "stat_prefix": stat_prefix, "cluster": "a"
            }
        }]}]
    })
}

#[test]
fn clusters_added_modified_and_removed_count_as_envoys_manager_counts_them() {
    let store = Store::new();
    let cds = |version, clusters: &[(&str, Value)]| {
        push::<ClusterProto>(&store, type_url::CLUSTER, version, clusters);
    };
    cds("1", &[("a", cluster("a", "1s")), ("b", cluster("b", "1s"))]);
    let counts = store.manager_counts();
    assert_eq!((counts.cluster_added, counts.cluster_modified), (2, 0));
    // `a` changes, `b` goes, `c` comes.
    cds("2", &[("a", cluster("a", "2s")), ("c", cluster("c", "1s"))]);
    let counts = store.manager_counts();
    assert_eq!(
        (
            counts.cluster_added,
            counts.cluster_modified,
            counts.cluster_removed
        ),
        (3, 1, 1)
    );
    // The same clusters as a new version, and endpoints: nothing changes.
    cds("3", &[("a", cluster("a", "2s")), ("c", cluster("c", "1s"))]);
    push::<ClaProto>(
        &store,
        type_url::ENDPOINT,
        "1",
        &[("a", json!({"cluster_name": "a"}))],
    );
    assert_eq!(store.manager_counts(), counts);
    assert_eq!(counts.listener_added, 0);
}

#[test]
fn a_listener_whose_filter_chains_alone_change_is_updated_in_place() {
    let store = Store::new();
    let lds = |version, listeners: &[Value]| {
        let named: Vec<(&str, Value)> = listeners
            .iter()
            .map(|l| (l["name"].as_str().unwrap_or_default(), l.clone()))
            .collect();
        push::<ListenerProto>(&store, type_url::LISTENER, version, &named);
    };
    let (vip, other) = ("10.96.0.1", "10.96.0.2");
    lds("1", &[listener(vip, 80, "a"), listener(other, 80, "a")]);
    assert_eq!(store.manager_counts().listener_added, 2);
    // The first's chain changes (in place); the second gains a listener filter (a full
    // update: Envoy makes a new listener).
    let mut tuned = listener(other, 80, "a");
    tuned["listener_filters"] = json!([{"name": "envoy.filters.listener.tls_inspector",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"}}]);
    lds("2", &[listener(vip, 80, "b"), tuned.clone()]);
    let counts = store.manager_counts();
    assert_eq!(
        (counts.listener_modified, counts.listener_in_place_updated),
        (2, 1)
    );
    // Sent again unchanged, then one removed.
    lds("3", &[listener(vip, 80, "b"), tuned]);
    assert_eq!(store.manager_counts(), counts);
    lds("4", &[listener(vip, 80, "b")]);
    let counts = store.manager_counts();
    assert_eq!(
        (
            counts.listener_added,
            counts.listener_modified,
            counts.listener_removed
        ),
        (2, 2, 1)
    );
    assert_eq!(counts.cluster_added, 0);
}
