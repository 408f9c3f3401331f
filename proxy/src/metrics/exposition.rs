//! Prometheus text format 0.0.4, what Envoy serves on `/stats/prometheus` and what Prometheus,
//! promtool and Istio's agent parse by default.
//!
//! prometheus-client writes OpenMetrics, which differs in ways a 0.0.4 parser trips on: a
//! counter family is declared without its `_total` suffix (`# TYPE x counter`, samples
//! `x_total`), info metrics have their own type, and the text ends with `# EOF`. This rewrites
//! those few things, and bucket bounds as Envoy prints them (`le="1"`, not `le="1.0"`: `le` is
//! a string to Prometheus 2, so `{le="1000"}` in an existing query must match), and leaves every
//! other sample line as it is.

use std::collections::HashSet;

/// Convert OpenMetrics text from prometheus-client into Prometheus text format 0.0.4; the gauge
/// families named in `counters` are typed counter (Envoy's counters without `_total`, which
/// Envoy's own 0.0.4 output types counter).
pub fn openmetrics_to_text(om: &str, counters: &[String]) -> String {
    let mut out = String::with_capacity(om.len());
    // HELP comes before TYPE, but the family's 0.0.4 name depends on its type.
    let mut pending_help: Option<(&str, &str)> = None;
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            pending_help = Some((name, help));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" if !name.ends_with("_total") => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "unknown" => (name.to_string(), "untyped"),
                "gauge" if counters.iter().any(|c| c == name) => (name.to_string(), "counter"),
                other => (name.to_string(), other),
            };
            if let Some((help_name, help)) = pending_help.take() {
                if help_name == rest.split(' ').next().unwrap_or("") {
                    out.push_str(&format!("# HELP {name} {help}\n"));
                }
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        push_sample(&mut out, line);
        out.push('\n');
    }
    out
}

/// A sample line, with a whole-number bucket bound written without its fraction.
fn push_sample(out: &mut String, line: &str) {
    const LE: &str = "le=\"";
    let bucket = line
        .find('{')
        .is_some_and(|brace| line[..brace].ends_with("_bucket"));
    let bound = bucket
        .then(|| line.find(LE))
        .flatten()
        .map(|at| at + LE.len())
        .and_then(|start| Some((start, start + line[start..].find('"')?)));
    if let Some((start, end)) = bound {
        if let Some(whole) = line[start..end].strip_suffix(".0") {
            if !whole.is_empty() && whole.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
                out.push_str(&line[..start]);
                out.push_str(whole);
                out.push_str(&line[end..]);
                return;
            }
        }
    }
    out.push_str(line);
}

/// What a scrape may ask of `/stats/prometheus` beyond the whole text, as of Envoy's: `filter`
/// (a regular expression a sample must match somewhere) and `usedonly` (no counter still at
/// zero, no histogram series without an observation).
#[derive(Debug, Default)]
pub struct Selection {
    pub filter: Option<regex::Regex>,
    pub used_only: bool,
}

impl Selection {
    /// From the query's `filter` and `usedonly`; an invalid expression is the caller's 400.
    pub fn from_query(filter: Option<&str>, used_only: bool) -> Result<Self, regex::Error> {
        let filter = filter
            .filter(|f| !f.is_empty())
            .map(regex::Regex::new)
            .transpose()?;
        Ok(Selection { filter, used_only })
    }

    fn is_everything(&self) -> bool {
        self.filter.is_none() && !self.used_only
    }
}

/// The samples of Prometheus `text` that `sel` keeps, each family's HELP and TYPE lines with
/// them (a family that keeps none goes whole). Envoy matches `filter` against its own stat
/// names, which carry the cluster and listener names that are labels here, so it is matched
/// against the sample's name and labels together: `cluster.upstream_rq` and `.*httpbin.*`
/// select what they select in Envoy. Envoy calls a gauge used once it is set, which every
/// gauge here is, so gauges stay.
pub fn select(text: &str, sel: &Selection) -> String {
    if sel.is_everything() {
        return text.to_string();
    }
    let observed = if sel.used_only {
        observed_histograms(text)
    } else {
        HashSet::new()
    };
    let mut out = String::with_capacity(text.len());
    let mut header = String::new();
    let mut kind = "untyped";
    for line in text.lines() {
        if line.starts_with("# HELP ") {
            header.clear();
            header.push_str(line);
            header.push('\n');
            kind = "untyped";
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, k) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let same_family = header
                .strip_prefix("# HELP ")
                .is_some_and(|h| h.split(' ').next() == Some(name));
            if !same_family {
                header.clear();
            }
            header.push_str(line);
            header.push('\n');
            kind = k;
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or((line, ""));
        if let Some(re) = &sel.filter {
            if !re.is_match(series) {
                continue;
            }
        }
        if sel.used_only {
            let used = match kind {
                "counter" => value.parse::<f64>().ok().is_none_or(|v| v != 0.0),
                "histogram" => observed.contains(&histogram_series(series)),
                _ => true,
            };
            if !used {
                continue;
            }
        }
        out.push_str(&header);
        header.clear();
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The histogram series (name without suffix, labels without `le`) whose count is not zero.
fn observed_histograms(text: &str) -> HashSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, value)| {
            let name = series.split('{').next().unwrap_or(series);
            name.ends_with("_count") && value.parse::<f64>().is_ok_and(|v| v != 0.0)
        })
        .map(|(series, _)| histogram_series(series))
        .collect()
}

/// `h_bucket{a="b",le="1"}`, `h_sum{a="b"}` and `h_count{a="b"}` all give `h{a="b"}`.
fn histogram_series(series: &str) -> String {
    let (name, labels) = match series.split_once('{') {
        Some((name, labels)) => (name, labels.strip_suffix('}').unwrap_or(labels)),
        None => (series, ""),
    };
    let base = ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name);
    let kept: Vec<&str> = split_labels(labels)
        .into_iter()
        .filter(|l| !l.starts_with("le=\""))
        .collect();
    format!("{base}{{{}}}", kept.join(","))
}

/// Labels split at the commas between them (not those inside quoted values).
fn split_labels(labels: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, b) in labels.bytes().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            b',' if !quoted => {
                out.push(&labels[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < labels.len() {
        out.push(&labels[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_get_their_total_name_and_eof_goes() {
        let om = "# HELP x Things.\n# TYPE x counter\nx_total{a=\"b\"} 3\n# HELP g A gauge.\n# TYPE g gauge\ng 1\n# EOF\n";
        assert_eq!(
            openmetrics_to_text(om, &[]),
            "# HELP x_total Things.\n# TYPE x_total counter\nx_total{a=\"b\"} 3\n# HELP g A gauge.\n# TYPE g gauge\ng 1\n"
        );
    }

    #[test]
    fn named_gauges_are_typed_counter_as_envoy_types_its_counters() {
        let om = "# HELP envoy_x_destroy Envoy statistic.\n# TYPE envoy_x_destroy gauge\nenvoy_x_destroy 2\n\
                  # TYPE g gauge\ng 1\n# EOF\n";
        assert_eq!(
            openmetrics_to_text(om, &["envoy_x_destroy".to_string()]),
            "# HELP envoy_x_destroy Envoy statistic.\n# TYPE envoy_x_destroy counter\nenvoy_x_destroy 2\n\
             # TYPE g gauge\ng 1\n"
        );
    }

    #[test]
    fn whole_bucket_bounds_lose_their_fraction_as_in_envoys_output() {
        let om = "# TYPE h histogram\nh_sum 1.0\nh_count 1\n\
                  h_bucket{le=\"0.5\",a=\"b\"} 0\nh_bucket{le=\"1.0\",a=\"b\"} 1\n\
                  h_bucket{le=\"3600000.0\",a=\"b\"} 1\nh_bucket{le=\"+Inf\",a=\"b\"} 1\n\
                  g{le=\"1.0\"} 2\n# EOF\n";
        let text = openmetrics_to_text(om, &[]);
        assert_eq!(
            text,
            "# TYPE h histogram\nh_sum 1.0\nh_count 1\n\
             h_bucket{le=\"0.5\",a=\"b\"} 0\nh_bucket{le=\"1\",a=\"b\"} 1\n\
             h_bucket{le=\"3600000\",a=\"b\"} 1\nh_bucket{le=\"+Inf\",a=\"b\"} 1\n\
             g{le=\"1.0\"} 2\n"
        );
    }

    #[test]
    fn histograms_pass_through() {
        let om = "# HELP h H.\n# TYPE h histogram\nh_sum 1.0\nh_count 1\nh_bucket{le=\"+Inf\"} 1\n# EOF\n";
        let text = openmetrics_to_text(om, &[]);
        assert!(
            text.starts_with("# HELP h H.\n# TYPE h histogram\nh_sum"),
            "{text}"
        );
    }

    const SCRAPE: &str = "# HELP c_total C.\n# TYPE c_total counter\n\
        c_total{cluster_name=\"outbound|80||httpbin.default\"} 3\n\
        c_total{cluster_name=\"outbound|80||other,x\"} 0\n\
        # TYPE g gauge\ng 0\n\
        # HELP h H.\n# TYPE h histogram\n\
        h_bucket{a=\"x\",le=\"1\"} 0\nh_bucket{a=\"x\",le=\"+Inf\"} 2\nh_sum{a=\"x\"} 5\nh_count{a=\"x\"} 2\n\
        h_bucket{a=\"y\",le=\"1\"} 0\nh_bucket{a=\"y\",le=\"+Inf\"} 0\nh_sum{a=\"y\"} 0\nh_count{a=\"y\"} 0\n\
        # TYPE unused_total counter\nunused_total 0\n";

    #[test]
    fn used_only_drops_zero_counters_and_unobserved_histogram_series_but_not_gauges() {
        let sel = Selection::from_query(None, true).unwrap();
        let text = select(SCRAPE, &sel);
        assert_eq!(
            text,
            "# HELP c_total C.\n# TYPE c_total counter\n\
             c_total{cluster_name=\"outbound|80||httpbin.default\"} 3\n\
             # TYPE g gauge\ng 0\n\
             # HELP h H.\n# TYPE h histogram\n\
             h_bucket{a=\"x\",le=\"1\"} 0\nh_bucket{a=\"x\",le=\"+Inf\"} 2\nh_sum{a=\"x\"} 5\nh_count{a=\"x\"} 2\n"
        );
    }

    #[test]
    fn filter_matches_names_and_labels_as_envoys_matches_its_stat_names() {
        let sel = Selection::from_query(Some(".*httpbin.*"), false).unwrap();
        assert_eq!(
            select(SCRAPE, &sel),
            "# HELP c_total C.\n# TYPE c_total counter\n\
             c_total{cluster_name=\"outbound|80||httpbin.default\"} 3\n"
        );
        // A dot in an Envoy-style name matches the underscore of the Prometheus one.
        let sel = Selection::from_query(Some("unused.total"), false).unwrap();
        assert_eq!(
            select(SCRAPE, &sel),
            "# TYPE unused_total counter\nunused_total 0\n"
        );
        assert!(Selection::from_query(Some("("), false).is_err());
        let all = Selection::from_query(Some(""), false).unwrap();
        assert_eq!(select(SCRAPE, &all), SCRAPE);
    }

    #[test]
    fn histogram_series_ignores_le_and_commas_inside_values() {
        assert_eq!(
            histogram_series("h_bucket{a=\"1,le=\\\"2\",le=\"0.5\"}"),
            "h{a=\"1,le=\\\"2\"}"
        );
        assert_eq!(histogram_series("h_count"), "h{}");
    }
}
