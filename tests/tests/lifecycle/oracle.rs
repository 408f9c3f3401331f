//! SIGTERM's drain against the oracle: a real Envoy 1.40 driven as Istio's pilot-agent drives
//! it (started with `--drain-strategy immediate --drain-time-s 45`, `POST
//! /drain_listeners?inboundonly&graceful` on its admin at SIGTERM, killed once
//! `terminationDrainDuration` has passed), and Remora sent SIGTERM, each the pod's sidecar and
//! probed the same way: what each inbound connection, old and new, is told, and what outbound
//! keeps doing.

use super::load::{h2_origin, FrameSniffer, GoAway};
use remora_e2e::envoy::{self, Envoy};
use remora_e2e::envoy_config::{admin, cluster, http_connection_manager, socket_address};
use remora_e2e::http_client::Client;
use remora_e2e::peer::any_addr;
use remora_e2e::{backend, Netns, PodNet};
use serde_json::{json, Value};
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The pod's HTTP/1.1 and h2c applications, as its clients dial them.
const H1_PORT: u16 = 8080;
const H2_PORT: u16 = 8082;
/// Behind Envoy's listeners (on the pod's address), the applications listen on loopback here.
const ENVOY_H1_APP: u16 = 18080;
const ENVOY_H2_APP: u16 = 18082;
/// The peer's service the application calls.
const SERVICE_PORT: u16 = 9000;
/// Envoy's outbound listener, which the application dials on loopback (Remora's is capture).
const ENVOY_OUTBOUND: u16 = 15001;
/// Istio's `terminationDrainDuration`, shortened.
const DRAIN: Duration = Duration::from_secs(3);
/// Bound on one probe step.
const STEP: Duration = Duration::from_secs(5);
/// How long the proxy may take to close a connection it told `connection: close`.
const CLOSE_WAIT: Duration = Duration::from_secs(1);
/// How long a GOAWAY may take to follow what causes it.
const GOAWAY_WAIT: Duration = Duration::from_secs(1);

/// What the clients were told across the drain: Remora must tell them what Envoy does.
#[derive(Debug, PartialEq, Eq)]
struct Told {
    /// A keep-alive HTTP/1.1 connection answered before the drain: its next answer (status,
    /// `connection` header).
    kept_h1: (u16, Option<String>),
    /// An HTTP/1.1 connection opened while draining: its answer.
    new_h1: (u16, Option<String>),
    /// An HTTP/2 connection answered before the drain was given GOAWAY by the time its next
    /// request (if it could still send one) was answered.
    old_h2_goaway: bool,
    /// An HTTP/2 connection opened while draining: its first answer, and whether GOAWAY
    /// followed it.
    new_h2: (u16, bool),
    /// Every GOAWAY said NO_ERROR.
    goaways_no_error: bool,
    /// Two answers on an outbound keep-alive connection opened before the drain, while
    /// draining (status, `connection` header).
    outbound: Vec<(u16, Option<String>)>,
}

/// When the proxy acted on what it said, where Remora and Envoy differ (docs/hardening.md,
/// "SIGTERM"): printed, and Remora's asserted.
#[derive(Debug)]
struct Timing {
    /// The HTTP/1.1 connections told `connection: close` (the kept one, the new one) were
    /// closed by the proxy within [`CLOSE_WAIT`] (Envoy leaves that to the client until its
    /// connection manager's `drain_timeout`, 5 s).
    h1_closed: (bool, bool),
    /// The old HTTP/2 connection got GOAWAY without sending a request after the drain began
    /// (Envoy sends it with the next response).
    old_h2_goaway_unasked: bool,
    /// The old HTTP/2 connection's request after the drain began, when it could send one.
    old_h2_next: Option<u16>,
}

/// Remora and Envoy, driven the same way, see the same.
pub fn sigterm_drain_matches_envoy() {
    let Some(binary) = envoy::binary_or_skip() else {
        return;
    };
    let remora = {
        let Some(net) = PodNet::create_or_skip() else {
            return;
        };
        remora_observes(&net)
    };
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let oracle = envoy_observes(&net, &binary);
    println!("SIGTERM drain, Remora: {remora:?}\nEnvoy (oracle): {oracle:?}");
    assert_eq!(
        remora.0, oracle.0,
        "Remora's drain tells clients otherwise than Envoy's under pilot-agent"
    );
    // What the oracle shows is the draining the issue asks for: the new connections accepted,
    // served and told to go.
    assert_eq!(oracle.0.new_h1, (200, Some("close".into())));
    assert_eq!(oracle.0.new_h2, (200, true));
    // A request an old HTTP/2 connection could still send after the drain began was served.
    for (who, timing) in [("Remora", &remora.1), ("Envoy", &oracle.1)] {
        assert!(
            timing.old_h2_next.is_none_or(|s| s == 200),
            "{who}: {timing:?}"
        );
    }
    // Remora closes an HTTP/1.1 connection right after telling it `connection: close`, and
    // gives an HTTP/2 connection that has had requests its GOAWAY as the drain starts.
    let timing = &remora.1;
    assert_eq!(timing.h1_closed, (true, true), "{timing:?}");
    assert!(timing.old_h2_goaway_unasked, "{timing:?}");
}

fn remora_observes(net: &PodNet) -> (Told, Timing) {
    net.capture_default();
    let mut remora = net
        .remora()
        .config(&format!("drain:\n  duration: {}s\n", DRAIN.as_secs()))
        .start_ready();
    let rt = runtime();
    let _h1 = backend::start(&net.pod, any_addr(H1_PORT), "app");
    let h2 = net
        .pod
        .bind(any_addr(H2_PORT))
        .expect("bind the h2c origin");
    rt.spawn(h2_origin(h2, Duration::ZERO));
    let _service = backend::start(&net.peer, any_addr(SERVICE_PORT), "service");
    let signalled = Instant::now();
    let observed = probe(
        net,
        &rt,
        net.peer_addr(SERVICE_PORT),
        || {
            remora.terminate();
            // Draining has begun once readiness says so.
            let deadline = Instant::now() + STEP;
            while remora.readiness() != Some(503) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        },
        &remora.stderr(),
    );
    let exit = remora.wait_exit(DRAIN + Duration::from_secs(10));
    assert!(
        exit.is_some_and(|s| s.success()),
        "{exit:?} after {:?}\n{}",
        signalled.elapsed(),
        remora.stderr()
    );
    observed
}

fn envoy_observes(net: &PodNet, binary: &std::path::Path) -> (Told, Timing) {
    let rt = runtime();
    let _h1 = backend::start(&net.pod, any_addr(ENVOY_H1_APP), "app");
    let h2 = net
        .pod
        .bind(any_addr(ENVOY_H2_APP))
        .expect("bind the h2c origin");
    rt.spawn(h2_origin(h2, Duration::ZERO));
    let _service = backend::start(&net.peer, any_addr(SERVICE_PORT), "service");
    // As pilot-agent starts Envoy (`pkg/envoy/proxy.go`): every connection told at once, the
    // listeners accepting for drainDuration (45 s), far past the kill.
    let sidecar = Envoy::start_with_args(
        &net.pod,
        binary,
        net.binary(),
        &envoy_sidecar(net),
        &["--drain-strategy", "immediate", "--drain-time-s", "45"],
    );
    let signalled = Instant::now();
    let observed = probe(
        net,
        &rt,
        SocketAddr::from((Ipv4Addr::LOCALHOST, ENVOY_OUTBOUND)),
        || {
            // pilot-agent's `terminate()` (`pkg/envoy/agent.go`, `DrainListeners`).
            let (status, body) = sidecar.admin_post("/drain_listeners?inboundonly&graceful");
            assert_eq!(status, 200, "{body}\n{}", sidecar.logs());
        },
        "",
    );
    // pilot-agent kills Envoy once terminationDrainDuration has passed.
    std::thread::sleep(DRAIN.saturating_sub(signalled.elapsed()));
    drop(sidecar);
    observed
}

/// The pod's sidecar as Envoy: an inbound listener per application port on the pod's address
/// (`traffic_direction: INBOUND`, as Istio's inbound listeners are), and an outbound one on
/// loopback to the peer's service.
fn envoy_sidecar(net: &PodNet) -> String {
    let listener = |name: &str, ip: Ipv4Addr, port: u16, direction: &str, cluster: &str| {
        json!({
            "name": name,
            "address": socket_address(ip, port),
            "traffic_direction": direction,
            "filter_chains": [{ "filters": [http_connection_manager(name, cluster, json!({}))] }]
        })
    };
    let mut h2_app = cluster("app_h2", Ipv4Addr::LOCALHOST, ENVOY_H2_APP, None);
    h2_app["typed_extension_protocol_options"] = json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": { "http2_protocol_options": {} }
        }
    });
    let config: Value = json!({
        "admin": admin(),
        "static_resources": {
            "listeners": [
                listener("inbound_h1", net.pod_ip, H1_PORT, "INBOUND", "app_h1"),
                listener("inbound_h2", net.pod_ip, H2_PORT, "INBOUND", "app_h2"),
                listener("outbound", Ipv4Addr::LOCALHOST, ENVOY_OUTBOUND, "OUTBOUND", "service")
            ],
            "clusters": [
                cluster("app_h1", Ipv4Addr::LOCALHOST, ENVOY_H1_APP, None),
                h2_app,
                cluster("service", net.peer_ip, SERVICE_PORT, None)
            ]
        }
    });
    config.to_string()
}

/// The probe: connections opened before the drain (HTTP/1.1 and HTTP/2 inbound from the peer,
/// HTTP/1.1 outbound from the pod to `outbound`), `drain`, then what each is told, and what
/// new inbound connections are told.
fn probe(
    net: &PodNet,
    rt: &tokio::runtime::Runtime,
    outbound: SocketAddr,
    drain: impl FnOnce(),
    logs: &str,
) -> (Told, Timing) {
    let (h1, h2) = (net.pod_addr(H1_PORT), net.pod_addr(H2_PORT));
    let mut kept = Client::connect(&net.peer, h1).expect("inbound HTTP/1.1 connect");
    let first = kept.get("app", "/", &[]).expect("inbound HTTP/1.1 answer");
    assert_eq!(first.status, 200, "{}\n{logs}", first.text());
    let mut out = Client::connect(&net.pod, outbound).expect("outbound connect");
    let first = out.get("service", "/", &[]).expect("outbound answer");
    assert_eq!(first.status, 200, "{}\n{logs}", first.text());
    let mut old_h2 = rt.block_on(H2::open(&net.peer, h2));
    assert_eq!(rt.block_on(old_h2.get()), Ok(200));

    drain();
    std::thread::sleep(Duration::from_millis(300));

    let old_h2_goaway_unasked = old_h2.goaway_seen();
    let kept_h1 = answer_then_closed(kept);
    let new_h1 = match Client::connect(&net.peer, h1) {
        Ok(c) => answer_then_closed(c),
        Err(e) => panic!("an inbound connection while draining: {e}"),
    };
    let (old_h2_next, old_h2_goaway) = match old_h2_goaway_unasked {
        true => (None, true),
        false => {
            let status = rt.block_on(old_h2.get()).ok();
            (status, rt.block_on(old_h2.wait_goaway()))
        }
    };
    let mut new_h2 = rt.block_on(H2::open(&net.peer, h2));
    let new_status = rt.block_on(new_h2.get()).unwrap_or(0);
    let new_h2_goaway = rt.block_on(new_h2.wait_goaway());
    let outbound = (0..2)
        .map(|_| match out.get("service", "/", &[]) {
            Ok(r) => (r.status, r.header("connection").map(str::to_string)),
            Err(_) => (0, None),
        })
        .collect();
    let goaways_no_error = [&old_h2, &new_h2]
        .iter()
        .flat_map(|c| c.goaways())
        .all(|g| g.error_code == 0);
    let told = Told {
        kept_h1: (kept_h1.0, kept_h1.1),
        new_h1: (new_h1.0, new_h1.1),
        old_h2_goaway,
        new_h2: (new_status, new_h2_goaway),
        goaways_no_error,
        outbound,
    };
    let timing = Timing {
        h1_closed: (kept_h1.2, new_h1.2),
        old_h2_goaway_unasked,
        old_h2_next,
    };
    (told, timing)
}

/// One answer on `client` (status, `connection` header), and whether the proxy then closed
/// the connection.
fn answer_then_closed(mut client: Client) -> (u16, Option<String>, bool) {
    let (status, connection) = match client.get("app", "/", &[]) {
        Ok(r) => (r.status, r.header("connection").map(str::to_string)),
        Err(_) => (0, None),
    };
    let mut stream = client.into_inner();
    let _ = stream.set_read_timeout(Some(CLOSE_WAIT));
    let mut rest = [0u8; 64];
    let closed = matches!(stream.read(&mut rest), Ok(0));
    (status, connection, closed)
}

/// An HTTP/2 client connection whose GOAWAY frames are recorded.
struct H2 {
    send: h2::client::SendRequest<bytes::Bytes>,
    goaways: Arc<Mutex<Vec<GoAway>>>,
    _driver: tokio::task::JoinHandle<()>,
}

impl H2 {
    async fn open(ns: &Netns, addr: SocketAddr) -> H2 {
        let socket = ns.connect(addr, STEP).expect("inbound HTTP/2 connect");
        socket.set_nonblocking(true).expect("non-blocking");
        let socket = tokio::net::TcpStream::from_std(socket).expect("a tokio socket");
        let goaways = Arc::new(Mutex::new(Vec::new()));
        let sniffer = FrameSniffer::new(socket, Arc::clone(&goaways));
        let (send, conn) = tokio::time::timeout(STEP, h2::client::handshake(sniffer))
            .await
            .expect("h2 handshake in time")
            .expect("h2 handshake");
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        H2 {
            send,
            goaways,
            _driver: driver,
        }
    }

    /// `GET /`, read to its end: its status, or what failed.
    async fn get(&mut self) -> Result<u16, String> {
        let request = http::Request::get("http://app/")
            .body(())
            .map_err(|e| e.to_string())?;
        let step = async {
            let mut ready = self.send.clone().ready().await.map_err(|e| e.to_string())?;
            let (response, _) = ready
                .send_request(request, true)
                .map_err(|e| e.to_string())?;
            let response = response.await.map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let mut body = response.into_body();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.map_err(|e| e.to_string())?;
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            Ok(status)
        };
        tokio::time::timeout(STEP, step)
            .await
            .map_err(|_| "no answer in time".to_string())?
    }

    fn goaways(&self) -> Vec<GoAway> {
        self.goaways
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn goaway_seen(&self) -> bool {
        !self.goaways().is_empty()
    }

    /// Whether a GOAWAY has come, waiting [`GOAWAY_WAIT`] for one.
    async fn wait_goaway(&self) -> bool {
        let deadline = tokio::time::Instant::now() + GOAWAY_WAIT;
        while !self.goaway_seen() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.goaway_seen()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime")
}
