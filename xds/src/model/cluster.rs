//! Clusters: where their endpoints come from, how one is picked, how long a connect may take,
//! and which transport socket (Istio mTLS or plaintext) each endpoint gets.

use super::endpoint::{ClusterLoadAssignment, Locality};
use super::matcher::StringMatcher;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Envoy's connect timeout when a cluster sets none.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Envoy's default `initial_fetch_timeout` for a cluster's EDS subscription.
pub const DEFAULT_EDS_FETCH_TIMEOUT: Duration = Duration::from_secs(15);

/// An upstream cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub name: String,
    pub discovery: Discovery,
    pub lb_policy: LbPolicy,
    pub connect_timeout: Duration,
    /// The socket of an endpoint no match picks (plaintext unless `transport_socket` says).
    pub transport_socket: TransportSocket,
    /// Tried in order against an endpoint's `envoy.transport_socket_match` metadata; the
    /// first whose every key/value the metadata holds wins (`{}` matches every endpoint).
    pub transport_socket_matches: Vec<TransportSocketMatch>,
    /// Static host set (STATIC clusters; DNS clusters keep their names in [`Discovery`]).
    pub load_assignment: Option<ClusterLoadAssignment>,
    /// `filter_metadata.istio`: what Istio's metrics label the traffic with.
    pub istio: IstioClusterMetadata,
    /// Istio's metadata-exchange upstream filter.
    pub metadata_exchange: Option<super::listener::MetadataExchange>,
    /// The HTTP protocol to speak upstream.
    pub http_protocol: UpstreamHttpProtocol,
    /// Idle timeout of upstream HTTP connections (`None`: Envoy's default of one hour).
    pub http_idle_timeout: Option<Duration>,
    /// `max_requests_per_connection` (`None`: unlimited).
    pub max_requests_per_connection: Option<u32>,
    /// HTTP/2 streams per upstream connection (`None`: Envoy's default).
    pub http2_max_concurrent_streams: Option<u32>,
    /// `upstream_http_protocol_options.auto_sni`: an HTTP request's TLS origination sends its
    /// host (after the route's host rewrite, without the port; not an IP address) as SNI
    /// (istiod's, for a DestinationRule's SIMPLE or MUTUAL TLS without `sni`).
    pub auto_sni: bool,
    /// `upstream_http_protocol_options.auto_san_validation`: the server's certificate must
    /// name that host, in place of the socket's SAN matchers (istiod's, with `auto_sni`,
    /// when the DestinationRule lists no `subjectAltNames`).
    pub auto_san_validation: bool,
    /// Bind upstream connections to this source address (istiod's `127.0.0.6` for inbound
    /// passthrough, so the application sees traffic from the sidecar).
    pub upstream_bind_address: Option<std::net::IpAddr>,
    /// `alt_stat_name`: the name Envoy files the cluster's statistics under (istiod writes the
    /// Istio-style `outbound_.9080_._.reviews.default.svc.cluster.local`), `None` for its own name.
    pub alt_stat_name: Option<String>,
    /// `common_lb_config`: what of it Remora honours (istiod writes it empty on every cluster).
    pub common_lb: CommonLb,
    /// `circuit_breakers` (none: Envoy's own limits).
    pub circuit_breakers: super::circuit_breakers::CircuitBreakers,
    /// `outlier_detection` (none: no host is ever ejected).
    pub outlier_detection: Option<super::outlier::OutlierDetection>,
    /// `upstream_connection_options.tcp_keepalive` (DestinationRule
    /// `connectionPool.tcp.tcpKeepalive`; none: the kernel's default, keepalive off).
    pub tcp_keepalive: Option<TcpKeepalive>,
}

/// TCP keepalive on every upstream connection of a cluster: `SO_KEEPALIVE` on, and each
/// setting given replaces the kernel's (`net.ipv4.tcp_keepalive_*`), as Envoy sets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpKeepalive {
    /// Unanswered probes before the connection is dropped (`TCP_KEEPCNT`).
    pub probes: Option<u32>,
    /// Idle time before the first probe (`TCP_KEEPIDLE`), whole seconds.
    pub time: Option<Duration>,
    /// Time between probes (`TCP_KEEPINTVL`), whole seconds.
    pub interval: Option<Duration>,
}

/// The parts of `common_lb_config` Remora keeps (every other part is refused by name).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CommonLb {
    /// `healthy_panic_threshold`, in percent: below this share of healthy hosts, balance over
    /// every host. `None`: Envoy's 50 %; `Some(0.0)` (istiod's, with outlier detection): never.
    pub healthy_panic_threshold: Option<f64>,
    /// `locality_weighted_lb_config`: pick a locality by its `load_balancing_weight` first,
    /// then a host in it (istiod's, for a locality `distribute` setting, a `failover` with outlier
    /// detection, or `ENABLE_LOCALITY_WEIGHTED_LB_CONFIG`).
    pub locality_weighted: bool,
}

/// Where a cluster's endpoints come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovery {
    /// From EDS, under this name (`eds_service_name`, or the cluster's own name).
    Eds {
        service_name: String,
        /// How long a new cluster warms waiting for its first assignment
        /// (`eds_config.initial_fetch_timeout`, Envoy's 15 s when unset; `None`: for ever,
        /// Envoy's `0s`, which istiod writes on every EDS cluster).
        initial_fetch_timeout: Option<Duration>,
    },
    Static,
    /// The connection's original destination.
    OriginalDst {
        /// Connect to this port instead of the original one (istiod's inbound clusters).
        port_override: Option<u16>,
        /// The destination comes from the `x-envoy-original-dst-host` header.
        use_http_header: bool,
    },
    /// Every address the names resolve to is an endpoint.
    StrictDns(Dns),
    /// The first address a name resolves to, re-resolved per new connection.
    LogicalDns(Dns),
}

/// A DNS cluster's names and how to resolve them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dns {
    pub targets: Vec<DnsTarget>,
    pub lookup_family: DnsLookupFamily,
    /// Re-resolve this often (Envoy's 5 s when unset)…
    pub refresh_rate: Duration,
    /// …or as the records' TTL says.
    pub respect_dns_ttl: bool,
    /// `dns_jitter`: add a random delay up to this to each refresh, so that sidecars started
    /// together do not resolve together (istiod's `PILOT_DNS_JITTER_DURATION`, 100 ms since
    /// Istio 1.25, on every DNS cluster). Zero: none.
    pub refresh_jitter: Duration,
}

/// One name of a DNS cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsTarget {
    pub host: String,
    pub port: u16,
    pub weight: u32,
    /// As an endpoint's, picks the transport socket.
    pub tls_mode: Option<String>,
    /// Its `load_assignment` entry's locality, priority and locality weight, which its
    /// addresses take as EDS hosts would (istiod's locality failover and `distribute` apply
    /// to DNS ServiceEntries too).
    pub locality: Locality,
    pub priority: u32,
    pub locality_weight: Option<u32>,
}

/// Which address families a DNS lookup asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsLookupFamily {
    Auto,
    V4Only,
    V6Only,
    V4Preferred,
    All,
}

/// How a cluster picks an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbPolicy {
    /// Istio's default: the fewer requests in flight, the likelier (power of two choices).
    LeastRequest {
        choice_count: u32,
    },
    RoundRobin,
    Random,
    /// The cluster picks the host itself: ORIGINAL_DST clusters (the original destination).
    ClusterProvided,
    /// Consistent hashing on a ring (Envoy's ketama ring, xxHash64): the request's hash
    /// ([`crate::model::hash::HashPolicy`]) picks the host; a request with none picks at random.
    RingHash {
        minimum_ring_size: u64,
        maximum_ring_size: u64,
    },
    /// Consistent hashing by Maglev's lookup table of `table_size` (a prime) entries.
    Maglev {
        table_size: u64,
    },
}

impl LbPolicy {
    /// Whether the policy picks by the request's hash.
    pub fn hashes(&self) -> bool {
        matches!(self, LbPolicy::RingHash { .. } | LbPolicy::Maglev { .. })
    }
}

/// Envoy's defaults for RING_HASH and MAGLEV.
pub const DEFAULT_MIN_RING_SIZE: u64 = 1024;
pub const DEFAULT_MAX_RING_SIZE: u64 = 8 * 1024 * 1024;
pub const DEFAULT_MAGLEV_TABLE_SIZE: u64 = 65537;

/// Which HTTP version to use upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamHttpProtocol {
    /// No `HttpProtocolOptions`: HTTP/1.1 (Envoy's default).
    Http1,
    Http2,
    /// As the downstream request came (`use_downstream_protocol_config`, istiod's default for
    /// auto-detected ports).
    Downstream,
}

/// One entry of `transport_socket_matches`.
#[derive(Debug, Clone, PartialEq)]
pub struct TransportSocketMatch {
    pub name: String,
    /// Key/values the endpoint's `envoy.transport_socket_match` metadata must hold.
    pub criteria: BTreeMap<String, String>,
    pub socket: TransportSocket,
}

/// What an upstream connection is wrapped in.
#[derive(Debug, Clone, PartialEq)]
pub enum TransportSocket {
    Plaintext,
    Tls(Box<UpstreamTls>),
}

/// An upstream TLS context, as istiod writes it for Istio mTLS (or a DestinationRule's TLS).
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamTls {
    /// SNI (istiod: `outbound_.9080_.v1_.productpage.default.svc.cluster.local`).
    pub sni: Option<String>,
    /// ALPN offered (`istio-peer-exchange`, `istio`; Istio's ALPN filter may override it per
    /// request).
    pub alpn: Vec<String>,
    /// The peer certificate must carry a SAN matching one of these (empty: any).
    pub subject_alt_names: Vec<SanMatcher>,
    /// SDS secret of our certificate: `default` (Istio mTLS) or a DestinationRule's
    /// `file-cert:` (MUTUAL).
    pub certificate_secret: Option<SdsSecret>,
    /// SDS secret of the trusted roots: `ROOTCA` (Istio mTLS) or a DestinationRule's
    /// `file-root:` (SIMPLE, MUTUAL). `None`: the server's certificate is not checked
    /// (`insecureSkipVerify`, which istiod writes as an empty `validation_context`).
    pub validation_secret: Option<SdsSecret>,
    pub min_version: Option<TlsVersion>,
    pub max_version: Option<TlsVersion>,
}

impl UpstreamTls {
    /// Whether this is Istio mTLS (the workload's own secrets), not a DestinationRule's TLS
    /// origination with files of the pod.
    pub fn is_mesh(&self) -> bool {
        matches!(self.certificate_secret, Some(SdsSecret::Workload))
            || matches!(self.validation_secret, Some(SdsSecret::MeshRoots))
    }

    /// The names of the secrets the control plane serves over ADS that this socket needs.
    pub fn ads_secrets(&self) -> impl Iterator<Item = &str> {
        [&self.certificate_secret, &self.validation_secret]
            .into_iter()
            .filter_map(|s| match s {
                Some(SdsSecret::Ads(name)) => Some(name.as_str()),
                _ => None,
            })
    }
}

/// An SDS secret a transport socket names, resolved as pilot-agent's SDS server resolves it
/// (`security.SdsCertificateConfigFromResourceName`): Remora reads the files itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SdsSecret {
    /// `default`: the workload certificate Remora holds.
    Workload,
    /// `ROOTCA`: the mesh roots Remora holds.
    MeshRoots,
    /// `file-cert:CHAIN~KEY`: a client certificate chain and key mounted in the pod
    /// (DestinationRule `clientCertificate`, `privateKey`).
    FileCertificate { chain: PathBuf, key: PathBuf },
    /// `file-root:PATH`: roots mounted in the pod (DestinationRule `caCertificates`).
    FileRoots(PathBuf),
    /// `file-root:system`: the operating system's roots (no `caCertificates`).
    SystemRoots,
    /// A secret the control plane serves over the ADS stream itself (`sds_config: {ads: {}}`):
    /// istiod's `kubernetes://NAME` and `kubernetes://NAME-cacert` for a DestinationRule's
    /// `credentialName`. Remora asks for it as Envoy does, once a cluster names it.
    Ads(String),
}

impl SdsSecret {
    /// The name istiod gave it.
    pub fn name(&self) -> String {
        match self {
            SdsSecret::Workload => "default".into(),
            SdsSecret::MeshRoots => "ROOTCA".into(),
            SdsSecret::FileCertificate { chain, key } => {
                format!("file-cert:{}~{}", chain.display(), key.display())
            }
            SdsSecret::FileRoots(path) => format!("file-root:{}", path.display()),
            SdsSecret::SystemRoots => "file-root:system".into(),
            SdsSecret::Ads(name) => name.clone(),
        }
    }
}

/// A SAN check.
#[derive(Debug, Clone, PartialEq)]
pub struct SanMatcher {
    /// `None`: any SAN type (the deprecated `match_subject_alt_names`).
    pub san_type: Option<SanType>,
    pub matcher: StringMatcher,
}

/// The SAN types Envoy can check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SanType {
    Uri,
    Dns,
    Email,
    IpAddress,
}

/// A TLS protocol version bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    Tls1_0,
    Tls1_1,
    Tls1_2,
    Tls1_3,
}

/// Istio's cluster metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IstioClusterMetadata {
    pub services: Vec<IstioService>,
    /// The DestinationRule subset (`v1`).
    pub subset: Option<String>,
    /// The DestinationRule's path (`/apis/networking.istio.io/…`).
    pub config: Option<String>,
    pub default_original_port: Option<u32>,
    /// `alpn_override: "false"` (istiod's, on clusters with a DestinationRule's SIMPLE or
    /// MUTUAL TLS): Istio's ALPN filter leaves the socket's own ALPN offer alone.
    pub keeps_alpn: bool,
}

/// A Kubernetes service a cluster stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IstioService {
    pub host: String,
    pub name: String,
    pub namespace: String,
}

impl Cluster {
    /// The socket for an endpoint with this `tlsMode` (`None` when it has no
    /// `envoy.transport_socket_match` metadata), picked as Envoy picks it.
    pub fn transport_socket_for(&self, tls_mode: Option<&str>) -> &TransportSocket {
        for m in &self.transport_socket_matches {
            let hit = m
                .criteria
                .iter()
                .all(|(k, v)| k == "tlsMode" && tls_mode == Some(v.as_str()));
            if hit {
                return &m.socket;
            }
        }
        &self.transport_socket
    }

    /// The secrets served over ADS that any of this cluster's sockets names (what Envoy
    /// subscribes to when it builds the cluster's transport socket factories).
    pub fn ads_secrets(&self) -> impl Iterator<Item = &str> {
        std::iter::once(&self.transport_socket)
            .chain(self.transport_socket_matches.iter().map(|m| &m.socket))
            .filter_map(|s| match s {
                TransportSocket::Tls(tls) => Some(tls.ads_secrets()),
                TransportSocket::Plaintext => None,
            })
            .flatten()
    }

    /// The Istio mTLS settings: the socket of the `{"tlsMode": "istio"}` match, or of the
    /// cluster itself when it is TLS and there are no matches.
    pub fn istio_mtls(&self) -> Option<&UpstreamTls> {
        match self.transport_socket_for(Some("istio")) {
            TransportSocket::Tls(tls) => Some(tls),
            TransportSocket::Plaintext => None,
        }
    }

    /// The EDS name to subscribe to, for EDS clusters.
    pub fn eds_service_name(&self) -> Option<&str> {
        match &self.discovery {
            Discovery::Eds { service_name, .. } => Some(service_name),
            _ => None,
        }
    }

    /// An EDS cluster's name for its endpoints and how long it warms waiting for them (`None`:
    /// for ever); `None` for the other kinds, which do not wait.
    pub fn eds_wait(&self) -> Option<(&str, Option<Duration>)> {
        match &self.discovery {
            Discovery::Eds {
                service_name,
                initial_fetch_timeout,
            } => Some((service_name, *initial_fetch_timeout)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(sni: &str) -> TransportSocket {
        TransportSocket::Tls(Box::new(UpstreamTls {
            sni: Some(sni.into()),
            alpn: vec![],
            subject_alt_names: vec![],
            certificate_secret: Some(SdsSecret::Workload),
            validation_secret: Some(SdsSecret::MeshRoots),
            min_version: None,
            max_version: None,
        }))
    }

    #[test]
    fn transport_socket_by_tls_mode() {
        let cluster = Cluster {
            name: "c".into(),
            discovery: Discovery::Eds {
                service_name: "c".into(),
                initial_fetch_timeout: Some(DEFAULT_EDS_FETCH_TIMEOUT),
            },
            lb_policy: LbPolicy::RoundRobin,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            transport_socket: TransportSocket::Plaintext,
            transport_socket_matches: vec![
                TransportSocketMatch {
                    name: "tlsMode-istio".into(),
                    criteria: [("tlsMode".to_string(), "istio".to_string())].into(),
                    socket: tls("outbound_.80_._.c"),
                },
                TransportSocketMatch {
                    name: "tlsMode-disabled".into(),
                    criteria: BTreeMap::new(),
                    socket: TransportSocket::Plaintext,
                },
            ],
            load_assignment: None,
            istio: IstioClusterMetadata::default(),
            metadata_exchange: None,
            http_protocol: UpstreamHttpProtocol::Http1,
            http_idle_timeout: None,
            max_requests_per_connection: None,
            http2_max_concurrent_streams: None,
            auto_sni: false,
            auto_san_validation: false,
            upstream_bind_address: None,
            alt_stat_name: None,
            common_lb: CommonLb::default(),
            circuit_breakers: Default::default(),
            outlier_detection: None,
            tcp_keepalive: None,
        };
        assert_eq!(
            cluster.transport_socket_for(Some("istio")),
            &tls("outbound_.80_._.c")
        );
        assert_eq!(
            cluster.transport_socket_for(None),
            &TransportSocket::Plaintext
        );
        assert_eq!(
            cluster.transport_socket_for(Some("disabled")),
            &TransportSocket::Plaintext
        );
        assert_eq!(
            cluster.istio_mtls().and_then(|t| t.sni.as_deref()),
            Some("outbound_.80_._.c")
        );
        assert_eq!(cluster.eds_service_name(), Some("c"));
    }
}
