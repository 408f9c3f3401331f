//! The mesh's `accessLogFile` naming a file, end to end: istiod's file access logger on the
//! HTTP connection manager and on `tcp_proxy` pointing at a path other than `/dev/stdout`.
//! Remora appends its lines to that file (opened once, never truncated), opens it again after
//! SIGHUP so a rotated log goes on in a new file, and refuses a listener whose path cannot be
//! opened (as Envoy 1.40 rejects it: `unable to open file`), keeping the previous one. Envoy
//! 1.40 given the same listeners appends its line for the same request to its file too.

use remora_e2e::envoy_xds::{nets_or_skip, Resources, ISTIO_TEXT_FORMAT};
use remora_e2e::peer::{self, curl, curl_ok, Server};
use remora_e2e::xds_resources::{eds_cluster, endpoint};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const CURL_TIME: Duration = Duration::from_secs(20);
const HTTP_VIP: &str = "10.96.0.10";
const TCP_VIP: &str = "10.96.0.20:9000";
const WEB: &str = "outbound|80||web.test.svc.cluster.local";
const ECHO: &str = "outbound|9000||echo.test.svc.cluster.local";

/// istiod's file access logger to `path`.
fn file_log(path: &Path) -> Value {
    json!([{"name": "envoy.access_loggers.file", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
        "path": path.to_str().expect("utf-8 path"),
        "log_format": {"text_format_source": {"inline_string": ISTIO_TEXT_FORMAT}}}}])
}

/// The listeners, each logging to `log`: `0.0.0.0_80` (HCM, RDS `80`) and `10.96.0.20_9000`
/// (tcp_proxy).
fn listeners(log: &Path) -> Value {
    json!([
        {"name": "0.0.0.0_80", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
         "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "outbound_0.0.0.0_80", "access_log": file_log(log),
            "rds": {"config_source": {"ads": {}}, "route_config_name": "80"},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]},
        {"name": "10.96.0.20_9000", "address": {"socket_address": {"address": "10.96.0.20", "port_value": 9000}},
         "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": ECHO, "cluster": ECHO, "access_log": file_log(log)}}]}]}
    ])
}

/// The resources: the listeners logging to `log`, `virtualOutbound` (which hands Envoy's
/// connections to them), the route, and the two services' clusters and endpoints.
fn resources(log: &Path, web: SocketAddr, echo: SocketAddr) -> Resources {
    let routes = json!([{"name": "80", "ignore_port_in_host_matching": true, "virtual_hosts": [{
        "name": "web.test.svc.cluster.local:80", "domains": ["web.test.svc.cluster.local", HTTP_VIP],
        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": WEB, "timeout": "0s"}}]}]}]);
    let assignment = |name: &str, a: SocketAddr| json!({"cluster_name": name, "endpoints": [{"lb_endpoints": [endpoint(a, None)]}]});
    let mut listeners = listeners(log);
    if let Some(all) = listeners.as_array_mut() {
        all.push(json!({"name": "virtualOutbound",
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
            "use_original_dst": true, "traffic_direction": "OUTBOUND",
            "filter_chains": [{"name": "virtualOutbound-catchall-tcp", "filters": [
                {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": "BlackHoleCluster", "cluster": "BlackHoleCluster"}}]}]}));
    }
    Resources {
        listeners,
        routes,
        clusters: json!([eds_cluster(WEB), eds_cluster(ECHO),
            {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]),
        endpoints: json!([assignment(WEB, web), assignment(ECHO, echo)]),
    }
}

fn write_resources(dir: &Path, log: &Path, web: SocketAddr, echo: SocketAddr) {
    resources(log, web, echo).write_for_remora(dir);
}

/// A directory UID 1337 (the proxy) may create files in, as a pod's log volume, holding
/// `access.log` with a line already in it.
fn log_dir(net: &PodNet) -> (std::path::PathBuf, std::path::PathBuf) {
    let logs = net.binary().make_dir("logs");
    std::os::unix::fs::chown(&logs, Some(1337), Some(1337)).expect("chown");
    let log = logs.join("access.log");
    std::fs::write(&log, "before\n").expect("write");
    std::os::unix::fs::chown(&log, Some(1337), Some(1337)).expect("chown");
    (logs, log)
}

/// The file's content, empty when it does not exist.
fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Wait (up to 5 s) for `path` to hold a line containing `needle`.
fn wait_for_line(path: &Path, needle: &str, stderr: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !read(path).contains(needle) {
        assert!(
            Instant::now() < deadline,
            "no line with {needle:?} in {}:\n{}\nremora stderr:\n{}",
            path.display(),
            read(path),
            stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_access_log_goes_to_the_file_the_listeners_name() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    net.pod.route_vips();
    let web = Server::http(&net.peer, net.peer_addr(8081), "web");
    let echo = Server::echo(&net.peer, net.peer_addr(9000));
    let dir = net.binary().make_dir("xds");
    // An existing file is appended to, never truncated.
    let (logs, log) = log_dir(&net);
    write_resources(&dir, &log, web.addr(), echo.addr());
    let remora = net
        .remora()
        .config(&format!("xds:\n  resources_dir: {}\n", dir.display()))
        .start_ready();
    let stderr = || remora.stderr();

    let url = format!("http://{HTTP_VIP}/first");
    let out = curl(&net.pod, &[&url], CURL_TIME);
    assert_eq!(curl_ok(&out, "through the VIP"), "web");
    wait_for_line(&log, "\"GET /first HTTP/1.1\" 200", stderr);
    assert!(read(&log).starts_with("before\n"), "{}", read(&log));
    // TCP connections are logged to the same file.
    let vip: SocketAddr = TCP_VIP.parse().expect("addr");
    let back = peer::echo_exchange(&net.pod, vip, b"hello").expect("TCP through the VIP");
    assert_eq!(back, b"hello");
    // In istiod's format: no request, the bytes each way, the upstream host and cluster.
    wait_for_line(&log, "\"- - -\" 0 - - - \"-\" 5 5 ", stderr);
    wait_for_line(&log, &format!("\"{}\" {ECHO} ", echo.addr()), stderr);
    // Nothing on stdout: the log is the file's.
    assert!(
        !remora.stdout().contains("GET /first"),
        "{}",
        remora.stdout()
    );

    // Rotation: the file renamed away, SIGHUP, and the next lines go to a new file.
    let rotated = logs.join("access.log.1");
    std::fs::rename(&log, &rotated).expect("rotate");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(remora.pid()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
    // The reopen is asked for before the next line is written; give the signal a moment.
    std::thread::sleep(Duration::from_millis(300));
    let url = format!("http://{HTTP_VIP}/second");
    let out = curl(&net.pod, &[&url], CURL_TIME);
    assert_eq!(curl_ok(&out, "after the rotation"), "web");
    wait_for_line(&log, "\"GET /second HTTP/1.1\" 200", stderr);
    assert!(!read(&rotated).contains("/second"), "{}", read(&rotated));
    assert!(!read(&log).contains("/first"), "{}", read(&log));

    // A path that cannot be opened (no such directory): the listeners are refused by name
    // and the ones in force keep logging to the file.
    let refusals =
        |m: &remora_e2e::metrics::Metrics| m.value("remora_xds_file_refusals_total", &[]);
    let before = refusals(&remora.metrics());
    write_resources(
        &dir,
        &logs.join("no-such-dir/access.log"),
        web.addr(),
        echo.addr(),
    );
    remora.wait_for_metrics("the listeners refused", Duration::from_secs(10), |m| {
        refusals(m) > before
    });
    assert!(
        remora.stderr().contains("unable to open access log file"),
        "{}",
        remora.stderr()
    );
    let url = format!("http://{HTTP_VIP}/third");
    let out = curl(&net.pod, &[&url], CURL_TIME);
    assert_eq!(curl_ok(&out, "with the refused listeners"), "web");
    wait_for_line(&log, "\"GET /third HTTP/1.1\" 200", stderr);
    assert!(!logs.join("no-such-dir").exists());
    drop(remora);
}

/// The request part of the line one request left in the world's file (`"GET /file HTTP/1.1"
/// 200 -`: method, path, protocol, status, flags), after the line that was there before.
fn logged_request(net: &PodNet, log: &Path, output: impl Fn() -> String) -> String {
    let url = format!("http://{HTTP_VIP}/file");
    let out = curl(&net.pod, &[&url], CURL_TIME);
    assert_eq!(curl_ok(&out, "through the VIP"), "web", "{}", output());
    wait_for_line(log, "\"GET /file HTTP/1.1\"", &output);
    let text = read(log);
    assert!(text.starts_with("before\n"), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("\"GET /file HTTP/1.1\""))
        .unwrap_or_default();
    // Past the start time: the request, the status and the flags.
    line.split("] ")
        .nth(1)
        .map(|rest| rest.split(' ').take(5).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Envoy 1.40, given the same listeners, appends its line for a request to the file named
/// (keeping what was there), as Remora does: the same request, status and flags.
#[test]
fn envoy_appends_to_the_file_as_remora_does() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let mut got = Vec::new();
    for (i, net) in [&nets.0, &nets.1].into_iter().enumerate() {
        net.capture_default();
        net.pod.route_vips();
        let web = Server::http(&net.peer, net.peer_addr(8081), "web");
        let echo = Server::echo(&net.peer, net.peer_addr(9000));
        let (_logs, log) = log_dir(net);
        let resources = resources(&log, web.addr(), echo.addr());
        let line = if i == 0 {
            let remora = resources.start_remora(net);
            logged_request(net, &log, || remora.stderr())
        } else {
            let envoy = resources.start_envoy(net, &binary);
            logged_request(net, &log, || envoy.logs())
        };
        got.push(line);
    }
    assert_eq!(got[0], "\"GET /file HTTP/1.1\" 200 -", "remora");
    assert_eq!(got[0], got[1], "Remora's line, then Envoy's");
}
