//! The HTTP/2 stack stays at or above the releases that fixed the attacks docs/hardening.md
//! lists. The advisory database cannot be fetched from the machines this runs on, so the fixes
//! are pinned here instead: every `h2` and `hyper` in Cargo.lock must be at least each floor.
//! No root needed.

use std::path::Path;

/// (crate, lowest acceptable version, why).
const FLOORS: &[(&str, (u64, u64, u64), &str)] = &[
    (
        "h2",
        (0, 4, 0),
        "Rapid Reset, CVE-2023-44487: pending-accept resets bounded",
    ),
    (
        "h2",
        (0, 4, 2),
        "resets for the peer's protocol errors bounded (RUSTSEC-2024-0003)",
    ),
    (
        "h2",
        (0, 4, 4),
        "CONTINUATION flood: frames per header block bounded (RUSTSEC-2024-0332)",
    ),
    (
        "h2",
        (0, 4, 16),
        "small DATA frame flood bounded (the data-frame budget, GOAWAY too_many_data_frames)",
    ),
    (
        "h2",
        (0, 4, 20),
        "refused streams count toward the local reset limit (MadeYouReset, CVE-2025-8671): the \
         release tests/tests/h2_attacks.rs established",
    ),
    (
        "hyper",
        (1, 4, 0),
        "the server builder's max_local_error_reset_streams, which Remora sets",
    ),
    (
        "hyper",
        (1, 12, 0),
        "the release tests/tests/h2_attacks.rs established",
    ),
];

/// Every (name, version) in the lock file.
fn locked(lock: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut name = None;
    for line in lock.lines() {
        if line == "[[package]]" {
            name = None;
        } else if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_string());
        } else if let Some(v) = line.strip_prefix("version = ") {
            if let Some(n) = name.take() {
                out.push((n, v.trim_matches('"').to_string()));
            }
        }
    }
    out
}

fn parse(version: &str) -> Option<(u64, u64, u64)> {
    let core = version.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

#[test]
fn h2_and_hyper_in_cargo_lock_are_at_or_above_the_releases_that_fixed_the_http2_attacks() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.lock");
    let lock =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let packages = locked(&lock);
    for (krate, floor, why) in FLOORS {
        let versions: Vec<&String> = packages
            .iter()
            .filter(|(n, _)| n == krate)
            .map(|(_, v)| v)
            .collect();
        assert!(!versions.is_empty(), "{krate} is not in Cargo.lock");
        for v in versions {
            let got = parse(v).unwrap_or_else(|| panic!("{krate} {v}: not a version"));
            assert!(
                got >= *floor,
                "{krate} {v} is below {}.{}.{}: {why}",
                floor.0,
                floor.1,
                floor.2
            );
        }
    }
}

#[test]
fn the_floor_check_reads_versions_and_refuses_an_old_one() {
    let lock = "[[package]]\nname = \"h2\"\nversion = \"0.4.3\"\n\n[[package]]\nname = \"x\"\n\
                version = \"1.0.0\"\n";
    let packages = locked(lock);
    assert_eq!(packages[0], ("h2".to_string(), "0.4.3".to_string()));
    let old = parse(&packages[0].1).expect("a version");
    assert!(old < (0, 4, 4), "0.4.3 predates the CONTINUATION fix");
    assert_eq!(parse("1.12.0-rc.1"), Some((1, 12, 0)));
}
