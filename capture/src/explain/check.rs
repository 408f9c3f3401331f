//! `explain --check`: what is installed against what a set of flags would install, chain by
//! chain, rule by rule, compared by meaning rather than spelling (see
//! [`TraceRule::canonical`]).
//!
//! Only what Remora owns is compared: its chains (`ISTIO_*`, or every chain of its nft
//! tables) and, in built-in chains, the jumps into them and the rules the flags would put
//! there. Everything else in the tables belongs to someone else.

use std::fmt::Write as _;

use crate::explain::model::{Action, Family, Ruleset, TraceChain, TraceRule};
use crate::rules::is_own_chain;

/// One line of a chain's comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// In both.
    Same(String),
    /// Wanted, not installed.
    Missing(String),
    /// Installed, not wanted.
    Extra(String),
}

/// The comparison of one chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainDiff {
    /// `nat/ISTIO_OUTPUT (IPv4)` or the like.
    pub name: String,
    /// Rule by rule, in order.
    pub lines: Vec<Line>,
}

impl ChainDiff {
    /// Whether the chain differs.
    pub fn differs(&self) -> bool {
        self.lines.iter().any(|l| !matches!(l, Line::Same(_)))
    }
}

/// Compares the part of `installed` that is ours with `wanted`.
pub fn compare(installed: &Ruleset, wanted: &Ruleset) -> Vec<ChainDiff> {
    let mut keys: Vec<(String, Option<Family>, String)> = Vec::new();
    for set in [wanted, installed] {
        for t in &set.tables {
            for c in &t.chains {
                let ours = is_own_table(&t.name) || is_own_chain(&c.name);
                let key = (t.name.clone(), t.family, c.name.clone());
                let relevant = ours || !owned_rules(wanted, &key, c).is_empty();
                if relevant && !keys.contains(&key) {
                    keys.push(key);
                }
            }
        }
    }
    keys.iter()
        .map(|key| {
            fn find<'s>(
                set: &'s Ruleset,
                wanted: &Ruleset,
                key: &(String, Option<Family>, String),
            ) -> Vec<&'s TraceRule> {
                set.tables
                    .iter()
                    .find(|t| t.name == key.0 && t.family == key.1)
                    .and_then(|t| t.chain(&key.2))
                    .map(|c| owned_rules(wanted, key, c))
                    .unwrap_or_default()
            }
            let family = match key.1 {
                Some(Family::V4) => " (IPv4)",
                Some(Family::V6) => " (IPv6)",
                None => "",
            };
            ChainDiff {
                name: format!("{}/{}{family}", key.0, key.2),
                lines: diff(&find(wanted, wanted, key), &find(installed, wanted, key)),
            }
        })
        .collect()
}

fn is_own_table(name: &str) -> bool {
    name.starts_with("istio-proxy-")
}

/// The rules of `chain` that are ours: all of them in our chains; in built-in chains, the
/// jumps into ours and the rules `wanted` puts there.
fn owned_rules<'a>(
    wanted: &Ruleset,
    key: &(String, Option<Family>, String),
    chain: &'a TraceChain,
) -> Vec<&'a TraceRule> {
    if is_own_table(&key.0) || is_own_chain(&chain.name) {
        return chain.rules.iter().collect();
    }
    let wanted_here: Vec<_> = wanted
        .tables
        .iter()
        .filter(|t| t.name == key.0 && t.family == key.1)
        .filter_map(|t| t.chain(&key.2))
        .flat_map(|c| c.rules.iter().map(TraceRule::canonical))
        .collect();
    chain
        .rules
        .iter()
        .filter(|r| {
            let jumps_in = r
                .actions
                .iter()
                .any(|a| matches!(a, Action::Jump(c) | Action::Goto(c) if is_own_chain(c)));
            jumps_in || wanted_here.contains(&r.canonical())
        })
        .collect()
}

/// A longest-common-subsequence diff of two rule lists (chains are short).
fn diff(wanted: &[&TraceRule], installed: &[&TraceRule]) -> Vec<Line> {
    let (w, i): (Vec<_>, Vec<_>) = (
        wanted.iter().map(|r| r.canonical()).collect(),
        installed.iter().map(|r| r.canonical()).collect(),
    );
    let mut lcs = vec![vec![0usize; i.len() + 1]; w.len() + 1];
    for a in (0..w.len()).rev() {
        for b in (0..i.len()).rev() {
            lcs[a][b] = if w[a] == i[b] {
                lcs[a + 1][b + 1] + 1
            } else {
                lcs[a + 1][b].max(lcs[a][b + 1])
            };
        }
    }
    let (mut a, mut b, mut lines) = (0, 0, Vec::new());
    while a < w.len() || b < i.len() {
        if a < w.len() && b < i.len() && w[a] == i[b] {
            lines.push(Line::Same(installed[b].text.clone()));
            (a, b) = (a + 1, b + 1);
        } else if a < w.len() && (b == i.len() || lcs[a + 1][b] >= lcs[a][b + 1]) {
            lines.push(Line::Missing(wanted[a].text.clone()));
            a += 1;
        } else {
            lines.push(Line::Extra(installed[b].text.clone()));
            b += 1;
        }
    }
    lines
}

/// The report: differing chains in full, a count of identical ones.
pub fn render(diffs: &[ChainDiff]) -> String {
    let mut out = String::new();
    let same = diffs.iter().filter(|d| !d.differs()).count();
    for d in diffs.iter().filter(|d| d.differs()) {
        let _ = writeln!(out, "{}:", d.name);
        for line in &d.lines {
            let _ = match line {
                Line::Same(t) => writeln!(out, "    {t}"),
                Line::Missing(t) => writeln!(out, "  - {t}    (wanted, not installed)"),
                Line::Extra(t) => writeln!(out, "  + {t}    (installed, not wanted)"),
            };
        }
    }
    let differing = diffs.len() - same;
    let _ = writeln!(
        out,
        "{differing} chain(s) differ, {same} identical (compared by meaning, not spelling)"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explain::{iptables, nft};
    use crate::test_support::config;

    fn ipt(argv: &[&str]) -> Ruleset {
        iptables::parse(&crate::generate(&config(argv)).dry_run_output(), Family::V4)
    }

    const SAVED: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        :ISTIO_INBOUND - [0:0]\n:ISTIO_IN_REDIRECT - [0:0]\n:ISTIO_OUTPUT - [0:0]\n:ISTIO_REDIRECT - [0:0]\n:FOREIGN - [0:0]\n\
        -A PREROUTING -p tcp -j ISTIO_INBOUND\n-A PREROUTING -j FOREIGN\n-A OUTPUT -j ISTIO_OUTPUT\n\
        -A ISTIO_INBOUND -p tcp -m tcp --dport 15008 -j RETURN\n-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT\n\
        -A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006\n\
        -A ISTIO_OUTPUT -s 127.0.0.6/32 -o lo -j RETURN\n\
        -A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -p tcp -m tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT\n\
        -A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN\n-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN\n\
        -A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -p tcp -m tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT\n\
        -A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN\n-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN\n\
        -A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN\n-A ISTIO_OUTPUT -j ISTIO_REDIRECT\n\
        -A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001\n-A FOREIGN -j RETURN\nCOMMIT\n";

    #[test]
    fn save_output_matches_the_flags_that_wrote_it() {
        let installed = iptables::parse(SAVED, Family::V4);
        let diffs = compare(&installed, &ipt(&["-b", "*", "-i", "*"]));
        assert!(diffs.iter().all(|d| !d.differs()), "{}", render(&diffs));
        assert!(
            !diffs.iter().any(|d| d.name.contains("FOREIGN")),
            "not ours"
        );
    }

    #[test]
    fn differences_are_shown_rule_by_rule() {
        let installed = iptables::parse(SAVED, Family::V4);
        let diffs = compare(
            &installed,
            &ipt(&["-b", "*", "-d", "15021", "-i", "10.0.0.0/8"]),
        );
        let inbound = diffs
            .iter()
            .find(|d| d.name == "nat/ISTIO_INBOUND (IPv4)")
            .unwrap();
        assert_eq!(
            inbound.lines,
            [
                Line::Same("-A ISTIO_INBOUND -p tcp -m tcp --dport 15008 -j RETURN".into()),
                Line::Missing("-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN".into()),
                Line::Same("-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT".into()),
            ]
        );
        let text = render(&diffs);
        assert!(
            text.contains("  + -A ISTIO_OUTPUT -j ISTIO_REDIRECT    (installed, not wanted)"),
            "{text}"
        );
        assert!(
            text.contains(
                "  - -A ISTIO_OUTPUT -d 10.0.0.0/8 -j ISTIO_REDIRECT    (wanted, not installed)"
            ),
            "{text}"
        );
        assert!(text.contains("2 chain(s) differ"), "{text}");
    }

    #[test]
    fn nft_listings_compare_with_programs() {
        let listing = nft::parse(nft::tests::LISTING);
        let program = |argv: &[&str]| nft::parse(&crate::nft::generate_nft(&config(argv)).script());
        let diffs = compare(&listing, &program(nft::tests::FLAGS));
        assert!(diffs.iter().all(|d| !d.differs()), "{}", render(&diffs));
        let diffs = compare(&listing, &program(&["-b", "8080"]));
        assert!(
            render(&diffs).contains("istio-proxy-nat/istio-inbound"),
            "{}",
            render(&diffs)
        );
    }
}
