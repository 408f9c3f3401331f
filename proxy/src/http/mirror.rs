//! Request mirroring (a route's `request_mirror_policies`, Istio's VirtualService `mirror` /
//! `mirrors`), as Envoy's router shadows requests: for each policy whose fraction the request
//! falls in, a copy goes to the policy's cluster with `-shadow` inserted before the port of
//! its authority, through the same upstream layer as a normal attempt (endpoint selection,
//! circuit breakers, pooled connections), in a task of its own. Its response is read and
//! discarded; the original request never waits for it and never sees its failure.
//!
//! Bounds: at most [`MAX_SHADOWS`] copies in flight per proxy (more are dropped and counted),
//! each within the route's timeout or [`SHADOW_TIMEOUT`] when the route has none. Bodies are
//! streamed to the copies as the original reads them (a [`Tee`]), as Envoy streams a shadow's:
//! frames are shared (`Bytes`), never copied, and never wait for a copy; a copy more than
//! [`COPY_FRAMES`] frames behind is abandoned (its upstream request fails, counted), as is
//! every copy of a body the client cuts short.

use super::body::UpstreamBody;
use super::ConnContext;
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, HOST};
use http::request::Parts;
use http::Request;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use remora_xds::model::cluster::Cluster;
use remora_xds::model::route::MirrorPolicy;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;

/// The most shadow requests in flight at once, per proxy: past it, a copy is dropped (and
/// counted) rather than queued, so a slow mirror cluster costs bounded memory.
pub const MAX_SHADOWS: usize = 512;

/// How long a shadow may take when its route sets no timeout (istiod's routes set none):
/// a copy that never ends would hold one of [`MAX_SHADOWS`] forever.
pub const SHADOW_TIMEOUT: Duration = Duration::from_secs(60);

/// What became of the copies, for `/stats/prometheus`.
#[derive(Debug, Default)]
pub struct MirrorStats {
    in_flight: AtomicUsize,
    /// Copies sent (whatever their outcome).
    pub sent: Counter,
    /// Copies not sent: [`MAX_SHADOWS`] already in flight.
    pub overflow: Counter,
    /// Copies not sent: the mirror cluster is not in the snapshot.
    pub no_cluster: Counter,
    /// Copies that got no response (no endpoint, connect failure, reset, timeout, a body
    /// cut short or fallen [`COPY_FRAMES`] behind).
    pub failed: Counter,
}

impl MirrorStats {
    /// The counters, registered.
    pub fn register(registry: &mut Registry) -> Self {
        let stats = MirrorStats::default();
        for (name, help, c) in [
            (
                "remora_mirror_requests_sent",
                "Shadow copies of requests sent to mirror clusters",
                &stats.sent,
            ),
            (
                "remora_mirror_requests_overflow",
                "Shadow copies dropped because too many were in flight",
                &stats.overflow,
            ),
            (
                "remora_mirror_requests_no_cluster",
                "Shadow copies not sent because the mirror cluster is unknown",
                &stats.no_cluster,
            ),
            (
                "remora_mirror_requests_failed",
                "Shadow copies that got no response",
                &stats.failed,
            ),
        ] {
            registry.register(name, help, c.clone());
        }
        stats
    }
}

/// Send the copies of a request (its head as it goes upstream, and its `body`) that
/// `policies` ask for, each in a task of its own; returns at once, with the body the
/// original goes on with (teed to the copies when it has one).
pub(super) fn shadow(
    ctx: &Arc<ConnContext>,
    policies: &[MirrorPolicy],
    parts: &Parts,
    body: ClientBody,
    timeout: Option<Duration>,
) -> ClientBody {
    let stats = &ctx.proxy.metrics.mirror;
    let empty_body = body.is_end_stream();
    let mut copies = Vec::new();
    for policy in policies {
        if !policy.fraction.hits(fastrand::u64(..)) {
            continue;
        }
        let Some(cluster) = ctx
            .proxy
            .xds
            .as_ref()
            .and_then(|s| s.current().cluster(&policy.cluster).cloned())
        else {
            tracing::debug!(cluster = %policy.cluster, "mirror cluster unknown; no shadow");
            stats.no_cluster.inc();
            continue;
        };
        if stats.in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_SHADOWS {
            stats.in_flight.fetch_sub(1, Ordering::AcqRel);
            stats.overflow.inc();
            continue;
        }
        stats.sent.inc();
        let mut req = copy(parts, policy);
        internal(req.headers_mut(), local_ip(ctx));
        if !empty_body {
            let (tx, rx) = mpsc::channel(COPY_FRAMES);
            copies.push(tx);
            *req.body_mut() = UpstreamBody::Shadow(ShadowBody { rx, done: false });
        }
        let slot = Slot(Arc::clone(ctx));
        let limit = timeout.unwrap_or(SHADOW_TIMEOUT);
        // A suspected connection's mirrors dial as suspects too (crate::loop_guard).
        let suspect = crate::loop_guard::serving_suspect();
        tokio::spawn(crate::loop_guard::carry_suspicion(suspect, async move {
            let ok = tokio::time::timeout(limit, send(&slot.0, cluster, req))
                .await
                .unwrap_or(false);
            if !ok {
                slot.0.proxy.metrics.mirror.failed.inc();
            }
        }));
    }
    if copies.is_empty() {
        body
    } else {
        ClientBody::Teed(Box::new(Tee {
            inner: body,
            copies,
        }))
    }
}

/// How many frames of the client's body a copy may be behind the original: past it, the copy
/// is abandoned (its request reset upstream and counted failed), never the original slowed.
pub const COPY_FRAMES: usize = 64;

/// The client's body as the original request reads it: as received, or teed to copies.
#[derive(Debug)]
pub enum ClientBody {
    Plain(Incoming),
    /// Read ahead (the external authorizer was sent its first bytes), then the rest.
    Buffered(Box<Buffered>),
    Teed(Box<Tee>),
}

/// A body partly read ahead: what was read, then what was not.
#[derive(Debug)]
pub struct Buffered {
    pub head: Option<Bytes>,
    /// The body's trailers, when they were read ahead too.
    pub trailers: Option<HeaderMap>,
    /// `None` when the body ended within what was read.
    pub rest: Option<Incoming>,
}

impl Body for Buffered {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(head) = self.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        if let Some(rest) = &mut self.rest {
            return Pin::new(rest).poll_frame(cx);
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none()
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let head = self.head.as_ref().map_or(0, |h| h.len() as u64);
        match &self.rest {
            None => SizeHint::with_exact(head),
            Some(rest) => {
                let r = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(r.lower() + head);
                if let Some(upper) = r.upper() {
                    hint.set_upper(upper + head);
                }
                hint
            }
        }
    }
}

/// The client's body, each frame also handed to the copies that keep up.
#[derive(Debug)]
pub struct Tee {
    inner: ClientBody,
    copies: Vec<mpsc::Sender<Piece>>,
}

/// What a copy's body receives: a frame, or the end of a body that ended well. A channel
/// closed without [`Piece::End`] is a body cut short: the copy fails rather than sending a
/// truncated body as if whole.
#[derive(Debug)]
pub enum Piece {
    Frame(Frame<Bytes>),
    End,
}

impl Tee {
    /// Hand `piece` to each copy that has room; a copy without is dropped.
    fn hand(&mut self, piece: impl Fn() -> Piece) {
        self.copies.retain(|tx| tx.try_send(piece()).is_ok());
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ClientBody::Plain(inner) => Pin::new(inner).poll_frame(cx),
            ClientBody::Buffered(b) => Pin::new(&mut **b).poll_frame(cx),
            ClientBody::Teed(tee) => {
                let frame = ready!(Pin::new(&mut tee.inner).poll_frame(cx));
                match &frame {
                    Some(Ok(f)) => {
                        if let Some(d) = f.data_ref() {
                            tee.hand(|| Piece::Frame(Frame::data(d.clone())));
                        } else if let Some(t) = f.trailers_ref() {
                            tee.hand(|| Piece::Frame(Frame::trailers(t.clone())));
                        }
                        // The last frame: the original's reader may not poll again.
                        if tee.inner.is_end_stream() {
                            tee.hand(|| Piece::End);
                            tee.copies.clear();
                        }
                    }
                    None => {
                        tee.hand(|| Piece::End);
                        tee.copies.clear();
                    }
                    // The copies' channels close without an end: they fail too.
                    Some(Err(_)) => tee.copies.clear(),
                }
                Poll::Ready(frame)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Plain(inner) => inner.is_end_stream(),
            ClientBody::Buffered(b) => b.is_end_stream(),
            ClientBody::Teed(tee) => tee.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Plain(inner) => inner.size_hint(),
            ClientBody::Buffered(b) => b.size_hint(),
            ClientBody::Teed(tee) => tee.inner.size_hint(),
        }
    }
}

/// A copy's body: the frames the [`Tee`] handed it.
#[derive(Debug)]
pub struct ShadowBody {
    rx: mpsc::Receiver<Piece>,
    done: bool,
}

/// The original's body ended before the copy's did (cut short, or the copy fell behind).
#[derive(Debug, thiserror::Error)]
#[error("the mirrored body was cut short")]
struct CutShort;

impl Body for ShadowBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match ready!(self.rx.poll_recv(cx)) {
            Some(Piece::Frame(f)) => Poll::Ready(Some(Ok(f))),
            Some(Piece::End) => {
                self.done = true;
                Poll::Ready(None)
            }
            None => {
                self.done = true;
                Poll::Ready(Some(Err(CutShort.into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// One of [`MAX_SHADOWS`], given back when its task ends however it ends.
struct Slot(Arc<ConnContext>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0
            .proxy
            .metrics
            .mirror
            .in_flight
            .fetch_sub(1, Ordering::AcqRel);
    }
}

/// The copy of a request's head for `policy`: the same method, target and headers, its
/// authority with the shadow suffix.
fn copy(parts: &Parts, policy: &MirrorPolicy) -> Request<UpstreamBody> {
    let mut req = Request::new(UpstreamBody::Empty);
    *req.method_mut() = parts.method.clone();
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    let host = parts
        .headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| parts.uri.authority().map(|a| a.as_str()));
    let mut uri = parts.uri.clone();
    if let Some(host) = host {
        let shadow = policy.shadow_host(host);
        if parts.headers.contains_key(HOST) {
            if let Ok(v) = HeaderValue::try_from(shadow.as_str()) {
                req.headers_mut().insert(HOST, v);
            }
        }
        if parts.uri.authority().is_some() {
            let mut p = parts.uri.clone().into_parts();
            p.authority = shadow.parse().ok();
            if let Ok(u) = http::Uri::from_parts(p) {
                uri = u;
            }
        }
    }
    *req.uri_mut() = uri;
    req
}

/// This proxy's address as Envoy's async client names it in a shadow's `x-forwarded-for`
/// (its node's address, the pod's): the client's for an outbound connection (the
/// application shares the pod's address), the connection's destination for an inbound one.
fn local_ip(ctx: &ConnContext) -> IpAddr {
    match ctx.direction {
        crate::Direction::Outbound => ctx.peer.ip(),
        crate::Direction::Inbound => ctx.key.destination.ip(),
    }
}

/// Envoy sends a shadow as an internal request of its own: `x-envoy-internal: true`, and
/// its address appended to `x-forwarded-for`.
fn internal(headers: &mut HeaderMap, local: IpAddr) {
    headers.insert(ENVOY_INTERNAL.clone(), HeaderValue::from_static("true"));
    let xff = match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(before) if !before.trim().is_empty() => format!("{before},{local}"),
        _ => local.to_string(),
    };
    if let Ok(v) = HeaderValue::try_from(xff) {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
}

static ENVOY_INTERNAL: HeaderName = HeaderName::from_static("x-envoy-internal");
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// One copy through the upstream layer, as an attempt of a route to `cluster` with no
/// retries; its response read to the end and discarded. Whether it got a whole response.
async fn send(ctx: &Arc<ConnContext>, cluster: Arc<Cluster>, req: Request<UpstreamBody>) -> bool {
    let Some(store) = &ctx.proxy.xds else {
        return false;
    };
    let generation = store.generation();
    let target = super::routed::RoutedCluster::resolve(ctx, &store.current(), &cluster, generation);
    // The shadow's own authority (`host-shadow`), as Envoy's router reads the shadow's
    // headers for `auto_sni`.
    let origin_host = (cluster.auto_sni || cluster.auto_san_validation)
        .then(|| {
            req.uri().host().or_else(|| {
                req.headers()
                    .get(http::header::HOST)
                    .and_then(|v| v.to_str().ok())
            })
        })
        .flatten()
        .map(|a| Arc::from(crate::upstream::transport::host_of(a)));
    let mut routed = super::routed::Routed::single_attempt(target);
    routed.origin_host = origin_host;
    routed.internal = true;
    let up = match super::routed::send(ctx, &routed, req).await {
        // A shadow is never retried: its answer is its own.
        Ok(up) => {
            up.charge_answer(false);
            up
        }
        Err(e) => {
            let cluster = routed.cluster.as_ref().map(|c| c.model.name.as_str());
            tracing::debug!(?cluster, error = %e, "shadow request failed");
            // Envoy's shadow is a request of its router's: a failure before any answer is
            // charged to the cluster as the router's own answer (an internal one).
            super::routed::charge_local_answer(&routed, e.kind);
            return false;
        }
    };
    let (response, pooled, idle, in_flight) =
        (up.response, up.pooled, up.pool_idle_timeout, up.in_flight);
    let whole = response.into_body().collect().await.is_ok();
    // Into the proxy's pool of xDS upstream connections (never a connection's own mesh pool,
    // which a shadow to another cluster does not belong in).
    if let (true, Some((key, sender))) = (whole, pooled) {
        let http = &ctx.config.http;
        ctx.proxy.pool.checkin(
            key,
            sender,
            idle.unwrap_or(http.pool_idle_timeout),
            http.pool_max_idle_per_upstream,
        );
    }
    drop(in_flight);
    whole
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_xds::model::fault::Fraction;

    fn policy(suffix: bool) -> MirrorPolicy {
        MirrorPolicy {
            cluster: "m".into(),
            fraction: Fraction::ALL,
            shadow_suffix: suffix,
        }
    }

    fn head(uri: &str, host: Option<&str>) -> Parts {
        let mut b = Request::builder()
            .method("DELETE")
            .uri(uri)
            .header("x-user", "jason");
        if let Some(h) = host {
            b = b.header(HOST, h);
        }
        b.body(()).expect("a request").into_parts().0
    }

    #[test]
    fn the_copy_has_the_shadow_authority_and_everything_else_of_the_original() {
        let parts = head("/status/418?x=1", Some("httpbin:8000"));
        let copy = copy(&parts, &policy(true));
        assert_eq!(copy.method(), http::Method::DELETE);
        assert_eq!(copy.uri(), "/status/418?x=1");
        assert_eq!(copy.headers()[HOST], "httpbin-shadow:8000");
        assert_eq!(copy.headers()["x-user"], "jason");
        // The original is left as it was.
        assert_eq!(parts.headers[HOST], "httpbin:8000");
        // HTTP/2's authority is in the target.
        let h2 = head("http://httpbin:8000/get", None);
        let copy = super::copy(&h2, &policy(true));
        assert_eq!(copy.uri(), "http://httpbin-shadow:8000/get");
        assert!(copy.headers().get(HOST).is_none());
        let plain = super::copy(&parts, &policy(false));
        assert_eq!(plain.headers()[HOST], "httpbin:8000");
    }

    #[test]
    fn the_copy_says_it_is_internal_and_where_it_came_from() {
        let local: IpAddr = "10.1.2.3".parse().expect("an address");
        let mut h = HeaderMap::new();
        internal(&mut h, local);
        assert_eq!(h["x-envoy-internal"], "true");
        assert_eq!(h[&X_FORWARDED_FOR], "10.1.2.3");
        let mut h = HeaderMap::new();
        h.insert(X_FORWARDED_FOR.clone(), HeaderValue::from_static("1.1.1.1"));
        internal(&mut h, local);
        assert_eq!(h[&X_FORWARDED_FOR], "1.1.1.1,10.1.2.3");
    }
}
