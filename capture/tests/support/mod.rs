//! Shared by the integration tests: reading conformance cases, resolving flags the way the
//! cases give them, and network namespaces that clean up after themselves.

// Each test file uses its own subset of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use remora_capture::{
    CaptureArgs, CaptureConfig, CaptureError, Environment, PodNetwork, Runner, SystemRunner,
};

#[derive(Debug, Parser)]
pub struct Cli {
    #[command(flatten)]
    pub args: CaptureArgs,
}

/// Whether the tests run under CI, where a skipped test is a failure.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Skips (returns `None` after saying why) outside CI; fails under CI.
pub fn skip_or_fail<T>(what: &str, reason: &str) -> Option<T> {
    if in_ci() {
        panic!("{what} cannot run under CI: {reason}");
    }
    eprintln!("skipping {what}: {reason}");
    None
}

/// A pod that is IPv4 and whose resolv.conf must not be needed.
pub struct NoDiscovery;

impl PodNetwork for NoDiscovery {
    fn is_ipv6(&self, _dual_stack: bool) -> Result<bool, CaptureError> {
        Ok(false)
    }

    fn nameservers(&self) -> Result<Vec<String>, CaptureError> {
        panic!("resolv.conf consulted although the flags give --dns-servers");
    }
}

/// A conformance folder under `shared/conformance/`, or `None` (after saying why) when it is
/// absent outside CI. `REMORA_CONFORMANCE_DIR` points at the iptables folder; the others are
/// its siblings.
pub fn cases_dir(folder: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os("REMORA_CONFORMANCE_DIR") {
        Some(dir) if folder == "capture" => PathBuf::from(dir),
        Some(dir) => PathBuf::from(dir).join("..").join(folder),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/conformance")
            .join(folder),
    };
    if dir.is_dir() {
        return Some(dir);
    }
    let reason = format!(
        "conformance cases not found at {} (set REMORA_CONFORMANCE_DIR)",
        dir.display()
    );
    skip_or_fail("conformance test", &reason)
}

/// The inputs of a case: its flags (with the pod facts turned into `--assume-ipv6` and
/// `--dns-servers`) and its environment.
pub struct CaseInput {
    pub argv: Vec<String>,
    pub env: Environment,
}

/// Reads `<case>.args` (see the conformance READMEs for the format).
pub fn read_case_args(dir: &Path, case: &str) -> Result<CaseInput, String> {
    let path = dir.join(format!("{case}.args"));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = text.lines();
    let flags = lines.next().ok_or("empty .args")?;
    let mut argv = shlex::split(flags).ok_or("line 1 is not valid shell words")?;
    let mut env = Vec::new();
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        match key {
            "env" => {
                let (name, value) = value.split_once('=').ok_or("env line without '='")?;
                env.push((name.to_owned(), value.to_owned()));
            }
            "ipv6" if value == "true" => argv.push("--assume-ipv6".to_owned()),
            "dns-servers" => argv.push(format!("--dns-servers={value}")),
            _ => return Err(format!("unknown .args line {line:?}")),
        }
    }
    Ok(CaseInput {
        argv,
        env: Environment::from_pairs(env),
    })
}

/// Parses `remora capture` flags.
pub fn parse_args<S: AsRef<str>>(argv: &[S]) -> Result<CaptureArgs, String> {
    let argv = std::iter::once("capture").chain(argv.iter().map(AsRef::as_ref));
    Cli::try_parse_from(argv)
        .map(|cli| cli.args)
        .map_err(|e| format!("flags: {e}"))
}

/// Resolves a case's inputs into the generator's config.
pub fn case_config(input: &CaseInput) -> Result<CaptureConfig, String> {
    let args = parse_args(&input.argv)?;
    CaptureConfig::resolve(&args, &input.env, &NoDiscovery).map_err(|e| e.to_string())
}

/// A line-by-line report of where two texts differ.
pub fn diff(expected: &str, actual: &str) -> String {
    let (e, a): (Vec<_>, Vec<_>) = (expected.lines().collect(), actual.lines().collect());
    let mut out = String::new();
    for i in 0..e.len().max(a.len()) {
        let (el, al) = (e.get(i).copied(), a.get(i).copied());
        if el != al {
            out.push_str(&format!(
                "line {}:\n  expected: {}\n  actual:   {}\n",
                i + 1,
                el.unwrap_or("<none>"),
                al.unwrap_or("<none>")
            ));
        }
    }
    if out.is_empty() && expected != actual {
        out.push_str("texts differ only in line endings or a final newline\n");
    }
    out
}

/// The case names (files `<name>.<ext>`) in a folder, sorted.
pub fn case_names(dir: &Path, ext: &str) -> Vec<String> {
    let suffix = format!(".{ext}");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read conformance dir")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(&suffix).map(str::to_owned)
        })
        .collect();
    names.sort();
    names
}

/// A network namespace created for one test and deleted when dropped, so that rules are
/// never written into the machine's own namespace.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Creates `remora-<tag>-<pid>` with `lo` up, after checking that the tools the tests
    /// need (`ip`, and each of `tools` run as `tool --version` or similar) work in it.
    pub fn create(tag: &str, tools: &[&[&str]]) -> Result<Netns, String> {
        let name = format!("remora-{tag}-{}", std::process::id());
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .map_err(|e| format!("cannot run `ip`: {e}"))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(format!(
                "`ip netns add {name}` failed (root needed?): {}",
                stderr.trim()
            ));
        }
        let ns = Netns { name };
        // Pods have lo up; TPROXY's local route and loopback connections need it.
        ns.runner()
            .run("ip", &["link", "set", "lo", "up"], None)
            .map_err(|e| e.to_string())?;
        for tool in tools {
            ns.runner()
                .run(tool[0], &tool[1..], None)
                .map_err(|e| e.to_string())?;
        }
        Ok(ns)
    }

    /// Creates a namespace, or skips (outside CI) / fails (under CI) with the reason.
    pub fn create_or_skip(tag: &str, tools: &[&[&str]]) -> Option<Netns> {
        match Netns::create(tag, tools) {
            Ok(ns) => Some(ns),
            Err(reason) => skip_or_fail("network-namespace test", &reason),
        }
    }

    /// Runs commands inside the namespace.
    pub fn runner(&self) -> SystemRunner {
        SystemRunner::in_netns(&self.name)
    }

    /// The namespace's path, for `--network-namespace`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Produces a case's (actual output, expected golden text), or why it could not.
pub type RunCase = fn(&Path, &str) -> Result<(String, String), String>;

/// Assert that `run` reproduces the golden `<case>.<ext>` of `folder` byte for byte; on a
/// difference, panic naming the case with a line diff. Skips (or fails under CI) without the
/// shared folder.
pub fn assert_golden(folder: &str, ext: &str, case: &str, run: RunCase) {
    let Some(dir) = cases_dir(folder) else {
        return;
    };
    match run(&dir, case) {
        Ok((actual, expected)) if actual == expected => {}
        Ok((actual, expected)) => panic!(
            "case {case}: dry-run output differs from {case}.{ext}\n{}\n--- actual output ---\n{actual}",
            diff(&expected, &actual)
        ),
        Err(e) => panic!("case {case}: {e}"),
    }
}
