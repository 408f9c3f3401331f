//! The smuggling tests' origin: raw HTTP/1.1, parsed strictly (RFC 9112, no leniency), every
//! request and every byte it could not parse recorded.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// One request as the origin parsed it, strictly (RFC 9112, no leniency).
#[derive(Debug, Clone)]
pub struct Received {
    pub head: String,
    pub body: Vec<u8>,
}

/// What the origin received: parsed requests, and bytes it could not parse.
#[derive(Debug, Default)]
pub struct Recorded {
    pub requests: Vec<Received>,
    pub garbage: Vec<Vec<u8>>,
}

pub type Record = Arc<Mutex<Recorded>>;

pub fn record(r: &Record) -> std::sync::MutexGuard<'_, Recorded> {
    r.lock().unwrap_or_else(PoisonError::into_inner)
}

/// [`origin`] on the peer's side at `addr`, in a thread of its own: what it records.
pub fn spawn(net: &remora_e2e::PodNet, addr: std::net::SocketAddr) -> Record {
    let listener = net.peer.bind(addr).expect("bind the origin");
    let rec = Record::default();
    {
        let rec = Arc::clone(&rec);
        std::thread::spawn(move || origin(listener, rec));
    }
    rec
}

/// A raw HTTP/1.1 origin that parses strictly, answers each request (403 to
/// `/refuse-upgrade`, else 200) and records everything.
pub fn origin(listener: TcpListener, rec: Record) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { return };
        let rec = Arc::clone(&rec);
        std::thread::spawn(move || serve(stream, &rec));
    }
}

pub fn serve(mut stream: TcpStream, rec: &Record) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        loop {
            match parse_request(&buf) {
                Parsed::Incomplete => break,
                Parsed::Bad => {
                    record(rec).garbage.push(std::mem::take(&mut buf));
                    return;
                }
                Parsed::Request(req, used) => {
                    buf.drain(..used);
                    let status = if req.head.starts_with("GET /refuse-upgrade ") {
                        "403 Forbidden"
                    } else {
                        "200 OK"
                    };
                    record(rec).requests.push(req);
                    let answer = format!("HTTP/1.1 {status}\r\nContent-Length: 2\r\n\r\nok");
                    if stream.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => {
                if !buf.is_empty() {
                    record(rec).garbage.push(buf);
                }
                return;
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

pub enum Parsed {
    Incomplete,
    Bad,
    Request(Received, usize),
}

/// Strict HTTP/1.1 request framing: CRLF lines, token header names directly followed by a
/// colon, no folding, one Content-Length or `Transfer-Encoding: chunked` alone, chunk sizes
/// in hex with token extensions.
pub fn parse_request(buf: &[u8]) -> Parsed {
    let Some(end) = find(buf, b"\r\n\r\n") else {
        return if buf.len() > 1 << 16 {
            Parsed::Bad
        } else {
            Parsed::Incomplete
        };
    };
    let Ok(head) = std::str::from_utf8(&buf[..end]) else {
        return Parsed::Bad;
    };
    let mut length = None;
    let mut chunked = false;
    for (i, line) in head.split("\r\n").enumerate() {
        if line.contains(['\r', '\n']) {
            return Parsed::Bad;
        }
        if i == 0 {
            continue;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Parsed::Bad;
        };
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if name.is_empty() || !name.chars().all(token) {
            return Parsed::Bad;
        }
        let value = value.trim_matches([' ', '\t']);
        if name.eq_ignore_ascii_case("content-length") {
            if length.is_some() || !value.bytes().all(|b| b.is_ascii_digit()) {
                return Parsed::Bad;
            }
            length = value.parse::<usize>().ok();
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            if chunked || !value.eq_ignore_ascii_case("chunked") {
                return Parsed::Bad;
            }
            chunked = true;
        }
    }
    if chunked && length.is_some() {
        return Parsed::Bad;
    }
    let mut at = end + 4;
    let mut body = Vec::new();
    if chunked {
        loop {
            let Some(eol) = find(&buf[at..], b"\r\n") else {
                return Parsed::Incomplete;
            };
            let line = &buf[at..at + eol];
            let size = line.split(|&b| b == b';').next().unwrap_or_default();
            let Some(size) = std::str::from_utf8(size)
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|s| usize::from_str_radix(s, 16).ok())
            else {
                return Parsed::Bad;
            };
            at += eol + 2;
            if size == 0 {
                // No trailers here: the next line must end the body.
                if buf.len() < at + 2 {
                    return Parsed::Incomplete;
                }
                if &buf[at..at + 2] != b"\r\n" {
                    return Parsed::Bad;
                }
                at += 2;
                break;
            }
            if buf.len() < at + size + 2 {
                return Parsed::Incomplete;
            }
            body.extend_from_slice(&buf[at..at + size]);
            if &buf[at + size..at + size + 2] != b"\r\n" {
                return Parsed::Bad;
            }
            at += size + 2;
        }
    } else if let Some(n) = length {
        if buf.len() < at + n {
            return Parsed::Incomplete;
        }
        body.extend_from_slice(&buf[at..at + n]);
        at += n;
    }
    let head = head.to_string();
    Parsed::Request(Received { head, body }, at)
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
