//! State of the world (`StreamAggregatedResources`), as Envoy's `GrpcMuxImpl` speaks it.
//!
//! - Every request of a type carries its whole interest: no names for CDS and LDS (wildcard),
//!   the wanted names for EDS and RDS, with the last accepted `version_info` and the last nonce
//!   received on this stream. A new stream sends each started type its last accepted version
//!   and no nonce (nonces belong to the stream that issued them). The node goes in the stream's
//!   first request only.
//! - ACK: `version_info` of the response and its nonce. NACK: `version_info` of the last
//!   accepted response, the rejected response's nonce, and `error_detail`. Resources of a
//!   partly refused response that the sink accepted stay applied (Envoy's CDS and LDS do the
//!   same), but the version does not advance.
//! - A resource whose `Any` is of another type, or whose body does not decode, refuses the
//!   whole response, as in Envoy: the response is the complete set, and applying the rest of it
//!   would remove the resource we could not read.
//! - Two clusters (listeners) of one name: the first is applied, the second refused with
//!   Envoy's `duplicate cluster <name> found`; of two route tables or endpoint sets the first
//!   is taken, as Envoy's watches take it.
//! - `Any`s wrapping an `envoy.service.discovery.v3.Resource` (TTL-capable servers) are
//!   unwrapped.
//! - The wording of every NACK here was compared with Envoy 1.40's on the wire
//!   (`tests/ads_envoy.rs`).

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DiscoveryRequest, DiscoveryResponse, Resource as ResourceWrapper,
};
use envoy_types::pb::google::protobuf::Any;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::{Body, Bytes, StdError};
use tracing::{debug, warn};

use super::protocol::{record_ack, record_nack, Pending, Protocol, Received};
use super::state::{Subscriptions, TypeState};
use super::stats::Stats;
use super::update::{error_detail, rejection_message, resource_name, sotw_type_mismatch};
use std::collections::HashSet;

use crate::sink::{type_url, Applied, Rejection, Resource, Update};

/// What Envoy calls a resource of the type when it finds its name twice.
fn duplicate_kind(type_url: &str) -> Option<&'static str> {
    match type_url {
        type_url::CLUSTER => Some("cluster"),
        type_url::LISTENER => Some("listener"),
        _ => None,
    }
}

const RESOURCE_WRAPPER: &str = "type.googleapis.com/envoy.service.discovery.v3.Resource";

/// State-of-the-world mode's per-stream state.
pub(crate) struct Sotw {
    node: Node,
    first: bool,
}

impl Sotw {
    pub fn new(node: Node) -> Self {
        Self { node, first: true }
    }

    /// The type's request as it stands: interest, last accepted version, last nonce.
    fn request(&mut self, state: &mut TypeState) -> DiscoveryRequest {
        state.on_stream = true;
        DiscoveryRequest {
            version_info: state.accepted_version.clone(),
            node: std::mem::take(&mut self.first).then(|| self.node.clone()),
            resource_names: if state.wildcard {
                Vec::new()
            } else {
                state.wanted.iter().cloned().collect()
            },
            type_url: state.type_url.to_owned(),
            response_nonce: state.nonce.clone(),
            ..DiscoveryRequest::default()
        }
    }
}

/// One resource's name and body, or why the response cannot be read.
fn read_resource(type_url: &str, index: usize, any: Any) -> Result<(String, Vec<u8>), String> {
    let (inner_type, body, wrapped_name) = if any.type_url == RESOURCE_WRAPPER {
        let wrapper = <ResourceWrapper as prost::Message>::decode(any.value.as_slice())
            .map_err(|e| format!("{type_url}: resource [{index}] cannot be decoded: {e}"))?;
        let inner = wrapper.resource.unwrap_or_default();
        (inner.type_url, inner.value, Some(wrapper.name))
    } else {
        (any.type_url, any.value, None)
    };
    if inner_type != type_url {
        return Err(sotw_type_mismatch(&inner_type, type_url));
    }
    let name = resource_name(type_url, &body)
        .map_err(|e| format!("{type_url}: resource [{index}] cannot be decoded: {e}"))?;
    Ok((wrapped_name.filter(|n| !n.is_empty()).unwrap_or(name), body))
}

impl Protocol for Sotw {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;
    const QUEUES_ANSWERS: bool = false;

    async fn open<T>(
        mut client: AggregatedDiscoveryServiceClient<T>,
        request: tonic::Request<ReceiverStream<Self::Request>>,
    ) -> Result<tonic::Response<tonic::Streaming<Self::Response>>, tonic::Status>
    where
        T: tonic::client::GrpcService<tonic::body::Body> + Send + 'static,
        T::Error: Into<StdError>,
        T::Future: Send,
        T::ResponseBody: Body<Data = Bytes> + Send + 'static,
        <T::ResponseBody as Body>::Error: Into<StdError> + Send,
    {
        client.stream_aggregated_resources(request).await
    }

    fn initial_requests(&mut self, subs: &mut Subscriptions) -> Vec<Self::Request> {
        self.first = true;
        let mut requests = Vec::new();
        // Every started type, even an EDS or RDS interest that has shrunk to nothing: Envoy
        // resends each subscription's request on a new stream (seen from Envoy 1.40).
        for state in subs.started_mut() {
            requests.push(self.request(state));
        }
        requests
    }

    fn subscription_request(
        &mut self,
        subs: &mut Subscriptions,
        stats: &Stats,
        type_url: &str,
    ) -> Option<Self::Request> {
        let state = subs.get_mut(type_url).filter(|s| s.started)?;
        stats.attempt(type_url);
        let request = self.request(state);
        debug!(type_url, names = ?request.resource_names, "sotw subscription");
        Some(request)
    }

    fn control_plane(response: &Self::Response) -> Option<&str> {
        response
            .control_plane
            .as_ref()
            .map(|c| c.identifier.as_str())
    }

    fn receive(
        &mut self,
        subs: &mut Subscriptions,
        stats: &Stats,
        response: Self::Response,
    ) -> Received<Self::Request> {
        let Some(state) = subs.get_mut(&response.type_url).filter(|s| s.on_stream) else {
            warn!(
                type_url = response.type_url,
                "ignoring a response for a type not subscribed"
            );
            return Received::Ignore;
        };
        state.nonce.clone_from(&response.nonce);
        let mut resources = Vec::with_capacity(response.resources.len());
        let mut seen = HashSet::new();
        let mut refused = Vec::new();
        for (index, any) in response.resources.into_iter().enumerate() {
            match read_resource(state.type_url, index, any) {
                // Envoy's CDS and LDS apply the first of two resources of one name and refuse
                // the second; its EDS and RDS take the first.
                Ok((name, _)) if seen.contains(&name) => {
                    if let Some(kind) = duplicate_kind(state.type_url) {
                        refused.push(Rejection {
                            reason: format!("duplicate {kind} {name} found"),
                            name,
                        });
                    }
                }
                Ok((name, body)) if state.wants(&name) => {
                    seen.insert(name.clone());
                    resources.push(Resource {
                        name,
                        version: response.version_info.clone(),
                        body,
                    });
                }
                Ok((name, _)) => {
                    debug!(
                        type_url = state.type_url,
                        name, "skipping a resource not subscribed"
                    );
                }
                Err(fault) => {
                    record_nack(
                        stats,
                        state.type_url,
                        &response.version_info,
                        &response.nonce,
                        &fault,
                    );
                    let mut request = self.request(state);
                    request.error_detail = Some(error_detail(&fault));
                    return Received::Refused(state.type_url, request);
                }
            }
        }
        let update = Update {
            resources,
            removed: Vec::new(),
            complete: true,
        };
        let mut pending = Pending::new(
            state.type_url,
            update,
            response.nonce,
            response.version_info,
        );
        pending.refused = refused;
        Received::Apply(Box::new(pending))
    }

    fn finish(
        &mut self,
        subs: &mut Subscriptions,
        stats: &Stats,
        pending: Pending,
        applied: &Applied,
    ) -> Self::Request {
        let Some(state) = subs.get_mut(pending.type_url) else {
            // receive() only builds a Pending for a known type.
            return DiscoveryRequest::default();
        };
        let mut rejected = pending.refused;
        rejected.extend(applied.rejected.iter().cloned());
        if rejected.is_empty() {
            state.accepted_version.clone_from(&pending.version);
            record_ack(
                stats,
                pending.type_url,
                &pending.version,
                pending.versions.len(),
            );
            self.request(state)
        } else {
            let message = rejection_message(pending.type_url, &rejected);
            record_nack(
                stats,
                pending.type_url,
                &pending.version,
                &pending.nonce,
                &message,
            );
            let mut request = self.request(state);
            request.error_detail = Some(error_detail(&message));
            request
        }
    }
}
