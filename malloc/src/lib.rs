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
