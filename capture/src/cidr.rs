//! CIDR values of `-i`/`-x` and `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`.
//!
//! Parsing follows Go's `netip.ParsePrefix`, which istio-iptables uses: the address keeps its
//! host bits (`10.1.2.3/8` stays as written), and IPv6 addresses print in their canonical
//! RFC 5952 form, which Rust's `Display` produces too.

use std::fmt;
use std::net::IpAddr;

/// An address with a prefix length, e.g. `10.0.0.0/8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    bits: u8,
}

impl Cidr {
    /// Parses `ADDR/BITS`; the reason on failure is meant for a [`crate::FlagError`].
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (addr, bits) = s
            .split_once('/')
            .ok_or_else(|| "not a CIDR (expected ADDRESS/BITS)".to_owned())?;
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        // Like Go, accept only plain decimal without a sign or leading zeros.
        let plain = !bits.is_empty()
            && bits.bytes().all(|b| b.is_ascii_digit())
            && (bits == "0" || !bits.starts_with('0'));
        let bits = bits
            .parse::<u8>()
            .ok()
            .filter(|b| plain && *b <= max)
            .ok_or_else(|| format!("prefix length {bits:?} is not in 0..={max}"))?;
        Ok(Cidr { addr, bits })
    }

    /// A single address (`/32` or `/128`).
    pub fn host(addr: IpAddr) -> Cidr {
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        Cidr { addr, bits }
    }

    /// Parses `ADDR/BITS` or a bare address (a host), as iptables and nft print them.
    pub fn parse_lenient(s: &str) -> Result<Cidr, String> {
        match s.parse::<IpAddr>() {
            Ok(addr) => Ok(Cidr::host(addr)),
            Err(_) => Cidr::parse(s),
        }
    }

    /// The range without host bits, for comparing ranges that were written differently.
    pub fn network(&self) -> Cidr {
        let addr = match self.addr {
            IpAddr::V4(v4) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.bits)).unwrap_or(0);
                IpAddr::V4((u32::from(v4) & mask).into())
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.bits))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(v6) & mask).into())
            }
        };
        Cidr {
            addr,
            bits: self.bits,
        }
    }

    /// Whether `addr` is in the range (never for an address of the other family).
    pub fn contains(&self, addr: IpAddr) -> bool {
        let other = Cidr {
            addr,
            bits: self.bits,
        };
        addr.is_ipv4() == self.addr.is_ipv4() && other.network().addr == self.network().addr
    }

    /// The address part.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// Whether the address is a loopback address (127/8, `::1`, or IPv4-mapped 127/8).
    pub fn is_loopback(&self) -> bool {
        match self.addr {
            IpAddr::V4(v4) => v4.is_loopback(),
            IpAddr::V6(v6) => {
                v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_host_bits_and_canonicalises_ipv6() {
        assert_eq!(Cidr::parse("10.1.2.3/8").unwrap().to_string(), "10.1.2.3/8");
        assert_eq!(
            Cidr::parse("2001:DB8:0::/32").unwrap().to_string(),
            "2001:db8::/32"
        );
        assert_eq!(Cidr::parse("0.0.0.0/0").unwrap().bits(), 0);
    }

    #[test]
    fn rejects_what_go_rejects() {
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "10.0.0.0/08",
            "10.0.0.0/+8",
            "x/8",
            "*",
            "",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad} should not parse");
        }
        assert!(Cidr::parse("::/129").is_err());
    }

    #[test]
    fn containment_ignores_host_bits_and_other_families() {
        let c = Cidr::parse("10.1.2.3/8").unwrap();
        assert!(c.contains("10.200.0.1".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(!c.contains("::a01:203".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("1.2.3.4".parse().unwrap()));
        assert_eq!(Cidr::parse_lenient("::6").unwrap().to_string(), "::6/128");
        assert_eq!(c.network().to_string(), "10.0.0.0/8");
    }

    #[test]
    fn recognises_loopback() {
        assert!(Cidr::parse("127.1.2.3/32").unwrap().is_loopback());
        assert!(Cidr::parse("::1/128").unwrap().is_loopback());
        assert!(Cidr::parse("::ffff:127.0.0.1/128").unwrap().is_loopback());
        assert!(!Cidr::parse("10.0.0.0/8").unwrap().is_loopback());
    }
}
