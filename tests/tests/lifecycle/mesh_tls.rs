//! SIGTERM to a sidecar terminating mesh TLS on its inbound capture listener: the listener
//! keeps accepting, so a client sidecar whose pooled mesh connection was told to go
//! (`connection: close`) opens a new one, which is handshaken and served, until the drain
//! period ends.

use remora_e2e::backend;
use remora_e2e::mesh::{client_config, handshakes, permissive_server, SERVER_ID};
use remora_e2e::peer::any_addr;
use remora_e2e::PodNet;
use std::time::{Duration, Instant};

const APP_PORT: u16 = 8080;
/// `drain.duration`'s default, which the server's sidecar runs with.
const DRAIN: Duration = Duration::from_secs(5);
/// Requests sent through the mesh while the server's sidecar drains.
const REQUESTS: usize = 3;

pub fn sigterm_serves_new_mesh_connections() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let (mut server, client_dir) = permissive_server(&net);
    let client = net
        .peer_remora()
        .config(&client_config(&client_dir, net.pod_ip, SERVER_ID))
        .start_ready();
    let _app = backend::start(&net.pod, any_addr(APP_PORT), "app");
    let url = format!("http://{}/", net.pod_addr(APP_PORT));
    let get = || {
        remora_e2e::peer::curl_status(
            &net.peer,
            &["-o", "/dev/null", &url],
            Duration::from_secs(5),
        )
        .0
    };
    assert_eq!(get(), 200, "{}\n{}", server.stderr(), client.stderr());
    let before = handshakes(&server, "inbound", "ok");
    assert!(before >= 1.0, "the request went in mesh TLS");

    server.terminate();
    let signalled = Instant::now();
    let deadline = signalled + Duration::from_secs(2);
    while server.readiness() != Some(503) {
        assert!(Instant::now() < deadline, "readiness not 503 after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Each request drains the mesh connection it went on (the server's sidecar answers it
    // `connection: close`, which the client's sidecar does not pass on), so the next one
    // takes a new mesh connection: a handshake the draining sidecar accepts and serves.
    let statuses: Vec<u16> = (0..REQUESTS).map(|_| get()).collect();
    let after = handshakes(&server, "inbound", "ok");
    println!(
        "SIGTERM, mesh TLS inbound: answers {statuses:?} while draining, {} new handshakes",
        after - before
    );
    assert!(
        statuses.iter().all(|s| *s == 200),
        "{statuses:?}\n{}\n{}",
        server.stderr(),
        client.stderr()
    );
    assert!(
        after - before >= (REQUESTS - 1) as f64,
        "{before} handshakes before the drain, {after} after {REQUESTS} requests"
    );
    assert!(
        signalled.elapsed() < DRAIN,
        "the requests outlasted the drain period"
    );
    let exit = server.wait_exit(DRAIN + Duration::from_secs(10));
    assert!(
        exit.is_some_and(|s| s.success()),
        "{exit:?}\n{}",
        server.stderr()
    );
}
