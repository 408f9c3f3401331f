//! The control-plane client: Remora talking to istiod as pilot-agent does.
//!
//! [`settings`] resolves Istio's environment (and the config file's `istiod:` section) into
//! [`AgentSettings`], whose [`NodeInfo`] is the pod as istiod sees it. [`channel`] is the one
//! TLS gRPC channel to istiod with the per-call credentials (bearer token, `clusterid`) that
//! the CA client and the ADS client both use, its connection dialled and counted (as Envoy's
//! `xds-grpc` cluster) by [`connection`]. [`ca`] speaks Istio's CA protocol and checks what
//! comes back; [`rotation`] keeps the workload certificate in the identity store current;
//! [`xds`] runs the ADS client into the xDS store and tells readiness when the first clusters
//! and listeners are in. Without a discovery address none of this runs.

pub mod ca;
pub mod channel;
pub mod connection;
pub mod node;
pub mod rotation;
pub mod settings;
#[cfg(test)]
pub(crate) mod test_ca;
pub mod xds;

pub use channel::{CallCredentials, ChannelError, IstiodChannel, IstiodChannels};
pub use node::NodeInfo;
pub use settings::{AgentSettings, SettingsError};
