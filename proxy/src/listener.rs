//! Binding listeners on every configured address, and the accept loop of a data-path listener
//! (with its connection limits, `admission`, and its handling of failed accepts,
//! `accept_errors`).

pub mod accept_errors;
pub mod admission;

use crate::proxy::{Proxy, Route};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tokio::net::TcpListener;

// The kernel caps the backlog at net.core.somaxconn anyway; ask for plenty so bursts of
// connections from the application are queued rather than refused.
const BACKLOG: i32 = 4096;

/// Why a listener could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: io::Error,
}

/// Bind `port` on each of `addrs`. An IPv6 address the machine cannot use (IPv6 disabled) is
/// skipped with a warning as long as another address was bound; anything else is an error.
pub fn bind_all(addrs: &[IpAddr], port: u16) -> Result<Vec<std::net::TcpListener>, BindError> {
    bind_all_as(addrs, port, Transparency::Off)
}

/// Whether a listener takes connections addressed to any IP (`IP_TRANSPARENT`), as a TPROXY
/// capture listener must: the packets it receives keep their original destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transparency {
    Off,
    /// Needs CAP_NET_ADMIN.
    On,
}

/// [`bind_all`], transparently or not.
pub fn bind_all_as(
    addrs: &[IpAddr],
    port: u16,
    transparency: Transparency,
) -> Result<Vec<std::net::TcpListener>, BindError> {
    let mut bound = Vec::new();
    let mut skipped = None;
    for ip in addrs {
        let addr = SocketAddr::new(*ip, port);
        match bind_as(addr, transparency) {
            Ok(l) => bound.push(l),
            Err(source) if ip.is_ipv6() && ipv6_unavailable(&source) => {
                tracing::warn!(%addr, error = %source, "IPv6 unavailable, not listening there");
                skipped = Some(BindError { addr, source });
            }
            Err(source) => return Err(BindError { addr, source }),
        }
    }
    match (bound.is_empty(), skipped) {
        (true, Some(e)) => Err(e),
        _ => Ok(bound),
    }
}

/// Whether binding an IPv6 address failed because the machine has no usable IPv6.
pub(crate) fn ipv6_unavailable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(code) if code == 97 /* EAFNOSUPPORT */ || code == 99 /* EADDRNOTAVAIL */
    )
}

/// Bind one listening socket.
pub fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    bind_as(addr, Transparency::Off)
}

fn bind_as(addr: SocketAddr, transparency: Transparency) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    if transparency == Transparency::On {
        match addr {
            SocketAddr::V4(_) => socket.set_ip_transparent_v4(true)?,
            SocketAddr::V6(_) => socket.set_ip_transparent_v6(true)?,
        }
    }
    if addr.is_ipv6() {
        // IPv4 has its own socket; without this `[::]` would also claim the IPv4 port.
        socket.set_only_v6(true)?;
    }
    socket.bind(&SockAddr::from(addr))?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// Accept connections on `listener` and serve each in its own task, until `stop` resolves.
/// A connection past `admission`'s limits is reset at once. Returning drops the listener, so
/// connections arriving later are refused by the kernel.
pub async fn accept_loop(
    listener: TcpListener,
    route: Route,
    proxy: Arc<Proxy>,
    admission: admission::Admission,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    let label = match route {
        Route::Capture(crate::Direction::Outbound) => "outbound",
        Route::Capture(crate::Direction::Inbound) => "inbound",
        Route::Fixed(_) => "explicit",
    };
    let mut errors = accept_errors::AcceptErrors::new(label, proxy.metrics.overload.clone());
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    admit_and_serve(&proxy, &admission, stream, peer, &route);
                }
                Err(e) => errors.failed(&e).await,
            },
            () = &mut stop => {
                let local = listener.local_addr().ok();
                let taken = take_queued(listener, &route, &proxy, &admission);
                tracing::info!(?route, ?local, taken, "listener closed");
                return;
            }
        }
    }
}

/// Serve an accepted connection in its own task, holding a place under `admission`'s limits
/// until it ends; past them, reset it at once. Whether it is served.
fn admit_and_serve(
    proxy: &Arc<Proxy>,
    admission: &admission::Admission,
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    route: &Route,
) -> bool {
    match admission.admit() {
        Ok(admitted) => {
            let served = Arc::clone(proxy).serve(stream, peer, route.clone());
            tokio::spawn(async move {
                served.await;
                // The place under the limits is given back when the connection ends.
                drop(admitted);
            });
            true
        }
        Err(limit) => {
            tracing::debug!(%peer, ?limit, ?route, "connection refused: at the connection limit");
            admission::reset(stream);
            false
        }
    }
}

/// Serve the connections still in the listener's accept queue, then close it. The kernel
/// completed their handshakes, so their clients may already have sent a request: closing the
/// listener with them queued would reset them (the lifecycle e2e test lost one request in two
/// runs of SIGTERM under load that way). Taken here, they are served as every open connection
/// is while draining. A connection completing between the last accept and the close is still
/// reset: that window is one system call wide. Returns how many were taken.
fn take_queued(
    listener: TcpListener,
    route: &Route,
    proxy: &Arc<Proxy>,
    admission: &admission::Admission,
) -> usize {
    let listener = match listener.into_std() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, ?route, "cannot take the queued connections");
            return 0;
        }
    };
    let mut taken = 0;
    // Bounded: the backlog is, and a listener that keeps filling faster than this empties it
    // must still close.
    for _ in 0..BACKLOG {
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => {
                tracing::warn!(error = %e, ?route, "accepting a queued connection");
                break;
            }
        };
        let stream = stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpStream::from_std(stream));
        match stream {
            Ok(stream) => {
                taken += usize::from(admit_and_serve(proxy, admission, stream, peer, route));
            }
            Err(e) => tracing::warn!(error = %e, ?route, "serving a queued connection"),
        }
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_each_address_on_the_same_port() {
        let addrs: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()];
        // Find a free port on IPv4, then bind both families on it.
        let port = bind("127.0.0.1:0".parse().unwrap())
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listeners = bind_all(&addrs, port).unwrap();
        assert!(!listeners.is_empty());
        for l in &listeners {
            assert_eq!(l.local_addr().unwrap().port(), port);
        }
    }

    #[tokio::test]
    async fn closing_takes_the_queued_connections_and_refuses_later_ones() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let listener = TcpListener::from_std(listener).unwrap();
        // connect(2) returns once the kernel has completed the handshake and queued the
        // connection: these three wait in the backlog, their requests sent.
        let mut clients = Vec::new();
        for _ in 0..3 {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            std::io::Write::write_all(&mut c, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
            clients.push(c);
        }
        let proxy = Proxy::for_tests(remora_config::Config::default());
        let route = Route::Capture(crate::Direction::Inbound);
        let admission =
            admission::GlobalCount::new(Arc::clone(&proxy.config), proxy.metrics.overload.clone())
                .listener(crate::Direction::Inbound);
        assert_eq!(take_queued(listener, &route, &proxy, &admission), 3);
        let refused = std::net::TcpStream::connect(addr).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
    }

    #[test]
    fn a_taken_port_is_an_error_naming_the_address() {
        let held = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = held.local_addr().unwrap().port();
        // SO_REUSEADDR does not allow two listeners on one address.
        let err = bind_all(&["127.0.0.1".parse().unwrap()], port).unwrap_err();
        assert_eq!(err.addr.port(), port);
        assert!(err.to_string().contains(&format!("127.0.0.1:{port}")));
    }
}
