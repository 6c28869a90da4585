//! A directory on this machine as a [`Remote`], answering the way OpenSSH's sftp-server would.
//!
//! This is what the core's unit tests run against, so it deliberately mirrors sftp-server
//! (OpenSSH 9.x, `sftp-server.c`) rather than offering what a local disk could:
//!
//! * errors are reduced by `errno_to_portable` ([`status_from_errno`]): EEXIST, ENOTEMPTY,
//!   EISDIR, ENOSPC, EXDEV, EROFS, ... all become [`Status::Failure`], so the core must infer the
//!   errno exactly as it has to against a real server;
//! * every operation is the syscall sftp-server makes, with the same arguments: `open(2)` with
//!   the flags of `flags_from_portable`, `pread`-style reads that stop at the first short read,
//!   `truncate`/`chmod`/`utimes`/`chown` applied in that order by SETSTAT (each attempted, the
//!   last error reported), plain RENAME as `link(2)` + `unlink(2)` (refusing an existing
//!   target), `lsetstat@openssh.com` refusing a size with `BAD_MESSAGE`, and so on;
//! * a handle that was closed answers like a slot sftp-server no longer knows: `Failure` for
//!   read/write/fstat/fsetstat, `NoSuchFile` for fsync and close.
//!
//! Paths are absolute paths on "the server", i.e. this machine: the core joins the export root
//! itself, so there is no root here. File names never go through UTF-8.
//!
//! Every method runs its syscalls on tokio's blocking pool (`spawn_blocking`). A syscall on a
//! local file can still block (fsync, a slow or network-backed disk, opening a FIFO), and the
//! [`Remote`] contract says methods must not block the runtime's threads. It also makes each
//! call a real suspension point, as a network round trip is: a future that completed on its
//! first poll would hide ordering bugs in the core that the real remote exposes. The cost, a
//! few microseconds of thread hand-off per call, does not matter for tests.

use std::ffi::CString;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

use super::{
    Attrs, DirEntry, Limits, OpenFlags, Remote, RemoteError, RemoteResult, RenameMode, SetAttrs,
    StatVfs, Status,
};

/// What OpenSSH's `limits@openssh.com` announces for reads and writes (its
/// `SFTP_MAX_READ_LENGTH`: a 256 KiB packet less room for the header).
pub const OPENSSH_MAX_READ_WRITE: u32 = 261_120;

/// `SSH2_FXE_STATVFS_ST_RDONLY` and `SSH2_FXE_STATVFS_ST_NOSUID`, the only two mount flags
/// sftp-server passes on.
pub const STATVFS_ST_RDONLY: u64 = 0x1;
pub const STATVFS_ST_NOSUID: u64 = 0x2;

/// OpenSSH's `errno_to_portable`: the whole of the errno information an SFTP v3 client gets.
pub fn status_from_errno(errno: i32) -> Status {
    match errno {
        libc::ENOENT | libc::ENOTDIR | libc::EBADF | libc::ELOOP => Status::NoSuchFile,
        libc::EPERM | libc::EACCES | libc::EFAULT => Status::PermissionDenied,
        libc::ENAMETOOLONG | libc::EINVAL => Status::BadMessage,
        libc::ENOSYS => Status::OpUnsupported,
        _ => Status::Failure,
    }
}

/// The error sftp-server would send for `errno`, with the errno's text for the log.
fn errno_error(errno: i32) -> RemoteError {
    RemoteError::Status(
        status_from_errno(errno),
        nix::errno::Errno::from_raw(errno).desc().to_owned(),
    )
}

fn io_error(err: io::Error) -> RemoteError {
    match err.raw_os_error() {
        Some(errno) => errno_error(errno),
        // std refused before making a syscall: a path with a NUL byte (which no kernel can hand
        // us; sftp-server could not even parse it) is a malformed request.
        None if err.kind() == io::ErrorKind::InvalidInput => {
            RemoteError::Status(Status::BadMessage, err.to_string())
        }
        // `write_all`'s WriteZero and the like: sftp-server's "short write" Failure.
        None => RemoteError::Status(Status::Failure, err.to_string()),
    }
}

fn last_os_error() -> RemoteError {
    io_error(io::Error::last_os_error())
}

/// `ret == -1` -> the errno, mapped.
fn cvt(ret: libc::c_int) -> RemoteResult<()> {
    if ret == -1 {
        Err(last_os_error())
    } else {
        Ok(())
    }
}

/// What sftp-server answers for a handle it does not (or no longer) know, in the requests
/// whose status starts out as `SSH2_FX_FAILURE`.
fn bad_handle() -> RemoteError {
    RemoteError::Status(Status::Failure, "invalid handle".to_owned())
}

fn c_path(path: &Path) -> RemoteResult<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| RemoteError::Status(Status::BadMessage, "path contains a NUL byte".to_owned()))
}

/// sftp-server's `stat_to_attrib`: all six fields, times truncated to 32 bits.
fn attrs_from_metadata(meta: &fs::Metadata) -> Attrs {
    Attrs {
        size: Some(meta.size()),
        uid: Some(meta.uid()),
        gid: Some(meta.gid()),
        mode: Some(meta.mode()),
        atime: Some(meta.atime() as u32),
        mtime: Some(meta.mtime() as u32),
    }
}

/// Whole-second `[atime, mtime]` for `utimensat`/`futimens` (what `utimes` with zero
/// microseconds does).
fn whole_seconds(atime: u32, mtime: u32) -> [libc::timespec; 2] {
    let at = |secs: u32| {
        // SAFETY: timespec is plain old data; all-zero is a valid value (and clears any
        // padding field some targets have).
        let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
        ts.tv_sec = libc::time_t::from(secs);
        ts.tv_nsec = 0;
        ts
    };
    [at(atime), at(mtime)]
}

/// sftp-server reports the last failing step of a SETSTAT but attempts every step.
fn keep_last_error(status: &mut RemoteResult<()>, step: RemoteResult<()>) {
    if let Err(e) = step {
        *status = Err(e);
    }
}

/// Run `f` on the blocking pool.
async fn blocking<T, F>(f: F) -> RemoteResult<T>
where
    T: Send + 'static,
    F: FnOnce() -> RemoteResult<T> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(RemoteError::Disconnected(
            "local remote: the runtime is shutting down".to_owned(),
        )),
    }
}

/// A directory tree on this machine, answering like OpenSSH's sftp-server. Cloning gives
/// another view of the same "server" (the open-handle count is shared).
#[derive(Debug, Clone)]
pub struct LocalRemote {
    limits: Limits,
    open_handles: Arc<AtomicUsize>,
}

impl Default for LocalRemote {
    fn default() -> Self {
        Self::new()
    }
}

impl LocalRemote {
    /// A remote whose `limits()` are what OpenSSH announces: 261120-byte reads and writes,
    /// `RLIMIT_NOFILE - 5` open handles.
    pub fn new() -> Self {
        let mut max_open_handles = 1024 - 5;
        // SAFETY: getrlimit only writes the struct we pass.
        let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 && rl.rlim_cur > 5 {
            max_open_handles = rl.rlim_cur as u64 - 5;
        }
        Self::with_limits(Limits {
            max_read: OPENSSH_MAX_READ_WRITE,
            max_write: OPENSSH_MAX_READ_WRITE,
            max_open_handles,
        })
    }

    /// A remote announcing other limits (to test the core's chunking with small sizes). Reads
    /// longer than `max_read` are cut to it, as sftp-server does; a write longer than
    /// `max_write` is refused with [`RemoteError::Protocol`] (sftp-server would drop the
    /// session on an oversized packet).
    pub fn with_limits(limits: Limits) -> Self {
        LocalRemote {
            limits,
            open_handles: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Handles opened through this remote (or a clone) and not yet closed with
    /// [`Remote::close`]: what sftp-server's handle table would hold. A leak test asserts this
    /// is back to zero. (Dropping a [`LocalHandle`] closes the file but does not count as a
    /// close: a real server would keep the handle until the session ends.)
    pub fn open_handles(&self) -> usize {
        self.open_handles.load(Ordering::SeqCst)
    }
}

/// An open file of a [`LocalRemote`]. Clones share the file; [`Remote::close`] closes it for
/// every clone.
#[derive(Clone)]
pub struct LocalHandle {
    state: Arc<HandleState>,
}

struct HandleState {
    /// `None` once closed. The `Arc` lets an operation in flight keep the descriptor alive
    /// past a concurrent close (the descriptor is then closed when it finishes) instead of
    /// racing a reused descriptor number.
    file: Mutex<Option<Arc<File>>>,
    flags: OpenFlags,
    path: PathBuf,
}

impl LocalHandle {
    /// The flags the file was opened with.
    pub fn flags(&self) -> OpenFlags {
        self.state.flags
    }

    /// The path the file was opened by (for messages; the file may since have moved).
    pub fn path(&self) -> &Path {
        &self.state.path
    }

    pub fn is_closed(&self) -> bool {
        self.lock().is_none()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<File>>> {
        self.state
            .file
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn file(&self) -> Option<Arc<File>> {
        self.lock().clone()
    }
}

impl fmt::Debug for LocalHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("LocalHandle");
        d.field("path", &self.state.path)
            .field("flags", &self.state.flags);
        match self.file() {
            Some(file) => d.field("fd", &file.as_raw_fd()),
            None => d.field("fd", &"closed"),
        };
        d.finish()
    }
}

/// sftp-server's `flags_from_portable`, plus O_CLOEXEC.
fn open_flags(flags: OpenFlags) -> libc::c_int {
    let mut o = match (flags.read, flags.write) {
        (true, true) => libc::O_RDWR,
        (false, true) => libc::O_WRONLY,
        // Read only, and also neither: sftp-server starts from 0 == O_RDONLY.
        _ => libc::O_RDONLY,
    };
    if flags.append {
        o |= libc::O_APPEND;
    }
    if flags.create {
        o |= libc::O_CREAT;
    }
    if flags.truncate {
        o |= libc::O_TRUNC;
    }
    if flags.exclusive {
        o |= libc::O_EXCL;
    }
    o | libc::O_CLOEXEC
}

/// Plain SFTP RENAME as sftp-server's `process_rename` does it: a regular file is renamed
/// race-free with `link` + `unlink` (so an existing target makes `link` fail with EEXIST);
/// when the filesystem cannot link, and for everything that is not a regular file, it checks
/// with `stat` (following symlinks) that the target is absent and then `rename`s.
fn rename_no_replace(from: &Path, to: &Path) -> RemoteResult<()> {
    let target_exists =
        || RemoteError::Status(Status::Failure, nix::errno::Errno::EEXIST.desc().to_owned());
    let meta = fs::symlink_metadata(from).map_err(io_error)?;
    if meta.file_type().is_file() {
        match fs::hard_link(from, to) {
            Ok(()) => {
                if let Err(e) = fs::remove_file(from) {
                    // Clean the spare link, as sftp-server does.
                    let _ = fs::remove_file(to);
                    return Err(io_error(e));
                }
                Ok(())
            }
            // "fs doesn't support links": EOPNOTSUPP, ENOSYS, EXDEV, and on Linux
            // LINK_OPNOTSUPP_ERRNO, which OpenSSH's configure sets to EPERM.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EXDEV | libc::EPERM)
                ) =>
            {
                if fs::metadata(to).is_ok() {
                    return Err(target_exists());
                }
                fs::rename(from, to).map_err(io_error)
            }
            Err(e) => Err(io_error(e)),
        }
    } else if fs::metadata(to).is_ok() {
        Err(target_exists())
    } else {
        fs::rename(from, to).map_err(io_error)
    }
}

impl Remote for LocalRemote {
    type Handle = LocalHandle;

    fn limits(&self) -> Limits {
        self.limits
    }

    async fn lstat(&self, path: &Path) -> RemoteResult<Attrs> {
        let path = path.to_owned();
        blocking(move || {
            fs::symlink_metadata(&path)
                .map(|m| attrs_from_metadata(&m))
                .map_err(io_error)
        })
        .await
    }

    async fn stat(&self, path: &Path) -> RemoteResult<Attrs> {
        let path = path.to_owned();
        blocking(move || {
            fs::metadata(&path)
                .map(|m| attrs_from_metadata(&m))
                .map_err(io_error)
        })
        .await
    }

    async fn fstat(&self, handle: &LocalHandle) -> RemoteResult<Attrs> {
        let file = handle.file().ok_or_else(bad_handle)?;
        blocking(move || {
            file.metadata()
                .map(|m| attrs_from_metadata(&m))
                .map_err(io_error)
        })
        .await
    }

    async fn setstat(&self, path: &Path, attrs: SetAttrs) -> RemoteResult<()> {
        let path = c_path(path)?;
        blocking(move || {
            let p = path.as_ptr();
            let mut status = Ok(());
            // SAFETY (all four): `p` is a NUL-terminated path that outlives the call; the
            // time array has the two entries utimensat reads.
            if let Some(size) = attrs.size {
                // u64 -> off_t like sftp-server: a size past i64::MAX becomes EINVAL.
                keep_last_error(&mut status, cvt(unsafe { libc::truncate(p, size as _) }));
            }
            if let Some(perm) = attrs.perm {
                keep_last_error(&mut status, cvt(unsafe { libc::chmod(p, perm & 0o7777) }));
            }
            if let Some((atime, mtime)) = attrs.atime_mtime {
                let times = whole_seconds(atime, mtime);
                keep_last_error(
                    &mut status,
                    cvt(unsafe { libc::utimensat(libc::AT_FDCWD, p, times.as_ptr(), 0) }),
                );
            }
            if let Some((uid, gid)) = attrs.uid_gid {
                keep_last_error(&mut status, cvt(unsafe { libc::chown(p, uid, gid) }));
            }
            status
        })
        .await
    }

    async fn lsetstat(&self, path: &Path, attrs: SetAttrs) -> RemoteResult<()> {
        if attrs.size.is_some() {
            // `/* nonsensical for links */`: refused before anything else is applied.
            return Err(RemoteError::Status(
                Status::BadMessage,
                "lsetstat cannot set a size".to_owned(),
            ));
        }
        let path = c_path(path)?;
        blocking(move || {
            let p = path.as_ptr();
            let nofollow = libc::AT_SYMLINK_NOFOLLOW;
            let mut status = Ok(());
            // SAFETY: as in setstat.
            if let Some(perm) = attrs.perm {
                // On Linux a symlink's own mode cannot be changed: EOPNOTSUPP -> Failure.
                keep_last_error(
                    &mut status,
                    cvt(unsafe { libc::fchmodat(libc::AT_FDCWD, p, perm & 0o7777, nofollow) }),
                );
            }
            if let Some((atime, mtime)) = attrs.atime_mtime {
                let times = whole_seconds(atime, mtime);
                keep_last_error(
                    &mut status,
                    cvt(unsafe { libc::utimensat(libc::AT_FDCWD, p, times.as_ptr(), nofollow) }),
                );
            }
            if let Some((uid, gid)) = attrs.uid_gid {
                keep_last_error(
                    &mut status,
                    cvt(unsafe { libc::fchownat(libc::AT_FDCWD, p, uid, gid, nofollow) }),
                );
            }
            status
        })
        .await
    }

    async fn fsetstat(&self, handle: &LocalHandle, attrs: SetAttrs) -> RemoteResult<()> {
        let file = handle.file().ok_or_else(bad_handle)?;
        blocking(move || {
            let fd = file.as_raw_fd();
            let mut status = Ok(());
            // SAFETY: `fd` is open for as long as `file` lives; the time array has two
            // entries.
            if let Some(size) = attrs.size {
                // On a handle not open for writing this is EINVAL -> BadMessage, as with
                // sftp-server.
                keep_last_error(&mut status, cvt(unsafe { libc::ftruncate(fd, size as _) }));
            }
            if let Some(perm) = attrs.perm {
                keep_last_error(&mut status, cvt(unsafe { libc::fchmod(fd, perm & 0o7777) }));
            }
            if let Some((atime, mtime)) = attrs.atime_mtime {
                let times = whole_seconds(atime, mtime);
                keep_last_error(
                    &mut status,
                    cvt(unsafe { libc::futimens(fd, times.as_ptr()) }),
                );
            }
            if let Some((uid, gid)) = attrs.uid_gid {
                keep_last_error(&mut status, cvt(unsafe { libc::fchown(fd, uid, gid) }));
            }
            status
        })
        .await
    }

    async fn read_dir(&self, path: &Path) -> RemoteResult<Vec<DirEntry>> {
        let path = path.to_owned();
        blocking(move || {
            // std's ReadDir leaves out `.` and `..`.
            let mut entries = Vec::new();
            for entry in fs::read_dir(&path).map_err(io_error)? {
                let entry = entry.map_err(io_error)?;
                // An lstat (fstatat with AT_SYMLINK_NOFOLLOW); like sftp-server, an entry that
                // vanished in between is skipped.
                let Ok(meta) = entry.metadata() else {
                    continue;
                };
                entries.push(DirEntry {
                    name: entry.file_name(),
                    attrs: attrs_from_metadata(&meta),
                    nlink: Some(u32::try_from(meta.nlink()).unwrap_or(u32::MAX)),
                });
            }
            Ok(entries)
        })
        .await
    }

    async fn open(&self, path: &Path, flags: OpenFlags, perm: u32) -> RemoteResult<LocalHandle> {
        let c = c_path(path)?;
        let file = blocking(move || {
            // The mode goes to open(2) as is; the kernel applies the process umask (sftp-server
            // runs with the umask sshd gave it unless started with -u).
            // SAFETY: `c` is NUL-terminated; on success we own the new descriptor.
            let fd = unsafe { libc::open(c.as_ptr(), open_flags(flags), perm as libc::c_uint) };
            if fd == -1 {
                return Err(last_os_error());
            }
            Ok(unsafe { File::from_raw_fd(fd) })
        })
        .await?;
        self.open_handles.fetch_add(1, Ordering::SeqCst);
        Ok(LocalHandle {
            state: Arc::new(HandleState {
                file: Mutex::new(Some(Arc::new(file))),
                flags,
                path: path.to_owned(),
            }),
        })
    }

    /// There are no channels here: the file is simply opened again, `n` times (so the core's
    /// striping of large writes is exercised by its unit tests).
    async fn open_alongside(
        &self,
        path: &Path,
        flags: OpenFlags,
        _beside: &LocalHandle,
        n: usize,
    ) -> RemoteResult<Vec<LocalHandle>> {
        let mut handles = Vec::with_capacity(n);
        for _ in 0..n {
            match self.open(path, flags.for_reopen(), 0).await {
                Ok(h) => handles.push(h),
                Err(e) => {
                    for h in &handles {
                        let _ = self.close(h).await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(handles)
    }

    async fn read(&self, handle: &LocalHandle, offset: u64, len: u32) -> RemoteResult<Bytes> {
        let file = handle.file().ok_or_else(bad_handle)?;
        let len = len.min(self.limits.max_read) as usize;
        blocking(move || {
            // One read, like sftp-server: whatever it returns is the answer. On a regular file
            // a short read only happens at end of file.
            let mut buf = vec![0; len];
            let n = loop {
                match file.read_at(&mut buf, offset) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(io_error(e)),
                }
            };
            buf.truncate(n);
            Ok(Bytes::from(buf))
        })
        .await
    }

    async fn write(&self, handle: &LocalHandle, offset: u64, data: Bytes) -> RemoteResult<()> {
        if data.len() > self.limits.max_write as usize {
            return Err(RemoteError::Protocol(format!(
                "write of {} bytes is over max_write {} (sftp-server would drop the session)",
                data.len(),
                self.limits.max_write
            )));
        }
        let file = handle.file().ok_or_else(bad_handle)?;
        let append = handle.flags().append;
        blocking(move || {
            if append {
                // sftp-server skips the lseek on an O_APPEND handle: the data goes to the end
                // whatever the offset.
                (&*file).write_all(&data)
            } else {
                file.write_all_at(&data, offset)
            }
            .map_err(io_error)
        })
        .await
    }

    /// As sftp-server's `copy-data`: the same handle, path or file on both sides is refused,
    /// the copy goes through a 64 KiB buffer, and a source that ends early answers `Eof`.
    async fn copy_data(
        &self,
        from: &LocalHandle,
        from_offset: u64,
        len: u64,
        to: &LocalHandle,
        to_offset: u64,
    ) -> RemoteResult<()> {
        let (src, dst) = (
            from.file().ok_or_else(bad_handle)?,
            to.file().ok_or_else(bad_handle)?,
        );
        let same_file = |a: &File, b: &File| -> RemoteResult<bool> {
            let (a, b) = (
                a.metadata().map_err(io_error)?,
                b.metadata().map_err(io_error)?,
            );
            Ok(a.dev() == b.dev() && a.ino() == b.ino())
        };
        if from.path() == to.path() || same_file(&src, &dst)? {
            return Err(RemoteError::Status(
                Status::Failure,
                "copy-data within one file".into(),
            ));
        }
        let append = to.flags().append;
        blocking(move || {
            let mut buf = vec![0u8; 64 * 1024];
            let mut done = 0u64;
            while done < len {
                let want = (len - done).min(buf.len() as u64) as usize;
                let n = loop {
                    match src.read_at(&mut buf[..want], from_offset + done) {
                        Ok(n) => break n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(io_error(e)),
                    }
                };
                if n == 0 {
                    return Err(RemoteError::Status(Status::Eof, "end of file".into()));
                }
                if append {
                    (&*dst).write_all(&buf[..n])
                } else {
                    dst.write_all_at(&buf[..n], to_offset + done)
                }
                .map_err(io_error)?;
                done += n as u64;
            }
            Ok(())
        })
        .await
    }

    async fn fsync(&self, handle: &LocalHandle) -> RemoteResult<()> {
        // sftp-server answers NO_SUCH_FILE to fsync on an unknown handle.
        let file = handle.file().ok_or_else(|| errno_error(libc::ENOENT))?;
        blocking(move || file.sync_all().map_err(io_error)).await
    }

    async fn write_back_early(&self, path: &Path) -> RemoteResult<()> {
        // What the SFTP remote has the server do: open read-only (a regular file only, and
        // not opened: nothing to do), fsync, close.
        let path = path.to_owned();
        blocking(move || {
            if !fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file()) {
                return Ok(());
            }
            match File::open(&path) {
                Ok(f) => f.sync_all().map_err(io_error),
                Err(_) => Ok(()),
            }
        })
        .await
    }

    async fn close(&self, handle: &LocalHandle) -> RemoteResult<()> {
        // handle_close sets ENOENT for an unknown handle.
        let file = handle
            .lock()
            .take()
            .ok_or_else(|| errno_error(libc::ENOENT))?;
        self.open_handles.fetch_sub(1, Ordering::SeqCst);
        match Arc::try_unwrap(file) {
            // Close it ourselves to report close(2)'s error, as sftp-server does.
            // SAFETY: we own the descriptor `into_raw_fd` released.
            Ok(file) => blocking(move || cvt(unsafe { libc::close(file.into_raw_fd()) })).await,
            // An operation still in flight holds the file; it closes when that finishes.
            Err(_in_flight) => Ok(()),
        }
    }

    async fn remove(&self, path: &Path) -> RemoteResult<()> {
        let path = path.to_owned();
        // unlink(2): a directory gives EISDIR -> Failure.
        blocking(move || fs::remove_file(&path).map_err(io_error)).await
    }

    async fn mkdir(&self, path: &Path, perm: u32) -> RemoteResult<()> {
        let path = path.to_owned();
        blocking(move || {
            fs::DirBuilder::new()
                .mode(perm & 0o7777)
                .create(&path)
                .map_err(io_error)
        })
        .await
    }

    async fn rmdir(&self, path: &Path) -> RemoteResult<()> {
        let path = path.to_owned();
        blocking(move || fs::remove_dir(&path).map_err(io_error)).await
    }

    async fn rename(&self, from: &Path, to: &Path, mode: RenameMode) -> RemoteResult<()> {
        let (from, to) = (from.to_owned(), to.to_owned());
        blocking(move || match mode {
            RenameMode::Replace => fs::rename(&from, &to).map_err(io_error),
            RenameMode::NoReplace => rename_no_replace(&from, &to),
        })
        .await
    }

    async fn symlink(&self, target: &Path, link: &Path) -> RemoteResult<()> {
        let (target, link) = (target.to_owned(), link.to_owned());
        blocking(move || std::os::unix::fs::symlink(&target, &link).map_err(io_error)).await
    }

    async fn readlink(&self, path: &Path) -> RemoteResult<PathBuf> {
        let path = path.to_owned();
        // Not a symlink: EINVAL -> BadMessage.
        blocking(move || fs::read_link(&path).map_err(io_error)).await
    }

    async fn hardlink(&self, existing: &Path, new: &Path) -> RemoteResult<()> {
        let (existing, new) = (existing.to_owned(), new.to_owned());
        // linkat without AT_SYMLINK_FOLLOW, i.e. Linux's link(2).
        blocking(move || fs::hard_link(&existing, &new).map_err(io_error)).await
    }

    async fn statvfs(&self, path: &Path) -> RemoteResult<StatVfs> {
        let path = c_path(path)?;
        blocking(move || {
            // SAFETY: statvfs only writes the struct we pass; `path` is NUL-terminated.
            let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
            cvt(unsafe { libc::statvfs(path.as_ptr(), &mut st) })?;
            let mut flag = 0;
            if st.f_flag & libc::ST_RDONLY != 0 {
                flag |= STATVFS_ST_RDONLY;
            }
            if st.f_flag & libc::ST_NOSUID != 0 {
                flag |= STATVFS_ST_NOSUID;
            }
            Ok(StatVfs {
                bsize: st.f_bsize as u64,
                frsize: st.f_frsize as u64,
                blocks: st.f_blocks as u64,
                bfree: st.f_bfree as u64,
                bavail: st.f_bavail as u64,
                files: st.f_files as u64,
                ffree: st.f_ffree as u64,
                favail: st.f_favail as u64,
                fsid: st.f_fsid as u64,
                flag,
                namemax: st.f_namemax as u64,
            })
        })
        .await
    }

    async fn realpath(&self, path: &Path) -> RemoteResult<PathBuf> {
        // sftp-server resolves "" as ".".
        let path = if path.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            path.to_owned()
        };
        // realpath(3): a missing component is ENOENT.
        blocking(move || fs::canonicalize(&path).map_err(io_error)).await
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::remote::FileKind;

    fn status(r: RemoteResult<impl fmt::Debug>) -> Status {
        match r {
            Err(RemoteError::Status(s, _)) => s,
            other => panic!("expected a status error, got {other:?}"),
        }
    }

    fn rw_create() -> OpenFlags {
        OpenFlags {
            read: true,
            write: true,
            create: true,
            ..Default::default()
        }
    }

    /// A file with `data` in it, made directly on disk.
    fn put(path: &Path, data: &[u8]) {
        fs::write(path, data).unwrap();
    }

    #[test]
    fn errno_mapping_is_openssh_errno_to_portable() {
        use libc::*;
        for (errno, want) in [
            (ENOENT, Status::NoSuchFile),
            (ENOTDIR, Status::NoSuchFile),
            (EBADF, Status::NoSuchFile),
            (ELOOP, Status::NoSuchFile),
            (EPERM, Status::PermissionDenied),
            (EACCES, Status::PermissionDenied),
            (EFAULT, Status::PermissionDenied),
            (ENAMETOOLONG, Status::BadMessage),
            (EINVAL, Status::BadMessage),
            (ENOSYS, Status::OpUnsupported),
            (EEXIST, Status::Failure),
            (ENOTEMPTY, Status::Failure),
            (EISDIR, Status::Failure),
            (ENOSPC, Status::Failure),
            (EXDEV, Status::Failure),
            (EROFS, Status::Failure),
            (EBUSY, Status::Failure),
            (EIO, Status::Failure),
            (EOPNOTSUPP, Status::Failure),
        ] {
            assert_eq!(status_from_errno(errno), want, "errno {errno}");
        }
        assert_eq!(
            errno_error(ENOENT),
            RemoteError::Status(Status::NoSuchFile, "No such file or directory".into())
        );
    }

    #[tokio::test]
    async fn limits_are_openssh_ones() {
        let l = LocalRemote::new().limits();
        assert_eq!((l.max_read, l.max_write), (261_120, 261_120));
        assert!(l.max_open_handles >= 64);
    }

    #[tokio::test]
    async fn lstat_stat_and_fstat_fill_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let file = dir.path().join("f");
        put(&file, b"hello");
        let link = dir.path().join("l");
        std::os::unix::fs::symlink("f", &link).unwrap();

        let a = r.lstat(&file).await.unwrap();
        let meta = fs::metadata(&file).unwrap();
        assert_eq!(a.size, Some(5));
        assert_eq!(a.uid, Some(meta.uid()));
        assert_eq!(a.gid, Some(meta.gid()));
        assert_eq!(a.mode, Some(meta.mode()));
        assert_eq!(a.atime, Some(meta.atime() as u32));
        assert_eq!(a.mtime, Some(meta.mtime() as u32));
        assert_eq!(a.file_type(), FileKind::File);

        let l = r.lstat(&link).await.unwrap();
        assert_eq!(l.file_type(), FileKind::Symlink);
        assert_eq!(l.size, Some(1)); // the target's length
        assert_eq!(r.stat(&link).await.unwrap(), a);
        assert_eq!(
            r.lstat(dir.path()).await.unwrap().file_type(),
            FileKind::Dir
        );

        let h = r.open(&link, OpenFlags::read_only(), 0).await.unwrap();
        assert_eq!(r.fstat(&h).await.unwrap(), a);
        r.close(&h).await.unwrap();
    }

    #[tokio::test]
    async fn missing_and_bad_paths_map_coarsely() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let file = dir.path().join("f");
        put(&file, b"");
        let missing = dir.path().join("missing");

        assert_eq!(status(r.lstat(&missing).await), Status::NoSuchFile);
        assert_eq!(status(r.stat(&missing).await), Status::NoSuchFile);
        // ENOTDIR
        assert_eq!(status(r.lstat(&file.join("x")).await), Status::NoSuchFile);
        // ENAMETOOLONG
        let long = dir.path().join("x".repeat(300));
        assert_eq!(status(r.lstat(&long).await), Status::BadMessage);
        // A NUL byte cannot even be sent.
        let nul = Path::new(OsStr::from_bytes(b"/tmp/a\0b"));
        assert_eq!(status(r.lstat(nul).await), Status::BadMessage);
        assert_eq!(
            status(r.setstat(nul, SetAttrs::default()).await),
            Status::BadMessage
        );
        // ELOOP
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        assert_eq!(status(r.stat(&a).await), Status::NoSuchFile);
    }

    #[tokio::test]
    async fn open_create_read_write() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let path = dir.path().join("new");

        assert_eq!(
            status(r.open(&path, OpenFlags::read_only(), 0o644).await),
            Status::NoSuchFile
        );
        let h = r.open(&path, rw_create(), 0o600).await.unwrap();
        assert_eq!(r.open_handles(), 1);
        assert_eq!(h.flags(), rw_create());
        assert_eq!(h.path(), path);
        // 0o600 is untouched by any usual umask.
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);

        r.write(&h, 0, Bytes::from_static(b"hello world"))
            .await
            .unwrap();
        r.write(&h, 6, Bytes::from_static(b"WORLD")).await.unwrap();
        // A hole, then data.
        r.write(&h, 20, Bytes::from_static(b"!")).await.unwrap();
        assert_eq!(&r.read(&h, 0, 11).await.unwrap()[..], b"hello WORLD");
        assert_eq!(&r.read(&h, 6, 3).await.unwrap()[..], b"WOR");
        let all = r.read(&h, 0, 100).await.unwrap();
        assert_eq!(all.len(), 21);
        assert_eq!(&all[11..20], &[0; 9]);
        // End of file is an empty answer, not an error.
        assert!(r.read(&h, 21, 10).await.unwrap().is_empty());
        assert!(r.read(&h, 1000, 10).await.unwrap().is_empty());
        assert!(r.read(&h, 0, 0).await.unwrap().is_empty());
        r.fsync(&h).await.unwrap();
        r.close(&h).await.unwrap();
        assert_eq!(r.open_handles(), 0);
        assert_eq!(fs::read(&path).unwrap().len(), 21);
    }

    #[tokio::test]
    async fn open_flags_truncate_exclusive_and_write_only() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let path = dir.path().join("f");
        put(&path, b"old contents");

        // Exclusive create over an existing file: EEXIST -> Failure.
        let excl = OpenFlags {
            write: true,
            create: true,
            exclusive: true,
            ..Default::default()
        };
        assert_eq!(status(r.open(&path, excl, 0o644).await), Status::Failure);
        assert_eq!(r.open_handles(), 0);

        let trunc = OpenFlags {
            write: true,
            truncate: true,
            ..Default::default()
        };
        let h = r.open(&path, trunc, 0).await.unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), 0);
        // Reading a write-only handle: EBADF, which OpenSSH maps to NoSuchFile.
        assert_eq!(status(r.read(&h, 0, 10).await), Status::NoSuchFile);
        r.close(&h).await.unwrap();

        let h = r.open(&path, OpenFlags::read_only(), 0).await.unwrap();
        assert_eq!(
            status(r.write(&h, 0, Bytes::from_static(b"x")).await),
            Status::NoSuchFile
        );
        // ftruncate on a read-only descriptor: EINVAL -> BadMessage.
        let size = SetAttrs {
            size: Some(0),
            ..Default::default()
        };
        assert_eq!(status(r.fsetstat(&h, size).await), Status::BadMessage);
        r.close(&h).await.unwrap();

        // Neither read nor write: sftp-server opens O_RDONLY.
        let h = r.open(&path, OpenFlags::default(), 0).await.unwrap();
        r.close(&h).await.unwrap();
    }

    #[tokio::test]
    async fn directories_cannot_be_opened_for_writing_or_read() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let w = OpenFlags {
            write: true,
            ..Default::default()
        };
        // EISDIR -> Failure.
        assert_eq!(status(r.open(dir.path(), w, 0).await), Status::Failure);
        let h = r.open(dir.path(), OpenFlags::read_only(), 0).await.unwrap();
        assert_eq!(status(r.read(&h, 0, 10).await), Status::Failure);
        r.close(&h).await.unwrap();
    }

    #[tokio::test]
    async fn append_writes_go_to_the_end_whatever_the_offset() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let path = dir.path().join("log");
        put(&path, b"one\n");
        let flags = OpenFlags {
            write: true,
            append: true,
            ..Default::default()
        };
        let h = r.open(&path, flags, 0).await.unwrap();
        r.write(&h, 0, Bytes::from_static(b"two\n")).await.unwrap();
        r.write(&h, 1, Bytes::from_static(b"three\n"))
            .await
            .unwrap();
        r.close(&h).await.unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"one\ntwo\nthree\n");
    }

    #[tokio::test]
    async fn reads_are_capped_and_oversized_writes_refused() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::with_limits(Limits {
            max_read: 4,
            max_write: 8,
            max_open_handles: 10,
        });
        let path = dir.path().join("f");
        put(&path, b"0123456789");
        let h = r.open(&path, rw_create(), 0).await.unwrap();
        assert_eq!(&r.read(&h, 0, 100).await.unwrap()[..], b"0123");
        assert!(matches!(
            r.write(&h, 0, Bytes::from_static(b"123456789")).await,
            Err(RemoteError::Protocol(_))
        ));
        r.write(&h, 0, Bytes::from_static(b"abcdefgh"))
            .await
            .unwrap();
        r.close(&h).await.unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"abcdefgh89");
    }

    #[tokio::test]
    async fn closed_handles_answer_like_unknown_sftp_handles() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let path = dir.path().join("f");
        put(&path, b"data");
        let h = r.open(&path, OpenFlags::read_only(), 0).await.unwrap();
        let copy = h.clone();
        assert!(!copy.is_closed());
        r.close(&h).await.unwrap();
        assert!(copy.is_closed());
        assert_eq!(r.open_handles(), 0);
        assert_eq!(status(r.read(&copy, 0, 4).await), Status::Failure);
        assert_eq!(
            status(r.write(&copy, 0, Bytes::from_static(b"x")).await),
            Status::Failure
        );
        assert_eq!(status(r.fstat(&copy).await), Status::Failure);
        assert_eq!(
            status(r.fsetstat(&copy, SetAttrs::default()).await),
            Status::Failure
        );
        assert_eq!(status(r.fsync(&copy).await), Status::NoSuchFile);
        assert_eq!(status(r.close(&copy).await), Status::NoSuchFile);
        assert_eq!(r.open_handles(), 0);
        assert!(format!("{copy:?}").contains("closed"));
    }

    #[tokio::test]
    async fn setstat_follows_symlinks_and_applies_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let file = dir.path().join("f");
        put(&file, b"0123456789");
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let meta = fs::metadata(&file).unwrap();

        let attrs = SetAttrs {
            size: Some(4),
            uid_gid: Some((meta.uid(), meta.gid())),
            perm: Some(0o640),
            atime_mtime: Some((1_000_000_000, 1_200_000_000)),
        };
        r.setstat(&link, attrs).await.unwrap();
        let a = r.stat(&file).await.unwrap();
        assert_eq!(a.size, Some(4));
        assert_eq!(a.mode.unwrap() & 0o7777, 0o640);
        assert_eq!(a.atime, Some(1_000_000_000));
        assert_eq!(a.mtime, Some(1_200_000_000));
        // The link itself is untouched.
        assert_eq!(r.lstat(&link).await.unwrap().file_type(), FileKind::Symlink);

        // Growing makes a hole; perm keeps only the permission bits.
        let grow = SetAttrs {
            size: Some(8),
            perm: Some(0o100_644),
            ..Default::default()
        };
        r.setstat(&file, grow).await.unwrap();
        let a = r.lstat(&file).await.unwrap();
        assert_eq!(a.size, Some(8));
        assert_eq!(a.mode, Some(libc::S_IFREG | 0o644));

        assert_eq!(
            status(r.setstat(&dir.path().join("missing"), grow).await),
            Status::NoSuchFile
        );
        // truncate on a directory: EISDIR -> Failure.
        assert_eq!(status(r.setstat(dir.path(), grow).await), Status::Failure);
    }

    #[tokio::test]
    async fn setstat_attempts_every_step_and_reports_the_failure() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        // The truncate fails (EISDIR), the chmod after it still happens.
        let sub = dir.path().join("d");
        fs::create_dir(&sub).unwrap();
        let attrs = SetAttrs {
            size: Some(0),
            perm: Some(0o700),
            ..Default::default()
        };
        assert_eq!(status(r.setstat(&sub, attrs).await), Status::Failure);
        assert_eq!(fs::metadata(&sub).unwrap().mode() & 0o7777, 0o700);
    }

    #[tokio::test]
    async fn lsetstat_acts_on_the_link_itself() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let file = dir.path().join("f");
        put(&file, b"x");
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let before = r.stat(&file).await.unwrap();

        let times = SetAttrs {
            atime_mtime: Some((1_000, 2_000)),
            ..Default::default()
        };
        r.lsetstat(&link, times).await.unwrap();
        let l = r.lstat(&link).await.unwrap();
        assert_eq!((l.atime, l.mtime), (Some(1_000), Some(2_000)));
        assert_eq!(r.stat(&file).await.unwrap().mtime, before.mtime);

        let owner = SetAttrs {
            uid_gid: Some((l.uid.unwrap(), l.gid.unwrap())),
            ..Default::default()
        };
        r.lsetstat(&link, owner).await.unwrap();

        // Linux cannot chmod a symlink: EOPNOTSUPP -> Failure; the target keeps its mode.
        let perm = SetAttrs {
            perm: Some(0o600),
            ..Default::default()
        };
        assert_eq!(status(r.lsetstat(&link, perm).await), Status::Failure);
        assert_eq!(fs::metadata(&file).unwrap().mode() & 0o777, 0o644);
        // On a regular file it works.
        r.lsetstat(&file, perm).await.unwrap();
        assert_eq!(fs::metadata(&file).unwrap().mode() & 0o777, 0o600);

        // A size is refused outright, before anything else is applied.
        let size = SetAttrs {
            size: Some(0),
            atime_mtime: Some((5, 5)),
            ..Default::default()
        };
        assert_eq!(status(r.lsetstat(&file, size).await), Status::BadMessage);
        assert_eq!(fs::metadata(&file).unwrap().len(), 1);
        assert_ne!(r.lstat(&file).await.unwrap().mtime, Some(5));
    }

    #[tokio::test]
    async fn fsetstat_changes_the_open_file() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let path = dir.path().join("f");
        let h = r.open(&path, rw_create(), 0o644).await.unwrap();
        r.write(&h, 0, Bytes::from_static(b"0123456789"))
            .await
            .unwrap();
        let uid = fs::metadata(&path).unwrap().uid();
        let gid = fs::metadata(&path).unwrap().gid();
        let attrs = SetAttrs {
            size: Some(3),
            uid_gid: Some((uid, gid)),
            perm: Some(0o604),
            atime_mtime: Some((7, 9)),
        };
        r.fsetstat(&h, attrs).await.unwrap();
        let a = r.fstat(&h).await.unwrap();
        assert_eq!(a.size, Some(3));
        assert_eq!(a.mode.unwrap() & 0o7777, 0o604);
        assert_eq!((a.atime, a.mtime), (Some(7), Some(9)));
        r.close(&h).await.unwrap();
    }

    #[tokio::test]
    async fn chown_to_someone_else_is_denied_unless_root() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let path = dir.path().join("f");
        put(&path, b"");
        let attrs = SetAttrs {
            uid_gid: Some((12345, 12345)),
            ..Default::default()
        };
        let result = r.setstat(&path, attrs).await;
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            result.unwrap();
            assert_eq!(fs::metadata(&path).unwrap().uid(), 12345);
        } else {
            assert_eq!(status(result), Status::PermissionDenied);
        }
    }

    #[tokio::test]
    async fn read_dir_lists_entries_with_lstat_attrs() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        put(&dir.path().join("file"), b"abc");
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::create_dir(dir.path().join("sub/inner")).unwrap();
        std::os::unix::fs::symlink("file", dir.path().join("link")).unwrap();
        fs::hard_link(dir.path().join("file"), dir.path().join("file2")).unwrap();

        let mut entries = r.read_dir(dir.path()).await.unwrap();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let names: Vec<_> = entries.iter().map(|e| e.name.to_str().unwrap()).collect();
        assert_eq!(names, ["file", "file2", "link", "sub"]);
        let file = &entries[0];
        assert_eq!(file.attrs.size, Some(3));
        assert_eq!(file.attrs.file_type(), FileKind::File);
        assert_eq!(file.nlink, Some(2));
        assert_eq!(file.attrs, r.lstat(&dir.path().join("file")).await.unwrap());
        assert_eq!(entries[2].attrs.file_type(), FileKind::Symlink);
        assert_eq!(entries[3].attrs.file_type(), FileKind::Dir);
        assert_eq!(entries[3].nlink, Some(3));

        assert!(r
            .read_dir(&dir.path().join("sub/inner"))
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            status(r.read_dir(&dir.path().join("missing")).await),
            Status::NoSuchFile
        );
        // opendir of a file: ENOTDIR -> NoSuchFile.
        assert_eq!(
            status(r.read_dir(&dir.path().join("file")).await),
            Status::NoSuchFile
        );
    }

    #[tokio::test]
    async fn non_utf8_names_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let name = OsStr::from_bytes(b"caf\xe9 \xff\xfe");
        let path = dir.path().join(name);

        let h = r.open(&path, rw_create(), 0o644).await.unwrap();
        r.write(&h, 0, Bytes::from_static(b"latin-1"))
            .await
            .unwrap();
        r.close(&h).await.unwrap();

        let entries = r.read_dir(dir.path()).await.unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].name.as_bytes(), b"caf\xe9 \xff\xfe");
        let again = dir.path().join(&entries[0].name);
        assert_eq!(r.lstat(&again).await.unwrap().size, Some(7));

        let renamed = dir.path().join(OsStr::from_bytes(b"\x80new"));
        r.rename(&again, &renamed, RenameMode::NoReplace)
            .await
            .unwrap();
        let link = dir.path().join(OsStr::from_bytes(b"l\xc3"));
        r.symlink(Path::new(OsStr::from_bytes(b"\x80new")), &link)
            .await
            .unwrap();
        assert_eq!(
            r.readlink(&link).await.unwrap().as_os_str().as_bytes(),
            b"\x80new"
        );
        assert_eq!(
            r.realpath(&link).await.unwrap(),
            fs::canonicalize(dir.path())
                .unwrap()
                .join(OsStr::from_bytes(b"\x80new"))
        );
        r.remove(&link).await.unwrap();
        r.remove(&renamed).await.unwrap();
        assert!(r.read_dir(dir.path()).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn remove_mkdir_rmdir() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let sub = dir.path().join("sub");

        r.mkdir(&sub, 0o750).await.unwrap();
        let a = r.lstat(&sub).await.unwrap();
        assert_eq!(a.file_type(), FileKind::Dir);
        assert_eq!(a.mode.unwrap() & 0o7777, 0o750);
        // EEXIST -> Failure.
        assert_eq!(status(r.mkdir(&sub, 0o755).await), Status::Failure);
        // ENOENT in the parent.
        assert_eq!(
            status(r.mkdir(&dir.path().join("no/such"), 0o755).await),
            Status::NoSuchFile
        );

        put(&sub.join("f"), b"");
        // ENOTEMPTY -> Failure.
        assert_eq!(status(r.rmdir(&sub).await), Status::Failure);
        // unlink of a directory: EISDIR -> Failure.
        assert_eq!(status(r.remove(&sub).await), Status::Failure);
        // rmdir of a file: ENOTDIR -> NoSuchFile.
        assert_eq!(status(r.rmdir(&sub.join("f")).await), Status::NoSuchFile);
        r.remove(&sub.join("f")).await.unwrap();
        assert_eq!(status(r.remove(&sub.join("f")).await), Status::NoSuchFile);
        r.rmdir(&sub).await.unwrap();
        assert_eq!(status(r.rmdir(&sub).await), Status::NoSuchFile);
        // rmdir of "." : EINVAL -> BadMessage.
        fs::create_dir(&sub).unwrap();
        assert_eq!(status(r.rmdir(&sub.join(".")).await), Status::BadMessage);
    }

    #[tokio::test]
    async fn rename_replace_and_no_replace() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        let c = dir.path().join("c");
        put(&a, b"A");
        put(&b, b"B");

        // Plain RENAME over an existing file: Failure, nothing changed.
        assert_eq!(
            status(r.rename(&a, &b, RenameMode::NoReplace).await),
            Status::Failure
        );
        assert_eq!(fs::read(&a).unwrap(), b"A");
        assert_eq!(fs::read(&b).unwrap(), b"B");
        // To a free name it moves (link + unlink: the source is gone).
        r.rename(&a, &c, RenameMode::NoReplace).await.unwrap();
        assert!(!a.exists());
        assert_eq!(fs::read(&c).unwrap(), b"A");
        assert_eq!(fs::metadata(&c).unwrap().nlink(), 1);
        // posix-rename replaces.
        r.rename(&c, &b, RenameMode::Replace).await.unwrap();
        assert!(!c.exists());
        assert_eq!(fs::read(&b).unwrap(), b"A");
        assert_eq!(
            status(r.rename(&a, &c, RenameMode::Replace).await),
            Status::NoSuchFile
        );
        assert_eq!(
            status(r.rename(&a, &c, RenameMode::NoReplace).await),
            Status::NoSuchFile
        );

        // Directories: stat + rename.
        let d1 = dir.path().join("d1");
        let d2 = dir.path().join("d2");
        fs::create_dir(&d1).unwrap();
        fs::create_dir(&d2).unwrap();
        assert_eq!(
            status(r.rename(&d1, &d2, RenameMode::NoReplace).await),
            Status::Failure
        );
        assert_eq!(
            status(r.rename(&d1, &b, RenameMode::NoReplace).await),
            Status::Failure
        );
        let d3 = dir.path().join("d3");
        r.rename(&d1, &d3, RenameMode::NoReplace).await.unwrap();
        assert!(d3.is_dir() && !d1.exists());
        // Replace onto an empty directory works, onto a non-empty one is ENOTEMPTY.
        r.rename(&d3, &d2, RenameMode::Replace).await.unwrap();
        fs::create_dir(&d1).unwrap();
        put(&d2.join("x"), b"");
        assert_eq!(
            status(r.rename(&d1, &d2, RenameMode::Replace).await),
            Status::Failure
        );
        // A directory into itself: EINVAL -> BadMessage.
        assert_eq!(
            status(r.rename(&d2, &d2.join("in"), RenameMode::Replace).await),
            Status::BadMessage
        );
        // A directory over a file: ENOTDIR -> NoSuchFile.
        assert_eq!(
            status(r.rename(&d1, &b, RenameMode::Replace).await),
            Status::NoSuchFile
        );
    }

    #[tokio::test]
    async fn symlink_readlink_hardlink() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let file = dir.path().join("f");
        put(&file, b"x");
        let link = dir.path().join("l");

        // Natural order: `link` points at `target`. Dangling targets are fine.
        r.symlink(Path::new("does/not/exist"), &link).await.unwrap();
        assert_eq!(
            r.readlink(&link).await.unwrap(),
            Path::new("does/not/exist")
        );
        assert_eq!(status(r.stat(&link).await), Status::NoSuchFile);
        assert_eq!(
            status(r.symlink(Path::new("f"), &link).await),
            Status::Failure
        );
        // readlink of a non-link: EINVAL -> BadMessage.
        assert_eq!(status(r.readlink(&file).await), Status::BadMessage);
        assert_eq!(
            status(r.readlink(&dir.path().join("missing")).await),
            Status::NoSuchFile
        );

        let hard = dir.path().join("h");
        r.hardlink(&file, &hard).await.unwrap();
        assert_eq!(fs::metadata(&file).unwrap().nlink(), 2);
        assert_eq!(status(r.hardlink(&file, &hard).await), Status::Failure);
        // link(2) of a directory: EPERM -> PermissionDenied.
        assert_eq!(
            status(r.hardlink(dir.path(), &dir.path().join("dl")).await),
            Status::PermissionDenied
        );
        // A hard link to a symlink links the symlink itself.
        let hl = dir.path().join("hl");
        r.hardlink(&link, &hl).await.unwrap();
        assert_eq!(r.lstat(&hl).await.unwrap().file_type(), FileKind::Symlink);
    }

    #[tokio::test]
    async fn statvfs_and_realpath() {
        let dir = tempfile::tempdir().unwrap();
        let r = LocalRemote::new();
        let st = r.statvfs(dir.path()).await.unwrap();
        assert!(st.bsize > 0 && st.frsize > 0 && st.namemax >= 255);
        assert!(st.bfree >= st.bavail);
        assert_eq!(st.flag & !(STATVFS_ST_RDONLY | STATVFS_ST_NOSUID), 0);
        assert_eq!(
            status(r.statvfs(&dir.path().join("missing")).await),
            Status::NoSuchFile
        );

        let real = fs::canonicalize(dir.path()).unwrap();
        fs::create_dir(dir.path().join("d")).unwrap();
        std::os::unix::fs::symlink("d", dir.path().join("l")).unwrap();
        assert_eq!(
            r.realpath(&dir.path().join("l/../l/./")).await.unwrap(),
            real.join("d")
        );
        assert_eq!(
            status(r.realpath(&dir.path().join("missing")).await),
            Status::NoSuchFile
        );
        assert_eq!(
            r.realpath(Path::new("")).await.unwrap(),
            std::env::current_dir().unwrap()
        );
    }

    #[tokio::test]
    async fn close_while_a_read_is_in_flight_is_safe() {
        let dir = tempfile::tempdir().unwrap();
        let r = Arc::new(LocalRemote::new());
        let path = dir.path().join("f");
        put(&path, &[7; 100_000]);
        let h = r.open(&path, OpenFlags::read_only(), 0).await.unwrap();
        let reads: Vec<_> = (0..8)
            .map(|i| {
                let (r, h) = (Arc::clone(&r), h.clone());
                tokio::spawn(async move { r.read(&h, i * 1000, 1000).await })
            })
            .collect();
        r.close(&h).await.unwrap();
        for read in reads {
            match read.await.unwrap() {
                Ok(data) => assert_eq!(&data[..], &[7; 1000][..]),
                Err(e) => assert_eq!(e.status(), Some(Status::Failure)),
            }
        }
        assert_eq!(r.open_handles(), 0);
    }
}
