//! Request mirroring (a route's `request_mirror_policies`, Istio's VirtualService `mirror` /
//! `mirrors`), as Envoy's router shadows requests: for each policy whose fraction the request
//! falls in, a copy goes to the policy's cluster with `-shadow` inserted before the port of
//! its authority, through the same upstream layer as a normal attempt (endpoint selection,
//! circuit breakers, pooled connections), in a task of its own. Its response is read and
//! discarded; the original request never waits for it and never sees its failure.
//!
//! Bounds: at most [`MAX_SHADOWS`] copies in flight per proxy (more are dropped and counted),
//! each within the route's timeout or [`SHADOW_TIMEOUT`] when the route has none. Bodies: a
//! request whose body is empty (GET, HEAD, DELETE… as the head arrives) is mirrored whole; one
//! with a body is not mirrored and counted (`remora_mirror_requests_body_skipped`), so the
//! original's body is never held back or buffered for its copy (Envoy streams a copy; Remora
//! does not yet).

use super::body::UpstreamBody;
use super::ConnContext;
use http::header::{HeaderMap, HeaderName, HeaderValue, HOST};
use http::request::Parts;
use http::Request;
use http_body_util::BodyExt as _;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use remora_xds::model::cluster::Cluster;
use remora_xds::model::route::MirrorPolicy;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
    /// Copies not sent: the request has a body.
    pub body_skipped: Counter,
    /// Copies not sent: the mirror cluster is not in the snapshot.
    pub no_cluster: Counter,
    /// Copies that got no response (no endpoint, connect failure, reset, timeout).
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
                "remora_mirror_requests_body_skipped",
                "Requests with a body that a mirror policy would have copied (bodies are not mirrored)",
                &stats.body_skipped,
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

/// Send the copies of a request (its head as it goes upstream, `empty_body`: it has no
/// body) that `policies` ask for, each in a task of its own; returns at once.
pub(super) fn shadow(
    ctx: &Arc<ConnContext>,
    policies: &[MirrorPolicy],
    parts: &Parts,
    empty_body: bool,
    timeout: Option<Duration>,
) {
    let stats = &ctx.proxy.metrics.mirror;
    for policy in policies {
        if !policy.fraction.hits(fastrand::u64(..)) {
            continue;
        }
        if !empty_body {
            stats.body_skipped.inc();
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
        let slot = Slot(Arc::clone(ctx));
        let limit = timeout.unwrap_or(SHADOW_TIMEOUT);
        tokio::spawn(async move {
            let ok = tokio::time::timeout(limit, send(&slot.0, cluster, req))
                .await
                .unwrap_or(false);
            if !ok {
                slot.0.proxy.metrics.mirror.failed.inc();
            }
        });
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
    let routed = super::routed::Routed {
        metrics_peer: ctx.proxy.upstreams.service_peer(&cluster),
        cluster,
        timeout: None,
        grpc_timeout_header_max: None,
        max_stream_duration: None,
        retries: 0,
        retry_503: false,
        retry: super::retry_policy::RetryRules::default(),
        fault: None,
        attempt_count: false,
        avoid_previous: None,
        tried: std::sync::Mutex::default(),
        response_edits: super::routed::Edits::default(),
        mirrors: None,
    };
    let up = match super::routed::send(ctx, &routed, req).await {
        Ok(up) => up,
        Err(e) => {
            tracing::debug!(cluster = %routed.cluster.name, error = %e, "shadow request failed");
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
