//! Where an accepted connection was really going.
//!
//! iptables `REDIRECT` rewrites the destination to one of our listeners; conntrack remembers the
//! original, and `SO_ORIGINAL_DST` (`IP6T_SO_ORIGINAL_DST` for IPv6) reads it back. With TPROXY
//! nothing is rewritten and the socket's local address already is the destination, which is also
//! what we fall back to when the kernel has no NAT record for the connection.

use socket2::SockRef;
use std::io;
use std::net::SocketAddr;
use tokio::net::TcpStream;

/// How the destination was learned; logged, and useful when a capture rule is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Read from the NAT record (`SO_ORIGINAL_DST`).
    Nat,
    /// The socket's own local address (TPROXY, or no NAT took place).
    LocalAddress,
}

/// The original destination of `stream`, canonicalised (an IPv4-mapped IPv6 address becomes IPv4).
pub fn original_dst(stream: &TcpStream) -> io::Result<(SocketAddr, Source)> {
    let raw_local = stream.local_addr()?;
    let local = canonical(raw_local);
    let sock = SockRef::from(stream);
    // Ask with the option of the connection's family: an IPv4 connection accepted on a dual-stack
    // socket (a v4-mapped local address) was NATed by iptables, not ip6tables.
    let nat = match raw_local {
        SocketAddr::V4(_) => sock.original_dst_v4(),
        SocketAddr::V6(_) if local.is_ipv4() => sock.original_dst_v4(),
        SocketAddr::V6(_) => sock.original_dst_v6(),
    };
    match nat.ok().and_then(|a| a.as_socket()) {
        Some(addr) => Ok((canonical(addr), Source::Nat)),
        None => Ok((local, Source::LocalAddress)),
    }
}

/// Unwrap IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) so comparisons and logs see one form.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_mapped_is_canonicalised() {
        let mapped: SocketAddr = "[::ffff:10.1.2.3]:80".parse().unwrap();
        assert_eq!(
            canonical(mapped),
            "10.1.2.3:80".parse::<SocketAddr>().unwrap()
        );
        let v6: SocketAddr = "[2001:db8::1]:80".parse().unwrap();
        assert_eq!(canonical(v6), v6);
    }

    #[tokio::test]
    async fn without_nat_the_local_address_is_the_destination() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let (dst, _) = original_dst(&accepted).unwrap();
        assert_eq!(dst, addr);
    }
}
