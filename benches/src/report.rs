//! Results as tables: one per scenario, a row per contender, absolute numbers and, for the
//! headline columns, ratios against no proxy and against Envoy (ratios travel between noisy
//! machines better than absolute numbers). Rendered as markdown and as JSON.

use serde::Serialize;
use serde_json::json;
use std::fmt::Write as _;

/// The rows ratios are taken against.
pub const NO_PROXY: &str = "no-proxy";
pub const ENVOY: &str = "envoy";

/// One column of numbers.
#[derive(Debug, Clone, Serialize)]
pub struct Column {
    pub name: String,
    /// Printed after the name, e.g. `µs`.
    pub unit: String,
    pub decimals: usize,
    /// The rows this column's ratio columns divide by, if it has any.
    pub baselines: Vec<String>,
}

impl Column {
    /// A column without ratios.
    pub fn new(name: &str, unit: &str, decimals: usize) -> Column {
        Column {
            name: name.into(),
            unit: unit.into(),
            decimals,
            baselines: vec![],
        }
    }

    /// A headline column: ratios against no proxy and against Envoy follow it.
    pub fn with_ratios(mut self) -> Column {
        self.baselines = vec![NO_PROXY.into(), ENVOY.into()];
        self
    }

    /// A cost column: a ratio against Envoy follows it (no proxy costs nothing).
    pub fn with_envoy_ratio(mut self) -> Column {
        self.baselines = vec![ENVOY.into()];
        self
    }
}

/// One contender's numbers; `None` where it was not measured.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub proxy: String,
    pub values: Vec<Option<f64>>,
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

    /// Adds a row of measured values (one per column).
    pub fn push(&mut self, proxy: &str, values: Vec<Option<f64>>, note: Option<String>) {
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

    /// `row`'s value in `column` divided by the `baseline` row's.
    pub fn ratio(&self, row: &Row, column: usize, baseline: &str) -> Option<f64> {
        let base = self.rows.iter().find(|r| r.proxy == baseline)?.values[column]?;
        let value = row.values[column]?;
        (base != 0.0).then(|| value / base)
    }

    /// The table as markdown: a heading, the notes, then the table.
    pub fn markdown(&self) -> String {
        let mut out = format!("### {}\n\n", self.title);
        for note in &self.notes {
            let _ = writeln!(out, "- {note}");
        }
        if !self.notes.is_empty() {
            out.push('\n');
        }
        let mut header = vec!["proxy".to_string()];
        for c in &self.columns {
            header.push(if c.unit.is_empty() {
                c.name.clone()
            } else {
                format!("{} ({})", c.name, c.unit)
            });
            for baseline in &c.baselines {
                header.push(format!("{} ÷ {baseline}", c.name));
            }
        }
        header.push("note".into());
        let _ = writeln!(out, "| {} |", header.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
        for row in &self.rows {
            let mut cells = vec![row.proxy.clone()];
            for (i, c) in self.columns.iter().enumerate() {
                cells.push(row.values[i].map_or("–".into(), |v| format_number(v, c.decimals)));
                for baseline in &c.baselines {
                    cells.push(
                        self.ratio(row, i, baseline)
                            .map_or("–".into(), |r| format!("{r:.2}×")),
                    );
                }
            }
            cells.push(row.note.clone().unwrap_or_default());
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        out
    }

    /// The table as JSON, with every ratio spelled out.
    pub fn json(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|row| {
                let mut values = serde_json::Map::new();
                let mut ratios = serde_json::Map::new();
                for (i, c) in self.columns.iter().enumerate() {
                    let key = if c.unit.is_empty() {
                        c.name.clone()
                    } else {
                        format!("{} ({})", c.name, c.unit)
                    };
                    values.insert(key.clone(), json!(row.values[i]));
                    if !c.baselines.is_empty() {
                        let by: serde_json::Map<String, serde_json::Value> = c
                            .baselines
                            .iter()
                            .map(|b| {
                                (
                                    format!("vs_{}", b.replace('-', "_")),
                                    json!(self.ratio(row, i, b)),
                                )
                            })
                            .collect();
                        ratios.insert(key, serde_json::Value::Object(by));
                    }
                }
                json!({ "proxy": row.proxy, "values": values, "ratios": ratios, "note": row.note })
            })
            .collect();
        json!({ "id": self.id, "title": self.title, "notes": self.notes, "rows": rows })
    }
}

/// Thousands separated by a thin space would confuse parsers; plain digits, fixed decimals.
fn format_number(v: f64, decimals: usize) -> String {
    format!("{v:.decimals$}")
}

/// A whole run: what ran, where, and the tables.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub started: String,
    pub command: String,
    pub quick: bool,
    /// Facts about the machine and the pinning.
    pub setup: Vec<String>,
    /// Each program's version line.
    pub versions: Vec<(String, String)>,
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
        for line in &self.setup {
            let _ = writeln!(out, "- {line}");
        }
        if !self.versions.is_empty() {
            out.push_str("\nVersions:\n\n");
            for (name, version) in &self.versions {
                let _ = writeln!(out, "- {name}: {version}");
            }
        }
        out.push('\n');
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
            "setup": self.setup,
            "versions": self.versions.iter().map(|(n, v)| json!({"name": n, "version": v})).collect::<Vec<_>>(),
            "tables": self.tables.iter().map(Table::json).collect::<Vec<_>>(),
            "skipped": self.skipped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        let mut t = Table::new(
            "t",
            "Throughput",
            vec![
                Column::new("req/s", "", 0).with_ratios(),
                Column::new("errors", "", 0),
                Column::new("CPU", "ms", 0).with_envoy_ratio(),
            ],
        );
        t.push(NO_PROXY, vec![Some(100.0), Some(0.0), None], None);
        t.push("remora", vec![Some(50.0), Some(1.0), Some(3.0)], None);
        t.push(ENVOY, vec![Some(25.0), Some(0.0), Some(6.0)], None);
        t.push_missing("nginx", "not installed".into());
        t
    }

    #[test]
    fn ratios_are_against_no_proxy_and_envoy() {
        let t = table();
        let remora = &t.rows[1];
        assert_eq!(t.ratio(remora, 0, NO_PROXY), Some(0.5));
        assert_eq!(t.ratio(remora, 0, ENVOY), Some(2.0));
        assert_eq!(t.ratio(&t.rows[3], 0, ENVOY), None);
    }

    #[test]
    fn markdown_and_json_carry_the_same_numbers() {
        let t = table();
        let md = t.markdown();
        assert!(md.contains("| proxy | req/s | req/s ÷ no-proxy | req/s ÷ envoy | errors | CPU (ms) | CPU ÷ envoy | note |"), "{md}");
        assert!(
            md.contains("| remora | 50 | 0.50× | 2.00× | 1 | 3 | 0.50× |  |"),
            "{md}"
        );
        assert!(
            md.contains("| nginx | – | – | – | – | – | – | not installed |"),
            "{md}"
        );
        let json = t.json();
        assert_eq!(json["rows"][1]["ratios"]["req/s"]["vs_envoy"], 2.0);
        assert_eq!(json["rows"][1]["ratios"]["req/s"]["vs_no_proxy"], 0.5);
        assert_eq!(json["rows"][1]["ratios"]["CPU (ms)"]["vs_envoy"], 0.5);
        assert!(json["rows"][1]["ratios"]["CPU (ms)"]
            .get("vs_no_proxy")
            .is_none());
        assert_eq!(json["rows"][3]["note"], "not installed");
    }
}
