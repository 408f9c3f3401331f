use super::*;
use remora_xds::store::Store;
use serde_json::json;

/// A sidecar's world in istiod's shape: reviews on 9080 (HTTP, RDS, subsets v1/v2 with
/// different SNI), a database on 3306 (TCP), ALLOW_ANY passthrough, and a route to a cluster
/// that does not exist. Shared with the upstream layer's tests.
pub(crate) fn bookinfo() -> Store {
    let eds = |name: &str, sni: &str| {
        json!({
            "name": name, "type": "EDS", "connect_timeout": "2s",
            "eds_cluster_config": {"eds_config": {"ads": {}}, "service_name": name},
            "lb_policy": "LEAST_REQUEST",
            "transport_socket_matches": [
                {"name": "tlsMode-istio", "match": {"tlsMode": "istio"}, "transport_socket": {
                    "name": "envoy.transport_sockets.tls", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                        "sni": sni,
                        "common_tls_context": {
                            "alpn_protocols": ["istio-peer-exchange", "istio"],
                            "tls_certificate_sds_secret_configs": [{"name": "default", "sds_config": {"api_config_source": {"api_type": "GRPC", "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}], "transport_api_version": "V3"}, "resource_api_version": "V3"}}],
                            "combined_validation_context": {
                                "default_validation_context": {"match_typed_subject_alt_names": [{"san_type": "URI", "matcher": {"exact": "spiffe://cluster.local/ns/default/sa/bookinfo-reviews"}}]},
                                "validation_context_sds_secret_config": {"name": "ROOTCA", "sds_config": {"api_config_source": {"api_type": "GRPC", "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}], "transport_api_version": "V3"}, "resource_api_version": "V3"}}
                            }
                        }
                    }}},
                {"name": "tlsMode-disabled", "match": {}, "transport_socket": {"name": "envoy.transport_sockets.raw_buffer", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"}}}
            ]
        })
    };
    let clusters = json!([
        eds("outbound|9080||reviews.default.svc.cluster.local", "outbound_.9080_._.reviews.default.svc.cluster.local"),
        eds("outbound|9080|v1|reviews.default.svc.cluster.local", "outbound_.9080_.v1_.reviews.default.svc.cluster.local"),
        eds("outbound|9080|v2|reviews.default.svc.cluster.local", "outbound_.9080_.v2_.reviews.default.svc.cluster.local"),
        {"name": "outbound|3306||db.default.svc.cluster.local", "type": "EDS", "connect_timeout": "1s",
         "eds_cluster_config": {"eds_config": {"ads": {}}, "service_name": "outbound|3306||db.default.svc.cluster.local"},
         "lb_policy": "ROUND_ROBIN"},
        {"name": "PassthroughCluster", "type": "ORIGINAL_DST", "connect_timeout": "1s", "lb_policy": "CLUSTER_PROVIDED"},
        {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "1s"}
    ]);
    let ep = |ip: &str, port: u32, tls: Option<&str>, health: &str, weight: u32| {
        let mut e = json!({"endpoint": {"address": {"socket_address": {"address": ip, "port_value": port}}},
                           "health_status": health, "load_balancing_weight": weight});
        if let Some(mode) = tls {
            e["metadata"] =
                json!({"filter_metadata": {"envoy.transport_socket_match": {"tlsMode": mode}}});
        }
        e
    };
    let endpoints = json!([
        {"cluster_name": "outbound|9080||reviews.default.svc.cluster.local", "endpoints": [
            {"lb_endpoints": [
                ep("10.0.1.1", 9080, Some("istio"), "HEALTHY", 1),
                ep("10.0.1.2", 9080, None, "UNKNOWN", 1),
                ep("10.0.1.3", 9080, Some("istio"), "UNHEALTHY", 1)]},
            {"priority": 1, "lb_endpoints": [ep("10.0.9.1", 9080, None, "HEALTHY", 1)]}]},
        {"cluster_name": "outbound|9080|v1|reviews.default.svc.cluster.local", "endpoints": [
            {"lb_endpoints": [ep("10.0.1.1", 9080, Some("istio"), "HEALTHY", 1)]}]},
        {"cluster_name": "outbound|9080|v2|reviews.default.svc.cluster.local", "endpoints": [
            {"lb_endpoints": [ep("10.0.2.1", 9080, Some("istio"), "UNHEALTHY", 1)]}]},
        {"cluster_name": "outbound|3306||db.default.svc.cluster.local", "endpoints": [
            {"lb_endpoints": [ep("10.0.3.1", 3306, None, "HEALTHY", 3), ep("10.0.3.2", 3306, None, "HEALTHY", 1)]}]}
    ]);
    let listeners = json!([
        {"name": "0.0.0.0_9080", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 9080}},
         "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "outbound_0.0.0.0_9080",
            "rds": {"config_source": {"ads": {}}, "route_config_name": "9080"},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]},
        {"name": "10.96.0.30_3306", "address": {"socket_address": {"address": "10.96.0.30", "port_value": 3306}},
         "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": "outbound|3306||db.default.svc.cluster.local", "cluster": "outbound|3306||db.default.svc.cluster.local"}}]}]},
        {"name": "virtualOutbound", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
         "traffic_direction": "OUTBOUND", "use_original_dst": true,
         "filter_chains": [{"name": "virtualOutbound-catchall-tcp", "filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": "PassthroughCluster", "cluster": "PassthroughCluster"}}]}]}
    ]);
    let routes = json!([
        {"name": "9080", "ignore_port_in_host_matching": true, "virtual_hosts": [
            {"name": "reviews.default.svc.cluster.local:9080",
             "domains": ["reviews.default.svc.cluster.local", "reviews", "reviews.default", "10.96.0.10"],
             "retry_policy": {"retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes", "num_retries": 2},
             "routes": [
                {"match": {"prefix": "/split"}, "route": {"weighted_clusters": {"clusters": [
                    {"name": "outbound|9080|v1|reviews.default.svc.cluster.local", "weight": 25},
                    {"name": "outbound|9080|v2|reviews.default.svc.cluster.local", "weight": 75}]}}},
                {"match": {"path": "/missing"}, "route": {"cluster": "outbound|9080||nowhere.default.svc.cluster.local",
                    "retry_policy": {"retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes", "num_retries": 5}}},
                {"match": {"prefix": "/", "headers": [{"name": "end-user", "string_match": {"exact": "jason"}}]},
                 "route": {"cluster": "outbound|9080|v2|reviews.default.svc.cluster.local"}},
                {"match": {"prefix": "/", "query_parameters": [{"name": "v", "string_match": {"exact": "1"}}]},
                 "route": {"cluster": "outbound|9080|v1|reviews.default.svc.cluster.local"}},
                {"match": {"prefix": "/"}, "route": {"cluster": "outbound|9080||reviews.default.svc.cluster.local"}}]},
            {"name": "wild", "domains": ["*.example.com"], "routes": [
                {"match": {"prefix": "/"}, "direct_response": {"status": 418}}]},
            {"name": "allow_any", "domains": ["*"], "routes": [
                {"match": {"prefix": "/"}, "route": {"cluster": "PassthroughCluster"}}]}
        ]}
    ]);
    crate::xds_files::store_of(clusters, endpoints, listeners, routes)
}

fn facts(dst: &str) -> ConnectionFacts<'static> {
    ConnectionFacts {
        destination: dst.parse().expect("addr"),
        server_name: None,
        transport_protocol: "raw_buffer",
        application_protocols: &[],
    }
}

fn route_of(snapshot: &Snapshot, host: &str, path: &str, headers: &[(&str, &str)]) -> String {
    route_with(snapshot, "GET", host, path, headers)
}

fn route_with(
    snapshot: &Snapshot,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> String {
    let ChainDecision::Http { http, .. } = outbound(snapshot, &facts("10.96.0.10:9080"), 0) else {
        panic!("an HTTP chain");
    };
    let table = route_table(snapshot, &http.routes).expect("the RDS table");
    let header = |name: &str| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    let values = |name: &str, visit: &mut dyn FnMut(&str) -> bool| {
        headers
            .iter()
            .filter(|(n, _)| *n == name)
            .any(|(_, v)| visit(v))
    };
    let req = RequestParts {
        method,
        path_and_query: path,
        header: &header,
        values: &values,
    };
    describe(&http_route(table, host, &req, 0))
}

#[test]
fn connect_takes_no_path_route() {
    let store = bookinfo();
    let s = store.snapshot();
    assert_eq!(route_with(&s, "CONNECT", "reviews:9080", "", &[]), "NR");
    assert_eq!(route_with(&s, "POST", "reviews:9080", "/", &[]), REVIEWS);
}

fn describe(d: &HttpDecision<'_>) -> String {
    match d {
        HttpDecision::Forward { cluster, .. } => cluster.to_string(),
        HttpDecision::Redirect { .. } => "redirect".into(),
        HttpDecision::DirectResponse { status, .. } => format!("direct {status}"),
        HttpDecision::NoRoute => "NR".into(),
        HttpDecision::NoRouteTable => "no table".into(),
    }
}

const REVIEWS: &str = "outbound|9080||reviews.default.svc.cluster.local";
const V1: &str = "outbound|9080|v1|reviews.default.svc.cluster.local";
const V2: &str = "outbound|9080|v2|reviews.default.svc.cluster.local";

#[test]
fn hosts_match_with_the_port_ignored_and_envoys_wildcards() {
    let store = bookinfo();
    let s = store.snapshot();
    assert_eq!(route_of(&s, "reviews:9080", "/", &[]), REVIEWS);
    assert_eq!(
        route_of(&s, "REVIEWS.default.svc.cluster.local", "/", &[]),
        REVIEWS
    );
    assert_eq!(route_of(&s, "10.96.0.10:9080", "/a", &[]), REVIEWS);
    assert_eq!(route_of(&s, "a.example.com", "/", &[]), "direct 418");
    // `*.example.com` needs a label before the suffix; the catch-all takes the rest.
    assert_eq!(route_of(&s, "example.com", "/", &[]), "PassthroughCluster");
    assert_eq!(route_of(&s, "other:80", "/", &[]), "PassthroughCluster");
}

#[test]
fn routes_go_by_path_headers_and_query_in_order() {
    let store = bookinfo();
    let s = store.snapshot();
    assert_eq!(
        route_of(&s, "reviews", "/missing", &[]),
        "outbound|9080||nowhere.default.svc.cluster.local"
    );
    assert_eq!(route_of(&s, "reviews", "/missing/x", &[]), REVIEWS);
    assert_eq!(route_of(&s, "reviews", "/p", &[("end-user", "jason")]), V2);
    assert_eq!(route_of(&s, "reviews", "/p?v=1", &[]), V1);
    assert_eq!(route_of(&s, "reviews", "/p?v=2", &[]), REVIEWS);
}

#[test]
fn weighted_clusters_split_in_proportion() {
    let store = bookinfo();
    let s = store.snapshot();
    let ChainDecision::Http { http, .. } = outbound(&s, &facts("10.96.0.10:9080"), 0) else {
        panic!("an HTTP chain");
    };
    let table = route_table(&s, &http.routes).expect("table");
    let header = |_: &str| None;
    let req = RequestParts {
        method: "GET",
        path_and_query: "/split",
        header: &header,
        values: &|_: &str, _: &mut dyn FnMut(&str) -> bool| false,
    };
    let v1 = (0..100u64)
        .filter(|pick| describe(&http_route(table, "reviews", &req, *pick)) == V1)
        .count();
    assert_eq!(v1, 25);
    assert_eq!(weighted([("a", 0), ("b", 0)].into_iter(), 3), None);
}

#[test]
fn tcp_listeners_by_address_and_passthrough_for_the_rest() {
    let store = bookinfo();
    let s = store.snapshot();
    let cluster = |dst: &str| match outbound(&s, &facts(dst), 0) {
        ChainDecision::Tcp { cluster, .. } => cluster.to_string(),
        ChainDecision::Http { .. } => "http".into(),
        ChainDecision::NoChain => "NR".into(),
    };
    assert_eq!(
        cluster("10.96.0.30:3306"),
        "outbound|3306||db.default.svc.cluster.local"
    );
    assert_eq!(cluster("10.96.0.99:3306"), "PassthroughCluster");
    assert_eq!(
        cluster("[::ffff:10.96.0.30]:3306"),
        "outbound|3306||db.default.svc.cluster.local"
    );
    assert_eq!(cluster("10.96.0.99:9080"), "http");
    let empty = Snapshot::default();
    assert!(matches!(
        outbound(&empty, &facts("10.0.0.1:80"), 0),
        ChainDecision::NoChain
    ));
}

#[test]
fn a_routes_retry_policy_wins_over_its_virtual_hosts() {
    let store = bookinfo();
    let s = store.snapshot();
    let ChainDecision::Http { http, .. } = outbound(&s, &facts("10.96.0.10:9080"), 0) else {
        panic!("an HTTP chain");
    };
    let table = route_table(&s, &http.routes).expect("table");
    let retries = |path: &'static str, host: &str| {
        let header = |_: &str| None;
        let req = RequestParts {
            method: "GET",
            path_and_query: path,
            header: &header,
            values: &|_: &str, _: &mut dyn FnMut(&str) -> bool| false,
        };
        match http_route(table, host, &req, 0) {
            HttpDecision::Forward { retry, .. } => retry.map(|r| r.num_retries),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(retries("/missing", "reviews"), Some(5));
    assert_eq!(retries("/", "reviews"), Some(2));
    assert_eq!(retries("/", "unknown"), None);
}

/// istiod's `virtualInbound` for a pod with port 9080 (HTTP) in PERMISSIVE mode: per port a
/// TLS chain (mTLS terminated) and a plaintext one, then the catch-all passthrough chains.
fn virtual_inbound() -> Store {
    virtual_inbound_with(true)
}

/// The same, with or without port 9080's plaintext chain (PERMISSIVE or STRICT for it).
pub(crate) fn virtual_inbound_with(plaintext_9080: bool) -> Store {
    let listeners = virtual_inbound_listeners(plaintext_9080);
    crate::xds_files::store_of(json!([]), json!([]), listeners, json!([]))
}

/// The listeners of [`virtual_inbound_with`], as JSON.
pub(crate) fn virtual_inbound_listeners(plaintext_9080: bool) -> serde_json::Value {
    let plaintext_port = if plaintext_9080 { 9080 } else { 9081 };
    let sds = |name: &str| {
        json!({"name": name, "sds_config": {"api_config_source": {"api_type": "GRPC",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}],
            "transport_api_version": "V3"}, "resource_api_version": "V3"}})
    };
    let tls = json!({"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "common_tls_context": {
            "alpn_protocols": ["h2", "http/1.1"],
            "tls_certificate_sds_secret_configs": [sds("default")],
            "combined_validation_context": {
                "default_validation_context": {"match_subject_alt_names": [{"prefix": "spiffe://cluster.local/"}]},
                "validation_context_sds_secret_config": sds("ROOTCA")}},
        "require_client_certificate": true}});
    let tcp = |cluster: &str| {
        json!([{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": cluster, "cluster": cluster}}])
    };
    let http = json!([{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "inbound_0.0.0.0_9080",
        "route_config": {"name": "inbound|9080||", "virtual_hosts": [{"name": "inbound|http|9080", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "inbound|9080||"}}]}]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]);
    let any = json!([{"address_prefix": "0.0.0.0", "prefix_len": 0}]);
    json!([{
    "name": "virtualInbound", "traffic_direction": "INBOUND",
    "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
    "filter_chains": [
        {"name": "0.0.0.0_9080", "filter_chain_match": {"destination_port": 9080, "transport_protocol": "tls",
            "application_protocols": ["istio", "istio-peer-exchange", "istio-http/1.0", "istio-http/1.1", "istio-h2"]},
         "transport_socket": tls.clone(), "filters": http.clone()},
        {"name": "0.0.0.0_9080", "filter_chain_match": {"destination_port": plaintext_port, "transport_protocol": "raw_buffer"},
         "filters": http},
        {"name": "virtualInbound", "filter_chain_match": {"prefix_ranges": any.clone(), "transport_protocol": "tls",
            "application_protocols": ["istio-peer-exchange", "istio"]},
         "transport_socket": tls, "filters": tcp("InboundPassthroughClusterIpv4")},
        {"name": "virtualInbound", "filter_chain_match": {"prefix_ranges": any, "transport_protocol": "raw_buffer"},
         "filters": tcp("InboundPassthroughClusterIpv4")}
    ]}])
}

#[test]
fn inbound_chains_decide_mtls_or_plaintext_per_port_and_the_local_cluster() {
    let store = virtual_inbound();
    let s = store.snapshot();
    let decide = |dst: &str, transport: &'static str, alpn: &'static [&'static str]| {
        let facts = ConnectionFacts {
            destination: dst.parse().expect("addr"),
            server_name: None,
            transport_protocol: transport,
            application_protocols: alpn,
        };
        let inbound = inbound(&s, &facts, 0).expect("virtualInbound is held");
        let what = match inbound.decision {
            ChainDecision::Tcp { cluster, .. } => cluster.to_string(),
            ChainDecision::Http { http, .. } => {
                let table = route_table(&s, &http.routes).expect("inline");
                let header = |_: &str| None;
                let req = RequestParts {
                    method: "GET",
                    path_and_query: "/",
                    header: &header,
                    values: &|_: &str, _: &mut dyn FnMut(&str) -> bool| false,
                };
                describe(&http_route(table, "app:9080", &req, 0))
            }
            ChainDecision::NoChain => "NR".into(),
        };
        (inbound.terminate.is_some(), what)
    };
    let mtls = decide("10.0.0.5:9080", "tls", &["istio-http/1.1"]);
    assert_eq!(mtls, (true, "inbound|9080||".to_string()));
    let plain = decide("10.0.0.5:9080", "raw_buffer", &["http/1.1"]);
    assert_eq!(plain, (false, "inbound|9080||".to_string()));
    let other = decide("10.0.0.5:7000", "tls", &["istio-peer-exchange", "istio"]);
    assert_eq!(other, (true, "InboundPassthroughClusterIpv4".to_string()));
    // The application's own TLS, not Istio's, on a port with no chain of its own: none.
    let app_tls = decide("10.0.0.5:7000", "tls", &["h2"]);
    assert_eq!(app_tls, (false, "NR".to_string()));
    assert!(inbound(&bookinfo().snapshot(), &facts("10.0.0.5:80"), 0).is_none());
}

/// A connection keeps the chain it took; an update that changes that chain (not merely the
/// listener around it) makes it stale, as Envoy drains only the chains an update changed.
#[test]
fn a_chain_is_stale_once_an_update_changes_it() {
    let permissive = virtual_inbound_with(true);
    let strict = virtual_inbound_with(false);
    let before = permissive.snapshot();
    let taken = |dst: &str, transport: &'static str, alpn: &'static [&'static str]| {
        let facts = ConnectionFacts {
            destination: dst.parse().expect("addr"),
            server_name: None,
            transport_protocol: transport,
            application_protocols: alpn,
        };
        inbound(&before, &facts, 0)
            .and_then(|i| i.chain)
            .expect("a chain")
    };
    let mtls = taken("10.0.0.5:9080", "tls", &["istio-http/1.1"]);
    let plaintext = taken("10.0.0.5:9080", "raw_buffer", &["http/1.1"]);
    assert!(mtls.is_current(&before) && plaintext.is_current(&before));
    assert_eq!(mtls.http_rbac().count(), 0);
    assert_eq!(mtls.network_rbac().count(), 0);
    // STRICT for 9080 removes its plaintext chain and keeps its mTLS chain as it was.
    let after = strict.snapshot();
    assert!(mtls.is_current(&after));
    assert!(!plaintext.is_current(&after));
    // No inbound listener at all: nothing is current.
    assert!(!mtls.is_current(&bookinfo().snapshot()));
}
