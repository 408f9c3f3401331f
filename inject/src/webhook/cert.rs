//! The webhook's serving certificate, kept in step with its files. Certificates are rotated by
//! rewriting the mounted Secret (cert-manager renews before expiry); the webhook must present
//! the new one without a restart, or the API server's calls fail once the old one expires.
//!
//! Each handshake takes the current certificate from an [`ArcSwap`] (a rustls
//! [`ResolvesServerCert`]). The files' directories are watched as the proxy watches its
//! certificate directory ([`DirWatch`]): Kubernetes updates a mounted Secret by renaming a
//! fresh `..data` symlink over the old one, an event of the mount's directory (a watch on the
//! file itself would miss it), so the swap is seen at once. Where no watch can be set the
//! files are polled. Either way the files' bytes are compared before anything is parsed. A
//! new pair is swapped in only once both files parse and the key matches the certificate; a
//! half-written or mismatched pair is logged and the old certificate stays.

use arc_swap::ArcSwap;
use remora_config::file_watch::DirWatch;
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

    /// Reloads the pair whenever its files' directories change (polling every `poll` where
    /// they cannot be watched), until the process ends. The watch is set when this is called,
    /// not when the future is first polled, so no rotation after the call is missed.
    pub fn watch(
        self: Arc<Self>,
        poll: Duration,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let watch = DirWatch::new(&self.watched_dirs(), "webhook certificate");
        async move { self.reload_on_change(&watch, poll).await }
    }

    async fn reload_on_change(&self, watch: &DirWatch, poll: Duration) {
        loop {
            watch.changed(poll).await;
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

    /// The directories whose changes may change the pair: each file's own and, for a
    /// Secret's symlinked files, where they point.
    fn watched_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = DirWatch::dirs_of_file(&self.cert_path);
        for dir in DirWatch::dirs_of_file(&self.key_path) {
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        dirs
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

#[cfg(test)]
mod tests {
    use super::*;
    use remora_config::file_watch::publish_atomically;

    fn pair() -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
        (c.cert.pem(), c.key_pair.serialize_pem())
    }

    fn presented(cert: &RotatingCert) -> Vec<u8> {
        cert.current.load().cert[0].to_vec()
    }

    /// A Secret volume's `..data` swap is picked up by the watch: the poll interval is an hour,
    /// so only the watch can have reloaded the pair within the five seconds allowed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_secrets_data_swap_is_seen_by_the_watch_not_the_poll() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (first, second) = (pair(), pair());
        publish_atomically(
            dir.path(),
            1,
            &[("tls.crt", &first.0), ("tls.key", &first.1)],
        );
        let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cert = Arc::new(RotatingCert::load(&cert_path, &key_path, provider).expect("load"));
        let before = presented(&cert);
        let watcher = tokio::spawn(Arc::clone(&cert).watch(Duration::from_secs(3600)));

        publish_atomically(
            dir.path(),
            2,
            &[("tls.crt", &second.0), ("tls.key", &second.1)],
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while presented(&cert) == before {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the swapped certificate was not picked up within 5 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let expected = CertificateDer::from_pem_slice(second.0.as_bytes()).expect("pem");
        assert_eq!(presented(&cert), expected.to_vec());
        watcher.abort();
    }
}
