//! The secrets istiod serves itself over ADS for a DestinationRule's `credentialName`
//! (pilot/pkg/xds/sds.go, `SecretGen`): from the Kubernetes secret `NAME` in the proxy's
//! namespace, `kubernetes://NAME` is a `tls_certificate` (its `tls.crt` and `tls.key` as
//! inline bytes, `toEnvoyTLSSecret`) and `kubernetes://NAME-cacert` a `validation_context`
//! (its `ca.crt` as inline bytes, `toEnvoyCaSecret`). istiod answers only the names it has and
//! the proxy may read (its own namespace), and nothing for the rest: the proxy waits.
//! Served with [`super::Ads::set`] under [`super::ads::type_url::SECRET`], by name as Envoy
//! asks.

use base64::Engine;
use serde_json::{json, Value};

/// The resource name istiod gives a `credentialName` (`credentials.ToResourceName`).
pub fn credential(name: &str) -> String {
    format!("kubernetes://{name}")
}

/// The name of its roots (`SdsCaSuffix`).
pub fn credential_roots(name: &str) -> String {
    format!("kubernetes://{name}-cacert")
}

fn inline(pem: &str) -> Value {
    json!({"inline_bytes": base64::engine::general_purpose::STANDARD.encode(pem)})
}

/// `toEnvoyTLSSecret`: a certificate chain and its key.
pub fn tls_secret(name: &str, chain: &str, key: &str) -> Value {
    json!({"name": name, "tls_certificate": {
        "certificate_chain": inline(chain), "private_key": inline(key)}})
}

/// `toEnvoyCaSecret`: trusted roots.
pub fn ca_secret(name: &str, roots: &str) -> Value {
    json!({"name": name, "validation_context": {"trusted_ca": inline(roots)}})
}

/// The SDS reference istiod writes for a `credentialName` secret (`SDSAdsConfig`): the ADS
/// stream itself.
pub fn ads_sds(name: &str) -> Value {
    json!({"name": name, "sds_config": {"ads": {}, "resource_api_version": "V3"}})
}
