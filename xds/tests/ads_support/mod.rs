//! The ADS tests' control plane and sink: a real tonic ADS server on a loopback socket that
//! hands each stream to the test (which reads the client's requests and scripts responses),
//! and a sink that accepts or refuses by name and wants the endpoints of every cluster it holds
//! and a route table per listener.

#![allow(dead_code)] // each test file uses part of it

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    Resource as DeltaResource,
};
use envoy_types::pb::google::protobuf::Any;
use remora_xds::ads::{AdsClient, AdsConfig, MetadataError, Mode, NodeInfo, Stats};
use remora_xds::sink::{type_url, Applied, Interest, Rejection, Sink, Update};
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

/// How long a test waits for anything before failing.
pub const WAIT: Duration = Duration::from_secs(10);

/// One stream as the control plane sees it.
pub struct StreamHandle<Req, Resp> {
    pub metadata: MetadataMap,
    requests: Streaming<Req>,
    responses: mpsc::UnboundedSender<Result<Resp, Status>>,
}

impl<Req, Resp> StreamHandle<Req, Resp> {
    /// The client's next request on this stream.
    pub async fn request(&mut self) -> Req {
        match tokio::time::timeout(WAIT, self.requests.message()).await {
            Ok(Ok(Some(request))) => request,
            Ok(Ok(None)) => panic!("the client closed the stream"),
            Ok(Err(status)) => panic!("the stream failed: {status}"),
            Err(_) => panic!("no request within {WAIT:?}"),
        }
    }

    /// The next request if one comes within `within`.
    pub async fn request_within(&mut self, within: Duration) -> Option<Req> {
        match tokio::time::timeout(within, self.requests.message()).await {
            Ok(Ok(request)) => request,
            Ok(Err(status)) => panic!("the stream failed: {status}"),
            Err(_) => None,
        }
    }

    /// Whether the client ends the stream (closes or resets it) within `within`.
    pub async fn ended_within(&mut self, within: Duration) -> bool {
        loop {
            match tokio::time::timeout(within, self.requests.message()).await {
                Ok(Ok(Some(_))) => continue,
                Ok(Ok(None)) | Ok(Err(_)) => return true,
                Err(_) => return false,
            }
        }
    }

    /// Whether the client sends nothing more within `within`.
    pub async fn quiet_for(&mut self, within: Duration) -> bool {
        tokio::time::timeout(within, self.requests.message())
            .await
            .is_err()
    }

    pub fn respond(&self, response: Resp) {
        self.responses
            .send(Ok(response))
            .unwrap_or_else(|_| panic!("the response stream is closed"));
    }
}

type Streams<Req, Resp> = mpsc::UnboundedSender<StreamHandle<Req, Resp>>;

struct ControlPlane {
    sotw: Streams<DiscoveryRequest, DiscoveryResponse>,
    delta: Streams<DeltaDiscoveryRequest, DeltaDiscoveryResponse>,
    /// While set, every new stream is refused `UNAVAILABLE` ([`Server::set_away`]).
    away: Arc<AtomicBool>,
}

impl ControlPlane {
    fn refuse_if_away(&self) -> Result<(), Status> {
        match self.away.load(Ordering::SeqCst) {
            true => Err(Status::unavailable("the control plane is away")),
            false => Ok(()),
        }
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for ControlPlane {
    type StreamAggregatedResourcesStream =
        UnboundedReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream =
        UnboundedReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        self.refuse_if_away()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let metadata = request.metadata().clone();
        let handle = StreamHandle {
            metadata,
            requests: request.into_inner(),
            responses: tx,
        };
        self.sotw
            .send(handle)
            .map_err(|_| Status::unavailable("test over"))?;
        Ok(Response::new(UnboundedReceiverStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        self.refuse_if_away()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let metadata = request.metadata().clone();
        let handle = StreamHandle {
            metadata,
            requests: request.into_inner(),
            responses: tx,
        };
        self.delta
            .send(handle)
            .map_err(|_| Status::unavailable("test over"))?;
        Ok(Response::new(UnboundedReceiverStream::new(rx)))
    }
}

/// The scripted control plane: each stream the client opens arrives here.
pub struct Server {
    pub addr: SocketAddr,
    sotw: mpsc::UnboundedReceiver<StreamHandle<DiscoveryRequest, DiscoveryResponse>>,
    delta: mpsc::UnboundedReceiver<StreamHandle<DeltaDiscoveryRequest, DeltaDiscoveryResponse>>,
    away: Arc<AtomicBool>,
}

impl Server {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local address");
        let (sotw_tx, sotw) = mpsc::unbounded_channel();
        let (delta_tx, delta) = mpsc::unbounded_channel();
        let away = Arc::new(AtomicBool::new(false));
        let service = AggregatedDiscoveryServiceServer::new(ControlPlane {
            sotw: sotw_tx,
            delta: delta_tx,
            away: Arc::clone(&away),
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .serve_with_incoming(service, TcpListenerStream::new(listener)),
        );
        Self {
            addr,
            sotw,
            delta,
            away,
        }
    }

    /// While `away`, the control plane refuses every new stream, as one being restarted
    /// does; streams already open go on.
    pub fn set_away(&self, away: bool) {
        self.away.store(away, Ordering::SeqCst);
    }

    pub async fn sotw_stream(&mut self) -> StreamHandle<DiscoveryRequest, DiscoveryResponse> {
        tokio::time::timeout(WAIT, self.sotw.recv())
            .await
            .expect("no state-of-the-world stream in time")
            .expect("server gone")
    }

    pub async fn delta_stream(
        &mut self,
    ) -> StreamHandle<DeltaDiscoveryRequest, DeltaDiscoveryResponse> {
        tokio::time::timeout(WAIT, self.delta.recv())
            .await
            .expect("no delta stream in time")
            .expect("server gone")
    }
}

/// A sink that refuses the names it is told to, and otherwise holds what it gets.
#[derive(Default)]
pub struct TestSink {
    refuse: Mutex<BTreeMap<String, String>>,
    held: Mutex<BTreeMap<String, BTreeMap<String, String>>>,
    pub applies: AtomicU64,
    /// What [`TestSink::want`] says is wanted between responses.
    interest: tokio::sync::watch::Sender<Interest>,
}

impl TestSink {
    pub fn refuse(&self, name: &str, reason: &str) {
        lock(&self.refuse).insert(name.to_owned(), reason.to_owned());
    }

    /// Changes the interest in `type_url` with no response applied, as the store does when a
    /// cluster's endpoints time out.
    pub fn want(&self, type_url: &'static str, names: &[&str]) {
        let names = names.iter().map(|n| n.to_string()).collect();
        self.interest.send_modify(|interest| {
            interest.insert(type_url, names);
        });
    }

    /// The held resources of a type, name → version.
    pub fn held(&self, type_url: &str) -> BTreeMap<String, String> {
        lock(&self.held).get(type_url).cloned().unwrap_or_default()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `body` decodes as the type's message: the sink's own check of what it is given.
fn decodes(type_url: &str, body: &[u8]) -> bool {
    use prost::Message;
    match type_url {
        type_url::CLUSTER => Cluster::decode(body).is_ok(),
        type_url::LISTENER => Listener::decode(body).is_ok(),
        type_url::ROUTE => RouteConfiguration::decode(body).is_ok(),
        type_url::ENDPOINT => ClusterLoadAssignment::decode(body).is_ok(),
        type_url::SECRET => Secret::decode(body).is_ok(),
        _ => false,
    }
}

impl Sink for TestSink {
    fn interest(&self) -> Option<tokio::sync::watch::Receiver<Interest>> {
        Some(self.interest.subscribe())
    }

    fn apply(&self, type_url: &str, update: Update) -> Applied {
        self.applies.fetch_add(1, Ordering::SeqCst);
        let refuse = lock(&self.refuse).clone();
        let mut all = lock(&self.held);
        let held = all.entry(type_url.to_owned()).or_default();
        let mut applied = Applied::default();
        let names: BTreeSet<String> = update.resources.iter().map(|r| r.name.clone()).collect();
        if update.complete && matches!(type_url, type_url::CLUSTER | type_url::LISTENER) {
            // Refused resources keep their previous version: only those absent are removed.
            held.retain(|name, _| names.contains(name));
        }
        for resource in update.resources {
            if let Some(reason) = refuse.get(&resource.name) {
                applied.rejected.push(Rejection {
                    name: resource.name,
                    reason: reason.clone(),
                });
            } else if !decodes(type_url, &resource.body) {
                applied.rejected.push(Rejection {
                    name: resource.name,
                    reason: "cannot decode".to_owned(),
                });
            } else {
                held.insert(resource.name, resource.version);
            }
        }
        for name in update.removed {
            held.remove(&name);
        }
        let held_names: BTreeSet<String> = held.keys().cloned().collect();
        // A cluster named `tls-…` names the secret `secret-tls-…`, served over ADS, and asks
        // for it once its endpoints are held (as the store does, after Envoy).
        if matches!(type_url, type_url::CLUSTER | type_url::ENDPOINT) {
            let clusters = all.get(type_url::CLUSTER).cloned().unwrap_or_default();
            let endpoints = all.get(type_url::ENDPOINT).cloned().unwrap_or_default();
            let secrets = clusters
                .keys()
                .filter(|c| c.starts_with("tls-") && endpoints.contains_key(*c))
                .map(|c| format!("secret-{c}"))
                .collect();
            applied.wanted.insert(type_url::SECRET, secrets);
        }
        match type_url {
            type_url::CLUSTER => {
                applied.wanted.insert(type_url::ENDPOINT, held_names);
            }
            type_url::LISTENER => {
                let routes = held_names.iter().map(|l| format!("routes-{l}")).collect();
                applied.wanted.insert(type_url::ROUTE, routes);
            }
            _ => {}
        }
        applied
    }
}

/// A resource of `type_url` named `name`, serialised.
pub fn body(type_url: &str, name: &str) -> Vec<u8> {
    use prost::Message;
    match type_url {
        type_url::CLUSTER => Cluster {
            name: name.to_owned(),
            ..Cluster::default()
        }
        .encode_to_vec(),
        type_url::LISTENER => Listener {
            name: name.to_owned(),
            ..Listener::default()
        }
        .encode_to_vec(),
        type_url::ROUTE => RouteConfiguration {
            name: name.to_owned(),
            ..RouteConfiguration::default()
        }
        .encode_to_vec(),
        type_url::SECRET => Secret {
            name: name.to_owned(),
            ..Secret::default()
        }
        .encode_to_vec(),
        _ => ClusterLoadAssignment {
            cluster_name: name.to_owned(),
            ..ClusterLoadAssignment::default()
        }
        .encode_to_vec(),
    }
}

pub fn any(type_url: &str, name: &str) -> Any {
    Any {
        type_url: type_url.to_owned(),
        value: body(type_url, name),
    }
}

/// A delta resource: its name, version and body.
pub fn delta_resource(type_url: &str, name: &str, version: &str) -> DeltaResource {
    DeltaResource {
        name: name.to_owned(),
        version: version.to_owned(),
        resource: Some(any(type_url, name)),
        ..DeltaResource::default()
    }
}

pub fn delta_response(
    type_url: &str,
    nonce: &str,
    resources: Vec<DeltaResource>,
    removed: &[&str],
) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: type_url.to_owned(),
        nonce: nonce.to_owned(),
        system_version_info: format!("sys-{nonce}"),
        resources,
        removed_resources: removed.iter().map(|n| (*n).to_owned()).collect(),
        ..DeltaDiscoveryResponse::default()
    }
}

pub fn sotw_response(
    type_url: &str,
    version: &str,
    nonce: &str,
    names: &[&str],
) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: version.to_owned(),
        type_url: type_url.to_owned(),
        nonce: nonce.to_owned(),
        resources: names.iter().map(|n| any(type_url, n)).collect(),
        ..DiscoveryResponse::default()
    }
}

pub fn names(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

/// The node the tests' client presents.
pub fn node() -> NodeInfo {
    let mut metadata = BTreeMap::new();
    metadata.insert("NAMESPACE".to_owned(), serde_json::json!("default"));
    NodeInfo {
        id: remora_xds::ads::sidecar_node_id("10.0.0.7", "app-1", "default", "cluster.local"),
        cluster: "app.default".to_owned(),
        metadata,
        locality: None,
        user_agent_version: "test".to_owned(),
    }
}

/// A running client, its sink and stats; dropping it stops the client.
pub struct Running {
    pub sink: Arc<TestSink>,
    pub stats: Arc<Stats>,
    /// How many times the client asked for call metadata (once per stream).
    pub metadata_calls: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Starts a client against `server` with short back-off bounds (`backoff_base`..1 s), a
/// metadata provider that numbers its tokens, and a fresh [`TestSink`].
pub fn start_client(server: &Server, mode: Mode, backoff_base: Duration) -> Running {
    start_client_with(server, mode, |config| config.backoff_base = backoff_base)
}

/// [`start_client`] with the configuration changed by `tweak` (back-off max 1 s before it).
pub fn start_client_with(
    server: &Server,
    mode: Mode,
    tweak: impl FnOnce(&mut AdsConfig),
) -> Running {
    start_client_failing(server, mode, 0, tweak)
}

/// [`start_client_with`] whose metadata provider fails its first `metadata_failures` calls, as
/// a token file not mounted yet would.
pub fn start_client_failing(
    server: &Server,
    mode: Mode,
    metadata_failures: u64,
    tweak: impl FnOnce(&mut AdsConfig),
) -> Running {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .expect("endpoint")
        .connect_lazy();
    let sink = Arc::new(TestSink::default());
    let metadata_calls = Arc::new(AtomicU64::new(0));
    let calls = Arc::clone(&metadata_calls);
    let metadata = move || -> Result<MetadataMap, MetadataError> {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n <= metadata_failures {
            return Err(MetadataError::new(
                "/var/run/secrets/tokens/istio-token: not found",
            ));
        }
        let mut map = MetadataMap::new();
        let token = format!("Bearer token-{n}")
            .parse()
            .map_err(|e| MetadataError(Box::new(e)))?;
        map.insert("authorization", token);
        map.insert(
            "clusterid",
            tonic::metadata::MetadataValue::from_static("Kubernetes"),
        );
        Ok(map)
    };
    let mut config = AdsConfig::new(node(), mode);
    config.backoff_max = Duration::from_secs(1);
    tweak(&mut config);
    let client = AdsClient::new(channel, metadata, config, sink.clone());
    let stats = client.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(client.run(async move {
        let _ = stopped.await;
    }));
    Running {
        sink,
        stats,
        metadata_calls,
        stop: Some(stop),
    }
}
