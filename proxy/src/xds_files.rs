//! xDS resources from files (`xds.resources_dir`): how tests, benchmarks and a laptop drive
//! routing without a control plane. The directory is read whole, each resource converted from
//! Envoy's JSON (or YAML) to its proto, and handed to the same [`Sink::apply`] the ADS client
//! uses, as one state-of-the-world update per type: what Remora refuses is logged and counted
//! and the rest applies, exactly as a NACK from istiod would leave it.
//!
//! The directory is polled, as the config file is (`reload.rs` says why not inotify); a file
//! that cannot be read or parsed as a whole keeps the resources in force.

use prost::Message;
use remora_xds::json::{from_json, yaml_to_json};
use remora_xds::refusal::Kind;
use remora_xds::sink::{type_url, Rejection, Resource, Sink, Update};
use remora_xds::store::Store;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The kinds read from a directory, in the order Envoy applies them: clusters before the
/// endpoints they name, listeners before the route tables they name (applying a type drops
/// what no held resource of the type before it wants).
const ORDER: [(&str, Kind, &str); 4] = [
    ("clusters", Kind::Cluster, type_url::CLUSTER),
    ("endpoints", Kind::Endpoint, type_url::ENDPOINT),
    ("listeners", Kind::Listener, type_url::LISTENER),
    ("routes", Kind::Route, type_url::ROUTE),
];

/// A directory that could not be read as a whole.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Parse { path: PathBuf, reason: String },
}

/// The directory's files, read and parsed, ready to apply.
#[derive(Debug, Default)]
pub struct Resources {
    /// Per type URL, the resources as protos (or, for those whose JSON did not convert, a
    /// body the store refuses; see [`read_dir`]).
    updates: Vec<(&'static str, Vec<Resource>)>,
    /// Resources refused before the store saw them (their JSON is not a valid proto).
    refused: Vec<Rejection>,
}

/// The file for `base` in `dir`, in whichever of the extensions exists.
fn file_of(dir: &Path, base: &str) -> Option<PathBuf> {
    ["json", "yaml", "yml"]
        .iter()
        .map(|ext| dir.join(format!("{base}.{ext}")))
        .find(|p| p.is_file())
}

/// The bytes of every file that is read, for change detection.
pub fn fingerprint(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for (base, _, _) in ORDER {
        if let Some(path) = file_of(dir, base) {
            out.extend_from_slice(path.to_string_lossy().as_bytes());
            out.push(0);
            out.extend(std::fs::read(&path).unwrap_or_default());
            out.push(0);
        }
    }
    out
}

/// Read and parse the directory. A missing file is an empty set of that type.
pub fn read_dir(dir: &Path) -> Result<Resources, FilesError> {
    // A directory that is not there is a mistake, not an empty world: every outbound
    // connection would be refused for want of a listener.
    if !dir.is_dir() {
        return Err(FilesError::Read {
            path: dir.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
        });
    }
    let mut out = Resources::default();
    for (base, kind, url) in ORDER {
        let Some(path) = file_of(dir, base) else {
            out.updates.push((url, Vec::new()));
            continue;
        };
        let text = std::fs::read_to_string(&path).map_err(|source| FilesError::Read {
            path: path.clone(),
            source,
        })?;
        let parsed = if path.extension().is_some_and(|e| e != "json") {
            yaml_to_json(&text).map_err(|e| e.to_string())
        } else {
            serde_json::from_str(&text).map_err(|e| e.to_string())
        };
        let value = parsed.map_err(|reason| FilesError::Parse {
            path: path.clone(),
            reason,
        })?;
        let Value::Array(items) = value else {
            return Err(FilesError::Parse {
                path,
                reason: "not an array of resources".into(),
            });
        };
        let mut resources = Vec::with_capacity(items.len());
        for item in &items {
            let name = item[kind.name_field()]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let read = remora_xds::validate::resource_body(kind, item)
                .map_err(|refusal| refusal.to_string())
                .and_then(|body| {
                    from_json(&body, kind.message_name())
                        .map_err(|e| format!("{kind} {name}: {}: {e}", e.path()))
                });
            let body = match read {
                Ok(message) => message.encode_to_vec(),
                Err(reason) => {
                    out.refused.push(Rejection {
                        name: name.clone(),
                        reason,
                    });
                    // Still delivered, as bytes the store cannot decode: it refuses them under
                    // this name and keeps the version it holds, as for any refused resource.
                    vec![0xff]
                }
            };
            resources.push(Resource {
                name,
                version: String::new(),
                body,
            });
        }
        out.updates.push((url, resources));
    }
    Ok(out)
}

/// Apply what was read to `store`; returns every refusal, each once.
pub fn apply(store: &Store, resources: Resources, version: &str) -> Vec<Rejection> {
    let mut refused = resources.refused;
    for (url, mut items) in resources.updates {
        for r in &mut items {
            r.version = version.to_string();
        }
        // A file is the whole set of its type: for routes and endpoints too, which state of
        // the world over ADS never removes by absence (a response carries only what was
        // asked), a resource the file no longer holds goes.
        let held = store.snapshot();
        let held_names: Vec<&String> = match url {
            type_url::ROUTE => held.routes.keys().collect(),
            type_url::ENDPOINT => held.endpoints.keys().collect(),
            _ => Vec::new(),
        };
        let removed = held_names
            .into_iter()
            .filter(|name| !items.iter().any(|r| &r.name == *name))
            .cloned()
            .collect();
        let applied = store.apply(
            url,
            Update {
                resources: items,
                removed,
                complete: true,
            },
        );
        for r in applied.rejected {
            // Those refused for their JSON are already here with a better reason.
            if !refused.iter().any(|known| known.name == r.name) {
                refused.push(r);
            }
        }
    }
    refused
}

/// Load the directory into a new store at start: unreadable files fail the start; refused
/// resources are logged loudly and counted, and the start goes on.
pub fn load(dir: &Path, metrics: &crate::metrics::Metrics) -> Result<Arc<Store>, FilesError> {
    let store = Arc::new(Store::new());
    let resources = read_dir(dir)?;
    let refused = apply(&store, resources, "1");
    report(dir, &refused, metrics);
    let snapshot = store.snapshot();
    tracing::info!(
        dir = %dir.display(),
        listeners = snapshot.listeners.len(),
        clusters = snapshot.clusters.len(),
        routes = snapshot.routes.len(),
        endpoints = snapshot.endpoints.len(),
        refused = refused.len(),
        "xDS resources loaded from files"
    );
    Ok(store)
}

fn report(dir: &Path, refused: &[Rejection], metrics: &crate::metrics::Metrics) {
    for r in refused {
        metrics.xds_file_refusals.inc();
        tracing::warn!(dir = %dir.display(), resource = %r.name, reason = %r.reason, "refused an xDS resource; its previous version (if any) stays in force");
    }
}

/// Polls the directory and re-applies it when its files change.
#[derive(Debug)]
pub struct Watcher {
    pub dir: PathBuf,
    pub interval: Duration,
    pub store: Arc<Store>,
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl Watcher {
    /// Load the directory now (a start with refusals still starts; one that cannot read it
    /// does not), then keep it in step with [`Watcher::watch`].
    pub fn start(
        dir: PathBuf,
        interval: Duration,
        metrics: &Arc<crate::metrics::Metrics>,
    ) -> Result<Watcher, FilesError> {
        let store = load(&dir, metrics)?;
        Ok(Watcher {
            dir,
            interval,
            store,
            metrics: Arc::clone(metrics),
        })
    }

    /// Run until the process ends.
    pub async fn watch(self) {
        let mut last = fingerprint(&self.dir);
        let mut version: u64 = 1;
        loop {
            tokio::time::sleep(self.interval).await;
            let now = fingerprint(&self.dir);
            if now == last {
                continue;
            }
            // A file being written is read again after a pause and acted on only when it
            // stayed the same (as the config file's reload does).
            tokio::time::sleep(Duration::from_millis(100)).await;
            if fingerprint(&self.dir) != now {
                continue;
            }
            last = now;
            match read_dir(&self.dir) {
                Ok(resources) => {
                    version += 1;
                    let refused = apply(&self.store, resources, &version.to_string());
                    report(&self.dir, &refused, &self.metrics);
                    tracing::info!(dir = %self.dir.display(), version, refused = refused.len(), "xDS resources re-applied from files");
                }
                Err(e) => {
                    self.metrics.xds_file_refusals.inc();
                    tracing::warn!(error = %e, "xDS resource files not applied; the resources in force stay");
                }
            }
        }
    }
}

/// A store holding these resources (JSON arrays), every one accepted (tests).
#[cfg(test)]
pub(crate) fn store_of(
    clusters: Value,
    endpoints: Value,
    listeners: Value,
    routes: Value,
) -> Store {
    let dir = tempfile::tempdir().expect("tempdir");
    for (base, v) in [
        ("clusters", clusters),
        ("endpoints", endpoints),
        ("listeners", listeners),
        ("routes", routes),
    ] {
        std::fs::write(dir.path().join(format!("{base}.json")), v.to_string()).expect("write");
    }
    let store = Store::new();
    let refused = apply(&store, read_dir(dir.path()).expect("reads"), "1");
    assert!(refused.is_empty(), "{refused:?}");
    store
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTERS: &str = r#"[
      {"name": "outbound|80||a.default.svc.cluster.local", "type": "EDS",
       "eds_cluster_config": {"eds_config": {"ads": {}}}, "connect_timeout": "1s"},
      {"name": "odd", "type": "STATIC", "lb_policy": "MAGLEV"},
      {"name": "bad", "type": "NOPE"}
    ]"#;

    #[test]
    fn a_directory_applies_with_refusals_named_and_the_rest_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("clusters.json"), CLUSTERS).expect("write");
        std::fs::write(
            dir.path().join("endpoints.yaml"),
            "- cluster_name: outbound|80||a.default.svc.cluster.local\n  endpoints:\n  - lb_endpoints:\n    - endpoint: {address: {socket_address: {address: 10.0.0.1, port_value: 80}}}\n",
        )
        .expect("write");
        let store = Store::new();
        let refused = apply(&store, read_dir(dir.path()).expect("reads"), "1");
        let names: Vec<&str> = refused.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["bad", "odd"], "{refused:?}");
        assert!(refused[1].reason.contains("lb_policy"), "{refused:?}");
        let snap = store.snapshot();
        assert_eq!(snap.clusters.len(), 1);
        let cla = snap
            .endpoints("outbound|80||a.default.svc.cluster.local")
            .expect("endpoints");
        assert_eq!(cla.localities[0].endpoints.len(), 1);

        // A file that does not parse: nothing is applied, what is held stays.
        std::fs::write(dir.path().join("clusters.json"), "[{").expect("write");
        assert!(read_dir(dir.path()).is_err());
        assert_eq!(store.snapshot().clusters.len(), 1);

        assert!(read_dir(&dir.path().join("missing")).is_err());

        // Endpoints the file no longer holds go, though their cluster still wants them.
        std::fs::write(dir.path().join("clusters.json"), CLUSTERS).expect("write");
        std::fs::write(dir.path().join("endpoints.yaml"), "[]").expect("write");
        apply(&store, read_dir(dir.path()).expect("reads"), "2");
        assert!(store
            .snapshot()
            .endpoints("outbound|80||a.default.svc.cluster.local")
            .is_none());

        // A removed resource goes (state of the world).
        std::fs::write(dir.path().join("clusters.json"), "[]").expect("write");
        let refused = apply(&store, read_dir(dir.path()).expect("reads"), "2");
        assert!(refused.is_empty());
        assert!(store.snapshot().clusters.is_empty());
    }

    /// Envoy's JSON names each resource's type (`@type`, as config dumps and istiod's tools
    /// write it): the kind's own type is read, another is refused by name.
    #[test]
    fn resources_with_their_any_type_are_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("clusters.json"),
            r#"[
              {"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
               "name": "typed", "type": "STATIC", "connect_timeout": "1s"},
              {"@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
               "name": "mistyped"}
            ]"#,
        )
        .expect("write");
        let store = Store::new();
        let refused = apply(&store, read_dir(dir.path()).expect("reads"), "1");
        let names: Vec<&str> = refused.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["mistyped"], "{refused:?}");
        assert!(refused[0].reason.contains("not a cluster"), "{refused:?}");
        assert!(store.snapshot().cluster("typed").is_some());
    }
}
