//! Shared by the xDS conformance tests: finding the conformance set
//! (shared/conformance/xds), reading its resources and facts.

#![allow(dead_code)] // each test file uses its own part

use remora_xds::convert::from_json;
use remora_xds::model::listener::Listener;
use serde_json::Value;
use std::path::{Path, PathBuf};

type ListenerProto = envoy_types::pb::envoy::config::listener::v3::Listener;

/// The conformance folder, or `None` (with the reason printed) when it is absent outside CI.
pub fn conformance_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("REMORA_XDS_CONFORMANCE_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/conformance/xds"),
    };
    if dir.join("facts").is_dir() && dir.join("resources").is_dir() {
        return Some(dir);
    }
    let reason = format!("no xDS conformance set at {}", dir.display());
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{reason} (set REMORA_XDS_CONFORMANCE_DIR)");
    }
    println!("skipped: {reason}");
    None
}

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The resources of one kind of one case (empty when the case has none).
pub fn resources(dir: &Path, case: &str, kind: &str) -> Vec<Value> {
    let path = dir
        .join("resources")
        .join(case)
        .join(format!("{kind}.json"));
    if !path.is_file() {
        return Vec::new();
    }
    let mut items = read_json(&path).as_array().cloned().expect("a JSON array");
    for item in &mut items {
        item.as_object_mut().expect("an object").remove("@type");
    }
    items
}

pub fn facts(dir: &Path, case: &str) -> Value {
    read_json(&dir.join("facts").join(format!("{case}.json")))
}

pub fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|x| s(x).to_string()).collect())
        .unwrap_or_default()
}

/// The case's listeners as the model reads them (all but the HBONE ones, which are refused).
pub fn authz_listeners(dir: &Path) -> Vec<Listener> {
    let mut out = Vec::new();
    for l in resources(dir, "authz-sidecar", "listeners") {
        let name = s(&l["name"]).to_string();
        if ["connect_terminate", "main_internal", "connect_originate"].contains(&name.as_str()) {
            continue;
        }
        let converted = from_json::<ListenerProto>(&l).unwrap_or_else(|r| panic!("{r}"));
        out.push(converted.model);
    }
    out
}
