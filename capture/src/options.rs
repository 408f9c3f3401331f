//! How `remora capture` runs, as opposed to what rules it writes ([`crate::model`]): the
//! backend, re-run behaviour, namespace, validation. Resolved from flags and their
//! environment variables exactly like the rule inputs: flag, else variable, else default.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::FlagError;
use crate::flags::{flag_or_env, var, Action, CaptureArgs, Environment};

/// The port the validation dials when `--iptables-probe-port` is not given.
pub const DEFAULT_PROBE_PORT: u16 = 15002;
/// How long the validation waits when `--probe-timeout` is not given.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Which rule backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// iptables, with the binaries chosen by detection or forced.
    Iptables(Option<ForcedBinary>),
    /// Native nftables (`--native-nftables`).
    Nftables,
}

/// `--force-iptables-binary`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForcedBinary {
    /// `iptables-legacy*`.
    Legacy,
    /// `iptables-nft*`.
    Nft,
}

/// Everything about a run that is not a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// Print, install or remove.
    pub action: Action,
    /// iptables (which binaries) or nftables.
    pub backend: Backend,
    /// Replace drifted rules instead of failing.
    pub reconcile: bool,
    /// Rewrite rules even when they look installed.
    pub force_apply: bool,
    /// Install nothing.
    pub skip_rule_apply: bool,
    /// Validate the redirect after installing.
    pub run_validation: bool,
    /// The port the validation dials.
    pub probe_port: u16,
    /// How long validation may take.
    pub probe_timeout: Duration,
    /// Work inside this network namespace.
    pub network_namespace: Option<PathBuf>,
    /// Running from a CNI plugin on the host.
    pub cni_mode: bool,
}

impl RunOptions {
    /// Resolves the run options from the flags and the environment.
    pub fn resolve(args: &CaptureArgs, env: &Environment) -> Result<RunOptions, FlagError> {
        let text = |flag: &Option<String>, name: &'static str| -> Option<(String, &'static str)> {
            match flag {
                Some(v) => Some((v.clone(), "")),
                None => env.get(name).map(|v| (v.to_owned(), name)),
            }
        };
        let forced = match text(&args.force_iptables_binary, var::FORCE_IPTABLES_BINARY) {
            None => None,
            Some((v, _)) if v.is_empty() => None,
            Some((v, _)) if v == "legacy" => Some(ForcedBinary::Legacy),
            Some((v, _)) if v == "nft" => Some(ForcedBinary::Nft),
            Some((v, source)) => {
                let flag = if source.is_empty() {
                    "--force-iptables-binary"
                } else {
                    source
                };
                return Err(FlagError::new(flag, &v, "expected legacy or nft"));
            }
        };
        let native = flag_or_env(args.native_nftables, env, &[var::NATIVE_NFTABLES]);
        let backend = if native {
            Backend::Nftables
        } else {
            Backend::Iptables(forced)
        };

        // istio-iptables ignores a variable it cannot parse (and keeps the default), but
        // rejects a bad flag; so do we, with a warning for the variable.
        let probe_port = match text(&args.iptables_probe_port, var::IPTABLES_PROBE_PORT) {
            None => DEFAULT_PROBE_PORT,
            Some((v, source)) => match (v.parse::<u16>(), source) {
                (Ok(port), _) => port,
                (Err(_), "") => {
                    let reason = "expected a port number in 0..=65535";
                    return Err(FlagError::new("--iptables-probe-port", &v, reason));
                }
                (Err(_), name) => {
                    tracing::warn!(variable = name, value = v, "ignoring non-numeric value");
                    DEFAULT_PROBE_PORT
                }
            },
        };
        let probe_timeout = match text(&args.probe_timeout, var::PROBE_TIMEOUT) {
            None => DEFAULT_PROBE_TIMEOUT,
            Some((v, source)) => match (parse_go_duration(&v), source) {
                (Ok(d), _) => d,
                (Err(reason), "") => return Err(FlagError::new("--probe-timeout", &v, reason)),
                (Err(reason), name) => {
                    tracing::warn!(variable = name, value = v, reason, "ignoring bad duration");
                    DEFAULT_PROBE_TIMEOUT
                }
            },
        };
        let network_namespace = text(&args.network_namespace, var::NETWORK_NAMESPACE)
            .map(|(v, _)| v)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);

        Ok(RunOptions {
            action: args.action(env),
            backend,
            reconcile: flag_or_env(args.reconcile, env, &[var::RECONCILE]),
            force_apply: flag_or_env(args.force_apply, env, &[var::FORCE_APPLY]),
            skip_rule_apply: flag_or_env(args.skip_rule_apply, env, &[var::SKIP_RULE_APPLY]),
            run_validation: flag_or_env(args.run_validation, env, &[var::RUN_VALIDATION]),
            probe_port,
            probe_timeout,
            network_namespace,
            cni_mode: flag_or_env(args.cni_mode, env, &[var::CNI_MODE]),
        })
    }
}

/// Parses a duration as Go's `time.ParseDuration` does (what istio-iptables uses for
/// `--probe-timeout`): a sequence of decimal numbers, each with an optional fraction and a
/// unit (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), or a bare `0`. Negative durations are
/// rejected, since a timeout cannot be negative.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration (e.g. 5s, 500ms, 1m30s)");
    let rest = text.strip_prefix('+').unwrap_or(text);
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() || rest.starts_with('-') {
        return Err(bad());
    }
    let mut total = 0f64;
    let mut rest = rest;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (number, tail) = rest.split_at(number_len);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(bad());
        }
        let value: f64 = number.parse().map_err(|_| bad())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let nanos_per_unit = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(bad()),
        };
        total += value * nanos_per_unit;
        rest = tail;
    }
    // Go caps durations at about 292 years; anything near that is a typo anyway.
    if !total.is_finite() || total > 1e18 {
        return Err(bad());
    }
    Ok(Duration::from_nanos(total.round() as u64))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: CaptureArgs,
    }

    fn resolve(argv: &[&str], env: &[(&str, &str)]) -> Result<RunOptions, FlagError> {
        let argv = std::iter::once("capture").chain(argv.iter().copied());
        let args = Cli::try_parse_from(argv).expect("flags parse").args;
        RunOptions::resolve(&args, &Environment::from_pairs(env.iter().copied()))
    }

    #[test]
    fn defaults_match_istio_iptables() {
        let o = resolve(&[], &[]).unwrap();
        assert_eq!(o.action, Action::Apply);
        assert_eq!(o.backend, Backend::Iptables(None));
        assert!(!o.reconcile && !o.force_apply && !o.skip_rule_apply && !o.run_validation);
        assert_eq!(o.probe_port, 15002);
        assert_eq!(o.probe_timeout, Duration::from_secs(5));
        assert_eq!(o.network_namespace, None);
        assert!(!o.cni_mode);
    }

    #[test]
    fn flags_are_read() {
        let o = resolve(
            &[
                "--native-nftables",
                "--reconcile",
                "--force-apply",
                "--skip-rule-apply",
                "--run-validation",
                "--iptables-probe-port=16000",
                "--probe-timeout=1m30s",
                "--network-namespace=/var/run/netns/pod",
                "--cni-mode",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(o.backend, Backend::Nftables);
        assert!(o.reconcile && o.force_apply && o.skip_rule_apply && o.run_validation);
        assert_eq!(o.probe_port, 16000);
        assert_eq!(o.probe_timeout, Duration::from_secs(90));
        assert_eq!(
            o.network_namespace.as_deref(),
            Some(std::path::Path::new("/var/run/netns/pod"))
        );
        assert!(o.cni_mode);
    }

    #[test]
    fn variables_stand_in_for_flags_as_istio_binds_them() {
        let env = [
            ("NATIVE_NFTABLES", "false"),
            ("FORCE_IPTABLES_BINARY", "legacy"),
            ("RECONCILE", "true"),
            ("FORCE_APPLY", "1"),
            ("SKIP_RULE_APPLY", "T"),
            ("RUN_VALIDATION", "true"),
            ("IPTABLES_PROBE_PORT", "15099"),
            ("PROBE_TIMEOUT", "250ms"),
            ("NETWORK_NAMESPACE", "/proc/1/ns/net"),
            ("CNI_MODE", "true"),
        ];
        let o = resolve(&[], &env).unwrap();
        assert_eq!(o.backend, Backend::Iptables(Some(ForcedBinary::Legacy)));
        assert!(o.reconcile && o.force_apply && o.skip_rule_apply && o.run_validation);
        assert_eq!(o.probe_port, 15099);
        assert_eq!(o.probe_timeout, Duration::from_millis(250));
        assert!(o.cni_mode);
        // The flag wins over the variable.
        let o = resolve(&["--force-iptables-binary=nft", "--reconcile=false"], &env).unwrap();
        assert_eq!(o.backend, Backend::Iptables(Some(ForcedBinary::Nft)));
        assert!(!o.reconcile);
    }

    #[test]
    fn bad_values_in_flags_fail_and_in_variables_are_ignored() {
        let err = resolve(&["--force-iptables-binary=iptables"], &[]).unwrap_err();
        assert_eq!(err.flag, "--force-iptables-binary");
        let err = resolve(&[], &[("FORCE_IPTABLES_BINARY", "x")]).unwrap_err();
        assert_eq!(err.flag, "FORCE_IPTABLES_BINARY");
        assert!(resolve(&["--iptables-probe-port=70000"], &[]).is_err());
        assert!(resolve(&["--probe-timeout=5"], &[]).is_err());
        let env = [("IPTABLES_PROBE_PORT", "x"), ("PROBE_TIMEOUT", "soon")];
        let o = resolve(&[], &env).unwrap();
        assert_eq!(
            (o.probe_port, o.probe_timeout),
            (15002, Duration::from_secs(5))
        );
    }

    #[test]
    fn go_durations() {
        let ok = |s: &str| parse_go_duration(s).unwrap();
        assert_eq!(ok("5s"), Duration::from_secs(5));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("1h2m3s"), Duration::from_secs(3723));
        assert_eq!(ok("300ms"), Duration::from_millis(300));
        assert_eq!(ok("10us"), Duration::from_micros(10));
        assert_eq!(ok("+2m"), Duration::from_secs(120));
        for bad in ["", "5", "s", "-1s", "1x", "1..2s", ".s", "1s2"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }
}
