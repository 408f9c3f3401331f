//! Read buffers lent to requests in flight. A connection holds none while it waits, so an idle
//! keep-alive connection costs no buffer; and a buffer handed back is kept for the next
//! request rather than freed, because freeing and allocating one per request makes the
//! allocator return memory to the system between requests and fault it back in (about one
//! page fault per request under load, measured).

use bytes::BytesMut;
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, PoisonError};

/// Bytes a buffer holds: a request or response head and a short body in one read.
pub const SIZE: usize = 8 * 1024;
/// Buffers kept for reuse at most (1 MiB): two per request in flight; more are freed.
const KEEP: usize = 128;

/// Buffers free for the next request.
#[derive(Debug, Default)]
pub struct Buffers {
    // A plain mutex, held for one push or pop.
    free: Mutex<Vec<BytesMut>>,
}

impl Buffers {
    /// An empty buffer with room for [`SIZE`] bytes.
    pub fn take(&self) -> BytesMut {
        let reused = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        reused.unwrap_or_else(|| BytesMut::with_capacity(SIZE))
    }

    /// Hand `buf` back; its contents are dropped.
    pub fn give(&self, mut buf: BytesMut) {
        buf.clear();
        // Room before the start (after `advance`) is taken back without allocating.
        buf.reserve(SIZE);
        if buf.capacity() > 2 * SIZE {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        if free.len() < KEEP {
            free.push(buf);
        }
    }

    /// A buffer handed back when the loan ends.
    pub fn lend(&self) -> Lent<'_> {
        Lent {
            buf: self.take(),
            from: self,
        }
    }

    /// Buffers kept now (tests).
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A buffer on loan from [`Buffers`].
#[derive(Debug)]
pub struct Lent<'a> {
    buf: BytesMut,
    from: &'a Buffers,
}

impl Deref for Lent<'_> {
    type Target = BytesMut;

    fn deref(&self) -> &BytesMut {
        &self.buf
    }
}

impl DerefMut for Lent<'_> {
    fn deref_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        self.from.give(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Buf;

    #[test]
    fn buffers_are_reused_whole_and_bounded_in_number() {
        let buffers = Buffers::default();
        let mut a = buffers.take();
        a.extend_from_slice(b"hello");
        a.advance(3);
        let at = a.as_ptr() as usize - 3;
        buffers.give(a);
        let b = buffers.take();
        assert!(b.is_empty());
        assert_eq!(
            b.as_ptr() as usize,
            at,
            "the same allocation, from its start"
        );
        assert!(b.capacity() >= SIZE);
        let many: Vec<BytesMut> = (0..KEEP + 5).map(|_| buffers.take()).collect();
        for m in many {
            buffers.give(m);
        }
        assert_eq!(buffers.kept(), KEEP);
        {
            let _lent = buffers.lend();
            assert_eq!(buffers.kept(), KEEP - 1);
        }
        assert_eq!(buffers.kept(), KEEP);
    }
}
