//! Envoy's `%…%` substitutions in added header values, parsed into
//! [`crate::model::header_format`]. Envoy refuses a value whose `%` starts no valid command;
//! Remora does too, and refuses by name every command it cannot fill in, rather than sending
//! the command's text as the value.

use crate::model::header_format::{FormatCommand, FormatPart, HeaderFormat};
use crate::refusal::Fault;

/// Parse a header value; `at` is its field path, for the refusal.
pub fn header_format(value: &str, at: &str) -> Result<HeaderFormat, Fault> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut rest = value;
    while let Some(start) = rest.find('%') {
        text.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        if let Some(tail) = after.strip_prefix('%') {
            text.push('%');
            rest = tail;
            continue;
        }
        let position = value.len() - after.len() - 1;
        let (command, len) = command_at(after).ok_or_else(|| {
            Fault::new(
                at,
                format!("no valid %COMMAND% at position {position} of {value:?} (a literal % is written %%)"),
            )
        })?;
        if !text.is_empty() {
            parts.push(FormatPart::Text(std::mem::take(&mut text)));
        }
        parts.push(FormatPart::Command(
            known(&command).map_err(|reason| Fault::new(at, reason))?,
        ));
        rest = &after[len..];
    }
    text.push_str(rest);
    if !text.is_empty() || parts.is_empty() {
        parts.push(FormatPart::Text(text));
    }
    Ok(HeaderFormat { parts })
}

/// A command as written: `NAME(argument):max`.
pub(super) struct Command<'a> {
    pub name: &'a str,
    pub argument: Option<&'a str>,
    pub max_length: Option<usize>,
}

/// The command at the start of `s` (just after its opening `%`) and how many bytes it takes
/// with its closing `%`, as Envoy's grammar reads it: `[A-Z0-9_]+(\([^)]*\))?(:[0-9]+)?%`.
/// (The one reading of that grammar: header values and access-log formats both use it.)
pub(super) fn command_at(s: &str) -> Option<(Command<'_>, usize)> {
    let name_len = s
        .bytes()
        .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_')
        .count();
    if name_len == 0 {
        return None;
    }
    let name = &s[..name_len];
    let mut at = name_len;
    let mut argument = None;
    if s[at..].starts_with('(') {
        let close = s[at..].find(')')?;
        argument = Some(&s[at + 1..at + close]);
        at += close + 1;
    }
    let mut max_length = None;
    if let Some(digits) = s[at..].strip_prefix(':') {
        let n = digits.bytes().take_while(u8::is_ascii_digit).count();
        max_length = Some(digits[..n].parse().ok()?);
        at += 1 + n;
    }
    s[at..].starts_with('%').then_some((
        Command {
            name,
            argument,
            max_length,
        },
        at + 1,
    ))
}

fn known(c: &Command<'_>) -> Result<FormatCommand, String> {
    use FormatCommand as F;
    let plain = match c.name {
        "DOWNSTREAM_REMOTE_ADDRESS" => Some(F::DownstreamRemoteAddress),
        "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT" => Some(F::DownstreamRemoteAddressWithoutPort),
        "DOWNSTREAM_REMOTE_PORT" => Some(F::DownstreamRemotePort),
        "DOWNSTREAM_LOCAL_ADDRESS" => Some(F::DownstreamLocalAddress),
        "DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT" => Some(F::DownstreamLocalAddressWithoutPort),
        "DOWNSTREAM_LOCAL_PORT" => Some(F::DownstreamLocalPort),
        "START_TIME" => Some(F::StartTime),
        "PROTOCOL" => Some(F::Protocol),
        "HOSTNAME" => Some(F::Hostname),
        _ => None,
    };
    if let Some(command) = plain {
        if c.argument.is_some() || c.max_length.is_some() {
            return Err(format!(
                "%{}% with an argument or a length not supported",
                c.name
            ));
        }
        return Ok(command);
    }
    match (c.name, c.argument) {
        ("REQ", Some(arg)) => {
            let (name, alternative) = match arg.split_once('?') {
                Some((n, a)) => (n, Some(a)),
                None => (arg, None),
            };
            if name.is_empty() || alternative.is_some_and(str::is_empty) {
                return Err(format!("%REQ({arg})%: an empty header name"));
            }
            Ok(F::RequestHeader {
                name: name.to_ascii_lowercase(),
                alternative: alternative.map(str::to_ascii_lowercase),
                max_length: c.max_length,
            })
        }
        (name, _) => Err(format!(
            "header formatter %{name}% not supported (only DOWNSTREAM_REMOTE_ADDRESS, \
             DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT, DOWNSTREAM_REMOTE_PORT, \
             DOWNSTREAM_LOCAL_ADDRESS, DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT, \
             DOWNSTREAM_LOCAL_PORT, START_TIME, PROTOCOL, HOSTNAME, REQ(header))"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use FormatCommand as F;

    fn parts(v: &str) -> Vec<FormatPart> {
        header_format(v, "h").expect("parsed").parts
    }

    #[test]
    fn literals_and_escaped_percent() {
        assert_eq!(parts("plain"), [FormatPart::Text("plain".into())]);
        assert_eq!(parts("100%%"), [FormatPart::Text("100%".into())]);
        assert_eq!(parts(""), [FormatPart::Text(String::new())]);
        assert_eq!(
            header_format("a%%b", "h")
                .expect("ok")
                .as_literal()
                .as_deref(),
            Some("a%b")
        );
    }

    #[test]
    fn commands_between_text() {
        assert_eq!(
            parts("for=%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%;proto=%PROTOCOL%"),
            [
                FormatPart::Text("for=".into()),
                FormatPart::Command(F::DownstreamRemoteAddressWithoutPort),
                FormatPart::Text(";proto=".into()),
                FormatPart::Command(F::Protocol),
            ]
        );
        assert_eq!(
            parts("%REQ(X-Request-Id?:AUTHORITY):8%"),
            [FormatPart::Command(F::RequestHeader {
                name: "x-request-id".into(),
                alternative: Some(":authority".into()),
                max_length: Some(8),
            })]
        );
        assert_eq!(
            header_format("%HOSTNAME%", "h").expect("ok").as_literal(),
            None
        );
    }

    #[test]
    fn unknown_commands_and_stray_percents_are_refused_by_name() {
        let err = |v: &str| {
            let f = header_format(v, "routes[0].request_headers_to_add[0].header.value")
                .expect_err("refused");
            format!("{}: {}", f.path, f.reason)
        };
        let e = err("%UPSTREAM_METADATA([\"istio\", \"x\"])%");
        assert!(
            e.contains("routes[0].request_headers_to_add[0].header.value")
                && e.contains("%UPSTREAM_METADATA% not supported"),
            "{e}"
        );
        assert!(
            err("50%").contains("no valid %COMMAND% at position 2"),
            "{}",
            err("50%")
        );
        assert!(err("%lower%").contains("no valid %COMMAND%"));
        assert!(err("%START_TIME(%s)%").contains("with an argument"));
        assert!(err("%REQ()%").contains("empty header name"));
        assert!(err("%REQ%").contains("%REQ% not supported"));
    }
}
