//! Inbound requests before they go upstream: the path is normalised as Istio's
//! `pathNormalization` says (and the application receives the normalised path, as from Envoy),
//! then the authorization policies decide (Envoy's HTTP RBAC filter): the policy files', or
//! under xDS the `virtualInbound` chain's RBAC filters (those before an `ext_authz` filter:
//! the rest run in [`super::ext_authz`], after the external authorizer). A denied request is
//! answered `403 RBAC: access denied`.

use super::errors::ErrorKind;
use super::ConnContext;
use crate::authz::{path, Attributes, Request, Verdict};
use crate::metrics::rbac_filters::{ChainRbac, Filters};
use http::request::Parts;
use http::uri::{PathAndQuery, Uri};
use std::borrow::Cow;

/// Normalise the request's path and decide it; `Err` is the local reply to send instead, with
/// Envoy's `response_code_details` for a policy's denial.
pub(super) fn inbound(
    ctx: &ConnContext,
    parts: &mut Parts,
) -> Result<(), (ErrorKind, Option<Box<str>>)> {
    // istiod changed or removed the connection's chain: as Envoy drains such a chain's
    // connections, this request is decided as the connection started and the client told to
    // reconnect (HTTP/1.1 `Connection: close`), its next connection taking the chain in force.
    if ctx
        .chain_watch
        .as_ref()
        .is_some_and(crate::chain_drain::Watch::is_retired)
    {
        ctx.closing
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    normalize_path(parts, ctx.config.authorization.path_normalization).map_err(|k| (k, None))?;
    let authz = &ctx.proxy.authz;
    // Inbound by xDS: the chain's RBAC filters decide, and only they (the policy files are
    // the config file's way of saying the same, for when istiod does not).
    let xds_rbac = ctx.xds_inbound.as_ref().map(|chain| chain.http_rbac());
    if xds_rbac.is_none() && !authz.is_active() {
        return Ok(());
    }
    let attributes = attributes(ctx, parts);
    let verdict = match xds_rbac {
        Some(filters) => {
            // A chain without RBAC filters has no RBAC statistics (none are made for it).
            let mut filters = filters.peekable();
            let counts = filters.peek().and_then(|_| rbac_counts(ctx));
            authz.check_rbac(filters, &attributes, counts)
        }
        None => authz.check(&attributes),
    };
    match verdict {
        Verdict::Allowed => Ok(()),
        Verdict::Denied(details) => Err((ErrorKind::AccessDenied, Some(details.into()))),
    }
}

/// Inbound by xDS: the counters of the RBAC filters of the connection's chain (Envoy's
/// `http.<stat_prefix>.rbac.*`), looked up at its first request and kept for the next.
pub(super) fn rbac_counts(ctx: &ConnContext) -> Option<&ChainRbac> {
    let chain = ctx.xds_inbound.as_ref()?;
    let manager = chain.http_stat_prefix()?;
    Some(ctx.rbac_stats.get_or_init(|| {
        ChainRbac::resolve(
            &ctx.proxy.metrics.rbac_filters,
            Filters::Http(manager),
            chain.all_http_rbac(),
        )
    }))
}

/// What the policies see of an inbound request.
pub(super) fn attributes<'a>(ctx: &'a ConnContext, parts: &'a Parts) -> Attributes<'a> {
    let host = match parts.uri.authority() {
        Some(a) => Some(a.as_str()),
        None => parts
            .headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok()),
    };
    Attributes {
        source: ctx.peer,
        destination: ctx.key.destination,
        principal: ctx
            .mesh_peer
            .as_ref()
            .and_then(|(peer, _)| peer.spiffe_id.as_ref())
            .map(crate::identity::SpiffeId::as_str),
        peer: ctx.mesh_peer.as_ref().map(|(peer, _)| &**peer),
        sni: ctx.sni.as_deref(),
        request: Some(Request {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            query: parts.uri.query(),
            host,
            headers: &parts.headers,
        }),
    }
}

/// Normalise the request's path as `mode` says; `Err` is the local reply (Envoy's 400
/// `path_normalization_failed`) to send instead.
pub(super) fn normalize_path(
    parts: &mut Parts,
    mode: remora_config::PathNormalization,
) -> Result<(), ErrorKind> {
    const UNNORMALIZABLE: ErrorKind = ErrorKind::UnnormalizablePath;
    if let Some(pq) = parts.uri.path_and_query() {
        let normalized = path::normalize(pq.as_str(), mode).map_err(|_| UNNORMALIZABLE)?;
        if let Cow::Owned(new) = normalized {
            let pq = PathAndQuery::try_from(new).map_err(|_| UNNORMALIZABLE)?;
            let mut uri = std::mem::take(&mut parts.uri).into_parts();
            uri.path_and_query = Some(pq);
            parts.uri = Uri::from_parts(uri).map_err(|_| UNNORMALIZABLE)?;
        }
    }
    Ok(())
}
