//! Remora's xDS model. istiod describes a sidecar's world in Envoy's discovery resources
//! (listeners, clusters, routes, endpoints); this crate reads them, from gRPC bytes or from
//! Envoy's JSON, and converts them into Remora's own validated, immutable types. The data path
//! sees only those types: protos go no further than this crate. What Remora cannot honour is
//! refused with the resource and the field named, never dropped silently.
//!
//! How the parts fit: [`descriptors`] is the protobuf descriptor pool (Envoy's and the few
//! Istio-only types istiod sends), which [`json`] uses for Envoy's proto3 JSON. [`convert`]
//! turns each resource into a [`model`] type or a [`refusal::Refusal`]. The ADS client
//! ([`ads`], delta or state of the world, ACK and NACK as Envoy) hands responses to a
//! [`store::Store`] through the [`sink::Sink`] trait; the store publishes a
//! [`snapshot::Snapshot`] that the data path reads without locks and that the admin API's
//! `/config_dump` prints in Envoy's shape (each entry renders its proto as JSON). [`validate`]
//! is `remora xds validate`: the same conversion, offline.

pub mod ads;
pub mod convert;
pub mod descriptors;
pub mod json;
pub mod manager;
pub mod membership;
pub mod model;
pub mod refusal;
pub mod sink;
pub mod snapshot;
pub mod store;
pub mod validate;
pub mod warming;
