//! The rule generator: a pure function from a [`CaptureConfig`] to the restore inputs.
//!
//! The order in which rules are added is part of the contract (the conformance cases compare
//! text), and it is istio-iptables' order: interface short-circuits, invalid-packet drop, the
//! fixed chains, inbound capture, the proxy's own traffic, owner groups, DNS, outbound
//! exclusions and inclusions, and finally the TPROXY marks. Each step is one function below.

use crate::model::{
    CaptureConfig, DnsCapture, InboundCapture, InterceptionMode, OutboundCidrs, OwnerGroups,
};
use crate::rules::{
    Family, Position, Rule, RuleSet, Table, ISTIO_DIVERT, ISTIO_DROP, ISTIO_INBOUND,
    ISTIO_IN_REDIRECT, ISTIO_OUTPUT, ISTIO_OUTPUT_DNS, ISTIO_REDIRECT, ISTIO_TPROXY,
};

/// Where the agent's DNS proxy listens.
pub const DNS_PROXY_PORT: &str = "15053";
/// TPROXY mode: the mark the proxy's outbound-to-app packets get, so that inbound capture
/// leaves them alone.
pub const OUTBOUND_MARK: &str = "1338";
/// The IPv6 loopback range (the IPv4 one is configurable).
const IPV6_LOOPBACK: &str = "::1/128";
/// Source addresses the proxy binds for inbound passthrough, so its own connections to the
/// app can be told apart from the app's.
const PASSTHROUGH_SRC_V4: &str = "127.0.0.6/32";
const PASSTHROUGH_SRC_V6: &str = "::6/128";

/// The generated rules: always IPv4, and IPv6 for an IPv6 pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureRules {
    /// Rules for `iptables-restore`.
    pub v4: RuleSet,
    /// Rules for `ip6tables-restore`, for IPv6 pods only.
    pub v6: Option<RuleSet>,
}

impl CaptureRules {
    /// Each family with its rules, IPv4 first (the order they are applied in).
    pub fn families(&self) -> impl Iterator<Item = (Family, &RuleSet)> {
        let v6 = self.v6.as_ref().map(|set| (Family::V6, set));
        std::iter::once((Family::V4, &self.v4)).chain(v6)
    }

    /// What `--dry-run` prints: each restore input under a `# iptables-restore` or
    /// `# ip6tables-restore` header.
    pub fn dry_run_output(&self) -> String {
        let mut out = String::new();
        for (family, set) in self.families() {
            out.push_str("# ");
            out.push_str(family.restore_command());
            out.push('\n');
            out.push_str(&set.restore_input());
        }
        out
    }
}

/// Generates the rules for `cfg`.
pub fn generate(cfg: &CaptureConfig) -> CaptureRules {
    let mut r = Builder::new(cfg);
    exclude_interfaces(cfg, &mut r);
    kube_virt_interfaces_return(cfg, &mut r);
    if cfg.drop_invalid {
        r.append(
            Table::Mangle,
            "PREROUTING",
            "-m conntrack --ctstate INVALID -j ISTIO_DROP",
        );
        r.append(Table::Mangle, ISTIO_DROP, "-j DROP");
    }
    fixed_chains(cfg, &mut r);
    inbound(cfg, &mut r);
    r.append(Table::Nat, "OUTPUT", "-j ISTIO_OUTPUT");
    for port in &cfg.outbound_exclude_ports {
        r.append(
            Table::Nat,
            ISTIO_OUTPUT,
            format!("-p tcp --dport {port} -j RETURN"),
        );
        r.append(
            Table::Nat,
            ISTIO_OUTPUT,
            format!("-p udp --dport {port} -j RETURN"),
        );
    }
    proxy_own_traffic(cfg, &mut r);
    owner_groups(cfg, &mut r);
    dns(cfg, &mut r);
    outbound(cfg, &mut r);
    if cfg.mode == InterceptionMode::Tproxy {
        tproxy_marks(cfg, &mut r);
    }
    r.finish()
}

/// Traffic on excluded interfaces is never captured, in either direction.
fn exclude_interfaces(cfg: &CaptureConfig, r: &mut Builder) {
    let mut tables = vec![Table::Nat];
    if cfg.mode == InterceptionMode::Tproxy {
        tables.push(Table::Mangle);
    }
    for table in tables {
        for iface in &cfg.exclude_interfaces {
            r.append(table, "PREROUTING", format!("-i {iface} -j RETURN"));
            r.append(table, "OUTPUT", format!("-o {iface} -j RETURN"));
        }
    }
}

/// Inbound traffic from VM interfaces skips inbound capture (outbound() may then send it to
/// the outbound port instead).
fn kube_virt_interfaces_return(cfg: &CaptureConfig, r: &mut Builder) {
    for iface in &cfg.kube_virt_interfaces {
        r.insert(Table::Nat, "PREROUTING", 1, format!("-i {iface} -j RETURN"));
    }
}

/// The chains every configuration has: the tunnel port bypass and the two redirects.
fn fixed_chains(cfg: &CaptureConfig, r: &mut Builder) {
    let tunnel = &cfg.inbound_tunnel_port;
    r.append(
        Table::Nat,
        ISTIO_INBOUND,
        format!("-p tcp --dport {tunnel} -j RETURN"),
    );
    let proxy = &cfg.proxy_port;
    r.append(
        Table::Nat,
        ISTIO_REDIRECT,
        format!("-p tcp -j REDIRECT --to-ports {proxy}"),
    );
    let inbound = &cfg.inbound_capture_port;
    r.append(
        Table::Nat,
        ISTIO_IN_REDIRECT,
        format!("-p tcp -j REDIRECT --to-ports {inbound}"),
    );
}

fn inbound(cfg: &CaptureConfig, r: &mut Builder) {
    if cfg.inbound == InboundCapture::Off {
        return;
    }
    let tproxy = cfg.mode == InterceptionMode::Tproxy;
    let table = if tproxy { Table::Mangle } else { Table::Nat };
    if tproxy {
        let mark = &cfg.tproxy_mark;
        r.append(
            Table::Mangle,
            ISTIO_DIVERT,
            format!("-j MARK --set-mark {mark}"),
        );
        r.append(Table::Mangle, ISTIO_DIVERT, "-j ACCEPT");
        let port = &cfg.inbound_capture_port;
        r.append_per_family(Table::Mangle, ISTIO_TPROXY, |a| {
            let lo = a.loopback;
            format!("! -d {lo} -p tcp -j TPROXY --tproxy-mark {mark}/0xffffffff --on-port {port}")
        });
    }
    r.append(table, "PREROUTING", "-p tcp -j ISTIO_INBOUND");
    match &cfg.inbound {
        InboundCapture::Off => {}
        InboundCapture::AllExcept(excluded) => {
            for port in excluded {
                r.append(
                    table,
                    ISTIO_INBOUND,
                    format!("-p tcp --dport {port} -j RETURN"),
                );
            }
            if tproxy {
                // Established connections are only marked; new ones go through TPROXY.
                let established = "-p tcp -m conntrack --ctstate RELATED,ESTABLISHED";
                r.append(
                    table,
                    ISTIO_INBOUND,
                    format!("{established} -j ISTIO_DIVERT"),
                );
                r.append(table, ISTIO_INBOUND, "-p tcp -j ISTIO_TPROXY");
            } else {
                r.append(table, ISTIO_INBOUND, "-p tcp -j ISTIO_IN_REDIRECT");
            }
        }
        InboundCapture::Only(ports) => {
            for port in ports {
                if tproxy {
                    let established = "-m conntrack --ctstate RELATED,ESTABLISHED";
                    let divert = format!("-p tcp --dport {port} {established} -j ISTIO_DIVERT");
                    r.append(table, ISTIO_INBOUND, divert);
                    r.append(
                        table,
                        ISTIO_INBOUND,
                        format!("-p tcp --dport {port} -j ISTIO_TPROXY"),
                    );
                } else {
                    let redirect = format!("-p tcp --dport {port} -j ISTIO_IN_REDIRECT");
                    r.append(table, ISTIO_INBOUND, redirect);
                }
            }
        }
    }
}

/// The proxy's own traffic must not loop back into it, except when it calls the app through
/// a service VIP on loopback, which must reach the inbound side.
fn proxy_own_traffic(cfg: &CaptureConfig, r: &mut Builder) {
    r.append_per_family(Table::Nat, ISTIO_OUTPUT, |a| {
        format!("-o lo -s {} -j RETURN", a.passthrough_src)
    });
    let dns = cfg.dns != DnsCapture::Off;
    let tunnel = &cfg.inbound_tunnel_port;
    // An app's call to its own pod IP goes out on lo; leave it alone, unless the user asked
    // for loopback ranges to be captured.
    let app_loopback_returns = match &cfg.outbound_cidrs {
        OutboundCidrs::All => true,
        OutboundCidrs::Only(cidrs) => !cidrs.has_loopback(),
    };
    // With DNS capture, port 53 on lo is left to the DNS rules (a local resolver may be used).
    let not_dns = if dns { "-p tcp ! --dport 53 " } else { "" };
    for (owner, ids) in [
        ("--uid-owner", &cfg.proxy_uids),
        ("--gid-owner", &cfg.proxy_gids),
    ] {
        for id in ids {
            // Only UID rules skip port 53 here, exactly as istio-iptables does.
            let ports = if dns && owner == "--uid-owner" {
                format!("-m multiport ! --dports 53,{tunnel}")
            } else {
                format!("! --dport {tunnel}")
            };
            r.append_per_family(Table::Nat, ISTIO_OUTPUT, |a| {
                let lo = a.loopback;
                format!("-o lo ! -d {lo} -p tcp {ports} -m owner {owner} {id} -j ISTIO_IN_REDIRECT")
            });
            if app_loopback_returns {
                let spec = format!("-o lo {not_dns}-m owner ! {owner} {id} -j RETURN");
                r.append(Table::Nat, ISTIO_OUTPUT, spec);
            }
            r.append(
                Table::Nat,
                ISTIO_OUTPUT,
                format!("-m owner {owner} {id} -j RETURN"),
            );
        }
    }
}

fn owner_groups(cfg: &CaptureConfig, r: &mut Builder) {
    match &cfg.owner_groups {
        OwnerGroups::AllExcept(groups) => {
            for group in groups {
                r.append(
                    Table::Nat,
                    ISTIO_OUTPUT,
                    format!("-m owner --gid-owner {group} -j RETURN"),
                );
            }
        }
        OwnerGroups::Only(groups) => {
            // One rule: return unless the owner is in one of the groups.
            let mut spec: String = groups
                .iter()
                .map(|g| format!("-m owner ! --gid-owner {g} "))
                .collect();
            spec.push_str("-j RETURN");
            r.append(Table::Nat, ISTIO_OUTPUT, spec);
        }
    }
}

fn dns(cfg: &CaptureConfig, r: &mut Builder) {
    let (all, v4, v6): (bool, &[String], &[String]) = match &cfg.dns {
        DnsCapture::Off => return,
        DnsCapture::AllPort53 => (true, &[], &[]),
        DnsCapture::Servers { v4, v6 } => (false, v4, v6),
    };
    r.append(Table::Raw, "OUTPUT", "-j ISTIO_OUTPUT_DNS");
    // Jump from nat only in a family that has something to capture.
    if all || !v4.is_empty() {
        r.append_v4(Table::Nat, ISTIO_OUTPUT, "-j ISTIO_OUTPUT_DNS");
    }
    if all || !v6.is_empty() {
        r.append_v6(Table::Nat, ISTIO_OUTPUT, "-j ISTIO_OUTPUT_DNS");
    }
    // TCP says --to-ports, UDP --to-port: both are accepted, and the text must match.
    for (proto, to) in [("tcp", "--to-ports"), ("udp", "--to-port")] {
        let redirect = format!("-j REDIRECT {to} {DNS_PROXY_PORT}");
        if all {
            r.append(
                Table::Nat,
                ISTIO_OUTPUT_DNS,
                format!("-p {proto} --dport 53 {redirect}"),
            );
        }
        for s in v4 {
            let spec = format!("-p {proto} --dport 53 -d {s}/32 {redirect}");
            r.append_v4(Table::Nat, ISTIO_OUTPUT_DNS, spec);
        }
        for s in v6 {
            let spec = format!("-p {proto} --dport 53 -d {s}/128 {redirect}");
            r.append_v6(Table::Nat, ISTIO_OUTPUT_DNS, spec);
        }
    }
    dns_conntrack_zones(cfg, r, all, v4, v6);
}

/// Puts the proxy's upstream DNS traffic (zone 1) and the app-to-proxy DNS traffic (zone 2)
/// in separate conntrack zones, so the two UDP flows cannot be confused after the NAT.
fn dns_conntrack_zones(
    cfg: &CaptureConfig,
    r: &mut Builder,
    all: bool,
    v4: &[String],
    v6: &[String],
) {
    for (owner, ids) in [
        ("--uid-owner", &cfg.proxy_uids),
        ("--gid-owner", &cfg.proxy_gids),
    ] {
        for id in ids {
            let upstream = format!("-p udp --dport 53 -m owner {owner} {id} -j CT --zone 1");
            r.append(Table::Raw, ISTIO_OUTPUT_DNS, upstream);
            let answers =
                format!("-p udp --sport {DNS_PROXY_PORT} -m owner {owner} {id} -j CT --zone 2");
            r.append(Table::Raw, ISTIO_OUTPUT_DNS, answers);
        }
    }
    if all {
        r.append(Table::Raw, "PREROUTING", "-j ISTIO_INBOUND");
        r.append(
            Table::Raw,
            ISTIO_OUTPUT_DNS,
            "-p udp --dport 53 -j CT --zone 2",
        );
        r.append(
            Table::Raw,
            ISTIO_INBOUND,
            "-p udp --sport 53 -j CT --zone 1",
        );
        return;
    }
    for (family, servers, bits) in [(Family::V4, v4, 32), (Family::V6, v6, 128)] {
        if !servers.is_empty() {
            r.append_in(family, Table::Raw, "PREROUTING", "-j ISTIO_INBOUND");
        }
        for s in servers {
            let to_server = format!("-p udp --dport 53 -d {s}/{bits} -j CT --zone 2");
            r.append_in(family, Table::Raw, ISTIO_OUTPUT_DNS, to_server);
            let from_server = format!("-p udp --sport 53 -s {s}/{bits} -j CT --zone 1");
            r.append_in(family, Table::Raw, ISTIO_INBOUND, from_server);
        }
    }
}

fn outbound(cfg: &CaptureConfig, r: &mut Builder) {
    // Loopback traffic that is not the proxy's is the app talking to itself.
    r.append_per_family(Table::Nat, ISTIO_OUTPUT, |a| {
        format!("-d {} -j RETURN", a.loopback)
    });
    // Exclusions first: the chain is first-match.
    let excluded = &cfg.outbound_exclude_cidrs;
    for (family, cidrs) in [(Family::V4, &excluded.v4), (Family::V6, &excluded.v6)] {
        for cidr in cidrs {
            r.append_in(
                family,
                Table::Nat,
                ISTIO_OUTPUT,
                format!("-d {cidr} -j RETURN"),
            );
        }
    }
    for port in &cfg.outbound_ports {
        r.append(
            Table::Nat,
            ISTIO_OUTPUT,
            format!("-p tcp --dport {port} -j ISTIO_REDIRECT"),
        );
    }
    for family in [Family::V4, Family::V6] {
        match &cfg.outbound_cidrs {
            OutboundCidrs::All => {
                r.append_in(family, Table::Nat, ISTIO_OUTPUT, "-j ISTIO_REDIRECT");
                for iface in &cfg.kube_virt_interfaces {
                    let spec = format!("-i {iface} -j ISTIO_REDIRECT");
                    r.insert_in(family, Table::Nat, "PREROUTING", 1, spec);
                }
            }
            OutboundCidrs::Only(cidrs) => {
                let cidrs = if family == Family::V4 {
                    &cidrs.v4
                } else {
                    &cidrs.v6
                };
                for cidr in cidrs {
                    for iface in &cfg.kube_virt_interfaces {
                        let spec = format!("-i {iface} -d {cidr} -j ISTIO_REDIRECT");
                        r.insert_in(family, Table::Nat, "PREROUTING", 1, spec);
                    }
                    let spec = format!("-d {cidr} -j ISTIO_REDIRECT");
                    r.append_in(family, Table::Nat, ISTIO_OUTPUT, spec);
                }
            }
        }
    }
}

/// TPROXY mode keeps the proxy's marks on its connections so that replies route back to it
/// and its own connections to the app are not captured again.
fn tproxy_marks(cfg: &CaptureConfig, r: &mut Builder) {
    let mark = &cfg.tproxy_mark;
    let save = format!("-p tcp -m mark --mark {mark} -j CONNMARK --save-mark");
    r.append(Table::Mangle, "PREROUTING", save);
    r.append(
        Table::Mangle,
        "OUTPUT",
        format!("-p tcp -o lo -m mark --mark {mark} -j RETURN"),
    );
    for (owner, ids) in [
        ("--uid-owner", &cfg.proxy_uids),
        ("--gid-owner", &cfg.proxy_gids),
    ] {
        for id in ids {
            r.append_per_family(Table::Mangle, "OUTPUT", |a| {
                let lo = a.loopback;
                format!("! -d {lo} -p tcp -o lo -m owner {owner} {id} -j MARK --set-mark {OUTBOUND_MARK}")
            });
        }
    }
    let restore = format!("-p tcp -m connmark --mark {mark} -j CONNMARK --restore-mark");
    r.append(Table::Mangle, "OUTPUT", restore);
    let inbound = ISTIO_INBOUND;
    r.insert(
        Table::Mangle,
        inbound,
        1,
        format!("-p tcp -m mark --mark {mark} -j RETURN"),
    );
    r.insert_per_family(Table::Mangle, inbound, 2, |a| {
        format!("-p tcp -s {} -i lo -j RETURN", a.passthrough_src)
    });
    let not_outbound = format!("-p tcp -i lo -m mark ! --mark {OUTBOUND_MARK} -j RETURN");
    r.insert(Table::Mangle, inbound, 3, not_outbound);
}

/// The addresses that differ between the two families' versions of a rule.
struct FamilyAddrs<'a> {
    loopback: &'a str,
    passthrough_src: &'static str,
}

/// Collects rules for both families; IPv6 rules are dropped for an IPv4 pod.
struct Builder<'a> {
    v4: RuleSet,
    v6: Option<RuleSet>,
    v4_addrs: FamilyAddrs<'a>,
    v6_addrs: FamilyAddrs<'a>,
}

impl<'a> Builder<'a> {
    fn new(cfg: &'a CaptureConfig) -> Self {
        Builder {
            v4: RuleSet::default(),
            v6: cfg.ipv6.then(RuleSet::default),
            v4_addrs: FamilyAddrs {
                loopback: &cfg.ipv4_loopback_cidr,
                passthrough_src: PASSTHROUGH_SRC_V4,
            },
            v6_addrs: FamilyAddrs {
                loopback: IPV6_LOOPBACK,
                passthrough_src: PASSTHROUGH_SRC_V6,
            },
        }
    }

    fn finish(self) -> CaptureRules {
        CaptureRules {
            v4: self.v4,
            v6: self.v6,
        }
    }

    fn add(
        &mut self,
        family: Family,
        table: Table,
        chain: &'static str,
        position: Position,
        spec: String,
    ) {
        let set = match family {
            Family::V4 => &mut self.v4,
            Family::V6 => match &mut self.v6 {
                Some(set) => set,
                None => return,
            },
        };
        set.push(Rule {
            table,
            chain,
            position,
            spec,
        });
    }

    fn append_in(
        &mut self,
        family: Family,
        table: Table,
        chain: &'static str,
        spec: impl Into<String>,
    ) {
        self.add(family, table, chain, Position::Append, spec.into());
    }

    fn insert_in(
        &mut self,
        family: Family,
        table: Table,
        chain: &'static str,
        at: u32,
        spec: impl Into<String>,
    ) {
        self.add(family, table, chain, Position::Insert(at), spec.into());
    }

    fn append_v4(&mut self, table: Table, chain: &'static str, spec: impl Into<String>) {
        self.append_in(Family::V4, table, chain, spec);
    }

    fn append_v6(&mut self, table: Table, chain: &'static str, spec: impl Into<String>) {
        self.append_in(Family::V6, table, chain, spec);
    }

    /// The same rule text in both families.
    fn append(&mut self, table: Table, chain: &'static str, spec: impl Into<String>) {
        let spec = spec.into();
        self.append_in(Family::V6, table, chain, spec.clone());
        self.append_in(Family::V4, table, chain, spec);
    }

    fn insert(&mut self, table: Table, chain: &'static str, at: u32, spec: impl Into<String>) {
        let spec = spec.into();
        self.insert_in(Family::V6, table, chain, at, spec.clone());
        self.insert_in(Family::V4, table, chain, at, spec);
    }

    /// A rule whose text depends on the family's addresses.
    fn append_per_family(
        &mut self,
        table: Table,
        chain: &'static str,
        spec: impl Fn(&FamilyAddrs) -> String,
    ) {
        let (v4, v6) = (spec(&self.v4_addrs), spec(&self.v6_addrs));
        self.append_in(Family::V4, table, chain, v4);
        self.append_in(Family::V6, table, chain, v6);
    }

    fn insert_per_family(
        &mut self,
        table: Table,
        chain: &'static str,
        at: u32,
        spec: impl Fn(&FamilyAddrs) -> String,
    ) {
        let (v4, v6) = (spec(&self.v4_addrs), spec(&self.v6_addrs));
        self.insert_in(Family::V4, table, chain, at, v4);
        self.insert_in(Family::V6, table, chain, at, v6);
    }
}
