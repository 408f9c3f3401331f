//! Changing the log filter at run time (`/logging`), as Envoy's admin allows.

use std::sync::Mutex;

/// Sets a new `tracing` filter; built by the binary around its subscriber's reload handle.
pub type SetFilter = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// The running log filter and the means to change it.
pub struct LogControl {
    current: Mutex<String>,
    set: SetFilter,
}

impl std::fmt::Debug for LogControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogControl")
            .field("current", &self.current())
            .finish()
    }
}

impl LogControl {
    /// Control over a subscriber whose filter is now `initial`.
    pub fn new(initial: &str, set: SetFilter) -> Self {
        LogControl {
            current: Mutex::new(initial.to_string()),
            set,
        }
    }

    /// The filter in force.
    pub fn current(&self) -> String {
        self.current
            .lock()
            .map(|c| c.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Apply Envoy-style query parameters: `level=L` sets every logger, `paths=a:L,b:L` and
    /// `a=L` set single loggers (Envoy's names such as `http` or `upstream`, or module paths such
    /// as `remora::proxy`). A logger set again replaces its earlier level. Returns the new filter.
    pub fn apply(&self, params: &[(String, String)]) -> Result<String, String> {
        let mut directives: Vec<String> = Vec::new();
        let mut base = None;
        for (k, v) in params {
            match k.as_str() {
                "level" => base = Some(level(v)?),
                "paths" => {
                    for pair in v.split(',').filter(|p| !p.is_empty()) {
                        // At the last colon: module paths have colons of their own.
                        let (logger, l) = pair
                            .rsplit_once(':')
                            .filter(|(logger, _)| !logger.is_empty())
                            .ok_or_else(|| format!("`{pair}` is not logger:level"))?;
                        directives.extend(targets(logger, level(l)?));
                    }
                }
                logger => directives.extend(targets(logger, level(v)?)),
            }
        }
        if base.is_none() && directives.is_empty() {
            return Err("give level=LEVEL, paths=logger:level,… or logger=level".into());
        }
        // A new base level replaces everything; single loggers replace their own directive.
        let mut filter: Vec<String> = match base {
            Some(l) => vec![l.to_string()],
            None => self.current().split(',').map(str::to_string).collect(),
        };
        for d in directives {
            let target = d.split_once('=').map(|(t, _)| t.to_string());
            filter.retain(|old| old.split_once('=').map(|(t, _)| t.to_string()) != target);
            filter.push(d);
        }
        let filter = filter.join(",");
        (self.set)(&filter)?;
        match self.current.lock() {
            Ok(mut c) => *c = filter.clone(),
            Err(p) => *p.into_inner() = filter.clone(),
        }
        Ok(filter)
    }
}

/// A log filter given on the command line in any of the forms Envoy and Istio users write:
/// a level (`warning`), `logger:level` or `logger=level` directives, comma-separated (Istio's
/// `misc:error,upstream:debug`), with Envoy's level and logger names. Returns tracing's form,
/// or why the filter is not one.
pub fn parse_filter(spec: &str) -> Result<String, String> {
    let mut out = Vec::new();
    for directive in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let split = directive.rsplit_once('=').or_else(|| {
            directive
                .rsplit_once(':')
                .filter(|(l, _)| !l.ends_with(':'))
        });
        match split {
            None => out.push(level(directive)?.to_string()),
            Some((logger, l)) if !logger.is_empty() => out.extend(targets(logger, level(l)?)),
            Some(_) => return Err(format!("`{directive}` names no logger")),
        }
    }
    if out.is_empty() {
        return Err("empty log filter".into());
    }
    Ok(out.join(","))
}

/// Envoy's loggers and the modules that do their work here; a name not in the list is taken
/// as a module path, and Envoy loggers with no counterpart set nothing.
const ENVOY_LOGGERS: [(&str, &[&str]); 14] = [
    ("admin", &["remora::admin", "remora::agent"]),
    ("config", &["remora::reload", "remora_config"]),
    ("connection", &["remora::proxy", "remora::tcp"]),
    ("conn_handler", &["remora::listener"]),
    ("dns", &["remora::dns"]),
    ("filter", &["remora::detect", "remora::authz"]),
    ("http", &["remora::http"]),
    ("http2", &["remora::http"]),
    ("main", &["remora::cli", "remora::lifecycle"]),
    ("pool", &["remora::http::pool"]),
    ("rbac", &["remora::authz"]),
    ("router", &["remora::http"]),
    ("upstream", &["remora::connect", "remora::http::pool"]),
    ("misc", &[]),
];

/// The directives that set `logger` to `level`.
fn targets(logger: &str, level: &str) -> Vec<String> {
    match ENVOY_LOGGERS.iter().find(|(name, _)| *name == logger) {
        Some((_, modules)) => modules.iter().map(|m| format!("{m}={level}")).collect(),
        None => vec![format!("{logger}={level}")],
    }
}

/// Envoy's level names, mapped onto tracing's (`critical` is `error`).
fn level(name: &str) -> Result<&'static str, String> {
    Ok(match name {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warning" | "warn" => "warn",
        "error" | "err" | "critical" => "error",
        "off" => "off",
        other => {
            return Err(format!(
                "unknown log level `{other}` (trace, debug, info, warning, error, critical, off)"
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn control() -> (LogControl, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        let set: SetFilter = Box::new(move |f| {
            s.lock().unwrap().push(f.to_string());
            Ok(())
        });
        (LogControl::new("info", set), seen)
    }

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn level_replaces_and_targets_add() {
        let (c, seen) = control();
        assert_eq!(c.apply(&q(&[("level", "debug")])).unwrap(), "debug");
        assert_eq!(
            c.apply(&q(&[("remora::proxy", "trace")])).unwrap(),
            "debug,remora::proxy=trace"
        );
        assert_eq!(
            c.apply(&q(&[("paths", "a:warning,b:critical")])).unwrap(),
            "debug,remora::proxy=trace,a=warn,b=error"
        );
        // Module paths keep their colons; a logger set again replaces its directive.
        assert_eq!(
            c.apply(&q(&[("paths", "remora::proxy:debug,a:info")]))
                .unwrap(),
            "debug,b=error,remora::proxy=debug,a=info"
        );
        assert_eq!(
            c.apply(&q(&[("upstream", "debug")])).unwrap(),
            "debug,b=error,remora::proxy=debug,a=info,remora::connect=debug,remora::http::pool=debug"
        );
        assert_eq!(seen.lock().unwrap().len(), 5);
    }

    #[test]
    fn command_line_filters_take_envoys_and_istios_forms() {
        assert_eq!(parse_filter("warning").unwrap(), "warn");
        assert_eq!(parse_filter("critical").unwrap(), "error");
        assert_eq!(
            parse_filter("info,misc:error,http:debug").unwrap(),
            "info,remora::http=debug"
        );
        assert_eq!(
            parse_filter("warn,remora::proxy=debug,remora::tcp:trace").unwrap(),
            "warn,remora::proxy=debug,remora::tcp=trace"
        );
        for bad in ["bogus", "", "info,loud", "=debug", "remora::proxy=loud"] {
            assert!(parse_filter(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_level_changes_nothing() {
        let (c, seen) = control();
        assert!(c.apply(&q(&[("level", "loud")])).is_err());
        assert!(c.apply(&[]).is_err());
        assert_eq!(c.current(), "info");
        assert!(seen.lock().unwrap().is_empty());
    }
}
