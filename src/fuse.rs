//! The thin FUSE adapter: each kernel request becomes one call into the core, run as a tokio
//! task, and its result becomes the reply.
//!
//! FUSE threads never wait on the network: every handler only decodes its arguments, spawns the
//! core call on the runtime and returns. fuser's `Reply*` values are `Send + 'static`, so the
//! task answers the kernel whenever the server has answered it. Each task runs inside a tracing
//! span named after the operation, with the kernel's request id.

use std::ffi::OsStr;
use std::future::Future;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use tracing::Instrument;

use crate::core::{Attr, Caller, Entry, Fs, OpenRequest, SetattrRequest, TimeSpec};
use crate::error::FsError;
use crate::remote::{FileKind, Remote};

/// Largest write the kernel may send in one request (needs `FUSE_MAX_PAGES`).
pub const MAX_WRITE: u32 = 1024 * 1024;

pub struct FuseAdapter<R: Remote> {
    fs: Arc<Fs<R>>,
}

impl<R: Remote> FuseAdapter<R> {
    pub fn new(fs: Arc<Fs<R>>) -> Self {
        FuseAdapter { fs }
    }

    /// Count a kernel request in the mount's `status` (`ops`).
    fn count_op(&self) {
        self.fs
            .stats
            .ops
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Serve a request under a span of its own: run `fut` here, on the FUSE thread, until it
    /// first has to wait, and hand what is left to the runtime when it is woken (see
    /// `handoff.rs`). A request answered from memory (most lookups and getattrs, readdir, a
    /// write queued behind, a release) then costs no hand-off between threads, which on a
    /// busy machine cost more than the work itself; one that needs the server has sent its
    /// request by the time it is parked, and goes on where its answer arrives.
    /// Nothing here blocks: a future only waits by returning `Pending`.
    fn spawn<F>(&self, op: &'static str, req: &Request, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let span = tracing::debug_span!("fuse", op, req = req.unique().0);
        self.count_op();
        crate::handoff::run_here_then_on(self.fs.runtime(), fut.instrument(span));
    }
}

/// Who sent `req` (the caller's fsuid and fsgid).
fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn errno(e: &FsError) -> Errno {
    if e.is_noteworthy() {
        tracing::warn!("{e}");
    } else {
        tracing::debug!("{e}");
    }
    Errno::from_i32(e.errno)
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
    }
}

fn fuse_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

/// The attributes sent with a lookup's "no such name" answer (inode 0): the kernel reads
/// only the inode number and the TTL.
fn absent_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn reply_entry(reply: ReplyEntry, r: Result<Entry, FsError>) {
    match r {
        Ok(e) => reply.entry_with_ttls(
            &e.attr_ttl,
            &e.entry_ttl,
            &fuse_attr(&e.attr),
            Generation(0),
        ),
        Err(e) => reply.error(errno(&e)),
    }
}

fn reply_empty(reply: ReplyEmpty, r: Result<(), FsError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// A time before 1970 as the kernel sent it. fuser 0.18 turns the kernel's (seconds,
/// nanoseconds) into a time by subtracting both when the seconds are negative (its
/// `system_time_from_time`, marked TODO there): -1 s + 500 ns arrives as -1.0000005 s
/// instead of -0.9999995 s. Undone here: the nanoseconds it subtracted are added twice.
/// (Its conversion of the times answered to the kernel is right.)
fn before_epoch_fixed(t: SystemTime) -> SystemTime {
    match UNIX_EPOCH.duration_since(t) {
        Ok(d) if d.subsec_nanos() != 0 => {
            UNIX_EPOCH - Duration::from_secs(d.as_secs())
                + Duration::from_nanos(d.subsec_nanos().into())
        }
        _ => t,
    }
}

fn time_spec(t: TimeOrNow) -> TimeSpec {
    match t {
        TimeOrNow::Now => TimeSpec::Now,
        TimeOrNow::SpecificTime(t) => TimeSpec::At(before_epoch_fixed(t)),
    }
}

impl<R: Remote> Filesystem for FuseAdapter<R> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Each capability is asked for only if the kernel offers it; none is essential.
        let wanted = [
            // Always readdirplus (not _AUTO): the entries' types must come from lookup, which
            // follows an AWCP export's top-level resource links.
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_AUTO_INVAL_DATA,
            InitFlags::FUSE_MAX_PAGES,
            InitFlags::FUSE_BIG_WRITES,
            InitFlags::FUSE_ASYNC_READ,
            // O_TRUNC comes with the open, which sends it along (one OPEN) instead of the
            // kernel's setattr after it (a SETSTAT and an LSTAT more): `open(O_TRUNC)`,
            // write, close, as every tool rewriting a file does, is two round trips less.
            InitFlags::FUSE_ATOMIC_O_TRUNC,
        ];
        for flag in wanted {
            let _ = config.add_capabilities(flag);
        }
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let fs = self.fs.clone();
        let name = name.to_owned();
        self.spawn("lookup", req, async move {
            match fs.lookup(parent.0, &name).await {
                // An absent name is answered as an entry of inode 0, which the kernel keeps as
                // a negative dentry for the TTL given (an ENOENT it keeps not at all): a
                // compiler's `-I` search, Python's and make's probes ask for the same missing
                // names over and over, each a request to the mount otherwise.
                Err(e) if e.errno == libc::ENOENT => {
                    let ttl = fs.absence_ttl(parent.0, &name);
                    if ttl.is_zero() {
                        reply.error(errno(&e));
                    } else {
                        tracing::debug!("{e} (kept by the kernel for {ttl:?})");
                        reply.entry(&ttl, &absent_attr(), Generation(0));
                    }
                }
                r => reply_entry(reply, r),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let fs = self.fs.clone();
        self.spawn("getattr", req, async move {
            match fs.getattr(ino.0, fh.map(|f| f.0)).await {
                Ok((a, ttl)) => reply.attr(&ttl, &fuse_attr(&a)),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let fs = self.fs.clone();
        let set = SetattrRequest {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_spec),
            mtime: mtime.map(time_spec),
        };
        self.spawn("setattr", req, async move {
            match fs.setattr(ino.0, fh.map(|f| f.0), set).await {
                Ok(a) => reply.attr(&fs.kernel_attr_ttl(ino.0), &fuse_attr(&a)),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let fs = self.fs.clone();
        self.spawn("readlink", req, async move {
            match fs.readlink(ino.0).await {
                Ok(t) => reply.data(std::os::unix::ffi::OsStrExt::as_bytes(t.as_os_str())),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        // Regular files (an exclusive create); FIFOs, sockets and device nodes, which SFTP
        // cannot make, are kept by the mount.
        let fs = self.fs.clone();
        let name = name.to_owned();
        let caller = caller(req);
        self.spawn("mknod", req, async move {
            reply_entry(
                reply,
                fs.mknod(parent.0, &name, mode, rdev, umask, caller).await,
            )
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let fs = self.fs.clone();
        let name = name.to_owned();
        let caller = caller(req);
        self.spawn("mkdir", req, async move {
            reply_entry(reply, fs.mkdir(parent.0, &name, mode, umask, caller).await)
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let fs = self.fs.clone();
        let name = name.to_owned();
        self.spawn("unlink", req, async move {
            reply_empty(reply, fs.unlink(parent.0, &name).await)
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let fs = self.fs.clone();
        let name = name.to_owned();
        self.spawn("rmdir", req, async move {
            reply_empty(reply, fs.rmdir(parent.0, &name).await)
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let fs = self.fs.clone();
        let name = link_name.to_owned();
        let target = target.to_owned();
        let caller = caller(req);
        self.spawn("symlink", req, async move {
            reply_entry(reply, fs.symlink(parent.0, &name, &target, caller).await)
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let fs = self.fs.clone();
        let (name, newname) = (name.to_owned(), newname.to_owned());
        self.spawn("rename", req, async move {
            reply_empty(
                reply,
                fs.rename(parent.0, &name, newparent.0, &newname, flags.bits())
                    .await,
            )
        });
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let fs = self.fs.clone();
        let newname = newname.to_owned();
        self.spawn("link", req, async move {
            reply_entry(reply, fs.link(ino.0, newparent.0, &newname).await)
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let fs = self.fs.clone();
        let open = OpenRequest {
            flags: flags.0,
            pid: req.pid(),
            caller: caller(req),
        };
        self.spawn("open", req, async move {
            match fs.open_keeping_cache(ino.0, open).await {
                Ok((fh, true)) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE),
                Ok((fh, false)) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let fs = self.fs.clone();
        self.spawn("read", req, async move {
            let watch = fs.read_starting(ino.0);
            match fs.read(fh.0, offset, size).await {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(errno(&e)),
            }
            fs.read_answered(watch);
        });
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let page_writeback = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        // The write is queued here, on the FUSE thread, so writes keep the kernel's order.
        let queued = self.fs.write_from(fh.0, offset, data, page_writeback);
        self.spawn("write", req, async move {
            match queued.await {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let fs = self.fs.clone();
        let pid = req.pid();
        self.spawn("flush", req, async move {
            reply_empty(reply, fs.flush_from(fh.0, pid).await)
        });
    }

    fn release(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let fs = self.fs.clone();
        self.spawn("release", req, async move {
            reply_empty(reply, fs.release(fh.0).await)
        });
    }

    fn fsync(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let fs = self.fs.clone();
        self.spawn("fsync", req, async move {
            reply_empty(reply, fs.fsync(fh.0).await)
        });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let fs = self.fs.clone();
        self.spawn("opendir", req, async move {
            match fs.opendir(ino.0).await {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Usually served from the listing taken at opendir, but a rewind lists again.
        let fs = self.fs.clone();
        self.spawn("readdir", req, async move {
            match fs.readdir(fh.0, offset).await {
                Ok(items) => {
                    for item in items {
                        let entry_ino = fs.peek_ino(ino.0, &item.name);
                        if reply.add(
                            INodeNo(entry_ino),
                            item.next_offset,
                            file_type(item.kind),
                            &item.name,
                        ) {
                            break;
                        }
                    }
                    reply.ok();
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let fs = self.fs.clone();
        self.spawn("readdirplus", req, async move {
            let items = match fs.readdir(fh.0, offset).await {
                Ok(items) => items,
                Err(e) => return reply.error(errno(&e)),
            };
            fs.fill_unknown_attrs(ino.0, &items).await;
            for item in items {
                if item.attrs.is_none() {
                    // "." and "..": the kernel takes no reference for these.
                    let attr = Attr {
                        ino: fs.peek_ino(ino.0, &item.name),
                        size: 0,
                        blocks: 0,
                        atime: SystemTime::UNIX_EPOCH,
                        mtime: SystemTime::UNIX_EPOCH,
                        ctime: SystemTime::UNIX_EPOCH,
                        kind: FileKind::Dir,
                        perm: 0o755,
                        nlink: 1,
                        uid: 0,
                        gid: 0,
                        rdev: 0,
                    };
                    if reply.add(
                        INodeNo(attr.ino),
                        item.next_offset,
                        &item.name,
                        &Duration::ZERO,
                        &fuse_attr(&attr),
                        Generation(0),
                    ) {
                        break;
                    }
                    continue;
                }
                let entry = match fs.readdirplus_entry(ino.0, &item).await {
                    Ok(e) => e,
                    // Vanished between listing and now: leave it out.
                    Err(_) => continue,
                };
                // One TTL for the entry and its attributes (fuser's readdirplus has no
                // other): the shorter, or `attr_timeout` would not hold for what `ls -l` shows.
                if reply.add(
                    INodeNo(entry.attr.ino),
                    item.next_offset,
                    &item.name,
                    &entry.entry_ttl.min(entry.attr_ttl),
                    &fuse_attr(&entry.attr),
                    Generation(0),
                ) {
                    // Not added: give back the reference readdirplus_entry took.
                    fs.forget(entry.attr.ino, 1);
                    break;
                }
            }
            reply.ok();
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    // Extended attributes: SFTP v3 has none. Each handler answers ENOSYS, which the kernel
    // remembers for the life of the mount (`fc->no_getxattr` and its siblings): from then
    // on it answers EOPNOTSUPP itself, as for a local filesystem without xattrs, and stops
    // asking us. That matters because it asks a lot: `ls -l` reads two attributes of every
    // file (ACL, SELinux label) and every write(2) reads `security.capability` (FUSE has no
    // SB_NOSEC), each a round trip to this process. The first ask is counted in `ops`.
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        self.count_op();
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: fuser::ReplyXattr) {
        self.count_op();
        reply.error(Errno::ENOSYS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.count_op();
        reply.error(Errno::ENOSYS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        self.count_op();
        reply.error(Errno::ENOSYS);
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Unlinks answered early reach the server before this returns; other directory
        // changes are synchronous on the server already.
        let fs = self.fs.clone();
        self.spawn("fsyncdir", req, async move {
            reply_empty(reply, fs.fsyncdir(ino.0).await)
        });
    }

    // What SFTP v3 cannot do, answered ENOSYS here rather than by fuser's defaults, which
    // answer the same but log "[Not Implemented]" at WARN (in the journal of every mount
    // where a program asks). The kernel makes each answer what a local filesystem without
    // the feature gives: it remembers ENOSYS for lseek (SEEK_DATA/SEEK_HOLE then treat the
    // file as all data), fallocate (EOPNOTSUPP; glibc's posix_fallocate writes zeros) and
    // poll (always ready); an unknown ioctl becomes ENOTTY. (Locks never come here: POSIX
    // locks are not asked for in `init`, so the kernel keeps them locally.)
    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: fuser::ReplyLseek,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    /// Done by the server when it can (see `core::copy`); otherwise answered so that the
    /// kernel copies through read and write.
    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let fs = self.fs.clone();
        self.spawn("copy_file_range", req, async move {
            match fs
                .copy_file_range(fh_in.0, offset_in, fh_out.0, offset_out, len)
                .await
            {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOSYS);
    }

    #[allow(clippy::too_many_arguments)]
    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: fuser::PollNotifier,
        _events: fuser::PollEvents,
        _flags: fuser::PollFlags,
        reply: fuser::ReplyPoll,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let fs = self.fs.clone();
        self.spawn("statfs", req, async move {
            match fs.statfs().await {
                Ok(s) => reply.statfs(
                    s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
                ),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let fs = self.fs.clone();
        let (uid, gid) = (req.uid(), req.gid());
        self.spawn("access", req, async move {
            reply_empty(reply, fs.access(ino.0, mask.bits(), uid, gid).await)
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let fs = self.fs.clone();
        let name = name.to_owned();
        let open = OpenRequest {
            flags,
            pid: req.pid(),
            caller: caller(req),
        };
        self.spawn("create", req, async move {
            match fs.create(parent.0, &name, mode, umask, open).await {
                // (One TTL for both, as in readdirplus: the shorter.)
                Ok((e, fh)) => reply.created(
                    &e.entry_ttl.min(e.attr_ttl),
                    &fuse_attr(&e.attr),
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::empty(),
                ),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_before_1970_come_out_as_the_kernel_sent_them() {
        // What fuser 0.18 makes of the kernel's (-1 s, 500 ns) and (-3 s, 0 ns).
        let garbled = UNIX_EPOCH - Duration::new(1, 500);
        assert_eq!(
            before_epoch_fixed(garbled),
            UNIX_EPOCH - Duration::new(0, 999_999_500)
        );
        let whole = UNIX_EPOCH - Duration::from_secs(3);
        assert_eq!(before_epoch_fixed(whole), whole);
        let after = UNIX_EPOCH + Duration::new(5, 7);
        assert_eq!(before_epoch_fixed(after), after);
    }
}
