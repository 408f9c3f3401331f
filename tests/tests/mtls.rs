//! Mutual TLS between sidecars, end to end: two pods (the test's two namespaces, each with
//! capture rules and its own Remora), certificates from a test CA in Istio's file layout.
//! What crosses the veth is read with tcpdump; STRICT, other CAs and missing client
//! certificates are tried with `openssl s_client`; rotation happens under an open connection.
//! A server that speaks first is in `mtls_server_first.rs`.

use remora_e2e::certs::MeshCa;
use remora_e2e::mesh::{
    client_config, handshakes, has_openssl, permissive_server, pods_to_sniff, s_client,
    server_config, two_pods, CLIENT_ID, SERVER_HOST, SERVER_ID,
};
use remora_e2e::peer::{self, any_addr, Server};
use remora_e2e::service::{peer_program, python_has, Service};
use remora_e2e::sniff::{self, Sniffer};
use remora_e2e::{skip, PodNet};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

/// Bound on one client exchange (curl, openssl, gRPC).
const CLIENT_TIME: Duration = Duration::from_secs(20);
/// Bound on a counter catching up with the traffic.
const METRICS_TIME: Duration = Duration::from_secs(5);
const HTTP_PORT: u16 = 8080;
const ECHO_PORT: u16 = 7000;
const GRPC_PORT: u16 = 9091;

fn grpc_available() -> bool {
    python_has("grpc")
        || skip::<()>("python3 has no grpcio (scripts/install-test-deps installs it)").is_some()
}

#[test]
fn http_grpc_and_tcp_cross_encrypted_between_two_sidecars() {
    let Some(net) = pods_to_sniff() else {
        return;
    };
    let (server, client_dir) = permissive_server(&net);
    let client = net
        .peer_remora()
        .config(&client_config(&client_dir, net.pod_ip, SERVER_ID))
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
    let grpc = grpc_available();
    let grpc_script = peer_program("grpc_peer.py").to_string_lossy().into_owned();
    let _grpc = grpc.then(|| {
        Service::start(
            &net.pod,
            "python3",
            &[&grpc_script, "server", &GRPC_PORT.to_string()],
            any_addr(GRPC_PORT),
        )
    });
    let sniffer = Sniffer::start(&net.peer, "eth0", "tcp");

    // HTTP: the application sees Istio's x-forwarded-client-cert naming both sidecars.
    let marker = "remora-plaintext-marker-7c1f";
    let out = peer::curl(
        &net.peer,
        &[
            "-s",
            "-H",
            &format!("x-marker: {marker}"),
            &format!("http://{}/headers", net.pod_addr(HTTP_PORT)),
        ],
        CLIENT_TIME,
    );
    let body = peer::curl_ok(&out, "HTTP across the mesh");
    let headers: serde_json::Value = serde_json::from_str(&body).expect("JSON headers");
    assert_eq!(headers["x-marker"], marker, "{body}");
    let xfcc = headers["x-forwarded-client-cert"]
        .as_str()
        .unwrap_or_else(|| panic!("no x-forwarded-client-cert: {body}"));
    assert!(xfcc.starts_with(&format!("By={SERVER_ID};Hash=")), "{xfcc}");
    assert!(
        xfcc.ends_with(&format!(";Subject=\"\";URI={CLIENT_ID}")),
        "{xfcc}"
    );

    // The client's sidecar serves the application's HTTP itself and pools its mesh
    // connections, as Envoy pools a cluster's: two more client connections (the second with
    // two requests) go on the mesh connection the first request opened, with no handshake,
    // and it reports them as Istio's client side does, naming the server by its certificate.
    let handshakes_before = handshakes(&client, "outbound", "ok");
    let url = format!("http://{}/headers", net.pod_addr(HTTP_PORT));
    // A client connection hands its mesh connection to the pool when it ends.
    let ended = |m: &remora_e2e::metrics::Metrics| {
        m.value("remora_connections_active", &[("direction", "outbound")]) == 0.0
    };
    client.wait_for_metrics("the first client connection ended", METRICS_TIME, ended);
    let out = peer::curl(&net.peer, &["-s", "-o", "/dev/null", &url], CLIENT_TIME);
    peer::curl_ok(&out, "a second client connection across the mesh");
    client.wait_for_metrics("the second client connection ended", METRICS_TIME, ended);
    let out = peer::curl(
        &net.peer,
        &["-s", "-o", "/dev/null", "-o", "/dev/null", &url, &url],
        CLIENT_TIME,
    );
    peer::curl_ok(&out, "two requests on a third connection across the mesh");
    let source_requests = |m: &remora_e2e::metrics::Metrics, protocol: &str, code: &str| {
        m.value(
            "istio_requests_total",
            &[
                ("reporter", "source"),
                ("source_principal", CLIENT_ID),
                ("destination_principal", SERVER_ID),
                ("destination_workload_namespace", "server"),
                ("destination_service", SERVER_HOST),
                ("destination_service_name", "httpbin"),
                ("destination_service_namespace", "server"),
                ("connection_security_policy", "unknown"),
                ("request_protocol", protocol),
                ("response_code", code),
            ],
        )
    };
    client.wait_for_metrics("source-side HTTP requests", METRICS_TIME, |m| {
        source_requests(m, "http", "200") >= 4.0
    });
    assert_eq!(
        handshakes(&client, "outbound", "ok"),
        handshakes_before,
        "new client connections did not take the pooled mesh connection"
    );

    // Raw TCP: bytes arrive intact.
    let mut data = peer::pattern(256 * 1024);
    data.extend_from_slice(marker.as_bytes());
    let echoed = peer::echo_exchange(&net.peer, net.pod_addr(ECHO_PORT), &data)
        .expect("TCP echo across the mesh");
    peer::assert_same_bytes("TCP echo across the mesh", &data, &echoed);

    // gRPC, every call type.
    if grpc {
        let mut cmd = net.peer.command("python3");
        cmd.args([
            grpc_script.as_str(),
            "client",
            &net.pod_addr(GRPC_PORT).to_string(),
        ]);
        let out = remora_e2e::process::run_bounded(&mut cmd, Duration::from_secs(60))
            .expect("run the gRPC client");
        assert!(
            out.status.success(),
            "gRPC across the mesh: {}{}\nclient sidecar:\n{}\nserver sidecar:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            client.stderr(),
            server.stderr()
        );
    }

    // On the wire: TLS records with Istio's ALPN values and SNI in the ClientHellos, and
    // none of the payload.
    let wire = sniffer.stop();
    assert!(
        wire.len() > data.len(),
        "the capture holds too little ({} bytes)",
        wire.len()
    );
    assert!(
        !sniff::contains(&wire, marker.as_bytes()),
        "plaintext crossed the wire"
    );
    assert!(sniff::contains(&wire, b"istio-http/1.1"));
    assert!(sniff::contains(
        &wire,
        format!("outbound_.{HTTP_PORT}_._.{SERVER_HOST}").as_bytes()
    ));
    let expected = if grpc { 3.0 } else { 2.0 };
    server.wait_for_metrics("inbound handshakes", METRICS_TIME, |m| {
        m.value(
            "remora_tls_handshakes_total",
            &[("direction", "inbound"), ("result", "ok")],
        ) >= expected
    });
    assert!(handshakes(&client, "outbound", "ok") >= expected);
    // Istio's request metrics name the client by its certificate.
    let m = server.metrics();
    let mtls_requests = m.value(
        "istio_requests_total",
        &[
            ("reporter", "destination"),
            ("source_principal", CLIENT_ID),
            ("source_workload_namespace", "client"),
            ("connection_security_policy", "mutual_tls"),
            ("response_code", "200"),
        ],
    );
    assert!(mtls_requests >= 1.0, "no mutual_tls request series:\n{m}");
    // Both sidecars' expositions, with peer labels from certificates, still pass promtool.
    if remora_e2e::promtool::available() {
        remora_e2e::promtool::assert_valid(&m.to_string());
        remora_e2e::promtool::assert_valid(&client.metrics().to_string());
    }
    if grpc {
        assert!(sniff::contains(&wire, b"istio-h2"));
        let calls = source_requests(&client.metrics(), "grpc", "200");
        assert!(
            calls >= 1.0,
            "no source-side gRPC series:\n{}",
            client.metrics()
        );
    }
}

#[test]
fn strict_refuses_plaintext_no_client_certificate_and_another_ca() {
    if !has_openssl() {
        return;
    }
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let ca = MeshCa::new("cluster.local");
    let other = MeshCa::new("intruder");
    let server_dir = net.binary().make_dir("server-certs");
    ca.install(&server_dir, &ca.workload(SERVER_ID));
    // Client credentials for openssl: one from the mesh CA, one from another CA.
    let good = net.binary().make_dir("good-client");
    ca.install(&good, &ca.workload(CLIENT_ID));
    let bad = net.binary().make_dir("bad-client");
    other.install(&bad, &other.workload(CLIENT_ID));
    net.capture_default();
    let server = net
        .remora()
        .config(&server_config(&server_dir, "strict"))
        .start_ready();
    let app = Server::http(&net.pod, any_addr(HTTP_PORT), "hello from the pod");
    let target = net.pod_addr(HTTP_PORT);
    let request = b"GET / HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n";

    // Plaintext: closed.
    let out = peer::curl(
        &net.peer,
        &["-s", &format!("http://{target}/")],
        CLIENT_TIME,
    );
    assert!(!out.status.success(), "plaintext was served under STRICT");
    // Mesh ALPN but no client certificate.
    let out = s_client(&net.peer, target, &["-alpn", "istio"], request);
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("hello from the pod"),
        "served without a client certificate"
    );
    // A client certificate from another CA.
    let cert = |dir: &Path, f: &str| dir.join(f).to_string_lossy().into_owned();
    // openssl as a client offering `alpn`, with the key pair in `dir`, and `extra` arguments.
    let as_client = |alpn: &str, dir: &Path, extra: &[&str]| {
        let (chain, key) = (cert(dir, "cert-chain.pem"), cert(dir, "key.pem"));
        let mut args = vec!["-alpn", alpn, "-cert", &chain, "-key", &key];
        args.extend_from_slice(extra);
        s_client(&net.peer, target, &args, request)
    };
    let out = as_client("istio", &bad, &[]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hello from the pod"));
    // TLS without Istio's ALPN values and without a client certificate (the application's
    // own TLS, say): STRICT terminates it and the handshake wants a mesh certificate.
    let out = s_client(&net.peer, target, &["-alpn", "h2,http/1.1"], request);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hello from the pod"));
    assert!(
        app.peers().is_empty(),
        "the application saw a refused client"
    );

    // A mesh client with a good certificate (openssl, as another TLS stack) is served, and
    // checks the server's certificate against the mesh root.
    let root = cert(&good, "root-cert.pem");
    let out = as_client(
        "istio-http/1.1,istio",
        &good,
        &["-CAfile", &root, "-verify_return_error"],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("hello from the pod"),
        "a mesh client was not served: {}\n{}\nremora:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        server.stderr()
    );

    // Istio's strict filter chains match TLS whatever its ALPN: a client with a mesh
    // certificate that offers none of Istio's values (proxyless gRPC, curl --cert) is served.
    let out = as_client("h2,http/1.1", &good, &[]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("hello from the pod"),
        "a mesh certificate without Istio's ALPN was refused: {}",
        server.stderr()
    );

    let m = server.wait_for_metrics("refusals counted", METRICS_TIME, |m| {
        let h = |r: &str| {
            m.value(
                "remora_tls_handshakes_total",
                &[("direction", "inbound"), ("result", r)],
            )
        };
        h("mtls_required") >= 1.0
            && h("no_client_certificate") >= 2.0
            && h("unknown_ca") >= 1.0
            && h("ok") >= 2.0
    });
    // The same, as Envoy's inbound listener counts them.
    let envoy = |stat: &str| {
        m.value(
            &format!("envoy_listener_ssl_{stat}"),
            &[("listener_address", "0.0.0.0_15006")],
        )
    };
    assert!(envoy("handshake") >= 2.0, "{m}");
    assert!(envoy("fail_verify_no_cert") >= 2.0, "{m}");
    assert!(envoy("fail_verify_error") >= 1.0, "{m}");
    assert!(envoy("connection_error") >= 3.0, "{m}");
    let logs = server.stderr();
    assert!(logs.contains("no_client_certificate"), "{logs}");
    assert!(logs.contains("unknown_ca"), "{logs}");
}

#[test]
fn permissive_passes_plaintext_and_the_applications_own_tls_untouched() {
    if !has_openssl() {
        return;
    }
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let ca = MeshCa::new("cluster.local");
    let server_dir = net.binary().make_dir("server-certs");
    ca.install(&server_dir, &ca.workload(SERVER_ID));
    // The application's own TLS, from a CA the mesh knows nothing of.
    let app_ca = MeshCa::new("app-ca");
    let app_dir = net.binary().make_dir("app-certs");
    app_ca.install(&app_dir, &app_ca.dns_server("app.example.com"));
    net.capture_default();
    // A detection timeout far longer than the banner below is allowed to take.
    let server_yaml = format!(
        "{}detection:\n  timeout: 30s\n",
        server_config(&server_dir, "permissive")
    );
    let server = net.remora().config(&server_yaml).start_ready();
    let script = peer_program("http_server.py")
        .to_string_lossy()
        .into_owned();
    let _http = Service::start(
        &net.pod,
        "python3",
        &[&script, &HTTP_PORT.to_string()],
        any_addr(HTTP_PORT),
    );
    const BANNER: &[u8] = b"220 plaintext-client ready\r\n";
    let _banner = Server::start(&net.pod, any_addr(2529), |mut stream| {
        stream.write_all(BANNER)?;
        let mut buf = [0u8; 64];
        let _ = stream.read(&mut buf)?;
        Ok(())
    });
    let file = |f: &str| app_dir.join(f).to_string_lossy().into_owned();
    let _tls_app = Service::start(
        &net.pod,
        "openssl",
        &[
            "s_server",
            "-quiet",
            "-accept",
            "8443",
            "-cert",
            &file("cert-chain.pem"),
            "-key",
            &file("key.pem"),
            "-www",
        ],
        any_addr(8443),
    );

    // Plaintext is served, and a forged x-forwarded-client-cert never reaches the app.
    let out = peer::curl(
        &net.peer,
        &[
            "-s",
            "-H",
            "x-forwarded-client-cert: By=spiffe://evil/ns/x/sa/y;URI=spiffe://evil",
            &format!("http://{}/headers", net.pod_addr(HTTP_PORT)),
        ],
        CLIENT_TIME,
    );
    let body = peer::curl_ok(&out, "plaintext under PERMISSIVE");
    assert!(!body.contains("x-forwarded-client-cert"), "{body}");

    // The application's TLS passes untouched: the client sees the app's certificate, verified
    // against the app's own CA.
    let out = peer::curl(
        &net.peer,
        &[
            "-sS",
            "--cacert",
            &file("root-cert.pem"),
            "--resolve",
            &format!("app.example.com:8443:{}", net.pod_ip),
            "https://app.example.com:8443/",
        ],
        CLIENT_TIME,
    );
    let body = peer::curl_ok(&out, "the application's own TLS");
    assert!(body.contains("s_server"), "{body}");

    // A plaintext client of a server-first protocol gets its greeting once the sidecar has
    // stopped waiting for a mesh ClientHello, long before the detection timeout.
    let mut stream = peer::connect(&net.peer, net.pod_addr(2529)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    let mut got = vec![0u8; BANNER.len()];
    stream
        .read_exact(&mut got)
        .expect("the greeting came before the 30 s detection timeout");
    assert_eq!(got, BANNER);
    drop(stream);

    let m = server.metrics();
    assert_eq!(
        m.value(
            "remora_tls_handshakes_total",
            &[("direction", "inbound"), ("result", "ok")]
        ),
        0.0,
        "the application's TLS was terminated"
    );
    assert!(
        m.value(
            "remora_connections_opened_total",
            &[("direction", "inbound")]
        ) >= 2.0
    );
}

/// The PEM body of the first certificate in `text`, without line breaks.
fn first_cert_body(text: &str) -> String {
    let start = text
        .find("-----BEGIN CERTIFICATE-----")
        .map_or(0, |i| i + "-----BEGIN CERTIFICATE-----".len());
    let end = text[start..]
        .find("-----END CERTIFICATE-----")
        .map_or(text.len(), |i| start + i);
    text[start..end].split_whitespace().collect()
}

#[test]
fn a_rotated_certificate_keeps_open_connections_and_serves_new_handshakes() {
    if !has_openssl() {
        return;
    }
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let ca = MeshCa::new("cluster.local");
    let (server_dir, client_dir) = two_pods(&net, &ca);
    // Polled only once a minute: the rotation below is seen within METRICS_TIME because the
    // certificate directory is watched.
    let watched =
        server_config(&server_dir, "strict").replace("tls:\n", "tls:\n  watch_interval: 60s\n");
    let server = net.remora().config(&watched).start_ready();
    let _client = net
        .peer_remora()
        .config(&client_config(&client_dir, net.pod_ip, SERVER_ID))
        .start_ready();
    let _echo = Server::echo(&net.pod, any_addr(ECHO_PORT));

    // A connection through both sidecars, open across the rotation.
    let mut open = peer::connect(&net.peer, net.pod_addr(ECHO_PORT)).expect("connect");
    let exchange = |stream: &mut std::net::TcpStream, what: &[u8]| {
        stream.write_all(what).expect("write");
        let mut back = vec![0; what.len()];
        stream.read_exact(&mut back).expect("read the echo");
        assert_eq!(back, what);
    };
    // Lines, not bare words: "before rotation" alone is a consistent start of an HTTP request
    // line (a method, a target), which detection holds until `detection.timeout` (5 s) in each
    // of the two sidecars, and 10 s was this test's read timeout.
    exchange(&mut open, b"before rotation\n");

    let rotated = ca.workload(SERVER_ID);
    ca.install(&server_dir, &rotated);
    server.wait_for_metrics("rotation loaded", METRICS_TIME, |m| {
        m.value("remora_tls_certificate_rotations_total", &[]) >= 1.0
    });
    exchange(&mut open, b"after rotation, same connection\n");

    // A new connection through the sidecars works, and a new handshake shows the new
    // certificate.
    let data = b"a new connection".to_vec();
    let echoed = peer::echo_exchange(&net.peer, net.pod_addr(ECHO_PORT), &data).expect("echo");
    assert_eq!(echoed, data);
    let cert = |f: &str| client_dir.join(f).to_string_lossy().into_owned();
    // As the client pod's sidecar user, which its capture rules let through untouched.
    let mut cmd = net.peer.command("setpriv");
    cmd.args([
        "--reuid",
        "1337",
        "--regid",
        "1337",
        "--clear-groups",
        "openssl",
        "s_client",
        "-connect",
        &net.pod_addr(ECHO_PORT).to_string(),
        "-alpn",
        "istio",
        "-showcerts",
        "-cert",
        &cert("cert-chain.pem"),
        "-key",
        &cert("key.pem"),
    ]);
    let out = remora_e2e::process::run_bounded(&mut cmd, CLIENT_TIME).expect("openssl");
    let shown = first_cert_body(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        shown,
        first_cert_body(&rotated.chain),
        "the new handshake did not present the rotated certificate"
    );
    // The admin API shows it too.
    let certs = peer::http_get(
        &net.pod,
        SocketAddr::from((Ipv4Addr::LOCALHOST, remora_e2e::ADMIN_PORT)),
        "/certs",
        CLIENT_TIME,
    )
    .expect("GET /certs");
    let certs: serde_json::Value = serde_json::from_str(&certs.body).expect("JSON");
    let chain = &certs["certificates"][0]["cert_chain"][0];
    assert_eq!(chain["subject_alt_names"][0]["uri"], SERVER_ID, "{certs}");
    assert!(chain["days_until_expiration"].as_str().is_some(), "{certs}");
    exchange(&mut open, b"still open\n");
}
