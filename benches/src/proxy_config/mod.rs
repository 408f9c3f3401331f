//! Each proxy's configuration for each job, written by the harness itself: the same job for all
//! (one worker, access logs off, each proxy's own default telemetry, L7 where the scenario is
//! HTTP). Pure functions from addresses to text, so tests can check them without a proxy.

use serde::Serialize;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

pub mod traffic;
pub mod xds;

/// One contender in a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Proxy {
    /// The load generator talks to the upstream directly: the physical limit.
    NoProxy,
    /// Remora in the scenario's mode (L7 for HTTP scenarios).
    Remora,
    /// Remora forwarding opaque TCP even in HTTP scenarios: a reference row, not a like-for-like
    /// comparison (the others parse HTTP).
    RemoraTcp,
    /// Remora routed by xDS resources from files ([`xds`]) instead of an explicit listener's
    /// upstream: the same job through the route decision and the upstream layer.
    RemoraXds,
    Envoy,
    Haproxy,
    Nginx,
    /// The least a proxy can do ([`crate::floor`]): relays bytes, parses nothing. A reference
    /// row in the 1000 rps scenarios, for what the machine alone costs.
    Floor,
}

impl Proxy {
    /// Every contender, in table order.
    pub const ALL: [Proxy; 8] = [
        Proxy::NoProxy,
        Proxy::Remora,
        Proxy::RemoraXds,
        Proxy::Envoy,
        Proxy::Haproxy,
        Proxy::Nginx,
        Proxy::RemoraTcp,
        Proxy::Floor,
    ];

    /// The name in tables, JSON and `--proxies`.
    pub fn name(self) -> &'static str {
        match self {
            Proxy::NoProxy => "no-proxy",
            Proxy::Remora => "remora",
            Proxy::RemoraTcp => "remora-tcp",
            Proxy::RemoraXds => "remora-xds",
            Proxy::Envoy => "envoy",
            Proxy::Haproxy => "haproxy",
            Proxy::Nginx => "nginx",
            Proxy::Floor => "floor",
        }
    }

    /// Parses a `--proxies` entry.
    pub fn from_name(name: &str) -> Option<Proxy> {
        Proxy::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// What the proxy is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// HTTP/1.1 in, HTTP/1.1 (kept alive) to the upstream, parsed at L7.
    Http1,
    /// h2c with prior knowledge in, HTTP/2 to the upstream: gRPC unary calls.
    Grpc,
    /// h2c with prior knowledge in, HTTP/2 to the upstream where the proxy speaks it: plain
    /// GETs of a 1 KiB body.
    H2c,
    /// Opaque TCP.
    Tcp,
}

/// The ports a Remora instance binds besides its listener; each instance gets free ones so that
/// several can run beside each other and beside a real sidecar.
#[derive(Debug, Clone, Copy)]
pub struct RemoraPorts {
    pub readiness: u16,
    pub metrics: u16,
    pub agent: u16,
    pub admin: u16,
}

/// Remora's config file: loopback only, free side ports, everything else at the defaults
/// (Istio's metrics on, access log off). The listener itself comes from the command line.
pub fn remora_config(ports: &RemoraPorts) -> String {
    format!(
        "# Written by the benchmark harness.\n\
         bind_addresses: [127.0.0.1]\n\
         readiness:\n  port: {}\n\
         metrics:\n  port: {}\n\
         agent:\n  port: {}\n\
         admin:\n  address: 127.0.0.1:{}\n",
        ports.readiness, ports.metrics, ports.agent, ports.admin
    )
}

/// The config of the `remora-xds` contender: [`remora_config`] with the xDS resources read
/// from `resources_dir`.
pub fn remora_xds_config(ports: &RemoraPorts, resources_dir: &Path) -> String {
    format!(
        "{}xds:\n  resources_dir: {}\n",
        remora_config(ports),
        resources_dir.display()
    )
}

/// `remora run` arguments of the `remora-xds` contender: [`remora_args`] with the listener's
/// connections routed by xDS as if captured on their way to `upstream`.
pub fn remora_xds_args(
    config: &Path,
    listen: SocketAddr,
    upstream: SocketAddr,
    log_level: &str,
) -> Vec<String> {
    let mut args = remora_args(config, listen, upstream, Mode::Http1, log_level);
    if let Some(at) = args.iter().position(|a| a == "--protocol") {
        args[at + 1] = "xds".into();
    }
    args
}

/// `remora run`'s `--protocol` for a mode.
pub fn remora_protocol(mode: Mode) -> &'static str {
    match mode {
        Mode::Http1 | Mode::Grpc | Mode::H2c => "http",
        Mode::Tcp => "tcp",
    }
}

/// `remora run` arguments: one explicit listener, one data-path worker, logging at `log_level`.
pub fn remora_args(
    config: &Path,
    listen: SocketAddr,
    upstream: SocketAddr,
    mode: Mode,
    log_level: &str,
) -> Vec<String> {
    vec![
        "run".into(),
        "--config".into(),
        config.display().to_string(),
        "--listen".into(),
        listen.to_string(),
        "--upstream".into(),
        upstream.to_string(),
        "--protocol".into(),
        remora_protocol(mode).into(),
        "--concurrency".into(),
        "1".into(),
        "--log-level".into(),
        log_level.into(),
    ]
}

/// Envoy's static bootstrap: one listener with the HTTP connection manager and the router (or
/// `tcp_proxy` for TCP) to one static cluster; admin on its own loopback port; default stats;
/// no access log. The cluster's circuit breakers are lifted as Istio lifts them for every
/// cluster it writes (Envoy's own default of 1024 connections would refuse the idle-connection
/// test's upstream connections past 1024).
pub fn envoy_config(
    mode: Mode,
    listen: SocketAddr,
    upstream: SocketAddr,
    admin_port: u16,
) -> String {
    let mut out = String::from("# Written by the benchmark harness.\n");
    let _ = write!(
        out,
        "admin:\n  address:\n    socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }}\n\
         static_resources:\n  listeners:\n  - name: bench\n    address:\n      \
         socket_address: {{ address: {}, port_value: {} }}\n    filter_chains:\n    - filters:\n",
        listen.ip(),
        listen.port()
    );
    let filter = match mode {
        Mode::Tcp => "      - name: envoy.filters.network.tcp_proxy\n        typed_config:\n          \
             \"@type\": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy\n          \
             stat_prefix: bench\n          cluster: upstream\n"
            .to_string(),
        Mode::Http1 | Mode::Grpc | Mode::H2c => "      - name: envoy.filters.network.http_connection_manager\n        typed_config:\n          \
             \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager\n          \
             stat_prefix: bench\n          codec_type: AUTO\n          route_config:\n            name: local\n            \
             virtual_hosts:\n            - name: all\n              domains: [\"*\"]\n              routes:\n              \
             - match: {{ prefix: \"/\" }}\n                route: {{ cluster: upstream }}\n          http_filters:\n          \
             - name: envoy.filters.http.router\n            typed_config:\n              \
             \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n"
            .replace("{{", "{")
            .replace("}}", "}"),
    };
    out.push_str(&filter);
    let _ = write!(
        out,
        "  clusters:\n  - name: upstream\n    type: STATIC\n    connect_timeout: 5s\n    circuit_breakers:\n      thresholds:\n      \
         - {{ max_connections: 4294967295, max_pending_requests: 4294967295, max_requests: 4294967295, max_retries: 4294967295 }}\n    \
         load_assignment:\n      \
         cluster_name: upstream\n      endpoints:\n      - lb_endpoints:\n        - endpoint:\n            address:\n              \
         socket_address: {{ address: {}, port_value: {} }}\n",
        upstream.ip(),
        upstream.port()
    );
    if matches!(mode, Mode::Grpc | Mode::H2c) {
        out.push_str(
            "    typed_extension_protocol_options:\n      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n        \
             \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n        \
             explicit_http_config:\n          http2_protocol_options: {}\n",
        );
    }
    out
}

/// Envoy's command line: one worker, no hot restart (so several can run at once).
pub fn envoy_args(config: &Path) -> Vec<String> {
    vec![
        "-c".into(),
        config.display().to_string(),
        "--concurrency".into(),
        "1".into(),
        "--disable-hot-restart".into(),
        "--log-level".into(),
        "warn".into(),
    ]
}

/// Workers of each sidecar in the mTLS scenario: Istio's published benchmark setup.
pub const MESH_WORKERS: usize = 2;

/// The `common_tls_context` both Envoy sidecars share: the workload's chain and key and the
/// mesh roots from files in Istio's layout, TLS 1.2 to 1.3 (Istio's mesh mTLS), ALPN values,
/// and, when `peer_id` is given, the peer's SPIFFE ID that its certificate must carry.
fn envoy_common_tls(cert_dir: &Path, alpn: &[&str], peer_id: Option<&str>) -> String {
    use crate::mesh_certs::{CERT_CHAIN, KEY, ROOT_CERT};
    let file = |name: &str| cert_dir.join(name).display().to_string();
    let alpn = alpn
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let mut out = format!(
        "        common_tls_context:\n          \
         tls_params: {{ tls_minimum_protocol_version: TLSv1_2, tls_maximum_protocol_version: TLSv1_3 }}\n          \
         alpn_protocols: [{alpn}]\n          \
         tls_certificates:\n          \
         - certificate_chain: {{ filename: \"{}\" }}\n            \
         private_key: {{ filename: \"{}\" }}\n          \
         validation_context:\n            \
         trusted_ca: {{ filename: \"{}\" }}\n",
        file(CERT_CHAIN),
        file(KEY),
        file(ROOT_CERT)
    );
    if let Some(id) = peer_id {
        let _ = write!(
            out,
            "            match_typed_subject_alt_names:\n            \
             - san_type: URI\n              matcher: {{ exact: \"{id}\" }}\n"
        );
    }
    out
}

/// The HTTP connection manager routing everything to `cluster`, Envoy's router, no access log;
/// `xfcc` adds Istio's inbound `x-forwarded-client-cert` handling.
fn envoy_hcm(stat_prefix: &str, cluster: &str, xfcc: bool) -> String {
    let mut out = format!(
        "      - name: envoy.filters.network.http_connection_manager\n        typed_config:\n          \
         \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager\n          \
         stat_prefix: {stat_prefix}\n          codec_type: AUTO\n"
    );
    if xfcc {
        out.push_str(
            "          forward_client_cert_details: APPEND_FORWARD\n          \
             set_current_client_cert_details: { subject: true, dns: true, uri: true }\n",
        );
    }
    let _ = write!(
        out,
        "          route_config:\n            name: local\n            virtual_hosts:\n            \
         - name: all\n              domains: [\"*\"]\n              routes:\n              \
         - match: {{ prefix: \"/\" }}\n                route: {{ cluster: {cluster} }}\n          \
         http_filters:\n          - name: envoy.filters.http.router\n            typed_config:\n              \
         \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n"
    );
    out
}

/// One static cluster to `to` with Istio's lifted circuit breakers.
fn envoy_cluster(name: &str, to: SocketAddr) -> String {
    format!(
        "  - name: {name}\n    type: STATIC\n    connect_timeout: 5s\n    circuit_breakers:\n      thresholds:\n      \
         - {{ max_connections: 4294967295, max_pending_requests: 4294967295, max_requests: 4294967295, max_retries: 4294967295 }}\n    \
         load_assignment:\n      cluster_name: {name}\n      endpoints:\n      - lb_endpoints:\n        - endpoint:\n            \
         address:\n              socket_address: {{ address: {}, port_value: {} }}\n",
        to.ip(),
        to.port()
    )
}

fn envoy_admin_and_listener(admin_port: u16, name: &str, listen: SocketAddr) -> String {
    format!(
        "# Written by the benchmark harness.\n\
         admin:\n  address:\n    socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }}\n\
         static_resources:\n  listeners:\n  - name: {name}\n    address:\n      \
         socket_address: {{ address: {}, port_value: {} }}\n    filter_chains:\n    - filters:\n",
        listen.ip(),
        listen.port()
    )
}

/// Sidecar A as Envoy: plain HTTP in on `listen` (or, for [`Mode::Tcp`], opaque bytes through
/// `tcp_proxy`), to `server` (sidecar B) over mTLS as Istio's outbound cluster does: the
/// workload certificate from `cert_dir`, Istio's ALPN for HTTP/1.1 (for TCP, metadata exchange
/// and `istio`), SNI `outbound_.PORT_._.HOSTNAME`, and the server's certificate must carry
/// `server_id`.
pub fn envoy_mesh_client_config(
    mode: Mode,
    listen: SocketAddr,
    server: SocketAddr,
    admin_port: u16,
    cert_dir: &Path,
    server_id: &str,
) -> String {
    let mut out = envoy_admin_and_listener(admin_port, "outbound", listen);
    out.push_str(&envoy_mesh_filter(mode, "outbound", "mesh", false));
    let alpn: &[&str] = match mode {
        Mode::Tcp => &ISTIO_TCP_ALPN,
        _ => &["istio-http/1.1", "istio"],
    };
    out.push_str("  clusters:\n");
    out.push_str(&envoy_cluster("mesh", server));
    let _ = write!(
        out,
        "    transport_socket:\n      name: envoy.transport_sockets.tls\n      typed_config:\n        \
         \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext\n        \
         sni: \"outbound_.{}_._.{}\"\n",
        server.port(),
        crate::mesh_certs::SERVER_HOSTNAME
    );
    out.push_str(&envoy_common_tls(cert_dir, alpn, Some(server_id)));
    out
}

/// What Istio's sidecars offer and select for mesh TCP: metadata exchange, then `istio`.
const ISTIO_TCP_ALPN: [&str; 2] = ["istio-peer-exchange", "istio"];

/// A mesh sidecar's network filter to `cluster`: `tcp_proxy` for [`Mode::Tcp`], as Istio's TCP
/// chains (without its stats filters), else the HTTP connection manager (see [`envoy_hcm`]).
fn envoy_mesh_filter(mode: Mode, stat_prefix: &str, cluster: &str, xfcc: bool) -> String {
    if mode != Mode::Tcp {
        return envoy_hcm(stat_prefix, cluster, xfcc);
    }
    format!(
        "      - name: envoy.filters.network.tcp_proxy\n        typed_config:\n          \
         \"@type\": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy\n          \
         stat_prefix: {stat_prefix}\n          cluster: {cluster}\n"
    )
}

/// Sidecar B as Envoy: mTLS in on `listen` (a client certificate that chains to the mesh roots
/// is required, as Istio's inbound in STRICT mode), `x-forwarded-client-cert` as Istio sets
/// it, plain HTTP/1.1 to `upstream`; for [`Mode::Tcp`], opaque bytes through `tcp_proxy`.
pub fn envoy_mesh_server_config(
    mode: Mode,
    listen: SocketAddr,
    upstream: SocketAddr,
    admin_port: u16,
    cert_dir: &Path,
) -> String {
    let mut out = envoy_admin_and_listener(admin_port, "inbound", listen);
    out.push_str(&envoy_mesh_filter(mode, "inbound", "upstream", true));
    let alpn: &[&str] = match mode {
        Mode::Tcp => &ISTIO_TCP_ALPN,
        _ => &["h2", "http/1.1"],
    };
    out.push_str(
        "      transport_socket:\n        name: envoy.transport_sockets.tls\n        typed_config:\n          \
         \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext\n          \
         require_client_certificate: true\n",
    );
    // The common context sits two spaces deeper under a filter chain than under a cluster.
    for line in envoy_common_tls(cert_dir, alpn, None).lines() {
        let _ = writeln!(out, "  {line}");
    }
    out.push_str("  clusters:\n");
    out.push_str(&envoy_cluster("upstream", upstream));
    out
}

/// Envoy's command line with `concurrency` workers (see [`envoy_args`]).
pub fn envoy_args_with(config: &Path, concurrency: usize) -> Vec<String> {
    let mut args = envoy_args(config);
    if let Some(i) = args.iter().position(|a| a == "--concurrency") {
        args[i + 1] = concurrency.to_string();
    }
    args
}

/// Which sidecar of the mTLS scenario a Remora plays.
#[derive(Debug, Clone, Copy)]
pub enum MeshSide<'a> {
    /// Sidecar A: plain HTTP in on `listen`, mutual TLS out to `server`, which must carry
    /// `server_id`.
    Client {
        listen: SocketAddr,
        server: SocketAddr,
        server_id: &'a str,
    },
    /// Sidecar B: mutual TLS in on `listen` (any client certificate from the mesh root, as
    /// Envoy B), plain HTTP out to `upstream`.
    Server {
        listen: SocketAddr,
        upstream: SocketAddr,
    },
}

/// Remora as sidecar A or B of the mTLS scenario: [`remora_config`] plus the workload identity
/// from `cert_dir` and one explicit listener (HTTP, or TCP for [`Mode::Tcp`]) that originates
/// (A, with Istio's SNI for B's service) or terminates (B) mesh mutual TLS.
pub fn remora_mesh_config(
    mode: Mode,
    ports: &RemoraPorts,
    cert_dir: &Path,
    side: MeshSide<'_>,
) -> String {
    let mut out = remora_config(ports);
    let _ = writeln!(out, "tls:\n  cert_dir: \"{}\"", cert_dir.display());
    let (listen, upstream, tls) = match side {
        MeshSide::Client {
            listen,
            server,
            server_id,
        } => (
            listen,
            server,
            format!(
                "      mode: originate\n      hostname: {}\n      identities: [\"{server_id}\"]\n",
                crate::mesh_certs::SERVER_HOSTNAME
            ),
        ),
        MeshSide::Server { listen, upstream } => {
            (listen, upstream, "      mode: terminate\n".to_string())
        }
    };
    let _ = write!(
        out,
        "listeners:\n  - address: {listen}\n    upstream: {upstream}\n    protocol: {}\n    tls:\n{tls}",
        remora_protocol(mode)
    );
    out
}

/// `remora run` arguments for a sidecar of the mTLS scenario: its config's listener, `workers`
/// data-path workers, logging at `log_level`.
pub fn remora_mesh_args(config: &Path, workers: usize, log_level: &str) -> Vec<String> {
    vec![
        "run".into(),
        "--config".into(),
        config.display().to_string(),
        "--concurrency".into(),
        workers.to_string(),
        "--log-level".into(),
        log_level.into(),
    ]
}

/// HAProxy: one thread, `mode http` (h2c with prior knowledge and HTTP/2 to the upstream for
/// gRPC) or `mode tcp`, no logging. `maxconn` is sized for the idle-connection test.
pub fn haproxy_config(
    mode: Mode,
    listen: SocketAddr,
    upstream: SocketAddr,
    maxconn: u32,
) -> String {
    let (haproxy_mode, bind_proto, server_proto) = match mode {
        Mode::Http1 => ("http", "", ""),
        Mode::Grpc | Mode::H2c => ("http", " proto h2", " proto h2"),
        Mode::Tcp => ("tcp", "", ""),
    };
    format!(
        "# Written by the benchmark harness.\n\
         global\n    nbthread 1\n    maxconn {maxconn}\n\n\
         defaults\n    mode {haproxy_mode}\n    maxconn {maxconn}\n    timeout connect 5s\n    \
         timeout client 120s\n    timeout server 120s\n    timeout http-keep-alive 120s\n\n\
         frontend bench\n    bind {listen}{bind_proto}\n    default_backend upstream\n\n\
         backend upstream\n    server upstream {upstream}{server_proto}\n"
    )
}

/// HAProxy's command line: foreground.
pub fn haproxy_args(config: &Path) -> Vec<String> {
    vec!["-f".into(), config.display().to_string(), "-db".into()]
}

/// File-descriptor limits for nginx's one worker.
#[derive(Debug, Clone, Copy)]
pub struct NginxLimits {
    pub rlimit_nofile: u64,
    pub worker_connections: u64,
}

/// nginx: one worker, access log off; HTTP with an upstream keep-alive pool (gRPC through
/// `grpc_pass` behind an `http2` listener; plain h2c behind an `http2` listener too, but to the
/// upstream over HTTP/1.1, since nginx's proxy module speaks no HTTP/2 to upstreams), or the
/// `stream` module for TCP. `keepalive_requests`
/// is raised from its default of 1000 on both sides, so that keep-alive means the same as for the
/// others (which never close a busy connection).
pub fn nginx_config(
    mode: Mode,
    listen: SocketAddr,
    upstream: SocketAddr,
    prefix: &Path,
    limits: NginxLimits,
    stream_module: Option<&Path>,
) -> String {
    let prefix = prefix.display();
    let mut out = String::from("# Written by the benchmark harness.\n");
    if let (Mode::Tcp, Some(module)) = (mode, stream_module) {
        let _ = writeln!(out, "load_module {};", module.display());
    }
    let _ = write!(
        out,
        "daemon off;\nworker_processes 1;\npid {prefix}/nginx.pid;\nerror_log {prefix}/error.log warn;\n\
         worker_rlimit_nofile {};\nevents {{\n    worker_connections {};\n}}\n",
        limits.rlimit_nofile, limits.worker_connections
    );
    match mode {
        Mode::Tcp => {
            let _ = write!(
                out,
                "stream {{\n    server {{\n        listen {listen};\n        proxy_pass {upstream};\n    }}\n}}\n"
            );
        }
        Mode::Http1 | Mode::Grpc | Mode::H2c => {
            let proxy_pass =
                "        proxy_pass http://upstream;\n        proxy_http_version 1.1;\n        \
                              proxy_set_header Connection \"\";\n";
            let (listen_opts, location) = match mode {
                Mode::Grpc => (" http2", "        grpc_pass grpc://upstream;\n"),
                Mode::H2c => (" http2", proxy_pass),
                _ => ("", proxy_pass),
            };
            let _ = write!(
                out,
                "http {{\n    access_log off;\n    keepalive_requests 1000000;\n    keepalive_timeout 120s;\n    \
                 client_body_temp_path {prefix}/client_body;\n    proxy_temp_path {prefix}/proxy;\n    \
                 fastcgi_temp_path {prefix}/fastcgi;\n    uwsgi_temp_path {prefix}/uwsgi;\n    scgi_temp_path {prefix}/scgi;\n    \
                 upstream upstream {{\n        server {upstream};\n        keepalive 64;\n        keepalive_requests 1000000;\n    }}\n    \
                 server {{\n        listen {listen}{listen_opts};\n        location / {{\n{location}        }}\n    }}\n}}\n"
            );
        }
    }
    out
}

/// nginx's command line: its own prefix, config and early error log (before the config is read).
pub fn nginx_args(prefix: &Path, config: &Path) -> Vec<String> {
    vec![
        "-p".into(),
        prefix.display().to_string(),
        "-c".into(),
        config.display().to_string(),
        "-e".into(),
        prefix.join("error.log").display().to_string(),
    ]
}

#[cfg(test)]
mod tests;
