//! The log subscriber of `remora run`: Envoy's level names and per-logger directives
//! (`admin::parse_filter`), text or JSON on stderr, and a handle that changes the filter at run
//! time (the admin API's `/logging`).

use crate::admin::{parse_filter, LogControl, SetFilter};
use std::io::IsTerminal;

/// Install the `tracing` subscriber; returns the means to change its filter at run time.
pub(super) fn init_tracing(filter: &str, json: bool) -> LogControl {
    use tracing_subscriber::EnvFilter;
    let parsed = parse_filter(filter);
    let (env_filter, initial) = match parsed.as_deref().map(EnvFilter::try_new) {
        Ok(Ok(f)) => (f, parsed.unwrap_or_default()),
        Ok(Err(e)) => {
            eprintln!("remora: bad log filter {filter:?} ({e}); using info");
            (EnvFilter::new("info"), "info".to_string())
        }
        Err(e) => {
            eprintln!("remora: bad log filter {filter:?} ({e}); using info");
            (EnvFilter::new("info"), "info".to_string())
        }
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    // The two formats are different subscriber types; each keeps its own reload handle.
    let set: SetFilter = if json {
        let builder = builder.json().with_filter_reloading();
        let handle = builder.reload_handle();
        builder.init();
        Box::new(move |f| {
            let new = EnvFilter::try_new(f).map_err(|e| e.to_string())?;
            handle.reload(new).map_err(|e| e.to_string())
        })
    } else {
        let builder = builder.with_filter_reloading();
        let handle = builder.reload_handle();
        builder.init();
        Box::new(move |f| {
            let new = EnvFilter::try_new(f).map_err(|e| e.to_string())?;
            handle.reload(new).map_err(|e| e.to_string())
        })
    };
    LogControl::new(&initial, set)
}
