//! Istio's metadata exchange: the header each side of an `istio-peer-exchange` connection sends
//! first, saying which workload it is.
//!
//! When a mesh client offers the ALPN value `istio-peer-exchange` and the server selects it,
//! both sides write one header ([`wire`]: a magic number, a length, and a protobuf `Any`
//! wrapping a `Struct` of node metadata) before any application byte, read the peer's, and the
//! stream carries the application's bytes from there on. Istio's sidecars do this in their
//! `metadata_exchange` network filter (only for TCP; HTTP carries the same metadata in
//! headers). What a side learns names its peer in Istio's metrics: `source_workload`,
//! `source_app`… inbound, `destination_*` outbound.
//!
//! Writing first and then reading cannot deadlock with an Envoy peer: Envoy writes its own
//! header as soon as it sees the first byte from either side, and ours is that byte. The read
//! is bounded in time (`mesh.metadata_exchange_timeout`) and size ([`MAX_PAYLOAD`]). A peer
//! whose first bytes lack the magic is not speaking the protocol: as Envoy does, its bytes are
//! kept as the start of the stream and the peer stays unknown.

pub mod http;
pub mod wire;

use crate::workload::{Workload, UNKNOWN};
use bytes::{Bytes, BytesMut};
use std::io;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest header payload accepted. Istio's node metadata for the exchange is a handful of
/// short strings (a few hundred bytes); a peer announcing more than this is broken.
pub const MAX_PAYLOAD: usize = 16 * 1024;

/// Longest value kept from a peer; a longer one is dropped (the label says `unknown`).
/// Kubernetes names are at most 253 characters, label values 63.
pub const MAX_VALUE_LEN: usize = 253;

/// A workload as metadata exchange describes it; an empty field was not said.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct WorkloadMetadata {
    /// The pod (`NAME`).
    pub instance: String,
    pub namespace: String,
    /// `WORKLOAD_NAME`: the Deployment (or other owner) of the pod.
    pub workload: String,
    /// `CLUSTER_ID`.
    pub cluster: String,
    /// The `service.istio.io/canonical-name` and `-revision` labels.
    pub canonical_service: String,
    pub canonical_revision: String,
    /// The `app` and `version` labels (or their `app.kubernetes.io/` forms).
    pub app: String,
    pub version: String,
}

impl WorkloadMetadata {
    /// Ours, from the pod's identity; what is unknown is left out, as Istio's agent leaves out
    /// what the pod does not say.
    pub fn of(own: &Workload) -> Self {
        let known = |v: &str| match v {
            UNKNOWN => String::new(),
            v => v.to_string(),
        };
        WorkloadMetadata {
            instance: known(&own.pod),
            namespace: known(&own.namespace),
            workload: known(&own.name),
            cluster: known(&own.cluster),
            canonical_service: known(&own.canonical_service),
            canonical_revision: known(&own.canonical_revision),
            app: known(&own.app),
            version: known(&own.version),
        }
    }

    /// Drop values too long to be Kubernetes names, so one peer cannot make label values of
    /// any size.
    fn bounded(mut self) -> Self {
        for v in [
            &mut self.instance,
            &mut self.namespace,
            &mut self.workload,
            &mut self.cluster,
            &mut self.canonical_service,
            &mut self.canonical_revision,
            &mut self.app,
            &mut self.version,
        ] {
            if v.len() > MAX_VALUE_LEN {
                v.clear();
            }
        }
        self
    }
}

/// Our header, encoded once at start-up.
#[derive(Debug, Clone)]
pub struct LocalHeader(Bytes);

impl LocalHeader {
    /// The header describing `own`.
    pub fn new(own: &Workload) -> Self {
        LocalHeader(Bytes::from(wire::encode(&WorkloadMetadata::of(own))))
    }

    /// The bytes on the wire.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl Default for LocalHeader {
    fn default() -> Self {
        LocalHeader::new(&Workload::default())
    }
}

/// What one exchange learned.
#[derive(Debug, Default)]
pub struct Exchanged {
    /// Whether the peer sent a header.
    pub spoken: bool,
    /// The peer's metadata; `None` when it sent no header or a header without metadata.
    pub peer: Option<WorkloadMetadata>,
    /// Bytes read from the peer that are not a header: the start of its stream, to be passed
    /// on first. Empty unless the peer did not speak the protocol.
    pub unread: BytesMut,
}

/// Why an exchange failed; the connection cannot be used after it.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("no metadata-exchange header within {0:?}")]
    Timeout(Duration),
    #[error("metadata exchange: {0}")]
    Io(#[from] io::Error),
    #[error("a metadata-exchange header of {0} bytes is over the limit of {MAX_PAYLOAD}")]
    TooLarge(u32),
    #[error("the metadata-exchange header does not parse: {0}")]
    Invalid(#[from] wire::DecodeError),
}

impl Exchanged {
    /// The metric label: `ok` when the peer's metadata was learned.
    pub fn result(&self) -> &'static str {
        match (self.spoken, &self.peer) {
            (true, Some(_)) => "ok",
            (true, None) => "no_metadata",
            (false, _) => "not_spoken",
        }
    }
}

impl ExchangeError {
    /// The metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            ExchangeError::Timeout(_) => "timeout",
            ExchangeError::Io(_) => "error",
            ExchangeError::TooLarge(_) | ExchangeError::Invalid(_) => "invalid",
        }
    }
}

/// Write our header to `stream`, then read the peer's, all within `timeout`. Nothing past the
/// peer's header is read.
pub async fn exchange<S>(
    stream: &mut S,
    ours: &LocalHeader,
    timeout: Duration,
) -> Result<Exchanged, ExchangeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(timeout, exchange_unbounded(stream, ours)).await {
        Ok(result) => result,
        Err(_) => Err(ExchangeError::Timeout(timeout)),
    }
}

async fn exchange_unbounded<S>(
    stream: &mut S,
    ours: &LocalHeader,
) -> Result<Exchanged, ExchangeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(ours.as_bytes()).await?;
    stream.flush().await?;
    // Read exactly the preamble (never into the stream behind it), keeping what came if the
    // peer ends its side first.
    let mut preamble = [0u8; wire::PREAMBLE_LEN];
    let mut filled = 0;
    while filled < preamble.len() {
        match stream.read(&mut preamble[filled..]).await? {
            0 => break,
            n => filled += n,
        }
    }
    let len = match (filled == preamble.len()).then(|| wire::payload_len(preamble)) {
        Some(Some(len)) => len,
        // Not the protocol (or the peer closed its side): its bytes are stream data.
        _ => {
            return Ok(Exchanged {
                spoken: false,
                peer: None,
                unread: BytesMut::from(&preamble[..filled]),
            })
        }
    };
    let size = usize::try_from(len).unwrap_or(usize::MAX);
    if size > MAX_PAYLOAD {
        return Err(ExchangeError::TooLarge(len));
    }
    let mut payload = vec![0u8; size];
    stream.read_exact(&mut payload).await?;
    let peer = wire::decode(&payload)?.map(WorkloadMetadata::bounded);
    Ok(Exchanged {
        spoken: true,
        peer,
        unread: BytesMut::new(),
    })
}

#[cfg(test)]
mod tests;
