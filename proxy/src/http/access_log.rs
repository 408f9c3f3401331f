//! One access-log line per HTTP request, in Envoy's default format, or as JSON with the keys
//! Istio's JSON access log uses:
//!
//! ```text
//! [START_TIME] "METHOD PATH PROTOCOL" RESPONSE_CODE RESPONSE_FLAGS BYTES_RECEIVED BYTES_SENT
//! DURATION UPSTREAM_SERVICE_TIME "X-FORWARDED-FOR" "USER-AGENT" "X-REQUEST-ID" "AUTHORITY"
//! "UPSTREAM_HOST"
//! ```
//! (on one line). Absent values print as `-`, as Envoy prints them. A log the xDS listeners
//! ask for is written in the Envoy text format they give ([`crate::access_log::envoy_format`]),
//! from the request's facts here and its connection's.

use super::counting::BodyCounter;
use super::errors::Flags;
use crate::access_log::envoy_format::{self, RequestHeaders};
use crate::access_log::LineFormat;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Uri, Version};
use remora_config::AccessLogFormat;
use remora_xds::model::log_format::{RequestHeader, TextFormat};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// What is known about a request by the time its line is written.
#[derive(Debug)]
pub struct RequestLog {
    pub start: SystemTime,
    pub started: Instant,
    /// `None` for a head that never became a request (malformed, too large, too slow).
    pub method: Option<Method>,
    pub uri: Option<Uri>,
    pub version: Version,
    pub authority: Option<HeaderValue>,
    pub user_agent: Option<HeaderValue>,
    pub request_id: Option<HeaderValue>,
    pub forwarded_for: Option<HeaderValue>,
    /// The status sent downstream.
    pub status: u16,
    pub upstream: Option<SocketAddr>,
    /// Time from the request to the upstream's response headers.
    pub upstream_time: Option<Duration>,
    /// Request body bytes read from the client.
    pub received: Arc<BodyCounter>,
    /// What only Envoy's formats print (the route, the cluster, the details).
    pub envoy: EnvoyFacts,
}

/// What a request's line in an Envoy format needs beyond Remora's own line.
#[derive(Debug, Default)]
pub struct EnvoyFacts {
    /// `x-envoy-original-path`, as the request came.
    pub original_path: Option<HeaderValue>,
    /// The headers each logger's format's `%REQ(…)%` names beyond the ones kept anyway: per
    /// format (by its list of names, shared with it), in that format's order
    /// ([`TextFormat::extra_request_headers`]).
    pub other_headers: Vec<OtherHeaders>,
    /// Envoy's `response_code_details` for a reply made here (`None`: `via_upstream` when the
    /// upstream answered).
    pub details: Option<&'static str>,
    /// The cluster the route chose.
    pub cluster: Option<Arc<remora_xds::model::Cluster>>,
    /// The route's `name`.
    pub route_name: Option<Arc<str>>,
    /// This side of the upstream connection the response came on.
    pub upstream_local: Option<SocketAddr>,
    /// An authorization policy's denial, in Envoy's words
    /// (`rbac_access_denied_matched_policy[none]`).
    pub denial: Option<Box<str>>,
    /// Why the upstream connection failed, in Envoy's words
    /// (`delayed_connect_error:_Connection_refused`).
    pub transport_failure: Option<Box<str>>,
}

/// One format's other headers: its list of names, and the request's values in that order.
pub type OtherHeaders = (Arc<[Box<str>]>, Vec<Option<HeaderValue>>);

impl RequestHeaders for RequestLog {
    fn header(&self, which: &RequestHeader) -> Option<&[u8]> {
        fn bytes(v: &Option<HeaderValue>) -> Option<&[u8]> {
            v.as_ref().map(HeaderValue::as_bytes)
        }
        match which {
            RequestHeader::Method => self.method.as_ref().map(|m| m.as_str().as_bytes()),
            RequestHeader::Path => self
                .uri
                .as_ref()
                .map(|u| u.path_and_query().map_or("/", |p| p.as_str()).as_bytes()),
            RequestHeader::Authority => bytes(&self.authority),
            RequestHeader::Scheme => self.method.as_ref().map(|_| {
                self.uri
                    .as_ref()
                    .and_then(Uri::scheme_str)
                    .unwrap_or("http")
                    .as_bytes()
            }),
            RequestHeader::UserAgent => bytes(&self.user_agent),
            RequestHeader::RequestId => bytes(&self.request_id),
            RequestHeader::ForwardedFor => bytes(&self.forwarded_for),
            RequestHeader::OriginalPath => bytes(&self.envoy.original_path),
            // Only a format knows which header its `Other(i)` is ([`ForFormat`]).
            RequestHeader::Other(_) => None,
        }
    }
}

/// A request's headers as one format reads them: its other headers by its own indices.
struct ForFormat<'a> {
    log: &'a RequestLog,
    other: &'a [Option<HeaderValue>],
}

impl RequestHeaders for ForFormat<'_> {
    fn header(&self, which: &RequestHeader) -> Option<&[u8]> {
        match which {
            RequestHeader::Other(i) => self
                .other
                .get(*i)
                .and_then(Option::as_ref)
                .map(HeaderValue::as_bytes),
            _ => self.log.header(which),
        }
    }
}

impl RequestLog {
    /// Record a request's identity from its (prepared) headers.
    pub fn new(
        start: (SystemTime, Instant),
        method: &Method,
        uri: &Uri,
        version: Version,
        headers: &HeaderMap,
    ) -> Self {
        let authority = headers.get(header::HOST).cloned().or_else(|| {
            uri.authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
        RequestLog {
            start: start.0,
            started: start.1,
            method: Some(method.clone()),
            uri: Some(uri.clone()),
            version,
            authority,
            user_agent: headers.get(header::USER_AGENT).cloned(),
            request_id: headers.get("x-request-id").cloned(),
            forwarded_for: headers.get("x-forwarded-for").cloned(),
            status: 0,
            upstream: None,
            upstream_time: None,
            received: Arc::new(BodyCounter::default()),
            envoy: EnvoyFacts {
                original_path: headers.get("x-envoy-original-path").cloned(),
                ..EnvoyFacts::default()
            },
        }
    }

    /// The connection to `endpoint` failed with `e`: Envoy names the endpoint and why.
    pub fn dial_failed(&mut self, endpoint: SocketAddr, e: &crate::upstream::dial::DialError) {
        use crate::connect::ConnectError;
        use crate::upstream::dial::DialError;
        self.upstream = Some(endpoint);
        if let DialError::Connect(ConnectError::Io { source, .. }) = e {
            self.envoy.transport_failure = Some(envoy_format::connect_failure(source).into());
        }
    }

    /// Keep the request headers `format` names beyond the ones kept anyway (once per format:
    /// two loggers may share one).
    pub fn keep_headers(&mut self, format: LineFormat<'_>, headers: &HeaderMap) {
        let LineFormat::Envoy(f) = format else {
            return;
        };
        let names = &f.extra_request_headers;
        let kept = self
            .envoy
            .other_headers
            .iter()
            .any(|(n, _)| Arc::ptr_eq(n, names));
        if names.is_empty() || kept {
            return;
        }
        let values = names.iter().map(|n| headers.get(&**n).cloned()).collect();
        self.envoy.other_headers.push((Arc::clone(names), values));
    }

    /// The line for a request that ended with `flags` after `sent` response body bytes, on a
    /// connection from `remote` to `local` (`sni`: the name its TLS asked for).
    pub fn line(
        &self,
        flags: Flags,
        sent: u64,
        format: LineFormat<'_>,
        conn: (SocketAddr, SocketAddr, Option<&str>),
    ) -> String {
        match format {
            LineFormat::Remora(f) => self.format(flags, sent, f),
            LineFormat::Envoy(f) => self.envoy_line(f, flags, sent, conn),
        }
    }

    fn envoy_line(
        &self,
        format: &TextFormat,
        flags: Flags,
        sent: u64,
        (remote, local, sni): (SocketAddr, SocketAddr, Option<&str>),
    ) -> String {
        let other = self
            .envoy
            .other_headers
            .iter()
            .find(|(names, _)| Arc::ptr_eq(names, &format.extra_request_headers))
            .map_or(&[][..], |(_, values)| values.as_slice());
        let details = self
            .envoy
            .details
            .or_else(|| self.upstream_time.map(|_| "via_upstream"));
        let failure = self.envoy.transport_failure.as_deref();
        // Envoy's details of a reset before the response carry the transport's failure too:
        // `upstream_reset_before_response_started{remote_connection_failure|<why>}`.
        let joined = match (details, failure) {
            (Some(d), Some(why)) if d.ends_with('}') => {
                Some(format!("{}|{why}}}", &d[..d.len() - 1]))
            }
            _ => None,
        };
        let details = joined
            .as_deref()
            .or(self.envoy.denial.as_deref())
            .or(details);
        let record = envoy_format::Record {
            start: self.start,
            duration: self.started.elapsed(),
            request: Some(&ForFormat { log: self, other }),
            protocol: Some(protocol(self.version)),
            status: self.status,
            flags: &flags,
            details,
            termination_details: None,
            transport_failure: failure,
            received: self.received.bytes(),
            sent,
            upstream_service_time: self.upstream_time,
            upstream_host: self.upstream,
            cluster: self.envoy.cluster.as_deref().map(|c| c.name.as_str()),
            upstream_local: self.envoy.upstream_local,
            downstream_local: Some(local),
            downstream_remote: Some(remote),
            sni,
            route_name: self.envoy.route_name.as_deref(),
        };
        envoy_format::line(format, &record)
    }

    /// A request head that never became a request: Envoy logs a codec error with no method or
    /// path.
    pub fn unparsed(start: (SystemTime, Instant), status: u16) -> Self {
        RequestLog {
            start: start.0,
            started: start.1,
            method: None,
            uri: None,
            version: Version::HTTP_11,
            authority: None,
            user_agent: None,
            request_id: None,
            forwarded_for: None,
            status,
            upstream: None,
            upstream_time: None,
            received: Arc::new(BodyCounter::default()),
            envoy: EnvoyFacts::default(),
        }
    }

    /// The line for a request that ended with `flags` after `sent` response body bytes.
    pub fn format(&self, flags: Flags, sent: u64, format: AccessLogFormat) -> String {
        let start = humantime::format_rfc3339_millis(self.start);
        let method = self.method.as_ref().map_or("-", Method::as_str);
        let path = self
            .uri
            .as_ref()
            .map_or("-", |u| u.path_and_query().map_or("/", |p| p.as_str()));
        let protocol = protocol(self.version);
        let received = self.received.bytes();
        let duration = self.started.elapsed().as_millis();
        let upstream_time = self
            .upstream_time
            .map_or_else(|| "-".to_string(), |d| d.as_millis().to_string());
        let upstream = self
            .upstream
            .map_or_else(|| "-".to_string(), |a| a.to_string());
        let value = |v: &Option<HeaderValue>| -> String {
            v.as_ref()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_else(|| "-".into())
        };
        let mut line = String::with_capacity(256);
        match format {
            AccessLogFormat::Text => {
                // Writing to a String cannot fail.
                let _ = writeln!(
                    line,
                    "[{start}] \"{method} {path} {protocol}\" {} {flags} {received} {sent} {duration} {upstream_time} \"{}\" \"{}\" \"{}\" \"{}\" \"{upstream}\"",
                    self.status,
                    value(&self.forwarded_for),
                    value(&self.user_agent),
                    value(&self.request_id),
                    value(&self.authority),
                );
            }
            AccessLogFormat::Json => {
                line.push('{');
                let mut field = |key: &str, v: &str, quoted: bool| {
                    if line.len() > 1 {
                        line.push(',');
                    }
                    line.push('"');
                    line.push_str(key);
                    line.push_str("\":");
                    if quoted {
                        json_string(&mut line, v);
                    } else {
                        line.push_str(v);
                    }
                };
                field("start_time", &start.to_string(), true);
                field("method", method, true);
                field("path", path, true);
                field("protocol", protocol, true);
                field("response_code", &self.status.to_string(), false);
                field("response_flags", &flags.to_string(), true);
                field("bytes_received", &received.to_string(), false);
                field("bytes_sent", &sent.to_string(), false);
                field("duration", &duration.to_string(), false);
                field("upstream_service_time", &upstream_time, true);
                field("x_forwarded_for", &value(&self.forwarded_for), true);
                field("user_agent", &value(&self.user_agent), true);
                field("request_id", &value(&self.request_id), true);
                field("authority", &value(&self.authority), true);
                field("upstream_host", &upstream, true);
                line.push_str("}\n");
            }
        }
        line
    }
}

/// The protocol as Envoy's `%PROTOCOL%` prints it.
fn protocol(version: Version) -> &'static str {
    match version {
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2",
        _ => "HTTP/1.1",
    }
}

/// Append `s` as a JSON string: paths and headers are the client's, so everything JSON cannot
/// hold raw is escaped.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> RequestLog {
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("svc:8080"));
        h.insert("user-agent", HeaderValue::from_static("curl/8 \"x\""));
        h.insert("x-request-id", HeaderValue::from_static("abc"));
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut e = RequestLog::new(
            (start, Instant::now()),
            &Method::POST,
            &"/upload?x=1".parse().unwrap(),
            Version::HTTP_11,
            &h,
        );
        e.status = 503;
        e.upstream = Some("10.0.0.7:8080".parse().unwrap());
        e.received.set_bytes(12);
        e
    }

    #[test]
    fn text_line_has_envoys_default_shape() {
        let mut flags = Flags::UF;
        flags.insert(Flags::URX);
        let line = entry().format(flags, 91, AccessLogFormat::Text);
        assert!(
            line.starts_with(
                "[2023-11-14T22:13:20.000Z] \"POST /upload?x=1 HTTP/1.1\" 503 URX,UF 12 91 "
            ),
            "{line}"
        );
        assert!(
            line.ends_with(" - \"-\" \"curl/8 \"x\"\" \"abc\" \"svc:8080\" \"10.0.0.7:8080\"\n"),
            "{line}"
        );
    }

    #[test]
    fn a_head_that_never_became_a_request_has_no_method_or_path() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let line = RequestLog::unparsed((start, Instant::now()), 431).format(
            Flags::DPE,
            0,
            AccessLogFormat::Text,
        );
        assert!(
            line.starts_with("[2023-11-14T22:13:20.000Z] \"- - HTTP/1.1\" 431 DPE 0 0 "),
            "{line}"
        );
    }

    /// The details Envoy's format prints: the upstream's answer, a policy's denial, and a
    /// failed connect's reason joined to the reset's details.
    #[test]
    fn envoy_format_details() {
        let parsed = remora_xds::convert::log_format::parse(
            "%RESPONSE_CODE_DETAILS% \"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %UPSTREAM_HOST%",
        )
        .expect("parsed");
        let format = LineFormat::Envoy(&parsed);
        let conn = (
            "10.0.0.1:40000".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
            None,
        );
        let mut e = entry();
        e.upstream_time = Some(Duration::from_millis(3));
        assert_eq!(
            e.line(Flags::default(), 0, format, conn),
            "via_upstream \"-\" 10.0.0.7:8080"
        );
        let mut denied = entry();
        denied.upstream = None;
        denied.envoy.details = super::super::errors::ErrorKind::AccessDenied.code_details();
        denied.envoy.denial = Some("rbac_access_denied_matched_policy[none]".into());
        assert_eq!(
            denied.line(Flags::default(), 0, format, conn),
            "rbac_access_denied_matched_policy[none] \"-\" -"
        );
        let mut refused = entry();
        refused.envoy.details = super::super::errors::ErrorKind::ConnectFailed.code_details();
        refused.envoy.transport_failure = Some(
            crate::access_log::envoy_format::connect_failure(&std::io::Error::from_raw_os_error(
                111,
            ))
            .into(),
        );
        assert_eq!(
            refused.line(Flags::UF, 0, format, conn),
            "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused} \"delayed_connect_error:_Connection_refused\" 10.0.0.7:8080"
        );
    }

    #[test]
    fn json_line_escapes_client_strings() {
        let line = entry().format(Flags::default(), 0, AccessLogFormat::Json);
        assert!(line.starts_with("{\"start_time\":"), "{line}");
        assert!(
            line.contains("\"user_agent\":\"curl/8 \\\"x\\\"\""),
            "{line}"
        );
        assert!(line.contains("\"response_code\":503"), "{line}");
        assert!(line.contains("\"response_flags\":\"-\""), "{line}");
        assert!(line.ends_with("}\n"));
    }

    /// Two loggers' formats read different other headers, each by its own indices.
    #[test]
    fn each_format_reads_its_own_other_headers() {
        let a = remora_xds::convert::log_format::parse("%REQ(X-A)% %REQ(X-B)%").expect("a");
        let b = remora_xds::convert::log_format::parse("%REQ(X-B)%").expect("b");
        let mut h = HeaderMap::new();
        h.insert("x-a", HeaderValue::from_static("1"));
        h.insert("x-b", HeaderValue::from_static("2"));
        let mut e = entry();
        for f in [&a, &b, &a] {
            e.keep_headers(LineFormat::Envoy(f), &h);
        }
        assert_eq!(e.envoy.other_headers.len(), 2, "kept once per format");
        let conn = (
            "10.0.0.1:40000".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
            None,
        );
        let line = |f| e.line(Flags::default(), 0, LineFormat::Envoy(f), conn);
        assert_eq!(line(&a), "1 2");
        assert_eq!(line(&b), "2");
    }
}
