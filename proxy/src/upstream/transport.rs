//! The transport of one upstream connection, chosen as Envoy chooses it: the cluster's
//! `transport_socket_matches` against the endpoint's `tlsMode`, then what the chosen socket
//! says. istiod's mTLS socket names its secrets `default` (our certificate) and `ROOTCA` (the
//! roots); Remora resolves both to the workload identity it holds and never dials `sds-grpc`.
//! A DestinationRule's SIMPLE or MUTUAL TLS names files of the pod instead
//! (`file-root:`, `file-cert:`), which [`super::origin`] reads as pilot-agent's SDS would.

use remora_xds::model::cluster::{
    Cluster, SanMatcher, SanType, SdsSecret, TlsVersion, TransportSocket, UpstreamTls,
};
use remora_xds::model::matcher::StringMatch;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;

/// How to reach one endpoint.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    Plaintext,
    /// Istio mutual TLS, presenting the workload identity.
    Mesh(Arc<MeshTls>),
    /// A DestinationRule's TLS origination (SIMPLE or MUTUAL) to a server outside the mesh.
    Origin(Arc<OriginTls>),
}

/// A DestinationRule's TLS origination, as istiod writes it (`cluster_tls.go`).
#[derive(Debug, Clone, PartialEq)]
pub struct OriginTls {
    /// SNI (the DestinationRule's `sni`); `None`: none sent.
    pub sni: Option<String>,
    /// ALPN offered (istiod: `h2` for an HTTP/2 cluster, else none).
    pub alpn: Vec<String>,
    /// Istio's ALPN filter leaves `alpn` alone (`alpn_override: "false"`, istiod's on such
    /// clusters); without it the filter's `istio-http/1.1`… offer replaces it, as in Envoy.
    pub keeps_alpn: bool,
    /// What the server's chain must lead to; `None`: nothing is checked
    /// (`insecureSkipVerify`).
    pub roots: Option<Roots>,
    /// One of the server certificate's SANs must match one of these (empty: any).
    pub subject_alt_names: Vec<SanMatcher>,
    /// The client certificate presented (MUTUAL).
    pub client_certificate: Option<ClientCertificate>,
    /// The socket's `tls_minimum_protocol_version` is 1.3: TLS 1.2 is not offered.
    pub tls13_only: bool,
}

impl OriginTls {
    /// This origination for a request to `host` (its authority without the port), as the
    /// cluster's `auto_sni` and `auto_san_validation` make Envoy's router set it: `host` as
    /// SNI (not an IP address), and the server's certificate checked for `host` in place of
    /// the socket's SAN matchers.
    pub fn for_host(&self, host: &str, auto_sni: bool, auto_san_validation: bool) -> OriginTls {
        let mut tls = self.clone();
        if auto_sni && host.parse::<std::net::IpAddr>().is_err() && !host.is_empty() {
            tls.sni = Some(host.to_string());
        }
        if auto_san_validation {
            tls.subject_alt_names = vec![SanMatcher {
                san_type: None,
                matcher: remora_xds::model::matcher::StringMatcher::exact(host),
            }];
        }
        tls
    }
}

/// An authority without its port (`[::1]:80` → `::1`).
pub fn host_of(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

// The SAN matchers hold compiled regexes, which have no hash; leaving them out of the hash
// keeps it consistent with equality (equal values hash the same).
impl Eq for OriginTls {}

impl Hash for OriginTls {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.sni.hash(state);
        self.alpn.hash(state);
        self.keeps_alpn.hash(state);
        self.roots.hash(state);
        self.client_certificate.hash(state);
        self.tls13_only.hash(state);
        self.subject_alt_names.len().hash(state);
    }
}

/// Trusted roots of an origination.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Roots {
    /// `file-root:PATH`: a PEM bundle (DestinationRule `caCertificates`).
    File(PathBuf),
    /// `file-root:system`: the operating system's bundle, found where pilot-agent looks.
    System,
    /// A validation-context secret istiod serves over ADS (`kubernetes://NAME-cacert`).
    Secret(String),
}

/// Where an origination's client certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClientCertificate {
    /// Files of the pod (`file-cert:CHAIN~KEY`).
    Files(ClientFiles),
    /// A TLS-certificate secret istiod serves over ADS (`kubernetes://NAME`).
    Secret(String),
}

/// A client certificate chain and its key, PEM files of the pod (`file-cert:CHAIN~KEY`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientFiles {
    pub chain: PathBuf,
    pub key: PathBuf,
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
    #[error("secret {0:?} does not fit the socket (the workload's `default`/`ROOTCA`, files, or secrets from ADS)")]
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
        TransportSocket::Tls(tls) if tls.is_mesh() => {
            mesh_tls(tls).map(|m| Transport::Mesh(Arc::new(m)))
        }
        TransportSocket::Tls(tls) => {
            origin_tls(tls, cluster.istio.keeps_alpn).map(|o| Transport::Origin(Arc::new(o)))
        }
    }
}

fn origin_tls(tls: &UpstreamTls, keeps_alpn: bool) -> Result<OriginTls, TransportError> {
    let roots = match &tls.validation_secret {
        None => None,
        Some(SdsSecret::FileRoots(path)) => Some(Roots::File(path.clone())),
        Some(SdsSecret::SystemRoots) => Some(Roots::System),
        Some(SdsSecret::Ads(name)) => Some(Roots::Secret(name.clone())),
        Some(other) => return Err(TransportError::UnknownSecret(other.name())),
    };
    let client_certificate = match &tls.certificate_secret {
        None => None,
        Some(SdsSecret::FileCertificate { chain, key }) => {
            Some(ClientCertificate::Files(ClientFiles {
                chain: chain.clone(),
                key: key.clone(),
            }))
        }
        Some(SdsSecret::Ads(name)) => Some(ClientCertificate::Secret(name.clone())),
        Some(other) => return Err(TransportError::UnknownSecret(other.name())),
    };
    Ok(OriginTls {
        sni: tls.sni.clone(),
        alpn: tls.alpn.clone(),
        keeps_alpn,
        roots,
        subject_alt_names: tls.subject_alt_names.clone(),
        client_certificate,
        tls13_only: tls.min_version == Some(TlsVersion::Tls1_3),
    })
}

fn mesh_tls(tls: &UpstreamTls) -> Result<MeshTls, TransportError> {
    for (secret, known) in [
        (&tls.certificate_secret, SdsSecret::Workload),
        (&tls.validation_secret, SdsSecret::MeshRoots),
    ] {
        if let Some(other) = secret.as_ref().filter(|s| **s != known) {
            return Err(TransportError::UnknownSecret(other.name()));
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
