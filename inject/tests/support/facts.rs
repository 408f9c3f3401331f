//! The facts Istio's goldens record, read back from an injected pod, and their comparison with
//! a golden's (exact, or as the conformance README allows).

use serde_json::{json, Map, Value as Json};

fn containers(spec: &Json, field: &str) -> Vec<Json> {
    spec[field].as_array().cloned().unwrap_or_default()
}

fn named<'a>(list: &'a [Json], name: &str) -> Option<&'a Json> {
    list.iter().find(|c| c["name"] == name)
}

fn string_map(m: &Json) -> Map<String, Json> {
    m.as_object().cloned().unwrap_or_default()
}

fn probe_facts(p: &Json) -> Json {
    if p.is_null() {
        return Json::Null;
    }
    json!({
        "path": p["httpGet"]["path"], "port": p["httpGet"]["port"],
        "initial_delay_seconds": p["initialDelaySeconds"], "period_seconds": p["periodSeconds"],
        "timeout_seconds": p["timeoutSeconds"], "failure_threshold": p["failureThreshold"],
    })
}

fn env_json(container: &Json, name: &str) -> Json {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
        .map_or(Json::Null, |v| serde_json::from_str(v).expect("env json"))
}

fn diff(before: &Json, after: &Json) -> (Json, Json, Json) {
    let (b, a) = (string_map(before), string_map(after));
    let mask = |k: &str, v: &Json| {
        if k == "sidecar.istio.io/status" || k == "proxy.istio.io/overrides" {
            json!("<present>")
        } else {
            v.clone()
        }
    };
    let mut added = Map::new();
    let mut changed = Map::new();
    for (k, v) in &a {
        match b.get(k) {
            None => {
                added.insert(k.clone(), mask(k, v));
            }
            Some(old) if old != v => {
                changed.insert(k.clone(), json!({"from": mask(k, old), "to": mask(k, v)}));
            }
            _ => {}
        }
    }
    let removed: Vec<&String> = b.keys().filter(|k| !a.contains_key(*k)).collect();
    (Json::Object(added), Json::Object(changed), json!(removed))
}

/// The facts the goldens record, read from a template before and after injection.
pub fn facts(before_meta: &Json, before_spec: &Json, after_meta: &Json, after_spec: &Json) -> Json {
    let inits = containers(after_spec, "initContainers");
    let mains = containers(after_spec, "containers");
    let injected = after_meta["annotations"]["sidecar.istio.io/status"].is_string();
    let capture = named(&inits, "istio-init").or_else(|| named(&inits, "istio-validation"));
    let proxy_in_init = named(&inits, "istio-proxy").is_some();
    let proxy = named(&inits, "istio-proxy").or_else(|| named(&mains, "istio-proxy"));
    let sc = |c: Option<&Json>, f: &str| c.map_or(Json::Null, |c| c["securityContext"][f].clone());
    let caps = |c: Option<&Json>, f: &str| {
        c.map(|c| {
            c["securityContext"]["capabilities"][f]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
    };
    let capture_container_args = capture.map_or(Json::Null, |c| c["args"].clone());
    let args: Vec<Json> = capture_container_args
        .as_array()
        .cloned()
        .unwrap_or_default();
    let validation_only = args.iter().any(|a| a == "--skip-rule-apply");
    // Our container runs `remora capture <istio-iptables flags>`; a user's own args are not.
    let capture_args = match args.first() {
        Some(first) if first == "capture" => json!(args[1..].to_vec()),
        _ => Json::Null,
    };
    let mut rewritten = Map::new();
    let before_all: Vec<Json> = containers(before_spec, "initContainers")
        .into_iter()
        .chain(containers(before_spec, "containers"))
        .collect();
    for after in inits
        .iter()
        .chain(&mains)
        .filter(|c| c["name"] != "istio-proxy")
    {
        let name = after["name"].as_str().unwrap_or_default();
        let before = named(&before_all, name).cloned().unwrap_or(Json::Null);
        let mut changes = Map::new();
        for (label, pointer) in [
            ("readinessProbe", "/readinessProbe"),
            ("livenessProbe", "/livenessProbe"),
            ("startupProbe", "/startupProbe"),
            ("lifecycle.preStop", "/lifecycle/preStop"),
            ("lifecycle.postStart", "/lifecycle/postStart"),
        ] {
            let new = after.pointer(&format!("{pointer}/httpGet"));
            let old = before.pointer(&format!("{pointer}/httpGet"));
            if let Some(new) = new.filter(|n| Some(*n) != old) {
                let mut target = json!({"path": new["path"], "port": new["port"]});
                if !new["scheme"].is_null() {
                    target["scheme"] = new["scheme"].clone();
                }
                changes.insert(label.into(), target);
            }
        }
        if !changes.is_empty() {
            rewritten.insert(name.into(), Json::Object(changes));
        }
    }
    let (annotations_added, annotations_changed, annotations_removed) =
        diff(&before_meta["annotations"], &after_meta["annotations"]);
    let (labels_added, labels_changed, labels_removed) =
        diff(&before_meta["labels"], &after_meta["labels"]);
    let names = |list: &[Json]| json!(list.iter().map(|c| c["name"].clone()).collect::<Vec<_>>());
    let secrets = |spec: &Json| containers(spec, "imagePullSecrets");
    let before_secrets = secrets(before_spec);
    let secrets_added: Vec<Json> = secrets(after_spec)
        .into_iter()
        .filter(|s| !before_secrets.contains(s))
        .map(|s| s["name"].clone())
        .collect();
    let user_volume_names: Vec<String> = after_meta["annotations"]["sidecar.istio.io/userVolume"]
        .as_str()
        .and_then(|v| serde_json::from_str::<Map<String, Json>>(v).ok())
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    let mut user_volumes = Map::new();
    for v in containers(after_spec, "volumes") {
        if let Some(name) = v["name"]
            .as_str()
            .filter(|n| user_volume_names.iter().any(|u| u == n))
        {
            let mut v = v.clone();
            v.as_object_mut().map(|o| o.remove("name"));
            user_volumes.insert(name.to_string(), v);
        }
    }
    let mount_names: Vec<String> = after_meta["annotations"]["sidecar.istio.io/userVolumeMount"]
        .as_str()
        .and_then(|v| serde_json::from_str::<Map<String, Json>>(v).ok())
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    let user_mounts: Vec<Json> = proxy
        .map(|p| containers(p, "volumeMounts"))
        .unwrap_or_default()
        .into_iter()
        .filter(|m| {
            m["name"]
                .as_str()
                .is_some_and(|n| mount_names.iter().any(|u| u == n))
        })
        .collect();
    // Application containers changed beyond what probe rewriting changes.
    let mut app_changes = Map::new();
    for after in inits.iter().chain(&mains) {
        let name = after["name"].as_str().unwrap_or_default();
        let injected_names = ["istio-proxy", "istio-init", "istio-validation"];
        let Some(before) = named(&before_all, name).filter(|_| !injected_names.contains(&name))
        else {
            continue;
        };
        let (b, a) = (string_map(before), string_map(after));
        let mut fields: Vec<&String> = b
            .keys()
            .chain(a.keys())
            .filter(|k| !PROBE_FIELDS.contains(&k.as_str()) && b.get(*k) != a.get(*k))
            .collect();
        fields.sort();
        fields.dedup();
        if !fields.is_empty() {
            app_changes.insert(name.into(), json!(fields));
        }
    }
    let (spec_b, spec_a) = (string_map(before_spec), string_map(after_spec));
    let mut spec_changes = Map::new();
    for k in spec_b.keys().chain(spec_a.keys()) {
        let listed = [
            "containers",
            "initContainers",
            "volumes",
            "imagePullSecrets",
        ];
        if !listed.contains(&k.as_str()) && spec_b.get(k) != spec_a.get(k) {
            let side = |m: &Map<String, Json>| m.get(k).cloned().unwrap_or(Json::Null);
            spec_changes.insert(
                k.clone(),
                json!({"from": side(&spec_b), "to": side(&spec_a)}),
            );
        }
    }
    let hooks = proxy.map(|p| {
        let mut h: Vec<String> = string_map(&p["lifecycle"]).keys().cloned().collect();
        h.sort();
        h
    });
    let mut facts = json!({
        "injected": injected,
        "capture_container": capture.map(|c| c["name"].clone()),
        "capture_args": capture_args,
        "capture_container_args": capture_container_args,
        "validation_only": validation_only,
        "init_run_as_user": sc(capture, "runAsUser"),
        "init_run_as_group": sc(capture, "runAsGroup"),
        "init_run_as_non_root": sc(capture, "runAsNonRoot"),
        "init_capabilities_add": caps(capture, "add"),
        "init_capabilities_drop": caps(capture, "drop"),
        "init_privileged": sc(capture, "privileged"),
        "init_resources": capture.map(|c| c["resources"].clone()),
        "proxy_present": proxy.is_some(),
        "proxy_in_init_containers": proxy.map(|_| proxy_in_init),
        "proxy_restart_policy": proxy.map(|p| p["restartPolicy"].clone()),
        "proxy_run_as_user": sc(proxy, "runAsUser"),
        "proxy_run_as_group": sc(proxy, "runAsGroup"),
        "proxy_run_as_non_root": sc(proxy, "runAsNonRoot"),
        "proxy_capabilities_add": caps(proxy, "add"),
        "proxy_privileged": sc(proxy, "privileged"),
        "proxy_read_only_root_filesystem": sc(proxy, "readOnlyRootFilesystem"),
        "proxy_lifecycle_hooks": hooks,
        "readiness_probe": proxy.map_or(Json::Null, |p| probe_facts(&p["readinessProbe"])),
        "startup_probe": proxy.map_or(Json::Null, |p| probe_facts(&p["startupProbe"])),
        "proxy_liveness_probe": proxy.map_or(Json::Null, |p| probe_facts(&p["livenessProbe"])),
        "proxy_resources": proxy.map(|p| p["resources"].clone()),
        "app_probes_rewritten": !rewritten.is_empty(),
        "rewritten_probes": rewritten,
        "app_probers": proxy.map_or(Json::Null, |p| env_json(p, "ISTIO_KUBE_APP_PROBERS")),
        "prometheus_merge_config": proxy.map_or(Json::Null, |p| env_json(p, "ISTIO_PROMETHEUS_ANNOTATIONS")),
        "annotations_added": annotations_added,
        "annotations_changed": annotations_changed,
        "annotations_removed": annotations_removed,
        "labels_added": labels_added,
        "labels_changed": labels_changed,
        "labels_removed": labels_removed,
        "containers_order": names(&mains),
        "init_containers_order": names(&inits),
        "image_pull_secrets_added": secrets_added,
        "user_volumes_added": user_volumes,
        "proxy_user_volume_mounts": user_mounts,
    });
    // Added outside `json!`, whose macro recursion the literal above already uses up.
    facts["app_container_changes"] = Json::Object(app_changes);
    facts["other_pod_spec_changes"] = Json::Object(spec_changes);
    facts
}

/// Container fields that probe rewriting changes (compared on their own).
const PROBE_FIELDS: &[&str] = &[
    "readinessProbe",
    "livenessProbe",
    "startupProbe",
    "lifecycle",
];

/// Fields compared verbatim.
const EXACT: &[&str] = &[
    "injected",
    "capture_container",
    "validation_only",
    "init_run_as_user",
    "init_run_as_group",
    "init_run_as_non_root",
    "init_capabilities_add",
    "init_capabilities_drop",
    "init_privileged",
    "proxy_present",
    "proxy_in_init_containers",
    "proxy_restart_policy",
    "proxy_run_as_user",
    "proxy_run_as_group",
    "proxy_run_as_non_root",
    "proxy_capabilities_add",
    "proxy_privileged",
    "proxy_read_only_root_filesystem",
    "proxy_lifecycle_hooks",
    "readiness_probe",
    "startup_probe",
    "proxy_liveness_probe",
    "app_probes_rewritten",
    "rewritten_probes",
    "app_probers",
    "prometheus_merge_config",
    "annotations_changed",
    "annotations_removed",
    "labels_added",
    "labels_changed",
    "labels_removed",
    "containers_order",
    "init_containers_order",
    "image_pull_secrets_added",
    "user_volumes_added",
    "proxy_user_volume_mounts",
    "app_container_changes",
    "other_pod_spec_changes",
];

/// Compares a template's facts with the golden's; returns the mismatches. `agent_port` is
/// where Remora points `prometheus.io/port` (the golden's 15020 is Istio's agent port).
pub fn compare(expected: &Json, got: &Json, agent_port: u16, tolerated: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |field: &str, e: &Json, g: &Json| {
        if e != g && !tolerated.contains(&field) {
            out.push(format!("{field}: expected {e}, got {g}"));
        }
    };
    for field in EXACT {
        check(field, &expected[*field], &got[*field]);
    }
    if expected["capture_args"].is_null() {
        check(
            "capture_container_args",
            &expected["capture_container_args"],
            &got["capture_container_args"],
        );
    } else {
        check(
            "capture_args",
            &expected["capture_args"],
            &got["capture_args"],
        );
    }
    let mut added = expected["annotations_added"].clone();
    // Istio records its overrides as Go-ordered JSON; only their presence is a decision.
    if added["proxy.istio.io/overrides"].is_string() {
        added["proxy.istio.io/overrides"] = json!("<present>");
    }
    if added["prometheus.io/port"] == "15020" {
        added["prometheus.io/port"] = json!(agent_port.to_string());
    }
    check("annotations_added", &added, &got["annotations_added"]);
    for field in ["init_resources", "proxy_resources"] {
        if !same_resources(&expected[field], &got[field]) {
            check(field, &expected[field], &got[field]);
        }
    }
    out
}

/// Resource lists equal as Kubernetes quantities (`2000m` is `2`).
fn same_resources(e: &Json, g: &Json) -> bool {
    let sections = |r: &Json| -> Vec<(String, String, f64)> {
        let mut v = Vec::new();
        for section in ["requests", "limits"] {
            for (k, q) in string_map(&r[section]) {
                let value = remora_inject::quantity::value(q.as_str().unwrap_or_default())
                    .unwrap_or(f64::NAN);
                v.push((section.to_string(), k, value));
            }
        }
        v.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        v
    };
    match (e.is_null(), g.is_null()) {
        (true, true) => true,
        (false, false) => {
            let (a, b) = (sections(e), sections(g));
            a.len() == b.len()
                && a.iter()
                    .zip(&b)
                    .all(|(x, y)| x.0 == y.0 && x.1 == y.1 && (x.2 - y.2).abs() < 1e-9)
        }
        _ => false,
    }
}
