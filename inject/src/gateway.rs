//! The gateway template: the pod is a proxy in its own right (an ingress or egress gateway),
//! not an application with a sidecar. Its own `istio-proxy` container (usually `image: auto`)
//! becomes `remora run` in place; nothing is captured, so there is no init container and the
//! proxy is a regular container whatever the native-sidecar setting. The pod may bind ports
//! below 1024 as the proxy's unprivileged user, through the
//! `net.ipv4.ip_unprivileged_port_start` sysctl rather than a capability. A gateway's traffic
//! is addressed to it, so its listeners come from its own `remora run` config (mounted by the
//! user over the injected container), not from capture.

use crate::error::InjectError;
use crate::injector::{to_value, Context, Finish, OverrideRecord};
use crate::metadata;
use crate::names::{key, port, PROXY_CONTAINER};
use crate::overlay;
use crate::pod::{self, container_name};
use crate::sidecar::{self, ProxyInputs};
use crate::sidecar_template::app_containers;
use k8s_openapi::api::core::v1::{Container, ResourceRequirements, SecurityContext};
use serde_yaml_ng::{Mapping, Value};

/// The sysctl that lets an unprivileged process bind any port (a gateway serves 80 and 443).
const UNPRIVILEGED_PORT_START: &str = "net.ipv4.ip_unprivileged_port_start";

/// Builds the gateway's proxy and puts it where the pod's own `istio-proxy` was.
pub(crate) fn inject(cx: &Context<'_>, spec: &mut Mapping) -> Result<Finish, InjectError> {
    let (config, settings, annotations) = (cx.config, &cx.settings, &cx.annotations);
    let (user_volumes, user_mounts) = sidecar::user_volumes(annotations)?;
    let mut inits = pod::containers(spec, "initContainers")?;
    let mut mains = pod::containers(spec, "containers")?;
    let app_containers = app_containers(&mains);
    let app_probers = cx.rewrite_app_probes(&mut inits, &mut mains)?;
    let metrics = cx.metrics_merge()?;
    let inputs = ProxyInputs {
        workload: cx.workload,
        labels: &cx.labels,
        annotations,
        app_containers: &app_containers,
        pod_ports: crate::sidecar_template::pod_ports(&mains),
        app_probers,
        app_metrics: metrics.app_metrics.clone(),
        network: cx.network(),
    };
    let readiness = settings.status_port.map(|_| {
        sidecar::ready_probe(
            port::READINESS,
            settings.readiness_initial_delay,
            settings.readiness_period,
            settings.readiness_failure_threshold,
        )
    });
    let proxy = Container {
        name: PROXY_CONTAINER.into(),
        image: Some(settings.image.clone()),
        image_pull_policy: config.image_pull_policy.clone(),
        args: Some(sidecar::proxy_args(settings, annotations)),
        ports: Some(sidecar::metrics_ports()),
        env: Some(sidecar::proxy_env(settings, config, &inputs)),
        readiness_probe: readiness,
        // A gateway Deployment sizes its own proxy; the sidecar defaults would be too small
        // for one and too large for another.
        resources: Some(ResourceRequirements::default()),
        security_context: Some(SecurityContext {
            run_as_user: Some(settings.uid),
            run_as_group: Some(settings.gid),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(sidecar::proxy_mounts(config, user_mounts)),
        ..Container::default()
    };
    let mut proxy = to_value(&proxy)?;
    let mut overrides = OverrideRecord::default();
    let user_at = mains
        .iter()
        .position(|c| container_name(c) == Some(PROXY_CONTAINER));
    match user_at {
        Some(i) => {
            let user = overlay::as_override(&mains[i]);
            overlay::merge_container(&mut proxy, &user);
            overrides.containers.push(user);
            mains[i] = proxy;
        }
        None => mains.push(proxy),
    }
    pod::put_containers(spec, "initContainers", inits);
    pod::put_containers(spec, "containers", mains);
    allow_unprivileged_ports(spec)?;

    let service_account = pod::str_at(spec, "serviceAccountName").unwrap_or_default();
    let mut annotations_set = vec![(key::REVISION.to_string(), config.revision.clone())];
    // kubectl's default container is only obvious when the gateway runs one other container.
    if app_containers.len() == 1 {
        annotations_set.extend(
            metadata::default_container(annotations, &app_containers)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v)),
        );
    }
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

/// Adds the unprivileged-port sysctl to the pod's security context, unless the pod sets it.
fn allow_unprivileged_ports(spec: &mut Mapping) -> Result<(), InjectError> {
    let context = pod::child_mapping(spec, "securityContext")?;
    let sysctls = pod::child_sequence(context, "sysctls")?;
    if !sysctls
        .iter()
        .any(|s| container_name(s) == Some(UNPRIVILEGED_PORT_START))
    {
        let mut sysctl = Mapping::new();
        sysctl.insert("name".into(), UNPRIVILEGED_PORT_START.into());
        sysctl.insert("value".into(), "0".into());
        sysctls.push(Value::Mapping(sysctl));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::documents::inject_yaml;
    use crate::injector::Injector;
    use serde_yaml_ng::Value;

    /// The pod's own sysctls stay, the gateway's is added once, and the user's proxy keeps
    /// its place and its fields.
    #[test]
    fn gateway_keeps_the_pods_sysctls_and_its_proxy_in_place() {
        let pod = r#"apiVersion: v1
kind: Pod
metadata:
  name: gw
  annotations: {inject.istio.io/templates: gateway}
spec:
  securityContext:
    sysctls: [{name: net.core.somaxconn, value: "1024"}]
  containers:
  - {name: istio-proxy, image: auto, args: [run, --config, /etc/remora/gateway.yaml]}
  - {name: logger, image: logger}
"#;
        let (out, _) = inject_yaml(pod, &Injector::default(), None).expect("injects");
        let pod: Value = serde_yaml_ng::from_str(&out).expect("yaml");
        let sysctls = pod["spec"]["securityContext"]["sysctls"]
            .as_sequence()
            .expect("sysctls");
        let names: Vec<&str> = sysctls.iter().filter_map(|s| s["name"].as_str()).collect();
        assert_eq!(
            names,
            ["net.core.somaxconn", "net.ipv4.ip_unprivileged_port_start"]
        );
        let proxy = &pod["spec"]["containers"][0];
        assert_eq!(proxy["name"], "istio-proxy");
        assert!(proxy["image"].as_str().is_some_and(|i| i != "auto"));
        assert_eq!(proxy["args"][2], "/etc/remora/gateway.yaml");
        assert!(pod["spec"]["initContainers"].is_null());
        assert_eq!(
            pod["metadata"]["labels"]["security.istio.io/tlsMode"],
            Value::Null
        );
        assert_eq!(
            pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"],
            "logger"
        );
        // Injecting again changes nothing.
        let (again, _) = inject_yaml(&out, &Injector::default(), None).expect("injects");
        assert_eq!(again, out);
    }
}
