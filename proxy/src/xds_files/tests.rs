use super::*;

const CLUSTERS: &str = r#"[
  {"name": "outbound|80||a.default.svc.cluster.local", "type": "EDS",
   "eds_cluster_config": {"eds_config": {"ads": {}}}, "connect_timeout": "1s"},
  {"name": "odd", "type": "STATIC", "lb_policy": "LOAD_BALANCING_POLICY_CONFIG"},
  {"name": "bad", "type": "NOPE"}
]"#;

/// Every file read again, as at start, with its refusals.
fn sync(source: &mut Source, store: &Store, version: &str) -> Vec<Rejection> {
    let synced = source.sync(store, version);
    assert!(synced.errors.is_empty(), "{:?}", synced.errors);
    synced.refused
}

#[test]
fn a_directory_applies_with_refusals_named_and_the_rest_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("clusters.json"), CLUSTERS).expect("write");
    std::fs::write(
        dir.path().join("endpoints.yaml"),
        "- cluster_name: outbound|80||a.default.svc.cluster.local\n  endpoints:\n  - lb_endpoints:\n    - endpoint: {address: {socket_address: {address: 10.0.0.1, port_value: 80}}}\n",
    )
    .expect("write");
    let store = Store::new();
    let mut source = Source::new(dir.path().to_path_buf());
    let refused = sync(&mut source, &store, "1");
    let names: Vec<&str> = refused.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["bad", "odd"], "{refused:?}");
    assert!(refused[1].reason.contains("lb_policy"), "{refused:?}");
    let snap = store.snapshot();
    assert_eq!(snap.clusters.len(), 1);
    let cla = snap
        .endpoints("outbound|80||a.default.svc.cluster.local")
        .expect("endpoints");
    assert_eq!(cla.localities[0].endpoints.len(), 1);

    // A file that does not parse: nothing of it is applied, what is held stays; it is
    // not read again until it changes.
    std::fs::write(dir.path().join("clusters.json"), "[{").expect("write");
    let synced = source.sync(&store, "2");
    assert_eq!(synced.errors.len(), 1, "{synced:?}");
    assert_eq!(store.snapshot().clusters.len(), 1);
    assert_eq!(source.sync(&store, "2").files_read, 0);

    let mut missing = Source::new(dir.path().join("missing"));
    assert_eq!(missing.sync(&store, "1").errors.len(), 1);

    // Endpoints the file no longer holds go, though their cluster still wants them.
    std::fs::write(dir.path().join("clusters.json"), CLUSTERS).expect("write");
    std::fs::write(dir.path().join("endpoints.yaml"), "[]").expect("write");
    sync(&mut source, &store, "3");
    assert!(store
        .snapshot()
        .endpoints("outbound|80||a.default.svc.cluster.local")
        .is_none());

    // A removed resource goes (state of the world).
    std::fs::write(dir.path().join("clusters.json"), "[]").expect("write");
    let refused = sync(&mut source, &store, "4");
    assert!(refused.is_empty());
    assert!(store.snapshot().clusters.is_empty());
}

fn cla(cluster: &str, address: &str) -> Value {
    serde_json::json!({"cluster_name": cluster, "endpoints": [{"lb_endpoints": [{"endpoint":
        {"address": {"socket_address": {"address": address, "port_value": 80}}}}]}]})
}

fn eds(cluster: &str) -> Value {
    serde_json::json!({"name": cluster, "type": "EDS", "connect_timeout": "1s",
        "eds_cluster_config": {"eds_config": {"ads": {}}}})
}

/// A change applies what differs, not the whole file again: one moved endpoint is one
/// resource converted; an untouched resource keeps the version it came with.
#[test]
fn a_change_delivers_only_what_differs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |base: &str, v: &Value| {
        // Renamed over, as the benchmark and a ConfigMap update do.
        let tmp = dir.path().join(format!("{base}.tmp"));
        std::fs::write(&tmp, v.to_string()).expect("write");
        std::fs::rename(&tmp, dir.path().join(format!("{base}.json"))).expect("rename");
    };
    write(
        "clusters",
        &serde_json::json!([eds("a"), eds("b"), eds("c")]),
    );
    let endpoints =
        |a: &str| serde_json::json!([cla("a", a), cla("b", "10.0.0.2"), cla("c", "10.0.0.3")]);
    write("endpoints", &endpoints("10.0.0.1"));
    let store = Store::new();
    let mut source = Source::new(dir.path().to_path_buf());
    let first = source.sync(&store, "1");
    assert_eq!((first.files_read, first.delivered), (2, 6), "{first:?}");

    let idle = source.sync(&store, "2");
    assert_eq!((idle.files_read, idle.delivered), (0, 0), "{idle:?}");

    write("endpoints", &endpoints("10.0.0.9"));
    let moved = source.sync(&store, "3");
    assert_eq!((moved.files_read, moved.delivered), (1, 1), "{moved:?}");
    let snap = store.snapshot();
    let a = snap.endpoints("a").expect("a's endpoints");
    assert_eq!(
        a.localities[0].endpoints[0].address,
        "10.0.0.9:80".parse().expect("addr")
    );
    assert_eq!(snap.endpoints["a"].version, "3");
    assert_eq!(snap.endpoints["b"].version, "1");
    assert_eq!(snap.clusters["a"].version, "1");

    // Cluster b goes: its endpoints are pruned though the endpoints file is unchanged;
    // when b comes back, they are delivered again from that same file.
    write("clusters", &serde_json::json!([eds("a"), eds("c")]));
    let gone = source.sync(&store, "4");
    assert_eq!((gone.removed, gone.delivered), (1, 0), "{gone:?}");
    assert!(!store.snapshot().endpoints.contains_key("b"));
    assert!(store.snapshot().endpoints("b").is_none());
    write(
        "clusters",
        &serde_json::json!([eds("a"), eds("b"), eds("c")]),
    );
    let back = source.sync(&store, "5");
    assert_eq!(back.delivered, 2, "b and its endpoints: {back:?}");
    assert!(store.snapshot().endpoints("b").is_some());
}

/// Envoy's JSON names each resource's type (`@type`, as config dumps and istiod's tools
/// write it): the kind's own type is read, another is refused by name.
#[test]
fn resources_with_their_any_type_are_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("clusters.json"),
        r#"[
          {"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
           "name": "typed", "type": "STATIC", "connect_timeout": "1s"},
          {"@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
           "name": "mistyped"}
        ]"#,
    )
    .expect("write");
    let store = Store::new();
    let refused = sync(&mut Source::new(dir.path().to_path_buf()), &store, "1");
    let names: Vec<&str> = refused.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["mistyped"], "{refused:?}");
    assert!(refused[0].reason.contains("not a cluster"), "{refused:?}");
    assert!(store.snapshot().cluster("typed").is_some());
}

#[test]
fn a_name_table_file_is_istiods_name_table() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("name_tables.json"),
        r#"[{"table": {"api.example.com": {"ips": ["240.240.0.1"], "registry": "External"}}}]"#,
    )
    .expect("write");
    let store = Store::new();
    let mut source = Source::new(dir.path().to_path_buf());
    assert!(sync(&mut source, &store, "1").is_empty());
    let snap = store.snapshot();
    let table = snap.name_table().expect("a name table");
    assert_eq!(
        table.model.hosts["api.example.com"].ips,
        vec!["240.240.0.1".parse::<std::net::IpAddr>().expect("ip")]
    );
    // A bad address is refused by field; the table in force stays.
    std::fs::write(
        dir.path().join("name_tables.json"),
        r#"[{"table": {"api.example.com": {"ips": ["nope"]}}}]"#,
    )
    .expect("write");
    let refused = source.sync(&store, "2").refused;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].reason.contains("table[api.example.com].ips[0]"),
        "{refused:?}"
    );
    assert!(Arc::ptr_eq(
        store.snapshot().name_table().expect("kept"),
        snap.name_table().expect("first")
    ));
}

/// Watched, not polled: a file renamed into place (as a ConfigMap update or `mv` does) is
/// applied at once though the polling interval is an hour.
#[tokio::test]
async fn a_file_renamed_into_place_is_applied_without_waiting_for_a_poll() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |base: &str, v: &Value| {
        let tmp = dir.path().join(format!(".{base}.json.tmp"));
        std::fs::write(&tmp, v.to_string()).expect("write");
        std::fs::rename(&tmp, dir.path().join(format!("{base}.json"))).expect("rename");
    };
    write("clusters", &serde_json::json!([eds("a")]));
    write("endpoints", &serde_json::json!([cla("a", "10.0.0.1")]));
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let hour = Duration::from_secs(3600);
    let watcher = Watcher::start(dir.path().to_path_buf(), hour, &metrics).expect("start");
    let store = Arc::clone(&watcher.store);
    let address = || {
        store
            .snapshot()
            .endpoints("a")
            .map(|a| a.localities[0].endpoints[0].address)
    };
    assert_eq!(address(), Some("10.0.0.1:80".parse().expect("addr")));
    let task = tokio::spawn(watcher.watch());
    write("endpoints", &serde_json::json!([cla("a", "10.0.0.9")]));
    let moved = Some("10.0.0.9:80".parse().expect("addr"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while address() != moved && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
    assert_eq!(address(), moved, "the renamed file was not applied");
}

#[test]
fn secrets_for_the_clusters_come_from_their_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = serde_json::json!([{"name": "outbound|443||api.example.com", "type": "STATIC",
        "connect_timeout": "1s",
        "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {"validation_context_sds_secret_config":
                {"name": "kubernetes://api-cacert", "sds_config": {"ads": {}}}}}}}]);
    std::fs::write(dir.path().join("clusters.json"), cluster.to_string()).expect("write");
    let ca = rcgen::generate_simple_self_signed(vec!["api.example.com".to_string()])
        .expect("certificate")
        .cert
        .pem();
    let secret = |name: &str| {
        use base64::Engine;
        serde_json::json!({"name": name, "validation_context": {"trusted_ca":
            {"inline_bytes": base64::engine::general_purpose::STANDARD.encode(&ca)}}})
    };
    let secrets = serde_json::json!([
        secret("kubernetes://api-cacert"),
        secret("kubernetes://unused")
    ]);
    std::fs::write(dir.path().join("secrets.json"), secrets.to_string()).expect("write");
    let store = Store::new();
    let mut source = Source::new(dir.path().to_path_buf());
    assert!(sync(&mut source, &store, "1").is_empty());
    let snapshot = store.snapshot();
    assert!(snapshot.secret("kubernetes://api-cacert").is_some());
    // Clusters applied again prune what none names, as for endpoints.
    let mut renamed = cluster.clone();
    renamed[0]["name"] = serde_json::json!("outbound|443||other.example.com");
    std::fs::write(dir.path().join("clusters.json"), renamed.to_string()).expect("write");
    assert!(sync(&mut source, &store, "2").is_empty());
    let snapshot = store.snapshot();
    assert!(snapshot.secret("kubernetes://api-cacert").is_some());
    assert!(snapshot.secret("kubernetes://unused").is_none());
}
