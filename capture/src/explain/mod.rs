//! `remora capture explain`: why a connection is (or is not) captured.
//!
//! Given capture rules, as installed (read back with `*-save` and `nft list ruleset`) or from
//! a file, and a connection (direction, addresses, ports, the socket's owner, interfaces),
//! it prints the path the connection's first packet takes through the chains, rule by rule,
//! and where it ends: redirected to a port, TPROXYed, returned untouched, or dropped. A match
//! it cannot evaluate is reported as unknown, never guessed. With `--check FLAGS…` it instead
//! compares what is installed with what those flags would install.
//!
//! The parts: [`iptables`] and [`nft`] read rules into one [`model`]; [`trace`] follows the
//! packet; [`check`] compares rule sets.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Args, Parser, ValueEnum};

use crate::error::CaptureError;
use crate::flags::{CaptureArgs, Environment};
use crate::options::{Backend, RunOptions};
use crate::runner::Runner;

pub mod check;
pub mod iptables;
pub mod model;
pub mod nft;
pub mod report;
pub mod trace;

use model::{Family, Proto, Ruleset};
use trace::{Connection, Direction};

/// Flags of `remora capture explain`.
#[derive(Debug, Clone, Default, Args)]
pub struct ExplainArgs {
    /// Rules to read instead of the installed ones: `iptables-save` output, `iptables-restore`
    /// input (such as `remora capture --dry-run` prints), an nft program or `nft list` output
    #[arg(long = "rules", value_name = "FILE")]
    pub rules: Option<PathBuf>,

    /// outbound: opened by a local process (OUTPUT); inbound: arriving on an interface
    /// (PREROUTING)
    #[arg(long, value_enum, required_unless_present = "check")]
    pub direction: Option<DirectionArg>,

    /// tcp or udp
    #[arg(long, default_value = "tcp", value_parser = parse_proto)]
    pub proto: ProtoArg,

    /// The socket owner's UID (outbound)
    #[arg(long)]
    pub uid: Option<u32>,

    /// The socket owner's GID (outbound) [default: the --uid value]
    #[arg(long)]
    pub gid: Option<u32>,

    /// Source address
    #[arg(long)]
    pub src: Option<IpAddr>,

    /// Destination address (its family picks the IPv4 or IPv6 rules; IPv4 if none is given)
    #[arg(long)]
    pub dst: Option<IpAddr>,

    /// Source port
    #[arg(long)]
    pub sport: Option<u16>,

    /// Destination port
    #[arg(long)]
    pub dport: Option<u16>,

    /// Arrival interface (inbound) [default: eth0]
    #[arg(long = "in-iface", value_name = "IFACE")]
    pub in_iface: Option<String>,

    /// Departure interface (outbound) [default: lo for a loopback destination, else eth0]
    #[arg(long = "out-iface", value_name = "IFACE")]
    pub out_iface: Option<String>,

    /// The packet mark the connection starts with [default: 0]
    #[arg(long, value_parser = parse_mark)]
    pub mark: Option<u32>,

    /// Instead of tracing, compare what is installed with what these `remora capture` flags
    /// would install (all remaining arguments are those flags)
    #[arg(long, num_args = 0.., allow_hyphen_values = true, value_name = "FLAGS")]
    pub check: Option<Vec<String>>,
}

/// `--direction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DirectionArg {
    /// Opened by a local process.
    Outbound,
    /// Arriving on an interface.
    Inbound,
}

/// `--proto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtoArg(pub Proto);

impl Default for ProtoArg {
    fn default() -> Self {
        ProtoArg(Proto::Tcp)
    }
}

fn parse_proto(s: &str) -> Result<ProtoArg, String> {
    Proto::parse(s)
        .map(ProtoArg)
        .ok_or_else(|| format!("{s:?} is not tcp or udp"))
}

fn parse_mark(s: &str) -> Result<u32, String> {
    model::parse_u32(s).ok_or_else(|| format!("{s:?} is not a number"))
}

/// Why `explain` could not answer, or (with `--check`) found differences.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The rules file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Nothing could be read back from the machine.
    #[error("no capture rules could be read: {0}")]
    NothingInstalled(String),
    /// `--check` found differences (already printed).
    #[error("the installed rules differ from what these flags install ({0} chain(s))")]
    Differs(usize),
    /// The `--check` flags do not parse.
    #[error("--check flags: {0}")]
    CheckFlags(String),
}

impl ExplainArgs {
    /// The connection to trace, and what was assumed for what was not given.
    pub fn connection(&self) -> (Connection, Vec<String>) {
        let mut assumed = Vec::new();
        let direction = match self.direction {
            Some(DirectionArg::Inbound) => Direction::Inbound,
            _ => Direction::Outbound,
        };
        let gid = self.gid.or_else(|| {
            let uid = self.uid?;
            if direction == Direction::Outbound {
                assumed.push(format!("GID {uid}, the same as the UID (--gid)"));
            }
            Some(uid)
        });
        let (in_iface, out_iface) = match direction {
            Direction::Inbound => {
                let iface = self.in_iface.clone().unwrap_or_else(|| {
                    assumed.push("arrival on eth0 (--in-iface)".to_owned());
                    "eth0".to_owned()
                });
                (Some(iface), None)
            }
            Direction::Outbound => {
                // Traffic to one of this namespace's own addresses leaves on lo, as the
                // kernel routes it (the classic case: the proxy calling its own pod's IP).
                let local = self
                    .dst
                    .is_some_and(|d| d.is_loopback() || is_local_address(d));
                let iface = self.out_iface.clone().unwrap_or_else(|| {
                    let iface = if local { "lo" } else { "eth0" };
                    assumed.push(format!("departure on {iface} (--out-iface)"));
                    iface.to_owned()
                });
                (None, Some(iface))
            }
        };
        if self.dst.is_none() && self.src.is_none() {
            assumed.push("IPv4, since no address was given (--dst)".to_owned());
        }
        // To one of its own addresses, the kernel sends from that same address.
        let src = self.src.or_else(|| {
            let dst = self.dst.filter(|d| {
                direction == Direction::Outbound && !d.is_loopback() && is_local_address(*d)
            })?;
            assumed.push(format!("from {dst}, this namespace's own address (--src)"));
            Some(dst)
        });
        let conn = Connection {
            direction,
            proto: self.proto.0,
            src,
            dst: self.dst,
            sport: self.sport,
            dport: self.dport,
            uid: self.uid,
            gid,
            in_iface,
            out_iface,
            mark: self.mark.unwrap_or(0),
        };
        (conn, assumed)
    }
}

/// Reads rules from text: nft if it looks like nft, else iptables (`family` for text that
/// does not say).
pub fn parse_rules(text: &str, family: Family) -> Ruleset {
    if nft::looks_like_nft(text) {
        nft::parse(text)
    } else {
        iptables::parse(text, family)
    }
}

/// Runs `remora capture explain`; `parent` holds the `remora capture` flags given before
/// `explain` (for `--network-namespace`).
pub fn run(
    args: &ExplainArgs,
    parent: &CaptureArgs,
    env: &Environment,
) -> Result<(), CaptureError> {
    let options = RunOptions::resolve(parent, env)?;
    let runner = crate::system_runner(&options);
    if let Some(flags) = &args.check {
        return run_check(args, flags, &options, env, &runner);
    }
    let (conn, assumed) = args.connection();
    let (rules, source) = read_rules(args, conn.family(), &runner)?;
    println!("{}", describe_connection(&conn));
    if !assumed.is_empty() {
        println!("assumed: {}", assumed.join("; "));
    }
    println!("rules: {source}\n");
    print!("{}", trace::trace(&rules, &conn));
    Ok(())
}

fn describe_connection(conn: &Connection) -> String {
    let addr = |a: Option<IpAddr>, p: Option<u16>| {
        let a = a.map_or("?".to_owned(), |a| match a {
            IpAddr::V6(v6) => format!("[{v6}]"),
            v4 => v4.to_string(),
        });
        format!("{a}:{}", p.map_or("?".to_owned(), |p| p.to_string()))
    };
    let direction = match conn.direction {
        Direction::Outbound => "outbound",
        Direction::Inbound => "inbound",
    };
    let mut text = format!(
        "connection: {direction} {} {} -> {}",
        conn.proto.name(),
        addr(conn.src, conn.sport),
        addr(conn.dst, conn.dport)
    );
    if let Some(uid) = conn.uid {
        text.push_str(&format!(", UID {uid}"));
    }
    if let Some(gid) = conn.gid {
        text.push_str(&format!(", GID {gid}"));
    }
    for (what, iface) in [("in", &conn.in_iface), ("out", &conn.out_iface)] {
        if let Some(iface) = iface {
            text.push_str(&format!(", {what} {iface}"));
        }
    }
    text
}

/// The rules to trace: the file, or what is installed (both iptables flavours that hold
/// rules, for the connection's family, and Remora's nft tables).
fn read_rules(
    args: &ExplainArgs,
    family: Family,
    runner: &dyn Runner,
) -> Result<(Ruleset, String), CaptureError> {
    if let Some(path) = &args.rules {
        let text = std::fs::read_to_string(path).map_err(|source| ExplainError::Read {
            path: path.clone(),
            source,
        })?;
        return Ok((parse_rules(&text, family), path.display().to_string()));
    }
    let (rules, sources, failures) = installed(family, runner);
    if sources.is_empty() {
        return Err(ExplainError::NothingInstalled(failures.join("; ")).into());
    }
    Ok((rules, format!("installed ({})", sources.join(", "))))
}

/// Reads back what is installed. Read-only: only `*-save` and `nft list` run.
fn installed(family: Family, runner: &dyn Runner) -> (Ruleset, Vec<String>, Vec<String>) {
    let base = match family {
        Family::V4 => "iptables",
        Family::V6 => "ip6tables",
    };
    let (mut rules, mut sources, mut failures) = (Ruleset::default(), Vec::new(), Vec::new());
    for flavour in ["-legacy", "-nft", ""] {
        // The unsuffixed binaries are one of the two; read them only if neither ran.
        if flavour.is_empty() && (!sources.is_empty() || failures.len() < 2) {
            break;
        }
        let save = format!("{base}{flavour}-save");
        match runner.run(&save, &[], None) {
            Ok(text) if text.lines().any(|l| l.starts_with("-A ")) => {
                rules.tables.extend(iptables::parse(&text, family).tables);
                sources.push(save);
            }
            Ok(_) => {}
            Err(e) => failures.push(e.to_string()),
        }
    }
    match runner.run("nft", &["list", "ruleset"], None) {
        Ok(text) => {
            let ours = nft::parse(&text)
                .tables
                .into_iter()
                .filter(|t| t.name.starts_with("istio-proxy-"));
            let before = rules.tables.len();
            rules.tables.extend(ours);
            if rules.tables.len() > before {
                sources.push("nft istio-proxy-* tables".to_owned());
            }
        }
        Err(e) => failures.push(e.to_string()),
    }
    if sources.is_empty() && failures.is_empty() {
        failures.push("no rules are installed".to_owned());
    }
    (rules, sources, failures)
}

#[derive(Debug, Parser)]
#[command(name = "remora capture explain --check", no_binary_name = true)]
struct CheckFlags {
    #[command(flatten)]
    args: CaptureArgs,
}

fn run_check(
    args: &ExplainArgs,
    flags: &[String],
    options: &RunOptions,
    env: &Environment,
    runner: &dyn Runner,
) -> Result<(), CaptureError> {
    let wanted_args = CheckFlags::try_parse_from(flags)
        .map_err(|e| ExplainError::CheckFlags(e.to_string()))?
        .args;
    let wanted_options = RunOptions::resolve(&wanted_args, env)?;
    let config = match &options.network_namespace {
        Some(path) => {
            let pod = crate::pod_network::NetnsPodNetwork { path: path.clone() };
            crate::CaptureConfig::resolve(&wanted_args, env, &pod)?
        }
        None => crate::CaptureConfig::resolve(&wanted_args, env, &crate::SystemPodNetwork)?,
    };
    let mut diffs = Vec::new();
    if wanted_options.backend == Backend::Nftables {
        let wanted = nft::parse(&crate::nft::generate_nft(&config).script());
        let (installed, _) = read_rules(args, Family::V4, runner)?;
        diffs.extend(check::compare(&installed, &wanted));
    } else {
        let rules = crate::generate(&config);
        for (family, set) in rules.families() {
            let family = match family {
                crate::rules::Family::V4 => Family::V4,
                crate::rules::Family::V6 => Family::V6,
            };
            let wanted = iptables::parse(&set.restore_input(), family);
            let (mut installed, _) = read_rules(args, family, runner)?;
            installed.tables.retain(|t| t.family == Some(family));
            diffs.extend(check::compare(&installed, &wanted));
        }
    }
    print!("{}", check::render(&diffs));
    match diffs.iter().filter(|d| d.differs()).count() {
        0 => Ok(()),
        n => Err(ExplainError::Differs(n).into()),
    }
}

/// Whether `ip` is an address of this network namespace: only a local address can be bound
/// (without `ip_nonlocal_bind`, which pods do not set).
fn is_local_address(ip: std::net::IpAddr) -> bool {
    !ip.is_unspecified() && std::net::UdpSocket::bind((ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::flags::CaptureCommand;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: CaptureArgs,
    }

    fn explain(argv: &[&str]) -> (CaptureArgs, ExplainArgs) {
        let argv = ["capture"].into_iter().chain(argv.iter().copied());
        let args = Cli::try_parse_from(argv).expect("parses").args;
        match args.command.clone() {
            Some(CaptureCommand::Explain(e)) => (args, e),
            None => panic!("no subcommand"),
        }
    }

    #[test]
    fn only_an_address_of_this_namespace_is_local() {
        assert!(is_local_address("127.0.0.1".parse().unwrap()));
        // TEST-NET-3: for documentation, and not an address of the test machine.
        assert!(!is_local_address("203.0.113.77".parse().unwrap()));
        assert!(!is_local_address("0.0.0.0".parse().unwrap()));
    }

    #[test]
    fn trace_flags_and_defaults() {
        let (_, e) = explain(&[
            "explain",
            "--direction",
            "outbound",
            "--uid",
            "1000",
            "--dst",
            "10.0.0.1",
            "--dport",
            "80",
        ]);
        let (conn, assumed) = e.connection();
        assert_eq!(conn.direction, Direction::Outbound);
        assert_eq!((conn.uid, conn.gid), (Some(1000), Some(1000)));
        assert_eq!(conn.out_iface.as_deref(), Some("eth0"));
        assert_eq!(assumed.len(), 2, "{assumed:?}");
        let (_, e) = explain(&[
            "explain",
            "--direction=inbound",
            "--dport=8080",
            "--proto=udp",
            "--mark=0x539",
        ]);
        let (conn, _) = e.connection();
        assert_eq!((conn.proto, conn.mark), (Proto::Udp, 0x539));
        assert_eq!(conn.in_iface.as_deref(), Some("eth0"));
        let argv = ["capture", "explain", "--dport", "80"];
        assert!(
            Cli::try_parse_from(argv).is_err(),
            "--direction is required"
        );
    }

    #[test]
    fn check_takes_the_remaining_arguments_as_capture_flags() {
        let (parent, e) = explain(&[
            "--network-namespace=/x",
            "explain",
            "--check",
            "-p",
            "15001",
            "-b",
            "*",
            "--native-nftables",
        ]);
        assert_eq!(parent.network_namespace.as_deref(), Some("/x"));
        let flags = e.check.unwrap();
        assert_eq!(flags, ["-p", "15001", "-b", "*", "--native-nftables"]);
        let parsed = CheckFlags::try_parse_from(&flags).unwrap().args;
        assert_eq!(parsed.inbound_ports.as_deref(), Some("*"));
        assert_eq!(parsed.native_nftables, Some(true));
    }
}
