//! The SANs an inbound chain's validation context accepts of a client certificate
//! (`match_subject_alt_names`; istiod's: `spiffe://<trust domain>/`), checked as Envoy checks
//! them: while verifying the certificate in the handshake, so a certificate outside them is
//! refused with the `certificate_unknown` alert Envoy sends, not a reset once it is done.

use super::Peer;
use remora_xds::model::cluster::{SanMatcher, SanType};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, OtherError};
use std::sync::Arc;

/// Whether `peer`'s certificate carries a SAN one of `sans` accepts (none listed: any). A
/// matcher without a type takes the URI SAN (the SPIFFE ID) or any DNS SAN.
pub fn allowed(sans: &[SanMatcher], peer: &Peer) -> bool {
    if sans.is_empty() {
        return true;
    }
    let uri = peer
        .spiffe_id
        .as_ref()
        .map(crate::identity::SpiffeId::as_str);
    let dns = |m: &SanMatcher| peer.dns_sans.iter().any(|d| m.matcher.matches(d));
    sans.iter().any(|san| match san.san_type {
        None => uri.is_some_and(|u| san.matcher.matches(u)) || dns(san),
        Some(SanType::Uri) => uri.is_some_and(|u| san.matcher.matches(u)),
        Some(SanType::Dns) => dns(san),
        Some(SanType::Email | SanType::IpAddress) => false,
    })
}

/// The error a certificate outside the SANs is refused with (the alert `certificate_unknown`,
/// as Envoy's; counted as `wrong_san`).
#[derive(Debug)]
pub struct WrongSan;

impl std::fmt::Display for WrongSan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client certificate's SAN is not one the chain accepts")
    }
}

impl std::error::Error for WrongSan {}

/// The roots' verifier, then the SANs.
#[derive(Debug)]
pub(super) struct SanVerifier {
    pub inner: Arc<dyn ClientCertVerifier>,
    pub sans: Vec<SanMatcher>,
}

impl ClientCertVerifier for SanVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let peer = Peer::from_chain(std::slice::from_ref(end_entity), None);
        if peer.is_some_and(|p| allowed(&self.sans, &p)) {
            return Ok(verified);
        }
        Err(rustls::Error::InvalidCertificate(CertificateError::Other(
            OtherError(Arc::new(WrongSan)),
        )))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
