//! The connection to istiod counted as Envoy counts its `xds-grpc` cluster's
//! (`cluster.xds-grpc;.upstream_cx_*`, on Prometheus `envoy_cluster_upstream_cx_active{cluster_name="xds-grpc"}`…,
//! which Istio's control-plane dashboard reads): Remora in istiod mode and a real Envoy 1.40
//! whose bootstrap has pilot-agent's `xds-grpc` cluster (over TLS to the control plane, as
//! pilot-agent's xDS proxy would be reached), each with its own copy of the harness's control
//! plane (`remora_e2e::istiod`: gRPC over TLS with token checks). The same story for both: the
//! connection made and its bytes; istiod gone (its close counted, the dials that fail while it
//! is away counted); istiod back (a new connection).

use remora_e2e::envoy::Envoy;
use remora_e2e::envoy_xds::{istio_stats_config, nets_or_skip};
use remora_e2e::istiod::ads::type_url;
use remora_e2e::istiod::{envoy_bootstrap, Ads, ControlPlane, PodFiles, ISTIOD_PORT};
use remora_e2e::stat_deltas::{self, prometheus_samples, Stats};
use remora_e2e::PodNet;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "projected-token-for-sleep";
const STEP_TIME: Duration = Duration::from_secs(30);
const CLUSTER: &str = "outbound|9080||reviews.bookinfo.svc.cluster.local";
const PREFIX: &str = "cluster.xds-grpc;.";

/// One service's cluster and listener: what makes a proxy ready.
fn serve(ads: &Ads) {
    ads.set(
        type_url::CLUSTER,
        "v1",
        &[json!({"name": CLUSTER, "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": CLUSTER, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "10.1.0.1", "port_value": 9080}}}}]}]}})],
    );
    ads.set(
        type_url::LISTENER,
        "v1",
        &[json!({"name": "10.96.0.30_9080",
            "address": {"socket_address": {"address": "10.96.0.30", "port_value": 9080}},
            "traffic_direction": "OUTBOUND", "bind_to_port": false,
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "stat_prefix": CLUSTER, "cluster": CLUSTER}}]}]})],
    );
}

fn start_plane(net: &PodNet, w: &PodFiles, ads: Option<&Arc<Ads>>) -> ControlPlane {
    let addr = net.peer_addr(ISTIOD_PORT);
    match ads {
        None => ControlPlane::start(&net.peer, addr, Arc::clone(&w.ca), TOKEN),
        Some(ads) => {
            ControlPlane::start_with_ads(&net.peer, addr, Arc::clone(&w.ca), TOKEN, Arc::clone(ads))
        }
    }
}

/// pilot-agent's bootstrap for Envoy ([`envoy_bootstrap`]), with Istio's stats tags.
fn bootstrap(net: &PodNet, w: &PodFiles) -> String {
    let mut bootstrap = envoy_bootstrap(net, &w.root, TOKEN, true);
    istio_stats_config(&mut bootstrap);
    bootstrap.to_string()
}

/// What one proxy counted at each step of the story, and its Prometheus samples at the end.
#[derive(Debug)]
struct Told {
    connected: Stats,
    away: Stats,
    back: Stats,
    samples: Vec<String>,
}

/// The story, told by the proxy whose admin listens on `admin_port`, with its control plane
/// already serving (`plane`).
fn story(
    net: &PodNet,
    w: &PodFiles,
    plane: ControlPlane,
    admin_port: u16,
    logs: &dyn Fn() -> String,
) -> Told {
    let stats = || stat_deltas::stats(net, admin_port, |n| n.starts_with(PREFIX));
    let value = |s: &Stats, stat: &str| s.get(&format!("{PREFIX}{stat}")).copied();
    let wait = |what: &str, ok: &dyn Fn(&Stats) -> bool| -> Stats {
        let deadline = Instant::now() + STEP_TIME;
        loop {
            let s = stats();
            if ok(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "{what}: {s:?}\n{}", logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let connected = wait("connected", &|s| value(s, "upstream_cx_active") == Some(1));
    let ads = Arc::clone(plane.ads());
    drop(plane);
    // Away long enough for dials to fail (each proxy backs off from its first).
    let away = wait("istiod's close seen and a dial failed", &|s| {
        value(s, "upstream_cx_active") == Some(0) && value(s, "upstream_cx_connect_fail") >= Some(2)
    });
    let _plane = start_plane(net, w, Some(&ads));
    let dials = value(&away, "upstream_cx_total");
    // The new connection's bytes are added to the first's as they pass.
    let received = value(&connected, "upstream_cx_rx_bytes_total");
    let back = wait("connected again, and answered", &|s| {
        value(s, "upstream_cx_active") == Some(1)
            && value(s, "upstream_cx_total") > dials
            && value(s, "upstream_cx_rx_bytes_total") > received
    });
    let mut samples = Vec::new();
    for family in [
        "envoy_cluster_upstream_cx_active",
        "envoy_cluster_upstream_cx_destroy",
    ] {
        samples.extend(
            prometheus_samples(net, admin_port, family)
                .into_iter()
                .filter(|s| s.starts_with('#') || s.contains("cluster_name=\"xds-grpc\"")),
        );
    }
    Told {
        connected,
        away,
        back,
        samples,
    }
}

fn remora_story(net: &PodNet) -> Told {
    let w = PodFiles::write(net, TOKEN);
    let plane = start_plane(net, &w, None);
    serve(plane.ads());
    let sidecar = remora_e2e::istiod::injected_sidecar(net)
        .config(&format!(
            "istiod:\n  token_file: {}\n  root_cert_file: {}\n",
            w.token.display(),
            w.root.display(),
        ))
        .start_ready();
    story(net, &w, plane, remora_e2e::ADMIN_PORT, &|| sidecar.stderr())
}

fn envoy_story(net: &PodNet, binary: &std::path::Path) -> Told {
    let w = PodFiles::write(net, TOKEN);
    let plane = start_plane(net, &w, None);
    serve(plane.ads());
    let envoy = Envoy::start_sidecar(&net.pod, binary, net.binary(), &bootstrap(net, &w));
    story(net, &w, plane, remora_e2e::envoy::ADMIN_PORT, &|| {
        envoy.logs()
    })
}

#[test]
fn the_connection_to_istiod_is_counted_as_envoys_xds_grpc_cluster() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let envoy = envoy_story(&nets.1, &binary);
    let remora = remora_story(&nets.0);
    let value = |s: &Stats, stat: &str| s.get(&format!("{PREFIX}{stat}")).copied();
    for (who, told) in [("envoy", &envoy), ("remora", &remora)] {
        // Every name Remora keeps is one of Envoy's.
        for name in remora.connected.keys() {
            assert!(envoy.connected.contains_key(name), "{name}: {envoy:?}");
        }
        let c = &told.connected;
        for (stat, expected) in [
            ("upstream_cx_total", 1),
            ("upstream_cx_http2_total", 1),
            ("upstream_cx_connect_fail", 0),
            ("upstream_cx_destroy", 0),
        ] {
            assert_eq!(
                value(c, stat),
                Some(expected),
                "{who} connected, {stat}: {told:?}"
            );
        }
        for stat in ["upstream_cx_rx_bytes_total", "upstream_cx_tx_bytes_total"] {
            assert!(
                value(c, stat) > Some(0),
                "{who} connected, {stat}: {told:?}"
            );
        }
        // Every dial made is destroyed (the connection istiod closed, each that failed while
        // it was away) or the one open again at the end.
        for (step, s, open) in [("away", &told.away, 0), ("back", &told.back, 1)] {
            let destroyed = value(s, "upstream_cx_destroy").unwrap_or(0);
            assert_eq!(
                value(s, "upstream_cx_total"),
                Some(destroyed + open),
                "{who} {step}: {told:?}"
            );
            assert_eq!(
                destroyed,
                1 + value(s, "upstream_cx_connect_fail").unwrap_or(0),
                "{who} {step}: {told:?}"
            );
            assert_eq!(
                value(s, "upstream_cx_http2_total"),
                value(s, "upstream_cx_total"),
                "{who} {step}"
            );
            assert_eq!(
                value(s, "upstream_cx_connect_timeout"),
                Some(0),
                "{who} {step}"
            );
        }
    }
    // istiod closed the connection, and refused the dials while away: all closed by the peer.
    for (who, told) in [("envoy", &envoy), ("remora", &remora)] {
        assert_eq!(
            value(&told.away, "upstream_cx_destroy_remote"),
            value(&told.away, "upstream_cx_destroy"),
            "{who}: {told:?}"
        );
        assert_eq!(
            value(&told.away, "upstream_cx_destroy_local"),
            Some(0),
            "{who}"
        );
    }
    // On Prometheus, under Istio's tags, the cluster is a label.
    assert!(
        remora
            .samples
            .contains(&"envoy_cluster_upstream_cx_active{cluster_name=\"xds-grpc\"} 1".to_string()),
        "{:?}",
        remora.samples
    );
    // Envoy's samples of the metrics Remora has: the same names, labels and values.
    let metric = |s: &str| {
        let name = s.strip_prefix("# TYPE ").unwrap_or(s);
        name.split(['{', ' ']).next().unwrap_or(name).to_string()
    };
    let ours: Vec<String> = remora.samples.iter().map(|s| metric(s)).collect();
    let envoys: Vec<&String> = envoy
        .samples
        .iter()
        .filter(|s| ours.contains(&metric(s)))
        .collect();
    assert_eq!(remora.samples.iter().collect::<Vec<_>>(), envoys);
}
