//! Whether a pod gets a sidecar, decided as Istio decides: never for host-network pods or in
//! ignored namespaces; the pod's own `sidecar.istio.io/inject` (label first, then annotation)
//! wins; then the never- and always-inject selectors; then the policy.

use crate::config::{InjectorConfig, Policy};
use crate::names::key;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

/// Which front end asks: `remora inject` injects whatever the pod does not refuse (as
/// istioctl kube-inject does); the webhook applies the namespace list, selectors and policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontEnd {
    Cli,
    Webhook,
}

/// The outcome, with the reason a pod is skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Inject,
    Skip(&'static str),
}

/// What the decision looks at.
pub struct PodFacts<'a> {
    pub labels: &'a BTreeMap<String, String>,
    pub annotations: &'a BTreeMap<String, String>,
    pub namespace: &'a str,
    pub host_network: bool,
}

/// Decides for one pod.
pub fn decide(pod: &PodFacts<'_>, config: &InjectorConfig, front_end: FrontEnd) -> Decision {
    // Capture rules in a host-network pod would rewrite the node's own routing.
    if pod.host_network {
        return Decision::Skip("the pod uses the host's network");
    }
    if config.ignored_namespaces.iter().any(|n| n == pod.namespace) {
        return Decision::Skip("the namespace is never injected");
    }
    let own = pod
        .labels
        .get(key::INJECT)
        .or_else(|| pod.annotations.get(key::INJECT))
        .map(String::as_str);
    match own {
        Some("true") => return Decision::Inject,
        Some("false") => return Decision::Skip("sidecar.istio.io/inject is false"),
        // Istio logs anything else and falls back to the defaults.
        _ => {}
    }
    if front_end == FrontEnd::Cli {
        return Decision::Inject;
    }
    if config
        .never_inject_selector
        .iter()
        .any(|s| matches(s, pod.labels))
    {
        return Decision::Skip("the pod matches a never-inject selector");
    }
    if config
        .always_inject_selector
        .iter()
        .any(|s| matches(s, pod.labels))
    {
        return Decision::Inject;
    }
    match config.policy {
        Policy::Enabled => Decision::Inject,
        Policy::Disabled => Decision::Skip("the injection policy is disabled"),
    }
}

/// Kubernetes label-selector semantics, except that an empty selector matches nothing (as in
/// Istio, where an empty entry in the selector lists is ignored).
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let match_labels = selector.match_labels.as_ref().filter(|m| !m.is_empty());
    let expressions = selector.match_expressions.as_deref().unwrap_or_default();
    if match_labels.is_none() && expressions.is_empty() {
        return false;
    }
    let labels_ok = match_labels
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_ok = expressions.iter().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            // An operator Kubernetes does not know can never be satisfied.
            _ => false,
        }
    });
    labels_ok && expressions_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn facts<'a>(
        labels: &'a BTreeMap<String, String>,
        annotations: &'a BTreeMap<String, String>,
    ) -> PodFacts<'a> {
        PodFacts {
            labels,
            annotations,
            namespace: "default",
            host_network: false,
        }
    }

    #[test]
    fn label_beats_annotation_and_selectors_follow() {
        let none = BTreeMap::new();
        let mut config = InjectorConfig {
            policy: Policy::Disabled,
            ..InjectorConfig::default()
        };
        let opt_in = map(&[(key::INJECT, "true")]);
        let opt_out = map(&[(key::INJECT, "false")]);
        assert_eq!(
            decide(&facts(&opt_in, &opt_out), &config, FrontEnd::Webhook),
            Decision::Inject
        );
        assert!(matches!(
            decide(&facts(&none, &none), &config, FrontEnd::Webhook),
            Decision::Skip(_)
        ));
        assert_eq!(
            decide(&facts(&none, &none), &config, FrontEnd::Cli),
            Decision::Inject
        );

        let app = map(&[("app", "db")]);
        config.always_inject_selector.push(LabelSelector {
            match_labels: Some(map(&[("app", "db")])),
            ..LabelSelector::default()
        });
        assert_eq!(
            decide(&facts(&app, &none), &config, FrontEnd::Webhook),
            Decision::Inject
        );
        config.policy = Policy::Enabled;
        config.never_inject_selector.push(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "app".into(),
                operator: "In".into(),
                values: Some(vec!["db".into()]),
            }]),
            ..LabelSelector::default()
        });
        assert!(matches!(
            decide(&facts(&app, &none), &config, FrontEnd::Webhook),
            Decision::Skip(_)
        ));
    }

    #[test]
    fn host_network_and_system_namespaces_are_never_injected() {
        let opt_in = map(&[(key::INJECT, "true")]);
        let none = BTreeMap::new();
        let config = InjectorConfig::default();
        let mut pod = facts(&opt_in, &none);
        pod.host_network = true;
        assert!(matches!(
            decide(&pod, &config, FrontEnd::Cli),
            Decision::Skip(_)
        ));
        pod.host_network = false;
        pod.namespace = "kube-system";
        assert!(matches!(
            decide(&pod, &config, FrontEnd::Webhook),
            Decision::Skip(_)
        ));
    }
}
