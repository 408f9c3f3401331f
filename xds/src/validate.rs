//! `remora xds validate`: check resources offline, as `envoy --mode validate` checks a config.
//! Reads a directory laid out as the conformance set's cases (`listeners.json`,
//! `clusters.json`, `routes.json`, `endpoints.json`, `secrets.json`,
//! `extension_configs.json`, `name_tables.json`, each a JSON or YAML array of resources) or an Envoy
//! `/config_dump` JSON, and says of each resource whether Remora accepts it, and if not why.

use crate::convert::name_table::NameTableProto;
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
pub const FILES: [(&str, Kind); 7] = [
    ("listeners", Kind::Listener),
    ("clusters", Kind::Cluster),
    ("routes", Kind::Route),
    ("endpoints", Kind::Endpoint),
    ("secrets", Kind::Secret),
    ("extension_configs", Kind::ExtensionConfig),
    ("name_tables", Kind::NameTable),
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

/// A resource as a file or dump holds it, ready to read as `kind`: Envoy writes each one with
/// its `Any`'s `@type`, which must be the kind's own and is then dropped.
pub fn resource_body(kind: Kind, value: &Value) -> Result<Value, Refusal> {
    let mut body = value.clone();
    if let Some(map) = body.as_object_mut() {
        if let Some(t) = map.remove("@type") {
            let want = format!("type.googleapis.com/{}", kind.message_name());
            if t.as_str() != Some(want.as_str()) {
                return Err(Refusal {
                    kind,
                    name: value[kind.name_field()]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    path: String::new(),
                    type_url: t.as_str().map(str::to_string),
                    reason: format!("not a {} ({want})", kind),
                });
            }
        }
    }
    Ok(body)
}

/// Validate one resource in JSON.
pub fn validate_one(kind: Kind, value: &Value) -> Verdict {
    fn run<T: Resource>(value: &Value) -> Option<Refusal> {
        from_json::<T>(value).err()
    }
    let name = value[kind.name_field()]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let body = match resource_body(kind, value) {
        Ok(body) => body,
        Err(refusal) => {
            return Verdict {
                kind,
                name,
                refusal: Some(refusal),
            }
        }
    };
    let refusal = match kind {
        Kind::Listener => run::<Listener>(&body),
        Kind::Cluster => run::<Cluster>(&body),
        Kind::Route => run::<RouteConfiguration>(&body),
        Kind::Endpoint => run::<ClusterLoadAssignment>(&body),
        Kind::Secret => run::<Secret>(&body),
        Kind::ExtensionConfig => run::<TypedExtensionConfig>(&body),
        Kind::NameTable => run::<NameTableProto>(&body),
    };
    Verdict {
        kind,
        name,
        refusal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cluster(name: &str) -> Value {
        json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": name,
               "type": "STATIC", "connect_timeout": "1s"})
    }

    #[test]
    fn config_dump_dynamic_resources_are_validated_static_ones_skipped() {
        let dump = json!({"configs": [
            {"@type": "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump", "bootstrap": {}},
            {"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
             "static_clusters": [{"cluster": cluster("prometheus_stats")}],
             "dynamic_active_clusters": [
                {"version_info": "1", "cluster": cluster("BlackHoleCluster")},
                {"version_info": "1", "cluster": {"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                    "name": "odd", "lb_policy": "LOAD_BALANCING_POLICY_CONFIG"}}
             ]},
            {"@type": "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump",
             "dynamic_endpoint_configs": [{"endpoint_config": {
                "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
                "cluster_name": "outbound|80||a", "endpoints": [{"lb_endpoints": [{"endpoint": {"address":
                    {"socket_address": {"address": "10.0.0.1", "port_value": 80}}}}]}]}}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.EcdsConfigDump",
             "ecds_filters": [{"ecds_filter": {"name": "stub"}}]}
        ]});
        let lines: Vec<String> = validate_config_dump(&dump)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(lines[0], "accepted cluster BlackHoleCluster");
        assert!(
            lines[1].starts_with(
                "refused cluster odd: lb_policy: LOAD_BALANCING_POLICY_CONFIG not supported"
            ),
            "{}",
            lines[1]
        );
        assert_eq!(lines[2], "accepted endpoint outbound|80||a");
    }

    #[test]
    fn a_resource_of_another_type_is_refused() {
        let v = validate_one(Kind::Listener, &cluster("c"));
        let line = v.to_string();
        assert!(
            line.starts_with("refused listener c: (type.googleapis.com/envoy.config.cluster.v3.Cluster): not a listener"),
            "{line}"
        );
    }

    #[test]
    fn directories_read_json_and_yaml_arrays() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("clusters.yaml"),
            "- name: a\n  type: STATIC\n- name: b\n  lb_policy: CLUSTER_PROVIDED\n",
        )
        .expect("write");
        let lines: Vec<String> = validate_path(dir.path())
            .expect("reads")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(lines[0], "accepted cluster a");
        assert!(
            lines[1].starts_with("refused cluster b: lb_policy"),
            "{}",
            lines[1]
        );
        std::fs::write(dir.path().join("listeners.json"), "{}").expect("write");
        let err = validate_path(dir.path()).expect_err("not an array");
        assert!(err.to_string().contains("not a JSON array"), "{err}");
    }
}
