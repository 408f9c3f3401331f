//! A line in an Envoy text format that the xDS listeners gave (istiod's default, or the mesh's
//! `accessLogFormat`), parsed once by the converter ([`TextFormat`]): each piece's literal text
//! and then its operator's value, rendered from a [`Record`] of the request or connection.
//! Absent values print as `-`, as Envoy prints them; `:N` keeps the first N bytes of a value.
//!
//! The line is written into a scratch buffer kept per thread and copied out once, at its
//! length: no intermediate strings per field on the request's path.

use remora_xds::model::log_format::{Operator, RequestHeader, TextFormat};
use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

/// The request headers a format's `%REQ(…)%` reads.
pub trait RequestHeaders {
    /// The header's value, `None` when the request has none.
    fn header(&self, which: &RequestHeader) -> Option<&[u8]>;
}

/// What one line is written from: a request's facts, or a TCP connection's (no request, no
/// protocol, status 0).
pub struct Record<'a> {
    pub start: SystemTime,
    pub duration: Duration,
    pub request: Option<&'a dyn RequestHeaders>,
    /// `HTTP/1.1`, `HTTP/2`…; `None` for a TCP connection.
    pub protocol: Option<&'static str>,
    pub status: u16,
    /// Envoy's response flags, as Envoy prints them (`-` for none).
    pub flags: &'a dyn fmt::Display,
    pub details: Option<&'a str>,
    pub termination_details: Option<&'a str>,
    pub transport_failure: Option<&'a str>,
    /// From the downstream (a request's body, or a connection's bytes).
    pub received: u64,
    /// To the downstream.
    pub sent: u64,
    pub upstream_service_time: Option<Duration>,
    pub upstream_host: Option<SocketAddr>,
    pub cluster: Option<&'a str>,
    pub upstream_local: Option<SocketAddr>,
    pub downstream_local: Option<SocketAddr>,
    pub downstream_remote: Option<SocketAddr>,
    pub sni: Option<&'a str>,
    pub route_name: Option<&'a str>,
}

thread_local! {
    /// The scratch buffer lines are written into, reused by every line on the thread.
    static SCRATCH: RefCell<String> = RefCell::new(String::with_capacity(512));
}

/// Envoy's `%UPSTREAM_TRANSPORT_FAILURE_REASON%` for a connect that failed with `e`: the
/// system's words for it, spaces made underscores (`delayed_connect_error:_Connection_refused`).
pub fn connect_failure(e: &std::io::Error) -> String {
    let text = e.to_string();
    // io::Error adds ` (os error N)` to the system's message.
    let words = text.split(" (os error").next().unwrap_or_default();
    format!("delayed_connect_error:_{}", words.replace(' ', "_"))
}

/// The line for `record` in `format`.
pub fn line(format: &TextFormat, record: &Record<'_>) -> String {
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            write_line(format, record, &mut buf);
            String::from(buf.as_str())
        }
        // Only if a line were written while one is being written on this thread.
        Err(_) => {
            let mut buf = String::with_capacity(512);
            write_line(format, record, &mut buf);
            buf
        }
    })
}

/// Append the line for `record` in `format` to `out`.
pub fn write_line(format: &TextFormat, record: &Record<'_>, out: &mut String) {
    for piece in format.pieces.iter() {
        out.push_str(&piece.literal);
        let Some(op) = &piece.operator else {
            continue;
        };
        let mark = out.len();
        value(op, record, out);
        if out.len() == mark {
            out.push('-');
        } else if let Some(max) = piece.max_len {
            let mut cut = (mark + max).min(out.len());
            while !out.is_char_boundary(cut) {
                cut -= 1;
            }
            out.truncate(cut);
        }
    }
}

/// Append `op`'s value for `r` to `out`; nothing when it has none (written as `-`).
fn value(op: &Operator, r: &Record<'_>, out: &mut String) {
    // Writing to a String cannot fail.
    let addr = |out: &mut String, a: Option<SocketAddr>| {
        if let Some(a) = a {
            let _ = write!(out, "{a}");
        }
    };
    let text = |out: &mut String, s: Option<&str>| out.push_str(s.unwrap_or_default());
    match op {
        Operator::StartTime => {
            let _ = write!(out, "{}", humantime::format_rfc3339_millis(r.start));
        }
        Operator::Request(first, fallback) => {
            let value = r.request.and_then(|h| {
                h.header(first)
                    .or_else(|| fallback.as_ref().and_then(|f| h.header(f)))
            });
            if let Some(v) = value {
                out.push_str(&String::from_utf8_lossy(v));
            }
        }
        Operator::UpstreamServiceTime => {
            if let Some(t) = r.upstream_service_time {
                let _ = write!(out, "{}", t.as_millis());
            }
        }
        Operator::Protocol => text(out, r.protocol),
        Operator::ResponseCode => {
            let _ = write!(out, "{}", r.status);
        }
        Operator::ResponseFlags => {
            let _ = write!(out, "{}", r.flags);
        }
        Operator::ResponseCodeDetails => text(out, r.details),
        Operator::ConnectionTerminationDetails => text(out, r.termination_details),
        Operator::UpstreamTransportFailureReason => text(out, r.transport_failure),
        Operator::BytesReceived => {
            let _ = write!(out, "{}", r.received);
        }
        Operator::BytesSent => {
            let _ = write!(out, "{}", r.sent);
        }
        Operator::Duration => {
            let _ = write!(out, "{}", r.duration.as_millis());
        }
        Operator::UpstreamHost => addr(out, r.upstream_host),
        Operator::UpstreamCluster => text(out, r.cluster),
        Operator::UpstreamLocalAddress => addr(out, r.upstream_local),
        Operator::DownstreamLocalAddress => addr(out, r.downstream_local),
        Operator::DownstreamRemoteAddress => addr(out, r.downstream_remote),
        Operator::DownstreamLocalIp => {
            if let Some(a) = r.downstream_local {
                let _ = write!(out, "{}", a.ip());
            }
        }
        Operator::DownstreamRemoteIp => {
            if let Some(a) = r.downstream_remote {
                let _ = write!(out, "{}", a.ip());
            }
        }
        Operator::RequestedServerName => text(out, r.sni),
        Operator::RouteName => text(out, r.route_name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_xds::convert::log_format::parse;

    struct Headers;

    impl RequestHeaders for Headers {
        fn header(&self, which: &RequestHeader) -> Option<&[u8]> {
            match which {
                RequestHeader::Method => Some(b"GET"),
                RequestHeader::Path => Some(b"/a?b=1"),
                RequestHeader::Authority => Some(b"web:80"),
                RequestHeader::UserAgent => Some("curl/8 \u{e9}".as_bytes()),
                RequestHeader::Other(0) => Some(b"trace-1"),
                _ => None,
            }
        }
    }

    fn record(flags: &dyn fmt::Display) -> Record<'_> {
        Record {
            start: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            duration: Duration::from_millis(42),
            request: Some(&Headers),
            protocol: Some("HTTP/1.1"),
            status: 503,
            flags,
            details: Some("no_healthy_upstream"),
            termination_details: None,
            transport_failure: None,
            received: 12,
            sent: 19,
            upstream_service_time: None,
            upstream_host: None,
            cluster: Some("outbound|80||web"),
            upstream_local: None,
            downstream_local: Some("10.96.0.10:80".parse().expect("addr")),
            downstream_remote: Some("10.0.0.1:40000".parse().expect("addr")),
            sni: None,
            route_name: Some("default"),
        }
    }

    #[test]
    fn every_operator_of_istios_format_renders_as_envoy_prints_it() {
        let format = parse(concat!(
            "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" ",
            "%RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% ",
            "\"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% ",
            "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" ",
            "\"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% ",
            "%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% ",
            "%REQUESTED_SERVER_NAME% %ROUTE_NAME%\n",
        ))
        .expect("Istio's format");
        let flags = "UH";
        assert_eq!(
            line(&format, &record(&flags)),
            "[2023-11-14T22:13:20.000Z] \"GET /a?b=1 HTTP/1.1\" 503 UH no_healthy_upstream - \"-\" 12 19 42 - \"-\" \"curl/8 \u{e9}\" \"-\" \"web:80\" \"-\" outbound|80||web - 10.96.0.10:80 10.0.0.1:40000 - default\n"
        );
    }

    #[test]
    fn lengths_fallbacks_other_headers_and_a_connection_without_a_request() {
        let format = parse(
            "%REQ(X-B3-TRACEID):5% %REQ(:PATH):2% %REQ(USER-AGENT):7% %DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT% %PROTOCOL% %REQ(:METHOD)%",
        )
        .expect("parsed");
        let flags = "-";
        let mut r = record(&flags);
        // Cut at a character boundary: `é` is two bytes, the seventh and eighth.
        assert_eq!(line(&format, &r), "trace /a curl/8  10.0.0.1 HTTP/1.1 GET");
        r.request = None;
        r.protocol = None;
        assert_eq!(line(&format, &r), "- - - 10.0.0.1 - -");
        // The scratch buffer is reused: a second line carries nothing of the first.
        let short = parse("%RESPONSE_CODE%").expect("parsed");
        assert_eq!(line(&short, &r), "503");
    }
}
