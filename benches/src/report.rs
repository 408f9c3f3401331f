//! Results as tables: one per scenario, a row per contender. Every figure is the median of the
//! scenario's interleaved rounds with their spread (min–max); each headline column also gets a
//! matrix of ratios, row ÷ no proxy and row ÷ each peer (ratios travel between noisy machines
//! better than absolute numbers). Rendered as markdown and as JSON.

use serde::Serialize;
use serde_json::json;
use std::fmt::Write as _;

/// The row ratios against "no proxy" divide by.
pub const NO_PROXY: &str = "no-proxy";
/// Remora's peers: every ratio column has one per peer present in the table.
pub const PEERS: [&str; 3] = ["envoy", "haproxy", "nginx"];

/// One figure: the median of the rounds that measured it, and their spread.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figure {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// How many rounds it is the median of.
    pub rounds: usize,
    /// Every round's value in the order the rounds ran (a failed round is null), so that one
    /// round's figure can be read beside the same round's stolen time in another column.
    pub each: Vec<f64>,
}

impl Figure {
    /// The median and spread of `samples` (NaNs dropped); `None` when there is none. An even
    /// count takes the mean of the middle two.
    pub fn of(samples: &[f64]) -> Option<Figure> {
        let mut s: Vec<f64> = samples.iter().copied().filter(|v| !v.is_nan()).collect();
        if s.is_empty() {
            return None;
        }
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Some(Figure {
            median,
            min: s[0],
            max: s[n - 1],
            rounds: n,
            each: samples.to_vec(),
        })
    }

    /// The median of a figure that may not have been measured; NaN (printed as such) if not.
    pub fn median_of(figure: &Option<Figure>) -> f64 {
        figure.as_ref().map_or(f64::NAN, |f| f.median)
    }

    /// A figure measured once.
    pub fn single(v: f64) -> Figure {
        Figure {
            median: v,
            min: v,
            max: v,
            rounds: 1,
            each: vec![v],
        }
    }

    /// `median (min–max)`, or the median alone when there is no spread to show.
    fn cell(&self, decimals: usize) -> String {
        let f = |v: f64| format!("{v:.decimals$}");
        let (median, min, max) = (f(self.median), f(self.min), f(self.max));
        if self.rounds < 2 || min == max {
            median
        } else {
            format!("{median} ({min}–{max})")
        }
    }
}

/// Which rows a column's ratios divide by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ratios {
    None,
    /// No proxy and every peer: throughput and latency, which no proxy has too.
    NoProxyAndPeers,
    /// Every peer: costs, which no proxy does not have.
    Peers,
}

/// One column of numbers.
#[derive(Debug, Clone, Serialize)]
pub struct Column {
    pub name: String,
    /// Printed after the name, e.g. `µs`.
    pub unit: String,
    pub decimals: usize,
    pub ratios: Ratios,
}

impl Column {
    /// A column without ratios.
    pub fn new(name: &str, unit: &str, decimals: usize) -> Column {
        Column {
            name: name.into(),
            unit: unit.into(),
            decimals,
            ratios: Ratios::None,
        }
    }

    /// A headline column: ratios against no proxy and against each peer.
    pub fn with_ratios(mut self) -> Column {
        self.ratios = Ratios::NoProxyAndPeers;
        self
    }

    /// A cost column: ratios against each peer (no proxy costs nothing).
    pub fn with_peer_ratios(mut self) -> Column {
        self.ratios = Ratios::Peers;
        self
    }

    /// The name with its unit, as headers and JSON keys show it.
    pub fn label(&self) -> String {
        if self.unit.is_empty() {
            self.name.clone()
        } else {
            format!("{} ({})", self.name, self.unit)
        }
    }
}

/// One contender's numbers; `None` where it was not measured.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub proxy: String,
    pub values: Vec<Option<Figure>>,
    /// Why numbers are missing, or what to know about them.
    pub note: Option<String>,
}

/// One scenario's results.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    pub id: String,
    pub title: String,
    pub notes: Vec<String>,
    pub columns: Vec<Column>,
    pub rows: Vec<Row>,
}

impl Table {
    /// An empty table.
    pub fn new(id: &str, title: &str, columns: Vec<Column>) -> Table {
        Table {
            id: id.into(),
            title: title.into(),
            notes: vec![],
            columns,
            rows: vec![],
        }
    }

    /// Adds a row of figures (one per column).
    pub fn push(&mut self, proxy: &str, values: Vec<Option<Figure>>, note: Option<String>) {
        debug_assert_eq!(values.len(), self.columns.len());
        self.rows.push(Row {
            proxy: proxy.into(),
            values,
            note,
        });
    }

    /// Adds a row with no numbers and the reason.
    pub fn push_missing(&mut self, proxy: &str, why: String) {
        let values = vec![None; self.columns.len()];
        self.rows.push(Row {
            proxy: proxy.into(),
            values,
            note: Some(why),
        });
    }

    /// The figure of `proxy`'s row in the column named `column`, if measured.
    pub fn figure(&self, proxy: &str, column: &str) -> Option<Figure> {
        let i = self.columns.iter().position(|c| c.name == column)?;
        self.rows.iter().find(|r| r.proxy == proxy)?.values[i].clone()
    }

    /// `row`'s median in `column` divided by the `baseline` row's.
    pub fn ratio(&self, row: &Row, column: usize, baseline: &str) -> Option<f64> {
        let base = self.rows.iter().find(|r| r.proxy == baseline)?.values[column].as_ref()?;
        let value = row.values[column].as_ref()?;
        (base.median != 0.0).then(|| value.median / base.median)
    }

    /// The rows a column's ratios divide by: those its kind names that have a number in it.
    pub fn baselines(&self, column: usize) -> Vec<&str> {
        let wanted: Vec<&str> = match self.columns[column].ratios {
            Ratios::None => vec![],
            Ratios::Peers => PEERS.to_vec(),
            Ratios::NoProxyAndPeers => std::iter::once(NO_PROXY).chain(PEERS).collect(),
        };
        wanted
            .into_iter()
            .filter(|b| {
                self.rows
                    .iter()
                    .any(|r| r.proxy == *b && r.values[column].is_some())
            })
            .collect()
    }

    /// The table as markdown: a heading, the notes, the figures, then one ratio matrix per
    /// headline column (row ÷ column).
    pub fn markdown(&self) -> String {
        let mut out = format!("### {}\n\n", self.title);
        for note in &self.notes {
            let _ = writeln!(out, "- {note}");
        }
        if !self.notes.is_empty() {
            out.push('\n');
        }
        let mut header = vec!["proxy".to_string()];
        header.extend(self.columns.iter().map(Column::label));
        header.push("note".into());
        let _ = writeln!(out, "| {} |", header.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
        for row in &self.rows {
            let mut cells = vec![row.proxy.clone()];
            for (i, c) in self.columns.iter().enumerate() {
                cells.push(
                    row.values[i]
                        .as_ref()
                        .map_or("–".into(), |v| v.cell(c.decimals)),
                );
            }
            cells.push(row.note.clone().unwrap_or_default());
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        for (i, c) in self.columns.iter().enumerate() {
            let baselines = self.baselines(i);
            if baselines.is_empty() {
                continue;
            }
            let _ = write!(out, "\n| {} — row ÷ column |", c.name);
            for b in &baselines {
                let _ = write!(out, " {b} |");
            }
            let _ = writeln!(out, "\n|{}", "---|".repeat(baselines.len() + 1));
            for row in &self.rows {
                if row.proxy == NO_PROXY || row.values[i].is_none() {
                    continue;
                }
                let _ = write!(out, "| {} |", row.proxy);
                for b in &baselines {
                    let cell = match self.ratio(row, i, b) {
                        Some(r) if *b != row.proxy => format!("{r:.2}×"),
                        _ => "–".into(),
                    };
                    let _ = write!(out, " {cell} |");
                }
                out.push('\n');
            }
        }
        out
    }

    /// The table as JSON: every figure with its spread, and every ratio spelled out.
    pub fn json(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|row| {
                let mut values = serde_json::Map::new();
                let mut ratios = serde_json::Map::new();
                for (i, c) in self.columns.iter().enumerate() {
                    values.insert(c.label(), json!(row.values[i]));
                    let baselines = self.baselines(i);
                    if !baselines.is_empty() && row.values[i].is_some() {
                        let by: serde_json::Map<String, serde_json::Value> = baselines
                            .iter()
                            .filter(|b| **b != row.proxy)
                            .map(|b| {
                                (
                                    format!("vs_{}", b.replace('-', "_")),
                                    json!(self.ratio(row, i, b)),
                                )
                            })
                            .collect();
                        ratios.insert(c.label(), serde_json::Value::Object(by));
                    }
                }
                json!({ "proxy": row.proxy, "values": values, "ratios": ratios, "note": row.note })
            })
            .collect();
        json!({ "id": self.id, "title": self.title, "notes": self.notes, "rows": rows })
    }
}

/// The machine a run was measured on.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub memory_mib: Option<u64>,
    pub rlimit_nofile: u64,
    /// 1-minute load average when the run started and ended.
    pub load_average_start: String,
    pub load_average_end: String,
    /// Per core, over the whole run: the per cent of the time the core had work that the
    /// hypervisor gave to something else (steal ÷ (busy + steal)).
    pub stolen_percent: Vec<f64>,
    /// What one wake-up of a sleeping thread on the proxy's core costs in CPU, with no proxy
    /// (`None` when the cores are not pinned or the probe could not run).
    pub wake_up: Option<crate::wakeup::WakeCost>,
    /// How long one hop from the load core to a sleeping thread on the proxy's core takes, by
    /// the same probe.
    pub hop: Option<crate::wakeup::HopLatency>,
}

impl Machine {
    fn lines(&self) -> Vec<String> {
        vec![
            format!(
                "Machine: {} cores ({}), {} MiB of memory, Linux {}, RLIMIT_NOFILE {}",
                self.cores,
                self.cpu_model,
                self.memory_mib
                    .map_or_else(|| "?".to_string(), |m| m.to_string()),
                self.kernel,
                self.rlimit_nofile
            ),
            format!(
                "Load average (1 min): {} at start, {} at end; above ~2 means other work shared the cores and the numbers are noisier",
                self.load_average_start, self.load_average_end
            ),
            format!(
                "Time stolen by the hypervisor over the run, as a share of the time each core had work: {}; above ~5% other tenants of the host took the cores often enough to move tail latencies and throughput, and the per-round stolen columns show which rounds",
                if self.stolen_percent.is_empty() {
                    "not measured".to_string()
                } else {
                    self.stolen_percent
                        .iter()
                        .enumerate()
                        .map(|(core, p)| format!("core {core} {p:.1}%"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
            match self.wake_up {
                Some(w) => format!(
                    "A wake-up costs {:.1} µs of CPU on the proxy's core: a thread sleeping there, woken by one byte from the load core every {} µs and answering it, with no proxy ({:.2} wake-ups per message). A proxy at 1000 rps wakes one to two times per request (the cost table's wake-ups column), so this much of each proxy's CPU per request comes with the machine",
                    w.cpu_us_per_wake_up,
                    crate::wakeup::GAP.as_micros(),
                    w.wake_ups_per_message
                ),
                None => "A wake-up's cost: not measured (the cores are not pinned, or the kernel has no schedstat)".to_string(),
            },
            match self.hop {
                Some(h) => format!(
                    "A hop between the cores takes {:.0} µs at the median, {:.0} µs at p99 and {:.0} µs at p99.9 ({:.0} µs at most), from a write on the load core to a thread sleeping on the proxy's core having read it, {} messages {} µs apart, with no proxy; {:.2}% of hops took over {} ms. A request through a proxy makes four such hops (to the proxy, to the upstream, and both answers back) where no proxy makes none, so the machine's stalled hops land in a proxy's tail: when its share of requests over 1 ms (the latency table) nears 1%, its p99 is set by those stalls more than by the proxy",
                    h.p50_us,
                    h.p99_us,
                    h.p999_us,
                    h.max_us,
                    h.hops,
                    crate::wakeup::GAP.as_micros(),
                    h.stalled_percent,
                    crate::wakeup::STALLED_HOP.as_millis()
                ),
                None => "A hop's latency between the cores: not measured (the cores are not pinned, or the probe could not run)".to_string(),
            },
        ]
    }
}

/// A whole run: what ran, where, and the tables.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub started: String,
    pub command: String,
    pub quick: bool,
    pub machine: Machine,
    /// Facts about the setup and the pinning.
    pub setup: Vec<String>,
    /// Each program's version line.
    pub versions: Vec<(String, String)>,
    /// The targets, judged from the tables.
    pub targets: Vec<crate::targets::Verdict>,
    pub tables: Vec<Table>,
    /// Scenarios or contenders that could not run, and why.
    pub skipped: Vec<String>,
}

impl Report {
    /// The report as markdown.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "# Remora benchmark results\n\n`{}` — started {}{}\n\n",
            self.command,
            self.started,
            if self.quick {
                " (quick mode: short runs, for smoke testing only)"
            } else {
                ""
            }
        );
        for line in self.machine.lines().iter().chain(&self.setup) {
            let _ = writeln!(out, "- {line}");
        }
        if !self.versions.is_empty() {
            out.push_str("\nVersions:\n\n");
            for (name, version) in &self.versions {
                let _ = writeln!(out, "- {name}: {version}");
            }
        }
        out.push('\n');
        if !self.targets.is_empty() {
            out.push_str(&crate::targets::markdown(&self.targets));
            out.push('\n');
        }
        for table in &self.tables {
            out.push_str(&table.markdown());
            out.push('\n');
        }
        if !self.skipped.is_empty() {
            out.push_str("### Not run\n\n");
            for s in &self.skipped {
                let _ = writeln!(out, "- {s}");
            }
        }
        out
    }

    /// The report as JSON.
    pub fn json(&self) -> serde_json::Value {
        json!({
            "started": self.started,
            "command": self.command,
            "quick": self.quick,
            "machine": self.machine,
            "setup": self.setup,
            "versions": self.versions.iter().map(|(n, v)| json!({"name": n, "version": v})).collect::<Vec<_>>(),
            "targets": self.targets,
            "tables": self.tables.iter().map(Table::json).collect::<Vec<_>>(),
            "skipped": self.skipped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(v: f64) -> Option<Figure> {
        Some(Figure::single(v))
    }

    fn table() -> Table {
        let mut t = Table::new(
            "t",
            "Throughput",
            vec![
                Column::new("req/s", "", 0).with_ratios(),
                Column::new("errors", "", 0),
                Column::new("CPU", "ms", 0).with_peer_ratios(),
            ],
        );
        t.push(NO_PROXY, vec![f(100.0), f(0.0), None], None);
        t.push(
            "remora",
            vec![Figure::of(&[40.0, 50.0, 60.0]), f(1.0), f(3.0)],
            None,
        );
        t.push("envoy", vec![f(25.0), f(0.0), f(6.0)], None);
        t.push("haproxy", vec![f(50.0), f(0.0), f(2.0)], None);
        t.push_missing("nginx", "not installed".into());
        t
    }

    #[test]
    fn figures_are_medians_with_their_spread() {
        let odd = Figure::of(&[3.0, 1.0, 2.0, 10.0, 4.0]).unwrap();
        assert_eq!(
            (odd.median, odd.min, odd.max, odd.rounds),
            (3.0, 1.0, 10.0, 5)
        );
        let even = Figure::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(even.median, 2.5);
        // Every round as it ran, unsorted; a round without a value is null in JSON.
        assert_eq!(odd.each, vec![3.0, 1.0, 2.0, 10.0, 4.0]);
        let gap = Figure::of(&[2.0, f64::NAN, 4.0]).unwrap();
        assert_eq!((gap.median, gap.rounds), (3.0, 2));
        assert_eq!(
            serde_json::to_value(&gap).unwrap()["each"],
            serde_json::json!([2.0, null, 4.0])
        );
        assert_eq!(Figure::of(&[]), None);
        assert_eq!(Figure::of(&[f64::NAN]), None);
        assert_eq!(odd.cell(0), "3 (1–10)");
        assert_eq!(Figure::single(7.0).cell(1), "7.0");
    }

    #[test]
    fn ratios_are_against_no_proxy_and_each_peer_present() {
        let t = table();
        let remora = &t.rows[1];
        assert_eq!(t.ratio(remora, 0, NO_PROXY), Some(0.5));
        assert_eq!(t.ratio(remora, 0, "envoy"), Some(2.0));
        assert_eq!(t.ratio(remora, 0, "haproxy"), Some(1.0));
        assert_eq!(t.ratio(&t.rows[4], 0, "envoy"), None);
        // nginx has no number: no nginx column. CPU has no no-proxy column.
        assert_eq!(t.baselines(0), vec![NO_PROXY, "envoy", "haproxy"]);
        assert_eq!(t.baselines(1), Vec::<&str>::new());
        assert_eq!(t.baselines(2), vec!["envoy", "haproxy"]);
        assert_eq!(t.figure("remora", "CPU"), f(3.0));
    }

    #[test]
    fn markdown_and_json_carry_the_same_numbers() {
        let t = table();
        let md = t.markdown();
        assert!(
            md.contains("| proxy | req/s | errors | CPU (ms) | note |"),
            "{md}"
        );
        assert!(md.contains("| remora | 50 (40–60) | 1 | 3 |  |"), "{md}");
        assert!(md.contains("| nginx | – | – | – | not installed |"), "{md}");
        assert!(
            md.contains("| req/s — row ÷ column | no-proxy | envoy | haproxy |"),
            "{md}"
        );
        assert!(md.contains("| remora | 0.50× | 2.00× | 1.00× |"), "{md}");
        assert!(md.contains("| envoy | 0.25× | – | 0.50× |"), "{md}");
        assert!(
            md.contains("| CPU — row ÷ column | envoy | haproxy |"),
            "{md}"
        );
        assert!(md.contains("| remora | 0.50× | 1.50× |"), "{md}");
        let json = t.json();
        assert_eq!(json["rows"][1]["values"]["req/s"]["median"], 50.0);
        assert_eq!(json["rows"][1]["values"]["req/s"]["min"], 40.0);
        assert_eq!(json["rows"][1]["values"]["req/s"]["rounds"], 3);
        assert_eq!(json["rows"][1]["ratios"]["req/s"]["vs_envoy"], 2.0);
        assert_eq!(json["rows"][1]["ratios"]["req/s"]["vs_no_proxy"], 0.5);
        assert_eq!(json["rows"][1]["ratios"]["req/s"]["vs_haproxy"], 1.0);
        assert_eq!(json["rows"][1]["ratios"]["CPU (ms)"]["vs_envoy"], 0.5);
        assert!(json["rows"][1]["ratios"]["CPU (ms)"]
            .get("vs_no_proxy")
            .is_none());
        assert!(json["rows"][2]["ratios"]["req/s"].get("vs_envoy").is_none());
        assert_eq!(json["rows"][4]["note"], "not installed");
    }
}
