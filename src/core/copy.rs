//! Server-side copies: `copy_file_range(2)` between two files of the mount, carried out by the
//! server (OpenSSH's `copy-data` SFTP extension), so the data never crosses the link.
//!
//! `cp` (coreutils 9 and later) copies a regular file with `copy_file_range`; without this the
//! kernel copies through our `read` and `write`, and every byte crosses the link twice. Over a
//! 20 ms link a 64 MiB copy then takes seconds; done by the server it takes two round trips and
//! the server's own disk time.
//!
//! What a copy must keep, as a write does:
//! * **Program order.** Writes of either file that were acknowledged to an application but are
//!   still on their way (write-behind) land before the copy is sent; the kernel holds the
//!   destination's inode lock over the request, so no later write can overtake it.
//! * **Policy.** A read-only or expired lease refuses it (`EROFS`, checked again right before
//!   the copy is sent), and the destination's growth is charged to the quota before anything
//!   is sent (`ENOSPC` when not a byte fits, a short copy when only part does).
//! * **The right source.** It is opened again by the name the mount knows it by, inside the
//!   export (`Fs::open_by_name`, safe against renames through the mount), with an LSTAT of
//!   the name in the same round trip and an FSTAT of the application's own descriptor beside
//!   it: a name that is a symlink on the server by then, or leads to a file of another size or
//!   mtime (another file put in its place on the server), is not copied from.
//! * **Caches.** The destination's cached attributes, listing entries and fetched-ahead copies
//!   are dropped as for a write (also after a copy that failed, which may have done part),
//!   and its descriptors forget the attributes they had when they created it; the kernel
//!   drops its own cached pages of the range.
//! * **No silent short copy.** OpenSSH answers OK for a copy that failed in its last 64 KiB
//!   step; the SFTP remote checks both files' sizes behind it (see `SftpRemote::copy_data`).
//!
//! A copy under [`MIN_SERVER_COPY`], or from a small file read ahead into memory (see
//! `prefetch`), is left to the kernel, which costs no more round trips there. So is anything
//! the server will not or did not copy (a source it cannot open or that leads elsewhere, two
//! names of one file, an `O_APPEND` destination, a failed or short copy, a lost connection
//! that a reconnect could not make up for): answered `EOPNOTSUPP`, on which the kernel copies
//! that range through `read` and `write` itself, exactly as before, with every guarantee of a
//! write. A server without the extension, or whose policy refuses it, is answered `ENOSYS`,
//! which the kernel remembers: it stops asking.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::file::{close_in_background, OpenFile};
use super::inode::Ino;
use super::{past_max_offset, quota_used_up, Fs};
use crate::error::{FsError, FsResult};
use crate::policy::quota::OverQuota;
use crate::remote::{Attrs, FileKind, Remote, RemoteError, Status};

/// The most one request copies. OpenSSH's `sftp-server` answers nothing else on that channel
/// while it copies, so a bound keeps the other requests of the channel from waiting long
/// (64 MiB is a fraction of a second on a local disk); `cp` asks again for the rest, as it
/// does after any short copy.
pub const MAX_SERVER_COPY: u64 = 64 << 20;

/// Copies smaller than this are left to the kernel. A server copy costs two round trips
/// (opening the source beside the destination, then the copy) whatever the size; the
/// kernel's copy of a small range costs about as many (a read, and the wait for the writes
/// at close) and on a fast link less: on loopback, `cp -r` of a source tree of 1,392 files
/// (median 8.7 KiB) took 15 % longer with every file copied by the server (the bench's
/// `cp_in`, docs/PERFORMANCE.md). Past this size the bytes that need not cross the link pay
/// for it.
pub const MIN_SERVER_COPY: u64 = 128 << 10;

/// Why a copy is left to the kernel.
fn leave_to_kernel(why: impl std::fmt::Display) -> FsError {
    FsError::new(
        libc::EOPNOTSUPP,
        format!("copied through read and write: {why}"),
    )
}

/// One copy as the kernel asked for it (`len` already bounded).
#[derive(Debug, Clone, Copy)]
struct Job {
    ino_in: Ino,
    offset_in: u64,
    ino_out: Ino,
    offset_out: u64,
    len: u64,
}

/// Errors after which the server certainly copied nothing and never will: it does not
/// offer the extension, or its request policy refuses it (`sftp-server -R`, or `-P`). The
/// kernel is told to stop asking (ENOSYS).
fn never_copies(e: &RemoteError) -> bool {
    matches!(
        e,
        RemoteError::Unsupported(_)
            | RemoteError::Status(Status::OpUnsupported | Status::PermissionDenied, _)
    )
}

impl<R: Remote> Fs<R> {
    /// Copy up to `len` bytes at `offset_in` of the file open as `fh_in` to `offset_out` of
    /// the file open as `fh_out`, on the server: the number of bytes copied (fewer than `len`
    /// at the source's end, past `MAX_SERVER_COPY`, or at the quota's edge).
    pub async fn copy_file_range(
        self: &Arc<Self>,
        fh_in: u64,
        offset_in: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
    ) -> FsResult<u32> {
        let _mutating = self.check_writable("copy_file_range")?;
        let out = self.file(fh_out)?;
        if !out.flags.write {
            return Err(FsError::new(
                libc::EBADF,
                "destination not open for writing",
            ));
        }
        if out.flags.append {
            // sftp-server would append wherever the offset says: not what was asked.
            return Err(leave_to_kernel("destination opened with O_APPEND"));
        }
        let without_handle = self.snapshots.lock().unwrap().get(&fh_in).cloned();
        match without_handle {
            Some((ino, snap)) if snap.deferred => {
                // Opened without the server (the kernel keeps its pages): the copy needs
                // the source's handle. (If the server will not open it, the kernel's copy
                // reads through the same descriptor, and reports what the server says then.)
                self.snapshot_to_handle(fh_in, ino)
                    .await
                    .map_err(|_| leave_to_kernel("the source cannot be opened on the server"))?;
            }
            Some(_) => {
                // A small file fetched ahead is in memory already: the kernel's copy reads
                // it from there and its writes go behind, which costs fewer round trips than
                // opening the source on the server and waiting for the copy.
                return Err(leave_to_kernel("the source is a small file read ahead"));
            }
            None => {}
        }
        let input = self.file(fh_in)?;
        if input.ino == out.ino {
            // sftp-server refuses a copy within one file.
            return Err(leave_to_kernel("source and destination are the same file"));
        }
        let len = len.min(MAX_SERVER_COPY);
        if len == 0 {
            return Ok(0);
        }
        if len < MIN_SERVER_COPY {
            return Err(leave_to_kernel(format!("{len} bytes is a small copy")));
        }
        if past_max_offset(offset_out, len) {
            return Err(FsError::new(
                libc::EFBIG,
                format!("copy of {len} bytes to {offset_out}: past the largest offset"),
            ));
        }
        // Program order: what was written to either file before reaches the server first.
        self.drain_inode(input.ino).await;
        self.drain_inode(out.ino).await;

        let job = Job {
            ino_in: input.ino,
            offset_in,
            ino_out: out.ino,
            offset_out,
            len,
        };
        // (Waits for a create of either answered early.) Into a file whose create failed: the
        // failure is the file's, not the server's refusal of copies.
        if let Some(e) = out.handle().await.err() {
            return Err(FsError::new(
                libc::EIO,
                format!("copy into a file whose create failed: {e}"),
            ));
        }
        let result = self
            .with_handle(&out, |to| self.copy_once(&input, to, job))
            .await;
        match result {
            Ok(Ok(n)) => {
                self.stats
                    .bytes_copied_on_server
                    .fetch_add(n, Ordering::Relaxed);
                Ok(n as u32)
            }
            // Refused for the application: ENOSPC, EROFS.
            Ok(Err(e)) => Err(e),
            Err(e) => {
                // Either way the kernel copies this range through read and write.
                tracing::debug!(
                    ino_in = job.ino_in,
                    ino_out = job.ino_out,
                    "server-side copy not done: {e}"
                );
                match never_copies(&e) {
                    true => Err(FsError::new(libc::ENOSYS, format!("server-side copy: {e}"))),
                    false => Err(leave_to_kernel(e)),
                }
            }
        }
    }

    /// One try, on the destination's server handle `to`: the source is opened again by its
    /// name beside `to`, while its own descriptor's handle is asked for its attributes, so
    /// that a name that leads elsewhere now (a symlink, or another file put in its place on
    /// the server) is noticed before anything is copied.
    async fn copy_once(
        &self,
        input: &Arc<OpenFile<R>>,
        to: R::Handle,
        job: Job,
    ) -> Result<FsResult<u64>, RemoteError> {
        let remote = &self.remote;
        let own = match input.handle().await {
            Ok(own) => own,
            // A create answered early that failed: not the server's refusal of a copy.
            Err(e) => {
                return Ok(Err(FsError::new(
                    libc::EIO,
                    format!("copy from a file whose create failed: {e}"),
                )))
            }
        };
        let (opened, own) = tokio::join!(
            self.open_by_name(
                job.ino_in,
                |path| {
                    let (remote, to) = (remote.clone(), to.clone());
                    async move { remote.open_beside(&path, &to).await }
                },
                |(h, _)| close_in_background(remote, vec![h]),
            ),
            remote.fstat(&own),
        );
        let ((from, named), _) = opened?;
        let result = match own {
            Ok(own) => self.copy_from(&from, &named, &own, &to, job).await,
            Err(e) => Err(e),
        };
        close_in_background(remote, vec![from]);
        result
    }

    /// The copy itself, from `from` (opened by the source's name, which has attributes
    /// `named`; `own`: those of the application's own descriptor of it) to `to`: as many
    /// bytes as the source holds past the offset and the quota lets the destination grow by.
    async fn copy_from(
        &self,
        from: &R::Handle,
        named: &Attrs,
        own: &Attrs,
        to: &R::Handle,
        job: Job,
    ) -> Result<FsResult<u64>, RemoteError> {
        let leads_elsewhere = |why: String| Err(RemoteError::Status(Status::Failure, why));
        let kind = named.file_type();
        if kind != FileKind::File {
            // The name leads through a symlink now (or to something else): the descriptor the
            // application opened is what the kernel's copy reads, not where a link points.
            return leads_elsewhere(format!("the source's name is a {kind:?} on the server now"));
        }
        if (named.size, named.mtime) != (own.size, own.mtime) {
            return leads_elsewhere("the source's name leads to another file now".into());
        }
        let Some(size) = named.size else {
            return leads_elsewhere("the server gave no size for the source".into());
        };
        let n = job.len.min(size.saturating_sub(job.offset_in));
        if n == 0 {
            return Ok(Ok(0));
        }
        // Again: the lease may have ended while the source was opened (or a reconnect waited).
        if let Err(e) = self.check_writable("copy_file_range").map(drop) {
            return Ok(Err(e));
        }
        // Charged before it is sent, as a write is. (Asking twice for the same range, as a
        // retry after a reconnect does, charges nothing more: only growth is charged.)
        let quota = &self.enforcer.quota;
        let size_before = quota.size_of(job.ino_out);
        let n = match quota.reserve_write(job.ino_out, job.offset_out, n) {
            Ok(fits) => fits.min(n),
            Err(OverQuota) => return Ok(Err(quota_used_up())),
        };
        let result = self
            .remote
            .copy_data(from, job.offset_in, n, to, job.offset_out)
            .await;
        match &result {
            Err(e) if never_copies(e) => {
                // Nothing was copied: nothing stays charged (the kernel's copy charges its
                // own writes).
                if let Some(size) = size_before {
                    quota.unreserve(job.ino_out, size);
                }
            }
            // Copied, or maybe partly (a failure, a lost answer): what was known of the
            // destination is not any more.
            _ => self.copied_into(job.ino_out),
        }
        result.map(|()| Ok(n))
    }

    /// The server changed `ino`'s data behind the mount's write path: its cached attributes,
    /// listing entries and fetched-ahead copies go, and no descriptor of it answers from the
    /// attributes it had when it created the file (`cp -p` sets times right after the copy).
    fn copied_into(&self, ino: Ino) {
        self.forget_created(ino);
        self.data_changed(ino);
        self.attrs_changed(ino, None);
    }
}
