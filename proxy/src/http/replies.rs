//! What the proxy answers itself on hyper's path, instead of the upstream: a local reply
//! with Envoy's status, flag and text (a trailers-only response for gRPC clients), and the
//! record of a request head hyper refused before it became a request.

use super::access_log::RequestLog;
use super::body::{RequestEnd, ResponseBody};
use super::errors::{ErrorKind, Flags};
use super::headers::{GRPC_MESSAGE, GRPC_STATUS};
use super::ConnContext;
use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION, CONTENT_TYPE};
use http::{Response, StatusCode};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

/// Record a request head that never became a request, as Envoy records a codec error: one
/// access-log line without method or path, and one request in the metrics. hyper answered a
/// malformed head 400 and one over the limits 431 itself (`DPE` both: a head the fast path
/// read whole it answers itself, [`super::h1::refused::answer`]); a head that did not arrive
/// within `http.header_read_timeout` was answered 408 by the downstream IO.
pub fn record_refused_head(ctx: &Arc<ConnContext>, e: &hyper::Error) {
    let (status, flags) = if e.is_parse_too_large() {
        (431, Flags::DPE)
    } else if e.is_parse() {
        (400, Flags::DPE)
    } else if header_timeout_answered(e) {
        (408, Flags::default())
    } else {
        return;
    };
    // Envoy's codec's words for what it refused (its 408 for a slow head is not known here:
    // `docs/xds.md`).
    let details = (status != 408)
        .then(|| super::h1::refused::from_hyper(e))
        .flatten();
    record_unparsed(ctx, status, flags, details, 0);
}

/// What Envoy's HTTP/1.1 codec answers itself on a connection manager, before the request
/// reaches any filter: an HTTP/1.0 request (426, `low_version`; `accept_http_10`, which
/// Remora does not read, is refused), a length beside chunked (400,
/// `http1.content_length_and_chunked_not_allowed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodecRefusal {
    Http10,
    LengthAndChunked,
}

/// The codec's answer to `why`: the status's text, the connection closed, flag `DPE`, logged
/// as a head that never became a request (`"- - HTTP/1.1"`) with the codec's details.
pub fn codec_refusal(why: CodecRefusal, mut end: RequestEnd) -> Response<ResponseBody> {
    let (status, details) = match why {
        CodecRefusal::Http10 => (StatusCode::UPGRADE_REQUIRED, "low_version"),
        CodecRefusal::LengthAndChunked => (
            StatusCode::BAD_REQUEST,
            "http1.content_length_and_chunked_not_allowed",
        ),
    };
    if end.conn.logging() {
        let start = (SystemTime::now(), end.started);
        let mut unparsed = RequestLog::unparsed(start, status.as_u16());
        unparsed.envoy.details = Some(details);
        end.log = Some(Box::new(unparsed));
    }
    end.flags.insert(Flags::DPE);
    end.status = status.as_u16();
    let body = Bytes::from_static(status.canonical_reason().unwrap_or("").as_bytes());
    let mut r = Response::new(ResponseBody::local(body, end));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Record a request head answered `status` before it became a request (`sent`: the bytes of
/// the reply's body), with Envoy's `details` for it.
pub fn record_unparsed(
    ctx: &Arc<ConnContext>,
    status: u16,
    flags: Flags,
    details: Option<&'static str>,
    sent: u64,
) {
    let started = Instant::now();
    let log = ctx
        .logging()
        .then(|| Box::new(RequestLog::unparsed((SystemTime::now(), started), status)));
    let mut end = RequestEnd::new(Arc::clone(ctx), log, false, started);
    end.status = status;
    end.flags = flags;
    end.sent = sent;
    if let Some(log) = end.log.as_mut() {
        log.envoy.details = details;
    }
    // Answered in full; dropping `end` records it.
    end.complete = true;
}

/// Whether the connection ended with the downstream IO's 408 for a slow request head.
fn header_timeout_answered(e: &hyper::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    // Source chains are short; the bound only guards against a cycle.
    for _ in 0..8 {
        let Some(c) = cause else {
            return false;
        };
        // An io::Error's `source` skips the error it wraps: look inside it instead.
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return io
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<super::io::HeaderReadTimeout>())
                .is_some_and(|t| t.answered);
        }
        cause = c.source();
    }
    false
}

/// A reply written by the proxy. gRPC clients get a trailers-only response (HTTP 200 with
/// `grpc-status`), which every gRPC library reads as the call's status; others get Envoy's
/// status and text. A malformed request also closes the connection, as Envoy does.
pub(in crate::http) fn local_reply(
    kind: ErrorKind,
    grpc: bool,
    mut end: RequestEnd,
) -> Response<ResponseBody> {
    let mut builder = Response::builder();
    let body = if grpc {
        builder = builder
            .status(StatusCode::OK)
            .header(CONTENT_TYPE, "application/grpc")
            .header(
                &GRPC_STATUS,
                HeaderValue::from(u16::from(kind.grpc_status())),
            )
            .header(&GRPC_MESSAGE, HeaderValue::from_static(kind.details()));
        Bytes::new()
    } else {
        builder = builder.status(kind.status());
        // As Envoy's local replies: a content type only with a body.
        if !kind.body().is_empty() {
            builder = builder.header(CONTENT_TYPE, "text/plain");
        }
        match kind.reply_body(end.flags.contains(Flags::URX)) {
            std::borrow::Cow::Borrowed(b) => Bytes::from_static(b.as_bytes()),
            std::borrow::Cow::Owned(b) => Bytes::from(b),
        }
    };
    if matches!(
        kind,
        ErrorKind::MalformedRequest(_) | ErrorKind::UnnormalizablePath
    ) || end.conn.closing()
    {
        builder = builder.header(CONNECTION, "close");
    }
    end.flags.insert(kind.flag());
    end.status = match kind {
        ErrorKind::DownstreamAborted => 0,
        _ if grpc => 200,
        _ => kind.status().as_u16(),
    };
    end.grpc_status = grpc.then(|| u32::from(kind.grpc_status()));
    if let Some(log) = &mut end.log {
        log.status = end.status;
        log.envoy.details = kind.code_details();
    }
    match builder.body(()) {
        Ok(r) => r.map(|()| ResponseBody::local(body, end)),
        // Every header above is a valid constant; this is unreachable in practice.
        Err(_) => Response::new(ResponseBody::local(body, end)),
    }
}
