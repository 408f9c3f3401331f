//! What Remora needs to talk to istiod, resolved from Istio's environment (what the injector
//! sets, as pilot-agent reads it) over the `istiod:` section of the config file. The
//! environment wins where both say something: it is what the injector and the pod's
//! `proxy.istio.io/config` annotation chose for this pod, and what a pilot-agent user expects
//! to take effect; the file fills the rest, then Istio's defaults.
//!
//! istiod mode is on when the config names a discovery address or `PROXY_CONFIG` is set (the
//! injector always sets it); otherwise [`AgentSettings::resolve`] gives `None` and Remora runs
//! as it does on a laptop.

use super::node::NodeInfo;
use remora_config::IstiodConfig;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// istiod's address when ProxyConfig names none (Istio's default).
pub const DEFAULT_DISCOVERY_ADDRESS: &str = "istiod.istio-system.svc:15012";

/// Everything the CA client, the channel and the ADS client need.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSettings {
    /// `host:port` of istiod's xDS (ADS) service.
    pub discovery_address: String,
    /// `host:port` of the CA (`CA_ADDR`); istiod's by default, on the same port.
    pub ca_address: String,
    /// The projected service-account token, re-read for every call.
    pub token_file: PathBuf,
    /// Roots that istiod's serving certificate is verified against, for xDS.
    pub xds_root_cert_file: PathBuf,
    /// The same for the CA (`CA_ROOT_CA`); differs only when the CA is not istiod.
    pub ca_root_cert_file: PathBuf,
    /// Istio's `clusterid` header.
    pub cluster_id: String,
    /// The first part of the SPIFFE ID asked for.
    pub trust_domain: String,
    /// The lifetime asked for (`SECRET_TTL`).
    pub secret_ttl: Duration,
    /// Renew after this share of the lifetime (`SECRET_GRACE_PERIOD_RATIO`).
    pub grace_period_ratio: f64,
    /// The pod as istiod sees it: what the ADS client turns into Envoy's `Node`.
    pub node: NodeInfo,
    /// Delta or state-of-the-world ADS (`ISTIO_DELTA_XDS`, `istiod.delta_xds`).
    pub xds_mode: remora_xds::ads::Mode,
}

/// Why the settings cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("PROXY_CONFIG is not a ProxyConfig in JSON or YAML: {0}")]
    ProxyConfig(String),
    #[error("{variable}={value:?}: {why}")]
    Variable {
        variable: &'static str,
        value: String,
        why: String,
    },
}

/// The parts of Istio's ProxyConfig that matter to the agent; the rest configures Envoy and is
/// ignored, as Remora replaces it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyConfig {
    pub discovery_address: Option<String>,
    /// Variables the mesh sets for every proxy; the container's own environment wins, as the
    /// injector renders them into it.
    #[serde(default)]
    pub proxy_metadata: BTreeMap<String, String>,
    /// How long a retired filter chain's connections keep going (Envoy's `--drain-time-s`,
    /// which pilot-agent sets from it): a protobuf JSON duration such as `45s`.
    pub drain_duration: Option<String>,
}

impl ProxyConfig {
    /// Parse `PROXY_CONFIG`: JSON (what the injector writes) or YAML (what people write).
    pub fn parse(text: &str) -> Result<ProxyConfig, SettingsError> {
        if text.trim().is_empty() {
            return Ok(ProxyConfig::default());
        }
        // JSON is YAML, so one parser reads both.
        serde_yaml_ng::from_str(text).map_err(|e| SettingsError::ProxyConfig(e.to_string()))
    }
}

/// ProxyConfig's `drainDuration` from the text of `PROXY_CONFIG` (`None` when unset or
/// empty); a value that is not a duration is refused, as pilot-agent refuses it.
pub fn drain_duration(proxy_config: Option<&str>) -> Result<Option<Duration>, SettingsError> {
    let Some(text) = proxy_config.filter(|t| !t.trim().is_empty()) else {
        return Ok(None);
    };
    match ProxyConfig::parse(text)?
        .drain_duration
        .filter(|d| !d.is_empty())
    {
        None => Ok(None),
        Some(d) => humantime::parse_duration(&d)
            .map(Some)
            .map_err(|e| SettingsError::Variable {
                variable: "PROXY_CONFIG drainDuration",
                value: d,
                why: e.to_string(),
            }),
    }
}

impl AgentSettings {
    /// Resolve from the environment (`env`, all of it: the `ISTIO_META_*` variables are
    /// enumerated) over the file's section; `None` when no discovery address is configured
    /// anywhere.
    pub fn resolve(
        file: &IstiodConfig,
        env: &BTreeMap<String, String>,
    ) -> Result<Option<AgentSettings>, SettingsError> {
        let proxy_config_text = env.get("PROXY_CONFIG").filter(|v| !v.trim().is_empty());
        let proxy_config = match proxy_config_text {
            Some(text) => ProxyConfig::parse(text)?,
            None => ProxyConfig::default(),
        };
        if proxy_config_text.is_none() && file.discovery_address.is_none() {
            return Ok(None);
        }
        // The container's environment over ProxyConfig's proxyMetadata; empty counts as unset.
        let mut vars = proxy_config.proxy_metadata.clone();
        vars.extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
        vars.retain(|_, v| !v.is_empty());
        let var = |name: &str| vars.get(name).cloned();
        let discovery_address = proxy_config
            .discovery_address
            .clone()
            .filter(|a| !a.is_empty())
            .or_else(|| file.discovery_address.clone())
            .unwrap_or_else(|| DEFAULT_DISCOVERY_ADDRESS.into());
        check_address("discoveryAddress", &discovery_address)?;
        let ca_address = var("CA_ADDR")
            .or_else(|| file.ca_address.clone())
            .unwrap_or_else(|| discovery_address.clone());
        check_address("CA_ADDR", &ca_address)?;
        let xds_root_cert_file = var("XDS_ROOT_CA")
            .map(PathBuf::from)
            .unwrap_or_else(|| file.root_cert_file.clone());
        let ca_root_cert_file = var("CA_ROOT_CA")
            .map(PathBuf::from)
            .unwrap_or_else(|| xds_root_cert_file.clone());
        let secret_ttl = match var("SECRET_TTL") {
            Some(v) => parse_duration("SECRET_TTL", &v)?,
            None => file.secret_ttl,
        };
        let grace_period_ratio = match var("SECRET_GRACE_PERIOD_RATIO") {
            Some(v) => parse_ratio(&v)?,
            None => file.secret_grace_period_ratio.0,
        };
        let trust_domain = var("TRUST_DOMAIN").unwrap_or_else(|| file.trust_domain.clone());
        let cluster_id = var("ISTIO_META_CLUSTER_ID").unwrap_or_else(|| file.cluster_id.clone());
        let delta_xds = match var("ISTIO_DELTA_XDS") {
            Some(v) => parse_bool("ISTIO_DELTA_XDS", &v)?,
            None => file.delta_xds,
        };
        let xds_mode = match delta_xds {
            true => remora_xds::ads::Mode::Delta,
            false => remora_xds::ads::Mode::StateOfTheWorld,
        };
        let mut node = NodeInfo::resolve(file, &vars, &cluster_id, &trust_domain);
        // pilot-agent hands istiod the pod's ProxyConfig in the node metadata; istiod reads
        // settings from it that no variable carries.
        if let Some(json) = proxy_config_text.and_then(|t| serde_yaml_ng::from_str(t).ok()) {
            node.metadata.insert("PROXY_CONFIG".into(), json);
        }
        Ok(Some(AgentSettings {
            discovery_address,
            ca_address,
            token_file: file.token_file.clone(),
            xds_root_cert_file,
            ca_root_cert_file,
            cluster_id,
            trust_domain,
            secret_ttl,
            grace_period_ratio,
            node,
            xds_mode,
        }))
    }

    /// The SPIFFE ID the CSR asks for: `spiffe://<trust domain>/ns/<ns>/sa/<sa>`.
    pub fn spiffe_id(&self) -> String {
        format!(
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.node.namespace, self.node.service_account
        )
    }
}

fn check_address(variable: &'static str, value: &str) -> Result<(), SettingsError> {
    remora_config::check_address(value).map_err(|why| SettingsError::Variable {
        variable,
        value: value.into(),
        why,
    })
}

/// A Go duration (`24h`, `10s`); pilot-agent refuses to start on a bad one, and so do we: a
/// certificate lifetime is not something to guess.
fn parse_duration(variable: &'static str, value: &str) -> Result<Duration, SettingsError> {
    match humantime::parse_duration(value) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(SettingsError::Variable {
            variable,
            value: value.into(),
            why: "must be greater than zero".into(),
        }),
        Err(e) => Err(SettingsError::Variable {
            variable,
            value: value.into(),
            why: e.to_string(),
        }),
    }
}

/// A boolean as Go's `strconv.ParseBool` reads it, which is how pilot-agent reads its flags.
fn parse_bool(variable: &'static str, value: &str) -> Result<bool, SettingsError> {
    match value.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(SettingsError::Variable {
            variable,
            value: value.into(),
            why: "must be true or false".into(),
        }),
    }
}

fn parse_ratio(value: &str) -> Result<f64, SettingsError> {
    match value.trim().parse::<f64>() {
        Ok(r) if r > 0.0 && r < 1.0 => Ok(r),
        _ => Err(SettingsError::Variable {
            variable: "SECRET_GRACE_PERIOD_RATIO",
            value: value.into(),
            why: "must be a number between 0 and 1".into(),
        }),
    }
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;
