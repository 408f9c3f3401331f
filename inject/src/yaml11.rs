//! YAML written for readers that speak YAML 1.1, as kubectl's does (sigs.k8s.io/yaml on
//! go-yaml v2). serde_yaml_ng quotes a string only where YAML 1.2 would read it as something
//! else, so a string such as `yes`, `on`, `1_000` or `2001-12-14` comes out plain, and a 1.1
//! reader takes it for a boolean, a number or a date: an annotation or an env value would stop
//! being a string. Such scalars get quotes here.
//!
//! A plain scalar is never quoted where YAML 1.2 reads it as a non-string: serde_yaml_ng wrote
//! it plain because it is one (a port number, `true`), and quoting it would change its type.

use regex::Regex;
use std::sync::LazyLock;

/// Plain scalars YAML 1.1 resolves to something other than a string (its bool, int, float,
/// timestamp, merge and value types).
static YAML11_TYPED: LazyLock<Regex> = LazyLock::new(|| {
    let typed = [
        r"y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF",
        r"[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+",
        r"[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+",
        r"[-+]?(?:[0-9][0-9_]*)?\.[0-9.]*(?:[eE][-+][0-9]+)?",
        r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*",
        r"[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
        r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]*)?(?:[ \t]*Z|[ \t]*[-+][0-9]{1,2}(?::[0-9]{2})?)?",
        r"<<|=",
    ];
    whole_match(&typed)
});

/// Plain scalars YAML 1.2's core schema resolves to something other than a string.
static YAML12_TYPED: LazyLock<Regex> = LazyLock::new(|| {
    let typed = [
        r"~|null|Null|NULL",
        r"true|True|TRUE|false|False|FALSE",
        r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+",
        r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?",
        r"[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
    ];
    whole_match(&typed)
});

/// A pattern matching a whole scalar that matches one of `alternatives`.
fn whole_match(alternatives: &[&str]) -> Regex {
    Regex::new(&format!("^(?:{})$", alternatives.join("|"))).expect("a valid pattern")
}

/// `text` (serde_yaml_ng's block-style output) with every plain key and value that a YAML 1.1
/// reader would not take for a string single-quoted.
pub fn quote_for_yaml11(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    // Inside a block scalar (`|`, `>`), lines indented deeper than its key are its content.
    let mut block_indent: Option<usize> = None;
    for line in text.split_inclusive('\n') {
        let body = line.trim_end_matches('\n');
        let indent = body.len() - body.trim_start_matches(' ').len();
        if let Some(key_indent) = block_indent {
            if indent > key_indent || body.trim().is_empty() {
                out.push_str(line);
                continue;
            }
            block_indent = None;
        }
        let (rewritten, opens_block) = rewrite_line(body, indent);
        if opens_block {
            block_indent = Some(indent);
        }
        out.push_str(&rewritten);
        if line.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// One line: `- ` markers, then `key: value`, `key:` or a lone value. Returns the line and
/// whether it opens a block scalar.
fn rewrite_line(body: &str, indent: usize) -> (String, bool) {
    let mut out = String::from(&body[..indent]);
    let mut rest = &body[indent..];
    let mut items = 0;
    while let Some(after) = rest.strip_prefix("- ") {
        out.push_str("- ");
        rest = after;
        items += 1;
    }
    if rest == "-" {
        out.push_str(rest);
        return (out, false);
    }
    let (key, value) = match split_key(rest) {
        Some((key, value)) => (Some(key), value),
        // A line with neither a key nor an item marker continues a multi-line scalar.
        None if items == 0 => return (body.to_string(), false),
        None => (None, Some(rest)),
    };
    if let Some(key) = key {
        out.push_str(&quoted(key));
        out.push(':');
    }
    let mut opens_block = false;
    if let Some(value) = value {
        if key.is_some() {
            out.push(' ');
        }
        opens_block = value.starts_with('|') || value.starts_with('>');
        out.push_str(&quoted(value));
    }
    (out, opens_block)
}

/// `key: value` or `key:` at the start of `s`, the key plain or quoted.
fn split_key(s: &str) -> Option<(&str, Option<&str>)> {
    let key_end = match s.as_bytes().first()? {
        b'\'' | b'"' => {
            let q = s.as_bytes()[0];
            // The closing quote; in a single-quoted key a doubled quote is an escaped one,
            // in a double-quoted key a backslash escapes.
            let mut i = 1;
            let bytes = s.as_bytes();
            loop {
                let b = *bytes.get(i)?;
                if q == b'"' && b == b'\\' {
                    i += 2;
                    continue;
                }
                if b == q {
                    if q == b'\'' && bytes.get(i + 1) == Some(&b'\'') {
                        i += 2;
                        continue;
                    }
                    break i + 1;
                }
                i += 1;
            }
        }
        _ => s.find(": ").or_else(|| s.strip_suffix(':').map(str::len))?,
    };
    let (key, after) = s.split_at(key_end);
    match after {
        ":" => Some((key, None)),
        _ => after.strip_prefix(": ").map(|value| (key, Some(value))),
    }
}

/// `scalar`, single-quoted if it is plain and YAML 1.1 would read it as anything but a string.
fn quoted(scalar: &str) -> String {
    if YAML11_TYPED.is_match(scalar) && !YAML12_TYPED.is_match(scalar) {
        format!("'{}'", scalar.replace('\'', "''"))
    } else {
        scalar.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_yaml_1_1_would_type_are_quoted_and_typed_values_stay_plain() {
        let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(
            "a: 'yes'\nb: 'on'\nc: 'off'\nd: 'y'\ne: '1_000'\nf: '1:20'\ng: '2001-12-14'\n\
             h: true\ni: 8080\nj: 1.5\nk: plain\nl: ['no', 'N', 3]\n'on': x\n\
             m:\n- name: FEATURE\n  value: 'on'\nn: \"it's\"\n",
        )
        .unwrap();
        let text = quote_for_yaml11(&serde_yaml_ng::to_string(&value).unwrap());
        for expected in [
            "a: 'yes'\n",
            "b: 'on'\n",
            "c: 'off'\n",
            "d: 'y'\n",
            "e: '1_000'\n",
            "f: '1:20'\n",
            "g: '2001-12-14'\n",
            "h: true\n",
            "i: 8080\n",
            "j: 1.5\n",
            "k: plain\n",
            "- 'no'\n",
            "- 'N'\n",
            "- 3\n",
            "'on': x\n",
            "  value: 'on'\n",
        ] {
            assert!(text.contains(expected), "{expected:?} not in:\n{text}");
        }
        // And it still reads back as the same document.
        let back: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(back, value);
    }

    #[test]
    fn block_scalars_and_continuations_are_left_alone() {
        let text = "a: |-\n  yes\n  on: off\nb:\n  - on\nc: x\n  yes\n";
        assert_eq!(
            quote_for_yaml11(text),
            "a: |-\n  yes\n  on: off\nb:\n  - 'on'\nc: x\n  yes\n"
        );
    }
}
