//! The matchers Envoy's resources use everywhere (strings, headers, CIDR ranges), compiled once
//! at conversion so that matching on the data path never parses or fails.

use std::net::IpAddr;

/// A compiled regular expression (RE2 syntax is a subset of what `regex` reads, minus
/// backreferences, which RE2 has neither).
#[derive(Debug, Clone)]
pub struct Pattern(regex::Regex);

impl Pattern {
    /// Compile `re`, anchored as Envoy anchors `safe_regex`: the whole value must match.
    pub fn new(re: &str) -> Result<Pattern, regex::Error> {
        regex::Regex::new(&format!("^(?:{re})$")).map(Pattern)
    }

    /// Whether the whole of `value` matches.
    pub fn is_match(&self, value: &str) -> bool {
        self.0.is_match(value)
    }

    /// The source as compiled (anchored).
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Pattern) -> bool {
        self.as_str() == other.as_str()
    }
}

/// How a string is matched.
#[derive(Debug, Clone, PartialEq)]
pub enum StringMatch {
    Exact(String),
    Prefix(String),
    Suffix(String),
    Contains(String),
    Regex(Pattern),
}

/// Envoy's `StringMatcher`.
#[derive(Debug, Clone, PartialEq)]
pub struct StringMatcher {
    pub kind: StringMatch,
    /// Not applied to `Regex`, as in Envoy.
    pub ignore_case: bool,
}

impl StringMatcher {
    /// An exact, case-sensitive matcher.
    pub fn exact(s: &str) -> StringMatcher {
        StringMatcher {
            kind: StringMatch::Exact(s.to_string()),
            ignore_case: false,
        }
    }

    /// Whether `value` matches.
    pub fn matches(&self, value: &str) -> bool {
        // Compared in place (it runs per request and per RBAC rule): no lower-cased copies.
        let (v, ic) = (value.as_bytes(), self.ignore_case);
        let eq = |a: &[u8], b: &[u8]| {
            if ic {
                a.eq_ignore_ascii_case(b)
            } else {
                a == b
            }
        };
        match &self.kind {
            StringMatch::Exact(s) => eq(v, s.as_bytes()),
            StringMatch::Prefix(s) => v.len() >= s.len() && eq(&v[..s.len()], s.as_bytes()),
            StringMatch::Suffix(s) => {
                v.len() >= s.len() && eq(&v[v.len() - s.len()..], s.as_bytes())
            }
            StringMatch::Contains(s) => {
                s.is_empty() || v.windows(s.len()).any(|w| eq(w, s.as_bytes()))
            }
            StringMatch::Regex(p) => p.is_match(value),
        }
    }
}

/// Envoy's `HeaderMatcher`, for the kinds Remora implements.
#[derive(Debug, Clone, PartialEq)]
pub struct HeaderMatcher {
    /// Lower-case header name (`:method` and `:authority` for the pseudo-headers).
    pub name: String,
    pub kind: HeaderMatch,
    /// The match result is inverted.
    pub invert: bool,
}

/// What a header must be.
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderMatch {
    /// Its value matches.
    Value(StringMatcher),
    /// Present (`true`) or absent (`false`).
    Present(bool),
}

impl HeaderMatcher {
    /// Whether a request whose value for this header is `value` matches. As Envoy's, a
    /// value matcher never matches an absent header, inverted or not (Envoy's
    /// `treat_missing_header_as_empty`, which would change that, is not read).
    pub fn matches(&self, value: Option<&str>) -> bool {
        let hit = match (&self.kind, value) {
            (HeaderMatch::Present(want), v) => v.is_some() == *want,
            (HeaderMatch::Value(m), Some(v)) => m.matches(v),
            (HeaderMatch::Value(_), None) => return false,
        };
        hit != self.invert
    }

    /// Whether a request whose values for this header are those `each` visits matches, as
    /// Envoy 1.40 matches a repeated header (since the fix of CVE-2026-26308): a value
    /// matcher matches when any one value does (the values are not joined, so `a,b` never
    /// matches two lines `a` and `b`), and `invert` then inverts that; a header sent with an
    /// empty value is present. `each` hands every value to its visitor until the visitor
    /// returns true, and says whether it did.
    pub fn matches_each(&self, each: impl FnOnce(&mut dyn FnMut(&str) -> bool) -> bool) -> bool {
        let hit = match &self.kind {
            HeaderMatch::Present(want) => each(&mut |_| true) == *want,
            HeaderMatch::Value(m) => {
                let mut present = false;
                let hit = each(&mut |v| {
                    present = true;
                    m.matches(v)
                });
                if !present {
                    return false;
                }
                hit
            }
        };
        hit != self.invert
    }
}

/// An address range (`10.0.0.0/8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CidrRange {
    pub address: IpAddr,
    pub prefix_len: u8,
}

impl CidrRange {
    /// Whether `ip` is inside (an IPv4 range never holds an IPv6 address or back).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.address, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let len = u32::from(self.prefix_len.min(32));
                let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let len = u32::from(self.prefix_len.min(128));
                let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_matchers() {
        let m = StringMatcher {
            kind: StringMatch::Prefix("/API".into()),
            ignore_case: true,
        };
        assert!(m.matches("/api/v1"));
        assert!(!m.matches("/ap"));
        let re = StringMatcher {
            kind: StringMatch::Regex(Pattern::new(".*/ns/test/.*").expect("re")),
            ignore_case: false,
        };
        assert!(re.matches("spiffe://cluster.local/ns/test/sa/x"));
        // Anchored: a partial match is no match.
        let re = Pattern::new("ns").expect("re");
        assert!(!re.is_match("/ns/"));
        assert!(StringMatcher::exact("GET").matches("GET"));
        let contains = StringMatcher {
            kind: StringMatch::Contains("/NS/".into()),
            ignore_case: true,
        };
        assert!(contains.matches("spiffe://td/ns/default"));
        assert!(!contains.matches("/n"));
        let suffix = StringMatcher {
            kind: StringMatch::Suffix(".local".into()),
            ignore_case: false,
        };
        assert!(suffix.matches("a.svc.cluster.local"));
        assert!(!suffix.matches("a.LOCAL"));
        assert!(!StringMatcher::exact("GET").matches("get"));
    }

    #[test]
    fn header_matchers() {
        let present = HeaderMatcher {
            name: "x".into(),
            kind: HeaderMatch::Present(true),
            invert: false,
        };
        assert!(present.matches(Some("")));
        assert!(!present.matches(None));
        let inverted = HeaderMatcher {
            invert: true,
            ..present
        };
        assert!(inverted.matches(None));
        // Envoy: an absent header matches no value matcher, inverted or not.
        let not_prod = HeaderMatcher {
            name: "x-env".into(),
            kind: HeaderMatch::Value(StringMatcher::exact("prod")),
            invert: true,
        };
        assert!(!not_prod.matches(None));
        assert!(not_prod.matches(Some("dev")));
        assert!(!not_prod.matches(Some("prod")));
    }

    #[test]
    fn cidr_ranges() {
        let any = CidrRange {
            address: "0.0.0.0".parse().expect("ip"),
            prefix_len: 0,
        };
        assert!(any.contains("10.1.2.3".parse().expect("ip")));
        assert!(!any.contains("::1".parse().expect("ip")));
        let net = CidrRange {
            address: "10.1.0.0".parse().expect("ip"),
            prefix_len: 16,
        };
        assert!(net.contains("10.1.200.3".parse().expect("ip")));
        assert!(!net.contains("10.2.0.1".parse().expect("ip")));
        let host = CidrRange {
            address: "fd00::1".parse().expect("ip"),
            prefix_len: 128,
        };
        assert!(host.contains("fd00::1".parse().expect("ip")));
        assert!(!host.contains("fd00::2".parse().expect("ip")));
    }

    #[test]
    fn a_repeated_header_is_matched_value_by_value_as_envoy_1_40_does() {
        let m = |kind, invert| HeaderMatcher {
            name: "x-role".into(),
            kind,
            invert,
        };
        let exact = |v: &str| HeaderMatch::Value(StringMatcher::exact(v));
        let sent = |values: &'static [&'static str]| {
            move |visit: &mut dyn FnMut(&str) -> bool| values.iter().any(|v| visit(v))
        };
        assert!(m(exact("admin"), false).matches_each(sent(&["user", "admin"])));
        assert!(!m(exact("user,admin"), false).matches_each(sent(&["user", "admin"])));
        assert!(!m(exact("admin"), false).matches_each(sent(&["user, admin"])));
        // Inverted: no value may match; absent never matches a value matcher.
        assert!(!m(exact("user"), true).matches_each(sent(&["user", "admin"])));
        assert!(m(exact("user"), true).matches_each(sent(&["admin"])));
        assert!(!m(exact("user"), true).matches_each(sent(&[])));
        assert!(m(HeaderMatch::Present(true), false).matches_each(sent(&[""])));
        assert!(m(HeaderMatch::Present(false), false).matches_each(sent(&[])));
    }
}
