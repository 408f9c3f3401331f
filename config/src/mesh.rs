//! The `tls:` and `mesh:` sections: the workload's certificate files, and where mutual TLS is
//! required (inbound) and originated (outbound, to declared mesh destinations).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// The workload's identity: certificate files in Istio's layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Directory holding the three files below: `/etc/certs` (Istio's mounted certificates),
    /// `/var/run/secrets/workload-spiffe-credentials` (cert-manager's CSI driver). Unset: no
    /// identity, so no mutual TLS in either direction.
    pub cert_dir: Option<PathBuf>,
    /// The workload's certificate, then its intermediates, in PEM.
    pub cert_chain_file: String,
    /// The workload's private key in PEM (PKCS#8, SEC1 or PKCS#1).
    pub key_file: String,
    /// The mesh's trust roots in PEM.
    pub root_cert_file: String,
    /// How often the files are polled for a rotated certificate where their directory cannot
    /// be watched (inotify); new handshakes use it, open connections keep theirs.
    #[serde(with = "humantime_serde")]
    pub watch_interval: Duration,
    /// Bound on a TLS handshake, both directions; a peer that takes longer is closed.
    #[serde(with = "humantime_serde")]
    pub handshake_timeout: Duration,
    /// Oldest TLS version accepted and offered (Istio's `minProtocolVersion` names).
    pub min_protocol_version: TlsVersion,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert_dir: None,
            cert_chain_file: "cert-chain.pem".into(),
            key_file: "key.pem".into(),
            root_cert_file: "root-cert.pem".into(),
            watch_interval: Duration::from_secs(1),
            handshake_timeout: Duration::from_secs(10),
            min_protocol_version: TlsVersion::Tls13,
        }
    }
}

/// A TLS protocol version, spelt as Istio and Envoy spell them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TlsVersion {
    #[serde(rename = "TLSV1_2", alias = "TLSv1_2", alias = "tlsv1_2")]
    Tls12,
    #[serde(rename = "TLSV1_3", alias = "TLSv1_3", alias = "tlsv1_3")]
    Tls13,
}

/// Mutual TLS between sidecars.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshConfig {
    /// What the inbound listener accepts (Istio's `PeerAuthentication` mode). Needs
    /// `tls.cert_dir`, except `disable`.
    pub mtls_mode: MtlsMode,
    /// Destinations that are sidecars of the mesh: traffic to them leaves in mutual TLS. The
    /// first entry that matches a destination applies.
    pub destinations: Vec<MeshDestination>,
    /// Bound on Istio's metadata exchange on an `istio-peer-exchange` connection: writing our
    /// header and reading the peer's. A peer that takes longer is closed.
    #[serde(with = "humantime_serde")]
    pub metadata_exchange_timeout: Duration,
}

impl Default for MeshConfig {
    fn default() -> Self {
        MeshConfig {
            mtls_mode: MtlsMode::default(),
            destinations: Vec::new(),
            metadata_exchange_timeout: Duration::from_secs(10),
        }
    }
}

/// Istio's `PeerAuthentication` modes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MtlsMode {
    /// Mesh mutual TLS is terminated; plaintext and the application's own TLS pass.
    #[default]
    #[serde(alias = "PERMISSIVE")]
    Permissive,
    /// Only mesh mutual TLS is accepted.
    #[serde(alias = "STRICT")]
    Strict,
    /// Nothing is terminated: mesh TLS passes through as opaque bytes.
    #[serde(alias = "DISABLE")]
    Disable,
}

/// One group of mesh destinations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeshDestination {
    /// Addresses (`10.0.0.0/8`, or one address) of the sidecars.
    pub cidrs: Vec<Cidr>,
    /// Destination ports; empty means every port.
    #[serde(default)]
    pub ports: Vec<u16>,
    /// The service's name (`reviews.default.svc.cluster.local`): the SNI becomes Istio's
    /// `outbound_.PORT_._.HOSTNAME`, and metrics name the destination service.
    #[serde(default)]
    pub hostname: Option<String>,
    /// SPIFFE IDs the server's certificate must carry one of; empty accepts any certificate
    /// that chains to the trust roots.
    #[serde(default)]
    pub identities: Vec<String>,
}

/// Istio mutual TLS on an explicit listener, with the workload certificate of `tls:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTls {
    /// Which side of the mesh hop the listener is.
    pub mode: ListenerTlsMode,
    /// `originate`: the upstream's service name; the SNI becomes Istio's
    /// `outbound_.PORT_._.HOSTNAME`. Unset: no SNI.
    #[serde(default)]
    pub hostname: Option<String>,
    /// SPIFFE IDs the peer's certificate must carry one of: the server's for `originate`, the
    /// client's for `terminate`. Empty accepts any certificate that chains to the trust roots.
    #[serde(default)]
    pub identities: Vec<String>,
}

/// The two sides of a mesh hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenerTlsMode {
    /// The client's sidecar: plaintext in, mutual TLS to the upstream with Istio's ALPN values
    /// and SNI, the server's SPIFFE ID checked (as to a `mesh.destinations` entry).
    Originate,
    /// The server's sidecar: only mutual TLS in, with a client certificate from the mesh
    /// roots; plaintext to the upstream, HTTP with `x-forwarded-client-cert` (as on the
    /// inbound listener in `strict` mode). Counted as inbound.
    Terminate,
}

impl ListenerTls {
    /// Field checks; returns the field under the listener's `tls` and why.
    pub(crate) fn validate(&self, has_identity: bool) -> Result<(), (String, String)> {
        if !has_identity {
            return Err((
                String::new(),
                "mutual TLS on a listener needs a workload certificate: set tls.cert_dir or \
                 istiod.discovery_address"
                    .into(),
            ));
        }
        if self.hostname.is_some() && self.mode == ListenerTlsMode::Terminate {
            return Err((
                ".hostname".into(),
                "only an originating listener sends SNI; a terminating one accepts any".into(),
            ));
        }
        if let Some(host) = &self.hostname {
            let valid = !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
            if !valid {
                return Err((".hostname".into(), format!("`{host}` is not a DNS name")));
            }
        }
        check_spiffe_ids(&self.identities).map_err(|why| (".identities".into(), why))
    }
}

/// Every entry must be a SPIFFE ID.
fn check_spiffe_ids(ids: &[String]) -> Result<(), String> {
    match ids.iter().find(|id| !id.starts_with("spiffe://")) {
        Some(id) => Err(format!(
            "`{id}` is not a SPIFFE ID (spiffe://TRUST-DOMAIN/ns/NS/sa/SA)"
        )),
        None => Ok(()),
    }
}

impl MeshConfig {
    /// The first destination entry that covers `ip:port`.
    pub fn destination(&self, ip: IpAddr, port: u16) -> Option<&MeshDestination> {
        self.destinations.iter().find(|d| {
            d.cidrs.iter().any(|c| c.contains(ip))
                && (d.ports.is_empty() || d.ports.contains(&port))
        })
    }

    /// Field checks; returns the field under `mesh.` and why.
    pub(crate) fn validate(&self, has_identity: bool) -> Result<(), (String, String)> {
        if self.metadata_exchange_timeout.is_zero() {
            return Err((
                "mesh.metadata_exchange_timeout".into(),
                "must be greater than zero".into(),
            ));
        }
        if !has_identity {
            if self.mtls_mode == MtlsMode::Strict {
                return Err((
                    "mesh.mtls_mode".into(),
                    "strict needs a workload certificate: set tls.cert_dir or \
                     istiod.discovery_address"
                        .into(),
                ));
            }
            if !self.destinations.is_empty() {
                return Err((
                    "mesh.destinations".into(),
                    "mutual TLS to mesh destinations needs a workload certificate: set \
                     tls.cert_dir or istiod.discovery_address"
                        .into(),
                ));
            }
        }
        for (i, d) in self.destinations.iter().enumerate() {
            if d.cidrs.is_empty() {
                return Err((
                    format!("mesh.destinations.{i}.cidrs"),
                    "must list at least one address range".into(),
                ));
            }
            if d.ports.contains(&0) {
                return Err((
                    format!("mesh.destinations.{i}.ports"),
                    "port 0 cannot be a destination".into(),
                ));
            }
            check_spiffe_ids(&d.identities)
                .map_err(|why| (format!("mesh.destinations.{i}.identities"), why))?;
        }
        Ok(())
    }
}

impl TlsConfig {
    /// Field checks; returns the field under `tls.` and why.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        for (name, d) in [
            ("watch_interval", self.watch_interval),
            ("handshake_timeout", self.handshake_timeout),
        ] {
            if d.is_zero() {
                return Err((format!("tls.{name}"), "must be greater than zero".into()));
            }
        }
        Ok(())
    }
}

/// An address range, `10.0.0.0/8` or `fd00::/8`; a bare address is a range of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    /// Whether `ip` is in the range. An IPv4-mapped IPv6 address counts as its IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl From<IpAddr> for Cidr {
    /// The range of one address.
    fn from(addr: IpAddr) -> Self {
        let prefix = if addr.is_ipv4() { 32 } else { 128 };
        Cidr { addr, prefix }
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not an address or address range"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.trim().parse::<u8>() {
                Ok(p) if p <= max => p,
                _ => return Err(format!("`{s}`: the prefix length must be 0 to {max}")),
            },
        };
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Serialize for Cidr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_and_match() {
        let c: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(c.contains("10.1.200.3".parse().unwrap()));
        assert!(!c.contains("10.2.0.1".parse().unwrap()));
        assert!(c.contains("::ffff:10.1.0.9".parse().unwrap()));
        let one: Cidr = "198.18.0.2".parse().unwrap();
        assert_eq!(one.prefix, 32);
        assert!(one.contains("198.18.0.2".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd00::1".parse().unwrap()));
        assert!(!v6.contains("10.0.0.1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("ten".parse::<Cidr>().is_err());
    }
}
