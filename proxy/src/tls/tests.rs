use super::test_certs::Ca;
use super::*;
use crate::identity::Store;
use remora_config::TlsConfig;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CLIENT: &str = "spiffe://cluster.local/ns/default/sa/sleep";
const SERVER: &str = "spiffe://cluster.local/ns/default/sa/httpbin";

fn mesh(identity: Identity) -> Mesh {
    let store = Arc::new(Store::default());
    store.set(Arc::new(identity));
    Mesh::new(store)
}

/// One handshake over an in-memory pipe: the client's result and the server's.
async fn handshake(
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
) -> (
    std::io::Result<tokio_rustls::client::TlsStream<tokio::io::DuplexStream>>,
    std::io::Result<tokio_rustls::server::TlsStream<tokio::io::DuplexStream>>,
) {
    let (c, s) = tokio::io::duplex(64 * 1024);
    let name = ServerName::try_from("outbound_.8080_._.httpbin.default.svc.cluster.local").unwrap();
    let connecting = tokio_rustls::TlsConnector::from(client).connect(name, c);
    let accepting = tokio_rustls::TlsAcceptor::from(server).accept(s);
    tokio::join!(connecting, accepting)
}

#[tokio::test]
async fn mesh_peers_authenticate_each_other_and_learn_the_spiffe_id() {
    let ca = Ca::new("mesh");
    let client = mesh(ca.identity(CLIENT));
    let server = mesh(ca.identity(SERVER));
    let tls = TlsConfig::default();
    let cc = client
        .client_config(&tls, &[SERVER.to_string()], &[ALPN_H2, ALPN_ISTIO])
        .unwrap()
        .unwrap();
    let sc = server.server_config(&tls).unwrap().unwrap();
    let (c, s) = handshake(cc, sc).await;
    let (mut c, mut s) = (c.unwrap(), s.unwrap());
    let (_, session) = s.get_ref();
    let peer = Peer::from_chain(
        session.peer_certificates().unwrap(),
        session.alpn_protocol(),
    )
    .unwrap();
    assert_eq!(peer.spiffe_id.unwrap().as_str(), CLIENT);
    assert_eq!(peer.alpn.as_deref(), Some(ALPN_H2));
    assert_eq!(peer.cert_hash.len(), 64);
    assert_eq!(
        c.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    c.write_all(b"ping").await.unwrap();
    c.flush().await.unwrap();
    let mut got = [0u8; 4];
    s.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"ping");
}

#[tokio::test]
async fn peer_exchange_is_selected_when_offered_but_http_values_win() {
    let ca = Ca::new("mesh");
    let tls = TlsConfig::default();
    let sc = mesh(ca.identity(SERVER))
        .server_config(&tls)
        .unwrap()
        .unwrap();
    for (offer, selected) in [
        (&[ALPN_PEER_EXCHANGE, ALPN_ISTIO][..], ALPN_PEER_EXCHANGE),
        (
            &[ALPN_HTTP11, ALPN_PEER_EXCHANGE, ALPN_ISTIO][..],
            ALPN_HTTP11,
        ),
        (&[ALPN_ISTIO][..], ALPN_ISTIO),
    ] {
        let cc = mesh(ca.identity(CLIENT))
            .client_config(&tls, &[], offer)
            .unwrap()
            .unwrap();
        let (c, _s) = handshake(cc, Arc::clone(&sc)).await;
        assert_eq!(c.unwrap().get_ref().1.alpn_protocol(), Some(selected));
    }
}

#[tokio::test]
async fn an_unexpected_server_identity_is_refused() {
    let ca = Ca::new("mesh");
    let tls = TlsConfig::default();
    let cc = mesh(ca.identity(CLIENT))
        .client_config(
            &tls,
            &["spiffe://cluster.local/ns/x/sa/y".into()],
            &[ALPN_ISTIO],
        )
        .unwrap()
        .unwrap();
    let sc = mesh(ca.identity(SERVER))
        .server_config(&tls)
        .unwrap()
        .unwrap();
    let (c, _) = handshake(cc, sc).await;
    assert_eq!(
        HandshakeFailure::of(&c.unwrap_err()),
        HandshakeFailure::WrongSan
    );
}

#[tokio::test]
async fn a_client_from_another_ca_is_refused() {
    let (ca, other) = (Ca::new("mesh"), Ca::new("other"));
    let tls = TlsConfig::default();
    // The intruder trusts the mesh CA but its own certificate comes from elsewhere.
    let (chain, key) = other.workload(CLIENT, false);
    let intruder = mesh(ca.identity_from(chain, key));
    let cc = intruder
        .client_config(&tls, &[], &[ALPN_ISTIO])
        .unwrap()
        .unwrap();
    let sc = mesh(ca.identity(SERVER))
        .server_config(&tls)
        .unwrap()
        .unwrap();
    let (_, s) = handshake(cc, sc).await;
    assert_eq!(
        HandshakeFailure::of(&s.unwrap_err()),
        HandshakeFailure::UnknownCa
    );
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let ca = Ca::new("mesh");
    let tls = TlsConfig::default();
    let server_identity = ca.identity(SERVER);
    let verifier =
        verify::SpiffeServerVerifier::new(Arc::clone(&server_identity.roots), provider(), vec![]);
    let mut cc = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    cc.alpn_protocols = vec![ALPN_ISTIO.to_vec()];
    let sc = mesh(server_identity).server_config(&tls).unwrap().unwrap();
    let (_, s) = handshake(Arc::new(cc), sc).await;
    assert_eq!(
        HandshakeFailure::of(&s.unwrap_err()),
        HandshakeFailure::NoCertificate
    );
}

#[tokio::test]
async fn an_expired_server_certificate_is_refused() {
    let ca = Ca::new("mesh");
    let tls = TlsConfig::default();
    let (chain, key) = ca.workload(SERVER, true);
    let sc = mesh(ca.identity_from(chain, key))
        .server_config(&tls)
        .unwrap()
        .unwrap();
    let cc = mesh(ca.identity(CLIENT))
        .client_config(&tls, &[], &[ALPN_ISTIO])
        .unwrap()
        .unwrap();
    let (c, _) = handshake(cc, sc).await;
    assert_eq!(
        HandshakeFailure::of(&c.unwrap_err()),
        HandshakeFailure::Expired
    );
}

#[tokio::test]
async fn a_rotated_identity_is_presented_by_the_next_handshake() {
    let ca = Ca::new("mesh");
    let tls = TlsConfig::default();
    let server = mesh(ca.identity(SERVER));
    let first = server.server_config(&tls).unwrap().unwrap();
    assert!(Arc::ptr_eq(
        &first,
        &server.server_config(&tls).unwrap().unwrap()
    ));
    let old_serial = server.identity.current().unwrap().chain[0].serial.clone();
    server.identity.set(Arc::new(ca.identity(SERVER)));
    let second = server.server_config(&tls).unwrap().unwrap();
    assert!(!Arc::ptr_eq(&first, &second));
    let cc = mesh(ca.identity(CLIENT))
        .client_config(&tls, &[], &[ALPN_ISTIO])
        .unwrap()
        .unwrap();
    let (c, _) = handshake(cc, second).await;
    let c = c.unwrap();
    let presented = c.get_ref().1.peer_certificates().unwrap()[0].clone();
    let serial = crate::identity::CertSummary::parse(&presented)
        .unwrap()
        .serial;
    assert_ne!(serial, old_serial);
    assert_eq!(serial, server.identity.current().unwrap().chain[0].serial);
}

#[tokio::test]
async fn client_configs_are_shared_per_destination_and_rebuilt_on_rotation() {
    let ca = Ca::new("mesh");
    let tls = TlsConfig::default();
    let client = mesh(ca.identity(CLIENT));
    let server = mesh(ca.identity(SERVER));
    let get = |expected: &[String], alpn: &[&[u8]]| {
        client.client_config(&tls, expected, alpn).unwrap().unwrap()
    };
    let to_server = [SERVER.to_string()];
    let first = get(&to_server, &[ALPN_H2, ALPN_ISTIO]);
    // The same destination and offer share one config...
    assert!(Arc::ptr_eq(
        &first,
        &get(&to_server, &[ALPN_H2, ALPN_ISTIO])
    ));
    // ...which another offer or other expected identities do not.
    let tcp = get(&to_server, &[ALPN_PEER_EXCHANGE, ALPN_ISTIO]);
    assert!(!Arc::ptr_eq(&first, &tcp));
    assert!(!Arc::ptr_eq(&first, &get(&[], &[ALPN_H2, ALPN_ISTIO])));
    assert!(Arc::ptr_eq(
        &first,
        &get(&to_server, &[ALPN_H2, ALPN_ISTIO])
    ));
    assert!(Arc::ptr_eq(
        &tcp,
        &get(&to_server, &[ALPN_PEER_EXCHANGE, ALPN_ISTIO])
    ));
    // A shared config keeps its own checks: the wrong server identity is still refused.
    let wrong = get(&[CLIENT.to_string()], &[ALPN_ISTIO]);
    let (c, _) = handshake(
        Arc::clone(&wrong),
        server.server_config(&tls).unwrap().unwrap(),
    )
    .await;
    assert!(
        c.is_err(),
        "a server with an unexpected identity was accepted"
    );
    let (c, _) = handshake(wrong, server.server_config(&tls).unwrap().unwrap()).await;
    assert!(
        c.is_err(),
        "the second connection with the cached config was accepted"
    );
    // A rotation builds afresh, with the new certificate.
    client.identity.set(Arc::new(ca.identity(CLIENT)));
    let rotated = get(&to_server, &[ALPN_H2, ALPN_ISTIO]);
    assert!(!Arc::ptr_eq(&first, &rotated));
    let (c, s) = handshake(rotated, server.server_config(&tls).unwrap().unwrap()).await;
    c.unwrap();
    let s = s.unwrap();
    let presented = s.get_ref().1.peer_certificates().unwrap()[0].clone();
    let serial = crate::identity::CertSummary::parse(&presented)
        .unwrap()
        .serial;
    assert_eq!(serial, client.identity.current().unwrap().chain[0].serial);
}

/// A client that speaks only TLS 1.2, with a valid mesh certificate.
fn tls12_client(identity: &Identity) -> Arc<ClientConfig> {
    let verifier =
        verify::SpiffeServerVerifier::new(Arc::clone(&identity.roots), provider(), vec![]);
    let mut cc = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_cert_resolver(Arc::new(Fixed(Arc::clone(&identity.certified))));
    cc.alpn_protocols = vec![ALPN_ISTIO.to_vec()];
    Arc::new(cc)
}

#[tokio::test]
async fn tls_1_2_is_accepted_only_when_configured() {
    let ca = Ca::new("mesh");
    let server = mesh(ca.identity(SERVER));
    let client = ca.identity(CLIENT);
    let mut tls = TlsConfig::default();
    let sc = server.server_config(&tls).unwrap().unwrap();
    let (c, _) = handshake(tls12_client(&client), sc).await;
    assert!(c.is_err(), "TLS 1.2 accepted by default");
    tls.min_protocol_version = remora_config::TlsVersion::Tls12;
    let sc = server.server_config(&tls).unwrap().unwrap();
    let (c, s) = handshake(tls12_client(&client), sc).await;
    assert_eq!(
        c.unwrap().get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    assert!(s.is_ok());
}
