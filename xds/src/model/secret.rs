//! SDS secrets. A sidecar's two secrets (`default`, `ROOTCA`) come from its node agent, not
//! from istiod; Remora's own CA client is that agent. These types say what a secret resource
//! holds, for `remora xds validate` and for secrets given from files.

/// One secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secret {
    pub name: String,
    pub kind: SecretKind,
}

/// What a secret holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretKind {
    /// A certificate chain and its key (PEM).
    TlsCertificate {
        certificate_chain: Vec<u8>,
        private_key: Vec<u8>,
    },
    /// Trust anchors: a PEM bundle, or SPIFFE bundles per trust domain (SPIRE's form).
    ValidationContext {
        trusted_ca: Vec<u8>,
        spiffe_trust_domains: Vec<(String, Vec<u8>)>,
    },
}
