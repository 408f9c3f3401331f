//! The binary's edge: command-line arguments, logging set-up, start-up and shutdown. Errors
//! become `anyhow` here and nowhere else.

use crate::access_log::AccessLog;
use crate::admin::{self, AdminState, Role};
use crate::drain::Drain;
use crate::listener;
use crate::loop_guard::LoopGuard;
use crate::metrics::Metrics;
use crate::proxy::{Proxy, Route};
use crate::reload::{Overrides, Reloader};
use crate::workload::Workload;
use crate::Direction;
use anyhow::Context;
use arc_swap::ArcSwap;
use clap::{Args, ValueEnum};
use remora_config::Config;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Notify;

/// Flags of `remora run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// YAML config file (see docs/config.md); without it the built-in defaults, which equal
    /// Istio's sidecar, apply. Reloaded on SIGHUP and when it changes.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Write one access-log line per connection to stdout (off by default, as in Istio).
    #[arg(long)]
    pub access_log: bool,
    /// Log filter: a level (`info`, `debug`…) or per-module directives (`info,remora=debug`).
    #[arg(long, env = "REMORA_LOG", default_value = "info")]
    pub log_level: String,
    /// Log line format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Worker threads for the data path (Istio's sidecar default is 2).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// Run as a plain proxy on this address instead of the capture listeners (needs
    /// `--upstream`); no iptables, no root.
    #[arg(long, value_name = "ADDR", requires = "upstream")]
    pub listen: Option<std::net::SocketAddr>,
    /// Where `--listen` forwards every connection.
    #[arg(long, value_name = "ADDR", requires = "listen")]
    pub upstream: Option<std::net::SocketAddr>,
    /// What `--listen` proxies.
    #[arg(long, value_enum, default_value_t = ProtocolArg::Tcp, requires = "listen")]
    pub protocol: ProtocolArg,
    /// The pod's labels as Istio's injector mounts them (downward API); app, version and
    /// canonical service in Istio's metrics come from here. A missing file means no labels.
    #[arg(long, value_name = "FILE", default_value = "/etc/istio/pod/labels")]
    pub pod_labels_file: PathBuf,
    /// On SIGTERM, exit as soon as no connection is left rather than after the drain period.
    #[arg(long, env = "EXIT_ON_ZERO_ACTIVE_CONNECTIONS")]
    pub exit_on_zero_active_connections: bool,
}

/// `--protocol` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProtocolArg {
    Tcp,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `remora run`.
pub fn run(args: RunArgs) -> ExitCode {
    init_tracing(&args.log_level, args.log_format == LogFormat::Json);
    match start(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("remora: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `remora capture`.
pub fn capture(args: remora_capture::CaptureArgs) -> ExitCode {
    init_tracing(args.log_level().unwrap_or("info"), args.log_as_json());
    match remora_capture::run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("remora capture: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(filter: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("remora: bad log filter {filter:?} ({e}); using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn start(args: RunArgs) -> anyhow::Result<()> {
    raise_nofile_limit();
    let overrides = Overrides {
        access_log: args.access_log,
        exit_on_zero_active_connections: args.exit_on_zero_active_connections,
        listener: args.listen.zip(args.upstream).map(|(address, upstream)| {
            remora_config::ListenerConfig {
                address,
                upstream,
                protocol: match args.protocol {
                    ProtocolArg::Tcp => remora_config::ListenerProtocol::Tcp,
                },
            }
        }),
    };
    let config = match &args.config {
        Some(path) => remora_config::load(path)?,
        None => Config::default(),
    };
    let config = overrides.apply(config);

    // Bind everything before anything runs, so a port in use fails the start.
    let addrs = &config.bind_addresses;
    let mut routes = Vec::new();
    if config.listeners.is_empty() {
        for l in listener::bind_all(addrs, config.outbound.port.get())? {
            routes.push((Route::Capture(Direction::Outbound), l));
        }
        for l in listener::bind_all(addrs, config.inbound.port.get())? {
            routes.push((Route::Capture(Direction::Inbound), l));
        }
    } else {
        for explicit in &config.listeners {
            let l = listener::bind(explicit.address).map_err(|source| listener::BindError {
                addr: explicit.address,
                source,
            })?;
            routes.push((Route::Fixed(explicit.upstream), l));
        }
    }
    let mut side = Vec::new();
    for l in listener::bind_all(addrs, config.readiness.port.get())? {
        side.push((Role::Readiness, l));
    }
    for l in listener::bind_all(addrs, config.metrics.port.get())? {
        side.push((Role::Metrics, l));
    }
    let admin_addr = config.admin.address;
    let admin_listener = listener::bind(admin_addr).map_err(|source| listener::BindError {
        addr: admin_addr,
        source,
    })?;
    side.push((Role::Admin, admin_listener));

    let pod_labels = std::fs::read_to_string(&args.pod_labels_file).unwrap_or_default();
    let own = Workload::from_environment(|k| std::env::var(k).ok(), &pod_labels);
    tracing::debug!(?own, "workload identity");
    let metrics = Arc::new(Metrics::new(&own));
    let drain = Drain::new();
    let state = Arc::new(AdminState {
        metrics: Arc::clone(&metrics),
        drain: Arc::clone(&drain),
        ready: AtomicBool::new(false),
        quit: Notify::new(),
    });
    admin::spawn(side, Arc::clone(&state)).context("starting the admin thread")?;

    // Ports that would loop into us if they were a connection's destination.
    let capture_ports = routes
        .iter()
        .filter_map(|(_, l)| l.local_addr().ok().map(|a| a.port()))
        .collect();
    let store = Arc::new(ArcSwap::from_pointee(config));
    let proxy = Arc::new(Proxy {
        config: Arc::clone(&store),
        loop_guard: LoopGuard::new(capture_ports),
        metrics: Arc::clone(&metrics),
        drain: Arc::clone(&drain),
        access_log: AccessLog::start(Arc::clone(&metrics)).context("starting the access log")?,
    });
    let reloader = args.config.map(|path| Reloader {
        last: std::fs::read(&path).ok(),
        path,
        overrides,
        store,
        metrics,
    });

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(args.concurrency))
        .thread_name("remora-worker")
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let result = runtime.block_on(serve(proxy, routes, state, reloader));
    // Connections still open after the drain period are cut here.
    runtime.shutdown_timeout(Duration::from_millis(100));
    result
}

async fn serve(
    proxy: Arc<Proxy>,
    routes: Vec<(Route, std::net::TcpListener)>,
    state: Arc<AdminState>,
    reloader: Option<Reloader>,
) -> anyhow::Result<()> {
    let mut sigterm = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    let mut sigint = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    let drain = Arc::clone(&proxy.drain);

    for (route, l) in routes {
        let l = TcpListener::from_std(l)?;
        tracing::info!(local = ?l.local_addr().ok(), ?route, "listening");
        let proxy = Arc::clone(&proxy);
        if route == Route::Capture(Direction::Inbound) {
            let drain = Arc::clone(&drain);
            let stop = async move { drain.started().await };
            tokio::spawn(listener::accept_loop(l, route, proxy, stop));
        } else {
            // Outbound keeps serving while draining: the application may still need its peers.
            let stop = std::future::pending();
            tokio::spawn(listener::accept_loop(l, route, proxy, stop));
        }
    }
    if let Some(r) = reloader {
        tokio::spawn(r.watch());
    }
    state.ready.store(true, Ordering::Release);
    tracing::info!("remora is ready");

    tokio::select! {
        _ = sigterm.recv() => {}
        _ = sigint.recv() => {
            tracing::info!("SIGINT: exiting now");
            return Ok(());
        }
        () = state.quit.notified() => {
            tracing::info!("quitquitquit: exiting now");
            return Ok(());
        }
    }

    let config = proxy.config.load_full();
    drain.start();
    let active = drain.active();
    if config.drain.exit_on_zero_active_connections {
        tracing::info!(active, "SIGTERM: draining until no connection is left");
        tokio::select! {
            () = drain.idle() => tracing::info!("no connection left: exiting"),
            () = state.quit.notified() => tracing::info!("quitquitquit: exiting now"),
            _ = sigint.recv() => tracing::info!("SIGINT: exiting now"),
        }
    } else {
        tracing::info!(active, duration = ?config.drain.duration, "SIGTERM: draining");
        tokio::select! {
            () = tokio::time::sleep(config.drain.duration) => {
                tracing::info!(active = drain.active(), "drain period over: exiting");
            }
            () = state.quit.notified() => tracing::info!("quitquitquit: exiting now"),
            _ = sigint.recv() => tracing::info!("SIGINT: exiting now"),
        }
    }
    Ok(())
}

/// A sidecar holds two sockets per proxied connection; the default soft limit (often 1024) would
/// cap a pod at a few hundred connections.
fn raise_nofile_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::debug!(limit = n, "open file limit raised"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open file limit"),
    }
}
