//! Who this sidecar serves: the pod's workload identity, as Istio's metrics label it.
//!
//! Istio's injector hands the sidecar its pod through the downward API: environment variables
//! (`POD_NAME`, `POD_NAMESPACE`, `ISTIO_META_WORKLOAD_NAME`, …) and a file of the pod's labels
//! (`/etc/istio/pod/labels`). The app, version and canonical service come from those labels with
//! the same fall-backs Istio uses, so dashboards show the same values as with Envoy.

use std::collections::BTreeMap;

/// What Istio says when it does not know.
pub const UNKNOWN: &str = "unknown";

/// The pod's workload identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// The pod (`POD_NAME`).
    pub pod: String,
    pub name: String,
    pub namespace: String,
    pub app: String,
    pub version: String,
    pub canonical_service: String,
    pub canonical_revision: String,
    /// The SPIFFE ID, once mutual TLS gives us one.
    pub principal: String,
    pub cluster: String,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            pod: UNKNOWN.into(),
            name: UNKNOWN.into(),
            namespace: UNKNOWN.into(),
            app: UNKNOWN.into(),
            version: UNKNOWN.into(),
            canonical_service: UNKNOWN.into(),
            canonical_revision: "latest".into(),
            principal: UNKNOWN.into(),
            cluster: UNKNOWN.into(),
        }
    }
}

impl Workload {
    /// Istio's node id for this pod at `ip`: `sidecar~IP~POD.NAMESPACE~NAMESPACE.svc.cluster.local`.
    pub fn node_id(&self, ip: &str) -> String {
        let ns = &self.namespace;
        format!("sidecar~{ip}~{}.{ns}~{ns}.svc.cluster.local", self.pod)
    }

    /// Build from an environment lookup and the text of the pod-labels file (empty if absent).
    pub fn from_environment(env: impl Fn(&str) -> Option<String>, pod_labels: &str) -> Self {
        let labels = parse_pod_labels(pod_labels);
        let label = |k: &str| labels.get(k).filter(|v| !v.is_empty()).cloned();
        let env = |k: &str| env(k).filter(|v| !v.is_empty());
        let name = env("ISTIO_META_WORKLOAD_NAME")
            .or_else(|| env("POD_NAME").map(|p| workload_from_pod_name(&p)))
            .unwrap_or_else(|| UNKNOWN.into());
        let canonical_service = label("service.istio.io/canonical-name")
            .or_else(|| label("app.kubernetes.io/name"))
            .or_else(|| label("app"))
            .unwrap_or_else(|| name.clone());
        let canonical_revision = label("service.istio.io/canonical-revision")
            .or_else(|| label("app.kubernetes.io/version"))
            .or_else(|| label("version"))
            .unwrap_or_else(|| "latest".into());
        Workload {
            pod: env("POD_NAME").unwrap_or_else(|| UNKNOWN.into()),
            namespace: env("POD_NAMESPACE").unwrap_or_else(|| UNKNOWN.into()),
            app: label("app")
                .or_else(|| label("app.kubernetes.io/name"))
                .unwrap_or_else(|| UNKNOWN.into()),
            version: label("version")
                .or_else(|| label("app.kubernetes.io/version"))
                .unwrap_or_else(|| UNKNOWN.into()),
            canonical_service,
            canonical_revision,
            principal: UNKNOWN.into(),
            cluster: env("ISTIO_META_CLUSTER_ID").unwrap_or_else(|| "Kubernetes".into()),
            name,
        }
    }
}

/// A Deployment's pod is `<deployment>-<replicaset hash>-<pod hash>`; Istio names the workload
/// after the Deployment. Without the owner's name this strips the two generated suffixes when
/// they look generated, and otherwise keeps the pod name.
pub fn workload_from_pod_name(pod: &str) -> String {
    let parts: Vec<&str> = pod.split('-').collect();
    let generated = |s: &str| s.len() >= 5 && s.chars().all(|c| c.is_ascii_alphanumeric());
    if parts.len() >= 3
        && parts[parts.len() - 1].len() == 5
        && generated(parts[parts.len() - 1])
        && generated(parts[parts.len() - 2])
        && parts[parts.len() - 2].chars().any(|c| c.is_ascii_digit())
    {
        parts[..parts.len() - 2].join("-")
    } else {
        pod.to_string()
    }
}

/// Parse the downward API's labels file: one `key="value"` per line, Go-quoted.
pub fn parse_pod_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    for line in text.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        labels.insert(key.trim().to_string(), unquote(value));
    }
    labels
}

fn unquote(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn labels_file_and_environment_fill_the_identity() {
        let labels =
            "app=\"reviews\"\nversion=\"v2\"\npod-template-hash=\"7d4b9c\"\nquoted=\"a\\\"b\"\n";
        let w = Workload::from_environment(
            env(&[
                ("POD_NAME", "reviews-v2-7d4b9c6f8d-x2x9k"),
                ("POD_NAMESPACE", "bookinfo"),
                ("ISTIO_META_WORKLOAD_NAME", "reviews-v2"),
                ("ISTIO_META_CLUSTER_ID", "east"),
            ]),
            labels,
        );
        assert_eq!(w.name, "reviews-v2");
        assert_eq!(w.namespace, "bookinfo");
        assert_eq!(w.app, "reviews");
        assert_eq!(w.version, "v2");
        assert_eq!(w.canonical_service, "reviews");
        assert_eq!(w.canonical_revision, "v2");
        assert_eq!(w.cluster, "east");
        assert_eq!(parse_pod_labels(labels)["quoted"], "a\"b");
    }

    #[test]
    fn canonical_labels_win_and_fallbacks_match_istio() {
        let w = Workload::from_environment(
            env(&[("POD_NAME", "ratings-5b9f8c7d6e-abcde")]),
            "service.istio.io/canonical-name=\"ratings-svc\"\n",
        );
        assert_eq!(w.name, "ratings");
        assert_eq!(w.canonical_service, "ratings-svc");
        assert_eq!(w.canonical_revision, "latest");
        assert_eq!(w.app, UNKNOWN);
        assert_eq!(w.namespace, UNKNOWN);
        assert_eq!(w.cluster, "Kubernetes");
    }

    #[test]
    fn nothing_known_is_unknown() {
        let w = Workload::from_environment(|_| None, "");
        assert_eq!(w.name, UNKNOWN);
        assert_eq!(w.canonical_service, UNKNOWN);
    }
}
