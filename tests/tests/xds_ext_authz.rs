//! AuthorizationPolicy's CUSTOM action, Envoy as the oracle: the same `virtualInbound` (an
//! HTTP chain per port with istiod's shadow RBAC filter naming the requests a CUSTOM policy
//! selects, and the `ext_authz` filter it switches on) given to Remora and to a real Envoy 1.40,
//! each the sidecar of a captured pod with the same workload and the same external authorizer
//! (`peers/ext_authz_http.py`, Envoy's HTTP flavour, on the pod's loopback, reached as the
//! cluster `outbound|9000||ext-authz.foo.svc.cluster.local`), and Envoy's gRPC flavour
//! ([`GrpcAuthorizer`], on another host: 10.1.0.2 in the peer namespace, as istiod's
//! `outbound|9191||…` cluster reaches a service) with istiod's `with_request_body`. The same
//! plaintext requests from the peer reach each pod; status, body, the authorizer's header in
//! the answer and the ones it adds for the workload must be the same, and what is expected.

use remora_e2e::envoy_xds::{nets_or_skip, Resources};
use remora_e2e::ext_authz::{GrpcAuthorizer, DENIED_TCP_PORT};
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
/// The gRPC authorizer, sent the first [`MAX_BODY`] bytes of the body.
const GRPC: u16 = 8083;
const GRPC_AUTHZ: &str = "10.1.0.2:9191";
const MAX_BODY: usize = 8000;
/// The HTTP authorizer with a DENY RBAC filter after it (paths under `/blocked`), and the body
/// sent along, at most [`SMALL_BODY`] bytes and no partial message (413 past it).
const ORDERED: u16 = 8084;
const SMALL_BODY: usize = 10;
/// The HTTP authorizer with a 500 ms timeout.
const HASTY: u16 = 8085;
/// TCP ports with the network ext_authz filter (the gRPC authorizer): allowed, denied.
const TCP_ALLOWED: u16 = 9100;
const TCP_DENIED: u16 = DENIED_TCP_PORT as u16;
/// A TCP port the CUSTOM policy does not select.
const TCP_UNSELECTED: u16 = 9102;
const CLIENT_TIME: Duration = Duration::from_secs(10);
/// Istio's default access-log format, which both proxies write; request line, status and
/// flags are compared.
const LOG_FORMAT: &str = concat!(
    "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" ",
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% ",
    "\"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% ",
    "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" ",
    "\"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% ",
    "%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% ",
    "%REQUESTED_SERVER_NAME% %ROUTE_NAME%\n",
);

/// `"METHOD PATH PROTOCOL" STATUS FLAGS` of each request line of an access log.
fn access_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| {
            let start = l.find("\"GET ").or_else(|| l.find("\"POST "))?;
            let rest = &l[start..];
            let end = rest[1..].find('"')? + 2;
            let mut after = rest[end..].split_whitespace();
            let (status, flags) = (after.next()?, after.next()?);
            Some(format!("{} {status} {flags}", &rest[..end]))
        })
        .collect()
}

fn authz_cluster(name: &str, address: &str, port: u16) -> Value {
    json!({"name": name, "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint":
            {"address": {"socket_address": {"address": address, "port_value": port}}}}]}]}})
}

/// istiod's cluster for a gRPC service port: HTTP/2.
fn grpc_cluster(name: &str) -> Value {
    let mut c = authz_cluster(name, "10.1.0.2", 9191);
    c["typed_extension_protocol_options"] = json!({"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}}}});
    c
}

/// istiod's ext_authz filter for an `envoyExtAuthzGrpc` provider with
/// `includeRequestBodyInCheck`.
fn grpc_ext_authz(cluster: &str) -> Value {
    json!({"name": "envoy.filters.http.ext_authz", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
        "grpc_service": {"envoy_grpc": {"cluster_name": cluster,
            "authority": cluster.replace('|', "_.")}, "timeout": "600s"},
        "with_request_body": {"max_request_bytes": MAX_BODY, "allow_partial_message": true},
        "transport_api_version": "V3",
        "filter_enabled_metadata": {"filter": "envoy.filters.http.rbac",
            "path": [{"key": "istio_ext_authz_shadow_effective_policy_id"}],
            "value": {"string_match": {"prefix": "istio-ext-authz"}}}}})
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

/// A DENY policy on paths under `/blocked`, as istiod writes it after the CUSTOM filters.
fn deny_blocked() -> Value {
    json!({"name": "envoy.filters.http.rbac", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
        "rules": {"action": "DENY", "policies": {"ns[server]-policy[block]-rule[0]": {
            "permissions": [{"url_path": {"path": {"prefix": "/blocked"}}}],
            "principals": [{"any": true}]}}}}})
}

/// A TCP chain as istiod writes it for a CUSTOM policy with a gRPC provider: the network
/// shadow RBAC filter selecting ports 9100 and 9101, the network ext_authz, `tcp_proxy`.
fn tcp_chain(port: u16, grpc: &str) -> Value {
    let cluster = format!("inbound|{port}||");
    let shadow = json!({"name": "envoy.filters.network.rbac", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC",
        "stat_prefix": "tcp.",
        "shadow_rules": {"action": "DENY", "policies": {
            "istio-ext-authz-ns[server]-policy[ext-tcp]-rule[0]": {
                "permissions": [{"destination_port_range": {"start": 9100, "end": 9102}}],
                "principals": [{"any": true}]}}},
        "shadow_rules_stat_prefix": "istio_ext_authz_"}});
    let ext_authz = json!({"name": "envoy.filters.network.ext_authz", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.ext_authz.v3.ExtAuthz",
        "stat_prefix": "tcp.",
        "grpc_service": {"envoy_grpc": {"cluster_name": grpc,
            "authority": grpc.replace('|', "_.")}, "timeout": "600s"},
        "transport_api_version": "V3",
        "filter_enabled_metadata": {"filter": "envoy.filters.network.rbac",
            "path": [{"key": "istio_ext_authz_shadow_effective_policy_id"}],
            "value": {"string_match": {"prefix": "istio-ext-authz"}}}}});
    json!({"name": format!("0.0.0.0_{port}"),
        "filter_chain_match": {"destination_port": port, "transport_protocol": "raw_buffer"},
        "filters": [shadow, ext_authz, {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": cluster, "cluster": cluster}}]})
}

fn chain(port: u16, authz: Value) -> Value {
    chain_with(port, &[authz])
}

fn chain_with(port: u16, filters: &[Value]) -> Value {
    let mut http_filters = vec![shadow_rbac()];
    http_filters.extend_from_slice(filters);
    http_filters.push(
        json!({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}),
    );
    let cluster = format!("inbound|{port}||");
    json!({"name": format!("0.0.0.0_{port}"),
        "filter_chain_match": {"destination_port": port, "transport_protocol": "raw_buffer"},
        "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": format!("inbound_0.0.0.0_{port}"),
            "route_config": {"name": cluster, "virtual_hosts": [{"name": "inbound", "domains": ["*"],
                "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster, "timeout": "0s"}}]}]},
            "http_filters": http_filters,
            "access_log": [{"name": "envoy.access_loggers.file", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": "/dev/stdout",
                "log_format": {"text_format_source": {"inline_string": LOG_FORMAT}}}}]}}]})
}

fn resources() -> Resources {
    let up = "outbound|9000||ext-authz.foo.svc.cluster.local";
    let down = "outbound|9001||ext-authz-down.foo.svc.cluster.local";
    let grpc = "outbound|9191||ext-authz-grpc.foo.svc.cluster.local";
    let listener = json!({"name": "virtualInbound", "traffic_direction": "INBOUND",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
        "listener_filters": [{"name": "envoy.filters.listener.original_dst", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"}}],
        "filter_chains": [
            chain(UP, ext_authz(up, false, None)),
            chain(DOWN, ext_authz(down, false, Some(503))),
            chain(DOWN_OPEN, ext_authz(down, true, None)),
            chain(GRPC, grpc_ext_authz(grpc)),
            chain_with(ORDERED, &[small_body(ext_authz(up, false, None)), deny_blocked()]),
            chain(HASTY, hasty(ext_authz(up, false, None))),
            tcp_chain(TCP_ALLOWED, grpc),
            tcp_chain(TCP_DENIED, grpc),
            tcp_chain(TCP_UNSELECTED, grpc)]});
    let mut clusters: Vec<Value> = [
        UP,
        DOWN,
        DOWN_OPEN,
        GRPC,
        ORDERED,
        HASTY,
        TCP_ALLOWED,
        TCP_DENIED,
        TCP_UNSELECTED,
    ]
    .iter()
    .map(|p| inbound_cluster(&format!("inbound|{p}||")))
    .collect();
    clusters.push(authz_cluster(up, "127.0.0.1", AUTHZ_PORT));
    clusters.push(authz_cluster(down, "127.0.0.1", AUTHZ_PORT + 1));
    clusters.push(grpc_cluster(grpc));
    Resources {
        listeners: json!([listener]),
        clusters: Value::Array(clusters),
        routes: json!([]),
        endpoints: json!([]),
    }
}

/// `filter` with a check timeout of 500 ms.
fn hasty(mut filter: Value) -> Value {
    filter["typed_config"]["http_service"]["server_uri"]["timeout"] = json!("0.5s");
    filter
}

/// `filter` sending at most [`SMALL_BODY`] bytes of the body, none past it.
fn small_body(mut filter: Value) -> Value {
    filter["typed_config"]["with_request_body"] = json!({"max_request_bytes": SMALL_BODY});
    filter
}

/// The workload on each port (HTTP servers, TCP echo servers) and the HTTP authorizer, in
/// `net`'s pod; the gRPC authorizer on 10.1.0.2 in its peer namespace.
fn workload(net: &PodNet) -> (Vec<Service>, Vec<peer::Server>, GrpcAuthorizer) {
    net.capture_default();
    for (ns, args) in [
        (&net.pod, vec!["route", "add", "default", "dev", "eth0"]),
        (&net.peer, vec!["addr", "add", "10.1.0.2/32", "dev", "eth0"]),
    ] {
        let out = ns.command("ip").args(&args).output().expect("ip");
        assert!(out.status.success(), "ip {args:?}: {out:?}");
    }
    let grpc = GrpcAuthorizer::start(&net.peer, GRPC_AUTHZ.parse().expect("address"));
    let app = peer_program("http_server.py")
        .to_string_lossy()
        .into_owned();
    let authz = peer_program("ext_authz_http.py")
        .to_string_lossy()
        .into_owned();
    let mut services: Vec<Service> = [UP, DOWN, DOWN_OPEN, GRPC, ORDERED, HASTY]
        .iter()
        .map(|p| Service::start(&net.pod, "python3", &[&app, &p.to_string()], any_addr(*p)))
        .collect();
    services.push(Service::start(
        &net.pod,
        "python3",
        &[&authz, &AUTHZ_PORT.to_string()],
        any_addr(AUTHZ_PORT),
    ));
    let echoes = [TCP_ALLOWED, TCP_DENIED, TCP_UNSELECTED]
        .iter()
        .map(|p| peer::Server::echo(&net.pod, any_addr(*p)))
        .collect();
    (services, echoes, grpc)
}

/// Whether bytes sent to `port` of the pod come back.
fn echoes(net: &PodNet, port: u16) -> bool {
    let data = peer::pattern(4096);
    let addr = std::net::SocketAddr::new(net.pod_ip.into(), port);
    peer::echo_exchange(&net.peer, addr, &data).is_ok_and(|back| back == data)
}

/// What a proxy made of one request: status, the authorizer's header in the answer, the
/// header the workload received from it (from `/headers`), and the body otherwise.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    status: u16,
    answer_header: Option<String>,
    upstream_header: Option<String>,
    /// The body bytes the gRPC authorizer said it was sent.
    checked_bytes: Option<String>,
    /// A gRPC client's status and message (a trailers-only answer's head).
    grpc: Option<(String, String)>,
    body: String,
}

/// A request to `path` on `port`, selected by the CUSTOM policy when `select`.
fn request(net: &PodNet, port: u16, path: &str, select: bool) -> Outcome {
    post(net, port, path, select, 0)
}

/// The same with a body of `body` bytes (a POST), when not zero.
fn post(net: &PodNet, port: u16, path: &str, select: bool, body: usize) -> Outcome {
    let url = format!("http://{}:{port}{path}", net.pod_ip);
    let select = if select {
        "x-select: ext"
    } else {
        "x-select: no"
    };
    let data = "a".repeat(body);
    let mut args = vec!["-i", "-H", "x-ext-authz: please", "-H", select, &url];
    // HTTP/2 (h2c) to the gRPC authorizer's port, HTTP/1.1 elsewhere; a gRPC client's
    // request on a path under `/grpc`.
    if port == GRPC {
        args.push("--http2-prior-knowledge");
    }
    if path.starts_with("/grpc") {
        args.extend(["-H", "content-type: application/grpc", "-H", "te: trailers"]);
    }
    if body > 0 {
        args.extend(["--data-binary", &data]);
    }
    let out = peer::curl(&net.peer, &args, CLIENT_TIME);
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let answer_header = header("x-ext-authz-check-result");
    let grpc = header("grpc-status").map(|s| (s, header("grpc-message").unwrap_or_default()));
    let json: Option<Value> = serde_json::from_str(body).ok();
    let upstream_header = json
        .as_ref()
        .and_then(|j| j["x-ext-authz-check-result"].as_str().map(str::to_string));
    let checked_bytes = json
        .as_ref()
        .and_then(|j| j["x-ext-authz-body-bytes"].as_str().map(str::to_string));
    Outcome {
        status,
        answer_header,
        upstream_header,
        checked_bytes,
        grpc,
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
    let (_r, _r_echo, remora_grpc) = workload(&remora_net);
    let remora = resources.start_remora(&remora_net);
    let (_e, _e_echo, _envoy_grpc) = workload(&envoy_net);
    let envoy = resources.start_envoy(&envoy_net, &binary);
    let cases: &[(u16, &str, bool, usize)] = &[
        // Not selected by the CUSTOM policy: never sent to the authorizer.
        (UP, "/hello", false, 0),
        (UP, "/headers", false, 0),
        (DOWN, "/hello", false, 0),
        // Allowed: the authorizer's header reaches the workload, not the client.
        (UP, "/headers", true, 0),
        (UP, "/hello", true, 0),
        // Denied: the authorizer's status, body and allowed client header.
        (UP, "/deny", true, 0),
        // The authorizer unreachable: status_on_error, or through with failure_mode_allow.
        (DOWN, "/hello", true, 0),
        (DOWN_OPEN, "/hello", true, 0),
        // gRPC: allowed with the authorizer's headers, the body's bytes checked (all of a
        // short one, the first MAX_BODY of a long one) and all of it forwarded; denied with
        // the denied_response's status, header and body.
        (GRPC, "/headers", true, 0),
        (GRPC, "/headers", false, 0),
        (GRPC, "/upload", true, 100),
        (GRPC, "/upload", true, 3 * MAX_BODY),
        (GRPC, "/deny", true, 100),
        // A gRPC client denied: its status as gRPC's.
        (GRPC, "/grpc/deny", true, 0),
        (UP, "/grpc/deny", true, 0),
        // The RBAC filter after the authorizer decides after it: allowed by the authorizer,
        // denied by RBAC; denied by the authorizer first.
        (ORDERED, "/blocked", true, 0),
        (ORDERED, "/blocked/deny", true, 0),
        (ORDERED, "/blocked", false, 0),
        // A body over max_request_bytes without partial messages: 413; within: checked.
        (ORDERED, "/upload", true, SMALL_BODY * 10),
        (ORDERED, "/upload", true, SMALL_BODY / 2),
        (ORDERED, "/upload", false, SMALL_BODY * 10),
        // A check slower than its timeout failed: status_on_error; a quick one allowed.
        (HASTY, "/slow", true, 0),
        (HASTY, "/hello", true, 0),
    ];
    let mut report = Vec::new();
    let mut differ = false;
    for (port, path, select, body) in cases {
        let r = post(&remora_net, *port, path, *select, *body);
        let e = post(&envoy_net, *port, path, *select, *body);
        differ |= r != e;
        report.push(format!(
            "{port} {path} selected={select} body={body}\n  remora {r:?}\n  envoy  {e:?}"
        ));
    }
    // What each logged of those requests: statuses and Envoy's response flags (UAEX).
    std::thread::sleep(Duration::from_millis(1500));
    let (r_log, e_log) = (access_lines(&remora.stdout()), access_lines(&envoy.logs()));
    differ |= r_log != e_log;
    report.push(format!(
        "access logs\n  remora {r_log:#?}\n  envoy  {e_log:#?}"
    ));
    assert!(
        r_log.iter().any(|l| l.ends_with(" 401 UAEX"))
            && r_log.iter().any(|l| l.ends_with(" 503 UAEX")),
        "{r_log:#?}"
    );
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
    // gRPC.
    let allowed = request(&remora_net, GRPC, "/headers", true);
    assert_eq!(
        (
            allowed.status,
            allowed.upstream_header.as_deref(),
            allowed.checked_bytes.as_deref()
        ),
        (200, Some("allowed"), Some("0"))
    );
    let denied = post(&remora_net, GRPC, "/deny", true, 10);
    assert_eq!(
        (
            denied.status,
            denied.body.as_str(),
            denied.answer_header.as_deref()
        ),
        (401, "denied by ext_authz\n", Some("denied"))
    );
    let long = post(&remora_net, GRPC, "/upload", true, 3 * MAX_BODY);
    assert_eq!(long.status, 200, "{long:?}");
    assert!(
        long.body.starts_with(&format!("{} ", 3 * MAX_BODY)),
        "{long:?}"
    );
    let checks = remora_grpc.checks();
    let sizes: Vec<usize> = checks
        .iter()
        .filter_map(|c| c.attributes.as_ref()?.request.as_ref()?.http.as_ref())
        .filter(|h| h.path == "/upload")
        .map(|h| h.body.len())
        .collect();
    assert!(
        sizes.contains(&100) && sizes.contains(&MAX_BODY),
        "{sizes:?}"
    );
    assert!(sizes.iter().all(|s| *s <= MAX_BODY), "{sizes:?}");
    // What a check says of the request.
    let headers_check = checks
        .iter()
        .filter_map(|c| c.attributes.as_ref())
        .find(|a| {
            a.request
                .as_ref()
                .and_then(|r| r.http.as_ref())
                .is_some_and(|h| h.path == "/headers")
        })
        .expect("a check of /headers");
    let http = headers_check
        .request
        .as_ref()
        .and_then(|r| r.http.as_ref())
        .expect("http");
    assert_eq!(
        (
            http.method.as_str(),
            http.host.as_str(),
            http.protocol.as_str()
        ),
        (
            "GET",
            format!("{}:{GRPC}", remora_net.pod_ip).as_str(),
            "HTTP/2"
        )
    );
    assert_eq!(
        http.headers.get("x-ext-authz").map(String::as_str),
        Some("please")
    );
    assert_eq!(
        http.headers.get(":path").map(String::as_str),
        Some("/headers")
    );
    assert!(headers_check
        .request
        .as_ref()
        .is_some_and(|r| r.time.is_some()));
    let address = |p: Option<
        &envoy_types::pb::envoy::service::auth::v3::attribute_context::Peer,
    >| match p.and_then(|p| p.address.as_ref()?.address.as_ref()) {
        Some(envoy_types::pb::envoy::config::core::v3::address::Address::SocketAddress(s)) => {
            s.address.clone()
        }
        _ => String::new(),
    };
    assert_eq!(
        address(headers_check.destination.as_ref()),
        remora_net.pod_ip.to_string()
    );
    assert_eq!(
        address(headers_check.source.as_ref()),
        remora_net.peer_ip.to_string()
    );
    // TCP: the network filter checks each selected connection.
    let tcp: Vec<(u16, bool, bool)> = [TCP_ALLOWED, TCP_DENIED, TCP_UNSELECTED]
        .iter()
        .map(|p| (*p, echoes(&remora_net, *p), echoes(&envoy_net, *p)))
        .collect();
    assert!(
        tcp.iter().all(|(_, r, e)| r == e),
        "Remora and Envoy differ on TCP: {tcp:?}"
    );
    assert_eq!(
        tcp.iter().map(|t| t.1).collect::<Vec<_>>(),
        [true, false, true],
        "{tcp:?}"
    );
    let tcp_checks = remora_grpc
        .checks()
        .iter()
        .filter(|c| c.attributes.as_ref().is_some_and(|a| a.request.is_none()))
        .count();
    assert_eq!(tcp_checks, 2, "one check per selected connection");
    // Order: the authorizer, then RBAC.
    let blocked = request(&remora_net, ORDERED, "/blocked", true);
    assert_eq!(
        (blocked.status, blocked.body.as_str()),
        (403, "RBAC: access denied")
    );
    let first = request(&remora_net, ORDERED, "/blocked/deny", true);
    assert_eq!(
        (first.status, first.answer_header.as_deref()),
        (403, Some("denied"))
    );
    assert_eq!(
        post(&remora_net, ORDERED, "/upload", true, SMALL_BODY * 10).status,
        413
    );
    assert_eq!(
        post(&remora_net, ORDERED, "/upload", false, SMALL_BODY * 10).status,
        200
    );
}
