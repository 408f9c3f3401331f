//! The `xds:` section: Envoy discovery resources read from files instead of from istiod, so
//! that tests, benchmarks and a laptop get Istio-style routing without a control plane.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Where xDS resources come from when no control plane sends them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct XdsConfig {
    /// A directory laid out as `remora xds validate` reads one (`listeners.json|yaml`,
    /// `clusters…`, `routes…`, `endpoints…`, each an array of Envoy resources). Setting it
    /// routes outbound traffic by those resources.
    pub resources_dir: Option<PathBuf>,
    /// How often the directory's files are polled where it cannot be watched (inotify).
    #[serde(with = "humantime_serde")]
    pub watch_interval: Duration,
}

impl Default for XdsConfig {
    fn default() -> Self {
        XdsConfig {
            resources_dir: None,
            watch_interval: Duration::from_secs(1),
        }
    }
}

impl XdsConfig {
    /// Field checks; returns the field under `xds.` and why.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        if self
            .resources_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return Err(("xds.resources_dir".into(), "must not be empty".into()));
        }
        if self.watch_interval.is_zero() {
            return Err((
                "xds.watch_interval".into(),
                "must be greater than zero".into(),
            ));
        }
        Ok(())
    }
}
