//! Header values with Envoy's `%…%` substitutions (route and virtual-host
//! `request_headers_to_add` / `response_headers_to_add`): literal text and the commands Remora
//! can fill in from the request. [`crate::convert`] parses them and refuses any other command.

/// A header value as written: text and commands, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeaderFormat {
    pub parts: Vec<FormatPart>,
}

/// One piece of a [`HeaderFormat`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatPart {
    /// Taken as it is (`%%` already made `%`).
    Text(String),
    Command(FormatCommand),
}

/// The substitution commands Remora fills in, with Envoy's output for each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatCommand {
    /// `%DOWNSTREAM_REMOTE_ADDRESS%`: the client's `ip:port` (`[v6]:port`).
    DownstreamRemoteAddress,
    /// `%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%`.
    DownstreamRemoteAddressWithoutPort,
    /// `%DOWNSTREAM_REMOTE_PORT%`.
    DownstreamRemotePort,
    /// `%DOWNSTREAM_LOCAL_ADDRESS%`: the address the client connected to (the original
    /// destination, when the connection was redirected).
    DownstreamLocalAddress,
    /// `%DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT%`.
    DownstreamLocalAddressWithoutPort,
    /// `%DOWNSTREAM_LOCAL_PORT%`.
    DownstreamLocalPort,
    /// `%START_TIME%`: the request's start, RFC 3339 UTC with milliseconds
    /// (`2026-11-28T01:02:03.456Z`).
    StartTime,
    /// `%PROTOCOL%`: `HTTP/1.0`, `HTTP/1.1`, `HTTP/2`.
    Protocol,
    /// `%HOSTNAME%`: the machine's (the pod's) host name.
    Hostname,
    /// `%REQ(name?alternative):max%`: a request header's value, or the alternative's when it is
    /// absent, cut to `max` bytes.
    RequestHeader {
        name: String,
        alternative: Option<String>,
        max_length: Option<usize>,
    },
}

impl HeaderFormat {
    /// A value with no commands.
    pub fn literal(text: impl Into<String>) -> HeaderFormat {
        HeaderFormat {
            parts: vec![FormatPart::Text(text.into())],
        }
    }

    /// The value itself when it has no commands.
    pub fn as_literal(&self) -> Option<String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                FormatPart::Text(t) => out.push_str(t),
                FormatPart::Command(_) => return None,
            }
        }
        Some(out)
    }
}
