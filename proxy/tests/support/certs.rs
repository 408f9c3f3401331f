//! A mesh certificate authority with rcgen: workload certificates shaped as istiod issues them
//! (a SPIFFE ID as the only SAN, both TLS usages), written in Istio's file layout.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SanType,
};
use std::path::Path;

/// A root that signs workload certificates.
pub struct MeshCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl MeshCa {
    pub fn new() -> MeshCa {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "cluster.local");
        let cert = params.self_signed(&key).unwrap();
        MeshCa { cert, key }
    }

    /// Write a workload certificate for `spiffe_id`, its key and this root into `dir` as
    /// `cert-chain.pem`, `key.pem` and `root-cert.pem`.
    pub fn install(&self, dir: &Path, spiffe_id: &str) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = vec![SanType::URI(spiffe_id.try_into().unwrap())];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("cert-chain.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
        std::fs::write(dir.join("root-cert.pem"), self.cert.pem()).unwrap();
    }
}
