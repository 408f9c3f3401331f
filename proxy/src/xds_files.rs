//! xDS resources from files (`xds.resources_dir`): how tests, benchmarks and a laptop drive
//! routing without a control plane. Each file holds the whole set of one type; each resource is
//! converted from Envoy's JSON (or YAML) to its proto and handed to the same [`Sink::apply`] the
//! ADS client uses: what Remora refuses is logged and counted and the rest applies, exactly as a
//! NACK from istiod would leave it.
//!
//! The directory is watched (`file_watch`: inotify, as Envoy watches a `watched_directory`;
//! polled every `xds.watch_interval` only where no watch can be set), and what woke it is
//! checked with `stat`: a file is read again when its size, times or inode change (a rename
//! over it, as a Kubernetes ConfigMap update does, changes the inode). A file read again applies only what
//! differs from its last reading, as a delta update would: each resource's JSON is hashed, and
//! only new or changed ones are converted and delivered, with the names that went as removals.
//! So one moved endpoint costs the parse of the endpoints file and the conversion of one
//! resource, not of the whole configuration. A file that cannot be read or parsed as a whole
//! keeps its resources in force.

use prost::Message;
use remora_xds::json::{from_json, yaml_to_json};
use remora_xds::refusal::Kind;
use remora_xds::sink::{type_url, Rejection, Resource, Sink, Update};
use remora_xds::snapshot::Snapshot;
use remora_xds::store::Store;
use serde::de::{Deserializer as _, SeqAccess, Visitor};
use serde_json::Value;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The kinds read from a directory, in the order Envoy applies them: clusters before the
/// endpoints and secrets (istiod's, for a DestinationRule's `credentialName`) they name,
/// listeners before the route tables they name (applying a type drops what no held resource
/// of the type before it wants). Then the name table (istiod's NDS, for the DNS proxy; one
/// resource, unnamed), which nothing else depends on.
const ORDER: [(&str, Kind, &str); 6] = [
    ("clusters", Kind::Cluster, type_url::CLUSTER),
    ("endpoints", Kind::Endpoint, type_url::ENDPOINT),
    ("secrets", Kind::Secret, type_url::SECRET),
    ("listeners", Kind::Listener, type_url::LISTENER),
    ("routes", Kind::Route, type_url::ROUTE),
    ("name_tables", Kind::NameTable, type_url::NAME_TABLE),
];

/// A file that could not be read as a whole.
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

/// The file for `base` in `dir`, in whichever of the extensions exists.
fn file_of(dir: &Path, base: &str) -> Option<PathBuf> {
    ["json", "yaml", "yml"]
        .iter()
        .map(|ext| dir.join(format!("{base}.{ext}")))
        .find(|p| p.is_file())
}

/// A file as `stat` sees it: any write, touch or rename over it changes one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    path: PathBuf,
    len: u64,
    inode: u64,
    modified: Option<SystemTime>,
    /// The inode's change time (seconds, nanoseconds): a write that keeps size and mtime
    /// (`touch -d`, a copy with preserved times) still changes it.
    changed: (i64, i64),
}

fn stamp(dir: &Path, base: &str) -> Option<Stamp> {
    let path = file_of(dir, base)?;
    let meta = std::fs::metadata(&path).ok()?;
    Some(Stamp {
        len: meta.len(),
        inode: meta.ino(),
        modified: meta.modified().ok(),
        changed: (meta.ctime(), meta.ctime_nsec()),
        path,
    })
}

/// One resource as last read: a hash of its JSON, and whether the store took it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    hash: u64,
    accepted: bool,
}

/// One kind's file as last read.
#[derive(Debug, Default)]
struct Held {
    stamp: Option<Stamp>,
    resources: HashMap<String, Seen>,
}

/// A resources directory and what was last read of it.
#[derive(Debug)]
pub struct Source {
    dir: PathBuf,
    held: [Held; ORDER.len()],
}

/// What one [`Source::sync`] did.
#[derive(Debug, Default)]
pub struct Synced {
    /// Files read again (changed, or depending on one that did).
    pub files_read: usize,
    /// Resources converted and delivered: new or changed.
    pub delivered: usize,
    /// Resources gone from their file.
    pub removed: usize,
    /// Every refusal, each once.
    pub refused: Vec<Rejection>,
    /// Files that could not be read or parsed: their resources stay in force.
    pub errors: Vec<FilesError>,
}

impl Source {
    /// A directory not read yet: the first [`Source::sync`] applies all of it.
    pub fn new(dir: PathBuf) -> Source {
        Source {
            dir,
            held: Default::default(),
        }
    }

    fn stamps(&self) -> [Option<Stamp>; ORDER.len()] {
        ORDER.map(|(base, _, _)| stamp(&self.dir, base))
    }

    /// Whether a file changed since it was last read.
    fn changed(&self, stamps: &[Option<Stamp>; ORDER.len()]) -> bool {
        self.held.iter().zip(stamps).any(|(h, s)| &h.stamp != s)
    }

    /// Read the files that changed and apply what differs in them to `store`.
    pub fn sync(&mut self, store: &Store, version: &str) -> Synced {
        let mut out = Synced::default();
        // A directory that is not there is a mistake, not an empty world: every outbound
        // connection would be refused for want of a listener.
        if !self.dir.is_dir() {
            out.errors.push(FilesError::Read {
                path: self.dir.clone(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
            });
            return out;
        }
        let stamps = self.stamps();
        let mut read: [bool; ORDER.len()] =
            std::array::from_fn(|i| self.held[i].stamp != stamps[i]);
        // Applying clusters prunes the endpoints no cluster wants, and listeners the route
        // tables: the file after each is read again, so that what it still holds for a cluster
        // or listener that came back is delivered again.
        read[1] |= read[0];
        // A cluster wants its secrets once its endpoints are held (as Envoy asks for them):
        // a secrets file that is there is read again when either changed.
        read[2] |= (read[0] || read[1]) && stamps[2].is_some();
        read[4] |= read[3];
        for (i, stamp) in stamps.into_iter().enumerate() {
            if !read[i] {
                continue;
            }
            out.files_read += 1;
            if let Err(e) = self.sync_kind(i, stamp.clone(), store, version, &mut out) {
                out.errors.push(e);
                // Read again when it changes again, not at every poll.
                self.held[i].stamp = stamp;
            }
        }
        out
    }

    /// Read kind `i`'s file and deliver what is new, changed or gone.
    fn sync_kind(
        &mut self,
        i: usize,
        stamp: Option<Stamp>,
        store: &Store,
        version: &str,
        out: &mut Synced,
    ) -> Result<(), FilesError> {
        let (_, kind, url) = ORDER[i];
        let snapshot = store.snapshot();
        // What the held clusters or listeners want, computed only if asked.
        let wanted = std::cell::OnceCell::new();
        let wanted = || {
            wanted.get_or_init(|| match url {
                type_url::ENDPOINT => Some(snapshot.wanted_endpoints()),
                type_url::SECRET => Some(snapshot.wanted_secrets()),
                type_url::ROUTE => Some(snapshot.wanted_routes()),
                _ => None,
            })
        };
        let previous = &self.held[i].resources;
        let mut now: HashMap<String, Seen> = HashMap::with_capacity(previous.len());
        let mut delivered = Vec::new();
        let mut refused = Vec::new();
        if let Some(stamp) = &stamp {
            for_each_item(&stamp.path, |item| {
                let name = item[kind.name_field()]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let hash = hash_of(&item);
                if let Some(seen) = previous.get(&name) {
                    // Unchanged, and refused, held, or pruned with the cluster or listener
                    // that wanted it and still unwanted: nothing to do. One pruned that is
                    // wanted again (its cluster came back) is delivered again.
                    let pruned = || match wanted() {
                        Some(wanted) => !wanted.contains(&name),
                        None => false,
                    };
                    if seen.hash == hash
                        && (!seen.accepted || holds(&snapshot, url, &name) || pruned())
                    {
                        now.insert(name, *seen);
                        return;
                    }
                }
                let body = match to_proto(kind, &name, &item) {
                    Ok(body) => body,
                    Err(reason) => {
                        refused.push(Rejection {
                            name: name.clone(),
                            reason,
                        });
                        // Still delivered, as bytes the store cannot decode: it refuses them
                        // under this name and keeps the version it holds, as for any refused
                        // resource.
                        vec![0xff]
                    }
                };
                delivered.push(Resource {
                    name: name.clone(),
                    version: version.to_string(),
                    body,
                });
                now.insert(
                    name,
                    Seen {
                        hash,
                        accepted: true,
                    },
                );
            })?;
        }
        drop(snapshot);
        // A file is the whole set of its type: what it no longer holds goes (for routes and
        // endpoints too, which state of the world over ADS never removes by absence).
        let removed: Vec<String> = previous
            .keys()
            .filter(|name| !now.contains_key(*name))
            .cloned()
            .collect();
        out.delivered += delivered.len();
        out.removed += removed.len();
        if !delivered.is_empty() || !removed.is_empty() {
            let applied = store.apply(
                url,
                Update {
                    resources: delivered,
                    removed,
                    complete: false,
                },
            );
            // Those refused for their JSON come with a better reason than the store's.
            for r in applied.rejected {
                if !refused.iter().any(|known| known.name == r.name) {
                    refused.push(r);
                }
            }
        }
        for r in &refused {
            if let Some(seen) = now.get_mut(&r.name) {
                seen.accepted = false;
            }
        }
        out.refused.extend(refused);
        self.held[i] = Held {
            stamp,
            resources: now,
        };
        Ok(())
    }
}

/// Whether `snapshot` holds resource `name` of the type at `url`.
fn holds(snapshot: &Snapshot, url: &str, name: &str) -> bool {
    match url {
        type_url::CLUSTER => snapshot.clusters.contains_key(name),
        type_url::ENDPOINT => snapshot.endpoints.contains_key(name),
        type_url::LISTENER => snapshot.listeners.contains_key(name),
        type_url::NAME_TABLE => snapshot.name_tables.contains_key(name),
        type_url::SECRET => snapshot.secrets.contains_key(name),
        _ => snapshot.routes.contains_key(name),
    }
}

/// A resource's JSON as its proto, encoded; or why it is not one.
fn to_proto(kind: Kind, name: &str, item: &Value) -> Result<Vec<u8>, String> {
    let body = remora_xds::validate::resource_body(kind, item).map_err(|r| r.to_string())?;
    from_json(&body, kind.message_name())
        .map(|m| m.encode_to_vec())
        .map_err(|e| format!("{kind} {name}: {}: {e}", e.path()))
}

/// A hash of `value`'s JSON text (the same file text gives the same hash).
fn hash_of(value: &Value) -> u64 {
    struct Hashing(std::collections::hash_map::DefaultHasher);
    impl std::io::Write for Hashing {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            buf.hash(&mut self.0);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut h = Hashing(Default::default());
    // Writing a `Value` into a writer that cannot fail cannot fail.
    let _ = serde_json::to_writer(&mut h, value);
    h.0.finish()
}

/// Each resource of the file at `path` (an array), one at a time: a JSON file is parsed as it
/// is walked, so only one resource's tree is in memory at once, not the whole file's (ten
/// times its text, left behind as holes in the heap once freed).
fn for_each_item(path: &Path, mut each: impl FnMut(Value)) -> Result<(), FilesError> {
    let bytes = std::fs::read(path).map_err(|source| FilesError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let parse = |reason: String| FilesError::Parse {
        path: path.to_path_buf(),
        reason,
    };
    if path.extension().is_some_and(|e| e != "json") {
        let text = String::from_utf8(bytes).map_err(|e| parse(e.to_string()))?;
        let Value::Array(items) = yaml_to_json(&text).map_err(|e| parse(e.to_string()))? else {
            return Err(parse("not an array of resources".into()));
        };
        items.into_iter().for_each(each);
        return Ok(());
    }
    struct Items<F>(F);
    impl<'de, F: FnMut(Value)> Visitor<'de> for Items<F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array of resources")
        }
        fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
            while let Some(item) = seq.next_element::<Value>()? {
                (self.0)(item);
            }
            Ok(())
        }
    }
    let mut de = serde_json::Deserializer::from_slice(&bytes);
    de.deserialize_seq(Items(&mut each))
        .and_then(|()| de.end())
        .map_err(|e| parse(e.to_string()))
}

/// Load the directory into a new store at start: unreadable files fail the start; refused
/// resources are logged loudly and counted, and the start goes on.
pub fn load(
    dir: &Path,
    metrics: &crate::metrics::Metrics,
) -> Result<(Arc<Store>, Source), FilesError> {
    // The files are read whole: a cluster whose secret `secrets.json` lacks does not warm.
    let store = Arc::new(Store::with_secret_fetch_timeout(Some(Duration::ZERO)));
    let mut source = Source::new(dir.to_path_buf());
    let mut synced = source.sync(&store, "1");
    // What reading the files left free in the heap goes back to the system (see
    // remora-malloc): most of the resident memory after a large load, otherwise.
    remora_malloc::release_free_memory();
    if let Some(e) = synced.errors.drain(..).next() {
        return Err(e);
    }
    report(dir, &synced.refused, metrics);
    let snapshot = store.snapshot();
    tracing::info!(
        dir = %dir.display(),
        listeners = snapshot.listeners.len(),
        clusters = snapshot.clusters.len(),
        routes = snapshot.routes.len(),
        endpoints = snapshot.endpoints.len(),
        refused = synced.refused.len(),
        "xDS resources loaded from files"
    );
    Ok((store, source))
}

fn report(dir: &Path, refused: &[Rejection], metrics: &crate::metrics::Metrics) {
    for r in refused {
        metrics.xds_file_refusals.inc();
        tracing::warn!(dir = %dir.display(), resource = %r.name, reason = %r.reason, "refused an xDS resource; its previous version (if any) stays in force");
    }
}

/// Watches the directory and applies what changed in its files.
#[derive(Debug)]
pub struct Watcher {
    pub interval: Duration,
    pub store: Arc<Store>,
    pub metrics: Arc<crate::metrics::Metrics>,
    source: Source,
    /// Set at start, so that no change after the first load is missed.
    watch: crate::file_watch::DirWatch,
}

impl Watcher {
    /// Load the directory now (a start with refusals still starts; one that cannot read it
    /// does not), then keep it in step with [`Watcher::watch`].
    pub fn start(
        dir: PathBuf,
        interval: Duration,
        metrics: &Arc<crate::metrics::Metrics>,
    ) -> Result<Watcher, FilesError> {
        let watch =
            crate::file_watch::DirWatch::new(std::slice::from_ref(&dir), "xDS resource files");
        let (store, source) = load(&dir, metrics)?;
        Ok(Watcher {
            interval,
            store,
            metrics: Arc::clone(metrics),
            source,
            watch,
        })
    }

    /// Run until the process ends.
    pub async fn watch(mut self) {
        let mut version: u64 = 1;
        loop {
            self.watch.changed(self.interval).await;
            let now = self.source.stamps();
            if !self.source.changed(&now) {
                continue;
            }
            // A file being written is looked at again after a pause and read only when it
            // stayed the same (as the config file's reload does).
            tokio::time::sleep(Duration::from_millis(100)).await;
            if self.source.stamps() != now {
                continue;
            }
            version += 1;
            let synced = self.source.sync(&self.store, &version.to_string());
            remora_malloc::release_free_memory();
            let dir = self.source.dir.display();
            for e in &synced.errors {
                self.metrics.xds_file_refusals.inc();
                tracing::warn!(error = %e, "xDS resource file not applied; its resources in force stay");
            }
            report(&self.source.dir, &synced.refused, &self.metrics);
            tracing::info!(%dir, version, files = synced.files_read, changed = synced.delivered, removed = synced.removed, refused = synced.refused.len(), "xDS resources re-applied from files");
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
    let synced = Source::new(dir.path().to_path_buf()).sync(&store, "1");
    assert!(synced.errors.is_empty(), "{:?}", synced.errors);
    assert!(synced.refused.is_empty(), "{:?}", synced.refused);
    store
}

#[cfg(test)]
mod tests;
