//! `remora run` as a process, on loopback only: start-up errors, reload, loop refusal. No root
//! needed; the capture path is covered by the end-to-end tests in `tests/`.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support;

use support::{free_port, get, metric, wait_until, Explicit, Ports, Remora, TempDir, BIN};

#[test]
fn invalid_config_fails_the_start_naming_file_line_and_field() {
    let dir = TempDir::new("invalid");
    let path = dir.0.join("remora.yaml");
    std::fs::write(&path, "outbound:\n  port: 15001\ninbound:\n  port: lots\n").unwrap();
    let out = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!("{}:4:", path.display());
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(stderr.contains("inbound.port"), "{stderr}");
}

#[test]
fn port_in_use_fails_the_start_naming_the_address() {
    let dir = TempDir::new("inuse");
    let ports = Ports::new();
    let held = TcpListener::bind(("127.0.0.1", ports.inbound)).unwrap();
    let path = dir.0.join("remora.yaml");
    std::fs::write(&path, ports.config("")).unwrap();
    let out = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    drop(held);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("127.0.0.1:{}", ports.inbound)),
        "{stderr}"
    );
}

#[test]
fn reload_applies_valid_files_and_keeps_running_on_invalid_ones() {
    let dir = TempDir::new("reload");
    let ports = Ports::new();
    let path = dir.0.join("remora.yaml");
    std::fs::write(&path, ports.config("")).unwrap();
    let mut remora = Remora::start(&path);
    remora.wait_ready(&path, ports.readiness);
    let ok = "remora_config_reloads_total{result=\"success\"}";
    let failed = "remora_config_reloads_total{result=\"failure\"}";
    assert_eq!(metric(ports.metrics, ok), Some(0));

    // An invalid file: refused, counted, still serving.
    std::fs::write(&path, ports.config("drain:\n  duration: never\n")).unwrap();
    wait_until("the failed reload", || {
        metric(ports.metrics, failed) == Some(1)
    });
    assert_eq!(get(ports.readiness, "/healthz/ready").unwrap().0, 200);

    // A valid change is picked up without a signal.
    std::fs::write(&path, ports.config("drain:\n  duration: 2s\n")).unwrap();
    wait_until("the reload", || metric(ports.metrics, ok) == Some(1));

    // SIGHUP reloads even when nothing changed.
    let status = Command::new("kill")
        .args(["-HUP", &remora.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    wait_until("the SIGHUP reload", || metric(ports.metrics, ok) == Some(2));
    assert_eq!(metric(ports.metrics, failed), Some(1));
}

#[test]
fn a_connection_to_the_capture_port_itself_is_refused_not_looped() {
    let dir = TempDir::new("ownport");
    let ports = Ports::new();
    let path = dir.0.join("remora.yaml");
    std::fs::write(&path, ports.config("")).unwrap();
    let mut remora = Remora::start(&path);
    remora.wait_ready(&path, ports.readiness);
    // Dialled directly, the original destination is the listener itself.
    let mut s = TcpStream::connect(("127.0.0.1", ports.outbound)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(b"hello");
    let mut buf = [0u8; 16];
    let n = s.read(&mut buf);
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "expected the connection to be closed: {n:?}"
    );
    let refused = "remora_loop_refused_total{guard=\"own_listener\"}";
    wait_until("the refusal to be counted", || {
        metric(ports.metrics, refused) == Some(1)
    });
    let opened = "remora_connections_opened_total{direction=\"outbound\"}";
    assert_eq!(metric(ports.metrics, opened), Some(1), "nothing looped");
}

#[test]
fn explicit_listener_proxies_to_its_upstream_without_capture() {
    // An echo server that half-closes after echoing everything it got.
    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = echo.local_addr().unwrap();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = echo.accept() {
            let mut data = Vec::new();
            s.read_to_end(&mut data).unwrap();
            s.write_all(&data).unwrap();
        }
    });
    let proxy = Explicit::start("explicit", upstream, "tcp");
    let (ports, listen) = (&proxy.ports, proxy.listen);
    // The capture listeners are not bound in explicit mode.
    assert!(TcpStream::connect(("127.0.0.1", ports.outbound)).is_err());

    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    let mut s = TcpStream::connect(("127.0.0.1", listen)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&payload).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back).unwrap();
    assert!(
        back == payload,
        "echo through the explicit listener differs"
    );
    let opened = "remora_connections_opened_total{direction=\"outbound\"}";
    assert_eq!(metric(ports.metrics, opened), Some(1));
}

#[test]
fn an_idle_tcp_connection_is_closed_both_ways_after_istios_idle_timeout() {
    // The upstream reads what arrives and reports when its side ends, then keeps the socket.
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = server.local_addr().unwrap();
    let (ended_tx, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = server.accept() {
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut got = Vec::new();
            let end = s.read_to_end(&mut got).map_err(|e| e.kind());
            let _ = ended_tx.send((got, end));
        }
    });
    let proxy = Explicit::start_with_env(
        "idle",
        upstream,
        "tcp",
        &[("ISTIO_META_IDLE_TIMEOUT", "1s")],
    );
    let mut s = TcpStream::connect(("127.0.0.1", proxy.listen)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // Traffic every 300 ms keeps the connection past the timeout.
    let started = Instant::now();
    for _ in 0..6 {
        s.write_all(b"tick").unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    // Then silence: both sides get a FIN, not a reset, within 1 to 1.25 s (plus slack).
    let mut buf = [0u8; 16];
    assert_eq!(s.read(&mut buf).map_err(|e| e.kind()), Ok(0));
    let idle_for = started.elapsed();
    assert!(
        idle_for >= Duration::from_millis(2_500),
        "closed after {idle_for:?}"
    );
    let (got, end) = ended.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(got, b"tick".repeat(6));
    assert_eq!(end, Ok(24));
    // Counted as the connection's end is recorded, a moment after both sides were closed.
    let idle = "remora_tcp_idle_timeouts_total{direction=\"outbound\"}";
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(proxy.ports.metrics, idle) != Some(1) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metric(proxy.ports.metrics, idle), Some(1));
}

#[test]
fn exit_on_zero_waits_out_the_minimum_drain_duration_then_exits_zero() {
    let dir = TempDir::new("mindrain");
    let ports = Ports::new();
    let path = dir.0.join("remora.yaml");
    std::fs::write(&path, ports.config("drain:\n  duration: 60s\n")).unwrap();
    let stderr = std::fs::File::create(path.with_extension("stderr")).unwrap();
    let child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&path)
        // As Istio's agent reads it: Go's ParseBool takes `1`, `True`…
        .env("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "1")
        .env("MINIMUM_DRAIN_DURATION", "1s")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut remora = Remora(child);
    remora.wait_ready(&path, ports.readiness);
    let status = Command::new("kill")
        .args(["-TERM", &remora.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    // No connection is open, but the minimum drain holds it: still there, and draining.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        remora.0.try_wait().unwrap(),
        None,
        "exited before the minimum drain"
    );
    assert_eq!(get(ports.readiness, "/healthz/ready").unwrap().0, 503);
    // Then it goes, with 0, long before the 60 s drain period.
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(s) = remora.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "still running 10 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit:?}");
}

/// An Istio variable with a value Istio's agent would refuse is ignored with a warning, not a
/// failed start; log levels take Envoy's names, and a level nobody has is refused at once.
#[test]
fn istio_variables_istio_ignores_do_not_stop_the_start_and_log_levels_take_envoys_names() {
    let dir = TempDir::new("istioenv");
    let ports = Ports::new();
    let path = dir.0.join("remora.yaml");
    std::fs::write(&path, ports.config("")).unwrap();
    let log = path.with_extension("stderr");
    let child = Command::new(BIN)
        .args(["run", "--log-level", "warning,misc:error", "--config"])
        .arg(&path)
        .env("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "maybe")
        .env("MINIMUM_DRAIN_DURATION", "5")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut remora = Remora(child);
    remora.wait_ready(&path, ports.readiness);
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(stderr.contains("not a boolean"), "{stderr}");
    assert!(stderr.contains("not a duration"), "{stderr}");
    // At `warning`, the info line that says it is ready is not written.
    assert!(!stderr.contains("remora is ready"), "{stderr}");
    drop(remora);

    let out = Command::new(BIN)
        .args(["run", "--log-level", "loud", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown log level `loud`"), "{stderr}");
}

/// The injector passes a pod's `status.sidecar.istio.io/port` as `--status-port`: the agent
/// (readiness, rewritten probes, merged metrics) must listen there, and not on the config's port.
#[test]
fn status_port_flag_moves_the_agent() {
    let dir = TempDir::new("statusport");
    let ports = Ports::new();
    let path = dir.0.join("remora.yaml");
    std::fs::write(&path, ports.config("")).unwrap();
    let status_port = free_port();
    let stderr = std::fs::File::create(path.with_extension("stderr")).unwrap();
    let child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&path)
        .args(["--status-port", &status_port.to_string()])
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut remora = Remora(child);
    remora.wait_ready(&path, ports.readiness);
    let (status, _) = get(status_port, "/healthz/ready").unwrap();
    assert_eq!(status, 200, "the agent answers on --status-port");
    let (status, body) = get(status_port, "/stats/prometheus").unwrap();
    assert_eq!(status, 200);
    assert!(
        body.contains("istio_") || body.contains("remora_"),
        "{body}"
    );
    assert!(
        TcpStream::connect(("127.0.0.1", ports.agent)).is_err(),
        "the config's agent port is not bound"
    );
}

#[test]
fn status_port_zero_is_refused() {
    let out = Command::new(BIN)
        .args(["run", "--status-port", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--status-port"), "{stderr}");
}

/// The grpc-simple init container runs exactly these arguments, with the pod's identity from
/// the downward API in its environment.
#[test]
fn grpc_bootstrap_writes_the_file_the_injector_names() {
    let dir = TempDir::new("grpcboot");
    let output = dir.0.join("bootstrap.json");
    let out = Command::new(BIN)
        .args(["grpc-bootstrap", "--output"])
        .arg(&output)
        .args(["--xds-address", "istiod.istio-system.svc:15010"])
        .args(["--cluster-domain", "cluster.local"])
        .env("INSTANCE_IP", "10.4.0.7")
        .env("POD_NAME", "grpc-7c9")
        .env("POD_NAMESPACE", "shop")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&output).unwrap();
    assert!(
        text.contains("\"sidecar~10.4.0.7~grpc-7c9.shop~shop.svc.cluster.local\""),
        "{text}"
    );
    assert!(
        text.contains("dns:///istiod.istio-system.svc:15010"),
        "{text}"
    );

    // Without the pod's identity it fails rather than write a bootstrap istiod would refuse.
    let out = Command::new(BIN)
        .args(["grpc-bootstrap", "--output"])
        .arg(dir.0.join("other.json"))
        .env_remove("INSTANCE_IP")
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE")
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// A listener declared HTTP parses whatever arrives as HTTP: an extension method is forwarded as
/// a request (with the proxy's headers added), and bytes that are no request get a 400 instead of
/// passing through as opaque TCP.
/// An origin for `connections` connections that sends each request head it reads to the
/// returned channel and answers `200 ok`.
fn head_recording_origin(
    connections: usize,
) -> (std::net::SocketAddr, std::sync::mpsc::Receiver<String>) {
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = origin.local_addr().unwrap();
    let (heads, seen) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for conn in origin.incoming().take(connections) {
            let Ok(mut s) = conn else { return };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let _ = heads.send(String::from_utf8_lossy(&head).into_owned());
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
        }
    });
    (upstream, seen)
}

#[test]
fn a_port_declared_http_serves_every_client_as_http() {
    let (upstream, seen) = head_recording_origin(2);
    let proxy = Explicit::start("declaredhttp", upstream, "http");
    let listen = proxy.listen;
    let exchange = |request: &[u8]| {
        let mut s = TcpStream::connect(("127.0.0.1", listen)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request).unwrap();
        let mut answer = vec![0u8; 4096];
        let n = s.read(&mut answer).unwrap();
        String::from_utf8_lossy(&answer[..n]).into_owned()
    };

    let answer = exchange(b"PURGEALL /cache HTTP/1.1\r\nHost: origin\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let head = seen.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(head.starts_with("PURGEALL /cache HTTP/1.1\r\n"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("x-request-id:"),
        "{head}"
    );

    let answer = exchange(b"hello there\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        seen.recv_timeout(Duration::from_millis(500)).is_err(),
        "bytes that are no request reached the upstream"
    );
}

/// A request line with runs of spaces is HTTP on a sniffed port, as Envoy's parser takes it:
/// it goes on with single spaces and the proxy's headers, not as opaque bytes.
#[test]
fn a_request_line_with_extra_spaces_is_served_as_http() {
    let (upstream, seen) = head_recording_origin(1);
    let proxy = Explicit::start("spaces", upstream, "auto");
    let mut s = TcpStream::connect(("127.0.0.1", proxy.listen)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /a  HTTP/1.1\r\nHost: origin\r\n\r\n")
        .unwrap();
    let mut answer = vec![0u8; 4096];
    let n = s.read(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let head = seen.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(head.starts_with("GET /a HTTP/1.1\r\n"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("x-request-id:"),
        "{head}"
    );
}

/// A client whose request body stops half way is the client's failure, not the upstream's:
/// reset, it is counted as Envoy counts it (response code 0, `DC`); a body that is no valid
/// chunked framing is answered 400 `DPE`.
#[test]
fn a_request_body_the_client_breaks_is_its_failure_not_the_upstreams() {
    // An upstream that reads everything and never answers.
    let sink = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = sink.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in sink.incoming().take(4) {
            let Ok(mut s) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while s.read(&mut buf).is_ok_and(|n| n > 0) {}
            });
        }
    });
    let proxy = Explicit::start("bodyfail", upstream, "http");
    let (ports, listen) = (&proxy.ports, proxy.listen);

    let mut s = TcpStream::connect(("127.0.0.1", listen)).unwrap();
    s.write_all(b"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
        .unwrap();
    s.write_all(&[b'a'; 50_000]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    socket2::SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(s);

    let mut s = TcpStream::connect(("127.0.0.1", listen)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(
        b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n",
    )
    .unwrap();
    let mut answer = [0u8; 64];
    let n = s.read(&mut answer).unwrap();
    assert!(
        answer[..n].starts_with(b"HTTP/1.1 400"),
        "{:?}",
        &answer[..n]
    );

    let code = |code: &str, flags: &str| {
        let (_, body) = get(ports.metrics, "/stats/prometheus").unwrap();
        body.lines()
            .filter(|l| l.starts_with("istio_requests_total{"))
            .filter(|l| l.contains(&format!("response_code=\"{code}\"")))
            .filter(|l| l.contains(&format!("response_flags=\"{flags}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>()
    };
    wait_until("both requests counted", || {
        code("0", "DC") == 1 && code("400", "DPE") == 1
    });
    assert_eq!(
        code("503", "UC"),
        0,
        "the client's failure blamed on the upstream"
    );
}
