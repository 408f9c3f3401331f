//! The injector's configuration: Remora's own schema (documented in docs/inject.md), with
//! built-in defaults that equal Istio's chart defaults, parsed from YAML by a pure function.
//!
//! Istio's injection ConfigMap (Go templates plus Helm values) is deliberately not accepted:
//! what Remora injects is code, and the knobs that shape it are the fields below.

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The image both injected containers run unless the config or `sidecar.istio.io/proxyImage`
/// names another.
pub const DEFAULT_IMAGE: &str = concat!("ghcr.io/remora-proxy/remora:", env!("CARGO_PKG_VERSION"));

/// Everything that shapes injection apart from the pod itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InjectorConfig {
    /// `enabled`: inject unless the pod opts out. `disabled`: only pods that opt in. Only the
    /// webhook applies it; `remora inject` injects whatever it is given, as istioctl does.
    pub policy: Policy,
    /// The revision this injector serves; written to `istio.io/rev`.
    pub revision: String,
    /// Put the proxy in `initContainers` with `restartPolicy: Always` (Kubernetes ≥ 1.29).
    /// The pod annotation `sidecar.istio.io/nativeSidecar` overrides it.
    pub native_sidecars: bool,
    /// Rewrite application HTTP, TCP and gRPC probes to the agent port (Istio's
    /// `rewriteAppHTTPProbe`); `sidecar.istio.io/rewriteAppHTTPProbers` overrides it.
    pub rewrite_app_probes: bool,
    /// Point `prometheus.io/*` at the agent's merged metrics (MeshConfig
    /// `enablePrometheusMerge`); `prometheus.istio.io/merge-metrics` overrides it.
    pub prometheus_merge: bool,
    /// Image of the proxy and of the capture init container (one image for both).
    pub image: String,
    /// `imagePullPolicy` of the injected containers; unset leaves Kubernetes' default.
    pub image_pull_policy: Option<String>,
    /// Pull secrets appended to the pod's `imagePullSecrets`.
    pub image_pull_secrets: Vec<String>,
    /// Pods whose labels match any of these are not injected (unless they opt in).
    pub never_inject_selector: Vec<LabelSelector>,
    /// Pods whose labels match any of these are injected even under `policy: disabled`.
    pub always_inject_selector: Vec<LabelSelector>,
    /// Namespaces never injected by the webhook.
    pub ignored_namespaces: Vec<String>,
    /// Extra annotations written on every injected pod (Istio's `injectedAnnotations`).
    pub injected_annotations: BTreeMap<String, String>,
    /// `ISTIO_META_CLUSTER_ID` of the proxies.
    pub cluster_id: String,
    /// istiod's address, the `discoveryAddress` of the `PROXY_CONFIG` the proxies get (a
    /// revision's istiod is `istiod-<rev>.istio-system.svc:15012`). `PROXY_CONFIG` is what
    /// turns `remora run` into istiod mode.
    pub discovery_address: String,
    /// The mesh's trust domain (`TRUST_DOMAIN` of the proxies).
    pub trust_domain: String,
    /// `ISTIO_META_MESH_ID` of the proxies; unset: the trust domain, as in Istio's template.
    pub mesh_id: Option<String>,
    /// The network of this cluster: labels pods `topology.istio.io/network` when set.
    pub network: Option<String>,
    /// `openshift` derives the proxy's uid and gid from the namespace's SCC annotations.
    pub platform: Platform,
    /// OpenShift: the uid range and supplemental groups the platform assigned to each
    /// namespace (its `openshift.io/sa.scc.*` annotations). The webhook reads no Namespace
    /// objects, so this is how it learns them; `remora inject --namespace-file` wins.
    pub openshift_namespaces: BTreeMap<String, OpenshiftNamespace>,
    /// Proxyless gRPC (the `grpc-agent` and `grpc-simple` templates).
    pub grpc: GrpcConfig,
    /// Capture by Istio's CNI node agent instead of an init container.
    pub cni: CniConfig,
    /// Mesh-wide defaults of the capture rules; pod annotations override them.
    pub capture: CaptureDefaults,
    /// The proxy container.
    pub proxy: ProxyDefaults,
}

/// Injection policy for pods that neither opt in nor out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    Enabled,
    Disabled,
}

/// Where the pod runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Platform {
    Kubernetes,
    Openshift,
}

/// What OpenShift assigned to one namespace, in its annotations' syntax
/// (`1000620000/10000` or `1000620000-1000629999`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenshiftNamespace {
    /// `openshift.io/sa.scc.uid-range`: the proxy runs as its last uid.
    pub uid_range: String,
    /// `openshift.io/sa.scc.supplemental-groups`: the proxy's gid is the last of the first
    /// block; without it, `proxy.gid`.
    #[serde(default)]
    pub supplemental_groups: Option<String>,
}

/// Where proxyless gRPC applications find istiod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpcConfig {
    /// istiod's plaintext xDS address, written into the applications' xDS bootstrap.
    pub xds_address: String,
    /// The cluster's DNS domain, part of the node id.
    pub cluster_domain: String,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        GrpcConfig {
            xds_address: "istiod.istio-system.svc:15010".into(),
            cluster_domain: "cluster.local".into(),
        }
    }
}

/// CNI mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CniConfig {
    /// The CNI plugin installs the rules; the injector adds only `istio-validation`.
    pub enabled: bool,
    /// `multus` also asks for the `default/istio-cni` network attachment.
    pub provider: CniProvider,
}

/// Which CNI attaches Istio's plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CniProvider {
    Default,
    Multus,
}

/// The istio-iptables defaults (Istio's `global.proxy.*` values and MeshConfig).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CaptureDefaults {
    /// `REDIRECT`, `TPROXY` or `NONE` (no capture at all).
    pub interception_mode: InterceptionMode,
    /// `-i`: outbound CIDRs to capture, `*` for all.
    pub include_ip_ranges: String,
    /// `-x`: outbound CIDRs never captured.
    pub exclude_ip_ranges: String,
    /// `-b`: inbound ports to capture, `*` for all.
    pub include_inbound_ports: String,
    /// Inbound ports never captured (the status port is added to them).
    pub exclude_inbound_ports: String,
    /// `-q`: outbound ports to capture whatever the destination.
    pub include_outbound_ports: String,
    /// `-o`: outbound ports never captured.
    pub exclude_outbound_ports: String,
    /// `--log_output_level` of the capture container.
    pub log_level: String,
    /// `--log_as_json`.
    pub log_as_json: bool,
    /// `--force-apply`: apply even if rules are present (not with CNI).
    pub force_apply: bool,
    /// `--native-nftables`: nftables instead of iptables.
    pub native_nftables: bool,
}

/// Inbound interception mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum InterceptionMode {
    Redirect,
    Tproxy,
    None,
}

impl InterceptionMode {
    /// Istio's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            InterceptionMode::Redirect => "REDIRECT",
            InterceptionMode::Tproxy => "TPROXY",
            InterceptionMode::None => "NONE",
        }
    }

    /// Parses Istio's spelling (annotations use it).
    pub fn parse(s: &str) -> Option<InterceptionMode> {
        match s {
            "REDIRECT" => Some(InterceptionMode::Redirect),
            "TPROXY" => Some(InterceptionMode::Tproxy),
            "NONE" => Some(InterceptionMode::None),
            _ => None,
        }
    }
}

/// The proxy container's defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyDefaults {
    /// The proxy's uid; the capture rules let this uid's traffic through.
    pub uid: i64,
    /// The proxy's gid.
    pub gid: i64,
    /// The agent port (probes, merged metrics); 0 means no proxy probes and no probe rewrite.
    pub status_port: u16,
    /// Run the proxy privileged (debugging only).
    pub privileged: bool,
    /// Let the proxy bind ports below 1024 (runs it as root with NET_BIND_SERVICE).
    pub cap_net_bind_service: bool,
    /// Without native sidecars: start the proxy first and hold the application until it is
    /// ready (`remora wait` in a postStart hook).
    pub hold_application_until_proxy_starts: bool,
    /// The readiness probe on 15021.
    pub readiness: ReadinessProbe,
    /// The startup probe on 15021.
    pub startup_probe: StartupProbe,
    /// Resources of the proxy and the capture container. A `null` quantity is left out.
    pub resources: Resources,
    /// Mount the `istio.<service account>` secret at /etc/certs (Istio's `mountMtlsCerts`).
    pub mount_mtls_certs: bool,
    /// Extra environment of the proxy (Istio's `proxyMetadata`).
    pub env: BTreeMap<String, String>,
}

/// Readiness probe timings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReadinessProbe {
    pub initial_delay_seconds: u32,
    pub period_seconds: u32,
    pub failure_threshold: u32,
}

/// Startup probe settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StartupProbe {
    pub enabled: bool,
    pub failure_threshold: u32,
}

/// Requests and limits; `None` values are omitted (Helm's `null` in Istio's values).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Resources {
    pub requests: BTreeMap<String, Option<String>>,
    pub limits: BTreeMap<String, Option<String>>,
}

impl Default for InjectorConfig {
    fn default() -> Self {
        InjectorConfig {
            policy: Policy::Enabled,
            revision: "default".into(),
            native_sidecars: true,
            rewrite_app_probes: true,
            prometheus_merge: true,
            image: DEFAULT_IMAGE.into(),
            image_pull_policy: None,
            image_pull_secrets: Vec::new(),
            never_inject_selector: Vec::new(),
            always_inject_selector: Vec::new(),
            // Istio's: system namespaces whose pods must not depend on the mesh.
            ignored_namespaces: [
                "kube-system",
                "kube-public",
                "kube-node-lease",
                "local-path-storage",
            ]
            .map(String::from)
            .to_vec(),
            injected_annotations: BTreeMap::new(),
            cluster_id: "Kubernetes".into(),
            discovery_address: "istiod.istio-system.svc:15012".into(),
            trust_domain: "cluster.local".into(),
            mesh_id: None,
            network: None,
            platform: Platform::Kubernetes,
            openshift_namespaces: BTreeMap::new(),
            grpc: GrpcConfig::default(),
            cni: CniConfig::default(),
            capture: CaptureDefaults::default(),
            proxy: ProxyDefaults::default(),
        }
    }
}

impl Default for CniConfig {
    fn default() -> Self {
        CniConfig {
            enabled: false,
            provider: CniProvider::Default,
        }
    }
}

impl Default for CaptureDefaults {
    fn default() -> Self {
        CaptureDefaults {
            interception_mode: InterceptionMode::Redirect,
            include_ip_ranges: "*".into(),
            exclude_ip_ranges: String::new(),
            include_inbound_ports: "*".into(),
            exclude_inbound_ports: String::new(),
            include_outbound_ports: String::new(),
            exclude_outbound_ports: String::new(),
            log_level: "default:info".into(),
            log_as_json: false,
            force_apply: false,
            native_nftables: false,
        }
    }
}

impl Default for ProxyDefaults {
    fn default() -> Self {
        ProxyDefaults {
            uid: 1337,
            gid: 1337,
            status_port: 15020,
            privileged: false,
            cap_net_bind_service: false,
            hold_application_until_proxy_starts: false,
            readiness: ReadinessProbe::default(),
            startup_probe: StartupProbe::default(),
            resources: Resources::default(),
            mount_mtls_certs: false,
            env: BTreeMap::new(),
        }
    }
}

impl Default for ReadinessProbe {
    fn default() -> Self {
        ReadinessProbe {
            initial_delay_seconds: 0,
            period_seconds: 15,
            failure_threshold: 4,
        }
    }
}

impl Default for StartupProbe {
    fn default() -> Self {
        StartupProbe {
            enabled: true,
            failure_threshold: 600,
        }
    }
}

impl Default for Resources {
    /// Istio's chart defaults, so that a pod moved from Envoy keeps its footprint budget.
    fn default() -> Self {
        let pair = |a: &str, b: &str| {
            BTreeMap::from([
                ("cpu".to_string(), Some(a.to_string())),
                ("memory".to_string(), Some(b.to_string())),
            ])
        };
        Resources {
            requests: pair("100m", "128Mi"),
            limits: pair("2", "1Gi"),
        }
    }
}

/// Why a config file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: cannot read the injector config", file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: field `{field}`: {message}", file.display())]
    Invalid {
        file: PathBuf,
        field: String,
        message: String,
    },
}

impl InjectorConfig {
    /// The Namespace object OpenShift's settings of this namespace amount to, when the
    /// platform is OpenShift and the config lists the namespace.
    pub fn namespace_object(&self, name: &str) -> Option<Namespace> {
        if self.platform != Platform::Openshift {
            return None;
        }
        let ns = self.openshift_namespaces.get(name)?;
        let mut annotations = BTreeMap::from([(
            crate::names::key::OPENSHIFT_UID_RANGE.to_string(),
            ns.uid_range.clone(),
        )]);
        if let Some(groups) = &ns.supplemental_groups {
            annotations.insert(
                crate::names::key::OPENSHIFT_SUPPLEMENTAL_GROUPS.to_string(),
                groups.clone(),
            );
        }
        Some(Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        })
    }

    /// Reads and parses a config file.
    pub fn load(path: &Path) -> Result<InjectorConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.to_path_buf(),
            source,
        })?;
        InjectorConfig::parse(&text, path)
    }

    /// Parses YAML text; `file` only names the source in errors. Empty text means defaults.
    pub fn parse(text: &str, file: &Path) -> Result<InjectorConfig, ConfigError> {
        let invalid = |field: String, message: String| ConfigError::Invalid {
            file: file.to_path_buf(),
            field,
            message,
        };
        let blank = text.lines().all(|l| {
            let l = l.trim();
            l.is_empty() || l.starts_with('#') || l == "---"
        });
        if blank {
            return Ok(InjectorConfig::default());
        }
        let de = serde_yaml_ng::Deserializer::from_str(text);
        let config: InjectorConfig = serde_path_to_error::deserialize(de)
            .map_err(|e| invalid(e.path().to_string(), e.into_inner().to_string()))?;
        config
            .validate()
            .map_err(|(field, message)| invalid(field.into(), message))?;
        Ok(config)
    }

    /// Checks what serde cannot: values an injected pod would carry into istio-iptables or
    /// Kubernetes, so that a bad config fails at start rather than on every pod.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        use crate::validate as v;
        let c = &self.capture;
        if c.include_ip_ranges != "*" {
            v::cidr_list(&c.include_ip_ranges).map_err(|e| ("capture.include_ip_ranges", e))?;
        }
        v::cidr_list(&c.exclude_ip_ranges).map_err(|e| ("capture.exclude_ip_ranges", e))?;
        if c.include_inbound_ports != "*" {
            v::port_list(&c.include_inbound_ports)
                .map_err(|e| ("capture.include_inbound_ports", e))?;
        }
        v::port_list(&c.exclude_inbound_ports).map_err(|e| ("capture.exclude_inbound_ports", e))?;
        v::port_list(&c.include_outbound_ports)
            .map_err(|e| ("capture.include_outbound_ports", e))?;
        v::port_list(&c.exclude_outbound_ports)
            .map_err(|e| ("capture.exclude_outbound_ports", e))?;
        if self.image.trim().is_empty() {
            return Err(("image", "must not be empty".into()));
        }
        let quantities = self.proxy.resources.requests.values();
        for q in quantities
            .chain(self.proxy.resources.limits.values())
            .flatten()
        {
            crate::quantity::check(q).map_err(|e| ("proxy.resources", e))?;
        }
        for (name, ns) in &self.openshift_namespaces {
            let blocks = [Some(&ns.uid_range), ns.supplemental_groups.as_ref()];
            for block in blocks.into_iter().flatten() {
                let first = block.split(',').next().unwrap_or_default();
                if crate::settings::last_of_block(first).is_none() {
                    return Err((
                        "openshift_namespaces",
                        format!("{name}: {block:?} is neither start/size nor start-end"),
                    ));
                }
            }
        }
        if self.grpc.xds_address.trim().is_empty() {
            return Err(("grpc.xds_address", "must not be empty".into()));
        }
        if self.cni.enabled && c.force_apply {
            return Err((
                "capture.force_apply",
                "has no effect with cni.enabled".into(),
            ));
        }
        Ok(())
    }
}
