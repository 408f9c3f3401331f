use super::*;

/// Every open connection holds one of these futures; its size is memory per connection
/// before any buffer is allocated. Raise the bound only knowingly.
#[tokio::test]
async fn connection_future_stays_small() {
    let proxy = Proxy::for_tests(Config::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let _client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (stream, peer) = listener.accept().await.unwrap();
    let fut = Arc::clone(&proxy).serve(stream, peer, Route::Capture(Direction::Outbound));
    let size = std::mem::size_of_val(&fut);
    eprintln!("connection future: {size} bytes");
    // Detection added the replayed prefix, the early upstream connection and the hop to
    // what a TCP connection keeps for its life (about 400 bytes); the transient phases
    // (detection with its connect, a later connect, the whole HTTP path) are boxed and
    // freed when done, so they are not counted here.
    assert!(size <= 2048, "connection future is {size} bytes");

    // An HTTP connection keeps its (boxed) HTTP future besides: the fast path's state, without
    // any request's state or buffers (hyper's state is boxed apart, for the connections it
    // serves).
    let (stream, peer) = {
        let _client = TcpStream::connect(listener.local_addr().unwrap()).await;
        listener.accept().await.unwrap()
    };
    let http = http::serve(
        Arc::clone(&proxy),
        Arc::new(Config::default()),
        http::Connection {
            downstream: Downstream::Plain(stream),
            mesh_peer: None,
            peer,
            direction: Direction::Outbound,
            destination: peer,
            source: None,
            connect_timeout: std::time::Duration::from_secs(1),
            version: crate::detect::HttpVersion::Http1,
            prefix: BytesMut::new(),
            early: None,
            originate: None,
            xds_routes: None,
            xds_chain: Default::default(),
            xds_inbound: None,
        },
    );
    let size = std::mem::size_of_val(&http);
    eprintln!("HTTP connection future: {size} bytes");
    assert!(size <= 2048, "HTTP connection future is {size} bytes");
}
