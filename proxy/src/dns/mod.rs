//! The DNS proxy behind `remora capture --redirect-dns`.
//!
//! Capture redirects the application's port-53 traffic to 15053, so without a server there the
//! pod has no DNS at all. We listen on `127.0.0.1` and `::1` (where `REDIRECT` delivers locally
//! sent packets), UDP and TCP, and pass every query unchanged to the resolvers of the pod's
//! resolv.conf, one after the other until one answers; the answer comes back byte for byte, a
//! truncated (TC) UDP answer included, so the client retries over TCP as it would without us.
//! A query no resolver answers gets SERVFAIL. Our own queries leave as UID/GID 1337, which the
//! capture rules exempt, so they are not captured again.
//!
//! With a name table (istiod's NDS, subscribed when DNS capture is on; or a file in file
//! mode), mesh names are answered here first, as pilot-agent answers them ([`table`] says
//! which names and how; [`answer`] writes the response; [`names`] keeps the table current
//! from the xDS store). Everything else is forwarded as above.
//!
//! [`udp`] and [`tcp`] each hold a listener loop and the matching upstream exchange; each
//! bounds what a client can make it hold (queries in flight, connections open) with a config
//! value.

mod answer;
pub(crate) mod message;
pub mod names;
mod resolv_conf;
pub mod table;
mod tcp;
mod udp;

#[cfg(test)]
mod tests;

pub use names::Names;
pub use resolv_conf::{nameservers, search_domains};

use crate::listener::{self, BindError};
use crate::metrics::DnsMetrics;
use remora_config::DnsConfig;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Why the DNS forwarder could not start.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The resolv.conf naming the upstream resolvers is unreadable.
    #[error("cannot read the DNS resolvers from {path}")]
    ResolvConf {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A DNS listener could not be bound.
    #[error(transparent)]
    Bind(#[from] BindError),
}

/// Why one upstream exchange failed; the next resolver is tried.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("DNS resolver {upstream} did not answer within {timeout:?}")]
    Timeout {
        upstream: SocketAddr,
        timeout: Duration,
    },
    #[error("DNS resolver {upstream}: {source}")]
    Io {
        upstream: SocketAddr,
        #[source]
        source: io::Error,
    },
}

/// Which transport a query came over; it goes upstream over the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// Answers queries: mesh names from the name table when there is one, the rest from the
/// upstream resolvers.
#[derive(Debug)]
pub struct Forwarder {
    /// The mesh's names; `None` without a name table source (no istiod, no xDS files).
    pub names: Option<Names>,
    /// The resolvers, in resolv.conf order.
    pub upstreams: Vec<SocketAddr>,
    /// Bound on one exchange with one resolver.
    pub upstream_timeout: Duration,
    pub metrics: DnsMetrics,
}

impl Forwarder {
    /// The answer to `query`: from the name table for a mesh name, else the first resolver's
    /// answer as it came, or SERVFAIL when none answered. `None` when `query` is not a DNS
    /// query, which is dropped as a resolver would.
    pub async fn forward(&self, query: &[u8], transport: Transport) -> Option<Vec<u8>> {
        if !message::is_query(query) {
            return None;
        }
        self.metrics.requests.inc();
        if let Some(names) = &self.names {
            match names.answer(query, transport) {
                names::Verdict::Answer(answer) => return Some(answer),
                names::Verdict::NotSynced => {
                    tracing::debug!("DNS query before the first name table from istiod");
                    return Some(message::servfail(query));
                }
                names::Verdict::Forward => {}
            }
        }
        for &upstream in &self.upstreams {
            self.metrics.upstream_requests.inc();
            let exchanged = match transport {
                Transport::Udp => udp::exchange(upstream, query, self.upstream_timeout).await,
                Transport::Tcp => tcp::exchange(upstream, query, self.upstream_timeout).await,
            };
            match exchanged {
                Ok(answer) => {
                    tracing::trace!(%upstream, ?transport, truncated = message::is_truncated(&answer), "answered");
                    return Some(answer);
                }
                Err(e) => {
                    self.metrics.upstream_failures.inc();
                    tracing::debug!(error = %e, ?transport, "DNS upstream failed");
                }
            }
        }
        Some(message::servfail(query))
    }
}

/// The DNS listeners, bound and ready to serve.
#[derive(Debug)]
pub struct Dns {
    udp: Vec<std::net::UdpSocket>,
    tcp: Vec<std::net::TcpListener>,
    forwarder: Arc<Forwarder>,
    client_idle_timeout: Duration,
    max_udp_in_flight: usize,
    max_tcp_connections: usize,
}

/// Where REDIRECT delivers locally sent packets: the loopback address of each family.
/// Istio's agent binds `::1` only when resolv.conf lists an IPv6 resolver; we bind it whenever
/// the machine has IPv6, since `--capture-all-dns` redirects IPv6 queries to any server.
const LOOPBACKS: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::LOCALHOST),
    IpAddr::V6(Ipv6Addr::LOCALHOST),
];

/// The pod's resolv.conf, read once at start.
pub fn read_resolv_conf(config: &DnsConfig) -> Result<String, DnsError> {
    let path = &config.resolv_conf;
    std::fs::read_to_string(path).map_err(|source| DnsError::ResolvConf {
        path: path.clone(),
        source,
    })
}

/// Bind the listeners with the resolvers of `resolv_conf` (its text), so that a port in use
/// fails the start. `names` answers mesh names first.
pub fn bind(
    config: &DnsConfig,
    resolv_conf: &str,
    names: Option<Names>,
    metrics: DnsMetrics,
) -> Result<Dns, DnsError> {
    let path = &config.resolv_conf;
    let upstreams = nameservers(resolv_conf);
    tracing::info!(?upstreams, resolv_conf = %path.display(), "DNS resolvers");
    let port = config.port.get();
    let tcp = listener::bind_all(&LOOPBACKS, port)?;
    let udp = udp::bind_all(&LOOPBACKS, port)?;
    Ok(Dns {
        udp,
        tcp,
        forwarder: Arc::new(Forwarder {
            names,
            upstreams,
            upstream_timeout: config.upstream_timeout,
            metrics,
        }),
        client_idle_timeout: config.client_idle_timeout,
        max_udp_in_flight: config.max_udp_in_flight,
        max_tcp_connections: config.max_tcp_connections,
    })
}

impl Dns {
    /// Serve on the current runtime until the process ends: the application may need DNS until
    /// its last moment, draining included.
    pub fn spawn(self) -> io::Result<()> {
        for socket in self.udp {
            let socket = tokio::net::UdpSocket::from_std(socket)?;
            tracing::info!(local = ?socket.local_addr().ok(), "DNS listening (UDP)");
            let limit = self.max_udp_in_flight;
            tokio::spawn(udp::serve(socket, Arc::clone(&self.forwarder), limit));
        }
        for l in self.tcp {
            let l = tokio::net::TcpListener::from_std(l)?;
            tracing::info!(local = ?l.local_addr().ok(), "DNS listening (TCP)");
            let limits = tcp::Limits {
                idle: self.client_idle_timeout,
                max_connections: self.max_tcp_connections,
            };
            tokio::spawn(tcp::serve(l, Arc::clone(&self.forwarder), limits));
        }
        Ok(())
    }
}
