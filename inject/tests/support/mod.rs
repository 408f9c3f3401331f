//! Shared by the conformance and webhook tests: finding Istio's injection goldens
//! (shared/conformance/inject), turning a case's Istio settings into Remora's injector config,
//! and reading back from an injected pod the facts the goldens record.

#![allow(dead_code)] // each test file uses its own part

use k8s_openapi::api::core::v1::Namespace;
use remora_inject::config::{CniProvider, InterceptionMode, Platform};
use remora_inject::documents::{is_blank, split_documents};
use remora_inject::InjectorConfig;
use serde_json::{json, Value as Json};
use std::path::PathBuf;

pub mod facts;

/// One conformance case.
pub struct Case {
    pub name: String,
    pub expect: Json,
    pub input: String,
}

/// The conformance folder, or `None` (with the reason printed) when it is absent outside CI.
pub fn conformance_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("REMORA_INJECT_CONFORMANCE_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/conformance/inject"),
    };
    if dir.join("README.md").is_file() {
        return Some(dir);
    }
    let reason = format!("no conformance cases at {}", dir.display());
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{reason} (set REMORA_INJECT_CONFORMANCE_DIR)");
    }
    println!("skipped: {reason}");
    None
}

pub fn load_cases(dir: &std::path::Path) -> Vec<Case> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read conformance dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".expect.json"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|path| {
            let expect: Json =
                serde_json::from_str(&std::fs::read_to_string(&path).expect("read case"))
                    .expect("case json");
            let input_file = expect["input"].as_str().expect("input name");
            let input = std::fs::read_to_string(dir.join(input_file)).expect("read input");
            Case {
                name: expect["case"].as_str().expect("case name").to_string(),
                expect,
                input,
            }
        })
        .collect()
}

/// Istio settings Remora has no equivalent for, and why; each may only appear in cases whose
/// settings change nothing the goldens record (checked by the caller).
pub const NOT_EXPRESSIBLE: &[(&str, &str)] = &[
    (
        "values.global.proxy_init.image",
        "Remora runs one image for both containers",
    ),
    (
        "values.global.podDNSSearchNamespaces",
        "unused by Istio's own template",
    ),
    (
        "mesh.defaultConfig.drainDuration",
        "remora run's drain.duration, not an injector setting",
    ),
    ("mesh.defaultConfig.tracing", "Remora has no tracing yet"),
    (
        "mesh.extensionProviders",
        "Remora has no telemetry providers yet",
    ),
    (
        "mesh.inboundTrafficPolicy.mode",
        "Remora always delivers inbound from 127.0.0.6",
    ),
    (
        "compliance_policy",
        "Istio's Go crypto policy; Remora's TLS is rustls",
    ),
];

/// The injector config (and Namespace object) equivalent to a case's Istio settings, and the
/// settings it could not express.
pub fn config_for(settings: &Json) -> (InjectorConfig, Option<Namespace>, Vec<String>) {
    let mut c = InjectorConfig::default();
    let mut unexpressed = Vec::new();
    let mut namespace = None;
    let s = settings.as_object().expect("settings object");
    for (k, v) in s {
        match k.as_str() {
            "native_sidecar" => c.native_sidecars = v.as_bool().expect("bool"),
            "cni" => c.cni.enabled = v.as_bool().expect("bool"),
            "platform" => {
                assert_eq!(v, "openshift");
                c.platform = Platform::Openshift;
            }
            "namespace" => {
                namespace = Some(serde_json::from_value(json!({"metadata": v})).expect("namespace"))
            }
            "values" | "mesh" => {
                for (path, value) in v.as_object().expect("map") {
                    if !apply_setting(&mut c, k, path, value) {
                        unexpressed.push(format!("{k}.{path}"));
                    }
                }
            }
            other => unexpressed.push(other.to_string()),
        }
    }
    (c, namespace, unexpressed)
}

fn apply_setting(c: &mut InjectorConfig, section: &str, path: &str, v: &Json) -> bool {
    let text = || v.as_str().expect("string setting").to_string();
    let number = || u32::try_from(v.as_u64().expect("number setting")).expect("u32");
    match (section, path) {
        ("values", "cni.provider") => {
            assert_eq!(v, "multus");
            c.cni.provider = CniProvider::Multus;
        }
        ("values", "global.network") => c.network = Some(text()),
        ("values", "global.imagePullPolicy") => c.image_pull_policy = Some(text()),
        ("values", "global.imagePullSecrets") => {
            c.image_pull_secrets = serde_json::from_value(v.clone()).expect("list")
        }
        ("values", "global.mountMtlsCerts") => {
            c.proxy.mount_mtls_certs = v.as_bool().expect("bool")
        }
        ("values", "global.proxy.holdApplicationUntilProxyStarts") => {
            c.proxy.hold_application_until_proxy_starts = v.as_bool().expect("bool")
        }
        ("values", "global.proxy.image") => c.image = text(),
        ("values", "global.proxy.statusPort") => {
            c.proxy.status_port = u16::try_from(number()).expect("port")
        }
        ("values", "global.proxy.readinessInitialDelaySeconds") => {
            c.proxy.readiness.initial_delay_seconds = number()
        }
        ("values", "global.proxy.readinessPeriodSeconds") => {
            c.proxy.readiness.period_seconds = number()
        }
        ("values", "global.proxy.readinessFailureThreshold") => {
            c.proxy.readiness.failure_threshold = number()
        }
        ("values", "global.proxy.resources") => {
            c.proxy.resources = serde_json::from_value(v.clone()).expect("resources")
        }
        ("values", "global.proxy.includeIPRanges") => c.capture.include_ip_ranges = text(),
        ("values", "global.proxy.excludeIPRanges") => c.capture.exclude_ip_ranges = text(),
        ("values", "global.proxy.excludeInboundPorts") => c.capture.exclude_inbound_ports = text(),
        ("mesh", "defaultConfig.interceptionMode") => {
            c.capture.interception_mode = InterceptionMode::parse(&text()).expect("mode")
        }
        ("mesh", p) if p.starts_with("defaultConfig.proxyMetadata.") => {
            let name = p.trim_start_matches("defaultConfig.proxyMetadata.");
            c.proxy.env.insert(name.to_string(), text());
        }
        _ => return false,
    }
    true
}

/// A pod template found in an injected stream: kind, name, metadata and spec (as JSON).
pub struct FoundTemplate {
    pub kind: String,
    pub name: String,
    pub metadata: Json,
    pub spec: Json,
}

/// The pod templates of a YAML stream, in document order, `List` items expanded.
pub fn templates_of(yaml: &str) -> Vec<FoundTemplate> {
    let mut out = Vec::new();
    for doc in split_documents(yaml).into_iter().filter(|d| !is_blank(d)) {
        let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(doc).expect("output yaml");
        let json = serde_json::to_value(&value).expect("json");
        if json["kind"] == "List" {
            for item in json["items"].as_array().into_iter().flatten() {
                out.extend(template_of(item));
            }
        } else {
            out.extend(template_of(&json));
        }
    }
    out
}

fn template_of(object: &Json) -> Option<FoundTemplate> {
    let kind = object["kind"].as_str().unwrap_or_default().to_string();
    let template = match kind.as_str() {
        "Pod" => object,
        "CronJob" => &object["spec"]["jobTemplate"]["spec"]["template"],
        "Service" | "" => return None,
        _ => &object["spec"]["template"],
    };
    let metadata = match &template["metadata"] {
        Json::Null => json!({}),
        m => m.clone(),
    };
    Some(FoundTemplate {
        name: object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        kind,
        metadata,
        spec: template["spec"].clone(),
    })
}

/// An IPv4 pod without nameservers, for resolving capture flags without a machine.
struct Ipv4Pod;

impl remora_capture::PodNetwork for Ipv4Pod {
    fn is_ipv6(&self, _: bool) -> Result<bool, remora_capture::CaptureError> {
        Ok(false)
    }
    fn nameservers(&self) -> Result<Vec<String>, remora_capture::CaptureError> {
        Ok(vec![])
    }
}

#[derive(clap::Parser)]
struct CaptureCli {
    #[command(flatten)]
    args: remora_capture::CaptureArgs,
}

/// The iptables rules `remora capture --dry-run <args>` prints for these istio-iptables
/// arguments, computed in-process with capture's own generator (nothing is installed).
pub fn capture_rules(args: &[Json]) -> Result<String, String> {
    use clap::Parser;
    let args: Vec<&str> = args
        .iter()
        .map(|a| a.as_str().unwrap_or_default())
        .collect();
    let argv = ["capture", "--dry-run"].into_iter().chain(args);
    let cli = CaptureCli::try_parse_from(argv).map_err(|e| e.to_string())?;
    let env = remora_capture::Environment::default();
    let config = remora_capture::CaptureConfig::resolve(&cli.args, &env, &Ipv4Pod)
        .map_err(|e| e.to_string())?;
    Ok(remora_capture::generate(&config).dry_run_output())
}
