//! Envoy's control-plane statistics, kept as atomics the client bumps and the metrics and admin
//! modules read (a scrape takes no lock the client holds across an await). The names are
//! Envoy's, so dashboards and `istioctl` checks written for Envoy read ours:
//!
//! - `control_plane.connected_state`: 1 while the ADS stream is up, 0 otherwise;
//! - `control_plane.identifier`: the identifier the control plane sends in its responses
//!   (istiod names its instance);
//! - per type, under Envoy's prefix (`cluster_manager.cds.`, `listener_manager.lds.`, and for
//!   RDS and EDS, which Envoy counts per route table and per cluster, one aggregate here):
//!   `update_attempt` (subscriptions started or changed, and every update or failure, as Envoy
//!   counts it), `update_success`, `update_rejected` (NACKs), `update_failure` (stream failures),
//!   `update_time` (ms since the epoch of the last success) and `version_text`.
//!
//! SDS, EDS and RDS are also counted per resource ([`super::ResourceStats`]: Envoy's
//! `sds.<name>.*`, `cluster.<stat name>.*`, `http.<stat prefix>.rds.<name>.*`); the per-type
//! aggregates of EDS and RDS, which Envoy does not have, are not exported.
//!
//! A per-type [`TypeStatus`] keeps the current version and the last rejection for a
//! `/config_dump`-style display.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::sink::type_url;

/// The four types a sidecar subscribes to, in Envoy's subscription order, then istiod's name
/// table (pilot-agent's NDS, which Envoy never sees: it appears in a [`StatsSnapshot`] only
/// once subscribed).
pub const TYPES: [&str; 6] = [
    type_url::CLUSTER,
    type_url::ENDPOINT,
    type_url::SECRET,
    type_url::LISTENER,
    type_url::ROUTE,
    type_url::NAME_TABLE,
];

/// Envoy's stat prefix for a type's subscription.
pub fn stat_prefix(type_url: &str) -> &'static str {
    match type_url {
        type_url::CLUSTER => "cluster_manager.cds",
        type_url::LISTENER => "listener_manager.lds",
        type_url::ROUTE => "rds",
        type_url::ENDPOINT => "eds",
        type_url::NAME_TABLE => "nds",
        type_url::SECRET => "sds",
        _ => "unknown",
    }
}

/// The counters and status of one type.
#[derive(Debug, Default)]
pub struct TypeStats {
    /// `update_attempt`: subscription starts and changes, updates, stream failures.
    pub update_attempt: AtomicU64,
    /// `update_success`: updates accepted whole.
    pub update_success: AtomicU64,
    /// `update_rejected`: updates NACKed.
    pub update_rejected: AtomicU64,
    /// `update_failure`: streams that failed while this type was subscribed.
    pub update_failure: AtomicU64,
    /// Milliseconds since the Unix epoch of the last successful update; 0 before one.
    pub update_time: AtomicU64,
    status: Mutex<TypeStatus>,
}

/// What `/config_dump` shows per type: the version in force and the last refusal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypeStatus {
    /// The last accepted version (SotW `version_info`, delta `system_version_info`).
    pub version_text: String,
    /// When the last update was accepted.
    pub last_update: Option<SystemTime>,
    /// The last NACK sent for this type, kept until an update is fully accepted.
    pub last_error: Option<UpdateError>,
}

/// One NACK as sent: what was refused, when, and the `error_detail` message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateError {
    /// The version the control plane offered (SotW) or its `system_version_info` (delta).
    pub version: String,
    /// The nonce of the refused response.
    pub nonce: String,
    /// The `error_detail` message sent.
    pub message: String,
    /// When it was sent.
    pub at: SystemTime,
}

/// All the client's statistics; share it with `Arc` and read it at any time.
#[derive(Debug)]
pub struct Stats {
    /// `control_plane.connected_state`.
    pub connected_state: AtomicU64,
    identifier: Mutex<String>,
    types: [TypeStats; TYPES.len()],
    /// SDS counted per secret, as Envoy counts it (`sds.<name>.*`)…
    pub secrets: super::ResourceStats,
    /// … EDS per cluster's endpoint name (`cluster.<stat name>.*`)…
    pub endpoints: super::ResourceStats,
    /// … and RDS per route table (`http.<stat prefix>.rds.<name>.*`).
    pub routes: super::ResourceStats,
}

/// A point-in-time copy of one type's statistics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeSnapshot {
    /// The resource type.
    pub type_url: &'static str,
    /// Envoy's stat prefix, e.g. `cluster_manager.cds`.
    pub prefix: &'static str,
    /// See [`TypeStats::update_attempt`].
    pub update_attempt: u64,
    /// See [`TypeStats::update_success`].
    pub update_success: u64,
    /// See [`TypeStats::update_rejected`].
    pub update_rejected: u64,
    /// See [`TypeStats::update_failure`].
    pub update_failure: u64,
    /// See [`TypeStats::update_time`].
    pub update_time: u64,
    /// The version in force and the last refusal.
    pub status: TypeStatus,
}

impl Default for Stats {
    fn default() -> Stats {
        Stats {
            connected_state: AtomicU64::default(),
            identifier: Mutex::default(),
            types: Default::default(),
            secrets: super::ResourceStats::new(super::Refusals::InUpdate),
            endpoints: super::ResourceStats::new(super::Refusals::AtDecode),
            routes: super::ResourceStats::new(super::Refusals::InUpdate),
        }
    }
}

impl Stats {
    /// The per-resource statistics of `type_url`, for the types Envoy counts per resource.
    pub fn per_resource(&self, type_url: &str) -> Option<&super::ResourceStats> {
        match type_url {
            type_url::SECRET => Some(&self.secrets),
            type_url::ENDPOINT => Some(&self.endpoints),
            type_url::ROUTE => Some(&self.routes),
            _ => None,
        }
    }

    /// Every per-resource statistics, with its type.
    pub fn all_per_resource(&self) -> [(&'static str, &super::ResourceStats); 3] {
        [
            (type_url::SECRET, &self.secrets),
            (type_url::ENDPOINT, &self.endpoints),
            (type_url::ROUTE, &self.routes),
        ]
    }
}

/// A point-in-time copy of all statistics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// `control_plane.connected_state`.
    pub connected_state: u64,
    /// `control_plane.identifier`; empty until a response carries one.
    pub identifier: String,
    /// One per type, in subscription order (CDS, EDS, LDS, RDS, then NDS if subscribed).
    pub types: Vec<TypeSnapshot>,
}

impl StatsSnapshot {
    /// The snapshot of one type.
    pub fn of(&self, type_url: &str) -> Option<&TypeSnapshot> {
        self.types.iter().find(|t| t.type_url == type_url)
    }
}

impl Stats {
    /// The counters of `type_url`, `None` for a type a sidecar does not subscribe to.
    pub fn of(&self, type_url: &str) -> Option<&TypeStats> {
        let index = TYPES.iter().position(|t| *t == type_url)?;
        self.types.get(index)
    }

    /// Copies every counter and status.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            connected_state: self.connected_state.load(Ordering::Relaxed),
            identifier: lock(&self.identifier).clone(),
            types: TYPES
                .iter()
                .zip(self.types.iter())
                .filter(|(type_url, stats)| {
                    (**type_url != type_url::NAME_TABLE && **type_url != type_url::SECRET)
                        || stats.update_attempt.load(Ordering::Relaxed) > 0
                })
                .map(|(type_url, stats)| TypeSnapshot {
                    type_url,
                    prefix: stat_prefix(type_url),
                    update_attempt: stats.update_attempt.load(Ordering::Relaxed),
                    update_success: stats.update_success.load(Ordering::Relaxed),
                    update_rejected: stats.update_rejected.load(Ordering::Relaxed),
                    update_failure: stats.update_failure.load(Ordering::Relaxed),
                    update_time: stats.update_time.load(Ordering::Relaxed),
                    status: stats.status(),
                })
                .collect(),
        }
    }

    pub(crate) fn set_connected(&self, connected: bool) {
        self.connected_state
            .store(u64::from(connected), Ordering::Relaxed);
    }

    pub(crate) fn set_identifier(&self, identifier: &str) {
        let mut current = lock(&self.identifier);
        if *current != identifier {
            identifier.clone_into(&mut current);
        }
    }

    pub(crate) fn attempt(&self, type_url: &str) {
        if let Some(t) = self.of(type_url) {
            t.update_attempt.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A stream failure counts against every type subscribed on it, as in Envoy.
    pub(crate) fn failure(&self, type_url: &str) {
        if let Some(t) = self.of(type_url) {
            t.update_failure.fetch_add(1, Ordering::Relaxed);
            t.update_attempt.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn success(&self, type_url: &str, version: &str) {
        if let Some(t) = self.of(type_url) {
            let now = SystemTime::now();
            let millis = now
                .duration_since(UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .unwrap_or(0);
            t.update_attempt.fetch_add(1, Ordering::Relaxed);
            t.update_success.fetch_add(1, Ordering::Relaxed);
            t.update_time.store(millis, Ordering::Relaxed);
            let mut status = lock(&t.status);
            status.version_text = version.to_owned();
            status.last_update = Some(now);
            status.last_error = None;
        }
    }

    pub(crate) fn rejected(&self, type_url: &str, error: UpdateError) {
        if let Some(t) = self.of(type_url) {
            t.update_attempt.fetch_add(1, Ordering::Relaxed);
            t.update_rejected.fetch_add(1, Ordering::Relaxed);
            lock(&t.status).last_error = Some(error);
        }
    }
}

impl TypeStats {
    /// The version in force and the last refusal.
    pub fn status(&self) -> TypeStatus {
        lock(&self.status).clone()
    }
}

/// The status locks are held only to copy a few strings, never across an await; a panic while
/// holding one cannot leave a status half-written in a way worse than stale, so a poisoned
/// lock is read through.
fn lock<T>(status: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    status.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_and_rejection_update_counters_and_status() {
        let stats = Stats::default();
        stats.attempt(type_url::CLUSTER);
        stats.success(type_url::CLUSTER, "v1");
        stats.rejected(
            type_url::CLUSTER,
            UpdateError {
                version: "v2".to_owned(),
                nonce: "n2".to_owned(),
                message: "bad".to_owned(),
                at: SystemTime::now(),
            },
        );
        stats.failure(type_url::CLUSTER);
        let snap = stats.snapshot();
        let cds = snap.of(type_url::CLUSTER).cloned();
        let Some(cds) = cds else {
            panic!("no cds stats")
        };
        assert_eq!(cds.prefix, "cluster_manager.cds");
        assert_eq!(cds.update_attempt, 4);
        assert_eq!(cds.update_success, 1);
        assert_eq!(cds.update_rejected, 1);
        assert_eq!(cds.update_failure, 1);
        assert!(cds.update_time > 0);
        assert_eq!(cds.status.version_text, "v1");
        assert_eq!(cds.status.last_error.map(|e| e.message), Some("bad".into()));
        assert_eq!(
            snap.of(type_url::LISTENER).map(|l| l.update_attempt),
            Some(0)
        );
    }
}
