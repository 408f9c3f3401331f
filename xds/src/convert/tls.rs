//! TLS transport sockets: the upstream context of Istio's mTLS cluster match, a
//! DestinationRule's TLS origination (SIMPLE, MUTUAL), and the downstream context of
//! virtualInbound's chains. Certificates come only from SDS: by the two names istiod uses for
//! the workload's own (`default`) and the mesh roots (`ROOTCA`), which Remora resolves to what
//! its CA client holds, and, upstream, by the names of files in the pod that pilot-agent's SDS
//! server reads (`file-cert:CHAIN~KEY`, `file-root:PATH`, `file-root:system`), which Remora
//! reads itself; and, upstream, any secret whose `sds_config` is the ADS stream: what istiod
//! serves itself (`kubernetes://NAME`, `kubernetes://NAME-cacert` for a DestinationRule's
//! `credentialName`), which Remora asks istiod for (`SdsSecret::Ads`).

use super::any::unpack;
use super::common::string_matcher;
use crate::model::cluster::{SanMatcher, SanType, SdsSecret, TlsVersion, UpstreamTls};
use crate::model::listener::DownstreamTls;
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3 as tls;

/// The SDS secret names of the workload's own certificate and roots.
pub const SECRET_NAMES: [&str; 2] = ["default", "ROOTCA"];

/// pilot-agent's prefixes for files of the pod it serves as secrets.
const FILE_CERT: &str = "file-cert:";
const FILE_ROOT: &str = "file-root:";
/// pilot-agent's separator of a `file-cert:` name's chain and key paths.
const FILE_SEPARATOR: char = '~';

const UPSTREAM: &str = "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";
const DOWNSTREAM: &str = "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";
const RAW_BUFFER: &str = "envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer";

/// A cluster's transport socket: `None` for plaintext.
pub fn upstream_socket(
    socket: &core::TransportSocket,
    path: &str,
) -> Result<Option<UpstreamTls>, Fault> {
    let at = format!("{path}.typed_config");
    let Some(core::transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
        return Err(Fault::new(at, "a transport socket needs a typed_config"));
    };
    let unpacked = unpack(any, &at)?;
    match unpacked.message_name() {
        RAW_BUFFER => Ok(None),
        UPSTREAM => {
            let ctx: tls::UpstreamTlsContext = unpacked.to(&at)?;
            upstream(&ctx, &at)
                .map(Some)
                .map_err(|f| f.with_type(&unpacked.type_url))
        }
        _ => Err(Fault::new(at, "transport socket not supported").with_type(&unpacked.type_url)),
    }
}

/// A listener chain's transport socket: `None` for plaintext.
pub fn downstream_socket(
    socket: &core::TransportSocket,
    path: &str,
) -> Result<Option<DownstreamTls>, Fault> {
    let at = format!("{path}.typed_config");
    let Some(core::transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
        return Err(Fault::new(at, "a transport socket needs a typed_config"));
    };
    let unpacked = unpack(any, &at)?;
    match unpacked.message_name() {
        RAW_BUFFER => Ok(None),
        DOWNSTREAM => {
            let ctx: tls::DownstreamTlsContext = unpacked.to(&at)?;
            downstream(&ctx, &at)
                .map(Some)
                .map_err(|f| f.with_type(&unpacked.type_url))
        }
        _ => Err(Fault::new(at, "transport socket not supported").with_type(&unpacked.type_url)),
    }
}

/// An SDS secret's name and where in the resource it was.
struct Named {
    name: String,
    path: String,
    /// Its `sds_config` is the ADS stream (`ads: {}`): the control plane serves it.
    ads: bool,
}

struct Common {
    alpn: Vec<String>,
    min_version: Option<TlsVersion>,
    max_version: Option<TlsVersion>,
    cipher_suites: Vec<String>,
    certificate_secrets: Vec<Named>,
    validation_secret: Option<Named>,
    /// Where an empty `validation_context` was (istiod's `insecureSkipVerify`).
    no_validation: Option<String>,
    subject_alt_names: Vec<SanMatcher>,
}

fn upstream(ctx: &tls::UpstreamTlsContext, path: &str) -> Result<UpstreamTls, Fault> {
    let common = common(
        ctx.common_tls_context.as_ref(),
        &format!("{path}.common_tls_context"),
    )?;
    if !common.cipher_suites.is_empty() {
        return Err(Fault::new(
            format!("{path}.common_tls_context.tls_params.cipher_suites"),
            "upstream cipher suite lists not supported",
        ));
    }
    if common.certificate_secrets.len() > 1 {
        return Err(Fault::new(
            format!("{path}.common_tls_context.tls_certificate_sds_secret_configs"),
            "more than one client certificate",
        ));
    }
    let certificate_secret = common
        .certificate_secrets
        .first()
        .map(upstream_secret)
        .transpose()?;
    let validation_secret = common
        .validation_secret
        .as_ref()
        .map(upstream_secret)
        .transpose()?;
    match (&certificate_secret, &validation_secret) {
        (Some(SdsSecret::MeshRoots | SdsSecret::FileRoots(_) | SdsSecret::SystemRoots), _) => {
            return Err(Fault::new(
                format!("{path}.common_tls_context.tls_certificate_sds_secret_configs[0].name"),
                "a root secret named as the client certificate",
            ))
        }
        (_, Some(SdsSecret::Workload | SdsSecret::FileCertificate { .. })) => {
            return Err(Fault::new(
                format!("{path}.common_tls_context"),
                "a certificate secret named as the validation context",
            ))
        }
        // Istio mTLS is the workload's certificate and the mesh roots together: the workload
        // certificate checked against file roots, or the reverse, is no shape istiod writes.
        (Some(SdsSecret::Workload), Some(v)) if *v != SdsSecret::MeshRoots => {
            return Err(Fault::new(
                format!("{path}.common_tls_context"),
                "the workload certificate `default` with roots other than `ROOTCA` not supported",
            ))
        }
        (Some(SdsSecret::FileCertificate { .. }), Some(SdsSecret::MeshRoots)) => {
            return Err(Fault::new(
                format!("{path}.common_tls_context"),
                "a `file-cert:` certificate with the mesh roots `ROOTCA` not supported",
            ))
        }
        (Some(SdsSecret::Ads(_)), Some(SdsSecret::MeshRoots)) => {
            return Err(Fault::new(
                format!("{path}.common_tls_context"),
                "a certificate served over ADS with the mesh roots `ROOTCA` not supported",
            ))
        }
        _ => {}
    }
    // Envoy checks SAN matchers only against a chain it verified; istiod never writes them
    // without roots (insecureSkipVerify drops both).
    if validation_secret.is_none() && !common.subject_alt_names.is_empty() {
        return Err(Fault::new(
            format!("{path}.common_tls_context.combined_validation_context"),
            "subject alt name matchers without trusted roots not supported",
        ));
    }
    // The mesh client offers TLS 1.3 and, unless the minimum is 1.3, 1.2: a lower minimum is
    // met (nothing older is negotiated), a maximum below 1.3 could not be.
    if common.max_version.is_some_and(|v| v < TlsVersion::Tls1_3) {
        return Err(Fault::new(
            format!("{path}.common_tls_context.tls_params.tls_maximum_protocol_version"),
            "an upstream maximum TLS version below 1.3 not supported",
        ));
    }
    if !ctx.sni.is_empty() && !sendable_sni(&ctx.sni) {
        return Err(Fault::new(
            format!("{path}.sni"),
            format!(
                "SNI {:?} not supported (TLS sends a DNS name: letters, digits, `-`, `_`, dots)",
                ctx.sni
            ),
        ));
    }
    Ok(UpstreamTls {
        sni: (!ctx.sni.is_empty()).then(|| ctx.sni.clone()),
        alpn: common.alpn,
        subject_alt_names: common.subject_alt_names,
        certificate_secret,
        validation_secret,
        min_version: common.min_version,
        max_version: common.max_version,
    })
}

fn downstream(ctx: &tls::DownstreamTlsContext, path: &str) -> Result<DownstreamTls, Fault> {
    let common = common(
        ctx.common_tls_context.as_ref(),
        &format!("{path}.common_tls_context"),
    )?;
    if let Some(at) = common.no_validation {
        return Err(Fault::new(
            at,
            "validation context not supported (only SDS `ROOTCA` with SAN matchers)",
        ));
    }
    Ok(DownstreamTls {
        alpn: common.alpn,
        min_version: common.min_version,
        max_version: common.max_version,
        cipher_suites: common.cipher_suites,
        certificate_secrets: common
            .certificate_secrets
            .into_iter()
            .map(mesh_secret)
            .collect::<Result<_, _>>()?,
        validation_secret: common.validation_secret.map(mesh_secret).transpose()?,
        subject_alt_names: common.subject_alt_names,
        require_client_certificate: ctx
            .require_client_certificate
            .as_ref()
            .is_some_and(|b| b.value),
    })
}

fn version(v: i32, path: &str) -> Result<Option<TlsVersion>, Fault> {
    use tls::tls_parameters::TlsProtocol as P;
    Ok(match P::try_from(v) {
        Ok(P::TlsAuto) => None,
        Ok(P::TlSv10) => Some(TlsVersion::Tls1_0),
        Ok(P::TlSv11) => Some(TlsVersion::Tls1_1),
        Ok(P::TlSv12) => Some(TlsVersion::Tls1_2),
        Ok(P::TlSv13) => Some(TlsVersion::Tls1_3),
        Err(_) => return Err(Fault::new(path, "unknown TLS version")),
    })
}

/// Whether `sni` is a name TLS can carry (RFC 6066: a DNS host name, not an address), which
/// rustls sends as written; Envoy would send any string, Remora refuses what it could not.
fn sendable_sni(sni: &str) -> bool {
    let name = sni.strip_suffix('.').unwrap_or(sni);
    name.len() <= 253
        && name.parse::<std::net::IpAddr>().is_err()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// A downstream context's secret: only the workload's own.
fn mesh_secret(s: Named) -> Result<String, Fault> {
    if !SECRET_NAMES.contains(&s.name.as_str()) {
        return Err(Fault::new(
            format!("{}.name", s.path),
            format!(
                "SDS secret {:?} not supported (only Istio's workload secrets `default` and `ROOTCA`)",
                s.name
            ),
        ));
    }
    Ok(s.name)
}

/// An upstream context's secret: the workload's own, a file of the pod as pilot-agent's
/// SDS server names it, or one the control plane serves over ADS (by any name: Envoy asks
/// for the name as written, and istiod answers what it knows).
fn upstream_secret(s: &Named) -> Result<SdsSecret, Fault> {
    let at = format!("{}.name", s.path);
    let name = s.name.as_str();
    // The workload's own two are Remora's whatever the source says: Remora is their SDS
    // server, as pilot-agent is Envoy's.
    match name {
        "default" => return Ok(SdsSecret::Workload),
        "ROOTCA" => return Ok(SdsSecret::MeshRoots),
        _ if s.ads && !name.is_empty() => return Ok(SdsSecret::Ads(name.to_string())),
        _ => {}
    }
    let file = |p: &str| -> Result<std::path::PathBuf, Fault> {
        if p.is_empty() {
            return Err(Fault::new(
                &at,
                format!("SDS secret {name:?} names no file"),
            ));
        }
        Ok(p.into())
    };
    if name == "file-root:system" {
        return Ok(SdsSecret::SystemRoots);
    }
    if let Some(files) = name.strip_prefix(FILE_CERT) {
        let mut parts = files.split(FILE_SEPARATOR);
        return match (parts.next(), parts.next(), parts.next()) {
            (Some(chain), Some(key), None) => Ok(SdsSecret::FileCertificate {
                chain: file(chain)?,
                key: file(key)?,
            }),
            _ => Err(Fault::new(
                &at,
                format!("SDS secret {name:?} is not `file-cert:CHAIN~KEY`"),
            )),
        };
    }
    if let Some(path) = name.strip_prefix(FILE_ROOT) {
        if path.contains(FILE_SEPARATOR) {
            return Err(Fault::new(
                &at,
                format!("SDS secret {name:?} is not `file-root:PATH`"),
            ));
        }
        return Ok(SdsSecret::FileRoots(file(path)?));
    }
    Err(Fault::new(
        at,
        format!(
            "SDS secret {name:?} not supported (the workload's `default` and `ROOTCA`, pilot-agent's \
             `file-cert:`/`file-root:` files, and secrets served over ADS)"
        ),
    ))
}

fn named(s: &tls::SdsSecretConfig, path: &str) -> Named {
    use core::config_source::ConfigSourceSpecifier as Source;
    Named {
        name: s.name.clone(),
        path: path.to_string(),
        ads: matches!(
            s.sds_config
                .as_ref()
                .and_then(|c| c.config_source_specifier.as_ref()),
            Some(Source::Ads(_))
        ),
    }
}

fn common(ctx: Option<&tls::CommonTlsContext>, path: &str) -> Result<Common, Fault> {
    use tls::common_tls_context::ValidationContextType as V;
    let Some(ctx) = ctx else {
        return Err(Fault::new(
            path,
            "no common_tls_context: TLS without certificates",
        ));
    };
    let params = ctx.tls_params.clone().unwrap_or_default();
    let certificate_secrets = ctx
        .tls_certificate_sds_secret_configs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            named(
                s,
                &format!("{path}.tls_certificate_sds_secret_configs[{i}]"),
            )
        })
        .collect();
    let mut validation_secret = None;
    let mut no_validation = None;
    let mut subject_alt_names = Vec::new();
    match &ctx.validation_context_type {
        None => {}
        // istiod's insecureSkipVerify: an empty context, no roots, nothing checked.
        Some(V::ValidationContext(v)) if *v == tls::CertificateValidationContext::default() => {
            no_validation = Some(format!("{path}.validation_context"));
        }
        Some(V::ValidationContextSdsSecretConfig(s)) => {
            validation_secret = Some(named(
                s,
                &format!("{path}.validation_context_sds_secret_config"),
            ));
        }
        Some(V::CombinedValidationContext(c)) => {
            let at = format!("{path}.combined_validation_context");
            if let Some(s) = &c.validation_context_sds_secret_config {
                validation_secret = Some(named(
                    s,
                    &format!("{at}.validation_context_sds_secret_config"),
                ));
            }
            if let Some(d) = &c.default_validation_context {
                let at = format!("{at}.default_validation_context");
                if d.trusted_ca.is_some() || d.custom_validator_config.is_some() {
                    return Err(Fault::new(
                        at,
                        "trust anchors in the context not supported (only SDS `ROOTCA`)",
                    ));
                }
                for (i, m) in d.match_typed_subject_alt_names.iter().enumerate() {
                    let mat = format!("{at}.match_typed_subject_alt_names[{i}]");
                    let san_type =
                        match tls::subject_alt_name_matcher::SanType::try_from(m.san_type) {
                            Ok(tls::subject_alt_name_matcher::SanType::Uri) => SanType::Uri,
                            Ok(tls::subject_alt_name_matcher::SanType::Dns) => SanType::Dns,
                            Ok(tls::subject_alt_name_matcher::SanType::Email) => SanType::Email,
                            Ok(tls::subject_alt_name_matcher::SanType::IpAddress) => {
                                SanType::IpAddress
                            }
                            _ => {
                                return Err(Fault::new(
                                    format!("{mat}.san_type"),
                                    "SAN type not supported",
                                ))
                            }
                        };
                    let matcher = m
                        .matcher
                        .as_ref()
                        .ok_or_else(|| Fault::new(&mat, "no matcher"))?;
                    subject_alt_names.push(SanMatcher {
                        san_type: Some(san_type),
                        matcher: string_matcher(matcher, &format!("{mat}.matcher"))?,
                    });
                }
                #[allow(deprecated)]
                for (i, m) in d.match_subject_alt_names.iter().enumerate() {
                    subject_alt_names.push(SanMatcher {
                        san_type: None,
                        matcher: string_matcher(m, &format!("{at}.match_subject_alt_names[{i}]"))?,
                    });
                }
            }
        }
        Some(V::ValidationContext(_)) => {
            return Err(Fault::new(
                format!("{path}.validation_context"),
                "an inline validation context not supported (only an SDS secret with SAN matchers, or an empty one)",
            ))
        }
        Some(_) => {
            return Err(Fault::new(
                path,
                "validation context not supported (only an SDS secret with SAN matchers, or none)",
            ))
        }
    }
    Ok(Common {
        alpn: ctx.alpn_protocols.clone(),
        min_version: version(
            params.tls_minimum_protocol_version,
            &format!("{path}.tls_params"),
        )?,
        max_version: version(
            params.tls_maximum_protocol_version,
            &format!("{path}.tls_params"),
        )?,
        cipher_suites: params.cipher_suites.clone(),
        certificate_secrets,
        validation_secret,
        no_validation,
        subject_alt_names,
    })
}

#[cfg(test)]
mod tests;
