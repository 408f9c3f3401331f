//! The metadata-exchange header on the wire, as Istio's proxies write it:
//!
//! ```text
//! magic      4 bytes, big-endian 0x3D230467
//! length     4 bytes, big-endian: the size of what follows
//! payload    google.protobuf.Any {
//!              type_url: "type.googleapis.com/google.protobuf.Struct",
//!              value: google.protobuf.Struct {
//!                "x-envoy-peer-metadata":    Struct { NAME, NAMESPACE, WORKLOAD_NAME,
//!                                                     CLUSTER_ID, LABELS: Struct {…}, … },
//!                "x-envoy-peer-metadata-id": "<node id>" (optional)
//!              }
//!            }
//! ```
//!
//! The protobuf types are prost-types' well-known types: `Struct` keeps its fields in a
//! `BTreeMap`, so the encoding is deterministic (sorted keys), as Istio's is.

use super::WorkloadMetadata;
use prost::Message;
use prost_types::value::Kind;
use prost_types::{Any, Struct, Value};
use std::collections::BTreeMap;

/// The first four bytes of a header.
pub const MAGIC: u32 = 0x3D23_0467;
/// Magic and length.
pub const PREAMBLE_LEN: usize = 8;
/// The `Any` type URL of the payload.
pub const STRUCT_TYPE_URL: &str = "type.googleapis.com/google.protobuf.Struct";
/// The payload field holding the node metadata (and HTTP's header carrying it).
pub const METADATA_KEY: &str = "x-envoy-peer-metadata";
/// The payload field, and HTTP's header, holding the node id.
pub const ID_KEY: &str = "x-envoy-peer-metadata-id";

// Node-metadata keys and the pod labels inside `LABELS`, with Istio's spelling.
const NAME: &str = "NAME";
const NAMESPACE: &str = "NAMESPACE";
const WORKLOAD_NAME: &str = "WORKLOAD_NAME";
const CLUSTER_ID: &str = "CLUSTER_ID";
const LABELS: &str = "LABELS";
const CANONICAL_NAME: &str = "service.istio.io/canonical-name";
const CANONICAL_REVISION: &str = "service.istio.io/canonical-revision";
const APP: &str = "app";
const APP_QUALIFIED: &str = "app.kubernetes.io/name";
const VERSION: &str = "version";
const VERSION_QUALIFIED: &str = "app.kubernetes.io/version";

/// Why a payload is not a metadata-exchange header.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not a protobuf Any: {0}")]
    Any(#[source] prost::DecodeError),
    #[error("the Any holds `{0}`, not a google.protobuf.Struct")]
    TypeUrl(String),
    #[error("not a protobuf Struct: {0}")]
    Struct(#[source] prost::DecodeError),
}

/// The whole header for `metadata`: preamble and payload.
pub fn encode(metadata: &WorkloadMetadata) -> Vec<u8> {
    let payload = Struct {
        fields: BTreeMap::from([(
            METADATA_KEY.to_string(),
            Value {
                kind: Some(Kind::StructValue(node(metadata))),
            },
        )]),
    };
    let any = Any {
        type_url: STRUCT_TYPE_URL.to_string(),
        value: payload.encode_to_vec(),
    };
    let body = any.encode_to_vec();
    // A header is a few hundred bytes; u32 cannot overflow.
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(PREAMBLE_LEN + body.len());
    out.extend_from_slice(&MAGIC.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// The node metadata alone, a serialized `Struct`: what HTTP's header carries (base64).
pub fn encode_node(metadata: &WorkloadMetadata) -> Vec<u8> {
    node(metadata).encode_to_vec()
}

/// `metadata` as Istio's node-metadata `Struct`.
fn node(metadata: &WorkloadMetadata) -> Struct {
    let mut node = BTreeMap::new();
    let put = |fields: &mut BTreeMap<String, Value>, key: &str, value: &str| {
        if !value.is_empty() {
            fields.insert(key.to_string(), string(value));
        }
    };
    put(&mut node, NAME, &metadata.instance);
    put(&mut node, NAMESPACE, &metadata.namespace);
    put(&mut node, WORKLOAD_NAME, &metadata.workload);
    put(&mut node, CLUSTER_ID, &metadata.cluster);
    let mut labels = BTreeMap::new();
    put(&mut labels, CANONICAL_NAME, &metadata.canonical_service);
    put(
        &mut labels,
        CANONICAL_REVISION,
        &metadata.canonical_revision,
    );
    put(&mut labels, APP, &metadata.app);
    put(&mut labels, VERSION, &metadata.version);
    // Istio's proxies always send LABELS, empty or not.
    node.insert(LABELS.to_string(), structure(labels));
    Struct { fields: node }
}

/// The payload length a preamble announces, or `None` if it lacks the magic (the peer is not
/// speaking metadata exchange).
pub fn payload_len(preamble: [u8; PREAMBLE_LEN]) -> Option<u32> {
    let [m0, m1, m2, m3, l0, l1, l2, l3] = preamble;
    (u32::from_be_bytes([m0, m1, m2, m3]) == MAGIC).then(|| u32::from_be_bytes([l0, l1, l2, l3]))
}

/// The node metadata in a payload; `None` when it parses but carries none (Istio's proxies
/// then leave the peer unknown too).
pub fn decode(payload: &[u8]) -> Result<Option<WorkloadMetadata>, DecodeError> {
    let any = Any::decode(payload).map_err(DecodeError::Any)?;
    if any.type_url != STRUCT_TYPE_URL {
        return Err(DecodeError::TypeUrl(any.type_url));
    }
    let outer = Struct::decode(any.value.as_slice()).map_err(DecodeError::Struct)?;
    let Some(node) = outer.fields.get(METADATA_KEY).and_then(as_struct) else {
        return Ok(None);
    };
    Ok(Some(read_node(node)))
}

/// The node metadata in a serialized `Struct` (HTTP's header, base64-decoded).
pub fn decode_node(bytes: &[u8]) -> Result<WorkloadMetadata, DecodeError> {
    let node = Struct::decode(bytes).map_err(DecodeError::Struct)?;
    Ok(read_node(&node))
}

fn read_node(node: &Struct) -> WorkloadMetadata {
    let text = |fields: &BTreeMap<String, Value>, key: &str| {
        fields
            .get(key)
            .and_then(as_str)
            .unwrap_or_default()
            .to_string()
    };
    let mut m = WorkloadMetadata {
        instance: text(&node.fields, NAME),
        namespace: text(&node.fields, NAMESPACE),
        workload: text(&node.fields, WORKLOAD_NAME),
        cluster: text(&node.fields, CLUSTER_ID),
        ..WorkloadMetadata::default()
    };
    if let Some(labels) = node.fields.get(LABELS).and_then(as_struct) {
        let label = |key: &str| text(&labels.fields, key);
        m.canonical_service = label(CANONICAL_NAME);
        m.canonical_revision = label(CANONICAL_REVISION);
        // As Istio reads them: the qualified Kubernetes label wins over the short one.
        m.app = Some(label(APP_QUALIFIED))
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| label(APP));
        m.version = Some(label(VERSION_QUALIFIED))
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| label(VERSION));
    }
    m
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

fn structure(fields: BTreeMap<String, Value>) -> Value {
    Value {
        kind: Some(Kind::StructValue(Struct { fields })),
    }
}

fn as_struct(v: &Value) -> Option<&Struct> {
    match &v.kind {
        Some(Kind::StructValue(s)) => Some(s),
        _ => None,
    }
}

fn as_str(v: &Value) -> Option<&str> {
    match &v.kind {
        Some(Kind::StringValue(s)) => Some(s),
        _ => None,
    }
}
