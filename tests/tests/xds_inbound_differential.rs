//! Envoy is the oracle on the inbound side: the same `virtualInbound` (istiod's chains for an
//! HTTP port in PERMISSIVE mode: mesh TLS with the workload's certificate, and plaintext; and
//! the catch-all chains that pass any other port through as bytes),
//! its connection manager as istiod writes it for a sidecar (`APPEND_FORWARD` of
//! `x-forwarded-client-cert` with the subject, DNS and URI of the peer, path normalisation),
//! and AuthorizationPolicies compiled into its RBAC filters (DENY, then ALLOW with a dry-run
//! policy) given to Remora and to a real Envoy 1.40, each the sidecar of a captured pod whose
//! application echoes what it received. The same requests reach each from the peer namespace,
//! over mesh TLS (`openssl s_client` with a workload certificate from the same CA, Istio's
//! ALPN and SNI, as a client sidecar dials) or in plaintext, and what each proxy made of them
//! is compared: the status, what the application received (path and the headers a proxy
//! sets: `x-forwarded-client-cert`, `x-forwarded-proto`, `x-forwarded-for`, …), the body of
//! an answer the proxy made itself, the access-log line, and in the end the RBAC filters'
//! statistics.
//!
//! Envoy upstream has no `istio_authn` filter, so the policies name their principals as
//! `authenticated.principal_name` (the peer certificate's URI SAN), which both proxies take.

use remora_e2e::access_logs::{self, file_log, log_file};
use remora_e2e::backend;
use remora_e2e::certs::MeshCa;
use remora_e2e::envoy_xds::{istio_stats_config, nets_or_skip, serve_workload_secrets, Resources};
use remora_e2e::http_client::{self, Response};
use remora_e2e::mesh::s_client;
use remora_e2e::peer::any_addr;
use remora_e2e::sidecars::Sidecar;
use remora_e2e::stat_deltas::{self, Stats};
use remora_e2e::xds_resources::{inbound_cluster, inbound_hcm, inbound_tls, virtual_inbound};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const PORT: u16 = 8080;
/// A port of the workload with no chain of its own: the catch-all chains pass it through.
const TCP_PORT: u16 = 7000;
const SERVER_ID: &str = "spiffe://cluster.local/ns/server/sa/httpbin";
const CLIENT_ID: &str = "spiffe://cluster.local/ns/client/sa/sleep";
const OTHER_ID: &str = "spiffe://cluster.local/ns/test/sa/other";
/// From the mesh's CA, outside its trust domain (the chains accept `spiffe://cluster.local/`).
const FOREIGN_ID: &str = "spiffe://other.local/ns/test/sa/other";
/// From another CA.
const FORGED_ID: &str = "spiffe://cluster.local/ns/client/sa/forged";
const SNI: &str = "outbound_.8080_._.httpbin.server.svc.cluster.local";
const FORMAT: &str = "%RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% \
                      %UPSTREAM_CLUSTER% %REQUESTED_SERVER_NAME% %PROTOCOL%\n";

/// Who sends a request: a client sidecar with a workload certificate, or no TLS at all.
#[derive(Clone, Copy, Debug)]
enum Client {
    Mesh(&'static str),
    /// TLS with Istio's ALPN, no client certificate.
    TlsWithoutCert,
    Plain,
    /// To [`TCP_PORT`]: mesh TLS from this identity, or plaintext.
    MeshToTcp(&'static str),
    PlainToTcp,
}

/// Each case: who sends, and the request's bytes (each says `Connection: close`).
const CASES: &[(Client, &str)] = &[
    (Client::Mesh(CLIENT_ID), "GET /info HTTP/1.1\r\nHost: httpbin:8080\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /headers HTTP/1.1\r\nHost: httpbin\r\nx-forwarded-client-cert: By=spiffe://a;URI=spiffe://b\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /headers HTTP/1.1\r\nHost: httpbin\r\nx-forwarded-proto: http\r\nx-forwarded-for: 10.9.9.9\r\nx-request-id: abc\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /admin HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /Admin HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /public/../admin HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /%61dmin HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET //admin HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /admin?x=1 HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /admin%2fx HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /info/..%2fadmin HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /admin#frag HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /info HTTP/1.1\r\nHost: httpbin\r\nx-block: 1\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /info HTTP/1.1\r\nHost: httpbin\r\nx-block:\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "POST /data HTTP/1.1\r\nHost: httpbin\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc"),
    (Client::Mesh(CLIENT_ID), "POST /info HTTP/1.1\r\nHost: httpbin\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc"),
    (Client::Mesh(CLIENT_ID), "HEAD /info HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /info HTTP/1.0\r\nHost: httpbin\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /tenant HTTP/1.1\r\nHost: httpbin\r\nx-tenant: blue\r\nx-tenant: red\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /tenant HTTP/1.1\r\nHost: httpbin\r\nx-tenant: red\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /tenant HTTP/1.1\r\nHost: httpbin\r\nx-tenant: red\r\nx-tenant: blue\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /tenant HTTP/1.1\r\nHost: httpbin\r\nx-tenant: blue,red\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /tenant HTTP/1.1\r\nHost: httpbin\r\nx-tenant: blue\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /info HTTP/1.1\r\nHost: httpbin\r\nx-role: user\r\nx-role: admin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /info HTTP/1.1\r\nHost: httpbin\r\nx-role: user, admin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /info HTTP/1.1\r\nHost: httpbin\r\nx-pair: a\r\nx-pair: b\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /info HTTP/1.1\r\nHost: httpbin\r\nx-nu: user\r\nx-nu: admin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /info HTTP/1.1\r\nHost: httpbin\r\nx-nu: admin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /info HTTP/1.1\r\nHost: httpbin\r\nx-nu: user\r\nx-nu: user\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /info HTTP/1.1\r\nHost: httpbin\r\nx-rx: user\r\nx-rx: admin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(OTHER_ID), "GET /info HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(OTHER_ID), "GET /public/x HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(OTHER_ID), "GET /host HTTP/1.1\r\nHost: HTTPBIN.example.com\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(OTHER_ID), "GET /host HTTP/1.1\r\nHost: httpbin.example.com:8080\r\nConnection: close\r\n\r\n"),
    // A gRPC request RBAC denies: answered as gRPC (HTTP 200, grpc-status 7).
    (Client::Mesh(OTHER_ID), "POST /pkg.Svc/Call HTTP/1.1\r\nHost: httpbin\r\ncontent-type: application/grpc\r\nte: trailers\r\nContent-Length: 5\r\nConnection: close\r\n\r\n\0\0\0\0\0"),
    // Bodies: chunked, 100-continue, and a length beside chunked (refused).
    (Client::Mesh(CLIENT_ID), "POST /data HTTP/1.1\r\nHost: httpbin\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "POST /data HTTP/1.1\r\nHost: httpbin\r\nExpect: 100-continue\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc"),
    (Client::Mesh(CLIENT_ID), "POST /data HTTP/1.1\r\nHost: httpbin\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n"),
    // A client naming XFCC hop-by-hop, and path parameters and an absolute-form target.
    (Client::Mesh(CLIENT_ID), "GET /headers HTTP/1.1\r\nHost: httpbin\r\nx-forwarded-client-cert: By=spiffe://a\r\nConnection: close, x-forwarded-client-cert\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET /admin;x=1 HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(CLIENT_ID), "GET http://httpbin/admin HTTP/1.1\r\nHost: other\r\nConnection: close\r\n\r\n"),
    // The catch-all chains: mesh TLS terminated and plaintext passed through, as bytes (no
    // connection manager: no XFCC, no RBAC, no log line).
    (Client::MeshToTcp(CLIENT_ID), "GET /tcp HTTP/1.1\r\nHost: httpbin\r\nx-forwarded-client-cert: By=spiffe://a\r\nConnection: close\r\n\r\n"),
    (Client::PlainToTcp, "GET /tcp HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(FOREIGN_ID), "GET /public/x HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Mesh(FORGED_ID), "GET /public/x HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::TlsWithoutCert, "GET /public/x HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Plain, "GET /info HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
    (Client::Plain, "GET /public/x HTTP/1.1\r\nHost: httpbin\r\nx-forwarded-client-cert: By=spiffe://a;URI=spiffe://b\r\nConnection: close\r\n\r\n"),
    (Client::Plain, "GET /public/x HTTP/1.1\r\nHost: httpbin\r\nx-forwarded-proto: https\r\nConnection: close\r\n\r\n"),
    (Client::Plain, "GET /public/x HTTP/1.0\r\nHost: httpbin\r\n\r\n"),
    (Client::Plain, "GET /admin HTTP/1.1\r\nHost: httpbin\r\nConnection: close\r\n\r\n"),
];

/// The request headers a proxy adds or edits that the comparison looks at (the rest the
/// client sent pass through both alike; `x-request-id` is compared as present or not).
const PROXY_HEADERS: &[&str] = &[
    "x-forwarded-client-cert",
    "x-forwarded-proto",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-envoy-internal",
    "x-envoy-expected-rq-timeout-ms",
    "x-envoy-attempt-count",
    "x-tenant",
    "host",
    "content-length",
    "transfer-encoding",
];

/// An RBAC policy as istiod compiles one rule: `permissions` and `principals`.
fn policy(permissions: Value, principals: Value) -> Value {
    json!({"permissions": [permissions], "principals": [principals]})
}

fn principal(id: &str) -> Value {
    json!({"authenticated": {"principal_name": {"exact": id}}})
}

fn path_prefix(p: &str) -> Value {
    json!({"url_path": {"path": {"prefix": p}}})
}

fn and(rules: Value) -> Value {
    json!({"and_rules": {"rules": rules}})
}

/// The HTTP RBAC filters istiod writes: DENY policies first, then ALLOW ones with a dry-run
/// ALLOW policy in their shadow rules.
fn rbac_filters() -> Vec<Value> {
    let method = |m: &str| json!({"header": {"name": ":method", "string_match": {"exact": m}}});
    let deny = json!({
        "ns[server]-policy[deny-admin]-rule[0]": policy(path_prefix("/admin"), json!({"any": true})),
        "ns[server]-policy[deny-block]-rule[0]": policy(
            json!({"header": {"name": "x-block", "present_match": true}}), json!({"any": true})),
        "ns[server]-policy[deny-role]-rule[0]": policy(
            json!({"header": {"name": "x-role", "string_match": {"exact": "admin"}}}), json!({"any": true})),
        "ns[server]-policy[deny-pair]-rule[0]": policy(
            json!({"header": {"name": "x-pair", "string_match": {"exact": "a,b"}}}), json!({"any": true})),
        "ns[server]-policy[deny-not-user]-rule[0]": policy(
            json!({"header": {"name": "x-nu", "string_match": {"exact": "user"}, "invert_match": true}}), json!({"any": true})),
        "ns[server]-policy[deny-regex]-rule[0]": policy(
            json!({"header": {"name": "x-rx", "safe_regex_match": {"regex": "adm.*"}}}), json!({"any": true})),
    });
    let allow = json!({
        "ns[server]-policy[sleep]-rule[0]": policy(
            json!({"or_rules": {"rules": [
                and(json!([method("GET"), {"not_rule": path_prefix("/tenant")}])),
                and(json!([method("HEAD")])),
                and(json!([method("POST"), {"url_path": {"path": {"exact": "/data"}}}])),
                and(json!([{"header": {"name": "x-tenant", "string_match": {"exact": "red"}}}])),
            ]}}),
            principal(CLIENT_ID)),
        "ns[server]-policy[public]-rule[0]": policy(path_prefix("/public"), json!({"any": true})),
        "ns[server]-policy[host]-rule[0]": policy(
            json!({"header": {"name": ":authority",
                "string_match": {"prefix": "httpbin.example.com", "ignore_case": true}}}),
            json!({"authenticated": {"principal_name": {"suffix": "/sa/other"}}})),
    });
    let dry_run = json!({
        "ns[server]-policy[dry-run]-rule[0]": policy(json!({"any": true}), principal(OTHER_ID)),
    });
    let rbac = |rules: Value| {
        json!({"name": "envoy.filters.http.rbac", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
            "rules": rules,
            "shadow_rules_stat_prefix": "istio_dry_run_allow_"}})
    };
    let mut allow_filter = rbac(json!({"action": "ALLOW", "policies": allow}));
    allow_filter["typed_config"]["shadow_rules"] = json!({"action": "ALLOW", "policies": dry_run});
    vec![
        rbac(json!({"action": "DENY", "policies": deny})),
        allow_filter,
    ]
}

/// istiod's inbound connection manager for [`PORT`] (its RBAC filters), with the rest of
/// what istiod sets on it and the access log.
fn hcm(log: &Path) -> Value {
    let mut hcm = inbound_hcm(PORT, &rbac_filters());
    let c = &mut hcm["typed_config"];
    c["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["max_stream_duration"] =
        json!({"max_stream_duration": "0s", "grpc_timeout_header_max": "0s"});
    c["route_config"]["validate_clusters"] = json!(false);
    c["server_name"] = json!("istio-envoy");
    c["upgrade_configs"] = json!([{"upgrade_type": "websocket"}]);
    c["stream_idle_timeout"] = json!("0s");
    c["path_with_escaped_slashes_action"] = json!("KEEP_UNCHANGED");
    c["access_log"] = file_log(log, FORMAT);
    hcm
}

fn resources(log: &Path) -> Resources {
    let chain = |tls: bool| {
        let mut m = json!({"destination_port": PORT, "transport_protocol": "raw_buffer"});
        let mut c = json!({"name": format!("0.0.0.0_{PORT}"), "filters": [hcm(log)]});
        if tls {
            m = json!({"destination_port": PORT, "transport_protocol": "tls",
                "application_protocols": ["istio", "istio-peer-exchange", "istio-http/1.0",
                    "istio-http/1.1", "istio-h2"]});
            c["transport_socket"] = inbound_tls(&["h2", "http/1.1"]);
        }
        c["filter_chain_match"] = m;
        c
    };
    // istiod's catch-all chains for every other port, to the original destination over
    // `tcp_proxy` (without `istio_authn`, which Envoy upstream does not have).
    let passthrough = "InboundPassthroughClusterIpv4";
    let tcp = json!([{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
        "stat_prefix": passthrough, "cluster": passthrough}}]);
    let any = json!([{"address_prefix": "0.0.0.0", "prefix_len": 0}]);
    let catch_all_tls = json!({"name": "virtualInbound", "filter_chain_match": {
            "prefix_ranges": any, "transport_protocol": "tls",
            "application_protocols": ["istio-peer-exchange", "istio"]},
        "transport_socket": inbound_tls(&["istio-peer-exchange", "h2", "http/1.1"]),
        "filters": tcp});
    let catch_all_plain = json!({"name": "virtualInbound", "filter_chain_match": {
            "prefix_ranges": any, "transport_protocol": "raw_buffer"},
        "filters": tcp});
    let mut listener = virtual_inbound(PORT, false, &[], &[]);
    listener["filter_chains"] = json!([chain(true), chain(false), catch_all_tls, catch_all_plain]);
    Resources {
        listeners: json!([listener]),
        clusters: json!([
            inbound_cluster(&format!("inbound|{PORT}||")),
            inbound_cluster(passthrough)
        ]),
        routes: json!([]),
        endpoints: json!([]),
    }
}

/// What a proxy made of one request.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// An interim response before it (`100 Continue`).
    interim: Option<u16>,
    status: Option<u16>,
    /// What the application received: its path and the headers of [`PROXY_HEADERS`].
    app: Option<BTreeMap<String, String>>,
    /// The proxy's own answer's body and response headers (`date` aside).
    reply: Option<String>,
    /// The response's headers (`date` aside; a proxied response's length, and the value of
    /// `x-envoy-upstream-service-time`, which is a time, as present or not).
    headers: Vec<String>,
    log: String,
    /// What the RBAC filters counted.
    rbac: Vec<String>,
}

fn outcome(response: Result<Response, String>, log: String) -> Outcome {
    let r = match response {
        Ok(r) => r,
        Err(e) => {
            return Outcome {
                interim: None,
                status: None,
                app: None,
                reply: Some(e),
                headers: Vec::new(),
                log,
                rbac: Vec::new(),
            }
        }
    };
    // An interim response: the final one follows it.
    let (interim, r) = match r.status {
        100..=199 => match http_client::parse_response(&r.body) {
            Ok(last) => (Some(r.status), last),
            Err(_) => (None, r),
        },
        _ => (None, r),
    };
    let echoed: Option<Value> = serde_json::from_slice(&r.body).ok();
    let app = echoed
        .as_ref()
        .filter(|e| e.get("headers").is_some())
        .map(|e| {
            let mut seen = BTreeMap::new();
            seen.insert("path".into(), e["path"].as_str().unwrap_or_default().into());
            seen.insert(
                "method".into(),
                e["method"].as_str().unwrap_or_default().into(),
            );
            let headers = &e["headers"];
            for h in PROXY_HEADERS {
                if let Some(v) = headers.get(*h) {
                    seen.insert((*h).into(), v.to_string());
                }
            }
            let rid = headers.get("x-request-id").and_then(Value::as_str);
            seen.insert(
                "x-request-id".into(),
                match rid {
                    Some("abc") => "abc".into(),
                    Some(_) => "generated".into(),
                    None => "absent".into(),
                },
            );
            seen
        });
    let mut headers: Vec<String> = r
        .headers
        .iter()
        .filter(|(k, _)| k != "date" && !(app.is_some() && k == "content-length"))
        .map(|(k, v)| match k.as_str() {
            // Envoy's router's, on what it forwards: a time, compared as present.
            "x-envoy-upstream-service-time" => k.clone(),
            _ => format!("{k}: {v}"),
        })
        .collect();
    headers.sort();
    let reply = app.is_none().then(|| r.text());
    Outcome {
        interim,
        status: Some(r.status),
        app,
        reply,
        headers,
        log,
        rbac: Vec::new(),
    }
}

/// The certificate directories of the clients, and the pod's own, from one CA.
struct Certs {
    server: PathBuf,
    clients: BTreeMap<&'static str, PathBuf>,
}

fn certs(net: &PodNet) -> Certs {
    let ca = MeshCa::new("cluster.local");
    let server = net.binary().make_dir("server-certs");
    ca.install(&server, &ca.workload(SERVER_ID));
    let forger = MeshCa::new("cluster.local");
    let clients = [
        (CLIENT_ID, &ca),
        (OTHER_ID, &ca),
        (FOREIGN_ID, &ca),
        (FORGED_ID, &forger),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (id, ca))| {
        let dir = net.binary().make_dir(&format!("client-certs-{i}"));
        ca.install(&dir, &ca.workload(id));
        (id, dir)
    })
    .collect();
    Certs { server, clients }
}

fn send(net: &PodNet, certs: &Certs, client: Client, raw: &str) -> Result<Response, String> {
    let port = match client {
        Client::MeshToTcp(_) | Client::PlainToTcp => TCP_PORT,
        _ => PORT,
    };
    let addr = net.pod_addr(port);
    match client {
        Client::Plain | Client::PlainToTcp => http_client::Client::connect(&net.peer, addr)
            .and_then(|mut c| c.send_raw(raw.as_bytes()))
            .map_err(|e| e.to_string()),
        Client::Mesh(_) | Client::MeshToTcp(_) | Client::TlsWithoutCert => {
            let (cert, key) = match client {
                Client::Mesh(id) | Client::MeshToTcp(id) => {
                    let file = |n: &str| certs.clients[id].join(n).to_string_lossy().into_owned();
                    (Some(file("cert-chain.pem")), Some(file("key.pem")))
                }
                _ => (None, None),
            };
            let mut args = vec!["-servername", SNI, "-alpn", "istio-peer-exchange,istio"];
            if let (Some(cert), Some(key)) = (&cert, &key) {
                args.extend(["-cert", cert.as_str(), "-key", key.as_str()]);
            }
            let out = s_client(&net.peer, addr, &args, raw.as_bytes());
            // What the client was told (an alert), without openssl's per-process prefix.
            http_client::parse_response(&out.stdout).map_err(|e| {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let last = stderr.lines().last().unwrap_or("");
                format!(
                    "{e}: {}",
                    last.split_once(":error:").map_or(last, |(_, m)| m)
                )
            })
        }
    }
}

/// Each case's outcome through `net`'s `sidecar`, and the RBAC statistics after them all.
fn run(net: &PodNet, sidecar: &Sidecar<'_>, certs: &Certs, log: &Path) -> (Vec<Outcome>, Stats) {
    let rbac = || stat_deltas::stats(net, sidecar.admin_port(), |n| n.contains("rbac"));
    let mut outcomes = Vec::new();
    let mut stats = rbac();
    // The lines written whole so far (a proxy may be in the middle of one).
    let whole_lines = || {
        let all = access_logs::read(log);
        let whole = all.rfind('\n').map_or("", |end| &all[..end]).to_string();
        whole.lines().map(str::to_string).collect::<Vec<_>>()
    };
    for (client, raw) in CASES {
        let before = whole_lines().len();
        let response = send(net, certs, *client, raw);
        // A request that was never answered may write no line: wait a while, not forever.
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut lines = whole_lines();
        while lines.len() == before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            lines = whole_lines();
        }
        let after = rbac();
        let mut o = outcome(response, lines[before..].join(" / "));
        o.rbac = stat_deltas::delta(&stats, &after);
        stats = after;
        outcomes.push(o);
    }
    (outcomes, stats)
}

#[test]
fn inbound_mesh_tls_xfcc_and_rbac_as_envoy() {
    let Some((binary, (remora_net, envoy_net))) = nets_or_skip() else {
        return;
    };
    // One CA and one set of certificates for both worlds: the hashes in
    // `x-forwarded-client-cert` are then the same.
    let certs = certs(&remora_net);
    let mut runs = Vec::new();
    for (i, net) in [&remora_net, &envoy_net].into_iter().enumerate() {
        net.capture_default();
        let _app = backend::start(&net.pod, any_addr(PORT), "app");
        let _tcp_app = backend::start(&net.pod, any_addr(TCP_PORT), "tcp-app");
        let log = log_file(net, "access.log");
        let resources = resources(&log);
        let sidecar = if i == 0 {
            let extra = format!("tls:\n  cert_dir: {}\n", certs.server.display());
            Sidecar::Remora(resources.start_remora_with(net, &extra).0)
        } else {
            let sds = net.binary().make_dir("envoy-sds");
            Sidecar::Envoy(resources.start_envoy_with(net, &binary, |b| {
                istio_stats_config(b);
                serve_workload_secrets(b, &certs.server, &sds);
            }))
        };
        runs.push(run(net, &sidecar, &certs, &log));
    }
    let (envoy, envoy_stats) = runs.pop().expect("envoy's run");
    let (remora, remora_stats) = runs.pop().expect("remora's run");
    let mut differences = Vec::new();
    for ((client, raw), (r, e)) in CASES.iter().zip(remora.iter().zip(&envoy)) {
        let report = format!("{client:?} {raw:?}\n  envoy:  {e:?}\n  remora: {r:?}");
        eprintln!("{report}");
        if r != e {
            differences.push(report);
        }
    }
    eprintln!("stats\n  envoy:  {envoy_stats:?}\n  remora: {remora_stats:?}");
    assert!(
        differences.is_empty(),
        "{} of {} cases differ:\n{}",
        differences.len(),
        CASES.len(),
        differences.join("\n")
    );
    assert_eq!(remora_stats, envoy_stats);
}
