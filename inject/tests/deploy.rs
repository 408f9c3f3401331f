//! The manifests in deploy/ cannot be applied here (no cluster), so each is parsed into its
//! typed Kubernetes object and must serialise back to exactly what was written: a misspelt
//! or misplaced field would be dropped by the typed parse and show up as a difference. The
//! pieces must also fit together: the webhook's arguments parse, its config is valid, and the
//! Services the webhook configurations call exist and reach the container's port.

use clap::Parser;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use remora_inject::cli::WebhookArgs;
use remora_inject::documents::{is_blank, split_documents};
use remora_inject::InjectorConfig;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

#[derive(Parser)]
struct WebhookCommand {
    #[command(flatten)]
    args: WebhookArgs,
}

#[derive(Default)]
struct Objects {
    config_maps: Vec<ConfigMap>,
    deployments: Vec<Deployment>,
    services: Vec<Service>,
    webhooks: Vec<MutatingWebhookConfiguration>,
}

fn typed<T: DeserializeOwned + Serialize>(doc: &Json, file: &Path) -> T {
    let object: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| {
        panic!(
            "{}: {} is not a valid {}: {e}",
            file.display(),
            doc["metadata"]["name"],
            doc["kind"]
        )
    });
    let back = serde_json::to_value(&object).expect("serialise");
    assert_eq!(
        &back,
        doc,
        "{}: {} has fields its type does not know",
        file.display(),
        doc["metadata"]["name"]
    );
    object
}

fn manifests() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut files = Vec::new();
    for sub in [dir.clone(), dir.join("revisions")] {
        for entry in std::fs::read_dir(&sub).expect("deploy/ exists") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "yaml") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn load() -> Objects {
    let mut objects = Objects::default();
    for file in manifests() {
        let text = std::fs::read_to_string(&file).expect("read manifest");
        for doc in split_documents(&text).into_iter().filter(|d| !is_blank(d)) {
            let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(doc).expect("yaml");
            let json = serde_json::to_value(yaml).expect("json");
            match json["kind"].as_str().unwrap_or_default() {
                "Namespace" => drop(typed::<Namespace>(&json, &file)),
                "ServiceAccount" => drop(typed::<ServiceAccount>(&json, &file)),
                "PodDisruptionBudget" => drop(typed::<PodDisruptionBudget>(&json, &file)),
                "ConfigMap" => objects.config_maps.push(typed(&json, &file)),
                "Deployment" => objects.deployments.push(typed(&json, &file)),
                "Service" => objects.services.push(typed(&json, &file)),
                "MutatingWebhookConfiguration" => objects.webhooks.push(typed(&json, &file)),
                other => panic!("{}: unexpected kind {other}", file.display()),
            }
        }
    }
    objects
}

#[test]
fn manifests_are_valid_and_fit_together() {
    let objects = load();
    assert!(!objects.deployments.is_empty() && !objects.webhooks.is_empty());
    for cm in &objects.config_maps {
        let text = cm
            .data
            .as_ref()
            .and_then(|d| d.get("config.yaml"))
            .expect("config.yaml");
        let config = InjectorConfig::parse(text, Path::new("config.yaml"))
            .unwrap_or_else(|e| panic!("{:?}: {e}", cm.metadata.name));
        assert!(config
            .ignored_namespaces
            .iter()
            .any(|n| n == "remora-system"));
    }
    for d in &objects.deployments {
        let spec = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .expect("pod spec");
        let c = &spec.containers[0];
        let args = c.args.clone().unwrap_or_default();
        assert_eq!(args.first().map(String::as_str), Some("webhook"));
        let parsed = WebhookCommand::try_parse_from(args)
            .expect("webhook args parse")
            .args;
        let mounts = c.volume_mounts.clone().unwrap_or_default();
        for file in [&parsed.tls_cert, &parsed.tls_key] {
            assert!(
                mounts.iter().any(|m| file.starts_with(&m.mount_path)),
                "{} is not mounted",
                file.display()
            );
        }
        let port = c.ports.as_ref().expect("ports")[0].container_port;
        assert_eq!(i32::from(parsed.listen.port()), port);
        let labels = d
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.labels.clone());
        assert_eq!(
            labels
                .as_ref()
                .and_then(|l| l.get("sidecar.istio.io/inject"))
                .map(String::as_str),
            Some("false")
        );
        // The Service in front of it.
        let svc = objects
            .services
            .iter()
            .find(|s| {
                s.spec.as_ref().and_then(|s| s.selector.as_ref())
                    == d.spec
                        .as_ref()
                        .and_then(|s| s.selector.match_labels.as_ref())
            })
            .expect("a Service selects the webhook");
        let target = &svc
            .spec
            .as_ref()
            .expect("spec")
            .ports
            .as_ref()
            .expect("ports")[0]
            .target_port;
        assert_eq!(target.as_ref(), Some(&IntOrString::Int(port)));
    }
    for config in &objects.webhooks {
        for hook in config.webhooks.as_deref().unwrap_or_default() {
            let service = hook
                .client_config
                .service
                .as_ref()
                .expect("service reference");
            assert_eq!(service.path.as_deref(), Some("/inject"));
            let exists = objects.services.iter().any(|s| {
                s.metadata.name.as_deref() == Some(&service.name)
                    && s.metadata.namespace.as_deref() == Some(&service.namespace)
            });
            assert!(exists, "{}: no Service {}", hook.name, service.name);
            assert_eq!(hook.admission_review_versions, vec!["v1".to_string()]);
            assert_eq!(hook.side_effects, "None");
        }
    }
}
