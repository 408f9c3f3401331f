//! The proxyless-gRPC templates. The application speaks xDS itself (gRPC's `xds:///`
//! resolver), so nothing is captured and no proxy sits in its path; what injection gives it
//! is a gRPC xDS bootstrap naming istiod, and for `grpc-agent` the mesh certificate.
//!
//! - `grpc-simple`: an init container, `remora grpc-bootstrap`, writes the bootstrap into a
//!   volume the application containers mount (`GRPC_XDS_BOOTSTRAP` names the file). No proxy.
//! - `grpc-agent`: Remora's agent beside the application (`remora run`, a regular container
//!   whose listeners stay idle as nothing is captured): readiness, merged metrics. The
//!   bootstrap is handed over inline (`GRPC_XDS_BOOTSTRAP_CONFIG`, with the pod's address
//!   filled in by kubelet), naming the workload certificate, which the application mounts
//!   read-only, as gRPC's `file_watcher` certificate provider, for mTLS with the mesh.
//!
//! Application probes are never rewritten (the pods say so with
//! `sidecar.istio.io/rewriteAppHTTPProbers: "false"`): no proxy terminates their traffic.

use crate::config::InjectorConfig;
use crate::error::InjectError;
use crate::injector::{to_value, Context, Finish, OverrideRecord};
use crate::metadata::{self, MetricsMerge};
use crate::names::{key, PROXY_CONTAINER};
use crate::overlay;
use crate::pod::{self, container_name};
use crate::sidecar::{self, ProxyInputs, WORKLOAD_CERTS_DIR};
use crate::sidecar_template::app_containers;
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, Lifecycle, SecurityContext, Volume, VolumeMount,
};
use serde_json::json;
use serde_yaml_ng::{Mapping, Value};
use std::path::PathBuf;

/// The init container of `grpc-simple` (Istio's name, which tooling may look for).
pub const BOOTSTRAP_CONTAINER: &str = "grpc-bootstrap-init";
/// The volume holding the bootstrap file, and where it is mounted.
const BOOTSTRAP_VOLUME: &str = "grpc-io-proxyless-bootstrap";
const BOOTSTRAP_DIR: &str = "/var/lib/grpc/data";
const BOOTSTRAP_FILE: &str = "/var/lib/grpc/data/bootstrap.json";
/// The pod's identity as the application's own variables, for kubelet to expand in the
/// inline bootstrap; prefixed so as not to replace variables the application defines.
const POD_IP_VAR: &str = "REMORA_POD_IP";
const POD_NAME_VAR: &str = "REMORA_POD_NAME";
const POD_NAMESPACE_VAR: &str = "REMORA_POD_NAMESPACE";

/// `grpc-agent`: the agent container and the inline bootstrap.
pub(crate) fn inject_agent(cx: &Context<'_>, spec: &mut Mapping) -> Result<Finish, InjectError> {
    let (config, settings, annotations) = (cx.config, &cx.settings, &cx.annotations);
    let (user_volumes, user_mounts) = sidecar::user_volumes(annotations)?;
    let mut mains = pod::containers(spec, "containers")?;
    let apps = app_containers(&mains);
    let metrics = cx.metrics_merge()?;
    let inputs = ProxyInputs {
        workload: cx.workload,
        labels: &cx.labels,
        annotations,
        app_containers: &apps,
        pod_ports: crate::sidecar_template::pod_ports(&mains),
        app_probers: None,
        app_metrics: metrics.app_metrics.clone(),
        network: cx.network(),
    };
    // The agent answers readiness itself, on its own port: there is no proxy port to ask.
    let readiness = settings.status_port.map(|p| {
        sidecar::ready_probe(
            p,
            settings.readiness_initial_delay,
            settings.readiness_period,
            settings.readiness_failure_threshold,
        )
    });
    let agent = Container {
        name: PROXY_CONTAINER.into(),
        image: Some(settings.image.clone()),
        image_pull_policy: config.image_pull_policy.clone(),
        args: Some(sidecar::proxy_args(settings, annotations)),
        ports: Some(sidecar::metrics_ports()),
        env: Some(sidecar::proxy_env(settings, config, &inputs)),
        // The container counts as started once the agent is ready.
        lifecycle: Some(Lifecycle {
            post_start: Some(sidecar::remora_hook("wait")),
            ..Lifecycle::default()
        }),
        readiness_probe: readiness,
        resources: Some(sidecar::resources(config, annotations).unwrap_or_default()),
        // The image's own user (1337) applies: the agent needs no id the capture rules know,
        // as there are none.
        volume_mounts: Some(sidecar::proxy_mounts(config, user_mounts)),
        ..Container::default()
    };
    let mut agent = to_value(&agent)?;

    let bootstrap = bootstrap(
        &config.grpc.xds_address,
        &node_id(
            &format!("$({POD_IP_VAR})"),
            &format!("$({POD_NAME_VAR})"),
            &format!("$({POD_NAMESPACE_VAR})"),
            &config.grpc.cluster_domain,
        ),
        true,
    );
    let env = vec![
        sidecar::field_env(POD_IP_VAR, "status.podIP"),
        sidecar::field_env(POD_NAME_VAR, "metadata.name"),
        sidecar::field_env(POD_NAMESPACE_VAR, "metadata.namespace"),
        sidecar::value_env("GRPC_XDS_BOOTSTRAP_CONFIG", &bootstrap.to_string()),
    ];
    let certs = VolumeMount {
        read_only: Some(true),
        ..sidecar::mount("workload-certs", WORKLOAD_CERTS_DIR)
    };
    let mut overrides = change_apps(&mut mains, &env, &certs)?;
    let user_at = mains
        .iter()
        .position(|c| container_name(c) == Some(PROXY_CONTAINER));
    match user_at {
        Some(i) => {
            let user = overlay::as_override(&mains[i]);
            overlay::merge_container(&mut agent, &user);
            overrides.containers.push(user);
            mains[i] = agent;
        }
        None => mains.push(agent),
    }
    pod::put_containers(spec, "containers", mains);

    let service_account = pod::str_at(spec, "serviceAccountName").unwrap_or_default();
    let mut annotations_set = vec![(key::REVISION.to_string(), config.revision.clone())];
    annotations_set.extend(
        metadata::default_container(annotations, &apps)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v)),
    );
    annotations_set.push((key::REWRITE_APP_PROBERS.into(), "false".into()));
    Ok(Finish {
        status_init_containers: None,
        status_containers: Some(vec![PROXY_CONTAINER.to_string()]),
        volumes: sidecar::volumes(config, service_account, user_volumes),
        labels: metadata::canonical_labels(&cx.labels, &cx.workload.name),
        annotations: annotations_set,
        overrides,
        metrics,
    })
}

/// `grpc-simple`: the bootstrap init container, and nothing that runs beside the application.
pub(crate) fn inject_simple(cx: &Context<'_>, spec: &mut Mapping) -> Result<Finish, InjectError> {
    let config = cx.config;
    let mut inits = pod::containers(spec, "initContainers")?;
    let mut mains = pod::containers(spec, "containers")?;
    let mount = VolumeMount {
        read_only: Some(true),
        ..sidecar::mount(BOOTSTRAP_VOLUME, BOOTSTRAP_DIR)
    };
    let env = [sidecar::value_env("GRPC_XDS_BOOTSTRAP", BOOTSTRAP_FILE)];
    let overrides = change_apps(&mut mains, &env, &mount)?;
    let init = to_value(&bootstrap_container(cx))?;
    inits.retain(|c| container_name(c) != Some(BOOTSTRAP_CONTAINER));
    inits.insert(0, init);
    pod::put_containers(spec, "initContainers", inits);
    pod::put_containers(spec, "containers", mains);
    Ok(Finish {
        status_init_containers: Some(vec![BOOTSTRAP_CONTAINER.to_string()]),
        status_containers: None,
        volumes: vec![Volume {
            name: BOOTSTRAP_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        }],
        labels: Vec::new(),
        annotations: vec![(key::REWRITE_APP_PROBERS.into(), "false".into())],
        overrides,
        metrics: simple_metrics(cx, config)?,
    })
}

/// Istio points a grpc-simple pod's `prometheus.io/*` at the agent port as for every
/// template, and Remora decides the same; but with no agent to merge them, an application's
/// own scrape settings are kept rather than moved away.
fn simple_metrics(cx: &Context<'_>, config: &InjectorConfig) -> Result<MetricsMerge, InjectError> {
    let metrics = metadata::metrics_merge(&cx.annotations, config, cx.settings.agent_port())?;
    Ok(match metrics.app_metrics {
        Some(_) => MetricsMerge::default(),
        None => metrics,
    })
}

fn bootstrap_container(cx: &Context<'_>) -> Container {
    let (config, settings) = (cx.config, &cx.settings);
    Container {
        name: BOOTSTRAP_CONTAINER.into(),
        image: Some(settings.image.clone()),
        image_pull_policy: config.image_pull_policy.clone(),
        args: Some(vec![
            "grpc-bootstrap".into(),
            "--output".into(),
            BOOTSTRAP_FILE.into(),
            "--xds-address".into(),
            config.grpc.xds_address.clone(),
            "--cluster-domain".into(),
            config.grpc.cluster_domain.clone(),
        ]),
        env: Some(vec![
            sidecar::field_env("INSTANCE_IP", "status.podIP"),
            sidecar::field_env("POD_NAME", "metadata.name"),
            sidecar::field_env("POD_NAMESPACE", "metadata.namespace"),
        ]),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(sidecar::capabilities(&[])),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(settings.uid),
            run_as_group: Some(settings.gid),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![sidecar::mount(BOOTSTRAP_VOLUME, BOOTSTRAP_DIR)]),
        ..Container::default()
    }
}

/// Gives every application container these variables and this mount (replacing its own of
/// the same name or path, so that injecting again changes nothing); returns the containers
/// as they were, as overrides, which `proxy.istio.io/overrides` records as Istio does.
fn change_apps(
    mains: &mut [Value],
    env: &[EnvVar],
    mount: &VolumeMount,
) -> Result<OverrideRecord, InjectError> {
    let mut record = OverrideRecord::default();
    let env: Vec<Value> = env.iter().map(to_value).collect::<Result<_, _>>()?;
    let mount_value = to_value(mount)?;
    for (i, c) in mains.iter_mut().enumerate() {
        if container_name(c) == Some(PROXY_CONTAINER) {
            continue;
        }
        record.containers.push(overlay::as_override(c));
        let Value::Mapping(container) = c else {
            continue;
        };
        let vars = pod::child_sequence(container, "env")
            .map_err(|_| InjectError::pod(format!("containers[{i}].env"), "expected a list"))?;
        for var in &env {
            crate::injector::put_named(vars, var.clone());
        }
        let mounts = pod::child_sequence(container, "volumeMounts").map_err(|_| {
            InjectError::pod(format!("containers[{i}].volumeMounts"), "expected a list")
        })?;
        mounts.retain(|m| {
            m.get("mountPath").and_then(Value::as_str) != Some(mount.mount_path.as_str())
        });
        mounts.push(mount_value.clone());
    }
    Ok(record)
}

/// Istio's node id for a workload: `sidecar~<ip>~<pod>.<namespace>~<namespace>.svc.<domain>`.
pub fn node_id(ip: &str, pod: &str, namespace: &str, cluster_domain: &str) -> String {
    format!("sidecar~{ip}~{pod}.{namespace}~{namespace}.svc.{cluster_domain}")
}

/// A gRPC xDS bootstrap: istiod's plaintext xDS port, the node, and (with `certificates`)
/// the workload certificate as gRPC's `file_watcher` provider.
pub fn bootstrap(xds_address: &str, node_id: &str, certificates: bool) -> serde_json::Value {
    let mut b = json!({
        "xds_servers": [{
            "server_uri": format!("dns:///{xds_address}"),
            "channel_creds": [{"type": "insecure"}],
            "server_features": ["xds_v3"],
        }],
        "node": {"id": node_id, "metadata": {"GENERATOR": "grpc"}},
    });
    if certificates {
        let file = |name: &str| format!("{WORKLOAD_CERTS_DIR}/{name}");
        b["certificate_providers"] = json!({"default": {
            "plugin_name": "file_watcher",
            "config": {
                "certificate_file": file("cert-chain.pem"),
                "private_key_file": file("key.pem"),
                "ca_certificate_file": file("root-cert.pem"),
                "refresh_interval": "900s",
            },
        }});
    }
    b
}

/// Flags of `remora grpc-bootstrap`, the grpc-simple init container.
#[derive(Debug, Clone, clap::Args)]
pub struct BootstrapArgs {
    /// Where to write the bootstrap (replaced whole, never seen half-written).
    #[arg(long, value_name = "FILE")]
    pub output: PathBuf,
    /// istiod's plaintext xDS address.
    #[arg(
        long,
        value_name = "HOST:PORT",
        default_value = "istiod.istio-system.svc:15010"
    )]
    pub xds_address: String,
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// The pod's address, name and namespace (the downward API's, in the injected container).
    #[arg(long, env = "INSTANCE_IP")]
    pub pod_ip: String,
    #[arg(long, env = "POD_NAME")]
    pub pod_name: String,
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: String,
}

/// Why the bootstrap could not be written.
#[derive(Debug, thiserror::Error)]
#[error("writing {}", path.display())]
pub struct BootstrapError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

/// `remora grpc-bootstrap`: writes the bootstrap file.
pub fn write_bootstrap(args: &BootstrapArgs) -> Result<(), BootstrapError> {
    let id = node_id(
        &args.pod_ip,
        &args.pod_name,
        &args.pod_namespace,
        &args.cluster_domain,
    );
    let text = format!("{:#}\n", bootstrap(&args.xds_address, &id, false));
    let err = |source| BootstrapError {
        path: args.output.clone(),
        source,
    };
    let partial = args.output.with_extension("partial");
    std::fs::write(&partial, text).map_err(err)?;
    std::fs::rename(&partial, &args.output).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_names_istiod_the_node_and_the_certificate() {
        let id = node_id("10.1.2.3", "web-0", "shop", "cluster.local");
        assert_eq!(id, "sidecar~10.1.2.3~web-0.shop~shop.svc.cluster.local");
        let b = bootstrap("istiod.istio-system.svc:15010", &id, true);
        assert_eq!(
            b["xds_servers"][0]["server_uri"],
            "dns:///istiod.istio-system.svc:15010"
        );
        assert_eq!(b["node"]["id"], id.as_str());
        assert_eq!(
            b["certificate_providers"]["default"]["config"]["certificate_file"],
            "/var/run/secrets/workload-spiffe-credentials/cert-chain.pem"
        );
        assert!(bootstrap("x:1", &id, false)["certificate_providers"].is_null());
    }

    #[test]
    fn write_bootstrap_replaces_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let output = dir.path().join("bootstrap.json");
        std::fs::write(&output, "old").expect("write");
        let args = BootstrapArgs {
            output: output.clone(),
            xds_address: "istiod.istio-system.svc:15010".into(),
            cluster_domain: "cluster.local".into(),
            pod_ip: "10.0.0.9".into(),
            pod_name: "grpc-1".into(),
            pod_namespace: "default".into(),
        };
        write_bootstrap(&args).expect("written");
        let text = std::fs::read_to_string(&output).expect("read");
        let b: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(
            b["node"]["id"],
            "sidecar~10.0.0.9~grpc-1.default~default.svc.cluster.local"
        );
        assert!(!output.with_extension("partial").exists());
    }
}
