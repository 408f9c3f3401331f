//! `x-forwarded-client-cert`, as an Istio sidecar sets it on requests to the application
//! (Envoy's `APPEND_FORWARD` with subject, URI and DNS details): the element
//! `By=<our SPIFFE ID>;Hash=<SHA-256 of the client certificate>;Subject="<its subject>";URI=<its
//! SPIFFE ID>` is appended to whatever the request carried.

use super::Peer;
use crate::identity::SpiffeId;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use x509_parser::prelude::{FromDer, X509Certificate};

/// The header's name.
pub static XFCC: HeaderName = HeaderName::from_static("x-forwarded-client-cert");

/// Append this hop's element to the request's `x-forwarded-client-cert`.
pub fn append(headers: &mut HeaderMap, ours: &SpiffeId, peer: &Peer) {
    let element = element(ours, peer);
    let value = match headers.get(&XFCC).and_then(|v| v.to_str().ok()) {
        Some(existing) if !existing.is_empty() => format!("{existing},{element}"),
        _ => element,
    };
    // Every part came from a certificate that parsed; a byte that cannot be in a header value
    // drops the header rather than the request.
    match HeaderValue::from_str(&value) {
        Ok(v) => {
            headers.insert(XFCC.clone(), v);
        }
        Err(_) => {
            headers.remove(&XFCC);
        }
    }
}

/// This hop's element: who we are, and the client's certificate.
pub fn element(ours: &SpiffeId, peer: &Peer) -> String {
    // The subject's own quotes, semicolons and commas are escaped already (RFC 2253), as in
    // Envoy's header: a parser that splits on `;` cannot be fed an element of the client's.
    let mut element = format!(
        "By={};Hash={};Subject=\"{}\"",
        ours.as_str(),
        peer.cert_hash,
        peer.subject
    );
    if let Some(id) = &peer.spiffe_id {
        element.push_str(";URI=");
        element.push_str(id.as_str());
    }
    for dns in &peer.dns_sans {
        element.push_str(";DNS=");
        element.push_str(dns);
    }
    element
}

/// A certificate's subject as Envoy prints it (OpenSSL's RFC 2253 form): last RDN first,
/// `,`-separated, OpenSSL's short names, special characters in values escaped.
pub fn subject(der: &[u8]) -> String {
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return String::new();
    };
    let mut rdns: Vec<String> = cert
        .subject()
        .iter_rdn()
        .map(|rdn| {
            rdn.iter()
                .map(|attr| {
                    let oid = attr.attr_type().to_id_string();
                    let name = match oid.as_str() {
                        "2.5.4.3" => "CN",
                        "2.5.4.10" => "O",
                        "2.5.4.11" => "OU",
                        "2.5.4.6" => "C",
                        "2.5.4.7" => "L",
                        "2.5.4.8" => "ST",
                        "2.5.4.4" => "SN",
                        "2.5.4.5" => "serialNumber",
                        "2.5.4.9" => "street",
                        "2.5.4.12" => "title",
                        "2.5.4.42" => "GN",
                        "0.9.2342.19200300.100.1.1" => "UID",
                        "0.9.2342.19200300.100.1.25" => "DC",
                        "1.2.840.113549.1.9.1" => "emailAddress",
                        other => other,
                    };
                    format!("{name}={}", escape_rfc2253(attr.as_str().unwrap_or("#")))
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    rdns.reverse();
    rdns.join(",")
}

/// An attribute value with RFC 2253's special characters escaped, as OpenSSL escapes them.
fn escape_rfc2253(value: &str) -> String {
    let last = value.chars().count().saturating_sub(1);
    let mut out = String::with_capacity(value.len());
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && matches!(c, '#' | ' '))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> Peer {
        Peer {
            spiffe_id: SpiffeId::parse("spiffe://cluster.local/ns/foo/sa/sleep"),
            uri_sans: vec!["spiffe://cluster.local/ns/foo/sa/sleep".into()],
            cert_hash: "ab12".into(),
            subject: String::new(),
            dns_sans: vec![],
            alpn: None,
            metadata: None,
            service: None,
        }
    }

    #[test]
    fn sets_istios_element_and_appends_to_a_forwarded_one() {
        let ours = SpiffeId::parse("spiffe://cluster.local/ns/foo/sa/httpbin").unwrap();
        let mut h = HeaderMap::new();
        append(&mut h, &ours, &peer());
        assert_eq!(
            h[&XFCC],
            "By=spiffe://cluster.local/ns/foo/sa/httpbin;Hash=ab12;Subject=\"\";URI=spiffe://cluster.local/ns/foo/sa/sleep"
        );
        let mut h = HeaderMap::new();
        h.insert(XFCC.clone(), HeaderValue::from_static("By=x;Hash=y"));
        append(&mut h, &ours, &peer());
        assert!(h[&XFCC]
            .to_str()
            .unwrap()
            .starts_with("By=x;Hash=y,By=spiffe://"));
    }

    #[test]
    fn subjects_are_escaped_as_openssl_writes_rfc_2253() {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CountryName, "US");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Acme, Inc.");
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            "x\";URI=spiffe://cluster.local/ns/kube-system/sa/admin;By=\"y",
        );
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let subject = subject(cert.der());
        assert_eq!(
            subject,
            "CN=x\\\"\\;URI=spiffe://cluster.local/ns/kube-system/sa/admin\\;By=\\\"y,O=Acme\\, Inc.,C=US"
        );
        let ours = SpiffeId::parse("spiffe://cluster.local/ns/foo/sa/httpbin").unwrap();
        let element = element(&ours, &Peer { subject, ..peer() });
        // One URI: the client's, not one its subject tried to add (escaped, it is text).
        let unescaped = element.matches(";URI=").count() - element.matches("\\;URI=").count();
        assert_eq!(unescaped, 1, "{element}");
        assert_eq!(escape_rfc2253(" #a "), "\\ #a\\ ");
    }
}
