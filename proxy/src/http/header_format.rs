//! Filling in Envoy's `%…%` substitutions of a route's added header values
//! ([`remora_xds::model::header_format`]) from one request and its connection. Both request
//! and response values are filled in when the request is routed: every command Remora knows
//! reads only the request side.

use http::request::Parts;
use http::Version;
use remora_xds::model::header_format::{FormatCommand, FormatPart, HeaderFormat};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::SystemTime;

/// What the substitutions read.
#[derive(Debug)]
pub struct Request<'a> {
    /// The client's address.
    pub remote: SocketAddr,
    /// The address the client connected to (the original destination).
    pub local: SocketAddr,
    pub started: SystemTime,
    pub parts: &'a Parts,
}

/// The value `format` stands for in `request`. Missing values (an absent header) are empty,
/// as Envoy's header formatter leaves them.
pub fn render(format: &HeaderFormat, request: &Request<'_>) -> String {
    let mut out = String::new();
    for part in &format.parts {
        match part {
            FormatPart::Text(t) => out.push_str(t),
            FormatPart::Command(c) => command(c, request, &mut out),
        }
    }
    out
}

fn command(c: &FormatCommand, r: &Request<'_>, out: &mut String) {
    use FormatCommand as F;
    // Writing into a String cannot fail.
    let _ = match c {
        F::DownstreamRemoteAddress => write!(out, "{}", r.remote),
        F::DownstreamRemoteAddressWithoutPort => write!(out, "{}", r.remote.ip()),
        F::DownstreamRemotePort => write!(out, "{}", r.remote.port()),
        F::DownstreamLocalAddress => write!(out, "{}", r.local),
        F::DownstreamLocalAddressWithoutPort => write!(out, "{}", r.local.ip()),
        F::DownstreamLocalPort => write!(out, "{}", r.local.port()),
        F::StartTime => write!(out, "{}", humantime::format_rfc3339_millis(r.started)),
        F::Protocol => {
            out.push_str(protocol(r.parts.version));
            Ok(())
        }
        F::Hostname => {
            out.push_str(hostname());
            Ok(())
        }
        F::RequestHeader {
            name,
            alternative,
            max_length,
        } => {
            let value = header(r.parts, name)
                .or_else(|| alternative.as_deref().and_then(|a| header(r.parts, a)))
                .unwrap_or_default();
            out.push_str(truncate(value, *max_length));
            Ok(())
        }
    };
}

/// Envoy's names for the protocol of a request.
fn protocol(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2",
        Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

/// A request header, or a pseudo-header as HTTP/2 would carry it.
fn header<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    match name {
        ":authority" => parts
            .headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| parts.uri.authority().map(|a| a.as_str())),
        ":path" => parts.uri.path_and_query().map(|p| p.as_str()),
        ":method" => Some(parts.method.as_str()),
        ":scheme" => Some(parts.uri.scheme_str().unwrap_or("http")),
        _ => parts.headers.get(name).and_then(|v| v.to_str().ok()),
    }
}

/// At most `max` bytes, cut at a character boundary.
fn truncate(s: &str, max: Option<usize>) -> &str {
    let Some(mut max) = max.filter(|m| *m < s.len()) else {
        return s;
    };
    while !s.is_char_boundary(max) {
        max -= 1;
    }
    &s[..max]
}

/// The host name, as `gethostname` gives it (the UTS namespace's, so the pod's), read once:
/// it does not change under a running sidecar.
fn hostname() -> &'static str {
    static HOSTNAME: OnceLock<String> = OnceLock::new();
    HOSTNAME.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim_end().to_string())
            .unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_xds::convert::header_format::header_format;
    use std::time::Duration;

    fn rendered(value: &str, version: Version) -> String {
        let (mut parts, ()) = http::Request::builder()
            .uri("/api?x=1")
            .version(version)
            .header("host", "reviews:9080")
            .header("x-request-id", "abcdef123")
            .body(())
            .expect("request")
            .into_parts();
        parts.version = version;
        let request = Request {
            remote: "10.0.0.7:41234".parse().expect("addr"),
            local: "[fd00::9]:9080".parse().expect("addr"),
            started: SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_000_000_123),
            parts: &parts,
        };
        render(&header_format(value, "v").expect("parsed"), &request)
    }

    #[test]
    fn addresses_protocol_and_start_time_as_envoy_writes_them() {
        let v = "%DOWNSTREAM_REMOTE_ADDRESS%|%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%|%DOWNSTREAM_REMOTE_PORT%";
        assert_eq!(
            rendered(v, Version::HTTP_11),
            "10.0.0.7:41234|10.0.0.7|41234"
        );
        let v = "%DOWNSTREAM_LOCAL_ADDRESS%|%DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT%|%DOWNSTREAM_LOCAL_PORT%";
        assert_eq!(rendered(v, Version::HTTP_11), "[fd00::9]:9080|fd00::9|9080");
        assert_eq!(rendered("%PROTOCOL%", Version::HTTP_2), "HTTP/2");
        assert_eq!(rendered("%PROTOCOL%", Version::HTTP_10), "HTTP/1.0");
        assert_eq!(
            rendered("t=%START_TIME%", Version::HTTP_11),
            "t=2026-11-18T11:06:40.123Z"
        );
        assert_eq!(
            rendered("100%% %HOSTNAME%", Version::HTTP_11),
            format!("100% {}", hostname())
        );
    }

    #[test]
    fn request_headers_with_alternatives_and_lengths() {
        assert_eq!(
            rendered("%REQ(X-Request-Id)%", Version::HTTP_11),
            "abcdef123"
        );
        assert_eq!(rendered("%REQ(x-request-id):3%", Version::HTTP_11), "abc");
        assert_eq!(
            rendered("%REQ(x-missing?:authority)%", Version::HTTP_11),
            "reviews:9080"
        );
        assert_eq!(rendered("[%REQ(x-missing)%]", Version::HTTP_11), "[]");
        assert_eq!(rendered("%REQ(:PATH)%", Version::HTTP_11), "/api?x=1");
    }
}
