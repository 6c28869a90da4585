//! Open files: the remote handle, reopen after a reconnect, and write-behind.
//!
//! Writes are acknowledged to the application as soon as they are queued to the server (as
//! sshfs does), which is what makes sequential writes fast on a high-latency link. What keeps
//! that honest:
//! * one writer task **per file** (inode, not per descriptor) takes writes in the order the
//!   kernel sent them and puts them on the wire in that order. Consecutive writes through the
//!   same descriptor are pipelined; when the next write comes through another descriptor (which
//!   may live on another SFTP channel, served by another server process), the earlier writes
//!   are answered first. So overlapping writes are never reordered, whichever descriptors they
//!   come through;
//! * bytes in flight per file are bounded by a semaphore, so memory does not grow with the file;
//! * the first failure is latched on the descriptor it was written through and returned by the
//!   next write, `flush` (every `close`) and `fsync`: an acknowledged write is on the server or
//!   its loss is reported, never silent.
//!
//! `chmod`, `utimens` and a `chown` that keeps owner and group, of a file whose only descriptor
//! created it (`O_EXCL`, so the server user owns it), go through the same queue, behind the
//! writes: what `tar` and `cp -p` do to every file they make costs no round trip of its own.
//! They are reported like writes: a failure comes back from the next write, `flush` or
//! `fsync`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, RwLock, Semaphore};

use super::inode::Ino;
use super::Fs;
use crate::remote::{Attrs, OpenFlags, Remote, RemoteError, SetAttrs};

/// Bytes of writes in flight per file before the writer waits for answers.
pub const WRITE_WINDOW: u32 = 16 * 1024 * 1024;

pub(crate) enum WriteJob<R: Remote> {
    Data {
        file: Arc<OpenFile<R>>,
        offset: u64,
        data: Bytes,
        done: oneshot::Sender<Result<u32, RemoteError>>,
    },
    /// Change attributes through `file`'s handle, in order with the writes before it.
    SetAttrs {
        file: Arc<OpenFile<R>>,
        attrs: SetAttrs,
        done: oneshot::Sender<()>,
    },
    /// Wait until every earlier write has been answered, then report `file`'s latched error.
    Barrier {
        file: Arc<OpenFile<R>>,
        done: oneshot::Sender<Result<(), RemoteError>>,
    },
}

/// The ordered write queue of one file, shared by all its open descriptors.
pub struct WriteStream<R: Remote> {
    writer: Mutex<Option<mpsc::UnboundedSender<WriteJob<R>>>>,
    window: Arc<Semaphore>,
    /// Write jobs submitted but not yet taken by the writer task.
    queued: AtomicUsize,
}

impl<R: Remote> Default for WriteStream<R> {
    fn default() -> Self {
        WriteStream {
            writer: Mutex::new(None),
            window: Arc::new(Semaphore::new(WRITE_WINDOW as usize)),
            queued: AtomicUsize::new(0),
        }
    }
}

impl<R: Remote> WriteStream<R> {
    /// Whether writes are queued or in flight.
    pub fn pending(&self) -> bool {
        self.queued.load(Ordering::Acquire) > 0
            || self.window.available_permits() < WRITE_WINDOW as usize
    }

    /// Queue a job for the writer task, starting the task on first use.
    pub(crate) fn submit(self: &Arc<Self>, fs: &Arc<Fs<R>>, job: WriteJob<R>) -> bool {
        let mut writer = self.writer.lock().unwrap();
        if writer.is_none() {
            let (tx, rx) = mpsc::unbounded_channel();
            fs.runtime()
                .spawn(writer_loop(self.clone(), Arc::downgrade(fs), rx));
            *writer = Some(tx);
        }
        let is_data = !matches!(job, WriteJob::Barrier { .. });
        if is_data {
            self.queued.fetch_add(1, Ordering::AcqRel);
        }
        let sent = writer.as_ref().unwrap().send(job).is_ok();
        if is_data && !sent {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        sent
    }

    /// No descriptor of the file is open any more: let the writer task end once it has
    /// written what is queued (a later open starts a new one).
    pub fn stop(&self) {
        self.writer.lock().unwrap().take();
    }

    /// Wait until every write put on the wire so far has been answered.
    async fn wait_all_answered(&self) {
        drop(self.window.acquire_many(WRITE_WINDOW).await);
    }
}

pub struct OpenFile<R: Remote> {
    pub ino: Ino,
    pub flags: OpenFlags,
    /// The current remote handle and how many times it was reopened; replaced when the file
    /// is reopened after a reconnect.
    handle: RwLock<(R::Handle, u64)>,
    /// Serializes reopens: two requests that both found the handle stale must not both open
    /// a new one (the second would leak a server handle).
    reopening: tokio::sync::Mutex<()>,
    pub stream: Arc<WriteStream<R>>,
    /// First write failure through this descriptor not yet reported by flush/fsync.
    error: Mutex<Option<RemoteError>>,
    /// Highest byte offset written through this handle (for the size the kernel is shown
    /// while writes are still in flight).
    pub written_end: AtomicU64,
    /// Where the write that failed first (see `error`) would have ended: whether it went past
    /// the largest file the server can hold decides between EFBIG and EIO.
    failed_end: AtomicU64,
    /// The file's attributes while this descriptor created it and may change its mode and
    /// times behind the writes (see the module doc); None otherwise.
    created: Mutex<Option<Attrs>>,
}

impl<R: Remote> OpenFile<R> {
    pub fn new(ino: Ino, flags: OpenFlags, handle: R::Handle, stream: Arc<WriteStream<R>>) -> Self {
        OpenFile {
            ino,
            flags,
            handle: RwLock::new((handle, 0)),
            reopening: tokio::sync::Mutex::new(()),
            stream,
            error: Mutex::new(None),
            written_end: AtomicU64::new(0),
            failed_end: AtomicU64::new(0),
            created: Mutex::new(None),
        }
    }

    /// This descriptor created its file, which had `attrs` then.
    pub fn set_created(&self, attrs: Attrs) {
        *self.created.lock().unwrap() = Some(attrs);
    }

    /// The attributes the file has once everything queued lands, if this descriptor created
    /// it and nothing but writes and changes behind them happened since.
    pub fn created_attrs(&self) -> Option<Attrs> {
        *self.created.lock().unwrap()
    }

    /// Keep the attributes known after a change written behind; None: no longer known.
    pub fn update_created(&self, attrs: Option<Attrs>) {
        *self.created.lock().unwrap() = attrs;
    }

    /// Queue an attribute change behind this file's writes; resolves once it is on its way.
    pub(crate) fn submit_setattrs(
        self: &Arc<Self>,
        fs: &Arc<Fs<R>>,
        attrs: SetAttrs,
    ) -> Option<oneshot::Receiver<()>> {
        let (done, rx) = oneshot::channel();
        let job = WriteJob::SetAttrs {
            file: self.clone(),
            attrs,
            done,
        };
        self.stream.submit(fs, job).then_some(rx)
    }

    pub async fn handle(&self) -> R::Handle {
        self.handle.read().await.0.clone()
    }

    /// The handle with its reopen count, for [`OpenFile::reopen_with`].
    pub async fn versioned_handle(&self) -> (R::Handle, u64) {
        self.handle.read().await.clone()
    }

    /// Replace a handle found stale at version `seen` by what `open` returns, unless another
    /// request already did: then its handle is returned and `open` is not called.
    pub async fn reopen_with<F, Fut, E>(&self, seen: u64, open: F) -> Result<R::Handle, E>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<R::Handle, E>>,
    {
        let _one_at_a_time = self.reopening.lock().await;
        {
            let current = self.handle.read().await;
            if current.1 != seen {
                return Ok(current.0.clone());
            }
        }
        let new = open().await?;
        let mut slot = self.handle.write().await;
        *slot = (new.clone(), seen + 1);
        Ok(new)
    }

    /// Latch a failure whose write end is not known (0: never taken for EFBIG).
    pub fn latch(&self, err: RemoteError) {
        self.latch_write(err, 0);
    }

    /// Latch the failure of a write that would have ended at byte `end`.
    pub fn latch_write(&self, err: RemoteError, end: u64) {
        let mut slot = self.error.lock().unwrap();
        if slot.is_none() {
            *slot = Some(err);
            self.failed_end.store(end, Ordering::Relaxed);
        }
    }

    /// The end of the write whose failure was latched first (0 if unknown).
    pub fn failed_end(&self) -> u64 {
        self.failed_end.load(Ordering::Relaxed)
    }

    pub fn take_error(&self) -> Option<RemoteError> {
        self.error.lock().unwrap().take()
    }

    pub fn peek_error(&self) -> Option<RemoteError> {
        self.error.lock().unwrap().clone()
    }

    /// Whether writes of this file (through any descriptor) are queued or in flight.
    pub fn writes_pending(&self) -> bool {
        self.stream.pending()
    }

    /// Queue a write through this descriptor.
    pub(crate) fn submit_write(
        self: &Arc<Self>,
        fs: &Arc<Fs<R>>,
        offset: u64,
        data: Bytes,
        done: oneshot::Sender<Result<u32, RemoteError>>,
    ) -> bool {
        if let Some(a) = self.created.lock().unwrap().as_mut() {
            // The server sets the mtime as the write lands: no longer known here.
            a.mtime = None;
        }
        let job = WriteJob::Data {
            file: self.clone(),
            offset,
            data,
            done,
        };
        self.stream.submit(fs, job)
    }

    /// Wait for every write of the file queued so far to be answered; report the first failure
    /// of a write made through this descriptor.
    pub async fn drain(self: &Arc<Self>, fs: &Arc<Fs<R>>) -> Result<(), RemoteError> {
        let has_writer = self.stream.writer.lock().unwrap().is_some();
        if has_writer {
            let (done, rx) = oneshot::channel();
            let job = WriteJob::Barrier {
                file: self.clone(),
                done,
            };
            if self.stream.submit(fs, job) {
                if let Ok(result) = rx.await {
                    return result;
                }
            }
        }
        match self.take_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Put one chunk on the wire through `file`, reopening a handle that belongs to a lost
/// connection first. Only a write that was never sent is retried: one that was in flight
/// when the connection dropped is reported (a later write may have changed the same bytes).
async fn send_chunk<R: Remote>(
    fs: &Weak<Fs<R>>,
    remote: &Arc<R>,
    file: &Arc<OpenFile<R>>,
    at: u64,
    chunk: Bytes,
) -> Result<crate::remote::WriteAck, RemoteError> {
    let (handle, version) = file.versioned_handle().await;
    match remote.write_queued(&handle, at, chunk.clone()).await {
        Err(RemoteError::StaleHandle | RemoteError::Disconnected(_)) => {
            let Some(fs) = fs.upgrade() else {
                return Err(RemoteError::StaleHandle);
            };
            match fs.reopen(file, version).await {
                Ok(h) => remote.write_queued(&h, at, chunk).await,
                Err(_) => Err(RemoteError::StaleHandle),
            }
        }
        r => r,
    }
}

async fn writer_loop<R: Remote>(
    stream: Arc<WriteStream<R>>,
    fs: Weak<Fs<R>>,
    mut rx: mpsc::UnboundedReceiver<WriteJob<R>>,
) {
    let Some(remote) = fs.upgrade().map(|fs| fs.remote().clone()) else {
        return;
    };
    let max_write = remote.limits().max_write.max(4096) as usize;
    // The descriptor the previous write went through.
    let mut last: Option<usize> = None;
    while let Some(job) = rx.recv().await {
        match job {
            WriteJob::Data {
                file,
                offset,
                data,
                done,
            } => {
                if let Some(err) = file.peek_error() {
                    stream.queued.fetch_sub(1, Ordering::AcqRel);
                    let _ = done.send(Err(err));
                    continue;
                }
                let me = Arc::as_ptr(&file) as usize;
                if last.is_some_and(|p| p != me) {
                    // Another descriptor, maybe another channel: let the earlier writes land.
                    stream.wait_all_answered().await;
                }
                last = Some(me);
                let len = data.len() as u32;
                let mut rest = data;
                let mut at = offset;
                while !rest.is_empty() {
                    let n = rest.len().min(max_write);
                    let chunk = rest.split_to(n);
                    let Ok(permit) = stream.window.clone().acquire_many_owned(n as u32).await
                    else {
                        break;
                    };
                    let end = at + n as u64;
                    match send_chunk(&fs, &remote, &file, at, chunk).await {
                        Ok(ack) => {
                            let file = file.clone();
                            tokio::spawn(async move {
                                if let Err(e) = ack.await {
                                    tracing::debug!(ino = file.ino, "write failed: {e}");
                                    file.latch_write(e, end);
                                }
                                drop(permit);
                            });
                        }
                        Err(e) => {
                            file.latch_write(e, end);
                            break;
                        }
                    }
                    at += n as u64;
                }
                file.written_end
                    .fetch_max(offset + u64::from(len), Ordering::Relaxed);
                stream.queued.fetch_sub(1, Ordering::AcqRel);
                let _ = done.send(Ok(len));
            }
            WriteJob::SetAttrs { file, attrs, done } => {
                let me = Arc::as_ptr(&file) as usize;
                if last.is_some_and(|p| p != me) {
                    stream.wait_all_answered().await;
                }
                last = Some(me);
                // One unit of the window: "all answered" waits for this one too.
                if let Ok(permit) = stream.window.clone().acquire_many_owned(1).await {
                    let (handle, _) = file.versioned_handle().await;
                    match remote.fsetstat_queued(&handle, attrs).await {
                        Ok(ack) => {
                            let file = file.clone();
                            tokio::spawn(async move {
                                if let Err(e) = ack.await {
                                    tracing::debug!(
                                        ino = file.ino,
                                        "setattr behind writes failed: {e}"
                                    );
                                    file.latch(e);
                                }
                                drop(permit);
                            });
                        }
                        Err(e) => file.latch(e),
                    }
                }
                stream.queued.fetch_sub(1, Ordering::AcqRel);
                let _ = done.send(());
            }
            WriteJob::Barrier { file, done } => {
                stream.wait_all_answered().await;
                let _ = done.send(match file.take_error() {
                    Some(e) => Err(e),
                    None => Ok(()),
                });
            }
        }
    }
}
