//! HTTP/2 clients that open many streams for large responses, grant every window, and then read
//! nothing: what Remora holds for them, per stream and per connection, while a client that
//! reads gets its responses from the same origin.

use super::*;

/// Attacking connections, and streams each opens.
const H2_CONNECTIONS: usize = 4;
const H2_STREAMS: usize = 100;
/// Each stream's response.
const H2_RESPONSE: usize = 1 << 20;
/// What Remora may hold per stalled stream, in KiB: half the response, so that a path that
/// buffered a stalled stream's response whole fails. Measured, 400 streams: 58 to 338 KiB with
/// the 64 KiB send buffer, 232 to 440 KiB with hyper's default; the spread is wide from run to
/// run (docs/hardening.md, "Overload", known gaps).
const PER_STALLED_STREAM_KIB: u64 = 512;
/// Remora's documented bound on what one HTTP/2 client connection that reads nothing makes it
/// hold (docs/hardening.md, "Buffers per connection"), in KiB: the connection's send budget
/// (`http::send_budget::CONNECTION_SEND_BUDGET`, 1 MiB, over all its streams) and, for each of
/// its streams, the upstream stream window (`pool::UPSTREAM_H2_STREAM_WINDOW`, 64 KiB) where
/// the rest of the response waits.
const PER_CONNECTION_BOUND_KIB: u64 = 1024 + H2_STREAMS as u64 * 64;
/// What a stream costs besides its buffered bytes, in KiB: its request's state in Remora, the
/// h2 stream on both legs, and the read buffers its DATA frames keep (measured: 10 to 16 KiB
/// above the bound's share; twice that, for a machine the test shares).
const PER_STREAM_STATE_KIB: u64 = 32;
/// The client that reads: streams it asks for, one after another, on a connection of its own.
const READER_STREAMS: usize = 8;
/// Where the HTTP/2 origin answers every request with `H2_RESPONSE` bytes.
const H2_ORIGIN_PORT: u16 = 8082;

/// An h2c origin in `ns` answering every stream with `H2_RESPONSE` bytes, on its own thread.
fn h2_origin(ns: &Netns, addr: SocketAddr) -> std::thread::JoinHandle<()> {
    let listener = ns.bind(addr).expect("bind the h2 origin");
    listener.set_nonblocking(true).expect("non-blocking");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let serve = async {
                while let Ok((socket, _)) = listener.accept().await {
                    tokio::spawn(async move {
                        let Ok(mut conn) = h2::server::handshake(socket).await else {
                            return;
                        };
                        while let Some(Ok((_, mut respond))) = conn.accept().await {
                            tokio::spawn(async move {
                                let ok = http::Response::builder()
                                    .status(200)
                                    .body(())
                                    .expect("response");
                                let Ok(mut body) = respond.send_response(ok, false) else {
                                    return;
                                };
                                let data = bytes::Bytes::from(vec![b'h'; H2_RESPONSE]);
                                body.reserve_capacity(H2_RESPONSE);
                                let _ = body.send_data(data, true);
                                // Keep the stream's task until the data is gone or reset.
                                let _ = std::future::poll_fn(|cx| body.poll_reset(cx)).await;
                            });
                        }
                    });
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(120), serve).await;
        });
    })
}

/// One HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a small frame");
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

/// The client's opening and `streams` GET requests for `path`, written by hand (HPACK literals
/// without indexing): every window opened to the maximum, as a client that means to read all
/// of it would.
fn greedy_client_bytes(authority: &str, path: &str, streams: usize) -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    // SETTINGS_INITIAL_WINDOW_SIZE = 2^31 - 1.
    out.extend(frame(4, 0, 0, &[0x00, 0x04, 0x7f, 0xff, 0xff, 0xff]));
    out.extend(frame(8, 0, 0, &((1u32 << 31) - 1 - 65_535).to_be_bytes()));
    for i in 0..streams {
        let mut block = vec![0x82, 0x86]; // :method GET, :scheme http (static table)
        for (index, value) in [(4u8, path), (1u8, authority)] {
            block.push(index); // literal without indexing, indexed name
            block.push(u8::try_from(value.len()).expect("a short value"));
            block.extend(value.as_bytes());
        }
        let stream = u32::try_from(2 * i + 1).expect("a stream id");
        out.extend(frame(1, 0x05, stream, &block)); // END_STREAM | END_HEADERS
    }
    out
}

/// HTTP/2 clients that open 100 streams for 1 MiB each with every window granted, then read
/// nothing: Remora's memory per stalled stream stays within a stated bound (a regression guard:
/// the bound is loose, see `PER_STALLED_STREAM_KIB`).
#[test]
fn stalled_http2_readers_with_open_windows_keep_memory_bounded() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    net.capture_default();
    let remora = net
        .remora()
        .config(&format!("ports:\n  {H2_ORIGIN_PORT}: http2\n"))
        .start_ready();
    let _origin = h2_origin(&net.peer, net.peer_addr(H2_ORIGIN_PORT));
    let dst = net.peer_addr(H2_ORIGIN_PORT);
    std::thread::sleep(Duration::from_millis(300));
    let pid = remora.pid();
    let before = rss_kib(pid);
    let request = greedy_client_bytes(&dst.to_string(), "/large", H2_STREAMS);
    let _clients: Vec<TcpStream> = (0..H2_CONNECTIONS)
        .map(|i| {
            let mut s =
                peer::connect(&net.pod, dst).unwrap_or_else(|e| panic!("h2 client {i}: {e}"));
            s.write_all(&request).expect("the client's streams");
            s
        })
        .collect();
    let mut peak = before;
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(300));
        peak = peak.max(rss_kib(pid));
    }
    // A client that reads, while the stalled ones hold their streams: the upstream connection
    // they share with it, and the proxy, still carry its responses.
    let started = Instant::now();
    let read = read_responses(&net.pod, dst, READER_STREAMS);
    let reading = started.elapsed();
    peak = peak.max(rss_kib(pid));
    let streams = (H2_CONNECTIONS * H2_STREAMS) as u64;
    let grown = peak.saturating_sub(before);
    let per_stream = grown / streams;
    let per_connection = grown / H2_CONNECTIONS as u64;
    eprintln!(
        "{H2_CONNECTIONS} stalled HTTP/2 clients x {H2_STREAMS} streams of {H2_RESPONSE} \
         bytes: RSS {before} KiB -> {peak} KiB ({per_stream} KiB per stream, \
         {per_connection} KiB per connection); a reading client beside them: \
         {READER_STREAMS} x {H2_RESPONSE} bytes in {reading:?}"
    );
    assert_eq!(
        read,
        Ok(READER_STREAMS * H2_RESPONSE),
        "the reading client's responses"
    );
    assert!(
        reading < Duration::from_secs(10),
        "the reading client took {reading:?}"
    );
    assert!(
        per_stream < PER_STALLED_STREAM_KIB,
        "{per_stream} KiB per stalled HTTP/2 stream (bound {PER_STALLED_STREAM_KIB} KiB)"
    );
    let bound = PER_CONNECTION_BOUND_KIB + H2_STREAMS as u64 * PER_STREAM_STATE_KIB;
    assert!(
        grown < bound * H2_CONNECTIONS as u64,
        "{grown} KiB for {H2_CONNECTIONS} stalled HTTP/2 connections (bound {bound} KiB each)"
    );
}

/// An HTTP/2 client (the `h2` crate) that asks `n` times, one stream after another, for the
/// origin's response and reads each whole: the bytes it read, or what failed.
fn read_responses(ns: &Netns, dst: SocketAddr, n: usize) -> Result<usize, String> {
    let socket = peer::connect(ns, dst).map_err(|e| format!("connect: {e}"))?;
    socket.set_nonblocking(true).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let socket = tokio::net::TcpStream::from_std(socket).map_err(|e| e.to_string())?;
        let (mut send, conn) = h2::client::handshake(socket)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        let mut total = 0;
        for _ in 0..n {
            let request = http::Request::get(format!("http://{dst}/large"))
                .body(())
                .map_err(|e| e.to_string())?;
            send = send.ready().await.map_err(|e| format!("ready: {e}"))?;
            let (response, _) = send
                .send_request(request, true)
                .map_err(|e| format!("send: {e}"))?;
            let response = tokio::time::timeout(Duration::from_secs(10), response)
                .await
                .map_err(|_| "no response head within 10 s".to_string())?
                .map_err(|e| format!("response: {e}"))?;
            if response.status() != 200 {
                return Err(format!("status {}", response.status()));
            }
            let mut body = response.into_body();
            while let Some(chunk) = tokio::time::timeout(Duration::from_secs(10), body.data())
                .await
                .map_err(|_| format!("body stalled after {total} bytes"))?
            {
                let chunk = chunk.map_err(|e| format!("body: {e}"))?;
                total += chunk.len();
                let _ = body.flow_control().release_capacity(chunk.len());
            }
        }
        Ok(total)
    })
}
