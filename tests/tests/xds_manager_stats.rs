//! Envoy's cluster and listener managers' statistics (`cluster_manager.cluster_added|
//! modified|removed`, `listener_manager.listener_added|modified|removed|in_place_updated|
//! create_success`, `total_listeners_active`…), which an Istio sidecar's stats inclusion list
//! keeps: Remora and a real Envoy 1.40 are given the same clusters and listeners, then the
//! same updates, and must count the same changes.
//!
//! The updates: a cluster changed, one removed and one added; the same clusters sent again
//! (nothing to count) while a listener's filter chain changes (an in-place update) and a
//! listener is added; then a listener filter added to one (a full update) and one removed.
//!
//! Both proxies read their resources from files (Remora's `xds.resources_dir`, Envoy's
//! filesystem subscriptions), and run one worker each (Envoy's tests run `--concurrency 1`),
//! so that the listeners added to workers count the same.

use remora_e2e::envoy_xds::{nets_or_skip, Resources};
use remora_e2e::sidecars::{self, Sidecar};
use remora_e2e::stat_deltas::{self, Stats};
use remora_e2e::xds_resources::eds_cluster;
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long a proxy has to apply an update read from its files.
const APPLY_TIME: Duration = Duration::from_secs(15);
/// Once a change shows, how long more it may take to show whole (the files are read one by
/// one).
const SETTLE: Duration = Duration::from_millis(1500);

fn cluster(name: &str, timeout: &str) -> Value {
    let mut c = eds_cluster(name);
    c["connect_timeout"] = json!(timeout);
    c
}

fn endpoints(name: &str) -> Value {
    json!({"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address":
        {"socket_address": {"address": "10.1.0.1", "port_value": 8080}}}}]}]})
}

/// istiod's per-VIP TCP listener for `vip`:80, its `tcp_proxy` to `cluster`.
fn vip_listener(vip: &str, cluster: &str, stat_prefix: &str) -> Value {
    json!({"name": format!("{vip}_80"),
        "address": {"socket_address": {"address": vip, "port_value": 80}},
        "traffic_direction": "OUTBOUND", "bind_to_port": false,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": stat_prefix, "cluster": cluster}}]}]})
}

fn virtual_outbound() -> Value {
    json!({"name": "virtualOutbound", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
        "use_original_dst": true, "traffic_direction": "OUTBOUND",
        "filter_chains": [{"name": "virtualOutbound-catchall-tcp", "filters": [
            {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "stat_prefix": "BlackHoleCluster", "cluster": "BlackHoleCluster"}}]}]})
}

const A: &str = "outbound|80||a.test.svc.cluster.local";
const B: &str = "outbound|80||b.test.svc.cluster.local";
const C: &str = "outbound|80||c.test.svc.cluster.local";

/// The resources of each step.
fn steps() -> Vec<Resources> {
    let black_hole =
        json!({"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"});
    let resources = |clusters: Vec<Value>, listeners: Vec<Value>| Resources {
        listeners: Value::Array(listeners),
        clusters: Value::Array(clusters),
        routes: json!([]),
        endpoints: json!([endpoints(A), endpoints(B), endpoints(C)]),
    };
    let with_inspector = {
        let mut l = vip_listener("10.96.0.10", A, A);
        l["listener_filters"] = json!([{"name": "envoy.filters.listener.tls_inspector",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"}}]);
        l
    };
    let changed = || vec![cluster(A, "3s"), cluster(C, "2s"), black_hole.clone()];
    vec![
        resources(
            vec![cluster(A, "2s"), cluster(B, "2s"), black_hole.clone()],
            vec![virtual_outbound(), vip_listener("10.96.0.10", A, A)],
        ),
        resources(
            changed(),
            vec![virtual_outbound(), vip_listener("10.96.0.10", A, A)],
        ),
        resources(
            changed(),
            vec![
                virtual_outbound(),
                vip_listener("10.96.0.10", A, "renamed"),
                vip_listener("10.96.0.11", C, C),
            ],
        ),
        resources(changed(), vec![virtual_outbound(), with_inspector]),
    ]
}

struct World<'n> {
    net: &'n PodNet,
    proxy: Sidecar<'n>,
    /// Where the proxy reads its resources from.
    dir: PathBuf,
}

impl World<'_> {
    fn stats(&self) -> Stats {
        stat_deltas::stats(self.net, self.proxy.admin_port(), |name| {
            (name.starts_with("cluster_manager.") || name.starts_with("listener_manager."))
                // The subscriptions' own counts: Envoy's filesystem subscription counts each
                // file read, Remora's directory poller has no such counts.
                && !name.contains(".cds.")
                && !name.contains(".lds.")
        })
    }

    /// Give the proxy `r` as version `version`.
    fn write(&self, r: &Resources, version: &str) {
        match &self.proxy {
            Sidecar::Remora(_) => r.write_for_remora(&self.dir),
            Sidecar::Envoy(_) => {
                r.write_envoy_endpoints(&self.dir, version);
                r.write_envoy_clusters(&self.dir, version);
                r.write_envoy_listeners(&self.dir, version);
            }
        }
    }

    /// The statistics once the proxy has applied what changes them from `before`.
    fn applied(&self, before: &Stats) -> Stats {
        let deadline = Instant::now() + APPLY_TIME;
        while self.stats() == *before {
            assert!(
                Instant::now() < deadline,
                "{}: no change applied within {APPLY_TIME:?}:\n{}",
                self.proxy.name(),
                self.proxy.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(SETTLE);
        self.stats()
    }
}

fn world<'n>(net: &'n PodNet, envoy: Option<&std::path::Path>, first: &Resources) -> World<'n> {
    let (proxy, dir) = match envoy {
        None => {
            let dir = net.binary().make_dir("xds");
            first.write_for_remora(&dir);
            let remora = net
                .remora()
                .config(&format!("xds:\n  resources_dir: {}\n", dir.display()))
                .arg("--concurrency")
                .arg("1")
                .start_ready();
            (Sidecar::Remora(remora), dir)
        }
        Some(binary) => {
            let (envoy, dir) = first.start_envoy_dynamic(net, binary);
            (Sidecar::Envoy(envoy), dir)
        }
    };
    World { net, proxy, dir }
}

#[test]
fn configuration_changes_are_counted_as_envoys_managers_count_them() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let steps = steps();
    let (remora, envoy) = (
        world(&nets.0, None, &steps[0]),
        world(&nets.1, Some(&binary), &steps[0]),
    );
    let ours_at_start = remora.stats();
    for name in [
        "cluster_manager.cluster_added",
        "listener_manager.listener_in_place_updated",
        "listener_manager.listener_create_success",
    ] {
        assert!(
            ours_at_start.contains_key(name),
            "{name}: {ours_at_start:?}"
        );
    }
    let (mut ours, mut envoys) = (ours_at_start, envoy.stats());
    for (i, step) in steps.iter().enumerate().skip(1) {
        let version = (i + 1).to_string();
        envoy.write(step, &version);
        remora.write(step, &version);
        let (envoys_now, ours_now) = (envoy.applied(&envoys), remora.applied(&ours));
        // Every name Remora keeps is one of Envoy's.
        let unknown: Vec<&String> = ours_now
            .keys()
            .filter(|n| !envoys_now.contains_key(*n))
            .collect();
        assert!(unknown.is_empty(), "names Envoy does not have: {unknown:?}");
        let kept = |before: &Stats, after: &Stats| -> Vec<String> {
            stat_deltas::delta(before, after)
                .into_iter()
                .filter(|d| {
                    d.split(' ')
                        .next()
                        .is_some_and(|n| ours_now.contains_key(n))
                })
                .collect()
        };
        let expected = kept(&envoys, &envoys_now);
        assert!(!expected.is_empty(), "step {i}: Envoy counted nothing");
        assert_eq!(
            kept(&ours, &ours_now),
            expected,
            "step {i}:\n{}",
            sidecars::admin(remora.net, &remora.proxy, "/stats")
        );
        (ours, envoys) = (ours_now, envoys_now);
    }
    // What each step was, as Envoy counted it: a change of each kind was seen.
    for (name, at_least) in [
        ("cluster_manager.cluster_modified", 1),
        ("cluster_manager.cluster_removed", 1),
        ("listener_manager.listener_in_place_updated", 1),
        ("listener_manager.listener_removed", 1),
    ] {
        assert!(
            envoys.get(name).copied().unwrap_or(0) >= at_least,
            "{name}: {envoys:?}"
        );
    }
}
