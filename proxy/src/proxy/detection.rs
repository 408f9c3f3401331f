//! Protocol detection for one connection: the client's first bytes read while the upstream
//! connection is already being opened, and what that leaves for the rest of the connection.

use super::{Hop, Mode, Proxy};
use crate::connect::{ConnectError, Upstream};
use crate::detect::{self, HttpVersion, Verdict};
use bytes::BytesMut;
use remora_config::Config;
use std::time::Duration;

impl Proxy {
    /// Read the client's first bytes while the upstream connection is opened; with
    /// `watch_server` (auto mode) a server that speaks first decides at once. Declared or known
    /// HTTP destinations dial nothing here: the pool serves their requests.
    ///
    /// An `early` upstream (one opened before a TLS handshake) is watched as a fresh dial is.
    pub(super) async fn detect<S: tokio::io::AsyncRead + Unpin>(
        &self,
        downstream: &mut S,
        hop: Hop,
        watch_server: bool,
        wait: detect::Wait,
        early: Option<Result<Upstream, ConnectError>>,
    ) -> Detected {
        let started = std::time::Instant::now();
        let (verdict, prefix, upstream) = async {
            let connecting = async {
                match early {
                    Some(done) => done,
                    None if watch_server => self.dial(&hop).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(connecting);
            let detected =
                detect::detect(downstream, connecting.as_mut(), wait, watch_server).await;
            let upstream = match detected.upstream {
                Some(done) => Some(done),
                None if watch_server => Some(connecting.await),
                None => None,
            };
            (detected.verdict, detected.prefix, upstream)
        }
        .await;
        tracing::debug!(peer = %hop.peer, destination = %hop.destination, ?verdict, watch_server, "detected");
        self.metrics
            .detection_finished(verdict.metric_label(), started.elapsed());
        match verdict {
            Verdict::Http(version) => Detected::Http(version, prefix, upstream),
            Verdict::ClientFailed => Detected::ClientFailed,
            Verdict::Tls => Detected::Tls(prefix, upstream),
            Verdict::Opaque
            | Verdict::ServerFirst
            | Verdict::Timeout
            | Verdict::ClientClosed
            | Verdict::UpstreamFailed => Detected::Tcp(prefix, upstream),
        }
    }
}

/// How long detection waits for the client: the detection timeout when the server may speak
/// first, otherwise (declared HTTP) as long as a request's headers may take.
pub(super) fn detect_wait(config: &Config, watch_server: bool) -> detect::Wait {
    detect::Wait {
        client: if watch_server {
            config.detection.timeout
        } else {
            config.http.header_read_timeout
        },
        after_connect_failure: config.detection.after_connect_failure,
        after_server_spoke: Duration::ZERO,
    }
}

/// What detection leaves for the rest of the connection.
pub(super) enum Detected {
    /// HTTP: the version, the bytes read, and the upstream connection if one was opened
    /// meanwhile (its failure is the first request's first attempt).
    Http(
        HttpVersion,
        BytesMut,
        Option<Result<Upstream, ConnectError>>,
    ),
    /// Opaque bytes: the bytes read, and the upstream connection if one was opened.
    Tcp(BytesMut, Option<Result<Upstream, ConnectError>>),
    /// A TLS ClientHello (in the bytes read), and the upstream connection if one was opened.
    Tls(BytesMut, Option<Result<Upstream, ConnectError>>),
    /// The client reset the connection.
    ClientFailed,
}

impl Detected {
    /// On a port declared HTTP, what the client sent is HTTP whatever detection made of it: a
    /// request line detection does not know (an extension method, a malformed line) goes to
    /// the HTTP parser, which forwards it or answers 400, instead of through as opaque bytes.
    pub(super) fn declared(self, mode: Mode) -> Detected {
        match self {
            Detected::Tcp(prefix, upstream) if mode == Mode::Http && !prefix.is_empty() => {
                Detected::Http(HttpVersion::Http1, prefix, upstream)
            }
            other => other,
        }
    }

    /// Append `rest`: bytes that were due to detection after what it read (from a stream with
    /// bytes put back in front) but that it did not read.
    pub(super) fn after(self, rest: BytesMut) -> Detected {
        if rest.is_empty() {
            return self;
        }
        let join = |mut prefix: BytesMut| {
            prefix.extend_from_slice(&rest);
            prefix
        };
        match self {
            Detected::Http(v, prefix, early) => Detected::Http(v, join(prefix), early),
            Detected::Tcp(prefix, up) => Detected::Tcp(join(prefix), up),
            Detected::Tls(prefix, up) => Detected::Tls(join(prefix), up),
            Detected::ClientFailed => Detected::ClientFailed,
        }
    }
}
