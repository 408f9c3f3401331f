//! The two front ends' command lines: `remora inject` (like `istioctl kube-inject`) and
//! `remora webhook`. The binary's edge parses them into these structs and calls [`inject`] or
//! [`webhook`]; everything they need lives in this crate.

use crate::config::{ConfigError, InjectorConfig};
use crate::documents::inject_yaml;
use crate::error::InjectError;
use crate::injector::{Injector, Outcome};
use crate::webhook::cert::RotatingCert;
use crate::webhook::{self, NoNamespaces, ServerError, WebhookOptions};
use clap::Args;
use k8s_openapi::api::core::v1::Namespace;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Flags of `remora inject`.
#[derive(Debug, Clone, Args)]
pub struct InjectArgs {
    /// Manifests to inject (multi-document YAML); `-` reads standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE|-")]
    pub file: PathBuf,
    /// Where to write the injected manifests; standard output by default.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The injector config (docs/inject.md); the built-in defaults without it.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The revision to inject (`istio.io/rev`); overrides the config's.
    #[arg(long, value_name = "REV")]
    pub revision: Option<String>,
    /// The Namespace manifest of the pods (OpenShift: the proxy's uid and gid come from its
    /// `openshift.io/sa.scc.*` annotations).
    #[arg(long, value_name = "FILE")]
    pub namespace_file: Option<PathBuf>,
}

/// Flags of `remora webhook`.
#[derive(Debug, Clone, Args)]
pub struct WebhookArgs {
    /// PEM certificate chain the webhook presents (the Service's DNS name).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: PathBuf,
    /// PEM private key of the certificate.
    #[arg(long, value_name = "FILE")]
    pub tls_key: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:15017", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// The injector config (docs/inject.md); the built-in defaults without it.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The revision this webhook serves; overrides the config's.
    #[arg(long, value_name = "REV")]
    pub revision: Option<String>,
}

/// Why a front end failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{}: not a Namespace", path.display())]
    Namespace {
        path: PathBuf,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("{}", path.display())]
    Inject {
        path: PathBuf,
        #[source]
        source: InjectError,
    },
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("listening on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the runtime")]
    Runtime(#[source] std::io::Error),
}

fn load_config(path: Option<&Path>, revision: Option<&str>) -> Result<InjectorConfig, CliError> {
    let mut config = match path {
        Some(p) => InjectorConfig::load(p)?,
        None => InjectorConfig::default(),
    };
    if let Some(rev) = revision {
        config.revision = rev.to_string();
    }
    Ok(config)
}

/// `remora inject`: reads, injects, writes. Skipped templates are reported on stderr, as
/// istioctl does; an error leaves the output unwritten.
pub fn inject(args: &InjectArgs) -> Result<(), CliError> {
    let config = load_config(args.config.as_deref(), args.revision.as_deref())?;
    let read = |path: &Path| -> Result<String, CliError> {
        let mut text = String::new();
        let result = if path == Path::new("-") {
            std::io::stdin().read_to_string(&mut text)
        } else {
            std::fs::File::open(path).and_then(|mut f| f.read_to_string(&mut text))
        };
        result.map(|_| text).map_err(|source| CliError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    let namespace: Option<Namespace> =
        match &args.namespace_file {
            Some(path) => Some(serde_yaml_ng::from_str(&read(path)?).map_err(|source| {
                CliError::Namespace {
                    path: path.clone(),
                    source,
                }
            })?),
            None => None,
        };
    let input = read(&args.file)?;
    let injector = Injector::new(config);
    let (output, reports) =
        inject_yaml(&input, &injector, namespace.as_ref()).map_err(|source| CliError::Inject {
            path: args.file.clone(),
            source,
        })?;
    for r in reports {
        if let Outcome::Skipped(why) = r.outcome {
            eprintln!("===> Skipping injection of {} {:?}: {why}", r.kind, r.name);
        }
    }
    match &args.output {
        Some(path) => std::fs::write(path, output).map_err(|source| CliError::Write {
            path: path.clone(),
            source,
        }),
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(output.as_bytes())
                .and_then(|()| stdout.flush())
                .map_err(|source| CliError::Write {
                    path: "-".into(),
                    source,
                })
        }
    }
}

/// `remora webhook`: serves until SIGTERM or SIGINT.
pub fn webhook(args: &WebhookArgs) -> Result<(), CliError> {
    let config = load_config(args.config.as_deref(), args.revision.as_deref())?;
    let cert = Arc::new(
        RotatingCert::load(&args.tls_cert, &args.tls_key, webhook::server::provider())
            .map_err(ServerError::from)?,
    );
    let tls = webhook::server::tls_config(Arc::clone(&cert))?;
    let options = WebhookOptions::default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("remora-webhook")
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|source| CliError::Listen {
                addr: args.listen,
                source,
            })?;
        tracing::info!(listen = %args.listen, revision = %config.revision, "remora webhook serving POST /inject");
        let shutdown = async {
            use tokio::signal::unix::{signal, SignalKind};
            match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                // Without signal handling, serve until killed.
                _ => std::future::pending().await,
            }
            tracing::info!("stopping");
        };
        let injector = Injector::new(config);
        // A rotated Secret is picked up without a restart.
        tokio::spawn(cert.watch(options.cert_poll_interval));
        webhook::serve(
            listener,
            tls,
            injector,
            Box::new(NoNamespaces),
            options,
            shutdown,
        )
        .await?;
        Ok(())
    })
}
