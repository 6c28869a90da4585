//! The remote side of a mount, as the filesystem core sees it.
//!
//! The core speaks only this trait. It is shaped after SFTP v3 (path based, handles for open
//! files and nothing the protocol cannot express) so that the core cannot accidentally depend on
//! something only a local disk provides. Three implementations:
//!
//! * [`sftp::SftpRemote`]: the real one, our own SFTP codec over russh channels;
//! * [`local::LocalRemote`]: a directory on this machine, for fast unit tests of the core. It
//!   reports errors as coarsely as OpenSSH's sftp-server does (EEXIST becomes a generic
//!   `Failure`, ...), so the core's errno inference is exercised by the unit tests too;
//! * [`faulty::FaultyRemote`]: wraps another remote and injects failures (connection loss,
//!   errors on chosen operations, short reads) for failure tests.
//!
//! Paths are byte strings (`std::path::Path` on Unix): a file name that is not UTF-8 goes to the
//! server exactly as it came from the kernel and back, never through a lossy conversion.

pub mod faulty;
pub mod local;
pub mod sftp;

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use bytes::Bytes;

/// Status codes of SFTP v3 (draft-ietf-secsh-filexfer-02), which is all the errno information a
/// server gives us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Eof,
    NoSuchFile,
    PermissionDenied,
    /// OpenSSH sends this for every errno it has no better code for: EEXIST, ENOTEMPTY,
    /// EISDIR, ENOSPC, EXDEV, EROFS, ... The core infers the real errno from context.
    Failure,
    BadMessage,
    NoConnection,
    ConnectionLost,
    OpUnsupported,
    Other(u32),
}

impl Status {
    pub fn from_code(code: u32) -> Status {
        match code {
            1 => Status::Eof,
            2 => Status::NoSuchFile,
            3 => Status::PermissionDenied,
            4 => Status::Failure,
            5 => Status::BadMessage,
            6 => Status::NoConnection,
            7 => Status::ConnectionLost,
            8 => Status::OpUnsupported,
            n => Status::Other(n),
        }
    }

    pub fn code(self) -> u32 {
        match self {
            Status::Eof => 1,
            Status::NoSuchFile => 2,
            Status::PermissionDenied => 3,
            Status::Failure => 4,
            Status::BadMessage => 5,
            Status::NoConnection => 6,
            Status::ConnectionLost => 7,
            Status::OpUnsupported => 8,
            Status::Other(n) => n,
        }
    }
}

/// The server's answer to a write that is already on its way (see [`Remote::write_queued`]).
pub type WriteAck = Pin<Box<dyn Future<Output = RemoteResult<()>> + Send>>;

/// Why a remote operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteError {
    /// The server answered with a status code (and its message, for the log).
    Status(Status, String),
    /// The connection went away before the answer came. The operation may or may not have
    /// happened on the server.
    Disconnected(String),
    /// The handle was opened on a connection that has since been replaced; the caller may
    /// reopen the file by path and retry.
    StaleHandle,
    /// The server does not offer an extension we need for this operation.
    Unsupported(&'static str),
    /// The server sent something we could not parse. Treated like a lost connection.
    Protocol(String),
}

impl RemoteError {
    pub fn status(&self) -> Option<Status> {
        match self {
            RemoteError::Status(s, _) => Some(*s),
            _ => None,
        }
    }

    /// Errors after which the same request may succeed on a fresh connection.
    pub fn is_connection_error(&self) -> bool {
        matches!(
            self,
            RemoteError::Disconnected(_) | RemoteError::StaleHandle | RemoteError::Protocol(_)
        )
    }
}

impl fmt::Display for RemoteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemoteError::Status(s, msg) if msg.is_empty() => write!(f, "server said {s:?}"),
            RemoteError::Status(s, msg) => write!(f, "server said {s:?}: {msg}"),
            RemoteError::Disconnected(why) => write!(f, "connection lost: {why}"),
            RemoteError::StaleHandle => write!(f, "file handle belongs to a lost connection"),
            RemoteError::Unsupported(ext) => write!(f, "server does not support {ext}"),
            RemoteError::Protocol(why) => write!(f, "protocol error: {why}"),
        }
    }
}

impl std::error::Error for RemoteError {}

pub type RemoteResult<T> = Result<T, RemoteError>;

/// A point in time as SFTP v3 carries it: whole seconds since the epoch. (v3 has no
/// sub-second field; `SEMANTICS.md` documents that nanoseconds are dropped.)
pub type Seconds = u32;

/// File attributes as returned by the server. `mode` includes the file type bits (`S_IFMT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attrs {
    pub size: Option<u64>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mode: Option<u32>,
    pub atime: Option<Seconds>,
    pub mtime: Option<Seconds>,
}

impl Attrs {
    pub fn file_type(&self) -> FileKind {
        FileKind::from_mode(self.mode.unwrap_or(0))
    }
}

/// What kind of object a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
}

impl FileKind {
    pub fn from_mode(mode: u32) -> FileKind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            _ => FileKind::File,
        }
    }
}

/// A change of attributes. SFTP v3 sets atime and mtime together, and uid and gid together;
/// the core fills in the half that is not being changed from a fresh stat, so nothing is
/// clobbered (russh-sftp got this wrong, see the field notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetAttrs {
    pub size: Option<u64>,
    pub uid_gid: Option<(u32, u32)>,
    /// Permission bits only (no `S_IFMT`).
    pub perm: Option<u32>,
    pub atime_mtime: Option<(Seconds, Seconds)>,
}

impl SetAttrs {
    pub fn is_empty(&self) -> bool {
        *self == SetAttrs::default()
    }
}

/// One entry of a directory listing, with the attributes the server sent along (SFTP READDIR
/// returns `lstat` attributes for every name, which is what makes readdirplus cheap).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: std::ffi::OsString,
    pub attrs: Attrs,
    /// Link count, when the server gives it (OpenSSH's `ls -l` style long name does).
    pub nlink: Option<u32>,
}

/// How to open a file: the SFTP `pflags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenFlags {
    pub read: bool,
    pub write: bool,
    pub append: bool,
    pub create: bool,
    pub truncate: bool,
    pub exclusive: bool,
}

impl OpenFlags {
    pub fn read_only() -> Self {
        OpenFlags {
            read: true,
            ..Default::default()
        }
    }

    /// The flags to reopen an already-open file with after a reconnect: same access, but never
    /// create, truncate or insist on exclusivity again.
    pub fn for_reopen(self) -> Self {
        OpenFlags {
            create: false,
            truncate: false,
            exclusive: false,
            ..self
        }
    }
}

/// Whether a rename may replace an existing target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameMode {
    /// POSIX `rename(2)`: atomically replace the target (`posix-rename@openssh.com`).
    Replace,
    /// `RENAME_NOREPLACE`: fail if the target exists (plain SFTP RENAME).
    NoReplace,
}

/// `statvfs@openssh.com` reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatVfs {
    pub bsize: u64,
    pub frsize: u64,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub favail: u64,
    pub fsid: u64,
    pub flag: u64,
    pub namemax: u64,
}

/// What [`Remote::open_read`] got along with the open: each None when it was not asked for,
/// not sent, or failed (ask again the ordinary way).
#[derive(Debug, Clone, Default)]
pub struct Along {
    /// The open file's attributes (FSTAT of the new handle; where the core fills one from
    /// [`Remote::open_stat`], an LSTAT of the path, which shows a symlink as the link).
    pub attrs: Option<Attrs>,
    /// The file's first bytes (fewer than asked for: the file ends there).
    pub data: Option<Bytes>,
}

/// Limits the server declared (`limits@openssh.com`), or conservative defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_read: u32,
    pub max_write: u32,
    pub max_open_handles: u64,
}

impl Default for Limits {
    fn default() -> Self {
        // What every SFTP server must accept per the draft (32 KiB data in a 34000-byte packet).
        Limits {
            max_read: 32 * 1024,
            max_write: 32 * 1024,
            max_open_handles: 64,
        }
    }
}

/// The remote filesystem the core mounts. Methods are async and must not block the calling
/// thread: the core runs them on a tokio runtime shared by every request.
///
/// Paths are absolute paths on the server (the core joins the export root and the relative
/// path). Implementations must not follow symlinks except where the operation says so
/// (`stat`, `open`, `realpath` follow; everything else acts on the link itself).
pub trait Remote: Send + Sync + 'static {
    /// An open file on the server. Cheap to clone.
    type Handle: Clone + Send + Sync + fmt::Debug + 'static;

    fn limits(&self) -> Limits;

    fn lstat(&self, path: &Path) -> impl Future<Output = RemoteResult<Attrs>> + Send;
    fn stat(&self, path: &Path) -> impl Future<Output = RemoteResult<Attrs>> + Send;
    fn fstat(&self, handle: &Self::Handle) -> impl Future<Output = RemoteResult<Attrs>> + Send;
    /// Change attributes of `path`, following a symlink (SFTP SETSTAT).
    fn setstat(
        &self,
        path: &Path,
        attrs: SetAttrs,
    ) -> impl Future<Output = RemoteResult<()>> + Send;
    /// Change attributes of `path` itself even if it is a symlink (`lsetstat@openssh.com`).
    fn lsetstat(
        &self,
        path: &Path,
        attrs: SetAttrs,
    ) -> impl Future<Output = RemoteResult<()>> + Send;
    fn fsetstat(
        &self,
        handle: &Self::Handle,
        attrs: SetAttrs,
    ) -> impl Future<Output = RemoteResult<()>> + Send;
    /// [`Remote::setstat`], then the attributes of `path` itself (LSTAT), for a caller that
    /// must answer with the attributes the change left (a size or an mtime it cannot work
    /// out): the outer error is the SETSTAT's, the inner the LSTAT's. The default asks twice;
    /// the SFTP remote sends both at once on one channel, which serves them in order (one
    /// round trip).
    fn setstat_lstat(
        &self,
        path: &Path,
        attrs: SetAttrs,
    ) -> impl Future<Output = RemoteResult<RemoteResult<Attrs>>> + Send {
        async move {
            self.setstat(path, attrs).await?;
            Ok(self.lstat(path).await)
        }
    }
    /// [`Remote::fsetstat`], then the handle's attributes (FSTAT), as
    /// [`Remote::setstat_lstat`].
    fn fsetstat_fstat(
        &self,
        handle: &Self::Handle,
        attrs: SetAttrs,
    ) -> impl Future<Output = RemoteResult<RemoteResult<Attrs>>> + Send {
        async move {
            self.fsetstat(handle, attrs).await?;
            Ok(self.fstat(handle).await)
        }
    }

    /// List a whole directory, without `.` and `..`.
    fn read_dir(&self, path: &Path) -> impl Future<Output = RemoteResult<Vec<DirEntry>>> + Send;

    /// Open (and maybe create, with permission bits `perm`) a file.
    fn open(
        &self,
        path: &Path,
        flags: OpenFlags,
        perm: u32,
    ) -> impl Future<Output = RemoteResult<Self::Handle>> + Send;
    /// Open `path` for reading and read up to `len` bytes from its start, and with `stat`
    /// also ask the handle's attributes: the handle, and what came along with it (see
    /// [`Along`]). `len` is at most `limits().max_read`. The SFTP remote sends the requests
    /// at once when it can tell the handle the OPEN will get (see `sftp::forecast`), which
    /// makes it one round trip; otherwise it only opens. The default opens, then asks.
    fn open_read(
        &self,
        path: &Path,
        len: u32,
        stat: bool,
    ) -> impl Future<Output = RemoteResult<(Self::Handle, Along)>> + Send {
        async move {
            let h = self.open(path, OpenFlags::read_only(), 0).await?;
            let attrs = match stat {
                true => self.fstat(&h).await.ok(),
                false => None,
            };
            let data = self.read(&h, 0, len).await.ok();
            Ok((h, Along { attrs, data }))
        }
    }
    /// Open a file (see [`Remote::open`]) and return its attributes as they are right after
    /// the open: what a create needs to answer the kernel. The default asks twice; the SFTP
    /// remote sends both requests at once (one round trip).
    fn open_stat(
        &self,
        path: &Path,
        flags: OpenFlags,
        perm: u32,
    ) -> impl Future<Output = RemoteResult<(Self::Handle, Attrs)>> + Send {
        async move {
            let h = self.open(path, flags, perm).await?;
            match self.fstat(&h).await {
                Ok(a) => Ok((h, a)),
                Err(e) => {
                    let _ = self.close(&h).await;
                    Err(e)
                }
            }
        }
    }
    /// Open `path` again, up to `n` times, each time on a channel (server process, SSH
    /// flow-control window) that neither `beside` nor another of the new handles uses, on the
    /// connection `beside` belongs to: extra lanes for a large sequential write (see
    /// `core::file`). The opens are sent together (one round trip). Fewer than `n` handles, or
    /// none (the default: a remote without channels has no extra lanes), when there are not
    /// enough other channels. All or nothing: if one open fails, the others are closed and
    /// the error is returned (`StaleHandle` if `beside` belongs to a replaced connection).
    /// `flags` are applied as [`OpenFlags::for_reopen`]: never creates or truncates.
    fn open_alongside(
        &self,
        path: &Path,
        flags: OpenFlags,
        beside: &Self::Handle,
        n: usize,
    ) -> impl Future<Output = RemoteResult<Vec<Self::Handle>>> + Send {
        let _ = (path, flags, beside, n);
        async { Ok(Vec::new()) }
    }
    /// Read up to `len` bytes at `offset`. Fewer bytes (possibly none) means end of file.
    /// `len` is at most `limits().max_read`.
    fn read(
        &self,
        handle: &Self::Handle,
        offset: u64,
        len: u32,
    ) -> impl Future<Output = RemoteResult<Bytes>> + Send;
    /// Write all of `data` at `offset`. `data.len()` is at most `limits().max_write`.
    fn write(
        &self,
        handle: &Self::Handle,
        offset: u64,
        data: Bytes,
    ) -> impl Future<Output = RemoteResult<()>> + Send;
    /// Queue a write and return as soon as it is on its way, with a future for the server's
    /// answer. Writes queued one after another on the same handle reach the server in that
    /// order (the write-behind path relies on this: overlapping writes must not be reordered).
    /// The default waits for the answer; the SFTP remote overrides it to pipeline.
    fn write_queued(
        &self,
        handle: &Self::Handle,
        offset: u64,
        data: Bytes,
    ) -> impl Future<Output = RemoteResult<WriteAck>> + Send {
        async move {
            let result = self.write(handle, offset, data).await;
            Ok(Box::pin(std::future::ready(result)) as WriteAck)
        }
    }
    /// Queue an FSETSTAT as [`Remote::write_queued`] queues a write: in order with the writes
    /// queued before it on the same handle, answered through the returned future.
    fn fsetstat_queued(
        &self,
        handle: &Self::Handle,
        attrs: SetAttrs,
    ) -> impl Future<Output = RemoteResult<WriteAck>> + Send {
        async move {
            let result = self.fsetstat(handle, attrs).await;
            Ok(Box::pin(std::future::ready(result)) as WriteAck)
        }
    }
    fn fsync(&self, handle: &Self::Handle) -> impl Future<Output = RemoteResult<()>> + Send;
    /// Have the server write what it holds of the file at `path` to its disk now, so that an
    /// `fsync` at the end of a long write finds less left to do. A hint, sent while the file
    /// is still being written: it changes nothing anyone can see, and no request of the
    /// mount's waits for it. Err: the server's `fsync` of the file failed, so data written to
    /// it may not be on its disk; the caller keeps that for the file's next `fsync` (the
    /// server reports a failed disk write to one `fsync` per descriptor open when it
    /// happened, not to one opened later). Anything else (the file is gone or is no regular
    /// file any more, another write-back is on its way, the server cannot `fsync`, the
    /// connection went) is Ok: nothing done, nothing to report. The default does nothing.
    fn write_back_early(&self, path: &Path) -> impl Future<Output = RemoteResult<()>> + Send {
        let _ = path;
        async { Ok(()) }
    }
    /// Open `path` for reading (never creating) where a server-side copy can pair the new
    /// handle with `beside` (SFTP handles belong to one `sftp-server` process: the same
    /// channel), together with the attributes of the path itself (LSTAT: a symlink shows as
    /// one, so a caller can refuse a name that leads through a link), in one round trip. The
    /// default opens anywhere: a remote without channels can pair any two handles.
    fn open_beside(
        &self,
        path: &Path,
        beside: &Self::Handle,
    ) -> impl Future<Output = RemoteResult<(Self::Handle, Attrs)>> + Send {
        let _ = beside;
        async move {
            let h = self.open(path, OpenFlags::read_only(), 0).await?;
            match self.lstat(path).await {
                Ok(a) => Ok((h, a)),
                Err(e) => {
                    let _ = self.close(&h).await;
                    Err(e)
                }
            }
        }
    }
    /// Copy `len` bytes at `from_offset` of the file open as `from` to `to_offset` of the
    /// file open as `to`, on the server, without the data crossing the link (OpenSSH's
    /// `copy-data` extension). Both handles must come from the same place (see
    /// [`Remote::open_beside`]). `Ok` only when all `len` bytes were copied; an error may
    /// come after an unknown part was (`Status::Eof`: the source ended first). The default:
    /// `Unsupported`.
    fn copy_data(
        &self,
        from: &Self::Handle,
        from_offset: u64,
        len: u64,
        to: &Self::Handle,
        to_offset: u64,
    ) -> impl Future<Output = RemoteResult<()>> + Send {
        let _ = (from, from_offset, len, to, to_offset);
        async { Err(RemoteError::Unsupported("copy-data")) }
    }
    fn close(&self, handle: &Self::Handle) -> impl Future<Output = RemoteResult<()>> + Send;

    fn remove(&self, path: &Path) -> impl Future<Output = RemoteResult<()>> + Send;
    fn mkdir(&self, path: &Path, perm: u32) -> impl Future<Output = RemoteResult<()>> + Send;
    /// Make a directory and return its attributes right after (one round trip on SFTP).
    fn mkdir_stat(
        &self,
        path: &Path,
        perm: u32,
    ) -> impl Future<Output = RemoteResult<Attrs>> + Send {
        async move {
            self.mkdir(path, perm).await?;
            self.lstat(path).await
        }
    }
    fn rmdir(&self, path: &Path) -> impl Future<Output = RemoteResult<()>> + Send;
    fn rename(
        &self,
        from: &Path,
        to: &Path,
        mode: RenameMode,
    ) -> impl Future<Output = RemoteResult<()>> + Send;
    /// Create `link` pointing at `target` (in the natural order; implementations deal with
    /// OpenSSH's swapped arguments).
    fn symlink(&self, target: &Path, link: &Path) -> impl Future<Output = RemoteResult<()>> + Send;
    fn readlink(&self, path: &Path) -> impl Future<Output = RemoteResult<PathBuf>> + Send;
    /// Create a hard link `new` to `existing` (`hardlink@openssh.com`).
    fn hardlink(
        &self,
        existing: &Path,
        new: &Path,
    ) -> impl Future<Output = RemoteResult<()>> + Send;
    /// [`Remote::hardlink`], then the new name's attributes (LSTAT), which `link` answers the
    /// kernel with: the outer error is the link's, the inner the LSTAT's. The default asks
    /// twice; the SFTP remote sends both at once on one channel, which serves them in order
    /// (one round trip).
    fn hardlink_stat(
        &self,
        existing: &Path,
        new: &Path,
    ) -> impl Future<Output = RemoteResult<RemoteResult<Attrs>>> + Send {
        async move {
            self.hardlink(existing, new).await?;
            Ok(self.lstat(new).await)
        }
    }
    fn statvfs(&self, path: &Path) -> impl Future<Output = RemoteResult<StatVfs>> + Send;
    /// Canonical absolute form of `path` on the server, following symlinks.
    fn realpath(&self, path: &Path) -> impl Future<Output = RemoteResult<PathBuf>> + Send;
}
