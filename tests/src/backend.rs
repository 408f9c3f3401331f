//! An HTTP/1.1 backend for the routing tests: it answers each request (keep-alive) with JSON
//! naming itself, the method, the path and every header it received, so a test sees which
//! endpoint a proxy chose and what the proxy did to the request. A few paths misbehave on
//! purpose: `/slow…` answers after [`SLOW`], `/reset-once…` resets the connection the first
//! time this backend sees it, `/503-once…` answers 503 the first time it sees that path. A
//! backend whose name starts with `failing` answers every request 500 (an endpoint gone bad,
//! for outlier detection).
//!
//! `/flaky/<how>/<id>` paths count how many times the backend saw each of them (every answer
//! says so in `x-backend-seen`, and `/seen/flaky/<how>/<id>` tells it later), and misbehave
//! as `<how>` says: `503` always, `503x<n>` the first `n` times, `status<code>` always that
//! status, `grpc<code>` a trailers-only gRPC answer with that status, `reset` a reset every
//! time, `slow` after [`SLOW`] every time, `slow-once` the first time, `close` answers and
//! then closes the kept-alive connection ([`CLOSE_AFTER`] later, as a server's idle timeout
//! would); anything else answers.

use crate::netns::Netns;
use crate::peer::{read_request_head, Server};
use serde_json::{json, Map, Value};
use std::collections::{HashMap, HashSet};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How long `/slow…` waits before answering: longer than any route timeout a test sets.
pub const SLOW: Duration = Duration::from_secs(3);
/// How long after its answer `/flaky/close/…` closes the connection.
pub const CLOSE_AFTER: Duration = Duration::from_millis(100);
/// A response header every answer carries, for a route to remove.
pub const SECRET_HEADER: &str = "x-backend-secret";
/// Requests a connection serves at most, so a stuck client cannot keep a thread forever.
const MAX_REQUESTS_PER_CONNECTION: usize = 100_000;
/// Largest request body read (and thrown away).
const MAX_BODY: u64 = 1 << 20;

/// Start the backend `name` on `addr` in `ns`; it stops accepting when dropped.
pub fn start(ns: &Netns, addr: SocketAddr, name: &str) -> Server {
    let name: Arc<str> = Arc::from(name);
    let state = Arc::new(State::default());
    Server::start(ns, addr, move |stream| serve(stream, &name, &state))
}

/// What the misbehaving paths remember.
#[derive(Default)]
struct State {
    reset_done: AtomicBool,
    /// The `/503-once…` paths answered 503 already (a few per test).
    unavailable_done: Mutex<HashSet<String>>,
    /// How many times each `/flaky/…` path was seen (a few hundred per test).
    seen: Mutex<HashMap<String, u32>>,
}

/// The response header that says how many times the backend saw a `/flaky/…` path.
pub const SEEN_HEADER: &str = "x-backend-seen";

/// What a `/flaky/<how>/…` request gets.
enum Misbehaviour {
    Status(u16),
    Grpc(u32),
    Reset,
    Sleep,
    Answer,
    CloseAfter,
}

/// `how` for the `seen`-th sight of the path.
fn misbehaviour(how: &str, seen: u32) -> Misbehaviour {
    let number = |prefix: &str| how.strip_prefix(prefix).and_then(|n| n.parse::<u32>().ok());
    if how == "503" {
        return Misbehaviour::Status(503);
    }
    if let Some(n) = number("503x") {
        return if seen <= n {
            Misbehaviour::Status(503)
        } else {
            Misbehaviour::Answer
        };
    }
    if let Some(code) = number("status").and_then(|c| u16::try_from(c).ok()) {
        return Misbehaviour::Status(code);
    }
    if let Some(code) = number("grpc") {
        return Misbehaviour::Grpc(code);
    }
    match how {
        "reset" => Misbehaviour::Reset,
        "slow" => Misbehaviour::Sleep,
        "slow-once" if seen == 1 => Misbehaviour::Sleep,
        "close" => Misbehaviour::CloseAfter,
        _ => Misbehaviour::Answer,
    }
}

/// One request as the backend read it.
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
}

fn parse(head: &[u8]) -> io::Result<Request> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(path)) = (parts.next(), parts.next()) else {
        return Err(io::Error::other(format!("bad request line {line:?}")));
    };
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Request {
        method: method.to_string(),
        path: path.to_string(),
        headers,
    })
}

fn serve(mut stream: TcpStream, name: &str, state: &State) -> io::Result<()> {
    for _ in 0..MAX_REQUESTS_PER_CONNECTION {
        let head = match read_request_head(&mut stream) {
            Ok(head) => head,
            // The client closed between requests: the normal end of a keep-alive connection.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        let req = parse(&head)?;
        let header = |n: &str| {
            req.headers
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.as_str())
        };
        if let Some(len) = header("content-length").and_then(|l| l.parse::<u64>().ok()) {
            io::copy(&mut (&stream).take(len.min(MAX_BODY)), &mut io::sink())?;
        }
        let count = |path: &str, add: u32| {
            let mut seen = state.seen.lock().unwrap_or_else(PoisonError::into_inner);
            let n = seen.entry(path.to_string()).or_insert(0);
            *n += add;
            *n
        };
        let mut seen_header = String::new();
        let mut close_after = false;
        if let Some(rest) = req.path.strip_prefix("/flaky/") {
            let seen = count(&req.path, 1);
            seen_header = format!("{SEEN_HEADER}: {seen}\r\n");
            match misbehaviour(rest.split('/').next().unwrap_or_default(), seen) {
                Misbehaviour::Status(code) => {
                    stream.write_all(
                        format!(
                            "HTTP/1.1 {code} Failing\r\ncontent-length: 4\r\n{seen_header}\r\nfail"
                        )
                        .as_bytes(),
                    )?;
                    continue;
                }
                Misbehaviour::Grpc(code) => {
                    stream.write_all(
                        format!("HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ngrpc-status: {code}\r\ncontent-length: 0\r\n{seen_header}\r\n")
                            .as_bytes(),
                    )?;
                    continue;
                }
                Misbehaviour::Reset => return reset(stream),
                Misbehaviour::Sleep => std::thread::sleep(SLOW),
                Misbehaviour::CloseAfter => close_after = true,
                Misbehaviour::Answer => {}
            }
        } else if let Some(rest) = req.path.strip_prefix("/seen/") {
            seen_header = format!("{SEEN_HEADER}: {}\r\n", count(&format!("/{rest}"), 0));
        }
        if req.path.starts_with("/reset-once") && !state.reset_done.swap(true, Ordering::SeqCst) {
            return reset(stream);
        }
        if req.path.starts_with("/503-once")
            && state
                .unavailable_done
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(req.path.clone())
        {
            stream.write_all(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\nx-backend-failed: 1\r\n\r\ndown",
            )?;
            continue;
        }
        if name.starts_with("failing") {
            let failed = format!(
                "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 6\r\nx-backend: {name}\r\n\r\nfailed"
            );
            stream.write_all(failed.as_bytes())?;
            continue;
        }
        if req.path.starts_with("/slow") {
            std::thread::sleep(SLOW);
        }
        let mut seen = Map::new();
        for (k, v) in &req.headers {
            // A repeated header is seen as its values joined, as HTTP allows.
            let joined = match seen.get(k).and_then(Value::as_str) {
                Some(before) => format!("{before},{v}"),
                None => v.clone(),
            };
            seen.insert(k.clone(), Value::String(joined));
        }
        let body =
            json!({"backend": name, "method": req.method, "path": req.path, "headers": seen})
                .to_string();
        let close = header("connection").is_some_and(|c| c.eq_ignore_ascii_case("close"));
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             x-backend: {name}\r\n{SECRET_HEADER}: {name}\r\n{seen_header}{}\r\n{body}",
            body.len(),
            if close { "Connection: close\r\n" } else { "" },
        );
        stream.write_all(response.as_bytes())?;
        if close {
            return Ok(());
        }
        if close_after {
            std::thread::sleep(CLOSE_AFTER);
            return Ok(());
        }
    }
    Ok(())
}

/// Close with a TCP reset (linger zero), as a crashing server's kernel would.
fn reset(stream: TcpStream) -> io::Result<()> {
    socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO))?;
    drop(stream);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_request_line_and_lowercases_header_names() {
        let r = parse(b"GET /a?b=c HTTP/1.1\r\nHost: x\r\nX-Y: 1\r\n\r\n").expect("parse");
        assert_eq!((r.method.as_str(), r.path.as_str()), ("GET", "/a?b=c"));
        assert_eq!(
            r.headers,
            [("host".into(), "x".into()), ("x-y".into(), "1".into())]
        );
    }
}
