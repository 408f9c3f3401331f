//! An external authorizer of Envoy's gRPC flavour (`envoy.service.auth.v3.Authorization/Check`,
//! tonic with envoy-types' service), served in a network namespace for the CUSTOM
//! authorization tests. Every check is answered from its path: one containing `/deny` is
//! denied (401, a body and a header for the client), anything else allowed with a header for
//! the upstream naming how many body bytes the check carried, one for the client
//! (`x-ext-authz-response: seen`), and the query edited (`checked=yes` set, `drop` removed). A connection's check (the
//! network filter's: no HTTP request) is denied when its destination port is
//! [`DENIED_TCP_PORT`], and fails with a gRPC error (`UNAVAILABLE`) when it is one of
//! [`ERRORING_TCP_PORTS`].
//!
//! Also the resources istiod writes for a CUSTOM policy on a TCP port with a gRPC provider
//! ([`tcp_chain`], [`grpc_cluster`]), which both proxies are given.

use crate::netns::Netns;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption, QueryParameter};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::auth::v3::authorization_server::{
    Authorization, AuthorizationServer,
};
use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
use envoy_types::pb::envoy::service::auth::v3::{
    CheckRequest, CheckResponse, DeniedHttpResponse, OkHttpResponse,
};
use envoy_types::pb::google::rpc::Status;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// The destination port whose connections are denied.
pub const DENIED_TCP_PORT: u32 = 9101;
/// Destination ports whose connections' checks fail (the authorizer erring).
pub const ERRORING_TCP_PORTS: [u32; 2] = [9105, 9106];

/// The authorizer, serving until dropped.
pub struct GrpcAuthorizer {
    runtime: Option<tokio::runtime::Runtime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    checks: Arc<Mutex<Vec<CheckRequest>>>,
}

struct Checker {
    checks: Arc<Mutex<Vec<CheckRequest>>>,
}

fn header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl Authorization for Checker {
    async fn check(
        &self,
        request: tonic::Request<CheckRequest>,
    ) -> Result<tonic::Response<CheckResponse>, tonic::Status> {
        let check = request.into_inner();
        let http = check
            .attributes
            .as_ref()
            .and_then(|a| a.request.as_ref())
            .and_then(|r| r.http.clone());
        let port = check
            .attributes
            .as_ref()
            .and_then(|a| a.destination.as_ref()?.address.as_ref()?.address.as_ref())
            .and_then(|a| match a {
                envoy_types::pb::envoy::config::core::v3::address::Address::SocketAddress(s) => {
                    match s.port_specifier {
                        Some(envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p)) => Some(p),
                        _ => None,
                    }
                }
                _ => None,
            });
        let tcp_denied = http.is_none() && port == Some(DENIED_TCP_PORT);
        let tcp_erring = http.is_none() && port.is_some_and(|p| ERRORING_TCP_PORTS.contains(&p));
        let http = http.unwrap_or_default();
        if let Ok(mut checks) = self.checks.lock() {
            checks.push(check);
        }
        if tcp_erring {
            return Err(tonic::Status::unavailable("the authorizer is erring"));
        }
        let response = if tcp_denied || http.path.contains("/deny") {
            CheckResponse {
                status: Some(Status {
                    code: 7,
                    ..Default::default()
                }),
                http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
                    status: Some(HttpStatus { code: 401 }),
                    headers: vec![header("x-ext-authz-check-result", "denied")],
                    body: "denied by ext_authz\n".into(),
                })),
                ..Default::default()
            }
        } else {
            let bytes = (http.body.len() + http.raw_body.len()).to_string();
            CheckResponse {
                status: Some(Status::default()),
                http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                    headers: vec![
                        header("x-ext-authz-check-result", "allowed"),
                        header("x-ext-authz-body-bytes", &bytes),
                    ],
                    response_headers_to_add: vec![header("x-ext-authz-response", "seen")],
                    query_parameters_to_set: vec![QueryParameter {
                        key: "checked".into(),
                        value: "yes".into(),
                    }],
                    query_parameters_to_remove: vec!["drop".into()],
                    ..Default::default()
                })),
                ..Default::default()
            }
        };
        Ok(tonic::Response::new(response))
    }
}

impl GrpcAuthorizer {
    /// Serve plaintext HTTP/2 on `addr` inside `ns`.
    pub fn start(ns: &Netns, addr: SocketAddr) -> GrpcAuthorizer {
        let listener = ns
            .bind(addr)
            .unwrap_or_else(|e| panic!("bind the authorizer on {addr}: {e}"));
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ext-authz")
            .enable_all()
            .build()
            .expect("the authorizer's runtime");
        let checks = Arc::new(Mutex::new(Vec::new()));
        let service = AuthorizationServer::new(Checker {
            checks: Arc::clone(&checks),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            let incoming = tonic::codegen::tokio_stream::wrappers::TcpListenerStream::new(listener);
            let served = tonic::transport::Server::builder()
                .serve_with_incoming_shutdown(service, incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                eprintln!("authorizer: {e}");
            }
        });
        GrpcAuthorizer {
            runtime: Some(runtime),
            stop: Some(stop),
            checks,
        }
    }

    /// The checks received so far.
    pub fn checks(&self) -> Vec<CheckRequest> {
        self.checks.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

impl Drop for GrpcAuthorizer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
        }
    }
}

/// istiod's cluster for a gRPC service port at `address`: HTTP/2.
pub fn grpc_cluster(name: &str, address: SocketAddr) -> Value {
    json!({"name": name, "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint":
            {"address": {"socket_address": {"address": address.ip().to_string(),
                "port_value": address.port()}}}}]}]},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}})
}

/// What a TCP chain of [`tcp_chain`] is given.
#[derive(Debug, Clone, Copy)]
pub struct TcpChain<'a> {
    /// The gRPC authorizer's cluster.
    pub grpc: &'a str,
    /// The destination ports the CUSTOM policy selects, as port ranges (end excluded; one
    /// permission each, any of which selects).
    pub selected: &'a [(u16, u16)],
    /// `failure_mode_allow` (the provider's `failOpen`).
    pub fail_open: bool,
    /// The `tcp_proxy`'s `access_log`, if any.
    pub access_log: Option<&'a Value>,
}

/// A TCP chain on `port` as istiod writes it for a CUSTOM policy with a gRPC provider: the
/// network shadow RBAC filter naming the selected ports, the network ext_authz filter it
/// enables (stat prefix `tcp.`), `tcp_proxy` to `inbound|port||`.
pub fn tcp_chain(port: u16, c: TcpChain<'_>) -> Value {
    let cluster = format!("inbound|{port}||");
    let ranges: Vec<Value> = c
        .selected
        .iter()
        .map(|(start, end)| json!({"destination_port_range": {"start": start, "end": end}}))
        .collect();
    let shadow = json!({"name": "envoy.filters.network.rbac", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC",
        "stat_prefix": "tcp.",
        "shadow_rules": {"action": "DENY", "policies": {
            "istio-ext-authz-ns[server]-policy[ext-tcp]-rule[0]": {
                "permissions": ranges,
                "principals": [{"any": true}]}}},
        "shadow_rules_stat_prefix": "istio_ext_authz_"}});
    let mut ext_authz = json!({"name": "envoy.filters.network.ext_authz", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.ext_authz.v3.ExtAuthz",
        "stat_prefix": "tcp.",
        "grpc_service": {"envoy_grpc": {"cluster_name": c.grpc,
            "authority": c.grpc.replace('|', "_.")}, "timeout": "600s"},
        "transport_api_version": "V3",
        "filter_enabled_metadata": {"filter": "envoy.filters.network.rbac",
            "path": [{"key": "istio_ext_authz_shadow_effective_policy_id"}],
            "value": {"string_match": {"prefix": "istio-ext-authz"}}}}});
    if c.fail_open {
        ext_authz["typed_config"]["failure_mode_allow"] = json!(true);
    }
    let mut tcp_proxy = json!({"name": "envoy.filters.network.tcp_proxy", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
        "stat_prefix": cluster, "cluster": cluster}});
    if let Some(log) = c.access_log {
        tcp_proxy["typed_config"]["access_log"] = log.clone();
    }
    json!({"name": format!("0.0.0.0_{port}"),
        "filter_chain_match": {"destination_port": port, "transport_protocol": "raw_buffer"},
        "filters": [shadow, ext_authz, tcp_proxy]})
}
