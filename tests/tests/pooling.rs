//! Upstream connections kept for the next client, end to end: HTTP/1.0 clients' requests on
//! a pooled upstream connection, and a pooled mesh connection the server's sidecar closed
//! replaced rather than used. Reuse within one client connection is in `http.rs` and
//! `mtls.rs`.

use remora_e2e::certs::MeshCa;
use remora_e2e::mesh::{client_config, handshakes, server_config, two_pods, SERVER_ID};
use remora_e2e::peer::{self, any_addr, curl_ok};
use remora_e2e::service::http_origin as origin;
use remora_e2e::PodNet;
use std::time::Duration;

/// Bound on one client exchange.
const CLIENT_TIME: Duration = Duration::from_secs(20);
/// Bound on a counter catching up with the traffic.
const METRICS_TIME: Duration = Duration::from_secs(5);
const HTTP_PORT: u16 = 8080;

/// HTTP/1.0 clients (one connection per request, as `ab` and many scripts send them) are
/// served upstream in HTTP/1.1, as Envoy's upstream codec always speaks: the upstream
/// connection stays pooled for the next client instead of closing after each request. The
/// client is still answered in HTTP/1.0: a chunked answer reaches it close-delimited, whole.
#[test]
fn http_1_0_clients_share_a_pooled_upstream_connection_and_get_1_0_answers() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().start_ready();
    let _origin = origin(&net.peer, net.peer_addr(HTTP_PORT));
    let base = format!("http://{}", net.peer_addr(HTTP_PORT));
    let http10 = |path: &str| {
        let out = peer::curl(
            &net.pod,
            &["-s", "--http1.0", &format!("{base}{path}")],
            CLIENT_TIME,
        );
        curl_ok(&out, &format!("HTTP/1.0 GET {path}"))
    };
    let before = http10("/connections");
    for _ in 0..3 {
        assert_eq!(http10("/hello"), "hello\n");
    }
    let after = http10("/connections");
    assert_eq!(
        after,
        before,
        "four HTTP/1.0 client connections opened upstream connections of their own; {}",
        remora.stderr()
    );

    let size = 100_000;
    let out = peer::curl(
        &net.pod,
        &[
            "-s",
            "--http1.0",
            "-o",
            "/dev/null",
            "-w",
            "%{http_version} %{size_download}",
            &format!("{base}/download?size={size}&chunked=1"),
        ],
        CLIENT_TIME,
    );
    assert_eq!(
        curl_ok(&out, "a chunked answer to an HTTP/1.0 client"),
        format!("1 {size}"),
        "the answer was not HTTP/1.0 with the whole body"
    );
}

/// A pooled mesh connection that the server's sidecar closed while it sat idle (here: that
/// sidecar was killed and started again) is not used again: the next client's request goes on
/// a new mesh connection and is answered. A POST, which is not repeated on another connection
/// once sent, would come back 503 had it gone on the dead one.
#[test]
fn a_pooled_mesh_connection_the_server_closed_is_replaced() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let ca = MeshCa::new("cluster.local");
    let (server_dir, client_dir) = two_pods(&net, &ca);
    let server_yaml = server_config(&server_dir, "permissive");
    let mut server = net.remora().config(&server_yaml).start_ready();
    let client = net
        .peer_remora()
        .config(&client_config(&client_dir, net.pod_ip, SERVER_ID))
        .start_ready();
    let _http = origin(&net.pod, any_addr(HTTP_PORT));
    let url = format!("http://{}/headers", net.pod_addr(HTTP_PORT));
    let ended = |m: &remora_e2e::metrics::Metrics| {
        m.value("remora_connections_active", &[("direction", "outbound")]) == 0.0
    };

    let (status, body) = peer::curl_status(&net.peer, &["-s", &url], CLIENT_TIME);
    assert_eq!(status, 200, "first request: {body}");
    client.wait_for_metrics("the first client connection ended", METRICS_TIME, ended);
    let before = handshakes(&client, "outbound", "ok");

    server.kill();
    let server = net.remora().config(&server_yaml).start_ready();
    let upload = format!("http://{}/upload", net.pod_addr(HTTP_PORT));
    let (status, body) = peer::curl_status(
        &net.peer,
        &[
            "-s",
            "-X",
            "POST",
            "--data-binary",
            "not repeatable",
            &upload,
        ],
        CLIENT_TIME,
    );
    assert_eq!(
        (status, body.trim()),
        (
            200,
            "14 09a76f0aa82f14198b0536a803cc121daac8c905203a2a5ff248069211a60c46"
        ),
        "the POST after the server's sidecar restarted\nclient sidecar:\n{}\nserver sidecar:\n{}",
        client.stderr(),
        server.stderr()
    );
    assert_eq!(
        handshakes(&client, "outbound", "ok"),
        before + 1.0,
        "the dead pooled connection was not replaced by one new mesh connection"
    );
}
