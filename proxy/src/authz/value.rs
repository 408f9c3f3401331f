//! What one value of a policy field (or of a `when` key) compiles to, with Istio's checks of
//! it: principals (with `cluster.local` standing for the workload's trust domains), namespaces,
//! service accounts and trust domains as patterns over the peer's SPIFFE ID, addresses as
//! CIDRs, ports, strings in Istio's `*` notation, and paths with `{*}`/`{**}` templates.

use super::compile::Context;
use super::matcher::{HeaderPattern, Matcher, PathPattern, Pattern};
use regex::Regex;
use remora_config::Cidr;

/// Istio's name for "the local trust domain" in policies.
pub const CLUSTER_LOCAL: &str = "cluster.local";
/// Characters a path template's literal segment may hold (RFC 3986 `pchar`, as Envoy allows).
const PCHAR: &str = r"a-zA-Z0-9\-._~%!$&'()+,;:@=";

/// What one field's values are matched against.
#[derive(Debug, Clone)]
pub(super) enum Kind {
    Principal,
    Namespace,
    ServiceAccount,
    TrustDomain,
    SourceIp,
    RemoteIp,
    DestinationIp,
    Port,
    Sni,
    Method,
    Path,
    Host,
    Header(http::HeaderName),
    RequestAuth,
    EnvoyMetadata,
}

pub(super) fn condition_kind(key: &str) -> Result<Kind, String> {
    let bracketed = |prefix: &str| {
        key.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix('['))
            .and_then(|r| r.strip_suffix(']'))
            .filter(|name| !name.is_empty())
            .ok_or_else(|| format!("bad key ({key}): should have format a[b]"))
    };
    Ok(match key {
        "source.ip" => Kind::SourceIp,
        "remote.ip" => Kind::RemoteIp,
        "source.namespace" => Kind::Namespace,
        "source.serviceAccount" => Kind::ServiceAccount,
        "source.trustDomain" => Kind::TrustDomain,
        "source.principal" => Kind::Principal,
        "request.auth.principal" | "request.auth.audiences" | "request.auth.presenter" => {
            Kind::RequestAuth
        }
        "destination.ip" => Kind::DestinationIp,
        "destination.port" => Kind::Port,
        "connection.sni" => Kind::Sni,
        "destination.namespace" => {
            return Err(format!(
                "attribute {key} is replaced by the metadata.namespace"
            ))
        }
        "destination.name" | "destination.user" => {
            return Err(format!(
                "deprecated attribute {key}: only supported in v1alpha1"
            ))
        }
        k if k.starts_with("request.headers") => {
            let name = bracketed("request.headers")?;
            match name.to_ascii_lowercase().as_str() {
                ":method" => Kind::Method,
                ":path" => Kind::Path,
                ":authority" => Kind::Host,
                lower => http::HeaderName::from_bytes(lower.as_bytes())
                    .map(Kind::Header)
                    .map_err(|_| format!("`{name}` is not a header name"))?,
            }
        }
        k if k.starts_with("request.auth.claims") => {
            bracketed("request.auth.claims")?;
            Kind::RequestAuth
        }
        k if k.starts_with("experimental.envoy.filters.") => {
            if !(k.ends_with(']') && k.find('[').is_some_and(|open| open + 2 < k.len())) {
                return Err(format!("bad key ({key}): should have format a[b]"));
            }
            Kind::EnvoyMetadata
        }
        k if k.starts_with("destination.labels") => {
            return Err(format!(
                "attribute {k} is replaced by the workload selector"
            ))
        }
        _ => return Err(format!("unknown attribute: {key}")),
    })
}

/// The matchers for one value of a field.
pub(super) fn matchers(
    kind: &Kind,
    v: &str,
    ns: &str,
    ctx: &Context,
) -> Result<Vec<Matcher>, String> {
    let one = |m| Ok(vec![m]);
    match kind {
        Kind::Principal => Ok(principals(v, &ctx.trust_domains)
            .into_iter()
            .map(|p| Matcher::Principal(Pattern::parse(&p)))
            .collect()),
        Kind::Namespace => {
            let ns = v
                .split('*')
                .map(regex::escape)
                .collect::<Vec<_>>()
                .join(".*");
            one(Matcher::PrincipalRegex(full_regex(&format!(
                ".*/ns/{ns}/.*"
            ))?))
        }
        Kind::ServiceAccount => {
            if v.contains('*') {
                return Err("wildcard not allowed".into());
            }
            let (sa_ns, sa) = match v.split_once('/') {
                Some((n, s)) if !n.is_empty() && !s.is_empty() && !s.contains('/') => (n, s),
                None => (ns, v),
                _ => {
                    return Err(format!(
                    "expected format 'serviceAccount' or 'namespace/serviceAccount', found {v:?}"
                ))
                }
            };
            if v.len() > 320 {
                return Err("value cannot exceed 320 characters".into());
            }
            let re = format!(
                "spiffe://.+/ns/{}/(.+/|)sa/{}(/.+)?",
                regex::escape(sa_ns),
                regex::escape(sa)
            );
            one(Matcher::PrincipalRegex(full_regex(&re)?))
        }
        Kind::TrustDomain => {
            check_wildcard(v)?;
            if v.contains('/') {
                return Err(format!("trust domain must not contain '/': {v:?}"));
            }
            let expanded = match ctx.trust_domains.iter().any(|td| td == v) {
                true => ctx.trust_domains.clone(),
                false => vec![v.to_string()],
            };
            expanded.iter().map(|td| trust_domain(td)).collect()
        }
        Kind::SourceIp => one(Matcher::SourceIp(cidr(v)?)),
        Kind::RemoteIp => one(Matcher::RemoteIp(cidr(v)?)),
        Kind::DestinationIp => one(Matcher::DestinationIp(cidr(v)?)),
        Kind::Port => match v.parse::<u16>() {
            Ok(p) => one(Matcher::Port(p)),
            Err(_) => Err(format!("bad port ({v})")),
        },
        Kind::Sni => one(Matcher::Sni(Pattern::parse(v))),
        Kind::Method => one(Matcher::Method(Pattern::parse(v))),
        Kind::Path => one(Matcher::Path(path(v)?)),
        Kind::Host => one(Matcher::Host(Pattern::parse(v))),
        Kind::Header(name) => one(Matcher::Header(
            name.clone(),
            HeaderPattern(Pattern::parse(v)),
        )),
        Kind::RequestAuth => one(Matcher::RequestAuth),
        Kind::EnvoyMetadata => one(Matcher::EnvoyMetadata),
    }
}

fn full_regex(re: &str) -> Result<Regex, String> {
    Regex::new(&format!("^(?:{re})$")).map_err(|e| e.to_string())
}

fn cidr(v: &str) -> Result<Cidr, String> {
    v.parse::<Cidr>().map_err(|_| match v.contains('/') {
        true => format!("bad CIDR range ({v})"),
        false => format!("bad IP address ({v})"),
    })
}

/// At most one `*`, at the start or the end.
fn check_wildcard(v: &str) -> Result<(), String> {
    match v.matches('*').count() {
        0 => Ok(()),
        1 if v == "*" || v.starts_with('*') || v.ends_with('*') => Ok(()),
        1 => Err(format!(
            "wildcard is only allowed at the start or end: {v:?}"
        )),
        _ => Err(format!("at most one wildcard is allowed: {v:?}")),
    }
}

fn trust_domain(td: &str) -> Result<Matcher, String> {
    Ok(match td.split_once('*') {
        None => Matcher::TrustDomain(td.into()),
        Some(("", "")) => Matcher::Principal(Pattern::Any),
        Some((before, after)) => {
            let re = format!(
                "spiffe://{}[^/]*{}/.*",
                regex::escape(before),
                regex::escape(after)
            );
            Matcher::PrincipalRegex(full_regex(&re)?)
        }
    })
}

/// A principal with `cluster.local` (or one of the workload's trust domains) stands for the
/// workload's trust domain and each alias, as Istio rewrites it; others are kept as written.
fn principals(v: &str, trust_domains: &[String]) -> Vec<String> {
    let parts: Vec<&str> = v.split('/').collect();
    if parts.len() != 5 || parts[0] == "*" {
        return vec![v.to_string()];
    }
    let td = parts[0];
    if td != CLUSTER_LOCAL && !trust_domains.iter().any(|t| t == td) {
        return vec![v.to_string()];
    }
    let rest = parts[1..].join("/");
    let mut out: Vec<String> = Vec::new();
    for local in trust_domains {
        // A pattern trust domain (`*local`) that covers this one is kept as written.
        let covered = td
            .strip_prefix('*')
            .is_some_and(|suffix| local.ends_with(suffix));
        let p = if covered {
            v.to_string()
        } else {
            format!("{local}/{rest}")
        };
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// A path value: Istio's string pattern, or a `{*}`/`{**}` template (whole segments only,
/// `{**}` the last operator).
fn path(v: &str) -> Result<PathPattern, String> {
    if !(v.contains("{*}") || v.contains("{**}")) {
        if v.contains(['{', '}']) {
            return Err(format!("invalid or unsupported path {v}: contains '{{' or '}}' beyond a supported path template"));
        }
        return Ok(PathPattern::Plain(Pattern::parse(v)));
    }
    if !v.starts_with('/') {
        return Err(format!("invalid path template {v}: must start with '/'"));
    }
    let literal = Regex::new(&format!("^[{PCHAR}]+$")).map_err(|e| e.to_string())?;
    let mut re = String::from("/");
    let mut seen_any = false;
    let segments: Vec<&str> = v[1..].split('/').collect();
    for (i, seg) in segments.iter().enumerate() {
        if i > 0 {
            re.push('/');
        }
        match *seg {
            "{*}" | "{**}" if seen_any => {
                return Err(format!(
                    "invalid or unsupported path {v}: {{**}} is not the last operator"
                ));
            }
            "{*}" => re.push_str(&format!("[{PCHAR}]+")),
            "{**}" => {
                seen_any = true;
                re.push_str(&format!("[{PCHAR}/]*"));
            }
            // A trailing slash leaves an empty last segment.
            "" if i + 1 == segments.len() => {}
            lit if literal.is_match(lit) => re.push_str(&regex::escape(lit)),
            lit => {
                return Err(format!(
                    "invalid or unsupported path {v}: segment {lit:?} is not a valid literal"
                ));
            }
        }
    }
    Ok(PathPattern::Template(full_regex(&re)?))
}
