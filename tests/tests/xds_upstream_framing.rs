//! Upstream HTTP/1.1 responses whose framing Envoy's codec refuses (a length twice or beside a
//! transfer coding, a coding other than chunked, a 204 announcing a body, no status line) and
//! the bodiless answers it trims (a 204's zero length, a 304's coding), through Remora and a
//! real Envoy 1.40 given istiod's outbound resources: the same status, headers and body to the
//! client, on the HTTP/1.1 fast path (a plain route) and on hyper's path (a route that edits a
//! header).

use remora_e2e::envoy_xds::{nets_or_skip, Resources};
use remora_e2e::http_client::Client;
use remora_e2e::service::{peer_program, Service};
use remora_e2e::sidecars::{self, Sidecar, BACKEND_IP};
use remora_e2e::xds_resources::{eds_cluster, outbound_http_listeners};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const WEB: &str = "web.test.svc.cluster.local";
const CLUSTER: &str = "outbound|80||web.test.svc.cluster.local";
const PORT: u16 = 8001;
const PATHS: [&str; 10] = [
    "/ok",
    "/204-length-0",
    "/204-body",
    "/204-chunked",
    "/304-chunked",
    "/length-and-chunked",
    "/length-twice",
    "/lengths-differ",
    "/gzip-coded",
    "/no-status",
];

fn resources() -> Resources {
    Resources {
        listeners: Value::Array(outbound_http_listeners(None)),
        clusters: json!([eds_cluster(CLUSTER),
            {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]),
        routes: json!([{"name": "80", "virtual_hosts": [{"name": "web", "domains": [WEB], "routes": [
            {"match": {"prefix": "/hyper/"}, "route": {"cluster": CLUSTER, "timeout": "0s",
                "prefix_rewrite": "/"},
             "request_headers_to_add": [{"header": {"key": "x-edited", "value": "1"}}]},
            {"match": {"prefix": "/"}, "route": {"cluster": CLUSTER, "timeout": "0s"}}]}]}]),
        endpoints: json!([{"cluster_name": CLUSTER, "endpoints": [{"lb_endpoints": [{"endpoint":
            {"address": {"socket_address": {"address": BACKEND_IP.to_string(), "port_value": PORT}}}}]}]}]),
    }
}

/// What a client saw: the status, the headers but those each proxy writes its own way (names
/// lowercased), and the body.
fn seen(net: &PodNet, proxy: &Sidecar<'_>, path: &str) -> String {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {WEB}\r\nConnection: close\r\n\r\n");
    let answer = Client::connect(&net.pod, SocketAddr::from((VIP, 80)))
        .and_then(|mut c| c.send_raw(request.as_bytes()));
    let r = match answer {
        Ok(r) => r,
        Err(e) => panic!("{}: {path}: {e}\n{}", proxy.name(), proxy.output()),
    };
    let mut headers: Vec<String> = r
        .headers
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "date" | "server" | "x-envoy-upstream-service-time"
            )
        })
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    headers.sort();
    format!("{} {headers:?} {:?}", r.status, r.text())
}

fn answers(net: &PodNet, proxy: &Sidecar<'_>) -> Vec<String> {
    let mut all = Vec::new();
    for engine in ["", "/hyper"] {
        for path in PATHS {
            let path = format!("{engine}{path}");
            all.push(format!("{path}: {}", seen(net, proxy, &path)));
        }
    }
    all
}

#[test]
fn upstream_framings_are_refused_or_trimmed_as_envoy_does() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let mut told = Vec::new();
    for (i, net) in [&nets.0, &nets.1].into_iter().enumerate() {
        sidecars::prepare(net);
        let script = peer_program("raw_http_upstream.py");
        let _upstream = Service::start(
            &net.peer,
            "python3",
            &[
                &script.to_string_lossy(),
                &BACKEND_IP.to_string(),
                &PORT.to_string(),
            ],
            SocketAddrV4::new(BACKEND_IP, PORT).into(),
        );
        let proxy = match i {
            0 => Sidecar::Remora(resources().start_remora_with(net, "").0),
            _ => Sidecar::Envoy(resources().start_envoy(net, &binary)),
        };
        told.push(answers(net, &proxy));
    }
    let (remora, envoy) = (&told[0], &told[1]);
    // The refusals are Envoy's 502, on both of Remora's engines.
    let refused = envoy.iter().filter(|a| a.contains(": 502 ")).count();
    assert_eq!(refused, 14, "{envoy:#?}");
    for (ours, theirs) in remora.iter().zip(envoy) {
        assert_eq!(ours, theirs);
    }
}
