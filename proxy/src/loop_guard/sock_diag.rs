//! How many bytes one of our own TCP sockets has received, asked of the kernel by its address
//! pair over `NETLINK_SOCK_DIAG` (what `ss -i` reads; no privilege is needed for the process's
//! own network namespace).
//!
//! The loop guard asks it when a captured connection's peer and destination are those of one
//! of our upstream connections. The addresses alone do not prove a loop: when the capture's
//! `REDIRECT` would give a new connection the same reply tuple as an older one (the same client
//! port, to another destination, whose conntrack entry is still in `TIME_WAIT`), netfilter
//! rewrites the client's source port to a free one, and that port can be the local port of one
//! of our upstream connections to the same destination. A connection that really is our
//! upstream captured again has received nothing yet: its only peer is the connection being
//! checked, to which Remora has written nothing.

use socket2::{Domain, Protocol, Socket, Type};
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr};

/// `SOCK_DIAG_BY_FAMILY`, the request type of `inet_diag_req_v2`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_HEADER: usize = 16;
/// `inet_diag_req_v2`: family, protocol, extensions, pad, states, then the socket id.
const REQUEST_LEN: usize = 8 + SOCKET_ID_LEN;
/// `inet_diag_sockid`: ports, two 16-byte addresses, interface, cookie.
const SOCKET_ID_LEN: usize = 4 + 32 + 4 + 8;
/// `inet_diag_msg`: family, state, timer, retransmits, the socket id, then five `u32`s.
const MESSAGE_LEN: usize = 4 + SOCKET_ID_LEN + 20;
/// `INET_DIAG_INFO`: the attribute carrying `struct tcp_info`.
const INET_DIAG_INFO: u16 = 2;
/// Offset of `tcpi_data_segs_in` (a `u32`, Linux 4.6 and later) in `struct tcp_info`: the
/// segments received that carried data. Not `tcpi_bytes_received`, which a connection dialled
/// from a bound source was seen to start at 1 with nothing received.
const TCPI_DATA_SEGS_IN: usize = 152;

/// Segments with data received so far by the TCP socket from `local` to `remote` in this
/// network namespace; `None` when the kernel does not say (no such socket, no `inet_diag`, an
/// older kernel).
pub fn data_segments_received(local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    match query(local, remote) {
        Ok(found) => found,
        Err(e) => {
            tracing::debug!(%local, %remote, error = %e, "sock_diag query failed");
            None
        }
    }
}

fn query(local: SocketAddr, remote: SocketAddr) -> io::Result<Option<u32>> {
    let socket = Socket::new(
        Domain::from(libc::AF_NETLINK),
        Type::DGRAM.cloexec(),
        Some(Protocol::from(libc::NETLINK_SOCK_DIAG)),
    )?;
    socket.set_read_timeout(Some(std::time::Duration::from_millis(100)))?;
    // Unbound and unconnected, a netlink socket sends to the kernel.
    socket.send(&request(local, remote))?;
    let mut reply = [0u8; 1024];
    let n = (&socket).read(&mut reply)?;
    Ok(parse(&reply[..n]))
}

/// One exact lookup (no dump flag) of the socket `local` → `remote`, asking for its `tcp_info`.
fn request(local: SocketAddr, remote: SocketAddr) -> Vec<u8> {
    let total = NLMSG_HEADER + REQUEST_LEN;
    let mut m = Vec::with_capacity(total);
    m.extend_from_slice(&(total as u32).to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it in
    let family = match local.ip() {
        IpAddr::V4(_) => libc::AF_INET,
        IpAddr::V6(_) => libc::AF_INET6,
    };
    m.push(family as u8);
    m.push(libc::IPPROTO_TCP as u8);
    m.push(1 << (INET_DIAG_INFO - 1)); // the extension wanted: INET_DIAG_INFO
    m.push(0);
    m.extend_from_slice(&u32::MAX.to_ne_bytes()); // any state
                                                  // The socket id: ports and addresses in network order; "source" is the local end.
    m.extend_from_slice(&local.port().to_be_bytes());
    m.extend_from_slice(&remote.port().to_be_bytes());
    m.extend_from_slice(&address(local.ip()));
    m.extend_from_slice(&address(remote.ip()));
    m.extend_from_slice(&0u32.to_ne_bytes()); // any interface
    m.extend_from_slice(&[0xff; 8]); // INET_DIAG_NOCOOKIE
    m
}

/// An address as `inet_diag_sockid` holds it: IPv4 in the first four of sixteen bytes.
fn address(ip: IpAddr) -> [u8; 16] {
    let mut out = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out.copy_from_slice(&v6.octets()),
    }
    out
}

/// `tcpi_data_segs_in` from the kernel's answer, if it is one socket's `inet_diag_msg` with a
/// `tcp_info` long enough to hold it.
fn parse(reply: &[u8]) -> Option<u32> {
    let header = reply.get(..NLMSG_HEADER)?;
    let len = u32::from_ne_bytes(header[..4].try_into().ok()?) as usize;
    let kind = u16::from_ne_bytes(header[4..6].try_into().ok()?);
    if kind == NLMSG_ERROR || kind != SOCK_DIAG_BY_FAMILY {
        return None;
    }
    let body = reply.get(NLMSG_HEADER..len.min(reply.len()))?;
    let mut attributes = body.get(MESSAGE_LEN..)?;
    while attributes.len() >= 4 {
        let attr_len = u16::from_ne_bytes(attributes[..2].try_into().ok()?) as usize;
        let attr_type = u16::from_ne_bytes(attributes[2..4].try_into().ok()?);
        if attr_len < 4 || attr_len > attributes.len() {
            return None;
        }
        if attr_type == INET_DIAG_INFO {
            let info = &attributes[4..attr_len];
            let segments = info.get(TCPI_DATA_SEGS_IN..TCPI_DATA_SEGS_IN + 4)?;
            return Some(u32::from_ne_bytes(segments.try_into().ok()?));
        }
        attributes = attributes
            .get(attr_len.next_multiple_of(4)..)
            .unwrap_or_default();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn counts_the_data_a_socket_has_received() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let (local, remote) = (client.local_addr().unwrap(), client.peer_addr().unwrap());
        assert_eq!(data_segments_received(local, remote), Some(0));
        server.write_all(b"hello").unwrap();
        let mut got = [0u8; 5];
        client.read_exact(&mut got).unwrap();
        assert_eq!(data_segments_received(local, remote), Some(1));
        // The other end has received nothing, and the ends are not interchangeable.
        assert_eq!(data_segments_received(remote, local), Some(0));
        client.write_all(b"x").unwrap();
        server.read_exact(&mut got[..1]).unwrap();
        assert_eq!(data_segments_received(remote, local), Some(1));
    }

    #[test]
    fn no_such_socket_is_none() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let remote = listener.local_addr().unwrap();
        let local: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(data_segments_received(local, remote), None);
    }

    #[test]
    fn ipv6_sockets_are_found_too() {
        let Ok(listener) = TcpListener::bind("[::1]:0") else {
            return; // no IPv6 loopback here
        };
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        server.write_all(b"abc").unwrap();
        let mut c = &client;
        let mut got = [0u8; 3];
        c.read_exact(&mut got).unwrap();
        let (local, remote) = (client.local_addr().unwrap(), client.peer_addr().unwrap());
        assert_eq!(data_segments_received(local, remote), Some(1));
    }
}
