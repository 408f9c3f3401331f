//! A user's own `istio-proxy` (or capture container) in the pod spec customises what is
//! injected: its fields are merged over the injected container as Kubernetes' strategic merge
//! patch merges a container (maps field by field, `env`/`volumeMounts`/`ports` by their keys,
//! other lists replaced), which is how Istio applies such overrides.

use serde_yaml_ng::{Mapping, Value};

/// Lists Kubernetes merges by a key rather than replacing.
const MERGE_KEYS: [(&str, &str); 5] = [
    ("env", "name"),
    ("volumeMounts", "mountPath"),
    ("ports", "containerPort"),
    ("volumeDevices", "devicePath"),
    ("resizePolicy", "resourceName"),
];

/// The image a user writes to keep the injected one (a container must name some image).
pub const AUTO_IMAGE: &str = "auto";

/// The user's container as an override: without `image: auto`, and with its keys sorted, as
/// `proxy.istio.io/overrides` records them (JSON objects have no order), so that applying the
/// recorded override on re-injection adds fields in the same order as the first injection.
pub fn as_override(user: &Value) -> Value {
    let mut user = sorted(user);
    if let Some(m) = user.as_mapping_mut() {
        if m.get("image").and_then(Value::as_str) == Some(AUTO_IMAGE) {
            m.shift_remove("image");
        }
    }
    user
}

fn sorted(v: &Value) -> Value {
    match v {
        Value::Mapping(m) => {
            let mut entries: Vec<(&Value, &Value)> = m.iter().collect();
            entries.sort_by_key(|(k, _)| k.as_str().unwrap_or_default().to_string());
            Value::Mapping(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.clone(), sorted(v)))
                    .collect(),
            )
        }
        Value::Sequence(items) => Value::Sequence(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// Merges `overlay` (the user's container) over `base` (the injected one).
pub fn merge_container(base: &mut Value, overlay: &Value) {
    if let (Value::Mapping(b), Value::Mapping(o)) = (base, overlay) {
        merge_mapping(b, o, true);
    }
}

fn merge_mapping(base: &mut Mapping, overlay: &Mapping, top: bool) {
    for (k, v) in overlay {
        // Go's typed decoding, which Istio merges through, drops nulls: so do we.
        if v.is_null() {
            continue;
        }
        let merge_key = top
            .then(|| {
                MERGE_KEYS
                    .iter()
                    .find(|(field, _)| k.as_str() == Some(field))
            })
            .flatten()
            .map(|(_, key)| *key);
        match (base.get_mut(k), v) {
            (Some(Value::Mapping(b)), Value::Mapping(o)) => merge_mapping(b, o, false),
            (Some(Value::Sequence(b)), Value::Sequence(o)) if merge_key.is_some() => {
                merge_list(b, o, merge_key.unwrap_or_default());
            }
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

fn merge_list(base: &mut Vec<Value>, overlay: &[Value], merge_key: &str) {
    for item in overlay {
        let id = item.get(merge_key);
        match base
            .iter_mut()
            .find(|b| id.is_some() && b.get(merge_key) == id)
        {
            Some(Value::Mapping(b)) => {
                if let Value::Mapping(o) = item {
                    merge_mapping(b, o, false);
                }
            }
            _ => base.push(item.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(yaml: &str) -> Value {
        serde_yaml_ng::from_str(yaml).expect("yaml")
    }

    #[test]
    fn user_fields_win_and_keyed_lists_merge() {
        let mut base = v("name: istio-proxy\nimage: remora\nargs: [run]\nresources: {limits: {cpu: '2', memory: 1Gi}}\nsecurityContext: {runAsUser: 1337, runAsNonRoot: true}\nenv: [{name: A, value: '1'}, {name: B, value: '2'}]");
        let user = as_override(&v("name: istio-proxy\nimage: auto\nargs: [custom]\nresources: {limits: {cpu: 3000m}}\nsecurityContext: {runAsUser: 1234}\nenv: [{name: B, value: x}, {name: C, value: '3'}]\nfutureField: {kept: true}"));
        merge_container(&mut base, &user);
        let want = v("name: istio-proxy\nimage: remora\nargs: [custom]\nresources: {limits: {cpu: 3000m, memory: 1Gi}}\nsecurityContext: {runAsUser: 1234, runAsNonRoot: true}\nenv: [{name: A, value: '1'}, {name: B, value: x}, {name: C, value: '3'}]\nfutureField: {kept: true}");
        assert_eq!(base, want);
    }
}
