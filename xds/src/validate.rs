//! `remora xds validate`: check resources offline, as `envoy --mode validate` checks a config.
//! Reads a directory laid out as the conformance set's cases (`listeners.json`,
//! `clusters.json`, `routes.json`, `endpoints.json`, `secrets.json`,
//! `extension_configs.json`, each a JSON or YAML array of resources) or an Envoy
//! `/config_dump` JSON, and says of each resource whether Remora accepts it, and if not why.

use crate::convert::{from_json, Resource};
use crate::json::yaml_to_json;
use crate::refusal::{Kind, Refusal};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use serde_json::Value;
use std::fmt;
use std::path::{Path, PathBuf};

/// The files of a resource directory, by kind.
pub const FILES: [(&str, Kind); 6] = [
    ("listeners", Kind::Listener),
    ("clusters", Kind::Cluster),
    ("routes", Kind::Route),
    ("endpoints", Kind::Endpoint),
    ("secrets", Kind::Secret),
    ("extension_configs", Kind::ExtensionConfig),
];

/// The verdict on one resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub kind: Kind,
    pub name: String,
    /// `None`: accepted.
    pub refusal: Option<Refusal>,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.refusal {
            None => write!(f, "accepted {} {}", self.kind, self.name),
            Some(r) => write!(f, "refused {r}"),
        }
    }
}

/// Input that could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Parse { path: PathBuf, reason: String },
}

/// Validate a resource directory or a config-dump file.
pub fn validate_path(path: &Path) -> Result<Vec<Verdict>, ValidateError> {
    if path.is_dir() {
        return validate_dir(path);
    }
    let value = read_value(path)?;
    if value.get("configs").is_some() {
        return Ok(validate_config_dump(&value));
    }
    Err(ValidateError::Parse {
        path: path.to_path_buf(),
        reason: "neither a resource directory nor a config dump (no `configs`)".into(),
    })
}

fn read_value(path: &Path) -> Result<Value, ValidateError> {
    let text = std::fs::read_to_string(path).map_err(|source| ValidateError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let parsed = if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
        yaml_to_json(&text).map_err(|e| e.to_string())
    } else {
        serde_json::from_str(&text).map_err(|e| e.to_string())
    };
    parsed.map_err(|reason| ValidateError::Parse {
        path: path.to_path_buf(),
        reason,
    })
}

/// Validate `<dir>/<kind>.json` (or `.yaml`) for every kind present.
pub fn validate_dir(dir: &Path) -> Result<Vec<Verdict>, ValidateError> {
    let mut out = Vec::new();
    for (file, kind) in FILES {
        let Some(path) = ["json", "yaml", "yml"]
            .iter()
            .map(|ext| dir.join(format!("{file}.{ext}")))
            .find(|p| p.is_file())
        else {
            continue;
        };
        let value = read_value(&path)?;
        let Value::Array(items) = value else {
            return Err(ValidateError::Parse {
                path,
                reason: "not a JSON array of resources".into(),
            });
        };
        out.extend(items.iter().map(|v| validate_one(kind, v)));
    }
    Ok(out)
}

/// Validate the dynamic resources of an Envoy `/config_dump` (static ones come from the
/// bootstrap, not from the control plane, and are not Remora's to accept).
pub fn validate_config_dump(dump: &Value) -> Vec<Verdict> {
    let mut out = Vec::new();
    let configs = dump["configs"].as_array().cloned().unwrap_or_default();
    let pick = |section: &Value, list: &str, inner: &[&str]| -> Vec<Value> {
        section[list]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|item| {
                        let v = inner.iter().fold(item, |v, k| &v[*k]);
                        (!v.is_null()).then(|| v.clone())
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    for section in &configs {
        let t = section["@type"].as_str().unwrap_or_default();
        let (kind, items) = match t.rsplit('.').next().unwrap_or_default() {
            "ListenersConfigDump" => (
                Kind::Listener,
                pick(section, "dynamic_listeners", &["active_state", "listener"]),
            ),
            "ClustersConfigDump" => (
                Kind::Cluster,
                pick(section, "dynamic_active_clusters", &["cluster"]),
            ),
            "RoutesConfigDump" => (
                Kind::Route,
                pick(section, "dynamic_route_configs", &["route_config"]),
            ),
            "EndpointsConfigDump" => (
                Kind::Endpoint,
                pick(section, "dynamic_endpoint_configs", &["endpoint_config"]),
            ),
            "SecretsConfigDump" => (
                Kind::Secret,
                pick(section, "dynamic_active_secrets", &["secret"]),
            ),
            "EcdsConfigDump" => (
                Kind::ExtensionConfig,
                pick(section, "ecds_filters", &["ecds_filter"])
                    .into_iter()
                    .filter(|f| f.get("typed_config").is_some())
                    .collect(),
            ),
            _ => continue,
        };
        out.extend(items.iter().map(|v| validate_one(kind, v)));
    }
    out
}

/// Validate one resource in JSON.
pub fn validate_one(kind: Kind, value: &Value) -> Verdict {
    fn run<T: Resource>(value: &Value) -> Option<Refusal> {
        from_json::<T>(value).err()
    }
    // A dump wraps each resource in an Any; its `@type` is the resource's own.
    let mut body = value.clone();
    if let Some(map) = body.as_object_mut() {
        map.remove("@type");
    }
    let refusal = match kind {
        Kind::Listener => run::<Listener>(&body),
        Kind::Cluster => run::<Cluster>(&body),
        Kind::Route => run::<RouteConfiguration>(&body),
        Kind::Endpoint => run::<ClusterLoadAssignment>(&body),
        Kind::Secret => run::<Secret>(&body),
        Kind::ExtensionConfig => run::<TypedExtensionConfig>(&body),
    };
    Verdict {
        kind,
        name: value[kind.name_field()]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        refusal,
    }
}
