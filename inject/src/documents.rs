//! `remora inject`'s input and output: multi-document YAML in which every pod template is
//! injected. Documents without a pod template, or whose pods are not injected, are written
//! back byte for byte; injected ones are re-emitted from the parsed tree, which keeps every
//! field, known or not, and its order.

use crate::decision::FrontEnd;
use crate::error::InjectError;
use crate::injector::{Injector, Outcome, Request};
use crate::pod::{PodTemplate, Workload};
use k8s_openapi::api::core::v1::Namespace;
use serde_yaml_ng::{Mapping, Value};

/// One pod template found in the input, for reporting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateReport {
    pub kind: String,
    pub name: String,
    pub outcome: Outcome,
}

/// Injects every pod template of a multi-document YAML stream.
pub fn inject_yaml(
    input: &str,
    injector: &Injector,
    namespace: Option<&Namespace>,
) -> Result<(String, Vec<TemplateReport>), InjectError> {
    let mut out = String::with_capacity(input.len() * 2);
    let mut reports = Vec::new();
    for (i, raw) in split_documents(input).into_iter().enumerate() {
        if !out.is_empty() {
            out.push_str("---\n");
        }
        let value: Value = if is_blank(raw) {
            Value::Null
        } else {
            serde_yaml_ng::from_str(raw).map_err(|source| InjectError::Yaml {
                document: i + 1,
                source,
            })?
        };
        let Value::Mapping(mut object) = value else {
            out.push_str(raw);
            continue;
        };
        fix_octal_modes(&mut object);
        let before = reports.len();
        inject_object(&mut object, injector, namespace, &mut reports)?;
        let changed = reports[before..]
            .iter()
            .any(|r| r.outcome == Outcome::Injected);
        if changed {
            let text =
                serde_yaml_ng::to_string(&Value::Mapping(object)).map_err(InjectError::Emit)?;
            out.push_str(&crate::yaml11::quote_for_yaml11(&text));
        } else {
            out.push_str(raw);
        }
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok((out, reports))
}

/// Splits a stream as Kubernetes' YAML reader does: on lines that are `---` alone (or
/// followed by a comment).
pub fn split_documents(input: &str) -> Vec<&str> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in input.split_inclusive('\n') {
        if let Some(rest) = line.strip_prefix("---") {
            let rest = rest.trim();
            if rest.is_empty() || rest.starts_with('#') {
                docs.push(&input[start..offset]);
                start = offset + line.len();
            }
        }
        offset += line.len();
    }
    docs.push(&input[start..]);
    // A leading separator opens the first document rather than closing an empty one.
    if docs.first().is_some_and(|d| is_blank(d)) && docs.len() > 1 {
        docs.remove(0);
    }
    if docs.last().is_some_and(|d| is_blank(d)) && docs.len() > 1 {
        docs.pop();
    }
    docs
}

/// Only whitespace and comments.
pub fn is_blank(doc: &str) -> bool {
    doc.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#')
    })
}

fn inject_object(
    object: &mut Mapping,
    injector: &Injector,
    namespace: Option<&Namespace>,
    reports: &mut Vec<TemplateReport>,
) -> Result<(), InjectError> {
    let text = |m: &Mapping, k: &str| {
        m.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let kind = text(object, "kind");
    let meta = object
        .get("metadata")
        .and_then(Value::as_mapping)
        .cloned()
        .unwrap_or_default();
    if kind == "List" {
        if let Some(Value::Sequence(items)) = object.get_mut("items") {
            for item in items {
                if let Value::Mapping(item) = item {
                    inject_object(item, injector, namespace, reports)?;
                }
            }
        }
        return Ok(());
    }
    let owner = Workload {
        name: text(&meta, "name"),
        namespace: text(&meta, "namespace"),
        kind: kind.clone(),
        api_version: text(object, "apiVersion"),
    };
    let template_path: &[&str] = match kind.as_str() {
        "Pod" => &[],
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "ReplicationController"
        | "Job"
        | "DeploymentConfig" => &["spec", "template"],
        // Remora writes a CronJob's labels on its pod template, where pods get them (Istio's
        // kube-inject writes them on the Job template instead).
        "CronJob" => &["spec", "jobTemplate", "spec", "template"],
        _ => return Ok(()),
    };
    let workload = if kind == "Pod" {
        Workload::of_pod(&meta)
    } else {
        owner
    };
    let Some(template) = descend(object, template_path) else {
        return Err(InjectError::pod(
            template_path.join("."),
            format!("a {kind} needs a pod template"),
        ));
    };
    let mut metadata = match template.get("metadata") {
        Some(Value::Mapping(m)) => m.clone(),
        None | Some(Value::Null) => Mapping::new(),
        Some(_) => return Err(InjectError::pod("metadata", "expected a map")),
    };
    let mut spec = match template.get("spec") {
        Some(Value::Mapping(m)) => m.clone(),
        _ => return Err(InjectError::pod("spec", "a pod template needs a spec")),
    };
    let request = Request {
        workload: &workload,
        front_end: FrontEnd::Cli,
        namespace,
    };
    let outcome = injector.inject(
        PodTemplate {
            metadata: &mut metadata,
            spec: &mut spec,
        },
        &request,
    )?;
    if outcome == Outcome::Injected {
        template.insert("metadata".into(), Value::Mapping(metadata));
        template.insert("spec".into(), Value::Mapping(spec));
    }
    reports.push(TemplateReport {
        kind,
        name: workload.name,
        outcome,
    });
    Ok(())
}

fn descend<'m>(object: &'m mut Mapping, path: &[&str]) -> Option<&'m mut Mapping> {
    let mut here = object;
    for step in path {
        here = here.get_mut(*step)?.as_mapping_mut()?;
    }
    Some(here)
}

/// File modes are octal in manifests (`defaultMode: 0644`). Kubernetes reads YAML 1.1, where
/// that is the number 420; a YAML 1.2 parser reads the string "0644", which would be written
/// back quoted and then refused. These two fields are integers in every Kubernetes type, so a
/// string of octal digits there can only mean the octal number.
fn fix_octal_modes(value: &mut Mapping) {
    for (k, v) in value.iter_mut() {
        match v {
            Value::String(s) if matches!(k.as_str(), Some("defaultMode" | "mode")) => {
                let octal = s.len() > 1
                    && s.starts_with('0')
                    && s.bytes().all(|b| (b'0'..=b'7').contains(&b));
                if let (true, Ok(n)) = (octal, i64::from_str_radix(s, 8)) {
                    *v = Value::from(n);
                }
            }
            Value::Mapping(m) => fix_octal_modes(m),
            Value::Sequence(items) => {
                for item in items {
                    if let Value::Mapping(m) = item {
                        fix_octal_modes(m);
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_kubernetes() {
        assert_eq!(
            split_documents("a: 1\n---\nb: 2\n"),
            vec!["a: 1\n", "b: 2\n"]
        );
        assert_eq!(
            split_documents("---\na: 1\n--- # c\nb: 2\n---\n"),
            vec!["a: 1\n", "b: 2\n"]
        );
        assert_eq!(split_documents("a: '---'\n"), vec!["a: '---'\n"]);
    }

    #[test]
    fn other_kinds_and_opted_out_pods_pass_through_byte_for_byte() {
        let input = "kind: Service # keep me\napiVersion: v1\nmetadata: {name: s}\n---\nkind: Pod\nmetadata:\n  name: p\n  annotations: {sidecar.istio.io/inject: 'false'}\nspec: {containers: [{name: a}]}\n";
        let (out, reports) = inject_yaml(input, &Injector::default(), None).unwrap();
        assert_eq!(out, input);
        assert_eq!(reports.len(), 1);
    }

    #[test]
    fn octal_modes_stay_numbers() {
        let input = "kind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: a}]\n  volumes: [{name: v, configMap: {name: c, defaultMode: 0644}}]\n";
        let (out, _) = inject_yaml(input, &Injector::default(), None).unwrap();
        assert!(out.contains("defaultMode: 420"), "{out}");
    }
}
