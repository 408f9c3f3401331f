//! The cors filter's part in a routed request: what it does to a forwarded request of a route
//! with a CORS policy, and its counts of the origins it judged.

use super::Answer;
use crate::http::ConnContext;
use http::request::Parts;
use remora_xds::model::cors::{CorsOutcome, CorsRequest};

/// Count the cors filter's judgement of a request's origin, as Envoy's filter counts it
/// (`http.<stat_prefix>.cors.origin_valid`, `origin_invalid`).
pub fn count_cors(ctx: &ConnContext, origin_valid: Option<bool>) {
    if let (Some(valid), Some(prefix)) = (origin_valid, ctx.xds_chain.cors_stats()) {
        ctx.proxy.metrics.cors.of(prefix).count(valid);
    }
}

/// What the chain's cors filter does to a forwarded request of `route` (Envoy's filter acts
/// only on routes that forward): nothing for nearly every request. The HTTP/1.1 fast path,
/// which gives no `parts`, hands a route with a CORS policy over to hyper's path.
pub(super) fn cors_outcome(
    ctx: &ConnContext,
    route: &remora_xds::model::route::Route,
    parts: Option<&Parts>,
) -> Result<(CorsOutcome, Option<bool>), Answer> {
    let Some(cors) = route.cors.as_ref().filter(|_| ctx.xds_chain.cors_filter) else {
        return Ok((CorsOutcome::Pass, None));
    };
    let Some(parts) = parts else {
        return Err(Answer::Handover);
    };
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let req = CorsRequest {
        method: parts.method.as_str(),
        origin: header("origin"),
        request_method: header("access-control-request-method"),
        request_headers: header("access-control-request-headers"),
        request_private_network: header("access-control-request-private-network"),
    };
    Ok(cors.evaluate_origin(&req, fastrand::u64(..)))
}
