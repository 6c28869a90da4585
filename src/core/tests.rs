//! Unit tests of the core against the local-directory remote, with no kernel in the loop.
//!
//! Every test builds an `Fs<FaultyRemote<LocalRemote>>` over a fresh temporary directory and
//! drives it exactly as the FUSE adapter (`crate::fuse`) does: lookup → inode, create/open →
//! file handle, `write` queued synchronously then awaited, flush, release, forget, ...
//! `LocalRemote` reports errors as coarsely as OpenSSH's sftp-server, so the errno tests
//! exercise the core's inference, not the local disk's errno.
//!
//! The tests are written to find bugs: each asserts what a local disk (or the documented
//! contract of the core) would give, not what the core happens to do.

use std::ffi::{OsStr, OsString};
use std::fmt::Debug;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::cache::CacheConfig;
use super::inode::Ino;
use super::{Caller, Fs, FsConfig, OpenRequest, SetattrRequest, TimeSpec, ROOT};
use crate::error::FsResult;
use crate::remote::faulty::{FaultPlan, FaultyRemote, Op as ROp};
use crate::remote::local::LocalRemote;
use crate::remote::{FileKind, Limits, RemoteError, Status};

type TestFs = Fs<FaultyRemote<LocalRemote>>;

/// Mode the kernel hands to create/mkdir (type bits included, as FUSE does).
const FILE_MODE: u32 = libc::S_IFREG | 0o644;
const DIR_MODE: u32 = libc::S_IFDIR | 0o755;
const UMASK: u32 = 0o022;

// ------------------------------------------------------------------------------ harness

/// TTLs long enough that nothing expires during a test unless the test wants it to.
fn long_ttls() -> CacheConfig {
    CacheConfig {
        attr_ttl: Duration::from_secs(60),
        entry_ttl: Duration::from_secs(60),
        negative_ttl: Duration::from_secs(60),
        dir_ttl: Duration::from_secs(60),
        max_entries: 65_536,
    }
}

/// `long_ttls`, with directory listings cached or (false) not.
fn long_ttls_listings(cached: bool) -> CacheConfig {
    CacheConfig {
        dir_ttl: if cached {
            long_ttls().dir_ttl
        } else {
            Duration::ZERO
        },
        ..long_ttls()
    }
}

fn config(cache: CacheConfig) -> FsConfig {
    FsConfig {
        cache,
        ..Default::default()
    }
}

struct Harness {
    /// Keeps the export directory alive for the test.
    _dir: tempfile::TempDir,
    root: PathBuf,
    fs: Arc<TestFs>,
    plan: Arc<FaultPlan>,
}

impl Harness {
    fn new() -> Self {
        Self::with(config(long_ttls()), None)
    }

    /// Under the default policy (`symlinks = "contain"`), with `cache`.
    fn containing(cache: CacheConfig) -> Self {
        let contain = Arc::new(crate::policy::enforcer::Enforcer::from_policy(
            &crate::policy::Policy::default(),
        ));
        Self::with(
            FsConfig {
                enforcer: contain,
                ..config(cache)
            },
            None,
        )
    }

    /// `follow_symlinks` under the default policy (`symlinks = "contain"`), long TTLs.
    fn following_contained_symlinks() -> Self {
        let contain = Arc::new(crate::policy::enforcer::Enforcer::from_policy(
            &crate::policy::Policy::default(),
        ));
        Self::with(
            FsConfig {
                follow_symlinks: true,
                enforcer: contain,
                ..config(long_ttls())
            },
            None,
        )
    }

    /// Mounted with `follow_symlinks` (a symlink shown as what it points to), long TTLs.
    fn following_symlinks() -> Self {
        Self::with(
            FsConfig {
                follow_symlinks: true,
                ..config(long_ttls())
            },
            None,
        )
    }

    fn with(config: FsConfig, limits: Option<Limits>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let local = match limits {
            Some(l) => LocalRemote::with_limits(l),
            None => LocalRemote::new(),
        };
        let remote = FaultyRemote::new(local);
        let plan = Arc::clone(remote.plan());
        let fs = Arc::new(Fs::new(
            Arc::new(remote),
            root.clone(),
            config,
            tokio::runtime::Handle::current(),
        ));
        Harness {
            _dir: dir,
            root,
            fs,
            plan,
        }
    }

    /// Path on "the server" (the local disk), for checking or changing things behind the
    /// core's back.
    fn disk(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.root.join(rel)
    }

    /// Server handles still open (what sftp-server's handle table would hold), once the
    /// closes that `release` sends in the background have had time to arrive.
    async fn open_handles(&self) -> usize {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if self.fs.remote().inner().open_handles() == 0 {
                return 0;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.fs.remote().inner().open_handles()
    }

    async fn lookup(&self, parent: Ino, name: impl AsRef<OsStr>) -> Ino {
        let name = name.as_ref();
        match self.fs.lookup(parent, name).await {
            Ok(e) => e.attr.ino,
            Err(e) => panic!("lookup {name:?} in {parent}: {e}"),
        }
    }

    async fn create(&self, parent: Ino, name: impl AsRef<OsStr>) -> (Ino, u64) {
        self.create_with(parent, name, libc::O_RDWR | libc::O_CREAT)
            .await
    }

    /// `f` in the root, created with `data` written and flushed: the descriptor stays open.
    async fn create_written(&self, data: &[u8]) -> (Ino, u64) {
        let (f, fh) = self.create(ROOT, "f").await;
        self.write(fh, 0, data).await;
        self.fs.flush(fh).await.unwrap();
        (f, fh)
    }

    async fn create_with(&self, parent: Ino, name: impl AsRef<OsStr>, flags: i32) -> (Ino, u64) {
        let name = name.as_ref();
        match self
            .fs
            .create(parent, name, FILE_MODE, UMASK, as_root(flags))
            .await
        {
            Ok((e, fh)) => (e.attr.ino, fh),
            Err(e) => panic!("create {name:?} in {parent} (flags {flags:#o}): {e}"),
        }
    }

    /// `name` created for reading and writing by thread `pid` (its opener).
    async fn create_by(&self, parent: Ino, name: &str, pid: u32) -> u64 {
        let req = OpenRequest {
            flags: libc::O_RDWR | libc::O_CREAT,
            pid,
            caller: Caller::ROOT,
        };
        match self
            .fs
            .create(parent, OsStr::new(name), FILE_MODE, UMASK, req)
            .await
        {
            Ok((_, fh)) => fh,
            Err(e) => panic!("create {name:?} in {parent} by {pid}: {e}"),
        }
    }

    async fn mkdir(&self, parent: Ino, name: &str) -> Ino {
        match self
            .fs
            .mkdir(parent, OsStr::new(name), DIR_MODE, UMASK, Caller::ROOT)
            .await
        {
            Ok(e) => e.attr.ino,
            Err(e) => panic!("mkdir {name:?} in {parent}: {e}"),
        }
    }

    async fn open(&self, ino: Ino, flags: i32) -> u64 {
        match self.fs.open(ino, as_root(flags)).await {
            Ok(fh) => fh,
            Err(e) => panic!("open {ino} flags {flags:#o}: {e}"),
        }
    }

    /// Open `ino` as the kernel does (see `Fs::open_keeping_cache`) and close it again:
    /// whether the kernel was told to keep its cached pages.
    async fn open_keeps_cache(&self, ino: Ino, flags: i32) -> bool {
        let (fh, keep) = self
            .fs
            .open_keeping_cache(ino, as_root(flags))
            .await
            .unwrap_or_else(|e| panic!("open {ino} flags {flags:#o}: {e}"));
        self.fs.release(fh).await.unwrap();
        keep
    }

    async fn write(&self, fh: u64, offset: u64, data: &[u8]) {
        let n = self.fs.write(fh, offset, data).await.unwrap();
        assert_eq!(
            n as usize,
            data.len(),
            "write of {} bytes at {offset}",
            data.len()
        );
    }

    async fn read(&self, fh: u64, offset: u64, size: u32) -> Vec<u8> {
        self.fs.read(fh, offset, size).await.unwrap().to_vec()
    }

    async fn size(&self, ino: Ino, fh: Option<u64>) -> u64 {
        self.fs.getattr(ino, fh).await.unwrap().0.size
    }

    fn meta(&self, rel: impl AsRef<Path>) -> std::fs::Metadata {
        std::fs::symlink_metadata(self.disk(rel)).unwrap()
    }
}

/// An open by root (the kernel's pid unknown), with `flags`.
fn as_root(flags: i32) -> OpenRequest {
    OpenRequest {
        flags,
        pid: 0,
        caller: Caller::ROOT,
    }
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::ENOENT => "ENOENT",
        libc::EEXIST => "EEXIST",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EPERM => "EPERM",
        libc::EACCES => "EACCES",
        libc::EIO => "EIO",
        libc::EROFS => "EROFS",
        libc::EBUSY => "EBUSY",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EBADF => "EBADF",
        libc::ENOSPC => "ENOSPC",
        libc::EXDEV => "EXDEV",
        libc::EFBIG => "EFBIG",
        libc::ESTALE => "ESTALE",
        _ => "?",
    };
    format!("{name}({errno})")
}

/// Collects mismatches so that one test reports every case it checks, not just the first.
#[derive(Default)]
struct Checks(Vec<String>);

impl Checks {
    fn errno<T: Debug>(&mut self, what: &str, r: FsResult<T>, want: i32) {
        match r {
            Err(e) if e.errno == want => {}
            Err(e) => self.0.push(format!(
                "{what}: got {} ({}), want {}",
                errno_name(e.errno),
                e.context,
                errno_name(want)
            )),
            Ok(v) => self
                .0
                .push(format!("{what}: got Ok({v:?}), want {}", errno_name(want))),
        }
    }

    fn check(&mut self, what: &str, ok: bool) {
        if !ok {
            self.0.push(what.to_owned());
        }
    }

    #[track_caller]
    fn finish(self) {
        assert!(
            self.0.is_empty(),
            "{} check(s) failed:\n  {}",
            self.0.len(),
            self.0.join("\n  ")
        );
    }
}

#[track_caller]
fn assert_errno<T: Debug>(r: FsResult<T>, want: i32, what: &str) {
    let mut c = Checks::default();
    c.errno(what, r, want);
    c.finish();
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn at(secs: u64) -> Option<TimeSpec> {
    Some(TimeSpec::At(UNIX_EPOCH + Duration::from_secs(secs)))
}

/// Deterministic, non-repeating-looking content.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(7) ^ (i >> 8) ^ (i >> 16)) as u8)
        .collect()
}

fn failure(msg: &str) -> RemoteError {
    RemoteError::Status(Status::Failure, msg.to_owned())
}

// ------------------------------------------------------------------------------ errno inference

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errno_mkdir_existing_is_eexist() {
    let h = Harness::new();
    h.mkdir(ROOT, "d").await;
    std::fs::write(h.disk("f"), b"x").unwrap();
    let mut c = Checks::default();
    c.errno(
        "mkdir over an existing dir",
        h.fs.mkdir(ROOT, os("d"), DIR_MODE, UMASK, Caller::ROOT)
            .await,
        libc::EEXIST,
    );
    c.errno(
        "mkdir over an existing file",
        h.fs.mkdir(ROOT, os("f"), DIR_MODE, UMASK, Caller::ROOT)
            .await,
        libc::EEXIST,
    );
    c.errno(
        "symlink over an existing file",
        h.fs.symlink(ROOT, os("f"), Path::new("t"), Caller::ROOT)
            .await,
        libc::EEXIST,
    );
    c.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errno_rmdir_non_empty_is_enotempty_and_unlink_dir_is_eisdir() {
    let h = Harness::new();
    let d = h.mkdir(ROOT, "d").await;
    let (_, fh) = h.create(d, "inner").await;
    h.fs.release(fh).await.unwrap();
    h.mkdir(ROOT, "empty").await;
    let mut c = Checks::default();
    c.errno(
        "rmdir non-empty",
        h.fs.rmdir(ROOT, os("d")).await,
        libc::ENOTEMPTY,
    );
    c.errno(
        "unlink a dir",
        h.fs.unlink(ROOT, os("d")).await,
        libc::EISDIR,
    );
    c.errno(
        "unlink an empty dir",
        h.fs.unlink(ROOT, os("empty")).await,
        libc::EISDIR,
    );
    c.errno(
        "rmdir missing",
        h.fs.rmdir(ROOT, os("nope")).await,
        libc::ENOENT,
    );
    c.errno(
        "unlink missing",
        h.fs.unlink(ROOT, os("nope")).await,
        libc::ENOENT,
    );
    c.finish();
    assert!(h.disk("d/inner").exists());
    assert!(h.disk("empty").is_dir());
}

/// rmdir(2) of a regular file is ENOTDIR; sftp-server maps ENOTDIR to NO_SUCH_FILE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errno_rmdir_of_a_file_is_enotdir() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"x").unwrap();
    h.lookup(ROOT, "f").await;
    assert_errno(
        h.fs.rmdir(ROOT, os("f")).await,
        libc::ENOTDIR,
        "rmdir of a file",
    );
    assert!(h.disk("f").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errno_create_excl_existing_is_eexist() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"keep").unwrap();
    let excl = OpenRequest {
        flags: libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
        pid: 0,
        caller: Caller::ROOT,
    };
    assert_errno(
        h.fs.create(ROOT, os("f"), FILE_MODE, UMASK, excl).await,
        libc::EEXIST,
        "create O_EXCL over an existing file",
    );
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"keep");
    assert_eq!(h.open_handles().await, 0);
}

/// open(dir, O_CREAT|O_EXCL) is EEXIST on Linux (EISDIR is only without O_EXCL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errno_create_over_a_dir() {
    let h = Harness::new();
    std::fs::create_dir(h.disk("d")).unwrap();
    let mut c = Checks::default();
    let excl = OpenRequest {
        flags: libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
        pid: 0,
        caller: Caller::ROOT,
    };
    c.errno(
        "create O_EXCL over a dir",
        h.fs.create(ROOT, os("d"), FILE_MODE, UMASK, excl).await,
        libc::EEXIST,
    );
    let plain = OpenRequest {
        flags: libc::O_RDWR | libc::O_CREAT,
        pid: 0,
        caller: Caller::ROOT,
    };
    c.errno(
        "create (no O_EXCL) over a dir",
        h.fs.create(ROOT, os("d"), FILE_MODE, UMASK, plain).await,
        libc::EISDIR,
    );
    c.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errno_name_too_long() {
    let h = Harness::new();
    let long = "x".repeat(256);
    let long = os(&long);
    std::fs::write(h.disk("f"), b"x").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let mut c = Checks::default();
    c.errno("lookup", h.fs.lookup(ROOT, long).await, libc::ENAMETOOLONG);
    c.errno(
        "mkdir",
        h.fs.mkdir(ROOT, long, DIR_MODE, UMASK, Caller::ROOT).await,
        libc::ENAMETOOLONG,
    );
    let req = OpenRequest {
        flags: libc::O_RDWR | libc::O_CREAT,
        pid: 0,
        caller: Caller::ROOT,
    };
    c.errno(
        "create",
        h.fs.create(ROOT, long, FILE_MODE, UMASK, req).await,
        libc::ENAMETOOLONG,
    );
    c.errno("unlink", h.fs.unlink(ROOT, long).await, libc::ENAMETOOLONG);
    c.errno("rmdir", h.fs.rmdir(ROOT, long).await, libc::ENAMETOOLONG);
    c.errno(
        "symlink",
        h.fs.symlink(ROOT, long, Path::new("f"), Caller::ROOT).await,
        libc::ENAMETOOLONG,
    );
    c.errno(
        "rename to",
        h.fs.rename(ROOT, os("f"), ROOT, long, 0).await,
        libc::ENAMETOOLONG,
    );
    c.errno("link", h.fs.link(f, ROOT, long).await, libc::ENAMETOOLONG);
    // 255 bytes is fine.
    let max = "y".repeat(255);
    let (_, fh) = h.create(ROOT, &max).await;
    h.fs.release(fh).await.unwrap();
    c.check("255-byte name exists on disk", h.disk(&max).is_file());
    c.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errno_rename_dir_over_non_empty_dir_is_enotempty() {
    let h = Harness::new();
    h.mkdir(ROOT, "a").await;
    let b = h.mkdir(ROOT, "b").await;
    let (_, fh) = h.create(b, "inner").await;
    h.fs.release(fh).await.unwrap();
    assert_errno(
        h.fs.rename(ROOT, os("a"), ROOT, os("b"), 0).await,
        libc::ENOTEMPTY,
        "rename dir over non-empty dir",
    );
    assert!(h.disk("a").is_dir() && h.disk("b/inner").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errno_rename_file_over_dir_is_eisdir() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"x").unwrap();
    std::fs::create_dir(h.disk("d")).unwrap();
    assert_errno(
        h.fs.rename(ROOT, os("f"), ROOT, os("d"), 0).await,
        libc::EISDIR,
        "rename file over dir",
    );
}

/// rename(2) of a directory over a file is ENOTDIR; sftp-server maps ENOTDIR to NO_SUCH_FILE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errno_rename_dir_over_file_is_enotdir() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"x").unwrap();
    std::fs::create_dir(h.disk("d")).unwrap();
    assert_errno(
        h.fs.rename(ROOT, os("d"), ROOT, os("f"), 0).await,
        libc::ENOTDIR,
        "rename dir over file",
    );
    assert!(h.disk("d").is_dir() && h.disk("f").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errno_rename_noreplace_and_exchange() {
    let h = Harness::new();
    std::fs::write(h.disk("a"), b"a").unwrap();
    std::fs::write(h.disk("b"), b"b").unwrap();
    std::fs::create_dir(h.disk("d")).unwrap();
    std::fs::create_dir(h.disk("e")).unwrap();
    let noreplace = libc::RENAME_NOREPLACE;
    let mut c = Checks::default();
    c.errno(
        "NOREPLACE file over file",
        h.fs.rename(ROOT, os("a"), ROOT, os("b"), noreplace).await,
        libc::EEXIST,
    );
    c.errno(
        "NOREPLACE dir over empty dir",
        h.fs.rename(ROOT, os("d"), ROOT, os("e"), noreplace).await,
        libc::EEXIST,
    );
    c.errno(
        "NOREPLACE dir over file",
        h.fs.rename(ROOT, os("d"), ROOT, os("a"), noreplace).await,
        libc::EEXIST,
    );
    c.errno(
        "EXCHANGE",
        h.fs.rename(ROOT, os("a"), ROOT, os("b"), libc::RENAME_EXCHANGE)
            .await,
        libc::EINVAL,
    );
    c.errno(
        "rename missing source",
        h.fs.rename(ROOT, os("nope"), ROOT, os("x"), 0).await,
        libc::ENOENT,
    );
    c.finish();
    assert_eq!(std::fs::read(h.disk("a")).unwrap(), b"a");
    assert_eq!(std::fs::read(h.disk("b")).unwrap(), b"b");
    // NOREPLACE to a free name works.
    h.fs.rename(ROOT, os("a"), ROOT, os("c"), noreplace)
        .await
        .unwrap();
    assert!(!h.disk("a").exists());
    assert_eq!(std::fs::read(h.disk("c")).unwrap(), b"a");
}

/// link(2) of a directory is EPERM; sftp-server maps EPERM to PERMISSION_DENIED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errno_link_of_a_dir_is_eperm() {
    let h = Harness::new();
    let d = h.mkdir(ROOT, "d").await;
    assert_errno(
        h.fs.link(d, ROOT, os("d2")).await,
        libc::EPERM,
        "link of a dir",
    );
    assert!(!h.disk("d2").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errno_link_over_existing_is_eexist_and_link_works() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"data").unwrap();
    std::fs::write(h.disk("g"), b"other").unwrap();
    let f = h.lookup(ROOT, "f").await;
    assert_errno(
        h.fs.link(f, ROOT, os("g")).await,
        libc::EEXIST,
        "link over existing",
    );
    let e = h.fs.link(f, ROOT, os("f2")).await.unwrap();
    assert_eq!(e.attr.size, 4);
    assert_eq!(h.meta("f").ino(), h.meta("f2").ino());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errno_lookup_of_missing_is_enoent() {
    let h = Harness::new();
    let d = h.mkdir(ROOT, "d").await;
    assert_errno(
        h.fs.lookup(ROOT, os("missing")).await,
        libc::ENOENT,
        "lookup missing",
    );
    assert_errno(
        h.fs.lookup(d, os("missing")).await,
        libc::ENOENT,
        "lookup missing in d",
    );
    assert_errno(
        h.fs.getattr(12345, None).await,
        libc::ENOENT,
        "getattr of unknown ino",
    );
}

/// A directory the kernel knows was replaced by a file on the server: operations in it get
/// ENOTDIR (a path component is not a directory), which the core infers from NO_SUCH_FILE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errno_component_that_is_a_file_is_enotdir() {
    let h = Harness::new();
    let d = h.mkdir(ROOT, "d").await;
    std::fs::write(h.disk("f"), b"x").unwrap();
    std::fs::remove_dir(h.disk("d")).unwrap();
    std::fs::write(h.disk("d"), b"now a file").unwrap();
    // What the mount knew of `d` has run out (else a create in it is answered early, and
    // its close fails instead: see `tests::early_create`).
    h.fs.cache.lock().unwrap().expire_all();
    let mut c = Checks::default();
    c.errno(
        "mkdir in it",
        h.fs.mkdir(d, os("x"), DIR_MODE, UMASK, Caller::ROOT).await,
        libc::ENOTDIR,
    );
    let req = OpenRequest {
        flags: libc::O_RDWR | libc::O_CREAT,
        pid: 0,
        caller: Caller::ROOT,
    };
    c.errno(
        "create in it",
        h.fs.create(d, os("x"), FILE_MODE, UMASK, req).await,
        libc::ENOTDIR,
    );
    c.errno("unlink in it", h.fs.unlink(d, os("x")).await, libc::ENOTDIR);
    c.errno("rmdir in it", h.fs.rmdir(d, os("x")).await, libc::ENOTDIR);
    c.errno(
        "symlink in it",
        h.fs.symlink(d, os("x"), Path::new("t"), Caller::ROOT).await,
        libc::ENOTDIR,
    );
    c.errno(
        "rename into it",
        h.fs.rename(ROOT, os("f"), d, os("x"), 0).await,
        libc::ENOTDIR,
    );
    c.finish();
    assert!(h.disk("f").is_file());
}

/// The directory itself was replaced by a file: listing it is ENOTDIR, like opendir(3) on a
/// file. (Without the listing cache: with it, a change on the server shows once the cached
/// listing expires, see `cache_listing_answers_lookups_then_expires`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errno_opendir_of_dir_replaced_by_file_is_enotdir() {
    let h = Harness::with(
        config(CacheConfig {
            dir_ttl: Duration::ZERO,
            ..long_ttls()
        }),
        None,
    );
    let d = h.mkdir(ROOT, "d").await;
    std::fs::remove_dir(h.disk("d")).unwrap();
    std::fs::write(h.disk("d"), b"now a file").unwrap();
    assert_errno(h.fs.opendir(d).await, libc::ENOTDIR, "opendir of a file");
}

// ------------------------------------------------------------------------------ caching

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_changes_through_the_core_are_visible_at_once() {
    let h = Harness::new();
    // Prime every cache: a listing of the root and a negative entry.
    let dh = h.fs.opendir(ROOT).await.unwrap();
    h.fs.releasedir(dh);
    assert_errno(
        h.fs.lookup(ROOT, os("n")).await,
        libc::ENOENT,
        "lookup before create",
    );

    // create, then lookup
    let (n, fh) = h.create(ROOT, "n").await;
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.lookup(ROOT, "n").await, n, "create then lookup");
    let d = h.mkdir(ROOT, "sub").await;
    assert_eq!(h.lookup(ROOT, "sub").await, d, "mkdir then lookup");

    // unlink, then lookup, with a fresh listing that still has the name
    let dh = h.fs.opendir(ROOT).await.unwrap();
    h.fs.releasedir(dh);
    h.fs.unlink(ROOT, os("n")).await.unwrap();
    assert_errno(
        h.fs.lookup(ROOT, os("n")).await,
        libc::ENOENT,
        "unlink then lookup",
    );
    h.fs.rmdir(ROOT, os("sub")).await.unwrap();
    assert_errno(
        h.fs.lookup(ROOT, os("sub")).await,
        libc::ENOENT,
        "rmdir then lookup",
    );

    // rename, with a cached listing of both directories
    let to = h.mkdir(ROOT, "to").await;
    let (moving, fh) = h.create(ROOT, "from").await;
    h.write(fh, 0, b"moving").await;
    h.fs.release(fh).await.unwrap();
    for dir in [ROOT, to] {
        let dh = h.fs.opendir(dir).await.unwrap();
        h.fs.releasedir(dh);
    }
    assert_errno(
        h.fs.lookup(to, os("moved")).await,
        libc::ENOENT,
        "before rename",
    );
    h.fs.rename(ROOT, os("from"), to, os("moved"), 0)
        .await
        .unwrap();
    assert_errno(
        h.fs.lookup(ROOT, os("from")).await,
        libc::ENOENT,
        "old name after rename",
    );
    assert_eq!(
        h.lookup(to, "moved").await,
        moving,
        "renamed keeps its inode"
    );
    assert_eq!(h.size(moving, None).await, 6);
    // Its path follows: open by inode works.
    let fh = h.open(moving, libc::O_RDONLY).await;
    assert_eq!(h.read(fh, 0, 100).await, b"moving");
    h.fs.release(fh).await.unwrap();

    // setattr size, then getattr (the attr cache held the old size)
    assert_eq!(h.size(moving, None).await, 6);
    let a =
        h.fs.setattr(
            moving,
            None,
            SetattrRequest {
                size: Some(2),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(a.size, 2);
    assert_eq!(h.size(moving, None).await, 2, "setattr size then getattr");
    assert_eq!(h.meta("to/moved").len(), 2);
    assert_eq!(h.open_handles().await, 0);
}

/// statfs asks the server once per attribute lifetime while nothing changes through the mount
/// (fts, under `find`, `du` and `rm -rf`, asks once per run); a create, a write, or the
/// lifetime running out makes the next one ask again. The quota's share is never cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_statfs_until_a_change_or_the_ttl() {
    let h = Harness::new();
    let asked = || h.plan.calls(ROp::Statvfs);
    let first = h.fs.statfs().await.unwrap();
    let n = asked();
    assert_eq!(h.fs.statfs().await.unwrap(), first);
    assert_eq!(asked(), n, "asked again with nothing changed");

    let (_, fh) = h.create(ROOT, "f").await;
    h.fs.statfs().await.unwrap();
    assert_eq!(asked(), n + 1, "after a create");
    h.write(fh, 0, &vec![7u8; 1 << 20]).await;
    h.fs.flush(fh).await.unwrap();
    h.fs.statfs().await.unwrap();
    assert_eq!(asked(), n + 2, "after a write");
    h.fs.statfs().await.unwrap();
    assert_eq!(
        asked(),
        n + 2,
        "asked again with nothing changed since the write"
    );
    h.fs.release(fh).await.unwrap();

    h.fs.expire_cache();
    h.fs.statfs().await.unwrap();
    assert_eq!(asked(), n + 3, "after the lifetime");
}

/// A small file's first bytes are read along with its open (one round trip for both) and
/// answer the kernel's reads of them; past them, the server is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_along_answers_the_first_reads() {
    let h = Harness::new();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
    std::fs::write(h.disk("f"), &data).unwrap();
    let f = h.lookup(ROOT, "f").await;
    let reads = || h.plan.calls(ROp::Read);
    let along = || h.fs.stats.opens_read_along.load(Ordering::Relaxed);
    let n = reads();
    let fh = h.open(f, libc::O_RDONLY).await;
    assert_eq!((reads(), along()), (n + 1, 1), "read along with the open");
    assert_eq!(h.read(fh, 0, 4096).await, &data[..4096]);
    assert_eq!(h.read(fh, 4096, 4096).await, &data[4096..8192]);
    assert_eq!(h.read(fh, 8192, 4096).await, &data[8192..]);
    assert_eq!(reads(), n + 1, "the reads asked the server");
    // Used up: a read again goes to the server.
    assert_eq!(h.read(fh, 0, 100).await, &data[..100]);
    assert_eq!(reads(), n + 2);
    h.fs.release(fh).await.unwrap();

    // A file that grew on the server since its size was seen: what was read along does not
    // reach its end, and a read past it asks the server.
    let longer: Vec<u8> = (0..20_000u32).map(|i| (i * 3) as u8).collect();
    std::fs::write(h.disk("f"), &longer).unwrap();
    let fh = h.open(f, libc::O_RDONLY).await;
    assert_eq!(along(), 2);
    assert_eq!(h.read(fh, 0, 8192).await, &longer[..8192]);
    assert_eq!(h.read(fh, 8192, 8192).await, &longer[8192..16_384]);
    h.fs.release(fh).await.unwrap();

    // Opened for writing, or too big: not read along.
    let fh = h.open(f, libc::O_RDWR).await;
    h.fs.release(fh).await.unwrap();
    std::fs::write(h.disk("big"), vec![1u8; 200_000]).unwrap();
    let big = h.lookup(ROOT, "big").await;
    let fh = h.open(big, libc::O_RDONLY).await;
    h.fs.release(fh).await.unwrap();
    assert_eq!(along(), 2);
}

/// What was read along is as fresh as a read right after the open: a write through the mount
/// afterwards, or the attribute TTL, sends the kernel's reads to the server; and nothing is
/// read along while a write of ours is on its way (which the READ would not wait for). A
/// descriptor open for writing with nothing on its way does not keep a read from it (the
/// kernel's release of a descriptor closed a moment ago may come after the next open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_along_never_hides_a_change() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"old old old").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let along = || h.fs.stats.opens_read_along.load(Ordering::Relaxed);
    let r = h.open(f, libc::O_RDONLY).await;
    assert_eq!(along(), 1);
    let w = h.open(f, libc::O_WRONLY).await;
    h.write(w, 0, b"new").await;
    assert_eq!(
        h.read(r, 0, 4096).await,
        b"new old old",
        "a write through the mount"
    );
    h.fs.release(r).await.unwrap();

    // Another descriptor open, its write answered at once and not on the server yet.
    assert_eq!(h.size(f, Some(w)).await, 11);
    let known = h.fs.cache.lock().unwrap().get_attrs(f).unwrap();
    h.plan.hold(ROp::Write);
    h.write(w, 4, b"NEW").await;
    // The size known (a getattr would wait for the write): nothing else keeps this open
    // from reading along.
    h.fs.cache.lock().unwrap().put_attrs(f, known);
    let r = h.open(f, libc::O_RDONLY).await;
    assert_eq!(along(), 1, "read along beside an open descriptor");
    h.plan.release(ROp::Write);
    assert_eq!(h.read(r, 0, 4096).await, b"new NEW old");
    h.fs.release(r).await.unwrap();
    h.fs.release(w).await.unwrap();

    let w = h.open(f, libc::O_WRONLY).await;
    h.write(w, 0, b"NEW").await;
    h.fs.flush(w).await.unwrap();
    let r = h.open(f, libc::O_RDONLY).await;
    assert_eq!(
        along(),
        2,
        "not read along beside a descriptor with nothing on its way"
    );
    assert_eq!(h.read(r, 0, 4096).await, b"NEW NEW old");
    h.fs.release(r).await.unwrap();
    h.fs.release(w).await.unwrap();

    // A change on the server shows once the TTL has passed.
    assert_eq!(h.size(f, None).await, 11);
    let r = h.open(f, libc::O_RDONLY).await;
    assert_eq!(along(), 3);
    std::fs::write(h.disk("f"), b"server's!!!").unwrap();
    h.fs.expire_cache();
    assert_eq!(h.read(r, 0, 4096).await, b"server's!!!", "past the TTL");
    h.fs.release(r).await.unwrap();
}

/// Another name of the file (a link made on the server, an inode of its own here) changed
/// through the mount after an open read along: the bytes read along are older than the
/// change, and a read answered with them after it would leave old pages in the kernel that
/// nothing drops again ([`Fs::read_answered`] looks only at the read itself). The server is
/// asked instead. (The open notes y, so the change marks it changed after the open began;
/// the count of such changes compared in `read_along_for` covers files whose link count is
/// not known, which are not noted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_along_never_hides_a_change_through_another_name() {
    let h = Harness::new();
    std::fs::write(h.disk("x"), b"old old").unwrap();
    std::fs::hard_link(h.disk("x"), h.disk("y")).unwrap();
    // In a directory of its own: a second open in one directory fetches its other small
    // files ahead, which would count as reads below.
    std::fs::create_dir(h.disk("d")).unwrap();
    std::fs::write(h.disk("d/z"), b"zzz").unwrap();
    list_plus(&h, ROOT).await;
    let d = h.lookup(ROOT, "d").await;
    let (x, y, z) = (
        h.lookup(ROOT, "x").await,
        h.lookup(ROOT, "y").await,
        h.lookup(d, "z").await,
    );
    let along = || h.fs.stats.opens_read_along.load(Ordering::Relaxed);
    let reads = || h.plan.calls(ROp::Read);
    let ry = h.open(y, libc::O_RDONLY).await;
    let rz = h.open(z, libc::O_RDONLY).await;
    assert_eq!(along(), 2, "y and z read along");
    let w = h.open(x, libc::O_WRONLY).await;
    h.write(w, 0, b"NEW").await;
    h.fs.flush(w).await.unwrap();
    h.fs.release(w).await.unwrap();
    let n = reads();
    assert_eq!(
        h.read(ry, 0, 4096).await,
        b"NEW old",
        "y answered with bytes read before the change through x"
    );
    assert_eq!(reads(), n + 1);
    // A file that shares nothing with x keeps what it read along.
    assert_eq!(h.read(rz, 0, 4096).await, b"zzz");
    assert_eq!(reads(), n + 1, "z's read along dropped too");
    h.fs.release(ry).await.unwrap();
    h.fs.release(rz).await.unwrap();
}

/// A file written through the mount and closed has no known attributes (the server set its
/// mtime as the writes landed): the next open for reading asks them along with its open and
/// first bytes, and the kernel's `fstat` and first reads right after (an editor's save read
/// back, a tool's output) are answered with what came along. A file bigger than that read
/// has its first bytes answered so; past them the server is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_along_brings_the_attributes_when_they_are_not_known() {
    let h = Harness::new();
    let along = || h.fs.stats.opens_read_along.load(Ordering::Relaxed);
    let asked = || {
        [ROp::Lstat, ROp::Stat, ROp::Fstat, ROp::Read]
            .map(|op| h.plan.calls(op))
            .to_vec()
    };
    for (name, len) in [("small", 5_000usize), ("big", 300_000)] {
        let data: Vec<u8> = (0..len as u32).map(|i| (i * 13 + 5) as u8).collect();
        let (f, w) = h.create(ROOT, name).await;
        h.write(w, 0, &data).await;
        h.fs.release(w).await.unwrap();
        let before = (along(), asked());
        let r = h.open(f, libc::O_RDONLY).await;
        assert_eq!(along(), before.0 + 1, "{name}: not read along");
        let with_open = asked();
        // (fstat(2) reaches the mount without the descriptor.)
        assert_eq!(h.size(f, None).await, len as u64, "{name}: size");
        assert_eq!(h.read(r, 0, 4096).await, &data[..4096], "{name}");
        let end = len.min(8192);
        assert_eq!(h.read(r, 4096, 4096).await, &data[4096..end], "{name}");
        assert_eq!(asked(), with_open, "{name}: fstat or read asked the server");
        if len > 8192 {
            let at = 128 * 1024;
            assert_eq!(h.read(r, at, 4096).await, &data[at as usize..][..4096]);
            assert_eq!(h.read(r, 200_000, 4096).await, &data[200_000..204_096]);
        }
        h.fs.release(r).await.unwrap();
    }
}

/// `open(O_TRUNC)` (atomic_o_trunc: the flag comes with the open, no setattr follows)
/// truncates in the OPEN itself, after the writes of another descriptor that were on their
/// way (or they would extend the emptied file again), and knows the attributes the kernel
/// asks right after, from the same round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_with_o_trunc_truncates_after_writes_on_their_way() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), vec![1u8; 10_000]).unwrap();
    let f = h.lookup(ROOT, "f").await;
    let other = h.open(f, libc::O_WRONLY).await;
    // Lands 200 ms after it is sent.
    h.plan
        .set_queue_delay(ROp::Write, Some(Duration::from_millis(200)));
    h.write(other, 20_000, b"tail").await;
    let setstats = h.plan.calls(ROp::Setstat) + h.plan.calls(ROp::Fsetstat);
    let fh = h.open(f, libc::O_WRONLY | libc::O_TRUNC).await;
    assert_eq!(h.meta("f").len(), 0, "not truncated by the open");
    let asked = || {
        [ROp::Lstat, ROp::Stat, ROp::Fstat]
            .map(|op| h.plan.calls(op))
            .to_vec()
    };
    let stats = asked();
    // (fstat(2) reaches the mount without the descriptor.)
    assert_eq!(h.size(f, None).await, 0);
    assert_eq!(asked(), stats, "the size asked again after the open");
    h.plan.set_queue_delay(ROp::Write, None);
    h.write(fh, 0, b"new").await;
    h.fs.release(fh).await.unwrap();
    h.fs.release(other).await.unwrap();
    // (Without the wait, the other descriptor's write lands after the truncate.)
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"new");
    assert_eq!(
        h.plan.calls(ROp::Setstat) + h.plan.calls(ROp::Fsetstat),
        setstats,
        "truncated by a SETSTAT"
    );
}

/// `open(O_TRUNC)` by anyone but root clears the set-user-ID bit and the set-group-ID bit of
/// a group-executable file, as a truncate does on a local disk; root's keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_with_o_trunc_clears_set_id_bits_but_for_root() {
    use std::os::unix::fs::PermissionsExt as _;
    let h = Harness::new();
    let cases = [
        (
            "user",
            0o6755,
            Caller {
                uid: 1000,
                gid: 1000,
            },
            0o755,
        ),
        (
            "nox",
            0o2644,
            Caller {
                uid: 1000,
                gid: 1000,
            },
            0o2644,
        ),
        ("root", 0o6755, Caller::ROOT, 0o6755),
    ];
    for (name, mode, _, _) in cases {
        std::fs::write(h.disk(name), b"data").unwrap();
        std::fs::set_permissions(h.disk(name), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    for (name, _, caller, left) in cases {
        let ino = h.lookup(ROOT, name).await;
        let req = OpenRequest {
            flags: libc::O_WRONLY | libc::O_TRUNC,
            pid: 0,
            caller,
        };
        let fh = h.fs.open(ino, req).await.unwrap();
        let (a, _) = h.fs.getattr(ino, None).await.unwrap();
        h.fs.release(fh).await.unwrap();
        let meta = h.meta(name);
        assert_eq!(
            (meta.len(), meta.permissions().mode() & 0o7777),
            (0, left),
            "{name}: on the server"
        );
        assert_eq!(u32::from(a.perm), left, "{name}: shown");
    }
    // A server that refuses to change the mode: the open, which has truncated the file
    // already, still succeeds.
    std::fs::write(h.disk("user"), b"data").unwrap();
    std::fs::set_permissions(h.disk("user"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    let ino = h.lookup(ROOT, "user").await;
    h.plan.fail_always(
        ROp::Fsetstat,
        RemoteError::Status(Status::PermissionDenied, "no".into()),
    );
    let req = OpenRequest {
        flags: libc::O_WRONLY | libc::O_TRUNC,
        pid: 0,
        caller: Caller {
            uid: 1000,
            gid: 1000,
        },
    };
    let fh =
        h.fs.open(ino, req)
            .await
            .expect("open with the mode refused");
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.meta("user").len(), 0);
}

/// `keep_cache`: an open leaves the kernel's pages of a file in place while every one of
/// them was read less than the attribute TTL ago and the file is as it was then; a write
/// through the mount, a new size or mtime from the server, or the TTL makes the open drop
/// them (and start counting again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_pages_kept_while_the_file_is_as_it_was_read() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"12345").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let open = |flags: i32| h.open_keeps_cache(f, flags);
    assert!(!open(libc::O_RDONLY).await, "first open");
    assert!(open(libc::O_RDONLY).await, "nothing changed");
    assert!(open(libc::O_RDWR).await, "an open for writing is no change");

    let (fh, _) =
        h.fs.open_keeping_cache(f, as_root(libc::O_WRONLY))
            .await
            .unwrap();
    h.write(fh, 0, b"a").await;
    h.fs.release(fh).await.unwrap();
    assert!(
        !open(libc::O_RDONLY).await,
        "after a write through the mount"
    );
    assert!(
        open(libc::O_RDONLY).await,
        "nothing changed since the write"
    );

    // Changed on the server: the size shows once the attributes are asked for again
    // (their lifetime run out, not the pages').
    std::fs::write(h.disk("f"), b"123456789").unwrap();
    h.fs.cache.lock().unwrap().expire_all();
    assert_eq!(h.size(f, None).await, 9);
    assert!(
        !open(libc::O_RDONLY).await,
        "after the server's change showed"
    );
    assert!(open(libc::O_RDONLY).await, "nothing changed since");
    // Once more, now that the pages' attributes were known when they were dropped.
    std::fs::write(h.disk("f"), b"1234567").unwrap();
    h.fs.cache.lock().unwrap().expire_all();
    assert_eq!(h.size(f, None).await, 7);
    assert!(
        !open(libc::O_RDONLY).await,
        "after the server's second change showed"
    );
    assert!(
        open(libc::O_RDONLY).await,
        "nothing changed since the second"
    );

    // The TTL: pages read longer ago than that are dropped even if nothing shows a change
    // (SFTP v3 mtimes are whole seconds; a same-size change within one shows nowhere).
    h.fs.expire_cache();
    assert_eq!(h.size(f, None).await, 7);
    assert!(!open(libc::O_RDONLY).await, "past the TTL");
    assert!(open(libc::O_RDONLY).await, "within the new TTL");

    // Past the TTL with the attributes not asked for again.
    h.fs.expire_cache();
    assert!(
        !open(libc::O_RDONLY).await,
        "past the TTL, attributes unknown"
    );
}

/// Reopening a file whose pages the kernel keeps is answered without the server (no OPEN):
/// the first read that reaches the mount opens the file then; an unlink of its name gives
/// the descriptor a handle first, so it stays readable; a file removed on the server within
/// the TTL fails at that first read. An open for writing always asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_within_the_ttl_asks_the_server_only_when_read() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"hello").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let open = |flags: i32| h.fs.open_keeping_cache(f, as_root(flags));
    let opens = || h.plan.calls(ROp::Open);
    let (fh, keep) = open(libc::O_RDONLY).await.unwrap();
    assert!(!keep);
    h.fs.release(fh).await.unwrap();
    let n = opens();
    let (fh, keep) = open(libc::O_RDONLY).await.unwrap();
    assert!(keep);
    assert_eq!(opens(), n, "a reopen asked the server");
    assert_eq!(h.fs.stats.opens_deferred.load(Ordering::Relaxed), 1);
    assert_eq!(
        h.read(fh, 0, 100).await,
        b"hello",
        "a page the kernel did not have"
    );
    assert_eq!(opens(), n + 1, "opened at the first read");
    assert_eq!(h.read(fh, 1, 100).await, b"ello");
    h.fs.release(fh).await.unwrap();

    let (w, keep) = open(libc::O_RDWR).await.unwrap();
    assert!(keep, "nothing changed");
    assert_eq!(opens(), n + 2, "an open for writing asks the server");
    h.fs.release(w).await.unwrap();
    // (A descriptor that may have written counts as a change when it closes, and leaves
    // the attributes unknown: an open is answered without the server only with them known.)
    assert_eq!(h.size(f, None).await, 5);
    let (fh, keep) = open(libc::O_RDONLY).await.unwrap();
    assert!(!keep);
    h.fs.release(fh).await.unwrap();

    let (fh, keep) = open(libc::O_RDONLY).await.unwrap();
    assert!(keep);
    assert_eq!(opens(), n + 3);
    h.fs.unlink(ROOT, os("f")).await.unwrap();
    assert!(!h.disk("f").exists());
    assert_eq!(
        h.read(fh, 0, 100).await,
        b"hello",
        "read after its name went"
    );
    h.fs.release(fh).await.unwrap();

    // Removed on the server within the TTL: the open cannot tell, the first read can.
    std::fs::write(h.disk("g"), b"gone soon").unwrap();
    let g = h.lookup(ROOT, "g").await;
    assert!(!h.open_keeps_cache(g, libc::O_RDONLY).await);
    let (fh, keep) =
        h.fs.open_keeping_cache(g, as_root(libc::O_RDONLY))
            .await
            .unwrap();
    assert!(keep);
    std::fs::remove_file(h.disk("g")).unwrap();
    assert!(
        h.fs.read(fh, 0, 100).await.is_err(),
        "read of a file removed on the server"
    );
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0, "server handles leaked");
}

/// fsync through a descriptor opened without the server (the kernel keeps the file's pages,
/// as for `sync FILE` after a `cp` and a read of the copy) still has the server write the file
/// to its disk: fsync is of the file, not of what the descriptor wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_of_a_descriptor_opened_without_the_server_reaches_it() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"hello").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let open = |flags: i32| h.fs.open_keeping_cache(f, as_root(flags));
    let (fh, _) = open(libc::O_RDONLY).await.unwrap();
    h.fs.release(fh).await.unwrap();
    let (fh, keep) = open(libc::O_RDONLY).await.unwrap();
    assert!(keep, "the reopen was answered by the server");
    let fsyncs = h.plan.calls(ROp::Fsync);
    h.fs.fsync(fh).await.unwrap();
    assert_eq!(
        h.plan.calls(ROp::Fsync),
        fsyncs + 1,
        "no fsync reached the server"
    );
    assert_eq!(h.read(fh, 0, 100).await, b"hello");
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0, "server handles leaked");
}

/// No attribute TTL: the kernel's pages are dropped at every open, as the attributes are
/// asked for every time. A file with links the mount does not know keeps them until a
/// change through another of its names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_pages_never_kept_without_a_ttl() {
    let h = Harness::with(
        config(CacheConfig {
            attr_ttl: Duration::ZERO,
            ..long_ttls()
        }),
        None,
    );
    std::fs::write(h.disk("f"), b"12345").unwrap();
    let f = h.lookup(ROOT, "f").await;
    for i in 0..3 {
        assert!(!h.open_keeps_cache(f, libc::O_RDONLY).await, "open {i}");
    }

    let h = Harness::new();
    std::fs::write(h.disk("x"), b"data").unwrap();
    // A second name made on the server, which the mount learns of from a listing only.
    std::fs::hard_link(h.disk("x"), h.disk("y")).unwrap();
    let x = h.lookup(ROOT, "x").await;
    assert!(!h.open_keeps_cache(x, libc::O_RDONLY).await);
    list_plus(&h, ROOT).await;
    assert!(!h.fs.getattr(x, None).await.unwrap().1.is_zero());
    assert!(
        h.open_keeps_cache(x, libc::O_RDONLY).await,
        "links the mount does not know, nothing changed"
    );
    let y = h.lookup(ROOT, "y").await;
    let fh = h.open(y, libc::O_WRONLY).await;
    h.write(fh, 0, b"DATA").await;
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    for again in [false, true] {
        assert_eq!(
            h.open_keeps_cache(x, libc::O_RDONLY).await,
            again,
            "after a change through another name (again: {again})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_getattr_within_ttl_stays_local_and_after_ttl_asks() {
    // Long TTLs, run out on demand (`expire_cache`): no stall can end them early. The TTLs
    // themselves are waited out in the FUSE test `server_changes_show_after_the_ttl`.
    let h = Harness::with(config(long_ttls()), None);
    std::fs::write(h.disk("f"), b"12345").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let before = h.plan.calls(ROp::Lstat);
    assert_eq!(h.size(f, None).await, 5);
    assert_eq!(h.size(f, None).await, 5);
    assert_eq!(
        h.plan.calls(ROp::Lstat),
        before,
        "getattr within the TTL reached the server"
    );
    // A change behind the core's back is not seen within the TTL ...
    std::fs::write(h.disk("f"), b"1234567890").unwrap();
    assert_eq!(h.size(f, None).await, 5);
    // ... and is after it.
    h.fs.expire_cache();
    assert_eq!(
        h.size(f, None).await,
        10,
        "server-side change after the TTL"
    );
    assert!(
        h.plan.calls(ROp::Lstat) > before,
        "getattr after the TTL did not ask"
    );
    let asked = h.plan.calls(ROp::Lstat);
    assert_eq!(h.size(f, None).await, 10);
    assert_eq!(
        h.plan.calls(ROp::Lstat),
        asked,
        "the fresh answer was not cached"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_negative_lookups() {
    let h = Harness::with(config(long_ttls()), None);
    assert_errno(h.fs.lookup(ROOT, os("ghost")).await, libc::ENOENT, "first");
    let asked = h.plan.calls(ROp::Lstat);
    assert_errno(h.fs.lookup(ROOT, os("ghost")).await, libc::ENOENT, "second");
    assert_eq!(h.plan.calls(ROp::Lstat), asked, "negative entry not used");
    // Created on the server: still cached as missing within the TTL, found after it.
    std::fs::write(h.disk("ghost"), b"boo").unwrap();
    assert_errno(
        h.fs.lookup(ROOT, os("ghost")).await,
        libc::ENOENT,
        "within TTL",
    );
    h.fs.expire_cache();
    let e = h.fs.lookup(ROOT, os("ghost")).await.unwrap();
    assert_eq!(e.attr.size, 3, "server-side create after the negative TTL");
    // Through the core a negative entry is dropped at once.
    assert_errno(
        h.fs.lookup(ROOT, os("dir")).await,
        libc::ENOENT,
        "before mkdir",
    );
    h.mkdir(ROOT, "dir").await;
    h.lookup(ROOT, "dir").await;
    assert_errno(
        h.fs.lookup(ROOT, os("link")).await,
        libc::ENOENT,
        "before symlink",
    );
    h.fs.symlink(ROOT, os("link"), Path::new("ghost"), Caller::ROOT)
        .await
        .unwrap();
    h.lookup(ROOT, "link").await;
    assert_errno(
        h.fs.lookup(ROOT, os("hard")).await,
        libc::ENOENT,
        "before link",
    );
    h.fs.link(e.attr.ino, ROOT, os("hard")).await.unwrap();
    h.lookup(ROOT, "hard").await;
    assert_errno(
        h.fs.lookup(ROOT, os("renamed")).await,
        libc::ENOENT,
        "before rename",
    );
    h.fs.rename(ROOT, os("hard"), ROOT, os("renamed"), 0)
        .await
        .unwrap();
    h.lookup(ROOT, "renamed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_listing_answers_lookups_then_expires() {
    let h = Harness::with(config(long_ttls()), None);
    for i in 0..20 {
        std::fs::write(h.disk(format!("f{i}")), vec![b'x'; i]).unwrap();
    }
    let dh = h.fs.opendir(ROOT).await.unwrap();
    h.fs.releasedir(dh);
    h.plan.reset_counts();
    for i in 0..20 {
        let e = h.fs.lookup(ROOT, os(&format!("f{i}"))).await.unwrap();
        assert_eq!(e.attr.size, i as u64);
        assert_eq!(e.attr.kind, FileKind::File);
    }
    assert_errno(
        h.fs.lookup(ROOT, os("absent")).await,
        libc::ENOENT,
        "not in listing",
    );
    assert_eq!(
        h.plan.total_calls(),
        0,
        "lookups in a freshly listed directory reached the server: {:?}",
        h.plan.call_counts()
    );
    // Server-side delete and create show after the listing expires.
    std::fs::remove_file(h.disk("f3")).unwrap();
    std::fs::write(h.disk("absent"), b"").unwrap();
    h.fs.expire_cache();
    assert_errno(
        h.fs.lookup(ROOT, os("f3")).await,
        libc::ENOENT,
        "deleted on server",
    );
    h.lookup(ROOT, "absent").await;
}

/// An entry answered from a directory listing taken before a write through the core must not
/// show the size from before the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_write_then_lookup_with_a_cached_listing() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    let dh = h.fs.opendir(ROOT).await.unwrap(); // `ls` after the create: f is empty
    h.fs.releasedir(dh);
    h.write(fh, 0, b"hello").await;
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.meta("f").len(), 5);
    let mut c = Checks::default();
    let e = h.fs.lookup(ROOT, os("f")).await.unwrap();
    c.check(
        &format!("lookup after write: size {} (want 5)", e.attr.size),
        e.attr.size == 5,
    );
    let size = h.size(f, None).await;
    c.check(
        &format!("getattr after that lookup: size {size} (want 5)"),
        size == 5,
    );
    c.finish();
}

/// A name made or removed in a directory moves its mtime on the server, and its ctime: a
/// lookup of the directory answered from its parent's listing, taken before, must not give
/// the kernel the old ones (Python's import finder rescans a directory only when its mtime
/// changes: a module just written there would not be found). The listing shows the mtime
/// moved, without a round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_a_directory_changed_through_the_mount_is_not_shown_from_an_older_listing() {
    let h = Harness::new();
    std::fs::create_dir_all(h.disk("p/sub")).unwrap();
    let old = std::fs::FileTimes::new().set_modified(UNIX_EPOCH + Duration::from_secs(1_000_000));
    std::fs::File::open(h.disk("p/sub"))
        .unwrap()
        .set_times(old)
        .unwrap();
    let p = h.lookup(ROOT, "p").await;
    let listed = list_plus(&h, p).await;
    let (_, sub) = listed.iter().find(|(n, _)| n == "sub").unwrap();
    assert_eq!(secs(sub.attr.mtime), 1_000_000);
    let before = sub.attr.ctime;
    let sub = sub.attr.ino;
    let (_, fh) = h.create(sub, "new.py").await;
    h.fs.release(fh).await.unwrap();
    let server = h.meta("p/sub").mtime();
    assert_ne!(server, 1_000_000, "the server did not move the mtime");
    for (how, e) in [
        ("lookup", h.fs.lookup(p, os("sub")).await.unwrap()),
        (
            "readdirplus",
            list_plus(&h, p)
                .await
                .into_iter()
                .find(|(n, _)| n == "sub")
                .unwrap()
                .1,
        ),
    ] {
        // The listing shows the mtime moved to the mount's clock at the change, just after
        // the server's: the same second, or the next.
        let shown = secs(e.attr.mtime) as i64;
        assert!(
            (server..=server + 1).contains(&shown),
            "{how}: mtime {shown}, the server's {server}"
        );
        assert!(e.attr.ctime > before, "{how}: the ctime did not move");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_setattr_then_lookup_with_a_cached_listing() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"hello").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let dh = h.fs.opendir(ROOT).await.unwrap();
    h.fs.releasedir(dh);
    let set = SetattrRequest {
        size: Some(2),
        mode: Some(libc::S_IFREG | 0o600),
        ..Default::default()
    };
    h.fs.setattr(f, None, set).await.unwrap();
    let mut c = Checks::default();
    let e = h.fs.lookup(ROOT, os("f")).await.unwrap();
    c.check(
        &format!("lookup after truncate: size {} (want 2)", e.attr.size),
        e.attr.size == 2,
    );
    c.check(
        &format!("lookup after chmod: perm {:o} (want 600)", e.attr.perm),
        e.attr.perm == 0o600,
    );
    let a = h.fs.getattr(f, None).await.unwrap().0;
    c.check(
        &format!("getattr after that lookup: size {} (want 2)", a.size),
        a.size == 2,
    );
    c.finish();
}

/// A lookup that runs while a write is in flight caches the size from before the write; once
/// the write is acknowledged, getattr must not serve that stale size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_lookup_racing_a_write_does_not_poison_the_attr_cache() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    h.plan.hold(ROp::Write);
    let write = tokio::spawn(h.fs.write(fh, 0, &[b'x'; 100]));
    h.plan.until_held(ROp::Write, 1).await;
    // Another process stats the file by name while the write is on its way.
    h.fs.lookup(ROOT, os("f")).await.unwrap();
    h.plan.release(ROp::Write);
    assert_eq!(write.await.unwrap().unwrap(), 100);
    // The write has been acknowledged to the application.
    let size = h.size(f, None).await;
    assert_eq!(
        size, 100,
        "getattr after an acknowledged write shows the old size"
    );
    h.plan.clear_all();
    h.fs.release(fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_memory_is_bounded() {
    const MAX: usize = 100;
    let h = Harness::with(
        config(CacheConfig {
            max_entries: MAX,
            ..long_ttls()
        }),
        None,
    );
    // The MetaCache bound: attrs + negative at max_entries each, listings at
    // max(max_entries / 64, 16), symlink targets at max_entries / 4.
    let bound = MAX + MAX + (MAX / 64).max(16) + MAX / 4;
    for i in 0..5_000 {
        std::fs::write(h.disk(format!("f{i}")), b"").unwrap();
    }
    let mut found = Vec::new();
    for i in 0..10_000 {
        if i % 2 == 0 {
            found.push(h.lookup(ROOT, format!("f{}", i / 2)).await);
        } else {
            assert_errno(
                h.fs.lookup(ROOT, os(&format!("missing{i}"))).await,
                libc::ENOENT,
                "missing",
            );
        }
        if i % 500 == 0 {
            let len = h.fs.cache.lock().unwrap().len();
            assert!(
                len <= bound,
                "cache holds {len} entries after {i} lookups (bound {bound})"
            );
        }
    }
    let len = h.fs.cache.lock().unwrap().len();
    assert!(len <= bound, "cache holds {len} entries (bound {bound})");
    // The inode table follows the kernel's references, not the cache bound...
    assert_eq!(h.fs.inode_count(), 1 + 5_000);
    // ...and empties when the kernel forgets them.
    for ino in found {
        h.fs.forget(ino, 1);
    }
    assert_eq!(h.fs.inode_count(), 1);
    assert!(h.fs.cache.lock().unwrap().len() <= bound);
}

// ------------------------------------------------------------------------------ write-behind

/// Long TTLs, and a server taking WRITEs of at most 4 KiB: many writes for little data.
fn harness_with_4k_writes() -> Harness {
    Harness::with(
        config(long_ttls()),
        Some(Limits {
            max_read: 16 * 1024,
            max_write: 4096,
            max_open_handles: 64,
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_many_writes_then_flush_are_all_on_disk_in_order() {
    let h = harness_with_4k_writes();
    let (f, fh) = h.create(ROOT, "f").await;
    let mut model = Vec::new();
    let mut pending = Vec::new();
    for i in 0..400usize {
        // Mostly sequential appends of odd sizes (some over max_write), with overwrites of
        // earlier ranges mixed in.
        let (offset, len) = if i % 7 == 3 && model.len() > 100 {
            (model.len() / 3 + i, 50 + i % 13)
        } else {
            (model.len(), 1 + (i * 37) % 9000)
        };
        let data: Vec<u8> = (0..len).map(|j| (i + j) as u8).collect();
        if model.len() < offset + len {
            model.resize(offset + len, 0);
        }
        model[offset..offset + len].copy_from_slice(&data);
        // Queued in order, as the FUSE thread does; answered later.
        pending.push(h.fs.write(fh, offset as u64, &data));
    }
    h.fs.flush(fh).await.unwrap();
    assert_eq!(
        std::fs::read(h.disk("f")).unwrap(),
        model,
        "disk after flush"
    );
    for p in pending {
        p.await.unwrap();
    }
    assert_eq!(h.size(f, Some(fh)).await, model.len() as u64);
    assert_eq!(h.read(fh, 0, model.len() as u32 + 10).await, model);
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0);
}

/// Small writes queued behind one the server has not taken yet go out merged, as few WRITEs
/// of at most `max_write` as their order allows: a write that does not continue the one
/// before (here an overwrite further back) ends a merge and starts the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_small_writes_queued_behind_one_go_out_merged() {
    let h = harness_with_4k_writes();
    let (f, fh) = h.create(ROOT, "f").await;
    h.plan.hold(ROp::Write);
    let mut model = vec![b'a'; 100];
    assert_eq!(h.fs.write(fh, 0, &model).await.unwrap(), 100);
    // The writer waits at the server's door with it; what follows queues behind.
    h.plan.until_held(ROp::Write, 1).await;
    let append = |h: &Harness, model: &mut Vec<u8>, i: usize| {
        let d: Vec<u8> = (0..100).map(|j| (i * 7 + j) as u8).collect();
        let w = h.fs.write(fh, model.len() as u64, &d);
        model.extend(d);
        w
    };
    for i in 0..100 {
        assert_eq!(append(&h, &mut model, i).await.unwrap(), 100);
    }
    assert_eq!(h.fs.write(fh, 50, b"XYZ").await.unwrap(), 3);
    model[50..53].copy_from_slice(b"XYZ");
    for i in 100..110 {
        assert_eq!(append(&h, &mut model, i).await.unwrap(), 100);
    }
    assert_eq!(
        h.plan.calls(ROp::Write),
        1,
        "nothing more reached the server"
    );
    h.plan.release(ROp::Write);
    h.fs.flush(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), model);
    // The first; 10,000 bytes in 4,000 + 4,000 + 2,000 (whole writes up to 4,096); the
    // overwrite; the last 1,000 bytes.
    assert_eq!(h.plan.calls(ROp::Write), 6);
    assert_eq!(h.fs.stats.writes_merged.load(Ordering::Relaxed), 106);
    assert_eq!(h.size(f, Some(fh)).await, model.len() as u64);
    h.fs.release(fh).await.unwrap();
}

/// Merging takes only one descriptor's writes: a write through another descriptor, even
/// one that continues the last, goes out on its own, and so do the writes after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_merging_stops_at_a_write_through_another_descriptor() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    let fh2 = h.open(f, libc::O_WRONLY).await;
    h.plan.hold(ROp::Write);
    h.fs.write(fh, 0, b"0").await.unwrap();
    h.plan.until_held(ROp::Write, 1).await;
    let mut model = b"0".to_vec();
    for (through, rounds) in [(fh, 10), (fh2, 1), (fh, 10)] {
        for _ in 0..rounds {
            let d = [b'a' + (model.len() % 26) as u8; 3];
            h.fs.write(through, model.len() as u64, &d).await.unwrap();
            model.extend(d);
        }
    }
    h.plan.release(ROp::Write);
    h.fs.flush(fh).await.unwrap();
    h.fs.flush(fh2).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), model);
    assert_eq!(
        h.plan.calls(ROp::Write),
        4,
        "first, 10 merged, the other's, 10 merged"
    );
    h.fs.release(fh2).await.unwrap();
    h.fs.release(fh).await.unwrap();
}

/// Create `f` (`O_EXCL`, so its time changes go behind its writes) and queue a time change
/// whose FSETSTAT is held at the server's door: the file's writer waits there, and the
/// writes queued meanwhile wait behind it. `release(ROp::Fsetstat)` lets them go.
async fn writer_held_behind_a_time_change(h: &Harness) -> u64 {
    let (f, fh) = h
        .create_with(ROOT, "f", libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL)
        .await;
    h.plan.hold(ROp::Fsetstat);
    let set = SetattrRequest {
        mtime: at(1_000_000),
        ..Default::default()
    };
    h.fs.setattr(f, None, set).await.unwrap();
    h.plan.until_held(ROp::Fsetstat, 1).await;
    fh
}

/// A write that waits for the writer (the early-answer queue was full) and is merged into a
/// WRITE that cannot be sent is answered with the failure, as it would be on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_a_waiting_write_merged_into_a_refused_send_is_told() {
    let h = Harness::with(
        config(long_ttls()),
        Some(Limits {
            max_read: 16 * 1024,
            max_write: 2 * super::file::EARLY_ANSWER_BYTES,
            max_open_handles: 64,
        }),
    );
    let fh = writer_held_behind_a_time_change(&h).await;
    let mib = vec![7u8; (super::file::EARLY_ANSWER_BYTES / 4) as usize];
    for i in 0..4u64 {
        let mut w = Box::pin(h.fs.write(fh, i * mib.len() as u64, &mib));
        assert!(
            answered_at_once(&mut w).is_some(),
            "write {i} fits in the queue"
        );
    }
    let mut waiting = Box::pin(h.fs.write(fh, super::file::EARLY_ANSWER_BYTES as u64, b"tail"));
    assert!(
        answered_at_once(&mut waiting).is_none(),
        "the queue is full"
    );
    h.plan.fail_next(ROp::Write, 1, failure("injected"));
    h.plan.release(ROp::Fsetstat);
    let e = waiting.await.unwrap_err();
    assert_eq!(e.errno, libc::EIO, "{e}");
    assert_eq!(
        h.plan.calls(ROp::Write),
        1,
        "the five writes went out as one"
    );
    assert_eq!(h.fs.stats.writes_merged.load(Ordering::Relaxed), 4);
    h.fs.release(fh).await.ok();
}

/// A merged WRITE that fails is reported like any write: by the next flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_a_failed_merged_write_is_reported() {
    let h = Harness::new();
    let fh = writer_held_behind_a_time_change(&h).await;
    for i in 0..20u64 {
        assert_eq!(h.fs.write(fh, i * 4, b"more").await.unwrap(), 4);
    }
    h.plan.fail_next(ROp::Write, 1, failure("injected"));
    h.plan.release(ROp::Fsetstat);
    let e = h.fs.flush(fh).await.unwrap_err();
    assert_eq!(e.errno, libc::EIO, "{e}");
    assert_eq!(h.plan.calls(ROp::Write), 1, "the 20 writes went out as one");
    assert_eq!(h.fs.stats.writes_merged.load(Ordering::Relaxed), 19);
    assert_eq!(h.meta("f").len(), 0, "the failed write landed");
    // Reported once; the file is usable again.
    h.write(fh, 0, b"again").await;
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_overlapping_writes_keep_their_order() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "f").await;
    h.plan
        .set_op_delay(ROp::Write, Some(Duration::from_millis(100)));
    let a = h.fs.write(fh, 0, b"AAAA");
    let b = h.fs.write(fh, 0, b"BB");
    let (a, b) = tokio::join!(a, b);
    assert_eq!((a.unwrap(), b.unwrap()), (4, 2));
    h.fs.flush(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"BBAA");
    // Many overlapping writes, each one byte longer at offset 0, last one shortest.
    let mut futs = Vec::new();
    h.plan
        .set_op_delay(ROp::Write, Some(Duration::from_millis(5)));
    for i in (1..=20u8).rev() {
        futs.push(h.fs.write(fh, 0, &vec![b'a' + i; i as usize]));
    }
    h.fs.flush(fh).await.unwrap();
    let want: Vec<u8> = (1..=20u8).map(|i| b'a' + i).collect();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), want);
    for f in futs {
        f.await.unwrap();
    }
    h.plan.clear_all();
    assert_eq!(h.read(fh, 0, 100).await, want);
    h.fs.release(fh).await.unwrap();
}

/// fsync is of the file: a write that failed through one descriptor is reported by the
/// fsync of another (an `msync` whose pages went out through another descriptor's handle,
/// `sync FILE` after a writer that ignored close's answer), once per descriptor, as the
/// kernel's errseq tells each open file; a descriptor opened after the failure was reported
/// does not hear of it, one opened before anyone was told does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_failure_is_reported_by_the_fsync_of_every_descriptor_of_the_file() {
    let h = Harness::new();
    let (f, a) = h.create(ROOT, "f").await;
    let b = h.open(f, libc::O_RDWR).await;
    h.plan.fail_next(ROp::Write, 1, failure("injected"));
    let _ = h.fs.write(a, 0, b"lost").await;
    // (The failure is in once b's close has waited for the file's writes.)
    let _ = h.fs.flush(b).await;
    let c = h.open(f, libc::O_RDONLY).await;
    assert_errno(
        h.fs.fsync(b).await,
        libc::EIO,
        "fsync of another descriptor",
    );
    h.fs.fsync(b).await.expect("told once");
    assert_errno(
        h.fs.fsync(c).await,
        libc::EIO,
        "opened before anyone was told",
    );
    let d = h.open(f, libc::O_RDONLY).await;
    h.fs.fsync(d).await.expect("opened after it was told");
    // The writer's own descriptor still hears of it.
    assert!(
        h.fs.fsync(a).await.is_err(),
        "fsync of the writer's descriptor"
    );
    for fh in [a, b, c, d] {
        let _ = h.fs.release(fh).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_write_failure_is_reported_by_the_next_flush() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    h.write(fh, 0, b"good").await;
    h.fs.flush(fh).await.unwrap();

    h.plan.fail_next(ROp::Write, 1, failure("injected"));
    // The application may be told at once or at the next flush; it must be told.
    let first = h.fs.write(fh, 4, b"lost").await;
    let flushed = h.fs.flush(fh).await;
    assert!(
        first.is_err() || flushed.is_err(),
        "a failed write was acknowledged and the flush after it succeeded"
    );
    if let Err(e) = flushed {
        assert_eq!(e.errno, libc::EIO, "flush after a failed write: {e}");
    }
    // Reported once (like errseq); the file is usable again afterwards.
    h.write(fh, 4, b"more").await;
    h.fs.flush(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"goodmore");

    // A failure followed by more writes. A write answered when queued, before the failure
    // came back, is not sent after it. The descriptor's writes are told of it once: the
    // first that waits for the writer once it is back (2222 if it was back by then; else
    // 3333, after the getattr that waits for the writes before it). Flush is told too.
    h.plan.fail_next(ROp::Write, 1, failure("injected"));
    let w1 = h.fs.write(fh, 8, b"1111").await;
    let w2 = h.fs.write(fh, 12, b"2222").await;
    let _ = h.fs.getattr(f, Some(fh)).await;
    let w3 = h.fs.write(fh, 16, b"3333").await;
    assert!(
        w1.is_err() || w2.is_err() || w3.is_err(),
        "no write after a failed write was told of it"
    );
    assert!(h.fs.flush(fh).await.is_err(), "flush after a failed write");
    let disk = std::fs::read(h.disk("f")).unwrap();
    assert_eq!(&disk[..8], b"goodmore");
    assert!(
        disk[8..disk.len().min(16)].iter().all(|&b| b == 0),
        "writes queued behind a failed write were sent after it: {disk:?}"
    );
    if w3.is_err() {
        assert_eq!(disk, b"goodmore", "a refused write landed");
    }

    // fsync reports it too.
    h.plan.fail_next(ROp::Write, 1, failure("injected"));
    let w = h.fs.write(fh, 16, b"3333").await;
    assert!(
        w.is_err() || h.fs.fsync(fh).await.is_err(),
        "fsync after a failed write"
    );

    // And release does, when the application never called flush.
    h.fs.flush(fh).await.ok();
    h.plan.fail_next(ROp::Write, 1, failure("injected"));
    let w = h.fs.write(fh, 20, b"4444").await;
    let released = h.fs.release(fh).await;
    assert!(
        w.is_err() || released.is_err(),
        "release after a failed write"
    );
    assert_eq!(h.open_handles().await, 0);
}

/// A write whose reply is lost (performed, then the error) is reported too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_failure_of_a_performed_write_is_reported() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "f").await;
    h.plan
        .fail_next_after_performing(ROp::Write, 1, failure("reply lost"));
    let w = h.fs.write(fh, 0, b"abc").await;
    let flushed = h.fs.flush(fh).await;
    assert!(
        w.is_err() || flushed.is_err(),
        "lost write reply went unreported"
    );
    h.fs.release(fh).await.ok();
}

/// `stat` of a file being written through the one descriptor that created it is answered
/// without the server while its writes are on their way (an assembler or linker reads back
/// what it wrote, and the kernel asks for the attributes before every such read): the size
/// where the writes end, the mtime the server last gave. Any other state asks the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_stat_of_a_file_being_written_by_its_creator_needs_no_server() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    let made = h.fs.getattr(f, Some(fh)).await.unwrap().0;
    h.plan.hold_replies(ROp::Write);
    h.write(fh, 0, b"0123456789").await;
    h.write(fh, 3, b"abc").await;
    // Both (an overlapping write is never merged into the one before): counted before the
    // counts are reset, however late the writer task runs.
    h.plan.until_held(ROp::Write, 2).await;
    h.plan.reset_counts();
    for asked in [Some(fh), None] {
        let (a, ttl) = h.fs.getattr(f, asked).await.unwrap();
        assert_eq!(a.size, 10, "{asked:?}");
        assert_eq!(a.mtime, made.mtime, "{asked:?}");
        assert_eq!(a.perm, made.perm, "{asked:?}");
        assert!(
            ttl.is_zero(),
            "{asked:?}: the kernel would keep it past the writes"
        );
    }
    assert_eq!(h.plan.total_calls(), 0, "asked the server");
    h.plan.release(ROp::Write);
    h.fs.flush(fh).await.unwrap();
    // Landed: the server's word again.
    let (a, _) = h.fs.getattr(f, Some(fh)).await.unwrap();
    assert_eq!(a.size, 10);
    assert!(h.plan.calls(ROp::Fstat) + h.plan.calls(ROp::Lstat) > 0);
    // Another descriptor of the file: its creator no longer knows everything.
    h.plan.hold_replies(ROp::Write);
    h.write(fh, 10, b"+").await;
    h.plan.until_held(ROp::Write, 1).await;
    let other = h.open(f, libc::O_RDONLY).await;
    h.plan.reset_counts();
    let asked = tokio::time::timeout(Duration::from_millis(200), h.fs.getattr(f, Some(fh))).await;
    assert!(
        asked.is_err(),
        "answered before the held write, without the server"
    );
    h.plan.release(ROp::Write);
    assert_eq!(h.fs.getattr(f, Some(fh)).await.unwrap().0.size, 11);
    h.fs.release(other).await.unwrap();
    h.fs.release(fh).await.unwrap();
}

/// A read or stat through the descriptor that wrote goes out behind its writes on the same
/// handle, which the server carries out in order: it does not wait for their answers. Through
/// another descriptor of the file (maybe another channel) it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_a_read_through_the_writing_descriptor_goes_behind_its_writes() {
    let h = Harness::new();
    let (f, fh) = h.create_written(b"first").await;

    // Performed by the server, the answers held.
    h.plan.hold_replies(ROp::Write);
    h.write(fh, 5, b"-second").await;
    h.plan.until_held(ROp::Write, 1).await;
    let quick = Duration::from_secs(10);
    let read = tokio::time::timeout(quick, h.fs.read(fh, 0, 100)).await;
    assert_eq!(
        read.expect("the read waited for the write's answer")
            .unwrap(),
        &b"first-second"[..]
    );
    let attr = tokio::time::timeout(quick, h.fs.getattr(f, Some(fh))).await;
    assert_eq!(
        attr.expect("the stat waited for the write's answer")
            .unwrap()
            .0
            .size,
        12
    );

    // A second descriptor: its read waits for the answers (it may go another way).
    let other = h.open(f, libc::O_RDONLY).await;
    let waiting = {
        let fs = h.fs.clone();
        tokio::spawn(async move { fs.read(other, 0, 100).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "a read through another descriptor did not wait for the writes' answers"
    );
    h.plan.release(ROp::Write);
    assert_eq!(waiting.await.unwrap().unwrap(), &b"first-second"[..]);
    h.fs.release(other).await.unwrap();
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
}

/// fsync through the descriptor that wrote sends its FSYNC behind the writes at once (the
/// server carries them out in order) instead of after their answers, and still returns only
/// once they are answered, reporting a failure among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_fsync_goes_behind_its_writes_and_still_reports_them() {
    let h = Harness::new();
    let (_, fh) = h.create_written(b"first").await;

    for fails in [false, true] {
        h.plan.hold_replies(ROp::Write);
        if fails {
            h.plan
                .fail_next_after_performing(ROp::Write, 1, failure("refused late"));
        }
        h.write(fh, 5, b"-more").await;
        h.plan.until_held(ROp::Write, 1).await;
        let before = h.plan.calls(ROp::Fsync);
        let fsync = {
            let fs = h.fs.clone();
            tokio::spawn(async move { fs.fsync(fh).await })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while h.plan.calls(ROp::Fsync) == before {
            assert!(
                std::time::Instant::now() < deadline,
                "FSYNC waited for the write's answer"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !fsync.is_finished(),
            "fsync returned before the write's answer"
        );
        h.plan.release(ROp::Write);
        let result = fsync.await.unwrap().map_err(|e| e.errno);
        match fails {
            false => assert_eq!(result, Ok(())),
            true => assert_eq!(result, Err(libc::EIO), "a write that failed on the wire"),
        }
    }
    h.fs.flush(fh).await.ok();
    h.fs.release(fh).await.ok();
}

/// A close waits for a write that is on the wire, its answer not yet back, and reports its
/// failure: nothing is queued for the writer any more then, only the answer is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_a_close_waits_for_the_answer_of_a_write_on_the_wire() {
    let h = Harness::new();
    let (_, fh) = h.create_written(b"good").await;

    h.plan.hold_replies(ROp::Write);
    h.plan
        .fail_next_after_performing(ROp::Write, 1, failure("refused late"));
    // Answered when queued (the early-answer budget has room), then sent.
    h.fs.write(fh, 4, b"late").await.unwrap();
    h.plan.until_held(ROp::Write, 1).await;
    // Held, the answer never comes: a close that does not wait for it would be done at once.
    let early = tokio::time::timeout(Duration::from_millis(200), h.fs.flush(fh)).await;
    assert!(
        early.is_err(),
        "a close returned {early:?} while a write's answer was still on its way"
    );
    h.plan.release(ROp::Write);
    let flushed = h.fs.flush(fh).await;
    assert_eq!(
        flushed.map_err(|e| e.errno),
        Err(libc::EIO),
        "the close after a write that failed on the wire"
    );
    // Told once; nothing is pending now, and the next close is clean.
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_getattr_during_in_flight_writes_shows_the_written_size() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    h.plan
        .set_op_delay(ROp::Write, Some(Duration::from_millis(150)));
    let w1 = tokio::spawn(h.fs.write(fh, 0, &[1; 100]));
    let w2 = tokio::spawn(h.fs.write(fh, 100, &[2; 50]));
    assert_eq!(h.size(f, Some(fh)).await, 150, "getattr with the handle");
    let w3 = tokio::spawn(h.fs.write(fh, 150, &[3; 10]));
    assert_eq!(h.size(f, None).await, 160, "getattr without the handle");
    for w in [w1, w2, w3] {
        w.await.unwrap().unwrap();
    }
    assert_eq!(h.size(f, None).await, 160);
    h.plan.clear_all();
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.meta("f").len(), 160);
}

/// Whether a spawned call is still waiting 200 ms on: it must be when what it waits for is
/// held. (Only a call that wrongly did not wait can make this false, so no stall can.)
async fn still_waiting<T>(task: &mut tokio::task::JoinHandle<T>) -> bool {
    tokio::time::timeout(Duration::from_millis(200), task)
        .await
        .is_err()
}

/// Poll a future once, as the FUSE adapter does on the FUSE thread: whether it is answered
/// there, without waiting for another task.
fn answered_at_once<T>(
    fut: &mut std::pin::Pin<Box<impl std::future::Future<Output = T>>>,
) -> Option<T> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

/// Writes that fit in the file's queue are answered where they are queued, without waiting
/// for the writer task to send them; past `EARLY_ANSWER_BYTES` queued and not yet sent, a
/// write waits for the writer. Whatever was answered early is seen by a read and a getattr
/// through another descriptor, and lands in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_writes_answered_when_queued_within_a_bound() {
    use super::file::EARLY_ANSWER_BYTES;
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    // The writer is held up on the first write it sends until the loop below is done.
    h.plan.hold(ROp::Write);
    const CHUNK: usize = 512 * 1024;
    let data = pattern(2 * EARLY_ANSWER_BYTES as usize);
    let mut at_once = 0;
    let mut waiting = Vec::new();
    for (i, chunk) in data.chunks(CHUNK).enumerate() {
        let mut w = Box::pin(h.fs.write(fh, (i * CHUNK) as u64, chunk));
        match answered_at_once(&mut w) {
            Some(n) => {
                assert_eq!(n.unwrap() as usize, chunk.len());
                at_once += 1;
            }
            None => waiting.push(tokio::spawn(w)),
        }
    }
    h.plan.release(ROp::Write);
    assert!(at_once > 0, "no write was answered when queued");
    assert!(
        at_once * CHUNK <= EARLY_ANSWER_BYTES as usize,
        "{at_once} writes of {CHUNK} bytes answered before any was sent (bound: {EARLY_ANSWER_BYTES})"
    );
    let reader = h.open(f, libc::O_RDONLY).await;
    assert_eq!(h.size(f, Some(reader)).await, data.len() as u64, "getattr");
    let got = h.read(reader, 0, CHUNK as u32).await;
    assert_eq!(got, data[..CHUNK], "read through another descriptor");
    for w in waiting {
        w.await.unwrap().unwrap();
    }
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    h.fs.release(reader).await.unwrap();
    assert!(
        std::fs::read(h.disk("f")).unwrap() == data,
        "content on disk"
    );
}

/// A getattr (or read) that waits for the writes in flight does not report their failure, so
/// it must leave it latched for the fsync or close that does: an fsync queued while the
/// getattr waits still gets the error. (The getattr used to take the error and latch it again
/// only after its own wait: an fsync answered in between said success, and the kernel's
/// GETATTR after a write made that a race CI lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_a_failed_write_is_reported_by_fsync_while_a_getattr_waits() {
    let h = Harness::new();
    // Opened again: not its creator, so a stat asks the server (behind the write).
    let (f, fh) = h.create(ROOT, "f").await;
    h.fs.release(fh).await.unwrap();
    let fh = h.open(f, libc::O_WRONLY).await;
    h.plan.hold(ROp::Write);
    h.plan.fail_next(ROp::Write, 1, failure("injected"));
    h.fs.write(fh, 0, b"x").await.unwrap();
    h.plan.until_held(ROp::Write, 1).await;
    // Both wait behind the write, the getattr first.
    let mut getattr = Box::pin(h.fs.getattr(f, Some(fh)));
    let mut fsync = Box::pin(h.fs.fsync(fh));
    assert!(answered_at_once(&mut getattr).is_none(), "getattr waits");
    assert!(answered_at_once(&mut fsync).is_none(), "fsync waits");
    h.plan.release(ROp::Write);
    let (attr, synced) = tokio::join!(getattr, fsync);
    attr.unwrap();
    assert_errno(synced, libc::EIO, "fsync after the failed write");
    h.fs.release(fh).await.unwrap();
}

/// A downgrade waits for what passed its read-only check before it: a truncate that waits
/// for the writes before it is counted from its first step, so the downgrade knows it is
/// still to land; once it has, nothing is on its way and new changes get EROFS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_waits_for_changes_that_passed_the_read_only_check() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    h.plan.hold(ROp::Write);
    h.fs.write(fh, 0, b"queued").await.unwrap();
    h.plan.until_held(ROp::Write, 1).await;
    let truncate = || SetattrRequest {
        size: Some(2),
        ..Default::default()
    };
    let mut setattr = Box::pin(h.fs.setattr(f, Some(fh), truncate()));
    assert!(
        answered_at_once(&mut setattr).is_none(),
        "the truncate waits for the write"
    );
    h.fs.set_read_only();
    assert!(
        !h.fs.mutations_settled(Duration::from_millis(50)).await,
        "the truncate is still on its way"
    );
    h.plan.release(ROp::Write);
    setattr
        .await
        .expect("passed its check before the downgrade");
    assert!(h.fs.mutations_settled(Duration::ZERO).await);
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"qu");
    assert_errno(
        h.fs.setattr(f, Some(fh), truncate()).await,
        libc::EROFS,
        "after the downgrade",
    );
    h.fs.release(fh).await.unwrap();
}

/// A close by another thread of the program that opened the descriptor is the program's own
/// close: it hears of a failure even after a child closed its inherited copy (at exec) and
/// was told of it. (Go moves goroutines between threads; a child's exec closes its copies.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_a_close_by_another_thread_of_the_opener_is_the_openers() {
    let h = Harness::new();
    // The opener: a thread of this process that stays alive meanwhile.
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let opener = std::thread::spawn(move || {
        tid_tx.send(nix::unistd::gettid().as_raw() as u32).unwrap();
        let _ = stop_rx.recv();
    });
    let opener_tid = tid_rx.recv().unwrap();
    let fh = h.create_by(ROOT, "f", opener_tid).await;
    // A child process (it is not of this program).
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    h.plan.fail_next(ROp::Write, 1, failure("injected"));
    let _ = h.fs.write(fh, 0, b"lost").await;
    assert_errno(
        h.fs.flush_from(fh, child.id()).await,
        libc::EIO,
        "the child's close",
    );
    let this_thread = nix::unistd::gettid().as_raw() as u32;
    assert_ne!(this_thread, opener_tid);
    assert_errno(
        h.fs.flush_from(fh, this_thread).await,
        libc::EIO,
        "the program's close, from another thread",
    );
    h.fs.flush_from(fh, this_thread).await.expect("told once");
    let _ = child.kill();
    let _ = child.wait();
    drop(stop_tx);
    opener.join().unwrap();
    h.fs.release(fh).await.unwrap();
}

/// A close, by the opener or by a child that inherited the descriptor and closes its copy at
/// exec while the owner is between its write and its fsync, does not use the failure up for
/// the owner's fsync, which reports it with its errno (EFBIG here: the end of the failed write
/// is kept with it). The FUSE EFBIG test got success there once in CI, where the other tests
/// running in the same process start sshd and mount processes all the time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_a_close_does_not_use_a_failure_up_for_fsync() {
    let h = Harness::new();
    let fh = h.create_by(ROOT, "f", 100).await;
    for closer in [200, 100] {
        h.plan.fail_next(
            ROp::Write,
            1,
            RemoteError::Status(Status::BadMessage, "Invalid argument".into()),
        );
        // Answered when queued (write-behind).
        assert_eq!(h.fs.write(fh, (1 << 63) - 2, b"x").await.unwrap(), 1);
        assert_errno(h.fs.flush_from(fh, closer).await, libc::EFBIG, "the close");
        assert_errno(
            h.fs.fsync(fh).await,
            libc::EFBIG,
            &format!("fsync after {closer}'s close"),
        );
    }
    h.fs.release(fh).await.unwrap();
}

/// Who is told of a failed write (errseq-like, see `file::Told`). A close by another thread
/// than the opener (a child that inherited the descriptor closes its copy at exec) reports a
/// failure the writes were not told of, and then writes go on (the next command of a script
/// writing to a shared log works again); the opener's close and fsync still report it, once
/// each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_each_close_kind_and_fsync_is_told_of_a_failure_once() {
    const OPENER: u32 = 100;
    let h = Harness::new();
    let fh = h.create_by(ROOT, "f", OPENER).await;
    h.plan.fail_next(ROp::Write, 1, failure("injected"));
    assert_eq!(
        h.fs.write(fh, 0, b"lost").await.unwrap(),
        4,
        "answered early"
    );
    assert_errno(
        h.fs.flush_from(fh, 200).await,
        libc::EIO,
        "the child's close",
    );
    // Told: another child writes and closes as if nothing happened.
    h.write(fh, 4, b"x").await;
    h.fs.flush_from(fh, 201).await.unwrap();
    // The opener's close, then its fsync (through a dup), each once.
    assert_errno(
        h.fs.flush_from(fh, OPENER).await,
        libc::EIO,
        "the opener's close",
    );
    h.fs.flush_from(fh, OPENER).await.unwrap();
    assert_errno(h.fs.fsync(fh).await, libc::EIO, "fsync");
    h.fs.fsync(fh).await.unwrap();
    h.write(fh, 0, b"kept").await;
    h.fs.flush_from(fh, OPENER).await.unwrap();
    h.fs.release(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"keptx");

    // A failure the opener's fsync reported first is not reported again by its close.
    let fh = h.create_by(ROOT, "g", OPENER).await;
    h.plan.fail_next(ROp::Write, 1, failure("injected"));
    h.fs.write(fh, 0, b"lost").await.unwrap();
    assert_errno(h.fs.fsync(fh).await, libc::EIO, "fsync first");
    h.fs.flush_from(fh, OPENER).await.unwrap();
    h.fs.release(fh).await.unwrap();
}

/// tar: create, write, futimens. The times are set behind the writes; the attributes
/// answered for them show the size of the writes still queued (answered early).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_times_set_behind_queued_writes_show_their_size() {
    let h = Harness::new();
    let (f, fh) = h
        .create_with(ROOT, "f", libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL)
        .await;
    h.plan.hold(ROp::Write);
    let mut w = Box::pin(h.fs.write(fh, 0, &[7; 1000]));
    assert_eq!(answered_at_once(&mut w).map(Result::unwrap), Some(1000));
    let set = SetattrRequest {
        mtime: at(1_000_000),
        ..Default::default()
    };
    // Answered while the write is still held: it does not wait for it.
    let a = tokio::time::timeout(Duration::from_secs(30), h.fs.setattr(f, None, set))
        .await
        .expect("setattr waited for the held write")
        .unwrap();
    assert_eq!(a.size, 1000, "size answered with the times");
    assert_eq!(h.meta("f").len(), 0, "the write was held");
    h.plan.release(ROp::Write);
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    assert_eq!(
        (h.meta("f").len(), secs(h.meta("f").modified().unwrap())),
        (1000, 1_000_000)
    );
}

/// A lookup of a file whose mode and times wait behind its writes (`cp -p` sets them through
/// its descriptor before the close, while an `ls` of the directory looks the name up): the
/// server's answer from before they land would replace, in the kernel, what the chmod and
/// utimens were answered with. The lookup waits for them, and shows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_a_lookup_does_not_undo_mode_and_times_set_behind_writes() {
    let h = Harness::new();
    let (f, fh) = create_excl(&h, "f").await;
    h.plan.hold(ROp::Write);
    h.write(fh, 0, b"data").await;
    let times = SetattrRequest {
        atime: at(1_400_000_000),
        mtime: at(1_500_000_000),
        ..Default::default()
    };
    let chmod = SetattrRequest {
        mode: Some(libc::S_IFREG | 0o600),
        ..Default::default()
    };
    for set in [times, chmod] {
        tokio::time::timeout(Duration::from_secs(30), h.fs.setattr(f, None, set))
            .await
            .expect("setattr waited for the held write")
            .unwrap();
    }
    let lookup = tokio::spawn({
        let fs = h.fs.clone();
        async move { fs.lookup(ROOT, OsStr::new("f")).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.plan.release(ROp::Write);
    let e = lookup.await.unwrap().unwrap();
    assert_eq!(
        (e.attr.perm, secs(e.attr.mtime), e.attr.size),
        (0o600, 1_500_000_000, 4),
        "the lookup's attributes"
    );
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
}

/// The same for `access(2)`: a `chmod +x` queued behind the file's writes (then a write,
/// after which the mount no longer holds the attributes) is what the check sees, not the
/// server's mode from before it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_access_sees_a_mode_set_behind_writes() {
    let h = Harness::new();
    let (f, fh) = create_excl(&h, "f").await;
    h.plan.hold(ROp::Fsetstat);
    let chmod = SetattrRequest {
        mode: Some(libc::S_IFREG | 0o755),
        ..Default::default()
    };
    tokio::time::timeout(Duration::from_secs(30), h.fs.setattr(f, None, chmod))
        .await
        .expect("chmod waited for the server")
        .unwrap();
    h.write(fh, 0, b"#!/bin/sh\nexit 0\n").await;
    let access = tokio::spawn({
        let fs = h.fs.clone();
        async move { fs.access(f, libc::X_OK, 0, 0).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.plan.release(ROp::Fsetstat);
    access.await.unwrap().expect("execute permission");
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
}

/// A long write through one descriptor has the server write the file back to its disk as it
/// goes, once per `WRITE_BACK_EVERY` bytes of the run, so that an `fsync` at its end (`dd
/// conv=fsync`) finds little left; a small file never does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_a_long_run_is_written_back_early_a_small_file_is_not() {
    use super::file::WRITE_BACK_EVERY;
    let h = Harness::new();
    let (_, fh) = create_excl(&h, "small").await;
    h.write(fh, 0, &[1; 1 << 20]).await;
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    let (_, fh) = create_excl(&h, "long").await;
    let total = 2 * WRITE_BACK_EVERY + (1 << 20);
    write_run(&h, fh, total, 2).await;
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    // Sent from tasks of their own, which nothing waits for: wait for them here.
    eventually("two early write-backs", || {
        h.plan.calls(ROp::WriteBackEarly) >= 2
    })
    .await;
    assert_eq!(
        h.plan.calls(ROp::WriteBackEarly),
        2,
        "one early write-back per {WRITE_BACK_EVERY} bytes of the run, none for the small file"
    );
    assert_eq!(h.meta("long").len(), total);
}

/// Early write-back follows the mount's writers: a long write closed without `fsync` (`cp` of
/// a dataset) turns it off, so the next long write is not written back early; an `fsync`
/// ending a long write (`dd conv=fsync`) turns it on again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_early_write_back_stops_after_a_long_write_closed_without_fsync() {
    use super::file::WRITE_BACK_EVERY;
    let h = Harness::new();
    // One long write; `fsync` before the close or not.
    let write_long = |name: &'static str, fsync: bool| {
        let h = &h;
        async move {
            let (_, fh) = create_excl(h, name).await;
            write_run(h, fh, WRITE_BACK_EVERY, 4).await;
            h.fs.flush(fh).await.unwrap();
            if fsync {
                h.fs.fsync(fh).await.unwrap();
            }
            h.fs.release(fh).await.unwrap();
        }
    };
    let sent = || h.plan.calls(ROp::WriteBackEarly);
    write_long("synced", true).await;
    eventually("the first write-back", || sent() == 1).await;
    write_long("copied", false).await;
    eventually("the second write-back", || sent() == 2).await;
    // Off now: nothing more is sent, however long the wait.
    write_long("copied-too", false).await;
    write_long("synced-again", true).await;
    write_long("synced-once-more", true).await;
    eventually("the write-back of the last file", || sent() == 3).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        sent(),
        3,
        "a long write after one closed without fsync, and the one ended by the next fsync, \
         are not written back early; the one after that is"
    );
}

/// A long write to a file unlinked while open (a temporary file) is not written back early,
/// and its close without `fsync` does not turn early write-back off: nothing was spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_an_unlinked_file_is_not_written_back_and_does_not_count() {
    use super::file::WRITE_BACK_EVERY;
    let h = Harness::new();
    let (_, fh) = create_excl(&h, "tmp").await;
    h.fs.unlink(ROOT, os("tmp")).await.unwrap();
    write_run(&h, fh, WRITE_BACK_EVERY, 5).await;
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    let (_, fh) = create_excl(&h, "kept").await;
    write_run(&h, fh, WRITE_BACK_EVERY, 5).await;
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    eventually("the write-back of the file kept", || {
        h.plan.calls(ROp::WriteBackEarly) == 1
    })
    .await;
}

/// An early write-back the server failed (its fsync: the disk write failed) is reported by
/// the file's next fsync, even through a descriptor opened after it (which the server's own
/// fsync would not tell), and only once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_a_failed_early_write_back_is_reported_by_the_next_fsync() {
    use super::file::WRITE_BACK_EVERY;
    let h = Harness::new();
    h.plan.fail_next(
        ROp::WriteBackEarly,
        1,
        RemoteError::Status(Status::Failure, "I/O error".into()),
    );
    let (ino, fh) = create_excl(&h, "long").await;
    write_run(&h, fh, WRITE_BACK_EVERY, 3).await;
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    // Its task, which nothing waits for, records the failure.
    let recorded = || h.fs.early_write_back.has_failure(ino);
    eventually("the failed write-back recorded", recorded).await;
    let fh = h.open(ino, libc::O_WRONLY).await;
    assert_eq!(
        h.fs.fsync(fh).await.map_err(|e| e.errno),
        Err(libc::EIO),
        "the failed write-back was not reported"
    );
    h.fs.fsync(fh).await.expect("reported twice");

    // When the server's own fsync of the handle fails too, that failure is the report.
    h.plan.fail_next(
        ROp::WriteBackEarly,
        1,
        RemoteError::Status(Status::Failure, "I/O error".into()),
    );
    write_run(&h, fh, WRITE_BACK_EVERY, 3).await;
    h.fs.flush(fh).await.unwrap();
    eventually("the second failed write-back recorded", recorded).await;
    h.plan.fail_next(
        ROp::Fsync,
        1,
        RemoteError::Status(Status::Failure, "I/O error".into()),
    );
    assert!(h.fs.fsync(fh).await.is_err(), "the server's fsync failure");
    h.fs.fsync(fh)
        .await
        .expect("the write-back failure reported again");
    h.fs.release(fh).await.unwrap();
}

/// The server's fsync sent right behind writes on their way fails (a disk error): that
/// fsync(2) reports it, rather than trying again, which on Linux answers 0 once the error
/// has been told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_fsync_behind_writes_reports_the_servers_failure() {
    let h = Harness::new();
    let (_, fh) = h.create_written(b"first").await;
    // The write on the wire, its answer held: the FSYNC goes right behind it.
    h.plan.hold_replies(ROp::Write);
    h.write(fh, 5, b"-more").await;
    h.plan.until_held(ROp::Write, 1).await;
    h.plan.fail_next(
        ROp::Fsync,
        1,
        RemoteError::Status(Status::Failure, "I/O error".into()),
    );
    let fsyncs = h.plan.calls(ROp::Fsync);
    let fsync = {
        let fs = h.fs.clone();
        tokio::spawn(async move { fs.fsync(fh).await })
    };
    eventually("the FSYNC sent behind the write", || {
        h.plan.calls(ROp::Fsync) > fsyncs
    })
    .await;
    h.plan.release(ROp::Write);
    assert!(fsync.await.unwrap().is_err(), "the server's fsync failure");
    assert_eq!(h.plan.calls(ROp::Fsync), fsyncs + 1, "sent once");
    h.fs.release(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"first-more");
}

/// A file held open here and removed on the server by someone else: once a listing shows
/// its name gone, a file made under the name is a new inode, not the old one again (the
/// old descriptor would share the new file's kernel inode, size and pages).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_gone_from_a_listing_is_made_again_as_a_new_inode() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"old").unwrap();
    let old = h.lookup(ROOT, "f").await;
    let fh = h.open(old, libc::O_RDONLY).await;
    std::fs::remove_file(h.disk("f")).unwrap();
    let dh = h.fs.opendir(ROOT).await.unwrap();
    h.fs.readdir(dh, 0).await.unwrap();
    h.fs.releasedir(dh);
    assert_errno(h.fs.lookup(ROOT, os("f")).await, libc::ENOENT, "lookup");
    let (new, nfh) = h.create(ROOT, "f").await;
    assert_ne!(new, old, "the new file got the old inode");
    h.fs.release(nfh).await.unwrap();
    h.fs.release(fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_o_append() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"hello").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let fh = h.open(f, libc::O_WRONLY | libc::O_APPEND).await;
    // The kernel passes its idea of the size; the server appends whatever the offset.
    h.write(fh, 5, b"XY").await;
    h.write(fh, 0, b"ZZ").await;
    h.fs.flush(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"helloXYZZ");
    assert_eq!(h.size(f, Some(fh)).await, 9);
    assert_eq!(h.size(f, None).await, 9);
    h.fs.release(fh).await.unwrap();
    // create with O_APPEND on an existing name
    let req = OpenRequest {
        flags: libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        pid: 0,
        caller: Caller::ROOT,
    };
    let (_, fh) =
        h.fs.create(ROOT, os("f"), FILE_MODE, UMASK, req)
            .await
            .unwrap();
    h.write(fh, 9, b"!").await;
    h.fs.release(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"helloXYZZ!");
    assert_eq!(h.open_handles().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_sparse_write_zero_fills() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    h.write(fh, 10, b"X").await;
    assert_eq!(h.size(f, Some(fh)).await, 11);
    let mut want = vec![0u8; 10];
    want.push(b'X');
    assert_eq!(h.read(fh, 0, 100).await, want);
    h.write(fh, 1 << 20, b"end").await;
    h.fs.flush(fh).await.unwrap();
    let disk = std::fs::read(h.disk("f")).unwrap();
    assert_eq!(disk.len(), (1 << 20) + 3);
    assert!(disk[11..1 << 20].iter().all(|&b| b == 0));
    assert_eq!(&disk[..11], &want[..]);
    assert_eq!(h.size(f, None).await, (1 << 20) + 3);
    h.fs.release(fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_open_then_unlink() {
    let h = Harness::new();
    let baseline = h.fs.inode_count();
    let (f, fh) = h.create(ROOT, "f").await;
    h.write(fh, 0, b"hello").await;
    h.fs.unlink(ROOT, os("f")).await.unwrap();
    h.fs.fsyncdir(ROOT).await.unwrap();
    assert!(!h.disk("f").exists());
    assert_errno(
        h.fs.lookup(ROOT, os("f")).await,
        libc::ENOENT,
        "lookup after unlink",
    );
    // fstat(2) reaches the core without a handle.
    assert_eq!(
        h.size(f, None).await,
        5,
        "getattr without fh on unlinked-open"
    );
    assert_eq!(
        h.size(f, Some(fh)).await,
        5,
        "getattr with fh on unlinked-open"
    );
    assert_eq!(h.read(fh, 0, 100).await, b"hello");
    h.write(fh, 5, b" world").await;
    assert_eq!(h.read(fh, 0, 100).await, b"hello world");
    h.fs.flush(fh).await.unwrap();
    let a =
        h.fs.setattr(
            f,
            None,
            SetattrRequest {
                size: Some(5),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(a.size, 5, "ftruncate of unlinked-open");
    assert_eq!(h.read(fh, 0, 100).await, b"hello");
    // A new file of the same name is a new inode, and the old one still reads its own data.
    let (g, gfh) = h.create(ROOT, "f").await;
    assert_ne!(f, g);
    h.write(gfh, 0, b"new").await;
    h.fs.release(gfh).await.unwrap();
    assert_eq!(h.read(fh, 0, 100).await, b"hello");
    h.fs.release(fh).await.unwrap();
    h.fs.forget(f, 1);
    h.fs.forget(g, 1);
    assert_eq!(h.fs.inode_count(), baseline);
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"new");
    assert_eq!(h.open_handles().await, 0);
}

/// futimens(fd, {atime, UTIME_OMIT}) on a file that was unlinked while open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wb_partial_utimens_on_an_unlinked_open_file() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    h.fs.unlink(ROOT, os("f")).await.unwrap();
    let set = SetattrRequest {
        atime: at(1_000_000),
        ..Default::default()
    };
    let a = h.fs.setattr(f, Some(fh), set).await;
    h.fs.release(fh).await.unwrap();
    let a = a.expect("setattr of atime only through the handle of an unlinked file");
    assert_eq!(secs(a.atime), 1_000_000);
}

// ------------------------------------------------------------------------------ striping

/// Deterministic bytes, different for each seed (so a misplaced chunk shows).
fn stripe_pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .rotate_left(seed as u32 % 31) as u8
                ^ seed
        })
        .collect()
}

/// Write `data` at `offset` through `fh` as the kernel does for `dd bs=1M`: 1 MiB writes,
/// each queued behind the previous one, answered as queued.
async fn write_mib_by_mib(h: &Harness, fh: u64, offset: u64, data: &[u8]) {
    for (i, piece) in data.chunks(1024 * 1024).enumerate() {
        h.write(fh, offset + (i * 1024 * 1024) as u64, piece).await;
    }
}

fn striped(h: &Harness) -> u64 {
    h.fs.stats
        .bytes_striped
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// A long sequential write is spread over extra lanes (here: the file opened again) and
/// lands byte for byte; the lanes are closed with the descriptor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_large_sequential_write_lands_byte_exact() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "big").await;
    // 20 MiB and an odd tail, so the last chunk is short.
    let data = stripe_pattern(7, 20 * 1024 * 1024 + 12_345);
    write_mib_by_mib(&h, fh, 0, &data).await;
    h.fs.flush(fh).await.unwrap();
    let on_disk = std::fs::read(h.disk("big")).unwrap();
    assert!(on_disk == data, "disk differs from what was written");
    let lane_bytes = striped(&h);
    assert!(
        lane_bytes >= 8 * 1024 * 1024,
        "only {lane_bytes} bytes went through extra lanes"
    );
    assert_eq!(h.plan.calls(ROp::OpenAlongside), 1, "lanes opened once");
    assert!(h.plan.calls(ROp::LaneWrite) > 0);
    assert_eq!(h.size(f, Some(fh)).await, data.len() as u64);
    assert!(h.read(fh, 5 * 1024 * 1024, 100_000).await == data[5 << 20..(5 << 20) + 100_000]);
    h.fs.fsync(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0, "lanes left open on the server");
}

/// A read through the descriptor right after a striped run waits for the lane chunks: they
/// went through other handles (other channels on a real server), which nothing orders before
/// a request through its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_a_read_after_a_striped_run_sees_the_lanes_chunks() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "f").await;
    // Lane chunks sent at once, carried out 300 ms later.
    h.plan
        .set_queue_delay(ROp::LaneWrite, Some(Duration::from_millis(300)));
    let data = stripe_pattern(3, 12 * 1024 * 1024);
    write_mib_by_mib(&h, fh, 0, &data).await;
    // Long enough for the writer to have sent everything (nothing is queued any more), not
    // for the lanes to have carried it out.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(striped(&h) > 0, "the run was not striped");
    let got = h.fs.read(fh, 0, data.len() as u32).await.unwrap();
    let first_difference = got.iter().zip(&data).position(|(a, b)| a != b);
    assert!(
        got.len() == data.len() && first_difference.is_none(),
        "read {} of {} bytes, first difference at {first_difference:?}",
        got.len(),
        data.len()
    );
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
}

/// Chunks that land late, on a lane or on the descriptor's own handle, are still ordered
/// before a later write that overlaps them: an overwrite of a striped range through the same
/// descriptor, a new striped run over what the own handle still has in flight, and a write
/// through another descriptor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_overwrite_after_a_striped_run_keeps_the_later_data() {
    fn check(h: &Harness, model: &[u8], when: &str) {
        let on_disk = std::fs::read(h.disk("f")).unwrap();
        if on_disk != model {
            let first = on_disk.iter().zip(model).position(|(a, b)| a != b);
            panic!(
                "{when}: disk ({} bytes) differs from the model ({} bytes) first at byte {first:?}",
                on_disk.len(),
                model.len()
            );
        }
    }
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;

    // Lanes slow: the run's lane chunks are still on their way when the overwrite comes.
    h.plan
        .set_queue_delay(ROp::LaneWrite, Some(Duration::from_millis(150)));
    let mut model = stripe_pattern(1, 16 * 1024 * 1024);
    write_mib_by_mib(&h, fh, 0, &model).await;
    assert!(striped(&h) > 0, "the run was not striped");
    // Everywhere past the first 4 MiB, so some of it lies on a lane whatever the unit.
    for k in 0..12 {
        let at = (4 << 20) + k * 1_000_000 + 777;
        h.write(fh, at as u64, b"overwritten").await;
        model[at..at + 11].copy_from_slice(b"overwritten");
    }
    h.fs.flush(fh).await.unwrap();
    check(&h, &model, "overwrites after a striped run");

    // The own handle slow: an earlier write is still on its way when a new run's lane chunks
    // would cover it.
    // (The data is made first: the delay must not be spent computing it.)
    let second = stripe_pattern(2, 12 * 1024 * 1024);
    let patch = vec![b'Z'; 3 << 20];
    h.plan.clear_all();
    h.plan
        .set_queue_delay(ROp::Write, Some(Duration::from_millis(300)));
    h.write(fh, 5 << 20, &patch).await;
    write_mib_by_mib(&h, fh, 0, &second).await;
    model[..second.len()].copy_from_slice(&second);

    h.fs.flush(fh).await.unwrap();
    check(&h, &model, "a striped run over a slow earlier write");

    // Lanes slow again: another descriptor writes over the striped part right behind.
    let third = stripe_pattern(3, 10 * 1024 * 1024);
    let patch2 = vec![b'Y'; 5000];
    h.plan.clear_all();
    h.plan
        .set_queue_delay(ROp::LaneWrite, Some(Duration::from_millis(300)));
    write_mib_by_mib(&h, fh, 0, &third).await;
    model[..third.len()].copy_from_slice(&third);
    let fh2 = h.open(f, libc::O_WRONLY).await;
    let at2 = 8 * 1024 * 1024 - 2500;
    h.write(fh2, at2 as u64, &patch2).await;
    model[at2..at2 + patch2.len()].copy_from_slice(&patch2);
    h.fs.flush(fh2).await.unwrap();
    h.fs.flush(fh).await.unwrap();
    check(
        &h,
        &model,
        "a write through another descriptor after a striped run",
    );
    h.plan.clear_all();
    h.fs.release(fh2).await.unwrap();
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0);
}

/// A write that fails on an extra lane is reported like any other: by flush, by fsync, and
/// writes after it are refused until it was reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_failed_lane_write_is_reported_by_flush_and_fsync() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "f").await;
    h.plan
        .fail_next(ROp::LaneWrite, 1, failure("injected on a lane"));
    let data = stripe_pattern(3, 8 * 1024 * 1024);
    let mut acked = true;
    for (i, piece) in data.chunks(1024 * 1024).enumerate() {
        acked &= h.fs.write(fh, (i << 20) as u64, piece).await.is_ok();
    }
    let flushed = h.fs.flush(fh).await;
    assert!(
        !acked || flushed.is_err(),
        "a lane write failed, yet every write was acknowledged and flush succeeded"
    );
    if let Err(e) = &flushed {
        assert_eq!(e.errno, libc::EIO, "{e}");
    }
    assert_eq!(h.plan.calls(ROp::OpenAlongside), 1);

    // The writes refused after the failure left a gap: a new run, striped again once it is
    // long enough; a lane failure in it is what fsync reports.
    h.plan
        .fail_next(ROp::LaneWrite, 1, failure("injected on a lane"));
    let more = stripe_pattern(4, 10 * 1024 * 1024);
    let mut acked = true;
    for (i, piece) in more.chunks(1024 * 1024).enumerate() {
        acked &=
            h.fs.write(fh, (8 << 20) + (i << 20) as u64, piece)
                .await
                .is_ok();
    }
    let synced = h.fs.fsync(fh).await;
    assert!(
        !acked || synced.is_err(),
        "a lane write failed, yet fsync succeeded"
    );
    assert!(h.plan.calls(ROp::LaneWrite) >= 2);
    h.fs.release(fh).await.ok();
    assert_eq!(h.open_handles().await, 0);
}

/// When the file cannot be opened again (its mode was changed after the create, say), the
/// write is not striped and nothing else changes: no error, every byte lands. The open is
/// not retried for every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_refused_extra_open_still_writes_everything() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "f").await;
    h.plan.fail_always(
        ROp::OpenAlongside,
        RemoteError::Status(Status::PermissionDenied, "mode 0444".into()),
    );
    let data = stripe_pattern(5, 12 * 1024 * 1024);
    write_mib_by_mib(&h, fh, 0, &data).await;
    h.fs.fsync(fh).await.unwrap();
    assert!(std::fs::read(h.disk("f")).unwrap() == data);
    assert_eq!(striped(&h), 0);
    assert_eq!(h.plan.calls(ROp::OpenAlongside), 1, "refused lanes retried");
    assert_eq!(h.plan.calls(ROp::LaneWrite), 0);
    h.plan.clear_all();
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0);
}

/// O_APPEND writes go to the end whatever their offset: never striped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_never_for_o_append() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "log").await;
    h.fs.release(fh).await.unwrap();
    let fh = h.open(f, libc::O_WRONLY | libc::O_APPEND).await;
    let data = stripe_pattern(6, 6 * 1024 * 1024);
    write_mib_by_mib(&h, fh, 0, &data).await;
    h.fs.flush(fh).await.unwrap();
    assert!(std::fs::read(h.disk("log")).unwrap() == data);
    assert_eq!(h.plan.calls(ROp::OpenAlongside), 0);
    h.fs.release(fh).await.unwrap();
}

/// Lanes of a lost connection are dropped: the chunk goes through the descriptor's reopened
/// handle, new lanes are opened for the rest of the run, nothing is reported (nothing was in
/// flight) and no server handle leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_lanes_of_a_lost_connection_are_replaced() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "f").await;
    let data = stripe_pattern(8, 16 * 1024 * 1024);
    write_mib_by_mib(&h, fh, 0, &data[..8 << 20]).await;
    h.fs.flush(fh).await.unwrap();
    let before = striped(&h);
    assert!(before > 0);
    h.plan.disconnect();
    h.plan.restore();
    write_mib_by_mib(&h, fh, 8 << 20, &data[8 << 20..]).await;
    h.fs.flush(fh).await.unwrap();
    assert!(std::fs::read(h.disk("f")).unwrap() == data);
    assert_eq!(h.plan.calls(ROp::OpenAlongside), 2, "lanes not reopened");
    assert!(striped(&h) > before, "not striped after the reconnect");
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0, "server handles leaked");
}

/// Page `i` of a file of `pages` pages written out of order, as a database writes them: a
/// permutation in which no page follows the one written before it (so nothing merges).
fn scattered_page(i: usize, pages: usize) -> usize {
    (i * 1999) % pages
}

/// Write the first [`SPREAD_AFTER`](super::file::SPREAD_AFTER)` + 8` pages of
/// `scattered_page` (of 4 KiB, in a file of 4,096) through `fh`, each filled with `fill`,
/// while the first is held at the server's door: the rest wait behind it, more than one
/// channel keeps in flight, as over a long link, and the descriptor's lanes open (at the
/// second write, the first of the descriptor's that follows one of its own, with a margin
/// over the threshold). Returns once they have.
async fn spread_by_scattered_writes(h: &Harness, fh: u64, fill: u8) -> Vec<usize> {
    h.plan.hold(ROp::Write);
    h.plan.hold(ROp::OpenAlongside);
    let pages: Vec<usize> = (0..super::file::SPREAD_AFTER + 8)
        .map(|i| scattered_page(i, 4096))
        .collect();
    for &p in &pages {
        h.write(fh, (p * 4096) as u64, &[fill; 4096]).await;
    }
    h.plan.release(ROp::Write);
    h.plan.until_held(ROp::OpenAlongside, 1).await;
    h.plan.release(ROp::OpenAlongside);
    pages
}

/// `db` in the root, created, with its lanes open (`spread_by_scattered_writes`, flushed);
/// the descriptor, and where the first lane's bytes start (the second unit of placement).
async fn db_with_lanes(h: &Harness) -> (u64, u64) {
    let (_, fh) = h.create(ROOT, "db").await;
    spread_by_scattered_writes(h, fh, 1).await;
    h.fs.flush(fh).await.unwrap();
    (fh, first_lane_offset(h))
}

/// The first byte placement gives the first lane: the start of its second unit.
fn first_lane_offset(h: &Harness) -> u64 {
    use super::file::STRIPE_UNIT;
    let max_write = crate::remote::Remote::limits(h.fs.remote().as_ref()).max_write as usize;
    (STRIPE_UNIT.div_ceil(max_write) * max_write) as u64
}

/// Pages written out of order, more than one channel keeps in flight, are spread over lanes;
/// a write over a page still on its way through a lane lands after it, as through one handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_scattered_writes_go_over_lanes_and_keep_their_order() {
    use super::file::SPREAD_AFTER;
    const PAGE: usize = 4096;
    const PAGES: usize = 4096;
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "db").await;
    let mut model = vec![0u8; PAGE * PAGES];
    for p in spread_by_scattered_writes(&h, fh, 1).await {
        model[p * PAGE..(p + 1) * PAGE].fill(1);
    }
    // What goes through a lane now lands 100 ms late, what goes through the own handle at
    // once. Every page is written again, the later ones right after their first write.
    h.plan
        .set_queue_delay(ROp::LaneWrite, Some(Duration::from_millis(100)));
    let writes = 2 * SPREAD_AFTER;
    for round in 0..2 {
        for i in 0..writes {
            let at = scattered_page(i, PAGES) * PAGE;
            let page = vec![(round * 101 + i % 89 + 2) as u8; PAGE];
            h.write(fh, at as u64, &page).await;
            model[at..at + PAGE].copy_from_slice(&page);
        }
    }
    h.fs.flush(fh).await.unwrap();
    assert!(striped(&h) > 0, "nothing went through a lane");
    assert_eq!(h.plan.calls(ROp::OpenAlongside), 1, "lanes opened once");
    let end = (0..writes)
        .map(|i| (scattered_page(i, PAGES) + 1) * PAGE)
        .max()
        .unwrap();
    let on_disk = std::fs::read(h.disk("db")).unwrap();
    let first = on_disk.iter().zip(&model).position(|(a, b)| a != b);
    assert!(
        on_disk.len() == end && first.is_none(),
        "disk ({} bytes, {end} expected) differs from the model first at byte {first:?} (page {:?})",
        on_disk.len(),
        first.map(|b| b / PAGE)
    );
    h.plan.clear_all();
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0, "lanes left open on the server");
}

/// Bigger writes out of order fill the queue's bytes before its count: 40 of 64 KiB waiting
/// (2.5 MiB, more than one channel's window) open the lanes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_big_scattered_writes_by_the_bytes_waiting() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "db").await;
    h.plan.hold(ROp::Write);
    h.plan.hold(ROp::OpenAlongside);
    for i in 0..41 {
        // Every other 64 KiB block: none continues the one before.
        h.write(fh, (i * 2 * 65_536) as u64, &[7u8; 65_536]).await;
    }
    h.plan.release(ROp::Write);
    h.plan.until_held(ROp::OpenAlongside, 1).await;
    h.plan.release(ROp::OpenAlongside);
    h.fs.flush(fh).await.unwrap();
    assert_eq!(h.plan.calls(ROp::OpenAlongside), 1);
    assert!(striped(&h) > 0, "nothing went through a lane");
    let on_disk = std::fs::read(h.disk("db")).unwrap();
    assert_eq!(on_disk.len(), 81 * 65_536);
    for (block, bytes) in on_disk.chunks(65_536).enumerate() {
        let fill = if block % 2 == 0 { 7 } else { 0 };
        assert!(bytes.iter().all(|&b| b == fill), "block {block} is wrong");
    }
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0);
}

/// Two descriptors of one file writing in turn wait for each other's answers at every turn
/// (each may have its own lanes): however much queues behind a turn meanwhile, that says
/// nothing of how one descriptor writes, and opens no lanes. Every write here is the first
/// after a switch, held behind the first write as in `spread_by_scattered_writes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_not_for_two_descriptors_writing_in_turn() {
    use super::file::SPREAD_AFTER;
    let h = Harness::new();
    let (ino, a) = h.create(ROOT, "db").await;
    let b = h.open(ino, libc::O_RDWR).await;
    let mut model = vec![0u8; 4096 * 4096];
    h.plan.hold(ROp::Write);
    for i in 0..2 * SPREAD_AFTER + 8 {
        let page = scattered_page(i, 4096);
        let fh = if i % 2 == 0 { a } else { b };
        let fill = (i % 251 + 1) as u8;
        h.write(fh, (page * 4096) as u64, &[fill; 4096]).await;
        model[page * 4096..(page + 1) * 4096].fill(fill);
    }
    h.plan.release(ROp::Write);
    h.fs.flush(a).await.unwrap();
    h.fs.flush(b).await.unwrap();
    assert_eq!(h.plan.calls(ROp::OpenAlongside), 0, "lanes opened");
    let on_disk = std::fs::read(h.disk("db")).unwrap();
    assert!(
        on_disk[..] == model[..on_disk.len()],
        "disk differs from the model"
    );
    assert!(model[on_disk.len()..].iter().all(|&b| b == 0));
    h.fs.release(a).await.unwrap();
    h.fs.release(b).await.unwrap();
}

/// Writes out of order that never queue up behind one another (each is flushed before the
/// next) never need more than one channel: however many, they open no lanes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_not_for_scattered_writes_answered_one_by_one() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "db").await;
    for i in 0..2 * super::file::SPREAD_AFTER {
        let at = scattered_page(i, 4096) * 4096;
        h.write(fh, at as u64, &[3u8; 4096]).await;
        h.fs.flush(fh).await.unwrap();
    }
    assert_eq!(h.plan.calls(ROp::OpenAlongside), 0, "lanes opened");
    h.fs.release(fh).await.unwrap();
}

/// A write a lane refuses at once (its channel is gone) goes through the descriptor's own
/// handle only after what the lanes still have on the way: an earlier write over the same
/// bytes, still on its way through the lane, would otherwise land after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_a_write_a_lane_refuses_goes_after_what_the_lanes_have_on_the_way() {
    let h = Harness::new();
    let (fh, at) = db_with_lanes(&h).await;
    let lane_writes = h.plan.calls(ROp::LaneWrite);
    h.plan
        .set_queue_delay(ROp::LaneWrite, Some(Duration::from_millis(200)));
    h.write(fh, at, b"first").await;
    eventually("the first write sent to the lane", || {
        h.plan.calls(ROp::LaneWrite) == lane_writes + 1
    })
    .await;
    h.plan.fail_next(
        ROp::LaneWrite,
        1,
        RemoteError::Disconnected("injected: the lane's channel is gone".into()),
    );
    h.write(fh, at, b"later").await;
    h.fs.flush(fh).await.unwrap();
    assert_eq!(
        h.plan.calls(ROp::LaneWrite),
        lane_writes + 2,
        "both were sent to the lane"
    );
    let on_disk = std::fs::read(h.disk("db")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&on_disk[at as usize..at as usize + 5]),
        "later",
        "the earlier write, on its way through the lane, landed last"
    );
    h.plan.clear_all();
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0);
}

/// With lanes open, a read through the descriptor still goes out right behind its writes when
/// all of them went through its own handle (a database reading back the page it just wrote:
/// one round trip); when one is on its way through a lane, the read waits for its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_a_read_goes_behind_own_handle_writes_and_waits_for_lane_writes() {
    let h = Harness::new();
    let (fh, at) = db_with_lanes(&h).await;

    // Page 0 is the own handle's: the write performed, its answer held.
    h.plan.hold_replies(ROp::Write);
    h.write(fh, 0, b"own").await;
    h.plan.until_held(ROp::Write, 1).await;
    // (The writer counts the job out of its queue just after the WRITE went.)
    let file = h.fs.file(fh).unwrap();
    eventually("the write on its way through the own handle", || {
        file.writes_ahead_on_own_handle()
    })
    .await;
    let read = tokio::time::timeout(Duration::from_secs(10), h.fs.read(fh, 0, 3)).await;
    assert_eq!(
        read.expect("the read waited for the write's answer")
            .unwrap(),
        &b"own"[..]
    );
    h.plan.release(ROp::Write);
    h.fs.flush(fh).await.unwrap();

    // The first lane's bytes.
    h.plan.hold_replies(ROp::LaneWrite);
    h.write(fh, at, b"lane").await;
    h.plan.until_held(ROp::LaneWrite, 1).await;
    let waiting = {
        let fs = h.fs.clone();
        tokio::spawn(async move { fs.read(fh, at, 4).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "a read did not wait for a write on its way through a lane"
    );
    h.plan.release(ROp::LaneWrite);
    assert_eq!(waiting.await.unwrap().unwrap(), &b"lane"[..]);
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0);
}

/// Lanes are opened by name: if another file was put under the name on the server's side
/// since the descriptor was opened, they are not used, and every write goes to the file the
/// descriptor has open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_not_over_another_file_put_under_the_name() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "db").await;
    h.write(fh, 0, &[9u8; 4096]).await;
    h.fs.flush(fh).await.unwrap();
    // Behind the mount's back: the file keeps a second name, another takes its own.
    std::fs::hard_link(h.disk("db"), h.disk("db.orig")).unwrap();
    std::fs::write(h.disk("other"), b"another file").unwrap();
    std::fs::rename(h.disk("other"), h.disk("db")).unwrap();
    let pages = spread_by_scattered_writes(&h, fh, 1).await;
    h.fs.flush(fh).await.unwrap();
    assert_eq!(h.plan.calls(ROp::OpenAlongside), 1);
    assert_eq!(std::fs::read(h.disk("db")).unwrap(), b"another file");
    let orig = std::fs::read(h.disk("db.orig")).unwrap();
    for p in pages {
        assert!(
            orig[p * 4096..(p + 1) * 4096].iter().all(|&b| b == 1),
            "page {p} did not reach the file the descriptor has open"
        );
    }
    assert_eq!(striped(&h), 0);
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0);
}

/// A read sent right behind the descriptor's writes on their handle, without waiting for
/// their answers, finds the connection gone: on the new one nothing orders it after them any
/// more, so it waits until they were sent again and answered, and sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_a_read_behind_writes_lost_with_the_connection_sees_them() {
    let h = Harness::new();
    let (_, fh) = h.create_written(b"old data").await;
    // The write goes, and reaches the file 300 ms later.
    h.plan
        .set_queue_delay(ROp::Write, Some(Duration::from_millis(300)));
    h.write(fh, 0, b"new").await;
    let file = h.fs.file(fh).unwrap();
    eventually("the write on its way through the own handle", || {
        file.writes_ahead_on_own_handle()
    })
    .await;
    h.plan.disconnect();
    h.plan.restore();
    h.plan.set_queue_delay(ROp::Write, None);
    assert_eq!(h.read(fh, 0, 100).await, b"new data");
    h.fs.flush(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"new data");
    h.fs.release(fh).await.unwrap();
}

/// A time change behind the writes goes through the descriptor's own handle; a write on a
/// lane after it waits for it. Otherwise the write could land first and the change would
/// leave the mtime it set, where the write must move it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_a_write_on_a_lane_waits_for_a_time_change_before_it() {
    let h = Harness::new();
    let (ino, fh) = create_excl(&h, "f").await;
    spread_by_scattered_writes(&h, fh, 1).await;
    h.fs.flush(fh).await.unwrap();
    assert_eq!(h.plan.calls(ROp::OpenAlongside), 1, "no lanes");
    // The own handle slow: its writes and attribute changes land 300 ms late.
    for op in [ROp::Write, ROp::Fsetstat] {
        h.plan.set_queue_delay(op, Some(Duration::from_millis(300)));
    }
    h.fs.setattr(ino, Some(fh), times(None, at(1_000_000)))
        .await
        .unwrap();
    let lane_writes = h.plan.calls(ROp::LaneWrite);
    h.write(fh, first_lane_offset(&h), b"later").await;
    h.fs.flush(fh).await.unwrap();
    assert_eq!(h.plan.calls(ROp::LaneWrite), lane_writes + 1);
    assert_eq!(
        h.plan.calls(ROp::Fsetstat),
        1,
        "the time change did not go behind"
    );
    assert_ne!(
        h.meta("f").mtime(),
        1_000_000,
        "the write on a lane landed before the time change sent ahead of it"
    );
    h.plan.clear_all();
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0);
}

// ------------------------------------------------------------------------------ reconnect

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_read_on_an_old_handle_reopens() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"hello world").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let fh = h.open(f, libc::O_RDONLY).await;
    // (The whole file: what was read along with the open is used up, the next read goes
    // to the server.)
    assert_eq!(h.read(fh, 0, 100).await, b"hello world");
    h.plan.disconnect();
    assert_errno(
        h.fs.read(fh, 0, 5).await,
        libc::EIO,
        "read while disconnected",
    );
    h.plan.restore();
    assert_eq!(
        h.read(fh, 6, 5).await,
        b"world",
        "read on the old fh after reconnect"
    );
    assert_eq!(h.read(fh, 0, 100).await, b"hello world");
    assert_eq!(h.size(f, Some(fh)).await, 11);
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0, "server handles leaked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_write_in_flight_at_disconnect_is_reported_at_flush() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "f").await;
    h.write(fh, 0, b"one").await;
    h.fs.flush(fh).await.unwrap();
    // The server performs the write, then the connection drops before its answer.
    h.plan.disconnect_after_next(ROp::Write);
    let w = h.fs.write(fh, 3, b"two").await;
    // close(2) before the connection is back (flush waits for the lost answer).
    let flushed = h.fs.flush(fh).await;
    assert!(h.plan.is_disconnected());
    h.plan.restore();
    assert!(
        w.is_err() || flushed.is_err(),
        "a write whose answer was lost in a disconnect was reported as done"
    );
    if let Err(e) = &flushed {
        assert_eq!(e.errno, libc::EIO, "{e}");
    }
    // Writes after the reconnect go through a reopened handle.
    h.write(fh, 6, b"three").await;
    h.fs.flush(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"onetwothree");
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0, "server handles leaked");
}

/// Wait (boundedly) until the connection of `h` has dropped.
async fn until_disconnected(h: &Harness) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if h.plan.is_disconnected() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the connection never dropped");
}

/// Write `data` at `offset` through `fh` with the connection dropping as the write is on the
/// wire (the server does it, its answer is lost), and wait until the drop is seen.
async fn write_lost_at_a_drop(h: &Harness, fh: u64, offset: u64, data: &[u8]) {
    h.plan.disconnect_after_next(ROp::Write);
    h.write(fh, offset, data).await;
    until_disconnected(h).await;
}

/// Wait (boundedly) until the mount has sent a lost write again, with no operation on the
/// file meanwhile.
async fn until_sent_again(h: &Harness) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if h.fs.stats.writes_sent_again.load(Ordering::Relaxed) == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the lost write waited for the next operation");
}

/// A write on the wire when the connection drops (the server did it, its answer was lost) is
/// sent again on the new connection, before a later write over the same bytes: nothing is
/// reported, and the later write is what the file holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_write_in_flight_at_disconnect_is_sent_again_in_order() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "f").await;
    h.write(fh, 0, b"one").await;
    h.fs.flush(fh).await.unwrap();
    h.plan.disconnect_after_next(ROp::Write);
    // Answered when queued; the writer sends it, the server does it, the answer is lost.
    h.write(fh, 3, b"two").await;
    until_disconnected(&h).await;
    h.plan.restore();
    h.write(fh, 3, b"TWO").await;
    h.fs.flush(fh)
        .await
        .expect("a write sent again is not a failure");
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"oneTWO");
    assert_eq!(h.fs.stats.writes_sent_again.load(Ordering::Relaxed), 1);
    h.fs.fsync(fh)
        .await
        .expect("nothing to report to fsync either");
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0, "server handles leaked");
}

/// The same with nothing written after it: the barrier of the flush sends it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_write_in_flight_at_disconnect_is_sent_again_by_a_flush() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "f").await;
    write_lost_at_a_drop(&h, fh, 0, b"only").await;
    // Someone changes the bytes on the server meanwhile; sending again puts ours back, as
    // the write landing late would have.
    std::fs::write(h.disk("f"), b"XXXX").unwrap();
    h.plan.restore();
    h.fs.flush(fh)
        .await
        .expect("a write sent again is not a failure");
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"only");
    h.fs.release(fh).await.unwrap();
}

/// A write the connection took is sent again as soon as its loss is known and there is a
/// connection, not only at the file's next write, read or close (the program may be waiting
/// for someone to read what it wrote).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_a_lost_write_is_sent_again_without_waiting_for_the_next_operation() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "f").await;
    // The write's answer is held while the connection drops and comes back: the answer
    // is the loss.
    h.plan.hold_replies(ROp::Write);
    h.write(fh, 0, b"data").await;
    h.plan.until_held(ROp::Write, 1).await;
    h.plan.disconnect();
    h.plan.restore();
    h.plan.release(ROp::Write);
    until_sent_again(&h).await;
    h.fs.flush(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"data");
    h.fs.release(fh).await.unwrap();
}

/// The same when the connection is not back yet as the loss comes back: the writer looks
/// again until it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_a_lost_write_is_sent_again_once_the_connection_is_back() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "f").await;
    write_lost_at_a_drop(&h, fh, 0, b"data").await;
    // The loss is back and the first try found no connection.
    tokio::time::sleep(Duration::from_millis(200)).await;
    std::fs::write(h.disk("f"), b"").unwrap();
    h.plan.restore();
    until_sent_again(&h).await;
    h.fs.flush(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"data");
    h.fs.release(fh).await.unwrap();
}

/// A read (here through another descriptor) waits until the writes a lost connection took
/// are sent again: as far as the mount's users know they are the file's content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_a_read_waits_for_the_writes_to_be_sent_again() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    h.write(fh, 0, b"old!").await;
    h.fs.flush(fh).await.unwrap();
    write_lost_at_a_drop(&h, fh, 0, b"new!").await;
    // As if the server had not done it: only sending it again can make the read right. (Let
    // its lost answer come back first, so that nothing is in flight any more.)
    std::fs::write(h.disk("f"), b"old!").unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.plan.restore();
    let other = h.open(f, libc::O_RDONLY).await;
    assert_eq!(h.read(other, 0, 4).await, b"new!");
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"new!");
    h.fs.release(other).await.unwrap();
    h.fs.release(fh).await.unwrap();
}

/// Through an O_APPEND handle the server appends whatever the offset: a write on the wire
/// at the drop is reported, not sent again (its bytes would be there twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_append_in_flight_at_disconnect_is_reported_not_repeated() {
    let h = Harness::new();
    std::fs::write(h.disk("log"), b"head").unwrap();
    let f = h.lookup(ROOT, "log").await;
    let fh = h.open(f, libc::O_WRONLY | libc::O_APPEND).await;
    h.plan.disconnect_after_next(ROp::Write);
    let w = h.fs.write(fh, 4, b"tail").await;
    until_disconnected(&h).await;
    h.plan.restore();
    let flushed = h.fs.flush(fh).await;
    assert!(
        w.is_err() || flushed.is_err(),
        "an append lost with the connection went unreported"
    );
    assert_eq!(std::fs::read(h.disk("log")).unwrap(), b"headtail");
    assert_eq!(h.fs.stats.writes_sent_again.load(Ordering::Relaxed), 0);
    h.fs.release(fh).await.ok();
}

/// A write still waiting to be sent when the connection drops (and that was therefore never
/// sent) goes out on the new connection; nothing is lost and nothing need be reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_write_queued_across_a_reconnect_lands() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "f").await;
    h.plan.hold(ROp::Write);
    let w = tokio::spawn(h.fs.write(fh, 0, b"data"));
    h.plan.until_held(ROp::Write, 1).await;
    h.plan.disconnect();
    h.plan.restore();
    h.plan.release(ROp::Write);
    let w = w.await.unwrap();
    let flushed = h.fs.flush(fh).await;
    h.plan.clear_all();
    let disk = std::fs::read(h.disk("f")).unwrap();
    // Either it landed, or its loss was reported: never acknowledged and missing.
    assert!(
        disk == b"data" || w.is_err() || flushed.is_err(),
        "write acknowledged, flush ok, disk has {disk:?}"
    );
    h.fs.release(fh).await.ok();
    assert_eq!(h.open_handles().await, 0, "server handles leaked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_write_on_an_old_handle_with_nothing_in_flight() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "f").await;
    h.write(fh, 0, b"before").await;
    h.fs.flush(fh).await.unwrap();
    h.plan.disconnect();
    h.plan.restore();
    h.write(fh, 6, b"+after").await;
    h.fs.flush(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"before+after");
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0, "server handles leaked");
}

/// Two requests on the same old handle after a reconnect both find it stale and both reopen;
/// only one of the new server handles can be kept, the other must be closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_concurrent_reopens_do_not_leak_server_handles() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"0123456789").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let fh = h.open(f, libc::O_RDONLY).await;
    h.plan.disconnect();
    h.plan.restore();
    // Keep both reopens in flight at once.
    h.plan
        .set_op_delay(ROp::Open, Some(Duration::from_millis(150)));
    let (fs1, fs2) = (h.fs.clone(), h.fs.clone());
    let r1 = tokio::spawn(async move { fs1.read(fh, 0, 5).await });
    let r2 = tokio::spawn(async move { fs2.read(fh, 5, 5).await });
    assert_eq!(r1.await.unwrap().unwrap(), &b"01234"[..]);
    assert_eq!(r2.await.unwrap().unwrap(), &b"56789"[..]);
    h.plan.clear_all();
    h.fs.release(fh).await.unwrap();
    assert_eq!(
        h.open_handles().await,
        0,
        "server handles leaked after concurrent reopens"
    );
}

/// fsync after a reconnect, with every write answered before the drop: nothing was lost, so
/// nothing to report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_fsync_on_an_old_handle() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "f").await;
    h.write(fh, 0, b"safe").await;
    h.fs.fsync(fh).await.unwrap();
    h.plan.disconnect();
    h.plan.restore();
    let r = h.fs.fsync(fh).await;
    h.fs.release(fh).await.ok();
    r.expect("fsync on an old handle after a reconnect, nothing in flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_setattr_and_getattr_on_an_old_handle() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    h.write(fh, 0, b"0123456789").await;
    h.fs.flush(fh).await.unwrap();
    h.plan.disconnect();
    h.plan.restore();
    let set = SetattrRequest {
        size: Some(4),
        ..Default::default()
    };
    assert_eq!(h.fs.setattr(f, Some(fh), set).await.unwrap().size, 4);
    assert_eq!(h.size(f, Some(fh)).await, 4);
    assert_eq!(h.meta("f").len(), 4);
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0);
}

/// A reopen after a reconnect goes to where the file is now (renamed through the mount) and
/// never creates, truncates or insists on exclusivity again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_reopen_follows_renames_and_drops_create_flags() {
    let h = Harness::new();
    let req = OpenRequest {
        flags: libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC,
        pid: 0,
        caller: Caller::ROOT,
    };
    let (_, fh) =
        h.fs.create(ROOT, os("f"), FILE_MODE, UMASK, req)
            .await
            .unwrap();
    h.write(fh, 0, b"abc").await;
    h.fs.flush(fh).await.unwrap();
    h.plan.disconnect();
    h.plan.restore();
    let d = h.mkdir(ROOT, "d").await;
    h.fs.rename(ROOT, os("f"), d, os("g"), 0).await.unwrap();
    h.write(fh, 3, b"def").await;
    h.fs.flush(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("d/g")).unwrap(), b"abcdef");
    assert!(!h.disk("f").exists(), "reopen re-created the old name");
    assert_eq!(h.read(fh, 0, 100).await, b"abcdef");
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0);
}

/// An unlinked file cannot be reopened after the connection (and with it the server's last
/// reference) is gone: EIO, not a hang or someone else's data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_unlinked_open_file_is_eio() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    h.write(fh, 0, b"gone").await;
    h.fs.unlink(ROOT, os("f")).await.unwrap();
    h.fs.fsyncdir(ROOT).await.unwrap();
    // Someone makes a new file of the same name.
    std::fs::write(h.disk("f"), b"other data").unwrap();
    h.plan.disconnect();
    h.plan.restore();
    assert_errno(
        h.fs.read(fh, 0, 100).await,
        libc::EIO,
        "read after reconnect",
    );
    let w = h.fs.write(fh, 0, b"x").await;
    let flushed = h.fs.flush(fh).await;
    assert!(
        w.is_err() || flushed.is_err(),
        "write to a lost unlinked file went unreported"
    );
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"other data");
    h.fs.release(fh).await.ok();
    h.fs.forget(f, 1);
}

// ------------------------------------------------------------------------------ mount options

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_symlinks_shows_targets() {
    let h = Harness::following_symlinks();
    std::fs::write(h.disk("t"), b"12345").unwrap();
    std::fs::create_dir(h.disk("d")).unwrap();
    std::fs::write(h.disk("d/inside"), b"").unwrap();
    std::os::unix::fs::symlink("t", h.disk("l")).unwrap();
    std::os::unix::fs::symlink("d", h.disk("ld")).unwrap();
    std::os::unix::fs::symlink("nowhere", h.disk("dangling")).unwrap();
    // From a listing and without one.
    for listed in [false, true] {
        if listed {
            let dh = h.fs.opendir(ROOT).await.unwrap();
            for item in h.fs.readdir(dh, 0).await.unwrap() {
                if item.name == "l" {
                    let e = h.fs.readdirplus_entry(ROOT, &item).await.unwrap();
                    assert_eq!(
                        (e.attr.kind, e.attr.size),
                        (FileKind::File, 5),
                        "readdirplus"
                    );
                }
            }
            h.fs.releasedir(dh);
        }
        let l = h.fs.lookup(ROOT, os("l")).await.unwrap().attr;
        assert_eq!((l.kind, l.size), (FileKind::File, 5), "listed={listed}");
        let ld = h.fs.lookup(ROOT, os("ld")).await.unwrap().attr;
        assert_eq!(ld.kind, FileKind::Dir, "listed={listed}");
        let dangling = h.fs.lookup(ROOT, os("dangling")).await.unwrap().attr;
        assert_eq!(dangling.kind, FileKind::Symlink, "listed={listed}");
        assert_eq!(
            h.fs.getattr(l.ino, None).await.unwrap().0.kind,
            FileKind::File
        );
        let dh = h.fs.opendir(ld.ino).await.unwrap();
        assert_eq!(h.fs.readdir(dh, 0).await.unwrap().len(), 3);
        h.fs.releasedir(dh);
    }
}

/// A symlink contained where it is made must stay contained under every name it gets:
/// `../../x` two levels down escapes from the top. A hard link or a rename that would put it
/// there is refused, and nothing reaches the server; a link whose directory was moved up
/// (not looked for) is refused when read through any of its names, since the kernel follows
/// it from whichever it came through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contained_symlink_cannot_be_linked_or_moved_to_where_it_escapes() {
    let h = Harness::containing(long_ttls());
    std::fs::create_dir_all(h.disk("a/b")).unwrap();
    std::fs::create_dir_all(h.disk("a/c")).unwrap();
    // Made on the server, escaping where it is.
    std::os::unix::fs::symlink("../x", h.disk("up")).unwrap();
    let a = h.lookup(ROOT, "a").await;
    let b = h.lookup(a, "b").await;
    let c = h.lookup(a, "c").await;
    let target = Path::new("../../x");
    let l =
        h.fs.symlink(b, os("l"), target, Caller::ROOT)
            .await
            .expect("contained at depth 2")
            .attr
            .ino;
    assert_errno(h.fs.link(l, ROOT, os("esc")).await, libc::EPERM, "link up");
    assert_errno(
        h.fs.rename(b, os("l"), ROOT, os("esc"), 0).await,
        libc::EPERM,
        "rename up",
    );
    assert!(h.disk("esc").symlink_metadata().is_err(), "nothing made");
    assert!(h.disk("a/b/l").symlink_metadata().is_ok(), "nothing moved");
    // At the same depth both work.
    h.fs.link(l, c, os("l2"))
        .await
        .expect("link at the same depth");
    h.fs.rename(b, os("l"), b, os("m"), 0)
        .await
        .expect("rename at the same depth");
    assert_eq!(h.fs.readlink(l).await.unwrap(), target);
    // A directory moved up takes its links with it, unchecked. The link has a name at
    // depth 2 still (a/b/m) and one at depth 1 now (c/l2): reading it is refused, whichever
    // name it is asked for.
    h.fs.rename(a, os("c"), ROOT, os("c"), 0).await.unwrap();
    assert_errno(
        h.fs.readlink(l).await,
        libc::EPERM,
        "readlink after the move",
    );
    // A link escaping where it is may still be moved to where it is contained.
    let up = h.lookup(ROOT, "up").await;
    assert_errno(h.fs.readlink(up).await, libc::EPERM, "escaping at the top");
    h.fs.rename(ROOT, os("up"), a, os("up"), 0)
        .await
        .expect("moved to where it is contained");
    assert_eq!(h.fs.readlink(up).await.unwrap(), Path::new("../x"));
}

/// A directory the kernel holds (a process's cwd, an open dirfd) keeps its server path; if
/// someone on the server swaps it for a symlink leading outside the export, every path sent
/// under it would land outside. Once its last check is past the attribute TTL (zero here),
/// the server is asked where it resolves first, and nothing is sent through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_directory_swapped_for_a_link_outside_is_refused() {
    let h = Harness::containing(CacheConfig {
        attr_ttl: Duration::ZERO,
        ..long_ttls()
    });
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"outside").unwrap();
    std::fs::create_dir(outside.path().join("sub")).unwrap();
    std::fs::create_dir_all(h.disk("d/sub")).unwrap();
    std::fs::write(h.disk("d/mine"), b"inside").unwrap();
    let d = h.lookup(ROOT, "d").await;
    let sub = h.lookup(d, "sub").await;
    let mine = h.lookup(d, "mine").await;
    // Before the swap, each of these works.
    let fh = h.fs.open(mine, as_root(libc::O_RDONLY)).await.unwrap();
    h.fs.release(fh).await.unwrap();
    let dh = h.fs.opendir(sub).await.unwrap();
    h.fs.releasedir(dh);

    std::fs::rename(h.disk("d"), h.disk("d.old")).unwrap();
    std::os::unix::fs::symlink(outside.path(), h.disk("d")).unwrap();
    let creat = as_root(libc::O_WRONLY | libc::O_CREAT);
    assert_errno(h.fs.lookup(d, os("secret")).await, libc::EACCES, "lookup");
    assert_errno(
        h.fs.create(d, os("planted"), FILE_MODE, UMASK, creat).await,
        libc::EACCES,
        "create",
    );
    assert_errno(
        h.fs.mkdir(d, os("pdir"), DIR_MODE, UMASK, Caller::ROOT)
            .await,
        libc::EACCES,
        "mkdir",
    );
    assert_errno(
        h.fs.symlink(d, os("plink"), Path::new("x"), Caller::ROOT)
            .await,
        libc::EACCES,
        "symlink",
    );
    assert_errno(h.fs.unlink(d, os("secret")).await, libc::EACCES, "unlink");
    assert_errno(
        h.fs.rename(d, os("secret"), ROOT, os("stolen"), 0).await,
        libc::EACCES,
        "rename out",
    );
    assert_errno(
        h.fs.open(mine, as_root(libc::O_RDONLY)).await,
        libc::EACCES,
        "open",
    );
    let truncate = SetattrRequest {
        size: Some(0),
        ..Default::default()
    };
    assert_errno(
        h.fs.setattr(mine, None, truncate).await,
        libc::EACCES,
        "truncate",
    );
    assert_errno(h.fs.opendir(d).await, libc::EACCES, "opendir");
    // A directory below it resolves outside as well (when there is one of its name there).
    assert_errno(h.fs.opendir(sub).await, libc::EACCES, "opendir below");
    let mut names: Vec<_> = std::fs::read_dir(outside.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["secret", "sub"], "nothing made or moved outside");
    assert_eq!(
        std::fs::read(outside.path().join("secret")).unwrap(),
        b"outside"
    );
    // Swapped back, the same inodes work again.
    std::fs::remove_file(h.disk("d")).unwrap();
    std::fs::rename(h.disk("d.old"), h.disk("d")).unwrap();
    let fh = h.fs.open(mine, as_root(libc::O_RDONLY)).await.unwrap();
    h.fs.release(fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idmap_maps_both_ways() {
    let probe = tempfile::tempdir().unwrap();
    let m = std::fs::metadata(probe.path()).unwrap();
    let (ruid, rgid) = (m.uid(), m.gid());
    let (luid, lgid) = (ruid.wrapping_add(4242), rgid.wrapping_add(4343));
    let h = Harness::with(
        FsConfig {
            idmap: Some(((ruid, rgid), (luid, lgid))),
            ..config(long_ttls())
        },
        None,
    );
    std::fs::write(h.disk("f"), b"x").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let a = h.fs.getattr(f, None).await.unwrap().0;
    assert_eq!((a.uid, a.gid), (luid, lgid));
    // chown to the mapped ids (e.g. `chown $USER f`) sets the remote ones.
    let a =
        h.fs.setattr(
            f,
            None,
            SetattrRequest {
                uid: Some(luid),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!((a.uid, a.gid), (luid, lgid));
    let m = h.meta("f");
    assert_eq!((m.uid(), m.gid()), (ruid, rgid));
    assert_eq!(h.fs.getattr(f, None).await.unwrap().0.uid, luid);
}

// ------------------------------------------------------------------------------ readdir

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readdir_lists_everything_with_kinds_and_resumable_offsets() {
    let h = Harness::new();
    std::fs::write(h.disk("file"), b"abc").unwrap();
    std::fs::create_dir(h.disk("dir")).unwrap();
    std::os::unix::fs::symlink("file", h.disk("link")).unwrap();
    let fifo = std::ffi::CString::new(h.disk("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    for i in 0..50 {
        std::fs::write(h.disk(format!("n{i:02}")), b"").unwrap();
    }
    let dh = h.fs.opendir(ROOT).await.unwrap();
    assert_eq!(h.fs.dir_ino(dh), Some(ROOT));
    let all = h.fs.readdir(dh, 0).await.unwrap();
    assert_eq!(all.len(), 2 + 4 + 50);
    assert_eq!(all[0].name, ".");
    assert_eq!(all[1].name, "..");
    assert_eq!((all[0].kind, all[1].kind), (FileKind::Dir, FileKind::Dir));
    for (i, item) in all.iter().enumerate() {
        assert_eq!(item.next_offset, i as u64 + 1, "offset of {:?}", item.name);
    }
    let kind_of = |name: &str| all.iter().find(|i| i.name == name).map(|i| i.kind);
    assert_eq!(kind_of("file"), Some(FileKind::File));
    assert_eq!(kind_of("dir"), Some(FileKind::Dir));
    assert_eq!(kind_of("link"), Some(FileKind::Symlink));
    assert_eq!(kind_of("fifo"), Some(FileKind::Fifo));
    let mut names: Vec<OsString> = all[2..].iter().map(|i| i.name.clone()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 54, "duplicates in the listing");
    // Resuming at every cookie gives exactly the rest.
    for k in 0..=all.len() {
        let rest = h.fs.readdir(dh, k as u64).await.unwrap();
        let want: Vec<&OsString> = all[k..].iter().map(|i| &i.name).collect();
        let got: Vec<&OsString> = rest.iter().map(|i| &i.name).collect();
        assert_eq!(got, want, "resume at {k}");
    }
    // The kernel resumes at the last next_offset it accepted.
    let third = all[3].next_offset;
    assert_eq!(h.fs.readdir(dh, third).await.unwrap()[0].name, all[4].name);
    assert!(h.fs.readdir(dh, 1_000).await.unwrap().is_empty());
    // Plain readdir creates no inodes.
    assert_eq!(h.fs.inode_count(), 1);
    assert_eq!(h.fs.peek_ino(ROOT, os(".")), ROOT);
    assert_eq!(h.fs.peek_ino(ROOT, os("..")), ROOT);
    // Below the root, ".." is the parent (as `ls -ai` shows it on a local disk).
    let dir = h.lookup(ROOT, "dir").await;
    let sub = h.mkdir(dir, "sub").await;
    assert_eq!(
        (h.fs.peek_ino(sub, os(".")), h.fs.peek_ino(sub, os(".."))),
        (sub, dir)
    );
    h.fs.releasedir(dh);
    assert_errno(
        h.fs.readdir(dh, 0).await,
        libc::EBADF,
        "readdir after releasedir",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readdir_non_utf8_names_are_byte_exact() {
    let h = Harness::new();
    let on_server = OsStr::from_bytes(b"caf\xe9-\xff\xfe.txt");
    std::fs::write(h.disk(on_server), b"latin1").unwrap();
    let dh = h.fs.opendir(ROOT).await.unwrap();
    let items = h.fs.readdir(dh, 0).await.unwrap();
    h.fs.releasedir(dh);
    let names: Vec<&OsStr> = items.iter().map(|i| i.name.as_os_str()).collect();
    assert!(
        names.iter().any(|n| n.as_bytes() == on_server.as_bytes()),
        "listing: {names:?}"
    );
    let e = h.fs.lookup(ROOT, on_server).await.unwrap();
    assert_eq!(e.attr.size, 6);
    let fh = h.open(e.attr.ino, libc::O_RDONLY).await;
    assert_eq!(h.read(fh, 0, 10).await, b"latin1");
    h.fs.release(fh).await.unwrap();
    // And the other way: a name made through the core arrives byte-exact.
    let from_kernel = OsStr::from_bytes(b"\x80\x81 new");
    let (_, fh) = h.create(ROOT, from_kernel).await;
    h.fs.release(fh).await.unwrap();
    let on_disk: Vec<OsString> = std::fs::read_dir(h.disk(""))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(on_disk
        .iter()
        .any(|n| n.as_bytes() == from_kernel.as_bytes()));
    h.fs.rename(ROOT, from_kernel, ROOT, os("renamed"), 0)
        .await
        .unwrap();
    assert!(h.disk("renamed").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readdirplus_entries_and_forget_bookkeeping() {
    let h = Harness::new();
    std::fs::write(h.disk("a"), b"1").unwrap();
    std::fs::write(h.disk("b"), b"22").unwrap();
    std::fs::create_dir(h.disk("c")).unwrap();
    std::os::unix::fs::symlink("a", h.disk("d")).unwrap();
    let baseline = h.fs.inode_count();
    let dh = h.fs.opendir(ROOT).await.unwrap();
    let items = h.fs.readdir(dh, 0).await.unwrap();
    h.plan.reset_counts();
    let mut taken = Vec::new();
    // Two passes (e.g. two `ls -l`): the same inodes, counted twice.
    for pass in 0..2 {
        for item in items.iter().filter(|i| i.attrs.is_some()) {
            let e = h.fs.readdirplus_entry(ROOT, item).await.unwrap();
            assert_eq!(e.attr.kind, item.kind);
            let name = item.name.to_str().unwrap();
            match name {
                "a" => assert_eq!(e.attr.size, 1),
                "b" => assert_eq!(e.attr.size, 2),
                _ => {}
            }
            if pass == 0 {
                assert_eq!(h.fs.peek_ino(ROOT, &item.name), e.attr.ino);
            } else {
                assert!(
                    taken.contains(&e.attr.ino),
                    "second pass gave a new inode for {name}"
                );
            }
            taken.push(e.attr.ino);
        }
    }
    // Nothing but the background listing of the subdirectory "c" (see prefetch tests),
    // which may land at any moment: the counts are read once.
    let counts = h.plan.call_counts();
    let others: u64 = counts
        .iter()
        .filter(|(op, _)| **op != ROp::ReadDir)
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        others, 0,
        "readdirplus entries reached the server: {counts:?}"
    );
    assert!(
        counts.get(&ROp::ReadDir).copied().unwrap_or(0) <= 1,
        "{counts:?}"
    );
    assert_eq!(h.fs.inode_count(), baseline + 4);
    // lookup of a listed name agrees.
    let a = h.lookup(ROOT, "a").await;
    assert!(taken.contains(&a));
    taken.push(a);
    for ino in &taken {
        h.fs.forget(*ino, 1);
    }
    assert_eq!(
        h.fs.inode_count(),
        baseline,
        "inodes left after every reference was forgotten"
    );
    assert_eq!(h.fs.peek_ino(ROOT, os("a")), u64::MAX);
    h.fs.releasedir(dh);
    // Forgetting in one batch works as well.
    let dh = h.fs.opendir(ROOT).await.unwrap();
    let items = h.fs.readdir(dh, 0).await.unwrap();
    h.fs.releasedir(dh);
    let b = items.iter().find(|i| i.name == "b").unwrap();
    let ino = h.fs.readdirplus_entry(ROOT, b).await.unwrap().attr.ino;
    assert_eq!(h.fs.readdirplus_entry(ROOT, b).await.unwrap().attr.ino, ino);
    assert_eq!(h.lookup(ROOT, "b").await, ino);
    h.fs.forget(ino, 3);
    assert_eq!(h.fs.inode_count(), baseline);
}

/// Wait (bounded) until `cond` holds; background work (prefetches) is not awaited by anyone.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// A directory opened again within the listing lifetime is answered from the cached listing,
/// which the mount's own changes keep current.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readdir_opendir_within_the_listing_lifetime_needs_no_round_trip() {
    let h = Harness::with(config(long_ttls()), None);
    std::fs::write(h.disk("a"), b"1").unwrap();
    let dh = h.fs.opendir(ROOT).await.unwrap();
    h.fs.releasedir(dh);
    let (_, fh) = h.create(ROOT, "made-here").await;
    h.fs.release(fh).await.unwrap();
    h.fs.unlink(ROOT, os("a")).await.unwrap();
    // (Its REMOVE, sent behind, is not what is counted below.)
    h.fs.fsyncdir(ROOT).await.unwrap();
    h.plan.reset_counts();
    let dh = h.fs.opendir(ROOT).await.unwrap();
    let names: Vec<OsString> =
        h.fs.readdir(dh, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
    h.fs.releasedir(dh);
    assert_eq!(
        h.plan.call_counts(),
        std::collections::HashMap::new(),
        "opendir reached the server"
    );
    assert_eq!(names, [os("."), os(".."), os("made-here")]);
}

/// readdirplus of a directory lists its subdirectories in the background, so opening them
/// next (a tree walk) needs no round trip; with the listing cache off nothing is prefetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readdir_subdirectories_are_listed_ahead_of_a_walk() {
    for cached in [true, false] {
        let ttls = long_ttls_listings(cached);
        let h = Harness::with(config(ttls), None);
        // More than are listed at once: the rest wait their turn, none is skipped.
        let n = super::MAX_DIR_LISTINGS_AHEAD + 8;
        for d in (0..n).map(|i| format!("s{i}")) {
            std::fs::create_dir(h.disk(&d)).unwrap();
            std::fs::write(h.disk(format!("{d}/inner")), d).unwrap();
        }
        std::fs::write(h.disk("file"), b"x").unwrap();
        let dh = h.fs.opendir(ROOT).await.unwrap();
        h.plan.reset_counts();
        let mut subdirs = Vec::new();
        for item in
            h.fs.readdir(dh, 0)
                .await
                .unwrap()
                .iter()
                .filter(|i| i.attrs.is_some())
        {
            let e = h.fs.readdirplus_entry(ROOT, item).await.unwrap();
            if e.attr.kind == FileKind::Dir {
                subdirs.push(e.attr.ino);
            }
        }
        h.fs.releasedir(dh);
        assert_eq!(subdirs.len(), n);
        if !cached {
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(
                h.plan.calls(ROp::ReadDir),
                0,
                "prefetched without a listing cache"
            );
            continue;
        }
        eventually("every subdirectory listed", || {
            h.plan.calls(ROp::ReadDir) == n as u64
        })
        .await;
        h.plan.reset_counts();
        for ino in subdirs {
            let dh = h.fs.opendir(ino).await.unwrap();
            let items = h.fs.readdir(dh, 0).await.unwrap();
            h.fs.releasedir(dh);
            assert!(items.iter().any(|i| i.name == "inner"));
        }
        assert_eq!(
            h.plan.call_counts(),
            std::collections::HashMap::new(),
            "the walk reached the server"
        );
    }
}

/// rewinddir(3) (readdir from offset 0 again on the same handle) shows the directory as it is
/// now on the server, not the snapshot taken at opendir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readdir_rewind_lists_afresh() {
    let h = Harness::with(config(long_ttls()), None);
    std::fs::write(h.disk("old"), b"").unwrap();
    let dh = h.fs.opendir(ROOT).await.unwrap();
    let first = h.fs.readdir(dh, 0).await.unwrap();
    assert!(first.iter().any(|i| i.name == "old"));
    std::fs::remove_file(h.disk("old")).unwrap();
    std::fs::write(h.disk("new"), b"").unwrap();
    // Reading on from an offset continues the snapshot...
    assert!(h
        .fs
        .readdir(dh, 2)
        .await
        .unwrap()
        .iter()
        .any(|i| i.name == "old"));
    // ...a rewind does not.
    let again: Vec<OsString> =
        h.fs.readdir(dh, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
    h.fs.releasedir(dh);
    assert_eq!(again, [os("."), os(".."), os("new")]);
}

// ------------------------------------------------------------------------------ setattr

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setattr_partial_utimens_does_not_clobber_the_other_time() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"x").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let both = SetattrRequest {
        atime: at(1_000_000),
        mtime: at(1_500_000),
        ..Default::default()
    };
    let a = h.fs.setattr(f, None, both).await.unwrap();
    assert_eq!((secs(a.atime), secs(a.mtime)), (1_000_000, 1_500_000));
    let only_atime = SetattrRequest {
        atime: at(2_000_000),
        ..Default::default()
    };
    let a = h.fs.setattr(f, None, only_atime).await.unwrap();
    let m = h.meta("f");
    assert_eq!(
        (m.atime(), m.mtime()),
        (2_000_000, 1_500_000),
        "atime-only on disk"
    );
    assert_eq!(
        (secs(a.atime), secs(a.mtime)),
        (2_000_000, 1_500_000),
        "atime-only reply"
    );
    let only_mtime = SetattrRequest {
        mtime: at(1_700_000),
        ..Default::default()
    };
    h.fs.setattr(f, None, only_mtime).await.unwrap();
    let m = h.meta("f");
    assert_eq!(
        (m.atime(), m.mtime()),
        (2_000_000, 1_700_000),
        "mtime-only on disk"
    );
    // Through a handle as well (futimens), with the attr cache holding the old times.
    let fh = h.open(f, libc::O_WRONLY).await;
    h.fs.getattr(f, Some(fh)).await.unwrap();
    std::fs::File::options()
        .write(true)
        .open(h.disk("f"))
        .unwrap()
        .set_modified(UNIX_EPOCH + Duration::from_secs(1_800_000))
        .unwrap();
    let a =
        h.fs.setattr(
            f,
            Some(fh),
            SetattrRequest {
                atime: at(2_500_000),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let m = h.meta("f");
    assert_eq!(m.atime(), 2_500_000);
    assert_eq!(
        m.mtime(),
        1_800_000,
        "atime-only via fh put back a stale cached mtime"
    );
    assert_eq!(secs(a.mtime), 1_800_000);
    // TimeSpec::Now lands near now.
    let now = SystemTime::now();
    h.fs.setattr(
        f,
        Some(fh),
        SetattrRequest {
            mtime: Some(TimeSpec::Now),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let m = h.meta("f");
    assert!((m.mtime() - secs(now) as i64).abs() <= 2);
    assert_eq!(m.atime(), 2_500_000);
    h.fs.release(fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setattr_chmod_and_truncate() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"hello").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let a =
        h.fs.setattr(
            f,
            None,
            SetattrRequest {
                mode: Some(libc::S_IFREG | 0o600),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(a.perm, 0o600);
    assert_eq!(h.meta("f").mode() & 0o7777, 0o600);
    assert_eq!(h.fs.getattr(f, None).await.unwrap().0.perm, 0o600);
    // truncate shorter, then longer (zero-filled)
    let trunc = |size| SetattrRequest {
        size: Some(size),
        ..Default::default()
    };
    assert_eq!(h.fs.setattr(f, None, trunc(3)).await.unwrap().size, 3);
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"hel");
    assert_eq!(h.size(f, None).await, 3);
    assert_eq!(h.fs.setattr(f, None, trunc(6)).await.unwrap().size, 6);
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"hel\0\0\0");
    // ftruncate through a handle with writes in flight: the writes land first.
    let fh = h.open(f, libc::O_RDWR).await;
    h.plan
        .set_op_delay(ROp::Write, Some(Duration::from_millis(100)));
    let w = tokio::spawn(h.fs.write(fh, 0, b"0123456789"));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(h.fs.setattr(f, Some(fh), trunc(4)).await.unwrap().size, 4);
    w.await.unwrap().unwrap();
    h.plan.clear_all();
    h.fs.flush(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"0123");
    assert_eq!(h.size(f, Some(fh)).await, 4);
    assert_eq!(h.size(f, None).await, 4);
    // chmod of a directory
    let d = h.mkdir(ROOT, "d").await;
    h.fs.setattr(
        d,
        None,
        SetattrRequest {
            mode: Some(libc::S_IFDIR | 0o700),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(h.meta("d").mode() & 0o7777, 0o700);
    h.fs.release(fh).await.unwrap();
}

/// chown(2) of a regular file clears its set-user-ID bit on the server (Linux does so even for
/// root); the attributes the core answers, and caches, must say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setattr_chown_reply_matches_the_server() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(h.disk("f"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    let f = h.lookup(ROOT, "f").await;
    assert_eq!(h.fs.getattr(f, None).await.unwrap().0.perm, 0o4755);
    let m = h.meta("f");
    let set = SetattrRequest {
        uid: Some(m.uid()),
        gid: Some(m.gid()),
        ..Default::default()
    };
    let a = h.fs.setattr(f, None, set).await.unwrap();
    let on_disk = (h.meta("f").mode() & 0o7777) as u16;
    let mut c = Checks::default();
    c.check(
        &format!("chown reply perm {:o}, server has {on_disk:o}", a.perm),
        a.perm == on_disk,
    );
    let cached = h.fs.getattr(f, None).await.unwrap().0.perm;
    c.check(
        &format!("getattr after chown perm {cached:o}, server has {on_disk:o}"),
        cached == on_disk,
    );
    c.finish();
}

/// `chown(f, -1, -1)` reaches the mount as a setattr with nothing to set: nothing is sent,
/// and the ctime moves, as Linux has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setattr_with_nothing_to_set_moves_the_ctime_only() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"data").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let before = h.fs.getattr(f, None).await.unwrap().0.ctime;
    h.plan.reset_counts();
    let a =
        h.fs.setattr(f, None, SetattrRequest::default())
            .await
            .unwrap();
    assert_eq!(h.plan.total_calls(), 0, "{:?}", h.plan.call_counts());
    assert!(a.ctime > before, "ctime {:?} not after {before:?}", a.ctime);
}

/// An mtime set in the future (`touch -d` a date to come) does not hold the ctime there:
/// setting it, and every change after it, moved the status now, as on a local disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_future_mtime_set_through_the_mount_does_not_freeze_the_ctime() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"data").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let future = UNIX_EPOCH + Duration::from_secs(1_950_000_000);
    let set = SetattrRequest {
        mtime: Some(TimeSpec::At(future)),
        ..Default::default()
    };
    let a = h.fs.setattr(f, None, set).await.unwrap();
    assert_eq!(a.mtime, future);
    let soon = SystemTime::now() + Duration::from_secs(60);
    assert!(
        a.ctime < soon,
        "ctime {:?} after setting the mtime",
        a.ctime
    );
    let chmod = SetattrRequest {
        mode: Some(libc::S_IFREG | 0o600),
        ..Default::default()
    };
    let b = h.fs.setattr(f, None, chmod).await.unwrap();
    assert!(b.ctime < soon, "ctime {:?} after a chmod", b.ctime);
    assert!(b.ctime >= a.ctime);
    let (c, _) = h.fs.getattr(f, None).await.unwrap();
    assert!(c.ctime < soon, "ctime {:?} of a stat", c.ctime);
    assert_eq!(c.mtime, future);
}

/// What tar does for every file it extracts: chown, chmod, set times. Without set-id bits
/// each is one SETSTAT and nothing else, and every reply agrees with the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setattr_owner_mode_times_one_round_trip_each() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"data").unwrap();
    let f = h.lookup(ROOT, "f").await;
    h.fs.getattr(f, None).await.unwrap();
    let m = h.meta("f");
    let when = UNIX_EPOCH + Duration::from_secs(1_500_000_000);
    let steps = [
        SetattrRequest {
            uid: Some(m.uid()),
            gid: Some(m.gid()),
            ..Default::default()
        },
        SetattrRequest {
            mode: Some(libc::S_IFREG | 0o640),
            ..Default::default()
        },
        SetattrRequest {
            atime: Some(TimeSpec::At(when)),
            mtime: Some(TimeSpec::At(when)),
            ..Default::default()
        },
    ];
    for (i, set) in steps.into_iter().enumerate() {
        h.plan.reset_counts();
        let a = h.fs.setattr(f, None, set).await.unwrap();
        assert_eq!(
            h.plan.call_counts(),
            [(ROp::Setstat, 1)].into_iter().collect(),
            "step {i}"
        );
        let disk = h.meta("f");
        assert_eq!(
            (a.uid, a.gid, a.perm as u32, a.size),
            (disk.uid(), disk.gid(), disk.mode() & 0o7777, disk.len()),
            "step {i}: reply vs server"
        );
    }
    assert_eq!(h.meta("f").mtime(), 1_500_000_000);
}

/// A truncate by path (or times set on a file whose size the mount has not seen since its
/// writes): the answer needs the mtime the server gives it and the rest, which are asked
/// right behind the SETSTAT (`Remote::setstat_lstat`: one round trip on SFTP) and kept, so a
/// getattr after it asks nothing. Attributes asked along while another change went through
/// the mount may predate it: they are asked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setattr_by_path_asks_the_attributes_along() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"0123456789").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let along = || h.fs.stats.setattrs_stat_along.load(Ordering::Relaxed);
    let truncate = |size: u64| SetattrRequest {
        size: Some(size),
        ..Default::default()
    };
    h.plan.reset_counts();
    let a = h.fs.setattr(f, None, truncate(4)).await.unwrap();
    let disk = h.meta("f");
    assert_eq!((a.size, secs(a.mtime) as i64), (4, disk.mtime()), "answer");
    assert_eq!(along(), 1, "attributes not asked along");
    let (cached, _) = h.fs.getattr(f, None).await.unwrap();
    assert_eq!((cached.size, secs(cached.mtime) as i64), (4, disk.mtime()));
    assert_eq!(
        h.plan.call_counts(),
        [(ROp::Setstat, 1), (ROp::Lstat, 1)].into_iter().collect(),
        "asked more than the change and its attributes"
    );

    // A write through the mount lands while the attributes asked along are on their way:
    // they show the file without it, and must not be what the answer says or the cache keeps.
    let fh = h.open(f, libc::O_WRONLY).await;
    h.plan.hold_replies(ROp::Lstat);
    let set = tokio::spawn({
        let fs = h.fs.clone();
        async move { fs.setattr(f, None, truncate(20)).await }
    });
    h.plan.until_held(ROp::Lstat, 1).await;
    h.fs.write(fh, 20, b"def").await.unwrap();
    h.fs.flush(fh).await.unwrap();
    h.plan.release(ROp::Lstat);
    let a = set.await.unwrap().unwrap();
    assert_eq!(a.size, 23, "answered with attributes from before the write");
    assert_eq!(h.fs.getattr(f, None).await.unwrap().0.size, 23, "cached");
    assert_eq!(
        along(),
        1,
        "attributes from before the write counted as used"
    );
    h.fs.release(fh).await.unwrap();
}

/// Times set by path right after a close, as `shutil.copy2` does: the kernel sends the
/// RELEASE of the closed descriptor on its own, so they may come while the release waits for
/// the file's writes, and be queued behind them (answered at once). The release waits for
/// them too before it closes the handle: they would have gone on a closed handle, or after a
/// chmod by path that showed the old mtime. What comes after sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_set_while_the_creating_descriptor_is_released_are_kept() {
    let h = Harness::new();
    // An FSETSTAT behind the writes waits here until the handle is closed: what the race
    // did when the writer task was slower than the release's CLOSE.
    h.plan.hold(ROp::Fsetstat);
    let (f, fh) = h.create(ROOT, "f").await;
    h.plan.hold_replies(ROp::Write);
    h.write(fh, 0, b"data").await;
    h.plan.until_held(ROp::Write, 1).await;
    let release = tokio::spawn({
        let fs = h.fs.clone();
        async move { fs.release(fh).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !release.is_finished(),
        "the release did not wait for the write"
    );
    let set_times = tokio::spawn({
        let fs = h.fs.clone();
        async move {
            let times = SetattrRequest {
                atime: at(1_400_000_000),
                mtime: at(1_500_000_000),
                ..Default::default()
            };
            fs.setattr(f, None, times).await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.plan.release(ROp::Write);
    // A release that does not wait for the FSETSTAT closes the handle meanwhile (given a
    // second for it; a release that waits keeps it open).
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while h.fs.remote().inner().open_handles() > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.plan.release(ROp::Fsetstat);
    tokio::time::timeout(Duration::from_secs(30), release)
        .await
        .expect("release hangs")
        .unwrap()
        .unwrap();
    assert_eq!(h.open_handles().await, 0, "the handle was not closed");
    let a = set_times.await.unwrap().unwrap();
    assert_eq!(secs(a.mtime), 1_500_000_000, "answer");
    let chmod = SetattrRequest {
        mode: Some(libc::S_IFREG | 0o640),
        ..Default::default()
    };
    let a = h.fs.setattr(f, None, chmod).await.unwrap();
    assert_eq!(
        (a.perm, secs(a.mtime)),
        (0o640, 1_500_000_000),
        "chmod's answer"
    );
    let disk = h.meta("f");
    assert_eq!(
        (disk.mtime(), disk.atime(), disk.mode() & 0o7777, disk.len()),
        (1_500_000_000, 1_400_000_000, 0o640, 4),
        "on the server"
    );
}

/// The close of an `O_APPEND` descriptor asks no attributes behind its writes (a shell's `>>`
/// is seldom `stat`ed after; the FSTAT's answer was a tenth of each `echo >> log`): it waits
/// for the write alone, and a `stat` after it asks the server, which alone knows where the
/// append landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_of_appends_asks_no_attributes_behind_them() {
    let h = Harness::new();
    std::fs::write(h.disk("log"), b"first\n").unwrap();
    let f = h.lookup(ROOT, "log").await;
    let fh = h.open(f, libc::O_WRONLY | libc::O_APPEND).await;
    h.plan.hold_replies(ROp::Write);
    // The kernel's idea of the offset, which the server's append does not follow.
    assert_eq!(h.fs.write(fh, 0, b"second\n").await.unwrap(), 7);
    h.plan.until_held(ROp::Write, 1).await;
    h.plan.reset_counts();
    let close = tokio::spawn({
        let fs = h.fs.clone();
        async move { fs.flush(fh).await }
    });
    // An FSTAT behind the writes goes out at once when the close comes (see the test
    // below); give a wrong one ample time to show.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!close.is_finished(), "the close did not wait for the write");
    assert_eq!(h.plan.calls(ROp::Fstat), 0, "an FSTAT behind the appends");
    h.plan.release(ROp::Write);
    close.await.unwrap().unwrap();
    h.fs.release(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("log")).unwrap(), b"first\nsecond\n");
    let shown = h.fs.getattr(f, None).await.unwrap().0;
    assert_eq!(shown.size, 13);
    let asked = [ROp::Lstat, ROp::Stat, ROp::Fstat].map(|op| h.plan.calls(op));
    assert_eq!(
        asked.iter().sum::<u64>(),
        1,
        "the stat after the close: {asked:?}"
    );
}

/// A close that waits for writes on their way asks the attributes they leave right behind
/// them (within the wait on SFTP, see `Fs::attrs_behind_writes`): a `stat` after the close,
/// and after the release, asks nothing, and shows the server's size and mtime. Not kept when
/// a write failed, nor when the file changed through the mount while the FSTAT was on its
/// way: then a `stat` asks the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_learns_the_attributes_its_writes_leave() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let learnt = || h.fs.stats.attrs_along_writes.load(Ordering::Relaxed);
    // Writes on the wire, unanswered, when the close comes; answered once it has asked.
    let close_with_writes_on_the_wire = |fh: u64, data: &'static [u8]| {
        let fs = h.fs.clone();
        let plan = h.plan.clone();
        async move {
            plan.hold_replies(ROp::Write);
            let fstats = plan.calls(ROp::Fstat);
            assert_eq!(fs.write(fh, 0, data).await.unwrap() as usize, data.len());
            plan.until_held(ROp::Write, 1).await;
            let close = tokio::spawn({
                let fs = fs.clone();
                async move { fs.flush(fh).await }
            });
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while plan.calls(ROp::Fstat) == fstats {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no FSTAT at the close"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            plan.release(ROp::Write);
            close.await.unwrap()
        }
    };

    let fh = h.open(f, libc::O_WRONLY).await;
    close_with_writes_on_the_wire(fh, b"0123456789")
        .await
        .unwrap();
    assert_eq!(learnt(), 1);
    h.plan.reset_counts();
    let disk = h.meta("f");
    let shown = h.fs.getattr(f, None).await.unwrap().0;
    assert_eq!(
        (shown.size, secs(shown.mtime) as i64),
        (10, disk.mtime()),
        "after the close"
    );
    h.fs.release(fh).await.unwrap();
    let shown = h.fs.getattr(f, None).await.unwrap().0;
    assert_eq!(shown.size, 10, "after the release");
    let asked = [ROp::Lstat, ROp::Stat, ROp::Fstat].map(|op| h.plan.calls(op));
    assert_eq!(asked, [0; 3], "a stat after the close asked the server");

    // A write that fails: what the server has is not known here.
    let fh = h.open(f, libc::O_WRONLY).await;
    h.plan
        .fail_next_after_performing(ROp::Write, 1, failure("injected"));
    let e = close_with_writes_on_the_wire(fh, b"abc").await.unwrap_err();
    assert_eq!(e.errno, libc::EIO, "{e}");
    h.fs.release(fh).await.unwrap();
    h.plan.reset_counts();
    h.fs.getattr(f, None).await.unwrap();
    assert_eq!(h.plan.calls(ROp::Lstat), 1, "kept after a failed write");
    assert_eq!(learnt(), 1);

    // Another write through the descriptor while the FSTAT is on its way: what it shows
    // may predate that write.
    let fh = h.open(f, libc::O_WRONLY).await;
    h.plan.hold_replies(ROp::Write);
    h.write(fh, 0, b"0123456789").await;
    h.plan.until_held(ROp::Write, 1).await;
    h.plan.hold(ROp::Fstat);
    let close = tokio::spawn({
        let fs = h.fs.clone();
        async move { fs.flush(fh).await }
    });
    h.plan.until_held(ROp::Fstat, 1).await;
    h.write(fh, 10, b"late").await;
    h.plan.release(ROp::Fstat);
    h.plan.release(ROp::Write);
    close.await.unwrap().unwrap();
    h.plan.reset_counts();
    assert_eq!(h.fs.getattr(f, None).await.unwrap().0.size, 14);
    assert_eq!(
        h.plan.calls(ROp::Lstat),
        1,
        "kept attributes that predate a write"
    );
    assert_eq!(learnt(), 1);
    h.fs.release(fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setattr_on_a_symlink() {
    let h = Harness::new();
    std::fs::write(h.disk("target"), b"t").unwrap();
    let e =
        h.fs.symlink(ROOT, os("l"), Path::new("target"), Caller::ROOT)
            .await
            .unwrap();
    assert_eq!(e.attr.kind, FileKind::Symlink);
    let l = e.attr.ino;
    assert_eq!(h.fs.readlink(l).await.unwrap(), Path::new("target"));
    assert_errno(
        h.fs.setattr(
            l,
            None,
            SetattrRequest {
                mode: Some(libc::S_IFLNK | 0o600),
                ..Default::default()
            },
        )
        .await,
        libc::EOPNOTSUPP,
        "chmod of a symlink",
    );
    assert_eq!(
        h.meta("target").mode() & 0o7777,
        0o644,
        "chmod followed the link"
    );
    // Times of the link itself (lutimes), not of its target.
    let target_mtime = h.meta("target").mtime();
    h.fs.setattr(
        l,
        None,
        SetattrRequest {
            atime: at(1_000_000),
            mtime: at(1_100_000),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(h.meta("l").mtime(), 1_100_000);
    assert_eq!(h.meta("target").mtime(), target_mtime);
}

// ------------------------------------------------------------------------------ read-only

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_refuses_every_mutation_and_reads_still_work() {
    let h = Harness::new();
    std::fs::create_dir(h.disk("d")).unwrap();
    std::os::unix::fs::symlink("f", h.disk("l")).unwrap();
    let (f, wfh) = h.create(ROOT, "f").await;
    h.write(wfh, 0, b"content").await;
    h.fs.flush(wfh).await.unwrap();
    h.lookup(ROOT, "d").await;
    let l = h.lookup(ROOT, "l").await;

    h.fs.set_read_only();
    assert!(h.fs.is_read_only());
    let mut c = Checks::default();
    let rofs = libc::EROFS;
    c.errno(
        "mkdir",
        h.fs.mkdir(ROOT, os("nd"), DIR_MODE, UMASK, Caller::ROOT)
            .await,
        rofs,
    );
    let req = OpenRequest {
        flags: libc::O_RDWR | libc::O_CREAT,
        pid: 0,
        caller: Caller::ROOT,
    };
    c.errno(
        "create",
        h.fs.create(ROOT, os("nf"), FILE_MODE, UMASK, req).await,
        rofs,
    );
    c.errno("unlink", h.fs.unlink(ROOT, os("f")).await, rofs);
    c.errno("rmdir", h.fs.rmdir(ROOT, os("d")).await, rofs);
    c.errno(
        "rename",
        h.fs.rename(ROOT, os("f"), ROOT, os("g"), 0).await,
        rofs,
    );
    c.errno("link", h.fs.link(f, ROOT, os("h")).await, rofs);
    c.errno(
        "symlink",
        h.fs.symlink(ROOT, os("s"), Path::new("f"), Caller::ROOT)
            .await,
        rofs,
    );
    for (what, set) in [
        (
            "truncate",
            SetattrRequest {
                size: Some(0),
                ..Default::default()
            },
        ),
        (
            "chmod",
            SetattrRequest {
                mode: Some(0o600),
                ..Default::default()
            },
        ),
        (
            "utimens",
            SetattrRequest {
                mtime: at(5),
                ..Default::default()
            },
        ),
    ] {
        c.errno(what, h.fs.setattr(f, None, set).await, rofs);
        c.errno(what, h.fs.setattr(f, Some(wfh), set).await, rofs);
    }
    for (what, flags) in [
        ("open O_WRONLY", libc::O_WRONLY),
        ("open O_RDWR", libc::O_RDWR),
        ("open O_RDONLY|O_TRUNC", libc::O_RDONLY | libc::O_TRUNC),
        ("open O_WRONLY|O_APPEND", libc::O_WRONLY | libc::O_APPEND),
    ] {
        c.errno(what, h.fs.open(f, as_root(flags)).await, rofs);
    }
    c.errno(
        "write on a handle opened before",
        h.fs.write(wfh, 0, b"X").await,
        rofs,
    );
    c.errno("access W_OK", h.fs.access(f, libc::W_OK, 0, 0).await, rofs);
    c.finish();

    // Nothing changed on disk.
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"content");
    for name in ["nd", "nf", "g", "h", "s"] {
        assert!(
            !h.disk(name).exists(),
            "{name} was created on a read-only mount"
        );
    }
    assert!(h.disk("d").is_dir());

    // Reads work.
    let f2 = h.lookup(ROOT, "f").await;
    assert_eq!(f2, f);
    assert_eq!(h.size(f, None).await, 7);
    let rfh = h.open(f, libc::O_RDONLY).await;
    assert_eq!(h.read(rfh, 0, 100).await, b"content");
    assert_eq!(h.read(wfh, 0, 100).await, b"content");
    h.fs.release(rfh).await.unwrap();
    let dh = h.fs.opendir(ROOT).await.unwrap();
    assert_eq!(h.fs.readdir(dh, 0).await.unwrap().len(), 2 + 3);
    h.fs.releasedir(dh);
    assert_eq!(h.fs.readlink(l).await.unwrap(), Path::new("f"));
    h.fs.statfs().await.unwrap();
    h.fs.access(f, libc::R_OK, 0, 0).await.unwrap();
    h.fs.flush(wfh).await.unwrap();
    h.fs.release(wfh).await.unwrap();
    assert_eq!(h.open_handles().await, 0);
}

/// Once a downgrade has begun, changes get EROFS at once but for the kernel's write-back of
/// pages a shared mapping dirtied before, which lands until the mount is read-only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_refuses_changes_at_once_but_page_writeback() {
    let h = Harness::new();
    let (_, wfh) = h.create(ROOT, "f").await;
    h.write(wfh, 0, b"one").await;
    assert!(h.fs.refuse_changes_but_page_writeback());
    assert!(!h.fs.refuse_changes_but_page_writeback(), "begun once");
    assert!(h.fs.is_read_only());
    assert_errno(h.fs.write(wfh, 0, b"two").await, libc::EROFS, "write");
    assert_errno(
        h.fs.mkdir(ROOT, os("d"), DIR_MODE, UMASK, Caller::ROOT)
            .await,
        libc::EROFS,
        "mkdir",
    );
    assert_errno(h.fs.unlink(ROOT, os("f")).await, libc::EROFS, "unlink");
    assert_eq!(h.fs.write_from(wfh, 3, b"page", true).await.unwrap(), 4);
    h.fs.set_read_only();
    assert_errno(
        h.fs.write_from(wfh, 0, b"late", true).await,
        libc::EROFS,
        "page write-back after the downgrade",
    );
    h.fs.flush(wfh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"onepage");
}

// ------------------------------------------------------------------------------ large reads

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_read_is_split_and_reassembled_with_a_short_read_at_eof() {
    let limits = Limits {
        max_read: 8 * 1024,
        max_write: 8 * 1024,
        max_open_handles: 64,
    };
    let h = Harness::with(config(long_ttls()), Some(limits));
    let len = (1 << 20) - 1234;
    let content = pattern(len);
    std::fs::write(h.disk("big"), &content).unwrap();
    let f = h.lookup(ROOT, "big").await;
    let fh = h.open(f, libc::O_RDONLY).await;
    h.plan.reset_counts();
    let got = h.read(fh, 0, 1 << 20).await;
    assert_eq!(got.len(), len, "read of 1 MiB from a file of {len} bytes");
    assert!(got == content, "content differs");
    assert!(
        h.plan.calls(ROp::Read) >= (len as u64).div_ceil(8 * 1024),
        "not split: {} reads",
        h.plan.calls(ROp::Read)
    );
    // Unaligned ranges inside, across and past the end.
    for (off, size) in [
        (5_000usize, 100_000u32),
        (8 * 1024 - 1, 8 * 1024 + 2),
        (len - 10, 1 << 20),
        (len - 8 * 1024, 8 * 1024),
        (len - 8 * 1024 - 1, 3 * 8 * 1024),
        (len, 4096),
        (len + 100, 1 << 20),
    ] {
        let got = h.read(fh, off as u64, size).await;
        let end = (off + size as usize).min(len);
        let want = if off >= len {
            &[][..]
        } else {
            &content[off..end]
        };
        assert!(
            got == want,
            "read({off}, {size}): {} bytes, want {}",
            got.len(),
            want.len()
        );
    }
    h.fs.release(fh).await.unwrap();

    // The write side splits by max_write too.
    let (g, fh) = h.create(ROOT, "copy").await;
    h.write(fh, 0, &content).await;
    h.fs.flush(fh).await.unwrap();
    assert!(
        std::fs::read(h.disk("copy")).unwrap() == content,
        "large write"
    );
    assert_eq!(h.size(g, Some(fh)).await, len as u64);
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.open_handles().await, 0);
}

// ------------------------------------------------------------------------------ hard links

/// Stands in for the kernel's end of [`Fs::kernel_caches`], taking `delay` per inode to
/// drop: the returned closure takes the inodes told to drop their caches since it last
/// ran, in order.
fn kernel_drops_recorded(h: &Harness, delay: Duration) -> impl Fn() -> Vec<Ino> {
    let told = Arc::new(std::sync::Mutex::new(Vec::new()));
    let t = told.clone();
    h.fs.kernel_caches().connect(Box::new(move |ino| {
        std::thread::sleep(delay);
        t.lock().unwrap().push(ino)
    }));
    move || std::mem::take(&mut *told.lock().unwrap())
}

/// Stands in for the kernel's end of the names [`Fs::kernel_caches`] drops: the returned
/// closure says whether (parent, name) is among the names told to drop so far (they are sent
/// from a thread of their own: wait for them with [`eventually`]).
fn kernel_names_recorded(h: &Harness) -> impl Fn(Ino, &str) -> bool {
    let told = Arc::new(std::sync::Mutex::new(Vec::<(Ino, OsString)>::new()));
    let t = told.clone();
    h.fs.kernel_caches()
        .connect_names(Box::new(move |parent, name| {
            t.lock().unwrap().push((parent, name.to_os_string()))
        }));
    move |parent, name| {
        told.lock()
            .unwrap()
            .contains(&(parent, OsString::from(name)))
    }
}

/// What `ls -l` does through readdirplus (as the FUSE adapter answers it): every entry of
/// `dir` with the entry it produced.
async fn list_plus(h: &Harness, dir: Ino) -> Vec<(OsString, super::Entry)> {
    let dh = h.fs.opendir(dir).await.unwrap();
    let mut out = Vec::new();
    let items = h.fs.readdir(dh, 0).await.unwrap();
    h.fs.fill_unknown_attrs(dir, &items).await;
    for item in items {
        if item.attrs.is_some() {
            let e = h.fs.readdirplus_entry(dir, &item).await.unwrap();
            out.push((item.name.clone(), e));
        }
    }
    h.fs.releasedir(dh);
    out
}

/// A link made through the mount is another name of the same inode: LINK answers with the
/// source's inode, a later lookup of either name finds it, the link count follows links and
/// unlinks, and when the first name goes the inode lives on under the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_is_the_same_inode_under_both_names() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    h.write(fh, 0, b"data").await;
    h.fs.release(fh).await.unwrap();
    let d = h.mkdir(ROOT, "d").await;
    let e = h.fs.link(f, d, os("h")).await.unwrap();
    assert_eq!(e.attr.ino, f, "LINK must answer with the source's inode");
    assert_eq!(e.attr.nlink, 2, "link count after link");
    assert_eq!(e.attr.size, 4);
    assert_eq!(h.lookup(d, "h").await, f);
    assert_eq!(h.lookup(ROOT, "f").await, f);
    assert_eq!(h.fs.getattr(f, None).await.unwrap().0.nlink, 2);
    // A listing agrees (the server says 2 as well).
    for (name, e) in list_plus(&h, d).await {
        assert_eq!(
            (name.as_os_str(), e.attr.ino, e.attr.nlink),
            (os("h"), f, 2)
        );
        assert!(
            !e.attr_ttl.is_zero(),
            "both names known: attributes may be cached"
        );
    }
    // Writing through one name changes what both show.
    let fh = h.open(f, libc::O_WRONLY | libc::O_TRUNC).await;
    h.write(fh, 0, b"changed").await;
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.size(h.lookup(d, "h").await, None).await, 7);
    assert_eq!(std::fs::read(h.disk("d/h")).unwrap(), b"changed");
    // The first name goes: the inode is reached through the other (its server path too).
    h.fs.unlink(ROOT, os("f")).await.unwrap();
    h.fs.fsyncdir(ROOT).await.unwrap();
    assert!(!h.disk("f").exists());
    let a = h.fs.getattr(f, None).await.unwrap().0;
    assert_eq!((a.size, a.nlink), (7, 1), "after unlinking the other name");
    let fh = h.open(f, libc::O_RDONLY).await;
    assert_eq!(h.read(fh, 0, 100).await, b"changed");
    h.fs.release(fh).await.unwrap();
    let listed = list_plus(&h, d).await;
    assert_eq!(listed[0].1.attr.nlink, 1, "after a listing");
    assert_eq!(listed[0].1.attr.ino, f);
    assert_errno(h.fs.lookup(ROOT, os("f")).await, libc::ENOENT, "old name");
    // chmod through the inode shows under the remaining name.
    h.fs.setattr(
        f,
        None,
        SetattrRequest {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(h.meta("d/h").mode() & 0o777, 0o600);
    // The last name goes: detached, link count 0, forgotten with all its references.
    h.fs.unlink(d, os("h")).await.unwrap();
    assert_errno(h.fs.getattr(f, None).await, libc::ENOENT, "no name left");
    h.fs.forget(f, 7);
    assert_eq!(h.fs.inode_count(), 2, "root and d");
}

/// rename(2) of a name onto another link of the same file does nothing and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_onto_another_link_of_the_same_file_is_a_no_op() {
    let h = Harness::new();
    let (a, fh) = h.create(ROOT, "a").await;
    h.write(fh, 0, b"a").await;
    h.fs.release(fh).await.unwrap();
    h.fs.link(a, ROOT, os("b")).await.unwrap();
    h.fs.rename(ROOT, os("a"), ROOT, os("b"), 0).await.unwrap();
    assert!(h.disk("a").exists() && h.disk("b").exists());
    assert_eq!(h.lookup(ROOT, "a").await, a);
    assert_eq!(h.lookup(ROOT, "b").await, a);
    assert_eq!(h.fs.getattr(a, None).await.unwrap().0.nlink, 2);
    assert_errno(
        h.fs.rename(ROOT, os("a"), ROOT, os("b"), libc::RENAME_NOREPLACE)
            .await,
        libc::EEXIST,
        "NOREPLACE onto a link of the same file",
    );
    // Renaming one of the names elsewhere keeps both names of the inode.
    h.fs.rename(ROOT, os("b"), ROOT, os("c"), 0).await.unwrap();
    assert_eq!(h.lookup(ROOT, "c").await, a);
    assert_eq!(h.lookup(ROOT, "a").await, a);
    assert_eq!(std::fs::read(h.disk("c")).unwrap(), b"a");
}

/// A read of a name of a file linked on the server, answered while the file changed through
/// another name, may hold the old data, cached by the kernel after it dropped its pages:
/// they are dropped once more after the answer. A read with no such change in between, or
/// of a file without other links, is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_answered_across_a_change_through_another_name_is_dropped_again() {
    let h = Harness::new();
    let told = kernel_drops_recorded(&h, Duration::ZERO);
    std::fs::write(h.disk("x"), b"data").unwrap();
    std::fs::hard_link(h.disk("x"), h.disk("y")).unwrap();
    std::fs::write(h.disk("z"), b"z").unwrap();
    list_plus(&h, ROOT).await;
    let (x, y, z) = (
        h.lookup(ROOT, "x").await,
        h.lookup(ROOT, "y").await,
        h.lookup(ROOT, "z").await,
    );
    h.fs.read_answered(h.fs.read_starting(y));
    h.fs.kernel_caches().settled().await;
    assert!(told().is_empty(), "no change, yet y was dropped");

    // Started before the change through x, which comes while they are on their way.
    let (wy, wz) = (h.fs.read_starting(y), h.fs.read_starting(z));
    let fh = h.open(x, libc::O_WRONLY).await;
    h.write(fh, 0, b"DATA").await;
    h.fs.flush(fh).await.unwrap();
    h.fs.kernel_caches().settled().await;
    told();
    h.fs.read_answered(wy);
    h.fs.read_answered(wz);
    h.fs.kernel_caches().settled().await;
    assert_eq!(told(), vec![y], "y not dropped again (or z was)");
    h.fs.release(fh).await.unwrap();
}

/// A read through a descriptor open for long (nothing else of the file asked since the last
/// change through another name) leaves pages in the kernel all the same: the next change
/// through another name drops them. And a change while such a read is on its way drops
/// them itself (the kernel holds them until the read is answered), so a close does not
/// return before they are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_answered_is_dropped_by_the_next_change_through_another_name() {
    let h = Harness::new();
    let told = kernel_drops_recorded(&h, Duration::ZERO);
    std::fs::write(h.disk("x"), b"data").unwrap();
    std::fs::hard_link(h.disk("x"), h.disk("y")).unwrap();
    list_plus(&h, ROOT).await;
    let (x, y) = (h.lookup(ROOT, "x").await, h.lookup(ROOT, "y").await);
    let change_through_x = || async {
        let fh = h.open(x, libc::O_WRONLY).await;
        h.write(fh, 0, b"DATA").await;
        h.fs.flush(fh).await.unwrap();
        h.fs.release(fh).await.unwrap();
        h.fs.kernel_caches().settled().await;
    };
    change_through_x().await;
    assert!(told().contains(&y), "y's lookup not followed by a drop");
    change_through_x().await;
    assert!(
        !told().contains(&y),
        "nothing of y cached, yet it was dropped"
    );
    // The kernel read y's pages through a descriptor it opened before.
    h.fs.read_answered(h.fs.read_starting(y));
    change_through_x().await;
    assert!(
        told().contains(&y),
        "y's pages read, then kept across a change"
    );

    // y noted by nothing now; a read of it on its way across the change.
    let w = h.fs.read_starting(y);
    change_through_x().await;
    assert!(
        told().contains(&y),
        "a read of y on its way, not dropped by the change"
    );
    h.fs.read_answered(w);
    h.fs.kernel_caches().settled().await;
    assert_eq!(
        told(),
        vec![y],
        "answered across a change, not dropped again"
    );
    change_through_x().await;
    assert!(told().contains(&y), "not noted once answered");
    change_through_x().await;
    assert!(!told().contains(&y), "the read still counted as on its way");
}

/// Links made on the server: each name is an inode of its own here (SFTP v3 cannot tell
/// them apart), cached as usual; a change through one name drops what the mount and the
/// kernel cache of the others, before the change is reported done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_made_links_are_cached_until_a_change_through_another_name() {
    let h = Harness::new();
    // A kernel slow to drop its caches: a close must wait for it all the same.
    let told = kernel_drops_recorded(&h, Duration::from_millis(20));
    std::fs::write(h.disk("x"), b"data").unwrap();
    std::fs::hard_link(h.disk("x"), h.disk("y")).unwrap();
    std::fs::write(h.disk("z"), b"z").unwrap();
    std::fs::create_dir(h.disk("d")).unwrap();
    std::fs::hard_link(h.disk("x"), h.disk("d/w")).unwrap();
    let listed: Vec<_> = list_plus(&h, ROOT)
        .await
        .into_iter()
        .filter(|(n, _)| n == "x" || n == "y")
        .collect();
    assert_eq!(listed.len(), 2);
    for (name, e) in &listed {
        assert_eq!(e.attr.nlink, 3, "{name:?}");
        assert!(!e.attr_ttl.is_zero(), "{name:?}: attributes not cached");
    }
    let d = h.lookup(ROOT, "d").await;
    list_plus(&h, d).await;
    // d/w stays in the cached listing, without an inode (the kernel forgot it).
    let w = h.lookup(d, "w").await;
    h.fs.forget(w, 2);
    let x = h.lookup(ROOT, "x").await;
    let y = h.lookup(ROOT, "y").await;
    assert_ne!(x, y, "the mount cannot know these are one file");
    assert_eq!(h.size(y, None).await, 4);
    let fh = h.open(x, libc::O_WRONLY | libc::O_TRUNC).await;
    h.write(fh, 0, b"changed").await;
    h.fs.flush(fh).await.unwrap();
    assert_eq!(
        told(),
        vec![y],
        "the kernel told to drop y, once its close returns"
    );
    h.fs.release(fh).await.unwrap();
    let (a, ttl) = h.fs.getattr(y, None).await.unwrap();
    assert_eq!(a.size, 7, "change through x seen through y");
    assert!(!ttl.is_zero());
    let w = h.fs.lookup(d, OsStr::new("w")).await.unwrap();
    assert_eq!(
        w.attr.size, 7,
        "a listing taken before the change is not trusted"
    );
    // An attribute change is a change too; y is dropped again (it was cached again).
    let set = SetattrRequest {
        mode: Some(0o600),
        ..Default::default()
    };
    h.fs.setattr(x, None, set).await.unwrap();
    let mut dropped = told();
    dropped.sort_unstable();
    assert_eq!(dropped, vec![y, w.attr.ino]);
    assert_eq!(h.fs.getattr(y, None).await.unwrap().0.perm, 0o600);
    // A file with one link, listed or made here, changes nothing else.
    let z = h.lookup(ROOT, "z").await;
    h.size(y, None).await;
    let fh = h.open(z, libc::O_WRONLY).await;
    h.write(fh, 0, b"Z").await;
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    let (_, fh) = h.create(ROOT, "new").await;
    h.write(fh, 0, b"new").await;
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    assert_eq!(
        told(),
        Vec::<Ino>::new(),
        "dropped for a file with one link"
    );
    assert_eq!(h.fs.getattr(z, None).await.unwrap().0.nlink, 1);
}

/// Links made on the server, and the ways an old view of the other name could outlive a
/// change: a stat of it answered while the write was on its way (the close drops it again),
/// a directory handle opened before (its readdirplus asks the server). A read-only close
/// does not wait for the kernel's notifications.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_made_links_stale_views_do_not_outlive_the_close() {
    let h = Harness::new();
    let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
    let gate = std::sync::Mutex::new(gate_rx);
    let gated = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let g = gated.clone();
    h.fs.kernel_caches().connect(Box::new(move |_| {
        if g.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = gate.lock().unwrap().recv();
        }
    }));
    std::fs::write(h.disk("x"), b"data").unwrap();
    std::fs::hard_link(h.disk("x"), h.disk("y")).unwrap();
    std::fs::write(h.disk("z"), b"z").unwrap();
    list_plus(&h, ROOT).await;
    let x = h.lookup(ROOT, "x").await;
    let y = h.lookup(ROOT, "y").await;
    let dh = h.fs.opendir(ROOT).await.unwrap();
    let items = h.fs.readdir(dh, 0).await.unwrap();
    let fh = h.open(x, libc::O_WRONLY).await;
    // Sent (the mount goes on at once), on the server 2 s later, as over a slow link.
    h.plan
        .set_queue_delay(ROp::Write, Some(Duration::from_secs(2)));
    h.write(fh, 0, b"longer data").await;
    while h.plan.calls(ROp::Write) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Asked after the write was sent, before it landed. (Whatever this shows, 4 normally,
    // it must not stay.)
    h.size(y, None).await;
    h.fs.flush(fh).await.unwrap();
    h.plan.set_queue_delay(ROp::Write, None);
    // Closed (the release comes later).
    let item = items.iter().find(|i| i.name == "y").unwrap();
    let e = h.fs.readdirplus_entry(ROOT, item).await.unwrap();
    assert_eq!(
        e.attr.size, 11,
        "readdirplus of a handle opened before the change"
    );
    h.fs.releasedir(dh);
    assert_eq!(
        h.size(y, None).await,
        11,
        "the stat from before the write landed stayed"
    );
    h.fs.release(fh).await.unwrap();
    // The kernel slow to drop y: a close of another file read only does not wait for it.
    let z = h.lookup(ROOT, "z").await;
    let zfh = h.open(z, libc::O_RDONLY).await;
    h.size(y, None).await;
    gated.store(true, std::sync::atomic::Ordering::SeqCst);
    let fh = h.open(x, libc::O_WRONLY).await;
    h.write(fh, 0, b"DATA").await;
    let closed = tokio::time::timeout(Duration::from_secs(30), h.fs.flush(zfh)).await;
    assert!(closed.is_ok(), "a read-only close waited for the kernel");
    gated.store(false, std::sync::atomic::Ordering::SeqCst);
    let _ = gate_tx.send(());
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    h.fs.release(zfh).await.unwrap();
}

/// An open with O_TRUNC that fails after the server truncated (the attributes' answer lost):
/// the error is reported, and the size the mount knew is not shown any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_with_o_trunc_failing_after_the_truncate_forgets_the_size() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"ten bytes!").unwrap();
    let f = h.lookup(ROOT, "f").await;
    assert_eq!(h.size(f, None).await, 10);
    h.plan.fail_next(
        ROp::Fstat,
        1,
        RemoteError::Status(Status::Failure, "lost".into()),
    );
    let open = h.fs.open(f, as_root(libc::O_WRONLY | libc::O_TRUNC)).await;
    assert!(open.is_err(), "the open succeeded");
    assert_eq!(h.meta("f").len(), 0, "the server did not truncate");
    assert_eq!(h.size(f, None).await, 0, "the old size still shown");
}

/// A link made, whose LSTAT's answer went with the connection: link(2) asks again and
/// succeeds (the link is there), instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_made_with_its_stat_lost_to_the_connection_succeeds() {
    let h = Harness::new();
    std::fs::write(h.disk("a"), b"data").unwrap();
    let a = h.lookup(ROOT, "a").await;
    h.plan
        .fail_next(ROp::Lstat, 1, RemoteError::Disconnected("lost".into()));
    let e = h.fs.link(a, ROOT, os("b")).await.unwrap();
    assert_eq!((e.attr.ino, e.attr.size), (a, 4));
    assert_eq!(std::fs::metadata(h.disk("b")).unwrap().nlink(), 2);
}

/// With `follow_symlinks` a symlink is shown as the file it points to; a hard link to it
/// links the symlink itself on the server (link(2) does not follow), and the new name is
/// shown as the inode is, a file, never as a symlink (the kernel would mark the inode bad).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_of_a_followed_symlink_shows_the_file() {
    let h = Harness::following_symlinks();
    std::fs::write(h.disk("t"), b"12345").unwrap();
    std::os::unix::fs::symlink("t", h.disk("l")).unwrap();
    let l = h.lookup(ROOT, "l").await;
    let e = h.fs.link(l, ROOT, os("l2")).await.unwrap();
    assert_eq!(
        (e.attr.ino, e.attr.kind, e.attr.size),
        (l, FileKind::File, 5)
    );
    let dh = h.fs.opendir(ROOT).await.unwrap();
    let items = h.fs.readdir(dh, 0).await.unwrap();
    let item = items.iter().find(|i| i.name == "l2").expect("l2 listed");
    let e = h.fs.readdirplus_entry(ROOT, item).await.unwrap();
    assert_eq!((e.attr.kind, e.attr.size), (FileKind::File, 5), "listed");
    h.fs.releasedir(dh);
}

/// With `follow_symlinks` a link is shown as the file it points to, but a rename or a hard
/// link of it moves or links the link itself on the server: under `contain`, not to where
/// its target leads out of the workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_symlink_is_not_moved_or_linked_to_where_it_escapes() {
    let h = Harness::following_contained_symlinks();
    std::fs::create_dir_all(h.disk("a/b")).unwrap();
    std::fs::create_dir_all(h.disk("a/c")).unwrap();
    std::fs::write(h.disk("a/t"), b"12345").unwrap();
    std::os::unix::fs::symlink("../t", h.disk("a/b/l")).unwrap();
    let a = h.lookup(ROOT, "a").await;
    let b = h.lookup(a, "b").await;
    let c = h.lookup(a, "c").await;
    let l = h.fs.lookup(b, os("l")).await.unwrap().attr;
    assert_eq!((l.kind, l.size), (FileKind::File, 5), "followed");
    assert_errno(
        h.fs.rename(b, os("l"), ROOT, os("l"), 0).await,
        libc::EPERM,
        "rename to the top",
    );
    assert_errno(
        h.fs.link(l.ino, ROOT, os("l2")).await,
        libc::EPERM,
        "link at the top",
    );
    assert!(h.disk("a/b/l").is_symlink() && !h.disk("l").exists() && !h.disk("l2").exists());
    // Where it still leads inside: as before.
    h.fs.rename(b, os("l"), c, os("l"), 0).await.unwrap();
    assert_eq!(std::fs::read(h.disk("a/c/l")).unwrap(), b"12345");
}

/// With `follow_symlinks` a directory reached through a followed link (`d1/d2/s -> ../..`,
/// the workspace's root on the server) is somewhere else on the server than its path says:
/// a symlink made in it is checked where the server makes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_made_through_a_followed_directory_link_is_checked_where_it_lands() {
    let h = Harness::following_contained_symlinks();
    std::fs::create_dir_all(h.disk("d1/d2")).unwrap();
    std::os::unix::fs::symlink("../..", h.disk("d1/d2/s")).unwrap();
    let d1 = h.lookup(ROOT, "d1").await;
    let d2 = h.lookup(d1, "d2").await;
    let s = h.fs.lookup(d2, os("s")).await.unwrap().attr;
    assert_eq!(s.kind, FileKind::Dir, "followed");
    for escaping in ["../x", "../../../x"] {
        assert_errno(
            h.fs.symlink(s.ino, os("l"), Path::new(escaping), Caller::ROOT)
                .await,
            libc::EPERM,
            escaping,
        );
        assert!(!h.disk("l").is_symlink(), "{escaping} made");
    }
    h.fs.symlink(s.ino, os("l"), Path::new("d1"), Caller::ROOT)
        .await
        .unwrap();
    assert_eq!(std::fs::read_link(h.disk("l")).unwrap(), Path::new("d1"));
}

/// A server that opens without truncating when TRUNC comes without CREAT (SFTP v3 allows
/// it; OpenSSH truncates either way): the open truncates the file itself, and the old
/// content's tail never shows under the new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_with_o_trunc_truncates_on_a_server_that_wants_creat_with_it() {
    let h = Harness::new();
    h.plan.set_trunc_only_with_creat(true);
    std::fs::write(h.disk("f"), b"old and long").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let fh = h.open(f, libc::O_WRONLY | libc::O_TRUNC).await;
    assert_eq!(h.meta("f").len(), 0);
    assert_eq!(h.size(f, None).await, 0);
    h.write(fh, 0, b"new").await;
    h.fs.release(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"new");
}

/// Quota: a file rewritten in place (`open(O_TRUNC)`) gives back what it held, also when the
/// quota does not track its size: rewriting it with as much costs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_an_open_with_o_trunc_gives_back_what_the_file_held() {
    let h = Harness::new();
    let quota = &h.fs.enforcer().quota;
    quota.set_limits(Some(60_000), Some(10));
    std::fs::write(h.disk("f"), vec![1u8; 50_000]).unwrap();
    let f = h.lookup(ROOT, "f").await;
    // Not tracked (a lookup tracks what it finds; the quota may have dropped it since).
    quota.forget(f);
    for round in 0..3 {
        let fh = h.open(f, libc::O_WRONLY | libc::O_TRUNC).await;
        assert_eq!(
            quota.usage().bytes,
            -50_000,
            "round {round}: not given back"
        );
        h.write(fh, 0, &[2u8; 50_000]).await;
        h.fs.release(fh).await.unwrap();
        assert_eq!(quota.usage().bytes, 0, "round {round}");
    }
}

/// Quota: a file removed while open (`tmpfile()` under the mount: create, unlink, write)
/// lives on on the server until its last descriptor goes. What it held was given back with
/// its name; what it grows by after is charged, and given back when the mount forgets it,
/// whether the kernel's FORGET comes before the RELEASE or after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_a_file_removed_while_open_is_charged_its_growth_until_forgotten() {
    let h = Harness::new();
    let quota = &h.fs.enforcer().quota;
    quota.set_limits(Some(1_000), Some(10));
    for round in 0..4 {
        let (ino, fh) = h.create(ROOT, "tmp").await;
        h.write(fh, 0, &[1u8; 300]).await;
        h.fs.unlink(ROOT, os("tmp")).await.unwrap();
        assert_eq!(quota.usage().bytes, 0, "round {round}: given back");
        // 300 bytes rewritten (free) and 300 more (charged).
        h.write(fh, 0, &[2u8; 600]).await;
        assert_eq!(quota.usage().bytes, 300, "round {round}: the growth");
        h.fs.setattr(
            ino,
            Some(fh),
            SetattrRequest {
                size: Some(100),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(
            quota.usage().bytes,
            0,
            "round {round}: shrunk below what it held"
        );
        h.write(fh, 100, &[3u8; 50]).await;
        assert_eq!(quota.usage().bytes, 50, "round {round}: grown again");
        if round % 2 == 0 {
            h.fs.release(fh).await.unwrap();
            h.fs.forget(ino, 1);
        } else {
            h.fs.forget(ino, 1);
            assert_eq!(quota.usage().bytes, 50, "round {round}: still open");
            h.fs.release(fh).await.unwrap();
        }
        assert_eq!(
            (quota.usage().bytes, quota.usage().files),
            (0, 0),
            "round {round}: all given back"
        );
    }
}

/// Quota with `follow_symlinks`: a link is shown (and its size tracked) as the file it
/// points to, but removing the link frees none of that file: nothing is given back. (It
/// was: a link made, forgotten, looked up again and removed gave its target's size back
/// each time, a budget without end.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_removing_a_followed_link_gives_back_nothing() {
    let h = Harness::following_symlinks();
    let quota = &h.fs.enforcer().quota;
    quota.set_limits(Some(1_000_000), Some(100));
    std::fs::write(h.disk("big"), vec![7u8; 50_000]).unwrap();
    for round in 0..3 {
        std::os::unix::fs::symlink("big", h.disk(format!("l{round}"))).unwrap();
    }
    for round in 0..3 {
        let name = format!("l{round}");
        let l = h.lookup(ROOT, &name).await;
        assert_eq!(h.size(l, None).await, 50_000, "shown as its target");
        h.fs.unlink(ROOT, os(&name)).await.unwrap();
        assert!(h.disk("big").exists());
        assert_eq!(quota.usage().bytes, 0, "round {round}: nothing was freed");
        h.fs.forget(l, 1);
    }
}

/// Quota: a create that finds the file already there (put on the server after the kernel's
/// lookup) made no entry, and charges none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_a_create_of_a_file_already_there_charges_no_entry() {
    let h = Harness::new();
    let quota = &h.fs.enforcer().quota;
    quota.set_limits(Some(10_000), Some(10));
    assert!(h.fs.lookup(ROOT, os("late")).await.is_err());
    std::fs::write(h.disk("late"), b"x").unwrap();
    let (_, fh) = h.create(ROOT, "late").await;
    h.fs.release(fh).await.unwrap();
    assert_eq!(quota.usage().files, 0);
    let (_, fh) = h.create(ROOT, "new").await;
    h.fs.release(fh).await.unwrap();
    assert_eq!(quota.usage().files, 1);
}

/// Quota: a link is charged as a copy; removing one name of a linked file gives one copy
/// back and keeps tracking the file, which still grows at the price of its copies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_hard_links_charged_as_copies_and_given_back_per_name() {
    let h = Harness::new();
    let quota = &h.fs.enforcer().quota;
    quota.set_limits(Some(10_000), None);
    let (f, fh) = h.create(ROOT, "f").await;
    h.write(fh, 0, &[1u8; 1000]).await;
    h.fs.release(fh).await.unwrap();
    assert_eq!(quota.usage().bytes, 1000);
    h.fs.link(f, ROOT, os("g")).await.unwrap();
    assert_eq!(quota.usage().bytes, 2000);
    assert_eq!(quota.usage().files, 2);
    h.fs.unlink(ROOT, os("f")).await.unwrap();
    assert_eq!(quota.usage().bytes, 1000, "one copy given back");
    assert_eq!(quota.usage().files, 1);
    // The data lives on under g, and is still known: appending costs only the growth.
    let fh = h.open(f, libc::O_WRONLY).await;
    h.write(fh, 1000, &[2u8; 500]).await;
    h.fs.release(fh).await.unwrap();
    assert_eq!(quota.usage().bytes, 1500);
    // Growing while two names are charged costs twice; the last name gives all back.
    h.fs.link(f, ROOT, os("k")).await.unwrap();
    assert_eq!(quota.usage().bytes, 3000);
    let fh = h.open(f, libc::O_WRONLY).await;
    h.write(fh, 1500, &[3u8; 100]).await;
    h.fs.release(fh).await.unwrap();
    assert_eq!(quota.usage().bytes, 3200);
    h.fs.unlink(ROOT, os("g")).await.unwrap();
    assert_eq!(quota.usage().bytes, 1600);
    h.fs.unlink(ROOT, os("k")).await.unwrap();
    assert_eq!((quota.usage().bytes, quota.usage().files), (0, 0));
}

// ------------------------------------------------------------------------------ POSIX details

/// mkdir in a setgid directory: the new directory inherits S_ISGID (and the group) from the
/// server's mkdir(2), as on a local disk; fixing up the permission bits must not clear it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_mkdir_in_a_setgid_directory_keeps_setgid() {
    let h = Harness::new();
    std::fs::create_dir(h.disk("sg")).unwrap();
    std::fs::set_permissions(h.disk("sg"), std::fs::Permissions::from_mode(0o2775)).unwrap();
    let sg = h.lookup(ROOT, "sg").await;
    let e =
        h.fs.mkdir(sg, os("s"), libc::S_IFDIR | 0o755, UMASK, Caller::ROOT)
            .await
            .unwrap();
    assert_eq!(e.attr.perm, 0o2755, "mkdir reply");
    assert_eq!(h.meta("sg/s").mode() & 0o7777, 0o2755, "on the server");
    // Permission bits the server's umask took away are still put back, setgid kept.
    let e =
        h.fs.mkdir(sg, os("wide"), libc::S_IFDIR | 0o777, 0, Caller::ROOT)
            .await
            .unwrap();
    assert_eq!(e.attr.perm, 0o2777, "mkdir 0777, umask 0");
    assert_eq!(h.meta("sg/wide").mode() & 0o7777, 0o2777);
    // A plain directory gets no setgid.
    let e =
        h.fs.mkdir(
            ROOT,
            os("plain"),
            libc::S_IFDIR | 0o755,
            UMASK,
            Caller::ROOT,
        )
        .await
        .unwrap();
    assert_eq!(e.attr.perm, 0o755);
}

/// A directory's link count is 2 plus its subdirectories, as on a local disk, and follows
/// Files written through the mount leave their listing entries' attributes unknown. The
/// first walk of the directory (`du`, `ls -l`) fetches them all at once, not one round trip
/// per file, and keeps them in the listing: the next walk asks the server nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_attributes_a_write_left_unknown_are_fetched_at_once_and_kept() {
    let h = Harness::new();
    let d = h.mkdir(ROOT, "d").await;
    assert!(list_plus(&h, d).await.is_empty());
    for (i, name) in ["a", "b", "c", "e"].iter().enumerate() {
        let (_, fh) = h.create(d, name).await;
        h.write(fh, 0, &vec![b'x'; 100 * (i + 1)]).await;
        h.fs.release(fh).await.unwrap();
    }
    let sizes = |l: &[(OsString, super::Entry)]| {
        let mut v: Vec<_> = l.iter().map(|(n, e)| (n.clone(), e.attr.size)).collect();
        v.sort();
        v
    };
    let want: Vec<(OsString, u64)> = [("a", 100), ("b", 200), ("c", 300), ("e", 400)]
        .iter()
        .map(|(n, s)| (OsString::from(n), *s))
        .collect();

    // All four asked for before any answer comes: held, they must all reach the hold.
    h.plan.hold(ROp::Lstat);
    let before = h.plan.calls(ROp::Lstat);
    let walk = {
        let fs = h.fs.clone();
        let items = {
            let dh = fs.opendir(d).await.unwrap();
            let items = fs.readdir(dh, 0).await.unwrap();
            fs.releasedir(dh);
            items
        };
        tokio::spawn(async move { fs.fill_unknown_attrs(d, &items).await })
    };
    h.plan.until_held(ROp::Lstat, 4).await;
    h.plan.release(ROp::Lstat);
    walk.await.unwrap();
    assert_eq!(h.plan.calls(ROp::Lstat) - before, 4);
    assert_eq!(sizes(&list_plus(&h, d).await), want);
    assert_eq!(
        h.plan.calls(ROp::Lstat) - before,
        4,
        "the entries' lookups asked again for what the fill fetched"
    );
    // The next walk is answered from the listing.
    assert_eq!(sizes(&list_plus(&h, d).await), want);
    assert_eq!(
        h.plan.calls(ROp::Lstat) - before,
        4,
        "a second walk asked the server again"
    );
    // A later write makes its entry unknown again, and its new size is fetched.
    let a = h.lookup(d, "a").await;
    let fh = h.open(a, libc::O_WRONLY).await;
    h.write(fh, 100, b"more").await;
    h.fs.release(fh).await.unwrap();
    let listed = sizes(&list_plus(&h, d).await);
    assert_eq!(listed[0], (OsString::from("a"), 104));
}

/// A directory the cached listing shows empty, which the server refuses to remove as not
/// empty (a file was put there on the server): the listing is dropped, so that `ls` after the
/// failed `rm -rf` shows what is in the way, as does a lookup of it; and the kernel, which
/// kept the name as absent, is told to drop that. The same when a directory renamed over it
/// is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_a_directory_refused_as_not_empty_is_listed_afresh() {
    let h = Harness::new();
    let kernel_told = kernel_names_recorded(&h);
    for (target, how) in [("d", "rmdir"), ("t", "rename over it")] {
        let dir = h.mkdir(ROOT, target).await;
        assert!(list_plus(&h, dir).await.is_empty());
        std::fs::write(h.disk(format!("{target}/made-on-server")), b"x").unwrap();
        assert!(
            h.fs.lookup(dir, OsStr::new("made-on-server"))
                .await
                .is_err(),
            "the cached listing is what answers (the premise of this test)"
        );
        // What the FUSE adapter asks after every absent answer (it also keeps the answer the
        // listing gave as a negative entry, which the refusal below reports).
        assert!(
            !h.fs
                .absence_ttl(dir, OsStr::new("made-on-server"))
                .is_zero(),
            "the kernel would keep the answer (the premise of this test)"
        );
        let refused = match how {
            "rmdir" => h.fs.rmdir(ROOT, OsStr::new(target)).await,
            _ => {
                h.mkdir(ROOT, "src").await;
                h.fs.rename(ROOT, OsStr::new("src"), ROOT, OsStr::new(target), 0)
                    .await
            }
        };
        assert_eq!(refused.map_err(|e| e.errno), Err(libc::ENOTEMPTY), "{how}");
        eventually(
            &format!("the kernel told to drop the name after the refused {how}"),
            || kernel_told(dir, "made-on-server"),
        )
        .await;
        assert!(h
            .fs
            .absence_ttl(dir, OsStr::new("made-on-server"))
            .is_zero());
        let names: Vec<_> = list_plus(&h, dir)
            .await
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, ["made-on-server"], "listed after the refused {how}");
        h.fs.lookup(dir, OsStr::new("made-on-server"))
            .await
            .unwrap_or_else(|e| panic!("lookup after the refused {how}: {e}"));
    }
}

/// A listing the mount takes that shows a name it had answered as absent (the name was made
/// on the server since): the kernel, which may keep that answer, is told to drop it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_a_listing_showing_a_name_known_absent_tells_the_kernel() {
    let h = Harness::new();
    let kernel_told = kernel_names_recorded(&h);
    let d = h.mkdir(ROOT, "d").await;
    assert!(h.fs.lookup(d, os("made")).await.is_err());
    // What the FUSE adapter asks after every absent answer.
    assert!(!h.fs.absence_ttl(d, os("made")).is_zero());
    std::fs::write(h.disk("d/made"), b"x").unwrap();
    // The listing runs out (the negative entry with it) and is taken again.
    h.fs.expire_cache();
    let names: Vec<_> = list_plus(&h, d).await.into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["made"]);
    eventually(
        "the kernel told that a name it may keep as absent is listed",
        || kernel_told(d, "made"),
    )
    .await;
}

/// mkdir, rmdir and renames of directories through the mount (SFTP's attributes carry no link
/// count: the mount keeps it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_directory_link_counts_follow_subdirectories() {
    let h = Harness::new();
    let nlink = |ino| {
        let h = &h;
        async move { h.fs.getattr(ino, None).await.unwrap().0.nlink }
    };
    let a = h.mkdir(ROOT, "a").await;
    let c = h.mkdir(ROOT, "c").await;
    assert_eq!(nlink(a).await, 2, "empty directory");
    let b = h.mkdir(a, "b").await;
    let (_, fh) =
        h.fs.create(a, os("file"), FILE_MODE, UMASK, OpenRequest::default())
            .await
            .unwrap();
    h.fs.release(fh).await.unwrap();
    assert_eq!(
        (nlink(a).await, nlink(b).await),
        (3, 2),
        "a subdirectory, a file"
    );
    h.fs.rename(a, os("b"), c, os("b"), 0).await.unwrap();
    assert_eq!(
        (nlink(a).await, nlink(c).await),
        (2, 3),
        "moved to another directory"
    );
    h.fs.rename(c, os("b"), c, os("b2"), 0).await.unwrap();
    assert_eq!(nlink(c).await, 3, "renamed in place");
    h.mkdir(c, "x").await;
    h.fs.rename(c, os("b2"), c, os("x"), 0).await.unwrap();
    assert_eq!(nlink(c).await, 3, "replaced an empty directory");
    h.fs.rmdir(c, os("x")).await.unwrap();
    assert_eq!(nlink(c).await, 2, "rmdir");
}

/// On a mount local users share (`allow_other`) whose server account is root, what a user
/// makes is theirs, as on a local disk: owner the caller, group the caller's or, in a setgid
/// directory, the directory's; a set-id bit asked for survives the chown that gives it away.
/// Without `allow_other`, or for root itself, nothing is given away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_new_files_belong_to_their_maker_on_a_shared_mount() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: giving files away needs root (the server account must be root)");
        return;
    }
    let h = Harness::with(
        FsConfig {
            owners_from_callers: true,
            ..config(long_ttls())
        },
        None,
    );
    let user = Caller {
        uid: 65534,
        gid: 65533,
    };
    let owner = |rel: &str| {
        let m = h.meta(rel);
        (m.uid(), m.gid())
    };
    let req = OpenRequest {
        flags: libc::O_RDWR | libc::O_CREAT,
        pid: 0,
        caller: user,
    };
    // Held once the server has made it (the open is done, its fstat waits): not a set-id
    // file of root's, even for that moment.
    h.plan.hold(ROp::Fstat);
    let fs = h.fs.clone();
    let made = tokio::spawn(async move {
        fs.create(ROOT, os("f"), libc::S_IFREG | 0o4755, 0, req)
            .await
    });
    h.plan.until_held(ROp::Fstat, 1).await;
    let m = h.meta("f");
    assert_eq!(
        (m.uid(), m.mode() & 0o6000),
        (0, 0),
        "made without set-id bits"
    );
    h.plan.release(ROp::Fstat);
    let (e, fh) = made.await.unwrap().unwrap();
    h.fs.release(fh).await.unwrap();
    assert_eq!((e.attr.uid, e.attr.gid), (65534, 65533), "create reply");
    assert_eq!(owner("f"), (65534, 65533), "created file on the server");
    assert_eq!(h.meta("f").mode() & 0o7777, 0o4755, "setuid kept");
    let e =
        h.fs.mkdir(ROOT, os("d"), DIR_MODE, UMASK, user)
            .await
            .unwrap();
    assert_eq!((e.attr.uid, e.attr.gid), (65534, 65533), "mkdir reply");
    assert_eq!(owner("d"), (65534, 65533), "new directory");
    h.fs.symlink(ROOT, os("l"), Path::new("f"), user)
        .await
        .unwrap();
    assert_eq!(owner("l"), (65534, 65533), "the symlink itself");
    assert_eq!(owner("f"), (65534, 65533), "not what it points to");
    h.fs.mknod(ROOT, os("n"), libc::S_IFREG | 0o644, 0, UMASK, user)
        .await
        .unwrap();
    assert_eq!(owner("n"), (65534, 65533), "mknod");

    // In a setgid directory the group is the directory's.
    std::fs::create_dir(h.disk("sg")).unwrap();
    std::os::unix::fs::chown(h.disk("sg"), Some(0), Some(777)).unwrap();
    std::fs::set_permissions(h.disk("sg"), std::fs::Permissions::from_mode(0o2777)).unwrap();
    let sg = h.lookup(ROOT, "sg").await;
    let e =
        h.fs.mkdir(sg, os("s"), DIR_MODE, UMASK, user)
            .await
            .unwrap();
    assert_eq!((e.attr.uid, e.attr.gid), (65534, 777));
    assert_eq!(owner("sg/s"), (65534, 777));
    assert_eq!(h.meta("sg/s").mode() & 0o7777, 0o2755, "setgid inherited");

    // A file put there on the server after the kernel's lookup found the name missing is
    // opened as asked (O_CREAT without O_EXCL), not taken over: neither given away nor
    // chmodded to the mode the create asked for.
    assert!(h.fs.lookup(ROOT, os("late")).await.is_err());
    std::fs::write(h.disk("late"), b"theirs").unwrap();
    std::fs::set_permissions(h.disk("late"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let req = OpenRequest {
        flags: libc::O_RDWR | libc::O_CREAT,
        pid: 0,
        caller: user,
    };
    let (_, fh) =
        h.fs.create(ROOT, os("late"), FILE_MODE, UMASK, req)
            .await
            .unwrap();
    h.fs.release(fh).await.unwrap();
    assert_eq!(owner("late"), (0, 0), "an existing file keeps its owner");
    assert_eq!(h.meta("late").mode() & 0o7777, 0o600, "and its mode");
    assert_eq!(std::fs::read(h.disk("late")).unwrap(), b"theirs");

    // Root's files stay root's.
    h.fs.mkdir(ROOT, os("r"), DIR_MODE, UMASK, Caller::ROOT)
        .await
        .unwrap();
    assert_eq!(owner("r"), (0, 0));

    // Without allow_other, the mount's user is the only one: nothing is given away.
    let h = Harness::new();
    h.fs.mkdir(ROOT, os("d"), DIR_MODE, UMASK, user)
        .await
        .unwrap();
    let m = h.meta("d");
    assert_eq!((m.uid(), m.gid()), (0, 0), "single-user mount");
}

/// mknod(S_IFREG) makes a regular file (an exclusive create, as sshfs does), under the same
/// read-only and quota rules as create; device nodes are kept by the mount with their
/// numbers (SFTP cannot make them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_mknod_makes_files_on_the_server_and_keeps_device_nodes() {
    let h = Harness::new();
    let e =
        h.fs.mknod(ROOT, os("r"), libc::S_IFREG | 0o640, 0, UMASK, Caller::ROOT)
            .await
            .expect("mknod S_IFREG");
    assert_eq!(
        (e.attr.kind, e.attr.perm, e.attr.size),
        (FileKind::File, 0o640, 0)
    );
    let m = h.meta("r");
    assert!(m.is_file());
    assert_eq!((m.mode() & 0o7777, m.len()), (0o640, 0));
    assert_eq!(
        h.lookup(ROOT, "r").await,
        e.attr.ino,
        "the entry answered is the file"
    );
    assert_eq!(
        h.fs.open_file_count(),
        0,
        "the handle of the create was closed"
    );
    assert_eq!(h.open_handles().await, 0);
    assert_errno(
        h.fs.mknod(ROOT, os("r"), libc::S_IFREG | 0o640, 0, UMASK, Caller::ROOT)
            .await,
        libc::EEXIST,
        "mknod over an existing file",
    );
    // Device nodes are kept by the mount, with their numbers, as FIFOs are.
    let dev = |major: u32, minor: u32| libc::makedev(major, minor) as u32;
    for (what, mode, kind, rdev) in [
        ("chr", libc::S_IFCHR, FileKind::CharDevice, dev(1, 2)),
        ("blk", libc::S_IFBLK, FileKind::BlockDevice, dev(8, 17)),
    ] {
        let e =
            h.fs.mknod(ROOT, os(what), mode | 0o644, rdev, UMASK, Caller::ROOT)
                .await
                .expect(what);
        assert_eq!((e.attr.kind, e.attr.perm, e.attr.rdev), (kind, 0o644, rdev));
        let ino = h.lookup(ROOT, what).await;
        assert_eq!(ino, e.attr.ino, "{what}");
        let (a, _) = h.fs.getattr(ino, None).await.unwrap();
        assert_eq!((a.kind, a.rdev), (kind, rdev), "{what}");
        assert!(!h.disk(what).exists(), "{what} is not on the server");
        assert_errno(
            h.fs.mknod(ROOT, os(what), mode | 0o644, rdev, UMASK, Caller::ROOT)
                .await,
            libc::EEXIST,
            what,
        );
    }
    let kinds: Vec<_> = listed_kinds(&h, ROOT)
        .await
        .into_iter()
        .map(|(name, kind, _)| (name, kind))
        .filter(|(name, _)| name != "r")
        .collect();
    assert_eq!(
        kinds,
        [
            ("blk".to_string(), FileKind::BlockDevice),
            ("chr".to_string(), FileKind::CharDevice)
        ]
    );
    // The number stays through readdirplus, rename and link.
    let dh = h.fs.opendir(ROOT).await.unwrap();
    let items = h.fs.readdir(dh, 0).await.unwrap();
    h.fs.releasedir(dh);
    let item = items.iter().find(|i| i.name == "chr").unwrap();
    let plus = h.fs.readdirplus_entry(ROOT, item).await.unwrap();
    assert_eq!(plus.attr.rdev, dev(1, 2), "readdirplus");
    h.fs.rename(ROOT, os("chr"), ROOT, os("moved"), 0)
        .await
        .unwrap();
    let moved = h.lookup(ROOT, "moved").await;
    let (a, _) = h.fs.getattr(moved, None).await.unwrap();
    assert_eq!(
        (a.kind, a.rdev),
        (FileKind::CharDevice, dev(1, 2)),
        "renamed"
    );
    let linked = h.fs.link(moved, ROOT, os("linked")).await.unwrap();
    assert_eq!(
        (linked.attr.rdev, linked.attr.nlink),
        (dev(1, 2), 2),
        "linked"
    );
    for name in ["moved", "linked", "blk"] {
        h.fs.unlink(ROOT, os(name)).await.unwrap();
    }
    // An overlay's whiteout (0/0), which any user may make, would be lost at the unmount
    // (and the name it hides come back): refused, as before, so the overlay falls back to
    // whiteout files.
    assert_errno(
        h.fs.mknod(ROOT, os("wh"), libc::S_IFCHR, 0, UMASK, Caller::ROOT)
            .await,
        libc::EPERM,
        "whiteout",
    );

    // The entry quota applies as for create.
    let quota = &h.fs.enforcer().quota;
    quota.set_limits(None, Some(quota.usage().files as u64 + 1));
    h.fs.mknod(
        ROOT,
        os("last"),
        libc::S_IFREG | 0o644,
        0,
        UMASK,
        Caller::ROOT,
    )
    .await
    .expect("mknod within the quota");
    assert_errno(
        h.fs.mknod(
            ROOT,
            os("over"),
            libc::S_IFREG | 0o644,
            0,
            UMASK,
            Caller::ROOT,
        )
        .await,
        libc::ENOSPC,
        "mknod over the file quota",
    );
    assert!(!h.disk("over").exists());
    quota.set_limits(None, None);

    h.fs.set_read_only();
    for kind in [libc::S_IFREG, libc::S_IFIFO, libc::S_IFSOCK, libc::S_IFCHR] {
        assert_errno(
            h.fs.mknod(ROOT, os("ro"), kind | 0o644, 0, UMASK, Caller::ROOT)
                .await,
            libc::EROFS,
            "mknod on a read-only mount",
        );
    }
    assert!(!h.disk("ro").exists());
}

/// What readdir hands out for `dir`: (name, kind, inode as peeked), `.` and `..` left out,
/// and whether the offsets follow each other.
async fn listed_kinds(h: &Harness, dir: Ino) -> Vec<(String, FileKind, u64)> {
    let dh = h.fs.opendir(dir).await.unwrap();
    let items = h.fs.readdir(dh, 0).await.unwrap();
    h.fs.releasedir(dh);
    for (i, item) in items.iter().enumerate() {
        assert_eq!(item.next_offset, i as u64 + 1, "offsets of {items:?}");
    }
    let mut out: Vec<_> = items
        .iter()
        .filter(|i| i.attrs.is_some())
        .map(|i| {
            let name = i.name.to_string_lossy().into_owned();
            (name, i.kind, h.fs.peek_ino(dir, &i.name))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Set the mtime of `rel` on the disk behind the mount (the server's copy).
fn set_disk_mtime(h: &Harness, rel: &str, t: SystemTime) {
    std::fs::File::open(h.disk(rel))
        .unwrap()
        .set_times(std::fs::FileTimes::new().set_modified(t))
        .unwrap()
}

/// FIFOs and sockets are kept by the mount (SFTP cannot make them): mknod makes them with
/// the caller as owner and the umask applied, lookup, getattr, readdir and readdirplus show
/// them, chmod/chown/utimes change them (truncate is EINVAL), unlink removes them, and the
/// server never sees them. The name must be free on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifos_and_sockets_live_in_the_mount_only() {
    let h = Harness::new();
    let d = h.mkdir(ROOT, "d").await;
    let user = Caller {
        uid: 65534,
        gid: 65533,
    };
    let fifo =
        h.fs.mknod(d, os("p"), libc::S_IFIFO | 0o666, 0, UMASK, user)
            .await
            .expect("mkfifo");
    assert_eq!(
        (fifo.attr.kind, fifo.attr.perm, fifo.attr.nlink),
        (FileKind::Fifo, 0o644, 1)
    );
    assert_eq!(
        (fifo.attr.uid, fifo.attr.gid, fifo.attr.size),
        (65534, 65533, 0)
    );
    // The directory's mtime moves as on a local disk (the server sees no new name in it).
    let old = UNIX_EPOCH + Duration::from_secs(1_000_000);
    let set_mtime = |t| set_disk_mtime(&h, "d", t);
    set_mtime(old);
    let sock =
        h.fs.mknod(d, os("s"), libc::S_IFSOCK | 0o755, 0, UMASK, Caller::ROOT)
            .await
            .expect("bind");
    assert!(h.meta("d").modified().unwrap() > old, "mtime after mknod");
    assert_eq!(sock.attr.kind, FileKind::Socket);
    assert!(!h.disk("d/p").exists() && !h.disk("d/s").exists());
    assert_eq!(std::fs::read_dir(h.disk("d")).unwrap().count(), 0);

    assert_eq!(h.lookup(d, "p").await, fifo.attr.ino);
    let (a, _) = h.fs.getattr(sock.attr.ino, None).await.unwrap();
    assert_eq!((a.kind, a.perm), (FileKind::Socket, 0o755));
    h.fs.access(fifo.attr.ino, libc::R_OK | libc::W_OK, 65534, 65533)
        .await
        .expect("the owner may read and write");
    assert_errno(
        h.fs.access(fifo.attr.ino, libc::W_OK, 1, 1).await,
        libc::EACCES,
        "others may not write a 0644 FIFO",
    );

    // A file next to them; the listing shows all three, numbered in order.
    let (f, fh) = h.create(d, "f").await;
    h.fs.release(fh).await.unwrap();
    assert_eq!(
        listed_kinds(&h, d).await,
        vec![
            ("f".into(), FileKind::File, f),
            ("p".into(), FileKind::Fifo, fifo.attr.ino),
            ("s".into(), FileKind::Socket, sock.attr.ino),
        ]
    );
    let plus = list_plus(&h, d).await;
    let p = plus
        .iter()
        .find(|(n, _)| n == "p")
        .expect("p in readdirplus");
    assert_eq!(
        (p.1.attr.ino, p.1.attr.kind),
        (fifo.attr.ino, FileKind::Fifo)
    );

    // Names taken: by a special file, or by a file of the server.
    for (name, what) in [("p", "over a FIFO"), ("f", "over a server file")] {
        assert_errno(
            h.fs.mknod(d, os(name), libc::S_IFIFO | 0o644, 0, UMASK, Caller::ROOT)
                .await,
            libc::EEXIST,
            what,
        );
    }

    let t = UNIX_EPOCH + Duration::from_nanos(1_234_567_891);
    let req = SetattrRequest {
        mode: Some(0o600),
        uid: Some(7),
        gid: Some(8),
        size: None,
        atime: Some(TimeSpec::At(t)),
        mtime: Some(TimeSpec::At(t)),
    };
    let a = h.fs.setattr(fifo.attr.ino, None, req).await.unwrap();
    assert_eq!(
        (a.perm, a.uid, a.gid, a.mtime, a.atime),
        (0o600, 7, 8, t, t)
    );
    assert!(a.ctime > t);
    let truncate = SetattrRequest {
        size: Some(0),
        ..Default::default()
    };
    assert_errno(
        h.fs.setattr(fifo.attr.ino, None, truncate).await,
        libc::EINVAL,
        "truncate of a FIFO",
    );

    // rmdir: the server would remove the directory, which is not empty.
    h.fs.unlink(d, os("f")).await.unwrap();
    assert_errno(h.fs.rmdir(ROOT, os("d")).await, libc::ENOTEMPTY, "rmdir");
    assert_errno(
        h.fs.rmdir(d, os("p")).await,
        libc::ENOTDIR,
        "rmdir of a FIFO",
    );
    // Removed while a directory handle listing it is open: its later readdirplus batch
    // must not hand it out (nor make a server file of it).
    let dh = h.fs.opendir(d).await.unwrap();
    let items = h.fs.readdir(dh, 0).await.unwrap();
    h.fs.releasedir(dh);
    h.fs.unlink(d, os("p")).await.unwrap();
    let listed_p = items.iter().find(|i| i.name == "p").expect("p listed");
    assert_errno(
        h.fs.readdirplus_entry(d, listed_p).await,
        libc::ENOENT,
        "readdirplus of a FIFO removed since the listing",
    );
    set_mtime(old);
    h.fs.unlink(d, os("s")).await.unwrap();
    assert!(h.meta("d").modified().unwrap() > old, "mtime after unlink");
    assert_errno(h.fs.lookup(d, os("p")).await, libc::ENOENT, "after unlink");
    assert!(listed_kinds(&h, d).await.is_empty());
    h.fs.forget(fifo.attr.ino, 2);
    h.fs.forget(sock.attr.ino, 1);
    h.fs.rmdir(ROOT, os("d")).await.expect("rmdir once empty");
    assert!(!h.disk("d").exists());
}

/// rename(2) and link(2) with special files: a FIFO moves over a server file (which goes)
/// and a server file over a FIFO (which goes), names of one FIFO are one inode, a directory
/// takes its FIFOs along, and what rename refuses on a local disk it refuses here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_files_rename_and_link_as_on_a_local_disk() {
    let h = Harness::new();
    let d = h.mkdir(ROOT, "d").await;
    let fifo =
        h.fs.mknod(d, os("p"), libc::S_IFIFO | 0o644, 0, UMASK, Caller::ROOT)
            .await
            .unwrap();
    std::fs::write(h.disk("target"), b"old").unwrap();
    std::fs::create_dir(h.disk("emptydir")).unwrap();
    assert_errno(
        h.fs.rename(d, os("p"), ROOT, os("emptydir"), 0).await,
        libc::EISDIR,
        "a FIFO over a directory",
    );
    assert_errno(
        h.fs.rename(d, os("p"), ROOT, os("target"), libc::RENAME_NOREPLACE)
            .await,
        libc::EEXIST,
        "RENAME_NOREPLACE over a server file",
    );
    assert!(h.disk("target").exists());
    h.fs.rename(d, os("p"), ROOT, os("target"), 0)
        .await
        .expect("a FIFO over a server file");
    // The server's file is gone (an unlink answered early is carried out by the next
    // operation that must see the server as it is).
    h.fs.fsyncdir(ROOT).await.unwrap();
    assert!(!h.disk("target").exists(), "the replaced file is removed");
    assert_eq!(h.lookup(ROOT, "target").await, fifo.attr.ino);
    assert_errno(h.fs.lookup(d, os("p")).await, libc::ENOENT, "old name");

    // A second name of the FIFO is the same inode, with two links; the directory's mtime
    // moves (as for a rename of one, in both directories).
    let old = UNIX_EPOCH + Duration::from_secs(1_000_000);
    let set_mtime = |dir: &str| set_disk_mtime(&h, dir, old);
    let moved = |dir: &str| h.meta(dir).modified().unwrap() > old;
    set_mtime("d");
    let e = h.fs.link(fifo.attr.ino, d, os("q")).await.unwrap();
    assert!(moved("d"), "mtime after link");
    assert_eq!((e.attr.ino, e.attr.nlink), (fifo.attr.ino, 2));
    assert_errno(
        h.fs.link(fifo.attr.ino, ROOT, os("d")).await,
        libc::EEXIST,
        "link over a server directory",
    );
    // Renaming one name over the other does nothing.
    h.fs.rename(ROOT, os("target"), d, os("q"), 0)
        .await
        .unwrap();
    assert_eq!(h.fs.getattr(fifo.attr.ino, None).await.unwrap().0.nlink, 2);

    // A server file over a FIFO's name: the server renames it, the FIFO loses that name.
    let (file, fh) = h.create(d, "file").await;
    h.write(fh, 0, b"data").await;
    h.fs.release(fh).await.unwrap();
    assert_errno(
        h.fs.rename(d, os("file"), d, os("q"), libc::RENAME_NOREPLACE)
            .await,
        libc::EEXIST,
        "RENAME_NOREPLACE over a FIFO",
    );
    h.fs.rename(d, os("file"), d, os("q"), 0).await.unwrap();
    assert_eq!(std::fs::read(h.disk("d/q")).unwrap(), b"data");
    assert_eq!(h.lookup(d, "q").await, file);
    assert_eq!(h.fs.getattr(fifo.attr.ino, None).await.unwrap().0.nlink, 1);
    let sub = h.mkdir(d, "sub").await;
    assert_errno(
        h.fs.rename(d, os("sub"), ROOT, os("target"), 0).await,
        libc::ENOTDIR,
        "a directory over a FIFO",
    );

    // A directory renamed takes its FIFOs along; one holding FIFOs cannot be replaced.
    set_mtime("");
    set_mtime("d/sub");
    h.fs.rename(ROOT, os("target"), sub, os("p"), 0)
        .await
        .unwrap();
    assert!(
        moved("") && moved("d/sub"),
        "mtimes after a rename across directories"
    );
    assert_errno(
        h.fs.rename(ROOT, os("emptydir"), d, os("sub"), 0).await,
        libc::ENOTEMPTY,
        "a directory over one holding a FIFO",
    );
    h.fs.rename(ROOT, os("d"), ROOT, os("e"), 0).await.unwrap();
    let e_dir = h.lookup(ROOT, "e").await;
    let sub = h.lookup(e_dir, "sub").await;
    assert_eq!(h.lookup(sub, "p").await, fifo.attr.ino);
    assert!(!h.disk("e/sub/p").exists());

    // Read-only (an ro lease, or one that expired): the FIFO stays usable (writing to it
    // changes nothing in the filesystem, as on Linux), but not changeable.
    h.fs.set_read_only();
    h.fs.access(fifo.attr.ino, libc::W_OK, 0, 0)
        .await
        .expect("a FIFO may be written on a read-only mount");
    assert_errno(h.fs.unlink(sub, os("p")).await, libc::EROFS, "unlink");
    let chmod = SetattrRequest {
        mode: Some(0o600),
        ..Default::default()
    };
    assert_errno(
        h.fs.setattr(fifo.attr.ino, None, chmod).await,
        libc::EROFS,
        "chmod",
    );
    assert_errno(
        h.fs.rename(sub, os("p"), ROOT, os("q"), 0).await,
        libc::EROFS,
        "rename",
    );
}

/// A write or truncate that would end past the largest file the server can hold is EFBIG, as
/// pwrite(2)/ftruncate(2) say on a local disk, not EIO or EINVAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_write_or_truncate_past_the_largest_offset_is_efbig() {
    const NEAR_MAX: u64 = (1 << 63) - 2;
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    // The server's own refusal (this disk's largest file is far smaller), reported at flush
    // (write-behind) as a local pwrite would report it at once.
    let _ = h.fs.write(fh, NEAR_MAX, b"x").await;
    assert_errno(
        h.fs.flush(fh).await,
        libc::EFBIG,
        "flush after pwrite at 2^63-2",
    );
    // Through the handle and by path.
    for fh in [Some(fh), None] {
        assert_errno(
            h.fs.setattr(
                f,
                fh,
                SetattrRequest {
                    size: Some(NEAR_MAX),
                    ..Default::default()
                },
            )
            .await,
            libc::EFBIG,
            &format!("truncate to 2^63-2 (fh {fh:?})"),
        );
    }
    // OpenSSH's sftp-server seeks first, and says EINVAL (BAD_MESSAGE) for such an offset.
    h.plan.fail_next(
        ROp::Write,
        1,
        RemoteError::Status(Status::BadMessage, "Invalid argument".into()),
    );
    let _ = h.fs.write(fh, NEAR_MAX, b"x").await;
    assert_errno(h.fs.flush(fh).await, libc::EFBIG, "sftp-server's EINVAL");
    // Past the largest offset a file can have at all: refused before asking.
    let calls = h.plan.total_calls();
    assert_errno(
        h.fs.write(fh, i64::MAX as u64, b"xy").await,
        libc::EFBIG,
        "write ending past i64::MAX",
    );
    assert_errno(
        h.fs.setattr(
            f,
            Some(fh),
            SetattrRequest {
                size: Some(1 << 63),
                ..Default::default()
            },
        )
        .await,
        libc::EFBIG,
        "truncate past i64::MAX",
    );
    assert_eq!(h.plan.total_calls(), calls, "nothing was sent");
    // An ordinary write failure stays EIO.
    h.plan.fail_next(ROp::Write, 1, failure("injected"));
    let _ = h.fs.write(fh, 0, b"x").await;
    assert_errno(h.fs.flush(fh).await, libc::EIO, "an ordinary failure");
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.meta("f").len(), 0);
}

/// fstat(2) of a file that is open and was unlinked shows no links left (st_nlink 0), as on a
/// local disk; the name still there shows 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_unlinked_open_file_has_nlink_0() {
    let h = Harness::new();
    let (f, fh) = h.create(ROOT, "f").await;
    h.write(fh, 0, b"data").await;
    assert_eq!(h.fs.getattr(f, Some(fh)).await.unwrap().0.nlink, 1);
    h.fs.unlink(ROOT, os("f")).await.unwrap();
    assert_eq!(
        h.fs.getattr(f, Some(fh)).await.unwrap().0.nlink,
        0,
        "with fh"
    );
    assert_eq!(
        h.fs.getattr(f, None).await.unwrap().0.nlink,
        0,
        "without fh"
    );
    let a =
        h.fs.setattr(
            f,
            Some(fh),
            SetattrRequest {
                size: Some(2),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!((a.size, a.nlink), (2, 0), "setattr reply");
    // A file renamed over: the replaced one is gone too.
    let (g, gfh) = h.create(ROOT, "g").await;
    let (_, hfh) = h.create(ROOT, "h").await;
    h.fs.rename(ROOT, os("h"), ROOT, os("g"), 0).await.unwrap();
    assert_eq!(
        h.fs.getattr(g, Some(gfh)).await.unwrap().0.nlink,
        0,
        "replaced"
    );
    let new_g = h.lookup(ROOT, "g").await;
    assert_eq!(
        h.fs.getattr(new_g, None).await.unwrap().0.nlink,
        1,
        "the new g"
    );
    for fh in [fh, gfh, hfh] {
        h.fs.release(fh).await.unwrap();
    }
}

/// With follow_symlinks, an inode keeps the kind it was first shown with in every later
/// answer: a link made through the mount is a symlink (the kernel insists on it in the reply
/// to symlink(2)) for as long as the kernel holds it, through lookups, getattr and setattr
/// (lchown of it is applied to the link and answered as a link); a link first seen followed
/// stays its target. The kernel marks an inode whose type changes bad (EIO).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_follow_symlinks_inode_kind_never_changes() {
    let h = Harness::following_symlinks();
    let (_, fh) = h.create(ROOT, "f").await;
    h.fs.release(fh).await.unwrap();
    let made =
        h.fs.symlink(ROOT, os("l"), Path::new("f"), Caller::ROOT)
            .await
            .unwrap()
            .attr;
    assert_eq!(made.kind, FileKind::Symlink, "symlink reply");
    let l = made.ino;
    let mut c = Checks::default();
    let e = h.fs.lookup(ROOT, os("l")).await.unwrap().attr;
    c.check(
        &format!(
            "lookup: {:?} inode {}, want Symlink inode {l}",
            e.kind, e.ino
        ),
        (e.ino, e.kind) == (l, FileKind::Symlink),
    );
    let dh = h.fs.opendir(ROOT).await.unwrap();
    for item in h.fs.readdir(dh, 0).await.unwrap() {
        if item.name == "l" {
            let e = h.fs.readdirplus_entry(ROOT, &item).await.unwrap().attr;
            c.check(
                &format!("readdirplus: {:?} inode {}", e.kind, e.ino),
                (e.ino, e.kind) == (l, FileKind::Symlink),
            );
            h.fs.forget(e.ino, 1);
        }
    }
    h.fs.releasedir(dh);
    let a = h.fs.getattr(l, None).await.unwrap().0;
    c.check(
        &format!("getattr: {:?}", a.kind),
        a.kind == FileKind::Symlink,
    );
    // lchown("l", 4444, 4444)
    let set = SetattrRequest {
        uid: Some(4444),
        gid: Some(4444),
        ..Default::default()
    };
    match h.fs.setattr(l, None, set).await {
        Ok(a) => c.check(
            &format!("setattr reply: {:?} uid {}", a.kind, a.uid),
            (a.kind, a.uid, a.gid) == (FileKind::Symlink, 4444, 4444),
        ),
        Err(e) => c.check(&format!("lchown: {e}"), false),
    }
    c.check("lchown changed the link", h.meta("l").uid() == 4444);
    c.check("lchown left the target", h.meta("f").uid() != 4444);
    // lutimes too.
    let set = SetattrRequest {
        atime: at(1_000_000),
        ..Default::default()
    };
    let a = h.fs.setattr(l, None, set).await.unwrap();
    c.check(
        &format!("lutimes reply: {:?}", a.kind),
        a.kind == FileKind::Symlink,
    );
    c.finish();

    // Once the kernel forgot it, the name is seen afresh: followed.
    h.fs.forget(l, 2);
    let e = h.fs.lookup(ROOT, os("l")).await.unwrap().attr;
    assert_eq!(e.kind, FileKind::File, "a fresh lookup follows");
    let followed = e.ino;
    assert_ne!(followed, l);
    assert_eq!(
        h.fs.lookup(ROOT, os("l")).await.unwrap().attr.ino,
        followed,
        "the same inode"
    );
    let a = h.fs.getattr(followed, None).await.unwrap().0;
    assert_eq!(a.kind, FileKind::File);
    // Its target removed: the inode is not turned into a symlink; a new lookup shows the
    // (now dangling) link as a new inode.
    std::fs::remove_file(h.disk("f")).unwrap();
    h.fs.forget(followed, 2);
    let e = h.fs.lookup(ROOT, os("l")).await.unwrap().attr;
    assert_eq!(e.kind, FileKind::Symlink, "dangling: the link");
    std::fs::write(h.disk("f"), b"back").unwrap();
    let again = h.fs.lookup(ROOT, os("l")).await.unwrap().attr;
    assert_eq!(
        (again.ino, again.kind),
        (e.ino, FileKind::Symlink),
        "still the link"
    );
}

/// getattr of an inode whose name now holds an object of another type answers ESTALE (the
/// kernel then looks the name up again) rather than a type the kernel would refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_getattr_of_a_replaced_object_is_estale() {
    let h = Harness::with(
        FsConfig {
            follow_symlinks: true,
            ..config(CacheConfig {
                attr_ttl: Duration::ZERO,
                ..long_ttls()
            })
        },
        None,
    );
    std::fs::write(h.disk("t"), b"12345").unwrap();
    std::os::unix::fs::symlink("t", h.disk("l")).unwrap();
    let l = h.fs.lookup(ROOT, os("l")).await.unwrap().attr;
    assert_eq!(l.kind, FileKind::File);
    std::fs::remove_file(h.disk("t")).unwrap();
    assert_errno(
        h.fs.getattr(l.ino, None).await,
        libc::ESTALE,
        "dangling now",
    );
    std::fs::create_dir(h.disk("t")).unwrap();
    assert_errno(
        h.fs.getattr(l.ino, None).await,
        libc::ESTALE,
        "a directory now",
    );
}

/// ctime: SFTP v3 has none, so the core stands in for it with the later of the server's mtime
/// and the last status change it made itself. Each of chmod, chown, utimens, truncate,
/// write, rename, link and unlink must move it, as on a local disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_ctime_advances_on_every_status_change() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"0123456789").unwrap();
    let old = UNIX_EPOCH + Duration::from_secs(1_000_000);
    std::fs::File::options()
        .write(true)
        .open(h.disk("f"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    let f = h.lookup(ROOT, "f").await;
    let ctime = |fh: Option<u64>| {
        let fs = h.fs.clone();
        async move { fs.getattr(f, fh).await.unwrap().0.ctime }
    };
    assert_eq!(ctime(None).await, old, "untouched: the mtime");
    let mut last = old;
    let mut c = Checks::default();
    let mut step = |what: &str, before: SystemTime, now: SystemTime| {
        c.check(
            &format!("{what}: ctime {now:?}, want after {before:?} and {last:?}"),
            now >= before && now > last,
        );
        last = now;
    };
    let setattr = |req: SetattrRequest| {
        let fs = h.fs.clone();
        async move { fs.setattr(f, None, req).await.unwrap().ctime }
    };

    let t = SystemTime::now();
    let reply = setattr(SetattrRequest {
        mode: Some(libc::S_IFREG | 0o600),
        ..Default::default()
    })
    .await;
    step("chmod", t, reply);
    assert_eq!(
        ctime(None).await,
        reply,
        "getattr after chmod shows the reply's ctime"
    );
    let t = SystemTime::now();
    let me = h.meta("f");
    setattr(SetattrRequest {
        uid: Some(me.uid()),
        gid: Some(me.gid()),
        ..Default::default()
    })
    .await;
    step("chown", t, ctime(None).await);
    let t = SystemTime::now();
    setattr(SetattrRequest {
        atime: at(2_000_000),
        mtime: at(2_000_000),
        ..Default::default()
    })
    .await;
    step("utimens into the past", t, ctime(None).await);
    let t = SystemTime::now();
    setattr(SetattrRequest {
        size: Some(4),
        ..Default::default()
    })
    .await;
    step("truncate", t, ctime(None).await);
    let fh = h.open(f, libc::O_RDWR).await;
    h.fs.flush(fh).await.unwrap();
    let t = SystemTime::now();
    h.write(fh, 0, b"w").await;
    h.fs.flush(fh).await.unwrap();
    step("write", t, ctime(Some(fh)).await);
    let t = SystemTime::now();
    h.fs.rename(ROOT, os("f"), ROOT, os("g"), 0).await.unwrap();
    step("rename", t, ctime(None).await);
    let t = SystemTime::now();
    let link = h.fs.link(f, ROOT, os("h")).await.unwrap().attr.ino;
    step("link", t, ctime(None).await);
    let t = SystemTime::now();
    h.fs.unlink(ROOT, os("g")).await.unwrap();
    step("unlink (fstat)", t, ctime(Some(fh)).await);
    c.finish();
    h.fs.release(fh).await.unwrap();

    // What is recorded goes with the inode: forgotten, the next one shows the mtime again.
    h.fs.forget(f, 1);
    h.fs.forget(link, 1);
    std::fs::File::options()
        .write(true)
        .open(h.disk("h"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    let e = h.fs.lookup(ROOT, os("h")).await.unwrap().attr;
    assert_eq!((e.mtime, e.ctime), (old, old), "a new inode");
}

// ------------------------------------------------------------------------------ fetch ahead

/// Open, read whole and release `ino` as `cat` does; returns what was read.
async fn cat(h: &Harness, ino: Ino) -> Vec<u8> {
    let fh = h.open(ino, libc::O_RDONLY).await;
    let data = h.read(fh, 0, 1 << 20).await;
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    data
}

/// Wait until the server has seen `n` OPENs (fetches ahead run in the background).
async fn wait_for_opens(h: &Harness, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if h.plan.calls(ROp::Open) >= n && h.open_handles().await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "only {} of {n} OPENs reached the server",
        h.plan.calls(ROp::Open)
    );
}

/// A directory with `n` small files `f0..` (listed, so the listing is cached) and their inodes.
async fn listed_small_files(h: &Harness, n: usize) -> Vec<Ino> {
    for i in 0..n {
        std::fs::write(h.disk(format!("f{i}")), pattern(100 + i)).unwrap();
    }
    let dh = h.fs.opendir(ROOT).await.unwrap();
    h.fs.readdir(dh, 0).await.unwrap();
    h.fs.releasedir(dh);
    let mut inos = Vec::new();
    for i in 0..n {
        inos.push(h.lookup(ROOT, format!("f{i}")).await);
    }
    h.plan.reset_counts();
    inos
}

/// `grep -r` and `cp -r` read a directory file by file: from the second file on, the rest are
/// fetched ahead together, and their opens need no round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ahead_reading_a_directory_file_by_file_is_answered_from_memory() {
    let h = Harness::new();
    std::fs::write(
        h.disk("big"),
        pattern(super::prefetch::SMALL_FILE_MAX as usize + 1),
    )
    .unwrap();
    let inos = listed_small_files(&h, 20).await;
    assert_eq!(cat(&h, inos[0]).await, pattern(100));
    assert_eq!(cat(&h, inos[1]).await, pattern(101));
    // The two opens, and one fetch for each of the 18 other small files (not the big one).
    wait_for_opens(&h, 20).await;
    let opens = h.plan.calls(ROp::Open);
    for (i, ino) in inos.iter().enumerate().skip(2) {
        assert_eq!(cat(&h, *ino).await, pattern(100 + i), "f{i}");
    }
    assert_eq!(h.plan.calls(ROp::Open), opens, "an open went to the server");
    assert_eq!(opens, 20, "{:?}", h.plan.call_counts());
    assert_eq!(h.fs.stats.opens_fetched_ahead.load(Ordering::Relaxed), 18);
    assert_eq!(
        h.open_handles().await,
        0,
        "a fetch left a server handle open"
    );
    assert_eq!(h.fs.open_file_count(), 0);
}

/// A fetched file changed through the mount afterwards (written, or replaced by a rename) is
/// read from the server: the mount's own changes are never hidden by a snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ahead_never_hides_the_mounts_own_changes() {
    let h = Harness::new();
    std::fs::write(h.disk("other"), b"other").unwrap();
    let inos = listed_small_files(&h, 6).await;
    cat(&h, inos[0]).await;
    cat(&h, inos[1]).await;
    wait_for_opens(&h, 6).await;

    // Same length, so only the change clock can tell.
    let fh = h.open(inos[2], libc::O_WRONLY).await;
    h.write(fh, 0, b"CHANGED").await;
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    let mut want = pattern(102);
    want[..7].copy_from_slice(b"CHANGED");
    assert_eq!(cat(&h, inos[2]).await, want, "written through the mount");

    // f3 is replaced by another file under its name: a new inode, read from the server.
    h.lookup(ROOT, "other").await;
    h.fs.rename(ROOT, os("other"), ROOT, os("f3"), 0)
        .await
        .unwrap();
    let f3 = h.lookup(ROOT, "f3").await;
    assert_eq!(cat(&h, f3).await, b"other");
    // And the rename changed the directory: what was fetched from it before is not used.
    let opens = h.plan.calls(ROp::Open);
    assert_eq!(cat(&h, inos[4]).await, pattern(104));
    assert!(
        h.plan.calls(ROp::Open) > opens,
        "f4 was served from before the rename"
    );
}

/// A file that changed on the server between the listing and the fetch (here: grew) is not
/// served from the fetch, whose size would cut it short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ahead_a_file_grown_since_the_listing_is_read_from_the_server() {
    let h = Harness::new();
    let inos = listed_small_files(&h, 4).await;
    std::fs::write(h.disk("f3"), pattern(5000)).unwrap();
    cat(&h, inos[0]).await;
    cat(&h, inos[1]).await;
    wait_for_opens(&h, 4).await;
    assert_eq!(h.fs.stats.opens_fetched_ahead.load(Ordering::Relaxed), 0);
    assert_eq!(cat(&h, inos[2]).await, pattern(102), "fetched ahead");
    assert_eq!(h.fs.stats.opens_fetched_ahead.load(Ordering::Relaxed), 1);
    assert_eq!(
        cat(&h, inos[3]).await,
        pattern(5000),
        "grown: from the server"
    );
    assert_eq!(h.fs.stats.opens_fetched_ahead.load(Ordering::Relaxed), 1);
}

/// Failed fetches (here: the server refuses the OPENs) leave opens working as before; with an
/// attribute TTL of zero nothing is fetched ahead at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ahead_failed_fetches_and_ttl_zero() {
    let h = Harness::new();
    let inos = listed_small_files(&h, 5).await;
    cat(&h, inos[0]).await;
    h.plan.fail_always(
        ROp::Open,
        RemoteError::Status(Status::PermissionDenied, String::new()),
    );
    assert_errno(
        h.fs.open(
            inos[1],
            OpenRequest {
                flags: libc::O_RDONLY,
                pid: 0,
                caller: Caller::ROOT,
            },
        )
        .await,
        libc::EACCES,
        "refused open",
    );
    // The fetches planned by these opens have all failed (each gives its bytes back then):
    // none can go through once the OPENs are let through again.
    eventually("the fetches ahead failed", || {
        h.fs.small_files.bytes_waiting() == 0
    })
    .await;
    h.plan.clear_all();
    for (i, ino) in inos.iter().enumerate().skip(1) {
        assert_eq!(cat(&h, *ino).await, pattern(100 + i), "f{i}");
    }
    assert_eq!(h.fs.stats.opens_fetched_ahead.load(Ordering::Relaxed), 0);

    let h = Harness::with(
        config(CacheConfig {
            attr_ttl: Duration::ZERO,
            ..long_ttls()
        }),
        None,
    );
    let inos = listed_small_files(&h, 5).await;
    for ino in &inos {
        cat(&h, *ino).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        h.plan.calls(ROp::Open),
        5,
        "fetched ahead with a TTL of zero"
    );
}

/// A listing that was on its way while a file was created through the mount is not cached:
/// it may lack the new name, which readdir and lookups must show at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_listing_racing_a_create_is_not_cached() {
    let h = Harness::new();
    std::fs::write(h.disk("old"), b"").unwrap();
    // The listing is taken at once, and answered after the create.
    h.plan
        .set_op_reply_delay(ROp::ReadDir, Some(Duration::from_millis(300)));
    let fs = h.fs.clone();
    let listing = tokio::spawn(async move { fs.opendir(ROOT).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (_, fh) = h.create(ROOT, "new").await;
    h.fs.release(fh).await.unwrap();
    let dh = listing.await.unwrap().unwrap();
    h.fs.releasedir(dh);
    h.plan.set_op_reply_delay(ROp::ReadDir, None);

    let dh = h.fs.opendir(ROOT).await.unwrap();
    let names: Vec<OsString> =
        h.fs.readdir(dh, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
    h.fs.releasedir(dh);
    assert!(names.contains(&OsString::from("new")), "{names:?}");
    h.lookup(ROOT, "new").await;
}

// ------------------------------------------------------------------------ setattr behind

/// Write `len` bytes of `byte` through `fh` from offset 0, 1 MiB at a time: one contiguous
/// run, as `dd bs=1M` makes.
async fn write_run(h: &Harness, fh: u64, len: u64, byte: u8) {
    let chunk = vec![byte; 1 << 20];
    for at in (0..len).step_by(chunk.len()) {
        h.write(fh, at, &chunk).await;
    }
}

/// Create `name` as tar and cp do (O_EXCL, write only).
async fn create_excl(h: &Harness, name: &str) -> (Ino, u64) {
    let req = OpenRequest {
        flags: libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        pid: 0,
        caller: Caller::ROOT,
    };
    let (e, fh) =
        h.fs.create(ROOT, os(name), FILE_MODE, UMASK, req)
            .await
            .unwrap();
    (e.attr.ino, fh)
}

fn times(atime: Option<TimeSpec>, mtime: Option<TimeSpec>) -> SetattrRequest {
    SetattrRequest {
        atime,
        mtime,
        ..Default::default()
    }
}

fn chmod(mode: u32) -> SetattrRequest {
    SetattrRequest {
        mode: Some(mode),
        ..Default::default()
    }
}

/// What tar does to every file it extracts: create, write, futimens with the atime omitted,
/// fchown to the owner it has, fchmod (the kernel passes no handle for these), close. The attribute changes queue behind the writes (no stat, no wait of their
/// own), answer with the attributes they give, and are all on disk after close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_tar_extraction_sets_times_and_mode_without_asking() {
    let h = Harness::new();
    let (ino, fh) = create_excl(&h, "f").await;
    h.plan.reset_counts();
    h.write(fh, 0, b"extracted").await;
    let a =
        h.fs.setattr(ino, Some(fh), times(None, at(1_000_000)))
            .await
            .unwrap();
    assert_eq!((secs(a.mtime), a.size), (1_000_000, 9));
    let owner = SetattrRequest {
        uid: Some(a.uid),
        gid: Some(a.gid),
        ..Default::default()
    };
    let a = h.fs.setattr(ino, None, owner).await.unwrap();
    assert_eq!((secs(a.mtime), a.size), (1_000_000, 9));
    let a = h.fs.setattr(ino, None, chmod(0o751)).await.unwrap();
    assert_eq!((a.perm, secs(a.mtime), a.size), (0o751, 1_000_000, 9));
    assert_eq!(
        (
            h.plan.calls(ROp::Lstat),
            h.plan.calls(ROp::Fstat),
            h.plan.calls(ROp::Setstat)
        ),
        (0, 0, 0),
        "{:?}",
        h.plan.call_counts()
    );
    h.fs.flush(fh).await.unwrap();
    // Sent behind the writes, not waited for: counted once flush has drained them. (Those
    // queued while the writer was busy went out as one: see `merge_setattrs`.)
    let merged = h.fs.stats.setattrs_merged.load(Ordering::Relaxed);
    assert_eq!(h.plan.calls(ROp::Fsetstat) + merged, 3);
    h.fs.release(fh).await.unwrap();
    let m = h.meta("f");
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"extracted");
    assert_eq!((m.mode() & 0o7777, m.mtime()), (0o751, 1_000_000));
    // The atime was not asked to change.
    let (e, _) = h.fs.getattr(ino, None).await.unwrap();
    assert_eq!(secs(e.atime), m.atime() as u64);
}

/// The kernel asks for the attributes before every `chown` (to clear set-id bits), which
/// `tar` and `cp -p` make right after setting the times behind the writes: that stat is
/// answered from what the descriptor knows, times as set, without waiting for the server.
/// With a mode change still on its way, it waits (a refused chmod is the server's to show).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_stat_after_times_does_not_wait_but_one_after_a_chmod_does() {
    let h = Harness::new();
    let (ino, fh) = create_excl(&h, "f").await;
    h.write(fh, 0, b"extracted").await;
    h.plan.reset_counts();
    h.plan.hold(ROp::Fsetstat);
    h.fs.setattr(ino, None, times(None, at(1_000_000)))
        .await
        .unwrap();
    let keep_owner = SetattrRequest {
        uid: Some(0),
        gid: Some(0),
        ..Default::default()
    };
    let quick = Duration::from_secs(10);
    for (what, req) in [("times", None), ("a same-owner chown", Some(keep_owner))] {
        if let Some(req) = req {
            tokio::time::timeout(quick, h.fs.setattr(ino, None, req))
                .await
                .expect("the same-owner chown waited for the held FSETSTAT")
                .unwrap();
        }
        let (a, ttl) = tokio::time::timeout(quick, h.fs.getattr(ino, Some(fh)))
            .await
            .unwrap_or_else(|_| panic!("the stat after {what} waited for the held FSETSTAT"))
            .unwrap();
        assert_eq!((secs(a.mtime), a.size, ttl), (1_000_000, 9, Duration::ZERO));
    }
    assert_eq!(h.plan.calls(ROp::Fstat), 0);
    h.fs.setattr(ino, None, chmod(0o751)).await.unwrap();
    let mut stat = Box::pin(h.fs.getattr(ino, Some(fh)));
    assert!(
        answered_at_once(&mut stat).is_none(),
        "the stat after a chmod on its way did not wait for it"
    );
    h.plan.release(ROp::Fsetstat);
    let (a, _) = stat.await.unwrap();
    assert_eq!((a.perm, secs(a.mtime), a.size), (0o751, 1_000_000, 9));
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.meta("f").mode() & 0o7777, 0o751);
}

/// Times set behind the writes, then more writes: the server moves the mtime as they land,
/// to its clock, so a `stat` meanwhile asks the server (waiting for them) instead of showing
/// the mtime that was set (which may be years back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_write_after_times_set_makes_a_stat_ask_the_server() {
    let h = Harness::new();
    let (ino, fh) = create_excl(&h, "f").await;
    h.write(fh, 0, b"first").await;
    h.fs.setattr(ino, None, times(None, at(1_000_000)))
        .await
        .unwrap();
    h.plan.hold(ROp::Write);
    h.write(fh, 5, b" then more").await;
    let mut stat = Box::pin(h.fs.getattr(ino, Some(fh)));
    assert!(
        answered_at_once(&mut stat).is_none(),
        "answered the mtime that was set while a write that moves it was held"
    );
    h.plan.release(ROp::Write);
    let (a, _) = stat.await.unwrap();
    assert_eq!(a.size, 15);
    assert_ne!(secs(a.mtime), 1_000_000, "the write moved the mtime");
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
}

/// A change behind the writes that the server refuses is reported like a failed write: by
/// the next flush (close), not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_refused_change_is_reported_at_close() {
    let h = Harness::new();
    let (ino, fh) = create_excl(&h, "f").await;
    h.write(fh, 0, b"x").await;
    h.plan.fail_next(
        ROp::Fsetstat,
        1,
        RemoteError::Status(Status::PermissionDenied, String::new()),
    );
    h.fs.setattr(ino, Some(fh), times(None, at(5000)))
        .await
        .unwrap();
    assert!(
        h.fs.flush(fh).await.is_err(),
        "the refused utimens was not reported"
    );
    h.fs.release(fh).await.ok();
}

/// A file made by an `open(O_CREAT)` without `O_EXCL` (SQLite's journal, `cp`, editors) is
/// as much this descriptor's as one made with it: the create is exclusive underneath. Its
/// owner-keeping `fchown` and its `fchmod` (made before any write, whose mtime the answer
/// could not show) go behind the writes, no round trip each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_also_for_a_file_made_without_o_excl() {
    let h = Harness::new();
    let (ino, fh) = h.create(ROOT, "journal").await;
    let before = h.plan.calls(ROp::Fsetstat) + h.plan.calls(ROp::Setstat);
    h.plan.hold(ROp::Fsetstat);
    let keep_owner = SetattrRequest {
        uid: Some(0),
        gid: Some(0),
        ..Default::default()
    };
    let quick = Duration::from_secs(10);
    tokio::time::timeout(quick, h.fs.setattr(ino, Some(fh), keep_owner))
        .await
        .expect("the owner-keeping chown waited for the server")
        .unwrap();
    let a = tokio::time::timeout(quick, h.fs.setattr(ino, Some(fh), chmod(0o600)))
        .await
        .expect("the chmod waited for the server")
        .unwrap();
    assert_eq!(a.perm, 0o600);
    h.write(fh, 0, b"x").await;
    h.plan.release(ROp::Fsetstat);
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    assert!(h.plan.calls(ROp::Fsetstat) + h.plan.calls(ROp::Setstat) > before);
    assert_eq!(h.meta("journal").permissions().mode() & 0o7777, 0o600);
}

/// Not behind the writes (asked and waited for, as before): set-id bits, a chown, a file this
/// descriptor's create did not make (it was there already), a file with a second descriptor,
/// and a chmod whose answer would need an mtime that a write has changed since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_only_for_the_creators_mode_and_times() {
    let h = Harness::new();
    let refuse = || RemoteError::Status(Status::PermissionDenied, String::new());
    let mut c = Checks::default();

    let (ino, fh) = create_excl(&h, "setid").await;
    h.plan.fail_next(ROp::Fsetstat, 1, refuse());
    c.errno(
        "chmod u+s",
        h.fs.setattr(ino, Some(fh), chmod(0o4755)).await,
        libc::EPERM,
    );
    h.fs.release(fh).await.ok();

    let (ino, fh) = create_excl(&h, "chown").await;
    h.plan.fail_next(ROp::Fsetstat, 1, refuse());
    let to_other = SetattrRequest {
        uid: Some(4321),
        ..Default::default()
    };
    c.errno(
        "chown to another user",
        h.fs.setattr(ino, Some(fh), to_other).await,
        libc::EPERM,
    );
    h.fs.release(fh).await.ok();

    // O_CREAT without O_EXCL of a file that was there already: not made by this descriptor.
    std::fs::write(h.disk("there-before"), b"old").unwrap();
    let (ino, fh) = h.create(ROOT, "there-before").await;
    h.plan.fail_next(ROp::Fsetstat, 1, refuse());
    c.errno(
        "chmod, a file that was there before the create",
        h.fs.setattr(ino, Some(fh), chmod(0o600)).await,
        libc::EPERM,
    );
    h.fs.release(fh).await.ok();

    let (ino, fh) = create_excl(&h, "two").await;
    let other = h.open(ino, libc::O_RDONLY).await;
    h.plan.fail_next(ROp::Fsetstat, 1, refuse());
    c.errno(
        "chmod, two descriptors",
        h.fs.setattr(ino, Some(fh), chmod(0o600)).await,
        libc::EPERM,
    );
    h.fs.release(other).await.ok();
    h.fs.release(fh).await.ok();

    let (ino, fh) = create_excl(&h, "rewritten").await;
    h.fs.setattr(ino, Some(fh), times(at(1000), at(1000)))
        .await
        .unwrap();
    h.write(fh, 0, b"later").await;
    let a = h.fs.setattr(ino, Some(fh), chmod(0o600)).await.unwrap();
    c.check(
        "a write after utimens moves the mtime; chmod must not show the old one",
        secs(a.mtime) > 1000,
    );
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    c.finish();
}

/// `git status` stats every file of its index by path: each directory a lookup finds is
/// listed in the background, and the lookups of its names that follow are answered from that
/// listing (joining it while it is on its way) instead of one stat each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_of_a_directory_lists_it_ahead_of_the_lookups_in_it() {
    let h = Harness::new();
    std::fs::create_dir_all(h.disk("a/b")).unwrap();
    for i in 0..5 {
        std::fs::write(h.disk(format!("a/b/f{i}")), b"x").unwrap();
    }
    // The listing answers only once it has arrived: slow it down, the lookups wait for it.
    h.plan
        .set_op_reply_delay(ROp::ReadDir, Some(Duration::from_millis(100)));
    let a = h.lookup(ROOT, "a").await;
    let b = h.lookup(a, "b").await;
    for i in 0..5 {
        h.lookup(b, format!("f{i}")).await;
    }
    assert_errno(h.fs.lookup(b, os("absent")).await, libc::ENOENT, "absent");
    let counts = h.plan.call_counts();
    assert_eq!(
        h.plan.calls(ROp::Lstat) + h.plan.calls(ROp::Stat),
        1,
        "only the first name (a, in a root not listed) is stat'ed: {counts:?}"
    );
}

/// A descriptor already reading from a fetched-ahead copy reads from the server once the
/// file changed through the mount (here: written through another descriptor), as it would
/// on a local disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ahead_an_open_copy_gives_way_to_a_change_through_the_mount() {
    let h = Harness::new();
    let inos = listed_small_files(&h, 4).await;
    cat(&h, inos[0]).await;
    cat(&h, inos[1]).await;
    wait_for_opens(&h, 4).await;
    let reader = h.open(inos[2], libc::O_RDONLY).await;
    assert_eq!(h.fs.stats.opens_fetched_ahead.load(Ordering::Relaxed), 1);
    assert_eq!(h.read(reader, 0, 4096).await, pattern(102));

    let writer = h.open(inos[2], libc::O_WRONLY).await;
    h.write(writer, 0, b"NEW").await;
    h.fs.flush(writer).await.unwrap();
    h.fs.release(writer).await.unwrap();
    let mut want = pattern(102);
    want[..3].copy_from_slice(b"NEW");
    assert_eq!(
        h.read(reader, 0, 4096).await,
        want,
        "read from the old copy"
    );
    h.fs.release(reader).await.unwrap();
    assert_eq!(
        h.open_handles().await,
        0,
        "the server handle it got was not closed"
    );
}

// ------------------------------------ races of read-ahead, listings and attributes behind writes

/// A lookup that joins a listing already on its way when a name of the directory was created
/// or removed through the mount must not answer from that listing: it predates the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_lookup_joining_a_listing_older_than_a_create_or_unlink() {
    let h = Harness::new();
    std::fs::create_dir(h.disk("d")).unwrap();
    std::fs::write(h.disk("d/old"), b"old").unwrap();
    // The listing the lookup of d starts is taken at once and answered late.
    h.plan
        .set_op_reply_delay(ROp::ReadDir, Some(Duration::from_millis(400)));
    let d = h.lookup(ROOT, "d").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (_, fh) = h.create(d, "new").await;
    h.fs.release(fh).await.unwrap();
    h.fs.unlink(d, os("old")).await.unwrap();
    let new = h.fs.lookup(d, os("new")).await;
    let old = h.fs.lookup(d, os("old")).await;
    h.plan.set_op_reply_delay(ROp::ReadDir, None);
    assert!(
        new.is_ok(),
        "created through the mount, lookup says {new:?}"
    );
    assert_errno(old, libc::ENOENT, "removed through the mount");
    h.lookup(d, "new").await;
}

/// Two reads of a fetched-ahead copy that both find it outdated (the file changed through the
/// mount) both get the server handle: neither fails with EBADF.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_ahead_concurrent_reads_switching_to_the_server() {
    let h = Harness::new();
    let inos = listed_small_files(&h, 4).await;
    cat(&h, inos[0]).await;
    cat(&h, inos[1]).await;
    wait_for_opens(&h, 4).await;
    let reader = h.open(inos[2], libc::O_RDONLY).await;
    assert_eq!(h.fs.stats.opens_fetched_ahead.load(Ordering::Relaxed), 1);
    let writer = h.open(inos[2], libc::O_WRONLY).await;
    h.write(writer, 0, b"NEW").await;
    h.fs.flush(writer).await.unwrap();
    h.fs.release(writer).await.unwrap();
    h.plan
        .set_op_delay(ROp::Open, Some(Duration::from_millis(100)));
    let (fs1, fs2) = (h.fs.clone(), h.fs.clone());
    let a = tokio::spawn(async move { fs1.read(reader, 0, 3).await });
    let b = tokio::spawn(async move { fs2.read(reader, 3, 3).await });
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    h.plan.set_op_delay(ROp::Open, None);
    let mut want = pattern(102);
    want[..3].copy_from_slice(b"NEW");
    assert_eq!(
        a.map(|d| d.to_vec()).map_err(|e| e.errno),
        Ok(want[..3].to_vec())
    );
    assert_eq!(
        b.map(|d| d.to_vec()).map_err(|e| e.errno),
        Ok(want[3..6].to_vec())
    );
    h.fs.release(reader).await.unwrap();
    assert_eq!(h.open_handles().await, 0, "server handles leaked");
}

/// A descriptor reading from a fetched-ahead copy keeps reading its file after the name is
/// unlinked or replaced by a rename (open, then unlink), as one with a server handle does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_ahead_an_open_copy_stays_readable_after_unlink_and_rename_over() {
    let h = Harness::new();
    let inos = listed_small_files(&h, 5).await;
    cat(&h, inos[0]).await;
    cat(&h, inos[1]).await;
    wait_for_opens(&h, 5).await;
    let r2 = h.open(inos[2], libc::O_RDONLY).await;
    let r3 = h.open(inos[3], libc::O_RDONLY).await;
    assert_eq!(h.fs.stats.opens_fetched_ahead.load(Ordering::Relaxed), 2);

    h.fs.unlink(ROOT, os("f2")).await.unwrap();
    assert_eq!(
        h.fs.read(r2, 0, 4096)
            .await
            .map(|d| d.to_vec())
            .map_err(|e| e.errno),
        Ok(pattern(102)),
        "read after unlink"
    );
    let (_, w) = h.create(ROOT, "other").await;
    h.write(w, 0, b"other").await;
    h.fs.flush(w).await.unwrap();
    h.fs.release(w).await.unwrap();
    h.fs.rename(ROOT, os("other"), ROOT, os("f3"), 0)
        .await
        .unwrap();
    assert_eq!(
        h.fs.read(r3, 0, 4096)
            .await
            .map(|d| d.to_vec())
            .map_err(|e| e.errno),
        Ok(pattern(103)),
        "read after the name was replaced"
    );
    h.fs.release(r2).await.unwrap();
    h.fs.release(r3).await.unwrap();
    assert_eq!(h.open_handles().await, 0, "server handles leaked");
}

/// A change behind the writes that the server refused is not shown as made: stat shows the
/// server's mode, and a later change behind the writes does not answer with it either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_behind_a_refused_chmod_is_not_shown() {
    let h = Harness::new();
    let (ino, fh) = create_excl(&h, "f").await;
    h.write(fh, 0, b"x").await;
    h.fs.setattr(ino, None, times(at(1000), at(1000)))
        .await
        .unwrap();
    // (That one is on its way once flush has drained it: the failure below is the chmod's.)
    h.fs.flush(fh).await.unwrap();
    h.plan.fail_next(
        ROp::Fsetstat,
        1,
        RemoteError::Status(Status::PermissionDenied, String::new()),
    );
    h.plan.reset_counts();
    let a = h.fs.setattr(ino, None, chmod(0o600)).await.unwrap();
    assert_eq!(h.plan.calls(ROp::Setstat), 0, "not behind the writes");
    assert_eq!(a.perm, 0o600, "answered at once");
    let (a, _) = h.fs.getattr(ino, None).await.unwrap();
    assert_eq!(a.perm, 0o644, "stat shows the refused chmod");
    assert!(
        h.fs.flush(fh).await.is_err(),
        "the refusal was not reported"
    );
    let a =
        h.fs.setattr(ino, Some(fh), times(at(5000), at(5000)))
            .await
            .unwrap();
    assert_eq!(a.perm, 0o644, "utimens answers with the refused chmod");
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.meta("f").mode() & 0o7777, 0o644);
}

/// A change behind the writes that was never sent because the connection had dropped is sent
/// again on the reopened handle, as a write is: nothing was lost, nothing is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_behind_a_change_after_a_reconnect_is_sent_again() {
    let h = Harness::new();
    let (ino, fh) = create_excl(&h, "f").await;
    h.plan.disconnect();
    h.plan.restore();
    h.fs.setattr(ino, None, chmod(0o600)).await.unwrap();
    assert_eq!(
        h.fs.flush(fh).await.map_err(|e| e.errno),
        Ok(()),
        "a chmod never sent was reported as failed"
    );
    h.fs.release(fh).await.unwrap();
    assert_eq!(h.meta("f").mode() & 0o7777, 0o600);
    assert_eq!(h.open_handles().await, 0, "server handles leaked");
}

// ------------------------------------------------------------------------------ unlinks answered early

/// The names in `dir` that readdir shows.
async fn readdir_names(h: &Harness, dir: Ino) -> Vec<OsString> {
    let dh = h.fs.opendir(dir).await.unwrap();
    let names =
        h.fs.readdir(dh, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
    h.fs.releasedir(dh);
    names
}

/// `stat` of a directory while an unlink in it answered early is on its way (`rm f; stat
/// -c %Y .`) may show the mtime from before the REMOVE, but for no longer than that: it is
/// answered with TTL 0 and not kept, with the mtime of the unlink, and once the REMOVE is
/// carried out `stat` shows the mtime it gave (before, the old one was kept for the
/// attribute TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlink_behind_then_stat_of_the_directory_shows_its_new_mtime() {
    let h = Harness::new();
    let d = h.mkdir(ROOT, "d").await;
    let (_, fh) = h.create(d, "a").await;
    h.fs.release(fh).await.unwrap();
    let old = std::fs::FileTimes::new().set_modified(UNIX_EPOCH + Duration::from_secs(1_000_000));
    std::fs::File::open(h.disk("d"))
        .unwrap()
        .set_times(old)
        .unwrap();
    h.plan.hold(ROp::Remove);
    let unlinked = secs(SystemTime::now());
    h.fs.unlink(d, os("a")).await.unwrap();
    assert_eq!(h.fs.stats.unlinks_behind.load(Ordering::Relaxed), 1);
    // Not waited for: the REMOVE is still held. The server's mtime is from before it, but
    // the unlink has been answered: the mtime shown is not older than it (pjdfstest's
    // unlink/00.t asks just that), in whole seconds as the server's own.
    let (a, ttl) = tokio::time::timeout(Duration::from_secs(30), h.fs.getattr(d, None))
        .await
        .expect("stat waited for the REMOVE")
        .unwrap();
    assert_eq!(ttl, Duration::ZERO, "TTL while the REMOVE is on its way");
    assert!(
        secs(a.mtime) >= unlinked && a.mtime <= SystemTime::now(),
        "mtime {:?} while the REMOVE is on its way, unlinked at {unlinked}",
        a.mtime
    );
    assert_eq!(
        a.mtime.duration_since(UNIX_EPOCH).unwrap().subsec_nanos(),
        0
    );
    h.plan.release(ROp::Remove);
    eventually("the REMOVE carried out", || !h.disk("d/a").exists()).await;
    eventually("the REMOVE counted as landed", || {
        h.fs.removes_behind.in_flight() == 0
    })
    .await;
    let server = h.meta("d").mtime();
    assert_ne!(server, 1_000_000, "the REMOVE did not move the mtime");
    let (a, _) = h.fs.getattr(d, None).await.unwrap();
    assert_eq!(secs(a.mtime) as i64, server, "stat after the REMOVE");
}

/// An unlink the mount can vouch for is answered before the server's REMOVE, and everything
/// after it sees the name gone, on the mount and (where it matters) on the server: a lookup,
/// a listing, a create of the same name, an rmdir of the directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlink_behind_answers_early_and_keeps_order() {
    let h = Harness::new();
    let d = h.mkdir(ROOT, "d").await;
    for name in ["a", "b"] {
        let (_, fh) = h.create(d, name).await;
        h.write(fh, 0, b"old").await;
        h.fs.release(fh).await.unwrap();
    }
    // The REMOVE does not reach the server until released.
    h.plan.hold(ROp::Remove);
    h.fs.unlink(d, os("a")).await.unwrap();
    assert!(h.disk("d/a").exists(), "the unlink waited for the server");
    assert_eq!(h.fs.stats.unlinks_behind.load(Ordering::Relaxed), 1);
    // The mount shows it gone at once.
    assert_errno(h.fs.lookup(d, os("a")).await, libc::ENOENT, "lookup");
    assert_eq!(readdir_names(&h, d).await, [".", "..", "b"]);
    // Creating the name again waits for the REMOVE: the new file is not removed by it. (Had
    // the create not waited, it would be done by now, and the REMOVE let go below would
    // remove the new file.)
    let fs = h.fs.clone();
    let mut create = tokio::spawn(async move {
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
        fs.create(d, os("a"), FILE_MODE, UMASK, as_root(flags))
            .await
    });
    assert!(
        still_waiting(&mut create).await,
        "the create did not wait for the REMOVE"
    );
    h.plan.release(ROp::Remove);
    let (_, fh) = create.await.unwrap().unwrap();
    h.write(fh, 0, b"new").await;
    h.fs.release(fh).await.unwrap();
    assert_eq!(std::fs::read(h.disk("d/a")).unwrap(), b"new");
    // rmdir waits for the REMOVEs in the directory, and succeeds.
    h.fs.unlink(d, os("a")).await.unwrap();
    h.fs.unlink(d, os("b")).await.unwrap();
    h.fs.rmdir(ROOT, os("d")).await.unwrap();
    assert!(!h.disk("d").exists());
}

/// A lookup or a listing the server answers must not predate an unlink already answered:
/// with no listing cached (dir_ttl 0), both wait for the REMOVE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlink_behind_then_server_lookups_wait_for_it() {
    let h = Harness::with(
        config(CacheConfig {
            dir_ttl: Duration::ZERO,
            negative_ttl: Duration::ZERO,
            ..long_ttls()
        }),
        None,
    );
    std::fs::write(h.disk("f"), b"x").unwrap();
    std::fs::write(h.disk("g"), b"x").unwrap();
    h.lookup(ROOT, "f").await;
    h.lookup(ROOT, "g").await;
    h.plan.hold(ROp::Remove);
    h.fs.unlink(ROOT, os("f")).await.unwrap();
    assert_eq!(h.fs.stats.unlinks_behind.load(Ordering::Relaxed), 1);
    // The lookup waits while the REMOVE is held (had it not, it would be answered by now,
    // from the server, which still has the file).
    let fs = h.fs.clone();
    let mut lookup = tokio::spawn(async move { fs.lookup(ROOT, os("f")).await });
    assert!(
        still_waiting(&mut lookup).await,
        "the lookup did not wait for the REMOVE"
    );
    h.plan.release(ROp::Remove);
    assert_errno(lookup.await.unwrap(), libc::ENOENT, "lookup");
    h.plan
        .set_op_delay(ROp::Remove, Some(Duration::from_millis(100)));
    h.fs.unlink(ROOT, os("g")).await.unwrap();
    assert_eq!(readdir_names(&h, ROOT).await, [".", ".."]);
    h.plan.set_op_delay(ROp::Remove, None);
}

/// The server refuses an unlink answered early: the name comes back (lookup finds it, the
/// quota charges it again, the kernel is told to drop what it kept of the name), fsync of the
/// directory reports the error once, an rmdir of the directory fails as it must, and the next
/// unlinks there wait for the server's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlink_behind_refused_puts_the_name_back_and_is_reported() {
    let h = Harness::new();
    let kernel_told = kernel_names_recorded(&h);
    let quota = &h.fs.enforcer().quota;
    let d = h.mkdir(ROOT, "d").await;
    for name in ["a", "b"] {
        let (_, fh) = h.create(d, name).await;
        h.write(fh, 0, &[7u8; 100]).await;
        h.fs.release(fh).await.unwrap();
    }
    let used = quota.usage();
    let refused = || RemoteError::Status(Status::PermissionDenied, "refused".into());
    h.plan.fail_next(ROp::Remove, 1, refused());
    h.fs.unlink(d, os("a")).await.unwrap();
    assert_errno(
        h.fs.fsyncdir(d).await,
        libc::EACCES,
        "fsync of the directory",
    );
    h.fs.fsyncdir(d).await.unwrap();
    assert!(h.disk("d/a").exists());
    // The kernel may have kept the name as absent from a lookup in between: it drops that.
    eventually("the kernel told that the name is back", || {
        kernel_told(d, "a")
    })
    .await;
    assert_eq!(quota.usage(), used, "charged again");
    let a = h.lookup(d, "a").await;
    assert_eq!(h.size(a, None).await, 100);
    assert!(readdir_names(&h, d).await.contains(&OsString::from("a")));

    // Refused again: rmdir says the directory is not empty, and the name is back.
    h.plan.fail_next(ROp::Remove, 1, refused());
    h.fs.unlink(d, os("a")).await.unwrap();
    assert_errno(h.fs.rmdir(ROOT, os("d")).await, libc::ENOTEMPTY, "rmdir");
    h.lookup(d, "a").await;
    // Until the failure is reported, unlinks in that directory wait for the server.
    h.plan.fail_next(ROp::Remove, 1, refused());
    assert_errno(
        h.fs.unlink(d, os("b")).await,
        libc::EACCES,
        "unlink after a refusal",
    );
    assert_eq!(h.fs.stats.unlinks_behind.load(Ordering::Relaxed), 2);
    // flush_all (unmount) reports what fsync has not.
    assert!(h.fs.flush_all().await.is_err());
    h.fs.unlink(d, os("a")).await.unwrap();
    h.fs.unlink(d, os("b")).await.unwrap();
    h.fs.rmdir(ROOT, os("d")).await.unwrap();
    assert!(!h.disk("d").exists());
}

/// A REMOVE lost with the connection is sent again; if the first one was carried out, the
/// second finds nothing to remove, which is what was promised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlink_behind_survives_a_lost_connection() {
    let h = Harness::new();
    for name in ["a", "b"] {
        std::fs::write(h.disk(name), b"x").unwrap();
        h.lookup(ROOT, name).await;
    }
    let lost = || RemoteError::Disconnected("test".into());
    h.plan.fail_next(ROp::Remove, 1, lost());
    h.fs.unlink(ROOT, os("a")).await.unwrap();
    h.fs.fsyncdir(ROOT).await.unwrap();
    h.plan.fail_next_after_performing(ROp::Remove, 1, lost());
    h.fs.unlink(ROOT, os("b")).await.unwrap();
    h.fs.fsyncdir(ROOT).await.unwrap();
    assert!(!h.disk("a").exists() && !h.disk("b").exists());
    assert_eq!(h.fs.stats.unlinks_behind.load(Ordering::Relaxed), 2);
}

/// What the mount cannot vouch for waits for the server: a name it has no inode for, a file
/// in a sticky directory, and every unlink with `sync_unlink`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlink_behind_only_when_the_mount_can_vouch_for_it() {
    let h = Harness::new();
    std::fs::write(h.disk("unseen"), b"x").unwrap();
    h.fs.unlink(ROOT, os("unseen")).await.unwrap();
    assert!(!h.disk("unseen").exists());
    std::fs::create_dir(h.disk("sticky")).unwrap();
    std::fs::set_permissions(h.disk("sticky"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(h.disk("sticky/f"), b"x").unwrap();
    let sticky = h.lookup(ROOT, "sticky").await;
    h.lookup(sticky, "f").await;
    h.fs.getattr(sticky, None).await.unwrap();
    h.fs.unlink(sticky, os("f")).await.unwrap();
    assert!(!h.disk("sticky/f").exists());
    assert_eq!(h.fs.stats.unlinks_behind.load(Ordering::Relaxed), 0);

    let h = Harness::with(
        FsConfig {
            sync_unlink: true,
            ..config(long_ttls())
        },
        None,
    );
    std::fs::write(h.disk("f"), b"x").unwrap();
    h.lookup(ROOT, "f").await;
    h.plan.fail_next(
        ROp::Remove,
        1,
        RemoteError::Status(Status::PermissionDenied, "refused".into()),
    );
    assert_errno(
        h.fs.unlink(ROOT, os("f")).await,
        libc::EACCES,
        "sync_unlink",
    );
    h.fs.unlink(ROOT, os("f")).await.unwrap();
    assert!(!h.disk("f").exists());
    assert_eq!(h.fs.stats.unlinks_behind.load(Ordering::Relaxed), 0);
}

/// Attribute changes behind the writes, not waited for, keep the order the program made them
/// in: a write after a utimensat moves the mtime again, a stat through the descriptor sees the
/// change on the server, and a change nothing follows still goes out on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_held_attribute_changes_keep_program_order() {
    let h = Harness::new();
    let (ino, fh) = create_excl(&h, "f").await;
    h.write(fh, 0, b"a").await;
    h.fs.setattr(ino, Some(fh), times(at(1000), at(1000)))
        .await
        .unwrap();
    h.write(fh, 1, b"b").await;
    h.fs.flush(fh).await.unwrap();
    assert_ne!(
        h.meta("f").mtime(),
        1000,
        "the write after utimensat went first"
    );

    // fstat through the descriptor: what it shows is on the server.
    h.fs.setattr(ino, Some(fh), chmod(0o600)).await.unwrap();
    let (a, _) = h.fs.getattr(ino, Some(fh)).await.unwrap();
    assert_eq!(a.perm, 0o600);
    assert_eq!(h.meta("f").mode() & 0o7777, 0o600);

    // Nothing follows: it is sent anyway, without a flush.
    h.fs.setattr(ino, Some(fh), chmod(0o640)).await.unwrap();
    eventually("the held change is sent", || {
        h.meta("f").mode() & 0o7777 == 0o640
    })
    .await;
    h.fs.release(fh).await.unwrap();
}

// -------------------------------------------- writes lost at a drop, and names changing

/// An editor's atomic save during an outage: a write to the old file is lost with the
/// connection, and the program renames a new version over the old name. The lost write is
/// sent again to the old file, by its name, before the rename is (program order): the new
/// file is not touched and nothing is reported. (It used to be reopened by the name after
/// the rename had landed, so the new file got the old file's bytes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lost_at_a_drop_lands_before_a_rename_over_its_name() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "b").await;
    h.write(fh, 0, b"old version").await;
    h.fs.flush(fh).await.unwrap();
    let (_, t) = h.create(ROOT, "b.tmp").await;
    h.write(t, 0, b"NEW VERSION").await;
    h.fs.flush(t).await.unwrap();
    h.fs.release(t).await.unwrap();
    write_lost_at_a_drop(&h, fh, 0, b"OLD").await;
    // The resend's reopen (by the name "b") is held at the server's door.
    h.plan.hold(ROp::Open);
    h.plan.restore();
    h.plan.until_held(ROp::Open, 1).await;
    let fs = h.fs.clone();
    let mut rename =
        tokio::spawn(async move { fs.rename(ROOT, os("b.tmp"), ROOT, os("b"), 0).await });
    assert!(
        still_waiting(&mut rename).await,
        "the rename did not wait for the write the drop took"
    );
    h.plan.release(ROp::Open);
    rename.await.unwrap().unwrap();
    assert_eq!(std::fs::read(h.disk("b")).unwrap(), b"NEW VERSION");
    assert_eq!(h.fs.stats.writes_sent_again.load(Ordering::Relaxed), 1);
    h.fs.flush(fh)
        .await
        .expect("the write reached the old file: nothing to report");
    h.fs.release(fh).await.unwrap();
}

/// A reopen by name whose OPEN raced a name change through the mount that nothing made wait
/// (here a directory above the file moves, and another file takes the old path): the OPEN
/// went to the old path, so its result is not kept and the file is opened again under its
/// new name. (The lost write used to go into the other file.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopen_that_raced_a_rename_opens_the_file_under_its_new_name() {
    let h = Harness::new();
    let d = h.mkdir(ROOT, "d").await;
    let (_, fh) = h.create(d, "f").await;
    h.write(fh, 0, b"------").await;
    h.fs.flush(fh).await.unwrap();
    write_lost_at_a_drop(&h, fh, 0, b"data").await;
    h.plan.hold(ROp::Open);
    h.plan.restore();
    h.plan.until_held(ROp::Open, 1).await;
    // The reopen has looked up "d/f"; before its OPEN is carried out the directory moves,
    // and another "d/f" is made (all through the mount, on the server as such).
    h.fs.rename(ROOT, os("d"), ROOT, os("e"), 0).await.unwrap();
    std::fs::create_dir(h.disk("d")).unwrap();
    std::fs::write(h.disk("d/f"), b"other file").unwrap();
    h.plan.release(ROp::Open);
    until_sent_again(&h).await;
    h.fs.flush(fh)
        .await
        .expect("the lost write was sent again to the file, under its new name");
    assert_eq!(std::fs::read(h.disk("e/f")).unwrap(), b"data--");
    assert_eq!(std::fs::read(h.disk("d/f")).unwrap(), b"other file");
    h.fs.release(fh).await.unwrap();
}

/// A lost write whose file cannot be opened again for a reason a connection would not
/// change (removed on the server during the outage) fails at once and is reported; it used
/// to be taken for "no connection yet" and tried again every second, forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_write_whose_file_is_gone_is_reported_not_retried() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "f").await;
    write_lost_at_a_drop(&h, fh, 0, b"data").await;
    std::fs::remove_file(h.disk("f")).unwrap();
    h.plan.restore();
    let file = h.fs.file(fh).unwrap();
    // (It used to stay lost, put back for the next try, forever.)
    eventually("the lost write failed for good", || {
        !file.stream.has_lost_writes()
    })
    .await;
    // Nothing tries it again (a patient retry came every second).
    let opens = h.plan.calls(ROp::Open);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        h.plan.calls(ROp::Open),
        opens,
        "tried again after it failed"
    );
    assert!(
        h.fs.flush(fh).await.is_err(),
        "the lost write was not reported"
    );
    let _ = h.fs.release(fh).await;
}

/// An attribute change behind the writes of a file created `O_EXCL|O_APPEND`, lost at a
/// drop, is sent again (setting attributes twice is setting them once); only data through an
/// append handle cannot be, since the server would append it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_attribute_change_through_an_append_handle_is_sent_again() {
    let h = Harness::new();
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_APPEND;
    let (ino, fh) = h.create_with(ROOT, "log", flags).await;
    h.plan.disconnect_after_next(ROp::Fsetstat);
    h.fs.setattr(
        ino,
        Some(fh),
        SetattrRequest {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    until_disconnected(&h).await;
    h.plan.restore();
    h.fs.flush(fh)
        .await
        .expect("a lost attribute change is sent again, not reported");
    let mode = std::fs::metadata(h.disk("log"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    h.fs.release(fh).await.unwrap();
}

/// A rename cut off by a lost connection may or may not have been carried out, and the inode
/// table cannot tell: the file that had the name is not opened by it again, so a write it had
/// waiting is reported, never sent into the file that may have the name now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_cut_off_by_a_drop_keeps_the_old_files_writes_out_of_the_new_one() {
    let h = Harness::new();
    let (_, fh) = h.create(ROOT, "b").await;
    h.write(fh, 0, b"old version").await;
    h.fs.flush(fh).await.unwrap();
    let (_, t) = h.create(ROOT, "b.tmp").await;
    h.write(t, 0, b"NEW VERSION").await;
    h.fs.flush(t).await.unwrap();
    h.fs.release(t).await.unwrap();
    // A write of the old file waits at the server's door...
    h.plan.hold(ROp::Write);
    h.write(fh, 0, b"OLD").await;
    h.plan.until_held(ROp::Write, 1).await;
    // ...while the rename over its name is carried out and its answer lost with the
    // connection.
    h.plan.disconnect_after_next(ROp::Rename);
    let renamed = h.fs.rename(ROOT, os("b.tmp"), ROOT, os("b"), 0).await;
    assert!(
        renamed.is_err(),
        "the rename's outcome is unknown: {renamed:?}"
    );
    h.plan.restore();
    h.plan.release(ROp::Write);
    assert!(
        h.fs.flush(fh).await.is_err(),
        "the write of a file whose name is no longer known was not reported"
    );
    assert_eq!(std::fs::read(h.disk("b")).unwrap(), b"NEW VERSION");
    let _ = h.fs.release(fh).await;
}

/// Renames and unlinks elsewhere on the mount (an `rm -rf` in another directory) do not
/// disturb a reopen: only a change of the file's own name, or of a directory above it,
/// makes it open again (they used to, and enough of them failed the lost write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopen_is_not_disturbed_by_name_changes_elsewhere() {
    let h = Harness::new();
    let junk = h.mkdir(ROOT, "junk").await;
    for i in 0..20 {
        let (_, x) = h.create(junk, format!("x{i}")).await;
        h.fs.release(x).await.unwrap();
    }
    let (_, fh) = h.create(ROOT, "f").await;
    h.write(fh, 0, b"------").await;
    h.fs.flush(fh).await.unwrap();
    write_lost_at_a_drop(&h, fh, 0, b"data").await;
    h.plan.hold(ROp::Open);
    h.plan.restore();
    h.plan.until_held(ROp::Open, 1).await;
    let opens = h.plan.calls(ROp::Open);
    for i in 0..20 {
        h.fs.unlink(junk, OsStr::new(&format!("x{i}")))
            .await
            .unwrap();
    }
    h.fs.rename(ROOT, os("junk"), ROOT, os("junk2"), 0)
        .await
        .unwrap();
    h.plan.release(ROp::Open);
    until_sent_again(&h).await;
    h.fs.flush(fh).await.expect("the lost write was sent again");
    assert_eq!(std::fs::read(h.disk("f")).unwrap(), b"data--");
    assert_eq!(
        h.plan.calls(ROp::Open),
        opens,
        "the reopen was done again for name changes elsewhere"
    );
    h.fs.release(fh).await.unwrap();
}

mod copy;
mod early_create;
mod walk;

/// Times set through the mount read back as they were set, nanoseconds and times outside
/// SFTP v3's range (before 1970, past 2106) included, while the server keeps the whole
/// seconds it was given: by path, through the sole descriptor that created the file
/// (queued behind its writes), and with no attribute cache (asked of the server each time).
/// A write, a truncate or a change of the time on the server gives the server's times back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_set_read_back_as_set_while_the_server_keeps_them() {
    let h = Harness::with(
        config(CacheConfig {
            attr_ttl: Duration::ZERO,
            ..long_ttls()
        }),
        None,
    );
    let times = |atime: SystemTime, mtime: SystemTime| SetattrRequest {
        atime: Some(TimeSpec::At(atime)),
        mtime: Some(TimeSpec::At(mtime)),
        ..Default::default()
    };
    let fs = Arc::clone(&h.fs);
    let shown = |ino: Ino| {
        let fs = Arc::clone(&fs);
        async move {
            let (a, _) = fs.getattr(ino, None).await.unwrap();
            (a.atime, a.mtime)
        }
    };
    let precise = UNIX_EPOCH + Duration::new(1_500_000_000, 123_456_789);
    let before_1970 = UNIX_EPOCH - Duration::new(0, 999_999_500);
    let past_2106 = UNIX_EPOCH + Duration::new(1 << 32, 7);

    // By path.
    std::fs::write(h.disk("f"), b"data").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let a =
        h.fs.setattr(f, None, times(precise, past_2106))
            .await
            .unwrap();
    assert_eq!((a.atime, a.mtime), (precise, past_2106), "answer");
    assert_eq!(shown(f).await, (precise, past_2106), "asked again");
    let m = h.meta("f");
    assert_eq!((m.atime(), m.atime_nsec()), (1_500_000_000, 0), "server");
    assert_eq!(
        m.mtime(),
        u32::MAX as i64,
        "server: the most SFTP v3 carries"
    );
    // One of the two only: the other stays as set.
    h.fs.setattr(
        f,
        None,
        SetattrRequest {
            mtime: Some(TimeSpec::At(before_1970)),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(shown(f).await, (precise, before_1970), "mtime only");

    // Changed on the server: the server's times.
    let later = UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    let file = std::fs::File::options()
        .write(true)
        .open(h.disk("f"))
        .unwrap();
    file.set_times(
        std::fs::FileTimes::new()
            .set_accessed(later)
            .set_modified(later),
    )
    .unwrap();
    assert_eq!(shown(f).await, (later, later), "set on the server");

    // A write through the mount moves the mtime to the server's, even if that is within
    // the second set; the atime stays as set.
    let whole = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().subsec_nanos() == 0;
    let now = SystemTime::now();
    let now_secs = UNIX_EPOCH + Duration::from_secs(secs(now));
    h.fs.setattr(f, None, times(precise, now)).await.unwrap();
    let fh = h.open(f, libc::O_WRONLY).await;
    h.write(fh, 0, b"DATA").await;
    h.fs.flush(fh).await.unwrap();
    let (atime, mtime) = shown(f).await;
    assert_eq!(atime, precise, "atime after a write");
    assert!(
        whole(mtime),
        "mtime after a write: the server's ({mtime:?}, set {now:?})"
    );
    assert!(mtime >= now_secs, "{mtime:?}");
    // So do a truncate (by size; as ftruncate, with the mtime "now"), and an open with
    // O_TRUNC.
    let ftruncate = SetattrRequest {
        size: Some(1),
        mtime: Some(TimeSpec::Now),
        ..Default::default()
    };
    let by_size = SetattrRequest {
        size: Some(2),
        ..Default::default()
    };
    for (what, req) in [("ftruncate", ftruncate), ("truncate", by_size)] {
        h.fs.setattr(f, Some(fh), times(precise, SystemTime::now()))
            .await
            .unwrap();
        h.fs.setattr(f, Some(fh), req).await.unwrap();
        let (_, mtime) = shown(f).await;
        assert!(whole(mtime), "mtime after {what}: {mtime:?}");
    }
    h.fs.release(fh).await.unwrap();
    h.fs.setattr(f, None, times(precise, SystemTime::now()))
        .await
        .unwrap();
    let (_, fh) = h
        .create_with(ROOT, "f", libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC)
        .await;
    let (_, mtime) = shown(f).await;
    assert!(whole(mtime), "mtime after O_TRUNC: {mtime:?}");
    h.fs.release(fh).await.unwrap();
    // "Now" (touch) stays in whole seconds, as a write's time does: a file touched and one
    // written right after show in that order, or equal.
    let touch = SetattrRequest {
        atime: Some(TimeSpec::Now),
        mtime: Some(TimeSpec::Now),
        ..Default::default()
    };
    let a = h.fs.setattr(f, None, touch).await.unwrap();
    assert!(whole(a.mtime) && whole(a.atime), "touch: {a:?}");
    // A directory's mtime moves with every name made in it: its times are the server's.
    let d = h.mkdir(ROOT, "d").await;
    let a =
        h.fs.setattr(d, None, times(precise, precise))
            .await
            .unwrap();
    let precise_secs = UNIX_EPOCH + Duration::from_secs(secs(precise));
    assert_eq!((a.atime, a.mtime), (precise_secs, precise_secs), "dir");

    // Through the descriptor that created the file (futimens after the writes, as cp -p
    // does): queued behind them, and read back as set.
    let (g, gh) = h.create(ROOT, "g").await;
    h.write(gh, 0, b"copied").await;
    let a =
        h.fs.setattr(g, None, times(before_1970, precise))
            .await
            .unwrap();
    assert_eq!((a.atime, a.mtime), (before_1970, precise), "queued: answer");
    h.fs.release(gh).await.unwrap();
    assert_eq!(
        shown(g).await,
        (before_1970, precise),
        "queued: asked again"
    );
    assert_eq!(h.meta("g").mtime(), 1_500_000_000);
    // One that fails on the server is not kept (set to now, the second the server's
    // write gave the file, so that only the mount's memory could show it).
    let (g, gh) = h.create(ROOT, "g2").await;
    h.write(gh, 0, b"copied").await;
    h.plan.fail_next(ROp::Fsetstat, 1, failure("injected"));
    let now = SystemTime::now();
    h.fs.setattr(g, None, times(now, now)).await.unwrap();
    assert!(h.fs.release(gh).await.is_err(), "the failure is reported");
    let (atime, mtime) = shown(g).await;
    assert!(whole(atime) && whole(mtime), "failed: {atime:?} {mtime:?}");
}

/// A size past `i64::MAX` (only a broken or hostile server says so) is shown as `i64::MAX`:
/// the kernel would take the inode for broken and answer EIO for it until it is forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_size_past_the_largest_file_is_shown_as_the_largest() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"x").unwrap();
    let f = h.lookup(ROOT, "f").await;
    let huge = crate::remote::Attrs {
        size: Some(u64::MAX),
        mode: Some(libc::S_IFREG | 0o644),
        ..Default::default()
    };
    let attr = h.fs.make_attr(f, &huge, None);
    assert_eq!(attr.size, i64::MAX as u64);
    assert_eq!(attr.blocks, (i64::MAX as u64).div_ceil(512));
}

/// A change on the server shows within the TTLs of when the mount learnt what it shows, not
/// of when it last used it: attributes answered from a cached listing (by a lookup, or a
/// readdirplus of a directory opened earlier), from the attribute cache (getattr), or derived
/// from cached ones by a chmod, are kept by the mount and the kernel only for what is left
/// of their lifetime. (Each use started it again: a listing taken at 0 and used at 19 s kept
/// its sizes until 39 s, and a chmod every few seconds kept an old size for ever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_was_learnt_earlier_is_kept_only_for_what_is_left_of_its_ttl() {
    let ttl = Duration::from_secs(60);
    let h = Harness::with(
        config(CacheConfig {
            attr_ttl: ttl,
            entry_ttl: ttl,
            dir_ttl: ttl,
            ..long_ttls()
        }),
        None,
    );
    for name in ["a", "b", "c"] {
        std::fs::write(h.disk(name), b"x").unwrap();
    }
    let gap = Duration::from_millis(50);
    let left = |since: std::time::Instant| ttl - since.elapsed();
    // A listing, used later by a lookup and by a readdirplus of the handle opened then.
    let dh = h.fs.opendir(ROOT).await.unwrap();
    let listed = std::time::Instant::now();
    std::thread::sleep(gap);
    let bound = left(listed);
    let e = h.fs.lookup(ROOT, os("a")).await.unwrap();
    assert!(e.attr_ttl <= bound, "lookup: {:?} > {bound:?}", e.attr_ttl);
    assert!(e.entry_ttl <= bound, "lookup: name kept {:?}", e.entry_ttl);
    assert!(
        h.fs.kernel_attr_ttl(e.attr.ino) <= bound,
        "the mount's copy"
    );
    let items = h.fs.readdir(dh, 0).await.unwrap();
    let b = items.iter().find(|i| i.name == "b").unwrap();
    let bound = left(listed);
    let e = h.fs.readdirplus_entry(ROOT, b).await.unwrap();
    assert!(
        e.attr_ttl <= bound,
        "readdirplus: {:?} > {bound:?}",
        e.attr_ttl
    );
    h.fs.releasedir(dh);
    // A getattr answered from the cache, and a chmod derived from it.
    let c = e.attr.ino;
    let learnt = std::time::Instant::now();
    h.fs.forget(c, 0);
    let _ = h.fs.getattr(c, None).await.unwrap();
    std::thread::sleep(gap);
    let bound = left(learnt);
    let (_, kept) = h.fs.getattr(c, None).await.unwrap();
    assert!(
        kept <= bound,
        "getattr from the cache: {kept:?} > {bound:?}"
    );
    h.fs.setattr(c, None, chmod(0o600)).await.unwrap();
    let kept = h.fs.kernel_attr_ttl(c);
    assert!(kept <= left(learnt), "chmod: {kept:?}");
}

/// A readdirplus of a directory opened before a file in it changed through the mount shows
/// the file as it is now, not as the listing of then had it (an append, which leaves no
/// attributes cached).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readdirplus_after_a_change_through_the_mount_shows_the_change() {
    let h = Harness::new();
    std::fs::write(h.disk("log"), b"one\n").unwrap();
    let f = h.lookup(ROOT, "log").await;
    let dh = h.fs.opendir(ROOT).await.unwrap();
    let fh = h.open(f, libc::O_WRONLY | libc::O_APPEND).await;
    h.write(fh, 0, b"two\n").await;
    h.fs.release(fh).await.unwrap();
    let items = h.fs.readdir(dh, 0).await.unwrap();
    let item = items.iter().find(|i| i.name == "log").unwrap();
    let e = h.fs.readdirplus_entry(ROOT, item).await.unwrap();
    assert_eq!(e.attr.size, 8, "the size after the append");
    h.fs.releasedir(dh);
}

/// An attribute answer of the server that was on its way while the file changed through the
/// mount is not kept: a getattr through a descriptor whose FSTAT was answered (by the
/// server) before a chmod through the path, and arrived after it, must not leave the old
/// mode cached for the next `stat`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fstat_answered_before_a_change_is_not_kept_after_it() {
    let h = Harness::new();
    std::fs::write(h.disk("f"), b"x").unwrap();
    std::fs::set_permissions(h.disk("f"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let f = h.lookup(ROOT, "f").await;
    // (For writing: a real server handle, not a copy fetched ahead.)
    let fh = h.open(f, libc::O_RDWR).await;
    h.plan.hold_replies(ROp::Fstat);
    let fs = h.fs.clone();
    let stat = tokio::spawn(async move { fs.getattr(f, Some(fh)).await });
    h.plan.until_held(ROp::Fstat, 1).await;
    h.fs.setattr(f, None, chmod(0o600)).await.unwrap();
    h.plan.release(ROp::Fstat);
    let _ = stat.await.unwrap().unwrap();
    let (a, _) = h.fs.getattr(f, None).await.unwrap();
    assert_eq!(a.perm, 0o600, "the mode after the chmod");
    h.fs.release(fh).await.unwrap();
}

/// `-o uid=N,gid=N,umask=M` (libfuse's options, on sshfs command lines): every file is shown
/// with that owner, and without the masked permission bits; the server's are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shown_owner_and_umask_apply_to_every_file() {
    let h = Harness::with(
        FsConfig {
            shown_uid: Some(4242),
            shown_gid: Some(4343),
            shown_umask: 0o027,
            ..config(long_ttls())
        },
        None,
    );
    std::fs::write(h.disk("f"), b"x").unwrap();
    std::fs::set_permissions(h.disk("f"), std::fs::Permissions::from_mode(0o666)).unwrap();
    let f = h.lookup(ROOT, "f").await;
    let (a, _) = h.fs.getattr(f, None).await.unwrap();
    assert_eq!((a.uid, a.gid, a.perm), (4242, 4343, 0o640));
    assert_eq!(h.meta("f").permissions().mode() & 0o777, 0o666);
    // A chgrp sends the server's own owner with the new group, not the one shown.
    // (The tests run as root, which may give a file to any group.)
    let owner = h.meta("f").uid();
    let chgrp = SetattrRequest {
        gid: Some(12345),
        ..Default::default()
    };
    h.fs.setattr(f, None, chgrp).await.unwrap();
    assert_eq!(
        (h.meta("f").uid(), h.meta("f").gid()),
        (owner, 12345),
        "the owner on the server"
    );
}

/// Without a listing cache (`dir_cache=no`), a readdirplus of a directory in which a name
/// changed since it was opened still looks up a file with links made on the server: the
/// listing the handle keeps may show it as it was before a write through another name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readdirplus_without_listing_cache_looks_up_a_changed_server_linked_file() {
    let h = Harness::with(config(long_ttls_listings(false)), None);
    std::fs::write(h.disk("x"), b"data").unwrap();
    std::fs::hard_link(h.disk("x"), h.disk("y")).unwrap();
    let x = h.lookup(ROOT, "x").await;
    let dh = h.fs.opendir(ROOT).await.unwrap();
    let items = h.fs.readdir(dh, 0).await.unwrap();
    let fh = h.open(x, libc::O_WRONLY).await;
    h.write(fh, 0, b"longer data").await;
    h.fs.release(fh).await.unwrap();
    // A name made in the directory since it was opened (nothing the mount would look
    // every entry up again for, without a listing cache).
    let (_, other) = h.create(ROOT, "other").await;
    h.fs.release(other).await.unwrap();
    let item = items.iter().find(|i| i.name == "y").unwrap();
    assert_eq!(item.nlink, Some(2), "the listing counts y's links");
    let e = h.fs.readdirplus_entry(ROOT, item).await.unwrap();
    assert_eq!(e.attr.size, 11, "y, listed before the write through x");
    h.fs.releasedir(dh);
}
