//! Who we are to istiod: Envoy's `Node`, built from plain values. istiod reads the id to find
//! the pod (its proxy type, IP, name and namespace) and the metadata to decide what to push
//! (`NAMESPACE`, `LABELS`, `ISTIO_VERSION`, `INTERCEPTION_MODE`...), exactly as it reads
//! pilot-agent's bootstrap for Envoy, so the values here are the ones that bootstrap writes.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{node::UserAgentVersionType, Locality, Node};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};

/// The name Remora gives itself in `Node.user_agent_name` (Envoy says `envoy`).
pub const USER_AGENT_NAME: &str = "remora";

/// The node as plain data; [`NodeInfo::to_node`] turns it into Envoy's proto.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeInfo {
    /// `sidecar~<INSTANCE_IP>~<POD_NAME>.<ns>~<ns>.svc.cluster.local`; see [`sidecar_node_id`].
    pub id: String,
    /// Envoy's `--service-cluster`; pilot-agent writes `<app>.<namespace>`.
    pub cluster: String,
    /// Node metadata, as pilot-agent's bootstrap writes it (string values mostly, `LABELS` an
    /// object, `INSTANCE_IPS` a comma-separated string).
    pub metadata: BTreeMap<String, serde_json::Value>,
    /// Where the pod runs (region, zone, sub-zone); `None` leaves the field unset.
    pub locality: Option<NodeLocality>,
    /// Remora's version, sent as `user_agent_version`.
    pub user_agent_version: String,
}

/// Region, zone and sub-zone (Kubernetes' `topology.kubernetes.io/*` labels).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeLocality {
    /// `topology.kubernetes.io/region`.
    pub region: String,
    /// `topology.kubernetes.io/zone`.
    pub zone: String,
    /// Istio's `topology.istio.io/subzone`.
    pub sub_zone: String,
}

/// The node id istiod expects from a sidecar. istiod parses it (`model.ParseServiceNodeWithMetadata`):
/// the type, the IP, then `<pod>.<namespace>` as the proxy id and `<namespace>.svc.<domain>` as
/// the DNS domain.
pub fn sidecar_node_id(
    instance_ip: &str,
    pod_name: &str,
    namespace: &str,
    cluster_domain: &str,
) -> String {
    format!("sidecar~{instance_ip}~{pod_name}.{namespace}~{namespace}.svc.{cluster_domain}")
}

impl NodeInfo {
    /// Envoy's `Node` for the first request of every stream.
    pub fn to_node(&self) -> Node {
        Node {
            id: self.id.clone(),
            cluster: self.cluster.clone(),
            metadata: Some(json_map_to_struct(&self.metadata)),
            locality: self.locality.as_ref().map(|l| Locality {
                region: l.region.clone(),
                zone: l.zone.clone(),
                sub_zone: l.sub_zone.clone(),
            }),
            user_agent_name: USER_AGENT_NAME.to_owned(),
            user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
                self.user_agent_version.clone(),
            )),
            ..Node::default()
        }
    }
}

/// A JSON object as a `google.protobuf.Struct`, the form Envoy's bootstrap gives node metadata.
pub fn json_map_to_struct(map: &BTreeMap<String, serde_json::Value>) -> Struct {
    Struct {
        fields: map
            .iter()
            .map(|(k, v)| (k.clone(), json_to_value(v)))
            .collect(),
    }
}

fn json_to_value(value: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match value {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        // Struct numbers are doubles; a JSON number always has an f64 reading, so `as_f64`
        // only fails for arbitrary-precision numbers, which serde_json is not built with here.
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(json_to_value).collect(),
        }),
        J::Object(fields) => Kind::StructValue(Struct {
            fields: fields
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        }),
    };
    Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sidecar_id_has_istio_shape() {
        assert_eq!(
            sidecar_node_id("10.1.2.3", "reviews-v1-abc", "bookinfo", "cluster.local"),
            "sidecar~10.1.2.3~reviews-v1-abc.bookinfo~bookinfo.svc.cluster.local"
        );
    }

    #[test]
    fn node_carries_metadata_as_struct_and_user_agent() {
        let mut metadata = BTreeMap::new();
        metadata.insert("NAMESPACE".to_owned(), json!("bookinfo"));
        metadata.insert(
            "LABELS".to_owned(),
            json!({"app": "reviews", "version": "v1"}),
        );
        metadata.insert("POD_PORTS".to_owned(), json!([{"containerPort": 9080}]));
        let info = NodeInfo {
            id: "sidecar~a~b.c~c.svc.cluster.local".to_owned(),
            cluster: "reviews.bookinfo".to_owned(),
            metadata,
            locality: Some(NodeLocality {
                region: "eu".to_owned(),
                zone: "eu-1a".to_owned(),
                sub_zone: String::new(),
            }),
            user_agent_version: "0.1.0".to_owned(),
        };
        let node = info.to_node();
        assert_eq!(node.user_agent_name, "remora");
        assert_eq!(
            node.user_agent_version_type,
            Some(UserAgentVersionType::UserAgentVersion("0.1.0".to_owned()))
        );
        assert_eq!(node.locality.map(|l| l.zone), Some("eu-1a".to_owned()));
        let fields = node.metadata.map(|s| s.fields).unwrap_or_default();
        assert_eq!(
            fields.get("NAMESPACE").and_then(|v| v.kind.clone()),
            Some(Kind::StringValue("bookinfo".to_owned()))
        );
        let Some(Kind::StructValue(labels)) = fields.get("LABELS").and_then(|v| v.kind.clone())
        else {
            panic!("LABELS is not a struct");
        };
        assert_eq!(
            labels.fields.get("app").and_then(|v| v.kind.clone()),
            Some(Kind::StringValue("reviews".to_owned()))
        );
        let Some(Kind::ListValue(ports)) = fields.get("POD_PORTS").and_then(|v| v.kind.clone())
        else {
            panic!("POD_PORTS is not a list");
        };
        assert_eq!(ports.values.len(), 1);
    }
}
