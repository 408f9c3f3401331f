//! The HTTP/2 attack tests' parts: the origin that counts what reaches it, the attack clients
//! (tests/peers/h2_attack.py) and their reports, the good client that measures latency, and
//! the proxy's RSS and CPU from /proc.

use bytes::Bytes;
use h2::{client, server};
use http::{Request, Response, StatusCode};
use remora_e2e::peer::any_addr;
use remora_e2e::service::peer_program;
use remora_e2e::{Netns, PodNet, Remora};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Bound on any one step of a test.
pub const STEP: Duration = Duration::from_secs(10);
/// The origin's port (detected as HTTP/2 by the proxy).
pub const ORIGIN_PORT: u16 = 8082;
/// How long an attacker may go on before giving up on the proxy stopping it.
pub const ATTACK_SECONDS: &str = "8";

/// Latency is measured one test at a time: tests of this file hold this while they run.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// What the origin saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub requests: AtomicUsize,
    /// Connections the proxy opened to the origin.
    pub connections: AtomicUsize,
    /// Streams the proxy reset (cancelled) while the origin held them.
    pub cancelled: AtomicUsize,
    /// Requests carrying a header named `x-bomb` or a `cookie` (what the attacks smuggle).
    pub smuggled: AtomicUsize,
    /// The most cookie fields a request reached the origin with.
    pub cookie_fields: AtomicUsize,
}

impl Seen {
    pub fn in_flight(&self) -> usize {
        let hang = self.requests.load(Ordering::SeqCst);
        hang.saturating_sub(self.cancelled.load(Ordering::SeqCst))
    }
}

/// An h2c origin: `/ok` answers at once; every other path holds its stream open, unanswered,
/// until the proxy resets it (the upstream work an attack must not leave running).
pub async fn origin(listener: std::net::TcpListener, seen: Arc<Seen>, ok: Arc<AtomicUsize>) {
    listener.set_nonblocking(true).expect("non-blocking");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    while let Ok((socket, _)) = listener.accept().await {
        seen.connections.fetch_add(1, Ordering::SeqCst);
        let (seen, ok) = (Arc::clone(&seen), Arc::clone(&ok));
        tokio::spawn(async move {
            let mut builder = server::Builder::new();
            // The proxy passes each client reset on as an upstream reset on its pooled
            // connection. Under load this origin's task may not accept streams before their
            // resets arrive, and h2's own Rapid Reset guard (20 such) would then end the
            // proxy's shared connection, failing the good client's request on it: a real
            // exposure (docs/hardening.md), but not what these tests measure.
            builder
                .max_concurrent_streams(100_000)
                .max_pending_accept_reset_streams(usize::MAX);
            let Ok(mut conn) = builder.handshake::<_, Bytes>(socket).await else {
                return;
            };
            while let Some(Ok((request, mut respond))) = conn.accept().await {
                let path = request.uri().path().to_string();
                if path == "/ok" {
                    ok.fetch_add(1, Ordering::SeqCst);
                    let response = Response::builder().status(200).body(()).expect("response");
                    if let Ok(mut body) = respond.send_response(response, false) {
                        let _ = body.send_data(Bytes::from_static(b"ok"), true);
                    }
                    continue;
                }
                seen.requests.fetch_add(1, Ordering::SeqCst);
                let headers = request.headers();
                if headers.contains_key("x-bomb") || headers.contains_key("cookie") {
                    seen.smuggled.fetch_add(1, Ordering::SeqCst);
                }
                let cookies = headers.get_all("cookie").iter().count();
                seen.cookie_fields.fetch_max(cookies, Ordering::SeqCst);
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    if std::future::poll_fn(|cx| respond.poll_reset(cx))
                        .await
                        .is_ok()
                    {
                        seen.cancelled.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
    }
}

/// One direction through the proxy: where the attacker and the good client run, and the
/// origin's address as they dial it.
pub struct Leg<'a> {
    pub name: &'static str,
    pub client: &'a Netns,
    pub target: SocketAddr,
    pub seen: Arc<Seen>,
    pub ok: Arc<AtomicUsize>,
}

/// Start origins for both directions: outbound (pod → peer) and inbound (peer → pod).
pub fn legs(net: &PodNet) -> [Leg<'_>; 2] {
    let outbound = Leg {
        name: "outbound",
        client: &net.pod,
        target: net.peer_addr(ORIGIN_PORT),
        seen: Arc::default(),
        ok: Arc::default(),
    };
    let inbound = Leg {
        name: "inbound",
        client: &net.peer,
        target: net.pod_addr(ORIGIN_PORT),
        seen: Arc::default(),
        ok: Arc::default(),
    };
    let out_listener = net
        .peer
        .bind(outbound.target)
        .expect("bind the outbound origin");
    let in_listener = net
        .pod
        .bind(any_addr(ORIGIN_PORT))
        .expect("bind the inbound origin");
    for (leg, listener) in [(&outbound, out_listener), (&inbound, in_listener)] {
        let (seen, ok) = (Arc::clone(&leg.seen), Arc::clone(&leg.ok));
        std::thread::spawn(move || runtime().block_on(origin(listener, seen, ok)));
    }
    [outbound, inbound]
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// What an attacker reported (see tests/peers/h2_attack.py).
#[derive(Debug)]
pub struct Report(pub Value);

impl Report {
    pub fn units(&self) -> u64 {
        self.0["units"].as_u64().unwrap_or(0)
    }
    pub fn bytes_sent(&self) -> u64 {
        self.0["bytes_sent"].as_u64().unwrap_or(0)
    }
    pub fn goaway_code(&self) -> Option<u64> {
        self.0["goaway"]["error_code"].as_u64()
    }
    /// The GOAWAY's debug data, as text.
    pub fn goaway_debug(&self) -> Option<&str> {
        self.0["goaway"]["debug"].as_str()
    }
    pub fn last_stream_id(&self) -> Option<u64> {
        self.0["goaway"]["last_stream_id"].as_u64()
    }
    /// The server ended the abuse: GOAWAY, or the connection closed.
    pub fn stopped(&self) -> bool {
        self.goaway_code().is_some() || self.0["closed"].as_bool() == Some(true)
    }
    /// The server stopped reading: writes to it timed out.
    pub fn blocked(&self) -> bool {
        self.0["blocked"].as_bool() == Some(true)
    }
    /// CPU time the attacker spent.
    pub fn cpu(&self) -> Duration {
        Duration::from_secs_f64(self.0["cpu_seconds"].as_f64().unwrap_or(0.0))
    }
    /// RST_STREAM frames the server sent.
    pub fn resets_received(&self) -> u64 {
        self.0["frames_received"]["RstStreamFrame"]
            .as_u64()
            .unwrap_or(0)
    }
    pub fn status_count(&self, status: &str) -> u64 {
        self.0["statuses"][status].as_u64().unwrap_or(0)
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

pub const ENHANCE_YOUR_CALM: u64 = 0xb;
pub const PROTOCOL_ERROR: u64 = 0x1;

/// Whether the attack clients can run here (Python's `h2` brings `hyperframe` and `hpack`).
pub fn attackers_available() -> bool {
    if remora_e2e::service::python_has("h2") {
        return true;
    }
    remora_e2e::environment::skip::<()>(
        "python3 has no h2/hyperframe (scripts/install-test-deps installs them)",
    );
    false
}

/// Run one attack from `leg`'s client namespace, to its end: one report per connection (more
/// than one with `--repeat`, which reconnects each time the proxy stops it).
pub fn attack(leg: &Leg<'_>, name: &str, extra: &[&str]) -> Vec<Report> {
    let script = peer_program("h2_attack.py").to_string_lossy().into_owned();
    let mut cmd = leg.client.command("python3");
    cmd.arg(script)
        .arg(name)
        .arg(leg.target.to_string())
        .arg(ATTACK_SECONDS)
        .args(extra);
    let out = remora_e2e::process::run_bounded(&mut cmd, Duration::from_secs(60))
        .expect("run the attacker");
    let text = String::from_utf8_lossy(&out.stdout);
    let reports: Vec<Report> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .map(Report)
        .collect();
    assert!(
        !reports.is_empty(),
        "{} {name}: no report: {text}\n{}",
        leg.name,
        String::from_utf8_lossy(&out.stderr)
    );
    for report in &reports {
        if reports.len() < 5 {
            eprintln!("{} {name}: {report}", leg.name);
        }
    }
    reports
}

/// An attack from `leg` with the good client measuring alongside: the reports and the good
/// client's latencies.
pub fn attack_beside_good_client(
    leg: &Leg<'_>,
    name: &str,
    extra: &[&str],
    good_for: Duration,
) -> (Vec<Report>, Vec<Duration>) {
    std::thread::scope(|s| {
        let attacker = s.spawn(|| attack(leg, name, extra));
        let latencies = runtime().block_on(good_client(leg.client, leg.target, good_for));
        (attacker.join().expect("the attacker thread"), latencies)
    })
}

/// Latencies of sequential GET /ok on one good connection from `leg`'s client, for `time`.
pub async fn good_client(ns: &Netns, addr: SocketAddr, time: Duration) -> Vec<Duration> {
    let socket = ns.connect(addr, STEP).expect("connect");
    socket.set_nonblocking(true).expect("non-blocking");
    let socket = tokio::net::TcpStream::from_std(socket).expect("tokio stream");
    let (send, conn) = tokio::time::timeout(STEP, client::handshake(socket))
        .await
        .expect("handshake in time")
        .expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut latencies = Vec::new();
    let end = Instant::now() + time;
    while Instant::now() < end {
        let started = Instant::now();
        let request = Request::get(format!("http://{addr}/ok"))
            .body(())
            .expect("request");
        let exchange = async {
            let mut ready = send.clone().ready().await?;
            let (response, _) = ready.send_request(request, true)?;
            let response = response.await?;
            let status = response.status();
            let mut body = response.into_body();
            while let Some(chunk) = body.data().await {
                let chunk = chunk?;
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            Ok::<_, h2::Error>(status)
        };
        let status = tokio::time::timeout(STEP, exchange)
            .await
            .expect("a good request took longer than a step")
            .expect("a good request failed");
        assert_eq!(status, StatusCode::OK);
        latencies.push(started.elapsed());
    }
    latencies
}

pub fn p99(latencies: &mut [Duration]) -> Duration {
    assert!(!latencies.is_empty(), "the good client made no request");
    latencies.sort();
    latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)]
}

/// The proxy's resident set, from /proc.
pub fn rss_kib(remora: &Remora<'_>) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", remora.pid()))
        .expect("the proxy's /proc status");
    assert!(status.starts_with("Name:\tremora"), "{status}");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// CPU time the proxy has used so far (user + system), from /proc.
pub fn cpu_time(remora: &Remora<'_>) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", remora.pid()))
        .expect("the proxy's /proc stat");
    // Fields after the command name's closing parenthesis; utime and stime are 14th and 15th.
    let after = stat.rsplit_once(')').map(|(_, s)| s).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
    // SAFETY-free: sysconf is a plain query.
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// Wait until every request that reached `leg`'s origin has been cancelled by the proxy.
pub fn wait_all_cancelled(leg: &Leg<'_>, remora: &Remora<'_>) {
    let deadline = Instant::now() + STEP;
    while leg.seen.in_flight() > 0 {
        assert!(
            Instant::now() < deadline,
            "{}: {} of {} upstream requests were never cancelled\n{}",
            leg.name,
            leg.seen.in_flight(),
            leg.seen.requests.load(Ordering::SeqCst),
            tail(&remora.stderr())
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

pub fn setup() -> Option<PodNet> {
    if !attackers_available() {
        return None;
    }
    PodNet::create_or_skip()
}

pub fn lock() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The good client's p99 under attack may be at most this many times its p99 alone, plus
/// [`P99_SLACK`] (the machine is shared; a proxy that stalls its other connections under
/// attack is seconds off).
pub const P99_FACTOR: u32 = 5;
pub const P99_SLACK: Duration = Duration::from_millis(20);
/// How much the proxy's resident set may grow over an attack.
pub const RSS_GROWTH_KIB: u64 = 32 << 10;

/// The good client alone, then beside the attack: asserts its p99 stays within the bound, and
/// returns the attack's reports.
pub fn attack_measured(
    leg: &Leg<'_>,
    remora: &Remora<'_>,
    name: &str,
    extra: &[&str],
) -> Vec<Report> {
    let mut alone = runtime().block_on(good_client(leg.client, leg.target, Duration::from_secs(3)));
    let alone_p99 = p99(&mut alone);
    let rss_before = rss_kib(remora);
    let cpu_before = cpu_time(remora);
    let started = Instant::now();
    let (reports, mut under) = attack_beside_good_client(leg, name, extra, Duration::from_secs(5));
    let wall = started.elapsed();
    let cpu = cpu_time(remora) - cpu_before;
    let under_p99 = p99(&mut under);
    let rss_after = rss_kib(remora);
    let units: u64 = reports.iter().map(Report::units).sum();
    eprintln!(
        "{} {name}: {} connections, {units} units; good client p99 {alone_p99:?} alone ({} \
         requests), {under_p99:?} under attack ({} requests); proxy RSS {rss_before} -> \
         {rss_after} KiB, CPU {cpu:?} in {wall:?}; origin saw {} requests, {} cancelled, on {} \
         connections",
        leg.name,
        reports.len(),
        alone.len(),
        under.len(),
        leg.seen.requests.load(Ordering::SeqCst),
        leg.seen.cancelled.load(Ordering::SeqCst),
        leg.seen.connections.load(Ordering::SeqCst),
    );
    let bound = alone_p99 * P99_FACTOR + P99_SLACK;
    assert!(
        under_p99 <= bound,
        "{} {name}: the good client's p99 went from {alone_p99:?} to {under_p99:?} (bound {bound:?})",
        leg.name
    );
    assert!(
        rss_after <= rss_before + RSS_GROWTH_KIB,
        "{} {name}: the proxy grew from {rss_before} to {rss_after} KiB",
        leg.name
    );
    reports
}
