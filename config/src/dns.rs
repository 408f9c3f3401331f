//! The `dns:` section: the forwarder that answers the queries `remora capture --redirect-dns`
//! sends to port 15053.

use serde::{Deserialize, Serialize};
use std::num::NonZeroU16;
use std::path::PathBuf;
use std::time::Duration;

/// Istio's DNS proxy port (`istio-iptables --redirect-dns` redirects port 53 here).
pub const DNS_PORT: u16 = 15053;

/// The DNS forwarder on `127.0.0.1` and `::1`, UDP and TCP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DnsConfig {
    /// Serve DNS on `port`. Off by default, as Istio's agent serves DNS only with
    /// `ISTIO_META_DNS_CAPTURE=true`, which also sets this.
    pub enabled: bool,
    /// The port capture redirects port 53 to.
    pub port: NonZeroU16,
    /// Where the upstream resolvers are read from (its `nameserver` lines), once at start.
    pub resolv_conf: PathBuf,
    /// Bound on one upstream exchange; each resolver in turn gets this long (Istio's
    /// `DNS_FORWARD_TIMEOUT`, 5 s).
    #[serde(with = "humantime_serde")]
    pub upstream_timeout: Duration,
    /// A client TCP connection with no complete query for this long is closed.
    #[serde(with = "humantime_serde")]
    pub client_idle_timeout: Duration,
    /// Most UDP queries awaiting an upstream answer at once; more are dropped (and counted),
    /// and the client retries as it would with a busy resolver.
    pub max_udp_in_flight: usize,
    /// Most client TCP connections open at once; more are closed at accept.
    pub max_tcp_connections: usize,
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            enabled: false,
            port: NonZeroU16::new(DNS_PORT).unwrap_or(NonZeroU16::MIN),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            upstream_timeout: Duration::from_secs(5),
            client_idle_timeout: Duration::from_secs(8),
            max_udp_in_flight: 512,
            max_tcp_connections: 128,
        }
    }
}

impl DnsConfig {
    /// Field checks; returns the field under `dns.` and why.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        for (name, d) in [
            ("upstream_timeout", self.upstream_timeout),
            ("client_idle_timeout", self.client_idle_timeout),
        ] {
            if d.is_zero() {
                return Err((format!("dns.{name}"), "must be greater than zero".into()));
            }
        }
        for (name, n) in [
            ("max_udp_in_flight", self.max_udp_in_flight),
            ("max_tcp_connections", self.max_tcp_connections),
        ] {
            if n == 0 {
                return Err((format!("dns.{name}"), "must be greater than zero".into()));
            }
        }
        Ok(())
    }
}
