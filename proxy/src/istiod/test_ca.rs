//! A CA for unit tests: signs CSRs as istiod does (the CSR's public key and URI SAN, the
//! requested lifetime), or wrongly on purpose.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateSigningRequestDer;
use std::time::{Duration, SystemTime};
use x509_parser::prelude::{FromDer, X509CertificationRequest};

/// A self-signed root and its key.
pub(crate) struct TestCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

/// How to sign.
#[derive(Default)]
pub(crate) struct Signing<'a> {
    /// Put this URI SAN in place of the CSR's.
    pub uri: Option<&'a str>,
    /// Certify a key other than the CSR's.
    pub other_key: bool,
}

struct CsrKey(Vec<u8>);

impl rcgen::PublicKeyData for CsrKey {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }
    fn algorithm(&self) -> &rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

impl TestCa {
    pub(crate) fn new() -> TestCa {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "cluster.local");
        let cert = params.self_signed(&key).unwrap();
        TestCa { cert, key }
    }

    pub(crate) fn root_pem(&self) -> String {
        self.cert.pem()
    }

    /// `[leaf, root]` for `csr_pem`, valid from now for `ttl`.
    pub(crate) fn sign(&self, csr_pem: &str, ttl: Duration, how: &Signing<'_>) -> Vec<String> {
        let der = CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes()).unwrap();
        let (_, csr) = X509CertificationRequest::from_der(der.as_ref()).unwrap();
        let uris: Vec<String> = csr
            .requested_extensions()
            .into_iter()
            .flatten()
            .filter_map(|e| match e {
                x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) => {
                    Some(san.general_names.iter().filter_map(|n| match n {
                        x509_parser::prelude::GeneralName::URI(u) => Some(u.to_string()),
                        _ => None,
                    }))
                }
                _ => None,
            })
            .flatten()
            .collect();
        let uri = how
            .uri
            .map(str::to_string)
            .or_else(|| uris.first().cloned())
            .unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![rcgen::SanType::URI(uri.as_str().try_into().unwrap())];
        let now = SystemTime::now();
        params.not_before = now.into();
        params.not_after = (now + ttl).into();
        params.serial_number = Some(rcgen::SerialNumber::from(fastrand::u64(..)));
        let leaf = if how.other_key {
            let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
            params.signed_by(&other, &self.cert, &self.key).unwrap()
        } else {
            let key = CsrKey(
                csr.certification_request_info
                    .subject_pki
                    .subject_public_key
                    .data
                    .to_vec(),
            );
            params.signed_by(&key, &self.cert, &self.key).unwrap()
        };
        vec![leaf.pem(), self.root_pem()]
    }
}
