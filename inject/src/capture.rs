//! The capture init container's arguments, rendered exactly as Istio's injection template
//! renders istio-iptables' (so `remora capture`, a drop-in for it, installs the same rules),
//! and the annotations through which Istio's CNI plugin receives the same choices.

use crate::config::{CniProvider, InjectorConfig, InterceptionMode};
use crate::names::{key, port};
use crate::settings::PodSettings;
use std::collections::BTreeMap;

/// Reads an annotation, falling back to the config's value when it is absent. A present but
/// empty annotation wins: `includeOutboundIPRanges: ""` means capture no outbound range.
struct Lookup<'a> {
    annotations: &'a BTreeMap<String, String>,
}

impl Lookup<'_> {
    fn get<'v>(&'v self, k: &str, default: &'v str) -> &'v str {
        self.annotations.get(k).map_or(default, String::as_str)
    }

    fn has(&self, k: &str) -> bool {
        self.annotations.contains_key(k)
    }

    fn non_empty(&self, k: &str) -> Option<&str> {
        self.annotations
            .get(k)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// The `remora capture` arguments (istio-iptables' flags), without the subcommand name.
pub fn args(
    settings: &PodSettings,
    config: &InjectorConfig,
    annotations: &BTreeMap<String, String>,
) -> Vec<String> {
    let a = Lookup { annotations };
    let c = &config.capture;
    // Under TPROXY the proxy runs as root, so the rules recognise it by its group; istio-iptables
    // uses -u for the group too when -g is not given.
    let uid = if settings.tproxy() {
        settings.tproxy_gid
    } else {
        settings.uid
    };
    let mut args: Vec<String> = vec![
        "-p".into(),
        port::OUTBOUND.to_string(),
        "-z".into(),
        port::INBOUND.to_string(),
        "-u".into(),
        uid.to_string(),
        "-m".into(),
        settings.mode.as_str().into(),
        "-i".into(),
        a.get(key::INCLUDE_OUTBOUND_IP_RANGES, &c.include_ip_ranges)
            .into(),
        "-x".into(),
        a.get(key::EXCLUDE_OUTBOUND_IP_RANGES, &c.exclude_ip_ranges)
            .into(),
        "-b".into(),
        a.get(key::INCLUDE_INBOUND_PORTS, &c.include_inbound_ports)
            .into(),
        "-d".into(),
    ];
    let excluded = excluded_inbound_ports(settings, config, annotations);
    let fixed = format!("{},{}", port::METRICS, port::READINESS);
    args.push(if excluded.is_empty() {
        fixed
    } else {
        format!("{fixed},{excluded}")
    });
    if a.has(key::INCLUDE_OUTBOUND_PORTS) || !c.include_outbound_ports.is_empty() {
        args.push("-q".into());
        args.push(
            a.get(key::INCLUDE_OUTBOUND_PORTS, &c.include_outbound_ports)
                .into(),
        );
    }
    if a.has(key::EXCLUDE_OUTBOUND_PORTS) || !c.exclude_outbound_ports.is_empty() {
        args.push("-o".into());
        args.push(
            a.get(key::EXCLUDE_OUTBOUND_PORTS, &c.exclude_outbound_ports)
                .into(),
        );
    }
    // The newer annotation wins over the older one.
    let virt = annotations
        .get(key::REROUTE_VIRTUAL_INTERFACES)
        .or_else(|| annotations.get(key::KUBEVIRT_INTERFACES));
    if let Some(v) = virt {
        args.push("-k".into());
        args.push(v.clone());
    }
    if let Some(v) = annotations.get(key::EXCLUDE_INTERFACES) {
        args.push("-c".into());
        args.push(v.clone());
    }
    args.push(format!(
        "--log_output_level={}",
        a.get(key::AGENT_LOG_LEVEL, &c.log_level)
    ));
    if c.log_as_json {
        args.push("--log_as_json".into());
    }
    if settings.cni {
        args.push("--run-validation".into());
        args.push("--skip-rule-apply".into());
    } else if c.force_apply {
        args.push("--force-apply".into());
    }
    if c.native_nftables {
        args.push("--native-nftables".into());
    }
    args
}

/// The inbound ports left alone: the configured ones plus the status port, which kubelet's
/// probes reach without crossing the proxy.
fn excluded_inbound_ports(
    settings: &PodSettings,
    config: &InjectorConfig,
    annotations: &BTreeMap<String, String>,
) -> String {
    let a = Lookup { annotations };
    let excluded = a.get(
        key::EXCLUDE_INBOUND_PORTS,
        &config.capture.exclude_inbound_ports,
    );
    let Some(status) = settings.status_port else {
        return excluded.to_string();
    };
    let status = status.to_string();
    let mut ports = Vec::new();
    for p in excluded.split(',') {
        if p == status {
            return excluded.to_string();
        }
        let p = p.trim();
        if !p.is_empty() {
            ports.push(p);
        }
    }
    ports.push(&status);
    ports.join(",")
}

/// With Istio's CNI plugin doing the capture, the plugin reads the same choices from the
/// pod's annotations; these are the ones to set (key, value), in Istio's order.
pub fn cni_annotations(
    settings: &PodSettings,
    config: &InjectorConfig,
    annotations: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let a = Lookup { annotations };
    let c = &config.capture;
    let mut out: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: &str| out.push((k.to_string(), v.to_string()));
    if config.cni.provider == CniProvider::Multus {
        let existing = annotations
            .get(key::MULTUS_NETWORKS)
            .map_or("", String::as_str);
        set(
            key::MULTUS_NETWORKS,
            &append_multus_network(existing, "default/istio-cni"),
        );
    }
    set(key::INTERCEPTION_MODE, settings.mode.as_str());
    let include = a.get(key::INCLUDE_OUTBOUND_IP_RANGES, &c.include_ip_ranges);
    if !include.is_empty() {
        set(key::INCLUDE_OUTBOUND_IP_RANGES, include);
    }
    let exclude = a.get(key::EXCLUDE_OUTBOUND_IP_RANGES, &c.exclude_ip_ranges);
    if !exclude.is_empty() {
        set(key::EXCLUDE_OUTBOUND_IP_RANGES, exclude);
    }
    set(
        key::INCLUDE_INBOUND_PORTS,
        a.get(key::INCLUDE_INBOUND_PORTS, &c.include_inbound_ports),
    );
    // The plugin adds 15020, 15021 and 15090 itself.
    set(
        key::EXCLUDE_INBOUND_PORTS,
        &excluded_inbound_ports(settings, config, annotations),
    );
    if a.has(key::INCLUDE_OUTBOUND_PORTS) || !c.include_outbound_ports.is_empty() {
        set(
            key::INCLUDE_OUTBOUND_PORTS,
            a.get(key::INCLUDE_OUTBOUND_PORTS, &c.include_outbound_ports),
        );
    }
    if a.has(key::EXCLUDE_OUTBOUND_PORTS) || !c.exclude_outbound_ports.is_empty() {
        set(
            key::EXCLUDE_OUTBOUND_PORTS,
            a.get(key::EXCLUDE_OUTBOUND_PORTS, &c.exclude_outbound_ports),
        );
    }
    for k in [
        key::KUBEVIRT_INTERFACES,
        key::REROUTE_VIRTUAL_INTERFACES,
        key::EXCLUDE_INTERFACES,
    ] {
        if let Some(v) = a.non_empty(k) {
            let v = v.to_string();
            set(k, &v);
        }
    }
    out
}

/// Adds Istio's CNI network to multus' networks annotation, in whichever of its two forms
/// (a comma-separated list or a JSON list) the pod uses, unless it is already there.
pub fn append_multus_network(existing: &str, network: &str) -> String {
    if existing.is_empty() {
        return network.to_string();
    }
    let (namespace, name) = network.split_once('/').unwrap_or(("", network));
    if let Some(end) = existing.rfind(']') {
        let Ok(list) = serde_json::from_str::<Vec<serde_json::Value>>(existing) else {
            // Not JSON after all: leave it to multus to complain, as Istio does.
            return existing.to_string();
        };
        let present = list.iter().any(|n| {
            n.get("name").and_then(|v| v.as_str()) == Some(name)
                && n.get("namespace").and_then(|v| v.as_str()).unwrap_or("") == namespace
        });
        if present {
            return existing.to_string();
        }
        let entry = if namespace.is_empty() {
            format!(r#", {{"name": "{name}"}}"#)
        } else {
            format!(r#", {{"name": "{name}", "namespace": "{namespace}"}}"#)
        };
        return format!("{}{entry}{}", &existing[..end], &existing[end..]);
    }
    if existing.split(',').any(|n| n.trim() == network) {
        return existing.to_string();
    }
    format!("{existing}, {network}")
}

/// Whether the pod gets a capture container at all.
pub fn wanted(settings: &PodSettings) -> bool {
    settings.mode != InterceptionMode::None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multus_forms() {
        assert_eq!(
            append_multus_network("", "default/istio-cni"),
            "default/istio-cni"
        );
        assert_eq!(
            append_multus_network("alt_cni", "default/istio-cni"),
            "alt_cni, default/istio-cni"
        );
        assert_eq!(
            append_multus_network(r#"[{"name": "alt"}]"#, "default/istio-cni"),
            r#"[{"name": "alt"}, {"name": "istio-cni", "namespace": "default"}]"#
        );
        let already = r#"[{"name": "istio-cni", "namespace": "default"}]"#;
        assert_eq!(append_multus_network(already, "default/istio-cni"), already);
    }
}
