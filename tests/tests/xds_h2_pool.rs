//! Upstream HTTP/2 connections at their peer's stream limit, through Remora behind `remora
//! capture` and through a real Envoy 1.40 given the same xDS resources: clusters speaking
//! HTTP/2 upstream (`http2_protocol_options`, as istiod writes them for a port declared
//! `grpc`/`http2` or `h2UpgradePolicy: UPGRADE`) to real h2c origins that advertise
//! `SETTINGS_MAX_CONCURRENT_STREAMS: 1` and answer `slow` paths after a hold.
//!
//! - No connection limit: slow requests, each started while the earlier ones are in flight,
//!   each find every connection at the limit, so each opens another: they run at once, one per
//!   connection, as Envoy's HTTP/2 pool makes a new connection when none is ready.
//! - `maxConnections: 1`, `http1MaxPendingRequests: 1` (Istio's circuit-breaking task on an
//!   HTTP/2 service): the first holds the connection, the second waits for its stream as a
//!   pending request, the third overflows 503 `UO` at once.
//! - Four slow requests at once at a cold start: four connections, all at once. Envoy sends
//!   some of them on the first connection before its peer's SETTINGS arrive, has them
//!   refused and retries them; Remora shares a new connection only once it knows its peer's
//!   limit, so each goes out once.
//! - `maxConcurrentStreams: 1` to an origin taking a hundred: the cluster's own limit, as the
//!   peer's above, three requests in flight on three connections.
//! - gRPC: four slow calls multiplexed on one client HTTP/2 connection, each started while the
//!   earlier ones are in flight, run at once on four upstream connections.
//! - `maxRequestsPerConnection: 2`: three requests one after another take two connections.
//!
//! The origins count connections and streams at once; both proxies' cluster statistics
//! (`upstream_cx_total`, `upstream_cx_http2_total`, `upstream_cx_active`, `upstream_cx_overflow`,
//! `upstream_rq_pending_*`, `upstream_cx_max_requests`) must say the same as Envoy's.

use remora_e2e::envoy_xds::{istio_retry_policy, nets_or_skip, Resources};
use remora_e2e::h2_origin::{self, Counts};
use remora_e2e::http_client;
use remora_e2e::sidecars::{self, Sidecar, BACKEND_IP};
use remora_e2e::xds_resources::{eds_cluster, outbound_http_listeners};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const WEB: &str = "web.test.svc.cluster.local";
/// No connection limit (istiod's 4294967295).
const OPEN: &str = "outbound|80|open|web.test.svc.cluster.local";
/// One connection, one pending request.
const ONE: &str = "outbound|80|one|web.test.svc.cluster.local";
/// Two requests per connection.
const LIMITED: &str = "outbound|80|limited|web.test.svc.cluster.local";
/// No connection limit, for a burst at a cold start.
const BURST: &str = "outbound|80|burst|web.test.svc.cluster.local";
/// Its own limit of one stream per connection (`maxConcurrentStreams: 1`), to an origin
/// taking many.
const CAPPED: &str = "outbound|80|capped|web.test.svc.cluster.local";
/// Each cluster's origin, so that each origin's counts are one cluster's, and the streams
/// it takes at once per connection.
const PORTS: [(&str, u16, u32); 6] = [
    (OPEN, 8001, 1),
    (ONE, 8002, 1),
    (LIMITED, 8003, 1),
    (BURST, 8004, 1),
    (CAPPED, 8005, 100),
    (GRPC, 8006, 1),
];
/// A gRPC service (no connection limit), its calls multiplexed on one client connection.
const GRPC: &str = "outbound|80|grpc|web.test.svc.cluster.local";
/// How long an origin holds a slow request.
const HOLD: Duration = Duration::from_millis(1500);
/// Between the starts of requests sent while the earlier ones are in flight: long enough for
/// the earlier one's connection to be up and its SETTINGS read.
const STAGGER: Duration = Duration::from_millis(250);

fn backend_addr(port: u16) -> SocketAddr {
    SocketAddrV4::new(BACKEND_IP, port).into()
}

/// An EDS cluster speaking HTTP/2 upstream, with these circuit-breaker thresholds, common
/// HTTP options and HTTP/2 options.
fn h2_cluster(name: &str, thresholds: Value, common: Value, h2: Value) -> Value {
    let mut c = eds_cluster(name);
    c["circuit_breakers"] = json!({"thresholds": [thresholds]});
    c["typed_extension_protocol_options"] = json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "common_http_protocol_options": common,
            "explicit_http_config": {"http2_protocol_options": h2}}});
    c
}

fn resources() -> Resources {
    let unlimited = json!({"max_connections": 4294967295u32,
        "max_pending_requests": 4294967295u32, "max_requests": 4294967295u32,
        "max_retries": 4294967295u32, "track_remaining": true});
    let one = json!({"max_connections": 1, "max_pending_requests": 1,
        "max_requests": 4294967295u32, "max_retries": 4294967295u32, "track_remaining": true});
    let idle = json!({"idle_timeout": "3600s"});
    let limited = json!({"idle_timeout": "3600s", "max_requests_per_connection": 2});
    let route = |prefix: &str, cluster: &str| {
        json!({"match": {"prefix": prefix},
               "route": {"cluster": cluster, "timeout": "0s", "retry_policy": istio_retry_policy()}})
    };
    let endpoints: Vec<Value> = PORTS
        .iter()
        .map(|(cluster, port, _)| {
            json!({"cluster_name": cluster, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {
                    "address": BACKEND_IP.to_string(), "port_value": port}}},
                 "health_status": "HEALTHY"}]}]})
        })
        .collect();
    Resources {
        listeners: Value::Array(outbound_http_listeners(None)),
        clusters: json!([
            h2_cluster(OPEN, unlimited.clone(), idle.clone(), json!({})),
            h2_cluster(ONE, one, idle.clone(), json!({})),
            h2_cluster(LIMITED, unlimited.clone(), limited, json!({})),
            h2_cluster(BURST, unlimited.clone(), idle.clone(), json!({})),
            h2_cluster(CAPPED, unlimited.clone(), idle.clone(), json!({"max_concurrent_streams": 1})),
            h2_cluster(GRPC, unlimited, idle, json!({})),
            {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}
        ]),
        routes: json!([{"name": "80", "virtual_hosts": [
            {"name": "web.test.svc.cluster.local:80", "domains": [WEB, "web", VIP.to_string()],
             "routes": [route("/open", OPEN), route("/one", ONE), route("/limited", LIMITED), route("/burst", BURST), route("/capped", CAPPED), route("/test.Echo", GRPC)]}]}]),
        endpoints: Value::Array(endpoints),
    }
}

/// A pod whose sidecar is Remora or Envoy, the origins in its peer namespace.
struct World<'n> {
    net: &'n PodNet,
    proxy: Sidecar<'n>,
    /// Each cluster's origin's counts, in the order of [`PORTS`].
    origins: Vec<Arc<Counts>>,
}

fn prepare(net: &PodNet) -> Vec<Arc<Counts>> {
    sidecars::prepare(net);
    PORTS
        .iter()
        .map(|(_, port, limit)| h2_origin::start(&net.peer, backend_addr(*port), *limit, HOLD))
        .collect()
}

impl World<'_> {
    fn origin(&self, cluster: &str) -> &Counts {
        let i = PORTS
            .iter()
            .position(|(c, _, _)| *c == cluster)
            .expect("a cluster of the test");
        &self.origins[i]
    }

    /// One request: its status and the origin connection that answered (from 1).
    fn get(&self, path: &str) -> (u16, Option<String>) {
        let vip = SocketAddr::from((VIP, 80));
        match http_client::get_once(&self.net.pod, vip, WEB, path, &[]) {
            Ok(r) => (r.status, r.header("x-connection").map(str::to_string)),
            Err(e) => panic!(
                "{}: {path}: {e}\n{}",
                self.proxy.name(),
                self.proxy.output()
            ),
        }
    }

    /// Requests to `path`, each started `STAGGER` after the one before, all in flight
    /// together; their statuses in the order sent.
    fn staggered(&self, path: &str, n: usize) -> Vec<u16> {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    if i > 0 {
                        std::thread::sleep(STAGGER);
                    }
                    s.spawn(move || self.get(path).0)
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("request thread"))
                .collect()
        })
    }

    /// A counter or gauge of `cluster` from `/stats` (0 when absent).
    fn stat(&self, cluster: &str, name: &str) -> u64 {
        sidecars::cluster_stat(self.net, &self.proxy, cluster, name)
    }

    fn stats(&self, cluster: &str) -> Stats {
        let s = |name| self.stat(cluster, name);
        Stats {
            cx_total: s("upstream_cx_total"),
            cx_http2_total: s("upstream_cx_http2_total"),
            cx_active: s("upstream_cx_active"),
            cx_overflow: s("upstream_cx_overflow"),
            cx_max_requests: s("upstream_cx_max_requests"),
            rq_total: s("upstream_rq_total"),
            rq_pending_total: s("upstream_rq_pending_total"),
            rq_pending_overflow: s("upstream_rq_pending_overflow"),
        }
    }
}

/// A cluster's statistics, as Envoy names them.
#[derive(Debug, PartialEq, Eq)]
struct Stats {
    cx_total: u64,
    cx_http2_total: u64,
    cx_active: u64,
    cx_overflow: u64,
    cx_max_requests: u64,
    rq_total: u64,
    rq_pending_total: u64,
    rq_pending_overflow: u64,
}

/// What one world made of one scenario.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    statuses: Vec<u16>,
    /// The origin's: connections opened, most streams on one at once, most streams in
    /// flight at once over all, requests answered.
    origin: (usize, usize, usize, usize),
    stats: Stats,
}

fn seen(w: &World, cluster: &str, statuses: Vec<u16>) -> Seen {
    Seen {
        statuses,
        origin: w.origin(cluster).read(),
        stats: w.stats(cluster),
    }
}

/// Four slow requests, each sent while the earlier ones are in flight.
fn spread(w: &World) -> Seen {
    let statuses = w.staggered("/open/slow", 4);
    seen(w, OPEN, statuses)
}

/// Three slow requests, each sent while the earlier ones are in flight, to the cluster
/// allowing one stream per connection.
fn capped(w: &World) -> Seen {
    let statuses = w.staggered("/capped/slow", 3);
    seen(w, CAPPED, statuses)
}

/// Four slow gRPC calls on one HTTP/2 client connection, each started while the earlier ones
/// are in flight: the `grpc-status` of each.
fn grpc(w: &World) -> Seen {
    let vip = SocketAddr::from((VIP, 80));
    let socket = w
        .net
        .pod
        .connect(vip, Duration::from_secs(5))
        .expect("connect");
    socket.set_nonblocking(true).expect("non-blocking");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let statuses = runtime.block_on(async move {
        let socket = tokio::net::TcpStream::from_std(socket).expect("tokio stream");
        let (send, conn) = h2::client::handshake(socket).await.expect("handshake");
        tokio::spawn(conn);
        let mut calls = Vec::new();
        for i in 0..4 {
            if i > 0 {
                tokio::time::sleep(STAGGER).await;
            }
            let send = send.clone();
            calls.push(tokio::spawn(async move {
                let mut send = send.ready().await.expect("ready");
                let call = http::Request::post(format!("http://{WEB}/test.Echo/slow"))
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .body(())
                    .expect("request");
                let (response, mut body) = send.send_request(call, false).expect("send");
                let _ = body.send_data(bytes::Bytes::from_static(&[0; 5]), true);
                let response = tokio::time::timeout(Duration::from_secs(10), response)
                    .await
                    .expect("answered in time")
                    .expect("response");
                let mut body = response.into_body();
                while let Some(chunk) = body.data().await {
                    let chunk = chunk.expect("body");
                    let _ = body.flow_control().release_capacity(chunk.len());
                }
                let trailers = body.trailers().await.expect("trailers").unwrap_or_default();
                trailers
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(u16::MAX)
            }));
        }
        let mut statuses = Vec::new();
        for call in calls {
            statuses.push(call.await.expect("call task"));
        }
        statuses
    });
    seen(w, GRPC, statuses)
}

/// Three slow requests to the cluster allowed one connection and one pending request.
fn breaking(w: &World) -> Seen {
    let statuses = w.staggered("/one/slow", 3);
    seen(w, ONE, statuses)
}

/// Four slow requests at once, at a cold start.
fn burst(w: &World) -> Seen {
    let statuses = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(move || w.get("/burst/slow").0))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("request thread"))
            .collect()
    });
    seen(w, BURST, statuses)
}

/// Three quick requests one after another, two per connection: the connection each came on.
fn retiring(w: &World) -> (Seen, Vec<Option<String>>) {
    let answers: Vec<_> = (0..3).map(|_| w.get("/limited/quick")).collect();
    let statuses = answers.iter().map(|a| a.0).collect();
    let connections = answers.into_iter().map(|a| a.1).collect();
    (seen(w, LIMITED, statuses), connections)
}

fn world<'n>(net: &'n PodNet, envoy: Option<&Path>) -> World<'n> {
    let origins = prepare(net);
    let proxy = match envoy {
        Some(binary) => Sidecar::Envoy(resources().start_envoy(net, binary)),
        None => Sidecar::Remora(resources().start_remora(net)),
    };
    World {
        net,
        proxy,
        origins,
    }
}

#[test]
fn http2_connections_at_the_peers_stream_limit_are_added_as_envoy_adds_them() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let envoy = world(&nets.1, Some(&binary));
    let remora = world(&nets.0, None);
    let scenarios = [
        ("spread", spread as fn(&World) -> Seen),
        ("breaking", breaking),
        ("capped", capped),
        ("grpc", grpc),
    ];
    for (name, scenario) in scenarios {
        let expected = scenario(&envoy);
        let got = scenario(&remora);
        eprintln!("{name}: envoy {expected:?}\n{name}: remora {got:?}");
        assert_eq!(
            got,
            expected,
            "{name}:\nremora:\n{}\nenvoy:\n{}",
            remora.proxy.output(),
            envoy.proxy.output()
        );
    }
    // Envoy itself, as the module says: what the comparison above holds Remora to.
    let open = envoy.origin(OPEN).read();
    assert_eq!(open.0, 4, "envoy: one connection per request in flight");
    assert_eq!(open.1, 1, "envoy: never past the origin's limit");
    assert_eq!(open.2, 4, "envoy: all four at once");
    let one = envoy.origin(ONE).read();
    assert_eq!(one.0, 1, "envoy: max_connections 1");
    let capped = envoy.origin(CAPPED).read();
    assert_eq!(capped.0, 3, "envoy: maxConcurrentStreams 1");
    let grpc = envoy.origin(GRPC).read();
    assert_eq!((grpc.0, grpc.2), (4, 4), "envoy: four calls at once");

    // A burst at a cold start: the same connections, each stream at once.
    let (expected, got) = (burst(&envoy), burst(&remora));
    eprintln!("burst: envoy {expected:?}\nburst: remora {got:?}");
    let same = |s: &Seen| {
        (
            s.statuses.clone(),
            s.origin,
            s.stats.cx_total,
            s.stats.cx_active,
        )
    };
    assert_eq!(same(&got), same(&expected), "burst");
    assert_eq!(
        got.origin,
        (4, 1, 4, 4),
        "remora: one connection per request, all at once"
    );
    // Envoy sends some of them on the first connection before its SETTINGS come, which the
    // origin refuses, and retries them (how many varies): Remora waits for the SETTINGS and
    // sends each once.
    assert_eq!(got.stats.rq_total, 4, "remora: {got:?}");

    let (expected, on_envoy) = retiring(&envoy);
    let (got, on_remora) = retiring(&remora);
    eprintln!("retiring: envoy {expected:?} {on_envoy:?}\nretiring: remora {got:?} {on_remora:?}");
    assert_eq!(got, expected, "retiring");
    assert_eq!(on_remora, on_envoy, "the connection each request came on");
}
