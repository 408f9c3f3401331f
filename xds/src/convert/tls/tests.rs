//! The shapes istiod writes for a DestinationRule's `trafficPolicy.tls` (SIMPLE, MUTUAL) in
//! `cluster_tls.go`, accepted; what Remora cannot honour, refused by name.

use crate::convert::from_json;
use crate::model::cluster::{SdsSecret, TlsVersion, TransportSocket, UpstreamTls};
use crate::model::matcher::StringMatch;
use serde_json::{json, Value};

type ClusterProto = envoy_types::pb::envoy::config::cluster::v3::Cluster;

const UPSTREAM: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";

/// istiod's SDS reference to pilot-agent's server (`model.ConstructSdsSecretConfig`).
fn sds(name: &str) -> Value {
    json!({"name": name, "sds_config": {"api_config_source": {"api_type": "GRPC",
        "set_node_on_first_message_only": true, "transport_api_version": "V3",
        "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}]},
        "resource_api_version": "V3"}})
}

/// A cluster whose transport socket is `common` (and `sni`), as istiod builds it.
fn convert(common: Value, sni: Option<&str>) -> Result<UpstreamTls, String> {
    let mut ctx = json!({"@type": UPSTREAM, "common_tls_context": common});
    if let Some(sni) = sni {
        ctx["sni"] = json!(sni);
    }
    let cluster = json!({"name": "outbound|443||api.example.com", "type": "STRICT_DNS",
        "metadata": {"filter_metadata": {"istio": {"alpn_override": "false"}}},
        "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": ctx}});
    let c = from_json::<ClusterProto>(&cluster)
        .map(|c| c.model)
        .map_err(|r| r.to_string())?;
    assert!(c.istio.keeps_alpn, "alpn_override false is read");
    match c.transport_socket {
        TransportSocket::Tls(tls) => Ok(*tls),
        TransportSocket::Plaintext => Err("plaintext".into()),
    }
}

fn params() -> Value {
    json!({"tls_minimum_protocol_version": "TLSv1_2", "tls_maximum_protocol_version": "TLSv1_3"})
}

#[test]
fn simple_with_ca_certificates_and_sans() {
    // tls: {mode: SIMPLE, caCertificates: /etc/certs/ca.pem, sni: api.example.com,
    //       subjectAltNames: [api.example.com]}
    let tls = convert(
        json!({"tls_params": params(), "combined_validation_context": {
            "default_validation_context": {"match_subject_alt_names": [{"exact": "api.example.com"}]},
            "validation_context_sds_secret_config": sds("file-root:/etc/certs/ca.pem")}}),
        Some("api.example.com"),
    )
    .expect("accepted");
    assert!(!tls.is_mesh());
    assert_eq!(tls.sni.as_deref(), Some("api.example.com"));
    assert_eq!(tls.certificate_secret, None);
    assert_eq!(
        tls.validation_secret,
        Some(SdsSecret::FileRoots("/etc/certs/ca.pem".into()))
    );
    assert_eq!(tls.subject_alt_names.len(), 1);
    assert_eq!(tls.subject_alt_names[0].san_type, None);
    assert_eq!(
        tls.subject_alt_names[0].matcher.kind,
        StringMatch::Exact("api.example.com".into())
    );
    assert_eq!(tls.min_version, Some(TlsVersion::Tls1_2));
}

#[test]
fn simple_without_ca_takes_the_system_roots() {
    // No caCertificates: istiod names `file-root:system`, the OS bundle pilot-agent finds.
    let tls = convert(
        json!({"tls_params": params(), "combined_validation_context": {
            "default_validation_context": {},
            "validation_context_sds_secret_config": sds("file-root:system")}}),
        Some("api.example.com"),
    )
    .expect("accepted");
    assert_eq!(tls.validation_secret, Some(SdsSecret::SystemRoots));
    assert_eq!(
        tls.validation_secret
            .as_ref()
            .map(SdsSecret::name)
            .as_deref(),
        Some("file-root:system")
    );
}

#[test]
fn insecure_skip_verify_is_an_empty_validation_context() {
    let tls = convert(
        json!({"tls_params": params(), "validation_context": {}}),
        Some("api.example.com"),
    )
    .expect("accepted");
    assert_eq!(tls.validation_secret, None);
    assert!(tls.subject_alt_names.is_empty());
    assert!(!tls.is_mesh());
}

#[test]
fn mutual_with_client_certificate_files_and_h2_alpn() {
    // tls: {mode: MUTUAL, clientCertificate, privateKey, caCertificates}, an HTTP/2 port.
    let tls = convert(
        json!({"tls_params": params(), "alpn_protocols": ["h2"],
            "tls_certificate_sds_secret_configs": [sds("file-cert:/etc/certs/client.pem~/etc/certs/client-key.pem")],
            "combined_validation_context": {
                "default_validation_context": {"match_typed_subject_alt_names": [
                    {"san_type": "DNS", "matcher": {"exact": "api.example.com"}}]},
                "validation_context_sds_secret_config": sds("file-root:/etc/certs/ca.pem")}}),
        None,
    )
    .expect("accepted");
    assert_eq!(
        tls.certificate_secret,
        Some(SdsSecret::FileCertificate {
            chain: "/etc/certs/client.pem".into(),
            key: "/etc/certs/client-key.pem".into(),
        })
    );
    assert_eq!(
        tls.certificate_secret
            .as_ref()
            .map(SdsSecret::name)
            .as_deref(),
        Some("file-cert:/etc/certs/client.pem~/etc/certs/client-key.pem")
    );
    assert_eq!(tls.alpn, ["h2"]);
    assert_eq!(tls.sni, None);
}

#[test]
fn istio_mutual_is_still_the_mesh() {
    let tls = convert(
        json!({"tls_certificate_sds_secret_configs": [sds("default")],
            "combined_validation_context": {"default_validation_context": {},
                "validation_context_sds_secret_config": sds("ROOTCA")}}),
        Some("outbound_.443_._.api.example.com"),
    )
    .expect("accepted");
    assert!(tls.is_mesh());
}

/// istiod's SDS reference to a secret it serves itself (`SDSAdsConfig`: a DestinationRule's
/// `credentialName`).
fn ads(name: &str) -> Value {
    json!({"name": name, "sds_config": {"ads": {}, "resource_api_version": "V3"}})
}

#[test]
fn credential_name_secrets_come_from_ads() {
    // MUTUAL with credentialName, as `ApplyCustomSDSToClientCommonTLSContext` writes it.
    let tls = convert(
        json!({"tls_params": {"tls_minimum_protocol_version": "TLSv1_2", "tls_maximum_protocol_version": "TLSv1_3"},
            "tls_certificate_sds_secret_configs": [ads("kubernetes://client-credential")],
            "combined_validation_context": {
                "default_validation_context": {"match_subject_alt_names": [{"exact": "api.example.com"}]},
                "validation_context_sds_secret_config": ads("kubernetes://client-credential-cacert")}}),
        Some("api.example.com"),
    )
    .expect("accepted");
    assert!(!tls.is_mesh());
    assert_eq!(
        tls.certificate_secret,
        Some(SdsSecret::Ads("kubernetes://client-credential".into()))
    );
    assert_eq!(
        tls.validation_secret,
        Some(SdsSecret::Ads(
            "kubernetes://client-credential-cacert".into()
        ))
    );
    assert_eq!(
        tls.ads_secrets().collect::<Vec<_>>(),
        vec![
            "kubernetes://client-credential",
            "kubernetes://client-credential-cacert"
        ]
    );
    // SIMPLE with insecureSkipVerify: no validation context at all, nothing from ADS.
    let tls = convert(json!({}), None).expect("accepted");
    assert_eq!(tls.ads_secrets().count(), 0);
    // The workload's own names stay Remora's, whatever source a hand-written resource gives.
    let tls = convert(
        json!({"tls_certificate_sds_secret_configs": [ads("default")],
            "validation_context_sds_secret_config": ads("ROOTCA")}),
        None,
    )
    .expect("accepted");
    assert!(tls.is_mesh());
}

fn refused(common: Value) -> String {
    convert(common, None).expect_err("refused")
}

#[test]
fn what_cannot_be_honoured_is_refused_by_name() {
    // A name Remora's SDS has no meaning for, from the agent's server rather than ADS.
    let err = refused(
        json!({"tls_certificate_sds_secret_configs": [sds("kubernetes://client-credential")]}),
    );
    assert!(
        err.contains("tls_certificate_sds_secret_configs[0].name")
            && err.contains("\"kubernetes://client-credential\" not supported"),
        "{err}"
    );
    // A certificate from ADS checked against the mesh roots: no shape istiod writes.
    let err = refused(
        json!({"tls_certificate_sds_secret_configs": [ads("kubernetes://c")],
        "validation_context_sds_secret_config": sds("ROOTCA")}),
    );
    assert!(err.contains("served over ADS with the mesh roots"), "{err}");
    // Malformed file names.
    let err = refused(
        json!({"tls_certificate_sds_secret_configs": [sds("file-cert:/only-a-chain.pem")]}),
    );
    assert!(err.contains("is not `file-cert:CHAIN~KEY`"), "{err}");
    let err = refused(json!({"validation_context_sds_secret_config": sds("file-root:/a~/b")}));
    assert!(err.contains("is not `file-root:PATH`"), "{err}");
    let err = refused(json!({"validation_context_sds_secret_config": sds("file-root:")}));
    assert!(err.contains("names no file"), "{err}");
    // A certificate revocation list (DestinationRule caCrl) is not checked by Remora.
    let err = refused(json!({"combined_validation_context": {
        "default_validation_context": {"crl": {"filename": "/etc/certs/crl.pem"}},
        "validation_context_sds_secret_config": sds("file-root:/etc/certs/ca.pem")}}));
    assert!(err.contains("crl"), "{err}");
    // Shapes istiod never writes: SANs with nothing to chain to, mixed mesh and file secrets,
    // a non-empty inline validation context.
    let err = refused(json!({"combined_validation_context": {
        "default_validation_context": {"match_subject_alt_names": [{"exact": "a"}]}}}));
    assert!(err.contains("without trusted roots"), "{err}");
    let err = refused(
        json!({"tls_certificate_sds_secret_configs": [sds("default")],
        "validation_context_sds_secret_config": sds("file-root:system")}),
    );
    assert!(err.contains("roots other than `ROOTCA`"), "{err}");
    let err = refused(
        json!({"tls_certificate_sds_secret_configs": [sds("file-cert:/c~/k")],
        "validation_context_sds_secret_config": sds("ROOTCA")}),
    );
    assert!(err.contains("with the mesh roots"), "{err}");
    let err = refused(json!({"tls_certificate_sds_secret_configs": [sds("file-root:system")]}));
    assert!(
        err.contains("root secret named as the client certificate"),
        "{err}"
    );
    let err = refused(json!({"validation_context": {"match_subject_alt_names": [{"exact": "a"}]}}));
    assert!(
        err.contains("validation_context") && err.contains("not supported"),
        "{err}"
    );
}

#[test]
fn file_secrets_are_for_upstream_contexts_only() {
    use envoy_types::pb::envoy::config::listener::v3::Listener;
    let listener = json!({"name": "l", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
        "filter_chains": [{"transport_socket": {"name": "tls", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "common_tls_context": {"tls_certificate_sds_secret_configs": [sds("file-cert:/c~/k")]}}},
            "filters": []}]});
    let err = from_json::<Listener>(&listener)
        .map(|_| ())
        .expect_err("refused")
        .to_string();
    assert!(err.contains("\"file-cert:/c~/k\" not supported"), "{err}");
}

/// A SIMPLE cluster without `sni` (istiod's `setAutoSniAndAutoSanValidation`), with these
/// `upstream_http_protocol_options` and this common context.
fn auto(options: Value, common: Value) -> Result<crate::model::Cluster, String> {
    let cluster = json!({"name": "outbound|443||api.example.com",
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "upstream_http_protocol_options": options}},
        "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": UPSTREAM, "common_tls_context": common}}});
    from_json::<ClusterProto>(&cluster)
        .map(|c| c.model)
        .map_err(|r| r.to_string())
}

#[test]
fn auto_sni_and_auto_san_validation_for_origination_only() {
    let system = json!({"tls_params": params(), "combined_validation_context": {
        "default_validation_context": {},
        "validation_context_sds_secret_config": sds("file-root:system")}});
    let c = auto(
        json!({"auto_sni": true, "auto_san_validation": true}),
        system.clone(),
    )
    .expect("accepted");
    assert!(c.auto_sni && c.auto_san_validation);
    let c = auto(json!({"auto_sni": true}), system.clone()).expect("accepted");
    assert!(c.auto_sni && !c.auto_san_validation);
    let err = auto(
        json!({"auto_sni": true, "override_auto_sni_header": "x-sni"}),
        system,
    )
    .expect_err("refused");
    assert!(err.contains("override_auto_sni_header"), "{err}");
    let mesh = json!({"tls_certificate_sds_secret_configs": [sds("default")],
        "validation_context_sds_secret_config": sds("ROOTCA")});
    let err = auto(json!({"auto_sni": true}), mesh).expect_err("refused");
    assert!(
        err.contains("upstream_http_protocol_options") && err.contains("Istio mTLS"),
        "{err}"
    );
}

#[test]
fn an_sni_tls_cannot_carry_is_refused() {
    for sni in ["10.0.0.1", "api example.com", "a..b", "::1"] {
        let err = convert(
            json!({"tls_params": params(), "validation_context": {}}),
            Some(sni),
        )
        .expect_err(sni);
        assert!(
            err.contains(".sni") && err.contains("not supported"),
            "{sni}: {err}"
        );
    }
    for sni in [
        "outbound_.9080_.v1_.reviews.default.svc.cluster.local",
        "api.example.com.",
    ] {
        convert(
            json!({"tls_params": params(), "validation_context": {}}),
            Some(sni),
        )
        .unwrap_or_else(|e| panic!("{sni}: {e}"));
    }
}
