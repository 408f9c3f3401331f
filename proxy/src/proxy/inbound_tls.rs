//! What an inbound chain's downstream TLS context asks of a client's mesh TLS: the versions
//! and cipher suites the handshake may use, and the SANs its certificate may carry (checked
//! in the handshake: `tls::client_sans`).

use crate::tls;
use remora_xds::model::listener::DownstreamTls;

/// What the chain's `tls_params` allow: its minimum version (1.3, or 1.2 for anything lower:
/// rustls speaks nothing older, and istiod's default is 1.2), else the config file's; its
/// maximum (1.2 keeps 1.3 out); its TLS 1.2 cipher suites.
pub(super) fn chain_params(
    tls: &DownstreamTls,
    file: &remora_config::TlsConfig,
) -> tls::ChainParams {
    use remora_config::TlsVersion as V;
    use remora_xds::model::cluster::TlsVersion as X;
    tls::ChainParams {
        min: match tls.min_version {
            Some(X::Tls1_3) => V::Tls13,
            Some(X::Tls1_0 | X::Tls1_1 | X::Tls1_2) => V::Tls12,
            None => file.min_protocol_version,
        },
        tls12_only: matches!(tls.max_version, Some(X::Tls1_0 | X::Tls1_1 | X::Tls1_2)),
        cipher_suites: tls.cipher_suites.clone(),
        client_sans: tls.subject_alt_names.clone(),
    }
}
