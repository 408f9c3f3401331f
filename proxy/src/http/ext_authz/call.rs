//! One request to the authorizer's cluster through the upstream layer (one attempt, the
//! cluster's balancing, transport and pool, as a mirror's copy goes), its whole response read.

use super::super::body::UpstreamBody;
use super::super::routed::{self, Routed, RoutedCluster};
use super::super::ConnContext;
use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt as _, Limited};
use std::time::Duration;

/// The most of an authorizer's response body read (a denial's body goes to the client):
/// past it the check fails.
const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// Why a check whose answer did not come within the filter's `timeout` failed.
const TIMED_OUT: &str = "the check timed out";

/// The authorizer's whole answer.
pub(super) struct Answer {
    pub head: http::response::Parts,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

/// Send `req` to `cluster`, its whole answer due within `timeout`; `Err` says why no whole
/// answer came.
pub(super) async fn call(
    ctx: &ConnContext,
    cluster: &str,
    req: Request<UpstreamBody>,
    timeout: Duration,
) -> Result<Answer, String> {
    let deadline = tokio::time::Instant::now() + timeout;
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
        internal: true,
        ..Routed::single_attempt(target)
    };
    // A failure or a timeout before the answer's head is charged to the cluster as Envoy's
    // client's router charges its own answer (the check is an internal request).
    let up = match tokio::time::timeout_at(deadline, routed::send(ctx, &routed, req)).await {
        Ok(Ok(up)) => {
            up.charge_answer(false);
            up
        }
        Ok(Err(e)) => {
            routed::charge_local_answer(&routed, e.kind);
            return Err(e.to_string());
        }
        Err(_) => {
            routed::timed_out(&routed);
            return Err(TIMED_OUT.into());
        }
    };
    let (head, body) = up.response.into_parts();
    let collected = Limited::new(body, MAX_RESPONSE_BYTES).collect();
    let collected = tokio::time::timeout_at(deadline, collected)
        .await
        .map_err(|_| TIMED_OUT.to_string())?
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
