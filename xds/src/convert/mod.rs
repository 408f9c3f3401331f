//! From Envoy's protos to [`crate::model`]: one entry point per resource type. Every resource
//! goes the same way: decoded into a reflective message (so that fields no descriptor knows
//! are seen, not dropped), checked field by field against what Remora reads ([`fields`]), then
//! converted by its kind's converter, which refuses values it cannot honour. The first thing
//! refused names the resource, the field path and the type.
//!
//! Policy, beyond "unknown fields and types are refused":
//! - accepted and mapped: `istio.stats`, metadata exchange (network filter, cluster filter,
//!   null-VM Wasm, TypedStruct and `peer_metadata` forms), `istio.alpn`, `istio_authn`,
//!   `grpc_stats`, empty `fault` and `cors`, `router`, the `original_dst`, `tls_inspector` and
//!   `http_inspector` listener filters, `HttpProtocolOptions`, the `uuid` request id, the
//!   `previous_hosts` retry predicate (typed or by name), RBAC and `ext_authz` (as data);
//! - accepted as no-ops: circuit breakers at istiod's unlimited thresholds, HCM tracing without
//!   a provider, `health_check_config: {}` on endpoints;
//! - refused with a named reason: the HBONE listeners, Wasm modules, anything else.

// istiod still writes fields Envoy has deprecated (`match_subject_alt_names`, header
// `exact_match`, `max_grpc_timeout`, `use_original_dst`…): they must be read, not warned about.
#![allow(deprecated)]

mod access_log;
mod any;
mod cluster;
mod common;
mod endpoint;
mod ext_authz;
pub mod fields;
mod hcm_fixed;
pub mod header_format;
mod http;
mod listener;
pub mod log_format;
pub mod name_table;
mod rbac;
mod read;
mod route;
mod secret;
mod tls;

pub use any::{unpack, Unpacked};
pub use listener::HBONE_REASON;
pub use tls::SECRET_NAMES;

use crate::json::{self, JsonError};
use crate::model;
use crate::refusal::{Fault, Kind, Refusal};
use envoy_types::pb::envoy::config::cluster::v3::Cluster as ClusterProto;
use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig as ExtensionConfigProto;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment as ClaProto;
use envoy_types::pb::envoy::config::listener::v3::Listener as ListenerProto;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration as RouteProto;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret as SecretProto;
use prost::Message;
use prost_reflect::{DynamicMessage, Value};

pub(crate) use crate::refusal::join;

/// A resource type Remora converts: its proto, its kind and its model.
pub trait Resource: Message + Default + Clone + 'static {
    const KIND: Kind;
    /// The model it converts into.
    type Model: std::fmt::Debug + Clone + PartialEq + Send + Sync + 'static;
    /// Its name.
    fn name(&self) -> &str;
    /// Convert after the field check.
    fn convert(&self) -> Result<Self::Model, Fault>;
    /// A refusal that comes before the field check (a whole feature Remora lacks).
    fn precheck(&self) -> Result<(), Fault> {
        Ok(())
    }
}

impl Resource for ListenerProto {
    const KIND: Kind = Kind::Listener;
    type Model = model::Listener;
    fn name(&self) -> &str {
        &self.name
    }
    fn convert(&self) -> Result<model::Listener, Fault> {
        listener::listener(self)
    }
    fn precheck(&self) -> Result<(), Fault> {
        if listener::is_hbone(self) {
            return Err(Fault::new("", HBONE_REASON));
        }
        Ok(())
    }
}

impl Resource for ClusterProto {
    const KIND: Kind = Kind::Cluster;
    type Model = model::Cluster;
    fn name(&self) -> &str {
        &self.name
    }
    fn convert(&self) -> Result<model::Cluster, Fault> {
        cluster::cluster(self)
    }
}

impl Resource for RouteProto {
    const KIND: Kind = Kind::Route;
    type Model = model::RouteConfiguration;
    fn name(&self) -> &str {
        &self.name
    }
    fn convert(&self) -> Result<model::RouteConfiguration, Fault> {
        route::route_configuration(self, "")
    }
}

impl Resource for ClaProto {
    const KIND: Kind = Kind::Endpoint;
    type Model = model::ClusterLoadAssignment;
    fn name(&self) -> &str {
        &self.cluster_name
    }
    fn convert(&self) -> Result<model::ClusterLoadAssignment, Fault> {
        endpoint::load_assignment(self, "")
    }
}

impl Resource for SecretProto {
    const KIND: Kind = Kind::Secret;
    type Model = model::secret::Secret;
    fn name(&self) -> &str {
        &self.name
    }
    fn convert(&self) -> Result<model::secret::Secret, Fault> {
        secret::secret(self)
    }
}

impl Resource for ExtensionConfigProto {
    const KIND: Kind = Kind::ExtensionConfig;
    type Model = model::listener::ExtensionConfig;
    fn name(&self) -> &str {
        &self.name
    }
    fn convert(&self) -> Result<model::listener::ExtensionConfig, Fault> {
        secret::extension_config(self)
    }
}

impl Resource for name_table::NameTableProto {
    const KIND: Kind = Kind::NameTable;
    type Model = model::NameTable;
    /// istiod sends one table, unnamed.
    fn name(&self) -> &str {
        ""
    }
    fn convert(&self) -> Result<model::NameTable, Fault> {
        name_table::name_table(self)
    }
}

/// A converted resource with the proto it came from (kept for config dumps).
#[derive(Debug, Clone, PartialEq)]
pub struct Converted<T: Resource> {
    pub proto: T,
    pub model: T::Model,
}

/// The name field of a reflective resource, for refusals before it is typed.
fn dynamic_name(kind: Kind, msg: &DynamicMessage) -> String {
    match msg.get_field_by_name(kind.name_field()).as_deref() {
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    }
}

fn from_dynamic<T: Resource>(msg: DynamicMessage) -> Result<Converted<T>, Refusal> {
    let name = dynamic_name(T::KIND, &msg);
    let refuse = |f: Fault| f.into_refusal(T::KIND, &name);
    let proto: T = msg
        .transcode_to()
        .map_err(|e| refuse(Fault::new("", format!("malformed: {e}"))))?;
    proto.precheck().map_err(refuse)?;
    fields::check(&msg, "").map_err(refuse)?;
    let model = proto.convert().map_err(refuse)?;
    Ok(Converted { proto, model })
}

/// Convert serialised bytes (an `Any`'s value, as ADS delivers it).
pub fn from_bytes<T: Resource>(bytes: &[u8]) -> Result<Converted<T>, Refusal> {
    let desc = json::descriptor(T::KIND.message_name()).map_err(|e| Refusal {
        kind: T::KIND,
        name: String::new(),
        path: String::new(),
        type_url: None,
        reason: e.to_string(),
    })?;
    let msg = DynamicMessage::decode(desc, bytes).map_err(|e| Refusal {
        kind: T::KIND,
        name: String::new(),
        path: String::new(),
        type_url: None,
        reason: format!("malformed: {e}"),
    })?;
    from_dynamic(msg)
}

/// Convert Envoy's proto3 JSON (a resource file, a config dump entry).
pub fn from_json<T: Resource>(value: &serde_json::Value) -> Result<Converted<T>, Refusal> {
    let name = value
        .get(T::KIND.name_field())
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    let msg = json::from_json(value, T::KIND.message_name()).map_err(|e| {
        let type_url = match &e {
            JsonError::UnknownType { type_url, .. } => Some(type_url.clone()),
            _ => None,
        };
        let reason = match &e {
            JsonError::UnknownType { .. } => "unknown type".to_string(),
            JsonError::Invalid { reason, .. } => reason.clone(),
            other => other.to_string(),
        };
        Refusal {
            kind: T::KIND,
            name: name.clone(),
            path: e.path().to_string(),
            type_url,
            reason,
        }
    })?;
    from_dynamic(msg)
}

/// Convert a prost message already decoded (its unknown fields, if any, are already lost).
pub fn from_proto<T: Resource>(proto: &T) -> Result<T::Model, Refusal> {
    let desc = json::descriptor(T::KIND.message_name())
        .map_err(|e| Fault::new("", e.to_string()).into_refusal(T::KIND, proto.name()))?;
    let msg = DynamicMessage::decode(desc, proto.encode_to_vec().as_slice()).map_err(|e| {
        Fault::new("", format!("malformed: {e}")).into_refusal(T::KIND, proto.name())
    })?;
    from_dynamic::<T>(msg).map(|c| c.model)
}

/// A listener.
pub fn listener(l: &ListenerProto) -> Result<model::Listener, Refusal> {
    from_proto(l)
}

/// A cluster.
pub fn cluster(c: &ClusterProto) -> Result<model::Cluster, Refusal> {
    from_proto(c)
}

/// A route table.
pub fn route_configuration(r: &RouteProto) -> Result<model::RouteConfiguration, Refusal> {
    from_proto(r)
}

/// A host set.
pub fn cluster_load_assignment(c: &ClaProto) -> Result<model::ClusterLoadAssignment, Refusal> {
    from_proto(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cluster_bytes() -> Vec<u8> {
        let c: ClusterProto = json::from_json_typed(
            &json!({"name": "c", "type": "STATIC", "connect_timeout": "1s"}),
            "envoy.config.cluster.v3.Cluster",
        )
        .expect("reads");
        c.encode_to_vec()
    }

    #[test]
    fn bytes_with_a_field_no_descriptor_knows_are_refused() {
        let mut bytes = cluster_bytes();
        assert!(from_bytes::<ClusterProto>(&bytes).is_ok());
        // Field 9999, varint 1: what a newer istiod could send and prost would drop.
        prost::encoding::encode_key(9999, prost::encoding::WireType::Varint, &mut bytes);
        prost::encoding::encode_varint(1, &mut bytes);
        let refusal = from_bytes::<ClusterProto>(&bytes).expect_err("refused");
        assert_eq!(refusal.name, "c");
        assert!(
            refusal.reason.contains("unknown field number 9999"),
            "{refusal}"
        );
        let garbage = from_bytes::<ClusterProto>(&[0x0a, 0xff]).expect_err("refused");
        assert!(garbage.reason.starts_with("malformed"), "{garbage}");
    }

    #[test]
    fn the_named_entry_points_agree_with_from_json() {
        let value = json!({"name": "c", "type": "STATIC", "connect_timeout": "1s"});
        let converted = from_json::<ClusterProto>(&value).expect("accepted");
        assert_eq!(cluster(&converted.proto), Ok(converted.model));
        let cla: ClaProto = json::from_json_typed(
            &json!({"cluster_name": "c"}),
            "envoy.config.endpoint.v3.ClusterLoadAssignment",
        )
        .expect("reads");
        assert_eq!(
            cluster_load_assignment(&cla)
                .expect("accepted")
                .cluster_name,
            "c"
        );
    }
}
