//! Istio's circuit-breaking and outlier-detection tasks, as the xDS resources istiod writes for
//! their DestinationRules, through Remora behind `remora capture` and through a real Envoy 1.40
//! given the same resources: the same statuses, response flags, chosen backends and counts of
//! overflows, retries and ejections.
//!
//! - Circuit breaking (`connectionPool.tcp.maxConnections: 1`,
//!   `http.http1MaxPendingRequests: 1`): four requests to a slow backend, each started while the
//!   earlier ones are in flight. One holds the connection, one waits for it as a pending
//!   request, two are answered 503 `UO` at once and never reach the backend.
//! - Outlier detection (`consecutive5xxErrors: 1`, `interval: 1s`, `baseEjectionTime: 2s`,
//!   `maxEjectionPercent: 100`): a cluster of a refusing endpoint and a live one. The first
//!   connect failure ejects the refusing one (Istio's retry policy sends that request on to the
//!   live one); it stays out, comes back after its ejection time and is ejected again.

use remora_e2e::backend;
use remora_e2e::envoy_xds::{istio_retry_policy, nets_or_skip, Resources, ISTIO_TEXT_FORMAT};
use remora_e2e::peer::{self, Server};
use remora_e2e::sidecars::{self, Sidecar, BACKEND_IP};
use remora_e2e::xds_resources::{eds_cluster, outbound_http_listeners, tcp_listener};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::time::{Duration, Instant};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const LIVE_PORT: u16 = 8001;
/// Nothing listens here: an endpoint whose every connect is refused.
const DEAD_PORT: u16 = 8009;
const WEB: &str = "web.test.svc.cluster.local";
/// DestinationRule with a connection pool: one connection, one pending request.
const CB: &str = "outbound|80|cb|web.test.svc.cluster.local";
/// DestinationRule with outlier detection, over the refusing endpoint and the live one.
const OD: &str = "outbound|80|od|web.test.svc.cluster.local";
/// A TCP service whose DestinationRule allows one connection.
const TCP_CB: &str = "outbound|9000||echo.test.svc.cluster.local";
/// Outlier detection on 5xx answers (`consecutive5xxErrors: 2`), over the live endpoint and
/// one that answers every request 500.
const OD5: &str = "outbound|80|od5|web.test.svc.cluster.local";
const FAILING_PORT: u16 = 8002;
/// A cluster whose only endpoint refuses every connection: each request ends 503 `URX,UF`.
const DEAD: &str = "outbound|80|dead|web.test.svc.cluster.local";
const TCP_VIP: &str = "10.96.0.20:9000";
const ECHO_PORT: u16 = 9000;

fn backend_addr(port: u16) -> SocketAddr {
    SocketAddrV4::new(BACKEND_IP, port).into()
}

/// The clusters as istiod writes them for the two DestinationRules.
fn clusters() -> Value {
    let mut cb = eds_cluster(CB);
    cb["circuit_breakers"] = json!({"thresholds": [{"max_connections": 1,
        "max_pending_requests": 1, "max_requests": 4294967295u32,
        "max_retries": 4294967295u32, "track_remaining": true}]});
    let mut od = eds_cluster(OD);
    od["lb_policy"] = json!("ROUND_ROBIN");
    od["circuit_breakers"] = json!({"thresholds": [{"max_connections": 4294967295u32,
        "max_pending_requests": 4294967295u32, "max_requests": 4294967295u32,
        "max_retries": 4294967295u32, "track_remaining": true}]});
    od["outlier_detection"] = json!({"consecutive_5xx": 1, "enforcing_consecutive_5xx": 100,
        "interval": "1s", "base_ejection_time": "2s", "max_ejection_percent": 100,
        "enforcing_success_rate": 0});
    // istiod's `minHealthPercent` 0: never route to ejected hosts in panic.
    od["common_lb_config"] = json!({"healthy_panic_threshold": {}});
    let mut tcp = eds_cluster(TCP_CB);
    tcp["circuit_breakers"] = json!({"thresholds": [{"max_connections": 1,
        "max_pending_requests": 4294967295u32, "max_requests": 4294967295u32,
        "max_retries": 4294967295u32, "track_remaining": true}]});
    let mut od5 = od.clone();
    od5["name"] = json!(OD5);
    od5["eds_cluster_config"]["service_name"] = json!(OD5);
    od5["outlier_detection"]["consecutive_5xx"] = json!(2);
    let dead = eds_cluster(DEAD);
    json!([cb, od, od5, tcp, dead, {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}])
}

fn resources() -> Resources {
    let endpoint = |port: u16| {
        json!({"endpoint": {"address": {"socket_address": {
            "address": BACKEND_IP.to_string(), "port_value": port}}}, "health_status": "HEALTHY"})
    };
    let access_log = json!([{"name": "envoy.access_loggers.file", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
        "path": "/dev/stdout",
        "log_format": {"text_format_source": {"inline_string": ISTIO_TEXT_FORMAT}}}}]);
    let route = |prefix: &str, cluster: &str| {
        json!({"match": {"prefix": prefix},
               "route": {"cluster": cluster, "timeout": "0s", "retry_policy": istio_retry_policy()}})
    };
    let mut listeners = outbound_http_listeners(Some(access_log));
    listeners.push(tcp_listener(TCP_VIP.parse().expect("addr"), TCP_CB));
    Resources {
        listeners: Value::Array(listeners),
        clusters: clusters(),
        routes: json!([{"name": "80", "virtual_hosts": [
            {"name": "web.test.svc.cluster.local:80", "domains": [WEB, "web", VIP.to_string()],
             "routes": [route("/slow", CB), route("/od5", OD5), route("/od", OD),
                        route("/dead", DEAD)]}]}]),
        endpoints: json!([
            {"cluster_name": CB, "endpoints": [{"lb_endpoints": [endpoint(LIVE_PORT)]}]},
            {"cluster_name": OD, "endpoints": [{"lb_endpoints": [endpoint(DEAD_PORT), endpoint(LIVE_PORT)]}]},
            {"cluster_name": OD5, "endpoints": [{"lb_endpoints": [endpoint(LIVE_PORT), endpoint(FAILING_PORT)]}]},
            {"cluster_name": TCP_CB, "endpoints": [{"lb_endpoints": [endpoint(ECHO_PORT)]}]},
            {"cluster_name": DEAD, "endpoints": [{"lb_endpoints": [endpoint(DEAD_PORT)]}]}
        ]),
    }
}

/// A pod whose sidecar is Remora or Envoy, the backend in its peer namespace.
struct World<'n> {
    net: &'n PodNet,
    proxy: Sidecar<'n>,
    _backends: (Server, Server, Server),
}

fn prepare(net: &PodNet) -> (Server, Server, Server) {
    sidecars::prepare(net);
    (
        backend::start(&net.peer, backend_addr(LIVE_PORT), "live"),
        Server::echo(&net.peer, backend_addr(ECHO_PORT)),
        backend::start(&net.peer, backend_addr(FAILING_PORT), "failing"),
    )
}

impl World<'_> {
    /// One request; its status and the backend that answered.
    fn get(&self, path: &str) -> (u16, Option<String>) {
        let vip = SocketAddr::from((VIP, 80));
        sidecars::answer(self.net, &self.proxy, vip, WEB, path, &[])
    }

    /// The admin page at `path`.
    fn admin(&self, path: &str) -> String {
        sidecars::admin(self.net, &self.proxy, path)
    }

    /// A counter or gauge of `cluster` from `/stats` (0 when absent).
    fn stat(&self, cluster: &str, name: &str) -> u64 {
        sidecars::cluster_stat(self.net, &self.proxy, cluster, name)
    }

    /// The `health_flags` `/clusters` shows for `host` of `cluster`.
    fn health_flags(&self, cluster: &str, host: SocketAddr) -> String {
        let key = format!("{cluster}::{host}::health_flags::");
        self.admin("/clusters")
            .lines()
            .find_map(|l| l.strip_prefix(&key).map(str::to_string))
            .unwrap_or_else(|| format!("(no {key})"))
    }

    /// How many access-log lines carry `flags` after status `status`, waiting a little for
    /// Envoy's log flush.
    fn logged(&self, status: u16, flags: &str, at_least: usize) -> usize {
        let needle = format!("\" {status} {flags} ");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let n = self.proxy.output().matches(&needle).count();
            if n >= at_least || Instant::now() > deadline {
                return n;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn remora_world(net: &PodNet) -> World<'_> {
    let backend = prepare(net);
    let remora = resources().start_remora(net);
    World {
        net,
        proxy: Sidecar::Remora(remora),
        _backends: backend,
    }
}

fn envoy_world<'n>(net: &'n PodNet, binary: &Path) -> World<'n> {
    let backend = prepare(net);
    let envoy = resources().start_envoy(net, binary);
    World {
        net,
        proxy: Sidecar::Envoy(envoy),
        _backends: backend,
    }
}

/// What one world made of the circuit-breaking task.
#[derive(Debug, PartialEq, Eq)]
struct Breaking {
    /// Statuses in the order the requests were sent.
    statuses: Vec<u16>,
    uo_lines: usize,
    pending_overflow: u64,
    cx_overflow: u64,
    rq_total: u64,
    /// Connections opened (the one the first two requests share).
    cx_total: u64,
    /// `upstream_rq_503`, `upstream_rq_5xx`, `upstream_rq_completed`: the overflows are
    /// charged their 503 though they never went out.
    codes: (u64, u64, u64),
}

fn circuit_breaking(w: &World) -> Breaking {
    // Four requests to the backend's slow path (3 s), each sent while the earlier ones are in
    // flight: the first holds the one connection, the second waits for it, the others overflow.
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                std::thread::sleep(Duration::from_millis(if i == 0 { 0 } else { 300 }));
                s.spawn(move || w.get("/slow/cb").0)
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("request thread"))
            .collect()
    });
    Breaking {
        statuses,
        uo_lines: w.logged(503, "UO", 2),
        pending_overflow: w.stat(CB, "upstream_rq_pending_overflow"),
        cx_overflow: w.stat(CB, "upstream_cx_overflow"),
        rq_total: w.stat(CB, "upstream_rq_total"),
        cx_total: w.stat(CB, "upstream_cx_total"),
        codes: (
            w.stat(CB, "upstream_rq_503"),
            w.stat(CB, "upstream_rq_5xx"),
            w.stat(CB, "upstream_rq_completed"),
        ),
    }
}

#[test]
fn circuit_breaking_has_envoys_outcome() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = (remora_world(&nets.0), envoy_world(&nets.1, &binary));
    let expected = circuit_breaking(&envoy);
    // Envoy itself, as Istio's task describes it: two through, two overflowing at once.
    assert_eq!(
        expected.statuses,
        [200, 200, 503, 503],
        "envoy: {expected:?}"
    );
    let got = circuit_breaking(&remora);
    assert_eq!(
        got,
        expected,
        "remora:\n{}\n{}\nenvoy:\n{}",
        remora.proxy.output(),
        remora.admin("/stats"),
        envoy.admin("/clusters")
    );
}

/// What one world made of the outlier-detection task.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ejecting {
    /// Every request answered, and by which backend.
    answers: Vec<(u16, Option<String>)>,
    ejections: u64,
    consecutive_5xx: u64,
    active: u64,
    retries: u64,
    /// `upstream_rq_200`, `upstream_rq_503`, `upstream_rq_total`.
    codes: (u64, u64, u64),
    flags_while_out: String,
}

/// Requests one after another, a little apart: Envoy ejects on its main thread and tells its
/// workers after, so a request right behind the ejecting one may still pick the host there.
fn eject(w: &World, requests: usize) -> Vec<(u16, Option<String>)> {
    (0..requests)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            w.get("/od")
        })
        .collect()
}

fn outlier_round(w: &World) -> Ejecting {
    let answers = eject(w, 6);
    Ejecting {
        answers,
        ejections: w.stat(OD, "outlier_detection.ejections_enforced_total"),
        consecutive_5xx: w.stat(OD, "outlier_detection.ejections_enforced_consecutive_5xx"),
        active: w.stat(OD, "outlier_detection.ejections_active"),
        retries: w.stat(OD, "upstream_rq_retry"),
        codes: (
            w.stat(OD, "upstream_rq_200"),
            w.stat(OD, "upstream_rq_503"),
            w.stat(OD, "upstream_rq_total"),
        ),
        flags_while_out: w.health_flags(OD, backend_addr(DEAD_PORT)),
    }
}

#[test]
fn outlier_detection_has_envoys_outcome() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = (remora_world(&nets.0), envoy_world(&nets.1, &binary));
    let live = Some("live".to_string());
    let mut rounds = Vec::new();
    for world in [&envoy, &remora] {
        // The refusing endpoint is tried once, ejected on that failure; the retry and every
        // request after it go to the live one.
        let first = outlier_round(world);
        // Back after its ejection time (2 s, to the next 1 s tick), tried once more, out again
        // (for twice as long).
        std::thread::sleep(Duration::from_millis(3500));
        let second = outlier_round(world);
        for round in [&first, &second] {
            assert!(
                round.answers.iter().all(|a| *a == (200, live.clone())),
                "{}: {round:?}\n{}",
                world.proxy.name(),
                world.proxy.output()
            );
        }
        rounds.push((first, second));
    }
    let (expected, got) = (&mut rounds[0].clone(), &mut rounds[1].clone());
    assert_eq!(expected.0.ejections, 1, "envoy: {expected:?}");
    assert_eq!(expected.1.ejections, 2, "envoy: {expected:?}");
    // Retries: one per ejection, the request whose failure ejected the host going on to the
    // live one. Remora ejects before that retry picks; Envoy's workers learn of an ejection a
    // moment after its main thread makes it, so Envoy may retry more (its count is at least
    // the ejections'; equal whenever its workers were quick enough).
    for (round, e) in [(&expected.0, 1), (&expected.1, 2)] {
        assert!(round.retries >= e, "envoy: {round:?}");
    }
    assert_eq!((got.0.retries, got.1.retries), (1, 2), "remora: {got:?}");
    for r in [&mut expected.0, &mut expected.1, &mut got.0, &mut got.1] {
        r.retries = 0;
    }
    assert_eq!(
        got,
        expected,
        "remora:\n{}\n{}\nenvoy:\n{}",
        remora.proxy.output(),
        remora.admin("/stats"),
        envoy.admin("/clusters")
    );
}

/// What one world made of a TCP service allowed one connection: the first echoes, a second
/// opened meanwhile is closed without reaching the backend.
fn tcp_breaking(w: &World) -> (Vec<u8>, String, u64, u64) {
    use std::io::{Read, Write};
    let vip: SocketAddr = TCP_VIP.parse().expect("addr");
    let mut first = peer::connect(&w.net.pod, vip).expect("first connection");
    first.write_all(b"ping").expect("write");
    let mut echoed = [0u8; 4];
    first.read_exact(&mut echoed).expect("echo");
    let second = match peer::connect(&w.net.pod, vip) {
        Ok(mut s) => match s.read(&mut [0u8; 16]) {
            Ok(0) => "closed".to_string(),
            Ok(n) => format!("{n} bytes"),
            Err(e) => format!("{:?}", e.kind()),
        },
        Err(e) => format!("connect: {:?}", e.kind()),
    };
    drop(first);
    (
        echoed.to_vec(),
        second,
        w.stat(TCP_CB, "upstream_cx_overflow"),
        w.stat(TCP_CB, "upstream_cx_total"),
    )
}

#[test]
fn tcp_circuit_breaking_has_envoys_outcome() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = (remora_world(&nets.0), envoy_world(&nets.1, &binary));
    let expected = tcp_breaking(&envoy);
    assert_eq!(
        expected,
        (b"ping".to_vec(), "closed".to_string(), 1, 1),
        "envoy"
    );
    let got = tcp_breaking(&remora);
    assert_eq!(got, expected, "remora:\n{}", remora.proxy.output());
}

/// What one world made of an endpoint answering 500: how many requests got its 500 before it
/// was ejected, and the ejections counted.
fn failing_5xx(w: &World) -> (usize, usize, u64, u64, String) {
    let answers: Vec<(u16, Option<String>)> = (0..12)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            w.get("/od5")
        })
        .collect();
    let failed = answers.iter().filter(|a| a.0 == 500).count();
    // After the ejection, the live endpoint answers everything.
    let last_failure = answers.iter().rposition(|a| a.0 == 500).unwrap_or(0);
    let after = answers[last_failure + 1..]
        .iter()
        .filter(|a| **a == (200, Some("live".to_string())))
        .count();
    (
        failed,
        answers.len() - last_failure - 1 - after,
        w.stat(OD5, "outlier_detection.ejections_enforced_consecutive_5xx"),
        w.stat(OD5, "upstream_rq_500"),
        w.health_flags(OD5, backend_addr(FAILING_PORT)),
    )
}

/// Two 500s in a row from one endpoint (balanced round robin with the live one, so every
/// other request reaches it) eject it on the second; none is retried (Istio's policy retries
/// no 500), and every request after goes to the live endpoint.
#[test]
fn consecutive_5xx_ejection_has_envoys_outcome() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = (remora_world(&nets.0), envoy_world(&nets.1, &binary));
    let expected = failing_5xx(&envoy);
    assert_eq!(
        expected,
        (2, 0, 1, 2, "/failed_outlier_check".to_string()),
        "envoy"
    );
    let got = failing_5xx(&remora);
    assert_eq!(got, expected, "remora:\n{}", remora.proxy.output());
}

/// What one world counted for requests to an endpoint that refuses every connection.
#[derive(Debug, PartialEq, Eq)]
struct Refused {
    statuses: Vec<u16>,
    /// `upstream_cx_total`, `upstream_cx_connect_fail`: every attempt's connection.
    connections: (u64, u64),
    /// `upstream_rq_503`, `upstream_rq_5xx`, `upstream_rq_completed`, `upstream_rq_total`:
    /// each request's final 503 charged, though none went out.
    codes: (u64, u64, u64, u64),
    retries: u64,
}

fn refused(w: &World) -> Refused {
    let statuses = (0..3).map(|_| w.get("/dead").0).collect();
    Refused {
        statuses,
        connections: (
            w.stat(DEAD, "upstream_cx_total"),
            w.stat(DEAD, "upstream_cx_connect_fail"),
        ),
        codes: (
            w.stat(DEAD, "upstream_rq_503"),
            w.stat(DEAD, "upstream_rq_5xx"),
            w.stat(DEAD, "upstream_rq_completed"),
            w.stat(DEAD, "upstream_rq_total"),
        ),
        retries: w.stat(DEAD, "upstream_rq_retry"),
    }
}

/// A request whose every attempt fails to connect ends with the router's own 503, which
/// Envoy charges to the cluster (`upstream_rq_503`) once per request, its retries not; every
/// attempt opens a connection (`upstream_cx_total`) that fails.
#[test]
fn a_connect_failure_is_charged_as_envoy_charges_it() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = (remora_world(&nets.0), envoy_world(&nets.1, &binary));
    let expected = refused(&envoy);
    // Envoy: three requests, each tried three times (Istio's two retries).
    assert_eq!(
        expected,
        Refused {
            statuses: vec![503; 3],
            connections: (9, 9),
            codes: (3, 3, 3, 0),
            retries: 6,
        },
        "envoy"
    );
    let got = refused(&remora);
    assert_eq!(
        got,
        expected,
        "remora:\n{}\n{}",
        remora.proxy.output(),
        remora.admin("/stats")
    );
}
