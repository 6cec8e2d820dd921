//! An `LD_PRELOAD` library for `-- slow-disk`: `fsync` and `fdatasync`
//! take `KILN_SLOW_SYNC_MS` (default 5) longer, as on a disk whose cache
//! flush is slow (a network volume, a consumer SSD without power-loss
//! protection). Compiled by the bench with plain `rustc`.

use std::ffi::{c_char, c_int, c_void};

unsafe extern "C" {
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
}

const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;

/// Sleeps, then calls libc's `name` on `fd`.
fn slow(name: &std::ffi::CStr, fd: c_int) -> c_int {
    let ms: u64 = std::env::var("KILN_SLOW_SYNC_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    std::thread::sleep(std::time::Duration::from_millis(ms));
    // SAFETY: dlsym with a NUL-terminated name.
    let addr = unsafe { dlsym(RTLD_NEXT, name.as_ptr()) };
    if addr.is_null() {
        std::process::abort();
    }
    // SAFETY: libc's fsync and fdatasync have this signature.
    let real = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int) -> c_int>(addr) };
    // SAFETY: forwarded as the caller gave it.
    unsafe { real(fd) }
}

/// # Safety
/// As libc's `fdatasync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    slow(c"fdatasync", fd)
}

/// # Safety
/// As libc's `fsync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    slow(c"fsync", fd)
}
