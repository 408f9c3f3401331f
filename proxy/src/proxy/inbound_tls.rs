//! What an inbound chain's downstream TLS context asks of a client's mesh TLS: the SANs its
//! certificate may carry, and the versions and cipher suites the handshake may use.

use crate::tls::{self, Peer};
use remora_xds::model::cluster::SanType;
use remora_xds::model::listener::DownstreamTls;

/// Whether the client's certificate carries a SAN the chain's validation context accepts
/// (none listed: any from the roots).
pub(super) fn san_allowed(tls: &DownstreamTls, peer: Option<&Peer>) -> bool {
    if tls.subject_alt_names.is_empty() {
        return true;
    }
    let Some(peer) = peer else {
        return false;
    };
    let uri = peer
        .spiffe_id
        .as_ref()
        .map(crate::identity::SpiffeId::as_str);
    tls.subject_alt_names.iter().any(|san| match san.san_type {
        None | Some(SanType::Uri) => {
            uri.is_some_and(|u| san.matcher.matches(u))
                || (san.san_type.is_none() && peer.dns_sans.iter().any(|d| san.matcher.matches(d)))
        }
        Some(SanType::Dns) => peer.dns_sans.iter().any(|d| san.matcher.matches(d)),
        Some(SanType::Email | SanType::IpAddress) => false,
    })
}

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
    }
}
