//! Counting what crosses in a body: bytes, and for gRPC the length-prefixed messages, for
//! Istio's size histograms and message counters. Counted as the body streams, never buffered.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// gRPC's message framing: a 1-byte compression flag and a 4-byte big-endian length, then the
/// message. Messages may span frames and frames may hold several messages.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GrpcFraming {
    prefix: [u8; 5],
    prefix_len: usize,
    /// Bytes of the current message still to come.
    remaining: u64,
    /// Messages whose prefix has been read.
    pub messages: u64,
}

impl GrpcFraming {
    /// Account for the next `chunk` of the stream.
    pub fn feed(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            if self.remaining > 0 {
                let n = usize::try_from(self.remaining)
                    .unwrap_or(usize::MAX)
                    .min(chunk.len());
                self.remaining -= n as u64;
                chunk = &chunk[n..];
                continue;
            }
            let n = (5 - self.prefix_len).min(chunk.len());
            self.prefix[self.prefix_len..self.prefix_len + n].copy_from_slice(&chunk[..n]);
            self.prefix_len += n;
            chunk = &chunk[n..];
            if self.prefix_len == 5 {
                let len = u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]);
                self.messages += 1;
                self.remaining = u64::from(len);
                self.prefix_len = 0;
            }
        }
    }
}

/// Bytes (and gRPC messages) of a request body, shared by the body that reads it and the
/// request's end, which reports them.
#[derive(Debug, Default)]
pub struct BodyCounter {
    bytes: AtomicU64,
    /// `Some` for gRPC requests. Locked once per data frame, by the one task polling the body.
    grpc: Option<Mutex<GrpcFraming>>,
}

impl BodyCounter {
    /// A counter; `grpc` also counts messages.
    pub fn new(grpc: bool) -> Self {
        BodyCounter {
            bytes: AtomicU64::new(0),
            grpc: grpc.then(|| Mutex::new(GrpcFraming::default())),
        }
    }

    /// Account for one data frame.
    pub fn data(&self, chunk: &[u8]) {
        self.bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        if let Some(g) = &self.grpc {
            g.lock().unwrap_or_else(PoisonError::into_inner).feed(chunk);
        }
    }

    /// Bytes so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// gRPC messages so far (0 when not gRPC).
    pub fn messages(&self) -> u64 {
        self.grpc.as_ref().map_or(0, |g| {
            g.lock().unwrap_or_else(PoisonError::into_inner).messages
        })
    }

    /// Count `n` bytes that crossed outside of body frames (an upgraded connection's).
    pub fn add(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Overwrite the byte count (tests of what reads it).
    #[cfg(test)]
    pub fn set_bytes(&self, n: u64) {
        self.bytes.store(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: u32) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&len.to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len as usize));
        m
    }

    #[test]
    fn messages_are_counted_across_any_frame_boundaries() {
        let mut stream = message(3);
        stream.extend(message(0));
        stream.extend(message(70_000));
        for split in [1usize, 2, 4, 5, 6, 13, 1000, stream.len()] {
            let mut f = GrpcFraming::default();
            for chunk in stream.chunks(split) {
                f.feed(chunk);
            }
            assert_eq!(f.messages, 3, "split {split}");
            assert_eq!(f.remaining, 0);
        }
    }

    #[test]
    fn counter_counts_bytes_always_and_messages_for_grpc() {
        let plain = BodyCounter::new(false);
        plain.data(&message(10));
        assert_eq!((plain.bytes(), plain.messages()), (15, 0));
        let grpc = BodyCounter::new(true);
        grpc.data(&message(10));
        grpc.data(&message(1));
        assert_eq!((grpc.bytes(), grpc.messages()), (21, 2));
    }
}
