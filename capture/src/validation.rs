//! `--run-validation`: proves that the installed rules redirect, the way istio-iptables'
//! validation does, so that a pod whose capture is missing (say, a CNI plugin that had not
//! run yet) fails its init container instead of starting with its traffic uncaptured.
//!
//! Listen on loopback at the outbound and inbound capture ports, dial 127.0.0.6 (or `::6`)
//! at the probe port from 127.0.0.1 (or `::1`) as the proxy's UID, and wait for a
//! connection whose original destination (`SO_ORIGINAL_DST`) is that probe port: the rule
//! that sends the proxy's loopback connections to the inbound port must have fired. Nothing
//! is written, so no NET_ADMIN is needed; dialing as the proxy's UID from another UID needs
//! root (it uses the thread's filesystem UID, which is what owner matches look at).
//!
//! Failure is [`ValidationError`], which the binary turns into exit status [`EXIT_CODE`].

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::unistd::{Gid, Uid};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::error::CaptureError;
use crate::model::CaptureConfig;
use crate::options::RunOptions;

/// The exit status istio-iptables uses for a failed validation.
pub const EXIT_CODE: u8 = 126;
/// Pause between dial attempts: rules installed by a CNI plugin may still be arriving.
const RETRY_INTERVAL: Duration = Duration::from_millis(250);
/// How often the listeners are polled for a redirected connection.
const ACCEPT_POLL: Duration = Duration::from_millis(5);

/// Validation found that connections are not redirected.
#[derive(Debug, thiserror::Error)]
#[error(
    "iptables validation failed; workload is not ready for Istio.\n\
     When using Istio CNI, this can occur if a pod is scheduled before the node is ready.\n\
     If installed with 'cni.repair.deletePods=true', this pod should automatically be deleted \
     and retry.\nOtherwise, this pod will need to be manually removed so that it is scheduled \
     on a node with istio-cni running, allowing iptables rules to be established.\n\
     Cause: {reason}"
)]
pub struct ValidationError {
    /// What was observed.
    pub reason: String,
}

/// What to listen on and what to dial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationProbe {
    /// Loopback addresses on the capture ports.
    pub listen: Vec<SocketAddr>,
    /// Where the client binds (loopback, any port).
    pub source: SocketAddr,
    /// What the client dials: 127.0.0.6 or ::6 at the probe port.
    pub target: SocketAddr,
    /// The UID and GID to dial as, when they are numeric.
    pub dial_as: Option<(u32, u32)>,
    /// How long to keep trying.
    pub timeout: Duration,
}

impl ValidationProbe {
    /// The probe istio-iptables would run for this configuration.
    pub fn new(cfg: &CaptureConfig, options: &RunOptions) -> ValidationProbe {
        let (local, passthrough) = if cfg.ipv6 {
            (
                Ipv6Addr::LOCALHOST.into(),
                Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6).into(),
            )
        } else {
            (
                Ipv4Addr::LOCALHOST.into(),
                Ipv4Addr::new(127, 0, 0, 6).into(),
            )
        };
        let ports = [&cfg.proxy_port, &cfg.inbound_capture_port];
        let listen = ports
            .iter()
            .filter_map(|p| p.parse::<u16>().ok())
            .map(|port| SocketAddr::new(local, port))
            .collect();
        let uid = cfg.proxy_uids.first().and_then(|u| u.parse().ok());
        let gid = cfg.proxy_gids.first().and_then(|g| g.parse().ok());
        ValidationProbe {
            listen,
            source: SocketAddr::new(local, 0),
            target: SocketAddr::new(passthrough, options.probe_port),
            dial_as: uid.map(|uid| (uid, gid.unwrap_or(uid))),
            timeout: options.probe_timeout,
        }
    }
}

/// Runs the probe, inside `netns` when given.
pub fn validate(probe: &ValidationProbe, netns: Option<&Path>) -> Result<(), CaptureError> {
    tracing::info!(
        target = %probe.target,
        listen = ?probe.listen,
        "validating that connections are redirected"
    );
    crate::netns::run_in(netns, || run_probe(probe))??;
    tracing::info!("validation passed: connections are redirected");
    Ok(())
}

fn run_probe(probe: &ValidationProbe) -> Result<(), ValidationError> {
    let fail = |reason: String| ValidationError { reason };
    let mut listeners = Vec::new();
    let mut bind_errors = Vec::new();
    for addr in &probe.listen {
        match listen(*addr) {
            Ok(l) => listeners.push(l),
            Err(e) => bind_errors.push(format!("{addr}: {e}")),
        }
    }
    if listeners.is_empty() {
        return Err(fail(format!(
            "no listener available ({})",
            bind_errors.join("; ")
        )));
    }
    let deadline = Instant::now() + probe.timeout;
    let mut last = String::from("no attempt was made before the timeout");
    while Instant::now() < deadline {
        match dial(probe, deadline) {
            Ok(_client) => {
                // Connected: to one of our listeners if redirected, to anything else if not.
                match accept_redirected(&listeners, probe, deadline) {
                    Ok(()) => return Ok(()),
                    Err(e) => last = e,
                }
            }
            Err(e) => {
                last = format!(
                    "connecting to {} failed ({e}): it was not redirected to {}",
                    probe.target,
                    list(&probe.listen)
                )
            }
        }
        std::thread::sleep(RETRY_INTERVAL.min(deadline.saturating_duration_since(Instant::now())));
    }
    Err(fail(format!("{last} (gave up after {:?})", probe.timeout)))
}

fn list(addrs: &[SocketAddr]) -> String {
    let names: Vec<String> = addrs.iter().map(SocketAddr::to_string).collect();
    names.join(" or ")
}

fn listen(addr: SocketAddr) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // As istio-iptables does, share the ports with anything already bound there.
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(16)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// Connects as the proxy: the owner matches read the socket's creator's filesystem IDs,
/// which `setfsuid`/`setfsgid` change for this thread only (and which are restored after).
fn dial(probe: &ValidationProbe, deadline: Instant) -> io::Result<Socket> {
    let previous = probe.dial_as.map(|(uid, gid)| {
        let old_gid = nix::unistd::setfsgid(Gid::from_raw(gid));
        let old_uid = nix::unistd::setfsuid(Uid::from_raw(uid));
        // The calls return the old ID even when refused; asking again reveals the outcome.
        let now = nix::unistd::setfsuid(Uid::from_raw(uid));
        if now.as_raw() != uid {
            tracing::warn!(
                uid,
                "cannot dial as the proxy UID (not root?); the rules may not redirect this UID"
            );
        }
        (old_uid, old_gid)
    });
    let socket = Socket::new(
        Domain::for_address(probe.target),
        Type::STREAM,
        Some(Protocol::TCP),
    );
    if let Some((uid, gid)) = previous {
        nix::unistd::setfsuid(uid);
        nix::unistd::setfsgid(gid);
    }
    let socket = socket?;
    socket.bind(&probe.source.into())?;
    let timeout = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    socket.connect_timeout(&probe.target.into(), timeout)?;
    Ok(socket)
}

/// Waits for the dialed connection on a listener and checks where it was headed.
fn accept_redirected(
    listeners: &[Socket],
    probe: &ValidationProbe,
    deadline: Instant,
) -> Result<(), String> {
    loop {
        for listener in listeners {
            match listener.accept() {
                Ok((conn, peer)) => {
                    let original = original_dst(&conn, probe.target.is_ipv6());
                    match original {
                        Ok(dst) if dst.port() == probe.target.port() => return Ok(()),
                        // Someone else's connection; keep waiting for ours.
                        Ok(dst) => {
                            tracing::debug!(?peer, %dst, "ignoring unrelated connection")
                        }
                        Err(e) => {
                            return Err(format!(
                                "a connection reached {} but its original destination is \
                                 unknown ({e})",
                                list(&probe.listen)
                            ))
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(format!("accepting failed: {e}")),
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "connected to {} but not through a redirect to {}: another socket answered",
                probe.target,
                list(&probe.listen)
            ));
        }
        std::thread::sleep(ACCEPT_POLL);
    }
}

fn original_dst(conn: &Socket, ipv6: bool) -> io::Result<SocketAddr> {
    let addr: SockAddr = if ipv6 {
        conn.original_dst_v6()?
    } else {
        conn.original_dst_v4()?
    };
    addr.as_socket()
        .ok_or_else(|| io::Error::other("not an IP address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(timeout: Duration) -> ValidationProbe {
        ValidationProbe {
            listen: vec![SocketAddr::from((Ipv4Addr::LOCALHOST, 0))],
            source: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            target: SocketAddr::from((Ipv4Addr::new(127, 0, 0, 6), 1)),
            dial_as: None,
            timeout,
        }
    }

    #[test]
    fn probe_matches_istio() {
        let cfg = crate::test_support::config(&["-p", "15001", "-z", "15006"]);
        let options = crate::options::RunOptions::resolve(
            &Default::default(),
            &crate::Environment::default(),
        )
        .unwrap();
        let p = ValidationProbe::new(&cfg, &options);
        assert_eq!(p.target, "127.0.0.6:15002".parse().unwrap());
        assert_eq!(p.source, "127.0.0.1:0".parse().unwrap());
        assert_eq!(
            p.listen,
            [
                "127.0.0.1:15001".parse().unwrap(),
                "127.0.0.1:15006".parse().unwrap()
            ]
        );
        assert_eq!(p.dial_as, Some((1337, 1337)));
        let v6 = CaptureConfig { ipv6: true, ..cfg };
        let p = ValidationProbe::new(&v6, &options);
        assert_eq!(p.target, "[::6]:15002".parse().unwrap());
        assert_eq!(p.listen[1], "[::1]:15006".parse().unwrap());
    }

    /// In this process's namespace nothing redirects (and port 1 on 127.0.0.6 refuses), so
    /// validation must fail, quickly and with the reason. Only loopback is touched.
    #[test]
    fn without_rules_validation_fails_with_the_reason() {
        let err = run_probe(&probe(Duration::from_millis(300))).unwrap_err();
        assert!(err.reason.contains("127.0.0.6:1"), "{}", err.reason);
        assert!(err.to_string().contains("workload is not ready"), "{err}");
        let err = CaptureError::from(err);
        assert_eq!(err.exit_code(), 126);
    }
}
