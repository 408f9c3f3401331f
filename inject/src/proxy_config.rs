//! The parts of Istio's per-pod `proxy.istio.io/config` annotation (a ProxyConfig in YAML or
//! JSON) that change what is injected. Other ProxyConfig fields are accepted and ignored: they
//! configure Envoy, which Remora replaces.

use serde::Deserialize;

/// What injection reads from `proxy.istio.io/config`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyConfig {
    /// Start the proxy before the application (without native sidecars).
    pub hold_application_until_proxy_starts: Option<bool>,
    /// The pod's interception mode, below the `sidecar.istio.io/interceptionMode` annotation.
    pub interception_mode: Option<String>,
}

impl ProxyConfig {
    /// Parses the annotation's value; empty means nothing set.
    pub fn parse(text: &str) -> Result<ProxyConfig, String> {
        if text.trim().is_empty() {
            return Ok(ProxyConfig::default());
        }
        let config: ProxyConfig = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        if let Some(mode) = &config.interception_mode {
            if crate::config::InterceptionMode::parse(mode).is_none() {
                return Err(format!(
                    "interceptionMode {mode:?}: expected REDIRECT, TPROXY or NONE"
                ));
            }
        }
        Ok(config)
    }
}

/// `PROXY_CONFIG` for the proxy: `{"discoveryAddress": …}` with the annotation's top-level
/// fields laid over it (a pod may name another istiod). The annotation was validated first; an
/// unreadable one adds nothing.
pub fn merged_json(discovery_address: &str, annotation: &str) -> String {
    let mut merged = serde_json::Map::new();
    merged.insert(
        "discoveryAddress".into(),
        serde_json::Value::String(discovery_address.into()),
    );
    if !annotation.trim().is_empty() {
        if let Ok(serde_json::Value::Object(fields)) =
            serde_yaml_ng::from_str::<serde_json::Value>(annotation)
        {
            merged.extend(fields);
        }
    }
    serde_json::Value::Object(merged).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_yaml_and_json_and_ignores_envoy_fields() {
        let c =
            ProxyConfig::parse("holdApplicationUntilProxyStarts: true\nconcurrency: 4").unwrap();
        assert_eq!(c.hold_application_until_proxy_starts, Some(true));
        let c = ProxyConfig::parse(r#"{"interceptionMode":"TPROXY"}"#).unwrap();
        assert_eq!(c.interception_mode.as_deref(), Some("TPROXY"));
        assert!(ProxyConfig::parse("interceptionMode: SIDEWAYS").is_err());
        assert!(ProxyConfig::parse("holdApplicationUntilProxyStarts: [").is_err());
    }

    #[test]
    fn proxy_config_for_the_proxy_is_the_default_with_the_annotation_over_it() {
        assert_eq!(
            merged_json("istiod.istio-system.svc:15012", ""),
            r#"{"discoveryAddress":"istiod.istio-system.svc:15012"}"#
        );
        let json = merged_json(
            "istiod.istio-system.svc:15012",
            "discoveryAddress: istiod-canary.istio-system.svc:15012\nproxyMetadata:\n  SECRET_TTL: 12h\n",
        );
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            v["discoveryAddress"],
            "istiod-canary.istio-system.svc:15012"
        );
        assert_eq!(v["proxyMetadata"]["SECRET_TTL"], "12h");
    }
}
