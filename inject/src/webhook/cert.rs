//! The webhook's serving certificate, kept in step with its files. Certificates are rotated by
//! rewriting the mounted Secret (cert-manager renews before expiry); the webhook must present
//! the new one without a restart, or the API server's calls fail once the old one expires.
//!
//! Each handshake takes the current certificate from an [`ArcSwap`] (a rustls
//! [`ResolvesServerCert`]). A poll compares the files' bytes, as `remora run`'s config reload
//! does: Kubernetes updates a mounted Secret by swapping a symlink, which file watches miss. A
//! new pair is swapped in only once both files parse and the key matches the certificate; a
//! half-written or mismatched pair is logged and the old certificate stays.

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Why a certificate pair could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("{}: cannot read", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}", path.display())]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{}: no certificate in the file", path.display())]
    NoCertificate { path: PathBuf },
    /// The key does not parse, or does not belong to the certificate.
    #[error("{} does not go with {}", key.display(), cert.display())]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
}

/// The certificate the webhook presents, reloaded from its files.
#[derive(Debug)]
pub struct RotatingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: ArcSwap<CertifiedKey>,
    /// The files' bytes last acted upon, valid or not, so a bad pair is reported once.
    last: Mutex<(Vec<u8>, Vec<u8>)>,
}

impl RotatingCert {
    /// Loads the pair; a missing or invalid one fails the start.
    pub fn load(
        cert: &Path,
        key: &Path,
        provider: Arc<CryptoProvider>,
    ) -> Result<RotatingCert, CertError> {
        let bytes = read_pair(cert, key)?;
        let certified = certified_key(&bytes, cert, key, &provider)?;
        Ok(RotatingCert {
            cert_path: cert.to_path_buf(),
            key_path: key.to_path_buf(),
            provider,
            current: ArcSwap::from_pointee(certified),
            last: Mutex::new(bytes),
        })
    }

    /// Reads the files again: `Ok(true)` when a new pair is now presented, `Ok(false)` when
    /// nothing changed, an error (and the old pair kept) when the new files are not a pair.
    pub fn reload(&self) -> Result<bool, CertError> {
        let bytes = read_pair(&self.cert_path, &self.key_path)?;
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if *last == bytes {
            return Ok(false);
        }
        *last = bytes.clone();
        drop(last);
        let certified = certified_key(&bytes, &self.cert_path, &self.key_path, &self.provider)?;
        self.current.store(Arc::new(certified));
        Ok(true)
    }

    /// Polls the files every `interval` until the process ends.
    pub async fn watch(self: Arc<Self>, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.reload() {
                Ok(true) => {
                    tracing::info!(cert = %self.cert_path.display(), "serving the rotated certificate")
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    error = %crate::webhook::cert::chain(&e),
                    "keeping the current certificate"
                ),
            }
        }
    }
}

impl ResolvesServerCert for RotatingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

fn read_pair(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), CertError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| CertError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    Ok((read(cert)?, read(key)?))
}

fn certified_key(
    (cert_pem, key_pem): &(Vec<u8>, Vec<u8>),
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, CertError> {
    let pem = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CertError::Pem { path, source }
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(pem(cert))?;
    if chain.is_empty() {
        return Err(CertError::NoCertificate { path: cert.into() });
    }
    let private = PrivateKeyDer::from_pem_slice(key_pem).map_err(pem(key))?;
    CertifiedKey::from_der(chain, private, provider).map_err(|source| CertError::Pair {
        cert: cert.into(),
        key: key.into(),
        source,
    })
}

/// An error with its causes, for one log line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
