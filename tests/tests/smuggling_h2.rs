//! HTTP/2 requests downgraded to HTTP/1.1 (a cluster without HTTP/2 protocol options, routed
//! by xDS) carrying what HTTP/1.1 would read as framing: `transfer-encoding`, a
//! `content-length` the DATA frames contradict, CR/LF in a header value. Each is refused
//! (the stream reset or answered 400) and never reaches the origin; a well-formed request
//! reaches it as one normalised HTTP/1.1 request, its cookie crumbs joined into one `cookie`
//! line (RFC 9113 §8.2.3). The attack client is tests/peers/h2_attack.py (`request`), which
//! sends any header bytes; the origin parses strictly and records what it gets.

#[path = "smuggling/origin.rs"]
mod origin;

use origin::record;
use remora_e2e::service::peer_program;
use remora_e2e::xds_resources::{eds_cluster, endpoint};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::time::Duration;

/// The service's VIP, known only to the resources.
const VIP: &str = "10.96.0.10";
const CLUSTER: &str = "outbound|80||web.test.svc.cluster.local";
const ORIGIN_PORT: u16 = 8080;

/// istiod's shape: `0.0.0.0_80` with an HCM and RDS `80`; the cluster has no protocol
/// options, so requests go upstream as HTTP/1.1.
fn write_resources(dir: &std::path::Path, origin: std::net::SocketAddr) {
    let listeners = json!([
        {"name": "0.0.0.0_80", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
         "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "outbound_0.0.0.0_80",
            "rds": {"config_source": {"ads": {}}, "route_config_name": "80"},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}
    ]);
    let routes = json!([{"name": "80", "ignore_port_in_host_matching": true, "virtual_hosts": [{
        "name": "web", "domains": [VIP], "routes": [{"match": {"prefix": "/"}, "route": {"cluster": CLUSTER}}]}]}]);
    let clusters = json!([eds_cluster(CLUSTER)]);
    let endpoints = json!([{"cluster_name": CLUSTER, "endpoints": [{"lb_endpoints": [endpoint(origin, None)]}]}]);
    for (file, value) in [
        ("listeners.json", listeners),
        ("routes.json", routes),
        ("clusters.json", clusters),
        ("endpoints.json", endpoints),
    ] {
        std::fs::write(dir.join(file), value.to_string()).expect("write a resource file");
    }
}

/// One HTTP/2 request from the pod to the VIP; the attack client's report.
fn request(net: &PodNet, args: &[&str]) -> Value {
    let script = peer_program("h2_attack.py").to_string_lossy().into_owned();
    let mut cmd = net.pod.command("python3");
    cmd.arg(script)
        .args(["request", &format!("{VIP}:80"), "8"])
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

#[test]
fn http2_requests_downgraded_to_http1_carry_no_smuggled_framing_and_join_their_cookies() {
    if !remora_e2e::service::python_has("h2") {
        remora_e2e::environment::skip::<()>(
            "python3 has no h2/hyperframe (scripts/install-test-deps installs them)",
        );
        return;
    }
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    net.pod.route_vips();
    let addr = net.peer_addr(ORIGIN_PORT);
    let rec = origin::spawn(&net, addr);
    let dir = net.binary().make_dir("xds");
    write_resources(&dir, addr);
    let remora = net
        .remora()
        .config(&format!(
            "access_log:\n  enabled: true\nhttp:\n  retries: 0\nxds:\n  resources_dir: {}\n",
            dir.display()
        ))
        .start_ready();

    // Well formed, with cookie crumbs: one request, one cookie line.
    let ok = request(
        &net,
        &[
            "--path",
            "/ok",
            "--header",
            "cookie:a=1",
            "--header",
            "cookie:b=2",
            "--header",
            "content-length:5",
            "--body",
            "hello",
        ],
    );
    assert_eq!(ok["statuses"]["200"], 1, "{ok}\n{}", remora.stderr());
    {
        let got = &record(&rec).requests;
        assert_eq!(got.len(), 1, "{got:?}");
        let head = got[0].head.to_ascii_lowercase();
        assert_eq!(head.matches("\r\ncookie:").count(), 1, "{head}");
        assert!(head.contains("\r\ncookie: a=1; b=2"), "{head}");
        assert_eq!(got[0].body, b"hello");
    }

    let refused: [(&str, &[&str]); 5] = [
        (
            "transfer-encoding",
            &[
                "--header",
                "transfer-encoding:chunked",
                "--body",
                "0\r\n\r\n",
            ],
        ),
        (
            "content-length longer than the body",
            &["--header", "content-length:10", "--body", "hello"],
        ),
        (
            "content-length shorter than the body",
            &[
                "--header",
                "content-length:2",
                "--body",
                "hello\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
            ],
        ),
        (
            "CR LF in a header value",
            &["--header", "x-a:one\\r\\nGET /smuggled HTTP/1.1"],
        ),
        (
            "LF in a header value",
            &["--header", "x-a:one\\ntwo: three"],
        ),
    ];
    for (what, args) in refused {
        let mut all = vec!["--path", "/refused"];
        all.extend_from_slice(args);
        let r = request(&net, &all);
        let reset = r["frames_received"]["RstStreamFrame"].as_u64().unwrap_or(0) > 0;
        let answered_400 = r["statuses"]["400"] == 1;
        let goaway = !r["goaway"].is_null();
        assert!(reset || answered_400 || goaway, "{what}: {r}");
        std::thread::sleep(Duration::from_millis(200));
        let got = &record(&rec).requests;
        assert!(
            got.iter()
                .all(|q| !q.head.contains("/refused") && !q.head.contains("/smuggled")),
            "{what}: reached the origin: {got:?}"
        );
    }
}
