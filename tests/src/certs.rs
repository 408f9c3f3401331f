//! A mesh certificate authority for the tests, with rcgen: workload certificates shaped as
//! Istio's (a SPIFFE ID as the only SAN, both TLS usages), written in Istio's file layout
//! (`cert-chain.pem`, `key.pem`, `root-cert.pem`) into a directory UID 1337 can read.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SanType, SerialNumber,
};
use std::fs::{self, Permissions};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use x509_parser::prelude::{FromDer, GeneralName, ParsedExtension, X509CertificationRequest};

/// A certificate authority.
pub struct MeshCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// One workload certificate and its key, in PEM.
#[derive(Debug, Clone)]
pub struct WorkloadCert {
    pub chain: String,
    pub key: String,
}

impl std::fmt::Debug for MeshCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MeshCa")
    }
}

impl MeshCa {
    /// A new root named `organisation`.
    pub fn new(organisation: &str) -> MeshCa {
        let key = KeyPair::generate().expect("generate a CA key");
        let mut params =
            CertificateParams::new(Vec::<String>::new()).expect("CA certificate parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, organisation);
        let cert = params.self_signed(&key).expect("self-sign the CA");
        MeshCa { cert, key }
    }

    /// The root certificate, PEM.
    pub fn root_pem(&self) -> String {
        self.cert.pem()
    }

    /// A workload certificate for `spiffe_id`, as istiod issues them.
    pub fn workload(&self, spiffe_id: &str) -> WorkloadCert {
        let key = KeyPair::generate().expect("generate a workload key");
        let mut params =
            CertificateParams::new(Vec::<String>::new()).expect("workload certificate parameters");
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = vec![SanType::URI(
            spiffe_id.try_into().expect("a SPIFFE ID is an IA5 string"),
        )];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("sign the workload certificate");
        WorkloadCert {
            chain: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A server certificate for a DNS name, as an application's own TLS would use (not a mesh
    /// identity).
    pub fn dns_server(&self, name: &str) -> WorkloadCert {
        self.dns_names(&[name])
    }

    /// A certificate for several DNS names (the first also its common name).
    pub fn dns_names(&self, names: &[&str]) -> WorkloadCert {
        let key = KeyPair::generate().expect("generate a server key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("server certificate parameters");
        params.distinguished_name = DistinguishedName::new();
        if let Some(first) = names.first() {
            params.distinguished_name.push(DnType::CommonName, *first);
        }
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("sign the server certificate");
        WorkloadCert {
            chain: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// Sign a PEM CSR as istiod's CA does: the CSR's public key (ECDSA P-256, what Remora and
    /// pilot-agent send) and URI SANs, valid from now for `ttl`. Returns the leaf's PEM.
    pub fn sign_csr(&self, csr_pem: &str, ttl: Duration) -> Result<String, String> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(csr_pem.as_bytes())
            .map_err(|e| format!("not PEM: {e}"))?;
        let (_, csr) = X509CertificationRequest::from_der(&pem.contents)
            .map_err(|e| format!("not a CSR: {e}"))?;
        let mut uris = Vec::new();
        for ext in csr.requested_extensions().into_iter().flatten() {
            if let ParsedExtension::SubjectAlternativeName(san) = ext {
                for name in &san.general_names {
                    if let GeneralName::URI(u) = name {
                        uris.push(u.to_string());
                    }
                }
            }
        }
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = uris
            .iter()
            .map(|u| Ok(SanType::URI(u.as_str().try_into()?)))
            .collect::<Result<_, rcgen::Error>>()
            .map_err(|e| e.to_string())?;
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let now = SystemTime::now();
        params.not_before = now.into();
        params.not_after = (now + ttl).into();
        params.serial_number = Some(SerialNumber::from(
            now.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos() as u64,
        ));
        let key = CsrKey(
            csr.certification_request_info
                .subject_pki
                .subject_public_key
                .data
                .to_vec(),
        );
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(|e| e.to_string())?;
        Ok(cert.pem())
    }

    /// Write `cert` and this CA's root into `dir` in Istio's layout (created 0755 if needed;
    /// files 0644, readable by the proxy's UID). Each file is replaced by a rename, as Kubernetes
    /// updates a mounted secret, so a reader never sees half a file.
    pub fn install(&self, dir: &Path, cert: &WorkloadCert) {
        install_files(dir, cert, &self.root_pem());
    }
}

/// A CSR's P-256 public key, as rcgen signs it.
struct CsrKey(Vec<u8>);

impl rcgen::PublicKeyData for CsrKey {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }
    fn algorithm(&self) -> &rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

/// Write a chain, key and roots into `dir` in Istio's layout.
pub fn install_files(dir: &Path, cert: &WorkloadCert, roots: &str) {
    fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    fs::set_permissions(dir, Permissions::from_mode(0o755)).expect("make the cert dir readable");
    for (name, contents) in [
        ("root-cert.pem", roots),
        ("key.pem", cert.key.as_str()),
        ("cert-chain.pem", cert.chain.as_str()),
    ] {
        let tmp: PathBuf = dir.join(format!(".{name}.tmp"));
        fs::write(&tmp, contents).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
        fs::set_permissions(&tmp, Permissions::from_mode(0o644)).expect("make a cert readable");
        fs::rename(&tmp, dir.join(name)).expect("move a cert file into place");
    }
}
