use super::*;
use crate::istiod::test_ca::{Signing, TestCa};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateSigningRequestDer;
use x509_parser::prelude::{FromDer, GeneralName, ParsedExtension, X509CertificationRequest};

const ID: &str = "spiffe://cluster.local/ns/bookinfo/sa/reviews";

fn wanted() -> SpiffeId {
    SpiffeId::parse(ID).unwrap()
}

#[test]
fn the_csr_asks_for_our_spiffe_id_with_a_p256_key() {
    let m = KeyAndCsr::generate(ID).unwrap();
    assert!(m.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
    let der = CertificateSigningRequestDer::from_pem_slice(m.csr_pem.as_bytes()).unwrap();
    let (_, csr) = X509CertificationRequest::from_der(der.as_ref()).unwrap();
    let info = &csr.certification_request_info;
    // id-ecPublicKey with the P-256 curve.
    assert_eq!(
        info.subject_pki.algorithm.algorithm.to_id_string(),
        "1.2.840.10045.2.1"
    );
    let sans: Vec<String> = csr
        .requested_extensions()
        .into_iter()
        .flatten()
        .filter_map(|e| match e {
            ParsedExtension::SubjectAlternativeName(s) => Some(s.general_names.clone()),
            _ => None,
        })
        .flatten()
        .map(|n| match n {
            GeneralName::URI(u) => u.to_string(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(sans, vec![ID.to_string()]);
    // A new key every time.
    assert_ne!(KeyAndCsr::generate(ID).unwrap().key_pem, m.key_pem);
}

#[test]
fn the_response_becomes_an_identity_with_the_roots_it_ends_with() {
    let ca = TestCa::new();
    let m = KeyAndCsr::generate(ID).unwrap();
    let chain = ca.sign(&m.csr_pem, Duration::from_secs(3600), &Signing::default());
    let identity =
        identity_from_response(&chain, &m.key_pem, &wanted(), b"", "istiod:15012").unwrap();
    assert_eq!(identity.spiffe_id.as_str(), ID);
    assert_eq!(identity.chain.len(), 1);
    assert_eq!(identity.ca.len(), 1);
    assert_eq!(identity.chain_path.to_str(), Some(crate::identity::INLINE));
    let life = identity
        .not_after()
        .duration_since(identity.not_before())
        .unwrap();
    assert_eq!(life, Duration::from_secs(3600));
}

#[test]
fn a_lone_leaf_is_checked_against_the_root_file() {
    let ca = TestCa::new();
    let m = KeyAndCsr::generate(ID).unwrap();
    let chain = ca.sign(&m.csr_pem, Duration::from_secs(60), &Signing::default());
    let root = ca.root_pem();
    let identity = identity_from_response(
        &chain[..1],
        &m.key_pem,
        &wanted(),
        root.as_bytes(),
        "istiod:15012",
    )
    .unwrap();
    assert_eq!(identity.ca.len(), 1);
}

#[test]
fn a_certificate_for_another_key_or_identity_is_refused() {
    let ca = TestCa::new();
    let m = KeyAndCsr::generate(ID).unwrap();
    let other_key = Signing {
        other_key: true,
        ..Signing::default()
    };
    let chain = ca.sign(&m.csr_pem, Duration::from_secs(60), &other_key);
    let e = identity_from_response(&chain, &m.key_pem, &wanted(), b"", "istiod:15012").unwrap_err();
    assert_eq!(e.reason(), "mismatch");
    assert!(e.to_string().contains("does not match"), "{e}");

    let other_id = Signing {
        uri: Some("spiffe://cluster.local/ns/bookinfo/sa/ratings"),
        ..Signing::default()
    };
    let chain = ca.sign(&m.csr_pem, Duration::from_secs(60), &other_id);
    let e = identity_from_response(&chain, &m.key_pem, &wanted(), b"", "istiod:15012").unwrap_err();
    assert_eq!(e.reason(), "mismatch");
    assert!(e.to_string().contains("sa/ratings"), "{e}");

    let e = identity_from_response(&[], &m.key_pem, &wanted(), b"", "istiod:15012").unwrap_err();
    assert_eq!(e.reason(), "ca_error");
    let junk = vec!["not a certificate".to_string(), ca.root_pem()];
    let e = identity_from_response(&junk, &m.key_pem, &wanted(), b"", "istiod:15012").unwrap_err();
    assert_eq!(e.reason(), "mismatch");
}

#[test]
fn the_request_is_istios_wire_format() {
    use prost::Message;
    let req = IstioCertificateRequest {
        csr: "C".into(),
        validity_duration: 86_400,
        metadata: None,
    };
    // Field 1 (string), field 3 (varint): istio/api security/v1alpha1/ca.proto.
    assert_eq!(
        req.encode_to_vec(),
        vec![0x0a, 1, b'C', 0x18, 0x80, 0xa3, 0x05]
    );
    let resp = IstioCertificateResponse::decode(&[0x0a, 1, b'L', 0x0a, 1, b'R'][..]).unwrap();
    assert_eq!(resp.cert_chain, vec!["L".to_string(), "R".to_string()]);
}

#[tokio::test]
async fn a_token_gone_at_renewal_fails_the_call_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root-cert.pem");
    std::fs::write(&root, TestCa::new().root_pem()).unwrap();
    let token = dir.path().join("istio-token");
    let credentials = crate::istiod::CallCredentials::new(&token, "Kubernetes").unwrap();
    let channel = IstiodChannel::new("istiod.istio-system.svc:15012", &root, credentials).unwrap();
    let client = CaClient { channel };
    let m = KeyAndCsr::generate(ID).unwrap();
    // Nothing is dialled: the missing token is ours to report, not istiod's to refuse.
    let e = client
        .issue(m.csr_pem, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "token");
    assert!(e.to_string().contains(&token.display().to_string()), "{e}");
}
