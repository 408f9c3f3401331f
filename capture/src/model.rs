//! The validated inputs of the rule generator, and their resolution from flags, environment
//! and pod facts.
//!
//! Resolution follows istio-iptables: a flag given on the command line wins, else its
//! environment variable, else its default. Values that end up inside the restore input are
//! checked to be single tokens (no spaces, quotes or control characters) so that no flag can
//! smuggle an extra option or line into the rules.

use std::net::IpAddr;

use crate::cidr::Cidr;
use crate::error::{CaptureError, FlagError};
use crate::flags::{flag_or_env, var, CaptureArgs, Environment};
use crate::pod_network::PodNetwork;

/// UID (and GID) of the proxy when `-u` is not given.
pub const DEFAULT_PROXY_UID: &str = "1337";
/// Owner groups that istio-iptables accepts at most in the "capture only these" form: they all
/// go into one rule, and kernels cap the number of matches per rule.
pub const MAX_OWNER_GROUPS_INCLUDE: usize = 64;

/// Everything the rules depend on, resolved and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureConfig {
    /// Outbound capture port (`-p`).
    pub proxy_port: String,
    /// Inbound capture port (`-z`).
    pub inbound_capture_port: String,
    /// Inbound tunnel port, never captured (`-e`).
    pub inbound_tunnel_port: String,
    /// UIDs whose traffic is the proxy's own (`-u`).
    pub proxy_uids: Vec<String>,
    /// GIDs whose traffic is the proxy's own (`-g`).
    pub proxy_gids: Vec<String>,
    /// How inbound traffic is captured (`-m`).
    pub mode: InterceptionMode,
    /// Packet mark for TPROXY mode (`-t`).
    pub tproxy_mark: String,
    /// Routing table for TPROXY mode (`-r`); used for routes, never in rules.
    pub tproxy_route_table: String,
    /// Which inbound ports are captured (`-b`, `-d`).
    pub inbound: InboundCapture,
    /// Which outbound destinations are captured (`-i`).
    pub outbound_cidrs: OutboundCidrs,
    /// Outbound destinations never captured (`-x`).
    pub outbound_exclude_cidrs: CidrsByFamily,
    /// Outbound ports always captured (`-q`).
    pub outbound_ports: Vec<String>,
    /// Outbound ports never captured (`-o`).
    pub outbound_exclude_ports: Vec<String>,
    /// Interfaces whose inbound traffic is handled as outbound (`-k`).
    pub kube_virt_interfaces: Vec<String>,
    /// Interfaces never captured (`-c`).
    pub exclude_interfaces: Vec<String>,
    /// Whose outbound traffic is captured, by group (`ISTIO_OUTBOUND_OWNER_GROUPS[_EXCLUDE]`).
    pub owner_groups: OwnerGroups,
    /// IPv4 range of the app's own loopback traffic (`ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`).
    pub ipv4_loopback_cidr: String,
    /// DNS capture (`--redirect-dns`, `--capture-all-dns`, nameservers).
    pub dns: DnsCapture,
    /// Drop packets conntrack considers invalid (`--drop-invalid`).
    pub drop_invalid: bool,
    /// The pod is IPv6: emit ip6tables rules too.
    pub ipv6: bool,
}

/// How inbound connections reach the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterceptionMode {
    /// NAT to the inbound port (nat table).
    Redirect,
    /// Transparent proxying that keeps the source address (mangle table, policy routing).
    Tproxy,
}

/// Which inbound ports are captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboundCapture {
    /// `-b ''`: none.
    Off,
    /// `-b '*'`: all but these ports.
    AllExcept(Vec<String>),
    /// `-b LIST`: these ports (possibly none, if the list was only commas).
    Only(Vec<String>),
}

/// Which outbound destinations are captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboundCidrs {
    /// `-i '*'`.
    All,
    /// `-i LIST` (empty for `-i ''`).
    Only(CidrsByFamily),
}

/// CIDRs split by IP family, each list in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CidrsByFamily {
    /// IPv4 ranges.
    pub v4: Vec<Cidr>,
    /// IPv6 ranges.
    pub v6: Vec<Cidr>,
}

impl CidrsByFamily {
    /// Whether any range of either family is a loopback range.
    pub fn has_loopback(&self) -> bool {
        self.v4.iter().chain(&self.v6).any(Cidr::is_loopback)
    }
}

/// Whose outbound traffic is captured, by owning group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerGroups {
    /// Every group except these (the default: every group).
    AllExcept(Vec<String>),
    /// Only these groups.
    Only(Vec<String>),
}

/// What DNS traffic is sent to the agent's DNS proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DnsCapture {
    /// None.
    Off,
    /// All port-53 traffic (`--capture-all-dns`).
    AllPort53,
    /// Port-53 traffic to these nameservers, as written.
    Servers {
        /// IPv4 nameservers.
        v4: Vec<String>,
        /// IPv6 nameservers.
        v6: Vec<String>,
    },
}

impl CaptureConfig {
    /// Resolves the flags, their environment fallbacks and the pod's facts into a config.
    ///
    /// `net` is consulted only where istio-iptables would look at the machine: for IPv6
    /// unless `--assume-ipv6`, and for nameservers only with `--redirect-dns`, without
    /// `--capture-all-dns` and without `--dns-servers`.
    pub fn resolve(
        args: &CaptureArgs,
        env: &Environment,
        net: &dyn PodNetwork,
    ) -> Result<CaptureConfig, CaptureError> {
        let input = |cli, flag, var| Input::pick(cli, flag, var, env);

        let proxy_port = input(&args.envoy_port, "--envoy-port", None).port("15001")?;
        let inbound_capture_port = input(
            &args.inbound_capture_port,
            "--inbound-capture-port",
            Some(var::INBOUND_CAPTURE_PORT),
        )
        .port("15006")?;
        let inbound_tunnel_port = input(
            &args.inbound_tunnel_port,
            "--inbound-tunnel-port",
            Some(var::INBOUND_TUNNEL_PORT),
        )
        .port("15008")?;

        // As in istio-iptables, an empty -u/-g is the same as none; -g defaults to -u.
        let uids = input(&args.proxy_uid, "--proxy-uid", Some(var::PROXY_UID));
        let uids = uids.or_if_empty(DEFAULT_PROXY_UID);
        let gids = input(&args.proxy_gid, "--proxy-gid", Some(var::PROXY_GID));
        let gids = gids.or_if_empty(uids.value);
        let (proxy_uids, proxy_gids) = (uids.list()?, gids.list()?);

        let mode = input(
            &args.inbound_interception_mode,
            "--istio-inbound-interception-mode",
            Some(var::INTERCEPTION_MODE),
        );
        let mode = match mode.value {
            "" | "REDIRECT" => InterceptionMode::Redirect,
            "TPROXY" => InterceptionMode::Tproxy,
            other => return Err(mode.error(other, "expected REDIRECT or TPROXY").into()),
        };
        let mark = input(
            &args.inbound_tproxy_mark,
            "--istio-inbound-tproxy-mark",
            Some(var::TPROXY_MARK),
        );
        let table = input(
            &args.inbound_tproxy_route_table,
            "--istio-inbound-tproxy-route-table",
            Some(var::TPROXY_ROUTE_TABLE),
        );
        // istio-iptables only parses these as numbers when it sets up TPROXY routes.
        let tproxy = mode == InterceptionMode::Tproxy;
        let tproxy_mark = mark.or_default("1337").number(tproxy)?;
        let tproxy_route_table = table.or_default("133").number(tproxy)?;

        let ports = input(
            &args.inbound_ports,
            "--istio-inbound-ports",
            Some(var::INBOUND_PORTS),
        );
        let excluded = input(
            &args.inbound_exclude_ports,
            "--istio-local-exclude-ports",
            Some(var::LOCAL_EXCLUDE_PORTS),
        );
        let inbound = match ports.value {
            "" => InboundCapture::Off,
            "*" => InboundCapture::AllExcept(excluded.list()?),
            _ => InboundCapture::Only(ports.list()?),
        };

        let cidrs = input(
            &args.outbound_cidrs,
            "--istio-service-cidr",
            Some(var::SERVICE_CIDR),
        );
        let outbound_cidrs = match cidrs.value {
            "*" => OutboundCidrs::All,
            _ => OutboundCidrs::Only(cidrs.cidrs()?),
        };
        let exclude_cidrs = input(
            &args.outbound_exclude_cidrs,
            "--istio-service-exclude-cidr",
            Some(var::SERVICE_EXCLUDE_CIDR),
        );
        if exclude_cidrs.value == "*" {
            return Err(exclude_cidrs
                .error("*", "a wildcard cannot be excluded")
                .into());
        }
        let outbound_exclude_cidrs = exclude_cidrs.cidrs()?;

        let outbound_ports = input(
            &args.outbound_ports,
            "--istio-outbound-ports",
            Some(var::OUTBOUND_PORTS),
        )
        .list()?;
        let outbound_exclude_ports = input(
            &args.outbound_exclude_ports,
            "--istio-local-outbound-ports-exclude",
            Some(var::LOCAL_OUTBOUND_PORTS_EXCLUDE),
        )
        .list()?;
        let kube_virt_interfaces = input(
            &args.kube_virt_interfaces,
            "--kube-virt-interfaces",
            Some(var::KUBE_VIRT_INTERFACES),
        )
        .list()?;
        let exclude_interfaces = input(
            &args.exclude_interfaces,
            "--istio-exclude-interfaces",
            Some(var::EXCLUDE_INTERFACES),
        )
        .list()?;

        let owner_groups = owner_groups(env)?;
        let ipv4_loopback_cidr = ipv4_loopback_cidr(env)?;

        let dual_stack = flag_or_env(
            args.dual_stack,
            env,
            &[var::DUAL_STACK, var::ISTIO_DUAL_STACK],
        );
        let ipv6 = args.assume_ipv6 || net.is_ipv6(dual_stack)?;
        let dns = dns_capture(args, env, net)?;
        let drop_invalid = flag_or_env(
            args.drop_invalid,
            env,
            &[var::DROP_INVALID, var::INVALID_DROP],
        );

        Ok(CaptureConfig {
            proxy_port,
            inbound_capture_port,
            inbound_tunnel_port,
            proxy_uids,
            proxy_gids,
            mode,
            tproxy_mark,
            tproxy_route_table,
            inbound,
            outbound_cidrs,
            outbound_exclude_cidrs,
            outbound_ports,
            outbound_exclude_ports,
            kube_virt_interfaces,
            exclude_interfaces,
            owner_groups,
            ipv4_loopback_cidr,
            dns,
            drop_invalid,
            ipv6,
        })
    }
}

fn owner_groups(env: &Environment) -> Result<OwnerGroups, FlagError> {
    let include = Input::env(var::OWNER_GROUPS, env).or_default("*");
    if include.value == "*" {
        let exclude = Input::env(var::OWNER_GROUPS_EXCLUDE, env);
        return Ok(OwnerGroups::AllExcept(exclude.list()?));
    }
    let groups = include.list()?;
    if groups.len() > MAX_OWNER_GROUPS_INCLUDE {
        let reason = format!(
            "at most {MAX_OWNER_GROUPS_INCLUDE} groups, got {}",
            groups.len()
        );
        return Err(include.error(include.value, reason));
    }
    if groups.is_empty() {
        tracing::warn!(
            "{} is empty: no outbound traffic will be captured",
            var::OWNER_GROUPS
        );
    }
    Ok(OwnerGroups::Only(groups))
}

fn ipv4_loopback_cidr(env: &Environment) -> Result<String, FlagError> {
    let input = Input::env(var::IPV4_LOOPBACK_CIDR, env).or_default("127.0.0.1/32");
    let cidr = Cidr::parse(input.value).map_err(|reason| input.error(input.value, reason))?;
    if !cidr.addr().is_ipv4() || !cidr.is_loopback() {
        return Err(input.error(input.value, "expected an IPv4 loopback range"));
    }
    if !(8..=32).contains(&cidr.bits()) {
        return Err(input.error(input.value, "expected a prefix length in 8..=32"));
    }
    // Emitted as written, like istio-iptables does.
    Ok(input.value.to_owned())
}

fn dns_capture(
    args: &CaptureArgs,
    env: &Environment,
    net: &dyn PodNetwork,
) -> Result<DnsCapture, CaptureError> {
    if !flag_or_env(
        args.redirect_dns,
        env,
        &[var::REDIRECT_DNS, var::META_DNS_CAPTURE],
    ) {
        return Ok(DnsCapture::Off);
    }
    if flag_or_env(args.capture_all_dns, env, &[var::CAPTURE_ALL_DNS]) {
        return Ok(DnsCapture::AllPort53);
    }
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    match &args.dns_servers {
        // Verbatim, so a test can reproduce text no real resolv.conf round-trip would give.
        Some(list) => {
            for server in list.split(',').filter(|s| !s.is_empty()) {
                match server.parse::<IpAddr>() {
                    Ok(IpAddr::V4(_)) => v4.push(server.to_owned()),
                    Ok(IpAddr::V6(_)) => v6.push(server.to_owned()),
                    Err(_) => {
                        let reason = "not an IP address";
                        return Err(FlagError::new("--dns-servers", server, reason).into());
                    }
                }
            }
        }
        None => {
            for server in net.nameservers()? {
                match server.parse::<IpAddr>() {
                    Ok(IpAddr::V4(a)) => v4.push(a.to_string()),
                    Ok(IpAddr::V6(a)) => v6.push(a.to_string()),
                    Err(_) => tracing::debug!(server, "ignoring unparsable nameserver"),
                }
            }
        }
    }
    if v4.is_empty() && v6.is_empty() {
        tracing::warn!(
            "--redirect-dns is set without --capture-all-dns and no nameservers are known; \
             DNS capture disabled"
        );
        return Ok(DnsCapture::Off);
    }
    Ok(DnsCapture::Servers { v4, v6 })
}

/// One string input, where it came from (for error messages), and whether it was given at all.
#[derive(Debug, Clone, Copy)]
struct Input<'a> {
    value: &'a str,
    source: &'static str,
    given: bool,
}

impl<'a> Input<'a> {
    /// The command-line value, else the variable's, else nothing.
    fn pick(
        cli: &'a Option<String>,
        flag: &'static str,
        var: Option<&'static str>,
        env: &'a Environment,
    ) -> Input<'a> {
        if let Some(value) = cli {
            return Input {
                value,
                source: flag,
                given: true,
            };
        }
        if let Some((name, value)) = var.and_then(|name| Some((name, env.get(name)?))) {
            return Input {
                value,
                source: name,
                given: true,
            };
        }
        Input {
            value: "",
            source: flag,
            given: false,
        }
    }

    /// An environment-only input; a variable set to '' counts as given.
    fn env(name: &'static str, env: &'a Environment) -> Input<'a> {
        match env.get(name) {
            Some(value) => Input {
                value,
                source: name,
                given: true,
            },
            None => Input {
                value: "",
                source: name,
                given: false,
            },
        }
    }

    /// Falls back to `default` only when nothing was given: an explicit '' stays empty.
    fn or_default(self, default: &'a str) -> Input<'a> {
        if self.given {
            self
        } else {
            Input {
                value: default,
                ..self
            }
        }
    }

    /// Falls back to `default` when the value is empty, given or not.
    fn or_if_empty(self, default: &'a str) -> Input<'a> {
        if self.value.is_empty() {
            Input {
                value: default,
                ..self
            }
        } else {
            self
        }
    }

    fn error(&self, value: &str, reason: impl Into<String>) -> FlagError {
        FlagError::new(self.source, value, reason)
    }

    /// A TCP port in 1..=65535.
    fn port(self, default: &'a str) -> Result<String, FlagError> {
        let value = self.or_default(default).value;
        match value.parse::<u16>() {
            Ok(p) if p != 0 && !value.starts_with('+') => Ok(value.to_owned()),
            _ => Err(self.error(value, "expected a port number in 1..=65535")),
        }
    }

    /// A decimal u32 when `required`; otherwise unused by the rules, so taken as it is.
    fn number(self, required: bool) -> Result<String, FlagError> {
        let value = self.value;
        if required && (value.starts_with('+') || value.parse::<u32>().is_err()) {
            return Err(self.error(value, "expected a decimal number"));
        }
        Ok(value.to_owned())
    }

    /// A comma list; empty items are dropped, as istio-iptables does.
    fn list(self) -> Result<Vec<String>, FlagError> {
        split(self.value)
            .map(|item| {
                token(item)
                    .map(str::to_owned)
                    .map_err(|r| self.error(item, r))
            })
            .collect()
    }

    fn cidrs(self) -> Result<CidrsByFamily, FlagError> {
        let mut cidrs = CidrsByFamily::default();
        for item in split(self.value) {
            let cidr = Cidr::parse(item).map_err(|r| self.error(item, r))?;
            match cidr.addr() {
                IpAddr::V4(_) => cidrs.v4.push(cidr),
                IpAddr::V6(_) => cidrs.v6.push(cidr),
            }
        }
        Ok(cidrs)
    }
}

fn split(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').filter(|item| !item.is_empty())
}

/// Checks that a value is one restore-input token.
fn token(value: &str) -> Result<&str, &'static str> {
    if value.is_empty() {
        return Err("must not be empty");
    }
    let bad = |c: char| c.is_whitespace() || c.is_control() || c == '"' || c == '\'';
    if value.contains(bad) {
        return Err("must not contain spaces, quotes or control characters");
    }
    Ok(value)
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
