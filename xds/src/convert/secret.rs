//! SDS secrets and ECDS extension configs. A secret is checked as Envoy checks one before
//! it replaces the running one (its SSL context is built, and a failure NACKs the update): the
//! chain and the trusted CA must be PEM certificates, the key a PEM private key that ring can
//! use and that matches the chain's leaf.

use super::any::unpack;
use super::http::http_filter;
use crate::model::listener::ExtensionConfig;
use crate::model::secret::{Secret, SecretKind};
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3 as tls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

const SPIFFE: &str = "envoy.extensions.transport_sockets.tls.v3.SPIFFECertValidatorConfig";

fn inline(d: Option<&core::DataSource>, path: &str) -> Result<Vec<u8>, Fault> {
    use core::data_source::Specifier as S;
    match d.and_then(|d| d.specifier.as_ref()) {
        None => Ok(Vec::new()),
        Some(S::InlineBytes(b)) => Ok(b.clone()),
        Some(S::InlineString(s)) => Ok(s.clone().into_bytes()),
        Some(_) => Err(Fault::new(path, "only inline secret data is supported")),
    }
}

/// PEM certificates, at least one.
fn certificates(pem: &[u8], path: &str) -> Result<Vec<CertificateDer<'static>>, Fault> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| Fault::new(path, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(Fault::new(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

/// How Envoy's config dump (and Remora's) shows a private key: withheld.
const REDACTED_KEY: &[u8] = b"[redacted]";

/// A client or server certificate: the chain, and a key that matches its leaf. The key's
/// bytes never reach a message. A key withheld from a config dump (`remora xds validate`
/// reading one) leaves only the chain to check; such a secret served for use would fail each
/// connection, naming the secret, as a key that cannot be read does.
fn check_certificate(chain: &[u8], key: &[u8]) -> Result<(), Fault> {
    let chain = certificates(chain, "tls_certificate.certificate_chain")?;
    if key == REDACTED_KEY {
        return Ok(());
    }
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|_| Fault::new("tls_certificate.private_key", "not a PEM private key"))?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|_| Fault::new("tls_certificate.private_key", "unusable private key"))?;
    CertifiedKey::new(chain, signing).keys_match().map_err(|e| {
        Fault::new(
            "tls_certificate.private_key",
            format!("does not match the certificate chain's leaf: {e}"),
        )
    })
}

/// Convert a secret.
pub fn secret(s: &tls::Secret) -> Result<Secret, Fault> {
    use tls::secret::Type;
    let kind = match &s.r#type {
        Some(Type::TlsCertificate(c)) => {
            if c.private_key_provider.is_some() || c.password.is_some() {
                return Err(Fault::new(
                    "tls_certificate",
                    "key providers and passwords not supported",
                ));
            }
            let certificate_chain = inline(
                c.certificate_chain.as_ref(),
                "tls_certificate.certificate_chain",
            )?;
            let private_key = inline(c.private_key.as_ref(), "tls_certificate.private_key")?;
            check_certificate(&certificate_chain, &private_key)?;
            SecretKind::TlsCertificate {
                certificate_chain,
                private_key,
            }
        }
        Some(Type::ValidationContext(v)) => {
            // SAN matchers belong to the transport socket's default validation context,
            // where istiod writes them; one in a secret would not be checked.
            if !v.match_subject_alt_names.is_empty() || !v.match_typed_subject_alt_names.is_empty()
            {
                return Err(Fault::new(
                    "validation_context",
                    "subject alt name matchers in a secret not supported (only in the transport socket)",
                ));
            }
            let mut spiffe_trust_domains = Vec::new();
            if let Some(custom) = &v.custom_validator_config {
                let at = "validation_context.custom_validator_config.typed_config";
                let any = custom
                    .typed_config
                    .as_ref()
                    .ok_or_else(|| Fault::new(at, "no typed_config"))?;
                let u = unpack(any, at)?;
                if u.message_name() != SPIFFE {
                    return Err(Fault::new(at, "certificate validator not supported")
                        .with_type(&u.type_url));
                }
                let cfg: tls::SpiffeCertValidatorConfig = u.to(at)?;
                for (i, d) in cfg.trust_domains.iter().enumerate() {
                    let bundle = inline(
                        d.trust_bundle.as_ref(),
                        &format!("{at}.trust_domains[{i}].trust_bundle"),
                    )?;
                    spiffe_trust_domains.push((d.name.clone(), bundle));
                }
            }
            let trusted_ca = inline(v.trusted_ca.as_ref(), "validation_context.trusted_ca")?;
            // SPIRE's form sets `trusted_ca: {}` beside its SPIFFE bundles: nothing to check.
            if !trusted_ca.is_empty() {
                certificates(&trusted_ca, "validation_context.trusted_ca")?;
            }
            SecretKind::ValidationContext {
                trusted_ca,
                spiffe_trust_domains,
            }
        }
        _ => {
            return Err(Fault::new(
                "",
                "only tls_certificate and validation_context secrets are supported",
            ))
        }
    };
    Ok(Secret {
        name: s.name.clone(),
        kind,
    })
}

/// Convert an ECDS extension config (an HTTP filter).
pub fn extension_config(e: &core::TypedExtensionConfig) -> Result<ExtensionConfig, Fault> {
    let any = e
        .typed_config
        .as_ref()
        .ok_or_else(|| Fault::new("typed_config", "no typed_config"))?;
    let u = unpack(any, "typed_config")?;
    let filter = http_filter(&e.name, &u, "typed_config").map_err(|f| f.with_type(&u.type_url))?;
    Ok(ExtensionConfig {
        name: e.name.clone(),
        filter,
    })
}

#[cfg(test)]
mod tests;
