//! Secrets as istiod's SecretGen serves them for a `credentialName` (`toEnvoyTLSSecret`,
//! `toEnvoyCaSecret`: inline bytes), accepted; what Envoy would fail to load, refused by field.

use crate::convert::from_json;
use crate::model::secret::SecretKind;
use serde_json::{json, Value};

type SecretProto = envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;

fn key_pair() -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["client.example.com".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    (cert.pem(), key.serialize_pem())
}

/// Bytes as JSON carries them (base64), as istiod's `inline_bytes`.
fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn tls_secret(name: &str, chain: &str, key: &str) -> Value {
    json!({"name": name, "tls_certificate": {
        "certificate_chain": {"inline_bytes": b64(chain)},
        "private_key": {"inline_bytes": b64(key)}}})
}

fn refusal(v: Value) -> String {
    from_json::<SecretProto>(&v)
        .expect_err("refused")
        .to_string()
}

#[test]
fn istiods_credential_secrets_are_read() {
    let (chain, key) = key_pair();
    let s = from_json::<SecretProto>(&tls_secret("kubernetes://client", &chain, &key))
        .expect("accepted")
        .model;
    assert_eq!(s.name, "kubernetes://client");
    assert_eq!(
        s.kind,
        SecretKind::TlsCertificate {
            certificate_chain: chain.clone().into_bytes(),
            private_key: key.into_bytes(),
        }
    );
    let ca = from_json::<SecretProto>(&json!({"name": "kubernetes://client-cacert",
        "validation_context": {"trusted_ca": {"inline_bytes": b64(&chain)}}}))
    .expect("accepted")
    .model;
    assert!(
        matches!(ca.kind, SecretKind::ValidationContext { ref trusted_ca, .. } if *trusted_ca == chain.as_bytes())
    );
}

#[test]
fn config_dumps_are_read_with_their_keys_redacted() {
    // Envoy's /config_dump (and Remora's) shows `[redacted]` for a key; `remora xds validate`
    // reads dumps; SPIRE's roots set an empty `trusted_ca` beside its SPIFFE bundles.
    let (chain, _) = key_pair();
    assert!(from_json::<SecretProto>(&tls_secret("default", &chain, "[redacted]")).is_ok());
    let spire = json!({"name": "ROOTCA", "validation_context": {"trusted_ca": {}}});
    assert!(from_json::<SecretProto>(&spire).is_ok());
}

#[test]
fn a_secret_envoy_could_not_load_is_refused_by_field() {
    let (chain, key) = key_pair();
    let (_, other_key) = key_pair();
    let err = refusal(tls_secret("kubernetes://c", &chain, &other_key));
    assert!(
        err.contains("secret kubernetes://c: tls_certificate.private_key")
            && err.contains("does not match"),
        "{err}"
    );
    let err = refusal(tls_secret("kubernetes://c", "not pem", &key));
    assert!(
        err.contains("tls_certificate.certificate_chain: holds no PEM certificate"),
        "{err}"
    );
    let err = refusal(tls_secret("kubernetes://c", &chain, "garbage"));
    assert!(
        err.contains("tls_certificate.private_key: not a PEM private key"),
        "{err}"
    );
    assert!(
        !err.contains("PRIVATE KEY"),
        "the key never reaches a message: {err}"
    );
    let err = refusal(json!({"name": "kubernetes://c-cacert",
        "validation_context": {"trusted_ca": {"inline_bytes": b64("nothing")}}}));
    assert!(
        err.contains("validation_context.trusted_ca: holds no PEM certificate"),
        "{err}"
    );
    // istiod adds a CRL (`ca.crl`) or an OCSP staple when the Kubernetes secret has one:
    // Remora checks no revocation and staples nothing.
    let err = refusal(
        json!({"name": "kubernetes://c-cacert", "validation_context": {
        "trusted_ca": {"inline_bytes": b64(&chain)}, "crl": {"inline_bytes": b64("x")}}}),
    );
    assert!(
        err.contains("validation_context.crl: field not supported"),
        "{err}"
    );
    let mut staple = tls_secret("kubernetes://c", &chain, &key);
    staple["tls_certificate"]["ocsp_staple"] = json!({"inline_bytes": b64("x")});
    let err = refusal(staple);
    assert!(
        err.contains("tls_certificate.ocsp_staple: field not supported"),
        "{err}"
    );
    let err = refusal(
        json!({"name": "kubernetes://c-cacert", "validation_context": {
        "trusted_ca": {"inline_bytes": b64(&chain)},
        "match_subject_alt_names": [{"exact": "a"}]}}),
    );
    assert!(
        err.contains("subject alt name matchers in a secret"),
        "{err}"
    );
}
