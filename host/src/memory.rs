//! Process memory policy for large tensors.
//!
//! A 3072² RGB image is 113 MB of f32. glibc serves allocations above its
//! mmap threshold (at most 32 MiB by default) with a fresh `mmap` and returns
//! them to the kernel on free, so every node that produces such a tensor pays
//! a page fault for each of its ~28 000 pages again. Raising the thresholds
//! lets freed tensor buffers be reused from the heap. The cost is that up to
//! [`RETAIN_BYTES`] of freed memory may stay resident between jobs.

/// Freed memory glibc may keep for reuse instead of returning it.
pub const RETAIN_BYTES: i32 = 1 << 30;

/// Applies the policy; call once at start-up, before worker threads exist.
/// A no-op outside glibc.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts allocator parameters; called before other
    // threads allocate.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, RETAIN_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, RETAIN_BYTES);
    }
}

/// Returns freed heap memory to the kernel (the other half of the policy:
/// the server calls it once it has been idle for a while). A no-op outside
/// glibc.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}
