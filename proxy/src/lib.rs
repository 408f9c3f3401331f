//! Remora's data plane: the sidecar behind `remora run`.
//!
//! A connection flows top to bottom through these modules: a capture `listener` accepts it,
//! `proxy` learns where it was going (`orig_dst`), refuses it if it would loop (`loop_guard`),
//! opens the upstream (`connect`) while `detect` tells HTTP from opaque bytes, then either
//! copies bytes both ways (`tcp`) or proxies HTTP requests (`http`), and records it
//! (`metrics`, `access_log`). With a workload certificate (`identity`), mesh mutual TLS (`tls`)
//! is terminated inbound and originated outbound around that same path, and on TCP the two
//! sidecars tell each other which workload they are (`metadata_exchange`). Inbound requests
//! and connections are decided by Istio's authorization policies (`authz`). Around that: `admin` serves readiness, metrics and the admin API on
//! its own thread, `agent` serves Istio's agent port (merged metrics, application probes), `dns` forwards the DNS queries capture redirects to 15053, `drain` carries SIGTERM's shutdown, `reload` swaps in new configs (woken by `file_watch`, as `xds_files` is), `lifecycle` holds the
//! commands the injected container's hooks run, and `cli` is the binary's edge. See ARCHITECTURE.md for the whole picture.

pub mod access_log;
pub mod admin;
pub mod agent;
pub mod authz;
pub mod chain_drain;
pub mod cli;
pub mod connect;
pub mod detect;
pub mod dns;
pub mod drain;
/// Directory watches, shared with the injector's webhook (its certificate files).
pub use remora_config::file_watch;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod identity;
pub mod istio_env;
pub mod istiod;
pub mod lifecycle;
pub mod listener;
pub mod loop_guard;
pub mod metadata_exchange;
pub mod metrics;
pub mod orig_dst;
pub mod proxy;
pub mod reload;
pub mod route;
pub mod tcp;
pub mod tls;
pub mod upstream;
pub mod workload;
pub mod xds_files;

/// Which capture listener a connection arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the application to the world (15001).
    Outbound,
    /// From the world to the application (15006).
    Inbound,
}

impl Direction {
    /// The label value used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Outbound => "outbound",
            Direction::Inbound => "inbound",
        }
    }
}
