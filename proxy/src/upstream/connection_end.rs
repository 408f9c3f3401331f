//! How an upstream connection of a cluster (HTTP, or `tcp_proxy`'s) ended, as Envoy counts it
//! in the cluster's `upstream_cx_destroy*`: closed by Remora (`local`: an idle timeout, a pool full, a retired
//! connection, an attempt's timeout, a client gone) or by the peer (`remote`: its close or
//! reset), and whether a request was on it then (`with_active_rq`).
//!
//! A connection carries its [`ConnectionEnd`] for its whole life: in its loop-guard
//! registration ([`crate::loop_guard::Registration`]) while Remora's own HTTP/1.1 exchange
//! holds it, in its IO while hyper's client does ([`Watched`]). Whoever reads from and
//! writes to the connection marks what it sees with plain stores; the count is one atomic
//! add, when the connection is dropped.

use super::stats::ClusterStats;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What is known of an open connection's end, counted when it drops.
#[derive(Debug)]
pub struct ConnectionEnd {
    stats: Arc<ClusterStats>,
    /// The peer closed or reset it (a read saw its end, or a write its reset).
    pub remote: bool,
    /// A request is on it: sent, its response not all read.
    pub active: bool,
}

impl ConnectionEnd {
    /// A connection of the cluster whose statistics are `stats`, just opened.
    pub fn new(stats: Arc<ClusterStats>) -> Self {
        ConnectionEnd {
            stats,
            remote: false,
            active: false,
        }
    }
}

impl ConnectionEnd {
    /// A TCP connection's end from what its copy came to: the upstream's reset, or its end of
    /// stream after ours, is its close; anything else (our end last, the client's reset, the
    /// idle timeout, a drain) is ours. Envoy 1.40 counts a `tcp_proxy` connection as closed
    /// with a request on it: its session holds it until it closes.
    pub fn copied(&mut self, copied: &Result<crate::tcp::Transfer, crate::tcp::CopyError>) {
        self.remote = match copied {
            Ok(t) => t.upstream_ended_last,
            Err(crate::tcp::CopyError::Upstream { .. }) => true,
            Err(_) => false,
        };
        self.active = true;
    }
}

impl Drop for ConnectionEnd {
    fn drop(&mut self) {
        self.stats.cx_destroyed(self.remote, self.active);
    }
}

/// What hyper's client did on a connection, seen from its IO: shared with the task that
/// runs the connection, which counts the end from it once the connection is over.
#[derive(Debug, Default)]
pub struct Seen {
    /// A read saw the peer's close or reset.
    remote: AtomicBool,
    /// The last that went across was ours (a request, or part of one) and no answer byte
    /// came after it: HTTP/1.1's request in flight.
    awaiting: AtomicBool,
    /// The request was given up with its response not all read (HTTP/1.1).
    abandoned: AtomicBool,
}

impl Seen {
    /// Fill in `end` from what was seen; `active` for a multiplexed connection (its streams
    /// in flight), else whether a request was awaiting its answer.
    pub fn finish(&self, end: &mut ConnectionEnd, active: Option<bool>) {
        end.remote |= self.remote.load(Ordering::Relaxed);
        end.active = active.unwrap_or_else(|| {
            self.awaiting.load(Ordering::Relaxed) || self.abandoned.load(Ordering::Relaxed)
        });
    }

    /// The request on the connection is given up mid-response: it closes with it on.
    pub fn abandon(&self) {
        self.abandoned.store(true, Ordering::Relaxed);
    }

    /// Set `flag` to `to`, writing only on a change (most reads and writes change nothing).
    fn set(flag: &AtomicBool, to: bool) {
        if flag.load(Ordering::Relaxed) != to {
            flag.store(to, Ordering::Relaxed);
        }
    }
}

/// An upstream connection's IO as hyper's client drives it, marking [`Seen`] as bytes go.
#[derive(Debug)]
pub struct Watched<T> {
    io: T,
    seen: Option<Arc<Seen>>,
}

impl<T> Watched<T> {
    /// `io`, watched when `seen` is given (a connection of an xDS cluster).
    pub fn new(io: T, seen: Option<Arc<Seen>>) -> Self {
        Watched { io, seen }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if let (Some(seen), Poll::Ready(r)) = (&self.seen, &polled) {
            match r {
                Ok(()) if buf.filled().len() > before => Seen::set(&seen.awaiting, false),
                // Room to read into and nothing read: the peer's end.
                Ok(()) if buf.remaining() > 0 => Seen::set(&seen.remote, true),
                Ok(()) => {}
                Err(_) => Seen::set(&seen.remote, true),
            }
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(&polled);
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T> Watched<T> {
    fn wrote(&self, polled: &Poll<std::io::Result<usize>>) {
        if let (Some(seen), Poll::Ready(r)) = (&self.seen, polled) {
            match r {
                Ok(0) => {}
                Ok(_) => Seen::set(&seen.awaiting, true),
                // A write the peer refused (its reset, or its close of our direction).
                Err(_) => Seen::set(&seen.remote, true),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn destroyed(stats: &ClusterStats) -> Vec<(String, u64)> {
        stats
            .envoy_stats(&[], false)
            .into_iter()
            .filter(|s| s.stat.starts_with("upstream_cx_destroy") && s.value != 0)
            .map(|s| (s.stat.to_string(), s.value))
            .collect()
    }

    #[test]
    fn each_close_is_counted_once_by_who_closed_and_whether_a_request_was_on_it() {
        let stats = Arc::new(ClusterStats::new("c"));
        drop(ConnectionEnd::new(Arc::clone(&stats)));
        let mut end = ConnectionEnd::new(Arc::clone(&stats));
        end.remote = true;
        end.active = true;
        drop(end);
        let mut end = ConnectionEnd::new(Arc::clone(&stats));
        end.remote = true;
        drop(end);
        let s = |n: &str, v| (n.to_string(), v);
        assert_eq!(
            destroyed(&stats),
            [
                s("upstream_cx_destroy", 3),
                s("upstream_cx_destroy_local", 1),
                s("upstream_cx_destroy_remote", 2),
                s("upstream_cx_destroy_with_active_rq", 1),
                s("upstream_cx_destroy_remote_with_active_rq", 1),
            ]
        );
    }

    #[tokio::test]
    async fn hypers_io_tells_a_request_in_flight_and_the_peers_close() {
        let (client, mut server) = tokio::io::duplex(64);
        let seen = Arc::new(Seen::default());
        let mut io = Watched::new(client, Some(Arc::clone(&seen)));
        io.write_all(b"GET / HTTP/1.1\r\n\r\n")
            .await
            .expect("write");
        let stats = Arc::new(ClusterStats::new("c"));
        let mut end = ConnectionEnd::new(Arc::clone(&stats));
        seen.finish(&mut end, None);
        assert!(end.active && !end.remote);
        server
            .write_all(b"HTTP/1.1 200 OK\r\n")
            .await
            .expect("answer");
        let mut buf = [0u8; 64];
        assert!(io.read(&mut buf).await.expect("read") > 0);
        drop(server);
        assert_eq!(io.read(&mut buf).await.expect("end"), 0);
        seen.finish(&mut end, None);
        assert!(!end.active && end.remote);
        // A response given up unread leaves its request on the connection.
        seen.abandon();
        seen.finish(&mut end, None);
        assert!(end.active);
        // HTTP/2: the streams in flight say.
        seen.finish(&mut end, Some(false));
        assert!(!end.active);
    }
}
