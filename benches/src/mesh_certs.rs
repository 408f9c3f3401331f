//! The mesh identities of the mTLS scenario: a CA and two workload certificates shaped as
//! istiod issues them (a SPIFFE ID as the only SAN, both TLS usages), written with rcgen in
//! Istio's file layout (`cert-chain.pem`, `key.pem`, `root-cert.pem`), one directory per
//! sidecar.

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SanType,
};
use std::fs;
use std::path::{Path, PathBuf};

/// The client-side sidecar's identity (sidecar A).
pub const CLIENT_ID: &str = "spiffe://cluster.local/ns/bench/sa/a";
/// The server-side sidecar's identity (sidecar B).
pub const SERVER_ID: &str = "spiffe://cluster.local/ns/bench/sa/b";
/// The service behind sidecar B, for SNI (`outbound_.PORT_._.HOSTNAME`, as Istio's).
pub const SERVER_HOSTNAME: &str = "b.bench.svc.cluster.local";

/// Istio's file names.
pub const CERT_CHAIN: &str = "cert-chain.pem";
pub const KEY: &str = "key.pem";
pub const ROOT_CERT: &str = "root-cert.pem";

/// Where each sidecar's files are.
#[derive(Debug, Clone)]
pub struct MeshCerts {
    /// Sidecar A (client side): [`CLIENT_ID`].
    pub client_dir: PathBuf,
    /// Sidecar B (server side): [`SERVER_ID`].
    pub server_dir: PathBuf,
}

/// Generates a fresh CA and both workload certificates into `dir/a` and `dir/b`.
pub fn generate(dir: &Path) -> anyhow::Result<MeshCerts> {
    let ca_key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "cluster.local");
    let ca = params.self_signed(&ca_key)?;
    let root = ca.pem();
    let certs = MeshCerts {
        client_dir: dir.join("a"),
        server_dir: dir.join("b"),
    };
    for (sub, id) in [
        (&certs.client_dir, CLIENT_ID),
        (&certs.server_dir, SERVER_ID),
    ] {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = vec![SanType::URI(id.try_into()?)];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &ca, &ca_key)?;
        fs::create_dir_all(sub).with_context(|| format!("creating {}", sub.display()))?;
        fs::write(sub.join(CERT_CHAIN), cert.pem())?;
        fs::write(sub.join(KEY), key.serialize_pem())?;
        fs::write(sub.join(ROOT_CERT), &root)?;
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn istio_layout_with_spiffe_ids() {
        let dir = std::env::temp_dir().join(format!("remora-bench-certs-{}", std::process::id()));
        let certs = generate(&dir).expect("certificates");
        for sub in [&certs.client_dir, &certs.server_dir] {
            for file in [CERT_CHAIN, KEY, ROOT_CERT] {
                let text = fs::read_to_string(sub.join(file)).expect(file);
                assert!(text.starts_with("-----BEGIN"), "{file} is PEM");
            }
        }
        assert_eq!(
            fs::read(certs.client_dir.join(ROOT_CERT)).unwrap(),
            fs::read(certs.server_dir.join(ROOT_CERT)).unwrap(),
            "one mesh root"
        );
        let _ = fs::remove_dir_all(&dir);
    }
}
