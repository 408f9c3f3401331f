//! Envoy is the oracle: the same xDS resources given to a real Envoy 1.40 and to Remora, the
//! same requests through each, the same outcomes.
//!
//! Each proxy is the sidecar of a pod of its own (a [`PodNet`] with `remora capture`'s rules,
//! the proxy exempt by its UID or GID), so both are reached as istiod's sidecars are: the
//! application connects to a service VIP, the capture rules send it to 15001, and the
//! listener of its original destination decides. Both worlds have the same addresses where
//! the resources name them (the VIPs, and the backends on 10.1.0.2 in the peer namespace), so
//! the resources are byte for byte the same; Remora reads them from `xds.resources_dir`,
//! Envoy from its bootstrap ([`remora_e2e::envoy_xds::Resources::envoy_bootstrap`]), which has
//! pilot-agent's statistics tags ([`istio_stats_config`]).
//!
//! Every case in [`CASES`] is one request, and what each proxy made of it is compared: the
//! status, which backend answered, the path and headers it received (per-proxy headers
//! aside: `x-request-id`, `x-envoy-*`), the response headers (`date`, `server`, `x-envoy-*`
//! but `x-envoy-upstream-service-time`, compared as present or not,
//! and framing aside), the body of an answer the proxy made itself, and the response flags
//! of its access-log line (istiod's text format, which both write), and in the end the cors
//! filter's counts of the origins it judged. Weighted clusters and
//! retries, whose single outcome is random, are compared by distribution and by the set of
//! outcomes over many requests. Adding a case is one line in [`CASES`]
//! (`differential/cases.rs`; and, for a new kind of route, one route in
//! [`differential::routes`]). The statistics' Prometheus names and labels are compared in
//! `differential/prometheus_tags.rs`.

mod differential;
#[path = "differential/h2c.rs"]
mod h2c;
#[path = "differential/prometheus_tags.rs"]
mod prometheus_tags;

use differential::cases::{CASES, CASES_8080, RAW_CASES};
use differential::*;
use remora_e2e::backend;
use remora_e2e::envoy::Envoy;
use remora_e2e::envoy_xds::{istio_stats_config, nets_or_skip};
use remora_e2e::http_client::{self, Response};
use remora_e2e::peer::{self, Server};
use remora_e2e::{PodNet, Remora};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// Requests per statistical case.
const MANY: usize = 200;

/// A pod whose sidecar is Remora or Envoy, with the backends in its peer namespace.
struct World<'n> {
    net: &'n PodNet,
    proxy: Proxy<'n>,
    _servers: Vec<Server>,
}

enum Proxy<'n> {
    Remora(Remora<'n>),
    Envoy(Envoy<'n>),
}

impl Proxy<'_> {
    fn name(&self) -> &'static str {
        match self {
            Proxy::Remora(_) => "remora",
            Proxy::Envoy(_) => "envoy",
        }
    }

    /// Everything the proxy wrote: its access log is in it.
    fn output(&self) -> String {
        match self {
            Proxy::Remora(r) => r.stdout(),
            Proxy::Envoy(e) => e.logs(),
        }
    }

    fn diagnostics(&self) -> String {
        match self {
            Proxy::Remora(r) => format!("remora stderr:\n{}", r.stderr()),
            Proxy::Envoy(e) => format!("envoy log:\n{}", e.logs()),
        }
    }
}

/// Make `net` a pod with capture rules, a route for the VIPs, and the backends reachable at
/// [`BACKEND_IP`] in its peer namespace.
fn prepare(net: &PodNet) -> Vec<Server> {
    remora_e2e::sidecars::prepare(net);
    let mut servers: Vec<Server> = BACKENDS
        .iter()
        .map(|(name, port)| backend::start(&net.peer, backend_addr(*port), name))
        .collect();
    servers.push(Server::echo(&net.peer, backend_addr(ECHO_PORT)));
    servers
}

fn remora_world(net: &PodNet) -> World<'_> {
    let servers = prepare(net);
    let remora = resources().start_remora(net);
    World {
        net,
        proxy: Proxy::Remora(remora),
        _servers: servers,
    }
}

fn envoy_world<'n>(net: &'n PodNet, binary: &Path) -> World<'n> {
    let servers = prepare(net);
    let envoy = resources().start_envoy_with(net, binary, istio_stats_config);
    World {
        net,
        proxy: Proxy::Envoy(envoy),
        _servers: servers,
    }
}

/// What a proxy made of one request, in the terms both share.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Outcome {
    status: u16,
    /// The backend that answered, the path and headers it received.
    backend: Option<String>,
    upstream_path: Option<String>,
    upstream_headers: BTreeMap<String, String>,
    /// The body of an answer the proxy made itself.
    local_body: Option<String>,
    response_headers: BTreeMap<String, String>,
}

/// Headers one proxy adds and the other need not: ids, Envoy's own (but the attempt count, which
/// the virtual host asks for, and the deadline the route sets), and framing.
fn per_proxy(name: &str) -> bool {
    (name.starts_with("x-envoy-")
        && !matches!(
            name,
            "x-envoy-attempt-count" | "x-envoy-expected-rq-timeout-ms"
        ))
        || matches!(
            name,
            "x-request-id"
                | "date"
                | "content-length"
                | "transfer-encoding"
                | "connection"
                | "keep-alive"
        )
}

fn outcome(result: std::io::Result<Response>) -> Outcome {
    let r = match result {
        Ok(r) => r,
        Err(e) => {
            return Outcome {
                status: 0,
                backend: None,
                upstream_path: None,
                upstream_headers: BTreeMap::new(),
                local_body: Some(format!("no response: {:?}", e.kind())),
                response_headers: BTreeMap::new(),
            }
        }
    };
    let response_headers = r
        .headers
        .iter()
        .filter_map(|(k, v)| match k.as_str() {
            // Envoy's router's, on what it forwards: present or not (its value is a time).
            "x-envoy-upstream-service-time" => Some((k.clone(), "(ms)".into())),
            _ if per_proxy(k) => None,
            _ => Some((k.clone(), v.clone())),
        })
        .collect();
    let echoed: Option<Value> = r
        .header("x-backend")
        .and_then(|_| serde_json::from_slice(&r.body).ok());
    match echoed {
        Some(mut e) => {
            // A retry is told what is left of the deadline: a number of milliseconds that
            // depends on timing, compared as that.
            let retried = e["headers"]["x-envoy-attempt-count"]
                .as_str()
                .is_some_and(|n| n != "1");
            if let Some(left) = e["headers"].get_mut("x-envoy-expected-rq-timeout-ms") {
                if retried && left.as_str().is_some_and(|v| v.parse::<u64>().is_ok()) {
                    *left = Value::String("(what is left)".into());
                }
            }
            Outcome {
                status: r.status,
                backend: e["backend"].as_str().map(str::to_string),
                upstream_path: e["path"].as_str().map(str::to_string),
                upstream_headers: e["headers"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(k, _)| !per_proxy(k))
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect(),
                local_body: None,
                response_headers,
            }
        }
        None => Outcome {
            status: r.status,
            backend: None,
            upstream_path: None,
            upstream_headers: BTreeMap::new(),
            local_body: Some(r.text()),
            response_headers,
        },
    }
}

impl World<'_> {
    fn get(&self, host: &str, path: &str, headers: &[(&str, &str)]) -> Outcome {
        self.get_at(80, host, path, headers)
    }

    fn get_at(&self, port: u16, host: &str, path: &str, headers: &[(&str, &str)]) -> Outcome {
        let vip = SocketAddr::from((HTTP_VIP, port));
        outcome(http_client::get_once(
            &self.net.pod,
            vip,
            host,
            path,
            headers,
        ))
    }

    /// `"METHOD PATH PROTOCOL" STATUS FLAGS` of every request line in the access log so far,
    /// a head the codec refused (`"- - HTTP/1.1"`) among them.
    fn access_lines(&self) -> Vec<String> {
        self.proxy
            .output()
            .lines()
            .filter_map(|l| {
                let start = l
                    .find("\"GET ")
                    .or_else(|| l.find("\"OPTIONS "))
                    .or_else(|| l.find("\"- - HTTP"))?;
                let rest = &l[start..];
                let end = rest[1..].find('"')? + 2;
                let mut after = rest[end..].split_whitespace();
                let (status, flags) = (after.next()?, after.next()?);
                Some(format!("{} {status} {flags}", &rest[..end]))
            })
            .collect()
    }

    /// The `/stats` counters of `cluster` named in `names`, by their full names.
    fn cluster_stats(&self, cluster: &str, names: &[&str]) -> remora_e2e::stat_deltas::Stats {
        let port = match self.proxy {
            Proxy::Remora(_) => remora_e2e::ADMIN_PORT,
            Proxy::Envoy(_) => remora_e2e::envoy::ADMIN_PORT,
        };
        let prefix = format!("cluster.{cluster}.");
        remora_e2e::stat_deltas::stats(self.net, port, |n| {
            n.strip_prefix(&prefix).is_some_and(|s| names.contains(&s))
        })
    }

    /// The body of `GET path` on the proxy's admin port.
    fn admin(&self, path: &str) -> String {
        let port = match self.proxy {
            Proxy::Remora(_) => remora_e2e::ADMIN_PORT,
            Proxy::Envoy(_) => remora_e2e::envoy::ADMIN_PORT,
        };
        let url = format!("http://127.0.0.1:{port}{path}");
        let (status, body) = peer::curl_status(&self.net.pod, &[&url], Duration::from_secs(5));
        assert_eq!(status, 200, "{} {path}: {body}", self.proxy.name());
        body
    }

    /// The cors filter's `(origin_valid, origin_invalid)` of port 80's connection manager, from
    /// the admin `/stats` (0 when absent).
    fn cors_stats(&self) -> (u64, u64) {
        let stats = self.admin("/stats");
        let stat = |name: &str| {
            let full = format!("http.outbound_0.0.0.0_80.cors.{name}: ");
            stats
                .lines()
                .find_map(|l| l.strip_prefix(&full))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        (stat("origin_valid"), stat("origin_invalid"))
    }

    /// The access-log lines once there are `n` of them (Envoy flushes its log every second).
    fn wait_access_lines(&self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let lines = self.access_lines();
            if lines.len() >= n || Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Remora's world and Envoy's.
fn worlds<'n>(nets: &'n (PodNet, PodNet), binary: &Path) -> (World<'n>, World<'n>) {
    (remora_world(&nets.0), envoy_world(&nets.1, binary))
}

#[test]
fn every_case_has_envoys_outcome() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = worlds(&nets, &binary);
    let mut differences = Vec::new();
    let mut log_lines = 0;
    let all = CASES
        .iter()
        .map(|c| (80, c))
        .chain(CASES_8080.iter().map(|c| (8080, c)));
    for (port, (host, path, headers)) in all {
        let expected = envoy.get_at(port, host, path, headers);
        let got = remora.get_at(port, host, path, headers);
        log_lines += 1;
        if expected != got {
            differences.push(format!(
                "port {port} Host {host} GET {path} {headers:?}\n  envoy:  {expected:?}\n  remora: {got:?}"
            ));
        }
    }
    for raw in RAW_CASES {
        let vip = SocketAddr::from((HTTP_VIP, 80));
        let send = |w: &World| {
            outcome(
                http_client::Client::connect(&w.net.pod, vip)
                    .and_then(|mut c| c.send_raw(raw.as_bytes())),
            )
        };
        let (expected, got) = (send(&envoy), send(&remora));
        log_lines += 1;
        if expected != got {
            differences.push(format!(
                "{raw:?}\n  envoy:  {expected:?}\n  remora: {got:?}"
            ));
        }
    }
    // The response flags each logged, request by request.
    let (e, r) = (
        envoy.wait_access_lines(log_lines),
        remora.wait_access_lines(log_lines),
    );
    if e.len() != r.len() {
        let log = envoy.proxy.output();
        differences.push(format!(
            "access-log lines: envoy {} remora {}\nenvoy's output ends:\n{}",
            e.len(),
            r.len(),
            &log[log.len().saturating_sub(3000)..]
        ));
    }
    for (e, r) in e.iter().zip(&r) {
        if e != r {
            differences.push(format!("access log\n  envoy:  {e}\n  remora: {r}"));
        }
    }
    // The cors filter's counts of the origins it judged: every request on a route with a
    // policy and an `Origin` (preflight or not), none where the fault filter before it aborted,
    // none on port 8080's chain, which has no cors filter.
    let (expected, got) = (envoy.cors_stats(), remora.cors_stats());
    if expected != got {
        differences.push(format!(
            "cors.origin_valid, origin_invalid\n  envoy:  {expected:?}\n  remora: {got:?}"
        ));
    }
    assert!(expected.0 > 0 && expected.1 > 0, "{expected:?}");
    // The same counts in Prometheus' exposition, the connection manager's prefix in the name
    // (Istio's `http_conn_manager_prefix` tag wants a `;` after it).
    let prometheus = remora.admin("/stats/prometheus");
    for (name, want) in [("origin_valid", expected.0), ("origin_invalid", expected.1)] {
        let line = format!("envoy_http_outbound_0_0_0_0_80_cors_{name} {want}");
        if !prometheus.lines().any(|l| l == line) {
            differences.push(format!("remora's /stats/prometheus has no {line:?}"));
        }
    }
    assert!(
        differences.is_empty(),
        "{} of {} cases differ from Envoy:\n{}\n\n{}",
        differences.len(),
        CASES.len() + CASES_8080.len() + RAW_CASES.len(),
        differences.join("\n"),
        remora.proxy.diagnostics()
    );
}

#[test]
fn weighted_clusters_and_retries_have_envoys_distribution() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = worlds(&nets, &binary);
    for world in [&remora, &envoy] {
        let name = world.proxy.name();
        // Weighted 80/20, each pick with its own header edits.
        let outcomes: Vec<Outcome> = (0..MANY).map(|_| world.get(WEB, "/split", &[])).collect();
        let to_a = outcomes
            .iter()
            .filter(|o| o.backend.as_deref() == Some("a"))
            .count();
        // 80% of 200 is 160, with a standard deviation of about 5.7: five of them either way.
        assert!(
            (132..=188).contains(&to_a),
            "{name}: {to_a} of {MANY} to the 80% cluster\n{}",
            world.proxy.diagnostics()
        );
        let distinct: BTreeSet<&Outcome> = outcomes.iter().collect();
        for o in &distinct {
            let subset = o.upstream_headers.get("x-subset");
            let split = o.response_headers.get("x-split");
            assert_eq!(
                subset.map(String::as_str),
                o.backend.as_deref(),
                "{name}: {o:?}"
            );
            assert_eq!(split, subset, "{name}: {o:?}");
        }
    }
    // The same distinct outcomes from both: per pick, the same edits.
    let distinct = |w: &World| -> BTreeSet<Outcome> {
        (0..MANY / 4).map(|_| w.get(WEB, "/split", &[])).collect()
    };
    assert_eq!(distinct(&envoy), distinct(&remora));

    // Istio's retry policy over an endpoint that refuses and one that answers: every request
    // answered, by the live one, but for the policy's own rare exhaustion. Each retry picks
    // up to six times (`host_selection_retry_max_attempts` 5, `previous_hosts`), so with two
    // hosts of equal load it lands on the refusing one again with odds 1/64, and a request
    // exhausts its two retries with odds 1/2 × 1/64 × 1/64 = 1/8192, in Envoy as in Remora:
    // about one run in eighty would see one. Such a 503 is set apart and bounded (three in
    // fifty has odds of about 10^-8 when the retries avoid the refusing host as they should;
    // without `previous_hosts` an eighth of the requests would exhaust them).
    // Which attempt answered is random (the first pick may be either host): compared apart.
    let retried = |w: &World| -> (BTreeSet<Outcome>, BTreeSet<String>, usize) {
        let mut attempts = BTreeSet::new();
        let mut exhausted = 0;
        let outcomes = (0..MANY / 4)
            .filter_map(|_| {
                let mut o = w.get(WEB, "/retry", &[]);
                if let Some(n) = o.upstream_headers.remove("x-envoy-attempt-count") {
                    attempts.insert(n);
                }
                let gave_up = o.status == 503
                    && o.local_body.as_deref().is_some_and(|b| {
                        b.starts_with(
                            "upstream connect error or disconnect/reset before headers. retried",
                        )
                    });
                exhausted += usize::from(gave_up);
                (!gave_up).then_some(o)
            })
            .collect();
        (outcomes, attempts, exhausted)
    };
    let ((e, e_attempts, e_exhausted), (r, r_attempts, r_exhausted)) =
        (retried(&envoy), retried(&remora));
    assert_eq!(e, r, "{}", remora.proxy.diagnostics());
    assert!(
        e_exhausted <= 2 && r_exhausted <= 2,
        "retries exhausted: envoy {e_exhausted}, remora {r_exhausted} of {}",
        MANY / 4
    );
    assert!(
        e.iter()
            .all(|o| o.status == 200 && o.backend.as_deref() == Some("c")),
        "{e:?}"
    );
    // Some first attempts went to the refusing host and were retried, in both.
    for attempts in [&e_attempts, &r_attempts] {
        assert!(
            attempts.contains("1") && attempts.contains("2"),
            "{attempts:?}"
        );
    }
}

#[test]
fn tcp_has_envoys_outcome() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = worlds(&nets, &binary);
    // Refused connections: no listener (virtualOutbound's BlackHoleCluster), no endpoint, no
    // cluster. What the client sees (a close or a reset, any byte) is the same from both.
    let refused = |w: &World, to: &str| {
        let addr: SocketAddr = to.parse().expect("addr");
        let mut stream = match peer::connect(&w.net.pod, addr) {
            Ok(s) => s,
            Err(e) => return format!("connect: {:?}", e.kind()),
        };
        // Nothing sent: both decide on the destination alone, at once.
        match std::io::Read::read(&mut stream, &mut [0u8; 16]) {
            Ok(0) => "closed".to_string(),
            Ok(n) => format!("{n} bytes"),
            Err(e) => format!("{:?}", e.kind()),
        }
    };
    for to in [NOWHERE, TCP_NO_ENDPOINT, TCP_NO_CLUSTER] {
        let (e, r) = (refused(&envoy, to), refused(&remora, to));
        assert_eq!(e, r, "{to}: envoy {e}, remora {r}");
    }
    let data = peer::pattern(64 * 1024);
    // How the upstream connection ended, counted on the cluster as Envoy's tcp_proxy counts it:
    // the echo server closes after the client's end of stream reached it, so remotely.
    const DESTROY: &[&str] = &[
        "upstream_cx_destroy",
        "upstream_cx_destroy_local",
        "upstream_cx_destroy_remote",
        "upstream_cx_destroy_with_active_rq",
        "upstream_cx_destroy_local_with_active_rq",
        "upstream_cx_destroy_remote_with_active_rq",
    ];
    let mut closes = Vec::new();
    for world in [&remora, &envoy] {
        let name = world.proxy.name();
        let before = world.cluster_stats(TCP, DESTROY);
        // tcp_proxy to the cluster's endpoint: every byte back.
        let tcp: SocketAddr = TCP_VIP.parse().expect("addr");
        let back = peer::echo_exchange(&world.net.pod, tcp, &data)
            .unwrap_or_else(|e| panic!("{name}: {e}\n{}", world.proxy.diagnostics()));
        peer::assert_same_bytes(name, &data, &back);
        std::thread::sleep(Duration::from_millis(300));
        let after = world.cluster_stats(TCP, DESTROY);
        // A client that resets its connection: the proxy closes the upstream one, locally.
        let mut stream = peer::connect(&world.net.pod, tcp).expect("connect");
        std::io::Write::write_all(&mut stream, b"hello").expect("write");
        std::thread::sleep(Duration::from_millis(200));
        socket2::SockRef::from(&stream)
            .set_linger(Some(Duration::ZERO))
            .expect("linger");
        drop(stream);
        std::thread::sleep(Duration::from_millis(300));
        let reset = world.cluster_stats(TCP, DESTROY);
        closes.push([
            remora_e2e::stat_deltas::delta(&before, &after),
            remora_e2e::stat_deltas::delta(&after, &reset),
        ]);
    }
    let stat = |s: &str| format!("cluster.{TCP}.{s} +1");
    let envoy = &closes[1];
    assert!(
        envoy[0].contains(&stat("upstream_cx_destroy_remote"))
            && envoy[1].contains(&stat("upstream_cx_destroy_local_with_active_rq")),
        "envoy: {envoy:?}"
    );
    assert_eq!(closes[0], closes[1], "remora's closes, then envoy's");
}
