//! Opening the upstream connection: to the original destination, from a chosen source address
//! when asked (inbound passthrough, or the client's own address in TPROXY mode), bounded in time, and registered with the loop guard before
//! the handshake can complete, so a capture that sends it straight back to us is recognised.

use crate::loop_guard::{LoopGuard, Registration};
use crate::Direction;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// An open upstream connection and its loop-guard registration (dropped with it).
#[derive(Debug)]
pub struct Upstream {
    pub stream: TcpStream,
    _registration: Registration,
}

impl Upstream {
    /// The socket and its registration, for a connection handed to an HTTP client: the
    /// registration must live as long as the connection does.
    pub fn into_parts(self) -> (TcpStream, Registration) {
        (self.stream, self._registration)
    }

    /// Its registration, which carries how the connection ends.
    pub fn registration_mut(&mut self) -> &mut Registration {
        &mut self._registration
    }
}

/// Where an upstream connection comes from, when not from the kernel's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A local address: the inbound passthrough source (`127.0.0.6`, `::6`).
    Local(IpAddr),
    /// The original client's address, bound transparently (TPROXY mode, as Envoy's
    /// `original_src` does for Istio), so the application sees the client. The mark makes the
    /// capture rules route the application's answers to that address back to us.
    Transparent { ip: IpAddr, mark: u32 },
}

/// Why the upstream connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No answer within the connect timeout.
    #[error("connect to {dst} timed out after {timeout:?}")]
    Timeout { dst: SocketAddr, timeout: Duration },
    /// The connection failed (refused, unreachable, no source address…).
    #[error("connect to {dst}: {source}")]
    Io {
        dst: SocketAddr,
        #[source]
        source: io::Error,
    },
}

/// Connect to `dst`, from `source` if given, within `timeout`, for traffic going `direction`.
pub async fn connect(
    dst: SocketAddr,
    source: Option<Source>,
    timeout: Duration,
    direction: Direction,
    guard: &Arc<LoopGuard>,
) -> Result<Upstream, ConnectError> {
    match tokio::time::timeout(timeout, dial(dst, source, direction, guard)).await {
        Ok(Ok(upstream)) => Ok(upstream),
        Ok(Err(source)) => Err(ConnectError::Io { dst, source }),
        Err(_) => Err(ConnectError::Timeout { dst, timeout }),
    }
}

async fn dial(
    dst: SocketAddr,
    source: Option<Source>,
    direction: Direction,
    guard: &Arc<LoopGuard>,
) -> io::Result<Upstream> {
    let socket = Socket::new(
        Domain::for_address(dst),
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )?;
    socket.set_tcp_nodelay(true)?;
    match source {
        None => {}
        Some(Source::Local(ip)) => socket.bind(&SockAddr::from(SocketAddr::new(ip, 0)))?,
        Some(Source::Transparent { ip, mark }) => {
            // Both need CAP_NET_ADMIN, which TPROXY mode runs with.
            match ip {
                IpAddr::V4(_) => socket.set_ip_transparent_v4(true)?,
                IpAddr::V6(_) => socket.set_ip_transparent_v6(true)?,
            }
            socket.set_mark(mark)?;
            socket.bind(&SockAddr::from(SocketAddr::new(ip, 0)))?;
        }
    }
    match socket.connect(&SockAddr::from(dst)) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    // The kernel chose our local port in connect(); register it now, before awaiting the
    // handshake, because on loopback the captured copy of this connection can be accepted by our
    // own listener before the handshake future is polled again.
    let local = socket
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("upstream socket has no IP address"))?;
    let registration = guard.register(crate::orig_dst::canonical(local), dst, direction);
    let stream = TcpStream::from_std(std::net::TcpStream::from(socket))?;
    stream.writable().await?;
    if let Some(e) = stream.take_error()? {
        return Err(e);
    }
    Ok(Upstream {
        stream,
        _registration: registration,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connects_from_the_requested_source() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dst = listener.local_addr().unwrap();
        let guard = LoopGuard::new(vec![]);
        let source: IpAddr = "127.0.0.6".parse().unwrap();
        let up = connect(
            dst,
            Some(Source::Local(source)),
            Duration::from_secs(5),
            Direction::Inbound,
            &guard,
        )
        .await
        .unwrap();
        let (_, peer) = listener.accept().await.unwrap();
        assert_eq!(peer.ip(), source);
        // While open, its local address is known to the loop guard.
        assert_ne!(guard.check(peer, dst), crate::loop_guard::Verdict::Pass);
        drop(up);
        assert_eq!(guard.check(peer, dst), crate::loop_guard::Verdict::Pass);
    }

    #[tokio::test]
    async fn refused_connect_is_an_io_error() {
        // Bind then drop a listener to get a port that refuses.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let guard = LoopGuard::new(vec![]);
        let err = connect(
            port,
            None,
            Duration::from_secs(5),
            Direction::Outbound,
            &guard,
        )
        .await
        .unwrap_err();
        match err {
            ConnectError::Io { source, .. } => {
                assert_eq!(source.kind(), io::ErrorKind::ConnectionRefused)
            }
            other => panic!("expected refused, got {other:?}"),
        }
    }
}
