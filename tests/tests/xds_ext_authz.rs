//! AuthorizationPolicy's CUSTOM action, Envoy as the oracle: the same `virtualInbound` (an
//! HTTP chain per port with istiod's shadow RBAC filter naming the requests a CUSTOM policy
//! selects, and the `ext_authz` filter it switches on) given to Remora and to a real Envoy 1.40,
//! each the sidecar of a captured pod with the same workload and the same external authorizer
//! (`peers/ext_authz_http.py`, Envoy's HTTP flavour, on the pod's loopback, reached as the
//! cluster `outbound|9000||ext-authz.foo.svc.cluster.local`). The same plaintext requests from
//! the peer reach each pod; status, body, the authorizer's header in the answer and the one
//! it adds for the workload must be the same, and what is expected.

use remora_e2e::envoy_xds::{nets_or_skip, Resources};
use remora_e2e::peer::{self, any_addr};
use remora_e2e::service::{peer_program, Service};
use remora_e2e::xds_resources::inbound_cluster;
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::time::Duration;

const AUTHZ_PORT: u16 = 9000;
/// Selected requests sent to the authorizer; it fails closed (403).
const UP: u16 = 8080;
/// The authorizer's cluster points where nothing listens; `status_on_error` 503.
const DOWN: u16 = 8081;
/// The same, with `failure_mode_allow`.
const DOWN_OPEN: u16 = 8082;
const CLIENT_TIME: Duration = Duration::from_secs(10);

fn authz_cluster(name: &str, port: u16) -> Value {
    json!({"name": name, "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint":
            {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}})
}

/// istiod's shadow RBAC filter for a CUSTOM policy selecting requests with `x-select: ext`
/// (`when: request.headers[x-select]`).
fn shadow_rbac() -> Value {
    json!({"name": "envoy.filters.http.rbac", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
        "shadow_rules": {"action": "DENY", "policies": {
            "istio-ext-authz-ns[server]-policy[ext]-rule[0]": {
                "permissions": [{"and_rules": {"rules": [{"or_rules": {"rules": [
                    {"header": {"name": "x-select", "string_match": {"exact": "ext"}}}]}}]}}],
                "principals": [{"and_ids": {"ids": [{"any": true}]}}]}}},
        "shadow_rules_stat_prefix": "istio_ext_authz_"}})
}

/// istiod's ext_authz filter for an `envoyExtAuthzHttp` provider.
fn ext_authz(cluster: &str, fail_open: bool, status_on_error: Option<u16>) -> Value {
    let mut config = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
        "http_service": {
            "server_uri": {"uri": "http://ext-authz.foo.svc.cluster.local", "cluster": cluster,
                "timeout": "600s"},
            "authorization_request": {"allowed_headers": {"patterns": [{"exact": "x-ext-authz"}]}},
            "authorization_response": {
                "allowed_upstream_headers": {"patterns": [{"exact": "x-ext-authz-check-result"}]},
                "allowed_client_headers": {"patterns": [{"exact": "x-ext-authz-check-result"}]}}},
        "failure_mode_allow": fail_open,
        "transport_api_version": "V3",
        "filter_enabled_metadata": {"filter": "envoy.filters.http.rbac",
            "path": [{"key": "istio_ext_authz_shadow_effective_policy_id"}],
            "value": {"string_match": {"prefix": "istio-ext-authz"}}}});
    if let Some(code) = status_on_error {
        config["status_on_error"] = json!({"code": code});
    }
    json!({"name": "envoy.filters.http.ext_authz", "typed_config": config})
}

fn chain(port: u16, authz: Value) -> Value {
    let cluster = format!("inbound|{port}||");
    json!({"name": format!("0.0.0.0_{port}"),
        "filter_chain_match": {"destination_port": port, "transport_protocol": "raw_buffer"},
        "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": format!("inbound_0.0.0.0_{port}"),
            "route_config": {"name": cluster, "virtual_hosts": [{"name": "inbound", "domains": ["*"],
                "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster, "timeout": "0s"}}]}]},
            "http_filters": [shadow_rbac(), authz,
                {"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]})
}

fn resources() -> Resources {
    let up = "outbound|9000||ext-authz.foo.svc.cluster.local";
    let down = "outbound|9001||ext-authz-down.foo.svc.cluster.local";
    let listener = json!({"name": "virtualInbound", "traffic_direction": "INBOUND",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
        "listener_filters": [{"name": "envoy.filters.listener.original_dst", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"}}],
        "filter_chains": [
            chain(UP, ext_authz(up, false, None)),
            chain(DOWN, ext_authz(down, false, Some(503))),
            chain(DOWN_OPEN, ext_authz(down, true, None))]});
    let mut clusters: Vec<Value> = [UP, DOWN, DOWN_OPEN]
        .iter()
        .map(|p| inbound_cluster(&format!("inbound|{p}||")))
        .collect();
    clusters.push(authz_cluster(up, AUTHZ_PORT));
    clusters.push(authz_cluster(down, AUTHZ_PORT + 1));
    Resources {
        listeners: json!([listener]),
        clusters: Value::Array(clusters),
        routes: json!([]),
        endpoints: json!([]),
    }
}

/// The workload on each port and the authorizer, in `net`'s pod.
fn workload(net: &PodNet) -> Vec<Service> {
    net.capture_default();
    let app = peer_program("http_server.py")
        .to_string_lossy()
        .into_owned();
    let authz = peer_program("ext_authz_http.py")
        .to_string_lossy()
        .into_owned();
    let mut services: Vec<Service> = [UP, DOWN, DOWN_OPEN]
        .iter()
        .map(|p| Service::start(&net.pod, "python3", &[&app, &p.to_string()], any_addr(*p)))
        .collect();
    services.push(Service::start(
        &net.pod,
        "python3",
        &[&authz, &AUTHZ_PORT.to_string()],
        any_addr(AUTHZ_PORT),
    ));
    services
}

/// What a proxy made of one request: status, the authorizer's header in the answer, the
/// header the workload received from it (from `/headers`), and the body otherwise.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    status: u16,
    answer_header: Option<String>,
    upstream_header: Option<String>,
    body: String,
}

/// A request to `path` on `port`, selected by the CUSTOM policy when `select`.
fn request(net: &PodNet, port: u16, path: &str, select: bool) -> Outcome {
    let url = format!("http://{}:{port}{path}", net.pod_ip);
    let select = if select {
        "x-select: ext"
    } else {
        "x-select: no"
    };
    let out = peer::curl(
        &net.peer,
        &["-i", "-H", "x-ext-authz: please", "-H", select, &url],
        CLIENT_TIME,
    );
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let answer_header = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("x-ext-authz-check-result")
            .then(|| v.trim().to_string())
    });
    let json: Option<Value> = serde_json::from_str(body).ok();
    let upstream_header = json
        .as_ref()
        .and_then(|j| j["x-ext-authz-check-result"].as_str().map(str::to_string));
    Outcome {
        status,
        answer_header,
        upstream_header,
        body: if json.is_some() {
            String::new()
        } else {
            body.to_string()
        },
    }
}

#[test]
fn custom_authorization_has_envoys_outcome() {
    let Some((binary, (remora_net, envoy_net))) = nets_or_skip() else {
        return;
    };
    let resources = resources();
    let _r = workload(&remora_net);
    let remora = resources.start_remora(&remora_net);
    let _e = workload(&envoy_net);
    let envoy = resources.start_envoy(&envoy_net, &binary);
    let cases: &[(u16, &str, bool)] = &[
        // Not selected by the CUSTOM policy: never sent to the authorizer.
        (UP, "/hello", false),
        (UP, "/headers", false),
        (DOWN, "/hello", false),
        // Allowed: the authorizer's header reaches the workload, not the client.
        (UP, "/headers", true),
        (UP, "/hello", true),
        // Denied: the authorizer's status, body and allowed client header.
        (UP, "/deny", true),
        // The authorizer unreachable: status_on_error, or through with failure_mode_allow.
        (DOWN, "/hello", true),
        (DOWN_OPEN, "/hello", true),
    ];
    let mut report = Vec::new();
    let mut differ = false;
    for (port, path, select) in cases {
        let r = request(&remora_net, *port, path, *select);
        let e = request(&envoy_net, *port, path, *select);
        differ |= r != e;
        report.push(format!(
            "{port} {path} selected={select}\n  remora {r:?}\n  envoy  {e:?}"
        ));
    }
    let report = report.join("\n");
    eprintln!("{report}");
    assert!(
        !differ,
        "Remora and Envoy differ:\n{report}\n{}\n{}",
        remora.stderr(),
        envoy.logs()
    );
    // And what Envoy did is what the filter is for.
    let allowed = request(&remora_net, UP, "/headers", true);
    assert_eq!(allowed.status, 200, "{allowed:?}");
    assert_eq!(allowed.upstream_header.as_deref(), Some("allowed"));
    assert_eq!(allowed.answer_header, None);
    let unselected = request(&remora_net, UP, "/headers", false);
    assert_eq!((unselected.status, unselected.upstream_header), (200, None));
    let denied = request(&remora_net, UP, "/deny", true);
    assert_eq!(
        (
            denied.status,
            denied.body.as_str(),
            denied.answer_header.as_deref()
        ),
        (403, "denied by ext_authz\n", Some("denied"))
    );
    assert_eq!(request(&remora_net, DOWN, "/hello", true).status, 503);
    assert_eq!(request(&remora_net, DOWN, "/hello", false).status, 200);
    assert_eq!(request(&remora_net, DOWN_OPEN, "/hello", true).status, 200);
    let m = remora.wait_for_metrics("ext_authz counted", Duration::from_secs(10), |m| {
        m.value("remora_ext_authz_ok_total", &[]) >= 2.0
            && m.value("remora_ext_authz_denied_total", &[]) >= 2.0
            && m.value("remora_ext_authz_failure_mode_allowed_total", &[]) >= 2.0
    });
    drop(m);
}
