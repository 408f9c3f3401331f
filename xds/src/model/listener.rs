//! Listeners: the address a connection was headed to picks a listener; the connection's
//! destination, SNI, transport (`tls` or `raw_buffer`) and ALPN pick one of its filter chains;
//! the chain says HTTP (with a route table) or TCP (to a cluster), and what to check on the way
//! (TLS termination, RBAC, Istio's metadata exchange).

use super::cluster::{SanMatcher, TlsVersion};
use super::matcher::CidrRange;
use super::rbac::Rbac;
use super::route::RouteConfiguration;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A listener.
#[derive(Debug, Clone, PartialEq)]
pub struct Listener {
    pub name: String,
    pub address: SocketAddr,
    pub direction: Direction,
    /// `false`: not bound; reached through a `use_original_dst` listener (istiod's
    /// per-service outbound listeners).
    pub bind_to_port: bool,
    /// Hand each accepted connection to the listener of its original destination
    /// (`virtualOutbound`).
    pub use_original_dst: bool,
    pub listener_filters: ListenerFilters,
    pub filter_chains: Vec<FilterChain>,
    /// Taken when no chain matches.
    pub default_filter_chain: Option<FilterChain>,
    /// The listener's own access logs (istiod's carry the `NR` filter: connections no chain
    /// took). Shared: each connection logged by them holds the list, not a copy.
    pub access_log: Arc<[AccessLog]>,
}

/// One access log (`access_log`): Envoy's file logger to a path (istiod's `/dev/stdout`, or the
/// mesh's `accessLogFile`) in the text format given, or Istio's default JSON labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLog {
    pub format: AccessLogFormat,
    /// Log only what this filter admits (`None`: everything).
    pub filter: Option<AccessLogFilter>,
    /// The file lines are appended to (`/dev/stdout`: the process's standard output).
    pub path: std::sync::Arc<str>,
}

/// The line format: a text format string (istiod's `EnvoyTextLogFormat`, or the mesh's
/// `accessLogFormat`), parsed, or istiod's default JSON labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogFormat {
    Text(super::log_format::TextFormat),
    Json,
}

/// The access log filters Remora evaluates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogFilter {
    /// `response_flag_filter`: the entry carries one of these response flags (`NR`, `UF`…);
    /// an empty list admits an entry with any flag set.
    ResponseFlags(Vec<String>),
}

impl AccessLogFilter {
    /// Whether an entry with these response flags (none: no flag, Envoy's `-`) is logged.
    pub fn admits<'f>(&self, flags: impl IntoIterator<Item = &'f str>) -> bool {
        let mut flags = flags.into_iter().filter(|f| *f != "-");
        match self {
            AccessLogFilter::ResponseFlags(want) if want.is_empty() => flags.next().is_some(),
            AccessLogFilter::ResponseFlags(want) => flags.any(|f| want.iter().any(|w| w == f)),
        }
    }
}

impl AccessLog {
    /// Whether this logger writes an entry with these response flags (its filter's say).
    pub fn admits<'f>(&self, flags: impl IntoIterator<Item = &'f str>) -> bool {
        self.filter.as_ref().is_none_or(|f| f.admits(flags))
    }
}

/// `traffic_direction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Unspecified,
    Inbound,
    Outbound,
}

/// The listener filters Remora does natively: which facts a chain match may use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListenerFilters {
    /// Restore the original destination (`envoy.filters.listener.original_dst`).
    pub original_dst: bool,
    /// Peek the ClientHello for SNI and ALPN; not on these destination ports.
    pub tls_inspector: Option<InspectorScope>,
    /// Sniff HTTP/1.x or h2c for ALPN on plaintext.
    pub http_inspector: Option<InspectorScope>,
    /// How long the filters may wait for bytes (`None`: no bound, istiod's `0s`).
    pub timeout: Option<Duration>,
    /// On timeout, go on with what is known (istiod sets it).
    pub continue_on_timeout: bool,
}

/// Where an inspector does not run (`filter_disabled`'s destination port ranges,
/// start inclusive, end exclusive).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InspectorScope {
    pub disabled_ports: Vec<(u16, u16)>,
}

impl InspectorScope {
    /// Whether the inspector runs for a connection to `port`.
    pub fn applies_to(&self, port: u16) -> bool {
        !self
            .disabled_ports
            .iter()
            .any(|&(start, end)| port >= start && port < end)
    }
}

/// What a connection offers to the chain match.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionFacts<'a> {
    /// The original destination.
    pub destination: SocketAddr,
    /// From the TLS inspector.
    pub server_name: Option<&'a str>,
    /// `tls` or `raw_buffer`.
    pub transport_protocol: &'a str,
    /// From the TLS ClientHello or the HTTP inspector (`http/1.1`, `h2c`).
    pub application_protocols: &'a [&'a str],
}

/// A filter chain.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterChain {
    pub name: Option<String>,
    pub matcher: ChainMatch,
    /// Terminate TLS with this context (istiod's inbound mTLS).
    pub tls: Option<DownstreamTls>,
    /// The network filters before the terminal one, in order.
    pub filters: Vec<NetworkFilter>,
    pub kind: ChainKind,
}

/// `filter_chain_match`, for the criteria Remora implements.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChainMatch {
    pub destination_port: Option<u16>,
    pub prefix_ranges: Vec<CidrRange>,
    pub server_names: Vec<String>,
    pub transport_protocol: Option<String>,
    pub application_protocols: Vec<String>,
}

/// A network filter before the terminal one.
#[derive(Debug, Clone, PartialEq)]
pub enum NetworkFilter {
    /// Istio's standard TCP metrics (`istio.stats`).
    IstioStats(IstioStats),
    /// Istio's TCP metadata exchange.
    MetadataExchange(MetadataExchange),
    /// `istio_authn`: record the peer's identity for RBAC (`io.istio.peer_principal`);
    /// `shared`: for the upstream connections too (tunnels).
    IstioAuthn {
        shared: bool,
    },
    Rbac(Rbac),
    /// The external authorizer (AuthorizationPolicy CUSTOM on a TCP port): always a gRPC
    /// service, never a body; `status_on_error` unused (a connection is closed).
    ExtAuthz(Box<super::ext_authz::ExtAuthz>),
}

/// Istio's TCP metadata exchange (`envoy.tcp.metadataexchange.config.MetadataExchange`), as a
/// listener's network filter or a cluster's upstream filter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetadataExchange {
    /// The ALPN protocol it runs over (`istio-peer-exchange`).
    pub protocol: String,
    /// Fall back to workload discovery when the peer sends no metadata.
    pub enable_discovery: bool,
    /// Peer labels to keep beyond Istio's standard ones.
    pub additional_labels: Vec<String>,
}

/// `stats.PluginConfig`, as far as it means anything to Remora's metrics.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IstioStats {
    /// Do not label `destination_service` from the Host header when istiod does not know it.
    pub disable_host_header_fallback: bool,
    /// How often TCP metrics are reported while a connection lives (`None`: Istio's 5 s).
    pub tcp_reporting_duration: Option<Duration>,
}

/// What a chain ends in.
#[derive(Debug, Clone, PartialEq)]
pub enum ChainKind {
    Http(Box<HttpChain>),
    Tcp(TcpChain),
}

/// A chain that ends in `tcp_proxy`.
#[derive(Debug, Clone, PartialEq)]
pub struct TcpChain {
    pub stat_prefix: String,
    pub target: TcpTarget,
    /// `None`: Envoy's default of one hour; `Some(ZERO)`: none.
    pub idle_timeout: Option<Duration>,
    /// `tcp_proxy`'s access logs (istiod's, when the mesh sets `accessLogFile`), shared by
    /// the connections the chain serves.
    pub access_log: Arc<[AccessLog]>,
    /// `hash_policy` `source_ip` (DestinationRule `consistentHash.useSourceIp` on a TCP
    /// port): a RING_HASH or MAGLEV cluster picks by the client's IP.
    pub hash_source_ip: bool,
}

/// Where a TCP chain sends the connection.
#[derive(Debug, Clone, PartialEq)]
pub enum TcpTarget {
    Cluster(String),
    Weighted(Vec<(String, u32)>),
}

impl TcpTarget {
    /// The cluster for a connection, given a uniform random `roll` (weights as routes').
    pub fn pick(&self, roll: u64) -> Option<&str> {
        match self {
            TcpTarget::Cluster(name) => Some(name),
            TcpTarget::Weighted(clusters) => {
                super::route::pick_weighted(clusters.iter().map(|(n, w)| (n.as_str(), *w)), roll)
            }
        }
    }
}

/// A chain that ends in the HTTP connection manager.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpChain {
    /// The connection manager's statistics go under `http.<stat_prefix>.`.
    pub stat_prefix: std::sync::Arc<str>,
    pub routes: RouteSource,
    /// The HTTP filters before the router, in order.
    pub http_filters: Vec<HttpFilter>,
    pub codec: Codec,
    /// `None`: no bound (istiod's `0s`); Envoy's 5 minutes when unset.
    pub stream_idle_timeout: Option<Duration>,
    pub use_remote_address: bool,
    pub forward_client_cert: ForwardClientCert,
    /// Which of the peer certificate's fields go into `x-forwarded-client-cert`.
    pub set_current_client_cert: ClientCertDetails,
    /// `server` response header.
    pub server_name: Option<String>,
    /// The HTTP/1.1 upgrades the connection manager allows (`upgrade_configs`: istiod's
    /// `websocket`), each unless turned off; a route may override it for its own requests.
    /// Shared: each connection the chain takes keeps it.
    pub upgrades: std::sync::Arc<Vec<crate::model::route::Upgrade>>,
    pub normalize_path: bool,
    /// `x-request-id` is generated as a UUID (Envoy's and Istio's only form).
    pub generate_request_id: bool,
    /// HTTP/2 settings of the downstream codec.
    pub http2_max_concurrent_streams: Option<u32>,
    pub http2_allow_connect: bool,
    /// The connection manager's access logs, one line per request each, shared by the
    /// connections the chain serves.
    pub access_log: Arc<[AccessLog]>,
}

impl HttpChain {
    /// Whether the chain has Envoy's fault filter: routes' fault configs inject only then.
    pub fn has_fault_filter(&self) -> bool {
        self.http_filters
            .iter()
            .any(|f| matches!(f, HttpFilter::Fault))
    }
}

impl HttpChain {
    /// Whether the chain has Envoy's cors filter: routes' CORS policies act only then.
    pub fn has_cors_filter(&self) -> bool {
        self.http_filters
            .iter()
            .any(|f| matches!(f, HttpFilter::Cors))
    }
}

/// Where an HTTP chain's routes come from.
#[derive(Debug, Clone, PartialEq)]
pub enum RouteSource {
    /// Named, fetched over RDS.
    Rds(String),
    Inline(Arc<RouteConfiguration>),
}

/// The downstream codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Auto,
    Http1,
    Http2,
}

/// `forward_client_cert_details`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardClientCert {
    Sanitize,
    ForwardOnly,
    AppendForward,
    SanitizeSet,
    AlwaysForwardOnly,
}

/// `set_current_client_cert_details`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientCertDetails {
    pub subject: bool,
    pub cert: bool,
    pub chain: bool,
    pub dns: bool,
    pub uri: bool,
}

/// An HTTP filter Remora implements.
#[derive(Debug, Clone, PartialEq)]
pub enum HttpFilter {
    /// Istio's HTTP metadata exchange, in either form istiod has sent.
    MetadataExchange(MetadataExchangeForm),
    Rbac(Rbac),
    /// The external authorizer (AuthorizationPolicy CUSTOM).
    ExtAuthz(Box<super::ext_authz::ExtAuthz>),
    /// Istio's ALPN override for upstream mTLS: per upstream HTTP version, the ALPN to offer.
    AlpnOverride(Vec<AlpnOverride>),
    IstioStats(IstioStats),
    /// gRPC statistics; `emit_filter_state` feeds Istio's metrics the message counts.
    GrpcStats {
        emit_filter_state: bool,
    },
    /// Envoy's fault filter with no fault of its own (istiod's default): routes' per-filter
    /// fault configs inject through it (a chain without it injects none, as Envoy).
    Fault,
    /// Envoy's CORS filter with no policy of its own (istiod's default): routes' and virtual
    /// hosts' CORS policies ([`super::cors`]) act only when it is in the chain.
    Cors,
}

/// An ECDS extension config: an HTTP filter delivered on its own (istiod's WasmPlugins and
/// Telemetry filters).
#[derive(Debug, Clone, PartialEq)]
pub struct ExtensionConfig {
    pub name: String,
    pub filter: HttpFilter,
}

/// How Istio's HTTP metadata exchange was configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataExchangeForm {
    /// The Wasm filter with the null VM's `envoy.wasm.metadata_exchange` plugin (istiod ≤ 1.21).
    Wasm,
    /// `io.istio.http.peer_metadata.Config` (current istiod): which ways peer metadata is
    /// discovered and propagated, upstream and downstream.
    PeerMetadata(PeerMetadata),
}

/// `io.istio.http.peer_metadata.Config`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerMetadata {
    pub downstream_discovery: Vec<PeerDiscovery>,
    pub upstream_discovery: Vec<PeerDiscovery>,
    /// Send our metadata in the response headers.
    pub downstream_propagation: bool,
    /// Send our metadata in the request headers.
    pub upstream_propagation: bool,
    pub shared_with_upstream: bool,
    pub additional_labels: Vec<String>,
}

/// A way of learning a peer's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerDiscovery {
    Baggage,
    WorkloadDiscovery,
    IstioHeaders,
}

/// One `alpn_override` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlpnOverride {
    pub upstream_protocol: UpstreamProtocol,
    pub alpn: Vec<String>,
}

/// The upstream HTTP version an ALPN override is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamProtocol {
    Http10,
    Http11,
    Http2,
}

/// A downstream TLS context (inbound mTLS).
#[derive(Debug, Clone, PartialEq)]
pub struct DownstreamTls {
    pub alpn: Vec<String>,
    pub min_version: Option<TlsVersion>,
    pub max_version: Option<TlsVersion>,
    pub cipher_suites: Vec<String>,
    /// SDS secrets of our certificate (`default`).
    pub certificate_secrets: Vec<String>,
    /// SDS secret of the trusted roots (`ROOTCA`).
    pub validation_secret: Option<String>,
    pub subject_alt_names: Vec<SanMatcher>,
    pub require_client_certificate: bool,
}

impl Listener {
    /// The chain a connection takes, as Envoy selects it: narrowing the chains by destination
    /// port, then destination address (longest prefix), server name, transport protocol and
    /// application protocols; at each step the chains that name the connection's value win
    /// over those that leave the criterion empty. No match: the default chain.
    ///
    /// It runs per connection, so it allocates nothing: each step is a pass over the chains
    /// that kept the best rank in every step before it.
    pub fn filter_chain(&self, conn: &ConnectionFacts<'_>) -> Option<&FilterChain> {
        let mut best = [0usize; STEPS];
        for step in 0..STEPS {
            let survivors = self.filter_chains.iter().filter(|c| {
                (0..step).all(|earlier| rank(&c.matcher, earlier, conn) == Some(best[earlier]))
            });
            match survivors.filter_map(|c| rank(&c.matcher, step, conn)).max() {
                Some(b) => best[step] = b,
                None => return self.default_filter_chain.as_ref(),
            }
        }
        self.filter_chains
            .iter()
            .find(|c| (0..STEPS).all(|step| rank(&c.matcher, step, conn) == Some(best[step])))
            .or(self.default_filter_chain.as_ref())
    }

    /// Every chain, the default one last.
    pub fn all_chains(&self) -> impl Iterator<Item = &FilterChain> {
        self.filter_chains
            .iter()
            .chain(self.default_filter_chain.as_ref())
    }

    /// The HTTP connection managers of its chains, the default one's included.
    pub fn http_chains(&self) -> impl Iterator<Item = &HttpChain> {
        self.all_chains().filter_map(|c| match &c.kind {
            ChainKind::Http(http) => Some(&**http),
            _ => None,
        })
    }
}

/// The narrowing steps of the chain match, in Envoy's order.
const STEPS: usize = 5;

/// A chain's rank in one step for this connection: 0 when the chain leaves the criterion
/// empty, higher for a closer match, `None` when it excludes the connection.
fn rank(m: &ChainMatch, step: usize, conn: &ConnectionFacts<'_>) -> Option<usize> {
    match step {
        0 => match m.destination_port {
            None => Some(0),
            Some(p) => (p == conn.destination.port()).then_some(1),
        },
        1 => {
            if m.prefix_ranges.is_empty() {
                return Some(0);
            }
            m.prefix_ranges
                .iter()
                .filter(|r| r.contains(conn.destination.ip()))
                .map(|r| usize::from(r.prefix_len) + 1)
                .max()
        }
        2 => {
            if m.server_names.is_empty() {
                return Some(0);
            }
            let sni = conn.server_name?;
            m.server_names
                .iter()
                .filter_map(|n| server_name_rank(n, sni))
                .max()
        }
        3 => match &m.transport_protocol {
            None => Some(0),
            Some(t) => (t == conn.transport_protocol).then_some(1),
        },
        _ => {
            if m.application_protocols.is_empty() {
                return Some(0);
            }
            m.application_protocols
                .iter()
                .any(|a| conn.application_protocols.contains(&a.as_str()))
                .then_some(1)
        }
    }
}

/// An exact server name beats a wildcard; a longer wildcard beats a shorter one.
fn server_name_rank(name: &str, sni: &str) -> Option<usize> {
    if name.eq_ignore_ascii_case(sni) {
        return Some(usize::MAX);
    }
    let suffix = name.strip_prefix('*')?.as_bytes();
    let sni = sni.as_bytes();
    (sni.len() > suffix.len() && sni[sni.len() - suffix.len()..].eq_ignore_ascii_case(suffix))
        .then_some(suffix.len())
}

#[cfg(test)]
#[path = "listener_tests.rs"]
mod tests;
