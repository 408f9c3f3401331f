//! The containers and volumes injection adds, built as typed Kubernetes objects: the capture
//! init container (`remora capture`), the proxy (`remora run`) and the volumes it mounts.

use crate::config::InjectorConfig;
use crate::error::InjectError;
use crate::names::{key, port, INIT_CONTAINER, PROXY_CONTAINER, VALIDATION_CONTAINER};
use crate::pod::Workload;
use crate::settings::PodSettings;
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, DownwardAPIVolumeFile,
    DownwardAPIVolumeSource, EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction, HTTPGetAction,
    Lifecycle, LifecycleHandler, ObjectFieldSelector, Probe, ProjectedVolumeSource,
    ResourceRequirements, SecretVolumeSource, SecurityContext, ServiceAccountTokenProjection,
    Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// Where the pod's labels and annotations appear in the proxy (`remora run
/// --pod-labels-file` defaults to `<this>/labels`).
pub const POD_INFO_DIR: &str = "/etc/istio/pod";
/// Where the workload certificate lives (Istio's file layout, which `remora run`'s
/// `tls.cert_dir` reads).
pub const WORKLOAD_CERTS_DIR: &str = "/var/run/secrets/workload-spiffe-credentials";
/// The binary inside the image; hooks and init containers exec it directly, needing no shell.
pub(crate) const REMORA: &str = "remora";

/// The capture init container: `remora capture` with istio-iptables' arguments. Without CNI it
/// installs the rules and so runs as root with NET_ADMIN and NET_RAW, nothing more; with CNI it
/// only validates the plugin's rules, as the proxy's user and with no capability.
pub fn capture_container(
    settings: &PodSettings,
    config: &InjectorConfig,
    args: Vec<String>,
    resources: Option<ResourceRequirements>,
) -> Container {
    let privileged = config.proxy.privileged;
    let security_context = if settings.cni {
        let (uid, gid) = if settings.tproxy() {
            (config.proxy.uid, settings.tproxy_gid)
        } else {
            (settings.uid, settings.gid)
        };
        SecurityContext {
            allow_privilege_escalation: Some(privileged),
            privileged: Some(privileged),
            capabilities: Some(capabilities(&[])),
            read_only_root_filesystem: Some(true),
            run_as_group: Some(gid),
            run_as_user: Some(uid),
            run_as_non_root: Some(true),
            ..SecurityContext::default()
        }
    } else {
        SecurityContext {
            allow_privilege_escalation: Some(privileged),
            privileged: Some(privileged),
            capabilities: Some(capabilities(&["NET_ADMIN", "NET_RAW"])),
            read_only_root_filesystem: Some(false),
            run_as_group: Some(0),
            run_as_user: Some(0),
            run_as_non_root: Some(false),
            ..SecurityContext::default()
        }
    };
    let name = if settings.cni {
        VALIDATION_CONTAINER
    } else {
        INIT_CONTAINER
    };
    Container {
        name: name.into(),
        image: Some(settings.image.clone()),
        image_pull_policy: config.image_pull_policy.clone(),
        args: Some(std::iter::once("capture".to_string()).chain(args).collect()),
        resources: Some(resources.unwrap_or_default()),
        security_context: Some(security_context),
        ..Container::default()
    }
}

pub(crate) fn capabilities(add: &[&str]) -> Capabilities {
    Capabilities {
        add: (!add.is_empty()).then(|| add.iter().map(|c| c.to_string()).collect()),
        drop: Some(vec!["ALL".into()]),
    }
}

/// What the proxy container needs to know about the pod beyond its settings.
pub struct ProxyInputs<'a> {
    pub workload: &'a Workload,
    pub labels: &'a BTreeMap<String, String>,
    pub annotations: &'a BTreeMap<String, String>,
    /// The application containers, in order (for `ISTIO_META_APP_CONTAINERS`).
    pub app_containers: &'a [String],
    /// Their declared ports as a JSON array (`ISTIO_META_POD_PORTS`), when there are any.
    pub pod_ports: Option<String>,
    /// `ISTIO_KUBE_APP_PROBERS`: the application probes the agent now runs.
    pub app_probers: Option<String>,
    /// `ISTIO_PROMETHEUS_ANNOTATIONS`: where the application's own metrics are.
    pub app_metrics: Option<String>,
    pub network: Option<&'a str>,
}

/// The proxy: `remora run` as the proxy's uid and gid, non-root, read-only root filesystem,
/// every capability dropped (TPROXY needs root and NET_ADMIN, as in Istio).
pub fn proxy_container(
    settings: &PodSettings,
    config: &InjectorConfig,
    inputs: &ProxyInputs<'_>,
    resources: Option<ResourceRequirements>,
    user_mounts: Vec<VolumeMount>,
) -> Container {
    let privileged = config.proxy.privileged;
    let root = settings.tproxy() || settings.cap_net_bind_service;
    let mut add = Vec::new();
    if settings.tproxy() {
        add.push("NET_ADMIN");
    }
    if settings.cap_net_bind_service {
        add.push("NET_BIND_SERVICE");
    }
    let security_context = SecurityContext {
        allow_privilege_escalation: Some(privileged),
        privileged: Some(privileged),
        capabilities: Some(capabilities(&add)),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(!root),
        run_as_user: Some(if root { 0 } else { settings.uid }),
        run_as_group: Some(if root {
            settings.tproxy_gid
        } else {
            settings.gid
        }),
        ..SecurityContext::default()
    };
    let args = proxy_args(settings, inputs.annotations);
    // Holding the application: kubelet starts the next container only when this hook returns,
    // which `remora wait` does once the proxy is ready. A native sidecar instead drains when
    // the pod begins to stop, while the application still runs.
    let lifecycle = if settings.hold {
        Some(Lifecycle {
            post_start: Some(remora_hook("wait")),
            ..Lifecycle::default()
        })
    } else if settings.native {
        Some(Lifecycle {
            pre_stop: Some(remora_hook("drain")),
            ..Lifecycle::default()
        })
    } else {
        None
    };
    let (startup_probe, readiness_probe) = match settings.status_port {
        None => (None, None),
        Some(_) => {
            let startup = config.proxy.startup_probe.enabled.then(|| {
                ready_probe(
                    port::READINESS,
                    0,
                    1,
                    config.proxy.startup_probe.failure_threshold,
                )
            });
            let readiness = ready_probe(
                port::READINESS,
                settings.readiness_initial_delay,
                settings.readiness_period,
                settings.readiness_failure_threshold,
            );
            (startup, Some(readiness))
        }
    };
    let mounts = proxy_mounts(config, user_mounts);
    Container {
        name: PROXY_CONTAINER.into(),
        image: Some(settings.image.clone()),
        image_pull_policy: config.image_pull_policy.clone(),
        restart_policy: settings.native.then(|| "Always".to_string()),
        args: Some(args),
        ports: Some(metrics_ports()),
        env: Some(proxy_env(settings, config, inputs)),
        lifecycle,
        startup_probe,
        readiness_probe,
        resources: Some(resources.unwrap_or_default()),
        security_context: Some(security_context),
        volume_mounts: Some(mounts),
        ..Container::default()
    }
}

/// `remora run` and its flags: the pod's proxy log level, and the agent port when the pod
/// moved it off 15020 (the rewritten probes and the Prometheus annotations point there, so the
/// agent must listen there).
pub(crate) fn proxy_args(
    settings: &PodSettings,
    annotations: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut args = vec!["run".to_string()];
    if let Some(level) = annotations
        .get(key::PROXY_LOG_LEVEL)
        .and_then(|l| log_filter(l))
    {
        args.extend(["--log-level".to_string(), level.to_string()]);
    }
    let agent_port = settings.agent_port();
    if agent_port != port::AGENT {
        args.extend(["--status-port".to_string(), agent_port.to_string()]);
    }
    args
}

/// The proxy's mounts: pod info, the token and CA for its certificate, the certificate
/// itself, and the user's.
pub(crate) fn proxy_mounts(
    config: &InjectorConfig,
    user_mounts: Vec<VolumeMount>,
) -> Vec<VolumeMount> {
    let mut mounts = vec![
        mount("istio-podinfo", POD_INFO_DIR),
        mount("istio-token", "/var/run/secrets/tokens"),
        mount("istiod-ca-cert", "/var/run/secrets/istio"),
        mount("workload-certs", WORKLOAD_CERTS_DIR),
    ];
    if config.proxy.mount_mtls_certs {
        mounts.push(VolumeMount {
            read_only: Some(true),
            ..mount("istio-certs", "/etc/certs/")
        });
    }
    mounts.extend(user_mounts);
    mounts
}

/// The proxy's Prometheus port, named as Istio names it (scrape configs select on the name).
pub(crate) fn metrics_ports() -> Vec<ContainerPort> {
    vec![ContainerPort {
        container_port: i32::from(port::METRICS),
        name: Some("http-envoy-prom".into()),
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }]
}

/// Istio's proxy log levels in `remora run --log-level` terms.
fn log_filter(level: &str) -> Option<&'static str> {
    Some(match level {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warning" | "warn" => "warn",
        "error" | "critical" => "error",
        "off" => "off",
        _ => return None,
    })
}

/// `GET /healthz/ready` on `port`: the proxy's readiness (15021), or the agent's.
pub(crate) fn ready_probe(
    port: u16,
    initial_delay: u32,
    period: u32,
    failure_threshold: u32,
) -> Probe {
    let seconds = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/healthz/ready".into()),
            port: IntOrString::Int(i32::from(port)),
            ..HTTPGetAction::default()
        }),
        // Kubernetes treats an absent delay as 0; leaving it out keeps the pod spec minimal.
        initial_delay_seconds: (initial_delay != 0).then(|| seconds(initial_delay)),
        period_seconds: Some(seconds(period)),
        timeout_seconds: Some(3),
        failure_threshold: Some(seconds(failure_threshold)),
        ..Probe::default()
    }
}

/// A lifecycle hook running `remora <verb>`.
pub(crate) fn remora_hook(verb: &str) -> LifecycleHandler {
    LifecycleHandler {
        exec: Some(ExecAction {
            command: Some(vec![REMORA.into(), verb.into()]),
        }),
        ..LifecycleHandler::default()
    }
}

pub(crate) fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..VolumeMount::default()
    }
}

pub(crate) fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

pub(crate) fn value_env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

/// The proxy's environment: the downward-API identity `remora run` reads, Istio's metadata
/// variables, and the probe and metrics hand-over from the application.
pub(crate) fn proxy_env(
    settings: &PodSettings,
    config: &InjectorConfig,
    inputs: &ProxyInputs<'_>,
) -> Vec<EnvVar> {
    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("INSTANCE_IP", "status.podIP"),
        field_env("SERVICE_ACCOUNT", "spec.serviceAccountName"),
        field_env("HOST_IP", "status.hostIP"),
        field_env("ISTIO_META_NODE_NAME", "spec.nodeName"),
        value_env("ISTIO_META_CLUSTER_ID", &config.cluster_id),
        // What makes `remora run` get its identity from istiod, as pilot-agent reads it.
        value_env("PROXY_CONFIG", &settings.proxy_config_json),
        value_env("TRUST_DOMAIN", &config.trust_domain),
        value_env(
            "ISTIO_META_MESH_ID",
            config.mesh_id.as_deref().unwrap_or(&config.trust_domain),
        ),
        value_env("ISTIO_META_INTERCEPTION_MODE", settings.mode.as_str()),
        value_env(
            "ISTIO_META_APP_CONTAINERS",
            &inputs.app_containers.join(","),
        ),
    ];
    if let Some(network) = inputs.network {
        env.push(value_env("ISTIO_META_NETWORK", network));
    }
    if let Some(ports) = &inputs.pod_ports {
        env.push(value_env("ISTIO_META_POD_PORTS", ports));
    }
    let workload = inputs
        .labels
        .get(key::WORKLOAD_NAME)
        .map_or(inputs.workload.name.as_str(), String::as_str);
    if !workload.is_empty() {
        env.push(value_env("ISTIO_META_WORKLOAD_NAME", workload));
    }
    let w = inputs.workload;
    if !w.api_version.is_empty() && !w.name.is_empty() {
        let namespace = if w.namespace.is_empty() {
            "default"
        } else {
            &w.namespace
        };
        let owner = format!(
            "kubernetes://apis/{}/namespaces/{namespace}/{}s/{}",
            w.api_version,
            w.kind.to_lowercase(),
            w.name
        );
        env.push(value_env("ISTIO_META_OWNER", &owner));
    }
    for (k, v) in &config.proxy.env {
        env.push(value_env(k, v));
    }
    if let Some(probers) = &inputs.app_probers {
        env.push(value_env("ISTIO_KUBE_APP_PROBERS", probers));
    }
    if let Some(metrics) = &inputs.app_metrics {
        env.push(value_env("ISTIO_PROMETHEUS_ANNOTATIONS", metrics));
    }
    env
}

/// Resources of both injected containers: the four `sidecar.istio.io/proxy*` annotations if
/// any is set (and then only they), else the config's.
pub fn resources(
    config: &InjectorConfig,
    annotations: &BTreeMap<String, String>,
) -> Option<ResourceRequirements> {
    let pick = |pairs: &[(&str, &str)]| -> Option<BTreeMap<String, Quantity>> {
        let map: BTreeMap<String, Quantity> = pairs
            .iter()
            .filter_map(|(resource, k)| {
                Some((resource.to_string(), Quantity(annotations.get(*k)?.clone())))
            })
            .collect();
        (!map.is_empty()).then_some(map)
    };
    let from_annotations = ResourceRequirements {
        requests: pick(&[("cpu", key::PROXY_CPU), ("memory", key::PROXY_MEMORY)]),
        limits: pick(&[
            ("cpu", key::PROXY_CPU_LIMIT),
            ("memory", key::PROXY_MEMORY_LIMIT),
        ]),
        ..ResourceRequirements::default()
    };
    if from_annotations.requests.is_some() || from_annotations.limits.is_some() {
        return Some(from_annotations);
    }
    let present = |m: &BTreeMap<String, Option<String>>| {
        let map: BTreeMap<String, Quantity> = m
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), Quantity(v.clone()?))))
            .collect();
        (!map.is_empty()).then_some(map)
    };
    let r = &config.proxy.resources;
    let requirements = ResourceRequirements {
        requests: present(&r.requests),
        limits: present(&r.limits),
        ..ResourceRequirements::default()
    };
    (requirements.requests.is_some() || requirements.limits.is_some()).then_some(requirements)
}

/// The pod volumes the proxy mounts, plus those of `sidecar.istio.io/userVolume`.
pub fn volumes(
    config: &InjectorConfig,
    service_account: &str,
    user_volumes: Vec<Volume>,
) -> Vec<Volume> {
    let named = |name: &str| Volume {
        name: name.into(),
        ..Volume::default()
    };
    let field = |path: &str, field_path: &str| DownwardAPIVolumeFile {
        path: path.into(),
        field_ref: Some(ObjectFieldSelector {
            field_path: field_path.into(),
            ..ObjectFieldSelector::default()
        }),
        ..DownwardAPIVolumeFile::default()
    };
    let mut volumes = vec![
        Volume {
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![
                    field("labels", "metadata.labels"),
                    field("annotations", "metadata.annotations"),
                ]),
                ..DownwardAPIVolumeSource::default()
            }),
            ..named("istio-podinfo")
        },
        // The projected service-account token with which the proxy asks istiod for its
        // certificate, and the mesh's root certificate to check istiod with.
        Volume {
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        audience: Some("istio-ca".into()),
                        expiration_seconds: Some(43200),
                        path: "istio-token".into(),
                    }),
                    ..VolumeProjection::default()
                }]),
                ..ProjectedVolumeSource::default()
            }),
            ..named("istio-token")
        },
        Volume {
            config_map: Some(ConfigMapVolumeSource {
                name: "istio-ca-root-cert".into(),
                ..ConfigMapVolumeSource::default()
            }),
            ..named("istiod-ca-cert")
        },
        // The workload certificate and key live in memory only.
        Volume {
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                ..EmptyDirVolumeSource::default()
            }),
            ..named("workload-certs")
        },
    ];
    if config.proxy.mount_mtls_certs {
        let account = if service_account.is_empty() {
            "default"
        } else {
            service_account
        };
        volumes.push(Volume {
            secret: Some(SecretVolumeSource {
                secret_name: Some(format!("istio.{account}")),
                optional: Some(true),
                ..SecretVolumeSource::default()
            }),
            ..named("istio-certs")
        });
    }
    volumes.extend(user_volumes);
    volumes
}

/// The volumes and proxy mounts of `sidecar.istio.io/userVolume` and `userVolumeMount`: JSON
/// maps from a volume's name to its source, and to its mount.
pub fn user_volumes(
    annotations: &BTreeMap<String, String>,
) -> Result<(Vec<Volume>, Vec<VolumeMount>), InjectError> {
    let volumes = named_objects::<Volume>(annotations, key::USER_VOLUME)?;
    let mounts = named_objects::<VolumeMount>(annotations, key::USER_VOLUME_MOUNT)?;
    Ok((volumes, mounts))
}

fn named_objects<T: serde::de::DeserializeOwned>(
    annotations: &BTreeMap<String, String>,
    k: &str,
) -> Result<Vec<T>, InjectError> {
    let Some(text) = annotations.get(k) else {
        return Ok(Vec::new());
    };
    let invalid = |reason: String| InjectError::InvalidAnnotation {
        annotation: k.into(),
        value: text.clone(),
        reason,
    };
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
    map.into_iter()
        .map(|(name, mut spec)| {
            let object = spec
                .as_object_mut()
                .ok_or_else(|| invalid(format!("{name}: expected an object")))?;
            object.insert("name".into(), serde_json::Value::String(name.clone()));
            serde_json::from_value(spec).map_err(|e| invalid(format!("{name}: {e}")))
        })
        .collect()
}
