//! The streams a mesh connection is read through: the client's socket with the ClientHello
//! that detection already read put back in front ([`Rewind`]), and the downstream side of a
//! connection as the HTTP server and the copy see it, plain or terminated TLS
//! ([`Downstream`]).

use bytes::{Buf, BytesMut};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A TLS server stream over the client's socket.
pub type ServerStream = tokio_rustls::server::TlsStream<Rewind<TcpStream>>;
/// A TLS client stream to a mesh destination.
pub type ClientStream = tokio_rustls::client::TlsStream<TcpStream>;

/// An originated TLS stream whose server may end it without a `close_notify`: that end is
/// read as the end of the stream, passed on as a half-close, as Envoy closes the downstream
/// after what it read (many servers outside the mesh close the socket straight away). Without
/// this, rustls reports the truncation as an error, the copy resets the client, and the reset
/// throws away the answer still in the client socket's send buffer.
#[derive(Debug)]
pub struct EndWithoutCloseNotify<S>(pub S);

impl<S: AsyncRead + Unpin> AsyncRead for EndWithoutCloseNotify<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.get_mut().0).poll_read(cx, buf) {
            Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                tracing::debug!("upstream TLS ended without close_notify; read as its end");
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for EndWithoutCloseNotify<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// A stream with bytes already read from it put back in front.
#[derive(Debug)]
pub struct Rewind<S> {
    prefix: BytesMut,
    inner: S,
    /// Reads from `inner` that brought bytes, wrapping: a read above that waits tells by it
    /// whether it took anything off the socket.
    reads: u32,
}

impl<S> Rewind<S> {
    pub fn new(prefix: BytesMut, inner: S) -> Self {
        Rewind {
            prefix,
            inner,
            reads: 0,
        }
    }

    /// Reads from the stream underneath that brought bytes so far (wrapping).
    pub fn reads(&self) -> u32 {
        self.reads
    }

    /// The stream underneath.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Whether bytes read before are still to be replayed.
    pub fn holds_data(&self) -> bool {
        !self.prefix.is_empty()
    }

    /// The bytes not read yet, and the stream underneath.
    pub fn into_parts(self) -> (BytesMut, S) {
        (self.prefix, self.inner)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.prefix.is_empty() {
            let filled = buf.filled().len();
            let read = Pin::new(&mut this.inner).poll_read(cx, buf);
            if buf.filled().len() > filled {
                this.reads = this.reads.wrapping_add(1);
            }
            return read;
        }
        let n = this.prefix.len().min(buf.remaining());
        buf.put_slice(&this.prefix[..n]);
        this.prefix.advance(n);
        if this.prefix.is_empty() {
            // Give the detection buffer back.
            this.prefix = BytesMut::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The client side of a connection: its socket, or mesh TLS terminated on it. The TLS state is
/// boxed so a plaintext connection does not carry its size.
#[derive(Debug)]
pub enum Downstream {
    Plain(TcpStream),
    Mesh(Box<ServerStream>),
}

impl Downstream {
    /// The client's socket.
    pub fn socket(&self) -> &TcpStream {
        match self {
            Downstream::Plain(s) => s,
            Downstream::Mesh(tls) => tls.get_ref().0.inner(),
        }
    }
}

impl AsyncRead for Downstream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Downstream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Downstream::Mesh(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Downstream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Downstream::Plain(s) => Pin::new(s).poll_write(cx, data),
            Downstream::Mesh(s) => Pin::new(s.as_mut()).poll_write(cx, data),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Downstream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Downstream::Mesh(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Downstream::Plain(s) => s.is_write_vectored(),
            Downstream::Mesh(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Downstream::Plain(s) => Pin::new(s).poll_flush(cx),
            Downstream::Mesh(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Downstream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Downstream::Mesh(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
