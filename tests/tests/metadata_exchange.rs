//! Istio's metadata exchange between two Remora sidecars (the two-pod mTLS setup): on TCP the
//! client's sidecar offers `istio-peer-exchange`, the server's selects it, and each learns the
//! other's workload, namespace, app and version from the pod identity it was started with. The
//! Istio TCP metrics on both sides, and the request metrics of HTTP that crosses such a
//! connection, name the peer; opens and closes stay paired. A client that negotiates the ALPN
//! but sends no header (openssl) still gets its bytes through untouched. HTTP that the client's
//! sidecar serves itself carries the same metadata in Istio's `x-envoy-peer-metadata` headers.

use remora_e2e::certs::MeshCa;
use remora_e2e::mesh::{
    client_config, has_openssl, s_client_as_proxy_user, server_config, two_pods, CLIENT_ID,
    SERVER_ID,
};
use remora_e2e::peer::{self, any_addr, Server};
use remora_e2e::service::{peer_program, Service};
use remora_e2e::{Metrics, PodNet, Remora, RemoraCommand};
use std::path::Path;
use std::time::Duration;

const CLIENT_TIME: Duration = Duration::from_secs(20);
const METRICS_TIME: Duration = Duration::from_secs(5);
const HTTP_PORT: u16 = 8080;
const L7_PORT: u16 = 8081;
const ECHO_PORT: u16 = 7000;

/// Start `cmd` as the sidecar of pod `pod` (a Deployment's pod name) in `namespace`, with
/// the pod labels `app` and `version`, as the injector hands them over.
fn as_pod<'a>(
    cmd: RemoraCommand<'a>,
    labels: &Path,
    pod: &str,
    namespace: &str,
) -> RemoraCommand<'a> {
    cmd.arg("--pod-labels-file")
        .arg(labels)
        .env("POD_NAME", pod)
        .env("POD_NAMESPACE", namespace)
        .env("ISTIO_META_CLUSTER_ID", "test-cluster")
}

/// Every `istio_tcp_connections_opened_total` series has a closed twin with the same count
/// once the connections are done (summed over response flags).
fn opens_and_closes_pair(m: &Metrics) -> bool {
    m.value("istio_tcp_connections_opened_total", &[])
        == m.value("istio_tcp_connections_closed_total", &[])
}

fn exchanges(m: &Metrics, direction: &str, result: &str) -> f64 {
    m.value(
        "remora_metadata_exchanges_total",
        &[("direction", direction), ("result", result)],
    )
}

#[test]
fn two_sidecars_learn_each_others_workload_and_metrics_name_it() {
    if !has_openssl() {
        return;
    }
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let ca = MeshCa::new("cluster.local");
    let (server_dir, client_dir) = two_pods(&net, &ca);
    let server_labels = net
        .binary()
        .write_file("server-labels", "app=\"httpbin\"\nversion=\"v1\"\n");
    let client_labels = net
        .binary()
        .write_file("client-labels", "app=\"sleep\"\nversion=\"v2\"\n");
    let server: Remora = as_pod(
        net.remora()
            .config(&server_config(&server_dir, "permissive")),
        &server_labels,
        "httpbin-7d4b9c6f8d-x2x9k",
        "server",
    )
    .start_ready();
    // Port 8080 declared `tcp` on the client: its HTTP crosses as bytes on an
    // `istio-peer-exchange` connection, and the server's sidecar finds HTTP inside.
    let client_yaml = format!(
        "{}ports:\n  {HTTP_PORT}: tcp\n",
        client_config(&client_dir, net.pod_ip, SERVER_ID)
    );
    let client: Remora = as_pod(
        net.peer_remora().config(&client_yaml),
        &client_labels,
        "sleep-5b9f8c7d6e-abcde",
        "client",
    )
    .start_ready();
    let script = peer_program("http_server.py")
        .to_string_lossy()
        .into_owned();
    let _http = Service::start(
        &net.pod,
        "python3",
        &[&script, &HTTP_PORT.to_string()],
        any_addr(HTTP_PORT),
    );
    let _echo = Server::echo(&net.pod, any_addr(ECHO_PORT));

    // TCP through both sidecars: the exchange happens first and the bytes arrive intact.
    let data = peer::pattern(128 * 1024);
    let echoed = peer::echo_exchange(&net.peer, net.pod_addr(ECHO_PORT), &data)
        .expect("TCP echo across the mesh");
    peer::assert_same_bytes("TCP with metadata exchange", &data, &echoed);
    // HTTP inside such a connection.
    let out = peer::curl(
        &net.peer,
        &[&format!("http://{}/headers", net.pod_addr(HTTP_PORT))],
        CLIENT_TIME,
    );
    let body = peer::curl_ok(&out, "HTTP over an istio-peer-exchange connection");
    assert!(body.contains("x-forwarded-client-cert"), "{body}");

    let m = server.wait_for_metrics("inbound exchanges", METRICS_TIME, |m| {
        exchanges(m, "inbound", "ok") >= 2.0 && opens_and_closes_pair(m)
    });
    let source = [
        ("reporter", "destination"),
        ("source_workload", "sleep"),
        ("source_workload_namespace", "client"),
        ("source_principal", CLIENT_ID),
        ("source_app", "sleep"),
        ("source_version", "v2"),
        ("source_canonical_service", "sleep"),
        ("source_canonical_revision", "v2"),
        ("source_cluster", "test-cluster"),
        ("connection_security_policy", "mutual_tls"),
    ];
    // The echo alone: the server's sidecar found HTTP inside the other connection and
    // reports it in the request metrics only.
    assert_eq!(
        m.value("istio_tcp_connections_opened_total", &source),
        1.0,
        "{m}"
    );
    assert!(
        m.value("istio_tcp_connections_closed_total", &source) >= 1.0,
        "{m}"
    );
    assert!(m.value("istio_tcp_received_bytes_total", &source) >= data.len() as f64);
    let request = [
        ("reporter", "destination"),
        ("source_workload", "sleep"),
        ("source_app", "sleep"),
        ("source_version", "v2"),
        ("destination_workload", "httpbin"),
        ("response_code", "200"),
    ];
    assert!(m.value("istio_requests_total", &request) >= 1.0, "{m}");

    let m = client.wait_for_metrics("outbound exchanges", METRICS_TIME, |m| {
        exchanges(m, "outbound", "ok") >= 2.0 && opens_and_closes_pair(m)
    });
    let destination = [
        ("reporter", "source"),
        ("source_workload", "sleep"),
        ("destination_workload", "httpbin"),
        ("destination_workload_namespace", "server"),
        ("destination_principal", SERVER_ID),
        ("destination_app", "httpbin"),
        ("destination_version", "v1"),
        ("destination_canonical_service", "httpbin"),
        ("destination_cluster", "test-cluster"),
    ];
    // Both: port 8080 is declared `tcp` on the client's side.
    assert_eq!(
        m.value("istio_tcp_connections_opened_total", &destination),
        2.0,
        "{m}"
    );
    assert!(m.value("istio_tcp_sent_bytes_total", &destination) >= data.len() as f64);

    // HTTP the client's sidecar serves itself (port 8081 is not declared): the sidecars
    // exchange the same metadata in Istio's headers, which neither application sees, and each
    // side's request metrics name the other's workload.
    let _http_l7 = Service::start(
        &net.pod,
        "python3",
        &[&script, &L7_PORT.to_string()],
        any_addr(L7_PORT),
    );
    let out = peer::curl(
        &net.peer,
        &["-si", &format!("http://{}/headers", net.pod_addr(L7_PORT))],
        CLIENT_TIME,
    );
    let response = peer::curl_ok(&out, "HTTP served by both sidecars");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        !response
            .to_ascii_lowercase()
            .contains("x-envoy-peer-metadata"),
        "metadata headers reached an application: {response}"
    );
    let served =
        |m: &Metrics, labels: &[(&str, &str)]| m.value("istio_requests_total", labels) >= 1.0;
    let l7_source = [
        ("reporter", "destination"),
        ("source_workload", "sleep"),
        ("source_app", "sleep"),
        ("source_version", "v2"),
        ("source_cluster", "test-cluster"),
        ("destination_workload", "httpbin"),
        ("response_code", "200"),
    ];
    server.wait_for_metrics("requests at least twice from sleep", METRICS_TIME, |m| {
        m.value("istio_requests_total", &l7_source) >= 2.0
    });
    let l7_destination = [
        ("reporter", "source"),
        ("source_workload", "sleep"),
        ("destination_workload", "httpbin"),
        ("destination_app", "httpbin"),
        ("destination_version", "v1"),
        ("destination_principal", SERVER_ID),
        ("response_code", "200"),
    ];
    client.wait_for_metrics("a request to httpbin", METRICS_TIME, |m| {
        served(m, &l7_destination)
    });

    // A client that negotiates `istio-peer-exchange` but sends no header (openssl, from the
    // client pod past its sidecar): Remora's header comes first, then the application's
    // answer to the client's bytes, which reached it untouched.
    let cert = |f: &str| client_dir.join(f).to_string_lossy().into_owned();
    let request = b"GET /headers HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n";
    let out = s_client_as_proxy_user(
        &net.peer,
        net.pod_addr(HTTP_PORT),
        &[
            "-alpn",
            "istio-peer-exchange",
            "-cert",
            &cert("cert-chain.pem"),
            "-key",
            &cert("key.pem"),
        ],
        request,
    );
    let stdout = out.stdout;
    assert!(
        stdout.starts_with(&[0x3d, 0x23, 0x04, 0x67]),
        "no metadata-exchange header first: {}",
        String::from_utf8_lossy(&stdout)
    );
    let text = String::from_utf8_lossy(&stdout);
    assert!(text.contains("HTTP/1.1 200"), "{text}");
    assert!(text.contains("\"host\": \"httpbin\""), "{text}");
    server.wait_for_metrics("a client that does not speak it", METRICS_TIME, |m| {
        exchanges(m, "inbound", "not_spoken") >= 1.0
    });
}
