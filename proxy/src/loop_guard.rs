//! Refusing connections that would loop back into Remora.
//!
//! Two ways a connection can come back to us, each with its own guard:
//! - its original destination is one of our own listeners on a local address (someone dialled
//!   15001 directly, or a rule sends our listener ports to us): proxying it would connect to
//!   ourselves, forever;
//! - it is one of our own upstream connections, captured again: its peer is our upstream's local
//!   address *and* it was going where our upstream goes. That is what happens when capture runs
//!   without the owner exclusion for our UID; without this guard each hop opens another, until
//!   file descriptors run out. Both ends are compared because Linux gives one ephemeral port to
//!   several sockets with different destinations: an application's connection can share a
//!   local address with one of ours and must not be refused for it. Even both can match a
//!   connection that is not ours: the capture's NAT may give a client a new source port, and
//!   that port may be the local port of one of our upstream connections to the same place
//!   (`sock_diag`). So a match whose upstream has already received bytes is not a loop: our
//!   upstream captured again has no peer but the connection being checked, which has been sent
//!   nothing. A match on an upstream that has heard nothing yet is still not proof (the
//!   upstream's server may not have answered yet), so the first one is served, marked: the
//!   upstream connections its task dials are suspects, and a connection that matches a suspect
//!   is refused. A real loop is stopped one hop later; a client NAT happened to give our port
//!   is refused only if that happens twice in a row along one chain of connections.
//!
//! The record of open upstream connections the second guard keeps is also what the admin
//! `/clusters` page lists as each cluster's hosts.

mod sock_diag;

use crate::upstream::connection_end::ConnectionEnd;
use crate::Direction;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

/// Which guard refused a connection; a metric label and an access-log field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    OwnListener,
    OwnUpstream,
}

impl Guard {
    /// The label value used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Guard::OwnListener => "own_listener",
            Guard::OwnUpstream => "own_upstream",
        }
    }
}

tokio::task_local! {
    /// Set while a connection that matched one of our upstream connections for the first time
    /// is served: the upstream connections its task dials are suspects.
    static SERVING_SUSPECT: ();
}

/// What the guards make of a captured connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not a loop.
    Pass,
    /// Its peer and destination are those of one of our upstream connections that has heard
    /// nothing yet, which was not itself dialled by such a connection: serve it inside
    /// [`serve_suspect`], so that a loop is caught at its next hop.
    Suspect,
    /// A loop: refused by this guard.
    Refuse(Guard),
}

impl Verdict {
    /// The guard that refuses the connection, if one does.
    pub fn refused(self) -> Option<Guard> {
        match self {
            Verdict::Refuse(g) => Some(g),
            Verdict::Pass | Verdict::Suspect => None,
        }
    }
}

/// Serve a connection the own-upstream guard suspects ([`Verdict::Suspect`]).
pub async fn serve_suspect<F: std::future::Future>(serving: F) -> F::Output {
    SERVING_SUSPECT.scope((), serving).await
}

/// Whether this task serves a suspected connection: a task it spawns to dial (a mirror)
/// carries that on with [`carry_suspicion`].
pub fn serving_suspect() -> bool {
    SERVING_SUSPECT.try_with(|()| ()).is_ok()
}

/// Run `work` as a suspected connection's task if `suspect`.
pub async fn carry_suspicion<F: std::future::Future>(suspect: bool, work: F) -> F::Output {
    if suspect {
        SERVING_SUSPECT.scope((), work).await
    } else {
        work.await
    }
}

/// The (local, remote) address pairs of Remora's open upstream connections, each with the
/// direction it serves, and the ports Remora listens on.
#[derive(Debug, Default)]
pub struct LoopGuard {
    own_ports: Vec<u16>,
    // A plain mutex: held for one hash operation, never across an await.
    /// Each with the direction it serves and whether a suspected connection dialled it.
    upstreams: Mutex<foldhash::HashMap<(SocketAddr, SocketAddr), (Direction, bool)>>,
}

/// How many upstream connections are open to one destination, for one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenUpstreams {
    pub direction: Direction,
    pub destination: SocketAddr,
    pub connections: usize,
}

impl LoopGuard {
    /// A guard for a process listening on `own_ports`.
    pub fn new(own_ports: Vec<u16>) -> Arc<Self> {
        Arc::new(LoopGuard {
            own_ports,
            upstreams: Mutex::default(),
        })
    }

    /// Which guard, if any, refuses a captured connection from `peer` to `orig_dst`.
    pub fn check(&self, peer: SocketAddr, orig_dst: SocketAddr) -> Verdict {
        match self.own_upstream(peer, orig_dst) {
            Verdict::Pass => match self.check_destination(orig_dst) {
                Some(g) => Verdict::Refuse(g),
                None => Verdict::Pass,
            },
            matched => matched,
        }
    }

    /// Which guard, if any, refuses a connection from `peer` to an explicit listener at
    /// `dialled` whose upstream is `upstream`. It loops only when its upstream is the listener
    /// itself (the peer is then one of our upstream sockets, and what it dialled is this
    /// listener) or one of our capture ports. The client's address alone is no key: Linux gives
    /// one ephemeral port to sockets with different destinations, so with thousands of
    /// connections open many clients share a port with one of our upstream sockets.
    pub fn check_explicit(
        &self,
        peer: SocketAddr,
        dialled: Option<SocketAddr>,
        upstream: SocketAddr,
    ) -> Verdict {
        let matched = dialled.map_or(Verdict::Pass, |d| self.own_upstream(peer, d));
        match (matched, self.check_destination(upstream)) {
            (Verdict::Pass, Some(g)) => Verdict::Refuse(g),
            (matched, _) => matched,
        }
    }

    /// Whether proxying to `dst` would connect to one of our own capture listeners.
    fn check_destination(&self, dst: SocketAddr) -> Option<Guard> {
        (self.own_ports.contains(&dst.port()) && is_local_address(dst.ip()))
            .then_some(Guard::OwnListener)
    }

    /// Whether `peer` → `orig_dst` is one of our own upstream connections, accepted by us.
    fn own_upstream(&self, peer: SocketAddr, orig_dst: SocketAddr) -> Verdict {
        let registered = self
            .upstreams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(peer, orig_dst))
            .map(|&(_, suspect)| suspect);
        let Some(suspect) = registered else {
            return Verdict::Pass;
        };
        // Asked only on a match: the kernel knows whether that upstream has heard from its
        // peer. If it cannot say, the match stands.
        if let Some(received) = sock_diag::data_segments_received(peer, orig_dst).filter(|&n| n > 0)
        {
            tracing::debug!(
                %peer, %orig_dst, received,
                "a connection shares its addresses with one of our upstream connections, which \
                 has heard from its peer: not a loop (NAT rewrote the client's source port)"
            );
            return Verdict::Pass;
        }
        if suspect {
            Verdict::Refuse(Guard::OwnUpstream)
        } else {
            tracing::debug!(
                %peer, %orig_dst,
                "a connection shares its addresses with one of our upstream connections: served \
                 as a suspect, a loop if what it dials comes back too"
            );
            Verdict::Suspect
        }
    }

    /// Record an upstream connection from `local` to `remote`, serving `direction`, for as long
    /// as the returned value lives.
    pub fn register(
        self: &Arc<Self>,
        local: SocketAddr,
        remote: SocketAddr,
        direction: Direction,
    ) -> Registration {
        let pair = (local, remote);
        self.upstreams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(pair, (direction, serving_suspect()));
        Registration {
            guard: Arc::clone(self),
            held: Box::new(Held { pair, end: None }),
        }
    }

    /// The open upstream connections counted per direction and destination, outbound first,
    /// then by address. Read by the admin thread; the lock is held only to copy the keys out.
    pub fn open_upstreams(&self) -> Vec<OpenUpstreams> {
        let mut open: Vec<(Direction, SocketAddr)> = self
            .upstreams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(&(_, remote), &(direction, _))| (direction, remote))
            .collect();
        open.sort_unstable_by_key(|&(d, a)| (d == Direction::Inbound, a));
        let mut counted: Vec<OpenUpstreams> = Vec::new();
        for (direction, destination) in open {
            match counted.last_mut() {
                Some(last) if last.direction == direction && last.destination == destination => {
                    last.connections += 1
                }
                _ => counted.push(OpenUpstreams {
                    direction,
                    destination,
                    connections: 1,
                }),
            }
        }
        counted
    }
}

/// Keeps an upstream's addresses registered; removes them when dropped. It lives exactly as
/// long as the connection, so it also carries how a cluster's connection ends
/// ([`ConnectionEnd`], counted when dropped with it).
#[derive(Debug)]
pub struct Registration {
    guard: Arc<LoopGuard>,
    // Boxed: every open upstream holds a registration for its whole life, and two IPv6-sized
    // addresses inline would grow each connection's future by 64 bytes.
    held: Box<Held>,
}

#[derive(Debug)]
struct Held {
    pair: (SocketAddr, SocketAddr),
    end: Option<ConnectionEnd>,
}

impl Registration {
    /// Count the connection's end in its cluster's statistics (an xDS cluster's connection).
    pub fn watch(&mut self, end: ConnectionEnd) {
        self.held.end = Some(end);
    }

    /// The connection's end, to mark what is seen of it (`None`: not counted).
    pub fn end_mut(&mut self) -> Option<&mut ConnectionEnd> {
        self.held.end.as_mut()
    }

    /// The connection's end, for an HTTP client that watches the connection itself.
    pub fn take_end(&mut self) -> Option<ConnectionEnd> {
        self.held.end.take()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.guard
            .upstreams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.held.pair);
    }
}

/// Whether `ip` belongs to this machine (network namespace). Only asked when the port is one of
/// ours, so the cost of a bind probe is paid on suspicious connections alone. Binding to an
/// address that is not local fails with `EADDRNOTAVAIL`; any other outcome counts as local, so a
/// doubt refuses rather than loops.
fn is_local_address(ip: IpAddr) -> bool {
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    match std::net::TcpListener::bind(SocketAddr::new(ip, 0)) {
        Ok(_) => true,
        Err(e) => e.kind() != io::ErrorKind::AddrNotAvailable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_listener_refuses_only_its_own_upstream_coming_back() {
        let guard = LoopGuard::new(vec![15001]);
        let upstream: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let listener: SocketAddr = "127.0.0.1:9000".parse().unwrap();
        let ours: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let _registration = guard.register(ours, upstream, Direction::Outbound);
        // A client that happens to use the port of our upstream socket to the same upstream.
        let dialled = Some(listener);
        assert_eq!(
            guard.check_explicit(ours, dialled, upstream).refused(),
            None
        );
        // Our upstream socket dialled this listener: its upstream is itself.
        let _back = guard.register(ours, listener, Direction::Outbound);
        assert_eq!(
            guard.check_explicit(ours, dialled, listener),
            Verdict::Suspect
        );
        // An upstream that is one of our capture ports.
        let capture: SocketAddr = "127.0.0.1:15001".parse().unwrap();
        assert_eq!(
            guard.check_explicit(listener, dialled, capture).refused(),
            Some(Guard::OwnListener)
        );
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn own_listener_on_a_local_address_is_refused() {
        let guard = LoopGuard::new(vec![15001, 15006]);
        let peer = addr("10.0.0.9:40000");
        assert_eq!(
            guard.check(peer, addr("127.0.0.1:15001")).refused(),
            Some(Guard::OwnListener)
        );
        assert_eq!(
            guard.check(peer, addr("[::1]:15006")).refused(),
            Some(Guard::OwnListener)
        );
        assert_eq!(guard.check(peer, addr("127.0.0.1:8080")).refused(), None);
    }

    #[test]
    fn own_port_on_a_remote_address_is_allowed() {
        // Another pod's sidecar listens on the same ports; dialling it is not a loop.
        let guard = LoopGuard::new(vec![15001]);
        // TEST-NET-1: never assigned to this machine.
        assert_eq!(
            guard
                .check(addr("10.0.0.9:1"), addr("192.0.2.1:15001"))
                .refused(),
            None
        );
    }

    #[test]
    fn registered_upstream_peer_is_refused_until_dropped() {
        let guard = LoopGuard::new(vec![]);
        let local = addr("10.0.0.5:43210");
        let dst = addr("10.0.0.7:80");
        assert_eq!(guard.check(local, dst).refused(), None);
        // Dialled by a connection served as usual: a match is a suspect, served marked.
        let registration = guard.register(local, dst, Direction::Outbound);
        assert_eq!(guard.check(local, dst), Verdict::Suspect);
        drop(registration);
        // Dialled by a suspected connection: a match is a loop.
        let registration = block_on(serve_suspect(async {
            assert!(serving_suspect());
            guard.register(local, dst, Direction::Outbound)
        }));
        assert!(!serving_suspect());
        assert_eq!(guard.check(local, dst).refused(), Some(Guard::OwnUpstream));
        assert_eq!(guard.check(addr("10.0.0.5:43211"), dst), Verdict::Pass);
        drop(registration);
        assert_eq!(guard.check(local, dst), Verdict::Pass);
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(f)
    }

    #[test]
    fn a_match_whose_upstream_has_heard_from_its_peer_is_not_refused() {
        // A client whose source port NAT rewrote to the local port of one of our upstream
        // connections to the same destination: that upstream has received bytes, which our
        // own upstream captured again cannot have.
        use std::io::{Read, Write};
        let guard = LoopGuard::new(vec![]);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dst = listener.local_addr().unwrap();
        let mut upstream = std::net::TcpStream::connect(dst).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let local = upstream.local_addr().unwrap();
        let _registration = guard.register(local, dst, Direction::Outbound);
        // Nothing received yet, as our upstream captured again would be: a suspect.
        assert_eq!(guard.check(local, dst), Verdict::Suspect);
        server.write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        upstream.read_exact(&mut got).unwrap();
        assert_eq!(guard.check(local, dst), Verdict::Pass);
    }

    #[test]
    fn an_application_sharing_our_local_port_to_elsewhere_is_not_refused() {
        // Linux reuses an ephemeral port across destinations: the app's connection from the
        // same local address, going somewhere else, is not our traffic captured again.
        let guard = LoopGuard::new(vec![]);
        let local = addr("10.0.0.5:43210");
        let _ours = guard.register(local, addr("10.0.0.7:80"), Direction::Outbound);
        assert_eq!(guard.check(local, addr("10.0.0.8:443")).refused(), None);
    }

    #[test]
    fn an_explicit_listeners_client_sharing_our_upstreams_port_is_not_refused() {
        // A local client of an explicit listener got the ephemeral port one of our upstream
        // connections (to that listener's upstream) has: it is not a loop.
        let guard = LoopGuard::new(vec![8080]);
        let upstream = addr("127.0.0.1:9090");
        let _ours = guard.register(addr("127.0.0.1:43210"), upstream, Direction::Outbound);
        assert_eq!(guard.check_destination(upstream), None);
        // An upstream that is one of our own listeners is.
        assert_eq!(
            guard.check_destination(addr("127.0.0.1:8080")),
            Some(Guard::OwnListener)
        );
    }

    #[test]
    fn open_upstreams_are_counted_per_direction_and_destination_while_they_live() {
        let guard = LoopGuard::new(vec![]);
        let app = addr("10.0.0.5:8080");
        let peer = addr("10.0.0.7:80");
        let a = guard.register(addr("10.0.0.5:40001"), peer, Direction::Outbound);
        let b = guard.register(addr("10.0.0.5:40002"), peer, Direction::Outbound);
        let c = guard.register(addr("127.0.0.6:40003"), app, Direction::Inbound);
        let open = |dir, dst, n| OpenUpstreams {
            direction: dir,
            destination: dst,
            connections: n,
        };
        assert_eq!(
            guard.open_upstreams(),
            [
                open(Direction::Outbound, peer, 2),
                open(Direction::Inbound, app, 1)
            ]
        );
        drop(a);
        drop(c);
        assert_eq!(guard.open_upstreams(), [open(Direction::Outbound, peer, 1)]);
        drop(b);
        assert_eq!(guard.open_upstreams(), []);
    }
}
