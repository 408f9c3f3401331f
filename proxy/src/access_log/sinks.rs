//! Which loggers a connection or request is written to ([`Loggers`]), and how each one writes
//! a line ([`Sink`]).
//!
//! With the config file's `access_log`, Remora writes its own line on standard output for
//! everything. With istiod's resources, as Envoy: a request goes to every logger of the
//! connection manager of the chain that served it, a TCP connection to every logger of its
//! chain's `tcp_proxy`, a connection no chain took to the listener's own loggers; each
//! logger's filter decides per entry. The lists are the model's, shared (`Arc`) with the
//! snapshot: a connection holds a pointer, and one without loggers holds nothing.

use remora_config::{AccessLogFormat, Config};
use remora_xds::model::listener::{
    AccessLog as XdsLog, AccessLogFilter, AccessLogFormat as XdsFormat,
};
use remora_xds::model::log_format::{Operator, TextFormat};
use std::sync::Arc;

/// istiod's path for standard output, which the writer keeps as the process's own.
const STDOUT: &str = "/dev/stdout";

/// The loggers of one connection (or of each of its requests).
#[derive(Debug, Clone, Default)]
pub enum Loggers {
    /// Nothing is logged: no config-file log, and no logger on the chain (or listener).
    #[default]
    None,
    /// The config file's access log: Remora's own line on standard output.
    Remora(AccessLogFormat),
    /// The loggers of the chain that served the connection, or of the listener when no chain
    /// took it, each with its filter (never empty: an empty list is [`Loggers::None`]).
    Xds(Arc<[XdsLog]>),
}

impl Loggers {
    /// The config file's access log when it is on: it wins over the listeners' loggers.
    pub fn of_config(config: &Config) -> Option<Loggers> {
        config
            .access_log
            .enabled
            .then_some(Loggers::Remora(config.access_log.format))
    }

    /// The loggers of a chain or listener.
    pub fn xds(logs: &Arc<[XdsLog]>) -> Loggers {
        if logs.is_empty() {
            Loggers::None
        } else {
            Loggers::Xds(Arc::clone(logs))
        }
    }

    /// Whether anything is logged.
    pub fn is_some(&self) -> bool {
        !matches!(self, Loggers::None)
    }

    /// Every logger, whatever its filter.
    pub fn sinks(&self) -> impl Iterator<Item = Sink<'_>> {
        let (own, xds): (Option<Sink<'_>>, &[XdsLog]) = match self {
            Loggers::None => (None, &[]),
            Loggers::Remora(f) => (
                Some(Sink {
                    format: LineFormat::Remora(*f),
                    file: None,
                    filter: None,
                }),
                &[],
            ),
            Loggers::Xds(logs) => (None, logs),
        };
        own.into_iter().chain(xds.iter().map(Sink::of))
    }

    /// The loggers whose filter admits an entry with these response flags (Envoy's names).
    pub fn admitting<'a, 'f, F>(&'a self, flags: F) -> impl Iterator<Item = Sink<'a>>
    where
        F: IntoIterator<Item = &'f str> + Clone + 'a,
    {
        self.sinks().filter(move |s| s.admits(flags.clone()))
    }
}

/// One logger: the line's format and where it goes.
#[derive(Debug, Clone, Copy)]
pub struct Sink<'a> {
    pub format: LineFormat<'a>,
    /// The file lines are appended to; `None`: standard output (also for `/dev/stdout`).
    pub file: Option<&'a Arc<str>>,
    filter: Option<&'a AccessLogFilter>,
}

impl<'a> Sink<'a> {
    fn of(log: &'a XdsLog) -> Sink<'a> {
        Sink {
            format: match &log.format {
                XdsFormat::Text(f) => LineFormat::Envoy(f),
                XdsFormat::Json => LineFormat::Remora(AccessLogFormat::Json),
            },
            file: (&*log.path != STDOUT).then_some(&log.path),
            filter: log.filter.as_ref(),
        }
    }

    /// A logger of Remora's own line to `file` (tests).
    #[cfg(test)]
    pub fn remora_to(file: &'a Arc<str>) -> Sink<'a> {
        Sink {
            format: LineFormat::Remora(AccessLogFormat::Text),
            file: Some(file),
            filter: None,
        }
    }

    /// Whether this logger writes an entry with these response flags.
    pub fn admits<'f>(&self, flags: impl IntoIterator<Item = &'f str>) -> bool {
        self.filter.is_none_or(|f| f.admits(flags))
    }

    /// The format prints `%UPSTREAM_LOCAL_ADDRESS%`: worth a `getsockname` per request.
    pub fn upstream_local(&self) -> bool {
        matches!(self.format, LineFormat::Envoy(f) if f.uses(&Operator::UpstreamLocalAddress))
    }
}

/// How a line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFormat<'a> {
    /// Remora's own text or JSON line (the config file's `access_log`, or istiod's JSON labels).
    Remora(AccessLogFormat),
    /// The Envoy text format the xDS listeners gave, as it is.
    Envoy(&'a TextFormat),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(path: &str, format: &str, nr_only: bool) -> XdsLog {
        XdsLog {
            format: XdsFormat::Text(
                remora_xds::convert::log_format::parse(format).expect("format"),
            ),
            filter: nr_only.then(|| AccessLogFilter::ResponseFlags(vec!["NR".into()])),
            path: path.into(),
        }
    }

    fn files<'a>(sinks: impl Iterator<Item = Sink<'a>>) -> Vec<String> {
        sinks
            .map(|s| s.file.map_or("stdout".into(), |f| f.to_string()))
            .collect()
    }

    /// The config file's log, when on, is Remora's line on standard output (the data path
    /// takes it over any chain's); an empty list of loggers writes nothing.
    #[test]
    fn the_config_files_log_and_an_empty_chain() {
        let mut config = Config::default();
        assert!(Loggers::of_config(&config).is_none());
        config.access_log.enabled = true;
        let own = Loggers::of_config(&config).expect("on");
        assert!(
            matches!(own, Loggers::Remora(AccessLogFormat::Text)),
            "{own:?}"
        );
        assert_eq!(files(own.sinks()), ["stdout"]);
        assert!(!Loggers::xds(&Arc::from([])).is_some());
        assert_eq!(files(Loggers::None.sinks()), Vec::<String>::new());
    }

    /// Every logger of the chain writes, each to its own file; `/dev/stdout` is standard output.
    #[test]
    fn every_logger_of_the_chain_is_a_sink() {
        let chain: Arc<[XdsLog]> = Arc::from([
            log("/tmp/a.log", "A %RESPONSE_CODE%", false),
            log(STDOUT, "B %UPSTREAM_LOCAL_ADDRESS%", false),
        ]);
        let loggers = Loggers::xds(&chain);
        assert_eq!(files(loggers.sinks()), ["/tmp/a.log", "stdout"]);
        let wants: Vec<bool> = loggers.sinks().map(|s| s.upstream_local()).collect();
        assert_eq!(wants, [false, true]);
    }

    /// istiod's listener log carries the `NR` filter: a connection no chain took is written,
    /// a 200 without flags (or with another flag) is not; an unfiltered logger takes both.
    #[test]
    fn each_loggers_filter_decides_by_the_response_flags() {
        let listener: Arc<[XdsLog]> = Arc::from([
            log("/tmp/nr.log", "%RESPONSE_FLAGS%", true),
            log("/tmp/all.log", "%RESPONSE_FLAGS%", false),
        ]);
        let loggers = Loggers::xds(&listener);
        assert_eq!(
            files(loggers.admitting(["NR"])),
            ["/tmp/nr.log", "/tmp/all.log"]
        );
        assert_eq!(files(loggers.admitting(["-"])), ["/tmp/all.log"]);
        assert_eq!(files(loggers.admitting([])), ["/tmp/all.log"]);
        assert_eq!(files(loggers.admitting(["UF", "URX"])), ["/tmp/all.log"]);
        assert_eq!(
            files(loggers.admitting(["UF", "NR"])),
            ["/tmp/nr.log", "/tmp/all.log"]
        );
    }
}
