//! Config scale (`harness config-scale`): the question of what a mesh of N services
//! costs a sidecar that is sent all of it. For each N, istiod-shaped resources
//! ([`crate::xds_scale`]) go to Remora (`xds.resources_dir`) and to Envoy (LDS and CDS from
//! files, RDS and SDS from files they name), each alone on the proxy core with one worker, and
//! the harness measures, per proxy:
//!
//! - the time from spawn until the whole config is in force (Remora: `/healthz/ready`, which
//!   answers only after the resource files are applied; Envoy: `/ready`, LIVE only once CDS,
//!   the clusters' secrets, LDS and RDS are all initialised), and the CPU used until then
//!   (utime+stime, so start-up is in it: the same for both);
//! - resident memory after 3 s of settling, and the CPU used in those 3 s (Remora polls its
//!   directory: that cost grows with N and is not zero);
//! - one endpoint change (service 0's first pod moves): the time from the file being renamed
//!   into place until the proxy logs that it applied it, and the CPU used meanwhile. Remora
//!   watches its directory by polling every `xds.watch_interval` (1 s, its default), so its
//!   time includes up to one interval of waiting; Envoy's file watch is inotify.
//!
//! Each proxy's log says what it loaded; a refusal or a count short of what was written is
//! printed in the row's note, never hidden. Each proxy's run is in `proxies.rs`.

mod proxies;

use crate::process::{self, Registry, Spawned, Usage, PROXY_CPU};
use crate::proxy_config::envoy_args_with;
use crate::report::{Column, Figure, Table};
use crate::xds_scale::{self, discovery_response, Resources, Service, Sources};
use anyhow::Context;
use serde_json::Value;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a proxy may take to apply the full config.
const APPLY_TIMEOUT: Duration = Duration::from_secs(600);
/// How long an endpoint change may take to apply.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(120);
/// Settling after the config is applied, before memory is read.
const SETTLE: Duration = Duration::from_secs(3);
/// How often readiness and logs are polled: fine enough for start-ups of tens of ms.
const POLL: Duration = Duration::from_millis(5);
/// Remora's polling interval for the resource directory (its default, written explicitly).
const REMORA_WATCH: &str = "1s";

/// What Remora logs once the files are applied at start, and after each change.
const REMORA_LOADED: &str = "xDS resources loaded from files";
const REMORA_REAPPLIED: &str = "xDS resources re-applied from files";
/// What Envoy logs (at info) after each CDS update it applied.
const ENVOY_CDS_APPLIED: &str = "cds: added/updated";

/// `harness config-scale`'s flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Service counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub services: Vec<usize>,
    /// Rounds per count and proxy (each a fresh start); figures are their medians.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// The Remora binary (default: target/release/remora).
    #[arg(long, value_name = "PATH")]
    pub remora: Option<PathBuf>,
    /// The Envoy binary (default: $ENVOY, then what scripts/bench-deps installed, then PATH).
    #[arg(long, value_name = "PATH", env = "ENVOY")]
    pub envoy: Option<PathBuf>,
    /// Where the report goes (default: target/bench-results).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// The scenario from the command line: `found_envoy` is where the harness found Envoy, `pin`
/// whether cores 0 and 1 are both ours.
pub fn main(
    args: Args,
    found_envoy: Option<PathBuf>,
    pin: bool,
    registry: &Registry,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.services.iter().all(|&n| n >= 1),
        "--services: every count must be at least 1 (the endpoint change moves service 0's pod)"
    );
    let exe = std::env::current_exe().context("locating the harness binary")?;
    let target = exe.parent().and_then(Path::parent).map(Path::to_path_buf);
    let target = target.unwrap_or_else(|| PathBuf::from("target"));
    if pin {
        // The proxy alone on its core; the harness's polling on the other.
        process::pin_self(process::LOAD_CPU)?;
    }
    let setup = Setup {
        remora: args
            .remora
            .or_else(|| Some(target.join("release/remora")).filter(|p| p.is_file())),
        envoy: args.envoy.or(found_envoy),
        work_dir: target.join("bench-results").join("work"),
        pin,
        rounds: args.rounds,
    };
    let tables = run(&setup, registry, &args.services);
    let command = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let out = args.out.unwrap_or_else(|| target.join("bench-results"));
    let path = write_report(&tables, &setup, &format!("harness {command}"), &out)?;
    println!("results: {}", path.display());
    Ok(())
}

/// The programs and where to work.
#[derive(Debug, Clone)]
pub struct Setup {
    pub remora: Option<PathBuf>,
    pub envoy: Option<PathBuf>,
    pub work_dir: PathBuf,
    pub pin: bool,
    pub rounds: usize,
}

/// One proxy's figures for one N, one round.
#[derive(Debug, Clone, Default)]
struct Measured {
    applied_s: f64,
    apply_cpu_s: f64,
    rss_mib: f64,
    idle_cpu_percent: f64,
    change_ms: Option<f64>,
    change_cpu_ms: Option<f64>,
    /// The most resident memory the process had at any moment, read at the round's end.
    peak_rss_mib: Option<f64>,
    /// What the proxy says it loaded.
    loaded: String,
}

/// The tables, one per N.
pub fn run(setup: &Setup, registry: &Registry, services: &[usize]) -> Vec<Table> {
    services
        .iter()
        .map(|&n| {
            let started = Instant::now();
            let t = table_for(setup, registry, n);
            eprintln!(
                "harness: config-scale {n} services took {:.0} s",
                started.elapsed().as_secs_f64()
            );
            t
        })
        .collect()
}

fn columns() -> Vec<Column> {
    vec![
        Column::new("config applied", "s", 3).with_peer_ratios(),
        Column::new("CPU to apply", "s", 3).with_peer_ratios(),
        Column::new("RSS", "MiB", 1).with_peer_ratios(),
        Column::new("idle CPU", "%", 2).with_peer_ratios(),
        Column::new("endpoint change applied", "ms", 0).with_peer_ratios(),
        Column::new("CPU for the change", "ms", 1).with_peer_ratios(),
        Column::new("peak RSS", "MiB", 1).with_peer_ratios(),
    ]
}

fn table_for(setup: &Setup, registry: &Registry, n: usize) -> Table {
    let http = (0..n).filter(|&i| Service::new(i).http).count();
    let mut table = Table::new(
        &format!("config-scale-{n}"),
        &format!(
            "Config scale: {n} services ({http} HTTP on :8080, {} TCP with VIP listeners)",
            n - http
        ),
        columns(),
    );
    let contenders: [(&str, &Option<PathBuf>, Runner); 2] = [
        ("remora", &setup.remora, proxies::remora_round),
        ("envoy", &setup.envoy, proxies::envoy_round),
    ];
    for (name, program, runner) in contenders {
        let Some(program) = program else {
            table.push_missing(name, "not found".into());
            continue;
        };
        let mut rounds: Vec<Measured> = vec![];
        let mut failure = None;
        for round in 0..setup.rounds.max(1) {
            let dir = setup.work_dir.join(format!("config-scale/{n}/{name}"));
            match runner(program, &dir, registry, n, setup.pin) {
                Ok(m) => rounds.push(m),
                Err(e) => {
                    eprintln!(
                        "harness: config-scale {n} {name} round {}: {e:#}",
                        round + 1
                    );
                    failure = Some(format!("{e:#}"));
                }
            }
        }
        if rounds.is_empty() {
            // One line: a table cell.
            let why = failure.unwrap_or_default().replace('|', "/");
            table.push_missing(
                name,
                why.lines().map(str::trim).collect::<Vec<_>>().join(" / "),
            );
            continue;
        }
        let fig = |f: fn(&Measured) -> Option<f64>| {
            Figure::of(
                &rounds
                    .iter()
                    .map(|m| f(m).unwrap_or(f64::NAN))
                    .collect::<Vec<_>>(),
            )
        };
        let values = vec![
            fig(|m| Some(m.applied_s)),
            fig(|m| Some(m.apply_cpu_s)),
            fig(|m| Some(m.rss_mib)),
            fig(|m| Some(m.idle_cpu_percent)),
            fig(|m| m.change_ms),
            fig(|m| m.change_cpu_ms),
            fig(|m| m.peak_rss_mib),
        ];
        let mut note = rounds[0].loaded.clone();
        if let Some(f) = failure {
            note.push_str(&format!(
                "; a round failed: {}",
                f.lines().next().unwrap_or_default()
            ));
        }
        table.push(name, values, Some(note));
    }
    table.notes.push(format!(
        "Remora reads xds.resources_dir (polled every {REMORA_WATCH}, its default); Envoy 1.40 reads LDS and CDS from files (path_config_source, inotify), RDS and SDS from files they name; clusters are EDS for Remora and STATIC with the same endpoints inline for Envoy (see docs/benchmarks.md)"
    ));
    table.notes.push("config applied and CPU to apply count from spawn (start-up included); RSS after 3 s of settling; idle CPU over those 3 s; the endpoint change moves one pod of service 0 and is timed from the file's rename until the proxy logs the update applied; peak RSS is VmHWM at the end (load and change included)".into());
    table
}

type Runner = fn(&Path, &Path, &Registry, usize, bool) -> anyhow::Result<Measured>;

/// Writes `value` to `path` by renaming a complete temporary file over it, as Kubernetes
/// updates a mounted ConfigMap: neither proxy can read a half-written file, and Envoy's
/// inotify watch fires on the rename.
fn write_atomically(path: &Path, value: &Value) -> anyhow::Result<()> {
    let tmp = stage(path, value)?;
    fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

/// The temporary file of [`write_atomically`], written but not yet renamed: a change is timed
/// from the rename, not from the harness serialising the JSON.
fn stage(path: &Path, value: &Value) -> anyhow::Result<PathBuf> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, serde_json::to_vec(value)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    Ok(tmp)
}

fn fresh_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// Memory and idle CPU after settling.
fn settle(proxy: &Spawned, applied: Duration, at_ready: &Usage) -> Measured {
    std::thread::sleep(SETTLE);
    let after = proxy.usage();
    Measured {
        applied_s: applied.as_secs_f64(),
        apply_cpu_s: cpu_from_start(at_ready),
        rss_mib: after.rss_kib as f64 / 1024.0,
        idle_cpu_percent: after.cpu_seconds_since(at_ready) / SETTLE.as_secs_f64() * 100.0,
        ..Measured::default()
    }
}

/// `VmHWM` of `pid` in MiB: its peak resident memory so far (parsing a 40 MB config can need
/// more than holding it, and a sidecar's memory limit is against the peak).
fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// CPU used since the process started: the threads' nanosecond counters where they add up to
/// more than `stat`'s 10 ms ticks (those truncate), the ticks otherwise (a thread that ended,
/// such as a loader, keeps its ticks in the process's `stat` but takes its counters with it).
fn cpu_from_start(u: &Usage) -> f64 {
    let ticks = u.cpu_ticks as f64 / process::TICKS_PER_SECOND as f64;
    let threads = u.threads.iter().map(|t| t.on_cpu_ns).sum::<u64>() as f64 / 1e9;
    ticks.max(threads)
}

/// Polls `done` every [`POLL`] until it holds; fails if the proxy exits or `limit` passes.
fn wait_until(
    proxy: &mut Spawned,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return Ok(());
        }
        if let Some(status) = proxy.exited() {
            anyhow::bail!("exited ({status}); its log ends:\n{}", proxy.log_tail(15));
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "not within {limit:?}; its log ends:\n{}",
                proxy.log_tail(15)
            );
        }
        std::thread::sleep(POLL);
    }
}

/// The lines of `log` containing `needle`.
fn log_lines(log: &Path, needle: &str) -> Vec<String> {
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

/// A log line cut to a table cell's length.
fn brief(line: &str) -> String {
    line.chars().take(200).collect::<String>().replace('|', "/")
}

/// One GET to 127.0.0.1:`port`; the status and body, or `None` if it did not answer.
pub(crate) fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Some((status, body))
}

fn http_status(port: u16, path: &str) -> Option<u16> {
    get(port, path).map(|(s, _)| s)
}

fn http_body(port: u16, path: &str) -> Option<String> {
    get(port, path).map(|(_, b)| b)
}

/// Prints the tables and writes them, with the command and the programs' versions, to
/// `out/config-scale-<time>.{md,json}`; returns the markdown file's path.
pub fn write_report(
    tables: &[Table],
    setup: &Setup,
    command: &str,
    out: &Path,
) -> anyhow::Result<PathBuf> {
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let version = |p: &Option<PathBuf>| {
        p.as_ref()
            .and_then(|p| std::process::Command::new(p).arg("--version").output().ok())
            .map(|o| {
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
                text.lines()
                    .map(str::trim)
                    .find(|l| !l.is_empty())
                    .unwrap_or_default()
                    .to_string()
            })
            .unwrap_or_else(|| "not found".into())
    };
    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut md = format!(
        "# Config scale, {started}\n\n`{command}`\n\n- remora: {}\n- envoy: {}\n- load average at the end: {}\n- {}\n\n",
        version(&setup.remora),
        version(&setup.envoy),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        if setup.pin { "each proxy pinned to core 0 (all its threads), the harness on core 1" } else { "nothing pinned" }
    );
    for t in tables {
        md.push_str(&t.markdown());
        md.push('\n');
    }
    let json = serde_json::json!({
        "started": started, "command": command,
        "versions": {"remora": version(&setup.remora), "envoy": version(&setup.envoy)},
        "tables": tables.iter().map(Table::json).collect::<Vec<_>>()
    });
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let stamp = started.replace([':', '-'], "");
    let path = out.join(format!("config-scale-{stamp}.md"));
    fs::write(&path, &md)?;
    fs::write(
        out.join(format!("config-scale-{stamp}.json")),
        serde_json::to_string_pretty(&json)?,
    )?;
    print!("{md}");
    Ok(path)
}
