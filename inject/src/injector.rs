//! Injection of one pod template, start to finish: decide, validate, undo a previous
//! injection, hand the pod to its template ([`Template`]), which builds and places the
//! containers, then write what every template writes: volumes, pull secrets, labels,
//! annotations and the status. It either changes the template whole or not at all.

use crate::config::InjectorConfig;
use crate::decision::{self, Decision, FrontEnd, PodFacts};
use crate::error::InjectError;
use crate::metadata::{self, MetricsMerge};
use crate::names::{key, PROXY_CONTAINER};
use crate::pod::{self, container_name, PodTemplate, Workload};
use crate::probes;
use crate::settings::PodSettings;
use crate::sidecar_template::inject_sidecar;
use crate::template::Template;
use k8s_openapi::api::core::v1::{Namespace, Volume};
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
            .unwrap_or(&request.workload.namespace)
            .to_string();
        let facts = PodFacts {
            labels: &labels,
            annotations: &annotations,
            namespace: &namespace,
            host_network: spec.get("hostNetwork").and_then(Value::as_bool) == Some(true),
        };
        if let Decision::Skip(why) = decision::decide(&facts, config, request.front_end) {
            return Ok(Outcome::Skipped(why));
        }
        crate::validate::annotations(&annotations)?;
        let template = Template::of_pod(&annotations)?;

        let already_injected = annotations.contains_key(key::STATUS);
        let previous = self.strip_previous_injection(meta, spec, &annotations)?;
        let annotations = pod::string_map(meta, "annotations");
        // Without the Namespace object (the webhook reads none), the config may say what
        // OpenShift assigned to the namespace.
        let configured_namespace = config.namespace_object(&namespace);
        let namespace_object = request.namespace.or(configured_namespace.as_ref());
        let settings = PodSettings::resolve(config, &annotations, namespace_object)?;
        let cx = Context {
            config,
            workload: request.workload,
            labels,
            annotations,
            settings,
            previous,
        };
        let mut finish = match template {
            Template::Sidecar => inject_sidecar(&cx, spec)?,
            Template::Gateway => crate::gateway::inject(&cx, spec)?,
            Template::GrpcAgent => crate::grpc::inject_agent(&cx, spec)?,
            Template::GrpcSimple => crate::grpc::inject_simple(&cx, spec)?,
        };
        if already_injected {
            // The first injection recorded the user's own containers; they are the same now.
            finish.overrides = OverrideRecord::default();
        }
        write_finish(&cx, meta, spec, finish)?;
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
            let list = pod::containers(spec, field)?;
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
            let recorded = match annotations
                .get(key::PROXY_OVERRIDES)
                .and_then(|o| serde_json::from_str::<Value>(o).ok())
            {
                Some(Value::Mapping(mut o)) => match o.shift_remove(field) {
                    Some(Value::Sequence(recorded)) => recorded,
                    _ => Vec::new(),
                },
                _ => Vec::new(),
            };
            // An injected container goes, and the user's own it was made from comes back in
            // its place (a gateway's proxy need not be last), or at the end.
            let mut restored: Vec<Value> = Vec::with_capacity(list.len());
            for c in list {
                let injected = container_name(&c).is_some_and(|n| names.iter().any(|s| s == n));
                if !injected {
                    restored.push(c);
                } else if let Some(user) = recorded
                    .iter()
                    .find(|r| container_name(r) == container_name(&c))
                {
                    restored.push(user.clone());
                }
            }
            for c in recorded {
                if !restored
                    .iter()
                    .any(|l| container_name(l) == container_name(&c))
                {
                    restored.push(c);
                }
            }
            let list = restored;
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
pub(crate) struct Previous {
    probers: serde_json::Map<String, serde_json::Value>,
    app_metrics: Option<String>,
}

/// What every template works from: the pod after a previous injection was undone, and its
/// resolved settings.
pub(crate) struct Context<'a> {
    pub config: &'a InjectorConfig,
    pub workload: &'a Workload,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub settings: PodSettings,
    pub previous: Previous,
}

impl Context<'_> {
    /// The network the pod is in: its own label, else the cluster's.
    pub fn network(&self) -> Option<&str> {
        self.labels
            .get(key::NETWORK)
            .map(String::as_str)
            .or(self.config.network.as_deref())
    }

    /// Rewrites the application probes of these containers to the agent, unless the pod or
    /// config turns that off or there is no agent port; returns `ISTIO_KUBE_APP_PROBERS`.
    pub fn rewrite_app_probes(
        &self,
        inits: &mut [Value],
        mains: &mut [Value],
    ) -> Result<Option<String>, InjectError> {
        let settings = &self.settings;
        let Some(agent_port) = settings.status_port.filter(|_| settings.rewrite_probes) else {
            return Ok(None);
        };
        let all: Vec<&Value> = inits.iter().chain(mains.iter()).collect();
        let mut app_probers = probes::app_probers(&all, agent_port)?;
        // An earlier injection's probers still describe the probes it rewrote.
        app_probers.extend(self.previous.probers.clone());
        for c in inits.iter_mut().chain(mains.iter_mut()) {
            probes::rewrite(c, agent_port);
        }
        Ok((!app_probers.is_empty()).then(|| serde_json::Value::Object(app_probers).to_string()))
    }

    /// Metrics merging for this pod, with the application's settings an earlier injection
    /// consumed.
    pub fn metrics_merge(&self) -> Result<MetricsMerge, InjectError> {
        let mut metrics =
            metadata::metrics_merge(&self.annotations, self.config, self.settings.agent_port())?;
        if !metrics.set.is_empty() && metrics.app_metrics.is_none() {
            metrics.app_metrics = self.previous.app_metrics.clone();
        }
        Ok(metrics)
    }
}

/// What a template leaves for the common tail to write into the pod.
pub(crate) struct Finish {
    /// The container names this injection added, per list (`None`: none in that list).
    pub status_init_containers: Option<Vec<String>>,
    pub status_containers: Option<Vec<String>>,
    /// Pod volumes to add (replacing any of the same name).
    pub volumes: Vec<Volume>,
    pub labels: Vec<(&'static str, String)>,
    /// Annotations to set, before the config's `injected_annotations`.
    pub annotations: Vec<(String, String)>,
    pub overrides: OverrideRecord,
    pub metrics: MetricsMerge,
}

/// Volumes, pull secrets, labels, annotations and the status annotation.
fn write_finish(
    cx: &Context<'_>,
    meta: &mut Mapping,
    spec: &mut Mapping,
    finish: Finish,
) -> Result<(), InjectError> {
    let config = cx.config;
    let mut status = json!({
        "initContainers": finish.status_init_containers,
        "containers": finish.status_containers,
    });
    status["volumes"] = json!(finish
        .volumes
        .iter()
        .map(|v| v.name.clone())
        .collect::<Vec<_>>());
    let list = pod::child_sequence(spec, "volumes")?;
    for volume in &finish.volumes {
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

    for (k, v) in &finish.labels {
        pod::set_entry(meta, "labels", k, v)?;
    }
    let extra = config.injected_annotations.iter();
    for (k, v) in finish.annotations.iter().map(|(k, v)| (k, v)).chain(extra) {
        pod::set_entry(meta, "annotations", k, v)?;
    }
    if !finish.overrides.is_empty() {
        pod::set_entry(
            meta,
            "annotations",
            key::PROXY_OVERRIDES,
            &finish.overrides.to_json(),
        )?;
    }
    for k in &finish.metrics.remove {
        pod::remove_entry(meta, "annotations", k);
    }
    for (k, v) in &finish.metrics.set {
        pod::set_entry(meta, "annotations", k, v)?;
    }
    pod::remove_entry(meta, "annotations", key::STATUS);
    pod::set_entry(meta, "annotations", key::STATUS, &status.to_string())
}

pub(crate) fn env_value<'c>(container: &'c Value, name: &str) -> Option<&'c str> {
    let env = container.get("env").and_then(Value::as_sequence)?;
    env.iter()
        .find(|e| container_name(e) == Some(name))
        .and_then(|e| e.get("value"))
        .and_then(Value::as_str)
}

/// The user containers merged over ours, recorded in `proxy.istio.io/overrides` so that a
/// later re-injection can apply them again.
#[derive(Default)]
pub(crate) struct OverrideRecord {
    pub containers: Vec<Value>,
    pub init_containers: Vec<Value>,
}

impl OverrideRecord {
    pub fn push_proxy(&mut self, proxy: Value, native: bool) {
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

/// The names of these containers, for the status annotation.
pub(crate) fn names(containers: &[Value]) -> Vec<String> {
    containers
        .iter()
        .filter_map(container_name)
        .map(str::to_string)
        .collect()
}

/// Replaces the item of the same name, or appends.
pub(crate) fn put_named(list: &mut Vec<Value>, item: Value) {
    match list
        .iter_mut()
        .find(|v| container_name(v).is_some() && container_name(v) == container_name(&item))
    {
        Some(slot) => *slot = item,
        None => list.push(item),
    }
}

/// A typed object as a YAML value, `name` first so that manifests stay readable.
pub(crate) fn to_value<T: serde::Serialize>(object: &T) -> Result<Value, InjectError> {
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
