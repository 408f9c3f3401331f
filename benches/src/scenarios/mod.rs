//! The scenarios of the benchmark issue and what they share: the programs found on the machine
//! ([`Tools`]), the run's sizes ([`Settings`]), and a [`Bench`] that owns the upstream, starts a
//! contender in a mode (writing its config, pinning it, timing its start until it answers) and
//! measures what a piece of load costs it.

pub mod config_scale;
pub mod cost;
pub mod latency;
mod measure;
pub mod mtls;
mod rounds;
pub mod tcp;
pub mod throughput;
pub mod traffic;

use crate::process::{self, Registry, Spawned, Usage, LOAD_CPU, PROXY_CPU};
use crate::proxy_config::{self as config, Mode, NginxLimits, Proxy, RemoraPorts};
use crate::upstream::grpc_frame;
use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
pub use measure::Cost;
pub use rounds::{interleaved, push_rows, summarize};
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a contender may take from spawn to its first answered request.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The programs the harness drives; `None` where the machine lacks one.
#[derive(Debug, Clone, Default)]
pub struct Tools {
    /// This harness binary (it is also the upstream server).
    pub harness: PathBuf,
    pub remora: Option<PathBuf>,
    /// Whether this Remora build offers `--protocol http`.
    pub remora_http: bool,
    pub envoy: Option<PathBuf>,
    pub haproxy: Option<PathBuf>,
    pub nginx: Option<PathBuf>,
    pub nginx_stream_module: Option<PathBuf>,
    pub wrk: Option<PathBuf>,
    pub h2load: Option<PathBuf>,
    pub iperf3: Option<PathBuf>,
}

/// Sizes and durations of one run.
#[derive(Debug, Clone)]
pub struct Settings {
    pub quick: bool,
    /// Load sent before recording (open-loop runs).
    pub warmup: Duration,
    /// Interleaved rounds of every scenario; each figure is their median.
    pub rounds: usize,
    /// Recorded length of a latency (and mTLS) round at 1000 rps.
    pub latency_round: Duration,
    /// Length of a throughput or TCP round.
    pub round: Duration,
    /// Length of the cost scenario's 1000 rps run in each round.
    pub run: Duration,
    /// How long memory is left to settle before and after opening idle connections.
    pub settle: Duration,
    /// Idle connections for memory per connection.
    pub idle_connections: usize,
    /// Why fewer idle connections than the 10,000, if so.
    pub idle_connections_note: Option<String>,
    /// Which contenders run, in table order.
    pub proxies: Vec<Proxy>,
    /// Whether to pin (false on a one-core machine).
    pub pin: bool,
    /// RLIMIT_NOFILE every child inherits.
    pub nofile: u64,
    /// The CPU one bare wake-up costs on the proxy's core (the machine probe), when measured:
    /// the cost scenario takes what a proxy spends beyond its wake-ups from it.
    pub bare_wake_up_us: Option<f64>,
}

impl Settings {
    /// The sizes (five rounds of everything: about 26 minutes in all), or `quick`
    /// ones (two short rounds) for smoke tests.
    pub fn new(quick: bool, proxies: Vec<Proxy>, pin: bool, nofile: u64) -> Settings {
        let wanted = if quick { 1_000 } else { 10_000 };
        // A proxied idle connection holds two descriptors in the proxy (client and upstream
        // side); keep a margin for listeners, logs and the runtime.
        let fit = (nofile.saturating_sub(1_000) / 2) as usize;
        let idle_connections = wanted.min(fit).max(1);
        let idle_connections_note = (idle_connections < wanted).then(|| {
            format!("{idle_connections} idle connections, not {wanted}: RLIMIT_NOFILE is {nofile} here and a proxy holds two descriptors per connection")
        });
        let secs = |quick_s: f64, full_s: f64| {
            Duration::from_secs_f64(if quick { quick_s } else { full_s })
        };
        Settings {
            quick,
            // Five rounds of everything in about 26 minutes: each round is short, the rounds
            // are not fewer. Latency rounds are 8 s: a p99 from 4,000 requests moved with
            // every few-millisecond hiccup of a shared machine (5 × 8 s = 40 s at 1000 rps).
            // The cost scenario's 1000 rps run is as long: its CPU per request, judged against
            // a bound 15% from HAProxy's, spread over 2.4× between 2 s rounds on a busy host.
            warmup: secs(0.5, 0.5),
            rounds: if quick { 2 } else { 5 },
            latency_round: secs(2.0, 8.0),
            round: secs(2.0, 2.0),
            run: secs(2.0, 8.0),
            settle: secs(0.5, 0.5),
            idle_connections,
            idle_connections_note,
            proxies,
            pin,
            nofile,
            bare_wake_up_us: None,
        }
    }

    /// The contenders of a scenario, with those of the reference rows (Remora in TCP mode, the
    /// floor) that it admits: Remora in TCP mode where the others parse HTTP (elsewhere it
    /// would repeat Remora's row), the floor where the load is Istio's 1000 rps.
    pub fn contenders(&self, references: &[Proxy]) -> Vec<Proxy> {
        self.proxies
            .iter()
            .copied()
            .filter(|p| !REFERENCES.contains(p) || references.contains(p))
            .collect()
    }
}

/// How to read the floor's row, under every table that has one.
pub const FLOOR_NOTE: &str = "floor is the least a proxy can do, a reference row: one epoll loop (`harness floor`, on the proxy core) that relays bytes between each client connection and an upstream connection of its own, with one read and one write per event and nothing else: no HTTP, no metrics, no timers, no allocation per request. What it costs at 1000 rps is what the machine charges any proxy for the same hops; a bound below it is out of every proxy's reach in that run.";

/// The rows that are there to read the others by, not to compete: each scenario says which
/// of them it runs ([`Settings::contenders`]).
pub const REFERENCES: [Proxy; 3] = [Proxy::RemoraTcp, Proxy::RemoraXds, Proxy::Floor];

/// A running contender.
#[derive(Debug)]
pub struct Contender {
    pub proxy: Proxy,
    /// Where clients connect.
    pub addr: SocketAddr,
    /// From spawn to the first answered request.
    pub startup: Option<Duration>,
    process: Option<Spawned>,
}

impl Contender {
    /// CPU and memory of the proxy now (`None` for no proxy).
    pub fn usage(&self) -> Option<Usage> {
        self.process.as_ref().map(Spawned::usage)
    }

    fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Spawned::pid)
    }
}

/// How a start decides the contender is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// A request through it is answered (and that time is its start-up time).
    Answers,
    /// Its port is listening; for upstreams that must not see a stray request (iperf3).
    Listens,
}

/// The shared state of a harness run.
pub struct Bench {
    pub tools: Tools,
    pub settings: Settings,
    pub registry: Registry,
    /// Configs and logs of this run's programs.
    pub work_dir: PathBuf,
    /// The HTTP upstream every contender forwards to.
    pub upstream: SocketAddr,
    runtime: tokio::runtime::Runtime,
    /// Numbers each start's log, so a second start of the same config keeps the first's log.
    starts: AtomicUsize,
    _upstream: Spawned,
}

impl Bench {
    /// Starts the upstream (on the load core) and returns once it answers.
    pub fn new(
        tools: Tools,
        settings: Settings,
        registry: Registry,
        work_dir: PathBuf,
    ) -> anyhow::Result<Bench> {
        fs::create_dir_all(&work_dir)
            .with_context(|| format!("creating {}", work_dir.display()))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let upstream: SocketAddr = format!("127.0.0.1:{}", process::free_ports(1)?[0]).parse()?;
        let args = vec![
            "upstream".to_string(),
            "--listen".into(),
            upstream.to_string(),
        ];
        let cpu = settings.pin.then_some(LOAD_CPU);
        let mut spawned = process::spawn(
            &registry,
            "upstream",
            cpu,
            &tools.harness,
            &args,
            &work_dir.join("upstream.log"),
        )?;
        let deadline = Instant::now() + READY_TIMEOUT;
        while !runtime.block_on(probe(upstream, Mode::Http1)) {
            if spawned.exited().is_some() || Instant::now() > deadline {
                anyhow::bail!("the upstream did not start: {}", spawned.log_tail(5));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Bench {
            tools,
            settings,
            registry,
            work_dir,
            upstream,
            runtime,
            starts: AtomicUsize::new(0),
            _upstream: spawned,
        })
    }

    /// Runs a future on the harness's load-generating runtime.
    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Starts `proxy` doing `mode` in front of `upstream` and waits until a request through it
    /// is answered. `Err` says why it cannot run (not installed, not in this build, failed).
    pub fn start(
        &self,
        proxy: Proxy,
        mode: Mode,
        upstream: SocketAddr,
    ) -> Result<Contender, String> {
        self.start_with(proxy, mode, upstream, Ready::Answers)
    }

    /// [`Bench::start`] with a choice of readiness check.
    pub fn start_with(
        &self,
        proxy: Proxy,
        mode: Mode,
        upstream: SocketAddr,
        ready: Ready,
    ) -> Result<Contender, String> {
        if proxy == Proxy::NoProxy {
            return Ok(Contender {
                proxy,
                addr: upstream,
                startup: None,
                process: None,
            });
        }
        let mode = if proxy == Proxy::RemoraTcp {
            Mode::Tcp
        } else {
            mode
        };
        let started = Instant::now();
        let launched = self
            .launch(proxy, mode, upstream)
            .map_err(|e| format!("{e:#}"))?;
        self.wait_ready(proxy, mode, ready, started, launched)
    }

    /// Waits until a contender just launched is ready.
    fn wait_ready(
        &self,
        proxy: Proxy,
        mode: Mode,
        ready: Ready,
        started: Instant,
        (mut spawned, addr): (Spawned, SocketAddr),
    ) -> Result<Contender, String> {
        let deadline = started + READY_TIMEOUT;
        loop {
            let up = match ready {
                Ready::Answers => self.block_on(probe(addr, mode)),
                Ready::Listens => process::is_listening(addr.port()),
            };
            if up {
                let startup = started.elapsed();
                return Ok(Contender {
                    proxy,
                    addr,
                    startup: Some(startup),
                    process: Some(spawned),
                });
            }
            if let Some(status) = spawned.exited() {
                return Err(format!(
                    "exited ({status}) before answering: {}",
                    one_line(&spawned.log_tail(3))
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "did not answer within {READY_TIMEOUT:?}: {}",
                    one_line(&spawned.log_tail(3))
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Writes `proxy`'s config for `mode` and spawns it on the proxy core.
    fn launch(
        &self,
        proxy: Proxy,
        mode: Mode,
        upstream: SocketAddr,
    ) -> anyhow::Result<(Spawned, SocketAddr)> {
        let missing =
            |what: &str| anyhow::anyhow!("{what} not found (scripts/bench-deps installs it)");
        let dir = self
            .work_dir
            .join(format!("{}-{}", proxy.name(), mode_name(mode)));
        fs::create_dir_all(&dir)?;
        let ports = process::free_ports(5)?;
        let listen: SocketAddr = format!("127.0.0.1:{}", ports[0]).parse()?;
        let (program, args) = match proxy {
            Proxy::NoProxy => anyhow::bail!("no proxy has nothing to launch"),
            // Mode does not matter to it: it relays bytes whatever they are.
            Proxy::Floor => (
                self.tools.harness.clone(),
                vec![
                    "floor".to_string(),
                    "--listen".into(),
                    listen.to_string(),
                    "--upstream".into(),
                    upstream.to_string(),
                ],
            ),
            Proxy::RemoraXds => {
                let program = self.tools.remora.clone().ok_or_else(|| {
                    missing("target/release/remora (cargo build --release -p remora)")
                })?;
                let resources = dir.join("xds");
                fs::create_dir_all(&resources)?;
                crate::xds_scale::write_remora_dir(
                    &resources,
                    &config::xds::resources(mode, upstream),
                )?;
                let file = dir.join("remora.yaml");
                let side = RemoraPorts {
                    readiness: ports[1],
                    metrics: ports[2],
                    agent: ports[3],
                    admin: ports[4],
                };
                fs::write(&file, config::remora_xds_config(&side, &resources))?;
                let log_level = std::env::var("REMORA_LOG").unwrap_or_else(|_| "warn".into());
                (
                    program,
                    config::remora_xds_args(&file, listen, upstream, &log_level),
                )
            }
            Proxy::Remora | Proxy::RemoraTcp => {
                let program = self.tools.remora.clone().ok_or_else(|| {
                    missing("target/release/remora (cargo build --release -p remora)")
                })?;
                if mode != Mode::Tcp && !self.tools.remora_http {
                    anyhow::bail!("HTTP mode not available in this build (`remora run --protocol http` is not offered)");
                }
                let file = dir.join("remora.yaml");
                let side = RemoraPorts {
                    readiness: ports[1],
                    metrics: ports[2],
                    agent: ports[3],
                    admin: ports[4],
                };
                fs::write(&file, config::remora_config(&side))?;
                // REMORA_LOG (as for `remora run` itself) turns up its logging when debugging a run.
                let log_level = std::env::var("REMORA_LOG").unwrap_or_else(|_| "warn".into());
                (
                    program,
                    config::remora_args(&file, listen, upstream, mode, &log_level),
                )
            }
            Proxy::Envoy => {
                let program = self.tools.envoy.clone().ok_or_else(|| missing("envoy"))?;
                let file = dir.join("envoy.yaml");
                fs::write(
                    &file,
                    config::envoy_config(mode, listen, upstream, ports[1]),
                )?;
                (program, config::envoy_args(&file))
            }
            Proxy::Haproxy => {
                let program = self
                    .tools
                    .haproxy
                    .clone()
                    .ok_or_else(|| missing("haproxy"))?;
                let file = dir.join("haproxy.cfg");
                let maxconn = (self.settings.idle_connections + 200) as u32;
                fs::write(
                    &file,
                    config::haproxy_config(mode, listen, upstream, maxconn),
                )?;
                (program, config::haproxy_args(&file))
            }
            Proxy::Nginx => {
                let program = self.tools.nginx.clone().ok_or_else(|| missing("nginx"))?;
                if mode == Mode::Tcp && self.tools.nginx_stream_module.is_none() {
                    anyhow::bail!("nginx's stream module not found (Debian: libnginx-mod-stream)");
                }
                let file = dir.join("nginx.conf");
                let limits = NginxLimits {
                    rlimit_nofile: self.settings.nofile,
                    worker_connections: self.settings.nofile.saturating_sub(100),
                };
                let module = self.tools.nginx_stream_module.as_deref();
                fs::write(
                    &file,
                    config::nginx_config(mode, listen, upstream, &dir, limits, module),
                )?;
                (program, config::nginx_args(&dir, &file))
            }
        };
        let cpu = self.settings.pin.then_some(PROXY_CPU);
        let log = dir.join(format!(
            "output-{}.log",
            self.starts.fetch_add(1, Ordering::Relaxed)
        ));
        let spawned = process::spawn(&self.registry, proxy.name(), cpu, &program, &args, &log)?;
        Ok((spawned, listen))
    }

    /// Runs an external load tool on the load core for at most `limit`, returning its output.
    pub fn run_tool(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        limit: Duration,
    ) -> Result<String, String> {
        let log = self.work_dir.join(format!("{name}.log"));
        let cpu = self.settings.pin.then_some(LOAD_CPU);
        let spawned = process::spawn(&self.registry, name, cpu, program, args, &log)
            .map_err(|e| format!("{e:#}"))?;
        let status = spawned.wait_bounded(limit).map_err(|e| e.to_string());
        let output = fs::read_to_string(&log).unwrap_or_default();
        match status {
            Ok(_) => Ok(output),
            Err(e) => Err(format!("{e}: {}", one_line(&output))),
        }
    }
}

/// The name of a mode in directory names and notes.
pub fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Http1 => "http1",
        Mode::Grpc => "grpc",
        Mode::H2c => "h2c",
        Mode::Tcp => "tcp",
    }
}

/// Whether one request through `addr` is answered: HTTP/1.1 (also through TCP proxies), for
/// gRPC a unary call over h2c, for h2c a GET of the 1 KiB body.
pub async fn probe(addr: SocketAddr, mode: Mode) -> bool {
    let call = async {
        match mode {
            Mode::Http1 | Mode::Tcp => crate::tcp_load::close_exchange(addr).await.is_ok(),
            Mode::Grpc => grpc_call(addr).await.unwrap_or(false),
            Mode::H2c => h2c_get(addr).await.unwrap_or(false),
        }
    };
    tokio::time::timeout(PROBE_TIMEOUT, call)
        .await
        .unwrap_or(false)
}

/// The body of every gRPC request: one 100-byte message.
pub fn grpc_request_body() -> Bytes {
    grpc_frame(&[b'q'; 100])
}

async fn grpc_call(addr: SocketAddr) -> anyhow::Result<bool> {
    let mut sender = h2c_sender(addr).await?;
    let request = http::Request::post(format!("http://{addr}/bench.Bench/Unary"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(Full::new(grpc_request_body()))?;
    let response = sender.send_request(request).await?;
    let status_ok = response.status() == http::StatusCode::OK;
    let body = response.into_body().collect().await?;
    let grpc_ok = body
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .is_some_and(|v| v == "0");
    Ok(status_ok && grpc_ok)
}

/// One GET over h2c with prior knowledge: answered 200 with the upstream's 1 KiB body.
async fn h2c_get(addr: SocketAddr) -> anyhow::Result<bool> {
    let mut sender = h2c_sender(addr).await?;
    let request = http::Request::get(format!("http://{addr}/")).body(Full::new(Bytes::new()))?;
    let response = sender.send_request(request).await?;
    let status_ok = response.status() == http::StatusCode::OK;
    let body = response.into_body().collect().await?.to_bytes();
    Ok(status_ok && body.len() == crate::upstream::BODY_SIZE)
}

async fn h2c_sender(
    addr: SocketAddr,
) -> anyhow::Result<hyper::client::conn::http2::SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// The last lines of a log, on one line for a table cell.
fn one_line(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let joined = joined.replace('|', "/");
    if joined.chars().count() > 200 {
        let tail: String = joined
            .chars()
            .rev()
            .take(200)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!("…{tail}")
    } else {
        joined
    }
}

/// Median of a few durations.
pub fn median(mut samples: Vec<Duration>) -> Option<Duration> {
    samples.sort();
    samples.get(samples.len() / 2).copied()
}

/// Proxy CPU milliseconds per 1000 requests.
pub fn cpu_ms_per_1000(cpu_seconds: f64, requests: u64) -> f64 {
    cpu_seconds * 1000.0 * 1000.0 / requests.max(1) as f64
}

/// A duration for notes: "0.5 s", "20 s".
pub fn seconds(d: Duration) -> String {
    format!("{} s", (d.as_secs_f64() * 10.0).round() / 10.0)
}

/// KiB to MiB.
pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_fit_the_descriptor_limit() {
        let all = Proxy::ALL.to_vec();
        let roomy = Settings::new(false, all.clone(), true, 1 << 20);
        assert_eq!(roomy.idle_connections, 10_000);
        assert!(roomy.idle_connections_note.is_none());
        let tight = Settings::new(false, all.clone(), true, 20_000);
        assert_eq!(tight.idle_connections, 9_500);
        assert!(tight
            .idle_connections_note
            .unwrap()
            .contains("RLIMIT_NOFILE is 20000"));
        let quick = Settings::new(true, all, true, 20_000);
        assert_eq!(quick.idle_connections, 1_000);
        assert!(
            quick.run <= Duration::from_secs(3) && quick.latency_round <= Duration::from_secs(3)
        );
        assert!(quick.rounds >= 2, "a spread needs two rounds at least");
        // The reporting rule: medians of at least five interleaved repeats; and at
        // least 20 s at 1000 rps, in those rounds.
        assert!(roomy.rounds >= 5);
        assert!(roomy.latency_round * roomy.rounds as u32 >= Duration::from_secs(20));
        // A scenario runs the reference rows it names and no other; the others always.
        let none = roomy.contenders(&[]);
        assert!(!none.contains(&Proxy::RemoraTcp) && !none.contains(&Proxy::Floor));
        assert!(none.contains(&Proxy::Remora) && none.contains(&Proxy::Haproxy));
        let floor_only = roomy.contenders(&[Proxy::Floor]);
        assert!(floor_only.contains(&Proxy::Floor) && !floor_only.contains(&Proxy::RemoraTcp));
        assert_eq!(roomy.contenders(&REFERENCES), Proxy::ALL.to_vec());
    }

    #[test]
    fn medians_and_cells() {
        let ms = Duration::from_millis;
        assert_eq!(median(vec![ms(30), ms(10), ms(20)]), Some(ms(20)));
        assert_eq!(median(vec![]), None);
        assert_eq!(one_line("a |\n b"), "a / b");
        assert_eq!(cpu_ms_per_1000(2.0, 20_000), 100.0);
        assert_eq!(seconds(Duration::from_millis(500)), "0.5 s");
        assert_eq!(seconds(Duration::from_secs(20)), "20 s");
    }
}
