//! Give the memory the heap holds free back to the system.
//!
//! glibc's `free` returns memory only from the top of the heap. Reading a large configuration
//! (10,000 services' clusters, or one route table of 9,000 virtual hosts) builds trees of small
//! transient allocations (JSON values, reflective messages) interleaved with the model that is
//! kept: once the transients are freed, hundreds of MiB of free pages sit below the kept data
//! and stay resident. `malloc_trim(0)` hands every whole free page back (`MADV_DONTNEED`); Remora
//! calls it after each applied update, which is when such transients have just been freed. Measured with the
//! config-scale benchmark at 10,000 services: 326 MiB resident without it, 120 MiB with it.
//!
//! This crate is the only one in the workspace that allows `unsafe`: the call is one FFI
//! function without arguments that point anywhere.

/// Return free heap pages to the system; true if any were returned. A no-op (false) where the
/// C library is not glibc.
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes a size and touches only the allocator's own state, under
        // the allocator's locks; it is safe to call from any thread at any time.
        #[allow(unsafe_code)]
        let released = unsafe { libc::malloc_trim(0) };
        released == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// What the C allocator holds, in bytes, as Envoy's `server.memory_*` statistics report
/// tcmalloc's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// In use by the program: the chunks handed out, mmapped ones included.
    pub allocated: u64,
    /// Taken from the system for the heap: every arena's memory and the mmapped chunks.
    pub heap_size: u64,
}

/// The allocator's totals over all its arenas now (glibc's `mallinfo2`: it takes each arena's
/// lock in turn, so a scrape's call, not a request's). `None` where the C library is not glibc.
pub fn heap_stats() -> Option<HeapStats> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 takes no argument and returns a struct by value, reading only the
        // allocator's own state under its locks; safe from any thread at any time.
        #[allow(unsafe_code)]
        let info = unsafe { libc::mallinfo2() };
        let bytes = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        Some(HeapStats {
            allocated: bytes(info.uordblks).saturating_add(bytes(info.hblkhd)),
            heap_size: bytes(info.arena).saturating_add(bytes(info.hblkhd)),
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// A global allocator for tests: the system's, counting the allocations of a thread while it
/// asks ([`counting::allocations_in`]).
#[cfg(feature = "counting")]
pub mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        // Const-initialised cells without destructors: reading them never allocates, so the
        // allocator can use them without recursing.
        static ON: Cell<bool> = const { Cell::new(false) };
        static COUNT: Cell<u64> = const { Cell::new(0) };
    }

    /// The system allocator, counting.
    pub struct Counting;

    // SAFETY: every call goes to the system allocator with the caller's arguments unchanged;
    // the counting touches only the thread-local cells above.
    #[allow(unsafe_code)]
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            if ON.with(Cell::get) {
                COUNT.with(|c| c.set(c.get() + 1));
            }
            // SAFETY: the caller's layout, as given.
            unsafe { System.alloc(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from `System.alloc` with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            if ON.with(Cell::get) {
                COUNT.with(|c| c.set(c.get() + 1));
            }
            // SAFETY: `ptr` came from `System` with this layout; the new size is the caller's.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    /// How many allocations this thread made while running `f` (with [`Counting`] as the
    /// global allocator; 0 otherwise).
    pub fn allocations_in(f: impl FnOnce()) -> u64 {
        let before = COUNT.with(Cell::get);
        ON.with(|on| on.set(true));
        f();
        ON.with(|on| on.set(false));
        COUNT.with(Cell::get) - before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Freed pages in the middle of the heap are returned: a kept allocation above a large
    /// freed region pins it for `free`, not for the trim.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn freed_pages_below_kept_data_are_returned() {
        let transient: Vec<Box<[u8; 1024]>> =
            (0..32 * 1024).map(|_| Box::new([1u8; 1024])).collect();
        let kept = Box::new([2u8; 1024]);
        drop(transient);
        assert!(release_free_memory(), "32 MiB freed below a kept chunk");
        assert_eq!(kept[0], 2);
    }
}
