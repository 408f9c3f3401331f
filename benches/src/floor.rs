//! The floor: the least work a proxy on this machine could do per request, run as a contender
//! of its own (`harness floor`, on the proxy core like the others). One thread, one epoll set,
//! level-triggered; each accepted connection gets an upstream connection of its own, and every
//! readiness event is one `recv` and one `send` of whatever arrived. It parses nothing, keeps no
//! statistics, arms no timer and allocates nothing per request.
//!
//! At 1000 requests per second a proxy's CPU is mostly the kernel's: being woken, and waking the
//! peer it writes to. A figure that is as low as this row's is as low as any proxy's can go
//! here; the targets that compare CPU or added latency with a peer print this row's ratio
//! beside Remora's, so a run says whether its bound was within reach at all.

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};

/// Bytes read per event: far more than a 1 KiB answer and its headers.
const READ_SIZE: usize = 64 * 1024;
/// How long a write may wait for room in a full socket before the pair is dropped. Loopback
/// buffers hold far more than the scenarios' messages, so this only bounds a stuck peer.
const WRITE_WAIT_MS: u16 = 1000;

/// The listener's token; a connection's is its file descriptor, never `u64::MAX`.
const LISTENER: u64 = u64::MAX;

/// A connection and the descriptor of the one it is paired with.
struct Side {
    stream: TcpStream,
    peer: usize,
}

/// Forwards every connection accepted on `listen` to `upstream` until the process is killed.
pub fn forward_forever(listen: SocketAddr, upstream: SocketAddr) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    epoll.add(&listener, EpollEvent::new(EpollFlags::EPOLLIN, LISTENER))?;
    eprintln!("floor: forwarding {listen} to {upstream}");
    // Indexed by file descriptor: a lookup per event, nothing hashed.
    let mut sides: Vec<Option<Side>> = Vec::new();
    let mut buf = vec![0u8; READ_SIZE];
    let mut events = vec![EpollEvent::empty(); 64];
    loop {
        let n = match epoll.wait(&mut events, EpollTimeout::NONE) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        for event in &events[..n] {
            match event.data() {
                LISTENER => accept_all(&listener, upstream, &epoll, &mut sides),
                fd => relay(fd as usize, &mut sides, &mut buf),
            }
        }
    }
}

/// Accepts every pending connection and pairs each with a new upstream connection.
fn accept_all(
    listener: &TcpListener,
    upstream: SocketAddr,
    epoll: &Epoll,
    sides: &mut Vec<Option<Side>>,
) {
    loop {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            // Nothing left to accept; or out of descriptors, or a connection gone before
            // accept: the listener stays registered, so the next event tries again.
            Err(_) => return,
        };
        // A loopback connect completes at once; blocking keeps this loop plain.
        let Ok(server) = TcpStream::connect(upstream) else {
            continue;
        };
        let pair = [client, server];
        let ok = pair.iter().all(|s| {
            s.set_nonblocking(true).is_ok()
                && s.set_nodelay(true).is_ok()
                && epoll
                    .add(
                        s,
                        EpollEvent::new(EpollFlags::EPOLLIN, s.as_raw_fd() as u64),
                    )
                    .is_ok()
        });
        if !ok {
            continue;
        }
        let [client, server] = pair;
        let (c, s) = (client.as_raw_fd() as usize, server.as_raw_fd() as usize);
        if sides.len() <= c.max(s) {
            sides.resize_with(c.max(s) + 1, || None);
        }
        sides[c] = Some(Side {
            stream: client,
            peer: s,
        });
        sides[s] = Some(Side {
            stream: server,
            peer: c,
        });
    }
}

/// One read from `fd` and its write to the peer; on end of stream or an error, both close.
fn relay(fd: usize, sides: &mut [Option<Side>], buf: &mut [u8]) {
    let Some(Some(side)) = sides.get_mut(fd) else {
        return;
    };
    let peer = side.peer;
    let read = match (&side.stream).read(buf) {
        Ok(0) => None,
        Ok(n) => Some(n),
        Err(e) if e.kind() == ErrorKind::WouldBlock => return,
        Err(_) => None,
    };
    let sent = match (read, sides.get(peer)) {
        (Some(n), Some(Some(to))) => write_all(&to.stream, &buf[..n]),
        _ => false,
    };
    if !sent {
        // Dropping closes the descriptors, which takes them out of the epoll set.
        sides[fd] = None;
        if let Some(slot) = sides.get_mut(peer) {
            *slot = None;
        }
    }
}

/// Writes all of `bytes`, waiting (bounded) for room when the socket is full.
fn write_all(mut to: &TcpStream, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        match to.write(bytes) {
            Ok(0) => return false,
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let mut fds = [PollFd::new(to.as_fd(), PollFlags::POLLOUT)];
                if !matches!(poll(&mut fds, PollTimeout::from(WRITE_WAIT_MS)), Ok(1)) {
                    return false;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::forward_forever;
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::time::Duration;

    /// Bytes go both ways in order, large writes included, and a client that closes closes
    /// its upstream connection too.
    #[test]
    fn relays_both_ways_and_closes_the_pair() {
        let origin = TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = origin.local_addr().unwrap();
        let listen = {
            let free = TcpListener::bind("127.0.0.1:0").unwrap();
            free.local_addr().unwrap()
        };
        std::thread::spawn(move || forward_forever(listen, upstream));
        let mut client = (0..200)
            .find_map(|_| {
                std::thread::sleep(Duration::from_millis(10));
                TcpStream::connect(listen).ok()
            })
            .expect("the floor listens");
        let (mut server, _) = origin.accept().unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();

        // Larger than one read and than a socket's buffer, so partial writes happen.
        let big: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let sent = big.clone();
        let writer = std::thread::spawn(move || {
            client.write_all(&sent).unwrap();
            client
        });
        let mut got = vec![0u8; big.len()];
        server.read_exact(&mut got).unwrap();
        assert!(got == big, "the stream arrived changed");
        let mut client = writer.join().unwrap();

        server.write_all(b"answer").unwrap();
        let mut answer = [0u8; 6];
        client.read_exact(&mut answer).unwrap();
        assert_eq!(&answer, b"answer");

        client.shutdown(Shutdown::Both).unwrap();
        let mut rest = Vec::new();
        assert_eq!(
            server.read_to_end(&mut rest).unwrap(),
            0,
            "upstream not closed"
        );
    }
}
