//! Remora's own view of istiod's resources: plain, immutable types that the data path reads,
//! with no protobuf inside. [`crate::convert`] builds them and refuses what they cannot say.
//!
//! - [`listener`]: which listener an original destination reaches, and which of its filter
//!   chains a connection takes (by destination, SNI, transport and ALPN);
//! - [`route`]: route tables: virtual host by Host, route by path, headers and query, then the
//!   cluster, timeout and retries;
//! - [`fault`]: fault injection (delays and aborts) per route;
//! - [`hash`]: a route's hash policies, for consistent-hash clusters;
//! - [`retry`]: retry policies (conditions, retries, per-try timeout, back-off);
//! - [`cluster`]: discovery, balancing, connect timeout, the transport socket per endpoint;
//! - [`circuit_breakers`], [`outlier`]: a cluster's limits and its passive health checking;
//! - [`endpoint`]: EDS host sets: localities, priorities, weights, health, tlsMode;
//! - [`rbac`]: Envoy's RBAC policies as data, for the authorization step to enforce;
//! - [`ext_authz`]: the external authorizer istiod's CUSTOM policies call, and when;
//! - [`secret`]: SDS secrets (certificates and trust anchors);
//! - [`header_format`]: header values with Envoy's `%…%` substitutions;
//! - [`matcher`]: string, header and address matchers the others share;
//! - [`name_table`]: istiod's name table (NDS), which the DNS proxy answers mesh names from.

pub mod circuit_breakers;
pub mod cluster;
pub mod cors;
pub mod domains;
pub mod endpoint;
pub mod ext_authz;
pub mod fault;
pub mod hash;
pub mod header_format;
pub mod listener;
pub mod log_format;
pub mod matcher;
pub mod name_table;
pub mod outlier;
pub mod rbac;
pub mod retry;
pub mod route;
pub mod secret;

pub use cluster::Cluster;
pub use endpoint::ClusterLoadAssignment;
pub use listener::Listener;
pub use name_table::NameTable;
pub use route::RouteConfiguration;
