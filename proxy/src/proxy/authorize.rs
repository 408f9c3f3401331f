//! Inbound authorization of opaque TCP connections (Envoy's network RBAC filter in an Istio
//! sidecar): decided once the connection is known not to be HTTP and its peer is known (after
//! mutual TLS, or none for plaintext), before anything reaches the application. A denied
//! connection is closed. HTTP connections are decided request by request instead
//! (`http::authorize`).

use super::*;
use crate::authz::{Attributes, Verdict};
use crate::tls::client_hello::{self, Parsed};

impl Proxy {
    /// The outcome of a denied inbound connection, or `None` when it may go on. `peer` is the
    /// client's sidecar when mesh TLS was terminated; `sni` tells the server name the client
    /// asked for, and is only asked when a policy is in force.
    pub(super) fn tcp_denied(
        &self,
        hop: &Hop,
        peer: Option<&crate::tls::Peer>,
        sni: impl FnOnce() -> Option<String>,
    ) -> Option<Outcome> {
        if hop.dir != Direction::Inbound || !self.authz.is_active() {
            return None;
        }
        let sni = sni();
        let attributes = Attributes {
            source: hop.peer,
            destination: hop.destination,
            principal: peer
                .and_then(|p| p.spiffe_id.as_ref())
                .map(crate::identity::SpiffeId::as_str),
            peer,
            sni: sni.as_deref(),
            request: None,
        };
        match self.authz.check(&attributes) {
            Verdict::Allowed => None,
            Verdict::Denied(_) => Some(refused(Some(hop.destination), End::RbacDenied)),
        }
    }
}

/// The server name in a TLS ClientHello at the start of `prefix` (the application's own TLS,
/// passed through), if there is one.
pub(super) fn tls_sni(prefix: &[u8]) -> Option<String> {
    match client_hello::parse(prefix) {
        Parsed::Complete(hello) => hello.server_name,
        Parsed::Incomplete | Parsed::Invalid => None,
    }
}
