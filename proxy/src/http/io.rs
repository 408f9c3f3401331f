//! The downstream socket as the HTTP server reads it: first the bytes detection already read,
//! then the socket itself. Every byte is counted into the direction's metrics as it passes, and
//! any traffic at all marks the connection as not idle.

use super::ConnContext;
use crate::tls::stream::Downstream;
use bytes::{Buf, BytesMut};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection behind the HTTP server.
#[derive(Debug)]
pub struct DownstreamIo {
    prefix: BytesMut,
    stream: Downstream,
    ctx: Arc<ConnContext>,
}

impl DownstreamIo {
    /// `prefix` is replayed before anything is read from `stream`.
    pub fn new(prefix: BytesMut, stream: Downstream, ctx: Arc<ConnContext>) -> Self {
        DownstreamIo {
            prefix,
            stream,
            ctx,
        }
    }
}

impl AsyncRead for DownstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            if this.prefix.is_empty() {
                // Give the detection buffer back: an idle connection holds no buffer.
                this.prefix = BytesMut::new();
            }
        } else {
            ready!(Pin::new(&mut this.stream).poll_read(cx, buf))?;
        }
        this.ctx.count_received(buf.filled().len() - before);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for DownstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.stream).poll_write(cx, data))?;
        this.ctx.count_sent(n);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.stream).poll_write_vectored(cx, bufs))?;
        this.ctx.count_sent(n);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
