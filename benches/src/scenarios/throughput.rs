//! Scenario 2, maximum throughput through each proxy's L7 mode: HTTP/1.1 keep-alive over 64
//! connections (wrk), then over h2c, 16 connections × 16 streams (h2load), gRPC unary calls and
//! plain GETs.
//! Interleaved rounds; each figure is the median of the rounds, with their spread.

use super::measure::{core_columns, CORES_NOTE};
use super::{cpu_ms_per_1000, grpc_request_body, interleaved, seconds, summarize, Bench, Cost};
use crate::load_tools::{self, HttpLoad};
use crate::proxy_config::{Mode, Proxy};
use crate::report::{Column, Figure, Table};
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

const HTTP1_CONNECTIONS: usize = 64;
const H2_CONNECTIONS: usize = 16;
const H2_STREAMS: usize = 16;
/// Extra time a tool gets beyond its own duration before it is killed.
pub const TOOL_GRACE: Duration = Duration::from_secs(15);

fn columns(percentiles: bool) -> Vec<Column> {
    let mut c = vec![
        Column::new("req/s", "", 0).with_ratios(),
        Column::new("req/s per proxy core", "", 0).with_peer_ratios(),
        Column::new("mean latency", "µs", 0),
    ];
    if percentiles {
        c.push(Column::new("p50", "µs", 0));
        c.push(Column::new("p99", "µs", 0));
    }
    c.extend([
        Column::new("errors", "", 0),
        Column::new("proxy CPU", "cores", 2),
        Column::new("proxy CPU / 1000 req", "ms", 1).with_peer_ratios(),
    ]);
    c.extend(core_columns());
    c
}

/// The note every throughput-like table carries about its rounds.
pub fn rounds_note(bench: &Bench) -> String {
    let s = &bench.settings;
    format!(
        "{} rounds of {} per contender, interleaved across contenders, each contender freshly started per round; every figure is the median of the rounds (min–max in brackets).",
        s.rounds,
        seconds(s.round)
    )
}

/// Runs both halves of the scenario.
pub fn run(bench: &Bench) -> Vec<Table> {
    let run = bench.settings.round;
    let contenders = bench.settings.contenders(&[Proxy::RemoraTcp]);
    // Routed by xDS: HTTP/1.1 only, the path whose cost beside the explicit listener's the
    // issue bounds.
    let http1_contenders = bench
        .settings
        .contenders(&[Proxy::RemoraTcp, Proxy::RemoraXds]);

    let mut http1 = Table::new(
        "throughput-http1",
        "2a. Max throughput, HTTP/1.1 keep-alive, 64 connections (wrk, 1 thread)",
        columns(true),
    );
    http1.notes.push(format!(
        "wrk -t1 -c{HTTP1_CONNECTIONS} -d{}s --latency; wrk and the upstream share the load core.",
        run.as_secs()
    ));
    http1.notes.push(rounds_note(bench));
    http1.notes.push(CORES_NOTE.into());
    let results = interleaved(
        "throughput http/1.1",
        &http1_contenders,
        bench.settings.rounds,
        |proxy| {
            let wrk = bench
                .tools
                .wrk
                .clone()
                .ok_or("wrk not found (scripts/bench-deps installs it)")?;
            one_run(bench, proxy, Mode::Http1, |addr| {
                let args = load_tools::wrk_args(addr, HTTP1_CONNECTIONS, run);
                let out = bench.run_tool("wrk", &wrk, &args, run + TOOL_GRACE)?;
                load_tools::parse_wrk(&out)
                    .ok_or_else(|| format!("wrk printed no report: {}", out.trim()))
            })
        },
    );
    for (proxy, rounds) in results {
        push(&mut http1, proxy, rounds, true);
    }

    let body_file = bench.work_dir.join("grpc-request.bin");
    let body = fs::write(&body_file, grpc_request_body())
        .map(|()| body_file)
        .map_err(|e| format!("writing the request body: {e}"));
    let grpc = h2load_scenario(
        bench,
        &contenders,
        Mode::Grpc,
        Some(body),
        ("throughput-grpc", "2b. Max throughput, gRPC unary over h2c"),
        "POST of a 100-byte gRPC message, 1 KiB gRPC answer with grpc-status trailers; HTTP/2 end to end (Envoy's cluster, HAProxy's `proto h2`, nginx's grpc_pass, Remora's HTTP mode).",
    );
    let h2c = h2load_scenario(
        bench,
        &contenders,
        Mode::H2c,
        None,
        ("throughput-h2c", "2c. Max throughput, h2c GETs"),
        "GET of a 1 KiB body, h2c with prior knowledge in; HTTP/2 to the upstream too (Envoy's cluster, HAProxy's `proto h2`, Remora's HTTP mode) except for nginx, whose `proxy_pass` speaks only HTTP/1.x to upstreams (a keep-alive pool of HTTP/1.1).",
    );
    vec![http1, grpc, h2c]
}

type Measured = (HttpLoad, Cost);

/// One h2load table: interleaved rounds of `mode` through every contender, gRPC unary calls
/// with the request body written to `grpc_body`, plain GETs without. `(id, title)` name the
/// table (the title gets the connections and streams); `what` follows h2load's command line in
/// its first note.
fn h2load_scenario(
    bench: &Bench,
    contenders: &[Proxy],
    mode: Mode,
    grpc_body: Option<Result<PathBuf, String>>,
    (id, title): (&str, &str),
    what: &str,
) -> Table {
    let mut table = Table::new(
        id,
        &format!("{title}, {H2_CONNECTIONS} connections × {H2_STREAMS} streams (h2load, 1 thread)"),
        columns(false),
    );
    table.notes.push(format!(
        "h2load -c{H2_CONNECTIONS} -m{H2_STREAMS} -t1 -D {}: {what}",
        bench.settings.round.as_secs()
    ));
    table.notes.push(rounds_note(bench));
    table.notes.push(CORES_NOTE.into());
    let label = format!("throughput {}", super::mode_name(mode));
    let results = interleaved(&label, contenders, bench.settings.rounds, |proxy| {
        let h2load_path = h2load_path(bench)?;
        let body = grpc_body.as_ref().map(|b| b.as_deref()).transpose()?;
        one_run(bench, proxy, mode, |addr| {
            h2load(bench, &h2load_path, addr, body)
        })
    });
    for (proxy, rounds) in results {
        push(&mut table, proxy, rounds, false);
    }
    table
}

fn h2load_path(bench: &Bench) -> Result<PathBuf, String> {
    bench
        .tools
        .h2load
        .clone()
        .ok_or_else(|| "h2load not found (scripts/bench-deps installs nghttp2-client)".into())
}

/// One h2load run against `addr`: gRPC unary calls with `grpc_body`, plain GETs without.
fn h2load(
    bench: &Bench,
    h2load: &Path,
    addr: SocketAddr,
    grpc_body: Option<&Path>,
) -> Result<HttpLoad, String> {
    let run = bench.settings.round;
    let args = load_tools::h2load_args(addr, H2_CONNECTIONS, H2_STREAMS, run, grpc_body);
    let out = bench.run_tool("h2load", h2load, &args, run + TOOL_GRACE)?;
    load_tools::parse_h2load(&out)
        .ok_or_else(|| format!("h2load printed no report: {}", out.trim()))
}

/// Starts `proxy` in `mode`, runs `load` through it, and returns the load's numbers with what
/// it cost.
fn one_run(
    bench: &Bench,
    proxy: Proxy,
    mode: Mode,
    load: impl FnOnce(SocketAddr) -> Result<HttpLoad, String>,
) -> Result<Measured, String> {
    let contender = bench.start(proxy, mode, bench.upstream)?;
    let (result, cost) = bench.measure(&contender, || load(contender.addr));
    Ok((result?, cost))
}

fn push(table: &mut Table, proxy: Proxy, rounds: Vec<Result<Measured, String>>, percentiles: bool) {
    let (mut requests, mut errors) = (0, 0);
    let per_round = rounds
        .into_iter()
        .map(|round| {
            let (load, cost) = round?;
            requests += load.requests + load.errors;
            errors += load.errors;
            Ok(values(&load, &cost, percentiles))
        })
        .collect();
    match summarize(per_round) {
        Err(why) => table.push_missing(proxy.name(), why),
        Ok((values, rounds_note)) => {
            eprintln!(
                "  {}: {:.0} req/s (median), {errors} errors",
                proxy.name(),
                Figure::median_of(&values[0]),
            );
            let notes: Vec<String> = [
                (errors > 0)
                    .then(|| format!("{errors} of {requests} requests failed in all rounds")),
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
    }
}

/// One round's figures, in [`columns`] order.
fn values(load: &HttpLoad, cost: &Cost, percentiles: bool) -> Vec<Option<f64>> {
    let per_core = cost
        .proxy_cores()
        .filter(|cores| *cores > 0.0)
        .map(|cores| load.requests_per_second / cores);
    let mut values = vec![Some(load.requests_per_second), per_core, load.mean_us];
    if percentiles {
        values.push(load.p50_us);
        values.push(load.p99_us);
    }
    let per_1000 = cost
        .cpu_seconds
        .map(|c| cpu_ms_per_1000(c, load.requests + load.errors));
    values.extend([Some(load.errors as f64), cost.proxy_cores(), per_1000]);
    values.extend(cost.core_figures());
    values
}
