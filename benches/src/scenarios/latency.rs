//! Scenario 1, Istio's: HTTP/1.1, 1 KiB responses, 16 connections, 1000 requests per second at
//! a fixed rate with coordinated-omission correction; the percentiles, and what each proxy adds
//! over no proxy. The recorded time is split into interleaved rounds whose histograms are merged.

use super::{cpu_ms_per_1000, interleaved, mib, seconds, Bench, Cost};
use crate::open_loop::{self, Outcome, Plan};
use crate::proxy_config::{Mode, Proxy};
use crate::report::{Column, Table};

/// Istio's benchmark load.
pub const RATE: f64 = 1000.0;
pub const CONNECTIONS: usize = 16;
const QUANTILES: [f64; 4] = [0.5, 0.9, 0.99, 0.999];

/// Runs the scenario for every contender.
pub fn run(bench: &Bench) -> Table {
    let s = &bench.settings;
    let plan = Plan {
        rate: RATE,
        connections: CONNECTIONS,
        warmup: s.warmup,
        duration: s.latency_round,
    };
    let mut table = Table::new(
        "latency",
        "1. Latency (Istio's benchmark): HTTP/1.1, 1 KiB responses, 16 connections, 1000 rps open loop",
        vec![
            Column::new("p50", "µs", 0).with_ratios(),
            Column::new("p90", "µs", 0),
            Column::new("p99", "µs", 0).with_ratios(),
            Column::new("p99.9", "µs", 0),
            Column::new("added p50", "µs", 0),
            Column::new("added p90", "µs", 0),
            Column::new("added p99", "µs", 0),
            Column::new("added p99.9", "µs", 0),
            Column::new("rps", "", 0),
            Column::new("errors", "", 0),
            Column::new("proxy CPU / 1000 req", "ms", 1).with_envoy_ratio(),
            Column::new("proxy RSS", "MiB", 1),
        ],
    );
    table.notes.push(format!(
        "Open-loop generator in the benches crate (hyper client, hdrhistogram): requests due every 1 ms spread evenly over {CONNECTIONS} keep-alive connections, latency measured from when each was due. {} round(s) of {} recorded (after {} warm-up each), interleaved across contenders, histograms merged.",
        s.latency_rounds,
        seconds(plan.duration),
        seconds(plan.warmup)
    ));
    table.notes.push("\"added\" = this row's percentile − no proxy's. remora-tcp is Remora forwarding opaque TCP (L4): a reference, not like-for-like.".into());
    let results = interleaved("latency", &s.contenders(true), s.latency_rounds, |proxy| {
        let contender = bench.start(proxy, Mode::Http1, bench.upstream)?;
        let (outcome, cost) = bench.measure(&contender, || {
            bench.block_on(open_loop::run(contender.addr, plan))
        });
        outcome
            .map(|o| (o, cost))
            .map_err(|e| format!("load failed: {e:#}"))
    });
    let mut baseline: Option<Vec<f64>> = None;
    for (proxy, rounds) in results {
        let mut merged: Option<(Outcome, Option<f64>, Option<u64>)> = None;
        let mut failures = vec![];
        for round in rounds {
            match round {
                Ok((outcome, cost)) => merge(&mut merged, outcome, cost),
                Err(e) => failures.push(e),
            }
        }
        let Some((outcome, cpu_seconds, max_rss_kib)) = merged else {
            table.push_missing(
                proxy.name(),
                failures.into_iter().next().unwrap_or_default(),
            );
            continue;
        };
        let percentiles: Vec<f64> = QUANTILES
            .iter()
            .map(|q| outcome.percentile_us(*q))
            .collect();
        if proxy == Proxy::NoProxy {
            baseline = Some(percentiles.clone());
        }
        let added: Vec<Option<f64>> = match &baseline {
            Some(base) => percentiles
                .iter()
                .zip(base)
                .map(|(p, b)| Some(p - b))
                .collect(),
            None => vec![None; 4],
        };
        let mut values: Vec<Option<f64>> = percentiles.iter().map(|p| Some(*p)).collect();
        values.extend(added);
        values.push(Some(outcome.achieved_rate()));
        values.push(Some(outcome.errors as f64));
        values.push(cpu_seconds.map(|c| cpu_ms_per_1000(c, outcome.answered)));
        values.push(max_rss_kib.map(mib));
        let mut notes = vec![];
        if outcome.max_generator_lag.as_millis() >= 5 {
            notes.push(format!(
                "generator timer lagged up to {:.1} ms (not counted)",
                outcome.max_generator_lag.as_secs_f64() * 1000.0
            ));
        }
        if outcome.errors > 0 {
            notes.push(format!("{} failed requests", outcome.errors));
        }
        if let Some(first) = failures.first() {
            notes.push(format!("{} round(s) failed: {first}", failures.len()));
        }
        eprintln!(
            "latency: {} p50 {:.0} µs p99 {:.0} µs p99.9 {:.0} µs, {:.0} rps, {} errors",
            proxy.name(),
            percentiles[0],
            percentiles[2],
            percentiles[3],
            outcome.achieved_rate(),
            outcome.errors
        );
        table.push(
            proxy.name(),
            values,
            (!notes.is_empty()).then(|| notes.join("; ")),
        );
    }
    table
}

/// Adds one round (its outcome, the proxy's CPU time and peak memory) to the merged total.
fn merge(merged: &mut Option<(Outcome, Option<f64>, Option<u64>)>, outcome: Outcome, cost: Cost) {
    match merged {
        None => *merged = Some((outcome, cost.cpu_seconds, cost.max_rss_kib)),
        Some((total, cpu, rss)) => {
            total.merge(&outcome);
            *cpu = cpu.zip(cost.cpu_seconds).map(|(a, b)| a + b);
            *rss = (*rss).max(cost.max_rss_kib);
        }
    }
}
