//! The `remora` binary: one executable for the init container (`remora capture`) and the
//! sidecar (`remora run`).

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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => remora::cli::run(args),
        Command::Capture(args) => remora::cli::capture(*args),
    }
}
