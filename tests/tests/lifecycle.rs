//! No request lost across a lifecycle event (issue #33): SIGTERM, config reloads, xDS pushes and
//! a workload-certificate rotation, each while well-behaved clients (`lifecycle/load.rs`)
//! send HTTP/1.1 (keep-alive, and a connection per request) and HTTP/2 without pause through
//! the pod's sidecar. Every request the clients send is counted; the counts are printed
//! (`--nocapture`) and docs/hardening.md's "Lifecycle" section quotes them.

#[path = "lifecycle/load.rs"]
mod load;
#[path = "lifecycle/mesh.rs"]
mod mesh;
#[path = "lifecycle/mesh_tls.rs"]
mod mesh_tls;
#[path = "lifecycle/oracle.rs"]
mod oracle;
#[path = "lifecycle/rotation.rs"]
mod rotation;

use load::{Tally, H1};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use remora_e2e::backend;
use remora_e2e::peer::any_addr;
use remora_e2e::{Netns, PodNet, Remora};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The application's HTTP/1.1 and HTTP/2 (h2c) ports in the pod (detected, not declared).
const H1_PORT: u16 = 8080;
const H2_PORT: u16 = 8082;
/// Clients of each kind.
const KEEP_ALIVE_CLIENTS: usize = 3;
const PER_REQUEST_CLIENTS: usize = 2;
const H2_CLIENTS: usize = 2;
/// Streams each HTTP/2 client keeps in flight.
const H2_STREAMS: usize = 4;
/// How long the HTTP/2 origin takes over each answer, so streams are in flight at the event.
const H2_ORIGIN_DELAY: Duration = Duration::from_millis(20);
/// Bound on the load of one test.
const LOAD_BOUND: Duration = Duration::from_secs(40);
/// The drain period of the SIGTERM test.
const DRAIN: Duration = Duration::from_secs(3);
/// The minimum drain period of the exit-on-zero SIGTERM test.
const MINIMUM_DRAIN: Duration = Duration::from_secs(1);

/// The load against `h1` and `h2` (addresses as the clients dial them) from `ns`, run by
/// `during` (which gets the tally and returns once its event is over); the clients stop when
/// it returns or when it says so.
fn with_load<T>(
    ns: &Netns,
    h1: SocketAddr,
    h2: SocketAddr,
    host: &str,
    during: impl FnOnce(&Arc<Tally>) -> T,
) -> (T, Arc<Tally>) {
    let tally = Arc::new(Tally::default());
    let deadline = Instant::now() + LOAD_BOUND;
    let result = std::thread::scope(|scope| {
        for i in 0..KEEP_ALIVE_CLIENTS + PER_REQUEST_CLIENTS {
            let mode = if i + 1 < KEEP_ALIVE_CLIENTS {
                H1::KeepAlive
            } else if i + 1 == KEEP_ALIVE_CLIENTS {
                H1::KeepAliveDotted
            } else {
                H1::ConnectionPerRequest
            };
            let tally = Arc::clone(&tally);
            scope.spawn(move || load::http1_client(ns, h1, host, mode, &tally, deadline));
        }
        for _ in 0..H2_CLIENTS {
            let tally = Arc::clone(&tally);
            scope.spawn(move || load::http2_client(ns, h2, host, H2_STREAMS, &tally, deadline));
        }
        let result = during(&tally);
        tally.stop.store(true, Ordering::Relaxed);
        result
    });
    (result, tally)
}

/// Wait until the clients have had `n` answers in all (they are up and running).
fn wait_answers(tally: &Tally, n: u64, remora: &Remora) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while tally.ok() < n {
        assert!(
            Instant::now() < deadline,
            "the load did not start: {}\nfailures: {:?}\n{}",
            tally.summary(),
            tally.failures(),
            remora.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_no_failure(what: &str, tally: &Tally, remora: &Remora) {
    let failures = tally.failures();
    assert!(
        failures.is_empty(),
        "{what}: {} failed requests ({}): {:?}\n{}",
        failures.len(),
        tally.summary(),
        &failures[..failures.len().min(10)],
        remora.stderr()
    );
    assert_eq!(
        tally.resets.load(Ordering::Relaxed),
        0,
        "{what}: {}",
        tally.summary()
    );
}

/// No connection was told to go: each keep-alive and HTTP/2 connection lasted the whole event.
fn assert_connections_kept(what: &str, tally: &Tally) {
    assert_eq!(
        tally.closes.load(Ordering::Relaxed),
        0,
        "{what}: {}",
        tally.summary()
    );
    assert_eq!(
        tally.h2_goaway_connections.load(Ordering::Relaxed),
        0,
        "{what}: {}",
        tally.summary()
    );
}

/// The pod's application: an HTTP/1.1 server and an h2c one, the h2c one served by `runtime`.
fn applications(net: &PodNet, runtime: &tokio::runtime::Runtime) -> remora_e2e::peer::Server {
    let h1 = backend::start(&net.pod, any_addr(H1_PORT), "app");
    let h2 = net
        .pod
        .bind(any_addr(H2_PORT))
        .expect("bind the h2c origin");
    runtime.spawn(load::h2_origin(h2, H2_ORIGIN_DELAY));
    h1
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Clients keep connecting through the drain period, as Envoy under Istio lets them (the
/// inbound listener accepts on); they stop a second before it ends, as a stopping pod's peers
/// would, so that the process's exit cuts nothing.
#[test]
fn sigterm_under_http1_and_http2_load_serves_reconnecting_clients_and_exits_after_the_drain_period()
{
    let stop_after = DRAIN - Duration::from_secs(1);
    sigterm_under_load(
        &format!("drain:\n  duration: {}s\n", DRAIN.as_secs()),
        stop_after,
        DRAIN,
    );
}

/// Istio's `EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true`: after `MINIMUM_DRAIN_DURATION` the open
/// connections are counted every second, as pilot-agent counts Envoy's; clients reconnecting
/// keep the proxy up past the minimum, and it exits at the first count after they stop.
#[test]
fn sigterm_with_exit_on_zero_connections_serves_until_the_clients_stop_and_exits_at_the_next_count()
{
    let stop_after = MINIMUM_DRAIN + Duration::from_millis(1500);
    sigterm_under_load(
        &format!(
            "drain:\n  duration: 30s\n  exit_on_zero_active_connections: true\n  minimum_duration: {}s\n",
            MINIMUM_DRAIN.as_secs()
        ),
        stop_after,
        // The count at MINIMUM_DRAIN + 1 s finds the clients connected; the one a second
        // later, after they stopped, none.
        MINIMUM_DRAIN + Duration::from_secs(2),
    );
}

/// SIGTERM under load with `config`: the clients go on for `stop_after`, and the process must
/// exit `exits_after` the signal (and within 1.5 s more).
fn sigterm_under_load(config: &str, stop_after: Duration, exits_after: Duration) {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let mut remora = net.remora().config(config).start_ready();
    let rt = runtime();
    let _app = applications(&net, &rt);
    let (h1, h2) = (net.pod_addr(H1_PORT), net.pod_addr(H2_PORT));

    let ((before, exit, exited_after), tally) = with_load(&net.peer, h1, h2, "app", |tally| {
        wait_answers(tally, 300, &remora);
        let before = tally.ok();
        tally.signalled.store(true, Ordering::Relaxed);
        let signalled = Instant::now();
        remora.terminate();
        std::thread::sleep(stop_after);
        tally.stop.store(true, Ordering::Relaxed);
        let exit = remora.wait_exit(exits_after + Duration::from_secs(10));
        (before, exit, signalled.elapsed())
    });
    println!(
        "SIGTERM under load: {} answered before the signal, {} after; exit {:?} after {:?}; {}",
        before,
        tally.ok() - before,
        exit,
        exited_after,
        tally.summary()
    );
    assert_no_failure("SIGTERM", &tally, &remora);
    let exit = exit.unwrap_or_else(|| panic!("still running {exited_after:?} after SIGTERM"));
    assert!(exit.success(), "{exit:?}\n{}", remora.stderr());
    // Not before the drain period (Istio's terminationDrainDuration is waited out whole unless
    // EXIT_ON_ZERO_ACTIVE_CONNECTIONS, then until a count finds no connection), and promptly
    // after it.
    assert!(
        exited_after >= exits_after - Duration::from_millis(100)
            && exited_after <= exits_after + Duration::from_millis(1500),
        "exited {exited_after:?} after SIGTERM, expected {exits_after:?}"
    );
    // The inbound listener accepted through the drain: a refused connection would have been
    // a failure above.
    if config.contains("exit_on_zero_active_connections: true") {
        // A count after the minimum found the reconnecting clients' connections open.
        assert!(
            remora.stderr().contains("draining: connections still open"),
            "{}",
            remora.stderr()
        );
    }
    assert_drained_and_reconnected(&tally);
    // One keep-alive connection was on hyper's HTTP/1.1 (its path normalised), the others on
    // Remora's own exchange: both were drained.
    assert!(
        tally.normalised.load(Ordering::Relaxed) > 0,
        "{}",
        tally.summary()
    );
    // Requests in flight at the signal, and those of the clients that reconnected, were
    // answered after it.
    assert!(tally.ok() > before, "{}", tally.summary());
}

/// Every client was running at the signal and went on until the test stopped it: each
/// keep-alive one was told `connection: close` on the connection it had and again on one it
/// opened after the signal, which was served first; each HTTP/2 one got GOAWAY(NO_ERROR) on
/// its connection and on one opened after the signal, after its first answers there.
pub fn assert_drained_and_reconnected(tally: &Tally) {
    assert!(
        tally.closes.load(Ordering::Relaxed) as usize >= 2 * KEEP_ALIVE_CLIENTS,
        "{}",
        tally.summary()
    );
    assert!(
        tally.late_h1_told.load(Ordering::Relaxed) as usize >= KEEP_ALIVE_CLIENTS,
        "{}",
        tally.summary()
    );
    assert!(
        tally.h2_goaway_connections.load(Ordering::Relaxed) as usize >= 2 * H2_CLIENTS,
        "{}",
        tally.summary()
    );
    assert!(
        tally.late_h2_told.load(Ordering::Relaxed) as usize >= H2_CLIENTS,
        "{}",
        tally.summary()
    );
    let goaways = tally.goaways.lock().expect("goaways").clone();
    assert!(goaways.iter().all(|g| g.error_code == 0), "{goaways:?}");
}

/// A native sidecar's preStop (`remora drain`: the agent's `POST /drain`, pilot-agent's
/// `drain_listeners?inboundonly&graceful&skip_exit`) drains with the listeners accepting, and the
/// SIGTERM that follows once the application has stopped exits at once, as pilot-agent does.
#[test]
fn sigterm_after_the_agents_drain_exits_at_once() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let mut remora = net
        .remora()
        .config("drain:\n  duration: 30s\n")
        .start_ready();
    let _app = backend::start(&net.pod, any_addr(H1_PORT), "app");
    let (status, body) = remora_e2e::peer::curl_status(
        &net.pod,
        &["-X", "POST", "http://127.0.0.1:15020/drain"],
        Duration::from_secs(5),
    );
    assert_eq!(status, 200, "{body}\n{}", remora.stderr());
    assert_eq!(remora.readiness(), Some(503));
    // Draining, the inbound listener accepting: a new connection is served and told to go.
    let mut client = remora_e2e::http_client::Client::connect(&net.peer, net.pod_addr(H1_PORT))
        .expect("an inbound connection after /drain");
    let answer = client.get("app", "/", &[]).expect("an answer after /drain");
    assert_eq!(
        (answer.status, answer.header("connection")),
        (200, Some("close"))
    );
    let signalled = Instant::now();
    remora.terminate();
    let exit = remora.wait_exit(Duration::from_secs(10));
    let exited_after = signalled.elapsed();
    assert!(
        exit.is_some_and(|s| s.success()),
        "{exit:?}\n{}",
        remora.stderr()
    );
    assert!(
        exited_after < Duration::from_secs(1),
        "exited {exited_after:?} after SIGTERM, the drain period being 30 s"
    );
}

/// Mesh TLS inbound: new mesh connections are handshaken and served while draining.
#[test]
fn sigterm_to_a_mesh_tls_server_sidecar_serves_new_mesh_connections_through_the_drain() {
    mesh_tls::sigterm_serves_new_mesh_connections();
}

/// The drain compared with a real Envoy's under pilot-agent's drain (`lifecycle/oracle.rs`).
#[test]
fn sigterm_drain_tells_old_and_new_inbound_connections_what_envoy_under_pilot_agent_tells_them() {
    oracle::sigterm_drain_matches_envoy();
}

/// The config file of the reload test, variant `i`: each differs from the one before in
/// settings every new connection reads (idle timeouts, header limits, the drain period).
fn reload_config(i: usize) -> String {
    format!(
        "http:\n  idle_timeout: {}s\n  max_headers: {}\ntcp:\n  idle_timeout: {}s\ndrain:\n  duration: {}s\n",
        30 + i % 7,
        100 + i % 2,
        3600 - i % 5,
        5 + i % 3
    )
}

#[test]
fn a_hundred_config_reloads_under_load_lose_no_request_and_reset_no_connection() {
    const RELOADS: usize = 100;
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let file = net
        .binary()
        .write_file("lifecycle-reload.yaml", &reload_config(0));
    let remora = net.remora().arg("--config").arg(&file).start_ready();
    let rt = runtime();
    let _app = applications(&net, &rt);
    let (h1, h2) = (net.pod_addr(H1_PORT), net.pod_addr(H2_PORT));
    let reloads = || {
        remora
            .metrics()
            .value("remora_config_reloads_total", &[("result", "success")])
    };
    let pid = Pid::from_raw(i32::try_from(remora.pid()).expect("a PID"));

    let (started, tally) = with_load(&net.peer, h1, h2, "app", |tally| {
        wait_answers(tally, 200, &remora);
        let started = Instant::now();
        for i in 1..=RELOADS {
            std::fs::write(&file, reload_config(i)).expect("rewrite the config");
            kill(pid, Signal::SIGHUP).expect("SIGHUP");
            let deadline = Instant::now() + Duration::from_secs(10);
            while reloads() < i as f64 {
                assert!(
                    Instant::now() < deadline,
                    "reload {i} not taken\n{}",
                    remora.stderr()
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            // A few dozen requests per config, rather than all 100 reloads within a second.
            std::thread::sleep(Duration::from_millis(20));
        }
        started.elapsed()
    });
    println!(
        "{RELOADS} reloads in {started:?} under load: {}",
        tally.summary()
    );
    assert_no_failure("reloads", &tally, &remora);
    assert_connections_kept("reloads", &tally);
    let metrics = remora.metrics();
    assert_eq!(
        metrics.value("remora_config_reloads_total", &[("result", "failure")]),
        0.0
    );
    assert!(reloads() >= RELOADS as f64);
    assert!(tally.ok() > 0);
}

#[test]
fn a_hundred_xds_pushes_under_load_lose_no_request_and_reset_no_connection() {
    mesh::xds_pushes_under_load();
}

#[test]
fn sigterm_to_a_sidecar_configured_by_istiod_drains_inbound_serving_reconnections_and_keeps_outbound_serving(
) {
    mesh::sigterm_by_istiod_under_load();
}

#[test]
fn a_workload_certificate_rotation_under_mtls_load_both_ways_fails_no_handshake() {
    rotation::rotation_under_load();
}
