//! The fast path against real loopback sockets: a client written byte by byte and upstreams
//! that answer from a script, so every framing and failure can be had on demand.

use super::*;
use crate::detect::HttpVersion;
use crate::proxy::Proxy;
use crate::tls::stream::Downstream;
use remora_config::Config;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

#[test]
fn numbers_are_written_in_decimal() {
    for n in [0u32, 7, 10, 4096, u32::MAX] {
        assert_eq!(itoa_u32(n, &mut [0u8; 10]), n.to_string());
    }
}

/// What an upstream does with one request.
#[derive(Clone)]
enum Answer {
    /// Write these bytes and keep the connection.
    Reply(&'static [u8]),
    /// Write these bytes and close the connection.
    ReplyAndClose(&'static [u8]),
    /// Write these bytes, then close the connection a little later, while it is idle.
    ReplyThenCloseIdle(&'static [u8]),
    /// Never answer.
    Silence,
}

/// A request as the upstream received it, and on which of its connections (from 0).
#[derive(Debug)]
struct Seen {
    conn: usize,
    head: String,
    body: Vec<u8>,
}

/// An upstream answering requests in order from `answers` (the last one repeats).
async fn upstream(answers: Vec<Answer>) -> (SocketAddr, mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let answers = Arc::new(std::sync::Mutex::new(
            answers.into_iter().collect::<Vec<_>>(),
        ));
        let mut conn = 0;
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let (tx, answers) = (tx.clone(), Arc::clone(&answers));
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some((head, body)) = read_message(&mut s, &mut buf).await else {
                        return;
                    };
                    let _ = tx.send(Seen { conn, head, body });
                    let answer = {
                        let mut a = answers.lock().unwrap();
                        if a.len() > 1 {
                            a.remove(0)
                        } else {
                            a[0].clone()
                        }
                    };
                    match answer {
                        Answer::Reply(b) => s.write_all(b).await.unwrap(),
                        Answer::ReplyAndClose(b) => {
                            s.write_all(b).await.unwrap();
                            return;
                        }
                        Answer::ReplyThenCloseIdle(b) => {
                            s.write_all(b).await.unwrap();
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            return;
                        }
                        Answer::Silence => std::future::pending::<()>().await,
                    }
                }
            });
            conn += 1;
        }
    });
    (addr, rx)
}

/// One request (head and content-length body) from `s`; `None` at EOF.
async fn read_message(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8(buf[..end + 4].to_vec()).unwrap();
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let body = buf[end + 4..end + 4 + len].to_vec();
                buf.drain(..end + 4 + len);
                return Some((head, body));
            }
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn proxy(config: Config) -> Arc<Proxy> {
    Proxy::for_tests(config)
}

/// A client connection served by the HTTP path toward `destination`, outbound.
async fn client(proxy: &Arc<Proxy>, destination: SocketAddr) -> TcpStream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (stream, peer) = listener.accept().await.unwrap();
    let downstream = (Downstream::Plain(stream), None);
    spawn_served(
        Arc::clone(proxy),
        downstream,
        peer,
        Direction::Outbound,
        destination,
    );
    client
}

/// Serve `downstream` (with the client sidecar's identity when mesh TLS was terminated on it)
/// on the HTTP path toward `destination`, in a task of its own.
fn spawn_served(
    proxy: Arc<Proxy>,
    (downstream, mesh_peer): (Downstream, Option<crate::tls::Peer>),
    peer: SocketAddr,
    direction: Direction,
    destination: SocketAddr,
) {
    let config = proxy.config.load_full();
    tokio::spawn(super::super::serve(
        proxy,
        config,
        super::super::Connection {
            downstream,
            mesh_peer: mesh_peer.map(Arc::new),
            peer,
            direction,
            destination,
            source: None,
            connect_timeout: Duration::from_secs(1),
            version: HttpVersion::Http1,
            prefix: BytesMut::new(),
            early: None,
            originate: None,
            xds_routes: None,
            xds_chain: Default::default(),
            xds_inbound: None,
        },
    ));
}

/// Read one response (content-length or chunked framing, or to EOF) from `s`.
async fn response<S: AsyncRead + Unpin>(s: &mut S, buf: &mut Vec<u8>) -> String {
    let read = async {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end + 4]).to_ascii_lowercase();
                let body_end = if let Some(len) = head.lines().find_map(|l| {
                    l.strip_prefix("content-length: ")
                        .map(|v| v.parse::<usize>().unwrap())
                }) {
                    (buf.len() >= end + 4 + len).then_some(end + 4 + len)
                } else if head.contains("transfer-encoding: chunked") {
                    // The last chunk and the trailers end in a blank line.
                    buf[end + 4..]
                        .windows(4)
                        .position(|w| w == b"\r\n\r\n")
                        .map(|p| end + 4 + p + 4)
                } else {
                    None
                };
                if let Some(body_end) = body_end {
                    let r = String::from_utf8_lossy(&buf[..body_end]).into_owned();
                    buf.drain(..body_end);
                    return r;
                }
            }
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.unwrap();
            if n == 0 {
                let r = String::from_utf8_lossy(buf).into_owned();
                buf.clear();
                return r;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("a response in time")
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";

#[tokio::test]
async fn requests_go_upstream_with_the_mesh_headers_on_one_pooled_connection() {
    let (addr, mut seen) = upstream(vec![Answer::Reply(OK)]).await;
    let proxy = proxy(Config::default());
    let mut c = client(&proxy, addr).await;
    let mut buf = Vec::new();
    for _ in 0..2 {
        c.write_all(b"GET /x HTTP/1.1\r\nhost: svc\r\nconnection: keep-alive\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(
            response(&mut c, &mut buf).await,
            String::from_utf8_lossy(OK)
        );
    }
    let (a, b) = (seen.recv().await.unwrap(), seen.recv().await.unwrap());
    assert_eq!((a.conn, b.conn), (0, 0), "one upstream connection for both");
    assert!(
        a.head.starts_with("GET /x HTTP/1.1\r\nhost: svc\r\n"),
        "{}",
        a.head
    );
    assert!(
        !a.head.to_ascii_lowercase().contains("connection:"),
        "{}",
        a.head
    );
    assert!(a.head.contains("x-forwarded-proto: http\r\n"), "{}", a.head);
    assert!(
        a.head.contains("x-envoy-attempt-count: 1\r\n"),
        "{}",
        a.head
    );
    let id = a
        .head
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id: "))
        .unwrap();
    assert_eq!(id.len(), 36);
    // A POST body goes along with its head.
    c.write_all(b"POST /p HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\n\r\nabc")
        .await
        .unwrap();
    assert!(response(&mut c, &mut buf).await.starts_with("HTTP/1.1 200"));
    assert_eq!(seen.recv().await.unwrap().body, b"abc");
}

#[tokio::test]
async fn chunked_responses_pass_whole_and_close_delimited_ones_close_the_client() {
    let chunked: &[u8] =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nx-t: 1\r\n\r\n";
    let (addr, _seen) = upstream(vec![
        Answer::Reply(chunked),
        Answer::ReplyAndClose(b"HTTP/1.1 200 OK\r\n\r\nuntil close"),
    ])
    .await;
    let proxy = proxy(Config::default());
    let mut c = client(&proxy, addr).await;
    let mut buf = Vec::new();
    c.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let r = response(&mut c, &mut buf).await;
    assert!(r.ends_with("5\r\nhello\r\n0\r\nx-t: 1\r\n\r\n"), "{r}");
    c.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let r = response(&mut c, &mut buf).await;
    assert!(r.contains("connection: close\r\n"), "{r}");
    assert!(r.ends_with("\r\n\r\nuntil close"), "{r}");
}

#[tokio::test]
async fn a_503_is_retried_with_the_attempt_count() {
    let (addr, mut seen) = upstream(vec![
        Answer::Reply(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"),
        Answer::Reply(OK),
    ])
    .await;
    let mut config = Config::default();
    config.http.retry_backoff = Duration::from_millis(1);
    let proxy = proxy(config);
    let mut c = client(&proxy, addr).await;
    c.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    assert!(response(&mut c, &mut Vec::new()).await.ends_with("hello"));
    let (a, b) = (seen.recv().await.unwrap(), seen.recv().await.unwrap());
    assert!(a.head.contains("x-envoy-attempt-count: 1\r\n"));
    assert!(b.head.contains("x-envoy-attempt-count: 2\r\n"));
    assert_ne!(a.conn, b.conn, "the 503's connection is not reused");
}

#[tokio::test]
async fn a_pooled_connection_the_server_closed_is_replaced() {
    let (addr, mut seen) = upstream(vec![Answer::ReplyThenCloseIdle(OK)]).await;
    let proxy = proxy(Config::default());
    let mut c = client(&proxy, addr).await;
    let mut buf = Vec::new();
    c.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    assert!(response(&mut c, &mut buf).await.ends_with("hello"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    assert!(response(&mut c, &mut buf).await.ends_with("hello"));
    let (a, b) = (seen.recv().await.unwrap(), seen.recv().await.unwrap());
    assert_eq!((a.conn, b.conn), (0, 1));
}

#[tokio::test]
async fn unanswered_requests_get_envoys_local_replies() {
    // Nothing listens: 503 UF after the retries.
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let mut config = Config::default();
    config.http.retry_backoff = Duration::from_millis(1);
    let p = proxy(config);
    let mut c = client(&p, closed).await;
    let mut buf = Vec::new();
    c.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let r = response(&mut c, &mut buf).await;
    assert!(r.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{r}");
    assert!(
        r.ends_with("retried and the latest reset reason: remote connection failure"),
        "{r}"
    );
    let date = r
        .lines()
        .find_map(|l| l.strip_prefix("date: "))
        .unwrap_or_else(|| panic!("no date header: {r}"));
    let age = std::time::SystemTime::now()
        .duration_since(httpdate::parse_http_date(date).expect("an HTTP date"))
        .unwrap_or_default();
    assert!(age < Duration::from_secs(60), "{date}");
    // The connection stays usable.
    c.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    assert!(response(&mut c, &mut buf).await.starts_with("HTTP/1.1 503"));

    // An upstream that never answers: 504 after http.request_timeout.
    let (addr, _seen) = upstream(vec![Answer::Silence]).await;
    let mut config = Config::default();
    config.http.request_timeout = Duration::from_millis(100);
    let p = proxy(config);
    let mut c = client(&p, addr).await;
    c.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let r = response(&mut c, &mut Vec::new()).await;
    assert!(r.starts_with("HTTP/1.1 504 Gateway Timeout\r\n"), "{r}");

    // An upstream that answers nonsense: 502.
    let (addr, _seen) = upstream(vec![Answer::Reply(b"NOT HTTP\r\n\r\n")]).await;
    let p = proxy(Config::default());
    let mut c = client(&p, addr).await;
    c.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let r = response(&mut c, &mut Vec::new()).await;
    assert!(r.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{r}");
}

#[tokio::test]
async fn a_request_the_fast_path_does_not_serve_hands_the_connection_to_hyper() {
    let (addr, mut seen) = upstream(vec![Answer::Reply(OK)]).await;
    let proxy = proxy(Config::default());
    let mut c = client(&proxy, addr).await;
    let mut buf = Vec::new();
    // A plain GET, then a POST whose body comes in two writes, with a GET pipelined behind
    // it: the first is the fast path's, the rest hyper's, from the bytes the fast path read.
    c.write_all(b"GET /1 HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    assert!(response(&mut c, &mut buf).await.ends_with("hello"));
    c.write_all(b"POST /2 HTTP/1.1\r\nhost: a\r\ncontent-length: 6\r\n\r\nabc")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.write_all(b"defGET /3 HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    assert!(response(&mut c, &mut buf).await.ends_with("hello"));
    assert!(response(&mut c, &mut buf).await.ends_with("hello"));
    let heads: Vec<Seen> = vec![
        seen.recv().await.unwrap(),
        seen.recv().await.unwrap(),
        seen.recv().await.unwrap(),
    ];
    assert!(heads[0].head.starts_with("GET /1 "));
    assert!(heads[1].head.starts_with("POST /2 "));
    assert_eq!(heads[1].body, b"abcdef");
    assert!(heads[2].head.starts_with("GET /3 "));
    // Still one request per request in the metrics, whichever path served it.
    let text = proxy.metrics.encode();
    let total: f64 = text
        .lines()
        .filter(|l| l.starts_with("istio_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(total, 3.0, "{text}");
}

/// A connection's context and its server-side socket, for futures that are measured and not
/// run; the client end and the upstream's record of requests are kept alive beside them.
async fn context() -> (
    Arc<ConnContext>,
    TcpStream,
    TcpStream,
    mpsc::UnboundedReceiver<Seen>,
) {
    let (addr, seen) = upstream(vec![Answer::Reply(OK)]).await;
    let proxy = proxy(Config::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (stream, peer) = listener.accept().await.unwrap();
    let ctx = Arc::new(ConnContext::for_tests(Arc::clone(&proxy), addr, peer));
    (ctx, stream, client, seen)
}

#[tokio::test]
async fn the_fast_path_future_stays_small() {
    let (ctx, mut stream, _client, _seen) = context().await;
    let fut = serve(&ctx, &mut stream, BytesMut::new(), None);
    let size = std::mem::size_of_val(&fut);
    eprintln!("fast path future: {size} bytes");
    assert!(size <= 1024, "fast path future is {size} bytes");
}

/// A request's state is boxed per request: its size is copied and allocated each time, and
/// glibc's per-thread cache takes blocks only up to 1,032 bytes. The connect (a TLS handshake
/// for mesh destinations) and a configured timeout are boxed apart, and the functions it is
/// made of do not keep a second copy of their arguments, so none of that sets its size.
#[tokio::test]
async fn a_requests_state_is_small_enough_for_the_allocators_cache() {
    let (ctx, mut stream, _client, _seen) = context().await;
    let limits = limits_for(&ctx, None);
    let bytes = b"GET / HTTP/1.1\r\nhost: a\r\n\r\n";
    let prepared = prepare(&ctx, bytes, &limits, None).expect("the fast path serves it");
    let mut early = None;
    let fut = request(&ctx, &mut stream, bytes, prepared, &mut early);
    let size = std::mem::size_of_val(&fut);
    eprintln!("a request's state: {size} bytes");
    // 1,008 bytes in a release build and 1,040 in this one before xDS routing (its route
    // and attempt key live in a box beside the state, one pointer in it), 1,056 in both with
    // it, which took every request's state past the cache (glibc's own allocator then: about
    // 300 instructions more per request); 1,016 since hyper's pooled connection is boxed in
    // `RequestEnd` and the routed request's end is inline. 2,984 with the connect and the
    // timer inline, 1,448 with them apart but as `async fn`s.
    assert!(size <= 1032, "a request's state is {size} bytes");
}

#[tokio::test]
async fn a_client_that_asks_to_close_is_told_so_and_closed_while_the_upstream_is_pooled() {
    let (addr, mut seen) = upstream(vec![Answer::Reply(OK)]).await;
    let proxy = proxy(Config::default());
    let mut c = client(&proxy, addr).await;
    c.write_all(b"GET / HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let r = response(&mut c, &mut buf).await;
    assert!(r.contains("connection: close\r\n"), "{r}");
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut rest)).await;
    assert!(
        matches!(n, Ok(Ok(0))),
        "the client's connection ends: {n:?}"
    );
    let s = seen.recv().await.unwrap();
    assert!(
        !s.head.to_ascii_lowercase().contains("connection"),
        "{}",
        s.head
    );
    assert_eq!(
        proxy.h1.pool.idle_count(),
        1,
        "the upstream connection stays for others"
    );
}

#[tokio::test]
async fn a_body_that_starts_malformed_is_answered_502_and_not_passed_on() {
    let (addr, _seen) = upstream(vec![Answer::Reply(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nsecret",
    )])
    .await;
    let proxy = proxy(Config::default());
    let mut c = client(&proxy, addr).await;
    c.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let r = response(&mut c, &mut Vec::new()).await;
    assert!(r.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{r}");
    assert!(!r.contains("secret"), "{r}");
    assert_eq!(
        proxy.h1.pool.idle_count(),
        0,
        "the connection is not pooled"
    );
}

mod mesh_tls;
mod routed;
mod stale;
use stale::{make_readiness_stale, served_until_idle};

#[tokio::test]
async fn a_request_without_host_is_answered_400_and_never_forwarded() {
    let (addr, mut seen) = upstream(vec![Answer::Reply(OK)]).await;
    let proxy = proxy(Config::default());
    let mut c = client(&proxy, addr).await;
    c.write_all(b"GET /no-host HTTP/1.1\r\naccept: */*\r\n\r\n")
        .await
        .unwrap();
    let r = response(&mut c, &mut Vec::new()).await;
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");
    assert!(seen.try_recv().is_err(), "the upstream saw the request");
}

#[tokio::test]
async fn refused_heads_are_answered_with_envoys_status_text_and_closed() {
    for (head, status, body) in [
        (
            &b"GET / HTTP/1.1\r\nhost: a\r\nfoo bar\r\n\r\n"[..],
            "400 Bad Request",
            "Bad Request",
        ),
        (
            b"GET / HTTP/1.1\r\nhost: a\r\nx: a\x01b\r\n\r\n",
            "400 Bad Request",
            "Bad Request",
        ),
    ] {
        let (addr, mut seen) = upstream(vec![Answer::Reply(b"HTTP/1.1 200 OK\r\n\r\n")]).await;
        let p = proxy(Config::default());
        let mut c = client(&p, addr).await;
        c.write_all(head).await.unwrap();
        let mut all = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut all))
            .await
            .expect("the connection is closed after the answer")
            .unwrap();
        let r = String::from_utf8_lossy(&all);
        assert!(r.starts_with(&format!("HTTP/1.1 {status}\r\n")), "{r}");
        assert!(r.contains("\r\nconnection: close\r\n"), "{r}");
        assert!(r.contains("\r\ncontent-type: text/plain\r\n"), "{r}");
        assert!(r.ends_with(&format!("\r\n\r\n{body}")), "{r}");
        assert!(seen.try_recv().is_err(), "the upstream saw the request");
    }
}
