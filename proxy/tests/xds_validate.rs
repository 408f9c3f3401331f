//! `remora xds validate` over the xDS conformance set: one line per resource, and the exit
//! status says whether any was refused.

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_remora");

/// shared/conformance/xds/resources, or `None` when absent outside CI.
fn resources() -> Option<PathBuf> {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/conformance/xds/resources");
    if dir.is_dir() {
        return Some(dir);
    }
    assert!(
        !std::env::var("CI").is_ok_and(|v| v == "true"),
        "no xDS conformance set at {}",
        dir.display()
    );
    println!("skipped: no xDS conformance set at {}", dir.display());
    None
}

fn validate(path: PathBuf) -> (Option<i32>, Vec<String>) {
    let out = Command::new(BIN)
        .args(["xds", "validate"])
        .arg(path)
        .output()
        .expect("run remora");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    (out.status.code(), lines)
}

#[test]
fn accepted_resources_exit_zero() {
    let Some(dir) = resources() else { return };
    let (code, lines) = validate(dir.join("describe-productpage"));
    assert_eq!(code, Some(0), "{lines:?}");
    assert_eq!(
        lines,
        [
            "accepted cluster outbound|9080|v1|productpage.default.svc.cluster.local",
            "accepted route http.8080"
        ]
    );
}

#[test]
fn a_refused_resource_exits_non_zero_with_its_reason() {
    let Some(dir) = resources() else { return };
    let (code, lines) = validate(dir.join("authz-sidecar"));
    assert_eq!(code, Some(1));
    assert_eq!(lines.len(), 27);
    let refused: Vec<&String> = lines.iter().filter(|l| l.starts_with("refused ")).collect();
    assert_eq!(refused.len(), 3, "{refused:?}");
    assert!(lines.contains(&"refused listener connect_terminate: HBONE not supported".to_string()));
    // virtualInbound, with the ext_authz filters of a CUSTOM policy, is accepted.
    assert!(lines.contains(&"accepted listener virtualInbound".to_string()));
    let (code, _) = validate(dir.join("no-such-case"));
    assert_eq!(
        code,
        Some(2),
        "an unreadable path is an error, not a verdict"
    );
}
