//! Rules as data for the native nftables backend, and their rendering as `nft -f` input.
//!
//! An [`NftProgram`] is the ordered list of rules the generator asked for, each aimed at one
//! chain of one of Istio's three `inet` tables. Rendering follows the layout Istio's
//! nftables backend writes through knftables, which the conformance cases compare byte for
//! byte: tables in the fixed order nat, mangle, raw (only those with rules), each created and
//! flushed, then its chains that have rules in a fixed order, then its rules in the order
//! they were added. Because the program flushes the tables it writes, loading it replaces a
//! previous installation in the same transaction.

use std::fmt::Write as _;

/// One of the `inet` tables Remora (like Istio) writes in native nftables mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NftTable {
    /// `istio-proxy-nat`: redirects.
    Nat,
    /// `istio-proxy-mangle`: TPROXY, marks and the invalid-packet drop.
    Mangle,
    /// `istio-proxy-raw`: DNS conntrack zones.
    Raw,
}

/// A chain of one of our tables, with its hook when it is a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainSpec {
    /// The chain's name.
    pub name: &'static str,
    /// `{ type … hook … priority … ; }` for base chains.
    pub base: Option<&'static str>,
}

/// Base chain names.
pub const PREROUTING: &str = "prerouting";
/// Base chain names.
pub const OUTPUT: &str = "output";
/// Regular chains, named as Istio names them.
pub const ISTIO_INBOUND: &str = "istio-inbound";
/// Redirects to the outbound capture port.
pub const ISTIO_REDIRECT: &str = "istio-redirect";
/// Redirects to the inbound capture port.
pub const ISTIO_IN_REDIRECT: &str = "istio-in-redirect";
/// Decides about outbound traffic.
pub const ISTIO_OUTPUT: &str = "istio-output";
/// DNS capture and conntrack zones.
pub const ISTIO_OUTPUT_DNS: &str = "istio-output-dns";
/// TPROXY: marks and accepts packets of established inbound connections.
pub const ISTIO_DIVERT: &str = "istio-divert";
/// TPROXY: hands new inbound connections to the proxy.
pub const ISTIO_TPROXY: &str = "istio-tproxy";
/// Drops conntrack-invalid packets.
pub const ISTIO_DROP: &str = "istio-drop";

const fn regular(name: &'static str) -> ChainSpec {
    ChainSpec { name, base: None }
}

const fn base(name: &'static str, spec: &'static str) -> ChainSpec {
    ChainSpec {
        name,
        base: Some(spec),
    }
}

// Priorities are knftables' named ones as numbers: dstnat -100, mangle -150, raw -300.
const NAT_CHAINS: &[ChainSpec] = &[
    base(PREROUTING, "{ type nat hook prerouting priority -100 ; }"),
    base(OUTPUT, "{ type nat hook output priority -100 ; }"),
    regular(ISTIO_INBOUND),
    regular(ISTIO_REDIRECT),
    regular(ISTIO_IN_REDIRECT),
    regular(ISTIO_OUTPUT),
    regular(ISTIO_OUTPUT_DNS),
];
const MANGLE_CHAINS: &[ChainSpec] = &[
    base(
        PREROUTING,
        "{ type filter hook prerouting priority -150 ; }",
    ),
    base(OUTPUT, "{ type route hook output priority -150 ; }"),
    regular(ISTIO_DIVERT),
    regular(ISTIO_TPROXY),
    regular(ISTIO_INBOUND),
    regular(ISTIO_DROP),
];
const RAW_CHAINS: &[ChainSpec] = &[
    base(
        PREROUTING,
        "{ type filter hook prerouting priority -300 ; }",
    ),
    base(OUTPUT, "{ type filter hook output priority -300 ; }"),
    regular(ISTIO_INBOUND),
    regular(ISTIO_OUTPUT_DNS),
];

impl NftTable {
    /// Every table, in program order.
    pub const ALL: [NftTable; 3] = [NftTable::Nat, NftTable::Mangle, NftTable::Raw];

    /// The table's name (all are in family `inet`).
    pub fn name(self) -> &'static str {
        match self {
            NftTable::Nat => "istio-proxy-nat",
            NftTable::Mangle => "istio-proxy-mangle",
            NftTable::Raw => "istio-proxy-raw",
        }
    }

    /// The table called `name`, if it is one of ours.
    pub fn from_name(name: &str) -> Option<NftTable> {
        NftTable::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The chains the table may have, in declaration order.
    pub fn chains(self) -> &'static [ChainSpec] {
        match self {
            NftTable::Nat => NAT_CHAINS,
            NftTable::Mangle => MANGLE_CHAINS,
            NftTable::Raw => RAW_CHAINS,
        }
    }
}

/// One rule: matches and statements for a chain, optionally inserted at an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftRule {
    /// The table.
    pub table: NftTable,
    /// The chain.
    pub chain: &'static str,
    /// `Some(i)`: insert before the i-th rule (0-based) rather than append.
    pub index: Option<u32>,
    /// The rule text, e.g. `meta l4proto tcp tcp dport 15008 counter return`.
    pub text: String,
}

/// The rules of a native-nftables installation, in the order they were added.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NftProgram {
    rules: Vec<NftRule>,
}

impl NftProgram {
    /// Adds a rule at the end of the list.
    pub fn push(&mut self, rule: NftRule) {
        self.rules.push(rule);
    }

    /// All rules, in order.
    pub fn rules(&self) -> &[NftRule] {
        &self.rules
    }

    /// The rules of one table, in order.
    pub fn in_table(&self, table: NftTable) -> impl Iterator<Item = &NftRule> {
        self.rules.iter().filter(move |r| r.table == table)
    }

    /// The tables that have rules, in program order.
    pub fn tables(&self) -> Vec<NftTable> {
        let used = |t: &NftTable| self.in_table(*t).next().is_some();
        NftTable::ALL.into_iter().filter(used).collect()
    }

    /// The chains of `table` that have rules, in declaration order.
    pub fn chains(&self, table: NftTable) -> Vec<ChainSpec> {
        let used = |c: &&ChainSpec| self.in_table(table).any(|r| r.chain == c.name);
        table.chains().iter().filter(used).copied().collect()
    }

    /// The `nft -f` input that installs these rules, replacing what our tables held.
    pub fn script(&self) -> String {
        let mut out = String::new();
        for table in self.tables() {
            let name = table.name();
            let _ = writeln!(out, "add table inet {name}");
            let _ = writeln!(out, "flush table inet {name}");
            for chain in self.chains(table) {
                match chain.base {
                    Some(spec) => {
                        let _ = writeln!(out, "add chain inet {name} {} {spec}", chain.name);
                    }
                    None => {
                        let _ = writeln!(out, "add chain inet {name} {}", chain.name);
                    }
                }
            }
            for line in self.rule_lines(table) {
                let _ = writeln!(out, "{line}");
            }
        }
        out
    }

    /// The `add rule`/`insert rule` lines of one table.
    ///
    /// nftables refuses an insert at an index the chain does not have yet, so, as Istio does,
    /// an insert at or past the chain's current length becomes an append. The length counts
    /// every rule written so far, so lines cannot be reordered afterwards.
    fn rule_lines(&self, table: NftTable) -> Vec<String> {
        let name = table.name();
        let mut lengths: Vec<(&str, u32)> = Vec::new();
        let mut lines = Vec::new();
        for rule in self.in_table(table) {
            let length = match lengths.iter_mut().find(|(c, _)| *c == rule.chain) {
                Some((_, n)) => n,
                None => {
                    lengths.push((rule.chain, 0));
                    &mut lengths.last_mut().expect("just pushed").1
                }
            };
            let line = match rule.index {
                Some(i) if i < *length => format!(
                    "insert rule inet {name} {} index {i} {}",
                    rule.chain, rule.text
                ),
                _ => format!("add rule inet {name} {} {}", rule.chain, rule.text),
            };
            *length += 1;
            lines.push(line);
        }
        lines
    }
}

/// The `nft -f` input that removes every table of ours, whether or not it exists: adding an
/// empty table first makes the deletion valid in either case, all in one transaction.
pub fn cleanup_script() -> String {
    let mut out = String::new();
    for table in NftTable::ALL {
        let _ = writeln!(out, "add table inet {}", table.name());
        let _ = writeln!(out, "delete table inet {}", table.name());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(table: NftTable, chain: &'static str, index: Option<u32>, text: &str) -> NftRule {
        NftRule {
            table,
            chain,
            index,
            text: text.to_owned(),
        }
    }

    #[test]
    fn renders_tables_in_fixed_order_and_only_used_chains() {
        let mut p = NftProgram::default();
        p.push(rule(
            NftTable::Raw,
            OUTPUT,
            None,
            "counter jump istio-output-dns",
        ));
        p.push(rule(NftTable::Nat, ISTIO_OUTPUT, None, "counter return"));
        p.push(rule(
            NftTable::Nat,
            OUTPUT,
            None,
            "counter jump istio-output",
        ));
        let expected = "add table inet istio-proxy-nat\nflush table inet istio-proxy-nat\n\
            add chain inet istio-proxy-nat output { type nat hook output priority -100 ; }\n\
            add chain inet istio-proxy-nat istio-output\n\
            add rule inet istio-proxy-nat istio-output counter return\n\
            add rule inet istio-proxy-nat output counter jump istio-output\n\
            add table inet istio-proxy-raw\nflush table inet istio-proxy-raw\n\
            add chain inet istio-proxy-raw output { type filter hook output priority -300 ; }\n\
            add rule inet istio-proxy-raw output counter jump istio-output-dns\n";
        assert_eq!(p.script(), expected);
    }

    #[test]
    fn inserts_past_the_end_become_appends() {
        let mut p = NftProgram::default();
        p.push(rule(
            NftTable::Nat,
            PREROUTING,
            Some(0),
            "iifname a counter return",
        ));
        p.push(rule(
            NftTable::Nat,
            PREROUTING,
            Some(0),
            "iifname b counter return",
        ));
        p.push(rule(
            NftTable::Nat,
            PREROUTING,
            Some(5),
            "iifname c counter return",
        ));
        let lines: Vec<String> = p.rule_lines(NftTable::Nat);
        assert_eq!(
            lines,
            [
                "add rule inet istio-proxy-nat prerouting iifname a counter return",
                "insert rule inet istio-proxy-nat prerouting index 0 iifname b counter return",
                "add rule inet istio-proxy-nat prerouting iifname c counter return",
            ]
        );
    }

    #[test]
    fn empty_program_renders_nothing_and_cleanup_names_every_table() {
        assert_eq!(NftProgram::default().script(), "");
        let cleanup = cleanup_script();
        assert_eq!(cleanup.lines().count(), 6);
        assert!(cleanup.contains("delete table inet istio-proxy-mangle\n"));
    }
}
