//! The HTTP/1.1 request stream as the client wrote it, before hyper parses it.
//!
//! hyper resolves a request carrying both `Content-Length` and `Transfer-Encoding` the way RFC
//! 9112 §6.3 allows a server to: it drops the length, reads the body chunked and closes after
//! the response. The service never sees that the length was there, yet such a request is the
//! classic request-smuggling shape, and Envoy refuses it (400 `DPE`). So the raw bytes are
//! followed here, and each head that had both is reported by its position on the connection.
//!
//! A fragment (`#…`) in the request target is not looked for: hyper drops it as it parses
//! the target (the `http` crate's URI does), so the request is routed, authorized, logged and
//! sent on without it, which is what Envoy does under Istio's bootstrap (pilot-agent turns
//! `envoy.reloadable_features.http_reject_path_with_fragment` off, and Envoy's connection
//! manager then strips the fragment from `:path`).
//!
//! Following the bytes also tells when a request head is being read, which is what the header
//! read timeout bounds: from a head's first byte to its end, never the idle time between
//! requests (hyper's own timeout runs from the moment it starts waiting for a head, which
//! would cut idle keep-alive connections).
//!
//! Only heads are looked at byte by byte: a `Content-Length` body is skipped by its count, a
//! chunked body by its size lines, and lines of headers that do not frame the message are
//! skipped with `memchr`. After anything that ends or changes the framing as hyper reads it (an
//! upgrade or CONNECT, a head hyper or the proxy refuses), nothing more is inspected: the
//! connection closes after that request or stops being HTTP.

/// Header names that frame a request or end HTTP on the connection, lower case.
const TRACKED: [&[u8]; 3] = [b"content-length", b"transfer-encoding", b"upgrade"];
const CONTENT_LENGTH: u8 = 1 << 0;
const TRANSFER_ENCODING: u8 = 1 << 1;
const UPGRADE: u8 = 1 << 2;
const ALL: u8 = CONTENT_LENGTH | TRANSFER_ENCODING | UPGRADE;
/// The length of `transfer-encoding`, the longest tracked name: with that many bytes and one
/// more (the colon) in the buffer, a header line is decided at once.
const LONGEST_NAME: usize = 17;
/// The one request line prefix that ends HTTP on the connection, matched byte by byte.
const CONNECT: &[u8] = b"CONNECT ";
const CHUNKED: &[u8] = b"chunked";

/// Follows the framing of the requests on one HTTP/1.x connection.
#[derive(Debug, Clone)]
pub struct RequestFraming {
    state: State,
    /// Request heads completed so far.
    heads: u64,
    head: Head,
}

/// What the head being read has said about its framing.
#[derive(Debug, Clone, Copy, Default)]
struct Head {
    /// A `Content-Length` line, whether or not its value is a number.
    has_content_length: bool,
    content_length: Option<u64>,
    transfer_encoding: bool,
    /// The head ends the inspection: an upgrade, CONNECT, or framing hyper or the proxy refuses.
    last: bool,
}

/// A request head the proxy refuses though hyper would take it, found in the raw bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedHead {
    /// Its position on the connection, from 1.
    pub position: u64,
    pub why: HeadFault,
}

/// Why a head is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadFault {
    /// Both `Content-Length` and `Transfer-Encoding`.
    LengthAndChunked,
}

impl HeadFault {
    /// The local reply, as Envoy's codec or connection manager answers.
    pub fn reply(&self) -> super::errors::ErrorKind {
        match self {
            HeadFault::LengthAndChunked => {
                super::errors::ErrorKind::MalformedRequest("content-length with transfer-encoding")
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between requests; blank lines may come before a request line (RFC 9112 §2.2).
    Idle,
    /// In the request line, with how much of `CONNECT ` it has matched (`u8::MAX`: it is not).
    RequestLine { connect: u8 },
    /// At the start of a header line, or of the blank line that ends the head.
    LineStart,
    /// After a CR at the start of a line.
    BlankLineCr,
    /// In a header name that may be one of `TRACKED` (the bits of those still matching).
    Name { len: u8, candidates: u8 },
    /// In a header line that says nothing about framing.
    SkipLine,
    /// In a `Content-Length` value: the digits so far, and whether they are over.
    ContentLength {
        value: u64,
        digits: bool,
        ended: bool,
    },
    /// In a `Transfer-Encoding` value: how much of `chunked` it has matched (8: all, then
    /// whitespace), or that it is something else.
    TransferEncoding { matched: u8, other: bool },
    /// In a body of known length.
    Body { remaining: u64 },
    /// In a chunk-size line: the size so far, and whether an extension or whitespace began.
    ChunkSize { size: u64, digits: bool, rest: bool },
    /// In a chunk's data.
    ChunkData { remaining: u64 },
    /// After a chunk's data, before its CRLF.
    ChunkDataEnd { cr: bool },
    /// At the start of a trailer line, or of the blank line that ends the message.
    TrailerLineStart,
    /// After a CR at the start of a trailer line.
    TrailerBlankCr,
    /// In a trailer line.
    TrailerLine,
    /// Not inspecting any more.
    Stopped,
}

impl RequestFraming {
    /// A connection about to receive its first request.
    pub fn new() -> Self {
        RequestFraming {
            state: State::Idle,
            heads: 0,
            head: Head::default(),
        }
    }

    /// A connection on which `served` requests were served already (by the fast path): the
    /// next head is at position `served + 1`.
    pub fn after(served: u64) -> Self {
        RequestFraming {
            heads: served,
            ..RequestFraming::new()
        }
    }

    /// A connection whose bytes are not HTTP/1.x requests (HTTP/2): nothing is inspected.
    pub fn stopped() -> Self {
        RequestFraming {
            state: State::Stopped,
            ..RequestFraming::new()
        }
    }

    /// Whether a request head has begun and not ended.
    pub fn in_head(&self) -> bool {
        matches!(
            self.state,
            State::RequestLine { .. }
                | State::LineStart
                | State::BlankLineCr
                | State::Name { .. }
                | State::SkipLine
                | State::ContentLength { .. }
                | State::TransferEncoding { .. }
        )
    }

    /// Request heads completed so far on the connection: the position of the request whose
    /// body is being read.
    pub fn heads(&self) -> u64 {
        self.heads
    }

    /// Whether a request body (or its chunked trailers) has begun and not ended.
    pub fn in_body(&self) -> bool {
        matches!(
            self.state,
            State::Body { .. }
                | State::ChunkSize { .. }
                | State::ChunkData { .. }
                | State::ChunkDataEnd { .. }
                | State::TrailerLineStart
                | State::TrailerBlankCr
                | State::TrailerLine
        )
    }

    /// Follow the next bytes the client sent. Returns a request head that ended in them and is
    /// refused (both `Content-Length` and `Transfer-Encoding`);
    /// inspection stops after it.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Option<RefusedHead> {
        while !bytes.is_empty() {
            match self.state {
                State::Stopped => return None,
                State::Body { remaining } | State::ChunkData { remaining } => {
                    let n = usize::try_from(remaining)
                        .unwrap_or(usize::MAX)
                        .min(bytes.len());
                    bytes = &bytes[n..];
                    let remaining = remaining - n as u64;
                    self.state = match self.state {
                        State::Body { .. } if remaining == 0 => State::Idle,
                        State::Body { .. } => State::Body { remaining },
                        _ if remaining == 0 => State::ChunkDataEnd { cr: false },
                        _ => State::ChunkData { remaining },
                    };
                }
                State::RequestLine { connect: u8::MAX } => {
                    // The rest of a request line: one scan for its end.
                    let i = memchr::memchr(b'\n', bytes)?;
                    bytes = &bytes[i + 1..];
                    self.state = State::LineStart;
                }
                State::SkipLine => {
                    // Most header lines say nothing about framing: go from one to the next
                    // while the next one can be neither tracked nor the blank line.
                    loop {
                        let Some(i) = memchr::memchr(b'\n', bytes) else {
                            self.state = State::SkipLine;
                            return None;
                        };
                        bytes = &bytes[i + 1..];
                        match bytes.first() {
                            Some(&b) if !may_matter(b) => {}
                            _ => break,
                        }
                    }
                    self.state = State::LineStart;
                }
                State::TrailerLine => match memchr::memchr(b'\n', bytes) {
                    Some(i) => {
                        bytes = &bytes[i + 1..];
                        self.state = State::TrailerLineStart;
                    }
                    None => return None,
                },
                State::LineStart if bytes.len() > LONGEST_NAME && !is_line_end(bytes[0]) => {
                    let n = self.whole_name(bytes);
                    bytes = &bytes[n..];
                }
                _ => {
                    let b = bytes[0];
                    bytes = &bytes[1..];
                    if let Some(smuggled) = self.step(b) {
                        return Some(smuggled);
                    }
                }
            }
        }
        None
    }

    /// At the start of a header line (not the blank one) with room in `bytes` for the longest
    /// tracked name and its colon: decide the line at once, as `step` would byte by byte.
    /// Returns the bytes taken.
    fn whole_name(&mut self, bytes: &[u8]) -> usize {
        let starts = |name: &[u8]| {
            bytes[..name.len()].eq_ignore_ascii_case(name) && bytes[name.len()] == b':'
        };
        match bytes[0].to_ascii_lowercase() {
            b'c' if starts(TRACKED[0]) => {
                self.head.has_content_length = true;
                self.state = State::ContentLength {
                    value: 0,
                    digits: false,
                    ended: false,
                };
                TRACKED[0].len() + 1
            }
            b't' if starts(TRACKED[1]) => {
                self.state = State::TransferEncoding {
                    matched: 0,
                    other: false,
                };
                TRACKED[1].len() + 1
            }
            b'u' if starts(TRACKED[2]) => {
                self.head.last = true;
                self.state = State::SkipLine;
                TRACKED[2].len() + 1
            }
            _ => {
                self.state = State::SkipLine;
                0
            }
        }
    }

    /// One byte of a head, a size line, a chunk's CRLF or a trailer.
    fn step(&mut self, b: u8) -> Option<RefusedHead> {
        self.state = match self.state {
            State::Idle if b == b'\r' || b == b'\n' => State::Idle,
            State::Idle => {
                self.head = Head::default();
                State::RequestLine {
                    connect: u8::from(b == CONNECT[0]),
                }
                .or_plain_line()
            }
            State::RequestLine { .. } if b == b'\n' => State::LineStart,
            State::RequestLine { connect } => {
                let i = usize::from(connect);
                if CONNECT.get(i) != Some(&b) {
                    State::RequestLine { connect: u8::MAX }
                } else if i + 1 == CONNECT.len() {
                    self.head.last = true;
                    State::RequestLine { connect: u8::MAX }
                } else {
                    State::RequestLine {
                        connect: connect + 1,
                    }
                }
            }
            State::LineStart | State::BlankLineCr if b == b'\n' => return self.head_ended(),
            State::LineStart if b == b'\r' => State::BlankLineCr,
            State::LineStart => match b.to_ascii_lowercase() {
                c @ (b'c' | b't' | b'u') => State::Name {
                    len: 1,
                    candidates: ALL & !mismatches(0, c),
                },
                _ => State::SkipLine,
            },
            // A lone CR in a line: hyper refuses the head.
            State::BlankLineCr => {
                self.head.last = true;
                State::SkipLine
            }
            State::Name { len, candidates } => self.name(len, candidates, b),
            State::ContentLength { .. } | State::TransferEncoding { .. } if b == b'\n' => {
                self.value_ended();
                State::LineStart
            }
            State::ContentLength {
                value,
                digits,
                ended,
            } => match b {
                b'0'..=b'9' if !ended => match value
                    .checked_mul(10)
                    .and_then(|v| v.checked_add(u64::from(b - b'0')))
                {
                    Some(value) => State::ContentLength {
                        value,
                        digits: true,
                        ended,
                    },
                    None => self.unparseable(),
                },
                b' ' | b'\t' | b'\r' => State::ContentLength {
                    value,
                    digits,
                    ended: digits,
                },
                _ => self.unparseable(),
            },
            State::TransferEncoding { matched, other } => {
                let m = usize::from(matched);
                match b {
                    b' ' | b'\t' | b'\r' if m == 0 || m >= CHUNKED.len() => {
                        let matched = if m == 0 { 0 } else { CHUNKED.len() as u8 + 1 };
                        State::TransferEncoding { matched, other }
                    }
                    _ if m < CHUNKED.len() && b.to_ascii_lowercase() == CHUNKED[m] => {
                        State::TransferEncoding {
                            matched: matched + 1,
                            other,
                        }
                    }
                    _ => State::TransferEncoding {
                        matched,
                        other: true,
                    },
                }
            }
            State::ChunkSize { size, digits, rest } => match b {
                b'\n' if digits && size == 0 => State::TrailerLineStart,
                b'\n' if digits => State::ChunkData { remaining: size },
                _ if rest => State::ChunkSize { size, digits, rest },
                b';' | b' ' | b'\t' | b'\r' if digits => State::ChunkSize {
                    size,
                    digits,
                    rest: true,
                },
                _ => match (b as char)
                    .to_digit(16)
                    .and_then(|d| size.checked_mul(16)?.checked_add(u64::from(d)))
                {
                    Some(size) => State::ChunkSize {
                        size,
                        digits: true,
                        rest,
                    },
                    // hyper refuses the body; the connection ends with it.
                    None => State::Stopped,
                },
            },
            State::ChunkDataEnd { cr: false } if b == b'\r' => State::ChunkDataEnd { cr: true },
            State::ChunkDataEnd { .. } if b == b'\n' => State::ChunkSize {
                size: 0,
                digits: false,
                rest: false,
            },
            State::ChunkDataEnd { .. } => State::Stopped,
            State::TrailerLineStart | State::TrailerBlankCr if b == b'\n' => State::Idle,
            State::TrailerLineStart if b == b'\r' => State::TrailerBlankCr,
            State::TrailerLineStart => State::TrailerLine,
            State::TrailerBlankCr => State::Stopped,
            // Handled in bulk by `feed`.
            State::Body { .. }
            | State::ChunkData { .. }
            | State::SkipLine
            | State::TrailerLine
            | State::Stopped => self.state,
        };
        None
    }

    /// One byte of a header name that may still be tracked.
    fn name(&mut self, len: u8, candidates: u8, b: u8) -> State {
        let i = usize::from(len);
        if b == b':' {
            let whole = TRACKED
                .iter()
                .enumerate()
                .find(|(bit, name)| candidates & (1 << bit) != 0 && name.len() == i);
            return match whole.map(|(bit, _)| 1 << bit) {
                Some(CONTENT_LENGTH) => {
                    self.head.has_content_length = true;
                    State::ContentLength {
                        value: 0,
                        digits: false,
                        ended: false,
                    }
                }
                Some(TRANSFER_ENCODING) => State::TransferEncoding {
                    matched: 0,
                    other: false,
                },
                Some(_) => {
                    self.head.last = true;
                    State::SkipLine
                }
                None => State::SkipLine,
            };
        }
        let candidates = candidates & !mismatches(i, b.to_ascii_lowercase());
        if candidates == 0 {
            State::SkipLine.or_line_end(b)
        } else {
            State::Name {
                len: len.saturating_add(1),
                candidates,
            }
        }
    }

    /// The end of a `Content-Length` or `Transfer-Encoding` line.
    fn value_ended(&mut self) {
        match self.state {
            State::ContentLength { value, digits, .. } => {
                if !digits {
                    self.head.last = true;
                }
                match self.head.content_length {
                    // Differing lengths: hyper refuses the head.
                    Some(v) if v != value => self.head.last = true,
                    _ => self.head.content_length = Some(value),
                }
            }
            State::TransferEncoding { matched, other } => {
                // A second Transfer-Encoding, or one other than `chunked`, is refused.
                if self.head.transfer_encoding || other || usize::from(matched) < CHUNKED.len() {
                    self.head.last = true;
                }
                self.head.transfer_encoding = true;
            }
            _ => {}
        }
    }

    /// A `Content-Length` that is not a number: hyper refuses the head.
    fn unparseable(&mut self) -> State {
        self.head.last = true;
        State::SkipLine
    }

    /// The blank line after the headers: what follows is the body, then the next request.
    fn head_ended(&mut self) -> Option<RefusedHead> {
        self.heads += 1;
        let head = self.head;
        let why = if head.has_content_length && head.transfer_encoding {
            Some(HeadFault::LengthAndChunked)
        } else {
            None
        };
        if let Some(why) = why {
            self.state = State::Stopped;
            return Some(RefusedHead {
                position: self.heads,
                why,
            });
        }
        self.state = if head.last {
            State::Stopped
        } else if head.transfer_encoding {
            State::ChunkSize {
                size: 0,
                digits: false,
                rest: false,
            }
        } else {
            match head.content_length {
                Some(remaining) if remaining > 0 => State::Body { remaining },
                _ => State::Idle,
            }
        };
        None
    }
}

impl Default for RequestFraming {
    fn default() -> Self {
        RequestFraming::new()
    }
}

impl State {
    /// A request line that cannot be CONNECT is skipped to its end in bulk.
    fn or_plain_line(self) -> State {
        match self {
            State::RequestLine { connect: 0 } => State::RequestLine { connect: u8::MAX },
            s => s,
        }
    }

    /// A line skipped from a byte that may itself end it.
    fn or_line_end(self, b: u8) -> State {
        if b == b'\n' {
            State::LineStart
        } else {
            self
        }
    }
}

fn is_line_end(b: u8) -> bool {
    b == b'\r' || b == b'\n'
}

/// Whether a line starting with `b` may be a tracked header or the blank line.
fn may_matter(b: u8) -> bool {
    matches!(b.to_ascii_lowercase(), b'c' | b't' | b'u' | b'\r' | b'\n')
}

/// The tracked names that do not have `c` at position `i`.
fn mismatches(i: usize, c: u8) -> u8 {
    let mut bits = 0;
    for (bit, name) in TRACKED.iter().enumerate() {
        if name.get(i) != Some(&c) {
            bits |= 1 << bit;
        }
    }
    bits
}

#[cfg(test)]
mod tests;
