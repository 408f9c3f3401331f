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
                Ok((stream, peer)) => match admission.admit() {
                    Ok(admitted) => {
                        let served = Arc::clone(&proxy).serve(stream, peer, route.clone());
                        tokio::spawn(async move {
                            served.await;
                            // The place under the limits is given back when the connection ends.
                            drop(admitted);
                        });
                    }
                    Err(limit) => {
                        tracing::debug!(%peer, ?limit, ?route, "connection refused: at the connection limit");
                        admission::reset(stream);
                    }
                },
                Err(e) => errors.failed(&e).await,
            },
            () = &mut stop => {
                tracing::info!(?route, local = ?listener.local_addr().ok(), "listener closed");
                return;
            }
        }
    }
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
