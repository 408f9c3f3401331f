//! Checking a mesh server's certificate: it must chain to the mesh roots, as any certificate
//! must, and carry one of the SPIFFE IDs the destination is declared with. Istio's workload
//! certificates name their workload only in a URI SAN, never in a DNS name, so rustls' usual
//! host-name check does not apply; this verifier replaces it with the SPIFFE ID check.

use crate::identity::CertSummary;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};
use std::sync::Arc;

/// A server verifier for mesh destinations.
#[derive(Debug)]
pub struct SpiffeServerVerifier {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
    /// The SPIFFE IDs accepted; empty accepts any that chains to the roots.
    expected: Vec<String>,
}

impl SpiffeServerVerifier {
    pub fn new(
        roots: Arc<RootCertStore>,
        provider: Arc<CryptoProvider>,
        expected: Vec<String>,
    ) -> Self {
        SpiffeServerVerifier {
            roots,
            provider,
            expected,
        }
    }
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        if self.expected.is_empty() {
            return Ok(ServerCertVerified::assertion());
        }
        let uris = CertSummary::parse(end_entity)
            .map(|s| s.uri_sans)
            .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
        if uris.iter().any(|u| self.expected.contains(u)) {
            Ok(ServerCertVerified::assertion())
        } else {
            tracing::debug!(presented = ?uris, expected = ?self.expected, "server SPIFFE ID not expected");
            Err(Error::InvalidCertificate(CertificateError::NotValidForName))
        }
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
