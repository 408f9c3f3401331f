//! Overload and resource exhaustion (issue #33): the global and per-listener connection limits
//! refuse new connections at once and count them while open ones keep working; accept survives
//! running out of file descriptors without spinning and recovers when descriptors are freed.
//! Every test runs the real binary in a pod namespace with the capture rules `remora capture`
//! writes, against servers in a peer namespace. Slow clients (slowloris in heads and bodies,
//! stalled TLS handshakes) are in `overload/slow_clients.rs`; memory under stalled readers and
//! idle connections in `overload/memory.rs`.

#[path = "overload/h2_stalled.rs"]
mod h2_stalled;
#[path = "overload/memory.rs"]
mod memory;
#[path = "overload/slow_clients.rs"]
mod slow_clients;

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
    // accept fails. The readiness listener may itself be backing off at that moment (its
    // accept failed while the reset connection still held its descriptor), leaving the
    // descriptor to the next captured connection, reset in turn: another filler then, a few
    // at most.
    let mut held = Vec::new();
    let mut filler = Vec::new();
    const MAX_FILLERS: usize = 4;
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
                assert!(
                    filler.len() < MAX_FILLERS,
                    "reset {} times ({e}): {}",
                    filler.len() + 1,
                    remora.stderr()
                );
                let readiness = SocketAddr::from((Ipv4Addr::LOCALHOST, 15021));
                filler.push(peer::connect(&net.pod, readiness).expect("connect to readiness"));
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
                assert!(
                    filler.len() < MAX_FILLERS,
                    "reset {} times ({e}): {}",
                    filler.len() + 1,
                    remora.stderr()
                );
                let readiness = SocketAddr::from((Ipv4Addr::LOCALHOST, 15021));
                filler.push(peer::connect(&net.pod, readiness).expect("connect to readiness"));
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

/// Resident memory of process `pid`, in KiB (`VmRSS`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

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
