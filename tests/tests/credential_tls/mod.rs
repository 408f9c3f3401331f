//! The resources `istiod_credential_tls` serves, as istiod writes them for a DestinationRule's
//! `credentialName`: the clusters naming their secrets, their endpoints, the outbound
//! listener and route, and the secrets themselves.

use remora_e2e::istiod::ads::type_url;
use remora_e2e::istiod::secrets::{ads_sds, ca_secret, credential, credential_roots, tls_secret};
use remora_e2e::istiod::Ads;
use remora_e2e::xds_resources::eds_cluster;
use serde_json::{json, Value};
use std::net::Ipv4Addr;
use std::time::Duration;

pub const TOKEN: &str = "projected-token-for-sleep";
pub const ORIGIN_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);
pub const ORIGIN_PORT: u16 = 9443;
/// The HTTP services' VIP.
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// The ServiceEntry host whose DestinationRule names the credential.
pub const HOST: &str = "mutual.example.com";
/// A host added later, whose DestinationRule names a secret that does not exist.
pub const PENDING_HOST: &str = "pending.example.com";
/// A host added later whose endpoints the control plane holds back for a while.
pub const LATE_HOST: &str = "late.example.com";
/// The Kubernetes secrets' names.
pub const CREDENTIAL: &str = "client-credential";
pub const ABSENT: &str = "absent-credential";
/// The origin's certificate names this; the DestinationRule sends it as SNI and checks it.
pub const ORIGIN_NAME: &str = "api.example.com";
pub const CLIENT_NAME: &str = "client.example.com";
pub const ROTATED_NAME: &str = "rotated.example.com";
/// Bound on each step's wait.
pub const STEP_TIME: Duration = Duration::from_secs(20);

pub fn cluster_name(host: &str) -> String {
    format!("outbound|80||{host}")
}

/// The cluster istiod builds for `host` with `tls: {mode: MUTUAL, credentialName, sni,
/// subjectAltNames}` and a `workloadSelector` (`ApplyCustomSDSToClientCommonTLSContext`).
pub fn credential_cluster(host: &str, secret: &str) -> Value {
    let mut c = eds_cluster(&cluster_name(host));
    c["metadata"] = json!({"filter_metadata": {"istio": {"alpn_override": "false"}}});
    c["transport_socket"] = json!({"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": {
            "tls_params": {"tls_minimum_protocol_version": "TLSv1_2",
                "tls_maximum_protocol_version": "TLSv1_3"},
            "tls_certificate_sds_secret_configs": [ads_sds(&credential(secret))],
            "combined_validation_context": {
                "default_validation_context": {"match_subject_alt_names": [{"exact": ORIGIN_NAME}]},
                "validation_context_sds_secret_config": ads_sds(&credential_roots(secret))}},
        "sni": ORIGIN_NAME}});
    c
}

pub fn endpoints(host: &str) -> Value {
    json!({"cluster_name": cluster_name(host), "endpoints": [{"lb_endpoints": [{"endpoint":
        {"address": {"socket_address": {"address": ORIGIN_IP.to_string(), "port_value": ORIGIN_PORT}}},
        "health_status": "HEALTHY"}]}]})
}

/// Envoy's capture listener (Remora takes 15001 itself): what no listener of the original
/// destination takes goes nowhere.
pub fn virtual_outbound() -> Value {
    json!({"name": "virtualOutbound",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15001}},
        "use_original_dst": true, "traffic_direction": "OUTBOUND",
        "filter_chains": [{"name": "virtualOutbound-catchall-tcp", "filters": [
            {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "stat_prefix": "BlackHoleCluster", "cluster": "BlackHoleCluster"}}]}]})
}

pub fn listener() -> Value {
    json!({"name": "0.0.0.0_80",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}},
        "traffic_direction": "OUTBOUND", "bind_to_port": false,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "outbound_0.0.0.0_80",
            "rds": {"config_source": {"ads": {}, "resource_api_version": "V3"}, "route_config_name": "80"},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
            "access_log": [{"name": "envoy.access_loggers.file", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": "/dev/stdout",
                "log_format": {"text_format_source": {"inline_string": ACCESS_FORMAT}}}}]}}]}]})
}

/// One access-log line per request, with the authority last so that a line is found by host.
pub const ACCESS_FORMAT: &str = "ACCESS %RESPONSE_CODE% %RESPONSE_FLAGS% %REQ(:AUTHORITY)%\n";

pub fn route(hosts: &[&str]) -> Value {
    let vhosts: Vec<Value> = hosts
        .iter()
        .map(|h| {
            json!({"name": format!("{h}:80"), "domains": [h, format!("{h}:80")],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster_name(h), "timeout": "0s"}}]})
        })
        .collect();
    json!({"name": "80", "virtual_hosts": vhosts})
}

/// The configuration for `hosts`, each cluster naming its secret.
pub fn serve_config(ads: &Ads, version: &str, hosts: &[(&str, &str)]) {
    serve_config_withholding(ads, version, hosts, &[]);
}

/// The same, without the endpoints of the `withheld` hosts.
pub fn serve_config_withholding(
    ads: &Ads,
    version: &str,
    hosts: &[(&str, &str)],
    withheld: &[&str],
) {
    let names: Vec<&str> = hosts.iter().map(|(h, _)| *h).collect();
    let clusters: Vec<Value> = hosts
        .iter()
        .map(|(h, s)| credential_cluster(h, s))
        .collect();
    let mut clusters = clusters;
    clusters.push(json!({"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}));
    let cla: Vec<Value> = names
        .iter()
        .filter(|h| !withheld.contains(h))
        .map(|h| endpoints(h))
        .collect();
    ads.set(type_url::ENDPOINT, version, &cla);
    ads.set(type_url::ROUTE, version, &[route(&names)]);
    ads.set(type_url::CLUSTER, version, &clusters);
    ads.set(
        type_url::LISTENER,
        version,
        &[virtual_outbound(), listener()],
    );
}

/// The credential's two secrets as istiod's SecretGen sends them.
pub fn serve_secrets(ads: &Ads, version: &str, client: (&str, &str), roots: &str) {
    ads.set(
        type_url::SECRET,
        version,
        &[
            tls_secret(&credential(CREDENTIAL), client.0, client.1),
            ca_secret(&credential_roots(CREDENTIAL), roots),
        ],
    );
}
