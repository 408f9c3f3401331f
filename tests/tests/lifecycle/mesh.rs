//! The lifecycle tests that need the test control plane (`remora_e2e::istiod`): 100 xDS pushes
//! under load, and a workload-certificate rotation under mesh TLS load. The pod's sidecar runs
//! as an injected one does (Istio's environment, its certificate and config from istiod).

use super::load::Tally;
use super::{assert_no_failure, wait_answers, LOAD_BOUND};
use remora_e2e::backend;
use remora_e2e::certs::MeshCa;
use remora_e2e::istiod::ads::type_url;
use remora_e2e::istiod::{Ads, ControlPlane, HostsFile, ISTIOD_HOST, ISTIOD_PORT};
use remora_e2e::mesh::{handshakes, CLIENT_ID, SERVER_ID};
use remora_e2e::peer::{http_get, Server};
use remora_e2e::xds_resources::{endpoint, mtls_cluster, tcp_listener};
use remora_e2e::{PodNet, RemoraCommand, ADMIN_PORT};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

const TOKEN: &str = "projected-token-for-sleep";
const STEP_TIME: Duration = Duration::from_secs(30);
const BACKEND_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const HOST: &str = "web.test.svc.cluster.local";
const A: &str = "outbound|80|a|web.test.svc.cluster.local";
const B: &str = "outbound|80|b|web.test.svc.cluster.local";

/// The pod's sidecar in istiod mode, as the injector configures it (delta ADS, Istio's
/// default); `extra` is more of its config file.
fn istiod_sidecar<'a>(
    net: &'a PodNet,
    files: &(PathBuf, PathBuf),
    extra: &str,
) -> RemoraCommand<'a> {
    net.remora()
        .config(&format!(
            "istiod:\n  token_file: {}\n  root_cert_file: {}\n{extra}",
            files.0.display(),
            files.1.display(),
        ))
        .env(
            "PROXY_CONFIG",
            format!(r#"{{"discoveryAddress":"{ISTIOD_HOST}:{ISTIOD_PORT}"}}"#),
        )
        .env("POD_NAME", "sleep-6d8b7c9f4-x2k4p")
        .env("POD_NAMESPACE", "client")
        .env("SERVICE_ACCOUNT", "sleep")
        .env("INSTANCE_IP", net.pod_ip.to_string())
        .env("ISTIO_META_CLUSTER_ID", "Kubernetes")
        .env("ISTIO_DELTA_XDS", "true")
}

/// The control plane in the peer namespace, named `istiod.istio-system.svc` in the pod; the
/// token and root files the sidecar reads; the mesh's CA.
fn control_plane(net: &PodNet) -> (ControlPlane, HostsFile, (PathBuf, PathBuf), Arc<MeshCa>) {
    let ca = Arc::new(MeshCa::new("cluster.local"));
    let token = net
        .binary()
        .write_file("istio-token", &format!("{TOKEN}\n"));
    let root = net.binary().write_file("root-cert.pem", &ca.root_pem());
    let hosts = HostsFile::write(&net.pod, &[(net.peer_ip.into(), ISTIOD_HOST)])
        .expect("name istiod inside the pod");
    let plane = ControlPlane::start(
        &net.peer,
        net.peer_addr(ISTIOD_PORT),
        Arc::clone(&ca),
        TOKEN,
    );
    (plane, hosts, (token, root), ca)
}

fn wait_until(what: &str, timeout: Duration, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether the sidecar ACKed a response of `type_url` at `version`.
fn acked(ads: &Ads, type_url: &str, version: &str) -> bool {
    let nonces: HashSet<String> = ads
        .responses()
        .into_iter()
        .filter(|r| r.type_url == type_url && r.version == version)
        .map(|r| r.nonce)
        .collect();
    ads.requests().iter().any(|r| {
        r.type_url == type_url
            && r.answers()
            && r.error_detail.is_none()
            && nonces.contains(&r.response_nonce)
    })
}

/// Push `i`: cluster A's connect timeout and the route's cluster change every time (a new
/// cluster version and a new route table, the two resources istiod pushes most), in istiod's
/// order (clusters, endpoints, listeners, routes).
fn push(ads: &Ads, i: usize) {
    let version = format!("v{i}");
    let mut a = remora_e2e::xds_resources::eds_cluster(A);
    a["connect_timeout"] = json!(format!("{}s", 2 + i % 2));
    let assignment = |cluster: &str, port: u16| {
        json!({"cluster_name": cluster, "endpoints": [{"lb_endpoints": [
            endpoint(SocketAddr::from((BACKEND_IP, port)), None)]}]})
    };
    let listener = json!({
        "name": "0.0.0.0_80", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
        "traffic_direction": "OUTBOUND", "bind_to_port": false,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "outbound_0.0.0.0_80",
            "rds": {"config_source": {"ads": {}}, "route_config_name": "80"},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]});
    let cluster = if i.is_multiple_of(2) { A } else { B };
    let route: Value = json!({"name": "80", "virtual_hosts": [{"name": "web", "domains": [HOST],
        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster}}]}]});
    ads.set(
        type_url::CLUSTER,
        &version,
        &[a, remora_e2e::xds_resources::eds_cluster(B)],
    );
    ads.set(
        type_url::ENDPOINT,
        &version,
        &[assignment(A, 8001), assignment(B, 8002)],
    );
    ads.set(type_url::LISTENER, &version, &[listener]);
    ads.set(type_url::ROUTE, &version, &[route]);
}

/// The pod reaches the backends' address through its own veth.
fn backend_routes(net: &PodNet) {
    for (ns, args) in [
        (&net.pod, vec!["route", "add", "default", "dev", "eth0"]),
        (&net.peer, vec!["addr", "add", "10.1.0.2/32", "dev", "eth0"]),
    ] {
        let out = ns.command("ip").args(&args).output().expect("ip");
        assert!(out.status.success(), "ip {args:?}: {out:?}");
    }
}

pub fn xds_pushes_under_load() {
    const PUSHES: usize = 100;
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let (plane, _hosts, files, _ca) = control_plane(&net);
    net.capture_default();
    backend_routes(&net);
    let _a = backend::start(&net.peer, SocketAddr::from((BACKEND_IP, 8001)), "a");
    let _b = backend::start(&net.peer, SocketAddr::from((BACKEND_IP, 8002)), "b");
    let ads = Arc::clone(plane.ads());
    push(&ads, 0);
    let mut sidecar = istiod_sidecar(&net, &files, "").start();
    sidecar.wait_ready(STEP_TIME);
    let vip = SocketAddr::from(SocketAddrV4::new(VIP, 80));

    let (took, tally) = super::with_load(&net.pod, vip, vip, HOST, |tally| {
        wait_answers(tally, 200, &sidecar);
        let started = Instant::now();
        for i in 1..=PUSHES {
            push(&ads, i);
            let version = format!("v{i}");
            wait_until(&format!("push {i} ACKed"), STEP_TIME, || {
                acked(&ads, type_url::ROUTE, &version) && acked(&ads, type_url::CLUSTER, &version)
            });
            // A few dozen requests per version, rather than all 100 within a second.
            std::thread::sleep(Duration::from_millis(20));
        }
        started.elapsed()
    });
    println!(
        "{PUSHES} xDS pushes (cluster and route each) in {took:?} under load: {}",
        tally.summary()
    );
    assert_no_failure("xDS pushes", &tally, &sidecar);
    super::assert_connections_kept("xDS pushes", &tally);
    let nacks: Vec<_> = ads
        .requests()
        .into_iter()
        .filter(|r| r.error_detail.is_some())
        .collect();
    assert!(nacks.is_empty(), "{nacks:?}");
    // The pushes took effect: the route sent the traffic to each cluster in turn.
    let backends = tally.backends.lock().expect("backends").clone();
    assert!(
        backends.get("a").copied().unwrap_or(0) > 0 && backends.get("b").copied().unwrap_or(0) > 0,
        "{backends:?}"
    );
}

/// The mesh port of the server sidecar's terminating listener, and its echo server's port.
const MESH_PORT: u16 = 8443;
const ECHO_PORT: u16 = 7000;
/// Renewal at half of it: a rotation every few seconds.
const SECRET_TTL: &str = "6s";
/// Connections made at once, each with its own mesh TLS handshake.
const MESH_CLIENTS: usize = 4;

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

/// One mesh connection: connect (through the capture rules, so the sidecar dials with mesh
/// TLS), echo `message`, close.
fn echo_once(net: &PodNet, addr: SocketAddr, message: &[u8]) -> std::io::Result<()> {
    let mut stream = net.pod.connect(addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(message)?;
    let mut back = vec![0; message.len()];
    stream.read_exact(&mut back)?;
    if back != message {
        return Err(std::io::Error::other("echo differs"));
    }
    Ok(())
}

/// Mesh TLS handshakes in `direction`, whatever their result.
fn all_handshakes(remora: &remora_e2e::Remora, direction: &str) -> f64 {
    remora
        .metrics()
        .value("remora_tls_handshakes_total", &[("direction", direction)])
}

pub fn rotation_under_load() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let (plane, _hosts, files, ca) = control_plane(&net);
    // The server sidecar's certificate comes from the control plane's CA.
    let (server, _echo) = server_sidecar(&net, &ca);
    net.capture_default();
    let cluster = "outbound|8443||echo.server.svc.cluster.local";
    let ads = plane.ads();
    ads.set(
        type_url::ENDPOINT,
        "v1",
        &[
            json!({"cluster_name": cluster, "endpoints": [{"lb_endpoints": [
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
    let mut sidecar = istiod_sidecar(&net, &files, "")
        .env("SECRET_TTL", SECRET_TTL)
        .start();
    sidecar.wait_ready(STEP_TIME);
    let first = shown_serial(&net).expect("/certs shows a certificate");
    let addr = net.peer_addr(MESH_PORT);

    let tally = Tally::default();
    // (connections answered when each new certificate was first seen, its serial)
    let rotations = Mutex::new(Vec::new());
    let deadline = Instant::now() + LOAD_BOUND;
    std::thread::scope(|scope| {
        for c in 0..MESH_CLIENTS {
            let (net, tally) = (&net, &tally);
            scope.spawn(move || {
                let mut n = 0u64;
                while !tally.stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    n += 1;
                    let message = format!("client {c} connection {n}\n");
                    match echo_once(net, addr, message.as_bytes()) {
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
                                .push(format!("connection {n}: {e}"));
                        }
                    }
                    tally.connections.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // Two rotations, each seen on /certs while the load runs, then a moment more.
        let mut last = first.clone();
        let watch = Instant::now() + Duration::from_secs(30);
        while rotations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
            < 2
            && Instant::now() < watch
        {
            if let Some(serial) = shown_serial(&net) {
                if serial != last {
                    last.clone_from(&serial);
                    rotations
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((tally.ok(), serial));
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
        tally.stop.store(true, Ordering::Relaxed);
    });
    let rotations = rotations
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    let succeeded = (
        handshakes(&sidecar, "outbound", "ok"),
        handshakes(&server, "inbound", "ok"),
    );
    // Every result but `ok` is a failure, named by why (`unknown_ca`, `expired`, `error`…).
    let failed = (
        all_handshakes(&sidecar, "outbound") - succeeded.0,
        all_handshakes(&server, "inbound") - succeeded.1,
    );
    println!(
        "certificate rotation under mesh load: {} rotations at answered counts {:?}, issued {}; \
         handshakes ok (client, server) {succeeded:?}, failed {failed:?}; {}",
        rotations.len(),
        rotations.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        plane.issued().len(),
        tally.summary()
    );
    assert_eq!(
        rotations.len(),
        2,
        "rotations seen: {rotations:?}\n{}",
        sidecar.stderr()
    );
    assert_no_failure("certificate rotation", &tally, &sidecar);
    assert_eq!(failed, (0.0, 0.0), "handshake failures (client, server)");
    // Handshakes happened across each rotation, with the old and the new certificate.
    assert!(rotations[0].0 > 0, "{rotations:?}");
    assert!(
        tally.ok() > rotations[1].0,
        "{rotations:?} {}",
        tally.summary()
    );
    assert!(
        succeeded.0 >= tally.ok() as f64,
        "{succeeded:?} {}",
        tally.summary()
    );
}
