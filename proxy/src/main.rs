//! The `remora` binary: one executable for the init container (`remora capture`), the
//! sidecar (`remora run` and its lifecycle hooks `remora wait` / `remora drain`) and the
//! injector (`remora inject`, `remora webhook`).

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "remora",
    version,
    about = "A sidecar proxy for Istio-style service meshes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the sidecar: capture listeners, readiness, metrics and admin.
    Run(remora::cli::RunArgs),
    /// Write the iptables rules that send a pod's TCP through the sidecar (istio-iptables flags).
    Capture(Box<remora_capture::CaptureArgs>),
    /// Add the sidecar to the pod templates of Kubernetes manifests (like istioctl kube-inject).
    Inject(Box<remora_inject::cli::InjectArgs>),
    /// Serve the sidecar-injection admission webhook over HTTPS.
    Webhook(Box<remora_inject::cli::WebhookArgs>),
    /// Block until the proxy is ready (GET 15021/healthz/ready answers 200), or time out.
    Wait(remora::lifecycle::WaitArgs),
    /// Ask the local proxy to start draining (the native sidecar's preStop hook).
    Drain(remora::lifecycle::DrainArgs),
    /// Write a proxyless gRPC application's xDS bootstrap (the grpc-simple init container).
    GrpcBootstrap(Box<remora_inject::grpc::BootstrapArgs>),
    /// Work with istiod's xDS resources offline.
    #[command(subcommand)]
    Xds(remora::cli::XdsCommand),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => remora::cli::run(args),
        Command::Capture(args) => remora::cli::capture(*args),
        Command::Inject(args) => remora::cli::inject(&args),
        Command::Webhook(args) => remora::cli::webhook(&args),
        Command::Wait(args) => remora::lifecycle::wait(args),
        Command::Drain(args) => remora::lifecycle::drain(args),
        Command::GrpcBootstrap(args) => remora::cli::grpc_bootstrap(&args),
        Command::Xds(command) => remora::cli::xds(&command),
    }
}
