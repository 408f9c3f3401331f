//! The downstream socket as the HTTP server reads it: first the bytes detection already read,
//! then the socket itself. Every byte is counted into the direction's metrics as it passes, and
//! any traffic at all marks the connection as not idle.
//!
//! On HTTP/1.x connections the bytes are also followed before hyper parses them
//! ([`RequestFraming`]): a head with both `Content-Length` and `Transfer-Encoding` is reported
//! to the service, and a head that takes longer than `http.header_read_timeout` from its first
//! byte is answered 408 and the connection closed (Envoy's `request_headers_timeout`); a body
//! that comes slower than `http.request_body_timeout` and `http.request_body_min_rate` allow
//! ([`BodyPace`]) is cut likewise (408 when no response has begun).

use super::body_pace::BodyPace;
use super::framing::RequestFraming;
use super::ConnContext;
use crate::tls::stream::Downstream;
use bytes::{Buf, BytesMut};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// What a client whose request head did not arrive in time is told, as Envoy tells it.
const HEADER_TIMEOUT_RESPONSE: &[u8] =
    b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// A request head took longer than `http.header_read_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("request headers not received within {timeout:?}")]
pub struct HeaderReadTimeout {
    pub timeout: std::time::Duration,
    /// Whether the client was answered 408 (not when a response was still being written).
    pub answered: bool,
}

/// The client connection behind the HTTP server.
#[derive(Debug)]
pub struct DownstreamIo {
    prefix: BytesMut,
    stream: Downstream,
    ctx: Arc<ConnContext>,
    framing: RequestFraming,
    /// When the head being read must be complete; allocated on the first head that does not
    /// arrive in one read, and reset for later ones.
    head_deadline: Option<Pin<Box<Sleep>>>,
    head_timer_armed: bool,
    /// The request body in progress, timed (the deadline above is its timer then).
    body: Option<BodyPace>,
    /// The last write could not complete: hyper holds response bytes we have not written, so
    /// nothing may be written in front of them.
    write_blocked: bool,
}

impl DownstreamIo {
    /// `prefix` is replayed before anything is read from `stream`; `http1` turns on the
    /// inspection of request heads.
    /// Requests the connection started before (on the fast path) count in head positions.
    pub fn new(prefix: BytesMut, stream: Downstream, ctx: Arc<ConnContext>, http1: bool) -> Self {
        let framing = if http1 {
            RequestFraming::after(ctx.started.load(std::sync::atomic::Ordering::Relaxed))
        } else {
            RequestFraming::stopped()
        };
        DownstreamIo {
            prefix,
            stream,
            ctx,
            framing,
            head_deadline: None,
            head_timer_armed: false,
            body: None,
            write_blocked: false,
        }
    }

    /// Follow bytes just read: report a smuggling-shaped head, and time the head in progress.
    fn inspect(&mut self, read: &[u8]) {
        if let Some(head) = self.framing.feed(read) {
            self.ctx.refuse_head(head);
        }
        let in_head = self.framing.in_head();
        if in_head && !self.head_timer_armed {
            let deadline = Instant::now() + self.ctx.config.http.header_read_timeout;
            match &mut self.head_deadline {
                Some(sleep) => sleep.as_mut().reset(deadline),
                None => self.head_deadline = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        self.head_timer_armed = in_head;
        self.pace_body(read.len());
    }

    /// Start, follow or end the clock of a request body.
    fn pace_body(&mut self, n: usize) {
        let in_body = self.framing.in_body();
        let http = &self.ctx.config.http;
        match &mut self.body {
            Some(pace) if in_body => pace.received(n, Instant::now()),
            Some(_) => self.body = None,
            None if in_body && !http.request_body_timeout.is_zero() => {
                let sent = self.ctx.transfer().received;
                self.body = Some(BodyPace::new(
                    http.request_body_timeout,
                    http.request_body_min_rate,
                    sent,
                ));
                let deadline = Instant::now() + http.request_body_timeout;
                match &mut self.head_deadline {
                    Some(sleep) => sleep.as_mut().reset(deadline),
                    None => self.head_deadline = Some(Box::pin(tokio::time::sleep_until(deadline))),
                }
            }
            None => {}
        }
    }

    /// The timeout, if the body in progress is out of time; otherwise registers for a wake-up
    /// when it may be. The timer is set lazily: when it fires early (bytes arrived since, or
    /// the upstream held the body back), it is set again for what is left.
    fn body_timed_out(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Option<super::body_pace::BodyReadTimeout> {
        let pace = self.body.as_mut()?;
        let now = Instant::now();
        pace.waiting(now);
        let sleep = self.head_deadline.as_mut()?;
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                return None;
            }
            let left = pace.remaining(Instant::now());
            if left.is_zero() {
                break;
            }
            sleep.as_mut().reset(Instant::now() + left);
        }
        // A 408 only if nothing of a response was written since the body began.
        let mut answered = false;
        if !self.write_blocked && self.ctx.transfer().received == pace.sent_at_start {
            let stream = Pin::new(&mut self.stream);
            if let Poll::Ready(Ok(n)) = stream.poll_write(cx, HEADER_TIMEOUT_RESPONSE) {
                self.ctx.count_sent(n);
                let _ = Pin::new(&mut self.stream).poll_flush(cx);
                answered = n == HEADER_TIMEOUT_RESPONSE.len();
            }
        }
        if answered {
            self.ctx.cut_body(self.framing.heads());
        }
        let e = pace.timed_out(answered);
        self.body = None;
        Some(e)
    }

    /// The timeout, if the head in progress is out of time; otherwise registers for a wake-up
    /// when it will be. A timed-out client gets a 408 if nothing else is being written to it.
    fn head_timed_out(&mut self, cx: &mut Context<'_>) -> Option<HeaderReadTimeout> {
        // A head pipelined behind a request in flight is timed once that request is over
        // (hyper reads again for the next head then): the bound is on slow heads, and must not
        // cut a response on its way.
        if !self.ctx.idle() {
            return None;
        }
        let deadline = self
            .head_deadline
            .as_mut()
            .filter(|_| self.head_timer_armed)?;
        if deadline.as_mut().poll(cx).is_pending() {
            return None;
        }
        let mut answered = false;
        if !self.write_blocked {
            // Best effort: a client that does not read does not get it.
            let stream = Pin::new(&mut self.stream);
            if let Poll::Ready(Ok(n)) = stream.poll_write(cx, HEADER_TIMEOUT_RESPONSE) {
                self.ctx.count_sent(n);
                let _ = Pin::new(&mut self.stream).poll_flush(cx);
                answered = n == HEADER_TIMEOUT_RESPONSE.len();
            }
        }
        Some(HeaderReadTimeout {
            timeout: self.ctx.config.http.header_read_timeout,
            answered,
        })
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
        // Replayed bytes were counted when they were read from the socket (by detection or the
        // fast path): only the socket's own count here.
        let mut replayed = 0;
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            replayed = n;
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            if this.prefix.is_empty() {
                // Give the detection buffer back: an idle connection holds no buffer.
                this.prefix = BytesMut::new();
            }
        } else {
            match Pin::new(&mut this.stream).poll_read(cx, buf) {
                Poll::Ready(result) => result?,
                Poll::Pending => {
                    if let Some(e) = this.head_timed_out(cx) {
                        tracing::debug!(peer = %this.ctx.peer, error = %e, "request head cut");
                        return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, e)));
                    }
                    if let Some(e) = this.body_timed_out(cx) {
                        tracing::debug!(peer = %this.ctx.peer, error = %e, "request body cut");
                        return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, e)));
                    }
                    return Poll::Pending;
                }
            }
        }
        let n = buf.filled().len() - before;
        this.ctx.count_received(n - replayed);
        if n > 0 {
            this.inspect(&buf.filled()[before..]);
        }
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
        let written = Pin::new(&mut this.stream).poll_write(cx, data);
        this.write_blocked = written.is_pending();
        let n = ready!(written)?;
        this.ctx.count_sent(n);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.write_blocked = written.is_pending();
        let n = ready!(written)?;
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
