//! The CA client against the harness's test control plane (real gRPC over TLS) on loopback:
//! the channel, the per-call credentials, the hand-written messages and the checks, with no
//! root and no namespaces. The pod-shaped version is `tests/tests/istiod_ca.rs`.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use remora::identity::{SpiffeId, Store};
use remora::istiod::ca::CaClient;
use remora::istiod::rotation::Rotation;
use remora::istiod::{AgentSettings, IstiodChannels};
use remora::metrics::TlsMetrics;
use remora_config::IstiodConfig;
use remora_e2e::certs::MeshCa;
use remora_e2e::istiod::ControlPlane;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const ID: &str = "spiffe://cluster.local/ns/client/sa/sleep";

#[test]
fn a_certificate_from_the_control_plane_and_a_refused_token() {
    let ca = Arc::new(MeshCa::new("cluster.local"));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let plane = ControlPlane::start_on(listener, Arc::clone(&ca), "good", "localhost");
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("istio-token");
    let root = dir.path().join("root-cert.pem");
    std::fs::write(&token, "good\n").unwrap();
    std::fs::write(&root, ca.root_pem()).unwrap();
    let file = IstiodConfig {
        discovery_address: Some(format!("localhost:{port}")),
        token_file: token.clone(),
        root_cert_file: root,
        pod_namespace: Some("client".into()),
        service_account: Some("sleep".into()),
        secret_ttl: Duration::from_secs(600),
        ..IstiodConfig::default()
    };
    let settings = AgentSettings::resolve(&file, &BTreeMap::new())
        .unwrap()
        .unwrap();
    assert_eq!(settings.spiffe_id(), ID);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = Arc::new(Store::default());
    let metrics = TlsMetrics::default();
    runtime.block_on(async {
        let channels = IstiodChannels::new(&settings).unwrap();
        let mut rotation = Rotation {
            issuer: CaClient {
                channel: channels.ca,
            },
            spiffe_id: SpiffeId::parse(ID).unwrap(),
            ttl: settings.secret_ttl,
            grace_period_ratio: settings.grace_period_ratio,
            fallback_roots: Vec::new(),
            store: Arc::clone(&store),
            metrics: metrics.clone(),
            on_first: None,
        };
        let renew_in = rotation.renew().await.unwrap();
        assert!(renew_in <= Duration::from_secs(306), "{renew_in:?}");
        assert_eq!(store.current().unwrap().spiffe_id.as_str(), ID);

        std::fs::write(&token, "stolen").unwrap();
        let e = rotation.renew().await.unwrap_err();
        assert_eq!(e.reason(), "unauthenticated", "{e}");
    });
    let issued = plane.issued();
    assert_eq!(issued.len(), 1);
    assert_eq!(issued[0].ttl, Duration::from_secs(600));
    assert_eq!(plane.refused().len(), 1);
    // The one installed certificate stayed.
    assert!(store.is_loaded());
}
