//! The test control plane (`remora_e2e::istiod`) for the lifecycle tests, and 100 xDS pushes
//! under load. The pod's sidecar runs as an injected one does (Istio's environment, its
//! certificate and config from istiod).

use super::{assert_no_failure, wait_answers};
use remora_e2e::backend;
use remora_e2e::certs::MeshCa;
use remora_e2e::istiod::ads::type_url;
use remora_e2e::istiod::{Ads, ControlPlane, HostsFile, ISTIOD_PORT};
use remora_e2e::peer::any_addr;
use remora_e2e::xds_resources::{endpoint, http_rbac, inbound_clusters, virtual_inbound};
use remora_e2e::{PodNet, RemoraCommand};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "projected-token-for-sleep";
const STEP_TIME: Duration = Duration::from_secs(30);
const BACKEND_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const HOST: &str = "web.test.svc.cluster.local";
const A: &str = "outbound|80|a|web.test.svc.cluster.local";
const B: &str = "outbound|80|b|web.test.svc.cluster.local";
/// The pod application's port, reached inbound through `virtualInbound` (PERMISSIVE: plaintext).
const INBOUND_PORT: u16 = 9080;
/// The listeners change every this many pushes.
const LISTENER_EVERY: usize = 10;

/// The pod's sidecar in istiod mode, as the injector configures it (delta ADS, Istio's
/// default); `extra` is more of its config file.
pub fn istiod_sidecar<'a>(
    net: &'a PodNet,
    files: &(PathBuf, PathBuf),
    extra: &str,
) -> RemoraCommand<'a> {
    remora_e2e::istiod::injected_sidecar(net)
        .config(&format!(
            "istiod:\n  token_file: {}\n  root_cert_file: {}\n{extra}",
            files.0.display(),
            files.1.display(),
        ))
        .env("ISTIO_DELTA_XDS", "true")
}

/// The control plane in the peer namespace, named `istiod.istio-system.svc` in the pod; the
/// token and root files the sidecar reads; the mesh's CA.
pub fn control_plane(net: &PodNet) -> (ControlPlane, HostsFile, (PathBuf, PathBuf), Arc<MeshCa>) {
    let remora_e2e::istiod::PodFiles {
        ca,
        token,
        root,
        hosts,
    } = remora_e2e::istiod::PodFiles::write(net, TOKEN);
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

/// Push `i`, in istiod's order (clusters, endpoints, listeners, routes): cluster A's connect
/// timeout and the outbound route's cluster change every time (a new cluster version and a
/// new route table, the two resources istiod pushes most); every [`LISTENER_EVERY`] pushes the
/// listeners change too: the outbound one's stat prefix, and the inbound HTTP chain's RBAC
/// policy (a DENY for a principal no client has, renamed), which makes the inbound
/// connections on that chain drain.
fn push(ads: &Ads, i: usize) {
    let version = format!("v{i}");
    let mut a = remora_e2e::xds_resources::eds_cluster(A);
    a["connect_timeout"] = json!(format!("{}s", 2 + i % 2));
    let assignment = |cluster: &str, port: u16| {
        json!({"cluster_name": cluster, "endpoints": [{"lb_endpoints": [
            endpoint(SocketAddr::from((BACKEND_IP, port)), None)]}]})
    };
    let generation = (i / LISTENER_EVERY) % 2;
    let outbound = json!({
        "name": "0.0.0.0_80", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
        "traffic_direction": "OUTBOUND", "bind_to_port": false,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": format!("outbound_0.0.0.0_80_{generation}"),
            "rds": {"config_source": {"ads": {}}, "route_config_name": "80"},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]});
    let deny = http_rbac(
        "DENY",
        &format!("ns[test]-policy[deny-{generation}]-rule[0]"),
        "spiffe://cluster.local/ns/test/sa/nobody",
    );
    let inbound = virtual_inbound(INBOUND_PORT, false, &[deny], &[]);
    let cluster = if i.is_multiple_of(2) { A } else { B };
    let route: Value = json!({"name": "80", "virtual_hosts": [{"name": "web", "domains": [HOST],
        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster}}]}]});
    let mut clusters = vec![a, remora_e2e::xds_resources::eds_cluster(B)];
    clusters.extend(inbound_clusters(INBOUND_PORT));
    ads.set(type_url::CLUSTER, &version, &clusters);
    ads.set(
        type_url::ENDPOINT,
        &version,
        &[assignment(A, 8001), assignment(B, 8002)],
    );
    ads.set(type_url::LISTENER, &version, &[outbound, inbound]);
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
    let _app = backend::start(&net.pod, any_addr(INBOUND_PORT), "app");
    let ads = Arc::clone(plane.ads());
    push(&ads, 0);
    let mut sidecar = istiod_sidecar(&net, &files, "").start();
    sidecar.wait_ready(STEP_TIME);
    let vip = SocketAddr::from(SocketAddrV4::new(VIP, 80));
    let app = net.pod_addr(INBOUND_PORT);

    // The application's clients, outbound to the service; the peer's, inbound to the pod.
    let ((took, inbound), outbound) = super::with_load(&net.pod, vip, vip, HOST, |outbound| {
        super::with_load(&net.peer, app, app, "app", |inbound| {
            wait_answers(outbound, 200, &sidecar);
            wait_answers(inbound, 200, &sidecar);
            let started = Instant::now();
            for i in 1..=PUSHES {
                push(&ads, i);
                let version = format!("v{i}");
                wait_until(&format!("push {i} ACKed"), STEP_TIME, || {
                    acked(&ads, type_url::ROUTE, &version)
                        && acked(&ads, type_url::CLUSTER, &version)
                        && (!i.is_multiple_of(LISTENER_EVERY)
                            || acked(&ads, type_url::LISTENER, &version))
                });
                // A few dozen requests per version, rather than all 100 within a second.
                std::thread::sleep(Duration::from_millis(20));
            }
            started.elapsed()
        })
    });
    println!(
        "{PUSHES} xDS pushes (cluster and route each, listeners every {LISTENER_EVERY}) in \
         {took:?} under load: outbound {}; inbound {}",
        outbound.summary(),
        inbound.summary()
    );
    assert_no_failure("xDS pushes, outbound", &outbound, &sidecar);
    assert_no_failure("xDS pushes, inbound", &inbound, &sidecar);
    // A change of a chain drains each keep-alive connection on it (`connection: close`, then
    // a new connection, served), inbound and outbound alike (each generation changes both the
    // outbound chain's stat prefix and the inbound chain's policy; Envoy drains the
    // connections of any chain an update changed): once per change and connection (30 when
    // every connection sent a request between two changes, as it does unless the machine
    // stalls it for the 200 ms between them). Each HTTP/2 connection on it is drained too, as
    // Envoy drains a changed chain: GOAWAY (NO_ERROR), its streams finish, and the client's
    // next connection takes the new chain. None is closed by the drain time (45 s).
    let changes = PUSHES / LISTENER_EVERY;
    for (what, tally) in [("inbound", &inbound), ("outbound", &outbound)] {
        let closes = tally.closes.load(Ordering::Relaxed) as usize;
        assert!(
            closes >= super::KEEP_ALIVE_CLIENTS * changes / 2
                && closes <= super::KEEP_ALIVE_CLIENTS * changes,
            "{what}: {}",
            tally.summary()
        );
        let goaway = tally.h2_goaway_connections.load(Ordering::Relaxed) as usize;
        assert!(
            goaway >= super::H2_CLIENTS * changes / 2 && goaway <= super::H2_CLIENTS * changes,
            "{what}: {}",
            tally.summary()
        );
        let goaways = tally.goaways.lock().expect("goaways").clone();
        assert!(
            goaways.iter().all(|g| g.error_code == 0),
            "{what}: {goaways:?}"
        );
    }
    let metrics = sidecar.metrics();
    for direction in ["inbound", "outbound"] {
        let cut = metrics.value(
            "remora_filter_chain_drain_closes_total",
            &[("direction", direction)],
        );
        assert_eq!(
            cut, 0.0,
            "{direction}: no connection outlived the drain time"
        );
    }
    let nacks: Vec<_> = ads
        .requests()
        .into_iter()
        .filter(|r| r.error_detail.is_some())
        .collect();
    assert!(nacks.is_empty(), "{nacks:?}");
    // The pushes took effect: the route sent the traffic to each cluster in turn.
    let backends = outbound.backends.lock().expect("backends").clone();
    assert!(
        backends.get("a").copied().unwrap_or(0) > 0 && backends.get("b").copied().unwrap_or(0) > 0,
        "{backends:?}"
    );
}

/// SIGTERM to a sidecar configured by istiod, under load both ways: inbound (through
/// `virtualInbound`) drains as with the config file (every connection told to go, the
/// listener accepting on, so reconnecting clients are served and told again), while outbound
/// (the application's own calls, routed by xDS) keeps serving through the drain period, as
/// Envoy's `drain_listeners?inboundonly` leaves outbound; the application and its peers stop
/// their calls a second before the drain period ends, as they would when shutting down.
pub fn sigterm_by_istiod_under_load() {
    let drain = Duration::from_secs(3);
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let (plane, _hosts, files, _ca) = control_plane(&net);
    net.capture_default();
    backend_routes(&net);
    let _a = backend::start(&net.peer, SocketAddr::from((BACKEND_IP, 8001)), "a");
    let _b = backend::start(&net.peer, SocketAddr::from((BACKEND_IP, 8002)), "b");
    let _app = backend::start(&net.pod, any_addr(INBOUND_PORT), "app");
    push(plane.ads(), 0);
    let mut sidecar = istiod_sidecar(
        &net,
        &files,
        &format!("drain:\n  duration: {}s\n", drain.as_secs()),
    )
    .start();
    sidecar.wait_ready(STEP_TIME);
    let vip = SocketAddr::from(SocketAddrV4::new(VIP, 80));
    let app = net.pod_addr(INBOUND_PORT);

    let (((exit, exited_after, outbound_after), inbound), outbound) =
        super::with_load(&net.pod, vip, vip, HOST, |outbound| {
            super::with_load(&net.peer, app, app, "app", |inbound| {
                wait_answers(outbound, 200, &sidecar);
                wait_answers(inbound, 200, &sidecar);
                inbound.signalled.store(true, Ordering::Relaxed);
                let signalled = Instant::now();
                let outbound_before = outbound.ok();
                sidecar.terminate();
                std::thread::sleep(drain - Duration::from_secs(1));
                outbound.stop.store(true, Ordering::Relaxed);
                inbound.stop.store(true, Ordering::Relaxed);
                let outbound_after = outbound.ok() - outbound_before;
                let exit = sidecar.wait_exit(drain + Duration::from_secs(10));
                (exit, signalled.elapsed(), outbound_after)
            })
        });
    println!(
        "SIGTERM (istiod) under load: exit {exit:?} after {exited_after:?}; outbound answered \
         {outbound_after} after the signal: {}; inbound: {}",
        outbound.summary(),
        inbound.summary()
    );
    assert_no_failure("SIGTERM (istiod), outbound", &outbound, &sidecar);
    assert_no_failure("SIGTERM (istiod), inbound", &inbound, &sidecar);
    let exit = exit.unwrap_or_else(|| panic!("still running {exited_after:?} after SIGTERM"));
    assert!(exit.success(), "{exit:?}\n{}", sidecar.stderr());
    assert!(
        exited_after >= drain - Duration::from_millis(100)
            && exited_after <= drain + Duration::from_millis(1500),
        "exited {exited_after:?} after SIGTERM, drain period {drain:?}"
    );
    // Outbound served on through the drain, on the same connections.
    assert!(outbound_after > 0, "{}", outbound.summary());
    super::assert_connections_kept("SIGTERM (istiod), outbound", &outbound);
    // Inbound drained, the listener accepting on: each client told to go, then served on a
    // new connection and told again.
    super::assert_drained_and_reconnected(&inbound);
}
