//! The aggregated discovery (ADS) client: one gRPC stream to istiod carrying clusters,
//! endpoints, listeners and routes (the secrets istiod serves itself, once a cluster names
//! one; and, for the DNS proxy, istiod's name table), in delta (Istio's agent's default) or state-of-the-world
//! mode. It owns the protocol — subscriptions, versions, nonces, ACK and NACK, reconnects — and
//! hands every response's resources to a [`Sink`], which owns their meaning.
//!
//! ```text
//! run ─┬─ connect (metadata per call) ─ initial requests ─┬─ response ─ Protocol::receive
//!      │                                                  │      └─ Sink::apply (blocking pool)
//!      │                                                  │           └─ new EDS/RDS/LDS interest, then ACK/NACK
//!      └─ stream ends: back-off with jitter, reconnect, resubscribe with the versions held
//! ```
//!
//! The per-mode wire format lives in `delta` and `sotw`; what is remembered across
//! responses and reconnects, and the start-up order, in `state`; NACK wording in `update`;
//! the seam between the loop here and the two modes in `protocol`.
//! The client never clears the sink: on disconnect the last good configuration stays in force.
//!
//! The requests follow Envoy 1.40 on the wire, and `tests/ads_envoy.rs` checks it against a real
//! Envoy given the same responses: order, versions, nonces, interest, `initial_resource_versions`
//! and NACK messages byte for byte. Where Remora knowingly differs:
//! - an EDS or RDS NACK names every refused resource (Envoy, which subscribes each name
//!   separately, reports the first failure only);
//! - a type-mismatch NACK does not echo the whole response as text after Envoy's sentence;
//! - in delta, a body that is not a protobuf message is refused by name by the client while the
//!   rest of the response is applied (Envoy fails the whole response while decoding);
//! - a cluster counts as warming when its endpoint name (or a secret it names) is new to the
//!   EDS (SDS) interest (Envoy also
//!   re-warms a changed cluster, served from its EDS cache);
//! - LDS's wait for the first clusters' endpoints is bounded by `initial_fetch_timeout`
//!   measured from the client's start (Envoy's is per subscription; Istio sets it to 0, no
//!   bound, which is available here too);
//! - a message over `max_message_size` ends the stream (see [`DEFAULT_MAX_MESSAGE_SIZE`]).

mod backoff;
mod delta;
mod node;
mod protocol;
mod resource_stats;
mod sotw;
mod state;
mod stats;
mod update;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::{Body, Bytes, StdError};
use tonic::metadata::MetadataMap;
use tracing::{debug, info, warn};

use crate::sink::{type_url, Applied, Interest, Rejection, Sink, Update};
pub use backoff::{
    Backoff, DEFAULT_BASE as DEFAULT_BACKOFF_BASE, DEFAULT_MAX as DEFAULT_BACKOFF_MAX,
};
pub use node::{json_map_to_struct, sidecar_node_id, NodeInfo, NodeLocality, USER_AGENT_NAME};
pub use resource_stats::{
    body_hash, secret_stat_name, Carried, Refusals, ResourceCounters, ResourceStats,
};
pub use stats::{
    stat_prefix, Stats, StatsSnapshot, TypeSnapshot, TypeStats, TypeStatus, UpdateError,
};
pub use update::NACK_CODE;

use protocol::{Protocol, Received};
use state::Subscriptions;

/// The largest response accepted. istiod sends a type's whole set in one message on a new
/// stream (delta included), and a 10,000-service mesh's clusters run to tens of megabytes;
/// 64 MiB holds that with room, while still refusing a peer that would make us allocate
/// without bound. tonic's default (4 MiB) would cut a large mesh off. A larger message ends the
/// stream: its nonce cannot be read, so there is nothing to NACK; the client reconnects with
/// back-off and the sink keeps the configuration it has.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 64 * 1024 * 1024;

/// Envoy's default `initial_fetch_timeout`: how long LDS waits for the first clusters and their
/// endpoints before starting anyway.
pub const DEFAULT_INITIAL_FETCH_TIMEOUT: Duration = Duration::from_secs(15);

/// Requests queued towards the stream. Each response produces at most a handful (its ACK and
/// the subscriptions it changes), and the loop waits for room, so this bounds memory, not work.
const REQUEST_QUEUE: usize = 16;

/// Which of the two ADS protocols to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Incremental xDS (`DeltaAggregatedResources`), what Istio's agent uses by default.
    #[default]
    Delta,
    /// State of the world (`StreamAggregatedResources`).
    StateOfTheWorld,
}

/// How the client talks; [`AdsConfig::new`] gives Envoy's and Istio's defaults.
#[derive(Debug, Clone)]
pub struct AdsConfig {
    /// Delta or state of the world.
    pub mode: Mode,
    /// Who we are, sent in the first request of every stream.
    pub node: NodeInfo,
    /// See [`DEFAULT_MAX_MESSAGE_SIZE`].
    pub max_message_size: usize,
    /// See [`DEFAULT_INITIAL_FETCH_TIMEOUT`]; zero waits without bound, as Envoy's `0s` does.
    pub initial_fetch_timeout: Duration,
    /// First back-off interval after a stream failure (Envoy: 500 ms).
    pub backoff_base: Duration,
    /// Largest back-off interval (Envoy: 30 s).
    pub backoff_max: Duration,
    /// Also subscribe to istiod's name table (NDS), as pilot-agent does when DNS capture is
    /// on: one wildcard request when LDS starts, ACKed and NACKed like the rest.
    pub name_table: bool,
}

impl AdsConfig {
    /// Envoy's defaults for everything but the node and the mode.
    pub fn new(node: NodeInfo, mode: Mode) -> Self {
        Self {
            mode,
            node,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            initial_fetch_timeout: DEFAULT_INITIAL_FETCH_TIMEOUT,
            backoff_base: backoff::DEFAULT_BASE,
            backoff_max: backoff::DEFAULT_MAX,
            name_table: false,
        }
    }
}

/// A failure to read the headers for a new stream (a token file that cannot be read).
#[derive(Debug, thiserror::Error)]
#[error("call metadata: {0}")]
pub struct MetadataError(pub Box<dyn std::error::Error + Send + Sync>);

impl MetadataError {
    /// Wraps any error (or a message).
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self(error.into())
    }
}

/// The headers each new stream carries: istiod wants `authorization: Bearer <token>` (the token
/// re-read, since kubelet rotates it) and `clusterid`. The module that owns the token
/// implements this; a closure returning the map does too. It is called once per stream, so a
/// rotated token is picked up at the next reconnect, as pilot-agent's forwarding does; a
/// failure counts as a failed connection attempt (logged, counted, retried with back-off).
///
/// ```
/// use remora_xds::ads::MetadataError;
/// use tonic::metadata::MetadataMap;
///
/// let token_path = "/var/run/secrets/tokens/istio-token";
/// let metadata = move || -> Result<MetadataMap, MetadataError> {
///     let token = std::fs::read_to_string(token_path)
///         .map_err(|e| MetadataError::new(format!("{token_path}: {e}")))?;
///     let mut map = MetadataMap::new();
///     let bearer = format!("Bearer {}", token.trim()).parse().map_err(MetadataError::new)?;
///     map.insert("authorization", bearer);
///     map.insert("clusterid", "Kubernetes".parse().map_err(MetadataError::new)?);
///     Ok(map)
/// };
/// # let _ = metadata;
/// ```
pub trait CallMetadata: Send + Sync + 'static {
    /// The headers for the stream about to open.
    fn call_metadata(&self) -> Result<MetadataMap, MetadataError>;
}

impl<F> CallMetadata for F
where
    F: Fn() -> Result<MetadataMap, MetadataError> + Send + Sync + 'static,
{
    fn call_metadata(&self) -> Result<MetadataMap, MetadataError> {
        self()
    }
}

/// No headers (plaintext tests, a control plane without authentication).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoMetadata;

impl CallMetadata for NoMetadata {
    fn call_metadata(&self) -> Result<MetadataMap, MetadataError> {
        Ok(MetadataMap::new())
    }
}

/// Why a stream ended; each ends in a back-off and a reconnect.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The call metadata could not be read.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// The call failed before the stream opened (connection refused, TLS, status).
    #[error("opening the ADS stream: {0}")]
    Open(tonic::Status),
    /// The open stream failed (reset, a message too large or malformed, a status).
    #[error("ADS stream failed: {0}")]
    Receive(tonic::Status),
    /// The control plane ended the stream.
    #[error("the control plane closed the ADS stream")]
    Closed,
    /// The transport stopped taking our requests.
    #[error("the ADS request stream closed")]
    RequestsClosed,
}

/// The ADS client. Construct it with [`AdsClient::new`], keep [`AdsClient::stats`], and drive
/// it with [`AdsClient::run`] on its own task.
pub struct AdsClient<T> {
    service: T,
    metadata: Arc<dyn CallMetadata>,
    config: AdsConfig,
    sink: Arc<dyn Sink>,
    stats: Arc<Stats>,
}

impl<T> AdsClient<T>
where
    T: tonic::client::GrpcService<tonic::body::Body> + Clone + Send + 'static,
    T::Error: Into<StdError>,
    T::Future: Send,
    T::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<StdError> + Send,
{
    /// `service` is the gRPC channel to istiod (a tonic `Channel`, already carrying TLS);
    /// `metadata` gives each new stream its headers.
    pub fn new(
        service: T,
        metadata: impl CallMetadata,
        config: AdsConfig,
        sink: Arc<dyn Sink>,
    ) -> Self {
        Self {
            service,
            metadata: Arc::new(metadata),
            config,
            sink,
            stats: Arc::new(Stats::default()),
        }
    }

    /// The statistics, shared: read them while the client runs.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// Keeps a stream to the control plane until `shutdown` completes: reconnecting with
    /// back-off after every failure, resubscribing with the versions held.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut subs = Subscriptions::new(self.config.name_table);
        // CDS's subscription starts here (EDS, LDS and RDS count theirs when they start).
        self.stats.attempt(type_url::CLUSTER);
        let mut backoff = Backoff::new(self.config.backoff_base, self.config.backoff_max);
        let init_deadline = (!self.config.initial_fetch_timeout.is_zero())
            .then(|| Instant::now() + self.config.initial_fetch_timeout);
        let node = self.config.node.to_node();
        let mut delta = delta::Delta::new(node.clone());
        let mut sotw = sotw::Sotw::new(node);
        let mut interest = self.sink.interest();
        loop {
            subs.stream_reset();
            let result = tokio::select! {
                () = &mut shutdown => return,
                result = async {
                    match self.config.mode {
                        Mode::Delta => {
                            self.serve_stream(&mut delta, &mut subs, &mut backoff, init_deadline, &mut interest)
                                .await
                        }
                        Mode::StateOfTheWorld => {
                            self.serve_stream(&mut sotw, &mut subs, &mut backoff, init_deadline, &mut interest)
                                .await
                        }
                    }
                } => result,
            };
            self.stats.set_connected(false);
            for t in subs.started() {
                self.stats.failure(t.type_url);
            }
            for (_, stats) in self.stats.all_per_resource() {
                stats.stream_failed();
            }
            let delay = backoff.next_delay();
            match &result {
                StreamError::Closed => info!(retry_in = ?delay, "{result}"),
                _ => warn!(retry_in = ?delay, "{result}"),
            }
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// One stream, from its opening requests until it fails.
    async fn serve_stream<P: Protocol>(
        &self,
        proto: &mut P,
        subs: &mut Subscriptions,
        backoff: &mut Backoff,
        init_deadline: Option<Instant>,
        interest: &mut Option<watch::Receiver<Interest>>,
    ) -> StreamError {
        let metadata = match self.metadata.call_metadata() {
            Ok(m) => m,
            Err(e) => return e.into(),
        };
        let (tx, rx) = mpsc::channel(REQUEST_QUEUE);
        // The opening requests are queued before the call: a control plane may hold its
        // response headers until it has read a request.
        for request in proto.initial_requests(subs) {
            if tx.send(request).await.is_err() {
                return StreamError::RequestsClosed;
            }
        }
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        *request.metadata_mut() = metadata;
        let client = AggregatedDiscoveryServiceClient::new(self.service.clone())
            .max_decoding_message_size(self.config.max_message_size);
        let mut inbound = match P::open(client, request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return StreamError::Open(status),
        };
        self.stats.set_connected(true);
        info!(mode = ?self.config.mode, "ADS stream open");
        // CDS answers held while the clusters they added warm; they belong to this stream.
        let mut held: Option<HeldAnswers<P::Request>> = None;
        loop {
            let gate_deadline = init_deadline.filter(|_| subs.awaiting_init());
            let held_deadline = held.as_ref().and_then(|h| h.deadline);
            let message = tokio::select! {
                message = inbound.message() => message,
                () = sleep_until(gate_deadline) => {
                    warn!("clusters and endpoints not all received within the initial fetch timeout; requesting listeners");
                    for started in subs.open_gate() {
                        let Some(request) = proto.subscription_request(subs, &self.stats, started) else {
                            continue;
                        };
                        if tx.send(request).await.is_err() {
                            return StreamError::RequestsClosed;
                        }
                    }
                    continue;
                }
                () = sleep_until(held_deadline) => {
                    warn!("new clusters did not all receive endpoints within the initial fetch timeout; answering CDS");
                    for request in held.take().map(|h| h.requests).unwrap_or_default() {
                        if tx.send(request).await.is_err() {
                            return StreamError::RequestsClosed;
                        }
                    }
                    continue;
                }
                wanted = interest_changed(interest.as_mut()) => {
                    // Interest changed with no response (a warming timeout): subscribe now,
                    // as Envoy's cluster starts its SDS subscription when it initialises.
                    let applied = Applied { rejected: Vec::new(), wanted };
                    let before = self.subscribed(subs);
                    let changed = subs.after_response("", &applied, &BTreeSet::new());
                    self.resubscribed(subs, before);
                    for changed in changed {
                        let Some(request) = proto.subscription_request(subs, &self.stats, changed) else {
                            continue;
                        };
                        if tx.send(request).await.is_err() {
                            return StreamError::RequestsClosed;
                        }
                    }
                    continue;
                }
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) => return StreamError::Closed,
                Err(status) => return StreamError::Receive(status),
            };
            // A message means the control plane is healthy: the next failure starts the
            // back-off from its base again, as Envoy does.
            backoff.reset();
            self.stats.set_connected(true);
            if let Some(identifier) = P::control_plane(&response) {
                self.stats.set_identifier(identifier);
            }
            for request in self.handle(proto, subs, &mut held, response).await {
                if tx.send(request).await.is_err() {
                    return StreamError::RequestsClosed;
                }
            }
        }
    }

    /// One response: checked, applied, answered, and preceded by the subscriptions it changes.
    ///
    /// The interest a response changes goes out before its ACK or NACK, as Envoy sends it:
    /// Envoy pauses EDS (RDS) while it applies CDS (LDS) and resumes when the update is
    /// applied, which is before the answer is queued. Likewise LDS starts before the ACK of
    /// the EDS response that completes start-up.
    ///
    /// After start-up, Envoy holds a CDS answer while the clusters it added warm (until their
    /// endpoints arrive, or the initial fetch timeout), so that istiod does not see the ACK of
    /// clusters that cannot take traffic yet; the held answer goes out just before the ACK of
    /// the EDS response that completes the warming. We do the same, counting a cluster as
    /// warming when its endpoint name is new to the EDS interest. Answers to CDS pushes that
    /// arrive meanwhile wait too: in delta all of them, in order; in state of the world only
    /// the newest (Envoy 1.40 does exactly this, seen by the differential test).
    async fn handle<P: Protocol>(
        &self,
        proto: &mut P,
        subs: &mut Subscriptions,
        held: &mut Option<HeldAnswers<P::Request>>,
        response: P::Response,
    ) -> Vec<P::Request> {
        let initialised = !subs.awaiting_init();
        let mut pending = match proto.receive(subs, &self.stats, response) {
            Received::Ignore => return Vec::new(),
            Received::Refused(type_url, nack) => {
                if let Some(stats) = self.stats.per_resource(type_url) {
                    stats.answered([], "", true, &BTreeSet::new(), &BTreeSet::new());
                }
                let mut requests: Vec<_> = subs
                    .after_refusal(type_url)
                    .into_iter()
                    .filter_map(|changed| proto.subscription_request(subs, &self.stats, changed))
                    .collect();
                match (type_url, held.as_mut()) {
                    // A refused EDS (SDS) response ends the warming of every cluster waiting
                    // on it.
                    (type_url::ENDPOINT | type_url::SECRET, Some(_)) => {
                        requests.extend(held.take().map(|h| h.requests).unwrap_or_default());
                        requests.push(nack);
                    }
                    // CDS answers wait while clusters warm, NACKs too (Envoy's CDS is paused).
                    (type_url::CLUSTER, Some(answers)) => answers.hold(nack, P::QUEUES_ANSWERS),
                    _ => requests.push(nack),
                }
                return requests;
            }
            Received::Apply(pending) => pending,
        };
        let type_url = pending.type_url;
        let delivered = pending.delivered.clone();
        // What the response carried of each resource counted per resource: its body, to tell
        // a change from the same resource sent again, or its removal.
        let carried: Vec<(String, Option<u64>)> = match self.stats.per_resource(type_url) {
            None => Vec::new(),
            Some(_) => (pending.update.resources.iter())
                .map(|r| (r.name.clone(), Some(body_hash(&r.body))))
                .chain(pending.update.removed.iter().map(|n| (n.clone(), None)))
                .collect(),
        };
        // Only a CDS push after start-up can start clusters warming; only then is the EDS
        // interest before it worth copying.
        let holds = type_url == type_url::CLUSTER && initialised;
        // Endpoints arriving may make a warming cluster ask for its secrets: the held CDS
        // answer then waits for those too.
        let secrets_before = match (type_url, held.is_some()) {
            (type_url::ENDPOINT, true) => Some(subs.wanted(type_url::SECRET)),
            _ => None,
        };
        let warm_before = match holds {
            true => warming_interest(subs),
            false => BTreeSet::new(),
        };
        let applied = self
            .apply(type_url, std::mem::take(&mut pending.update))
            .await;
        let subscribed = self.subscribed(subs);
        let changed = subs.after_response(type_url, &applied, &delivered);
        self.resubscribed(subs, subscribed);
        if let Some(stats) = self.stats.per_resource(type_url) {
            // The answer below NACKs the whole response if any of it was refused. A body that
            // did not decode is refused as Envoy refuses it while decoding, except for secrets
            // (a key that does not parse Envoy finds in the secret's update). Envoy's delta
            // mux counts the update it began of a resource it refuses; its state-of-the-world
            // mux does not (Envoy 1.40, seen by `istiod_subscription_stats`).
            let nacked = !applied.rejected.is_empty() || !pending.refused.is_empty();
            let refused: BTreeSet<&String> = (applied.rejected.iter())
                .chain(&pending.refused)
                .map(|r| &r.name)
                .collect();
            let undecoded = (type_url == type_url::SECRET).then_some(&pending.refused);
            let begun: BTreeSet<&String> = match self.config.mode {
                Mode::Delta => (applied.rejected.iter())
                    .chain(undecoded.into_iter().flatten())
                    .map(|r| &r.name)
                    .collect(),
                Mode::StateOfTheWorld => BTreeSet::new(),
            };
            let carried = carried.iter().map(|(name, body)| (name, *body));
            stats.answered(carried, &pending.version, nacked, &refused, &begun);
        }
        let mut requests: Vec<_> = changed
            .into_iter()
            .filter_map(|changed| proto.subscription_request(subs, &self.stats, changed))
            .collect();
        if type_url == type_url::ENDPOINT || type_url == type_url::SECRET {
            if let Some(mut answers) = held.take() {
                if let Some(before) = secrets_before {
                    let now = subs.wanted(type_url::SECRET);
                    answers.awaiting.extend(
                        now.difference(&before)
                            .map(|name| (type_url::SECRET, name.clone())),
                    );
                }
                answers
                    .awaiting
                    .retain(|(t, name)| *t != type_url || !delivered.contains(name));
                match answers.awaiting.is_empty() {
                    true => requests.extend(answers.requests),
                    false => *held = Some(answers),
                }
            }
        }
        let answer = proto.finish(subs, &self.stats, *pending, &applied);
        if !holds {
            requests.push(answer);
            return requests;
        }
        let interest = warming_interest(subs);
        let warming: Vec<_> = interest.difference(&warm_before).cloned().collect();
        let mut answers = held.take().unwrap_or_default();
        if !warming.is_empty() {
            let timeout = self.config.initial_fetch_timeout;
            answers.deadline = (!timeout.is_zero()).then(|| Instant::now() + timeout);
            answers.awaiting.extend(warming);
        }
        // Clusters removed before they warmed hold nothing back.
        answers.awaiting.retain(|key| interest.contains(key));
        answers.hold(answer, P::QUEUES_ANSWERS);
        if answers.awaiting.is_empty() {
            requests.extend(answers.requests);
        } else {
            debug!(
                warming = answers.awaiting.len(),
                "holding the CDS answer while new clusters warm"
            );
            *held = Some(answers);
        }
        requests
    }

    /// The names subscribed now of each type counted per resource.
    fn subscribed(&self, subs: &Subscriptions) -> [BTreeSet<String>; 3] {
        self.stats
            .all_per_resource()
            .map(|(type_url, _)| subs.wanted(type_url))
    }

    /// The subscriptions changed from `before`: each type counted per resource counts its
    /// names started (and forgets those no longer wanted).
    fn resubscribed(&self, subs: &Subscriptions, before: [BTreeSet<String>; 3]) {
        for ((type_url, stats), before) in self.stats.all_per_resource().into_iter().zip(before) {
            stats.resubscribed(&before, &subs.wanted(type_url));
        }
    }

    /// Runs the sink on the blocking pool: converting a large push takes long enough that it
    /// must not hold a runtime worker the data path shares.
    async fn apply(&self, type_url: &'static str, update: Update) -> Applied {
        if update.resources.is_empty() && update.removed.is_empty() && !update.complete {
            return Applied::default();
        }
        let names: Vec<String> = update.resources.iter().map(|r| r.name.clone()).collect();
        let sink = Arc::clone(&self.sink);
        match tokio::task::spawn_blocking(move || sink.apply(type_url, update)).await {
            Ok(applied) => applied,
            Err(e) => {
                // The sink panicked: nothing can be known to be applied, so all is refused and
                // the previous configuration (what the sink holds) stays in force.
                warn!(type_url, "the sink failed applying an update: {e}");
                Applied {
                    rejected: names
                        .into_iter()
                        .map(|name| Rejection {
                            name,
                            reason: "internal error while applying the update".to_owned(),
                        })
                        .collect(),
                    wanted: Default::default(),
                }
            }
        }
    }
}

/// What a cluster warms on: its endpoint set and the secrets its sockets name, by type and
/// name (Envoy's cluster initialises once both have arrived).
fn warming_interest(subs: &Subscriptions) -> BTreeSet<(&'static str, String)> {
    [type_url::ENDPOINT, type_url::SECRET]
        .into_iter()
        .flat_map(|t| subs.wanted(t).into_iter().map(move |name| (t, name)))
        .collect()
}

/// CDS ACKs or NACKs waiting for the endpoints and secrets of the clusters they added.
struct HeldAnswers<R> {
    requests: Vec<R>,
    awaiting: BTreeSet<(&'static str, String)>,
    deadline: Option<Instant>,
}

impl<R> Default for HeldAnswers<R> {
    fn default() -> Self {
        Self {
            requests: Vec::new(),
            awaiting: BTreeSet::new(),
            deadline: None,
        }
    }
}

impl<R> HeldAnswers<R> {
    /// Queues `answer` after the others, or in place of them. The queue is bounded: the
    /// control plane decides how often it pushes, and only the newest answers matter (each
    /// acknowledges its own nonce), so the oldest give way.
    fn hold(&mut self, answer: R, queue: bool) {
        if !queue {
            self.requests.clear();
        }
        if self.requests.len() >= REQUEST_QUEUE {
            self.requests.remove(0);
        }
        self.requests.push(answer);
    }
}

/// The sink's interest once it changes; never, without a watch or once the sink dropped it.
async fn interest_changed(interest: Option<&mut watch::Receiver<Interest>>) -> Interest {
    if let Some(rx) = interest {
        if rx.changed().await.is_ok() {
            return rx.borrow_and_update().clone();
        }
    }
    std::future::pending().await
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
