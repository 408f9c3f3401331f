//! Overload and resource exhaustion (issue #33): the global and per-listener connection limits
//! refuse new connections at once and count them while open ones keep working; accept survives
//! running out of file descriptors without spinning and recovers when descriptors are freed.
//! Every test runs the real binary in a pod namespace with the capture rules `remora capture`
//! writes, against servers in a peer namespace.

use remora_e2e::peer::{self, any_addr, Server};
use remora_e2e::{Netns, PodNet, Remora};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

/// Where the echo servers listen, declared `tcp` so connections are proxied as opaque bytes
/// from their first byte.
const ECHO_PORT: u16 = 9000;
/// Longest a refused connection may take to be told: a reset is at once.
const REFUSAL_BOUND: Duration = Duration::from_secs(2);

/// A config with the echo port declared TCP and `overload` as given.
fn config(overload: &str) -> String {
    format!("ports:\n  {ECHO_PORT}: tcp\n{overload}")
}

/// A connection through the proxy that has shown it is proxied: one echo round trip.
fn hold(ns: &Netns, addr: SocketAddr) -> io::Result<TcpStream> {
    let mut s = peer::connect(ns, addr)?;
    round_trip(&mut s, b"hello")?;
    Ok(s)
}

/// Write `data` and read it back.
fn round_trip(s: &mut TcpStream, data: &[u8]) -> io::Result<()> {
    s.write_all(data)?;
    let mut back = vec![0; data.len()];
    s.read_exact(&mut back)?;
    if back != data {
        return Err(io::Error::other("echo returned other bytes"));
    }
    Ok(())
}

/// How a connection past a limit ended for the client: `Ok(())` if it was reset (or closed)
/// without an answer within [`REFUSAL_BOUND`], the error otherwise.
fn assert_refused(ns: &Netns, addr: SocketAddr, what: &str) {
    let started = Instant::now();
    // The reset may come before `connect` has looked at the socket's state.
    let mut s = match peer::connect(ns, addr) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return,
        Err(e) => panic!("{what}: connect: {e}"),
    };
    s.set_read_timeout(Some(REFUSAL_BOUND))
        .expect("read timeout");
    let _ = s.write_all(b"hello");
    let mut buf = [0; 16];
    match s.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
    assert!(
        started.elapsed() < REFUSAL_BOUND,
        "{what}: refused only after {:?}",
        started.elapsed()
    );
}

fn counter(remora: &Remora, name: &str, labels: &[(&str, &str)]) -> f64 {
    remora.metrics().value(name, labels)
}

#[test]
fn connection_limits_refuse_new_connections_at_once_and_open_ones_keep_working() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config(&config(
            "overload:\n  max_connections: 40\n  max_connections_per_listener: 30\n",
        ))
        .start_ready();
    let _outbound_echo = Server::echo(&net.peer, net.peer_addr(ECHO_PORT));
    let _inbound_echo = Server::echo(&net.pod, any_addr(ECHO_PORT));
    let outbound = net.peer_addr(ECHO_PORT);
    let inbound = net.pod_addr(ECHO_PORT);
    let m = remora.metrics();
    assert_eq!(m.value("remora_max_connections", &[]), 40.0, "{m}");
    assert_eq!(
        m.value("remora_max_connections_per_listener", &[]),
        30.0,
        "{m}"
    );

    // The outbound listener's own limit.
    let mut held: Vec<TcpStream> = (0..30)
        .map(|i| hold(&net.pod, outbound).unwrap_or_else(|e| panic!("outbound {i}: {e}")))
        .collect();
    assert_refused(&net.pod, outbound, "the 31st outbound connection");
    let listener_15001 = [("listener_address", "0.0.0.0_15001")];
    assert_eq!(
        counter(
            &remora,
            "envoy_listener_downstream_cx_overflow",
            &listener_15001
        ),
        1.0
    );

    // Inbound has room under its own limit, but only ten places are left globally.
    for i in 0..10 {
        held.push(hold(&net.peer, inbound).unwrap_or_else(|e| panic!("inbound {i}: {e}")));
    }
    assert_refused(&net.peer, inbound, "the 41st connection, inbound");
    let m = remora.metrics();
    let listener_15006 = [("listener_address", "0.0.0.0_15006")];
    assert_eq!(
        m.value(
            "envoy_listener_downstream_global_cx_overflow",
            &listener_15006
        ),
        1.0,
        "{m}"
    );
    assert_eq!(
        m.value("envoy_listener_downstream_cx_overflow", &listener_15006),
        0.0,
        "{m}"
    );
    for (direction, limit) in [("outbound", "listener"), ("inbound", "global")] {
        let labels = [("direction", direction), ("limit", limit)];
        assert_eq!(
            m.value("remora_connections_overflow_total", &labels),
            1.0,
            "{m}"
        );
    }

    // The refusals touched none of the open connections.
    for (i, s) in held.iter_mut().enumerate() {
        round_trip(s, b"still here").unwrap_or_else(|e| panic!("held connection {i}: {e}"));
    }

    // Closing five outbound connections frees five places, on both counts.
    held.drain(..5);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut fresh = loop {
        match hold(&net.pod, outbound) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                eprintln!("not yet: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("no place freed after closing five connections: {e}"),
        }
    };
    round_trip(&mut fresh, b"served").expect("the new connection is proxied");
    drop(held);
}

/// Open descriptors of process `pid`.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(Iterator::count)
        .unwrap_or_else(|e| panic!("/proc/{pid}/fd: {e}"))
}

/// CPU time process `pid` has used, in clock ticks (user plus system, `/proc/PID/stat`).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // The command name is in parentheses and may hold spaces: count fields after it.
    let after = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let ticks = |i: usize| fields[i].parse::<u64>().expect("a tick count");
    ticks(11) + ticks(12)
}

fn clock_ticks_per_second() -> u64 {
    let out = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .expect("getconf");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(100)
}

#[test]
fn accept_backs_off_when_descriptors_run_out_and_recovers_when_they_are_freed() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    if !remora_e2e::environment::has_command("prlimit") {
        remora_e2e::environment::skip::<()>("prlimit (util-linux) is not installed");
        return;
    }
    net.capture_default();
    // Connection limits far away, so the descriptor table runs out first.
    let remora = net
        .remora()
        .config(&config("overload:\n  max_connections: 100000\n"))
        .start_ready();
    let _echo = Server::echo(&net.peer, net.peer_addr(ECHO_PORT));
    let dst = net.peer_addr(ECHO_PORT);
    // Lower the running process's limit: room for about twenty proxied connections (two
    // descriptors each) over what it holds now.
    let pid = remora.pid();
    let limit = open_fds(pid) + 40;
    // As remora's own user: lowering a limit needs no capability then (the tests' root may
    // lack CAP_SYS_RESOURCE, which another user's process would need).
    let uid = remora_e2e::PROXY_UID.to_string();
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            &uid,
            "--regid",
            &uid,
            "--clear-groups",
            "prlimit",
        ])
        .args([
            "--pid",
            &pid.to_string(),
            &format!("--nofile={limit}:{limit}"),
        ])
        .output()
        .expect("run prlimit");
    assert!(
        out.status.success(),
        "prlimit failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Fill the table. A connection accepted with the last descriptor finds none for its
    // upstream and is reset; then one more descriptor is taken by a connection to the
    // readiness port (loopback, not captured), so that the table is exactly full and the next
    // accept fails.
    let mut held = Vec::new();
    let mut filler = None;
    let pending = loop {
        assert!(
            held.len() < 100,
            "the table never filled: {}",
            remora.stderr()
        );
        let attempt = peer::connect(&net.pod, dst).and_then(|s| {
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            Ok(s)
        });
        let mut s = match attempt {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                // Accepted with the last descriptor and reset for want of another.
                assert!(filler.is_none(), "reset twice ({e}): {}", remora.stderr());
                let readiness = SocketAddr::from((Ipv4Addr::LOCALHOST, 15021));
                filler = Some(peer::connect(&net.pod, readiness).expect("connect to readiness"));
                continue;
            }
            Err(e) => panic!("connect: {e}"),
        };
        match round_trip(&mut s, b"hello") {
            Ok(()) => held.push(s),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut =>
            {
                // Not accepted: it waits in the backlog.
                break s;
            }
            Err(e) => {
                assert!(filler.is_none(), "reset twice ({e}): {}", remora.stderr());
                let readiness = SocketAddr::from((Ipv4Addr::LOCALHOST, 15021));
                filler = Some(peer::connect(&net.pod, readiness).expect("connect to readiness"));
            }
        }
    };
    // The limit bounds descriptor numbers, not their count: one opened before it was lowered
    // may sit above it, so the count is only reported.
    eprintln!("{} descriptors open, limit {limit}", open_fds(pid));

    // Out of descriptors, the accept loops back off: CPU stays low.
    let ticks = clock_ticks_per_second();
    let window = Duration::from_secs(3);
    let before = cpu_ticks(pid);
    std::thread::sleep(window);
    let used = cpu_ticks(pid) - before;
    let used_ms = used * 1000 / ticks;
    eprintln!(
        "CPU while out of descriptors: {used_ms} ms over {window:?} ({} held)",
        held.len()
    );
    // A spinning accept loop would use the whole window, retrying on every timer tick about
    // a tenth of it; backing off uses a few tens of ms.
    assert!(
        used_ms < window.as_millis() as u64 / 20,
        "accept spun: {used_ms} ms of CPU in {window:?}"
    );

    // Descriptors freed: the connection waiting in the backlog is taken and proxied, and new
    // connections are served.
    drop(held);
    drop(filler);
    let mut pending = pending;
    pending
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let mut back = [0; 5];
    pending.read_exact(&mut back).unwrap_or_else(|e| {
        panic!(
            "the waiting connection was not served: {e}\n{}",
            remora.stderr()
        )
    });
    assert_eq!(&back, b"hello");
    let mut fresh = hold(&net.pod, dst).expect("a new connection after recovery");
    round_trip(&mut fresh, b"again").expect("served");
    let m = remora.metrics();
    assert!(
        m.value("remora_accept_errors_total", &[("listener", "outbound")]) >= 1.0,
        "{m}"
    );
    // Rate-limited: one line per listener per five seconds, not one per attempt.
    let lines = remora.stderr().matches("accept failed").count();
    assert!(
        (1..=4).contains(&lines),
        "{lines} log lines:\n{}",
        remora.stderr()
    );
}

/// The origin's port (tests/peers/http_server.py).
const ORIGIN_PORT: u16 = 8080;

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

/// Resident memory of process `pid`, in KiB (`VmRSS`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The size of each slow reader's response.
const LARGE_RESPONSE: usize = 1 << 20;
/// Slow readers at once.
const SLOW_READERS: usize = 500;
/// Where the peer sends `LARGE_RESPONSE` bytes of opaque TCP to each connection.
const BULK_PORT: u16 = 9100;
/// What Remora may hold per stalled reader, over its memory before them, in KiB, by path: the
/// per-connection buffer bounds of docs/hardening.md ("Overload") with room for the
/// connection's own state and allocator slack. The fast path lends one 8 KiB buffer at a time
/// (measured: 24 KiB per connection in all); hyper's path buffers at most 64 KiB each way on
/// each leg, its read buffer and its queue (measured: 266 KiB, 828 KiB before those bounds);
/// opaque TCP reads at most 1 MiB at a time per direction, but the kernel's socket buffers
/// take a stalled 1 MiB response first (measured: 7 KiB), so a copy that held what it read
/// whole would show here.
const FAST_PATH_KIB: u64 = 64;
const HYPER_PATH_KIB: u64 = 384;
const TCP_KIB: u64 = 128;

/// Open `SLOW_READERS` connections to `dst`, send `request` on each and read nothing for a
/// while; returns Remora's memory growth meanwhile (KiB), then reads every response whole.
fn stalled_readers(net: &PodNet, pid: u32, dst: SocketAddr, request: &[u8], what: &str) -> u64 {
    let before = rss_kib(pid);
    let mut streams: Vec<TcpStream> = (0..SLOW_READERS)
        .map(|i| {
            let mut s = peer::connect(&net.pod, dst)
                .unwrap_or_else(|e| panic!("{what}: connection {i}: {e}"));
            s.write_all(request).expect("request");
            s
        })
        .collect();
    // Let every response run into whatever holds it: the kernel's socket buffers, then the
    // proxy's own.
    let mut peak = 0;
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(300));
        peak = peak.max(rss_kib(pid));
    }
    let grew = peak.saturating_sub(before);
    eprintln!(
        "{what}: {SLOW_READERS} stalled readers of {LARGE_RESPONSE} bytes: RSS {before} KiB -> \
         {peak} KiB (+{grew} KiB, {} KiB each)",
        grew / SLOW_READERS as u64
    );
    for (i, s) in streams.iter_mut().enumerate() {
        let mut got = Vec::new();
        s.read_to_end(&mut got)
            .unwrap_or_else(|e| panic!("{what}: reading response {i}: {e}"));
        assert!(
            got.len() >= LARGE_RESPONSE,
            "{what}: response {i} was {} bytes",
            got.len()
        );
    }
    grew
}

/// 500 clients each ask for 1 MiB and do not read it: Remora's memory stays within a stated
/// bound per connection, over HTTP (the fast path, and hyper's) and over opaque TCP, and every
/// response is delivered whole once the clients read. Each case runs on a fresh Remora, so
/// that memory one case freed does not hide the next one's.
#[test]
fn stalled_readers_of_large_responses_keep_memory_bounded() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    // Servers on a thread per connection with Rust's backlog (the Python origin's is five).
    let _origin = Server::start(&net.peer, net.peer_addr(ORIGIN_PORT), |mut s| {
        peer::read_request_head(&mut s)?;
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {LARGE_RESPONSE}\r\nConnection: close\r\n\r\n"
        );
        s.write_all(head.as_bytes())?;
        s.write_all(&vec![b'y'; LARGE_RESPONSE])
    });
    let _bulk = Server::start(&net.peer, net.peer_addr(BULK_PORT), |mut s| {
        let mut go = [0u8; 2];
        s.read_exact(&mut go)?;
        s.write_all(&vec![b'z'; LARGE_RESPONSE])
    });
    let get = &b"GET /large HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"[..];
    for (what, fast_path, port, request, per_reader) in [
        ("HTTP, fast path", true, ORIGIN_PORT, get, FAST_PATH_KIB),
        (
            "HTTP, hyper's path",
            false,
            ORIGIN_PORT,
            get,
            HYPER_PATH_KIB,
        ),
        ("TCP", true, BULK_PORT, &b"go"[..], TCP_KIB),
    ] {
        let bound = per_reader * SLOW_READERS as u64;
        let remora = net
            .remora()
            .config(&format!(
                "ports:\n  {BULK_PORT}: tcp\nhttp:\n  fast_path: {fast_path}\n"
            ))
            .start_ready();
        let dst = net.peer_addr(port);
        // Warm up: the pools, the allocator's arenas and the worker's first buffers.
        for _ in 0..5 {
            let mut s = peer::connect(&net.pod, dst).expect("connect");
            s.write_all(request).expect("request");
            let mut got = Vec::new();
            s.read_to_end(&mut got).expect("warm-up response");
        }
        let grew = stalled_readers(&net, remora.pid(), dst, request, what);
        assert!(
            grew < bound,
            "{what}: RSS grew {grew} KiB with {SLOW_READERS} stalled readers (bound {bound} KiB)"
        );
    }
}

/// Idle keep-alive connections held at once.
const IDLE_CONNECTIONS: usize = 10_000;
/// What Remora may hold per idle keep-alive HTTP/1.1 connection, in KiB: the connection's
/// task and socket, no buffer (docs/hardening.md, "Overload"; measured: 7.2 KiB).
const PER_IDLE_CONNECTION_KIB: u64 = 12;

/// The hard open-file limit of this process, after raising its soft limit to it (which needs
/// no privilege).
fn raise_own_nofile() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").expect("/proc/self/limits");
    let hard: u64 = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let _ = Command::new("prlimit")
        .args([
            "--pid",
            &std::process::id().to_string(),
            &format!("--nofile={hard}:{hard}"),
        ])
        .status();
    hard
}

/// 10,000 keep-alive connections that made one request each and went idle: Remora's memory
/// per connection stays within a stated bound, a new request is still served at once, and
/// `http.idle_timeout` closes them all.
#[test]
fn ten_thousand_idle_keep_alive_connections_cost_little_and_are_closed_when_idle() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    // This process holds the clients; Remora inherits the same hard limit and needs one
    // descriptor per idle connection.
    let hard = raise_own_nofile();
    if hard < IDLE_CONNECTIONS as u64 + 2_000 {
        remora_e2e::skip::<()>(&format!(
            "the open-file limit ({hard}) is too low for {IDLE_CONNECTIONS} connections"
        ));
        return;
    }
    net.capture_default();
    let remora = net
        .remora()
        .config(&format!(
            "http:\n  idle_timeout: 20s\noverload:\n  max_connections: {IDLE_CONNECTIONS}0\n"
        ))
        .start_ready();
    let _origin = Server::start(&net.peer, net.peer_addr(ORIGIN_PORT), |mut s| {
        // Keep-alive: answer every request on the connection until the proxy closes it.
        loop {
            if peer::read_request_head(&mut s).is_err() {
                return Ok(());
            }
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")?;
        }
    });
    let dst = net.peer_addr(ORIGIN_PORT);
    let get = b"GET /idle HTTP/1.1\r\nHost: a\r\n\r\n";
    let request = |s: &mut TcpStream| -> io::Result<()> {
        s.write_all(get)?;
        let head = peer::read_request_head(s)?;
        let mut body = [0u8; 3];
        s.read_exact(&mut body)?;
        if !head.starts_with(b"HTTP/1.1 200") {
            return Err(io::Error::other(
                String::from_utf8_lossy(&head).into_owned(),
            ));
        }
        Ok(())
    };
    let pid = remora.pid();
    // Warm up the pool and the worker, then measure from there.
    for _ in 0..50 {
        let mut s = peer::connect(&net.pod, dst).expect("connect");
        request(&mut s).expect("warm-up request");
    }
    std::thread::sleep(Duration::from_millis(500));
    let before = rss_kib(pid);
    let started = Instant::now();
    let mut idle: Vec<TcpStream> = Vec::with_capacity(IDLE_CONNECTIONS);
    for i in 0..IDLE_CONNECTIONS {
        let mut s = peer::connect(&net.pod, dst).unwrap_or_else(|e| panic!("connection {i}: {e}"));
        request(&mut s).unwrap_or_else(|e| panic!("request {i}: {e}\n{}", remora.stderr()));
        idle.push(s);
    }
    let opened_in = started.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_kib(pid);
    let per_connection = (after.saturating_sub(before)) * 1024 / IDLE_CONNECTIONS as u64;
    eprintln!(
        "{IDLE_CONNECTIONS} idle keep-alive connections (opened in {opened_in:?}): RSS {before} \
         KiB -> {after} KiB, {per_connection} bytes each"
    );
    let m = remora.metrics();
    let open = m.value("remora_connections_active", &[("direction", "outbound")]);
    assert!(
        open >= IDLE_CONNECTIONS as f64,
        "{open} open: some were closed early"
    );
    assert!(
        per_connection < PER_IDLE_CONNECTION_KIB * 1024,
        "{per_connection} bytes per idle connection (bound {PER_IDLE_CONNECTION_KIB} KiB)"
    );

    // A new client is served at once beside them, and an idle one still is.
    let asked = Instant::now();
    let mut fresh = peer::connect(&net.pod, dst).expect("connect beside the idle ones");
    request(&mut fresh).expect("a new request");
    request(&mut idle[0]).expect("an idle connection's next request");
    drop(fresh);
    eprintln!("a new connection's request took {:?}", asked.elapsed());

    // The idle timeout (20 s; closed within 1 to 2 times that) closes every one.
    remora.wait_for_metrics(
        "every idle connection closed",
        Duration::from_secs(60),
        |m| m.value("remora_connections_active", &[("direction", "outbound")]) == 0.0,
    );
    let mut buf = [0u8; 1];
    let mut closed = 0;
    for s in &mut idle {
        if matches!(s.read(&mut buf), Ok(0) | Err(_)) {
            closed += 1;
        }
    }
    assert_eq!(closed, IDLE_CONNECTIONS, "connections the proxy left open");
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

/// Opaque TCP connections held open across two sidecars in mesh TLS.
const IDLE_MESH_CONNECTIONS: usize = 1_000;
/// What each sidecar may hold per idle mesh TLS connection, in KiB: rustls keeps its own
/// buffers and session state per connection (measured: 17.8 KiB on the client's sidecar,
/// 20.2 KiB on the server's; docs/hardening.md, "Overload").
const PER_IDLE_MESH_CONNECTION_KIB: u64 = 32;

/// 1,000 opaque TCP connections through the client's sidecar, mesh TLS, and the server's
/// sidecar, idle after one echo each: memory per connection on each sidecar stays within a
/// stated bound, a new connection is served beside them, and `tcp.idle_timeout` closes them.
#[test]
fn idle_mesh_tls_connections_cost_a_bounded_amount_and_are_closed_when_idle() {
    use remora_e2e::certs::MeshCa;
    use remora_e2e::mesh::{client_config, server_config, two_pods, SERVER_ID};
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let hard = raise_own_nofile();
    if hard < 3 * IDLE_MESH_CONNECTIONS as u64 {
        remora_e2e::skip::<()>(&format!(
            "the open-file limit ({hard}) is too low for {IDLE_MESH_CONNECTIONS} connections"
        ));
        return;
    }
    let ca = MeshCa::new("cluster.local");
    let (server_dir, client_dir) = two_pods(&net, &ca);
    let extra = format!("ports:\n  {ECHO_PORT}: tcp\ntcp:\n  idle_timeout: 30s\n");
    let server = net
        .remora()
        .config(&(server_config(&server_dir, "strict") + &extra))
        .start_ready();
    let client = net
        .peer_remora()
        .config(&(client_config(&client_dir, net.pod_ip, SERVER_ID) + &extra))
        .start_ready();
    // An echo that waits as long as it takes: the shared one gives up after 10 s of silence.
    let _echo = Server::start(&net.pod, any_addr(ECHO_PORT), |mut s| {
        s.set_read_timeout(None)?;
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            s.write_all(&buf[..n])?;
        }
    });
    let dst = net.pod_addr(ECHO_PORT);
    for _ in 0..20 {
        drop(hold(&net.peer, dst).expect("warm-up connection"));
    }
    std::thread::sleep(Duration::from_millis(500));
    let before = (rss_kib(client.pid()), rss_kib(server.pid()));
    let started = Instant::now();
    let mut idle: Vec<TcpStream> = (0..IDLE_MESH_CONNECTIONS)
        .map(|i| {
            hold(&net.peer, dst)
                .unwrap_or_else(|e| panic!("mesh connection {i}: {e}\n{}", server.stderr()))
        })
        .collect();
    let opened_in = started.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let after = (rss_kib(client.pid()), rss_kib(server.pid()));
    let each = |b: u64, a: u64| a.saturating_sub(b) * 1024 / IDLE_MESH_CONNECTIONS as u64;
    let (client_each, server_each) = (each(before.0, after.0), each(before.1, after.1));
    eprintln!(
        "{IDLE_MESH_CONNECTIONS} idle mesh TLS connections (opened in {opened_in:?}): client \
         sidecar {client_each} bytes each, server sidecar {server_each} bytes each"
    );
    let inbound_open =
        |m: &remora_e2e::Metrics| m.value("remora_connections_active", &[("direction", "inbound")]);
    assert!(inbound_open(&server.metrics()) >= IDLE_MESH_CONNECTIONS as f64);
    for (side, bytes) in [("client", client_each), ("server", server_each)] {
        assert!(
            bytes < PER_IDLE_MESH_CONNECTION_KIB * 1024,
            "{side} sidecar: {bytes} bytes per idle mesh connection"
        );
    }
    let mut fresh = hold(&net.peer, dst).expect("a new connection beside the idle ones");
    round_trip(&mut fresh, b"again").expect("served");
    round_trip(&mut idle[0], b"still").expect("an idle connection still echoes");
    drop(fresh);
    server.wait_for_metrics(
        "every idle mesh connection closed",
        Duration::from_secs(60),
        |m| inbound_open(m) == 0.0,
    );
    let mut buf = [0u8; 1];
    let mut closed = 0;
    for s in &mut idle {
        if matches!(s.read(&mut buf), Ok(0) | Err(_)) {
            closed += 1;
        }
    }
    assert_eq!(closed, IDLE_MESH_CONNECTIONS, "connections left open");
}
