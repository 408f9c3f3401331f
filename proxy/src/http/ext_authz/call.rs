//! One request to the authorizer's cluster through the upstream layer (one attempt, the
//! cluster's balancing, transport and pool, as a mirror's copy goes), its whole response read.

use super::super::body::UpstreamBody;
use super::super::routed::{self, Routed, RoutedCluster};
use super::super::ConnContext;
use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt as _, Limited};

/// The most of an authorizer's response body read (a denial's body goes to the client):
/// past it the check fails.
const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// The authorizer's whole answer.
pub(super) struct Answer {
    pub head: http::response::Parts,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

/// Send `req` to `cluster`; `Err` says why no whole answer came.
pub(super) async fn call(
    ctx: &ConnContext,
    cluster: &str,
    req: Request<UpstreamBody>,
) -> Result<Answer, String> {
    let Some(store) = &ctx.proxy.xds else {
        return Err("no xDS configuration".into());
    };
    let generation = store.generation();
    let snapshot = store.current();
    // Envoy fails the check when the cluster is gone (a CDS removal).
    let Some(model) = snapshot.cluster(cluster) else {
        return Err(format!("cluster {cluster:?} does not exist"));
    };
    let target = RoutedCluster::resolve(ctx, &snapshot, model, generation);
    let routed = Routed {
        own_request: true,
        ..Routed::single_attempt(target)
    };
    let up = routed::send(ctx, &routed, req)
        .await
        .map_err(|e| e.to_string())?;
    let (head, body) = up.response.into_parts();
    let collected = Limited::new(body, MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?;
    if let Some((key, sender)) = up.pooled {
        let http = &ctx.config.http;
        ctx.proxy.pool.checkin(
            key,
            sender,
            up.pool_idle_timeout.unwrap_or(http.pool_idle_timeout),
            http.pool_max_idle_per_upstream,
        );
    }
    drop(up.in_flight);
    let trailers = collected.trailers().cloned();
    Ok(Answer {
        head,
        body: collected.to_bytes(),
        trailers,
    })
}
