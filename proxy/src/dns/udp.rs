//! DNS over UDP: the listener loop, and one exchange with an upstream resolver.

use super::{message, ExchangeError, Forwarder, Transport};
use crate::listener::{ipv6_unavailable, BindError};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

/// The largest UDP payload: a query or an answer can never be longer.
const MAX_MESSAGE: usize = 65_535;

/// Bind a UDP socket on `port` of each of `addrs`; an IPv6 address the machine cannot use is
/// skipped with a warning, as the TCP listeners do.
pub(super) fn bind_all(addrs: &[IpAddr], port: u16) -> Result<Vec<std::net::UdpSocket>, BindError> {
    let mut bound = Vec::new();
    let mut skipped = None;
    for ip in addrs {
        let addr = SocketAddr::new(*ip, port);
        match bind(addr) {
            Ok(s) => bound.push(s),
            Err(source) if ip.is_ipv6() && ipv6_unavailable(&source) => {
                tracing::warn!(%addr, error = %source, "IPv6 unavailable, no DNS there");
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

fn bind(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let socket = Socket::new(
        Domain::for_address(addr),
        Type::DGRAM.nonblocking().cloexec(),
        Some(Protocol::UDP),
    )?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&SockAddr::from(addr))?;
    Ok(socket.into())
}

/// Receive queries on `socket` and answer each from its own task, at most `max_in_flight` at
/// once; a query beyond that is dropped and counted, and the client retries.
pub(super) async fn serve(socket: UdpSocket, forwarder: Arc<Forwarder>, max_in_flight: usize) {
    let socket = Arc::new(socket);
    let in_flight = Arc::new(Semaphore::new(max_in_flight));
    // One buffer per listening socket; each task copies out only the query it serves.
    let mut buf = vec![0; MAX_MESSAGE];
    loop {
        let (n, client) = match socket.recv_from(&mut buf).await {
            Ok(received) => received,
            Err(e) => {
                // Out of memory or similar: back off instead of spinning.
                tracing::warn!(error = %e, "DNS receive failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
            forwarder.metrics.dropped.inc();
            tracing::debug!(%client, max_in_flight, "DNS query dropped: too many in flight");
            continue;
        };
        let query = buf[..n].to_vec();
        let (socket, forwarder) = (Arc::clone(&socket), Arc::clone(&forwarder));
        tokio::spawn(async move {
            let _permit = permit;
            if let Some(answer) = forwarder.forward(&query, Transport::Udp).await {
                if let Err(e) = socket.send_to(&answer, client).await {
                    tracing::debug!(%client, error = %e, "DNS answer not delivered");
                }
            }
        });
    }
}

/// Send `query` to `upstream` from a fresh socket (a new random source port per query, as a
/// stub resolver does) and wait for the answer with its ID, within `timeout`.
pub(super) async fn exchange(
    upstream: SocketAddr,
    query: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, ExchangeError> {
    match tokio::time::timeout(timeout, ask(upstream, query)).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(source)) => Err(ExchangeError::Io { upstream, source }),
        Err(_) => Err(ExchangeError::Timeout { upstream, timeout }),
    }
}

async fn ask(upstream: SocketAddr, query: &[u8]) -> io::Result<Vec<u8>> {
    let local: IpAddr = match upstream {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = UdpSocket::bind(SocketAddr::new(local, 0)).await?;
    // Connected: the kernel drops datagrams from anyone else, and a refusal (ICMP) ends the
    // wait at once instead of at the timeout.
    socket.connect(upstream).await?;
    socket.send(query).await?;
    let id = message::id(query).unwrap_or_default();
    // Ends with an answer, an error or the caller's timeout.
    loop {
        socket.readable().await?;
        // Allocated only once the answer is there, so a query waiting on a slow resolver holds
        // no buffer; an answer may be as large as UDP allows (EDNS).
        let mut buf = vec![0; MAX_MESSAGE];
        match socket.try_recv(&mut buf) {
            Ok(n) => {
                buf.truncate(n);
                if message::answers(&buf, id) {
                    buf.shrink_to_fit();
                    return Ok(buf);
                }
                tracing::debug!(%upstream, "ignored a DNS datagram that is not the answer");
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}
