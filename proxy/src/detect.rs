//! Protocol detection: is a new connection HTTP/2 (cleartext, prior knowledge), HTTP/1.x, TLS or
//! something else, and does its server speak first?
//!
//! Detection reads the client's first bytes under a timeout, as linkerd does, but it does not
//! make server-first protocols (MySQL, SMTP, SSH…) wait for that timeout: the upstream connection
//! is opened while we read, and if the server sends a byte before the client has said anything
//! recognisable, the connection is opaque TCP at once. The exception is an HTTP/2 server's
//! opening SETTINGS frame, which gRPC servers send on accept, often before a slow client's
//! preface: it is left unread and the client is waited for. When the client turns out to speak
//! HTTP, that early upstream connection is not wasted: it becomes the first pooled connection
//! to the destination.
//!
//! The bytes read while detecting are kept and replayed to whichever side handles the connection.

use crate::connect::{ConnectError, Upstream};
use crate::tls::client_hello;
use bytes::BytesMut;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The HTTP/2 connection preface a prior-knowledge client sends first (RFC 9113 §3.4).
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// A request line longer than this is taken as opaque bytes; Envoy's default limit on the whole
// request head is 60 KiB, but a line this long is rare enough that TCP is the safer guess.
const MAX_DETECT_BYTES: usize = 16 * 1024;
// Most request lines and many whole request heads fit in the first read.
const INITIAL_READ: usize = 4 * 1024;
// The methods a request line may start with: IANA's HTTP method registry, and PURGE (caches').
// Any token is a method to HTTP itself, but bytes such as `hello world` would then hold
// detection for its whole timeout, waiting for a version that never comes; Envoy's HTTP
// inspector, which Istio's sidecars detect with, also matches a fixed list.
const METHODS: &[&[u8]] = &[
    b"ACL",
    b"BASELINE-CONTROL",
    b"BIND",
    b"CHECKIN",
    b"CHECKOUT",
    b"CONNECT",
    b"COPY",
    b"DELETE",
    b"GET",
    b"HEAD",
    b"LABEL",
    b"LINK",
    b"LOCK",
    b"MERGE",
    b"MKACTIVITY",
    b"MKCALENDAR",
    b"MKCOL",
    b"MKREDIRECTREF",
    b"MKWORKSPACE",
    b"MOVE",
    b"OPTIONS",
    b"ORDERPATCH",
    b"PATCH",
    b"POST",
    b"PRI",
    b"PROPFIND",
    b"PROPPATCH",
    b"PURGE",
    b"PUT",
    b"QUERY",
    b"REBIND",
    b"REPORT",
    b"SEARCH",
    b"TRACE",
    b"UNBIND",
    b"UNCHECKOUT",
    b"UNLINK",
    b"UNLOCK",
    b"UPDATE",
    b"UPDATEREDIRECTREF",
    b"VERSION-CONTROL",
];

/// How long detection waits for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// For its first recognisable bytes.
    pub client: Duration,
    /// For them once the upstream connection opened meanwhile has failed: the connection goes
    /// nowhere then, and a client that waits for its server to speak first would otherwise
    /// wait the whole of `client` for the reset.
    pub after_connect_failure: Duration,
    /// For them once a server has spoken first (zero: the server decides at once). Where the
    /// client's first bytes must be read by the proxy rather than passed on (a mesh peer's
    /// ClientHello on a PERMISSIVE inbound), an application that greets as soon as it is
    /// dialled can race them; the greeting waits unread meanwhile.
    pub after_server_spoke: Duration,
}

/// Which HTTP a client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HttpVersion {
    Http1,
    Http2,
}

/// What detection decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The client sent an HTTP request line or the HTTP/2 preface.
    Http(HttpVersion),
    /// The client sent a TLS ClientHello (complete, unless it was too long to be one).
    Tls,
    /// The client sent something else.
    Opaque,
    /// The server sent bytes before the client said anything recognisable.
    ServerFirst,
    /// Nothing decided within the detection timeout.
    Timeout,
    /// The client closed its sending side before anything decided.
    ClientClosed,
    /// Reading from the client failed (a reset).
    ClientFailed,
    /// The upstream connection failed and the client said nothing recognisable soon after.
    UpstreamFailed,
}

impl Verdict {
    /// The `result` label of `remora_protocol_detection_total`.
    pub fn metric_label(self) -> &'static str {
        match self {
            Verdict::Http(HttpVersion::Http1) => "http1",
            Verdict::Http(HttpVersion::Http2) => "http2",
            Verdict::Tls => "tls",
            Verdict::Opaque => "opaque",
            Verdict::ServerFirst => "server_first",
            Verdict::Timeout => "timeout",
            Verdict::ClientClosed => "client_closed",
            Verdict::ClientFailed => "client_failed",
            Verdict::UpstreamFailed => "upstream_failed",
        }
    }
}

/// The outcome of detection: the verdict, the client's bytes read so far, and the early
/// upstream connection if it finished (`None` while it is still being opened).
#[derive(Debug)]
pub struct Detection {
    pub verdict: Verdict,
    pub prefix: BytesMut,
    pub upstream: Option<Result<Upstream, ConnectError>>,
}

/// Read the client's first bytes until they decide the protocol, while `connect` opens the
/// upstream. With `watch_server`, a server that speaks first decides at once. If the upstream
/// connection fails, the client has `wait.after_connect_failure` more (an HTTP client that is
/// sending its request gets an HTTP answer, a silent one its reset soon). `connect` must not
/// have completed; if `Detection::upstream` is `None` it is still pending and may be awaited.
pub async fn detect<S, F>(
    downstream: &mut S,
    mut connect: Pin<&mut F>,
    wait: Wait,
    watch_server: bool,
) -> Detection
where
    S: AsyncRead + Unpin,
    F: Future<Output = Result<Upstream, ConnectError>>,
{
    let mut prefix = BytesMut::new();
    let mut upstream: Option<Result<Upstream, ConnectError>> = None;
    let deadline = tokio::time::sleep(wait.client);
    tokio::pin!(deadline);
    let client_deadline = deadline.deadline();
    let mut connect_failed = false;
    // An HTTP/2 server opens with its SETTINGS frame before its client has spoken: that is
    // not a server-first protocol, so the client's preface is still awaited.
    let mut watch_server = watch_server;
    // The server spoke first, and the client has `wait.after_server_spoke` left to speak.
    let mut server_first = false;
    let verdict = loop {
        if prefix.len() == prefix.capacity() {
            let want = if prefix.capacity() == 0 {
                INITIAL_READ
            } else {
                prefix.len()
            };
            prefix.reserve(want.min(MAX_DETECT_BYTES - prefix.len()).max(1));
        }
        tokio::select! {
            // Client bytes first: when both sides have spoken, the client's request decides.
            biased;
            // Cancel-safe: when another branch wins, no byte has been taken from the stream.
            read = downstream.read_buf(&mut prefix) => match read {
                Ok(0) => break Verdict::ClientClosed,
                Ok(_) => {
                    if let Some(v) = classify(&prefix) {
                        break v;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break Verdict::ClientFailed,
            },
            result = &mut connect, if upstream.is_none() => {
                if result.is_err() {
                    connect_failed = true;
                    end_within(deadline.as_mut(), wait.after_connect_failure);
                }
                upstream = Some(result);
            }
            () = server_spoke(&upstream), if watch_server => {
                match server_opened_http2(&upstream).await {
                    // The readiness was stale: nothing has come yet, and the look cleared it.
                    None => continue,
                    Some(true) => {
                        watch_server = false;
                        continue;
                    }
                    Some(false) => watch_server = false,
                }
                if wait.after_server_spoke.is_zero() {
                    break Verdict::ServerFirst;
                }
                server_first = true;
                end_within(deadline.as_mut(), wait.after_server_spoke);
            }
            () = &mut deadline => {
                if server_first && !prefix.is_empty() {
                    // The client began within the grace (a ClientHello in pieces, say): its
                    // own bytes decide, within the client's bound.
                    server_first = false;
                    deadline.as_mut().reset(client_deadline);
                    continue;
                }
                break match (server_first, connect_failed) {
                    (true, _) => Verdict::ServerFirst,
                    (false, true) => Verdict::UpstreamFailed,
                    (false, false) => Verdict::Timeout,
                };
            }
        }
    };
    Detection {
        verdict,
        prefix,
        upstream,
    }
}

/// Brings `deadline` forward to `within` from now, if that is sooner.
fn end_within(deadline: Pin<&mut tokio::time::Sleep>, within: Duration) {
    let sooner = tokio::time::Instant::now() + within;
    if sooner < deadline.deadline() {
        deadline.reset(sooner);
    }
}

/// Resolves when the open upstream connection has something to read (data, end of stream or a
/// reset); never while there is no open connection.
async fn server_spoke(upstream: &Option<Result<Upstream, ConnectError>>) {
    match upstream {
        Some(Ok(up)) => {
            // An error here means the socket is unusable, which the copy will report.
            let _ = up.stream.readable().await;
        }
        _ => std::future::pending().await,
    }
}

/// Whether what the server has sent so far starts with an HTTP/2 SETTINGS frame on stream 0
/// (RFC 9113 §3.4: a server's preface), read without taking it from the socket. The frame
/// header alone decides: type 4, no ACK flag, stream 0, a length that holds whole settings.
/// Server-first protocols open otherwise (MySQL's packet numbered 0, SMTP's `220`, SSH's `SSH-`).
/// `None` when nothing is there after all: tokio's readiness can be stale, and a look that
/// waited would hold detection (the client's bytes and the deadline) until the server spoke.
async fn server_opened_http2(upstream: &Option<Result<Upstream, ConnectError>>) -> Option<bool> {
    let Some(Ok(up)) = upstream else {
        return Some(false);
    };
    let mut header = [0u8; 9];
    let mut seen = tokio::io::ReadBuf::new(&mut header);
    // One look, never a wait: pending clears the stale readiness, so the next wait is real.
    let peeked =
        std::future::poll_fn(|cx| std::task::Poll::Ready(up.stream.poll_peek(cx, &mut seen))).await;
    match peeked {
        std::task::Poll::Pending => None,
        std::task::Poll::Ready(Ok(9)) => Some(is_settings_frame_header(&header)),
        std::task::Poll::Ready(_) => Some(false),
    }
}

/// An HTTP/2 frame header (9 bytes) of a SETTINGS frame that is not an acknowledgement, on
/// stream 0, with a length that is a whole number of settings.
fn is_settings_frame_header(h: &[u8; 9]) -> bool {
    const SETTINGS: u8 = 0x4;
    let len = u32::from_be_bytes([0, h[0], h[1], h[2]]);
    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
    h[3] == SETTINGS && h[4] == 0 && stream == 0 && len.is_multiple_of(6)
}

/// Decide the protocol from the client's first bytes; `None` while they are a consistent but
/// incomplete start of HTTP or TLS.
pub fn classify(bytes: &[u8]) -> Option<Verdict> {
    if bytes.is_empty() {
        return None;
    }
    let n = bytes.len().min(H2_PREFACE.len());
    if bytes[..n] == H2_PREFACE[..n] {
        return if n == H2_PREFACE.len() {
            Some(Verdict::Http(HttpVersion::Http2))
        } else {
            None
        };
    }
    if bytes[0] == 0x16 {
        // A TLS handshake record: content type 22, then protocol version 3.x. The whole
        // ClientHello is read (a client sends it at once), so its ALPN can tell mesh mutual
        // TLS from the application's own.
        return match bytes.get(1) {
            None => None,
            Some(3) => match client_hello::parse(bytes) {
                client_hello::Parsed::Incomplete if bytes.len() < MAX_DETECT_BYTES => None,
                _ => Some(Verdict::Tls),
            },
            Some(_) => Some(Verdict::Opaque),
        };
    }
    match request_line(bytes) {
        Line::Http1 => Some(Verdict::Http(HttpVersion::Http1)),
        Line::Incomplete if bytes.len() < MAX_DETECT_BYTES => None,
        Line::Incomplete | Line::NotHttp => Some(Verdict::Opaque),
    }
}

enum Line {
    Http1,
    Incomplete,
    NotHttp,
}

/// The longest of [`METHODS`]: a request line's first space comes no later than after it.
const MAX_METHOD: usize = {
    let (mut i, mut max) = (0, 0);
    while i < METHODS.len() {
        if METHODS[i].len() > max {
            max = METHODS[i].len();
        }
        i += 1;
    }
    max
};

/// Whether `bytes` start with `method SP request-target SP HTTP/1.x CRLF` (RFC 9112 §3). Runs
/// of spaces count as one, as Envoy's parser and hyper's (configured so) take them: a lenient
/// client is served as HTTP, as behind Envoy, not passed through as opaque bytes.
fn request_line(bytes: &[u8]) -> Line {
    const VERSION: &[u8] = b"HTTP/1.";
    // The method is looked up once, as the token before the first space. Matching each byte
    // against every method cost a browser's GET more than following its whole head's framing
    // (the `detection` criterion benchmark: 294 ns then, 38 ns now).
    let start = &bytes[..bytes.len().min(MAX_METHOD + 1)];
    let Some(method_len) = start.iter().position(|&b| b == b' ') else {
        return if start.len() <= MAX_METHOD && is_method_start(start) {
            Line::Incomplete
        } else {
            Line::NotHttp
        };
    };
    if !METHODS.contains(&&bytes[..method_len]) {
        return Line::NotHttp;
    }
    // The target: visible ASCII, and bytes above it that lenient servers take in paths.
    let rest = after_spaces(&bytes[method_len + 1..]);
    let Some(target_len) = rest.iter().position(|&b| b <= b' ' || b == 0x7f) else {
        return Line::Incomplete;
    };
    if target_len == 0 || rest[target_len] != b' ' {
        return Line::NotHttp;
    }
    // `HTTP/1.0` or `HTTP/1.1`, then CRLF or a bare LF.
    let version = after_spaces(&rest[target_len + 1..]);
    let known = version.len().min(VERSION.len());
    if version[..known] != VERSION[..known] {
        return Line::NotHttp;
    }
    let end = match version.get(VERSION.len()..) {
        None | Some([]) => return Line::Incomplete,
        Some([b'0' | b'1', end @ ..]) => end,
        Some(_) => return Line::NotHttp,
    };
    match end {
        [] | [b'\r'] => Line::Incomplete,
        [b'\n', ..] | [b'\r', b'\n', ..] => Line::Http1,
        _ => Line::NotHttp,
    }
}

/// `bytes` from their first byte that is not a space.
fn after_spaces(bytes: &[u8]) -> &[u8] {
    let n = bytes.iter().take_while(|&&b| b == b' ').count();
    &bytes[n..]
}

/// Whether `start` begins one of [`METHODS`].
fn is_method_start(start: &[u8]) -> bool {
    METHODS.iter().any(|m| m.starts_with(start))
}

#[cfg(test)]
mod tests;
