//! The webhook's answer is a JSON Patch from the pod it received to the injected pod. It
//! touches only what injection adds or changes: a container inserted into a list is one `add`
//! at its index, not a rewrite of every container after it, which a naive index-by-index diff
//! would produce and which would make the patch fight with other mutating webhooks.

use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation};
use jsonptr::PointerBuf;
use serde_json::{Map, Value};

/// The operations that turn `old` into `new`.
pub fn diff(old: &Value, new: &Value) -> Patch {
    let mut ops = Vec::new();
    diff_at(old, new, &mut PointerBuf::root(), &mut ops);
    Patch(ops)
}

fn diff_at(old: &Value, new: &Value, at: &mut PointerBuf, ops: &mut Vec<PatchOperation>) {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => diff_objects(o, n, at, ops),
        (Value::Array(o), Value::Array(n)) => diff_arrays(o, n, at, ops),
        _ if old == new => {}
        _ => ops.push(replace(at, new)),
    }
}

fn diff_objects(
    old: &Map<String, Value>,
    new: &Map<String, Value>,
    at: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) {
    for (k, n) in new {
        at.push_back(k.as_str());
        match old.get(k) {
            Some(o) => diff_at(o, n, at, ops),
            None => ops.push(add(at, n)),
        }
        at.pop_back();
    }
    for k in old.keys().filter(|k| !new.contains_key(*k)) {
        at.push_back(k.as_str());
        ops.push(PatchOperation::Remove(RemoveOperation { path: at.clone() }));
        at.pop_back();
    }
}

/// Lists of named items (containers, volumes, env) are matched by name: items that left are
/// removed, items that arrived are added where they stand, and items in both are diffed.
/// Other lists that only grew get `add`s at the end; anything else is replaced whole.
fn diff_arrays(old: &[Value], new: &[Value], at: &mut PointerBuf, ops: &mut Vec<PatchOperation>) {
    if old == new {
        return;
    }
    if let (Some(old_names), Some(new_names)) = (names(old), names(new)) {
        let kept: Vec<usize> = (0..old.len())
            .filter(|i| new_names.contains(&old_names[*i]))
            .collect();
        let kept_names: Vec<&str> = kept.iter().map(|i| old_names[*i]).collect();
        let in_order = new_names
            .iter()
            .filter(|n| kept_names.contains(n))
            .eq(kept_names.iter());
        if in_order {
            for i in (0..old.len()).rev().filter(|i| !kept.contains(i)) {
                at.push_back(i);
                ops.push(PatchOperation::Remove(RemoveOperation { path: at.clone() }));
                at.pop_back();
            }
            let mut next_kept = kept.iter().peekable();
            for (j, item) in new.iter().enumerate() {
                at.push_back(j);
                match next_kept.peek() {
                    Some(&&i) if old_names[i] == new_names[j] => {
                        diff_at(&old[i], item, at, ops);
                        next_kept.next();
                    }
                    _ => ops.push(add(at, item)),
                }
                at.pop_back();
            }
            return;
        }
    }
    if new.len() > old.len() && new[..old.len()] == *old {
        for (j, item) in new.iter().enumerate().skip(old.len()) {
            at.push_back(j);
            ops.push(add(at, item));
            at.pop_back();
        }
        return;
    }
    ops.push(replace(at, &Value::Array(new.to_vec())));
}

/// The items' names, if every item is an object with a distinct string name.
fn names(list: &[Value]) -> Option<Vec<&str>> {
    let names: Vec<&str> = list
        .iter()
        .map(|v| v.get("name").and_then(Value::as_str))
        .collect::<Option<_>>()?;
    let mut sorted = names.clone();
    sorted.sort_unstable();
    sorted.dedup();
    (sorted.len() == names.len()).then_some(names)
}

fn add(at: &PointerBuf, value: &Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: at.clone(),
        value: value.clone(),
    })
}

fn replace(at: &PointerBuf, value: &Value) -> PatchOperation {
    PatchOperation::Replace(ReplaceOperation {
        path: at.clone(),
        value: value.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn roundtrip(old: Value, new: Value) -> Patch {
        let patch = diff(&old, &new);
        let mut applied = old;
        json_patch::patch(&mut applied, &patch).expect("patch applies");
        assert_eq!(applied, new);
        patch
    }

    #[test]
    fn inserted_containers_are_single_adds() {
        let old = json!({"spec": {"initContainers": [{"name": "user", "image": "u"}], "containers": [{"name": "app"}]}});
        let new = json!({"spec": {"initContainers": [{"name": "istio-init"}, {"name": "istio-proxy"}, {"name": "user", "image": "u"}], "containers": [{"name": "app", "readinessProbe": {}}]}});
        let patch = roundtrip(old, new);
        let text = serde_json::to_string(&patch).unwrap();
        assert_eq!(patch.0.len(), 3, "{text}");
        assert!(
            !text.contains("\"u\""),
            "the user's container is not rewritten: {text}"
        );
    }

    #[test]
    fn moves_removals_and_escaping() {
        roundtrip(
            json!({"a": [{"name": "x"}, {"name": "p"}, {"name": "y"}], "m": {"k/1": "v", "gone": 1}}),
            json!({"a": [{"name": "p"}, {"name": "y"}, {"name": "x"}], "m": {"k/1": "w", "k~2": "n"}}),
        );
        roundtrip(json!({"l": [1, 2]}), json!({"l": [1, 2, 3]}));
        roundtrip(json!({"l": [1, 2]}), json!({"l": [2]}));
        roundtrip(
            json!({"l": [{"name": "a"}, {"name": "a"}]}),
            json!({"l": [{"name": "b"}]}),
        );
    }
}
