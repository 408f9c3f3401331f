//! Injection of one pod template, start to finish: decide, validate, undo a previous
//! injection, build the containers, merge the user's overrides, place the containers, rewrite
//! the probes and write the metadata. It either changes the template whole or not at all.

use crate::capture;
use crate::config::InjectorConfig;
use crate::decision::{self, Decision, FrontEnd, PodFacts};
use crate::error::InjectError;
use crate::metadata;
use crate::names::{key, INIT_CONTAINER, PROXY_CONTAINER, VALIDATION_CONTAINER};
use crate::overlay;
use crate::pod::{self, container_name, PodTemplate, Workload};
use crate::probes;
use crate::settings::PodSettings;
use crate::sidecar::{self, ProxyInputs};
use k8s_openapi::api::core::v1::Namespace;
use serde_json::json;
use serde_yaml_ng::{Mapping, Value};
use std::collections::BTreeMap;

/// The injector: a config, applied to pod templates.
#[derive(Debug, Clone, Default)]
pub struct Injector {
    pub config: InjectorConfig,
}

/// What happened to a pod template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Injected,
    Skipped(&'static str),
}

/// The context of one pod template.
pub struct Request<'a> {
    pub workload: &'a Workload,
    pub front_end: FrontEnd,
    /// The pod's Namespace object, when known (OpenShift takes the proxy's ids from it).
    pub namespace: Option<&'a Namespace>,
}

/// The containers a previous injection added, from its status annotation.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Status {
    init_containers: Option<Vec<String>>,
    containers: Option<Vec<String>>,
}

impl Injector {
    pub fn new(config: InjectorConfig) -> Injector {
        Injector { config }
    }

    /// Injects one pod template in place. On error the template is unchanged.
    pub fn inject(
        &self,
        template: PodTemplate<'_>,
        request: &Request<'_>,
    ) -> Result<Outcome, InjectError> {
        let mut metadata = template.metadata.clone();
        let mut spec = template.spec.clone();
        let outcome = self.inject_copy(&mut metadata, &mut spec, request)?;
        if outcome == Outcome::Injected {
            *template.metadata = metadata;
            *template.spec = spec;
        }
        Ok(outcome)
    }

    fn inject_copy(
        &self,
        meta: &mut Mapping,
        spec: &mut Mapping,
        request: &Request<'_>,
    ) -> Result<Outcome, InjectError> {
        let config = &self.config;
        let labels = pod::string_map(meta, "labels");
        let annotations = pod::string_map(meta, "annotations");
        let namespace = pod::str_at(meta, "namespace")
            .filter(|n| !n.is_empty())
            .unwrap_or(&request.workload.namespace);
        let facts = PodFacts {
            labels: &labels,
            annotations: &annotations,
            namespace,
            host_network: spec.get("hostNetwork").and_then(Value::as_bool) == Some(true),
        };
        if let Decision::Skip(why) = decision::decide(&facts, config, request.front_end) {
            return Ok(Outcome::Skipped(why));
        }
        crate::validate::annotations(&annotations)?;
        if let Some(templates) = annotations.get(key::TEMPLATES) {
            if let Some(other) = templates
                .split(',')
                .map(str::trim)
                .find(|t| *t != "sidecar")
            {
                return Err(InjectError::UnsupportedTemplate {
                    template: other.into(),
                });
            }
        }

        let already_injected = annotations.contains_key(key::STATUS);
        let previous = self.strip_previous_injection(meta, spec, &annotations)?;
        let annotations = pod::string_map(meta, "annotations");
        let settings = PodSettings::resolve(config, &annotations, request.namespace)?;
        let (user_volumes, user_mounts) = sidecar::user_volumes(&annotations)?;

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
        if config.platform == crate::config::Platform::Openshift {
            if let Some(proxy) = user_proxy.as_mut() {
                forget_platform_assigned_user(proxy, &mains, &inits);
            }
        }
        let app_containers: Vec<String> = mains
            .iter()
            .filter_map(container_name)
            .filter(|n| *n != PROXY_CONTAINER)
            .map(str::to_string)
            .collect();

        // Application probes: collected before they are rewritten.
        let mut app_probers = serde_json::Map::new();
        if settings.rewrite_probes {
            if let Some(agent_port) = settings.status_port {
                let all: Vec<&Value> = inits.iter().chain(&mains).collect();
                app_probers = probes::app_probers(&all, agent_port)?;
                // An earlier injection's probers still describe the probes it rewrote.
                app_probers.extend(previous.probers);
                for c in inits.iter_mut().chain(mains.iter_mut()) {
                    probes::rewrite(c, agent_port);
                }
            }
        }
        let mut metrics = metadata::metrics_merge(&annotations, config, settings.agent_port())?;
        if !metrics.set.is_empty() && metrics.app_metrics.is_none() {
            // The application's own settings were consumed by the earlier injection.
            metrics.app_metrics = previous.app_metrics;
        }

        let network = labels
            .get(key::NETWORK)
            .map(String::as_str)
            .or(config.network.as_deref());
        let resources = sidecar::resources(config, &annotations);
        let inputs = ProxyInputs {
            workload: request.workload,
            labels: &labels,
            annotations: &annotations,
            app_containers: &app_containers,
            app_probers: (!app_probers.is_empty())
                .then(|| serde_json::Value::Object(app_probers).to_string()),
            app_metrics: metrics.app_metrics.clone(),
            network,
        };
        let proxy =
            sidecar::proxy_container(&settings, config, &inputs, resources.clone(), user_mounts);
        let mut proxy = to_value(&proxy)?;
        let mut capture = capture::wanted(&settings)
            .then(|| {
                let args = capture::args(&settings, config, &annotations);
                to_value(&sidecar::capture_container(
                    &settings, config, args, resources,
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
        adjust_capture_user(&settings, user_proxy.as_ref(), &mut proxy, capture.as_mut());

        // Placement.
        let ours = |c: &Value| matches!(container_name(c), Some(n) if n == PROXY_CONTAINER || n == capture_name);
        inits.retain(|c| !ours(c));
        mains.retain(|c| !ours(c));
        let mut status = json!({"initContainers": null, "containers": null});
        if settings.native {
            let mut front: Vec<Value> = capture.into_iter().collect();
            front.push(proxy);
            status["initContainers"] = names(&front);
            inits.splice(0..0, front);
        } else {
            if settings.hold {
                mains.insert(0, proxy);
            } else {
                mains.push(proxy);
            }
            status["containers"] = json!([PROXY_CONTAINER]);
            if let Some(capture) = capture {
                status["initContainers"] = names(std::slice::from_ref(&capture));
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

        let service_account = pod::str_at(spec, "serviceAccountName")
            .unwrap_or_default()
            .to_string();
        let volumes = sidecar::volumes(config, &service_account, user_volumes);
        status["volumes"] = json!(volumes.iter().map(|v| v.name.clone()).collect::<Vec<_>>());
        let list = pod::child_sequence(spec, "volumes")?;
        for volume in &volumes {
            put_named(list, to_value(volume)?);
        }
        status["imagePullSecrets"] = json!(null);
        if !config.image_pull_secrets.is_empty() {
            status["imagePullSecrets"] = json!(config.image_pull_secrets);
            let list = pod::child_sequence(spec, "imagePullSecrets")?;
            for secret in &config.image_pull_secrets {
                if !list.iter().any(|s| container_name(s) == Some(secret)) {
                    let mut m = Mapping::new();
                    m.insert("name".into(), secret.as_str().into());
                    list.push(Value::Mapping(m));
                }
            }
        }
        status["revision"] = json!(config.revision);

        // Metadata.
        for (k, v) in metadata::labels(&labels, &request.workload.name, network) {
            pod::set_entry(meta, "labels", k, &v)?;
        }
        let mut set = |k: &str, v: &str| pod::set_entry(meta, "annotations", k, v);
        set(key::REVISION, &config.revision)?;
        for (k, v) in metadata::default_container(&annotations, &app_containers) {
            set(k, &v)?;
        }
        if settings.cni {
            for (k, v) in capture::cni_annotations(&settings, config, &annotations) {
                set(&k, &v)?;
            }
        }
        for (k, v) in &config.injected_annotations {
            set(k, v)?;
        }
        if !already_injected && !overrides.is_empty() {
            set(key::PROXY_OVERRIDES, &overrides.to_json())?;
        }
        for k in &metrics.remove {
            pod::remove_entry(meta, "annotations", k);
        }
        for (k, v) in &metrics.set {
            pod::set_entry(meta, "annotations", k, v)?;
        }
        pod::remove_entry(meta, "annotations", key::STATUS);
        pod::set_entry(meta, "annotations", key::STATUS, &status.to_string())?;
        Ok(Outcome::Injected)
    }

    /// Undoes what a previous injection added, so that injecting again gives the same pod:
    /// removes the containers its status annotation lists and the Prometheus annotations it
    /// pointed at the agent, and re-inserts the user's recorded overrides. Returns what the
    /// previous proxy was handed about the application, which its annotations no longer say.
    fn strip_previous_injection(
        &self,
        meta: &mut Mapping,
        spec: &mut Mapping,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Previous, InjectError> {
        let mut previous = Previous::default();
        let Some(status) = annotations.get(key::STATUS) else {
            return Ok(previous);
        };
        // An unreadable status (another injector's) removes nothing, as in Istio.
        let status: Status = serde_json::from_str(status).unwrap_or_default();
        for (field, names) in [
            ("initContainers", status.init_containers),
            ("containers", status.containers),
        ] {
            let names = names.unwrap_or_default();
            let mut list = pod::containers(spec, field)?;
            for c in list
                .iter()
                .filter(|c| container_name(c) == Some(PROXY_CONTAINER))
            {
                if let Some(probers) = env_value(c, "ISTIO_KUBE_APP_PROBERS")
                    .and_then(|v| serde_json::from_str::<serde_json::Map<_, _>>(v).ok())
                {
                    previous.probers.extend(probers);
                }
                if let Some(metrics) = env_value(c, "ISTIO_PROMETHEUS_ANNOTATIONS") {
                    previous.app_metrics = Some(metrics.to_string());
                }
            }
            list.retain(|c| !container_name(c).is_some_and(|n| names.iter().any(|s| s == n)));
            if let Some(Value::Mapping(o)) = annotations
                .get(key::PROXY_OVERRIDES)
                .and_then(|o| serde_json::from_str::<Value>(o).ok())
            {
                if let Some(Value::Sequence(recorded)) = o.get(field) {
                    for c in recorded {
                        if !list.iter().any(|l| container_name(l) == container_name(c)) {
                            list.push(c.clone());
                        }
                    }
                }
            }
            pod::put_containers(spec, field, list);
        }
        let agent_port =
            crate::validate::port(annotations.get(key::STATUS_PORT).map_or("", String::as_str))
                .ok()
                .filter(|p| *p != 0)
                .unwrap_or(self.config.proxy.status_port);
        if metadata::points_at_agent(annotations, agent_port) {
            for k in metadata::prometheus_keys(annotations) {
                pod::remove_entry(meta, "annotations", &k);
            }
        }
        pod::remove_entry(meta, "annotations", key::STATUS);
        Ok(previous)
    }
}

/// What an earlier injection handed its proxy about the application.
#[derive(Default)]
struct Previous {
    probers: serde_json::Map<String, serde_json::Value>,
    app_metrics: Option<String>,
}

fn env_value<'c>(container: &'c Value, name: &str) -> Option<&'c str> {
    let env = container.get("env").and_then(Value::as_sequence)?;
    env.iter()
        .find(|e| container_name(e) == Some(name))
        .and_then(|e| e.get("value"))
        .and_then(Value::as_str)
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

/// The user containers merged over ours, recorded in `proxy.istio.io/overrides` so that a
/// later re-injection can apply them again.
#[derive(Default)]
struct OverrideRecord {
    containers: Vec<Value>,
    init_containers: Vec<Value>,
}

impl OverrideRecord {
    fn push_proxy(&mut self, proxy: Value, native: bool) {
        if native {
            self.init_containers.push(proxy);
        } else {
            self.containers.push(proxy);
        }
    }

    fn is_empty(&self) -> bool {
        self.containers.is_empty() && self.init_containers.is_empty()
    }

    fn to_json(&self) -> String {
        let mut record = serde_json::Map::new();
        for (field, list) in [
            ("containers", &self.containers),
            ("initContainers", &self.init_containers),
        ] {
            if !list.is_empty() {
                let list = list
                    .iter()
                    .filter_map(|c| serde_json::to_value(c).ok())
                    .collect();
                record.insert(field.into(), serde_json::Value::Array(list));
            }
        }
        serde_json::Value::Object(record).to_string()
    }
}

fn names(containers: &[Value]) -> serde_json::Value {
    json!(containers
        .iter()
        .filter_map(container_name)
        .collect::<Vec<_>>())
}

/// Replaces the item of the same name, or appends.
fn put_named(list: &mut Vec<Value>, item: Value) {
    match list
        .iter_mut()
        .find(|v| container_name(v).is_some() && container_name(v) == container_name(&item))
    {
        Some(slot) => *slot = item,
        None => list.push(item),
    }
}

/// A typed object as a YAML value, `name` first so that manifests stay readable.
fn to_value<T: serde::Serialize>(object: &T) -> Result<Value, InjectError> {
    let value = serde_yaml_ng::to_value(object).map_err(InjectError::Emit)?;
    let Value::Mapping(m) = value else {
        return Ok(value);
    };
    let mut ordered = Mapping::new();
    if let Some(name) = m.get("name") {
        ordered.insert("name".into(), name.clone());
    }
    for (k, v) in m {
        if k.as_str() != Some("name") {
            ordered.insert(k, v);
        }
    }
    Ok(Value::Mapping(ordered))
}
