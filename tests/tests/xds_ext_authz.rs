//! AuthorizationPolicy's CUSTOM action, Envoy as the oracle: the same `virtualInbound` (an
//! HTTP chain per port with istiod's shadow RBAC filter naming the requests a CUSTOM policy
//! selects, and the `ext_authz` filter it switches on) given to Remora and to a real Envoy 1.40,
//! each the sidecar of a captured pod with the same workload and the same external authorizer
//! (`peers/ext_authz_http.py`, Envoy's HTTP flavour, on the pod's loopback, reached as the
//! cluster `outbound|9000||ext-authz.foo.svc.cluster.local`), and Envoy's gRPC flavour
//! (`remora_e2e::ext_authz::GrpcAuthorizer`, on another host: 10.1.0.2 in the peer namespace, as istiod's
//! `outbound|9191||…` cluster reaches a service) with istiod's `with_request_body`. The same
//! plaintext requests from the peer reach each pod; status, body, the authorizer's header in
//! the answer and the ones it adds for the workload must be the same, and what is expected.
//! `xds_ext_authz_stats.rs` compares what they count.

use remora_e2e::custom_authz::client::{post, request, workload};
use remora_e2e::custom_authz::*;
use remora_e2e::envoy_xds::nets_or_skip;
use remora_e2e::peer;
use remora_e2e::PodNet;
use std::time::Duration;

/// Whether bytes sent to `port` of the pod come back.
fn echoes(net: &PodNet, port: u16) -> bool {
    let data = peer::pattern(4096);
    let addr = std::net::SocketAddr::new(net.pod_ip.into(), port);
    peer::echo_exchange(&net.peer, addr, &data).is_ok_and(|back| back == data)
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
        // No route: not checked (404 NR).
        (REROUTE, "/nowhere", true, 0),
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
