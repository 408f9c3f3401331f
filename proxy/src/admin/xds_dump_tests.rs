//! The admin pages with istiod's resources held: Envoy's config-dump shape and `/clusters`.

use super::super::{respond, AdminRequest, AdminState, Role};
use crate::drain::Drain;
use crate::metrics::Metrics;
use hyper::Method;
use remora_xds::convert::Resource;
use remora_xds::sink::{type_url, Resource as Delivered, Sink, Update};
use remora_xds::store::Store;
use serde_json::{json, Value};
use std::sync::Arc;

type ClusterProto = envoy_types::pb::envoy::config::cluster::v3::Cluster;
type ListenerProto = envoy_types::pb::envoy::config::listener::v3::Listener;
type RouteProto = envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
type ClaProto = envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;

fn delivered<T: Resource>(version: &str, value: Value) -> Delivered {
    let proto: T =
        remora_xds::json::from_json_typed(&value, T::KIND.message_name()).expect("a test resource");
    Delivered {
        name: proto.name().to_string(),
        version: version.into(),
        body: prost::Message::encode_to_vec(&proto),
    }
}

fn apply(store: &Store, type_url: &str, resources: Vec<Delivered>) {
    let applied = store.apply(
        type_url,
        Update {
            resources,
            removed: vec![],
            complete: false,
        },
    );
    assert!(applied.rejected.is_empty(), "{:?}", applied.rejected);
}

const CLUSTER: &str = "outbound|9080||reviews.default.svc.cluster.local";

/// A state holding one EDS cluster with two endpoints, an HTTP listener and its route table.
fn state() -> AdminState {
    let store = Arc::new(Store::new());
    apply(
        &store,
        type_url::CLUSTER,
        vec![delivered::<ClusterProto>(
            "c1",
            json!({
                "name": CLUSTER, "type": "EDS",
                "eds_cluster_config": {"eds_config": {"ads": {}}, "service_name": CLUSTER},
                "connect_timeout": "10s", "lb_policy": "LEAST_REQUEST"
            }),
        )],
    );
    apply(
        &store,
        type_url::ENDPOINT,
        vec![delivered::<ClaProto>(
            "e1",
            json!({"cluster_name": CLUSTER, "endpoints": [{
            "locality": {"region": "eu", "zone": "eu-1a"},
            "lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "10.1.0.1", "port_value": 9080}}},
                 "load_balancing_weight": 3},
                {"endpoint": {"address": {"socket_address": {"address": "10.1.0.2", "port_value": 9080}}},
                 "health_status": "DRAINING"}
            ]}]}),
        )],
    );
    apply(
        &store,
        type_url::LISTENER,
        vec![delivered::<ListenerProto>(
            "l1",
            json!({
                "name": "0.0.0.0_9080",
                "address": {"socket_address": {"address": "0.0.0.0", "port_value": 9080}},
                "traffic_direction": "OUTBOUND", "bind_to_port": false,
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "outbound_0.0.0.0_9080",
                        "rds": {"config_source": {"ads": {}}, "route_config_name": "9080"},
                        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
                    }
                }]}]
            }),
        )],
    );
    apply(
        &store,
        type_url::ROUTE,
        vec![delivered::<RouteProto>(
            "r1",
            json!({"name": "9080", "virtual_hosts": [{"name": "reviews", "domains": ["reviews"],
                "routes": [{"match": {"prefix": "/"}, "route": {"cluster": CLUSTER}}]}]}),
        )],
    );
    let mut s = AdminState::new(Arc::new(Metrics::default()), Drain::new());
    s.xds = Some(store);
    s
}

fn get_json(s: &AdminState, path: &str) -> Value {
    let r = respond(Role::Admin, s, &AdminRequest::new(Method::GET, path));
    let text = super::super::tests::body(r);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"))
}

/// The config-dump entry of `type_name`.
fn section<'a>(dump: &'a Value, type_name: &str) -> Option<&'a Value> {
    let t = format!("type.googleapis.com/envoy.admin.v3.{type_name}");
    dump["configs"]
        .as_array()?
        .iter()
        .find(|c| c["@type"] == t.as_str())
}

#[test]
fn config_dump_shows_istiods_resources_as_envoy_does() {
    let s = state();
    let dump = get_json(&s, "/config_dump");
    let clusters = section(&dump, "ClustersConfigDump").expect("clusters");
    let c = &clusters["dynamic_active_clusters"][0];
    assert_eq!(c["version_info"], "c1");
    assert_eq!(
        c["cluster"]["@type"],
        "type.googleapis.com/envoy.config.cluster.v3.Cluster"
    );
    assert_eq!(c["cluster"]["name"], CLUSTER);
    assert_eq!(c["cluster"]["lb_policy"], "LEAST_REQUEST");
    assert!(c["last_updated"].as_str().is_some_and(|t| t.ends_with('Z')));
    // Nothing warms: Envoy leaves the field out.
    assert!(
        clusters.get("dynamic_warming_clusters").is_none(),
        "{clusters}"
    );
    let listeners = section(&dump, "ListenersConfigDump").expect("listeners");
    let l = &listeners["dynamic_listeners"][0];
    assert_eq!(l["name"], "0.0.0.0_9080");
    assert_eq!(l["active_state"]["version_info"], "l1");
    assert_eq!(l["active_state"]["listener"]["name"], "0.0.0.0_9080");
    let routes = section(&dump, "RoutesConfigDump").expect("routes");
    let r = &routes["dynamic_route_configs"][0];
    assert_eq!(r["version_info"], "r1");
    assert_eq!(r["route_config"]["name"], "9080");
    assert_eq!(
        r["route_config"]["@type"],
        "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
    );
    // Endpoints only when asked, as Envoy.
    assert!(section(&dump, "EndpointsConfigDump").is_none());
    let dump = get_json(&s, "/config_dump?include_eds");
    let eds = section(&dump, "EndpointsConfigDump").expect("endpoints");
    let e = &eds["dynamic_endpoint_configs"][0];
    assert_eq!(e["version_info"], "e1");
    assert_eq!(e["endpoint_config"]["cluster_name"], CLUSTER);
    let only = get_json(&s, "/config_dump?resource=dynamic_active_clusters");
    assert_eq!(
        only["configs"][0]["@type"],
        "type.googleapis.com/envoy.admin.v3.ClustersConfigDump.DynamicCluster"
    );
    assert_eq!(only["configs"][0]["cluster"]["name"], CLUSTER);
}

#[test]
fn clusters_list_istiods_endpoints_with_weight_and_health() {
    let s = state();
    let r = respond(
        Role::Admin,
        &s,
        &AdminRequest::new(Method::GET, "/clusters"),
    );
    let text = super::super::tests::body(r);
    for line in [
        format!("{CLUSTER}::added_via_api::true"),
        format!("{CLUSTER}::10.1.0.1:9080::weight::3"),
        format!("{CLUSTER}::10.1.0.1:9080::health_flags::healthy"),
        format!("{CLUSTER}::10.1.0.1:9080::zone::eu-1a"),
        format!("{CLUSTER}::10.1.0.2:9080::health_flags::/eds_status_draining"),
    ] {
        assert!(text.lines().any(|l| l == line), "{line}: {text}");
    }
    let json = get_json(&s, "/clusters?format=json");
    let status = json["cluster_statuses"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == CLUSTER))
        .expect("the xDS cluster");
    assert_eq!(status["added_via_api"], true);
    let hosts = status["host_statuses"].as_array().expect("hosts");
    assert_eq!(hosts.len(), 2);
    assert_eq!(hosts[0]["address"]["socket_address"]["address"], "10.1.0.1");
    assert_eq!(hosts[0]["weight"], 3);
    assert_eq!(hosts[1]["health_status"]["eds_health_status"], "DRAINING");
}

/// A DNS cluster's hosts are what its names last resolved to.
#[test]
fn clusters_list_a_dns_clusters_resolved_addresses() {
    let mut s = state();
    let store = s.xds.clone().expect("a store");
    let dns = "outbound|443||api.example.com";
    apply(
        &store,
        type_url::CLUSTER,
        vec![delivered::<ClusterProto>(
            "c2",
            json!({"name": dns, "type": "STRICT_DNS", "load_assignment": {"cluster_name": dns,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                    "address": "api.example.com", "port_value": 443}}}}]}]}}),
        )],
    );
    let hosts = Arc::new(crate::upstream::dns::DnsHosts::default());
    let targets = [remora_xds::model::cluster::DnsTarget {
        host: "api.example.com".into(),
        port: 443,
        weight: 1,
        tls_mode: None,
        locality: Default::default(),
        priority: 0,
        locality_weight: None,
    }];
    let found = vec![vec!["203.0.113.7:443".parse().expect("addr")]];
    hosts.set(
        dns,
        crate::upstream::dns::host_set(dns, &targets, &found, true),
    );
    s.dns_hosts = hosts;
    let r = respond(
        Role::Admin,
        &s,
        &AdminRequest::new(Method::GET, "/clusters"),
    );
    let text = super::super::tests::body(r);
    let line = format!("{dns}::203.0.113.7:443::health_flags::healthy");
    assert!(text.lines().any(|l| l == line), "{line}: {text}");
}

#[test]
fn secrets_are_the_workload_certificate_with_the_key_redacted() {
    use base64::Engine;
    let s = state();
    let ca = crate::tls::test_certs::Ca::new("mesh root");
    s.identity.set(Arc::new(
        ca.identity("spiffe://cluster.local/ns/client/sa/sleep"),
    ));
    let dump = get_json(&s, "/config_dump?resource=dynamic_active_secrets");
    let secrets = dump["configs"].as_array().expect("secrets");
    let decoded = |v: &Value| {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .expect("base64");
        String::from_utf8(bytes).expect("text")
    };
    let default = &secrets[0];
    assert_eq!(default["name"], "default");
    let tls = &default["secret"]["tls_certificate"];
    assert!(decoded(&tls["certificate_chain"]["inline_bytes"])
        .starts_with("-----BEGIN CERTIFICATE-----\n"));
    assert_eq!(decoded(&tls["private_key"]["inline_bytes"]), "[redacted]");
    let root = &secrets[1];
    assert_eq!(root["name"], "ROOTCA");
    let trusted = decoded(&root["secret"]["validation_context"]["trusted_ca"]["inline_bytes"]);
    assert!(trusted.contains("BEGIN CERTIFICATE"), "{trusted}");
}
