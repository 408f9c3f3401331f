//! Configuration from istiod, end to end: the pod's Remora runs as an injected sidecar does
//! (Istio's environment, UID 1337 behind `remora capture`) and takes its certificate and its
//! clusters, endpoints, listeners and routes from the harness's control plane
//! (`remora_e2e::istiod`: real gRPC over TLS with token checks, in the peer namespace, reached
//! as `istiod.istio-system.svc`), which records every ADS request it receives.

use remora_e2e::certs::MeshCa;
use remora_e2e::istiod::ads::type_url;
use remora_e2e::istiod::{
    Ads, AdsRequest, ControlPlane, HostsFile, PodFiles, ISTIOD_HOST, ISTIOD_PORT,
};
use remora_e2e::peer::http_get;
use remora_e2e::{PodNet, RemoraCommand, ADMIN_PORT};
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "projected-token-for-sleep";
const STEP_TIME: Duration = Duration::from_secs(30);
const POD_NAME: &str = "sleep-6d8b7c9f4-x2k4p";
const CLUSTER: &str = "outbound|9080||reviews.bookinfo.svc.cluster.local";

/// The pod's sidecar in istiod mode, as the injector configures it; `delta` chooses the ADS
/// protocol (Istio's `ISTIO_DELTA_XDS`).
fn istiod_sidecar<'a>(
    net: &'a PodNet,
    token_file: &Path,
    root_file: &Path,
    delta: bool,
) -> RemoraCommand<'a> {
    // The injector's pod name is this test's POD_NAME.
    remora_e2e::istiod::injected_sidecar(net)
        .config(&format!(
            "istiod:\n  token_file: {}\n  root_cert_file: {}\n",
            token_file.display(),
            root_file.display(),
        ))
        .env("ISTIO_DELTA_XDS", delta.to_string())
}

fn cluster(lb_policy: &str) -> Value {
    json!({
        "name": CLUSTER, "type": "EDS",
        "eds_cluster_config": {"eds_config": {"ads": {}, "resource_api_version": "V3"}, "service_name": CLUSTER},
        "connect_timeout": "10s", "lb_policy": lb_policy
    })
}

fn endpoints() -> Value {
    json!({"cluster_name": CLUSTER, "endpoints": [{"lb_endpoints": [
        {"endpoint": {"address": {"socket_address": {"address": "10.1.0.1", "port_value": 9080}}}},
        {"endpoint": {"address": {"socket_address": {"address": "10.1.0.2", "port_value": 9080}}}}
    ]}]})
}

fn listener() -> Value {
    json!({
        "name": "0.0.0.0_9080",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 9080}},
        "traffic_direction": "OUTBOUND", "bind_to_port": false,
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "outbound_0.0.0.0_9080",
                "rds": {"config_source": {"ads": {}, "resource_api_version": "V3"}, "route_config_name": "9080"},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
            }
        }]}]
    })
}

fn route() -> Value {
    json!({"name": "9080", "virtual_hosts": [{"name": "reviews.bookinfo.svc.cluster.local:9080",
        "domains": ["reviews.bookinfo.svc.cluster.local", "reviews"],
        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": CLUSTER}}]}]})
}

/// The first configuration: one service, its endpoints, its listener and route table.
fn serve_v1(ads: &Ads) {
    ads.set(type_url::ENDPOINT, "v1", &[endpoints()]);
    ads.set(type_url::ROUTE, "v1", &[route()]);
    ads.set(type_url::CLUSTER, "v1", &[cluster("LEAST_REQUEST")]);
    ads.set(type_url::LISTENER, "v1", &[listener()]);
}

fn admin_json(net: &PodNet, path: &str) -> Option<Value> {
    let admin = SocketAddr::from((Ipv4Addr::LOCALHOST, ADMIN_PORT));
    let r = http_get(&net.pod, admin, path, Duration::from_secs(5)).ok()?;
    serde_json::from_str(&r.body).ok()
}

/// The dynamic cluster `/config_dump` shows: (version, lb_policy).
fn dumped_cluster(net: &PodNet) -> Option<(String, String)> {
    let dump = admin_json(net, "/config_dump?resource=dynamic_active_clusters")?;
    let c = dump["configs"]
        .as_array()?
        .iter()
        .find(|c| c["cluster"]["name"] == CLUSTER)?;
    Some((
        c["version_info"].as_str()?.to_string(),
        c["cluster"]["lb_policy"].as_str()?.to_string(),
    ))
}

fn wait_until(what: &str, timeout: Duration, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Requests of `type_url` that answer a response, with or without an error.
fn answers(ads: &Ads, type_url: &str, nack: bool) -> Vec<AdsRequest> {
    ads.requests()
        .into_iter()
        .filter(|r| r.type_url == type_url && r.answers() && r.error_detail.is_some() == nack)
        .collect()
}

fn config_from_istiod(delta: bool) {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let PodFiles {
        ca,
        token,
        root,
        hosts: _hosts,
    } = PodFiles::write(&net, TOKEN);
    net.capture_default();
    let plane = ControlPlane::start(
        &net.peer,
        net.peer_addr(ISTIOD_PORT),
        Arc::clone(&ca),
        TOKEN,
    );
    let ads = Arc::clone(plane.ads());
    let mut sidecar = istiod_sidecar(&net, &token, &root, delta).start();

    // The certificate comes, the configuration does not yet: 503, naming what is awaited.
    wait_until("a certificate issued", STEP_TIME, || {
        !plane.issued().is_empty()
    });
    wait_until("the ADS stream asking for clusters", STEP_TIME, || {
        ads.requests()
            .iter()
            .any(|r| r.type_url == type_url::CLUSTER)
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(sidecar.readiness(), Some(503), "{}", sidecar.stderr());
    let admin = SocketAddr::from((Ipv4Addr::LOCALHOST, remora_e2e::READINESS_PORT));
    let waiting = http_get(&net.pod, admin, "/healthz/ready", Duration::from_secs(5))
        .map(|r| r.body)
        .unwrap_or_default();
    assert!(
        waiting.contains("first clusters and listeners"),
        "{waiting}"
    );

    // The configuration arrives: ready within seconds, every type ACKed.
    serve_v1(&ads);
    sidecar.wait_ready(Duration::from_secs(15));
    let node_id = format!(
        "sidecar~{}~{POD_NAME}.client~client.svc.cluster.local",
        net.pod_ip
    );
    for t in [
        type_url::CLUSTER,
        type_url::ENDPOINT,
        type_url::LISTENER,
        type_url::ROUTE,
    ] {
        wait_until(&format!("an ACK of {t}"), STEP_TIME, || {
            !answers(&ads, t, false).is_empty()
        });
    }
    let requests = ads.requests();
    assert!(
        requests.iter().all(|r| r.node_id == node_id),
        "{requests:?}"
    );
    assert!(requests.iter().all(|r| r.delta == delta), "{requests:?}");
    // Each first ACK names a response the control plane sent of that type, at v1.
    let responses = ads.responses();
    for t in [type_url::CLUSTER, type_url::LISTENER] {
        let ack = &answers(&ads, t, false)[0];
        let answered = responses
            .iter()
            .find(|r| r.nonce == ack.response_nonce)
            .unwrap_or_else(|| panic!("{ack:?} answers no response: {responses:?}"));
        assert_eq!(
            (answered.type_url.as_str(), answered.version.as_str()),
            (t, "v1")
        );
        if !delta {
            assert_eq!(ack.version_info, "v1");
        }
    }
    let stderr = sidecar.stderr();
    assert!(stderr.contains("xDS update applied"), "{stderr}");
    assert_eq!(
        dumped_cluster(&net),
        Some(("v1".into(), "LEAST_REQUEST".into()))
    );
    let dump = admin_json(&net, "/config_dump").expect("a config dump");
    let text = dump.to_string();
    for needle in ["dynamic_listeners", "0.0.0.0_9080", "dynamic_route_configs"] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    let clusters = admin_json(&net, "/clusters?format=json").expect("clusters");
    assert!(clusters.to_string().contains("10.1.0.2"), "{clusters}");
    let metrics = sidecar.metrics();
    assert_eq!(
        metrics.value("envoy_control_plane_connected_state", &[]),
        1.0
    );
    assert!(metrics.value("envoy_cluster_manager_cds_update_success", &[]) >= 1.0);
    assert!(metrics.value("envoy_listener_manager_lds_update_success", &[]) >= 1.0);

    // An unsupported field: NACKed naming the resource and the field; the old one stays.
    ads.set(
        type_url::CLUSTER,
        "v2",
        &[cluster("LOAD_BALANCING_POLICY_CONFIG")],
    );
    wait_until(
        "a NACK of the LOAD_BALANCING_POLICY_CONFIG cluster",
        STEP_TIME,
        || !answers(&ads, type_url::CLUSTER, true).is_empty(),
    );
    let nack = answers(&ads, type_url::CLUSTER, true).remove(0);
    let detail = nack.error_detail.unwrap_or_default();
    assert!(
        detail.contains(CLUSTER) && detail.contains("lb_policy"),
        "{detail}"
    );
    assert_eq!(
        dumped_cluster(&net),
        Some(("v1".into(), "LEAST_REQUEST".into()))
    );
    sidecar.wait_for_metrics("a rejected CDS update", STEP_TIME, |m| {
        m.value("envoy_cluster_manager_cds_update_rejected", &[]) >= 1.0
    });
    let stderr = sidecar.stderr();
    assert!(stderr.contains("previous version kept"), "{stderr}");
    // The dump says so beside the version in force, as Envoy's `error_state`.
    let dump = admin_json(&net, "/config_dump?resource=dynamic_active_clusters").expect("a dump");
    let error = &dump["configs"][0]["error_state"];
    assert_eq!(error["version_info"], "v2", "{dump}");
    assert!(
        error["details"]
            .as_str()
            .is_some_and(|d| d.contains("LOAD_BALANCING_POLICY_CONFIG")),
        "{dump}"
    );

    // istiod goes away: still ready, the configuration kept.
    let streams = ads.streams();
    drop(plane);
    sidecar.wait_for_metrics("the control plane disconnected", STEP_TIME, |m| {
        m.value("envoy_control_plane_connected_state", &[]) == 0.0
    });
    assert_eq!(sidecar.readiness(), Some(200), "{}", sidecar.stderr());
    assert_eq!(
        dumped_cluster(&net),
        Some(("v1".into(), "LEAST_REQUEST".into()))
    );

    // Back: a new stream from the same node, resubscribing with what it holds.
    ads.set(type_url::CLUSTER, "v3", &[cluster("LEAST_REQUEST")]);
    let _plane = ControlPlane::start_with_ads(
        &net.peer,
        net.peer_addr(ISTIOD_PORT),
        Arc::clone(&ca),
        TOKEN,
        Arc::clone(&ads),
    );
    // The stream is counted when it opens, before its first request is read: wait for the
    // request, not only for the stream (CI once looked in between).
    let resumed_cluster_request = || {
        ads.requests()
            .into_iter()
            .filter(|r| r.stream > streams)
            .find(|r| r.type_url == type_url::CLUSTER)
    };
    wait_until(
        "a new ADS stream asking for clusters",
        Duration::from_secs(60),
        || resumed_cluster_request().is_some(),
    );
    let resumed = resumed_cluster_request().expect("the new stream asks for clusters");
    assert_eq!(resumed.node_id, node_id);
    if delta {
        assert_eq!(
            resumed
                .initial_resource_versions
                .get(CLUSTER)
                .map(String::as_str),
            Some("v1"),
            "{resumed:?}"
        );
    } else {
        assert_eq!(resumed.version_info, "v1", "{resumed:?}");
    }
    wait_until(
        "the resumed stream's new version applied",
        STEP_TIME,
        || dumped_cluster(&net) == Some(("v3".into(), "LEAST_REQUEST".into())),
    );
    assert_eq!(sidecar.readiness(), Some(200));
    assert!(ads.refused().is_empty(), "{:?}", ads.refused());
}

/// Real istiod output over a real stream: the 27 listeners of the conformance set's
/// `authz-sidecar` case in one response. Remora applies all but the named exceptions (the
/// three HBONE listeners; `virtualInbound`, with the ext_authz filters of a CUSTOM policy, is
/// applied), NACKs naming each, and is ready: a refused first update is a received one.
#[test]
fn istiods_own_listeners_are_applied_but_the_named_exceptions() {
    let Some(listeners) =
        remora_e2e::istiod::ads::conformance_resources("authz-sidecar", "listeners")
    else {
        return;
    };
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let ca = Arc::new(MeshCa::new("cluster.local"));
    let token = net.binary().write_file("istio-token", TOKEN);
    let root = net.binary().write_file("root-cert.pem", &ca.root_pem());
    let _hosts = HostsFile::write(&net.pod, &[(net.peer_ip.into(), ISTIOD_HOST)])
        .expect("name istiod inside the pod");
    net.capture_default();
    let plane = ControlPlane::start(&net.peer, net.peer_addr(ISTIOD_PORT), ca, TOKEN);
    let ads = plane.ads();
    ads.set(type_url::CLUSTER, "2023-06-20", &[]);
    ads.set(type_url::LISTENER, "2023-06-20", &listeners);
    let mut sidecar = istiod_sidecar(&net, &token, &root, true).start();
    sidecar.wait_ready(STEP_TIME);
    wait_until("the LDS NACK", STEP_TIME, || {
        !answers(ads, type_url::LISTENER, true).is_empty()
    });
    let detail = answers(ads, type_url::LISTENER, true)
        .remove(0)
        .error_detail
        .unwrap_or_default();
    let refused = ["connect_terminate", "main_internal", "connect_originate"];
    for name in refused {
        assert!(detail.contains(name), "{name}: {detail}");
    }
    assert!(!detail.contains("virtualInbound"), "{detail}");
    let dump = admin_json(&net, "/config_dump?resource=dynamic_listeners").expect("a dump");
    let entries = dump["configs"].as_array().cloned().unwrap_or_default();
    let active: Vec<&str> = entries
        .iter()
        .filter(|l| l.get("active_state").is_some())
        .filter_map(|l| l["name"].as_str())
        .collect();
    assert_eq!(active.len(), listeners.len() - refused.len(), "{active:?}");
    assert!(active.contains(&"virtualOutbound"), "{active:?}");
    assert!(active.contains(&"virtualInbound"), "{active:?}");
    // The refused ones are listed with their error alone, as Envoy lists a failed listener.
    for name in refused {
        let entry = entries
            .iter()
            .find(|l| l["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in the dump"));
        assert!(entry.get("active_state").is_none(), "{entry}");
        assert!(entry["error_state"]["details"].is_string(), "{entry}");
    }
}

#[test]
fn delta_config_from_istiod_gates_readiness_nacks_and_survives_a_restart() {
    config_from_istiod(true);
}

#[test]
fn state_of_the_world_config_from_istiod_gates_readiness_nacks_and_survives_a_restart() {
    config_from_istiod(false);
}
