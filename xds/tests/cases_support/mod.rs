//! Shared by the tests of `xds/tests/cases/`: xDS resources in istiod's shape, written for
//! what the conformance set lacks (see `cases/README.md`). The same files go to real Envoy
//! (`cases_envoy.rs`) and through `remora_xds` (`cases_routes.rs`, `cases_clusters.rs`,
//! `cases_refusals.rs`).

#![allow(dead_code)] // each test file uses its own part

use remora_xds::convert::{from_json, Resource};
use remora_xds::model::route::{Action, Forward, RequestParts, Route, RouteConfiguration};
use remora_xds::snapshot::{Entry, Resources, Snapshot};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

/// The cases' folder.
pub fn cases_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cases")
}

/// The cases, by folder name.
pub const CASES: [&str; 13] = [
    "traffic-split",
    "faults-retries",
    "cors",
    "mirror",
    "resilience",
    "consistent-hash",
    "redirect-rewrite",
    "dns-static",
    "tcp-split",
    "istiod-defaults",
    "tls-origination",
    "gaps",
    "envoy-rejects",
];

/// The resources of one kind of one case as written (`@type` kept), empty when absent.
pub fn raw(case: &str, kind: &str) -> Vec<Value> {
    let path = cases_dir().join(case).join(format!("{kind}.json"));
    if !path.is_file() {
        return Vec::new();
    }
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let value: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    value
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("{}: not a JSON array", path.display()))
}

/// The same without the `@type` each resource carries (as a bootstrap or `from_json` wants).
pub fn resources(case: &str, kind: &str) -> Vec<Value> {
    let mut items = raw(case, kind);
    for item in &mut items {
        item.as_object_mut().expect("an object").remove("@type");
    }
    items
}

/// Convert one resource, panicking with Remora's reason when it is refused.
pub fn accept<T: Resource>(value: &Value) -> Arc<Entry<T>> {
    let converted = from_json::<T>(value).unwrap_or_else(|r| panic!("refused: {r}"));
    Arc::new(Entry::from_proto(
        converted.model,
        &converted.proto,
        "cases".into(),
        SystemTime::now(),
    ))
}

fn all<T: Resource>(case: &str, kind: &str) -> Resources<T> {
    resources(case, kind)
        .iter()
        .map(|v| {
            let entry = accept::<T>(v);
            let proto = entry.proto().expect("a held resource decodes");
            (proto.name().to_string(), entry)
        })
        .collect()
}

/// Everything of a case Remora accepts, as the data path sees it.
pub fn snapshot(case: &str) -> Snapshot {
    Snapshot::new(
        all(case, "listeners"),
        all(case, "clusters"),
        all(case, "routes"),
        all(case, "endpoints"),
    )
}

/// A request for the route lookup: method, path (with query), headers by lower-case name.
pub struct Request {
    pub method: &'static str,
    pub path: &'static str,
    pub headers: Vec<(&'static str, &'static str)>,
}

pub fn get(path: &'static str) -> Request {
    Request {
        method: "GET",
        path,
        headers: Vec::new(),
    }
}

impl Request {
    pub fn method(mut self, method: &'static str) -> Request {
        self.method = method;
        self
    }
    pub fn header(mut self, name: &'static str, value: &'static str) -> Request {
        self.headers.push((name, value));
        self
    }
}

/// The route `host` + `req` takes in a route table (`None`: Envoy's 404 `NR`).
pub fn lookup<'a>(rc: &'a RouteConfiguration, host: &str, req: &Request) -> Option<&'a Arc<Route>> {
    let header = |name: &str| -> Option<&str> {
        match name {
            ":method" => Some(req.method),
            ":authority" => Some(host),
            ":path" => Some(req.path),
            _ => req
                .headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| *v),
        }
    };
    let values = |name: &str, visit: &mut dyn FnMut(&str) -> bool| match name {
        ":method" | ":authority" | ":path" => header(name).is_some_and(&mut *visit),
        _ => req
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .any(|(_, v)| visit(v)),
    };
    let parts = RequestParts {
        method: req.method,
        path_and_query: req.path,
        header: &header,
        values: &values,
    };
    rc.virtual_host(host)?.route(&parts)
}

/// The route's name (istiod names each after its VirtualService rule).
pub fn name_of(route: Option<&Arc<Route>>) -> Option<&str> {
    route.and_then(|r| r.name.as_deref())
}

/// The forwarding action of a route, panicking when it is another action.
pub fn forward(route: &Route) -> &Forward {
    match &route.action {
        Action::Forward(f) => f,
        other => panic!("route {:?} does not forward: {other:?}", route.name),
    }
}
