//! Creates answered before the server's OPEN (`Fs::create_early`): only in a directory made
//! through the mount, and what depends on the file waits for the OPEN.

use super::*;
use std::fs;
use std::os::unix::fs::MetadataExt;

/// How long a call the test expects to return without the server may take (a hang guard:
/// a correct build returns at once; a wrong one waits for the held OPEN forever).
const AT_ONCE: Duration = Duration::from_secs(10);

/// `name` created in `dir` as tar does (`O_WRONLY|O_CREAT|O_EXCL`), within [`AT_ONCE`].
async fn create_at_once(h: &Harness, dir: Ino, name: &str) -> (Ino, u64) {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
    let created = tokio::time::timeout(
        AT_ONCE,
        h.fs.create(dir, OsStr::new(name), FILE_MODE, UMASK, as_root(flags)),
    )
    .await
    .expect("the create waited for the held OPEN")
    .unwrap();
    (created.0.attr.ino, created.1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_in_a_directory_made_here_is_answered_before_its_open() {
    let h = Harness::new();
    let d = h.mkdir(ROOT, "d").await;
    h.plan.hold(ROp::Open);
    let (f, fh) = create_at_once(&h, d, "f").await;
    h.plan.until_held(ROp::Open, 1).await;
    // What needs the file on the server waits for the OPEN (nothing written yet, which
    // would make them wait for the writes anyway): the close, a stat by name, a lookup of
    // the name, and a listing of the directory from the server (fetched ahead when a lookup
    // finds the directory, once what the mount knew of it has run out).
    let flush = spawn_flush(&h, fh);
    let stat = {
        let fs = h.fs.clone();
        tokio::spawn(async move { fs.getattr(f, None).await })
    };
    let lookup = {
        let fs = h.fs.clone();
        tokio::spawn(async move { fs.lookup(d, OsStr::new("f")).await })
    };
    h.fs.cache.lock().unwrap().expire_all();
    assert_eq!(h.lookup(ROOT, "d").await, d);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!flush.is_finished(), "the close did not wait for the OPEN");
    assert!(!stat.is_finished(), "stat did not wait for the OPEN");
    assert!(
        !lookup.is_finished(),
        "the lookup did not wait for the OPEN"
    );
    assert_eq!(h.plan.calls(ROp::ReadDir), 0, "listed before the OPEN");
    assert!(!h.disk("d/f").exists());
    // Written behind it, as any write: answered at once.
    tokio::time::timeout(AT_ONCE, h.fs.write(fh, 0, b"hello"))
        .await
        .expect("the write waited for the held OPEN")
        .unwrap();
    h.plan.release(ROp::Open);
    flush.await.unwrap().unwrap();
    let (attr, _) = stat.await.unwrap().unwrap();
    assert_eq!(attr.kind, FileKind::File);
    assert_eq!(lookup.await.unwrap().unwrap().attr.ino, f);
    // The listing fetched ahead shows the file.
    let listed = h.fs.opendir(d).await.unwrap();
    let names: Vec<_> =
        h.fs.readdir(listed, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
    h.fs.releasedir(listed);
    assert!(names.iter().any(|n| n == "f"), "listed: {names:?}");
    h.fs.flush(fh).await.unwrap();
    assert_eq!(fs::read(h.disk("d/f")).unwrap(), b"hello");
    let on_disk = fs::metadata(h.disk("d/f")).unwrap();
    assert_eq!(on_disk.mode() & 0o7777, 0o644);
    // The attributes shown are the server's, its times included.
    let (attr, _) = h.fs.getattr(f, None).await.unwrap();
    assert_eq!((attr.size, attr.perm), (5, 0o644));
    assert_eq!(secs(attr.mtime) as i64, on_disk.mtime());
    h.fs.release(fh).await.unwrap();
}

/// Spawn the close (flush) of `fh`.
fn spawn_flush(h: &Harness, fh: u64) -> tokio::task::JoinHandle<FsResult<()>> {
    let fs = h.fs.clone();
    tokio::spawn(async move { fs.flush(fh).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_elsewhere_waits_for_its_open() {
    let h = Harness::new();
    // Made on the server: the mount cannot vouch for what is in it.
    fs::create_dir(h.disk("theirs")).unwrap();
    let theirs = h.lookup(ROOT, "theirs").await;
    let listed = h.fs.opendir(theirs).await.unwrap();
    h.fs.releasedir(listed);
    waits_for_its_open(&h, ROOT, "in the root").await;
    waits_for_its_open(&h, theirs, "in a directory made on the server").await;
    // A directory made here whose listing was dropped (its TTL ran out): the same.
    let d = h.mkdir(ROOT, "d").await;
    h.fs.cache.lock().unwrap().expire_all();
    waits_for_its_open(&h, d, "after the listing ran out").await;
    // And every create with `sync_create`.
    let h = Harness::with(
        FsConfig {
            sync_create: true,
            ..config(long_ttls())
        },
        None,
    );
    let d = h.mkdir(ROOT, "d").await;
    waits_for_its_open(&h, d, "with sync_create").await;
}

/// A create of `g` in `dir` as tar makes it (`O_EXCL`) waits for its OPEN (`when`: the
/// case, for the message).
async fn waits_for_its_open(h: &Harness, dir: Ino, when: &str) {
    h.plan.hold(ROp::Open);
    let create = {
        let fs = h.fs.clone();
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
        tokio::spawn(async move {
            fs.create(dir, OsStr::new("g"), FILE_MODE, UMASK, as_root(flags))
                .await
        })
    };
    h.plan.until_held(ROp::Open, 1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!create.is_finished(), "create answered early {when}");
    h.plan.release(ROp::Open);
    let (_, fh) = create.await.unwrap().unwrap();
    h.fs.release(fh).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_answered_early_that_the_server_refuses_fails_its_close() {
    let h = Harness::new();
    let quota = &h.fs.enforcer().quota;
    quota.set_limits(Some(1 << 20), Some(100));
    let d = h.mkdir(ROOT, "d").await;
    let usage = || {
        let u = quota.usage();
        (u.bytes, u.files)
    };
    let quota_before = usage();
    // Made on the server's side behind the mount's back, after its listing of `d`.
    fs::write(h.disk("d/f"), b"theirs").unwrap();
    h.plan.hold(ROp::Open);
    let (f, fh) = create_at_once(&h, d, "f").await;
    // Queued behind the OPEN, and charged to the quota meanwhile.
    h.write(fh, 0, b"mine, lost").await;
    assert_eq!(usage().0, quota_before.0 + 10);
    h.plan.release(ROp::Open);
    let err =
        h.fs.flush(fh)
            .await
            .expect_err("the close hid the failed create");
    assert_ne!(err.errno, 0);
    // Refused once the OPEN failed, and not charged.
    assert!(
        h.fs.write(fh, 100, b"more").await.is_err(),
        "a write after the failure"
    );
    // Nothing of theirs was touched, and the name leads to their file now, as a new inode.
    assert_eq!(fs::read(h.disk("d/f")).unwrap(), b"theirs");
    let _ = h.fs.release(fh).await;
    let e = h.fs.lookup(d, OsStr::new("f")).await.unwrap();
    assert_eq!(e.attr.size, 6);
    assert_ne!(
        e.attr.ino, f,
        "their file took the inode of the create that failed"
    );
    // The quota is as before: no entry, no bytes for what was never written.
    assert_eq!(usage(), quota_before);
    // The same with nothing written (a lock file): its close waits for the OPEN, and
    // reports it. (In another new directory: what the mount knew of `d` went with the
    // failure.)
    let d2 = h.mkdir(ROOT, "d2").await;
    fs::write(h.disk("d2/lock"), b"").unwrap();
    h.plan.hold(ROp::Open);
    let (_, fh) = create_at_once(&h, d2, "lock").await;
    h.plan.until_held(ROp::Open, 1).await;
    let flush = spawn_flush(&h, fh);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!flush.is_finished(), "the close did not wait for the OPEN");
    h.plan.release(ROp::Open);
    flush
        .await
        .unwrap()
        .expect_err("the close of a lock file hid the failed create");
    let _ = h.fs.release(fh).await;
    assert_eq!(h.open_handles().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_could_overtake_a_create_answered_early_waits_for_it() {
    let h = Harness::new();
    let d = h.mkdir(ROOT, "d").await;
    let e = h.mkdir(ROOT, "e").await;
    h.plan.hold(ROp::Open);
    let (f, fh) = create_at_once(&h, d, "f").await;
    let (_, gh) = create_at_once(&h, e, "g").await;
    h.plan.until_held(ROp::Open, 2).await;
    let tasks = {
        let (a, b, c, u) = (h.fs.clone(), h.fs.clone(), h.fs.clone(), h.fs.clone());
        vec![
            // A change of its mode by name (no descriptor), a second open (as the kernel
            // asks for one), an rmdir of its directory, an unlink of the other file.
            tokio::spawn(async move {
                let set = SetattrRequest {
                    mode: Some(0o600),
                    ..Default::default()
                };
                a.setattr(f, None, set).await.map(|_| None)
            }),
            tokio::spawn(async move {
                b.open_keeping_cache(f, as_root(libc::O_RDONLY))
                    .await
                    .map(|(fh, _)| Some(fh))
            }),
            tokio::spawn(async move { c.rmdir(ROOT, OsStr::new("d")).await.map(|_| None) }),
            tokio::spawn(async move { u.unlink(e, OsStr::new("g")).await.map(|_| None) }),
        ]
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    for op in [ROp::Setstat, ROp::Rmdir, ROp::Remove] {
        assert_eq!(h.plan.calls(op), 0, "{op:?} went before the held OPEN");
    }
    // (The second open is held too if it was sent: only the two creates may be.)
    assert_eq!(
        h.plan.waiting_at_hold(ROp::Open),
        2,
        "an OPEN went before the held one"
    );
    h.plan.release(ROp::Open);
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    outcomes[0].as_ref().unwrap();
    let second = outcomes[1].as_ref().unwrap().unwrap();
    h.fs.release(second).await.unwrap();
    assert_eq!(
        outcomes[2].as_ref().unwrap_err().errno,
        libc::ENOTEMPTY,
        "rmdir of a directory holding a file created early"
    );
    outcomes[3].as_ref().unwrap();
    let on_disk = fs::metadata(h.disk("d/f")).unwrap();
    assert_eq!(on_disk.mode() & 0o7777, 0o600);
    h.fs.unlink(d, OsStr::new("f")).await.unwrap();
    h.fs.release(fh).await.unwrap();
    h.fs.release(gh).await.unwrap();
    h.fs.fsyncdir(d).await.unwrap();
    h.fs.fsyncdir(e).await.unwrap();
    assert!(!h.disk("d/f").exists());
    assert!(!h.disk("e/g").exists());
}

/// What the mount vouches for ends with what it knew: a change of the directory's
/// attributes, or a listing from the server in place of the one kept since the mkdir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_changed_or_listed_again_is_not_vouched_for() {
    let h = Harness::new();
    let d = h.mkdir(ROOT, "d").await;
    let set = SetattrRequest {
        mode: Some(0o2755),
        ..Default::default()
    };
    h.fs.setattr(d, None, set).await.unwrap();
    waits_for_its_open(&h, d, "after a chmod of the directory").await;
    let e = h.mkdir(ROOT, "e").await;
    assert!(h
        .fs
        .cache
        .lock()
        .unwrap()
        .made_dir_lacks(e, OsStr::new("x"))
        .is_some());
    let listing = Arc::new(Vec::new());
    h.fs.cache.lock().unwrap().put_dir_until(
        e,
        listing,
        std::time::Instant::now() + Duration::from_secs(60),
    );
    waits_for_its_open(&h, e, "after a listing from the server").await;
}

/// What `tar` run by root does to each file it extracts, between the create and the close:
/// its writes, the mtime (the atime left as it is, `UTIME_OMIT`), the owner it has, the
/// mode. The writes made while the OPEN is on its way go out as one WRITE once it lands; a
/// stat through the descriptor waits for the OPEN's answer only, and is answered from what it
/// brought; the times wait for it too (the atime to keep is the server's); and the three
/// changes, queued while the writer is busy, go out as one FSETSTAT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tar_s_writes_and_changes_behind_the_open_go_out_merged() {
    let h = Harness::new();
    let d = h.mkdir(ROOT, "d").await;
    h.plan.hold(ROp::Open);
    h.plan.hold(ROp::Write);
    let (f, fh) = create_at_once(&h, d, "f").await;
    h.plan.until_held(ROp::Open, 1).await;
    for (at, data) in [(0, &b"hello"[..]), (5, b" world")] {
        tokio::time::timeout(AT_ONCE, h.fs.write(fh, at, data))
            .await
            .expect("the write waited for the held OPEN")
            .unwrap();
        // (Time for the writer to take the first and wait with it: the second must still
        // join it.)
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // (The kernel passes no handle with `futimens`, `fchown` or `fchmod`.)
    let spawn_setattr = |set: SetattrRequest| {
        let fs = h.fs.clone();
        tokio::spawn(async move { fs.setattr(f, None, set).await })
    };
    let stat = {
        let fs = h.fs.clone();
        tokio::spawn(async move { fs.getattr(f, Some(fh)).await })
    };
    let times = spawn_setattr(SetattrRequest {
        mtime: at(1_000_000),
        ..Default::default()
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!stat.is_finished(), "the stat did not wait for the OPEN");
    assert!(!times.is_finished(), "the times did not wait for the OPEN");
    h.plan.release(ROp::Open);
    // Answered from the OPEN's answer: no FSTAT of its own (the one counted is the
    // OPEN's, in this remote), nor a wait for the held WRITE.
    let (shown, _) = tokio::time::timeout(AT_ONCE, stat)
        .await
        .expect("the stat waited for the held WRITE")
        .unwrap()
        .unwrap();
    assert_eq!(shown.size, 11, "the writes queued behind the OPEN");
    assert_eq!(h.plan.calls(ROp::Fstat), 1);
    let a = times.await.unwrap().unwrap();
    assert_eq!(secs(a.mtime), 1_000_000);
    // Queued behind the held WRITE, as the times were.
    let owner = SetattrRequest {
        uid: Some(a.uid),
        gid: Some(a.gid),
        ..Default::default()
    };
    let mode = SetattrRequest {
        mode: Some(0o640),
        ..Default::default()
    };
    for set in [owner, mode] {
        tokio::time::timeout(AT_ONCE, h.fs.setattr(f, None, set))
            .await
            .expect("a change waited for the held WRITE")
            .unwrap();
    }
    h.plan.release(ROp::Write);
    h.fs.flush(fh).await.unwrap();
    h.fs.release(fh).await.unwrap();
    assert_eq!(fs::read(h.disk("d/f")).unwrap(), b"hello world");
    let on_disk = fs::metadata(h.disk("d/f")).unwrap();
    assert_eq!(
        (on_disk.mode() & 0o7777, on_disk.mtime()),
        (0o640, 1_000_000)
    );
    assert_eq!(
        h.plan.calls(ROp::Write),
        1,
        "the two writes went as one WRITE"
    );
    assert_eq!(
        h.plan.calls(ROp::Fsetstat),
        1,
        "the three changes went as one"
    );
    assert_eq!(h.fs.stats.setattrs_merged.load(Ordering::Relaxed), 2);
}

/// `open(O_CREAT)` without `O_EXCL`, answered early, finds the name taken on the server by
/// another client's file: that file is opened, and its size is the server's, not the empty
/// file the descriptor assumed it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_opened_another_clients_file_shows_its_size() {
    let h = Harness::new();
    let d = h.mkdir(ROOT, "d").await;
    fs::write(h.disk("d/f"), b"twelve bytes").unwrap();
    let flags = libc::O_RDWR | libc::O_CREAT;
    let (e, fh) =
        h.fs.create(d, OsStr::new("f"), FILE_MODE, UMASK, as_root(flags))
            .await
            .unwrap();
    h.fs.flush(fh).await.unwrap();
    let (a, _) = h.fs.getattr(e.attr.ino, Some(fh)).await.unwrap();
    assert_eq!(a.size, 12, "the size of the file opened");
    assert_eq!(h.read(fh, 0, 100).await, b"twelve bytes");
    h.fs.release(fh).await.unwrap();
}
