//! Envoy's per-resource subscription statistics: each EDS cluster's (`cluster.<name>.update_*`)
//! and each RDS route table's (`http.<stat prefix>.rds.<name>.*`), through Remora in istiod
//! mode and a real Envoy 1.40 with pilot-agent's bootstrap, each with its own copy of the
//! harness's control plane (`remora_e2e::istiod`, gRPC over TLS), in delta and in state of the
//! world. The same story for all: two EDS clusters and a route table arrive; one cluster's
//! endpoints change; the other's are refused (a weight of 0, which Envoy refuses as it decodes
//! the response: every cluster counts the NACK alike); the route table changes, then is
//! refused (a regex that does not compile, which Envoy refuses inside the table's update: it
//! counts one attempt more); the refused endpoints come back as they were in force (nothing
//! rebuilt); istiod goes away (every subscription counts the stream's failures). After each
//! step both proxies' counts are the same.

use remora_e2e::envoy::Envoy;
use remora_e2e::envoy_xds::nets_or_skip;
use remora_e2e::istiod::ads::type_url;
use remora_e2e::istiod::{envoy_bootstrap, Ads, ControlPlane, ISTIOD_PORT};
use remora_e2e::stat_deltas::{self, Stats};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "projected-token-for-sleep";
const STEP_TIME: Duration = Duration::from_secs(30);
const A: &str = "outbound|80||a.test.svc.cluster.local";
const B: &str = "outbound|80||b.test.svc.cluster.local";
const RDS: &str = "http.outbound_0.0.0.0_80.rds.80.";

fn eds_cluster(name: &str) -> Value {
    json!({"name": name, "type": "EDS", "connect_timeout": "1s",
        "eds_cluster_config": {"eds_config": {"ads": {}, "resource_api_version": "V3"}, "service_name": name}})
}

/// `name`'s endpoints at `ips`, each of `weight`.
fn endpoints(name: &str, ips: &[&str], weight: u32) -> Value {
    let endpoints: Vec<Value> = ips
        .iter()
        .map(|ip| {
            json!({"endpoint": {"address": {"socket_address": {"address": ip, "port_value": 80}}},
                "load_balancing_weight": weight})
        })
        .collect();
    json!({"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]})
}

fn listener() -> Value {
    json!({"name": "0.0.0.0_80", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
        "traffic_direction": "OUTBOUND", "bind_to_port": false,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "outbound_0.0.0.0_80",
                "rds": {"config_source": {"ads": {}, "resource_api_version": "V3"}, "route_config_name": "80"},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]})
}

/// Route table `80`, sending everything matching `path` to `cluster`.
fn routes(path: Value, cluster: &str) -> Value {
    json!({"name": "80", "virtual_hosts": [{"name": "all", "domains": ["*"],
        "routes": [{"match": path, "route": {"cluster": cluster}}]}]})
}

/// The counts compared: every name both keep, but times (each proxy's clock).
fn stat(name: &str) -> bool {
    let counted = name.starts_with(&format!("cluster.{A}."))
        || name.starts_with(&format!("cluster.{B}."))
        || name.starts_with(RDS);
    counted && !name.ends_with("_time") && !name.ends_with("_time_ms")
}

/// One step: what the control plane does, and what tells that the proxy has taken it in.
struct Step {
    name: &'static str,
    act: fn(&Ads),
    done: fn(&Stats) -> bool,
}

fn value(s: &Stats, name: &str) -> i64 {
    s.get(name).copied().unwrap_or(-1)
}

fn steps() -> Vec<Step> {
    vec![
        Step {
            name: "the clusters' endpoints and the route table arrive",
            act: |_| {},
            done: |s| {
                value(s, &format!("cluster.{A}.update_success")) >= 1
                    && value(s, &format!("cluster.{B}.update_success")) >= 1
                    && value(s, &format!("{RDS}update_success")) >= 1
            },
        },
        Step {
            name: "a's endpoints change",
            act: |ads| {
                ads.set(
                    type_url::ENDPOINT,
                    "e2",
                    &[
                        endpoints(A, &["10.1.0.1", "10.1.0.3"], 1),
                        endpoints(B, &["10.1.0.2"], 1),
                    ],
                )
            },
            done: |s| value(s, &format!("cluster.{A}.update_success")) >= 2,
        },
        Step {
            name: "b's endpoints refused",
            act: |ads| {
                ads.set(
                    type_url::ENDPOINT,
                    "e3",
                    &[
                        endpoints(A, &["10.1.0.1", "10.1.0.3"], 1),
                        endpoints(B, &["10.1.0.2"], 0),
                    ],
                )
            },
            done: |s| value(s, &format!("cluster.{B}.update_rejected")) >= 1,
        },
        Step {
            name: "the route table changes",
            act: |ads| ads.set(type_url::ROUTE, "r2", &[routes(json!({"prefix": "/"}), B)]),
            done: |s| value(s, &format!("{RDS}config_reload")) >= 2,
        },
        Step {
            name: "the route table refused",
            act: |ads| {
                ads.set(
                    type_url::ROUTE,
                    "r3",
                    &[routes(json!({"safe_regex": {"regex": "("}}), A)],
                )
            },
            done: |s| value(s, &format!("{RDS}update_rejected")) >= 1,
        },
        Step {
            name: "b's endpoints back as they were in force",
            act: |ads| {
                ads.set(
                    type_url::ENDPOINT,
                    "e4",
                    &[
                        endpoints(A, &["10.1.0.1"], 1),
                        endpoints(B, &["10.1.0.2"], 1),
                    ],
                )
            },
            done: |s| value(s, &format!("cluster.{B}.update_no_rebuild")) >= 1,
        },
    ]
}

/// A running proxy, kept until the story ends.
trait Held {}
impl<T> Held for T {}

/// What a proxy counted after each step, and after istiod went away.
#[derive(Debug)]
struct Told {
    steps: Vec<Stats>,
    away: Stats,
}

/// The story with `delta` ADS or state of the world, told by the proxy `start` starts (given
/// the mesh root file) with its admin on `admin_port`.
fn story<'n>(
    net: &'n PodNet,
    delta: bool,
    admin_port: u16,
    start: &dyn Fn(&std::path::Path) -> Box<dyn Held + 'n>,
) -> Told {
    let files = remora_e2e::istiod::PodFiles::write(net, TOKEN);
    let plane = ControlPlane::start(&net.peer, net.peer_addr(ISTIOD_PORT), files.ca, TOKEN);
    let (root, _hosts) = (files.root, files.hosts);
    let ads = Arc::clone(plane.ads());
    ads.set(
        type_url::ENDPOINT,
        "e1",
        &[
            endpoints(A, &["10.1.0.1"], 1),
            endpoints(B, &["10.1.0.2"], 1),
        ],
    );
    ads.set(type_url::ROUTE, "r1", &[routes(json!({"prefix": "/"}), A)]);
    ads.set(type_url::CLUSTER, "c1", &[eds_cluster(A), eds_cluster(B)]);
    ads.set(type_url::LISTENER, "l1", &[listener()]);
    let proxy = start(&root);
    let stats = || stat_deltas::stats(net, admin_port, stat);
    let settled = |what: &str, done: &dyn Fn(&Stats) -> bool| -> Stats {
        let deadline = Instant::now() + STEP_TIME;
        loop {
            let s = stats();
            if done(&s) {
                // Give a second look: nothing else of the step is still coming.
                std::thread::sleep(Duration::from_millis(300));
                return stats();
            }
            assert!(Instant::now() < deadline, "{what} (delta {delta}): {s:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut told = Vec::new();
    for step in steps() {
        (step.act)(&ads);
        told.push(settled(step.name, &step.done));
    }
    drop(plane);
    let away = settled("istiod gone", &|s| {
        value(s, &format!("{RDS}update_failure")) >= 1
            && value(s, &format!("cluster.{A}.update_failure")) >= 1
            && value(s, &format!("cluster.{B}.update_failure")) >= 1
    });
    drop(proxy);
    Told { steps: told, away }
}

fn remora_story(net: &PodNet, delta: bool) -> Told {
    let token = net
        .binary()
        .write_file("istio-token", &format!("{TOKEN}\n"));
    story(net, delta, remora_e2e::ADMIN_PORT, &|root| {
        let sidecar = remora_e2e::istiod::injected_sidecar(net)
            .config(&format!(
                "istiod:\n  token_file: {}\n  root_cert_file: {}\n",
                token.display(),
                root.display(),
            ))
            .env("ISTIO_DELTA_XDS", delta.to_string())
            .start_ready();
        Box::new(sidecar)
    })
}

fn envoy_story(net: &PodNet, binary: &std::path::Path, delta: bool) -> Told {
    story(net, delta, remora_e2e::envoy::ADMIN_PORT, &|root| {
        let bootstrap = envoy_bootstrap(net, root, TOKEN, delta).to_string();
        Box::new(Envoy::start_sidecar(
            &net.pod,
            binary,
            net.binary(),
            &bootstrap,
        ))
    })
}

/// The statistics Remora keeps, and Envoy's of the same names.
fn compared(ours: &Stats, envoys: &Stats) -> (Stats, Stats) {
    let theirs = envoys
        .iter()
        .filter(|(n, _)| ours.contains_key(*n))
        .map(|(n, v)| (n.clone(), *v))
        .collect();
    (ours.clone(), theirs)
}

/// The names whose values differ, with Remora's and Envoy's.
fn differences(ours: &Stats, theirs: &Stats) -> Vec<(String, Option<i64>, Option<i64>)> {
    let names: std::collections::BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
    names
        .into_iter()
        .filter(|n| ours.get(*n) != theirs.get(*n))
        .map(|n| (n.clone(), ours.get(n).copied(), theirs.get(n).copied()))
        .collect()
}

fn same_story(delta: bool) {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let envoy = envoy_story(&nets.1, &binary, delta);
    let remora = remora_story(&nets.0, delta);
    for (step, (ours, envoys)) in steps().iter().zip(remora.steps.iter().zip(&envoy.steps)) {
        // (`version`, a hash, is compared when it fits the parser's i64: equal hashes both.)
        for name in ["update_attempt", "update_rejected", "update_success"] {
            for key in [format!("cluster.{A}.{name}"), format!("{RDS}{name}")] {
                assert!(
                    ours.contains_key(&key),
                    "{}: {key} missing: {:?}",
                    step.name,
                    ours.keys()
                        .filter(|n| !n.contains(".upstream_"))
                        .collect::<Vec<_>>(),
                );
            }
        }
        let (ours, theirs) = compared(ours, envoys);
        assert!(
            ours == theirs,
            "{} (delta {delta}): remora, envoy: {:?}",
            step.name,
            differences(&ours, &theirs)
        );
    }
    // Away, every subscription counts each failed stream as an attempt and a failure: how
    // many depends on each proxy's back-off, so what else was counted is compared.
    let (ours, theirs) = compared(&remora.away, &envoy.away);
    let settled = |s: &Stats| -> Stats {
        s.iter()
            .filter(|(n, _)| !n.ends_with("update_failure"))
            .map(|(n, v)| {
                let failures = s
                    .get(&n.replace("update_attempt", "update_failure"))
                    .copied()
                    .unwrap_or(0);
                match n.ends_with("update_attempt") {
                    true => (n.clone(), v - failures),
                    false => (n.clone(), *v),
                }
            })
            .collect()
    };
    let (ours, theirs) = (settled(&ours), settled(&theirs));
    assert!(
        ours == theirs,
        "istiod gone (delta {delta}): remora, envoy: {:?}",
        differences(&ours, &theirs)
    );
}

#[test]
fn per_resource_subscription_stats_are_envoys_in_delta() {
    same_story(true);
}

#[test]
fn per_resource_subscription_stats_are_envoys_in_state_of_the_world() {
    same_story(false);
}
