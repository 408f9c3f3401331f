//! The settings for one pod: the injector's config with the pod's annotations (and, on
//! OpenShift, its namespace) applied. Everything below `injector` reads these, never the raw
//! annotations, so that precedence is decided in one place.

use crate::config::{InjectorConfig, InterceptionMode, Platform};
use crate::error::InjectError;
use crate::names::key;
use crate::proxy_config::ProxyConfig;
use crate::validate::parse_bool;
use k8s_openapi::api::core::v1::Namespace;
use std::collections::BTreeMap;

/// The resolved settings of one pod.
#[derive(Debug, Clone)]
pub struct PodSettings {
    /// The proxy is a native sidecar (an init container with `restartPolicy: Always`).
    pub native: bool,
    pub mode: InterceptionMode,
    /// The agent port; `None` when 0 (no proxy probes).
    pub status_port: Option<u16>,
    /// The proxy goes first and holds the application (never with native sidecars).
    pub hold: bool,
    pub uid: i64,
    pub gid: i64,
    /// The configured gid, which TPROXY uses whatever the platform: the proxy then runs as
    /// root and the capture rules recognise it by this group.
    pub tproxy_gid: i64,
    pub cni: bool,
    pub rewrite_probes: bool,
    pub cap_net_bind_service: bool,
    pub image: String,
    pub readiness_initial_delay: u32,
    pub readiness_period: u32,
    pub readiness_failure_threshold: u32,
    /// The proxy's `PROXY_CONFIG`: the mesh's default ProxyConfig (its `discoveryAddress`) with
    /// the pod's `proxy.istio.io/config` laid over it, as JSON, as Istio's template writes it.
    pub proxy_config_json: String,
}

impl PodSettings {
    /// Applies the pod's annotations to the config. The annotations were validated first.
    pub fn resolve(
        config: &InjectorConfig,
        annotations: &BTreeMap<String, String>,
        namespace: Option<&Namespace>,
    ) -> Result<PodSettings, InjectError> {
        let annotation = |k: &str| annotations.get(k).map(String::as_str);
        let proxy_config = ProxyConfig::parse(annotation(key::PROXY_CONFIG).unwrap_or_default())
            .map_err(|reason| InjectError::InvalidAnnotation {
                annotation: key::PROXY_CONFIG.into(),
                value: annotation(key::PROXY_CONFIG).unwrap_or_default().into(),
                reason,
            })?;
        // Any value but "false" turns native sidecars on, as in Istio's template.
        let native = match annotation(key::NATIVE_SIDECAR) {
            None | Some("") => config.native_sidecars,
            Some(v) => v != "false",
        };
        let mode = annotation(key::INTERCEPTION_MODE)
            .or(proxy_config.interception_mode.as_deref())
            .and_then(InterceptionMode::parse)
            .unwrap_or(config.capture.interception_mode);
        let status_port = match annotation(key::STATUS_PORT) {
            Some(v) => {
                crate::validate::port(v).map_err(|reason| InjectError::InvalidAnnotation {
                    annotation: key::STATUS_PORT.into(),
                    value: v.into(),
                    reason,
                })?
            }
            None => config.proxy.status_port,
        };
        let hold = proxy_config
            .hold_application_until_proxy_starts
            .unwrap_or(false)
            || config.proxy.hold_application_until_proxy_starts;
        let (uid, gid) = match (config.platform, namespace) {
            (Platform::Openshift, Some(ns)) => openshift_ids(ns, config),
            _ => (config.proxy.uid, config.proxy.gid),
        };
        let rewrite_probes = annotation(key::REWRITE_APP_PROBERS)
            .and_then(parse_bool)
            .unwrap_or(config.rewrite_app_probes);
        let cap_net_bind_service = match annotation(key::CAP_NET_BIND_SERVICE) {
            Some(v) => v == "true",
            None => config.proxy.cap_net_bind_service,
        };
        let image = annotation(key::PROXY_IMAGE)
            .filter(|i| !i.trim().is_empty())
            .unwrap_or(&config.image)
            .to_string();
        let readiness = &config.proxy.readiness;
        let number = |k: &str, default: u32| {
            annotation(k)
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        let proxy_config_json = crate::proxy_config::merged_json(
            &config.discovery_address,
            annotation(key::PROXY_CONFIG).unwrap_or_default(),
        );
        Ok(PodSettings {
            proxy_config_json,
            native,
            mode,
            status_port: (status_port != 0).then_some(status_port),
            hold: hold && !native,
            uid,
            gid,
            tproxy_gid: config.proxy.gid,
            cni: config.cni.enabled,
            rewrite_probes,
            cap_net_bind_service,
            image,
            readiness_initial_delay: number(
                key::READINESS_INITIAL_DELAY,
                readiness.initial_delay_seconds,
            ),
            readiness_period: number(key::READINESS_PERIOD, readiness.period_seconds),
            readiness_failure_threshold: number(
                key::READINESS_FAILURE_THRESHOLD,
                readiness.failure_threshold,
            ),
        })
    }

    /// TPROXY: the proxy needs root and NET_ADMIN to bind transparent sockets.
    pub fn tproxy(&self) -> bool {
        self.mode == InterceptionMode::Tproxy
    }

    /// Where the agent serves merged metrics and the rewritten application probes.
    pub fn agent_port(&self) -> u16 {
        self.status_port.unwrap_or(crate::names::port::AGENT)
    }
}

/// OpenShift pre-allocates a uid range and supplemental groups per namespace; the proxy must
/// run inside them, and Istio takes the last uid of the range and the last gid of the first
/// group block. Unparsable annotations leave the configured ids.
fn openshift_ids(ns: &Namespace, config: &InjectorConfig) -> (i64, i64) {
    let annotations = ns.metadata.annotations.as_ref();
    let get = |k: &str| annotations.and_then(|a| a.get(k)).map(String::as_str);
    let uid = get(key::OPENSHIFT_UID_RANGE)
        .and_then(last_of_block)
        .unwrap_or(config.proxy.uid);
    let gid = get(key::OPENSHIFT_SUPPLEMENTAL_GROUPS)
        .and_then(|v| v.split(',').next())
        .and_then(last_of_block)
        .unwrap_or(config.proxy.gid);
    (uid, gid)
}

/// `1000620000/10000` (start/size) or `1000620000-1000629999` (start-end) → its last id.
pub(crate) fn last_of_block(block: &str) -> Option<i64> {
    let block = block.trim();
    if let Some((start, size)) = block.split_once('/') {
        let (start, size): (i64, i64) = (start.trim().parse().ok()?, size.trim().parse().ok()?);
        return (size > 0).then(|| start + size - 1);
    }
    let (start, end) = block.split_once('-')?;
    let (start, end): (i64, i64) = (start.trim().parse().ok()?, end.trim().parse().ok()?);
    (end >= start).then_some(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openshift_blocks() {
        assert_eq!(last_of_block("1000620000/10000"), Some(1000629999));
        assert_eq!(last_of_block("1000-1999"), Some(1999));
        assert_eq!(last_of_block("bad"), None);
    }

    #[test]
    fn annotations_beat_config() {
        let config = InjectorConfig::default();
        let a: BTreeMap<String, String> = [
            (key::NATIVE_SIDECAR, "false"),
            (key::PROXY_CONFIG, "holdApplicationUntilProxyStarts: true"),
            (key::STATUS_PORT, "0"),
            (key::INTERCEPTION_MODE, "TPROXY"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
        let s = PodSettings::resolve(&config, &a, None).unwrap();
        assert!(!s.native && s.hold && s.tproxy());
        assert_eq!(s.status_port, None);
    }
}
