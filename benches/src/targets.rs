//! The benchmark issue's targets for Remora, judged from a run's tables: each target names the
//! figure it reads (table and column), what Remora's median is compared with (a peer's median
//! in the same run, no proxy's, or an absolute bound) and which way it must fall.

use crate::report::{Table, NO_PROXY};
use serde::Serialize;
use std::fmt::Write as _;

/// The row the targets are about.
pub const REMORA: &str = "remora";

/// What a figure is compared with.
#[derive(Debug, Clone, Copy)]
enum Against {
    /// Remora ÷ this row, in the same run.
    Row(&'static str),
    /// The figure itself, in the column's unit.
    Absolute(&'static str),
}

/// Which way the comparison must go.
#[derive(Debug, Clone, Copy)]
enum Bound {
    AtLeast(f64),
    AtMost(f64),
}

/// One target: `figure` (the first of `sources` that was measured) against `against`.
struct Target {
    name: &'static str,
    /// (table id, column name), in order of preference.
    sources: &'static [(&'static str, &'static str)],
    against: Against,
    bound: Bound,
}

const HTTP1_PER_CORE: &[(&str, &str)] = &[("throughput-http1", "req/s per proxy core")];
const GRPC_PER_CORE: &[(&str, &str)] = &[("throughput-grpc", "req/s per proxy core")];
const H2C_PER_CORE: &[(&str, &str)] = &[("throughput-h2c", "req/s per proxy core")];

/// The list (one worker each, ratios in the same run).
const TARGETS: [Target; 12] = [
    Target {
        name: "HTTP/1.1 rps per core ≥ 1.0× HAProxy's",
        sources: HTTP1_PER_CORE,
        against: Against::Row("haproxy"),
        bound: Bound::AtLeast(1.0),
    },
    Target {
        name: "HTTP/1.1 rps per core ≥ 3× Envoy's",
        sources: HTTP1_PER_CORE,
        against: Against::Row("envoy"),
        bound: Bound::AtLeast(3.0),
    },
    Target {
        name: "added p50 at 1000 rps ≤ 1.0× HAProxy's",
        sources: &[("latency", "added p50")],
        against: Against::Row("haproxy"),
        bound: Bound::AtMost(1.0),
    },
    Target {
        name: "added p99 at 1000 rps ≤ 1.0× HAProxy's",
        sources: &[("latency", "added p99")],
        against: Against::Row("haproxy"),
        bound: Bound::AtMost(1.0),
    },
    Target {
        name: "CPU per 1000 requests ≤ 0.85× HAProxy's",
        sources: &[
            ("cost", "CPU / 1000 req at 1000 rps"),
            ("latency", "proxy CPU / 1000 req"),
        ],
        against: Against::Row("haproxy"),
        bound: Bound::AtMost(0.85),
    },
    Target {
        name: "RSS idle ≤ 0.6× HAProxy's",
        sources: &[("cost", "RSS idle")],
        against: Against::Row("haproxy"),
        bound: Bound::AtMost(0.6),
    },
    Target {
        name: "RSS under load ≤ 0.6× HAProxy's",
        sources: &[("cost", "RSS at 1000 rps"), ("latency", "proxy RSS")],
        against: Against::Row("haproxy"),
        bound: Bound::AtMost(0.6),
    },
    Target {
        name: "≤ 4 KiB per idle TCP connection",
        sources: &[("cost", "per idle TCP conn")],
        against: Against::Absolute("KiB"),
        bound: Bound::AtMost(4.0),
    },
    Target {
        name: "≤ 16 KiB per idle HTTP keep-alive connection",
        sources: &[("cost", "per idle HTTP conn")],
        against: Against::Absolute("KiB"),
        bound: Bound::AtMost(16.0),
    },
    Target {
        name: "TCP bulk ≥ 0.8× no proxy",
        sources: &[("tcp-bulk", "throughput")],
        against: Against::Row(NO_PROXY),
        bound: Bound::AtLeast(0.8),
    },
    // The issue names both: plain HTTP/2 (h2c) and gRPC over it, each its own table.
    Target {
        name: "h2c throughput per core ≥ Envoy's",
        sources: H2C_PER_CORE,
        against: Against::Row("envoy"),
        bound: Bound::AtLeast(1.0),
    },
    Target {
        name: "gRPC throughput per core ≥ Envoy's",
        sources: GRPC_PER_CORE,
        against: Against::Row("envoy"),
        bound: Bound::AtLeast(1.0),
    },
];

/// How one target came out.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub target: String,
    /// Where the figure came from: `table / column`.
    pub source: Option<String>,
    /// Remora's ratio to the other row, or the figure itself for absolute targets.
    pub measured: Option<f64>,
    /// The unit of `measured`: `×` for ratios.
    pub unit: String,
    /// `pass`, `fail`, or `not measured` (and why).
    pub result: String,
}

/// Judges every target against `tables`.
pub fn judge(tables: &[Table]) -> Vec<Verdict> {
    TARGETS.iter().map(|t| judge_one(t, tables)).collect()
}

fn judge_one(target: &Target, tables: &[Table]) -> Verdict {
    let unit = match target.against {
        Against::Row(_) => "×".to_string(),
        Against::Absolute(unit) => unit.to_string(),
    };
    let mut verdict = Verdict {
        target: target.name.into(),
        source: None,
        measured: None,
        unit,
        result: "not measured".into(),
    };
    let found = target.sources.iter().find_map(|(id, column)| {
        let table = tables.iter().find(|t| t.id == *id)?;
        let ours = table.figure(REMORA, column)?;
        Some((table, *id, *column, ours))
    });
    let Some((table, id, column, ours)) = found else {
        verdict.result = "not measured: Remora has no figure for it in this run".into();
        return verdict;
    };
    verdict.source = Some(format!("{id} / {column}"));
    let measured = match target.against {
        Against::Absolute(_) => Some(ours.median),
        Against::Row(other) => match table.figure(other, column) {
            Some(theirs) if theirs.median > 0.0 => Some(ours.median / theirs.median),
            Some(_) => {
                verdict.result = format!("not measured: {other}'s figure is not above zero");
                return verdict;
            }
            None => {
                verdict.result = format!("not measured: no {other} figure in this run");
                return verdict;
            }
        },
    };
    verdict.measured = measured;
    let pass = match (target.bound, measured) {
        (Bound::AtLeast(b), Some(m)) => m >= b,
        (Bound::AtMost(b), Some(m)) => m <= b,
        (_, None) => return verdict,
    };
    verdict.result = if pass { "pass" } else { "fail" }.into();
    verdict
}

/// The verdicts as a markdown table.
pub fn markdown(verdicts: &[Verdict]) -> String {
    let mut out = String::from(
        "### Targets (Remora's medians; ratios to the other row's median in the same run)\n\n\
         | target | measured | result | from |\n|---|---|---|---|\n",
    );
    for v in verdicts {
        let measured = v
            .measured
            .map_or("–".to_string(), |m| match v.unit.as_str() {
                "×" => format!("{m:.2}×"),
                unit => format!("{m:.1} {unit}"),
            });
        let _ = writeln!(
            out,
            "| {} | {measured} | {} | {} |",
            v.target,
            v.result,
            v.source.as_deref().unwrap_or("–")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Column, Figure};

    fn f(v: f64) -> Option<Figure> {
        Some(Figure::single(v))
    }

    #[test]
    fn targets_read_remoras_median_against_the_named_row() {
        let mut http1 = Table::new(
            "throughput-http1",
            "t",
            vec![Column::new("req/s per proxy core", "", 0).with_ratios()],
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
        let by = |name: &str| {
            verdicts
                .iter()
                .find(|v| v.target.starts_with(name))
                .unwrap()
        };

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
            md.contains("| HTTP/1.1 rps per core ≥ 3× Envoy's | 2.50× | fail | throughput-http1 / req/s per proxy core |"),
            "{md}"
        );
        assert!(md.contains("| 3.5 KiB | pass |"), "{md}");
    }
}
