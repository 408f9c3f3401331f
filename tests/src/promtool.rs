//! `promtool check metrics` on a real scrape: the check Prometheus' own tooling applies.

use crate::process::run_bounded_with_input;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Whether promtool is installed; under CI=true its absence fails the test instead.
pub fn available() -> bool {
    if Command::new("promtool").arg("--version").output().is_ok() {
        return true;
    }
    crate::environment::skip::<()>(
        "promtool is not installed (scripts/install-test-deps installs it)",
    );
    false
}

/// Lint findings that Istio's and Envoy's own metric names earn, which a sidecar that keeps
/// those names cannot avoid (a real Envoy's scrape gets them too): `(metric, finding)`.
const INHERENT: [(&str, &str); 2] = [
    ("istio_request_duration_milliseconds", "use base unit"),
    (
        "envoy_server_days_until_first_cert_expiring",
        "use base unit",
    ),
];

/// Envoy types its counters counter whatever their name (`envoy_cluster_bind_errors`), and
/// promtool lints every one without `_total` in a real Envoy's scrape as in ours; the gauge
/// `membership_total` the other way round; and under Istio's tags a cluster's name stays in
/// the metric's (`envoy_cluster_PassthroughCluster_upstream_cx_connect_fail`), camel case
/// and all.
fn envoy_counter_name(finding: &str) -> bool {
    let gauge_total = finding.split_once(' ').is_some_and(|(name, lint)| {
        name.ends_with("_membership_total")
            && lint == "non-counter metrics should not have \"_total\" suffix"
    });
    finding.starts_with("envoy_")
        && (finding.ends_with("counter metrics should have \"_total\" suffix")
            || finding.ends_with("metric names should be written in 'snake_case' not 'camelCase'")
            || gauge_total)
}

/// Panics with promtool's complaints unless `exposition` passes `promtool check metrics`: it
/// parses, and every lint finding is one of [`INHERENT`]. Returns how many of those there were.
pub fn assert_valid(exposition: &str) -> usize {
    assert!(
        exposition.contains("# TYPE "),
        "not an exposition: {exposition}"
    );
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("scrape.prom");
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(exposition.as_bytes()))
        .expect("write the scrape");
    let input = std::fs::File::open(&path).expect("reopen the scrape");
    let out = run_bounded_with_input(
        Command::new("promtool").args(["check", "metrics"]),
        Stdio::from(input),
        Duration::from_secs(20),
    )
    .expect("promtool runs");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let findings: Vec<&str> = report.lines().filter(|l| !l.trim().is_empty()).collect();
    let inherent = |line: &&str| {
        INHERENT
            .iter()
            .any(|(name, finding)| line.starts_with(&format!("{name} ")) && line.contains(finding))
            || envoy_counter_name(line)
    };
    // Exit 3 is promtool's "linted with findings"; anything else but 0 is a parse failure.
    let linted = matches!(out.status.code(), Some(0) | Some(3));
    assert!(
        linted && findings.iter().all(inherent),
        "promtool check metrics failed ({}):\n{report}",
        out.status
    );
    findings.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promtool_reads_the_scrape_and_fails_what_does_not_pass() {
        if !available() {
            return;
        }
        let good = "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n";
        assert_eq!(assert_valid(good), 0);
        let inherent = "# HELP istio_request_duration_milliseconds D.\n\
                        # TYPE istio_request_duration_milliseconds gauge\n\
                        istio_request_duration_milliseconds 1\n";
        assert_eq!(assert_valid(inherent), 1);
        let envoy =
            "# HELP envoy_cluster_bind_errors E.\n# TYPE envoy_cluster_bind_errors counter\n\
                     envoy_cluster_bind_errors 0\n";
        assert_eq!(assert_valid(envoy), 1);
        for bad in [
            // Does not parse.
            "# HELP a_total A.\n# TYPE a_total counter\na_total{ 1\n",
            // Parses, with a finding no Istio or Envoy name forces.
            "# HELP x_milliseconds X.\n# TYPE x_milliseconds gauge\nx_milliseconds 1\n",
            // A counter without `_total` that is not Envoy's.
            "# HELP x_errors X.\n# TYPE x_errors counter\nx_errors 1\n",
        ] {
            let checked = std::panic::catch_unwind(|| assert_valid(bad));
            assert!(checked.is_err(), "passed: {bad}");
        }
    }
}
