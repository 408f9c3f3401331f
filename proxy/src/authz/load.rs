//! The policy directory: read it, keep the policies that apply to this workload, and put a new
//! set in force when the files change.
//!
//! As Istio does for a sidecar, a policy applies when it is in the pod's own namespace or in the
//! root namespace, names no `targetRef` (those are for gateways and waypoints), and its
//! `selector.matchLabels` are all among the pod's labels (no selector: every workload there).
//! The directory is watched like the config file ([`DirWatch`]: a file renamed into place, a
//! mounted ConfigMap's `..data` symlink swap), and polled every `authorization.watch_interval`
//! only where no watch can be set. What else the set depends on (the `authorization` settings
//! of a reloaded config, the certificate's trust domain) is held in memory and compared every
//! [`SETTINGS_CHECK`], without reading a file. A set is built from all files at once; if any
//! file is invalid, the whole change is refused, logged with its file, line and field, and the
//! running set stays.

use super::compile::Context;
use super::engine::{Action, Policy, PolicySet};
use super::policy::{self, PolicyError};
use super::Authorizer;
use crate::file_watch::DirWatch;
use crate::identity::Store;
use arc_swap::ArcSwap;
use remora_config::{AuthorizationConfig, Config};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long changed files must stay the same before they are read as a new set.
const SETTLE: Duration = Duration::from_millis(100);
/// How often the settings besides the files are compared with those the set was built from.
const SETTINGS_CHECK: Duration = Duration::from_secs(1);
/// Files read from the directory.
const EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

/// Who the policies are selected for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workload {
    /// `POD_NAMESPACE`; `None` when unknown (then only the root namespace's policies apply).
    pub namespace: Option<String>,
    /// The pod's labels.
    pub labels: BTreeMap<String, String>,
}

/// Whether `p` applies to `w`, with `root` the root namespace.
pub fn applies(p: &Policy, w: &Workload, root: &str) -> bool {
    let in_scope = p.namespace == root || w.namespace.as_deref() == Some(p.namespace.as_str());
    let selected = p
        .selector
        .as_ref()
        .is_none_or(|s| s.iter().all(|(k, v)| w.labels.get(k) == Some(v)));
    in_scope && selected && !p.targets_gateways
}

/// The policy files of `dir` (`*.yaml`, `*.yml`, `*.json`, hidden ones skipped), by name,
/// with their contents.
pub fn read_dir(dir: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>, PolicyError> {
    let read_error = |file: &Path, source| PolicyError::Read {
        file: file.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| read_error(dir, e))? {
        let path = entry.map_err(|e| read_error(dir, e))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or(".");
        let wanted = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| EXTENSIONS.contains(&e));
        // Kubernetes' `..data` links and editors' temporary files start with a dot.
        if name.starts_with('.') || !wanted || !path.is_file() {
            continue;
        }
        let contents = std::fs::read(&path).map_err(|e| read_error(&path, e))?;
        files.push((path, contents));
    }
    files.sort();
    Ok(files)
}

/// A set built from a directory's files.
#[derive(Debug, Default)]
pub struct Built {
    pub set: PolicySet,
    /// `namespace/name` of the policies that apply.
    pub applied: Vec<String>,
    /// What deserves a warning in the log.
    pub warnings: Vec<String>,
}

/// Parse every file and keep what applies to `w`.
pub fn build(
    files: &[(PathBuf, Vec<u8>)],
    ctx: &Context,
    w: &Workload,
    root: &str,
) -> Result<Built, PolicyError> {
    let mut built = Built::default();
    let mut applying = Vec::new();
    for (file, bytes) in files {
        let text = std::str::from_utf8(bytes).map_err(|_| PolicyError::Invalid {
            file: file.clone(),
            line: None,
            column: None,
            field: String::new(),
            message: "not UTF-8 text".into(),
        })?;
        let parsed = policy::parse(text, file, ctx)?;
        built.warnings.extend(parsed.warnings);
        applying.extend(parsed.policies.into_iter().filter(|p| applies(p, w, root)));
    }
    for p in &applying {
        built.applied.push(format!("{}/{}", p.namespace, p.name));
        if p.action == Action::Custom {
            built.warnings.push(format!(
                "{}/{}: CUSTOM (external authorization) is not supported; what its rules match is denied, as Istio denies it when it cannot use the provider",
                p.namespace, p.name
            ));
        }
    }
    built.set = PolicySet::new(&applying);
    Ok(built)
}

/// Everything a set depends on: when any of it changes, the set is built again.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Inputs {
    dir: Option<PathBuf>,
    root: String,
    trust_domains: Vec<String>,
    files: Option<Vec<(PathBuf, Vec<u8>)>>,
}

impl Inputs {
    /// Whether these inputs were taken with `settings`.
    fn has_settings(&self, (dir, root, trust_domains): &Settings) -> bool {
        self.dir == *dir && self.root == *root && self.trust_domains == *trust_domains
    }
}

/// The directory, the root namespace, and the trust domains `cluster.local` stands for.
type Settings = (Option<PathBuf>, String, Vec<String>);

/// The watch on the policy directory, and which directory it is (a reload may name another).
#[derive(Debug)]
struct Watched {
    dir: PathBuf,
    watch: DirWatch,
}

/// Keeps the authorizer's set in step with the policy directory and the config.
#[derive(Debug)]
pub struct Watcher {
    pub authorizer: Arc<Authorizer>,
    pub config: Arc<ArcSwap<Config>>,
    /// The workload certificate: its trust domain is the one `cluster.local` stands for.
    pub identity: Arc<Store>,
    pub workload: Workload,
    last: Option<Inputs>,
    watched: Option<Watched>,
    /// The directory could not be read: watch it afresh (a watch on a removed directory sees
    /// nothing more), polling until it can be watched again.
    rewatch: bool,
}

impl Watcher {
    pub fn new(
        authorizer: Arc<Authorizer>,
        config: Arc<ArcSwap<Config>>,
        identity: Arc<Store>,
        workload: Workload,
    ) -> Self {
        Watcher {
            authorizer,
            config,
            identity,
            workload,
            last: None,
            watched: None,
            rewatch: false,
        }
    }

    /// Whether the policy directory is watched (else it is polled every `watch_interval`).
    pub fn is_watching(&self) -> bool {
        self.watched.as_ref().is_some_and(|w| w.watch.is_watching())
    }

    /// Watch `dir` (none: nothing to watch) unless it already is and the watch was not lost.
    fn watch_dir(&mut self, dir: Option<&Path>) {
        let current = self.watched.as_ref().map(|w| w.dir.as_path());
        if current == dir && !self.rewatch {
            return;
        }
        // A directory still missing is polled by the watch set when it went: another set now
        // would only log again that it cannot be watched.
        let polling = self
            .watched
            .as_ref()
            .is_some_and(|w| !w.watch.is_watching());
        if current == dir && polling && dir.is_some_and(|d| !d.is_dir()) {
            return;
        }
        self.watched = dir.map(|dir| Watched {
            dir: dir.to_path_buf(),
            watch: DirWatch::new(&[dir.to_path_buf()], "authorization policy files"),
        });
    }

    /// Resolves when the directory's files may have changed: never without a directory.
    async fn files_changed(&self, poll: Duration) {
        match &self.watched {
            Some(w) => w.watch.changed(poll).await,
            None => std::future::pending().await,
        }
    }

    /// Load the policies now (at start): an error is returned, so a broken policy fails the
    /// start instead of leaving the workload open. The directory's watch is set first, so that
    /// no change after this read is missed.
    pub fn load(&mut self) -> Result<(), PolicyError> {
        let dir = self.settings().0;
        self.watch_dir(dir.as_deref());
        let inputs = self.inputs()?;
        let result = self.apply(&inputs);
        self.last = Some(inputs);
        result
    }

    /// Keep the set in step until the process ends.
    pub async fn watch(mut self) {
        let mut settings_check = tokio::time::interval(SETTINGS_CHECK);
        settings_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let interval = self.config.load().authorization.watch_interval;
            tokio::select! {
                () = self.files_changed(interval) => {}
                _ = settings_check.tick() => {
                    let settings = self.settings();
                    if self.last.as_ref().is_some_and(|l| l.has_settings(&settings)) {
                        continue;
                    }
                }
            }
            let settings = self.settings();
            self.watch_dir(settings.0.as_deref());
            let inputs = match self.read_inputs().await {
                Ok(i) => {
                    self.rewatch = false;
                    i
                }
                Err(e) => {
                    if !self.rewatch {
                        // A watch on a directory that went away sees nothing more: set one
                        // afresh (it polls while the directory is missing) at each look until
                        // the directory reads again.
                        self.rewatch = true;
                        self.watch_dir(settings.0.as_deref());
                    }
                    let told = self
                        .last
                        .as_ref()
                        .is_some_and(|l| l.files.is_none() && l.has_settings(&settings));
                    if !told {
                        self.refused(&e);
                    }
                    // Logged once, until the directory reads again or the settings change; the
                    // set in force stays.
                    let (dir, root, trust_domains) = settings;
                    self.last = Some(Inputs {
                        dir,
                        root,
                        trust_domains,
                        files: None,
                    });
                    continue;
                }
            };
            if self.last.as_ref() == Some(&inputs) {
                continue;
            }
            // Files being written: act only on what stays the same across a short pause.
            tokio::time::sleep(SETTLE).await;
            match self.read_inputs().await {
                Ok(again) if again == inputs => {}
                _ => continue,
            }
            if let Err(e) = self.apply(&inputs) {
                self.refused(&e);
            }
            self.last = Some(inputs);
        }
    }

    fn refused(&self, e: &PolicyError) {
        self.authorizer.metrics().reloads_failed.inc();
        tracing::error!("authorization policies refused, keeping the running ones: {e}");
    }

    async fn read_inputs(&self) -> Result<Inputs, PolicyError> {
        let settings = self.settings();
        let dir = settings.0.clone();
        let files = tokio::task::spawn_blocking(move || dir.as_deref().map(read_dir).transpose())
            .await
            .unwrap_or_else(|e| {
                Err(PolicyError::Read {
                    file: PathBuf::new(),
                    source: std::io::Error::other(e),
                })
            })?;
        Ok(Inputs {
            dir: settings.0,
            root: settings.1,
            trust_domains: settings.2,
            files: files.or(Some(Vec::new())),
        })
    }

    fn inputs(&self) -> Result<Inputs, PolicyError> {
        let (dir, root, trust_domains) = self.settings();
        let files = dir.as_deref().map(read_dir).transpose()?;
        Ok(Inputs {
            dir,
            root,
            trust_domains,
            files: files.or(Some(Vec::new())),
        })
    }

    /// The directory, the root namespace, and the trust domains `cluster.local` stands for.
    fn settings(&self) -> Settings {
        let config = self.config.load();
        let AuthorizationConfig {
            policy_dir,
            root_namespace,
            trust_domain_aliases,
            ..
        } = &config.authorization;
        let local = self
            .identity
            .current()
            .map(|id| id.spiffe_id.trust_domain().to_string())
            .unwrap_or_else(|| super::compile::CLUSTER_LOCAL.to_string());
        let mut trust_domains = vec![local];
        for alias in trust_domain_aliases {
            if !trust_domains.contains(alias) {
                trust_domains.push(alias.clone());
            }
        }
        (policy_dir.clone(), root_namespace.clone(), trust_domains)
    }

    fn apply(&self, inputs: &Inputs) -> Result<(), PolicyError> {
        let files = inputs.files.as_deref().unwrap_or_default();
        let ctx = Context {
            trust_domains: inputs.trust_domains.clone(),
        };
        let built = build(files, &ctx, &self.workload, &inputs.root)?;
        for w in &built.warnings {
            tracing::warn!("authorization policy {w}");
        }
        let c = built.set.counts;
        tracing::info!(
            dir = %inputs.dir.as_deref().unwrap_or(Path::new("-")).display(),
            files = files.len(), applied = ?built.applied,
            allow = c.allow, deny = c.deny, audit = c.audit, custom = c.custom, dry_run = c.dry_run,
            "authorization policies in force"
        );
        self.authorizer.install(built.set);
        self.authorizer.metrics().reloads_ok.inc();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
