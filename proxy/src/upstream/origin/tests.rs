use super::verify::{san_matches, San};
use super::*;
use crate::tls::test_certs::Ca;
use remora_xds::model::cluster::{SanMatcher, SanType};
use remora_xds::model::matcher::StringMatcher;
use rustls::pki_types::ServerName;
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use std::sync::Mutex as StdMutex;

fn certified(chain: &str, key: &str) -> Arc<CertifiedKey> {
    let chain = CertificateDer::pem_slice_iter(chain.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let signing = crate::tls::provider()
        .key_provider
        .load_private_key(key)
        .unwrap();
    Arc::new(CertifiedKey::new(chain, signing))
}

/// Records the SNI each handshake asked for, and presents one certificate.
#[derive(Debug)]
struct Server {
    cert: Arc<CertifiedKey>,
    sni: StdMutex<Vec<Option<String>>>,
}

impl rustls::server::ResolvesServerCert for Server {
    fn resolve(&self, hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.sni
            .lock()
            .unwrap()
            .push(hello.server_name().map(str::to_string));
        Some(Arc::clone(&self.cert))
    }
}

fn server_config(server: Arc<Server>, client_ca: Option<&Ca>) -> Arc<ServerConfig> {
    let provider = crate::tls::provider();
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            roots.add(ca.cert.der().clone()).unwrap();
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    Arc::new(builder.with_cert_resolver(server))
}

/// One handshake over an in-memory pipe; whether both ends completed it.
async fn handshake(client: Arc<ClientConfig>, server: Arc<ServerConfig>, sni: &str) -> bool {
    let (c, s) = tokio::io::duplex(64 * 1024);
    let name = ServerName::try_from(sni.to_string()).unwrap();
    let connecting = tokio_rustls::TlsConnector::from(client).connect(name, c);
    let accepting = tokio_rustls::TlsAcceptor::from(server).accept(s);
    let (c, s) = tokio::join!(connecting, accepting);
    c.is_ok() && s.is_ok()
}

fn origin(dir: &Path, sans: &[&str], client: bool) -> Arc<OriginTls> {
    Arc::new(OriginTls {
        sni: Some("api.example.com".into()),
        alpn: vec![],
        keeps_alpn: true,
        roots: Some(Roots::File(dir.join("ca.pem"))),
        subject_alt_names: sans
            .iter()
            .map(|s| SanMatcher {
                san_type: None,
                matcher: StringMatcher::exact(s),
            })
            .collect(),
        client_certificate: client.then(|| {
            ClientCertificate::Files(ClientFiles {
                chain: dir.join("client.pem"),
                key: dir.join("client-key.pem"),
            })
        }),
        tls13_only: false,
    })
}

#[tokio::test]
async fn simple_checks_the_roots_and_the_sans_and_sends_the_sni() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("origin");
    std::fs::write(dir.path().join("ca.pem"), ca.cert.pem()).unwrap();
    let (chain, key) = ca.dns(&["api.example.com"]);
    let server = Arc::new(Server {
        cert: certified(&chain, &key),
        sni: StdMutex::default(),
    });
    let origins = Origins::default();
    let sc = server_config(Arc::clone(&server), None);

    let right = origins
        .client_config(&origin(dir.path(), &["api.example.com"], false), &[], None)
        .unwrap();
    assert!(handshake(right, Arc::clone(&sc), "api.example.com").await);
    assert_eq!(
        server
            .sni
            .lock()
            .unwrap()
            .last()
            .cloned()
            .flatten()
            .as_deref(),
        Some("api.example.com")
    );
    let wrong = origins
        .client_config(
            &origin(dir.path(), &["other.example.com"], false),
            &[],
            None,
        )
        .unwrap();
    assert!(!handshake(wrong, Arc::clone(&sc), "api.example.com").await);
    // No SAN matcher: any certificate of the roots; the SNI is not compared with it.
    let any = origins
        .client_config(&origin(dir.path(), &[], false), &[], None)
        .unwrap();
    assert!(handshake(any, Arc::clone(&sc), "elsewhere.example.org").await);

    // Another CA's roots: the chain leads nowhere.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("ca.pem"), Ca::new("other").cert.pem()).unwrap();
    let untrusted = origins
        .client_config(
            &origin(other.path(), &["api.example.com"], false),
            &[],
            None,
        )
        .unwrap();
    assert!(!handshake(untrusted, Arc::clone(&sc), "api.example.com").await);
    // insecureSkipVerify: no roots, nothing checked.
    let insecure = Arc::new(OriginTls {
        roots: None,
        subject_alt_names: vec![],
        ..(*origin(other.path(), &[], false)).clone()
    });
    let insecure = origins.client_config(&insecure, &[], None).unwrap();
    assert!(handshake(insecure, sc, "api.example.com").await);
}

#[tokio::test]
async fn mutual_presents_the_client_certificate_from_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("origin");
    std::fs::write(dir.path().join("ca.pem"), ca.cert.pem()).unwrap();
    let (chain, key) = ca.dns(&["api.example.com"]);
    let (client_chain, client_key) = ca.dns(&["client.example.com"]);
    std::fs::write(dir.path().join("client.pem"), &client_chain).unwrap();
    std::fs::write(dir.path().join("client-key.pem"), &client_key).unwrap();
    let server = Arc::new(Server {
        cert: certified(&chain, &key),
        sni: StdMutex::default(),
    });
    let sc = server_config(server, Some(&ca));
    let origins = Origins::default();
    let without = origins
        .client_config(&origin(dir.path(), &["api.example.com"], false), &[], None)
        .unwrap();
    assert!(!handshake(without, Arc::clone(&sc), "api.example.com").await);
    let with = origin(dir.path(), &["api.example.com"], true);
    let first = origins.client_config(&with, &[], None).unwrap();
    assert!(handshake(Arc::clone(&first), Arc::clone(&sc), "api.example.com").await);
    // Unchanged files: the same config. A rotated certificate: a new one, read again.
    assert!(Arc::ptr_eq(
        &first,
        &origins.client_config(&with, &[], None).unwrap()
    ));
    let (rotated_chain, rotated_key) = ca.dns(&["client.example.com", "rotated.example.com"]);
    std::fs::write(dir.path().join("client.pem"), &rotated_chain).unwrap();
    std::fs::write(dir.path().join("client-key.pem"), &rotated_key).unwrap();
    let second = origins.client_config(&with, &[], None).unwrap();
    assert!(!Arc::ptr_eq(&first, &second));
    assert!(handshake(second, sc, "api.example.com").await);
}

#[test]
fn unreadable_or_mismatched_files_fail_naming_the_file_not_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("origin");
    let origins = Origins::default();
    let tls = origin(dir.path(), &[], true);
    let err = origins
        .client_config(&tls, &[], None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("ca.pem"), "{err}");
    std::fs::write(dir.path().join("ca.pem"), ca.cert.pem()).unwrap();
    let (chain, _) = ca.dns(&["client.example.com"]);
    let (_, other_key) = ca.dns(&["client.example.com"]);
    std::fs::write(dir.path().join("client.pem"), &chain).unwrap();
    std::fs::write(dir.path().join("client-key.pem"), &other_key).unwrap();
    let err = origins
        .client_config(&tls, &[], None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("client-key.pem") && err.contains("does not match"),
        "{err}"
    );
    let body: String = other_key
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    assert!(!err.contains(&body[..16]), "the key is never in an error");
    std::fs::write(dir.path().join("client-key.pem"), "not a key").unwrap();
    let err = origins
        .client_config(&tls, &[], None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a PEM private key"), "{err}");
}

#[test]
fn san_matchers_follow_envoys_rules() {
    let exact = |t: Option<SanType>, v: &str| SanMatcher {
        san_type: t,
        matcher: StringMatcher::exact(v),
    };
    let dns = |v: &str| San::Dns(v.into());
    // DNS: case-insensitive, and a certificate's wildcard covers one label.
    assert!(san_matches(
        &exact(None, "api.example.com"),
        &dns("API.example.com")
    ));
    assert!(san_matches(
        &exact(Some(SanType::Dns), "api.example.com"),
        &dns("*.example.com")
    ));
    assert!(!san_matches(
        &exact(None, "a.b.example.com"),
        &dns("*.example.com")
    ));
    assert!(!san_matches(
        &exact(None, "example.com"),
        &dns("*.example.com")
    ));
    // Typed matchers look only at their type; untyped ones at every type.
    assert!(!san_matches(
        &exact(Some(SanType::Uri), "api.example.com"),
        &dns("api.example.com")
    ));
    assert!(san_matches(
        &exact(None, "spiffe://td/ns/a/sa/b"),
        &San::Uri("spiffe://td/ns/a/sa/b".into())
    ));
    assert!(san_matches(
        &exact(Some(SanType::IpAddress), "10.0.0.1"),
        &San::Ip("10.0.0.1".parse().unwrap())
    ));
    let suffix = SanMatcher {
        san_type: Some(SanType::Dns),
        matcher: StringMatcher {
            kind: remora_xds::model::matcher::StringMatch::Suffix(".example.com".into()),
            ignore_case: false,
        },
    };
    assert!(san_matches(&suffix, &dns("api.example.com")));
    assert!(!san_matches(&suffix, &dns("api.example.org")));
}

#[tokio::test]
async fn auto_sni_and_san_validation_take_the_requests_host() {
    use crate::upstream::transport::host_of;
    assert_eq!(host_of("api.example.com:443"), "api.example.com");
    assert_eq!(host_of("api.example.com"), "api.example.com");
    assert_eq!(host_of("[2001:db8::1]:80"), "2001:db8::1");
    assert_eq!(host_of("10.0.0.1:80"), "10.0.0.1");
    // What the converter lets through as an SNI, rustls sends.
    for sni in ["api.example.com.", "outbound_.80_._.a.b"] {
        assert!(
            matches!(
                ServerName::try_from(sni.to_string()),
                Ok(ServerName::DnsName(_))
            ),
            "{sni}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("origin");
    std::fs::write(dir.path().join("ca.pem"), ca.cert.pem()).unwrap();
    let (chain, key) = ca.dns(&["api.example.com"]);
    let server = Arc::new(Server {
        cert: certified(&chain, &key),
        sni: StdMutex::default(),
    });
    let sc = server_config(Arc::clone(&server), None);
    let base = OriginTls {
        sni: None,
        ..(*origin(dir.path(), &[], false)).clone()
    };
    // An IP address is no SNI; the SAN check still asks for it.
    let by_ip = base.for_host("10.0.0.1", true, true);
    assert_eq!(by_ip.sni, None);
    assert_eq!(by_ip.subject_alt_names.len(), 1);
    let origins = Origins::default();
    for (host, ok) in [("api.example.com", true), ("other.example.com", false)] {
        let tls = Arc::new(base.for_host(host, true, true));
        assert_eq!(tls.sni.as_deref(), Some(host));
        let config = origins.client_config(&tls, &[], None).unwrap();
        assert_eq!(handshake(config, Arc::clone(&sc), host).await, ok, "{host}");
        assert_eq!(
            server
                .sni
                .lock()
                .unwrap()
                .last()
                .cloned()
                .flatten()
                .as_deref(),
            Some(host)
        );
    }
    // auto_sni alone: the socket's SAN matchers stay.
    let kept =
        origin(dir.path(), &["api.example.com"], false).for_host("x.example.com", true, false);
    assert_eq!(kept.sni.as_deref(), Some("x.example.com"));
    assert_eq!(
        kept.subject_alt_names[0].matcher,
        StringMatcher::exact("api.example.com")
    );
}

/// A store holding `secrets` (name, then the secret's PEM parts), as istiod's SDS delivers
/// them over ADS.
fn store_with(store: &remora_xds::store::Store, secrets: &[(&str, Secret)]) {
    use prost::Message;
    use remora_xds::sink::{type_url, Resource, Sink, Update};
    let resources = secrets
        .iter()
        .map(|(name, secret)| {
            let proto = secret_proto(name, secret);
            Resource {
                name: (*name).to_string(),
                version: "1".into(),
                body: proto.encode_to_vec(),
            }
        })
        .collect();
    let applied = store.apply(
        type_url::SECRET,
        Update {
            resources,
            removed: vec![],
            complete: false,
        },
    );
    assert!(applied.rejected.is_empty(), "{:?}", applied.rejected);
}

enum Secret {
    Certificate(String, String),
    Roots(String),
}

fn secret_proto(
    name: &str,
    secret: &Secret,
) -> envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret {
    use envoy_types::pb::envoy::config::core::v3::{data_source::Specifier, DataSource};
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3 as tls;
    let inline = |s: &str| DataSource {
        specifier: Some(Specifier::InlineBytes(s.as_bytes().to_vec())),
        ..Default::default()
    };
    let r#type = match secret {
        Secret::Certificate(chain, key) => tls::secret::Type::TlsCertificate(tls::TlsCertificate {
            certificate_chain: Some(inline(chain)),
            private_key: Some(inline(key)),
            ..Default::default()
        }),
        Secret::Roots(ca) => {
            tls::secret::Type::ValidationContext(tls::CertificateValidationContext {
                trusted_ca: Some(inline(ca)),
                ..Default::default()
            })
        }
    };
    tls::Secret {
        name: name.to_string(),
        r#type: Some(r#type),
    }
}

#[tokio::test]
async fn credential_secrets_from_the_store_originate_and_rotate() {
    let ca = Ca::new("origin");
    let (chain, key) = ca.dns(&["api.example.com"]);
    let server = Arc::new(Server {
        cert: certified(&chain, &key),
        sni: StdMutex::default(),
    });
    let sc = server_config(server, Some(&ca));
    let tls = Arc::new(OriginTls {
        sni: Some("api.example.com".into()),
        alpn: vec![],
        keeps_alpn: true,
        roots: Some(Roots::Secret("kubernetes://cred-cacert".into())),
        subject_alt_names: vec![SanMatcher {
            san_type: None,
            matcher: StringMatcher::exact("api.example.com"),
        }],
        client_certificate: Some(ClientCertificate::Secret("kubernetes://cred".into())),
        tls13_only: false,
    });
    let origins = Origins::default();
    let store = remora_xds::store::Store::new();
    // Nothing received yet: the connection fails, naming the secret, as Envoy's does once
    // its cluster stops waiting for it.
    let err = origins
        .client_config(&tls, &[], Some(&store.snapshot()))
        .unwrap_err();
    assert!(
        matches!(&err, OriginError::SecretMissing { name } if name == "kubernetes://cred-cacert"),
        "{err}"
    );
    let (client_chain, client_key) = ca.dns(&["client.example.com"]);
    store_with(
        &store,
        &[
            ("kubernetes://cred-cacert", Secret::Roots(ca.cert.pem())),
            (
                "kubernetes://cred",
                Secret::Certificate(client_chain, client_key),
            ),
        ],
    );
    let first = origins
        .client_config(&tls, &[], Some(&store.snapshot()))
        .unwrap();
    assert!(handshake(Arc::clone(&first), Arc::clone(&sc), "api.example.com").await);
    assert!(Arc::ptr_eq(
        &first,
        &origins
            .client_config(&tls, &[], Some(&store.snapshot()))
            .unwrap()
    ));
    // A rotated client certificate: a new config for the next connection.
    let (rotated_chain, rotated_key) = ca.dns(&["client.example.com", "rotated.example.com"]);
    store_with(
        &store,
        &[(
            "kubernetes://cred",
            Secret::Certificate(rotated_chain, rotated_key),
        )],
    );
    let second = origins
        .client_config(&tls, &[], Some(&store.snapshot()))
        .unwrap();
    assert!(!Arc::ptr_eq(&first, &second));
    assert!(handshake(second, Arc::clone(&sc), "api.example.com").await);
    // Roots of another CA: the server's chain leads nowhere.
    store_with(
        &store,
        &[(
            "kubernetes://cred-cacert",
            Secret::Roots(Ca::new("other").cert.pem()),
        )],
    );
    let untrusted = origins
        .client_config(&tls, &[], Some(&store.snapshot()))
        .unwrap();
    assert!(!handshake(untrusted, sc, "api.example.com").await);
    // A secret of the wrong kind in a socket's place fails naming it.
    let swapped = Arc::new(OriginTls {
        roots: Some(Roots::Secret("kubernetes://cred".into())),
        ..(*tls).clone()
    });
    let err = origins
        .client_config(&swapped, &[], Some(&store.snapshot()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("kubernetes://cred") && err.contains("named as the trusted roots"),
        "{err}"
    );
}
