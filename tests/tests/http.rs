//! HTTP through the sidecar, end to end: detection (server-first protocols included), HTTP/1.1
//! pooling and streaming, Envoy's errors and flags, retries, Upgrade, HTTP/2 and gRPC — with
//! real clients (curl, Python grpcio) and real servers, through the capture rules.

use remora_e2e::peer::{self, any_addr, curl_ok, Server};
use remora_e2e::service::{http_origin as origin, Service};
use remora_e2e::PodNet;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

/// Bound on one curl exchange.
const CURL_TIME: Duration = Duration::from_secs(20);
/// The origin's port, on the peer (outbound tests) or in the pod (inbound tests).
const ORIGIN_PORT: u16 = 8080;
/// Detection timeout the server-first tests configure: far longer than they allow.
const LONG_DETECTION: &str = "detection:\n  timeout: 30s\n";
/// What a server-first test allows for the banner to arrive.
const BANNER_BOUND: Duration = Duration::from_secs(5);

/// A server that greets first, then echoes lines: SMTP's and MySQL's shape.
fn banner_server(ns: &remora_e2e::Netns, addr: SocketAddr) -> Server {
    Server::start(ns, addr, |mut stream| {
        stream.write_all(b"220 remora-e2e ready\r\n")?;
        let mut buf = [0u8; 1024];
        // Bounded by the stream's read timeout and the client's few lines.
        for _ in 0..100 {
            let n = stream.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            stream.write_all(&buf[..n])?;
        }
        Ok(())
    })
}

/// Connect from `ns`, send nothing, and read the greeting; returns it and how long it took.
fn read_banner(ns: &remora_e2e::Netns, addr: SocketAddr) -> (String, Duration) {
    let started = Instant::now();
    let mut stream = peer::connect(ns, addr).expect("connect to the banner server");
    stream
        .set_read_timeout(Some(BANNER_BOUND))
        .expect("set a read timeout");
    let mut buf = [0u8; 64];
    let n = stream.read(&mut buf).unwrap_or_else(|e| {
        panic!(
            "no banner within {BANNER_BOUND:?} ({e}): the proxy made a server-first protocol wait"
        )
    });
    let banner = String::from_utf8_lossy(&buf[..n]).into_owned();
    // The connection is TCP from here: what the client says comes back.
    stream
        .write_all(b"HELO remora\r\n")
        .expect("write after banner");
    let n = stream.read(&mut buf).expect("echo after banner");
    assert_eq!(&buf[..n], b"HELO remora\r\n");
    (banner, started.elapsed())
}

#[test]
fn server_first_banner_arrives_at_once_despite_a_30s_detection_timeout() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().config(LONG_DETECTION).start_ready();
    // Not one of Istio's always-TCP ports: this one is detected.
    let outbound = banner_server(&net.peer, net.peer_addr(2526));
    let inbound = banner_server(&net.pod, any_addr(2527));

    let (banner, took) = read_banner(&net.pod, outbound.addr());
    assert_eq!(banner, "220 remora-e2e ready\r\n");
    assert!(took < BANNER_BOUND, "outbound banner took {took:?}");

    let (banner, took) = read_banner(&net.peer, net.pod_addr(2527));
    assert_eq!(banner, "220 remora-e2e ready\r\n");
    assert!(took < BANNER_BOUND, "inbound banner took {took:?}");
    assert_eq!(
        inbound.peers()[0].ip(),
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6))
    );
    assert_eq!(
        outbound.peers().len(),
        1,
        "one upstream connection per client connection"
    );
    drop(remora);
}

#[test]
fn inbound_to_a_closed_port_resets_a_silent_client_at_once_and_answers_http_503_uf() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config(&format!("{LONG_DETECTION}access_log:\n  enabled: true\n"))
        .start_ready();
    // Nothing listens on this pod port, and it is detected (not one of the always-TCP ports).
    let closed = net.pod_addr(2529);

    // A client waiting for its server to speak first learns at once that there is none.
    let started = Instant::now();
    let mut stream = peer::connect(&net.peer, closed).expect("connect");
    let mut buf = [0u8; 16];
    let read = stream.read(&mut buf);
    let took = started.elapsed();
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "a closed port answered {read:?}"
    );
    assert!(
        took < BANNER_BOUND,
        "a silent client waited {took:?} for a destination that refused (detection: 30 s)"
    );

    // An HTTP client gets Envoy's answer instead of a reset.
    let (status, body) = peer::curl_status(&net.peer, &[&format!("http://{closed}/")], CURL_TIME);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("connection failure"), "{body}");
    remora.wait_for_access_log("\"GET / HTTP/1.1\" 503 UF");
}

#[test]
fn http1_keep_alive_uses_one_pooled_upstream_connection_and_rewrites_headers() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().env("REMORA_LOG", "debug").start_ready();
    let _origin = origin(&net.peer, net.peer_addr(ORIGIN_PORT));
    let base = format!("http://{}", net.peer_addr(ORIGIN_PORT));

    // Three requests on one client connection, then a second client connection.
    let out = peer::curl(
        &net.pod,
        &[
            "-H",
            "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "-H",
            "b3: 80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1",
            "-H",
            "Connection: x-hop",
            "-H",
            "x-hop: secret",
            &format!("{base}/hello"),
            &format!("{base}/hello"),
            &format!("{base}/headers"),
        ],
        CURL_TIME,
    );
    let body = curl_ok(&out, "keep-alive requests");
    assert!(body.starts_with("hello\nhello\n{"), "{body}");
    let headers = &body["hello\nhello\n".len()..];
    assert!(
        headers.contains(
            "\"traceparent\": \"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\""
        ),
        "{headers}"
    );
    assert!(
        headers.contains("\"b3\": \"80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1\""),
        "{headers}"
    );
    assert!(
        headers.contains("\"x-forwarded-proto\": \"http\""),
        "{headers}"
    );
    assert!(headers.contains("\"x-request-id\": \""), "{headers}");
    assert!(
        headers.contains(&format!("\"host\": \"{}\"", net.peer_addr(ORIGIN_PORT))),
        "{headers}"
    );
    assert!(
        !headers.contains("x-hop"),
        "a header named by Connection was forwarded: {headers}"
    );
    assert!(
        !headers.contains("\"connection\""),
        "Connection was forwarded: {headers}"
    );

    let out = peer::curl(&net.pod, &[&format!("{base}/connections")], CURL_TIME);
    // One is the start-up probe that saw the origin listening; the other is the connection
    // opened while the first client connection was detected, pooled and shared since.
    assert_eq!(
        curl_ok(&out, "connection count"),
        "2",
        "four requests on two client connections should share one upstream connection; {}",
        remora.stderr()
    );
    drop(remora);
}

#[test]
fn ten_megabyte_bodies_stream_both_ways_sized_and_chunked_with_100_continue() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().start_ready();
    let _origin = origin(&net.peer, net.peer_addr(ORIGIN_PORT));
    let base = format!("http://{}", net.peer_addr(ORIGIN_PORT));
    let size = 10 << 20;
    let upload = net.binary().write_file("upload.bin", "");
    std::fs::write(&upload, peer::pattern(size)).expect("write the upload");
    let digest = sha256(&upload);
    let upload_arg = format!("@{}", upload.display());

    // Sized (curl sends `Expect: 100-continue` for a body this large and waits for the 100).
    let out = peer::curl(
        &net.pod,
        &[
            "--data-binary",
            &upload_arg,
            "-H",
            "Expect: 100-continue",
            &format!("{base}/upload"),
        ],
        CURL_TIME,
    );
    assert_eq!(curl_ok(&out, "sized upload"), format!("{size} {digest}"));
    // Chunked.
    let out = peer::curl(
        &net.pod,
        &[
            "--data-binary",
            &upload_arg,
            "-H",
            "Transfer-Encoding: chunked",
            &format!("{base}/upload"),
        ],
        CURL_TIME,
    );
    assert_eq!(curl_ok(&out, "chunked upload"), format!("{size} {digest}"));

    for query in ["", "&chunked=1"] {
        let file = net.binary().write_file("download.bin", "");
        let out = peer::curl(
            &net.pod,
            &[
                "-o",
                &file.to_string_lossy(),
                &format!("{base}/download?size={size}{query}"),
            ],
            CURL_TIME,
        );
        curl_ok(&out, "download");
        let got = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        assert_eq!(got, size as u64, "download{query} size");
    }
    drop(remora);
}

#[test]
fn upstream_down_is_503_uf_and_retries_run_out_with_urx() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config("access_log:\n  enabled: true\n")
        .start_ready();
    // Nothing listens on this port on the peer; a rule there counts the SYNs that arrive.
    let syn_rule = ["INPUT", "-p", "tcp", "--dport", "8999", "--syn"];
    let mut add = net.peer.command("iptables");
    add.arg("-A").args(syn_rule);
    let added = remora_e2e::process::run_bounded(&mut add, CURL_TIME).expect("run iptables");
    assert!(added.status.success(), "iptables -A: {added:?}");
    let url = format!("http://{}/nothing", net.peer_addr(8999));
    let (status, _) = peer::curl_status(&net.pod, &[&url], CURL_TIME);
    assert_eq!(status, 503, "GET to a closed port");
    remora.wait_for_access_log("\"GET /nothing HTTP/1.1\" 503 URX,UF");
    // Three connects, as Envoy's router makes with Istio's two retries: the one opened while
    // the request was detected is the first attempt, not one more.
    let mut list = net.peer.command("iptables");
    list.args(["-L", "INPUT", "-v", "-x", "-n"]);
    let listed = remora_e2e::process::run_bounded(&mut list, CURL_TIME).expect("run iptables");
    let table = String::from_utf8_lossy(&listed.stdout);
    let syns = table
        .lines()
        .find(|l| l.contains("dpt:8999"))
        .and_then(|l| l.split_whitespace().next()?.parse::<u32>().ok());
    assert_eq!(
        syns,
        Some(3),
        "connect attempts to the closed port:\n{table}"
    );
}

#[test]
fn a_retry_succeeds_on_the_second_attempt_and_one_runs_out() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config("access_log:\n  enabled: true\n")
        .start_ready();
    let _origin = origin(&net.peer, net.peer_addr(ORIGIN_PORT));
    let base = format!("http://{}", net.peer_addr(ORIGIN_PORT));

    let out = peer::curl(
        &net.pod,
        &[&format!("{base}/flaky?key=once&fail=1")],
        CURL_TIME,
    );
    assert_eq!(curl_ok(&out, "flaky once"), "ok after 1 attempt=2\n");
    // A replayable body is sent again with the retry.
    let out = peer::curl(
        &net.pod,
        &[
            "--data-binary",
            "small body",
            &format!("{base}/flaky?key=post&fail=2"),
        ],
        CURL_TIME,
    );
    assert_eq!(curl_ok(&out, "flaky POST"), "ok after 2 attempt=3\n");

    let url = format!("{base}/flaky?key=always&fail=9");
    let (status, _) = peer::curl_status(&net.pod, &[&url], CURL_TIME);
    assert_eq!(status, 503, "flaky always");
    remora.wait_for_access_log("/flaky?key=always&fail=9 HTTP/1.1\" 503 URX");
}

#[test]
fn websocket_upgrade_becomes_a_byte_tunnel() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config("access_log:\n  enabled: true\n")
        .start_ready();
    let _origin = origin(&net.peer, net.peer_addr(ORIGIN_PORT));
    let mut stream = peer::connect(&net.pod, net.peer_addr(ORIGIN_PORT)).expect("connect");
    stream
        .write_all(
            b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
              Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        )
        .expect("send the upgrade");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 4096 {
        stream.read_exact(&mut byte).unwrap_or_else(|e| {
            panic!(
                "reading the 101 ({e}): {:?}\n{}",
                String::from_utf8_lossy(&head),
                remora.stderr()
            )
        });
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: websocket"),
        "{head}"
    );
    let data = peer::pattern(256 << 10);
    let mut writer = stream.try_clone().expect("clone");
    let sending = {
        let data = data.clone();
        std::thread::spawn(move || writer.write_all(&data))
    };
    let mut echoed = vec![0u8; data.len()];
    stream
        .read_exact(&mut echoed)
        .expect("echo through the tunnel");
    sending.join().expect("writer").expect("write");
    peer::assert_same_bytes("tunnelled bytes", &data, &echoed);
    // The request ends with the tunnel, as Envoy logs an upgrade: no line while it is open,
    // then one with the 101 and the bytes the tunnel carried each way.
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !remora.stdout().contains("GET /ws"),
        "logged before the tunnel closed:\n{}",
        remora.stdout()
    );
    drop(stream);
    remora.wait_for_access_log(&format!("\"GET /ws HTTP/1.1\" 101 - {0} {0} ", data.len()));
}

fn sha256(path: &std::path::Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("run sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// `program` on PATH, or a skip (a failure under CI=true).
fn have(program: &str) -> bool {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        remora_e2e::environment::skip::<()>(&format!(
            "{program} is not installed (scripts/install-test-deps installs it)"
        ));
    }
    found
}

#[test]
fn mariadb_greets_its_client_at_once_through_detection() {
    if !have("mariadbd") || !have("mariadb-install-db") {
        return;
    }
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().config(LONG_DETECTION).start_ready();
    // Not 3306 (which is never sniffed): this port goes through detection.
    let port = 13306;
    let data = tempfile::tempdir().expect("a data directory");
    let datadir = data.path().join("data");
    let datadir_arg = format!("--datadir={}", datadir.display());
    let mut install = std::process::Command::new("mariadb-install-db");
    install.args([
        "--no-defaults",
        &datadir_arg,
        "--user=root",
        "--skip-test-db",
        "--auth-root-authentication-method=normal",
    ]);
    let out = remora_e2e::process::run_bounded(&mut install, Duration::from_secs(120))
        .expect("mariadb-install-db");
    assert!(
        out.status.success(),
        "mariadb-install-db failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let socket = format!("--socket={}", data.path().join("sock").display());
    let pid_file = format!("--pid-file={}", data.path().join("pid").display());
    let log = format!("--log-error={}", data.path().join("err.log").display());
    let port_arg = format!("--port={port}");
    let _mariadb = Service::start(
        &net.peer,
        "mariadbd",
        &[
            "--no-defaults",
            &datadir_arg,
            &socket,
            &pid_file,
            &log,
            &port_arg,
            "--bind-address=0.0.0.0",
            "--user=root",
            "--skip-grant-tables",
            "--skip-name-resolve",
        ],
        net.peer_addr(port),
    );

    // The client sends nothing: MySQL's protocol starts with the server's greeting.
    let started = Instant::now();
    let mut stream = peer::connect(&net.pod, net.peer_addr(port)).expect("connect to MariaDB");
    stream
        .set_read_timeout(Some(BANNER_BOUND))
        .expect("timeout");
    let mut greeting = [0u8; 128];
    let n = stream.read(&mut greeting).unwrap_or_else(|e| {
        panic!(
            "no MariaDB greeting within {BANNER_BOUND:?} ({e}); remora:\n{}",
            remora.stderr()
        )
    });
    let took = started.elapsed();
    assert!(took < BANNER_BOUND, "the greeting took {took:?}");
    // A handshake packet: 3-byte length, sequence 0, protocol version 10, server version.
    assert!(
        n > 5 && greeting[3] == 0 && greeting[4] == 10,
        "{:?}",
        &greeting[..n]
    );
    assert!(
        String::from_utf8_lossy(&greeting[5..n]).contains("MariaDB"),
        "{:?}",
        String::from_utf8_lossy(&greeting[..n])
    );
    drop(stream);

    // A real client session, query and answer, through the proxy.
    if have("mariadb") {
        let mut client = net.pod.command("mariadb");
        client.args([
            "--no-defaults",
            "--protocol=tcp",
            "-h",
            &net.peer_ip.to_string(),
            "-P",
            &port.to_string(),
            "-u",
            "root",
            "--connect-timeout=5",
            "-N",
            "-e",
            "SELECT 40 + 2",
        ]);
        let out = remora_e2e::process::run_bounded(&mut client, Duration::from_secs(20))
            .expect("mariadb client");
        assert!(
            out.status.success(),
            "mariadb client failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");
    }
}

/// Resident memory of a process, in bytes (`VmRSS` in /proc).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[test]
fn a_slow_reader_slows_the_writer_and_memory_stays_bounded() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net.remora().start_ready();
    let _origin = origin(&net.peer, net.peer_addr(ORIGIN_PORT));
    let size: usize = 256 << 20;
    let baseline = rss(remora.pid());

    let mut stream = peer::connect(&net.pod, net.peer_addr(ORIGIN_PORT)).expect("connect");
    write!(
        stream,
        "GET /download?size={size} HTTP/1.1\r\nHost: origin\r\n\r\n"
    )
    .expect("send");
    let mut buf = vec![0u8; 1 << 20];
    stream.read_exact(&mut buf).expect("the first MiB");
    // Stop reading: the origin keeps writing until every window and buffer on the way is full.
    std::thread::sleep(Duration::from_secs(2));
    let grown = rss(remora.pid()).saturating_sub(baseline);
    assert!(
        grown < 32 << 20,
        "remora grew by {} MiB while its client did not read a 256 MiB response",
        grown >> 20
    );
    // Reading again drains the whole response: the writer was slowed, not failed.
    let mut total = buf.len();
    let deadline = Instant::now() + Duration::from_secs(60);
    while total < size && Instant::now() < deadline {
        let n = stream.read(&mut buf).expect("the rest");
        assert!(n > 0, "response ended after {total} bytes");
        total += n;
    }
    assert!(
        total >= size,
        "read {total} of {size} bytes within the bound"
    );
}
