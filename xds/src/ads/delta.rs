//! Incremental xDS (`DeltaAggregatedResources`), as Envoy speaks it.
//!
//! - A new stream sends, per started type: for CDS and LDS, an empty subscribe list (Envoy's
//!   "legacy wildcard") and `initial_resource_versions` with every resource held; for EDS and
//!   RDS, the wanted names and the versions held of them. The node goes in the stream's first
//!   request only (Istio's bootstrap sets `set_node_on_first_message_only`).
//! - ACK: `response_nonce`. NACK: `response_nonce` and `error_detail`; the resources of the
//!   response that were not refused are applied all the same. As in Envoy, the versions of a
//!   NACKed response are not recorded: after a reconnect the older versions are reported and
//!   the server resends what changed.
//! - Whole-response faults, with Envoy's words: a name twice among the added resources or in
//!   both added and removed, and an `Any` of another type than the response's.
//! - A resource without a body whose version is the one held is a heartbeat and is skipped.
//! - A resource whose body is not a protobuf message is refused by name, the others applied.
//! - Interest changes go as `resource_names_subscribe`/`_unsubscribe` with no nonce.

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::{Body, Bytes, StdError};
use tracing::{debug, warn};

use super::protocol::{record_ack, record_nack, Pending, Protocol, Received};
use super::state::{Subscriptions, TypeState};
use super::stats::Stats;
use super::update::{check_body, delta_type_mismatch, error_detail, rejection_message};
use crate::sink::{Applied, Rejection, Resource, Update};

/// Delta mode's per-stream state.
pub(crate) struct Delta {
    node: Node,
    /// Whether the next request is the first on its stream (and carries the node).
    first: bool,
}

impl Delta {
    pub fn new(node: Node) -> Self {
        Self { node, first: true }
    }

    fn request(&mut self, type_url: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            node: std::mem::take(&mut self.first).then(|| self.node.clone()),
            type_url: type_url.to_owned(),
            ..DeltaDiscoveryRequest::default()
        }
    }

    /// The first request of a type on this stream.
    fn opening_request(&mut self, state: &mut TypeState) -> Option<DeltaDiscoveryRequest> {
        if !state.wildcard && state.wanted.is_empty() {
            return None;
        }
        let mut request = self.request(state.type_url);
        request.initial_resource_versions = state
            .held
            .iter()
            .filter(|(name, _)| state.wants(name))
            .map(|(name, version)| (name.clone(), version.clone()))
            .collect();
        if !state.wildcard {
            request.resource_names_subscribe = state.wanted.iter().cloned().collect();
        }
        state.sent = state.wanted.clone();
        state.on_stream = true;
        Some(request)
    }

    fn nack(
        &mut self,
        stats: &Stats,
        response: &DeltaDiscoveryResponse,
        message: &str,
    ) -> DeltaDiscoveryRequest {
        record_nack(
            stats,
            &response.type_url,
            &response.system_version_info,
            &response.nonce,
            message,
        );
        let mut request = self.request(&response.type_url);
        request.response_nonce = response.nonce.clone();
        request.error_detail = Some(error_detail(message));
        request
    }
}

/// Envoy's checks of a whole response, in its words.
fn response_fault(response: &DeltaDiscoveryResponse) -> Option<String> {
    let mut names = std::collections::HashSet::new();
    for resource in &response.resources {
        if !names.insert(resource.name.as_str()) {
            return Some(format!(
                "duplicate name {} found among added/updated resources",
                resource.name
            ));
        }
        if let Some(body) = &resource.resource {
            if body.type_url != response.type_url {
                return Some(delta_type_mismatch(&body.type_url, &response.type_url));
            }
        }
    }
    for name in &response.removed_resources {
        if !names.insert(name.as_str()) {
            return Some(format!(
                "duplicate name {name} found in the union of added+removed resources"
            ));
        }
    }
    None
}

impl Protocol for Delta {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;
    const QUEUES_ANSWERS: bool = true;

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
        client.delta_aggregated_resources(request).await
    }

    fn initial_requests(&mut self, subs: &mut Subscriptions) -> Vec<Self::Request> {
        self.first = true;
        let mut requests = Vec::new();
        for state in subs.started_mut() {
            requests.extend(self.opening_request(state));
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
        let request = if state.on_stream {
            let subscribe: Vec<String> = state.wanted.difference(&state.sent).cloned().collect();
            let unsubscribe: Vec<String> = state.sent.difference(&state.wanted).cloned().collect();
            if subscribe.is_empty() && unsubscribe.is_empty() {
                return None;
            }
            // A resource we lose interest in is forgotten: its version means nothing to a
            // later subscription.
            for name in &unsubscribe {
                state.held.remove(name);
            }
            state.sent = state.wanted.clone();
            let mut request = self.request(type_url);
            request.resource_names_subscribe = subscribe;
            request.resource_names_unsubscribe = unsubscribe;
            request
        } else {
            self.opening_request(state)?
        };
        stats.attempt(type_url);
        debug!(
            type_url,
            subscribe = ?request.resource_names_subscribe,
            unsubscribe = ?request.resource_names_unsubscribe,
            "delta subscription"
        );
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
        let Some(state) = subs.get(&response.type_url).filter(|s| s.on_stream) else {
            warn!(
                type_url = response.type_url,
                "dropping a delta response for a type not subscribed"
            );
            return Received::Ignore;
        };
        if let Some(fault) = response_fault(&response) {
            let type_url = state.type_url;
            return Received::Refused(type_url, self.nack(stats, &response, &fault));
        }
        let mut refused = Vec::new();
        let mut resources = Vec::new();
        for resource in response.resources {
            if !state.wants(&resource.name) {
                debug!(
                    type_url = state.type_url,
                    name = resource.name,
                    "skipping a resource not subscribed"
                );
                continue;
            }
            let Some(body) = resource.resource else {
                if state.held.get(&resource.name) == Some(&resource.version)
                    || !resource.aliases.is_empty()
                {
                    continue; // a heartbeat, or an alias not resolved: nothing to apply
                }
                refused.push(Rejection {
                    name: resource.name,
                    reason: "resource has no body".to_owned(),
                });
                continue;
            };
            if let Err(e) = check_body(state.type_url, &body.value) {
                refused.push(Rejection {
                    name: resource.name,
                    reason: format!("cannot decode {}: {e}", body.type_url),
                });
                continue;
            }
            resources.push(Resource {
                name: resource.name,
                version: resource.version,
                body: body.value,
            });
        }
        let update = Update {
            resources,
            removed: response.removed_resources,
            complete: false,
        };
        let mut pending = Pending::new(
            state.type_url,
            update,
            response.nonce,
            response.system_version_info,
        );
        pending
            .delivered
            .extend(refused.iter().map(|r| r.name.clone()));
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
        let mut rejected = pending.refused;
        rejected.extend(applied.rejected.iter().cloned());
        // Envoy records the versions of a response only when it accepts all of it: after a
        // NACK, none of its versions (nor its removals) are remembered, so a new stream
        // reports the older versions and the server resends what we may already hold. Checked
        // against Envoy 1.40 by the differential test.
        if let Some(state) = subs
            .get_mut(pending.type_url)
            .filter(|_| rejected.is_empty())
        {
            state.held.extend(pending.versions);
            for name in &pending.removed {
                state.held.remove(name);
            }
        }
        let mut request = self.request(pending.type_url);
        request.response_nonce = pending.nonce.clone();
        if rejected.is_empty() {
            record_ack(
                stats,
                pending.type_url,
                &pending.version,
                pending.delivered.len(),
            );
        } else {
            let message = rejection_message(pending.type_url, &rejected);
            record_nack(
                stats,
                pending.type_url,
                &pending.version,
                &pending.nonce,
                &message,
            );
            request.error_detail = Some(error_detail(&message));
        }
        request
    }
}
