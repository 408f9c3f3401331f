//! The seam between the discovery client and the model: the ADS client hands each response's
//! resources to a [`Sink`], which converts and applies what it can and says what it refused and
//! which further resources it now wants (the endpoints of EDS clusters, the route tables that
//! listeners name). The client owns the protocol (versions, nonces, ACK and NACK); the sink owns
//! the meaning.

use std::collections::{BTreeMap, BTreeSet};

/// Type URLs of the resources a sidecar subscribes to.
pub mod type_url {
    pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
    pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
    pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
    /// Secrets istiod serves itself (SDS on the ADS stream: a DestinationRule's
    /// `credentialName`), asked for by name once a cluster names them.
    pub const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
    /// istiod's name table (NDS), which pilot-agent asks for when DNS capture is on.
    pub const NAME_TABLE: &str = "type.googleapis.com/istio.networking.nds.v1.NameTable";
}

/// One resource as the control plane sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    /// Its name (in delta, the `Resource.name`; in state of the world, read from the body).
    pub name: String,
    /// Its version: per resource in delta, the response's `version_info` in state of the world.
    pub version: String,
    /// The serialised resource (the `Any`'s value), of the update's type.
    pub body: Vec<u8>,
}

/// The resources of one type that one response carries.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Update {
    /// Added or changed resources.
    pub resources: Vec<Resource>,
    /// Names the control plane removed (delta's `removed_resources`).
    pub removed: Vec<String>,
    /// State of the world: `resources` is the whole set of this type, so a resource held but
    /// not in it is removed (for CDS and LDS; for RDS and EDS only what was asked is).
    pub complete: bool,
}

/// A resource the sink would not apply, with why: the field path and the reason, in words an
/// operator reads in the NACK's `error_detail` (`listener virtualInbound: filter_chains[3]
/// .filters[1] (envoy.filters.http.ext_authz): not supported`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub name: String,
    pub reason: String,
}

/// What applying an update did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Applied {
    /// Resources refused; their previous versions stay in force, the others of the update are
    /// applied (as Envoy does).
    pub rejected: Vec<Rejection>,
    /// For each type the held resources depend on (ENDPOINT, SECRET, ROUTE), the full set of names
    /// now wanted. A type absent from the map keeps its current subscription.
    pub wanted: BTreeMap<&'static str, BTreeSet<String>>,
}

/// For each type the held resources depend on, the full set of names wanted (as in
/// [`Applied::wanted`]).
pub type Interest = BTreeMap<&'static str, BTreeSet<String>>;

/// Where the discovery client delivers what it receives.
pub trait Sink: Send + Sync + 'static {
    /// Convert and apply one response's resources of `type_url`.
    fn apply(&self, type_url: &str, update: Update) -> Applied;

    /// Interest that changes with no response to apply (a cluster whose endpoints' initial
    /// fetch timed out now wants its secrets): the client watches it and subscribes at once.
    /// The value is the whole interest of the types it names; `None`, the default: interest
    /// changes only through [`Sink::apply`].
    fn interest(&self) -> Option<tokio::sync::watch::Receiver<Interest>> {
        None
    }
}
