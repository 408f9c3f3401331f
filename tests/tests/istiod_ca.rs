//! Identity from istiod's CA, end to end: the pod's Remora runs as an injected sidecar does
//! (Istio's environment, UID 1337 behind `remora capture`) and asks the harness's control plane
//! (`remora_e2e::istiod`, real gRPC over TLS in the peer namespace, reached by the name
//! `istiod.istio-system.svc`) for its certificate. The peer namespace also holds a server
//! sidecar with a file certificate from the same CA that accepts only the pod's SPIFFE ID, so
//! a mesh connection proves the CA-issued identity is the one presented.

use remora_e2e::certs::MeshCa;
use remora_e2e::istiod::{ControlPlane, HostsFile, PodFiles, ISTIOD_HOST, ISTIOD_PORT};
use remora_e2e::mesh::{CLIENT_ID, SERVER_HOST, SERVER_ID};
use remora_e2e::peer::{http_get, Server};
use remora_e2e::xds_resources::{endpoint, mtls_cluster, tcp_listener};
use remora_e2e::{PodNet, RemoraCommand, ADMIN_PORT};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "projected-token-for-sleep";
/// The mesh port of the server sidecar's terminating listener.
const MESH_PORT: u16 = 8443;
const ECHO_PORT: u16 = 7000;
/// Short enough that a test sees rotations: renewal at half of it.
const SECRET_TTL: &str = "10s";
const STEP_TIME: Duration = Duration::from_secs(30);
/// Both sidecars log each mesh connection's steps (handshake, metadata exchange, copy), so a
/// failed echo shows which hop held the bytes.
const CONNECTION_LOG: &str = "info,remora::proxy=debug,remora::tls=debug,remora::tcp=debug";

/// The pod's sidecar in istiod mode, configured as the injector configures it: Istio's
/// environment; the file adds only where this test keeps the token and root (the real paths
/// are the pod's secret mounts) and the mesh destination.
fn istiod_sidecar<'a>(net: &'a PodNet, token_file: &Path, root_file: &Path) -> RemoraCommand<'a> {
    remora_e2e::istiod::injected_sidecar(net).config(&format!(
            "istiod:\n  discovery_address: {ISTIOD_HOST}:{ISTIOD_PORT}\n  token_file: {}\n  \
             root_cert_file: {}\nmesh:\n  destinations:\n    - cidrs: [\"{}\"]\n      \
             ports: [{MESH_PORT}]\n      hostname: {SERVER_HOST}\n      identities: [\"{SERVER_ID}\"]\n",
            token_file.display(),
            root_file.display(),
            net.peer_ip
        ))
        .env("SECRET_TTL", SECRET_TTL)
        .env("REMORA_LOG", CONNECTION_LOG)
}

/// The server pod's sidecar: a file certificate for [`SERVER_ID`], terminating mesh TLS from
/// [`CLIENT_ID`] only, in front of an echo server.
fn server_sidecar<'a>(net: &'a PodNet, ca: &MeshCa) -> (remora_e2e::Remora<'a>, Server) {
    let dir = net.binary().make_dir("server-certs");
    ca.install(&dir, &ca.workload(SERVER_ID));
    let echo = Server::echo(
        &net.peer,
        SocketAddr::from((Ipv4Addr::LOCALHOST, ECHO_PORT)),
    );
    let sidecar = net
        .peer_remora()
        .config(&format!(
            "tls:\n  cert_dir: {}\nlisteners:\n  - address: {}\n    upstream: 127.0.0.1:{ECHO_PORT}\n    \
             protocol: tcp\n    tls:\n      mode: terminate\n      identities: [\"{CLIENT_ID}\"]\n",
            dir.display(),
            net.peer_addr(MESH_PORT)
        ))
        .env("REMORA_LOG", CONNECTION_LOG)
        .start_ready();
    (sidecar, echo)
}

/// `body` sent on `stream` comes back.
fn echoes(stream: &mut TcpStream, body: &[u8]) -> bool {
    let mut back = vec![0; body.len()];
    stream.write_all(body).is_ok() && stream.read_exact(&mut back).is_ok() && back == body
}

/// The workload certificate `/certs` shows: (SPIFFE ID, serial, path).
fn shown_certificate(net: &PodNet) -> Option<(String, String, String)> {
    let admin = SocketAddr::from((Ipv4Addr::LOCALHOST, ADMIN_PORT));
    let r = http_get(&net.pod, admin, "/certs", Duration::from_secs(5)).ok()?;
    let json: serde_json::Value = serde_json::from_str(&r.body).ok()?;
    let leaf = &json["certificates"][0]["cert_chain"][0];
    Some((
        leaf["subject_alt_names"][0]["uri"].as_str()?.to_string(),
        leaf["serial_number"].as_str()?.to_string(),
        leaf["path"].as_str()?.to_string(),
    ))
}

fn wait_until(what: &str, timeout: Duration, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// istiod's resources for the server sidecar's mesh port: the only route out of the pod.
fn serve_the_server_sidecar(plane: &ControlPlane, net: &PodNet) {
    use remora_e2e::istiod::ads::type_url;
    let cluster = "outbound|8443||echo.server.svc.cluster.local";
    let ads = plane.ads();
    ads.set(
        type_url::ENDPOINT,
        "v1",
        &[
            serde_json::json!({"cluster_name": cluster, "endpoints": [{"lb_endpoints": [
            endpoint(net.peer_addr(MESH_PORT), Some("istio"))]}]}),
        ],
    );
    ads.set(
        type_url::CLUSTER,
        "v1",
        &[mtls_cluster(
            cluster,
            "outbound_.8443_._.echo.server.svc.cluster.local",
            SERVER_ID,
        )],
    );
    ads.set(
        type_url::LISTENER,
        "v1",
        &[tcp_listener(net.peer_addr(MESH_PORT), cluster)],
    );
}

#[test]
fn a_certificate_from_istiod_gates_readiness_and_rotates_under_an_open_connection() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let PodFiles {
        ca,
        token,
        root,
        hosts: _hosts,
    } = PodFiles::write(&net, TOKEN);
    let (server, _echo) = server_sidecar(&net, &ca);
    net.capture_default();

    // istiod is not there yet: readiness answers, and answers 503.
    let mut sidecar = istiod_sidecar(&net, &token, &root).start();
    wait_until("readiness answering 503", STEP_TIME, || {
        sidecar.readiness() == Some(503)
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(sidecar.readiness(), Some(503), "{}", sidecar.stderr());
    assert_eq!(shown_certificate(&net), None);

    let plane = ControlPlane::start(
        &net.peer,
        net.peer_addr(ISTIOD_PORT),
        Arc::clone(&ca),
        TOKEN,
    );
    // Readiness also waits for istiod's first configuration (tests/istiod_xds.rs), which is
    // also what routes: the server sidecar's port as istiod writes a service with a sidecar
    // (tcp_proxy to an EDS cluster whose endpoint says `tlsMode: istio`).
    serve_the_server_sidecar(&plane, &net);
    sidecar.wait_ready(STEP_TIME);
    let issued = plane.issued();
    assert!(!issued.is_empty(), "refused: {:?}", plane.refused());
    assert_eq!(issued[0].ttl, Duration::from_secs(10));
    let (id, first_serial, path) = shown_certificate(&net).expect("/certs shows a certificate");
    assert_eq!(id, CLIENT_ID);
    assert!(!first_serial.is_empty());
    assert_eq!(path, "<inline>", "no certificate is written to disk");

    // The server sidecar accepts only CLIENT_ID: an echo is the CA-issued identity at work.
    let mut stream = net
        .pod
        .connect(net.peer_addr(MESH_PORT), Duration::from_secs(5))
        .expect("connect through the sidecar");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    assert!(
        echoes(&mut stream, b"before rotation"),
        "pod sidecar:\n{}\nserver sidecar:\n{}",
        sidecar.stderr(),
        server.stderr()
    );

    // Renewal at half of the 10 s lifetime: two more within a few lifetimes.
    wait_until("two rotations", STEP_TIME, || plane.issued().len() >= 3);
    wait_until("/certs showing the rotated certificate", STEP_TIME, || {
        shown_certificate(&net).is_some_and(|(_, serial, _)| serial != first_serial)
    });
    assert!(
        echoes(&mut stream, b"after rotation, same connection"),
        "{}",
        sidecar.stderr()
    );
    let mut fresh = net
        .pod
        .connect(net.peer_addr(MESH_PORT), Duration::from_secs(5))
        .expect("connect after rotation");
    fresh
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    assert!(
        echoes(&mut fresh, b"a new connection"),
        "{}",
        sidecar.stderr()
    );
    let metrics = sidecar.metrics();
    let expiry = metrics.value(
        "istio_agent_cert_expiry_seconds",
        &[("resource_name", "default")],
    );
    assert!(expiry > 0.0 && expiry <= 10.0, "expiry {expiry}");
    assert!(metrics.value("remora_tls_certificate_rotations_total", &[]) >= 2.0);
    assert!(
        metrics.value(
            "istio_agent_num_outgoing_requests_total",
            &[("request_type", "csr")]
        ) >= 3.0
    );
    assert!(plane.refused().is_empty(), "{:?}", plane.refused());
}

#[test]
fn a_refused_token_gets_no_certificate_until_the_rotated_one_is_read() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let ca = Arc::new(MeshCa::new("cluster.local"));
    let token = net
        .binary()
        .write_file("istio-token", "someone-elses-token");
    let root = net.binary().write_file("root-cert.pem", &ca.root_pem());
    let _hosts = HostsFile::write(&net.pod, &[(net.peer_ip.into(), ISTIOD_HOST)])
        .expect("name istiod inside the pod");
    let plane = ControlPlane::start(&net.peer, net.peer_addr(ISTIOD_PORT), ca, TOKEN);
    plane.ads().set_empty();
    net.capture_default();
    let sidecar = istiod_sidecar(&net, &token, &root).start();
    wait_until("readiness answering", STEP_TIME, || {
        sidecar.readiness().is_some()
    });
    sidecar.wait_for_metrics("an unauthenticated CA failure", STEP_TIME, |m| {
        m.value(
            "remora_istiod_certificate_failures_total",
            &[("reason", "unauthenticated")],
        ) >= 1.0
    });
    assert!(plane.issued().is_empty());
    assert!(!plane.refused().is_empty());
    assert_eq!(sidecar.readiness(), Some(503));
    assert_eq!(shown_certificate(&net), None);
    assert!(
        sidecar.stderr().contains("Unauthenticated"),
        "{}",
        sidecar.stderr()
    );

    // kubelet rotates the projected token in place: the next attempt reads the new one.
    std::fs::write(&token, TOKEN).expect("rotate the token");
    let mut sidecar = sidecar;
    sidecar.wait_ready(Duration::from_secs(90));
    assert_eq!(plane.issued().len(), 1);
    assert_eq!(
        shown_certificate(&net).map(|(id, ..)| id).as_deref(),
        Some(CLIENT_ID)
    );
}

#[test]
fn a_missing_token_or_root_file_fails_the_start_naming_it() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let ca = MeshCa::new("cluster.local");
    let token = net.binary().write_file("istio-token", TOKEN);
    let root = net.binary().write_file("root-cert.pem", &ca.root_pem());
    let missing = Path::new("/var/run/secrets/tokens/remora-e2e-absent-token");
    for (token, root, named) in [
        (missing, root.as_path(), missing),
        (token.as_path(), missing, missing),
    ] {
        let mut sidecar = istiod_sidecar(&net, token, root).start();
        let status = sidecar
            .wait_exit(STEP_TIME)
            .unwrap_or_else(|| panic!("remora kept running: {}", sidecar.stderr()));
        assert!(!status.success());
        let stderr = sidecar.stderr();
        assert!(
            stderr.contains(&named.display().to_string()),
            "the error names {}: {stderr}",
            named.display()
        );
    }
}
