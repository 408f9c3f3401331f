//! The config schema. Every struct denies unknown fields, so a typo is an error with a line number,
//! not a silently ignored setting. Defaults are Istio's sidecar defaults.

use serde::{Deserialize, Serialize};
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
            admin: AdminConfig::default(),
            drain: DrainConfig::default(),
            access_log: AccessLogConfig::default(),
            reload: ReloadConfig::default(),
            listeners: Vec::new(),
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
    /// What is proxied; `tcp` copies bytes (HTTP-aware modes come with HTTP support).
    #[serde(default)]
    pub protocol: ListenerProtocol,
}

/// How an explicit listener treats its traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenerProtocol {
    /// Opaque bytes.
    #[default]
    Tcp,
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
}

impl Default for InboundConfig {
    fn default() -> Self {
        InboundConfig {
            port: nonzero(INBOUND_PORT),
            connect_timeout: Duration::from_secs(10),
            passthrough_source_v4: Ipv4Addr::new(127, 0, 0, 6),
            passthrough_source_v6: Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6),
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
    /// Exit as soon as no connection is left instead of waiting out `duration`.
    /// The `EXIT_ON_ZERO_ACTIVE_CONNECTIONS` environment variable, as in Istio, also sets it.
    pub exit_on_zero_active_connections: bool,
}

impl Default for DrainConfig {
    fn default() -> Self {
        DrainConfig {
            duration: Duration::from_secs(5),
            exit_on_zero_active_connections: false,
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
    /// How often the file is checked for changes; SIGHUP reloads at once.
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
    /// Ports of every listener Remora binds. A connection whose original destination is one of
    /// these (on a local address) would loop into Remora itself.
    pub fn own_ports(&self) -> [u16; 5] {
        [
            self.outbound.port.get(),
            self.inbound.port.get(),
            self.readiness.port.get(),
            self.metrics.port.get(),
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
            ("admin.address", self.admin.address.port()),
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
            if l.upstream == l.address {
                return Err((
                    format!("listeners.{i}.upstream"),
                    "is the listener itself: every connection would loop".into(),
                ));
            }
        }
        for (name, d) in [
            ("outbound.connect_timeout", self.outbound.connect_timeout),
            ("inbound.connect_timeout", self.inbound.connect_timeout),
            ("reload.watch_interval", self.reload.watch_interval),
        ] {
            if d.is_zero() {
                return Err((name.into(), "must be greater than zero".into()));
            }
        }
        Ok(())
    }
}

fn nonzero(port: u16) -> NonZeroU16 {
    // Only called with the non-zero constants above.
    NonZeroU16::new(port).unwrap_or(NonZeroU16::MIN)
}
