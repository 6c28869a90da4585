//! Dropping what the kernel caches of inodes (attributes and pages) and of names (entries),
//! on the mount's word.
//!
//! The kernel keeps an inode's attributes for the TTL the mount answered with, and its pages
//! until an open without `keep_cache` or a read that finds the attributes expired and moved.
//! That is right as long as the mount sees every change of the inode. It does not see one
//! case: a file with links made on the server is several inodes here (SFTP v3 has no inode
//! numbers), so a change through one name is a change the other inodes do not know of. For
//! those the mount tells the kernel itself (`FUSE_NOTIFY_INVAL_INODE`; see
//! `Fs::shared_data_changed`).
//!
//! Notifications go out from a thread of their own: the kernel handles one by dropping the
//! inode's pages, and waits for any page that a read in flight holds locked, a read that
//! only the mount's other threads can answer. So the threads serving requests never send
//! one; a request that must not be answered before the kernel has dropped what it had (a
//! close, an fsync, a setattr after a change) waits for [`KernelCaches::settled`] instead.
//!
//! Names: the kernel keeps a name the mount found absent for a while (see
//! `Fs::absence_ttl`), and a name it was told of. When the mount learns that what it said of
//! a name may be wrong (an operation on it failed after the server may have carried it out;
//! the server refused to remove a directory the mount thought empty), it drops its own
//! knowledge and has the kernel drop its entry too (`FUSE_NOTIFY_INVAL_ENTRY`).

use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};

use super::inode::Ino;

/// Sends the kernel's notifications: drop what it caches of one inode (its attributes and all
/// its pages). Errors (the kernel does not know the inode any more) are of no interest.
pub type Notify = Box<dyn Fn(Ino) + Send + 'static>;

/// Sends the kernel's notification to drop its entry for a name in a directory (positive or
/// negative: the next use of the name is looked up again).
pub type NotifyName = Box<dyn Fn(Ino, &OsStr) + Send + 'static>;

/// Names (directory, name) whose kernel entries are to go.
pub type Names = Vec<(Ino, OsString)>;

/// The queue of inodes whose kernel caches must go, and the thread that empties it; and the
/// queue of names whose kernel entries must go, with a thread of its own.
pub struct KernelCaches {
    queue: Mutex<Option<mpsc::Sender<Vec<Ino>>>>,
    /// Batches queued so far, and the count done as the thread reports it.
    queued: AtomicU64,
    done: tokio::sync::watch::Sender<u64>,
    names: Mutex<Option<mpsc::Sender<Names>>>,
}

impl Default for KernelCaches {
    fn default() -> Self {
        KernelCaches {
            queue: Mutex::new(None),
            queued: AtomicU64::new(0),
            done: tokio::sync::watch::Sender::new(0),
            names: Mutex::new(None),
        }
    }
}

impl KernelCaches {
    /// Start sending notifications through `notify` (once the kernel connection is up).
    /// Without it (tests of the core), invalidations are dropped.
    pub fn connect(&self, notify: Notify) {
        let (tx, rx) = mpsc::channel::<Vec<Ino>>();
        let done = self.done.clone();
        let spawned = std::thread::Builder::new()
            .name("kernel-caches".into())
            .spawn(move || {
                // Ends when the filesystem (the only sender) is dropped.
                while let Ok(inos) = rx.recv() {
                    inos.into_iter().for_each(&notify);
                    done.send_modify(|n| *n += 1);
                }
            });
        match spawned {
            Ok(_) => *self.queue.lock().unwrap() = Some(tx),
            Err(e) => tracing::warn!("no thread for kernel cache notifications: {e}"),
        }
    }

    /// Have the kernel drop what it caches of `inos`, soon (see [`KernelCaches::settled`]).
    pub fn invalidate(&self, inos: Vec<Ino>) {
        if inos.is_empty() {
            return;
        }
        if let Some(tx) = self.queue.lock().unwrap().as_ref() {
            self.queued.fetch_add(1, Ordering::AcqRel);
            if tx.send(inos).is_err() {
                // The thread is gone (it panicked): nothing will be done, do not wait.
                self.done.send_modify(|n| *n += 1);
            }
        }
    }

    /// Wait until the kernel has dropped everything queued so far.
    pub async fn settled(&self) {
        let target = self.queued.load(Ordering::Acquire);
        let mut done = self.done.subscribe();
        let _ = done.wait_for(|n| *n >= target).await;
    }

    /// Start sending notifications to drop names through `notify`. Without it (tests of the
    /// core), they are dropped.
    pub fn connect_names(&self, notify: NotifyName) {
        let (tx, rx) = mpsc::channel::<Names>();
        let spawned = std::thread::Builder::new()
            .name("kernel-names".into())
            .spawn(move || {
                while let Ok(names) = rx.recv() {
                    for (parent, name) in names {
                        notify(parent, &name);
                    }
                }
            });
        match spawned {
            Ok(_) => *self.names.lock().unwrap() = Some(tx),
            Err(e) => tracing::warn!("no thread for kernel name notifications: {e}"),
        }
    }

    /// Have the kernel drop its entries for `names` (parent, name), soon after. Nothing can
    /// wait for that: the kernel drops an entry under its directory's lock, which the request
    /// that found the entry wrong (an `rmdir` refused, a `symlink` whose outcome is unknown)
    /// holds until it is answered, as does a `chmod` of the directory that may be waiting for
    /// [`KernelCaches::settled`]. So these go from a thread of their own, and are not counted.
    pub fn forget_names(&self, names: Names) {
        if names.is_empty() {
            return;
        }
        if let Some(tx) = self.names.lock().unwrap().as_ref() {
            let _ = tx.send(names);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn settled_waits_for_every_batch_queued_before() {
        let k = KernelCaches::default();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let gate = Mutex::new(gate_rx);
        let s = seen.clone();
        k.connect(Box::new(move |ino| {
            gate.lock().unwrap().recv().unwrap();
            s.lock().unwrap().push(ino);
        }));
        // Nothing queued: settled at once.
        k.settled().await;
        k.invalidate(vec![3, 4]);
        k.invalidate(vec![]);
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), k.settled());
        assert!(waiting.await.is_err(), "settled before the kernel was told");
        gate_tx.send(()).unwrap();
        gate_tx.send(()).unwrap();
        k.settled().await;
        assert_eq!(*seen.lock().unwrap(), vec![3, 4]);
    }
}
