//! Istio's locality load-balancing tasks, as the xDS resources istiod writes for them, through
//! Remora behind `remora capture` and through a real Envoy 1.40 given the same resources: the
//! same backends serve, in the same proportions (within the tolerance stated at each check),
//! with the same statuses and ejection counts.
//!
//! The client runs in `region1/zone1/subzone1`. The service has backends in four localities:
//! two in the client's own (`r1z1-a`, `r1z1-b`), one in `region1/zone2`, one in
//! `region2/zone3`, one in `region3/zone4`.
//!
//! - Locality failover (`localityLbSetting.failover: [{from: region1, to: region3}]` with
//!   `outlierDetection: {consecutive5xxErrors: 1, interval: 1s, baseEjectionTime: 20s}`):
//!   istiod gives each locality a priority by how much of it matches the client's
//!   (`pilot/pkg/networking/core/loadbalancer/loadbalancer.go`): the client's own locality 0,
//!   same region 1, the failover region 2, the other region last. Traffic stays local; when
//!   one local backend answers 500 it is ejected and priority 0, half healthy, keeps
//!   140 × 1/2 = 70 % of the traffic and spills the rest to `region1/zone2`; when the other is
//!   killed, everything fails over there; when both return, traffic comes back.
//! - Locality-weighted distribution (`distribute: [{from: region1/zone1/*, to:
//!   {region1/zone1/*: 80, region1/zone2/*: 20}}]`, `locality_weighted_lb_config`): 80 % of
//!   400 requests to the client's zone (70–90 %), the rest to zone2.
//! - Priorities by EDS health with Envoy's default panic threshold: the overprovisioned spill
//!   (1 of 3 healthy keeps 46 %) and total panic (split by host count), with Envoy's
//!   `lb_healthy_panic` count; a DEGRADED host taking the 30 % its healthy peer cannot;
//!   `retryRemoteLocalities` (Envoy's `previous_priorities`) sending the third attempt past a
//!   failing local host to the next priority.

use remora_e2e::envoy_xds::{istio_retry_policy, nets_or_skip, Resources, ISTIO_TEXT_FORMAT};
use remora_e2e::sidecars::{self, Sidecar, Tally, BACKEND_IP};
use remora_e2e::switchable::Backend;
use remora_e2e::xds_resources::{eds_cluster, outbound_http_listeners};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::time::{Duration, Instant};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const WEB: &str = "helloworld.sample.svc.cluster.local";
/// The DestinationRule with `failover` and outlier detection.
const FAILOVER: &str = "outbound|80|failover|helloworld.sample.svc.cluster.local";
/// The DestinationRule with `distribute`.
const DISTRIBUTE: &str = "outbound|80|distribute|helloworld.sample.svc.cluster.local";
/// Health from EDS, Envoy's default panic threshold: priority 0 with 1 of 3 healthy.
const SPILL: &str = "outbound|80|spill|helloworld.sample.svc.cluster.local";
/// As `SPILL`, with nothing healthy at priority 1: every priority in panic.
const PANIC: &str = "outbound|80|panic|helloworld.sample.svc.cluster.local";
/// One healthy host and one DEGRADED.
const DEGRADED: &str = "outbound|80|degraded|helloworld.sample.svc.cluster.local";
/// A failing local host at priority 0, a good one at priority 1, behind a route whose retries
/// go to remote localities.
const REMOTE: &str = "outbound|80|remote|helloworld.sample.svc.cluster.local";
/// How long an ejected backend stays out: long enough for the spill and failover checks to
/// run while it is, short enough to wait for its return.
const EJECTION: Duration = Duration::from_secs(20);

/// The backends: name, port, (region, zone, sub_zone).
const BACKENDS: [(&str, u16, (&str, &str, &str)); 6] = [
    ("r1z1-a", 8001, ("region1", "zone1", "subzone1")),
    // Answers every request 500 (for the retries to remote localities).
    ("r1z1-c", 8006, ("region1", "zone1", "subzone1")),
    ("r1z1-b", 8002, ("region1", "zone1", "subzone1")),
    ("r1z2", 8003, ("region1", "zone2", "subzone1")),
    ("r2z3", 8004, ("region2", "zone3", "subzone1")),
    ("r3z4", 8005, ("region3", "zone4", "subzone1")),
];

fn backend_addr(port: u16) -> SocketAddr {
    SocketAddrV4::new(BACKEND_IP, port).into()
}

/// One locality's entry as istiod writes it: the locality, its hosts (each of weight 1), their
/// summed weight as the locality's, and its priority.
fn locality_entry(names: &[&str], priority: u32, weight: u32) -> Value {
    let (_, _, (region, zone, sub_zone)) = BACKENDS
        .iter()
        .find(|b| b.0 == names[0])
        .copied()
        .expect("a backend");
    let hosts: Vec<Value> = names
        .iter()
        .map(|n| {
            let port = BACKENDS.iter().find(|b| b.0 == *n).expect("a backend").1;
            json!({"endpoint": {"address": {"socket_address": {
                    "address": BACKEND_IP.to_string(), "port_value": port}}},
                   "health_status": "HEALTHY", "load_balancing_weight": 1,
                   "metadata": {"filter_metadata": {"istio": {
                       "workload": format!("helloworld-{n};sample;helloworld;{n};Kubernetes")}}}})
        })
        .collect();
    json!({"locality": {"region": region, "zone": zone, "sub_zone": sub_zone},
           "lb_endpoints": hosts, "load_balancing_weight": weight, "priority": priority})
}

/// A locality entry whose hosts EDS reports with these health statuses.
fn with_health(mut entry: Value, health: &[&str]) -> Value {
    if let Some(hosts) = entry["lb_endpoints"].as_array_mut() {
        for (h, status) in hosts.iter_mut().zip(health) {
            h["health_status"] = json!(status);
        }
    }
    entry
}

fn resources() -> Resources {
    let outlier = json!({"consecutive_5xx": 1, "enforcing_consecutive_5xx": 100,
        "interval": "1s", "base_ejection_time": format!("{}s", EJECTION.as_secs()),
        "max_ejection_percent": 100, "enforcing_success_rate": 0});
    let limits = json!({"thresholds": [{"max_connections": 4294967295u32,
        "max_pending_requests": 4294967295u32, "max_requests": 4294967295u32,
        "max_retries": 4294967295u32, "track_remaining": true}]});
    let mut failover = eds_cluster(FAILOVER);
    failover["circuit_breakers"] = limits.clone();
    failover["outlier_detection"] = outlier;
    // istiod's `minHealthPercent` 0 with outlier detection: no panic.
    failover["common_lb_config"] = json!({"healthy_panic_threshold": {}});
    let mut distribute = eds_cluster(DISTRIBUTE);
    distribute["circuit_breakers"] = limits;
    distribute["common_lb_config"] = json!({"locality_weighted_lb_config": {}});
    let access_log = json!([{"name": "envoy.access_loggers.file", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
        "path": "/dev/stdout",
        "log_format": {"text_format_source": {"inline_string": ISTIO_TEXT_FORMAT}}}}]);
    let route = |prefix: &str, cluster: &str| {
        json!({"match": {"prefix": prefix},
               "route": {"cluster": cluster, "timeout": "0s", "retry_policy": istio_retry_policy()}})
    };
    // A VirtualService's `retries: {attempts: 2, retryOn: 5xx, retryRemoteLocalities: true}`.
    let mut remote_retries = istio_retry_policy();
    remote_retries["retry_on"] = json!("5xx");
    remote_retries["retry_priority"] = json!({"name": "envoy.retry_priorities.previous_priorities",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
            "update_frequency": 2}});
    let remote_route = json!({"match": {"prefix": "/remote"},
        "route": {"cluster": REMOTE, "timeout": "0s", "retry_policy": remote_retries}});
    Resources {
        listeners: Value::Array(outbound_http_listeners(Some(access_log))),
        clusters: json!([failover, distribute, eds_cluster(SPILL), eds_cluster(PANIC), eds_cluster(DEGRADED), eds_cluster(REMOTE),
            {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]),
        routes: json!([{"name": "80", "virtual_hosts": [
            {"name": "helloworld.sample.svc.cluster.local:80",
             "domains": [WEB, "helloworld.sample", VIP.to_string()],
             "routes": [route("/distribute", DISTRIBUTE), route("/spill", SPILL),
                        route("/panic", PANIC), route("/degraded", DEGRADED), remote_route,
                        route("/", FAILOVER)]}]}]),
        endpoints: json!([
            // failover from region1 to region3: region1/zone1 0, region1 1, region3 2, the rest 3.
            {"cluster_name": FAILOVER, "endpoints": [
                locality_entry(&["r1z1-a", "r1z1-b"], 0, 2),
                locality_entry(&["r1z2"], 1, 1),
                locality_entry(&["r2z3"], 3, 1),
                locality_entry(&["r3z4"], 2, 1)]},
            // distribute: the weights scaled to 80 and 20 (istiod's ceil(2 × 80 / 2) and
            // ceil(1 × 20 / 1)); the localities it names no weight for lose their hosts.
            {"cluster_name": SPILL, "endpoints": [
                with_health(locality_entry(&["r1z1-a", "r1z1-b", "r1z2"], 0, 3), &["HEALTHY", "UNHEALTHY", "UNHEALTHY"]),
                with_health(locality_entry(&["r3z4"], 1, 1), &["HEALTHY"])]},
            {"cluster_name": PANIC, "endpoints": [
                with_health(locality_entry(&["r1z1-a", "r1z1-b", "r1z2"], 0, 3), &["HEALTHY", "UNHEALTHY", "UNHEALTHY"]),
                with_health(locality_entry(&["r3z4"], 1, 1), &["UNHEALTHY"])]},
            {"cluster_name": REMOTE, "endpoints": [
                locality_entry(&["r1z1-c"], 0, 1), locality_entry(&["r1z2"], 1, 1)]},
            {"cluster_name": DEGRADED, "endpoints": [
                with_health(locality_entry(&["r1z1-a", "r1z1-b"], 0, 2), &["HEALTHY", "DEGRADED"])]},
            {"cluster_name": DISTRIBUTE, "endpoints": [
                locality_entry(&["r1z1-a", "r1z1-b"], 0, 80),
                locality_entry(&["r1z2"], 0, 20),
                {"locality": {"region": "region2", "zone": "zone3", "sub_zone": "subzone1"},
                 "load_balancing_weight": 1},
                {"locality": {"region": "region3", "zone": "zone4", "sub_zone": "subzone1"},
                 "load_balancing_weight": 1}]}
        ]),
    }
}

/// A pod whose sidecar is Remora or Envoy, the backends in its peer namespace.
struct World<'n> {
    net: &'n PodNet,
    proxy: Sidecar<'n>,
    backends: Vec<Backend>,
}

fn prepare(net: &PodNet) -> Vec<Backend> {
    sidecars::prepare(net);
    BACKENDS
        .iter()
        .map(|(name, port, _)| {
            let b = Backend::start(&net.peer, name, backend_addr(*port));
            if *name == "r1z1-c" {
                b.fail();
            }
            b
        })
        .collect()
}

fn remora_world(net: &PodNet) -> World<'_> {
    let backends = prepare(net);
    World {
        net,
        proxy: Sidecar::Remora(resources().start_remora(net)),
        backends,
    }
}

fn envoy_world<'n>(net: &'n PodNet, binary: &Path) -> World<'n> {
    let backends = prepare(net);
    World {
        net,
        proxy: Sidecar::Envoy(resources().start_envoy(net, binary)),
        backends,
    }
}

impl World<'_> {
    fn backend(&mut self, name: &str) -> &mut Backend {
        self.backends
            .iter_mut()
            .find(|b| b.name == name)
            .expect("a backend")
    }

    /// One request; its status and the backend that answered.
    fn get(&self, path: &str) -> (u16, Option<String>) {
        let vip = SocketAddr::from((VIP, 80));
        sidecars::answer(self.net, &self.proxy, vip, WEB, path, &[])
    }

    fn tally(&self, path: &str, requests: usize) -> Tally {
        sidecars::tally(requests, || self.get(path))
    }

    /// Requests until one is answered `status`, at most `limit`; how many it took.
    fn until(&self, path: &str, status: u16, limit: usize) -> Option<usize> {
        (1..=limit).find(|_| {
            let got = self.get(path);
            std::thread::sleep(Duration::from_millis(50));
            got.0 == status
        })
    }

    /// A counter or gauge of `cluster` from `/stats` (0 when absent).
    fn stat(&self, cluster: &str, name: &str) -> u64 {
        sidecars::cluster_stat(self.net, &self.proxy, cluster, name)
    }
}

/// How many requests of a tally a backend answered 200.
fn served(t: &Tally, backend: &str) -> usize {
    t.get(&(200, backend.to_string())).copied().unwrap_or(0)
}

fn total(t: &Tally) -> usize {
    t.values().sum()
}

/// What one world made of the failover task.
#[derive(Debug)]
struct Failover {
    /// All healthy: 100 requests.
    local: Tally,
    /// How many requests it took to see the first 500 of the failing backend.
    first_500_after: Option<usize>,
    /// One local backend ejected: 400 requests.
    spilling: Tally,
    /// Both local backends out: 100 requests.
    failed_over: Tally,
    /// Both back: 100 requests.
    returned: Tally,
    ejections: u64,
    active_at_end: u64,
}

fn failover(w: &mut World) -> Failover {
    let local = w.tally("/", 100);
    // r1z1-a goes bad: the first 500 it answers ejects it (consecutive5xxErrors 1; Istio's
    // policy does not retry a 500).
    w.backend("r1z1-a").fail();
    let first_500_after = w.until("/", 500, 40);
    // Envoy ejects on its main thread and tells its workers a moment after.
    std::thread::sleep(Duration::from_millis(300));
    let spilling = w.tally("/", 400);
    // r1z1-b dies: its first refused connection ejects it, the request retried elsewhere.
    w.backend("r1z1-b").kill();
    std::thread::sleep(Duration::from_millis(300));
    let deadline = Instant::now() + Duration::from_secs(5);
    while w.stat(FAILOVER, "outlier_detection.ejections_active") < 2 && Instant::now() < deadline {
        w.get("/");
        std::thread::sleep(Duration::from_millis(50));
    }
    let killed_at = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    let failed_over = w.tally("/", 100);
    // Both come back healthy; once their ejection time is over traffic returns.
    let ns = &w.net.peer;
    for name in ["r1z1-a", "r1z1-b"] {
        let b = w
            .backends
            .iter_mut()
            .find(|b| b.name == name)
            .expect("a backend");
        b.revive(ns);
    }
    let back = killed_at + EJECTION + Duration::from_secs(2);
    std::thread::sleep(back.saturating_duration_since(Instant::now()));
    let returned = w.tally("/", 100);
    Failover {
        local,
        first_500_after,
        spilling,
        failed_over,
        returned,
        ejections: w.stat(FAILOVER, "outlier_detection.ejections_enforced_total"),
        active_at_end: w.stat(FAILOVER, "outlier_detection.ejections_active"),
    }
}

/// The outcome Istio's task describes, which Envoy must show too (so that a broken test world
/// is not taken for agreement).
fn check_failover(name: &str, f: &Failover, logs: &str) {
    eprintln!("{name}: {f:?}");
    let local = served(&f.local, "r1z1-a") + served(&f.local, "r1z1-b");
    assert_eq!(local, 100, "{name}: all local while healthy: {f:?}\n{logs}");
    // Balanced between the two (least request over sequential requests): 30–70 each.
    let a = served(&f.local, "r1z1-a");
    assert!((30..=70).contains(&a), "{name}: {f:?}\n{logs}");
    assert!(f.first_500_after.is_some(), "{name}: {f:?}\n{logs}");
    // Priority 0 at 1 of 2 healthy keeps 70 % (tolerance 60–80 % of 400), the rest goes to
    // priority 1 (region1/zone2); nothing to the failing one, nothing further away.
    let kept = served(&f.spilling, "r1z1-b");
    let spilled = served(&f.spilling, "r1z2");
    assert!((240..=320).contains(&kept), "{name}: spill: {f:?}\n{logs}");
    assert_eq!(kept + spilled, 400, "{name}: spill: {f:?}\n{logs}");
    // Both local ones out: all to region1/zone2.
    let zone2 = served(&f.failed_over, "r1z2");
    assert_eq!(zone2, 100, "{name}: failover: {f:?}\n{logs}");
    // Back: all local again, both serving.
    let (a, b) = (served(&f.returned, "r1z1-a"), served(&f.returned, "r1z1-b"));
    assert!(a >= 30 && b >= 30, "{name}: return: {f:?}\n{logs}");
    assert_eq!(a + b, 100, "{name}: return: {f:?}\n{logs}");
    assert_eq!((f.ejections, f.active_at_end), (2, 0), "{name}: {f:?}");
}

#[test]
fn locality_failover_has_envoys_outcome() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (mut remora, mut envoy) = (remora_world(&nets.0), envoy_world(&nets.1, &binary));
    // Both worlds at once (each its own pods and backends): their ejection times overlap.
    let (expected, got) = std::thread::scope(|s| {
        let e = s.spawn(|| failover(&mut envoy));
        let r = s.spawn(|| failover(&mut remora));
        (
            e.join().expect("envoy's run"),
            r.join().expect("remora's run"),
        )
    });
    let not_ok = |w: &World| {
        w.proxy
            .output()
            .lines()
            .filter(|l| l.contains("\"GET ") && !l.contains("\" 200 "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let logs = format!("envoy:\n{}\nremora:\n{}", not_ok(&envoy), not_ok(&remora));
    check_failover("envoy", &expected, &logs);
    check_failover("remora", &got, &logs);
    // Every status either proxy answered, the same (only 200s and the one 500 per world).
    let statuses = |f: &Failover| {
        [&f.local, &f.spilling, &f.failed_over, &f.returned]
            .iter()
            .flat_map(|t| t.keys().map(|k| k.0))
            .collect::<std::collections::BTreeSet<u16>>()
    };
    assert_eq!(
        statuses(&got),
        statuses(&expected),
        "remora {got:?}\nenvoy {expected:?}"
    );
}

#[test]
fn locality_weighted_distribution_has_envoys_outcome() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = (remora_world(&nets.0), envoy_world(&nets.1, &binary));
    for w in [&envoy, &remora] {
        let t = w.tally("/distribute", 400);
        let zone1 = served(&t, "r1z1-a") + served(&t, "r1z1-b");
        let zone2 = served(&t, "r1z2");
        eprintln!("{}: zone1 {zone1}, zone2 {zone2}", w.proxy.name());
        // 80 % of 400 to the client's zone, tolerance 70–90 % (280–360); nothing to the
        // localities `distribute` left out.
        assert!(
            (280..=360).contains(&zone1),
            "{}: {t:?}\n{}",
            w.proxy.name(),
            w.proxy.output()
        );
        assert_eq!(zone1 + zone2, total(&t), "{}: {t:?}", w.proxy.name());
    }
}

/// Per backend, how many of `n` requests to `path` it answered 200; and the cluster's
/// `lb_healthy_panic` after.
fn spread(w: &World, path: &str, cluster: &str, n: usize) -> (BTreeMap<String, usize>, u64) {
    let t = w.tally(path, n);
    let mut by_backend = BTreeMap::new();
    for ((status, backend), count) in &t {
        assert_eq!(*status, 200, "{}: {t:?}", w.proxy.name());
        by_backend.insert(backend.clone(), *count);
    }
    (by_backend, w.stat(cluster, "lb_healthy_panic"))
}

/// Priorities by EDS health, as Envoy computes their load:
/// - 1 of 3 healthy at priority 0 is 140 × 1 / 3 = 46 % of the traffic; priority 1, all
///   healthy, takes the other 54 %. No panic: the availability adds up to 100.
/// - With priority 1's only host unhealthy too, the availability is 46 %, both priorities are
///   under the 50 % panic threshold: total panic, the traffic split by host count (3 : 1), each
///   over all its hosts, healthy or not: 25 % to each of the four.
/// - One healthy and one DEGRADED: 70 % and 30 %.
#[test]
fn priorities_by_health_and_remote_retries_have_envoys_outcome() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = (remora_world(&nets.0), envoy_world(&nets.1, &binary));
    const N: usize = 400;
    for w in [&envoy, &remora] {
        let (spill, panics) = spread(w, "/spill", SPILL, N);
        eprintln!("{}: spill {spill:?}", w.proxy.name());
        let local = spill.get("r1z1-a").copied().unwrap_or(0);
        // 46 % of 400 is 184; tolerance 34–58 % (136–232).
        assert!(
            (136..=232).contains(&local),
            "{}: {spill:?}",
            w.proxy.name()
        );
        assert_eq!(
            local + spill.get("r3z4").copied().unwrap_or(0),
            N,
            "{}: {spill:?}",
            w.proxy.name()
        );
        assert_eq!(panics, 0, "{}", w.proxy.name());
        let (panic, panics) = spread(w, "/panic", PANIC, N);
        eprintln!(
            "{}: panic {panic:?}, lb_healthy_panic {panics}",
            w.proxy.name()
        );
        // 25 % of 400 is 100 each; tolerance 15–35 % (60–140).
        for b in ["r1z1-a", "r1z1-b", "r1z2", "r3z4"] {
            let n = panic.get(b).copied().unwrap_or(0);
            assert!(
                (60..=140).contains(&n),
                "{}: {b}: {panic:?}",
                w.proxy.name()
            );
        }
        assert_eq!(panics, N as u64, "{}: every pick in panic", w.proxy.name());
        // A DEGRADED host takes what the healthy ones cannot: 1 of 2 healthy carries
        // 140 × 1 / 2 = 70 % (tolerance 60–80 %, 240–320), the degraded one the other 30 %.
        let (degraded, _) = spread(w, "/degraded", DEGRADED, N);
        eprintln!("{}: degraded {degraded:?}", w.proxy.name());
        let healthy = degraded.get("r1z1-a").copied().unwrap_or(0);
        assert!(
            (240..=320).contains(&healthy),
            "{}: {degraded:?}",
            w.proxy.name()
        );
        assert_eq!(healthy + degraded.get("r1z1-b").copied().unwrap_or(0), N);
    }
    // Retries to remote localities (update frequency 2): the first two attempts go to the
    // failing local host (500, retried on 5xx), the third leaves priority 0 out and reaches
    // region1/zone2. Two retries per request.
    let mut outcomes = Vec::new();
    for w in [&envoy, &remora] {
        let answers: Vec<(u16, Option<String>)> = (0..20).map(|_| w.get("/remote")).collect();
        let retries = w.stat(REMOTE, "upstream_rq_retry");
        eprintln!(
            "{}: remote retries {retries}, {:?}",
            w.proxy.name(),
            answers[0]
        );
        assert!(
            answers
                .iter()
                .all(|a| *a == (200, Some("r1z2".to_string()))),
            "{}: {answers:?}\n{}",
            w.proxy.name(),
            w.proxy.output()
        );
        outcomes.push(retries);
    }
    assert_eq!(outcomes, [40, 40], "retries (envoy, remora)");
}
