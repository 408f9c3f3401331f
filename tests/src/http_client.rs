//! A minimal HTTP/1.1 client for the routing tests: one connection made from inside a
//! namespace (so the capture rules apply to it), requests sent on it one after another
//! (keep-alive), each response read whole by its `Content-Length`, chunks, or the close. It
//! keeps every response header, which curl's output would make a test parse.

use crate::netns::Netns;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};

/// Largest response body read.
const MAX_BODY: u64 = 16 << 20;
/// Most header lines read in one response head.
const MAX_HEADERS: usize = 200;

/// A response as read.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Names lowercased, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A client connection.
#[derive(Debug)]
pub struct Client {
    reader: BufReader<TcpStream>,
}

impl Client {
    /// Connect from inside `ns`, every read and write bounded by [`crate::peer::IO_TIMEOUT`].
    pub fn connect(ns: &Netns, addr: SocketAddr) -> io::Result<Client> {
        let stream = crate::peer::connect(ns, addr)?;
        Ok(Client {
            reader: BufReader::new(stream),
        })
    }

    /// The connection, to read what follows a response (its end, when the server closed it).
    pub fn into_inner(self) -> TcpStream {
        self.reader.into_inner()
    }

    /// `GET path` with `Host: host` and `headers`, and its response.
    pub fn get(
        &mut self,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> io::Result<Response> {
        let mut head = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n");
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        self.send_raw(head.as_bytes())
    }

    /// Send `request` as it is (a test's malformed or unusual request) and read a response.
    pub fn send_raw(&mut self, request: &[u8]) -> io::Result<Response> {
        self.reader.get_mut().write_all(request)?;
        self.read_response()
    }

    fn read_response(&mut self) -> io::Result<Response> {
        read_response(&mut self.reader)
    }
}

/// The response at the start of `bytes` (what a TLS client such as `openssl s_client` printed).
pub fn parse_response(bytes: &[u8]) -> io::Result<Response> {
    read_response(&mut BufReader::new(bytes))
}

/// One response read from `reader`.
fn read_response(reader: &mut impl BufRead) -> io::Result<Response> {
    let status_line = read_line(reader)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line {status_line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let line = read_line(reader)?;
        if line.is_empty() {
            break;
        }
        if headers.len() >= MAX_HEADERS {
            return Err(io::Error::other("too many response headers"));
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let find = |n: &str| {
        headers
            .iter()
            .find(|(k, _): &&(String, String)| k == n)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if find("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        loop {
            let size = read_line(reader)?;
            let size = u64::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|e| io::Error::other(format!("chunk size {size:?}: {e}")))?;
            if size == 0 {
                while !read_line(reader)?.is_empty() {}
                break;
            }
            if body.len() as u64 + size > MAX_BODY {
                return Err(io::Error::other("response body too large"));
            }
            reader.take(size).read_to_end(&mut body)?;
            read_line(reader)?;
        }
    } else if let Some(len) = find("content-length") {
        let len: u64 = len
            .parse()
            .map_err(|e| io::Error::other(format!("content-length {len:?}: {e}")))?;
        reader.take(len.min(MAX_BODY)).read_to_end(&mut body)?;
    } else if status != 204 && status != 304 {
        reader.take(MAX_BODY).read_to_end(&mut body)?;
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before the response",
        ));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

/// One request on a connection of its own.
pub fn get_once(
    ns: &Netns,
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> io::Result<Response> {
    let mut client = Client::connect(ns, addr)?;
    let mut all = headers.to_vec();
    all.push(("connection", "close"));
    client.get(host, path, &all)
}
