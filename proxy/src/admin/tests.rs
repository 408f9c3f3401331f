use super::*;
use crate::metrics::Metrics;

fn state() -> AdminState {
    let mut s = AdminState::new(Arc::new(Metrics::default()), Drain::new());
    s.listeners = vec![
        ListenerInfo {
            name: "virtualOutbound".into(),
            route: Route::Capture(crate::Direction::Outbound),
            addresses: vec![
                "0.0.0.0:15001".parse().unwrap(),
                "[::]:15001".parse().unwrap(),
            ],
        },
        ListenerInfo {
            name: "virtualInbound".into(),
            route: Route::Capture(crate::Direction::Inbound),
            addresses: vec!["0.0.0.0:15006".parse().unwrap()],
        },
    ];
    s
}

fn get(s: &AdminState, role: Role, path: &str) -> Response<Body> {
    respond(role, s, &AdminRequest::new(Method::GET, path))
}

fn post(s: &AdminState, path: &str) -> Response<Body> {
    respond(Role::Admin, s, &AdminRequest::new(Method::POST, path))
}

pub(super) fn body(r: Response<Body>) -> String {
    use http_body_util::BodyExt;
    use std::future::Future;
    // A `Full` body is ready at once: one poll, no runtime.
    let mut collect = std::pin::pin!(r.into_body().collect());
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match collect.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(Ok(c)) => String::from_utf8(c.to_bytes().to_vec()).unwrap(),
        std::task::Poll::Ready(Err(e)) => match e {},
        std::task::Poll::Pending => panic!("a full body is always ready"),
    }
}

#[test]
fn readiness_follows_start_drain_and_healthcheck_fail() {
    let s = state();
    let ready = |s: &AdminState| get(s, Role::Readiness, "/healthz/ready").status();
    assert_eq!(ready(&s), StatusCode::SERVICE_UNAVAILABLE);
    s.ready.store(true, Ordering::Release);
    assert_eq!(ready(&s), StatusCode::OK);
    s.metrics.server.set_state(ServerState::Live);
    assert_eq!(post(&s, "/healthcheck/fail").status(), StatusCode::OK);
    assert_eq!(ready(&s), StatusCode::SERVICE_UNAVAILABLE);
    // As in Envoy: a failed health check makes the server draining for `/ready` and its stats.
    let admin_ready = get(&s, Role::Admin, "/ready");
    assert_eq!(admin_ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body(admin_ready), "DRAINING\n");
    assert_eq!(s.metrics.server.state(), ServerState::Draining);
    assert_eq!(post(&s, "/healthcheck/ok").status(), StatusCode::OK);
    assert_eq!(ready(&s), StatusCode::OK);
    assert_eq!(body(get(&s, Role::Admin, "/ready")), "LIVE\n");
    assert_eq!(s.metrics.server.state(), ServerState::Live);
    s.drain.start();
    assert_eq!(ready(&s), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body(get(&s, Role::Admin, "/ready")), "DRAINING\n");
}

#[test]
fn readiness_waits_for_every_required_condition() {
    let s = state();
    s.ready.store(true, Ordering::Release);
    s.readiness.require(super::readiness::CERTIFICATE);
    let r = get(&s, Role::Readiness, "/healthz/ready");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body(r), "not ready: waiting for workload certificate\n");
    assert_eq!(body(get(&s, Role::Admin, "/ready")), "PRE_INITIALIZING\n");
    s.readiness.satisfy(super::readiness::CERTIFICATE);
    assert_eq!(
        get(&s, Role::Readiness, "/healthz/ready").status(),
        StatusCode::OK
    );
}

#[test]
fn wrong_method_is_405_and_unknown_path_is_404_listing_paths() {
    let s = state();
    let r = get(&s, Role::Admin, "/quitquitquit");
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.headers()[ALLOW], "POST");
    let r = get(&s, Role::Admin, "/nope");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let listing = body(r);
    assert!(
        listing.contains("/config_dump") && listing.contains("/drain_listeners"),
        "{listing}"
    );
    // Each listener serves only its own paths.
    let r = get(&s, Role::Readiness, "/stats/prometheus");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // /logging takes both.
    assert_eq!(get(&s, Role::Admin, "/logging").status(), StatusCode::OK);
}

#[tokio::test]
async fn quitquitquit_notifies() {
    let s = state();
    assert_eq!(post(&s, "/quitquitquit").status(), StatusCode::OK);
    tokio::time::timeout(Duration::from_secs(1), s.quit.notified())
        .await
        .expect("quit should have been notified");
}

#[test]
fn prometheus_has_its_content_type() {
    let s = state();
    let r = get(&s, Role::Metrics, "/stats/prometheus");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()[CONTENT_TYPE], PROMETHEUS_TEXT);
}

#[test]
fn prometheus_takes_envoys_filter_and_usedonly() {
    let s = state();
    s.metrics
        .direction(crate::Direction::Outbound)
        .connection_opened();
    let all = body(get(&s, Role::Metrics, "/stats/prometheus"));
    let opened = "envoy_listener_downstream_cx_total{listener_address=\"0.0.0.0_15001\"} 1\n";
    let unused = "envoy_listener_downstream_cx_total{listener_address=\"0.0.0.0_15006\"} 0\n";
    assert!(all.contains(opened) && all.contains(unused), "{all}");

    let used = body(get(&s, Role::Metrics, "/stats/prometheus?usedonly"));
    assert!(used.contains(opened), "{used}");
    assert!(!used.contains(unused), "{used}");
    // Gauges stay: Envoy calls them used once set.
    assert!(used.contains("\nenvoy_server_state "), "{used}");
    // Envoy's counters without `_total` are counters too, as Envoy types them.
    assert!(
        !used.contains("envoy_listener_downstream_cx_destroy{"),
        "{used}"
    );
    assert!(
        all.contains("# TYPE envoy_listener_downstream_cx_destroy counter\n"),
        "{all}"
    );

    let filtered = body(get(
        &s,
        Role::Admin,
        "/stats/prometheus?filter=listener.*15001",
    ));
    let samples: Vec<&str> = filtered.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(!samples.is_empty(), "{filtered}");
    assert!(
        samples.iter().all(|l| l.contains("0.0.0.0_15001")),
        "{filtered}"
    );
    assert!(filtered.contains("# TYPE envoy_listener_downstream_cx_total counter\n"));

    let bad = get(&s, Role::Metrics, "/stats/prometheus?filter=(");
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
}

#[test]
fn stats_are_dotted_sorted_filterable_and_json() {
    let s = state();
    s.metrics
        .direction(crate::Direction::Outbound)
        .connection_opened();
    let all = body(get(&s, Role::Admin, "/stats"));
    assert!(
        all.contains("listener.0.0.0.0_15001.downstream_cx_total: 1\n"),
        "{all}"
    );
    assert!(all.contains("server.state: 2\n"), "{all}");
    let names: Vec<&str> = all.lines().map(|l| l.split(':').next().unwrap()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);

    let filtered = body(get(&s, Role::Admin, "/stats?filter=downstream_cx_total"));
    assert_eq!(filtered.lines().count(), 2, "{filtered}");
    let used = body(get(&s, Role::Admin, "/stats?usedonly&filter=cx_total"));
    assert_eq!(used, "listener.0.0.0.0_15001.downstream_cx_total: 1\n");

    let j: serde_json::Value =
        serde_json::from_str(&body(get(&s, Role::Admin, "/stats?format=json"))).unwrap();
    assert!(j["stats"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "server.live"));
    assert_eq!(
        get(&s, Role::Admin, "/stats?filter=(").status(),
        StatusCode::BAD_REQUEST
    );
}

#[test]
fn config_dump_has_envoys_shape() {
    let s = state();
    let j: serde_json::Value =
        serde_json::from_str(&body(get(&s, Role::Admin, "/config_dump"))).unwrap();
    let configs = j["configs"].as_array().unwrap();
    let types: Vec<&str> = configs
        .iter()
        .map(|c| c["@type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types[..4],
        [
            "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump",
            "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
            "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
            "type.googleapis.com/envoy.admin.v3.SecretsConfigDump",
        ]
    );
    let l = &configs[2]["static_listeners"][0]["listener"];
    assert_eq!(l["name"], "virtualOutbound");
    assert_eq!(l["address"]["socket_address"]["port_value"], 15001);
    assert_eq!(
        configs[1]["static_clusters"][0]["cluster"]["type"],
        "ORIGINAL_DST"
    );
    assert_eq!(configs[4]["config"]["outbound"]["port"], 15001);

    // One field's entries alone, each typed; a field there is not is 404, as in Envoy.
    let j: serde_json::Value = serde_json::from_str(&body(get(
        &s,
        Role::Admin,
        "/config_dump?resource=static_clusters",
    )))
    .unwrap();
    assert_eq!(
        j["configs"][0]["@type"],
        "type.googleapis.com/envoy.admin.v3.ClustersConfigDump.StaticCluster"
    );
    assert_eq!(j["configs"][0]["cluster"]["type"], "ORIGINAL_DST");
    let r = get(&s, Role::Admin, "/config_dump?resource=bogus");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[test]
fn listeners_and_clusters_in_both_shapes() {
    let s = state();
    let t = body(get(&s, Role::Admin, "/listeners"));
    assert_eq!(
        t,
        "virtualOutbound::0.0.0.0:15001\nvirtualOutbound::[::]:15001\nvirtualInbound::0.0.0.0:15006\n"
    );
    let j: serde_json::Value =
        serde_json::from_str(&body(get(&s, Role::Admin, "/listeners?format=json"))).unwrap();
    assert_eq!(j["listener_statuses"][1]["name"], "virtualInbound");
    let c: serde_json::Value =
        serde_json::from_str(&body(get(&s, Role::Admin, "/clusters?format=json"))).unwrap();
    assert_eq!(c["cluster_statuses"][0]["name"], "PassthroughCluster");
    let info: serde_json::Value =
        serde_json::from_str(&body(get(&s, Role::Admin, "/server_info"))).unwrap();
    assert_eq!(info["state"], "PRE_INITIALIZING");
    assert_eq!(info["command_line_options"]["concurrency"], 2);
}

#[test]
fn drain_listeners_inboundonly_drains_and_full_closes_all() {
    let s = state();
    assert_eq!(
        post(&s, "/drain_listeners?inboundonly").status(),
        StatusCode::OK
    );
    assert!(s.drain.is_draining());
    assert!(s.drain.inbound_listeners_are_closed());
    assert!(!s.drain.all_listeners_are_closed());
    let s = state();
    assert_eq!(post(&s, "/drain_listeners").status(), StatusCode::OK);
    assert!(s.drain.is_draining());
    assert!(s.drain.all_listeners_are_closed());
}

/// As Envoy's graceful drain, which Istio's pilot-agent asks for on SIGTERM: connections are
/// told to go at once, and the listeners keep accepting through the drain duration.
#[tokio::test]
async fn graceful_drain_starts_at_once_and_closes_the_listeners_after_the_duration() {
    let s = state();
    s.config.store(Arc::new(remora_config::Config {
        drain: remora_config::DrainConfig {
            duration: std::time::Duration::from_millis(50),
            ..Default::default()
        },
        ..Default::default()
    }));
    assert_eq!(
        post(&s, "/drain_listeners?inboundonly&graceful").status(),
        StatusCode::OK
    );
    assert!(s.drain.is_draining());
    assert!(!s.drain.inbound_listeners_are_closed());
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        s.drain.inbound_listeners_closed(),
    )
    .await
    .expect("the inbound listeners close after the drain duration");
    assert!(!s.drain.all_listeners_are_closed());
    // `skip_exit` (pilot-agent's `/drain` for a native sidecar) leaves them open.
    let s = state();
    assert_eq!(
        post(&s, "/drain_listeners?inboundonly&graceful&skip_exit").status(),
        StatusCode::OK
    );
    assert!(s.drain.is_draining());
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!s.drain.inbound_listeners_are_closed());
}

#[test]
fn clusters_list_each_open_upstream_as_a_host_of_its_cluster() {
    use crate::Direction::{Inbound, Outbound};
    let mut s = state();
    let upstream: SocketAddr = "127.0.0.1:9000".parse().unwrap();
    s.listeners.push(ListenerInfo {
        name: "127.0.0.1:8080".into(),
        route: Route::Fixed(Arc::new(remora_config::ListenerConfig {
            address: "127.0.0.1:8080".parse().unwrap(),
            upstream,
            protocol: Default::default(),
            tls: None,
        })),
        addresses: vec!["127.0.0.1:8080".parse().unwrap()],
    });
    let hosts = |s: &AdminState| -> serde_json::Value {
        serde_json::from_str(&body(get(s, Role::Admin, "/clusters?format=json"))).unwrap()
    };
    // Nothing open: only the explicit listener's upstream is a host, with no connection.
    let c = hosts(&s);
    assert_eq!(
        c["cluster_statuses"][0]["host_statuses"],
        serde_json::json!([])
    );
    let fixed = &c["cluster_statuses"][2];
    assert_eq!(fixed["name"], "outbound|9000||127.0.0.1");
    assert_eq!(
        fixed["host_statuses"][0]["address"]["socket_address"]["port_value"],
        9000
    );
    assert_eq!(fixed["host_statuses"][0]["stats"][0]["name"], "cx_active");
    assert!(fixed["host_statuses"][0]["stats"][0].get("value").is_none());
    assert_eq!(
        fixed["host_statuses"][0]["health_status"]["eds_health_status"],
        "HEALTHY"
    );

    let peer: SocketAddr = "10.0.0.7:80".parse().unwrap();
    let app: SocketAddr = "10.0.0.5:8080".parse().unwrap();
    let local = |p: u16| SocketAddr::from(([10, 0, 0, 5], p));
    let open = [
        s.upstreams.register(local(40001), peer, Outbound),
        s.upstreams.register(local(40002), peer, Outbound),
        s.upstreams
            .register("127.0.0.6:40003".parse().unwrap(), app, Inbound),
        s.upstreams
            .register("127.0.0.1:40004".parse().unwrap(), upstream, Outbound),
    ];
    let c = hosts(&s);
    let host =
        |cluster: usize, i: usize| c["cluster_statuses"][cluster]["host_statuses"][i].clone();
    assert_eq!(c["cluster_statuses"][0]["name"], "PassthroughCluster");
    assert_eq!(
        host(0, 0)["address"]["socket_address"]["address"],
        "10.0.0.7"
    );
    assert_eq!(host(0, 0)["stats"][0]["value"], "2");
    assert_eq!(
        c["cluster_statuses"][1]["name"],
        "InboundPassthroughCluster"
    );
    assert_eq!(host(1, 0)["address"]["socket_address"]["port_value"], 8080);
    assert_eq!(host(1, 0)["stats"][0]["value"], "1");
    // The explicit listener's connection counts under its own cluster, not the passthrough.
    assert_eq!(host(2, 0)["stats"][0]["value"], "1");
    assert_eq!(
        c["cluster_statuses"][0]["host_statuses"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    let t = body(get(&s, Role::Admin, "/clusters"));
    assert!(
        t.contains("PassthroughCluster::10.0.0.7:80::cx_active::2\n"),
        "{t}"
    );
    assert!(t.contains("InboundPassthroughCluster::10.0.0.5:8080::health_flags::healthy\n"));
    assert!(t.contains("outbound|9000||127.0.0.1::127.0.0.1:9000::cx_active::1\n"));
    drop(open);
    assert!(body(get(&s, Role::Admin, "/clusters"))
        .contains("outbound|9000||127.0.0.1::127.0.0.1:9000::cx_active::0\n"));
    assert!(!body(get(&s, Role::Admin, "/clusters")).contains("10.0.0.7"));
}
