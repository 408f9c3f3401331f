//! One write per turn of an HTTP/2 connection's task, rather than one per DATA frame.
//!
//! h2 hands a DATA frame of 256 bytes or more to the socket as its own vectored write and must
//! flush it before it can encode the next frame, so a gRPC call of 1 KiB costs a `writev` for
//! its request's DATA upstream and another for its response's DATA downstream, however many
//! calls share the connection (2.1 `writev` per call through one worker at saturation,
//! measured). Envoy writes what a connection has to send once per turn of its event loop; this
//! wrapper does the same for h2:
//!
//! - a write is copied and taken at once;
//! - the first flush of a turn is put off: the connection's task wakes itself and goes to the
//!   back of the run queue, so the streams that run meanwhile add their frames too;
//! - h2 reads from the socket first on every turn of its connection, so the next read sends
//!   everything held, in one write, before it reads.
//!
//! At most [`HOLD`] bytes are held: a write beyond that first sends what is held, and waits as
//! the socket makes it wait. Shutting down sends everything first. The buffer is allocated when
//! a turn has something to send and freed after a turn that had nothing, so a quiet connection
//! holds none.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes held for the next write at most. Above it the writer waits for the socket, as it
/// would without the wrapper; a write this long or longer goes straight to the socket.
pub const HOLD: usize = 64 * 1024;

/// Room the buffer starts with: a turn's frames for a few streams, without growing.
const INITIAL: usize = 16 * 1024;

/// An HTTP/2 connection's socket (or mesh TLS stream) with its writes gathered per turn.
#[derive(Debug)]
pub struct Coalesced<T> {
    io: T,
    held: Vec<u8>,
    /// Bytes of `held` already written.
    sent: usize,
    /// A flush was put off until the connection's next turn.
    deferred: bool,
}

impl<T> Coalesced<T> {
    pub fn new(io: T) -> Self {
        Coalesced {
            io,
            held: Vec::new(),
            sent: 0,
            deferred: false,
        }
    }
}

impl<T: AsyncWrite + Unpin> Coalesced<T> {
    /// Write everything held, then flush the stream below (mesh TLS has records to send).
    fn send_held(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.held.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.held[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        // Kept for this turn's own frames; freed by a turn with none.
        self.held.clear();
        self.sent = 0;
        self.deferred = false;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    /// Make room for `len` more bytes: send what is held when they would take it past
    /// [`HOLD`].
    fn room_for(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<()>> {
        if self.held.len() - self.sent + len > HOLD {
            ready!(self.send_held(cx))?;
        }
        if self.held.capacity() == 0 && len < HOLD {
            self.held.reserve(len.max(INITIAL));
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for Coalesced<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.deferred {
            // A new turn: what the last one put off goes now, ahead of anything read. A socket
            // that is full keeps it, and wakes the task when it takes more.
            if let Poll::Ready(Err(e)) = this.send_held(cx) {
                return Poll::Ready(Err(e));
            }
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesced<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.room_for(cx, data.len()))?;
        if data.len() >= HOLD {
            return Pin::new(&mut this.io).poll_write(cx, data);
        }
        this.held.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let len = bufs.iter().map(|b| b.len()).sum();
        ready!(this.room_for(cx, len))?;
        if len >= HOLD {
            return Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        }
        for b in bufs {
            this.held.extend_from_slice(b);
        }
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.sent == this.held.len() {
            // A turn with nothing to send: the connection has gone quiet.
            if this.held.capacity() > 0 {
                this.held = Vec::new();
            }
            return Pin::new(&mut this.io).poll_flush(cx);
        }
        if !this.deferred {
            this.deferred = true;
            // Back of the run queue: the next turn's read sends it.
            cx.waker().wake_by_ref();
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.send_held(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    /// A socket that records each write it is given and can be told to refuse them.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<Vec<u8>>,
        full: bool,
        flushes: usize,
        shut: bool,
    }

    impl AsyncRead for Recorder {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.full {
                return Poll::Pending;
            }
            self.get_mut().writes.push(data.to_vec());
            Poll::Ready(Ok(data.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().flushes += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().shut = true;
            Poll::Ready(Ok(()))
        }
    }

    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn write(c: &mut Coalesced<Recorder>, cx: &mut Context<'_>, data: &[u8]) -> Poll<usize> {
        Pin::new(c).poll_write(cx, data).map(|r| r.unwrap())
    }

    fn flush(c: &mut Coalesced<Recorder>, cx: &mut Context<'_>) {
        assert!(Pin::new(c).poll_flush(cx).is_ready());
    }

    fn read(c: &mut Coalesced<Recorder>, cx: &mut Context<'_>) {
        let mut space = [0u8; 8];
        let mut buf = ReadBuf::new(&mut space);
        assert!(Pin::new(c).poll_read(cx, &mut buf).is_pending());
    }

    #[test]
    fn a_turns_frames_go_out_in_one_write_when_the_next_turn_reads() {
        let wakes = Arc::new(Wakes::default());
        let waker = Arc::clone(&wakes).into();
        let mut cx = Context::from_waker(&waker);
        let mut c = Coalesced::new(Recorder::default());

        // One turn: two frames, each flushed as h2 flushes a large DATA frame.
        assert_eq!(write(&mut c, &mut cx, b"headers"), Poll::Ready(7));
        let data = vec![7u8; 1029];
        let iov = [io::IoSlice::new(b"head"), io::IoSlice::new(&data)];
        let n = Pin::new(&mut c).poll_write_vectored(&mut cx, &iov);
        assert!(matches!(n, Poll::Ready(Ok(1033))));
        flush(&mut c, &mut cx);
        assert_eq!(write(&mut c, &mut cx, b"trailers"), Poll::Ready(8));
        flush(&mut c, &mut cx);
        assert!(c.io.writes.is_empty(), "nothing written within the turn");
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            1,
            "woken once for the next turn"
        );

        // The next turn starts with a read: one write, in order.
        read(&mut c, &mut cx);
        assert_eq!(c.io.writes.len(), 1);
        let mut expected = b"headershead".to_vec();
        expected.extend_from_slice(&data);
        expected.extend_from_slice(b"trailers");
        assert_eq!(c.io.writes[0], expected);
        assert_eq!(c.io.flushes, 1);

        assert!(c.held.capacity() > 0, "kept for this turn's frames");

        // A turn with nothing to send writes nothing, does not wake itself and frees the
        // buffer.
        flush(&mut c, &mut cx);
        assert_eq!(c.io.writes.len(), 1);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        assert_eq!(c.held.capacity(), 0, "a quiet connection holds no buffer");
    }

    #[test]
    fn a_full_socket_keeps_what_is_held_and_holds_no_more_than_the_bound() {
        let wakes = Arc::new(Wakes::default());
        let waker = Arc::clone(&wakes).into();
        let mut cx = Context::from_waker(&waker);
        let mut c = Coalesced::new(Recorder {
            full: true,
            ..Recorder::default()
        });
        let chunk = vec![1u8; HOLD / 2];
        assert_eq!(write(&mut c, &mut cx, &chunk), Poll::Ready(chunk.len()));
        assert_eq!(write(&mut c, &mut cx, &chunk), Poll::Ready(chunk.len()));
        flush(&mut c, &mut cx);
        // Past the bound the writer waits for the socket.
        assert_eq!(write(&mut c, &mut cx, b"x"), Poll::Pending);
        read(&mut c, &mut cx);
        assert!(c.io.writes.is_empty());
        assert!(c.deferred, "still owed to the socket");

        c.io.full = false;
        assert_eq!(write(&mut c, &mut cx, b"x"), Poll::Ready(1));
        assert_eq!(c.io.writes.len(), 1, "what was held went first");
        assert_eq!(c.io.writes[0].len(), HOLD);
        // A write as long as the bound goes straight through.
        let big = vec![2u8; HOLD];
        assert_eq!(write(&mut c, &mut cx, &big), Poll::Ready(HOLD));
        assert_eq!(c.io.writes.len(), 3, "the held byte, then the long write");
        assert_eq!(c.io.writes[1], b"x");
    }

    #[test]
    fn shutting_down_sends_everything_first() {
        let wakes = Arc::new(Wakes::default());
        let waker = Arc::clone(&wakes).into();
        let mut cx = Context::from_waker(&waker);
        let mut c = Coalesced::new(Recorder::default());
        assert_eq!(write(&mut c, &mut cx, b"goaway"), Poll::Ready(6));
        flush(&mut c, &mut cx);
        assert!(Pin::new(&mut c).poll_shutdown(&mut cx).is_ready());
        assert_eq!(c.io.writes, vec![b"goaway".to_vec()]);
        assert!(c.io.shut);
    }
}
