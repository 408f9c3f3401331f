use super::*;
use crate::connect;
use crate::loop_guard::LoopGuard;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::net::TcpStream;

fn http(v: HttpVersion) -> Option<Verdict> {
    Some(Verdict::Http(v))
}

#[test]
fn request_lines_are_http1() {
    for line in [
        &b"GET / HTTP/1.1\r\n"[..],
        b"POST /upload?x=1 HTTP/1.0\r\nHost: a\r\n\r\n",
        b"OPTIONS * HTTP/1.1\n",
        b"CONNECT example.com:443 HTTP/1.1\r\n",
        b"GET http://example.com/a HTTP/1.1\r\n",
        b"PROPFIND /dav HTTP/1.1\r\n",
        b"PURGE /cached HTTP/1.1\r\n",
        b"VERSION-CONTROL /x HTTP/1.1\r\n",
        // Runs of spaces, which Envoy's parser takes too.
        b"GET /a  HTTP/1.1\r\n",
        b"GET   /a HTTP/1.1\r\n",
    ] {
        assert_eq!(classify(line), http(HttpVersion::Http1), "{line:?}");
    }
}

#[test]
fn partial_request_lines_wait_for_more() {
    for partial in [
        &b"G"[..],
        b"GET",
        b"GET /",
        b"GET / HTTP/1",
        b"GET / HTTP/1.1\r",
        b"GET / HTTP/1.",
        b"GET / H",
        b"GET /a",
        b"PROP",
        b"UPDATEREDIRECT",
        b"UPDATEREDIRECTREF",
        b"UPDATEREDIRECTREF ",
        b"GET ",
        b"GET  ",
        b"GET /a  ",
        b"GET /a  HTTP/1.",
    ] {
        assert_eq!(classify(partial), None, "{partial:?}");
    }
}

#[test]
fn the_h2_preface_is_http2_and_its_start_waits() {
    assert_eq!(classify(H2_PREFACE), http(HttpVersion::Http2));
    assert_eq!(classify(&H2_PREFACE[..10]), None);
    let mut more = H2_PREFACE.to_vec();
    more.extend_from_slice(&[0, 0, 0, 4]);
    assert_eq!(classify(&more), http(HttpVersion::Http2));
}

#[test]
fn tls_and_other_bytes_are_opaque() {
    // A ClientHello is read whole (so its ALPN can be read); another handshake message is TLS
    // at once.
    assert_eq!(classify(&[0x16, 0x03, 0x01, 0x02, 0x00]), None);
    assert_eq!(
        classify(&[0x16, 0x03, 0x01, 0x00, 0x04, 0x02, 0x00, 0x00, 0x00]),
        Some(Verdict::Tls)
    );
    assert_eq!(classify(&[0x16]), None);
    for other in [
        &b"\x00\x00\x00\x01"[..],
        b"HELO example.com\r\n",
        b"GET / HTTP/2.0\r\n",
        b"GET /\ta HTTP/1.1\r\n",
        b"GET / HTTP/1.1 \r\n",
        b"GET / HTTP/1.1\rX",
        b"GET / HTTP/1.2\r\n",
        b"GET / HTTPS",
        b"SSH-2.0-OpenSSH_9.2\r\n",
        b"get\x01",
        // Words that could start a request line with an unregistered method: decided at once,
        // not after the detection timeout.
        b"before rotation",
        b"hello",
        b"get / HTTP/1.1\r\n",
        b"GETS / HTTP/1.1\r\n",
        b"BREW /pot HTTP/1.1\r\n",
        b" GET / HTTP/1.1\r\n",
        // Longer than any method, with no space: not a request line, however it goes on.
        b"UPDATEREDIRECTREFS",
        b"UPDATEREDIRECTREFS / HTTP/1.1\r\n",
    ] {
        assert_eq!(classify(other), Some(Verdict::Opaque), "{other:?}");
    }
}

#[test]
fn an_endless_request_line_is_opaque() {
    let mut line = b"GET /".to_vec();
    line.resize(MAX_DETECT_BYTES, b'a');
    assert_eq!(classify(&line), Some(Verdict::Opaque));
}

/// A client socket and the proxy's accepted end of it.
async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (accepted, _) = l.accept().await.unwrap();
    (client, accepted)
}

/// Detection on `downstream`, watching the server, while `addr` is dialled; the client gets
/// `client` to show what it speaks.
async fn detect_dialling(
    downstream: &mut TcpStream,
    addr: std::net::SocketAddr,
    client: Duration,
) -> Detection {
    detect_dialling_with(downstream, addr, wait(client)).await
}

/// Detection on `downstream`, watching the server, while `addr` is dialled, with `wait`.
async fn detect_dialling_with(
    downstream: &mut TcpStream,
    addr: std::net::SocketAddr,
    wait: Wait,
) -> Detection {
    let guard = LoopGuard::new(vec![]);
    let connecting = dial(addr, &guard);
    tokio::pin!(connecting);
    detect(downstream, connecting, wait, true).await
}

#[tokio::test]
async fn a_server_banner_decides_before_the_timeout_and_the_connection_is_kept() {
    let (_client, mut downstream) = pair().await;
    let addr = greeting_upstream().await;
    let started = std::time::Instant::now();
    let d = detect_dialling(&mut downstream, addr, Duration::from_secs(30)).await;
    assert_eq!(d.verdict, Verdict::ServerFirst);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(matches!(d.upstream, Some(Ok(_))));
    assert!(d.prefix.is_empty());
}

/// A handshake record's header and the start of a ClientHello: detection's verdict is TLS.
const HELLO: &[u8] = &[0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00];
/// What [`greeting_upstream`]'s server says first.
const GREETING: &[u8] = b"220 banner\r\n";

/// A local server that greets with [`GREETING`] as soon as it accepts; its address.
async fn greeting_upstream() -> std::net::SocketAddr {
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = server.accept().await.unwrap();
        s.write_all(GREETING).await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    addr
}

/// Detection as [`detect_dialling`], but the client keeps `after_server_spoke` once the
/// server has spoken first.
async fn detect_with_grace(
    downstream: &mut TcpStream,
    addr: std::net::SocketAddr,
    after_server_spoke: Duration,
) -> Detection {
    let wait = Wait {
        after_server_spoke,
        ..wait(Duration::from_secs(30))
    };
    detect_dialling_with(downstream, addr, wait).await
}

/// The client writes each piece after its pause, then stays connected.
fn write_later(mut client: TcpStream, pieces: Vec<(Duration, &'static [u8])>) {
    tokio::spawn(async move {
        for (pause, bytes) in pieces {
            tokio::time::sleep(pause).await;
            client.write_all(bytes).await.unwrap();
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
}

#[tokio::test]
async fn a_client_hello_after_the_servers_greeting_still_decides_within_the_grace() {
    let (client, mut downstream) = pair().await;
    let addr = greeting_upstream().await;
    // Written once the greeting has had every chance to arrive first.
    write_later(client, vec![(Duration::from_millis(100), HELLO)]);
    let d = detect_with_grace(&mut downstream, addr, Duration::from_secs(10)).await;
    assert_eq!(d.verdict, Verdict::Tls);
    assert_eq!(&d.prefix[..], HELLO);
    // The greeting is still unread, for whoever takes the connection.
    assert_kept_unread(d.upstream, GREETING);
}

#[tokio::test]
async fn a_client_hello_begun_within_the_grace_is_awaited_whole() {
    let (client, mut downstream) = pair().await;
    let addr = greeting_upstream().await;
    // The record header and the message type within the grace, the rest after it.
    let pieces = vec![
        (Duration::from_millis(50), &HELLO[..6]),
        (Duration::from_millis(400), &HELLO[6..]),
    ];
    write_later(client, pieces);
    let d = detect_with_grace(&mut downstream, addr, Duration::from_millis(200)).await;
    assert_eq!(d.verdict, Verdict::Tls);
    assert_eq!(&d.prefix[..], HELLO);
}

#[tokio::test]
async fn a_silent_client_leaves_the_server_first_after_the_grace_not_the_timeout() {
    let (_client, mut downstream) = pair().await;
    let addr = greeting_upstream().await;
    let started = std::time::Instant::now();
    let d = detect_with_grace(&mut downstream, addr, Duration::from_millis(200)).await;
    assert_eq!(d.verdict, Verdict::ServerFirst);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(matches!(d.upstream, Some(Ok(_))));
}

#[test]
fn an_http2_servers_settings_frame_is_told_from_server_first_banners() {
    let frame = |bytes: &[u8]| -> [u8; 9] { bytes[..9].try_into().unwrap() };
    // SETTINGS, empty and with two settings; then its ACK, a HEADERS frame, and a SETTINGS
    // frame on a stream, which are not a server's opening.
    assert!(is_settings_frame_header(&frame(&[
        0, 0, 0, 4, 0, 0, 0, 0, 0
    ])));
    assert!(is_settings_frame_header(&frame(&[
        0, 0, 12, 4, 0, 0, 0, 0, 0
    ])));
    assert!(!is_settings_frame_header(&frame(&[
        0, 0, 0, 4, 1, 0, 0, 0, 0
    ])));
    assert!(!is_settings_frame_header(&frame(&[
        0, 0, 12, 1, 4, 0, 0, 0, 1
    ])));
    assert!(!is_settings_frame_header(&frame(&[
        0, 0, 6, 4, 0, 0, 0, 0, 3
    ])));
    assert!(!is_settings_frame_header(&frame(&[
        0, 0, 7, 4, 0, 0, 0, 0, 0
    ])));
    // MySQL's greeting (length, packet 0, protocol 10), SMTP and SSH banners.
    assert!(!is_settings_frame_header(&frame(&[
        74, 0, 0, 0, 10, b'8', b'.', b'0', b'.'
    ])));
    assert!(!is_settings_frame_header(&frame(b"220 mail.example ESMTP")));
    assert!(!is_settings_frame_header(&frame(b"SSH-2.0-OpenSSH_9.2")));
}

#[tokio::test]
async fn an_http2_server_that_sends_settings_first_still_waits_for_its_clients_preface() {
    let (mut client, mut downstream) = pair().await;
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr().unwrap();
    // An empty SETTINGS frame, as gRPC servers send on accept.
    const SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
    tokio::spawn(async move {
        let (mut s, _) = server.accept().await.unwrap();
        s.write_all(SETTINGS).await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    tokio::spawn(async move {
        // A slow client: its preface comes well after the server's SETTINGS.
        tokio::time::sleep(Duration::from_millis(200)).await;
        client.write_all(H2_PREFACE).await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    let d = detect_dialling(&mut downstream, addr, Duration::from_secs(30)).await;
    assert_eq!(d.verdict, Verdict::Http(HttpVersion::Http2));
    assert_eq!(&d.prefix[..], H2_PREFACE);
    // The server's SETTINGS are still there for the HTTP/2 client that takes the connection.
    assert_kept_unread(d.upstream, SETTINGS);
}

/// Detection kept its upstream connection, and what the server sent is still unread on it.
fn assert_kept_unread(upstream: Option<Result<Upstream, ConnectError>>, sent: &[u8]) {
    let Some(Ok(up)) = upstream else {
        panic!("the upstream connection is kept")
    };
    let mut unread = vec![0u8; sent.len() + 1];
    let n = up.stream.try_read(&mut unread).unwrap();
    assert_eq!(&unread[..n], sent);
}

#[tokio::test]
async fn client_bytes_decide_and_are_kept_while_the_upstream_connects() {
    let (mut client, mut downstream) = pair().await;
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr().unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let d = detect_dialling(&mut downstream, addr, Duration::from_secs(30)).await;
    assert_eq!(d.verdict, Verdict::Http(HttpVersion::Http1));
    assert_eq!(&d.prefix[..], b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
}

#[tokio::test]
async fn silence_on_both_sides_times_out() {
    let (_client, mut downstream) = pair().await;
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr().unwrap();
    let d = detect_dialling(&mut downstream, addr, Duration::from_millis(100)).await;
    assert_eq!(d.verdict, Verdict::Timeout);
    assert!(matches!(d.upstream, Some(Ok(_))), "{:?}", d.upstream);
}

/// Detection's waits: `client` for the client, and a tenth of a second after a failed connect.
fn wait(client: Duration) -> Wait {
    Wait {
        client,
        after_connect_failure: Duration::from_millis(100),
        after_server_spoke: Duration::ZERO,
    }
}

/// A local address where nothing listens: connecting to it is refused at once.
async fn refusing_addr() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

#[tokio::test]
async fn a_refused_upstream_ends_the_wait_for_a_silent_client_soon() {
    let (_client, mut downstream) = pair().await;
    let addr = refusing_addr().await;
    let started = std::time::Instant::now();
    let d = detect_dialling(&mut downstream, addr, Duration::from_secs(30)).await;
    assert_eq!(d.verdict, Verdict::UpstreamFailed);
    assert!(matches!(d.upstream, Some(Err(_))), "{:?}", d.upstream);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_client_that_speaks_soon_after_a_refused_connect_is_still_detected() {
    let (mut client, mut downstream) = pair().await;
    let addr = refusing_addr().await;
    let guard = LoopGuard::new(vec![]);
    let connecting = dial(addr, &guard);
    tokio::pin!(connecting);
    let speaking = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        client
    });
    let d = detect(
        &mut downstream,
        connecting,
        wait(Duration::from_secs(30)),
        true,
    )
    .await;
    assert_eq!(d.verdict, Verdict::Http(HttpVersion::Http1));
    assert!(matches!(d.upstream, Some(Err(_))), "{:?}", d.upstream);
    drop(speaking.await.unwrap());
}

/// An outbound connection to `addr`, as the proxy opens one while detecting.
fn dial(
    addr: std::net::SocketAddr,
    guard: &std::sync::Arc<LoopGuard>,
) -> impl std::future::Future<Output = Result<connect::Upstream, connect::ConnectError>> + '_ {
    connect::connect(
        addr,
        None,
        Duration::from_secs(5),
        crate::Direction::Outbound,
        guard,
    )
}

/// The upstream socket shows readable with nothing on it (tokio's readiness can be stale):
/// the look at what the server sent finds nothing and detection goes on, so the client's
/// request still decides at once (the look once waited for the server's bytes, holding the
/// client's read and the deadline).
#[tokio::test]
async fn a_stale_readiness_of_the_upstream_does_not_hold_detection() {
    let (mut client, mut downstream) = pair().await;
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = server.accept().await.unwrap();
        s.write_all(b"taken").await.unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    let guard = LoopGuard::new(vec![]);
    let connecting = async {
        let up = dial(addr, &guard).await?;
        // tokio sees the bytes arrive; they are then taken off behind its back.
        up.stream.readable().await.unwrap();
        let mut taken = [std::mem::MaybeUninit::<u8>::uninit(); 16];
        let n = socket2::SockRef::from(&up.stream).recv(&mut taken).unwrap();
        assert_eq!(n, 5);
        Ok(up)
    };
    tokio::pin!(connecting);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    let d = tokio::time::timeout(
        Duration::from_secs(3),
        detect(
            &mut downstream,
            connecting,
            wait(Duration::from_secs(30)),
            true,
        ),
    )
    .await
    .expect("the client's request decides; detection is not held by the upstream's look");
    assert_eq!(d.verdict, Verdict::Http(HttpVersion::Http1));
}
