//! Checking a server's certificate. Every verifier of Remora's checks the handshake's
//! signatures the same way, with the crypto provider's algorithms ([`Verifier`]); what differs
//! is what the certificate itself must be ([`CertificateCheck`]).
//!
//! A mesh server's certificate must chain to the mesh roots, as any certificate must, and
//! carry one of the SPIFFE IDs the destination is declared with ([`SpiffeIds`]). Istio's
//! workload certificates name their workload only in a URI SAN, never in a DNS name, so rustls'
//! usual host-name check does not apply; this check replaces it.

use crate::identity::CertSummary;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};
use std::sync::Arc;

/// What a server's certificate must be, for one kind of verifier.
pub trait CertificateCheck: std::fmt::Debug + Send + Sync {
    /// Accept (`Ok`) or refuse the certificate presented.
    fn check(&self, presented: &Presented<'_>) -> Result<(), Error>;
}

/// The certificate a server presented (leaf and intermediates), when, and the algorithms
/// that check its chain's signatures.
pub struct Presented<'a> {
    pub end_entity: &'a CertificateDer<'a>,
    pub intermediates: &'a [CertificateDer<'a>],
    pub now: UnixTime,
    pub provider: &'a CryptoProvider,
}

impl Presented<'_> {
    /// Whether it chains to `roots`, as every certificate must.
    pub fn chains_to(&self, roots: &RootCertStore) -> Result<(), Error> {
        let cert = ParsedCertificate::try_from(self.end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            roots,
            self.intermediates,
            self.now,
            self.provider.signature_verification_algorithms.all,
        )
    }
}

/// A rustls server verifier: the certificate by its check, the handshake's signatures by the
/// provider's algorithms.
#[derive(Debug)]
pub struct Verifier<C> {
    check: C,
    provider: Arc<CryptoProvider>,
}

impl<C: CertificateCheck> Verifier<C> {
    pub fn with_check(check: C, provider: Arc<CryptoProvider>) -> Self {
        Verifier { check, provider }
    }
}

impl<C: CertificateCheck> ServerCertVerifier for Verifier<C> {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let presented = Presented {
            end_entity,
            intermediates,
            now,
            provider: &self.provider,
        };
        self.check.check(&presented)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A mesh server: chains to the mesh roots and carries one of the expected SPIFFE IDs.
#[derive(Debug)]
pub struct SpiffeIds {
    roots: Arc<RootCertStore>,
    /// The SPIFFE IDs accepted; empty accepts any that chains to the roots.
    expected: Vec<String>,
}

/// A server verifier for mesh destinations.
pub type SpiffeServerVerifier = Verifier<SpiffeIds>;

impl SpiffeServerVerifier {
    pub fn new(
        roots: Arc<RootCertStore>,
        provider: Arc<CryptoProvider>,
        expected: Vec<String>,
    ) -> Self {
        Verifier::with_check(SpiffeIds { roots, expected }, provider)
    }
}

impl CertificateCheck for SpiffeIds {
    fn check(&self, presented: &Presented<'_>) -> Result<(), Error> {
        presented.chains_to(&self.roots)?;
        if self.expected.is_empty() {
            return Ok(());
        }
        let uris = CertSummary::parse(presented.end_entity)
            .map(|s| s.uri_sans)
            .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
        if uris.iter().any(|u| self.expected.contains(u)) {
            Ok(())
        } else {
            tracing::debug!(presented = ?uris, expected = ?self.expected, "server SPIFFE ID not expected");
            Err(Error::InvalidCertificate(CertificateError::NotValidForName))
        }
    }
}
