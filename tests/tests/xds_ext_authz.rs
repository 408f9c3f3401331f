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
//! A second run compares what each request adds to the filter's statistics
//! (`http.<prefix>.ext_authz.*`) and to the RBAC filters' of its chain (`http.<prefix>.rbac.*`:
//! istiod's shadow filter, a DENY policy, dry-run policies), and the statistics' names on
//! `/stats` and `/stats/prometheus` (Envoy with the tags Istio's bootstrap gives it).

mod custom;

use custom::*;
use remora_e2e::envoy_xds::{istio_stats_config, nets_or_skip};
use remora_e2e::ext_authz::GrpcAuthorizer;
use remora_e2e::peer::{self, any_addr};
use remora_e2e::service::{peer_program, Service};
use remora_e2e::stat_deltas::{self, delta, prometheus_samples, Stats};
use remora_e2e::PodNet;
use serde_json::Value;
use std::time::Duration;

const CLIENT_TIME: Duration = Duration::from_secs(10);

/// The workload on each port (HTTP servers, TCP echo servers) and the HTTP authorizer, in
/// `net`'s pod; the gRPC authorizer on 10.1.0.2 in its peer namespace.
fn workload(net: &PodNet) -> (Vec<Service>, Vec<peer::Server>, GrpcAuthorizer) {
    remora_e2e::sidecars::prepare(net);
    let grpc = GrpcAuthorizer::start(&net.peer, GRPC_AUTHZ.parse().expect("address"));
    let app = peer_program("http_server.py")
        .to_string_lossy()
        .into_owned();
    let authz = peer_program("ext_authz_http.py")
        .to_string_lossy()
        .into_owned();
    let mut services: Vec<Service> = [
        UP,
        DOWN,
        DOWN_OPEN,
        GRPC,
        ORDERED,
        HASTY,
        CHAINED,
        REROUTE,
        REROUTE_CLEARED,
        PLAIN,
    ]
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
    /// The gRPC authorizer's header for the client, and the path the HTTP authorizer was
    /// asked about (after the gRPC one's query edits), as the workload was told.
    response_header: Option<String>,
    seen_path: Option<String>,
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
    let response_header = header("x-ext-authz-response");
    let seen_path = json
        .as_ref()
        .and_then(|j| j["x-ext-authz-seen-path"].as_str().map(str::to_string));
    let checked_bytes = json
        .as_ref()
        .and_then(|j| j["x-ext-authz-body-bytes"].as_str().map(str::to_string));
    Outcome {
        status,
        answer_header,
        upstream_header,
        checked_bytes,
        grpc,
        response_header,
        seen_path,
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
        // The gRPC authorizer's query edits (seen by the next authorizer) and response header.
        (CHAINED, "/headers?z=2&drop=1&a=1", true, 0),
        (CHAINED, "/headers", true, 0),
        // The authorizer's header matches another route: taken only where the filter clears
        // the route cache; the route chosen before the check otherwise.
        (REROUTE, "/hello", true, 0),
        (REROUTE_CLEARED, "/hello", true, 0),
        (REROUTE_CLEARED, "/hello", false, 0),
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
        r_log.iter().any(|l| l.contains(" 401 UAEX "))
            && r_log.iter().any(|l| l.contains(" 503 UAEX ")),
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
    let kept = request(&remora_net, REROUTE, "/hello", true);
    assert_eq!(
        (kept.status, kept.body.as_str()),
        (200, "hello\n"),
        "{kept:?}"
    );
    let chosen_again = request(&remora_net, REROUTE_CLEARED, "/hello", true);
    assert_eq!(
        (chosen_again.status, chosen_again.body.as_str()),
        (200, "rerouted\n"),
        "{chosen_again:?}"
    );
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

/// Requests whose counting is compared (port, path, selected, body bytes): one a filter does
/// not select, allowed and denied ones (HTTP and gRPC authorizers), the authorizer unreachable
/// (failing closed, then open), a check timing out, a body over the limit (413 before any
/// check), one allowed then denied by the RBAC filter after the authorizer, two
/// authorizers in one chain, and one no authorizer checks that a DENY policy lets through
/// and a dry-run ALLOW policy would have allowed, and one through a chain without filters.
const COUNTED: [(u16, &str, bool, usize); 16] = [
    (UP, "/hello", false, 0),
    (UP, "/hello", true, 0),
    (UP, "/deny", true, 0),
    (DOWN, "/hello", true, 0),
    (DOWN_OPEN, "/hello", true, 0),
    (HASTY, "/slow", true, 0),
    (GRPC, "/headers", true, 0),
    (GRPC, "/deny", true, 0),
    (GRPC, "/headers", false, 0),
    (ORDERED, "/upload", true, SMALL_BODY * 10),
    (ORDERED, "/blocked", true, 0),
    (CHAINED, "/headers", true, 0),
    (REROUTE, "/hello", true, 0),
    (REROUTE_CLEARED, "/hello", false, 0),
    (ORDERED, "/upload", false, 0),
    (PLAIN, "/hello", false, 0),
];

/// The HTTP filters' statistics (`http.<prefix>.ext_authz.*`) and the route clusters'
/// (`cluster.<name>.ext_authz.*`) of the sidecar whose admin API is on `port`.
fn http_ext_authz_stats(net: &PodNet, port: u16) -> Stats {
    stat_deltas::stats(net, port, |n| {
        (n.starts_with("http.") || n.starts_with("cluster.")) && n.contains(".ext_authz.")
    })
}

/// The HTTP RBAC filters' statistics (`http.<prefix>.rbac.*`, istiod's shadow filter for the
/// CUSTOM policy's and the dry-run filters' under their shadow stat prefixes) of the sidecar
/// whose admin API is on `port`.
fn http_rbac_stats(net: &PodNet, port: u16) -> Stats {
    stat_deltas::stats(net, port, |n| {
        n.starts_with("http.") && n.contains(".rbac.")
    })
}

/// Envoy counts each check in the route cluster's statistics too (`cluster.<name>.ext_authz.`
/// and the same name, but `disabled`), Remora does not (docs/xds.md): asserted as observed,
/// then left out.
fn without_cluster_counts(envoy: Vec<String>) -> Vec<String> {
    let (cluster, http): (Vec<String>, Vec<String>) =
        envoy.into_iter().partition(|d| d.starts_with("cluster."));
    let expected: Vec<String> = http
        .iter()
        .filter(|d| !d.contains(".ext_authz.disabled "))
        .filter_map(|d| {
            let (manager, rest) = d.strip_prefix("http.inbound_0.0.0.0_")?.split_once('.')?;
            Some(format!("cluster.inbound|{manager}||.{rest}"))
        })
        .collect();
    assert_eq!(cluster, expected, "Envoy's cluster counts: {http:?}");
    http
}

#[test]
fn custom_authorization_counts_as_envoy_does() {
    let Some((binary, (remora_net, envoy_net))) = nets_or_skip() else {
        return;
    };
    let resources = resources();
    let (_r, _r_echo, _r_grpc) = workload(&remora_net);
    let remora = resources.start_remora(&remora_net);
    let (_e, _e_echo, _e_grpc) = workload(&envoy_net);
    let envoy = resources.start_envoy_with(&envoy_net, &binary, istio_stats_config);
    let sides = [
        (&remora_net, remora_e2e::ADMIN_PORT),
        (&envoy_net, remora_e2e::envoy::ADMIN_PORT),
    ];
    let mut before = sides.map(|(net, port)| http_ext_authz_stats(net, port));
    let mut rbac_before = sides.map(|(net, port)| http_rbac_stats(net, port));
    let names = |s: &Stats| {
        s.keys()
            .filter(|n| n.starts_with("http."))
            .cloned()
            .collect::<Vec<_>>()
    };
    // Made with the listener, before any request: 13 for each of the 9 HTTP chains.
    assert_eq!(names(&before[0]), names(&before[1]));
    assert_eq!(names(&before[0]).len(), 9 * 13);
    // The RBAC filters' too: each chain's `rbac.allowed|denied` and its CUSTOM filter's
    // `rbac.istio_ext_authz_.shadow_*`; on the two chains with a DENY policy and a dry-run
    // one, the dry-run filter's shadow counts and the DENY filter's, without a prefix
    // (`rbac.shadow_*`).
    assert_eq!(names(&rbac_before[0]), names(&rbac_before[1]));
    assert_eq!(names(&rbac_before[0]).len(), 9 * 4 + 2 * (2 + 2));
    let plain = format!("http.inbound_0.0.0.0_{PLAIN}.");
    assert!(!names(&rbac_before[0]).iter().any(|n| n.starts_with(&plain)));
    let mut seen = Vec::new();
    let mut rbac_seen = Vec::new();
    for (port, path, select, body) in COUNTED {
        let mut case = Vec::new();
        let mut rbac_case = Vec::new();
        for (i, (net, admin)) in sides.iter().enumerate() {
            let status = post(net, port, path, select, body).status;
            let after = http_ext_authz_stats(net, *admin);
            case.push((status, delta(&before[i], &after)));
            before[i] = after;
            let after = http_rbac_stats(net, *admin);
            rbac_case.push(delta(&rbac_before[i], &after));
            rbac_before[i] = after;
        }
        rbac_seen.push((port, path, select, rbac_case));
        let envoy_counts = without_cluster_counts(case[1].1.clone());
        seen.push((
            port,
            path,
            select,
            case[0].clone(),
            (case[1].0, envoy_counts),
        ));
    }
    let report: Vec<String> = seen
        .iter()
        .map(|(p, path, s, r, e)| {
            format!("{p} {path} selected={s}\n  remora {r:?}\n  envoy  {e:?}")
        })
        .collect();
    let report = report.join("\n");
    eprintln!("{report}");
    for (port, path, _, r, e) in &seen {
        assert_eq!(r, e, "{port} {path}: Remora and Envoy differ:\n{report}");
    }
    let rbac_report: Vec<String> = rbac_seen
        .iter()
        .map(|(p, path, s, c)| {
            format!(
                "{p} {path} selected={s}\n  remora {:?}\n  envoy  {:?}",
                c[0], c[1]
            )
        })
        .collect();
    let rbac_report = rbac_report.join("\n");
    eprintln!("{rbac_report}");
    for (port, path, _, c) in &rbac_seen {
        assert_eq!(
            c[0], c[1],
            "{port} {path}: RBAC counts differ:\n{rbac_report}"
        );
    }
    // Per connection manager, each filter counting its own, the shadow counts named with
    // the filter's shadow_rules_stat_prefix.
    assert_eq!(
        rbac_seen[14].3[0],
        [
            "http.inbound_0.0.0.0_8084.rbac.allowed +1",
            "http.inbound_0.0.0.0_8084.rbac.istio_dry_run_allow_.shadow_allowed +1",
            "http.inbound_0.0.0.0_8084.rbac.istio_ext_authz_.shadow_allowed +1",
        ]
    );
    assert_eq!(
        rbac_seen[10].3[0],
        [
            "http.inbound_0.0.0.0_8084.rbac.denied +1",
            "http.inbound_0.0.0.0_8084.rbac.istio_ext_authz_.shadow_denied +1",
        ]
    );
    assert_eq!(
        rbac_seen[11].3[0],
        [
            "http.inbound_0.0.0.0_8086.rbac.allowed +1",
            "http.inbound_0.0.0.0_8086.rbac.istio_dry_run_deny_.shadow_denied +1",
            "http.inbound_0.0.0.0_8086.rbac.istio_ext_authz_.shadow_denied +1",
        ]
    );
    assert_eq!((seen[15].3 .0, &rbac_seen[15].3[0]), (200, &vec![]));
    // Nor made for the chain without filters by a request through it.
    assert!(!names(&rbac_before[0]).iter().any(|n| n.starts_with(&plain)));
    // What the filter is for, counted.
    let counted = |i: usize| seen[i].3 .1.clone();
    assert_eq!(
        counted(0),
        ["http.inbound_0.0.0.0_8080.ext_authz.disabled +1"]
    );
    assert_eq!(
        counted(4),
        [
            "http.inbound_0.0.0.0_8082.ext_authz.error +1",
            "http.inbound_0.0.0.0_8082.ext_authz.failure_mode_allowed +1"
        ]
    );
    assert_eq!(counted(11), ["http.inbound_0.0.0.0_8086.ext_authz.ok +2"]);
    // The same names at the end, and in Prometheus form.
    assert_eq!(names(&before[0]), names(&before[1]), "{report}");
    let prometheus = sides.map(|(net, port)| prometheus_samples(net, port, "envoy_http_inbound"));
    // The filter's, not those of istiod's shadow RBAC filter (`rbac_istio_ext_authz_`).
    let authz = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l.contains("_ext_authz") && !l.contains("_rbac_"))
            .cloned()
            .collect()
    };
    assert!(
        authz(&prometheus[0]).contains(&"envoy_http_inbound_0_0_0_0_8086_ext_authz_ok 2".into()),
        "{:#?}",
        prometheus[0]
    );
    let [remora_prom, envoy_prom] = [&prometheus[0], &prometheus[1]].map(|p| authz(p));
    let only = |a: &[String], b: &[String]| -> Vec<String> {
        a.iter().filter(|l| !b.contains(l)).cloned().collect()
    };
    assert_eq!(
        (
            only(&remora_prom, &envoy_prom),
            only(&envoy_prom, &remora_prom)
        ),
        (vec![], vec![]),
        "Remora's Prometheus samples only, then Envoy's only"
    );
    assert_eq!(remora_prom.len(), 9 * (13 + 13));
    // The RBAC filters' in Istio's Prometheus form, the same as Envoy's.
    let rbac = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l.contains("_rbac"))
            .cloned()
            .collect()
    };
    let [remora_rbac, envoy_rbac] = [&prometheus[0], &prometheus[1]].map(|p| rbac(p));
    assert_eq!(
        (
            only(&remora_rbac, &envoy_rbac),
            only(&envoy_rbac, &remora_rbac)
        ),
        (vec![], vec![]),
        "RBAC: Remora's Prometheus samples only, then Envoy's only"
    );
    assert!(!remora_rbac.is_empty());
    if remora_e2e::promtool::available() {
        remora_e2e::promtool::assert_valid(&remora.metrics().to_string());
    }
    drop((remora, envoy));
}
