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
    let mut element = format!(
        "By={};Hash={};Subject=\"{}\"",
        ours.as_str(),
        peer.cert_hash,
        peer.subject.replace('"', "\\\"")
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

/// A certificate's subject as Envoy prints it: RFC 2253 order (last RDN first), `,`-separated.
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
                        "2.5.4.3" => "CN".to_string(),
                        "2.5.4.10" => "O".to_string(),
                        "2.5.4.11" => "OU".to_string(),
                        "2.5.4.6" => "C".to_string(),
                        "2.5.4.7" => "L".to_string(),
                        "2.5.4.8" => "ST".to_string(),
                        _ => oid,
                    };
                    format!("{name}={}", attr.as_str().unwrap_or("#"))
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    rdns.reverse();
    rdns.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> Peer {
        Peer {
            spiffe_id: SpiffeId::parse("spiffe://cluster.local/ns/foo/sa/sleep"),
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
}
