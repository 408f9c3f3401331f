//! Scenario 5: two sidecars back to back over mTLS, as Istio's published benchmark runs them
//! (2 workers each): client → sidecar A (plain HTTP in, mTLS out) → sidecar B (mTLS in, plain
//! HTTP out) → upstream, all on loopback with explicit listeners. Istio's load (HTTP/1.1, 1 KiB,
//! 16 connections, 1000 rps open loop); latency percentiles and the CPU of both sidecars
//! together per 1000 requests.

use super::{cpu_ms_per_1000, interleaved, mib, probe, seconds, Bench, READY_TIMEOUT};
use crate::mesh_certs::{self, MeshCerts};
use crate::open_loop::{self, Outcome, Plan};
use crate::process::{self, Spawned, Usage, PROXY_CPU};
use crate::proxy_config::{self as config, Mode, Proxy, RemoraPorts, MESH_WORKERS};
use crate::report::{Column, Table};
use std::fs;
use std::net::SocketAddr;
use std::time::Instant;

/// Why Remora has no row yet (checked against proxy/src/proxy/mesh.rs).
pub const REMORA_NOT_EXPRESSIBLE: &str = "not expressible with explicit listeners yet: mesh mTLS is only originated on the outbound capture listener (15001, destination from SO_ORIGINAL_DST) and only terminated on the inbound capture listener (15006); `mesh::leg` returns None for explicit listeners (Route::Fixed), and a config with `listeners` does not bind the capture listeners, which need iptables (root) to learn a destination";

/// Runs the scenario: no proxy, the Remora pair (when expressible) and the Envoy pair.
pub fn run(bench: &Bench) -> Table {
    let s = &bench.settings;
    let plan = Plan {
        rate: super::latency::RATE,
        connections: super::latency::CONNECTIONS,
        warmup: s.warmup,
        duration: s.latency_round,
    };
    let mut table = Table::new(
        "mtls",
        "5. mTLS: two sidecars back to back (plain HTTP → A → mTLS → B → upstream), 2 workers each; HTTP/1.1, 1 KiB, 16 connections, 1000 rps open loop",
        vec![
            Column::new("p50", "µs", 0).with_ratios(),
            Column::new("p90", "µs", 0),
            Column::new("p99", "µs", 0).with_ratios(),
            Column::new("p99.9", "µs", 0),
            Column::new("added p50", "µs", 0),
            Column::new("added p99", "µs", 0),
            Column::new("rps", "", 0),
            Column::new("errors", "", 0),
            Column::new("both sidecars' CPU / 1000 req", "ms", 1).with_envoy_ratio(),
            Column::new("both sidecars' RSS", "MiB", 1),
        ],
    );
    table.notes.push(format!(
        "Each row is a pair of sidecars with {MESH_WORKERS} workers each, both pinned to the proxy core (the generator and upstream on the other). mTLS between them with rcgen-generated SPIFFE certificates ({} → {}) in Istio's file layout; A checks B's SPIFFE ID, B requires a client certificate from the mesh root. {} round(s) of {} recorded (after {} warm-up each), interleaved, histograms merged; RSS is the pair's at the end of the last round.",
        mesh_certs::CLIENT_ID,
        mesh_certs::SERVER_ID,
        s.latency_rounds,
        seconds(plan.duration),
        seconds(plan.warmup)
    ));
    let contenders: Vec<Proxy> = s
        .contenders(false)
        .into_iter()
        .filter(|p| matches!(p, Proxy::NoProxy | Proxy::Remora | Proxy::Envoy))
        .collect();
    let cert_root = std::env::temp_dir().join(format!("remora-bench-mtls-{}", std::process::id()));
    let certs = match mesh_certs::generate(&cert_root) {
        Ok(c) => c,
        Err(e) => {
            for p in contenders {
                table.push_missing(p.name(), format!("certificates: {e:#}"));
            }
            return table;
        }
    };
    let results = interleaved("mtls", &contenders, s.latency_rounds, |proxy| {
        let pair = match proxy {
            Proxy::NoProxy => None,
            Proxy::Remora => {
                // Written for when explicit listeners speak mesh mTLS; not started.
                write_remora_configs(bench, &certs);
                return Err(REMORA_NOT_EXPRESSIBLE.to_string());
            }
            Proxy::Envoy => Some(start_envoy_pair(bench, &certs)?),
            _ => return Err("not part of this scenario".into()),
        };
        let addr = pair.as_ref().map_or(bench.upstream, |p| p.listen);
        let before = pair.as_ref().map(Pair::usage);
        let outcome = bench.block_on(open_loop::run(addr, plan));
        let after = pair.as_ref().map(Pair::usage);
        let cpu = before.zip(after).map(|(b, a)| a.cpu_seconds_since(&b));
        let rss = after.map(|a| a.rss_kib);
        outcome
            .map(|o| (o, cpu, rss))
            .map_err(|e| format!("load failed: {e:#}"))
    });
    let _ = fs::remove_dir_all(&cert_root);
    let mut baseline: Option<Vec<f64>> = None;
    for (proxy, rounds) in results {
        let mut merged: Option<(Outcome, Option<f64>, Option<u64>)> = None;
        let mut failures = vec![];
        for round in rounds {
            match round {
                Ok((outcome, cpu, rss)) => match &mut merged {
                    None => merged = Some((outcome, cpu, rss)),
                    Some((total, total_cpu, last_rss)) => {
                        total.merge(&outcome);
                        *total_cpu = total_cpu.zip(cpu).map(|(a, b)| a + b);
                        *last_rss = rss;
                    }
                },
                Err(e) => failures.push(e),
            }
        }
        let Some((outcome, cpu_seconds, rss_kib)) = merged else {
            let why = failures.into_iter().next().unwrap_or_default();
            table.push_missing(proxy.name(), why);
            continue;
        };
        let p: Vec<f64> = [0.5, 0.9, 0.99, 0.999]
            .iter()
            .map(|q| outcome.percentile_us(*q))
            .collect();
        if proxy == Proxy::NoProxy {
            baseline = Some(p.clone());
        }
        let added = |i: usize| baseline.as_ref().map(|b| p[i] - b[i]);
        let values = vec![
            Some(p[0]),
            Some(p[1]),
            Some(p[2]),
            Some(p[3]),
            added(0),
            added(2),
            Some(outcome.achieved_rate()),
            Some(outcome.errors as f64),
            cpu_seconds.map(|c| cpu_ms_per_1000(c, outcome.answered)),
            rss_kib.map(mib),
        ];
        let mut notes = vec![];
        if outcome.errors > 0 {
            notes.push(format!("{} failed requests", outcome.errors));
        }
        if let Some(first) = failures.first() {
            notes.push(format!("{} round(s) failed: {first}", failures.len()));
        }
        eprintln!(
            "mtls: {} p50 {:.0} µs p99 {:.0} µs, {:.0} rps, {} errors, CPU/1000 req {:?} ms",
            proxy.name(),
            p[0],
            p[2],
            outcome.achieved_rate(),
            outcome.errors,
            cpu_seconds.map(|c| cpu_ms_per_1000(c, outcome.answered))
        );
        let row = match proxy {
            Proxy::NoProxy => "no-proxy",
            _ => proxy.name(),
        };
        table.push(row, values, (!notes.is_empty()).then(|| notes.join("; ")));
    }
    table
}

/// Two running sidecars; clients connect to `listen` (sidecar A).
struct Pair {
    listen: SocketAddr,
    client: Spawned,
    server: Spawned,
}

impl Pair {
    /// CPU and memory of both sidecars together.
    fn usage(&self) -> Usage {
        let (a, b) = (
            process::tree_usage(self.client.pid()),
            process::tree_usage(self.server.pid()),
        );
        Usage {
            cpu_ticks: a.cpu_ticks + b.cpu_ticks,
            rss_kib: a.rss_kib + b.rss_kib,
        }
    }
}

/// Starts sidecar B, then sidecar A, and waits until a request through both is answered.
fn start_envoy_pair(bench: &Bench, certs: &MeshCerts) -> Result<Pair, String> {
    let program = bench
        .tools
        .envoy
        .clone()
        .ok_or("envoy not found (scripts/bench-deps installs it)")?;
    let fail = |e: anyhow::Error| format!("{e:#}");
    let dir = bench.work_dir.join("envoy-mtls");
    fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let ports = process::free_ports(4).map_err(fail)?;
    let addr = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let (listen, server_listen) = (addr(ports[0]), addr(ports[1]));
    let server_file = dir.join("envoy-b.yaml");
    let client_file = dir.join("envoy-a.yaml");
    let written = fs::write(
        &server_file,
        config::envoy_mesh_server_config(
            server_listen,
            bench.upstream,
            ports[2],
            &certs.server_dir,
        ),
    )
    .and_then(|()| {
        fs::write(
            &client_file,
            config::envoy_mesh_client_config(
                listen,
                server_listen,
                ports[3],
                &certs.client_dir,
                mesh_certs::SERVER_ID,
            ),
        )
    });
    written.map_err(|e| e.to_string())?;
    let cpu = bench.settings.pin.then_some(PROXY_CPU);
    let spawn = |name: &str, file: &std::path::Path, log: &str| {
        process::spawn(
            &bench.registry,
            name,
            cpu,
            &program,
            &config::envoy_args_with(file, MESH_WORKERS),
            &dir.join(log),
        )
        .map_err(fail)
    };
    let mut server = spawn("envoy-b", &server_file, "output-b.log")?;
    let mut client = spawn("envoy-a", &client_file, "output-a.log")?;
    let deadline = Instant::now() + READY_TIMEOUT;
    while !bench.block_on(probe(listen, Mode::Http1)) {
        for (side, spawned) in [("A", &mut client), ("B", &mut server)] {
            if let Some(status) = spawned.exited() {
                return Err(format!(
                    "sidecar {side} exited ({status}): {}",
                    super::one_line(&spawned.log_tail(3))
                ));
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the pair did not answer within {READY_TIMEOUT:?}: A: {} B: {}",
                super::one_line(&client.log_tail(3)),
                super::one_line(&server.log_tail(3))
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(Pair {
        listen,
        client,
        server,
    })
}

/// Remora's pair configs, kept in the work directory for when explicit listeners can carry
/// mesh mTLS (see [`REMORA_NOT_EXPRESSIBLE`]).
fn write_remora_configs(bench: &Bench, certs: &MeshCerts) {
    let dir = bench.work_dir.join("remora-mtls");
    let Ok(ports) = process::free_ports(9) else {
        return;
    };
    let side = |i: usize| RemoraPorts {
        readiness: ports[i],
        metrics: ports[i + 1],
        agent: ports[i + 2],
        admin: ports[i + 3],
    };
    let server = SocketAddr::from(([127, 0, 0, 1], ports[8]));
    let _ = fs::create_dir_all(&dir);
    let _ = fs::write(
        dir.join("remora-a.yaml"),
        config::remora_mesh_config(
            &side(0),
            &certs.client_dir,
            Some((server, mesh_certs::SERVER_ID)),
        ),
    );
    let _ = fs::write(
        dir.join("remora-b.yaml"),
        config::remora_mesh_config(&side(4), &certs.server_dir, None),
    );
}
