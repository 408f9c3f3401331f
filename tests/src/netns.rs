//! Network namespaces: one [`Netns`] per namespace, and the [`PodNet`] pair a test runs in.

use crate::environment;
use crate::process::{run_bounded, RemoraBinary, RemoraCommand};
use nix::sched::CloneFlags;
use std::ffi::OsStr;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Bound on one `ip` or `iptables` command; they normally take milliseconds.
const SETUP_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Counter that makes namespace names and subnets unique within the test process.
static NEXT_NET: AtomicU32 = AtomicU32::new(0);

/// A named network namespace (`ip netns add`), deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Create the namespace and bring its `lo` up (Remora's inbound hop comes from 127.0.0.6).
    pub fn create(name: &str) -> io::Result<Netns> {
        ip(&["netns", "add", name])?;
        // From here on, drop deletes the namespace even if the next step fails.
        let ns = Netns {
            name: name.to_string(),
        };
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name, as `ip netns` knows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Give the namespace a default route out of its veth, so a connect to a VIP (an address
    /// that exists only in the proxy's resources) reaches the capture rules.
    pub fn route_vips(&self) {
        let out = self
            .command("ip")
            .args(["route", "add", "default", "dev", "eth0"])
            .output()
            .expect("ip route");
        assert!(out.status.success(), "{out:?}");
    }

    /// `ip netns exec NAME program`: a command that runs inside the namespace.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Run `f` on a thread that has joined this namespace. Sockets created by `f` stay in the
    /// namespace, so the caller may use them from any thread afterwards.
    pub fn enter<T, F>(&self, f: F) -> io::Result<T>
    where
        F: FnOnce() -> io::Result<T> + Send,
        T: Send,
    {
        let path = self.path();
        std::thread::scope(|scope| {
            let thread = scope.spawn(move || {
                let file = std::fs::File::open(&path)?;
                nix::sched::setns(file, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
                f()
            });
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// A TCP listener bound inside the namespace.
    pub fn bind(&self, addr: SocketAddr) -> io::Result<TcpListener> {
        self.enter(|| TcpListener::bind(addr))
    }

    /// A TCP connection made from inside the namespace, as root: the capture rules apply to it.
    pub fn connect(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        self.enter(|| TcpStream::connect_timeout(&addr, timeout))
    }

    fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!(
                "warning: could not delete network namespace {}: {e}",
                self.name
            );
        }
    }
}

/// A pod namespace and a peer namespace joined by a veth pair (`eth0` on both sides), with the
/// `remora` binary installed where UID 1337 can run it.
///
/// Field order is drop order: the namespaces go before the binary's directory.
#[derive(Debug)]
pub struct PodNet {
    /// Where Remora, the application and the capture rules live.
    pub pod: Netns,
    /// The rest of the world: servers the pod calls, clients that call the pod.
    pub peer: Netns,
    /// The pod's address on the veth pair.
    pub pod_ip: Ipv4Addr,
    /// The peer's address on the veth pair.
    pub peer_ip: Ipv4Addr,
    binary: RemoraBinary,
}

impl PodNet {
    /// Build the pair, or skip the test (`None`) when this machine cannot; under `CI=true` a
    /// machine that cannot is a failure.
    pub fn create_or_skip() -> Option<PodNet> {
        if let Some(reason) = environment::missing_capability() {
            return environment::skip(&reason);
        }
        let binary = RemoraBinary::install();
        match PodNet::create(binary) {
            Ok(net) => Some(net),
            Err(e) => environment::skip(&format!("cannot create network namespaces: {e}")),
        }
    }

    fn create(binary: RemoraBinary) -> io::Result<PodNet> {
        let n = NEXT_NET.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("remora-e2e-{}-{n}", std::process::id());
        let pod = Netns::create(&format!("{prefix}-pod"))?;
        let peer = Netns::create(&format!("{prefix}-peer"))?;
        // 198.18.0.0/15 is reserved for benchmarking; each pair gets its own /24 in it.
        let (second, third) = (18 + (n / 256) % 2, n % 256);
        let pod_ip = Ipv4Addr::new(198, second as u8, third as u8, 1);
        let peer_ip = Ipv4Addr::new(198, second as u8, third as u8, 2);
        // Created straight inside the namespaces, so no name is ever taken in the root one.
        ip(&[
            "link",
            "add",
            "eth0",
            "netns",
            pod.name(),
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            peer.name(),
        ])?;
        for (ns, addr) in [(&pod, pod_ip), (&peer, peer_ip)] {
            ip(&[
                "-n",
                ns.name(),
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", ns.name(), "link", "set", "eth0", "up"])?;
        }
        Ok(PodNet {
            pod,
            peer,
            pod_ip,
            peer_ip,
            binary,
        })
    }

    /// `pod_ip:port`.
    pub fn pod_addr(&self, port: u16) -> SocketAddr {
        SocketAddrV4::new(self.pod_ip, port).into()
    }

    /// `peer_ip:port`.
    pub fn peer_addr(&self, port: u16) -> SocketAddr {
        SocketAddrV4::new(self.peer_ip, port).into()
    }

    /// The installed `remora` binary and its work directory.
    pub fn binary(&self) -> &RemoraBinary {
        &self.binary
    }

    /// The pod's IPv6 address on the veth pair, once [`PodNet::enable_ipv6`] has added it:
    /// a unique-local address derived from the IPv4 one, so pairs never share a subnet.
    pub fn pod_ip6(&self) -> Ipv6Addr {
        self.ip6(1)
    }

    /// The peer's IPv6 address on the veth pair (see [`PodNet::pod_ip6`]).
    pub fn peer_ip6(&self) -> Ipv6Addr {
        self.ip6(2)
    }

    fn ip6(&self, host: u16) -> Ipv6Addr {
        let [_, second, third, _] = self.pod_ip.octets();
        Ipv6Addr::new(
            0xfd00,
            0,
            u16::from(second),
            u16::from(third),
            0,
            0,
            0,
            host,
        )
    }

    /// Give both ends of the veth pair an IPv6 address ([`PodNet::pod_ip6`],
    /// [`PodNet::peer_ip6`]), usable at once (no duplicate address detection), so the pod is
    /// dual-stack. They exist only inside the two namespaces.
    pub fn enable_ipv6(&self) -> io::Result<()> {
        for (ns, addr) in [(&self.pod, self.pod_ip6()), (&self.peer, self.peer_ip6())] {
            ip(&[
                "-n",
                ns.name(),
                "-6",
                "addr",
                "add",
                &format!("{addr}/64"),
                "dev",
                "eth0",
                "nodad",
            ])?;
        }
        Ok(())
    }

    /// Run `remora capture ARGS` as root in the pod namespace and return how it ended.
    pub fn capture_output(&self, args: &[&str]) -> Output {
        let mut cmd = self.pod.command(self.binary.path());
        cmd.arg("capture").args(args);
        run_bounded(&mut cmd, SETUP_COMMAND_TIMEOUT)
            .unwrap_or_else(|e| panic!("remora capture {args:?}: {e}"))
    }

    /// Run `remora capture ARGS` as root in the pod namespace; panics if it fails.
    pub fn capture(&self, args: &[&str]) {
        let out = self.capture_output(args);
        assert!(
            out.status.success(),
            "remora capture {args:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Capture with the injector's default arguments ([`crate::DEFAULT_CAPTURE_ARGS`]).
    pub fn capture_default(&self) {
        self.capture(crate::DEFAULT_CAPTURE_ARGS);
    }

    /// The pod's NAT table as `iptables-save` prints it, for failure messages.
    pub fn pod_nat_rules(&self) -> String {
        let mut cmd = self.pod.command("iptables-save");
        cmd.args(["-t", "nat"]);
        match run_bounded(&mut cmd, SETUP_COMMAND_TIMEOUT) {
            Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
            Err(e) => format!("(iptables-save failed: {e})"),
        }
    }

    /// A `remora run` to configure and start in the pod namespace as UID/GID 1337.
    pub fn remora(&self) -> RemoraCommand<'_> {
        RemoraCommand::new(&self.pod, &self.binary)
    }

    /// Make the peer a pod too: capture with the injector's default arguments there. With
    /// [`PodNet::peer_remora`], traffic between the two namespaces crosses two sidecars.
    pub fn capture_peer_default(&self) {
        let mut cmd = self.peer.command(self.binary.path());
        cmd.arg("capture").args(crate::DEFAULT_CAPTURE_ARGS);
        let out = run_bounded(&mut cmd, SETUP_COMMAND_TIMEOUT)
            .unwrap_or_else(|e| panic!("remora capture in the peer: {e}"));
        assert!(
            out.status.success(),
            "remora capture in the peer failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A `remora run` in the peer namespace, as the second pod's sidecar.
    pub fn peer_remora(&self) -> RemoraCommand<'_> {
        RemoraCommand::new(&self.peer, &self.binary)
    }
}

/// Run `ip ARGS`, turning a failure into an error that carries its stderr.
fn ip(args: &[&str]) -> io::Result<()> {
    let out: Output = run_bounded(Command::new("ip").args(args), SETUP_COMMAND_TIMEOUT)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}
