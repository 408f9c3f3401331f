//! Read buffers lent to requests in flight, and the buffers their heads are written into. A
//! connection holds none while it waits, so an idle keep-alive connection costs no buffer; and
//! a buffer handed back is kept for the next request rather than freed, because freeing and
//! allocating one per request makes the allocator return memory to the system between
//! requests and fault it back in (about one page fault per request under load, measured).

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
    free: FreeList<BytesMut>,
    /// Buffers heads are written into.
    heads: FreeList<Vec<u8>>,
}

/// Up to [`KEEP`] buffers of one kind, behind a plain mutex held for one push or pop.
#[derive(Debug)]
struct FreeList<T>(Mutex<Vec<T>>);

impl<T> Default for FreeList<T> {
    fn default() -> Self {
        FreeList(Mutex::new(Vec::new()))
    }
}

impl<T> FreeList<T> {
    fn pop(&self) -> Option<T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).pop()
    }

    /// Keep `buf` unless it has grown past twice [`SIZE`] or the list is full.
    fn push(&self, buf: T, capacity: usize) {
        if capacity > 2 * SIZE {
            return;
        }
        let mut list = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if list.len() < KEEP {
            list.push(buf);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl Buffers {
    /// An empty buffer with room for [`SIZE`] bytes.
    pub fn take(&self) -> BytesMut {
        self.free
            .pop()
            .unwrap_or_else(|| BytesMut::with_capacity(SIZE))
    }

    /// Hand `buf` back; its contents are dropped.
    pub fn give(&self, mut buf: BytesMut) {
        buf.clear();
        // Room before the start (after `advance`) is taken back without allocating.
        buf.reserve(SIZE);
        let capacity = buf.capacity();
        self.free.push(buf, capacity);
    }

    /// An empty buffer to write a head into (a request's for the upstream, then the
    /// response's for the client), with room for [`SIZE`] bytes.
    pub fn take_vec(&self) -> Vec<u8> {
        self.heads.pop().unwrap_or_else(|| Vec::with_capacity(SIZE))
    }

    /// Hand back a buffer from [`Buffers::take_vec`]; its contents are dropped.
    pub fn give_vec(&self, mut v: Vec<u8>) {
        v.clear();
        let capacity = v.capacity();
        self.heads.push(v, capacity);
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
        self.free.len()
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

    #[test]
    fn head_buffers_are_reused_too() {
        let buffers = Buffers::default();
        let mut v = buffers.take_vec();
        assert!(v.capacity() >= SIZE);
        v.extend_from_slice(b"GET / HTTP/1.1\r\n");
        let at = v.as_ptr() as usize;
        buffers.give_vec(v);
        let again = buffers.take_vec();
        assert_eq!((again.as_ptr() as usize, again.len()), (at, 0));
        // One grown past twice the size is freed rather than kept.
        let mut big = again;
        big.reserve(4 * SIZE);
        buffers.give_vec(big);
        assert_eq!(buffers.heads.len(), 0);
    }
}
