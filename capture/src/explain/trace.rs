//! Following one connection's first packet through a [`Ruleset`], rule by rule.
//!
//! The hooks are taken in the order the kernel runs them (outbound: output, postrouting;
//! inbound: prerouting, input), and within a hook the base chains of every table in priority
//! order. Each rule's matches are evaluated against the packet; a match whose answer depends
//! on something not given (or not modelled) makes the rule, and so the trace, unknown, unless
//! another match of the same rule already fails. Marks, connection marks and conntrack zones
//! set on the way are carried along, and a REDIRECT rewrites the destination for the tables
//! that follow.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::explain::model::{
    Action, CtState, Family, Hook, Match, Proto, Ruleset, Test, TraceChain, TraceTable,
};
use crate::explain::report::describe;

/// How deep jumps may nest before the trace gives up (iptables' own limit is similar).
const MAX_DEPTH: usize = 64;

/// Which way the connection goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Opened by a local process (OUTPUT).
    Outbound,
    /// Arriving on an interface (PREROUTING).
    Inbound,
}

/// The connection to trace: its first packet and, for outbound, its socket's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// Outbound or inbound.
    pub direction: Direction,
    /// TCP or UDP.
    pub proto: Proto,
    /// Source address, if known.
    pub src: Option<IpAddr>,
    /// Destination address, if known.
    pub dst: Option<IpAddr>,
    /// Source port, if known.
    pub sport: Option<u16>,
    /// Destination port, if known.
    pub dport: Option<u16>,
    /// The socket owner's UID (outbound).
    pub uid: Option<u32>,
    /// The socket owner's GID (outbound).
    pub gid: Option<u32>,
    /// Arrival interface (inbound).
    pub in_iface: Option<String>,
    /// Departure interface (outbound).
    pub out_iface: Option<String>,
    /// The packet mark it starts with.
    pub mark: u32,
}

impl Connection {
    /// The IP family, from the addresses (IPv4 when none is given).
    pub fn family(&self) -> Family {
        match self.dst.or(self.src) {
            Some(IpAddr::V6(_)) => Family::V6,
            _ => Family::V4,
        }
    }
}

/// What happened at one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The trace entered a chain (a base chain, or by jump).
    Enter {
        /// Table name.
        table: String,
        /// Chain name.
        chain: String,
        /// Hook and priority of a base chain.
        hook: Option<(Hook, i32)>,
        /// Jump depth (0 for base chains).
        depth: usize,
    },
    /// A rule was evaluated.
    Rule {
        /// Table name.
        table: String,
        /// Chain name.
        chain: String,
        /// 1-based position in the chain.
        index: usize,
        /// The rule as written.
        text: String,
        /// Jump depth.
        depth: usize,
        /// Its outcome.
        result: RuleResult,
    },
    /// The end of a chain was reached.
    FellOff {
        /// Chain name.
        chain: String,
        /// Jump depth.
        depth: usize,
    },
}

/// How one rule went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleResult {
    /// A match failed.
    NoMatch(String),
    /// Every match held; what the actions did.
    Matched(Vec<String>),
    /// The rule may or may not match.
    Unknown(String),
}

/// Where the connection ends up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// NATed to a local port.
    Redirected {
        /// The port.
        port: u16,
        /// Table, chain and rule that did it.
        at: (String, String, usize),
    },
    /// Handed to a local socket by TPROXY.
    Tproxied {
        /// The port.
        port: u16,
        /// Table, chain and rule that did it.
        at: (String, String, usize),
    },
    /// Passed every table without being captured.
    Untouched,
    /// Dropped or rejected.
    Dropped {
        /// Table, chain and rule (0 for a chain policy).
        at: (String, String, usize),
    },
    /// The trace cannot tell.
    Unknown {
        /// Why.
        reason: String,
        /// Table, chain and rule where it stopped.
        at: (String, String, usize),
    },
}

/// The path of a connection and where it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// Every step, in order.
    pub steps: Vec<Step>,
    /// The end.
    pub outcome: Outcome,
    /// The packet mark at the end.
    pub mark: u32,
    /// The connection mark at the end.
    pub conn_mark: u32,
    /// The conntrack zone set on the way.
    pub zone: Option<u16>,
}

impl Trace {
    /// Table, chain and 1-based index of every rule that matched, in order.
    pub fn matched_rules(&self) -> Vec<(String, String, usize)> {
        self.steps
            .iter()
            .filter_map(|s| match s {
                Step::Rule {
                    table,
                    chain,
                    index,
                    result: RuleResult::Matched(_),
                    ..
                } => Some((table.clone(), chain.clone(), *index)),
                _ => None,
            })
            .collect()
    }
}

/// The packet as it goes.
struct Packet {
    conn: Connection,
    family: Family,
    mark: u32,
    conn_mark: u32,
    zone: Option<u16>,
    redirect: Option<(u16, (String, String, usize))>,
    tproxy: Option<(u16, (String, String, usize))>,
    /// Set once an inbound REDIRECT made the destination the interface's own address.
    dst_note: Option<&'static str>,
}

/// Traces `conn` through `set`.
pub fn trace(set: &Ruleset, conn: &Connection) -> Trace {
    let family = conn.family();
    let mut packet = Packet {
        conn: conn.clone(),
        family,
        mark: conn.mark,
        conn_mark: 0,
        zone: None,
        redirect: None,
        tproxy: None,
        dst_note: None,
    };
    let mut steps = Vec::new();
    let hooks: &[Hook] = match conn.direction {
        Direction::Outbound => &[Hook::Output, Hook::Postrouting],
        Direction::Inbound => &[Hook::Prerouting, Hook::Input],
    };
    let mut outcome = None;
    'hooks: for hook in hooks {
        let mut bases: Vec<(&TraceTable, &TraceChain, i32)> = set
            .tables
            .iter()
            .filter(|t| t.family.is_none_or(|f| f == family))
            .flat_map(|t| {
                t.chains.iter().filter_map(move |c| match c.hook {
                    Some((h, prio)) if h == *hook => Some((t, c, prio)),
                    _ => None,
                })
            })
            .collect();
        bases.sort_by_key(|(_, _, prio)| *prio);
        for (table, chain, _) in bases {
            if let Some(end) = run_base(table, chain, *hook, &mut packet, &mut steps) {
                outcome = Some(end);
                break 'hooks;
            }
        }
    }
    let outcome = outcome.unwrap_or_else(|| match (&packet.redirect, &packet.tproxy) {
        (Some((port, at)), _) => Outcome::Redirected {
            port: *port,
            at: at.clone(),
        },
        (None, Some((port, at))) => Outcome::Tproxied {
            port: *port,
            at: at.clone(),
        },
        (None, None) => Outcome::Untouched,
    });
    Trace {
        steps,
        outcome,
        mark: packet.mark,
        conn_mark: packet.conn_mark,
        zone: packet.zone,
    }
}

/// Runs one base chain with its jumps; `Some` when the trace ends here (drop or unknown).
fn run_base(
    table: &TraceTable,
    base: &TraceChain,
    hook: Hook,
    packet: &mut Packet,
    steps: &mut Vec<Step>,
) -> Option<Outcome> {
    let tname = table.name.clone();
    steps.push(Step::Enter {
        table: tname.clone(),
        chain: base.name.clone(),
        hook: base.hook,
        depth: 0,
    });
    let mut stack: Vec<(&TraceChain, usize)> = vec![(base, 0)];
    loop {
        let depth = stack.len() - 1;
        let (chain, next) = stack.last_mut()?;
        let chain: &TraceChain = chain;
        let Some(rule) = chain.rules.get(*next) else {
            steps.push(Step::FellOff {
                chain: chain.name.clone(),
                depth,
            });
            stack.pop();
            if stack.is_empty() {
                return base.policy_drop.then(|| Outcome::Dropped {
                    at: (tname.clone(), base.name.clone(), 0),
                });
            }
            continue;
        };
        *next += 1;
        let index = *next;
        let at = (tname.clone(), chain.name.clone(), index);
        let mut record = |result: RuleResult| {
            steps.push(Step::Rule {
                table: tname.clone(),
                chain: chain.name.clone(),
                index,
                text: rule.text.clone(),
                depth,
                result,
            })
        };
        match evaluate(&rule.matches, hook, packet) {
            Verdict::No(why) => {
                record(RuleResult::NoMatch(why));
                continue;
            }
            Verdict::Unknown(why) => {
                record(RuleResult::Unknown(why.clone()));
                return Some(Outcome::Unknown { reason: why, at });
            }
            Verdict::Yes => {}
        }
        let mut effects = Vec::new();
        let mut verdict = None;
        for action in &rule.actions {
            match action {
                Action::Counter => {}
                Action::SetMark(m) => {
                    packet.mark = (packet.mark & !m.mask) | (m.value & m.mask);
                    effects.push(format!("mark set to {:#x}", packet.mark));
                }
                Action::SaveMark => {
                    packet.conn_mark = packet.mark;
                    effects.push(format!("connection mark set to {:#x}", packet.conn_mark));
                }
                Action::RestoreMark => {
                    packet.mark = packet.conn_mark;
                    effects.push(format!("mark restored to {:#x}", packet.mark));
                }
                Action::CtZone(zone) => {
                    packet.zone = Some(*zone);
                    effects.push(format!("conntrack zone {zone}"));
                }
                Action::Tproxy { port, mark } => {
                    packet.tproxy = Some((*port, at.clone()));
                    effects.push(format!("TPROXY to port {port}"));
                    if let Some(m) = mark {
                        packet.mark = (packet.mark & !m.mask) | (m.value & m.mask);
                        effects.push(format!("mark set to {:#x}", packet.mark));
                    }
                }
                Action::Redirect(port) => {
                    packet.redirect = Some((*port, at.clone()));
                    effects.push(format!("REDIRECT to port {port}"));
                    redirect(packet, *port);
                    verdict = Some(Action::Accept);
                    break;
                }
                other => {
                    verdict = Some(other.clone());
                    break;
                }
            }
        }
        match verdict {
            None => {
                if effects.is_empty() {
                    effects.push("continue".to_owned());
                }
                record(RuleResult::Matched(effects));
            }
            Some(Action::Accept) => {
                if effects.is_empty() {
                    effects.push("ACCEPT".to_owned());
                }
                record(RuleResult::Matched(effects));
                return None;
            }
            Some(Action::Drop | Action::Reject) => {
                effects.push("DROP".to_owned());
                record(RuleResult::Matched(effects));
                return Some(Outcome::Dropped { at });
            }
            Some(Action::Return) => {
                effects.push("RETURN".to_owned());
                record(RuleResult::Matched(effects));
                stack.pop();
                if stack.is_empty() {
                    return base.policy_drop.then(|| Outcome::Dropped {
                        at: (tname.clone(), base.name.clone(), 0),
                    });
                }
            }
            Some(Action::Jump(target) | Action::Goto(target)) => {
                let goto = matches!(
                    rule.actions.iter().find(|a| a.is_verdict()),
                    Some(Action::Goto(_))
                );
                let Some(next_chain) = table.chain(&target) else {
                    let why = format!("jumps to {target}, which this table does not have");
                    record(RuleResult::Unknown(why.clone()));
                    return Some(Outcome::Unknown { reason: why, at });
                };
                effects.push(format!("{} {target}", if goto { "goto" } else { "jump" }));
                record(RuleResult::Matched(effects));
                if goto {
                    stack.pop();
                }
                if stack.len() >= MAX_DEPTH {
                    let why = "jumps nest too deep (a loop?)".to_owned();
                    return Some(Outcome::Unknown { reason: why, at });
                }
                steps.push(Step::Enter {
                    table: tname.clone(),
                    chain: target.clone(),
                    hook: None,
                    depth: stack.len(),
                });
                stack.push((next_chain, 0));
            }
            Some(Action::Unknown(text)) => {
                let why = format!("cannot evaluate the action `{text}`");
                record(RuleResult::Unknown(why.clone()));
                return Some(Outcome::Unknown { reason: why, at });
            }
            Some(other) => unreachable!("{other:?} is not a verdict"),
        }
    }
}

/// NAT to a local port: outbound to loopback, inbound to the arrival interface's address.
fn redirect(packet: &mut Packet, port: u16) {
    packet.conn.dport = Some(port);
    match packet.conn.direction {
        Direction::Outbound => {
            packet.conn.dst = Some(match packet.family {
                Family::V4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
                Family::V6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        Direction::Inbound => {
            packet.conn.dst = None;
            packet.dst_note = Some("the destination is now the arrival interface's address");
        }
    }
}

enum Verdict {
    Yes,
    No(String),
    Unknown(String),
}

/// All matches of a rule: a definite failure wins over an unknown.
fn evaluate(matches: &[Match], hook: Hook, packet: &Packet) -> Verdict {
    let mut unknown = None;
    for m in matches {
        match test(m, hook, packet) {
            Verdict::Yes => {}
            Verdict::No(why) => return Verdict::No(why),
            Verdict::Unknown(why) => {
                unknown.get_or_insert(why);
            }
        }
    }
    unknown.map_or(Verdict::Yes, Verdict::Unknown)
}

fn iface_matches(pattern: &str, name: &str) -> bool {
    match pattern
        .strip_suffix('+')
        .or_else(|| pattern.strip_suffix('*'))
    {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// One match. Protocol and family preconditions (a `tcp dport` on a UDP packet) fail
/// whether or not the match is negated, as they do in the kernel.
fn test(m: &Match, hook: Hook, packet: &Packet) -> Verdict {
    let conn = &packet.conn;
    let outbound_hook = matches!(hook, Hook::Output | Hook::Postrouting);
    let known = |holds: bool, fact: String| {
        if holds != m.negated {
            Verdict::Yes
        } else {
            Verdict::No(format!("{fact}, so not `{}`", describe(m)))
        }
    };
    let missing = |what: &str, flag: &str| {
        Verdict::Unknown(format!(
            "`{}` depends on the {what}, which was not given ({flag})",
            describe(m)
        ))
    };
    match &m.test {
        Test::Family(f) => known(
            *f == packet.family,
            format!("the packet is {:?}", packet.family),
        ),
        Test::Proto(p) => known(
            *p == conn.proto,
            format!("the protocol is {}", conn.proto.name()),
        ),
        Test::Source(c) => match conn.src {
            Some(a) => known(c.contains(a), format!("the source is {a}")),
            None => missing("source address", "--src"),
        },
        Test::Destination(c) => match (conn.dst, packet.dst_note) {
            (Some(a), _) => known(c.contains(a), format!("the destination is {a}")),
            (None, Some(note)) => Verdict::Unknown(format!("`{}`: {note}", describe(m))),
            (None, None) => missing("destination address", "--dst"),
        },
        Test::InInterface(name) => {
            let actual = if outbound_hook {
                ""
            } else {
                conn.in_iface.as_deref().unwrap_or("")
            };
            known(
                iface_matches(name, actual),
                format!("the input interface is {:?}", actual),
            )
        }
        Test::OutInterface(name) => {
            let actual = if outbound_hook {
                conn.out_iface.as_deref().unwrap_or("")
            } else {
                ""
            };
            known(
                iface_matches(name, actual),
                format!("the output interface is {:?}", actual),
            )
        }
        Test::SourcePort(p, ports) | Test::DestinationPort(p, ports) => {
            if *p != conn.proto {
                return Verdict::No(format!(
                    "the protocol is {}, so not `{}`",
                    conn.proto.name(),
                    describe(m)
                ));
            }
            let (port, what, flag) = match &m.test {
                Test::SourcePort(..) => (conn.sport, "source port", "--sport"),
                _ => (conn.dport, "destination port", "--dport"),
            };
            match port {
                Some(port) => known(ports.contains(port), format!("the {what} is {port}")),
                None => missing(what, flag),
            }
        }
        Test::Uid(owner) | Test::Gid(owner) => {
            let (actual, what, flag) = match &m.test {
                Test::Uid(_) => (conn.uid, "socket's UID", "--uid"),
                _ => (conn.gid, "socket's GID", "--gid"),
            };
            if !outbound_hook {
                return Verdict::No(format!(
                    "an arriving packet has no local socket, so not `{}`",
                    describe(m)
                ));
            }
            match (actual, owner.parse::<u32>()) {
                (_, Err(_)) => Verdict::Unknown(format!(
                    "`{}` names an owner ({owner}) that only the machine the rules came from can resolve",
                    describe(m)
                )),
                (None, _) => missing(what, flag),
                (Some(a), Ok(o)) => known(a == o, format!("the {what} is {a}")),
            }
        }
        Test::Mark(mark) => known(
            mark.matches(packet.mark),
            format!("the mark is {:#x}", packet.mark),
        ),
        Test::ConnMark(mark) => known(
            mark.matches(packet.conn_mark),
            format!("the connection mark is {:#x}", packet.conn_mark),
        ),
        Test::CtState(states) => known(
            states.contains(&CtState::New),
            "the first packet of a connection is NEW".to_owned(),
        ),
        Test::Unknown(text) => Verdict::Unknown(format!("cannot evaluate `{text}`")),
    }
}

#[cfg(test)]
#[path = "trace_tests.rs"]
mod tests;
