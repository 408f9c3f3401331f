use super::*;
use crate::identity::Store;
use crate::tls::test_certs::Ca;
use crate::tls::Mesh;
use remora_config::TlsConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SERVER: &str = "spiffe://cluster.local/ns/default/sa/httpbin";

fn mesh(ca: &Ca, id: &str) -> Mesh {
    let store = Arc::new(Store::default());
    store.set(Arc::new(ca.identity(id)));
    Mesh::new(store)
}

/// A mesh connection over loopback that has carried one request and its answer, and the
/// server's end of it.
async fn used_pair() -> (ClientStream, tokio_rustls::server::TlsStream<TcpStream>) {
    let ca = Ca::new("mesh");
    let tls = TlsConfig::default();
    let client = mesh(&ca, "spiffe://cluster.local/ns/default/sa/sleep")
        .client_config(&tls, &[SERVER.to_string()], &alpn(HttpVersion::Http1))
        .unwrap()
        .unwrap();
    let server = mesh(&ca, SERVER).server_config(&tls).unwrap().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let name = ServerName::try_from("outbound_.80_._.httpbin.default.svc.cluster.local").unwrap();
    let connecting = async {
        let socket = TcpStream::connect(addr).await.unwrap();
        tokio_rustls::TlsConnector::from(client)
            .connect(name, socket)
            .await
            .unwrap()
    };
    let accepting = async {
        let (socket, _) = listener.accept().await.unwrap();
        tokio_rustls::TlsAcceptor::from(server)
            .accept(socket)
            .await
            .unwrap()
    };
    let (mut c, mut s) = tokio::join!(connecting, accepting);
    c.write_all(b"request").await.unwrap();
    c.flush().await.unwrap();
    let mut got = [0u8; 7];
    s.read_exact(&mut got).await.unwrap();
    s.write_all(b"answer").await.unwrap();
    s.flush().await.unwrap();
    let mut got = [0u8; 6];
    c.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"answer");
    (c, s)
}

/// Lets the reactor see what arrived.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[tokio::test]
async fn a_quiet_mesh_connection_is_open_and_one_the_server_ended_is_closed() {
    let (c, mut s) = used_pair().await;
    settle().await;
    assert!(!closed_while_idle(&c), "a quiet connection looked closed");
    // close_notify, then FIN: what a server that closes an idle connection sends.
    s.shutdown().await.unwrap();
    settle().await;
    assert!(
        closed_while_idle(&c),
        "a connection the server ended looked open"
    );
}

#[tokio::test]
async fn a_mesh_connection_with_bytes_no_request_asked_for_is_closed() {
    let (c, mut s) = used_pair().await;
    s.write_all(b"unasked").await.unwrap();
    s.flush().await.unwrap();
    settle().await;
    assert!(
        closed_while_idle(&c),
        "unasked bytes left the connection pooled"
    );
}

#[tokio::test]
async fn a_reset_mesh_connection_is_closed() {
    let (c, s) = used_pair().await;
    let (socket, _) = s.into_inner();
    socket2::SockRef::from(&socket)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(socket);
    settle().await;
    assert!(closed_while_idle(&c), "a reset connection looked open");
}

fn key(client: &Arc<rustls::ClientConfig>, name: &str, port: u16) -> MeshKey {
    MeshKey {
        conn: Key {
            destination: ([10, 0, 0, 7], port).into(),
            source: None,
            version: HttpVersion::Http1,
            tls: 0,
        },
        client: Arc::clone(client),
        name: Arc::new(ServerName::try_from(name.to_string()).unwrap()),
    }
}

#[test]
fn mesh_connections_are_shared_only_with_the_same_destination_tls_and_name() {
    let ca = Ca::new("mesh");
    let tls = TlsConfig::default();
    let ours = mesh(&ca, "spiffe://cluster.local/ns/default/sa/sleep");
    let client = ours
        .client_config(&tls, &[SERVER.to_string()], &alpn(HttpVersion::Http1))
        .unwrap()
        .unwrap();
    let other = ours
        .client_config(
            &tls,
            &["spiffe://cluster.local/ns/default/sa/other".to_string()],
            &alpn(HttpVersion::Http1),
        )
        .unwrap()
        .unwrap();
    let name = "outbound_.80_._.httpbin.default.svc.cluster.local";
    let a = key(&client, name, 80);
    // Built apart, as each client connection builds its own: equal, and hashed alike.
    let b = key(&client, name, 80);
    assert_eq!(a, b);
    let hash = |k: &MeshKey| {
        let mut h = std::hash::DefaultHasher::new();
        k.hash(&mut h);
        h.finish()
    };
    assert_eq!(hash(&a), hash(&b));
    assert_ne!(a, key(&client, name, 81), "another destination");
    assert_ne!(a, key(&other, name, 80), "another expected identity");
    assert_ne!(
        a,
        key(
            &client,
            "outbound_.80_._.other.default.svc.cluster.local",
            80
        ),
        "another server name"
    );
}
