//! Scenario 5: two sidecars back to back over mTLS, as Istio's published benchmark runs them
//! (2 workers each): client → sidecar A (plain HTTP in, mTLS out) → sidecar B (mTLS in, plain
//! HTTP out) → upstream, all on loopback with explicit listeners. Istio's load (HTTP/1.1, 1 KiB,
//! 16 connections, 1000 rps open loop); latency percentiles and the CPU of both sidecars
//! together per 1000 requests.

use super::{
    cpu_ms_per_1000, interleaved, mib, probe, push_rows, seconds, summarize, Bench, READY_TIMEOUT,
};
use crate::load_tools;
use crate::mesh_certs::{self, MeshCerts};
use crate::open_loop::{self, Outcome, Plan};
use crate::process::{self, Spawned, Usage, PROXY_CPU};
use crate::proxy_config::{self as config, MeshSide, Mode, Proxy, RemoraPorts, MESH_WORKERS};
use crate::report::{Column, Figure, Table};
use std::fs;
use std::net::SocketAddr;
use std::time::Instant;

/// Runs the scenario: no proxy, the Remora pair (when expressible) and the Envoy pair.
pub fn run(bench: &Bench) -> Vec<Table> {
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
            Column::new("added p50", "µs", 0).with_peer_ratios(),
            Column::new("added p99", "µs", 0).with_peer_ratios(),
            Column::new("rps", "", 0),
            Column::new("errors", "", 0),
            Column::new("both sidecars' CPU / 1000 req", "ms", 1).with_peer_ratios(),
            Column::new("both sidecars' RSS", "MiB", 1).with_peer_ratios(),
        ],
    );
    table.notes.push(format!(
        "Each row is a pair of sidecars with {MESH_WORKERS} workers each, both pinned to the proxy core (the generator and upstream on the other). mTLS between them with rcgen-generated SPIFFE certificates ({} → {}) in Istio's file layout; A checks B's SPIFFE ID, B requires a client certificate from the mesh root; Remora's pair is explicit listeners with `tls.mode: originate` (A) and `terminate` (B). {} rounds of {} recorded (after {} warm-up each), interleaved, each pair freshly started per round; every figure is the median of the rounds (min–max in brackets), \"added\" over no proxy in the same round; RSS is the pair's at the end of a round.",
        mesh_certs::CLIENT_ID,
        mesh_certs::SERVER_ID,
        s.rounds,
        seconds(plan.duration),
        seconds(plan.warmup)
    ));
    table.notes.push("The same job on both sides: both A's parse HTTP and pool their TLS connections to B across client connections. With 16 keep-alive connections the TLS handshakes fall in the warm-up.".into());
    let contenders: Vec<Proxy> = s
        .contenders(&[])
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
            return vec![table];
        }
    };
    let results = interleaved("mtls", &contenders, s.rounds, |proxy| {
        let pair = match proxy {
            Proxy::NoProxy => None,
            Proxy::Remora => Some(start_remora_pair(bench, &certs, Mode::Http1)?),
            Proxy::Envoy => Some(start_envoy_pair(bench, &certs, Mode::Http1)?),
            _ => return Err("not part of this scenario".into()),
        };
        let addr = pair.as_ref().map_or(bench.upstream, |p| p.listen);
        let before = pair.as_ref().map(Pair::usage);
        let outcome = bench.block_on(open_loop::run(addr, plan));
        let after = pair.as_ref().map(Pair::usage);
        let cpu = before
            .zip(after.as_ref())
            .map(|(b, a)| a.cpu_seconds_since(&b));
        let rss = after.map(|a| a.rss_kib);
        outcome
            .map(|o| (o, cpu, rss))
            .map_err(|e| format!("load failed: {e:#}"))
    });
    let idle = idle_table(bench, &certs, &contenders);
    let per_request = connection_per_request_table(bench, &certs, &contenders);
    let _ = fs::remove_dir_all(&cert_root);
    let baseline: Vec<Option<Vec<f64>>> = results
        .iter()
        .find(|(p, _)| *p == Proxy::NoProxy)
        .map(|(_, rounds)| {
            rounds
                .iter()
                .map(|r| r.as_ref().ok().map(|(o, _, _)| percentiles(o)))
                .collect()
        })
        .unwrap_or_default();
    for (proxy, rounds) in results {
        let mut errors = 0;
        let per_round = rounds
            .into_iter()
            .enumerate()
            .map(|(i, round)| {
                let (outcome, cpu, rss) = round?;
                errors += outcome.errors;
                let p = percentiles(&outcome);
                let base = baseline.get(i).cloned().flatten();
                let added = |q: usize| base.as_ref().map(|b| p[q] - b[q]);
                Ok(vec![
                    Some(p[0]),
                    Some(p[1]),
                    Some(p[2]),
                    Some(p[3]),
                    added(0),
                    added(2),
                    Some(outcome.achieved_rate()),
                    Some(outcome.errors as f64),
                    cpu.map(|c| cpu_ms_per_1000(c, outcome.answered)),
                    rss.map(mib),
                ])
            })
            .collect();
        let (values, rounds_note) = match summarize(per_round) {
            Ok(row) => row,
            Err(why) => {
                table.push_missing(proxy.name(), why);
                continue;
            }
        };
        let median = |i: usize| Figure::median_of(&values[i]);
        eprintln!(
            "mtls: {} p50 {:.0} µs p99 {:.0} µs, CPU/1000 req {:.1} ms (medians), {errors} errors",
            proxy.name(),
            median(0),
            median(2),
            median(8)
        );
        let notes: Vec<String> = [
            (errors > 0).then(|| format!("{errors} failed requests in all rounds")),
            rounds_note,
        ]
        .into_iter()
        .flatten()
        .collect();
        table.push(
            proxy.name(),
            values,
            (!notes.is_empty()).then(|| notes.join("; ")),
        );
    }
    vec![table, idle, per_request]
}

/// The connection-per-request table: an application that opens a connection for each request
/// (`Connection: close`), as many HTTP/1.0 clients, scripts and health checkers do. Each
/// client connection reaches A anew; whether B sees a new TLS connection, and both sidecars a
/// handshake, per request is up to A's pooling.
fn connection_per_request_table(bench: &Bench, certs: &MeshCerts, contenders: &[Proxy]) -> Table {
    let s = &bench.settings;
    let connections = super::latency::CONNECTIONS;
    let mut table = Table::new(
        "mtls-close",
        &format!("5c. mTLS, a new client connection per request: two sidecars back to back, 2 workers each; HTTP/1.1 `Connection: close`, {connections} connections at once (wrk, 1 thread)"),
        vec![
            Column::new("rps", "", 0).with_ratios(),
            Column::new("both sidecars' cores", "", 2),
            Column::new("requests per core of the pair", "", 0).with_peer_ratios(),
            Column::new("both sidecars' CPU / 1000 req", "ms", 1).with_peer_ratios(),
            Column::new("errors", "", 0),
        ],
    );
    table.notes.push(format!(
        "Each pair as in scenario 5. wrk -t1 -c{connections} -d{}s -H 'Connection: close': every request on a new connection to A, which closes it after the answer. A's connections to B are its own business: both A's pool them across client connections, so B sees few. Requests per core = rps ÷ (both sidecars' CPU-seconds per second). {} rounds, interleaved, each pair freshly started per round (its first handshakes fall in the round); medians (min–max in brackets).",
        s.round.as_secs().max(1),
        s.rounds
    ));
    let Some(wrk) = bench.tools.wrk.clone() else {
        for p in contenders {
            table.push_missing(
                p.name(),
                "wrk not found (scripts/bench-deps installs it)".into(),
            );
        }
        return table;
    };
    let results = interleaved("mtls-close", contenders, s.rounds, |proxy| {
        let pair = match proxy {
            Proxy::NoProxy => None,
            Proxy::Remora => Some(start_remora_pair(bench, certs, Mode::Http1)?),
            Proxy::Envoy => Some(start_envoy_pair(bench, certs, Mode::Http1)?),
            _ => return Err("not part of this scenario".into()),
        };
        let addr = pair.as_ref().map_or(bench.upstream, |p| p.listen);
        let args = load_tools::wrk_close_args(addr, connections, s.round);
        let before = pair.as_ref().map(Pair::usage);
        let started = Instant::now();
        let out = bench.run_tool("wrk", &wrk, &args, s.round + super::throughput::TOOL_GRACE)?;
        let elapsed = started.elapsed().as_secs_f64();
        let after = pair.as_ref().map(Pair::usage);
        let load = load_tools::parse_wrk(&out)
            .ok_or_else(|| format!("wrk printed no report: {}", out.trim()))?;
        let cpu = before
            .zip(after.as_ref())
            .map(|(b, a)| a.cpu_seconds_since(&b));
        let cores = cpu.map(|c| c / elapsed);
        Ok(vec![
            Some(load.requests_per_second),
            cores,
            cores.map(|c| load.requests_per_second / c),
            cpu.map(|c| cpu_ms_per_1000(c, load.requests)),
            Some(load.errors as f64),
        ])
    });
    push_rows(&mut table, results, |name, median| {
        format!(
            "mtls-close: {name} {:.0} rps, {:.0} requests per core (medians)",
            median(0),
            median(2)
        )
    });
    table
}

/// Idle mesh connections opened per round and pair: enough for a steady figure per
/// connection (each is a full mutual-TLS handshake on both sidecars).
const IDLE_MESH_CONNECTIONS: usize = 2000;

/// Each sidecar's memory per idle mesh connection, both pairs in TCP mode (Envoy's
/// `tcp_proxy`, Remora's TCP listeners), where every client connection has its own mesh
/// connection in either pair; in HTTP mode Envoy's A pools its connections to B and Remora's
/// does not, which would compare different jobs.
fn idle_table(bench: &Bench, certs: &MeshCerts, contenders: &[Proxy]) -> Table {
    let s = &bench.settings;
    let n = s.idle_connections.min(IDLE_MESH_CONNECTIONS);
    let mut table = Table::new(
        "mtls-idle",
        "5b. Memory per idle mesh connection: two sidecars back to back over mTLS, TCP mode, 2 workers each",
        vec![
            Column::new("sidecar A per idle conn", "KiB", 1).with_peer_ratios(),
            Column::new("sidecar B per idle conn", "KiB", 1).with_peer_ratios(),
            Column::new("both per idle conn", "KiB", 1).with_peer_ratios(),
            Column::new("A idle RSS", "MiB", 1),
            Column::new("B idle RSS", "MiB", 1),
        ],
    );
    table.notes.push(format!(
        "Each pair as in scenario 5 but proxying opaque TCP (Envoy: `tcp_proxy`, with Istio's TCP ALPN; Remora: `protocol: tcp` listeners, with metadata exchange), so every client connection has its own mesh connection from A to B in both. Per round: the pair freshly started, its RSS idle, then {n} connections opened through A, each carrying one HTTP/1.1 request and its 1 KiB answer before it goes idle; per idle connection = (RSS with them − RSS idle) / connections, for each sidecar. {} rounds, interleaved; medians (min–max in brackets).",
        s.rounds
    ));
    let pairs: Vec<Proxy> = contenders
        .iter()
        .copied()
        .filter(|p| matches!(p, Proxy::Remora | Proxy::Envoy))
        .collect();
    let results = interleaved("mtls-idle", &pairs, s.rounds, |proxy| {
        let pair = match proxy {
            Proxy::Remora => start_remora_pair(bench, certs, Mode::Tcp)?,
            Proxy::Envoy => start_envoy_pair(bench, certs, Mode::Tcp)?,
            _ => return Err("not part of this scenario".into()),
        };
        std::thread::sleep(s.settle);
        let rss = |p: &Spawned| process::tree_usage(p.pid()).rss_kib;
        let (a_idle, b_idle) = (rss(&pair.client), rss(&pair.server));
        let idle = bench.block_on(crate::tcp_load::open_idle(
            pair.listen,
            n,
            super::cost::OPEN_PARALLEL,
        ));
        std::thread::sleep(s.settle);
        let (a_with, b_with) = (rss(&pair.client), rss(&pair.server));
        let open = idle.streams.len();
        // Over half failed: the difference would say little.
        if open * 2 < n {
            return Err(format!(
                "{} of {n} idle connections failed ({})",
                idle.failed,
                idle.first_error.as_deref().unwrap_or("?")
            ));
        }
        drop(idle);
        let per = |idle: u64, with: u64| Some(with.saturating_sub(idle) as f64 / open as f64);
        Ok(vec![
            per(a_idle, a_with),
            per(b_idle, b_with),
            per(a_idle + b_idle, a_with + b_with),
            Some(mib(a_idle)),
            Some(mib(b_idle)),
        ])
    });
    push_rows(&mut table, results, |name, median| {
        format!(
            "mtls-idle: {name} A {:.1} KiB, B {:.1} KiB per idle connection (medians)",
            median(0),
            median(1)
        )
    });
    table
}

/// The round's latency at p50, p90, p99 and p99.9, in µs.
fn percentiles(outcome: &Outcome) -> Vec<f64> {
    [0.5, 0.9, 0.99, 0.999]
        .iter()
        .map(|q| outcome.percentile_us(*q))
        .collect()
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
        process::tree_usage(self.client.pid()).plus(process::tree_usage(self.server.pid()))
    }
}

/// Starts sidecar B, then sidecar A, and waits until a request through both is answered.
fn start_envoy_pair(bench: &Bench, certs: &MeshCerts, mode: Mode) -> Result<Pair, String> {
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
            mode,
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
                mode,
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
    let server = spawn("envoy-b", &server_file, "output-b.log")?;
    let client = spawn("envoy-a", &client_file, "output-a.log")?;
    wait_for_pair(bench, listen, client, server)
}

/// Waits until a request through sidecar A (`listen`) and B is answered.
fn wait_for_pair(
    bench: &Bench,
    listen: SocketAddr,
    mut client: Spawned,
    mut server: Spawned,
) -> Result<Pair, String> {
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

/// Starts Remora's pair: B (terminating in front of the upstream), then A (originating to B),
/// each with explicit listeners and its workload identity, and waits until both answer.
fn start_remora_pair(bench: &Bench, certs: &MeshCerts, mode: Mode) -> Result<Pair, String> {
    let program = bench
        .tools
        .remora
        .clone()
        .ok_or("target/release/remora not found (cargo build --release -p remora)")?;
    let fail = |e: anyhow::Error| format!("{e:#}");
    let dir = bench.work_dir.join("remora-mtls");
    fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let ports = process::free_ports(10).map_err(fail)?;
    let addr = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let (listen, server_listen) = (addr(ports[0]), addr(ports[1]));
    let side = |i: usize| RemoraPorts {
        readiness: ports[i],
        metrics: ports[i + 1],
        agent: ports[i + 2],
        admin: ports[i + 3],
    };
    let server_file = dir.join("remora-b.yaml");
    let client_file = dir.join("remora-a.yaml");
    let server_side = MeshSide::Server {
        listen: server_listen,
        upstream: bench.upstream,
    };
    let client_side = MeshSide::Client {
        listen,
        server: server_listen,
        server_id: mesh_certs::SERVER_ID,
    };
    fs::write(
        &server_file,
        config::remora_mesh_config(mode, &side(2), &certs.server_dir, server_side),
    )
    .and_then(|()| {
        fs::write(
            &client_file,
            config::remora_mesh_config(mode, &side(6), &certs.client_dir, client_side),
        )
    })
    .map_err(|e| e.to_string())?;
    let log_level = std::env::var("REMORA_LOG").unwrap_or_else(|_| "warn".into());
    let cpu = bench.settings.pin.then_some(PROXY_CPU);
    let spawn = |name: &str, file: &std::path::Path, log: &str| {
        process::spawn(
            &bench.registry,
            name,
            cpu,
            &program,
            &config::remora_mesh_args(file, MESH_WORKERS, &log_level),
            &dir.join(log),
        )
        .map_err(fail)
    };
    let server = spawn("remora-b", &server_file, "output-b.log")?;
    let client = spawn("remora-a", &client_file, "output-a.log")?;
    wait_for_pair(bench, listen, client, server)
}
