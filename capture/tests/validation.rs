//! `--run-validation` against real rules, inside network namespaces created for the test:
//! with the capture rules installed (iptables or nftables) the probe is redirected and
//! validation passes; without them it fails with exit status 126.
//!
//! Needs root (to enter the namespace and dial as the proxy's UID), iproute2, iptables and
//! nftables; skipped with a message without them, except under CI=true.

mod support;

use std::time::Duration;

use remora_capture::options::RunOptions;
use remora_capture::validation::{validate, ValidationProbe};
use remora_capture::{apply_rules, system_runner, Action, CaptureConfig, Environment};
use support::{parse_args, Netns, NoDiscovery};

fn resolve(ns: &Netns, flags: &str) -> (CaptureConfig, RunOptions) {
    let mut argv = shlex::split(flags).expect("shell words");
    argv.push(format!("--network-namespace={}", ns.path().display()));
    argv.push("--probe-timeout=3s".to_owned());
    let args = parse_args(&argv).expect("flags parse");
    let env = Environment::default();
    let options = RunOptions::resolve(&args, &env).expect("options resolve");
    let config = CaptureConfig::resolve(&args, &env, &NoDiscovery).expect("config resolves");
    (config, options)
}

fn passes_with_rules_and_fails_without(tag: &str, flags: &str, tools: &[&[&str]]) {
    let Some(ns) = Netns::create_or_skip(tag, tools) else {
        return;
    };
    let (config, options) = resolve(&ns, flags);
    let probe = ValidationProbe::new(&config, &options);
    let path = ns.path();

    let err = validate(
        &ValidationProbe {
            timeout: Duration::from_millis(500),
            ..probe.clone()
        },
        Some(&path),
    )
    .expect_err("nothing redirects yet");
    assert_eq!(err.exit_code(), 126, "{err}");
    let target = probe.target.to_string();
    assert!(err.to_string().contains(&target), "{err}");

    apply_rules(&config, &options, &system_runner(&options)).expect("install");
    validate(&probe, Some(&path)).expect("redirected once the rules are in");

    let cleanup = RunOptions {
        action: Action::CleanupOnly,
        ..options.clone()
    };
    apply_rules(&config, &cleanup, &system_runner(&options)).expect("cleanup");
    let err = validate(
        &ValidationProbe {
            timeout: Duration::from_millis(500),
            ..probe
        },
        Some(&path),
    )
    .expect_err("rules gone");
    assert_eq!(err.exit_code(), 126);
}

#[test]
fn validation_with_iptables() {
    passes_with_rules_and_fails_without("cap-val-ipt", "-b '*' -i '*'", &[&["iptables-save"]]);
}

#[test]
fn validation_with_native_nftables() {
    passes_with_rules_and_fails_without(
        "cap-val-nft",
        "--native-nftables -b '*' -i '*'",
        &[&["nft", "list", "ruleset"]],
    );
}

#[test]
fn validation_with_ipv6() {
    // An IPv6 pod: the probe listens on ::1 and dials ::6, which host_net puts on lo.
    passes_with_rules_and_fails_without(
        "cap-val-v6",
        "-b '*' -i '*' --assume-ipv6",
        &[&["ip6tables-save"]],
    );
}
