//! The fast path's route decision on a connection routed by xDS: hyper's path's own
//! ([`routed::decide_request`]), with what the fast path can serve of it.

use super::head;
use crate::http::errors::ErrorKind;
use crate::http::routed::{self, Answer, Routed};
use crate::http::ConnContext;

/// The route decision ([`routed::decide_request`], hyper's path's own) for a request on a
/// connection routed by xDS: its cluster, or the error it is answered with; `None` when
/// hyper should serve it: the route edits headers or the path (this path forwards heads as
/// received), answers with a direct response or a redirect, its cluster's upstream is not
/// plain pooled HTTP/1.1 ([`routed::Decided::fits_fast_path`]), or the client sent its own
/// `x-envoy-attempt-count` that hyper's path would keep (the virtual host asks for none). (A
/// client's `x-envoy-expected-rq-timeout-ms`, an internal header, never reaches here: the
/// head parser hands such requests over.)
pub(super) fn route(
    ctx: &ConnContext,
    routes: &remora_xds::model::listener::RouteSource,
    buf: &[u8],
    head: &head::RequestHead<'_>,
) -> Option<Result<Routed, ErrorKind>> {
    // Checked for UTF-8 by the route decision, only when it is not the connection's last.
    let host = head.host?;
    // The usual methods without a UTF-8 check (httparse took only token bytes).
    let method = match head.method {
        b"GET" => "GET",
        b"POST" => "POST",
        b"PUT" => "PUT",
        b"DELETE" => "DELETE",
        b"PATCH" => "PATCH",
        b"HEAD" => "HEAD",
        b"OPTIONS" => "OPTIONS",
        other => std::str::from_utf8(other).ok()?,
    };
    let header = |name: &str| match name {
        ":authority" => std::str::from_utf8(host).ok(),
        ":method" => Some(method),
        ":path" => Some(head.target),
        _ => head::header_value(buf, head.len, name),
    };
    let values = |name: &str, visit: &mut dyn FnMut(&str) -> bool| match name {
        ":authority" | ":method" | ":path" => header(name).is_some_and(&mut *visit),
        _ => head::header_values(buf, head.len, name).any(visit),
    };
    let req = remora_xds::model::route::RequestParts {
        method,
        path_and_query: head.target,
        header: &header,
        values: &values,
    };
    match routed::decide_request(ctx, routes, host, &req, None, fastrand::u64(..)) {
        Ok(decided) if decided.fits_fast_path() => {
            let routed = decided.routed;
            // The head loses a client's own count (hyper's path keeps it when the virtual
            // host asks for none).
            let own_count = head.attempt_count && !routed.attempt_count;
            (!own_count).then_some(Ok(routed))
        }
        Ok(_)
        | Err(
            Answer::Local { .. }
            | Answer::Preflight { .. }
            | Answer::UpgradeRefused { .. }
            | Answer::Handover,
        ) => None,
        Err(Answer::Error(kind)) => Some(Err(kind)),
    }
}
