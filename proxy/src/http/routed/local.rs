//! What a routed request answered here gets: Envoy's local replies for a route that does not
//! forward (a direct response, a redirect), for a request the decision refused, and for
//! HTTP/1.0 where the connection manager takes none.

use super::edits::local_edits;
use super::{header_format, Answer};
use crate::http::body::{RequestEnd, ResponseBody};
use crate::http::errors::ErrorKind;
use crate::route::rewrite::{self, RedirectRequest};
use crate::route::HttpDecision;
use bytes::Bytes;
use http::header::HeaderValue;
use http::Response;
use remora_xds::model::route::RouteConfiguration;

/// What a request that is not forwarded gets.
pub(in crate::http) fn answer(
    table: &RouteConfiguration,
    decision: HttpDecision<'_>,
    req: RedirectRequest<'_>,
    format: &header_format::Request<'_>,
) -> Answer {
    match decision {
        HttpDecision::NoRoute | HttpDecision::NoRouteTable | HttpDecision::Forward { .. } => {
            Answer::Error(ErrorKind::NoRoute)
        }
        HttpDecision::DirectResponse {
            status,
            body,
            route,
            vhost,
        } => Answer::Local {
            status,
            body: body.map(str::to_string),
            location: None,
            edits: local_edits(table, vhost, route, format),
            fault: route.fault.clone(),
            // Envoy's cors filter acts only on routes that forward.
            cors_origin: None,
        },
        HttpDecision::Redirect {
            redirect,
            route,
            vhost,
        } => Answer::Local {
            status: redirect.status,
            body: None,
            location: Some(rewrite::redirect_location(
                redirect,
                &route.matcher.path,
                req,
            )),
            edits: local_edits(table, vhost, route, format),
            fault: route.fault.clone(),
            // Envoy's cors filter acts only on routes that forward.
            cors_origin: None,
        },
    }
}

/// The answer to a request the xDS route decision answers itself.
pub(in crate::http) fn reply(
    answer: Answer,
    grpc: bool,
    mut end: RequestEnd,
) -> Response<ResponseBody> {
    let (status, body, location, edits, details) = match answer {
        Answer::Error(kind) => return crate::http::replies::local_reply(kind, grpc, end),
        // Never given by `decide`, which has the parts.
        Answer::Handover => {
            return crate::http::replies::local_reply(ErrorKind::NoRoute, grpc, end)
        }
        Answer::Local {
            status,
            body,
            location,
            edits,
            ..
        } => (status, body, location, edits, "direct_response"),
        Answer::Preflight { headers, .. } => (200, None, None, headers, "cors_response"),
        Answer::UpgradeRefused { edits } => (403, None, None, edits, "upgrade_failed"),
    };
    // An HTTP/1.1 connection that asked to switch protocols and was refused is not used
    // again, as Envoy's codec has it.
    let close =
        details == "upgrade_failed" && end.conn.key.version == crate::detect::HttpVersion::Http1;
    end.status = status;
    if let Some(log) = &mut end.log {
        log.status = status;
        log.envoy.details = Some(details);
    }
    let mut builder = Response::builder().status(status);
    if let Some(location) = location.and_then(|l| HeaderValue::try_from(l).ok()) {
        builder = builder.header(http::header::LOCATION, location);
    }
    let body = Bytes::from(body.unwrap_or_default());
    if !body.is_empty() {
        // Envoy's direct responses say what their body is.
        builder = builder.header(http::header::CONTENT_TYPE, "text/plain");
    }
    match builder.body(()) {
        Ok(mut r) => {
            edits.apply(r.headers_mut());
            if close {
                r.headers_mut()
                    .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
            }
            r.map(|()| ResponseBody::local(body, end))
        }
        // A status outside 100..=999 from the route: Envoy would have refused the table.
        Err(_) => Response::new(ResponseBody::local(Bytes::new(), end)),
    }
}
