//! Slow clients: request heads and bodies dribbled a byte at a time, on both HTTP/1.1 paths, and
//! TLS handshakes that stall on the inbound mesh port.

use super::*;

/// Send `first`, then `rest` a byte at a time every `pace` until the proxy answers or closes
/// (at most `bound`); returns what it answered and when, counted from the first write.
fn dribble(
    stream: &mut TcpStream,
    first: &[u8],
    rest: &[u8],
    pace: Duration,
    bound: Duration,
) -> (String, Duration) {
    let started = Instant::now();
    stream.write_all(first).expect("first bytes");
    stream.set_nonblocking(true).expect("non-blocking");
    let mut response = Vec::new();
    let mut bytes = rest.iter().cycle();
    while started.elapsed() < bound {
        std::thread::sleep(pace);
        let mut buf = [0u8; 4096];
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                response.extend_from_slice(&buf[..n]);
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => break,
        }
        if !response.is_empty() {
            break;
        }
        let Some(b) = bytes.next() else { break };
        if stream.write_all(&[*b]).is_err() {
            break;
        }
    }
    let took = started.elapsed();
    stream.set_nonblocking(false).expect("blocking");
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("read timeout");
    let _ = stream.read_to_end(&mut response);
    (String::from_utf8_lossy(&response).into_owned(), took)
}

/// A good client's request, answered 200 while the slow ones are held.
fn assert_good_client_served(net: &PodNet, dst: SocketAddr, what: &str) {
    let url = format!("http://{dst}/upload");
    let (status, body) = peer::curl_status(
        &net.pod,
        &["--data-binary", &"x".repeat(100_000), &url],
        Duration::from_secs(10),
    );
    assert_eq!(status, 200, "{what}: a good upload: {body}");
    assert!(body.starts_with("100000 "), "{what}: {body}");
}

/// Slowloris in the head and in the body, with the fast path on (slow requests are handed to
/// hyper's path) and off (hyper's path from the start): each is cut with a 408 after its
/// bound, and a good client is served meanwhile.
#[test]
fn slow_heads_and_slow_bodies_are_cut_on_both_http1_paths() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let _origin = remora_e2e::service::http_origin(&net.peer, net.peer_addr(ORIGIN_PORT));
    let dst = net.peer_addr(ORIGIN_PORT);
    for fast_path in [true, false] {
        let what = format!("fast_path {fast_path}");
        let remora = net
            .remora()
            .config(&format!(
                "access_log:\n  enabled: true\nports:\n  {ORIGIN_PORT}: http\n\
                 http:\n  fast_path: {fast_path}\n  header_read_timeout: 2s\n  \
                 request_body_timeout: 2s\n  request_body_min_rate: 100\n"
            ))
            .start_ready();

        // A head a byte every 200 ms: cut at 2 s after its first byte. (The port is declared
        // HTTP: on a detected one, detection reads the request line first, within
        // `detection.timeout`, and the head's clock starts after it.)
        let mut slow_head = peer::connect(&net.pod, dst).expect("connect");
        let head = b"GET /hello HTTP/1.1\r\nHost: a\r\nX-Slow: ";
        let (response, took) = dribble(
            &mut slow_head,
            b"G",
            &head[1..]
                .iter()
                .chain(b"vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv".iter())
                .copied()
                .collect::<Vec<u8>>(),
            Duration::from_millis(200),
            Duration::from_secs(10),
        );
        assert!(
            response.starts_with("HTTP/1.1 408"),
            "{what}: slow head: {response:?}\n{}",
            remora.stderr()
        );
        assert!(
            took >= Duration::from_millis(1800) && took < Duration::from_secs(5),
            "{what}: slow head cut after {took:?}"
        );

        // A body a byte every 200 ms (5 bytes/s, far under 100): its budget is 2 s plus 10 ms
        // a byte, so it is cut at about 2.1 s after its head, though bytes keep coming. A good
        // client is served while it dribbles.
        let mut slow_body = peer::connect(&net.pod, dst).expect("connect");
        let good = std::thread::scope(|s| {
            let good = s.spawn(|| {
                std::thread::sleep(Duration::from_millis(500));
                assert_good_client_served(&net, dst, &what);
            });
            let (response, took) = dribble(
                &mut slow_body,
                b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\nx",
                b"x",
                Duration::from_millis(200),
                Duration::from_secs(15),
            );
            assert!(
                response.starts_with("HTTP/1.1 408"),
                "{what}: slow body: {response:?}\n{}",
                remora.stderr()
            );
            assert!(
                took >= Duration::from_millis(1800) && took < Duration::from_secs(6),
                "{what}: slow body cut after {took:?}"
            );
            good.join()
        });
        assert!(good.is_ok(), "{what}: the good client failed");
        // Recorded with the status the client got, as a head cut for its pace is.
        remora.wait_for_access_log("\"POST /upload HTTP/1.1\" 408 - ");
        remora.wait_for_access_log("\"- - HTTP/1.1\" 408 - ");
        let m = remora.metrics();
        assert_eq!(
            m.value("istio_requests_total", &[("response_code", "408")]),
            2.0,
            "{what}: {m}"
        );

        // A body sent in two halves a second apart goes through (its pace is far above the
        // floor), on a keep-alive connection that is then used again.
        let mut halves = peer::connect(&net.pod, dst).expect("connect");
        let body = "y".repeat(20_000);
        halves
            .write_all(
                format!(
                    "POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n{}",
                    body.len(),
                    &body[..10_000]
                )
                .as_bytes(),
            )
            .expect("first half");
        std::thread::sleep(Duration::from_secs(1));
        halves
            .write_all(&body.as_bytes()[10_000..])
            .expect("second half");
        halves
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("read timeout");
        let head = peer::read_request_head(&mut halves).expect("a response head");
        let head = String::from_utf8_lossy(&head).into_owned();
        assert!(head.starts_with("HTTP/1.1 200"), "{what}: {head:?}");
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .expect("a content-length");
        let mut body = vec![0; length];
        halves.read_exact(&mut body).expect("the response body");
        let body = String::from_utf8_lossy(&body);
        assert!(body.starts_with("20000 "), "{what}: {body:?}");
    }
}

/// Stalled TLS clients held at once on the inbound mesh port.
const STALLED_HELLOS: usize = 300;

/// A flood of connections to the inbound mesh port that stall in their handshake, half after
/// the first bytes of a ClientHello and half silent: each is closed within the handshake bound
/// (`tls.handshake_timeout`, 2 s here; at most twice that: while the ClientHello is read, and
/// again for the rest of the handshake), and a mesh client with a good certificate is served
/// meanwhile.
#[test]
fn stalled_client_hellos_on_the_mesh_port_time_out_and_good_clients_are_served() {
    use remora_e2e::certs::MeshCa;
    use remora_e2e::mesh::{has_openssl, s_client, CLIENT_ID, SERVER_ID};
    if !has_openssl() {
        return;
    }
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let ca = MeshCa::new("cluster.local");
    let server_dir = net.binary().make_dir("server-certs");
    ca.install(&server_dir, &ca.workload(SERVER_ID));
    let good = net.binary().make_dir("good-client");
    ca.install(&good, &ca.workload(CLIENT_ID));
    net.capture_default();
    let remora = net
        .remora()
        .config(&format!(
            "tls:\n  cert_dir: {}\n  handshake_timeout: 2s\nmesh:\n  mtls_mode: strict\n",
            server_dir.display()
        ))
        .start_ready();
    let _app = Server::http(&net.pod, any_addr(ORIGIN_PORT), "hello from the pod");
    let target = net.pod_addr(ORIGIN_PORT);

    // A TLS record header and the start of a ClientHello announcing far more than is sent.
    let partial_hello: &[u8] = &[
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03, 0x11, 0x22,
    ];
    let started = Instant::now();
    let mut stalled: Vec<TcpStream> = (0..STALLED_HELLOS)
        .map(|i| {
            let mut s = peer::connect(&net.peer, target)
                .unwrap_or_else(|e| panic!("stalled client {i}: {e}"));
            if i % 2 == 0 {
                s.write_all(partial_hello).expect("a partial ClientHello");
            }
            s
        })
        .collect();

    // A mesh client is served while they stall.
    let file = |f: &str| good.join(f).to_string_lossy().into_owned();
    let (chain, key, root) = (
        file("cert-chain.pem"),
        file("key.pem"),
        file("root-cert.pem"),
    );
    let out = s_client(
        &net.peer,
        target,
        &[
            "-alpn",
            "istio-http/1.1,istio",
            "-cert",
            &chain,
            "-key",
            &key,
            "-CAfile",
            &root,
            "-verify_return_error",
        ],
        b"GET / HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n",
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("hello from the pod"),
        "a mesh client was not served during the flood: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        remora.stderr()
    );
    let good_served_after = started.elapsed();

    // Every stalled client is closed by the bound: twice the handshake timeout, and a margin.
    let bound = Duration::from_secs(2 * 2 + 2);
    let mut latest = Duration::ZERO;
    for (i, s) in stalled.iter_mut().enumerate() {
        s.set_read_timeout(Some(
            bound
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(10)),
        ))
        .expect("read timeout");
        let mut buf = [0u8; 64];
        let ended = loop {
            match s.read(&mut buf) {
                // An alert, if any, then the close.
                Ok(n) if n > 0 => continue,
                Ok(_) => break true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break false,
                Err(_) => break true,
            }
        };
        assert!(
            ended,
            "stalled client {i} still open after {:?}",
            started.elapsed()
        );
        latest = started.elapsed();
    }
    eprintln!(
        "{STALLED_HELLOS} stalled handshakes all closed by {latest:?}; a good client was served \
         after {good_served_after:?}"
    );
    // Under STRICT, detection waits `tls.handshake_timeout` for a whole ClientHello; a client
    // that never completes one is refused there (counted as detection timeouts, and as
    // handshakes refused for want of mesh TLS).
    let m = remora.wait_for_metrics("stalled handshakes counted", Duration::from_secs(5), |m| {
        m.value("remora_protocol_detection_total", &[("result", "timeout")])
            >= STALLED_HELLOS as f64
    });
    assert!(
        m.value(
            "remora_tls_handshakes_total",
            &[("direction", "inbound"), ("result", "ok")]
        ) >= 1.0,
        "{m}"
    );
    assert!(
        latest >= Duration::from_millis(1800),
        "closed before the handshake timeout: {latest:?}"
    );
}
