//! Early write-back bookkeeping: when a long write should have the server write the file back
//! to its disk while the writes go on (see `file::WRITE_BACK_EVERY`), and which of those
//! write-backs failed.
//!
//! Early write-back pays only when the writer ends with an `fsync` (`dd conv=fsync`, git's
//! packs, a database, a package manager): the disk then works while the data comes instead of
//! after it. For a file closed without one (`cp` of a dataset) it is disk work the server
//! would have done later, off the writer's path, done now on it: on the 2-CPU test machine a
//! 256 MiB `dd` without `fsync` took 1.02 s with it against 0.82 s without (and 1.01 s
//! against 1.25 s with `conv=fsync`). So the mount follows what its writers do: a file
//! written back early and closed without an `fsync` turns it off; an `fsync` of a file whose
//! run reached the mark since its last `fsync` (written back early or not) turns it on
//! again. (A plain `sync(2)` never reaches a FUSE mount: `cp` then `sync` counts as closed
//! without one.) It is a guess from what was done, not a record of what was sent: a
//! write-back the SFTP remote skips (one already on its way) counts as sent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::inode::Ino;
use crate::remote::RemoteError;

/// What became of a file's runs that reached the write-back mark since its last `fsync`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mark {
    /// Written back early: wasted unless an `fsync` follows.
    Sent,
    /// Not written back (it was off), or a write-back already counted as wasted.
    Skipped,
}

pub struct EarlyWriteBack {
    wanted: AtomicBool,
    marks: Mutex<HashMap<Ino, Mark>>,
    /// Files whose early write-back the server failed, with its answer: for the file's next
    /// `fsync` to report.
    failures: Mutex<HashMap<Ino, RemoteError>>,
}

impl EarlyWriteBack {
    pub fn new() -> Self {
        EarlyWriteBack {
            wanted: AtomicBool::new(true),
            marks: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// A run of `ino` reached the write-back mark: should the server write it back now?
    pub fn due(&self, ino: Ino) -> bool {
        let wanted = self.wanted.load(Ordering::Relaxed);
        let mut marks = self.marks.lock().unwrap();
        let mark = marks.entry(ino).or_insert(Mark::Skipped);
        if wanted {
            *mark = Mark::Sent;
        }
        wanted
    }

    /// An `fsync` of `ino`: if a run of it reached the mark, early write-back pays. Returns
    /// the failure of a write-back of it, for this `fsync` to report (once).
    pub fn fsynced(&self, ino: Ino) -> Option<RemoteError> {
        if self.marks.lock().unwrap().remove(&ino).is_some()
            && !self.wanted.swap(true, Ordering::Relaxed)
        {
            tracing::debug!(
                ino,
                "a long write ended with fsync: early write-back on again"
            );
        }
        self.failures.lock().unwrap().remove(&ino)
    }

    /// The last descriptor of `ino` closed. A write-back sent since its last `fsync` was not
    /// needed (the mark is kept, so that an `fsync` after the close, `sync FILE` after `cp`,
    /// still counts).
    pub fn closed(&self, ino: Ino) {
        let mut marks = self.marks.lock().unwrap();
        if let Some(mark @ Mark::Sent) = marks.get_mut(&ino) {
            *mark = Mark::Skipped;
            if self.wanted.swap(false, Ordering::Relaxed) {
                tracing::debug!(
                    ino,
                    "a file written back early was closed without fsync: early write-back off"
                );
            }
        }
    }

    /// The server failed to write `ino` back to its disk early: kept for its next `fsync`.
    pub fn failed(&self, ino: Ino, e: RemoteError) {
        tracing::warn!(ino, "the server failed to write a file to its disk: {e}");
        self.failures.lock().unwrap().insert(ino, e);
    }

    #[cfg(test)]
    pub fn has_failure(&self, ino: Ino) -> bool {
        self.failures.lock().unwrap().contains_key(&ino)
    }

    /// Nobody can fsync `ino` any more (inode numbers are not reused).
    pub fn forget(&self, ino: Ino) {
        self.marks.lock().unwrap().remove(&ino);
        self.failures.lock().unwrap().remove(&ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_close_without_fsync_turns_it_off_an_fsync_after_the_mark_on() {
        let w = EarlyWriteBack::new();
        assert!(w.due(1), "on at first");
        w.fsynced(1);
        w.closed(1);
        assert!(w.due(2), "a write-back followed by fsync was needed");
        w.closed(2);
        assert!(!w.due(3), "file 2 was closed without fsync");
        w.closed(3);
        assert!(!w.due(3), "a skipped file's close changes nothing");
        // An fsync after the close still counts: `sync FILE` after `cp`.
        w.fsynced(2);
        assert!(w.due(4));
        // A file that never reached the mark says nothing either way.
        w.closed(5);
        w.fsynced(6);
        assert!(w.due(4));
        w.forget(4);
        w.closed(4);
        assert!(w.due(7), "a forgotten file's close changes nothing");
    }
}
