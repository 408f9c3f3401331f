//! The seam between the stream loop (in `mod.rs`) and the two wire formats (`delta`, `sotw`):
//! what a mode must do with requests and responses, and what a checked response carries to the
//! sink and back into its answer.

use std::collections::BTreeSet;
use std::future::Future;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::{Body, Bytes, StdError};
use tracing::{debug, warn};

use super::state::Subscriptions;
use super::stats::{Stats, UpdateError};
use crate::sink::{Applied, Rejection, Resource, Update};

/// A response's resources, checked and ready for the sink, with what the answer needs.
#[derive(Debug)]
pub(crate) struct Pending {
    pub type_url: &'static str,
    /// Taken by the sink; [`Pending::versions`] keeps what the answer needs of it.
    pub update: Update,
    /// The name and version of each resource in `update`.
    pub versions: Vec<(String, String)>,
    /// The names `update` removes.
    pub removed: Vec<String>,
    /// Resources the client itself refused (a body that does not decode), not given to the sink.
    pub refused: Vec<Rejection>,
    /// The response's nonce and version (`version_info` or `system_version_info`).
    pub nonce: String,
    pub version: String,
    /// Every name the response answered (added, changed or removed), for start-up ordering.
    pub delivered: BTreeSet<String>,
}

impl Pending {
    pub fn new(type_url: &'static str, update: Update, nonce: String, version: String) -> Self {
        let versions = update
            .resources
            .iter()
            .map(|r: &Resource| (r.name.clone(), r.version.clone()))
            .collect();
        let delivered = update
            .resources
            .iter()
            .map(|r| r.name.clone())
            .chain(update.removed.iter().cloned())
            .collect();
        let removed = update.removed.clone();
        Self {
            type_url,
            update,
            versions,
            removed,
            refused: Vec::new(),
            nonce,
            version,
            delivered,
        }
    }
}

/// What to do with a response.
pub(crate) enum Received<R> {
    /// Nothing to send (a type we never subscribed to, in delta, as Envoy drops it).
    Ignore,
    /// A whole response refused: send this NACK at once, without the sink.
    Refused(&'static str, R),
    /// Give the resources to the sink, then answer with [`Protocol::finish`].
    Apply(Box<Pending>),
}

/// The wire format of one mode.
pub(crate) trait Protocol {
    type Request: Send + 'static;
    type Response: Send + 'static;

    /// Whether answers held back while clusters warm are all sent (delta, whose paused ACKs
    /// queue in Envoy) or only the newest (state of the world, where Envoy rebuilds one
    /// request per type).
    const QUEUES_ANSWERS: bool;

    /// Opens the stream.
    fn open<T>(
        client: AggregatedDiscoveryServiceClient<T>,
        request: tonic::Request<ReceiverStream<Self::Request>>,
    ) -> impl Future<Output = Result<tonic::Response<tonic::Streaming<Self::Response>>, tonic::Status>>
           + Send
    where
        T: tonic::client::GrpcService<tonic::body::Body> + Send + 'static,
        T::Error: Into<StdError>,
        T::Future: Send,
        T::ResponseBody: Body<Data = Bytes> + Send + 'static,
        <T::ResponseBody as Body>::Error: Into<StdError> + Send;

    /// The requests that open a stream: every started type, with the versions held. (Not an
    /// `update_attempt`: Envoy counts a reconnect as an `update_failure`, and attempts when a
    /// subscription starts or changes.)
    fn initial_requests(&mut self, subs: &mut Subscriptions) -> Vec<Self::Request>;

    /// The request that tells the server a type's changed interest (or starts it).
    fn subscription_request(
        &mut self,
        subs: &mut Subscriptions,
        stats: &Stats,
        type_url: &str,
    ) -> Option<Self::Request>;

    /// The `control_plane.identifier` a response carries (istiod names its instance there).
    fn control_plane(response: &Self::Response) -> Option<&str>;

    /// Checks a response.
    fn receive(
        &mut self,
        subs: &mut Subscriptions,
        stats: &Stats,
        response: Self::Response,
    ) -> Received<Self::Request>;

    /// The ACK or NACK once the sink has applied what it could.
    fn finish(
        &mut self,
        subs: &mut Subscriptions,
        stats: &Stats,
        pending: Pending,
        applied: &Applied,
    ) -> Self::Request;
}

/// Logs and records a NACK; shared by both modes.
pub(crate) fn record_nack(
    stats: &Stats,
    type_url: &str,
    version: &str,
    nonce: &str,
    message: &str,
) {
    warn!(type_url, version, nonce, "config rejected: {message}");
    stats.rejected(
        type_url,
        UpdateError {
            version: version.to_owned(),
            nonce: nonce.to_owned(),
            message: message.to_owned(),
            at: std::time::SystemTime::now(),
        },
    );
}

/// Logs and records an ACK; shared by both modes.
pub(crate) fn record_ack(stats: &Stats, type_url: &str, version: &str, count: usize) {
    debug!(type_url, version, resources = count, "config accepted");
    stats.success(type_url, version);
}
