//! Istio's mirroring task, as the xDS resources istiod writes for a VirtualService with
//! `mirror` (and `mirrorPercentage`), through Remora behind `remora capture` and through a
//! real Envoy 1.40 given the same resources: the mirror's backend sees a copy of every request
//! with `-shadow` before the port of its authority, the client gets the primary's answer and
//! never waits for a slow or failing mirror, and a 50 % mirror copies about half of the
//! requests. A request's body is copied too.

use remora_e2e::backend;
use remora_e2e::envoy_xds::{istio_retry_policy, nets_or_skip, Resources};
use remora_e2e::http_client;
use remora_e2e::peer::{self, read_request_head, Server};
use remora_e2e::sidecars::{self, Sidecar, BACKEND_IP};
use remora_e2e::stat_deltas::{self, Stats};
use remora_e2e::xds_resources::{eds_cluster, outbound_http_listeners};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const PRIMARY_PORT: u16 = 8001;
/// The mirror's backend: records every request; slow on `/lagging-shadow…`.
const MIRROR_PORT: u16 = 8003;
/// Nothing listens here: a mirror whose every connect is refused.
const DEAD_PORT: u16 = 8009;
const WEB: &str = "web.test.svc.cluster.local";
/// The Host the client sends, with a port as Istio's task has it (`httpbin:8000`).
const HOST: &str = "web.test.svc.cluster.local:80";
/// What the mirror must see.
const SHADOW_HOST: &str = "web.test.svc.cluster.local-shadow:80";
const V1: &str = "outbound|80|v1|web.test.svc.cluster.local";
const V2: &str = "outbound|80|v2|web.test.svc.cluster.local";
const DEAD: &str = "outbound|80|dead|web.test.svc.cluster.local";
/// The length of the body of `/big`.
const BIG: usize = 256 * 1024;
/// How long the mirror's backend takes on `/lagging-shadow…`.
const MIRROR_SLOW: Duration = Duration::from_secs(3);

/// A route to v1 mirrored to `mirror` for `per_million` of its requests, as istiod writes
/// `mirror: {host: web, subset: …}` with `mirrorPercentage`.
fn route(prefix: &str, mirror: &str, per_million: u32) -> Value {
    json!({"match": {"prefix": prefix},
           "route": {"cluster": V1, "timeout": "0s", "retry_policy": istio_retry_policy(),
                     "request_mirror_policies": [{"cluster": mirror,
                        "runtime_fraction": {"default_value": {"numerator": per_million, "denominator": "MILLION"}},
                        "trace_sampled": false}]}})
}

fn resources() -> Resources {
    let endpoint = |port: u16| {
        json!({"endpoint": {"address": {"socket_address": {
            "address": BACKEND_IP.to_string(), "port_value": port}}}, "health_status": "HEALTHY"})
    };
    Resources {
        listeners: Value::Array(outbound_http_listeners(None)),
        clusters: json!([eds_cluster(V1), eds_cluster(V2), eds_cluster(DEAD),
            {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]),
        routes: json!([{"name": "80", "virtual_hosts": [
            {"name": "web.test.svc.cluster.local:80", "domains": [WEB, HOST, VIP.to_string()],
             "routes": [route("/half", V2, 500_000), route("/dead", DEAD, 1_000_000),
                        route("/", V2, 1_000_000)]}]}]),
        endpoints: json!([
            {"cluster_name": V1, "endpoints": [{"lb_endpoints": [endpoint(PRIMARY_PORT)]}]},
            {"cluster_name": V2, "endpoints": [{"lb_endpoints": [endpoint(MIRROR_PORT)]}]},
            {"cluster_name": DEAD, "endpoints": [{"lb_endpoints": [endpoint(DEAD_PORT)]}]}
        ]),
    }
}

/// What the mirror's backend saw: each request's method, path and Host.
type Seen = Arc<Mutex<Vec<(String, String, String)>>>;
/// The headers of the copies of `/headers/0` and `/posted`, by path (names lowercased,
/// sorted; `x-request-id`'s value left out, each proxy making its own), and the body as
/// `<body>`. Envoy sends a shadow as an internal request of its own: `x-envoy-internal` and
/// the pod's address in `x-forwarded-for`.
type Head = Arc<Mutex<Vec<(String, Vec<(String, String)>)>>>;

/// The mirror's backend: records each request and answers it (after [`MIRROR_SLOW`] on
/// `/lagging-shadow…`, and 500 on `/fail-shadow…`, so that the primary's answer is told apart).
fn mirror_backend(net: &PodNet, seen: Seen, first: Head) -> Server {
    let addr = SocketAddr::from(SocketAddrV4::new(BACKEND_IP, MIRROR_PORT));
    Server::start(&net.peer, addr, move |mut stream| {
        for _ in 0..10_000 {
            let head = match read_request_head(&mut stream) {
                Ok(h) => h,
                Err(_) => return Ok(()),
            };
            let text = String::from_utf8_lossy(&head).to_string();
            let mut words = text.split(' ');
            let method = words.next().unwrap_or_default().to_string();
            let path = words.next().unwrap_or_default().to_string();
            let host = text
                .split("\r\n")
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("host"))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default();
            let length = text
                .split("\r\n")
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
            let mut body = Vec::new();
            (&mut stream)
                .take(length.min(1 << 20))
                .read_to_end(&mut body)?;
            if path == "/big" {
                let length = vec![("<length>".to_string(), body.len().to_string())];
                first
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((path.clone(), length));
            }
            if path == "/headers/0" || path == "/posted" {
                let mut headers: Vec<(String, String)> = text
                    .split("\r\n")
                    .skip(1)
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| match k.trim().to_ascii_lowercase() {
                        k if k == "x-request-id" => (k, String::new()),
                        k => (k, v.trim().to_string()),
                    })
                    .collect();
                headers.push(("<body>".into(), String::from_utf8_lossy(&body).into()));
                headers.sort();
                first
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((path.clone(), headers));
            }
            seen.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((method, path.clone(), host));
            if path.starts_with("/lagging-shadow") {
                std::thread::sleep(MIRROR_SLOW);
            }
            let status = if path.starts_with("/fail-shadow") {
                "500 Failing"
            } else {
                "200 OK"
            };
            stream.write_all(
                format!(
                    "HTTP/1.1 {status}\r\ncontent-length: 6\r\nx-backend: mirror\r\n\r\nshadow"
                )
                .as_bytes(),
            )?;
        }
        Ok(())
    })
}

struct World<'n> {
    net: &'n PodNet,
    proxy: Sidecar<'n>,
    seen: Seen,
    first: Head,
    _backends: (Server, Server),
}

impl World<'_> {
    /// One request; its status, the backend that answered and how long it took.
    fn get(&self, path: &str) -> (u16, Option<String>, Duration) {
        let vip = SocketAddr::from((VIP, 80));
        let started = Instant::now();
        let (status, backend) = sidecars::answer(self.net, &self.proxy, vip, HOST, path, &[]);
        (status, backend, started.elapsed())
    }

    /// What the mirror saw of paths starting `prefix`, sorted, once `want` of them arrived
    /// (or after a few seconds), then a moment more for any extra copy.
    fn seen(&self, prefix: &str, want: usize) -> Vec<(String, String, String)> {
        let deadline = Instant::now() + Duration::from_secs(8);
        let count = || {
            self.seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .filter(|s| s.1.starts_with(prefix))
                .count()
        };
        while count() < want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(300));
        let mut all: Vec<_> = self
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|s| s.1.starts_with(prefix))
            .cloned()
            .collect();
        all.sort();
        all
    }
}

fn prepare(net: &PodNet) -> (Seen, Head, (Server, Server)) {
    sidecars::prepare(net);
    let seen = Seen::default();
    let first = Head::default();
    let primary = SocketAddr::from(SocketAddrV4::new(BACKEND_IP, PRIMARY_PORT));
    let servers = (
        backend::start(&net.peer, primary, "primary"),
        mirror_backend(net, Arc::clone(&seen), Arc::clone(&first)),
    );
    (seen, first, servers)
}

fn remora_world(net: &PodNet) -> World<'_> {
    let (seen, first, backends) = prepare(net);
    let remora = resources().start_remora(net);
    World {
        net,
        proxy: Sidecar::Remora(remora),
        seen,
        first,
        _backends: backends,
    }
}

fn envoy_world<'n>(net: &'n PodNet, binary: &Path) -> World<'n> {
    let (seen, first, backends) = prepare(net);
    let envoy = resources().start_envoy(net, binary);
    World {
        net,
        proxy: Sidecar::Envoy(envoy),
        seen,
        first,
        _backends: backends,
    }
}

/// What one world made of the task.
#[derive(Debug, PartialEq, Eq)]
struct Mirrored {
    /// Every answer the client got (status, backend), in order.
    answers: Vec<(u16, Option<String>)>,
    /// What the mirror saw of the fully mirrored requests: method, path, Host.
    copies: Vec<(String, String, String)>,
    /// The headers (and body) of the copies of a GET and a POST.
    heads: Vec<(String, Vec<(String, String)>)>,
}

/// The fully mirrored part of the task: plain requests, requests whose copy is slow or
/// failing, and requests whose mirror cluster refuses every connection.
fn mirror_all(w: &World) -> Mirrored {
    let mut answers = Vec::new();
    for i in 0..10 {
        let (status, backend, _) = w.get(&format!("/headers/{i}"));
        answers.push((status, backend));
    }
    for i in 0..3 {
        let (status, backend, took) = w.get(&format!("/lagging-shadow/{i}"));
        // The client never waits for its copy, which takes MIRROR_SLOW.
        assert!(
            took < MIRROR_SLOW / 2,
            "{}: /lagging-shadow/{i} took {took:?}\n{}",
            w.proxy.name(),
            w.proxy.output()
        );
        answers.push((status, backend));
    }
    for i in 0..3 {
        let (status, backend, _) = w.get(&format!("/fail-shadow/{i}"));
        answers.push((status, backend));
    }
    for i in 0..3 {
        let (status, backend, took) = w.get(&format!("/dead/{i}"));
        assert!(
            took < MIRROR_SLOW / 2,
            "{}: /dead took {took:?}",
            w.proxy.name()
        );
        answers.push((status, backend));
    }
    // A request with a body: the copy gets the body too.
    let mut client = http_client::Client::connect(&w.net.pod, SocketAddr::from((VIP, 80)))
        .unwrap_or_else(|e| panic!("{}: {e}", w.proxy.name()));
    let post = format!(
        "POST /posted HTTP/1.1\r\nHost: {HOST}\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello"
    );
    let answer = client
        .send_raw(post.as_bytes())
        .unwrap_or_else(|e| panic!("{}: POST: {e}\n{}", w.proxy.name(), w.proxy.output()));
    answers.push((
        answer.status,
        answer.header("x-backend").map(str::to_string),
    ));
    // A body of many frames, longer than what a retry keeps (`http.retry_buffer_bytes`).
    let mut client = http_client::Client::connect(&w.net.pod, SocketAddr::from((VIP, 80)))
        .unwrap_or_else(|e| panic!("{}: {e}", w.proxy.name()));
    let mut big = format!(
        "POST /big HTTP/1.1\r\nHost: {HOST}\r\ncontent-length: {BIG}\r\nconnection: close\r\n\r\n"
    )
    .into_bytes();
    big.extend(std::iter::repeat_n(b'x', BIG));
    let answer = client
        .send_raw(&big)
        .unwrap_or_else(|e| panic!("{}: POST /big: {e}\n{}", w.proxy.name(), w.proxy.output()));
    answers.push((
        answer.status,
        answer.header("x-backend").map(str::to_string),
    ));
    let mut copies = w.seen("/headers/", 10);
    copies.extend(w.seen("/posted", 1));
    copies.extend(w.seen("/big", 1));
    copies.extend(w.seen("/lagging-shadow/", 3));
    copies.extend(w.seen("/fail-shadow/", 3));
    copies.extend(w.seen("/dead/", 0));
    // The proxy's own address (the pod's) in `x-forwarded-for`: each world has its own.
    let pod = w.net.pod_ip.to_string();
    let mut heads: Vec<(String, Vec<(String, String)>)> = w
        .first
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(path, head)| {
            let head = head
                .iter()
                .map(|(k, v)| match k.as_str() {
                    "x-forwarded-for" if *v == pod => (k.clone(), "<pod>".to_string()),
                    _ => (k.clone(), v.clone()),
                })
                .collect();
            (path.clone(), head)
        })
        .collect();
    heads.sort();
    Mirrored {
        answers,
        copies,
        heads,
    }
}

/// Requests on the 50 % route, and how many the mirror saw.
const HALF_REQUESTS: usize = 200;

fn mirror_half(w: &World) -> usize {
    for i in 0..HALF_REQUESTS {
        let (status, backend, _) = w.get(&format!("/half/{i}"));
        assert_eq!(
            (status, backend.as_deref()),
            (200, Some("primary")),
            "{}",
            w.proxy.name()
        );
    }
    w.seen("/half/", HALF_REQUESTS).len()
}

#[test]
fn mirroring_has_envoys_outcome() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = (remora_world(&nets.0), envoy_world(&nets.1, &binary));
    let expected = mirror_all(&envoy);
    // Envoy itself, as Istio's task describes it: every answer the primary's, every copy
    // at the mirror with the shadow authority, none for the mirror that cannot be reached.
    let primary = (200, Some("primary".to_string()));
    assert!(
        expected.answers.iter().all(|a| *a == primary),
        "envoy: {expected:?}"
    );
    assert_eq!(expected.copies.len(), 18, "envoy: {expected:?}");
    assert!(
        expected
            .copies
            .iter()
            .all(|(m, p, h)| (m == "GET" || p == "/posted" || p == "/big") && h == SHADOW_HOST),
        "envoy: {expected:?}"
    );
    assert!(
        expected.heads.iter().any(|(p, head)| p == "/posted"
            && head.contains(&("<body>".to_string(), "hello".to_string()))),
        "envoy: {expected:?}"
    );
    let whole = vec![("<length>".to_string(), BIG.to_string())];
    assert!(
        expected.heads.contains(&("/big".to_string(), whole)),
        "envoy: {:?}",
        expected.heads
    );
    let got = mirror_all(&remora);
    assert_eq!(got, expected, "remora:\n{}", remora.proxy.output());
    // The clusters count the client's requests as Envoy's external ones and the shadows as
    // its internal ones, the refused shadows' 503 included.
    let counted = charged(&envoy);
    let mirror = format!("cluster.{V2}.internal.upstream_rq_completed");
    assert!(counted.contains_key(&mirror), "envoy: {counted:#?}");
    assert_eq!(
        charged(&remora),
        counted,
        "the clusters' answers\n{}",
        remora.proxy.output()
    );
    // Remora counts what became of its copies: 21 sent, the 3 to the unreachable mirror
    // failed (a 500 from the mirror is a response, not a failure).
    let url = format!(
        "http://127.0.0.1:{}/stats/prometheus",
        remora_e2e::ADMIN_PORT
    );
    let (status, stats) = peer::curl_status(&nets.0.pod, &[&url], Duration::from_secs(5));
    assert_eq!(status, 200, "{stats}");
    for line in [
        "remora_mirror_requests_sent_total 21",
        "remora_mirror_requests_failed_total 3",
        "remora_mirror_requests_overflow_total 0",
    ] {
        assert!(stats.lines().any(|l| l == line), "{line}:\n{stats}");
    }
}

/// The answers charged to the service's clusters (`upstream_rq_completed`, by code and class,
/// and Envoy's `external.` and `internal.` copies: a shadow is an internal request), once
/// the slow copies have had their time and nothing has changed for half a second (a copy is
/// charged when it is answered).
fn charged(w: &World) -> Stats {
    std::thread::sleep(MIRROR_SLOW);
    let keep = |name: &str| {
        name.starts_with("cluster.outbound|80|")
            && name.rsplit_once('.').is_some_and(|(_, stat)| {
                stat == "upstream_rq_completed"
                    || stat
                        .strip_prefix("upstream_rq_")
                        .is_some_and(|c| c.len() == 3 && c.as_bytes()[0].is_ascii_digit())
            })
    };
    let deadline = Instant::now() + MIRROR_SLOW * 3;
    let mut last = stat_deltas::stats(w.net, w.proxy.admin_port(), keep);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = stat_deltas::stats(w.net, w.proxy.admin_port(), keep);
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

/// `mirrorPercentage: 50`: each proxy copies about half of 200 requests. The count is
/// binomial (σ ≈ 7.1); the bound, 100 ± 40, fails a correct proxy about once in 10⁸ runs.
#[test]
fn a_mirror_percentage_is_honoured_as_envoy_honours_it() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = (remora_world(&nets.0), envoy_world(&nets.1, &binary));
    for w in [&envoy, &remora] {
        let copies = mirror_half(w);
        assert!(
            (60..=140).contains(&copies),
            "{}: {copies} of {HALF_REQUESTS} mirrored\n{}",
            w.proxy.name(),
            w.proxy.output()
        );
    }
}
