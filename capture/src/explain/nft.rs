//! Reading nftables rules for tracing and comparison, from either form they come in: the
//! `nft -f` program Remora (or Istio) writes (`add rule inet T C …`, `insert rule … index N …`)
//! or the listing `nft list ruleset` prints (`table inet T { chain C { … } }`).
//!
//! The two forms spell the same rule differently (`skuid 3` vs `meta skuid 3`, `mark 1337`
//! vs `meta mark 0x00000539`, `127.0.0.6/32` vs `127.0.0.6`, a `meta l4proto tcp` that the
//! listing drops when a `tcp dport` implies it, interface names in quotes). Parsing both into
//! the tracer's model and normalising that is what lets [`same_rules`] compare them.

use crate::cidr::Cidr;
use crate::explain::model::{
    Action, CtState, Family, Hook, Mark, Match, Ports, Proto, Ruleset, Test, TraceRule,
};

/// Whether the text looks like nftables rather than iptables rules.
pub fn looks_like_nft(text: &str) -> bool {
    text.lines().map(str::trim).any(|l| {
        l.starts_with("table ") || l.starts_with("add table ") || l.starts_with("add rule ")
    })
}

/// Parses a program or a listing (or a mix, applied in order).
pub fn parse(text: &str) -> Ruleset {
    let mut set = Ruleset::default();
    let mut table: Option<(String, Option<Family>)> = None;
    let mut chain: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["table", family, name, "{"] => {
                table = Some(((*name).to_owned(), family_of(family)));
                set.table_mut(name, family_of(family));
            }
            ["chain", name, "{"] => {
                chain = Some((*name).to_owned());
                if let Some((t, f)) = &table {
                    set.table_mut(t, *f).chain_mut(name);
                }
            }
            ["}"] => {
                if chain.take().is_none() {
                    table = None;
                }
            }
            ["type", ..] if chain.is_some() => {
                if let (Some((t, f)), Some(c)) = (&table, &chain) {
                    let c = set.table_mut(t, *f).chain_mut(c);
                    c.hook = base_chain(line);
                    c.policy_drop = line.contains("policy drop");
                }
            }
            ["policy", policy, ..] => {
                if let (Some((t, f)), Some(c)) = (&table, &chain) {
                    let drop = policy.trim_end_matches(';') == "drop";
                    set.table_mut(t, *f).chain_mut(c).policy_drop = drop;
                }
            }
            ["flags", ..] | ["comment", ..] => {}
            ["add" | "create", "table", family, name, ..] => {
                set.table_mut(name, family_of(family));
            }
            ["delete", "table", family, name, ..] => {
                let family = family_of(family);
                set.tables
                    .retain(|t| !(t.name == *name && t.family == family));
            }
            ["flush", "table", family, name, ..] => {
                for c in &mut set.table_mut(name, family_of(family)).chains {
                    c.rules.clear();
                }
            }
            ["add" | "create", "chain", family, t, name, ..] => {
                let hook = base_chain(line);
                let c = set.table_mut(t, family_of(family)).chain_mut(name);
                if hook.is_some() {
                    c.hook = hook;
                    c.policy_drop = line.contains("policy drop");
                }
            }
            ["add" | "insert", "rule", family, t, c, rest @ ..] => {
                let (index, rest) = match rest {
                    ["index" | "position" | "handle", n, rest @ ..] => {
                        (n.parse::<usize>().ok(), rest)
                    }
                    _ => (None, rest),
                };
                let rule = parse_rule(&rest.join(" "));
                let rules = &mut set.table_mut(t, family_of(family)).chain_mut(c).rules;
                // `insert … index i` puts the rule at i; `add … index i` after it.
                let at = match (words[0], index) {
                    ("insert", Some(i)) => i.min(rules.len()),
                    ("insert", None) => 0,
                    (_, Some(i)) => (i + 1).min(rules.len()),
                    (_, None) => rules.len(),
                };
                rules.insert(at, rule);
            }
            _ => {
                if let (Some((t, f)), Some(c)) = (&table, &chain) {
                    let rule = parse_rule(line);
                    set.table_mut(t, *f).chain_mut(c).rules.push(rule);
                }
            }
        }
    }
    set
}

fn family_of(word: &str) -> Option<Family> {
    match word {
        "ip" => Some(Family::V4),
        "ip6" => Some(Family::V6),
        _ => None,
    }
}

/// The hook and priority in `… type T hook H priority P ; …`.
fn base_chain(line: &str) -> Option<(Hook, i32)> {
    let words: Vec<&str> = line
        .split(|c: char| c.is_whitespace() || c == ';' || c == '{' || c == '}')
        .filter(|w| !w.is_empty())
        .collect();
    let after = |key: &str| {
        let i = words.iter().position(|w| *w == key)?;
        words.get(i + 1).copied()
    };
    let hook = Hook::from_chain(after("hook")?)?;
    let i = words.iter().position(|w| *w == "priority")?;
    let base = match words.get(i + 1)? {
        &"raw" => -300,
        &"mangle" => -150,
        &"dstnat" => -100,
        &"filter" => 0,
        &"security" => 50,
        &"srcnat" => 100,
        n => n.parse().ok()?,
    };
    let offset = match (words.get(i + 2), words.get(i + 3)) {
        (Some(&"+"), Some(n)) => n.parse().ok()?,
        (Some(&"-"), Some(n)) => -n.parse::<i32>().ok()?,
        _ => 0,
    };
    Some((hook, base + offset))
}

/// Splits a rule into words, keeping `{ … }` sets and `"…"` strings whole.
fn tokens(rule: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = rule.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '{' {
            let set: String = chars.by_ref().take_while(|&c| c != '}').collect();
            out.push(format!("{set}}}"));
        } else if c == '"' {
            chars.next();
            out.push(chars.by_ref().take_while(|&c| c != '"').collect());
        } else {
            let mut word = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                word.push(c);
                chars.next();
            }
            out.push(word);
        }
    }
    out
}

/// The inside of `{ a, b }`, or the word itself.
fn set_items(word: &str) -> String {
    word.trim_start_matches('{')
        .trim_end_matches('}')
        .trim()
        .to_owned()
}

/// Parses one rule's text.
pub fn parse_rule(text: &str) -> TraceRule {
    let words = tokens(text);
    let mut rule = TraceRule {
        matches: Vec::new(),
        actions: Vec::new(),
        packets: None,
        text: text.to_owned(),
    };
    let mut i = 0;
    let word = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    while i < words.len() {
        let w = word(i);
        // A keyword, then for a match an optional `!=`, then the value.
        let (negated, value_at) = if word(i + 1) == "!=" {
            (true, i + 2)
        } else {
            (false, i + 1)
        };
        let mut push = |test: Test, negated: bool| rule.matches.push(Match { negated, test });
        match w {
            "counter" => {
                rule.actions.push(Action::Counter);
                if word(i + 1) == "packets" {
                    rule.packets = word(i + 2).parse().ok();
                    i += 4;
                }
                i += 1;
            }
            "return" | "accept" | "drop" | "reject" => {
                rule.actions.push(match w {
                    "return" => Action::Return,
                    "accept" => Action::Accept,
                    "drop" => Action::Drop,
                    _ => Action::Reject,
                });
                i += 1;
            }
            "jump" | "goto" => {
                let target = word(i + 1).to_owned();
                rule.actions.push(if w == "jump" {
                    Action::Jump(target)
                } else {
                    Action::Goto(target)
                });
                i += 2;
            }
            "iifname" | "oifname" => {
                let name = word(value_at).to_owned();
                let test = if w == "iifname" {
                    Test::InInterface(name)
                } else {
                    Test::OutInterface(name)
                };
                push(test, negated);
                i = value_at + 1;
            }
            "ip" | "ip6" if matches!(word(i + 1), "saddr" | "daddr") => {
                let family = if w == "ip" { Family::V4 } else { Family::V6 };
                let (negated, value_at) = if word(i + 2) == "!=" {
                    (true, i + 3)
                } else {
                    (false, i + 2)
                };
                push(Test::Family(family), false);
                let test = match Cidr::parse_lenient(word(value_at)) {
                    Ok(c) if word(i + 1) == "saddr" => Test::Source(c),
                    Ok(c) => Test::Destination(c),
                    Err(_) => Test::Unknown(format!("{w} {} {}", word(i + 1), word(value_at))),
                };
                push(test, negated);
                i = value_at + 1;
            }
            "tcp" | "udp" if matches!(word(i + 1), "dport" | "sport") => {
                let proto = Proto::parse(w).expect("tcp or udp");
                let (negated, value_at) = if word(i + 2) == "!=" {
                    (true, i + 3)
                } else {
                    (false, i + 2)
                };
                let test = match Ports::parse(&set_items(word(value_at))) {
                    Some(p) if word(i + 1) == "dport" => Test::DestinationPort(proto, p),
                    Some(p) => Test::SourcePort(proto, p),
                    None => Test::Unknown(format!("{w} {} {}", word(i + 1), word(value_at))),
                };
                push(test, negated);
                i = value_at + 1;
            }
            "meta" if word(i + 1) == "mark" && word(i + 2) == "set" => {
                i = mark_set(&words, i + 3, &mut rule.actions, false);
            }
            "mark" if word(i + 1) == "set" => {
                i = mark_set(&words, i + 2, &mut rule.actions, false);
            }
            "meta" => {
                // `meta KEY …` reads like `KEY …`.
                i += 1;
                continue_meta(&words, &mut i, &mut rule.matches);
            }
            "skuid" | "skgid" | "mark" | "l4proto" | "nfproto" => {
                continue_meta(&words, &mut i, &mut rule.matches);
            }
            "ct" => {
                let key = word(i + 1);
                let (negated, value_at) = if word(i + 2) == "!=" {
                    (true, i + 3)
                } else {
                    (false, i + 2)
                };
                match (key, word(i + 2)) {
                    ("mark", "set") => {
                        i = mark_set(&words, i + 3, &mut rule.actions, true);
                    }
                    ("zone", "set") => {
                        let zone = word(i + 3);
                        rule.actions.push(match zone.parse() {
                            Ok(z) => Action::CtZone(z),
                            Err(_) => Action::Unknown(format!("ct zone set {zone}")),
                        });
                        i += 4;
                    }
                    ("state", _) => {
                        let states: Option<Vec<CtState>> = set_items(word(value_at))
                            .split(',')
                            .map(|s| CtState::parse(s.trim()))
                            .collect();
                        let test = match states {
                            Some(s) => Test::CtState(s),
                            None => Test::Unknown(format!("ct state {}", word(value_at))),
                        };
                        push(test, negated);
                        i = value_at + 1;
                    }
                    ("mark", _) => {
                        let test = match Mark::parse(word(value_at)) {
                            Some(m) => Test::ConnMark(m),
                            None => Test::Unknown(format!("ct mark {}", word(value_at))),
                        };
                        push(test, negated);
                        i = value_at + 1;
                    }
                    _ => {
                        push(Test::Unknown(format!("ct {key} {}", word(i + 2))), false);
                        i += 3;
                    }
                }
            }
            "redirect" => {
                let port = if word(i + 1) == "to" { word(i + 2) } else { "" };
                rule.actions
                    .push(match port.strip_prefix(':').and_then(|p| p.parse().ok()) {
                        Some(p) => Action::Redirect(p),
                        None => Action::Unknown(format!("redirect {port}")),
                    });
                i += if port.is_empty() { 1 } else { 3 };
            }
            "tproxy" => {
                let mut j = i + 1;
                if matches!(word(j), "ip" | "ip6") {
                    j += 1;
                }
                let port = if word(j) == "to" { word(j + 1) } else { "" };
                let port = port.rsplit(':').next().and_then(|p| p.parse().ok());
                rule.actions.push(match port {
                    Some(port) => Action::Tproxy { port, mark: None },
                    None => Action::Unknown("tproxy".to_owned()),
                });
                i = j + 2;
            }
            other => {
                rule.matches.push(Match {
                    negated: false,
                    test: Test::Unknown(other.to_owned()),
                });
                i += 1;
            }
        }
    }
    rule
}

/// `skuid X`, `mark X`, `l4proto tcp` … (after an optional `meta`), at `words[*i]`.
fn continue_meta(words: &[String], i: &mut usize, matches: &mut Vec<Match>) {
    let word = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    let key = word(*i);
    let (negated, value_at) = if word(*i + 1) == "!=" {
        (true, *i + 2)
    } else {
        (false, *i + 1)
    };
    let value = word(value_at);
    let test = match key {
        "skuid" => Test::Uid(value.to_owned()),
        "skgid" => Test::Gid(value.to_owned()),
        "mark" => {
            Mark::parse(value).map_or_else(|| Test::Unknown(format!("mark {value}")), Test::Mark)
        }
        "l4proto" => Proto::parse(value)
            .map_or_else(|| Test::Unknown(format!("l4proto {value}")), Test::Proto),
        "nfproto" => match value {
            "ipv4" => Test::Family(Family::V4),
            "ipv6" => Test::Family(Family::V6),
            _ => Test::Unknown(format!("nfproto {value}")),
        },
        "iifname" => Test::InInterface(value.to_owned()),
        "oifname" => Test::OutInterface(value.to_owned()),
        other => Test::Unknown(format!("meta {other} {value}")),
    };
    matches.push(Match { negated, test });
    *i = value_at + 1;
}

/// `… set VALUE` for the packet mark (or, with `ct`, the connection mark); returns the next
/// word's index.
fn mark_set(words: &[String], at: usize, actions: &mut Vec<Action>, conn: bool) -> usize {
    let word = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    let (action, next) = match (conn, word(at), word(at + 1)) {
        (false, "ct", "mark") => (Action::RestoreMark, at + 2),
        (true, "meta", "mark") => (Action::SaveMark, at + 2),
        (true, "mark", _) => (Action::SaveMark, at + 1),
        (false, value, _) => match Mark::parse(value) {
            Some(m) => (Action::SetMark(m), at + 1),
            None => (Action::Unknown(format!("meta mark set {value}")), at + 1),
        },
        (true, value, _) => (Action::Unknown(format!("ct mark set {value}")), at + 1),
    };
    actions.push(action);
    next
}

/// Whether two texts (program or listing) hold the same tables, chains and rules, in order.
pub fn same_rules(a: &str, b: &str) -> bool {
    let (a, b) = (parse(a), parse(b));
    let key = |set: &Ruleset| {
        let mut tables: Vec<_> = set
            .tables
            .iter()
            .map(|t| {
                let mut chains: Vec<_> = t
                    .chains
                    .iter()
                    .map(|c| {
                        let rules: Vec<_> = c.rules.iter().map(TraceRule::canonical).collect();
                        (c.name.clone(), c.hook, rules)
                    })
                    .collect();
                chains.sort_by(|x, y| x.0.cmp(&y.0));
                (t.name.clone(), t.family, chains)
            })
            .collect();
        tables.sort_by(|x, y| (&x.0, x.1).cmp(&(&y.0, y.1)));
        tables
    };
    key(&a) == key(&b)
}

#[cfg(test)]
#[path = "nft_tests.rs"]
pub(crate) mod tests;
