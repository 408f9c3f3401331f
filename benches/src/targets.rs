//! The benchmark issue's targets for Remora, judged from a run's tables: each target names the
//! figure it reads (table and column), what Remora's median is compared with (a peer's median
//! in the same run, no proxy's, or an absolute bound) and which way it must fall.

use crate::report::{Table, NO_PROXY};
use serde::Serialize;
use std::fmt::Write as _;

/// The row the targets are about.
pub const REMORA: &str = "remora";
/// Remora routed by xDS: the row of the traffic-management targets (issue #32).
pub const REMORA_XDS: &str = "remora-xds";
/// The reference row that relays bytes and nothing else ([`crate::floor`]).
pub const FLOOR: &str = "floor";

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

impl Bound {
    fn met_by(self, figure: f64) -> bool {
        match self {
            Bound::AtLeast(b) => figure >= b,
            Bound::AtMost(b) => figure <= b,
        }
    }
}

/// One target: `figure` (the first of `sources` that was measured) against `against`.
struct Target {
    name: &'static str,
    /// Whose figure: [`REMORA`], or Remora routed by xDS ([`REMORA_XDS`]) where the table is
    /// about the routed path.
    ours: &'static str,
    /// (table id, column name), in order of preference.
    sources: &'static [(&'static str, &'static str)],
    against: Against,
    bound: Bound,
}

const HTTP1_PER_CORE: &[(&str, &str)] = &[("throughput-http1", "req/s per proxy core")];
const GRPC_PER_CORE: &[(&str, &str)] = &[("throughput-grpc", "req/s per proxy core")];
const H2C_PER_CORE: &[(&str, &str)] = &[("throughput-h2c", "req/s per proxy core")];

/// The list (one worker each, ratios in the same run).
const TARGETS: [Target; 15] = [
    Target {
        name: "HTTP/1.1 rps per core ≥ 1.0× HAProxy's",
        ours: REMORA,
        sources: HTTP1_PER_CORE,
        against: Against::Row("haproxy"),
        bound: Bound::AtLeast(1.0),
    },
    Target {
        name: "HTTP/1.1 rps per core ≥ 3× Envoy's",
        ours: REMORA,
        sources: HTTP1_PER_CORE,
        against: Against::Row("envoy"),
        bound: Bound::AtLeast(3.0),
    },
    Target {
        name: "added p50 at 1000 rps ≤ 1.0× HAProxy's",
        ours: REMORA,
        sources: &[("latency", "added p50")],
        against: Against::Row("haproxy"),
        bound: Bound::AtMost(1.0),
    },
    Target {
        name: "added p99 at 1000 rps ≤ 1.0× HAProxy's",
        ours: REMORA,
        sources: &[("latency", "added p99")],
        against: Against::Row("haproxy"),
        bound: Bound::AtMost(1.0),
    },
    Target {
        name: "CPU per 1000 requests ≤ 0.85× HAProxy's",
        ours: REMORA,
        sources: &[
            ("cost", "CPU / 1000 req at 1000 rps"),
            ("latency", "proxy CPU / 1000 req"),
        ],
        against: Against::Row("haproxy"),
        bound: Bound::AtMost(0.85),
    },
    Target {
        name: "RSS idle ≤ 0.6× HAProxy's",
        ours: REMORA,
        sources: &[("cost", "RSS idle")],
        against: Against::Row("haproxy"),
        bound: Bound::AtMost(0.6),
    },
    Target {
        name: "RSS under load ≤ 0.6× HAProxy's",
        ours: REMORA,
        sources: &[("cost", "RSS at 1000 rps"), ("latency", "proxy RSS")],
        against: Against::Row("haproxy"),
        bound: Bound::AtMost(0.6),
    },
    Target {
        name: "≤ 4 KiB per idle TCP connection",
        ours: REMORA,
        sources: &[("cost", "per idle TCP conn")],
        against: Against::Absolute("KiB"),
        bound: Bound::AtMost(4.0),
    },
    Target {
        name: "≤ 16 KiB per idle HTTP keep-alive connection",
        ours: REMORA,
        sources: &[("cost", "per idle HTTP conn")],
        against: Against::Absolute("KiB"),
        bound: Bound::AtMost(16.0),
    },
    Target {
        name: "TCP bulk ≥ 0.8× no proxy",
        ours: REMORA,
        sources: &[("tcp-bulk", "throughput")],
        against: Against::Row(NO_PROXY),
        bound: Bound::AtLeast(0.8),
    },
    // The issue names both: plain HTTP/2 (h2c) and gRPC over it, each its own table.
    Target {
        name: "h2c throughput per core ≥ Envoy's",
        ours: REMORA,
        sources: H2C_PER_CORE,
        against: Against::Row("envoy"),
        bound: Bound::AtLeast(1.0),
    },
    Target {
        name: "gRPC throughput per core ≥ Envoy's",
        ours: REMORA,
        sources: GRPC_PER_CORE,
        against: Against::Row("envoy"),
        bound: Bound::AtLeast(1.0),
    },
    // Issue #32: the same, through a weighted route with Istio's retries and outlier detection.
    Target {
        name: "traffic management: HTTP/1.1 rps per core ≥ 1.0× HAProxy's",
        ours: REMORA_XDS,
        sources: &[("traffic-http1", "req/s per proxy core")],
        against: Against::Row("haproxy"),
        bound: Bound::AtLeast(1.0),
    },
    // The issue names no load: read at saturation, where a proxy's own work is what it
    // costs, and at Istio's 1000 rps, where sleeping and waking is most of it (the floor row's
    // ratio says what any proxy can reach there).
    Target {
        name: "traffic management: CPU per request at max ≤ 0.25× Envoy's",
        ours: REMORA_XDS,
        sources: &[("traffic-http1", "proxy CPU / 1000 req at max")],
        against: Against::Row("envoy"),
        bound: Bound::AtMost(0.25),
    },
    Target {
        name: "traffic management: CPU per request at 1000 rps ≤ 0.25× Envoy's",
        ours: REMORA_XDS,
        sources: &[("traffic-http1", "CPU / 1000 req at 1000 rps")],
        against: Against::Row("envoy"),
        bound: Bound::AtMost(0.25),
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
    /// Round by round (Remora's round against the other row's round of the same number, which
    /// ran minutes apart): how many met the bound, of how many had both figures. The verdict is
    /// the medians'; this says how close to the bound the rounds were.
    pub rounds_meeting: Option<(usize, usize)>,
    /// The floor's ratio to the same row, where the target's table has a floor row: what a
    /// proxy that parses nothing reached in the same run. Above the bound, no proxy's code
    /// could have met it on this machine that hour.
    pub floor: Option<f64>,
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
        rounds_meeting: None,
        floor: None,
    };
    let found = target.sources.iter().find_map(|(id, column)| {
        let table = tables.iter().find(|t| t.id == *id)?;
        let ours = table.figure(target.ours, column)?;
        Some((table, *id, *column, ours))
    });
    let Some((table, id, column, ours)) = found else {
        verdict.result = "not measured: Remora has no figure for it in this run".into();
        return verdict;
    };
    verdict.source = Some(format!("{id} / {column}"));
    if let Against::Row(other) = target.against {
        verdict.floor = table
            .figure(FLOOR, column)
            .zip(table.figure(other, column))
            .filter(|(_, theirs)| theirs.median > 0.0)
            .map(|(floor, theirs)| floor.median / theirs.median);
    }
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
    let meets = |m: f64| target.bound.met_by(m);
    let per_round = match target.against {
        Against::Absolute(_) => paired(&ours.each, None),
        Against::Row(other) => table
            .figure(other, column)
            .map_or(vec![], |theirs| paired(&ours.each, Some(&theirs.each))),
    };
    if !per_round.is_empty() {
        let met = per_round.iter().filter(|m| meets(**m)).count();
        verdict.rounds_meeting = Some((met, per_round.len()));
    }
    let pass = match measured {
        Some(m) => meets(m),
        None => return verdict,
    };
    verdict.result = if pass { "pass" } else { "fail" }.into();
    verdict
}

/// One target over several saved runs, round by round.
#[derive(Debug, Clone, PartialEq)]
pub struct History {
    pub target: String,
    /// Each run that measured it: its name and its ratio of medians (the run's verdict figure).
    pub runs: Vec<(String, f64)>,
    /// Every round's paired ratio (or figure, for absolute targets), over all the runs.
    pub rounds: Vec<f64>,
    /// How many of `rounds` met the target.
    pub met: usize,
}

/// Every target across `runs` (a name and a run's JSON, as [`crate::report`] writes it): its
/// rounds paired as in [`Verdict::rounds_meeting`]. A run whose figures do not keep their
/// rounds (`each`, written since 22 November 2026) is left out.
pub fn history(runs: &[(String, serde_json::Value)]) -> Vec<History> {
    TARGETS
        .iter()
        .map(|target| {
            let mut h = History {
                target: target.name.into(),
                runs: vec![],
                rounds: vec![],
                met: 0,
            };
            for (name, run) in runs {
                let Some((ours, theirs)) = saved_figures(target, run) else {
                    continue;
                };
                let paired = paired(&ours.each, theirs.as_ref().map(|t| &t.each[..]));
                let medians = match &theirs {
                    None => Some(ours.median),
                    Some(t) => (t.median > 0.0).then(|| ours.median / t.median),
                };
                if let (false, Some(m)) = (paired.is_empty(), medians) {
                    h.met += paired.iter().filter(|r| target.bound.met_by(**r)).count();
                    h.rounds.extend(paired);
                    h.runs.push((name.clone(), m));
                }
            }
            h
        })
        .collect()
}

/// Round by round, in the order the rounds ran: `ours ÷ theirs` for a ratio target, or `ours`
/// itself for an absolute one. A round that failed on either side (NaN) is left out.
fn paired(ours: &[f64], theirs: Option<&[f64]>) -> Vec<f64> {
    match theirs {
        None => ours.iter().copied().filter(|v| v.is_finite()).collect(),
        Some(theirs) => ours
            .iter()
            .zip(theirs)
            .filter(|(a, b)| a.is_finite() && b.is_finite() && **b > 0.0)
            .map(|(a, b)| a / b)
            .collect(),
    }
}

/// A figure as a run's JSON keeps it; a failed round, saved as null, reads as NaN.
#[derive(Debug)]
struct SavedFigure {
    median: f64,
    each: Vec<f64>,
}

impl<'de> serde::Deserialize<'de> for SavedFigure {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        struct Saved {
            median: f64,
            #[serde(default)]
            each: Vec<Option<f64>>,
        }
        let s = Saved::deserialize(d)?;
        Ok(SavedFigure {
            median: s.median,
            each: s.each.into_iter().map(|v| v.unwrap_or(f64::NAN)).collect(),
        })
    }
}

/// Remora's figure for `target` in a saved run, and the other row's (`None` for an absolute
/// target); `None` when the run has no such figure with its rounds.
fn saved_figures(
    target: &Target,
    run: &serde_json::Value,
) -> Option<(SavedFigure, Option<SavedFigure>)> {
    let figure = |table: &serde_json::Value, row: &str, column: &str| {
        let rows = table["rows"].as_array()?;
        let values = rows.iter().find(|r| r["proxy"] == row)?["values"].as_object()?;
        // Columns are saved with their unit: `added p99 (µs)`.
        let (_, v) = values.iter().find(|(k, _)| {
            *k == column || k.strip_prefix(column).is_some_and(|u| u.starts_with(" ("))
        })?;
        serde_json::from_value::<SavedFigure>(v.clone())
            .ok()
            .filter(|f| !f.each.is_empty())
    };
    target.sources.iter().find_map(|(id, column)| {
        let table = run["tables"].as_array()?.iter().find(|t| t["id"] == *id)?;
        let ours = figure(table, target.ours, column)?;
        match target.against {
            Against::Absolute(_) => Some((ours, None)),
            Against::Row(other) => Some((ours, Some(figure(table, other, column)?))),
        }
    })
}

/// The history as a markdown table.
pub fn history_markdown(history: &[History]) -> String {
    let mut out = String::from(
        "| target | runs | median of the paired rounds | rounds meeting it | each run's verdict figure |\n\
         |---|---|---|---|---|\n",
    );
    for h in history {
        let median = crate::report::Figure::of(&h.rounds)
            .map_or("–".to_string(), |f| format!("{:.2}", f.median));
        let runs: Vec<String> = h.runs.iter().map(|(_, r)| format!("{r:.2}")).collect();
        let _ = writeln!(
            out,
            "| {} | {} | {median} | {} of {} | {} |",
            h.target,
            h.runs.len(),
            h.met,
            h.rounds.len(),
            runs.join(", ")
        );
    }
    out
}

/// The verdicts as a markdown table.
pub fn markdown(verdicts: &[Verdict]) -> String {
    let mut out = String::from(
        "### Targets (Remora's medians; ratios to the other row's median in the same run)\n\n\
         \"rounds meeting it\": the same ratio taken round by round (Remora's round against the other \
         row's round of the same number), and how many of them met the target. The result is the \
         medians'; a target that only some rounds meet sits on its bound on this machine. \
         \"the floor\": the same ratio for the floor row, a forwarder that relays bytes and parses \
         nothing; where it is past the bound too, no proxy could have met the target in this run.\n\n\
         | target | measured | result | rounds meeting it | the floor | from |\n|---|---|---|---|---|---|\n",
    );
    for v in verdicts {
        let measured = v
            .measured
            .map_or("–".to_string(), |m| match v.unit.as_str() {
                "×" => format!("{m:.2}×"),
                unit => format!("{m:.1} {unit}"),
            });
        let rounds = v
            .rounds_meeting
            .map_or("–".to_string(), |(met, of)| format!("{met} of {of}"));
        let floor = v.floor.map_or("–".to_string(), |f| format!("{f:.2}×"));
        let _ = writeln!(
            out,
            "| {} | {measured} | {} | {rounds} | {floor} | {} |",
            v.target,
            v.result,
            v.source.as_deref().unwrap_or("–")
        );
    }
    out
}

#[cfg(test)]
#[path = "targets_tests.rs"]
mod tests;
