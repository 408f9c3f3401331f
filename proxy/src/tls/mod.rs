//! Mutual TLS between sidecars, as Istio speaks it.
//!
//! The crypto is rustls with the `ring` provider: ring builds with nothing but a C compiler,
//! where aws-lc-rs needs cmake (and Go or bindgen on some targets). Inbound, a ClientHello that
//! offers one of Istio's ALPN values ([`client_hello`]) is mesh traffic and is terminated with
//! the workload certificate, requiring a client certificate that chains to the mesh roots
//! ([`Mesh::server_config`]); the peer's SPIFFE ID then names it in metrics and
//! `x-forwarded-client-cert` ([`xfcc`]). Outbound, traffic to a declared mesh destination is
//! wrapped in TLS with Istio's ALPN values and Istio's SNI, and the server must chain to the
//! roots and carry an expected SPIFFE ID ([`verify`]). The certificate comes from the
//! [`crate::identity`] store at each handshake, so a rotation applies to the next one.

mod chain;
pub mod client_hello;
pub mod client_sans;
pub mod stream;
pub mod verify;
pub mod xfcc;

use crate::identity::{CertSummary, Identity, SpiffeId, Store};
use crate::metadata_exchange::{LocalHeader, WorkloadMetadata};
use arc_swap::ArcSwapOption;
pub use chain::ChainParams;
use remora_config::{TlsConfig, TlsVersion};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, ServerConfig};
use std::sync::Arc;

/// Offered by Istio's sidecars when they speak metadata exchange on a TCP connection.
pub const ALPN_PEER_EXCHANGE: &[u8] = b"istio-peer-exchange";
/// Mesh traffic, whatever it carries.
pub const ALPN_ISTIO: &[u8] = b"istio";
pub const ALPN_HTTP10: &[u8] = b"istio-http/1.0";
pub const ALPN_HTTP11: &[u8] = b"istio-http/1.1";
pub const ALPN_H2: &[u8] = b"istio-h2";

/// The ALPN values that make a ClientHello mesh traffic: what Istio's inbound listener matches
/// its mutual-TLS filter chains on.
pub const MESH_ALPNS: [&[u8]; 5] = [
    ALPN_PEER_EXCHANGE,
    ALPN_ISTIO,
    ALPN_HTTP10,
    ALPN_HTTP11,
    ALPN_H2,
];

/// What the inbound side selects from a mesh client's offer, best first (rustls picks the first
/// of these the client offers). Istio's clients offer `istio-peer-exchange` only for TCP, and
/// selecting it commits both sides to [`crate::metadata_exchange`] before the stream, which
/// the inbound leg then speaks; a client that offers an HTTP value gets that instead, as from
/// Istio's sidecars, whose HTTP carries peer metadata in headers.
const SERVER_ALPNS: [&[u8]; 7] = [
    ALPN_HTTP11,
    ALPN_HTTP10,
    ALPN_H2,
    ALPN_PEER_EXCHANGE,
    ALPN_ISTIO,
    b"h2",
    b"http/1.1",
];

/// The crypto provider every TLS config here uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

static TLS13_ONLY: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
static TLS12_AND_13: [&rustls::SupportedProtocolVersion; 2] =
    [&rustls::version::TLS13, &rustls::version::TLS12];

pub(crate) fn versions(min: TlsVersion) -> &'static [&'static rustls::SupportedProtocolVersion] {
    match min {
        TlsVersion::Tls13 => &TLS13_ONLY,
        TlsVersion::Tls12 => &TLS12_AND_13,
    }
}

/// Why a TLS config could not be built.
#[derive(Debug, thiserror::Error)]
#[error("building the TLS config: {0}")]
pub struct ConfigError(String);

/// The identity and the TLS configs built from it.
#[derive(Debug, Default)]
pub struct Mesh {
    pub identity: Arc<Store>,
    /// Our metadata-exchange header, sent first on `istio-peer-exchange` connections.
    pub exchange_header: LocalHeader,
    /// The same metadata as HTTP headers, for requests to mesh servers and answers to mesh
    /// clients.
    pub exchange_headers: crate::metadata_exchange::http::LocalHeaders,
    /// The server config for the current identity and settings; rebuilt when either changes.
    server: ArcSwapOption<CachedServer>,
    /// The server configs built for xDS inbound chains, one per ALPN list and client
    /// certificate requirement; all dropped when the identity or settings change.
    chain_servers: ArcSwapOption<chain::CachedChainServers>,
    /// The client configs built for the current identity and settings, one per expected
    /// server identities and ALPN offer; all dropped when the identity or settings change.
    clients: ArcSwapOption<CachedClients>,
}

/// At most this many client configs are kept (one per mesh destination's identities and ALPN
/// offer; a full cache starts again empty), so that a long list of destinations stays bounded.
const CACHED_CLIENTS: usize = 64;

#[derive(Debug)]
struct CachedClients {
    identity: Arc<Identity>,
    min: TlsVersion,
    configs: Vec<CachedClient>,
}

#[derive(Debug, Clone)]
struct CachedClient {
    expected: Vec<String>,
    alpn: Vec<Vec<u8>>,
    config: Arc<ClientConfig>,
}

#[derive(Debug)]
struct CachedServer {
    identity: Arc<Identity>,
    min: TlsVersion,
    config: Arc<ServerConfig>,
}

impl Mesh {
    /// A mesh whose identity lives in `identity`.
    pub fn new(identity: Arc<Store>) -> Self {
        Mesh {
            identity,
            exchange_header: LocalHeader::default(),
            exchange_headers: Default::default(),
            server: ArcSwapOption::empty(),
            chain_servers: ArcSwapOption::empty(),
            clients: ArcSwapOption::empty(),
        }
    }

    /// Describe this workload as `header` in metadata exchange, and as `headers` in HTTP's.
    pub fn with_exchange_header(
        mut self,
        header: LocalHeader,
        headers: crate::metadata_exchange::http::LocalHeaders,
    ) -> Self {
        self.exchange_header = header;
        self.exchange_headers = headers;
        self
    }

    /// Whether a workload certificate is loaded.
    pub fn has_identity(&self) -> bool {
        self.identity.is_loaded()
    }

    /// The config that terminates inbound mesh TLS, requiring a client certificate that chains
    /// to the roots; `None` without an identity.
    pub fn server_config(&self, tls: &TlsConfig) -> Option<Result<Arc<ServerConfig>, ConfigError>> {
        let identity = self.identity.current()?;
        let min = tls.min_protocol_version;
        if let Some(c) = self.server.load().as_ref() {
            if Arc::ptr_eq(&c.identity, &identity) && c.min == min {
                return Some(Ok(Arc::clone(&c.config)));
            }
        }
        let built = build_server(&identity, min).map(Arc::new);
        if let Ok(config) = &built {
            self.server.store(Some(Arc::new(CachedServer {
                identity,
                min,
                config: Arc::clone(config),
            })));
        }
        Some(built)
    }

    /// The config for an outbound connection: the workload certificate, `alpn` offered, and a
    /// server that must chain to the roots and carry one of `expected` (any, if empty).
    ///
    /// Built once per identity, settings, `expected` and `alpn`, and shared by every
    /// connection that asks for the same: a config built per connection cost each one 16 KiB
    /// for as long as it lived (rustls's session cache, sized for 256 servers, that no other
    /// connection could use).
    pub fn client_config(
        &self,
        tls: &TlsConfig,
        expected: &[String],
        alpn: &[&[u8]],
    ) -> Option<Result<Arc<ClientConfig>, ConfigError>> {
        let identity = self.identity.current()?;
        let min = tls.min_protocol_version;
        let cached = self.clients.load_full();
        let current = cached
            .as_ref()
            .filter(|c| Arc::ptr_eq(&c.identity, &identity) && c.min == min);
        if let Some(hit) = current.and_then(|c| {
            c.configs.iter().find(|k| {
                k.expected == expected && k.alpn.iter().map(Vec::as_slice).eq(alpn.iter().copied())
            })
        }) {
            return Some(Ok(Arc::clone(&hit.config)));
        }
        let built = build_client(&identity, min, expected, alpn).map(Arc::new);
        if let Ok(config) = &built {
            // Keep what is cached for this identity, unless it is full; a race with another
            // connection costs one config built twice, never a wrong one.
            let mut configs = current
                .filter(|c| c.configs.len() < CACHED_CLIENTS)
                .map(|c| c.configs.clone())
                .unwrap_or_default();
            configs.push(CachedClient {
                expected: expected.to_vec(),
                alpn: alpn.iter().map(|p| p.to_vec()).collect(),
                config: Arc::clone(config),
            });
            self.clients.store(Some(Arc::new(CachedClients {
                identity,
                min,
                configs,
            })));
        }
        Some(built)
    }
}

fn build_client(
    identity: &Identity,
    min: TlsVersion,
    expected: &[String],
    alpn: &[&[u8]],
) -> Result<ClientConfig, ConfigError> {
    let provider = provider();
    let verifier = verify::SpiffeServerVerifier::new(
        Arc::clone(&identity.roots),
        Arc::clone(&provider),
        expected.to_vec(),
    );
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions(min))
        .map_err(|e| ConfigError(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_cert_resolver(Arc::new(Fixed(Arc::clone(&identity.certified))));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    // As inbound: no session is resumed, so every connection checks the server's certificate
    // and identity afresh, and a rotated or revoked one is never honoured from a ticket.
    config.resumption = rustls::client::Resumption::disabled();
    Ok(config)
}

fn build_server(identity: &Identity, min: TlsVersion) -> Result<ServerConfig, ConfigError> {
    let provider = provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(
        Arc::clone(&identity.roots),
        Arc::clone(&provider),
    )
    .build()
    .map_err(|e| ConfigError(e.to_string()))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions(min))
        .map_err(|e| ConfigError(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(Fixed(Arc::clone(&identity.certified))));
    config.alpn_protocols = SERVER_ALPNS.iter().map(|p| p.to_vec()).collect();
    // Sessions are not resumed: each connection proves its client certificate afresh, so a
    // revoked or rotated peer certificate is never honoured from a ticket.
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    Ok(config)
}

/// Presents the same certificate to every peer.
#[derive(Debug)]
pub(crate) struct Fixed(pub(crate) Arc<CertifiedKey>);

impl rustls::server::ResolvesServerCert for Fixed {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }
}

impl rustls::client::ResolvesClientCert for Fixed {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Who is at the other end of a mutual-TLS connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The SPIFFE ID of its certificate; `None` if it has none.
    pub spiffe_id: Option<SpiffeId>,
    /// Its certificate's URI SANs in order, the SPIFFE ID among them (what an RBAC
    /// `authenticated` principal matches first).
    pub uri_sans: Vec<String>,
    /// SHA-256 of its certificate, lower-case hex (`Hash=` in x-forwarded-client-cert).
    pub cert_hash: String,
    /// Its certificate's subject, as Envoy prints it (`""` when empty).
    pub subject: String,
    pub dns_sans: Vec<String>,
    /// The ALPN value negotiated, if any.
    pub alpn: Option<Vec<u8>>,
    /// Which workload it is, when it said so in metadata exchange.
    pub metadata: Option<Arc<WorkloadMetadata>>,
    /// The mesh service we dialled it as (a server of ours with a destination's hostname).
    pub service: Option<Arc<str>>,
}

impl Peer {
    /// Describe the peer from its certificate chain (leaf first) and the negotiated ALPN.
    pub fn from_chain(chain: &[CertificateDer<'_>], alpn: Option<&[u8]>) -> Option<Peer> {
        let leaf = chain.first()?;
        let summary = CertSummary::parse(leaf).ok()?;
        let digest = ring::digest::digest(&ring::digest::SHA256, leaf);
        Some(Peer {
            spiffe_id: summary.spiffe_id(),
            uri_sans: summary.uri_sans,
            cert_hash: digest.as_ref().iter().map(|b| format!("{b:02x}")).collect(),
            subject: xfcc::subject(leaf),
            dns_sans: summary.dns_sans,
            alpn: alpn.map(<[u8]>::to_vec),
            metadata: None,
            service: None,
        })
    }

    /// Istio's principal label: the SPIFFE ID without its scheme, or `unknown`.
    pub fn principal(&self) -> String {
        match &self.spiffe_id {
            Some(id) => id.as_str().to_string(),
            None => crate::workload::UNKNOWN.to_string(),
        }
    }
}

/// What one outbound mesh handshake is: where to, offering what, and how long it may take.
pub struct Originating<'a> {
    pub client: Arc<ClientConfig>,
    pub name: rustls::pki_types::ServerName<'static>,
    pub timeout: std::time::Duration,
    pub destination: std::net::SocketAddr,
    pub direction: crate::Direction,
    pub metrics: &'a crate::metrics::TlsMetrics,
}

/// Originate mesh TLS on `stream`: bounded in time, counted (`ok` or why not), and a failure
/// logged, for the TCP copy and the HTTP client alike.
pub async fn originate(
    stream: tokio::net::TcpStream,
    o: Originating<'_>,
) -> Result<stream::ClientStream, HandshakeFailure> {
    let connecting = tokio_rustls::TlsConnector::from(o.client).connect(o.name, stream);
    let (failure, error) = match tokio::time::timeout(o.timeout, connecting).await {
        Ok(Ok(tls)) => {
            o.metrics.handshake(o.direction, "ok");
            return Ok(tls);
        }
        Ok(Err(e)) => (HandshakeFailure::of(&e), e.to_string()),
        Err(_) => (HandshakeFailure::Timeout, "timed out".to_string()),
    };
    o.metrics.handshake(o.direction, failure.as_str());
    tracing::warn!(
        destination = %o.destination, reason = failure.as_str(), %error,
        "outbound TLS handshake failed"
    );
    Err(failure)
}

/// Why a handshake failed, as a metric label and a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// The peer presented no certificate.
    NoCertificate,
    /// The certificate does not chain to the mesh roots.
    UnknownCa,
    /// The certificate is expired or not valid yet.
    Expired,
    /// The certificate lacks the expected SPIFFE ID.
    WrongSan,
    /// The peer refused our certificate.
    RefusedByPeer,
    /// Not within `tls.handshake_timeout`.
    Timeout,
    /// Anything else: a protocol error, a reset.
    Other,
}

impl HandshakeFailure {
    /// Classify an error from a handshake.
    pub fn of(e: &std::io::Error) -> HandshakeFailure {
        use rustls::{AlertDescription as A, CertificateError as C, Error as E};
        let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<E>()) else {
            return HandshakeFailure::Other;
        };
        match tls {
            E::NoCertificatesPresented => HandshakeFailure::NoCertificate,
            E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
                HandshakeFailure::UnknownCa
            }
            E::InvalidCertificate(C::Expired | C::NotValidYet)
            | E::InvalidCertificate(C::ExpiredContext { .. } | C::NotValidYetContext { .. }) => {
                HandshakeFailure::Expired
            }
            E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
                HandshakeFailure::WrongSan
            }
            E::InvalidCertificate(C::Other(o)) if o.0.is::<client_sans::WrongSan>() => {
                HandshakeFailure::WrongSan
            }
            E::AlertReceived(
                A::BadCertificate
                | A::UnknownCA
                | A::CertificateExpired
                | A::CertificateRequired
                | A::CertificateUnknown
                | A::AccessDenied,
            ) => HandshakeFailure::RefusedByPeer,
            _ => HandshakeFailure::Other,
        }
    }

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            HandshakeFailure::NoCertificate => "no_client_certificate",
            HandshakeFailure::UnknownCa => "unknown_ca",
            HandshakeFailure::Expired => "expired",
            HandshakeFailure::WrongSan => "wrong_san",
            HandshakeFailure::RefusedByPeer => "refused_by_peer",
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::Other => "error",
        }
    }
}

#[cfg(test)]
pub(crate) mod test_certs;
#[cfg(test)]
mod tests;
