//! The per-connection access log: one line when a connection closes (or per request), on
//! stdout or appended to the file the xDS listeners name (the mesh's `accessLogFile`).
//!
//! Lines are handed to a writer thread through a bounded queue, so a slow stdout (a full pipe, a
//! stalled log collector) or disk never blocks the data path; when the queue is full the line is
//! dropped and counted, as Envoy's access loggers do under back-pressure. Each file is opened
//! once and appended to, and opened again after SIGHUP (log rotation), as Envoy's are after
//! `/reopen_logs` ([`writer`]).
//!
//! Which loggers an entry goes to is the chain's (or listener's) to say ([`Loggers`]); the line
//! is Remora's own (the config file's `access_log`), or, for a logger of istiod's, the Envoy
//! text format it gives ([`envoy_format`]).

pub mod envoy_format;
mod sinks;
mod writer;

use crate::metrics::Metrics;
use crate::Direction;
use remora_config::AccessLogFormat;
pub use sinks::{LineFormat, Loggers, Sink};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use writer::{Line, Writer};

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
    /// xDS: an update changed or removed the filter chain the connection started on, and the
    /// drain time (`drain.drain_time`) ran out; both sides were closed (Envoy's
    /// `filter_chain_is_being_removed`).
    FilterChainRemoved,
}

impl End {
    /// Whether the connection reached its upstream (Envoy names the upstream host then).
    pub fn reached_upstream(self) -> bool {
        matches!(
            self,
            End::Closed
                | End::DownstreamReset
                | End::UpstreamReset
                | End::IdleTimeout
                | End::FilterChainRemoved
                | End::ConnectFailed
                | End::ConnectTimeout
        )
    }

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
            End::FilterChainRemoved => "filter_chain_is_being_removed",
        }
    }

    /// Envoy's response flag for this outcome (`-` for none), so operators read it as they do
    /// Envoy's logs.
    pub fn response_flag(self) -> &'static str {
        match self {
            // Envoy's tcp_proxy closes an idle session without a flag.
            End::Closed | End::IdleTimeout | End::FilterChainRemoved => "-",
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

/// What a connection routed by xDS adds to its line, for the operators of Envoy's format
/// that name them.
#[derive(Debug, Clone, Default)]
pub struct XdsFacts {
    /// The address the client connected to (the original destination).
    pub downstream_local: Option<SocketAddr>,
    /// The cluster the chain sent it to.
    pub cluster: Option<Arc<str>>,
    /// This side of the upstream connection.
    pub upstream_local: Option<SocketAddr>,
    /// The server name of the client's ClientHello, as the listener's TLS inspector reads
    /// it (Envoy's `%REQUESTED_SERVER_NAME%`); `None` without one or without the inspector.
    pub sni: Option<Box<str>>,
    /// Why a filter ended the connection, in Envoy's words
    /// (`%CONNECTION_TERMINATION_DETAILS%`: an RBAC filter's
    /// `rbac_access_denied_matched_policy[…]`).
    pub termination_details: Option<Box<str>>,
    /// A filter's response code details (`%RESPONSE_CODE_DETAILS%`: the network ext_authz
    /// filter's `ext_authz_denied`, `ext_authz_error`).
    pub response_details: Option<&'static str>,
    /// Bytes read from the client and never forwarded (the first bytes of a connection a
    /// filter refused), which Envoy counts as received.
    pub unforwarded: u64,
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
    /// Routed by xDS: what its chain and upstream were.
    pub xds: Option<Box<XdsFacts>>,
}

impl Entry {
    /// The line in `format`.
    fn line(&self, format: LineFormat<'_>) -> String {
        match format {
            LineFormat::Remora(f) => self.format(f),
            LineFormat::Envoy(f) => {
                let xds = self.xds.as_deref();
                let flags = self.end.response_flag();
                let record = envoy_format::Record {
                    start: self.start,
                    duration: self.duration,
                    request: None,
                    protocol: None,
                    status: 0,
                    flags: &flags,
                    details: xds.and_then(|x| x.response_details),
                    termination_details: xds.and_then(|x| x.termination_details.as_deref()),
                    transport_failure: None,
                    // Envoy's meaning: received from the client (what was sent upstream),
                    // sent back to it (what was received from upstream).
                    received: self.sent + xds.map_or(0, |x| x.unforwarded),
                    sent: self.received,
                    upstream_service_time: None,
                    upstream_host: self.destination.filter(|_| self.end.reached_upstream()),
                    cluster: xds.and_then(|x| x.cluster.as_deref()),
                    upstream_local: xds.and_then(|x| x.upstream_local),
                    downstream_local: xds.and_then(|x| x.downstream_local),
                    downstream_remote: Some(self.source),
                    sni: xds.and_then(|x| x.sni.as_deref()),
                    route_name: None,
                };
                envoy_format::line(f, &record)
            }
        }
    }

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
    tx: SyncSender<Line>,
    /// Bumped to make the writer reopen its file (log rotation on SIGHUP).
    reopen: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
}

impl AccessLog {
    /// Start the writer thread.
    pub fn start(metrics: Arc<Metrics>) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel::<Line>(QUEUE_LINES);
        let reopen = Arc::new(AtomicU64::new(0));
        let mut writer = Writer::new(Arc::clone(&reopen), Arc::clone(&metrics));
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || {
                for line in rx {
                    writer.write(line);
                }
            })?;
        Ok(AccessLog {
            tx,
            reopen,
            metrics,
        })
    }

    /// Queue one entry for each of `loggers` whose filter admits it; a line is dropped (and
    /// the drop counted) if the writer is behind.
    pub fn log(&self, entry: &Entry, loggers: &Loggers) {
        for sink in loggers.admitting([entry.end.response_flag()]) {
            self.log_line(entry.line(sink.format), &sink);
        }
    }

    /// Queue one formatted line (an HTTP request's); dropped and counted if the writer is behind.
    pub fn log_line(&self, text: String, sink: &Sink<'_>) {
        let line = Line {
            file: sink.file.cloned(),
            text,
        };
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.metrics.access_log_dropped.inc();
            }
        }
    }

    /// Close and open the file again before the next line, as Envoy's `/reopen_logs` does,
    /// so that a log rotated by renaming goes on in a new file.
    pub fn reopen(&self) {
        self.reopen.fetch_add(1, Ordering::Relaxed);
    }
}

/// Reopen the access log file on every SIGHUP (Remora's reload signal, which logrotate's
/// `postrotate` sends), as Envoy's `/reopen_logs`.
pub fn reopen_on_sighup(log: &AccessLog) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup())?;
    let log = log.clone();
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            log.reopen();
        }
    });
    Ok(())
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
            xds: None,
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

    /// Wait (up to 5 s) for the writer thread to have written `want` to `path`.
    fn wait_for(path: &std::path::Path, want: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let got = std::fs::read_to_string(path).unwrap_or_default();
            if got == want {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{got:?}, want {want:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn lines_are_appended_to_the_file_and_it_is_reopened_when_asked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("access.log");
        std::fs::write(&path, "before\n").expect("write");
        let metrics = Arc::new(Metrics::default());
        let log = AccessLog::start(Arc::clone(&metrics)).expect("writer");
        let file: Arc<str> = path.to_str().expect("utf-8").into();
        let sink = Sink::remora_to(&file);
        log.log_line("one\n".into(), &sink);
        log.log_line("two\n".into(), &sink);
        wait_for(&path, "before\none\ntwo\n");
        // Renamed away (rotation): lines follow the open file until a reopen is asked for.
        let rotated = dir.path().join("access.log.1");
        std::fs::rename(&path, &rotated).expect("rename");
        log.log_line("three\n".into(), &sink);
        wait_for(&rotated, "before\none\ntwo\nthree\n");
        log.reopen();
        log.log_line("four\n".into(), &sink);
        wait_for(&path, "four\n");
        // A file that cannot be opened loses its lines, counted.
        let no_such: Arc<str> = dir
            .path()
            .join("no/such.log")
            .to_str()
            .expect("utf-8")
            .into();
        let gone = Sink::remora_to(&no_such);
        log.log_line("five\n".into(), &gone);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while metrics.access_log_dropped.get() == 0 {
            assert!(std::time::Instant::now() < deadline, "not counted");
            std::thread::sleep(Duration::from_millis(10));
        }
        // And the named file takes lines again after it.
        log.log_line("six\n".into(), &sink);
        wait_for(&path, "four\nsix\n");
    }

    /// Envoy's format counts bytes from the client's side: received from it (what went
    /// upstream, and what a refusing filter read), sent back to it.
    #[test]
    fn envoy_line_counts_bytes_as_the_client_sees_them() {
        let parsed = remora_xds::convert::log_format::parse(
            "%BYTES_RECEIVED% %BYTES_SENT% %CONNECTION_TERMINATION_DETAILS% %UPSTREAM_CLUSTER%",
        )
        .expect("parsed");
        let format = LineFormat::Envoy(&parsed);
        let mut e = entry();
        e.end = End::Closed;
        assert_eq!(e.line(format), "12 3456 - -");
        e.sent = 0;
        e.received = 0;
        e.end = End::RbacDenied;
        e.xds = Some(Box::new(XdsFacts {
            cluster: Some("inbound|9101||".into()),
            termination_details: Some("rbac_access_denied_matched_policy[none]".into()),
            unforwarded: 7,
            ..XdsFacts::default()
        }));
        assert_eq!(
            e.line(format),
            "7 0 rbac_access_denied_matched_policy[none] inbound|9101||"
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
