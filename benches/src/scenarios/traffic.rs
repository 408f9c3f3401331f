//! Traffic management on the path (issue #32's performance target): HTTP/1.1 through a
//! VirtualService's 90/10 split over two subset clusters, Istio's default retry policy on the
//! route and a DestinationRule's outlier detection on both clusters
//! ([`crate::proxy_config::traffic`]). Remora routed by xDS and Envoy get the same resources;
//! HAProxy (its plain HTTP configuration, one backend) is the rps-per-core reference the issue
//! names, no proxy the physical limit, and the floor (a bare byte relay) what the machine
//! charges any proxy at 1000 rps, where the CPU bound of the issue is read.
//!
//! Per round and contender: max throughput with wrk (64 keep-alive connections, as scenario 2)
//! and, with a fresh proxy, CPU per request at 1000 rps (16 connections, as scenarios 1 and 4).
//! Where the contender has Envoy's cluster statistics (Remora and Envoy both print them on
//! `/stats`), the share of requests the `v2` subset received is read after the wrk run: the
//! split was really on the path.

use super::measure::{core_columns, CORES_NOTE};
use super::throughput::{rounds_note, TOOL_GRACE};
use super::{
    cpu_ms_per_1000, interleaved, latency, push_rows, Bench, Contender, Ready, FLOOR_NOTE,
};
use crate::load_tools;
use crate::open_loop::{self, Plan};
use crate::process::{self, Spawned, PROXY_CPU};
use crate::proxy_config::{self as config, traffic, Mode, Proxy, RemoraPorts};
use crate::report::{Column, Table};
use crate::xds_scale::Resources;
use std::fs;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Instant;

const CONNECTIONS: usize = 64;

/// The contenders this scenario runs, of those asked for.
const CONTENDERS: [Proxy; 5] = [
    Proxy::NoProxy,
    Proxy::RemoraXds,
    Proxy::Envoy,
    Proxy::Haproxy,
    Proxy::Floor,
];

fn columns() -> Vec<Column> {
    let mut c = vec![
        Column::new("req/s", "", 0).with_ratios(),
        Column::new("req/s per proxy core", "", 0).with_peer_ratios(),
        Column::new("proxy CPU / 1000 req at max", "ms", 1).with_peer_ratios(),
        Column::new("CPU / 1000 req at 1000 rps", "ms", 1).with_peer_ratios(),
        Column::new("p99 at 1000 rps", "µs", 0),
        Column::new("v2 share", "%", 1),
        Column::new("errors", "", 0),
    ];
    c.extend(core_columns());
    c
}

/// Runs the scenario: one table.
pub fn run(bench: &Bench) -> Table {
    let run = bench.settings.round;
    let contenders: Vec<Proxy> = bench
        .settings
        .contenders(&[Proxy::RemoraXds, Proxy::Floor])
        .into_iter()
        .filter(|p| CONTENDERS.contains(p))
        .collect();
    let mut table = Table::new(
        "traffic-http1",
        "6. Traffic management on the path: HTTP/1.1, weighted route 90/10, Istio's retry policy, outlier detection",
        columns(),
    );
    table.notes.push(format!(
        "remora-xds and envoy hold the same istiod-shaped resources (src/proxy_config/traffic.rs): one route splitting 90/10 over the v1 and v2 subset clusters with Istio's default retry policy, outlier detection (consecutive 5xx) on both; both subsets' endpoint is the upstream. haproxy: its plain HTTP configuration (one backend), the rps-per-core reference. Max throughput: wrk -t1 -c{CONNECTIONS} -d{}s; then a fresh proxy at 1000 rps over 16 connections for {} (CPU per request).",
        run.as_secs(),
        super::seconds(bench.settings.run)
    ));
    table.notes.push("v2 share: upstream_rq_total of the v2 cluster ÷ both clusters', from the proxy's /stats after the wrk run (expected about 10%).".into());
    table.notes.push(rounds_note(bench));
    if contenders.contains(&Proxy::Floor) {
        table.notes.push(FLOOR_NOTE.into());
    }
    table.notes.push(CORES_NOTE.into());
    let resources = traffic::resources(bench.upstream);
    let results = interleaved(
        "traffic http/1.1",
        &contenders,
        bench.settings.rounds,
        |proxy| one_round(bench, proxy, &resources),
    );
    push_rows(&mut table, results, |name, median| {
        format!(
            "  {name}: {:.0} req/s, {:.0} req/s per core, {:.1} ms CPU / 1000 req at 1000 rps",
            median(0),
            median(1),
            median(3)
        )
    });
    table
}

fn one_round(bench: &Bench, proxy: Proxy, r: &Resources) -> Result<Vec<Option<f64>>, String> {
    let run = bench.settings.round;
    let wrk = bench
        .tools
        .wrk
        .clone()
        .ok_or("wrk not found (scripts/bench-deps installs it)")?;
    let (contender, admin) = bench.start_routed(proxy, r)?;
    let (load, cost) = bench.measure(&contender, || {
        let args = load_tools::wrk_args(contender.addr, CONNECTIONS, run);
        let out = bench.run_tool("wrk", &wrk, &args, run + TOOL_GRACE)?;
        load_tools::parse_wrk(&out).ok_or_else(|| format!("wrk printed no report: {}", out.trim()))
    });
    let load = load?;
    let v2_share = admin.and_then(|port| v2_share(port, bench.upstream.port()));
    drop(contender);

    let plan = Plan {
        rate: latency::RATE,
        connections: latency::CONNECTIONS,
        warmup: bench.settings.warmup,
        duration: bench.settings.run,
    };
    let (contender, _) = bench.start_routed(proxy, r)?;
    let (steady, steady_cost) = bench.measure_after(&contender, plan.warmup, || {
        bench.block_on(open_loop::run(contender.addr, plan))
    });
    let steady = steady.map_err(|e| format!("1000 rps: {e:#}"))?;
    let per_core = cost
        .proxy_cores()
        .filter(|cores| *cores > 0.0)
        .map(|cores| load.requests_per_second / cores);
    let mut values = vec![
        Some(load.requests_per_second),
        per_core,
        cost.cpu_seconds
            .map(|c| cpu_ms_per_1000(c, load.requests + load.errors)),
        steady_cost
            .cpu_seconds
            .map(|c| cpu_ms_per_1000(c, steady.requests)),
        Some(steady.latency_ns.value_at_quantile(0.99) as f64 / 1000.0),
        v2_share,
        Some((load.errors + steady.errors) as f64),
    ];
    values.extend(cost.core_figures());
    Ok(values)
}

/// The v2 subset's share of the requests (%) by the admin's `/stats` on `admin_port`.
fn v2_share(admin_port: u16, service_port: u16) -> Option<f64> {
    let (_, body) = super::config_scale::get(admin_port, "/stats")?;
    let total = |subset: &str| -> Option<f64> {
        let name = format!(
            "cluster.{}.upstream_rq_total: ",
            traffic::subset_cluster(service_port, subset)
        );
        body.lines()
            .find_map(|l| l.strip_prefix(name.as_str()))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let (v1, v2) = (total("v1")?, total("v2")?);
    (v1 + v2 > 0.0).then(|| 100.0 * v2 / (v1 + v2))
}

impl Bench {
    /// Starts `proxy` for HTTP/1.1 routed by the xDS resources `r` (Remora routed by xDS and
    /// Envoy, the same resources for both), with its admin port; any other contender as
    /// [`Bench::start`] starts it (no admin port).
    pub fn start_routed(
        &self,
        proxy: Proxy,
        r: &Resources,
    ) -> Result<(Contender, Option<u16>), String> {
        if !matches!(proxy, Proxy::RemoraXds | Proxy::Envoy) {
            return Ok((self.start(proxy, Mode::Http1, self.upstream)?, None));
        }
        let started = Instant::now();
        let (spawned, listen, admin) =
            self.launch_routed(proxy, r).map_err(|e| format!("{e:#}"))?;
        let c = self.wait_ready(
            proxy,
            Mode::Http1,
            Ready::Answers,
            started,
            (spawned, listen),
        )?;
        Ok((c, Some(admin)))
    }

    /// Writes the config of Remora routed by xDS, or of Envoy, holding `r`, and spawns it on
    /// the proxy core: the process, where clients connect, its admin port.
    fn launch_routed(
        &self,
        proxy: Proxy,
        r: &Resources,
    ) -> anyhow::Result<(Spawned, SocketAddr, u16)> {
        let dir = self.work_dir.join(format!("{}-traffic", proxy.name()));
        fs::create_dir_all(&dir)?;
        let ports = process::free_ports(5)?;
        let listen: SocketAddr = format!("127.0.0.1:{}", ports[0]).parse()?;
        let (program, args, admin) = match proxy {
            Proxy::RemoraXds => {
                let program = self.tools.remora.clone().ok_or_else(|| {
                    anyhow::anyhow!(
                        "target/release/remora not found (cargo build --release -p remora)"
                    )
                })?;
                let resources = dir.join("xds");
                fs::create_dir_all(&resources)?;
                crate::xds_scale::write_remora_dir(&resources, r)?;
                let file = dir.join("remora.yaml");
                let side = RemoraPorts {
                    readiness: ports[1],
                    metrics: ports[2],
                    agent: ports[3],
                    admin: ports[4],
                };
                fs::write(&file, config::remora_xds_config(&side, &resources))?;
                let log_level = std::env::var("REMORA_LOG").unwrap_or_else(|_| "warn".into());
                let args = config::remora_xds_args(&file, listen, self.upstream, &log_level);
                (program, args, ports[4])
            }
            Proxy::Envoy => {
                let program = self.tools.envoy.clone().ok_or_else(|| {
                    anyhow::anyhow!("envoy not found (scripts/bench-deps installs it)")
                })?;
                let bootstrap = traffic::envoy_bootstrap(r, &dir, listen, ports[1])?;
                let file = dir.join("envoy.json");
                fs::write(&file, serde_json::to_vec_pretty(&bootstrap)?)?;
                (program, config::envoy_args(&file), ports[1])
            }
            other => anyhow::bail!("{} is not routed by xDS", other.name()),
        };
        let cpu = self.settings.pin.then_some(PROXY_CPU);
        let log = dir.join(format!(
            "output-{}.log",
            self.starts.fetch_add(1, Ordering::Relaxed)
        ));
        let spawned = process::spawn(&self.registry, proxy.name(), cpu, &program, &args, &log)?;
        Ok((spawned, listen, admin))
    }
}
