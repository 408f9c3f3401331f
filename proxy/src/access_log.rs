//! The per-connection access log: one line on stdout when a connection closes.
//!
//! Lines are handed to a writer thread through a bounded queue, so a slow stdout (a full pipe, a
//! stalled log collector) never blocks the data path; when the queue is full the line is dropped
//! and counted, as Envoy's access loggers do under back-pressure.

use crate::metrics::Metrics;
use crate::Direction;
use remora_config::AccessLogFormat;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

const QUEUE_LINES: usize = 4096;

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Both directions finished with end of stream.
    Closed,
    /// The downstream peer reset or failed; the upstream was reset.
    DownstreamReset,
    /// The upstream peer reset or failed; the downstream was reset.
    UpstreamReset,
    /// The upstream connection failed.
    ConnectFailed,
    /// The upstream connection did not complete in time.
    ConnectTimeout,
    /// Refused by a loop guard.
    LoopRefused(crate::loop_guard::Guard),
    /// The socket could not tell its own addresses (the peer vanished at once).
    NoDestination,
    /// Inbound mesh TLS is required (STRICT) and the client spoke something else.
    MtlsRequired,
    /// The mesh TLS handshake with the client failed (see the log for why).
    TlsHandshakeFailed,
    /// An authorization policy denied the connection (Envoy's network RBAC filter).
    RbacDenied,
    /// The external authorizer denied the connection, or failed and failure was not allowed
    /// (Envoy's network ext_authz filter).
    ExtAuthzDenied,
    /// Nothing moved either way for `tcp.idle_timeout`; both sides were closed.
    IdleTimeout,
    /// xDS: no listener or filter chain took the connection.
    NoRoute,
    /// xDS: the chain's cluster does not exist.
    NoCluster,
    /// xDS: the cluster has no healthy endpoint (or its transport cannot be built).
    NoHealthyUpstream,
    /// xDS: a circuit breaker of the cluster is open (`max_connections`).
    Overflow,
}

impl End {
    /// The `end` field of the log line.
    pub fn as_str(self) -> &'static str {
        match self {
            End::Closed => "closed",
            End::DownstreamReset => "downstream_reset",
            End::UpstreamReset => "upstream_reset",
            End::ConnectFailed => "connect_failed",
            End::ConnectTimeout => "connect_timeout",
            End::LoopRefused(crate::loop_guard::Guard::OwnListener) => "loop_own_listener",
            End::LoopRefused(crate::loop_guard::Guard::OwnUpstream) => "loop_own_upstream",
            End::NoDestination => "no_destination",
            End::MtlsRequired => "mtls_required",
            End::TlsHandshakeFailed => "tls_handshake_failed",
            End::RbacDenied => "rbac_access_denied",
            End::ExtAuthzDenied => "ext_authz_denied",
            End::IdleTimeout => "idle_timeout",
            End::NoRoute => "no_route",
            End::NoCluster => "no_cluster",
            End::NoHealthyUpstream => "no_healthy_upstream",
            End::Overflow => "upstream_overflow",
        }
    }

    /// Envoy's response flag for this outcome (`-` for none), so operators read it as they do
    /// Envoy's logs.
    pub fn response_flag(self) -> &'static str {
        match self {
            // Envoy's tcp_proxy closes an idle session without a flag.
            End::Closed | End::IdleTimeout => "-",
            End::DownstreamReset => "DC",
            End::UpstreamReset => "UC",
            End::ConnectFailed | End::ConnectTimeout => "UF",
            // Envoy's RBAC filter sets no flag, only its details.
            End::LoopRefused(_)
            | End::NoDestination
            | End::TlsHandshakeFailed
            | End::RbacDenied => "-",
            // Envoy's "no filter chain found" when STRICT has no chain for plaintext.
            End::MtlsRequired | End::NoRoute => "NR",
            End::NoCluster => "NC",
            End::NoHealthyUpstream => "UH",
            End::Overflow => "UO",
            End::ExtAuthzDenied => "UAEX",
        }
    }
}

/// One finished connection.
#[derive(Debug, Clone)]
pub struct Entry {
    pub start: SystemTime,
    pub direction: Direction,
    pub source: SocketAddr,
    pub destination: Option<SocketAddr>,
    pub sent: u64,
    pub received: u64,
    pub duration: Duration,
    pub end: End,
}

impl Entry {
    fn format(&self, format: AccessLogFormat) -> String {
        let start = humantime::format_rfc3339_millis(self.start);
        let dst = self
            .destination
            .map(|d| d.to_string())
            .unwrap_or_else(|| "-".into());
        let ms = self.duration.as_millis();
        match format {
            AccessLogFormat::Text => format!(
                "[{start}] {} src={} dst={dst} sent={} received={} duration_ms={ms} end={} flags={}\n",
                self.direction.as_str(),
                self.source,
                self.sent,
                self.received,
                self.end.as_str(),
                self.end.response_flag(),
            ),
            // Every value is an address, a number or one of our own words: nothing to escape.
            // Envoy's keys keep Envoy's meaning, as on HTTP lines: `bytes_received` came from
            // the client, `bytes_sent` went back to it.
            AccessLogFormat::Json => format!(
                "{{\"start_time\":\"{start}\",\"direction\":\"{}\",\"source\":\"{}\",\"destination\":\"{dst}\",\"bytes_sent\":{},\"bytes_received\":{},\"duration_ms\":{ms},\"end\":\"{}\",\"response_flags\":\"{}\"}}\n",
                self.direction.as_str(),
                self.source,
                self.received,
                self.sent,
                self.end.as_str(),
                self.end.response_flag(),
            ),
        }
    }
}

/// The sending end of the access log.
#[derive(Debug, Clone)]
pub struct AccessLog {
    tx: SyncSender<String>,
    metrics: Arc<Metrics>,
}

impl AccessLog {
    /// Start the writer thread, writing to stdout.
    pub fn start(metrics: Arc<Metrics>) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel::<String>(QUEUE_LINES);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || {
                let stdout = std::io::stdout();
                for line in rx {
                    let mut out = stdout.lock();
                    if out
                        .write_all(line.as_bytes())
                        .and_then(|_| out.flush())
                        .is_err()
                    {
                        // stdout is gone; nothing useful left to do with access logs.
                        return;
                    }
                }
            })?;
        Ok(AccessLog { tx, metrics })
    }

    /// Queue one entry; drops it (and counts the drop) if the writer is behind.
    pub fn log(&self, entry: &Entry, format: AccessLogFormat) {
        self.log_line(entry.format(format));
    }

    /// Queue one formatted line (an HTTP request's); dropped and counted if the writer is behind.
    pub fn log_line(&self, line: String) {
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.metrics.access_log_dropped.inc();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry {
            start: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            direction: Direction::Outbound,
            source: "10.0.0.1:40000".parse().unwrap(),
            destination: Some("10.0.0.2:80".parse().unwrap()),
            sent: 12,
            received: 3456,
            duration: Duration::from_millis(42),
            end: End::ConnectFailed,
        }
    }

    #[test]
    fn text_line_has_every_field() {
        let line = entry().format(AccessLogFormat::Text);
        assert_eq!(
            line,
            "[2023-11-14T22:13:20.000Z] outbound src=10.0.0.1:40000 dst=10.0.0.2:80 sent=12 received=3456 duration_ms=42 end=connect_failed flags=UF\n"
        );
    }

    #[test]
    fn json_line_is_one_object() {
        let line = entry().format(AccessLogFormat::Json);
        assert!(line.starts_with('{') && line.ends_with("}\n"), "{line}");
        // Envoy's meaning: received from the client (12), sent back to it (3456).
        assert!(line.contains("\"bytes_received\":12,"), "{line}");
        assert!(line.contains("\"bytes_sent\":3456,"), "{line}");
        assert!(line.contains("\"response_flags\":\"UF\""), "{line}");
    }
}
