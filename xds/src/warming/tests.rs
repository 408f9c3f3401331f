//! Warming through the store's real apply path: new EDS clusters wait for their endpoints and
//! clusters naming ADS secrets wait for them (or
//! their initial fetch timeout), an older version serves meanwhile, and the secrets' clocks
//! start when the clusters want them.

use crate::json::from_json_typed;
use crate::sink::{type_url, Resource as Delivered, Sink, Update};
use crate::store::Store;
use prost::Message;
use serde_json::{json, Value};
use std::collections::BTreeSet;
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
    let deadline = store.expire_waits(start).expect("a secret's clock runs");
    assert!(
        deadline >= start + Duration::from_secs(15),
        "Envoy's 15 s default"
    );
    assert!(deadline <= Instant::now() + Duration::from_secs(15));
    assert_eq!(warming(&store), ["c"], "not timed out yet");
    assert!(store.secret_fetch_timeouts().is_empty());
    assert_eq!(store.expire_waits(deadline), None, "nothing left to time");
    assert_eq!(in_force(&store, "c").as_deref(), Some("1"));
    assert!(warming(&store).is_empty());
    // Counted once per secret, as Envoy's `sds.<name>.init_fetch_timeout`, however often looked.
    store.expire_waits(deadline + Duration::from_secs(1));
    assert_eq!(
        store
            .secret_fetch_timeouts()
            .into_iter()
            .collect::<Vec<_>>(),
        [(CACERT.to_string(), 1)]
    );
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
    assert_eq!(store.expire_waits(deadline), None);
    assert_eq!(in_force(&store, "c").as_deref(), Some("2"));
    // No cluster names the secret any more: its count goes, as Envoy's statistics go with
    // the secret's subscription.
    apply(
        &store,
        type_url::CLUSTER,
        vec![cluster("c", "3", false, None)],
        true,
    );
    store.expire_waits(deadline);
    assert!(store.secret_fetch_timeouts().is_empty());
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
    assert_eq!(store.expire_waits(later), None);
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
    // Only the endpoints' clock runs (15 s), no secret's.
    let soon = Instant::now() + Duration::from_secs(10);
    let next = store.expire_waits(soon).expect("the endpoints' clock");
    assert!(next > soon);
    assert!(!store.snapshot().wanted_secrets().contains(CACERT));
    assert_eq!(warming(&store), ["e"]);
    apply(&store, type_url::ENDPOINT, vec![endpoints("e")], false);
    assert!(store.snapshot().wanted_secrets().contains(CACERT));
    assert_eq!(warming(&store), ["e"]);
    let deadline = store.expire_waits(Instant::now()).expect("a clock");
    assert!(deadline > Instant::now() + Duration::from_secs(10));
    apply(&store, type_url::SECRET, vec![roots(CACERT)], false);
    assert_eq!(in_force(&store, "e").as_deref(), Some("1"));
}

/// An EDS cluster whose `eds_config` says `initial_fetch_timeout` (istiod writes `0s`).
fn eds_cluster_timing_out(name: &str, timeout: &str) -> Delivered {
    let c = json!({"name": name, "type": "EDS", "connect_timeout": "1s",
        "eds_cluster_config": {"service_name": name,
            "eds_config": {"ads": {}, "initial_fetch_timeout": timeout, "resource_api_version": "V3"}}});
    delivered(
        name,
        "1",
        encoded::<ClusterProto>(&c, "envoy.config.cluster.v3.Cluster"),
    )
}

fn no_endpoints(name: &str) -> Delivered {
    let cla = json!({"cluster_name": name});
    delivered(
        name,
        "1",
        encoded::<ClaProto>(&cla, "envoy.config.endpoint.v3.ClusterLoadAssignment"),
    )
}

#[test]
fn a_new_eds_cluster_warms_until_its_endpoints_arrive() {
    let store = Store::new();
    apply(
        &store,
        type_url::CLUSTER,
        vec![
            cluster("e", "1", true, None),
            cluster("plain", "1", false, None),
        ],
        true,
    );
    assert!(
        store.snapshot().cluster("e").is_none(),
        "routing does not find it (503 NC)"
    );
    assert_eq!(warming(&store), ["e"]);
    assert_eq!(in_force(&store, "plain").as_deref(), Some("1"));
    assert!(store.snapshot().wanted_endpoints().contains("e"));
    apply(&store, type_url::ENDPOINT, vec![endpoints("e")], false);
    assert_eq!(in_force(&store, "e").as_deref(), Some("1"));
    assert!(warming(&store).is_empty());
    // A new version of a cluster in force whose endpoints are held is in force at once.
    apply(
        &store,
        type_url::CLUSTER,
        vec![cluster("e", "2", true, None)],
        true,
    );
    assert_eq!(in_force(&store, "e").as_deref(), Some("2"));
    // Its endpoints removed, a cluster in force stays in force (with none: 503 UH).
    let applied = store.apply(
        type_url::ENDPOINT,
        Update {
            resources: Vec::new(),
            removed: vec!["e".into()],
            complete: false,
        },
    );
    assert!(applied.rejected.is_empty());
    assert!(!store.snapshot().endpoints.contains_key("e"));
    assert_eq!(in_force(&store, "e").as_deref(), Some("2"));
    assert!(warming(&store).is_empty());
}

#[test]
fn an_empty_assignment_counts_as_arrived() {
    let store = Store::new();
    apply(
        &store,
        type_url::CLUSTER,
        vec![cluster("e", "1", true, None)],
        true,
    );
    assert_eq!(warming(&store), ["e"]);
    apply(&store, type_url::ENDPOINT, vec![no_endpoints("e")], false);
    assert_eq!(in_force(&store, "e").as_deref(), Some("1"));
}

#[test]
fn the_eds_initial_fetch_timeout_puts_the_cluster_in_force_without_endpoints() {
    let store = Store::new();
    let start = Instant::now();
    apply(
        &store,
        type_url::CLUSTER,
        vec![
            cluster("e", "1", true, None),
            eds_cluster_timing_out("two", "2s"),
        ],
        true,
    );
    assert_eq!(warming(&store), ["e", "two"]);
    let first = store
        .expire_waits(start)
        .expect("the endpoints' clocks run");
    assert!(
        first >= start + Duration::from_secs(2),
        "the cluster's own 2 s"
    );
    assert!(first <= Instant::now() + Duration::from_secs(2));
    let second = store.expire_waits(first).expect("e still waits");
    assert_eq!(in_force(&store, "two").as_deref(), Some("1"));
    assert_eq!(warming(&store), ["e"]);
    assert!(
        second >= start + Duration::from_secs(15),
        "Envoy's 15 s default"
    );
    assert!(second <= Instant::now() + Duration::from_secs(15));
    assert_eq!(store.expire_waits(second), None, "nothing left to time");
    assert_eq!(in_force(&store, "e").as_deref(), Some("1"));
    assert!(warming(&store).is_empty());
    assert!(
        !store.snapshot().endpoints.contains_key("e"),
        "in force with no endpoints (503 UH)"
    );
    // The endpoints arriving later fill the cluster in.
    apply(&store, type_url::ENDPOINT, vec![endpoints("e")], false);
    assert_eq!(in_force(&store, "e").as_deref(), Some("1"));
    assert!(store.snapshot().endpoints.contains_key("e"));
}

#[test]
fn istiods_zero_eds_timeout_waits_for_ever() {
    let store = Store::new();
    apply(
        &store,
        type_url::CLUSTER,
        vec![eds_cluster_timing_out("e", "0s")],
        true,
    );
    let later = Instant::now() + Duration::from_secs(3600);
    assert_eq!(store.expire_waits(later), None, "no clock to run");
    assert_eq!(warming(&store), ["e"]);
    apply(&store, type_url::ENDPOINT, vec![endpoints("e")], false);
    assert_eq!(in_force(&store, "e").as_deref(), Some("1"));
}

#[test]
fn resources_from_files_never_warm_on_endpoints() {
    let files = Store::with_secret_fetch_timeout(Some(Duration::ZERO));
    apply(
        &files,
        type_url::CLUSTER,
        vec![eds_cluster_timing_out("e", "0s")],
        true,
    );
    assert_eq!(in_force(&files, "e").as_deref(), Some("1"));
    assert!(warming(&files).is_empty());
}

#[test]
fn an_eds_cluster_whose_endpoints_timed_out_then_waits_for_its_secrets() {
    let store = Store::new();
    let start = Instant::now();
    apply(
        &store,
        type_url::CLUSTER,
        vec![cluster("e", "1", true, Some(CACERT))],
        true,
    );
    let mut interest = store.interest().expect("the store tells its interest");
    let endpoints_deadline = store.expire_waits(start).expect("the endpoints' clock");
    assert!(!store.snapshot().wanted_secrets().contains(CACERT));
    assert!(
        !interest.has_changed().unwrap_or(true),
        "no secret wanted yet, so the client is not woken"
    );
    // The endpoints time out: the cluster initialises and now wants its secret, whose own
    // clock starts then.
    let secret_deadline = store
        .expire_waits(endpoints_deadline)
        .expect("the secret's clock");
    assert!(store.snapshot().wanted_secrets().contains(CACERT));
    // The ADS client is told at once: no response need come for it to subscribe.
    assert!(interest.has_changed().unwrap_or(false));
    assert_eq!(
        interest.borrow_and_update().get(type_url::SECRET),
        Some(&BTreeSet::from([CACERT.to_string()]))
    );
    assert_eq!(warming(&store), ["e"], "still waiting for the secret");
    assert!(secret_deadline > endpoints_deadline);
    apply(&store, type_url::SECRET, vec![roots(CACERT)], false);
    assert_eq!(in_force(&store, "e").as_deref(), Some("1"));
}
