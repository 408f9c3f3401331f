//! Request and response bodies as they cross the proxy: streamed frame by frame (data and
//! trailers), never collected, so flow control reaches from one peer to the other and memory per
//! stream stays at what the HTTP/2 windows and HTTP/1.1 buffers allow.
//!
//! The end of a response body is where a request ends: its HTTP/1.1 upstream connection goes
//! back to the pool, and its access-log line is written.

use super::access_log::RequestLog;
use super::counting::{BodyCounter, GrpcFraming};
use super::errors::Flags;
use super::pool::{Key, Sender};
use super::retry::ReplayBody;
use super::ConnContext;
use crate::metrics::RequestOutcome;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;
use tokio::time::Sleep;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of a request sent upstream.
#[derive(Debug)]
pub enum UpstreamBody {
    /// No body (a GET, or a retry of one).
    Empty,
    /// The client's body, streamed as it arrives.
    Streamed {
        inner: super::mirror::ClientBody,
        received: Option<Arc<BodyCounter>>,
    },
    /// The client's body, kept for replay while it is short enough.
    Replay(ReplayBody),
    /// A mirror's copy of the client's body ([`super::mirror`]).
    Shadow(super::mirror::ShadowBody),
    /// A check sent to the external authorizer, in one piece ([`super::ext_authz`]).
    Check(Option<Bytes>),
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            UpstreamBody::Empty => Poll::Ready(None),
            UpstreamBody::Streamed { inner, received } => {
                let frame = ready!(Pin::new(inner).poll_frame(cx));
                if let (Some(Ok(f)), Some(counter)) = (&frame, received) {
                    if let Some(d) = f.data_ref() {
                        counter.data(d);
                    }
                }
                Poll::Ready(frame.map(|r| r.map_err(Into::into)))
            }
            UpstreamBody::Replay(r) => Pin::new(r).poll_frame(cx),
            UpstreamBody::Shadow(s) => Pin::new(s).poll_frame(cx),
            UpstreamBody::Check(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Empty => true,
            UpstreamBody::Streamed { inner, .. } => inner.is_end_stream(),
            UpstreamBody::Replay(r) => r.is_end_stream(),
            UpstreamBody::Shadow(s) => s.is_end_stream(),
            UpstreamBody::Check(b) => b.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Empty => SizeHint::with_exact(0),
            UpstreamBody::Streamed { inner, .. } => inner.size_hint(),
            UpstreamBody::Replay(r) => r.size_hint(),
            UpstreamBody::Shadow(s) => s.size_hint(),
            UpstreamBody::Check(b) => {
                SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

/// The body of a response sent downstream: the upstream's, or one the proxy wrote.
#[derive(Debug)]
pub struct ResponseBody {
    inner: Inner,
    /// The request's deadline, when it has one (`grpc-timeout`, `http.request_timeout`).
    deadline: Option<Pin<Box<Sleep>>>,
    end: Option<RequestEnd>,
}

#[derive(Debug)]
enum Inner {
    Upstream(Incoming),
    Local(Option<Bytes>),
}

/// The request's deadline passed while its response was streaming.
#[derive(Debug, thiserror::Error)]
#[error("request deadline passed during the response")]
struct DeadlinePassed;

impl ResponseBody {
    /// The upstream's response body.
    pub fn upstream(
        inner: Incoming,
        deadline: Option<Pin<Box<Sleep>>>,
        mut end: RequestEnd,
    ) -> Self {
        // hyper never polls a body that is empty from the start (204, HEAD…).
        end.complete = inner.is_end_stream();
        ResponseBody {
            inner: Inner::Upstream(inner),
            deadline,
            end: Some(end),
        }
    }

    /// The (empty) body of a `101 Switching Protocols`: the request ends with the tunnel.
    pub fn upgraded(inner: Incoming) -> Self {
        ResponseBody {
            inner: Inner::Upstream(inner),
            deadline: None,
            end: None,
        }
    }

    /// A body the proxy wrote (a local reply).
    pub fn local(bytes: Bytes, mut end: RequestEnd) -> Self {
        // Written by us in one piece: nothing upstream to abandon.
        end.complete = true;
        ResponseBody {
            inner: Inner::Local((!bytes.is_empty()).then_some(bytes)),
            deadline: None,
            end: Some(end),
        }
    }

    fn finish(&mut self) {
        if let Some(mut end) = self.end.take() {
            end.complete = true;
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(d) = &mut this.deadline {
            if d.as_mut().poll(cx).is_ready() {
                if let Some(end) = &mut this.end {
                    end.flags.insert(Flags::UT);
                }
                return Poll::Ready(Some(Err(DeadlinePassed.into())));
            }
        }
        let frame = match &mut this.inner {
            Inner::Local(bytes) => bytes.take().map(|b| Ok(Frame::data(b))),
            Inner::Upstream(inner) => {
                ready!(Pin::new(inner).poll_frame(cx)).map(|r| r.map_err(BoxError::from))
            }
        };
        match &frame {
            Some(Ok(f)) => {
                if let (Some(d), Some(end)) = (f.data_ref(), &mut this.end) {
                    end.sent += d.len() as u64;
                    if end.grpc {
                        end.response_framing.feed(d);
                    }
                }
                if let (Some(t), Some(end)) = (f.trailers_ref(), &mut this.end) {
                    if let Some(s) = super::headers::grpc_status(t) {
                        end.grpc_status = Some(s);
                    }
                }
                if this.is_end_stream() {
                    this.finish();
                }
            }
            Some(Err(_)) => {
                if let Some(end) = &mut this.end {
                    end.flags.insert(Flags::UR);
                }
            }
            None => this.finish(),
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Local(b) => b.is_none(),
            Inner::Upstream(inner) => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Local(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Inner::Upstream(inner) => inner.size_hint(),
        }
    }
}

/// What happens when a request is over, whichever way it ends: its HTTP/1.1 upstream connection
/// returns to the pool if the response was read to its end, its access-log line is written, and
/// the downstream connection counts one request fewer in flight.
#[derive(Debug)]
pub struct RequestEnd {
    pub conn: Arc<ConnContext>,
    /// hyper's path only (boxed: the HTTP/1.1 fast path's state carries this field too, and
    /// must stay within the allocator's per-thread cache; see `h1::tests`).
    pub pooled: Option<Box<ToPool>>,
    /// xDS only. Inline: the fast path's requests routed by xDS would otherwise allocate it
    /// once each.
    pub routed: Option<RoutedEnd>,
    pub log: Option<Box<RequestLog>>,
    pub flags: Flags,
    pub sent: u64,
    pub complete: bool,
    /// When the request arrived.
    pub started: Instant,
    pub grpc: bool,
    /// The status sent downstream; 0 until there is one.
    pub status: u16,
    /// From the response's trailers (or headers, for a trailers-only response).
    pub grpc_status: Option<u32>,
    /// The request body as it was read from the client.
    pub received: Arc<BodyCounter>,
    pub response_framing: GrpcFraming,
    /// The request's position on its connection, from 1.
    pub position: u64,
}

/// What a request routed by xDS holds until it ends.
#[derive(Debug, Default)]
pub struct RoutedEnd {
    /// The request's count against its endpoint (LEAST_REQUEST), ended with it.
    pub in_flight: Option<crate::upstream::InFlight>,
    /// The destination as Istio's metrics name it (else the connection's peer).
    pub metrics_peer: Option<Arc<crate::tls::Peer>>,
}

/// An HTTP/1.1 upstream connection of hyper's path, pooled again when its response was read to
/// its end.
#[derive(Debug)]
pub struct ToPool {
    pub key: Key,
    pub sender: Sender,
    /// How long it may stay pooled: a routed cluster's idle timeout (`None`: the config's).
    pub idle_timeout: Option<std::time::Duration>,
}

impl RequestEnd {
    /// A request that has just started on `conn`.
    pub fn new(
        conn: Arc<ConnContext>,
        log: Option<Box<RequestLog>>,
        grpc: bool,
        started: Instant,
    ) -> Self {
        let position = conn.request_started();
        RequestEnd {
            conn,
            pooled: None,
            routed: None,
            log,
            flags: Flags::default(),
            sent: 0,
            complete: false,
            started,
            grpc,
            status: 0,
            grpc_status: None,
            received: Arc::new(BodyCounter::new(grpc)),
            response_framing: GrpcFraming::default(),
            position,
        }
    }
}

impl Drop for RequestEnd {
    fn drop(&mut self) {
        if let Some(pooled) = self.pooled.take() {
            // A response abandoned half way leaves the connection mid-message: not reusable.
            if self.complete {
                let ToPool {
                    key,
                    sender,
                    idle_timeout,
                } = *pooled;
                self.conn.return_to_pool(key, sender, idle_timeout);
            } else {
                pooled.sender.abandon();
            }
        }
        let upstream_failed = self.flags.contains(Flags::UR) || self.flags.contains(Flags::UT);
        // A body too slow for `http.request_body_*`: the client was answered 408 by the
        // downstream IO, which is what the request is recorded with (not a disconnect).
        let body_cut = self.status == 0 && self.conn.body_was_cut(self.position);
        if body_cut {
            // The connection's end after the cut is ours, not the client's going away.
            self.flags.remove(Flags::DC);
            self.status = 408;
            if let Some(log) = self.log.as_mut() {
                log.status = 408;
            }
        }
        let downstream_reset = !self.complete && !upstream_failed && !body_cut;
        if downstream_reset {
            self.flags.insert(Flags::DC);
        }
        if self.conn.key.version == crate::detect::HttpVersion::Http2 {
            // Rapid Reset: reset by the client before any response head, and young.
            let premature = downstream_reset
                && self.status == 0
                && self.started.elapsed() < super::premature_reset::MIN_STREAM_LIFETIME;
            self.conn.resets.stream_closed(premature);
        }
        self.conn.proxy.metrics.request_finished(
            &self.conn.series,
            &RequestOutcome {
                mesh_peer: self
                    .routed
                    .as_mut()
                    .and_then(|r| r.metrics_peer.take())
                    .or_else(|| self.conn.metrics_peer()),
                direction: self.conn.direction,
                grpc: self.grpc,
                code: self.status,
                grpc_status: self.grpc_status,
                flags: self.flags,
                duration: self.started.elapsed(),
                request_bytes: self.received.bytes(),
                response_bytes: self.sent,
                request_messages: self.received.messages(),
                response_messages: self.response_framing.messages,
            },
        );
        if let Some(log) = self.log.take() {
            self.conn.write_log(*log, self.flags, self.sent);
        }
        self.conn.request_ended(self.status);
    }
}
