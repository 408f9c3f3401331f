//! A pod template as the injector sees it: its metadata and spec, kept as untyped YAML values
//! so that every field the injector does not know survives unchanged. Only what injection
//! adds or reads is typed (see `sidecar`, `probes`).

use crate::error::InjectError;
use serde_yaml_ng::{Mapping, Value};
use std::collections::BTreeMap;

/// The two halves of a pod template, borrowed from the document that holds them.
pub struct PodTemplate<'a> {
    pub metadata: &'a mut Mapping,
    pub spec: &'a mut Mapping,
}

/// Who the pod belongs to: the workload's name and kind, for canonical names and the proxy's
/// metadata. For a Deployment this is the Deployment; for a bare Pod, its owner or itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workload {
    pub name: String,
    pub namespace: String,
    pub kind: String,
    pub api_version: String,
}

impl Workload {
    /// Istio's heuristic for a pod made by a controller: the controller's name, with a
    /// ReplicaSet's pod-template-hash suffix cut off to name the Deployment.
    pub fn of_pod(metadata: &Mapping) -> Workload {
        let name = str_at(metadata, "name").unwrap_or_default().to_string();
        let mut workload = Workload {
            name: name.clone(),
            namespace: str_at(metadata, "namespace")
                .unwrap_or_default()
                .to_string(),
            kind: "Pod".into(),
            api_version: "v1".into(),
        };
        let generated = str_at(metadata, "generateName").is_some_and(|g| !g.is_empty());
        let controller = metadata
            .get("ownerReferences")
            .and_then(Value::as_sequence)
            .and_then(|refs| {
                refs.iter()
                    .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
            });
        if let (true, Some(owner)) = (generated, controller) {
            let labels = string_map(metadata, "labels");
            let owner_name = owner
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let owner_kind = owner
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default();
            workload.kind = owner_kind.to_string();
            workload.api_version = owner
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            workload.name = owner_name.to_string();
            let hash = |label: &str| labels.get(label).filter(|h| !h.is_empty());
            if owner_kind == "ReplicaSet" {
                if let Some(h) =
                    hash("pod-template-hash").filter(|h| owner_name.ends_with(h.as_str()))
                {
                    workload.name = trim_suffix(owner_name, &format!("-{h}"));
                    workload.kind = "Deployment".into();
                } else if let Some(h) =
                    hash("rollouts-pod-template-hash").filter(|h| owner_name.ends_with(h.as_str()))
                {
                    workload.name = trim_suffix(owner_name, &format!("-{h}"));
                    workload.kind = "Rollout".into();
                    workload.api_version = "v1alpha1".into();
                }
            } else if owner_kind == "ReplicationController" {
                if let Some(dc) = hash("deploymentconfig") {
                    workload.name = dc.clone();
                    workload.kind = "DeploymentConfig".into();
                }
            } else if owner_kind == "Job" {
                if let Some(cron) = cron_job_name(owner_name) {
                    workload.name = cron.to_string();
                    workload.kind = "CronJob".into();
                    workload.api_version = "batch/v1".into();
                }
            }
        }
        if workload.name.is_empty() {
            workload.name = name;
        }
        workload
    }
}

fn trim_suffix(s: &str, suffix: &str) -> String {
    s.strip_suffix(suffix).unwrap_or(s).to_string()
}

/// A Job made by a CronJob is named `<cronjob>-<8 to 10 digit timestamp>`.
fn cron_job_name(job: &str) -> Option<&str> {
    let (base, stamp) = job.rsplit_once('-')?;
    let digits = (8..=10).contains(&stamp.len()) && stamp.bytes().all(|b| b.is_ascii_digit());
    (digits && !base.is_empty()).then_some(base)
}

/// A string field of a mapping.
pub fn str_at<'v>(m: &'v Mapping, key: &str) -> Option<&'v str> {
    m.get(key).and_then(Value::as_str)
}

/// A `map[string]string` field (labels, annotations). Kubernetes only stores strings there;
/// a number or boolean written unquoted in YAML is read as its text, as kubectl would refuse
/// it anyway.
pub fn string_map(m: &Mapping, key: &str) -> BTreeMap<String, String> {
    let Some(Value::Mapping(map)) = m.get(key) else {
        return BTreeMap::new();
    };
    map.iter()
        .filter_map(|(k, v)| Some((scalar_text(k)?, scalar_text(v)?)))
        .collect()
}

/// The text of a scalar value.
pub fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null => Some(String::new()),
        _ => None,
    }
}

/// Sets `m[field][key] = value`, creating `m[field]` if it is missing or null. A key that
/// exists keeps its position.
pub fn set_entry(m: &mut Mapping, field: &str, key: &str, value: &str) -> Result<(), InjectError> {
    let map = child_mapping(m, field)?;
    map.insert(Value::from(key), Value::from(value));
    Ok(())
}

/// Removes `m[field][key]`, keeping the order of the rest.
pub fn remove_entry(m: &mut Mapping, field: &str, key: &str) {
    if let Some(Value::Mapping(map)) = m.get_mut(field) {
        map.shift_remove(key);
    }
}

/// `m[field]` as a mapping, created empty if missing or null.
pub fn child_mapping<'m>(m: &'m mut Mapping, field: &str) -> Result<&'m mut Mapping, InjectError> {
    let slot = m
        .entry(Value::from(field))
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    if slot.is_null() {
        *slot = Value::Mapping(Mapping::new());
    }
    match slot {
        Value::Mapping(map) => Ok(map),
        _ => Err(InjectError::pod(field, "expected a map")),
    }
}

/// `m[field]` as a list, created empty if missing or null.
pub fn child_sequence<'m>(
    m: &'m mut Mapping,
    field: &str,
) -> Result<&'m mut Vec<Value>, InjectError> {
    let slot = m
        .entry(Value::from(field))
        .or_insert_with(|| Value::Sequence(Vec::new()));
    if slot.is_null() {
        *slot = Value::Sequence(Vec::new());
    }
    match slot {
        Value::Sequence(list) => Ok(list),
        _ => Err(InjectError::pod(field, "expected a list")),
    }
}

/// The containers of one list (`containers` or `initContainers`), each checked to be a map
/// with a name.
pub fn containers(spec: &Mapping, field: &str) -> Result<Vec<Value>, InjectError> {
    let list = match spec.get(field) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Sequence(list)) => list,
        Some(_) => return Err(InjectError::pod(field, "expected a list")),
    };
    for (i, c) in list.iter().enumerate() {
        if container_name(c).is_none() {
            return Err(InjectError::pod(
                format!("{field}[{i}]"),
                "a container needs a name",
            ));
        }
    }
    Ok(list.clone())
}

/// A container's name.
pub fn container_name(c: &Value) -> Option<&str> {
    c.get("name").and_then(Value::as_str)
}

/// Writes a container list back, removing the field when the list is empty and it was absent.
pub fn put_containers(spec: &mut Mapping, field: &str, list: Vec<Value>) {
    if list.is_empty() && spec.get(field).is_none_or(|v| v.is_null()) {
        return;
    }
    spec.insert(Value::from(field), Value::Sequence(list));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(yaml: &str) -> Mapping {
        serde_yaml_ng::from_str(yaml).expect("yaml")
    }

    #[test]
    fn deployment_pod_is_named_after_the_deployment() {
        let m = meta(
            "generateName: hello-7d4f9-\nlabels: {pod-template-hash: 7d4f9}\nownerReferences:\n- {apiVersion: apps/v1, kind: ReplicaSet, name: hello-7d4f9, controller: true}",
        );
        let w = Workload::of_pod(&m);
        assert_eq!((w.name.as_str(), w.kind.as_str()), ("hello", "Deployment"));
    }

    #[test]
    fn cron_job_pod_is_named_after_the_cron_job() {
        let m = meta(
            "generateName: x-\nownerReferences:\n- {apiVersion: batch/v1, kind: Job, name: backup-28391820, controller: true}",
        );
        let w = Workload::of_pod(&m);
        assert_eq!((w.name.as_str(), w.kind.as_str()), ("backup", "CronJob"));
    }

    #[test]
    fn named_pod_without_owner_is_itself() {
        let w = Workload::of_pod(&meta("name: solo"));
        assert_eq!((w.name.as_str(), w.kind.as_str()), ("solo", "Pod"));
    }
}
