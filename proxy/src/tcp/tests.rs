use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A connected pair of sockets: (the end we hand to the copier, the end the test drives).
async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (server, _) = l.accept().await.unwrap();
    (server, client)
}

/// Writes `out` and shuts down while reading to the end; returns what was read.
pub(super) async fn send_and_read_to_end<S>(stream: S, out: Vec<u8>) -> Vec<u8>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let writer = async {
        wr.write_all(&out).await.unwrap();
        wr.shutdown().await.unwrap();
    };
    let mut got = Vec::new();
    let reader = async { rd.read_to_end(&mut got).await.unwrap() };
    tokio::join!(writer, reader);
    got
}

#[tokio::test]
async fn half_close_still_delivers_the_whole_response() {
    let (down, client) = pair().await;
    let (up, mut server) = pair().await;
    let copier = tokio::spawn(async move { copy_bidirectional(&down, &up).await });

    let payload: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
    let sent = payload.clone();
    let echo = tokio::spawn(async move {
        // Echo everything, then close once the client's FIN arrives.
        let mut buf = vec![0u8; 65536];
        loop {
            let n = server.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            server.write_all(&buf[..n]).await.unwrap();
        }
        server.shutdown().await.unwrap();
    });
    let got = send_and_read_to_end(client, sent).await;
    echo.await.unwrap();
    assert_eq!(got.len(), payload.len());
    assert!(got == payload, "echo differs from what was sent");
    let transfer = copier.await.unwrap().unwrap();
    assert_eq!(transfer.sent, 2_000_000);
    assert_eq!(transfer.received, 2_000_000);
    // The server closed after the client's end of stream reached it: its close.
    assert!(transfer.upstream_ended_last);
}

#[tokio::test]
async fn a_server_that_ends_first_leaves_the_close_to_us() {
    for streams in [false, true] {
        let (mut down, mut client) = pair().await;
        let (mut up, mut server) = pair().await;
        let copier = tokio::spawn(async move {
            if streams {
                copy_streams_until(&[], &mut down, &mut up, None, std::future::pending()).await
            } else {
                copy_bidirectional(&down, &up).await
            }
        });
        server.write_all(b"bye").await.unwrap();
        server.shutdown().await.unwrap();
        // The client reads to the server's end, then ends its own.
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"bye");
        client.write_all(b"ok").await.unwrap();
        client.shutdown().await.unwrap();
        let mut rest = Vec::new();
        server.read_to_end(&mut rest).await.unwrap();
        let transfer = copier.await.unwrap().unwrap();
        assert!(!transfer.upstream_ended_last, "streams: {streams}");
    }
}

#[tokio::test]
async fn upstream_reset_becomes_downstream_reset() {
    let (down, mut client) = pair().await;
    let (up, mut server) = pair().await;
    let copier = tokio::spawn(async move { copy_bidirectional(&down, &up).await });
    client.write_all(b"hello").await.unwrap();
    let mut got = [0u8; 5];
    server.read_exact(&mut got).await.unwrap();
    // Reset from the upstream side, after it read what the client sent.
    SockRef::from(&server)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(server);
    let err = copier.await.unwrap().unwrap_err();
    assert!(matches!(err, CopyError::Upstream { .. }), "{err:?}");
    // The other direction failed, but the bytes this one delivered still count.
    assert_eq!(err.transfer().sent, 5);
    let mut buf = [0u8; 16];
    let r = client.read(&mut buf).await;
    assert_eq!(
        r.map_err(|e| e.kind()),
        Err(io::ErrorKind::ConnectionReset),
        "client should see a reset, not a clean close"
    );
}

#[tokio::test]
async fn clean_close_both_ways_reports_byte_counts() {
    let (down, mut client) = pair().await;
    let (up, mut server) = pair().await;
    let copier = tokio::spawn(async move { copy_bidirectional(&down, &up).await });
    client.write_all(b"ping").await.unwrap();
    client.shutdown().await.unwrap();
    let mut got = Vec::new();
    server.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"ping");
    server.write_all(b"pong!").await.unwrap();
    server.shutdown().await.unwrap();
    let mut back = Vec::new();
    client.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"pong!");
    let t = copier.await.unwrap().unwrap();
    assert_eq!((t.sent, t.received), (4, 5));
}

/// The kernel's size for a buffer of `asked` bytes: doubled, within `net.core.<max>`.
fn kernel_size(asked: usize, max: &str) -> usize {
    let path = format!("/proc/sys/net/core/{max}");
    let max: usize = std::fs::read_to_string(&path)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    2 * asked.min(max)
}

/// The kernel buffers around one copy of `payload` from client to server: the downstream's
/// receive buffer before and after, the upstream's send buffer after, and the bytes moved.
struct Buffers {
    sent: u64,
    fresh_rcv: usize,
    rcv: usize,
    snd: usize,
}

async fn copy_once(payload: Vec<u8>) -> Buffers {
    let (down, mut client) = pair().await;
    let (up, mut server) = pair().await;
    let fresh_rcv = SockRef::from(&down).recv_buffer_size().unwrap();
    let copier = tokio::spawn(async move {
        let t = copy_bidirectional(&down, &up).await;
        let rcv = SockRef::from(&down).recv_buffer_size().unwrap();
        let snd = SockRef::from(&up).send_buffer_size().unwrap();
        (t, rcv, snd)
    });
    let sink = tokio::spawn(async move {
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        got.len()
    });
    client.write_all(&payload).await.unwrap();
    client.shutdown().await.unwrap();
    assert_eq!(sink.await.unwrap(), payload.len());
    drop(client);
    let (transfer, rcv, snd) = copier.await.unwrap();
    Buffers {
        sent: transfer.unwrap().sent,
        fresh_rcv,
        rcv,
        snd,
    }
}

#[tokio::test]
async fn a_bulk_direction_bounds_the_buffers_of_its_local_sockets() {
    let b = copy_once(vec![7u8; 8 << 20]).await;
    assert_eq!(b.sent, 8 << 20);
    let bounded_rcv = kernel_size(local::LOCAL_BULK_BUFFER, "rmem_max");
    assert_ne!(b.fresh_rcv, bounded_rcv);
    assert_eq!(b.rcv, bounded_rcv);
    assert_eq!(b.snd, kernel_size(local::LOCAL_BULK_BUFFER, "wmem_max"));
}

#[tokio::test]
async fn a_request_sized_exchange_leaves_buffers_to_the_kernel() {
    let b = copy_once(b"GET / HTTP/1.1\r\n\r\n".to_vec()).await;
    assert_eq!(b.sent, 18);
    assert_eq!(b.rcv, b.fresh_rcv);
}

#[tokio::test]
async fn an_idle_connection_is_closed_not_reset_and_reports_its_bytes() {
    let (down, mut client) = pair().await;
    let (up, mut server) = pair().await;
    let idle = Duration::from_millis(200);
    let copier =
        tokio::spawn(async move { copy_bidirectional_after(b"hi", &down, &up, Some(idle)).await });
    client.write_all(b" there").await.unwrap();
    let mut got = [0u8; 8];
    server.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"hi there");
    let err = copier.await.unwrap().unwrap_err();
    assert!(matches!(err, CopyError::Idle { .. }), "{err:?}");
    assert_eq!((err.transfer().sent, err.transfer().received), (8, 0));
    // Both peers see an end of stream, not a reset: nothing went wrong on either side.
    let mut rest = Vec::new();
    assert_eq!(client.read_to_end(&mut rest).await.unwrap(), 0);
    assert_eq!(server.read_to_end(&mut rest).await.unwrap(), 0);
}

#[tokio::test]
async fn traffic_within_the_idle_timeout_keeps_the_connection() {
    let (down, mut client) = pair().await;
    let (up, mut server) = pair().await;
    let idle = Duration::from_millis(300);
    let copier =
        tokio::spawn(async move { copy_bidirectional_after(&[], &down, &up, Some(idle)).await });
    // A byte every 100 ms for three timeouts' worth, then an orderly close.
    for _ in 0..9 {
        client.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        server.read_exact(&mut b).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!copier.is_finished(), "closed while bytes were moving");
    client.shutdown().await.unwrap();
    server.shutdown().await.unwrap();
    let t = copier.await.unwrap().unwrap();
    assert_eq!((t.sent, t.received), (9, 0));
}

/// Whether the socket's read readiness is set now, without waiting.
async fn read_ready_now(s: &TcpStream) -> bool {
    std::future::poll_fn(|cx| std::task::Poll::Ready(s.poll_read_ready(cx).is_ready())).await
}

#[tokio::test]
async fn a_short_read_sleeps_until_new_bytes_instead_of_reading_again() {
    let (from, mut peer) = pair().await;
    peer.write_all(b"hello").await.unwrap();
    from.readable().await.unwrap();
    let mut buf = BytesMut::with_capacity(64);
    assert_eq!(read_some(&from, &mut buf).unwrap(), 5);
    // The queue is empty and tokio knows it: a wait for readability would sleep.
    assert!(
        !read_ready_now(&from).await,
        "readiness outlived a short read"
    );
    // New bytes wake it again.
    peer.write_all(b"again").await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), from.readable())
        .await
        .expect("new bytes did not wake the wait")
        .unwrap();
    buf.clear();
    assert_eq!(read_some(&from, &mut buf).unwrap(), 5);
    assert_eq!(&buf[..], b"again");
}

#[tokio::test]
async fn a_full_read_reads_again_without_waiting() {
    let (from, mut peer) = pair().await;
    let mut buf = BytesMut::with_capacity(64);
    let asked = buf.capacity();
    let sent: Vec<u8> = (0..asked + 10).map(|i| i as u8).collect();
    peer.write_all(&sent).await.unwrap();
    // Wait until all of it is queued, so that the first read fills the buffer.
    let mut probe = vec![0u8; asked + 10];
    while from.peek(&mut probe).await.unwrap() < asked + 10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(read_some(&from, &mut buf).unwrap(), asked);
    // A full read says nothing about what is left, so readiness stays.
    assert!(read_ready_now(&from).await);
    let mut rest = BytesMut::with_capacity(64);
    assert_eq!(read_some(&from, &mut rest).unwrap(), 10);
    assert_eq!(&rest[..], &sent[asked..]);
    // Nothing left: a read says so.
    let mut none = BytesMut::with_capacity(64);
    let e = read_some(&from, &mut none).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
}
