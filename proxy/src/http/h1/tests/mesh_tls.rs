//! The fast path inside mesh TLS: a real rustls client with a mesh certificate, the inbound
//! sidecar terminating it, and the same scripted upstreams as the plaintext tests.

use super::*;
use crate::tls::{stream::Rewind, test_certs::Ca, Mesh, Peer, ALPN_HTTP11};

const MESH_CLIENT: &str = "spiffe://cluster.local/ns/default/sa/sleep";
const MESH_SERVER: &str = "spiffe://cluster.local/ns/default/sa/httpbin";

/// A mesh client's TLS connection to an inbound sidecar with identity `MESH_SERVER`, which
/// terminates it and serves the decrypted stream toward `destination`.
async fn mesh_client(
    config: Config,
    destination: SocketAddr,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let proxy = proxy(config);
    let (client, stream, peer, mesh_peer) = mesh_pair(&proxy).await;
    let downstream = (Downstream::Mesh(Box::new(stream)), Some(mesh_peer));
    spawn_served(proxy, downstream, peer, Direction::Inbound, destination);
    client
}

/// A mesh client's TLS connection to `proxy` as an inbound sidecar with identity
/// `MESH_SERVER`, and the sidecar's end of it: the terminated stream, the client's address
/// and its sidecar's identity.
async fn mesh_pair(
    proxy: &Arc<Proxy>,
) -> (
    tokio_rustls::client::TlsStream<TcpStream>,
    crate::tls::stream::ServerStream,
    SocketAddr,
    Peer,
) {
    let ca = Ca::new("mesh");
    proxy.mesh.identity.set(Arc::new(ca.identity(MESH_SERVER)));
    let tls = remora_config::TlsConfig::default();
    let server = proxy.mesh.server_config(&tls).unwrap().unwrap();
    let client_mesh = Mesh::new(Arc::default());
    client_mesh.identity.set(Arc::new(ca.identity(MESH_CLIENT)));
    let client = client_mesh
        .client_config(&tls, &[MESH_SERVER.to_string()], &[ALPN_HTTP11])
        .unwrap()
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let connect = async {
        let tcp = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from("httpbin.default.svc").unwrap();
        tokio_rustls::TlsConnector::from(client)
            .connect(name, tcp)
            .await
            .unwrap()
    };
    let accept = async {
        let (tcp, peer) = listener.accept().await.unwrap();
        let stream = tokio_rustls::TlsAcceptor::from(server)
            .accept(Rewind::new(BytesMut::new(), tcp))
            .await
            .unwrap();
        let session = stream.get_ref().1;
        let mesh_peer = Peer::from_chain(
            session.peer_certificates().unwrap(),
            session.alpn_protocol(),
        )
        .unwrap();
        (stream, peer, mesh_peer)
    };
    let (client, (stream, peer, mesh_peer)) = tokio::join!(connect, accept);
    (client, stream, peer, mesh_peer)
}

/// Send `request` and expect a 200.
async fn exchange_ok<S: AsyncRead + AsyncWrite + Unpin>(
    c: &mut S,
    buf: &mut Vec<u8>,
    request: &[u8],
) {
    c.write_all(request).await.unwrap();
    c.flush().await.unwrap();
    assert!(response(c, buf).await.starts_with("HTTP/1.1 200"));
}

/// The value of header `name` (lowercase) in `head`.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(": ")?;
        n.eq_ignore_ascii_case(name).then_some(v)
    })
}

#[tokio::test]
async fn mesh_tls_requests_take_the_fast_path_with_the_client_sidecar_named() {
    let (addr, mut seen) = upstream(vec![Answer::Reply(OK)]).await;
    let mut c = mesh_client(Config::default(), addr).await;
    // 128 requests of 128 bytes in one write: one 16 KiB TLS record, decrypted whole, of which
    // one 8 KiB read takes half. The rest is held by rustls, with the socket drained: served
    // only if the fast path reads on instead of waiting for the socket.
    let mut request = b"GET /p HTTP/1.1\r\nHost: svc\r\nX-Pad: ".to_vec();
    request.resize(124, b'a');
    request.extend_from_slice(b"\r\n\r\n");
    assert_eq!(request.len(), 128);
    c.write_all(&request.repeat(128)).await.unwrap();
    c.flush().await.unwrap();
    let mut buf = Vec::new();
    for _ in 0..128 {
        assert_eq!(
            response(&mut c, &mut buf).await,
            String::from_utf8_lossy(OK)
        );
    }
    let mut heads = Vec::new();
    for _ in 0..128 {
        heads.push(seen.recv().await.unwrap().head);
    }
    for head in &heads {
        // Forwarded as received (hyper's path writes names in lower case).
        assert!(head.contains("\r\nX-Pad: aaa"), "{head}");
        assert_eq!(header(head, "x-forwarded-proto"), Some("https"), "{head}");
    }
    let xfcc = header(&heads[0], "x-forwarded-client-cert").unwrap();
    assert!(
        xfcc.starts_with(&format!("By={MESH_SERVER};Hash=")),
        "{xfcc}"
    );
    assert!(xfcc.ends_with(&format!(";URI={MESH_CLIENT}")), "{xfcc}");
    assert!(heads
        .iter()
        .all(|h| header(h, "x-forwarded-client-cert") == Some(xfcc)));
}

#[tokio::test]
async fn a_client_certificate_header_over_mesh_tls_gets_ours_appended_by_the_general_path() {
    let (addr, mut seen) = upstream(vec![Answer::Reply(OK)]).await;
    let mut c = mesh_client(Config::default(), addr).await;
    let mut buf = Vec::new();
    exchange_ok(&mut c, &mut buf, b"GET / HTTP/1.1\r\nhost: svc\r\n\r\n").await;
    let fast = seen.recv().await.unwrap().head;
    let ours = header(&fast, "x-forwarded-client-cert")
        .unwrap()
        .to_string();
    let forwarded =
        b"GET / HTTP/1.1\r\nhost: svc\r\nx-forwarded-client-cert: By=spiffe://a\r\n\r\n";
    exchange_ok(&mut c, &mut buf, forwarded).await;
    let general = seen.recv().await.unwrap().head;
    assert_eq!(
        header(&general, "x-forwarded-client-cert"),
        Some(format!("By=spiffe://a,{ours}").as_str()),
        "{general}"
    );
    assert_eq!(header(&general, "x-forwarded-proto"), Some("https"));
}

#[tokio::test]
async fn a_mesh_client_stalled_inside_a_tls_record_is_closed_after_the_header_timeout() {
    let (addr, _seen) = upstream(vec![Answer::Reply(OK)]).await;
    let mut config = Config::default();
    config.http.header_read_timeout = Duration::from_millis(300);
    let mut c = mesh_client(config, addr).await;
    let mut buf = Vec::new();
    exchange_ok(&mut c, &mut buf, b"GET / HTTP/1.1\r\nhost: svc\r\n\r\n").await;
    // The header of an application-data record of 64 bytes, and none of them.
    let socket = c.get_mut().0;
    socket
        .write_all(&[0x17, 0x03, 0x03, 0x00, 0x40])
        .await
        .unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the sidecar still holds a connection stalled mid-record"
    );
}

/// An idle mesh TLS connection whose socket readiness is stale is closed by
/// `http.idle_timeout` and counted so, not after `http.header_read_timeout` as one stalled
/// inside a record: the look that takes nothing off the socket goes back to the idle wait.
#[tokio::test]
async fn an_idle_mesh_connection_with_stale_readiness_is_closed_as_idle() {
    let mut config = Config::default();
    config.http.idle_timeout = Duration::from_millis(200);
    config.http.header_read_timeout = Duration::from_secs(30);
    let proxy = proxy(config);
    let (mut client, mut stream, peer, _) = mesh_pair(&proxy).await;
    // Stale readiness, for real: bytes under the TLS layer that tokio sees arrive and that are
    // then taken off the socket behind its back, before rustls could read them.
    client.get_mut().0.write_all(b"taken").await.unwrap();
    make_readiness_stale(stream.get_ref().0.inner()).await;
    let idle_closes = served_until_idle(&proxy, &mut stream, peer).await;
    assert_eq!(idle_closes, 1, "closed as idle, not as stalled in a record");
}
