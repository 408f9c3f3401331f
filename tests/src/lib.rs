//! End-to-end harness for Remora: real network namespaces, real capture rules, real peers.
//!
//! A test builds a [`PodNet`]: two fresh network namespaces, the *pod* (where Remora and the
//! application live, and where `remora capture` writes its iptables rules) and the *peer* (the
//! rest of the world), joined by a veth pair on a subnet of their own. [`Remora`] runs the real
//! binary inside the pod as UID/GID 1337, the way an injected sidecar runs. Peers are small
//! std-thread servers ([`peer::Server`]) and clients whose sockets are created inside a namespace
//! ([`Netns::enter`]), plus `curl` run through `ip netns exec`, and a real Envoy ([`envoy`]) as
//! the other pod's sidecar. [`Metrics`] reads Remora's Prometheus text so a test can prove a
//! connection really crossed the proxy.
//!
//! Everything is torn down on drop, panics included: processes are killed by PID and the
//! namespaces deleted. Every wait has a time bound and every loop a count bound, so a broken
//! proxy fails a test instead of hanging it. Tests that need root call [`PodNet::create_or_skip`],
//! which skips (or, under `CI=true`, fails) when the machine cannot run them.

pub mod access_logs;
pub mod backend;
pub mod certs;
pub mod custom_authz;
pub mod dns;
pub mod environment;
pub mod envoy;
pub mod envoy_config;
pub mod envoy_xds;
pub mod ext_authz;
pub mod h2_origin;
pub mod http_client;
pub mod istiod;
pub mod mesh;
pub mod metrics;
pub mod netns;
pub mod peer;
pub mod process;
pub mod promtool;
pub mod service;
pub mod sidecars;
pub mod sniff;
pub mod stat_deltas;
pub mod switchable;
pub mod xds_resources;

pub use environment::{has_command, missing_capability, skip};
pub use metrics::Metrics;
pub use netns::{Netns, PodNet};
pub use process::{Remora, RemoraBinary, RemoraCommand};

/// Remora's outbound capture port (`istio-iptables -p`).
pub const OUTBOUND_PORT: u16 = 15001;
/// Remora's inbound capture port (`istio-iptables -z`).
pub const INBOUND_PORT: u16 = 15006;
/// Remora's readiness port (`GET /healthz/ready`).
pub const READINESS_PORT: u16 = 15021;
/// Remora's Prometheus port (`GET /stats/prometheus`).
pub const METRICS_PORT: u16 = 15090;
/// Remora's admin port, on 127.0.0.1.
pub const ADMIN_PORT: u16 = 15000;
/// The UID and GID the sidecar runs as, and that the default capture rules exempt.
pub const PROXY_UID: u32 = 1337;

/// The arguments the injector passes to `remora capture` (istio-iptables' defaults).
pub const DEFAULT_CAPTURE_ARGS: &[&str] = &[
    "-p",
    "15001",
    "-z",
    "15006",
    "-u",
    "1337",
    "-m",
    "REDIRECT",
    "-i",
    "*",
    "-x",
    "",
    "-b",
    "*",
    "-d",
    "15090,15021,15020",
];
