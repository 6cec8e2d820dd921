//! An `LD_PRELOAD` library that keeps, beside a directory tree, the image
//! a power cut would leave of it: only what was flushed.
//!
//! The process runs on the real directory (`KILN_POWERCUT_ROOT`) as usual.
//! The library wraps the calls that make data durable and keeps the image
//! (`KILN_POWERCUT_IMAGE`) up to date with them, on a model of a disk with
//! a volatile write cache and a journaling filesystem:
//!
//! - A file's content is durable as of its last `fsync`/`fdatasync` (a
//!   copy is taken right after the call returns). `sync_file_range` and
//!   plain writes make nothing durable.
//! - A name made by a rename, or removed by an unlink, changes in the image
//!   when a directory it is in is synced. A file synced under a name the
//!   image does not have yet gets that name (as ext4 commits a new file's
//!   entry with it).
//! - Content is kept per inode (`KILN_POWERCUT_IMAGE` + `.inodes`), so a
//!   rename made durable later carries the content synced before or after
//!   it.
//! - A directory made by `mkdir` exists once its parent is synced after
//!   it. The image's tree holds every directory a synced file needs; the
//!   list of those that are durable (relative paths, one per line, the root
//!   always) is `KILN_POWERCUT_IMAGE` + `.dirs`; the test prunes the image
//!   with it after the cut, dropping the others with what is in them.
//!
//! After the process is killed the image is what the disk would hold had
//! the power gone at that moment. Compiled by the test with plain `rustc`
//! (no dependencies); everything runs under one lock, and a thread-local
//! guard lets the library's own file operations through unwatched.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

unsafe extern "C" {
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
}

const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
const AT_FDCWD: c_int = -100;

/// The next definition of `$name` (libc's), as a function of type `$ty`.
macro_rules! real {
    ($name:literal, $ty:ty) => {{
        static ADDR: OnceLock<usize> = OnceLock::new();
        // SAFETY: dlsym with a NUL-terminated name.
        let addr = *ADDR.get_or_init(|| unsafe { dlsym(RTLD_NEXT, concat!($name, "\0").as_ptr().cast()) } as usize);
        if addr == 0 {
            std::process::abort();
        }
        // SAFETY: libc's symbol of that name has this signature.
        unsafe { std::mem::transmute::<usize, $ty>(addr) }
    }};
}

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// A device number and inode number.
type Ino = (u64, u64);

/// A change of names, durable once a directory it touches is synced.
enum Op {
    Rename { from: Option<PathBuf>, to: PathBuf, ino: Ino },
    Remove(PathBuf),
    MakeDir(PathBuf),
}

struct Disk {
    root: PathBuf,
    image: PathBuf,
    inodes: PathBuf,
    /// The list of durable directories.
    dirs_file: PathBuf,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The image's names (relative to the root) and their inodes.
    names: HashMap<PathBuf, Ino>,
    /// Directories whose entries are durable (the root is).
    dirs: HashSet<PathBuf>,
    /// Name changes not yet durable, oldest first.
    pending: Vec<Op>,
}

fn disk() -> Option<&'static Disk> {
    static DISK: OnceLock<Option<Disk>> = OnceLock::new();
    DISK.get_or_init(|| {
        let root = std::fs::canonicalize(std::env::var_os("KILN_POWERCUT_ROOT")?).ok()?;
        let image = PathBuf::from(std::env::var_os("KILN_POWERCUT_IMAGE")?);
        let inodes = PathBuf::from(format!("{}.inodes", image.display()));
        let dirs_file = PathBuf::from(format!("{}.dirs", image.display()));
        std::fs::create_dir_all(&image).ok()?;
        std::fs::create_dir_all(&inodes).ok()?;
        let disk = Disk { root, image, inodes, dirs_file, state: Mutex::new(State::default()) };
        let mut state = disk.state.lock().unwrap_or_else(|p| p.into_inner());
        state.dirs.insert(PathBuf::new());
        disk.save_dirs(&state);
        drop(state);
        Some(disk)
    })
    .as_ref()
}

/// Runs `f` on the disk unless this thread is already inside the library.
fn watched(f: impl FnOnce(&Disk)) {
    if INSIDE.with(Cell::get) {
        return;
    }
    INSIDE.with(|i| i.set(true));
    if let Some(disk) = disk() {
        f(disk);
    }
    INSIDE.with(|i| i.set(false));
}

/// `path` (as a call named it, relative to `dirfd`) made absolute.
fn absolute(dirfd: c_int, path: *const c_char) -> Option<PathBuf> {
    if path.is_null() {
        return None;
    }
    // SAFETY: the caller passed a NUL-terminated path to libc.
    let path = Path::new(std::ffi::OsStr::from_bytes(unsafe { CStr::from_ptr(path) }.to_bytes()));
    if path.is_absolute() {
        return Some(path.to_path_buf());
    }
    let base = if dirfd == AT_FDCWD { std::env::current_dir().ok()? } else { std::fs::read_link(format!("/proc/self/fd/{dirfd}")).ok()? };
    Some(base.join(path))
}

fn parent(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new(""))
}

impl Disk {
    fn relative(&self, path: &Path) -> Option<PathBuf> {
        path.strip_prefix(&self.root).ok().map(Path::to_path_buf)
    }

    fn inode_copy(&self, ino: Ino) -> PathBuf {
        self.inodes.join(format!("{}-{}", ino.0, ino.1))
    }

    /// Writes `from` to the image's `name` whole or not at all.
    fn put(&self, name: &Path, from: &Path) {
        let dest = self.image.join(name);
        if let Some(dir) = dest.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = PathBuf::from(format!("{}.powercut-tmp", dest.display()));
        if std::fs::copy(from, &tmp).is_ok() {
            let _ = std::fs::rename(&tmp, &dest);
        }
    }

    /// `fd` was synced: its content (a file) or its entries (a directory)
    /// are durable.
    fn synced(&self, fd: c_int) {
        let proc_path = PathBuf::from(format!("/proc/self/fd/{fd}"));
        let Ok(path) = std::fs::read_link(&proc_path) else { return };
        let Some(rel) = self.relative(&path) else { return };
        let Ok(meta) = std::fs::metadata(&proc_path) else { return };
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if meta.is_dir() {
            self.apply(&mut state, &rel);
            return;
        }
        if !meta.is_file() || path.as_os_str().as_bytes().ends_with(b" (deleted)") {
            return;
        }
        let ino = (meta.dev(), meta.ino());
        let copy = self.inode_copy(ino);
        let tmp = PathBuf::from(format!("{}.powercut-tmp", copy.display()));
        if std::fs::copy(&proc_path, &tmp).is_err() || std::fs::rename(&tmp, &copy).is_err() {
            return;
        }
        if !state.names.values().any(|&i| i == ino) {
            state.names.insert(rel, ino);
        }
        let names: Vec<PathBuf> = state.names.iter().filter(|(_, i)| **i == ino).map(|(n, _)| n.clone()).collect();
        for name in names {
            self.put(&name, &copy);
        }
    }

    /// Makes durable the pending name changes that touch directory `dir`.
    fn apply(&self, state: &mut State, dir: &Path) {
        let pending = std::mem::take(&mut state.pending);
        for op in pending {
            match op {
                Op::Rename { from, to, ino } if parent(&to) == dir || from.as_deref().is_some_and(|f| parent(f) == dir) => {
                    if let Some(from) = from {
                        state.names.remove(&from);
                        let _ = std::fs::remove_file(self.image.join(&from));
                    }
                    let copy = self.inode_copy(ino);
                    if copy.exists() {
                        state.names.insert(to.clone(), ino);
                        self.put(&to, &copy);
                    } else {
                        // Its content was never synced: no such file.
                        state.names.remove(&to);
                        let _ = std::fs::remove_file(self.image.join(&to));
                    }
                }
                Op::Remove(path) if parent(&path) == dir => {
                    state.names.remove(&path);
                    state.dirs.remove(&path);
                    let image = self.image.join(&path);
                    let _ = std::fs::remove_file(&image).or_else(|_| std::fs::remove_dir(&image));
                }
                Op::MakeDir(path) if parent(&path) == dir => {
                    state.dirs.insert(path);
                }
                op => state.pending.push(op),
            }
        }
        self.save_dirs(state);
    }

    /// Writes the list of durable directories whole.
    fn save_dirs(&self, state: &State) {
        let list: Vec<String> = state.dirs.iter().map(|d| d.display().to_string()).collect();
        let tmp = PathBuf::from(format!("{}.powercut-tmp", self.dirs_file.display()));
        if std::fs::write(&tmp, list.join("\n")).is_ok() {
            let _ = std::fs::rename(&tmp, &self.dirs_file);
        }
    }

    fn made_dir(&self, path: PathBuf) {
        if let Some(rel) = self.relative(&path) {
            self.state.lock().unwrap_or_else(|p| p.into_inner()).pending.push(Op::MakeDir(rel));
        }
    }

    fn renamed(&self, from: PathBuf, to: PathBuf) {
        let (from_rel, to_rel) = (self.relative(&from), self.relative(&to));
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match to_rel {
            Some(to) => {
                let Ok(meta) = std::fs::symlink_metadata(self.root.join(&to)) else { return };
                state.pending.push(Op::Rename { from: from_rel, to, ino: (meta.dev(), meta.ino()) });
            }
            None => state.pending.extend(from_rel.map(Op::Remove)),
        }
    }

    fn removed(&self, path: PathBuf) {
        if let Some(rel) = self.relative(&path) {
            self.state.lock().unwrap_or_else(|p| p.into_inner()).pending.push(Op::Remove(rel));
        }
    }
}

/// Calls `real` (libc's `fsync` or `fdatasync`); on success, `fd`'s
/// content or entries are durable.
fn sync_with(real: unsafe extern "C" fn(c_int) -> c_int, fd: c_int) -> c_int {
    // SAFETY: forwarded as the caller gave it.
    let rc = unsafe { real(fd) };
    if rc == 0 {
        watched(|d| d.synced(fd));
    }
    rc
}

/// # Safety
/// As libc's `fsync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    sync_with(real!("fsync", unsafe extern "C" fn(c_int) -> c_int), fd)
}

/// # Safety
/// As libc's `fdatasync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    sync_with(real!("fdatasync", unsafe extern "C" fn(c_int) -> c_int), fd)
}

/// After a rename call returned `rc`: a successful one is a pending name
/// change.
fn after_rename(rc: c_int, olddir: c_int, old: *const c_char, newdir: c_int, new: *const c_char) -> c_int {
    if rc == 0 {
        watched(|d| {
            if let (Some(from), Some(to)) = (absolute(olddir, old), absolute(newdir, new)) {
                d.renamed(from, to);
            }
        });
    }
    rc
}

/// # Safety
/// As libc's `rename`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rename(old: *const c_char, new: *const c_char) -> c_int {
    let real = real!("rename", unsafe extern "C" fn(*const c_char, *const c_char) -> c_int);
    // SAFETY: forwarded as given.
    after_rename(unsafe { real(old, new) }, AT_FDCWD, old, AT_FDCWD, new)
}

/// # Safety
/// As libc's `renameat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn renameat(olddir: c_int, old: *const c_char, newdir: c_int, new: *const c_char) -> c_int {
    let real = real!("renameat", unsafe extern "C" fn(c_int, *const c_char, c_int, *const c_char) -> c_int);
    // SAFETY: forwarded as given.
    after_rename(unsafe { real(olddir, old, newdir, new) }, olddir, old, newdir, new)
}

/// # Safety
/// As libc's `renameat2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn renameat2(olddir: c_int, old: *const c_char, newdir: c_int, new: *const c_char, flags: c_uint) -> c_int {
    let real = real!("renameat2", unsafe extern "C" fn(c_int, *const c_char, c_int, *const c_char, c_uint) -> c_int);
    // SAFETY: forwarded as given.
    after_rename(unsafe { real(olddir, old, newdir, new, flags) }, olddir, old, newdir, new)
}

/// After a call on one path returned `rc`: a successful one is recorded
/// by `record` (a new directory, a removal).
fn after_path_call(rc: c_int, dir: c_int, path: *const c_char, record: fn(&Disk, PathBuf)) -> c_int {
    if rc == 0 {
        watched(|d| record(d, absolute(dir, path).unwrap_or_default()));
    }
    rc
}

/// # Safety
/// As libc's `mkdir`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: c_uint) -> c_int {
    let real = real!("mkdir", unsafe extern "C" fn(*const c_char, c_uint) -> c_int);
    // SAFETY: forwarded as given.
    after_path_call(unsafe { real(path, mode) }, AT_FDCWD, path, Disk::made_dir)
}

/// # Safety
/// As libc's `mkdirat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdirat(dir: c_int, path: *const c_char, mode: c_uint) -> c_int {
    let real = real!("mkdirat", unsafe extern "C" fn(c_int, *const c_char, c_uint) -> c_int);
    // SAFETY: forwarded as given.
    after_path_call(unsafe { real(dir, path, mode) }, dir, path, Disk::made_dir)
}

/// # Safety
/// As libc's `unlink`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    let real = real!("unlink", unsafe extern "C" fn(*const c_char) -> c_int);
    // SAFETY: forwarded as given.
    after_path_call(unsafe { real(path) }, AT_FDCWD, path, Disk::removed)
}

/// # Safety
/// As libc's `unlinkat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlinkat(dir: c_int, path: *const c_char, flags: c_int) -> c_int {
    let real = real!("unlinkat", unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int);
    // SAFETY: forwarded as given.
    after_path_call(unsafe { real(dir, path, flags) }, dir, path, Disk::removed)
}

/// # Safety
/// As libc's `rmdir`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    let real = real!("rmdir", unsafe extern "C" fn(*const c_char) -> c_int);
    // SAFETY: forwarded as given.
    after_path_call(unsafe { real(path) }, AT_FDCWD, path, Disk::removed)
}
