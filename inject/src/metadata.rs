//! The labels and annotations an injected pod carries, as Istio writes them: the mesh's
//! canonical service labels, `security.istio.io/tlsMode`, kubectl's default container, and
//! Prometheus annotations pointing at the agent's merged metrics.

use crate::config::InjectorConfig;
use crate::error::InjectError;
use crate::names::key;
use crate::validate::parse_bool;
use serde_json::json;
use std::collections::BTreeMap;

/// Kubernetes' limit on a label value.
const LABEL_VALUE_MAX: usize = 63;

/// The labels to set, in order: the mesh's TLS mode and canonical service (existing values
/// kept), and the network.
pub fn labels(
    labels: &BTreeMap<String, String>,
    workload_name: &str,
    network: Option<&str>,
) -> Vec<(&'static str, String)> {
    let tls_mode = labels
        .get(key::TLS_MODE)
        .filter(|v| !v.is_empty())
        .cloned()
        .unwrap_or_else(|| "istio".to_string());
    let mut out = vec![(key::TLS_MODE, tls_mode)];
    out.extend(canonical_labels(labels, workload_name));
    if let Some(network) = network {
        out.push((key::NETWORK, network.to_string()));
    }
    out
}

/// The canonical service name and revision, from the pod's labels or its workload. Every
/// template but grpc-simple sets them; only the sidecar's pods also carry the TLS mode.
pub fn canonical_labels(
    labels: &BTreeMap<String, String>,
    workload_name: &str,
) -> Vec<(&'static str, String)> {
    let first = |keys: &[&str], fallback: &str| {
        keys.iter()
            .filter_map(|k| labels.get(*k))
            .find(|v| !v.is_empty())
            .cloned()
            .unwrap_or_else(|| fallback.to_string())
    };
    let name = first(&[key::CANONICAL_NAME, key::APP_NAME, "app"], workload_name);
    let revision = first(
        &[key::CANONICAL_REVISION, key::APP_VERSION, "version"],
        "latest",
    );
    vec![
        (key::CANONICAL_NAME, label_value(&name)),
        (key::CANONICAL_REVISION, revision),
    ]
}

/// Cut to a label's length, then trimmed of the separators a label may not end with.
fn label_value(name: &str) -> String {
    let cut: String = name.chars().take(LABEL_VALUE_MAX).collect();
    cut.trim_matches(['-', '_', '.']).to_string()
}

/// Prometheus' label-name sanitising, by which Istio also matches annotation spellings
/// such as `prometheus.io.scrape`.
fn sanitize(k: &str) -> String {
    k.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The annotations of Prometheus' scraping that the agent takes over.
const PROMETHEUS_KEYS: [&str; 4] = [
    key::PROMETHEUS_PATH,
    key::PROMETHEUS_PORT,
    key::PROMETHEUS_SCRAPE,
    key::PROMETHEUS_SCRAPE_TARGETS,
];

/// Every annotation key that is a spelling of one of Prometheus' scraping annotations.
pub fn prometheus_keys(annotations: &BTreeMap<String, String>) -> Vec<String> {
    let wanted: Vec<String> = PROMETHEUS_KEYS.iter().map(|k| sanitize(k)).collect();
    annotations
        .keys()
        .filter(|k| wanted.contains(&sanitize(k)))
        .cloned()
        .collect()
}

fn find<'a>(annotations: &'a BTreeMap<String, String>, k: &str) -> Option<&'a String> {
    let wanted = sanitize(k);
    annotations
        .iter()
        .find(|(name, _)| sanitize(name) == wanted)
        .map(|(_, v)| v)
}

/// The already-merged case: `prometheus.io/port` points at the agent.
pub fn points_at_agent(annotations: &BTreeMap<String, String>, agent_port: u16) -> bool {
    find(annotations, key::PROMETHEUS_PORT).is_some_and(|p| *p == agent_port.to_string())
}

/// What metrics merging does to a pod.
#[derive(Debug, Default, PartialEq)]
pub struct MetricsMerge {
    /// `ISTIO_PROMETHEUS_ANNOTATIONS` for the proxy: the application's own scrape settings.
    pub app_metrics: Option<String>,
    /// Annotation keys to remove, then the ones to set.
    pub remove: Vec<String>,
    pub set: Vec<(&'static str, String)>,
}

/// Metrics merging: unless the pod opts out of scraping or merging, the application's
/// `prometheus.io/*` move into the proxy's environment and the annotations point at the
/// agent, which serves the proxy's metrics and the application's together.
pub fn metrics_merge(
    annotations: &BTreeMap<String, String>,
    config: &InjectorConfig,
    agent_port: u16,
) -> Result<MetricsMerge, InjectError> {
    let scrape = find(annotations, key::PROMETHEUS_SCRAPE)
        .and_then(|v| parse_bool(v))
        .unwrap_or(true);
    let merge = annotations
        .get(key::MERGE_METRICS)
        .and_then(|v| parse_bool(v))
        .unwrap_or(config.prometheus_merge);
    if !scrape || !merge || points_at_agent(annotations, agent_port) {
        return Ok(MetricsMerge::default());
    }
    let get = |k: &str| find(annotations, k).cloned().unwrap_or_default();
    let (mut port, mut path) = (get(key::PROMETHEUS_PORT), get(key::PROMETHEUS_PATH));
    let targets = match find(annotations, key::PROMETHEUS_SCRAPE_TARGETS) {
        Some(raw) => scrape_targets(raw),
        None => Vec::new(),
    };
    let check = |p: &str, what: &str, annotation: &str| -> Result<(), InjectError> {
        let invalid = |reason: String| InjectError::InvalidAnnotation {
            annotation: annotation.into(),
            value: p.into(),
            reason,
        };
        let n: u16 = p
            .parse()
            .ok()
            .filter(|n| *n != 0)
            .ok_or_else(|| invalid(format!("invalid {what} port")))?;
        if n == agent_port || crate::names::port::RESERVED.contains(&n) {
            return Err(invalid(format!("{what} port {n} is the proxy's own")));
        }
        Ok(())
    };
    if let Some((first_port, first_path)) = targets.first() {
        // Agents that predate scrape targets read the first target from the legacy fields.
        (port, path) = (first_port.clone(), first_path.clone());
        for (p, _) in &targets {
            check(p, "scrape target", key::PROMETHEUS_SCRAPE_TARGETS)?;
        }
    } else if !port.is_empty() {
        check(&port, "scrape", key::PROMETHEUS_PORT)?;
    }
    let scrape_value = get(key::PROMETHEUS_SCRAPE);
    let empty = scrape_value.is_empty() && path.is_empty() && port.is_empty() && targets.is_empty();
    let app_metrics = (!empty).then(|| {
        let mut v = json!({"scrape": scrape_value, "path": path, "port": port});
        if !targets.is_empty() {
            v["targets"] = targets
                .iter()
                .map(|(port, path)| json!({"port": port, "path": path}))
                .collect();
        }
        v.to_string()
    });
    Ok(MetricsMerge {
        app_metrics,
        remove: prometheus_keys(annotations),
        set: vec![
            (key::PROMETHEUS_PORT, agent_port.to_string()),
            (key::PROMETHEUS_PATH, "/stats/prometheus".into()),
            (key::PROMETHEUS_SCRAPE, "true".into()),
        ],
    })
}

/// `prometheus.istio.io/scrape-targets`: `port[:path],...`, path `/metrics` by default.
fn scrape_targets(raw: &str) -> Vec<(String, String)> {
    raw.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| {
            let (port, path) = entry.split_once(':').unwrap_or((entry, ""));
            let path = path.trim();
            let path = if path.is_empty() { "/metrics" } else { path };
            (port.trim().to_string(), path.to_string())
        })
        .collect()
}

/// Which container `kubectl logs` and `kubectl exec` pick: the first application container.
pub fn default_container(
    annotations: &BTreeMap<String, String>,
    app_containers: &[String],
) -> Vec<(&'static str, String)> {
    let Some(first) = app_containers.first() else {
        return Vec::new();
    };
    [key::DEFAULT_LOGS_CONTAINER, key::DEFAULT_CONTAINER]
        .into_iter()
        .filter(|k| !annotations.contains_key(*k))
        .map(|k| (k, first.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn canonical_name_is_a_valid_label() {
        let long = format!("{}-tail", "a".repeat(62));
        let l = labels(&BTreeMap::new(), &long, None);
        assert_eq!(l[1].1, "a".repeat(62));
        let l = labels(
            &map(&[("app", "web"), ("version", "v2")]),
            "ignored",
            Some("net1"),
        );
        assert_eq!(l[1].1, "web");
        assert_eq!(l[2].1, "v2");
        assert_eq!(l[3], (key::NETWORK, "net1".to_string()));
    }

    #[test]
    fn merging_keeps_the_apps_settings_and_honours_opt_out() {
        let config = InjectorConfig::default();
        let m = metrics_merge(&map(&[("prometheus.io/port", "8080")]), &config, 15020).unwrap();
        assert_eq!(
            m.app_metrics.as_deref(),
            Some(r#"{"path":"","port":"8080","scrape":""}"#)
        );
        assert_eq!(m.remove, vec!["prometheus.io/port".to_string()]);
        let off =
            metrics_merge(&map(&[("prometheus.io.scrape", "false")]), &config, 15020).unwrap();
        assert_eq!(off, MetricsMerge::default());
        assert!(metrics_merge(&map(&[("prometheus.io/port", "15090")]), &config, 15020).is_err());
    }
}
