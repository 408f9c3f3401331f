//! Peers: small std-thread servers, clients whose sockets live in a namespace, and `curl`.
//!
//! Servers answer plain HTTP, echo, or send a paced download; each records the address every
//! connection came from, which is how a test sees what the proxy did to the source.

use crate::netns::Netns;
use crate::process::run_bounded;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bound on any one read or write by a server or a client.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a server keeps accepting; a test still running by then has hung anyway.
const SERVER_LIFETIME: Duration = Duration::from_secs(120);
/// How long an idle accept loop sleeps before looking again.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
/// Largest HTTP request head a server reads, and largest response a client reads.
const MAX_HTTP_MESSAGE: u64 = 16 << 20;
/// Read buffer of the echo server and of clients.
const BUFFER_SIZE: usize = 64 << 10;

/// A TCP server on its own thread inside a namespace; stops accepting on drop.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    accept_thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Bind `addr` in `ns` and run `handler` on a thread per accepted connection.
    pub fn start<H>(ns: &Netns, addr: SocketAddr, handler: H) -> Server
    where
        H: Fn(TcpStream) -> io::Result<()> + Send + Sync + 'static,
    {
        let listener = ns
            .bind(addr)
            .unwrap_or_else(|e| panic!("bind {addr} in {}: {e}", ns.name()));
        // Non-blocking so the loop can notice `stop`; std has no way to interrupt `accept`.
        listener
            .set_nonblocking(true)
            .expect("make the listener non-blocking");
        let stop = Arc::new(AtomicBool::new(false));
        let peers = Arc::new(Mutex::new(Vec::new()));
        let accept_thread = {
            let (stop, peers, handler) = (stop.clone(), peers.clone(), Arc::new(handler));
            std::thread::spawn(move || accept_loop(listener, &stop, &peers, handler))
        };
        Server {
            addr,
            stop,
            peers,
            accept_thread: Some(accept_thread),
        }
    }

    /// An HTTP/1.1 server answering every request `200 OK` with `body`, then closing.
    pub fn http(ns: &Netns, addr: SocketAddr, body: &str) -> Server {
        let body = body.to_string();
        Server::start(ns, addr, move |mut stream| {
            read_request_head(&mut stream)?;
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(response.as_bytes())
        })
    }

    /// A server that echoes everything and half-closes after the client half-closes.
    pub fn echo(ns: &Netns, addr: SocketAddr) -> Server {
        Server::start(ns, addr, |mut stream| {
            let mut buf = vec![0; BUFFER_SIZE];
            // Bounded by volume: a test sends at most a few hundred megabytes.
            for _ in 0..(1 << 20) {
                let n = stream.read(&mut buf)?;
                if n == 0 {
                    return stream.shutdown(Shutdown::Write);
                }
                stream.write_all(&buf[..n])?;
            }
            Err(io::Error::other("echo: too much data"))
        })
    }

    /// A server that sends `data` to each client in equal slices spread over `duration`, then
    /// closes: a download slow enough to still be in flight when a test acts.
    pub fn paced(ns: &Netns, addr: SocketAddr, data: Arc<[u8]>, duration: Duration) -> Server {
        const SLICES: u32 = 50;
        Server::start(ns, addr, move |mut stream| {
            let slice = data.len().div_ceil(SLICES as usize).max(1);
            for chunk in data.chunks(slice) {
                stream.write_all(chunk)?;
                std::thread::sleep(duration / SLICES);
            }
            stream.shutdown(Shutdown::Write)
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The source address of every connection accepted so far, in order.
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
    }
}

fn accept_loop<H>(
    listener: TcpListener,
    stop: &AtomicBool,
    peers: &Mutex<Vec<SocketAddr>>,
    handler: Arc<H>,
) where
    H: Fn(TcpStream) -> io::Result<()> + Send + Sync + 'static,
{
    let deadline = Instant::now() + SERVER_LIFETIME;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(ACCEPT_POLL);
                continue;
            }
            Err(e) => {
                eprintln!("server: accept: {e}");
                std::thread::sleep(ACCEPT_POLL);
                continue;
            }
        };
        peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(peer);
        let handler = handler.clone();
        // Connection threads are not joined: socket timeouts bound them.
        std::thread::spawn(move || {
            let result = set_timeouts(&stream)
                .and_then(|()| stream.set_nonblocking(false))
                .and_then(|()| handler(stream));
            if let Err(e) = result {
                eprintln!("server: connection from {peer}: {e}");
            }
        });
    }
}

fn set_timeouts(stream: &TcpStream) -> io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))
}

/// Read up to the end of an HTTP request head (`\r\n\r\n`).
pub fn read_request_head(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() as u64 >= MAX_HTTP_MESSAGE {
            return Err(io::Error::other("request head too large"));
        }
        if stream.read(&mut byte)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed inside the request head",
            ));
        }
        head.push(byte[0]);
    }
    Ok(head)
}

/// A TCP connection from inside `ns` with read and write timeouts set.
pub fn connect(ns: &Netns, addr: SocketAddr) -> io::Result<TcpStream> {
    let stream = ns.connect(addr, IO_TIMEOUT)?;
    set_timeouts(&stream)?;
    Ok(stream)
}

/// An HTTP response as read by [`http_get`].
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub body: String,
}

/// `GET path` over HTTP/1.0 from inside `ns` (one request per connection, no chunking), every
/// step bounded by `timeout`.
pub fn http_get(
    ns: &Netns,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> io::Result<HttpResponse> {
    let mut stream = ns.connect(addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.take(MAX_HTTP_MESSAGE).read_to_end(&mut raw)?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> io::Result<HttpResponse> {
    let invalid = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{what}: {:?}",
                String::from_utf8_lossy(&raw[..raw.len().min(200)])
            ),
        )
    };
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| invalid("no end of response head"))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid("no status code"))?;
    Ok(HttpResponse {
        status,
        body: String::from_utf8_lossy(&raw[split + 4..]).into_owned(),
    })
}

/// An address on every interface of the namespace a server binds it in.
pub fn any_addr(port: u16) -> SocketAddr {
    SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port))
}

/// The body curl printed; panics naming `what`, with curl's stderr, if curl failed.
pub fn curl_ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: curl failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// curl inside `ns` with `args`; returns the HTTP status code and the body.
pub fn curl_status(ns: &Netns, args: &[&str], max_time: Duration) -> (u16, String) {
    let mut all = vec!["--write-out", "\n%{http_code}"];
    all.extend_from_slice(args);
    let out = curl(ns, &all, max_time);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// Run `curl ARGS` inside `ns`, bounded by `max_time` (`curl --max-time`, and a kill a little
/// later should curl itself hang).
pub fn curl(ns: &Netns, args: &[&str], max_time: Duration) -> Output {
    let mut cmd = ns.command("curl");
    cmd.args(["--silent", "--show-error", "--max-time"])
        .arg(format!("{}", max_time.as_secs_f64()))
        .args(args);
    run_bounded(&mut cmd, max_time + Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("curl {args:?}: {e}"))
}

/// Send `data` from inside `ns` to an echo server at `addr`, half-close, and return everything
/// read back until the server closes. Writing and reading run at once, as a real client's would.
pub fn echo_exchange(ns: &Netns, addr: SocketAddr, data: &[u8]) -> io::Result<Vec<u8>> {
    let stream = connect(ns, addr)?;
    let mut writer = stream.try_clone()?;
    std::thread::scope(|scope| {
        let sending = scope.spawn(move || {
            writer.write_all(data)?;
            writer.shutdown(Shutdown::Write)
        });
        let mut received = Vec::with_capacity(data.len());
        let read = (&stream).read_to_end(&mut received);
        let sent = sending
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        sent.and(read).map(|_| received)
    })
}

/// Deterministic bytes in which every position differs from its neighbours' pattern, so a lost,
/// repeated or reordered block shows up as a mismatch.
pub fn pattern(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x9E37_79B9;
    (0..len)
        .map(|_| {
            // xorshift32
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

/// Assert two byte strings are equal, reporting lengths and the first difference instead of
/// printing megabytes.
pub fn assert_same_bytes(what: &str, expected: &[u8], actual: &[u8]) {
    if expected == actual {
        return;
    }
    let first_difference = expected
        .iter()
        .zip(actual)
        .position(|(a, b)| a != b)
        .unwrap_or(expected.len().min(actual.len()));
    panic!(
        "{what}: expected {} bytes, got {}; first difference at offset {first_difference}",
        expected.len(),
        actual.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_response_head_and_body() {
        let r = parse_response(b"HTTP/1.1 503 Service Unavailable\r\nA: b\r\n\r\ndraining")
            .expect("parse");
        assert_eq!(r.status, 503);
        assert_eq!(r.body, "draining");
    }

    #[test]
    fn refuses_a_response_without_a_head() {
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
    }

    #[test]
    fn pattern_is_deterministic_and_not_periodic_in_small_blocks() {
        let p = pattern(1 << 16);
        assert_eq!(p, pattern(1 << 16));
        assert_ne!(p[..4096], p[4096..8192]);
    }
}
