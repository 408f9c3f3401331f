//! A request head the HTTP/1.1 codec refuses, answered as Envoy's codec answers it: 400 for
//! a malformed head, 431 for one over the limits, the status's text as the body, the
//! connection closed; logged with Envoy's words for it (`%RESPONSE_CODE_DETAILS%`):
//! `http1.codec_error`, `http1.invalid_characters`, `http1.headers_too_large`,
//! `http1.too_many_headers`. The fast path answers a head it read whole ([`answer`]); one it
//! never saw whole hyper refuses, without a body, and tells only that it did not parse or was
//! too large ([`from_hyper`]).

use super::head::{Limits, MAX_REQUEST_HEADERS};
use super::{write_out, Client};
use crate::http::errors::Flags;
use crate::http::ConnContext;
use http::StatusCode;
use std::sync::Arc;

/// The details for the head at the start of `buf`, when it is one hyper will refuse (`None`
/// for a head that parses within the limits, or that is not all here and not yet too large).
pub fn details(buf: &[u8], limits: &Limits) -> Option<&'static str> {
    // One more slot than the limits allow, to tell a head with too many headers.
    let mut headers = [httparse::EMPTY_HEADER; MAX_REQUEST_HEADERS + 1];
    let mut req = httparse::Request::new(&mut headers);
    // As hyper's path is configured (`http::serve`): a head it serves is never refused here.
    let mut config = httparse::ParserConfig::default();
    config.allow_multiple_spaces_in_request_line_delimiters(true);
    match config.parse_request(&mut req, buf) {
        Ok(httparse::Status::Complete(len)) if len > limits.max_header_bytes => {
            Some(HEADERS_TOO_LARGE)
        }
        Ok(httparse::Status::Complete(_)) if req.headers.len() > limits.max_headers => {
            Some(TOO_MANY_HEADERS)
        }
        Ok(httparse::Status::Complete(_)) => None,
        Ok(httparse::Status::Partial) if buf.len() > limits.max_header_bytes => {
            Some(HEADERS_TOO_LARGE)
        }
        Ok(httparse::Status::Partial) => None,
        Err(httparse::Error::TooManyHeaders) => Some(TOO_MANY_HEADERS),
        // A byte no header value may hold (a control character).
        Err(httparse::Error::HeaderValue) => Some(INVALID_CHARACTERS),
        Err(_) => Some(CODEC_ERROR),
    }
}

/// The details for a head hyper refused with `e`, when the bytes were not seen: too large,
/// or otherwise unparsable.
pub fn from_hyper(e: &hyper::Error) -> Option<&'static str> {
    if e.is_parse_too_large() {
        Some(HEADERS_TOO_LARGE)
    } else if e.is_parse() {
        Some(CODEC_ERROR)
    } else {
        None
    }
}

/// Answer the refused head at the start of the connection's bytes (`details`: Envoy's words
/// for it, from [`details`]), record it, and leave the connection to be closed.
pub async fn answer<C: Client>(ctx: &Arc<ConnContext>, client: &mut C, details: &'static str) {
    let status = status_of(details);
    let body = status.canonical_reason().unwrap_or("");
    let out = super::reply::bytes(ctx, status, body, true, false);
    let sent = match write_out(client, &out).await {
        Ok(()) => {
            ctx.count_sent(out.len());
            body.len() as u64
        }
        Err(_) => 0,
    };
    crate::http::replies::record_unparsed(ctx, status.as_u16(), Flags::DPE, Some(details), sent);
}

/// Envoy's status for a head refused with `details`: over the limits 431, else 400.
fn status_of(details: &str) -> StatusCode {
    match details {
        HEADERS_TOO_LARGE | TOO_MANY_HEADERS => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        _ => StatusCode::BAD_REQUEST,
    }
}

const CODEC_ERROR: &str = "http1.codec_error";
const INVALID_CHARACTERS: &str = "http1.invalid_characters";
const HEADERS_TOO_LARGE: &str = "http1.headers_too_large";
const TOO_MANY_HEADERS: &str = "http1.too_many_headers";

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_header_bytes: 1024,
            max_headers: 4,
            drop_client_cert: false,
            mesh_tls: false,
            drop_attempt_count: false,
        }
    }

    #[test]
    fn each_refused_head_gets_envoys_words() {
        let many: String = (0..5).map(|i| format!("x{i}: a\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
        let large = format!("GET / HTTP/1.1\r\nx: {}\r\n\r\n", "a".repeat(1100));
        let partial_large = format!("GET / HTTP/1.1\r\nx: {}", "a".repeat(1100));
        for (head, want) in [
            ("GET / HTTP/1.1\r\nHost: a\r\n\r\n", None),
            ("GET / HTTP/1.1\r\nHost: a\r\n", None),
            ("GET /a  HTTP/1.1\r\nHost: a\r\n\r\n", None),
            ("GET / HTTP/1.1\r\nfoo bar\r\n\r\n", Some(CODEC_ERROR)),
            ("GE(T / HTTP/1.1\r\n\r\n", Some(CODEC_ERROR)),
            (
                "GET / HTTP/1.1\r\nx: a\x01b\r\n\r\n",
                Some(INVALID_CHARACTERS),
            ),
            (many.as_str(), Some(TOO_MANY_HEADERS)),
            (large.as_str(), Some(HEADERS_TOO_LARGE)),
            (partial_large.as_str(), Some(HEADERS_TOO_LARGE)),
        ] {
            assert_eq!(details(head.as_bytes(), &limits()), want, "{head:?}");
        }
        // More headers than any limit allows.
        let lots: String = (0..MAX_REQUEST_HEADERS + 2)
            .map(|i| format!("x{i}: a\r\n"))
            .collect();
        let lots = format!("GET / HTTP/1.1\r\n{lots}\r\n");
        let wide = Limits {
            max_header_bytes: 1 << 20,
            max_headers: MAX_REQUEST_HEADERS,
            ..limits()
        };
        assert_eq!(details(lots.as_bytes(), &wide), Some(TOO_MANY_HEADERS));
    }
}
