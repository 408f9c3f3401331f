//! Istio's injection goldens (shared/conformance/inject, see its README), run through
//! `remora inject`'s library: every case must decide as Istio decides. Cases Istio checks
//! only through its webhook run through the webhook's admission function.

mod support;

use remora_inject::decision::FrontEnd;
use remora_inject::documents::inject_yaml;
use remora_inject::pod::{PodTemplate, Workload};
use remora_inject::{Injector, Request};
use support::facts::{compare, facts};
use support::{capture_rules, config_for, load_cases, templates_of, Case, NOT_EXPRESSIBLE};

/// Fields in which a golden records an Istio quirk (see the README's Doubts) that Remora
/// deliberately does not reproduce.
const TOLERATED: &[(&str, &[&str])] = &[
    // Istio re-applies the old regular-container proxy over the new native one, so its
    // readiness timings and postStart hook survive; Remora injects the new proxy clean.
    (
        "merge-probers",
        &["readiness_probe", "proxy_lifecycle_hooks"],
    ),
];

#[test]
fn every_conformance_case() {
    let Some(dir) = support::conformance_dir() else {
        return;
    };
    let cases = load_cases(&dir);
    assert_eq!(cases.len(), 123, "the README promises 123 cases");
    let mut failures = Vec::new();
    let mut passed = 0;
    for case in &cases {
        match run_case(case) {
            Ok(()) => passed += 1,
            Err(e) => failures.push(format!("{}: {e}", case.name)),
        }
    }
    println!(
        "conformance: {passed} match Istio, {} failed",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} cases fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn run_case(case: &Case) -> Result<(), String> {
    let e = &case.expect;
    let (config, namespace, unexpressed) = config_for(&e["settings"]);
    for setting in &unexpressed {
        if !NOT_EXPRESSIBLE
            .iter()
            .any(|(name, _)| setting.starts_with(name))
        {
            return Err(format!(
                "setting {setting} has no Remora equivalent and no recorded reason"
            ));
        }
        if e["settings_affect_recorded_fields"] != false {
            return Err(format!(
                "setting {setting} cannot be expressed but changes the golden"
            ));
        }
    }
    let injector = Injector::new(config.clone());
    let agent_port = if config.proxy.status_port == 0 {
        15020
    } else {
        config.proxy.status_port
    };
    let tolerated = TOLERATED
        .iter()
        .find(|(name, _)| *name == case.name)
        .map_or(&[][..], |(_, fields)| fields);

    if !e["expect_error"].is_null() {
        let annotation = e["expect_error"]["annotation"].as_str().unwrap_or_default();
        return match inject_yaml(&case.input, &injector, namespace.as_ref()) {
            Err(err) if err.to_string().contains(annotation) => Ok(()),
            Err(err) => Err(format!("the error does not name {annotation}: {err}")),
            Ok(_) => Err("injection succeeded; it must fail".into()),
        };
    }

    let before = templates_of(&case.input);
    let after = if e["checked_by"]["kube_inject"] == true {
        let (out, _) =
            inject_yaml(&case.input, &injector, namespace.as_ref()).map_err(|e| e.to_string())?;
        templates_of(&out)
    } else {
        // Webhook-only cases (OpenShift): the pod as the API server would send it.
        before
            .iter()
            .map(|t| inject_as_webhook(&injector, t, namespace.as_ref()))
            .collect::<Result<Vec<_>, _>>()?
    };
    let expected = e["templates"].as_array().cloned().unwrap_or_default();
    if expected.len() != after.len() || before.len() != after.len() {
        return Err(format!(
            "expected {} templates, found {}",
            expected.len(),
            after.len()
        ));
    }
    let mut problems = Vec::new();
    for ((want, b), a) in expected.iter().zip(&before).zip(&after) {
        if want["kind"] != a.kind.as_str() || want["name"] != a.name.as_str() {
            problems.push(format!(
                "template {}/{} is not {}/{}",
                a.kind, a.name, want["kind"], want["name"]
            ));
            continue;
        }
        let got = facts(&b.metadata, &b.spec, &a.metadata, &a.spec);
        // Remora's agent serves merged metrics on the pod's status port.
        let agent_port = b.metadata["annotations"]["status.sidecar.istio.io/port"]
            .as_str()
            .and_then(|p| p.parse().ok())
            .filter(|p| *p != 0)
            .unwrap_or(agent_port);
        for p in compare(want, &got, agent_port, tolerated) {
            problems.push(format!("{}: {p}", a.name));
        }
        // The arguments must make `remora capture` write the rules Istio's would.
        if let (Some(ours), Some(theirs)) = (
            got["capture_args"].as_array(),
            want["capture_args"].as_array(),
        ) {
            let ours =
                capture_rules(ours).map_err(|e| format!("remora capture refuses our args: {e}"))?;
            let theirs = capture_rules(theirs)
                .map_err(|e| format!("remora capture refuses Istio's args: {e}"))?;
            if ours != theirs {
                problems.push(format!("{}: capture rules differ", a.name));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// Injects a template as the webhook sees it: a Pod made by its controller, not yet named.
fn inject_as_webhook(
    injector: &Injector,
    t: &support::FoundTemplate,
    namespace: Option<&k8s_openapi::api::core::v1::Namespace>,
) -> Result<support::FoundTemplate, String> {
    let mut metadata: serde_yaml_ng::Mapping =
        serde_json::from_value(t.metadata.clone()).map_err(|e| e.to_string())?;
    let mut spec: serde_yaml_ng::Mapping =
        serde_json::from_value(t.spec.clone()).map_err(|e| e.to_string())?;
    let mut workload = Workload::of_pod(&metadata);
    if workload.name.is_empty() {
        workload.name = t.name.clone();
    }
    if let Some(ns) = namespace.and_then(|n| n.metadata.name.clone()) {
        workload.namespace = ns;
    }
    let request = Request {
        workload: &workload,
        front_end: FrontEnd::Webhook,
        namespace,
    };
    let template = PodTemplate {
        metadata: &mut metadata,
        spec: &mut spec,
    };
    injector
        .inject(template, &request)
        .map_err(|e| e.to_string())?;
    let to_json =
        |m| serde_json::to_value(serde_yaml_ng::Value::Mapping(m)).map_err(|e| e.to_string());
    Ok(support::FoundTemplate {
        kind: t.kind.clone(),
        name: t.name.clone(),
        metadata: to_json(metadata)?,
        spec: to_json(spec)?,
    })
}

/// The capture container's arguments, run through `remora capture --dry-run`'s generator,
/// produce the rules the pod's annotations asked for.
#[test]
fn capture_rules_follow_the_annotations() {
    let pod = r#"apiVersion: v1
kind: Pod
metadata:
  name: db-client
  annotations:
    traffic.sidecar.istio.io/includeOutboundIPRanges: 10.0.0.0/8
    traffic.sidecar.istio.io/excludeOutboundIPRanges: 10.1.0.0/16
    traffic.sidecar.istio.io/includeInboundPorts: "8080"
    traffic.sidecar.istio.io/excludeOutboundPorts: "5432"
    traffic.sidecar.istio.io/kubevirtInterfaces: net1
spec:
  containers: [{name: app, image: app}]
"#;
    let (out, _) = inject_yaml(pod, &Injector::default(), None).expect("injects");
    let t = &templates_of(&out)[0];
    let init = t.spec["initContainers"][0].clone();
    assert_eq!(init["name"], "istio-init");
    let args = init["args"].as_array().expect("args");
    assert_eq!(args[0], "capture");
    let rules = capture_rules(&args[1..]).expect("remora capture accepts the args");
    for line in [
        "-A ISTIO_OUTPUT -d 10.0.0.0/8 -j ISTIO_REDIRECT",
        "-A ISTIO_OUTPUT -d 10.1.0.0/16 -j RETURN",
        "-A ISTIO_INBOUND -p tcp --dport 8080 -j ISTIO_IN_REDIRECT",
        "-A ISTIO_OUTPUT -p tcp --dport 5432 -j RETURN",
        "-I PREROUTING 1 -i net1 -j RETURN",
        "-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN",
    ] {
        assert!(
            rules.lines().any(|l| l == line),
            "missing `{line}` in\n{rules}"
        );
    }
}
