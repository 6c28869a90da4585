//! `copy_file_range` done by the server (`core::copy`).

use super::*;

/// `src` (on the disk) opened for reading and a new `dst` for reading and writing.
async fn source_and_destination(h: &Harness, content: &[u8]) -> (u64, Ino, u64) {
    std::fs::write(h.disk("src"), content).unwrap();
    let src = h.lookup(ROOT, "src").await;
    let fh_in = h.open(src, libc::O_RDONLY).await;
    let (dst, fh_out) = h.create(ROOT, "dst").await;
    (fh_in, dst, fh_out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_inside_the_mount_is_done_by_the_server() {
    let h = Harness::new();
    let quota = &h.fs.enforcer().quota;
    quota.set_limits(Some(10 << 20), None);
    let content = pattern(300 * 1024);
    let (fh_in, dst, fh_out) = source_and_destination(&h, &content).await;
    let before = quota.usage().bytes;
    // As cp asks: everything from the start, far more than the file holds.
    let n =
        h.fs.copy_file_range(fh_in, 0, fh_out, 0, 1 << 40)
            .await
            .unwrap();
    assert_eq!(n as usize, content.len(), "copies what the source holds");
    assert_eq!(std::fs::read(h.disk("dst")).unwrap(), content);
    assert_eq!(h.plan.calls(ROp::CopyData), 1);
    assert_eq!(h.plan.calls(ROp::Read), 0, "no data crossed the link");
    assert_eq!(h.plan.calls(ROp::Write), 0, "no data crossed the link");
    assert_eq!(
        h.size(dst, None).await,
        content.len() as u64,
        "cached size dropped"
    );
    assert_eq!(
        quota.usage().bytes - before,
        content.len() as i64,
        "growth charged"
    );
    assert_eq!(
        h.fs.stats.bytes_copied_on_server.load(Ordering::Relaxed),
        n as u64
    );
    // At the end of the source: nothing more to copy (cp's last call).
    let n = h.fs.copy_file_range(
        fh_in,
        content.len() as u64,
        fh_out,
        content.len() as u64,
        1 << 40,
    );
    assert_eq!(n.await.unwrap(), 0);
    // A range, into the middle of the destination: only that range changes.
    let range = 200usize << 10;
    let n = h.fs.copy_file_range(fh_in, 5000, fh_out, 100, range as u64);
    assert_eq!(n.await.unwrap() as usize, range);
    let mut want = content.clone();
    want[100..100 + range].copy_from_slice(&content[5000..5000 + range]);
    assert_eq!(h.read(fh_out, 0, want.len() as u32 + 10).await, want);
    assert_eq!(
        quota.usage().bytes - before,
        content.len() as i64,
        "no growth, no charge"
    );
    h.fs.release(fh_in).await.unwrap();
    h.fs.release(fh_out).await.unwrap();
    assert_eq!(
        h.open_handles().await,
        0,
        "the source's extra handle is closed"
    );
}

/// Writes acknowledged to the application but still on their way, to either file, land
/// before the copy: the copy sees the source as written, and is not overwritten by an older
/// write of the destination landing after it. (The fault plan's delayed writes land in one
/// queue, so each half has writes pending on one file only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_comes_after_the_writes_before_it() {
    let h = Harness::new();
    let content = pattern(200 << 10);
    let len = content.len() as u64;
    let (fh_in, _, fh_out) = source_and_destination(&h, &content).await;
    let fh_src_w = h.open(h.lookup(ROOT, "src").await, libc::O_WRONLY).await;
    // Writes land a while after they are answered, as over a slow link.
    h.plan
        .set_queue_delay(ROp::Write, Some(Duration::from_millis(300)));
    h.write(fh_src_w, 0, b"NEW").await;
    let mut want = content.clone();
    want[..3].copy_from_slice(b"NEW");
    let n =
        h.fs.copy_file_range(fh_in, 0, fh_out, 0, len)
            .await
            .unwrap();
    assert_eq!(n as u64, len);
    assert!(
        std::fs::read(h.disk("dst")).unwrap() == want,
        "the copy missed the write"
    );

    h.write(fh_out, 0, b"destination").await;
    h.write(fh_out, len, b"!").await;
    let n =
        h.fs.copy_file_range(fh_in, 0, fh_out, 0, len)
            .await
            .unwrap();
    assert_eq!(n as u64, len);
    h.plan.set_queue_delay(ROp::Write, None);
    h.fs.flush(fh_out).await.unwrap();
    want.push(b'!');
    assert!(
        std::fs::read(h.disk("dst")).unwrap() == want,
        "an older write landed over the copy"
    );
    for fh in [fh_in, fh_src_w, fh_out] {
        h.fs.release(fh).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_is_held_to_the_quota_and_the_lease() {
    let h = Harness::new();
    let content = pattern(400 << 10);
    let (fh_in, _, fh_out) = source_and_destination(&h, &content).await;
    let quota = &h.fs.enforcer().quota;
    let half = 200u64 << 10;
    quota.set_limits(Some(quota.usage().bytes as u64 + half), None);
    // What fits is copied (a short copy), then nothing fits.
    let n =
        h.fs.copy_file_range(fh_in, 0, fh_out, 0, 2 * half)
            .await
            .unwrap();
    assert_eq!(n as u64, half);
    assert!(std::fs::read(h.disk("dst")).unwrap() == content[..half as usize]);
    let mut c = Checks::default();
    c.errno(
        "copy past the quota",
        h.fs.copy_file_range(fh_in, half, fh_out, half, half).await,
        libc::ENOSPC,
    );
    // Within the file's size nothing grows: allowed.
    c.check(
        "a copy over existing bytes within the quota",
        h.fs.copy_file_range(fh_in, 0, fh_out, 0, half).await.ok() == Some(half as u32),
    );
    h.fs.set_read_only();
    c.errno(
        "copy on a read-only mount",
        h.fs.copy_file_range(fh_in, 0, fh_out, 0, half).await,
        libc::EROFS,
    );
    c.check(
        "no server-side copy was sent when it must be refused",
        h.plan.calls(ROp::CopyData) == 2,
    );
    c.finish();
}

/// What the server will not copy is answered so that the kernel copies through read and
/// write (EOPNOTSUPP), or, for a server without the extension, stops asking (ENOSYS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_the_server_cannot_do_is_left_to_the_kernel() {
    let h = Harness::new();
    let (fh_in, dst, fh_out) = source_and_destination(&h, &pattern(300 << 10)).await;
    let len = 200 << 10;
    let mut c = Checks::default();
    h.plan.fail_next(ROp::CopyData, 1, failure("refused"));
    c.errno(
        "a copy the server refuses",
        h.fs.copy_file_range(fh_in, 0, fh_out, 0, len).await,
        libc::EOPNOTSUPP,
    );
    h.plan.fail_next(
        ROp::CopyData,
        1,
        RemoteError::Status(Status::OpUnsupported, "unknown extension".into()),
    );
    c.errno(
        "a server that does not know copy-data",
        h.fs.copy_file_range(fh_in, 0, fh_out, 0, len).await,
        libc::ENOSYS,
    );
    h.plan
        .fail_next(ROp::CopyData, 1, RemoteError::Unsupported("copy-data"));
    c.errno(
        "a server that does not offer copy-data",
        h.fs.copy_file_range(fh_in, 0, fh_out, 0, len).await,
        libc::ENOSYS,
    );
    let fh_dst_r = h.open(dst, libc::O_RDONLY).await;
    c.errno(
        "a copy within one file",
        h.fs.copy_file_range(fh_dst_r, 0, fh_out, 100, len).await,
        libc::EOPNOTSUPP,
    );
    c.errno(
        "a small copy",
        h.fs.copy_file_range(fh_in, 0, fh_out, 0, (128 << 10) - 1)
            .await,
        libc::EOPNOTSUPP,
    );
    // The source removed on the server: it cannot be opened again by its name.
    std::fs::remove_file(h.disk("src")).unwrap();
    c.errno(
        "a source that has no name any more",
        h.fs.copy_file_range(fh_in, 0, fh_out, 0, len).await,
        libc::EOPNOTSUPP,
    );
    c.check(
        "nothing was copied",
        std::fs::read(h.disk("dst")).unwrap().is_empty(),
    );
    c.finish();
}

/// A copy whose answer a drop took is done again once the destination is reopened: copying
/// the same bytes twice gives the same file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_whose_answer_was_lost_is_done_again() {
    let h = Harness::new();
    let content = pattern(500_000);
    let (fh_in, _, fh_out) = source_and_destination(&h, &content).await;
    h.plan
        .fail_next_after_performing(ROp::CopyData, 1, RemoteError::StaleHandle);
    let n = h.fs.copy_file_range(fh_in, 0, fh_out, 0, 500_000);
    assert_eq!(n.await.unwrap(), 500_000);
    assert_eq!(h.plan.calls(ROp::CopyData), 2);
    assert_eq!(std::fs::read(h.disk("dst")).unwrap(), content);
}

/// A small file fetched ahead is copied by the kernel from memory: no round trip to open it
/// on the server and wait for the copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_in_memory_is_copied_by_the_kernel() {
    let h = Harness::new();
    let inos = listed_small_files(&h, 4).await;
    cat(&h, inos[0]).await;
    cat(&h, inos[1]).await;
    wait_for_opens(&h, 4).await;
    let reader = h.open(inos[2], libc::O_RDONLY).await;
    assert_eq!(h.fs.stats.opens_fetched_ahead.load(Ordering::Relaxed), 1);
    let (_, fh_out) = h.create(ROOT, "dst").await;
    assert_errno(
        // (More than the file holds, which the kernel never asks: only the source being in
        // memory leaves this copy to the kernel.)
        h.fs.copy_file_range(reader, 0, fh_out, 0, 1 << 20).await,
        libc::EOPNOTSUPP,
        "copy of a fetched-ahead file",
    );
    assert_eq!(h.plan.calls(ROp::CopyData), 0);
}

/// A source whose name is a symlink on the server by the time of the copy (swapped in since
/// the application opened it) is not copied from: the kernel's copy reads the descriptor the
/// application opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_name_that_became_a_symlink_is_not_copied_from() {
    let h = Harness::new();
    let (fh_in, _, fh_out) = source_and_destination(&h, &pattern(300 << 10)).await;
    std::fs::write(h.disk("elsewhere"), pattern(1 << 20)).unwrap();
    std::fs::remove_file(h.disk("src")).unwrap();
    std::os::unix::fs::symlink(h.disk("elsewhere"), h.disk("src")).unwrap();
    assert_errno(
        h.fs.copy_file_range(fh_in, 0, fh_out, 0, 200 << 10).await,
        libc::EOPNOTSUPP,
        "copy from a name that is a symlink now",
    );
    assert_eq!(h.plan.calls(ROp::CopyData), 0);
    assert!(std::fs::read(h.disk("dst")).unwrap().is_empty());
}

/// `cp -p` sets the times and mode of the copy right after it, through the descriptor that
/// created the file: the answer (which the kernel takes the size from) shows what the server
/// copied, not the empty file it created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attributes_set_after_a_copy_show_what_was_copied() {
    let h = Harness::new();
    let content = pattern(300 << 10);
    std::fs::write(h.disk("src"), &content).unwrap();
    let fh_in = h.open(h.lookup(ROOT, "src").await, libc::O_RDONLY).await;
    // As cp creates its copy: O_EXCL.
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
    let (dst, fh_out) = h.create_with(ROOT, "dst", flags).await;
    let n = h.fs.copy_file_range(fh_in, 0, fh_out, 0, 1 << 30);
    let n = n.await.unwrap();
    assert_eq!(n as usize, content.len());
    let set = SetattrRequest {
        mode: Some(libc::S_IFREG | 0o600),
        mtime: at(1_000_000),
        atime: at(1_000_000),
        ..Default::default()
    };
    let a = h.fs.setattr(dst, Some(fh_out), set).await.unwrap();
    assert_eq!(
        a.size,
        content.len() as u64,
        "size in the answer to utimens"
    );
    assert_eq!(h.size(dst, None).await, content.len() as u64);
    h.fs.release(fh_out).await.unwrap();
    assert_eq!(h.meta("dst").mtime(), 1_000_000);
    assert_eq!(std::fs::read(h.disk("dst")).unwrap(), content);
}

/// A copy that failed (or whose answer was lost) may have changed the destination on the
/// server: what the mount knew of it is dropped all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_copy_drops_what_was_known_of_the_destination() {
    let h = Harness::new();
    let content = pattern(300 << 10);
    let (fh_in, dst, fh_out) = source_and_destination(&h, &content).await;
    assert_eq!(h.size(dst, None).await, 0);
    h.plan
        .fail_next_after_performing(ROp::CopyData, 1, failure("lost in the last step"));
    assert_errno(
        h.fs.copy_file_range(fh_in, 0, fh_out, 0, 1 << 30).await,
        libc::EOPNOTSUPP,
        "a copy that failed after it was done",
    );
    assert_eq!(
        h.size(dst, None).await,
        content.len() as u64,
        "the cached size of the destination was kept"
    );
}

/// The quota: a copy done again after a lost answer is charged once, and a copy the server
/// never makes (no extension) is not charged at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_is_charged_once_and_only_when_made() {
    let h = Harness::new();
    let quota = &h.fs.enforcer().quota;
    quota.set_limits(Some(100 << 20), None);
    let content = pattern(500_000);
    let (fh_in, _, fh_out) = source_and_destination(&h, &content).await;
    let before = quota.usage().bytes;
    h.plan
        .fail_next(ROp::CopyData, 1, RemoteError::Unsupported("copy-data"));
    assert_errno(
        h.fs.copy_file_range(fh_in, 0, fh_out, 0, 500_000).await,
        libc::ENOSYS,
        "no copy-data",
    );
    assert_eq!(quota.usage().bytes, before, "charged for a copy never made");
    h.plan
        .fail_next_after_performing(ROp::CopyData, 1, RemoteError::StaleHandle);
    let n = h.fs.copy_file_range(fh_in, 0, fh_out, 0, 500_000);
    assert_eq!(n.await.unwrap(), 500_000);
    assert_eq!(h.plan.calls(ROp::CopyData), 3);
    assert_eq!(quota.usage().bytes - before, 500_000, "charged twice");
}

/// Another file put in place of the source on the server (an editor's atomic save there):
/// the copy is left to the kernel, which reads the file the application opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_replaced_on_the_server_is_not_copied_from() {
    let h = Harness::new();
    let (fh_in, _, fh_out) = source_and_destination(&h, &pattern(300 << 10)).await;
    std::fs::write(h.disk("new"), pattern(400 << 10)).unwrap();
    std::fs::rename(h.disk("new"), h.disk("src")).unwrap();
    assert_errno(
        h.fs.copy_file_range(fh_in, 0, fh_out, 0, 200 << 10).await,
        libc::EOPNOTSUPP,
        "copy from a name that leads to another file now",
    );
    assert_eq!(h.plan.calls(ROp::CopyData), 0);
}

/// A lease that ends while the copy waits (here: for the source to be opened) stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_ends_during_a_copy_stops_it() {
    let h = Harness::new();
    let (fh_in, _, fh_out) = source_and_destination(&h, &pattern(300 << 10)).await;
    h.plan.hold(ROp::OpenBeside);
    let copy = tokio::spawn({
        let fs = h.fs.clone();
        async move { fs.copy_file_range(fh_in, 0, fh_out, 0, 1 << 30).await }
    });
    h.plan.until_held(ROp::OpenBeside, 1).await;
    h.fs.set_read_only();
    h.plan.release(ROp::OpenBeside);
    assert_errno(
        copy.await.unwrap(),
        libc::EROFS,
        "copy after the lease ended",
    );
    assert_eq!(h.plan.calls(ROp::CopyData), 0);
    assert!(std::fs::read(h.disk("dst")).unwrap().is_empty());
}
