//! TLS origination to servers outside the mesh, as a DestinationRule's `tls` (SIMPLE, MUTUAL)
//! asks for it: the files the socket's SDS secrets name are read here, as pilot-agent's SDS
//! server reads them for Envoy (`file-root:PATH`, `file-root:system`,
//! `file-cert:CHAIN~KEY`), and become one rustls client config per origination and ALPN
//! offer, shared by every connection. A config is built again when one of its files changes
//! (pilot-agent watches them and pushes the new secret), so a rotated client certificate
//! or bundle applies to the next connection. A file that cannot be read fails the connection,
//! as Envoy's connect fails while its secret is missing; the key's bytes are never logged.

mod verify;

use super::transport::{ClientFiles, OriginTls, Roots};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

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

/// A file's modification time and length (`None`: it could not be looked at).
type Stamp = Option<(SystemTime, u64)>;

impl Origins {
    /// The config for `tls` offering `alpn`: cached while its files stay as they were.
    pub fn client_config(
        &self,
        tls: &Arc<OriginTls>,
        alpn: &[&[u8]],
    ) -> Result<Arc<ClientConfig>, OriginError> {
        let roots = match &tls.roots {
            None => None,
            Some(Roots::File(path)) => Some(path.clone()),
            Some(Roots::System) => Some(system_roots().ok_or(OriginError::NoSystemRoots)?),
        };
        let files: Vec<&Path> = roots
            .iter()
            .map(PathBuf::as_path)
            .chain(
                tls.client_certificate
                    .iter()
                    .flat_map(|c| [c.chain.as_path(), c.key.as_path()]),
            )
            .collect();
        let stamps: Vec<Stamp> = files.iter().map(|p| stamp(p)).collect();
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
        let config = Arc::new(build(tls, roots.as_deref(), alpn)?);
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

fn stamp(path: &Path) -> Stamp {
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
fn load_roots(path: &Path) -> Result<RootCertStore, OriginError> {
    let pem = read(path)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(path, format!("not PEM certificates: {e}")))?;
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(certs);
    if roots.is_empty() {
        return Err(invalid(path, "holds no usable root certificate"));
    }
    Ok(roots)
}

/// The client certificate: the chain, and the key that must match it. Errors name the file
/// and what is wrong, never the key's contents.
fn load_client(files: &ClientFiles) -> Result<Arc<CertifiedKey>, OriginError> {
    let pem = read(&files.chain)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(&files.chain, format!("not PEM certificates: {e}")))?;
    if chain.is_empty() {
        return Err(invalid(&files.chain, "holds no certificate"));
    }
    let key_pem = read(&files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|_| invalid(&files.key, "not a PEM private key"))?;
    let signing = crate::tls::provider()
        .key_provider
        .load_private_key(key)
        .map_err(|_| invalid(&files.key, "unusable private key"))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| invalid(&files.key, format!("does not match the certificate: {e}")))?;
    Ok(Arc::new(certified))
}

fn build(
    tls: &OriginTls,
    roots: Option<&Path>,
    alpn: &[&[u8]],
) -> Result<ClientConfig, OriginError> {
    let provider = crate::tls::provider();
    let roots = roots.map(load_roots).transpose()?.map(Arc::new);
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
    let mut config = match &tls.client_certificate {
        Some(files) => {
            builder.with_client_cert_resolver(Arc::new(crate::tls::Fixed(load_client(files)?)))
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

#[cfg(test)]
mod tests;
