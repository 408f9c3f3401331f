//! The `authorization:` section: where Istio `AuthorizationPolicy` files are read from, which
//! namespace is the mesh's root, and how request paths are normalised before policies see them.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Istio's default root namespace: its policies apply to every workload of the mesh.
pub const ISTIO_ROOT_NAMESPACE: &str = "istio-system";

/// Istio authorization on inbound traffic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthorizationConfig {
    /// A directory of `AuthorizationPolicy` YAML files (`*.yaml`, `*.yml`, `*.json`; several
    /// documents per file allowed), as users write them for `kubectl apply`. Unset: no policy,
    /// every request is allowed, as in a mesh without policies.
    pub policy_dir: Option<PathBuf>,
    /// Policies in this namespace apply to every workload (Istio's `rootNamespace`); those in the
    /// pod's own namespace (`POD_NAMESPACE`) apply to it; all others are ignored.
    pub root_namespace: String,
    /// Trust domains that count as the workload's own (Istio's `trustDomainAliases`): a policy
    /// naming `cluster.local/ns/foo/sa/bar` also matches them.
    pub trust_domain_aliases: Vec<String>,
    /// How often the directory is polled for changes where it cannot be watched (inotify).
    #[serde(with = "humantime_serde")]
    pub watch_interval: Duration,
    /// How inbound request paths are normalised, before policies match them and before they
    /// reach the application (Istio's mesh-wide `pathNormalization`).
    pub path_normalization: PathNormalization,
}

impl Default for AuthorizationConfig {
    fn default() -> Self {
        AuthorizationConfig {
            policy_dir: None,
            root_namespace: ISTIO_ROOT_NAMESPACE.into(),
            trust_domain_aliases: Vec::new(),
            watch_interval: Duration::from_secs(1),
            path_normalization: PathNormalization::Base,
        }
    }
}

/// Istio's `meshConfig.pathNormalization` values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathNormalization {
    /// Paths pass unchanged. Policies on paths can then be bypassed (`/./admin`).
    #[serde(alias = "NONE")]
    None,
    /// RFC 3986 normalisation as Envoy's `normalize_path` does it: `.` and `..` segments
    /// resolved (also when written `%2e`), escaped unreserved characters decoded, backslashes
    /// made slashes. Istio's default.
    #[default]
    #[serde(alias = "BASE", alias = "DEFAULT")]
    Base,
    /// `base`, then `//` merged into `/`.
    #[serde(alias = "MERGE_SLASHES")]
    MergeSlashes,
    /// `%2F` and `%5C` decoded first (into `/` and `\`), then `merge_slashes`.
    #[serde(alias = "DECODE_AND_MERGE_SLASHES")]
    DecodeAndMergeSlashes,
}

impl AuthorizationConfig {
    /// Field checks; returns the field under `authorization.` and why.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        if self.watch_interval.is_zero() {
            return Err((
                "authorization.watch_interval".into(),
                "must be greater than zero".into(),
            ));
        }
        if self.root_namespace.is_empty() {
            return Err((
                "authorization.root_namespace".into(),
                "must not be empty".into(),
            ));
        }
        if let Some(td) = self
            .trust_domain_aliases
            .iter()
            .find(|td| td.is_empty() || td.contains('/'))
        {
            return Err((
                "authorization.trust_domain_aliases".into(),
                format!("`{td}` is not a trust domain"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{parse, Config, PathNormalization};
    use std::path::Path;

    #[test]
    fn defaults_are_istios_and_istio_spellings_parse() {
        let c = Config::default().authorization;
        assert_eq!(c.policy_dir, None);
        assert_eq!(c.root_namespace, "istio-system");
        assert_eq!(c.path_normalization, PathNormalization::Base);
        let text = "authorization:\n  policy_dir: /etc/remora/policies\n  \
                    path_normalization: MERGE_SLASHES\n";
        let c = parse(text, Path::new("r.yaml"))
            .expect("valid")
            .authorization;
        assert_eq!(
            c.policy_dir.as_deref(),
            Some(Path::new("/etc/remora/policies"))
        );
        assert_eq!(c.path_normalization, PathNormalization::MergeSlashes);
    }

    #[test]
    fn bad_values_are_refused_with_their_field() {
        for (text, field) in [
            (
                "authorization:\n  root_namespace: \"\"\n",
                "authorization.root_namespace",
            ),
            (
                "authorization:\n  watch_interval: 0s\n",
                "authorization.watch_interval",
            ),
            (
                "authorization:\n  trust_domain_aliases: [a/b]\n",
                "authorization.trust_domain_aliases",
            ),
            (
                "authorization:\n  path_normalization: sometimes\n",
                "authorization.path_normalization",
            ),
        ] {
            let err = parse(text, Path::new("r.yaml")).expect_err(text);
            assert_eq!(err.field(), Some(field), "{err}");
            assert_eq!(err.line(), Some(2), "{err}");
        }
    }
}
