//! The server configs that terminate mesh TLS for xDS inbound chains (`virtualInbound`): per
//! chain, its downstream context's ALPN, TLS versions, TLS 1.2 cipher suites and client
//! certificate requirement; built once per identity and those parameters, shared by every
//! connection that asks for the same.

use super::{provider, versions, ConfigError, Fixed, Mesh, CACHED_CLIENTS};
use crate::identity::Identity;
use remora_config::TlsVersion;
use remora_xds::model::cluster::SanMatcher;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{CipherSuite, ServerConfig, SupportedCipherSuite};
use std::sync::Arc;

/// The configs built for the current identity; all dropped when it changes.
#[derive(Debug)]
pub(super) struct CachedChainServers {
    identity: Arc<Identity>,
    configs: Vec<CachedChainServer>,
}

#[derive(Debug, Clone)]
struct CachedChainServer {
    params: ChainParams,
    alpn: Vec<Vec<u8>>,
    require_client: bool,
    config: Arc<ServerConfig>,
}

/// What an xDS chain's `tls_params` and validation context ask of the handshake, as far as
/// rustls has it.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainParams {
    /// `tls_minimum_protocol_version` (rustls speaks nothing below 1.2).
    pub min: TlsVersion,
    /// `tls_maximum_protocol_version` below 1.3.
    pub tls12_only: bool,
    /// `cipher_suites` in Envoy's (BoringSSL's) names, for TLS 1.2; empty: the defaults.
    /// TLS 1.3's suites are not chosen by it, in Envoy as here.
    pub cipher_suites: Vec<String>,
    /// `match_subject_alt_names`: a client certificate must carry one (none: any).
    pub client_sans: Vec<SanMatcher>,
}

static TLS12_ONLY: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS12];

impl ChainParams {
    fn protocols(&self) -> &'static [&'static rustls::SupportedProtocolVersion] {
        match self.tls12_only {
            true => &TLS12_ONLY,
            false => versions(self.min),
        }
    }

    /// The provider with only the TLS 1.2 suites the chain names (an equal-preference group
    /// `[A|B]` names both); every TLS 1.3 suite.
    fn provider(&self) -> Arc<CryptoProvider> {
        let all = provider();
        if self.cipher_suites.is_empty() {
            return all;
        }
        let named: Vec<&str> = self
            .cipher_suites
            .iter()
            .flat_map(|s| s.trim_matches(|c| c == '[' || c == ']').split('|'))
            .collect();
        let keep = |s: &SupportedCipherSuite| match s {
            SupportedCipherSuite::Tls13(_) => true,
            SupportedCipherSuite::Tls12(_) => {
                boringssl_name(s.suite()).is_some_and(|n| named.contains(&n))
            }
        };
        let mut filtered = (*all).clone();
        filtered.cipher_suites.retain(keep);
        Arc::new(filtered)
    }
}

/// The BoringSSL name of a TLS 1.2 suite rustls implements.
fn boringssl_name(suite: CipherSuite) -> Option<&'static str> {
    Some(match suite {
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 => "ECDHE-ECDSA-AES128-GCM-SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 => "ECDHE-ECDSA-AES256-GCM-SHA384",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => "ECDHE-RSA-AES128-GCM-SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => "ECDHE-RSA-AES256-GCM-SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 => {
            "ECDHE-ECDSA-CHACHA20-POLY1305"
        }
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => "ECDHE-RSA-CHACHA20-POLY1305",
        _ => return None,
    })
}

impl Mesh {
    /// The config that terminates mesh TLS for an xDS inbound chain: the workload certificate,
    /// `alpn` selected from (the chain's protocols the client offered, in the chain's order:
    /// Envoy selects none rather than fail when nothing is shared), the chain's versions and
    /// suites, and a client certificate that chains to the roots, required when
    /// `require_client` says so. `None` without an identity.
    pub fn chain_server_config(
        &self,
        params: &ChainParams,
        alpn: &[&[u8]],
        require_client: bool,
    ) -> Option<Result<Arc<ServerConfig>, ConfigError>> {
        let identity = self.identity.current()?;
        let cached = self.chain_servers.load_full();
        let current = cached
            .as_ref()
            .filter(|c| Arc::ptr_eq(&c.identity, &identity));
        if let Some(hit) = current.and_then(|c| {
            c.configs.iter().find(|k| {
                k.params == *params
                    && k.require_client == require_client
                    && k.alpn.iter().map(Vec::as_slice).eq(alpn.iter().copied())
            })
        }) {
            return Some(Ok(Arc::clone(&hit.config)));
        }
        let built = build(&identity, params, alpn, require_client).map(Arc::new);
        if let Ok(config) = &built {
            // A race with another connection costs one config built twice, never a wrong one.
            let mut configs = current
                .filter(|c| c.configs.len() < CACHED_CLIENTS)
                .map(|c| c.configs.clone())
                .unwrap_or_default();
            configs.push(CachedChainServer {
                params: params.clone(),
                alpn: alpn.iter().map(|p| p.to_vec()).collect(),
                require_client,
                config: Arc::clone(config),
            });
            self.chain_servers
                .store(Some(Arc::new(CachedChainServers { identity, configs })));
        }
        Some(built)
    }
}

fn build(
    identity: &Identity,
    params: &ChainParams,
    alpn: &[&[u8]],
    require_client: bool,
) -> Result<ServerConfig, ConfigError> {
    let provider = params.provider();
    let builder = WebPkiClientVerifier::builder_with_provider(
        Arc::clone(&identity.roots),
        Arc::clone(&provider),
    );
    let builder = match require_client {
        true => builder,
        false => builder.allow_unauthenticated(),
    };
    let roots = builder.build().map_err(|e| ConfigError(e.to_string()))?;
    let verifier: Arc<dyn rustls::server::danger::ClientCertVerifier> =
        match params.client_sans.is_empty() {
            true => roots,
            false => Arc::new(super::client_sans::SanVerifier {
                inner: roots,
                sans: params.client_sans.clone(),
            }),
        };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(params.protocols())
        .map_err(|e| ConfigError(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(Fixed(Arc::clone(&identity.certified))));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    // As the capture listener's: no resumption, every client certificate proved afresh.
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suites(names: &[&str]) -> Vec<CipherSuite> {
        let params = ChainParams {
            min: TlsVersion::Tls12,
            tls12_only: false,
            cipher_suites: names.iter().map(|s| s.to_string()).collect(),
            client_sans: Vec::new(),
        };
        params
            .provider()
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect()
    }

    #[test]
    fn a_chains_cipher_suites_narrow_tls12_only() {
        // istiod's default list: the ECDHE AES-GCM suites (its RSA-kex ones rustls lacks).
        let istiod = suites(&[
            "ECDHE-ECDSA-AES256-GCM-SHA384",
            "ECDHE-RSA-AES256-GCM-SHA384",
            "ECDHE-ECDSA-AES128-GCM-SHA256",
            "ECDHE-RSA-AES128-GCM-SHA256",
            "AES256-GCM-SHA384",
            "AES128-GCM-SHA256",
        ]);
        assert!(istiod.contains(&CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256));
        assert!(!istiod.contains(&CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256));
        assert!(istiod.contains(&CipherSuite::TLS13_AES_128_GCM_SHA256));
        let group = suites(&["[ECDHE-ECDSA-AES128-GCM-SHA256|ECDHE-ECDSA-CHACHA20-POLY1305]"]);
        assert!(group.contains(&CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256));
        assert!(!group.contains(&CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256));
        // None named: rustls's defaults.
        assert_eq!(suites(&[]).len(), provider().cipher_suites.len());
    }
}
