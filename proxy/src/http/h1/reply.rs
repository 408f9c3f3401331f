//! The bytes of a response the fast path writes itself, shaped as Envoy's local replies and
//! as hyper's path writes them: status line, a content type only with a body, its length,
//! the date, the chain's `server` header, `connection: close` when the connection ends.

use super::itoa_u32;
use crate::http::ConnContext;
use http::StatusCode;
use std::time::SystemTime;

/// A response of `status` with `body`; `typed`: it says `content-type: text/plain`; `keep`:
/// the connection takes another request after it.
pub(super) fn bytes(
    ctx: &ConnContext,
    status: StatusCode,
    body: &str,
    typed: bool,
    keep: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(160 + body.len());
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    if typed {
        out.extend_from_slice(b"\r\ncontent-type: text/plain");
    }
    out.extend_from_slice(b"\r\ncontent-length: ");
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(itoa_u32(len, &mut [0u8; 10]).as_bytes());
    // Caches and clients date a response by it.
    out.extend_from_slice(b"\r\ndate: ");
    out.extend_from_slice(httpdate::fmt_http_date(SystemTime::now()).as_bytes());
    if let Some(server) = &ctx.xds_chain.server {
        out.extend_from_slice(b"\r\nserver: ");
        out.extend_from_slice(server.as_bytes());
    }
    if !keep {
        out.extend_from_slice(b"\r\nconnection: close");
    }
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(body.as_bytes());
    out
}
