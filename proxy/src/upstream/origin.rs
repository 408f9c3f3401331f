//! TLS origination to servers outside the mesh, as a DestinationRule's `tls` (SIMPLE, MUTUAL)
//! asks for it. Its certificates come from the files the socket's SDS secrets name, read here
//! as pilot-agent's SDS server reads them for Envoy (`file-root:PATH`, `file-root:system`,
//! `file-cert:CHAIN~KEY`), or, for a `credentialName`, from the secrets istiod serves over
//! ADS (`kubernetes://NAME`, `kubernetes://NAME-cacert`), which the store holds. They become
//! one rustls client config per origination and ALPN offer, shared by every connection. A
//! config is built again when one of its files changes (pilot-agent watches them and pushes
//! the new secret) or its secret is replaced by a newer one, so a rotated client certificate
//! or bundle applies to the next connection. A file that cannot be read, or a secret not
//! received yet, fails the connection, as Envoy's connect fails while its secret is missing;
//! the key's bytes are never logged.

mod verify;

use super::transport::{ClientCertificate, ClientFiles, OriginTls, Roots};
use remora_xds::model::secret::SecretKind;
use remora_xds::snapshot::{Entry, Snapshot};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// Where pilot-agent looks for the operating system's roots for `file-root:system`
/// (`security.GetOSRootFilePath`, after Go's list): the first that exists.
const SYSTEM_ROOTS: [&str; 8] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
    "/usr/local/etc/ssl/cert.pem",
    "/etc/ssl/certs/ca-certificates",
];

/// At most this many configs are kept; a full cache starts again empty (istiod may name
/// originations without end over a long life).
const CACHED: usize = 256;

/// Why an origination's config could not be had.
#[derive(Debug, thiserror::Error)]
pub enum OriginError {
    #[error("{path}: {cause}")]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("`file-root:system`: no operating system root bundle found")]
    NoSystemRoots,
    #[error("secret {name:?}: not received from the control plane")]
    SecretMissing { name: String },
    #[error("secret {name:?}: {message}")]
    InvalidSecret { name: String, message: String },
    #[error("building the TLS config: {0}")]
    Config(String),
}

/// The client configs built for originations.
#[derive(Debug, Default)]
pub struct Origins {
    cache: Mutex<HashMap<CacheKey, Cached>>,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct CacheKey {
    tls: Arc<OriginTls>,
    alpn: Vec<Vec<u8>>,
}

#[derive(Debug)]
struct Cached {
    /// The files' state when they were read: a change means another read.
    stamps: Vec<Stamp>,
    config: Arc<ClientConfig>,
}

/// What a config was built from, to tell whether it is still current: a file's
/// modification time and length (`None`: it could not be looked at), or the secret entry the
/// store held (`None`: none yet).
#[derive(Debug)]
enum Stamp {
    File(Option<(SystemTime, u64)>),
    Secret(Option<Arc<Entry<SecretProto>>>),
}

type SecretProto = envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;

impl PartialEq for Stamp {
    fn eq(&self, other: &Stamp) -> bool {
        match (self, other) {
            (Stamp::File(a), Stamp::File(b)) => a == b,
            // The store replaces an entry whole on every update: the same entry is the same
            // secret.
            (Stamp::Secret(a), Stamp::Secret(b)) => match (a, b) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            },
            _ => false,
        }
    }
}

/// Where an origination's roots or client certificate come from: files, or a secret by name
/// with the entry the store held for it when the connection looked.
enum Source<'a> {
    /// A root bundle.
    File(PathBuf),
    /// A client certificate's chain and key.
    Files(&'a ClientFiles),
    Secret(&'a str, Option<Arc<Entry<SecretProto>>>),
}

impl Source<'_> {
    fn stamps(&self) -> Vec<Stamp> {
        match self {
            Source::File(path) => vec![Stamp::File(stamp(path))],
            Source::Files(files) => vec![
                Stamp::File(stamp(&files.chain)),
                Stamp::File(stamp(&files.key)),
            ],
            Source::Secret(_, entry) => vec![Stamp::Secret(entry.clone())],
        }
    }
}

fn secret_source<'a>(name: &'a str, secrets: Option<&Snapshot>) -> Source<'a> {
    Source::Secret(name, secrets.and_then(|s| s.secret(name)).cloned())
}

impl Origins {
    /// The config for `tls` offering `alpn`: cached while its files and secrets stay as they
    /// were. `secrets` is the store's snapshot, where secrets served over ADS are found.
    pub fn client_config(
        &self,
        tls: &Arc<OriginTls>,
        alpn: &[&[u8]],
        secrets: Option<&Snapshot>,
    ) -> Result<Arc<ClientConfig>, OriginError> {
        let roots = match &tls.roots {
            None => None,
            Some(Roots::File(path)) => Some(Source::File(path.clone())),
            Some(Roots::System) => Some(Source::File(
                system_roots().ok_or(OriginError::NoSystemRoots)?,
            )),
            Some(Roots::Secret(name)) => Some(secret_source(name, secrets)),
        };
        let client = match &tls.client_certificate {
            None => None,
            Some(ClientCertificate::Files(files)) => Some(Source::Files(files)),
            Some(ClientCertificate::Secret(name)) => Some(secret_source(name, secrets)),
        };
        let stamps: Vec<Stamp> = roots
            .iter()
            .chain(&client)
            .flat_map(Source::stamps)
            .collect();
        let key = CacheKey {
            tls: Arc::clone(tls),
            alpn: alpn.iter().map(|a| a.to_vec()).collect(),
        };
        {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(hit) = cache.get(&key).filter(|c| c.stamps == stamps) {
                return Ok(Arc::clone(&hit.config));
            }
        }
        let roots = roots.as_ref().map(load_roots).transpose()?.map(Arc::new);
        let client = client.as_ref().map(load_client).transpose()?;
        let config = Arc::new(build(tls, roots, client, alpn)?);
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= CACHED {
            cache.clear();
        }
        cache.insert(
            key,
            Cached {
                stamps,
                config: Arc::clone(&config),
            },
        );
        Ok(config)
    }
}

/// At most one warning per this long: every connection of a cluster fails the same way
/// while its file or secret is missing, and the log must not grow with the traffic.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// Logs why an origination's config could not be had (the file or secret and what is wrong,
/// never a key), at most once per [`LOG_EVERY`].
pub fn log_failure(address: std::net::SocketAddr, error: &OriginError) {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
    let now = Instant::now();
    if last.is_some_and(|at| now.duration_since(at) < LOG_EVERY) {
        return;
    }
    *last = Some(now);
    tracing::warn!(%address, "TLS origination failed: {error}");
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// The operating system's bundle, where pilot-agent finds it.
fn system_roots() -> Option<PathBuf> {
    SYSTEM_ROOTS.iter().map(PathBuf::from).find(|p| p.is_file())
}

fn read(path: &Path) -> Result<Vec<u8>, OriginError> {
    std::fs::read(path).map_err(|cause| OriginError::Read {
        path: path.to_path_buf(),
        cause,
    })
}

fn invalid(path: &Path, message: impl Into<String>) -> OriginError {
    OriginError::Invalid {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// The roots of a PEM bundle. A system bundle may hold a certificate webpki cannot use as an
/// anchor; the others still serve, as they do for OpenSSL. A bundle with none is an error.
fn parse_roots(pem: &[u8]) -> Result<RootCertStore, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("not PEM certificates: {e}"))?;
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(certs);
    if roots.is_empty() {
        return Err("holds no usable root certificate".into());
    }
    Ok(roots)
}

fn invalid_secret(name: &str, message: impl Into<String>) -> OriginError {
    OriginError::InvalidSecret {
        name: name.to_string(),
        message: message.into(),
    }
}

/// The entry of a secret that must be there.
fn received<'a>(
    name: &str,
    entry: &'a Option<Arc<Entry<SecretProto>>>,
) -> Result<&'a Arc<Entry<SecretProto>>, OriginError> {
    entry.as_ref().ok_or_else(|| OriginError::SecretMissing {
        name: name.to_string(),
    })
}

fn load_roots(source: &Source<'_>) -> Result<RootCertStore, OriginError> {
    match source {
        Source::File(path) => parse_roots(&read(path)?).map_err(|m| invalid(path, m)),
        Source::Files(files) => Err(invalid(&files.chain, "a client certificate as roots")),
        Source::Secret(name, entry) => match &received(name, entry)?.model.kind {
            SecretKind::ValidationContext { trusted_ca, .. } if !trusted_ca.is_empty() => {
                parse_roots(trusted_ca).map_err(|m| invalid_secret(name, m))
            }
            SecretKind::ValidationContext { .. } => Err(invalid_secret(
                name,
                "a validation context without trusted_ca (SPIFFE bundles are not used for origination)",
            )),
            SecretKind::TlsCertificate { .. } => Err(invalid_secret(
                name,
                "a TLS certificate named as the trusted roots",
            )),
        },
    }
}

/// The client certificate: the chain, and the key that must match it. Errors say what is
/// wrong, never the key's contents.
fn parse_client(chain: &[u8], key: &[u8]) -> Result<Arc<CertifiedKey>, (bool, String)> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain)
        .collect::<Result<_, _>>()
        .map_err(|e| (false, format!("not PEM certificates: {e}")))?;
    if chain.is_empty() {
        return Err((false, "holds no certificate".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|_| (true, "not a PEM private key".to_string()))?;
    let signing = crate::tls::provider()
        .key_provider
        .load_private_key(key)
        .map_err(|_| (true, "unusable private key".to_string()))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| (true, format!("does not match the certificate: {e}")))?;
    Ok(Arc::new(certified))
}

fn load_client(source: &Source<'_>) -> Result<Arc<CertifiedKey>, OriginError> {
    match source {
        Source::File(path) => Err(invalid(path, "a root bundle as a client certificate")),
        Source::Files(files) => {
            let chain = read(&files.chain)?;
            let key = read(&files.key)?;
            parse_client(&chain, &key).map_err(|(in_key, m)| match in_key {
                true => invalid(&files.key, m),
                false => invalid(&files.chain, m),
            })
        }
        Source::Secret(name, entry) => match &received(name, entry)?.model.kind {
            SecretKind::TlsCertificate {
                certificate_chain,
                private_key,
            } => parse_client(certificate_chain, private_key).map_err(|(in_key, m)| {
                let field = if in_key {
                    "private_key"
                } else {
                    "certificate_chain"
                };
                invalid_secret(name, format!("{field}: {m}"))
            }),
            SecretKind::ValidationContext { .. } => Err(invalid_secret(
                name,
                "a validation context named as the client certificate",
            )),
        },
    }
}

fn build(
    tls: &OriginTls,
    roots: Option<Arc<RootCertStore>>,
    client: Option<Arc<CertifiedKey>>,
    alpn: &[&[u8]],
) -> Result<ClientConfig, OriginError> {
    let provider = crate::tls::provider();
    let verifier =
        verify::OriginVerifier::new(roots, Arc::clone(&provider), tls.subject_alt_names.clone());
    let min = if tls.tls13_only {
        remora_config::TlsVersion::Tls13
    } else {
        remora_config::TlsVersion::Tls12
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(crate::tls::versions(min))
        .map_err(|e| OriginError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    let mut config = match client {
        Some(client) => builder.with_client_cert_resolver(Arc::new(crate::tls::Fixed(client))),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

#[cfg(test)]
mod tests;
