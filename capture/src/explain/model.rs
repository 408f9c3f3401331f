//! Rules as the tracer sees them, whichever tool wrote them: a match is a test on the
//! packet or its socket, an action changes the packet or decides its fate. Both parsers
//! ([`super::iptables`], [`super::nft`]) produce this model; anything they do not understand
//! becomes [`Test::Unknown`] or [`Action::Unknown`], which the tracer reports rather than
//! guesses.

use crate::cidr::Cidr;

/// An IP family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// Where a packet enters the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    /// Arriving packets, before routing.
    Prerouting,
    /// Arriving packets for this host.
    Input,
    /// Locally generated packets.
    Output,
    /// Leaving packets, after routing.
    Postrouting,
}

impl Hook {
    /// The hook of a built-in chain name (`PREROUTING`, `output`…).
    pub fn from_chain(name: &str) -> Option<Hook> {
        match name.to_ascii_lowercase().as_str() {
            "prerouting" => Some(Hook::Prerouting),
            "input" => Some(Hook::Input),
            "output" => Some(Hook::Output),
            "postrouting" => Some(Hook::Postrouting),
            _ => None,
        }
    }
}

/// A layer-4 protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Proto {
    /// Parses `tcp`/`udp` (or their numbers).
    pub fn parse(s: &str) -> Option<Proto> {
        match s {
            "tcp" | "6" => Some(Proto::Tcp),
            "udp" | "17" => Some(Proto::Udp),
            _ => None,
        }
    }

    /// `tcp` or `udp`.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// A connection-tracking state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CtState {
    /// The first packet of a connection.
    New,
    /// Later packets.
    Established,
    /// Related to another connection (ICMP errors, FTP data).
    Related,
    /// Not valid for any connection.
    Invalid,
    /// Not tracked.
    Untracked,
}

impl CtState {
    /// Parses one state name, in either tool's spelling.
    pub fn parse(s: &str) -> Option<CtState> {
        match s.to_ascii_lowercase().as_str() {
            "new" => Some(CtState::New),
            "established" => Some(CtState::Established),
            "related" => Some(CtState::Related),
            "invalid" => Some(CtState::Invalid),
            "untracked" => Some(CtState::Untracked),
            _ => None,
        }
    }
}

/// A set of ports: single ports and inclusive ranges.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ports(pub Vec<(u16, u16)>);

impl Ports {
    /// Parses `80`, `1000:2000` (iptables), `1000-2000` (nft) or comma lists of them.
    pub fn parse(s: &str) -> Option<Ports> {
        let mut ranges = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (lo, hi) = item
                .split_once(':')
                .or_else(|| item.split_once('-'))
                .unwrap_or((item, item));
            ranges.push((lo.trim().parse().ok()?, hi.trim().parse().ok()?));
        }
        (!ranges.is_empty()).then_some(Ports(ranges))
    }

    /// Whether `port` is in the set.
    pub fn contains(&self, port: u16) -> bool {
        self.0.iter().any(|(lo, hi)| (*lo..=*hi).contains(&port))
    }
}

/// A mark test or assignment: `value/mask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mark {
    /// The value.
    pub value: u32,
    /// The bits that count.
    pub mask: u32,
}

impl Mark {
    /// Parses `1337`, `0x539` or `0x539/0xffffffff`.
    pub fn parse(s: &str) -> Option<Mark> {
        let (value, mask) = s.split_once('/').unwrap_or((s, "0xffffffff"));
        Some(Mark {
            value: parse_u32(value)?,
            mask: parse_u32(mask)?,
        })
    }

    /// Whether `mark` carries this value in the masked bits.
    pub fn matches(&self, mark: u32) -> bool {
        mark & self.mask == self.value & self.mask
    }
}

/// Parses a decimal or `0x` hexadecimal u32.
pub fn parse_u32(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// What a match tests.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Test {
    /// The packet is of this family (nft's `ip`/`ip6` prefixes imply it).
    Family(Family),
    /// The layer-4 protocol.
    Proto(Proto),
    /// Source address in range.
    Source(Cidr),
    /// Destination address in range.
    Destination(Cidr),
    /// Input interface (`+` at the end matches any suffix).
    InInterface(String),
    /// Output interface.
    OutInterface(String),
    /// Source port of the given protocol.
    SourcePort(Proto, Ports),
    /// Destination port of the given protocol.
    DestinationPort(Proto, Ports),
    /// The socket's owner UID, as written (a name if not numeric).
    Uid(String),
    /// The socket's owner GID, as written.
    Gid(String),
    /// The packet mark.
    Mark(Mark),
    /// The connection mark.
    ConnMark(Mark),
    /// The conntrack state is one of these.
    CtState(Vec<CtState>),
    /// Something the tracer cannot evaluate, as written.
    Unknown(String),
}

/// One test, possibly negated.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Match {
    /// `!` / `!=`.
    pub negated: bool,
    /// What is tested.
    pub test: Test,
}

/// What a rule does when it matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// Continue in another chain, then come back.
    Jump(String),
    /// Continue in another chain, not coming back.
    Goto(String),
    /// Back to the calling chain (or the policy of a base chain).
    Return,
    /// Done with this table (or base chain).
    Accept,
    /// Discard.
    Drop,
    /// Discard with an error.
    Reject,
    /// NAT to a local port (the table's hook decides which local address).
    Redirect(u16),
    /// Transparent proxying to a local port, optionally setting the mark; the packet goes
    /// on through the rule's remaining actions.
    Tproxy {
        /// The local port.
        port: u16,
        /// The mark set on the packet.
        mark: Option<Mark>,
    },
    /// Set (masked bits of) the packet mark.
    SetMark(Mark),
    /// Copy the packet mark to the connection mark.
    SaveMark,
    /// Copy the connection mark to the packet mark.
    RestoreMark,
    /// Put the connection in a conntrack zone.
    CtZone(u16),
    /// Count (no effect on the packet).
    Counter,
    /// Something the tracer cannot evaluate, as written.
    Unknown(String),
}

impl Action {
    /// Whether the action ends the rule's effects in its chain (a verdict).
    pub fn is_verdict(&self) -> bool {
        !matches!(
            self,
            Action::SetMark(_)
                | Action::SaveMark
                | Action::RestoreMark
                | Action::CtZone(_)
                | Action::Counter
                | Action::Tproxy { .. }
        )
    }
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRule {
    /// All must hold.
    pub matches: Vec<Match>,
    /// In order; at most one verdict, last.
    pub actions: Vec<Action>,
    /// Packet count, when the source printed counters.
    pub packets: Option<u64>,
    /// The rule as written in the source.
    pub text: String,
}

impl TraceRule {
    /// The rule reduced to what it does, so that two spellings of one rule compare equal:
    /// matches in a fixed order (all must hold, so order does not matter), without a protocol
    /// test that a port test implies (nft drops it when listing), ranges without host bits,
    /// states sorted, and no counters.
    pub fn canonical(&self) -> (Vec<Match>, Vec<Action>) {
        let ported: Vec<Proto> = self
            .matches
            .iter()
            .filter_map(|m| match &m.test {
                Test::DestinationPort(p, _) | Test::SourcePort(p, _) => Some(*p),
                _ => None,
            })
            .collect();
        let mut matches: Vec<Match> = self
            .matches
            .iter()
            .filter(|m| m.negated || !matches!(&m.test, Test::Proto(p) if ported.contains(p)))
            .cloned()
            .map(|mut m| {
                match &mut m.test {
                    Test::CtState(states) => states.sort(),
                    Test::Source(c) | Test::Destination(c) => *c = c.network(),
                    _ => {}
                }
                m
            })
            .collect();
        matches.sort_by_cached_key(|m| format!("{m:?}"));
        matches.dedup();
        let actions = self
            .actions
            .iter()
            .filter(|a| **a != Action::Counter)
            .cloned()
            .collect();
        (matches, actions)
    }
}

/// A chain with its rules in the order the kernel holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceChain {
    /// The chain's name.
    pub name: String,
    /// For a base chain: its hook and priority.
    pub hook: Option<(Hook, i32)>,
    /// A base chain whose policy drops what falls off its end.
    pub policy_drop: bool,
    /// The rules.
    pub rules: Vec<TraceRule>,
}

/// A table: its chains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceTable {
    /// The table's name (`nat`, `istio-proxy-nat`…).
    pub name: String,
    /// `None` for an nft `inet` table, which holds both families.
    pub family: Option<Family>,
    /// Its chains, in the order declared.
    pub chains: Vec<TraceChain>,
}

impl TraceTable {
    /// The chain called `name`.
    pub fn chain(&self, name: &str) -> Option<&TraceChain> {
        self.chains.iter().find(|c| c.name == name)
    }

    /// The chain called `name`, created (without hook) if absent.
    pub fn chain_mut(&mut self, name: &str) -> &mut TraceChain {
        if let Some(i) = self.chains.iter().position(|c| c.name == name) {
            return &mut self.chains[i];
        }
        self.chains.push(TraceChain {
            name: name.to_owned(),
            hook: None,
            policy_drop: false,
            rules: Vec::new(),
        });
        self.chains.last_mut().expect("just pushed")
    }
}

/// Everything read from one source, ready to trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// The tables.
    pub tables: Vec<TraceTable>,
}

impl Ruleset {
    /// The table with this name and family, created if absent.
    pub fn table_mut(&mut self, name: &str, family: Option<Family>) -> &mut TraceTable {
        if let Some(i) = self
            .tables
            .iter()
            .position(|t| t.name == name && t.family == family)
        {
            return &mut self.tables[i];
        }
        self.tables.push(TraceTable {
            name: name.to_owned(),
            family,
            chains: Vec::new(),
        });
        self.tables.last_mut().expect("just pushed")
    }
}
