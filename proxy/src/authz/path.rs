//! Request path normalisation, as Envoy does it for Istio's `pathNormalization`, so that a
//! policy on `/admin` also covers `/./admin`, `/%2e/admin` and `/x/../admin`.
//!
//! `base` is Envoy's `normalize_path`, the RFC 3986 canonicalisation Envoy took from Chromium:
//! `.` and `..` segments are resolved (also when a dot is written `%2e`), percent-escapes of
//! unreserved characters are decoded (`%41` is `A`), characters that may not appear in a path
//! are escaped, backslashes become slashes, and other escapes (`%2F` among them) are kept as
//! written. Repeated slashes are kept: `merge_slashes` merges them; `decode_and_merge_slashes`
//! first decodes `%2F` and `%5C`. The query string is never touched. A `%00` fails the request.

use remora_config::PathNormalization;
use std::borrow::Cow;

/// The path cannot be normalised (it holds a NUL); Envoy answers 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("path_normalization_failed")]
pub struct Unnormalizable;

/// How a byte is treated in a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Kept as it is.
    Pass,
    /// Kept as it is, and decoded when written as an escape: `A-Za-z0-9-_~`.
    Unreserved,
    /// Written as an escape (`%XX`).
    Escape,
    /// `.`, `\`, `%`: handled on their own.
    Special,
    /// NUL: fails.
    Invalid,
}

const fn class(b: u8) -> Class {
    match b {
        0 => Class::Invalid,
        b'.' | b'\\' | b'%' => Class::Special,
        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'~' => Class::Unreserved,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b'/' | b':' | b';'
        | b'=' | b'@' | b'[' | b']' => Class::Pass,
        // Controls, space, `"`, `#`, `<`, `>`, `?`, `^`, backquote, `{`, `|`, `}`, DEL and
        // every byte above 0x7f.
        _ => Class::Escape,
    }
}

/// Normalise the path of `path_and_query` as `mode` says; `Borrowed` when nothing changes.
pub fn normalize(
    path_and_query: &str,
    mode: PathNormalization,
) -> Result<Cow<'_, str>, Unnormalizable> {
    // `*` (OPTIONS) and anything that is not an absolute path is left alone.
    if mode == PathNormalization::None || !path_and_query.starts_with('/') {
        return Ok(Cow::Borrowed(path_and_query));
    }
    // Nearly every path is plain: none of the bytes canonicalisation acts on, so (merging no
    // slashes) nothing to do, and no allocation to find that out.
    if mode == PathNormalization::Base && is_plain(path_and_query) {
        return Ok(Cow::Borrowed(path_and_query));
    }
    let (path, query) = match path_and_query.find('?') {
        Some(i) => path_and_query.split_at(i),
        None => (path_and_query, ""),
    };
    let decoded;
    let path = if mode == PathNormalization::DecodeAndMergeSlashes {
        decoded = decode_slashes(path);
        &decoded
    } else {
        path
    };
    let mut out = canonicalize(path.as_bytes())?;
    if matches!(
        mode,
        PathNormalization::MergeSlashes | PathNormalization::DecodeAndMergeSlashes
    ) {
        out.dedup_by(|a, b| *a == b'/' && *b == b'/');
    }
    out.extend_from_slice(query.as_bytes());
    if out == path_and_query.as_bytes() {
        return Ok(Cow::Borrowed(path_and_query));
    }
    // Every byte written is ASCII: escapes replaced anything else.
    Ok(Cow::Owned(String::from_utf8_lossy(&out).into_owned()))
}

/// `%2F`/`%2f` to `/` and `%5C`/`%5c` to `\` (Envoy's `UNESCAPE_AND_FORWARD`).
fn decode_slashes(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let escape = rest.get(i..i + 3).unwrap_or("");
        match escape {
            "%2F" | "%2f" => out.push('/'),
            "%5C" | "%5c" => out.push('\\'),
            _ => {
                out.push('%');
                rest = &rest[i + 1..];
                continue;
            }
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    out
}

/// Whether the path of `path_and_query` holds only bytes canonicalisation keeps as they are
/// (no dot, `%`, backslash, or byte it escapes), so it is already in normal form.
fn is_plain(path_and_query: &str) -> bool {
    path_and_query
        .bytes()
        .take_while(|b| *b != b'?')
        .all(|b| PLAIN[usize::from(b)])
}

/// [`class`] `Pass` or `Unreserved`, by byte: one load per byte of every routed request's
/// path, instead of a chain of range tests.
const PLAIN: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = matches!(class(b as u8), Class::Pass | Class::Unreserved);
        b += 1;
    }
    table
};

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// The byte a `%XX` at `at` stands for.
fn escaped(p: &[u8], at: usize) -> Option<u8> {
    match (p.get(at), p.get(at + 1), p.get(at + 2)) {
        (Some(b'%'), Some(&h), Some(&l)) => Some(hex(h)? << 4 | hex(l)?),
        _ => None,
    }
}

/// The length of a dot at `at`: `.` is 1, `%2e` or `%2E` is 3, anything else 0.
fn dot_len(p: &[u8], at: usize) -> usize {
    match p.get(at) {
        Some(b'.') => 1,
        Some(b'%') if escaped(p, at) == Some(b'.') => 3,
        _ => 0,
    }
}

fn is_slash(p: &[u8], at: usize) -> bool {
    matches!(p.get(at), Some(b'/' | b'\\'))
}

/// What a dot that starts a segment means, and how many more bytes it takes.
enum Dot {
    /// Part of a name (`.hidden`).
    Name,
    /// `.`: this directory; skip it and the slash after it.
    Current(usize),
    /// `..`: up one; skip it and the slash after it.
    Up(usize),
}

fn classify_dot(p: &[u8], after: usize) -> Dot {
    if after == p.len() {
        return Dot::Current(0);
    }
    if is_slash(p, after) {
        return Dot::Current(1);
    }
    let second = dot_len(p, after);
    if second > 0 {
        let end = after + second;
        if end == p.len() {
            return Dot::Up(second);
        }
        if is_slash(p, end) {
            return Dot::Up(second + 1);
        }
    }
    Dot::Name
}

fn push_escape(out: &mut Vec<u8>, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
}

/// Chromium's path canonicalisation, as Envoy's `normalize_path` runs it.
fn canonicalize(p: &[u8]) -> Result<Vec<u8>, Unnormalizable> {
    let mut out: Vec<u8> = Vec::with_capacity(p.len() + 1);
    if !is_slash(p, 0) {
        out.push(b'/');
    }
    let mut failed = false;
    // Where, in `out`, a `%` was copied that did not start a valid escape in the input.
    let mut loose_percent: Option<usize> = None;
    let mut i = 0;
    while i < p.len() {
        let b = p[i];
        let dots = dot_len(p, i);
        if dots > 0 {
            if out.last() == Some(&b'/') {
                match classify_dot(p, i + dots) {
                    Dot::Name => out.push(b'.'),
                    Dot::Current(more) => i += more,
                    Dot::Up(more) => {
                        up_one(&mut out);
                        i += more;
                    }
                }
            } else {
                out.push(b'.');
            }
            i += dots;
            continue;
        }
        match class(b) {
            Class::Pass | Class::Unreserved => out.push(b),
            Class::Escape => push_escape(&mut out, b),
            Class::Invalid => {
                push_escape(&mut out, b);
                failed = true;
            }
            Class::Special if b == b'\\' => out.push(b'/'),
            Class::Special => match escaped(p, i) {
                Some(v) if class(v) == Class::Unreserved => {
                    out.push(v);
                    i += 2;
                    guard_nested_escape(p, i + 1, &mut out, loose_percent);
                }
                Some(v) => {
                    // Kept exactly as written, hex case included: a server may care.
                    out.extend_from_slice(&p[i..i + 3]);
                    failed |= class(v) == Class::Invalid;
                    i += 2;
                }
                None => {
                    loose_percent = Some(out.len());
                    out.push(b'%');
                }
            },
        }
        i += 1;
    }
    if failed {
        return Err(Unnormalizable);
    }
    Ok(out)
}

/// `..`: drop the last segment of `out`, which ends with a slash; never above the root.
fn up_one(out: &mut Vec<u8>) {
    let last = out.len() - 1;
    if last == 0 {
        return;
    }
    let keep = out[..last].iter().rposition(|&b| b == b'/').unwrap_or(0);
    out.truncate(keep + 1);
}

/// After decoding an escape right behind a `%` that started no escape (`%%30`), the output may
/// now read as an escape (`%0` and a `0` next): Chromium then writes that `%` as `%25`, so the
/// result cannot be decoded into something else later.
fn guard_nested_escape(p: &[u8], next: usize, out: &mut Vec<u8>, loose: Option<usize>) {
    let Some(at) = loose else { return };
    let len = out.len();
    if at + 3 < len {
        return;
    }
    // `%c` so far: the next input byte may complete it.
    let borrowed = at + 2 == len;
    if borrowed {
        match p.get(next) {
            Some(&b) if b.is_ascii() => out.push(b),
            _ => return,
        }
    }
    if escaped(out, at).is_some() {
        if borrowed {
            out.pop();
        }
        out.splice(at + 1..at + 1, *b"25");
    } else if borrowed {
        out.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PathNormalization::*;

    fn n(path: &str, mode: PathNormalization) -> String {
        normalize(path, mode).expect("normalizable").into_owned()
    }

    #[test]
    fn base_resolves_dots_and_decodes_unreserved() {
        let cases = [
            ("/admin", "/admin"),
            ("/./admin", "/admin"),
            ("/%2e/admin", "/admin"),
            ("/%2E/admin", "/admin"),
            ("/x/../admin", "/admin"),
            ("/x/%2e%2e/admin", "/admin"),
            ("/x/.%2E/admin", "/admin"),
            ("/admin/../admin", "/admin"),
            ("/../../admin", "/admin"),
            ("/a/b/..", "/a/"),
            ("/a/.", "/a/"),
            ("/a/..b/c", "/a/..b/c"),
            ("/a/.b", "/a/.b"),
            ("/a.b/c", "/a.b/c"),
            ("/%61dmin", "/admin"),
            ("/%7euser", "/~user"),
            ("/a%2Fb", "/a%2Fb"),
            ("/a%2fb", "/a%2fb"),
            ("//admin", "//admin"),
            ("/\\admin", "//admin"),
            ("/x\\..\\admin", "/admin"),
            ("/a b", "/a%20b"),
            ("/{x}", "/%7Bx%7D"),
            ("/100%", "/100%"),
            ("/%zz", "/%zz"),
            ("/%%30%30", "/%2500"),
            ("/admin?x=/../y&%2e", "/admin?x=/../y&%2e"),
            ("/x/../admin?q", "/admin?q"),
            ("*", "*"),
        ];
        for (input, want) in cases {
            assert_eq!(n(input, Base), want, "{input}");
        }
    }

    #[test]
    fn merging_and_decoding_slashes_are_extra_modes() {
        assert_eq!(n("//admin//x", MergeSlashes), "/admin/x");
        assert_eq!(n("/a%2Fb", MergeSlashes), "/a%2Fb");
        assert_eq!(n("/a%2F%2Fadmin", DecodeAndMergeSlashes), "/a/admin");
        assert_eq!(n("/x%2F..%2Fadmin", DecodeAndMergeSlashes), "/admin");
        assert_eq!(n("/x%5C..%5Cadmin", DecodeAndMergeSlashes), "/admin");
        assert_eq!(n("/./a//b", None), "/./a//b");
    }

    #[test]
    fn unchanged_paths_are_borrowed_and_nul_fails() {
        assert!(matches!(normalize("/a/b?c", Base), Ok(Cow::Borrowed(_))));
        assert_eq!(normalize("/a%00b", Base), Err(Unnormalizable));
    }
}
