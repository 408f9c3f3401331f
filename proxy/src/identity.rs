//! The workload's identity: its certificate, key and trust roots, read from files in Istio's
//! layout (`cert-chain.pem`, `key.pem`, `root-cert.pem` in one directory), and its SPIFFE ID,
//! taken from the certificate's URI SAN.
//!
//! The files' directories are watched ([`crate::file_watch::DirWatch`]: a file renamed into
//! place, a Secret's or CSI volume's `..data` symlink swap), and polled every
//! `tls.watch_interval` only where no watch can be set. When their content changes, the new
//! set is loaded whole and swapped in ([`Store`]), so new handshakes present the new
//! certificate while open connections keep the one they were made with. A half-written
//! rotation (a certificate whose key has not arrived yet) fails to load and is retried when the
//! files change again; the running identity stays meanwhile.

use crate::file_watch::DirWatch;
use arc_swap::ArcSwapOption;
use remora_config::TlsConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// How long after a change the files are read: the pause lets a rotation's three files land.
const SETTLE: Duration = Duration::from_millis(100);
/// How often the expiry gauge is brought up to date between changes.
const EXPIRY_REFRESH: Duration = Duration::from_secs(1);

/// A SPIFFE ID: `spiffe://<trust-domain>/<path>`; Istio's paths are `ns/<ns>/sa/<sa>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SpiffeId(String);

impl SpiffeId {
    /// Parse a URI SAN; `None` if it is not a SPIFFE ID.
    pub fn parse(uri: &str) -> Option<SpiffeId> {
        let rest = uri.strip_prefix("spiffe://")?;
        let (domain, _) = rest.split_once('/').unwrap_or((rest, ""));
        (!domain.is_empty()).then(|| SpiffeId(uri.to_string()))
    }

    /// The whole ID, as Istio's `principal`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The trust domain (`cluster.local`).
    pub fn trust_domain(&self) -> &str {
        let rest = &self.0["spiffe://".len()..];
        rest.split_once('/').map_or(rest, |(d, _)| d)
    }

    /// The namespace of an Istio ID (`spiffe://td/ns/NS/sa/SA`).
    pub fn namespace(&self) -> Option<&str> {
        self.segment("ns")
    }

    /// The service account of an Istio ID.
    pub fn service_account(&self) -> Option<&str> {
        self.segment("sa")
    }

    fn segment(&self, key: &str) -> Option<&str> {
        let rest = &self.0["spiffe://".len()..];
        let path = rest.split_once('/')?.1;
        let mut parts = path.split('/');
        while let Some(k) = parts.next() {
            let v = parts.next()?;
            if k == key {
                return Some(v);
            }
        }
        None
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the admin API and metrics show of one certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSummary {
    /// Lower-case hex, as Envoy prints it.
    pub serial: String,
    pub uri_sans: Vec<String>,
    pub dns_sans: Vec<String>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl CertSummary {
    /// Parse the parts of a DER certificate that are shown.
    pub fn parse(der: &[u8]) -> Result<CertSummary, String> {
        let (_, cert) = X509Certificate::from_der(der).map_err(|e| e.to_string())?;
        let (mut uri_sans, mut dns_sans) = (Vec::new(), Vec::new());
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::URI(u) => uri_sans.push(u.to_string()),
                    GeneralName::DNSName(d) => dns_sans.push(d.to_string()),
                    _ => {}
                }
            }
        }
        let time = |t: i64| {
            u64::try_from(t).map_or(SystemTime::UNIX_EPOCH, |s| {
                SystemTime::UNIX_EPOCH + Duration::from_secs(s)
            })
        };
        let validity = cert.validity();
        Ok(CertSummary {
            serial: cert
                .raw_serial()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            uri_sans,
            dns_sans,
            not_before: time(validity.not_before.timestamp()),
            not_after: time(validity.not_after.timestamp()),
        })
    }

    /// The first URI SAN that is a SPIFFE ID.
    pub fn spiffe_id(&self) -> Option<SpiffeId> {
        self.uri_sans.iter().find_map(|u| SpiffeId::parse(u))
    }
}

/// Why an identity could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    // The cause is in the message and not a `source`: printed as a chain (`{:#}`), it would
    // say the same thing twice.
    #[error("{path}: {cause}")]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// The workload's certificate material, loaded and checked.
#[derive(Debug)]
pub struct Identity {
    pub spiffe_id: SpiffeId,
    /// The certificate, its key and intermediates, as handshakes present them.
    pub certified: Arc<CertifiedKey>,
    pub roots: Arc<RootCertStore>,
    /// The roots as received, for `/config_dump`'s `ROOTCA` secret (the store keeps them
    /// parsed only).
    pub root_certs: Vec<CertificateDer<'static>>,
    /// The leaf and then the intermediates.
    pub chain: Vec<CertSummary>,
    pub ca: Vec<CertSummary>,
    pub chain_path: PathBuf,
    pub root_path: PathBuf,
}

/// The three files' contents, compared to tell a rotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files {
    chain: Vec<u8>,
    key: Vec<u8>,
    roots: Vec<u8>,
}

impl Files {
    /// The contents of the certificate chain, key and roots files.
    pub fn new(chain: Vec<u8>, key: Vec<u8>, roots: Vec<u8>) -> Files {
        Files { chain, key, roots }
    }
}

/// Where the three files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub chain: PathBuf,
    pub key: PathBuf,
    pub roots: PathBuf,
}

impl Paths {
    /// From the `tls:` section; `None` when no certificate directory is set.
    pub fn from_config(tls: &TlsConfig) -> Option<Paths> {
        let dir = tls.cert_dir.as_deref()?;
        Some(Paths {
            chain: dir.join(&tls.cert_chain_file),
            key: dir.join(&tls.key_file),
            roots: dir.join(&tls.root_cert_file),
        })
    }

    /// The directories whose entries change when one of the files does (each file's own and,
    /// for a symlink, where it points), each once.
    pub fn dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for file in [&self.chain, &self.key, &self.roots] {
            for dir in DirWatch::dirs_of_file(file) {
                if !dirs.contains(&dir) {
                    dirs.push(dir);
                }
            }
        }
        dirs
    }

    /// Read the three files.
    pub fn read(&self) -> Result<Files, IdentityError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|cause| IdentityError::Read {
                path: path.to_path_buf(),
                cause,
            })
        };
        Ok(Files {
            chain: read(&self.chain)?,
            key: read(&self.key)?,
            roots: read(&self.roots)?,
        })
    }
}

impl Identity {
    /// Build an identity from the files' contents: the key must match the certificate, the
    /// certificate must carry a SPIFFE ID, and there must be at least one root.
    pub fn load(paths: &Paths, files: &Files) -> Result<Identity, IdentityError> {
        let invalid = |path: &Path, message: String| IdentityError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&files.chain)
            .collect::<Result<_, _>>()
            .map_err(|e| invalid(&paths.chain, format!("not PEM certificates: {e}")))?;
        if chain.is_empty() {
            return Err(invalid(&paths.chain, "holds no certificate".into()));
        }
        let summaries = chain
            .iter()
            .map(|c| CertSummary::parse(c))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(&paths.chain, e))?;
        let spiffe_id = summaries
            .first()
            .and_then(CertSummary::spiffe_id)
            .ok_or_else(|| {
                invalid(
                    &paths.chain,
                    "the certificate has no SPIFFE ID (a spiffe:// URI SAN)".into(),
                )
            })?;
        let key = PrivateKeyDer::from_pem_slice(&files.key)
            .map_err(|e| invalid(&paths.key, format!("not a PEM private key: {e}")))?;
        let provider = crate::tls::provider();
        let signing = provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| invalid(&paths.key, format!("unusable private key: {e}")))?;
        let certified = CertifiedKey::new(chain, signing);
        // A rotation writes the files one by one; a certificate next to the old key is a
        // moment in the middle of one, not an identity.
        certified
            .keys_match()
            .map_err(|e| invalid(&paths.key, format!("does not match the certificate: {e}")))?;
        let mut roots = RootCertStore::empty();
        let mut root_certs = Vec::new();
        let mut ca = Vec::new();
        for cert in CertificateDer::pem_slice_iter(&files.roots) {
            let cert =
                cert.map_err(|e| invalid(&paths.roots, format!("not PEM certificates: {e}")))?;
            ca.push(CertSummary::parse(&cert).map_err(|e| invalid(&paths.roots, e))?);
            root_certs.push(cert.clone());
            roots
                .add(cert)
                .map_err(|e| invalid(&paths.roots, format!("not a usable root: {e}")))?;
        }
        if roots.is_empty() {
            return Err(invalid(&paths.roots, "holds no certificate".into()));
        }
        Ok(Identity {
            spiffe_id,
            certified: Arc::new(certified),
            roots: Arc::new(roots),
            root_certs,
            chain: summaries,
            ca,
            chain_path: paths.chain.clone(),
            root_path: paths.roots.clone(),
        })
    }

    /// Build an identity from PEM held in memory (a certificate from istiod's CA), with the
    /// checks of [`Identity::load`]. Errors and `/certs` name the parts `<inline>`, as Envoy
    /// names a secret that came from no file.
    pub fn from_memory(chain: &[u8], key: &[u8], roots: &[u8]) -> Result<Identity, IdentityError> {
        let inline = PathBuf::from(INLINE);
        let paths = Paths {
            chain: inline.clone(),
            key: inline.clone(),
            roots: inline,
        };
        Identity::load(&paths, &Files::new(chain.into(), key.into(), roots.into()))
    }

    /// When the workload certificate was issued.
    pub fn not_before(&self) -> SystemTime {
        self.chain
            .first()
            .map_or(SystemTime::UNIX_EPOCH, |c| c.not_before)
    }

    /// When the workload certificate expires.
    pub fn not_after(&self) -> SystemTime {
        self.chain
            .first()
            .map_or(SystemTime::UNIX_EPOCH, |c| c.not_after)
    }
}

/// Envoy's name for the path of a certificate that came from no file.
pub const INLINE: &str = "<inline>";

/// The current identity, swapped whole on rotation; empty until one has loaded.
#[derive(Debug, Default)]
pub struct Store {
    current: ArcSwapOption<Identity>,
}

impl Store {
    /// Whether an identity is loaded.
    pub fn is_loaded(&self) -> bool {
        self.current.load().is_some()
    }

    /// The identity new handshakes use.
    pub fn current(&self) -> Option<Arc<Identity>> {
        self.current.load_full()
    }

    /// Replace the identity.
    pub fn set(&self, identity: Arc<Identity>) {
        self.current.store(Some(identity));
    }
}

/// Load the identity at start (a failure is a start-up error), then keep it current.
#[derive(Debug)]
pub struct Watcher {
    pub paths: Paths,
    pub store: Arc<Store>,
    pub interval: Duration,
    last: Files,
    /// A changed set that did not load, so it is reported once, not at every look.
    last_failed: Option<Files>,
    /// Set before the first read, so that no change after it is missed.
    watch: DirWatch,
}

impl Watcher {
    /// Read and load the files now.
    pub fn start(
        paths: Paths,
        store: Arc<Store>,
        interval: Duration,
    ) -> Result<Watcher, IdentityError> {
        let watch = DirWatch::new(&paths.dirs(), "workload certificate files");
        let files = paths.read()?;
        let identity = Identity::load(&paths, &files)?;
        tracing::info!(
            spiffe_id = %identity.spiffe_id,
            expires = %humantime::format_rfc3339_seconds(identity.not_after()),
            "workload certificate loaded"
        );
        warn_if_expired(&identity);
        store.set(Arc::new(identity));
        Ok(Watcher {
            paths,
            store,
            interval,
            last: files,
            last_failed: None,
            watch,
        })
    }

    /// Whether the files' directories are watched (else they are polled every `interval`).
    pub fn is_watching(&self) -> bool {
        self.watch.is_watching()
    }

    /// Look at the files whenever they may have changed, forever; a changed set that loads
    /// replaces the identity.
    pub async fn watch(mut self, metrics: Arc<crate::metrics::Metrics>) {
        let mut refresh = tokio::time::interval(EXPIRY_REFRESH);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.watch.changed(self.interval) => {
                    // A rotation writes three files: look once they have all landed, not at
                    // the first, which would be a certificate beside the old key.
                    tokio::time::sleep(SETTLE).await;
                    self.check(&metrics.tls);
                }
                // Seconds until expiry move with the clock, not only with rotations.
                _ = refresh.tick() => {
                    if let Some(current) = self.store.current() {
                        metrics.tls.identity_loaded(&current);
                    }
                }
            }
        }
    }

    /// Look at the files once.
    pub fn check(&mut self, metrics: &crate::metrics::TlsMetrics) {
        if let Some(current) = self.store.current() {
            metrics.identity_loaded(&current);
        }
        let files = match self.paths.read() {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!(error = %e, "certificate files unreadable; keeping the current ones");
                return;
            }
        };
        if files == self.last || self.last_failed.as_ref() == Some(&files) {
            return;
        }
        match Identity::load(&self.paths, &files) {
            Ok(identity) => {
                tracing::info!(
                    spiffe_id = %identity.spiffe_id,
                    expires = %humantime::format_rfc3339_seconds(identity.not_after()),
                    "rotated workload certificate loaded"
                );
                warn_if_expired(&identity);
                metrics.identity_loaded(&identity);
                metrics.rotations.inc();
                self.store.set(Arc::new(identity));
                self.last = files;
                self.last_failed = None;
            }
            Err(e) => {
                // A rotation caught half-written loads at a later look, when the files change
                // again.
                tracing::warn!(error = %e, "changed certificate files not loaded; keeping the current ones");
                metrics.load_failures.inc();
                self.last_failed = Some(files);
            }
        }
    }
}

/// Peers refuse an expired certificate: say so where an operator looks first. It is still
/// served, as Envoy serves what its agent hands it, since a newer one may be on its way.
fn warn_if_expired(identity: &Identity) {
    if identity.not_after() <= std::time::SystemTime::now() {
        tracing::warn!(
            spiffe_id = %identity.spiffe_id,
            expired = %humantime::format_rfc3339_seconds(identity.not_after()),
            "the workload certificate has expired: mesh peers will refuse it"
        );
    }
}

#[cfg(test)]
mod tests;
