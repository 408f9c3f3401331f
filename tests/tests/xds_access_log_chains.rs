//! Access logs per chain, as a Telemetry resource with `match: {mode: CLIENT}` and one with
//! `mode: SERVER` give them (istiod writes the first provider's logger into outbound chains
//! only, the second's into inbound chains only), against Envoy 1.40 with the same resources
//! and traffic. Outbound chains log to file A in one format, inbound chains to file B in
//! another; one outbound HTTP chain carries both loggers (two providers on one chain); one TCP
//! chain and one HTTP chain carry none; a listener none of whose chains takes a connection logs
//! it with its own loggers, each behind its `response_flag_filter` (`NR` to A: written; `UF`
//! to B: not). Each file must hold the same lines from both proxies, and nothing from the
//! chains without a logger.

use remora_e2e::access_logs::{lines, log_file, wait_for_lines};
use remora_e2e::envoy_xds::{nets_or_skip, Resources};
use remora_e2e::peer::{self, curl_status, Server};
use remora_e2e::xds_resources::{eds_cluster, endpoint, inbound_cluster};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

const CURL_TIME: Duration = Duration::from_secs(20);
const HTTP_VIP: &str = "10.96.0.10";
const HOST: &str = "web.test.svc.cluster.local";
const WEB: &str = "outbound|80||web.test.svc.cluster.local";
const ECHO: &str = "outbound|9000||echo.test.svc.cluster.local";
/// TCP out, logged to A.
const TCP_LOGGED: &str = "10.96.0.20:9000";
/// TCP out, on a chain without a logger.
const TCP_SILENT: &str = "10.96.0.50:9000";
/// A listener whose only chain takes no connection (`NR`).
const NO_CHAIN: &str = "10.96.0.60:9000";
/// HTTP out on port 80: logged to A; 8080: to A and B; 81: not logged.
const PORTS: [u16; 3] = [80, 8080, 81];
/// The pod's own ports, reached inbound: TCP, HTTP.
const INBOUND_TCP: u16 = 9100;
const INBOUND_HTTP: u16 = 9200;

/// The client side's format (file A): the request's protocol, status, flags, cluster, where
/// the client was going and a header only this format reads.
const CLIENT_FORMAT: &str = "A %PROTOCOL% %RESPONSE_CODE% %RESPONSE_FLAGS% %UPSTREAM_CLUSTER% %DOWNSTREAM_LOCAL_ADDRESS% %REQ(X-TAG)%\n";
/// The server side's format (file B): bytes, and another header.
const SERVER_FORMAT: &str = "B %PROTOCOL% %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %UPSTREAM_CLUSTER% %REQ(X-OTHER)%\n";

/// A file logger to `path` in `format`, behind a `response_flag_filter` of `flags` if given.
fn logger(path: &Path, format: &str, flags: Option<&str>) -> Value {
    let mut l = json!({"name": "envoy.access_loggers.file", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
        "path": path.to_str().expect("utf-8 path"),
        "log_format": {"text_format_source": {"inline_string": format}}}});
    if let Some(flag) = flags {
        l["filter"] = json!({"response_flag_filter": {"flags": [flag]}});
    }
    l
}

fn router() -> Value {
    json!([{"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}])
}

/// An outbound HTTP listener on `port` (RDS `80`), its connection manager logging to `logs`.
fn http_listener(port: u16, logs: Value) -> Value {
    json!({"name": format!("0.0.0.0_{port}"),
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
        "traffic_direction": "OUTBOUND", "bind_to_port": false,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": format!("outbound_0.0.0.0_{port}"), "access_log": logs,
            "rds": {"config_source": {"ads": {}}, "route_config_name": "80"},
            "http_filters": router()}}]}]})
}

fn tcp_proxy(cluster: &str, logs: Value) -> Value {
    json!({"name": "envoy.filters.network.tcp_proxy", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
        "stat_prefix": cluster, "cluster": cluster, "access_log": logs}})
}

/// An outbound TCP listener for `vip` to the echo service, `chain_match` on its chain, `logs`
/// on its `tcp_proxy` and `listener_logs` on the listener.
fn tcp_listener(vip: &str, chain_match: Value, logs: Value, listener_logs: Value) -> Value {
    let vip: SocketAddr = vip.parse().expect("vip");
    json!({"name": format!("{}_{}", vip.ip(), vip.port()),
        "address": {"socket_address": {"address": vip.ip().to_string(), "port_value": vip.port()}},
        "traffic_direction": "OUTBOUND", "bind_to_port": false, "access_log": listener_logs,
        "filter_chains": [{"filter_chain_match": chain_match, "filters": [tcp_proxy(ECHO, logs)]}]})
}

/// `virtualInbound`: the pod's TCP port through `tcp_proxy`, its HTTP port through a
/// connection manager with an inline route table, both logging to `logs`.
fn virtual_inbound(logs: &Value) -> Value {
    let tcp = format!("inbound|{INBOUND_TCP}||");
    let http = format!("inbound|{INBOUND_HTTP}||");
    json!({"name": "virtualInbound", "traffic_direction": "INBOUND",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
        "listener_filters": [{"name": "envoy.filters.listener.original_dst", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"}}],
        "filter_chains": [
            {"name": format!("0.0.0.0_{INBOUND_TCP}"),
             "filter_chain_match": {"destination_port": INBOUND_TCP, "transport_protocol": "raw_buffer"},
             "filters": [tcp_proxy(&tcp, logs.clone())]},
            {"name": format!("0.0.0.0_{INBOUND_HTTP}"),
             "filter_chain_match": {"destination_port": INBOUND_HTTP, "transport_protocol": "raw_buffer"},
             "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": format!("inbound_0.0.0.0_{INBOUND_HTTP}"), "access_log": logs,
                "route_config": {"name": http, "virtual_hosts": [{"name": "inbound|http",
                    "domains": ["*"], "routes": [{"name": "default", "match": {"prefix": "/"},
                        "route": {"cluster": http, "timeout": "0s"}}]}]},
                "http_filters": router()}}]}]})
}

fn resources(a: &Path, b: &Path, web: SocketAddr, echo: SocketAddr) -> Resources {
    let client = || logger(a, CLIENT_FORMAT, None);
    let server = || logger(b, SERVER_FORMAT, None);
    let routes = json!([{"name": "80", "ignore_port_in_host_matching": true, "virtual_hosts": [{
        "name": "web.test.svc.cluster.local:80", "domains": [HOST, HTTP_VIP],
        "routes": [{"name": "ok", "match": {"prefix": "/"}, "route": {"cluster": WEB, "timeout": "0s"}}]}]}]);
    let listeners = json!([
        http_listener(PORTS[0], json!([client()])),
        http_listener(PORTS[1], json!([client(), server()])),
        http_listener(PORTS[2], json!([])),
        tcp_listener(TCP_LOGGED, json!({}), json!([client()]), json!([])),
        tcp_listener(TCP_SILENT, json!({}), json!([]), json!([])),
        // No connection comes to port 1: every one is `NR`, written by the `NR` logger only.
        tcp_listener(NO_CHAIN, json!({"destination_port": 1}), json!([client()]), json!([
            logger(a, CLIENT_FORMAT, Some("NR")),
            logger(b, SERVER_FORMAT, Some("UF"))])),
        {"name": "virtualOutbound",
         "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
         "use_original_dst": true, "traffic_direction": "OUTBOUND",
         "filter_chains": [{"name": "virtualOutbound-catchall-tcp",
            "filters": [tcp_proxy("BlackHoleCluster", json!([]))]}]},
        virtual_inbound(&json!([server()]))
    ]);
    let assignment = |name: &str, a: SocketAddr| json!({"cluster_name": name, "endpoints": [{"lb_endpoints": [endpoint(a, None)]}]});
    Resources {
        listeners,
        routes,
        clusters: json!([eds_cluster(WEB), eds_cluster(ECHO),
            inbound_cluster(&format!("inbound|{INBOUND_TCP}||")),
            inbound_cluster(&format!("inbound|{INBOUND_HTTP}||")),
            {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]),
        endpoints: json!([assignment(WEB, web), assignment(ECHO, echo)]),
    }
}

/// The traffic, each step waited for in both files (so lines come in this order); the files'
/// lines once it is done.
fn traffic(net: &PodNet, (a, b): (&Path, &Path), output: &dyn Fn() -> String) -> [Vec<String>; 2] {
    let wait = |n_a: usize, n_b: usize| {
        wait_for_lines(a, n_a, output);
        wait_for_lines(b, n_b, output);
    };
    let get = |ns: &remora_e2e::Netns, url: &str| {
        let args = ["-H", "x-tag: t", "-H", "x-other: o", url];
        let (status, _) = curl_status(ns, &args, CURL_TIME);
        assert_eq!(status, 200, "{url}\n{}", output());
    };
    get(&net.pod, &format!("http://{HTTP_VIP}/"));
    wait(1, 0);
    let echo = |ns: &remora_e2e::Netns, addr: SocketAddr, data: &[u8]| {
        let back = peer::echo_exchange(ns, addr, data)
            .unwrap_or_else(|e| panic!("TCP to {addr}: {e}\n{}", output()));
        assert_eq!(back, data);
    };
    echo(&net.pod, TCP_LOGGED.parse().expect("addr"), b"logged");
    wait(2, 0);
    // Two loggers on one chain: a line in each file, each in its format.
    get(&net.pod, &format!("http://{HTTP_VIP}:{}/", PORTS[1]));
    wait(3, 1);
    // Chains without a logger: nothing (a line would be out of order below).
    echo(&net.pod, TCP_SILENT.parse().expect("addr"), b"silent");
    get(&net.pod, &format!("http://{HTTP_VIP}:{}/", PORTS[2]));
    // No chain: the listener's `NR` logger writes it, its `UF` logger does not.
    let _ = peer::echo_exchange(&net.pod, NO_CHAIN.parse().expect("addr"), b"nr");
    wait(4, 1);
    // Inbound: the server side's logger.
    echo(&net.peer, net.pod_addr(INBOUND_TCP), b"inbound!");
    wait(4, 2);
    get(
        &net.peer,
        &format!("http://{}/", net.pod_addr(INBOUND_HTTP)),
    );
    wait(4, 3);
    // Time for a stray line to show.
    std::thread::sleep(Duration::from_millis(500));
    [lines(a), lines(b)]
}

/// The same resources and traffic through Remora, then Envoy: each one's files A and B.
fn remora_then_envoy() -> Option<[[Vec<String>; 2]; 2]> {
    let (binary, nets) = nets_or_skip()?;
    let mut runs = Vec::new();
    for (i, net) in [&nets.0, &nets.1].into_iter().enumerate() {
        net.capture_default();
        net.pod.route_vips();
        let web = Server::http(&net.peer, net.peer_addr(8081), "web");
        let echo = Server::echo(&net.peer, net.peer_addr(9000));
        let _tcp = Server::echo(&net.pod, peer::any_addr(INBOUND_TCP));
        let _http = Server::http(&net.pod, peer::any_addr(INBOUND_HTTP), "pod");
        let (a, b) = (log_file(net, "a.log"), log_file(net, "b.log"));
        let resources = resources(&a, &b, web.addr(), echo.addr());
        let files = (a.as_path(), b.as_path());
        runs.push(if i == 0 {
            let remora = resources.start_remora(net);
            traffic(net, files, &|| remora.stderr())
        } else {
            let envoy = resources.start_envoy(net, &binary);
            traffic(net, files, &|| envoy.logs())
        });
    }
    let envoy = runs.pop()?;
    let remora = runs.pop()?;
    Some([remora, envoy])
}

#[test]
fn each_chain_logs_to_its_own_loggers_as_envoy_does() {
    let Some([remora, envoy]) = remora_then_envoy() else {
        return;
    };
    assert_eq!(remora, envoy, "remora's files A and B, then envoy's");
    let [a, b] = remora;
    assert_eq!(
        a,
        [
            format!("A HTTP/1.1 200 - {WEB} {HTTP_VIP}:80 t"),
            format!("A - 0 - {ECHO} {TCP_LOGGED} -"),
            format!("A HTTP/1.1 200 - {WEB} {HTTP_VIP}:8080 t"),
            format!("A - 0 NR - {NO_CHAIN} -"),
        ]
    );
    assert_eq!(
        b,
        [
            format!("B HTTP/1.1 200 - 0 3 {WEB} o"),
            format!("B - 0 - 8 8 inbound|{INBOUND_TCP}|| -"),
            format!("B HTTP/1.1 200 - 0 3 inbound|{INBOUND_HTTP}|| o"),
        ]
    );
}
