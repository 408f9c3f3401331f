//! An h2c-only origin for the upstream-protocol test of `xds_routing.rs`.

use std::net::SocketAddr;

/// An h2c-only origin (prior knowledge; an HTTP/1.1 request fails its handshake) answering
/// each request with `h2 <authority> <path>`; counts its connections.
pub fn h2c_origin(
    ns: &remora_e2e::Netns,
    addr: SocketAddr,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    std::thread::JoinHandle<()>,
) {
    let listener = ns.bind(addr).expect("bind the h2c origin");
    listener.set_nonblocking(true).expect("non-blocking");
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&connections);
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            while let Ok((socket, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(socket).await else {
                        return;
                    };
                    while let Some(Ok((request, mut respond))) = conn.accept().await {
                        let authority = request
                            .uri()
                            .authority()
                            .map_or("-".to_string(), |a| a.to_string());
                        let text = format!("h2 {authority} {}", request.uri().path());
                        let response = http::Response::builder()
                            .status(200)
                            .body(())
                            .expect("response");
                        if let Ok(mut body) = respond.send_response(response, false) {
                            let _ = body.send_data(bytes::Bytes::from(text), true);
                        }
                    }
                });
            }
        });
    });
    (connections, thread)
}
