//! Envoy's proto3 JSON (and YAML, read as JSON) in and out: resource files, config dumps and
//! `remora xds validate` read it; `/config_dump` writes it. Field names are the proto's own
//! (`filter_chains`, as Envoy prints them); camelCase is read too, as any proto3 JSON reader
//! does. An `Any` names its type with `@type`, which must be in [`crate::descriptors::pool`].

use crate::descriptors::pool;
use prost::Message;
use prost_reflect::{DynamicMessage, MessageDescriptor, SerializeOptions};
use serde_json::Value;

/// JSON that does not read as the message it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    #[error("{path}: unknown type {type_url}")]
    UnknownType { type_url: String, path: String },
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
    #[error("no message type {0} in the descriptor pool")]
    UnknownMessage(String),
    #[error("YAML: {0}")]
    Yaml(String),
    #[error("decoding as {message}: {reason}")]
    Transcode { message: String, reason: String },
}

impl JsonError {
    /// The field path it is about (empty at the root).
    pub fn path(&self) -> &str {
        match self {
            JsonError::UnknownType { path, .. } | JsonError::Invalid { path, .. } => path,
            _ => "",
        }
    }
}

/// The message descriptor of a full name (`envoy.config.listener.v3.Listener`).
pub fn descriptor(full_name: &str) -> Result<MessageDescriptor, JsonError> {
    pool()
        .get_message_by_name(full_name)
        .ok_or_else(|| JsonError::UnknownMessage(full_name.to_string()))
}

/// The message name of a type URL (`type.googleapis.com/a.b.C` → `a.b.C`).
pub fn message_name(type_url: &str) -> &str {
    type_url.rsplit_once('/').map_or(type_url, |(_, n)| n)
}

/// Read `value` as a `full_name` message.
pub fn from_json(value: &Value, full_name: &str) -> Result<DynamicMessage, JsonError> {
    let desc = descriptor(full_name)?;
    let original = value;
    let mut value = std::borrow::Cow::Borrowed(value);
    // Envoy prints an `Any` that is set but empty (no type URL) as `{}`, which proto3 JSON
    // readers refuse for want of `@type`; Envoy treats it as unset, and so does this: each such
    // `{}` is dropped and the message read again (a bounded number of times).
    for _ in 0..64 {
        let mut track = serde_path_to_error::Track::new();
        let de = serde_path_to_error::Deserializer::new(value.as_ref(), &mut track);
        match DynamicMessage::deserialize(desc.clone(), de) {
            Ok(m) => return Ok(m),
            Err(e) => {
                let path = proto_path(&track.path().to_string());
                let reason = e.to_string();
                if reason.contains("expected '@type' field")
                    && remove_empty_object(value.to_mut(), &path)
                {
                    continue;
                }
                // prost-reflect's own error for an unknown `@type` names neither the URL nor,
                // behind an Any, the place; find them to say both. (Only after a failure: a
                // Struct may hold an `@type` key that is just data.)
                check_types(original, &mut String::new())?;
                return Err(JsonError::Invalid { path, reason });
            }
        }
    }
    Err(JsonError::Invalid {
        path: String::new(),
        reason: "too many empty Any values".into(),
    })
}

/// Remove the value at `path` (`a.b[2].c`) when it is `{}`; whether it did.
fn remove_empty_object(value: &mut Value, path: &str) -> bool {
    let mut steps: Vec<Result<&str, usize>> = Vec::new();
    for part in path.split('.') {
        let (key, rest) = part.split_once('[').unwrap_or((part, ""));
        if !key.is_empty() {
            steps.push(Ok(key));
        }
        for index in rest.split('[').filter(|s| !s.is_empty()) {
            match index.trim_end_matches(']').parse() {
                Ok(i) => steps.push(Err(i)),
                Err(_) => return false,
            }
        }
    }
    let Some((Ok(last), parents)) = steps.split_last() else {
        return false;
    };
    let mut at = value;
    for step in parents {
        at = match step {
            Ok(key) => match at.get_mut(*key) {
                Some(v) => v,
                None => return false,
            },
            Err(i) => match at.get_mut(*i) {
                Some(v) => v,
                None => return false,
            },
        };
    }
    match at.as_object_mut() {
        Some(map)
            if map
                .get(*last)
                .is_some_and(|v| v.as_object().is_some_and(|o| o.is_empty())) =>
        {
            map.remove(*last);
            true
        }
        _ => false,
    }
}

/// Read `value` as the prost type `T` whose full name is `full_name`.
pub fn from_json_typed<T: Message + Default>(
    value: &Value,
    full_name: &str,
) -> Result<T, JsonError> {
    let dynamic = from_json(value, full_name)?;
    dynamic
        .transcode_to::<T>()
        .map_err(|e| JsonError::Transcode {
            message: full_name.to_string(),
            reason: e.to_string(),
        })
}

/// YAML text to the JSON value it denotes (then [`from_json`]).
pub fn yaml_to_json(text: &str) -> Result<Value, JsonError> {
    serde_yaml_ng::from_str(text).map_err(|e| JsonError::Yaml(e.to_string()))
}

/// A message as Envoy's config dump prints it: proto field names, `@type` on every Any.
pub fn to_json(message: &DynamicMessage) -> Result<Value, JsonError> {
    let options = SerializeOptions::new().use_proto_field_name(true);
    message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|e| JsonError::Invalid {
            path: String::new(),
            reason: e.to_string(),
        })
}

/// A prost message of type `full_name` (an envoy-types one) as config-dump JSON.
pub fn typed_to_json<T: Message>(message: &T, full_name: &str) -> Result<Value, JsonError> {
    let desc = descriptor(full_name)?;
    let dynamic =
        DynamicMessage::decode(desc, message.encode_to_vec().as_slice()).map_err(|e| {
            JsonError::Transcode {
                message: full_name.to_string(),
                reason: e.to_string(),
            }
        })?;
    to_json(&dynamic)
}

/// serde_path_to_error writes `a.b[2].c`, which is already the proto path notation; the root
/// is `.`.
fn proto_path(path: &str) -> String {
    if path == "." {
        String::new()
    } else {
        path.to_string()
    }
}

fn check_types(value: &Value, path: &mut String) -> Result<(), JsonError> {
    match value {
        Value::Object(map) => {
            if let Some(t) = map.get("@type") {
                let type_url = t.as_str().unwrap_or_default();
                if pool().get_message_by_name(message_name(type_url)).is_none() {
                    return Err(JsonError::UnknownType {
                        type_url: type_url.to_string(),
                        path: path.clone(),
                    });
                }
            }
            for (k, v) in map {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                check_types(v, path)?;
                path.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                check_types(v, path)?;
                path.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::listener::v3::Listener;
    use serde_json::json;

    const LISTENER: &str = "envoy.config.listener.v3.Listener";

    #[test]
    fn istio_only_anys_read_and_print_back() {
        let value = json!({
            "name": "0.0.0.0_9080",
            "filter_chains": [{"filters": [{
                "name": "istio.stats",
                "typed_config": {
                    "@type": "type.googleapis.com/stats.PluginConfig",
                    "disable_host_header_fallback": true
                }
            }]}]
        });
        let listener: Listener = from_json_typed(&value, LISTENER).expect("reads");
        assert_eq!(listener.name, "0.0.0.0_9080");
        let any = listener.filter_chains[0].filters[0]
            .config_type
            .as_ref()
            .expect("typed config");
        let envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any) =
            any
        else {
            panic!("not a typed config");
        };
        assert_eq!(any.type_url, "type.googleapis.com/stats.PluginConfig");
        let back = typed_to_json(&listener, LISTENER).expect("prints");
        assert_eq!(back, value);
    }

    #[test]
    fn unknown_type_names_url_and_path() {
        let value = json!({"name": "l", "filter_chains": [{}, {"filters": [{
            "name": "x", "typed_config": {"@type": "type.googleapis.com/acme.Nope"}
        }]}]});
        let err = from_json(&value, LISTENER).expect_err("refused");
        assert_eq!(
            err,
            JsonError::UnknownType {
                type_url: "type.googleapis.com/acme.Nope".into(),
                path: "filter_chains[1].filters[0].typed_config".into()
            }
        );
    }

    #[test]
    fn an_at_type_key_inside_a_struct_is_data() {
        let value = json!({"name": "l", "metadata": {"filter_metadata": {"acme": {"@type": "not a type"}}}});
        let listener: Listener = from_json_typed(&value, LISTENER).expect("reads");
        assert!(listener.metadata.is_some());
    }

    #[test]
    fn unknown_field_names_its_path() {
        let value = json!({"name": "l", "filter_chains": [{"bogus": 1}]});
        let err = from_json(&value, LISTENER).expect_err("refused");
        assert!(err.path().starts_with("filter_chains[0]"), "{err}");
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn an_empty_any_reads_as_unset() {
        let value = json!({"name": "l", "listener_filters": [{"name": "f", "typed_config": {}}]});
        let msg = from_json(&value, LISTENER).expect("reads");
        let listener: Listener = msg.transcode_to().expect("typed");
        assert!(listener.listener_filters[0].config_type.is_none());
        let mut v = json!({"a": [{"b": {}}, {"b": {"x": 1}}]});
        assert!(remove_empty_object(&mut v, "a[0].b"));
        assert!(!remove_empty_object(&mut v, "a[1].b"));
        assert_eq!(v, json!({"a": [{}, {"b": {"x": 1}}]}));
    }

    #[test]
    fn yaml_reads_as_json() {
        let value = yaml_to_json("name: l\nbind_to_port: false\n").expect("yaml");
        let listener: Listener = from_json_typed(&value, LISTENER).expect("reads");
        assert_eq!(listener.bind_to_port.map(|b| b.value), Some(false));
    }
}
