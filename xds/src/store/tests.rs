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
                delivered::<ListenerProto>("", "1", http_listener("0.0.0.0_9080", 9080, "9080")),
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

#[test]
fn membership_changes_count_host_set_changes_per_priority_as_envoy_does() {
    let store = Store::new();
    let cla = |hosts: &[(u32, &str)]| {
        let localities: Vec<Value> = hosts
            .iter()
            .map(|(priority, ip)| {
                json!({"priority": priority, "lb_endpoints": [{"endpoint": {"address":
                    {"socket_address": {"address": ip, "port_value": 80}}}}]})
            })
            .collect();
        json!({"cluster_name": "a", "endpoints": localities})
    };
    let eds = |version: &str, hosts: &[(u32, &str)]| {
        store.apply(
            type_url::ENDPOINT,
            update(vec![delivered::<ClaProto>("a", version, cla(hosts))], true),
        )
    };
    let cds = |version: &str, timeout: &str| {
        store.apply(
            type_url::CLUSTER,
            update(
                vec![delivered::<ClusterProto>(
                    "a",
                    version,
                    eds_cluster("a", timeout),
                )],
                true,
            ),
        )
    };
    cds("1", "1s");
    // Warming: not in force, not counted.
    assert_eq!(store.membership_changes("a"), 0);
    eds("1", &[(0, "10.0.0.1"), (1, "10.0.0.2")]);
    assert_eq!(
        store.membership_changes("a"),
        2,
        "in force with two priorities"
    );
    eds("2", &[(0, "10.0.0.1"), (0, "10.0.0.3"), (1, "10.0.0.2")]);
    assert_eq!(store.membership_changes("a"), 3, "a host joined priority 0");
    // The same cluster pushed again: the same cluster object, its hosts kept.
    cds("2", "1s");
    assert_eq!(store.membership_changes("a"), 3);
    // A new version: a new cluster, all of whose hosts are added.
    cds("3", "2s");
    assert_eq!(store.membership_changes("a"), 5);
    // Gone: its count goes with it.
    store.apply(type_url::CLUSTER, update(vec![], true));
    assert_eq!(store.membership_changes("a"), 0);
}
