//! Certificates for the unit tests: a mesh CA and workload certificates shaped as Istio's
//! (a SPIFFE ID as the only SAN, both TLS usages), and DNS-named ones for servers outside the
//! mesh, made with rcgen.

use crate::identity::{Files, Identity, Paths};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    SanType,
};
use std::path::PathBuf;

/// A certificate authority.
pub struct Ca {
    pub cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, name);
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// A workload certificate for `spiffe_id`; `expired` makes one that ended in 2020.
    pub fn workload(&self, spiffe_id: &str, expired: bool) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = vec![SanType::URI(spiffe_id.try_into().unwrap())];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        if expired {
            params.not_before = rcgen::date_time_ymd(2019, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        }
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A certificate for these DNS names (a server outside the mesh, or its client), both
    /// TLS usages: (chain PEM, key PEM).
    pub fn dns(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A loaded identity for `spiffe_id`, trusting this CA.
    pub fn identity(&self, spiffe_id: &str) -> Identity {
        let (chain, key) = self.workload(spiffe_id, false);
        self.identity_from(chain, key)
    }

    /// A loaded identity from these PEMs, trusting this CA.
    pub fn identity_from(&self, chain: String, key: String) -> Identity {
        let paths = Paths {
            chain: PathBuf::from("cert-chain.pem"),
            key: PathBuf::from("key.pem"),
            roots: PathBuf::from("root-cert.pem"),
        };
        let files = Files::new(chain.into(), key.into(), self.cert.pem().into());
        Identity::load(&paths, &files).unwrap()
    }
}
