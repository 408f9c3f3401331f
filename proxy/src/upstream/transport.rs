//! The transport of one upstream connection, chosen as Envoy chooses it: the cluster's
//! `transport_socket_matches` against the endpoint's `tlsMode`, then what the chosen socket
//! says. istiod's mTLS socket names its secrets `default` (our certificate) and `ROOTCA` (the
//! roots); Remora resolves both to the workload identity it holds and never dials `sds-grpc`.

use remora_xds::model::cluster::{
    Cluster, SanMatcher, SanType, TlsVersion, TransportSocket, UpstreamTls,
};
use remora_xds::model::matcher::StringMatch;
use std::sync::Arc;

/// The SDS names istiod gives the workload certificate and the mesh roots.
const WORKLOAD_SECRET: &str = "default";
const ROOT_SECRET: &str = "ROOTCA";

/// How to reach one endpoint.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    Plaintext,
    /// Istio mutual TLS, presenting the workload identity.
    Mesh(Arc<MeshTls>),
}

/// An Istio mTLS origination.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MeshTls {
    /// SNI; `None`: none sent.
    pub sni: Option<String>,
    /// ALPN offered (for HTTP, Istio's ALPN filter offers `istio-http/1.1` or `istio-h2`
    /// in its place).
    pub alpn: Vec<String>,
    /// The server's certificate must carry one of these URI SANs (empty: any from the roots).
    pub expected_sans: Vec<String>,
    /// The socket's `tls_minimum_protocol_version` is 1.3: TLS 1.2 is not offered.
    pub tls13_only: bool,
}

/// A TLS socket Remora cannot originate as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    #[error("secret {0:?} is not the workload's (`default`/`ROOTCA`)")]
    UnknownSecret(String),
    #[error("subject alt name check {0} is not an exact URI")]
    UnsupportedSan(String),
}

/// The transport for an endpoint whose `tlsMode` is `tls_mode`.
pub fn for_endpoint(
    cluster: &Cluster,
    tls_mode: Option<&str>,
) -> Result<Transport, TransportError> {
    match cluster.transport_socket_for(tls_mode) {
        TransportSocket::Plaintext => Ok(Transport::Plaintext),
        TransportSocket::Tls(tls) => mesh_tls(tls).map(|m| Transport::Mesh(Arc::new(m))),
    }
}

fn mesh_tls(tls: &UpstreamTls) -> Result<MeshTls, TransportError> {
    for (secret, known) in [
        (&tls.certificate_secret, WORKLOAD_SECRET),
        (&tls.validation_secret, ROOT_SECRET),
    ] {
        if let Some(name) = secret.as_deref().filter(|n| *n != known) {
            return Err(TransportError::UnknownSecret(name.to_string()));
        }
    }
    let expected_sans = tls
        .subject_alt_names
        .iter()
        .map(exact_uri)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(MeshTls {
        sni: tls.sni.clone(),
        alpn: tls.alpn.clone(),
        expected_sans,
        tls13_only: tls.min_version == Some(TlsVersion::Tls1_3),
    })
}

/// istiod writes SAN checks as exact SPIFFE URIs; the mesh verifier checks exactly those. Any
/// other form is refused here rather than checked loosely.
fn exact_uri(m: &SanMatcher) -> Result<String, TransportError> {
    let uri_or_any = matches!(m.san_type, None | Some(SanType::Uri));
    match &m.matcher.kind {
        StringMatch::Exact(s) if uri_or_any && !m.matcher.ignore_case => Ok(s.clone()),
        other => Err(TransportError::UnsupportedSan(format!("{other:?}"))),
    }
}
