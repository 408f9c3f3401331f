//! HTTP/1.1 heads as the fast path sees them: parsed in place with `httparse`, judged (is this a
//! plain request the fast path serves, or one for hyper?), and written for the next hop by
//! copying the received bytes minus the hop-by-hop lines plus the mesh's own headers. Nothing
//! here allocates for a head that needs no rewriting beyond the additions.

use memchr::memchr;
use std::mem::MaybeUninit;

/// Request headers looked at, at most: more goes to hyper, which answers 431 past
/// `http.max_headers`.
pub const MAX_REQUEST_HEADERS: usize = 100;
/// Response headers accepted, as hyper's client accepts (100); more is a protocol error.
pub const MAX_RESPONSE_HEADERS: usize = 100;
/// Largest response head: as on hyper's path, whose client reads at most
/// [`crate::http::pool::UPSTREAM_H1_BUFFER`] before giving up (Envoy's default is 60 KiB).
pub const MAX_RESPONSE_HEAD: usize = crate::http::pool::UPSTREAM_H1_BUFFER;

/// What the request's side of the proxy needs to know to judge a head.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// Inbound: a client's `x-forwarded-client-cert` is dropped (plaintext cannot vouch for it).
    pub drop_client_cert: bool,
    /// Mesh TLS was terminated: a client's `x-forwarded-client-cert` is kept and ours appended
    /// to it, which hyper's path does.
    pub mesh_tls: bool,
    /// Retries are on: the client's `x-envoy-attempt-count` is replaced by ours.
    pub drop_attempt_count: bool,
}

/// A byte range of the buffer: a header line, end of line included.
type Span = (usize, usize);
/// Request lines dropped at most (Connection, the headers it names, the mesh's own); a head
/// with more goes to hyper.
const MAX_DROPPED: usize = 10;
/// Headers a request's Connection may name at most, for the fast path to serve it.
const MAX_NOMINATED: usize = 4;

/// A request head the fast path serves. Borrowed values point into the read buffer.
#[derive(Debug)]
pub struct RequestHead<'a> {
    /// Bytes of the head, blank line included.
    pub len: usize,
    pub method: &'a [u8],
    pub target: &'a str,
    pub content_length: u64,
    /// The client asked to close after this request.
    pub close: bool,
    pub host: Option<&'a [u8]>,
    pub user_agent: Option<&'a [u8]>,
    pub request_id: Option<&'a [u8]>,
    pub forwarded_for: Option<&'a [u8]>,
    pub forwarded_proto: bool,
    /// Inbound: the client sidecar's `x-envoy-peer-metadata` value (its line is not forwarded).
    pub peer_metadata: Option<&'a [u8]>,
    /// Inbound: the client sidecar sent `x-envoy-peer-metadata-id` (not forwarded).
    pub peer_metadata_id: bool,
    /// The client sent `x-envoy-attempt-count` (dropped when retries are on).
    pub attempt_count: bool,
    /// Lines not forwarded, in order.
    dropped: [Span; MAX_DROPPED],
    n_dropped: usize,
}

impl RequestHead<'_> {
    /// Leave out the line that header `name` (a slice of `buf`) starts; `None` when too many
    /// lines are left out for the fast path.
    fn drop_line(&mut self, buf: &[u8], name: &[u8]) -> Option<()> {
        let slot = self.dropped.get_mut(self.n_dropped)?;
        *slot = line_span(buf, name)?;
        self.n_dropped += 1;
        Some(())
    }

    /// Whether the method has no response body whatever the response's framing says.
    pub fn is_head(&self) -> bool {
        self.method == b"HEAD"
    }

    /// Whether sending it again is harmless (RFC 9110 §9.2.2), for a request without a body.
    pub fn idempotent(&self) -> bool {
        self.content_length == 0 && matches!(self.method, b"GET" | b"HEAD" | b"OPTIONS" | b"TRACE")
    }

    /// The head for the upstream: received lines minus dropped ones, then `extra` header lines,
    /// then the blank line.
    pub fn write_upstream(&self, buf: &[u8], extra: &[&[u8]], out: &mut Vec<u8>) {
        copy_without(buf, self.len, &self.dropped[..self.n_dropped], out);
        for e in extra {
            out.extend_from_slice(e);
        }
        out.extend_from_slice(b"\r\n");
    }
}

/// Whether the limits are an inbound connection's (plaintext, or mesh TLS terminated).
fn inbound(limits: &Limits) -> bool {
    limits.drop_client_cert || limits.mesh_tls
}

/// Parse a request head at the start of `buf`; `None` when the fast path does not serve it
/// (not all here yet, malformed, or a shape hyper handles): the connection goes to hyper.
pub fn parse_request<'a>(buf: &'a [u8], limits: &Limits) -> Option<RequestHead<'a>> {
    // Slots httparse fills as it parses: left uninitialised, as 3.2 KiB of empty headers
    // written per request cost more than the parse of a typical head.
    let mut headers = [const { MaybeUninit::<httparse::Header>::uninit() }; MAX_REQUEST_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut headers) {
        Ok(httparse::Status::Complete(len)) => len,
        _ => return None,
    };
    if req.version != Some(1)
        || len > limits.max_header_bytes
        || req.headers.len() > limits.max_headers
        || !ends_with_crlf(buf, len)
    {
        return None;
    }
    let target = req.path?;
    // Origin form only: CONNECT, `*` and absolute forms are hyper's. A fragment too (rare):
    // hyper's URI drops it, as Envoy under Istio's bootstrap strips it (`http::framing`).
    if !target.starts_with('/') || memchr(b'#', target.as_bytes()).is_some() {
        return None;
    }
    let mut head = RequestHead {
        len,
        method: req.method?.as_bytes(),
        target,
        content_length: 0,
        close: false,
        host: None,
        user_agent: None,
        request_id: None,
        forwarded_for: None,
        forwarded_proto: false,
        peer_metadata: None,
        peer_metadata_id: false,
        attempt_count: false,
        dropped: [(0, 0); MAX_DROPPED],
        n_dropped: 0,
    };
    let mut content_length = None;
    let mut nominated: [&[u8]; MAX_NOMINATED] = [b""; MAX_NOMINATED];
    let mut n_nominated = 0;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        let value = h.value;
        let drop = match name.len() {
            4 if name.eq_ignore_ascii_case(b"host") => {
                // Two are a 400, which the general path answers.
                if head.host.replace(value).is_some() {
                    return None;
                }
                false
            }
            10 if name.eq_ignore_ascii_case(b"user-agent") => {
                head.user_agent = Some(value);
                false
            }
            10 if name.eq_ignore_ascii_case(b"connection") => {
                for token in tokens(value) {
                    if token.eq_ignore_ascii_case(b"close") {
                        head.close = true;
                    } else if token.eq_ignore_ascii_case(b"upgrade") || n_nominated == MAX_NOMINATED
                    {
                        return None;
                    } else if !token.eq_ignore_ascii_case(b"keep-alive") {
                        // Named as hop-by-hop: dropped below, unless the mesh relies on it.
                        if !token.eq_ignore_ascii_case(b"host")
                            && !token.eq_ignore_ascii_case(b"content-length")
                        {
                            nominated[n_nominated] = token;
                            n_nominated += 1;
                        }
                    }
                }
                true
            }
            12 if name.eq_ignore_ascii_case(b"x-request-id") => {
                head.request_id = Some(value);
                false
            }
            12 if name.eq_ignore_ascii_case(b"content-type") => {
                // gRPC over HTTP/1.1 counts messages: the general path does.
                if value.starts_with(b"application/grpc") {
                    return None;
                }
                false
            }
            14 if name.eq_ignore_ascii_case(b"content-length") => {
                if content_length.is_some() {
                    return None;
                }
                content_length = Some(parse_length(value)?);
                false
            }
            15 if name.eq_ignore_ascii_case(b"x-forwarded-for") => {
                head.forwarded_for = Some(value);
                false
            }
            17 if name.eq_ignore_ascii_case(b"x-forwarded-proto") => {
                head.forwarded_proto = true;
                false
            }
            21 if name.eq_ignore_ascii_case(b"x-envoy-attempt-count") => {
                head.attempt_count = true;
                limits.drop_attempt_count
            }
            // Inbound, a client sidecar's metadata headers are ours: read, and not forwarded.
            21 if inbound(limits) && name.eq_ignore_ascii_case(b"x-envoy-peer-metadata") => {
                if head.peer_metadata.replace(value).is_some() {
                    return None;
                }
                true
            }
            24 if inbound(limits) && name.eq_ignore_ascii_case(b"x-envoy-peer-metadata-id") => {
                head.peer_metadata_id = true;
                true
            }
            23 if name.eq_ignore_ascii_case(b"x-forwarded-client-cert") => {
                if limits.mesh_tls {
                    return None;
                }
                limits.drop_client_cert
            }
            _ if is_handed_off(name) => return None,
            _ => false,
        };
        if drop {
            head.drop_line(buf, name)?;
        }
    }
    if n_nominated > 0 {
        // A second pass: Connection may come after the headers it names. Lines are dropped in
        // the order they came, so the pass rebuilds the whole list.
        head.n_dropped = 0;
        for h in req.headers.iter() {
            let name = h.name.as_bytes();
            let mesh = (limits.drop_attempt_count
                && name.eq_ignore_ascii_case(b"x-envoy-attempt-count"))
                || (limits.drop_client_cert
                    && name.eq_ignore_ascii_case(b"x-forwarded-client-cert"))
                || (inbound(limits)
                    && (name.eq_ignore_ascii_case(b"x-envoy-peer-metadata")
                        || name.eq_ignore_ascii_case(b"x-envoy-peer-metadata-id")));
            if mesh
                || name.eq_ignore_ascii_case(b"connection")
                || nominated[..n_nominated]
                    .iter()
                    .any(|n| name.eq_ignore_ascii_case(n))
            {
                head.drop_line(buf, name)?;
            }
        }
        // A named header the head used is no longer in it.
        let named = |n: &[u8]| {
            nominated[..n_nominated]
                .iter()
                .any(|t| n.eq_ignore_ascii_case(t))
        };
        if named(b"x-request-id") {
            head.request_id = None;
        }
        if named(b"x-forwarded-proto") {
            head.forwarded_proto = false;
        }
        if named(b"user-agent") {
            head.user_agent = None;
        }
        if named(b"x-forwarded-for") {
            head.forwarded_for = None;
        }
    }
    head.content_length = content_length.unwrap_or(0);
    Some(head)
}

/// The first value of request header `name` (lower case) in the head of `head_len` bytes at
/// the start of `buf`, for the route decision's header matchers; `None` when absent or not
/// text. The head was parsed whole already, so its lines end in CRLF.
pub fn header_value<'a>(buf: &'a [u8], head_len: usize, name: &str) -> Option<&'a str> {
    header_values(buf, head_len, name).next()
}

/// Every value of header `name` in the head, in order (a value that is not UTF-8 skipped).
pub fn header_values<'a, 'n>(
    buf: &'a [u8],
    head_len: usize,
    name: &'n str,
) -> impl Iterator<Item = &'a str> + use<'a, 'n> {
    let head = buf.get(..head_len).unwrap_or_default();
    head.split(|b| *b == b'\n').skip(1).filter_map(move |line| {
        let colon = memchr(b':', line)?;
        let (n, rest) = line.split_at(colon);
        if !n.eq_ignore_ascii_case(name.as_bytes()) {
            return None;
        }
        let value = rest[1..].strip_suffix(b"\r").unwrap_or(&rest[1..]);
        std::str::from_utf8(value.trim_ascii()).ok()
    })
}

/// Request headers whose meaning the fast path leaves to hyper: other framings, upgrades,
/// `Expect: 100-continue`, hop-by-hop headers it would have to strip, and the internal
/// `x-envoy-*` headers a routed request loses ([`crate::http::internal_headers`]).
fn is_handed_off(name: &[u8]) -> bool {
    const NAMES: [&[u8]; 7] = [
        b"transfer-encoding",
        b"upgrade",
        b"expect",
        b"te",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
    ];
    NAMES.iter().any(|n| name.eq_ignore_ascii_case(n))
        || crate::http::internal_headers::is_internal(name)
}

/// How a response body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (HEAD, 204, 304).
    None,
    Length(u64),
    Chunked,
    /// Read until the upstream closes; the client's connection closes after it too.
    Close,
}

/// A response head from the upstream.
#[derive(Debug)]
pub struct ResponseHead {
    pub len: usize,
    pub status: u16,
    pub framing: Framing,
    /// The upstream will close the connection after this response (or is HTTP/1.0).
    pub close: bool,
    /// The upstream spoke HTTP/1.0: the client is answered in HTTP/1.1.
    http10: bool,
    /// Where the status line starts: httparse skips empty lines before it, and they are not
    /// passed on.
    start: u16,
    dropped: Vec<Span>,
    /// From a mesh server: where in the head its sidecar's `x-envoy-peer-metadata` value is
    /// (in `u32`s: this head is in every request's state).
    pub peer_metadata: Option<(u32, u32)>,
    /// The upstream's `server` lines, found as the head is parsed: a connection manager
    /// that writes its own drops them without looking for them again.
    server: ServerLines,
    /// The upstream sent an `x-envoy-upstream-service-time` (a sidecar in front of it did):
    /// ours replaces it.
    service_time: bool,
}

/// Where a response head's `server` lines are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum ServerLines {
    #[default]
    None,
    /// One line, the span of `buf` it takes (its line feed included).
    One(u32, u32),
    /// More than one (rare): looked for again in what is written.
    Many,
}

/// Why a response cannot be forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed upstream response head")]
pub struct BadResponse;

impl ResponseHead {
    /// Whether it is an interim (1xx) response, to skip: 101 is not one (no upgrade was asked).
    pub fn interim(&self) -> bool {
        (100..200).contains(&self.status) && self.status != 101
    }

    /// The head for the client: received lines minus hop-by-hop ones, `extra` header lines,
    /// `server` (in place of the upstream's) when given, `Connection: close` when `close`,
    /// then the blank line.
    pub fn write_downstream(
        &self,
        buf: &[u8],
        extra: &[&[u8]],
        server: Option<&[u8]>,
        service_time: Option<u64>,
        close: bool,
        out: &mut Vec<u8>,
    ) {
        let mut from = self.start as usize;
        if self.http10 {
            out.extend_from_slice(b"HTTP/1.1");
            from += b"HTTP/1.0".len();
        }
        let begin = out.len();
        // Envoy's OVERWRITE: the upstream's own `server` goes when we write ours.
        let also = match (server, self.server) {
            (Some(_), ServerLines::One(start, stop)) => Some((start as usize, stop as usize)),
            _ => None,
        };
        copy_without_from(buf, from, self.len, &self.dropped, also, out);
        if server.is_some() && self.server == ServerLines::Many {
            remove_lines(out, begin, b"server");
        }
        for e in extra {
            out.extend_from_slice(e);
        }
        // Envoy's router's own, in place of any the upstream sent.
        if let Some(ms) = service_time {
            if self.service_time {
                remove_lines(out, begin, SERVICE_TIME);
            }
            out.extend_from_slice(SERVICE_TIME);
            out.extend_from_slice(b": ");
            out.extend_from_slice(itoa::Buffer::new().format(ms).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if let Some(server) = server {
            out.extend_from_slice(b"server: ");
            out.extend_from_slice(server);
            out.extend_from_slice(b"\r\n");
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
    }
}

/// Envoy's router's response header: how long the upstream took to answer, in milliseconds.
pub const SERVICE_TIME: &[u8] = b"x-envoy-upstream-service-time";

/// Parse a response head at the start of `buf`: `Ok(None)` when more bytes are needed.
/// `head_request` says the request was HEAD (no body follows whatever the head says).
pub fn parse_response(buf: &[u8], head_request: bool) -> Result<Option<ResponseHead>, BadResponse> {
    parse_response_from(buf, head_request, false)
}

/// [`parse_response`] of a response from a mesh server we originated TLS to (`mesh_server`):
/// its sidecar's metadata headers are ours, read ([`ResponseHead::peer_metadata`]) and not
/// passed on.
pub fn parse_response_from(
    buf: &[u8],
    head_request: bool,
    mesh_server: bool,
) -> Result<Option<ResponseHead>, BadResponse> {
    // Uninitialised slots, as in `parse_request`.
    let mut headers = [const { MaybeUninit::<httparse::Header>::uninit() }; MAX_RESPONSE_HEADERS];
    let mut res = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut res,
        buf,
        &mut headers,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() < MAX_RESPONSE_HEAD => return Ok(None),
        _ => return Err(BadResponse),
    };
    if !ends_with_crlf(buf, len) {
        return Err(BadResponse);
    }
    let status = res.code.ok_or(BadResponse)?;
    let http10 = res.version == Some(0);
    // Only CR and LF can come before a status line httparse accepted.
    let start = buf
        .iter()
        .position(|b| !matches!(b, b'\r' | b'\n'))
        .map(u16::try_from)
        .transpose()
        // More blank lines than fit (64 KiB of them) is no response.
        .map_err(|_| BadResponse)?
        .unwrap_or(0);
    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut other_coding = false;
    let mut close = http10;
    let mut nominated: Vec<&[u8]> = Vec::new();
    let mut any_hop_by_hop = false;
    let mut peer_metadata = None;
    let mut server = ServerLines::None;
    let mut service_time = false;
    let exchanged = |name: &[u8]| {
        mesh_server
            && (name.eq_ignore_ascii_case(b"x-envoy-peer-metadata")
                || name.eq_ignore_ascii_case(b"x-envoy-peer-metadata-id"))
    };
    for h in res.headers.iter() {
        let name = h.name.as_bytes();
        if exchanged(name) {
            any_hop_by_hop = true;
            if name.len() == b"x-envoy-peer-metadata".len() {
                // httparse's values are slices of `buf`.
                let at = h.value.as_ptr() as usize - buf.as_ptr() as usize;
                peer_metadata = u32::try_from(at)
                    .ok()
                    .zip(u32::try_from(at + h.value.len()).ok());
            }
        } else if name.eq_ignore_ascii_case(b"content-length") {
            // Twice, even with one value, is refused, as Envoy's codec refuses it.
            let n = parse_length(h.value).ok_or(BadResponse)?;
            if content_length.is_some() {
                return Err(BadResponse);
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // The last coding frames the body (RFC 9112 §6.3).
            let last = tokens(h.value).last().unwrap_or_default();
            chunked = last.eq_ignore_ascii_case(b"chunked");
            other_coding = !chunked;
            any_hop_by_hop |= status == 304;
        } else if name.eq_ignore_ascii_case(b"connection") {
            any_hop_by_hop = true;
            for token in tokens(h.value) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && http10 {
                    close = false;
                } else if !token.eq_ignore_ascii_case(b"keep-alive") {
                    nominated.push(token);
                }
            }
        } else if is_hop_by_hop_response(name) {
            any_hop_by_hop = true;
        } else if name.eq_ignore_ascii_case(b"server") {
            server = match (server, line_span(buf, name)) {
                (ServerLines::None, Some((start, stop))) => {
                    match (u32::try_from(start), u32::try_from(stop)) {
                        (Ok(start), Ok(stop)) => ServerLines::One(start, stop),
                        _ => ServerLines::Many,
                    }
                }
                _ => ServerLines::Many,
            };
        } else if name.eq_ignore_ascii_case(SERVICE_TIME) {
            service_time = true;
        }
    }
    // Framings Envoy's codec answers 502 (`UPE`): a length beside a transfer coding (RFC 9112
    // §6.3 lets a proxy drop the length; Envoy refuses the response, and so does Remora), a
    // coding other than chunked, and a 204 that announces a body.
    let coded = chunked || other_coding;
    let refused = (coded && content_length.is_some())
        || (other_coding && status != 304 && !head_request)
        || (status == 204 && (coded || content_length.is_some_and(|n| n != 0)));
    if refused {
        return Err(BadResponse);
    }
    // What Envoy takes off a bodiless answer: a 204's zero length, a 304's coding.
    let drop_length = status == 204 && content_length.is_some();
    any_hop_by_hop |= drop_length;
    let no_body = head_request || status == 204 || status == 304 || (100..200).contains(&status);
    let framing = if no_body {
        Framing::None
    } else if chunked {
        Framing::Chunked
    } else if other_coding {
        Framing::Close
    } else {
        match content_length {
            Some(n) => Framing::Length(n),
            None => Framing::Close,
        }
    };
    let mut dropped = Vec::new();
    if any_hop_by_hop {
        for h in res.headers.iter() {
            let name = h.name.as_bytes();
            let drop = name.eq_ignore_ascii_case(b"connection")
                || is_hop_by_hop_response(name)
                || exchanged(name)
                || (drop_length && name.eq_ignore_ascii_case(b"content-length"))
                || (status == 304 && name.eq_ignore_ascii_case(b"transfer-encoding"))
                || nominated.iter().any(|n| name.eq_ignore_ascii_case(n));
            if drop {
                dropped.push(line_span(buf, name).ok_or(BadResponse)?);
            }
        }
    }
    Ok(Some(ResponseHead {
        len,
        status,
        framing,
        close,
        http10,
        start,
        dropped,
        peer_metadata,
        server,
        service_time,
    }))
}

/// Hop-by-hop response headers besides `Connection` (Transfer-Encoding stays: the body is
/// passed on in the framing it came in).
fn is_hop_by_hop_response(name: &[u8]) -> bool {
    const NAMES: [&[u8]; 5] = [
        b"keep-alive",
        b"proxy-connection",
        b"upgrade",
        b"te",
        b"proxy-authenticate",
    ];
    NAMES.iter().any(|n| name.eq_ignore_ascii_case(n))
}

/// The comma-separated tokens of a header value, trimmed, empty ones skipped.
fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// A Content-Length value: digits only, at most 19 of them.
fn parse_length(value: &[u8]) -> Option<u64> {
    let value = value.trim_ascii();
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(value.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// The line `name` (a slice of `buf`) starts, end of line included.
fn line_span(buf: &[u8], name: &[u8]) -> Option<Span> {
    let start = (name.as_ptr() as usize).checked_sub(buf.as_ptr() as usize)?;
    let after_name = start + name.len();
    let end = after_name + memchr(b'\n', buf.get(after_name..)?)? + 1;
    Some((start, end))
}

/// Whether the head of `len` bytes ends in CRLF CRLF: bare line feeds go to hyper (and are a
/// protocol error from an upstream), so what is forwarded is always well-formed.
fn ends_with_crlf(buf: &[u8], len: usize) -> bool {
    len >= 4 && buf.get(len - 4..len) == Some(b"\r\n\r\n")
}

/// Copy the head of `len` bytes without its blank line and without the `dropped` lines.
fn copy_without(buf: &[u8], len: usize, dropped: &[Span], out: &mut Vec<u8>) {
    copy_without_from(buf, 0, len, dropped, None, out);
}

/// [`copy_without`] from `from`, also without the line `also` (which is in none of
/// `dropped`, both in the order of the head).
fn copy_without_from(
    buf: &[u8],
    from: usize,
    len: usize,
    dropped: &[Span],
    mut also: Option<Span>,
    out: &mut Vec<u8>,
) {
    let end = len - 2;
    let mut at = from;
    for &(start, stop) in dropped {
        if let Some((a, b)) = also.filter(|&(a, _)| a < start) {
            out.extend_from_slice(&buf[at..a]);
            at = b;
            also = None;
        }
        out.extend_from_slice(&buf[at..start]);
        at = stop;
    }
    if let Some((a, b)) = also {
        out.extend_from_slice(&buf[at..a]);
        at = b;
    }
    out.extend_from_slice(&buf[at..end]);
}

/// Remove from the head written at `out[begin..]` (its status line first) every header line
/// named `name`. A line ends at LF, with or without CR before it: the upstream's lines are
/// copied as they came, and a head may end its lines with a bare LF.
fn remove_lines(out: &mut Vec<u8>, begin: usize, name: &[u8]) {
    let Some(first) = out[begin..].iter().position(|&b| b == b'\n') else {
        return;
    };
    let mut at = begin + first + 1;
    while let Some(eol) = out[at..].iter().position(|&b| b == b'\n') {
        let line = &out[at..at + eol];
        let named = line.len() > name.len()
            && line[..name.len()].eq_ignore_ascii_case(name)
            && line[name.len()] == b':';
        if named {
            out.drain(at..at + eol + 1);
        } else {
            at += eol + 1;
        }
    }
}

#[cfg(test)]
mod tests;
