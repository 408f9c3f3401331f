//! The field check. Before a resource is converted, every set field of the messages listed in
//! [`super::read`] is checked against this list (through every `Any` and
//! `TypedStruct`): one that is not listed is refused by name, so that nothing istiod sets is
//! dropped on the floor. Messages not listed are values the converters read whole (durations,
//! addresses, metadata, wrappers) or Istio-only types whose descriptors declare only what Remora
//! reads (see `descriptors.rs`). Bytes that no descriptor declares are refused everywhere.
//!
//! A listed field is not yet accepted whatever its value: the converters refuse values they
//! cannot honour (success-rate ejection, a tracing provider, a Wasm module file…).

use super::any::unpack;
use super::read;
use crate::refusal::Fault;
use prost_reflect::{DynamicMessage, MapKey, ReflectMessage, Value};

/// The fields Remora reads of `message`, when it is listed.
pub fn read_fields(message: &str) -> Option<&'static [&'static str]> {
    read::all().find(|(m, _)| *m == message).map(|(_, f)| *f)
}

/// Check every set field of `message` (at `path`) and everything below it.
pub fn check(message: &DynamicMessage, path: &str) -> Result<(), Fault> {
    if let Some(unknown) = message.unknown_fields().next() {
        return Err(Fault::new(
            path,
            format!(
                "unknown field number {} in {}",
                unknown.number(),
                message.descriptor().full_name()
            ),
        ));
    }
    let full_name = message.descriptor().full_name().to_string();
    if full_name == "google.protobuf.Any" {
        let any: envoy_types::pb::google::protobuf::Any = message
            .transcode_to()
            .map_err(|e| Fault::new(path, format!("malformed Any: {e}")))?;
        let inner = unpack(&any, path)?;
        return check(&inner.message, path).map_err(|f| f.with_type(&inner.type_url));
    }
    let read = read_fields(&full_name);
    for (field, value) in message.fields() {
        let at = super::join(path, field.name());
        if let Some(read) = read {
            if !read.contains(&field.name()) {
                return Err(Fault::new(
                    at,
                    format!("field not supported (in {full_name})"),
                ));
            }
        }
        check_value(value, &at)?;
    }
    Ok(())
}

fn check_value(value: &Value, path: &str) -> Result<(), Fault> {
    match value {
        Value::Message(m) => check(m, path),
        Value::List(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| check_value(v, &format!("{path}[{i}]"))),
        Value::Map(entries) => entries.iter().try_for_each(|(k, v)| {
            let key = match k {
                MapKey::String(s) => s.clone(),
                other => format!("{other:?}"),
            };
            check_value(v, &format!("{path}[{key}]"))
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptors::pool;

    #[test]
    fn every_listed_field_exists() {
        for (message, fields) in read::all() {
            let desc = pool()
                .get_message_by_name(message)
                .unwrap_or_else(|| panic!("no message {message}"));
            for f in *fields {
                assert!(
                    desc.get_field_by_name(f).is_some(),
                    "{message} has no field {f}"
                );
            }
        }
    }

    #[test]
    fn an_unread_field_is_refused_by_path() {
        let value = serde_json::json!({
            "name": "c",
            "connect_timeout": "1s",
            "lb_subset_config": {"fallback_policy": "ANY_ENDPOINT"}
        });
        let msg = crate::json::from_json(&value, "envoy.config.cluster.v3.Cluster").expect("json");
        let fault = check(&msg, "").expect_err("refused");
        assert_eq!(fault.path, "lb_subset_config");
        let nested = serde_json::json!({
            "name": "l",
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.tcp_proxy",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "cluster": "x", "stat_prefix": "x", "max_connect_attempts": 3
                }
            }]}]
        });
        let msg =
            crate::json::from_json(&nested, "envoy.config.listener.v3.Listener").expect("json");
        let fault = check(&msg, "").expect_err("refused");
        assert_eq!(
            fault.path,
            "filter_chains[0].filters[0].typed_config.max_connect_attempts"
        );
        assert_eq!(
            fault.type_url.as_deref(),
            Some("type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy")
        );
    }
}
