//! Zero-copy forwarding for bulk opaque TCP: `splice(2)` moves a socket's received pages into a
//! pipe and from the pipe into the other socket, so the bytes never enter our address space.
//!
//! A pipe costs two descriptors, so only a direction that has shown bulk traffic gets one; a
//! request-sized exchange is cheaper through a small buffer (two syscalls either way). Any
//! kernel that refuses splice for a pair of sockets leaves the direction on the buffered copy.

use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use tokio::io::Interest;
use tokio::net::TcpStream;

// Larger than the default 64 KiB so one pair of syscalls moves more of a bulk stream; an
// unprivileged process may grow a pipe to `fs.pipe-max-size` (1 MiB by default).
const PIPE_SIZE: i32 = 256 * 1024;

/// A pipe between the two splices of one direction, and how many bytes sit in it.
#[derive(Debug)]
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    held: usize,
    capacity: usize,
}

impl Pipe {
    /// A non-blocking pipe, grown if the kernel allows.
    pub fn new() -> io::Result<Self> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        // A pipe that cannot grow still works, one 64 KiB step at a time.
        let capacity = fcntl(&write, FcntlArg::F_SETPIPE_SZ(PIPE_SIZE))
            .ok()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(64 * 1024);
        Ok(Pipe {
            read,
            write,
            held: 0,
            capacity,
        })
    }

    /// Move what `from` has received into the pipe, waiting until it has something. `Ok(0)` is
    /// the end of its stream. The pipe must be empty.
    pub async fn fill(&mut self, from: &TcpStream) -> io::Result<usize> {
        debug_assert_eq!(self.held, 0);
        loop {
            from.readable().await?;
            let moved = from.try_io(Interest::READABLE, || {
                splice(
                    from.as_fd(),
                    None,
                    self.write.as_fd(),
                    None,
                    self.capacity,
                    SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK,
                )
                .map_err(io::Error::from)
            });
            match moved {
                Ok(n) => {
                    self.held = n;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Move everything in the pipe into `to`, waiting while its send buffer is full.
    pub async fn drain(&mut self, to: &TcpStream) -> io::Result<()> {
        while self.held > 0 {
            to.writable().await?;
            let moved = to.try_io(Interest::WRITABLE, || {
                splice(
                    self.read.as_fd(),
                    None,
                    to.as_fd(),
                    None,
                    self.held,
                    SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK,
                )
                .map_err(io::Error::from)
            });
            match moved {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.held -= n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (a, b) = tokio::join!(TcpStream::connect(addr), l.accept());
        (a.unwrap(), b.unwrap().0)
    }

    #[tokio::test]
    async fn moves_a_megabyte_between_sockets_and_sees_the_end() {
        let (mut sender, from) = pair().await;
        let (to, mut receiver) = pair().await;
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let expected = data.clone();
        let writer = tokio::spawn(async move {
            sender.write_all(&data).await.unwrap();
            sender.shutdown().await.unwrap();
        });
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            receiver.read_to_end(&mut got).await.unwrap();
            got
        });
        let mut pipe = Pipe::new().unwrap();
        let mut total = 0;
        loop {
            let n = pipe.fill(&from).await.unwrap();
            if n == 0 {
                break;
            }
            total += n;
            pipe.drain(&to).await.unwrap();
        }
        drop(to);
        writer.await.unwrap();
        assert_eq!(total, expected.len());
        assert!(reader.await.unwrap() == expected);
    }
}
