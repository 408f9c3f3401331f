//! Warming through the store's real apply path: clusters naming ADS secrets wait for them (or
//! their initial fetch timeout), an older version serves meanwhile, and the secrets' clocks
//! start when the clusters want them.

use crate::json::from_json_typed;
use crate::sink::{type_url, Resource as Delivered, Sink, Update};
use crate::store::Store;
use prost::Message;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const CACERT: &str = "kubernetes://cred-cacert";
const UPSTREAM_TLS: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";

type ClusterProto = envoy_types::pb::envoy::config::cluster::v3::Cluster;
type ClaProto = envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
type SecretProto = envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;

fn encoded<T: Message + Default>(value: &Value, message: &str) -> Vec<u8> {
    from_json_typed::<T>(value, message)
        .expect("test resource reads")
        .encode_to_vec()
}

fn delivered(name: &str, version: &str, body: Vec<u8>) -> Delivered {
    Delivered {
        name: name.into(),
        version: version.into(),
        body,
    }
}

/// A cluster as istiod writes a DestinationRule's SIMPLE TLS with a `credentialName`
/// (`secret`: the roots served over ADS); without `secret`, plain text.
fn cluster(name: &str, version: &str, eds: bool, secret: Option<&str>) -> Delivered {
    let mut c = match eds {
        true => json!({"name": name, "type": "EDS", "connect_timeout": "1s",
            "eds_cluster_config": {"eds_config": {"ads": {}}, "service_name": name}}),
        false => json!({"name": name, "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint":
                {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8443}}}}]}]}}),
    };
    if let Some(secret) = secret {
        c["transport_socket"] = json!({"name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": UPSTREAM_TLS, "sni": "api.example.com",
            "common_tls_context": {"combined_validation_context": {
                "default_validation_context": {},
                "validation_context_sds_secret_config":
                    {"name": secret, "sds_config": {"ads": {}, "resource_api_version": "V3"}}}}}});
    }
    delivered(
        name,
        version,
        encoded::<ClusterProto>(&c, "envoy.config.cluster.v3.Cluster"),
    )
}

fn endpoints(name: &str) -> Delivered {
    let cla = json!({"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint":
        {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8443}}}}]}]});
    delivered(
        name,
        "1",
        encoded::<ClaProto>(&cla, "envoy.config.endpoint.v3.ClusterLoadAssignment"),
    )
}

fn roots(name: &str) -> Delivered {
    use base64::Engine;
    let key = rcgen::KeyPair::generate().expect("key");
    let ca = rcgen::CertificateParams::new(vec!["ca.example.com".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    let pem = base64::engine::general_purpose::STANDARD.encode(ca.pem());
    let secret = json!({"name": name, "validation_context": {"trusted_ca": {"inline_bytes": pem}}});
    delivered(
        name,
        "1",
        encoded::<SecretProto>(&secret, "envoy.extensions.transport_sockets.tls.v3.Secret"),
    )
}

fn apply(store: &Store, type_url: &str, resources: Vec<Delivered>, complete: bool) {
    let applied = store.apply(
        type_url,
        Update {
            resources,
            removed: Vec::new(),
            complete,
        },
    );
    assert!(applied.rejected.is_empty(), "{:?}", applied.rejected);
}

/// The version of `name` in force, if any.
fn in_force(store: &Store, name: &str) -> Option<String> {
    store
        .snapshot()
        .clusters
        .get(name)
        .map(|e| e.version.clone())
}

fn warming(store: &Store) -> Vec<String> {
    store.snapshot().warming_clusters.keys().cloned().collect()
}

#[test]
fn a_new_cluster_warms_until_its_secret_arrives() {
    let store = Store::new();
    let plain = cluster("plain", "1", false, None);
    apply(
        &store,
        type_url::CLUSTER,
        vec![plain, cluster("c", "1", false, Some(CACERT))],
        true,
    );
    let snap = store.snapshot();
    assert!(
        snap.cluster("c").is_none(),
        "routing does not find a warming cluster"
    );
    assert!(
        snap.cluster("plain").is_some(),
        "a cluster needing no secret is in force"
    );
    assert_eq!(warming(&store), ["c"]);
    assert!(
        snap.wanted_secrets().contains(CACERT),
        "the warming cluster asks for it"
    );
    apply(&store, type_url::SECRET, vec![roots(CACERT)], false);
    assert_eq!(in_force(&store, "c").as_deref(), Some("1"));
    assert!(warming(&store).is_empty());
}

#[test]
fn an_updated_cluster_warms_while_its_old_version_serves() {
    let store = Store::new();
    apply(
        &store,
        type_url::CLUSTER,
        vec![cluster("c", "1", false, None)],
        true,
    );
    apply(
        &store,
        type_url::CLUSTER,
        vec![cluster("c", "2", false, Some(CACERT))],
        true,
    );
    assert_eq!(
        in_force(&store, "c").as_deref(),
        Some("1"),
        "the old version serves"
    );
    assert_eq!(warming(&store), ["c"]);
    // A third version replaces the warming one, not the one in force.
    apply(
        &store,
        type_url::CLUSTER,
        vec![cluster("c", "3", false, Some(CACERT))],
        true,
    );
    assert_eq!(in_force(&store, "c").as_deref(), Some("1"));
    assert_eq!(store.snapshot().warming_clusters["c"].version, "3");
    apply(&store, type_url::SECRET, vec![roots(CACERT)], false);
    assert_eq!(in_force(&store, "c").as_deref(), Some("3"));
    assert!(warming(&store).is_empty());
    // Once the secret is held, a new version needing it is in force at once.
    apply(
        &store,
        type_url::CLUSTER,
        vec![cluster("c", "4", false, Some(CACERT))],
        true,
    );
    assert_eq!(in_force(&store, "c").as_deref(), Some("4"));
}

#[test]
fn a_removed_warming_cluster_goes_with_its_old_version() {
    let store = Store::new();
    apply(
        &store,
        type_url::CLUSTER,
        vec![cluster("c", "1", false, None)],
        true,
    );
    apply(
        &store,
        type_url::CLUSTER,
        vec![cluster("c", "2", false, Some(CACERT))],
        true,
    );
    apply(
        &store,
        type_url::CLUSTER,
        vec![cluster("other", "1", false, None)],
        true,
    );
    assert_eq!(in_force(&store, "c"), None);
    assert!(warming(&store).is_empty());
    assert!(!store.snapshot().wanted_secrets().contains(CACERT));
}

#[test]
fn the_initial_fetch_timeout_puts_the_cluster_in_force_without_its_secret() {
    let store = Store::new();
    let start = Instant::now();
    apply(
        &store,
        type_url::CLUSTER,
        vec![cluster("c", "1", false, Some(CACERT))],
        true,
    );
    let deadline = store
        .expire_secret_waits(start)
        .expect("a secret's clock runs");
    assert!(
        deadline >= start + Duration::from_secs(15),
        "Envoy's 15 s default"
    );
    assert!(deadline <= Instant::now() + Duration::from_secs(15));
    assert_eq!(warming(&store), ["c"], "not timed out yet");
    assert_eq!(
        store.expire_secret_waits(deadline),
        None,
        "nothing left to time"
    );
    assert_eq!(in_force(&store, "c").as_deref(), Some("1"));
    assert!(warming(&store).is_empty());
    // A secret whose fetch timed out holds no later version back.
    apply(
        &store,
        type_url::CLUSTER,
        vec![cluster("c", "2", false, Some(CACERT))],
        true,
    );
    assert_eq!(
        in_force(&store, "c").as_deref(),
        Some("1"),
        "the clock is not past yet"
    );
    assert_eq!(store.expire_secret_waits(deadline), None);
    assert_eq!(in_force(&store, "c").as_deref(), Some("2"));
}

#[test]
fn no_timeout_waits_for_ever_and_a_zero_one_not_at_all() {
    let store = Store::with_secret_fetch_timeout(None);
    apply(
        &store,
        type_url::CLUSTER,
        vec![cluster("c", "1", false, Some(CACERT))],
        true,
    );
    let later = Instant::now() + Duration::from_secs(3600);
    assert_eq!(store.expire_secret_waits(later), None);
    assert_eq!(warming(&store), ["c"]);
    let files = Store::with_secret_fetch_timeout(Some(Duration::ZERO));
    apply(
        &files,
        type_url::CLUSTER,
        vec![cluster("c", "1", false, Some(CACERT))],
        true,
    );
    assert_eq!(in_force(&files, "c").as_deref(), Some("1"));
}

#[test]
fn an_eds_cluster_starts_its_secrets_clock_once_its_endpoints_arrive() {
    let store = Store::new();
    apply(
        &store,
        type_url::CLUSTER,
        vec![cluster("e", "1", true, Some(CACERT))],
        true,
    );
    assert_eq!(warming(&store), ["e"]);
    assert!(store.snapshot().wanted_endpoints().contains("e"));
    assert!(!store.snapshot().wanted_secrets().contains(CACERT));
    let later = Instant::now() + Duration::from_secs(3600);
    assert_eq!(
        store.expire_secret_waits(later),
        None,
        "no clock before the endpoints"
    );
    assert_eq!(warming(&store), ["e"]);
    apply(&store, type_url::ENDPOINT, vec![endpoints("e")], false);
    assert!(store.snapshot().wanted_secrets().contains(CACERT));
    assert_eq!(warming(&store), ["e"]);
    let deadline = store.expire_secret_waits(Instant::now()).expect("a clock");
    assert!(deadline > Instant::now() + Duration::from_secs(10));
    apply(&store, type_url::SECRET, vec![roots(CACERT)], false);
    assert_eq!(in_force(&store, "e").as_deref(), Some("1"));
}
