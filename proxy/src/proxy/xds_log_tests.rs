//! Which loggers a connection's line goes to: its chain's `tcp_proxy` loggers, none for an
//! HTTP chain (each request has its connection manager's), the listener's when no chain took
//! it, each behind its filter.

use super::*;
use serde_json::{json, Value};

fn logger(path: &std::path::Path, nr_only: bool) -> Value {
    let mut l = json!({"name": "envoy.access_loggers.file", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
        "path": path.to_str().expect("utf-8"),
        "log_format": {"text_format_source": {"inline_string": "%RESPONSE_FLAGS%\n"}}}});
    if nr_only {
        l["filter"] = json!({"response_flag_filter": {"flags": ["NR"]}});
    }
    l
}

fn paths(loggers: &Loggers) -> Vec<String> {
    loggers
        .sinks()
        .map(|s| s.file.map_or("stdout".into(), |f| f.to_string()))
        .collect()
}

#[test]
fn a_connection_is_logged_by_its_chain_or_else_its_listener() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (tcp_log, http_log, nr_log) = (
        dir.path().join("tcp.log"),
        dir.path().join("http.log"),
        dir.path().join("nr.log"),
    );
    let tcp_proxy = json!({"name": "envoy.filters.network.tcp_proxy", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
        "stat_prefix": "echo", "cluster": "echo", "access_log": [logger(&tcp_log, false)]}});
    let listeners = json!([
        {"name": "10.96.0.20_9000", "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "address": {"socket_address": {"address": "10.96.0.20", "port_value": 9000}},
         "access_log": [logger(&nr_log, true)],
         "filter_chains": [{"filters": [tcp_proxy.clone()]}]},
        // Its only chain takes no connection (none goes to port 1).
        {"name": "10.96.0.30_9000", "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "address": {"socket_address": {"address": "10.96.0.30", "port_value": 9000}},
         "access_log": [logger(&nr_log, true)],
         "filter_chains": [{"filter_chain_match": {"destination_port": 1}, "filters": [tcp_proxy]}]},
        {"name": "0.0.0.0_80", "traffic_direction": "OUTBOUND", "bind_to_port": false,
         "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
         "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "out_80", "access_log": [logger(&http_log, false)],
            "route_config": {"name": "80", "virtual_hosts": []},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}
    ]);
    let clusters = json!([{"name": "echo", "type": "STATIC", "connect_timeout": "1s"}]);
    let store = crate::xds_files::store_of(clusters, json!([]), listeners, json!([]));
    let snapshot = store.snapshot();
    let facts = |dst: &str| remora_xds::model::listener::ConnectionFacts {
        destination: dst.parse().expect("addr"),
        server_name: None,
        transport_protocol: "raw_buffer",
        application_protocols: &[],
    };
    let counters = crate::metrics::tcp_proxy::TcpProxyStats::default();
    let decide = |dst: &str| {
        let d = route::outbound(&snapshot, &facts(dst), 0);
        let listener = snapshot.outbound_listener(facts(dst).destination);
        super::xds::Took::of(Some(&d), &counters)
            .finish(refused(None, End::NoRoute), listener.map(|l| &**l))
    };

    let tcp = decide("10.96.0.20:9000").log;
    assert_eq!(paths(&tcp), [tcp_log.to_str().expect("utf-8")]);
    // An HTTP chain's connection has no line of its own; its requests have the HCM's.
    assert!(!decide("10.96.0.10:80").log.is_some());
    let no_chain = decide("10.96.0.30:9000").log;
    assert_eq!(paths(&no_chain), [nr_log.to_str().expect("utf-8")]);
    // The listener's logger is `NR`-only: a connection with another flag, or none, is not
    // written by it.
    assert_eq!(no_chain.admitting(["NR"]).count(), 1);
    assert_eq!(no_chain.admitting(["-"]).count(), 0);
    assert_eq!(no_chain.admitting(["UF"]).count(), 0);
    // No listener at all: nothing.
    assert!(!decide("10.96.0.99:7").log.is_some());
    // Only the connection the TCP chain took is counted by its `tcp_proxy`.
    let taken = counters.each();
    assert_eq!(taken.len(), 1, "one tcp_proxy stat prefix counted");
    let (prefix, echo) = &taken[0];
    assert_eq!(&**prefix, "echo");
    let total = echo
        .values()
        .into_iter()
        .find(|(n, _, _)| *n == "downstream_cx_total");
    assert_eq!(total.map(|(_, _, v)| v), Some(1));
}
