//! Server-side copies: `copy_file_range(2)` between two files of the mount, carried out by the
//! server (OpenSSH's `copy-data` SFTP extension), so the data never crosses the link.
//!
//! `cp` (coreutils 9 and later) copies a regular file with `copy_file_range`; without this the
//! kernel copies through our `read` and `write`, and every byte crosses the link twice. Over a
//! 20 ms link a 64 MiB copy then takes seconds; done by the server it takes one round trip and
//! the server's own disk time.
//!
//! What a copy must keep, as a write does:
//! * **Program order.** Writes of either file that were acknowledged to an application but are
//!   still on their way (write-behind) land before the copy is sent; the kernel holds the
//!   destination's inode lock over the request, so no later write can overtake it.
//! * **Policy.** A read-only or expired lease refuses it (`EROFS`), the destination's growth is
//!   charged to the quota before anything is sent (`ENOSPC` when not a byte fits, a short copy
//!   when only part does), and the source is opened again by the name the mount knows it by,
//!   inside the export (`Fs::open_by_name`, safe against renames through the mount); a name
//!   that is a symlink on the server then (a followed link, or one swapped in since the
//!   application opened the file) is not copied from: the kernel's copy reads the
//!   application's own descriptor.
//! * **Caches.** The destination's cached attributes, listing entries and fetched-ahead copies
//!   are dropped as for a write; the kernel drops its own cached pages of the range.
//!
//! A source read ahead into memory (a small file, see `prefetch`) is left to the kernel, which
//! copies it from there. Anything the server will not copy (no `copy-data`, a server in read-only mode, a source it
//! cannot open, a source that ended early, two names of one file, a lost connection) is
//! answered `EOPNOTSUPP`, on which the kernel copies that range through `read` and `write`
//! itself, exactly as before: the copy still happens, with every guarantee of a write. A server
//! without the extension is answered `ENOSYS`, which the kernel remembers: it stops asking.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::file::close_in_background;
use super::inode::Ino;
use super::{past_max_offset, Fs};
use crate::error::{FsError, FsResult};
use crate::policy::quota::OverQuota;
use crate::remote::{FileKind, Remote, RemoteError, Status};

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

impl<R: Remote> Fs<R> {
    /// Copy up to `len` bytes at `offset_in` of the file open as `fh_in` to `offset_out` of
    /// the file open as `fh_out`, on the server: the number of bytes copied (fewer than `len`
    /// at the source's end, past [`MAX_SERVER_COPY`], or at the quota's edge).
    pub async fn copy_file_range(
        self: &Arc<Self>,
        fh_in: u64,
        offset_in: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
    ) -> FsResult<u32> {
        self.check_writable("copy_file_range")?;
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
        if self.snapshot(fh_in).is_some() {
            // A small file fetched ahead is in memory already: the kernel's copy reads it
            // from there and its writes go behind, which costs fewer round trips than
            // opening the source on the server and waiting for the copy.
            return Err(leave_to_kernel("the source is a small file read ahead"));
        }
        let ino_in = self.ino_of_open(fh_in)?;
        if ino_in == out.ino {
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
        self.drain_inode(ino_in).await;
        self.drain_inode(out.ino).await;

        let (remote, ino_out) = (self.remote.clone(), out.ino);
        let result = self
            .with_handle(&out, |to| {
                let remote = remote.clone();
                async move {
                    let ((from, attrs), _) = self
                        .open_by_name(
                            ino_in,
                            |path| {
                                let (remote, to) = (remote.clone(), to.clone());
                                async move { remote.open_beside(&path, &to).await }
                            },
                            |(h, _)| close_in_background(&remote, vec![h]),
                        )
                        .await?;
                    let copied = self
                        .copy_between(
                            &from,
                            offset_in,
                            (attrs.file_type(), attrs.size),
                            &to,
                            ino_out,
                            offset_out,
                            len,
                        )
                        .await;
                    close_in_background(&remote, vec![from]);
                    copied
                }
            })
            .await;
        match result {
            Ok(Ok(n)) => {
                if n > 0 {
                    self.status_changed(out.ino);
                    self.attrs_changed(out.ino, None);
                    self.stats
                        .bytes_copied_on_server
                        .fetch_add(n, Ordering::Relaxed);
                }
                Ok(n as u32)
            }
            Ok(Err(OverQuota)) => Err(FsError::new(
                libc::ENOSPC,
                "the delegation's byte quota is used up",
            )),
            Err(e) => {
                // Either way the kernel copies this range through read and write.
                tracing::debug!(ino_in, ino_out = out.ino, "server-side copy not done: {e}");
                match e {
                    RemoteError::Unsupported(_) | RemoteError::Status(Status::OpUnsupported, _) => {
                        Err(FsError::new(libc::ENOSYS, format!("server-side copy: {e}")))
                    }
                    e => Err(leave_to_kernel(e)),
                }
            }
        }
    }

    /// The inode of an open descriptor, whether it reads from a fetched-ahead copy or not.
    fn ino_of_open(&self, fh: u64) -> FsResult<Ino> {
        if let Some((ino, _)) = self.snapshots.lock().unwrap().get(&fh) {
            return Ok(*ino);
        }
        Ok(self.file(fh)?.ino)
    }

    /// One server-side copy of up to `len` bytes: as many as the source (a regular file of
    /// `size` bytes by its name when it was opened, not a link) holds past `offset_in` and the quota lets `ino_out` grow by.
    #[allow(clippy::too_many_arguments)]
    async fn copy_between(
        &self,
        from: &R::Handle,
        offset_in: u64,
        (kind, size): (FileKind, Option<u64>),
        to: &R::Handle,
        ino_out: Ino,
        offset_out: u64,
        len: u64,
    ) -> Result<Result<u64, OverQuota>, RemoteError> {
        if kind != FileKind::File {
            // The name leads through a symlink now (or to something else): the descriptor the
            // application opened is what the kernel's copy reads, not where a link points.
            return Err(RemoteError::Status(
                Status::Failure,
                format!("the source's name is a {kind:?} on the server now"),
            ));
        }
        let Some(size) = size else {
            return Err(RemoteError::Status(
                Status::Failure,
                "the server gave no size for the source".into(),
            ));
        };
        let n = len.min(size.saturating_sub(offset_in));
        if n == 0 {
            return Ok(Ok(0));
        }
        // Charged before it is sent, as a write is. (Asking twice for the same range, as a
        // retry after a reconnect does, charges nothing more: only growth is charged.)
        let n = match self.enforcer.quota.reserve_write(ino_out, offset_out, n) {
            Ok(fits) => fits.min(n),
            Err(over) => return Ok(Err(over)),
        };
        self.remote
            .copy_data(from, offset_in, n, to, offset_out)
            .await
            .map(|()| Ok(n))
    }
}
