//! Stale readiness: tokio can hold a socket readable with nothing on it. The idle wait must
//! still close such a connection when it is idle; these make that condition for real.

use super::*;

/// An idle connection whose readiness is stale is still closed by `http.idle_timeout`: the
/// read that finds nothing goes back to the idle wait (it once waited for bytes with no timer,
/// and idle connections of the overload test stayed open).
#[tokio::test]
async fn an_idle_connection_with_stale_readiness_is_still_closed_when_idle() {
    let mut config = Config::default();
    config.http.idle_timeout = Duration::from_millis(200);
    let proxy = proxy(config);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut near = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (mut far, peer) = listener.accept().await.unwrap();
    near.write_all(b"taken").await.unwrap();
    make_readiness_stale(&far).await;
    assert_eq!(served_until_idle(&proxy, &mut far, peer).await, 1);
    // Ended as the server ends it, by dropping the socket: closed, not reset.
    drop(far);
    let mut rest = Vec::new();
    assert_eq!(near.read_to_end(&mut rest).await.unwrap(), 0);
}

/// Make `socket`'s readiness stale, for real: tokio sees the 5 bytes its peer sent arrive, and
/// they are then taken off the socket behind its back, so it still holds the socket readable.
pub(in crate::http::h1) async fn make_readiness_stale(socket: &TcpStream) {
    socket.readable().await.unwrap();
    let mut taken = [std::mem::MaybeUninit::<u8>::uninit(); 16];
    assert_eq!(socket2::SockRef::from(socket).recv(&mut taken).unwrap(), 5);
    socket.readable().await.unwrap();
}

/// Serve `client` on the fast path until it ends (at most 5 s), and how many connections
/// `http.idle_timeout` has closed so far.
pub(in crate::http::h1) async fn served_until_idle<C: Client>(
    proxy: &Arc<Proxy>,
    client: &mut C,
    peer: SocketAddr,
) -> u64 {
    let ctx = Arc::new(ConnContext::for_tests(Arc::clone(proxy), peer, peer));
    let served = tokio::time::timeout(
        Duration::from_secs(5),
        serve(&ctx, client, BytesMut::new(), None),
    )
    .await
    .expect("closed by the idle timeout, not left waiting on a read");
    assert!(matches!(served, Served::Ended(Ok(()))), "{served:?}");
    proxy
        .metrics
        .direction(Direction::Outbound)
        .http_idle_timeouts
        .get()
}
