//! Reading Remora's Prometheus text exposition.

use std::fmt;

/// One scrape of `/stats/prometheus`.
#[derive(Debug, Clone)]
pub struct Metrics {
    text: String,
    samples: Vec<Sample>,
}

#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Metrics {
    /// Parse the text format; lines that are not samples are ignored.
    pub fn parse(text: &str) -> Metrics {
        let samples = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(parse_sample)
            .collect();
        Metrics {
            text: text.to_string(),
            samples,
        }
    }

    /// The sum of every sample of `name` whose labels include all of `labels`; 0 when there is
    /// none (a counter nothing has touched yet may not be exported at all).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
            })
            .map(|s| s.value)
            .sum()
    }

    /// Whether any sample of `name` is exported.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }
}

impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// `name{k="v",...} value [timestamp]`
fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let (labels, rest) = if line[name_end..].starts_with('{') {
        parse_labels(&line[name_end + 1..])?
    } else {
        (Vec::new(), &line[name_end..])
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// Parse `k="v",k2="v2"}` and return the labels and what follows the closing brace.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    // Bounded by the line's length: each pass consumes at least one label.
    for _ in 0..=s.len() {
        s = s.trim_start_matches([',', ' ']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_string();
        let mut chars = s[eq + 1..].trim_start().strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        let after_quote = &s[eq + 1..].trim_start()[1..];
        s = &after_quote[end + 1..];
        labels.push((key, value));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# HELP remora_connections_opened Connections accepted.
# TYPE remora_connections_opened counter
remora_connections_opened_total{direction=\"outbound\"} 3
remora_connections_opened_total{direction=\"inbound\"} 1
remora_loop_refused_total{guard=\"own_upstream\",note=\"a \\\"quoted\\\" }\"} 2
remora_up 1
# EOF
";

    #[test]
    fn reads_labelled_and_bare_samples() {
        let m = Metrics::parse(TEXT);
        assert_eq!(
            m.value(
                "remora_connections_opened_total",
                &[("direction", "outbound")]
            ),
            3.0
        );
        assert_eq!(m.value("remora_connections_opened_total", &[]), 4.0);
        assert_eq!(
            m.value("remora_loop_refused_total", &[("guard", "own_upstream")]),
            2.0
        );
        assert_eq!(m.value("remora_up", &[]), 1.0);
    }

    #[test]
    fn absent_metrics_read_as_zero() {
        let m = Metrics::parse(TEXT);
        assert_eq!(
            m.value(
                "remora_connections_opened_total",
                &[("direction", "sideways")]
            ),
            0.0
        );
        assert!(!m.has("remora_nothing_total"));
    }
}
