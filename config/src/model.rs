//! The config schema. Every struct denies unknown fields, so a typo is an error with a line number,
//! not a silently ignored setting. Defaults are Istio's sidecar defaults.

pub use crate::authz::*;
pub use crate::dns::*;
pub use crate::istiod::*;
pub use crate::mesh::*;
pub use crate::overload::*;
pub use crate::traffic::*;
pub use crate::xds::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU16;
use std::time::Duration;

/// Istio's outbound capture port (`istio-iptables -p`).
pub const OUTBOUND_PORT: u16 = 15001;
/// Istio's inbound capture port (`istio-iptables -z`).
pub const INBOUND_PORT: u16 = 15006;
/// Istio's sidecar readiness port.
pub const READINESS_PORT: u16 = 15021;
/// Envoy's Prometheus port in an Istio sidecar.
pub const METRICS_PORT: u16 = 15090;
/// Istio's agent port: merged metrics, application probes.
pub const AGENT_PORT: u16 = 15020;
/// Envoy's admin port in an Istio sidecar.
pub const ADMIN_PORT: u16 = 15000;

/// The whole configuration of `remora run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Addresses the capture, readiness and metrics listeners bind. An IPv6 address that the
    /// machine cannot bind (IPv6 disabled) is skipped with a warning.
    pub bind_addresses: Vec<IpAddr>,
    /// The outbound capture listener: traffic the application sends out.
    pub outbound: OutboundConfig,
    /// The inbound capture listener: traffic arriving for the application.
    pub inbound: InboundConfig,
    /// Readiness endpoint (`GET /healthz/ready`).
    pub readiness: PortConfig,
    /// Prometheus endpoint (`GET /stats/prometheus`).
    pub metrics: PortConfig,
    /// The port Istio's agent serves: merged metrics, readiness, application probes.
    pub agent: AgentConfig,
    /// Admin endpoint, loopback only by default.
    pub admin: AdminConfig,
    /// What happens on SIGTERM.
    pub drain: DrainConfig,
    /// Per-connection access log.
    pub access_log: AccessLogConfig,
    /// How the config file is watched for changes.
    pub reload: ReloadConfig,
    /// Explicit listeners, each forwarding to one upstream. When any is given, Remora runs as a
    /// plain proxy (no capture listeners: no iptables, no root), as on a laptop or in a
    /// benchmark.
    pub listeners: Vec<ListenerConfig>,
    /// Telling HTTP from opaque TCP on the capture listeners.
    pub detection: DetectionConfig,
    /// Protocols declared per destination port, with Istio's protocol names; a declared port
    /// skips detection. Ports in [`ALWAYS_TCP_PORTS`] are TCP unless declared otherwise here.
    pub ports: BTreeMap<u16, PortProtocol>,
    /// Opaque TCP connections.
    pub tcp: TcpConfig,
    /// HTTP limits, timeouts, the upstream connection pool and retries.
    pub http: HttpConfig,
    /// The DNS forwarder that `remora capture --redirect-dns` sends port 53 to.
    pub dns: DnsConfig,
    /// The workload's certificate files (its SPIFFE identity), and TLS settings.
    pub tls: TlsConfig,
    /// Mutual TLS between sidecars: the inbound mode and the outbound mesh destinations.
    pub mesh: MeshConfig,
    /// Istio `AuthorizationPolicy` on inbound traffic, and inbound path normalisation.
    pub authorization: AuthorizationConfig,
    /// istiod: the CA that issues the workload certificate (with `discovery_address` set).
    pub istiod: IstiodConfig,
    /// Envoy discovery resources from files (routing without a control plane).
    pub xds: XdsConfig,
    /// Connection limits: how many downstream connections are kept open before new ones are
    /// refused.
    pub overload: OverloadConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            bind_addresses: vec![
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            ],
            outbound: OutboundConfig::default(),
            inbound: InboundConfig::default(),
            readiness: PortConfig::new(READINESS_PORT),
            metrics: PortConfig::new(METRICS_PORT),
            agent: AgentConfig::default(),
            admin: AdminConfig::default(),
            drain: DrainConfig::default(),
            access_log: AccessLogConfig::default(),
            reload: ReloadConfig::default(),
            listeners: Vec::new(),
            detection: DetectionConfig::default(),
            ports: BTreeMap::new(),
            tcp: TcpConfig::default(),
            http: HttpConfig::default(),
            dns: DnsConfig::default(),
            tls: TlsConfig::default(),
            mesh: MeshConfig::default(),
            authorization: AuthorizationConfig::default(),
            istiod: IstiodConfig::default(),
            xds: XdsConfig::default(),
            overload: OverloadConfig::default(),
        }
    }
}

/// One explicit listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// Where to listen, e.g. `127.0.0.1:8080`.
    pub address: SocketAddr,
    /// Where every accepted connection goes.
    pub upstream: SocketAddr,
    /// What is proxied: `tcp` copies bytes, `http` proxies HTTP/1.1 and HTTP/2 requests,
    /// `auto` detects which (as the capture listeners do).
    #[serde(default)]
    pub protocol: ListenerProtocol,
    /// Istio mutual TLS on this listener: originated to the upstream (the client's sidecar) or
    /// terminated from the clients (the server's sidecar). Unset: plaintext both sides.
    #[serde(default)]
    pub tls: Option<ListenerTls>,
}

impl ListenerConfig {
    /// Whether the listener plays the server's sidecar (it terminates mesh TLS): its traffic
    /// is inbound, as on Istio's inbound listener.
    pub fn terminates_tls(&self) -> bool {
        self.tls
            .as_ref()
            .is_some_and(|t| t.mode == ListenerTlsMode::Terminate)
    }
}

/// How an explicit listener treats its traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenerProtocol {
    /// Opaque bytes.
    #[default]
    Tcp,
    /// HTTP/1.1 or HTTP/2 (cleartext, prior knowledge), told apart by the client's first bytes.
    Http,
    /// Detect HTTP, falling back to TCP, as on the capture listeners.
    Auto,
    /// Routed by the xDS resources (`xds.resources_dir` or istiod's), as an outbound
    /// connection captured on its way to `upstream` would be: the xDS listener for that
    /// address decides TCP or HTTP, the cluster and the endpoint. Without xDS resources its
    /// connections are refused (`NR`). For tests and benchmarks without iptables.
    Xds,
}

/// Ports Istio never sniffs: server-first or otherwise non-HTTP protocols (SMTP, DNS, MySQL,
/// MongoDB). They are TCP unless `ports` declares otherwise.
pub const ALWAYS_TCP_PORTS: [u16; 4] = [25, 53, 3306, 27017];

/// A port's protocol, named as Istio names service ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PortProtocol {
    Http,
    Http2,
    Grpc,
    GrpcWeb,
    Tcp,
    Tls,
    Https,
    Mongo,
    Mysql,
    Redis,
}

impl PortProtocol {
    /// Whether Remora proxies the port as HTTP requests (the others are opaque bytes).
    pub fn is_http(self) -> bool {
        matches!(
            self,
            PortProtocol::Http | PortProtocol::Http2 | PortProtocol::Grpc | PortProtocol::GrpcWeb
        )
    }
}

/// Protocol detection on the capture listeners (and `auto` listeners).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DetectionConfig {
    /// How long to wait for the client's first bytes before the connection is taken as TCP.
    /// Server-first protocols do not wait for it: the upstream is dialled during detection and
    /// a server that speaks first makes the connection TCP at once.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// How long the client still has to say what it speaks once the upstream connection
    /// dialled during detection has failed. Its first bytes normally arrive within a round
    /// trip of the handshake, so an HTTP client gets its 503; a silent one is reset this soon
    /// instead of after `timeout`.
    #[serde(with = "humantime_serde")]
    pub after_connect_failure: Duration,
}

impl Default for DetectionConfig {
    fn default() -> Self {
        DetectionConfig {
            timeout: Duration::from_secs(5),
            after_connect_failure: Duration::from_millis(100),
        }
    }
}

/// The outbound capture listener (`istio-iptables -p`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboundConfig {
    pub port: NonZeroU16,
    /// Bound on connecting to the original destination (Istio's mesh default is 10 s).
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
}

impl Default for OutboundConfig {
    fn default() -> Self {
        OutboundConfig {
            port: nonzero(OUTBOUND_PORT),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// The inbound capture listener (`istio-iptables -z`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InboundConfig {
    pub port: NonZeroU16,
    /// Bound on connecting to the application.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Source address of connections to the application over IPv4. The capture rules let
    /// traffic from it through (`-o lo -s 127.0.0.6/32 -j RETURN`), so the hop is not captured
    /// again; changing it without changing the rules makes inbound traffic loop.
    pub passthrough_source_v4: Ipv4Addr,
    /// The same for IPv6 (`::6`, which capture adds to `lo`).
    pub passthrough_source_v6: Ipv6Addr,
    /// How capture delivers inbound traffic: `redirect` (NAT to the port; the application sees
    /// connections from the passthrough source) or `tproxy` (`remora capture -m TPROXY`: the
    /// listener is transparent and the application sees the original client's address).
    /// Istio's `interceptionMode`; `ISTIO_META_INTERCEPTION_MODE` in the environment sets it.
    pub interception_mode: InterceptionMode,
    /// In `tproxy` mode, the mark on connections to the application, so the capture rules
    /// route the application's answers back to Remora (`remora capture --istio-inbound-tproxy-mark`,
    /// 1337; Envoy's `original_src` mark in Istio).
    pub tproxy_mark: u32,
}

/// How inbound traffic reaches the inbound listener (Istio's `interceptionMode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InterceptionMode {
    /// NAT `REDIRECT`: the original destination comes from conntrack.
    #[default]
    #[serde(alias = "REDIRECT")]
    Redirect,
    /// `TPROXY`: the original destination is the socket's local address and the client's
    /// address is kept on the connection to the application.
    #[serde(alias = "TPROXY")]
    Tproxy,
}

impl Default for InboundConfig {
    fn default() -> Self {
        InboundConfig {
            port: nonzero(INBOUND_PORT),
            connect_timeout: Duration::from_secs(10),
            passthrough_source_v4: Ipv4Addr::new(127, 0, 0, 6),
            passthrough_source_v6: Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6),
            interception_mode: InterceptionMode::Redirect,
            tproxy_mark: 1337,
        }
    }
}

/// A listener that only needs a port; it binds every address in `bind_addresses`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortConfig {
    pub port: NonZeroU16,
}

impl PortConfig {
    fn new(port: u16) -> Self {
        PortConfig {
            port: nonzero(port),
        }
    }
}

/// Istio's agent port (15020): what pods, probes and docs already point at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    pub port: NonZeroU16,
    /// Bound on scraping the application's own metrics for the merged `/stats/prometheus`.
    #[serde(with = "humantime_serde")]
    pub app_scrape_timeout: Duration,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            port: nonzero(AGENT_PORT),
            app_scrape_timeout: Duration::from_secs(2),
        }
    }
}

/// The admin listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    pub address: SocketAddr,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            address: SocketAddr::from((Ipv4Addr::LOCALHOST, ADMIN_PORT)),
        }
    }
}

/// Shutdown behaviour on SIGTERM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DrainConfig {
    /// How long open connections may keep going after SIGTERM (Istio's
    /// `terminationDrainDuration`, 5 s).
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
    /// Exit once no connection is left instead of waiting out `duration`: the open
    /// connections are counted once a second after `minimum_duration`, as pilot-agent counts
    /// Envoy's. The `EXIT_ON_ZERO_ACTIVE_CONNECTIONS` environment variable, as in Istio, also
    /// sets it.
    pub exit_on_zero_active_connections: bool,
    /// With `exit_on_zero_active_connections`, stay at least this long (Istio's
    /// `MINIMUM_DRAIN_DURATION`, which defaults to 5 s there), giving load balancers time to
    /// stop sending new connections before the count is trusted. 0 here, unless Istio's
    /// `EXIT_ON_ZERO_ACTIVE_CONNECTIONS` asked for exit-on-zero without a minimum: then
    /// pilot-agent's 5 s.
    #[serde(with = "humantime_serde")]
    pub minimum_duration: Duration,
    /// How long the connections of a listener filter chain that an xDS update changed or
    /// removed keep going: told to go at once (HTTP/1.1 `connection: close`, HTTP/2 GOAWAY),
    /// closed when this has passed (Envoy's `--drain-time-s`, which pilot-agent sets from
    /// ProxyConfig's `drainDuration`, 45 s). `drainDuration` in `PROXY_CONFIG` wins over it.
    #[serde(with = "humantime_serde")]
    pub drain_time: Duration,
}

impl Default for DrainConfig {
    fn default() -> Self {
        DrainConfig {
            duration: Duration::from_secs(5),
            exit_on_zero_active_connections: false,
            minimum_duration: Duration::ZERO,
            drain_time: Duration::from_secs(45),
        }
    }
}

/// Per-connection access log, written to stdout.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AccessLogConfig {
    /// Off by default, as in Istio's default profile.
    pub enabled: bool,
    pub format: AccessLogFormat,
}

/// Shape of an access-log line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessLogFormat {
    /// `key=value` pairs on one line.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Watching the config file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReloadConfig {
    /// How often the file is polled where its directory cannot be watched (inotify); SIGHUP
    /// reloads at once.
    #[serde(with = "humantime_serde")]
    pub watch_interval: Duration,
}

impl Default for ReloadConfig {
    fn default() -> Self {
        ReloadConfig {
            watch_interval: Duration::from_secs(1),
        }
    }
}

impl Config {
    /// The protocol declared for a destination port, if any: `ports` first, then Istio's
    /// always-TCP ports.
    pub fn declared_protocol(&self, port: u16) -> Option<PortProtocol> {
        match self.ports.get(&port) {
            Some(p) => Some(*p),
            None if ALWAYS_TCP_PORTS.contains(&port) => Some(PortProtocol::Tcp),
            None => None,
        }
    }

    /// Ports of every listener Remora binds. A connection whose original destination is one of
    /// these (on a local address) would loop into Remora itself.
    pub fn own_ports(&self) -> [u16; 6] {
        [
            self.outbound.port.get(),
            self.inbound.port.get(),
            self.readiness.port.get(),
            self.metrics.port.get(),
            self.agent.port.get(),
            self.admin.address.port(),
        ]
    }

    /// Checks that span fields. Returns the dotted path of the offending field and why.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        if self.bind_addresses.is_empty() {
            return Err((
                "bind_addresses".into(),
                "must list at least one address".into(),
            ));
        }
        let named = [
            ("outbound.port", self.outbound.port.get()),
            ("inbound.port", self.inbound.port.get()),
            ("readiness.port", self.readiness.port.get()),
            ("metrics.port", self.metrics.port.get()),
            ("agent.port", self.agent.port.get()),
            ("admin.address", self.admin.address.port()),
            ("dns.port", self.dns.port.get()),
        ];
        for (i, (name, port)) in named.iter().enumerate() {
            if let Some((other, _)) = named[..i].iter().find(|(_, p)| p == port) {
                return Err((
                    name.to_string(),
                    format!("port {port} is already used by `{other}`"),
                ));
            }
        }
        let side_ports = [
            self.readiness.port.get(),
            self.metrics.port.get(),
            self.agent.port.get(),
            self.admin.address.port(),
        ];
        for (i, l) in self.listeners.iter().enumerate() {
            let field = format!("listeners.{i}.address");
            if l.address.port() == 0 {
                return Err((field, "must name a port".into()));
            }
            if side_ports.contains(&l.address.port()) {
                return Err((
                    field,
                    format!(
                        "port {} is taken by readiness, metrics or admin",
                        l.address.port()
                    ),
                ));
            }
            if self.listeners[..i].iter().any(|o| o.address == l.address) {
                return Err((field, format!("{} is listed twice", l.address)));
            }
            // A wildcard address takes its port on every address of its family (IPv6 sockets
            // are bound v6-only), so the second bind would fail at start-up.
            let overlaps = |o: &ListenerConfig| {
                let (a, b) = (o.address, l.address);
                a.port() == b.port()
                    && a.is_ipv4() == b.is_ipv4()
                    && (a.ip().is_unspecified() || b.ip().is_unspecified())
            };
            if let Some(o) = self.listeners[..i].iter().find(|o| overlaps(o)) {
                return Err((
                    field,
                    format!(
                        "{} overlaps {}: both bind port {}",
                        l.address,
                        o.address,
                        l.address.port()
                    ),
                ));
            }
            if self.dns.enabled && l.address.port() == self.dns.port.get() {
                return Err((
                    field,
                    format!(
                        "port {} is taken by the DNS forwarder (dns.port)",
                        l.address.port()
                    ),
                ));
            }
            if l.upstream == l.address {
                return Err((
                    format!("listeners.{i}.upstream"),
                    "is the listener itself: every connection would loop".into(),
                ));
            }
            if l.protocol == ListenerProtocol::Xds && l.tls.is_some() {
                return Err((
                    format!("listeners.{i}.tls"),
                    "does not go with protocol xds: the xDS resources say each endpoint's transport"
                        .into(),
                ));
            }
            if let Some(tls) = &l.tls {
                tls.validate(self.has_identity_source())
                    .map_err(|(f, why)| (format!("listeners.{i}.tls{f}"), why))?;
            }
        }
        for (name, d) in [
            ("outbound.connect_timeout", self.outbound.connect_timeout),
            ("inbound.connect_timeout", self.inbound.connect_timeout),
            ("reload.watch_interval", self.reload.watch_interval),
            ("agent.app_scrape_timeout", self.agent.app_scrape_timeout),
            ("detection.timeout", self.detection.timeout),
            ("http.header_read_timeout", self.http.header_read_timeout),
            ("http.idle_timeout", self.http.idle_timeout),
            ("http.pool_idle_timeout", self.http.pool_idle_timeout),
        ] {
            if d.is_zero() {
                return Err((name.into(), "must be greater than zero".into()));
            }
        }
        // hyper cannot read a request line and headers in less than this.
        if self.http.max_header_bytes < 8192 {
            return Err((
                "http.max_header_bytes".into(),
                "must be at least 8192".into(),
            ));
        }
        if self.http.request_body_min_rate == 0 {
            return Err((
                "http.request_body_min_rate".into(),
                "must be greater than zero (turn the bound off with http.request_body_timeout: 0s)"
                    .into(),
            ));
        }
        for (name, n) in [
            ("http.max_headers", self.http.max_headers),
            (
                "http.max_concurrent_streams",
                self.http.max_concurrent_streams as usize,
            ),
        ] {
            if n == 0 {
                return Err((name.into(), "must be greater than zero".into()));
            }
        }
        if self.ports.contains_key(&0) {
            return Err(("ports".into(), "port 0 cannot be declared".into()));
        }
        if self.inbound.interception_mode == InterceptionMode::Tproxy
            && self.inbound.tproxy_mark == 0
        {
            return Err((
                "inbound.tproxy_mark".into(),
                "must not be 0 in tproxy mode: unmarked answers from the application would not \
                 come back to Remora"
                    .into(),
            ));
        }
        self.dns.validate()?;
        self.tls.validate()?;
        self.authorization.validate()?;
        self.istiod.validate()?;
        self.xds.validate()?;
        self.overload.validate()?;
        self.mesh.validate(self.has_identity_source())
    }

    /// Whether a workload certificate can be had: from files, or from istiod's CA.
    pub fn has_identity_source(&self) -> bool {
        self.tls.cert_dir.is_some() || self.istiod.discovery_address.is_some()
    }
}

fn nonzero(port: u16) -> NonZeroU16 {
    // Only called with the non-zero constants above.
    NonZeroU16::new(port).unwrap_or(NonZeroU16::MIN)
}
