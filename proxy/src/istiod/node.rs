//! The pod as istiod sees it: the facts pilot-agent writes into Envoy's bootstrap `node`. Plain
//! data, no protobuf: the ADS client turns it into Envoy's `Node` (`id`, `cluster`,
//! `metadata`), and the CA call sends part of it too.

use remora_config::IstiodConfig;
use serde_json::Value;
use std::collections::BTreeMap;

/// The Istio release whose xDS Remora speaks. istiod shapes what it pushes by the proxy's
/// `ISTIO_VERSION`, so this says which shape Remora expects; `ISTIO_META_ISTIO_VERSION` wins.
pub const ISTIO_VERSION: &str = "1.28.0";

/// The cluster DNS suffix in the node id, as pilot-agent writes it.
const CLUSTER_DOMAIN: &str = "cluster.local";

/// Envoy's `Node`, as plain data.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    /// `sidecar~<INSTANCE_IP>~<POD_NAME>.<ns>~<ns>.svc.cluster.local`.
    pub id: String,
    /// Envoy's `node.cluster`: `<workload>.<ns>`, as pilot-agent sets the service cluster.
    pub cluster: String,
    pub instance_ip: String,
    pub pod_name: String,
    pub namespace: String,
    pub service_account: String,
    /// `<ns>.svc.cluster.local`.
    pub dns_domain: String,
    /// Envoy's `node.metadata`: every `ISTIO_META_*` variable (prefix dropped), every
    /// `ISTIO_METAJSON_*` parsed as JSON, and what pilot-agent adds (NAMESPACE, LABELS…).
    pub metadata: BTreeMap<String, Value>,
}

impl NodeInfo {
    /// Build from the resolved variables (`vars`: environment over proxyMetadata).
    pub(crate) fn resolve(
        file: &IstiodConfig,
        vars: &BTreeMap<String, String>,
        cluster_id: &str,
        trust_domain: &str,
    ) -> NodeInfo {
        let var = |name: &str| vars.get(name).cloned();
        let pod_name = var("POD_NAME")
            .or_else(|| file.pod_name.clone())
            .unwrap_or_default();
        let namespace = var("POD_NAMESPACE")
            .or_else(|| file.pod_namespace.clone())
            .unwrap_or_else(|| "default".into());
        let instance_ip = var("INSTANCE_IP")
            .or_else(|| file.instance_ip.clone())
            .unwrap_or_default();
        let service_account = var("SERVICE_ACCOUNT")
            .or_else(|| file.service_account.clone())
            .unwrap_or_else(|| "default".into());
        let dns_domain = format!("{namespace}.svc.{CLUSTER_DOMAIN}");

        let mut metadata: BTreeMap<String, Value> = file
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        for (k, v) in vars {
            if let Some(name) = k.strip_prefix("ISTIO_METAJSON_") {
                match serde_json::from_str::<Value>(v) {
                    Ok(json) => {
                        metadata.insert(name.into(), json);
                    }
                    Err(e) => {
                        tracing::warn!(variable = %k, error = %e, "not JSON; left out of the node metadata")
                    }
                }
            } else if let Some(name) = k.strip_prefix("ISTIO_META_") {
                metadata.insert(name.into(), Value::String(v.clone()));
            }
        }
        let mut fixed = |k: &str, v: String| {
            metadata.insert(k.into(), Value::String(v));
        };
        fixed("NAME", pod_name.clone());
        fixed("NAMESPACE", namespace.clone());
        fixed("SERVICE_ACCOUNT", service_account.clone());
        fixed("CLUSTER_ID", cluster_id.into());
        if !instance_ip.is_empty() {
            fixed("INSTANCE_IPS", instance_ip.clone());
        }
        let mesh_id = var("ISTIO_META_MESH_ID")
            .or_else(|| file.mesh_id.clone())
            .unwrap_or_else(|| trust_domain.into());
        fixed("MESH_ID", mesh_id);
        let workload = var("ISTIO_META_WORKLOAD_NAME")
            .unwrap_or_else(|| crate::workload::workload_from_pod_name(&pod_name));
        fixed("WORKLOAD_NAME", workload.clone());
        metadata
            .entry("ISTIO_VERSION".into())
            .or_insert_with(|| Value::String(ISTIO_VERSION.into()));
        metadata
            .entry("INTERCEPTION_MODE".into())
            .or_insert_with(|| Value::String("REDIRECT".into()));
        metadata
            .entry("LABELS".into())
            .or_insert_with(|| Value::Object(serde_json::Map::new()));

        NodeInfo {
            id: format!("sidecar~{instance_ip}~{pod_name}.{namespace}~{dns_domain}"),
            cluster: format!("{workload}.{namespace}"),
            instance_ip,
            pod_name,
            namespace,
            service_account,
            dns_domain,
            metadata,
        }
    }

    /// Use the pod's labels (the downward-API file) when no `ISTIO_METAJSON_LABELS` gave any,
    /// as pilot-agent reads them from the same file.
    pub fn with_pod_labels(mut self, labels: &BTreeMap<String, String>) -> NodeInfo {
        let empty = self
            .metadata
            .get("LABELS")
            .and_then(Value::as_object)
            .is_none_or(serde_json::Map::is_empty);
        if empty && !labels.is_empty() {
            let map = labels
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            self.metadata.insert("LABELS".into(), Value::Object(map));
        }
        self
    }
}
