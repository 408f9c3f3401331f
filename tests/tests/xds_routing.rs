//! Routing by xDS resources from files (`xds.resources_dir`), end to end: service VIPs that
//! exist only in the resources, reached through the capture rules, balanced per request over
//! one keep-alive client connection (HTTP) and per connection (TCP), with Envoy's answers when
//! the route or cluster is missing.

use remora_e2e::peer::{self, curl, curl_ok, Server};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// Bound on one curl run.
const CURL_TIME: Duration = Duration::from_secs(20);
/// The HTTP service's VIP, known only to the resources.
const HTTP_VIP: &str = "10.96.0.10";
/// The TCP service's VIP and port.
const TCP_VIP: &str = "10.96.0.20:9000";
const CLUSTER: &str = "outbound|80||web.test.svc.cluster.local";
const TCP_CLUSTER: &str = "outbound|9000||echo.test.svc.cluster.local";

fn eds_cluster(name: &str) -> Value {
    json!({"name": name, "type": "EDS", "connect_timeout": "2s", "lb_policy": "LEAST_REQUEST",
           "eds_cluster_config": {"eds_config": {"ads": {}}, "service_name": name}})
}

fn assignment(name: &str, endpoints: &[SocketAddr]) -> Value {
    let lb: Vec<Value> = endpoints
        .iter()
        .map(|a| {
            json!({"endpoint": {"address": {"socket_address": {
            "address": a.ip().to_string(), "port_value": a.port()}}},
            "health_status": "HEALTHY"})
        })
        .collect();
    json!({"cluster_name": name, "endpoints": [{"lb_endpoints": lb}]})
}

/// istiod's shape: `0.0.0.0_80` with an HCM and RDS `80`, `10.96.0.20_9000` with tcp_proxy.
fn write_resources(dir: &Path, web: &[SocketAddr], echo: SocketAddr) {
    let listeners = json!([
        {"name": "0.0.0.0_80", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
         "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "outbound_0.0.0.0_80",
            "rds": {"config_source": {"ads": {}}, "route_config_name": "80"},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]},
        {"name": "10.96.0.20_9000", "address": {"socket_address": {"address": "10.96.0.20", "port_value": 9000}},
         "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": TCP_CLUSTER, "cluster": TCP_CLUSTER}}]}]}
    ]);
    let routes = json!([{"name": "80", "ignore_port_in_host_matching": true, "virtual_hosts": [{
    "name": "web.test.svc.cluster.local:80",
    "domains": ["web.test.svc.cluster.local", "web", HTTP_VIP],
    "routes": [
        {"match": {"path": "/missing"}, "route": {"cluster": "outbound|80||nowhere.test.svc.cluster.local"}},
        {"match": {"prefix": "/"}, "route": {"cluster": CLUSTER}}
    ]}]}]);
    let clusters = json!([eds_cluster(CLUSTER), eds_cluster(TCP_CLUSTER)]);
    let endpoints = json!([assignment(CLUSTER, web), assignment(TCP_CLUSTER, &[echo])]);
    for (file, value) in [
        ("listeners.json", listeners),
        ("routes.json", routes),
        ("clusters.json", clusters),
        ("endpoints.json", endpoints),
    ] {
        std::fs::write(dir.join(file), value.to_string()).expect("write a resource file");
    }
}

#[test]
fn a_vip_known_only_to_xds_is_balanced_per_request_over_one_connection() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    // The VIPs exist nowhere: a route lets the application's connect reach the capture rules.
    let out = net
        .pod
        .command("ip")
        .args(["route", "add", "default", "dev", "eth0"])
        .output()
        .expect("ip route");
    assert!(out.status.success(), "{out:?}");
    let servers: Vec<Server> = (1..=3)
        .map(|i| Server::http(&net.peer, net.peer_addr(8080 + i), &format!("endpoint-{i}")))
        .collect();
    let echo = Server::echo(&net.peer, net.peer_addr(9000));
    let dir = net.binary().make_dir("xds");
    let web: Vec<SocketAddr> = servers.iter().map(Server::addr).collect();
    write_resources(&dir, &web, echo.addr());
    let remora = net
        .remora()
        .config(&format!(
            "access_log:\n  enabled: true\nxds:\n  resources_dir: {}\n",
            dir.display()
        ))
        .start_ready();

    // Thirty requests on one keep-alive connection: every endpoint answers, one connect.
    let url = format!("http://{HTTP_VIP}/");
    let mut args = vec!["-w", "\n%{num_connects}\n"];
    args.extend(std::iter::repeat_n(url.as_str(), 30));
    let out = curl(&net.pod, &args, CURL_TIME);
    let text = curl_ok(&out, "30 requests to the VIP");
    let lines: Vec<&str> = text.lines().collect();
    let answered: BTreeSet<&str> = lines.iter().step_by(2).copied().collect();
    let connects: u32 = lines
        .iter()
        .skip(1)
        .step_by(2)
        .map(|n| n.parse::<u32>().expect("num_connects"))
        .sum();
    assert_eq!(
        answered,
        BTreeSet::from(["endpoint-1", "endpoint-2", "endpoint-3"]),
        "{text}\n{}",
        remora.stderr()
    );
    assert_eq!(connects, 1, "the client's connection was kept: {text}");

    // A route to a cluster that does not exist: 503 NC. No virtual host for the Host: 404 NR.
    let (status, _) = peer::curl_status(
        &net.pod,
        &[&format!("http://{HTTP_VIP}/missing")],
        CURL_TIME,
    );
    assert_eq!(status, 503);
    remora.wait_for_access_log("\"GET /missing HTTP/1.1\" 503 NC");
    let (status, _) = peer::curl_status(
        &net.pod,
        &["-H", "Host: elsewhere", &format!("http://{HTTP_VIP}/nr")],
        CURL_TIME,
    );
    assert_eq!(status, 404);
    remora.wait_for_access_log("\"GET /nr HTTP/1.1\" 404 NR");

    // TCP through tcp_proxy to the EDS cluster's endpoint.
    let tcp_vip: SocketAddr = TCP_VIP.parse().expect("addr");
    let data = peer::pattern(64 * 1024);
    let back = peer::echo_exchange(&net.pod, tcp_vip, &data).expect("TCP through the VIP");
    peer::assert_same_bytes("echo through the xDS TCP route", &data, &back);
    assert_eq!(echo.peers().len(), 1);
    drop(remora);
}
