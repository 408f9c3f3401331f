//! Istio's CA protocol: `istio.v1.auth.IstioCertificateService/CreateCertificate`, its two
//! messages written by hand (istio/api `security/v1alpha1/ca.proto`; no codegen for two
//! messages), the in-memory key and CSR, and the checks a response passes before it becomes
//! the workload's [`Identity`].

use super::channel::{ChannelError, IstiodChannel};
use crate::identity::{Identity, SpiffeId};
use std::future::Future;
use std::time::Duration;

/// `IstioCertificateService/CreateCertificate`'s path.
const CREATE_CERTIFICATE: &str = "/istio.v1.auth.IstioCertificateService/CreateCertificate";
/// Bound on one CreateCertificate call, connect included.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// istio/api `IstioCertificateRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IstioCertificateRequest {
    /// The PEM CSR; istiod takes only its public key and checks its SANs.
    #[prost(string, tag = "1")]
    pub csr: String,
    /// Requested lifetime in seconds.
    #[prost(int64, tag = "3")]
    pub validity_duration: i64,
    /// Opaque node metadata; pilot-agent leaves it empty unless it impersonates.
    #[prost(message, optional, tag = "4")]
    pub metadata: Option<prost_types::Struct>,
}

/// istio/api `IstioCertificateResponse`: PEM certificates, the leaf first, the root last.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IstioCertificateResponse {
    #[prost(string, repeated, tag = "1")]
    pub cert_chain: Vec<String>,
}

/// Why no certificate was installed. Each maps to one `reason` label.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error(transparent)]
    Credentials(#[from] ChannelError),
    #[error("generating the key and CSR: {0}")]
    Csr(String),
    #[error("CA {address}: {code:?}: {message}")]
    Call {
        address: String,
        code: tonic::Code,
        message: String,
    },
    #[error("CA {address} returned no certificate")]
    Empty { address: String },
    #[error("CA {address} returned a certificate we cannot use: {why}")]
    Refused { address: String, why: String },
}

impl CaError {
    /// The metric label: what an operator fixes differs for each.
    pub fn reason(&self) -> &'static str {
        match self {
            CaError::Credentials(ChannelError::Token { .. }) => "token",
            CaError::Credentials(ChannelError::Root { .. }) => "root",
            CaError::Credentials(_) => "config",
            CaError::Csr(_) => "csr",
            CaError::Call { code, .. } => match code {
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => "unauthenticated",
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => "unavailable",
                _ => "ca_error",
            },
            CaError::Empty { .. } => "ca_error",
            CaError::Refused { .. } => "mismatch",
        }
    }
}

/// Who signs CSRs: istiod over gRPC, or a fake in tests.
pub trait Issuer {
    /// Send `csr` (PEM) asking for `ttl`; the PEM chain back, leaf first.
    fn issue(
        &self,
        csr: String,
        ttl: Duration,
    ) -> impl Future<Output = Result<Vec<String>, CaError>> + Send;
    /// Where certificates come from, for messages.
    fn address(&self) -> &str;
}

/// istiod's (or `CA_ADDR`'s) CA.
#[derive(Debug, Clone)]
pub struct CaClient {
    pub channel: IstiodChannel,
}

impl Issuer for CaClient {
    async fn issue(&self, csr: String, ttl: Duration) -> Result<Vec<String>, CaError> {
        let call_error = |status: tonic::Status| CaError::Call {
            address: self.channel.address.clone(),
            code: status.code(),
            message: status.message().to_string(),
        };
        let mut request = tonic::Request::new(IstioCertificateRequest {
            csr,
            validity_duration: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
            metadata: None,
        });
        // Read now: a missing token is our error, named as such, not istiod's refusal.
        self.channel.credentials.apply(&mut request)?;
        request.set_timeout(CALL_TIMEOUT);
        let mut grpc = tonic::client::Grpc::new(self.channel.channel.clone());
        grpc.ready().await.map_err(|e| CaError::Call {
            address: self.channel.address.clone(),
            code: tonic::Code::Unavailable,
            message: e.to_string(),
        })?;
        let codec =
            tonic_prost::ProstCodec::<IstioCertificateRequest, IstioCertificateResponse>::default();
        let path = http::uri::PathAndQuery::from_static(CREATE_CERTIFICATE);
        let response = tokio::time::timeout(CALL_TIMEOUT, grpc.unary(request, path, codec))
            .await
            .map_err(|_| call_error(tonic::Status::deadline_exceeded("no answer")))?
            .map_err(call_error)?;
        Ok(response.into_inner().cert_chain)
    }

    fn address(&self) -> &str {
        &self.channel.address
    }
}

/// A fresh key and the CSR for `spiffe_id`; the key never leaves memory.
pub struct KeyAndCsr {
    /// PKCS#8 PEM of the private key.
    pub key_pem: String,
    pub csr_pem: String,
}

impl KeyAndCsr {
    /// ECDSA P-256, Istio's default key type, and a CSR whose only SAN is the URI `spiffe_id`.
    pub fn generate(spiffe_id: &str) -> Result<KeyAndCsr, CaError> {
        let csr_error = |e: rcgen::Error| CaError::Csr(e.to_string());
        let key =
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(csr_error)?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(csr_error)?;
        let uri = rcgen::Ia5String::try_from(spiffe_id).map_err(|e| CaError::Csr(e.to_string()))?;
        params.subject_alt_names = vec![rcgen::SanType::URI(uri)];
        // istiod ignores the subject; an empty one is what a SPIFFE CSR carries.
        params.distinguished_name = rcgen::DistinguishedName::new();
        let csr = params.serialize_request(&key).map_err(csr_error)?;
        Ok(KeyAndCsr {
            key_pem: key.serialize_pem(),
            csr_pem: csr.pem().map_err(csr_error)?,
        })
    }
}

/// Turn istiod's answer into an identity, or say why not: the chain must parse, end in a
/// root, match our key, and name the namespace and service account we asked for.
pub fn identity_from_response(
    chain: &[String],
    key_pem: &str,
    wanted: &SpiffeId,
    fallback_roots: &[u8],
    address: &str,
) -> Result<Identity, CaError> {
    let refused = |why: String| CaError::Refused {
        address: address.into(),
        why,
    };
    // Leaf (and intermediates) present in handshakes; the last one is the mesh root. A lone
    // certificate is a leaf signed by the root istiod's own certificate chains to.
    let (presented, roots) = match chain {
        [] => {
            return Err(CaError::Empty {
                address: address.into(),
            })
        }
        [leaf] => (leaf.as_bytes().to_vec(), fallback_roots.to_vec()),
        [certs @ .., root] => (join_pem(certs), root.as_bytes().to_vec()),
    };
    let identity = Identity::from_memory(&presented, key_pem.as_bytes(), &roots)
        .map_err(|e| refused(e.to_string()))?;
    let got = &identity.spiffe_id;
    // istiod owns the trust domain (it may be a mesh's alias of ours); the workload is ours.
    if got.namespace() != wanted.namespace() || got.service_account() != wanted.service_account() {
        return Err(refused(format!("it names {got}, we asked for {wanted}")));
    }
    if got.trust_domain() != wanted.trust_domain() {
        tracing::warn!(issued = %got, asked = %wanted, "istiod issued another trust domain than configured");
    }
    Ok(identity)
}

fn join_pem(certs: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in certs {
        out.extend_from_slice(c.trim_end().as_bytes());
        out.push(b'\n');
    }
    out
}

#[cfg(test)]
#[path = "ca_tests.rs"]
mod tests;
