use super::*;

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn injected() -> BTreeMap<String, String> {
    env(&[
        (
            "PROXY_CONFIG",
            r#"{"discoveryAddress":"istiod.istio-system.svc:15012","proxyMetadata":{"SECRET_TTL":"12h","ISTIO_META_DNS_CAPTURE":"true"}}"#,
        ),
        ("POD_NAME", "reviews-v1-5b4c7d9f8-x2k4p"),
        ("POD_NAMESPACE", "bookinfo"),
        ("INSTANCE_IP", "10.1.2.3"),
        ("SERVICE_ACCOUNT", "bookinfo-reviews"),
        ("ISTIO_META_CLUSTER_ID", "east"),
        ("ISTIO_META_INTERCEPTION_MODE", "TPROXY"),
        (
            "ISTIO_METAJSON_LABELS",
            r#"{"app":"reviews","version":"v1"}"#,
        ),
        ("ISTIO_META_POD_PORTS", r#"[{"containerPort":9080}]"#),
    ])
}

#[test]
fn without_a_discovery_address_there_is_no_istiod() {
    let file = IstiodConfig::default();
    assert_eq!(AgentSettings::resolve(&file, &env(&[])).unwrap(), None);
    // Pod facts alone do not turn it on: only PROXY_CONFIG (the injector) or the file.
    let pod = env(&[("POD_NAME", "p"), ("INSTANCE_IP", "10.0.0.1")]);
    assert_eq!(AgentSettings::resolve(&file, &pod).unwrap(), None);
}

#[test]
fn an_injected_pods_environment() {
    let s = AgentSettings::resolve(&IstiodConfig::default(), &injected())
        .unwrap()
        .unwrap();
    assert_eq!(s.discovery_address, "istiod.istio-system.svc:15012");
    assert_eq!(s.ca_address, s.discovery_address);
    assert_eq!(
        s.token_file,
        PathBuf::from("/var/run/secrets/tokens/istio-token")
    );
    assert_eq!(
        s.ca_root_cert_file,
        PathBuf::from("/var/run/secrets/istio/root-cert.pem")
    );
    assert_eq!(s.cluster_id, "east");
    assert_eq!(s.trust_domain, "cluster.local");
    // Delta ADS unless told otherwise, as Istio's agent.
    assert_eq!(s.xds_mode, remora_xds::ads::Mode::Delta);
    // proxyMetadata acts as environment.
    assert_eq!(s.secret_ttl, Duration::from_secs(12 * 3600));
    assert_eq!(s.grace_period_ratio, 0.5);
    assert_eq!(
        s.spiffe_id(),
        "spiffe://cluster.local/ns/bookinfo/sa/bookinfo-reviews"
    );
    let n = &s.node;
    assert_eq!(
        n.id,
        "sidecar~10.1.2.3~reviews-v1-5b4c7d9f8-x2k4p.bookinfo~bookinfo.svc.cluster.local"
    );
    assert_eq!(n.cluster, "reviews-v1.bookinfo");
    let m = |k: &str| n.metadata.get(k).cloned().unwrap_or_default();
    assert_eq!(m("NAMESPACE"), "bookinfo");
    assert_eq!(m("SERVICE_ACCOUNT"), "bookinfo-reviews");
    assert_eq!(m("INSTANCE_IPS"), "10.1.2.3");
    assert_eq!(m("CLUSTER_ID"), "east");
    assert_eq!(m("INTERCEPTION_MODE"), "TPROXY");
    assert_eq!(m("MESH_ID"), "cluster.local");
    assert_eq!(m("WORKLOAD_NAME"), "reviews-v1");
    assert_eq!(m("ISTIO_VERSION"), node::ISTIO_VERSION);
    assert_eq!(m("DNS_CAPTURE"), "true");
    assert_eq!(m("LABELS")["version"], "v1");
    assert_eq!(m("POD_PORTS"), r#"[{"containerPort":9080}]"#);
    assert_eq!(
        m("PROXY_CONFIG")["discoveryAddress"],
        "istiod.istio-system.svc:15012"
    );
}

use super::super::node;

#[test]
fn proxy_config_in_yaml_and_the_environment_over_the_file() {
    let mut vars = env(&[
        (
            "PROXY_CONFIG",
            "discoveryAddress: istiod-canary.istio-system.svc:15012\nconcurrency: 2\n",
        ),
        ("CA_ADDR", "ca.example:443"),
        ("CA_ROOT_CA", "/etc/ca/root.pem"),
        ("SECRET_GRACE_PERIOD_RATIO", "0.8"),
        ("TRUST_DOMAIN", "example.org"),
    ]);
    let file = IstiodConfig {
        discovery_address: Some("file.example:15012".into()),
        ca_address: Some("file-ca.example:15012".into()),
        secret_ttl: Duration::from_secs(60),
        trust_domain: "file.org".into(),
        mesh_id: Some("mesh-from-file".into()),
        ..IstiodConfig::default()
    };
    let s = AgentSettings::resolve(&file, &vars).unwrap().unwrap();
    assert_eq!(s.discovery_address, "istiod-canary.istio-system.svc:15012");
    assert_eq!(s.ca_address, "ca.example:443");
    assert_eq!(s.ca_root_cert_file, PathBuf::from("/etc/ca/root.pem"));
    assert_eq!(
        s.xds_root_cert_file,
        PathBuf::from("/var/run/secrets/istio/root-cert.pem")
    );
    assert_eq!(s.grace_period_ratio, 0.8);
    assert_eq!(s.trust_domain, "example.org");
    // The file fills what the environment leaves unset.
    assert_eq!(s.secret_ttl, Duration::from_secs(60));
    assert_eq!(s.node.metadata["MESH_ID"], "mesh-from-file");
    // Without PROXY_CONFIG the file's address applies.
    vars.remove("PROXY_CONFIG");
    vars.remove("CA_ADDR");
    let s = AgentSettings::resolve(&file, &vars).unwrap().unwrap();
    assert_eq!(s.discovery_address, "file.example:15012");
    assert_eq!(s.ca_address, "file-ca.example:15012");
}

#[test]
fn proxy_config_without_an_address_means_istios_default() {
    let s = AgentSettings::resolve(&IstiodConfig::default(), &env(&[("PROXY_CONFIG", "{}")]))
        .unwrap()
        .unwrap();
    assert_eq!(s.discovery_address, DEFAULT_DISCOVERY_ADDRESS);
    assert_eq!(s.node.metadata["CLUSTER_ID"], "Kubernetes");
}

#[test]
fn bad_values_name_the_variable() {
    let file = IstiodConfig::default();
    let err = |pairs: &[(&str, &str)]| {
        AgentSettings::resolve(&file, &env(pairs))
            .unwrap_err()
            .to_string()
    };
    assert!(err(&[("PROXY_CONFIG", "[")]).contains("PROXY_CONFIG"));
    let e = err(&[("PROXY_CONFIG", "{}"), ("SECRET_TTL", "forever")]);
    assert!(e.contains("SECRET_TTL"), "{e}");
    let e = err(&[("PROXY_CONFIG", "{}"), ("SECRET_GRACE_PERIOD_RATIO", "2")]);
    assert!(e.contains("SECRET_GRACE_PERIOD_RATIO"), "{e}");
    let e = err(&[("PROXY_CONFIG", r#"{"discoveryAddress":"istiod"}"#)]);
    assert!(e.contains("discoveryAddress"), "{e}");
    let e = err(&[("PROXY_CONFIG", "{}"), ("ISTIO_DELTA_XDS", "maybe")]);
    assert!(e.contains("ISTIO_DELTA_XDS"), "{e}");
}

#[test]
fn istio_delta_xds_false_speaks_state_of_the_world_over_the_file() {
    let file = IstiodConfig::default();
    let sotw = env(&[("PROXY_CONFIG", "{}"), ("ISTIO_DELTA_XDS", "false")]);
    let s = AgentSettings::resolve(&file, &sotw).unwrap().unwrap();
    assert_eq!(s.xds_mode, remora_xds::ads::Mode::StateOfTheWorld);
    let file = IstiodConfig {
        delta_xds: false,
        ..IstiodConfig::default()
    };
    let s = AgentSettings::resolve(&file, &env(&[("PROXY_CONFIG", "{}")]))
        .unwrap()
        .unwrap();
    assert_eq!(s.xds_mode, remora_xds::ads::Mode::StateOfTheWorld);
    let delta = env(&[("PROXY_CONFIG", "{}"), ("ISTIO_DELTA_XDS", "true")]);
    let s = AgentSettings::resolve(&file, &delta).unwrap().unwrap();
    assert_eq!(s.xds_mode, remora_xds::ads::Mode::Delta);
}

#[test]
fn pod_labels_fill_in_when_the_environment_has_none() {
    let s = AgentSettings::resolve(&IstiodConfig::default(), &env(&[("PROXY_CONFIG", "{}")]))
        .unwrap()
        .unwrap();
    let labels = [("app".to_string(), "ratings".to_string())].into();
    let node = s.node.with_pod_labels(&labels);
    assert_eq!(node.metadata["LABELS"]["app"], "ratings");
}

#[test]
fn drain_duration_comes_from_proxy_config() {
    assert_eq!(drain_duration(None).unwrap(), None);
    assert_eq!(drain_duration(Some("{}")).unwrap(), None);
    assert_eq!(
        drain_duration(Some(r#"{"drainDuration":"2s"}"#)).unwrap(),
        Some(std::time::Duration::from_secs(2))
    );
    assert_eq!(
        drain_duration(Some("drainDuration: 1m30s\n")).unwrap(),
        Some(std::time::Duration::from_secs(90))
    );
    let e = drain_duration(Some(r#"{"drainDuration":"soon"}"#)).unwrap_err();
    assert!(e.to_string().contains("drainDuration"), "{e}");
}
