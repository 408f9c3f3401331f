//! Scenario 1, Istio's: HTTP/1.1, 1 KiB responses, 16 connections, 1000 requests per second at
//! a fixed rate with coordinated-omission correction; the percentiles, and what each proxy adds
//! over no proxy. The recorded time is split into interleaved rounds whose histograms are merged.

use super::measure::{core_columns, measure_quietly, repeated_note, CORES_NOTE};
use super::{cpu_ms_per_1000, interleaved, mib, seconds, summarize, Bench, FLOOR_NOTE};
use crate::open_loop::{self, Outcome, Plan};
use crate::proxy_config::{Mode, Proxy};
use crate::report::{Column, Figure, Table};
use crate::wakeup::STALLED_HOP;
use std::collections::HashMap;
use std::time::Duration;

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
        [
            Column::new("p50", "µs", 0).with_ratios(),
            Column::new("p90", "µs", 0),
            Column::new("p99", "µs", 0).with_ratios(),
            Column::new("p99.9", "µs", 0),
            Column::new("added p50", "µs", 0).with_peer_ratios(),
            Column::new("added p90", "µs", 0),
            Column::new("added p99", "µs", 0).with_peer_ratios(),
            Column::new("added p99.9", "µs", 0),
            Column::new("over 1 ms", "%", 2),
            Column::new("rps", "", 0),
            Column::new("errors", "", 0),
            Column::new("proxy CPU / 1000 req", "ms", 1).with_peer_ratios(),
            Column::new("proxy RSS", "MiB", 1).with_peer_ratios(),
        ]
        .into_iter()
        .chain(core_columns())
        .collect(),
    );
    table.notes.push(format!(
        "Open-loop generator in the benches crate (hyper client, hdrhistogram): requests due every 1 ms spread evenly over {CONNECTIONS} keep-alive connections, latency measured from when each was due. {} rounds of {} recorded (after {} warm-up each), interleaved across contenders, each contender freshly started per round; every figure is the median of the rounds (min–max in brackets).",
        s.rounds,
        seconds(plan.duration),
        seconds(plan.warmup)
    ));
    table.notes.push("\"added\" = this row's percentile − no proxy's in the same round. remora-tcp is Remora forwarding opaque TCP (L4): a reference, not like-for-like.".into());
    table.notes.push("\"over 1 ms\" = the per cent of requests slower than 1 ms. Each request through a proxy makes four hops between the cores, and the machine stalls a few hops in a thousand for milliseconds (the header's hop line); once this nears 1%, the round's p99 falls among those stalls and says more about the machine than about the proxy.".into());
    table.notes.push(FLOOR_NOTE.into());
    table.notes.push(CORES_NOTE.into());
    let mut repeated: HashMap<Proxy, usize> = HashMap::new();
    let results = interleaved(
        "latency",
        &s.contenders(&[Proxy::RemoraTcp, Proxy::Floor]),
        s.rounds,
        |proxy| {
            let (round, again) = measure_quietly(proxy.name(), || {
                let contender = bench.start(proxy, Mode::Http1, bench.upstream)?;
                let (outcome, cost) = bench.measure_after(&contender, plan.warmup, || {
                    bench.block_on(open_loop::run(contender.addr, plan))
                });
                outcome
                    .map(|o| (o, cost))
                    .map_err(|e| format!("load failed: {e:#}"))
            });
            *repeated.entry(proxy).or_default() += again;
            round
        },
    );
    // Each round's added latency is over no proxy's in the same round: interleaving makes
    // them neighbours in time, so a burst of outside load shows in both.
    let baseline: Vec<Option<Vec<f64>>> = results
        .iter()
        .find(|(p, _)| *p == Proxy::NoProxy)
        .map(|(_, rounds)| {
            rounds
                .iter()
                .map(|r| r.as_ref().ok().map(|(o, _)| percentiles(o)))
                .collect()
        })
        .unwrap_or_default();
    for (proxy, rounds) in results {
        let mut lag = Duration::ZERO;
        let mut errors = 0;
        let per_round: Vec<Result<Vec<Option<f64>>, String>> = rounds
            .into_iter()
            .enumerate()
            .map(|(i, round)| {
                let (outcome, cost) = round?;
                lag = lag.max(outcome.max_generator_lag);
                errors += outcome.errors;
                let p = percentiles(&outcome);
                let base = baseline.get(i).cloned().flatten();
                let mut values: Vec<Option<f64>> = p.iter().map(|v| Some(*v)).collect();
                values.extend((0..QUANTILES.len()).map(|q| base.as_ref().map(|b| p[q] - b[q])));
                values.push(Some(outcome.percent_over(STALLED_HOP)));
                values.push(Some(outcome.achieved_rate()));
                values.push(Some(outcome.errors as f64));
                values.push(
                    cost.cpu_seconds
                        .map(|c| cpu_ms_per_1000(c, outcome.requests)),
                );
                values.push(cost.max_rss_kib.map(mib));
                values.extend(cost.core_figures());
                Ok(values)
            })
            .collect();
        let (values, rounds_note) = match summarize(per_round) {
            Ok(row) => row,
            Err(why) => {
                table.push_missing(proxy.name(), why);
                continue;
            }
        };
        let mut notes = vec![];
        if lag.as_millis() >= 5 {
            notes.push(format!(
                "generator timer lagged up to {:.1} ms (not counted)",
                lag.as_secs_f64() * 1000.0
            ));
        }
        if errors > 0 {
            notes.push(format!("{errors} failed requests in all rounds"));
        }
        notes.extend(repeated_note(repeated.get(&proxy).copied().unwrap_or(0)));
        notes.extend(rounds_note);
        let median = |i: usize| Figure::median_of(&values[i]);
        eprintln!(
            "latency: {} p50 {:.0} µs p99 {:.0} µs p99.9 {:.0} µs (medians), {errors} errors",
            proxy.name(),
            median(0),
            median(2),
            median(3),
        );
        table.push(
            proxy.name(),
            values,
            (!notes.is_empty()).then(|| notes.join("; ")),
        );
    }
    table
}

/// The round's latency at each of [`QUANTILES`], in µs.
fn percentiles(outcome: &Outcome) -> Vec<f64> {
    QUANTILES
        .iter()
        .map(|q| outcome.percentile_us(*q))
        .collect()
}
