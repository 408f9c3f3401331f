//! Scenario 3, opaque TCP: bulk throughput of one stream (iperf3) and new connections per second
//! (each one a short HTTP/1.1 exchange with `Connection: close`, so every hop is really dialled).
//! Interleaved rounds; each figure is the median of the rounds, with their spread.

use super::measure::{core_columns, CORES_NOTE};
use super::throughput::{rounds_note, TOOL_GRACE};
use super::{cpu_ms_per_1000, interleaved, push_rows, summarize, Bench, Cost, Ready};
use crate::load_tools;
use crate::process::{self, LOAD_CPU};
use crate::proxy_config::{Mode, Proxy};
use crate::report::{Column, Figure, Table};
use crate::tcp_load::{self, ConnectionRate};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// Concurrent connection-opening loops.
const CONNECT_WORKERS: usize = 16;

/// Runs both halves of the scenario.
pub fn run(bench: &Bench) -> Vec<Table> {
    vec![bulk(bench), connection_rate(bench)]
}

fn bulk(bench: &Bench) -> Table {
    let mut table = Table::new(
        "tcp-bulk",
        "3a. TCP bulk throughput, one stream (iperf3)",
        [
            Column::new("throughput", "Gbit/s", 2).with_ratios(),
            Column::new("proxy CPU", "cores", 2).with_peer_ratios(),
        ]
        .into_iter()
        .chain(core_columns())
        .collect(),
    );
    let run = bench.settings.round;
    table.notes.push(format!(
        "iperf3 -c … -t {} (client and server both on the load core); proxies in TCP mode (Envoy tcp_proxy, HAProxy mode tcp, nginx stream, Remora --protocol tcp).",
        run.as_secs()
    ));
    table.notes.push(rounds_note(bench));
    table.notes.push(CORES_NOTE.into());
    let server = match &bench.tools.iperf3 {
        None => Err("iperf3 not found (scripts/bench-deps installs it)".to_string()),
        Some(iperf3) => {
            start_iperf3_server(bench, iperf3).map_err(|e| format!("iperf3 server: {e:#}"))
        }
    };
    let results = interleaved(
        "tcp bulk",
        &bench.settings.contenders(&[Proxy::RemoraXds]),
        bench.settings.rounds,
        |proxy| {
            let (_, server_addr) = server.as_ref().map_err(Clone::clone)?;
            let iperf3 = bench.tools.iperf3.clone().ok_or("iperf3 not found")?;
            // A readiness request would confuse iperf3's server: wait for the port only.
            let contender = bench.start_with(proxy, Mode::Tcp, *server_addr, Ready::Listens)?;
            let (out, cost) = bench.measure(&contender, || {
                let args = load_tools::iperf3_client_args(contender.addr, run);
                bench.run_tool("iperf3-client", &iperf3, &args, run + TOOL_GRACE)
            });
            Ok((load_tools::parse_iperf3(&out?)?, cost))
        },
    );
    let results = results
        .into_iter()
        .map(|(proxy, rounds)| {
            let per_round = rounds
                .into_iter()
                .map(|round| {
                    let (bits, cost): (f64, Cost) = round?;
                    let mut values = vec![Some(bits / 1e9), cost.proxy_cores()];
                    values.extend(cost.core_figures());
                    Ok(values)
                })
                .collect();
            (proxy, per_round)
        })
        .collect();
    push_rows(&mut table, results, |name, median| {
        format!("  {name}: {:.2} Gbit/s (median)", median(0))
    });
    table
}

/// The iperf3 server on the load core, and its address.
fn start_iperf3_server(
    bench: &Bench,
    iperf3: &Path,
) -> anyhow::Result<(process::Spawned, SocketAddr)> {
    let addr: SocketAddr = format!("127.0.0.1:{}", process::free_ports(1)?[0]).parse()?;
    let log = bench.work_dir.join("iperf3-server.log");
    let cpu = bench.settings.pin.then_some(LOAD_CPU);
    let args = load_tools::iperf3_server_args(addr);
    let mut server = process::spawn(&bench.registry, "iperf3-server", cpu, iperf3, &args, &log)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !process::is_listening(addr.port()) {
        anyhow::ensure!(server.exited().is_none(), "exited: {}", server.log_tail(3));
        anyhow::ensure!(Instant::now() < deadline, "not listening after 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok((server, addr))
}

fn connection_rate(bench: &Bench) -> Table {
    let mut table = Table::new(
        "tcp-connections",
        "3b. New TCP connections per second (16 concurrent loops: connect, one request, read to close)",
        vec![
            Column::new("connections/s", "", 0).with_ratios(),
            Column::new("errors", "", 0),
            Column::new("proxy CPU", "cores", 2),
            Column::new("proxy CPU / 1000 conns", "ms", 1).with_peer_ratios(),
        ]
        .into_iter()
        .chain(core_columns())
        .collect(),
    );
    let run = bench.settings.round;
    table.notes.push("Generator in the benches crate on the load core; each connection carries `GET /` with `Connection: close` and its 1 KiB answer; proxies in TCP mode.".into());
    table.notes.push(rounds_note(bench));
    table.notes.push(CORES_NOTE.into());
    let results = interleaved(
        "tcp connections",
        &bench.settings.contenders(&[Proxy::RemoraXds]),
        bench.settings.rounds,
        |proxy| {
            let contender = bench.start(proxy, Mode::Tcp, bench.upstream)?;
            Ok(bench.measure(&contender, || {
                bench.block_on(tcp_load::connection_rate(
                    contender.addr,
                    CONNECT_WORKERS,
                    run,
                ))
            }))
        },
    );
    for (proxy, rounds) in results {
        let (mut connections, mut errors) = (0, 0);
        let per_round = rounds
            .into_iter()
            .map(|round| {
                let (rate, cost): (ConnectionRate, Cost) = round?;
                connections += rate.connections + rate.errors;
                errors += rate.errors;
                let per_1000 = cost
                    .cpu_seconds
                    .map(|c| cpu_ms_per_1000(c, rate.connections + rate.errors));
                let mut values = vec![
                    Some(rate.per_second()),
                    Some(rate.errors as f64),
                    cost.proxy_cores(),
                    per_1000,
                ];
                values.extend(cost.core_figures());
                Ok(values)
            })
            .collect();
        match summarize(per_round) {
            Ok((values, rounds_note)) => {
                eprintln!(
                    "  {}: {:.0} connections/s (median), {errors} errors",
                    proxy.name(),
                    Figure::median_of(&values[0])
                );
                let notes: Vec<String> = [
                    (errors > 0).then(|| {
                        format!("{errors} of {connections} connections failed in all rounds")
                    }),
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
            Err(why) => table.push_missing(proxy.name(), why),
        }
    }
    table
}
