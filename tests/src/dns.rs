//! A tiny authoritative DNS server for the peer namespace, and `dig` run inside a namespace.
//!
//! The server answers every `A` query with one fixed address, over UDP and TCP on port 53. A
//! name starting with `big.` is answered over UDP with the TC flag and no records, so a client
//! must retry over TCP to get the address. Every query is recorded with its transport and the
//! address it came from, which is how a test sees what reached the resolver.

use crate::netns::Netns;
use crate::process::run_bounded;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The address every `A` answer carries (TEST-NET-2).
pub const ANSWER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
/// Longest a server keeps serving; a test still running by then has hung anyway.
const SERVER_LIFETIME: Duration = Duration::from_secs(120);
/// How often the serving loops look at the stop flag.
const POLL: Duration = Duration::from_millis(20);
/// Bound on reading one query from a TCP client.
const TCP_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How a query reached the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// One query the server received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub transport: Transport,
    pub from: SocketAddr,
    pub name: String,
}

/// A DNS server on UDP and TCP port 53 of one address; stops on drop.
#[derive(Debug)]
pub struct DnsServer {
    addr: IpAddr,
    stop: Arc<AtomicBool>,
    queries: Arc<Mutex<Vec<Query>>>,
    threads: Vec<JoinHandle<()>>,
}

impl DnsServer {
    /// Serve on `addr:53` inside `ns`.
    pub fn start(ns: &Netns, addr: IpAddr) -> DnsServer {
        let at = SocketAddr::new(addr, 53);
        let (udp, tcp) = ns
            .enter(|| {
                let udp = UdpSocket::bind(at)?;
                udp.set_read_timeout(Some(POLL))?;
                let tcp = TcpListener::bind(at)?;
                tcp.set_nonblocking(true)?;
                Ok((udp, tcp))
            })
            .unwrap_or_else(|e| panic!("bind DNS on {at} in {}: {e}", ns.name()));
        let stop = Arc::new(AtomicBool::new(false));
        let queries = Arc::new(Mutex::new(Vec::new()));
        let threads = vec![
            {
                let (stop, queries) = (stop.clone(), queries.clone());
                std::thread::spawn(move || serve_udp(&udp, &stop, &queries))
            },
            {
                let (stop, queries) = (stop.clone(), queries.clone());
                std::thread::spawn(move || serve_tcp(&tcp, &stop, &queries))
            },
        ];
        DnsServer {
            addr,
            stop,
            queries,
            threads,
        }
    }

    /// The address it serves on (port 53).
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// Every query received so far, in order.
    pub fn queries(&self) -> Vec<Query> {
        self.queries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn serve_udp(socket: &UdpSocket, stop: &AtomicBool, queries: &Mutex<Vec<Query>>) {
    let deadline = Instant::now() + SERVER_LIFETIME;
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        let Some(name) = question_name(&buf[..n]) else {
            continue;
        };
        let truncate = name.starts_with("big.");
        record(queries, Transport::Udp, from, name);
        if let Some(answer) = answer(&buf[..n], truncate) {
            let _ = socket.send_to(&answer, from);
        }
    }
}

fn serve_tcp(listener: &TcpListener, stop: &AtomicBool, queries: &Mutex<Vec<Query>>) {
    let deadline = Instant::now() + SERVER_LIFETIME;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        match listener.accept() {
            Ok((stream, from)) => {
                // One query per connection is all a test sends; served inline.
                if let Err(e) = serve_tcp_client(stream, from, queries) {
                    eprintln!("dns server: TCP client {from}: {e}");
                }
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

fn serve_tcp_client(
    mut stream: TcpStream,
    from: SocketAddr,
    queries: &Mutex<Vec<Query>>,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(TCP_READ_TIMEOUT))?;
    stream.set_write_timeout(Some(TCP_READ_TIMEOUT))?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len)?;
    let mut query = vec![0; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut query)?;
    let name = question_name(&query).ok_or_else(|| io::Error::other("not a DNS query"))?;
    record(queries, Transport::Tcp, from, name);
    let answer = answer(&query, false).ok_or_else(|| io::Error::other("cannot answer"))?;
    let mut framed = u16::try_from(answer.len())
        .map_err(io::Error::other)?
        .to_be_bytes()
        .to_vec();
    framed.extend_from_slice(&answer);
    stream.write_all(&framed)
}

fn record(queries: &Mutex<Vec<Query>>, transport: Transport, from: SocketAddr, name: String) {
    queries
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Query {
            transport,
            from,
            name,
        });
}

/// The first question's name, dotted, and the offset just past the question.
fn question(query: &[u8]) -> Option<(String, usize)> {
    if query.len() < 12 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*query.get(at)?);
        if len == 0 {
            break;
        }
        let label = query.get(at + 1..at + 1 + len)?;
        labels.push(String::from_utf8_lossy(label).into_owned());
        at += 1 + len;
    }
    Some((labels.join("."), at + 1 + 4))
}

fn question_name(query: &[u8]) -> Option<String> {
    question(query).map(|(name, _)| name)
}

/// The answer to `query`: one `A` record with [`ANSWER`], or with `truncate` the TC flag and
/// no record.
fn answer(query: &[u8], truncate: bool) -> Option<Vec<u8>> {
    let (_, end) = question(query)?;
    let question = query.get(12..end)?;
    let mut a = query[..2].to_vec();
    let rd = query[2] & 0x01;
    a.push(0x84 | rd | if truncate { 0x02 } else { 0 }); // QR, AA
    a.push(0x00);
    let answers: u16 = if truncate { 0 } else { 1 };
    a.extend_from_slice(&[0, 1]);
    a.extend_from_slice(&answers.to_be_bytes());
    a.extend_from_slice(&[0, 0, 0, 0]);
    a.extend_from_slice(question);
    if !truncate {
        // The question's name by pointer, A, IN, TTL 60, four bytes of address.
        a.extend_from_slice(&[0xC0, 0x0C, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
        a.extend_from_slice(&ANSWER.octets());
    }
    Some(a)
}

/// Run `dig +short ARGS` inside `ns`, one try of at most `timeout` per transport, and return
/// its output.
pub fn dig(ns: &Netns, args: &[&str], timeout: Duration) -> Output {
    let mut cmd = ns.command("dig");
    cmd.args(["+short", "+tries=1"])
        .arg(format!("+time={}", timeout.as_secs().max(1)))
        .args(args);
    // A truncated answer costs two tries (UDP, then TCP).
    run_bounded(&mut cmd, timeout * 2 + Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("dig {args:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str) -> Vec<u8> {
        let mut q = vec![0xAB, 0xCD, 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in name.split('.') {
            q.push(l.len() as u8);
            q.extend_from_slice(l.as_bytes());
        }
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        q
    }

    #[test]
    fn answers_with_the_fixed_address_or_truncates() {
        let q = query("svc.example.org");
        assert_eq!(question_name(&q).as_deref(), Some("svc.example.org"));
        let a = answer(&q, false).unwrap();
        assert_eq!(&a[..2], &[0xAB, 0xCD]);
        assert_eq!(a[2] & 0x82, 0x80, "a response, not truncated");
        assert_eq!(&a[a.len() - 4..], &ANSWER.octets());
        let t = answer(&q, true).unwrap();
        assert_eq!(t[2] & 0x02, 0x02);
        assert_eq!(&t[6..8], &[0, 0]);
    }
}
