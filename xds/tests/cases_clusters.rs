//! The cluster and endpoint cases of `xds/tests/cases/` through `remora_xds`: DestinationRule
//! subsets with their own load balancers and Istio mTLS (SNI and SANs per subset), EDS
//! endpoints with `tlsMode`, and ServiceEntry clusters resolved by DNS or given statically.

mod cases_support;

use cases_support::*;
use remora_xds::model::cluster::{
    Cluster, Discovery, DnsLookupFamily, LbPolicy, SanMatcher, SdsSecret, TlsVersion,
    TransportSocket, UpstreamHttpProtocol, DEFAULT_CONNECT_TIMEOUT,
};
use remora_xds::model::endpoint::Health;
use remora_xds::model::matcher::StringMatcher;
use remora_xds::snapshot::Snapshot;
use std::sync::Arc;
use std::time::Duration;

const REVIEWS: &str = "reviews.default.svc.cluster.local";

fn reviews(subset: &str) -> String {
    format!("outbound|9080|{subset}|{REVIEWS}")
}

fn cluster(snap: &Snapshot, name: &str) -> Arc<Cluster> {
    snap.cluster(name)
        .cloned()
        .unwrap_or_else(|| panic!("no cluster {name}"))
}

#[test]
fn subsets_keep_their_load_balancer_and_pool() {
    let snap = snapshot("traffic-split");
    let lb = |subset: &str| cluster(&snap, &reviews(subset)).lb_policy;
    // ROUND_ROBIN and RANDOM as the DestinationRule's subsets say; LEAST_REQUEST, istiod's
    // default, with Envoy's two choices.
    assert_eq!(lb("v1"), LbPolicy::RoundRobin);
    assert_eq!(lb("v2"), LbPolicy::Random);
    assert_eq!(lb("v3"), LbPolicy::LeastRequest { choice_count: 2 });
    assert_eq!(lb(""), LbPolicy::LeastRequest { choice_count: 2 });
    assert_eq!(
        cluster(&snap, "PassthroughCluster").lb_policy,
        LbPolicy::ClusterProvided
    );

    for subset in ["", "v1", "v2", "v3"] {
        let c = cluster(&snap, &reviews(subset));
        assert_eq!(
            c.discovery,
            Discovery::Eds {
                service_name: reviews(subset),
                // istiod's `0s`: the cluster waits for its endpoints for ever.
                initial_fetch_timeout: None,
            }
        );
        assert_eq!(c.connect_timeout, Duration::from_secs(10));
        assert_ne!(c.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(
            c.istio.subset.as_deref(),
            (!subset.is_empty()).then_some(subset)
        );
        assert_eq!(c.istio.default_original_port, Some(9080));
        assert_eq!(c.istio.services.len(), 1);
        assert_eq!(c.istio.services[0].host, REVIEWS);
        let dr = "/apis/networking.istio.io/v1alpha3/namespaces/default/destination-rule/reviews";
        assert_eq!(
            c.istio.config.as_deref(),
            (!subset.is_empty()).then_some(dr)
        );
    }
    // v2's connectionPool.http: idleTimeout 1h, maxRequestsPerConnection 10, HTTP/1.1.
    let v2 = cluster(&snap, &reviews("v2"));
    assert_eq!(v2.http_idle_timeout, Some(Duration::from_secs(3600)));
    assert_eq!(v2.max_requests_per_connection, Some(10));
    assert_eq!(v2.http_protocol, UpstreamHttpProtocol::Http1);
    let v1 = cluster(&snap, &reviews("v1"));
    assert_eq!(
        (v1.http_idle_timeout, v1.max_requests_per_connection),
        (None, None)
    );
    let pass = cluster(&snap, "PassthroughCluster");
    assert_eq!(pass.http_protocol, UpstreamHttpProtocol::Downstream);
}

#[test]
fn each_subset_has_its_own_sni_and_the_service_account_sans() {
    let snap = snapshot("traffic-split");
    for subset in ["", "v1", "v2", "v3"] {
        let c = cluster(&snap, &reviews(subset));
        let tls = c
            .istio_mtls()
            .unwrap_or_else(|| panic!("{subset}: no mTLS"));
        assert_eq!(
            tls.sni.as_deref(),
            Some(format!("outbound_.9080_.{subset}_.{REVIEWS}").as_str())
        );
        assert_eq!(
            tls.subject_alt_names,
            [SanMatcher {
                san_type: None,
                matcher: StringMatcher::exact(
                    "spiffe://cluster.local/ns/default/sa/bookinfo-reviews"
                ),
            }]
        );
        assert_eq!(tls.alpn, ["istio-peer-exchange", "istio"]);
        assert_eq!(tls.certificate_secret, Some(SdsSecret::Workload));
        assert_eq!(tls.validation_secret, Some(SdsSecret::MeshRoots));
        assert_eq!(
            (tls.min_version, tls.max_version),
            (Some(TlsVersion::Tls1_2), Some(TlsVersion::Tls1_3))
        );
        // An endpoint without `tlsMode: istio` (no sidecar) gets plaintext.
        assert_eq!(c.transport_socket_for(None), &TransportSocket::Plaintext);
        assert_eq!(
            c.transport_socket_for(Some("disabled")),
            &TransportSocket::Plaintext
        );
        assert!(matches!(
            c.transport_socket_for(Some("istio")),
            TransportSocket::Tls(_)
        ));
    }
}

#[test]
fn subset_endpoints_carry_tls_mode_locality_weight_and_health() {
    let snap = snapshot("traffic-split");
    let v1 = snap
        .endpoints(&reviews("v1"))
        .expect("v1's endpoints from EDS");
    let eps: Vec<_> = v1.endpoints().collect();
    assert_eq!(eps.len(), 2);
    let (loc, pod) = eps[0];
    assert_eq!(
        (loc.locality.region.as_str(), loc.locality.zone.as_str()),
        ("us-east1", "us-east1-b")
    );
    assert_eq!(loc.weight, Some(2));
    assert_eq!(pod.address, "10.244.0.11:9080".parse().expect("address"));
    assert_eq!(pod.tls_mode.as_deref(), Some("istio"));
    let w = pod.workload.as_ref().expect("workload metadata");
    assert_eq!(
        (w.name.as_str(), w.canonical_revision.as_str()),
        ("reviews-v1", "v1")
    );
    let (_, vm) = eps[1];
    assert_eq!((vm.tls_mode.as_deref(), vm.workload.as_ref()), (None, None));
    // Which socket each endpoint gets: mTLS for the pod, plaintext for the VM.
    let c = cluster(&snap, &reviews("v1"));
    assert!(matches!(
        c.transport_socket_for(pod.tls_mode.as_deref()),
        TransportSocket::Tls(_)
    ));
    assert_eq!(
        c.transport_socket_for(vm.tls_mode.as_deref()),
        &TransportSocket::Plaintext
    );

    let v2 = snap.endpoints(&reviews("v2")).expect("v2");
    let (_, e) = v2.endpoints().next().expect("an endpoint");
    assert_eq!((e.weight, e.health), (3, Health::Healthy));
    let v3 = snap.endpoints(&reviews("v3")).expect("v3");
    let (loc, e) = v3.endpoints().next().expect("an endpoint");
    assert_eq!(e.health, Health::Draining);
    assert!(
        !e.health.takes_traffic(),
        "a draining endpoint takes no new traffic"
    );
    assert_eq!(loc.locality.region, "");
    assert_eq!(v3.overprovisioning_factor, 140);
    assert_eq!(
        snap.endpoints(&reviews("")).map(|a| a.endpoints().count()),
        Some(3)
    );
    // The snapshot wants exactly the four EDS names.
    let wanted: Vec<String> = snap.wanted_endpoints().into_iter().collect();
    let mut want = vec![reviews(""), reviews("v1"), reviews("v2"), reviews("v3")];
    want.sort();
    assert_eq!(wanted, want);
}

#[test]
fn service_entries_resolved_by_dns_or_given_statically() {
    let snap = snapshot("dns-static");
    let dns = cluster(&snap, "outbound|443||api.example.com");
    let Discovery::StrictDns(d) = &dns.discovery else {
        panic!("not STRICT_DNS: {:?}", dns.discovery)
    };
    assert_eq!(d.targets.len(), 1);
    assert_eq!(
        (
            d.targets[0].host.as_str(),
            d.targets[0].port,
            d.targets[0].weight
        ),
        ("api.example.com", 443, 1)
    );
    assert_eq!(d.targets[0].tls_mode, None);
    assert_eq!(d.lookup_family, DnsLookupFamily::V4Only);
    assert_eq!(d.refresh_rate, Duration::from_secs(60));
    assert!(d.respect_dns_ttl);
    assert_eq!(dns.lb_policy, LbPolicy::RoundRobin);
    assert_eq!(dns.transport_socket, TransportSocket::Plaintext);
    assert!(dns.transport_socket_matches.is_empty());
    assert_eq!(dns.istio.services[0].host, "api.example.com");
    assert!(snap.wanted_endpoints().is_empty(), "no EDS here");

    let st = cluster(&snap, "outbound|80||static.example.com");
    assert_eq!(
        (st.discovery.clone(), st.lb_policy),
        (Discovery::Static, LbPolicy::Random)
    );
    let cla = snap
        .endpoints("outbound|80||static.example.com")
        .expect("inline load assignment");
    let eps: Vec<_> = cla.endpoints().map(|(_, e)| e).collect();
    assert_eq!(eps.len(), 2);
    assert_eq!(
        (eps[0].address, eps[0].weight),
        ("10.10.0.1:8080".parse().expect("address"), 2)
    );
    assert_eq!(eps[0].tls_mode.as_deref(), Some("istio"));
    assert_eq!(eps[1].tls_mode, None);
    let Some(tls) = st.istio_mtls() else {
        panic!("no mTLS for the WorkloadEntry with a sidecar")
    };
    assert_eq!(
        tls.sni.as_deref(),
        Some("outbound_.80_._.static.example.com")
    );
    assert_eq!(
        st.transport_socket_for(eps[1].tls_mode.as_deref()),
        &TransportSocket::Plaintext
    );
}

#[test]
fn a_tcp_route_splits_by_weight_across_subsets() {
    use remora_xds::model::listener::{ChainKind, ConnectionFacts, TcpTarget};
    let snap = snapshot("tcp-split");
    let dst = "10.96.0.40:27017".parse().expect("address");
    let listener = snap
        .listener("10.96.0.40_27017")
        .expect("the mongo listener");
    let chain = listener
        .filter_chain(&ConnectionFacts {
            destination: dst,
            server_name: None,
            transport_protocol: "raw_buffer",
            application_protocols: &[],
        })
        .expect("its chain");
    let ChainKind::Tcp(tcp) = &chain.kind else {
        panic!("not TCP: {:?}", chain.kind)
    };
    let mongo = |s: &str| format!("outbound|27017|{s}|mongo.default.svc.cluster.local");
    assert_eq!(
        tcp.target,
        TcpTarget::Weighted(vec![(mongo("v1"), 70), (mongo("v2"), 30)])
    );
    assert_eq!(
        tcp.stat_prefix,
        "outbound|27017||mongo.default.svc.cluster.local"
    );
    assert_eq!(tcp.idle_timeout, None, "Envoy's default hour");
    let picks: Vec<String> = (0..100u64)
        .filter_map(|roll| tcp.target.pick(roll).map(str::to_string))
        .collect();
    assert_eq!(picks.len(), 100);
    assert_eq!(picks.iter().filter(|p| **p == mongo("v1")).count(), 70);
    assert_eq!(picks.iter().filter(|p| **p == mongo("v2")).count(), 30);
    for s in ["v1", "v2"] {
        let c = cluster(&snap, &mongo(s));
        assert_eq!(c.istio.subset.as_deref(), Some(s));
        let sni = c.istio_mtls().and_then(|t| t.sni.clone());
        assert_eq!(
            sni,
            Some(format!(
                "outbound_.27017_.{s}_.mongo.default.svc.cluster.local"
            ))
        );
    }
}

/// DestinationRule `loadBalancer.consistentHash` as istiod writes it: RING_HASH with its
/// minimum ring size, MAGLEV with its table size.
#[test]
fn consistent_hash_clusters_as_istiod_writes_them() {
    let snap = snapshot("consistent-hash");
    let lb = |name: &str| {
        cluster(
            &snap,
            &format!("outbound|9080||{name}.default.svc.cluster.local"),
        )
        .lb_policy
    };
    assert_eq!(
        lb("ring-hash"),
        LbPolicy::RingHash {
            minimum_ring_size: 1024,
            maximum_ring_size: 8 * 1024 * 1024
        }
    );
    assert_eq!(lb("maglev"), LbPolicy::Maglev { table_size: 65537 });
}

/// DestinationRule `connectionPool.tcp.tcpKeepalive` as istiod writes it
/// (`upstream_connection_options.tcp_keepalive`, seconds).
#[test]
fn tcp_keepalive_as_istiod_writes_it() {
    let snap = snapshot("resilience");
    let keepalive = cluster(&snap, "outbound|9080||keepalive.default.svc.cluster.local")
        .tcp_keepalive
        .expect("kept");
    assert_eq!(keepalive.probes, Some(3));
    assert_eq!(keepalive.time, Some(Duration::from_secs(300)));
    assert_eq!(keepalive.interval, Some(Duration::from_secs(30)));
    let pool = cluster(
        &snap,
        "outbound|9080||pool-limits.default.svc.cluster.local",
    );
    assert_eq!(pool.tcp_keepalive, None);
}

/// DestinationRule `trafficPolicy.tls` SIMPLE and MUTUAL as istiod writes them: the pod's files
/// named as pilot-agent's SDS names them, resolved in the model; not Istio mTLS.
#[test]
fn destination_rule_tls_names_the_pods_files() {
    let snap = snapshot("tls-origination");
    let tls = |name: &str| {
        let c = cluster(&snap, name);
        assert!(c.istio.keeps_alpn, "{name}: alpn_override false");
        assert!(c.istio_mtls().is_none_or(|t| !t.is_mesh()), "{name}");
        match &c.transport_socket {
            TransportSocket::Tls(t) => (**t).clone(),
            TransportSocket::Plaintext => panic!("{name}: plaintext"),
        }
    };
    let system = tls("outbound|443||tls.example.com");
    assert_eq!(system.sni.as_deref(), Some("tls.example.com"));
    assert_eq!(system.validation_secret, Some(SdsSecret::SystemRoots));
    assert!(system.subject_alt_names.is_empty() && system.certificate_secret.is_none());
    let ca = tls("outbound|443||ca.example.com");
    assert_eq!(
        ca.validation_secret,
        Some(SdsSecret::FileRoots("/etc/certs/ca.pem".into()))
    );
    assert_eq!(
        ca.subject_alt_names,
        [SanMatcher {
            san_type: None,
            matcher: StringMatcher::exact("api.example.com"),
        }]
    );
    let insecure = tls("outbound|443||insecure.example.com");
    assert_eq!(insecure.validation_secret, None);
    let mutual = tls("outbound|8443||mutual.example.com");
    assert_eq!(
        mutual.certificate_secret,
        Some(SdsSecret::FileCertificate {
            chain: "/etc/certs/client.pem".into(),
            key: "/etc/certs/client-key.pem".into(),
        })
    );
    assert_eq!(mutual.alpn, ["h2"]);
    assert_eq!(
        cluster(&snap, "outbound|8443||mutual.example.com").http_protocol,
        UpstreamHttpProtocol::Http2
    );
    // Neither sni nor subjectAltNames: the request's host is both.
    let auto = cluster(&snap, "outbound|80||edition.example.com");
    assert!(auto.auto_sni && auto.auto_san_validation);
    assert_eq!(tls("outbound|80||edition.example.com").sni, None);
    assert!(!cluster(&snap, "outbound|443||tls.example.com").auto_sni);
    // MUTUAL with credentialName (a DestinationRule with a workloadSelector): the two secrets
    // istiod serves itself over ADS, which the clusters make the store ask for.
    let credential = tls("outbound|443||credential.example.com");
    assert_eq!(
        credential.certificate_secret,
        Some(SdsSecret::Ads("kubernetes://client-credential".into()))
    );
    assert_eq!(
        credential.validation_secret,
        Some(SdsSecret::Ads(
            "kubernetes://client-credential-cacert".into()
        ))
    );
    assert_eq!(
        snap.wanted_secrets().into_iter().collect::<Vec<_>>(),
        [
            "kubernetes://client-credential",
            "kubernetes://client-credential-cacert"
        ]
    );
}
