//! The binary's edge: command-line arguments, logging set-up, start-up and shutdown. Errors
//! become `anyhow` here and nowhere else.

use crate::access_log::AccessLog;
use crate::admin::{self, parse_filter, AdminState, ListenerInfo, LogControl, Role};
use crate::agent::{probe, Agent, AppMetrics};
use crate::dns;
use crate::drain::Drain;
use crate::identity;
use crate::istio_env;
use crate::listener;
use crate::loop_guard::LoopGuard;
use crate::metrics::{ListenerNames, Metrics};
use crate::proxy::{Proxy, Route};
use crate::reload::{Overrides, Reloader};
use crate::workload::Workload;
use crate::Direction;
use anyhow::Context;
use arc_swap::ArcSwap;
use clap::{Args, ValueEnum};
use remora_config::{Config, InterceptionMode};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

mod ca_start;
mod logging;
mod serve;
mod xds_command;

use logging::init_tracing;
use serve::serve;
pub use xds_command::{xds, XdsCommand};

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
    /// Log filter: a level (Envoy's names: `trace`, `debug`, `info`, `warning`, `error`,
    /// `critical`, `off`), then per-logger directives, comma-separated: Envoy's loggers or
    /// module paths, as `logger:level` or `logger=level` (`warning,http:debug,remora::tcp=trace`).
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
    /// Istio's `EXIT_ON_ZERO_ACTIVE_CONNECTIONS` sets it too (read as Istio's agent reads it).
    #[arg(long)]
    pub exit_on_zero_active_connections: bool,
    /// With exit-on-zero, stay at least this long after SIGTERM (e.g. `5s`); Istio's
    /// `MINIMUM_DRAIN_DURATION` sets it too.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub minimum_drain_duration: Option<std::time::Duration>,
    /// Serve DNS on 15053 (UDP and TCP, loopback), where `remora capture --redirect-dns` sends
    /// port 53; sets `dns.enabled`. Istio's `ISTIO_META_DNS_CAPTURE` sets it too: its agent
    /// serves DNS only when that variable is true.
    #[arg(long)]
    pub dns_capture: bool,
    /// How capture delivers inbound traffic (sets `inbound.interception_mode`); Istio's
    /// injector sets the variable from the `sidecar.istio.io/interceptionMode` annotation.
    /// TPROXY needs CAP_NET_ADMIN. NONE changes nothing.
    #[arg(
        long,
        env = "ISTIO_META_INTERCEPTION_MODE",
        value_enum,
        ignore_case = true
    )]
    pub interception_mode: Option<InterceptionArg>,
    /// The agent port (Istio's status port: merged metrics, readiness, the application's
    /// rewritten probes); sets `agent.port`. The injector passes a pod's
    /// `status.sidecar.istio.io/port` here when it is not 15020.
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub status_port: Option<u16>,
}

/// `--interception-mode` values, Istio's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InterceptionArg {
    Redirect,
    Tproxy,
    None,
}

/// `--protocol` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProtocolArg {
    Tcp,
    Http,
    Auto,
    /// Routed by the xDS resources as an outbound connection captured to `--upstream`.
    Xds,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `remora run`.
pub fn run(args: RunArgs) -> ExitCode {
    let filter = match parse_filter(&args.log_level) {
        Ok(filter) => filter,
        Err(e) => {
            eprintln!("remora: --log-level {:?}: {e}", args.log_level);
            return ExitCode::from(2);
        }
    };
    let logging = init_tracing(&filter, args.log_format == LogFormat::Json);
    match start(args, logging) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("remora: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `remora capture`.
pub fn capture(args: remora_capture::CaptureArgs) -> ExitCode {
    let _ = init_tracing(args.log_level().unwrap_or("info"), args.log_as_json());
    match remora_capture::run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("remora capture: {e}");
            // 126 for a failed --run-validation, as istio-iptables exits; 1 otherwise.
            ExitCode::from(e.exit_code())
        }
    }
}

/// `remora inject`.
pub fn inject(args: &remora_inject::cli::InjectArgs) -> ExitCode {
    match remora_inject::cli::inject(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("remora inject: {:#}", anyhow::Error::from(e));
            ExitCode::FAILURE
        }
    }
}

/// `remora webhook`.
pub fn webhook(args: &remora_inject::cli::WebhookArgs) -> ExitCode {
    let filter = std::env::var("REMORA_LOG").unwrap_or_else(|_| "info".into());
    let _ = init_tracing(&filter, false);
    match remora_inject::cli::webhook(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("remora webhook: {:#}", anyhow::Error::from(e));
            ExitCode::FAILURE
        }
    }
}

/// `remora grpc-bootstrap`.
pub fn grpc_bootstrap(args: &remora_inject::grpc::BootstrapArgs) -> ExitCode {
    match remora_inject::grpc::write_bootstrap(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("remora grpc-bootstrap: {:#}", anyhow::Error::from(e));
            ExitCode::FAILURE
        }
    }
}

fn start(args: RunArgs, logging: LogControl) -> anyhow::Result<()> {
    raise_nofile_limit();
    let istio_exit_on_zero = istio_env::boolean("EXIT_ON_ZERO_ACTIVE_CONNECTIONS");
    let minimum_drain_duration = args
        .minimum_drain_duration
        .or_else(|| istio_env::duration("MINIMUM_DRAIN_DURATION"));
    let overrides = Overrides {
        access_log: args.access_log,
        exit_on_zero_active_connections: args.exit_on_zero_active_connections || istio_exit_on_zero,
        minimum_drain_duration,
        istio_minimum_drain_default: istio_exit_on_zero && minimum_drain_duration.is_none(),
        drain_time: crate::istiod::settings::drain_duration(
            std::env::var("PROXY_CONFIG").ok().as_deref(),
        )?,
        idle_timeout: istio_env::duration("ISTIO_META_IDLE_TIMEOUT"),
        dns_capture: args.dns_capture || istio_env::boolean("ISTIO_META_DNS_CAPTURE"),
        agent_port: args.status_port.and_then(std::num::NonZeroU16::new),
        interception_mode: match args.interception_mode {
            Some(InterceptionArg::Redirect) => Some(InterceptionMode::Redirect),
            Some(InterceptionArg::Tproxy) => Some(InterceptionMode::Tproxy),
            Some(InterceptionArg::None) | None => None,
        },
        listener: args.listen.zip(args.upstream).map(|(address, upstream)| {
            remora_config::ListenerConfig {
                address,
                upstream,
                protocol: match args.protocol {
                    ProtocolArg::Tcp => remora_config::ListenerProtocol::Tcp,
                    ProtocolArg::Http => remora_config::ListenerProtocol::Http,
                    ProtocolArg::Auto => remora_config::ListenerProtocol::Auto,
                    ProtocolArg::Xds => remora_config::ListenerProtocol::Xds,
                },
                tls: None,
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
        let transparency = match config.inbound.interception_mode {
            InterceptionMode::Redirect => listener::Transparency::Off,
            // TPROXY delivers packets still addressed to the application.
            InterceptionMode::Tproxy => listener::Transparency::On,
        };
        let inbound = listener::bind_all_as(addrs, config.inbound.port.get(), transparency)
            .with_context(|| {
                format!(
                    "inbound.interception_mode is {:?}",
                    config.inbound.interception_mode
                )
            })?;
        for l in inbound {
            routes.push((Route::Capture(Direction::Inbound), l));
        }
    } else {
        for explicit in &config.listeners {
            let l = listener::bind(explicit.address).map_err(|source| listener::BindError {
                addr: explicit.address,
                source,
            })?;
            routes.push((Route::Fixed(Arc::new(explicit.clone())), l));
        }
    }
    let mut side = Vec::new();
    for l in listener::bind_all(addrs, config.readiness.port.get())? {
        side.push((Role::Readiness, l));
    }
    for l in listener::bind_all(addrs, config.metrics.port.get())? {
        side.push((Role::Metrics, l));
    }
    for l in listener::bind_all(addrs, config.agent.port.get())? {
        side.push((Role::Agent, l));
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
    let names = match config.listeners.first() {
        Some(l) => ListenerNames {
            outbound: ListenerNames::prefix(l.address),
            inbound: ListenerNames::default().inbound,
        },
        None => ListenerNames {
            outbound: format!("0.0.0.0_{}", config.outbound.port),
            inbound: format!("0.0.0.0_{}", config.inbound.port),
        },
    };
    // The workload certificate: loaded now, so a missing or broken one fails the start.
    let identity = Arc::new(identity::Store::default());
    let watcher = match identity::Paths::from_config(&config.tls) {
        Some(paths) => Some(
            identity::Watcher::start(paths, Arc::clone(&identity), config.tls.watch_interval)
                .context("loading the workload certificate (tls.cert_dir)")?,
        ),
        None => None,
    };
    // istiod mode: settings now, so a bad variable or a missing token or root file fails the
    // start naming it; the certificate itself comes once the runtime runs.
    let agent_settings = ca_start::resolve_agent_settings(&config)?;
    // What istiod configures, shared by the data path and the admin pages.
    let xds = agent_settings
        .as_ref()
        .map(|_| Arc::new(remora_xds::store::Store::new()));
    let ca_setup = match (&agent_settings, &watcher) {
        (Some(settings), None) => Some(ca_start::check_ca_inputs(settings)?),
        _ => None,
    };
    let mut own = own;
    if let Some(id) = identity.current() {
        own.principal = id.spiffe_id.to_string();
    } else if let (Some(_), Some(settings)) = (&ca_setup, &agent_settings) {
        own.principal = settings.spiffe_id();
    }
    let metrics = Arc::new(Metrics::new(&own, names));
    let exchange_header = crate::metadata_exchange::LocalHeader::new(&own);
    let node_id = own.node_id(&std::env::var("INSTANCE_IP").unwrap_or_default());
    let exchange_headers = crate::metadata_exchange::http::LocalHeaders::new(&own, &node_id);
    // Read now so that a missing resolv.conf fails the start; bound once the name table's
    // source (istiod's store or the xDS files) is known.
    let resolv_conf = match config.dns.enabled {
        true => Some(dns::read_resolv_conf(&config.dns).context("starting DNS")?),
        false => None,
    };
    let drain = Drain::new();
    let store = Arc::new(ArcSwap::from_pointee(config));
    // Ports that would loop into us if they were a connection's destination.
    let capture_ports = routes
        .iter()
        .filter_map(|(_, l)| l.local_addr().ok().map(|a| a.port()))
        .collect();
    let loop_guard = LoopGuard::new(capture_ports);
    let upstreams = Arc::new(crate::upstream::Upstreams::default());
    metrics.set_clusters(Arc::clone(&upstreams));
    // xDS resources from files: applied before anything is served, so the first connection
    // is routed by them; refused resources are logged and counted, the start goes on.
    let xds_files = match store.load().xds.resources_dir.clone() {
        // One source of resources: two stores would route by whichever was read last.
        Some(dir) if xds.is_some() => anyhow::bail!(
            "xds.resources_dir ({}) and istiod mode are exclusive: configuration comes from \
             istiod or from files, not both",
            dir.display()
        ),
        Some(dir) => Some(
            crate::xds_files::Watcher::start(dir, store.load().xds.watch_interval, &metrics)
                .context("loading xDS resources (xds.resources_dir)")?,
        ),
        None => None,
    };
    let dns = match &resolv_conf {
        Some(text) => {
            let dns_config = store.load().dns.clone();
            let names = dns_names(
                text,
                &own,
                agent_settings.as_ref(),
                xds.as_ref(),
                xds_files.as_ref(),
            );
            Some(dns::bind(&dns_config, text, names, metrics.dns.clone()).context("starting DNS")?)
        }
        None => None,
    };
    let state = Arc::new(AdminState {
        upstreams: Arc::clone(&loop_guard),
        dns_hosts: Arc::clone(&upstreams.dns),
        balancers: Arc::clone(&upstreams),
        config: Arc::clone(&store),
        listeners: listener_info(&routes),
        workload: own,
        concurrency: args.concurrency,
        logging: Some(logging),
        identity: Arc::clone(&identity),
        // Either source: `/clusters` and `/config_dump` explain what routes.
        xds: xds
            .clone()
            .or_else(|| xds_files.as_ref().map(|w| Arc::clone(&w.store))),
        ..AdminState::new(Arc::clone(&metrics), Arc::clone(&drain))
    });
    if let Some(store) = &state.xds {
        metrics.set_xds_store(Arc::clone(store));
    }
    if ca_setup.is_some() {
        // Not ready until istiod's CA has issued the workload certificate: a pod that takes
        // traffic without it cannot speak mesh TLS.
        state.readiness.require(admin::readiness::CERTIFICATE);
    }
    let agent = Arc::new(Agent {
        state: Arc::clone(&state),
        probers: probe::parse_probers(&env_var("ISTIO_KUBE_APP_PROBERS"))
            .map_err(anyhow::Error::msg)?,
        target: {
            let config = state.config.load();
            probe::Target {
                // kubelet probes the pod IP; without one (a laptop), loopback.
                app_ip: env_var("INSTANCE_IP")
                    .parse()
                    .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
                source_v4: config.inbound.passthrough_source_v4.into(),
                source_v6: config.inbound.passthrough_source_v6.into(),
            }
        },
        app_metrics: AppMetrics::parse(&env_var("ISTIO_PROMETHEUS_ANNOTATIONS"))
            .map_err(anyhow::Error::msg)?,
        scrape_timeout: state.config.load().agent.app_scrape_timeout,
    });
    admin::spawn(side, Arc::clone(&state), agent).context("starting the admin thread")?;

    // Authorization policies: loaded now, so a broken policy fails the start instead of leaving
    // the workload open; then kept in step with the directory.
    let authz = Arc::new(crate::authz::Authorizer::new(metrics.authz.clone()));
    let mut policies = crate::authz::load::Watcher::new(
        Arc::clone(&authz),
        Arc::clone(&store),
        Arc::clone(&identity),
        crate::authz::load::Workload {
            namespace: Some(state.workload.namespace.clone())
                .filter(|ns| ns != crate::workload::UNKNOWN),
            labels: crate::workload::parse_pod_labels(&pod_labels),
        },
    );
    policies
        .load()
        .context("loading authorization policies (authorization.policy_dir)")?;
    let proxy = Arc::new(Proxy {
        config: Arc::clone(&store),
        loop_guard,
        metrics: Arc::clone(&metrics),
        drain: Arc::clone(&drain),
        access_log: AccessLog::start(Arc::clone(&metrics)).context("starting the access log")?,
        pool: Arc::default(),
        h1: Arc::default(),
        mesh_pool: Arc::default(),
        mesh: Arc::new(
            crate::tls::Mesh::new(Arc::clone(&identity))
                .with_exchange_header(exchange_header, exchange_headers),
        ),
        authz,
        xds: xds
            .clone()
            .or_else(|| xds_files.as_ref().map(|w| Arc::clone(&w.store))),
        upstreams,
        chain_drains: Arc::default(),
    });
    let metrics_handle = Arc::clone(&metrics);
    let identity_store = identity;
    let reloader = args.config.map(|path| Reloader {
        last: std::fs::read(&path).ok(),
        path,
        overrides,
        store,
        metrics,
    });

    // One worker runs on the calling thread with the current-thread scheduler: no run queues
    // to steal from, no other worker to wake, so each event costs less than on a pool of one.
    let mut builder = if args.concurrency == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(usize::from(args.concurrency));
        b
    };
    let runtime = builder
        .thread_name("remora-worker")
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let istiod_mode = match agent_settings.zip(xds) {
        Some((settings, xds)) => {
            // The channels' connection tasks need the runtime.
            let _entered = runtime.enter();
            Some(ca_start::istiod_mode(
                settings,
                ca_setup,
                Arc::clone(&identity_store),
                &metrics_handle,
                Arc::clone(&state),
                xds,
                resolv_conf.is_some(),
            )?)
        }
        None => None,
    };
    let listener_count = u32::try_from(routes.len()).unwrap_or(u32::MAX);
    metrics_handle
        .server
        .set_workers(u32::from(args.concurrency), listener_count);
    let result = runtime.block_on(async {
        if let Some(w) = watcher {
            tokio::spawn(w.watch(Arc::clone(&metrics_handle)));
        }
        if let Some(mode) = istiod_mode {
            mode.spawn();
        }
        tokio::spawn(policies.watch());
        if let Some(w) = xds_files {
            tokio::spawn(w.watch());
        }
        if let Some(store) = &proxy.xds {
            let hosts = Arc::clone(&proxy.upstreams.dns);
            tokio::spawn(crate::upstream::dns::run(Arc::clone(store), hosts));
        }
        serve(proxy, routes, dns, state, reloader).await
    });
    // Connections still open after the drain period are cut here.
    runtime.shutdown_timeout(Duration::from_millis(100));
    result
}

/// The mesh's names for the DNS proxy: the name table of whichever xDS store there is (istiod's,
/// where it comes over NDS and queries wait for the first one, or the files'), for this pod's
/// namespace and search domains.
fn dns_names(
    resolv_conf: &str,
    own: &Workload,
    settings: Option<&crate::istiod::AgentSettings>,
    istiod: Option<&Arc<remora_xds::store::Store>>,
    files: Option<&crate::xds_files::Watcher>,
) -> Option<dns::Names> {
    let search = dns::search_domains(resolv_conf);
    let (namespace, dns_domain) = match settings {
        Some(s) => (s.node.namespace.clone(), s.node.dns_domain.clone()),
        None => (
            own.namespace.clone(),
            format!("{}.svc.cluster.local", own.namespace),
        ),
    };
    let context = dns::table::Context::new(&namespace, &dns_domain, &search);
    match (istiod, files) {
        (Some(store), _) => Some(dns::Names::new(Arc::clone(store), context, true)),
        (None, Some(files)) => Some(dns::Names::new(Arc::clone(&files.store), context, false)),
        (None, None) => None,
    }
}

/// An environment variable, empty when unset or not UTF-8.
fn env_var(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

/// The data-path listeners as the admin API names them (Istio's names for the capture ones).
fn listener_info(routes: &[(Route, std::net::TcpListener)]) -> Vec<ListenerInfo> {
    let mut out: Vec<ListenerInfo> = Vec::new();
    for (route, l) in routes {
        let Ok(addr) = l.local_addr() else { continue };
        match out.iter_mut().find(|i| i.route == *route) {
            Some(info) => info.addresses.push(addr),
            None => out.push(ListenerInfo {
                name: match route {
                    Route::Capture(Direction::Outbound) => "virtualOutbound".into(),
                    Route::Capture(Direction::Inbound) => "virtualInbound".into(),
                    Route::Fixed(..) => ListenerNames::prefix(addr),
                },
                route: route.clone(),
                addresses: vec![addr],
            }),
        }
    }
    out
}

/// A sidecar holds two sockets per proxied connection; the default soft limit (often 1024) would
/// cap a pod at a few hundred connections.
fn raise_nofile_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::debug!(limit = n, "open file limit raised"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open file limit"),
    }
}
