//! Reloading the config file on SIGHUP and when its content changes.
//!
//! The file's directory is watched (`file_watch`: inotify, as Envoy watches its config; a
//! watch on the file itself would miss Kubernetes' ConfigMap update, which swaps a symlink in
//! the parent directory), and polled every `reload.watch_interval` only where no watch can be
//! set. Whatever woke it, the bytes are compared with the last ones acted upon. A valid new
//! config is swapped in whole
//! and new connections use it; an invalid one is logged with its file, line and field, counted,
//! and the running config stays.

use crate::file_watch::DirWatch;
use crate::metrics::Metrics;
use arc_swap::ArcSwap;
use remora_config::Config;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::signal::unix::{signal, SignalKind};

/// How long a changed file must stay unchanged before it is read as a new config.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(100);

/// pilot-agent's `MINIMUM_DRAIN_DURATION` when the variable is unset
/// (`pilot/cmd/pilot-agent/options`): with `EXIT_ON_ZERO_ACTIVE_CONNECTIONS`, the connections
/// are not counted before it has passed, so load balancers stop sending new ones first.
pub const ISTIO_MINIMUM_DRAIN_DURATION: std::time::Duration = std::time::Duration::from_secs(5);

/// Settings given on the command line or in the environment; they win over every loaded file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--access-log`.
    pub access_log: bool,
    /// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true`.
    pub exit_on_zero_active_connections: bool,
    /// `MINIMUM_DRAIN_DURATION`.
    pub minimum_drain_duration: Option<std::time::Duration>,
    /// Exit-on-zero was asked for by Istio's `EXIT_ON_ZERO_ACTIVE_CONNECTIONS` without a
    /// minimum: pilot-agent's own default ([`ISTIO_MINIMUM_DRAIN_DURATION`]) applies unless
    /// the file sets one.
    pub istio_minimum_drain_default: bool,
    /// ProxyConfig's `drainDuration` (in `PROXY_CONFIG`): how long the connections of a
    /// filter chain an xDS update retired keep going (`drain.drain_time`).
    pub drain_time: Option<std::time::Duration>,
    /// `ISTIO_META_IDLE_TIMEOUT`.
    pub idle_timeout: Option<std::time::Duration>,
    /// `ISTIO_META_DNS_CAPTURE=true`: serve DNS.
    pub dns_capture: bool,
    /// `ISTIO_META_INTERCEPTION_MODE`.
    pub interception_mode: Option<remora_config::InterceptionMode>,
    /// `--status-port`: where the agent listens.
    pub agent_port: Option<std::num::NonZeroU16>,
    /// `--listen`/`--upstream`/`--protocol`: replaces the file's listeners.
    pub listener: Option<remora_config::ListenerConfig>,
}

impl Overrides {
    /// `config` with the overrides applied.
    pub fn apply(&self, mut config: Config) -> Config {
        if self.access_log {
            config.access_log.enabled = true;
        }
        if self.exit_on_zero_active_connections {
            config.drain.exit_on_zero_active_connections = true;
        }
        if let Some(minimum) = self.minimum_drain_duration {
            config.drain.minimum_duration = minimum;
        } else if self.istio_minimum_drain_default && config.drain.minimum_duration.is_zero() {
            config.drain.minimum_duration = ISTIO_MINIMUM_DRAIN_DURATION;
        }
        if let Some(drain_time) = self.drain_time {
            config.drain.drain_time = drain_time;
        }
        if let Some(idle) = self.idle_timeout {
            // Istio's metadata sets Envoy's TCP and HTTP connection idle timeouts alike; zero
            // turns the TCP one off and leaves HTTP's (which cannot be off here) as it was.
            config.tcp.idle_timeout = idle;
            if !idle.is_zero() {
                config.http.idle_timeout = idle;
            }
        }
        if self.dns_capture {
            config.dns.enabled = true;
        }
        if let Some(port) = self.agent_port {
            config.agent.port = port;
        }
        if let Some(mode) = self.interception_mode {
            config.inbound.interception_mode = mode;
        }
        if let Some(l) = &self.listener {
            config.listeners = vec![l.clone()];
        }
        config
    }
}

/// Watches one config file and swaps new configs into `store`.
#[derive(Debug)]
pub struct Reloader {
    pub path: PathBuf,
    pub overrides: Overrides,
    pub store: Arc<ArcSwap<Config>>,
    pub metrics: Arc<Metrics>,
    /// The content last acted upon (`None`: the file could not be read).
    pub last: Option<Vec<u8>>,
}

impl Reloader {
    /// Run until the process ends.
    pub async fn watch(mut self) {
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot handle SIGHUP; the config file is still watched");
                None
            }
        };
        let watch = DirWatch::new(&DirWatch::dirs_of_file(&self.path), "config file");
        loop {
            let interval = self.store.load().reload.watch_interval;
            tokio::select! {
                Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => None } } => {
                    let content = tokio::fs::read(&self.path).await;
                    self.reload(content.ok(), "SIGHUP");
                }
                () = watch.changed(interval) => {
                    let content = tokio::fs::read(&self.path).await.ok();
                    if content == self.last {
                        continue;
                    }
                    // Editors and `echo >` truncate before they write: act only on content that
                    // stays the same across a short pause, never on a half-written file.
                    tokio::time::sleep(SETTLE).await;
                    let again = tokio::fs::read(&self.path).await.ok();
                    if again == content {
                        self.reload(content, "file changed");
                    }
                }
            }
        }
    }

    fn reload(&mut self, content: Option<Vec<u8>>, why: &str) {
        self.last.clone_from(&content);
        let result = match content {
            None => remora_config::load(&self.path),
            Some(bytes) => match String::from_utf8(bytes) {
                Ok(text) => remora_config::parse(&text, &self.path),
                Err(_) => remora_config::load(&self.path),
            },
        };
        match result {
            Ok(new) => {
                let mut new = self.overrides.apply(new);
                let old = self.store.load();
                warn_if_needs_restart(&old, &new);
                // The inbound listener was bound transparent or not at start; its connections
                // must go on being dialled for that mode.
                new.inbound.interception_mode = old.inbound.interception_mode;
                self.store.store(Arc::new(new));
                self.metrics.reloads_ok.inc();
                tracing::info!(file = %self.path.display(), why, "config reloaded");
            }
            Err(e) => {
                self.metrics.reloads_failed.inc();
                tracing::error!(
                    why,
                    "config reload refused, keeping the running config: {e}"
                );
            }
        }
    }
}

/// Listeners are bound once at start; say so when a reload asks for different ones.
fn warn_if_needs_restart(old: &Config, new: &Config) {
    if old.own_ports() != new.own_ports()
        || old.bind_addresses != new.bind_addresses
        || old.listeners != new.listeners
    {
        tracing::warn!("listener ports or addresses changed; they take effect at the next start");
    }
    if old.inbound.interception_mode != new.inbound.interception_mode || old.dns != new.dns {
        tracing::warn!(
            "inbound.interception_mode or dns changed; they take effect at the next start"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn reloader(path: PathBuf) -> Reloader {
        Reloader {
            path,
            overrides: Overrides {
                access_log: true,
                exit_on_zero_active_connections: false,
                minimum_drain_duration: None,
                listener: None,
                ..Overrides::default()
            },
            store: Arc::new(ArcSwap::from_pointee(Config::default())),
            metrics: Arc::new(Metrics::default()),
            last: None,
        }
    }

    #[test]
    fn istios_exit_on_zero_without_a_minimum_takes_pilot_agents_five_seconds() {
        let istio = Overrides {
            exit_on_zero_active_connections: true,
            istio_minimum_drain_default: true,
            ..Overrides::default()
        };
        let c = istio.apply(Config::default());
        assert!(c.drain.exit_on_zero_active_connections);
        assert_eq!(c.drain.minimum_duration, Duration::from_secs(5));
        // A minimum in the file, or in MINIMUM_DRAIN_DURATION, wins.
        let mut file = Config::default();
        file.drain.minimum_duration = Duration::from_secs(2);
        assert_eq!(
            istio.apply(file).drain.minimum_duration,
            Duration::from_secs(2)
        );
        let given = Overrides {
            minimum_drain_duration: Some(Duration::ZERO),
            ..istio.clone()
        };
        assert_eq!(
            given.apply(Config::default()).drain.minimum_duration,
            Duration::ZERO
        );
    }

    #[test]
    fn proxy_configs_drain_duration_wins_over_the_files_drain_time() {
        let mut file = Config::default();
        file.drain.drain_time = Duration::from_secs(10);
        assert_eq!(
            Overrides::default().apply(file.clone()).drain.drain_time,
            Duration::from_secs(10)
        );
        let istio = Overrides {
            drain_time: Some(Duration::from_secs(3)),
            ..Overrides::default()
        };
        let c = istio.apply(file);
        assert_eq!(c.drain.drain_time, Duration::from_secs(3));
        // SIGTERM's drain period is another setting (terminationDrainDuration).
        assert_eq!(c.drain.duration, Config::default().drain.duration);
    }

    #[test]
    fn istios_idle_timeout_sets_tcps_and_https_but_zero_only_tcps() {
        let minutes = Overrides {
            idle_timeout: Some(Duration::from_secs(600)),
            ..Overrides::default()
        };
        let c = minutes.apply(Config::default());
        assert_eq!(c.tcp.idle_timeout, Duration::from_secs(600));
        assert_eq!(c.http.idle_timeout, Duration::from_secs(600));
        let zero = Overrides {
            idle_timeout: Some(Duration::ZERO),
            ..Overrides::default()
        };
        let c = zero.apply(Config::default());
        assert_eq!(c.tcp.idle(), None);
        assert_eq!(c.http.idle_timeout, Config::default().http.idle_timeout);
    }

    #[test]
    fn valid_file_replaces_and_invalid_file_keeps_the_running_config() {
        let dir = std::env::temp_dir().join(format!("remora-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("remora.yaml");
        let mut r = reloader(path.clone());

        std::fs::write(&path, "drain:\n  duration: 7s\n").unwrap();
        r.reload(std::fs::read(&path).ok(), "test");
        assert_eq!(r.store.load().drain.duration, Duration::from_secs(7));
        // The command-line override survives a reload.
        assert!(r.store.load().access_log.enabled);
        assert_eq!(r.metrics.reloads_ok.get(), 1);

        std::fs::write(&path, "drain:\n  duration: never\n").unwrap();
        r.reload(std::fs::read(&path).ok(), "test");
        assert_eq!(r.store.load().drain.duration, Duration::from_secs(7));
        assert_eq!(r.metrics.reloads_failed.get(), 1);

        std::fs::remove_dir_all(&dir).unwrap();
    }
}
