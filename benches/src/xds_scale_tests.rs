use super::*;
use remora_xds::refusal::Kind;
use remora_xds::validate::validate_one;

fn files() -> Sources {
    Sources::Files {
        routes: PathBuf::from("/x/rds.json"),
        cert: PathBuf::from("/x/default.json"),
        root: PathBuf::from("/x/rootca.json"),
    }
}

#[test]
fn counts_follow_the_service_mix() {
    let r = generate(100, 15001, &Sources::Ads);
    // 100 services + PassthroughCluster + BlackHoleCluster.
    assert_eq!(r.clusters.len(), 102);
    assert_eq!(r.endpoints.len(), 100);
    // One in ten is TCP with its own VIP listener, plus 0.0.0.0_8080 and virtualOutbound.
    assert_eq!(r.listeners.len(), 10 + 2);
    assert_eq!(r.routes.len(), 1);
    // 90 HTTP services + allow_any.
    assert_eq!(
        r.routes[0]["virtual_hosts"].as_array().map(Vec::len),
        Some(91)
    );
    let sizes: Vec<usize> = r
        .endpoints
        .iter()
        .map(|e| {
            e["endpoints"][0]["lb_endpoints"]
                .as_array()
                .map_or(0, Vec::len)
        })
        .collect();
    assert!(sizes.iter().all(|n| (2..=3).contains(n)), "{sizes:?}");
}

#[test]
fn names_and_addresses_are_istiods_and_unique() {
    let s = Service::new(9);
    assert!(!s.http);
    assert_eq!(
        s.cluster_name(),
        "outbound|3306||svc-9.ns.svc.cluster.local"
    );
    let s = Service::new(1234);
    assert_eq!(
        s.cluster_name(),
        "outbound|8080||svc-1234.ns.svc.cluster.local"
    );
    let r = generate(10_000, 15001, &Sources::Ads);
    let mut vips: Vec<String> = (0..10_000).map(|i| Service::new(i).vip).collect();
    vips.sort();
    vips.dedup();
    assert_eq!(vips.len(), 10_000);
    let mut ips: Vec<String> = r
        .endpoints
        .iter()
        .flat_map(|e| {
            e["endpoints"][0]["lb_endpoints"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|e| e["endpoint"]["address"]["socket_address"]["address"].to_string())
        .collect();
    let all = ips.len();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), all, "pod IPs repeat");
    let vh = &r.routes[0]["virtual_hosts"][0];
    assert_eq!(vh["name"], "svc-0.ns.svc.cluster.local:8080");
    let domains: Vec<&str> = vh["domains"]
        .as_array()
        .map(|d| d.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for d in [
        "svc-0",
        "svc-0:8080",
        "svc-0.ns",
        "svc-0.ns.svc.cluster.local",
        "10.96.0.1:8080",
    ] {
        assert!(domains.contains(&d), "{d} missing from {domains:?}");
    }
    let tls = &r.clusters[0]["transport_socket_matches"][0]["transport_socket"]["typed_config"];
    assert_eq!(tls["sni"], "outbound_.8080_._.svc-0.ns.svc.cluster.local");
}

#[test]
fn an_endpoint_change_moves_one_address() {
    let s = Service::new(0);
    let (a, b) = (endpoints(&s, 0), endpoints(&s, 1));
    let addr = |v: &Value, k: usize| {
        v["endpoints"][0]["lb_endpoints"][k]["endpoint"]["address"]["socket_address"]["address"]
            .clone()
    };
    assert_ne!(addr(&a, 0), addr(&b, 0));
    assert_eq!(addr(&a, 1), addr(&b, 1));
}

/// Remora's own validator (what `remora xds validate` runs) accepts every resource given to
/// Remora: a refusal here would make the benchmark measure less than the full config.
#[test]
fn remora_accepts_every_resource() {
    let r = generate(50, 15001, &Sources::Ads);
    let kinds = [
        (Kind::Cluster, &r.clusters),
        (Kind::Endpoint, &r.endpoints),
        (Kind::Listener, &r.listeners),
        (Kind::Route, &r.routes),
    ];
    let refused: Vec<String> = kinds
        .iter()
        .flat_map(|(kind, list)| list.iter().map(|v| validate_one(*kind, v)))
        .filter(|v| v.refusal.is_some())
        .map(|v| v.to_string())
        .collect();
    assert!(refused.is_empty(), "{refused:#?}");
}

#[test]
fn envoys_copy_differs_only_in_its_sources() {
    let ads = generate(20, 15001, &Sources::Ads);
    let envoy = generate(20, 15001, &files());
    // Clusters: STATIC with the same assignment inline instead of EDS; secrets from files.
    let c = &envoy.clusters[0];
    assert_eq!(c["type"], "STATIC");
    assert!(c.get("eds_cluster_config").is_none());
    assert_eq!(
        c["load_assignment"]["endpoints"],
        ads.endpoints[0]["endpoints"]
    );
    let sds = &c["transport_socket_matches"][0]["transport_socket"]["typed_config"]
        ["common_tls_context"]["tls_certificate_sds_secret_configs"][0];
    assert_eq!(sds["name"], "default");
    assert_eq!(
        sds["sds_config"]["path_config_source"]["path"],
        "/x/default.json"
    );
    let strip = |mut v: Value| {
        if let Some(m) = v.as_object_mut() {
            for k in [
                "type",
                "eds_cluster_config",
                "load_assignment",
                "transport_socket_matches",
            ] {
                m.remove(k);
            }
        }
        v
    };
    assert_eq!(strip(c.clone()), strip(ads.clusters[0].clone()));
    // Routes identical; listeners differ only in the RDS source.
    assert_eq!(envoy.routes, ads.routes);
    assert_eq!(envoy.listeners.len(), ads.listeners.len());
    let rds = |r: &Resources| {
        r.listeners
            .iter()
            .find(|l| l["name"] == "0.0.0.0_8080")
            .expect("http listener")["filter_chains"][0]["filters"][0]["typed_config"]["rds"]
            ["config_source"]
            .clone()
    };
    assert_eq!(rds(&envoy)["path_config_source"]["path"], "/x/rds.json");
    assert!(rds(&ads).get("ads").is_some());
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("remora-benches-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// The directory as the scenario writes it, through Remora's own file loader (what
/// `xds.resources_dir` runs at start): every resource applied, none refused.
#[test]
fn remoras_file_loader_applies_the_whole_directory() {
    let dir = scratch("xds-dir");
    let r = generate(30, 15001, &Sources::Ads);
    write_remora_dir(&dir, &r).expect("written");
    let store = remora_xds::store::Store::new();
    let synced = remora::xds_files::Source::new(dir.clone()).sync(&store, "1");
    assert!(synced.errors.is_empty(), "{:#?}", synced.errors);
    assert!(synced.refused.is_empty(), "{:#?}", synced.refused);
    let snap = store.snapshot();
    assert_eq!(snap.clusters.len(), r.clusters.len());
    assert_eq!(snap.listeners.len(), r.listeners.len());
    assert_eq!(snap.routes.len(), 1);
    assert_eq!(snap.endpoints.len(), r.endpoints.len());
    let _ = std::fs::remove_dir_all(&dir);
}
