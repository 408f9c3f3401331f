//! SDS secrets and ECDS extension configs.

use super::any::unpack;
use super::http::http_filter;
use crate::model::listener::ExtensionConfig;
use crate::model::secret::{Secret, SecretKind};
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3 as tls;

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
            SecretKind::TlsCertificate {
                certificate_chain: inline(
                    c.certificate_chain.as_ref(),
                    "tls_certificate.certificate_chain",
                )?,
                private_key: inline(c.private_key.as_ref(), "tls_certificate.private_key")?,
            }
        }
        Some(Type::ValidationContext(v)) => {
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
            SecretKind::ValidationContext {
                trusted_ca: inline(v.trusted_ca.as_ref(), "validation_context.trusted_ca")?,
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
