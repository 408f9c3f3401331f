//! Metrics, admin API, agent port and probes, end to end: real traffic through capture, then
//! what Istio's tooling would read — checked with promtool, parsed as Envoy's shapes.

use remora_e2e::peer::{self, any_addr, Server};
use remora_e2e::service::Service;
use remora_e2e::{Metrics, PodNet};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

const CURL_TIME: Duration = Duration::from_secs(5);
const SETTLE: Duration = Duration::from_secs(3);
const APP_PORT: u16 = 8080;
const ECHO_PORT: u16 = 7000;
const ADMIN: &str = "http://127.0.0.1:15000";

/// curl inside `ns`; returns (status code, body).
fn curl_in(ns: &remora_e2e::Netns, args: &[&str]) -> (u16, String) {
    peer::curl_status(ns, args, CURL_TIME)
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// The open connections `/clusters?format=json` gives `host` in `cluster` (`None`: not listed).
fn host_connections(clusters: &serde_json::Value, cluster: &str, host: SocketAddr) -> Option<u64> {
    let statuses = clusters["cluster_statuses"].as_array()?;
    let cluster = statuses.iter().find(|c| c["name"] == cluster)?;
    let host = cluster["host_statuses"].as_array()?.iter().find(|h| {
        let a = &h["address"]["socket_address"];
        a["address"] == host.ip().to_string() && a["port_value"] == host.port()
    })?;
    let cx_active = host["stats"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == "cx_active")?;
    // Proto3 JSON leaves a zero out.
    cx_active["value"].as_str().map_or(Ok(0), str::parse).ok()
}

/// The identity Istio's injector would hand the sidecar.
fn identity_env<'a>(
    remora: remora_e2e::RemoraCommand<'a>,
    labels: &std::path::Path,
) -> remora_e2e::RemoraCommand<'a> {
    remora
        .env("POD_NAME", "reviews-v2-5d9f8c7b6d-x7k2p")
        .env("POD_NAMESPACE", "bookinfo")
        .env("ISTIO_META_WORKLOAD_NAME", "reviews-v2")
        .arg("--pod-labels-file")
        .arg(labels)
}

#[test]
fn istio_metrics_after_real_traffic_pass_promtool_and_carry_workload_labels() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    if !remora_e2e::promtool::available() {
        return;
    }
    net.capture_default();
    let labels = net
        .binary()
        .write_file("labels", "app=\"reviews\"\nversion=\"v2\"\n");
    let remora = identity_env(net.remora(), &labels).start_ready();
    let outside = Server::http(&net.peer, net.peer_addr(APP_PORT), "from the peer\n");
    let app = Server::http(&net.pod, any_addr(APP_PORT), "from the app\n");

    let out = peer::curl(
        &net.pod,
        &[&format!("http://{}/", outside.addr())],
        CURL_TIME,
    );
    assert!(out.status.success(), "outbound curl failed");
    let out = peer::curl(
        &net.peer,
        &[&format!("http://{}/", net.pod_addr(APP_PORT))],
        CURL_TIME,
    );
    assert!(out.status.success(), "inbound curl failed");
    assert_eq!(app.peers().len(), 1);

    let opened = "istio_tcp_connections_opened_total";
    let closed = "istio_tcp_connections_closed_total";
    let source = [
        ("reporter", "source"),
        ("source_workload", "reviews-v2"),
        ("source_workload_namespace", "bookinfo"),
        ("source_app", "reviews"),
        ("source_version", "v2"),
        ("source_canonical_service", "reviews"),
        ("source_canonical_revision", "v2"),
        ("destination_service_name", "PassthroughCluster"),
        ("request_protocol", "tcp"),
        ("response_flags", "-"),
    ];
    let destination = [
        ("reporter", "destination"),
        ("destination_workload", "reviews-v2"),
        ("destination_app", "reviews"),
        ("source_workload", "unknown"),
        ("connection_security_policy", "none"),
    ];
    // Both HTTP connections are reported in Istio's request metrics alone, as an Istio
    // sidecar reports them: its TCP stats filter sits only on `tcp_proxy` filter chains.
    let requests = |reporter: &'static str| {
        [
            ("reporter", reporter),
            ("request_protocol", "http"),
            ("response_code", "200"),
        ]
    };
    let m = remora.wait_for_metrics("Istio request metrics for both directions", SETTLE, |m| {
        m.value("istio_requests_total", &requests("source")) >= 1.0
            && m.value("istio_requests_total", &requests("destination")) >= 1.0
    });
    assert_eq!(m.value(opened, &[]), 0.0, "HTTP counted as TCP:\n{m}");
    assert!(
        m.value("envoy_listener_downstream_cx_total", &[]) >= 2.0,
        "{m}"
    );
    // Opaque TCP, both ways: one connection in each direction's TCP series.
    let _outside_echo = Server::echo(&net.peer, net.peer_addr(ECHO_PORT));
    let _app_echo = Server::echo(&net.pod, any_addr(ECHO_PORT));
    let data = peer::pattern(64 * 1024);
    for (ns, addr) in [
        (&net.pod, net.peer_addr(ECHO_PORT)),
        (&net.peer, net.pod_addr(ECHO_PORT)),
    ] {
        let echoed = peer::echo_exchange(ns, addr, &data).expect("TCP echo through the sidecar");
        peer::assert_same_bytes("TCP through the sidecar", &data, &echoed);
    }
    remora.wait_for_metrics(
        "Istio TCP metrics for both directions",
        SETTLE,
        |m: &Metrics| m.value(closed, &source) >= 1.0 && m.value(closed, &destination) >= 1.0,
    );
    let m = remora.metrics();
    assert_eq!(m.value(opened, &source), 1.0, "{m}");
    assert_eq!(m.value(opened, &destination), 1.0, "{m}");
    // Istio counts bytes from the server's side: the echo's answer is "sent".
    assert_eq!(
        m.value("istio_tcp_sent_bytes_total", &source),
        data.len() as f64,
        "{m}"
    );
    assert!(
        m.value(
            "envoy_listener_downstream_cx_total",
            &[("listener_address", "0.0.0.0_15001")]
        ) >= 1.0
    );
    assert_eq!(m.value("istio_build", &[("component", "proxy")]), 1.0);
    assert!(m.value("process_resident_memory_bytes", &[]) > 0.0);

    // promtool on the real exposition.
    remora_e2e::promtool::assert_valid(&m.to_string());

    // While connections are open through the sidecar, their destinations are hosts of the
    // passthrough clusters on `/clusters`, as `istioctl proxy-config endpoints` reads them.
    let held: Vec<std::net::TcpStream> = [
        (&net.pod, net.peer_addr(ECHO_PORT)),
        (&net.peer, net.pod_addr(ECHO_PORT)),
    ]
    .into_iter()
    .map(|(ns, addr)| {
        // One byte echoed back: the sidecar has its upstream connection.
        let mut conn = peer::connect(ns, addr).expect("connect through the sidecar");
        conn.write_all(b"x")
            .and_then(|()| conn.read_exact(&mut [0; 1]))
            .expect("echo");
        conn
    })
    .collect();
    let clusters = json(&curl_in(&net.pod, &[&format!("{ADMIN}/clusters?format=json")]).1);
    for (cluster, host) in [
        ("PassthroughCluster", net.peer_addr(ECHO_PORT)),
        ("InboundPassthroughCluster", net.pod_addr(ECHO_PORT)),
    ] {
        assert_eq!(
            host_connections(&clusters, cluster, host),
            Some(1),
            "{host} in {cluster}: {clusters}"
        );
    }
    drop(held);
    // Closed, they leave the list (the copy ends when the client's close reaches it).
    let listed = || {
        let clusters = json(&curl_in(&net.pod, &[&format!("{ADMIN}/clusters?format=json")]).1);
        host_connections(&clusters, "PassthroughCluster", net.peer_addr(ECHO_PORT))
    };
    let deadline = std::time::Instant::now() + SETTLE;
    while listed().is_some() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(listed(), None);
}

#[test]
fn admin_paths_answer_in_envoys_shapes() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let mut remora = net.remora().start_ready();
    let get = |path: &str| curl_in(&net.pod, &[&format!("{ADMIN}{path}")]);
    let post = |path: &str| curl_in(&net.pod, &["-X", "POST", &format!("{ADMIN}{path}")]);

    assert_eq!(get("/ready"), (200, "LIVE\n".into()));
    let (code, stats) = get("/stats");
    assert_eq!(code, 200);
    assert!(stats.contains("server.state: 0\n"), "{stats}");
    assert!(
        stats.contains("listener_manager.workers_started: 1\n"),
        "{stats}"
    );
    let (_, filtered) = get("/stats?filter=%5Eserver%5C.live");
    assert_eq!(filtered, "server.live: 1\n");
    let stats_json = json(&get("/stats?format=json").1);
    assert!(stats_json["stats"]
        .as_array()
        .is_some_and(|a| !a.is_empty()));

    let dump = json(&get("/config_dump").1);
    let types: Vec<String> = dump["configs"]
        .as_array()
        .expect("configs array")
        .iter()
        .map(|c| c["@type"].as_str().unwrap_or("").to_string())
        .collect();
    for t in [
        "BootstrapConfigDump",
        "ListenersConfigDump",
        "ClustersConfigDump",
        "SecretsConfigDump",
    ] {
        assert!(
            types.contains(&format!("type.googleapis.com/envoy.admin.v3.{t}")),
            "{types:?}"
        );
    }
    let (_, listeners) = get("/listeners");
    assert!(
        listeners.contains("virtualOutbound::0.0.0.0:15001\n"),
        "{listeners}"
    );
    assert!(
        listeners.contains("virtualInbound::0.0.0.0:15006\n"),
        "{listeners}"
    );
    assert_eq!(json(&get("/server_info").1)["state"], "LIVE");
    assert_eq!(
        json(&get("/clusters?format=json").1)["cluster_statuses"][0]["name"],
        "PassthroughCluster"
    );

    // Wrong method, unknown path.
    assert_eq!(get("/quitquitquit").0, 405);
    let (code, listing) = get("/nope");
    assert_eq!(code, 404);
    assert!(listing.contains("/config_dump"), "{listing}");

    // Health check fail / ok drive readiness.
    let ready = || curl_in(&net.pod, &["http://127.0.0.1:15021/healthz/ready"]).0;
    assert_eq!(post("/healthcheck/fail").0, 200);
    assert_eq!(ready(), 503);
    assert_eq!(post("/healthcheck/ok").0, 200);
    assert_eq!(ready(), 200);

    // Log level at run time.
    let (code, body) = post("/logging?level=debug");
    assert_eq!((code, body.as_str()), (200, "active filter: debug\n"));
    assert_eq!(post("/logging?level=loud").0, 400);
    assert_eq!(get("/logging").1, "active filter: debug\n");

    // And the admin port's quitquitquit exits at once, with 0.
    assert_eq!(post("/quitquitquit").0, 200);
    let status = remora.wait_exit(Duration::from_secs(5));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

#[test]
fn app_health_probes_answer_from_the_original_definitions_through_capture() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let app = Server::http(&net.pod, any_addr(APP_PORT), "ok\n");
    // An HTTPS endpoint of the application's own, with a certificate nobody could verify.
    let dir = net.binary().make_dir("tls-app");
    let (key, cert) = (dir.join("key.pem"), dir.join("cert.pem"));
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=app",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl runs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let (key, cert) = (key.display().to_string(), cert.display().to_string());
    let _https_app = Service::start(
        &net.pod,
        "openssl",
        &[
            "s_server", "-accept", "8443", "-cert", &cert, "-key", &key, "-www", "-quiet",
        ],
        SocketAddr::from(([127, 0, 0, 1], 8443)),
    );
    let probers = format!(
        r#"{{"/app-health/app/livez":{{"httpGet":{{"path":"/healthz","port":{APP_PORT},"scheme":"HTTP"}},"timeoutSeconds":2}},
            "/app-health/app/readyz":{{"tcpSocket":{{"port":9999}},"timeoutSeconds":1}},
            "/app-health/app/startupz":{{"httpGet":{{"path":"/","port":8443,"scheme":"HTTPS"}},"timeoutSeconds":3}}}}"#
    );
    let _remora = net
        .remora()
        .env("ISTIO_KUBE_APP_PROBERS", probers)
        .env("INSTANCE_IP", net.pod_ip.to_string())
        .start_ready();
    // kubelet probes from outside the pod, in plaintext, at the agent port.
    let probe = |path: &str| curl_in(&net.peer, &[&format!("http://{}:15020{path}", net.pod_ip)]).0;
    assert_eq!(probe("/app-health/app/livez"), 200);
    // The probe reached the app from the passthrough source, which capture lets through: a probe
    // captured into the inbound listener would "succeed" even with nothing listening.
    assert!(
        app.peers()
            .iter()
            .any(|p| p.ip().to_string() == "127.0.0.6"),
        "app saw {:?}",
        app.peers()
    );
    assert_eq!(
        probe("/app-health/app/readyz"),
        500,
        "nothing listens on 9999"
    );
    assert_eq!(
        probe("/app-health/app/startupz"),
        200,
        "HTTPS probe, unverified as kubelet's"
    );
    assert_eq!(probe("/app-health/other/livez"), 404);
    assert_eq!(probe("/healthz/ready"), 200);
}

#[test]
fn agent_port_merges_the_applications_metrics_and_quits_only_for_localhost() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let _app_metrics = Server::start(&net.pod, any_addr(9100), |mut s| {
        use std::io::Write;
        peer::read_request_head(&mut s)?;
        let body = "# TYPE app_requests_total counter\napp_requests_total 7\n";
        write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    });
    let mut remora = net
        .remora()
        .env(
            "ISTIO_PROMETHEUS_ANNOTATIONS",
            r#"{"scrape":"true","port":"9100","path":"/metrics"}"#,
        )
        .start_ready();
    let (code, merged) = curl_in(
        &net.peer,
        &[&format!("http://{}:15020/stats/prometheus", net.pod_ip)],
    );
    assert_eq!(code, 200);
    assert!(merged.contains("istio_build{"), "{merged}");
    assert!(merged.contains("app_requests_total 7\n"), "{merged}");

    let quit = |ns: &remora_e2e::Netns, host: &str| {
        curl_in(
            ns,
            &["-X", "POST", &format!("http://{host}:15020/quitquitquit")],
        )
        .0
    };
    assert_eq!(quit(&net.peer, &net.pod_ip.to_string()), 403);
    assert_eq!(
        remora.exit_status(),
        None,
        "a remote quit must not stop the sidecar"
    );
    assert_eq!(quit(&net.pod, "127.0.0.1"), 200);
    let status = remora.wait_exit(Duration::from_secs(5));
    assert!(
        status.is_some_and(|s| s.success()),
        "quitquitquit exits 0 at once: {status:?}"
    );
}

#[test]
fn request_metrics_label_each_kind_of_request_as_istio_does() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().start_ready();
    let outside = Server::http(&net.peer, net.peer_addr(APP_PORT), "from the peer\n");
    let _app = Server::http(&net.pod, any_addr(APP_PORT), "from the app\n");

    // Outbound 200, outbound to a closed port (503 UF after retries), inbound 200.
    assert_eq!(
        curl_in(&net.pod, &[&format!("http://{}/", outside.addr())]).0,
        200
    );
    assert_eq!(
        curl_in(&net.pod, &[&format!("http://{}/", net.peer_addr(9))]).0,
        503
    );
    let inbound = format!("http://{}/", net.pod_addr(APP_PORT));
    assert_eq!(curl_in(&net.peer, &[&inbound]).0, 200);

    let requests = "istio_requests_total";
    let ok_out = [
        ("reporter", "source"),
        ("request_protocol", "http"),
        ("response_code", "200"),
        ("response_flags", "-"),
    ];
    let failed_out = [
        ("reporter", "source"),
        ("response_code", "503"),
        ("response_flags", "URX,UF"),
    ];
    let ok_in = [
        ("reporter", "destination"),
        ("response_code", "200"),
        ("connection_security_policy", "none"),
    ];
    remora.wait_for_metrics("request metrics of three kinds", SETTLE, |m: &Metrics| {
        m.value(requests, &ok_out) == 1.0
            && m.value(requests, &failed_out) == 1.0
            && m.value(requests, &ok_in) == 1.0
    });
    let m = remora.metrics();
    // Every connection above was told HTTP/1.1 by detection.
    assert!(m.value("remora_protocol_detection_total", &[("result", "http1")]) >= 3.0);
    assert!(m.value("remora_protocol_detection_duration_seconds_count", &[]) >= 3.0);
    let count = "istio_request_duration_milliseconds_count";
    assert_eq!(m.value(count, &ok_in), 1.0);
    assert_eq!(
        m.value("istio_response_bytes_sum", &ok_out),
        "from the peer\n".len() as f64
    );
}
