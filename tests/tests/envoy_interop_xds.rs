//! Remora as a client sidecar routed by xDS, to a real Envoy 1.40 as the server pod's
//! inbound sidecar: the auto-mTLS that istiod's clusters ask for (`transport_socket_matches`
//! on the endpoint's `tlsMode: istio`, Istio's SNI, ALPN and SAN check) seen from the other
//! side. Envoy's inbound listener has one filter chain per Istio ALPN value, each requiring a
//! client certificate from the test CA, and logs what each connection offered; the
//! application behind it gets `x-forwarded-client-cert`.

use remora_e2e::certs::MeshCa;
use remora_e2e::envoy::{self, Envoy};
use remora_e2e::envoy_config::{
    admin, cluster, common_tls, http_connection_manager, router, socket_address, tcp_proxy, xfcc_of,
};
use remora_e2e::envoy_xds::Resources;
use remora_e2e::mesh::{CLIENT_ID, SERVER_ID};
use remora_e2e::peer::{self, Server};
use remora_e2e::service::{peer_program, Service};
use remora_e2e::xds_resources::{endpoint, mtls_cluster, tcp_listener};
use remora_e2e::PodNet;
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

/// Bound on one client exchange.
const CLIENT_TIME: Duration = Duration::from_secs(20);
/// The server pod's ports, and where its application listens behind Envoy.
const HTTP_PORT: u16 = 8080;
const ECHO_PORT: u16 = 7000;
const APP_HTTP_PORT: u16 = 18080;
const APP_ECHO_PORT: u16 = 17000;

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// Istio's ALPN values a sidecar's inbound chain matches.
const ISTIO_ALPNS: [&str; 5] = [
    "istio-peer-exchange",
    "istio",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
];

/// What the observing server sidecar logs per request or connection: the chain (named for
/// the one ALPN value it matches, so the client's first offered value that Istio's inbound
/// knows picks it), the SNI and the client certificate's SPIFFE ID.
const OBSERVED_FORMAT: &str =
    "observed chain=%FILTER_CHAIN_NAME% sni=%REQUESTED_SERVER_NAME% peer=%DOWNSTREAM_PEER_URI_SAN%\n";

/// [`server_sidecar`], with one filter chain per Istio ALPN value and an access log of what
/// each connection offered ([`OBSERVED_FORMAT`]).
fn observing_server_sidecar(certs: &Path, ip: Ipv4Addr) -> String {
    let log = json!([{
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": "/dev/stdout",
            "log_format": { "text_format_source": { "inline_string": OBSERVED_FORMAT } }
        }
    }]);
    let inbound = |name: &str, port: u16, filter: Value| {
        let chains: Vec<Value> = ISTIO_ALPNS
            .iter()
            .map(|alpn| json!({
                "name": format!("alpn:{alpn}"),
                "filter_chain_match": { "transport_protocol": "tls", "application_protocols": [alpn] },
                "transport_socket": {
                    "name": "envoy.transport_sockets.tls",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                        "require_client_certificate": true,
                        "common_tls_context": common_tls(certs, &["h2", "http/1.1"], CLIENT_ID)
                    }
                },
                "filters": [filter.clone()]
            }))
            .collect();
        json!({
            "name": name,
            "stat_prefix": name,
            "address": socket_address(ip, port),
            "listener_filters": [{
                "name": "envoy.filters.listener.tls_inspector",
                "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector" }
            }],
            "filter_chains": chains
        })
    };
    let http = http_connection_manager(
        "inbound_http",
        "app_http",
        json!({
            "forward_client_cert_details": "APPEND_FORWARD",
            "set_current_client_cert_details": { "uri": true },
            "access_log": log
        }),
    );
    let mut tcp = tcp_proxy("inbound_tcp", "app_tcp");
    tcp["typed_config"]["access_log"] = log;
    json!({
        "admin": admin(),
        "static_resources": {
            "listeners": [
                inbound("inbound_http", HTTP_PORT, http),
                inbound("inbound_tcp", ECHO_PORT, tcp)
            ],
            "clusters": [
                cluster("app_http", Ipv4Addr::LOCALHOST, APP_HTTP_PORT, None),
                cluster("app_tcp", Ipv4Addr::LOCALHOST, APP_ECHO_PORT, None)
            ]
        }
    })
    .to_string()
}

/// The observed lines in Envoy's log (its access log is flushed every second).
fn wait_observed(envoy: &Envoy, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let lines: Vec<String> = envoy
            .logs()
            .lines()
            .filter(|l| l.starts_with("observed "))
            .map(str::to_string)
            .collect();
        if lines.len() >= n || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Remora as the client sidecar routed by xDS (istiod's auto-mTLS cluster: a
/// `transport_socket_matches` entry for `tlsMode: istio` with Istio's SNI, ALPN and SAN), a
/// real Envoy as the server pod's inbound sidecar: Envoy sees the SNI the socket names,
/// Istio's ALPN (`istio-peer-exchange` first for TCP, `istio-http/1.1` for HTTP/1.1, as
/// Istio's ALPN filter sets it) and our SPIFFE ID, and Remora accepted Envoy's certificate
/// by the SAN the socket names.
#[test]
fn remora_xds_auto_mtls_to_envoy_server_presents_sni_alpn_and_spiffe_id() {
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
    net.capture_default();
    // The VIPs exist only in the resources: a route lets the application's connect reach
    // the capture rules.
    net.pod.route_vips();

    let (web, tcp) = (
        "outbound|8080||httpbin.server.svc.cluster.local",
        "outbound|7000||echo.server.svc.cluster.local",
    );
    let web_sni = "outbound_.8080_._.httpbin.server.svc.cluster.local";
    let tcp_sni = "outbound_.7000_._.echo.server.svc.cluster.local";
    let vip = Ipv4Addr::new(10, 96, 0, 10);
    let tcp_vip = SocketAddr::from(([10, 96, 0, 20], ECHO_PORT));
    let server = |port| endpoint(net.peer_addr(port), Some("istio"));
    let resources = Resources {
        listeners: json!([
            {"name": "0.0.0.0_80", "address": socket_address(Ipv4Addr::UNSPECIFIED, 80),
             "traffic_direction": "OUTBOUND", "bind_to_port": false,
             "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "outbound_0.0.0.0_80",
                "rds": {"config_source": {"ads": {}}, "route_config_name": "80"},
                "http_filters": router()}}]}]},
            tcp_listener(tcp_vip, tcp)
        ]),
        clusters: json!([
            mtls_cluster(web, web_sni, SERVER_ID),
            mtls_cluster(tcp, tcp_sni, SERVER_ID)
        ]),
        routes: json!([{"name": "80", "virtual_hosts": [{"name": "httpbin", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": web}}]}]}]),
        endpoints: json!([
            {"cluster_name": web, "endpoints": [{"lb_endpoints": [server(HTTP_PORT)]}]},
            {"cluster_name": tcp, "endpoints": [{"lb_endpoints": [server(ECHO_PORT)]}]}
        ]),
    };
    let xds_dir = net.binary().make_dir("xds");
    resources.write_for_remora(&xds_dir);
    let remora = net
        .remora()
        .config(&format!(
            "tls:\n  cert_dir: {}\nxds:\n  resources_dir: {}\n",
            client_dir.display(),
            xds_dir.display()
        ))
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
        &observing_server_sidecar(&server_dir, net.peer_ip),
    );

    // HTTP to the VIP: Envoy required our certificate and names it to the application.
    let out = peer::curl(&net.pod, &[&format!("http://{vip}/headers")], CLIENT_TIME);
    let body = peer::curl_ok(&out, "HTTP through xDS auto-mTLS to an Envoy sidecar");
    let xfcc = xfcc_of(&body);
    assert!(xfcc.contains(&format!("URI={CLIENT_ID}")), "{xfcc}");
    assert!(xfcc.starts_with(&format!("By={SERVER_ID};")), "{xfcc}");

    // TCP to the VIP: every byte back, no metadata-exchange header in the stream.
    let data = peer::pattern(64 * 1024);
    let echoed = peer::echo_exchange(&net.pod, tcp_vip, &data).unwrap_or_else(|e| {
        panic!(
            "TCP through xDS auto-mTLS: {e}\nenvoy:\n{}\nremora:\n{}",
            envoy.logs(),
            remora.stderr()
        )
    });
    peer::assert_same_bytes("TCP through xDS auto-mTLS", &data, &echoed);

    // What Envoy saw of each connection: the socket's SNI, Istio's ALPN, our SPIFFE ID.
    let observed = wait_observed(&envoy, 2);
    let http_line = format!("observed chain=alpn:istio-http/1.1 sni={web_sni} peer={CLIENT_ID}");
    let tcp_line =
        format!("observed chain=alpn:istio-peer-exchange sni={tcp_sni} peer={CLIENT_ID}");
    assert!(
        observed.contains(&http_line) && observed.contains(&tcp_line),
        "expected {http_line:?} and {tcp_line:?}, Envoy observed {observed:#?}\n{}",
        remora.stderr()
    );
}
