//! TLS origination to services outside the mesh, as istiod writes a DestinationRule's
//! `trafficPolicy.tls` (`cluster_tls.go`), through Remora behind `remora capture` and through a
//! real Envoy 1.40 given the same resources: the application speaks plaintext to the service,
//! the sidecar speaks TLS to the origin (Python's `ssl`, i.e. OpenSSL, in the peer namespace)
//! with the DestinationRule's SNI, checks the origin's certificate against its
//! `caCertificates` (`file-root:PATH`) and `subjectAltNames`, and for MUTUAL presents the
//! `clientCertificate`/`privateKey` (`file-cert:CHAIN~KEY`). Remora reads those files itself;
//! Envoy gets them as pilot-agent's SDS would serve them ([`Resources::envoy_bootstrap`]).
//!
//! Per case, both proxies must reach the same outcome, and it must be the expected one: the
//! right SAN answers 200 with the SNI seen by the origin; a wrong SAN fails the handshake
//! (HTTP 503, counted as a connect failure; a TCP connection closed with nothing sent);
//! `insecureSkipVerify` (an empty `validation_context`) answers whatever the certificate;
//! an origin requiring a client certificate answers only the MUTUAL cluster, which presents it;
//! without `sni` and `subjectAltNames` (istiod's `auto_sni` and `auto_san_validation`) the
//! request's host is both, so a host the certificate does not name fails (503) right after
//! one it names succeeded on the same cluster.
//!
//! A failed handshake is a connect failure, as in Envoy: over two endpoints of one cluster, one
//! presenting a certificate for another name, every request is answered 200 after a retry on
//! `connect-failure`, and outlier detection ejects that endpoint after its second failure; the
//! failures, retries and ejections counted are Envoy's.

use remora_e2e::certs::{install_files, MeshCa};
use remora_e2e::envoy_xds::{nets_or_skip, Resources};
use remora_e2e::service::{peer_program, Service};
use remora_e2e::xds_resources::eds_cluster;
use remora_e2e::{http_client, peer, PodNet};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

const ORIGIN_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);
/// The origin that takes any client; the one that requires a client certificate.
const SIMPLE_PORT: u16 = 8443;
const MUTUAL_PORT: u16 = 9443;
/// An origin whose certificate (of the same CA) names another host.
const OTHER_NAME_PORT: u16 = 7443;
/// The HTTP service's VIP (port 80), and the TCP services' (port 443).
const HTTP_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const TCP_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
const TCP_WRONG_SAN_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 21);
/// The origin's certificate names this; the DestinationRules send it as SNI.
const ORIGIN_NAME: &str = "api.example.com";
const CLIENT_NAME: &str = "client.example.com";
/// Bound on one exchange through a proxy.
const EXCHANGE_TIME: Duration = Duration::from_secs(10);

/// A host the `auto_sni` cluster also serves, which the origin's certificate does not name.
const AUTO_WRONG: &str = "auto-wrong.example.com";

/// The HTTP cases: the service host (and so its cluster), the origin's port, the TLS.
const HTTP_CASES: [(&str, u16, Tls); 6] = [
    ("simple.example.com", SIMPLE_PORT, Tls::Simple(ORIGIN_NAME)),
    (
        "wrong-san.example.com",
        SIMPLE_PORT,
        Tls::Simple("other.example.com"),
    ),
    ("insecure.example.com", SIMPLE_PORT, Tls::Insecure),
    ("mutual.example.com", MUTUAL_PORT, Tls::Mutual),
    (
        "no-client-cert.example.com",
        MUTUAL_PORT,
        Tls::Simple(ORIGIN_NAME),
    ),
    (ORIGIN_NAME, SIMPLE_PORT, Tls::Auto),
];

#[derive(Debug, Clone, Copy)]
enum Tls {
    /// SIMPLE with `caCertificates` and this `subjectAltNames` entry.
    Simple(&'static str),
    /// SIMPLE with `insecureSkipVerify: true`.
    Insecure,
    /// MUTUAL with `caCertificates`, the origin's name as SAN, and the client certificate.
    Mutual,
    /// SIMPLE with `caCertificates` and neither `sni` nor `subjectAltNames`: istiod asks for
    /// the request's host as both (`auto_sni`, `auto_san_validation`).
    Auto,
}

/// Where the certificates are: the origin's (and its CA's roots), the client's.
struct Certs {
    origin: PathBuf,
    /// The same CA's certificate for `other.example.com`.
    other: PathBuf,
    client: PathBuf,
    client_ca: PathBuf,
}

fn cluster_name(host: &str, port: u16) -> String {
    format!("outbound|{port}||{host}")
}

/// istiod's SDS reference to pilot-agent (`model.ConstructSdsSecretConfig`).
fn sds(name: &str) -> Value {
    json!({"name": name, "sds_config": {"api_config_source": {"api_type": "GRPC",
        "set_node_on_first_message_only": true, "transport_api_version": "V3",
        "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}]},
        "resource_api_version": "V3"}})
}

/// The cluster istiod builds for a ServiceEntry host with a DestinationRule's `tls`
/// (`constructUpstreamTLS`): its `sni`, TLS 1.2–1.3, the roots and SANs (or, insecure, an
/// empty validation context), the client certificate for MUTUAL, and `alpn_override: "false"`.
fn tls_cluster(name: &str, tls: Tls, certs: &Certs) -> Value {
    let roots = format!("file-root:{}", certs.origin.join("root-cert.pem").display());
    let validated = |san: &str| {
        json!({"default_validation_context": {"match_subject_alt_names": [{"exact": san}]},
            "validation_context_sds_secret_config": sds(&roots)})
    };
    let mut common = json!({"tls_params": {"tls_minimum_protocol_version": "TLSv1_2",
        "tls_maximum_protocol_version": "TLSv1_3"}});
    match tls {
        Tls::Simple(san) => common["combined_validation_context"] = validated(san),
        Tls::Auto => {
            common["combined_validation_context"] = json!({"default_validation_context": {},
                "validation_context_sds_secret_config": sds(&roots)});
        }
        Tls::Insecure => common["validation_context"] = json!({}),
        Tls::Mutual => {
            common["combined_validation_context"] = validated(ORIGIN_NAME);
            let cert = format!(
                "file-cert:{}~{}",
                certs.client.join("cert-chain.pem").display(),
                certs.client.join("key.pem").display()
            );
            common["tls_certificate_sds_secret_configs"] = json!([sds(&cert)]);
        }
    }
    let mut c = eds_cluster(name);
    c["metadata"] = json!({"filter_metadata": {"istio": {"alpn_override": "false"}}});
    let mut context = json!({
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": common});
    if let Tls::Auto = tls {
        c["typed_extension_protocol_options"] = json!({"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "upstream_http_protocol_options": {"auto_sni": true, "auto_san_validation": true},
            "explicit_http_config": {"http_protocol_options": {}}}});
    } else {
        context["sni"] = json!(ORIGIN_NAME);
    }
    c["transport_socket"] = json!({"name": "envoy.transport_sockets.tls", "typed_config": context});
    c
}

fn tcp_listener(vip: Ipv4Addr, cluster: &str) -> Value {
    json!({"name": format!("{vip}_443"),
        "address": {"socket_address": {"address": vip.to_string(), "port_value": 443}},
        "traffic_direction": "OUTBOUND", "bind_to_port": false,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": cluster, "cluster": cluster}}]}]})
}

fn endpoints(cluster: &str, port: u16) -> Value {
    json!({"cluster_name": cluster, "endpoints": [{"lb_endpoints": [{"endpoint": {"address":
        {"socket_address": {"address": ORIGIN_IP.to_string(), "port_value": port}}},
        "health_status": "HEALTHY"}]}]})
}

fn resources(certs: &Certs) -> Resources {
    let (tcp, tcp_wrong) = (
        cluster_name("tcp.example.com", 443),
        cluster_name("tcp-wrong-san.example.com", 443),
    );
    let mut clusters = vec![
        tls_cluster(&tcp, Tls::Simple(ORIGIN_NAME), certs),
        tls_cluster(&tcp_wrong, Tls::Simple("other.example.com"), certs),
        json!({"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}),
    ];
    let mut cla = vec![
        endpoints(&tcp, SIMPLE_PORT),
        endpoints(&tcp_wrong, SIMPLE_PORT),
    ];
    let mut hosts = Vec::new();
    for (host, port, tls) in HTTP_CASES {
        let name = cluster_name(host, 80);
        clusters.push(tls_cluster(&name, tls, certs));
        cla.push(endpoints(&name, port));
        let mut domains = vec![host.to_string(), format!("{host}:80")];
        if let Tls::Auto = tls {
            domains.push(AUTO_WRONG.to_string());
        }
        hosts.push(json!({"name": format!("{host}:80"), "domains": domains,
            "routes": [{"name": "default", "match": {"prefix": "/"},
                "route": {"cluster": name, "timeout": "0s"}}]}));
    }
    Resources {
        listeners: json!([
            {"name": "virtualOutbound", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
             "use_original_dst": true, "traffic_direction": "OUTBOUND",
             "filter_chains": [{"name": "virtualOutbound-catchall-tcp", "filters": [
                {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": "BlackHoleCluster", "cluster": "BlackHoleCluster"}}]}]},
            {"name": "0.0.0.0_80", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
             "traffic_direction": "OUTBOUND", "bind_to_port": false,
             "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "outbound_0.0.0.0_80",
                "rds": {"config_source": {"ads": {}}, "route_config_name": "80"},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]},
            tcp_listener(TCP_VIP, &tcp),
            tcp_listener(TCP_WRONG_SAN_VIP, &tcp_wrong),
        ]),
        clusters: Value::Array(clusters),
        routes: json!([{"name": "80", "virtual_hosts": hosts}]),
        endpoints: Value::Array(cla),
    }
}

/// The certificates in `net`'s files (readable by the proxy's UID): the origin's, signed by
/// the origin CA; the client's, by a CA only the MUTUAL origin trusts.
fn certs(net: &PodNet) -> Certs {
    let origin_ca = MeshCa::new("origin CA");
    let client_ca = MeshCa::new("client CA");
    let certs = Certs {
        origin: net.binary().make_dir("origin-certs"),
        other: net.binary().make_dir("other-certs"),
        client: net.binary().make_dir("client-certs"),
        client_ca: net.binary().make_dir("client-ca"),
    };
    install_files(
        &certs.origin,
        &origin_ca.dns_server(ORIGIN_NAME),
        &origin_ca.root_pem(),
    );
    install_files(
        &certs.other,
        &origin_ca.dns_server("other.example.com"),
        &origin_ca.root_pem(),
    );
    install_files(
        &certs.client,
        &client_ca.dns_server(CLIENT_NAME),
        &client_ca.root_pem(),
    );
    std::fs::write(certs.client_ca.join("root-cert.pem"), client_ca.root_pem())
        .expect("write the client CA");
    certs
}

/// The pod with capture rules and a route for the VIPs; the three origins in its peer.
fn prepare(net: &PodNet) -> (Certs, Vec<Service>) {
    remora_e2e::sidecars::prepare(net);
    let certs = certs(net);
    let script = peer_program("tls_origin.py").to_string_lossy().into_owned();
    let (cert, key) = (
        certs.origin.join("cert-chain.pem"),
        certs.origin.join("key.pem"),
    );
    let (cert, key) = (cert.to_string_lossy(), key.to_string_lossy());
    let client_ca = certs.client_ca.join("root-cert.pem");
    let simple_port = SIMPLE_PORT.to_string();
    let mutual_port = MUTUAL_PORT.to_string();
    let (other_cert, other_key) = (
        certs.other.join("cert-chain.pem"),
        certs.other.join("key.pem"),
    );
    let origins = vec![
        Service::start(
            &net.peer,
            "python3",
            &[
                &script,
                &OTHER_NAME_PORT.to_string(),
                &other_cert.to_string_lossy(),
                &other_key.to_string_lossy(),
            ],
            SocketAddr::from((ORIGIN_IP, OTHER_NAME_PORT)),
        ),
        Service::start(
            &net.peer,
            "python3",
            &[&script, &simple_port, &cert, &key],
            SocketAddr::from((ORIGIN_IP, SIMPLE_PORT)),
        ),
        Service::start(
            &net.peer,
            "python3",
            &[
                &script,
                &mutual_port,
                &cert,
                &key,
                &client_ca.to_string_lossy(),
            ],
            SocketAddr::from((ORIGIN_IP, MUTUAL_PORT)),
        ),
    ];
    (certs, origins)
}

/// What one exchange came to: the status (0: the connection ended with no answer), and from
/// the origin's answer the SNI it saw and the client certificate's names.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    status: u16,
    sni: Option<String>,
    client: Vec<String>,
}

impl Outcome {
    fn of(status: u16, body: &str) -> Outcome {
        let origin: Value = serde_json::from_str(body).unwrap_or(Value::Null);
        Outcome {
            status,
            sni: origin["sni"].as_str().map(str::to_string),
            client: origin["client"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
        }
    }
}

/// `GET /` to the HTTP service `host` through the pod's sidecar.
fn http(net: &PodNet, host: &str) -> Outcome {
    http_at(net, host, "/")
}

/// `GET path` to the HTTP service `host` through the pod's sidecar.
fn http_at(net: &PodNet, host: &str, path: &str) -> Outcome {
    match http_client::get_once(&net.pod, SocketAddr::from((HTTP_VIP, 80)), host, path, &[]) {
        Ok(r) => Outcome::of(r.status, &r.text()),
        Err(_) => Outcome::of(0, ""),
    }
}

/// An HTTP/1.1 request written as bytes to the TCP service at `vip`: the sidecar wraps the
/// stream in TLS; what came back, read to the end.
fn tcp(net: &PodNet, vip: Ipv4Addr) -> Outcome {
    let answer = peer::connect(&net.pod, SocketAddr::from((vip, 443))).and_then(|mut s| {
        s.set_read_timeout(Some(EXCHANGE_TIME))?;
        s.write_all(b"GET /tcp HTTP/1.1\r\nHost: tcp.example.com\r\nConnection: close\r\n\r\n")?;
        let mut all = Vec::new();
        s.read_to_end(&mut all)?;
        Ok(String::from_utf8_lossy(&all).into_owned())
    });
    let answer = answer.unwrap_or_default();
    let status = answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Outcome::of(status, body)
}

fn expected(host: &str) -> Outcome {
    let ok = |client: &[&str]| Outcome {
        status: 200,
        sni: Some(ORIGIN_NAME.into()),
        client: client.iter().map(|s| s.to_string()).collect(),
    };
    match host {
        "simple.example.com" | "insecure.example.com" | ORIGIN_NAME => ok(&[]),
        "mutual.example.com" => ok(&[CLIENT_NAME]),
        _ => Outcome::of(503, ""),
    }
}

/// Every case through one proxy: (what, outcome).
fn outcomes(net: &PodNet) -> Vec<(String, Outcome)> {
    let mut all: Vec<(String, Outcome)> = HTTP_CASES
        .iter()
        .map(|(host, _, _)| (format!("http {host}"), http(net, host)))
        .collect();
    // The auto_sni cluster again, for a host its origin's certificate does not name: its own
    // SNI, its own SAN check, never the connection pooled for the other host.
    all.push((format!("http {AUTO_WRONG}"), http(net, AUTO_WRONG)));
    // An answer whose body ends with the connection, closed without close_notify: whole.
    all.push((
        "http close-delimited".into(),
        http_at(net, "simple.example.com", "/close-delimited"),
    ));
    all.push(("tcp".into(), tcp(net, TCP_VIP)));
    all.push(("tcp wrong SAN".into(), tcp(net, TCP_WRONG_SAN_VIP)));
    all
}

fn stat(body: &str, cluster: &str, name: &str) -> u64 {
    let full = format!("cluster.{cluster}.{name}: ");
    body.lines()
        .find_map(|l| l.strip_prefix(&full))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn admin(net: &PodNet, port: u16, path: &str) -> String {
    let url = format!("http://127.0.0.1:{port}{path}");
    let (status, body) = peer::curl_status(&net.pod, &[&url], Duration::from_secs(5));
    assert_eq!(status, 200, "{path}: {body}");
    body
}

#[test]
fn destination_rule_tls_has_envoys_outcome() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora_net, envoy_net) = (&nets.0, &nets.1);
    let (remora_certs, _remora_origins) = prepare(remora_net);
    let (envoy_certs, _envoy_origins) = prepare(envoy_net);
    let remora = resources(&remora_certs).start_remora(remora_net);
    let envoy = resources(&envoy_certs).start_envoy(envoy_net, Path::new(&binary));

    let from_envoy = outcomes(envoy_net);
    let from_remora = outcomes(remora_net);
    let mut differences = Vec::new();
    for ((what, e), (_, r)) in from_envoy.iter().zip(&from_remora) {
        let want = match what.strip_prefix("http ") {
            Some("close-delimited") => expected("simple.example.com"),
            Some(host) => expected(host),
            None if what == "tcp" => Outcome {
                status: 200,
                sni: Some(ORIGIN_NAME.into()),
                client: vec![],
            },
            // The handshake fails: the TCP connection is closed with nothing sent.
            None => Outcome::of(0, ""),
        };
        if e != &want {
            differences.push(format!(
                "{what}: envoy {e:?}, expected {want:?} (the test is wrong)"
            ));
        }
        if r != e {
            differences.push(format!("{what}:\n  envoy:  {e:?}\n  remora: {r:?}"));
        }
    }
    assert!(
        differences.is_empty(),
        "{}\n\nremora stderr:\n{}\n\nenvoy log:\n{}",
        differences.join("\n"),
        remora.stderr(),
        envoy.logs()
    );

    // A failed handshake is a connect failure of the cluster, in both.
    let wrong = cluster_name("wrong-san.example.com", 80);
    let remora_stats = admin(remora_net, remora_e2e::ADMIN_PORT, "/stats");
    let envoy_stats = admin(envoy_net, remora_e2e::envoy::ADMIN_PORT, "/stats");
    let (r, e) = (
        stat(&remora_stats, &wrong, "upstream_cx_connect_fail"),
        stat(&envoy_stats, &wrong, "upstream_cx_connect_fail"),
    );
    assert!(e >= 1, "Envoy counts the failed handshake:\n{envoy_stats}");
    assert!(
        r >= 1,
        "Remora counts the failed handshake (Envoy {e}):\n{remora_stats}"
    );
    // The key is read, never logged.
    let key = std::fs::read_to_string(remora_certs.client.join("key.pem")).expect("key");
    let secret_line = key
        .lines()
        .find(|l| !l.starts_with("-----"))
        .expect("a PEM body");
    assert!(
        !remora.stderr().contains(secret_line) && !remora.stdout().contains(secret_line),
        "the client key appears in Remora's output"
    );
}

const PAIR: &str = "outbound|80||pair.example.com";

/// One SIMPLE cluster over two endpoints, one of whose certificates names another host, with
/// a VirtualService's retries on `connect-failure` (to another host) and a DestinationRule's
/// outlier detection (2 consecutive 5xx, which a connect failure counts as).
fn failover_resources(certs: &Certs) -> Resources {
    let mut cluster = tls_cluster(PAIR, Tls::Simple(ORIGIN_NAME), certs);
    cluster["lb_policy"] = json!("ROUND_ROBIN");
    cluster["outlier_detection"] = json!({"consecutive_5xx": 2, "interval": "10s",
        "base_ejection_time": "60s", "max_ejection_percent": 100, "enforcing_success_rate": 0});
    cluster["common_lb_config"] = json!({"healthy_panic_threshold": {}});
    let mut r = resources(certs);
    r.clusters = json!([cluster,
        {"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}]);
    let hosts: Vec<Value> = [SIMPLE_PORT, OTHER_NAME_PORT]
        .iter()
        .map(|port| {
            json!({"endpoint": {"address": {"socket_address": {
                "address": ORIGIN_IP.to_string(), "port_value": port}}}, "health_status": "HEALTHY"})
        })
        .collect();
    r.endpoints = json!([{"cluster_name": PAIR, "endpoints": [{"lb_endpoints": hosts}]}]);
    r.listeners = json!([r.listeners[0].clone(), r.listeners[1].clone()]);
    r.routes = json!([{"name": "80", "virtual_hosts": [{"name": "pair.example.com:80",
        "domains": ["pair.example.com"], "routes": [{"name": "default", "match": {"prefix": "/"},
            "route": {"cluster": PAIR, "timeout": "0s", "retry_policy": {
                "retry_on": "connect-failure", "num_retries": 2,
                "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
                "host_selection_retry_max_attempts": "5"}}}]}]}]);
    r
}

/// Requests through one proxy, then its statuses and the cluster's counts: connect failures,
/// retries, ejections.
fn failover(net: &PodNet, admin_port: u16) -> (Vec<u16>, [u64; 3]) {
    let statuses = (0..12)
        .map(|_| http(net, "pair.example.com").status)
        .collect();
    let stats = admin(net, admin_port, "/stats");
    let counts = [
        "upstream_cx_connect_fail",
        "upstream_rq_retry",
        "outlier_detection.ejections_enforced_total",
    ]
    .map(|name| stat(&stats, PAIR, name));
    (statuses, counts)
}

#[test]
fn a_failed_handshake_is_retried_and_ejects_the_host_as_in_envoy() {
    let Some((binary, nets)) = nets_or_skip() else {
        return;
    };
    let (remora_net, envoy_net) = (&nets.0, &nets.1);
    let (remora_certs, _remora_origins) = prepare(remora_net);
    let (envoy_certs, _envoy_origins) = prepare(envoy_net);
    let remora = failover_resources(&remora_certs).start_remora(remora_net);
    let envoy = failover_resources(&envoy_certs).start_envoy(envoy_net, Path::new(&binary));
    let (e_statuses, e) = failover(envoy_net, remora_e2e::envoy::ADMIN_PORT);
    let (r_statuses, r) = failover(remora_net, remora_e2e::ADMIN_PORT);
    let diagnostics = || {
        format!(
            "remora stderr:\n{}\n\nenvoy log:\n{}",
            remora.stderr(),
            envoy.logs()
        )
    };
    // Every request answered by the good host, after a retry when it first met the other.
    assert!(
        e_statuses.iter().all(|s| *s == 200),
        "envoy {e_statuses:?}\n{}",
        diagnostics()
    );
    assert_eq!(r_statuses, e_statuses, "{}", diagnostics());
    // [connect failures, retries, ejections]: the host whose certificate names another is
    // ejected after its second failed handshake, each failure having been retried.
    eprintln!("envoy {e:?}, remora {r:?}");
    assert_eq!(e[2], 1, "envoy ejects once: {e:?}\n{}", diagnostics());
    assert!((2..=3).contains(&e[0]) && e[1] == e[0], "envoy {e:?}");
    assert_eq!(r[2], e[2], "remora {r:?}, envoy {e:?}\n{}", diagnostics());
    assert!(
        (2..=3).contains(&r[0]) && r[1] == r[0],
        "remora {r:?}, envoy {e:?}"
    );
}
