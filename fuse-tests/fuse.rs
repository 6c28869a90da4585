//! FUSE integration tests: the `awcp-mount` binary mounting a private OpenSSH sshd's export on
//! 127.0.0.1 (see `common/sshd.rs` and `common/mount.rs`), exercised through the kernel with
//! ordinary system calls and checked against the exported directory read directly from disk.
//!
//! Needs root, `/dev/fuse`, `fusermount3`, `/usr/sbin/sshd` and `ssh-keygen`. Each test starts
//! its own sshd (~100 ms) and mounts on its own mount point, so tests run in parallel threads.
//!
//! Cross-side visibility: the default attribute/entry TTL is 20 s (as sshfs's own cache). Tests that look at
//! changes made on the other side mount with [`NO_CACHE`] (all TTLs 0), except
//! `server_changes_show_after_the_ttl`, which mounts with 1 s TTLs and waits them out on purpose.
//!
//! Policy: every mount gets `--policy` with its own temporary directory as the mount root
//! (see `common/mount.rs`), except the AWCP reference command line, which runs verbatim under
//! the built-in policy on a mount point below `/var/lib/awcp/mounts`. Symlinks are under the
//! built-in `contain` mode; the policy's own rules are not what this file tests.

mod common;

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::mapping::Mapping;
use common::mount::{
    base_args, fstypes_at, is_awcp_mounted, is_mounted, mount_status, opt_path, os, pid_alive,
    poll_until, run_ok, run_with_deadline, standard_args, status_counter, try_run_with_deadline,
    Launch, MountFailure, TestMount, BIN, NO_CACHE,
};
use common::sshd::TestSshd;
use nix::sys::signal::Signal;

const EXIT_TIMEOUT: Duration = Duration::from_secs(15);
/// The built-in policy's mount root.
const DEFAULT_MOUNT_ROOT: &str = "/var/lib/awcp/mounts";

// ------------------------------------------------------------------ helpers

/// Deterministic pseudo-random bytes (xorshift64*), different for each seed.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// FNV-1a, to report large contents by checksum instead of dumping them.
fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Compare two large buffers without printing them.
#[track_caller]
fn assert_same_bytes(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let first = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "{what}: {} bytes (checksum {:x}) instead of {} bytes (checksum {:x}); first \
             difference at {first:?}",
            got.len(),
            checksum(got),
            want.len(),
            checksum(want)
        );
    }
}

/// The errno of a result (0 for success).
fn errno_of<T>(r: io::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => code_of(e),
    }
}

#[track_caller]
fn assert_errno<T: std::fmt::Debug>(r: io::Result<T>, want: i32, what: &str) {
    match r {
        Ok(v) => panic!("{what}: succeeded ({v:?}), expected {}", errno_name(want)),
        Err(e) => assert_eq!(
            e.raw_os_error(),
            Some(want),
            "{what}: got {e}, expected {}",
            errno_name(want)
        ),
    }
}

fn errno_name(e: i32) -> String {
    if e == 0 {
        return "success".into();
    }
    format!("{} ({e})", io::Error::from_raw_os_error(e))
}

/// fsync a directory of the mount: unlinks in it answered early have reached the server when
/// this returns (see SEMANTICS.md), as a program that wants them durable would do.
fn sync_dir(dir: &Path) {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .unwrap_or_else(|e| panic!("fsync of {}: {e}", dir.display()));
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn last_os_error(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
    let (a, b) = (cpath(from), cpath(to));
    // SAFETY: valid NUL-terminated paths, AT_FDCWD.
    last_os_error(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    })
}

fn mkfifo(p: &Path) -> io::Result<()> {
    let c = cpath(p);
    // SAFETY: valid NUL-terminated path.
    last_os_error(unsafe { libc::mknod(c.as_ptr(), libc::S_IFIFO | 0o644, 0) })
}

fn access(p: &Path, mode: libc::c_int) -> io::Result<()> {
    let c = cpath(p);
    // SAFETY: valid NUL-terminated path.
    last_os_error(unsafe { libc::access(c.as_ptr(), mode) })
}

fn truncate_path(p: &Path, len: i64) -> io::Result<()> {
    let c = cpath(p);
    // SAFETY: valid NUL-terminated path.
    last_os_error(unsafe { libc::truncate(c.as_ptr(), len) })
}

/// utimensat(2); `None` is UTIME_OMIT.
fn set_times(p: &Path, atime: Option<(i64, i64)>, mtime: Option<(i64, i64)>) -> io::Result<()> {
    let ts = |t: Option<(i64, i64)>| match t {
        Some((s, ns)) => libc::timespec {
            tv_sec: s as libc::time_t,
            tv_nsec: ns as _,
        },
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT as _,
        },
    };
    let times = [ts(atime), ts(mtime)];
    let c = cpath(p);
    // SAFETY: valid path and a two-element array.
    last_os_error(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) })
}

/// The names in a directory as its listing gives them (sorted), each with what `of` says
/// of the type the listing gives.
fn listed_types<T>(dir: &Path, of: impl Fn(fs::FileType) -> T) -> Vec<(OsString, T)> {
    let mut v: Vec<(OsString, T)> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| {
            let e = e.unwrap();
            (e.file_name(), of(e.file_type().unwrap()))
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Names in a directory.
fn names(dir: &Path) -> Vec<OsString> {
    let mut v: Vec<OsString> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name())
        .collect();
    v.sort();
    v
}

/// Name -> one-letter type ('f', 'd', 'l', '?') from readdir's d_type.
fn typed_listing(dir: &Path) -> BTreeMap<OsString, char> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            let c = if t.is_symlink() {
                'l'
            } else if t.is_dir() {
                'd'
            } else if t.is_file() {
                'f'
            } else {
                '?'
            };
            (e.file_name(), c)
        })
        .collect()
}

/// A fresh ed25519 key (not in authorized_keys) in `dir`, with a certificate signed by the
/// sshd's user CA (as `TestSshd::sign_user_cert` does for the authorized key). Returns
/// (private key, certificate).
fn fresh_key_with_cert(
    sshd: &TestSshd,
    dir: &Path,
    name: &str,
    principal: &str,
    validity: &str,
) -> (PathBuf, PathBuf) {
    let key = dir.join(name);
    let (st, _, err) = run_with_deadline(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
            .arg(&key),
        Duration::from_secs(10),
    );
    assert!(st.success(), "ssh-keygen: {err}");
    let (st, _, err) = run_with_deadline(
        Command::new("ssh-keygen")
            .arg("-q")
            .arg("-s")
            .arg(&sshd.ca_key_path)
            .args(["-I", name, "-n", principal, "-V", validity])
            .arg(key.with_extension("pub")),
        Duration::from_secs(10),
    );
    assert!(st.success(), "ssh-keygen -s: {err}");
    let cert = dir.join(format!("{name}-cert.pub"));
    assert!(cert.is_file());
    (key, cert)
}

/// A mount that must fail in daemon mode: non-zero exit, the message on stderr, nothing
/// mounted, no process left.
#[track_caller]
fn expect_failure(
    args: impl FnOnce(&Path) -> Vec<OsString>,
    fragments: &[&str],
    what: &str,
) -> String {
    let mut argv_seen = Vec::new();
    let mut target = PathBuf::new();
    let mut mounts_before = Vec::new();
    let result = TestMount::launch(false, Path::new("/"), |mnt| {
        let a = args(mnt);
        argv_seen = a.clone();
        // What is mounted at the mount point argument before the attempt.
        target = PathBuf::from(&a[1]);
        mounts_before = fstypes_at(&target);
        a
    });
    let f: MountFailure = match result {
        Ok(m) => panic!("{what}: mounted, expected a failure ({:?})", m.args),
        Err(f) => f,
    };
    let status = f
        .status
        .unwrap_or_else(|| panic!("{what}: did not exit: {}", f.stderr));
    assert!(!status.success(), "{what}: exit status {status}");
    assert_eq!(
        status.code(),
        Some(1),
        "{what}: exit status {status}; stderr: {}",
        f.stderr
    );
    eprintln!("{what}: {}", f.stderr.trim_end());
    let lower = f.stderr.to_lowercase();
    for frag in fragments {
        assert!(
            lower.contains(&frag.to_lowercase()),
            "{what}: stderr does not mention {frag:?}: {}",
            f.stderr
        );
    }
    assert!(
        f.stderr.starts_with("awcp-mount: "),
        "{what}: stderr: {}",
        f.stderr
    );
    assert!(
        !f.left_mounted,
        "{what}: something was mounted: {}",
        f.stderr
    );
    assert!(
        !f.process_left,
        "{what}: a mount process stayed behind ({argv_seen:?})"
    );
    assert_eq!(
        fstypes_at(&target),
        mounts_before,
        "{what}: mounts at {}",
        target.display()
    );
    f.stderr
}

// ------------------------------------------------------------------ data

#[test]
fn data_both_ways() {
    let m = TestMount::start(&[NO_CACHE]);

    // Mount -> server.
    fs::write(m.p("a.txt"), b"hello from the mount\n").unwrap();
    assert_eq!(fs::read(m.e("a.txt")).unwrap(), b"hello from the mount\n");
    // Overwrite with truncation (O_TRUNC), shorter.
    fs::write(m.p("a.txt"), b"short").unwrap();
    assert_eq!(fs::read(m.e("a.txt")).unwrap(), b"short");
    assert_eq!(fs::metadata(m.p("a.txt")).unwrap().len(), 5);

    // Server -> mount: a name first looked up while missing, then created on the server.
    assert_errno(
        fs::metadata(m.p("b.txt")),
        libc::ENOENT,
        "stat before creation",
    );
    fs::write(m.e("b.txt"), b"hello from the server").unwrap();
    assert_eq!(fs::read(m.p("b.txt")).unwrap(), b"hello from the server");
    // Changed on the server (longer, then shorter): new size and content at once.
    fs::write(
        m.e("b.txt"),
        b"changed on the server, and longer than before",
    )
    .unwrap();
    assert_eq!(
        fs::read(m.p("b.txt")).unwrap(),
        b"changed on the server, and longer than before"
    );
    fs::write(m.e("b.txt"), b"tiny").unwrap();
    assert_eq!(fs::metadata(m.p("b.txt")).unwrap().len(), 4);
    assert_eq!(fs::read(m.p("b.txt")).unwrap(), b"tiny");
    // Removed on the server.
    fs::remove_file(m.e("b.txt")).unwrap();
    assert_errno(
        fs::metadata(m.p("b.txt")),
        libc::ENOENT,
        "stat after server-side unlink",
    );
    assert_errno(
        File::open(m.p("b.txt")),
        libc::ENOENT,
        "open after server-side unlink",
    );

    // Directories both ways.
    fs::create_dir(m.p("made-here")).unwrap();
    assert!(m.e("made-here").is_dir());
    fs::create_dir(m.e("made-there")).unwrap();
    fs::write(m.e("made-there/inner"), b"inner").unwrap();
    assert_eq!(names(&m.p("made-there")), vec![OsString::from("inner")]);
    assert_eq!(fs::read(m.p("made-there/inner")).unwrap(), b"inner");
    assert_eq!(
        names(&m.mnt),
        names(&m.export),
        "listing of the root differs from the server's"
    );
}

/// `grep -r` / `cp -r` read a directory file by file: after the second file the next small
/// files are fetched ahead and their opens answered from memory. Contents must be exactly the
/// server's, and a file written through the mount afterwards must read back as written.
#[test]
fn small_files_read_one_by_one_are_fetched_ahead_and_stay_coherent() {
    let m = TestMount::start(&[]);
    fs::create_dir(m.e("src")).unwrap();
    for i in 0..40u64 {
        fs::write(m.e(format!("src/f{i}")), pattern(i, 100 + 37 * i as usize)).unwrap();
    }
    fs::create_dir(m.e("sub")).unwrap();
    for i in 0..6u64 {
        fs::write(m.e(format!("sub/g{i}")), pattern(100 + i, 4000)).unwrap();
    }
    let mut names: Vec<_> = fs::read_dir(m.p("src"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    let want = |name: &OsString| fs::read(m.e("src").join(name)).unwrap();
    for name in &names[..2] {
        assert_eq!(fs::read(m.p("src").join(name)).unwrap(), want(name));
    }
    // (Only the count below depends on the fetches having run; the contents never do.)
    std::thread::sleep(Duration::from_millis(500));
    for name in &names[2..] {
        let got = fs::read(m.p("src").join(name)).unwrap();
        assert_same_bytes(&got, &want(name), &format!("src/{name:?}"));
    }
    let fetched = status_counter(&m.mnt, "opens_fetched_ahead");
    assert!(
        fetched >= 20,
        "only {fetched} of 38 opens were fetched ahead"
    );

    // Written through the mount after it was fetched (same size): read back as written.
    let dir = m.p("sub");
    let mut sub: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    sub.sort();
    fs::read(&sub[0]).unwrap();
    fs::read(&sub[1]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let new = pattern(999, 4000);
    fs::write(&sub[2], &new).unwrap();
    assert_same_bytes(&fs::read(&sub[2]).unwrap(), &new, "written after the fetch");
    assert_same_bytes(
        &fs::read(&sub[3]).unwrap(),
        &fs::read(m.e("sub").join(sub[3].file_name().unwrap())).unwrap(),
        "untouched neighbour",
    );
}

/// `git status` rehashes files in index order (by name), which is not the order the server
/// lists a directory in: the files fetched ahead follow the order the tool reads in, so in a
/// directory bigger than the read-ahead window nearly every open is answered from memory.
#[test]
fn small_files_read_by_name_are_fetched_ahead_in_that_order() {
    let m = TestMount::start(&[]);
    fs::create_dir(m.e("big")).unwrap();
    // Created in a scrambled order, so that no listing order the server might use (hash,
    // creation or its reverse) is the order by name.
    const FILES: u64 = 150;
    for k in 0..FILES {
        let i = (k * 67) % FILES;
        fs::write(m.e(format!("big/f{i:03}")), pattern(i, 500)).unwrap();
    }
    let listed: Vec<_> = fs::read_dir(m.p("big"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let mut names = listed.clone();
    names.sort();
    assert_ne!(listed, names, "the server lists the directory by name");
    let before = status_counter(&m.mnt, "opens_fetched_ahead");
    for name in &names {
        let got = fs::read(m.p("big").join(name)).unwrap();
        assert_same_bytes(
            &got,
            &fs::read(m.e("big").join(name)).unwrap(),
            &format!("big/{name:?}"),
        );
    }
    let fetched = status_counter(&m.mnt, "opens_fetched_ahead") - before;
    assert!(
        fetched >= FILES - 10,
        "only {fetched} of {FILES} opens in name order were answered from files fetched ahead"
    );
}

/// `rm -rf` through the mount: its unlinks are answered before the server's REMOVE, and each
/// rmdir waits for them, so the tree is gone on the server when `rm` returns. A name unlinked
/// and made again, and an unlink followed by fsync of its directory, reach the server in order.
#[test]
fn rm_rf_and_unlinks_answered_early_reach_the_server() {
    let m = TestMount::start(&[]);
    for d in 0..4 {
        fs::create_dir_all(m.e(format!("tree/d{d}/sub"))).unwrap();
        for f in 0..15 {
            fs::write(m.e(format!("tree/d{d}/f{f}")), pattern(f, 100)).unwrap();
        }
        fs::write(m.e(format!("tree/d{d}/sub/deep")), b"deep").unwrap();
        std::os::unix::fs::symlink("f0", m.e(format!("tree/d{d}/link"))).unwrap();
    }
    fs::write(m.e("again"), b"old").unwrap();
    fs::write(m.e("synced"), b"x").unwrap();
    fs::remove_dir_all(m.p("tree")).unwrap();
    assert!(
        !m.e("tree").exists(),
        "rm -rf returned before the server removed the tree"
    );
    let early = status_counter(&m.mnt, "unlinks_behind");
    assert!(
        early >= 60,
        "only {early} of 68 unlinks were answered early"
    );

    // Unlinked, then made again with O_EXCL: the new file is the one left.
    assert_eq!(fs::read(m.p("again")).unwrap(), b"old");
    fs::remove_file(m.p("again")).unwrap();
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.p("again"))
        .unwrap();
    f.write_all(b"new").unwrap();
    drop(f);
    assert_eq!(fs::read(m.e("again")).unwrap(), b"new");

    // Unlinked, then fsync of the directory: gone on the server when fsync returns.
    fs::metadata(m.p("synced")).unwrap();
    fs::remove_file(m.p("synced")).unwrap();
    sync_dir(&m.mnt);
    assert!(!m.e("synced").exists());
    assert!(!names(&m.mnt).contains(&OsString::from("synced")));
}

/// `rm -rf` of a directory the mount's cached listing shows empty, in which a file was put on
/// the server meanwhile: the server refuses (ENOTEMPTY), and from then on the directory shows
/// what is in the way, at once rather than when the listing would have expired.
#[test]
fn a_directory_refused_as_not_empty_shows_what_is_in_it() {
    let m = TestMount::start(&[]);
    fs::create_dir(m.p("d")).unwrap();
    assert!(names(&m.p("d")).is_empty());
    fs::write(m.e("d/made-on-server"), b"x").unwrap();
    assert!(
        names(&m.p("d")).is_empty(),
        "the listing is cached (the premise of this test)"
    );
    assert_errno(fs::remove_dir_all(m.p("d")), libc::ENOTEMPTY, "rm -rf");
    assert_eq!(names(&m.p("d")), [OsString::from("made-on-server")]);
    assert_eq!(fs::read(m.p("d/made-on-server")).unwrap(), b"x");
}

/// tar sets the mtime and mode of every file it extracts through the descriptor that created
/// it; the mount queues those behind the writes. On the server, every file must end up with
/// its content, mode and mtime, read-only ones too.
#[test]
fn untar_keeps_modes_and_mtimes() {
    let m = TestMount::start(&[]);
    let src = tempfile::tempdir().unwrap();
    let modes = [0o600, 0o755, 0o444, 0o640, 0o700];
    for (i, mode) in modes.iter().enumerate() {
        let p = src.path().join(format!("t/f{i}"));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, pattern(i as u64, 3000 * i)).unwrap();
        set_times(&p, None, Some((1_000_000 + i as i64 * 1000, 0))).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(*mode)).unwrap();
    }
    let tar = src.path().join("t.tar");
    let st = Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(src.path())
        .arg("t")
        .status()
        .unwrap();
    assert!(st.success());
    // As root tar also gives each file its owner (`fchown`); the benchmark's tar does not
    // (`--no-same-owner`).
    fs::create_dir(m.p("n")).unwrap();
    for (into, more) in [(m.mnt.clone(), None), (m.p("n"), Some("--no-same-owner"))] {
        let st = Command::new("tar")
            .args(more)
            .arg("-xf")
            .arg(&tar)
            .arg("-C")
            .arg(&into)
            .status()
            .unwrap();
        assert!(st.success(), "tar -x into the mount: {st}");
    }
    let extracted = ["", "n/"].into_iter().flat_map(|dir| {
        modes
            .iter()
            .enumerate()
            .map(move |(i, mode)| (dir, i, mode))
    });
    for (dir, i, mode) in extracted {
        let rel = format!("{dir}t/f{i}");
        // Both before any read of the content, which may move the atime (relatime).
        let on_server = fs::metadata(m.e(&rel)).unwrap();
        let seen = fs::metadata(m.p(&rel)).unwrap();
        assert_eq!(on_server.mode() & 0o7777, *mode, "{rel} mode");
        assert_eq!(
            on_server.mtime(),
            1_000_000 + i as i64 * 1000,
            "{rel} mtime"
        );
        assert_eq!(
            (seen.mode() & 0o7777, seen.mtime(), seen.atime()),
            (*mode, on_server.mtime(), on_server.atime()),
            "{rel}: mode, mtime, atime through the mount"
        );
        assert_same_bytes(
            &fs::read(m.e(&rel)).unwrap(),
            &pattern(i as u64, 3000 * i),
            &rel,
        );
    }
}

#[test]
fn server_changes_show_after_the_ttl() {
    // TTLs of 1 s (the defaults are longer).
    let m = TestMount::start(&[
        "attr_timeout=1",
        "entry_timeout=1",
        "negative_timeout=1",
        "dcache_timeout=1",
    ]);
    fs::write(m.e("grows"), b"abc").unwrap();
    assert_eq!(fs::metadata(m.p("grows")).unwrap().len(), 3);
    assert_errno(
        fs::metadata(m.p("later")),
        libc::ENOENT,
        "stat before creation",
    );
    // A listing is cached too (opendir is answered from it until it expires).
    assert!(!names(&m.p("")).contains(&OsString::from("later")));
    fs::write(m.e("grows"), b"abcdefghij").unwrap();
    fs::write(m.e("later"), b"now here").unwrap();
    // The TTL is what is tested here: wait it out.
    std::thread::sleep(Duration::from_millis(1300));
    assert!(
        names(&m.p("")).contains(&OsString::from("later")),
        "listing after the TTL"
    );
    assert_eq!(fs::metadata(m.p("grows")).unwrap().len(), 10);
    assert_eq!(fs::read(m.p("grows")).unwrap(), b"abcdefghij");
    assert_eq!(fs::read(m.p("later")).unwrap(), b"now here");
    // The mount's own changes are visible through it at once, whatever the TTL.
    fs::write(m.p("grows"), b"0123456789abcdef").unwrap();
    assert_eq!(fs::metadata(m.p("grows")).unwrap().len(), 16);
    fs::remove_file(m.p("later")).unwrap();
    assert_errno(
        fs::metadata(m.p("later")),
        libc::ENOENT,
        "stat after unlink",
    );
}

/// `stat` of each of `names` in `dir` of the mount fails with ENOENT, `times` times over;
/// returns how many requests the kernel sent the mount meanwhile.
fn requests_for_absent_names(m: &TestMount, dir: &str, names: &[&str], times: usize) -> u64 {
    let before = status_counter(&m.mnt, "ops");
    for _ in 0..times {
        for n in names {
            assert_errno(
                fs::metadata(m.p(format!("{dir}/{n}"))),
                libc::ENOENT,
                &format!("stat of {dir}/{n}, absent"),
            );
        }
    }
    status_counter(&m.mnt, "ops") - before
}

/// A name found absent is remembered by the kernel (a negative dentry) for as long as the
/// mount's own cache would give the same answer: a compiler's `-I` search asks every
/// directory for the same missing headers, file after file, and each ask was a request to the
/// mount. The mount's own changes to such a name show at once, whatever makes them.
#[test]
fn absent_names_are_remembered_by_the_kernel_until_the_mount_changes_them() {
    let m = TestMount::start(&[]);
    fs::create_dir(m.e("inc")).unwrap();
    fs::write(m.e("inc/there.h"), b"x").unwrap();
    let missing = ["a.h", "b", "c", "d", "e"];
    requests_for_absent_names(&m, "inc", &missing, 1);
    let asked = requests_for_absent_names(&m, "inc", &missing, 20);
    // 100 stats. (Each lapse of the 5 s negative TTL, on a machine that stalls that long,
    // costs one request per name: the bound leaves room for three.)
    assert!(
        asked < 20,
        "{asked} requests for 100 stats of names known to be absent"
    );
    // The mount's own changes take the place of what the kernel kept, at once.
    fs::write(m.p("inc/a.h"), b"made").unwrap();
    assert_eq!(fs::read(m.p("inc/a.h")).unwrap(), b"made");
    fs::create_dir(m.p("inc/b")).unwrap();
    assert!(fs::metadata(m.p("inc/b")).unwrap().is_dir());
    std::os::unix::fs::symlink("there.h", m.p("inc/c")).unwrap();
    assert_eq!(fs::read(m.p("inc/c")).unwrap(), b"x");
    fs::hard_link(m.p("inc/there.h"), m.p("inc/d")).unwrap();
    assert_eq!(fs::read(m.p("inc/d")).unwrap(), b"x");
    fs::rename(m.p("inc/a.h"), m.p("inc/e")).unwrap();
    assert_eq!(fs::read(m.p("inc/e")).unwrap(), b"made");
    assert_errno(
        fs::metadata(m.p("inc/a.h")),
        libc::ENOENT,
        "a.h renamed away",
    );
    assert_eq!(fs::read(m.e("inc/e")).unwrap(), b"made");
    assert!(fs::metadata(m.e("inc/b")).unwrap().is_dir());
}

/// With `negative_timeout=0` nothing absent is remembered, by the kernel either: every `stat`
/// of a missing name is a request to the mount.
#[test]
fn absent_names_are_not_remembered_with_negative_timeout_0() {
    let m = TestMount::start(&["negative_timeout=0"]);
    fs::create_dir(m.e("inc")).unwrap();
    let asked = requests_for_absent_names(&m, "inc", &["a.h"], 20);
    assert!(
        asked >= 20,
        "{asked} requests for 20 stats of a missing name"
    );
}

/// A small file opened for reading gets its first bytes along with the open (the READ sent
/// behind the OPEN, on the handle OpenSSH will give it): each `read` of a file whose size the
/// mount knows costs one round trip, and gives the file's bytes.
#[test]
fn small_files_are_read_along_with_their_open() {
    let m = TestMount::start(&[]);
    let sizes = [0usize, 1, 4096, 70_000, 128 * 1024];
    for (i, len) in sizes.iter().enumerate() {
        fs::create_dir(m.e(format!("d{i}"))).unwrap();
        fs::write(m.e(format!("d{i}/f")), pattern(i as u64, *len)).unwrap();
    }
    for (i, len) in sizes.iter().enumerate() {
        assert_eq!(
            fs::metadata(m.p(format!("d{i}/f"))).unwrap().len(),
            *len as u64
        );
    }
    for (i, len) in sizes.iter().enumerate() {
        let before = status_counter(&m.mnt, "opens_read_along");
        assert_same_bytes(
            &fs::read(m.p(format!("d{i}/f"))).unwrap(),
            &pattern(i as u64, *len),
            &format!("d{i}/f"),
        );
        assert_eq!(
            status_counter(&m.mnt, "opens_read_along") - before,
            1,
            "d{i}/f ({len} bytes) was not read along with its open"
        );
    }
}

/// A file rewritten in place (`open(O_TRUNC)`, write, close), as tools and editors save, then
/// read back: the truncate comes with the open (atomic_o_trunc), the kernel's cached pages of
/// the longer old content are gone, and the read back gets its bytes and attributes along
/// with its open although the writes left them unknown (whether or not the kernel's release
/// of the writing descriptor came first). A write through another descriptor before the
/// rewrite does not show after it (a core test,
/// `open_with_o_trunc_truncates_after_writes_on_their_way`, holds such a write back to check
/// the order).
#[test]
fn rewritten_in_place_and_read_back() {
    let m = TestMount::start(&[]);
    let old = pattern(1, 100_000);
    fs::write(m.p("f"), &old).unwrap();
    assert_same_bytes(&fs::read(m.p("f")).unwrap(), &old, "first read");
    for round in 0..3u64 {
        let new = pattern(10 + round, 3_000 + round as usize);
        fs::write(m.p("f"), &new).unwrap();
        let along = status_counter(&m.mnt, "opens_read_along");
        assert_same_bytes(&fs::read(m.p("f")).unwrap(), &new, "read back");
        assert_eq!(
            status_counter(&m.mnt, "opens_read_along") - along,
            1,
            "round {round}: not read along with its open"
        );
        assert_same_bytes(&fs::read(m.e("f")).unwrap(), &new, "on the server");
    }
    let mut other = OpenOptions::new().write(true).open(m.p("f")).unwrap();
    other.seek(io::SeekFrom::Start(50_000)).unwrap();
    other.write_all(b"tail").unwrap();
    fs::write(m.p("f"), b"x").unwrap();
    drop(other);
    assert_eq!(fs::read(m.p("f")).unwrap(), b"x");
    assert_eq!(fs::read(m.e("f")).unwrap(), b"x");
}

/// A copy as `shutil.copy2` makes one (pip installs with it): create, write, close, then the
/// times and the mode set by path; and a truncate by path. The truncate's answer needs the
/// mtime the server gives it, asked along with the SETSTAT (one round trip); what the kernel
/// is told, and keeps, is the server's.
#[test]
fn setattr_by_path_is_answered_with_the_servers_attributes() {
    let m = TestMount::start(&[]);
    for (i, len) in [0usize, 5_000, 300_000].into_iter().enumerate() {
        let name = format!("copy{i}");
        let data = pattern(i as u64, len);
        fs::write(m.p(&name), &data).unwrap();
        set_times(
            &m.p(&name),
            Some((1_400_000_000, 0)),
            Some((1_500_000_000, 0)),
        )
        .unwrap();
        fs::set_permissions(m.p(&name), fs::Permissions::from_mode(0o640)).unwrap();
        let shown = fs::metadata(m.p(&name)).unwrap();
        let server = settled_on_server(&m, &name);
        assert_eq!(
            (shown.len(), shown.mtime(), shown.mode() & 0o7777),
            (len as u64, 1_500_000_000, 0o640),
            "{name}: shown"
        );
        assert_eq!(
            (
                server.len(),
                server.mtime(),
                server.atime(),
                server.mode() & 0o7777
            ),
            (len as u64, 1_500_000_000, 1_400_000_000, 0o640),
            "{name}: on the server"
        );
        assert_same_bytes(&fs::read(m.p(&name)).unwrap(), &data, &name);

        let along = status_counter(&m.mnt, "setattrs_stat_along");
        truncate_path(&m.p(&name), 100).unwrap();
        assert_eq!(
            status_counter(&m.mnt, "setattrs_stat_along") - along,
            1,
            "{name}: attributes not asked along with the truncate"
        );
        let shown = fs::metadata(m.p(&name)).unwrap();
        let server = fs::metadata(m.e(&name)).unwrap();
        assert_eq!(
            (shown.len(), shown.mtime()),
            (100, server.mtime()),
            "{name}: truncated"
        );
        assert_ne!(
            server.mtime(),
            1_500_000_000,
            "{name}: the truncate kept the mtime"
        );
    }
}

/// A file written and closed, then `stat`ed, as build tools and Python's bytecode cache do:
/// what `stat` shows is the server's size and mtime, whether or not the close learnt them
/// (an FSTAT right behind writes still on their way, see `Fs::attrs_behind_writes`). The
/// server is paused while a file is written and closed, so the close surely finds its
/// writes on their way: it learns the attributes then, and shows the server's.
#[test]
fn stat_after_close_shows_what_the_writes_left() {
    let m = TestMount::start(&[]);
    let check = |name: &str, len: usize| {
        let shown = fs::metadata(m.p(name)).unwrap();
        let server = fs::metadata(m.e(name)).unwrap();
        assert_eq!(
            (shown.len(), shown.mtime()),
            (len as u64, server.mtime()),
            "{name}: shown vs server"
        );
        assert_eq!(server.len(), len as u64, "{name} on the server");
    };
    for (i, len) in [1usize, 4_000, 200_000, 9_000_000].into_iter().enumerate() {
        let name = format!("plain{i}");
        fs::write(m.p(&name), pattern(i as u64, len)).unwrap();
        check(&name, len);
    }
    let learnt = status_counter(&m.mnt, "attrs_along_writes");
    for round in 0..3 {
        let name = format!("paused{round}");
        let len = 3_000 + round;
        let mut f = File::create(m.p(&name)).unwrap();
        let paused = m.sshd().pause_sftp_servers();
        f.write_all(&pattern(round as u64, len)).unwrap();
        let ops = status_counter(&m.mnt, "ops");
        let closer = std::thread::spawn(move || drop(f));
        assert!(
            poll_until(Duration::from_secs(30), || status_counter(&m.mnt, "ops")
                > ops),
            "the close did not reach the mount"
        );
        drop(paused);
        closer.join().unwrap();
        check(&name, len);
    }
    assert!(
        status_counter(&m.mnt, "attrs_along_writes") > learnt,
        "no close learnt the attributes its writes left"
    );
}

/// The kernel keeps its cached pages of a file from one open to the next while they are
/// younger than the attribute TTL and nothing shows a change (`keep_cache`): a second read
/// does not cross the link, nor does its open. A change made on the server that neither the size nor the mtime
/// shows (same length, mtime put back) is seen once the TTL has passed, as the TTL promises.
#[test]
fn file_pages_are_kept_across_opens_within_the_ttl() {
    let data = pattern(7, 300_000);
    {
        // A TTL no stall of this machine can run out between two reads.
        let m = TestMount::start(&["attr_timeout=3600", "entry_timeout=3600"]);
        fs::write(m.e("f"), &data).unwrap();
        assert_same_bytes(&fs::read(m.p("f")).unwrap(), &data, "first read");
        let before = status_counter(&m.mnt, "bytes_read");
        let deferred = status_counter(&m.mnt, "opens_deferred");
        assert_same_bytes(&fs::read(m.p("f")).unwrap(), &data, "second read");
        assert_same_bytes(&fs::read(m.p("f")).unwrap(), &data, "third read");
        assert_eq!(
            status_counter(&m.mnt, "bytes_read") - before,
            0,
            "the kernel's pages were dropped at an open"
        );
        assert_eq!(
            status_counter(&m.mnt, "opens_deferred") - deferred,
            2,
            "a reopen asked the server"
        );
        // A change through the mount shows at once.
        let f = fs::OpenOptions::new().write(true).open(m.p("f")).unwrap();
        f.write_all_at(b"through the mount", 1000).unwrap();
        drop(f);
        let got = fs::read(m.p("f")).unwrap();
        assert_eq!(&got[1000..1017], b"through the mount");
    }
    let m = TestMount::start(&["attr_timeout=1", "entry_timeout=1"]);
    fs::write(m.e("f"), &data).unwrap();
    set_times(&m.e("f"), None, Some((1_500_000_000, 0))).unwrap();
    assert_same_bytes(&fs::read(m.p("f")).unwrap(), &data, "first read");
    let mut changed = data.clone();
    changed[5000..5005].copy_from_slice(b"NEWER");
    fs::write(m.e("f"), &changed).unwrap();
    set_times(&m.e("f"), None, Some((1_500_000_000, 0))).unwrap();
    // The TTL is what is tested here: wait it out.
    std::thread::sleep(Duration::from_millis(1300));
    assert_same_bytes(
        &fs::read(m.p("f")).unwrap(),
        &changed,
        "a change on the server after the TTL",
    );
}

/// Every path below `dir`, relative to it, sorted: `find`'s walk (readdirplus and the walk
/// ahead on the mount).
fn tree_paths(dir: &Path) -> Vec<String> {
    let out = run_ok(Command::new("find").arg(dir));
    let prefix = format!("{}/", dir.display());
    let mut v: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix).map(str::to_string))
        .collect();
    v.sort();
    v
}

/// A walk down the tree (`find`, `ls -R`) on the mount, whose listings are fetched ahead of
/// it, shows what is on the server; and what the mount changes afterwards shows at once
/// through it, whatever was listed ahead: a directory renamed away and another renamed into
/// its place shows its own entries at every level, and so does a directory made anew.
#[test]
fn walks_down_the_tree_see_the_server_and_the_mounts_own_changes() {
    let m = TestMount::start(&[]);
    for x in ["a", "b", "other"] {
        for y in ["c", "d"] {
            fs::create_dir_all(m.e(format!("t/{x}/{y}/e"))).unwrap();
            fs::write(m.e(format!("t/{x}/{y}/e/from-{x}")), x).unwrap();
        }
    }
    let on_server = tree_paths(&m.e("t"));
    assert_eq!(on_server.len(), 3 * (1 + 2 * 3));
    assert_eq!(tree_paths(&m.p("t")), on_server, "the walk on the mount");
    run_ok(Command::new("ls").arg("-lR").arg(m.p("t")));

    fs::rename(m.p("t/b"), m.p("t/old")).unwrap();
    fs::rename(m.p("t/other"), m.p("t/b")).unwrap();
    fs::create_dir_all(m.p("t/other/c/e")).unwrap();
    fs::write(m.p("t/other/c/e/made-here"), b"").unwrap();
    assert_eq!(names(&m.p("t/b/c/e")), [OsString::from("from-other")]);
    assert_eq!(names(&m.p("t/old/d/e")), [OsString::from("from-b")]);
    assert_eq!(names(&m.p("t/other/c/e")), [OsString::from("made-here")]);
    assert_eq!(
        tree_paths(&m.p("t")),
        tree_paths(&m.e("t")),
        "the walk on the mount after the changes"
    );
}

/// rewinddir(3) shows the directory as it is now, even within the listing cache lifetime
/// (default TTLs here): the kernel reads the same handle from offset 0 again.
#[test]
fn rewinddir_lists_afresh() {
    let m = TestMount::start(&[]);
    fs::write(m.e("before"), b"").unwrap();
    let dir = cpath(&m.p(""));
    let read_all = |d: *mut libc::DIR| -> Vec<OsString> {
        let mut out = Vec::new();
        loop {
            // SAFETY: d is an open DIR*; the entry is copied out before the next call.
            let ent = unsafe { libc::readdir(d) };
            if ent.is_null() {
                break;
            }
            let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) };
            out.push(OsString::from_vec(name.to_bytes().to_vec()));
        }
        out.sort();
        out
    };
    // SAFETY: plain libc directory stream calls on a valid path; closed below.
    let d = unsafe { libc::opendir(dir.as_ptr()) };
    assert!(!d.is_null(), "opendir: {}", io::Error::last_os_error());
    let first = read_all(d);
    fs::write(m.e("after"), b"").unwrap();
    fs::remove_file(m.e("before")).unwrap();
    unsafe { libc::rewinddir(d) };
    let again = read_all(d);
    unsafe { libc::closedir(d) };
    assert_eq!(first, [".", "..", "before"].map(OsString::from));
    assert_eq!(
        again,
        [".", "..", "after"].map(OsString::from),
        "after rewinddir"
    );
}

#[test]
fn large_file_round_trip_and_offsets() {
    let m = TestMount::start(&[]);
    const LEN: usize = 20 << 20;
    let data = pattern(20, LEN);

    // Mount -> server, 20 MiB.
    fs::write(m.p("big.bin"), &data).unwrap();
    assert_same_bytes(&fs::read(m.e("big.bin")).unwrap(), &data, "server copy");
    assert_eq!(fs::metadata(m.p("big.bin")).unwrap().len(), LEN as u64);
    // Read back through the mount (a new open drops the page cache).
    assert_same_bytes(
        &fs::read(m.p("big.bin")).unwrap(),
        &data,
        "read back through the mount",
    );

    // Server -> mount, another file.
    let other = pattern(21, 6 << 20);
    fs::write(m.e("other.bin"), &other).unwrap();
    assert_same_bytes(
        &fs::read(m.p("other.bin")).unwrap(),
        &other,
        "server-written file",
    );

    // Reads at offsets, across 4 KiB pages, 128 KiB kernel requests and the server's
    // 261120-byte read limit; out of order.
    let f = File::open(m.p("big.bin")).unwrap();
    for (off, len) in [
        (7_340_033usize, 1_000_000usize),
        (261_119, 2),
        (0, 1),
        (1, 4095),
        (4095, 2),
        (131_071, 3),
        (261_120, 300_000),
        (19 << 20, 1 << 20),
        (LEN - 10, 10),
        (123_456, 654_321),
    ] {
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, off as u64)
            .unwrap_or_else(|e| panic!("read {len} at {off}: {e}"));
        assert_same_bytes(&buf, &data[off..off + len], &format!("read {len} at {off}"));
    }
    // Short read at the end, nothing past it.
    let mut buf = vec![0u8; 100];
    assert_eq!(f.read_at(&mut buf, (LEN - 5) as u64).unwrap(), 5);
    assert_eq!(&buf[..5], &data[LEN - 5..]);
    assert_eq!(f.read_at(&mut buf, LEN as u64).unwrap(), 0);
    assert_eq!(f.read_at(&mut buf, LEN as u64 + 12345).unwrap(), 0);

    // Overwrite in the middle through the mount.
    let patch = pattern(22, 70_000);
    let w = OpenOptions::new().write(true).open(m.p("big.bin")).unwrap();
    w.write_all_at(&patch, 5_000_000).unwrap();
    drop(w);
    let mut want = data.clone();
    want[5_000_000..5_070_000].copy_from_slice(&patch);
    assert_same_bytes(
        &fs::read(m.e("big.bin")).unwrap(),
        &want,
        "server copy after a patch",
    );
}

// ------------------------------------------------------------------ metadata

/// The server's attributes of `name` once the changes to it are all there. A chmod, chown or
/// utimes by path can go behind the writes of the descriptor that created the file while
/// the kernel's close of that descriptor is still on its way (it sends it after close(2)
/// returns); fsync(2) waits for them (through a descriptor for writing: a read would move
/// the server's atime).
fn settled_on_server(m: &TestMount, name: &str) -> fs::Metadata {
    let f = OpenOptions::new().write(true).open(m.p(name)).unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::metadata(m.e(name)).unwrap()
}

#[test]
fn metadata_chmod_chown_truncate_times() {
    let m = TestMount::start(&[NO_CACHE]);
    fs::write(m.p("f"), b"0123456789").unwrap();

    // chmod
    for mode in [0o640, 0o751, 0o600] {
        fs::set_permissions(m.p("f"), fs::Permissions::from_mode(mode)).unwrap();
        assert_eq!(
            settled_on_server(&m, "f").mode() & 0o7777,
            mode,
            "server mode"
        );
        assert_eq!(
            fs::metadata(m.p("f")).unwrap().mode() & 0o7777,
            mode,
            "mount mode"
        );
    }
    fs::create_dir(m.p("d")).unwrap();
    fs::set_permissions(m.p("d"), fs::Permissions::from_mode(0o705)).unwrap();
    assert_eq!(fs::metadata(m.e("d")).unwrap().mode() & 0o7777, 0o705);
    assert!(fs::metadata(m.p("d")).unwrap().is_dir());

    // chown (we are root): both, then each half alone must keep the other.
    std::os::unix::fs::chown(m.p("f"), Some(1234), Some(5678)).unwrap();
    let s = settled_on_server(&m, "f");
    assert_eq!((s.uid(), s.gid()), (1234, 5678));
    std::os::unix::fs::chown(m.p("f"), Some(4321), None).unwrap();
    let s = settled_on_server(&m, "f");
    assert_eq!(
        (s.uid(), s.gid()),
        (4321, 5678),
        "chown uid only clobbered the gid"
    );
    std::os::unix::fs::chown(m.p("f"), None, Some(8765)).unwrap();
    let s = settled_on_server(&m, "f");
    assert_eq!(
        (s.uid(), s.gid()),
        (4321, 8765),
        "chown gid only clobbered the uid"
    );
    let s = fs::metadata(m.p("f")).unwrap();
    assert_eq!((s.uid(), s.gid()), (4321, 8765), "mount shows other ids");
    assert_eq!(settled_on_server(&m, "f").mode() & 0o7777, 0o600);

    // truncate: down and up, by descriptor (ftruncate) and by path (truncate).
    let f = OpenOptions::new().write(true).open(m.p("f")).unwrap();
    f.set_len(4).unwrap();
    assert_eq!(fs::read(m.e("f")).unwrap(), b"0123");
    assert_eq!(f.metadata().unwrap().len(), 4);
    f.set_len(10_000).unwrap();
    drop(f);
    let server = fs::read(m.e("f")).unwrap();
    assert_eq!(server.len(), 10_000);
    assert_eq!(&server[..4], b"0123");
    assert!(
        server[4..].iter().all(|b| *b == 0),
        "truncate up must zero-fill"
    );
    assert_eq!(fs::metadata(m.p("f")).unwrap().len(), 10_000);
    assert_eq!(fs::read(m.p("f")).unwrap(), server);
    truncate_path(&m.p("f"), 2).unwrap();
    assert_eq!(fs::read(m.e("f")).unwrap(), b"01");
    assert_eq!(fs::metadata(m.p("f")).unwrap().len(), 2);
    truncate_path(&m.p("f"), 0).unwrap();
    assert_eq!(settled_on_server(&m, "f").len(), 0);
    // O_TRUNC through open.
    fs::write(m.p("f"), b"0123456789").unwrap();
    drop(
        OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(m.p("f"))
            .unwrap(),
    );
    assert_eq!(settled_on_server(&m, "f").len(), 0);

    // stat sizes agree with the server for a few sizes.
    for (i, size) in [0usize, 1, 511, 512, 4096, 100_001].into_iter().enumerate() {
        let name = format!("size{i}");
        fs::write(m.p(&name), pattern(i as u64, size)).unwrap();
        let (mine, theirs) = (
            fs::metadata(m.p(&name)).unwrap(),
            fs::metadata(m.e(&name)).unwrap(),
        );
        assert_eq!(mine.len(), size as u64);
        assert_eq!(theirs.len(), size as u64);
        assert!(mine.is_file());
        assert_eq!(
            mine.blocks(),
            (size as u64).div_ceil(512),
            "st_blocks of {size} bytes"
        );
    }

    // utimens. SFTP v3 carries whole seconds: the server gets those exactly, and the mount
    // shows the times as set, nanoseconds included, while the server keeps those seconds
    // (on this mount without kernel caches, that is the mount answering, not the kernel).
    fs::write(m.p("t"), b"times").unwrap();
    set_times(
        &m.p("t"),
        Some((1_600_000_000, 123_456_789)),
        Some((1_500_000_000, 987_654_321)),
    )
    .unwrap();
    let s = settled_on_server(&m, "t");
    assert_eq!(
        (s.atime(), s.mtime(), s.mtime_nsec()),
        (1_600_000_000, 1_500_000_000, 0),
        "server times"
    );
    let times = |s: &fs::Metadata| (s.atime(), s.atime_nsec(), s.mtime(), s.mtime_nsec());
    assert_eq!(
        times(&fs::metadata(m.p("t")).unwrap()),
        (1_600_000_000, 123_456_789, 1_500_000_000, 987_654_321),
        "mount times"
    );
    // Past 2^32 s (2106), which SFTP v3 cannot carry, and before 1970: the same.
    set_times(&m.p("t"), Some((-1, 500)), Some((1 << 32, 7))).unwrap();
    assert_eq!(
        times(&fs::metadata(m.p("t")).unwrap()),
        (-1, 500, 1 << 32, 7),
        "times out of SFTP's range"
    );
    // Once the server has other seconds (set there), the server's times are shown.
    set_times(
        &m.e("t"),
        Some((1_600_000_000, 0)),
        Some((1_500_000_000, 0)),
    )
    .unwrap();
    assert_eq!(
        times(&fs::metadata(m.p("t")).unwrap()),
        (1_600_000_000, 0, 1_500_000_000, 0),
        "times changed on the server"
    );
    // atime only must not clobber the mtime...
    set_times(&m.p("t"), Some((1_700_000_000, 0)), None).unwrap();
    let s = settled_on_server(&m, "t");
    assert_eq!(
        s.mtime(),
        1_500_000_000,
        "setting atime only changed the mtime"
    );
    assert_eq!(s.atime(), 1_700_000_000);
    // ...and mtime only must not clobber the atime.
    set_times(&m.p("t"), None, Some((1_400_000_000, 0))).unwrap();
    let s = settled_on_server(&m, "t");
    assert_eq!(
        s.atime(),
        1_700_000_000,
        "setting mtime only changed the atime"
    );
    assert_eq!(s.mtime(), 1_400_000_000);
    // UTIME_NOW (touch): close to now on the server.
    let c = cpath(&m.p("t"));
    // SAFETY: valid path; a null times pointer means "now" for both.
    last_os_error(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), std::ptr::null(), 0) })
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let s = settled_on_server(&m, "t");
    assert!(
        (s.mtime() - now).abs() <= 5,
        "touch: mtime {} vs now {now}",
        s.mtime()
    );
    // ...in whole seconds through the mount too, as the times the server gives writes.
    assert_eq!(fs::metadata(m.p("t")).unwrap().mtime_nsec(), 0, "touch");
    // Writing (without O_TRUNC, which is a change of its own) updates the mtime on the
    // server, and the mount shows the server's, also within the second set just before.
    set_times(
        &m.p("t"),
        Some((1_000_000_000, 0)),
        Some((1_000_000_000, 0)),
    )
    .unwrap();
    let f = OpenOptions::new().write(true).open(m.p("t")).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    set_times(&m.p("t"), None, Some((now, 999))).unwrap();
    f.write_all_at(b"rewritten", 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert!(settled_on_server(&m, "t").mtime() >= now);
    assert_eq!(
        fs::metadata(m.p("t")).unwrap().mtime_nsec(),
        0,
        "mtime after a write"
    );
}

// ------------------------------------------------------------------ errno

#[test]
fn errno_cases_match_a_local_disk() {
    let m = TestMount::start(&[NO_CACHE]);
    let local = tempfile::tempdir().unwrap();
    let long = "n".repeat(256);
    for root in [local.path(), &m.export] {
        fs::create_dir(root.join("dir")).unwrap();
        fs::write(root.join("dir/x"), b"x").unwrap();
        fs::create_dir(root.join("dir2")).unwrap();
        fs::write(root.join("dir2/y"), b"y").unwrap();
        fs::create_dir(root.join("emptydir")).unwrap();
        fs::create_dir(root.join("emptydir2")).unwrap();
        fs::write(root.join("file"), b"content").unwrap();
        fs::write(root.join("file2"), b"content2").unwrap();
        fs::write(root.join("xa"), b"A").unwrap();
        fs::write(root.join("xb"), b"B").unwrap();
    }
    let before = names(&m.export);

    type Case = (&'static str, i32, Box<dyn Fn(&Path) -> io::Result<()>>);
    let long2 = long.clone();
    let long3 = long.clone();
    let cases: Vec<Case> = vec![
        (
            "mkdir existing dir",
            libc::EEXIST,
            Box::new(|r| fs::create_dir(r.join("dir"))),
        ),
        (
            "mkdir over a file",
            libc::EEXIST,
            Box::new(|r| fs::create_dir(r.join("file"))),
        ),
        (
            "mkdir in a missing dir",
            libc::ENOENT,
            Box::new(|r| fs::create_dir(r.join("nope/d"))),
        ),
        (
            "rmdir non-empty",
            libc::ENOTEMPTY,
            Box::new(|r| fs::remove_dir(r.join("dir"))),
        ),
        (
            "rmdir of a file",
            libc::ENOTDIR,
            Box::new(|r| fs::remove_dir(r.join("file"))),
        ),
        (
            "rmdir missing",
            libc::ENOENT,
            Box::new(|r| fs::remove_dir(r.join("nope"))),
        ),
        (
            "unlink of a dir",
            libc::EISDIR,
            Box::new(|r| fs::remove_file(r.join("emptydir"))),
        ),
        (
            "unlink missing",
            libc::ENOENT,
            Box::new(|r| fs::remove_file(r.join("nope"))),
        ),
        (
            "open missing",
            libc::ENOENT,
            Box::new(|r| File::open(r.join("nope")).map(drop)),
        ),
        (
            "open below a file",
            libc::ENOTDIR,
            Box::new(|r| File::open(r.join("file/x")).map(drop)),
        ),
        (
            "O_CREAT|O_EXCL on existing",
            libc::EEXIST,
            Box::new(|r| {
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(r.join("file"))
                    .map(drop)
            }),
        ),
        (
            "create a 256-byte name",
            libc::ENAMETOOLONG,
            Box::new(move |r| fs::write(r.join(&long), b"x")),
        ),
        (
            "stat a 256-byte name",
            libc::ENAMETOOLONG,
            Box::new(move |r| fs::metadata(r.join(&long2)).map(drop)),
        ),
        (
            "mkdir a 256-byte name",
            libc::ENAMETOOLONG,
            Box::new(move |r| fs::create_dir(r.join(&long3))),
        ),
        (
            "rename dir over non-empty dir",
            libc::ENOTEMPTY,
            Box::new(|r| fs::rename(r.join("dir2"), r.join("dir"))),
        ),
        (
            "rename file over dir",
            libc::EISDIR,
            Box::new(|r| fs::rename(r.join("file"), r.join("emptydir"))),
        ),
        (
            "rename dir over file",
            libc::ENOTDIR,
            Box::new(|r| fs::rename(r.join("emptydir"), r.join("file"))),
        ),
        (
            "rename missing",
            libc::ENOENT,
            Box::new(|r| fs::rename(r.join("nope"), r.join("nope2"))),
        ),
        (
            "rename a dir into itself",
            libc::EINVAL,
            Box::new(|r| fs::rename(r.join("dir"), r.join("dir/sub"))),
        ),
        (
            "RENAME_NOREPLACE over existing file",
            libc::EEXIST,
            Box::new(|r| renameat2(&r.join("file"), &r.join("file2"), libc::RENAME_NOREPLACE)),
        ),
        (
            "RENAME_NOREPLACE over existing dir",
            libc::EEXIST,
            Box::new(|r| {
                renameat2(
                    &r.join("emptydir"),
                    &r.join("emptydir2"),
                    libc::RENAME_NOREPLACE,
                )
            }),
        ),
        (
            "open a dir for writing",
            libc::EISDIR,
            Box::new(|r| OpenOptions::new().write(true).open(r.join("dir")).map(drop)),
        ),
        (
            "create over a dir",
            libc::EISDIR,
            Box::new(|r| {
                OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(r.join("dir"))
                    .map(drop)
            }),
        ),
        (
            "access X_OK of a 0644 file (root too)",
            libc::EACCES,
            Box::new(|r| access(&r.join("file"), libc::X_OK)),
        ),
        (
            "access W_OK|R_OK of a 0644 file",
            0,
            Box::new(|r| access(&r.join("file"), libc::W_OK | libc::R_OK)),
        ),
        (
            "access of a missing file",
            libc::ENOENT,
            Box::new(|r| access(&r.join("nope"), libc::F_OK)),
        ),
        (
            "link of a directory",
            libc::EPERM,
            Box::new(|r| fs::hard_link(r.join("dir"), r.join("dirlink"))),
        ),
        (
            "link over an existing name",
            libc::EEXIST,
            Box::new(|r| fs::hard_link(r.join("file"), r.join("file2"))),
        ),
        (
            "symlink over an existing name",
            libc::EEXIST,
            Box::new(|r| std::os::unix::fs::symlink("x", r.join("file"))),
        ),
    ];
    let mut wrong = Vec::new();
    for (what, want, op) in &cases {
        let (l, g) = (errno_of(op(local.path())), errno_of(op(&m.mnt)));
        if l != *want || g != *want {
            wrong.push(format!(
                "{what}: mount {}, local disk {}, expected {}",
                errno_name(g),
                errno_name(l),
                errno_name(*want)
            ));
        }
    }
    // Documented limitations, where the mount differs from a local disk on purpose.
    // RENAME_EXCHANGE cannot be done atomically over SFTP.
    let g = errno_of(renameat2(&m.p("xa"), &m.p("xb"), libc::RENAME_EXCHANGE));
    if g != libc::EINVAL {
        wrong.push(format!(
            "RENAME_EXCHANGE: mount {}, expected EINVAL",
            errno_name(g)
        ));
    }
    // An overlay's whiteout (character device 0/0) could not outlive the mount: refused.
    let g = errno_of(mknod(&m.p("wh"), libc::S_IFCHR | 0o644));
    if g != libc::EPERM {
        wrong.push(format!("whiteout: mount {}, expected EPERM", errno_name(g)));
    }
    assert!(
        wrong.is_empty(),
        "errno mismatches:\n  {}",
        wrong.join("\n  ")
    );

    // Failed operations changed nothing on the server.
    assert_eq!(names(&m.export), before);
    assert_eq!(fs::read(m.e("dir/x")).unwrap(), b"x");
    assert_eq!(fs::read(m.e("file")).unwrap(), b"content");
    assert_eq!(fs::read(m.e("file2")).unwrap(), b"content2");
    assert_eq!(fs::read(m.e("xa")).unwrap(), b"A");
    assert_eq!(fs::read(m.e("xb")).unwrap(), b"B");
}

// ------------------------------------------------------------------ open files

#[test]
fn open_then_unlink_keeps_the_descriptor_working() {
    let m = TestMount::start(&[NO_CACHE]);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("tmpfile"))
        .unwrap();
    f.write_all(b"before unlink").unwrap();
    fs::remove_file(m.p("tmpfile")).unwrap();

    // The name is gone, on both sides (on the server once the unlink is there: fsync of the
    // directory waits for an unlink answered early).
    assert_errno(
        fs::metadata(m.p("tmpfile")),
        libc::ENOENT,
        "stat of the unlinked name",
    );
    sync_dir(&m.mnt);
    assert!(!m.e("tmpfile").exists());
    assert!(names(&m.mnt).is_empty(), "listing: {:?}", names(&m.mnt));
    assert!(
        names(&m.export).is_empty(),
        "server: {:?}",
        names(&m.export)
    );

    // The descriptor still reads, writes and fstats.
    f.write_all(b" and after").unwrap();
    let mut buf = vec![0u8; 23];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, b"before unlink and after");
    assert_eq!(f.metadata().unwrap().len(), 23);
    assert!(f.metadata().unwrap().is_file());
    f.write_all_at(b"B", 0).unwrap();
    f.set_len(6).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 6);
    let mut s = String::new();
    let mut r = &f;
    std::io::Seek::rewind(&mut r).unwrap();
    r.read_to_string(&mut s).unwrap();
    assert_eq!(s, "Before");
    f.sync_all().unwrap();
    drop(f);
    assert!(names(&m.mnt).is_empty());
    // A new file with the same name is a different file.
    fs::write(m.p("tmpfile"), b"new").unwrap();
    assert_eq!(fs::read(m.e("tmpfile")).unwrap(), b"new");
}

/// Append `data` to `path` on the server's side, behind the mount's back.
fn append_on_server(path: &Path, data: &[u8]) {
    let mut f = OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(data).unwrap();
}

/// Appends through a mount with its caches on, like a shell's `echo >> log`: a `stat` after
/// each close shows the size and mtime the server has, though the close does not ask for them
/// (only the server knows where an append landed).
#[test]
fn stat_after_each_append_shows_the_servers_size() {
    let m = TestMount::start(&[]);
    fs::write(m.e("log"), b"start\n").unwrap();
    assert_eq!(fs::metadata(m.p("log")).unwrap().len(), 6);
    for i in 1..=3u64 {
        let mut f = OpenOptions::new().append(true).open(m.p("log")).unwrap();
        f.write_all(b"line\n").unwrap();
        drop(f);
        let shown = fs::metadata(m.p("log")).unwrap();
        let server = fs::metadata(m.e("log")).unwrap();
        assert_eq!(shown.len(), 6 + 5 * i, "after append {i}");
        assert_eq!((shown.len(), shown.mtime()), (server.len(), server.mtime()));
    }
    // Grown on the server meanwhile: the next append lands after that, and shows it.
    append_on_server(&m.e("log"), b"external\n");
    let mut f = OpenOptions::new().append(true).open(m.p("log")).unwrap();
    f.write_all(b"last\n").unwrap();
    drop(f);
    assert_eq!(fs::metadata(m.p("log")).unwrap().len(), 21 + 9 + 5);
    assert_eq!(
        fs::read_to_string(m.p("log")).unwrap(),
        "start\nline\nline\nline\nexternal\nlast\n"
    );
}

#[test]
fn append_and_sparse_writes() {
    let m = TestMount::start(&[NO_CACHE]);

    // Two appenders through the mount, interleaved: nothing is overwritten and each
    // descriptor's records keep their order. (The order *across* the two descriptors is the
    // subject of `writes_through_two_descriptors_reach_the_server_in_order`.)
    let mut a = OpenOptions::new()
        .append(true)
        .create(true)
        .open(m.p("log"))
        .unwrap();
    let mut b = OpenOptions::new().append(true).open(m.p("log")).unwrap();
    for i in 0..3 {
        a.write_all(format!("a{i}\n").as_bytes()).unwrap();
        b.write_all(format!("b{i}\n").as_bytes()).unwrap();
    }
    drop((a, b));
    let log = fs::read_to_string(m.e("log")).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(log.len(), 18, "records overwritten or lost: {log:?}");
    let mut sorted = lines.clone();
    sorted.sort();
    assert_eq!(sorted, ["a0", "a1", "a2", "b0", "b1", "b2"], "{log:?}");
    for who in ["a", "b"] {
        let mine: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| l.starts_with(who))
            .collect();
        assert_eq!(mine, [0, 1, 2].map(|i| format!("{who}{i}")), "{log:?}");
    }
    assert_eq!(fs::read_to_string(m.p("log")).unwrap(), log);

    // Append after the file grew on the server behind the mount's back: the append lands at
    // the server's end of file, not at the size the mount last saw.
    fs::write(m.e("log2"), b"one\n").unwrap();
    let mut c = OpenOptions::new().append(true).open(m.p("log2")).unwrap();
    c.write_all(b"c1\n").unwrap();
    // fsync: a network filesystem publishes writes to other clients at fsync/close.
    c.sync_all().unwrap();
    append_on_server(&m.e("log2"), b"external\n");
    c.write_all(b"c2\n").unwrap();
    drop(c);
    let want = "one\nc1\nexternal\nc2\n";
    assert_eq!(fs::read_to_string(m.e("log2")).unwrap(), want);
    assert_eq!(fs::read_to_string(m.p("log2")).unwrap(), want);
    // And a new O_APPEND descriptor opened after more external growth.
    fs::write(m.e("log3"), b"0123456789").unwrap();
    assert_eq!(fs::metadata(m.p("log3")).unwrap().len(), 10);
    append_on_server(&m.e("log3"), b"abc");
    let mut d = OpenOptions::new().append(true).open(m.p("log3")).unwrap();
    d.write_all(b"XYZ").unwrap();
    drop(d);
    assert_eq!(fs::read(m.e("log3")).unwrap(), b"0123456789abcXYZ");

    // A write far past the end leaves a hole that reads as zeros.
    const OFF: u64 = 64 << 20;
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("sparse"))
        .unwrap();
    f.write_all_at(b"BEGIN", 0).unwrap();
    f.write_all_at(b"END", OFF).unwrap();
    assert_eq!(f.metadata().unwrap().len(), OFF + 3);
    drop(f);
    assert_eq!(fs::metadata(m.e("sparse")).unwrap().len(), OFF + 3);
    assert_eq!(fs::metadata(m.p("sparse")).unwrap().len(), OFF + 3);
    let server = File::open(m.e("sparse")).unwrap();
    let mine = File::open(m.p("sparse")).unwrap();
    for (off, len) in [
        (0u64, 4096usize),
        (OFF - 4096, 4099),
        (OFF / 2, 65536),
        (5, 200_000),
    ] {
        let (mut x, mut y) = (vec![1u8; len], vec![2u8; len]);
        server.read_exact_at(&mut x, off).unwrap();
        mine.read_exact_at(&mut y, off).unwrap();
        let mut want = vec![0u8; len];
        for (i, w) in want.iter_mut().enumerate() {
            let at = off + i as u64;
            if at < 5 {
                *w = b"BEGIN"[at as usize];
            } else if at >= OFF {
                *w = b"END"[(at - OFF) as usize];
            }
        }
        assert_same_bytes(&x, &want, &format!("server bytes at {off}"));
        assert_same_bytes(&y, &want, &format!("mount bytes at {off}"));
    }
}

/// Regression (was a bug): a `write(2)` that has returned can be overtaken on the server by a
/// later `write(2)` through another descriptor of the same file. Writes are acknowledged once
/// queued; each open file has its own queue, and the two descriptors' handles usually live on
/// different SFTP channels (default `max_conns=4`), each served by its own sftp-server process,
/// so the server may apply them in either order. A local disk (and sshfs with its single
/// channel) applies them in call order. Seen here: two O_APPEND writers produce "b1 a1"
/// instead of "a1 b1", and an overwrite of the same bytes through the second descriptor is
/// lost (the server keeps the first write's bytes), in about 10-20% of the rounds; with
/// `-o max_conns=1` none in 200 rounds.
#[test]
fn writes_through_two_descriptors_reach_the_server_in_order() {
    let m = TestMount::start(&[]);
    const ROUNDS: usize = 100;
    let (mut append_wrong, mut overwrite_wrong) = (Vec::new(), Vec::new());
    for i in 0..ROUNDS {
        let log = format!("log{i}");
        let mut a = OpenOptions::new()
            .append(true)
            .create(true)
            .open(m.p(&log))
            .unwrap();
        let mut b = OpenOptions::new().append(true).open(m.p(&log)).unwrap();
        a.write_all(b"a1\n").unwrap();
        b.write_all(b"b1\n").unwrap();
        drop((a, b));
        let got = fs::read_to_string(m.e(&log)).unwrap();
        if got != "a1\nb1\n" {
            append_wrong.push(got);
        }

        let data = format!("ov{i}");
        let a = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(m.p(&data))
            .unwrap();
        let b = OpenOptions::new().write(true).open(m.p(&data)).unwrap();
        a.write_all_at(b"AAAA", 0).unwrap();
        b.write_all_at(b"BB", 0).unwrap();
        drop((a, b));
        let got = fs::read_to_string(m.e(&data)).unwrap();
        if got != "BBAA" {
            overwrite_wrong.push(got);
        }
    }
    assert!(
        append_wrong.is_empty() && overwrite_wrong.is_empty(),
        "writes through two descriptors reached the server out of call order: appends in \
         {}/{ROUNDS} rounds (e.g. {:?}, expected \"a1\\nb1\\n\"), overwrites in {}/{ROUNDS} \
         rounds (e.g. {:?}, expected \"BBAA\")",
        append_wrong.len(),
        append_wrong.first(),
        overwrite_wrong.len(),
        overwrite_wrong.first()
    );
}

/// Many small writes, as a log flushed line by line or `dd bs=512` makes: the mount sends
/// those that queue behind one another merged into bigger WRITEs. Whatever was merged, every
/// byte lands where it was written and in order, overwrites of earlier bytes included, and
/// through a second descriptor too.
#[test]
fn small_writes_land_whole_and_in_order() {
    let m = TestMount::start(&[]);
    let mut log = OpenOptions::new()
        .append(true)
        .create(true)
        .open(m.p("app.log"))
        .unwrap();
    let mut want_log = String::new();
    for i in 0..20_000 {
        let line = format!("line {i} of the log\n");
        log.write_all(line.as_bytes()).unwrap();
        want_log.push_str(&line);
    }
    drop(log);

    let a = create_read_write(&m.p("small.bin"));
    let b = OpenOptions::new()
        .write(true)
        .open(m.p("small.bin"))
        .unwrap();
    let mut model = Vec::new();
    for i in 0..8_000u64 {
        let data = pattern(i, 512);
        let at = if i % 97 == 96 {
            // Back over bytes written a moment ago (maybe still queued).
            model.len() as u64 - 700
        } else {
            model.len() as u64
        };
        let through = if i % 1_000 == 999 { &b } else { &a };
        through.write_all_at(&data, at).unwrap();
        let end = at as usize + data.len();
        if model.len() < end {
            model.resize(end, 0);
        }
        model[at as usize..end].copy_from_slice(&data);
    }
    drop((a, b));
    assert_eq!(fs::read_to_string(m.e("app.log")).unwrap(), want_log);
    assert_same_bytes(&fs::read(m.e("small.bin")).unwrap(), &model, "small.bin");
    // The counter is there (how many merged depends on how far the server lags).
    status_counter(&m.mnt, "writes_merged");
}

/// Bytes of a file's writes that went through extra lanes (other SFTP channels).
fn bytes_striped(m: &TestMount) -> u64 {
    status_counter(&m.mnt, "bytes_striped")
}

/// A large sequential write is striped over several SFTP channels (each with its own SSH
/// window and sftp-server process) and lands byte for byte; overwrites right behind a
/// striped run, through the same and another descriptor, win.
#[test]
fn striped_sequential_write_lands_and_keeps_order() {
    let m = TestMount::start(&[]);
    const LEN: usize = 48 << 20;
    let data = pattern(48, LEN);
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("src.bin");
    fs::write(&src, &data).unwrap();
    run_ok(
        Command::new("dd")
            .arg(format!("if={}", src.display()))
            .arg(format!("of={}", m.p("dd.bin").display()))
            .args(["bs=1M", "conv=fsync", "status=none"]),
    );
    assert_same_bytes(
        &fs::read(m.e("dd.bin")).unwrap(),
        &data,
        "server copy of dd",
    );
    let after_dd = bytes_striped(&m);
    assert!(
        after_dd >= 16 << 20,
        "only {after_dd} bytes of a 48 MiB dd went through extra lanes"
    );

    // A 24 MiB run, then at once (its last chunks still in flight) overwrites inside it.
    let mut want = pattern(24, 24 << 20);
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("run.bin"))
        .unwrap();
    f.write_all(&want).unwrap();
    for (k, at) in [
        (1u64, 23 << 20),
        (2, (20 << 20) + 123),
        (3, 10 << 20),
        (4, 5_000_001),
    ] {
        let patch = pattern(100 + k, 70_000);
        f.write_all_at(&patch, at).unwrap();
        want[at as usize..at as usize + patch.len()].copy_from_slice(&patch);
    }
    // Another descriptor, right behind a second run.
    let second = pattern(25, 12 << 20);
    f.write_all_at(&second, 8 << 20).unwrap();
    want[8 << 20..(8 << 20) + second.len()].copy_from_slice(&second);
    let g = OpenOptions::new().write(true).open(m.p("run.bin")).unwrap();
    let patch = pattern(200, 300_000);
    g.write_all_at(&patch, (19 << 20) + 77).unwrap();
    want[(19 << 20) + 77..(19 << 20) + 77 + patch.len()].copy_from_slice(&patch);
    drop(g);
    f.sync_all().unwrap();
    drop(f);
    assert_same_bytes(
        &fs::read(m.e("run.bin")).unwrap(),
        &want,
        "server copy after overwrites of a striped run",
    );
    assert!(
        bytes_striped(&m) > after_dd,
        "the 24 MiB run was not striped"
    );
}

/// Pages written out of order through one descriptor, as a database writes them, many more
/// than one SFTP channel keeps in flight: they are spread over extra lanes too. Every page
/// lands, a page written again while its first write may still be on the way keeps the later
/// data, and a read through the mount sees what was written.
#[test]
fn scattered_writes_spread_over_lanes_and_keep_order() {
    const PAGE: usize = 4096;
    const PAGES: usize = 4096;
    let m = TestMount::start(&[]);
    let mut want = pattern(7, PAGE * PAGES);
    fs::write(m.e("db.bin"), &want).unwrap();
    let before = bytes_striped(&m);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("db.bin"))
        .unwrap();
    // 1999 is prime to 4096: a permutation in which no page follows the one before it.
    let page = |i: usize| (i * 1999) % PAGES;
    let put = |f: &File, want: &mut [u8], p: usize, seed: u64| {
        let data = pattern(seed, PAGE);
        f.write_all_at(&data, (p * PAGE) as u64).unwrap();
        want[p * PAGE..(p + 1) * PAGE].copy_from_slice(&data);
    };
    // The server paused while the first 600 are written (each is answered as it is queued):
    // they wait behind one another, more than one channel keeps in flight, as over a long
    // link, whatever this machine's speed.
    {
        let _paused = m.sshd().pause_sftp_servers();
        for i in 0..600 {
            put(&f, &mut want, page(i + 3_000), 500 + i as u64);
        }
    }
    for i in 0..3_000 {
        put(&f, &mut want, page(i), 1_000 + i as u64);
        if i >= 600 && i % 3 == 0 {
            // Again, a few hundred writes later.
            put(&f, &mut want, page(i - 500), 5_000 + i as u64);
        }
        if i % 500 == 499 {
            let mut got = vec![0u8; PAGE];
            f.read_exact_at(&mut got, (page(i) * PAGE) as u64).unwrap();
            assert_same_bytes(&got, &want[page(i) * PAGE..][..PAGE], "page read back");
        }
    }
    // Through another descriptor, over pages the first may still have in flight.
    let g = OpenOptions::new().write(true).open(m.p("db.bin")).unwrap();
    for i in 2_990..3_000 {
        put(&g, &mut want, page(i), 9_000 + i as u64);
    }
    drop(g);
    f.sync_all().unwrap();
    drop(f);
    assert_same_bytes(&fs::read(m.e("db.bin")).unwrap(), &want, "server copy");
    assert!(
        bytes_striped(&m) > before,
        "no scattered write went through an extra lane"
    );
}

#[test]
fn three_hundred_open_files_on_one_channel() {
    // max_conns=1 puts every handle on one SFTP session: handle slots 128.. are where a
    // client that decodes handles as UTF-8 strings (russh-sftp) corrupts them.
    let m = TestMount::start(&["max_conns=1"]);
    const N: usize = 320;
    let content = |i: usize| format!("file {i}: {}\n", "x".repeat(i % 97)).repeat(i % 5 + 1);
    for i in 0..N {
        fs::write(m.e(format!("r{i:03}")), content(i)).unwrap();
    }
    // Read-write: a small file opened only for reading may be answered from a copy read
    // ahead, without a server handle, and the handles are what this test is about.
    let files: Vec<File> = (0..N)
        .map(|i| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(m.p(format!("r{i:03}")))
                .unwrap_or_else(|e| panic!("open {i}: {e}"))
        })
        .collect();
    // All open at once, on the server too (each holds a server handle).
    let server_fds = m.sshd().sftp_server_fds();
    assert!(
        server_fds >= N,
        "{server_fds} fds open on the server with {N} files open"
    );
    // Read and fstat in reverse order.
    for (i, f) in files.iter().enumerate().rev() {
        let want = content(i);
        assert_eq!(
            f.metadata().unwrap().len(),
            want.len() as u64,
            "fstat of file {i}"
        );
        let mut buf = vec![0u8; want.len() + 10];
        let n = f.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf[..n], want.as_bytes(), "content of file {i}");
    }
    drop(files);

    // And 320 files open for writing at once.
    let mut writers: Vec<File> = (0..N)
        .map(|i| {
            File::create(m.p(format!("w{i:03}"))).unwrap_or_else(|e| panic!("create {i}: {e}"))
        })
        .collect();
    for (i, f) in writers.iter_mut().enumerate() {
        f.write_all(content(N - i).as_bytes()).unwrap();
    }
    for (i, f) in writers.iter().enumerate().rev() {
        f.sync_all().unwrap_or_else(|e| panic!("fsync {i}: {e}"));
    }
    drop(writers);
    for i in 0..N {
        assert_eq!(
            fs::read_to_string(m.e(format!("w{i:03}"))).unwrap(),
            content(N - i),
            "server copy of w{i:03}"
        );
    }
}

// ------------------------------------------------------------------ namespace

#[test]
fn rename_semantics() {
    let m = TestMount::start(&[NO_CACHE]);
    fs::write(m.p("new"), b"new content").unwrap();
    fs::write(m.p("target"), b"old content").unwrap();
    let src_ino = fs::metadata(m.e("new")).unwrap().ino();
    let reader = File::open(m.p("target")).unwrap();

    // Rename over an existing file: an atomic replace (the same server inode, not a copy).
    fs::rename(m.p("new"), m.p("target")).unwrap();
    assert_eq!(fs::read(m.e("target")).unwrap(), b"new content");
    assert_eq!(fs::metadata(m.e("target")).unwrap().ino(), src_ino);
    assert_eq!(fs::read(m.p("target")).unwrap(), b"new content");
    assert_errno(
        fs::metadata(m.p("new")),
        libc::ENOENT,
        "old name after rename",
    );
    assert!(!m.e("new").exists());
    // A descriptor open on the replaced file still reads the old content.
    let mut buf = vec![0u8; 11];
    reader.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, b"old content");
    drop(reader);

    // The atomic-save pattern of editors and git: write a temporary file, fsync it, rename it
    // over the target, fsync the directory.
    let mut tmp = File::create(m.p(".target.tmp")).unwrap();
    tmp.write_all(b"saved atomically").unwrap();
    tmp.sync_all().unwrap();
    drop(tmp);
    fs::rename(m.p(".target.tmp"), m.p("target")).unwrap();
    File::open(&m.mnt).unwrap().sync_all().unwrap();
    assert_eq!(fs::read(m.e("target")).unwrap(), b"saved atomically");
    assert!(!m.e(".target.tmp").exists());

    // Within a directory and between directories.
    fs::create_dir(m.p("d1")).unwrap();
    fs::create_dir(m.p("d2")).unwrap();
    fs::write(m.p("d1/a"), b"A").unwrap();
    fs::rename(m.p("d1/a"), m.p("d1/b")).unwrap();
    assert_errno(fs::metadata(m.p("d1/a")), libc::ENOENT, "d1/a after rename");
    assert_eq!(fs::read(m.e("d1/b")).unwrap(), b"A");
    let held = File::open(m.p("d1/b")).unwrap();
    fs::rename(m.p("d1/b"), m.p("d2/c")).unwrap();
    assert_errno(fs::metadata(m.p("d1/b")), libc::ENOENT, "d1/b after rename");
    assert!(!m.e("d1/b").exists());
    assert_eq!(fs::read(m.p("d2/c")).unwrap(), b"A");
    assert_eq!(fs::read(m.e("d2/c")).unwrap(), b"A");

    // A whole directory, with a file in it open.
    fs::rename(m.p("d2"), m.p("d3")).unwrap();
    assert_errno(fs::metadata(m.p("d2")), libc::ENOENT, "d2 after rename");
    assert_errno(fs::metadata(m.p("d2/c")), libc::ENOENT, "d2/c after rename");
    assert_eq!(fs::read(m.p("d3/c")).unwrap(), b"A");
    assert_eq!(fs::read(m.e("d3/c")).unwrap(), b"A");
    let mut buf = [0u8; 1];
    held.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"A");
    drop(held);
    // Into a subdirectory, then write through the new path.
    fs::rename(m.p("d3"), m.p("d1/d3")).unwrap();
    fs::write(m.p("d1/d3/c"), b"rewritten").unwrap();
    assert_eq!(fs::read(m.e("d1/d3/c")).unwrap(), b"rewritten");
    // Directory over an empty directory replaces it.
    fs::create_dir(m.p("empty")).unwrap();
    fs::rename(m.p("d1"), m.p("empty")).unwrap();
    assert_eq!(fs::read(m.e("empty/d3/c")).unwrap(), b"rewritten");
    assert_eq!(fs::read(m.p("empty/d3/c")).unwrap(), b"rewritten");
    assert!(!m.e("d1").exists());
    let mut root = names(&m.mnt);
    root.sort();
    assert_eq!(
        root,
        vec![OsString::from("empty"), OsString::from("target")]
    );
}

#[test]
fn hard_links_and_symlinks() {
    let m = TestMount::start(&[NO_CACHE]);

    // Hard links: one inode on the server, content shared.
    fs::write(m.p("orig"), b"one").unwrap();
    fs::hard_link(m.p("orig"), m.p("alias")).unwrap();
    let (a, b) = (
        fs::metadata(m.e("orig")).unwrap(),
        fs::metadata(m.e("alias")).unwrap(),
    );
    assert_eq!(a.ino(), b.ino(), "not a hard link on the server");
    assert_eq!(a.nlink(), 2);
    fs::write(m.p("alias"), b"two, longer").unwrap();
    assert_eq!(fs::read(m.p("orig")).unwrap(), b"two, longer");
    assert_eq!(fs::read(m.e("orig")).unwrap(), b"two, longer");
    let f = OpenOptions::new().write(true).open(m.p("orig")).unwrap();
    f.write_all_at(b"TWO", 0).unwrap();
    drop(f);
    assert_eq!(fs::read(m.p("alias")).unwrap(), b"TWO, longer");
    fs::remove_file(m.p("orig")).unwrap();
    assert_eq!(fs::read(m.p("alias")).unwrap(), b"TWO, longer");
    // The unlink was answered before the server had it (SEMANTICS.md, unlinks answered
    // early); fsync of the directory waits for it.
    sync_dir(&m.mnt);
    assert_eq!(fs::metadata(m.e("alias")).unwrap().nlink(), 1);

    // Symlinks with relative targets inside the mount.
    fs::create_dir(m.p("sub")).unwrap();
    fs::write(m.p("sub/target.txt"), b"pointed at").unwrap();
    std::os::unix::fs::symlink("sub/target.txt", m.p("ln")).unwrap();
    assert_eq!(
        fs::read_link(m.e("ln")).unwrap(),
        Path::new("sub/target.txt"),
        "server link"
    );
    assert_eq!(
        fs::read_link(m.p("ln")).unwrap(),
        Path::new("sub/target.txt")
    );
    assert!(fs::symlink_metadata(m.p("ln"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read(m.p("ln")).unwrap(), b"pointed at");
    assert_eq!(fs::metadata(m.p("ln")).unwrap().len(), 10);
    // To a directory, and "../" inside it.
    std::os::unix::fs::symlink("sub", m.p("lnd")).unwrap();
    assert_eq!(names(&m.p("lnd")), vec![OsString::from("target.txt")]);
    std::os::unix::fs::symlink("../ln", m.p("sub/up")).unwrap();
    assert_eq!(fs::read(m.p("sub/up")).unwrap(), b"pointed at");
    // Writing through a link writes the target.
    fs::write(m.p("lnd/target.txt"), b"via the link").unwrap();
    assert_eq!(fs::read(m.e("sub/target.txt")).unwrap(), b"via the link");
    // Made on the server.
    std::os::unix::fs::symlink("sub/target.txt", m.e("server-ln")).unwrap();
    assert_eq!(
        fs::read_link(m.p("server-ln")).unwrap(),
        Path::new("sub/target.txt")
    );
    assert_eq!(fs::read(m.p("server-ln")).unwrap(), b"via the link");
    // Dangling: the link itself is there, following it is ENOENT.
    std::os::unix::fs::symlink("nowhere", m.p("dangling")).unwrap();
    assert!(fs::symlink_metadata(m.p("dangling"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_errno(
        fs::metadata(m.p("dangling")),
        libc::ENOENT,
        "stat through a dangling link",
    );
    // Removing a link leaves the target.
    fs::remove_file(m.p("ln")).unwrap();
    sync_dir(&m.mnt);
    assert!(m.e("sub/target.txt").exists());
    assert!(fs::symlink_metadata(m.e("ln")).is_err());
}

/// `ls -l` of `dir`: every entry's (name, inode, link count) as readdirplus left them.
fn listed_links(dir: &Path) -> BTreeMap<OsString, (u64, u64)> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let md = fs::symlink_metadata(e.path()).unwrap();
            (e.file_name(), (md.ino(), md.nlink()))
        })
        .collect()
}

/// A hard link made through the mount is one file under two names, with the default (20 s)
/// caches: a write through one name is seen through the other at once (the kernel must not
/// keep a stale size, which cut the read short: b"chan"), as is a chmod, and both names show
/// one inode number.
#[test]
fn hard_link_through_the_mount_is_one_file_under_both_names() {
    let m = TestMount::start(&[]);
    fs::write(m.p("f"), b"data").unwrap();
    fs::hard_link(m.p("f"), m.p("h")).unwrap();
    fs::metadata(m.p("f")).unwrap();
    fs::write(m.p("h"), b"changed").unwrap();
    assert_eq!(
        fs::read(m.p("f")).unwrap(),
        b"changed",
        "write through h, read f"
    );
    assert_eq!(fs::metadata(m.p("f")).unwrap().len(), 7);
    fs::set_permissions(m.p("h"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        fs::metadata(m.p("f")).unwrap().mode() & 0o777,
        0o600,
        "chmod through h, stat f"
    );
    assert_eq!(
        fs::metadata(m.p("f")).unwrap().ino(),
        fs::metadata(m.p("h")).unwrap().ino(),
        "two inodes for one file"
    );
    // The first name goes: the remaining one is the file (its server path too).
    fs::remove_file(m.p("f")).unwrap();
    assert_eq!(fs::read(m.p("h")).unwrap(), b"changed");
    fs::write(m.p("h"), b"again").unwrap();
    assert_eq!(fs::read(m.e("h")).unwrap(), b"again");
}

/// st_nlink of a hard link made through the mount follows link and unlink, before and after
/// a listing.
#[test]
fn hard_link_counts_follow_link_and_unlink() {
    let m = TestMount::start(&[]);
    fs::write(m.p("f"), b"data").unwrap();
    fs::hard_link(m.p("f"), m.p("h")).unwrap();
    let (f, h) = (
        fs::metadata(m.p("f")).unwrap(),
        fs::metadata(m.p("h")).unwrap(),
    );
    assert_eq!((f.nlink(), h.nlink()), (2, 2), "st_nlink after link");
    let listed = listed_links(&m.mnt);
    assert_eq!(listed[os(b"f")].1, 2, "f after a listing");
    assert_eq!(listed[os(b"h")].1, 2, "h after a listing");
    fs::remove_file(m.p("f")).unwrap();
    assert_eq!(
        fs::metadata(m.p("h")).unwrap().nlink(),
        1,
        "after unlink of f"
    );
    let listed = listed_links(&m.mnt);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[os(b"h")].1, 1, "h after unlink of f and a listing");
    assert_eq!(
        fs::metadata(m.p("h")).unwrap().nlink(),
        1,
        "stat after the listing"
    );
    // The unlink was answered before the server carried it out; fsync of the directory
    // waits for it (the listing above may have come from the cache).
    File::open(&m.mnt).unwrap().sync_all().unwrap();
    assert_eq!(fs::metadata(m.e("h")).unwrap().nlink(), 1, "on the server");
}

/// Regression (was a bug, found by `namespace_with_held_descriptors_matches_a_local_directory`):
/// a directory's link count follows `mkdir`, `rmdir` and `rename` of its subdirectories
/// through the mount, but a listing of its parent cached before kept the old count, and a
/// lookup answered from that listing took it over: `rename(d, d)` (which the kernel
/// revalidates by a lookup) made `d` show 2 links with a subdirectory in it. Also: the count
/// of a directory made through the mount was lost when the kernel forgot its inode.
#[test]
fn a_directory_link_count_survives_cached_listings_and_forgotten_inodes() {
    let m = TestMount::start(&[]);
    fs::create_dir(m.p("d")).unwrap();
    names(&m.mnt); // the root's listing, cached with d's count from before
    fs::create_dir(m.p("d/sub")).unwrap();
    assert_eq!(
        fs::metadata(m.p("d")).unwrap().nlink(),
        3,
        "after mkdir d/sub"
    );
    fs::rename(m.p("d"), m.p("d")).unwrap();
    assert_eq!(
        fs::metadata(m.p("d")).unwrap().nlink(),
        3,
        "after rename(d, d)"
    );
    fs::create_dir(m.p("d/sub2")).unwrap();
    fs::remove_dir(m.p("d/sub")).unwrap();
    fs::rename(m.p("d"), m.p("d")).unwrap();
    assert_eq!(
        fs::metadata(m.p("d")).unwrap().nlink(),
        3,
        "after mkdir and rmdir"
    );
    // The kernel forgets the inodes nothing holds: the counts come back from the listing.
    fs::create_dir(m.p("fresh")).unwrap();
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    assert_eq!(
        fs::metadata(m.p("fresh")).unwrap().nlink(),
        2,
        "a new directory, forgotten"
    );
    assert_eq!(fs::metadata(m.p("d")).unwrap().nlink(), 3, "d, forgotten");
}

/// rename(2) of a name onto another link of the same file does nothing (POSIX): both names
/// stay, on the mount and on the server.
#[test]
fn rename_onto_a_hard_link_of_the_same_file_is_a_no_op() {
    let m = TestMount::start(&[]);
    fs::write(m.p("a"), b"a").unwrap();
    fs::hard_link(m.p("a"), m.p("b")).unwrap();
    fs::rename(m.p("a"), m.p("b")).unwrap();
    assert!(m.e("a").exists(), "a removed on the server");
    assert!(m.e("b").exists(), "b removed on the server");
    assert_eq!(fs::read(m.p("a")).unwrap(), b"a", "a through the mount");
    assert_eq!(fs::read(m.p("b")).unwrap(), b"a", "b through the mount");
    let mut names = names(&m.mnt);
    names.sort();
    assert_eq!(names, vec![OsString::from("a"), OsString::from("b")]);
    assert_eq!(fs::metadata(m.p("a")).unwrap().nlink(), 2);
}

/// Hard links made on the server cannot be recognised over SFTP v3: each name is an inode of
/// its own on the mount. They are cached as any file (the kernel keeps their pages across
/// opens), until a change made through one name: then the kernel is told to drop what it
/// has of the others, so the change is seen through them at once, even one that keeps the
/// size and the (whole-second) mtime.
#[test]
fn server_made_hard_links_are_not_served_stale() {
    // A TTL no stall of this machine can run out: only the mount's word drops the caches.
    let m = TestMount::start(&["attr_timeout=3600", "entry_timeout=3600"]);
    fs::write(m.e("x"), b"data").unwrap();
    fs::hard_link(m.e("x"), m.e("y")).unwrap();
    let listed = listed_links(&m.mnt);
    assert_eq!((listed[os(b"x")].1, listed[os(b"y")].1), (2, 2));
    assert_eq!(fs::read(m.p("y")).unwrap(), b"data");
    let before = status_counter(&m.mnt, "bytes_read");
    assert_eq!(fs::read(m.p("y")).unwrap(), b"data");
    assert_eq!(
        status_counter(&m.mnt, "bytes_read") - before,
        0,
        "y read from the server again: not cached"
    );
    // Read through a descriptor of y opened before the change, and stat without an open:
    // the kernel's pages and attributes, which only the mount's word can drop. Same size,
    // same second first.
    let y = fs::File::open(m.p("y")).unwrap();
    let read_y = || {
        let mut b = [0u8; 16];
        let n = y.read_at(&mut b, 0).unwrap();
        b[..n].to_vec()
    };
    assert_eq!(read_y(), b"data");
    let f = fs::OpenOptions::new().write(true).open(m.p("x")).unwrap();
    f.write_all_at(b"DATA", 0).unwrap();
    drop(f);
    assert_eq!(read_y(), b"DATA", "read through y");
    assert!(status_counter(&m.mnt, "shared_drops") > 0);
    assert_eq!(fs::metadata(m.p("y")).unwrap().len(), 4);
    fs::write(m.p("x"), b"changed").unwrap();
    assert_eq!(fs::metadata(m.p("y")).unwrap().len(), 7, "size through y");
    assert_eq!(read_y(), b"changed", "read through y");
    assert_eq!(fs::read(m.p("y")).unwrap(), b"changed", "read through y");
    fs::set_permissions(m.p("x"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(m.p("y")).unwrap().mode() & 0o777, 0o600);
    // Renaming one onto the other is a no-op on the server: the mount must not lose x.
    fs::rename(m.p("x"), m.p("y")).unwrap();
    assert!(m.e("x").exists());
    assert_eq!(
        fs::read(m.p("x")).unwrap(),
        b"changed",
        "x after rename onto y"
    );
}

/// The kernel drops the pages of the other names from a thread of the mount's own, and may
/// wait there for reads of them that the mount is answering: readers of `y` (new opens, and
/// a descriptor kept open) while `x`, another name of the same file, is rewritten through
/// the mount and closed, over and over. Nothing may hang, no read may be short, and once
/// the writer is done `y` shows its last version. (Whether the kernel is told at all is
/// `server_made_hard_links_are_not_served_stale`: here the readers' own opens drop pages.)
#[test]
fn server_made_hard_links_rewritten_while_read_through_another_name() {
    let m = TestMount::start(&["attr_timeout=3600", "entry_timeout=3600"]);
    const LEN: usize = 200_000;
    fs::write(m.e("x"), vec![b'a'; LEN]).unwrap();
    fs::hard_link(m.e("x"), m.e("y")).unwrap();
    listed_links(&m.mnt);
    let before = File::open(m.p("y")).unwrap();
    let mut b = vec![0; LEN];
    before.read_exact_at(&mut b, 0).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (done_tx, done_rx) = std::sync::mpsc::channel::<Result<usize, String>>();
    for reader in 0..3 {
        let (y, stop, done) = (m.p("y"), stop.clone(), done_tx.clone());
        std::thread::spawn(move || {
            let kept = File::open(&y).unwrap();
            let mut reads = 0;
            // A read racing a write may mix versions, as on a local disk; it may not be
            // short, nor hold anything no version had.
            let check = |b: &[u8], how: &str| -> Result<(), String> {
                match b.len() == LEN && b.iter().all(|v| (b'a'..b'b' + 20).contains(v)) {
                    true => Ok(()),
                    false => Err(format!("reader {reader} ({how}): a short or wrong read")),
                }
            };
            let result = (|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    check(&fs::read(&y).map_err(|e| e.to_string())?, "open")?;
                    let mut b = vec![0; LEN];
                    kept.read_exact_at(&mut b, 0).map_err(|e| e.to_string())?;
                    check(&b, "kept descriptor")?;
                    reads += 2;
                }
                Ok(reads)
            })();
            let _ = done.send(result);
        });
    }
    let (x, writer_stop, done) = (m.p("x"), stop.clone(), done_tx);
    std::thread::spawn(move || {
        let result = (|| {
            for i in 0..=255u8 {
                let mut f = OpenOptions::new()
                    .write(true)
                    .open(&x)
                    .map_err(|e| e.to_string())?;
                f.write_all(&[b'b' + i % 20; LEN])
                    .map_err(|e| e.to_string())?;
                drop(f);
            }
            Ok(256)
        })();
        writer_stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = done.send(result);
    });
    // Generous: the whole exchange takes about a second.
    for _ in 0..4 {
        match done_rx.recv_timeout(Duration::from_secs(120)) {
            Ok(r) => {
                r.unwrap();
            }
            Err(_) => panic!("a reader or the writer hung (a notification that never returns?)"),
        }
    }
    let last = vec![b'b' + 255 % 20; LEN];
    before.read_exact_at(&mut b, 0).unwrap();
    assert!(
        b == last,
        "not the last version, through a descriptor of y opened before"
    );
    assert!(
        fs::read(m.p("y")).unwrap() == last,
        "not the last version, through y"
    );
    assert!(status_counter(&m.mnt, "shared_drops") > 0);
}

/// A file written through the descriptor that created it, read back and `fstat`ed between
/// writes (as an assembler does): the mount answers those `fstat`s itself while the writes
/// are on their way. The size must be where the writes end every time, the bytes read back
/// what was written, and once closed the mtime the server's.
#[test]
fn stat_of_a_file_being_written_by_its_creator_shows_the_writes() {
    let m = TestMount::start(&[]);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(m.p("obj.o"))
        .unwrap();
    let mut want = Vec::new();
    for (i, piece) in [&b"\x7fELF header"[..], &[7u8; 70_000], b"tail"]
        .iter()
        .enumerate()
    {
        f.write_all(piece).unwrap();
        want.extend_from_slice(piece);
        assert_eq!(
            f.metadata().unwrap().len(),
            want.len() as u64,
            "fstat after write {i}"
        );
        let mut back = vec![0; want.len()];
        f.read_exact_at(&mut back, 0).unwrap();
        assert_same_bytes(&back, &want, "read back");
    }
    // An overwrite inside the file does not move its end.
    f.write_all_at(b"HDR", 0).unwrap();
    assert_eq!(f.metadata().unwrap().len(), want.len() as u64);
    drop(f);
    want[..3].copy_from_slice(b"HDR");
    assert_same_bytes(&fs::read(m.e("obj.o")).unwrap(), &want, "on the server");
    let (mine, theirs) = (
        fs::metadata(m.p("obj.o")).unwrap(),
        fs::metadata(m.e("obj.o")).unwrap(),
    );
    assert_eq!(mine.len(), theirs.len());
    assert_eq!(mine.mtime(), theirs.mtime(), "mtime after close");
}

#[test]
fn statfs_reports_the_server_filesystem() {
    let m = TestMount::start(&[]);
    let mine = nix::sys::statvfs::statvfs(&m.mnt).unwrap();
    let theirs = nix::sys::statvfs::statvfs(&m.export).unwrap();
    assert!(mine.blocks() > 0, "no blocks");
    assert!(mine.fragment_size() > 0 && mine.block_size() > 0);
    assert_eq!(mine.name_max(), 255);
    assert_eq!(
        mine.blocks() as u128 * mine.fragment_size() as u128,
        theirs.blocks() as u128 * theirs.fragment_size() as u128,
        "total size differs from the server's filesystem"
    );
    assert!(mine.blocks_free() <= mine.blocks());
    let (st, out, err) = run_with_deadline(
        Command::new("df").arg("-P").arg(&m.mnt),
        Duration::from_secs(10),
    );
    assert!(st.success(), "df: {err}");
    assert!(out.contains(m.mnt.to_str().unwrap()), "df output: {out}");
}

#[test]
fn readdir_many_entries_and_raw_names() {
    let m = TestMount::start(&[NO_CACHE]);
    for i in 0..500 {
        fs::write(m.e(format!("file-{i:03}")), i.to_string()).unwrap();
    }
    for i in 0..20 {
        fs::create_dir(m.e(format!("dir-{i:02}"))).unwrap();
    }
    for i in 0..10 {
        std::os::unix::fs::symlink(format!("file-{i:03}"), m.e(format!("link-{i}"))).unwrap();
    }
    let got = typed_listing(&m.mnt);
    let want = typed_listing(&m.export);
    assert_eq!(want.len(), 530);
    assert_eq!(got.len(), 530, "entries listed through the mount");
    assert_eq!(got, want, "listing or types differ from the server's");
    assert_eq!(got.values().filter(|t| **t == 'f').count(), 500);
    // lstat through the entries agrees too.
    for e in fs::read_dir(&m.mnt)
        .unwrap()
        .map(Result::unwrap)
        .step_by(37)
    {
        let md = e.metadata().unwrap();
        let sd = fs::symlink_metadata(m.e(e.file_name())).unwrap();
        assert_eq!(
            (md.len(), md.file_type()),
            (sd.len(), sd.file_type()),
            "{:?}",
            e.file_name()
        );
    }

    // Created through the mount, listed on the server.
    fs::create_dir(m.p("made")).unwrap();
    for i in 0..100 {
        fs::write(m.p(format!("made/m{i}")), b"").unwrap();
    }
    assert_eq!(names(&m.e("made")).len(), 100);
    assert_eq!(names(&m.p("made")), names(&m.e("made")));

    // Non-UTF-8 names, byte-exact both ways.
    let raw = os(b"caf\xe9-\xff\xfe.txt");
    fs::write(m.export.join(raw), b"latin-1 name").unwrap();
    let listed = names(&m.mnt);
    assert!(
        listed.iter().any(|n| n.as_os_str() == raw),
        "{raw:?} not listed byte-exactly; non-ASCII names listed: {:?}",
        listed
            .iter()
            .filter(|n| n.to_str().is_none())
            .collect::<Vec<_>>()
    );
    assert_eq!(fs::read(m.mnt.join(raw)).unwrap(), b"latin-1 name");
    let raw2 = os(b"\x80\x81 raw \xc3\x28");
    fs::write(m.mnt.join(raw2), b"made here").unwrap();
    assert!(names(&m.export).iter().any(|n| n.as_os_str() == raw2));
    assert_eq!(fs::read(m.export.join(raw2)).unwrap(), b"made here");
    let raw3 = os(b"renamed-\xfe");
    fs::rename(m.mnt.join(raw2), m.mnt.join(raw3)).unwrap();
    assert_eq!(fs::read(m.export.join(raw3)).unwrap(), b"made here");
    fs::remove_file(m.mnt.join(raw3)).unwrap();
    sync_dir(&m.mnt);
    assert!(!m.export.join(raw3).exists());
    let raw_dir = os(b"d\xe9j\xe0");
    fs::create_dir(m.mnt.join(raw_dir)).unwrap();
    fs::write(m.mnt.join(raw_dir).join(raw), b"nested").unwrap();
    assert_eq!(names(&m.mnt.join(raw_dir)), vec![raw.to_os_string()]);
    assert_eq!(
        fs::read(m.export.join(raw_dir).join(raw)).unwrap(),
        b"nested"
    );
    assert_eq!(
        names(&m.mnt)
            .into_iter()
            .map(OsString::into_vec)
            .collect::<Vec<_>>(),
        names(&m.export)
            .into_iter()
            .map(OsString::into_vec)
            .collect::<Vec<_>>()
    );
}

// ------------------------------------------------------------------ unmount

#[derive(Debug, Clone, Copy)]
enum Unmount {
    AwcpUmount,
    Fusermount,
    Umount,
    Sigterm,
    Sigint,
}

#[test]
fn unmount_paths_flush_and_exit_0() {
    let sshd = TestSshd::start();
    for (i, how) in [
        Unmount::AwcpUmount,
        Unmount::Fusermount,
        Unmount::Umount,
        Unmount::Sigterm,
        Unmount::Sigint,
    ]
    .into_iter()
    .enumerate()
    {
        let mut m = TestMount::foreground(&sshd, &[]);
        let name = format!("{how:?}.bin");
        let data = pattern(100 + i as u64, 3 << 20);
        fs::write(m.p(&name), &data).unwrap();
        // A small write just before the unmount, still open until right before it.
        let mut last = File::create(m.p(format!("{how:?}.last"))).unwrap();
        last.write_all(b"last words").unwrap();
        drop(last);
        match how {
            Unmount::AwcpUmount => {
                let (st, _, err) =
                    run_with_deadline(Command::new(BIN).arg("umount").arg(&m.mnt), EXIT_TIMEOUT);
                assert!(st.success(), "awcp-mount umount: {err}");
            }
            Unmount::Fusermount => {
                let (st, _, err) = run_with_deadline(
                    Command::new("fusermount3").arg("-u").arg(&m.mnt),
                    EXIT_TIMEOUT,
                );
                assert!(st.success(), "fusermount3 -u: {err}");
            }
            Unmount::Umount => {
                let (st, _, err) =
                    run_with_deadline(Command::new("umount").arg(&m.mnt), EXIT_TIMEOUT);
                assert!(st.success(), "umount: {err}");
            }
            Unmount::Sigterm => m.signal(Signal::SIGTERM),
            Unmount::Sigint => m.signal(Signal::SIGINT),
        }
        let status = m
            .wait_exit(EXIT_TIMEOUT)
            .unwrap_or_else(|| panic!("{how:?}: the mount process did not exit"));
        assert_eq!(
            status.code(),
            Some(0),
            "{how:?}: {status}; stderr: {}",
            m.stderr()
        );
        assert!(
            !is_mounted(&m.mnt),
            "{how:?}: still mounted: {:?}",
            fstypes_at(&m.mnt)
        );
        assert_same_bytes(
            &fs::read(sshd.export_dir.join(&name)).unwrap(),
            &data,
            &name,
        );
        assert_eq!(
            fs::read(sshd.export_dir.join(format!("{how:?}.last"))).unwrap(),
            b"last words",
            "{how:?}"
        );
    }
}

#[test]
fn daemon_mode_unmount_and_busy_mount() {
    let sshd = TestSshd::start();
    let mut m = TestMount::daemon(&sshd, &[]);
    let pid = m.pid();
    assert!(pid_alive(pid));
    // Busy: a file is open; `awcp-mount umount` refuses and says why, the mount stays.
    let mut f = File::create(m.p("open.txt")).unwrap();
    f.write_all(b"still open").unwrap();
    let (st, _, err) = run_with_deadline(Command::new(BIN).arg("umount").arg(&m.mnt), EXIT_TIMEOUT);
    assert!(!st.success(), "umount of a busy mount succeeded");
    assert!(err.contains("busy"), "stderr: {err}");
    assert!(is_awcp_mounted(&m.mnt));
    drop(f);
    // `awcp-mount umount` refuses a mount that is not ours.
    let (st, _, err) =
        run_with_deadline(Command::new(BIN).arg("umount").arg("/proc"), EXIT_TIMEOUT);
    assert!(
        !st.success() && err.contains("refusing"),
        "umount /proc: {st}: {err}"
    );
    let (st, _, err) = run_with_deadline(
        Command::new(BIN).arg("umount").arg(m.mnt.parent().unwrap()),
        EXIT_TIMEOUT,
    );
    assert!(!st.success() && err.contains("not mounted"), "{st}: {err}");

    m.unmount().unwrap();
    assert!(!is_mounted(&m.mnt));
    assert!(
        poll_until(EXIT_TIMEOUT, || !pid_alive(pid)),
        "daemon {pid} did not exit"
    );
    assert_eq!(
        fs::read(sshd.export_dir.join("open.txt")).unwrap(),
        b"still open"
    );
}

/// `awcp-mount umount` returns once the mount process has sent everything and exited: the
/// kernel lets go of a FUSE mount without waiting for its process, which may still have
/// REMOVEs of unlinks it answered early on their way. A script that unmounts and then looks
/// at the server (or hands the workspace back) must find them done. The server's SFTP
/// processes are paused while the unlinks are made, so their REMOVEs are surely unanswered
/// when the unmount starts.
#[test]
fn umount_returns_once_the_mount_process_has_sent_everything() {
    let sshd = TestSshd::start();
    let m = TestMount::daemon(&sshd, &[]);
    let names: Vec<String> = (0..200).map(|i| format!("f{i}")).collect();
    for n in &names {
        fs::write(m.p(n), b"x").unwrap();
    }
    let pid = m.pid();
    let paused = sshd.pause_sftp_servers();
    // Answered early, so without the server; an unlink that waited for it would wait until
    // the pause ends: fail instead of hanging.
    let paths: Vec<PathBuf> = names.iter().map(|n| m.p(n)).collect();
    let unlinks = std::thread::spawn(move || paths.iter().try_for_each(fs::remove_file));
    if !poll_until(EXIT_TIMEOUT, || unlinks.is_finished()) {
        drop(paused);
        panic!("the unlinks waited for the server: not answered early");
    }
    unlinks.join().unwrap().unwrap();
    let mnt = m.mnt.clone();
    let umount = std::thread::spawn(move || {
        run_with_deadline(Command::new(BIN).arg("umount").arg(&mnt), EXIT_TIMEOUT)
    });
    // Once the kernel has let go, give a `umount` that does not wait ample time to return.
    let gone = poll_until(EXIT_TIMEOUT, || !is_mounted(&m.mnt));
    std::thread::sleep(Duration::from_millis(300));
    let returned_while_paused = umount.is_finished();
    assert!(gone, "still mounted while the server was paused");
    drop(paused);
    let (st, _, err) = umount.join().unwrap();
    assert!(st.success(), "awcp-mount umount: {st}: {err}");
    assert!(
        !returned_while_paused,
        "awcp-mount umount returned while the REMOVEs were unanswered"
    );
    assert!(
        !pid_alive(pid),
        "awcp-mount umount returned while the mount process {pid} was still running"
    );
    let left: Vec<_> = names
        .iter()
        .filter(|n| sshd.export_dir.join(n).exists())
        .collect();
    assert!(
        left.is_empty(),
        "still on the server after umount: {left:?}"
    );
}

#[test]
fn sigterm_with_a_file_open_flushes_and_detaches() {
    let sshd = TestSshd::start();
    let mut m = TestMount::foreground(&sshd, &[]);
    let data = pattern(7, 2 << 20);
    let mut f = File::create(m.p("open.bin")).unwrap();
    f.write_all(&data).unwrap();
    m.signal(Signal::SIGTERM);
    // The mount is busy, so it is detached lazily: gone from the namespace at once...
    assert!(
        poll_until(EXIT_TIMEOUT, || !is_mounted(&m.mnt)),
        "still mounted after SIGTERM; stderr: {}",
        m.stderr()
    );
    // ...with the written data on the server.
    assert_same_bytes(
        &fs::read(sshd.export_dir.join("open.bin")).unwrap(),
        &data,
        "open.bin",
    );
    // The process ends (exit 0) once the last open file is closed.
    drop(f);
    let status = m
        .wait_exit(EXIT_TIMEOUT)
        .expect("no exit after the last close");
    assert_eq!(status.code(), Some(0), "{status}; stderr: {}", m.stderr());
}

// ------------------------------------------------------------------ mount failures

#[test]
fn daemon_mode_failures_exit_non_zero_with_a_message() {
    let sshd = TestSshd::start();
    let dir = tempfile::tempdir().unwrap();
    let export = sshd.export_dir.clone();
    let with_opts = |extra: &[&str], mnt: &Path| standard_args(&sshd, &export, mnt, extra);

    // Wrong user key.
    expect_failure(
        |mnt| {
            let mut a = base_args(&sshd, &export, mnt);
            a.extend(opt_path("IdentityFile", &sshd.wrong_key_path));
            a.extend(opt_path("UserKnownHostsFile", &sshd.known_hosts_path));
            a
        },
        &["refused to authenticate", &sshd.user],
        "wrong user key",
    );

    // Wrong host key in known_hosts.
    let wrong_known = dir.path().join("wrong_known_hosts");
    let other_key = fs::read_to_string(sshd.wrong_key_path.with_extension("pub")).unwrap();
    fs::write(
        &wrong_known,
        format!("[127.0.0.1]:{} {}", sshd.port, other_key),
    )
    .unwrap();
    expect_failure(
        |mnt| known_hosts_args(&sshd, mnt, &wrong_known),
        &["host key", "changed"],
        "host key changed",
    );

    // Unknown host: empty known_hosts.
    let empty_known = dir.path().join("empty_known_hosts");
    fs::write(&empty_known, "").unwrap();
    expect_failure(
        |mnt| known_hosts_args(&sshd, mnt, &empty_known),
        &["not known"],
        "unknown host",
    );

    // A remote directory that does not exist.
    expect_failure(
        |mnt| standard_args(&sshd, &export.join("no-such-dir"), mnt, &[]),
        &["no-such-dir", "does not exist"],
        "missing remote dir",
    );
    // A remote path that is a file.
    fs::write(export.join("plain-file"), b"").unwrap();
    expect_failure(
        |mnt| standard_args(&sshd, &export.join("plain-file"), mnt, &[]),
        &["plain-file", "not a directory"],
        "remote path is a file",
    );

    // A mount point that is a file.
    expect_failure(
        |mnt| {
            let file = mnt.parent().unwrap().join("a-file");
            fs::write(&file, b"").unwrap();
            with_opts(&[], &file)
        },
        &["MOUNTPOINT_DENIED", "a-file", "not a directory"],
        "mount point is a file",
    );
    // A mount point that does not exist.
    expect_failure(
        |mnt| with_opts(&[], &mnt.parent().unwrap().join("missing")),
        &["MOUNTPOINT_DENIED", "missing", "does not exist"],
        "missing mount point",
    );

    // An unknown -o option, named in the message.
    expect_failure(
        |mnt| with_opts(&["reconnect,nosuchoption_xyz"], mnt),
        &["nosuchoption_xyz"],
        "unknown option",
    );

    // A closed port.
    // (Never handed to a test sshd: the harness gives each port out once.)
    let closed_port = common::sshd::free_port();
    expect_failure(
        |mnt| {
            let mut a = with_opts(&[], mnt);
            assert_eq!(a[2], "-p");
            a[3] = closed_port.to_string().into();
            a
        },
        &["cannot connect", &closed_port.to_string()],
        "closed port",
    );

    // An already-mounted mount point: refused as busy; the first mount is untouched.
    let first = TestMount::daemon(&sshd, &[]);
    fs::write(export.join("still-works"), b"yes").unwrap();
    let taken = first.mnt.clone();
    expect_failure(
        |_| with_opts(&[], &taken),
        &["MOUNTPOINT_DENIED", "already a mount point"],
        "already mounted",
    );
    assert_eq!(fstypes_at(&first.mnt), vec!["fuse.awcp".to_string()]);
    assert_eq!(fs::read(first.p("still-works")).unwrap(), b"yes");
}

fn known_hosts_args(sshd: &TestSshd, mnt: &Path, known_hosts: &Path) -> Vec<OsString> {
    let mut a = base_args(sshd, &sshd.export_dir, mnt);
    a.extend(opt_path("IdentityFile", &sshd.key_path));
    a.extend(opt_path("UserKnownHostsFile", known_hosts));
    a
}

#[test]
fn pinned_host_key() {
    let sshd = TestSshd::start();
    let dir = tempfile::tempdir().unwrap();
    let empty_known = dir.path().join("empty_known_hosts");
    fs::write(&empty_known, "").unwrap();
    // The right key pinned: mounts although known_hosts has no entry.
    let host_key = sshd.host_pubkey.clone();
    let m = TestMount::launch(false, &sshd.export_dir, |mnt| {
        let mut a = known_hosts_args(&sshd, mnt, &empty_known);
        a.extend(["--host-key".into(), host_key.clone().into()]);
        a
    })
    .unwrap_or_else(|f| panic!("pinned mount failed: {f:?}"));
    drop(m);
    // Another key pinned: refused.
    let other = fs::read_to_string(sshd.wrong_key_path.with_extension("pub")).unwrap();
    expect_failure(
        |mnt| {
            let mut a = standard_args(&sshd, &sshd.export_dir, mnt, &[]);
            a.extend(["--host-key".into(), other.trim().into()]);
            a
        },
        &["pinned"],
        "wrong pinned key",
    );
}

// ------------------------------------------------------------------ certificates, AWCP

#[test]
fn certificate_login_with_a_key_not_in_authorized_keys() {
    let sshd = TestSshd::start();
    let dir = tempfile::tempdir().unwrap();
    let (key, cert) = fresh_key_with_cert(&sshd, dir.path(), "fresh", &sshd.user, "+1h");
    let args = |mnt: &Path, extra: &str| {
        let mut a = base_args(&sshd, &sshd.export_dir, mnt);
        // Both in one comma-separated -o, as sshfs users write them.
        a.extend([
            "-o".into(),
            format!(
                "IdentityFile={},UserKnownHostsFile={}{extra}",
                key.display(),
                sshd.known_hosts_path.display()
            )
            .into(),
        ]);
        a
    };
    // The key alone is refused (it is not in authorized_keys)...
    expect_failure(
        |mnt| args(mnt, ""),
        &["refused to authenticate"],
        "key without cert",
    );
    // ...with its certificate it mounts.
    let cert_opt = format!(",CertificateFile={}", cert.display());
    let m = TestMount::launch(false, &sshd.export_dir, |mnt| args(mnt, &cert_opt))
        .unwrap_or_else(|f| panic!("certificate mount failed: {f:?}\nsshd log: {}", sshd.log()));
    fs::write(m.p("via-cert"), b"certified").unwrap();
    assert_eq!(
        fs::read(sshd.export_dir.join("via-cert")).unwrap(),
        b"certified"
    );
    drop(m);

    // A certificate for another principal, and an expired one, are refused.
    let (key2, cert2) = fresh_key_with_cert(&sshd, dir.path(), "other", "somebody-else", "+1h");
    let (key3, cert3) = fresh_key_with_cert(
        &sshd,
        dir.path(),
        "expired",
        &sshd.user,
        "20000101:20000102",
    );
    for (k, c, what) in [
        (&key2, &cert2, "wrong principal"),
        (&key3, &cert3, "expired"),
    ] {
        expect_failure(
            |mnt| {
                let mut a = base_args(&sshd, &sshd.export_dir, mnt);
                a.extend(opt_path("IdentityFile", k));
                a.extend(opt_path("CertificateFile", c));
                a.extend(opt_path("UserKnownHostsFile", &sshd.known_hosts_path));
                a
            },
            &["refused to authenticate"],
            what,
        );
    }
}

#[test]
fn awcp_reference_command_line_verbatim() {
    let sshd = TestSshd::start();
    let keys = tempfile::tempdir().unwrap();
    let (key, cert) = fresh_key_with_cert(&sshd, keys.path(), "awcp_key", &sshd.user, "+1h");

    // The AWCP export layout: the export locator holds a `workspace` symlink to the real
    // source directory (absolute) and `.awcp/manifest.json`.
    let real = sshd.export_dir.join("real-source");
    fs::create_dir_all(real.join("src")).unwrap();
    fs::write(real.join("README.md"), b"# project\n").unwrap();
    fs::write(real.join("src/main.rs"), b"fn main() {}\n").unwrap();
    let locator = sshd.export_dir.join("environments/dlg_1");
    fs::create_dir_all(locator.join(".awcp")).unwrap();
    std::os::unix::fs::symlink(&real, locator.join("workspace")).unwrap();
    let manifest = br#"{"delegationId":"dlg_1","resources":[{"name":"workspace","mode":"rw"}]}"#;
    fs::write(locator.join(".awcp/manifest.json"), manifest).unwrap();

    // Verbatim means no --policy either: the built-in policy applies, so the mount point is
    // below its mount root, /var/lib/awcp/mounts (created if missing, as an executor's
    // installation does).
    let how = Launch {
        mount_parent: Some(Path::new(DEFAULT_MOUNT_ROOT)),
        ..Default::default()
    };
    let mut m = TestMount::launch_with(how, &locator, |mnt| {
        [
            format!("{}@127.0.0.1:{}/", sshd.user, locator.display()),
            mnt.to_str().unwrap().to_string(),
            "-o".into(),
            format!("IdentityFile={}", key.display()),
            "-o".into(),
            format!("CertificateFile={}", cert.display()),
            "-o".into(),
            format!("Port={}", sshd.port),
            "-o".into(),
            "StrictHostKeyChecking=no".into(),
            "-o".into(),
            "UserKnownHostsFile=/dev/null".into(),
            "-o".into(),
            "reconnect".into(),
            "-o".into(),
            "ServerAliveInterval=15".into(),
            "-o".into(),
            "ServerAliveCountMax=3".into(),
            "-o".into(),
            "noappledouble".into(),
            "-o".into(),
            "follow_symlinks".into(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect()
    })
    .unwrap_or_else(|f| {
        panic!(
            "the AWCP command line failed: {f:?}\nsshd log: {}",
            sshd.log()
        )
    });

    // What the executor checks: a different device than the parent's.
    let dev = fs::metadata(&m.mnt).unwrap().dev();
    let parent_dev = fs::metadata(m.mnt.parent().unwrap()).unwrap().dev();
    assert_ne!(
        dev, parent_dev,
        "mount point on the same device as its parent"
    );

    // follow_symlinks: the workspace link shows as the real directory.
    assert!(fs::symlink_metadata(m.p("workspace")).unwrap().is_dir());
    assert_eq!(
        names(&m.p("workspace")),
        vec![OsString::from("README.md"), OsString::from("src")]
    );
    assert_eq!(
        fs::read(m.p("workspace/README.md")).unwrap(),
        b"# project\n"
    );
    assert_eq!(
        fs::read(m.p("workspace/src/main.rs")).unwrap(),
        b"fn main() {}\n"
    );
    assert_eq!(fs::read(m.p(".awcp/manifest.json")).unwrap(), manifest);
    fs::write(m.p("workspace/src/lib.rs"), b"pub fn f() {}\n").unwrap();
    assert_eq!(
        fs::read(real.join("src/lib.rs")).unwrap(),
        b"pub fn f() {}\n"
    );

    // The executor unmounts with fusermount -u.
    let pid = m.pid();
    let (st, _, err) = run_with_deadline(
        Command::new("fusermount3").arg("-u").arg(&m.mnt),
        EXIT_TIMEOUT,
    );
    assert!(st.success(), "fusermount3 -u: {err}");
    assert!(!is_mounted(&m.mnt));
    assert!(
        poll_until(EXIT_TIMEOUT, || !pid_alive(pid)),
        "daemon did not exit"
    );
    m.wait_exit(Duration::ZERO);
}

// ------------------------------------------------------------------ reconnect

#[test]
fn reconnect_after_connection_loss() {
    let m = TestMount::start(&["reconnect", NO_CACHE]);
    let data = pattern(3, 4 << 20);
    fs::write(m.e("big.bin"), &data).unwrap();
    fs::write(m.e("small.txt"), b"small").unwrap();
    // Opened (and partly read) before the connection drops: the page cache holds only the
    // start of it, so later reads at other offsets must reach the server.
    let reader = File::open(m.p("big.bin")).unwrap();
    let mut head = vec![0u8; 4096];
    reader.read_exact_at(&mut head, 0).unwrap();
    assert_eq!(head, &data[..4096]);
    let writer = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("w.txt"))
        .unwrap();
    writer.write_all_at(b"before ", 0).unwrap();

    let killed = m.sshd().kill_connections();
    assert!(killed > 0, "no sshd connection processes to kill");

    // A new path operation works (the first one after the drop).
    let md = fs::metadata(m.p("small.txt"))
        .unwrap_or_else(|e| panic!("stat after the drop: {e}; stderr: {}", m.stderr()));
    assert_eq!(md.len(), 5);
    fs::write(m.p("after.txt"), b"after the drop").unwrap();
    assert_eq!(fs::read(m.e("after.txt")).unwrap(), b"after the drop");

    // The file open before the drop reads on, transparently reopened.
    for (off, len) in [
        (3usize << 20, 65536usize),
        (1 << 20, 200_000),
        ((4 << 20) - 100, 100),
    ] {
        let mut buf = vec![0u8; len];
        reader
            .read_exact_at(&mut buf, off as u64)
            .unwrap_or_else(|e| {
                panic!("read {len} at {off} on a file opened before the drop: {e}")
            });
        assert_same_bytes(
            &buf,
            &data[off..off + len],
            &format!("read at {off} after reconnect"),
        );
    }
    // And the file open for writing before the drop writes on.
    writer
        .write_all_at(b"and after", 7)
        .unwrap_or_else(|e| panic!("write on a file opened before the drop: {e}"));
    writer.sync_all().unwrap();

    drop(writer);
    assert_eq!(fs::read(m.e("w.txt")).unwrap(), b"before and after");
    // A second drop: the reader is reopened again.
    assert!(m.sshd().kill_connections() > 0);
    assert_eq!(fs::metadata(m.p("small.txt")).unwrap().len(), 5);
    let mut buf = vec![0u8; 50_000];
    reader.read_exact_at(&mut buf, 3_500_000).unwrap();
    assert_same_bytes(&buf, &data[3_500_000..3_550_000], "reader after two drops");
}

/// With `-o reconnect`, writes on the wire when the connection drops are sent again on the
/// new one, in order: a program that writes through drops and calls fsync after each is
/// told of nothing, and the server has every byte. (Before, fsync reported EIO for what the
/// drop took with it.) Writes are answered when queued; each round holds the server's SFTP
/// processes stopped while it writes, waits until the mount has put the round's write on the
/// wire (`bytes_written`), where nothing can answer it, and only then drops the connection:
/// every round's write is one the drop took, whatever this machine's speed. A fresh
/// descriptor per round keeps the run short of striping (lanes would be opened on the
/// stopped servers). The fsync of each round lets its resends land before the next drop: a
/// write sent again three times and lost each time is reported by design (a write that
/// brings the server down is not sent forever).
#[test]
fn reconnect_sends_again_the_writes_a_drop_took() {
    let m = TestMount::start(&["reconnect"]);
    // Well within what the mount puts on one channel's wire before answers come back
    // (`MIN_WRITE_BUDGET`).
    const CHUNK: usize = 256 << 10;
    const ROUNDS: usize = 6;
    let data = pattern(21, ROUNDS * CHUNK);
    fs::write(m.p("w.bin"), b"").unwrap();
    for round in 0..ROUNDS {
        let f = OpenOptions::new().write(true).open(m.p("w.bin")).unwrap();
        let (written, sent_again) = (
            status_counter(&m.mnt, "bytes_written"),
            status_counter(&m.mnt, "writes_sent_again"),
        );
        let paused = m.sshd().pause_sftp_servers();
        let at = round * CHUNK;
        f.write_all_at(&data[at..at + CHUNK], at as u64)
            .unwrap_or_else(|e| panic!("write in round {round}: {e}; stderr: {}", m.stderr()));
        let on_the_wire = poll_until(Duration::from_secs(30), || {
            status_counter(&m.mnt, "bytes_written") >= written + CHUNK as u64
        });
        assert!(
            m.sshd().kill_connections() > 0,
            "round {round}: no connection to kill"
        );
        drop(paused);
        assert!(on_the_wire, "round {round}: the write was never sent");
        f.sync_all()
            .unwrap_or_else(|e| panic!("fsync after drop {round}: {e}; stderr: {}", m.stderr()));
        assert!(
            status_counter(&m.mnt, "writes_sent_again") > sent_again,
            "round {round}: the write the drop took was not sent again"
        );
        drop(f);
    }
    assert_same_bytes(&fs::read(m.e("w.bin")).unwrap(), &data, "the server's copy");
}

/// Regression (was a bug): with `-o reconnect`, the operation on an open file that is the
/// first to meet the lost connection fails with EIO instead of waiting for the reconnect and
/// reopening the file. Here the kernel asks GETATTR with the file handle before the read
/// (attr_timeout=0), the fstat on the dead connection fails ("connection lost: sending to the
/// server failed: Channel send error"), and pread returns EIO; the next pread works. A READ
/// that meets the loss fails the same way ("connection lost: the SSH connection or SFTP
/// channel was closed"); with the default TTLs the kernel's readahead fallback often hides it.
/// `reconnect_after_connection_loss` passes because a path operation meets the loss first.
#[test]
fn reconnect_first_operation_on_an_open_file() {
    let m = TestMount::start(&["reconnect", NO_CACHE]);
    const ROUNDS: usize = 10;
    const CHUNK: usize = 100_000;
    let data = pattern(4, ROUNDS * (512 << 10));
    fs::write(m.e("big.bin"), &data).unwrap();
    let reader = File::open(m.p("big.bin")).unwrap();
    let mut head = vec![0u8; 4096];
    reader.read_exact_at(&mut head, 0).unwrap();
    // Whether the client has noticed the loss before the next request is a race, so the
    // drop is repeated; each round reads where the page cache holds nothing.
    let mut failed = Vec::new();
    for round in 0..ROUNDS {
        assert!(m.sshd().kill_connections() > 0);
        // No path operation first: the open file is the first to meet the lost connection.
        let off = round * (512 << 10) + 8192;
        let mut buf = vec![0u8; CHUNK];
        if let Err(e) = reader.read_exact_at(&mut buf, off as u64) {
            failed.push(format!("round {round}: {e}"));
            // The next attempt works (the file is reopened by then).
            reader.read_exact_at(&mut buf, off as u64).unwrap();
        }
        assert_same_bytes(&buf, &data[off..off + CHUNK], &format!("round {round}"));
    }
    assert!(
        failed.is_empty(),
        "the first read after a connection drop, on a file opened before it, failed in {}/{ROUNDS} \
         rounds: {failed:?}",
        failed.len()
    );
}

#[test]
fn reconnect_across_a_server_restart() {
    let mut sshd = TestSshd::start();
    let m = TestMount::daemon(&sshd, &["reconnect", NO_CACHE]);
    fs::write(sshd.export_dir.join("f"), b"before the outage").unwrap();
    let reader = File::open(m.p("f")).unwrap();
    sshd.stop();
    // An operation issued while the server is down waits for it to come back.
    let p = m.p("f");
    let waiting = std::thread::spawn(move || fs::read(p));
    // The outage itself (what is being tested): the server stays down until the mount has
    // noticed the loss and a reconnect attempt has failed against it (`attempt` counts from
    // 1, and attempt 2 starts after the first failed).
    let connection = || {
        mount_status(&m.mnt)["connection"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let retried = |c: &str| {
        c.strip_prefix("Reconnecting { attempt: ")
            .and_then(|rest| rest.split(',').next()?.parse::<u32>().ok())
            .is_some_and(|attempt| attempt >= 2)
    };
    assert!(
        poll_until(Duration::from_secs(30), || retried(&connection())),
        "the mount did not retry while the server was down: {}",
        connection()
    );
    sshd.restart();
    let got = waiting.join().unwrap();
    assert_eq!(
        got.unwrap_or_else(|e| panic!("read across the outage: {e}\nsshd log: {}", sshd.log())),
        b"before the outage"
    );
    let mut buf = [0u8; 6];
    reader.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"before");
    fs::write(m.p("g"), b"after the outage").unwrap();
    assert_eq!(
        fs::read(sshd.export_dir.join("g")).unwrap(),
        b"after the outage"
    );
}

#[test]
fn without_reconnect_a_drop_ends_the_mount() {
    // As with sshfs: without `reconnect`, a lost connection unmounts (no mount whose every
    // operation fails, and no hang).
    let mut m = TestMount::start(&[NO_CACHE]);
    fs::write(m.e("f"), b"x").unwrap();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"x");
    let pid = m.pid();
    assert!(m.sshd().kill_connections() > 0);
    assert!(
        poll_until(EXIT_TIMEOUT, || !is_mounted(&m.mnt)),
        "still mounted after the connection was lost"
    );
    assert!(
        poll_until(EXIT_TIMEOUT, || !pid_alive(pid)),
        "daemon did not exit"
    );
    m.wait_exit(Duration::ZERO);
    // The mount point is an empty directory again.
    assert!(names(&m.mnt).is_empty());
}

// ------------------------------------------------------------------ server-side write errors

/// A small tmpfs on a directory of its own (outside every TempDir), for a server filesystem
/// that fills up or turns read-only. Unmounted, then removed with rmdir, on drop.
struct SmallTmpfs {
    path: PathBuf,
}

impl SmallTmpfs {
    fn new(size: &str) -> SmallTmpfs {
        let path = nix::unistd::mkdtemp(&std::env::temp_dir().join("awcp-tmpfs-XXXXXX"))
            .unwrap()
            .canonicalize()
            .unwrap();
        let (st, _, err) = run_with_deadline(
            Command::new("mount")
                .args([
                    "-t",
                    "tmpfs",
                    "-o",
                    &format!("size={size},mode=0755"),
                    "tmpfs",
                ])
                .arg(&path),
            Duration::from_secs(10),
        );
        assert!(st.success(), "mount tmpfs: {err}");
        SmallTmpfs { path }
    }

    /// Remount read-only. The server closes the handles of files closed through the mount a
    /// moment later (FUSE releases asynchronously), and until then the remount is refused as
    /// busy: retry until a deadline.
    fn remount_ro(&self) {
        let mut last = String::new();
        let ok = poll_until(Duration::from_secs(10), || {
            let (st, _, err) = run_with_deadline(
                Command::new("mount")
                    .args(["-o", "remount,ro"])
                    .arg(&self.path),
                Duration::from_secs(10),
            );
            last = err;
            st.success()
        });
        assert!(ok, "remount ro: {last}");
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        for args in [&[][..], &["-l"][..]] {
            if !is_mounted(&self.path) {
                break;
            }
            // Not the panicking variant: this may run while a test panics.
            let _ = try_run_with_deadline(
                Command::new("umount").args(args).arg(&self.path),
                Duration::from_secs(10),
            );
        }
        if is_mounted(&self.path) {
            eprintln!("warning: {} still mounted; leaving it", self.path.display());
        } else if let Err(e) = fs::remove_dir(&self.path) {
            eprintln!("warning: rmdir {}: {e}", self.path.display());
        }
    }
}

/// Write `data`, fsync (if asked) and close, returning the first error and the step that
/// reported it.
fn write_and_close(path: &Path, data: &[u8], fsync: bool) -> (io::Result<()>, &'static str) {
    use std::os::fd::IntoRawFd;
    let mut f = match File::create(path) {
        Ok(f) => f,
        Err(e) => return (Err(e), "create"),
    };
    let mut first = (Ok(()), "");
    if let Err(e) = f.write_all(data) {
        first = (Err(e), "write");
    } else if fsync {
        if let Err(e) = f.sync_all() {
            first = (Err(e), "fsync");
        }
    }
    let fd = f.into_raw_fd();
    // SAFETY: we own fd and close it exactly once.
    let closed = last_os_error(unsafe { libc::close(fd) });
    if first.0.is_ok() {
        first = (closed, "close");
    }
    first
}

/// Regression (was data loss): a file created early (in a directory made through the mount)
/// and written, then looked up by path while its descriptor was still open, was shown with
/// the size its directory's cached listing had recorded at the create: 0. The kernel took
/// that size, so `lseek(SEEK_END)` returned 0 and the next write overwrote the file's start
/// on the server; `cat` after the close read nothing for the attribute TTL.
#[test]
fn a_file_created_early_shows_its_written_size_to_a_lookup() {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::OpenOptionsExt;
    let m = TestMount::start(&[]);
    for round in 0..20 {
        let dir = m.p(format!("fresh{round}"));
        fs::create_dir(&dir).unwrap();
        let path = dir.join("f");
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&path)
            .unwrap();
        f.write_all(&[b'A'; 100]).unwrap();
        let seen = fs::metadata(&path).unwrap().len();
        let end = f.seek(SeekFrom::End(0)).unwrap();
        f.write_all(&[b'B'; 50]).unwrap();
        drop(f);
        let mut want = vec![b'A'; 100];
        want.extend_from_slice(&[b'B'; 50]);
        let got = fs::read(&path).unwrap();
        let server = fs::read(m.e(format!("fresh{round}/f"))).unwrap();
        assert!(
            seen == 100 && end == 100 && got == want && server == want,
            "round {round}: stat said {seen}, SEEK_END {end}; the mount reads {} bytes, the \
             server holds {} (want 150)",
            got.len(),
            server.len()
        );
    }
}

/// A create in a directory made through the mount is answered before the server has made the
/// file. A file put under that name on the server's side in the meantime (within the listing
/// TTL) makes it fail at the close, through a real mount, and the server's file is left as it
/// was; with `sync_create` the open itself fails with `EEXIST`, as on a local disk.
#[test]
fn a_create_answered_early_that_loses_to_the_server_fails_at_close() {
    use std::os::fd::IntoRawFd;
    for (opts, early) in [(&[][..], true), (&["sync_create"][..], false)] {
        let m = TestMount::start(opts);
        fs::create_dir(m.p("d")).unwrap();
        fs::write(m.e("d/f"), b"theirs").unwrap();
        let opened = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(m.p("d/f"));
        if early {
            let mut f = opened.expect("a create in a directory made here is answered early");
            // (Refused already if the server's answer came first.)
            let _ = f.write_all(b"mine");
            let fd = f.into_raw_fd();
            // SAFETY: we own fd and close it exactly once.
            let closed = last_os_error(unsafe { libc::close(fd) });
            assert!(closed.is_err(), "the close hid the failed create");
        } else {
            let e = opened.expect_err("sync_create: the open waits for the server");
            assert_eq!(e.raw_os_error(), Some(libc::EEXIST), "{opts:?}");
        }
        assert_eq!(fs::read(m.e("d/f")).unwrap(), b"theirs", "{opts:?}");
        // The mount shows their file (once the kernel has dropped the name it was told of).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match fs::read(m.p("d/f")) {
                Ok(data) if data == b"theirs" => break,
                seen if std::time::Instant::now() > deadline => {
                    panic!("{opts:?}: the mount shows {seen:?} for d/f")
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// Regression (was a bug): an ordinary create (`>`, `O_CREAT|O_TRUNC`, no `O_EXCL`) answered
/// early in a directory made through the mount failed with EIO at its write or close when a
/// file of that name had been made on the server's side meanwhile (the OPEN sent for it is
/// exclusive), and the server kept the old file; `tar -x` over it failed. Expected, as
/// open(2) does: the file is opened, truncated and written.
#[test]
fn an_ordinary_create_answered_early_opens_a_file_made_meanwhile() {
    let m = TestMount::start(&[]);
    fs::create_dir(m.p("d")).unwrap();
    // Made on the server's side, after the mkdir: the mount's listing of d says it is empty.
    fs::write(m.e("d/f"), b"theirs, longer than mine").unwrap();
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("d/f"))
        .expect("create");
    f.write_all(b"mine").expect("write");
    f.sync_all().expect("fsync");
    drop(f);
    assert_eq!(fs::read(m.e("d/f")).unwrap(), b"mine", "the server's copy");
}

/// Regression (was a bug): a directory moved while the mount was listing it (a lookup of a
/// directory lists it ahead, in the background) was kept with an empty listing: sftp-server
/// stats each entry by the path it opened, which the move took away, and leaves out what it
/// cannot stat. `ls` showed it empty, `rm -rf` failed with ENOTEMPTY, for the listing TTL.
/// (A black-box review's sequence; 5-8 rounds in 10 went wrong without the fix.)
#[test]
fn a_directory_moved_while_being_listed_shows_what_it_holds() {
    let m = TestMount::start(&[]);
    for round in 0..10 {
        let r = m.p(format!("r{round}"));
        fs::create_dir(&r).unwrap();
        let p = |rel: &str| r.join(rel);
        fs::create_dir(p("e")).unwrap();
        fs::create_dir(p("e/f")).unwrap();
        fs::rename(p("e"), p("a")).unwrap();
        let held = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(p("e"))
            .unwrap();
        fs::create_dir(p("d")).unwrap();
        fs::rename(p("e"), p("d/x")).unwrap();
        fs::create_dir(p("e")).unwrap();
        assert!(fs::remove_dir(p("a")).is_err(), "a holds f");
        fs::rename(p("a"), p("b")).unwrap();
        // The lookup of b that comes with it lists b in the background.
        assert!(fs::hard_link(p("d/x"), p("b")).is_err(), "b exists");
        fs::rename(p("b"), p("e/f")).unwrap();
        let listed = names(&p("e/f"));
        drop(held);
        assert_eq!(listed, ["f"], "round {round}: the moved directory lists");
    }
}

#[test]
fn server_write_errors_reach_the_application() {
    let sshd = TestSshd::start();
    // Declared before the mount: dropped (unmounted) after it.
    let small = SmallTmpfs::new("1m");
    let m = TestMount::daemon_dir(&sshd, &small.path, &[NO_CACHE]);

    // ENOSPC: 2 MiB into a 1 MiB filesystem fails with ENOSPC, never silently: writes are
    // acknowledged before the server has them, so the error comes at fsync, or at close
    // (flush) without an fsync.
    for fsync in [false, true] {
        let (r, step) = write_and_close(&m.p("too-big"), &pattern(9, 2 << 20), fsync);
        eprintln!("ENOSPC reported at {step} (fsync: {fsync})");
        assert_errno(
            r,
            libc::ENOSPC,
            &format!("2 MiB into 1 MiB, fsync {fsync}, at {step}"),
        );
        // Space again after removing it.
        fs::remove_file(m.p("too-big")).unwrap();
    }
    // ...once the server has closed it: its CLOSE follows the kernel's RELEASE, which comes
    // asynchronously after close(2). Until then the unlinked file keeps the space.
    let free = || {
        let v = nix::sys::statvfs::statvfs(&small.path).unwrap();
        v.blocks_available() * v.fragment_size()
    };
    assert!(
        poll_until(Duration::from_secs(30), || free() >= 256 << 10),
        "the removed files' space was not freed on the server: {} bytes free",
        free()
    );
    let (r, _) = write_and_close(&m.p("fits"), b"fits", true);
    r.unwrap();
    assert_eq!(fs::read(small.path.join("fits")).unwrap(), b"fits");

    // EROFS once the server filesystem turns read-only, as on a local read-only disk.
    small.remount_ro();
    assert_errno(
        fs::write(m.p("new"), b"x"),
        libc::EROFS,
        "create on a read-only server fs",
    );
    assert_errno(
        fs::create_dir(m.p("dir")),
        libc::EROFS,
        "mkdir on a read-only server fs",
    );
    assert_errno(
        OpenOptions::new().write(true).open(m.p("fits")),
        libc::EROFS,
        "open for writing on a read-only server fs",
    );
    assert_eq!(fs::read(m.p("fits")).unwrap(), b"fits", "reads still work");
    drop(m);
}

// ------------------------------------------------------------------ more of what tools do

#[test]
fn mmap_read_and_shared_write() {
    let m = TestMount::start(&[NO_CACHE]);
    const LEN: usize = 1 << 20;
    let data = pattern(5, LEN);
    fs::write(m.e("map.bin"), &data).unwrap();

    // Read-only mapping (git reads pack files this way).
    let f = File::open(m.p("map.bin")).unwrap();
    let map = Mapping::new(&f, 0, LEN, false);
    assert_same_bytes(map.bytes(), &data, "read through mmap");
    drop(map);
    drop(f);

    // Shared writable mapping, msync'ed: the changes reach the server.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("map.bin"))
        .unwrap();
    let mut want = data.clone();
    let mut map = Mapping::new(&f, 0, LEN, true);
    for (off, bytes) in [
        (0usize, &b"MMAP"[..]),
        (700_000, b"DIRTY PAGE"),
        (LEN - 3, b"end"),
    ] {
        map.bytes_mut()[off..off + bytes.len()].copy_from_slice(bytes);
        want[off..off + bytes.len()].copy_from_slice(bytes);
    }
    map.sync().unwrap_or_else(|e| panic!("msync: {e}"));
    drop(map);
    drop(f);
    assert_same_bytes(
        &fs::read(m.e("map.bin")).unwrap(),
        &want,
        "server copy after msync",
    );
}

#[test]
fn parallel_readers_and_writers() {
    let m = TestMount::start(&[]);
    let shared = pattern(77, 1 << 20);
    fs::write(m.e("shared.bin"), &shared).unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (m, shared) = (&m, &shared);
            s.spawn(move || {
                let mine = pattern(1000 + t, (256 << 10) + t as usize * 1000);
                let name = m.p(format!("t{t}"));
                for round in 0..3 {
                    fs::write(&name, &mine).unwrap();
                    let back = fs::read(&name).unwrap();
                    assert_same_bytes(&back, &mine, &format!("thread {t} round {round}"));
                    let got = fs::read(m.p("shared.bin")).unwrap();
                    assert_same_bytes(&got, shared, &format!("shared, thread {t}"));
                }
            });
        }
    });
    for t in 0..8u64 {
        let mine = pattern(1000 + t, (256 << 10) + t as usize * 1000);
        assert_same_bytes(
            &fs::read(m.e(format!("t{t}"))).unwrap(),
            &mine,
            "server copy",
        );
    }
}

#[test]
fn executing_programs_from_the_mount() {
    let m = TestMount::start(&[]);
    fs::write(m.p("run.sh"), "#!/bin/sh\necho \"ran with $1\"\n").unwrap();
    fs::set_permissions(m.p("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    let out = run_ok(Command::new(m.p("run.sh")).arg("arg"));
    assert_eq!(out.stdout, b"ran with arg\n");
    // An ELF binary, copied in (fs::copy keeps the mode).
    fs::copy("/bin/echo", m.p("echo")).unwrap();
    let out = Command::new(m.p("echo")).arg("hello").output().unwrap();
    assert_eq!(out.stdout, b"hello\n", "{out:?}");
    // Without an execute bit: EACCES, as on a local disk.
    fs::write(m.p("plain.sh"), "#!/bin/sh\necho no\n").unwrap();
    assert_errno(
        Command::new(m.p("plain.sh")).output(),
        libc::EACCES,
        "exec of a 0644 file",
    );
}

#[test]
fn daemon_mode_detaches_from_the_caller() {
    let sshd = TestSshd::start();
    // Relative key and known_hosts paths, resolved against the caller's directory; the
    // caller captures stdout and stderr through pipes.
    let how = Launch {
        cwd: Some(sshd.dir.path()),
        pipes: true,
        ..Default::default()
    };
    let m = TestMount::launch_with(how, &sshd.export_dir, |mnt| {
        let mut a = base_args(&sshd, &sshd.export_dir, mnt);
        a.extend(["-o".into(), "IdentityFile=id_ed25519".into()]);
        a.extend(["-o".into(), "UserKnownHostsFile=known_hosts".into()]);
        a.extend(["-o".into(), "reconnect".into()]);
        a.extend(["-o".into(), NO_CACHE.into()]);
        a
    })
    .unwrap_or_else(|f| panic!("daemon mount with pipes: {f:?}"));
    let pid = m.pid();
    for fd in 0..3 {
        let target = fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap();
        assert_eq!(target, Path::new("/dev/null"), "daemon fd {fd}");
    }
    let sid = nix::unistd::getsid(Some(nix::unistd::Pid::from_raw(pid))).unwrap();
    assert_eq!(
        sid.as_raw(),
        pid,
        "the daemon is not in a session of its own"
    );
    // Reconnecting re-reads the (relative) key: still works.
    fs::write(sshd.export_dir.join("f"), b"x").unwrap();
    assert!(sshd.kill_connections() > 0);
    assert_eq!(
        fs::read(m.p("f")).unwrap_or_else(|e| panic!("after reconnect: {e}")),
        b"x"
    );
}

/// Regression (was a bug): the daemon keeps the caller's working directory. sshfs (libfuse's
/// `fuse_daemonize`) changes to `/`, so the directory the executor ran it from (or the
/// filesystem it is on) is not kept busy for the life of the mount: here `umount` of that
/// filesystem fails with EBUSY. (A fix must resolve relative IdentityFile, CertificateFile
/// and UserKnownHostsFile paths first: they are re-read on reconnect, see
/// `daemon_mode_detaches_from_the_caller`.)
#[test]
fn daemon_changes_to_the_root_directory() {
    let sshd = TestSshd::start();
    let small = SmallTmpfs::new("1m");
    let how = Launch {
        cwd: Some(&small.path),
        ..Default::default()
    };
    let m = TestMount::launch_with(how, &sshd.export_dir, |mnt| {
        standard_args(&sshd, &sshd.export_dir, mnt, &[])
    })
    .unwrap_or_else(|f| panic!("mount: {f:?}"));
    let cwd = fs::read_link(format!("/proc/{}/cwd", m.pid())).unwrap();
    assert_eq!(
        cwd,
        Path::new("/"),
        "the daemon's working directory is the caller's; unmounting the filesystem it is on \
         fails with EBUSY while the mount lives"
    );
}

// ------------------------------------------------------------------ POSIX details
//
// Differences a differential probe (the same system calls on a local directory and on the
// mount) found; each test asserts what the local directory gives.

/// `mkdir` in a setgid directory: the new directory inherits S_ISGID and the group.
#[test]
fn posix_mkdir_in_a_setgid_directory_keeps_setgid() {
    use std::os::unix::fs::DirBuilderExt;
    let m = TestMount::start(&[NO_CACHE]);
    fs::create_dir(m.p("sg")).unwrap();
    std::os::unix::fs::chown(m.p("sg"), None, Some(4242)).unwrap();
    fs::set_permissions(m.p("sg"), fs::Permissions::from_mode(0o2775)).unwrap();
    fs::DirBuilder::new()
        .mode(0o755)
        .create(m.p("sg/s"))
        .unwrap();
    let s = fs::metadata(m.p("sg/s")).unwrap();
    assert_eq!((s.mode() & 0o7777, s.gid()), (0o2755, 4242), "mount");
    let s = fs::metadata(m.e("sg/s")).unwrap();
    assert_eq!((s.mode() & 0o7777, s.gid()), (0o2755, 4242), "server");
}

/// On a mount local users share (`allow_other`, here with the kernel's permission checks)
/// and a root server account, what a user makes is theirs, as on a local disk, and they may
/// then chmod it; a directory's link count follows its subdirectories.
#[test]
fn posix_shared_mount_gives_new_files_to_their_maker() {
    use std::os::unix::process::CommandExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (a root server account, and a second local user)");
        return;
    }
    let m = TestMount::start(&["allow_other"]);
    assert!(
        m.stderr()
            .contains("allow_other without default_permissions"),
        "warned: {}",
        m.stderr()
    );
    drop(m);
    let m = TestMount::start(&["allow_other", "default_permissions"]);
    assert!(!m.stderr().contains("without default_permissions"));
    // The way to the mount, for another user (the mount point's own directory is 0700).
    fs::set_permissions(m.mnt.parent().unwrap(), fs::Permissions::from_mode(0o711)).unwrap();
    fs::set_permissions(&m.mnt, fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir(m.p("shared")).unwrap();
    fs::set_permissions(m.p("shared"), fs::Permissions::from_mode(0o777)).unwrap();
    // As uid 65534: the kernel sends the request with that uid.
    run_ok(
        Command::new("sh")
            .args([
                "-c",
                "mkdir d && mkdir d/sub && echo hi > f && ln -s f l && chmod 600 f",
            ])
            .current_dir(m.p("shared"))
            .uid(65534)
            .gid(65534),
    );
    for rel in ["shared/d", "shared/d/sub", "shared/f", "shared/l"] {
        let s = fs::symlink_metadata(m.e(rel)).unwrap();
        assert_eq!((s.uid(), s.gid()), (65534, 65534), "{rel} on the server");
        let s = fs::symlink_metadata(m.p(rel)).unwrap();
        assert_eq!(
            (s.uid(), s.gid()),
            (65534, 65534),
            "{rel} through the mount"
        );
    }
    assert_eq!(fs::metadata(m.e("shared/f")).unwrap().mode() & 0o777, 0o600);
    assert_eq!(fs::read(m.e("shared/f")).unwrap(), b"hi\n");
    // Root's own files stay root's.
    fs::create_dir(m.p("shared/r")).unwrap();
    assert_eq!(fs::metadata(m.e("shared/r")).unwrap().uid(), 0);

    let nlink = |rel: &str| fs::metadata(m.p(rel)).unwrap().nlink();
    assert_eq!((nlink("shared/d"), nlink("shared/d/sub")), (3, 2));
    fs::rename(m.p("shared/d/sub"), m.p("shared/r/sub")).unwrap();
    assert_eq!(
        (nlink("shared/d"), nlink("shared/r")),
        (2, 3),
        "after a rename"
    );
    fs::remove_dir(m.p("shared/r/sub")).unwrap();
    assert_eq!(nlink("shared/r"), 2, "after rmdir");
}

fn mknod(p: &Path, mode: libc::mode_t) -> io::Result<()> {
    mknod_device(p, mode, 0)
}

fn mknod_device(p: &Path, mode: libc::mode_t, rdev: libc::dev_t) -> io::Result<()> {
    let c = cpath(p);
    // SAFETY: valid NUL-terminated path.
    last_os_error(unsafe { libc::mknod(c.as_ptr(), mode, rdev) })
}

/// `mknod(S_IFREG)` creates an empty regular file on the server.
#[test]
fn posix_mknod_of_a_regular_file_creates_it() {
    let m = TestMount::start(&[NO_CACHE]);
    mknod(&m.p("r"), libc::S_IFREG | 0o640).unwrap();
    let s = fs::symlink_metadata(m.p("r")).unwrap();
    assert!(s.is_file(), "mount: {:o}", s.mode());
    assert_eq!((s.mode() & 0o7777, s.len()), (0o640, 0));
    let s = fs::symlink_metadata(m.e("r")).unwrap();
    assert!(s.is_file(), "server: {:o}", s.mode());
    assert_eq!((s.mode() & 0o7777, s.len()), (0o640, 0));
    // Without a type, mknod makes a regular file too.
    mknod(&m.p("untyped"), 0o600).unwrap();
    assert!(fs::symlink_metadata(m.e("untyped")).unwrap().is_file());
    fs::write(m.p("r"), b"usable").unwrap();
    assert_eq!(fs::read(m.e("r")).unwrap(), b"usable");
    assert_errno(
        mknod(&m.p("r"), libc::S_IFREG | 0o640),
        libc::EEXIST,
        "mknod over an existing file",
    );
}

/// Device nodes made in the mount are kept by the mount with their numbers, as FIFOs are
/// (SFTP cannot make them): stat, listings, rename and unlink work as on a local disk, the
/// server never sees them, and they cannot be opened as devices, the mount being `nodev`.
#[test]
fn device_nodes_are_kept_by_the_mount_and_cannot_be_opened() {
    use std::os::unix::fs::FileTypeExt;
    let m = TestMount::start(&[NO_CACHE]);
    let null = libc::makedev(1, 3);
    let made = mknod_device(&m.p("null"), libc::S_IFCHR | 0o644, null);
    if !nix::unistd::geteuid().is_root() {
        // Only CAP_MKNOD may make one; the kernel refuses before it asks the mount.
        assert_errno(made, libc::EPERM, "mknod as a user");
        eprintln!("device_nodes_are_kept_by_the_mount...: not root, only EPERM checked");
        return;
    }
    made.unwrap();
    mknod_device(&m.p("loop"), libc::S_IFBLK | 0o600, libc::makedev(7, 9)).unwrap();
    let s = fs::symlink_metadata(m.p("null")).unwrap();
    assert!(s.file_type().is_char_device(), "{:o}", s.mode());
    assert_eq!((s.rdev(), s.mode() & 0o7777), (null, 0o644));
    let s = fs::symlink_metadata(m.p("loop")).unwrap();
    assert!(s.file_type().is_block_device(), "{:o}", s.mode());
    assert_eq!(s.rdev(), libc::makedev(7, 9));
    // nodev: /dev/null's numbers open nothing here.
    assert_errno(
        OpenOptions::new().write(true).open(m.p("null")),
        libc::EACCES,
        "open of a device node",
    );
    let listed = listed_types(&m.mnt, |t| (t.is_char_device(), t.is_block_device()));
    assert_eq!(
        listed,
        vec![
            ("loop".into(), (false, true)),
            ("null".into(), (true, false))
        ]
    );
    assert_eq!(
        fs::read_dir(&m.export).unwrap().count(),
        0,
        "nothing on the server"
    );
    fs::rename(m.p("null"), m.p("zero")).unwrap();
    // The kernel keeps a device number from the inode's first answer: it forgets the inode
    // (nothing holds it) so that the stat below is answered by a lookup of the new name.
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    assert_eq!(fs::symlink_metadata(m.p("zero")).unwrap().rdev(), null);
    fs::remove_file(m.p("zero")).unwrap();
    fs::remove_file(m.p("loop")).unwrap();
    assert_eq!(fs::read_dir(&m.mnt).unwrap().count(), 0);
}

/// A FIFO and a unix socket made in the mount work as on a local disk (the kernel carries
/// the bytes; the mount keeps the names), show in listings with their types, move with
/// rename, and are never made on the server, which cannot hold them.
#[test]
fn fifos_and_unix_sockets_work_in_the_mount_and_stay_local() {
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::net::{UnixListener, UnixStream};
    // No kernel caching: every path walk asks the mount, which must know these names.
    let m = TestMount::start(&[NO_CACHE]);
    fs::create_dir(m.p("d")).unwrap();
    mkfifo(&m.p("d/pipe")).unwrap();
    assert!(fs::symlink_metadata(m.p("d/pipe"))
        .unwrap()
        .file_type()
        .is_fifo());
    let writer = {
        let path = m.p("d/pipe");
        std::thread::spawn(move || fs::write(path, b"through the FIFO"))
    };
    assert_eq!(fs::read(m.p("d/pipe")).unwrap(), b"through the FIFO");
    writer.join().unwrap().unwrap();

    let listener = UnixListener::bind(m.p("d/sock")).unwrap();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut got = [0u8; 5];
        conn.read_exact(&mut got).unwrap();
        conn.write_all(b"pong").unwrap();
        got
    });
    let mut client = UnixStream::connect(m.p("d/sock")).unwrap();
    client.write_all(b"ping!").unwrap();
    let mut answer = String::new();
    client.read_to_string(&mut answer).unwrap();
    assert_eq!(
        (&server.join().unwrap(), answer.as_str()),
        (b"ping!", "pong")
    );

    let listed = listed_types(&m.p("d"), |t| (t.is_fifo(), t.is_socket()));
    assert_eq!(
        listed,
        vec![
            ("pipe".into(), (true, false)),
            ("sock".into(), (false, true))
        ]
    );
    assert_eq!(
        fs::read_dir(m.e("d")).unwrap().count(),
        0,
        "nothing on the server"
    );

    // Renamed into another directory (which then cannot be removed), still a FIFO.
    fs::create_dir(m.p("e")).unwrap();
    fs::rename(m.p("d/pipe"), m.p("e/pipe")).unwrap();
    assert!(fs::symlink_metadata(m.p("e/pipe"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert_errno(fs::remove_dir(m.p("e")), libc::ENOTEMPTY, "rmdir of e");
    assert!(m.e("e").is_dir());
    // `rm -rf` removes them like anything else.
    let rm = Command::new("rm")
        .arg("-rf")
        .arg(m.p("d"))
        .arg(m.p("e"))
        .status();
    assert!(rm.unwrap().success());
    assert!(!m.e("d").exists() && !m.e("e").exists());
    assert_errno(
        fs::symlink_metadata(m.p("e/pipe")),
        libc::ENOENT,
        "after rm -rf",
    );
}

/// The largest offset at which the kernel lets a one-byte write through (2^63-2).
const NEAR_MAX: u64 = (1 << 63) - 2;

/// `path` created (or emptied) and opened for reading and writing.
fn create_read_write(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap()
}

/// A write at 2^63-2 (one byte, so the kernel lets it through) or a truncate to it: EFBIG, as
/// on the local disk the export is on; not sftp-server's EINVAL of its seek, nor EIO. (The
/// write is acknowledged at once, write-behind: the error comes by fsync and close.)
#[test]
fn posix_write_or_truncate_past_the_largest_offset_is_efbig() {
    let m = TestMount::start(&[NO_CACHE]);
    let f = create_read_write(&m.p("big"));
    // The same calls on the export directly: what a local disk says.
    let local = File::options().write(true).open(m.e("big")).unwrap();
    let local_write = errno_of(local.write_at(b"x", NEAR_MAX));
    let local_truncate = errno_of(local.set_len(NEAR_MAX));
    assert_eq!(
        (local_write, local_truncate),
        (libc::EFBIG, libc::EFBIG),
        "local disk"
    );
    let got = match f.write_at(b"x", NEAR_MAX) {
        Ok(n) => {
            assert_eq!(n, 1, "pwrite at 2^63-2 (answered behind) wrote {n} bytes");
            errno_of(f.sync_all())
        }
        Err(e) => e.raw_os_error().unwrap_or(-1),
    };
    // (What the server and the mount saw, should this ever fail again. CI once got success
    // here: another test's child closed its copy of `f`, see
    // `fsync_and_close_report_a_failed_write_after_a_child_closed_its_copy`.)
    assert_eq!(
        errno_name(got),
        errno_name(libc::EFBIG),
        "pwrite at 2^63-2, then fsync; the server's file is {} bytes; mount status: {}; sshd log:\n{}",
        fs::metadata(m.e("big")).map_or(u64::MAX, |s| s.len()),
        mount_status(&m.mnt),
        m.sshd().log()
    );
    assert_errno(f.set_len(NEAR_MAX), libc::EFBIG, "ftruncate to 2^63-2");
    assert_errno(
        truncate_path(&m.p("big"), NEAR_MAX as i64),
        libc::EFBIG,
        "truncate to 2^63-2",
    );
    drop(f);
    assert_eq!(fs::metadata(m.e("big")).unwrap().len(), 0);
}

/// fstat of a descriptor whose file was unlinked through the mount: st_nlink 0.
#[test]
fn posix_unlinked_open_file_has_nlink_0() {
    let m = TestMount::start(&[NO_CACHE]);
    let mut f = File::create(m.p("f")).unwrap();
    f.write_all(b"data").unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 1);
    fs::remove_file(m.p("f")).unwrap();
    let s = f.metadata().unwrap();
    assert_eq!((s.nlink(), s.len()), (0, 4), "fstat after unlink");
    f.set_len(1).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 0, "after ftruncate");
}

/// `-o follow_symlinks`: a symlink made through the mount stays a symlink while the kernel
/// holds it, so `lchown` of it works (its reply used to carry the target's type: the kernel
/// marked the inode bad, EIO) and a second look still shows a link; a link the mount sees
/// for the first time is followed.
#[test]
fn posix_follow_symlinks_lchown_of_a_new_symlink() {
    for opts in [&[NO_CACHE, "follow_symlinks"][..], &["follow_symlinks"][..]] {
        let m = TestMount::start(opts);
        // (Made on the server before the mount caches anything.)
        std::os::unix::fs::symlink("f", m.e("server_link")).unwrap();
        File::create(m.p("f")).unwrap();
        std::os::unix::fs::symlink("f", m.p("l")).unwrap();
        assert!(fs::symlink_metadata(m.p("l"))
            .unwrap()
            .file_type()
            .is_symlink());
        std::os::unix::fs::lchown(m.p("l"), Some(4444), Some(4444))
            .unwrap_or_else(|e| panic!("lchown ({opts:?}): {e}"));
        let s = fs::symlink_metadata(m.e("l")).unwrap();
        assert_eq!((s.uid(), s.gid()), (4444, 4444), "server link");
        assert_ne!(fs::metadata(m.e("f")).unwrap().uid(), 4444, "server target");
        let s = fs::symlink_metadata(m.p("l")).unwrap();
        assert!(s.file_type().is_symlink(), "second look ({opts:?})");
        assert_eq!((s.uid(), s.gid()), (4444, 4444), "mount");
        assert_eq!(fs::read_link(m.p("l")).unwrap(), Path::new("f"));
        // Through the link: the file.
        fs::write(m.p("l"), b"via link").unwrap();
        assert_eq!(fs::read(m.e("f")).unwrap(), b"via link");
        // A link made on the server is followed.
        let s = fs::symlink_metadata(m.p("server_link")).unwrap();
        assert!(s.is_file(), "followed ({opts:?})");
        assert_eq!(s.len(), 8);
    }
}

/// ctime moves on every status change made through the mount (an emulation: SFTP v3 has no
/// ctime), as POSIX test suites check: chmod, chown, utimes, truncate, write, rename, link,
/// unlink.
#[test]
fn posix_ctime_advances_on_every_status_change() {
    fn ctime(m: &fs::Metadata) -> (i64, i64) {
        (m.ctime(), m.ctime_nsec())
    }
    for opts in [&[NO_CACHE][..], &[][..]] {
        let m = TestMount::start(opts);
        fs::write(m.e("f"), b"0123456789").unwrap();
        set_times(&m.e("f"), Some((1_000_000, 0)), Some((1_000_000, 0))).unwrap();
        let mut last = ctime(&fs::metadata(m.p("f")).unwrap());
        assert_eq!(last, (1_000_000, 0), "untouched: the mtime ({opts:?})");
        let mut wrong = Vec::new();
        let mut check = |what: &str, now: (i64, i64)| {
            if now <= last {
                wrong.push(format!("{what}: ctime {now:?}, was {last:?}"));
            }
            last = now;
        };
        let stat = |p: &str| ctime(&fs::metadata(m.p(p)).unwrap());
        fs::set_permissions(m.p("f"), fs::Permissions::from_mode(0o600)).unwrap();
        check("chmod", stat("f"));
        std::os::unix::fs::chown(m.p("f"), Some(0), Some(0)).unwrap();
        check("chown", stat("f"));
        set_times(&m.p("f"), Some((2_000_000, 0)), Some((2_000_000, 0))).unwrap();
        check("utimes into the past", stat("f"));
        truncate_path(&m.p("f"), 4).unwrap();
        check("truncate", stat("f"));
        let mut fd = OpenOptions::new().write(true).open(m.p("f")).unwrap();
        fd.write_all(b"w").unwrap();
        check("write", ctime(&fd.metadata().unwrap()));
        fs::rename(m.p("f"), m.p("g")).unwrap();
        check("rename", stat("g"));
        fs::hard_link(m.p("g"), m.p("h")).unwrap();
        // One inode for both names: the old name shows the link's ctime at once, cached or not.
        check("link", stat("g"));
        fs::remove_file(m.p("g")).unwrap();
        check("unlink (fstat)", ctime(&fd.metadata().unwrap()));
        assert!(wrong.is_empty(), "{opts:?}:\n  {}", wrong.join("\n  "));
    }
}

/// What SFTP cannot do behaves as on a local filesystem without it, and says nothing in the
/// mount's log (fuser's own answers logged "[Not Implemented]" at WARN): `SEEK_DATA` and
/// `SEEK_HOLE` see the file as all data, `posix_fallocate` reserves by writing zeros,
/// `copy_file_range` copies, `poll` is always ready.
#[test]
fn unsupported_file_operations_act_as_on_a_local_disk_and_log_nothing() {
    let sshd = TestSshd::start();
    let m = TestMount::foreground(&sshd, &[]);
    let path = m.p("f");
    fs::write(&path, pattern(5, 10_000)).unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let fd = f.as_raw_fd();
    unsafe {
        assert_eq!(libc::lseek(fd, 100, libc::SEEK_DATA), 100);
        assert_eq!(libc::lseek(fd, 100, libc::SEEK_HOLE), 10_000);
        assert_eq!(libc::posix_fallocate(fd, 0, 20_000), 0);
    }
    assert_eq!(f.metadata().unwrap().len(), 20_000);
    let out = File::create(m.p("g")).unwrap();
    let (mut off_in, mut off_out) = (0i64, 0i64);
    let n =
        unsafe { libc::copy_file_range(fd, &mut off_in, out.as_raw_fd(), &mut off_out, 10_000, 0) };
    assert_eq!(n, 10_000, "copy_file_range: {}", io::Error::last_os_error());
    drop(out);
    assert_same_bytes(
        &fs::read(m.p("g")).unwrap(),
        &pattern(5, 10_000),
        "the copy",
    );
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLOUT,
        revents: 0,
    };
    assert_eq!(unsafe { libc::poll(&mut pfd, 1, 0) }, 1);
    drop(f);
    let log = m.stderr();
    assert!(!log.contains("Not Implemented"), "the mount's log:\n{log}");
}

/// Extended attributes are not supported (SFTP v3 has none) and say so as a local
/// filesystem without them does (EOPNOTSUPP). The kernel learns it from the first request
/// and stops asking: neither later xattr calls (`ls -l` makes two per file) nor the
/// `security.capability` check of every write(2) reach the mount.
#[test]
fn xattrs_unsupported_and_asked_once() {
    let m = TestMount::start(&[]);
    let path = m.p("f");
    let mut f = File::create(&path).unwrap();
    f.write_all(b"x").unwrap();
    let c = cpath(&path);
    let name = CString::new("user.test").unwrap();
    let get = || unsafe { libc::lgetxattr(c.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    let list = || unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
    let set = || unsafe { libc::lsetxattr(c.as_ptr(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    let remove = || unsafe { libc::lremovexattr(c.as_ptr(), name.as_ptr()) };
    let result = |rc: libc::ssize_t| last_os_error(if rc < 0 { -1 } else { 0 });
    assert_errno(result(get()), libc::EOPNOTSUPP, "getxattr");
    assert_errno(result(list()), libc::EOPNOTSUPP, "listxattr");
    assert_errno(result(set() as libc::ssize_t), libc::EOPNOTSUPP, "setxattr");
    assert_errno(
        result(remove() as libc::ssize_t),
        libc::EOPNOTSUPP,
        "removexattr",
    );

    let before = status_counter(&m.mnt, "ops");
    for _ in 0..50 {
        assert_errno(result(get()), libc::EOPNOTSUPP, "getxattr again");
        assert_errno(result(list()), libc::EOPNOTSUPP, "listxattr again");
    }
    assert_eq!(
        status_counter(&m.mnt, "ops"),
        before,
        "xattr calls after the first reached the mount"
    );

    // Each write(2) is one FUSE_WRITE (no writeback cache); with xattrs asked for, each
    // would also be a FUSE_GETXATTR of security.capability.
    const WRITES: u64 = 30;
    let before = status_counter(&m.mnt, "ops");
    for i in 0..WRITES {
        f.write_all_at(b"y", i + 1).unwrap();
    }
    let sent = status_counter(&m.mnt, "ops") - before;
    assert!(
        sent <= WRITES + 2,
        "{WRITES} writes cost {sent} requests to the mount (xattr checks per write?)"
    );
    drop(f);
    assert_eq!(fs::metadata(m.e("f")).unwrap().len(), 1 + WRITES);
}

/// The mount's network side runs on one tokio worker (`mount::io_runtime`): a second one
/// cost a wake-up per request and bought nothing measurable. Busy work in parallel still
/// completes on it.
#[test]
fn one_network_worker_serves_parallel_work() {
    let m = TestMount::start(&[]);
    let data = pattern(7, 3 << 20);
    let writers: Vec<_> = (0..4)
        .map(|i| {
            let path = m.p(format!("f{i}"));
            let data = data.clone();
            std::thread::spawn(move || fs::write(path, data).unwrap())
        })
        .collect();
    writers.into_iter().for_each(|t| t.join().unwrap());
    for i in 0..4 {
        assert_same_bytes(
            &fs::read(m.p(format!("f{i}"))).unwrap(),
            &data,
            "parallel write",
        );
    }
    let workers = fs::read_dir(format!("/proc/{}/task", m.pid()))
        .unwrap()
        .filter(|t| {
            let comm = t.as_ref().unwrap().path().join("comm");
            fs::read_to_string(comm).is_ok_and(|c| c.trim() == "awcp-io")
        })
        .count();
    assert_eq!(workers, 1, "tokio worker threads of the mount");
}

/// A child process that inherited the descriptor closes its copy (at exec: O_CLOEXEC) between
/// the owner's write and its fsync or close: the kernel sends a FLUSH of the same handle, which
/// is told of the failure of the write, and the owner's fsync or close must still report it. Every
/// `Command::spawn` of another thread does that; in CI, the parallel tests' spawns made the
/// EFBIG test above get success from fsync once.
#[test]
fn fsync_and_close_report_a_failed_write_after_a_child_closed_its_copy() {
    let m = TestMount::start(&[NO_CACHE]);
    let f = create_read_write(&m.p("big"));
    // Answered when queued; the server refuses it.
    assert_eq!(f.write_at(b"x", NEAR_MAX).unwrap(), 1);
    let child = Command::new("/bin/true").status().unwrap();
    assert!(child.success());
    assert_errno(f.sync_all(), libc::EFBIG, "fsync after a child's close");
    // Reported once: the file is usable again.
    f.write_at(b"ok", 0).unwrap();
    f.sync_all().unwrap();
    // The same for the owner's close(2), which a child's close of its copy does not take.
    assert_eq!(f.write_at(b"x", NEAR_MAX).unwrap(), 1);
    assert!(Command::new("/bin/true").status().unwrap().success());
    let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
    // SAFETY: we own fd and close it exactly once.
    let closed = last_os_error(unsafe { libc::close(fd) });
    assert_errno(closed, libc::EFBIG, "close after a child's close");
    assert_eq!(fs::read(m.e("big")).unwrap(), b"ok");
}

/// Mounting again where a mount was just detached while a file was still open in it
/// (`fusermount3 -u -z`): the old process lives on until that file is closed, and still
/// answers on the mount point's control socket. The new mount waits a moment, then takes the
/// socket's name over, so `status` reaches the new mount, and the old process's exit does not
/// remove the new socket. (The new mount used to run without a control socket, "Address
/// already in use", while `status` reached the old one; the same happened for a moment after
/// every plain unmount, while the old process was exiting.)
#[test]
fn remount_after_a_lazy_unmount_gets_its_own_control_socket() {
    let sshd = TestSshd::start();
    let first = TestMount::daemon(&sshd, &[]);
    let mnt = first.mnt.clone();
    let old = first.pid();
    fs::write(first.e("f"), b"held").unwrap();
    let held = File::open(first.p("f")).unwrap();
    let unmount = |lazy: bool| {
        let mut cmd = Command::new("fusermount3");
        cmd.arg("-u");
        if lazy {
            cmd.arg("-z");
        }
        let (st, _, err) = run_with_deadline(cmd.arg(&mnt), Duration::from_secs(10));
        assert!(st.success(), "fusermount3 -u (lazy: {lazy}): {err}");
    };
    unmount(true);
    let (st, _, err) =
        run_with_deadline(Command::new(BIN).args(&first.args), Duration::from_secs(30));
    assert!(st.success(), "second mount: {err}");
    let new: Vec<i32> = first
        .same_cmdline()
        .into_iter()
        .filter(|&p| p != old)
        .collect();
    assert_eq!(new.len(), 1, "the second mount's process: {new:?}");
    let status_pid = || {
        awcp_mount::control::request(&mnt, "status")
            .map(|st| st["pid"].as_i64().unwrap_or(-1))
            .map_err(|e| e.to_string())
    };
    let while_old_lives = status_pid();
    let old_was_alive = pid_alive(old);
    drop(held);
    let old_exited = poll_until(Duration::from_secs(15), || !pid_alive(old));
    let after_old_exit = status_pid();
    // Ours to clean up: the first mount's teardown would find this one mounted.
    unmount(false);
    assert!(
        poll_until(Duration::from_secs(15), || !pid_alive(new[0])),
        "the second mount's process did not exit"
    );
    assert!(old_exited, "the first mount's process did not exit");
    assert!(
        old_was_alive,
        "the first mount's process did not wait for its open file"
    );
    let new_pid = i64::from(new[0]);
    assert_eq!(
        while_old_lives,
        Ok(new_pid),
        "status while the old process lives"
    );
    assert_eq!(
        after_old_exit,
        Ok(new_pid),
        "status after the old process exited"
    );
}

// ------------------------------------------------------------------ model check (fsx)

/// xorshift64*: the random operations of [`fsx_random_operations_match_a_model`].
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// In `0..n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One run of fsx-style operations on one file through several descriptors, a hard link,
/// `O_APPEND` and `O_TRUNC` opens, `mmap`, `copy_file_range` and `posix_fallocate`, each
/// checked against an in-memory model of the file; at the end, after fsync, the server's
/// copy must equal the model too. This is what catches a cache or write-behind that loses,
/// reorders or hides a change (sshfs fails it within a few hundred operations: it caches by
/// path, so a write through the link is not seen through the other name).
fn fsx_run(m: &TestMount, seed: u64, ops: usize) {
    fsx_run_with(m, seed, ops, false)
}

/// [`fsx_run`]; with `drops`, for a mount whose connection is being killed: no `O_APPEND`
/// writes (a lost one is reported by design), and a link that met a drop is made again.
fn fsx_run_with(m: &TestMount, seed: u64, ops: usize, drops: bool) {
    const MAX_LEN: usize = 256 * 1024;
    let name = format!("fsx{seed}");
    let (path, link) = (m.p(&name), m.p(format!("{name}.lnk")));
    let src_data = pattern(seed + 1000, 100_000);
    fs::write(m.p(format!("{name}.src")), &src_data).unwrap();
    let src = File::open(m.p(format!("{name}.src"))).unwrap();
    let rw = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap()
    };
    let mut fds = vec![OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap()];
    if let Err(e) = fs::hard_link(&path, &link) {
        // A link on its way at a drop fails with EIO by design; it may have been made.
        assert!(drops, "link: {e}");
        if !link.exists() {
            fs::hard_link(&path, &link).unwrap();
        }
    }
    let mut model: Vec<u8> = Vec::new();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut log: Vec<String> = Vec::new();
    let check = |log: &[String], got: &[u8], off: usize, model: &[u8]| {
        let want = &model[off.min(model.len())..(off + got.len()).min(model.len())];
        if got != want {
            let tail = log[log.len().saturating_sub(12)..].join("\n  ");
            assert_same_bytes(got, want, &format!("seed {seed}, after:\n  {tail}\n"));
        }
    };
    let put = |model: &mut Vec<u8>, off: usize, data: &[u8]| {
        if model.len() < off + data.len() {
            model.resize(off + data.len(), 0);
        }
        model[off..off + data.len()].copy_from_slice(data);
    };
    for n in 0..ops {
        let fd = rng.below(fds.len());
        let size = model.len();
        let fill = pattern(seed * 1_000_003 + n as u64, 70_000);
        match rng.below(100) {
            0..=24 => {
                let off = rng.below(MAX_LEN);
                let len = (1 + rng.below(40_000)).min(MAX_LEN - off);
                log.push(format!("write fd{fd} {off}+{len}"));
                fds[fd].write_all_at(&fill[..len], off as u64).unwrap();
                put(&mut model, off, &fill[..len]);
            }
            25..=49 => {
                let off = rng.below(size + 5000);
                let len = 1 + rng.below(70_000);
                log.push(format!("read fd{fd} {off}+{len} (size {size})"));
                let mut buf = vec![0u8; len];
                let mut got = 0;
                while got < len {
                    match fds[fd]
                        .read_at(&mut buf[got..], (off + got) as u64)
                        .unwrap()
                    {
                        0 => break,
                        k => got += k,
                    }
                }
                check(&log, &buf[..got], off, &model);
                assert_eq!(
                    got,
                    len.min(size.saturating_sub(off)),
                    "read length; {log:?}"
                );
            }
            50..=53 => {
                let len = rng.below(MAX_LEN);
                log.push(format!("ftruncate fd{fd} {len} (was {size})"));
                fds[fd].set_len(len as u64).unwrap();
                model.resize(len, 0);
            }
            54..=57 => {
                let len = rng.below(MAX_LEN);
                log.push(format!("truncate {len} (was {size})"));
                let c = CString::new(path.as_os_str().as_bytes()).unwrap();
                assert_eq!(unsafe { libc::truncate(c.as_ptr(), len as libc::off_t) }, 0);
                model.resize(len, 0);
            }
            58..=65 if size > 0 => {
                let write = rng.below(2) == 0;
                let off = rng.below(size);
                let len = 1 + rng.below(40_000.min(size - off));
                let page = 4096;
                let start = off / page * page;
                let map_len = off + len - start;
                log.push(format!(
                    "mmap {} fd{fd} {off}+{len} (size {size})",
                    if write { "write" } else { "read" }
                ));
                let mut map = Mapping::new(&fds[fd], start, map_len, true);
                if write {
                    map.bytes_mut()[off - start..].copy_from_slice(&fill[..len]);
                    if rng.below(2) == 0 {
                        map.sync().unwrap_or_else(|e| panic!("msync: {e}"));
                    }
                } else {
                    check(&log, &map.bytes()[off - start..], off, &model);
                }
                drop(map);
                if write {
                    put(&mut model, off, &fill[..len]);
                }
            }
            66..=71 => {
                if fds.len() > 1 && rng.below(2) == 0 {
                    log.push(format!("close fd{fd}"));
                    fds.remove(fd);
                } else {
                    log.push(format!("open fd{}", fds.len()));
                    fds.push(rw());
                }
            }
            72..=74 => {
                log.push(format!("fsync fd{fd}"));
                fds[fd].sync_all().unwrap();
            }
            75..=79 => {
                log.push(format!("fstat fd{fd} (size {size})"));
                assert_eq!(
                    fds[fd].metadata().unwrap().len(),
                    size as u64,
                    "fstat; {log:?}"
                );
                assert_eq!(
                    fs::metadata(&path).unwrap().len(),
                    size as u64,
                    "stat; {log:?}"
                );
            }
            80..=83 if size + 20_000 <= MAX_LEN && !drops => {
                let len = 1 + rng.below(20_000);
                log.push(format!("append {len} (size {size})"));
                let mut f = OpenOptions::new().append(true).open(&path).unwrap();
                f.write_all(&fill[..len]).unwrap();
                model.extend_from_slice(&fill[..len]);
            }
            84..=88 => {
                let off = rng.below(size + 5000);
                let len = 1 + rng.below(70_000);
                log.push(format!("read through the link {off}+{len} (size {size})"));
                let mut buf = Vec::new();
                let mut f = File::open(&link).unwrap();
                f.seek(io::SeekFrom::Start(off as u64)).unwrap();
                f.take(len as u64).read_to_end(&mut buf).unwrap();
                check(&log, &buf, off, &model);
            }
            89..=93 => {
                let off = rng.below(MAX_LEN);
                let len = (1 + rng.below(30_000)).min(MAX_LEN - off);
                log.push(format!("write through the link {off}+{len}"));
                let f = OpenOptions::new().write(true).open(&link).unwrap();
                f.write_all_at(&fill[..len], off as u64).unwrap();
                put(&mut model, off, &fill[..len]);
            }
            94 => {
                log.push(format!("open O_TRUNC (was {size})"));
                OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(&path)
                    .unwrap();
                model.clear();
            }
            95..=97 => {
                let soff = rng.below(90_000);
                let len = 1 + rng.below(100_000 - soff - 1);
                let off = rng.below(MAX_LEN - len);
                log.push(format!("copy_file_range {soff}+{len} -> fd{fd} {off}"));
                let mut done = 0;
                while done < len {
                    let (mut so, mut o) = ((soff + done) as i64, (off + done) as i64);
                    let k = unsafe {
                        libc::copy_file_range(
                            src.as_raw_fd(),
                            &mut so,
                            fds[fd].as_raw_fd(),
                            &mut o,
                            len - done,
                            0,
                        )
                    };
                    assert!(
                        k > 0,
                        "copy_file_range: {}; {log:?}",
                        io::Error::last_os_error()
                    );
                    done += k as usize;
                }
                put(&mut model, off, &src_data[soff..soff + len]);
            }
            98..=99 => {
                let off = rng.below(MAX_LEN - 1);
                let len = 1 + rng.below(MAX_LEN - off - 1);
                log.push(format!("posix_fallocate fd{fd} {off}+{len} (size {size})"));
                let rc =
                    unsafe { libc::posix_fallocate(fds[fd].as_raw_fd(), off as i64, len as i64) };
                match rc {
                    0 if model.len() < off + len => model.resize(off + len, 0),
                    0 | libc::EOPNOTSUPP => {}
                    e => panic!("posix_fallocate: {}", io::Error::from_raw_os_error(e)),
                }
            }
            _ => {}
        }
    }
    for f in &fds {
        f.sync_all().unwrap();
    }
    drop(fds);
    assert_same_bytes(
        &fs::read(&path).unwrap(),
        &model,
        &format!("seed {seed}: the file at the end"),
    );
    assert_same_bytes(
        &fs::read(m.e(&name)).unwrap(),
        &model,
        &format!("seed {seed}: the server's copy at the end"),
    );
}

/// `AWCP_FSX_SEEDS`: how many seeds the model checks run beyond CI's (`just soak`: 10).
fn extra_seeds() -> u64 {
    std::env::var("AWCP_FSX_SEEDS")
        .ok()
        .map(|n| n.parse().expect("AWCP_FSX_SEEDS: a number of seeds"))
        .unwrap_or(0)
}

/// fsx-style model check on the default mount (caches on), and with every cache off: runs
/// of 3,000 random operations each (see [`fsx_run`]). `AWCP_FSX_SEEDS=N` runs N more seeds
/// on each mount, for a longer hunt than CI's.
#[test]
fn fsx_random_operations_match_a_model() {
    let more = extra_seeds();
    let m = TestMount::start(&[]);
    fsx_run(&m, 1, 3000);
    fsx_run(&m, 2, 3000);
    for seed in 100..100 + more {
        fsx_run(&m, seed, 3000);
    }
    let m = TestMount::start(&[NO_CACHE]);
    fsx_run(&m, 3, 3000);
    for seed in 1000..1000 + more {
        fsx_run(&m, seed, 3000);
    }
}

/// Soak, not run by CI: the fsx model check (without `O_APPEND`, whose lost writes are
/// reported by design) on a `reconnect` mount whose SSH connection is killed every
/// `AWCP_KILL_MS` (400) ms, `AWCP_FSX_SEEDS` (3) seeds of 2,000 operations: every byte
/// written must be in the file and on the server at the end. It can fail by design when
/// the timing is unlucky (an operation that meets two drops in a row, a write lost with
/// four connections, is reported with EIO), which is why it is not a CI test; the mount's
/// log says which. `cargo test --release --test fuse -- --ignored --nocapture fsx_under`
#[test]
#[ignore]
fn fsx_under_connection_drops() {
    let env = |name: &str, default: u64| -> u64 {
        std::env::var(name)
            .ok()
            .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: a number")))
            .unwrap_or(default)
    };
    let (seeds, every) = (env("AWCP_FSX_SEEDS", 3), env("AWCP_KILL_MS", 400));
    let sshd = TestSshd::start();
    let m = TestMount::foreground(&sshd, &["reconnect"]);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (kills, run) = std::thread::scope(|sc| {
        let killer = sc.spawn(|| {
            let mut kills = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(every));
                kills += usize::from(sshd.kill_connections() > 0);
            }
            kills
        });
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for seed in 500..500 + seeds {
                fsx_run_with(&m, seed, 2000, true);
            }
        }));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (killer.join().unwrap(), run)
    });
    let sent_again = status_counter(&m.mnt, "writes_sent_again");
    eprintln!("connection drops: {kills}, writes sent again: {sent_again}");
    if let Err(e) = run {
        let log = m.stderr();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        eprintln!(
            "the mount's log, last lines, newest first:\n{}",
            tail.join("\n")
        );
        std::panic::resume_unwind(e);
    }
}

// ------------------------------------------------------------ model check (namespace)

/// Namespace model check on the default mount (caches on, absent names kept by the kernel)
/// and on one that keeps names, listings and absences for ten minutes: runs of random
/// creates, writes, unlinks, renames, mkdirs, rmdirs, hard links, symlinks, FIFOs, `stat`s and
/// listings of names that exist and of names that do not (see [`namespace_run`]).
/// `AWCP_FSX_SEEDS=N` runs N more seeds on each kind of mount.
#[test]
fn namespace_operations_match_a_local_directory() {
    let long = "entry_timeout=600,attr_timeout=600,negative_timeout=600,dcache_timeout=600";
    for seed in std::iter::once(1).chain(100..100 + extra_seeds()) {
        namespace_run(TestMount::start(&[]), seed, 1500);
        namespace_run(TestMount::start(&[long]), seed + 10_000, 1500);
    }
}

/// The errno of a failed operation (also what [`errno_of`] gives for one).
fn code_of(e: io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// Everything below `root`, sorted: each path with its kind and what it holds (a file's
/// bytes, a symlink's target).
fn tree_of(root: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        for entry in fs::read_dir(root.join(&rel)).unwrap() {
            let rel = rel.join(entry.unwrap().file_name());
            let path = root.join(&rel);
            let md = fs::symlink_metadata(&path).unwrap();
            let what = if md.file_type().is_symlink() {
                format!("symlink to {:?}", fs::read_link(&path).unwrap())
            } else if std::os::unix::fs::FileTypeExt::is_fifo(&md.file_type()) {
                "fifo".to_string()
            } else if md.is_dir() {
                dirs.push(rel.clone());
                "directory".to_string()
            } else {
                // (Non-blocking: a FIFO shown as a file must fail the test, not hang it.)
                let mut bytes = Vec::new();
                OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&path)
                    .and_then(|mut f| f.read_to_end(&mut bytes))
                    .unwrap();
                format!("file {:?}", String::from_utf8_lossy(&bytes))
            };
            out.push((rel, what));
        }
    }
    out.sort();
    out
}

/// One run: `ops` random operations, each done in the mount and in a local directory (under
/// the test's temporary directory), on names from a pool of three, mostly in directories
/// that exist (at any depth), sometimes in any path of up to three levels: so the same path
/// is made, looked up while absent, removed, renamed over and made again, below files
/// (ENOTDIR), through symlinks and after renames of the directories above it. Each
/// operation must come to the same result in both (success or the same errno), every 100
/// operations the whole trees must agree, and at the end, after the unmount (which waits
/// for the unlinks answered early), the server's copy too. This is what catches a name
/// cache, an absence kept by the kernel or an early answer that lets the mount disagree
/// with its own changes.
fn namespace_run(mut m: TestMount, seed: u64, ops: usize) {
    const NAMES: [&str; 3] = ["a", "b", "c"];
    let local = tempfile::tempdir().unwrap();
    let (mnt, loc) = (m.p(format!("ns{seed}")), local.path().join("ns"));
    fs::create_dir(&mnt).unwrap();
    fs::create_dir(&loc).unwrap();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut log: Vec<String> = Vec::new();
    // Mostly a name in a directory that exists (so that most operations do something),
    // sometimes any path (below a file, a symlink or nothing).
    let random_path = |rng: &mut Rng, dirs: &[PathBuf]| {
        let mut p = PathBuf::new();
        if rng.below(4) == 0 {
            for _ in 0..rng.below(3) {
                p.push(NAMES[rng.below(NAMES.len())]);
            }
        } else {
            p = dirs[rng.below(dirs.len())].clone();
        }
        p.join(NAMES[rng.below(NAMES.len())])
    };
    // How often each operation comes, by its number below.
    const WEIGHTS: [usize; 12] = [3, 1, 2, 2, 1, 2, 1, 1, 2, 1, 1, 1];
    // Opens that do not wait for the other end of a FIFO (a no-op for anything else).
    let nonblocking = || {
        let mut o = OpenOptions::new();
        o.custom_flags(libc::O_NONBLOCK);
        o
    };
    for i in 0..ops {
        // The directories that exist now (the root included), for both paths.
        let dirs: Vec<PathBuf> = std::iter::once(PathBuf::new())
            .chain(
                tree_of(&loc)
                    .into_iter()
                    .filter(|(_, what)| what == "directory")
                    .map(|(rel, _)| rel),
            )
            .collect();
        let (p, q) = (random_path(&mut rng, &dirs), random_path(&mut rng, &dirs));
        let data = format!("{seed}:{i}");
        let mut pick = rng.below(WEIGHTS.iter().sum());
        let op = WEIGHTS
            .iter()
            .position(|&w| {
                pick < w || {
                    pick -= w;
                    false
                }
            })
            .unwrap();
        // A symlink's target: another name in its own directory, so that it never leads out
        // of the workspace, nor to itself.
        let own = p.file_name().unwrap().to_owned();
        let target = NAMES.iter().find(|n| OsStr::new(n) != own).unwrap();
        // Each operation as a function of the root it works in.
        let run = |root: &Path| -> Result<String, i32> {
            let (p, q) = (root.join(&p), root.join(&q));
            let done = |r: io::Result<()>| r.map(|()| String::new()).map_err(code_of);
            match op {
                0 => done(
                    OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&p)
                        .and_then(|mut f| f.write_all(data.as_bytes())),
                ),
                1 => done(
                    nonblocking()
                        .write(true)
                        .truncate(true)
                        .open(&p)
                        .and_then(|mut f| f.write_all(data.as_bytes())),
                ),
                2 => done(fs::remove_file(&p)),
                3 => done(fs::create_dir(&p)),
                4 => done(fs::remove_dir(&p)),
                5 => done(fs::rename(&p, &q)),
                6 => done(fs::hard_link(&p, &q)),
                7 => done(std::os::unix::fs::symlink(target, &p)),
                // The kind, and the size of a file or symlink (a directory's differs).
                8 => fs::symlink_metadata(&p)
                    .map(|md| format!("{:?} {}", md.file_type(), !md.is_dir() as u64 * md.len()))
                    .map_err(code_of),
                9 => fs::read_dir(&p)
                    .and_then(|d| d.map(|e| e.map(|e| e.file_name())).collect())
                    .map(|mut names: Vec<OsString>| {
                        names.sort();
                        format!("{names:?}")
                    })
                    .map_err(code_of),
                // A FIFO, which the mount keeps itself (the server cannot make one).
                11 => done(mkfifo(&p)),
                _ => nonblocking()
                    .read(true)
                    .open(&p)
                    .and_then(|mut f| {
                        let mut b = Vec::new();
                        f.read_to_end(&mut b).map(|_| b)
                    })
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .map_err(code_of),
            }
        };
        let want = run(&loc);
        let got = run(&mnt);
        log.push(format!("{i}: op {op} {p:?} {q:?} -> {want:?}"));
        let tail = || log[log.len().saturating_sub(15)..].join("\n  ");
        assert_eq!(
            got,
            want,
            "seed {seed}: the mount (left) and a local directory (right) disagree, after:\n  {}",
            tail()
        );
        if i % 100 == 99 {
            assert_eq!(
                tree_of(&mnt),
                tree_of(&loc),
                "seed {seed}: trees differ (mount left), after:\n  {}",
                tail()
            );
        }
    }
    assert_eq!(
        tree_of(&mnt),
        tree_of(&loc),
        "seed {seed}: trees differ at the end"
    );
    m.unmount().unwrap();
    // The server has all but the FIFOs.
    let mut without_fifos = tree_of(&loc);
    without_fifos.retain(|(_, what)| what != "fifo");
    assert_eq!(
        tree_of(&m.e(format!("ns{seed}"))),
        without_fifos,
        "seed {seed}: the server's copy (left) differs after the unmount"
    );
}

/// `copy_file_range(2)` on the mount, as cp calls it: the bytes copied, or the error.
fn copy_range(from: &File, off_in: i64, to: &File, off_out: i64, len: usize) -> io::Result<usize> {
    let (mut off_in, mut off_out) = (off_in, off_out);
    // SAFETY: both descriptors are open for the duration; the offsets are ours.
    let n = unsafe {
        libc::copy_file_range(
            from.as_raw_fd(),
            &mut off_in,
            to.as_raw_fd(),
            &mut off_out,
            len,
            0,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// A copy inside the mount is made by the server (SFTP `copy-data`): `cp` and
/// `copy_file_range` give the right bytes without them crossing the link, the kernel's cached
/// pages of the destination do not hide the copy, and writes made just before it are in it.
#[test]
fn copies_inside_the_mount_are_made_by_the_server() {
    let m = TestMount::start(&[]);
    let big = pattern(41, (3 << 20) + 12_345);
    fs::write(m.e("big"), &big).unwrap();
    let read_before = status_counter(&m.mnt, "bytes_read");

    // cp (coreutils 9 copies a regular file with copy_file_range).
    run_ok(Command::new("cp").arg(m.p("big")).arg(m.p("copy")));
    assert_same_bytes(
        &fs::read(m.e("copy")).unwrap(),
        &big,
        "cp's copy on the server",
    );
    assert_same_bytes(
        &fs::read(m.p("copy")).unwrap(),
        &big,
        "cp's copy through the mount",
    );
    assert_eq!(
        status_counter(&m.mnt, "bytes_copied_on_server"),
        big.len() as u64,
        "the copy was not made by the server"
    );
    assert_eq!(
        status_counter(&m.mnt, "bytes_read") - read_before,
        big.len() as u64,
        "only the read-back above crossed the link"
    );

    // A range into a file whose pages the kernel has cached, right after a write to the
    // source through another descriptor.
    let dst_path = m.p("dst");
    fs::write(&dst_path, pattern(42, 100_000)).unwrap();
    let mut want = fs::read(&dst_path).unwrap();
    let mut src = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("big"))
        .unwrap();
    src.write_all_at(b"written just before", 1000).unwrap();
    let mut big = big;
    big[1000..1019].copy_from_slice(b"written just before");
    let dst = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dst_path)
        .unwrap();
    let n = copy_range(&src, 900, &dst, 50_000, 300_000).unwrap();
    assert_eq!(n, 300_000);
    assert_eq!(
        status_counter(&m.mnt, "bytes_copied_on_server"),
        (big.len() + n) as u64,
        "the range was not copied by the server"
    );
    want.resize(want.len().max(50_000 + n), 0);
    want[50_000..50_000 + n].copy_from_slice(&big[900..900 + n]);
    let mut got = Vec::new();
    File::open(&dst_path)
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    assert_same_bytes(&got, &want, "the range copied, read through the mount");
    assert_eq!(fs::metadata(&dst_path).unwrap().len(), want.len() as u64);
    src.flush().unwrap();
    drop((src, dst));
    assert_same_bytes(
        &fs::read(m.e("dst")).unwrap(),
        &want,
        "the range copied, on the server",
    );
}

/// `cp -p` and `install -m`, which set the copy's times and mode through the descriptor that
/// created it right after the copy: the copy shows its size and content at once.
#[test]
fn copies_keep_their_size_when_cp_sets_their_attributes() {
    let m = TestMount::start(&[]);
    let data = pattern(44, 1_500_000);
    fs::write(m.e("a"), &data).unwrap();
    fs::set_permissions(m.e("a"), fs::Permissions::from_mode(0o640)).unwrap();
    let copied_before = status_counter(&m.mnt, "bytes_copied_on_server");
    for (cmd, args) in [("cp", vec!["-p"]), ("install", vec!["-m", "0600"])] {
        let to = m.p(format!("by-{cmd}"));
        run_ok(Command::new(cmd).args(&args).arg(m.p("a")).arg(&to));
        assert_eq!(
            fs::metadata(&to).unwrap().len(),
            data.len() as u64,
            "{cmd}: size"
        );
        assert_same_bytes(&fs::read(&to).unwrap(), &data, cmd);
    }
    assert_eq!(
        fs::metadata(m.p("by-cp")).unwrap().mtime(),
        fs::metadata(m.e("a")).unwrap().mtime(),
        "cp -p kept the mtime"
    );
    assert_eq!(
        status_counter(&m.mnt, "bytes_copied_on_server") - copied_before,
        2 * data.len() as u64,
        "not copied by the server"
    );
}

/// The quota holds for copies made by the server: cp fails with ENOSPC once nothing fits,
/// and the mount's accounting matches what is on the server.
#[test]
fn copies_made_by_the_server_are_held_to_the_quota() {
    let m = TestMount::start(&["max_bytes=3000000"]);
    let data = pattern(43, 2_000_000);
    fs::write(m.p("a"), &data).unwrap();
    let used = || {
        mount_status(&m.mnt)["quota"]["bytes_used"]
            .as_u64()
            .unwrap()
    };
    let used_before = used();
    let out = Command::new("cp")
        .arg(m.p("a"))
        .arg(m.p("b"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "cp over the quota succeeded");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("No space left on device"),
        "cp said: {stderr}"
    );
    let on_server = fs::metadata(m.e("b")).unwrap().len();
    assert!(
        on_server <= 1_000_000,
        "{on_server} bytes copied past the quota"
    );
    assert_eq!(
        used() - used_before,
        on_server,
        "charged for other than what is there"
    );
    assert_same_bytes(
        &fs::read(m.e("b")).unwrap(),
        &data[..on_server as usize],
        "what was copied",
    );
}

// ------------------------------------------- namespace model check, descriptors held open

/// What a name shows in a namespace check: its type, size and link count, or its errno.
fn name_state(path: &Path) -> String {
    match fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => format!("dir {:o} nlink {}", md.mode() & 0o7777, md.nlink()),
        Ok(md) if md.file_type().is_symlink() => {
            format!(
                "link -> {:?}",
                fs::read_link(path).map_err(|e| e.raw_os_error())
            )
        }
        Ok(md) => format!(
            "file {:o} size {} nlink {}",
            md.mode() & 0o7777,
            md.len(),
            md.nlink()
        ),
        Err(e) => format!("errno {}", e.raw_os_error().unwrap_or(-1)),
    }
}

/// Random namespace operations (create, write, append, truncate, chmod, link, symlink,
/// unlink, rename of files and directories, mkdir, rmdir, descriptors held open across them,
/// written and truncated through) done the same on the mount
/// and on a local directory: each operation must succeed or fail alike, and afterwards every
/// name must show the same type, mode, size, link count (`st_nlink` is emulated over SFTP v3,
/// see SEMANTICS.md) and link target, and `fstat` of each descriptor held open the same size
/// and link count. On the default mount,
/// one that keeps everything for ten minutes, and one that keeps nothing. `AWCP_FSX_SEEDS=N`
/// runs N more seeds on each.
#[test]
fn namespace_with_held_descriptors_matches_a_local_directory() {
    let long = "entry_timeout=600,attr_timeout=600,negative_timeout=600,dcache_timeout=600";
    let more = || 200..200 + extra_seeds();
    // The first nine kinds of operation (no truncate, chmod or symlink), as the test first
    // ran: seed 2 caught a directory's link count taken from a listing older than a mkdir
    // (at step 364), seed 123 a file's taken from one older than an unlink answered early
    // (at step 395, in about one run of three), before each was fixed.
    held_descriptors_run(&TestMount::start(&[]), 9, [1, 2, 3, 4, 123].into_iter());
    for opts in [&[][..], &[long], &[NO_CACHE]] {
        held_descriptors_run(&TestMount::start(opts), 13, (1..=3).chain(more()));
    }
}

/// One mount's runs of [`namespace_with_held_descriptors_matches_a_local_directory`]: 400
/// operations of the first `kinds` kinds for each seed.
fn held_descriptors_run(m: &TestMount, kinds: usize, seeds: impl Iterator<Item = u64>) {
    let local_dir = tempfile::tempdir().unwrap();
    let local = local_dir.path().join("model");
    fs::create_dir(&local).unwrap();
    fs::create_dir(m.p("model")).unwrap();
    let mounted = m.p("model");
    let names = ["a", "b", "c", "d1", "d2", "d1/x", "d1/y", "d2/x"];
    let errno = |r: io::Result<()>| r.err().map(|e| e.raw_os_error().unwrap_or(-1));
    for seed in seeds {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut held: Vec<(File, File, String)> = Vec::new();
        let mut log = Vec::new();
        for step in 0..400 {
            let name = |rng: &mut Rng| names[rng.below(names.len())];
            let (n1, n2) = (name(&mut rng), name(&mut rng));
            let op = rng.below(kinds);
            let run = |root: &Path| -> Option<i32> {
                let (p1, p2) = (root.join(n1), root.join(n2));
                errno(match op {
                    0 => fs::write(&p1, vec![b'w'; 10 + step]),
                    1 => fs::hard_link(&p1, &p2),
                    2 => fs::remove_file(&p1),
                    3 => fs::rename(&p1, &p2),
                    4 => fs::create_dir(&p1),
                    5 => fs::remove_dir(&p1),
                    6 => OpenOptions::new()
                        .append(true)
                        .open(&p1)
                        .and_then(|mut f| f.write_all(b"appended")),
                    9 => OpenOptions::new()
                        .write(true)
                        .open(&p1)
                        .and_then(|f| f.set_len((step % 50) as u64)),
                    10 => fs::set_permissions(
                        &p1,
                        fs::Permissions::from_mode(if step % 2 == 0 { 0o600 } else { 0o750 }),
                    ),
                    11 => std::os::unix::fs::symlink(n2.rsplit('/').next().unwrap(), &p1),
                    _ => Ok(()),
                })
            };
            let desc = format!("step {step}: op {op} {n1} {n2}");
            if op == 7 {
                // Hold a descriptor of n1 open on both sides, if it is a file.
                let open = |root: &Path| {
                    OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(root.join(n1))
                };
                match (open(&mounted), open(&local)) {
                    (Ok(a), Ok(b)) => held.push((a, b, n1.to_string())),
                    (a, b) => assert_eq!(
                        errno(a.map(drop)),
                        errno(b.map(drop)),
                        "seed {seed} {desc}: open to hold, on the mount vs local\n{}",
                        log.join("\n")
                    ),
                }
            } else if (op == 8 || op == 12) && !held.is_empty() {
                // Write through a held descriptor, truncate through it, or close it.
                let i = rng.below(held.len());
                match rng.below(if kinds > 9 { 3 } else { 2 }) {
                    0 => {
                        held.remove(i);
                    }
                    1 => {
                        let (a, b, _) = &mut held[i];
                        a.write_all(b"held").unwrap();
                        b.write_all(b"held").unwrap();
                    }
                    _ => {
                        let (a, b, _) = &held[i];
                        a.set_len(step as u64 % 30).unwrap();
                        b.set_len(step as u64 % 30).unwrap();
                    }
                }
            }
            let (got, want) = (run(&mounted), run(&local));
            log.push(format!("{desc}: {want:?}"));
            assert_eq!(
                got,
                want,
                "seed {seed} {desc}: errno on the mount vs local\n{}",
                log.join("\n")
            );
            // (Also the names symlinks made here may lead to.)
            for n in names.iter().chain(&["x", "y", "d1/d1", "d1/d2", "d2/y"]) {
                let (got, want) = (name_state(&mounted.join(n)), name_state(&local.join(n)));
                assert_eq!(
                    got,
                    want,
                    "seed {seed} after {desc}: {n}\n{}",
                    log.join("\n")
                );
            }
            for (a, b, n) in &held {
                let (ma, mb) = (a.metadata().unwrap(), b.metadata().unwrap());
                assert_eq!(
                    (ma.len(), ma.nlink()),
                    (mb.len(), mb.nlink()),
                    "seed {seed} after {desc}: fstat of a descriptor of {n}\n{}",
                    log.join("\n")
                );
            }
        }
        drop(held);
        // (A directory of our own temporary directory, never a mount point.)
        assert!(!is_mounted(&local));
        fs::remove_dir_all(&local).unwrap();
        fs::create_dir(&local).unwrap();
        remove_tree_in_mount(m, &mounted);
        fs::create_dir(&mounted).unwrap();
    }
}

/// Remove a directory tree inside the mount, by walking it (never `remove_dir_all` on a
/// path that mountinfo has not cleared: this one is below the mount point, not one).
fn remove_tree_in_mount(m: &TestMount, dir: &Path) {
    assert!(dir.starts_with(&m.mnt) && dir != m.mnt);
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if fs::symlink_metadata(&p).unwrap().is_dir() {
            remove_tree_in_mount(m, &p);
        } else {
            fs::remove_file(&p).unwrap();
        }
    }
    fs::remove_dir(dir).unwrap();
}
