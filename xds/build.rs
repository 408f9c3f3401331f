//! envoy-types ships the descriptor set its Rust types were generated from, but does not export
//! it; the JSON reader needs it (proto3 JSON names fields and `Any` types by their descriptors).
//! Find the locked envoy-types sources and copy the file into OUT_DIR: in cargo's registry
//! cache first (the version from Cargo.lock), else by asking cargo (vendored sources, another
//! registry). The registry comes first because `cargo metadata` offline needs every workspace
//! member's dependencies present, and a build of one package (`cargo build -p remora`, as the
//! Dockerfile runs) downloads only its own.

use std::path::{Path, PathBuf};
use std::process::Command;

const DESCRIPTORS: &str = "src/generated/types.bin";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../Cargo.lock");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let dir = from_registry(&manifest)
        .or_else(|| from_metadata(&manifest))
        .expect("the envoy-types sources (a dependency) are found");
    let descriptors = dir.join(DESCRIPTORS);
    let dest =
        PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("envoy.bin");
    std::fs::copy(&descriptors, &dest)
        .unwrap_or_else(|e| panic!("copy {}: {e}", descriptors.display()));
}

/// `<cargo home>/registry/src/<index>/envoy-types-<locked version>`.
fn from_registry(manifest: &Path) -> Option<PathBuf> {
    let lock = std::fs::read_to_string(manifest.join("../Cargo.lock")).ok()?;
    let version = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"envoy-types\""))?
        .lines()
        .find_map(|l| l.trim().strip_prefix("version = \""))?
        .trim_end_matches('"')
        .to_string();
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    std::fs::read_dir(home.join("registry/src"))
        .ok()?
        .filter_map(Result::ok)
        .map(|index| index.path().join(format!("envoy-types-{version}")))
        .find(|dir| dir.join(DESCRIPTORS).is_file())
}

/// Where `cargo metadata` says the envoy-types package is.
fn from_metadata(manifest: &Path) -> Option<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
        ])
        .arg(&target)
        .arg("--manifest-path")
        .arg(manifest.join("Cargo.toml"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let package = meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "envoy-types"))?;
    Some(
        PathBuf::from(package["manifest_path"].as_str()?)
            .parent()?
            .to_path_buf(),
    )
}
