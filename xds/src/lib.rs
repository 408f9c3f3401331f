//! Remora's xDS model. istiod describes a sidecar's world in Envoy's discovery resources
//! (listeners, clusters, routes, endpoints); this crate reads them, from gRPC bytes or from
//! Envoy's JSON, and converts them into Remora's own validated, immutable types. The data path
//! sees only those types: protos go no further than this crate. What Remora cannot honour is
//! refused with the resource and the field named, never dropped silently.

pub mod ads;
pub mod convert;
pub mod descriptors;
pub mod json;
pub mod model;
pub mod refusal;
pub mod sink;
pub mod snapshot;
pub mod store;
pub mod validate;
