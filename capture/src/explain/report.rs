//! Printing a [`Trace`]: each chain entered, each rule with why it did or did not match,
//! and the result; the same words for iptables and nft rules.

use std::fmt;

use crate::explain::model::{Family, Match, Ports, Test};
use crate::explain::trace::{Outcome, RuleResult, Step, Trace};

/// A match in words, the same for both tools.
pub fn describe(m: &Match) -> String {
    let not = if m.negated { "not " } else { "" };
    let body = match &m.test {
        Test::Family(Family::V4) => "IPv4".to_owned(),
        Test::Family(Family::V6) => "IPv6".to_owned(),
        Test::Proto(p) => format!("protocol {}", p.name()),
        Test::Source(c) => format!("source in {c}"),
        Test::Destination(c) => format!("destination in {c}"),
        Test::InInterface(i) => format!("input interface {i}"),
        Test::OutInterface(i) => format!("output interface {i}"),
        Test::SourcePort(p, ports) => format!("{} source port {}", p.name(), ports_text(ports)),
        Test::DestinationPort(p, ports) => {
            format!("{} destination port {}", p.name(), ports_text(ports))
        }
        Test::Uid(u) => format!("owner UID {u}"),
        Test::Gid(g) => format!("owner GID {g}"),
        Test::Mark(mk) => format!("mark {:#x}/{:#x}", mk.value, mk.mask),
        Test::ConnMark(mk) => format!("connection mark {:#x}/{:#x}", mk.value, mk.mask),
        Test::CtState(s) => format!("conntrack state {s:?}"),
        Test::Unknown(t) => t.clone(),
    };
    format!("{not}{body}")
}

fn ports_text(ports: &Ports) -> String {
    let items: Vec<String> = ports
        .0
        .iter()
        .map(|(lo, hi)| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            }
        })
        .collect();
    items.join(",")
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for step in &self.steps {
            match step {
                Step::Enter {
                    table,
                    chain,
                    hook: Some((hook, prio)),
                    ..
                } => {
                    let hook = format!("{hook:?}").to_lowercase();
                    writeln!(f, "{table} {chain} (hook {hook}, priority {prio})")?;
                }
                Step::Enter { chain, depth, .. } => {
                    writeln!(f, "{:indent$}-> {chain}", "", indent = 2 * depth)?;
                }
                Step::Rule {
                    index,
                    text,
                    depth,
                    result,
                    ..
                } => {
                    let indent = 2 * depth + 2;
                    let what = match result {
                        RuleResult::NoMatch(why) => format!("no: {why}"),
                        RuleResult::Matched(effects) => format!("MATCH: {}", effects.join(", ")),
                        RuleResult::Unknown(why) => format!("UNKNOWN: {why}"),
                    };
                    writeln!(f, "{:indent$}{index:>3}  {text}", "")?;
                    writeln!(f, "{:indent$}     {what}", "")?;
                }
                Step::FellOff { chain, depth } => {
                    writeln!(
                        f,
                        "{:indent$}   (end of {chain})",
                        "",
                        indent = 2 * depth + 2
                    )?;
                }
            }
        }
        let at = |(table, chain, rule): &(String, String, usize)| {
            if *rule == 0 {
                format!("{table} {chain} policy")
            } else {
                format!("{table} {chain} rule {rule}")
            }
        };
        match &self.outcome {
            Outcome::Redirected { port, at: where_ } => {
                write!(f, "Result: redirected to port {port} ({})", at(where_))?
            }
            Outcome::Tproxied { port, at: where_ } => {
                write!(f, "Result: TPROXYed to port {port} ({})", at(where_))?
            }
            Outcome::Untouched => write!(f, "Result: returned untouched (not captured)")?,
            Outcome::Dropped { at: where_ } => write!(f, "Result: dropped ({})", at(where_))?,
            Outcome::Unknown { reason, at: where_ } => {
                write!(f, "Result: unknown at {}: {reason}", at(where_))?
            }
        }
        if self.mark != 0 {
            write!(f, "; mark {:#x}", self.mark)?;
        }
        if self.conn_mark != 0 {
            write!(f, "; connection mark {:#x}", self.conn_mark)?;
        }
        if let Some(zone) = self.zone {
            write!(f, "; conntrack zone {zone}")?;
        }
        writeln!(f)
    }
}
