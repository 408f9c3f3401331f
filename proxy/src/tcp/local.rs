//! Kernel buffers of bulk streams whose peer is a process on this host.
//!
//! Linux grows a TCP socket's buffers with its stream, up to the maxima of `net.ipv4.tcp_rmem`
//! and `tcp_wmem` (often 4–32 MiB). On a socket to another host that growth is what lets a long
//! round trip run at full speed. On a socket to this host (the application beside a sidecar, a
//! benchmark on loopback) the round trip is tens of microseconds and never needs more than a
//! fraction of a MiB, but the buffers grow all the same: the sender runs many MiB ahead of the
//! receiver, and every hop of the stream handles pages it touched long ago. Measured with
//! iperf3 through Remora on loopback, bounding both local sockets of a bulk direction to the
//! size below cut the proxy's wake-ups per GB from about 5,300 to 1,400 and the load core's
//! softirq time per GB by half, and raised throughput about 20% (docs/benchmarks.md, "TCP bulk").

use socket2::SockRef;
use std::net::SocketAddr;
use tokio::net::TcpStream;

/// What a bulk direction asks of a local socket's buffer; the kernel doubles it for its own
/// bookkeeping and caps it at `net.core.rmem_max`/`wmem_max`.
pub const LOCAL_BULK_BUFFER: usize = 512 * 1024;

/// Whether a connection between `local` and `peer` stays on this host: either end on loopback
/// (a redirected outbound connection arrives on 127.0.0.1), or both ends on one address (a
/// process dialling its own host's address).
pub fn is_local(local: SocketAddr, peer: SocketAddr) -> bool {
    let (l, p) = (local.ip().to_canonical(), peer.ip().to_canonical());
    l.is_loopback() || p.is_loopback() || l == p
}

/// A direction `from` → `to` has turned bulk: bound the receive buffer of `from` and the send
/// buffer of `to` where that socket's peer is on this host. Sockets to other hosts keep the
/// kernel's autotuning. Failing to set a size leaves the kernel's choice, which still works.
pub fn bound_bulk_buffers(from: &TcpStream, to: &TcpStream) {
    if stays_local(from) {
        if let Err(e) = SockRef::from(from).set_recv_buffer_size(LOCAL_BULK_BUFFER) {
            tracing::debug!(error = %e, "receive buffer left to the kernel");
        }
    }
    if stays_local(to) {
        if let Err(e) = SockRef::from(to).set_send_buffer_size(LOCAL_BULK_BUFFER) {
            tracing::debug!(error = %e, "send buffer left to the kernel");
        }
    }
}

fn stays_local(s: &TcpStream) -> bool {
    match (s.local_addr(), s.peer_addr()) {
        (Ok(local), Ok(peer)) => is_local(local, peer),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn loopback_or_one_address_is_local_and_another_host_is_not() {
        assert!(is_local(at("127.0.0.1:15001"), at("10.0.0.5:40000")));
        assert!(is_local(at("10.0.0.5:40000"), at("127.0.0.1:8080")));
        assert!(is_local(at("127.0.0.6:1234"), at("127.0.0.1:8080")));
        assert!(is_local(at("10.0.0.5:1234"), at("10.0.0.5:8080")));
        assert!(is_local(at("[::1]:1234"), at("[fd00::5]:8080")));
        assert!(is_local(
            at("[::ffff:127.0.0.1]:1234"),
            at("[::ffff:10.0.0.9]:80")
        ));
        assert!(is_local(at("[fd00::5]:1234"), at("[fd00::5]:80")));
        assert!(!is_local(at("10.0.0.5:1234"), at("10.0.0.6:8080")));
        assert!(!is_local(at("[fd00::5]:1234"), at("[fd00::6]:80")));
        assert!(!is_local(
            at("[::ffff:10.0.0.5]:1234"),
            at("[::ffff:10.0.0.6]:80")
        ));
    }
}
