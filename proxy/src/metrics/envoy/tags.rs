//! Istio's tag extraction: how an Envoy in an Istio sidecar turns a dotted stat name into the
//! Prometheus name and labels of `/stats/prometheus`. pilot-agent's bootstrap turns Envoy's own
//! tags off (`use_all_default_tags: false`) and gives its own `stats_tags`; each is a regular
//! expression whose first group is cut out of the name and whose second group is the label's
//! value. Envoy matches every expression against the whole original name, cuts the union of
//! what they matched, drops the dots the cuts leave at the end, and writes what is left,
//! `envoy_`-prefixed, with every byte but a letter, digit or `_` as `_`.
//!
//! So a name keeps what no tag takes: istiod's connection-manager prefixes have no `;` for the
//! `http_conn_manager_prefix` tag to end at (`http.outbound_0.0.0.0_80.downstream_rq_total` is
//! `envoy_http_outbound_0_0_0_0_80_downstream_rq_total`), nor its cluster names unless the mesh
//! sets `outboundClusterStatName` (`cluster.outbound|80||web.ns.svc.cluster.local.…` is
//! `envoy_cluster_outbound_80__web_ns_svc_cluster_local_…`). Observed with Envoy 1.40 and the
//! bootstrap's tags (`xds_prometheus_tags`, the tests below).
//!
//! Each expression is matched here by hand, as ECMAScript (Envoy's `std::regex`) matches it:
//! the bootstrap's are fixed, and the data path never sees this (it runs at a scrape).

use std::ops::Range;

/// Where a tag matched: the bytes cut from the name and the label's value, as byte ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Found {
    cut: Range<usize>,
    value: Range<usize>,
}

type Extractor = fn(&str) -> Option<Found>;

/// The bootstrap's tags that name no first word, in its order: Envoy applies these first.
/// (`mongo_prefix`, `^mongo\.…`, is left out: no name of Remora's starts with `mongo.`.)
const ANY_NAME: [(&str, Extractor); 11] = [
    ("cluster_name", cluster_name),
    ("thread_name", thread_name),
    ("response_code", |n| response_code(n, false)),
    ("response_code_class", |n| response_code(n, true)),
    ("cache", |n| word_then_dot(n, "cache.")),
    ("component", |n| word_then_dot(n, "component.")),
    ("tag", tag),
    ("wasm_filter", |n| word_then_dot(n, "wasm_filter.")),
    ("authz_enforce_result", authz_enforce_result),
    ("authz_dry_run_action", authz_dry_run_action),
    ("authz_dry_run_result", authz_dry_run_result),
];

/// The tags whose expression starts with `^word\.` (or `^word(?=\.)`): Envoy applies these
/// after the others, to names whose first word is theirs, in the bootstrap's order.
const BY_FIRST_WORD: [(&str, &str, Extractor); 4] = [
    ("http", "http_conn_manager_prefix", http_conn_manager_prefix),
    ("tcp", "tcp_prefix", tcp_prefix),
    (
        "listener",
        "http_conn_manager_listener_prefix",
        http_conn_manager_listener_prefix,
    ),
    ("listener", "listener_address", listener_address),
];

/// The Prometheus name and labels Envoy prints for the dotted stat `name` under Istio's tags.
pub(crate) fn prometheus(name: &str) -> (String, Vec<(&'static str, String)>) {
    let first_word = name.split_once('.').map(|(w, _)| w);
    let tags = ANY_NAME.iter().copied().chain(
        BY_FIRST_WORD
            .iter()
            .filter(|(word, _, _)| Some(*word) == first_word)
            .map(|&(_, tag, extract)| (tag, extract)),
    );
    let mut cut = vec![false; name.len()];
    let mut labels = Vec::new();
    for (tag, extract) in tags {
        if let Some(found) = extract(name) {
            cut[found.cut].iter_mut().for_each(|c| *c = true);
            labels.push((tag, name[found.value].to_string()));
        }
    }
    let kept: Vec<u8> = name
        .bytes()
        .zip(&cut)
        .filter(|(_, cut)| !**cut)
        .map(|(b, _)| b)
        .collect();
    let end = kept.iter().rposition(|&b| b != b'.').map_or(0, |i| i + 1);
    let mut out = String::with_capacity(end + 6);
    out.push_str("envoy_");
    out.extend(
        kept[..end]
            .iter()
            .map(|&b| match b.is_ascii_alphanumeric() {
                true => char::from(b),
                false => '_',
            }),
    );
    (out, labels)
}

/// ECMAScript's `.` matches anything but a line terminator; of those only `\n` and `\r` are
/// single bytes (a name holding U+2028 would be matched too far: no Envoy name does).
fn no_line_break(s: &str) -> bool {
    !s.bytes().any(|b| b == b'\n' || b == b'\r')
}

/// `\w`.
fn word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The length of the run of `class` bytes at the start of `s`.
fn run(s: &str, class: impl Fn(u8) -> bool) -> usize {
    s.bytes().take_while(|&b| class(b)).count()
}

/// Every byte offset at which `s` holds `needle`, overlaps included, left to right.
fn occurrences<'a>(s: &'a str, needle: &'a str) -> impl Iterator<Item = usize> + 'a {
    (0..s.len()).filter(move |&i| s.as_bytes()[i..].starts_with(needle.as_bytes()))
}

/// `^cluster(\.(.+);)`: `.+` is greedy, so the value runs to the last `;`.
fn cluster_name(n: &str) -> Option<Found> {
    let rest = n.strip_prefix("cluster.")?;
    let line = &rest[..rest.find(['\n', '\r']).unwrap_or(rest.len())];
    let semi = 8 + line.rfind(';').filter(|&i| i > 0)?;
    Some(Found {
        cut: 7..semi + 1,
        value: 8..semi,
    })
}

/// `^server(\.(.+))\.watchdog`: greedy, to the last `.watchdog`.
fn thread_name(n: &str) -> Option<Found> {
    n.strip_prefix("server.")?;
    let at = occurrences(n, ".watchdog")
        .filter(|&i| i >= 8 && no_line_break(&n[7..i]))
        .last()?;
    Some(Found {
        cut: 6..at,
        value: 7..at,
    })
}

/// `_rq(_(\d{3}))$` and, for a class, `_rq(_(\dxx))$`.
fn response_code(n: &str, class: bool) -> Option<Found> {
    let len = n.len();
    let tail = n.as_bytes().get(len.checked_sub(7)?..)?;
    let code = &tail[4..];
    let digits = match class {
        true => code[0].is_ascii_digit() && &code[1..] == b"xx",
        false => code.iter().all(u8::is_ascii_digit),
    };
    (tail.starts_with(b"_rq_") && digits).then_some(Found {
        cut: len - 4..len,
        value: len - 3..len,
    })
}

/// Where `needle` next occurs in `s` at or after byte `from`.
fn find_from(s: &str, from: usize, needle: &[u8]) -> Option<usize> {
    let hay = s.as_bytes().get(from..)?;
    (0..hay.len())
        .find(|&i| hay[i..].starts_with(needle))
        .map(|i| from + i)
}

/// `(word\.(.+?)\.)` (`cache`, `component`, `wasm_filter`): the leftmost `word.` with a dot
/// after at least one more byte, up to that dot.
fn word_then_dot(n: &str, word: &str) -> Option<Found> {
    occurrences(n, word).find_map(|i| {
        let from = i + word.len();
        let dot = find_from(n, from + 1, b".")?;
        no_line_break(&n[from..dot]).then_some(Found {
            cut: i..dot + 1,
            value: from..dot,
        })
    })
}

/// `(tag\.(.+?);\.)`.
fn tag(n: &str) -> Option<Found> {
    occurrences(n, "tag.").find_map(|i| {
        let from = i + 4;
        let end = find_from(n, from + 1, b";.")?;
        no_line_break(&n[from..end]).then_some(Found {
            cut: i..end + 2,
            value: from..end,
        })
    })
}

/// The leftmost `lead` followed by one of `alternatives` (`rbac.` and `allowed` or `denied`
/// in `rbac(\.(allowed|denied))`): the cut starts `skip` bytes into the match and runs to its
/// end; the value is the alternative, less its last `trim` bytes.
fn leftmost(n: &str, lead: &str, alternatives: &[&str], skip: usize, trim: usize) -> Option<Found> {
    (0..n.len()).find_map(|i| {
        let rest = n.get(i..)?.strip_prefix(lead)?;
        let word = alternatives.iter().find(|w| rest.starts_with(**w))?;
        let end = i + lead.len() + word.len();
        Some(Found {
            cut: i + skip..end,
            value: end - word.len()..end - trim,
        })
    })
}

/// `rbac(\.(allowed|denied))`.
fn authz_enforce_result(n: &str) -> Option<Found> {
    leftmost(n, "rbac.", &["allowed", "denied"], 4, 0)
}

/// `(\.istio_dry_run_(allow|deny)_)`.
fn authz_dry_run_action(n: &str) -> Option<Found> {
    leftmost(n, ".istio_dry_run_", &["allow_", "deny_"], 0, 1)
}

/// `(\.shadow_(allowed|denied))`.
fn authz_dry_run_result(n: &str) -> Option<Found> {
    leftmost(n, ".shadow_", &["allowed", "denied"], 0, 0)
}

/// `[_.[:digit:]\w]`.
fn dotted_word(b: u8) -> bool {
    word_byte(b) || b == b'.'
}

/// `[_\[\]aAbBcCdDeEfF[:digit:]\w\:]`.
fn bracketed_word(b: u8) -> bool {
    word_byte(b) || matches!(b, b'[' | b']' | b':')
}

/// `^http\.(((?:[_.[:digit:]\w]*|[_\[\]aAbBcCdDeEfF[:digit:]\w\:]*));\.)`. Neither class holds
/// `;`, so each alternative can only end where its greedy run ends: there a `;.` must follow.
fn http_conn_manager_prefix(n: &str) -> Option<Found> {
    let rest = n.strip_prefix("http.")?;
    [run(rest, dotted_word), run(rest, bracketed_word)]
        .into_iter()
        .find(|&len| rest[len..].starts_with(";."))
        .map(|len| Found {
            cut: 5..5 + len + 2,
            value: 5..5 + len,
        })
}

/// `^tcp\.((.*?)\.)\w+?$`: what follows the cut is one `\w` word to the end, so the value runs
/// to the last dot.
fn tcp_prefix(n: &str) -> Option<Found> {
    let rest = n.strip_prefix("tcp.")?;
    let dot = rest.rfind('.')?;
    let last = &rest[dot + 1..];
    (!last.is_empty() && last.bytes().all(word_byte) && no_line_break(&rest[..dot])).then_some(
        Found {
            cut: 4..4 + dot + 1,
            value: 4..4 + dot,
        },
    )
}

/// `(?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*)\.` at the start of `s`: the length of the
/// value before the dot. The first class holds `.`, so its greedy run gives back to its last
/// dot; the second's run must be followed by one.
fn address_then_dot(s: &str) -> Option<usize> {
    let digits = run(s, |b| b.is_ascii_digit() || b == b'_' || b == b'.');
    s[..digits].rfind('.').or_else(|| {
        let hex = run(s, |b| {
            b.is_ascii_hexdigit() || matches!(b, b'_' | b'[' | b']')
        });
        s[hex..].starts_with('.').then_some(hex)
    })
}

/// `^listener\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)`.
fn listener_address(n: &str) -> Option<Found> {
    let len = address_then_dot(n.strip_prefix("listener.")?)?;
    Some(Found {
        cut: 9..9 + len + 1,
        value: 9..9 + len,
    })
}

/// `^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)`: the
/// leftmost `.http.` followed by an address and a dot.
fn http_conn_manager_listener_prefix(n: &str) -> Option<Found> {
    n.strip_prefix("listener.")?;
    occurrences(n, ".http.")
        .filter(|&i| i >= 8 && no_line_break(&n[8..i]))
        .find_map(|i| {
            let from = i + 6;
            let len = address_then_dot(&n[from..])?;
            Some(Found {
                cut: from..from + len + 1,
                value: from..from + len,
            })
        })
}

#[cfg(test)]
#[path = "tags_tests.rs"]
mod tests;
