//! Open files: the remote handle, reopen after a reconnect, and write-behind.
//!
//! Writes are acknowledged to the application as soon as they are queued to the server (as
//! sshfs does), which is what makes sequential writes fast on a high-latency link. What keeps
//! that honest:
//! * one writer task per open file takes writes in the order the kernel sent them and puts them
//!   on the wire in that order, so overlapping writes are never reordered;
//! * bytes in flight per file are bounded by a semaphore, so memory does not grow with the file;
//! * the first failure is latched and returned by the next write, `flush` (every `close`) and
//!   `fsync`: an acknowledged write is on the server or its loss is reported, never silent.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, RwLock, Semaphore};

use super::inode::Ino;
use super::Fs;
use crate::remote::{OpenFlags, Remote, RemoteError};

/// Bytes of writes in flight per open file before the writer waits for answers.
pub const WRITE_WINDOW: u32 = 16 * 1024 * 1024;

pub(crate) enum WriteJob {
    Data {
        offset: u64,
        data: Bytes,
        done: oneshot::Sender<Result<u32, RemoteError>>,
    },
    /// Wait until every earlier write has been answered, then report the latched error.
    Barrier {
        done: oneshot::Sender<Result<(), RemoteError>>,
    },
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
    writer: Mutex<Option<mpsc::UnboundedSender<WriteJob>>>,
    window: Arc<Semaphore>,
    /// First write failure not yet reported by flush/fsync.
    error: Mutex<Option<RemoteError>>,
    /// Highest byte offset written through this handle (for the size the kernel is shown
    /// while writes are still in flight).
    pub written_end: AtomicU64,
    /// Write jobs submitted but not yet taken by the writer task.
    queued: AtomicUsize,
}

impl<R: Remote> OpenFile<R> {
    pub fn new(ino: Ino, flags: OpenFlags, handle: R::Handle) -> Self {
        OpenFile {
            ino,
            flags,
            handle: RwLock::new((handle, 0)),
            reopening: tokio::sync::Mutex::new(()),
            writer: Mutex::new(None),
            window: Arc::new(Semaphore::new(WRITE_WINDOW as usize)),
            error: Mutex::new(None),
            written_end: AtomicU64::new(0),
            queued: AtomicUsize::new(0),
        }
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

    pub fn latch(&self, err: RemoteError) {
        let mut slot = self.error.lock().unwrap();
        if slot.is_none() {
            *slot = Some(err);
        }
    }

    pub fn take_error(&self) -> Option<RemoteError> {
        self.error.lock().unwrap().take()
    }

    pub fn peek_error(&self) -> Option<RemoteError> {
        self.error.lock().unwrap().clone()
    }

    /// Whether writes are queued or in flight.
    pub fn writes_pending(&self) -> bool {
        self.queued.load(Ordering::Acquire) > 0
            || self.window.available_permits() < WRITE_WINDOW as usize
    }

    /// Queue a job for the writer task, starting the task on first use. Returns `false` if
    /// the file is being released.
    pub(crate) fn submit(self: &Arc<Self>, fs: &Arc<Fs<R>>, job: WriteJob) -> bool {
        let mut writer = self.writer.lock().unwrap();
        if writer.is_none() {
            let (tx, rx) = mpsc::unbounded_channel();
            fs.runtime()
                .spawn(writer_loop(self.clone(), Arc::downgrade(fs), rx));
            *writer = Some(tx);
        }
        let is_data = matches!(job, WriteJob::Data { .. });
        if is_data {
            self.queued.fetch_add(1, Ordering::AcqRel);
        }
        let sent = writer.as_ref().unwrap().send(job).is_ok();
        if is_data && !sent {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        sent
    }

    /// Wait for every queued write to be answered; report the first failure.
    pub async fn drain(self: &Arc<Self>, fs: &Arc<Fs<R>>) -> Result<(), RemoteError> {
        let has_writer = self.writer.lock().unwrap().is_some();
        if has_writer {
            let (done, rx) = oneshot::channel();
            if self.submit(fs, WriteJob::Barrier { done }) {
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

    /// Stop the writer task (after a final drain).
    pub fn stop_writer(&self) {
        self.writer.lock().unwrap().take();
    }
}

async fn writer_loop<R: Remote>(
    file: Arc<OpenFile<R>>,
    fs: Weak<Fs<R>>,
    mut rx: mpsc::UnboundedReceiver<WriteJob>,
) {
    let Some(remote) = fs.upgrade().map(|fs| fs.remote().clone()) else {
        return;
    };
    let max_write = remote.limits().max_write.max(4096) as usize;
    while let Some(job) = rx.recv().await {
        match job {
            WriteJob::Data { offset, data, done } => {
                if let Some(err) = file.peek_error() {
                    file.queued.fetch_sub(1, Ordering::AcqRel);
                    let _ = done.send(Err(err));
                    continue;
                }
                let len = data.len() as u32;
                let mut rest = data;
                let mut at = offset;
                while !rest.is_empty() {
                    let n = rest.len().min(max_write);
                    let chunk = rest.split_to(n);
                    let permit = match file.window.clone().acquire_many_owned(n as u32).await {
                        Ok(p) => p,
                        Err(_) => break,
                    };
                    let (handle, version) = file.versioned_handle().await;
                    let mut queued = remote.write_queued(&handle, at, chunk.clone()).await;
                    if matches!(queued, Err(RemoteError::StaleHandle)) {
                        // Opened before a reconnect and nothing of it in flight: reopen by
                        // path and go on. (Writes that were in flight when the connection
                        // dropped have failed and are reported; they are never replayed,
                        // since a later write may have overwritten the same bytes.)
                        queued = match fs.upgrade() {
                            Some(fs) => match fs.reopen(&file, version).await {
                                Ok(h) => remote.write_queued(&h, at, chunk).await,
                                Err(_) => Err(RemoteError::StaleHandle),
                            },
                            None => Err(RemoteError::StaleHandle),
                        };
                    }
                    match queued {
                        Ok(ack) => {
                            let file = file.clone();
                            tokio::spawn(async move {
                                if let Err(e) = ack.await {
                                    tracing::debug!(ino = file.ino, "write failed: {e}");
                                    file.latch(e);
                                }
                                drop(permit);
                            });
                        }
                        Err(e) => {
                            file.latch(e);
                            break;
                        }
                    }
                    at += n as u64;
                }
                file.written_end
                    .fetch_max(offset + len as u64, Ordering::Relaxed);
                file.queued.fetch_sub(1, Ordering::AcqRel);
                let _ = done.send(Ok(len));
            }
            WriteJob::Barrier { done } => {
                // Taking the whole window means every write before this one has been answered.
                let all = file.window.acquire_many(WRITE_WINDOW).await;
                drop(all);
                let _ = done.send(match file.take_error() {
                    Some(e) => Err(e),
                    None => Ok(()),
                });
            }
        }
    }
}
