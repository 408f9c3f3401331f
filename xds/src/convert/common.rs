//! Conversions every resource kind shares: durations, addresses, matchers, metadata and
//! header edits.

use crate::model::matcher::{
    CidrRange, HeaderMatch, HeaderMatcher, Pattern, StringMatch, StringMatcher,
};
use crate::model::route::HeaderEdit;
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::route::v3 as route;
use envoy_types::pb::envoy::r#type::matcher::v3 as matcher;
use envoy_types::pb::google::protobuf::{value::Kind as ValueKind, Duration as PbDuration, Struct};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// A protobuf duration; negative ones are refused.
pub fn duration(d: &PbDuration, path: &str) -> Result<Duration, Fault> {
    if d.seconds < 0 || d.nanos < 0 {
        return Err(Fault::new(path, "negative duration"));
    }
    Ok(Duration::new(d.seconds as u64, d.nanos as u32))
}

/// An optional duration where `0s` means "no bound" (Envoy's convention for timeouts): `None`
/// when unset gives `default`; `Some(0)` gives `None`.
pub fn timeout(
    d: Option<&PbDuration>,
    default: Option<Duration>,
    path: &str,
) -> Result<Option<Duration>, Fault> {
    match d {
        None => Ok(default),
        Some(d) => {
            let d = duration(d, path)?;
            Ok((!d.is_zero()).then_some(d))
        }
    }
}

/// A socket address (`address` and `port_value`); named ports and resolvers are refused.
pub fn socket_address(a: Option<&core::Address>, path: &str) -> Result<SocketAddr, Fault> {
    let Some(core::address::Address::SocketAddress(sa)) = a.and_then(|a| a.address.as_ref()) else {
        return Err(Fault::new(path, "only socket addresses are supported"));
    };
    let port = match sa.port_specifier {
        Some(core::socket_address::PortSpecifier::PortValue(p)) => u16::try_from(p)
            .map_err(|_| Fault::new(format!("{path}.port_value"), "port out of range"))?,
        Some(core::socket_address::PortSpecifier::NamedPort(_)) => {
            return Err(Fault::new(
                format!("{path}.named_port"),
                "named ports not supported",
            ))
        }
        None => 0,
    };
    if sa.protocol != core::socket_address::Protocol::Tcp as i32 {
        return Err(Fault::new(
            format!("{path}.protocol"),
            "only TCP is supported",
        ));
    }
    if !sa.resolver_name.is_empty() {
        return Err(Fault::new(
            format!("{path}.resolver_name"),
            "custom resolvers not supported",
        ));
    }
    let ip: IpAddr = sa.address.parse().map_err(|_| {
        Fault::new(
            format!("{path}.address"),
            format!("not an IP address: {:?}", sa.address),
        )
    })?;
    Ok(SocketAddr::new(ip, port))
}

/// A CIDR range.
pub fn cidr(c: &core::CidrRange, path: &str) -> Result<CidrRange, Fault> {
    let address: IpAddr = c.address_prefix.parse().map_err(|_| {
        Fault::new(
            format!("{path}.address_prefix"),
            format!("not an IP address: {:?}", c.address_prefix),
        )
    })?;
    let len = c.prefix_len.as_ref().map_or(0, |l| l.value);
    let max = if address.is_ipv4() { 32 } else { 128 };
    if len > max {
        return Err(Fault::new(format!("{path}.prefix_len"), "prefix too long"));
    }
    Ok(CidrRange {
        address,
        prefix_len: len as u8,
    })
}

/// A regex matcher, compiled.
pub fn regex(r: &matcher::RegexMatcher, path: &str) -> Result<Pattern, Fault> {
    Pattern::new(&r.regex)
        .map_err(|e| Fault::new(format!("{path}.regex"), format!("bad regex: {e}")))
}

/// Envoy's `StringMatcher`.
pub fn string_matcher(m: &matcher::StringMatcher, path: &str) -> Result<StringMatcher, Fault> {
    use matcher::string_matcher::MatchPattern;
    let kind = match &m.match_pattern {
        Some(MatchPattern::Exact(s)) => StringMatch::Exact(s.clone()),
        Some(MatchPattern::Prefix(s)) => StringMatch::Prefix(s.clone()),
        Some(MatchPattern::Suffix(s)) => StringMatch::Suffix(s.clone()),
        Some(MatchPattern::Contains(s)) => StringMatch::Contains(s.clone()),
        Some(MatchPattern::SafeRegex(r)) => {
            StringMatch::Regex(regex(r, &format!("{path}.safe_regex"))?)
        }
        Some(MatchPattern::Custom(_)) => {
            return Err(Fault::new(
                format!("{path}.custom"),
                "custom matchers not supported",
            ))
        }
        None => return Err(Fault::new(path, "no match pattern")),
    };
    Ok(StringMatcher {
        kind,
        ignore_case: m.ignore_case,
    })
}

/// A route or RBAC header matcher.
pub fn header_matcher(h: &route::HeaderMatcher, path: &str) -> Result<HeaderMatcher, Fault> {
    use route::header_matcher::HeaderMatchSpecifier as S;
    let exact = |kind| {
        HeaderMatch::Value(StringMatcher {
            kind,
            ignore_case: false,
        })
    };
    let kind = match &h.header_match_specifier {
        Some(S::ExactMatch(s)) => exact(StringMatch::Exact(s.clone())),
        Some(S::PrefixMatch(s)) => exact(StringMatch::Prefix(s.clone())),
        Some(S::SuffixMatch(s)) => exact(StringMatch::Suffix(s.clone())),
        Some(S::ContainsMatch(s)) => exact(StringMatch::Contains(s.clone())),
        Some(S::SafeRegexMatch(r)) => exact(StringMatch::Regex(regex(
            r,
            &format!("{path}.safe_regex_match"),
        )?)),
        Some(S::StringMatch(m)) => {
            HeaderMatch::Value(string_matcher(m, &format!("{path}.string_match"))?)
        }
        Some(S::PresentMatch(p)) => HeaderMatch::Present(*p),
        Some(S::RangeMatch(_)) => {
            return Err(Fault::new(
                format!("{path}.range_match"),
                "range matches not supported",
            ))
        }
        // Envoy: no specifier means the header must be present.
        None => HeaderMatch::Present(true),
    };
    Ok(HeaderMatcher {
        name: h.name.to_ascii_lowercase(),
        kind,
        invert: h.invert_match,
    })
}

/// Header additions.
pub fn header_edits(
    options: &[core::HeaderValueOption],
    path: &str,
) -> Result<Vec<HeaderEdit>, Fault> {
    use core::header_value_option::HeaderAppendAction as A;
    options
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let at = format!("{path}[{i}]");
            let header = o
                .header
                .as_ref()
                .ok_or_else(|| Fault::new(&at, "no header"))?;
            if !header.raw_value.is_empty() {
                return Err(Fault::new(
                    format!("{at}.header.raw_value"),
                    "raw values not supported",
                ));
            }
            let append =
                match A::try_from(o.append_action) {
                    Ok(A::AppendIfExistsOrAdd) => o.append.as_ref().is_none_or(|a| a.value),
                    Ok(A::OverwriteIfExistsOrAdd) => false,
                    _ => return Err(Fault::new(
                        format!("{at}.append_action"),
                        "only APPEND_IF_EXISTS_OR_ADD and OVERWRITE_IF_EXISTS_OR_ADD are supported",
                    )),
                };
            Ok(HeaderEdit {
                name: header.key.to_ascii_lowercase(),
                value: super::header_format::header_format(
                    &header.value,
                    &format!("{at}.header.value"),
                )?,
                append,
            })
        })
        .collect()
}

/// `filter_metadata[filter]`, when present.
pub fn filter_metadata<'a>(m: Option<&'a core::Metadata>, filter: &str) -> Option<&'a Struct> {
    m.and_then(|m| m.filter_metadata.get(filter))
}

/// A string value of a Struct.
pub fn struct_string(s: &Struct, key: &str) -> Option<String> {
    match s.fields.get(key).and_then(|v| v.kind.as_ref()) {
        Some(ValueKind::StringValue(v)) => Some(v.clone()),
        _ => None,
    }
}

/// A whole-number value of a Struct.
pub fn struct_u32(s: &Struct, key: &str) -> Option<u32> {
    match s.fields.get(key).and_then(|v| v.kind.as_ref()) {
        Some(ValueKind::NumberValue(n)) if *n >= 0.0 && *n <= f64::from(u32::MAX) => {
            Some(*n as u32)
        }
        _ => None,
    }
}

/// A list value of a Struct, as Structs (non-struct elements skipped).
pub fn struct_list<'a>(s: &'a Struct, key: &str) -> Vec<&'a Struct> {
    match s.fields.get(key).and_then(|v| v.kind.as_ref()) {
        Some(ValueKind::ListValue(l)) => l
            .values
            .iter()
            .filter_map(|v| match v.kind.as_ref() {
                Some(ValueKind::StructValue(s)) => Some(s),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_zero_means_none_and_unset_the_default() {
        let fifteen = Some(Duration::from_secs(15));
        assert_eq!(timeout(None, fifteen, "t"), Ok(fifteen));
        let zero = PbDuration {
            seconds: 0,
            nanos: 0,
        };
        assert_eq!(timeout(Some(&zero), fifteen, "t"), Ok(None));
        let neg = PbDuration {
            seconds: -1,
            nanos: 0,
        };
        assert!(timeout(Some(&neg), fifteen, "t").is_err());
    }

    #[test]
    fn addresses_must_be_ips() {
        let addr = |a: &str| core::Address {
            address: Some(core::address::Address::SocketAddress(core::SocketAddress {
                address: a.into(),
                port_specifier: Some(core::socket_address::PortSpecifier::PortValue(80)),
                ..Default::default()
            })),
        };
        assert_eq!(
            socket_address(Some(&addr("10.0.0.1")), "a"),
            Ok("10.0.0.1:80".parse().expect("addr"))
        );
        let f = socket_address(Some(&addr("example.com")), "address").expect_err("refused");
        assert_eq!(f.path, "address.address");
        assert!(socket_address(None, "a").is_err());
    }
}
