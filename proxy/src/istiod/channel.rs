//! The gRPC channel to istiod: HTTP/2 over TLS verified against the mesh root file, the server
//! name taken from the address' host (`istiod.istio-system.svc`), the host resolved by the
//! system resolver, the connection dialled and counted by [`super::connection`]. The CA and
//! the ADS client share one [`IstiodChannel`], and every call
//! carries [`CallCredentials`]: `authorization: Bearer <token>` (the token re-read for every
//! call, as kubelet rotates it) and Istio's `clusterid`.
//!
//! Nothing is written anywhere: the secrets directories are read-only mounts.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

/// Bound on one TCP connect and TLS handshake to istiod.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 pings on an idle channel, so a dead istiod is noticed without a call failing first.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// Bound on a ping's answer.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Kubernetes' projected tokens are about 1 KiB; a larger file is not a token.
const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// Why the channel or a call's credentials cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("istiod's root certificate {path}: {cause}")]
    Root { path: PathBuf, cause: String },
    #[error("istiod token {path}: {cause}")]
    Token { path: PathBuf, cause: String },
    #[error("istiod address {address:?}: {cause}")]
    Address { address: String, cause: String },
    #[error("cluster id {cluster_id:?} cannot be a `clusterid` header")]
    ClusterId { cluster_id: String },
}

/// What every call to istiod carries. Cheap to clone; as a tonic [`tonic::service::Interceptor`]
/// it adds the headers to each call of a generated client (`with_interceptor`).
#[derive(Debug, Clone)]
pub struct CallCredentials {
    token_file: Arc<Path>,
    cluster_id: AsciiMetadataValue,
}

impl CallCredentials {
    /// Credentials from the token file and the cluster ID; the file is read per call.
    pub fn new(token_file: &Path, cluster_id: &str) -> Result<CallCredentials, ChannelError> {
        let cluster_id =
            cluster_id
                .parse::<AsciiMetadataValue>()
                .map_err(|e| ChannelError::Address {
                    address: cluster_id.into(),
                    cause: format!("cluster id is not a header value: {e}"),
                })?;
        Ok(CallCredentials {
            token_file: Arc::from(token_file),
            cluster_id,
        })
    }

    /// The token file's path, for messages.
    pub fn token_file(&self) -> &Path {
        &self.token_file
    }

    /// Read the token now; an error names the file. A blocking read, on purpose: the file is
    /// about 1 KiB on a tmpfs mount, read once per call, cheaper than a hop to a blocking thread.
    pub fn bearer(&self) -> Result<AsciiMetadataValue, ChannelError> {
        let error = |cause: String| ChannelError::Token {
            path: self.token_file.to_path_buf(),
            cause,
        };
        let file = std::fs::File::open(&self.token_file).map_err(|e| error(e.to_string()))?;
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut std::io::Read::take(file, MAX_TOKEN_BYTES + 1),
            &mut text,
        )
        .map_err(|e| error(e.to_string()))?;
        if text.len() as u64 > MAX_TOKEN_BYTES {
            return Err(error(format!("larger than {MAX_TOKEN_BYTES} bytes")));
        }
        let token = text.trim();
        if token.is_empty() {
            return Err(error("is empty".into()));
        }
        format!("Bearer {token}")
            .parse::<AsciiMetadataValue>()
            .map_err(|_| error("holds characters a header cannot carry".into()))
    }

    /// The headers of one call: `authorization` and `clusterid`.
    pub fn metadata(&self) -> Result<MetadataMap, ChannelError> {
        let mut map = MetadataMap::new();
        map.insert("authorization", self.bearer()?);
        map.insert("clusterid", self.cluster_id.clone());
        Ok(map)
    }

    /// Add the headers to `request`.
    pub fn apply<T>(&self, request: &mut Request<T>) -> Result<(), ChannelError> {
        let map = self.metadata()?;
        for (k, v) in [
            ("authorization", map.get("authorization")),
            ("clusterid", map.get("clusterid")),
        ] {
            if let Some(v) = v {
                request.metadata_mut().insert(k, v.clone());
            }
        }
        Ok(())
    }
}

impl tonic::service::Interceptor for CallCredentials {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        // A token that cannot be read fails the call here, naming the file, rather than
        // reaching istiod without one and coming back as a bare UNAUTHENTICATED.
        self.apply(&mut request)
            .map_err(|e| Status::unauthenticated(e.to_string()))?;
        Ok(request)
    }
}

/// One channel to istiod (or the CA), shared by every call to it.
#[derive(Debug, Clone)]
pub struct IstiodChannel {
    pub channel: Channel,
    pub credentials: CallCredentials,
    /// `host:port`, for messages.
    pub address: String,
    /// What was counted of its connections (Envoy's `xds-grpc` cluster's, for the xDS one).
    pub connection: Arc<super::connection::ConnectionStats>,
}

impl IstiodChannel {
    /// A channel to `address` (`host:port`), TLS verified against the PEM roots in
    /// `root_file` with the host as server name. Nothing is dialled until the first call, so a
    /// start with istiod down is not a failed start.
    pub fn new(
        address: &str,
        root_file: &Path,
        credentials: CallCredentials,
    ) -> Result<IstiodChannel, ChannelError> {
        let roots = std::fs::read(root_file).map_err(|e| ChannelError::Root {
            path: root_file.to_path_buf(),
            cause: e.to_string(),
        })?;
        let roots = root_store(&roots).map_err(|cause| ChannelError::Root {
            path: root_file.to_path_buf(),
            cause,
        })?;
        let bad_address = |cause: String| ChannelError::Address {
            address: address.into(),
            cause,
        };
        let host = server_name(address).ok_or_else(|| bad_address("not host:port".into()))?;
        let host = rustls::pki_types::ServerName::try_from(host)
            .map_err(|e| bad_address(format!("not a server name: {e}")))?;
        let dialer = super::connection::Dialer::new(address, host, roots, CONNECT_TIMEOUT)
            .map_err(|e| bad_address(format!("TLS: {e}")))?;
        // The dialer makes the TLS connection, so tonic is given the plain scheme to dial by
        // and the real one for its requests.
        let origin = format!("https://{address}")
            .parse::<http::Uri>()
            .map_err(|e| bad_address(e.to_string()))?;
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| bad_address(e.to_string()))?
            .origin(origin)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        Ok(IstiodChannel {
            connection: dialer.stats(),
            channel: endpoint.connect_with_connector_lazy(dialer),
            credentials,
            address: address.into(),
        })
    }

    /// The channel with the credentials added to every call, for a generated client
    /// (`AggregatedDiscoveryServiceClient::new(channel.authenticated())`).
    pub fn authenticated(&self) -> InterceptedService<Channel, CallCredentials> {
        InterceptedService::new(self.channel.clone(), self.credentials.clone())
    }
}

/// The channels a sidecar needs: xDS, and the CA's, which is the same channel (one HTTP/2
/// connection) when the CA is istiod, as it is unless `CA_ADDR` or `CA_ROOT_CA` say otherwise.
#[derive(Debug, Clone)]
pub struct IstiodChannels {
    pub xds: IstiodChannel,
    pub ca: IstiodChannel,
}

impl IstiodChannels {
    /// Both channels for `settings`; reads the root files now.
    pub fn new(settings: &super::AgentSettings) -> Result<IstiodChannels, ChannelError> {
        let credentials = CallCredentials::new(&settings.token_file, &settings.cluster_id)?;
        let xds = IstiodChannel::new(
            &settings.discovery_address,
            &settings.xds_root_cert_file,
            credentials.clone(),
        )?;
        let shared = settings.ca_address == settings.discovery_address
            && settings.ca_root_cert_file == settings.xds_root_cert_file;
        let ca = match shared {
            true => xds.clone(),
            false => IstiodChannel::new(
                &settings.ca_address,
                &settings.ca_root_cert_file,
                credentials,
            )?,
        };
        Ok(IstiodChannels { xds, ca })
    }
}

/// The host of `host:port` (brackets of an IPv6 literal removed).
pub fn server_name(address: &str) -> Option<String> {
    let (host, port) = address.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| host.to_string())
}

/// The PEM certificates of `pem` as trust anchors; at least one, so a wrong file says so at
/// start rather than as a failed handshake later.
fn root_store(pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("not PEM certificates: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("not a usable root certificate: {e}"))?;
    }
    match roots.is_empty() {
        true => Err("holds no certificate".into()),
        false => Ok(roots),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_name_is_the_host() {
        assert_eq!(
            server_name("istiod.istio-system.svc:15012").as_deref(),
            Some("istiod.istio-system.svc")
        );
        assert_eq!(server_name("[fd00::1]:15012").as_deref(), Some("fd00::1"));
        assert_eq!(server_name("istiod"), None);
        assert_eq!(server_name(":15012"), None);
    }

    #[test]
    fn every_call_reads_the_token_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("istio-token");
        let creds = CallCredentials::new(&path, "Kubernetes").unwrap();
        let e = creds.metadata().unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        std::fs::write(&path, "first\n").unwrap();
        let m = creds.metadata().unwrap();
        assert_eq!(m.get("authorization").unwrap(), "Bearer first");
        assert_eq!(m.get("clusterid").unwrap(), "Kubernetes");
        std::fs::write(&path, "second").unwrap();
        let mut interceptor = creds.clone();
        let r = tonic::service::Interceptor::call(&mut interceptor, Request::new(())).unwrap();
        assert_eq!(r.metadata().get("authorization").unwrap(), "Bearer second");
        std::fs::write(&path, "").unwrap();
        let status =
            tonic::service::Interceptor::call(&mut interceptor, Request::new(())).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains("istio-token"));
    }

    #[test]
    fn a_missing_or_empty_root_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("root-cert.pem");
        let creds = CallCredentials::new(&dir.path().join("t"), "Kubernetes").unwrap();
        let e = IstiodChannel::new("istiod:15012", &path, creds.clone())
            .unwrap_err()
            .to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        std::fs::write(&path, "nothing here").unwrap();
        let e = IstiodChannel::new("istiod:15012", &path, creds)
            .unwrap_err()
            .to_string();
        assert!(e.contains("holds no certificate"), "{e}");
    }
}
