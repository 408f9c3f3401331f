//! Envoy's cluster membership statistics (`membership_total`, `_healthy`, `_degraded`,
//! `_excluded`, `membership_change`), which mesh alerts read, through Remora and through a real
//! Envoy 1.40 given the same resources and updates: the same values for every cluster.
//!
//! - At start: an EDS cluster of two priorities whose hosts carry each EDS health status
//!   (healthy, draining, degraded, unhealthy, none), a STATIC one with a host in `TIMEOUT`,
//!   istiod's `BlackHoleCluster` (no hosts), and a cluster with outlier detection.
//! - An EDS update that swaps one host of priority 0 and only reweighs priority 1: one
//!   membership change, not two.
//! - Outlier detection ejecting the refusing host: it leaves `membership_healthy`, and the
//!   host set is unchanged.
//! - A cluster no request has used shows Envoy's statistics at zero (`upstream_rq_total`…).

use remora_e2e::backend;
use remora_e2e::envoy_xds::{istio_retry_policy, nets_or_skip, Resources};
use remora_e2e::peer::Server;
use remora_e2e::sidecars::{self, Sidecar, BACKEND_IP};
use remora_e2e::stat_deltas::{self, Stats};
use remora_e2e::xds_resources::{eds_cluster, outbound_http_listeners};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const WEB: &str = "web.test.svc.cluster.local";
const LIVE_PORT: u16 = 8001;
/// Nothing listens here: outlier detection ejects it at its first refused connect.
const DEAD_PORT: u16 = 8009;
/// Hosts of every EDS health status over two priorities; never sent a request.
const MIXED: &str = "outbound|80|mixed|web.test.svc.cluster.local";
/// A STATIC cluster (its own `load_assignment`).
const FIXED: &str = "outbound|80|fixed|web.test.svc.cluster.local";
/// Outlier detection over the refusing host and the live one.
const OD: &str = "outbound|80|od|web.test.svc.cluster.local";

fn host(last: u8, port: u16, health: Option<&str>, weight: u32) -> Value {
    let mut e = json!({"endpoint": {"address": {"socket_address": {
        "address": format!("10.1.0.{last}"), "port_value": port}}}, "load_balancing_weight": weight});
    if let Some(h) = health {
        e["health_status"] = json!(h);
    }
    e
}

/// `MIXED`'s assignment: priority 0 as `zero`, priority 1 one host of `weight`.
fn mixed(zero: Vec<Value>, weight: u32) -> Value {
    json!({"cluster_name": MIXED, "endpoints": [
        {"priority": 0, "lb_endpoints": zero},
        {"priority": 1, "lb_endpoints": [host(54, 80, None, weight)]}]})
}

fn resources() -> Resources {
    let mut od = eds_cluster(OD);
    od["lb_policy"] = json!("ROUND_ROBIN");
    od["outlier_detection"] = json!({"consecutive_5xx": 1, "enforcing_consecutive_5xx": 100,
        "interval": "1s", "base_ejection_time": "30s", "max_ejection_percent": 100,
        "enforcing_success_rate": 0});
    od["common_lb_config"] = json!({"healthy_panic_threshold": {}});
    let fixed = json!({"name": FIXED, "type": "STATIC", "connect_timeout": "2s",
        "load_assignment": {"cluster_name": FIXED, "endpoints": [{"lb_endpoints": [
            host(60, 80, None, 1), host(61, 80, Some("TIMEOUT"), 1)]}]}});
    let route = json!({"match": {"prefix": "/"},
        "route": {"cluster": OD, "timeout": "0s", "retry_policy": istio_retry_policy()}});
    let live = |port: u16| {
        json!({"endpoint": {"address": {"socket_address": {
            "address": BACKEND_IP.to_string(), "port_value": port}}}})
    };
    Resources {
        listeners: Value::Array(outbound_http_listeners(None)),
        clusters: json!([eds_cluster(MIXED), fixed, od,
            {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]),
        routes: json!([{"name": "80", "virtual_hosts": [{"name": "web.test.svc.cluster.local:80",
            "domains": [WEB, VIP.to_string()], "routes": [route]}]}]),
        endpoints: json!([
            mixed(vec![host(50, 80, Some("HEALTHY"), 1), host(51, 80, Some("DRAINING"), 1),
                       host(52, 80, Some("DEGRADED"), 1), host(53, 80, Some("UNHEALTHY"), 1)], 1),
            {"cluster_name": OD, "endpoints": [{"lb_endpoints": [live(DEAD_PORT), live(LIVE_PORT)]}]}
        ]),
    }
}

/// The same resources after an EDS update: `10.1.0.53` replaced by `10.1.0.55` at priority 0,
/// the priority-1 host only reweighed.
fn updated() -> Resources {
    let mut r = resources();
    r.endpoints[0] = mixed(
        vec![
            host(50, 80, Some("HEALTHY"), 1),
            host(51, 80, Some("DRAINING"), 1),
            host(52, 80, Some("DEGRADED"), 1),
            host(55, 80, None, 1),
        ],
        7,
    );
    r
}

/// A pod whose sidecar is Remora or Envoy, where its resources are read from, and the live
/// backend.
struct World<'n> {
    net: &'n PodNet,
    proxy: Sidecar<'n>,
    dir: PathBuf,
    _live: Server,
}

impl World<'_> {
    /// Every cluster's membership statistics, ORIGINAL_DST clusters' aside (none here).
    fn membership(&self) -> Stats {
        stat_deltas::stats(self.net, self.proxy.admin_port(), |name| {
            name.starts_with("cluster.outbound|") || name.starts_with("cluster.BlackHole")
        })
        .into_iter()
        .filter(|(name, _)| name.contains(".membership_"))
        .collect()
    }

    /// Put the updated assignments in force and wait until `MIXED`'s change shows.
    fn update(&self) {
        match &self.proxy {
            Sidecar::Remora(_) => updated().write_for_remora(&self.dir),
            Sidecar::Envoy(_) => updated().write_envoy_endpoints(&self.dir, "2"),
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while sidecars::cluster_stat(self.net, &self.proxy, MIXED, "membership_change") < 3
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Requests until outlier detection has the refusing host out (each answered by the live
    /// one, Istio's retry policy taking the failed attempt on).
    fn eject(&self) -> Vec<(u16, Option<String>)> {
        let vip = SocketAddr::from((VIP, 80));
        let mut answers = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while sidecars::cluster_stat(
            self.net,
            &self.proxy,
            OD,
            "outlier_detection.ejections_active",
        ) == 0
            && Instant::now() < deadline
        {
            answers.push(sidecars::answer(self.net, &self.proxy, vip, WEB, "/", &[]));
            std::thread::sleep(Duration::from_millis(100));
        }
        answers
    }
}

fn world<'n>(net: &'n PodNet, envoy: Option<&std::path::Path>) -> World<'n> {
    sidecars::prepare(net);
    let live = backend::start(
        &net.peer,
        SocketAddrV4::new(BACKEND_IP, LIVE_PORT).into(),
        "live",
    );
    let (proxy, dir) = match envoy {
        None => {
            let (remora, dir) = resources().start_remora_with(net, "");
            (Sidecar::Remora(remora), dir)
        }
        Some(binary) => {
            let (envoy, dir) = resources().start_envoy_lds(net, binary, &[]);
            (Sidecar::Envoy(envoy), dir)
        }
    };
    World {
        net,
        proxy,
        dir,
        _live: live,
    }
}

/// What one world showed at each step.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    at_start: Stats,
    after_update: Stats,
    after_ejection: Stats,
}

fn run(w: &World) -> Seen {
    let at_start = w.membership();
    w.update();
    let after_update = w.membership();
    let answers = w.eject();
    assert!(
        !answers.is_empty() && answers.iter().all(|a| *a == (200, Some("live".into()))),
        "{}: {answers:?}\n{}",
        w.proxy.name(),
        w.proxy.output()
    );
    Seen {
        at_start,
        after_update,
        after_ejection: w.membership(),
    }
}

#[test]
fn cluster_membership_is_counted_as_envoy_counts_it() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = (world(&nets.0, None), world(&nets.1, Some(&binary)));
    let expected = run(&envoy);
    let got = run(&remora);
    // Envoy's own values, so that a wrong oracle set-up shows here and not as a mismatch.
    let mixed = |s: &Stats, stat: &str| s.get(&format!("cluster.{MIXED}.{stat}")).copied();
    assert_eq!(mixed(&expected.at_start, "membership_total"), Some(5));
    assert_eq!(mixed(&expected.at_start, "membership_change"), Some(2));
    assert_eq!(mixed(&expected.after_update, "membership_change"), Some(3));
    let od_healthy = |s: &Stats| s.get(&format!("cluster.{OD}.membership_healthy")).copied();
    assert_eq!(
        (
            od_healthy(&expected.after_update),
            od_healthy(&expected.after_ejection)
        ),
        (Some(2), Some(1))
    );
    assert_eq!(
        got,
        expected,
        "remora:\n{}",
        sidecars::admin(remora.net, &remora.proxy, "/clusters")
    );
    // A cluster no request used has Envoy's statistics at zero, not none.
    let unused = |w: &World| {
        stat_deltas::stats(w.net, w.proxy.admin_port(), |name| {
            name.starts_with(&format!("cluster.{MIXED}.upstream_"))
        })
    };
    let (ours, envoys) = (unused(&remora), unused(&envoy));
    for name in [
        "upstream_rq_total",
        "upstream_cx_total",
        "upstream_rq_pending_overflow",
    ] {
        let full = format!("cluster.{MIXED}.{name}");
        assert_eq!(ours.get(&full), Some(&0), "remora: {ours:?}");
        assert_eq!(envoys.get(&full), Some(&0), "envoy: {envoys:?}");
    }
    let extra: Vec<&String> = ours.keys().filter(|n| !envoys.contains_key(*n)).collect();
    assert!(extra.is_empty(), "names Envoy does not have: {extra:?}");
}
