//! What istiod configured, as Envoy's admin shows it: the dynamic parts of `/config_dump`
//! (`dynamic_active_clusters`, `dynamic_warming_clusters`, `dynamic_listeners[].active_state`, `dynamic_route_configs`,
//! `dynamic_endpoint_configs`, `dynamic_active_secrets`) and the xDS clusters' hosts on
//! `/clusters`. `istioctl proxy-config cluster|listener|route|secret` read the first, `istioctl
//! proxy-config endpoint` the second, so both keep Envoy's field names and proto3 JSON.

use super::AdminState;
use crate::istiod::xds::{Refusal, Refusals};
use base64::Engine;
use remora_xds::convert::Resource;
use remora_xds::model::endpoint::Health;
use remora_xds::sink::type_url;
use remora_xds::snapshot::{Entry, Resources, Snapshot};
use serde_json::{json, Value};
use std::time::SystemTime;

/// The dynamic entries of each config-dump section.
#[derive(Debug, Default)]
pub(super) struct Dynamic {
    pub clusters: Vec<Value>,
    /// Clusters waiting for their SDS secrets (Envoy's `dynamic_warming_clusters`).
    pub warming_clusters: Vec<Value>,
    pub listeners: Vec<Value>,
    pub routes: Vec<Value>,
    pub endpoints: Vec<Value>,
    pub secrets: Vec<Value>,
    /// The sections' `version_info`: the last version accepted of CDS and LDS.
    pub cds_version: String,
    pub lds_version: String,
}

/// A timestamp in proto3 JSON, as Envoy writes `last_updated`.
fn timestamp(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// One resource's JSON, `@type`d; one that cannot be rendered says why rather than vanish.
fn resource_json<T: Resource>(entry: &Entry<T>) -> Value {
    match entry.to_json() {
        Ok(mut v) => {
            if let Value::Object(map) = &mut v {
                let mut typed = serde_json::Map::new();
                typed.insert(
                    "@type".into(),
                    Value::String(format!("type.googleapis.com/{}", T::KIND.message_name())),
                );
                typed.extend(std::mem::take(map));
                *map = typed;
            }
            v
        }
        Err(e) => json!({ "error": format!("cannot render: {e}") }),
    }
}

/// Envoy's `UpdateFailureState` of a resource whose last update was refused.
fn error_state(r: &Refusal) -> Value {
    json!({
        "last_update_attempt": timestamp(r.at),
        "details": r.reason,
        "version_info": r.version,
    })
}

/// One section's dynamic entries: each held resource under `field` with its version and time,
/// and an `error_state` where its last update was refused; a refused resource with no version
/// in force has the `error_state` alone, as Envoy lists it. By name.
fn entries<T: Resource>(
    held: &Resources<T>,
    type_url: &str,
    field: &str,
    refusals: Option<&Refusals>,
) -> Vec<(String, Value)> {
    let refused = refusals.map(|r| r.all(type_url)).unwrap_or_default();
    let mut out: Vec<(String, Value)> = held
        .iter()
        .map(|(name, e)| {
            let mut v =
                json!({ "version_info": e.version, "last_updated": timestamp(e.last_updated) });
            v[field] = resource_json(e);
            (name.clone(), v)
        })
        .collect();
    for (name, r) in refused {
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v["error_state"] = error_state(&r),
            None => out.push((name, json!({ "error_state": error_state(&r) }))),
        }
    }
    out
}

/// The held resources as Envoy's config dump shows them.
pub(super) fn dynamic(state: &AdminState, snapshot: &Snapshot) -> Dynamic {
    let cp = state.metrics.control_plane();
    let version = |t: &str| {
        cp.and_then(|cp| cp.stats.of(t).map(|s| s.status().version_text))
            .unwrap_or_default()
    };
    let refusals = cp.map(|cp| cp.refusals.as_ref());
    let values = |v: Vec<(String, Value)>| v.into_iter().map(|(_, v)| v).collect();
    // A listener's state sits under `active_state`, with its name beside it.
    let listeners = entries(
        &snapshot.listeners,
        type_url::LISTENER,
        "listener",
        refusals,
    )
    .into_iter()
    .map(|(name, mut v)| {
        let error = v.as_object_mut().and_then(|m| m.remove("error_state"));
        let mut l = json!({ "name": name });
        if v.get("listener").is_some() {
            l["active_state"] = v;
        }
        if let Some(e) = error {
            l["error_state"] = e;
        }
        l
    })
    .collect();
    Dynamic {
        clusters: values(entries(
            &snapshot.clusters,
            type_url::CLUSTER,
            "cluster",
            refusals,
        )),
        // A warming cluster's refusal is shown on its entry in force, as Envoy shows it.
        warming_clusters: values(entries(
            &snapshot.warming_clusters,
            type_url::CLUSTER,
            "cluster",
            None,
        )),
        listeners,
        routes: values(entries(
            &snapshot.routes,
            type_url::ROUTE,
            "route_config",
            refusals,
        )),
        endpoints: values(entries(
            &snapshot.endpoints,
            type_url::ENDPOINT,
            "endpoint_config",
            refusals,
        )),
        secrets: secrets(state, snapshot),
        cds_version: version(type_url::CLUSTER),
        lds_version: version(type_url::LISTENER),
    }
}

/// Envoy's private keys are shown as `[redacted]`; so is ours.
const REDACTED: &str = "[redacted]";

/// The secrets in force: the workload's, then those istiod served. Envoy shows the chain
/// and roots inline (base64 of the PEM) and the key redacted; so does this.
fn secrets(state: &AdminState, snapshot: &Snapshot) -> Vec<Value> {
    let mut out = workload_secrets(state);
    out.extend(istiod_secrets(snapshot));
    out
}

/// The secrets istiod served over ADS (a DestinationRule's `credentialName`), keys redacted.
fn istiod_secrets(snapshot: &Snapshot) -> Vec<Value> {
    use remora_xds::model::secret::SecretKind;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let secret_type = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
    snapshot
        .secrets
        .iter()
        .map(|(name, e)| {
            let mut secret = json!({ "@type": secret_type, "name": name });
            match &e.model.kind {
                SecretKind::TlsCertificate {
                    certificate_chain, ..
                } => {
                    secret["tls_certificate"] = json!({
                        "certificate_chain": { "inline_bytes": b64(certificate_chain) },
                        "private_key": { "inline_bytes": b64(REDACTED.as_bytes()) },
                    });
                }
                SecretKind::ValidationContext { trusted_ca, .. } => {
                    secret["validation_context"] =
                        json!({ "trusted_ca": { "inline_bytes": b64(trusted_ca) } });
                }
            }
            json!({
                "name": name,
                "version_info": e.version,
                "last_updated": timestamp(e.last_updated),
                "secret": secret,
            })
        })
        .collect()
}

/// The two secrets istiod's resources name, `default` and `ROOTCA`, resolved to the workload
/// certificate held (Remora is its own SDS server; see docs/config.md).
fn workload_secrets(state: &AdminState) -> Vec<Value> {
    let Some(identity) = state.identity.current() else {
        return Vec::new();
    };
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let pem = |ders: &mut dyn Iterator<Item = &[u8]>| -> String {
        ders.map(|der| {
            let body = b64(der);
            let lines: Vec<&str> = body
                .as_bytes()
                .chunks(64)
                .filter_map(|c| std::str::from_utf8(c).ok())
                .collect();
            format!(
                "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
                lines.join("\n")
            )
        })
        .collect()
    };
    let chain_pem = pem(&mut identity.certified.cert.iter().map(|d| d.as_ref()));
    let roots_pem = pem(&mut identity.root_certs.iter().map(|d| d.as_ref()));
    let updated = identity.not_before();
    // The serial names the certificate in force, as a version would.
    let version = identity
        .chain
        .first()
        .map(|c| c.serial.clone())
        .unwrap_or_default();
    let secret_type = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
    vec![
        json!({
            "name": "default",
            "version_info": version,
            "last_updated": timestamp(updated),
            "secret": {
                "@type": secret_type,
                "name": "default",
                "tls_certificate": {
                    "certificate_chain": { "inline_bytes": b64(chain_pem.as_bytes()) },
                    "private_key": { "inline_bytes": b64(REDACTED.as_bytes()) },
                },
            },
        }),
        json!({
            "name": "ROOTCA",
            "version_info": version,
            "last_updated": timestamp(updated),
            "secret": {
                "@type": secret_type,
                "name": "ROOTCA",
                "validation_context": {
                    "trusted_ca": { "inline_bytes": b64(roots_pem.as_bytes()) },
                },
            },
        }),
    ]
}

/// Envoy's `health_flags` text for an EDS status and outlier detection's verdict, in Envoy's
/// order (`/failed_outlier_check` before the EDS flags).
pub(super) fn host_health_flags(health: Health, ejected: bool) -> String {
    match (ejected, health_flags(health)) {
        (false, eds) => eds.to_string(),
        (true, "healthy") => "/failed_outlier_check".to_string(),
        (true, eds) => format!("/failed_outlier_check{eds}"),
    }
}

/// Envoy's `health_flags` text for an EDS status.
pub(super) fn health_flags(health: Health) -> &'static str {
    match health {
        Health::Unknown | Health::Healthy => "healthy",
        Health::Unhealthy | Health::Timeout => "/failed_eds_health",
        Health::Draining => "/eds_status_draining",
        Health::Degraded => "/degraded_eds_health",
    }
}

/// Envoy's `eds_health_status` name for an EDS status.
pub(super) fn eds_health_status(health: Health) -> &'static str {
    match health {
        Health::Unknown => "UNKNOWN",
        Health::Healthy => "HEALTHY",
        Health::Unhealthy => "UNHEALTHY",
        Health::Draining => "DRAINING",
        Health::Timeout => "TIMEOUT",
        Health::Degraded => "DEGRADED",
    }
}

#[cfg(test)]
#[path = "xds_dump_tests.rs"]
mod tests;
