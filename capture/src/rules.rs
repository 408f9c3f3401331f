//! Rules as data, and their rendering as `iptables-restore` input.
//!
//! A [`RuleSet`] is the ordered list of `-A`/`-I` rules for one IP family. Rendering groups
//! them by table (tables in lexical order, empty ones left out) and, inside a table, declares
//! with `-N` every chain that is not built in: first the chains that receive rules, in the
//! order they first do, then chains that are only jumped to. The rules follow in the order
//! they were added; an `-I` stays where it was added in the text, so its effect on the
//! kernel's order is iptables' business, not ours. This is the exact layout istio-iptables
//! produces, which matters because the conformance cases compare the text byte for byte.

use std::collections::BTreeSet;
use std::fmt::Write as _;

/// The nat-table chain that receives inbound TCP.
pub const ISTIO_INBOUND: &str = "ISTIO_INBOUND";
/// The chain that redirects to the inbound capture port.
pub const ISTIO_IN_REDIRECT: &str = "ISTIO_IN_REDIRECT";
/// The chain that decides about outbound traffic.
pub const ISTIO_OUTPUT: &str = "ISTIO_OUTPUT";
/// The chain that redirects to the outbound capture port.
pub const ISTIO_REDIRECT: &str = "ISTIO_REDIRECT";
/// The chain that captures DNS.
pub const ISTIO_OUTPUT_DNS: &str = "ISTIO_OUTPUT_DNS";
/// TPROXY mode: marks and accepts packets of established inbound connections.
pub const ISTIO_DIVERT: &str = "ISTIO_DIVERT";
/// TPROXY mode: hands new inbound connections to the proxy.
pub const ISTIO_TPROXY: &str = "ISTIO_TPROXY";
/// Drops conntrack-invalid packets.
pub const ISTIO_DROP: &str = "ISTIO_DROP";
/// Chains whose name starts with this are Remora's (and Istio's) own.
pub const OWN_CHAIN_PREFIX: &str = "ISTIO_";

/// Names that never get a `-N`: built-in chains and the standard verdicts.
const BUILT_IN: &[&str] = &[
    "INPUT",
    "OUTPUT",
    "FORWARD",
    "PREROUTING",
    "POSTROUTING",
    "ACCEPT",
    "RETURN",
    "DROP",
];

/// Whether `name` is a chain or verdict iptables already knows.
pub fn is_built_in(name: &str) -> bool {
    BUILT_IN.contains(&name)
}

/// Whether `name` is one of our chains.
pub fn is_own_chain(name: &str) -> bool {
    name.starts_with(OWN_CHAIN_PREFIX)
}

/// An iptables table. The declaration order is the lexical order, which is the order tables
/// appear in the restore input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    /// `filter`
    Filter,
    /// `mangle`
    Mangle,
    /// `nat`
    Nat,
    /// `raw`
    Raw,
}

impl Table {
    /// Every table Remora may write to, in restore order.
    pub const ALL: [Table; 4] = [Table::Filter, Table::Mangle, Table::Nat, Table::Raw];

    /// The table's name as iptables spells it.
    pub fn name(self) -> &'static str {
        match self {
            Table::Filter => "filter",
            Table::Mangle => "mangle",
            Table::Nat => "nat",
            Table::Raw => "raw",
        }
    }

    /// The table called `name`, if Remora uses it.
    pub fn from_name(name: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// An IP family, with the binaries and addresses that differ between the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv4 (`iptables`).
    V4,
    /// IPv6 (`ip6tables`).
    V6,
}

impl Family {
    /// `IPv4` or `IPv6`, for logs.
    pub fn label(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// The restore binary.
    pub fn restore_command(self) -> &'static str {
        match self {
            Family::V4 => "iptables-restore",
            Family::V6 => "ip6tables-restore",
        }
    }

    /// The save binary.
    pub fn save_command(self) -> &'static str {
        match self {
            Family::V4 => "iptables-save",
            Family::V6 => "ip6tables-save",
        }
    }
}

/// Where a rule goes in its chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// `-A`: at the end.
    Append,
    /// `-I CHAIN N`: at 1-based position N.
    Insert(u32),
}

/// One rule: `-A CHAIN SPEC` or `-I CHAIN N SPEC` in a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The table.
    pub table: Table,
    /// The chain the rule is added to.
    pub chain: &'static str,
    /// Append or insert.
    pub position: Position,
    /// Matches and target, e.g. `-p tcp --dport 15008 -j RETURN`. Tokens are separated by
    /// single spaces and contain no spaces themselves.
    pub spec: String,
}

impl Rule {
    /// The rule as a restore-input line.
    pub fn line(&self) -> String {
        match self.position {
            Position::Append => join(&["-A", self.chain, &self.spec]),
            Position::Insert(n) => join(&["-I", self.chain, &n.to_string(), &self.spec]),
        }
    }

    /// The rule as a restore-input line with another command (`-C` to check, `-D` to delete),
    /// which iptables matches by content, not position.
    pub fn line_as(&self, command: &str) -> String {
        join(&[command, self.chain, &self.spec])
    }

    /// The chain this rule jumps to when its spec ends in `-j NAME`, which is how
    /// istio-iptables finds chains that need declaring although they receive no rule.
    pub fn final_jump(&self) -> Option<&str> {
        let mut tokens = self.spec.rsplit(' ');
        let target = tokens.next()?;
        (tokens.next()? == "-j").then_some(target)
    }

    /// Whether the rule jumps (anywhere in its spec) to one of our chains.
    pub fn jumps_to_own_chain(&self) -> bool {
        let tokens: Vec<&str> = self.spec.split(' ').collect();
        tokens
            .windows(2)
            .any(|w| matches!(w[0], "-j" | "-g") && is_own_chain(w[1]))
    }
}

fn join(parts: &[&str]) -> String {
    parts
        .iter()
        .filter(|p| !p.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The rules of one IP family, in the order they were added.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSet {
    rules: Vec<Rule>,
}

impl RuleSet {
    /// Adds a rule at the end of the list.
    pub fn push(&mut self, rule: Rule) {
        self.rules.push(rule);
    }

    /// All rules, in order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rules of one table, in order.
    pub fn in_table(&self, table: Table) -> impl Iterator<Item = &Rule> {
        self.rules.iter().filter(move |r| r.table == table)
    }

    /// The tables that have rules, in restore order.
    pub fn tables(&self) -> Vec<Table> {
        let used: BTreeSet<Table> = self.rules.iter().map(|r| r.table).collect();
        used.into_iter().collect()
    }

    /// The chains of `table` that need `-N`, in declaration order.
    pub fn declared_chains(&self, table: Table) -> Vec<&str> {
        let mut declared: Vec<&str> = Vec::new();
        let receiving = self.in_table(table).map(|r| r.chain);
        let jumped_to = self.in_table(table).filter_map(Rule::final_jump);
        for chain in receiving.chain(jumped_to) {
            if !is_built_in(chain) && !declared.contains(&chain) {
                declared.push(chain);
            }
        }
        declared
    }

    /// The `iptables-restore --noflush` input that installs these rules.
    pub fn restore_input(&self) -> String {
        let mut out = String::new();
        for table in self.tables() {
            let _ = writeln!(out, "* {}", table.name());
            for chain in self.declared_chains(table) {
                let _ = writeln!(out, "-N {chain}");
            }
            for rule in self.in_table(table) {
                let _ = writeln!(out, "{}", rule.line());
            }
            out.push_str("COMMIT\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(table: Table, chain: &'static str, position: Position, spec: &str) -> Rule {
        Rule {
            table,
            chain,
            position,
            spec: spec.to_owned(),
        }
    }

    #[test]
    fn renders_tables_in_lexical_order_with_declarations_first() {
        let mut set = RuleSet::default();
        set.push(rule(
            Table::Nat,
            "OUTPUT",
            Position::Append,
            "-j ISTIO_OUTPUT",
        ));
        set.push(rule(
            Table::Raw,
            "OUTPUT",
            Position::Append,
            "-j ISTIO_OUTPUT_DNS",
        ));
        set.push(rule(
            Table::Mangle,
            "PREROUTING",
            Position::Insert(1),
            "-i eth0 -j RETURN",
        ));
        set.push(rule(
            Table::Nat,
            "ISTIO_OUTPUT",
            Position::Append,
            "-j ISTIO_REDIRECT",
        ));
        let expected = "* mangle\n-I PREROUTING 1 -i eth0 -j RETURN\nCOMMIT\n\
                        * nat\n-N ISTIO_OUTPUT\n-N ISTIO_REDIRECT\n-A OUTPUT -j ISTIO_OUTPUT\n\
                        -A ISTIO_OUTPUT -j ISTIO_REDIRECT\nCOMMIT\n\
                        * raw\n-N ISTIO_OUTPUT_DNS\n-A OUTPUT -j ISTIO_OUTPUT_DNS\nCOMMIT\n";
        assert_eq!(set.restore_input(), expected);
    }

    #[test]
    fn empty_set_renders_nothing() {
        assert_eq!(RuleSet::default().restore_input(), "");
    }

    #[test]
    fn finds_jumps() {
        let r = rule(
            Table::Nat,
            "OUTPUT",
            Position::Append,
            "-p tcp -j REDIRECT --to-ports 1",
        );
        assert_eq!(r.final_jump(), None);
        assert!(!r.jumps_to_own_chain());
        let r = rule(
            Table::Nat,
            "PREROUTING",
            Position::Insert(1),
            "-i eth1 -j ISTIO_REDIRECT",
        );
        assert_eq!(r.final_jump(), Some("ISTIO_REDIRECT"));
        assert!(r.jumps_to_own_chain());
        assert_eq!(r.line_as("-C"), "-C PREROUTING -i eth1 -j ISTIO_REDIRECT");
        assert_eq!(r.line(), "-I PREROUTING 1 -i eth1 -j ISTIO_REDIRECT");
    }
}
