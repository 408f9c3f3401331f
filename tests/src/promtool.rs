//! `promtool check metrics` on a real scrape: the check Prometheus' own tooling applies.

use crate::process::run_bounded;
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

/// Panics with promtool's complaints unless `exposition` passes `promtool check metrics`.
pub fn assert_valid(exposition: &str) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("scrape.prom");
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(exposition.as_bytes()))
        .expect("write the scrape");
    let input = std::fs::File::open(&path).expect("reopen the scrape");
    let out = run_bounded(
        Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::from(input)),
        Duration::from_secs(20),
    )
    .expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
