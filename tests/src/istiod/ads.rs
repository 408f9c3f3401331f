//! The test control plane's aggregated discovery service (ADS), both protocols: it serves the
//! resources the test gives it ([`Ads::set`], Envoy's JSON read with `remora_xds::json`),
//! pushes a new version to every open stream when the test changes them, checks the bearer
//! token and `clusterid` as the CA does, and records every request (node, version, nonce,
//! `error_detail`, `initial_resource_versions`) for the test to assert on.
//!
//! It serves as istiod does in the parts a sidecar depends on: CDS and LDS are wildcard
//! subscriptions, EDS, RDS and SDS (the secrets istiod serves itself, `super::secrets`) are by
//! name; delta sends only what changed (per resource
//! versions, removals named) and honours the versions a reconnecting client says it holds;
//! state of the world sends the whole subscribed set with the type's version. Unlike istiod it
//! never waits for an ACK before pushing again.

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    Resource as DeltaResource,
};
use envoy_types::pb::google::protobuf::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{mpsc, watch};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Envoy's type URLs of the four kinds a sidecar subscribes to (the client's own).
pub use remora_xds::sink::type_url;

/// One request as received.
#[derive(Debug, Clone, PartialEq)]
pub struct AdsRequest {
    /// Which stream (1, 2… in the order they opened).
    pub stream: u64,
    pub delta: bool,
    /// The node id of the stream (sent on its first request).
    pub node_id: String,
    pub type_url: String,
    /// State of the world: the version acknowledged; empty in delta.
    pub version_info: String,
    pub response_nonce: String,
    /// A NACK's message.
    pub error_detail: Option<String>,
    /// SotW `resource_names`, delta `resource_names_subscribe`.
    pub resource_names: Vec<String>,
    /// Delta: what a reconnecting client holds.
    pub initial_resource_versions: BTreeMap<String, String>,
}

impl AdsRequest {
    /// An ACK or NACK (answers a response) rather than a new subscription.
    pub fn answers(&self) -> bool {
        !self.response_nonce.is_empty()
    }
}

/// One response as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdsResponse {
    pub stream: u64,
    pub type_url: String,
    /// SotW `version_info`, delta `system_version_info`.
    pub version: String,
    pub nonce: String,
    /// The resources it carried, by name.
    pub names: Vec<String>,
}

/// The resources of one type: the version label of the last change and each resource with
/// the version it last changed in.
#[derive(Debug, Default, Clone)]
struct TypeSet {
    version: String,
    resources: BTreeMap<String, (String, Vec<u8>)>,
}

/// What the service holds and has seen.
#[derive(Debug)]
pub struct Ads {
    token: String,
    cluster_id: String,
    world: Mutex<HashMap<String, TypeSet>>,
    requests: Mutex<Vec<AdsRequest>>,
    responses: Mutex<Vec<AdsResponse>>,
    refused: Mutex<Vec<String>>,
    streams: AtomicU64,
    nonces: AtomicU64,
    pushes: watch::Sender<u64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A resource from Envoy's JSON: its name and its serialised proto.
pub fn resource(type_url: &str, json: &serde_json::Value) -> (String, Vec<u8>) {
    // A config dump's resources carry their own `@type`; the message is known from the type.
    let mut json = json.clone();
    if let Some(map) = json.as_object_mut() {
        map.remove("@type");
    }
    let message = remora_xds::json::from_json(&json, remora_xds::json::message_name(type_url))
        .unwrap_or_else(|e| panic!("a test resource of {type_url}: {e}"));
    // istiod sends its name table unnamed.
    let unnamed = (type_url == type_url::NAME_TABLE).then_some("");
    let name = json["name"]
        .as_str()
        .or_else(|| json["cluster_name"].as_str())
        .or(unnamed)
        .unwrap_or_else(|| panic!("a test resource without a name: {json}"))
        .to_string();
    (name, prost::Message::encode_to_vec(&message))
}

/// The resources of `kind` (`listeners`, `clusters`…) of a case of the xDS conformance set
/// (`shared/conformance/xds`: real istiod output; `REMORA_XDS_CONFORMANCE_DIR` points
/// elsewhere), or `None` with the test skipped (failed under `CI=true`) when the set is absent.
pub fn conformance_resources(case: &str, kind: &str) -> Option<Vec<serde_json::Value>> {
    let dir = match std::env::var_os("REMORA_XDS_CONFORMANCE_DIR") {
        Some(d) => std::path::PathBuf::from(d),
        None => std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/conformance/xds"),
    };
    let path = dir
        .join("resources")
        .join(case)
        .join(format!("{kind}.json"));
    let Ok(text) = std::fs::read_to_string(&path) else {
        return crate::environment::skip(&format!("no xDS conformance set: {}", path.display()));
    };
    match serde_json::from_str(&text) {
        Ok(serde_json::Value::Array(resources)) => Some(resources),
        other => panic!("{}: not a JSON array: {other:?}", path.display()),
    }
}

impl Ads {
    /// A service accepting `token` and `cluster_id`, serving nothing yet.
    pub fn new(token: &str, cluster_id: &str) -> Ads {
        Ads {
            token: token.into(),
            cluster_id: cluster_id.into(),
            world: Mutex::default(),
            requests: Mutex::default(),
            responses: Mutex::default(),
            refused: Mutex::default(),
            streams: AtomicU64::new(0),
            nonces: AtomicU64::new(0),
            pushes: watch::channel(0).0,
        }
    }

    /// Serve `resources` (Envoy's JSON) as the whole set of `type_url` at `version`, and push
    /// them to every open stream: resources whose bytes changed (or are new) take `version`,
    /// the others keep theirs; those left out are removed.
    pub fn set(&self, type_url: &str, version: &str, resources: &[serde_json::Value]) {
        {
            let mut world = lock(&self.world);
            let set = world.entry(type_url.to_string()).or_default();
            let mut next = BTreeMap::new();
            for json in resources {
                let (name, body) = resource(type_url, json);
                let kept = set
                    .resources
                    .get(&name)
                    .filter(|(_, old)| *old == body)
                    .map(|(v, _)| v.clone());
                next.insert(name, (kept.unwrap_or_else(|| version.into()), body));
            }
            set.resources = next;
            set.version = version.into();
        }
        self.pushes.send_modify(|n| *n += 1);
    }

    /// An empty mesh: no clusters and no listeners, what istiod sends a pod that no service
    /// concerns; enough for a sidecar's first configuration (tests about the certificate).
    pub fn set_empty(&self) {
        self.set(type_url::CLUSTER, "empty", &[]);
        self.set(type_url::LISTENER, "empty", &[]);
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<AdsRequest> {
        lock(&self.requests).clone()
    }

    /// Every response sent so far.
    pub fn responses(&self) -> Vec<AdsResponse> {
        lock(&self.responses).clone()
    }

    /// Streams refused, with the status message.
    pub fn refused(&self) -> Vec<String> {
        lock(&self.refused).clone()
    }

    /// Streams opened so far.
    pub fn streams(&self) -> u64 {
        self.streams.load(Ordering::Relaxed)
    }

    fn check<T>(&self, request: &Request<T>) -> Result<u64, Status> {
        let header = |name: &str| {
            request
                .metadata()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let refusal = if header("authorization") != format!("Bearer {}", self.token) {
            Some(format!(
                "authenticate failure: token {:?} not accepted",
                header("authorization")
            ))
        } else if header("clusterid") != self.cluster_id {
            Some(format!("clusterid {:?} not accepted", header("clusterid")))
        } else {
            None
        };
        if let Some(message) = refusal {
            lock(&self.refused).push(message.clone());
            return Err(Status::unauthenticated(message));
        }
        Ok(self.streams.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// A new nonce, the response it names recorded.
    fn sent(&self, stream: u64, type_url: &str, version: &str, names: Vec<String>) -> String {
        let nonce = (self.nonces.fetch_add(1, Ordering::Relaxed) + 1).to_string();
        lock(&self.responses).push(AdsResponse {
            stream,
            type_url: type_url.into(),
            version: version.into(),
            nonce: nonce.clone(),
            names,
        });
        nonce
    }

    fn record(&self, request: AdsRequest) {
        lock(&self.requests).push(request);
    }

    /// What is served of `type_url`; `None` until the test has given any.
    fn type_set(&self, type_url: &str) -> Option<TypeSet> {
        lock(&self.world).get(type_url).cloned()
    }
}

/// CDS and LDS are subscribed to as a whole (wildcard), EDS and RDS by name.
fn wildcard(type_url: &str) -> bool {
    type_url == type_url::CLUSTER
        || type_url == type_url::LISTENER
        || type_url == type_url::NAME_TABLE
}

/// What one delta stream has subscribed to and been sent, per type.
#[derive(Default)]
struct DeltaSub {
    names: BTreeSet<String>,
    /// Name → version sent (or held by the client when it reconnected).
    sent: BTreeMap<String, String>,
    answered: bool,
}

/// What one state-of-the-world stream has subscribed to, per type.
#[derive(Default)]
struct SotwSub {
    names: Vec<String>,
    /// The version of the last response (`None` before one).
    sent: Option<String>,
}

/// Responses queued per stream; the client reads them as fast as it can.
const QUEUE: usize = 64;

impl Ads {
    fn delta_response(
        &self,
        stream: u64,
        type_url: &str,
        sub: &mut DeltaSub,
    ) -> Option<DeltaDiscoveryResponse> {
        // Nothing is answered for a type the test has not given yet: the client waits, as a
        // sidecar waits for an istiod that is still computing its config.
        let set = self.type_set(type_url)?;
        let wanted = |name: &str| wildcard(type_url) || sub.names.contains(name);
        let mut resources = Vec::new();
        for (name, (version, body)) in &set.resources {
            if wanted(name) && sub.sent.get(name) != Some(version) {
                sub.sent.insert(name.clone(), version.clone());
                resources.push(DeltaResource {
                    name: name.clone(),
                    version: version.clone(),
                    resource: Some(Any {
                        type_url: type_url.into(),
                        value: body.clone(),
                    }),
                    ..Default::default()
                });
            }
        }
        let removed: Vec<String> = sub
            .sent
            .keys()
            .filter(|name| !set.resources.contains_key(*name))
            .cloned()
            .collect();
        for name in &removed {
            sub.sent.remove(name);
        }
        // The first answer on a stream goes out even when empty: the client's start-up waits
        // for it, as Envoy's does for istiod's.
        if resources.is_empty() && removed.is_empty() && sub.answered {
            return None;
        }
        sub.answered = true;
        let names = resources.iter().map(|r| r.name.clone()).collect();
        let nonce = self.sent(stream, type_url, &set.version, names);
        Some(DeltaDiscoveryResponse {
            system_version_info: set.version,
            resources,
            type_url: type_url.into(),
            removed_resources: removed,
            nonce,
            ..Default::default()
        })
    }

    fn sotw_response(
        &self,
        stream: u64,
        type_url: &str,
        sub: &mut SotwSub,
    ) -> Option<DiscoveryResponse> {
        let set = self.type_set(type_url)?;
        let chosen: Vec<(&String, &Vec<u8>)> = set
            .resources
            .iter()
            .filter(|(name, _)| wildcard(type_url) || sub.names.contains(name))
            .map(|(name, (_, body))| (name, body))
            .collect();
        let names = chosen.iter().map(|(n, _)| (*n).clone()).collect();
        let resources = chosen
            .iter()
            .map(|(_, body)| Any {
                type_url: type_url.into(),
                value: (*body).clone(),
            })
            .collect();
        sub.sent = Some(set.version.clone());
        let nonce = self.sent(stream, type_url, &set.version, names);
        Some(DiscoveryResponse {
            version_info: set.version,
            resources,
            type_url: type_url.into(),
            nonce,
            ..Default::default()
        })
    }

    async fn serve_delta(
        self: Arc<Self>,
        stream: u64,
        mut requests: Streaming<DeltaDiscoveryRequest>,
        tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    ) {
        let mut subs: BTreeMap<String, DeltaSub> = BTreeMap::new();
        let mut pushes = self.pushes.subscribe();
        let mut node_id = String::new();
        loop {
            let request = tokio::select! {
                r = requests.message() => match r {
                    Ok(Some(r)) => r,
                    _ => return,
                },
                changed = pushes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    for (type_url, sub) in subs.iter_mut() {
                        if let Some(r) = self.delta_response(stream, type_url, sub) {
                            if tx.send(Ok(r)).await.is_err() {
                                return;
                            }
                        }
                    }
                    continue;
                }
            };
            if let Some(node) = &request.node {
                node_id = node.id.clone();
            }
            self.record(AdsRequest {
                stream,
                delta: true,
                node_id: node_id.clone(),
                type_url: request.type_url.clone(),
                version_info: String::new(),
                response_nonce: request.response_nonce.clone(),
                error_detail: request.error_detail.as_ref().map(|s| s.message.clone()),
                resource_names: request.resource_names_subscribe.clone(),
                initial_resource_versions: request
                    .initial_resource_versions
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            });
            let new_type = !subs.contains_key(&request.type_url);
            let changes = !request.resource_names_subscribe.is_empty()
                || !request.resource_names_unsubscribe.is_empty();
            if !new_type && !changes {
                continue;
            }
            let sub = subs.entry(request.type_url.clone()).or_default();
            sub.sent.extend(
                request
                    .initial_resource_versions
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
            sub.names
                .extend(request.resource_names_subscribe.iter().cloned());
            for name in &request.resource_names_unsubscribe {
                sub.names.remove(name);
                sub.sent.remove(name);
            }
            if let Some(r) = self.delta_response(stream, &request.type_url, sub) {
                if tx.send(Ok(r)).await.is_err() {
                    return;
                }
            }
        }
    }

    async fn serve_sotw(
        self: Arc<Self>,
        stream: u64,
        mut requests: Streaming<DiscoveryRequest>,
        tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    ) {
        let mut subs: BTreeMap<String, SotwSub> = BTreeMap::new();
        let mut pushes = self.pushes.subscribe();
        let mut node_id = String::new();
        loop {
            let request = tokio::select! {
                r = requests.message() => match r {
                    Ok(Some(r)) => r,
                    _ => return,
                },
                changed = pushes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    for (type_url, sub) in subs.iter_mut() {
                        let version = self.type_set(type_url).map(|s| s.version);
                        if version.is_none() || sub.sent == version {
                            continue;
                        }
                        let Some(r) = self.sotw_response(stream, type_url, sub) else { continue };
                        if tx.send(Ok(r)).await.is_err() {
                            return;
                        }
                    }
                    continue;
                }
            };
            if let Some(node) = &request.node {
                node_id = node.id.clone();
            }
            self.record(AdsRequest {
                stream,
                delta: false,
                node_id: node_id.clone(),
                type_url: request.type_url.clone(),
                version_info: request.version_info.clone(),
                response_nonce: request.response_nonce.clone(),
                error_detail: request.error_detail.as_ref().map(|s| s.message.clone()),
                resource_names: request.resource_names.clone(),
                initial_resource_versions: BTreeMap::new(),
            });
            let sub = subs.entry(request.type_url.clone()).or_default();
            // A new subscription, or changed names, gets an answer; an ACK or NACK does not.
            if sub.sent.is_some() && sub.names == request.resource_names {
                continue;
            }
            sub.names = request.resource_names.clone();
            let Some(r) = self.sotw_response(stream, &request.type_url, sub) else {
                continue;
            };
            if tx.send(Ok(r)).await.is_err() {
                return;
            }
        }
    }
}

/// The generated server's view of the service.
#[derive(Debug, Clone)]
pub(super) struct AdsService(pub Arc<Ads>);

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsService {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let stream = self.0.check(&request)?;
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(Arc::clone(&self.0).serve_sotw(stream, request.into_inner(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let stream = self.0.check(&request)?;
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(Arc::clone(&self.0).serve_delta(stream, request.into_inner(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
