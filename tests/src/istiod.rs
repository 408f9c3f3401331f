//! A test control plane that speaks istiod's real protocol: gRPC over TLS (a server certificate
//! for `istiod.istio-system.svc` from the mesh's test CA) on port 15012, listening in a
//! namespace the pod can reach, served by a tokio runtime in the test process.
//!
//! It serves Istio's CA (`IstioCertificateService/CreateCertificate`): it checks the
//! `authorization: Bearer` token and the `clusterid` header as istiod does, signs the CSR with
//! the test CA and answers `[leaf, root]` with the lifetime asked for. It serves ADS too
//! ([`ads`]: the resources the test gives it, both protocols, every request recorded), the
//! secrets of a DestinationRule's `credentialName` among them in istiod's shapes
//! ([`secrets`]). One
//! service routes every call by its path (`ControlPlaneService::call`).
//!
//! The CA messages are written here again rather than taken from Remora: the test's side of
//! the wire is an independent reading of istio/api's `ca.proto`.
//!
//! [`HostsFile`] makes `istiod.istio-system.svc` resolve inside the pod, as cluster DNS would.

use crate::certs::MeshCa;
use crate::Netns;
use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::server::{Grpc, UnaryService};
use tonic::{Request, Response, Status};

pub mod ads;
pub mod secrets;
pub use ads::{Ads, AdsRequest, AdsResponse};

/// istiod's service name, the server name its certificate carries.
pub const ISTIOD_HOST: &str = "istiod.istio-system.svc";
/// istiod's TLS gRPC port (xDS and CA).
pub const ISTIOD_PORT: u16 = 15012;
/// The cluster ID the control plane expects in `clusterid` (Istio's default).
pub const CLUSTER_ID: &str = "Kubernetes";

/// istio/api `IstioCertificateRequest` (the metadata field, 4, is not read).
#[derive(Clone, PartialEq, prost::Message)]
pub struct IstioCertificateRequest {
    #[prost(string, tag = "1")]
    pub csr: String,
    #[prost(int64, tag = "3")]
    pub validity_duration: i64,
}

/// istio/api `IstioCertificateResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IstioCertificateResponse {
    #[prost(string, repeated, tag = "1")]
    pub cert_chain: Vec<String>,
}

/// One certificate the CA issued.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The lifetime asked for.
    pub ttl: Duration,
    /// The leaf, PEM.
    pub leaf: String,
}

/// What the CA has seen; shared with the test.
#[derive(Debug, Default)]
pub struct CaRecord {
    pub issued: Vec<Issued>,
    /// Calls refused, with the status message.
    pub refused: Vec<String>,
}

/// The CA's state: the token it accepts and what it has done.
#[derive(Debug)]
struct CaState {
    ca: Arc<MeshCa>,
    token: String,
    record: Mutex<CaRecord>,
}

/// The control plane, stopped on drop.
pub struct ControlPlane {
    state: Arc<CaState>,
    ads: Arc<Ads>,
    addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("addr", &self.addr)
            .finish()
    }
}

impl ControlPlane {
    /// Serve on `addr` inside `ns`, signing with `ca` for callers that present `token`.
    pub fn start(ns: &Netns, addr: SocketAddr, ca: Arc<MeshCa>, token: &str) -> ControlPlane {
        let ads = Arc::new(Ads::new(token, CLUSTER_ID));
        ControlPlane::start_with_ads(ns, addr, ca, token, ads)
    }

    /// The same, serving (and recording into) `ads`: a control plane started again after one
    /// was stopped, with what the first served and saw.
    pub fn start_with_ads(
        ns: &Netns,
        addr: SocketAddr,
        ca: Arc<MeshCa>,
        token: &str,
        ads: Arc<Ads>,
    ) -> ControlPlane {
        let listener = ns
            .bind(addr)
            .unwrap_or_else(|e| panic!("bind the control plane on {addr}: {e}"));
        ControlPlane::serve(listener, ca, token, ISTIOD_HOST, ads)
    }

    /// Serve on `listener` with a server certificate for `server_name`: the same control plane
    /// in the test process on loopback, for tests that need no namespaces (`localhost`).
    pub fn start_on(
        listener: std::net::TcpListener,
        ca: Arc<MeshCa>,
        token: &str,
        server_name: &str,
    ) -> ControlPlane {
        let ads = Arc::new(Ads::new(token, CLUSTER_ID));
        ControlPlane::serve(listener, ca, token, server_name, ads)
    }

    fn serve(
        listener: std::net::TcpListener,
        ca: Arc<MeshCa>,
        token: &str,
        server_name: &str,
        ads: Arc<Ads>,
    ) -> ControlPlane {
        let addr = listener.local_addr().expect("the listener's address");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let server_cert = ca.dns_server(server_name);
        let state = Arc::new(CaState {
            ca,
            token: token.to_string(),
            record: Mutex::default(),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("control-plane")
            .enable_all()
            .build()
            .expect("the control plane's runtime");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = ControlPlaneService {
            state: Arc::clone(&state),
            ads: Arc::clone(&ads),
        };
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            let incoming = tonic::codegen::tokio_stream::wrappers::TcpListenerStream::new(listener);
            let tls = tonic::transport::ServerTlsConfig::new().identity(
                tonic::transport::Identity::from_pem(server_cert.chain, server_cert.key),
            );
            let served = tonic::transport::Server::builder()
                .tls_config(tls)
                .expect("the control plane's TLS")
                .serve_with_incoming_shutdown(service, incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                eprintln!("control plane: {e}");
            }
        });
        ControlPlane {
            state,
            ads,
            addr,
            runtime: Some(runtime),
            stop: Some(stop),
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The ADS service: what it serves, and the requests it has seen.
    pub fn ads(&self) -> &Arc<Ads> {
        &self.ads
    }

    /// Certificates issued so far.
    pub fn issued(&self) -> Vec<Issued> {
        self.record(|r| r.issued.clone())
    }

    /// Calls refused so far, each with its status message.
    pub fn refused(&self) -> Vec<String> {
        self.record(|r| r.refused.clone())
    }

    fn record<T>(&self, f: impl FnOnce(&CaRecord) -> T) -> T {
        f(&self
            .state
            .record
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// istiod's gRPC services by path, by hand (tonic is built without its router): the CA's one
/// method here, ADS by envoy-types' generated server.
#[derive(Debug, Clone)]
struct ControlPlaneService {
    state: Arc<CaState>,
    ads: Arc<Ads>,
}

impl Service<http::Request<tonic::body::Body>> for ControlPlaneService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let state = Arc::clone(&self.state);
        if req
            .uri()
            .path()
            .starts_with("/envoy.service.discovery.v3.AggregatedDiscoveryService/")
        {
            use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
            let mut ads =
                AggregatedDiscoveryServiceServer::new(ads::AdsService(Arc::clone(&self.ads)));
            return Box::pin(async move { ads.call(req).await });
        }
        Box::pin(async move {
            if req.uri().path() != "/istio.v1.auth.IstioCertificateService/CreateCertificate" {
                return Ok(Status::unimplemented(req.uri().path().to_string()).into_http());
            }
            let codec = tonic_prost::ProstCodec::<IstioCertificateResponse, IstioCertificateRequest>::default();
            let mut grpc = Grpc::new(codec);
            Ok(grpc.unary(CreateCertificate(state), req).await)
        })
    }
}

struct CreateCertificate(Arc<CaState>);

impl UnaryService<IstioCertificateRequest> for CreateCertificate {
    type Response = IstioCertificateResponse;
    type Future = BoxFuture<Response<IstioCertificateResponse>, Status>;

    fn call(&mut self, request: Request<IstioCertificateRequest>) -> Self::Future {
        let state = Arc::clone(&self.0);
        Box::pin(async move {
            let result = create_certificate(&state, &request);
            let mut record = state
                .record
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match result {
                Ok(issued) => {
                    let chain = vec![issued.leaf.clone(), state.ca.root_pem()];
                    record.issued.push(issued);
                    Ok(Response::new(IstioCertificateResponse {
                        cert_chain: chain,
                    }))
                }
                Err(status) => {
                    record.refused.push(status.message().to_string());
                    Err(status)
                }
            }
        })
    }
}

/// istiod's checks, then the signature.
fn create_certificate(
    state: &CaState,
    request: &Request<IstioCertificateRequest>,
) -> Result<Issued, Status> {
    let header = |name: &str| {
        request
            .metadata()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    if header("authorization") != format!("Bearer {}", state.token) {
        return Err(Status::unauthenticated(format!(
            "authenticate failure: token {:?} not accepted",
            header("authorization")
        )));
    }
    if header("clusterid") != CLUSTER_ID {
        return Err(Status::unauthenticated(format!(
            "clusterid {:?} is not {CLUSTER_ID}",
            header("clusterid")
        )));
    }
    let body = request.get_ref();
    let ttl = Duration::from_secs(u64::try_from(body.validity_duration).unwrap_or(0));
    if ttl.is_zero() {
        return Err(Status::invalid_argument(
            "validity_duration must be positive",
        ));
    }
    let leaf = state
        .ca
        .sign_csr(&body.csr, ttl)
        .map_err(Status::invalid_argument)?;
    Ok(Issued { ttl, leaf })
}

/// `/etc/netns/<ns>/hosts`, which `ip netns exec` bind-mounts over `/etc/hosts` for every
/// process it starts in that namespace; removed on drop.
#[derive(Debug)]
pub struct HostsFile {
    dir: PathBuf,
}

impl HostsFile {
    /// Name `names` in `ns`, with localhost kept.
    pub fn write(ns: &Netns, names: &[(IpAddr, &str)]) -> io::Result<HostsFile> {
        let dir = PathBuf::from("/etc/netns").join(ns.name());
        std::fs::create_dir_all(&dir)?;
        let guard = HostsFile { dir };
        let mut text = String::from("127.0.0.1 localhost\n::1 localhost\n");
        for (ip, name) in names {
            text.push_str(&format!("{ip} {name}\n"));
        }
        std::fs::write(guard.dir.join("hosts"), text)?;
        Ok(guard)
    }
}

impl Drop for HostsFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("warning: could not remove {}: {e}", self.dir.display());
        }
    }
}

/// pilot-agent's bootstrap for an Envoy sidecar, but reaching this control plane directly
/// (pilot-agent's xDS proxy only forwards): ADS (`delta`, or state of the world) over TLS to
/// `istiod.istio-system.svc` verified against `root` (the mesh root file), with `token` and the
/// cluster ID as headers, clusters and listeners from ADS, and pilot-agent's `xds-grpc`
/// cluster (its `alt_stat_name` makes the cluster a Prometheus label). For `net`'s pod.
pub fn envoy_bootstrap(
    net: &crate::PodNet,
    root: &std::path::Path,
    token: &str,
    delta: bool,
) -> serde_json::Value {
    let xds = net.peer_addr(ISTIOD_PORT);
    serde_json::json!({
        "node": {"id": format!("sidecar~{}~sleep.client~client.svc.cluster.local", net.pod_ip),
            "cluster": "sleep.client"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1",
            "port_value": crate::envoy::ADMIN_PORT}}},
        "dynamic_resources": {
            "ads_config": {"api_type": if delta { "DELTA_GRPC" } else { "GRPC" },
                "transport_api_version": "V3",
                "set_node_on_first_message_only": true,
                "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"},
                    "initial_metadata": [
                        {"key": "authorization", "value": format!("Bearer {token}")},
                        {"key": "clusterid", "value": CLUSTER_ID}]}]},
            "cds_config": {"ads": {}, "resource_api_version": "V3"},
            "lds_config": {"ads": {}, "resource_api_version": "V3"}},
        "static_resources": {"clusters": [{"name": "xds-grpc", "alt_stat_name": "xds-grpc;",
            "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": "xds-grpc", "endpoints": [{"lb_endpoints": [{"endpoint":
                {"address": {"socket_address": {"address": xds.ip().to_string(), "port_value": xds.port()}}}}]}]},
            "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}}},
            "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": ISTIOD_HOST,
                "common_tls_context": {"alpn_protocols": ["h2"], "validation_context": {
                    "trusted_ca": {"filename": root.to_string_lossy()},
                    "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": ISTIOD_HOST}}]}}}}}]}
    })
}

/// `net`'s Remora given the environment Istio's injector gives a sidecar (pilot-agent's
/// `PROXY_CONFIG` naming this control plane, the pod `sleep-6d8b7c9f4-x2k4p` of namespace
/// `client` with service account `sleep`, its IP, the cluster ID); the caller adds its config
/// file and anything more.
pub fn injected_sidecar<'a>(net: &'a crate::PodNet) -> crate::RemoraCommand<'a> {
    injected_sidecar_of(net, "sleep-6d8b7c9f4-x2k4p", "client", "sleep")
}

/// [`injected_sidecar`] for the pod `pod` of `namespace` with service account `account`.
pub fn injected_sidecar_of<'a>(
    net: &'a crate::PodNet,
    pod: &str,
    namespace: &str,
    account: &str,
) -> crate::RemoraCommand<'a> {
    net.remora()
        .env(
            "PROXY_CONFIG",
            format!(r#"{{"discoveryAddress":"{ISTIOD_HOST}:{ISTIOD_PORT}"}}"#),
        )
        .env("POD_NAME", pod)
        .env("POD_NAMESPACE", namespace)
        .env("SERVICE_ACCOUNT", account)
        .env("INSTANCE_IP", net.pod_ip.to_string())
        .env("ISTIO_META_CLUSTER_ID", CLUSTER_ID)
}

/// What a pod in istiod mode is given: the mesh's CA (this control plane signs with it), the
/// projected token and the root certificate file, and `istiod.istio-system.svc` naming the
/// peer namespace inside the pod (kept while this lives).
pub struct PodFiles {
    pub ca: Arc<MeshCa>,
    pub token: PathBuf,
    pub root: PathBuf,
    pub hosts: HostsFile,
}

impl PodFiles {
    /// A new mesh CA, and `token` and its root written for `net`'s pod.
    pub fn write(net: &crate::PodNet, token: &str) -> PodFiles {
        let ca = Arc::new(MeshCa::new("cluster.local"));
        let token = net
            .binary()
            .write_file("istio-token", &format!("{token}\n"));
        let root = net.binary().write_file("root-cert.pem", &ca.root_pem());
        let hosts = HostsFile::write(&net.pod, &[(net.peer_ip.into(), ISTIOD_HOST)])
            .expect("name istiod inside the pod");
        PodFiles {
            ca,
            token,
            root,
            hosts,
        }
    }
}
