//! The inbound side in istiod mode, end to end: the pod's Remora runs as an injected sidecar
//! (Istio's environment, UID 1337 behind `remora capture`) with its certificate and its
//! `virtualInbound` from the harness's control plane, and a real Envoy in the peer namespace
//! is the client pod's sidecar, configured as istiod configures an outbound cluster with Istio
//! mTLS (SNI `outbound_.PORT_._.<host>`, ALPN `istio-peer-exchange`,`istio`, the client's
//! workload certificate from the same CA). What istiod's inbound chains say is what happens:
//! before the first listeners nothing is served; STRICT refuses plaintext; mesh TLS from Envoy
//! is terminated and the application gets plaintext HTTP; an HTTP RBAC filter, as istiod
//! compiles an AuthorizationPolicy, denies (403 `RBAC: access denied`) or allows the Envoy
//! client's SPIFFE principal; a CUSTOM policy for that principal sends its requests to a gRPC
//! external authorizer, which is told the client's and the workload's SPIFFE IDs.

use remora_e2e::envoy::{self, Envoy};
use remora_e2e::ext_authz::GrpcAuthorizer;
use remora_e2e::istiod::ads::type_url;
use remora_e2e::istiod::{injected_sidecar_of, ControlPlane, PodFiles, ISTIOD_PORT};
use remora_e2e::peer::{self, any_addr};
use remora_e2e::service::{peer_program, Service};
use remora_e2e::xds_resources::{http_rbac, inbound_clusters, network_rbac, virtual_inbound};
use remora_e2e::{PodNet, RemoraCommand};
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "projected-token-for-httpbin";
const STEP_TIME: Duration = Duration::from_secs(30);
const CLIENT_TIME: Duration = Duration::from_secs(20);
const HTTP_PORT: u16 = 8080;
/// Where the client application reaches its Envoy, on the peer namespace's loopback.
const APP_PORT: u16 = 18080;
/// The workload's TCP port (no chain of its own: the catch-all passthrough chains).
const ECHO_PORT: u16 = 7000;
const APP_ECHO_PORT: u16 = 17000;
const SERVER_HOST: &str = "httpbin.server.svc.cluster.local";
/// The identity the control plane's CA gives the pod's Remora (its namespace and account).
const SERVER_ID: &str = "spiffe://cluster.local/ns/server/sa/httpbin";
/// The Envoy client sidecar's identity.
const CLIENT_ID: &str = "spiffe://cluster.local/ns/client/sa/sleep";

/// The pod's sidecar in istiod mode, as the injector configures it.
fn istiod_sidecar<'a>(net: &'a PodNet, token_file: &Path, root_file: &Path) -> RemoraCommand<'a> {
    injected_sidecar_of(net, "httpbin-7c9f4d8b6-q2w3e", "server", "httpbin").config(&format!(
        "istiod:\n  token_file: {}\n  root_cert_file: {}\n",
        token_file.display(),
        root_file.display(),
    ))
}

/// The client pod's Envoy: the application's loopback listener, and istiod's outbound cluster
/// to the server pod with Istio mTLS.
fn envoy_client(certs: &Path, server: Ipv4Addr) -> String {
    let addr = |ip: Ipv4Addr, port: u16| json!({"socket_address": {"address": ip.to_string(), "port_value": port}});
    let file = |f: &str| json!({"filename": certs.join(f).to_string_lossy()});
    let cluster = format!("outbound|{HTTP_PORT}||{SERVER_HOST}");
    let echo = format!("outbound|{ECHO_PORT}||echo.server.svc.cluster.local");
    let mtls_cluster = |name: &str, port: u16, sni: String| {
        json!({"name": name, "type": "STATIC", "connect_timeout": "5s",
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": addr(server, port)}}]}]},
            "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": sni,
                "common_tls_context": {
                    "alpn_protocols": ["istio-peer-exchange", "istio"],
                    "tls_params": {"tls_minimum_protocol_version": "TLSv1_2",
                        "tls_maximum_protocol_version": "TLSv1_3"},
                    "tls_certificates": [{"certificate_chain": file("cert-chain.pem"),
                        "private_key": file("key.pem")}],
                    "validation_context": {"trusted_ca": file("root-cert.pem"),
                        "match_typed_subject_alt_names": [
                            {"san_type": "URI", "matcher": {"exact": SERVER_ID}}]}}}}})
    };
    json!({
        "admin": {"address": addr(Ipv4Addr::LOCALHOST, envoy::ADMIN_PORT)},
        "static_resources": {
            "listeners": [{"name": "outbound_http", "address": addr(Ipv4Addr::LOCALHOST, APP_PORT),
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "outbound_http",
                        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"],
                            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster}}]}]},
                        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]},
                {"name": "outbound_tcp", "address": addr(Ipv4Addr::LOCALHOST, APP_ECHO_PORT),
                 "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                        "stat_prefix": "outbound_tcp", "cluster": echo}}]}]}],
            "clusters": [
                mtls_cluster(&cluster, HTTP_PORT, format!("outbound_.{HTTP_PORT}_._.{SERVER_HOST}")),
                mtls_cluster(&echo, ECHO_PORT,
                    format!("outbound_.{ECHO_PORT}_._.echo.server.svc.cluster.local"))]
        }
    })
    .to_string()
}

/// istiod's inbound configuration for the pod, STRICT on [`HTTP_PORT`], with `http_filters`
/// and `tcp_filters`.
fn serve_inbound(
    plane: &ControlPlane,
    version: &str,
    http_filters: &[Value],
    tcp_filters: &[Value],
) {
    let ads = plane.ads();
    ads.set(type_url::CLUSTER, version, &inbound_clusters(HTTP_PORT));
    ads.set(
        type_url::LISTENER,
        version,
        &[virtual_inbound(HTTP_PORT, true, http_filters, tcp_filters)],
    );
}

/// Whether bytes sent through the client's Envoy to the workload's echo server come back.
fn echoes(net: &PodNet) -> bool {
    let data = peer::pattern(64 * 1024);
    let app = SocketAddr::from((Ipv4Addr::LOCALHOST, APP_ECHO_PORT));
    peer::echo_exchange(&net.peer, app, &data).is_ok_and(|back| back == data)
}

fn wait_until(what: &str, ok: impl Fn() -> bool) {
    wait_or(what, ok, String::new);
}

/// Wait for `ok`, or fail with `what` and `context()`.
fn wait_or(what: &str, ok: impl Fn() -> bool, context: impl Fn() -> String) {
    let deadline = Instant::now() + STEP_TIME;
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the sidecar answered to each listener response, and its log.
fn lds_answers(plane: &ControlPlane, sidecar: &remora_e2e::Remora<'_>) -> String {
    let answers: Vec<String> = plane
        .ads()
        .requests()
        .into_iter()
        .filter(|r| r.type_url == type_url::LISTENER && r.answers())
        .map(|r| format!("{} {:?}", r.version_info, r.error_detail))
        .collect();
    format!("LDS answers: {answers:?}\n{}", sidecar.stderr())
}

/// A request from the client application through its Envoy: status and body.
fn through_envoy(net: &PodNet, path: &str) -> (u16, String) {
    peer::curl_status(
        &net.peer,
        &[&format!("http://127.0.0.1:{APP_PORT}{path}")],
        CLIENT_TIME,
    )
}

#[test]
fn an_envoy_sidecar_reaches_the_workload_as_virtual_inbound_says() {
    let Some(binary) = envoy::binary_or_skip() else {
        return;
    };
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let PodFiles {
        ca,
        token,
        root,
        hosts: _hosts,
    } = PodFiles::write(&net, TOKEN);
    net.capture_default();
    let plane = ControlPlane::start(
        &net.peer,
        net.peer_addr(ISTIOD_PORT),
        Arc::clone(&ca),
        TOKEN,
    );
    let mut sidecar = istiod_sidecar(&net, &token, &root).start();
    let script = peer_program("http_server.py")
        .to_string_lossy()
        .into_owned();
    let _echo = remora_e2e::peer::Server::echo(&net.pod, any_addr(ECHO_PORT));
    let _app = Service::start(
        &net.pod,
        "python3",
        &[&script, &HTTP_PORT.to_string()],
        any_addr(HTTP_PORT),
    );
    let client_dir = net.binary().make_dir("envoy-certs");
    ca.install(&client_dir, &ca.workload(CLIENT_ID));
    let envoy = Envoy::start(
        &net.peer,
        &binary,
        net.binary(),
        &envoy_client(&client_dir, net.pod_ip),
    );
    let app = SocketAddr::new(net.pod_ip.into(), HTTP_PORT);

    // Before the first listeners there is no virtualInbound, as Envoy has no 15006 before
    // LDS: a captured connection is not served, even plaintext, which the config file's
    // default (PERMISSIVE) would pass.
    wait_until("a certificate issued", || !plane.issued().is_empty());
    let out = peer::curl(&net.peer, &["-s", &format!("http://{app}/")], CLIENT_TIME);
    assert!(!out.status.success(), "served before any listener: {out:?}");
    let (status, _) = through_envoy(&net, "/hello");
    assert_ne!(status, 200, "{}", sidecar.stderr());

    // istiod's inbound configuration, STRICT, no policy.
    serve_inbound(&plane, "v1", &[], &[]);
    sidecar.wait_ready(STEP_TIME);
    wait_until("a request through Envoy served", || {
        through_envoy(&net, "/headers").0 == 200
    });
    let (status, body) = through_envoy(&net, "/headers");
    assert_eq!(status, 200, "{body}\n{}", envoy.logs());
    // The application got plaintext HTTP, with the client sidecar named by its certificate.
    let headers: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let xfcc = headers["x-forwarded-client-cert"]
        .as_str()
        .unwrap_or_default();
    assert!(xfcc.contains(&format!("URI={CLIENT_ID}")), "{body}");
    assert!(xfcc.contains(&format!("By={SERVER_ID}")), "{body}");
    assert!(
        envoy.stat(&format!(
            "cluster.outbound|{HTTP_PORT}||{SERVER_HOST}.ssl.handshake"
        )) >= 1
    );

    // TCP to a port with no chain of its own: the catch-all mTLS chain, passed through to
    // the workload from 127.0.0.6.
    wait_until("bytes echoed through Envoy", || echoes(&net));

    // STRICT: plaintext from a client without a sidecar finds no chain.
    let out = peer::curl(&net.peer, &["-s", &format!("http://{app}/")], CLIENT_TIME);
    assert!(
        !out.status.success(),
        "plaintext reached a STRICT port: {out:?}"
    );

    // An AuthorizationPolicy denying the client's principal: 403, as Envoy's RBAC answers.
    let deny = http_rbac("DENY", "ns[server]-policy[deny-sleep]-rule[0]", CLIENT_ID);
    serve_inbound(&plane, "v2", &[deny], &[]);
    wait_or(
        "the DENY policy in force",
        || through_envoy(&net, "/hello").0 == 403,
        || lds_answers(&plane, &sidecar),
    );
    let (status, body) = through_envoy(&net, "/hello");
    assert_eq!((status, body.as_str()), (403, "RBAC: access denied"));

    // ALLOW for another principal only: still denied; ALLOW for the client: served.
    let other = http_rbac("ALLOW", "ns[server]-policy[only-other]-rule[0]", SERVER_ID);
    serve_inbound(&plane, "v3", &[other], &[]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(through_envoy(&net, "/hello").0, 403);
    let allow = http_rbac("ALLOW", "ns[server]-policy[allow-sleep]-rule[0]", CLIENT_ID);
    serve_inbound(&plane, "v4", &[allow], &[]);
    wait_or(
        "the ALLOW policy in force",
        || through_envoy(&net, "/hello").0 == 200,
        || lds_answers(&plane, &sidecar),
    );

    // Network RBAC on the TCP chains: a DENY for the client's principal closes its
    // connections before a byte reaches the workload; HTTP stays allowed.
    let allow = http_rbac("ALLOW", "ns[server]-policy[allow-sleep]-rule[0]", CLIENT_ID);
    let deny = network_rbac("DENY", "ns[server]-policy[deny-tcp]-rule[0]", CLIENT_ID);
    serve_inbound(&plane, "v5", &[allow], &[deny]);
    wait_or(
        "the network DENY in force",
        || !echoes(&net),
        || lds_answers(&plane, &sidecar),
    );
    assert_eq!(through_envoy(&net, "/hello").0, 200);

    // A CUSTOM policy selecting the client's principal: istiod's shadow RBAC filter and the
    // ext_authz filter of a gRPC provider in the peer namespace.
    let authz_cluster = "outbound|9191||ext-authz.server.svc.cluster.local";
    let authorizer = GrpcAuthorizer::start(&net.peer, net.peer_addr(9191));
    let shadow = json!({"name": "envoy.filters.http.rbac", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
        "shadow_rules": {"action": "DENY", "policies": {
            "istio-ext-authz-ns[server]-policy[ext]-rule[0]": {
                "permissions": [{"and_rules": {"rules": [{"any": true}]}}],
                "principals": [{"and_ids": {"ids": [{"or_ids": {"ids": [{"filter_state": {
                    "key": "io.istio.peer_principal",
                    "string_match": {"exact": CLIENT_ID}}}]}}]}}]}}},
        "shadow_rules_stat_prefix": "istio_ext_authz_"}});
    let ext_authz = json!({"name": "envoy.filters.http.ext_authz", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
        "grpc_service": {"envoy_grpc": {"cluster_name": authz_cluster,
            "authority": authz_cluster.replace('|', "_.")}, "timeout": "600s"},
        "transport_api_version": "V3",
        "filter_enabled_metadata": {"filter": "envoy.filters.http.rbac",
            "path": [{"key": "istio_ext_authz_shadow_effective_policy_id"}],
            "value": {"string_match": {"prefix": "istio-ext-authz"}}}}});
    let mut clusters = inbound_clusters(HTTP_PORT);
    clusters.push(json!({"name": authz_cluster, "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": authz_cluster, "endpoints": [{"lb_endpoints": [{"endpoint":
            {"address": {"socket_address": {"address": net.peer_ip.to_string(), "port_value": 9191}}}}]}]},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}}));
    let ads = plane.ads();
    ads.set(type_url::CLUSTER, "v6", &clusters);
    ads.set(
        type_url::LISTENER,
        "v6",
        &[virtual_inbound(HTTP_PORT, true, &[shadow, ext_authz], &[])],
    );
    wait_or(
        "the CUSTOM policy in force",
        || through_envoy(&net, "/deny").0 == 401,
        || lds_answers(&plane, &sidecar),
    );
    let (status, body) = through_envoy(&net, "/headers");
    assert_eq!(status, 200, "{body}");
    let headers: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(headers["x-ext-authz-check-result"], "allowed", "{body}");
    let (status, body) = through_envoy(&net, "/deny");
    assert_eq!((status, body.as_str()), (401, "denied by ext_authz\n"));
    let check = authorizer
        .checks()
        .into_iter()
        .filter_map(|c| c.attributes)
        .next_back()
        .expect("a check");
    let principal = |p: Option<
        &envoy_types::pb::envoy::service::auth::v3::attribute_context::Peer,
    >| { p.map(|p| p.principal.clone()).unwrap_or_default() };
    assert_eq!(principal(check.source.as_ref()), CLIENT_ID);
    assert_eq!(principal(check.destination.as_ref()), SERVER_ID);

    let m = sidecar.wait_for_metrics("RBAC decisions", STEP_TIME, |m| {
        m.value(
            "remora_authorization_decisions_total",
            &[("protocol", "http")],
        ) >= 3.0
            && m.value(
                "remora_authorization_decisions_total",
                &[
                    ("protocol", "tcp"),
                    ("action", "deny"),
                    ("result", "denied"),
                ],
            ) >= 1.0
    });
    assert!(
        m.value(
            "istio_requests_total",
            &[("response_code", "403"), ("source_principal", CLIENT_ID)]
        ) >= 1.0,
        "{m}"
    );
}
