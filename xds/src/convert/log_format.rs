//! An access log's text format string into [`TextFormat`]: literal text and Envoy's command
//! operators (`%NAME%`, `%NAME(ARGS)%`, `%NAME(ARGS):N%`), parsed once. An operator Remora
//! cannot render is refused by name, and so is a `%` that opens no operator, rather than a line
//! written with a hole in it.

use crate::model::log_format::{Operator, Piece, RequestHeader, TextFormat};

/// Parse `text`; the error says which operator (or position) is not supported.
pub fn parse(text: &str) -> Result<TextFormat, String> {
    let mut pieces = Vec::new();
    let mut extra: Vec<Box<str>> = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('%') {
        literal.push_str(&rest[..at]);
        let position = text.len() - rest.len() + at;
        let command = &rest[at + 1..];
        let (c, len) = super::header_format::command_at(command)
            .ok_or_else(|| format!("no valid command operator at position {position}"))?;
        let (name, args, max_len) = (c.name, c.argument, c.max_length);
        let operator = operator(name, args, max_len, &mut extra)?;
        pieces.push(Piece {
            literal: std::mem::take(&mut literal).into(),
            operator: Some(operator),
            max_len,
        });
        rest = &command[len..];
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        pieces.push(Piece {
            literal: literal.into(),
            operator: None,
            max_len: None,
        });
    }
    Ok(TextFormat {
        pieces: pieces.into(),
        extra_request_headers: extra.into(),
    })
}

/// The operator `name` with its arguments and length, checked as Envoy 1.40 checks them: the
/// plain ones take neither (Envoy refuses `%UPSTREAM_CLUSTER:9%` too), `REQ` and `RESP` need
/// a header and may take a length.
fn operator(
    name: &str,
    args: Option<&str>,
    max_len: Option<usize>,
    extra: &mut Vec<Box<str>>,
) -> Result<Operator, String> {
    use Operator as O;
    let plain = match name {
        "START_TIME" => Some(O::StartTime),
        "PROTOCOL" => Some(O::Protocol),
        "RESPONSE_CODE" => Some(O::ResponseCode),
        "RESPONSE_FLAGS" => Some(O::ResponseFlags),
        "RESPONSE_CODE_DETAILS" => Some(O::ResponseCodeDetails),
        "CONNECTION_TERMINATION_DETAILS" => Some(O::ConnectionTerminationDetails),
        "UPSTREAM_TRANSPORT_FAILURE_REASON" => Some(O::UpstreamTransportFailureReason),
        "BYTES_RECEIVED" => Some(O::BytesReceived),
        "BYTES_SENT" => Some(O::BytesSent),
        "DURATION" => Some(O::Duration),
        "UPSTREAM_HOST" => Some(O::UpstreamHost),
        "UPSTREAM_CLUSTER" | "UPSTREAM_CLUSTER_RAW" => Some(O::UpstreamCluster),
        "UPSTREAM_LOCAL_ADDRESS" => Some(O::UpstreamLocalAddress),
        "DOWNSTREAM_LOCAL_ADDRESS" => Some(O::DownstreamLocalAddress),
        "DOWNSTREAM_REMOTE_ADDRESS" => Some(O::DownstreamRemoteAddress),
        "DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT" => Some(O::DownstreamLocalIp),
        "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT" => Some(O::DownstreamRemoteIp),
        "REQUESTED_SERVER_NAME" => Some(O::RequestedServerName),
        "ROUTE_NAME" => Some(O::RouteName),
        _ => None,
    };
    if let Some(op) = plain {
        return match (args, max_len) {
            (None, None) => Ok(op),
            // `%START_TIME(%s)%` and the like: a strftime format Remora does not render.
            (Some(a), None) if name == "START_TIME" => Err(format!(
                "access log operator %START_TIME({a})% not supported (only %START_TIME%)"
            )),
            (_, Some(_)) if name == "START_TIME" => {
                Err("START_TIME does not allow length to be specified.".into())
            }
            _ => Err(format!("{name} does not take any parameters or length")),
        };
    }
    match (name, args) {
        ("REQ" | "RESP", None | Some("")) => Err(format!("{name} requires parameters")),
        ("REQ", Some(a)) => {
            let (first, fallback) = match a.split_once('?') {
                Some((x, y)) => (x, Some(y)),
                None => (a, None),
            };
            let first = request_header(first, extra)?;
            let fallback = fallback.map(|y| request_header(y, extra)).transpose()?;
            Ok(O::Request(first, fallback))
        }
        ("RESP", Some(a)) if a.eq_ignore_ascii_case("x-envoy-upstream-service-time") => {
            Ok(O::UpstreamServiceTime)
        }
        ("RESP", Some(a)) => Err(format!(
            "access log operator %RESP({a})% not supported (only %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%)"
        )),
        _ => Err(format!("access log operator %{name}% not supported")),
    }
}

fn request_header(name: &str, extra: &mut Vec<Box<str>>) -> Result<RequestHeader, String> {
    let lower = name.to_ascii_lowercase();
    Ok(match lower.as_str() {
        ":method" => RequestHeader::Method,
        ":path" => RequestHeader::Path,
        // Envoy reads `host` as `:authority`, the same header in its map.
        ":authority" | "host" => RequestHeader::Authority,
        ":scheme" => RequestHeader::Scheme,
        "user-agent" => RequestHeader::UserAgent,
        "x-request-id" => RequestHeader::RequestId,
        "x-forwarded-for" => RequestHeader::ForwardedFor,
        "x-envoy-original-path" => RequestHeader::OriginalPath,
        pseudo if pseudo.starts_with(':') => {
            return Err(format!("access log operator %REQ({name})% not supported"))
        }
        other => {
            if http_token(other).is_none() {
                return Err(format!(
                    "access log operator %REQ({name})%: not a header name"
                ));
            }
            let index = match extra.iter().position(|e| &**e == other) {
                Some(i) => i,
                None => {
                    extra.push(other.into());
                    extra.len() - 1
                }
            };
            RequestHeader::Other(index)
        }
    })
}

/// `name` when it is an HTTP token (a header name).
fn http_token(name: &str) -> Option<&str> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    ok.then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_arguments_and_lengths_between_literals() {
        let f = parse("[%START_TIME%] \"%REQ(X-ENVOY-ORIGINAL-PATH?:PATH):5% %REQ(X-B3-TRACEID)% %REQ(x-b3-traceid)%\"\n")
            .expect("parsed");
        let ops: Vec<_> = f
            .pieces
            .iter()
            .map(|p| (&*p.literal, p.operator.clone(), p.max_len))
            .collect();
        assert_eq!(
            ops,
            vec![
                ("[", Some(Operator::StartTime), None),
                (
                    "] \"",
                    Some(Operator::Request(
                        RequestHeader::OriginalPath,
                        Some(RequestHeader::Path)
                    )),
                    Some(5)
                ),
                (
                    " ",
                    Some(Operator::Request(RequestHeader::Other(0), None)),
                    None
                ),
                (
                    " ",
                    Some(Operator::Request(RequestHeader::Other(0), None)),
                    None
                ),
                ("\"\n", None, None),
            ]
        );
        assert_eq!(&*f.extra_request_headers, &["x-b3-traceid".into()]);
    }

    #[test]
    fn an_operator_remora_cannot_render_is_refused_by_name() {
        for (text, reason) in [
            (
                "%UPSTREAM_WIRE_BYTES_SENT%",
                "access log operator %UPSTREAM_WIRE_BYTES_SENT% not supported",
            ),
            (
                "x %START_TIME(%s)%",
                "access log operator %START_TIME(%s)% not supported (only %START_TIME%)",
            ),
            (
                "%DURATION(x)%",
                "DURATION does not take any parameters or length",
            ),
            (
                "%UPSTREAM_CLUSTER:9%",
                "UPSTREAM_CLUSTER does not take any parameters or length",
            ),
            ("%REQ%", "REQ requires parameters"),
            (
                "%RESP(CONTENT-TYPE)%",
                "access log operator %RESP(CONTENT-TYPE)% not supported (only %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%)",
            ),
            ("%REQ(:STATUS)%", "access log operator %REQ(:STATUS)% not supported"),
            ("100% sure", "no valid command operator at position 3"),
            ("%DURATION", "no valid command operator at position 0"),
        ] {
            assert_eq!(parse(text).expect_err(text), reason, "{text}");
        }
    }
}
