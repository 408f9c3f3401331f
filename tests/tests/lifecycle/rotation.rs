//! A workload-certificate rotation under mesh TLS load, both ways. The pod's sidecar takes a
//! short-lived certificate from the test control plane's CA and renews it while clients make
//! new mesh connections without pause (a full handshake each):
//!
//! - outbound: the pod's application connects to a server sidecar in the peer namespace
//!   (explicit `terminate` listener, a file certificate from the same CA, the pod's SPIFFE ID
//!   required); the pod's sidecar originates mesh TLS by istiod's cluster, presenting the
//!   rotating certificate as the client's;
//! - inbound: an application in the peer namespace connects through that sidecar's explicit
//!   `originate` listener (the pod's SPIFFE ID required of the server) to the pod; the pod's
//!   sidecar terminates mesh TLS on istiod's `virtualInbound`, presenting the rotating
//!   certificate as the server's.
//!
//! Each connection echoes one line. Handshakes are counted on both sidecars of both paths.

use super::load::Tally;
use super::mesh::{control_plane, istiod_sidecar};
use super::{assert_no_failure, LOAD_BOUND};
use remora_e2e::certs::MeshCa;
use remora_e2e::istiod::ads::type_url;
use remora_e2e::mesh::{handshakes, CLIENT_ID, SERVER_ID};
use remora_e2e::netns::Netns;
use remora_e2e::peer::{any_addr, http_get, Server};
use remora_e2e::xds_resources::{
    endpoint, inbound_clusters, mtls_cluster, tcp_listener, virtual_inbound,
};
use remora_e2e::{PodNet, Remora, ADMIN_PORT};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

const STEP_TIME: Duration = Duration::from_secs(30);
/// The server sidecar's mesh port (outbound path) and its echo server's port.
const MESH_PORT: u16 = 8443;
const PEER_ECHO_PORT: u16 = 7000;
/// The peer sidecar's `originate` listener (inbound path), on the peer's loopback.
const ORIGINATE_PORT: u16 = 9000;
/// The pod application's echo port, reached through `virtualInbound`'s passthrough chain.
const POD_ECHO_PORT: u16 = 7001;
/// An HTTP port `virtualInbound` declares (unused here but for its chain).
const POD_HTTP_PORT: u16 = 9080;
/// Renewal at half of it: a rotation every few seconds.
const SECRET_TTL: &str = "6s";
/// Clients on each path, each making one connection after another.
const MESH_CLIENTS: usize = 2;

/// The peer's sidecar: a file certificate for [`SERVER_ID`]; terminating mesh TLS from
/// [`CLIENT_ID`] in front of an echo server (the outbound path's server), and originating it
/// to the pod, whose certificate must carry [`CLIENT_ID`] (the inbound path's client).
fn peer_sidecar<'a>(net: &'a PodNet, ca: &MeshCa) -> (Remora<'a>, Server) {
    let dir = net.binary().make_dir("peer-certs");
    ca.install(&dir, &ca.workload(SERVER_ID));
    let echo = Server::echo(
        &net.peer,
        SocketAddr::from((Ipv4Addr::LOCALHOST, PEER_ECHO_PORT)),
    );
    let sidecar = net
        .peer_remora()
        .config(&format!(
            "tls:\n  cert_dir: {}\nlisteners:\n  - address: {}\n    upstream: 127.0.0.1:{PEER_ECHO_PORT}\n    \
             protocol: tcp\n    tls:\n      mode: terminate\n      identities: [\"{CLIENT_ID}\"]\n  \
             - address: 127.0.0.1:{ORIGINATE_PORT}\n    upstream: {}\n    protocol: tcp\n    tls:\n      \
             mode: originate\n      hostname: echo.client.svc.cluster.local\n      identities: [\"{CLIENT_ID}\"]\n",
            dir.display(),
            net.peer_addr(MESH_PORT),
            net.pod_addr(POD_ECHO_PORT),
        ))
        .start_ready();
    (sidecar, echo)
}

/// The serial of the workload certificate `/certs` shows.
fn shown_serial(net: &PodNet) -> Option<String> {
    let admin = SocketAddr::from((Ipv4Addr::LOCALHOST, ADMIN_PORT));
    let r = http_get(&net.pod, admin, "/certs", Duration::from_secs(5)).ok()?;
    let json: Value = serde_json::from_str(&r.body).ok()?;
    json["certificates"][0]["cert_chain"][0]["serial_number"]
        .as_str()
        .map(str::to_string)
}

/// One connection from `ns`: connect, echo `message`, close.
fn echo_once(ns: &Netns, addr: SocketAddr, message: &[u8]) -> std::io::Result<()> {
    let mut stream = ns.connect(addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(message)?;
    let mut back = vec![0; message.len()];
    stream.read_exact(&mut back)?;
    if back != message {
        return Err(std::io::Error::other("echo differs"));
    }
    Ok(())
}

/// Connections one after another on one path until the test stops them.
fn client(ns: &Netns, addr: SocketAddr, name: &str, tally: &Tally, deadline: Instant) {
    let mut n = 0u64;
    while !tally.stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        n += 1;
        let message = format!("{name} connection {n}\n");
        tally.connections.fetch_add(1, Ordering::Relaxed);
        match echo_once(ns, addr, message.as_bytes()) {
            Ok(()) => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                if e.kind() == std::io::ErrorKind::ConnectionReset {
                    tally.resets.fetch_add(1, Ordering::Relaxed);
                }
                tally
                    .failures
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(format!("{name} connection {n}: {e}"));
            }
        }
    }
}

/// Mesh TLS handshakes in `direction`: (`ok`, every other result, each a failure named by
/// why: `unknown_ca`, `expired`, `error`…).
fn handshake_counts(remora: &Remora, direction: &str) -> (f64, f64) {
    let ok = handshakes(remora, direction, "ok");
    let all = remora
        .metrics()
        .value("remora_tls_handshakes_total", &[("direction", direction)]);
    (ok, all - ok)
}

/// istiod's resources for the pod: the peer sidecar's mesh port as a service (outbound), and
/// `virtualInbound` in STRICT mode with its clusters (inbound).
fn serve_the_pod(ads: &remora_e2e::istiod::Ads, net: &PodNet) {
    let cluster = "outbound|8443||echo.server.svc.cluster.local";
    ads.set(
        type_url::ENDPOINT,
        "v1",
        &[
            json!({"cluster_name": cluster, "endpoints": [{"lb_endpoints": [
            endpoint(net.peer_addr(MESH_PORT), Some("istio"))]}]}),
        ],
    );
    let mut clusters = vec![mtls_cluster(
        cluster,
        "outbound_.8443_._.echo.server.svc.cluster.local",
        SERVER_ID,
    )];
    clusters.extend(inbound_clusters(POD_HTTP_PORT));
    ads.set(type_url::CLUSTER, "v1", &clusters);
    ads.set(
        type_url::LISTENER,
        "v1",
        &[
            tcp_listener(net.peer_addr(MESH_PORT), cluster),
            virtual_inbound(POD_HTTP_PORT, true, &[], &[]),
        ],
    );
}

pub fn rotation_under_load() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let (plane, _hosts, files, ca) = control_plane(&net);
    // The peer sidecar's certificate comes from the control plane's CA.
    let (peer, _peer_echo) = peer_sidecar(&net, &ca);
    let _pod_echo = Server::echo(&net.pod, any_addr(POD_ECHO_PORT));
    net.capture_default();
    serve_the_pod(plane.ads(), &net);
    let mut sidecar = istiod_sidecar(&net, &files, "")
        .env("SECRET_TTL", SECRET_TTL)
        .start();
    sidecar.wait_ready(STEP_TIME);
    let first = shown_serial(&net).expect("/certs shows a certificate");
    let outbound = net.peer_addr(MESH_PORT);
    let inbound = SocketAddr::from((Ipv4Addr::LOCALHOST, ORIGINATE_PORT));

    let (out_tally, in_tally) = (Tally::default(), Tally::default());
    // Each new certificate as /certs first showed it: (answers on each path by then, serial).
    let rotations = Mutex::new(Vec::new());
    let deadline = Instant::now() + LOAD_BOUND;
    std::thread::scope(|scope| {
        for c in 0..MESH_CLIENTS {
            let (net, out_tally, in_tally) = (&net, &out_tally, &in_tally);
            let name = format!("outbound client {c}");
            scope.spawn(move || client(&net.pod, outbound, &name, out_tally, deadline));
            let name = format!("inbound client {c}");
            scope.spawn(move || client(&net.peer, inbound, &name, in_tally, deadline));
        }
        // Two rotations, each seen on /certs while the load runs, then a moment more.
        let mut last = first.clone();
        let watch = Instant::now() + STEP_TIME;
        let seen = || {
            rotations
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len()
        };
        while seen() < 2 && Instant::now() < watch {
            if let Some(serial) = shown_serial(&net).filter(|s| *s != last) {
                last.clone_from(&serial);
                rotations
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(((out_tally.ok(), in_tally.ok()), serial));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
        out_tally.stop.store(true, Ordering::Relaxed);
        in_tally.stop.store(true, Ordering::Relaxed);
    });
    let rotations = rotations
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    let pod_out = handshake_counts(&sidecar, "outbound");
    let pod_in = handshake_counts(&sidecar, "inbound");
    let peer_in = handshake_counts(&peer, "inbound");
    let peer_out = handshake_counts(&peer, "outbound");
    println!(
        "certificate rotation under mesh load: {} rotations at answered (outbound, inbound) {:?}, \
         issued {}; handshakes (ok, failed): pod outbound {pod_out:?}, peer inbound {peer_in:?}, \
         peer outbound {peer_out:?}, pod inbound {pod_in:?}; outbound {}; inbound {}",
        rotations.len(),
        rotations.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        plane.issued().len(),
        out_tally.summary(),
        in_tally.summary()
    );
    assert_eq!(
        rotations.len(),
        2,
        "rotations seen: {rotations:?}\n{}",
        sidecar.stderr()
    );
    assert_no_failure("rotation, outbound", &out_tally, &sidecar);
    assert_no_failure("rotation, inbound", &in_tally, &sidecar);
    for (what, (_, failed)) in [
        ("pod outbound", pod_out),
        ("peer inbound", peer_in),
        ("peer outbound", peer_out),
        ("pod inbound", pod_in),
    ] {
        assert_eq!(failed, 0.0, "{what}: handshake failures");
    }
    // Handshakes happened before the first rotation, between the two and after the second,
    // on both paths, each connection one handshake on both of its sidecars.
    let ((out_first, in_first), _) = rotations[0];
    let ((out_second, in_second), _) = rotations[1];
    assert!(out_first > 0 && in_first > 0, "{rotations:?}");
    assert!(
        out_second > out_first && in_second > in_first,
        "{rotations:?}"
    );
    assert!(
        out_tally.ok() > out_second && in_tally.ok() > in_second,
        "{rotations:?}"
    );
    assert!(pod_out.0 >= out_tally.ok() as f64 && peer_in.0 >= out_tally.ok() as f64);
    assert!(peer_out.0 >= in_tally.ok() as f64 && pod_in.0 >= in_tally.ok() as f64);
}
