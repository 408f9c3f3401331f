//! `remora inject` keeps what it does not know and is idempotent: injecting its own output
//! again changes nothing, byte for byte.

mod support;

use remora_inject::documents::inject_yaml;
use remora_inject::{Injector, InjectorConfig};
use serde_json::{json, Value as Json};

const DEPLOYMENT: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: shop
  namespace: store
  annotations:
    deployment.kubernetes.io/revision: "3"
spec:
  selector: {matchLabels: {app: shop}}
  futureDeploymentField: {rollout: gradual}
  template:
    metadata:
      labels: {app: shop}
      annotations:
        other-controller.example.com/state: '{"phase":"ready","n":1}'
        traffic.sidecar.istio.io/excludeOutboundPorts: "5432"
    spec:
      futurePodField: [1, 2, {deep: true}]
      resourceClaims: [{name: gpu, resourceClaimTemplateName: gpu-template}]
      initContainers:
      - name: migrate
        image: shop:migrate
        futureContainerField: {x: 1}
      containers:
      - name: shop
        image: shop:1
        ports: [{name: http, containerPort: 8080}]
        readinessProbe:
          httpGet: {path: /ready, port: http, futureHttpField: kept}
          periodSeconds: 7
          futureProbeField: 42
        futureContainerField: "yes"
      volumes:
      - name: conf
        configMap: {name: shop, defaultMode: 0644}
        futureVolumeField: true
"#;

fn inject(input: &str) -> String {
    inject_yaml(input, &Injector::default(), None)
        .expect("injects")
        .0
}

fn pod_template(yaml: &str) -> Json {
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).expect("yaml");
    serde_json::to_value(v).expect("json")["spec"]["template"].clone()
}

#[test]
fn unknown_fields_and_foreign_annotations_survive() {
    let out = inject(DEPLOYMENT);
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&out).expect("output yaml");
    let v = serde_json::to_value(v).expect("json");
    assert_eq!(
        v["spec"]["futureDeploymentField"],
        json!({"rollout": "gradual"})
    );
    assert_eq!(
        v["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "3"
    );
    let t = &v["spec"]["template"];
    assert_eq!(
        t["metadata"]["annotations"]["other-controller.example.com/state"],
        r#"{"phase":"ready","n":1}"#
    );
    assert_eq!(t["spec"]["futurePodField"], json!([1, 2, {"deep": true}]));
    assert_eq!(
        t["spec"]["resourceClaims"][0]["resourceClaimTemplateName"],
        "gpu-template"
    );
    let migrate = t["spec"]["initContainers"]
        .as_array()
        .expect("inits")
        .iter()
        .find(|c| c["name"] == "migrate")
        .expect("migrate");
    assert_eq!(migrate["futureContainerField"], json!({"x": 1}));
    let shop = &t["spec"]["containers"][0];
    assert_eq!(shop["futureContainerField"], "yes");
    let probe = &shop["readinessProbe"];
    assert_eq!(probe["futureProbeField"], 42);
    assert_eq!(probe["periodSeconds"], 7);
    assert_eq!(probe["httpGet"]["futureHttpField"], "kept");
    assert_eq!(probe["httpGet"]["path"], "/app-health/shop/readyz");
    let conf = &t["spec"]["volumes"][0];
    assert_eq!(conf["futureVolumeField"], true);
    assert_eq!(
        conf["configMap"]["defaultMode"], 420,
        "0644 is octal in Kubernetes' YAML"
    );
    // Nothing the injector does not own changed: remove what it adds and compare.
    let before = pod_template(DEPLOYMENT);
    let mut after = t.clone();
    for k in [
        "istio.io/rev",
        "kubectl.kubernetes.io/default-container",
        "kubectl.kubernetes.io/default-logs-container",
        "prometheus.io/port",
        "prometheus.io/path",
        "prometheus.io/scrape",
        "sidecar.istio.io/status",
    ] {
        after["metadata"]["annotations"]
            .as_object_mut()
            .expect("annotations")
            .remove(k);
    }
    for k in [
        "security.istio.io/tlsMode",
        "service.istio.io/canonical-name",
        "service.istio.io/canonical-revision",
    ] {
        after["metadata"]["labels"]
            .as_object_mut()
            .expect("labels")
            .remove(k);
    }
    after["spec"]["initContainers"]
        .as_array_mut()
        .expect("inits")
        .retain(|c| c["name"] == "migrate");
    after["spec"]["volumes"]
        .as_array_mut()
        .expect("volumes")
        .retain(|v| v["name"] == "conf");
    after["spec"]["containers"][0]["readinessProbe"] =
        before["spec"]["containers"][0]["readinessProbe"].clone();
    let mut before = before;
    before["spec"]["volumes"][0]["configMap"]["defaultMode"] = json!(420);
    assert_eq!(after, before);
}

#[test]
fn injecting_twice_changes_nothing() {
    let once = inject(DEPLOYMENT);
    assert_eq!(inject(&once), once);
}

#[test]
fn every_conformance_input_is_idempotent() {
    let Some(dir) = support::conformance_dir() else {
        return;
    };
    let mut checked = 0;
    for case in support::load_cases(&dir) {
        let (config, namespace, _) = support::config_for(&case.expect["settings"]);
        let injector = Injector::new(config);
        let Ok((once, _)) = inject_yaml(&case.input, &injector, namespace.as_ref()) else {
            continue; // error and unsupported-template cases
        };
        let (twice, _) = inject_yaml(&once, &injector, namespace.as_ref()).expect("re-injects");
        assert_eq!(
            twice, once,
            "{}: a second injection changed the output",
            case.name
        );
        checked += 1;
    }
    assert!(checked > 100, "only {checked} cases checked");
}

#[test]
fn revision_and_config_reach_the_pod() {
    let config = InjectorConfig::parse(
        "revision: canary\nnative_sidecars: false\ncapture:\n  interception_mode: TPROXY\n",
        std::path::Path::new("inject.yaml"),
    )
    .expect("config");
    let (out, _) = inject_yaml(DEPLOYMENT, &Injector::new(config), None).expect("injects");
    let t = pod_template(&out);
    assert_eq!(t["metadata"]["annotations"]["istio.io/rev"], "canary");
    let proxy = t["spec"]["containers"]
        .as_array()
        .expect("containers")
        .last()
        .expect("proxy")
        .clone();
    assert_eq!(proxy["name"], "istio-proxy");
    assert_eq!(proxy["securityContext"]["runAsUser"], 0);
    assert_eq!(
        proxy["securityContext"]["capabilities"]["add"],
        json!(["NET_ADMIN"])
    );
    let err = InjectorConfig::parse(
        "capture: {interception_mode: SIDEWAYS}",
        std::path::Path::new("x.yaml"),
    )
    .expect_err("refused");
    assert!(
        err.to_string().contains("capture.interception_mode"),
        "{err}"
    );
}

#[test]
fn the_proxy_gets_what_istiod_mode_needs() {
    let yaml = DEPLOYMENT.replace(
        "        other-controller.example.com/state",
        "        proxy.istio.io/config: '{\"proxyMetadata\":{\"SECRET_TTL\":\"12h\"}}'\n        other-controller.example.com/state",
    );
    let template = pod_template(&inject(&yaml));
    let proxy = template["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(
            template["spec"]["initContainers"]
                .as_array()
                .into_iter()
                .flatten(),
        )
        .find(|c| c["name"] == "istio-proxy")
        .expect("an istio-proxy container");
    let env = |name: &str| {
        proxy["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    let proxy_config: Json = serde_json::from_str(&env("PROXY_CONFIG")).expect("JSON");
    assert_eq!(
        proxy_config,
        json!({"discoveryAddress": "istiod.istio-system.svc:15012",
               "proxyMetadata": {"SECRET_TTL": "12h"}})
    );
    assert_eq!(env("TRUST_DOMAIN"), "cluster.local");
    assert_eq!(env("ISTIO_META_MESH_ID"), "cluster.local");
    assert_eq!(env("ISTIO_META_CLUSTER_ID"), "Kubernetes");
    let ports: Json = serde_json::from_str(&env("ISTIO_META_POD_PORTS")).expect("JSON");
    assert_eq!(ports, json!([{"name": "http", "containerPort": 8080}]));
}
