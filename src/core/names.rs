//! Name changes through the mount, for opening a live file again by its path.
//!
//! SFTP has no handle by inode: a file the mount must open again (after a reconnect, for
//! striping lanes, or to give a descriptor reading from a fetched-ahead copy a server handle)
//! is opened by the path the inode table knows it by. A rename or unlink through the mount
//! that the server carries out between the path lookup and the OPEN would have the OPEN land
//! on whatever has the name then: an editor's atomic save (`rename("f.tmp", "f")`) during an
//! outage made the writes a drop took, sent again, land in the new file. So every open of a
//! live file by its path ([`super::Fs::open_by_name`]) looks its path up only while no change
//! of that path (or of a directory above it) is on its way, and keeps the handle only if
//! none started before the OPEN was answered; otherwise it opens again under the new name, or
//! fails if the file has none. Changes elsewhere on the mount (an `rm -rf` in another
//! directory) do not disturb it.
//!
//! A rename or unlink whose answer a lost connection took may or may not have been carried
//! out, and the inode table cannot say which: the inodes it concerned are [`uncertain`] from
//! then on and are not opened by name again (their lost writes are reported, never sent to
//! whatever has the name now).
//!
//! Changes made on the server by others are outside what the mount can see (SFTP v3 has no
//! inode numbers to check against): that risk stays, and SEMANTICS.md says so.
//!
//! [`uncertain`]: NameChanges::set_uncertain

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tokio::sync::Notify;

use super::inode::Ino;

/// Recent changes remembered for [`NameChanges::touched_since`]; an open whose round trip
/// saw more than this many changes anywhere is treated as touched (and opens again).
const REMEMBERED: usize = 4096;

/// The renames and unlinks through the mount, by sequence number and the paths they touch.
#[derive(Debug, Default)]
pub struct NameChanges {
    state: Mutex<State>,
    /// Woken whenever a change on its way finishes.
    finished: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// The sequence number the next change gets.
    next: u64,
    /// Changes on their way: sequence number -> the paths they touch.
    on_the_way: HashMap<u64, Vec<PathBuf>>,
    /// The latest changes started, oldest first, at most [`REMEMBERED`].
    recent: VecDeque<(u64, Vec<PathBuf>)>,
    /// Inodes a change cut off by a lost connection concerned: their name is not known.
    uncertain: HashSet<Ino>,
}

impl State {
    fn record(&mut self, paths: &[PathBuf]) -> u64 {
        let seq = self.next;
        self.next += 1;
        if self.recent.len() == REMEMBERED {
            self.recent.pop_front();
        }
        self.recent.push_back((seq, paths.to_vec()));
        seq
    }
}

/// Whether a change of `changed` (the name itself, or a directory above) can make `path`
/// lead somewhere else.
fn touches(changed: &[PathBuf], path: &Path) -> bool {
    changed.iter().any(|c| path.starts_with(c))
}

/// A name change on its way to the server: finished when dropped, which must be after the
/// inode table shows its outcome (or after it failed).
#[must_use = "the change counts as on its way until the guard is dropped"]
pub struct NameChange<'a> {
    names: &'a NameChanges,
    seq: u64,
}

impl Drop for NameChange<'_> {
    fn drop(&mut self) {
        let mut state = self.names.state.lock().unwrap();
        state.on_the_way.remove(&self.seq);
        drop(state);
        self.names.finished.notify_waiters();
    }
}

impl NameChanges {
    /// A change of `paths` (a rename's source and target, an unlink's name) is about to be
    /// sent; call before the request goes out.
    pub fn start(&self, paths: &[&Path]) -> NameChange<'_> {
        let paths: Vec<PathBuf> = paths.iter().map(|p| p.to_path_buf()).collect();
        let mut state = self.state.lock().unwrap();
        let seq = state.record(&paths);
        state.on_the_way.insert(seq, paths);
        NameChange { names: self, seq }
    }

    /// A change of `path` whose outcome the inode table already shows (an unlink answered
    /// before its REMOVE is sent): an open of it looked up before must not be kept.
    pub fn bump(&self, path: &Path) {
        self.state.lock().unwrap().record(&[path.to_path_buf()]);
    }

    /// Wait until no change of `path` (or above it) is on its way; a mark for
    /// [`Self::touched_since`].
    pub async fn quiet_for(&self, path: &Path) -> u64 {
        loop {
            let finished = self.finished.notified();
            tokio::pin!(finished);
            // Registered before looking, so a finish between the look and the wait wakes it.
            finished.as_mut().enable();
            {
                let state = self.state.lock().unwrap();
                if !state.on_the_way.values().any(|c| touches(c, path)) {
                    return state.next;
                }
            }
            finished.await;
        }
    }

    /// Whether a change of `path` (or above it) started since `mark` (from
    /// [`Self::quiet_for`]). Also true when too many changes came since to tell.
    pub fn touched_since(&self, mark: u64, path: &Path) -> bool {
        let state = self.state.lock().unwrap();
        if state.next == mark {
            return false;
        }
        let oldest = state.recent.front().map_or(state.next, |(seq, _)| *seq);
        oldest > mark
            || state
                .recent
                .iter()
                .any(|(seq, c)| *seq >= mark && touches(c, path))
    }

    /// A change concerning `ino` was cut off by a lost connection: the server may or may not
    /// have carried it out, so the name the inode table has for it may lead elsewhere.
    pub fn set_uncertain(&self, ino: Ino) {
        self.state.lock().unwrap().uncertain.insert(ino);
    }

    pub fn is_uncertain(&self, ino: Ino) -> bool {
        self.state.lock().unwrap().uncertain.contains(&ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[tokio::test]
    async fn only_changes_of_the_path_or_above_it_count() {
        let n = NameChanges::default();
        let f = p("/ws/d/f");
        let mark = n.quiet_for(&f).await;
        assert!(!n.touched_since(mark, &f));
        // Elsewhere: an rm -rf in another directory, a sibling's rename.
        n.bump(&p("/ws/junk/x1"));
        drop(n.start(&[&p("/ws/d/g"), &p("/ws/d/h")]));
        assert!(!n.touched_since(mark, &f), "unrelated changes counted");
        // The file itself, or a directory above it.
        n.bump(&f);
        assert!(n.touched_since(mark, &f));
        let mark = n.quiet_for(&f).await;
        drop(n.start(&[&p("/ws/d"), &p("/ws/e")]));
        assert!(
            n.touched_since(mark, &f),
            "a move of its directory not counted"
        );
        // "/ws/d2" is not above "/ws/d/f" (components, not text).
        let mark = n.quiet_for(&f).await;
        n.bump(&p("/ws/d2"));
        n.bump(&p("/ws/d/f2"));
        assert!(!n.touched_since(mark, &f));
    }

    #[tokio::test]
    async fn quiet_for_waits_only_for_changes_of_the_path_on_their_way() {
        let n = NameChanges::default();
        let f = p("/ws/d/f");
        let elsewhere = n.start(&[&p("/ws/other")]);
        // Not held up by a change elsewhere.
        tokio::time::timeout(Duration::from_secs(30), n.quiet_for(&f))
            .await
            .expect("waited for a change of another path");
        let above = n.start(&[&p("/ws/d"), &p("/ws/e")]);
        let waiting = tokio::time::timeout(Duration::from_millis(50), n.quiet_for(&f)).await;
        assert!(waiting.is_err(), "did not wait for a move of its directory");
        drop(above);
        tokio::time::timeout(Duration::from_secs(30), n.quiet_for(&f))
            .await
            .expect("still waiting after the change finished");
        drop(elsewhere);
    }

    #[tokio::test]
    async fn too_many_changes_to_tell_count_as_touched() {
        let n = NameChanges::default();
        let f = p("/ws/f");
        let mark = n.quiet_for(&f).await;
        for i in 0..REMEMBERED + 1 {
            n.bump(&p(&format!("/ws/junk/{i}")));
        }
        assert!(n.touched_since(mark, &f));
    }

    #[test]
    fn uncertain_inodes_stay_uncertain() {
        let n = NameChanges::default();
        assert!(!n.is_uncertain(7));
        n.set_uncertain(7);
        assert!(n.is_uncertain(7) && !n.is_uncertain(8));
    }
}
