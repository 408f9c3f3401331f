//! What istio-iptables learns from the pod rather than from flags: whether the pod is IPv6,
//! and which nameservers /etc/resolv.conf lists.
//!
//! [`PodNetwork`] is the seam: [`SystemPodNetwork`] asks the machine, tests answer directly.
//! The decisions themselves ([`pod_is_ipv6`], [`parse_resolv_conf`]) are pure functions.

use std::net::IpAddr;
use std::path::Path;

use crate::error::CaptureError;

/// Where nameservers are read from when `--dns-servers` is not given.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// Facts about the pod's network that capture depends on.
pub trait PodNetwork {
    /// Whether the pod is IPv6 (and so needs ip6tables rules too).
    fn is_ipv6(&self, dual_stack: bool) -> Result<bool, CaptureError>;
    /// The `nameserver` entries of resolv.conf, as written.
    fn nameservers(&self) -> Result<Vec<String>, CaptureError>;
}

/// Reads the facts from this machine (its interfaces and /etc/resolv.conf).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemPodNetwork;

impl PodNetwork for SystemPodNetwork {
    fn is_ipv6(&self, dual_stack: bool) -> Result<bool, CaptureError> {
        Ok(pod_is_ipv6(interface_addresses()?, dual_stack))
    }

    fn nameservers(&self) -> Result<Vec<String>, CaptureError> {
        read_resolv_conf()
    }
}

/// Like [`SystemPodNetwork`], but looks at the interfaces of another network namespace
/// (`--network-namespace`). resolv.conf is still read from this machine's filesystem, as
/// istio-iptables does.
#[derive(Debug, Clone)]
pub struct NetnsPodNetwork {
    /// The namespace's path.
    pub path: std::path::PathBuf,
}

impl PodNetwork for NetnsPodNetwork {
    fn is_ipv6(&self, dual_stack: bool) -> Result<bool, CaptureError> {
        let addrs = crate::netns::run_in(Some(&self.path), interface_addresses)??;
        Ok(pod_is_ipv6(addrs, dual_stack))
    }

    fn nameservers(&self) -> Result<Vec<String>, CaptureError> {
        read_resolv_conf()
    }
}

fn interface_addresses() -> Result<Vec<IpAddr>, CaptureError> {
    let addrs = nix::ifaddrs::getifaddrs()
        .map_err(|e| CaptureError::Interfaces(std::io::Error::from(e)))?;
    Ok(addrs
        .filter_map(|a| {
            let addr = a.address?;
            match (addr.as_sockaddr_in(), addr.as_sockaddr_in6()) {
                (Some(v4), _) => Some(IpAddr::V4(v4.ip())),
                (_, Some(v6)) => Some(IpAddr::V6(v6.ip())),
                _ => None,
            }
        })
        .collect())
}

fn read_resolv_conf() -> Result<Vec<String>, CaptureError> {
    let path = Path::new(RESOLV_CONF);
    let text = std::fs::read_to_string(path).map_err(|source| CaptureError::ResolvConf {
        path: path.to_owned(),
        source,
    })?;
    Ok(parse_resolv_conf(&text))
}

/// Decides whether the pod is IPv6 from its addresses, in the order the kernel lists them
/// (IPv4 before IPv6), ignoring loopback and link-local ones.
///
/// As in istio-iptables, the first such address decides, unless `dual_stack` is set, in which
/// case any IPv6 address makes the pod IPv6. Unlike istio-iptables, which fails, a pod with no
/// such address is taken to be IPv4: that is the safe choice, since it only omits ip6tables
/// rules that a pod without addresses cannot use anyway.
pub fn pod_is_ipv6(addrs: impl IntoIterator<Item = IpAddr>, dual_stack: bool) -> bool {
    let mut usable = addrs.into_iter().map(unmap).filter(is_usable);
    if dual_stack {
        usable.any(|a| a.is_ipv6())
    } else {
        usable.next().is_some_and(|a| a.is_ipv6())
    }
}

fn unmap(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

fn is_usable(addr: &IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local() && !v4.is_multicast(),
        IpAddr::V6(v6) => {
            let link_local_unicast = (v6.segments()[0] & 0xffc0) == 0xfe80;
            let link_local_multicast = (v6.segments()[0] & 0xff0f) == 0xff02;
            !v6.is_loopback() && !link_local_unicast && !link_local_multicast
        }
    }
}

/// The `nameserver` entries of a resolv.conf, in order and as written.
pub fn parse_resolv_conf(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.starts_with(';'))
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            match (fields.next(), fields.next()) {
                (Some("nameserver"), Some(server)) => Some(server.to_owned()),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn first_usable_address_decides() {
        assert!(!pod_is_ipv6(
            ips(&["127.0.0.1", "10.1.1.1", "fd00::1"]),
            false
        ));
        assert!(pod_is_ipv6(
            ips(&["127.0.0.1", "::1", "fe80::1", "fd00::1"]),
            false
        ));
        assert!(!pod_is_ipv6(
            ips(&["169.254.1.1", "::ffff:10.0.0.1", "fd00::1"]),
            false
        ));
    }

    #[test]
    fn dual_stack_prefers_any_ipv6() {
        assert!(pod_is_ipv6(ips(&["10.1.1.1", "fd00::1"]), true));
        assert!(!pod_is_ipv6(ips(&["10.1.1.1", "fe80::1"]), true));
    }

    #[test]
    fn no_usable_address_means_ipv4() {
        assert!(!pod_is_ipv6(ips(&["127.0.0.1", "::1"]), false));
        assert!(!pod_is_ipv6(Vec::new(), true));
    }

    #[test]
    fn this_machine_can_be_asked() {
        SystemPodNetwork.is_ipv6(false).expect("getifaddrs works");
    }

    #[test]
    fn reads_nameserver_lines() {
        let text = "# comment\nsearch svc.local\nnameserver 10.96.0.10\n; nameserver 1.1.1.1\n\
                    nameserver\tfd00::10 \noptions ndots:5\nnameserver\n";
        assert_eq!(parse_resolv_conf(text), ["10.96.0.10", "fd00::10"]);
    }
}
