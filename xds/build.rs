//! envoy-types ships the descriptor set its Rust types were generated from, but does not export
//! it; the JSON reader needs it (proto3 JSON names fields and `Any` types by their descriptors).
//! Cargo knows where the locked envoy-types sources are: ask it, and copy the file into OUT_DIR.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../Cargo.lock");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
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
        .arg(PathBuf::from(&manifest).join("Cargo.toml"))
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
        .and_then(|ps| ps.iter().find(|p| p["name"] == "envoy-types"))
        .expect("envoy-types is a dependency");
    let dir = PathBuf::from(package["manifest_path"].as_str().expect("a manifest path"))
        .parent()
        .expect("the manifest is in a directory")
        .to_path_buf();
    let descriptors = dir.join("src/generated/types.bin");
    let dest =
        PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("envoy.bin");
    std::fs::copy(&descriptors, &dest)
        .unwrap_or_else(|e| panic!("copy {}: {e}", descriptors.display()));
}
