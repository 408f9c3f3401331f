//! The native nftables generator: a pure function from a [`CaptureConfig`] to an
//! [`NftProgram`], in the order Istio's nftables backend builds its rules (which the
//! conformance cases compare as text).
//!
//! The decisions are the iptables generator's ([`mod@crate::generate`]); what differs is the
//! shape: one `inet` program instead of one ruleset per family, IPv6 rules added to it only
//! for an IPv6 pod, and each rule written in nft syntax with a `counter`.

use crate::generate::{DNS_PROXY_PORT, OUTBOUND_MARK};
use crate::model::{
    CaptureConfig, DnsCapture, InboundCapture, InterceptionMode, OutboundCidrs, OwnerGroups,
};
use crate::nft::program::{
    NftProgram, NftRule, NftTable, ISTIO_DIVERT, ISTIO_DROP, ISTIO_INBOUND, ISTIO_IN_REDIRECT,
    ISTIO_OUTPUT, ISTIO_OUTPUT_DNS, ISTIO_REDIRECT, ISTIO_TPROXY, OUTPUT, PREROUTING,
};

use NftTable::{Mangle, Nat, Raw};

const IPV6_LOOPBACK: &str = "::1/128";

/// Generates the native nftables program for `cfg`.
pub fn generate_nft(cfg: &CaptureConfig) -> NftProgram {
    let mut p = Builder {
        program: NftProgram::default(),
        ipv6: cfg.ipv6,
    };
    exclude_interfaces(cfg, &mut p);
    for iface in &cfg.kube_virt_interfaces {
        p.insert(
            Nat,
            PREROUTING,
            0,
            format!("iifname {iface} counter return"),
        );
    }
    if cfg.drop_invalid {
        p.add(
            Mangle,
            PREROUTING,
            "meta l4proto tcp ct state invalid counter jump istio-drop",
        );
        p.add(Mangle, ISTIO_DROP, "counter drop");
    }
    let tunnel = &cfg.inbound_tunnel_port;
    p.add(
        Nat,
        ISTIO_INBOUND,
        format!("meta l4proto tcp tcp dport {tunnel} counter return"),
    );
    let proxy = &cfg.proxy_port;
    p.add(
        Nat,
        ISTIO_REDIRECT,
        format!("meta l4proto tcp counter redirect to :{proxy}"),
    );
    let inbound_port = &cfg.inbound_capture_port;
    p.add(
        Nat,
        ISTIO_IN_REDIRECT,
        format!("meta l4proto tcp counter redirect to :{inbound_port}"),
    );
    inbound(cfg, &mut p);
    p.add(Nat, OUTPUT, "counter jump istio-output");
    for port in &cfg.outbound_exclude_ports {
        p.add(
            Nat,
            ISTIO_OUTPUT,
            format!("tcp dport {port} counter return"),
        );
        p.add(
            Nat,
            ISTIO_OUTPUT,
            format!("udp dport {port} counter return"),
        );
    }
    proxy_own_traffic(cfg, &mut p);
    owner_groups(cfg, &mut p);
    dns(cfg, &mut p);
    outbound(cfg, &mut p);
    if cfg.mode == InterceptionMode::Tproxy {
        tproxy_marks(cfg, &mut p);
    }
    p.program
}

fn exclude_interfaces(cfg: &CaptureConfig, p: &mut Builder) {
    for iface in &cfg.exclude_interfaces {
        p.add(Nat, PREROUTING, format!("iifname {iface} counter return"));
        p.add(Nat, OUTPUT, format!("oifname {iface} counter return"));
    }
    if cfg.mode == InterceptionMode::Tproxy {
        for iface in &cfg.exclude_interfaces {
            p.add(
                Mangle,
                PREROUTING,
                format!("iifname {iface} counter return"),
            );
            p.add(Mangle, OUTPUT, format!("oifname {iface} counter return"));
        }
    }
}

fn inbound(cfg: &CaptureConfig, p: &mut Builder) {
    if cfg.inbound == InboundCapture::Off {
        return;
    }
    if cfg.mode == InterceptionMode::Tproxy {
        return inbound_tproxy(cfg, p);
    }
    p.add(
        Nat,
        PREROUTING,
        "meta l4proto tcp counter jump istio-inbound",
    );
    match &cfg.inbound {
        InboundCapture::Off => {}
        InboundCapture::AllExcept(excluded) => {
            for port in excluded {
                let spec = format!("meta l4proto tcp tcp dport {port} counter return");
                p.add(Nat, ISTIO_INBOUND, spec);
            }
            p.add(
                Nat,
                ISTIO_INBOUND,
                "meta l4proto tcp counter jump istio-in-redirect",
            );
        }
        InboundCapture::Only(ports) => {
            for port in ports {
                let spec =
                    format!("meta l4proto tcp tcp dport {port} counter jump istio-in-redirect");
                p.add(Nat, ISTIO_INBOUND, spec);
            }
        }
    }
}

fn inbound_tproxy(cfg: &CaptureConfig, p: &mut Builder) {
    let mark = &cfg.tproxy_mark;
    p.add(
        Mangle,
        ISTIO_DIVERT,
        format!("counter meta mark set {mark}"),
    );
    p.add(Mangle, ISTIO_DIVERT, "counter accept");
    let port = &cfg.inbound_capture_port;
    let lo4 = &cfg.ipv4_loopback_cidr;
    p.add(
        Mangle,
        ISTIO_TPROXY,
        format!(
            "meta l4proto tcp ip daddr != {lo4} tproxy ip to :{port} meta mark set {mark} counter accept"
        ),
    );
    p.add_v6(
        Mangle,
        ISTIO_TPROXY,
        format!(
            "meta l4proto tcp ip6 daddr != {IPV6_LOOPBACK} tproxy ip6 to :{port} meta mark set {mark} counter accept"
        ),
    );
    p.add(
        Mangle,
        PREROUTING,
        "meta l4proto tcp counter jump istio-inbound",
    );
    match &cfg.inbound {
        InboundCapture::Off => {}
        InboundCapture::AllExcept(excluded) => {
            for port in excluded {
                let spec = format!("meta l4proto tcp tcp dport {port} counter return");
                p.add(Mangle, ISTIO_INBOUND, spec);
            }
            // Established connections are only marked; new ones go through TPROXY.
            p.add(
                Mangle,
                ISTIO_INBOUND,
                "meta l4proto tcp ct state related,established counter jump istio-divert",
            );
            p.add(
                Mangle,
                ISTIO_INBOUND,
                "meta l4proto tcp counter jump istio-tproxy",
            );
        }
        InboundCapture::Only(ports) => {
            for port in ports {
                p.add(
                    Mangle,
                    ISTIO_INBOUND,
                    format!(
                        "meta l4proto tcp ct state related,established tcp dport {port} counter jump istio-divert"
                    ),
                );
                p.add(
                    Mangle,
                    ISTIO_INBOUND,
                    format!("meta l4proto tcp tcp dport {port} counter jump istio-tproxy"),
                );
            }
        }
    }
}

/// See [`crate::generate`]: the proxy's own traffic must not loop back into it, except
/// towards the app through a service VIP on loopback.
fn proxy_own_traffic(cfg: &CaptureConfig, p: &mut Builder) {
    p.add(
        Nat,
        ISTIO_OUTPUT,
        "oifname lo ip saddr 127.0.0.6/32 counter return",
    );
    p.add_v6(
        Nat,
        ISTIO_OUTPUT,
        "oifname lo ip6 saddr ::6/128 counter return",
    );
    let dns = cfg.dns != DnsCapture::Off;
    let tunnel = &cfg.inbound_tunnel_port;
    let lo4 = &cfg.ipv4_loopback_cidr;
    let app_loopback_returns = match &cfg.outbound_cidrs {
        OutboundCidrs::All => true,
        OutboundCidrs::Only(cidrs) => !cidrs.has_loopback(),
    };
    for (owner, ids) in [("skuid", &cfg.proxy_uids), ("skgid", &cfg.proxy_gids)] {
        for id in ids {
            // As in istio-iptables, only the UID rules also skip port 53.
            let ports = if dns && owner == "skuid" {
                format!("{{ 53, {tunnel} }}")
            } else {
                tunnel.clone()
            };
            p.add(
                Nat,
                ISTIO_OUTPUT,
                format!(
                    "oifname lo meta l4proto tcp ip daddr != {lo4} tcp dport != {ports} {owner} {id} counter jump istio-in-redirect"
                ),
            );
            p.add_v6(
                Nat,
                ISTIO_OUTPUT,
                format!(
                    "oifname lo meta l4proto tcp ip6 daddr != {IPV6_LOOPBACK} tcp dport != {ports} {owner} {id} counter jump istio-in-redirect"
                ),
            );
            if app_loopback_returns {
                let spec = if dns {
                    format!("oifname lo meta l4proto tcp tcp dport != 53 {owner} != {id} counter return")
                } else {
                    format!("oifname lo {owner} != {id} counter return")
                };
                p.add(Nat, ISTIO_OUTPUT, spec);
            }
            p.add(Nat, ISTIO_OUTPUT, format!("{owner} {id} counter return"));
        }
    }
}

fn owner_groups(cfg: &CaptureConfig, p: &mut Builder) {
    match &cfg.owner_groups {
        OwnerGroups::AllExcept(groups) => {
            for group in groups {
                p.add(Nat, ISTIO_OUTPUT, format!("skgid {group} counter return"));
            }
        }
        OwnerGroups::Only(groups) => {
            let mut spec: String = groups.iter().map(|g| format!("skgid != {g} ")).collect();
            spec.push_str("counter return");
            p.add(Nat, ISTIO_OUTPUT, spec);
        }
    }
}

fn dns(cfg: &CaptureConfig, p: &mut Builder) {
    let (all, v4, v6): (bool, &[String], &[String]) = match &cfg.dns {
        DnsCapture::Off => return,
        DnsCapture::AllPort53 => (true, &[], &[]),
        DnsCapture::Servers { v4, v6 } => (false, v4, v6),
    };
    p.add(Raw, OUTPUT, "counter jump istio-output-dns");
    if all || !v4.is_empty() || !v6.is_empty() {
        p.add(Nat, ISTIO_OUTPUT, "counter jump istio-output-dns");
    }
    let redirect = format!("counter redirect to :{DNS_PROXY_PORT}");
    for proto in ["tcp", "udp"] {
        if all {
            let l4 = if proto == "tcp" {
                "meta l4proto tcp "
            } else {
                ""
            };
            let spec = format!("{l4}{proto} dport 53 {redirect}");
            p.add(Nat, ISTIO_OUTPUT_DNS, spec);
        }
        for s in v4 {
            let spec = format!("ip daddr {s}/32 {proto} dport 53 {redirect}");
            p.add(Nat, ISTIO_OUTPUT_DNS, spec);
        }
        for s in v6 {
            let spec = format!("ip6 daddr {s}/128 {proto} dport 53 {redirect}");
            p.add_v6(Nat, ISTIO_OUTPUT_DNS, spec);
        }
    }
    dns_conntrack_zones(cfg, p, all, v4, v6);
}

/// Separate conntrack zones for the proxy's upstream DNS (1) and the app's DNS to the proxy
/// (2), as in [`crate::generate`].
fn dns_conntrack_zones(
    cfg: &CaptureConfig,
    p: &mut Builder,
    all: bool,
    v4: &[String],
    v6: &[String],
) {
    for (owner, ids) in [("skuid", &cfg.proxy_uids), ("skgid", &cfg.proxy_gids)] {
        for id in ids {
            let upstream = format!("udp dport 53 meta {owner} {id} counter ct zone set 1");
            p.add(Raw, ISTIO_OUTPUT_DNS, upstream);
            let answers =
                format!("udp sport {DNS_PROXY_PORT} meta {owner} {id} counter ct zone set 2");
            p.add(Raw, ISTIO_OUTPUT_DNS, answers);
        }
    }
    if all {
        p.add(Raw, PREROUTING, "counter jump istio-inbound");
        p.add(Raw, ISTIO_OUTPUT_DNS, "udp dport 53 counter ct zone set 2");
        p.add(Raw, ISTIO_INBOUND, "udp sport 53 counter ct zone set 1");
        return;
    }
    if !v4.is_empty() || !v6.is_empty() {
        p.add(Raw, PREROUTING, "counter jump istio-inbound");
    }
    for s in v4 {
        let to_server = format!("udp dport 53 ip daddr {s}/32 counter ct zone set 2");
        p.add(Raw, ISTIO_OUTPUT_DNS, to_server);
        let from_server = format!("udp sport 53 ip saddr {s}/32 counter ct zone set 1");
        p.add(Raw, ISTIO_INBOUND, from_server);
    }
    for s in v6 {
        let to_server = format!("udp dport 53 ip6 daddr {s}/128 counter ct zone set 2");
        p.add_v6(Raw, ISTIO_OUTPUT_DNS, to_server);
        let from_server = format!("udp sport 53 ip6 saddr {s}/128 counter ct zone set 1");
        p.add_v6(Raw, ISTIO_INBOUND, from_server);
    }
}

fn outbound(cfg: &CaptureConfig, p: &mut Builder) {
    let lo4 = &cfg.ipv4_loopback_cidr;
    p.add(Nat, ISTIO_OUTPUT, format!("ip daddr {lo4} counter return"));
    p.add_v6(
        Nat,
        ISTIO_OUTPUT,
        format!("ip6 daddr {IPV6_LOOPBACK} counter return"),
    );
    for cidr in &cfg.outbound_exclude_cidrs.v4 {
        p.add(Nat, ISTIO_OUTPUT, format!("ip daddr {cidr} counter return"));
    }
    for cidr in &cfg.outbound_exclude_cidrs.v6 {
        p.add_v6(
            Nat,
            ISTIO_OUTPUT,
            format!("ip6 daddr {cidr} counter return"),
        );
    }
    for port in &cfg.outbound_ports {
        let spec = format!("tcp dport {port} counter jump istio-redirect");
        p.add(Nat, ISTIO_OUTPUT, spec);
    }
    match &cfg.outbound_cidrs {
        // One inet rule covers both families.
        OutboundCidrs::All => {
            p.add(Nat, ISTIO_OUTPUT, "counter jump istio-redirect");
            for iface in &cfg.kube_virt_interfaces {
                let spec = format!("iifname {iface} counter jump istio-redirect");
                p.insert(Nat, PREROUTING, 0, spec);
            }
        }
        OutboundCidrs::Only(cidrs) => {
            for cidr in &cidrs.v4 {
                for iface in &cfg.kube_virt_interfaces {
                    let spec =
                        format!("iifname {iface} ip daddr {cidr} counter jump istio-redirect");
                    p.insert(Nat, PREROUTING, 0, spec);
                }
                let spec = format!("ip daddr {cidr} counter jump istio-redirect");
                p.add(Nat, ISTIO_OUTPUT, spec);
            }
            for cidr in &cidrs.v6 {
                for iface in &cfg.kube_virt_interfaces {
                    let spec =
                        format!("iifname {iface} ip6 daddr {cidr} counter jump istio-redirect");
                    p.insert_v6(Nat, PREROUTING, 0, spec);
                }
                let spec = format!("ip6 daddr {cidr} counter jump istio-redirect");
                p.add_v6(Nat, ISTIO_OUTPUT, spec);
            }
        }
    }
}

/// See [`crate::generate`]: TPROXY mode keeps the proxy's marks on its connections.
fn tproxy_marks(cfg: &CaptureConfig, p: &mut Builder) {
    let mark = &cfg.tproxy_mark;
    let lo4 = &cfg.ipv4_loopback_cidr;
    p.add(
        Mangle,
        PREROUTING,
        format!("meta l4proto tcp mark {mark} counter ct mark set mark"),
    );
    p.add(
        Mangle,
        OUTPUT,
        format!("oifname lo meta l4proto tcp mark {mark} counter return"),
    );
    for (owner, ids) in [("skuid", &cfg.proxy_uids), ("skgid", &cfg.proxy_gids)] {
        for id in ids {
            p.add(
                Mangle,
                OUTPUT,
                format!(
                    "oifname lo meta l4proto tcp ip daddr != {lo4} {owner} {id} counter meta mark set {OUTBOUND_MARK}"
                ),
            );
            p.add_v6(
                Mangle,
                OUTPUT,
                format!(
                    "oifname lo meta l4proto tcp ip6 daddr != {IPV6_LOOPBACK} {owner} {id} counter meta mark set {OUTBOUND_MARK}"
                ),
            );
        }
    }
    p.add(
        Mangle,
        OUTPUT,
        format!("meta l4proto tcp ct mark {mark} counter meta mark set ct mark"),
    );
    p.insert(
        Mangle,
        ISTIO_INBOUND,
        0,
        format!("meta l4proto tcp mark {mark} counter return"),
    );
    p.insert(
        Mangle,
        ISTIO_INBOUND,
        1,
        "iifname lo meta l4proto tcp ip saddr 127.0.0.6/32 counter return",
    );
    p.insert_v6(
        Mangle,
        ISTIO_INBOUND,
        1,
        "iifname lo meta l4proto tcp ip6 saddr ::6/128 counter return",
    );
    p.insert(
        Mangle,
        ISTIO_INBOUND,
        2,
        format!("iifname lo meta l4proto tcp mark != {OUTBOUND_MARK} counter return"),
    );
}

/// Collects the rules; IPv6 ones only for an IPv6 pod.
struct Builder {
    program: NftProgram,
    ipv6: bool,
}

impl Builder {
    fn push(&mut self, table: NftTable, chain: &'static str, index: Option<u32>, text: String) {
        self.program.push(NftRule {
            table,
            chain,
            index,
            text,
        });
    }

    fn add(&mut self, table: NftTable, chain: &'static str, text: impl Into<String>) {
        self.push(table, chain, None, text.into());
    }

    fn insert(&mut self, table: NftTable, chain: &'static str, at: u32, text: impl Into<String>) {
        self.push(table, chain, Some(at), text.into());
    }

    fn add_v6(&mut self, table: NftTable, chain: &'static str, text: impl Into<String>) {
        if self.ipv6 {
            self.add(table, chain, text);
        }
    }

    fn insert_v6(
        &mut self,
        table: NftTable,
        chain: &'static str,
        at: u32,
        text: impl Into<String>,
    ) {
        if self.ipv6 {
            self.insert(table, chain, at, text);
        }
    }
}
