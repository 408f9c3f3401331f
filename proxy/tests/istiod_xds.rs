//! The ADS glue against the harness's test control plane (real gRPC over TLS) on loopback: the
//! channel and credentials the CA uses, the pod's node, delta by default, the store filled and
//! readiness told, a refused token refused on the stream. No root, no namespaces; the
//! pod-shaped version is `tests/tests/istiod_xds.rs`.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use remora::admin::Readiness;
use remora::istiod::xds::{XdsClient, FIRST_CONFIG};
use remora::istiod::{AgentSettings, IstiodChannels};
use remora_config::IstiodConfig;
use remora_e2e::certs::MeshCa;
use remora_e2e::istiod::ads::type_url;
use remora_e2e::istiod::ControlPlane;
use remora_xds::store::Store;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLUSTER: &str = "outbound|80||web.default.svc.cluster.local";

fn settings(port: u16, token: &Path, root: &Path) -> AgentSettings {
    let file = IstiodConfig {
        discovery_address: Some(format!("localhost:{port}")),
        token_file: token.to_path_buf(),
        root_cert_file: root.to_path_buf(),
        pod_name: Some("sleep-1".into()),
        pod_namespace: Some("client".into()),
        instance_ip: Some("10.0.0.2".into()),
        ..IstiodConfig::default()
    };
    AgentSettings::resolve(&file, &BTreeMap::new())
        .unwrap()
        .unwrap()
}

async fn eventually(what: &str, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn the_client_fills_the_store_and_readiness_and_a_refused_token_gets_nothing() {
    let ca = Arc::new(MeshCa::new("cluster.local"));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let plane = ControlPlane::start_on(listener, Arc::clone(&ca), "good", "localhost");
    let ads = Arc::clone(plane.ads());
    ads.set(
        type_url::CLUSTER,
        "1",
        &[json!({"name": CLUSTER, "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": CLUSTER, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "10.0.0.9", "port_value": 80}}}}]}]}})],
    );
    ads.set(type_url::LISTENER, "1", &[]);
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("istio-token");
    let root = dir.path().join("root-cert.pem");
    std::fs::write(&token, "good\n").unwrap();
    std::fs::write(&root, ca.root_pem()).unwrap();
    let settings = settings(port, &token, &root);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let channels = IstiodChannels::new(&settings).unwrap();
        let store = Arc::new(Store::new());
        let readiness = Arc::new(Readiness::default());
        readiness.require(FIRST_CONFIG);
        let client = XdsClient::new(&settings, &channels.xds, Arc::clone(&store), false);
        let stats = client.stats();
        tokio::spawn(client.run(Arc::clone(&readiness)));
        eventually("ready", || readiness.pending().is_empty()).await;
        assert!(store.snapshot().cluster(CLUSTER).is_some());
        assert_eq!(
            stats
                .connected_state
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        let requests = ads.requests();
        assert!(requests.iter().all(|r| r.delta), "{requests:?}");
        assert!(
            requests
                .iter()
                .all(|r| r.node_id == "sidecar~10.0.0.2~sleep-1.client~client.svc.cluster.local"),
            "{requests:?}"
        );
        assert!(ads.refused().is_empty(), "{:?}", ads.refused());

        // Someone else's token: the stream is refused, nothing arrives, readiness waits.
        std::fs::write(&token, "stolen").unwrap();
        let other = Arc::new(Store::new());
        let waiting = Arc::new(Readiness::default());
        waiting.require(FIRST_CONFIG);
        let client = XdsClient::new(&settings, &channels.xds, Arc::clone(&other), false);
        tokio::spawn(client.run(Arc::clone(&waiting)));
        eventually("a refused stream", || !ads.refused().is_empty()).await;
        assert!(ads.refused()[0].contains("stolen"), "{:?}", ads.refused());
        assert_eq!(waiting.pending(), vec![FIRST_CONFIG]);
        assert!(other.snapshot().clusters.is_empty());
    });
    runtime.shutdown_timeout(Duration::from_millis(100));
}
