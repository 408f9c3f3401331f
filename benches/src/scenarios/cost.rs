//! Scenario 4, what a proxy costs: start-up time until the first request is answered, resident
//! memory idle and under Istio's 1000 rps load, CPU per 1000 requests at that load, and memory
//! per idle connection, HTTP keep-alive and TCP separately:
//! (RSS with N idle connections − RSS idle) / N. Each measurement gets a fresh proxy, so one
//! does not inherit another's allocator state; the rounds are interleaved across proxies and
//! each figure is the median of the rounds, with their spread.

use super::measure::{measure_quietly, repeated_note};
use super::{
    cpu_ms_per_1000, interleaved, latency, median, mib, seconds, summarize, Bench, Contender,
    FLOOR_NOTE,
};
use crate::open_loop::{self, Plan};
use crate::proxy_config::{Mode, Proxy};
use crate::report::{Column, Figure, Table};
use crate::tcp_load;

/// How to read the wake-ups column, and why it sits beside CPU.
const WAKE_UPS_NOTE: &str = "Wake-ups: the times the proxy's threads were put on a CPU (schedstat), per request, over the same 1000 rps run. At this rate a proxy sleeps between events, and being woken costs CPU of its own (the machine line \"a wake-up costs\" measures it without any proxy): wake-ups × that cost is a floor under every proxy's CPU per request that no proxy's code sets.";

/// How to read the two columns that split CPU per request around the wake-ups.
const PER_WAKE_UP_NOTE: &str = "CPU per wake-up: CPU per request ÷ wake-ups per request, to read beside the machine line's bare wake-up (a thread that only reads one byte and answers one). Beyond bare wake-ups: CPU per request − wake-ups per request × that bare wake-up, in µs per request: what a proxy's own work costs on top of the sleeping and waking every proxy pays here (blank without the probe). Above the floor: CPU per request − the floor row's in the round of the same number, in µs: the same question answered by measuring a proxy that does nothing but relay, rather than estimating from the probe (blank without a floor row). None is a target; they say how much of a CPU ratio the proxies' code decides.";

/// Positions in the table's columns (and in each round's values) of the figures the progress
/// line prints, so that a column added before them moves them in one place.
const START_UP: usize = 0;
const RSS_IDLE: usize = 1;
const CPU: usize = 3;
const ABOVE_FLOOR: usize = 7;
const PER_IDLE_HTTP: usize = 8;
const PER_IDLE_TCP: usize = 9;

/// Connections opened at once while building up the idle set.
pub(super) const OPEN_PARALLEL: usize = 64;

/// Runs the scenario for every proxy (no proxy has no cost to measure).
pub fn run(bench: &Bench) -> Table {
    let s = &bench.settings;
    let n = s.idle_connections;
    let mut table = Table::new("cost", "4. Cost: start-up, memory, CPU", columns());
    table.notes.push(format!("{} rounds, interleaved across proxies; every figure is the median of the rounds (min–max in brackets). Start-up: from spawn until a request through the proxy is answered (each round: the median of its three starts). RSS: VmRSS of the proxy's processes (nginx: master + worker).", s.rounds));
    table.notes.push(format!(
        "Per idle connection: (RSS with {n} idle connections − RSS idle) / {n}; each connection first carries one request and its 1 KiB answer, so every hop is established, then stays open and idle. HTTP: the proxy in its L7 HTTP/1.1 mode; TCP: in TCP mode."
    ));
    if let Some(note) = &s.idle_connections_note {
        table.notes.push(note.clone());
    }
    table.notes.push(format!(
        "1000 rps: the latency scenario's open-loop load ({} connections), {} per proxy and round.",
        latency::CONNECTIONS,
        seconds(s.run)
    ));
    table.notes.push(WAKE_UPS_NOTE.to_string());
    table.notes.push(PER_WAKE_UP_NOTE.to_string());
    table.notes.push(FLOOR_NOTE.to_string());
    let proxies: Vec<Proxy> = s
        .contenders(&[Proxy::Floor])
        .into_iter()
        .filter(|p| *p != Proxy::NoProxy)
        .collect();
    let mut results = interleaved("cost", &proxies, s.rounds, |proxy| {
        one_round(bench, proxy, n)
    });
    above_the_floor(&mut results);
    for (proxy, rounds) in results {
        let mut notes: Vec<String> = vec![];
        let mut repeated = 0;
        let per_round = rounds
            .into_iter()
            .map(|round| {
                let round = round?;
                repeated += round.repeated;
                for note in round.notes {
                    if !notes.contains(&note) {
                        notes.push(note);
                    }
                }
                Ok(round.values)
            })
            .collect();
        match summarize(per_round) {
            Err(why) => table.push_missing(proxy.name(), why),
            Ok((values, rounds_note)) => {
                let median = |i: usize| Figure::median_of(&values[i]);
                eprintln!(
                    "  {}: start-up {:.1} ms, idle {:.1} MiB, {:.1} KiB/HTTP conn, {:.1} KiB/TCP conn (medians)",
                    proxy.name(),
                    median(START_UP),
                    median(RSS_IDLE),
                    median(PER_IDLE_HTTP),
                    median(PER_IDLE_TCP)
                );
                notes.extend(repeated_note(repeated).map(|n| format!("1000 rps: {n}")));
                notes.extend(rounds_note);
                table.push(
                    proxy.name(),
                    values,
                    (!notes.is_empty()).then(|| notes.join("; ")),
                );
            }
        }
    }
    table
}

/// The table's columns, in the order each round's values come.
fn columns() -> Vec<Column> {
    vec![
        Column::new("start-up", "ms", 1).with_peer_ratios(),
        Column::new("RSS idle", "MiB", 1).with_peer_ratios(),
        Column::new("RSS at 1000 rps", "MiB", 1).with_peer_ratios(),
        Column::new("CPU / 1000 req at 1000 rps", "ms", 1).with_peer_ratios(),
        Column::new("wake-ups / req at 1000 rps", "", 2),
        Column::new("CPU per wake-up at 1000 rps", "µs", 1).with_peer_ratios(),
        Column::new("CPU / req beyond bare wake-ups", "µs", 1).with_peer_ratios(),
        Column::new("CPU / req above the floor", "µs", 1).with_peer_ratios(),
        Column::new("per idle HTTP conn", "KiB", 1).with_peer_ratios(),
        Column::new("per idle TCP conn", "KiB", 1).with_peer_ratios(),
        Column::new("RSS idle, TCP mode", "MiB", 1),
    ]
}

/// One round of every cost measurement for a proxy, each with a fresh proxy.
struct CostRound {
    /// In the table's column order.
    values: Vec<Option<f64>>,
    notes: Vec<String>,
    /// How many times the 1000 rps measurement was taken again for steal.
    repeated: usize,
}

/// Measures one round; `Err` when the proxy cannot start at all.
fn one_round(bench: &Bench, proxy: Proxy, n: usize) -> Result<CostRound, String> {
    let s = &bench.settings;
    let mut startups = vec![];
    let mut notes = vec![];

    let c = bench.start(proxy, Mode::Http1, bench.upstream)?;
    startups.extend(c.startup);
    let http_idle = Ok(idle_memory(bench, &c, n));
    drop(c);
    let (rss_idle, per_http) = idle_columns("HTTP", http_idle, &mut notes);

    let plan = Plan {
        rate: latency::RATE,
        connections: latency::CONNECTIONS,
        warmup: s.warmup,
        duration: s.run,
    };
    let (under_load, repeated) = measure_quietly(proxy.name(), || {
        bench.start(proxy, Mode::Http1, bench.upstream).map(|c| {
            startups.extend(c.startup);
            bench.measure_after(&c, plan.warmup, || {
                bench.block_on(open_loop::run(c.addr, plan))
            })
        })
    });
    let (rss_load, cpu, wake_ups) = match under_load {
        Ok((Ok(outcome), cost)) => (
            cost.max_rss_kib.map(mib),
            cost.cpu_seconds
                .map(|c| cpu_ms_per_1000(c, outcome.requests)),
            cost.slices
                .map(|n| n as f64 / outcome.requests.max(1) as f64),
        ),
        Ok((Err(e), _)) => {
            notes.push(format!("1000 rps: {e:#}"));
            (None, None, None)
        }
        Err(e) => {
            notes.push(format!("1000 rps: {e}"));
            (None, None, None)
        }
    };

    let (per_wake_up, beyond_wake_ups) = around_wake_ups(cpu, wake_ups, s.bare_wake_up_us);

    let tcp_idle = bench.start(proxy, Mode::Tcp, bench.upstream).map(|c| {
        startups.extend(c.startup);
        idle_memory(bench, &c, n)
    });
    let (rss_idle_tcp, per_tcp) = idle_columns("TCP", tcp_idle, &mut notes);
    let startup_ms = median(startups).map(|d| d.as_secs_f64() * 1000.0);
    Ok(CostRound {
        values: vec![
            startup_ms,
            rss_idle.map(mib),
            rss_load,
            cpu,
            wake_ups,
            per_wake_up,
            beyond_wake_ups,
            // Filled in once the floor's round of the same number is known.
            None,
            per_http,
            per_tcp,
            rss_idle_tcp.map(mib),
        ],
        notes,
        repeated,
    })
}

/// Fills each round's CPU per request above the floor: the round's figure less the floor's in
/// the round of the same number (interleaving makes them neighbours in time, as no proxy's
/// round is for the latency scenario's added latency). Blank without a floor figure.
fn above_the_floor(results: &mut [(Proxy, Vec<Result<CostRound, String>>)]) {
    let floor: Vec<Option<f64>> = results
        .iter()
        .find(|(p, _)| *p == Proxy::Floor)
        .map(|(_, rounds)| {
            rounds
                .iter()
                .map(|r| r.as_ref().ok().and_then(|r| r.values[CPU]))
                .collect()
        })
        .unwrap_or_default();
    for (_, rounds) in results.iter_mut() {
        for (i, round) in rounds.iter_mut().enumerate() {
            if let Ok(round) = round {
                let base = floor.get(i).copied().flatten();
                round.values[ABOVE_FLOOR] = round.values[CPU].zip(base).map(|(c, f)| c - f);
            }
        }
    }
}

/// CPU per request at 1000 rps (ms per 1000 requests, which is µs per request) split around
/// the wake-ups: what each wake-up cost the proxy, and what the proxy spent per request beyond
/// what its wake-ups would have cost a bare thread (`bare_us` per wake-up, the machine probe).
fn around_wake_ups(
    cpu_us_per_request: Option<f64>,
    wake_ups_per_request: Option<f64>,
    bare_us: Option<f64>,
) -> (Option<f64>, Option<f64>) {
    let (Some(cpu), Some(wake_ups)) = (cpu_us_per_request, wake_ups_per_request) else {
        return (None, None);
    };
    let per_wake_up = (wake_ups > 0.0).then(|| cpu / wake_ups);
    let beyond = bare_us.map(|bare| cpu - wake_ups * bare);
    (per_wake_up, beyond)
}

/// Idle RSS and KiB per connection from one idle-memory measurement, noting what went wrong.
fn idle_columns(
    mode: &str,
    measured: Result<IdleMemory, String>,
    notes: &mut Vec<String>,
) -> (Option<u64>, Option<f64>) {
    match measured {
        Ok(m) => {
            if let Some(failure) = m.failure {
                notes.push(format!("{mode}: {failure}"));
            }
            (Some(m.rss_idle_kib), m.per_connection_kib)
        }
        Err(why) => {
            notes.push(format!("{mode}: {why}"));
            (None, None)
        }
    }
}

/// Memory of a proxy idle and per idle connection.
struct IdleMemory {
    rss_idle_kib: u64,
    per_connection_kib: Option<f64>,
    /// How many connections failed, and the first one's error.
    failure: Option<String>,
}

fn idle_memory(bench: &Bench, contender: &Contender, n: usize) -> IdleMemory {
    let settle = bench.settings.settle;
    std::thread::sleep(settle);
    let rss_idle_kib = contender.usage().map_or(0, |u| u.rss_kib);
    let idle = bench.block_on(tcp_load::open_idle(contender.addr, n, OPEN_PARALLEL));
    std::thread::sleep(settle);
    let with = contender.usage().map_or(0, |u| u.rss_kib);
    let open = idle.streams.len();
    let failure = (idle.failed > 0).then(|| {
        format!(
            "{} of {n} idle connections failed ({})",
            idle.failed,
            idle.first_error.as_deref().unwrap_or("?")
        )
    });
    if let Some(f) = &failure {
        eprintln!("  {f}");
    }
    drop(idle);
    // Divided by the connections that did open (a refused one holds nothing); with too many
    // failures (over half) the difference says little, so report nothing rather than a guess.
    let per_connection_kib =
        (open * 2 >= n).then(|| with.saturating_sub(rss_idle_kib) as f64 / open as f64);
    IdleMemory {
        rss_idle_kib,
        per_connection_kib,
        failure,
    }
}

#[cfg(test)]
mod tests {
    use super::{
        above_the_floor, around_wake_ups, columns, CostRound, ABOVE_FLOOR, CPU, PER_IDLE_HTTP,
        PER_IDLE_TCP, RSS_IDLE, START_UP,
    };
    use crate::proxy_config::Proxy;

    /// A round whose only figure is its CPU per request.
    fn round(cpu: Option<f64>) -> Result<CostRound, String> {
        let mut values = vec![None; columns().len()];
        values[CPU] = cpu;
        Ok(CostRound {
            values,
            notes: vec![],
            repeated: 0,
        })
    }

    #[test]
    fn each_round_is_measured_above_the_floors_round_of_the_same_number() {
        let mut results = vec![
            (
                Proxy::Remora,
                vec![round(Some(72.0)), round(Some(75.0)), round(Some(70.0))],
            ),
            (
                Proxy::Haproxy,
                vec![round(Some(80.0)), Err("failed".into()), round(None)],
            ),
            (
                Proxy::Floor,
                vec![round(Some(64.0)), round(Some(60.0)), round(None)],
            ),
        ];
        above_the_floor(&mut results);
        let above = |p: usize, r: usize| results[p].1[r].as_ref().unwrap().values[ABOVE_FLOOR];
        assert_eq!(above(0, 0), Some(8.0));
        assert_eq!(above(0, 1), Some(15.0));
        assert_eq!(
            above(0, 2),
            None,
            "the floor's third round measured nothing"
        );
        assert_eq!(above(1, 0), Some(16.0));
        assert_eq!(above(2, 0), Some(0.0));
        // Without a floor row the column stays blank.
        let mut alone = vec![(Proxy::Remora, vec![round(Some(72.0))])];
        above_the_floor(&mut alone);
        assert_eq!(alone[0].1[0].as_ref().unwrap().values[ABOVE_FLOOR], None);
    }

    #[test]
    fn the_progress_line_reads_the_columns_it_names() {
        let names = [
            "start-up",
            "RSS idle",
            "CPU / 1000 req at 1000 rps",
            "CPU / req above the floor",
            "per idle HTTP conn",
            "per idle TCP conn",
        ];
        let positions = [
            START_UP,
            RSS_IDLE,
            CPU,
            ABOVE_FLOOR,
            PER_IDLE_HTTP,
            PER_IDLE_TCP,
        ];
        for (name, at) in names.into_iter().zip(positions) {
            assert_eq!(columns()[at].name, name, "column {at}");
        }
    }

    #[test]
    fn cpu_per_request_splits_into_wake_ups_and_what_lies_beyond_them() {
        // 67.6 µs per request at 1.81 wake-ups, a bare wake-up costing 33.1 µs.
        let (per, beyond) = around_wake_ups(Some(67.6), Some(1.81), Some(33.1));
        assert!((per.unwrap() - 37.35).abs() < 0.01, "{per:?}");
        assert!((beyond.unwrap() - 7.689).abs() < 0.001, "{beyond:?}");
        // Without the probe only the per-wake-up figure is known.
        assert_eq!(around_wake_ups(Some(67.6), Some(1.81), None).1, None);
        assert!(around_wake_ups(Some(67.6), Some(1.81), None).0.is_some());
        // A run that measured no CPU, or no wake-up at all, has neither.
        assert_eq!(around_wake_ups(None, Some(1.8), Some(33.0)), (None, None));
        assert_eq!(around_wake_ups(Some(60.0), None, Some(33.0)), (None, None));
        assert_eq!(around_wake_ups(Some(60.0), Some(0.0), None), (None, None));
    }
}
