//! The copy for connections with TLS on a side (mesh mutual TLS terminated or originated),
//! where bytes must pass through a TLS session rather than straight between two sockets.
//!
//! Same contract as the socket copy: both directions run until end of stream, an end of stream
//! is passed on as a half-close (for TLS, a `close_notify` and then the socket's FIN), and an
//! error on one side ends both, reported for the side it happened on. And the same economy: a
//! direction holds a buffer only while bytes are moving through it ([`relay`]), where tokio's
//! `copy_bidirectional` holds two of 8 KiB for the connection's whole life. An idle mesh
//! connection is common (a database client's pool through the mesh is mostly idle), and its
//! TLS sessions already cost memory of their own.

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
/// (Not an `async fn`: a wrapper future would keep a second copy of the arguments.)
pub fn copy_streams<'a, D, U>(
    prefix: &'a [u8],
    downstream: &'a mut D,
    upstream: &'a mut U,
    idle: Option<Duration>,
) -> impl std::future::Future<Output = Result<Transfer, CopyError>> + 'a
where
    D: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    copy_streams_until(prefix, downstream, upstream, idle, std::future::pending())
}

/// As [`copy_streams`], ended early ([`CopyError::Stopped`]) when `stop` resolves.
pub async fn copy_streams_until<D, U>(
    prefix: &[u8],
    downstream: &mut D,
    upstream: &mut U,
    idle: Option<Duration>,
    stop: impl std::future::Future<Output = ()>,
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
        relay_ordered(&mut down, &mut up).await
    };
    let mut timer = IdleTimer::new(idle);
    let result = tokio::select! {
        r = copy => Ok(r),
        idle = std::future::poll_fn(|cx| {
            let moved = down_read.load(Ordering::Relaxed) + up_read.load(Ordering::Relaxed);
            timer.poll_idle(cx, moved)
        }) => Err(Some(idle)),
        () = stop => Err(None),
    };
    let mut transfer = Transfer {
        sent: down_read.load(Ordering::Relaxed) + prefix.len() as u64,
        received: up_read.load(Ordering::Relaxed),
        upstream_ended_last: false,
    };
    let result = match result {
        Ok(r) => r,
        Err(Some(idle)) => return Err(CopyError::Idle { idle, transfer }),
        Err(None) => return Err(CopyError::Stopped { transfer }),
    };
    match result {
        Ok((_, _, upstream_last)) => {
            transfer.upstream_ended_last = upstream_last;
            Ok(transfer)
        }
        // The side whose own I/O failed is the one that broke; if neither recorded a failure
        // (tokio reports a write of zero bytes itself), blame the side written to.
        Err(source) if down.failed || !up.failed => Err(CopyError::Downstream { source, transfer }),
        Err(source) => Err(CopyError::Upstream { source, transfer }),
    }
}

/// Copy between `a` and `b` both ways until both directions have ended, each end of stream
/// passed on as a shutdown of the other side's write half; the first error ends both. Returns
/// the bytes copied from `a` to `b` and from `b` to `a`.
pub async fn relay<A, B>(a: &mut A, b: &mut B) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    relay_ordered(a, b)
        .await
        .map(|(forth, back, _)| (forth, back))
}

/// [`relay`], and whether `b`'s end of stream came last (after `a`'s was passed on to it).
async fn relay_ordered<A, B>(a: &mut A, b: &mut B) -> io::Result<(u64, u64, bool)>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut a_to_b, mut b_to_a) = (OneWay::default(), OneWay::default());
    // The direction that ended first, while the other goes on.
    let mut first: Option<bool> = None;
    std::future::poll_fn(|cx| {
        // Both directions are polled each time, so that each registers for its own wake-up.
        let forth = a_to_b.poll_copy(cx, &mut *a, &mut *b)?;
        let back = b_to_a.poll_copy(cx, &mut *b, &mut *a)?;
        match (forth, back) {
            // Ending together, `b` is taken as last, as its end is read after ours is sent.
            (Poll::Ready(()), Poll::Ready(())) => {
                Poll::Ready(Ok((a_to_b.copied, b_to_a.copied, first != Some(false))))
            }
            (Poll::Ready(()), Poll::Pending) => {
                first.get_or_insert(true);
                Poll::Pending
            }
            (Poll::Pending, Poll::Ready(())) => {
                first.get_or_insert(false);
                Poll::Pending
            }
            _ => Poll::Pending,
        }
    })
    .await
}

// A direction's buffer starts small, since most messages are, and doubles after a read that
// fills it, up to one TLS record's worth of plaintext.
const FIRST_BUFFER: usize = 4 * 1024;
const LARGEST_BUFFER: usize = 16 * 1024;

/// One direction of [`relay`].
struct OneWay {
    /// Empty, holding no allocation, while the reader has nothing for us.
    buf: Vec<u8>,
    /// `buf[start..end]` is read and not yet written.
    start: usize,
    end: usize,
    /// The size of the next buffer taken.
    size: usize,
    /// Written since the last flush.
    unflushed: bool,
    /// The reader reached its end of stream.
    eof: bool,
    /// The writer's side is shut down: this direction is over.
    done: bool,
    copied: u64,
}

impl Default for OneWay {
    fn default() -> Self {
        OneWay {
            buf: Vec::new(),
            start: 0,
            end: 0,
            size: FIRST_BUFFER,
            unflushed: false,
            eof: false,
            done: false,
            copied: 0,
        }
    }
}

impl OneWay {
    fn poll_copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        reader: &mut R,
        writer: &mut W,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        loop {
            if self.done {
                return Poll::Ready(Ok(()));
            }
            if self.start < self.end {
                let data = &self.buf[self.start..self.end];
                let n = ready!(Pin::new(&mut *writer).poll_write(cx, data))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.start += n;
                self.copied += n as u64;
                self.unflushed = true;
                continue;
            }
            if self.eof {
                ready!(Pin::new(&mut *writer).poll_flush(cx))?;
                ready!(Pin::new(&mut *writer).poll_shutdown(cx))?;
                self.done = true;
                continue;
            }
            if self.buf.len() < self.size {
                self.buf = vec![0; self.size];
            }
            let mut read = ReadBuf::new(&mut self.buf);
            match Pin::new(&mut *reader).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) => {
                    let n = read.filled().len();
                    if n == 0 {
                        self.eof = true;
                        self.buf = Vec::new();
                    } else {
                        if n == self.buf.len() {
                            self.size = (self.size * 2).min(LARGEST_BUFFER);
                        }
                        (self.start, self.end) = (0, n);
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    // Nothing more for now: a quiet direction holds no buffer. What was
                    // written may sit in a TLS session's buffer until flushed.
                    self.buf = Vec::new();
                    if self.unflushed {
                        ready!(Pin::new(&mut *writer).poll_flush(cx))?;
                        self.unflushed = false;
                    }
                    return Poll::Pending;
                }
            }
        }
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
    use super::super::tests::send_and_read_to_end;
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
    async fn a_quiet_direction_holds_no_buffer() {
        let (mut from, mut client) = tokio::io::duplex(64 * 1024);
        let (mut to, mut server) = tokio::io::duplex(64 * 1024);
        let mut way = OneWay::default();
        client.write_all(b"0123456789").await.unwrap();
        let polled =
            std::future::poll_fn(|cx| Poll::Ready(way.poll_copy(cx, &mut from, &mut to))).await;
        assert!(polled.is_pending(), "the reader has more to come");
        assert_eq!(way.copied, 10);
        assert_eq!(way.buf.capacity(), 0, "an idle direction kept its buffer");
        let mut got = [0u8; 10];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"0123456789");
    }

    #[tokio::test]
    async fn relay_carries_a_megabyte_each_way_byte_exact() {
        let pattern = |seed: u32| -> Vec<u8> {
            (0..1024 * 1024u32)
                .map(|i| (i.wrapping_mul(31) ^ seed) as u8)
                .collect()
        };
        let (up_bytes, down_bytes) = (pattern(7), pattern(11));
        let (mut a, client) = tokio::io::duplex(16 * 1024);
        let (mut b, server) = tokio::io::duplex(16 * 1024);
        let relay = tokio::spawn(async move { relay(&mut a, &mut b).await });
        let client_side = tokio::spawn(send_and_read_to_end(client, up_bytes.clone()));
        let server_side = tokio::spawn(send_and_read_to_end(server, down_bytes.clone()));
        let (at_client, at_server) = (client_side.await.unwrap(), server_side.await.unwrap());
        assert!(at_server == up_bytes, "bytes to the server differ");
        assert!(at_client == down_bytes, "bytes to the client differ");
        let counts = relay.await.unwrap().unwrap();
        assert_eq!(counts, (1024 * 1024, 1024 * 1024));
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
