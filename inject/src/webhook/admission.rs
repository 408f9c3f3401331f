//! One AdmissionReview (admission.k8s.io/v1) in, its answer out. The pod comes from
//! `request.object`; a pod made by a controller has no name or namespace yet, so the namespace
//! comes from `request.namespace`. The answer allows the pod and carries a JSON Patch (base64)
//! to the injected pod, or no patch when the pod is not injected, or refuses a pod whose
//! annotations are invalid. Input that is not an AdmissionReview is a [`ReviewError`].

use crate::decision::FrontEnd;
use crate::injector::{Injector, Outcome, Request};
use crate::pod::{PodTemplate, Workload};
use base64::Engine;
use k8s_openapi::api::core::v1::Namespace;
use serde_json::{json, Value as Json};
use serde_yaml_ng::{Mapping, Value};

/// Where the webhook learns about a pod's namespace (OpenShift's uid ranges live there).
pub trait NamespaceLookup: Send + Sync {
    fn namespace(&self, name: &str) -> Option<Namespace>;
}

/// No Kubernetes API access: namespaces are unknown. Remora's webhook does not talk to the
/// API server, so OpenShift's namespace uid ranges are not applied by it (see docs/inject.md).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoNamespaces;

impl NamespaceLookup for NoNamespaces {
    fn namespace(&self, _: &str) -> Option<Namespace> {
        None
    }
}

/// The request is not a well-formed AdmissionReview; the server answers 400 with this text.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReviewError(String);

fn malformed(what: impl Into<String>) -> ReviewError {
    ReviewError(what.into())
}

/// Answers one review body with the response review's JSON.
pub fn review(
    body: &[u8],
    injector: &Injector,
    namespaces: &dyn NamespaceLookup,
) -> Result<Json, ReviewError> {
    let review: Json =
        serde_json::from_slice(body).map_err(|e| malformed(format!("not JSON: {e}")))?;
    let api_version = review["apiVersion"].as_str().unwrap_or_default();
    if !matches!(
        api_version,
        "admission.k8s.io/v1" | "admission.k8s.io/v1beta1"
    ) {
        return Err(malformed(format!(
            "apiVersion {api_version:?} is not admission.k8s.io/v1"
        )));
    }
    if review["kind"] != "AdmissionReview" {
        return Err(malformed("kind is not AdmissionReview"));
    }
    let request = &review["request"];
    let uid = request["uid"]
        .as_str()
        .ok_or_else(|| malformed("request.uid is missing"))?;
    let pod = &request["object"];
    if !pod.is_object() {
        return Err(malformed("request.object is not an object"));
    }
    let mut metadata: Mapping = match &pod["metadata"] {
        Json::Null => Mapping::new(),
        m => serde_json::from_value(m.clone())
            .map_err(|e| malformed(format!("request.object.metadata: {e}")))?,
    };
    let mut spec: Mapping = serde_json::from_value(pod["spec"].clone())
        .map_err(|e| malformed(format!("request.object.spec: {e}")))?;

    let mut workload = Workload::of_pod(&metadata);
    if workload.namespace.is_empty() {
        workload.namespace = request["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
    }
    let namespace = namespaces.namespace(&workload.namespace);
    let answer = |response: Json| json!({"apiVersion": api_version, "kind": "AdmissionReview", "response": response});
    let req = Request {
        workload: &workload,
        front_end: FrontEnd::Webhook,
        namespace: namespace.as_ref(),
    };
    let template = PodTemplate {
        metadata: &mut metadata,
        spec: &mut spec,
    };
    match injector.inject(template, &req) {
        Ok(Outcome::Skipped(why)) => {
            tracing::debug!(namespace = %workload.namespace, workload = %workload.name, why, "not injected");
            Ok(answer(json!({"uid": uid, "allowed": true})))
        }
        Ok(Outcome::Injected) => {
            let mut injected = pod.clone();
            injected["metadata"] = to_json(metadata)?;
            injected["spec"] = to_json(spec)?;
            let patch = crate::patch::diff(pod, &injected);
            let patch = serde_json::to_vec(&patch).map_err(|e| malformed(e.to_string()))?;
            tracing::info!(namespace = %workload.namespace, workload = %workload.name, "injected");
            Ok(answer(json!({
                "uid": uid,
                "allowed": true,
                "patchType": "JSONPatch",
                "patch": base64::engine::general_purpose::STANDARD.encode(patch),
            })))
        }
        Err(e) => {
            tracing::warn!(namespace = %workload.namespace, workload = %workload.name, error = %e, "refused");
            Ok(answer(json!({
                "uid": uid,
                "allowed": false,
                "status": {"code": 400, "message": format!("sidecar injection failed: {e}")},
            })))
        }
    }
}

fn to_json(m: Mapping) -> Result<Json, ReviewError> {
    serde_json::to_value(Value::Mapping(m)).map_err(|e| malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(body: &str) -> Result<Json, ReviewError> {
        review(body.as_bytes(), &Injector::default(), &NoNamespaces)
    }

    #[test]
    fn injects_and_echoes_the_uid() {
        let r = call(r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","namespace":"shop","object":{"metadata":{"generateName":"web-"},"spec":{"containers":[{"name":"web","image":"w"}]}}}}"#).unwrap();
        assert_eq!(r["response"]["uid"], "u-1");
        assert_eq!(r["response"]["allowed"], true);
        assert_eq!(r["response"]["patchType"], "JSONPatch");
    }

    #[test]
    fn malformed_reviews_are_errors_not_panics() {
        for body in [
            "",
            "[]",
            "{}",
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"spec":[]}}}"#,
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"spec":{"containers":{}}}}}"#,
        ] {
            let r = call(body);
            // A pod whose containers are not a list is refused, not a malformed review.
            if let Ok(r) = &r {
                assert_eq!(r["response"]["allowed"], false, "{body}");
            }
        }
    }

    /// The webhook reads no Namespace; on OpenShift the config's record of the namespace's
    /// uid range gives the proxy its uid, as the Namespace's annotations would.
    #[test]
    fn openshift_ranges_come_from_the_config() {
        let config = crate::InjectorConfig::parse(
            "platform: openshift\nopenshift_namespaces:\n  shop:\n    uid_range: 1000620000/10000\n    supplemental_groups: 1000620000/10000,1000700000/10000\n",
            std::path::Path::new("test.yaml"),
        )
        .unwrap();
        let body = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","namespace":"NS","object":{"metadata":{"generateName":"web-"},"spec":{"containers":[{"name":"web","image":"w"}]}}}}"#;
        let uid_of = |namespace: &str| {
            let r = review(
                body.replace("NS", namespace).as_bytes(),
                &Injector::new(config.clone()),
                &NoNamespaces,
            )
            .unwrap();
            let patch = base64::engine::general_purpose::STANDARD
                .decode(r["response"]["patch"].as_str().unwrap())
                .unwrap();
            let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
            let request: Json = serde_json::from_str(body).unwrap();
            let mut pod = request["request"]["object"].clone();
            json_patch::patch(&mut pod, &patch).unwrap();
            let proxy = pod["spec"]["initContainers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == "istio-proxy")
                .cloned()
                .unwrap();
            (
                proxy["securityContext"]["runAsUser"].clone(),
                proxy["securityContext"]["runAsGroup"].clone(),
            )
        };
        assert_eq!(uid_of("shop"), (json!(1000629999), json!(1000629999)));
        // A namespace the config does not list keeps the configured ids.
        assert_eq!(uid_of("other"), (json!(1337), json!(1337)));

        let bad = crate::InjectorConfig::parse(
            "openshift_namespaces:\n  shop: {uid_range: lots}\n",
            std::path::Path::new("test.yaml"),
        );
        assert!(bad.is_err_and(|e| e.to_string().contains("openshift_namespaces")));
    }

    #[test]
    fn invalid_annotations_are_refused() {
        let r = call(r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"metadata":{"annotations":{"traffic.sidecar.istio.io/excludeInboundPorts":"*"}},"spec":{"containers":[{"name":"a"}]}}}}"#).unwrap();
        assert_eq!(r["response"]["allowed"], false);
        let message = r["response"]["status"]["message"].as_str().unwrap();
        assert!(message.contains("excludeInboundPorts"), "{message}");
    }
}
