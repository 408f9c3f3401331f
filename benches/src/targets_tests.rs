//! The targets judged from hand-made tables: which row and column each reads, the rounds
//! paired by number, and the floor's ratio beside the verdict.

use super::*;
use crate::report::{Column, Figure};

fn f(v: f64) -> Option<Figure> {
    Some(Figure::single(v))
}

fn one_column(id: &str, column: Column) -> Table {
    Table::new(id, "t", vec![column])
}

/// A figure with its rounds, in the order they ran (NaN for a failed one).
fn fig(each: &[f64]) -> Option<Figure> {
    let mut f = Figure::of(each).unwrap();
    f.each = each.to_vec();
    Some(f)
}

/// The verdict of the target whose name starts with `name`.
fn verdict<'a>(verdicts: &'a [Verdict], name: &str) -> &'a Verdict {
    verdicts
        .iter()
        .find(|v| v.target.starts_with(name))
        .unwrap()
}

/// The traffic-management targets read the row routed by xDS, never the explicit one, and
/// CPU per request both at saturation and at 1000 rps.
#[test]
fn traffic_targets_read_the_routed_row() {
    let mut t = Table::new(
        "traffic-http1",
        "t",
        vec![
            Column::new("req/s per proxy core", "", 0).with_peer_ratios(),
            Column::new("proxy CPU / 1000 req at max", "ms", 1).with_peer_ratios(),
            Column::new("CPU / 1000 req at 1000 rps", "ms", 1).with_peer_ratios(),
        ],
    );
    t.push(REMORA, vec![f(1.0), f(1.0), f(1.0)], None);
    t.push(REMORA_XDS, vec![f(30_000.0), f(10.0), f(30.0)], None);
    t.push("haproxy", vec![f(25_000.0), f(11.0), f(40.0)], None);
    t.push("envoy", vec![f(10_000.0), f(50.0), f(100.0)], None);
    let verdicts = judge(&[t]);
    let rps = verdict(&verdicts, "traffic management: HTTP/1.1 rps per core");
    assert_eq!((rps.measured, rps.result.as_str()), (Some(1.2), "pass"));
    let at_max = verdict(&verdicts, "traffic management: CPU per request at max");
    assert_eq!(
        (at_max.measured, at_max.result.as_str()),
        (Some(0.2), "pass")
    );
    let steady = verdict(&verdicts, "traffic management: CPU per request at 1000 rps");
    assert_eq!(
        (steady.measured, steady.result.as_str()),
        (Some(0.3), "fail")
    );
}

#[test]
fn targets_read_remoras_median_against_the_named_row() {
    let mut http1 = one_column(
        "throughput-http1",
        Column::new("req/s per proxy core", "", 0).with_ratios(),
    );
    http1.push(REMORA, vec![f(30_000.0)], None);
    http1.push("haproxy", vec![f(25_000.0)], None);
    http1.push("envoy", vec![f(12_000.0)], None);
    let mut cost = Table::new(
        "cost",
        "c",
        vec![
            Column::new("per idle TCP conn", "KiB", 1),
            Column::new("RSS idle", "MiB", 1),
        ],
    );
    cost.push(REMORA, vec![f(3.5), f(4.0)], None);
    cost.push("haproxy", vec![f(3.0), f(0.0)], None);
    let verdicts = judge(&[http1, cost]);
    let by = |name: &str| verdict(&verdicts, name);

    let vs_haproxy = by("HTTP/1.1 rps per core ≥ 1.0×");
    assert_eq!(vs_haproxy.measured, Some(1.2));
    assert_eq!(vs_haproxy.result, "pass");
    let vs_envoy = by("HTTP/1.1 rps per core ≥ 3×");
    assert_eq!(vs_envoy.measured, Some(2.5));
    assert_eq!(vs_envoy.result, "fail");
    let tcp = by("≤ 4 KiB");
    assert_eq!((tcp.measured, tcp.result.as_str()), (Some(3.5), "pass"));
    assert!(by("RSS idle").result.contains("not above zero"));
    assert!(by("TCP bulk").result.starts_with("not measured"));

    let md = markdown(&verdicts);
    assert!(
        md.contains("| HTTP/1.1 rps per core ≥ 3× Envoy's | 2.50× | fail | 0 of 1 | – | throughput-http1 / req/s per proxy core |"),
        "{md}"
    );
    assert!(md.contains("| 3.5 KiB | pass | 1 of 1 |"), "{md}");
}

#[test]
fn the_floor_row_gets_the_same_ratio_where_its_table_has_it() {
    let mut cost = one_column(
        "cost",
        Column::new("CPU / 1000 req at 1000 rps", "ms", 1).with_ratios(),
    );
    cost.push(REMORA, vec![f(76.0)], None);
    cost.push("haproxy", vec![f(80.0)], None);
    cost.push(FLOOR, vec![f(70.0)], None);
    let mut latency = one_column("latency", Column::new("added p50", "µs", 0).with_ratios());
    latency.push(REMORA, vec![f(150.0)], None);
    latency.push("haproxy", vec![f(160.0)], None);
    let verdicts = judge(&[cost, latency]);
    let cpu = verdict(&verdicts, "CPU per 1000");
    assert_eq!((cpu.measured, cpu.result.as_str()), (Some(0.95), "fail"));
    // 70 ÷ 80: past the 0.85× bound even for a proxy that parses nothing.
    assert_eq!(cpu.floor, Some(0.875));
    assert_eq!(
        verdict(&verdicts, "added p50").floor,
        None,
        "no floor row there"
    );
    assert_eq!(
        verdict(&verdicts, "≤ 4 KiB").floor,
        None,
        "absolute targets have none"
    );
    let md = markdown(&verdicts);
    assert!(
        md.contains("| 0.95× | fail | 0 of 1 | 0.88× | cost /"),
        "{md}"
    );
}

#[test]
fn rounds_are_paired_by_number_and_a_failed_round_is_left_out() {
    let mut latency = one_column("latency", Column::new("added p99", "µs", 0).with_ratios());
    // Round by round: 0.5, 2.0, (failed), 0.9, 1.2 against a bound of 1.0.
    latency.push(REMORA, vec![fig(&[100.0, 400.0, 300.0, 90.0, 120.0])], None);
    latency.push(
        "haproxy",
        vec![fig(&[200.0, 200.0, f64::NAN, 100.0, 100.0])],
        None,
    );
    let verdicts = judge(&[latency]);
    let p99 = verdict(&verdicts, "added p99");
    assert_eq!(p99.rounds_meeting, Some((2, 4)));
    // The medians decide: 120 against 150.
    assert_eq!((p99.measured, p99.result.as_str()), (Some(0.8), "pass"));
    let md = markdown(&verdicts);
    assert!(
        md.contains("| 0.80× | pass | 2 of 4 | – | latency / added p99 |"),
        "{md}"
    );
}

#[test]
fn h2c_and_grpc_are_judged_each_from_its_own_table() {
    let table = |id: &str, ours: f64| {
        let mut t = one_column(id, Column::new("req/s per proxy core", "", 0).with_ratios());
        t.push(REMORA, vec![f(ours)], None);
        t.push("envoy", vec![f(10_000.0)], None);
        t
    };
    let verdicts = judge(&[
        table("throughput-h2c", 8_000.0),
        table("throughput-grpc", 20_000.0),
    ]);
    let by = |name: &str| verdict(&verdicts, name);
    let h2c = by("h2c throughput");
    assert_eq!((h2c.measured, h2c.result.as_str()), (Some(0.8), "fail"));
    assert_eq!(
        h2c.source.as_deref(),
        Some("throughput-h2c / req/s per proxy core")
    );
    let grpc = by("gRPC throughput");
    assert_eq!((grpc.measured, grpc.result.as_str()), (Some(2.0), "pass"));
    assert_eq!(
        grpc.source.as_deref(),
        Some("throughput-grpc / req/s per proxy core")
    );
}

#[test]
fn history_pairs_rounds_across_saved_runs() {
    let run = |ours: &[f64], theirs: &[f64]| {
        let mut cost = one_column(
            "cost",
            Column::new("CPU / 1000 req at 1000 rps", "ms", 1).with_ratios(),
        );
        cost.push(REMORA, vec![fig(ours)], None);
        cost.push("haproxy", vec![fig(theirs)], None);
        serde_json::json!({ "tables": [cost.json()] })
    };
    // Paired: 0.8, 0.9, (failed), then 0.5, 1.0 against a bound of 0.85.
    let runs = vec![
        (
            "a".to_string(),
            run(&[80.0, 90.0, 70.0], &[100.0, 100.0, f64::NAN]),
        ),
        ("b".to_string(), run(&[50.0, 100.0], &[100.0, 100.0])),
        // A run saved before rounds were kept counts for nothing.
        (
            "old".to_string(),
            serde_json::json!({ "tables": [{ "id": "cost", "rows": [
                { "proxy": "remora", "values": { "CPU / 1000 req at 1000 rps (ms)": { "median": 1.0 } } },
                { "proxy": "haproxy", "values": { "CPU / 1000 req at 1000 rps (ms)": { "median": 2.0 } } },
            ] }] }),
        ),
    ];
    let history = history(&runs);
    let cpu = history
        .iter()
        .find(|h| h.target.starts_with("CPU per 1000"))
        .unwrap();
    assert_eq!(cpu.rounds, vec![0.8, 0.9, 0.5, 1.0]);
    assert_eq!(cpu.met, 2);
    // The verdict figures are the medians': 80 against 100, 75 against 100.
    assert_eq!(
        cpu.runs,
        vec![("a".to_string(), 0.8), ("b".to_string(), 0.75)]
    );
    let md = history_markdown(&history);
    assert!(
        md.contains("| CPU per 1000 requests ≤ 0.85× HAProxy's | 2 | 0.85 | 2 of 4 | 0.80, 0.75 |"),
        "{md}"
    );
    assert!(
        md.contains("| TCP bulk ≥ 0.8× no proxy | 0 | – | 0 of 0 |  |"),
        "{md}"
    );
}
