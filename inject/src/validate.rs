//! Checks of the annotations that shape injection, as Istio's injector makes them: a pod whose
//! capture annotations istio-iptables would reject must fail injection, not produce a pod whose
//! init container crash-loops.

use crate::error::InjectError;
use crate::names::key;
use crate::quantity;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Validates every annotation Istio validates; the first invalid one is the error.
pub fn annotations(annotations: &BTreeMap<String, String>) -> Result<(), InjectError> {
    for (name, value) in annotations {
        let check: fn(&str) -> Result<(), String> = match name.as_str() {
            key::INTERCEPTION_MODE => interception_mode,
            key::STATUS_PORT => |v| port(v).map(drop),
            key::READINESS_INITIAL_DELAY
            | key::READINESS_PERIOD
            | key::READINESS_FAILURE_THRESHOLD => |v| uint32(v).map(drop),
            key::INCLUDE_OUTBOUND_IP_RANGES => |v| if v == "*" { Ok(()) } else { cidr_list(v) },
            key::EXCLUDE_OUTBOUND_IP_RANGES => cidr_list,
            key::INCLUDE_INBOUND_PORTS => |v| if v == "*" { Ok(()) } else { port_list(v) },
            key::EXCLUDE_INBOUND_PORTS | key::EXCLUDE_OUTBOUND_PORTS => port_list,
            key::INCLUDE_OUTBOUND_PORTS => port_list,
            key::EXCLUDE_INTERFACES
            | key::KUBEVIRT_INTERFACES
            | key::REROUTE_VIRTUAL_INTERFACES => interface_list,
            key::MERGE_METRICS => |v| {
                parse_bool(v)
                    .map(drop)
                    .ok_or_else(|| "not a boolean".into())
            },
            key::PROXY_CONFIG => |v| crate::proxy_config::ProxyConfig::parse(v).map(drop),
            key::PROXY_CPU | key::PROXY_MEMORY | key::PROXY_CPU_LIMIT | key::PROXY_MEMORY_LIMIT => {
                quantity::check
            }
            _ => continue,
        };
        check(value).map_err(|reason| InjectError::InvalidAnnotation {
            annotation: name.clone(),
            value: value.clone(),
            reason,
        })?;
    }
    Ok(())
}

fn interception_mode(v: &str) -> Result<(), String> {
    match v {
        "REDIRECT" | "TPROXY" | "NONE" => Ok(()),
        _ => Err("expected REDIRECT, TPROXY or NONE".into()),
    }
}

/// A comma-separated list of CIDRs (`10.0.0.0/8,fd00::/8`); empty is an empty list.
pub fn cidr_list(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Ok(());
    }
    for cidr in v.split(',') {
        let bad = || format!("`{cidr}` is not a CIDR");
        let (addr, bits) = cidr.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        // Go's netip, like Istio, refuses a sign or leading zeros in the prefix length.
        let plain = !bits.is_empty()
            && bits.bytes().all(|b| b.is_ascii_digit())
            && (bits == "0" || !bits.starts_with('0'));
        match bits.parse::<u8>() {
            Ok(b) if plain && b <= max => {}
            _ => return Err(bad()),
        }
    }
    Ok(())
}

/// A comma-separated list of ports; empty (after trimming) is an empty list.
pub fn port_list(v: &str) -> Result<(), String> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(());
    }
    v.split(',').try_for_each(|p| port(p).map(drop))
}

/// One port, 0–65535, surrounding spaces allowed.
pub fn port(v: &str) -> Result<u16, String> {
    v.trim().parse().map_err(|_| format!("`{v}` is not a port"))
}

fn uint32(v: &str) -> Result<u32, String> {
    v.parse()
        .map_err(|_| format!("`{v}` is not an unsigned 32-bit integer"))
}

/// Interface names as Linux allows them (at most 15 characters, no spaces or slashes).
pub fn interface_list(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Ok(());
    }
    for name in v.split(',') {
        let name = name.trim();
        let mut chars = name.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
        let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if name.is_empty() || name.len() > 15 || !first_ok || !rest_ok {
            return Err(format!("`{name}` is not an interface name"));
        }
    }
    Ok(())
}

/// Go's `strconv.ParseBool`, which Istio uses for boolean annotations.
pub fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        assert!(cidr_list("10.0.0.0/8,fd00::/8,127.0.0.1/24").is_ok());
        assert!(cidr_list("").is_ok());
        for bad in [
            "*",
            "bad",
            "10.0.0.1",
            "10.0.0.0/33",
            "10.0.0.0/08",
            "10.0.0.0/8,",
        ] {
            assert!(cidr_list(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ports_and_interfaces() {
        assert!(port_list(" 1, 2 ,3 ").is_ok());
        assert!(port_list("").is_ok());
        assert!(port_list("*").is_err());
        assert!(port_list("bad").is_err());
        assert!(port_list("70000").is_err());
        assert!(interface_list("net1,eth0.1,veth-a").is_ok());
        assert!(interface_list("1net").is_err());
        assert!(interface_list("averyveryverylongname").is_err());
        assert!(interface_list("a,,b").is_err());
    }

    #[test]
    fn first_invalid_annotation_names_itself() {
        let a = BTreeMap::from([(key::EXCLUDE_INBOUND_PORTS.to_string(), "*".to_string())]);
        let err = annotations(&a).unwrap_err().to_string();
        assert!(err.contains(key::EXCLUDE_INBOUND_PORTS), "{err}");
    }
}
