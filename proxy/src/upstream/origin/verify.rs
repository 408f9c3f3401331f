//! Checking an origin server's certificate as Envoy's default validator does for a
//! DestinationRule's TLS: the chain must lead to the given roots, and when SAN matchers are
//! given one SAN of the leaf must match one of them. The SNI is not compared with the
//! certificate (Envoy checks names only through the matchers), and with no roots
//! (`insecureSkipVerify`) nothing about the certificate is checked, only the handshake's
//! signature by its key.

use crate::tls::verify::{CertificateCheck, Presented, Verifier};
use remora_xds::model::cluster::{SanMatcher, SanType};
use remora_xds::model::matcher::StringMatch;
use rustls::crypto::CryptoProvider;
use rustls::{CertificateError, Error, RootCertStore};
use std::net::IpAddr;
use std::sync::Arc;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// What an origin server's certificate must be for a DestinationRule's origination.
#[derive(Debug)]
pub struct OriginCheck {
    /// `None`: the chain is not checked.
    roots: Option<Arc<RootCertStore>>,
    sans: Vec<SanMatcher>,
}

/// A server verifier for a DestinationRule's origination.
pub type OriginVerifier = Verifier<OriginCheck>;

impl OriginVerifier {
    pub fn new(
        roots: Option<Arc<RootCertStore>>,
        provider: Arc<CryptoProvider>,
        sans: Vec<SanMatcher>,
    ) -> Self {
        Verifier::with_check(OriginCheck { roots, sans }, provider)
    }
}

/// One SAN of a certificate, by type.
#[derive(Debug, PartialEq)]
pub(super) enum San {
    Dns(String),
    Uri(String),
    Email(String),
    Ip(IpAddr),
}

/// The SANs of a DER certificate.
pub(super) fn sans(der: &[u8]) -> Result<Vec<San>, Error> {
    let bad = || Error::InvalidCertificate(CertificateError::BadEncoding);
    let (_, cert) = X509Certificate::from_der(der).map_err(|_| bad())?;
    let mut out = Vec::new();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for name in &ext.value.general_names {
            match name {
                GeneralName::DNSName(d) => out.push(San::Dns(d.to_string())),
                GeneralName::URI(u) => out.push(San::Uri(u.to_string())),
                GeneralName::RFC822Name(e) => out.push(San::Email(e.to_string())),
                GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*bytes).ok().map(IpAddr::from),
                        _ => None,
                    };
                    out.extend(ip.map(San::Ip));
                }
                _ => {}
            }
        }
    }
    Ok(out)
}

/// Whether `san` satisfies `m`, as Envoy's SAN matchers decide: of the matcher's type (any
/// type for the untyped `match_subject_alt_names`, which Envoy applies to each), and for a
/// DNS SAN an exact value also matches a certificate's wildcard for one label.
pub(super) fn san_matches(m: &SanMatcher, san: &San) -> bool {
    let (kind, value) = match san {
        San::Dns(v) => (SanType::Dns, v.clone()),
        San::Uri(v) => (SanType::Uri, v.clone()),
        San::Email(v) => (SanType::Email, v.clone()),
        San::Ip(ip) => (SanType::IpAddress, ip.to_string()),
    };
    if m.san_type.is_some_and(|t| t != kind) {
        return false;
    }
    match (&m.matcher.kind, kind) {
        (StringMatch::Exact(want), SanType::Dns) if !m.matcher.ignore_case => {
            dns_name_matches(want, &value)
        }
        _ => m.matcher.matches(&value),
    }
}

/// Envoy's `dnsNameMatch`: the name equals the certificate's DNS SAN, ignoring case, or the
/// SAN is `*.rest` and the name is one label followed by `.rest`.
fn dns_name_matches(name: &str, san: &str) -> bool {
    if name.eq_ignore_ascii_case(san) {
        return true;
    }
    let Some(rest) = san.strip_prefix("*.") else {
        return false;
    };
    match name.split_once('.') {
        Some((label, suffix)) => !label.is_empty() && suffix.eq_ignore_ascii_case(rest),
        None => false,
    }
}

impl CertificateCheck for OriginCheck {
    fn check(&self, presented: &Presented<'_>) -> Result<(), Error> {
        let Some(roots) = &self.roots else {
            return Ok(());
        };
        presented.chains_to(roots)?;
        if self.sans.is_empty() {
            return Ok(());
        }
        let names = sans(presented.end_entity)?;
        if names
            .iter()
            .any(|san| self.sans.iter().any(|m| san_matches(m, san)))
        {
            Ok(())
        } else {
            tracing::debug!(presented = ?names, "origin server's SANs match none expected");
            Err(Error::InvalidCertificate(CertificateError::NotValidForName))
        }
    }
}
