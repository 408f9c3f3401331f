//! TLS: upstream and downstream TLS contexts, certificate validation, SDS secret references
//! and the SDS secrets themselves.

use super::Table;

/// Message full name → the fields Remora reads in it.
pub(super) const READ: Table = &[
    // TLS.
    (
        "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        &["common_tls_context", "sni"],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        &["common_tls_context", "require_client_certificate"],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.CommonTlsContext",
        &[
            "tls_params",
            "alpn_protocols",
            "tls_certificate_sds_secret_configs",
            "combined_validation_context",
            "validation_context",
            "validation_context_sds_secret_config",
        ],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.TlsParameters",
        &[
            "tls_minimum_protocol_version",
            "tls_maximum_protocol_version",
            "cipher_suites",
        ],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.CommonTlsContext.CombinedCertificateValidationContext",
        &["default_validation_context", "validation_context_sds_secret_config"],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.CertificateValidationContext",
        &[
            "match_subject_alt_names",
            "match_typed_subject_alt_names",
            // Only in SDS secrets; a transport socket's own is refused by the converter.
            "trusted_ca",
            "custom_validator_config",
        ],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.SubjectAltNameMatcher",
        &["san_type", "matcher"],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.SdsSecretConfig",
        &["name", "sds_config"],
    ),
    // SDS secrets (istiod's `credentialName` ones; `remora xds validate`'s `secrets.json`).
    // A CRL or an OCSP staple is refused by name: Remora checks no revocation, staples none.
    (
        "envoy.extensions.transport_sockets.tls.v3.Secret",
        &["name", "tls_certificate", "validation_context"],
    ),
    (
        "envoy.extensions.transport_sockets.tls.v3.TlsCertificate",
        &["certificate_chain", "private_key"],
    ),
];
