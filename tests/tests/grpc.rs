//! gRPC through the sidecar with a real gRPC library (Python grpcio, tests/peers/grpc_peer.py):
//! all four call types both ways, trailers, statuses, deadlines, and the proxy's own errors as
//! gRPC statuses.

use remora_e2e::peer::{self, any_addr, curl_ok};
use remora_e2e::service::{peer_program, Service};
use remora_e2e::PodNet;
use std::process::Output;
use std::time::Duration;

/// Bound on one curl exchange.
const CURL_TIME: Duration = Duration::from_secs(20);

/// The gRPC peer (tests/peers/grpc_peer.py), or `None` with a skip when grpcio is missing.
fn grpc_available() -> bool {
    if remora_e2e::service::python_has("grpc") {
        return true;
    }
    remora_e2e::environment::skip::<()>(
        "python3 has no grpcio (scripts/install-test-deps installs it)",
    );
    false
}

fn grpc_peer(ns: &remora_e2e::Netns, args: &[&str], time: Duration) -> Output {
    let script = peer_program("grpc_peer.py").to_string_lossy().into_owned();
    let mut cmd = ns.command("python3");
    cmd.arg(script).args(args);
    remora_e2e::process::run_bounded(&mut cmd, time).expect("run the gRPC client")
}

fn assert_grpc_client_ok(out: &Output, what: &str, remora: &remora_e2e::Remora) {
    assert!(
        out.status.success(),
        "{what}: gRPC client failed ({}):\n{}{}\nremora stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        remora.stderr()
    );
}

#[test]
fn grpc_all_call_types_4mib_messages_trailers_errors_and_deadlines_both_directions() {
    if !grpc_available() {
        return;
    }
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().start_ready();
    let script = peer_program("grpc_peer.py").to_string_lossy().into_owned();
    let _outbound = Service::start(
        &net.peer,
        "python3",
        &[&script, "server", "9090"],
        net.peer_addr(9090),
    );
    let _inbound = Service::start(
        &net.pod,
        "python3",
        &[&script, "server", "9091"],
        any_addr(9091),
    );

    let out = grpc_peer(
        &net.pod,
        &["client", &net.peer_addr(9090).to_string()],
        Duration::from_secs(60),
    );
    assert_grpc_client_ok(&out, "outbound", &remora);
    let out = grpc_peer(
        &net.peer,
        &["client", &net.pod_addr(9091).to_string()],
        Duration::from_secs(60),
    );
    assert_grpc_client_ok(&out, "inbound", &remora);

    // Istio's request metrics know these were gRPC, with statuses and messages, and the whole
    // exposition passes promtool after real gRPC traffic.
    let m = remora.metrics();
    let grpc_ok = [("request_protocol", "grpc"), ("grpc_response_status", "0")];
    assert!(m.value("istio_requests_total", &grpc_ok) >= 1.0, "{m}");
    assert!(
        m.value("istio_request_messages_total", &grpc_ok) >= 1.0,
        "{m}"
    );
    assert!(
        m.value("istio_response_messages_total", &grpc_ok) >= 1.0,
        "{m}"
    );
    if remora_e2e::promtool::available() {
        remora_e2e::promtool::assert_valid(&m.to_string());
    }

    // curl as an HTTP/2 prior-knowledge client of the same server: a trailers-only error.
    let out = peer::curl(
        &net.pod,
        &[
            "--http2-prior-knowledge",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_version} %{http_code}",
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            "--data-binary",
            "",
            &format!("http://{}/test.Echo/Missing", net.peer_addr(9090)),
        ],
        CURL_TIME,
    );
    assert_eq!(curl_ok(&out, "h2c curl"), "2 200");
}

#[test]
fn grpc_to_a_down_upstream_is_grpc_status_14_from_the_proxy() {
    if !grpc_available() {
        return;
    }
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().start_ready();
    let out = grpc_peer(
        &net.pod,
        &["down", &net.peer_addr(9099).to_string()],
        Duration::from_secs(30),
    );
    assert_grpc_client_ok(&out, "upstream down", &remora);
}
