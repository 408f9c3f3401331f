//! A backend for failover tests: it answers `x-backend: <name>` with 200, or 500 once told to
//! fail, and can be killed (its listener closed, its open connections shut, as when the
//! process dies) and brought back on the same address.

use crate::netns::Netns;
use crate::peer::{read_request_head, Server};
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// A backend that answers `x-backend: <name>` with 200, or 500 once told to fail, and can be
/// killed (its listener closed, its open connections shut, as when the process dies) and
/// brought back on the same address.
pub struct Backend {
    pub name: &'static str,
    addr: SocketAddr,
    failing: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<TcpStream>>>,
    server: Option<Server>,
}

impl Backend {
    /// Start `name` on `addr` in `ns`, answering 200.
    pub fn start(ns: &Netns, name: &'static str, addr: SocketAddr) -> Backend {
        let mut b = Backend {
            name,
            addr,
            failing: Arc::new(AtomicBool::new(false)),
            connections: Arc::new(Mutex::new(Vec::new())),
            server: None,
        };
        b.revive(ns);
        b
    }

    /// Listen again (after [`Backend::kill`]) and answer 200.
    pub fn revive(&mut self, ns: &Netns) {
        self.failing.store(false, Ordering::SeqCst);
        // A live one's listener goes first (its connections stay, answering 200 again).
        self.server = None;
        let (name, failing, connections) = (
            self.name,
            Arc::clone(&self.failing),
            Arc::clone(&self.connections),
        );
        self.server = Some(Server::start(ns, self.addr, move |mut stream| {
            if let Ok(clone) = stream.try_clone() {
                connections
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(clone);
            }
            while read_request_head(&mut stream).is_ok() {
                let status = if failing.load(Ordering::SeqCst) {
                    "500 Internal Server Error"
                } else {
                    "200 OK"
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: 2\r\nx-backend: {name}\r\n\r\nok"
                );
                stream.write_all(answer.as_bytes())?;
            }
            // Closed for the proxy too, though `kill` holds a clone of it.
            let _ = stream.shutdown(Shutdown::Both);
            Ok(())
        }));
    }

    /// Answer 500 from now on.
    pub fn fail(&self) {
        self.failing.store(true, Ordering::SeqCst);
    }

    /// Close the listener and every open connection.
    pub fn kill(&mut self) {
        self.server = None;
        for c in self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}
