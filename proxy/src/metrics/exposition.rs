//! Prometheus text format 0.0.4, what Envoy serves on `/stats/prometheus` and what Prometheus,
//! promtool and Istio's agent parse by default.
//!
//! prometheus-client writes OpenMetrics, which differs in ways a 0.0.4 parser trips on: a
//! counter family is declared without its `_total` suffix (`# TYPE x counter`, samples
//! `x_total`), info metrics have their own type, and the text ends with `# EOF`. This rewrites
//! those few things, and bucket bounds as Envoy prints them (`le="1"`, not `le="1.0"`: `le` is
//! a string to Prometheus 2, so `{le="1000"}` in an existing query must match), and leaves every
//! other sample line as it is.

/// Convert OpenMetrics text from prometheus-client into Prometheus text format 0.0.4.
pub fn openmetrics_to_text(om: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_get_their_total_name_and_eof_goes() {
        let om = "# HELP x Things.\n# TYPE x counter\nx_total{a=\"b\"} 3\n# HELP g A gauge.\n# TYPE g gauge\ng 1\n# EOF\n";
        assert_eq!(
            openmetrics_to_text(om),
            "# HELP x_total Things.\n# TYPE x_total counter\nx_total{a=\"b\"} 3\n# HELP g A gauge.\n# TYPE g gauge\ng 1\n"
        );
    }

    #[test]
    fn whole_bucket_bounds_lose_their_fraction_as_in_envoys_output() {
        let om = "# TYPE h histogram\nh_sum 1.0\nh_count 1\n\
                  h_bucket{le=\"0.5\",a=\"b\"} 0\nh_bucket{le=\"1.0\",a=\"b\"} 1\n\
                  h_bucket{le=\"3600000.0\",a=\"b\"} 1\nh_bucket{le=\"+Inf\",a=\"b\"} 1\n\
                  g{le=\"1.0\"} 2\n# EOF\n";
        let text = openmetrics_to_text(om);
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
        let text = openmetrics_to_text(om);
        assert!(
            text.starts_with("# HELP h H.\n# TYPE h histogram\nh_sum"),
            "{text}"
        );
    }
}
