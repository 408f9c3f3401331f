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
    /// `a=L` set single targets (module paths such as `remora::proxy`). Returns the new filter.
    pub fn apply(&self, params: &[(String, String)]) -> Result<String, String> {
        let mut directives: Vec<String> = Vec::new();
        let mut base = None;
        for (k, v) in params {
            match k.as_str() {
                "level" => base = Some(level(v)?),
                "paths" => {
                    for pair in v.split(',').filter(|p| !p.is_empty()) {
                        let (target, l) = pair
                            .split_once(':')
                            .ok_or_else(|| format!("`{pair}` is not target:level"))?;
                        directives.push(format!("{target}={}", level(l)?));
                    }
                }
                target => directives.push(format!("{target}={}", level(v)?)),
            }
        }
        if base.is_none() && directives.is_empty() {
            return Err("give level=LEVEL, paths=target:level,… or target=level".into());
        }
        // A new base level replaces everything; single targets are added to what is there.
        let mut filter = match base {
            Some(l) => l.to_string(),
            None => self.current(),
        };
        for d in directives {
            filter.push(',');
            filter.push_str(&d);
        }
        (self.set)(&filter)?;
        match self.current.lock() {
            Ok(mut c) => *c = filter.clone(),
            Err(p) => *p.into_inner() = filter.clone(),
        }
        Ok(filter)
    }
}

/// Envoy's level names, mapped onto tracing's (`critical` is `error`).
fn level(name: &str) -> Result<&'static str, String> {
    Ok(match name {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warning" | "warn" => "warn",
        "error" | "critical" => "error",
        "off" => "off",
        other => return Err(format!("unknown level `{other}`")),
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
        assert_eq!(seen.lock().unwrap().len(), 3);
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
