//! Compiled conditions and what they are matched against.
//!
//! Each field of a policy rule (`principals`, `paths`, a `when` key…) becomes one [`Constraint`]:
//! the values it allows and the values it refuses (`notPrincipals`, `notValues`), each a list of
//! [`Matcher`]s of one attribute. The string forms follow Istio: `abc*` is a prefix, `*abc` a
//! suffix, `*` alone "present and not empty", anything else exact.

use super::Attributes;
use regex::Regex;
use remora_config::Cidr;

/// Istio's string pattern for a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// `*`: any value that is there.
    Any,
    Exact(Box<str>),
    Prefix(Box<str>),
    Suffix(Box<str>),
}

impl Pattern {
    /// Read Istio's notation: `*`, `*suffix`, `prefix*` or an exact value.
    pub fn parse(v: &str) -> Pattern {
        if v == "*" {
            Pattern::Any
        } else if let Some(rest) = v.strip_prefix('*') {
            Pattern::Suffix(rest.into())
        } else if let Some(rest) = v.strip_suffix('*') {
            Pattern::Prefix(rest.into())
        } else {
            Pattern::Exact(v.into())
        }
    }

    /// Case-sensitive match; `Any` wants a non-empty value, as Envoy's `.+` does.
    pub fn matches(&self, s: &str) -> bool {
        match self {
            Pattern::Any => !s.is_empty(),
            Pattern::Exact(e) => s == &**e,
            Pattern::Prefix(p) => s.starts_with(&**p),
            Pattern::Suffix(x) => s.ends_with(&**x),
        }
    }

    /// ASCII case-insensitive match (hosts).
    fn matches_ignore_case(&self, s: &str) -> bool {
        let b = s.as_bytes();
        match self {
            Pattern::Any => !s.is_empty(),
            Pattern::Exact(e) => s.eq_ignore_ascii_case(e),
            Pattern::Prefix(p) => {
                b.len() >= p.len() && b[..p.len()].eq_ignore_ascii_case(p.as_bytes())
            }
            Pattern::Suffix(x) => {
                b.len() >= x.len() && b[b.len() - x.len()..].eq_ignore_ascii_case(x.as_bytes())
            }
        }
    }
}

/// A request path pattern: Istio's string pattern, or a template with `{*}` (one segment) and
/// `{**}` (any number of segments), matched as Envoy's `uri_template` does.
#[derive(Debug, Clone)]
pub enum PathPattern {
    Plain(Pattern),
    Template(Regex),
}

impl PathPattern {
    fn matches(&self, path: &str) -> bool {
        match self {
            PathPattern::Plain(p) => p.matches(path),
            PathPattern::Template(re) => re.is_match(path),
        }
    }
}

/// A header condition's value: Envoy's header matcher, where `*` only asks for presence.
#[derive(Debug, Clone)]
pub struct HeaderPattern(pub Pattern);

/// One value a field allows, for one attribute.
#[derive(Debug, Clone)]
pub enum Matcher {
    /// The peer's SPIFFE ID without `spiffe://` (Istio's principal form).
    Principal(Pattern),
    /// A regular expression over the whole SPIFFE ID (namespaces, service accounts, trust
    /// domains), as Istio compiles those fields.
    PrincipalRegex(Regex),
    /// A trust domain, exactly (the ID starts with `spiffe://TD/`).
    TrustDomain(Box<str>),
    /// The connection's source address.
    SourceIp(Cidr),
    /// The original client: the last `x-forwarded-for` address, or the source.
    RemoteIp(Cidr),
    /// The original destination address.
    DestinationIp(Cidr),
    /// The original destination port.
    Port(u16),
    /// The TLS server name the client asked for.
    Sni(Pattern),
    Method(Pattern),
    Path(PathPattern),
    /// `:authority` (or `Host`), case-insensitive.
    Host(Pattern),
    /// A request header by (lower-case) name: any of its values (a repeated header's values
    /// each on its own, as Envoy 1.40 matches them).
    Header(http::HeaderName, HeaderPattern),
    /// A JWT's principal, audiences, presenter or claims. Remora validates no JWT (no
    /// `RequestAuthentication`), so a request never has one: never matches, as Envoy's
    /// metadata matchers never match what is absent. HTTP-only.
    RequestAuth,
    /// Envoy filter metadata (`experimental.envoy.filters.*`), which Remora has none of: never
    /// matches.
    EnvoyMetadata,
}

impl Matcher {
    /// Whether the field only has a meaning for HTTP (Istio's "HTTP-only" fields).
    pub fn http_only(&self) -> bool {
        matches!(
            self,
            Matcher::Method(_)
                | Matcher::Path(_)
                | Matcher::Host(_)
                | Matcher::Header(..)
                | Matcher::RequestAuth
        )
    }

    /// Whether the attributes have this value.
    pub fn matches(&self, a: &Attributes<'_>) -> bool {
        match self {
            Matcher::Principal(p) => a
                .principal
                .and_then(|id| id.strip_prefix("spiffe://"))
                .is_some_and(|id| p.matches(id)),
            Matcher::PrincipalRegex(re) => a.principal.is_some_and(|id| re.is_match(id)),
            Matcher::TrustDomain(td) => a.principal.is_some_and(|id| {
                id.strip_prefix("spiffe://")
                    .and_then(|rest| rest.strip_prefix(&**td))
                    .is_some_and(|rest| rest.starts_with('/'))
            }),
            Matcher::SourceIp(c) => c.contains(a.source.ip()),
            Matcher::RemoteIp(c) => c.contains(a.remote_ip()),
            Matcher::DestinationIp(c) => c.contains(a.destination.ip()),
            Matcher::Port(p) => a.destination.port() == *p,
            Matcher::Sni(p) => a.sni.is_some_and(|s| p.matches(s)),
            Matcher::Method(p) => a.request.as_ref().is_some_and(|r| match p {
                // Envoy's presence match on `:method`, which every request has.
                Pattern::Any => true,
                p => p.matches(r.method),
            }),
            Matcher::Path(p) => a.request.as_ref().is_some_and(|r| p.matches(r.path)),
            Matcher::Host(p) => a
                .request
                .as_ref()
                .and_then(|r| r.host)
                .is_some_and(|h| match p {
                    Pattern::Any => true,
                    p => p.matches_ignore_case(h),
                }),
            Matcher::Header(name, HeaderPattern(p)) => a
                .request
                .as_ref()
                .is_some_and(|r| header_matches(r.headers, name, p)),
            Matcher::RequestAuth | Matcher::EnvoyMetadata => false,
        }
    }
}

/// Whether any value of the header matches (Envoy 1.40 matches a repeated header's values
/// each on its own, never joined).
fn header_matches(headers: &http::HeaderMap, name: &http::HeaderName, p: &Pattern) -> bool {
    headers
        .get_all(name)
        .iter()
        .any(|v| *p == Pattern::Any || p.matches(&String::from_utf8_lossy(v.as_bytes())))
}

/// One field of a rule: values it allows (any of) and values it refuses (none of).
#[derive(Debug, Clone, Default)]
pub struct Constraint {
    pub values: Vec<Matcher>,
    pub not_values: Vec<Matcher>,
}

impl Constraint {
    /// Whether the field is HTTP-only.
    pub fn http_only(&self) -> bool {
        self.values
            .iter()
            .chain(&self.not_values)
            .any(Matcher::http_only)
    }

    pub fn matches(&self, a: &Attributes<'_>) -> bool {
        (self.values.is_empty() || self.values.iter().any(|m| m.matches(a)))
            && !self.not_values.iter().any(|m| m.matches(a))
    }
}

/// All of some constraints: a `from` source, a `to` operation, or a rule's `when` conditions.
#[derive(Debug, Clone, Default)]
pub struct AllOf(pub Vec<Constraint>);

impl AllOf {
    pub fn http_only_anywhere(&self) -> bool {
        self.0.iter().any(Constraint::http_only)
    }

    /// Whether every constraint matches; with `skip_http`, HTTP-only ones are left out (a DENY
    /// or AUDIT rule on TCP, as Istio builds it).
    pub fn matches(&self, a: &Attributes<'_>, skip_http: bool) -> bool {
        self.0
            .iter()
            .filter(|c| !(skip_http && c.http_only()))
            .all(|c| c.matches(a))
    }
}
