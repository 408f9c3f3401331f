use crate::convert::from_json;
use crate::model::cluster::{
    CommonLb, Discovery, DnsLookupFamily, LbPolicy, TransportSocket, UpstreamHttpProtocol,
};
use crate::model::Cluster;
use serde_json::{json, Value};

type ClusterProto = envoy_types::pb::envoy::config::cluster::v3::Cluster;

fn convert(v: Value) -> Result<Cluster, String> {
    from_json::<ClusterProto>(&v)
        .map(|c| c.model)
        .map_err(|r| r.to_string())
}

fn unlimited() -> Value {
    json!({"thresholds": [{"max_connections": 4294967295u32, "max_pending_requests": 4294967295u32,
        "max_requests": 4294967295u32, "max_retries": 4294967295u32, "track_remaining": true}]})
}

#[test]
fn istiods_passthrough_and_blackhole_clusters() {
    let passthrough = convert(json!({
        "name": "PassthroughCluster", "type": "ORIGINAL_DST", "connect_timeout": "10s",
        "lb_policy": "CLUSTER_PROVIDED", "circuit_breakers": unlimited(),
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "common_http_protocol_options": {"idle_timeout": "3600s"},
            "use_downstream_protocol_config": {"http_protocol_options": {}, "http2_protocol_options": {}}
        }}
    }))
    .expect("accepted");
    assert_eq!(
        passthrough.discovery,
        Discovery::OriginalDst {
            port_override: None,
            use_http_header: false
        }
    );
    assert_eq!(passthrough.lb_policy, LbPolicy::ClusterProvided);
    assert_eq!(passthrough.http_protocol, UpstreamHttpProtocol::Downstream);
    assert_eq!(
        passthrough.http_idle_timeout,
        Some(std::time::Duration::from_secs(3600))
    );
    let inbound = convert(json!({
        "name": "InboundPassthroughCluster", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
        "upstream_bind_config": {"source_address": {"address": "127.0.0.6", "port_value": 0}},
        "original_dst_lb_config": {"upstream_port_override": 8080}
    }))
    .expect("accepted");
    assert_eq!(
        inbound.upstream_bind_address,
        Some("127.0.0.6".parse().expect("ip"))
    );
    assert_eq!(
        inbound.discovery,
        Discovery::OriginalDst {
            port_override: Some(8080),
            use_http_header: false
        }
    );
    let blackhole =
        convert(json!({"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}))
            .expect("accepted");
    assert_eq!(blackhole.discovery, Discovery::Static);
    // Envoy's default policy when unset.
    assert_eq!(blackhole.lb_policy, LbPolicy::RoundRobin);
    assert_eq!(blackhole.transport_socket, TransportSocket::Plaintext);
}

#[test]
fn dns_clusters_keep_their_names() {
    let c = convert(json!({
        "name": "outbound|443||api.example.com", "type": "STRICT_DNS", "dns_lookup_family": "V4_ONLY",
        "respect_dns_ttl": true, "dns_refresh_rate": "60s", "lb_policy": "RANDOM",
        "load_assignment": {"cluster_name": "outbound|443||api.example.com", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "api.example.com", "port_value": 443}}},
             "load_balancing_weight": 1}]}]}
    }))
    .expect("accepted");
    let Discovery::StrictDns(dns) = &c.discovery else {
        panic!("{:?}", c.discovery)
    };
    assert_eq!(dns.targets[0].host, "api.example.com");
    assert_eq!(dns.targets[0].port, 443);
    assert_eq!(dns.lookup_family, DnsLookupFamily::V4Only);
    assert!(dns.respect_dns_ttl);
    assert_eq!(dns.refresh_jitter, std::time::Duration::ZERO);
    assert!(c.load_assignment.is_none());
    assert_eq!(c.lb_policy, LbPolicy::Random);
    // A target keeps its entry's locality, priority and weight (istiod's failover applies).
    let c = convert(json!({
        "name": "d", "type": "STRICT_DNS",
        "load_assignment": {"cluster_name": "d", "endpoints": [
            {"locality": {"region": "r1", "zone": "z1"}, "priority": 1, "load_balancing_weight": 7,
             "lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "a.example.com", "port_value": 443}}}}]}]}
    }))
    .expect("accepted");
    let Discovery::StrictDns(dns) = &c.discovery else {
        panic!("{:?}", c.discovery)
    };
    let t = &dns.targets[0];
    assert_eq!(
        (t.locality.zone.as_str(), t.priority, t.locality_weight),
        ("z1", 1, Some(7))
    );
}

#[test]
fn unsupported_policies_are_refused() {
    let err = convert(json!({"name": "c", "type": "EDS"})).expect_err("refused");
    assert!(err.contains("only ADS endpoint sources"), "{err}");
    let err = convert(json!({"name": "c", "lb_policy": "LOAD_BALANCING_POLICY_CONFIG"}))
        .expect_err("refused");
    assert!(
        err.contains("LOAD_BALANCING_POLICY_CONFIG not supported"),
        "{err}"
    );
    let err = convert(json!({"name": "c", "lb_policy": "CLUSTER_PROVIDED"})).expect_err("refused");
    assert!(err.contains("lb_policy"), "{err}");
    let err = convert(json!({"name": "c", "transport_socket": {"name": "tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": {"tls_certificate_sds_secret_configs": [{"name": "kubernetes://my-cert"}]}}}}))
    .expect_err("refused");
    assert!(
        err.contains("\"kubernetes://my-cert\" not supported"),
        "{err}"
    );
    let err = convert(
        json!({"name": "c", "transport_socket": {"name": "tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": {"tls_params": {"tls_maximum_protocol_version": "TLSv1_2"}}}}}),
    )
    .expect_err("refused");
    assert!(err.contains("maximum TLS version below 1.3"), "{err}");
    // HttpProtocolOptions: an upstream stream limit (DestinationRule `maxConcurrentStreams`)
    // is kept; Envoy's default is none; 0 is refused, as Envoy refuses it.
    let streams = |n: u32| {
        convert(json!({"name": "c", "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {"max_concurrent_streams": n}}}}}))
    };
    let limited = streams(100).expect("a stream limit is honoured");
    assert_eq!(limited.http2_max_concurrent_streams, Some(100));
    let default = streams(2_147_483_647).expect("Envoy's default");
    assert_eq!(default.http2_max_concurrent_streams, None);
    let err = streams(0).expect_err("refused");
    assert!(
        err.contains("http2_protocol_options.max_concurrent_streams") && err.contains("at least 1"),
        "{err}"
    );
    let err = convert(json!({"name": "c", "typed_extension_protocol_options": {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {"allow_connect": true}}}}}))
    .expect_err("refused");
    assert!(
        err.contains("http2_protocol_options.allow_connect"),
        "{err}"
    );
}

#[test]
fn istiods_common_lb_config_alt_stat_name_and_cares_options() {
    let c = convert(json!({
        "name": "outbound|443||api.example.com", "type": "STRICT_DNS", "alt_stat_name": "outbound|443||api.example.com;",
        "common_lb_config": {"healthy_panic_threshold": {"value": 50}},
        "typed_dns_resolver_config": {"name": "envoy.network.dns_resolver.cares", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig",
            "udp_max_queries": 100, "use_resolvers_as_fallback": true}}
    }))
    .expect("accepted");
    assert_eq!(
        c.alt_stat_name.as_deref(),
        Some("outbound|443||api.example.com;")
    );
    assert_eq!(c.common_lb.healthy_panic_threshold, Some(50.0));
    assert!(!c.common_lb.locality_weighted);
    let plain = convert(json!({"name": "c", "common_lb_config": {}})).expect("accepted");
    assert_eq!(plain.alt_stat_name, None);
    assert_eq!(plain.common_lb, CommonLb::default());
}

#[test]
fn what_changes_balancing_or_resolution_is_refused_by_name() {
    let refused = |v: Value| convert(v).expect_err("refused");
    let err = refused(json!({"name": "c", "common_lb_config": {"zone_aware_lb_config": {}}}));
    assert!(
        err.contains("common_lb_config.zone_aware_lb_config: field not supported"),
        "{err}"
    );
    let err = refused(json!({"name": "c", "common_lb_config": {"update_merge_window": "1s"}}));
    assert!(
        err.contains("common_lb_config.update_merge_window: field not supported"),
        "{err}"
    );
    let err = refused(
        json!({"name": "c", "common_lb_config": {"healthy_panic_threshold": {"value": 150}}}),
    );
    assert!(err.contains("not a percentage"), "{err}");
    // istiod's 0 (with outlier detection) disables panic mode; any percentage is kept.
    let zero = convert(
        json!({"name": "c", "common_lb_config": {"healthy_panic_threshold": {"value": 0}}}),
    )
    .expect("accepted");
    assert_eq!(zero.common_lb.healthy_panic_threshold, Some(0.0));
    let some = convert(
        json!({"name": "c", "common_lb_config": {"healthy_panic_threshold": {"value": 25.5}}}),
    )
    .expect("accepted");
    assert_eq!(some.common_lb.healthy_panic_threshold, Some(25.5));
    // Locality weights (a `distribute` setting) are honoured, but not with a hashing policy.
    let weighted =
        convert(json!({"name": "c", "common_lb_config": {"locality_weighted_lb_config": {}}}))
            .expect("accepted");
    assert!(weighted.common_lb.locality_weighted);
    // An overprovisioning factor of 0 (Envoy's validation refuses it) would make every
    // priority unhealthy.
    let err = refused(json!({"name": "c", "type": "STATIC", "load_assignment": {
        "cluster_name": "c", "policy": {"overprovisioning_factor": 0}, "endpoints": []}}));
    assert!(
        err.contains("overprovisioning_factor") && err.contains("must be above 0"),
        "{err}"
    );
    // A weight of 0, an endpoint's or a locality's, is refused as Envoy's proto constraints
    // refuse it (at least 1), naming where it is.
    let endpoint = |weight: u32| {
        json!({"endpoint": {"address": {"socket_address": {"address": "10.0.0.1", "port_value": 80}}},
            "load_balancing_weight": weight})
    };
    for (locality, host, at) in [
        (
            1,
            0,
            "load_assignment.endpoints[0].lb_endpoints[0].load_balancing_weight",
        ),
        (0, 1, "load_assignment.endpoints[0].load_balancing_weight"),
    ] {
        let err = refused(json!({"name": "c", "type": "STATIC", "load_assignment": {
            "cluster_name": "c", "endpoints": [{"load_balancing_weight": locality,
                "lb_endpoints": [endpoint(host)]}]}}));
        assert!(
            err.contains(at) && err.contains("must be at least 1"),
            "{err}"
        );
    }
    for policy in ["RING_HASH", "MAGLEV"] {
        let err = refused(json!({"name": "c", "lb_policy": policy,
            "common_lb_config": {"locality_weighted_lb_config": {}}}));
        assert!(
            err.contains("locality-weighted balancing with RING_HASH or MAGLEV not supported"),
            "{err}"
        );
    }
    let cares = |extra: Value| {
        let mut t = json!({"@type": "type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig"});
        t.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        json!({"name": "c", "type": "STRICT_DNS", "typed_dns_resolver_config": {
            "name": "envoy.network.dns_resolver.cares", "typed_config": t}})
    };
    let err = refused(cares(
        json!({"resolvers": [{"socket_address": {"address": "8.8.8.8", "port_value": 53}}]}),
    ));
    assert!(
        err.contains("typed_dns_resolver_config.typed_config.resolvers")
            && err.contains("custom DNS resolvers not supported"),
        "{err}"
    );
    let err = refused(cares(
        json!({"dns_resolver_options": {"no_default_search_domain": true}}),
    ));
    assert!(err.contains("no_default_search_domain"), "{err}");
    let err = refused(cares(json!({"filter_unroutable_families": true})));
    assert!(err.contains("filter_unroutable_families"), "{err}");
    let err = refused(
        json!({"name": "c", "type": "STRICT_DNS", "typed_dns_resolver_config": {
        "name": "envoy.network.dns_resolver.getaddrinfo", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.network.dns_resolver.getaddrinfo.v3.GetAddrInfoDnsResolverConfig"}}}),
    );
    assert!(
        err.contains("DNS resolver \"envoy.network.dns_resolver.getaddrinfo\" not supported"),
        "{err}"
    );
}

#[test]
fn least_request_choice_count_and_typed_sans() {
    let c = convert(json!({
        "name": "c", "type": "EDS", "eds_cluster_config": {"eds_config": {"ads": {}}},
        "lb_policy": "LEAST_REQUEST", "least_request_lb_config": {"choice_count": 3},
        "transport_socket_matches": [{"name": "tlsMode-istio", "match": {"tlsMode": "istio"}, "transport_socket": {
            "name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "sni": "outbound_.80_._.c",
            "common_tls_context": {
                "alpn_protocols": ["istio-peer-exchange", "istio"],
                "tls_certificate_sds_secret_configs": [{"name": "default", "sds_config": {"ads": {}}}],
                "combined_validation_context": {
                    "default_validation_context": {"match_typed_subject_alt_names": [
                        {"san_type": "URI", "matcher": {"exact": "spiffe://cluster.local/ns/default/sa/c"}}]},
                    "validation_context_sds_secret_config": {"name": "ROOTCA", "sds_config": {"ads": {}}}}}}}}]
    }))
    .expect("accepted");
    assert_eq!(c.lb_policy, LbPolicy::LeastRequest { choice_count: 3 });
    assert_eq!(c.eds_service_name(), Some("c"));
    let tls = c.istio_mtls().expect("mTLS");
    assert_eq!(
        tls.subject_alt_names[0].san_type,
        Some(crate::model::cluster::SanType::Uri)
    );
    assert_eq!(
        tls.validation_secret,
        Some(crate::model::cluster::SdsSecret::MeshRoots)
    );
}

#[test]
fn consistent_hash_policies_with_envoy_defaults_and_bounds() {
    let c = convert(json!({"name": "c", "lb_policy": "RING_HASH"})).expect("ring");
    assert_eq!(
        c.lb_policy,
        LbPolicy::RingHash {
            minimum_ring_size: 1024,
            maximum_ring_size: 8 * 1024 * 1024
        }
    );
    let c = convert(json!({"name": "c", "lb_policy": "RING_HASH",
        "ring_hash_lb_config": {"minimum_ring_size": "2048", "maximum_ring_size": "4096", "hash_function": "XX_HASH"}}))
    .expect("ring");
    assert_eq!(
        c.lb_policy,
        LbPolicy::RingHash {
            minimum_ring_size: 2048,
            maximum_ring_size: 4096
        }
    );
    let c = convert(json!({"name": "c", "lb_policy": "MAGLEV"})).expect("maglev");
    assert_eq!(c.lb_policy, LbPolicy::Maglev { table_size: 65537 });
    let c = convert(
        json!({"name": "c", "lb_policy": "MAGLEV", "maglev_lb_config": {"table_size": "251"}}),
    )
    .expect("maglev");
    assert_eq!(c.lb_policy, LbPolicy::Maglev { table_size: 251 });
    for (cluster, refusal) in [
        (
            json!({"name": "c", "lb_policy": "RING_HASH", "ring_hash_lb_config": {"hash_function": "MURMUR_HASH_2"}}),
            "ring_hash_lb_config.hash_function: MURMUR_HASH_2 not supported",
        ),
        (
            json!({"name": "c", "lb_policy": "RING_HASH", "ring_hash_lb_config": {"minimum_ring_size": "5000", "maximum_ring_size": "100"}}),
            "ring_hash_lb_config.minimum_ring_size: 5000 is over maximum_ring_size 100",
        ),
        (
            json!({"name": "c", "lb_policy": "RING_HASH", "ring_hash_lb_config": {"maximum_ring_size": "9000000"}}),
            "ring_hash_lb_config.maximum_ring_size: must be in",
        ),
        (
            json!({"name": "c", "lb_policy": "MAGLEV", "maglev_lb_config": {"table_size": "1000"}}),
            "maglev_lb_config.table_size: 1000 is not a prime",
        ),
        (
            json!({"name": "c", "lb_policy": "ROUND_ROBIN", "maglev_lb_config": {"table_size": "251"}}),
            "lb_config: LB config does not fit the LB policy",
        ),
        (
            json!({"name": "c", "lb_policy": "MAGLEV", "ring_hash_lb_config": {}}),
            "lb_config: LB config does not fit the LB policy",
        ),
    ] {
        let err = convert(cluster).expect_err("refused");
        assert!(err.contains(refusal), "{err} / {refusal}");
    }
}

#[test]
fn the_eds_initial_fetch_timeout_is_read() {
    use std::time::Duration;
    let with = |eds_config: Value| {
        convert(
            json!({"name": "c", "type": "EDS", "eds_cluster_config": {"eds_config": eds_config}}),
        )
        .expect("accepted")
        .eds_wait()
        .map(|(_, timeout)| timeout)
    };
    assert_eq!(
        with(json!({"ads": {}})),
        Some(Some(Duration::from_secs(15))),
        "Envoy's default"
    );
    assert_eq!(
        with(json!({"ads": {}, "initial_fetch_timeout": "2.5s"})),
        Some(Some(Duration::from_millis(2500)))
    );
    assert_eq!(
        with(json!({"ads": {}, "initial_fetch_timeout": "0s"})),
        Some(None),
        "istiod's: for ever"
    );
    let err = convert(
        json!({"name": "c", "type": "EDS", "eds_cluster_config": {"eds_config":
        {"ads": {}, "initial_fetch_timeout": "-1s"}}}),
    )
    .expect_err("refused");
    assert!(
        err.contains("eds_cluster_config.eds_config.initial_fetch_timeout"),
        "{err}"
    );
}
