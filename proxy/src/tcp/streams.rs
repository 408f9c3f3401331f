//! The copy for connections with TLS on a side (mesh mutual TLS terminated or originated),
//! where bytes must pass through a TLS session rather than straight between two sockets.
//!
//! Same contract as the socket copy: both directions run until end of stream, an end of stream
//! is passed on as a half-close (for TLS, a `close_notify` and then the socket's FIN), and an
//! error on one side ends both, reported for the side it happened on. tokio's copy allocates
//! its two buffers when it starts; TLS sessions hold buffers of their own anyway, so a
//! plaintext connection never pays for this path.

use super::idle::IdleTimer;
use super::{CopyError, Transfer};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

/// Send `prefix` (bytes detection read from `downstream`) to `upstream`, then copy both ways
/// until both directions end, or until nothing has moved for `idle`.
pub async fn copy_streams<D, U>(
    prefix: &[u8],
    downstream: &mut D,
    upstream: &mut U,
    idle: Option<Duration>,
) -> Result<Transfer, CopyError>
where
    D: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (down_read, up_read) = (AtomicU64::new(0), AtomicU64::new(0));
    let mut down = Watched::new(downstream, &down_read);
    let mut up = Watched::new(upstream, &up_read);
    let copy = async {
        if !prefix.is_empty() {
            up.write_all(prefix).await?;
        }
        tokio::io::copy_bidirectional(&mut down, &mut up).await
    };
    let mut timer = IdleTimer::new(idle);
    let result = tokio::select! {
        r = copy => Ok(r),
        idle = std::future::poll_fn(|cx| {
            let moved = down_read.load(Ordering::Relaxed) + up_read.load(Ordering::Relaxed);
            timer.poll_idle(cx, moved)
        }) => Err(idle),
    };
    let transfer = Transfer {
        sent: down_read.load(Ordering::Relaxed) + prefix.len() as u64,
        received: up_read.load(Ordering::Relaxed),
    };
    let result = match result {
        Ok(r) => r,
        Err(idle) => return Err(CopyError::Idle { idle, transfer }),
    };
    match result {
        Ok(_) => Ok(transfer),
        // The side whose own I/O failed is the one that broke; if neither recorded a failure
        // (tokio reports a write of zero bytes itself), blame the side written to.
        Err(source) if down.failed || !up.failed => Err(CopyError::Downstream { source, transfer }),
        Err(source) => Err(CopyError::Upstream { source, transfer }),
    }
}

/// A stream that counts the bytes read from it and remembers whether its I/O failed.
struct Watched<'a, S> {
    inner: &'a mut S,
    /// Bytes read so far; only this stream's task writes it, the idle watch reads it.
    read: &'a AtomicU64,
    failed: bool,
}

impl<'a, S> Watched<'a, S> {
    fn new(inner: &'a mut S, read: &'a AtomicU64) -> Self {
        Watched {
            inner,
            read,
            failed: false,
        }
    }

    fn note<T>(&mut self, r: io::Result<T>) -> io::Result<T> {
        if r.is_err() {
            self.failed = true;
        }
        r
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<'_, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = ready!(Pin::new(&mut *this.inner).poll_read(cx, buf));
        let n = (buf.filled().len() - before) as u64;
        if n > 0 {
            this.read
                .store(this.read.load(Ordering::Relaxed) + n, Ordering::Relaxed);
        }
        Poll::Ready(this.note(r))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<'_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = ready!(Pin::new(&mut *this.inner).poll_write(cx, data));
        Poll::Ready(this.note(r))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = ready!(Pin::new(&mut *this.inner).poll_flush(cx));
        Poll::Ready(this.note(r))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = ready!(Pin::new(&mut *this.inner).poll_shutdown(cx));
        // A peer already gone when its half is closed is its own end, not a failure.
        match r {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Poll::Ready(Ok(())),
            other => Poll::Ready(this.note(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn copies_both_ways_with_the_prefix_first_and_passes_half_close_on() {
        let (mut down, mut client) = tokio::io::duplex(1024);
        let (mut up, mut server) = tokio::io::duplex(1024);
        let copier =
            tokio::spawn(async move { copy_streams(b"hello ", &mut down, &mut up, None).await });
        client.write_all(b"world").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hello world");
        server.write_all(b"answer").await.unwrap();
        server.shutdown().await.unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"answer");
        let t = copier.await.unwrap().unwrap();
        assert_eq!((t.sent, t.received), (11, 6));
    }

    #[tokio::test]
    async fn an_idle_stream_pair_ends_with_its_byte_counts() {
        let (mut down, mut client) = tokio::io::duplex(1024);
        let (mut up, mut server) = tokio::io::duplex(1024);
        let idle = Some(Duration::from_millis(200));
        let copier =
            tokio::spawn(async move { copy_streams(b"a", &mut down, &mut up, idle).await });
        client.write_all(b"bc").await.unwrap();
        let mut got = [0u8; 3];
        server.read_exact(&mut got).await.unwrap();
        server.write_all(b"d").await.unwrap();
        let mut back = [0u8; 1];
        client.read_exact(&mut back).await.unwrap();
        let err = copier.await.unwrap().unwrap_err();
        assert!(matches!(err, CopyError::Idle { .. }), "{err:?}");
        assert_eq!((err.transfer().sent, err.transfer().received), (3, 1));
    }
}
