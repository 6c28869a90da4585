//! Unlinks answered before the server has answered them (see `Fs::unlink`): which are still
//! on their way, so that what must come after one waits for it, and which failed, to report.
//!
//! `rm -rf` unlinks one name after another, and each unlink costs a round trip when it waits
//! for the server's REMOVE: 210 names at 20 ms is 4.2 s of waiting. A local filesystem
//! answers unlink from memory and commits later; this does the same for the names the
//! mount can vouch for, and keeps the order every later operation depends on:
//!
//! - a lookup of the name and a listing of its directory wait for the REMOVE, so the server
//!   is never asked anything its answer could predate; an `rmdir` that the server refuses
//!   while REMOVEs are on their way is sent again once they have landed;
//! - operations that create names or move paths (create, mkdir, symlink, link, rename)
//!   wait for every REMOVE on its way, since REMOVEs travel on several channels and carry
//!   paths;
//! - `fsync` of the directory, and unmount, wait for them too, and fsync reports a failure.
//!
//! A REMOVE the server refuses puts the name back (the cache forgets it was removed, so the
//! next lookup finds it on the server), is logged, and its error is given to the next
//! `fsync` of the directory; an `rmdir` of the directory then fails with ENOTEMPTY, as it
//! should. Nothing is lost: the failure mode of an unlink answered early is a file that is
//! still there.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::sync::Mutex;

use tokio::sync::watch;

use super::inode::Ino;
use crate::error::FsError;

/// How many unlinks may be on their way at once; past that, unlink waits for the server
/// (the order-keeping waits above stay short, and a failing server cannot pile up work).
pub const MAX_IN_FLIGHT: usize = 256;

pub struct RemovesBehind {
    state: Mutex<State>,
    /// Bumped whenever a REMOVE lands: waiters look again.
    landed: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    /// The order numbers of those on their way, per name, oldest first.
    names: HashMap<(Ino, OsString), VecDeque<u64>>,
    dirs: HashMap<Ino, usize>,
    total: usize,
    /// Order numbers: the next one to give, and those on their way (for
    /// [`RemovesBehind::all_settled`], which waits only for what began before it).
    next: u64,
    on_their_way: BTreeSet<u64>,
    /// The first failure in each directory, until an fsync of it reports it.
    failed: HashMap<Ino, FsError>,
}

impl Default for RemovesBehind {
    fn default() -> Self {
        RemovesBehind {
            state: Mutex::new(State::default()),
            landed: watch::channel(0).0,
        }
    }
}

impl RemovesBehind {
    /// Count the REMOVE of `name` in `parent` as on its way. False (nothing counted) when too
    /// many are, or when one already failed in `parent` (the next ones there are likely to
    /// fail the same way, and are better answered by the server, with their own error).
    pub fn begin(&self, parent: Ino, name: &OsStr) -> bool {
        let mut s = self.state.lock().unwrap();
        if s.total >= MAX_IN_FLIGHT || s.failed.contains_key(&parent) {
            return false;
        }
        s.total += 1;
        *s.dirs.entry(parent).or_default() += 1;
        let seq = s.next;
        s.next += 1;
        s.on_their_way.insert(seq);
        s.names
            .entry((parent, name.to_os_string()))
            .or_default()
            .push_back(seq);
        true
    }

    /// The REMOVE counted by [`begin`](Self::begin) was answered; `failure` if the name is
    /// still there.
    pub fn land(&self, parent: Ino, name: &OsStr, failure: Option<FsError>) {
        {
            let mut s = self.state.lock().unwrap();
            s.total -= 1;
            decrement(&mut s.dirs, parent);
            let key = (parent, name.to_os_string());
            if let Some(seqs) = s.names.get_mut(&key) {
                let seq = seqs.pop_front();
                if seqs.is_empty() {
                    s.names.remove(&key);
                }
                if let Some(seq) = seq {
                    s.on_their_way.remove(&seq);
                }
            }
            if let Some(e) = failure {
                s.failed.entry(parent).or_insert(e);
            }
        }
        self.landed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Wait until no REMOVE of `name` in `parent` is on its way.
    pub async fn name_settled(&self, parent: Ino, name: &OsStr) {
        let key = (parent, name.to_os_string());
        self.until(|s| !s.names.contains_key(&key)).await
    }

    /// Whether one is on its way in `dir`.
    pub fn in_dir(&self, dir: Ino) -> bool {
        self.state.lock().unwrap().dirs.contains_key(&dir)
    }

    /// Wait until no REMOVE in `dir` is on its way.
    pub async fn dir_settled(&self, dir: Ino) {
        self.until(|s| !s.dirs.contains_key(&dir)).await
    }

    /// Wait until every REMOVE that was on its way when this was called has landed (not
    /// those begun since: a steady stream of them, from other processes, must not starve
    /// the caller).
    pub async fn all_settled(&self) {
        let before = self.state.lock().unwrap().next;
        self.until(|s| {
            s.on_their_way
                .first()
                .is_none_or(|&oldest| oldest >= before)
        })
        .await
    }

    /// The failure to report for `dir` (once).
    pub fn take_failure(&self, dir: Ino) -> Option<FsError> {
        self.state.lock().unwrap().failed.remove(&dir)
    }

    /// A failure to report for the whole mount (once), if any directory has one.
    pub fn take_any_failure(&self) -> Option<FsError> {
        let mut s = self.state.lock().unwrap();
        let dir = *s.failed.keys().next()?;
        s.failed.remove(&dir)
    }

    /// How many REMOVEs are on their way.
    pub fn in_flight(&self) -> usize {
        self.state.lock().unwrap().total
    }

    async fn until(&self, done: impl Fn(&State) -> bool) {
        // Subscribe before looking, so a landing in between wakes us.
        let mut rx = self.landed.subscribe();
        loop {
            if done(&self.state.lock().unwrap()) {
                return;
            }
            // (The sender lives in `self`: this cannot fail while we borrow it.)
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

fn decrement<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: K) {
    if let std::collections::hash_map::Entry::Occupied(mut e) = map.entry(key) {
        *e.get_mut() -= 1;
        if *e.get() == 0 {
            e.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn waits_end_when_their_removes_land() {
        let r = Arc::new(RemovesBehind::default());
        assert!(r.begin(1, OsStr::new("a")));
        assert!(r.begin(2, OsStr::new("b")));
        // Nothing on its way in dir 3 or for other names: no wait.
        r.dir_settled(3).await;
        r.name_settled(1, OsStr::new("b")).await;
        let waiter = {
            let r = r.clone();
            tokio::spawn(async move { r.dir_settled(1).await })
        };
        let all = {
            let r = r.clone();
            tokio::spawn(async move { r.all_settled().await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        r.land(1, OsStr::new("a"), None);
        waiter.await.unwrap();
        assert!(!all.is_finished());
        r.land(2, OsStr::new("b"), None);
        all.await.unwrap();
        assert_eq!(r.in_flight(), 0);
    }

    /// `all_settled` waits for what was on its way when it was called, not for what began
    /// later: a steady stream of them cannot starve it.
    #[tokio::test]
    async fn all_settled_does_not_wait_for_later_ones() {
        let r = Arc::new(RemovesBehind::default());
        assert!(r.begin(1, OsStr::new("a")));
        let all = {
            let r = r.clone();
            tokio::spawn(async move { r.all_settled().await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(r.begin(1, OsStr::new("b")));
        assert!(r.begin(1, OsStr::new("a")), "the same name again, later");
        assert!(!all.is_finished());
        r.land(1, OsStr::new("a"), None);
        tokio::time::timeout(Duration::from_secs(10), all)
            .await
            .expect("all_settled waited for removes begun after it")
            .unwrap();
        assert_eq!(r.in_flight(), 2);
        r.name_settled(1, OsStr::new("x")).await;
        r.land(1, OsStr::new("a"), None);
        r.land(1, OsStr::new("b"), None);
        r.all_settled().await;
        assert_eq!(r.in_flight(), 0);
    }

    #[test]
    fn a_failure_is_reported_once_and_stops_more_removes_behind_there() {
        let r = RemovesBehind::default();
        assert!(r.begin(1, OsStr::new("a")));
        r.land(
            1,
            OsStr::new("a"),
            Some(FsError::new(libc::EACCES, "a: refused")),
        );
        assert!(!r.begin(1, OsStr::new("b")), "dir 1 failed: next ones wait");
        assert!(r.begin(2, OsStr::new("b")), "other dirs are not affected");
        assert_eq!(r.take_failure(1).unwrap().errno, libc::EACCES);
        assert!(r.take_failure(1).is_none());
        assert!(r.begin(1, OsStr::new("c")), "reported: dir 1 goes on");
    }

    #[test]
    fn at_most_max_in_flight() {
        let r = RemovesBehind::default();
        for i in 0..MAX_IN_FLIGHT {
            assert!(r.begin(1, OsStr::new(&format!("f{i}"))));
        }
        assert!(!r.begin(1, OsStr::new("one-more")));
        r.land(1, OsStr::new("f0"), None);
        assert!(r.begin(1, OsStr::new("one-more")));
    }
}
