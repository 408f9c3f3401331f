//! Opening an `Any`: by its type URL, through a `TypedStruct` (`udpa.type.v1` or
//! `xds.type.v3`) when istiod wrapped the real type in one, into a message of the pool.

use crate::descriptors::pool;
use crate::json::{from_json, message_name, to_json};
use crate::refusal::Fault;
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use prost_reflect::{DynamicMessage, Value};

const TYPED_STRUCTS: [&str; 2] = ["udpa.type.v1.TypedStruct", "xds.type.v3.TypedStruct"];

/// An opened `Any`.
#[derive(Debug, Clone)]
pub struct Unpacked {
    /// The type it stands for: a TypedStruct's `type_url`, else the Any's own.
    pub type_url: String,
    /// The message: decoded, or a TypedStruct's value read as that type.
    pub message: DynamicMessage,
    /// It came in a TypedStruct.
    pub via_typed_struct: bool,
}

impl Unpacked {
    /// The message name of its type.
    pub fn message_name(&self) -> &str {
        message_name(&self.type_url)
    }

    /// As the envoy-types struct `T`.
    pub fn to<T: Message + Default>(&self, path: &str) -> Result<T, Fault> {
        self.message
            .transcode_to::<T>()
            .map_err(|e| Fault::new(path, format!("malformed: {e}")).with_type(&self.type_url))
    }

    /// A string field of an Istio-only message (empty when unset).
    pub fn string(&self, field: &str) -> String {
        match self.message.get_field_by_name(field).as_deref() {
            Some(Value::String(s)) => s.clone(),
            _ => String::new(),
        }
    }

    /// A repeated string field of an Istio-only message.
    pub fn strings(&self, field: &str) -> Vec<String> {
        match self.message.get_field_by_name(field).as_deref() {
            Some(Value::List(items)) => items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// A bool field of an Istio-only message.
    pub fn bool(&self, field: &str) -> bool {
        matches!(
            self.message.get_field_by_name(field).as_deref(),
            Some(Value::Bool(true))
        )
    }
}

/// Open `any` at `path`. A type the pool does not know is refused; so is a TypedStruct whose
/// inner type the pool does not know, since its fields could say anything.
pub fn unpack(any: &Any, path: &str) -> Result<Unpacked, Fault> {
    let name = message_name(&any.type_url);
    let desc = pool()
        .get_message_by_name(name)
        .ok_or_else(|| Fault::new(path, "unknown type").with_type(&any.type_url))?;
    let message = DynamicMessage::decode(desc, any.value.as_slice())
        .map_err(|e| Fault::new(path, format!("malformed: {e}")).with_type(&any.type_url))?;
    if !TYPED_STRUCTS.contains(&name) {
        return Ok(Unpacked {
            type_url: any.type_url.clone(),
            message,
            via_typed_struct: false,
        });
    }
    let inner_url = match message.get_field_by_name("type_url").as_deref() {
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    };
    let inner_desc = pool()
        .get_message_by_name(message_name(&inner_url))
        .ok_or_else(|| Fault::new(path, "unknown type (in a TypedStruct)").with_type(&inner_url))?;
    let value = match message.get_field_by_name("value").as_deref() {
        Some(Value::Message(s)) => {
            to_json(s).map_err(|e| Fault::new(path, e.to_string()).with_type(&inner_url))?
        }
        _ => serde_json::Value::Object(Default::default()),
    };
    let inner = from_json(&value, inner_desc.full_name()).map_err(|e| {
        let at = if e.path().is_empty() {
            format!("{path}.value")
        } else {
            format!("{path}.value.{}", e.path())
        };
        Fault::new(at, e.to_string()).with_type(&inner_url)
    })?;
    Ok(Unpacked {
        type_url: inner_url,
        message: inner,
        via_typed_struct: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn any_of(value: serde_json::Value) -> Any {
        // An Any in JSON, read through a message that holds one (a ListenerFilter).
        let filter: envoy_types::pb::envoy::config::listener::v3::ListenerFilter =
            crate::json::from_json_typed(
                &json!({"name": "f", "typed_config": value}),
                "envoy.config.listener.v3.ListenerFilter",
            )
            .expect("reads");
        match filter.config_type {
            Some(envoy_types::pb::envoy::config::listener::v3::listener_filter::ConfigType::TypedConfig(a)) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn typed_struct_opens_as_its_inner_type() {
        let any = any_of(json!({
            "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
            "type_url": "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange",
            "value": {"protocol": "istio-peer-exchange", "enable_discovery": true}
        }));
        let u = unpack(&any, "filters[0].typed_config").expect("opens");
        assert!(u.via_typed_struct);
        assert_eq!(
            u.message_name(),
            "envoy.tcp.metadataexchange.config.MetadataExchange"
        );
        assert_eq!(u.string("protocol"), "istio-peer-exchange");
        assert!(u.bool("enable_discovery"));
    }

    #[test]
    fn typed_struct_with_unknown_inner_type_or_field_is_refused() {
        let any = any_of(json!({
            "@type": "type.googleapis.com/xds.type.v3.TypedStruct",
            "type_url": "type.googleapis.com/acme.Secret",
        }));
        let f = unpack(&any, "p").expect_err("refused");
        assert_eq!(
            f.type_url.as_deref(),
            Some("type.googleapis.com/acme.Secret")
        );
        let any = any_of(json!({
            "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
            "type_url": "type.googleapis.com/io.istio.network.authn.Config",
            "value": {"shared": true, "bogus": 1}
        }));
        let f = unpack(&any, "p").expect_err("refused");
        assert!(f.path.starts_with("p.value"), "{f:?}");
        assert!(f.reason.contains("bogus"), "{f:?}");
    }
}
