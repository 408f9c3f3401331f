//! `access_log` (listeners, HTTP connection managers, `tcp_proxy`) into
//! [`crate::model::listener::AccessLog`]. istiod writes Envoy's file logger to the mesh's
//! `accessLogFile` (`/dev/stdout` in Istio's profiles) whenever the mesh sets it, in its default
//! text format (or the mesh's `accessLogFormat`) or, with `accessLogEncoding: JSON`, its default
//! JSON labels; Remora writes the text format as given, its operators parsed once here
//! ([`super::log_format`]), to that file. Another logger (gRPC ALS, OpenTelemetry), a path that
//! cannot be opened, an operator Remora cannot render, a custom JSON format or a filter Remora
//! cannot evaluate is refused by name.

use super::any::unpack;
use crate::model::listener::{AccessLog, AccessLogFilter, AccessLogFormat};
use crate::refusal::Fault;
use envoy_types::pb::envoy::config::accesslog::v3 as pb;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::extensions::access_loggers::file::v3 as file;
use envoy_types::pb::google::protobuf::value::Kind;
use std::sync::Arc;

const FILE_ACCESS_LOG: &str = "envoy.extensions.access_loggers.file.v3.FileAccessLog";

/// istiod's path for the mesh's `accessLogFile: /dev/stdout`: the process's standard output.
pub const STDOUT: &str = "/dev/stdout";

/// istiod's default text format (`EnvoyTextLogFormat`, Istio 1.9 onwards).
#[cfg(test)]
const ISTIO_TEXT_FORMAT: &str = concat!(
    "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" ",
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% ",
    "\"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% ",
    "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" ",
    "\"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% ",
    "%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% ",
    "%REQUESTED_SERVER_NAME% %ROUTE_NAME%\n",
);

/// istiod's default JSON labels (`EnvoyJSONLogFormatIstio`): key → command.
const ISTIO_JSON_FORMAT: [(&str, &str); 24] = [
    ("start_time", "%START_TIME%"),
    ("route_name", "%ROUTE_NAME%"),
    ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
    ("protocol", "%PROTOCOL%"),
    ("response_code", "%RESPONSE_CODE%"),
    ("response_flags", "%RESPONSE_FLAGS%"),
    ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
    (
        "connection_termination_details",
        "%CONNECTION_TERMINATION_DETAILS%",
    ),
    ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"),
    ("duration", "%DURATION%"),
    (
        "upstream_service_time",
        "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    ),
    ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
    ("user_agent", "%REQ(USER-AGENT)%"),
    ("request_id", "%REQ(X-REQUEST-ID)%"),
    ("authority", "%REQ(:AUTHORITY)%"),
    ("upstream_host", "%UPSTREAM_HOST%"),
    ("upstream_cluster", "%UPSTREAM_CLUSTER_RAW%"),
    ("upstream_local_address", "%UPSTREAM_LOCAL_ADDRESS%"),
    ("downstream_local_address", "%DOWNSTREAM_LOCAL_ADDRESS%"),
    ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"),
    ("requested_server_name", "%REQUESTED_SERVER_NAME%"),
    (
        "upstream_transport_failure_reason",
        "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
    ),
];

const CUSTOM_FORMAT: &str =
    "custom access log format not supported (only a text format, or Istio's default JSON format)";

/// Convert the `access_log` list at `path`.
pub fn access_logs(logs: &[pb::AccessLog], path: &str) -> Result<Arc<[AccessLog]>, Fault> {
    logs.iter()
        .enumerate()
        .map(|(i, l)| access_log(l, &format!("{path}[{i}]")))
        .collect()
}

fn access_log(l: &pb::AccessLog, path: &str) -> Result<AccessLog, Fault> {
    let at = format!("{path}.typed_config");
    let any = match &l.config_type {
        Some(pb::access_log::ConfigType::TypedConfig(any)) => any,
        None => return Err(Fault::new(&at, "no typed_config")),
    };
    let u = unpack(any, &at)?;
    if u.message_name() != FILE_ACCESS_LOG {
        return Err(Fault::new(
            at,
            format!(
                "access logger {:?} not supported (only envoy.access_loggers.file)",
                l.name
            ),
        )
        .with_type(&u.type_url));
    }
    let f: file::FileAccessLog = u.to(&at)?;
    writable(&f.path)
        .map_err(|reason| Fault::new(format!("{at}.path"), reason).with_type(&u.type_url))?;
    let format = match &f.access_log_format {
        Some(file::file_access_log::AccessLogFormat::LogFormat(s)) => {
            format_string(s, &format!("{at}.log_format")).map_err(|e| e.with_type(&u.type_url))?
        }
        // Envoy's own default line, which is not Istio's: istiod always sets `log_format`.
        _ => {
            return Err(Fault::new(
                format!("{at}.log_format"),
                "an access log without Istio's log_format not supported",
            )
            .with_type(&u.type_url))
        }
    };
    let filter = l
        .filter
        .as_ref()
        .map(|f| filter(f, &format!("{path}.filter")))
        .transpose()?;
    Ok(AccessLog {
        format,
        filter,
        path: f.path.as_str().into(),
    })
}

/// Whether lines can be appended to `path`. Envoy opens an access log's file (creating it, in
/// append mode) when it builds the listener, and rejects the listener when it cannot: Remora
/// does the same here, so that a path it could never write is refused by name and the
/// previous listener stays, rather than every line being lost. The file is created if absent,
/// as Envoy's is; its directory is not.
fn writable(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("an access log needs a path".into());
    }
    if path == STDOUT {
        return Ok(());
    }
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map(drop)
        .map_err(|e| format!("unable to open access log file {path:?}: {e}"))
}

fn format_string(s: &core::SubstitutionFormatString, path: &str) -> Result<AccessLogFormat, Fault> {
    use core::substitution_format_string::Format as F;
    if s.omit_empty_values || !s.formatters.is_empty() || !s.content_type.is_empty() {
        // The read list refuses these fields first; kept for a resource built in code.
        return Err(Fault::new(path, CUSTOM_FORMAT));
    }
    match &s.format {
        Some(F::TextFormatSource(d)) => match &d.specifier {
            Some(core::data_source::Specifier::InlineString(text)) => {
                super::log_format::parse(text)
                    .map(AccessLogFormat::Text)
                    .map_err(|reason| {
                        Fault::new(format!("{path}.text_format_source.inline_string"), reason)
                    })
            }
            _ => Err(Fault::new(
                format!("{path}.text_format_source"),
                "only an inline_string format is supported",
            )),
        },
        Some(F::JsonFormat(j)) => {
            let istio = j.fields.len() == ISTIO_JSON_FORMAT.len()
                && ISTIO_JSON_FORMAT.iter().all(|(k, v)| {
                    matches!(
                        j.fields.get(*k).and_then(|v| v.kind.as_ref()),
                        Some(Kind::StringValue(s)) if s == v
                    )
                });
            if istio {
                Ok(AccessLogFormat::Json)
            } else {
                Err(Fault::new(format!("{path}.json_format"), CUSTOM_FORMAT))
            }
        }
        _ => Err(Fault::new(path, CUSTOM_FORMAT)),
    }
}

fn filter(f: &pb::AccessLogFilter, path: &str) -> Result<AccessLogFilter, Fault> {
    match &f.filter_specifier {
        Some(pb::access_log_filter::FilterSpecifier::ResponseFlagFilter(r)) => {
            Ok(AccessLogFilter::ResponseFlags(r.flags.clone()))
        }
        _ => Err(Fault::new(
            path,
            "access log filter not supported (only response_flag_filter)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn convert(v: Value) -> Result<Arc<[AccessLog]>, Fault> {
        let msg =
            crate::json::from_json(&json!({"name": "l", "access_log": v}), LISTENER).expect("json");
        let l: envoy_types::pb::envoy::config::listener::v3::Listener =
            msg.transcode_to().expect("listener");
        super::super::fields::check(&msg, "")?;
        access_logs(&l.access_log, "access_log")
    }

    const LISTENER: &str = "envoy.config.listener.v3.Listener";

    fn file(path: &str, log_format: Value) -> Value {
        json!({"name": "envoy.access_loggers.file", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": path, "log_format": log_format}})
    }

    fn istio_json() -> Value {
        Value::Object(
            ISTIO_JSON_FORMAT
                .iter()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect(),
        )
    }

    #[test]
    fn istiods_text_and_json_logs_and_the_nr_filter() {
        let mut text = file(
            STDOUT,
            json!({"text_format_source": {"inline_string": ISTIO_TEXT_FORMAT}}),
        );
        text["filter"] = json!({"response_flag_filter": {"flags": ["NR"]}});
        let json_log = file(
            STDOUT,
            json!({"json_format": istio_json(), "json_format_options": {"sort_properties": false}}),
        );
        let logs = convert(json!([text, json_log])).expect("accepted");
        assert_eq!(
            *logs,
            [
                AccessLog {
                    format: AccessLogFormat::Text(
                        super::super::log_format::parse(ISTIO_TEXT_FORMAT).expect("istio's")
                    ),
                    filter: Some(AccessLogFilter::ResponseFlags(vec!["NR".into()])),
                    path: STDOUT.into(),
                },
                AccessLog {
                    format: AccessLogFormat::Json,
                    filter: None,
                    path: STDOUT.into(),
                },
            ]
        );
        let nr = AccessLogFilter::ResponseFlags(vec!["NR".into()]);
        assert!(nr.admits(["NR"]));
        assert!(!nr.admits(["UF"]));
        assert!(!nr.admits([]));
    }

    #[test]
    fn a_file_is_opened_for_append_and_one_that_cannot_be_is_refused() {
        let istio_text = json!({"text_format_source": {"inline_string": ISTIO_TEXT_FORMAT}});
        let dir = tempfile::tempdir().expect("tempdir");
        let existing = dir.path().join("existing.log");
        std::fs::write(&existing, "kept\n").expect("write");
        let created = dir.path().join("created.log");
        for path in [&existing, &created] {
            let p = path.to_str().expect("utf-8");
            let logs = convert(json!([file(p, istio_text.clone())])).expect("accepted");
            assert_eq!(&*logs[0].path, p);
        }
        // Opened as Envoy opens it: created when absent, never truncated.
        assert_eq!(std::fs::read_to_string(&existing).expect("read"), "kept\n");
        assert_eq!(std::fs::read_to_string(&created).expect("read"), "");
        for path in [
            dir.path().join("no-such-dir/envoy.log"),
            dir.path().to_path_buf(),
        ] {
            let p = path.to_str().expect("utf-8");
            let err = convert(json!([file(p, istio_text.clone())])).expect_err("refused");
            assert_eq!(err.path, "access_log[0].typed_config.path");
            assert!(
                err.reason
                    .starts_with(&format!("unable to open access log file {p:?}: ")),
                "{err:?}"
            );
        }
    }

    #[test]
    fn other_loggers_formats_and_filters_are_refused() {
        let istio_text = json!({"text_format_source": {"inline_string": ISTIO_TEXT_FORMAT}});
        let err = convert(json!([file(
            STDOUT,
            json!({"text_format_source": {"inline_string": "%START_TIME% %UPSTREAM_PEER_CERT%\n"}})
        )]))
        .expect_err("refused");
        assert_eq!(
            err.path,
            "access_log[0].typed_config.log_format.text_format_source.inline_string"
        );
        assert_eq!(
            err.reason,
            "access log operator %UPSTREAM_PEER_CERT% not supported"
        );
        let mut custom_json = istio_json();
        custom_json["extra"] = json!("%REQ(X-B3-TRACEID)%");
        let err = convert(json!([file(STDOUT, json!({"json_format": custom_json}))]))
            .expect_err("refused");
        assert_eq!(
            err.path,
            "access_log[0].typed_config.log_format.json_format"
        );
        let err = convert(json!([file(
            STDOUT,
            json!({"text_format_source": {
            "inline_string": ISTIO_TEXT_FORMAT}, "omit_empty_values": true})
        )]))
        .expect_err("refused");
        assert_eq!(
            err.path,
            "access_log[0].typed_config.log_format.omit_empty_values"
        );
        let err = convert(json!([{"name": "envoy.access_loggers.http_grpc", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
            "common_config": {"log_name": "http_envoy_accesslog", "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": "outbound|9000||als.default.svc.cluster.local"}}}}}]))
        .expect_err("refused");
        assert_eq!(err.path, "access_log[0].typed_config");
        assert!(
            err.reason
                .starts_with("access logger \"envoy.access_loggers.http_grpc\" not supported"),
            "{err:?}"
        );
        let mut cel = file(STDOUT, istio_text);
        cel["filter"] = json!({"status_code_filter": {"comparison": {"op": "GE",
            "value": {"default_value": 400, "runtime_key": "k"}}}});
        let err = convert(json!([cel])).expect_err("refused");
        assert_eq!(err.path, "access_log[0].filter.status_code_filter");
    }
}
