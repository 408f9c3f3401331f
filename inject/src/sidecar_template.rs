//! The sidecar template, Istio's default: the capture init container (`remora capture`) and
//! the proxy (`remora run`), with the user's own containers of those names merged over them,
//! placed as a native sidecar or a regular container, and the pod's metadata for the mesh.

use crate::capture;
use crate::config::Platform;
use crate::error::InjectError;
use crate::injector::{names, to_value, Context, Finish, OverrideRecord};
use crate::metadata;
use crate::names::{key, INIT_CONTAINER, PROXY_CONTAINER, VALIDATION_CONTAINER};
use crate::overlay;
use crate::pod::{self, container_name};
use crate::settings::PodSettings;
use crate::sidecar::{self, ProxyInputs};
use serde_yaml_ng::{Mapping, Value};

/// Builds, merges and places the sidecar's containers in `spec`.
pub(crate) fn inject_sidecar(cx: &Context<'_>, spec: &mut Mapping) -> Result<Finish, InjectError> {
    let (config, settings, annotations) = (cx.config, &cx.settings, &cx.annotations);
    let (user_volumes, user_mounts) = sidecar::user_volumes(annotations)?;
    let mut inits = pod::containers(spec, "initContainers")?;
    let mut mains = pod::containers(spec, "containers")?;
    let capture_name = if settings.cni {
        VALIDATION_CONTAINER
    } else {
        INIT_CONTAINER
    };
    let find = |name: &str, mains: &[Value], inits: &[Value]| {
        mains
            .iter()
            .chain(inits)
            .find(|c| container_name(c) == Some(name))
            .cloned()
    };
    let mut user_proxy = find(PROXY_CONTAINER, &mains, &inits);
    let user_capture = find(capture_name, &mains, &inits);
    if config.platform == Platform::Openshift {
        if let Some(proxy) = user_proxy.as_mut() {
            forget_platform_assigned_user(proxy, &mains, &inits);
        }
    }
    let app_containers = app_containers(&mains);

    // Application probes: collected before they are rewritten.
    let app_probers = cx.rewrite_app_probes(&mut inits, &mut mains)?;
    let metrics = cx.metrics_merge()?;
    let network = cx.network();
    let resources = sidecar::resources(config, annotations);
    let inputs = ProxyInputs {
        workload: cx.workload,
        labels: &cx.labels,
        annotations,
        app_containers: &app_containers,
        pod_ports: pod_ports(&mains),
        app_probers,
        app_metrics: metrics.app_metrics.clone(),
        network,
    };
    let proxy = sidecar::proxy_container(settings, config, &inputs, resources.clone(), user_mounts);
    let mut proxy = to_value(&proxy)?;
    let mut capture = capture::wanted(settings)
        .then(|| {
            let args = capture::args(settings, config, annotations);
            to_value(&sidecar::capture_container(
                settings, config, args, resources,
            ))
        })
        .transpose()?;

    // The user's own containers of these names are overrides, merged over ours.
    let mut overrides = OverrideRecord::default();
    if let (Some(ours), Some(user)) = (capture.as_mut(), &user_capture) {
        let user = overlay::as_override(user);
        overlay::merge_container(ours, &user);
        overrides.init_containers.push(user);
    }
    if let Some(user) = &user_proxy {
        let user = overlay::as_override(user);
        overlay::merge_container(&mut proxy, &user);
        overrides.push_proxy(user, settings.native);
    }
    adjust_capture_user(settings, user_proxy.as_ref(), &mut proxy, capture.as_mut());

    // Placement.
    let ours = |c: &Value| matches!(container_name(c), Some(n) if n == PROXY_CONTAINER || n == capture_name);
    inits.retain(|c| !ours(c));
    mains.retain(|c| !ours(c));
    let mut status_init_containers = None;
    let mut status_containers = None;
    if settings.native {
        let mut front: Vec<Value> = capture.into_iter().collect();
        front.push(proxy);
        status_init_containers = Some(names(&front));
        inits.splice(0..0, front);
    } else {
        if settings.hold {
            mains.insert(0, proxy);
        } else {
            mains.push(proxy);
        }
        status_containers = Some(vec![PROXY_CONTAINER.to_string()]);
        if let Some(capture) = capture {
            status_init_containers = Some(names(std::slice::from_ref(&capture)));
            // Validation blocks everything until the CNI's rules are proven; the rules
            // themselves go last so that other init containers are not captured.
            if settings.cni {
                inits.insert(0, capture);
            } else {
                inits.push(capture);
            }
        }
    }
    pod::put_containers(spec, "initContainers", inits);
    pod::put_containers(spec, "containers", mains);

    let service_account = pod::str_at(spec, "serviceAccountName").unwrap_or_default();
    let mut annotations_set = vec![(key::REVISION.to_string(), config.revision.clone())];
    annotations_set.extend(
        metadata::default_container(annotations, &app_containers)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v)),
    );
    if settings.cni {
        annotations_set.extend(capture::cni_annotations(settings, config, annotations));
    }
    Ok(Finish {
        status_init_containers,
        status_containers,
        volumes: sidecar::volumes(config, service_account, user_volumes),
        labels: metadata::labels(&cx.labels, &cx.workload.name, network),
        annotations: annotations_set,
        overrides,
        metrics,
    })
}

/// The pod's own containers, in order, without the proxy.
pub(crate) fn app_containers(mains: &[Value]) -> Vec<String> {
    mains
        .iter()
        .filter_map(container_name)
        .filter(|n| *n != PROXY_CONTAINER)
        .map(str::to_string)
        .collect()
}

/// The application containers' declared ports, in order, as the JSON array Istio's template
/// writes into `ISTIO_META_POD_PORTS` (istiod names inbound ports from it); `None` without any.
pub(crate) fn pod_ports(mains: &[Value]) -> Option<String> {
    let ports: Vec<&Value> = mains
        .iter()
        .filter(|c| container_name(c) != Some(PROXY_CONTAINER))
        .filter_map(|c| c.get("ports").and_then(Value::as_sequence))
        .flatten()
        .collect();
    // A YAML value always has a JSON form here: the pod arrived as JSON or as Kubernetes YAML.
    (!ports.is_empty())
        .then(|| serde_json::to_string(&ports).ok())
        .flatten()
}

/// OpenShift gives every container of a pod the same `runAsUser`; kept on the proxy, it would
/// make the application's traffic look like the proxy's and escape capture. A user proxy uid
/// equal to the application's is therefore dropped, and the namespace's range applies.
fn forget_platform_assigned_user(proxy: &mut Value, mains: &[Value], inits: &[Value]) {
    let uid = |c: &Value| {
        c.get("securityContext")
            .and_then(|s| s.get("runAsUser"))
            .and_then(Value::as_i64)
            .unwrap_or(0)
    };
    let app_uid = mains
        .iter()
        .chain(inits)
        .filter(|c| {
            !matches!(
                container_name(c),
                Some(PROXY_CONTAINER | INIT_CONTAINER | VALIDATION_CONTAINER)
            )
        })
        .map(uid)
        .next_back()
        .unwrap_or(0);
    if uid(proxy) == app_uid {
        if let Some(Value::Mapping(sc)) = proxy.get_mut("securityContext") {
            sc.shift_remove("runAsUser");
            sc.shift_remove("runAsGroup");
        }
    }
}

/// A user proxy that sets its own ids moves the capture rules' `-u` (and the validation
/// container's ids) with it; TPROXY keeps the proxy root whatever the user asked.
fn adjust_capture_user(
    settings: &PodSettings,
    user_proxy: Option<&Value>,
    proxy: &mut Value,
    capture: Option<&mut Value>,
) {
    let user_sc = user_proxy.and_then(|p| p.get("securityContext"));
    let user_uid = user_sc
        .and_then(|s| s.get("runAsUser"))
        .and_then(Value::as_i64);
    let user_gid = user_sc
        .and_then(|s| s.get("runAsGroup"))
        .and_then(Value::as_i64);
    if user_uid.is_none() && user_gid.is_none() {
        return;
    }
    if settings.tproxy() && user_uid.is_some() {
        if let Some(Value::Mapping(sc)) = proxy.get_mut("securityContext") {
            sc.insert("runAsUser".into(), 0.into());
        }
    }
    let Some(capture) = capture else { return };
    if !settings.tproxy() && settings.cni {
        if let Some(Value::Mapping(sc)) = capture.get_mut("securityContext") {
            if let Some(uid) = user_uid {
                sc.insert("runAsUser".into(), uid.into());
            }
            if let Some(gid) = user_gid {
                sc.insert("runAsGroup".into(), gid.into());
            }
        }
    }
    // iptables' --uid-owner cannot be root.
    let Some(uid) = user_uid.filter(|u| *u != 0) else {
        return;
    };
    if let Some(Value::Sequence(args)) = capture.get_mut("args") {
        if let Some(i) = args.iter().position(|a| a.as_str() == Some("-u")) {
            if let Some(slot) = args.get_mut(i + 1) {
                *slot = Value::from(uid.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::documents::inject_yaml;
    use crate::injector::Injector;
    use serde_yaml_ng::Value;

    fn inject(pod: &str, injector: &Injector) -> Value {
        let (out, _) = inject_yaml(pod, injector, None).expect("injects");
        serde_yaml_ng::from_str(&out).expect("yaml")
    }

    fn proxy(pod: &Value) -> &Value {
        let inits = pod["spec"]["initContainers"].as_sequence().expect("inits");
        inits
            .iter()
            .find(|c| c["name"] == "istio-proxy")
            .expect("proxy")
    }

    const POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: web
  annotations:
    status.sidecar.istio.io/port: "15099"
spec:
  containers:
  - name: app
    image: app
    readinessProbe:
      httpGet: {port: 8080, path: /ready}
"#;

    /// The probes and the Prometheus annotations point at the pod's status port, so the
    /// agent must be told to listen there.
    #[test]
    fn a_moved_status_port_reaches_the_proxy() {
        let pod = inject(POD, &Injector::default());
        let args = proxy(&pod)["args"].as_sequence().expect("args");
        let args: Vec<&str> = args.iter().filter_map(Value::as_str).collect();
        assert_eq!(args, ["run", "--status-port", "15099"]);
        let probe = &pod["spec"]["containers"][0]["readinessProbe"]["httpGet"];
        assert_eq!(probe["port"], 15099);
        assert_eq!(probe["path"], "/app-health/app/readyz");
        let annotations = &pod["metadata"]["annotations"];
        assert_eq!(annotations["prometheus.io/port"], "15099");

        // The config's status port does the same; 15020, `remora run`'s default, adds nothing.
        let mut injector = Injector::default();
        injector.config.proxy.status_port = 15111;
        let plain = POD.replace("status.sidecar.istio.io/port: \"15099\"", "x: y");
        let pod = inject(&plain, &injector);
        assert_eq!(proxy(&pod)["args"][2], "15111");
        let pod = inject(&plain, &Injector::default());
        assert_eq!(proxy(&pod)["args"].as_sequence().map(Vec::len), Some(1));
    }
}
