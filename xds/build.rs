//! envoy-types ships the descriptor set its Rust types were generated from, but does not export
//! it; the JSON reader needs it (proto3 JSON names fields and `Any` types by their descriptors).
//! Find the locked envoy-types sources and copy the file into OUT_DIR without its comments (see
//! `strip_source_info`): in cargo's registry cache first (the version from Cargo.lock), else by
//! asking cargo (vendored sources, another registry). The registry comes first because `cargo
//! metadata` offline needs every workspace member's dependencies present, and a build of one
//! package (`cargo build -p remora`, as the Dockerfile runs) downloads only its own.

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
    let set = std::fs::read(&descriptors)
        .unwrap_or_else(|e| panic!("read {}: {e}", descriptors.display()));
    let stripped = strip_source_info(&set)
        .unwrap_or_else(|| panic!("{} is not a FileDescriptorSet", descriptors.display()));
    std::fs::write(&dest, stripped).unwrap_or_else(|e| panic!("write {}: {e}", dest.display()));
}

/// `FileDescriptorProto.source_code_info`: the comments and source spans of every element.
const SOURCE_CODE_INFO: u64 = 9;

/// The descriptor set without its files' `source_code_info`, which is 80% of envoy-types' set
/// and which the pool would otherwise decode and hold (some 40 MiB of small allocations in
/// every process that reads a resource) for nothing: no reader or writer of JSON looks at
/// comments. Done on the wire format, a set being `repeated FileDescriptorProto file = 1`,
/// so the build script needs no protobuf crate.
fn strip_source_info(set: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(set.len());
    for (key, file) in length_delimited(set)? {
        let mut kept = Vec::with_capacity(file.len());
        for (key, value) in raw_fields(file)? {
            if key >> 3 != SOURCE_CODE_INFO {
                kept.extend_from_slice(value);
            }
        }
        put_varint(&mut out, key);
        put_varint(&mut out, kept.len() as u64);
        out.extend_from_slice(&kept);
    }
    Some(out)
}

/// The fields of a message whose fields are all length-delimited: key and payload.
fn length_delimited(mut b: &[u8]) -> Option<Vec<(u64, &[u8])>> {
    let mut out = vec![];
    while !b.is_empty() {
        let key = varint(&mut b)?;
        if key & 7 != 2 {
            return None;
        }
        let len = usize::try_from(varint(&mut b)?).ok()?;
        out.push((key, b.get(..len)?));
        b = &b[len..];
    }
    Some(out)
}

/// The fields of any message: key and the field's whole encoding (key included).
fn raw_fields(b: &[u8]) -> Option<Vec<(u64, &[u8])>> {
    let mut out = vec![];
    let mut rest = b;
    while !rest.is_empty() {
        let start = rest;
        let key = varint(&mut rest)?;
        let len = match key & 7 {
            0 => {
                varint(&mut rest)?;
                0
            }
            1 => 8,
            2 => usize::try_from(varint(&mut rest)?).ok()?,
            5 => 4,
            _ => return None,
        };
        rest = rest.get(len..)?;
        out.push((key, &start[..start.len() - rest.len()]));
    }
    Some(out)
}

fn varint(b: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(value);
        }
    }
    None
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
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
