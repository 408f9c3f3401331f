//! Each case is what Envoy 1.40 printed on `/stats/prometheus` for the dotted name, given
//! pilot-agent's bootstrap `stats_config` (its `stats_tags`, `use_all_default_tags: false`).

use super::prometheus;

fn check(dotted: &str, name: &str, labels: &[(&str, &str)]) {
    let (got, got_labels) = prometheus(dotted);
    let got_labels: Vec<(&str, &str)> = got_labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(
        (got.as_str(), got_labels),
        (name, labels.to_vec()),
        "{dotted}"
    );
}

#[test]
fn istiods_connection_manager_prefixes_stay_in_the_name() {
    check(
        "http.outbound_0.0.0.0_80.cors.origin_valid",
        "envoy_http_outbound_0_0_0_0_80_cors_origin_valid",
        &[],
    );
    check(
        "http.inbound_0.0.0.0_8080.fault.aborts_injected",
        "envoy_http_inbound_0_0_0_0_8080_fault_aborts_injected",
        &[],
    );
    check(
        "http.inbound_0.0.0.0_8080.downstream_rq_total",
        "envoy_http_inbound_0_0_0_0_8080_downstream_rq_total",
        &[],
    );
}

#[test]
fn a_prefix_ending_in_a_semicolon_is_a_label() {
    check(
        "http.outbound_0.0.0.0_81;.cors.origin_valid",
        "envoy_http_cors_origin_valid",
        &[("http_conn_manager_prefix", "outbound_0.0.0.0_81")],
    );
    check(
        "http.outbound_0.0.0.0_81;.rbac.allowed",
        "envoy_http_rbac",
        &[
            ("authz_enforce_result", "allowed"),
            ("http_conn_manager_prefix", "outbound_0.0.0.0_81"),
        ],
    );
    // The second alternative: brackets and colons, no dots.
    check(
        "http.[::]_80;.rq_total",
        "envoy_http_rq_total",
        &[("http_conn_manager_prefix", "[::]_80")],
    );
}

#[test]
fn rbac_results_and_dry_runs_are_labels() {
    check(
        "http.inbound_0.0.0.0_8080.rbac.denied",
        "envoy_http_inbound_0_0_0_0_8080_rbac",
        &[("authz_enforce_result", "denied")],
    );
    check(
        "http.inbound_0.0.0.0_8080.rbac.istio_dry_run_allow_.shadow_denied",
        "envoy_http_inbound_0_0_0_0_8080_rbac",
        &[
            ("authz_dry_run_action", "allow"),
            ("authz_dry_run_result", "denied"),
        ],
    );
    // A filter without a shadow rules' stat prefix (istiod's without dry-run policies).
    check(
        "http.outbound_0.0.0.0_80.rbac.shadow_allowed",
        "envoy_http_outbound_0_0_0_0_80_rbac",
        &[("authz_dry_run_result", "allowed")],
    );
    check(
        "http.inbound_0.0.0.0_8080.ext_authz.shadow_allowed",
        "envoy_http_inbound_0_0_0_0_8080_ext_authz",
        &[("authz_dry_run_result", "allowed")],
    );
    // Istio's network RBAC (`stat_prefix: tcp.`): the two cuts meet, and the dot left at the
    // end goes.
    check(
        "tcp.rbac.allowed",
        "envoy_tcp",
        &[("authz_enforce_result", "allowed"), ("tcp_prefix", "rbac")],
    );
    check(
        "tcp.rbac.istio_dry_run_allow_.shadow_denied",
        "envoy_tcp",
        &[
            ("authz_dry_run_action", "allow"),
            ("authz_dry_run_result", "denied"),
            ("tcp_prefix", "rbac.istio_dry_run_allow_"),
        ],
    );
    check(
        "tcp.PassthroughCluster.downstream_cx_total",
        "envoy_tcp_downstream_cx_total",
        &[("tcp_prefix", "PassthroughCluster")],
    );
}

#[test]
fn clusters_are_labelled_only_by_a_stat_name_ending_in_a_semicolon() {
    check(
        "cluster.outbound|80||web.test.svc.cluster.local.upstream_rq_503",
        "envoy_cluster_outbound_80__web_test_svc_cluster_local_upstream_rq",
        &[("response_code", "503")],
    );
    check(
        "cluster.outbound|80||web.test.svc.cluster.local.upstream_rq_5xx",
        "envoy_cluster_outbound_80__web_test_svc_cluster_local_upstream_rq",
        &[("response_code_class", "5xx")],
    );
    check(
        "cluster.PassthroughCluster.upstream_cx_connect_fail",
        "envoy_cluster_PassthroughCluster_upstream_cx_connect_fail",
        &[],
    );
    // The HTTP ext_authz filter's counts on istiod's inbound route cluster.
    check(
        "cluster.inbound|8086||.ext_authz.ok",
        "envoy_cluster_inbound_8086___ext_authz_ok",
        &[],
    );
    check(
        "cluster.outbound|81||x.svc;.upstream_rq_total",
        "envoy_cluster_upstream_rq_total",
        &[("cluster_name", "outbound|81||x.svc")],
    );
    // `cache` matches anywhere: in a cluster's name too, and its cut takes the dot after `;`.
    check(
        "cluster.redis-cache.ns;.upstream_rq_total",
        "envoy_clusterupstream_rq_total",
        &[("cluster_name", "redis-cache.ns"), ("cache", "ns;")],
    );
}

#[test]
fn listeners_and_the_rest() {
    check(
        "listener.0.0.0.0_15006.ssl.handshake",
        "envoy_listener_ssl_handshake",
        &[("listener_address", "0.0.0.0_15006")],
    );
    check(
        "listener.[__]_15001.downstream_cx_total",
        "envoy_listener_downstream_cx_total",
        &[("listener_address", "[__]_15001")],
    );
    check(
        "sds.kubernetes_client-credential.update_success",
        "envoy_sds_kubernetes_client_credential_update_success",
        &[],
    );
    check("ext_authz.tcp..ok", "envoy_ext_authz_tcp__ok", &[]);
    check(
        "cluster_manager.cds.update_success",
        "envoy_cluster_manager_cds_update_success",
        &[],
    );
    check("server.state", "envoy_server_state", &[]);
}

#[test]
fn the_other_tags_of_the_bootstrap() {
    check(
        "listener.10.0.0.1_80.http.10.0.0.1_80.downstream_rq_total",
        "envoy_listener_http_downstream_rq_total",
        &[
            ("http_conn_manager_listener_prefix", "10.0.0.1_80"),
            ("listener_address", "10.0.0.1_80"),
        ],
    );
    // istiod's prefixes start with a letter past `f`: not a listener's HTTP prefix.
    check(
        "listener.0.0.0.0_80.http.outbound_0.0.0.0_80.downstream_rq_total",
        "envoy_listener_http_outbound_0_0_0_0_80_downstream_rq_total",
        &[("listener_address", "0.0.0.0_80")],
    );
    check(
        "server.main_thread.watchdog_miss",
        "envoy_server_watchdog_miss",
        &[("thread_name", "main_thread")],
    );
    check(
        "component.proxy.tag.v1;.count",
        "envoy_count",
        &[("component", "proxy"), ("tag", "v1")],
    );
    check(
        "wasm_filter.stats.x.y",
        "envoy_x_y",
        &[("wasm_filter", "stats")],
    );
    check(
        "cluster.x.upstream_rq_20",
        "envoy_cluster_x_upstream_rq_20",
        &[],
    );
}
