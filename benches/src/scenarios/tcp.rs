//! Scenario 3, opaque TCP: bulk throughput of one stream (iperf3) and new connections per second
//! (each one a short HTTP/1.1 exchange with `Connection: close`, so every hop is really dialled).

use super::throughput::CORES_NOTE;
use super::{Bench, Contender, Ready};
use crate::load_tools;
use crate::process::{self, LOAD_CPU};
use crate::proxy_config::{Mode, Proxy};
use crate::report::{Column, Table};
use crate::tcp_load;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Concurrent connection-opening loops.
const CONNECT_WORKERS: usize = 16;
/// Extra time iperf3 gets beyond its own duration before it is killed.
const TOOL_GRACE: Duration = Duration::from_secs(15);

/// Runs both halves of the scenario.
pub fn run(bench: &Bench) -> Vec<Table> {
    vec![bulk(bench), connection_rate(bench)]
}

fn bulk(bench: &Bench) -> Table {
    let mut table = Table::new(
        "tcp-bulk",
        "3a. TCP bulk throughput, one stream (iperf3)",
        vec![
            Column::new("throughput", "Gbit/s", 2).with_ratios(),
            Column::new("proxy CPU", "cores", 2),
            Column::new("proxy core busy", "%", 0),
            Column::new("load core busy", "%", 0),
        ],
    );
    table.notes.push(format!(
        "iperf3 -c … -t {} (client and server both on the load core); proxies in TCP mode (Envoy tcp_proxy, HAProxy mode tcp, nginx stream, Remora --protocol tcp).",
        bench.settings.run.as_secs()
    ));
    table.notes.push(CORES_NOTE.into());
    let Some(iperf3) = bench.tools.iperf3.clone() else {
        for proxy in bench.settings.contenders(false) {
            table.push_missing(
                proxy.name(),
                "iperf3 not found (scripts/bench-deps installs it)".into(),
            );
        }
        return table;
    };
    let server = match start_iperf3_server(bench, &iperf3) {
        Ok(s) => s,
        Err(e) => {
            for proxy in bench.settings.contenders(false) {
                table.push_missing(proxy.name(), format!("iperf3 server: {e:#}"));
            }
            return table;
        }
    };
    for proxy in bench.settings.contenders(false) {
        eprintln!("tcp bulk: {}", proxy.name());
        // A readiness request would confuse iperf3's server: wait for the port only.
        let measured = bench
            .start_with(proxy, Mode::Tcp, server.1, Ready::Listens)
            .and_then(|contender| {
                let (out, cost) = bench.measure(&contender, || {
                    let args = load_tools::iperf3_client_args(contender.addr, bench.settings.run);
                    bench.run_tool(
                        "iperf3-client",
                        &iperf3,
                        &args,
                        bench.settings.run + TOOL_GRACE,
                    )
                });
                Ok((load_tools::parse_iperf3(&out?)?, cost))
            });
        match measured {
            Ok((bits, cost)) => {
                eprintln!("  {:.2} Gbit/s", bits / 1e9);
                let values = vec![
                    Some(bits / 1e9),
                    cost.proxy_cores(),
                    cost.proxy_core_busy.map(|b| b * 100.0),
                    cost.load_core_busy.map(|b| b * 100.0),
                ];
                table.push(proxy.name(), values, None);
            }
            Err(why) => table.push_missing(proxy.name(), why),
        }
    }
    table
}

/// The iperf3 server on the load core, and its address.
fn start_iperf3_server(
    bench: &Bench,
    iperf3: &std::path::Path,
) -> anyhow::Result<(process::Spawned, SocketAddr)> {
    let addr: SocketAddr = format!("127.0.0.1:{}", process::free_ports(1)?[0]).parse()?;
    let log = bench.work_dir.join("iperf3-server.log");
    let cpu = bench.settings.pin.then_some(LOAD_CPU);
    let args = load_tools::iperf3_server_args(addr);
    let mut server = process::spawn(&bench.registry, "iperf3-server", cpu, iperf3, &args, &log)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
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
            Column::new("proxy CPU / 1000 conns", "ms", 1).with_envoy_ratio(),
            Column::new("proxy core busy", "%", 0),
            Column::new("load core busy", "%", 0),
        ],
    );
    table.notes.push(format!(
        "Generator in the benches crate on the load core; {} s per contender; each connection carries `GET /` with `Connection: close` and its 1 KiB answer.",
        bench.settings.run.as_secs()
    ));
    for proxy in bench.settings.contenders(false) {
        eprintln!("tcp connections: {}", proxy.name());
        match bench.start(proxy, Mode::Tcp, bench.upstream) {
            Err(why) => table.push_missing(proxy.name(), why),
            Ok(contender) => push_rate(bench, &mut table, proxy, &contender),
        }
    }
    table
}

fn push_rate(bench: &Bench, table: &mut Table, proxy: Proxy, contender: &Contender) {
    let (rate, cost) = bench.measure(contender, || {
        bench.block_on(tcp_load::connection_rate(
            contender.addr,
            CONNECT_WORKERS,
            bench.settings.run,
        ))
    });
    eprintln!(
        "  {:.0} connections/s, {} errors",
        rate.per_second(),
        rate.errors
    );
    let per_1000 = cost
        .cpu_seconds
        .map(|c| super::cpu_ms_per_1000(c, rate.connections + rate.errors));
    let note = (rate.errors > 0).then(|| format!("{} failed connections", rate.errors));
    let values = vec![
        Some(rate.per_second()),
        Some(rate.errors as f64),
        cost.proxy_cores(),
        per_1000,
        cost.proxy_core_busy.map(|b| b * 100.0),
        cost.load_core_busy.map(|b| b * 100.0),
    ];
    table.push(proxy.name(), values, note);
}
