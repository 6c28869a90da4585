//! The filesystem core: every operation a tool performs, in terms of the [`Remote`] trait.
//!
//! It knows nothing of FUSE: the adapter in `crate::fuse` turns kernel requests into calls of
//! the async methods here and the results into replies. That keeps this layer testable with the
//! local-directory remote and no kernel in the loop.
//!
//! Locking: the inode table, the caches and the handle tables are behind `std::sync::Mutex`es
//! that are only ever held for a few map operations, never across an `.await`.

pub mod cache;
mod copy;
pub mod errno;
pub mod file;
pub mod inode;
pub mod kernel_caches;
mod names;
pub mod prefetch;
mod remove_behind;
mod resolved_dirs;
mod specials;
mod walk_ahead;
mod write_back;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use self::cache::{CacheConfig, CachedAttrs, MetaCache};
use self::errno::{check_name, Inference, Op};
use self::file::{OpenFile, Told, WriteStream};
use self::inode::{Ino, InodeTable, Location, PageCacheMark, SetTime, SetTimes, ROOT_INO};
use self::prefetch::{SmallFileAhead, Snapshot};
use self::remove_behind::RemovesBehind;
use self::specials::{Node, Specials};
use crate::error::{FsError, FsResult};
use crate::policy::containment;
use crate::policy::enforcer::Enforcer;
use crate::policy::SymlinkMode;
use crate::remote::{
    Along, Attrs, DirEntry, FileKind, OpenFlags, Remote, RemoteError, RenameMode, SetAttrs, Status,
};

/// Attributes in the form the kernel wants them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub size: u64,
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    /// SFTP v3 has no ctime: the later of the mtime and the last status change the mount
    /// itself made (see `InodeTable::status_changed`).
    pub ctime: SystemTime,
    pub kind: FileKind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// A device node's number (the kernel's encoding); 0 for everything else. Only device
    /// nodes made through the mount have one: SFTP v3 does not carry it.
    pub rdev: u32,
}

/// An answer to lookup/mkdir/create/...: the inode and how long the kernel may cache it.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub attr: Attr,
    pub entry_ttl: Duration,
    pub attr_ttl: Duration,
}

/// `statfs` answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// A change requested by `setattr`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SetattrRequest {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSpec>,
    pub mtime: Option<TimeSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSpec {
    Now,
    At(SystemTime),
}

impl TimeSpec {
    /// The time meant, `now` standing for "now".
    pub fn or(self, now: SystemTime) -> SystemTime {
        match self {
            TimeSpec::Now => now,
            TimeSpec::At(t) => t,
        }
    }
}

/// One entry handed to readdir.
#[derive(Debug, Clone)]
pub struct DirItem {
    pub name: OsString,
    pub kind: FileKind,
    /// Offset of the *next* entry, as the kernel wants it.
    pub next_offset: u64,
    /// Attributes from the listing (absent for "." and "..").
    pub attrs: Option<Attrs>,
    pub nlink: Option<u32>,
    /// The change clock when the listing was taken (see `MetaCache::changed_since`).
    pub listed_at: u64,
    /// When the listing was taken (None: not known, as for a listing not kept): a
    /// readdirplus entry is kept, by the mount and the kernel, for the TTLs from then.
    pub taken: Option<Instant>,
    /// A special file the mount keeps (see `specials`), not an entry of the server.
    pub local: bool,
}

/// Open flags as the kernel gives them, decoded, and who asked.
#[derive(Debug, Clone, Copy)]
pub struct OpenRequest {
    pub flags: i32,
    /// The thread that opens (the kernel's request pid; 0 if not known).
    pub pid: u32,
    /// Who opens: a file it creates becomes theirs (see `Fs::owner_for_new`).
    pub caller: Caller,
}

impl Default for OpenRequest {
    fn default() -> Self {
        OpenRequest {
            flags: 0,
            pid: 0,
            caller: Caller::ROOT,
        }
    }
}

impl OpenRequest {
    fn wants_write(&self) -> bool {
        matches!(self.flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR)
            || self.flags & libc::O_TRUNC != 0
    }

    fn remote_flags(&self) -> OpenFlags {
        let acc = self.flags & libc::O_ACCMODE;
        OpenFlags {
            read: acc == libc::O_RDONLY || acc == libc::O_RDWR,
            write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
            append: self.flags & libc::O_APPEND != 0,
            create: false,
            truncate: self.flags & libc::O_TRUNC != 0,
            exclusive: false,
        }
    }
}

/// Settings of one mount that the core needs.
#[derive(Debug, Clone, Default)]
pub struct FsConfig {
    pub cache: CacheConfig,
    pub read_only: bool,
    /// `follow_symlinks`: show what a symlink points to instead of the link.
    pub follow_symlinks: bool,
    /// `idmap=user`: (remote uid, remote gid) shown as (local uid, local gid).
    pub idmap: Option<((u32, u32), (u32, u32))>,
    /// `uid=N`, `gid=N` (sshfs, from libfuse): every file shown as owned by them.
    pub shown_uid: Option<u32>,
    pub shown_gid: Option<u32>,
    /// `umask=M` (sshfs, from libfuse): permission bits not shown.
    pub shown_umask: u32,
    /// The live policy: symlink mode and quota.
    pub enforcer: Arc<Enforcer>,
    /// `sync_unlink`: every unlink waits for the server's answer (see `remove_behind`).
    pub sync_unlink: bool,
    /// `sync_create`: every create waits for the server's OPEN (see `Fs::create_early`).
    pub sync_create: bool,
    /// `allow_other`: local users share the mount, and a new file, directory or symlink
    /// belongs to the one who made it, as on a local disk, when the server's account can
    /// give it away (it is root). See `owner_for_new`.
    pub owners_from_callers: bool,
}

/// Who asks, as the kernel's request says: the caller's filesystem uid and gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

impl Caller {
    pub const ROOT: Caller = Caller { uid: 0, gid: 0 };
}

/// Counters for `awcp-mount status`.
#[derive(Debug, Default)]
pub struct Stats {
    pub ops: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Of the bytes written, those sent through the extra lanes of striped writes (long
    /// sequential runs, or many scattered writes; see `file.rs`).
    pub bytes_striped: AtomicU64,
    /// Writes that went out as part of an earlier one's WRITE: queued behind it, continuing
    /// it (see `Merged` in `file.rs`).
    pub writes_merged: AtomicU64,
    /// Attribute changes that went out in an earlier one's FSETSTAT: queued behind it, of
    /// the same descriptor (see `merge_setattrs` in `file.rs`).
    pub setattrs_merged: AtomicU64,
    pub remote_errors: AtomicU64,
    /// Opens answered from a small file fetched ahead (see `prefetch`), without a round trip.
    pub opens_fetched_ahead: AtomicU64,
    /// Opens whose file's first bytes came along with the OPEN (see [`Fs::read_along_len`]).
    pub opens_read_along: AtomicU64,
    /// Opens answered without the server while the kernel keeps its pages (see
    /// [`Fs::open_deferred`]).
    pub opens_deferred: AtomicU64,
    /// Attribute changes answered with attributes asked for right behind the change, in the
    /// same round trip (see [`Remote::setstat_lstat`]).
    pub setattrs_stat_along: AtomicU64,
    /// Closes that learnt the attributes the file's writes left, asked right behind them
    /// (see [`Fs::attrs_behind_writes`]).
    pub attrs_along_writes: AtomicU64,
    /// Unlinks answered before the server's answer (see `remove_behind`).
    pub unlinks_behind: AtomicU64,
    /// Writes (and attribute changes behind them) on the wire when the connection was lost,
    /// sent again on the new one (see `file::catch_up`).
    pub writes_sent_again: AtomicU64,
    /// Bytes copied by the server for `copy_file_range` (see `copy`), without crossing the
    /// link.
    pub bytes_copied_on_server: AtomicU64,
    /// Listings fetched ahead of a walk by path (see `walk_ahead`).
    pub dirs_listed_ahead: AtomicU64,
    /// Inodes whose cached attributes and data were dropped because a file that may be
    /// another name of theirs changed (see [`Fs::shared_data_changed`]).
    pub shared_drops: AtomicU64,
}

/// How many subdirectory listings may wait to be prefetched, for the whole mount. Past that,
/// subdirectories are listed when they are opened, as before.
const MAX_DIR_PREFETCHES: usize = 512;
/// How many of them are fetched at once (each holds a server handle meanwhile).
const MAX_DIR_LISTINGS_AHEAD: usize = 32;
/// How many unknown attributes one readdirplus batch asks for at once (see
/// `fill_unknown_attrs`): a reply to the kernel (32 KiB) holds about 200 entries.
const FILL_AT_ONCE: usize = 256;

struct DirHandle {
    ino: Ino,
    /// The listing handed out; replaced by a fresh one when the directory is rewound.
    items: Mutex<Arc<Vec<DirItem>>>,
    /// Whether readdir has been called on this handle: a later read from offset 0 is a
    /// rewinddir(3), which must show the directory as it is now.
    started: AtomicBool,
}

/// Bytes read along with opens and not yet read by the kernel, mount-wide (see
/// [`Fs::read_along_len`]).
pub const READ_ALONG_BYTES: u64 = 8 * 1024 * 1024;

/// A kernel read on its way, from [`Fs::read_starting`] until it is dropped, once the read
/// is answered (see [`Fs::read_answered`]; dropped on any path, a panic's too, so the count
/// of reads on their way cannot be left behind).
#[must_use = "keep it until the read is answered"]
pub struct ReadWatch<R: Remote> {
    fs: Arc<Fs<R>>,
    ino: Ino,
    /// Counted as being read ([`InodeTable::read_started`]).
    counted: bool,
    /// [`Fs::shared_changes`] before the read.
    since: u64,
}

impl<R: Remote> Drop for ReadWatch<R> {
    fn drop(&mut self) {
        self.fs.read_ended(self.ino, self.counted, self.since);
    }
}

/// The first bytes of a file, read along with its open.
struct ReadAlong {
    ino: Ino,
    data: Bytes,
    /// The file ended within them.
    eof: bool,
    /// Used until then (the open plus the attribute TTL) ...
    until: Instant,
    /// ... and while nothing changed the file through the mount since the change clock read
    /// this ...
    since: u64,
    /// ... nor, if it may share its data with other inodes (links made on the server), any
    /// such file since [`Fs::shared_changes`] read this (see [`Fs::read_answered`]).
    shared_since: u64,
}

pub struct Fs<R: Remote> {
    remote: Arc<R>,
    rt: tokio::runtime::Handle,
    /// Absolute path of the export on the server.
    root: PathBuf,
    config: Mutex<FsConfig>,
    read_only: AtomicBool,
    /// A downgrade has begun: every change is refused but the kernel's write-back of pages
    /// dirtied before it (see [`Fs::refuse_changes_but_page_writeback`]).
    downgrading: AtomicBool,
    /// Mutating operations past their read-only check and not yet done (see [`Mutating`]).
    mutations: AtomicUsize,
    /// Told when `mutations` drops to zero.
    mutations_done: tokio::sync::Notify,
    inodes: Mutex<InodeTable>,
    /// FIFOs, sockets and device nodes made through the mount, which only the mount keeps
    /// (see `specials`).
    specials: Mutex<Specials>,
    cache: Mutex<MetaCache>,
    files: Mutex<HashMap<u64, Arc<OpenFile<R>>>>,
    /// The write queue of each file with open descriptors (shared by them all).
    streams: Mutex<HashMap<Ino, std::sync::Weak<WriteStream<R>>>>,
    /// When to write long writes back early (see `file::WRITE_BACK_EVERY`), and the failures
    /// of those write-backs for the next `fsync` to report.
    early_write_back: write_back::EarlyWriteBack,
    dirs: Mutex<HashMap<u64, Arc<DirHandle>>>,
    next_fh: AtomicU64,
    enforcer: Arc<Enforcer>,
    /// Top-level symlinks with absolute targets that the mount follows on the server: the
    /// resource links of an AWCP export. Name -> the target's real path on the server, the
    /// containment root for everything below it.
    resource_links: Mutex<HashMap<OsString, PathBuf>>,
    /// Directories the server resolved inside the workspace lately (see `resolved_dirs`).
    resolved_dirs: resolved_dirs::ResolvedDirs,
    /// Whether the export is an AWCP export (`.awcp/manifest.json` at its root) and, if its
    /// manifest names them, which top-level names are resources. Read once.
    awcp_export: tokio::sync::OnceCell<Option<Vec<OsString>>>,
    /// Recent lookup misses per directory (count, since) and listings being fetched for
    /// lookups: see `lookups_warrant_listing`.
    lookup_misses: Mutex<lru::LruCache<Ino, (u32, std::time::Instant)>>,
    #[allow(clippy::type_complexity)]
    /// (With the change clock from before each listing was asked for.)
    #[allow(clippy::type_complexity)]
    listings_in_flight:
        Mutex<HashMap<Ino, Arc<tokio::sync::OnceCell<Option<(Arc<Vec<DirEntry>>, u64)>>>>>,
    /// Bounds the subdirectory listings prefetched in the background (see `prefetch_dir`).
    dir_prefetches: Arc<tokio::sync::Semaphore>,
    dir_listings_ahead: Arc<tokio::sync::Semaphore>,
    /// Walks down the tree and the listings fetched ahead of them (see `walk_ahead`).
    walk: walk_ahead::WalkAhead,
    /// Small files fetched ahead of their open (see `prefetch`), and the bound on fetches.
    small_files: SmallFileAhead,
    file_fetches: Arc<tokio::sync::Semaphore>,
    /// Descriptors answered from a fetched-ahead snapshot: read from memory, no server handle.
    snapshots: Mutex<HashMap<u64, (Ino, Arc<Snapshot>)>>,
    /// The first bytes of files, read along with their open, until the kernel reads them
    /// (see [`Fs::read_along_len`]). Locked before `cache`.
    read_along: Mutex<HashMap<u64, ReadAlong>>,
    /// Unlinks answered before the server's answer, still on their way or failed.
    removes_behind: RemovesBehind,
    /// Creates answered before their OPEN (see `Fs::create_early`), kept the same way: what
    /// must come after one waits for it.
    creates_behind: RemovesBehind,
    /// Renames and unlinks on their way to the server, for opening live files by name.
    names: names::NameChanges,
    /// What the kernel caches of inodes, dropped when the mount says so (see
    /// [`Fs::shared_data_changed`]).
    kernel_caches: kernel_caches::KernelCaches,
    /// Changes through the mount to files that may share their data with other inodes (see
    /// [`Fs::shared_data_changed`]), counted for [`Fs::read_answered`].
    shared_changes: AtomicU64,
    pub stats: Stats,
}

fn to_system_time(secs: Option<u32>) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs.unwrap_or(0) as u64)
}

/// The times a setattr asks for, and what SFTP v3 carries of them (see [`SetTime`]).
fn times_asked(req: &SetattrRequest) -> SetTimes {
    let set_time = |t: TimeSpec| {
        let asked = t.or(SystemTime::now());
        SetTime {
            asked,
            sent: to_seconds(TimeSpec::At(asked)),
            shown: t != TimeSpec::Now,
        }
    };
    SetTimes {
        atime: req.atime.map(set_time),
        mtime: req.mtime.map(set_time),
    }
}

fn to_seconds(t: TimeSpec) -> u32 {
    let t = t.or(SystemTime::now());
    // SFTP v3 carries unsigned 32-bit seconds: clamp instead of wrapping.
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs().min(u32::MAX as u64) as u32,
        Err(_) => 0,
    }
}

/// Whether `len` bytes at `offset` would pass the largest offset a file can have (`off_t`).
fn past_max_offset(offset: u64, len: u64) -> bool {
    offset
        .checked_add(len)
        .is_none_or(|end| end > i64::MAX as u64)
}

/// `ENOTDIR` for `path`.
fn not_a_directory(path: &Path) -> FsError {
    FsError::new(
        libc::ENOTDIR,
        format!("{}: not a directory", path.display()),
    )
}

/// A change refused because the delegation's byte quota has no room for it.
fn quota_used_up() -> FsError {
    FsError::new(libc::ENOSPC, "the delegation's byte quota is used up")
}

fn remote_err(op: Op, err: &RemoteError, what: impl std::fmt::Display) -> FsError {
    let errno = errno::direct(err, op).unwrap_or(libc::EIO);
    FsError::new(errno, format!("{what}: {err}"))
}

/// Resource names an AWCP manifest declares: the `name` of each object in a `resources` array,
/// wherever it is. Empty when the manifest names none (or is not JSON we understand).
fn manifest_resource_names(text: &[u8]) -> Vec<OsString> {
    fn walk(v: &serde_json::Value, out: &mut Vec<OsString>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(serde_json::Value::Array(rs)) = m.get("resources") {
                    for r in rs {
                        if let Some(n) = r.get("name").and_then(|n| n.as_str()) {
                            out.push(n.into());
                        }
                    }
                }
                m.values().for_each(|v| walk(v, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(text) {
        walk(&v, &mut out);
    }
    out.sort();
    out.dedup();
    out
}

/// The entries readdir hands out for `listing`: ".", "..", then the listing, each with the
/// offset of the next one.
fn dir_items(listing: &[DirEntry], listed_at: u64, taken: Option<Instant>) -> Vec<DirItem> {
    let dot = |name: &str, next_offset| DirItem {
        name: name.into(),
        kind: FileKind::Dir,
        next_offset,
        attrs: None,
        nlink: None,
        listed_at,
        taken,
        local: false,
    };
    let mut items = Vec::with_capacity(listing.len() + 2);
    items.push(dot(".", 1));
    items.push(dot("..", 2));
    items.extend(listing.iter().enumerate().map(|(i, e)| DirItem {
        name: e.name.clone(),
        kind: e.attrs.file_type(),
        next_offset: i as u64 + 3,
        attrs: Some(e.attrs),
        nlink: e.nlink,
        listed_at,
        taken,
        local: false,
    }));
    items
}

/// Whether a file keeps its data after losing a name: the mount knows another of its names,
/// or the server counted more than one link.
fn data_lives_on(d: inode::Detached) -> bool {
    d.names_left > 0 || d.nlink_before.is_some_and(|n| n > 1)
}

/// A directory's link count changed by a subdirectory made, removed or moved through the
/// mount, for the listings that show it (`Fs::listings_follow_subdirs`).
struct SubdirsChanged {
    /// Where the directory is listed: its parent and name.
    names: Vec<(Ino, OsString)>,
    /// Its count in the inode table, if known.
    known: Option<u32>,
    delta: i32,
}

/// [`InodeTable::subdirs_changed`], noting what the listings showing `dir` must take over.
fn subdirs_changed_in(inodes: &mut InodeTable, dir: Ino, delta: i32) -> SubdirsChanged {
    SubdirsChanged {
        known: inodes.subdirs_changed(dir, delta),
        names: inodes.names_of(dir),
        delta,
    }
}

/// A directory move going on (see `MetaCache::dir_move_started`), over when dropped.
struct DirMove<'a>(&'a Mutex<MetaCache>);

impl<'a> DirMove<'a> {
    fn start(cache: &'a Mutex<MetaCache>) -> Self {
        cache.lock().unwrap().dir_move_started();
        DirMove(cache)
    }
}

impl Drop for DirMove<'_> {
    fn drop(&mut self) {
        self.0.lock().unwrap().dir_move_done();
    }
}

/// A server's listing without the names no listing may hold ("", ".", "..", names with a
/// slash or NUL): logged and hidden.
fn valid_listing(path: &Path, listing: Vec<DirEntry>) -> Vec<DirEntry> {
    listing
        .into_iter()
        .filter(|e| {
            let ok = is_valid_listing_name(&e.name);
            if !ok {
                tracing::warn!(dir = %path.display(), name = ?e.name, "server sent an invalid name in a listing; hidden");
            }
            ok
        })
        .collect()
}

/// Names a hostile server might send in a listing that must never reach the kernel.
fn is_valid_listing_name(name: &OsStr) -> bool {
    check_name(name).is_ok() && name != "." && name != ".."
}

/// Whether threads `a` and `b` (the kernel's request pids are thread ids) belong to one
/// process, as far as this mount's `/proc` can tell: a close of a descriptor by another
/// thread of the program that opened it (Go moves goroutines between threads, a thread
/// pool closes what another opened) is the program's own close, not a child's. Asked only
/// when a close comes from another thread than the open (one `stat`).
fn same_process(a: u32, b: u32) -> bool {
    Path::new(&format!("/proc/{a}/task/{b}")).exists()
}

/// A mutating operation on its way (see [`Fs::check_writable`]).
#[must_use = "the operation is counted only while the guard lives"]
pub struct Mutating<'a> {
    count: &'a AtomicUsize,
    done: &'a tokio::sync::Notify,
}

impl Drop for Mutating<'_> {
    fn drop(&mut self) {
        if self.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.done.notify_waiters();
        }
    }
}

impl<R: Remote> Fs<R> {
    /// A filesystem over `remote`, exporting the server directory `root` (absolute, already
    /// resolved by the caller). Methods must be called from within the runtime `rt`.
    pub fn new(
        remote: Arc<R>,
        root: PathBuf,
        config: FsConfig,
        rt: tokio::runtime::Handle,
    ) -> Self {
        let enforcer = config.enforcer.clone();
        Fs {
            remote,
            rt,
            root,
            read_only: AtomicBool::new(config.read_only),
            downgrading: AtomicBool::new(false),
            mutations: AtomicUsize::new(0),
            mutations_done: tokio::sync::Notify::new(),
            cache: Mutex::new(MetaCache::new(config.cache)),
            config: Mutex::new(config),
            inodes: Mutex::new(InodeTable::new()),
            specials: Mutex::new(Specials::default()),
            files: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            early_write_back: write_back::EarlyWriteBack::new(),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            enforcer,
            resource_links: Mutex::new(HashMap::new()),
            resolved_dirs: resolved_dirs::ResolvedDirs::default(),
            awcp_export: tokio::sync::OnceCell::new(),
            lookup_misses: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(1024).expect("non-zero"),
            )),
            listings_in_flight: Mutex::new(HashMap::new()),
            dir_prefetches: Arc::new(tokio::sync::Semaphore::new(MAX_DIR_PREFETCHES)),
            dir_listings_ahead: Arc::new(tokio::sync::Semaphore::new(MAX_DIR_LISTINGS_AHEAD)),
            walk: walk_ahead::WalkAhead::new(),
            small_files: SmallFileAhead::default(),
            file_fetches: Arc::new(tokio::sync::Semaphore::new(prefetch::MAX_FILE_FETCHES)),
            snapshots: Mutex::new(HashMap::new()),
            read_along: Mutex::new(HashMap::new()),
            removes_behind: RemovesBehind::default(),
            creates_behind: RemovesBehind::default(),
            names: names::NameChanges::default(),
            kernel_caches: kernel_caches::KernelCaches::default(),
            shared_changes: AtomicU64::new(0),
            stats: Stats::default(),
        }
    }

    /// What the kernel caches: connect it once the kernel connection is up.
    pub fn kernel_caches(&self) -> &kernel_caches::KernelCaches {
        &self.kernel_caches
    }

    pub fn remote(&self) -> &Arc<R> {
        &self.remote
    }

    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.rt
    }

    pub fn cache_config(&self) -> CacheConfig {
        self.config.lock().unwrap().cache
    }

    /// Every cached attribute, negative entry, listing and link target runs out now (tests).
    #[cfg(test)]
    pub(crate) fn expire_cache(&self) {
        self.cache.lock().unwrap().expire_all();
        let now = Instant::now();
        self.inodes.lock().unwrap().expire_page_cache_marks(now);
        for r in self.read_along.lock().unwrap().values_mut() {
            r.until = r.until.min(now);
        }
    }

    /// New cache lifetimes and bounds (live policy reload).
    pub fn set_cache_config(&self, cache: CacheConfig) {
        self.config.lock().unwrap().cache = cache;
        self.cache.lock().unwrap().reconfigure(cache);
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire) || self.downgrading.load(Ordering::Acquire)
    }

    /// The first step of a downgrade: from now on every change is refused with EROFS, as on
    /// a read-only mount, but for WRITEs of the kernel's page cache (`FUSE_WRITE_CACHE`):
    /// pages a shared writable mapping dirtied before are still in the kernel only, and the
    /// downgrade has them written back before [`Fs::set_read_only`] refuses those too. (Had
    /// the mount stayed writable meanwhile, anything could have changed the server after
    /// the lease's end for as long as that write-back took.) True if this call began it.
    pub fn refuse_changes_but_page_writeback(&self) -> bool {
        // SeqCst, against `check_writable`'s count and check (see there).
        !self.downgrading.swap(true, Ordering::SeqCst)
    }

    /// Turn the mount read-only from now on (lease expiry, `awcp-mount downgrade`). Writes
    /// already queued are flushed by the caller via [`Fs::flush_all`].
    pub fn set_read_only(&self) {
        // SeqCst, against `check_writable`'s count and check (see there).
        self.read_only.store(true, Ordering::SeqCst);
    }

    /// Wait (at most `within`) until every mutating operation that passed its read-only
    /// check before [`Fs::set_read_only`] is done: a downgrade then knows nothing more will
    /// change on the server but the writes queued before it, which it flushes. False if
    /// some were still on their way at the deadline (a server that stopped answering).
    pub async fn mutations_settled(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let done = self.mutations_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.mutations.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, done).await.is_err() {
                return false;
            }
        }
    }

    /// Number of inodes the kernel currently references (for tests and status).
    pub fn inode_count(&self) -> usize {
        self.inodes.lock().unwrap().len()
    }

    pub fn open_file_count(&self) -> usize {
        // (One lock at a time: snapshots are locked before files elsewhere.)
        let files = self.files.lock().unwrap().len();
        files + self.snapshots.lock().unwrap().len()
    }

    /// Refuse `what` with `EROFS` on a read-only mount; else the operation may change the
    /// server for as long as it holds the returned guard, and a downgrade waits for it
    /// ([`Fs::mutations_settled`]): an operation that passed the check just before the
    /// lease ended must not land after the mount turned read-only. Counted before the flag
    /// is read, and the flag set before the count is read (both SeqCst): either the
    /// downgrade sees the operation, or the operation sees the flag.
    fn check_writable(&self, what: &str) -> FsResult<Mutating<'_>> {
        self.check_writable_unless(what, false)
    }

    /// [`Fs::check_writable`], for a WRITE of the kernel's page cache if `page_writeback`,
    /// which a downgrade lets through until the mount is read-only.
    fn check_writable_unless(&self, what: &str, page_writeback: bool) -> FsResult<Mutating<'_>> {
        self.mutations.fetch_add(1, Ordering::SeqCst);
        let guard = Mutating {
            count: &self.mutations,
            done: &self.mutations_done,
        };
        if self.read_only.load(Ordering::SeqCst)
            || (!page_writeback && self.downgrading.load(Ordering::SeqCst))
        {
            return Err(FsError::new(
                libc::EROFS,
                format!("{what}: the mount is read-only"),
            ));
        }
        Ok(guard)
    }

    /// Count one more entry against the quota, or refuse with ENOSPC.
    fn reserve_entry(&self, path: &Path) -> FsResult<()> {
        self.enforcer.quota.reserve_entry().map_err(|_| {
            FsError::new(
                libc::ENOSPC,
                format!("{}: the delegation's file quota is used up", path.display()),
            )
        })
    }

    /// The size of `ino` for quota accounting: tracked, or asked of the server.
    async fn quota_size(&self, ino: Option<Ino>, path: &Path) -> u64 {
        let tracked = ino.and_then(|i| self.enforcer.quota.size_of(i));
        // With `follow_symlinks` a link is shown, and its size tracked, as the file it points
        // to; removing the link frees none of that. Only the server can say which it is.
        if self.follows_links_under_quota() {
            return match self.remote.lstat(path).await {
                Ok(a) if a.file_type() != FileKind::File => 0,
                Ok(a) => tracked.unwrap_or(a.size.unwrap_or(0)),
                Err(_) => tracked.unwrap_or(0),
            };
        }
        // What the mount tracked is used whether or not a limit is set, so usage stays
        // right when a limit is set later; asking the server is only worth it with a limit.
        if let Some(size) = tracked {
            return size;
        }
        if !self.enforcer.quota.is_limited() {
            return 0;
        }
        match self.remote.lstat(path).await {
            Ok(a) if a.file_type() == FileKind::File => a.size.unwrap_or(0),
            _ => 0,
        }
    }

    /// A quota is set and links are shown as what they point to: the size the mount
    /// tracks for a name may be another file's (see [`Fs::quota_size`]).
    fn follows_links_under_quota(&self) -> bool {
        self.enforcer.quota.is_limited() && self.config.lock().unwrap().follow_symlinks
    }

    pub fn enforcer(&self) -> &Arc<Enforcer> {
        &self.enforcer
    }

    /// A new open descriptor of `ino`, sharing the file's write queue with the others.
    fn register_file(&self, ino: Ino, flags: OpenFlags, handle: R::Handle, opener: u32) -> u64 {
        let fh = self.alloc_fh();
        self.register_file_at(fh, ino, flags, handle, opener);
        fh
    }

    /// Register an open file under descriptor number `fh`.
    fn register_file_at(
        &self,
        fh: u64,
        ino: Ino,
        flags: OpenFlags,
        handle: R::Handle,
        opener: u32,
    ) {
        self.register_with(fh, ino, |stream| {
            OpenFile::new(ino, flags, handle, stream, opener)
        });
    }

    /// Register under `fh` the open file `make` builds on `ino`'s write stream (the one its
    /// other descriptors share, or a new one).
    fn register_with(
        &self,
        fh: u64,
        ino: Ino,
        make: impl FnOnce(Arc<WriteStream<R>>) -> OpenFile<R>,
    ) -> Arc<OpenFile<R>> {
        // Lock order: streams, then files (as in release), so an open racing the last
        // close of the same file can never end up with a second stream.
        let mut streams = self.streams.lock().unwrap();
        let stream = match streams.get(&ino).and_then(std::sync::Weak::upgrade) {
            Some(s) => s,
            None => {
                let s = Arc::new(WriteStream::default());
                streams.insert(ino, Arc::downgrade(&s));
                s
            }
        };
        let mut files = self.files.lock().unwrap();
        for other in files.values().filter(|f| f.ino == ino) {
            // Another descriptor may change the file: what its creator knew is not enough.
            other.update_created(None);
        }
        let file = Arc::new(make(stream));
        files.insert(fh, file.clone());
        file
    }

    /// Register a descriptor whose handle is not known yet (see `Fs::create_early`).
    fn register_pending_file(
        &self,
        ino: Ino,
        flags: OpenFlags,
        opener: u32,
    ) -> (u64, Arc<OpenFile<R>>, file::PendingHandle<R>) {
        let fh = self.alloc_fh();
        let mut pending = None;
        let file = self.register_with(fh, ino, |stream| {
            let (file, handle) = OpenFile::pending(ino, flags, stream, opener);
            pending = Some(handle);
            file
        });
        (fh, file, pending.expect("register_with calls make"))
    }

    fn alloc_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    /// Where the files open for writing are, relative to the workspace (each once; not
    /// those whose name was removed): what a downgrade has the kernel write back first.
    pub fn paths_open_for_writing(&self) -> Vec<PathBuf> {
        let mut inos: Vec<Ino> = {
            let files = self.files.lock().unwrap();
            files
                .values()
                .filter(|f| f.flags.write)
                .map(|f| f.ino)
                .collect()
        };
        inos.sort_unstable();
        inos.dedup();
        let inodes = self.inodes.lock().unwrap();
        inos.into_iter()
            .filter_map(|ino| match inodes.location(ino) {
                Location::Path(rel) => Some(rel),
                Location::Detached => None,
            })
            .collect()
    }

    /// Absolute server path of an inode.
    fn path_of(&self, ino: Ino) -> FsResult<PathBuf> {
        match self.inodes.lock().unwrap().location(ino) {
            Location::Path(rel) => Ok(self.root.join(rel)),
            Location::Detached => Err(FsError::new(
                libc::ENOENT,
                format!("inode {ino} was removed or is unknown"),
            )),
        }
    }

    fn child_path(&self, parent: Ino, name: &OsStr) -> FsResult<PathBuf> {
        check_name(name)?;
        Ok(self.path_of(parent)?.join(name))
    }

    fn make_attr(&self, ino: Ino, a: &Attrs, nlink: Option<u32>) -> Attr {
        let (known_nlink, changed, set) = {
            let inodes = self.inodes.lock().unwrap();
            (
                inodes.nlink(ino),
                inodes.last_status_change(ino),
                inodes.set_times(ino),
            )
        };
        let server_mtime = to_system_time(a.mtime);
        let mtime = SetTime::instead_of(set.mtime, a.mtime).unwrap_or(server_mtime);
        let atime =
            SetTime::instead_of(set.atime, a.atime).unwrap_or_else(|| to_system_time(a.atime));
        let kind = a.file_type();
        // No file is larger than `i64::MAX`: the kernel takes a larger size for a broken
        // inode and answers EIO for it from then on. Only a broken or hostile server says so.
        let size = a.size.unwrap_or(0).min(i64::MAX as u64);
        let (mut uid, mut gid) = (a.uid.unwrap_or(0), a.gid.unwrap_or(0));
        let (shown_uid, shown_gid, umask) = {
            let config = self.config.lock().unwrap();
            if let Some(((ruid, rgid), (luid, lgid))) = config.idmap {
                if uid == ruid {
                    uid = luid;
                }
                if gid == rgid {
                    gid = lgid;
                }
            }
            (config.shown_uid, config.shown_gid, config.shown_umask)
        };
        uid = shown_uid.unwrap_or(uid);
        gid = shown_gid.unwrap_or(gid);
        Attr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime,
            mtime,
            // The later of the last change through the mount and the server's mtime (a
            // change on the server changed the status too), but for an mtime set through
            // the mount and still the server's: setting it changed the status now, whatever
            // time it set (one in the future must not freeze the ctime there, as
            // `touch -d tomorrow; chmod` shows on a local disk).
            ctime: match changed {
                Some(c) if set.mtime.is_some_and(|t| a.mtime == Some(t.sent)) => c,
                Some(c) => c.max(server_mtime),
                None => server_mtime,
            },
            kind,
            perm: (a.mode.unwrap_or(0) & 0o7777 & !umask) as u16,
            // SFTP v3 has no link count: the table's (a listing's, kept up to date by links
            // and unlinks through the mount; 0 once the mount removed every name of a file
            // still open, as on a local disk), else 1, which tells find(1) not to use the
            // leaf optimisation.
            nlink: known_nlink.or(nlink).unwrap_or(1),
            uid,
            gid,
            rdev: 0,
        }
    }

    /// The owner and group a chown sends for a file the server has as `cur`: the ones asked
    /// for (mapped back under `idmap=user`), and the server's own for the one not asked for:
    /// not what is shown, which `uid=`/`gid=` may have replaced (`chgrp` under `-o uid=N`
    /// would send N as the owner).
    fn owner_to_send(&self, uid: Option<u32>, gid: Option<u32>, cur: &Attrs) -> (u32, u32) {
        let (ruid, rgid) = self.unmap_ids(uid.unwrap_or(0), gid.unwrap_or(0));
        (
            if uid.is_some() {
                ruid
            } else {
                cur.uid.unwrap_or(0)
            },
            if gid.is_some() {
                rgid
            } else {
                cur.gid.unwrap_or(0)
            },
        )
    }

    /// Map a local uid/gid being set back to the remote one under `idmap=user`.
    fn unmap_ids(&self, uid: u32, gid: u32) -> (u32, u32) {
        match self.config.lock().unwrap().idmap {
            Some(((ruid, rgid), (luid, lgid))) => (
                if uid == luid { ruid } else { uid },
                if gid == lgid { rgid } else { gid },
            ),
            None => (uid, gid),
        }
    }

    fn entry(&self, attr: Attr) -> Entry {
        let c = self.cache_config();
        Entry {
            attr,
            entry_ttl: c.entry_ttl,
            attr_ttl: self.kernel_attr_ttl(attr.ino),
        }
    }

    /// An entry answered from a listing taken at `taken` (None: not known): the mount and
    /// the kernel keep it no longer than the TTLs from then, so a change on the server shows
    /// within the TTLs of when the listing was taken, not of when it was used.
    fn entry_from_listing(&self, attr: Attr, taken: Option<Instant>) -> Entry {
        let Some(taken) = taken else {
            return self.entry(attr);
        };
        let c = self.cache_config();
        let attrs_until = taken + c.attr_ttl;
        self.cache.lock().unwrap().cap_attrs(attr.ino, attrs_until);
        let mut e = self.entry(attr);
        let now = Instant::now();
        e.attr_ttl = e.attr_ttl.min(attrs_until.saturating_duration_since(now));
        e.entry_ttl = e
            .entry_ttl
            .min((taken + c.entry_ttl).saturating_duration_since(now));
        e
    }

    /// How long the kernel may keep the attributes of `ino` it is given now: the attribute
    /// TTL ([`Fs::attr_ttl_for`]), and no longer than the mount's cached copy has left (it may
    /// be an older answer: the kernel's lifetime must not start again with each use of it).
    pub fn kernel_attr_ttl(&self, ino: Ino) -> Duration {
        let ttl = self.attr_ttl_for(ino);
        match self.cache.lock().unwrap().attrs_left(ino) {
            Some(left) => ttl.min(left),
            None => ttl,
        }
    }

    /// How long the kernel may keep the attributes of `ino`, and the mount what it caches
    /// of it (attributes, fetched data, the kernel's pages kept across opens): the attribute
    /// TTL. Asked for whenever something of `ino` is about to be cached, so a file with hard
    /// links the mount does not know by name (made on the server: SFTP v3 cannot tell which
    /// names are one file, so each is an inode of its own here) is noted then: a change
    /// through one of its other names drops it all ([`Fs::shared_data_changed`]).
    pub fn attr_ttl_for(&self, ino: Ino) -> Duration {
        self.inodes.lock().unwrap().note_if_shared(ino);
        self.cache_config().attr_ttl
    }

    /// A change of `ino` through the mount (data or attributes) may show through inodes the
    /// mount cannot tell are the same file: the names of a file hard-linked on the server
    /// are inodes of their own here. So when `ino` may be such a file (a regular file with
    /// links the mount does not know by name, or an unknown link count), every inode with
    /// such links whose attributes or data may be cached since the last time (here, or in
    /// the kernel) has them dropped: its cached attributes, pages and fetched data, the
    /// listing entries of such files, and the kernel's attributes and pages of those inodes
    /// (sent from a thread of its own; requests that report a change done, a close, an fsync
    /// or a setattr, wait for it: `KernelCaches::settled`). The next look at any of
    /// them asks the server, which has the change once it has landed.
    fn shared_data_changed(&self, ino: Ino) {
        let mut inodes = self.inodes.lock().unwrap();
        if !inodes.may_share_data(ino) {
            return;
        }
        self.shared_changes.fetch_add(1, Ordering::AcqRel);
        let others: Vec<_> = inodes
            .take_shared_cached(ino)
            .into_iter()
            .map(|o| (o, inodes.names_of(o)))
            .collect();
        for (other, _) in &others {
            inodes.forget_set_times(*other);
        }
        // Dropped and queued before the inode table is let go: a change right after (a
        // close's drop, which then waits for the kernel) finds these inodes taken, and must
        // find what they had already marked changed and their kernel drop queued. (Lookups
        // and reads wait meanwhile, for as long as the metadata cache takes to drop what it
        // holds of such files: a walk over their listings.)
        let mut cache = self.cache.lock().unwrap();
        cache.shared_data_changed();
        for (other, names) in &others {
            cache.attrs_changed(*other, names, None);
        }
        drop(cache);
        self.kernel_caches
            .invalidate(others.iter().map(|(o, _)| *o).collect());
        drop(inodes);
        if !others.is_empty() {
            self.stats
                .shared_drops
                .fetch_add(others.len() as u64, Ordering::Relaxed);
            tracing::debug!(
                ino,
                others = others.len(),
                "a file with unknown links changed"
            );
        }
    }

    /// How many changes may have shown through other inodes ([`Fs::shared_data_changed`]).
    pub fn shared_changes(&self) -> u64 {
        self.shared_changes.load(Ordering::Acquire)
    }

    /// A kernel read of `ino` is about to be carried out: what [`Fs::read_answered`] needs
    /// after it. A file with links the mount does not know by name is counted as being read
    /// until then, so every change through another name meanwhile drops its pages
    /// ([`InodeTable::take_shared_cached`]): the kernel holds the pages of a read on its way
    /// locked, so the drop waits for the answer and takes them after it, and a close or
    /// fsync waits for the drop ([`kernel_caches::KernelCaches::settled`]). Without that, a read that
    /// fetched the old data before the change's writes landed, answered after the drop made
    /// once they were all answered, would leave the old data cached past the close.
    pub fn read_starting(self: &Arc<Self>, ino: Ino) -> ReadWatch<R> {
        let mut inodes = self.inodes.lock().unwrap();
        ReadWatch {
            fs: self.clone(),
            ino,
            counted: inodes.read_started(ino),
            since: self.shared_changes(),
        }
    }

    /// The read `w` ([`Fs::read_starting`]) has been answered to the kernel (or failed): the
    /// same as dropping `w`, said where it happens.
    pub fn read_answered(&self, w: ReadWatch<R>) {
        drop(w);
    }

    /// What dropping a [`ReadWatch`] does. The kernel may keep the read's pages, so `ino`
    /// is noted as cached ([`InodeTable::note_if_shared`]): the next change through another
    /// name drops them, though no open, lookup or getattr of it (a descriptor open for
    /// long) notes it. And if a file that may share its data with it (links made on the
    /// server) changed through the mount while the read was on its way, the read may have
    /// fetched the old data before the change landed: the kernel is told once more to drop
    /// its pages. A counted read was already taken by the change itself (see
    /// [`Fs::read_starting`]); this matters for a file whose link count is not known, which
    /// is never counted nor noted, and whose drop no close waits for. Noted and compared
    /// under the inode table's lock, under which [`Fs::shared_data_changed`] counts and
    /// takes the noted.
    fn read_ended(&self, ino: Ino, counted: bool, since: u64) {
        let again = {
            let mut inodes = self.inodes.lock().unwrap();
            if counted {
                inodes.read_ended(ino);
            }
            inodes.note_if_shared(ino);
            self.shared_changes() != since && inodes.may_share_data(ino)
        };
        if again {
            self.kernel_caches.invalidate(vec![ino]);
        }
    }

    /// The writes of `file` are all answered (a close or fsync waited for them): drop the
    /// other names' caches once more, then wait for the kernel. A read of another name
    /// answered while the writes were on their way (another SFTP channel may serve it
    /// first) holds the old data, and was cached after the drop made when they were sent.
    async fn written_through_settled(&self, file: &OpenFile<R>) {
        self.shared_data_changed(file.ino);
        self.kernel_caches.settled().await;
    }

    /// lstat (or stat, with follow_symlinks) of a server path.
    /// Attributes of `path` for an inode the kernel holds as `kind` (None: a name seen for
    /// the first time). An inode keeps the kind it was first shown with: one held as a symlink
    /// is the link itself, never followed; anything else goes through [`Fs::stat_path`].
    async fn stat_as(&self, path: &Path, kind: Option<FileKind>) -> Result<Attrs, RemoteError> {
        if kind == Some(FileKind::Symlink) {
            self.remote.lstat(path).await
        } else {
            self.stat_path(path).await
        }
    }

    async fn stat_path(&self, path: &Path) -> Result<Attrs, RemoteError> {
        let attrs = self.remote.lstat(path).await?;
        if attrs.file_type() != FileKind::Symlink {
            return Ok(attrs);
        }
        let rel = path.strip_prefix(&self.root).unwrap_or(path);
        if rel.components().count() == 1 && self.is_resource_name(rel.as_os_str()).await {
            // An AWCP export is a directory of links, one per resource, to the real source
            // directories: the workspace is what they point to. Only a top-level link to a
            // directory by absolute path counts; anything else stays a link.
            if let Ok(target) = self.remote.readlink(path).await {
                if target.is_absolute() {
                    if let (Ok(real), Ok(a)) = (
                        self.remote.realpath(path).await,
                        self.remote.stat(path).await,
                    ) {
                        if a.file_type() == FileKind::Dir {
                            let name = rel.as_os_str().to_os_string();
                            self.resource_links.lock().unwrap().insert(name, real);
                            return Ok(a);
                        }
                    }
                }
            }
        }
        let follow = self.config.lock().unwrap().follow_symlinks;
        match self.enforcer.symlinks() {
            _ if !follow => Ok(attrs),
            SymlinkMode::Deny => Ok(attrs),
            // The server resolves the link: it must still land inside the workspace, or the
            // link is shown as a link (whose readlink is refused).
            SymlinkMode::Contain if !self.server_contains(path).await => Ok(attrs),
            // A dangling link stays visible as a link.
            _ => Ok(self.remote.stat(path).await.unwrap_or(attrs)),
        }
    }

    /// Whether the top-level `name` may be an AWCP resource link.
    async fn is_resource_name(&self, name: &OsStr) -> bool {
        let resources = self
            .awcp_export
            .get_or_init(|| async {
                let manifest = self.root.join(".awcp/manifest.json");
                let text = self.read_small_file(&manifest).await?;
                Some(manifest_resource_names(&text))
            })
            .await;
        match resources {
            None => false,
            Some(names) if names.is_empty() => true,
            Some(names) => names.iter().any(|n| n == name),
        }
    }

    /// Whether the top-level `name` may be a resource link, without asking (unknown: yes).
    fn maybe_resource(&self, name: &OsStr) -> bool {
        match self.awcp_export.get() {
            None => true,
            Some(None) => false,
            Some(Some(names)) => names.is_empty() || names.iter().any(|n| n == name),
        }
    }

    /// Read a small file whole (at most 1 MiB), or None.
    async fn read_small_file(&self, path: &Path) -> Option<Vec<u8>> {
        let h = self
            .remote
            .open(path, OpenFlags::read_only(), 0)
            .await
            .ok()?;
        let mut out = Vec::new();
        let max = self.remote.limits().max_read.max(4096);
        while out.len() < 1 << 20 {
            match self.remote.read(&h, out.len() as u64, max).await {
                Ok(b) if !b.is_empty() => out.extend_from_slice(&b),
                _ => break,
            }
        }
        let _ = self.remote.close(&h).await;
        Some(out)
    }

    /// The containment root of a server path: the resource link's target for paths below
    /// one, else the export root.
    fn containment_root(&self, path: &Path) -> (PathBuf, PathBuf) {
        let rel = path.strip_prefix(&self.root).unwrap_or(path).to_path_buf();
        let mut comps = rel.components();
        if let Some(first) = comps.next() {
            let links = self.resource_links.lock().unwrap();
            if let Some(real) = links.get(first.as_os_str()) {
                return (real.clone(), comps.as_path().to_path_buf());
            }
        }
        (self.root.clone(), rel)
    }

    /// Whether the server resolves `path` (following every link) to inside its workspace.
    async fn server_contains(&self, path: &Path) -> bool {
        let (root, _) = self.containment_root(path);
        match self.remote.realpath(path).await {
            Ok(real) => real.starts_with(&root),
            Err(_) => false,
        }
    }

    /// Whether the server still resolves directory `dir` (an inode the kernel holds as one:
    /// a process's cwd or dirfd may keep it past every TTL) to inside the workspace, before
    /// paths under it are sent: someone on the server may have swapped it, or a directory
    /// above it, for a symlink leading outside (see `resolved_dirs`). Asked at most once per
    /// attribute TTL per directory; not under `symlinks = "allow"`.
    async fn dir_inside(&self, dir: Ino) -> FsResult<()> {
        match self.path_of(dir) {
            Ok(path) => self.resolves_inside(&path).await,
            // Removed: nothing is sent by its path.
            Err(_) => Ok(()),
        }
    }

    /// [`Fs::dir_inside`] for the directory holding `ino` (the root for the root), which
    /// the server walks through when it is asked about `ino` by path.
    async fn parent_inside(&self, ino: Ino) -> FsResult<()> {
        let Ok(path) = self.path_of(ino) else {
            return Ok(());
        };
        match path.parent() {
            Some(parent) if path != self.root => self.resolves_inside(parent).await,
            _ => self.resolves_inside(&path).await,
        }
    }

    async fn resolves_inside(&self, dir: &Path) -> FsResult<()> {
        if self.enforcer.symlinks() == SymlinkMode::Allow {
            return Ok(());
        }
        let ttl = self.cache_config().attr_ttl;
        if self.resolved_dirs.fresh(dir, ttl) {
            return Ok(());
        }
        let asked = Instant::now();
        match self.remote.realpath(dir).await {
            Ok(real) => {
                let (root, _) = self.containment_root(dir);
                if real.starts_with(&root) {
                    self.resolved_dirs.resolved(dir, asked);
                    return Ok(());
                }
                tracing::warn!(
                    dir = %dir.display(),
                    resolves_to = %real.display(),
                    "a directory now resolves outside the workspace on the server; refused"
                );
                Err(FsError::new(
                    libc::EACCES,
                    format!(
                        "{}: the server now resolves this directory to {}, outside the \
                         workspace (replaced by a symlink?); refused by the symlink policy",
                        dir.display(),
                        real.display()
                    ),
                ))
            }
            // Nothing there, so nothing outside either: the operation finds it missing.
            Err(RemoteError::Status(Status::NoSuchFile, _)) => Ok(()),
            Err(e) => Err(remote_err(
                Op::Lookup,
                &e,
                format!("realpath {}", dir.display()),
            )),
        }
    }

    /// Apply the symlink mode to a link at `path` with `target`.
    fn check_symlink(&self, path: &Path, target: &Path) -> FsResult<()> {
        match self.enforcer.symlinks() {
            SymlinkMode::Allow => Ok(()),
            SymlinkMode::Deny => Err(FsError::new(
                libc::EPERM,
                format!("{}: symlinks are denied by policy", path.display()),
            )),
            SymlinkMode::Contain => {
                let (_, rel) = self.containment_root(path);
                containment::check_target(&rel, target).map_err(|why| {
                    FsError::new(
                        libc::EPERM,
                        format!(
                            "{} -> {}: {why}; refused by the symlink policy (contain)",
                            path.display(),
                            target.display()
                        ),
                    )
                })
            }
        }
    }

    /// What is at `path` now, for errno inference (None if nothing or unknowable).
    async fn probe_kind(&self, path: &Path) -> Option<FileKind> {
        self.remote.lstat(path).await.ok().map(|a| a.file_type())
    }

    /// Turn a remote failure of `op` into the errno a local disk would give, asking the
    /// server follow-up questions when the status is the generic `FAILURE`.
    async fn explain(
        &self,
        op: Op,
        err: RemoteError,
        target: &Path,
        source: Option<&Path>,
    ) -> FsError {
        self.stats.remote_errors.fetch_add(1, Ordering::Relaxed);
        if let Some(Status::BadMessage) = err.status() {
            if errno::path_too_long(target) || source.is_some_and(errno::path_too_long) {
                return FsError::new(
                    libc::ENAMETOOLONG,
                    format!("{}: name too long", target.display()),
                );
            }
        }
        if let Some(errno) = errno::direct(&err, op) {
            // NO_SUCH_FILE also covers ENOTDIR: the target, or a path component, is not a
            // directory where one is needed.
            if errno == libc::ENOENT {
                let target_kind = self.probe_kind(target).await;
                let not_dir = target_kind.is_some_and(|k| k != FileKind::Dir);
                let needs_dir = match op {
                    Op::Rmdir | Op::Readdir => true,
                    Op::Rename => match source {
                        Some(src) => self.probe_kind(src).await == Some(FileKind::Dir),
                        None => false,
                    },
                    _ => false,
                };
                if not_dir && needs_dir {
                    return not_a_directory(target);
                }
                if let Some(parent) = target.parent() {
                    if let Some(kind) = self.probe_kind(parent).await {
                        if kind != FileKind::Dir && kind != FileKind::Symlink {
                            return not_a_directory(parent);
                        }
                    }
                }
            }
            // EPERM and EACCES are both PERMISSION_DENIED; link(2) of a directory is EPERM.
            if errno == libc::EACCES && op == Op::Link {
                if let Some(src) = source {
                    if self.probe_kind(src).await == Some(FileKind::Dir) {
                        return FsError::new(
                            libc::EPERM,
                            format!("{}: cannot hard-link a directory", src.display()),
                        );
                    }
                }
            }
            return FsError::new(errno, format!("{op:?} {}: {err}", target.display()));
        }
        let mut found = Inference {
            target: self.probe_kind(target).await,
            ..Default::default()
        };
        if let Some(src) = source {
            found.source = self.probe_kind(src).await;
            if let (Some(a), Some(b)) = (src.parent(), target.parent()) {
                if let (Ok(x), Ok(y)) = (self.remote.statvfs(a).await, self.remote.statvfs(b).await)
                {
                    found.cross_device = x.fsid != y.fsid;
                }
            }
        }
        if found.target == Some(FileKind::Dir) && matches!(op, Op::Rmdir | Op::Rename) {
            found.target_not_empty =
                matches!(self.remote.read_dir(target).await, Ok(l) if !l.is_empty());
        }
        if let Ok(v) = self.remote.statvfs(&self.root).await {
            found.no_space = v.bavail == 0 || v.favail == 0;
            found.read_only_fs = v.flag & 1 != 0; // ST_RDONLY
        }
        let errno = errno::infer(op, &found);
        FsError::new(errno, format!("{op:?} {}: {err}", target.display()))
    }

    /// [`Fs::explain`] for a write or truncate that would end at byte `end`. A plain
    /// `FAILURE` there, with the end past the size of the whole server filesystem, is the
    /// server's EFBIG: no filesystem fails that for want of space (that is `ENOSPC`, found
    /// first) but one whose largest file is smaller does.
    async fn explain_sized(&self, op: Op, err: RemoteError, path: &Path, end: u64) -> FsError {
        let generic = err.status() == Some(Status::Failure);
        let mut e = self.explain(op, err, path, None).await;
        if generic && e.errno == libc::EIO {
            if let Ok(v) = self.remote.statvfs(&self.root).await {
                if end > v.blocks.saturating_mul(v.frsize.max(1)) {
                    e.errno = libc::EFBIG;
                    e.context = format!("{}: file too large ({})", path.display(), e.context);
                }
            }
        }
        e
    }

    /// Remote attributes of an inode, through the cache.
    async fn fetch_attrs(&self, ino: Ino) -> FsResult<CachedAttrs> {
        if let Some(a) = self.cache.lock().unwrap().get_attrs(ino) {
            return Ok(a);
        }
        let path = self.path_of(ino)?;
        let since = self.cache.lock().unwrap().now();
        // An inode keeps the kind it was first shown with (the kernel refuses a change of
        // type and marks the inode bad): one made as a link is the link, never followed.
        let kind = self.inodes.lock().unwrap().kind(ino);
        match self.stat_as(&path, kind).await {
            Ok(attrs) if kind.is_some_and(|k| k != attrs.file_type()) => {
                // Replaced by an object of another type, or a followed link that no longer
                // resolves: not what this inode stands for. ESTALE makes the kernel look the
                // name up again (a new inode) for path-based calls.
                Err(FsError::new(
                    libc::ESTALE,
                    format!(
                        "{}: now a {:?}, inode {ino} was a {:?}",
                        path.display(),
                        attrs.file_type(),
                        kind.unwrap_or(FileKind::File)
                    ),
                ))
            }
            Ok(attrs) => {
                let cached = CachedAttrs { attrs, nlink: None };
                self.cache_attrs_from(ino, cached, since);
                Ok(cached)
            }
            Err(e) => Err(self.explain(Op::Getattr, e, &path, None).await),
        }
    }

    /// Cache attributes fetched when the change clock read `since`, unless the inode changed
    /// through the mount meanwhile (then they may predate that change) or has writes in flight.
    /// They also fill its names' listing entries left unknown by a change (see
    /// [`MetaCache::listing_fill`]).
    /// Returns whether they were kept.
    fn cache_attrs_from(&self, ino: Ino, attrs: CachedAttrs, since: u64) -> bool {
        self.cache_attrs_checked(ino, attrs, since, true)
    }

    /// [`Fs::cache_attrs_from`]; `landings`: whether writes answered since `since` make the
    /// attributes suspect (not for an answer known to come after them, `attrs_behind_writes`).
    fn cache_attrs_checked(
        &self,
        ino: Ino,
        attrs: CachedAttrs,
        since: u64,
        landings: bool,
    ) -> bool {
        if !self.writers_of(ino).is_empty() {
            return false;
        }
        let names = {
            let mut inodes = self.inodes.lock().unwrap();
            inodes.note_if_shared(ino);
            inodes.names_of(ino)
        };
        let mut cache = self.cache.lock().unwrap();
        if cache.changed_since(ino, since) || (landings && cache.landed_since(ino, since)) {
            return false;
        }
        cache.put_attrs(ino, attrs);
        for (parent, name) in names {
            cache.listing_fill(parent, &name, attrs.attrs);
        }
        true
    }

    /// [`Fs::attrs_changed`] by a change of the mount after which the server showed `attrs`,
    /// asked when the change clock read `since`: they are kept as the new attributes only if
    /// nothing else changed `ino` through the mount since (checked and kept in one step).
    /// Returns whether they were.
    fn attrs_changed_as_of(&self, ino: Ino, attrs: Attrs, since: u64) -> bool {
        self.record_change(ino, Some(attrs), Some(since))
    }

    /// `ino`'s data or attributes changed through the mount: cached attributes of it are
    /// stale, wherever they are (attribute cache, its parent's listing). `known`: the new
    /// attributes, when we have them.
    fn attrs_changed(&self, ino: Ino, known: Option<Attrs>) {
        self.record_change(ino, known, None);
    }

    /// [`Fs::attrs_changed`], keeping `known` only if `ino` did not change through the mount
    /// after the clock read `since` (when given; checked and kept under one lock). Returns
    /// whether `known` was kept.
    fn record_change(&self, ino: Ino, known: Option<Attrs>, since: Option<u64>) -> bool {
        self.shared_data_changed(ino);
        let names = {
            let mut inodes = self.inodes.lock().unwrap();
            if known.is_some() {
                inodes.note_if_shared(ino);
            }
            inodes.names_of(ino)
        };
        // Every name of it (hard links made through the mount are one inode).
        let mut cache = self.cache.lock().unwrap();
        let known = known.filter(|_| since.is_none_or(|s| !cache.changed_since(ino, s)));
        cache.attrs_changed(ino, &names, known);
        known.is_some()
    }

    /// A name in directory `dir` was made, removed or replaced through the mount: the server
    /// moved its mtime, and its ctime moves here (see `Attr::ctime`). A cached listing that
    /// shows `dir` (in its parent) shows its mtime moved to now: a lookup answered from it
    /// would otherwise give the kernel the old mtime (Python's import finder rescans a
    /// directory only when that changes; `find -newer`, make).
    fn dir_names_changed(&self, dir: Ino) {
        let now = SystemTime::now();
        let names = {
            let mut inodes = self.inodes.lock().unwrap();
            inodes.status_changed(dir, now);
            inodes.names_of(dir)
        };
        let mut cache = self.cache.lock().unwrap();
        for (parent, name) in names {
            cache.listing_dir_touched(parent, &name, to_seconds(TimeSpec::At(now)));
        }
    }

    /// A create or remove in directory `dir` answered early was carried out by the server,
    /// which moved the directory's mtime then: attributes of it asked for before are not
    /// kept (nor cached on their way), nor shown from its parent's listing.
    fn dir_landed(&self, dir: Ino) {
        self.cache.lock().unwrap().touch(dir);
        self.dir_names_changed(dir);
    }

    /// The mount changed the status of `ino` just now: its ctime moves (see `Attr::ctime`).
    fn status_changed(&self, ino: Ino) {
        self.inodes
            .lock()
            .unwrap()
            .status_changed(ino, SystemTime::now());
    }

    /// A subdirectory of `dir` came (`+1`) or went (`-1`) through the mount: its link count
    /// follows, in the inode table and in the cached listing that shows `dir` (a lookup
    /// answered from that listing would otherwise take the count from before the change).
    fn subdirs_changed(&self, dir: Ino, delta: i32) {
        let change = subdirs_changed_in(&mut self.inodes.lock().unwrap(), dir, delta);
        self.listings_follow_subdirs(&[change]);
    }

    /// The link count of file `ino` changed through the mount (a name of it linked, unlinked
    /// or renamed over): the cached listings showing its other names take the table's count.
    fn link_count_changed(&self, ino: Ino) {
        let (known, names) = {
            let inodes = self.inodes.lock().unwrap();
            (inodes.known_nlink(ino), inodes.names_of(ino))
        };
        let mut cache = self.cache.lock().unwrap();
        for (parent, name) in names {
            cache.listing_nlink(parent, &name, known);
        }
    }

    /// The cached listings that show the directories of `changes` take their new counts.
    fn listings_follow_subdirs(&self, changes: &[SubdirsChanged]) {
        let mut cache = self.cache.lock().unwrap();
        for c in changes {
            for (parent, name) in &c.names {
                cache.listing_subdirs_changed(*parent, name, c.known, c.delta);
            }
        }
    }

    /// The mount changed the data of `ino` (written, truncated, copied into): see
    /// [`InodeTable::data_changed`].
    fn data_changed(&self, ino: Ino) {
        self.inodes
            .lock()
            .unwrap()
            .data_changed(ino, SystemTime::now());
    }

    /// A setattr of `ino` was made: its status changed, its data too if `resized`, and the
    /// times it set are remembered as asked (see [`InodeTable::times_set`]; `data_changes`
    /// read before it was sent, or `None` for a setattr not sent yet, which nothing can
    /// overtake: the count is read here, under the same lock).
    fn attributes_set(&self, ino: Ino, resized: bool, data_changes: Option<u64>, times: SetTimes) {
        let mut inodes = self.inodes.lock().unwrap();
        let data_changes = data_changes.unwrap_or_else(|| inodes.data_changes(ino));
        match resized {
            true => inodes.data_changed(ino, SystemTime::now()),
            false => inodes.status_changed(ino, SystemTime::now()),
        }
        inodes.times_set(ino, data_changes + u64::from(resized), times);
    }

    /// Register an inode for `name` in `parent` with attributes learnt when the change clock
    /// read `since`. Attributes the mount changed since then are not trusted: the cached ones
    /// (from our own change) are shown, or the size still being written.
    fn remember(
        &self,
        parent: Ino,
        name: &OsStr,
        attrs: Attrs,
        mut nlink: Option<u32>,
        since: u64,
    ) -> Attr {
        let ino = self
            .inodes
            .lock()
            .unwrap()
            .lookup(parent, name, attrs.file_type());
        if attrs.file_type() == FileKind::Dir {
            self.adopt_listing_ahead(ino);
            // (Only where directories are checked: see `resolves_inside`.)
            if self.enforcer.symlinks() != SymlinkMode::Allow {
                if let Ok(dir) = self.path_of(parent) {
                    self.resolved_dirs.inherit(&dir, &dir.join(name));
                }
            }
        }
        let (attrs, changed, landed) = {
            let mut cache = self.cache.lock().unwrap();
            let landed = cache.landed_since(ino, since);
            // (A count that may include a name being unlinked counts as changed here.)
            if nlink.is_some() && cache.link_count_suspect(ino, since) {
                nlink = None;
            }
            if cache.changed_since(ino, since) {
                (
                    cache.get_attrs(ino).map(|c| c.attrs).unwrap_or(attrs),
                    true,
                    landed,
                )
            } else {
                (attrs, false, landed)
            }
        };
        if let (Some(n), false) = (nlink, changed) {
            // The server's link count (a listing's long name), unless a link or unlink
            // through the mount came after the listing was taken.
            self.inodes.lock().unwrap().set_nlink(ino, n);
        }
        // A write landed after the answer was asked for: the answer may predate it (and
        // it is no longer pending), so the size is at least what was written.
        let attrs = if landed {
            self.with_written_size(ino, attrs, |_| true)
        } else {
            self.with_pending_size(ino, attrs)
        };
        if let (FileKind::File, Some(size)) = (attrs.file_type(), attrs.size) {
            self.enforcer.quota.observe(ino, size);
        }
        self.cache_attrs_from(ino, CachedAttrs { attrs, nlink }, since);
        self.make_attr(ino, &attrs, nlink)
    }

    // ---------------------------------------------------------------- namespace

    /// Look `name` up in `parent`. A directory found is listed in the background (as a
    /// readdirplus entry is): a path walk (`git status` stats every file of its index, in path
    /// order) then finds the next level's listing on its way instead of asking name by name.
    pub async fn lookup(self: &Arc<Self>, parent: Ino, name: &OsStr) -> FsResult<Entry> {
        // (Together: the check costs no round trip of its own; an answer from outside is
        // dropped.)
        let (inside, entry) = tokio::join!(self.dir_inside(parent), self.lookup_name(parent, name));
        if let Err(e) = inside {
            // The kernel gets no entry: the lookup the answer counted is given back.
            if let Ok(entry) = &entry {
                self.forget(entry.attr.ino, 1);
            }
            return Err(e);
        }
        let entry = entry?;
        if entry.attr.kind == FileKind::Dir {
            self.prefetch_dir(entry.attr.ino);
        }
        Ok(entry)
    }

    /// After a lookup found `name` absent from `parent`: how long the kernel may remember
    /// that (a negative dentry) without asking again. As long as this mount's own caches would
    /// answer the same, and no longer: the kernel sees the mount's own creates itself (they
    /// go through it), and a name made on the server shows within the negative TTL as
    /// before. Zero: the kernel must ask every time (nothing cached, or `negative_ttl = 0`).
    pub fn absence_ttl(&self, parent: Ino, name: &OsStr) -> Duration {
        self.cache
            .lock()
            .unwrap()
            .absent_for(parent, name)
            .unwrap_or(Duration::ZERO)
    }

    async fn lookup_name(self: &Arc<Self>, parent: Ino, name: &OsStr) -> FsResult<Entry> {
        // A create of this name answered early: the server has the file, and its attributes
        // are the server's, once its OPEN is answered.
        self.creates_behind.name_settled(parent, name).await;
        // A mode or times queued behind the writes of the file the name has (`cp -p` sets
        // them through its descriptor before the close): the kernel takes a lookup's
        // attributes over those the chmod or utimens was answered with, so an answer from
        // before they land would undo them there. They are waited for (rare: a lookup of a
        // file while its copy is finished).
        let known = self.inodes.lock().unwrap().child(parent, name);
        if let Some(ino) = known {
            self.changes_behind_settled(ino).await;
        }
        let path = self.child_path(parent, name)?;
        if let Some(attr) = self.special_at(&path, true) {
            return Ok(self.entry(attr));
        }
        // A name the kernel knows as a symlink stays one while it holds the inode (it made
        // it with symlink(2), or saw it unfollowed): follow_symlinks and resource links apply
        // to names seen for the first time.
        let held_kind = {
            let inodes = self.inodes.lock().unwrap();
            inodes.child(parent, name).and_then(|i| inodes.kind(i))
        };
        let follow = self.config.lock().unwrap().follow_symlinks;
        // A listing entry answers the lookup when its attributes are known (an unknown size
        // means it changed through the mount) and it is not a link to follow first.
        let listing_answers = |e: &DirEntry| {
            e.attrs.size.is_some()
                && !(e.attrs.file_type() == FileKind::Symlink
                    && held_kind != Some(FileKind::Symlink)
                    && (follow || (parent == ROOT_INO && self.maybe_resource(name))))
        };
        // The link count a listing gave for an entry that could not answer (its attributes
        // changed through the mount): the server's stat has none, and a file hard-linked on
        // the server must stay known as one (see `shared_data_changed`).
        let mut listed_nlink = None;
        let since = {
            let mut cache = self.cache.lock().unwrap();
            let since = cache.now();
            if cache.is_negative(parent, name) {
                drop(cache);
                self.name_gone(parent, name);
                return Err(FsError::new(
                    libc::ENOENT,
                    format!("{}: no such file (cached)", path.display()),
                ));
            }
            match cache.lookup_in_dir(parent, name) {
                Some(Some(e)) if listing_answers(&e) => {
                    let taken = cache.listing_taken(parent);
                    drop(cache);
                    let attr = self.remember(parent, name, e.attrs, e.nlink, since);
                    return Ok(self.entry_from_listing(attr, taken));
                }
                Some(None) => {
                    drop(cache);
                    self.name_gone(parent, name);
                    return Err(FsError::new(
                        libc::ENOENT,
                        format!("{}: not in listing", path.display()),
                    ));
                }
                Some(Some(e)) => listed_nlink = e.nlink,
                None => {}
            }
            since
        };
        // A listing on its way (prefetched) answers sooner than a stat sent now.
        let listing_coming = self
            .listings_in_flight
            .lock()
            .unwrap()
            .contains_key(&parent)
            || path.parent().is_some_and(|p| self.walk.listing_coming(p));
        if listing_coming || self.lookups_warrant_listing(parent) {
            // A listing asked for before a name of `parent` changed through the mount (one
            // joined on its way) may predate the change: then the server is asked.
            let shared = self
                .list_dir_shared(parent)
                .await
                .filter(|(_, listed)| !self.cache.lock().unwrap().changed_since(parent, *listed));
            if let Some((listing, listed)) = shared {
                let since = since.min(listed);
                match listing.iter().find(|e| e.name == name) {
                    // (Unless the name was created meanwhile: then the server is asked.)
                    None if self.put_negative_since(parent, name, since) => {
                        self.name_gone(parent, name);
                        return Err(FsError::new(
                            libc::ENOENT,
                            format!("{}: not in listing", path.display()),
                        ));
                    }
                    Some(e) if listing_answers(e) => {
                        let taken = self.cache.lock().unwrap().listing_taken(parent);
                        let attr = self.remember(parent, name, e.attrs, e.nlink, since);
                        return Ok(self.entry_from_listing(attr, taken));
                    }
                    Some(e) => listed_nlink = e.nlink,
                    _ => {}
                }
            }
        }
        // An unlink of this name answered early: the server's answer must not predate it.
        self.removes_behind.name_settled(parent, name).await;
        match self.stat_as(&path, held_kind).await {
            Ok(attrs) => {
                // (A directory's too: a listing's count follows its subdirectories made and
                // removed through the mount.)
                let nlink = listed_nlink
                    .filter(|_| matches!(attrs.file_type(), FileKind::File | FileKind::Dir));
                Ok(self.entry(self.remember(parent, name, attrs, nlink, since)))
            }
            Err(RemoteError::Status(Status::NoSuchFile, _)) => {
                self.put_negative_since(parent, name, since);
                self.name_gone(parent, name);
                Err(FsError::new(
                    libc::ENOENT,
                    format!("{}: no such file", path.display()),
                ))
            }
            Err(e) => Err(self.explain(Op::Lookup, e, &path, None).await),
        }
    }

    /// Remember that `name` is not in `parent`, as learnt from an answer asked for when the
    /// change clock read `since`, unless a name in `parent` changed through the mount since
    /// (the answer may predate the mount's own create). Returns whether it was remembered.
    fn put_negative_since(&self, parent: Ino, name: &OsStr, since: u64) -> bool {
        let mut cache = self.cache.lock().unwrap();
        let fresh = !cache.changed_since(parent, since);
        if fresh {
            cache.put_negative(parent, name);
        }
        fresh
    }

    /// A lookup found no `name` in `parent`: if the kernel still had an inode for it (a file
    /// another client removed on the server, held open here), that inode no longer has the
    /// name, and a file made by it later is another inode (else the old descriptor would
    /// share the new file's kernel inode, its size and its pages).
    fn name_gone(&self, parent: Ino, name: &OsStr) {
        self.inodes.lock().unwrap().detach_name(parent, name);
    }

    pub fn forget(&self, ino: Ino, nlookup: u64) {
        if self.forget_special(ino, nlookup) {
            return;
        }
        let mut inodes = self.inodes.lock().unwrap();
        inodes.forget(ino, nlookup);
        if !inodes.contains(ino) {
            self.cache.lock().unwrap().forget_inode(ino);
            if self.any_open_file(ino).is_none() {
                self.enforcer.quota.forget(ino);
                self.early_write_back.forget(ino);
            }
        }
    }

    pub async fn getattr(
        self: &Arc<Self>,
        ino: Ino,
        fh: Option<u64>,
    ) -> FsResult<(Attr, Duration)> {
        let ttl = self.attr_ttl_for(ino);
        if let Some(attr) = self.special_attr(ino) {
            return Ok((attr, ttl));
        }
        let mut file = fh.and_then(|fh| self.files.lock().unwrap().get(&fh).cloned());
        if file.is_none() && self.path_of(ino).is_err() {
            // fstat(2) reaches us without a file handle; an unlinked file that is still open
            // can only be asked through one of its handles.
            file = self.any_open_file(ino);
            if let (None, Some(snap)) = (&file, fh.and_then(|fh| self.snapshot(fh))) {
                // Open from a snapshot (no server handle): it shows what was read.
                return Ok((self.make_attr(ino, &snap.attrs, Some(0)), ttl));
            }
        }
        // A file being written through the one descriptor that created it: known here.
        // (TTL 0: once the descriptor is gone, the server is asked.)
        let sole = self
            .sole_open_file(ino)
            .filter(|sole| file.as_ref().is_none_or(|f| Arc::ptr_eq(f, sole)));
        if let Some(sole) = sole {
            // Created early: what the server gave it (its times, owner) comes with the
            // OPEN's answer, which is all this waits for (not the writes behind it, nor a
            // round trip of its own); the handle slot is held until then (at once otherwise).
            let _ = sole.handle_version().await;
            if let Some(attrs) = sole.attrs_while_writing() {
                return Ok((self.make_attr(ino, &attrs, None), Duration::ZERO));
            }
        }
        if let Some(file) = file {
            // An open file is asked through its handle: that works after unlink, too. Writes
            // still in flight land first, so the size shown includes them.
            self.ready_behind_writes(&file).await;
            let remote = &self.remote;
            let since = self.cache.lock().unwrap().now();
            let fstat = self
                .with_handle(&file, |h| async move { remote.fstat(&h).await })
                .await;
            return match fstat {
                Ok(attrs) => {
                    let attrs = self.with_pending_size(ino, attrs);
                    // Kept on the usual terms: not if the file changed through the mount
                    // while the FSTAT was on its way (its answer may predate the change).
                    self.cache_attrs_from(ino, CachedAttrs { attrs, nlink: None }, since);
                    Ok((self.make_attr(ino, &attrs, None), ttl))
                }
                Err(RemoteError::StaleHandle) => {
                    let a = self.fetch_attrs(ino).await?;
                    Ok((self.make_attr(ino, &a.attrs, a.nlink), ttl))
                }
                Err(e) => Err(remote_err(Op::Getattr, &e, "fstat")),
            };
        }
        self.create_landed(ino).await;
        self.drain_inode(ino).await;
        // A directory's mtime moves as the creates and removes in it answered early are
        // carried out: while one is on its way, what the server says may be from before it,
        // and the kernel must ask again (not waited for: with `default_permissions` the
        // kernel asks before every unlink of `rm -rf`, which would then wait for the one
        // before). Whatever was asked before a landing is not kept (`Fs::dir_landed`).
        let landing = self.inodes.lock().unwrap().kind(ino) == Some(FileKind::Dir)
            && (self.creates_behind.in_dir(ino) || self.removes_behind.in_dir(ino));
        let a = self.fetch_attrs(ino).await?;
        let mut attrs = self.with_pending_size(ino, a.attrs);
        if landing {
            // The server's mtime may be from before a name change the mount has answered
            // (`unlink; stat .` must see the mtime move): not older than that change, in
            // whole seconds as the server's own, until the server has carried it out.
            let changed = self.inodes.lock().unwrap().last_status_change(ino);
            if let Some(changed) = changed {
                let changed = to_seconds(TimeSpec::At(changed));
                attrs.mtime = Some(attrs.mtime.map_or(changed, |m| m.max(changed)));
            }
        }
        // (Maybe from the cache: then for what its copy has left.)
        let ttl = match landing {
            true => Duration::ZERO,
            false => self.kernel_attr_ttl(ino),
        };
        Ok((self.make_attr(ino, &attrs, a.nlink), ttl))
    }

    /// The open descriptor of `ino` if it has exactly one.
    fn sole_open_file(&self, ino: Ino) -> Option<Arc<OpenFile<R>>> {
        let files = self.files.lock().unwrap();
        let mut of_ino = files.values().filter(|f| f.ino == ino);
        match (of_ino.next(), of_ino.next()) {
            (Some(f), None) => Some(f.clone()),
            _ => None,
        }
    }

    fn any_open_file(&self, ino: Ino) -> Option<Arc<OpenFile<R>>> {
        self.files
            .lock()
            .unwrap()
            .values()
            .find(|f| f.ino == ino)
            .cloned()
    }

    /// `ino` was changed other than by writes and changes behind them: descriptors that
    /// created it no longer know its attributes (see `setattr_behind`).
    fn forget_created(&self, ino: Ino) {
        for f in self.files.lock().unwrap().values().filter(|f| f.ino == ino) {
            f.update_created(None);
        }
    }

    /// Files of `ino` with writes not yet answered.
    fn writers_of(&self, ino: Ino) -> Vec<Arc<OpenFile<R>>> {
        self.files
            .lock()
            .unwrap()
            .values()
            .filter(|f| f.ino == ino && f.writes_pending())
            .cloned()
            .collect()
    }

    /// Wait for writes in flight on any handle of `ino` (errors stay latched for flush). All
    /// descriptors of a file share one ordered write stream, so one barrier drains them all.
    async fn drain_inode(self: &Arc<Self>, ino: Ino) {
        if let Some(f) = self.writers_of(ino).into_iter().next() {
            f.settle().await;
        }
    }

    /// Wait for the writes of `ino` if an attribute change is queued behind them (see
    /// [`OpenFile::changes_queued_behind`]).
    async fn changes_behind_settled(&self, ino: Ino) {
        let behind = self
            .writers_of(ino)
            .into_iter()
            .find(|f| f.changes_queued_behind());
        if let Some(f) = behind {
            f.settle().await;
        }
    }

    /// Before a request through `file`'s handle that must see every write of the file so
    /// far (a read, an fstat): wait for the writes' answers, unless the request is carried
    /// out after them anyway, which is when they all went through this same handle
    /// ([`OpenFile::writes_ahead_on_own_handle`]) and no other descriptor of the file is
    /// open to have put any elsewhere. A linker reading back the file it writes, a database
    /// reading the pages it just wrote, then wait one round trip per read, not two.
    async fn ready_behind_writes(self: &Arc<Self>, file: &Arc<OpenFile<R>>) {
        if file.writes_pending() && !self.goes_behind_writes(file) {
            self.drain_inode(file.ino).await;
        }
    }

    /// Whether a request sent through `file`'s handle now is carried out after every write
    /// of the file so far (see [`Fs::ready_behind_writes`]).
    fn goes_behind_writes(&self, file: &OpenFile<R>) -> bool {
        let alone = {
            let files = self.files.lock().unwrap();
            files.values().filter(|f| f.ino == file.ino).count() == 1
        };
        alone && file.writes_ahead_on_own_handle()
    }

    /// A write of `ino` was answered by the server. An answer about `ino` asked for before
    /// (a stat, a listing) may predate it, and it is no longer pending: such an answer is
    /// not cached, and its size is taken as at least what was written (see `remember`).
    pub(crate) fn write_landed(&self, ino: Ino) {
        self.cache.lock().unwrap().write_landed(ino);
    }

    /// The server may not have seen every write yet: never show a size below what was written.
    fn with_pending_size(&self, ino: Ino, attrs: Attrs) -> Attrs {
        self.with_written_size(ino, attrs, |f| f.writes_pending())
    }

    /// `attrs` with a size no lower than the end of what each open descriptor of `ino` that
    /// `counts` wrote.
    fn with_written_size(
        &self,
        ino: Ino,
        mut attrs: Attrs,
        counts: impl Fn(&OpenFile<R>) -> bool,
    ) -> Attrs {
        let files = self.files.lock().unwrap();
        for f in files.values().filter(|f| f.ino == ino && counts(f)) {
            let end = f.written_end.load(Ordering::Relaxed);
            if attrs.size.is_some_and(|s| s < end) {
                attrs.size = Some(end);
            }
        }
        attrs
    }

    /// Change attributes of `ino` (to be kept by the kernel for [`Fs::attr_ttl_for`]).
    pub async fn setattr(
        self: &Arc<Self>,
        ino: Ino,
        fh: Option<u64>,
        req: SetattrRequest,
    ) -> FsResult<Attr> {
        let truncate = req.size.is_some();
        self.parent_inside(ino).await?;
        let attr = self.set_attributes(ino, fh, req).await?;
        // Not for a truncate: the kernel holds off writeback of the file until it is
        // answered, and a notification queued for this very file (by a change through
        // another name) may be waiting for that writeback (dirty pages of a shared
        // mapping): the other names are told all the same, right after.
        if !truncate {
            self.kernel_caches.settled().await;
        }
        Ok(attr)
    }

    async fn set_attributes(
        self: &Arc<Self>,
        ino: Ino,
        fh: Option<u64>,
        req: SetattrRequest,
    ) -> FsResult<Attr> {
        let _mutating = self.check_writable("setattr")?;
        if let Some(done) = self.setattr_special(ino, &req) {
            return done;
        }
        if let Some(size) = req.size.filter(|&s| past_max_offset(s, 0)) {
            return Err(FsError::new(
                libc::EFBIG,
                format!("truncate to {size}: past the largest offset"),
            ));
        }
        let path = self.path_of(ino);
        let file = fh
            .and_then(|fh| self.files.lock().unwrap().get(&fh).cloned())
            .or_else(|| path.is_err().then(|| self.any_open_file(ino)).flatten());
        // futimens and fchmod reach us without the handle (the kernel passes one only for
        // ftruncate): the file's sole open descriptor is the one that may have created it.
        if let Some(f) = file.clone().or_else(|| self.sole_open_file(ino)) {
            if let Some(done) = self.setattr_behind(ino, &f, &req).await {
                return done;
            }
        }
        // By path or another handle: not before the file is there (nor, for a directory,
        // before the files created early in it: a mode or times set could overtake them).
        self.create_landed(ino).await;
        self.creates_behind.dir_settled(ino).await;
        // Changed otherwise: what descriptors that created the file knew of it is stale.
        self.forget_created(ino);
        let (kind, data_changes) = {
            let inodes = self.inodes.lock().unwrap();
            (inodes.kind(ino), inodes.data_changes(ino))
        };
        // Writes in flight must land before a truncate (or they would extend the file again)
        // and before times are set (or they would bump the mtime afterwards).
        self.drain_inode(ino).await;

        let needs_current = (req.uid.is_some() != req.gid.is_some())
            || (req.atime.is_some() != req.mtime.is_some());
        let current = match (&file, needs_current) {
            (_, false) => None,
            // Through the handle: works for an unlinked open file too.
            (Some(f), true) => Some(
                self.fstat_of(f)
                    .await
                    .map_err(|e| remote_err(Op::Getattr, &e, "fstat"))?,
            ),
            (None, true) => {
                self.cache.lock().unwrap().forget_attrs(ino);
                Some(self.fetch_attrs(ino).await?.attrs)
            }
        };
        let mut set = SetAttrs {
            size: req.size,
            perm: req.mode.map(|m| m & 0o7777),
            ..Default::default()
        };
        if req.uid.is_some() || req.gid.is_some() {
            let cur = current.unwrap_or_default();
            set.uid_gid = Some(self.owner_to_send(req.uid, req.gid, &cur));
        }
        let times = times_asked(&req);
        if req.atime.is_some() || req.mtime.is_some() {
            let cur = current.unwrap_or_default();
            let atime = times.atime.map_or(cur.atime.unwrap_or(0), |t| t.sent);
            let mtime = times.mtime.map_or(cur.mtime.unwrap_or(0), |t| t.sent);
            set.atime_mtime = Some((atime, mtime));
        }
        let op = if set.uid_gid.is_some() {
            Op::Chown
        } else {
            Op::Setattr
        };
        // Truncating up is charged to the quota, down gives back.
        let quota = &self.enforcer.quota;
        let resized_from = match req.size {
            Some(size) if quota.is_limited() || quota.knows(ino) => {
                if !quota.knows(ino) {
                    let known = match &file {
                        Some(f) => self.fstat_of(f).await.ok(),
                        None => match &path {
                            Ok(p) => self.remote.lstat(p).await.ok(),
                            Err(_) => None,
                        },
                    };
                    quota.observe(ino, known.and_then(|a| a.size).unwrap_or(0));
                }
                let old = quota.size_of(ino).unwrap_or(0);
                quota.resize(ino, size).map_err(|_| quota_used_up())?;
                Some(old)
            }
            _ => None,
        };

        // Only the mode (without set-id bits), the owner or times changed and we know the
        // rest: the new attributes are known without asking. A size change also moves the
        // mtime: ask then. So do a mode with set-id bits (the server may refuse to set
        // S_ISGID), and a chown of a non-directory that has set-id bits, which Linux clears
        // (tar sets owner, mode and times of every file it extracts: one round trip each).
        let known_now = || {
            let known = if req.size.is_none() && set.perm.is_none_or(|p| p & 0o6000 == 0) {
                current.or_else(|| self.cache.lock().unwrap().get_attrs(ino).map(|c| c.attrs))
            } else {
                None
            };
            known.filter(|a| {
                set.uid_gid.is_none()
                    || a.file_type() == FileKind::Dir
                    || a.mode.is_some_and(|m| m & 0o6000 == 0)
            })
        };
        // Otherwise they are asked right behind the change, in the same round trip (a
        // truncate; times or a mode set on a file whose attributes the mount does not hold,
        // as after writes whose close did not learn them): trusted if no write of the file
        // was on its way and nothing else changed it through the mount meanwhile.
        let ask_along = known_now().is_none();
        let since = self.cache.lock().unwrap().now();
        // A write of another descriptor put on the wire since the drain above may go on
        // another channel than the stat, and land after it: then ask the usual way.
        let busy = !self.writers_of(ino).is_empty();
        let mut along = None;
        if !set.is_empty() {
            let remote = &self.remote;
            let result = match (&file, kind) {
                (Some(f), _) if ask_along => self
                    .with_handle(f, |h| async move { remote.fsetstat_fstat(&h, set).await })
                    .await
                    .map(|a| along = a.ok()),
                (Some(f), _) => {
                    self.with_handle(f, |h| async move { remote.fsetstat(&h, set).await })
                        .await
                }
                (None, Some(FileKind::Symlink)) => {
                    if set.perm.is_some() {
                        // Linux has no permissions on symlinks.
                        return Err(FsError::new(libc::EOPNOTSUPP, "chmod of a symlink"));
                    }
                    remote
                        .lsetstat(path.as_ref().map_err(Clone::clone)?, set)
                        .await
                }
                (None, _) if ask_along => remote
                    .setstat_lstat(path.as_ref().map_err(Clone::clone)?, set)
                    .await
                    .map(|a| along = a.ok()),
                (None, _) => {
                    remote
                        .setstat(path.as_ref().map_err(Clone::clone)?, set)
                        .await
                }
            };
            if let Err(e) = result {
                if let Some(old) = resized_from {
                    quota.unreserve(ino, old);
                }
                let target = path.clone().unwrap_or_else(|_| self.root.clone());
                return Err(match req.size {
                    Some(size) => self.explain_sized(op, e, &target, size).await,
                    None => self.explain(op, e, &target, None).await,
                });
            }
            self.attributes_set(ino, req.size.is_some(), Some(data_changes), times);
        } else {
            // Nothing to send (`chown(f, -1, -1)`): Linux still moves the ctime.
            self.status_changed(ino);
        }
        // What came along shows this change and nothing after it, unless the inode changed
        // through the mount meanwhile (checked as they are kept). By path, only what
        // `fetch_attrs` would take as it is: not a symlink (a followed link's target is asked
        // for), nor another kind of object.
        let along = along.filter(|a| {
            !busy
                && (file.is_some()
                    || (a.file_type() != FileKind::Symlink
                        && kind.is_none_or(|k| k == a.file_type())))
        });
        // Derived from cached attributes (not from what a creating descriptor holds): the
        // rest of them is as old as that copy, and kept no longer than it had left (else each
        // chmod would start the lifetime of a size the server may have changed again).
        let cached_until = match current {
            Some(_) => None,
            None => self
                .cache
                .lock()
                .unwrap()
                .attrs_left(ino)
                .map(|left| Instant::now() + left),
        };
        let known = known_now();
        if let Some(mut attrs) = known {
            self.attrs_changed(ino, None);
            if let Some(p) = set.perm {
                attrs.mode = Some((attrs.mode.unwrap_or(0) & libc::S_IFMT) | p);
            }
            if let Some((u, g)) = set.uid_gid {
                attrs.uid = Some(u);
                attrs.gid = Some(g);
            }
            if let Some((a, m)) = set.atime_mtime {
                attrs.atime = Some(a);
                attrs.mtime = Some(m);
            }
            let attrs = self.with_pending_size(ino, attrs);
            self.attrs_changed(ino, Some(attrs));
            if let Some(until) = cached_until {
                self.cache.lock().unwrap().cap_attrs(ino, until);
            }
            return Ok(self.make_attr(ino, &attrs, None));
        }
        if let Some(size) = req.size {
            self.truncated(ino, size);
        }
        match along {
            Some(attrs) if self.attrs_changed_as_of(ino, attrs, since) => {
                self.stats
                    .setattrs_stat_along
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(self.make_attr(ino, &attrs, None));
            }
            Some(_) => {} // (dropped what was cached, as below)
            None => self.attrs_changed(ino, None),
        }
        if let Some(f) = &file {
            // Kept on the same terms as what comes along: no write of the file on its way
            // (another descriptor's, on another channel, could land after the FSTAT), nothing
            // changed through the mount meanwhile. The answer shows the writes on their way.
            let since = self.cache.lock().unwrap().now();
            let busy = !self.writers_of(ino).is_empty();
            if let Ok(attrs) = self.fstat_of(f).await {
                let attrs = self.with_pending_size(ino, attrs);
                if !busy {
                    self.attrs_changed_as_of(ino, attrs, since);
                }
                return Ok(self.make_attr(ino, &attrs, None));
            }
        }
        let a = self.fetch_attrs(ino).await?;
        Ok(self.make_attr(ino, &a.attrs, a.nlink))
    }

    /// chmod (without set-id bits), utimens and a chown that keeps owner and group, of a file
    /// whose only descriptor created it: queued behind its writes instead of waited for (see
    /// `file`), answered with the attributes they give. None: not such a change, done the
    /// usual way.
    async fn setattr_behind(
        self: &Arc<Self>,
        ino: Ino,
        file: &Arc<OpenFile<R>>,
        req: &SetattrRequest,
    ) -> Option<FsResult<Attr>> {
        let mut attrs = file.created_attrs()?;
        if (req.atime.is_some() || req.mtime.is_some()) && attrs.atime.is_none() {
            // Created early, and the server has not given its times yet: a time not asked
            // for (UTIME_OMIT) is sent as the server has it (SFTP sets both).
            self.create_landed(ino).await;
            attrs = file.created_attrs()?;
        }
        // A chown to the owner and group it has already (tar as root sets them on every file
        // it extracts) changes nothing the server could refuse, when no set-id bit is there
        // for it to clear.
        let same_owner = || {
            let ids = self.owner_to_send(req.uid, req.gid, &attrs);
            (Some(ids.0), Some(ids.1)) == (attrs.uid, attrs.gid)
                && attrs.mode.is_some_and(|m| m & 0o6000 == 0)
        };
        let chown = req.uid.is_some() || req.gid.is_some();
        let only_mode_and_times = req.size.is_none()
            && (!chown || same_owner())
            && req.mode.is_none_or(|m| m & 0o6000 == 0)
            && (chown || req.mode.is_some() || req.atime.is_some() || req.mtime.is_some());
        if !only_mode_and_times || file.pending_failure().is_some() {
            return None;
        }
        let mut set = SetAttrs::default();
        if chown {
            set.uid_gid = attrs.uid.zip(attrs.gid);
        }
        if let Some(m) = req.mode {
            set.perm = Some(m & 0o7777);
            attrs.mode = Some((attrs.mode.unwrap_or(libc::S_IFREG) & libc::S_IFMT) | (m & 0o7777));
        }
        let times = times_asked(req);
        if req.atime.is_some() || req.mtime.is_some() {
            let atime = times.atime.map(|t| t.sent).or(attrs.atime)?;
            let mtime = times.mtime.map(|t| t.sent).or(attrs.mtime)?;
            set.atime_mtime = Some((atime, mtime));
            attrs.atime = Some(atime);
            attrs.mtime = Some(mtime);
        }
        // The answer shows the mtime: it must be known (no write since it was last set).
        attrs.mtime?;
        // Kept before it is sent: its failure (whenever it is answered) forgets them. Writes
        // sent after it through this descriptor land after it (and drop the kept mtime).
        // Only if the descriptor is still the file's only one, checked and kept under the
        // lock under which a second descriptor (or a truncate by path) makes it forget what
        // it knows: else that could come between, and be undone. Queued under it too, so
        // that a release of the descriptor sees it (see `Fs::release`).
        self.attributes_set(ino, false, None, times);
        let queued = {
            let files = self.files.lock().unwrap();
            let mut of_ino = files.values().filter(|f| f.ino == ino);
            let alone =
                matches!((of_ino.next(), of_ino.next()), (Some(f), None) if Arc::ptr_eq(f, file));
            alone && {
                file.update_created(Some(attrs));
                let queued = file.submit_setattrs(self, set);
                if !queued {
                    file.update_created(None);
                }
                queued
            }
        };
        if !queued {
            self.inodes.lock().unwrap().forget_set_times(ino);
            return None;
        }
        let end = file.written_end.load(Ordering::Relaxed);
        let shown = Attrs {
            size: Some(attrs.size.unwrap_or(0).max(end)),
            ..attrs
        };
        // Not cached if it failed already (or a second descriptor came meanwhile).
        if !file.while_created(|| self.attrs_changed(ino, Some(shown))) {
            self.attrs_changed(ino, None);
        }
        Some(Ok(self.make_attr(ino, &shown, None)))
    }

    pub async fn readlink(&self, ino: Ino) -> FsResult<PathBuf> {
        let path = self.path_of(ino)?;
        let target = self.link_target(ino, &path).await?;
        // Checked on every read, not when cached: the policy may have changed meanwhile.
        // And from every name the link has through the mount (hard links of it): the kernel
        // follows the target from whichever it came through, which it does not say.
        self.check_symlink(&path, &target)?;
        for other in self.other_paths_of(ino, &path) {
            self.check_symlink(&other, &target)?;
        }
        Ok(target)
    }

    /// If `ino` (at `from`) is a symlink, the symlink policy for it as a link at `to`, where
    /// a hard link or a rename puts it: `../../x`, contained two levels down, escapes from
    /// the top (on the server too, for the lender's tools). Where it is now need not be
    /// contained: a link made on the server to outside may be moved, only not to where it
    /// escapes. Links inside a directory moved up are not looked for (SECURITY.md): the
    /// kernel still gets only targets checked where it reads them.
    ///
    /// With `follow_symlinks` a link is shown as what it points to, but a rename or a hard
    /// link moves or links the link itself: under `contain`, the server is asked what is at
    /// `from`.
    async fn check_symlink_put_at(&self, ino: Ino, from: &Path, to: &Path) -> FsResult<()> {
        let target = match self.inodes.lock().unwrap().kind(ino) {
            Some(FileKind::Symlink) => None,
            _ if self.follows_links_contained() => Some(()),
            _ => return Ok(()),
        };
        let target = match target {
            None => self.link_target(ino, from).await?,
            Some(()) => match self.remote.lstat(from).await {
                Ok(a) if a.file_type() != FileKind::Symlink => return Ok(()),
                Ok(_) => match self.remote.readlink(from).await {
                    Ok(target) => target,
                    Err(e) => return Err(self.explain(Op::Readlink, e, from, None).await),
                },
                Err(e) => return Err(self.explain(Op::Lookup, e, from, None).await),
            },
        };
        self.check_symlink_made_at(to, &target).await
    }

    /// Whether symlinks are followed on the server (`follow_symlinks`) and contained.
    fn follows_links_contained(&self) -> bool {
        self.enforcer.symlinks() == SymlinkMode::Contain
            && self.config.lock().unwrap().follow_symlinks
    }

    /// [`Fs::check_symlink`] for a link about to be made at `path` on the server. With
    /// `follow_symlinks` a directory reached through a followed link is somewhere else on
    /// the server than its path says (`d/s -> ../..` is the workspace's root there): the
    /// target is checked where the server's REALPATH puts the directory too, or `../x`
    /// made in it would lead the lender's tools out of the workspace.
    async fn check_symlink_made_at(&self, path: &Path, target: &Path) -> FsResult<()> {
        self.check_symlink(path, target)?;
        if !self.follows_links_contained() {
            return Ok(());
        }
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Ok(());
        };
        // (No answer: the server will not make the link there either.)
        let Ok(real) = self.remote.realpath(dir).await else {
            return Ok(());
        };
        if real == dir {
            return Ok(());
        }
        match self.shown_path_of_real(&real) {
            Some(shown) => self.check_symlink(&shown.join(name), target),
            None => Err(FsError::new(
                libc::EPERM,
                format!(
                    "{}: the server resolves its directory to {}, outside the workspace; \
                     refused by the symlink policy (contain)",
                    path.display(),
                    real.display()
                ),
            )),
        }
    }

    /// A path as the mount would show the server's resolved path `real` (under the export
    /// root, or under a resource link's real directory), for the containment check; None if
    /// it is in neither.
    fn shown_path_of_real(&self, real: &Path) -> Option<PathBuf> {
        if real.starts_with(&self.root) {
            return Some(real.to_path_buf());
        }
        let links = self.resource_links.lock().unwrap();
        links.iter().find_map(|(name, dir)| {
            let rest = real.strip_prefix(dir).ok()?;
            Some(self.root.join(name).join(rest))
        })
    }

    /// The target of the symlink `ino` (at `path`), cached or asked, before any policy.
    async fn link_target(&self, ino: Ino, path: &Path) -> FsResult<PathBuf> {
        let cached = self.cache.lock().unwrap().get_link(ino);
        match cached {
            Some(t) => Ok(t),
            None => match self.remote.readlink(path).await {
                Ok(target) => {
                    self.cache.lock().unwrap().put_link(ino, target.clone());
                    Ok(target)
                }
                Err(e) => Err(self.explain(Op::Readlink, e, path, None).await),
            },
        }
    }

    /// The absolute server paths of `ino`'s names other than `path` (its hard links made
    /// through the mount).
    fn other_paths_of(&self, ino: Ino, path: &Path) -> Vec<PathBuf> {
        let inodes = self.inodes.lock().unwrap();
        inodes
            .names_of(ino)
            .into_iter()
            .filter_map(|(parent, name)| match inodes.location(parent) {
                Location::Path(rel) => Some(self.root.join(rel).join(name)),
                Location::Detached => None,
            })
            .filter(|p| p != path)
            .collect()
    }

    /// The mode of `ino` as the attribute cache knows it (nothing if not cached or expired).
    fn cached_mode(&self, ino: Ino) -> Option<u32> {
        self.cache
            .lock()
            .unwrap()
            .get_attrs(ino)
            .and_then(|c| c.attrs.mode)
    }

    /// Who a new file, directory or symlink that the server made for `caller` in `parent`
    /// (with `attrs`) should belong to, if not to whom it belongs now. On a local disk it
    /// belongs to its maker: the caller's uid, and its gid, or the directory's group in a
    /// setgid directory (which the server's own mkdir/open already gave it). Over SFTP it
    /// belongs to the server's account; only a root account can give it away, so this is
    /// done only when the new file is root's (the account is root), on a mount several local
    /// users share (`allow_other`), and without `idmap` (which maps that account to one
    /// local user instead).
    async fn owner_for_new(
        &self,
        parent: Ino,
        caller: Caller,
        attrs: &Attrs,
    ) -> Option<(u32, u32)> {
        {
            let config = self.config.lock().unwrap();
            if !config.owners_from_callers || config.idmap.is_some() {
                return None;
            }
        }
        if attrs.uid != Some(0) {
            return None;
        }
        let parent_mode = match self.cached_mode(parent) {
            Some(m) => m,
            None => {
                self.remote
                    .stat(&self.path_of(parent).ok()?)
                    .await
                    .ok()?
                    .mode?
            }
        };
        let gid = if parent_mode & libc::S_ISGID != 0 {
            attrs.gid?
        } else {
            caller.gid
        };
        let owner = (caller.uid, gid);
        (Some(owner) != attrs.uid.zip(attrs.gid)).then_some(owner)
    }

    /// Look up what was just created, giving it to its maker (see `owner_for_new`) and
    /// fixing its permission bits when the server's umask changed them (a local disk applies
    /// only the caller's umask, which the kernel already folded into `perm`).
    async fn finish_create(
        &self,
        parent: Ino,
        name: &OsStr,
        path: &Path,
        perm: Option<u32>,
        known: Option<(Attrs, u64)>,
        caller: Option<Caller>,
    ) -> FsResult<Entry> {
        let (mut attrs, since) = match known {
            Some(k) => k,
            None => {
                let since = self.cache.lock().unwrap().now();
                match self.remote.lstat(path).await {
                    Ok(a) => (a, since),
                    Err(e) => {
                        self.name_uncertain(parent, name);
                        return Err(self.explain(Op::Lookup, e, path, None).await);
                    }
                }
            }
        };
        let owner = match caller {
            Some(caller) => self.owner_for_new(parent, caller, &attrs).await,
            None => None,
        };
        if let Some(owner) = owner {
            let set = SetAttrs {
                uid_gid: Some(owner),
                ..Default::default()
            };
            let given = if attrs.file_type() == FileKind::Symlink {
                self.remote.lsetstat(path, set).await
            } else {
                self.remote.setstat(path, set).await
            };
            match given {
                Ok(()) => {
                    (attrs.uid, attrs.gid) = (Some(owner.0), Some(owner.1));
                    if attrs.file_type() != FileKind::Dir {
                        // chown(2) clears the set-id bits of a file, even as root: the step
                        // below puts back those the caller asked for.
                        attrs.mode = attrs.mode.map(|m| m & !0o6000);
                    }
                }
                // The server refused: the file stays its account's, as with sshfs.
                Err(e) => {
                    tracing::debug!(path = %path.display(), "giving a new file to its maker: {e}")
                }
            }
        }
        if let (Some(want), Some(mode)) = (perm, attrs.mode) {
            // A directory made in a setgid directory inherits S_ISGID from the server's
            // mkdir(2), as on a local disk: that is not the server's umask at work, keep it
            // (a chmod without it would clear it).
            let want = if FileKind::from_mode(mode) == FileKind::Dir {
                want | (mode & libc::S_ISGID)
            } else {
                want
            };
            if mode & 0o7777 != want & 0o7777 {
                let set = SetAttrs {
                    perm: Some(want & 0o7777),
                    ..Default::default()
                };
                if self.remote.setstat(path, set).await.is_ok() {
                    attrs.mode = Some((mode & libc::S_IFMT) | (want & 0o7777));
                }
            }
        }
        // Only mkdir makes a directory here (link(2) of one is refused by the kernel). A
        // file made here (`perm` is given only for a new object) has one link: a change of
        // it cannot show through another name (see `shared_data_changed`).
        let is_dir = attrs.file_type() == FileKind::Dir;
        let nlink = if is_dir {
            Some(2)
        } else if perm.is_some() && attrs.file_type() == FileKind::File {
            Some(1)
        } else {
            None
        };
        // The caches show the new entry at once, with its link count (the inode table's goes
        // when the kernel forgets the inode; a lookup answered from the listing then finds it
        // again); a new directory is known to be empty.
        {
            let mut cache = self.cache.lock().unwrap();
            cache.name_added(
                parent,
                DirEntry {
                    name: name.to_os_string(),
                    attrs,
                    nlink,
                },
            );
        }
        self.dir_names_changed(parent);
        if is_dir {
            // A new directory has two links, its `.` and its name; its `..` is one more link
            // to the parent.
            self.subdirs_changed(parent, 1);
        }
        let entry = self.entry(self.remember(parent, name, attrs, nlink, since));
        if is_dir {
            let mut cache = self.cache.lock().unwrap();
            cache.put_dir(entry.attr.ino, Arc::new(Vec::new()));
            // Made by the server's account, and kept so: a file made in it gets the same
            // owner and group (see `create_early`).
            if let (None, Some(uid), Some(gid)) = (owner, attrs.uid, attrs.gid) {
                cache.made_dir(entry.attr.ino, (uid, gid));
            }
        }
        Ok(entry)
    }

    pub async fn mkdir(
        &self,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        caller: Caller,
    ) -> FsResult<Entry> {
        let _mutating = self.check_writable("mkdir")?;
        self.dir_inside(parent).await?;
        // A name it creates or a path it moves may be one an unlink answered early is
        // still removing (see remove_behind): so may a name any operation below creates or a
        // path it moves.
        self.removes_behind.all_settled().await;
        let path = self.child_path(parent, name)?;
        let perm = mode & !umask & 0o7777;
        self.reserve_entry(&path)?;
        let since = self.cache.lock().unwrap().now();
        let attrs = match self.remote.mkdir_stat(&path, perm).await {
            Ok(a) => a,
            Err(e) => {
                self.enforcer.quota.release_entry(None, 0);
                self.made_or_not(parent, name, &e);
                return Err(self.explain(Op::Mkdir, e, &path, None).await);
            }
        };
        self.finish_create(
            parent,
            name,
            &path,
            Some(perm),
            Some((attrs, since)),
            Some(caller),
        )
        .await
    }

    pub async fn symlink(
        &self,
        parent: Ino,
        name: &OsStr,
        target: &Path,
        caller: Caller,
    ) -> FsResult<Entry> {
        let _mutating = self.check_writable("symlink")?;
        self.dir_inside(parent).await?;
        self.removes_behind.all_settled().await;
        let path = self.child_path(parent, name)?;
        if target.as_os_str().is_empty() {
            return Err(FsError::new(libc::ENOENT, "empty symlink target"));
        }
        self.check_symlink_made_at(&path, target).await?;
        self.reserve_entry(&path)?;
        if let Err(e) = self.remote.symlink(target, &path).await {
            self.enforcer.quota.release_entry(None, 0);
            self.made_or_not(parent, name, &e);
            return Err(self.explain(Op::Symlink, e, &path, None).await);
        }
        self.finish_create(parent, name, &path, None, None, Some(caller))
            .await
    }

    pub async fn unlink(self: &Arc<Self>, parent: Ino, name: &OsStr) -> FsResult<()> {
        let _mutating = self.check_writable("unlink")?;
        self.dir_inside(parent).await?;
        if self.unlink_special(parent, name).await? {
            return Ok(());
        }
        let path = self.child_path(parent, name)?;
        // A create of it answered early goes first: the REMOVE could overtake its OPEN.
        self.creates_behind.name_settled(parent, name).await;
        let ino = self.inodes.lock().unwrap().child(parent, name);
        if let Some(ino) = ino {
            if self.unlink_behind(parent, name, ino, &path) {
                return Ok(());
            }
        }
        let size = self.quota_size(ino, &path).await;
        self.settle_lost_writes(ino).await;
        self.snapshots_to_handles(ino).await;
        let _change = self.names.start(&[&path]);
        if let Err(e) = self.remote.remove(&path).await {
            if let Some(ino) = ino.filter(|_| e.is_connection_error()) {
                // Removed or not, nobody can tell: the file is not opened by name again.
                self.names.set_uncertain(ino);
            }
            return Err(self.explain(Op::Unlink, e, &path, None).await);
        }
        let gone = self.removed(parent, name);
        self.enforcer
            .quota
            .name_removed(ino, size, gone.is_some_and(data_lives_on));
        Ok(())
    }

    /// Answer the unlink of `name` (the file or symlink `ino`) now, and send its REMOVE in
    /// the background (see `remove_behind` for the order kept and how a failure is reported),
    /// when everything the answer depends on is known here: what the name is, its size for
    /// the quota, that no descriptor needs it to get a server handle first, and that its
    /// directory does not look like one that would refuse. False: the caller waits for the
    /// server as before.
    fn unlink_behind(self: &Arc<Self>, parent: Ino, name: &OsStr, ino: Ino, path: &Path) -> bool {
        use tracing::Instrument as _;
        if self.config.lock().unwrap().sync_unlink {
            return false;
        }
        // A directory gets EISDIR from the server: that answer must be waited for.
        let kind = self.inodes.lock().unwrap().kind(ino);
        if !matches!(kind, Some(FileKind::File | FileKind::Symlink)) {
            return false;
        }
        let size = match self.enforcer.quota.size_of(ino) {
            // (Whether the name is a followed link only the server can say.)
            _ if self.follows_links_under_quota() => return false,
            Some(size) => size,
            None if !self.enforcer.quota.is_limited() => 0,
            None => return false,
        };
        // A descriptor reading a copy fetched ahead needs a server handle, opened by this name,
        // before the name goes (see snapshots_to_handles).
        if self
            .snapshots
            .lock()
            .unwrap()
            .values()
            .any(|(i, _)| *i == ino)
        {
            return false;
        }
        // A sticky directory refuses to remove other users' files, and one without write
        // permission refuses everyone but root: ask the server. (Its attributes are often not
        // known here, since each unlink changes its mtime; then a refusal is reported late.)
        let parent_mode = self.cached_mode(parent);
        if parent_mode.is_some_and(|m| m & libc::S_ISVTX != 0 || m & 0o222 == 0) {
            return false;
        }
        // Writes a lost connection took must reach the file by this name first.
        if self.has_lost_writes(ino) {
            return false;
        }
        if !self.removes_behind.begin(parent, name) {
            return false;
        }
        // A listing answered before the REMOVE lands still counts the name in the file's link
        // count (one of another directory does not wait for it): not taken over until then.
        self.cache.lock().unwrap().unlink_started(ino);
        // The quota gives back now (a write that the removal makes room for must not fail),
        // and charges again if the server refuses.
        let lives_on = self.removed(parent, name).is_some_and(data_lives_on);
        // The name is gone from the table now, before the REMOVE is sent.
        self.names.bump(path);
        let given_back = self.enforcer.quota.name_removed(Some(ino), size, lives_on);
        self.stats.unlinks_behind.fetch_add(1, Ordering::Relaxed);
        let fs = self.clone();
        let name = name.to_os_string();
        let path = path.to_path_buf();
        self.rt.spawn(
            async move {
                let failure = fs.remove_behind(&path).await;
                fs.cache.lock().unwrap().unlink_landed(ino);
                fs.dir_landed(parent);
                if let Some(e) = &failure {
                    tracing::warn!(
                        "the server refused an unlink answered early; the name is back: {e}"
                    );
                    fs.enforcer.quota.name_restored(ino, given_back);
                    // Forget that it was removed: the next lookup finds it on the server.
                    fs.name_uncertain(parent, &name);
                }
                fs.removes_behind.land(parent, &name, failure);
            }
            .in_current_span(),
        );
        true
    }

    /// Send the REMOVE of an unlink already answered; the error if the name is still there.
    async fn remove_behind(&self, path: &Path) -> Option<FsError> {
        let mut result = self.remote.remove(path).await;
        if matches!(result, Err(RemoteError::Disconnected(_))) {
            // Sent again on the next connection (the remote waits for it). If the first one
            // was carried out before the connection went, the name is gone: NO_SUCH_FILE.
            result = self.remote.remove(path).await;
        }
        match result {
            // Gone already (removed on the server meanwhile): what the unlink promised.
            Ok(()) | Err(RemoteError::Status(Status::NoSuchFile, _)) => None,
            Err(e) => Some(self.explain(Op::Unlink, e, path, None).await),
        }
    }

    /// `fsync` of a directory: the unlinks in it answered early have reached the server, and
    /// the first one the server refused since the last fsync is reported.
    pub async fn fsyncdir(&self, ino: Ino) -> FsResult<()> {
        self.creates_behind.dir_settled(ino).await;
        self.removes_behind.dir_settled(ino).await;
        match self.removes_behind.take_failure(ino) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub async fn rmdir(&self, parent: Ino, name: &OsStr) -> FsResult<()> {
        let _mutating = self.check_writable("rmdir")?;
        self.dir_inside(parent).await?;
        let path = self.child_path(parent, name)?;
        self.rmdir_special_check(&path)?;
        // A create in it answered early is carried out first (the RMDIR must find it there).
        let dir = self.inodes.lock().unwrap().child(parent, name);
        if let Some(dir) = dir {
            self.creates_behind.dir_settled(dir).await;
        }
        // Unlinks in it answered early were sent before this, and are usually carried out
        // by the time it arrives (`rm -rf` then costs one round trip per directory, not
        // two). If one was not (they travel on several channels), the server refuses, and
        // the RMDIR is sent again once they all have been.
        let removes_pending = self.removes_behind.in_flight() > 0;
        let mut result = self.remote.rmdir(&path).await;
        if result.is_err() && removes_pending {
            self.removes_behind.all_settled().await;
            result = self.remote.rmdir(&path).await;
        }
        if let Err(e) = result {
            let err = self.explain(Op::Rmdir, e, &path, None).await;
            if err.errno == libc::ENOTEMPTY {
                let dir = self.inodes.lock().unwrap().child(parent, name);
                self.listing_contradicted(dir);
            }
            return Err(err);
        }
        self.enforcer.quota.release_entry(None, 0);
        self.removed(parent, name);
        self.subdirs_changed(parent, -1);
        Ok(())
    }

    /// The server refused to remove directory `dir` (or to rename one over it) as not
    /// empty: see [`MetaCache::listing_contradicted`]. The names it had answered as absent
    /// may be what is in the way: the kernel drops what it kept of those answers too.
    fn listing_contradicted(&self, dir: Option<Ino>) {
        if let Some(dir) = dir {
            let absent = self.cache.lock().unwrap().listing_contradicted(dir);
            self.kernel_caches
                .forget_names(absent.into_iter().map(|n| (dir, n)).collect());
        }
    }

    /// A request making `name` in `parent` failed with `e`: if the connection went, the server
    /// may have made it all the same.
    fn made_or_not(&self, parent: Ino, name: &OsStr, e: &RemoteError) {
        if e.is_connection_error() {
            self.name_uncertain(parent, name);
        }
    }

    /// What the mount knew of `name` in `parent` may be wrong: an operation on it failed after
    /// the server may have carried it out. Forgotten here, and by the kernel (which may keep
    /// the name as absent, from the lookup made before the operation, or as what it was),
    /// unless it is a directory the kernel knows by that name: dropping that entry would
    /// detach what is mounted below it and leave processes in it without a path to it, so
    /// the kernel looks it up again when its entry TTL runs out, as before.
    fn name_uncertain(&self, parent: Ino, name: &OsStr) {
        self.cache.lock().unwrap().name_changed(parent, name);
        self.dir_names_changed(parent);
        let is_dir = {
            let inodes = self.inodes.lock().unwrap();
            inodes
                .child(parent, name)
                .and_then(|i| inodes.kind(i))
                .is_some_and(|k| k == FileKind::Dir)
        };
        if !is_dir {
            self.kernel_caches
                .forget_names(vec![(parent, name.to_os_string())]);
        }
    }

    /// `name` in `parent` was removed through the mount: the inode loses that name (and a
    /// link), and what the caches said of it is dropped. Its other names, if any, now show
    /// one link less.
    fn removed(&self, parent: Ino, name: &OsStr) -> Option<inode::Detached> {
        let gone = {
            // It lost a name: its status changed (seen through descriptors still open, and
            // through its other names).
            let mut inodes = self.inodes.lock().unwrap();
            if let Some(ino) = inodes.child(parent, name) {
                inodes.status_changed(ino, SystemTime::now());
            }
            inodes.detach_name(parent, name)
        };
        self.cache.lock().unwrap().name_removed(parent, name);
        self.dir_names_changed(parent);
        if let Some(d) = gone {
            self.attrs_changed(d.ino, None);
            self.link_count_changed(d.ino);
            self.cache.lock().unwrap().forget_attrs(d.ino);
        }
        gone
    }

    pub async fn rename(
        self: &Arc<Self>,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        let _mutating = self.check_writable("rename")?;
        if flags & libc::RENAME_EXCHANGE != 0 {
            return Err(FsError::new(
                libc::EINVAL,
                "RENAME_EXCHANGE cannot be done atomically over SFTP",
            ));
        }
        if flags & !(libc::RENAME_NOREPLACE) != 0 {
            return Err(FsError::new(
                libc::EINVAL,
                format!("unsupported rename flags {flags:#x}"),
            ));
        }
        self.dir_inside(parent).await?;
        if new_parent != parent {
            self.dir_inside(new_parent).await?;
        }
        match self
            .rename_special((parent, name), (new_parent, new_name), flags)
            .await
        {
            Some(outcome) => outcome,
            None => {
                self.rename_on_server(parent, name, new_parent, new_name, flags)
                    .await
            }
        }
    }

    /// rename(2) of a name the server has to a name only the server may have (`rename` has
    /// checked the flags and dealt with special files).
    async fn rename_on_server(
        self: &Arc<Self>,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        // Either name may be one created early or unlinked early: that goes first.
        self.names_settled().await;
        let from = self.child_path(parent, name)?;
        let to = self.child_path(new_parent, new_name)?;
        let (source_ino, same_file) = {
            let inodes = self.inodes.lock().unwrap();
            let source = inodes.child(parent, name);
            let same = source.is_some() && source == inodes.child(new_parent, new_name);
            (source, same)
        };
        if same_file {
            // Two names of one file (a hard link made through the mount): rename(2) does
            // nothing and succeeds, both names stay.
            if flags & libc::RENAME_NOREPLACE != 0 {
                return Err(FsError::new(
                    libc::EEXIST,
                    format!("{}: exists", to.display()),
                ));
            }
            return Ok(());
        }
        // (Renaming an existing link is not making one: only `contain` looks at it.)
        if let Some(ino) = source_ino.filter(|_| self.enforcer.symlinks() == SymlinkMode::Contain) {
            self.check_symlink_put_at(ino, &from, &to).await?;
        }
        let into_itself = {
            let inodes = self.inodes.lock().unwrap();
            inodes
                .child(parent, name)
                .is_some_and(|moving| inodes.is_ancestor(moving, new_parent))
        };
        if into_itself {
            return Err(FsError::new(
                libc::EINVAL,
                "cannot move a directory into itself",
            ));
        }
        let mode = if flags & libc::RENAME_NOREPLACE != 0 {
            RenameMode::NoReplace
        } else {
            RenameMode::Replace
        };
        // A replaced target gives its entry and bytes back to the quota.
        let replaced = if self.enforcer.quota.is_limited() && mode == RenameMode::Replace {
            let target_ino = self.inodes.lock().unwrap().child(new_parent, new_name);
            match self.remote.lstat(&to).await {
                Ok(a) => Some((
                    target_ino,
                    if a.file_type() == FileKind::File {
                        self.quota_size(target_ino, &to).await
                    } else {
                        0
                    },
                )),
                Err(_) => None,
            }
        } else {
            None
        };
        let target = match mode {
            RenameMode::Replace => self.inodes.lock().unwrap().child(new_parent, new_name),
            RenameMode::NoReplace => None,
        };
        self.settle_lost_writes(source_ino).await;
        self.settle_lost_writes(target).await;
        self.snapshots_to_handles(target).await;
        // From here until the inode table shows the outcome, no live file is opened by these
        // names (or names below them).
        let _change = self.names.start(&[&from, &to]);
        // A directory about to move: listings on their way until it has moved and the inode
        // table says so (the guard lives to the end of this call) may miss entries (see
        // `list_dir`).
        let moves_dir = {
            let inodes = self.inodes.lock().unwrap();
            source_ino.is_none_or(|i| inodes.kind(i).is_none_or(|k| k == FileKind::Dir))
        };
        let _moving = moves_dir.then(|| DirMove::start(&self.cache));
        if let Err(e) = self.remote.rename(&from, &to, mode).await {
            if e.is_connection_error() {
                // Carried out or not, nobody can tell: neither file is opened by name again,
                // and both names are looked up again.
                for ino in [source_ino, target].into_iter().flatten() {
                    self.names.set_uncertain(ino);
                }
                self.name_uncertain(parent, name);
                self.name_uncertain(new_parent, new_name);
            }
            let mut err = self.explain(Op::Rename, e, &to, Some(&from)).await;
            // Plain SFTP RENAME refuses an existing target with the generic FAILURE.
            if mode == RenameMode::NoReplace
                && err.errno != libc::ENOENT
                && self.probe_kind(&to).await.is_some()
            {
                err.errno = libc::EEXIST;
            }
            if err.errno == libc::ENOTEMPTY {
                self.listing_contradicted(target);
            }
            return Err(err);
        }
        if mode == RenameMode::Replace
            && source_ino.is_some_and(|i| self.inodes.lock().unwrap().has_unknown_links(i))
            && self.remote.lstat(&from).await.is_ok()
        {
            // The source has links the mount does not know by name, and is still there after
            // the rename: the target was another link of the same file (made on the server),
            // and the server did nothing. Nothing moved (the kernel, told it did, is told to
            // look both names up again); what we knew of both names may be off.
            self.name_uncertain(parent, name);
            self.name_uncertain(new_parent, new_name);
            return Ok(());
        }
        let replaced_node = {
            // The moved object and a replaced one change status (a name came or went).
            let now = SystemTime::now();
            let mut inodes = self.inodes.lock().unwrap();
            for ino in [
                inodes.child(parent, name),
                inodes.child(new_parent, new_name),
            ]
            .into_iter()
            .flatten()
            {
                inodes.status_changed(ino, now);
            }
            // A directory moved takes its `..` link along; one replaced loses its own.
            let is_dir = |ino: Option<Ino>| ino.and_then(|i| inodes.kind(i)) == Some(FileKind::Dir);
            let moved_dir = is_dir(inodes.child(parent, name));
            let replaced_dir = is_dir(inodes.child(new_parent, new_name));
            let mut counts = Vec::new();
            if moved_dir {
                counts.push(subdirs_changed_in(&mut inodes, parent, -1));
                counts.push(subdirs_changed_in(&mut inodes, new_parent, 1));
            }
            if replaced_dir {
                counts.push(subdirs_changed_in(&mut inodes, new_parent, -1));
            }
            // A directory takes the special files in it along, in the same step (a lookup
            // below it finds them under the new path as soon as it can build that path).
            self.specials.lock().unwrap().move_dir(&from, &to);
            let replaced_node = inodes.rename(parent, name, new_parent, new_name);
            drop(inodes);
            self.listings_follow_subdirs(&counts);
            replaced_node
        };
        if let Some((target_ino, size)) = replaced {
            self.enforcer.quota.name_removed(
                target_ino,
                size,
                replaced_node.is_some_and(data_lives_on),
            );
        }
        if let Some(d) = replaced_node {
            // Its other names (if any) show one link less.
            self.attrs_changed(d.ino, None);
            self.link_count_changed(d.ino);
        }
        let mut cache = self.cache.lock().unwrap();
        cache.name_removed(new_parent, new_name);
        match cache.name_removed(parent, name) {
            Some(mut moved) => {
                moved.name = new_name.to_os_string();
                cache.name_added(new_parent, moved);
            }
            // We do not know what moved: the target directory's listing cannot be kept.
            None => cache.name_changed(new_parent, new_name),
        }
        drop(cache);
        self.dir_names_changed(parent);
        if new_parent != parent {
            self.dir_names_changed(new_parent);
        }
        Ok(())
    }

    /// A hard link: the new name is another name of the same inode (answered with the source's
    /// inode number), so the kernel keeps one inode, one page cache and one set of attributes
    /// for both.
    pub async fn link(&self, ino: Ino, new_parent: Ino, new_name: &OsStr) -> FsResult<Entry> {
        let _mutating = self.check_writable("link")?;
        self.parent_inside(ino).await?;
        self.dir_inside(new_parent).await?;
        self.names_settled().await;
        if let Some(done) = self.link_special(ino, new_parent, new_name).await {
            return done;
        }
        let existing = self.path_of(ino)?;
        let new = self.child_path(new_parent, new_name)?;
        // A hard link of a symlink is a symlink made at `new` (under `deny`: refused).
        self.check_symlink_put_at(ino, &existing, &new).await?;
        // SFTP v3 has no link counts, so an unlink cannot always tell whether the data lives
        // on under another name: a hard link is charged as a copy (see Quota::reserve_link).
        let size = self.quota_size(Some(ino), &existing).await;
        self.enforcer.quota.reserve_link(ino, size).map_err(|_| {
            FsError::new(
                libc::ENOSPC,
                format!(
                    "{}: a hard link counts as a new entry and a copy, and the quota is used up",
                    new.display()
                ),
            )
        })?;
        // (Its answer is what the kernel shows: not from before a mode or times queued.)
        self.changes_behind_settled(ino).await;
        let since = self.cache.lock().unwrap().now();
        // The new name's attributes in the same round trip.
        let attrs = match self.remote.hardlink_stat(&existing, &new).await {
            // The link is made; the connection went before the LSTAT's answer: ask again
            // (on the new connection, with `reconnect`).
            Ok(Err(e)) if e.is_connection_error() => self.remote.lstat(&new).await,
            Ok(attrs) => attrs,
            Err(e) => {
                self.enforcer.quota.unreserve_link(ino, size);
                self.made_or_not(new_parent, new_name, &e);
                return Err(self.explain(Op::Link, e, &new, Some(&existing)).await);
            }
        };
        let added = self
            .inodes
            .lock()
            .unwrap()
            .add_link(ino, new_parent, new_name);
        if !added {
            // The source lost its last name meanwhile (or was forgotten): the new name is a
            // file of its own to the mount.
            self.attrs_changed(ino, None);
            return self
                .finish_create(new_parent, new_name, &new, None, None, None)
                .await;
        }
        // The link count and the ctime changed: every name of it shows that.
        self.status_changed(ino);
        self.attrs_changed(ino, None);
        self.link_count_changed(ino);
        // With `follow_symlinks` a symlink is shown as what it points to, and the server
        // linked the symlink itself: the new name is asked the way the inode is shown.
        let kind = self.inodes.lock().unwrap().kind(ino);
        let attrs = match attrs {
            Ok(a) if kind.is_some_and(|k| k != a.file_type()) => self.stat_as(&new, kind).await,
            other => other,
        };
        let attrs = match attrs {
            Ok(a) => a,
            Err(e) => {
                self.name_uncertain(new_parent, new_name);
                // The kernel gets no entry: the lookup `add_link` counted is given back.
                self.forget(ino, 1);
                return Err(self.explain(Op::Lookup, e, &new, None).await);
            }
        };
        self.cache.lock().unwrap().name_added(
            new_parent,
            DirEntry {
                name: new_name.to_os_string(),
                attrs,
                nlink: None,
            },
        );
        self.dir_names_changed(new_parent);
        let attrs = self.with_pending_size(ino, attrs);
        self.cache_attrs_from(ino, CachedAttrs { attrs, nlink: None }, since);
        Ok(self.entry(self.make_attr(ino, &attrs, None)))
    }

    // ---------------------------------------------------------------- files

    /// An open as the kernel sees it: the descriptor, and whether the kernel may keep the
    /// pages it has cached of the file (`keep_cache`; see [`Fs::page_cache_keepable`]).
    pub async fn open_keeping_cache(
        self: &Arc<Self>,
        ino: Ino,
        req: OpenRequest,
    ) -> FsResult<(u64, bool)> {
        self.parent_inside(ino).await?;
        // Opened by name: not before a create of it answered early is carried out.
        self.create_landed(ino).await;
        let before = (Instant::now(), self.cache.lock().unwrap().now());
        // (An open with O_TRUNC empties the kernel's cache of the file anyway.)
        let keep = req.flags & libc::O_TRUNC == 0 && self.page_cache_keepable(ino);
        if keep {
            if let Some(fh) = self.open_deferred(ino, &req) {
                return Ok((fh, true));
            }
        }
        let fh = self.open_reading_along(ino, req, !keep).await?;
        if !keep {
            // Opened from a copy fetched ahead: the kernel's reads get data as old as that.
            let fetched = self.snapshot(fh).map(|s| (s.planned, s.since));
            self.page_cache_dropped(ino, fetched.unwrap_or(before));
        }
        Ok((fh, keep))
    }

    /// Whether an open of `ino` may leave the kernel's cached pages of it in place. Without
    /// `keep_cache` every open drops them, and a file read again (the index and packs every
    /// `git` command maps, headers a build includes, a second `grep -r`) is read from the
    /// server again. They are kept when every one of them was read from the server less than
    /// the attribute TTL ago: since the kernel last dropped them (`PageCacheMark`), which is
    /// the promise the attribute cache already makes for changes made on the server; and
    /// when nothing changed the file through the mount since (the change clock: a write
    /// the server then refused must not stay visible), and its size and mtime, as far as
    /// they are known, are still what they were then. Otherwise the open drops them, and
    /// [`Fs::page_cache_dropped`] starts a new mark.
    /// Past the TTL the kernel also checks on its own: with `auto_inval_data` a read with
    /// expired attributes fetches them and drops the pages if the size or mtime moved. The
    /// TTL bound is what catches a change that moves neither (same size, within the second
    /// SFTP v3 times have).
    fn page_cache_keepable(&self, ino: Ino) -> bool {
        let ttl = self.attr_ttl_for(ino);
        let Some(m) = self.inodes.lock().unwrap().page_cache_mark(ino) else {
            return false;
        };
        let mut cache = self.cache.lock().unwrap();
        let attrs = cache.get_attrs(ino).map(|c| (c.attrs.size, c.attrs.mtime));
        // Attributes not known now (or at either open): the TTL and the change clock decide,
        // as they do for the attributes themselves. Known now but not then (after a write of
        // ours): what the pages are cannot be told, so they go once.
        let same = match (m.attrs, attrs) {
            (Some(then), Some(now)) => then == now,
            (None, Some(_)) => false,
            (_, None) => true,
        };
        same && !cache.changed_since(ino, m.clock) && !ttl.is_zero() && Instant::now() < m.until
    }

    /// The kernel drops its pages of `ino` now (an open without `keep_cache`): what it reads
    /// from here on is from `data_since` (when, and the change clock then) or later.
    fn page_cache_dropped(&self, ino: Ino, data_since: (Instant, u64)) {
        let ttl = self.attr_ttl_for(ino);
        let attrs = self
            .cache
            .lock()
            .unwrap()
            .get_attrs(ino)
            .map(|c| (c.attrs.size, c.attrs.mtime));
        self.inodes.lock().unwrap().set_page_cache_mark(
            ino,
            PageCacheMark {
                until: data_since.0 + ttl,
                clock: data_since.1,
                attrs,
            },
        );
    }

    pub async fn open(self: &Arc<Self>, ino: Ino, req: OpenRequest) -> FsResult<u64> {
        self.parent_inside(ino).await?;
        // Opened by name: not before a create of it answered early is carried out.
        self.create_landed(ino).await;
        self.open_reading_along(ino, req, true).await
    }

    /// An open for reading of `ino` answered at once, without a server handle, when the
    /// kernel keeps its cached pages of the file (`Fs::page_cache_keepable`): they were read
    /// through an open that succeeded less than the attribute TTL ago, and nothing changed
    /// the file through the mount since. Reopening a file read a moment ago (every `git`
    /// command's config, index and packs; a build's headers; a second `grep -r`) then costs
    /// no round trip: the server would say what it said then, as far as the attribute TTL
    /// promises (a file removed or made unreadable on the server within it shows at the
    /// first read that misses the page cache, which opens the file then, or after the TTL).
    /// The descriptor is a snapshot without data (`Snapshot::deferred`): every path that
    /// knows handle-less descriptors treats it as one (a read, or an unlink or rename of
    /// its name, gives it a server handle first). Needs the file's attributes known.
    fn open_deferred(&self, ino: Ino, req: &OpenRequest) -> Option<u64> {
        if req.remote_flags() != OpenFlags::read_only()
            || self.inodes.lock().unwrap().kind(ino) != Some(FileKind::File)
        {
            return None;
        }
        let (attrs, since) = {
            let mut cache = self.cache.lock().unwrap();
            (cache.get_attrs(ino)?.attrs, cache.now())
        };
        let snap = Snapshot {
            data: Bytes::new(),
            attrs,
            planned: Instant::now(),
            since,
            deferred: true,
        };
        let fh = self.alloc_fh();
        self.snapshots
            .lock()
            .unwrap()
            .insert(fh, (ino, Arc::new(snap)));
        self.stats.opens_deferred.fetch_add(1, Ordering::Relaxed);
        Some(fh)
    }

    /// [`Fs::open`]; `read_along`: the file's first bytes may be read along with the open
    /// (not when the kernel keeps its cached pages: it will not ask).
    async fn open_reading_along(
        self: &Arc<Self>,
        ino: Ino,
        req: OpenRequest,
        read_along: bool,
    ) -> FsResult<u64> {
        if req.wants_write() {
            // (Only a check: the writes to come are checked, and counted, each.)
            drop(self.check_writable("open for writing")?);
        }
        let path = self.path_of(ino)?;
        let flags = req.remote_flags();
        // (O_TRUNC reaches us with atomic_o_trunc: the kernel truncates its page cache itself
        // and sends no setattr. Never from a copy.)
        if !flags.write && !flags.append && !flags.truncate {
            if let Some(fh) = self.open_fetched_ahead(ino).await {
                return Ok(fh);
            }
        }
        if flags.truncate {
            let handle = self.open_truncating(ino, &path, flags, req.caller).await?;
            return Ok(self.register_file(ino, flags, handle, req.pid));
        }
        // Before the checks below: a write through the mount after it shows as a change since
        // (see `read_along_for`), one before it as a write still on its way.
        let since = (Instant::now(), self.cache.lock().unwrap().now());
        let shared_since = self.shared_changes();
        let along = match read_along && flags == OpenFlags::read_only() {
            true => self.read_along_len(ino),
            false => None,
        };
        let quota = &self.enforcer.quota;
        // Writes are charged by how far they grow the file: its size must be known.
        let sized = flags.write && quota.is_limited() && !quota.knows(ino);
        let opened = match along {
            Some((len, stat)) => self.remote.open_read(&path, len, stat).await,
            None if sized => self.remote.open_stat(&path, flags, 0).await.map(|(h, a)| {
                let along = Along {
                    attrs: Some(a),
                    data: None,
                };
                (h, along)
            }),
            None => self
                .remote
                .open(&path, flags, 0)
                .await
                .map(|h| (h, Along::default())),
        };
        let (handle, got) = match opened {
            Ok(o) => o,
            Err(e) => return Err(self.explain(Op::Open, e, &path, None).await),
        };
        // (What the LSTAT of a followed symlink shows is the link, not the file.)
        let attrs = got.attrs.filter(|a| a.file_type() == FileKind::File);
        if let Some(attrs) = attrs {
            // The kernel's `fstat` after the open is answered with these.
            self.cache_attrs_from(ino, CachedAttrs { attrs, nlink: None }, since.1);
        }
        if let (Some((len, _)), Some(data)) = (along, got.data) {
            let fh = self.register_file(ino, flags, handle, req.pid);
            self.stats.opens_read_along.fetch_add(1, Ordering::Relaxed);
            self.read_along.lock().unwrap().insert(
                fh,
                ReadAlong {
                    ino,
                    eof: data.len() < len as usize,
                    data,
                    until: since.0 + self.attr_ttl_for(ino),
                    since: since.1,
                    shared_since,
                },
            );
            return Ok(fh);
        }
        if sized {
            let size = match attrs {
                Some(a) => Ok(a),
                None => self.remote.fstat(&handle).await,
            };
            match size {
                Ok(a) => quota.observe(ino, a.size.unwrap_or(0)),
                Err(e) => {
                    let _ = self.remote.close(&handle).await;
                    return Err(remote_err(Op::Open, &e, "fstat"));
                }
            }
        }
        Ok(self.register_file(ino, flags, handle, req.pid))
    }

    /// open(2) with O_TRUNC of an existing file. With atomic_o_trunc the flag comes with the
    /// open and no setattr follows (the kernel empties its page cache itself): one OPEN with
    /// TRUNC, and an LSTAT in the same round trip for the attributes the kernel asks right
    /// after (its own are stale, and `fstat` follows nearly every open). That is two round
    /// trips less than a setattr after the open (a SETSTAT, then an LSTAT) for every tool
    /// that rewrites a file in place. A round trip more only when the quota does not track
    /// the file's size (it is given back), or when the server ignored TRUNC (below).
    async fn open_truncating(
        self: &Arc<Self>,
        ino: Ino,
        path: &Path,
        flags: OpenFlags,
        caller: Caller,
    ) -> FsResult<R::Handle> {
        // As before a truncate by setattr: the writes of other descriptors still on their
        // way land first (or they would extend the emptied file again), and what a creating
        // descriptor knew of the file is stale.
        self.forget_created(ino);
        self.drain_inode(ino).await;
        let quota = &self.enforcer.quota;
        if quota.is_limited() && !quota.knows(ino) {
            // What it holds is given back below: know how much first.
            let size = self.fetch_attrs(ino).await.ok().and_then(|a| a.attrs.size);
            quota.observe(ino, size.unwrap_or(0));
        }
        // The lease may have ended while the writes landed.
        let _mutating = self.check_writable("open with O_TRUNC")?;
        let since = self.cache.lock().unwrap().now();
        let (handle, attrs) = match self.truncating_open(path, flags, caller).await {
            Ok(o) => o,
            Err(e) => {
                // It may have been truncated all the same (a failure after the OPEN): what
                // the mount and the kernel knew of it goes.
                self.truncated(ino, 0);
                self.attrs_changed(ino, None);
                self.kernel_caches.invalidate(vec![ino]);
                return Err(e);
            }
        };
        self.truncated(ino, 0);
        self.data_changed(ino);
        // As the server showed it right after the truncate, unless something changed it
        // through the mount since.
        let untouched = self.writers_of(ino).is_empty()
            && !self.cache.lock().unwrap().changed_since(ino, since);
        self.attrs_changed(ino, attrs.filter(|_| untouched));
        if quota.knows(ino) {
            let _ = quota.resize(ino, 0);
        }
        Ok(handle)
    }

    /// `ino` was truncated to `size`: what its descriptors wrote beyond that no longer
    /// counts for the size shown while writes are on their way.
    fn truncated(&self, ino: Ino, size: u64) {
        for f in self.files.lock().unwrap().values().filter(|f| f.ino == ino) {
            f.written_end.fetch_min(size, Ordering::Relaxed);
        }
    }

    /// The OPEN of [`Fs::open_truncating`]: the handle, and the file's attributes right after
    /// (None if they are not a regular file's, or the size had to be set).
    async fn truncating_open(
        &self,
        path: &Path,
        flags: OpenFlags,
        caller: Caller,
    ) -> FsResult<(R::Handle, Option<Attrs>)> {
        let (handle, attrs) = match self.remote.open_stat(path, flags, 0).await {
            Ok(o) => o,
            Err(e) => return Err(self.explain(Op::Open, e, path, None).await),
        };
        let attrs = match attrs.file_type() {
            // A followed symlink: its LSTAT shows the link; the handle shows the file.
            FileKind::Symlink => self.remote.fstat(&handle).await.ok(),
            _ => Some(attrs),
        };
        let attrs = attrs.filter(|a| a.file_type() == FileKind::File);
        // (O_RDONLY|O_TRUNC, which POSIX leaves unspecified, is not truncated again: a handle
        // opened for reading cannot be, and the name may lead to another file by now.)
        if !flags.write {
            return Ok((handle, attrs));
        }
        // Opened, maybe not truncated: SFTP v3 defines TRUNC only together with CREAT, and a
        // server other than OpenSSH (which truncates either way) may ignore it alone. (On
        // OpenSSH the size shows only a write that came in between, from another client or
        // another descriptor, and so was at the same time as the open: it may go before the
        // truncate, as it does here.)
        let size = attrs
            .is_some_and(|a| a.size.is_some_and(|s| s != 0))
            .then_some(0);
        // A truncate by anyone but root clears the set-user-ID bit, and the set-group-ID bit
        // of a group-executable file, as on a local disk (with `atomic_o_trunc` the kernel
        // leaves that to us, and a server running as root keeps them).
        let perm = attrs
            .and_then(|a| a.mode)
            .filter(|_| caller.uid != 0)
            .and_then(|m| {
                let sgid = match m & libc::S_IXGRP != 0 {
                    true => m & libc::S_ISGID,
                    false => 0,
                };
                let kill = (m & libc::S_ISUID) | sgid;
                (kill != 0).then_some(m & !kill & 0o7777)
            });
        if size.is_none() && perm.is_none() {
            return Ok((handle, attrs));
        }
        if size.is_some() {
            let set = SetAttrs {
                size,
                ..Default::default()
            };
            if let Err(e) = self.remote.fsetstat(&handle, set).await {
                let _ = self.remote.close(&handle).await;
                return Err(self.explain_sized(Op::Setattr, e, path, 0).await);
            }
        }
        if perm.is_some() {
            // Not a reason to fail the open, which has truncated the file already (a server
            // whose user does not own the file, or that refuses FSETSTAT, keeps the bits).
            let set = SetAttrs {
                perm,
                ..Default::default()
            };
            if let Err(e) = self.remote.fsetstat(&handle, set).await {
                tracing::warn!(
                    path = %path.display(),
                    "open(O_TRUNC): the set-id bits could not be cleared: {e}"
                );
            }
        }
        Ok((handle, None))
    }

    pub async fn create(
        self: &Arc<Self>,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        req: OpenRequest,
    ) -> FsResult<(Entry, u64)> {
        self.create_maybe_early(parent, name, mode, umask, req, true)
            .await
    }

    /// `create`; answered before the server's OPEN only if `may_be_early` (not for
    /// `mknod`, which closes the file at once: nothing would report a refused OPEN).
    async fn create_maybe_early(
        self: &Arc<Self>,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        req: OpenRequest,
        may_be_early: bool,
    ) -> FsResult<(Entry, u64)> {
        let _mutating = self.check_writable("create")?;
        self.dir_inside(parent).await?;
        self.removes_behind.all_settled().await;
        let path = self.child_path(parent, name)?;
        let perm = mode & !umask & 0o7777;
        let mut flags = req.remote_flags();
        flags.create = true;
        flags.exclusive = req.flags & libc::O_EXCL != 0;
        // A file created O_RDONLY is still created; SFTP wants some access to open it.
        if !flags.read && !flags.write {
            flags.read = true;
        }
        self.reserve_entry(&path)?;
        let since = self.cache.lock().unwrap().now();
        // The kernel asks to create a name its lookup found missing, but a file may have been
        // put there on the server since. Its mode is fixed up and, on a shared mount, it is
        // given to its maker (`finish_create`) only if this create made it, never one that
        // was there already: so it is made exclusively, and opened the plain way if it turns
        // out to exist. On a shared mount it is made without set-id bits, and gets them only
        // once it is its maker's: never a set-id file of the server's account.
        let (giving_away, sync_create) = {
            let c = self.config.lock().unwrap();
            (c.owners_from_callers, c.sync_create)
        };
        let first_perm = if giving_away { perm & !0o6000 } else { perm };
        if may_be_early && !giving_away && !sync_create && flags.write {
            if let Some(owner) = self.vouched_absent(parent, name) {
                return Ok(self.create_early(parent, name, path, flags, perm, owner, req.pid));
            }
        }
        let made = if !flags.exclusive {
            let exclusive = OpenFlags {
                exclusive: true,
                ..flags
            };
            match self.remote.open_stat(&path, exclusive, first_perm).await {
                Ok(h) => Ok((h, true)),
                Err(e) if e.is_connection_error() => Err(e),
                // Most likely there already: opened as asked, and left to its owner.
                Err(_) => self
                    .remote
                    .open_stat(&path, flags, perm)
                    .await
                    .map(|h| (h, false)),
            }
        } else {
            self.remote
                .open_stat(&path, flags, first_perm)
                .await
                .map(|h| (h, true))
        };
        let ((handle, attrs), new) = match made {
            Ok((h, false)) => {
                // Not a new entry after all.
                self.enforcer.quota.release_entry(None, 0);
                (h, false)
            }
            Ok(m) => m,
            Err(e) => {
                self.enforcer.quota.release_entry(None, 0);
                self.made_or_not(parent, name, &e);
                let mut err = self.explain(Op::Create, e, &path, None).await;
                // O_CREAT|O_EXCL over anything existing, a directory too, is EEXIST.
                if flags.exclusive && err.errno == libc::EISDIR {
                    err.errno = libc::EEXIST;
                }
                if err.errno == libc::EEXIST {
                    // Made on the server's side since the name was found absent: neither the
                    // mount nor the kernel may go on saying it is not there.
                    self.name_uncertain(parent, name);
                }
                return Err(err);
            }
        };
        if !new && flags.truncate {
            // An existing file opened with O_TRUNC: the server moved its mtime.
            let mut inodes = self.inodes.lock().unwrap();
            if let Some(ino) = inodes.child(parent, name) {
                inodes.data_changed(ino, SystemTime::now());
            }
        }
        let entry = match self
            .finish_create(
                parent,
                name,
                &path,
                new.then_some(perm),
                Some((attrs, since)),
                new.then_some(req.caller),
            )
            .await
        {
            Ok(e) => e,
            Err(e) => {
                let _ = self.remote.close(&handle).await;
                return Err(e);
            }
        };
        if new && entry.attr.size == 0 {
            self.enforcer.quota.created(entry.attr.ino);
        }
        let fh = self.register_file(entry.attr.ino, flags, handle, req.pid);
        if new && flags.write {
            // Made just now by this descriptor (whether or not the application asked for
            // O_EXCL, the create was exclusive): its mode and times may change behind its
            // writes (see `setattr_behind`).
            if let Some(f) = self.files.lock().unwrap().get(&fh) {
                let kind = attrs.mode.unwrap_or(libc::S_IFREG) & libc::S_IFMT;
                f.set_created(Attrs {
                    mode: Some(kind | u32::from(entry.attr.perm)),
                    ..attrs
                });
            }
        }
        Ok((entry, fh))
    }

    /// The owner a file made as `name` in `parent` would get, if the mount vouches that
    /// there is no such name (see `MetaCache::made_dir_lacks`) and the create may be
    /// answered early; it then counts as on its way.
    fn vouched_absent(&self, parent: Ino, name: &OsStr) -> Option<(u32, u32)> {
        let owner = self.cache.lock().unwrap().made_dir_lacks(parent, name)?;
        self.creates_behind.begin(parent, name).then_some(owner)
    }

    /// A create answered before the server has made the file, as a local filesystem
    /// answers from memory: in a directory made through the mount, where it vouches the
    /// name is free (`vouched_absent`). Extracting an archive or checking out a tree makes
    /// one file after another in new directories, and each create that waits for its OPEN
    /// costs a round trip, the server's file creation included: `tar` spends it now on
    /// the file's writes instead. The OPEN (exclusive, as every create here) goes out at
    /// once; the descriptor's handle is not known until its answer (`OpenFile::pending`),
    /// and whatever needs it waits: its writes are queued behind it (and answered as ever,
    /// write-behind), its flush, fsync and close wait for it, and so do a `fchmod` and a
    /// `futimens` that leaves a time as it is. So does what could overtake it on another
    /// channel, or show attributes made up here: a lookup of the name, a listing of the
    /// directory, a change or `fsync` of the directory, `rename`, `link`, `rmdir`, and a
    /// `stat`, `open`, `access`, `unlink` or change by name of the file (`create_landed`).
    /// The kernel is told to keep neither the entry nor the attributes it is answered with.
    ///
    /// A create without `O_EXCL` whose OPEN finds a regular file made under the name on the
    /// server's side meanwhile opens that file, as open(2) would. If the server refuses the
    /// OPEN otherwise (an `O_EXCL` create finding the name taken, its disk full, permissions
    /// changed there), the descriptor's writes, its flush and close
    /// fail (EIO), like a write-behind that failed; nothing is written anywhere, and the
    /// name is looked up again, as another inode. What an application cannot learn this way is
    /// whether an `O_EXCL` create won against a creator on the server's side in that
    /// instant (its `close` fails instead of its `open`); the mount never answers early in
    /// a directory it did not make itself, and never once the listing kept since is gone.
    #[allow(clippy::too_many_arguments)]
    fn create_early(
        self: &Arc<Self>,
        parent: Ino,
        name: &OsStr,
        path: PathBuf,
        flags: OpenFlags,
        perm: u32,
        owner: (u32, u32),
        opener: u32,
    ) -> (Entry, u64) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as crate::remote::Seconds);
        let made_up = Attrs {
            size: Some(0),
            uid: Some(owner.0),
            gid: Some(owner.1),
            mode: Some(libc::S_IFREG | perm),
            atime: Some(now),
            mtime: Some(now),
        };
        let since = {
            let mut cache = self.cache.lock().unwrap();
            let since = cache.now();
            cache.name_added(
                parent,
                DirEntry {
                    name: name.to_os_string(),
                    attrs: made_up,
                    nlink: None,
                },
            );
            since
        };
        self.dir_names_changed(parent);
        let attr = self.remember(parent, name, made_up, Some(1), since);
        let ino = attr.ino;
        self.enforcer.quota.created(ino);
        let asked_exclusive = flags.exclusive;
        let flags = OpenFlags {
            exclusive: true,
            ..flags
        };
        let (fh, file, pending) = self.register_pending_file(ino, flags, opener);
        // Its times are the server's to give: until they come, `stat` asks (and waits).
        file.set_created(Attrs {
            atime: None,
            mtime: None,
            ..made_up
        });
        let landing = CreateLanding {
            fs: self.clone(),
            parent,
            name: name.to_os_string(),
        };
        self.runtime().spawn(async move {
            let (fs, name) = (&landing.fs, &landing.name);
            // Set when the name was taken on the server and that file opened instead.
            let mut existing = false;
            let outcome = match fs.remote.open_stat(&path, flags, perm).await {
                Ok((handle, mut attrs)) => {
                    if attrs.mode.is_some_and(|m| m & 0o7777 != perm) {
                        // The server's umask: put the mode asked for, before any write.
                        let set = SetAttrs {
                            perm: Some(perm),
                            ..Default::default()
                        };
                        if fs.remote.fsetstat(&handle, set).await.is_ok() {
                            attrs.mode = Some(libc::S_IFREG | perm);
                        }
                    }
                    Ok((handle, attrs))
                }
                // Not asked to be exclusive (`>`, `open(O_CREAT|O_TRUNC)`): a file made under
                // the name on the server's side meanwhile is opened as open(2) would open it,
                // truncated if asked, its mode left as it is. Only a regular file: never
                // through a link the server put there. (SFTP v3 says only "failure" when an
                // exclusive create finds the name taken; anything else fails here again.)
                Err(RemoteError::Status(Status::Failure, why)) if !asked_exclusive => {
                    match fs.remote.lstat(&path).await {
                        Ok(a) if a.file_type() == FileKind::File => {
                            existing = true;
                            let flags = OpenFlags {
                                exclusive: false,
                                create: false,
                                ..flags
                            };
                            fs.remote.open_stat(&path, flags, perm).await
                        }
                        _ => Err(RemoteError::Status(Status::Failure, why)),
                    }
                }
                Err(e) => Err(e),
            };
            // What waits for the handle (and for `creates_behind`) finds the caches as the
            // outcome left them: they are brought up to date first.
            match outcome {
                Ok((handle, attrs)) => {
                    match existing && attrs.size != Some(0) {
                        // Another's file, with its own content: not the empty file this
                        // descriptor assumed it made (its size is the server's to say).
                        true => file.update_created(None),
                        false => file.landed(&attrs),
                    }
                    fs.attrs_changed_as_of(ino, attrs, since);
                    pending.opened(Ok(handle));
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), "create answered early: {e}");
                    // Never a connection error, which would have the name opened again. (A
                    // lost connection may have left the file made, and empty, on the server.)
                    let e = match e {
                        e if e.is_connection_error() => RemoteError::Status(
                            Status::Failure,
                            format!("the create may not have been carried out: {e}"),
                        ),
                        e => e,
                    };
                    // The name is not this inode's: whatever the server has under it (maybe
                    // another's file) is looked up afresh, as a new inode.
                    fs.inodes.lock().unwrap().detach_name(parent, name);
                    fs.name_uncertain(parent, name);
                    // Nothing of it is cached: it does not exist.
                    fs.attrs_changed(ino, None);
                    fs.cache.lock().unwrap().forget_attrs(ino);
                    file.latch(e.clone());
                    // Refused from now on (`OpenFile::never_opened`): later writes are not
                    // charged to the quota, and what was is given back.
                    pending.opened(Err(e));
                    let charged = fs.enforcer.quota.size_of(ino).unwrap_or(0);
                    fs.enforcer.quota.release_entry(Some(ino), charged);
                }
            }
        });
        // Made up here (the times, and whether the server makes it at all): the kernel is
        // told to keep neither the entry nor the attributes (fuser gives a create's reply
        // one TTL for both), and asks again, which waits for the OPEN. A lookup answers with
        // the usual TTLs from then on.
        let entry = Entry {
            attr,
            entry_ttl: Duration::ZERO,
            attr_ttl: Duration::ZERO,
        };
        (entry, fh)
    }

    /// Wait until every unlink and create answered early that was on its way has landed,
    /// and then the unlinks answered meanwhile (an unlink that returned before this returns
    /// goes before what comes next; one that starts later is at the same time as it). Never
    /// for what begins later: a steady stream of them (parallel extractions) must not starve
    /// a rename.
    async fn names_settled(&self) {
        self.removes_behind.all_settled().await;
        self.creates_behind.all_settled().await;
        self.removes_behind.all_settled().await;
    }

    /// Wait until the OPEN of a create of `ino` answered early has its answer (and its
    /// outcome is in the caches).
    async fn create_landed(&self, ino: Ino) {
        let files: Vec<_> = {
            let files = self.files.lock().unwrap();
            files.values().filter(|f| f.ino == ino).cloned().collect()
        };
        for f in files {
            f.handle_version().await;
        }
    }

    /// mknod(2). A regular file is created as `create` with `O_EXCL` would (sshfs does the
    /// same), with the same read-only and quota checks, and closed again. FIFOs, sockets
    /// and device nodes (number `rdev`), which SFTP cannot create, are kept by the mount
    /// itself (see `specials`), but for an overlay's whiteout (`EPERM`).
    pub async fn mknod(
        self: &Arc<Self>,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        rdev: u32,
        umask: u32,
        caller: Caller,
    ) -> FsResult<Entry> {
        let _mutating = self.check_writable("mknod")?;
        self.dir_inside(parent).await?;
        self.removes_behind.all_settled().await;
        let perm = (mode & !umask & 0o7777) as u16;
        if let Some(node) = Node::of_mode(mode, rdev) {
            if node.is_whiteout() {
                // Kept only here, a whiteout would be lost at the unmount and the name it
                // hides would come back (fuse-overlayfs, rootless podman); refused, the
                // overlay falls back to whiteout files, which the server keeps.
                return Err(FsError::new(
                    libc::EPERM,
                    "mknod of a whiteout (character device 0/0): SFTP cannot make one",
                ));
            }
            return self.make_special(parent, name, node, perm, caller).await;
        }
        // (The kernel turns a type of 0 into S_IFREG before it asks, and refuses the others.)
        let kind = mode & libc::S_IFMT;
        if kind != libc::S_IFREG && kind != 0 {
            return Err(FsError::new(
                libc::EINVAL,
                format!("mknod of type {kind:o}: not a type mknod(2) makes"),
            ));
        }
        let req = OpenRequest {
            flags: libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            pid: 0,
            caller,
        };
        let (entry, fh) = self
            .create_maybe_early(
                parent,
                name,
                libc::S_IFREG | (mode & 0o7777),
                umask,
                req,
                false,
            )
            .await?;
        // Nothing was written: an error of this close is of no interest to anyone.
        let _ = self.release(fh).await;
        Ok(entry)
    }

    fn snapshot(&self, fh: u64) -> Option<Arc<Snapshot>> {
        self.snapshots
            .lock()
            .unwrap()
            .get(&fh)
            .map(|(_, s)| s.clone())
    }

    /// A descriptor opened from a snapshot reads from it while the file is as it was: not
    /// changed through the mount since (another descriptor wrote or truncated it) and not
    /// older than the attribute TTL. Past that it is given a server handle, under the same
    /// descriptor number, and reads go to the server as for any other open file.
    async fn read_snapshot(&self, fh: u64) -> FsResult<Option<Arc<Snapshot>>> {
        let Some((ino, snap)) = self.snapshots.lock().unwrap().get(&fh).cloned() else {
            return Ok(None);
        };
        if !snap.deferred && self.snapshot_current(ino, &snap, self.attr_ttl_for(ino)) {
            return Ok(Some(snap));
        }
        self.snapshot_to_handle(fh, ino).await?;
        Ok(None)
    }

    /// Whether `snap` is still `ino` as it is: younger than `ttl` and not changed through the
    /// mount since it was planned.
    fn snapshot_current(&self, ino: Ino, snap: &Snapshot, ttl: Duration) -> bool {
        snap.planned.elapsed() < ttl && !self.cache.lock().unwrap().changed_since(ino, snap.since)
    }

    /// `ino`'s name is about to go (unlink, replaced by a rename): descriptors of it reading
    /// from a snapshot get a server handle now, while it can be opened by that name. The
    /// handle keeps it readable afterwards, as for any file open when it is removed (the
    /// snapshot could not tell its own name going from a change of its data).
    async fn snapshots_to_handles(&self, ino: Option<Ino>) {
        let Some(ino) = ino else { return };
        let fhs: Vec<u64> = self
            .snapshots
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, (i, _))| *i == ino)
            .map(|(fh, _)| *fh)
            .collect();
        for fh in fhs {
            if let Err(e) = self.snapshot_to_handle(fh, ino).await {
                tracing::debug!(ino, fh, "no server handle for a fetched-ahead copy: {e}");
            }
        }
    }

    /// Give descriptor `fh` of `ino`, reading from a snapshot, a server handle under the same
    /// number.
    async fn snapshot_to_handle(&self, fh: u64, ino: Ino) -> FsResult<()> {
        let remote = self.remote.clone();
        let opened = self
            .open_by_name(
                ino,
                |path| {
                    let remote = remote.clone();
                    async move { remote.open(&path, OpenFlags::read_only(), 0).await }
                },
                |h| file::close_in_background(&self.remote, vec![h]),
            )
            .await;
        let handle = match opened {
            Ok((h, _)) => h,
            Err(e) => return Err(remote_err(Op::Open, &e, "open")),
        };
        {
            // Registered under the snapshots' lock: a read that no longer finds the snapshot
            // finds the open file.
            let mut snapshots = self.snapshots.lock().unwrap();
            if snapshots.remove(&fh).is_some() {
                // (Read only: no write of it can fail, so who closes it does not matter.)
                self.register_file_at(fh, ino, OpenFlags::read_only(), handle, 0);
                return Ok(());
            }
        }
        // Another read gave it a server handle first, or it was released meanwhile.
        let _ = self.remote.close(&handle).await;
        if self.files.lock().unwrap().contains_key(&fh) {
            Ok(())
        } else {
            Err(FsError::new(libc::EBADF, format!("no open file {fh}")))
        }
    }

    /// Open `ino` for reading from a snapshot fetched ahead, if one is there and still good
    /// (the checks are listed in `prefetch`); and, when its directory is being read through
    /// file after file, fetch the next small files of it. None: open on the server as usual.
    async fn open_fetched_ahead(self: &Arc<Self>, ino: Ino) -> Option<u64> {
        let ttl = self.attr_ttl_for(ino);
        if ttl.is_zero() || self.cache_config().dir_ttl.is_zero() {
            return None;
        }
        let (dir, name) = {
            let inodes = self.inodes.lock().unwrap();
            if inodes.kind(ino) != Some(FileKind::File) {
                return None;
            }
            inodes.names_of(ino).into_iter().next()?
        };
        let (slot, more) = self.small_files.opened(dir, &name);
        if more {
            self.fetch_ahead(dir, ttl);
        }
        // A fetch still running is waited for; one not started yet is not (the permit it
        // waits for may be far off): the open goes to the server.
        let snap = slot?.get_or_init(|| async { None }).await.clone()?;
        // Nor may a name of its directory have changed (the copy was fetched by name).
        if !self.snapshot_current(ino, &snap, ttl) {
            return None;
        }
        {
            let mut cache = self.cache.lock().unwrap();
            if cache.changed_since(dir, snap.since) {
                return None;
            }
            if let Some(c) = cache.get_attrs(ino) {
                if c.attrs.size != snap.attrs.size || c.attrs.mtime != snap.attrs.mtime {
                    return None;
                }
            }
        }
        let fh = self.alloc_fh();
        self.snapshots.lock().unwrap().insert(fh, (ino, snap));
        self.stats
            .opens_fetched_ahead
            .fetch_add(1, Ordering::Relaxed);
        Some(fh)
    }

    /// Fetch the next small files of `dir`'s cached listing in the background (see
    /// `prefetch`). Files with an open descriptor are left alone: a write of ours to them
    /// may still be on its way.
    fn fetch_ahead(self: &Arc<Self>, dir: Ino, ttl: Duration) {
        self.fetch_ahead_up_to(dir, ttl, prefetch::AHEAD_PER_DIR);
    }

    /// While a tool reads through a tree (see `prefetch`), the first small files of a
    /// subdirectory it has been handed, before it goes in: on a walk down, the files of the
    /// next directory are on their way while it reads this one's (the rest are fetched when
    /// it opens the directory).
    fn first_files_ahead(self: &Arc<Self>, dir: Ino) {
        self.files_ahead_while_reading(dir, prefetch::FIRST_FILES_AHEAD);
    }

    /// Up to `max` small files of `dir` fetched ahead, if a tool is reading through the tree
    /// (see `prefetch`) and attributes are cached.
    fn files_ahead_while_reading(self: &Arc<Self>, dir: Ino, max: usize) {
        let ttl = self.cache_config().attr_ttl;
        if !ttl.is_zero() && self.small_files.listing() {
            self.fetch_ahead_up_to(dir, ttl, max);
        }
    }

    fn fetch_ahead_up_to(self: &Arc<Self>, dir: Ino, ttl: Duration, max: usize) {
        let Ok(dir_path) = self.path_of(dir) else {
            return;
        };
        let (listing, since) = {
            let mut cache = self.cache.lock().unwrap();
            let since = cache.now();
            match cache.get_dir(dir) {
                Some(l) => (l, since),
                None => return,
            }
        };
        let open: std::collections::HashSet<Ino> =
            self.files.lock().unwrap().values().map(|f| f.ino).collect();
        let planned = {
            let inodes = self.inodes.lock().unwrap();
            self.small_files
                .plan_up_to(dir, &listing, ttl, max, |name| {
                    inodes.child(dir, name).is_some_and(|i| open.contains(&i))
                })
        };
        for p in planned {
            let fs = self.clone();
            let path = dir_path.join(&p.name);
            self.rt.spawn(async move {
                let Ok(_permit) = fs.file_fetches.clone().acquire_owned().await else {
                    return;
                };
                let snap = p
                    .slot
                    .get_or_init(|| fs.fetch_small_file(&path, p.attrs, since))
                    .await;
                if snap.is_none() {
                    fs.small_files.failed(dir, &p.name, &p.slot);
                }
            });
        }
    }

    /// OPEN, READ and CLOSE (not waited for) of a small file listed with `attrs`; None unless
    /// the server gave exactly the listed size.
    async fn fetch_small_file(
        &self,
        path: &Path,
        attrs: Attrs,
        since: u64,
    ) -> Option<Arc<Snapshot>> {
        let planned = std::time::Instant::now();
        let size = attrs.size?;
        let h = self
            .remote
            .open(path, OpenFlags::read_only(), 0)
            .await
            .ok()?;
        // One byte more than listed: a file that grew since the listing is noticed.
        let want = (size + 1).min(u64::from(self.remote.limits().max_read)) as u32;
        let data = self.remote.read(&h, 0, want).await;
        file::close_in_background(&self.remote, vec![h]);
        let data = data.ok()?;
        (data.len() as u64 == size && u64::from(want) > size).then(|| {
            Arc::new(Snapshot {
                data,
                attrs,
                planned,
                since,
                deferred: false,
            })
        })
    }

    /// FSTAT through a descriptor's handle (waiting for it, if its create was answered
    /// early).
    async fn fstat_of(&self, file: &OpenFile<R>) -> Result<Attrs, RemoteError> {
        self.remote.fstat(&file.handle().await?).await
    }

    fn file(&self, fh: u64) -> FsResult<Arc<OpenFile<R>>> {
        self.files
            .lock()
            .unwrap()
            .get(&fh)
            .cloned()
            .ok_or_else(|| FsError::new(libc::EBADF, format!("no open file {fh}")))
    }

    /// Reopen a file whose handle (at version `seen`) belongs to a lost connection: the new
    /// handle and its version. Requests that find the same stale handle at once share one
    /// reopen. A connection error means there is no connection (yet); any other, that the
    /// file cannot be opened again (it has no name any more, or the server refuses).
    pub(crate) async fn reopen(
        &self,
        file: &Arc<OpenFile<R>>,
        seen: u64,
    ) -> Result<(R::Handle, u64), RemoteError> {
        file.reopen_with(seen, || async {
            let (remote, flags) = (self.remote.clone(), file.flags.for_reopen());
            let opened = self
                .open_by_name(
                    file.ino,
                    |path| {
                        let remote = remote.clone();
                        async move { remote.open(&path, flags, 0).await }
                    },
                    |h| file::close_in_background(&self.remote, vec![h]),
                )
                .await;
            match opened {
                Ok((h, path)) => {
                    tracing::info!(path = %path.display(), "reopened file after reconnect");
                    Ok(h)
                }
                Err(e) => {
                    tracing::debug!(ino = file.ino, "reopen after reconnect: {e}");
                    Err(e)
                }
            }
        })
        .await
    }

    /// Open the live file `ino` by the path the mount knows it by (`open` does the OPEN, or
    /// several; `discard` closes what it opened), keeping the result only if no rename or
    /// unlink through the mount can have put another file under that name between the path
    /// lookup and the answer (see `names`): otherwise it is discarded and the file opened
    /// again under its new name. A file with no name any more (removed, or replaced by a
    /// rename) cannot be opened: `NoSuchFile`.
    async fn open_by_name<T, F, Fut>(
        &self,
        ino: Ino,
        open: F,
        discard: impl Fn(T),
    ) -> Result<(T, PathBuf), RemoteError>
    where
        F: Fn(PathBuf) -> Fut,
        Fut: std::future::Future<Output = Result<T, RemoteError>>,
    {
        // Each try that is discarded means a rename or unlink through the mount of this very
        // name (or of a directory above it) started meanwhile; a file whose name keeps
        // changing that fast is given up on.
        const TRIES: usize = 8;
        let no_name = |e: FsError| RemoteError::Status(Status::NoSuchFile, e.context);
        for _ in 0..TRIES {
            if self.names.is_uncertain(ino) {
                return Err(RemoteError::Status(
                    Status::Failure,
                    format!(
                        "inode {ino}: a rename or unlink of it was cut off by a lost \
                         connection, so the name it had may lead to another file now"
                    ),
                ));
            }
            let path = self.path_of(ino).map_err(no_name)?;
            let mark = self.names.quiet_for(&path).await;
            if self.path_of(ino).map_err(no_name)? != path {
                // A change that was on its way has moved it: look again.
                continue;
            }
            match open(path.clone()).await {
                Ok(opened) if !self.names.touched_since(mark, &path) => return Ok((opened, path)),
                Ok(opened) => discard(opened),
                Err(e) if !self.names.touched_since(mark, &path) => return Err(e),
                // The name may have moved meanwhile: look it up again.
                Err(_) => {}
            }
        }
        Err(RemoteError::Status(
            Status::Failure,
            format!("inode {ino}: its name kept changing while it was being opened"),
        ))
    }

    /// Before a rename or unlink through the mount changes the name of `ino`: writes of it
    /// that a lost connection took are sent again first, by the name they were written under,
    /// in program order (the file renamed over it or created in its place must not get them).
    async fn settle_lost_writes(self: &Arc<Self>, ino: Option<Ino>) {
        if let Some(ino) = ino.filter(|&i| self.has_lost_writes(i)) {
            self.drain_inode(ino).await;
        }
    }

    /// Whether writes of `ino` that a lost connection took are waiting to be sent again (all
    /// its descriptors share one write stream).
    fn has_lost_writes(&self, ino: Ino) -> bool {
        self.writers_of(ino)
            .first()
            .is_some_and(|f| f.stream.has_lost_writes())
    }

    /// How many bytes to read along with the open of `ino` (see `Remote::open_read`), if any, and
    /// whether to ask its attributes along too. A small file opened for reading is read right away,
    /// by nearly every tool that opens one (`git`'s objects, a compiler's headers, an interpreter's
    /// modules): with the READ sent behind the OPEN that is one round trip for both instead of two.
    /// Only a regular file of known size up to `prefetch::SMALL_FILE_MAX` (one READ), or of unknown
    /// size, with no write of ours to it on its way (which the READ would not wait for; one made
    /// after the open began shows as a change, see `read_along_for`), within [`READ_ALONG_BYTES`]
    /// mount-wide. One byte more than its size is asked for, so a short answer says where the file
    /// ends. What was read is used for the kernel's reads while younger than the attribute TTL and
    /// nothing changed the file through the mount ([`Fs::read_along_for`]): as fresh as a read
    /// right after the open.
    /// The size is not known after a change through the mount (a file written and closed, then read
    /// back: an editor's save, a tool's output) or past the TTL, and the kernel then asks the
    /// attributes right after the open (`fstat`, or its own check before a read): they come along
    /// (an FSTAT of the new handle), and as much is read as a small file holds. That makes open,
    /// `fstat` and first read one round trip instead of three.
    fn read_along_len(&self, ino: Ino) -> Option<(u32, bool)> {
        if self.attr_ttl_for(ino).is_zero()
            || self.inodes.lock().unwrap().kind(ino) != Some(FileKind::File)
        {
            return None;
        }
        let known = {
            let mut cache = self.cache.lock().unwrap();
            cache.get_attrs(ino).and_then(|c| c.attrs.size)
        };
        let (size, stat) = match known {
            Some(size) => (size, false),
            None => (prefetch::SMALL_FILE_MAX, true),
        };
        if size > prefetch::SMALL_FILE_MAX || !self.writers_of(ino).is_empty() {
            return None;
        }
        let len = (size + 1).min(u64::from(self.remote.limits().max_read));
        let held: usize = self
            .read_along
            .lock()
            .unwrap()
            .values()
            .map(|r| r.data.len())
            .sum();
        (held as u64 + len <= READ_ALONG_BYTES).then_some((len as u32, stat))
    }

    /// The kernel's read of `size` bytes at `offset` through `fh`, from the bytes read along
    /// with its open, if they are still good and hold it (or the file ends within them).
    /// Once a read reaches their end, or goes past them, they are dropped.
    fn read_along_for(&self, fh: u64, offset: u64, size: u32) -> Option<Bytes> {
        let mut along = self.read_along.lock().unwrap();
        let r = along.get(&fh)?;
        // A file that may be another name of this one changed through the mount since the
        // open began: the server may have had the change or not when these bytes were read.
        // (A noted file is also marked changed by such a change; this covers one whose link
        // count is not known, which is not noted.)
        let shared_changed = || {
            self.shared_changes() != r.shared_since
                && self.inodes.lock().unwrap().may_share_data(r.ino)
        };
        let good = Instant::now() < r.until
            && !self.cache.lock().unwrap().changed_since(r.ino, r.since)
            && !shared_changed();
        let len = r.data.len() as u64;
        let end = offset.saturating_add(u64::from(size));
        if !good || (end > len && !r.eof) {
            along.remove(&fh);
            return None;
        }
        let out = r
            .data
            .slice(offset.min(len) as usize..end.min(len) as usize);
        if end >= len {
            along.remove(&fh);
        }
        Some(out)
    }

    /// The data comes as the SFTP reply held it when one READ answers it: not copied.
    pub async fn read(self: &Arc<Self>, fh: u64, offset: u64, size: u32) -> FsResult<Bytes> {
        if let Some(data) = self.read_along_for(fh, offset, size) {
            self.stats
                .bytes_read
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            return Ok(data);
        }
        if let Some(snap) = self.read_snapshot(fh).await? {
            let len = snap.data.len() as u64;
            let start = offset.min(len) as usize;
            let end = offset.saturating_add(u64::from(size)).min(len) as usize;
            self.stats
                .bytes_read
                .fetch_add((end - start) as u64, Ordering::Relaxed);
            return Ok(snap.data.slice(start..end));
        }
        let file = self.file(fh)?;
        // Read-your-writes: writes of this file acknowledged to any application (on any
        // handle, which may be on another SFTP channel) land before the read is carried out.
        self.ready_behind_writes(&file).await;
        self.with_handle(&file, |h| async move {
            self.read_chunks(&h, offset, size).await
        })
        .await
        .map_err(|e| remote_err(Op::Read, &e, "read"))
        .inspect(|data| {
            self.stats
                .bytes_read
                .fetch_add(data.len() as u64, Ordering::Relaxed);
        })
    }

    /// Run an operation that is safe to repeat on the file's handle. If the handle belongs to
    /// a connection that is gone (replaced by a reconnect, or dropped under the request), the
    /// file is reopened by its path (which waits for the reconnect) and the operation runs
    /// once more, so an application never sees the drop. Without `reconnect` the reopen
    /// fails and the error stands.
    ///
    /// Writes of the file may have been on the lost connection: they are sent again
    /// (`file::catch_up`), and the operation runs once they are answered. It may have been
    /// sent right behind them on their handle without waiting (`Fs::ready_behind_writes`),
    /// and on the new connection nothing orders it after them any more.
    async fn with_handle<T, F, Fut>(
        self: &Arc<Self>,
        file: &Arc<OpenFile<R>>,
        op: F,
    ) -> Result<T, RemoteError>
    where
        F: Fn(R::Handle) -> Fut,
        Fut: std::future::Future<Output = Result<T, RemoteError>>,
    {
        let (handle, version) = file.versioned_handle().await?;
        match op(handle).await {
            Err(RemoteError::StaleHandle | RemoteError::Disconnected(_)) => {
                let (mut handle, _) = self.reopen(file, version).await.map_err(|e| {
                    RemoteError::Disconnected(format!("cannot reopen after reconnect: {e}"))
                })?;
                if file.writes_pending() {
                    self.drain_inode(file.ino).await;
                    handle = file.handle().await?;
                }
                op(handle).await
            }
            r => r,
        }
    }

    /// Read `size` bytes at `offset` as several server-sized requests in flight at once.
    async fn read_chunks(
        &self,
        handle: &R::Handle,
        offset: u64,
        size: u32,
    ) -> Result<Bytes, RemoteError> {
        let max = self.remote.limits().max_read.max(4096);
        if size <= max {
            return self.remote.read(handle, offset, size).await;
        }
        let mut set = tokio::task::JoinSet::new();
        let mut at = 0u32;
        let mut index = 0usize;
        while at < size {
            let n = (size - at).min(max);
            let remote = self.remote.clone();
            let handle = handle.clone();
            let off = offset + at as u64;
            set.spawn(async move { (index, n, remote.read(&handle, off, n).await) });
            at += n;
            index += 1;
        }
        let mut parts: Vec<Option<(u32, Bytes)>> = vec![None; index];
        while let Some(joined) = set.join_next().await {
            let (i, n, result) =
                joined.map_err(|e| RemoteError::Protocol(format!("read task: {e}")))?;
            parts[i] = Some((n, result?));
        }
        let mut out = Vec::with_capacity(size as usize);
        for (n, data) in parts.into_iter().flatten() {
            out.extend_from_slice(&data);
            if (data.len() as u32) < n {
                // End of file (or a short read): what follows is not contiguous.
                break;
            }
        }
        Ok(out.into())
    }

    /// Queue a write. The ordering point is this synchronous call: writes are queued in the
    /// order the FUSE threads call it, which is the order the kernel sent them.
    pub fn write(
        self: &Arc<Self>,
        fh: u64,
        offset: u64,
        data: &[u8],
    ) -> impl std::future::Future<Output = FsResult<u32>> + Send + 'static {
        self.write_from(fh, offset, data, false)
    }

    /// [`Fs::write`], of pages of the kernel's page cache if `page_writeback` (the kernel
    /// writing back what a shared writable mapping dirtied: `FUSE_WRITE_CACHE`).
    pub fn write_from(
        self: &Arc<Self>,
        fh: u64,
        offset: u64,
        data: &[u8],
        page_writeback: bool,
    ) -> impl std::future::Future<Output = FsResult<u32>> + Send + 'static {
        let this = self.clone();
        let queued = (|| {
            let _mutating = self.check_writable_unless("write", page_writeback)?;
            let file = self.file(fh)?;
            if let Some(e) = file.never_opened() {
                // Its create failed: nothing to write to, nothing to charge.
                return Err(remote_err(Op::Write, &e, "create answered early"));
            }
            if !data.is_empty() && past_max_offset(offset, data.len() as u64) {
                return Err(FsError::new(
                    libc::EFBIG,
                    format!(
                        "write of {} bytes at {offset}: past the largest offset",
                        data.len()
                    ),
                ));
            }
            // Reserve the growth now, in order with the other writes: what does not fit is
            // not written (a short write), and a write of which nothing fits gets ENOSPC.
            let fits = self
                .enforcer
                .quota
                .reserve_write(file.ino, offset, data.len() as u64)
                .map_err(|_| quota_used_up())? as usize;
            if let Some(e) = file.never_opened() {
                // Refused while this write was being charged: given back (the create's
                // failure has given back what was charged before).
                self.enforcer.quota.unreserve(file.ino, 0);
                self.enforcer.quota.forget(file.ino);
                return Err(remote_err(Op::Write, &e, "create answered early"));
            }
            let n = fits.min(data.len());
            let data = Bytes::copy_from_slice(&data[..n]);
            let Some(answer) = file.submit_write(self, offset, data) else {
                return Err(FsError::new(libc::EBADF, "file is being closed"));
            };
            self.data_changed(file.ino);
            self.attrs_changed(file.ino, None);
            Ok((file, answer, n as u32))
        })();
        async move {
            let (file, answer, n) = queued?;
            // Answered when queued (see core/file.rs): no hand-off to the writer task first.
            let Some(rx) = answer else { return Ok(n) };
            match rx.await {
                Ok(Ok(n)) => Ok(n),
                Ok(Err(failure)) => Err(this.write_failure(&file, failure).await),
                Err(_) => Err(FsError::new(libc::EIO, "writer stopped")),
            }
        }
    }

    /// A close(2) by the thread that opened `fh`: see [`Fs::flush_from`].
    pub async fn flush(self: &Arc<Self>, fh: u64) -> FsResult<()> {
        self.flush_from(fh, 0).await
    }

    /// Every close(2) of a copy of the descriptor, by thread `pid` (0: the opener): wait for
    /// the file's writes and report a failure of those made through it. The opener's close
    /// reports every failure it has not been told of; anyone else's (a child that inherited
    /// the descriptor closes its copy at exec, maybe in the middle of the opener's writes)
    /// one the writes have not been told of. Either way the descriptor's writes may go on
    /// afterwards, and what the opener's close and fsync have not been told of they still
    /// report (see [`file::Told`]).
    pub async fn flush_from(self: &Arc<Self>, fh: u64, pid: u32) -> FsResult<()> {
        if self.snapshot(fh).is_some() {
            return Ok(());
        }
        let file = self.file(fh)?;
        // Created early: whether the server made it is known once its OPEN is answered, and
        // a failure is latched for the tell below.
        file.handle_version().await;
        self.attrs_behind_writes(&file).await;
        file.settle().await;
        if file.flags.write {
            self.written_through_settled(&file).await;
        }
        let opener =
            pid == 0 || file.opener == 0 || pid == file.opener || same_process(pid, file.opener);
        let failure = match opener {
            true => file.tell(Told::Opener, &[Told::Opener, Told::Writes]),
            false => file.tell(Told::Writes, &[Told::Writes]),
        };
        match failure {
            Some(failure) => {
                file.file_failure_seen();
                Err(self.write_failure(&file, failure).await)
            }
            None => Ok(()),
        }
    }

    /// At a close that waits for writes on their way, all through `file`'s handle (see
    /// [`Fs::goes_behind_writes`]): an FSTAT sent now is carried out after them, and answered
    /// right after them, within the wait. So the attributes the writes leave, which only the
    /// server knows (it sets the mtime as each lands), are known when the close returns: the
    /// `stat` that so often follows (make, pip and Python's bytecode, git, an editor's save)
    /// needs no round trip of its own. They are kept only if nothing else happened meanwhile:
    /// no write sent again after a lost connection, none failed, no other change of the file
    /// through the mount. Not for an `O_APPEND` descriptor: appends (a shell's `>>`, a log)
    /// are seldom `stat`ed after their close, and the FSTAT's answer, after the WRITE's, was
    /// a tenth of each `echo >> log`; a `stat` after one asks the server.
    async fn attrs_behind_writes(self: &Arc<Self>, file: &Arc<OpenFile<R>>) {
        if !file.flags.write || file.flags.append || !file.writes_pending() {
            return;
        }
        // (Writes answered early may still wait for the writer task.)
        file.all_sent(self).await;
        // Read before the check: whatever changed the file before is either still on its way
        // (and fails the check) or was sent ahead of the FSTAT through this handle.
        let since = self.cache.lock().unwrap().now();
        let sent_again = self.stats.writes_sent_again.load(Ordering::Relaxed);
        // All answered already: an FSTAT now would be a round trip of its own.
        if !file.writes_pending() || !self.goes_behind_writes(file) {
            return;
        }
        let attrs = self.fstat_of(file).await;
        file.settle().await;
        let clean = self.stats.writes_sent_again.load(Ordering::Relaxed) == sent_again
            && file.pending_failure().is_none();
        let Ok(attrs) = attrs.map_err(|e| tracing::debug!("fstat behind writes: {e}")) else {
            return;
        };
        if clean
            && attrs.file_type() == FileKind::File
            // (Asked after the writes, through the same handle: their landing is in it.)
            && self.cache_attrs_checked(file.ino, CachedAttrs { attrs, nlink: None }, since, false)
        {
            file.attrs_settled_at.store(since, Ordering::Relaxed);
            self.stats
                .attrs_along_writes
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The error to report for a failed write of `file` that would have ended at `end`.
    async fn write_failure(&self, file: &OpenFile<R>, (err, end): (RemoteError, u64)) -> FsError {
        let path = self.path_of(file.ino).unwrap_or_else(|_| self.root.clone());
        self.explain_sized(Op::Write, err, &path, end).await
    }

    pub async fn fsync(self: &Arc<Self>, fh: u64) -> FsResult<()> {
        let synced = self.fsync_writes(fh).await;
        let Ok(file) = self.file(fh) else {
            return synced;
        };
        // The server failed an early write-back of the file: what was written may not be on
        // its disk. Its own answer to this fsync may not say so (it tells one fsync per
        // descriptor open when the disk write failed, and this handle may be newer). Reported
        // once: by this fsync's own failure if it failed (the server told this handle).
        match self.early_write_back.fsynced(file.ino) {
            _ if synced.is_err() => synced,
            Some(e) => {
                let path = self.path_of(file.ino).unwrap_or_else(|_| self.root.clone());
                Err(FsError::new(
                    libc::EIO,
                    format!(
                        "fsync {}: the server failed to write the file to its disk ({e})",
                        path.display()
                    ),
                ))
            }
            None => Ok(()),
        }
    }

    /// fsync's writes: every earlier write answered, then the server's fsync of the handle.
    async fn fsync_writes(self: &Arc<Self>, fh: u64) -> FsResult<()> {
        // A descriptor reading from a snapshot has no server handle, but fsync is of the file,
        // which may have been written through the mount before (`sync FILE` after `cp`, whose
        // open of a file the kernel keeps the pages of is answered without the server): it is
        // given one, and the server's fsync goes through it as for any other descriptor.
        let snapshot_of = self.snapshots.lock().unwrap().get(&fh).map(|(ino, _)| *ino);
        if let Some(ino) = snapshot_of {
            self.snapshot_to_handle(fh, ino).await?;
        }
        let file = self.file(fh)?;
        // Whoever's close saw a failure first, fsync has not been told of it: it reports it,
        // and then the opener's close need not. So does a failure of a write through another
        // descriptor of the file, which only fsync reports here (and only once each).
        let fsync_failure = |file: &OpenFile<R>| {
            let own = file.tell(Told::Fsync, &[Told::Fsync, Told::Opener, Told::Writes]);
            let any = file.tell_file_failure();
            own.or(any)
        };
        if file.writes_pending() && self.goes_behind_writes(&file) {
            // The FSYNC goes out at once behind the writes on their handle, which the server
            // carries out first; its answer comes after theirs: one round trip, not two. If
            // anything is unusual on the way (it fails, or a lost connection made writes go
            // again, maybe after it), the ordinary way below is taken.
            let sent_again = self.stats.writes_sent_again.load(Ordering::Relaxed);
            let synced = match file.handle().await {
                Ok(handle) => self.remote.fsync(&handle).await,
                Err(e) => Err(e),
            };
            file.settle().await;
            if let Err(e @ RemoteError::Status(..)) = synced {
                // The server's fsync(2) failed (a disk error): reported, after a failed write
                // of the descriptor's. Not tried again below: on Linux a second fsync of the
                // same descriptor answers 0, the error having been told once.
                self.written_through_settled(&file).await;
                if let Some(failure) = fsync_failure(&file) {
                    return Err(self.write_failure(&file, failure).await);
                }
                return Err(self.fsync_refused(&file, e).await);
            }
            let clean = matches!(synced, Ok(()) | Err(RemoteError::Unsupported(_)))
                && self.stats.writes_sent_again.load(Ordering::Relaxed) == sent_again;
            if clean {
                self.written_through_settled(&file).await;
                return match fsync_failure(&file) {
                    Some(failure) => Err(self.write_failure(&file, failure).await),
                    None => Ok(()),
                };
            }
        }
        file.settle().await;
        if let Some(failure) = fsync_failure(&file) {
            return Err(self.write_failure(&file, failure).await);
        }
        // (Any write lost with an old connection was reported above.)
        // The descriptor's own handle is enough even when its writes were striped over extra
        // lanes (other handles, other sftp-server processes): settle() waited for all their
        // answers, so their data is in the server's page cache, and OpenSSH's
        // fsync@openssh.com is a plain fsync(2) of the handle's descriptor, which on Linux
        // (and POSIX: "all data for the open file descriptor" is the file's) writes back every
        // dirty page of the inode whichever descriptor dirtied it; NFS too flushes the
        // inode's pages on fsync.
        let remote = &self.remote;
        let result = self
            .with_handle(&file, |h| async move { remote.fsync(&h).await })
            .await;
        self.written_through_settled(&file).await;
        match result {
            Ok(()) | Err(RemoteError::Unsupported(_)) => Ok(()),
            Err(e) => Err(self.fsync_refused(&file, e).await),
        }
    }

    /// The server's fsync of `file` failed with `e`: the errno a local disk would give.
    async fn fsync_refused(&self, file: &OpenFile<R>, e: RemoteError) -> FsError {
        let path = self.path_of(file.ino).unwrap_or_else(|_| self.root.clone());
        self.explain(Op::Fsync, e, &path, None).await
    }

    /// Last close: the handle goes away. Errors cannot reach the application any more (the
    /// kernel ignores them); the opener's close reported them, if it was the last.
    pub async fn release(self: &Arc<Self>, fh: u64) -> FsResult<()> {
        self.read_along.lock().unwrap().remove(&fh);
        if self.snapshots.lock().unwrap().remove(&fh).is_some() {
            return Ok(());
        }
        let file = self.file(fh)?;
        // Created early: its outcome first (while the descriptor still shows, so that what
        // waits for the create by inode finds it), and a failure is told below.
        file.handle_version().await;
        let last = loop {
            // Times or a mode set by path right after the close (`shutil.copy2`) may come
            // while the kernel's RELEASE is on its way, and be queued behind the writes of
            // this descriptor, still the file's only one (see `setattr_behind`, which queues
            // under the files lock): they are waited for too, or they would go out on a
            // closed handle, or after a change by path that then showed the file without
            // them.
            let submitted = file.setattrs_submitted();
            file.settle().await;
            let mut streams = self.streams.lock().unwrap();
            let mut files = self.files.lock().unwrap();
            if file.setattrs_submitted() != submitted {
                continue;
            }
            files.remove(&fh);
            let last = !files.values().any(|f| f.ino == file.ino);
            if last {
                // Last descriptor of the file: its writer task may end.
                file.stream.stop();
                streams.remove(&file.ino);
                self.early_write_back.closed(file.ino);
            }
            break last;
        };
        let unreported = file.tell(Told::Opener, &[]);
        // The kernel forgot the inode while this descriptor was still open (a FORGET may
        // come before the RELEASE): what `forget` left for the last descriptor goes now.
        // (Not under the files lock: `forget` takes the inode table's, then that one.)
        if last && !self.inodes.lock().unwrap().contains(file.ino) {
            self.enforcer.quota.forget(file.ino);
            self.early_write_back.forget(file.ino);
        }
        if file.flags.write {
            // The server sets the final mtime as the last write lands: what was cached may
            // predate it, unless a close asked for them behind the last writes.
            let settled = file.attrs_settled_at.load(Ordering::Relaxed);
            let current =
                settled != 0 && !self.cache.lock().unwrap().changed_since(file.ino, settled);
            if current {
                // Other names of the file made on the server are told all the same: a read
                // of theirs that was on its way at the close may have kept older pages.
                self.shared_data_changed(file.ino);
            } else {
                self.attrs_changed(file.ino, None);
            }
        }
        // Nobody can see an error of CLOSE (the kernel ignores release errors and flush has
        // reported write failures), so do not make the application wait for it. The extra
        // lanes of striped writes are closed with the handle (nothing is in flight on them:
        // drained above).
        // (None if the create of a descriptor answered early failed: nothing to close.)
        let mut handles: Vec<_> = file.handle().await.into_iter().collect();
        handles.extend(file.take_lanes());
        file::close_in_background(&self.remote, handles);
        match unreported {
            Some((e, _)) => Err(remote_err(Op::Close, &e, "write before close")),
            None => Ok(()),
        }
    }

    /// Wait for every write in flight on every open file (before a downgrade or unmount).
    pub async fn flush_all(self: &Arc<Self>) -> FsResult<()> {
        let files: Vec<_> = self.files.lock().unwrap().values().cloned().collect();
        self.creates_behind.all_settled().await;
        self.removes_behind.all_settled().await;
        let mut first = match self.removes_behind.take_any_failure() {
            Some(e) => Err(e),
            None => Ok(()),
        };
        for f in files {
            // Left latched: the application's own close or fsync still reports it. (One
            // its close was told of already is not news.)
            f.settle().await;
            if let Some((e, _)) = f.tell(Told::Opener, &[]) {
                if first.is_ok() {
                    first = Err(remote_err(Op::Write, &e, "flush"));
                }
            }
        }
        first
    }

    // ---------------------------------------------------------------- directories

    /// Open a directory: its listing is taken now, or answered from a listing of it no older
    /// than the directory cache lifetime (`dir_ttl`, as sshfs's `dcache_timeout`), which the
    /// mount's own changes keep up to date. A listing another request is fetching (a prefetch,
    /// lookups) is waited for rather than asked for again.
    pub async fn opendir(self: &Arc<Self>, ino: Ino) -> FsResult<u64> {
        self.dir_inside(ino).await?;
        // Creates in it answered early: listed with the server's attributes, once they are in.
        self.creates_behind.dir_settled(ino).await;
        let path = self.path_of(ino)?;
        self.entering_dir(ino);
        if ino == ROOT_INO {
            // Learn (once) whether this is an AWCP export, before its entries are shown.
            self.is_resource_name(OsStr::new("")).await;
        }
        let cached = {
            let mut cache = self.cache.lock().unwrap();
            cache.get_dir(ino).map(|l| (l, cache.now()))
        };
        let (listing, since) = match cached {
            Some(hit) => hit,
            None => {
                match self.list_dir_shared(ino).await {
                    // (Unless a name in it changed through the mount since it was asked for.)
                    Some((l, listed)) if !self.cache.lock().unwrap().changed_since(ino, listed) => {
                        (l, listed)
                    }
                    // Failed: list again on our own, for the error and its explanation.
                    _ => self.list_dir(ino, &path).await?,
                }
            }
        };
        let fh = self.alloc_fh();
        let taken = self.cache.lock().unwrap().listing_taken(ino);
        self.dirs.lock().unwrap().insert(
            fh,
            Arc::new(DirHandle {
                ino,
                items: Mutex::new(Arc::new(
                    self.with_specials(&path, dir_items(&listing, since, taken)),
                )),
                started: AtomicBool::new(false),
            }),
        );
        self.files_ahead_while_reading(ino, prefetch::AHEAD_PER_DIR);
        Ok(fh)
    }

    /// List a directory on the server, keep the listing in the cache (it answers lookups) and
    /// return it with the change clock from before it was asked for.
    async fn list_dir(&self, ino: Ino, path: &Path) -> FsResult<(Arc<Vec<DirEntry>>, u64)> {
        // Names whose unlink was answered early must not be listed again by a server that has
        // not carried it out yet, nor names created early left out.
        self.removes_behind.dir_settled(ino).await;
        self.creates_behind.dir_settled(ino).await;
        // A directory moved through the mount while the listing was on its way (this one or
        // one above it) may have been listed without its entries: sftp-server stats each entry
        // by the path it opened, which is gone then, and leaves out those it cannot stat. So
        // such a listing is taken again, by the new path, and not cached if that keeps
        // happening.
        let mut path = path.to_path_buf();
        let patience = std::time::Instant::now() + Duration::from_secs(1);
        for attempt in 1.. {
            let (since, moves) = {
                let cache = self.cache.lock().unwrap();
                (cache.now(), cache.dir_moves())
            };
            let until = std::time::Instant::now() + self.cache_config().dir_ttl;
            let listing = match self.remote.read_dir(&path).await {
                Ok(l) => valid_listing(&path, l),
                Err(e) => return Err(self.explain(Op::Readdir, e, &path, None).await),
            };
            let now = self.cache.lock().unwrap().dir_moves();
            let moved = moves.1 || now != moves;
            // A move still on its way may be this directory's, whose path changes only once
            // it is done: listed again after it (for up to a second), not by the old path.
            let moving = now.1 && std::time::Instant::now() < patience;
            if moved && (attempt < 3 || moving) {
                if moving && attempt >= 3 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                path = self.path_of(ino)?;
                continue;
            }
            return Ok((
                self.settle_listing(ino, listing, since, until, !moved),
                since,
            ));
        }
        unreachable!("the loop returns")
    }

    /// Take a listing of directory `ino` from the server, asked for when the change clock read
    /// `since`, into the listing cache until `until`, and return it as it may be used.
    fn settle_listing(
        &self,
        ino: Ino,
        mut listing: Vec<DirEntry>,
        since: u64,
        until: std::time::Instant,
        cacheable: bool,
    ) -> Arc<Vec<DirEntry>> {
        // Entries changed through the mount while the listing was on its way may show
        // attributes from before the change: mark those unknown (see listing_update). So may
        // files with writes still on their way, or answered while it was (the server may have
        // listed before it carried them out). The check and the caching happen under one
        // lock, so a change that completes in between cannot update an older cached listing
        // and leave this stale one behind it. (Files taking writes are found first, with no
        // other lock held; a write queued after that is a change since `since`.)
        let writing: Vec<Ino> = {
            let files = self.files.lock().unwrap();
            files
                .values()
                .filter(|f| f.writes_pending())
                .map(|f| f.ino)
                .collect()
        };
        let inodes = self.inodes.lock().unwrap();
        let mut cache = self.cache.lock().unwrap();
        for e in listing.iter_mut() {
            let Some(child) = inodes.child(ino, &e.name) else {
                continue;
            };
            if cache.changed_since(child, since)
                || cache.landed_since(child, since)
                || writing.contains(&child)
            {
                e.attrs.size = None;
            }
            // A name of it unlinked early may still be counted (see `remember`): the table's
            // count stands.
            if cache.link_count_suspect(child, since) {
                e.nlink = inodes.known_nlink(child);
            }
        }
        let listing = Arc::new(listing);
        // A name added or removed through the mount while the listing was on its way may be
        // missing from it, or still in it: answer this request with it, but do not cache it
        // (it would hide the mount's own change from readdir and lookups until it expires).
        if cacheable && !cache.changed_since(ino, since) {
            // Names it shows that were answered as absent: the kernel may keep them so (a
            // listing the mount takes for itself is not one the kernel reads).
            let shown = cache.put_dir_until(ino, listing.clone(), until);
            drop(cache);
            drop(inodes);
            self.kernel_caches
                .forget_names(shown.into_iter().map(|n| (ino, n)).collect());
        }
        listing
    }

    /// Whether lookups missing in `parent` come often enough that listing the directory
    /// once is cheaper than asking for each name (`git status` and `find` stat every file of
    /// a directory one after the other: one listing answers them all).
    fn lookups_warrant_listing(&self, parent: Ino) -> bool {
        if self.cache_config().dir_ttl.is_zero() {
            return false;
        }
        let now = std::time::Instant::now();
        let mut misses = self.lookup_misses.lock().unwrap();
        let entry = misses.get_or_insert_mut(parent, || (0, now));
        if now.duration_since(entry.1) > Duration::from_secs(2) {
            *entry = (0, now);
        }
        entry.0 += 1;
        entry.0 >= 2
    }

    /// List `dir` for lookups, once however many lookups ask at the same time; with the change
    /// clock from before the listing was asked for (a request joining it may come later).
    async fn list_dir_shared(&self, dir: Ino) -> Option<(Arc<Vec<DirEntry>>, u64)> {
        let cell = self
            .listings_in_flight
            .lock()
            .unwrap()
            .entry(dir)
            .or_default()
            .clone();
        let listing = cell
            .get_or_init(|| async {
                // (Listed meanwhile by an opendir, while a prefetch waited its turn.)
                {
                    let mut cache = self.cache.lock().unwrap();
                    if let Some(l) = cache.get_dir(dir) {
                        return Some((l, cache.now()));
                    }
                }
                let path = self.path_of(dir).ok()?;
                // (Or on its way, or fetched ahead, by path for a walk.)
                if let Some(listed) = self.listing_from_walk(dir, &path).await {
                    return Some(listed);
                }
                self.list_dir(dir, &path).await.ok()
            })
            .await
            .clone();
        self.listings_in_flight.lock().unwrap().remove(&dir);
        listing
    }

    /// Entries of an open directory from `offset` on (the kernel's cookie). Reading from
    /// offset 0 again is rewinddir(3): the directory is listed afresh from the server.
    pub async fn readdir(&self, fh: u64, offset: u64) -> FsResult<Vec<DirItem>> {
        let dir = self
            .dirs
            .lock()
            .unwrap()
            .get(&fh)
            .cloned()
            .ok_or_else(|| FsError::new(libc::EBADF, format!("no open directory {fh}")))?;
        if dir.started.swap(true, Ordering::Relaxed) && offset == 0 {
            let path = self.path_of(dir.ino)?;
            let (listing, since) = self.list_dir(dir.ino, &path).await?;
            let taken = self.cache.lock().unwrap().listing_taken(dir.ino);
            *dir.items.lock().unwrap() =
                Arc::new(self.with_specials(&path, dir_items(&listing, since, taken)));
        }
        let items = dir.items.lock().unwrap().clone();
        Ok(items.iter().skip(offset as usize).cloned().collect())
    }

    /// List subdirectory `ino` in the background, so that when a tool walking the tree
    /// (`find`, `ls -R`, `grep -r`, `git status`, `rm -rf`) opens it, the listing is already
    /// cached: a walk then costs about one round trip per level instead of two per directory.
    /// Called for each subdirectory a readdirplus hands to the kernel; bounded mount-wide, and
    /// skipped when listings are not cached or one is cached or being fetched already. Once
    /// its listing is there, its first small files are fetched too while a tool reads
    /// through the tree (`first_files_ahead`).
    fn prefetch_dir(self: &Arc<Self>, ino: Ino) {
        if self.cache_config().dir_ttl.is_zero()
            || self.listings_in_flight.lock().unwrap().contains_key(&ino)
        {
            return;
        }
        if self.cache.lock().unwrap().get_dir(ino).is_some() {
            self.first_files_ahead(ino);
            return;
        }
        let Ok(permit) = self.dir_prefetches.clone().try_acquire_owned() else {
            return;
        };
        // Registered now, so a lookup made before the task runs joins this listing (taking it
        // itself if the task is still waiting its turn) instead of stat'ing name by name.
        self.listings_in_flight
            .lock()
            .unwrap()
            .entry(ino)
            .or_default();
        let fs = self.clone();
        self.rt.spawn(async move {
            let _permit = permit;
            let Ok(_running) = fs.dir_listings_ahead.clone().acquire_owned().await else {
                return;
            };
            fs.list_dir_shared(ino).await;
            fs.first_files_ahead(ino);
        });
    }

    /// The inode number to show for a readdir entry: the one the kernel knows, or a stable
    /// stand-in (plain readdir does not create inodes).
    pub fn peek_ino(&self, parent: Ino, name: &OsStr) -> u64 {
        if name == "." || parent == ROOT_INO && name == ".." {
            return parent;
        }
        if name == ".." {
            // The directory's parent, as `ls -ai` shows it on a local disk (a directory has
            // one name; one the kernel no longer knows by name shows its own).
            let inodes = self.inodes.lock().unwrap();
            return inodes
                .names_of(parent)
                .first()
                .map_or(parent, |(grandparent, _)| *grandparent);
        }
        if let Some(attr) = self.special_child(parent, name, false) {
            return attr.ino;
        }
        self.inodes
            .lock()
            .unwrap()
            .child(parent, name)
            .unwrap_or(u64::MAX)
    }

    /// Before a readdirplus batch: fetch at once the attributes of the regular files in
    /// `items` whose listing entries a change through the mount left unknown (a file
    /// written since the listing was taken), which [`Fs::readdirplus_entry`] would otherwise
    /// ask the server for one after another: after `git checkout`, `tar x` or a build, the
    /// first `du`, `find -size` or `ls -l` of the tree would wait one round trip per file.
    /// What comes back fills the listing ([`Fs::cache_attrs_from`]), where the entries'
    /// lookups find it. Only names the kernel holds an inode for (a change through the mount
    /// gave them one): the change clock of the inode tells whether an answer predates a
    /// later change. At most [`FILL_AT_ONCE`], about what one reply to the kernel holds.
    pub async fn fill_unknown_attrs(self: &Arc<Self>, parent: Ino, items: &[DirItem]) {
        let Ok(dir) = self.path_of(parent) else {
            return;
        };
        let wanted: Vec<(Ino, &OsStr)> = {
            let inodes = self.inodes.lock().unwrap();
            items
                .iter()
                .filter(|i| {
                    i.attrs
                        .is_some_and(|a| a.size.is_none() && a.file_type() == FileKind::File)
                })
                .filter_map(|i| Some((inodes.child(parent, &i.name)?, i.name.as_os_str())))
                .take(FILL_AT_ONCE)
                .collect()
        };
        if wanted.len() < 2 {
            // One is asked for by its lookup as soon.
            return;
        }
        let since = self.cache.lock().unwrap().now();
        let paths: Vec<PathBuf> = wanted.iter().map(|(_, name)| dir.join(name)).collect();
        let answers =
            futures_util::future::join_all(paths.iter().map(|p| self.remote.lstat(p))).await;
        for ((ino, _), answer) in wanted.into_iter().zip(answers) {
            if let Ok(attrs) = answer {
                if attrs.file_type() == FileKind::File {
                    self.cache_attrs_from(ino, CachedAttrs { attrs, nlink: None }, since);
                }
            }
        }
    }

    /// readdirplus: the kernel takes a lookup reference for each entry it is given. With
    /// `follow_symlinks` a link's target is stat'ed, so `ls -l` agrees with `stat`.
    pub async fn readdirplus_entry(
        self: &Arc<Self>,
        parent: Ino,
        item: &DirItem,
    ) -> FsResult<Entry> {
        match self.special_child(parent, &item.name, true) {
            Some(attr) => return Ok(self.entry(attr)),
            // Removed or renamed since the directory was opened: it is nowhere now (the
            // server never had it).
            None if item.local => {
                return Err(FsError::new(
                    libc::ENOENT,
                    format!("{:?}: removed since the listing", item.name),
                ))
            }
            None => {}
        }
        let attrs = item
            .attrs
            .ok_or_else(|| FsError::new(libc::EINVAL, "no attributes"))?;
        let follow = self.config.lock().unwrap().follow_symlinks;
        let is_link = attrs.file_type() == FileKind::Symlink;
        let resource = is_link && parent == ROOT_INO && self.is_resource_name(&item.name).await;
        // A file with links made on the server, listed before a change that may have gone
        // through another of its names (`shared_data_changed` moves the directory on the
        // change clock): what the listing says of it may be old.
        //
        // And anything changed through the mount since the directory was opened (its handle
        // keeps the listing of then): a name made, removed or renamed in it, or a change of
        // the file itself (an append, a chmod). The lookup answers from what the mount
        // keeps current, usually without a round trip.
        // (Without a listing cache such a lookup is a round trip each: then only names the
        // mount knows are gone, files changed themselves, and files with links made on the
        // server, as above, are looked up.)
        let changed = {
            let held = self.inodes.lock().unwrap().child(parent, &item.name);
            let mut cache = self.cache.lock().unwrap();
            let names_changed = cache.changed_since(parent, item.listed_at)
                && (!cache.config().dir_ttl.is_zero()
                    || cache::has_other_names(item.nlink, &attrs)
                    || cache.is_negative(parent, &item.name));
            names_changed || held.is_some_and(|ino| cache.changed_since(ino, item.listed_at))
        };
        let entry = if attrs.size.is_none() || (follow && is_link) || resource || changed {
            self.lookup(parent, &item.name).await?
        } else {
            let attr = self.remember(parent, &item.name, attrs, item.nlink, item.listed_at);
            self.entry_from_listing(attr, item.taken)
        };
        if entry.attr.kind == FileKind::Dir {
            self.handed_dir(entry.attr.ino, parent);
            self.prefetch_dir(entry.attr.ino);
        }
        Ok(entry)
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs.lock().unwrap().remove(&fh);
    }

    pub fn dir_ino(&self, fh: u64) -> Option<Ino> {
        self.dirs.lock().unwrap().get(&fh).map(|d| d.ino)
    }

    // ---------------------------------------------------------------- misc

    pub async fn statfs(&self) -> FsResult<StatFs> {
        let (cached, since) = {
            let cache = self.cache.lock().unwrap();
            (cache.get_statvfs(), cache.now())
        };
        let fetched = match cached {
            Some(v) => Ok(v),
            None => self.remote.statvfs(&self.root).await.inspect(|v| {
                self.cache.lock().unwrap().put_statvfs(*v, since);
            }),
        };
        match fetched {
            Ok(v) => Ok(self.with_quota(StatFs {
                blocks: v.blocks,
                bfree: v.bfree,
                bavail: v.bavail,
                files: v.files,
                ffree: v.ffree,
                bsize: v.bsize.min(u32::MAX as u64) as u32,
                namelen: v.namemax.min(255) as u32,
                frsize: v.frsize.min(u32::MAX as u64) as u32,
            })),
            Err(RemoteError::Unsupported(_)) => Ok(StatFs {
                bsize: 4096,
                frsize: 4096,
                namelen: 255,
                ..Default::default()
            }),
            Err(e) => Err(remote_err(Op::Statfs, &e, "statvfs")),
        }
    }

    /// `df` shows the quota: total = what the workspace held at mount + the budget, free =
    /// what is left of it (or the server's real free space when that is smaller).
    fn with_quota(&self, mut s: StatFs) -> StatFs {
        let u = self.enforcer.quota.usage();
        let frsize = u64::from(s.frsize.max(1));
        // (Wide arithmetic: usage may be far negative after big deletions, and the server's
        // numbers are its own.)
        let left = |max: u64, used: i64| {
            u64::try_from((i128::from(max) - i128::from(used)).max(0)).unwrap_or(u64::MAX)
        };
        if let Some(max) = u.max_bytes {
            let left = left(max, u.bytes) / frsize;
            let base = u.base.unwrap_or(0) / frsize;
            s.blocks = base.saturating_add(max / frsize);
            s.bfree = s.bfree.min(left);
            s.bavail = s.bavail.min(left);
        }
        if let Some(max) = u.max_files {
            let used_by_others = s.files.saturating_sub(s.ffree);
            s.files = s.files.min(max.saturating_add(used_by_others));
            s.ffree = s.ffree.min(left(max, u.files));
        }
        s
    }

    /// access(2) without `default_permissions`: existence, read-only mount, and the mode
    /// bits for the class the caller falls in.
    pub async fn access(&self, ino: Ino, mask: i32, uid: u32, gid: u32) -> FsResult<()> {
        self.create_landed(ino).await;
        // A `chmod +x` queued behind the file's writes is what the check must see.
        self.changes_behind_settled(ino).await;
        let attr = match self.special_attr(ino) {
            Some(attr) => attr,
            None => {
                let a = self.fetch_attrs(ino).await?;
                self.make_attr(ino, &a.attrs, a.nlink)
            }
        };
        if mask == libc::F_OK {
            return Ok(());
        }
        // (As on Linux, a read-only mount still lets a FIFO, socket or device be written: that
        // changes nothing in the filesystem.)
        let stored = matches!(
            attr.kind,
            FileKind::File | FileKind::Dir | FileKind::Symlink
        );
        if mask & libc::W_OK != 0 && stored && self.is_read_only() {
            return Err(FsError::new(libc::EROFS, "the mount is read-only"));
        }
        let perm = attr.perm as i32;
        if uid == 0 {
            // root may do anything but execute a file nobody may execute.
            if mask & libc::X_OK != 0 && attr.kind != FileKind::Dir && perm & 0o111 == 0 {
                return Err(FsError::new(libc::EACCES, "no execute permission"));
            }
            return Ok(());
        }
        let bits = if attr.uid == uid {
            (perm >> 6) & 7
        } else if attr.gid == gid {
            (perm >> 3) & 7
        } else {
            perm & 7
        };
        if mask & !bits & 7 != 0 {
            return Err(FsError::new(libc::EACCES, "permission bits deny access"));
        }
        Ok(())
    }
}

/// The inode number of the mount's root, for the adapter.
pub const ROOT: Ino = ROOT_INO;

#[cfg(test)]
mod tests;

/// A create answered early counts as on its way (`Fs::creates_behind`) until this is dropped:
/// when its OPEN's outcome is in, or if the task carrying it ends any other way (a panic), so
/// that nothing waits for it forever.
struct CreateLanding<R: Remote> {
    fs: Arc<Fs<R>>,
    parent: Ino,
    name: OsString,
}

impl<R: Remote> Drop for CreateLanding<R> {
    fn drop(&mut self) {
        self.fs.dir_landed(self.parent);
        self.fs.creates_behind.land(self.parent, &self.name, None);
    }
}
