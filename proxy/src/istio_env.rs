//! Istio's environment variables, read as Istio's agent reads them: a boolean as Go's
//! `strconv.ParseBool` takes it (`1`, `t`, `TRUE`, `True`…), a duration as Go's
//! `time.ParseDuration` does, and a value the agent would refuse ignored with a warning rather
//! than refused: a sidecar that will not start over one variable takes the pod's traffic down.

use std::time::Duration;

/// The boolean variable `name`; false when unset, empty or not a boolean.
pub fn boolean(name: &str) -> bool {
    let value = std::env::var(name).unwrap_or_default();
    parse_bool(&value).unwrap_or_else(|| {
        tracing::warn!(variable = name, %value, "not a boolean (true, false, 1, 0…); ignored");
        false
    })
}

/// The duration variable `name`; none when unset, empty or not a duration.
pub fn duration(name: &str) -> Option<Duration> {
    let value = std::env::var(name).ok().filter(|v| !v.is_empty())?;
    let parsed = parse_duration(&value);
    if parsed.is_none() {
        tracing::warn!(variable = name, %value, "not a duration (5s, 1m30s…); ignored");
    }
    parsed
}

/// Go's `strconv.ParseBool`, with an empty value as false (an unset variable in Istio).
fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "" | "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        _ => None,
    }
}

/// Go's `time.ParseDuration` for what Istio's users write: `0`, or numbers with units.
fn parse_duration(value: &str) -> Option<Duration> {
    if value == "0" {
        return Some(Duration::ZERO);
    }
    humantime::parse_duration(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_as_go_parses_them() {
        for v in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(parse_bool(v), Some(true), "{v}");
        }
        for v in ["", "0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(parse_bool(v), Some(false), "{v}");
        }
        for v in ["yes", "on", "tRUE", " true"] {
            assert_eq!(parse_bool(v), None, "{v}");
        }
    }

    #[test]
    fn durations_need_units_but_zero() {
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("5"), None);
    }
}
