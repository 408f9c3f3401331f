//! Malformed HTTP/2 requests (RFC 9113 §8.1.1, §8.2, §8.3) sent over prior-knowledge h2c to an
//! outbound HTTP port, through Remora and through Envoy 1.40 with the same resources: the
//! connection manager as istiod writes it for a sidecar's outbound HTTP port (no
//! `http2_protocol_options`, so neither `stream_error_on_invalid_http_messaging` nor its
//! override: Envoy's default), logging Istio's default text format. Each case records what
//! the client sees on its stream (a status, RST_STREAM and its code, or GOAWAY and its code),
//! whether a well-formed request on another stream of the same connection is still answered,
//! and the access-log line each proxy writes (response code, flags, details). Each proxy's
//! outcome is asserted as observed, and so is where the two differ: a difference that moves
//! or goes away fails the test. Nothing malformed may reach the origin through either proxy.
//! The client is tests/peers/h2_attack.py (`request`), which sends any header bytes.

#[path = "smuggling/origin.rs"]
mod origin;

use origin::{record, Record};
use remora_e2e::envoy_xds::{nets_or_skip, Resources, ISTIO_TEXT_FORMAT};
use remora_e2e::service::peer_program;
use remora_e2e::xds_resources::{eds_cluster, endpoint};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

const VIP: &str = "10.96.0.10";
const CLUSTER: &str = "outbound|80||web.test.svc.cluster.local";
const ORIGIN_PORT: u16 = 8080;

/// One request: its name, the client's arguments, and what each proxy does with it.
struct Case {
    name: &'static str,
    args: &'static [&'static str],
    envoy: Seen,
    remora: Seen,
}

/// What a client and the access log saw of one case.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    /// The first stream's end: `400`, `RST_STREAM 1`, `GOAWAY 1`.
    stream: String,
    /// The second stream on the same connection: `200`, or why there was none.
    after: String,
    /// The first stream's access-log line: `code flags details`, or `none`.
    log: String,
}

fn seen(stream: &str, after: &str, log: &str) -> Seen {
    Seen {
        stream: stream.into(),
        after: after.into(),
        log: log.into(),
    }
}

/// The cases, each with what each proxy was observed to do (docs/xds.md, "Known differences",
/// says why they differ).
fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "well formed",
            args: &["--path", "/ok"],
            envoy: seen("200", "200", "200 - via_upstream"),
            remora: seen("200", "200", "200 - via_upstream"),
        },
        Case {
            name: "transfer-encoding",
            args: &[
                "--path",
                "/te",
                "--header",
                "transfer-encoding:chunked",
                "--body",
                "0\r\n\r\n",
            ],
            envoy: seen("closed", "closed", "0 DPE http2.invalid.header.field"),
            remora: seen("RST_STREAM 1", "200", "none"),
        },
        Case {
            name: "content-length longer than the DATA",
            args: &[
                "--path",
                "/cl",
                "--header",
                "content-length:10",
                "--body",
                "hello",
            ],
            envoy: seen("RST_STREAM 1", "200", "0 DPE http2.remote_reset"),
            remora: seen("RST_STREAM 1", "200", "0 DC -"),
        },
        Case {
            name: "CR LF in a header value",
            args: &[
                "--path",
                "/crlf",
                "--header",
                "x-a:one\\r\\nGET /smuggled HTTP/1.1",
            ],
            envoy: seen("closed", "closed", "0 DPE http2.invalid.header.field"),
            remora: seen("GOAWAY 1", "GOAWAY 1", "none"),
        },
        Case {
            name: "NUL in a header value",
            args: &["--path", "/nul", "--header", "x-a:one\\x00two"],
            envoy: seen("closed", "closed", "0 DPE http2.invalid.header.field"),
            remora: seen("GOAWAY 1", "GOAWAY 1", "none"),
        },
        Case {
            name: "uppercase header name",
            args: &["--path", "/upper", "--header", "X-Upper:one"],
            envoy: seen("closed", "closed", "0 DPE http2.invalid.header.field"),
            remora: seen("GOAWAY 1", "GOAWAY 1", "none"),
        },
        Case {
            name: "connection-specific header",
            args: &["--path", "/conn", "--header", "connection:keep-alive"],
            envoy: seen("closed", "closed", "0 DPE http2.invalid.header.field"),
            remora: seen("RST_STREAM 1", "200", "none"),
        },
        Case {
            name: "pseudo-header after a regular one",
            args: &[
                "--path",
                "/late",
                "--header",
                "x-a:one",
                "--path-at",
                "last",
            ],
            envoy: seen("closed", "closed", "0 DPE http2.invalid.header.field"),
            remora: seen("RST_STREAM 1", "200", "none"),
        },
        Case {
            name: "no :path",
            args: &["--path", "/nopath", "--path-at", "none"],
            envoy: seen(
                "closed",
                "closed",
                "0 DPE http2.violation.of.messaging.rule",
            ),
            remora: seen("RST_STREAM 1", "200", "none"),
        },
    ]
}

/// istiod's outbound HTTP port: `0.0.0.0_80`, its connection manager as istiod writes it for
/// a sidecar (no `http2_protocol_options`), Istio's default access log to `log`; the cluster
/// has no protocol options, so requests go upstream as HTTP/1.1.
fn resources(log: &Path, origin: SocketAddr) -> Resources {
    let access_log = json!([{"name": "envoy.access_loggers.file", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
        "path": log.to_str().expect("utf-8 path"),
        "log_format": {"text_format_source": {"inline_string": ISTIO_TEXT_FORMAT}}}}]);
    let listeners = json!([
        {"name": "0.0.0.0_80", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
         "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "outbound_0.0.0.0_80", "access_log": access_log,
            "rds": {"config_source": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
                    "route_config_name": "80"},
            "use_remote_address": false, "upgrade_configs": [{"upgrade_type": "websocket"}],
            "stream_idle_timeout": "0s", "normalize_path": true,
            "path_with_escaped_slashes_action": "KEEP_UNCHANGED",
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]},
        {"name": "virtualOutbound",
         "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
         "use_original_dst": true, "traffic_direction": "OUTBOUND",
         "filter_chains": [{"name": "virtualOutbound-catchall-tcp", "filters": [
            {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "stat_prefix": "BlackHoleCluster", "cluster": "BlackHoleCluster"}}]}]}
    ]);
    let routes = json!([{"name": "80", "ignore_port_in_host_matching": true, "virtual_hosts": [{
        "name": "web.test.svc.cluster.local:80", "domains": [VIP],
        "routes": [{"name": "default", "match": {"prefix": "/"},
                    "route": {"cluster": CLUSTER, "timeout": "0s"}}]}]}]);
    Resources {
        listeners,
        routes,
        clusters: json!([eds_cluster(CLUSTER),
            {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]),
        endpoints: json!([{"cluster_name": CLUSTER,
            "endpoints": [{"lb_endpoints": [endpoint(origin, None)]}]}]),
    }
}

/// One connection from the pod to the VIP: the case's request on stream 1, then (unless the
/// connection ended) a well-formed GET on stream 3; the client's report.
fn request(net: &PodNet, args: &[&str]) -> Value {
    let script = peer_program("h2_attack.py").to_string_lossy().into_owned();
    let mut cmd = net.pod.command("python3");
    cmd.arg(script)
        .args(["request", &format!("{VIP}:80"), "8", "--then", "/after"])
        .args(args);
    let out = remora_e2e::process::run_bounded(&mut cmd, Duration::from_secs(30))
        .expect("run the HTTP/2 client");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            panic!(
                "no report: {text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// How stream `id` ended in `report`, or how the connection did.
fn stream_end(report: &Value, id: &str) -> String {
    if let Some(status) = report["stream_statuses"][id].as_u64() {
        return status.to_string();
    }
    if let Some(code) = report["stream_resets"][id].as_u64() {
        return format!("RST_STREAM {code}");
    }
    if let Some(code) = report["goaway"]["error_code"].as_u64() {
        return format!("GOAWAY {code}");
    }
    if report["closed"] == true {
        // A FIN or a TCP reset (`close_error`), with no GOAWAY read before it: which of the
        // two depends on whether the client's SETTINGS ACK was still unread at the close.
        return "closed".into();
    }
    "nothing".into()
}

/// `code flags details` of an Istio-format line (the fields after the quoted request line).
fn log_fields(line: &str) -> String {
    let rest = line
        .split_once("\" ")
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>();
    rest.join(" ")
}

/// A file UID 1337 (the proxy) may append to.
fn log_file(net: &PodNet) -> PathBuf {
    let logs = net.binary().make_dir("logs");
    std::os::unix::fs::chown(&logs, Some(1337), Some(1337)).expect("chown");
    let log = logs.join("access.log");
    std::fs::write(&log, "").expect("write");
    std::os::unix::fs::chown(&log, Some(1337), Some(1337)).expect("chown");
    log
}

fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Each case through one proxy, in order: what it saw, and the heads that reached the origin.
fn run_cases(net: &PodNet, log: &Path, rec: &Record) -> Vec<Seen> {
    let mut all = Vec::new();
    let mut logged = 0;
    for case in cases() {
        let report = request(net, case.args);
        // Both proxies write a stream's line when it ends; give the last one time to land.
        std::thread::sleep(Duration::from_millis(700));
        let lines = read_lines(log);
        let new: Vec<&String> = lines.iter().skip(logged).collect();
        logged = lines.len();
        let first: Vec<String> = new
            .iter()
            .filter(|l| !l.contains(" /after "))
            .map(|l| log_fields(l))
            .collect();
        let after_logged = new.iter().any(|l| l.contains(" /after "));
        let after = stream_end(&report, "3");
        assert_eq!(
            after == "200",
            after_logged,
            "{}: the second stream's line: {new:?}",
            case.name
        );
        all.push(Seen {
            stream: stream_end(&report, "1"),
            after,
            log: if first.is_empty() {
                "none".into()
            } else {
                first.join(" | ")
            },
        });
        eprintln!("{}: {report}\n  {:?}", case.name, all.last());
    }
    // Only the well-formed requests reached it: `/ok` once, and the second stream's `/after`
    // once per connection that outlived its first stream, each whole and without a body.
    let got = &record(rec).requests;
    let paths: Vec<&str> = got
        .iter()
        .map(|q| q.head.split(' ').nth(1).unwrap_or(""))
        .collect();
    let afters = all.iter().filter(|s| s.after == "200").count();
    assert_eq!(
        paths.iter().filter(|p| **p == "/ok").count(),
        1,
        "{paths:?}"
    );
    assert_eq!(
        paths.iter().filter(|p| **p == "/after").count(),
        afters,
        "{paths:?}"
    );
    assert_eq!(
        paths.len(),
        1 + afters,
        "a malformed request reached the origin: {got:?}"
    );
    assert!(got.iter().all(|q| q.body.is_empty()), "{got:?}");
    all
}

#[test]
fn malformed_http2_requests_are_refused_as_envoy_refuses_them_or_as_documented() {
    if !remora_e2e::service::python_has("h2") {
        remora_e2e::environment::skip::<()>(
            "python3 has no h2/hyperframe (scripts/install-test-deps installs them)",
        );
        return;
    }
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let mut runs = Vec::new();
    for (i, net) in [&nets.0, &nets.1].into_iter().enumerate() {
        net.capture_default();
        net.pod.route_vips();
        let addr = net.peer_addr(ORIGIN_PORT);
        let rec = origin::spawn(net, addr);
        let log = log_file(net);
        let resources = resources(&log, addr);
        let seen = if i == 0 {
            let remora = resources.start_remora(net);
            let seen = run_cases(net, &log, &rec);
            eprintln!("remora:\n{}", remora.stderr());
            seen
        } else {
            let envoy = resources.start_envoy(net, &binary);
            let seen = run_cases(net, &log, &rec);
            eprintln!("envoy:\n{}", envoy.logs());
            seen
        };
        runs.push(seen);
    }
    let (remora, envoy) = (&runs[0], &runs[1]);
    let mut table = String::from("case | envoy | remora\n");
    for ((case, r), e) in cases().iter().zip(remora).zip(envoy) {
        table.push_str(&format!("{} | {e:?} | {r:?}\n", case.name));
    }
    eprintln!("{table}");
    for ((case, r), e) in cases().iter().zip(remora).zip(envoy) {
        assert_eq!(e, &case.envoy, "{}: envoy\n{table}", case.name);
        assert_eq!(r, &case.remora, "{}: remora\n{table}", case.name);
        // What both must share whatever else differs: the well-formed request is answered
        // alike, and every malformed one is refused by both, before any status.
        if case.name == "well formed" {
            assert_eq!(r, e, "{table}");
        } else {
            let answered = |s: &Seen| s.stream.parse::<u16>().is_ok();
            assert!(!answered(r) && !answered(e), "{}: {table}", case.name);
        }
    }
}
