//! Envoy's HTTP connection manager statistics (`http.<stat_prefix>.downstream_*`, and the
//! listener's copies of the answers, `listener.<address>.http.<stat_prefix>.downstream_rq_*`),
//! through Remora and through a real Envoy 1.40 given the same resources and the same clients:
//! the same counts, names and Prometheus samples (under Istio's tags).
//!
//! The connections are counted, as in Envoy, on the listener `virtualOutbound` hands them to
//! (`listener.0.0.0.0_80.downstream_cx_*`), not on `virtualOutbound`'s.
//!
//! The traffic on istiod's outbound listener `0.0.0.0_80`: HTTP/1.1 requests on connections of
//! their own (answered 200 by the backend, 200 by a direct response, 503 by a refusing
//! endpoint, 404 for a host no route takes), two on one keep-alive connection, and one over
//! h2c (HTTP/2 with prior knowledge).

use remora_e2e::backend;
use remora_e2e::envoy_xds::{istio_stats_config, nets_or_skip, Resources};
use remora_e2e::http_client::{Client, Response};
use remora_e2e::peer::{self, Server};
use remora_e2e::sidecars::{self, Sidecar, BACKEND_IP};
use remora_e2e::stat_deltas::{self, prometheus_samples, Stats};
use remora_e2e::xds_resources::{eds_cluster, outbound_http_listeners};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const WEB: &str = "web.test.svc.cluster.local";
const LIVE_PORT: u16 = 8001;
/// Nothing listens here.
const DEAD_PORT: u16 = 8009;
const LIVE: &str = "outbound|80||web.test.svc.cluster.local";
const DEAD: &str = "outbound|80|dead|web.test.svc.cluster.local";
/// A cluster no CDS update has.
const GONE: &str = "outbound|80|gone|web.test.svc.cluster.local";
/// The origin the cors policy allows.
const ORIGIN: &str = "http://app.test";
/// The connection manager's prefix on `0.0.0.0_80`, and the listener's.
const HCM: &str = "http.outbound_0.0.0.0_80.";
const LISTENER: &str = "listener.0.0.0.0_80.http.outbound_0.0.0.0_80.";
/// Remora's client connections idle for 1 to 2 s are closed.
const IDLE_CONFIG: &str = "http:\n  idle_timeout: 1s\n";

fn resources() -> Resources {
    let endpoint = |port: u16| {
        json!({"endpoint": {"address": {"socket_address": {
            "address": BACKEND_IP.to_string(), "port_value": port}}}})
    };
    let route = |prefix: &str, cluster: &str| json!({"match": {"prefix": prefix}, "route": {"cluster": cluster, "timeout": "0s"}});
    let fault = |mut fault: Value| {
        fault["@type"] =
            json!("type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault");
        json!({"envoy.filters.http.fault": fault})
    };
    let abort = json!({"abort": {"http_status": 418, "percentage": {"numerator": 100}}});
    let mut upgrade_off = route("/upgrade", LIVE);
    upgrade_off["route"]["upgrade_configs"] =
        json!([{"upgrade_type": "websocket", "enabled": false}]);
    // Envoy's connection manager refuses the upgrade before its filters: the fault is not
    // injected, the route's edits are made.
    upgrade_off["typed_per_filter_config"] = fault(abort.clone());
    upgrade_off["response_headers_to_add"] =
        json!([{"header": {"key": "x-route", "value": "upgrade"}}]);
    let mut aborted = route("/abort", LIVE);
    aborted["typed_per_filter_config"] = fault(abort);
    let mut delayed = route("/delay", LIVE);
    delayed["typed_per_filter_config"] =
        fault(json!({"delay": {"fixed_delay": "0.01s", "percentage": {"numerator": 100}}}));
    let mut cors = route("/cors", LIVE);
    cors["typed_per_filter_config"] = json!({"envoy.filters.http.cors": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy",
        "allow_origin_string_match": [{"exact": ORIGIN}], "allow_methods": "GET"}});
    // istiod's filters before the router on an outbound connection manager (fault, cors), and
    // its upgrades (websocket).
    let mut listeners = outbound_http_listeners(None);
    let manager = &mut listeners[1]["filter_chains"][0]["filters"][0]["typed_config"];
    manager["upgrade_configs"] = json!([{"upgrade_type": "websocket"}]);
    let filters = &mut manager["http_filters"];
    if let Some(filters) = filters.as_array_mut() {
        for name in ["cors", "fault"] {
            filters.insert(
                0,
                json!({"name": format!("envoy.filters.http.{name}"), "typed_config": {
                "@type": format!("type.googleapis.com/envoy.extensions.filters.http.{name}.v3.{}",
                    if name == "cors" { "Cors" } else { "HTTPFault" })}}),
            );
        }
    }
    Resources {
        listeners: Value::Array(listeners),
        clusters: json!([eds_cluster(LIVE), eds_cluster(DEAD),
            {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]),
        routes: json!([{"name": "80", "virtual_hosts": [{"name": "web.test.svc.cluster.local:80",
            "domains": [WEB, VIP.to_string()], "routes": [
                {"match": {"prefix": "/direct"},
                 "direct_response": {"status": 200, "body": {"inline_string": "here"}}},
                {"match": {"prefix": "/redirect"}, "redirect": {"path_redirect": "/elsewhere"}},
                route("/dead", DEAD), route("/nocluster", GONE), aborted, delayed, cors,
                upgrade_off, route("/", LIVE)]}]}]),
        endpoints: json!([
            {"cluster_name": LIVE, "endpoints": [{"lb_endpoints": [endpoint(LIVE_PORT)]}]},
            {"cluster_name": DEAD, "endpoints": [{"lb_endpoints": [endpoint(DEAD_PORT)]}]}
        ]),
    }
}

struct World<'n> {
    net: &'n PodNet,
    proxy: Sidecar<'n>,
    _live: Server,
}

impl World<'_> {
    /// The connection manager's and its listener's statistics.
    fn stats(&self) -> Stats {
        stat_deltas::stats(self.net, self.proxy.admin_port(), |name| {
            name.starts_with(HCM)
                || name.starts_with(LISTENER)
                || name.starts_with("listener.0.0.0.0_80.downstream_cx_")
                || name.starts_with("listener.0.0.0.0_15001.downstream_cx_")
                || name == format!("cluster.{LIVE}.upstream_cx_total")
                || name == format!("cluster.{LIVE}.upstream_cx_http1_total")
        })
    }

    fn get(&self, host: &str, path: &str) -> u16 {
        sidecars::answer(
            self.net,
            &self.proxy,
            SocketAddr::from((VIP, 80)),
            host,
            path,
            &[],
        )
        .0
    }

    /// The test's clients, one after another; the statuses they saw.
    fn traffic(&self) -> Vec<u16> {
        // No route for this one: answered by the HTTP/1.1 fast path, which, as Envoy, says it
        // closes the connection the client asked to close.
        let no_route =
            self.send(b"GET / HTTP/1.1\r\nHost: elsewhere.test\r\nConnection: close\r\n\r\n");
        assert_eq!(
            no_route.header("connection"),
            Some("close"),
            "{}",
            self.proxy.name()
        );
        let mut statuses = vec![
            self.get(WEB, "/ok"),
            self.get(WEB, "/direct"),
            self.get(WEB, "/dead"),
            no_route.status,
        ];
        let url = |path: &str| format!("http://{VIP}{path}");
        let (keep_alive, urls) = (url("/one"), url("/two"));
        let (status, _) = peer::curl_status(
            &self.net.pod,
            &["-sS", "-H", &format!("Host: {WEB}"), &keep_alive, &urls],
            Duration::from_secs(5),
        );
        statuses.push(status);
        let (status, _) = peer::curl_status(
            &self.net.pod,
            &[
                "-sS",
                "--http2-prior-knowledge",
                "-H",
                &format!("Host: {WEB}"),
                &url("/h2"),
            ],
            Duration::from_secs(5),
        );
        statuses.push(status);
        statuses.extend([
            self.get(WEB, "/redirect"),
            self.get(WEB, "/nocluster"),
            self.get(WEB, "/abort"),
            self.get(WEB, "/delay"),
        ]);
        let preflight = format!(
            "OPTIONS /cors HTTP/1.1\r\nHost: {WEB}\r\nOrigin: {ORIGIN}\r\n\
             Access-Control-Request-Method: GET\r\n\r\n"
        );
        statuses.push(self.send(preflight.as_bytes()).status);
        // A target that is no path: the connection manager's 404, before any route.
        let asterisk = format!("OPTIONS * HTTP/1.1\r\nHost: {WEB}\r\n\r\n");
        statuses.push(self.send(asterisk.as_bytes()).status);
        statuses
    }

    /// `request` sent as it is on a connection of its own, and its response.
    fn send(&self, request: &[u8]) -> Response {
        let answer = Client::connect(&self.net.pod, SocketAddr::from((VIP, 80)))
            .and_then(|mut client| client.send_raw(request));
        match answer {
            Ok(r) => r,
            Err(e) => panic!("{}: {e}\n{}", self.proxy.name(), self.proxy.output()),
        }
    }

    /// An upgrade of `kind` to `path`: the status, the route's header, and whether the
    /// connection is to be closed.
    fn upgrade(&self, path: &str, kind: &str) -> (u16, Option<String>, Option<String>) {
        let r = self.send(
            format!(
                "GET {path} HTTP/1.1\r\nHost: {WEB}\r\nConnection: Upgrade\r\n\
                 Upgrade: {kind}\r\n\r\n"
            )
            .as_bytes(),
        );
        let header = |name: &str| r.header(name).map(str::to_string);
        (r.status, header("x-route"), header("connection"))
    }

    /// The statistics once every connection of the traffic has ended (the proxy learns of a
    /// client's close a moment after the client).
    fn settled(&self) -> Stats {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stats = self.stats();
            let active = |n: &str| stats.get(&format!("{HCM}{n}")).copied().unwrap_or(-1);
            let on_listener = stats
                .get("listener.0.0.0.0_80.downstream_cx_active")
                .copied();
            let idle = active("downstream_cx_active") == 0
                && active("downstream_rq_active") == 0
                && on_listener == Some(0);
            if idle || Instant::now() > deadline {
                return stats;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn world<'n>(net: &'n PodNet, envoy: Option<&std::path::Path>) -> World<'n> {
    sidecars::prepare(net);
    let live = backend::start(
        &net.peer,
        SocketAddrV4::new(BACKEND_IP, LIVE_PORT).into(),
        "live",
    );
    let proxy = match envoy {
        // An idle timeout short enough to see one close (Remora's is the config file's).
        None => Sidecar::Remora(resources().start_remora_with(net, IDLE_CONFIG).0),
        Some(binary) => {
            Sidecar::Envoy(resources().start_envoy_with(net, binary, istio_stats_config))
        }
    };
    World {
        net,
        proxy,
        _live: live,
    }
}

/// The Prometheus samples of the connection manager's requests and connections, and of the
/// listener's copies, which Istio's tags name (the class as `response_code_class`, the
/// listener as `listener_address`).
fn samples(w: &World) -> Vec<String> {
    let port = w.proxy.admin_port();
    let mut samples = Vec::new();
    for family in [
        "envoy_http_outbound_0_0_0_0_80_downstream_rq",
        "envoy_http_outbound_0_0_0_0_80_downstream_cx_total",
        "envoy_listener_http_outbound_0_0_0_0_80_downstream_rq",
    ] {
        samples.extend(prometheus_samples(w.net, port, family));
    }
    samples
}

/// The metric a sample or `# TYPE` line is of.
fn metric(sample: &str) -> &str {
    let name = sample.strip_prefix("# TYPE ").unwrap_or(sample);
    name.split(['{', ' ']).next().unwrap_or(name)
}

#[test]
fn connection_manager_statistics_are_counted_as_envoy_counts_them() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = (world(&nets.0, None), world(&nets.1, Some(&binary)));
    let mut seen = Vec::new();
    for w in [&envoy, &remora] {
        let before = w.stats();
        let statuses = w.traffic();
        assert_eq!(
            statuses,
            [200, 200, 503, 404, 200, 200, 301, 503, 418, 200, 200, 404],
            "{}:\n{}",
            w.proxy.name(),
            w.proxy.output()
        );
        // A WebSocket upgrade its route turns off; one of a type the connection manager's
        // `upgrade_configs` (istiod's: websocket) do not name; one they do, which goes on
        // (the backend answers it as a plain request).
        assert_eq!(
            w.upgrade("/upgrade", "websocket"),
            (403, Some("upgrade".into()), Some("close".into())),
            "{}",
            w.proxy.name()
        );
        assert_eq!(
            w.upgrade("/other", "foo"),
            (403, None, Some("close".into())),
            "{}",
            w.proxy.name()
        );
        assert_eq!(w.upgrade("/ws", "WebSocket").0, 200, "{}", w.proxy.name());
        let after = w.settled();
        seen.push((before, after, samples(w)));
    }
    let (envoy_before, envoy_after, envoy_samples) = &seen[0];
    let (ours_before, ours_after, our_samples) = &seen[1];
    // Every name Remora keeps is one of Envoy's, existing from the start.
    let missing: Vec<&String> = ours_after
        .keys()
        .filter(|n| !envoy_after.contains_key(*n))
        .collect();
    assert!(missing.is_empty(), "names Envoy does not have: {missing:?}");
    for name in [
        "downstream_rq_total",
        "downstream_cx_http2_total",
        "downstream_rq_5xx",
    ] {
        assert!(
            ours_before.contains_key(&format!("{HCM}{name}")),
            "{name}: {ours_before:?}"
        );
    }
    assert!(ours_before.contains_key(&format!("{LISTENER}downstream_rq_2xx")));
    // The same counts, the bytes written aside: the answers' headers differ (each proxy's
    // `x-envoy-upstream-service-time`, HTTP/2 settings), so those only have to be there.
    let change = |before: &Stats, after: &Stats| -> Stats {
        after
            .iter()
            .filter(|(name, _)| ours_after.contains_key(*name))
            .map(|(name, v)| (name.clone(), v - before.get(name).copied().unwrap_or(0)))
            .collect()
    };
    let (mut expected, mut got) = (
        change(envoy_before, envoy_after),
        change(ours_before, ours_after),
    );
    // Every connection opened to the HTTP/1.1 cluster counts as HTTP/1.1, whichever engine
    // opened it (Remora's fast path and hyper's path each pool their own connections, so
    // Remora may open one more than Envoy here: compared apart).
    let cluster = |stat: &str| format!("cluster.{LIVE}.{stat}");
    for (who, changes) in [("envoy", &mut expected), ("remora", &mut got)] {
        let total = changes.remove(&cluster("upstream_cx_total"));
        let http1 = changes.remove(&cluster("upstream_cx_http1_total"));
        assert!(
            total > Some(0) && http1 == total,
            "{who}: {total:?} {http1:?}"
        );
    }
    let sent = format!("{HCM}downstream_cx_tx_bytes_total");
    let (envoys_sent, ours_sent) = (expected.remove(&sent), got.remove(&sent));
    assert!(
        envoys_sent > Some(0) && ours_sent > Some(0),
        "{envoys_sent:?} {ours_sent:?}"
    );
    // What Envoy's router counted: every request but the fault's abort, the cors filter's
    // preflight answer and the connection manager's refused upgrade; the redirect is a
    // direct response too.
    for (name, count) in [
        ("downstream_rq_total", 16),
        ("downstream_rq_non_relative_path", 1),
        ("rq_total", 11),
        ("no_route", 1),
        ("no_cluster", 1),
        ("rq_direct_response", 2),
        ("downstream_rq_ws_on_non_ws_route", 2),
        ("fault.aborts_injected", 1),
        ("fault.delays_injected", 1),
        ("cors.origin_valid", 1),
    ] {
        assert_eq!(
            expected.get(&format!("{HCM}{name}")),
            Some(&count),
            "{name}"
        );
    }
    // Envoy counts the connections on the listener virtualOutbound handed them to.
    assert_eq!(
        expected.get("listener.0.0.0.0_80.downstream_cx_total"),
        Some(&15)
    );
    assert_eq!(
        expected.get("listener.0.0.0.0_15001.downstream_cx_total"),
        Some(&0)
    );
    assert_eq!(
        got,
        expected,
        "remora:\n{}",
        sidecars::admin(remora.net, &remora.proxy, "/stats")
    );
    // Envoy's samples of the metrics Remora has: the same names, labels and values.
    let ours: std::collections::BTreeSet<&str> = our_samples.iter().map(|s| metric(s)).collect();
    assert!(
        ours.contains("envoy_listener_http_outbound_0_0_0_0_80_downstream_rq"),
        "{ours:?}"
    );
    let envoys: Vec<&String> = envoy_samples
        .iter()
        .filter(|s| ours.contains(metric(s)))
        .collect();
    assert_eq!(our_samples.iter().collect::<Vec<_>>(), envoys);
}

/// A kept-alive connection left idle is closed by the connection manager and counted as
/// Envoy counts it (`downstream_cx_idle_timeout`; Remora's idle timeout is the config file's,
/// Envoy's the connection manager's `common_http_protocol_options`, which istiod does not set:
/// so Remora alone, with a short one).
#[test]
fn an_idle_connection_closed_is_counted_on_its_connection_manager() {
    use std::io::{Read, Write};
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let w = world(&net, None);
    let idle = format!("{HCM}downstream_cx_idle_timeout");
    let before = w.stats();
    assert_eq!(before.get(&idle), Some(&0), "{before:?}");
    let mut s = peer::connect(&net.pod, SocketAddr::from((VIP, 80))).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(s, "GET /direct HTTP/1.1\r\nHost: {WEB}\r\n\r\n").expect("request");
    let mut answer = [0u8; 4096];
    let n = s.read(&mut answer).expect("answer");
    assert!(
        answer[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&answer[..n])
    );
    // Nothing more: the proxy closes the connection within twice its idle timeout.
    let started = Instant::now();
    let closed = matches!(s.read(&mut answer), Ok(0));
    assert!(closed, "not closed after {:?}", started.elapsed());
    let after = w.settled();
    assert_eq!(after.get(&idle), Some(&1), "{after:?}");
    assert_eq!(after.get(&format!("{HCM}downstream_cx_destroy")), Some(&1));
}

/// The fast path's upstream connections (a route that edits nothing, no retry policy: Remora's
/// own HTTP/1.1 exchange) end as Envoy's pool ends them: a backend closing a kept-alive
/// connection after its answer, and one resetting the connection a request is on, change the
/// cluster's connection and request counts as they change Envoy's. (Envoy sees an idle
/// connection's close at once; Remora's fast path at its pool's next sweep, within a second.)
#[test]
fn the_fast_paths_upstream_connections_end_as_envoys_do() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora, envoy) = (world(&nets.0, None), world(&nets.1, Some(&binary)));
    let prefix = format!("cluster.{LIVE}.");
    let cluster = |w: &World| {
        stat_deltas::stats(w.net, w.proxy.admin_port(), |name| {
            name.strip_prefix(&prefix).is_some_and(|stat| {
                stat.starts_with("upstream_cx_") && !stat.ends_with("_bytes_total")
                    || stat.starts_with("upstream_rq_")
            })
        })
    };
    let changes = |w: &World, before: &Stats| -> Vec<String> {
        stat_deltas::delta(before, &cluster(w))
            .into_iter()
            .map(|d| d.replacen(&prefix, "", 1))
            // The time histograms Envoy keeps as counters on /stats (`upstream_cx_length_ms`…)
            // are left out.
            .filter(|d| !d.contains("_ms"))
            .collect()
    };
    // Envoy's, once its pool has seen the backend's close; then Remora's, once they are the
    // same or the sweep of its idle connections (every second) must have come.
    let case = |w: &World, path: &str, like: Option<&[String]>| -> (u16, Vec<String>) {
        let before = cluster(w);
        let status = w.get(WEB, path);
        std::thread::sleep(backend::CLOSE_AFTER * 4);
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let now = changes(w, &before);
            if like.is_none_or(|like| like == now) || Instant::now() > deadline {
                return (status, now);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    for (path, status, must) in [
        ("/flaky/close/1", 200, "upstream_cx_destroy_remote +1"),
        (
            "/flaky/reset/2",
            503,
            "upstream_cx_destroy_remote_with_active_rq +1",
        ),
    ] {
        let expected = case(&envoy, path, None);
        let got = case(&remora, path, Some(&expected.1));
        assert_eq!(expected.0, status, "envoy {path}: {:?}", expected.1);
        assert!(
            expected.1.iter().any(|d| d == must),
            "envoy {path}: {expected:?}"
        );
        assert_eq!(
            got,
            expected,
            "{path}:\n{}",
            sidecars::admin(remora.net, &remora.proxy, "/stats")
        );
    }
}
