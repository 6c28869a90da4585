//! The inode table: stable inode numbers for a path-based remote.
//!
//! SFTP has no inode numbers, only paths. The kernel, however, wants a number per object that
//! stays the same across renames and while a file is open after being unlinked. So an inode here
//! is an identity known under one or more names `(parent inode, name)` that the table keeps up
//! to date as the mount itself renames and removes things, and the full remote path is derived
//! by walking the parents of its first name.
//!
//! Hard links: a link made through the mount is recorded as another name (an alias) of the
//! same inode, so the kernel keeps one inode, one page cache and one set of attributes for
//! both names. Removing or renaming one name leaves the inode reachable (and its server path
//! switched to) a remaining one. Links made on the server cannot be recognised over SFTP v3
//! (no inode numbers): each of their names is its own inode here; see `Fs::attr_ttl_for`.
//!
//! Lifetime follows the kernel's lookup count: an inode is created on the first lookup of a name
//! and dropped (with all its names) when the kernel forgets it. Inode numbers are never reused
//! during a mount, so a stale number held by the kernel can never address a different file.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::time::SystemTime;

use crate::remote::FileKind;

pub type Ino = u64;
pub const ROOT_INO: Ino = 1;

#[derive(Debug)]
struct Node {
    /// The names the inode is known under, `(parent, name)`; the first is the one its server
    /// path is built from. Empty once removed (or replaced by a rename) while still
    /// referenced: it has no path any more, only open handles keep it useful. Directories have
    /// at most one name.
    names: Vec<(Ino, OsString)>,
    kind: FileKind,
    /// How many lookups the kernel holds (it sends FORGET with the number it drops).
    lookups: u64,
    /// The link count, when known: from a listing (the server's count), then kept up to date
    /// by links and unlinks made through the mount.
    nlink: Option<u32>,
    /// When the mount itself last changed the inode's status (attributes, data, names): the
    /// stand-in for a ctime, which SFTP v3 does not carry. Lives and dies with the inode.
    changed: Option<SystemTime>,
    /// Since when the kernel's page cache of the inode can hold only data read from the
    /// server (see [`PageCacheMark`]). Lives and dies with the inode, as the pages do.
    page_cache: Option<PageCacheMark>,
    /// The access and modification times last set through the mount (see [`SetTime`]).
    /// Live and die with the inode, as `changed` does.
    set_times: SetTimes,
    /// How many times the mount changed the inode's data (see [`InodeTable::times_set`]).
    data_changes: u64,
}

/// A time set through the mount (utimensat, touch, `cp -p`, tar), as asked and as the
/// server was given it: SFTP v3 carries whole seconds from 1970 to 2106 only. A time asked
/// for is shown for as long as the server still has the seconds it was given (nobody changed
/// the time since), so that a file's times read back as they were set, nanoseconds
/// included, as on a local disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetTime {
    /// The time asked for (for "now", this machine's now).
    pub asked: SystemTime,
    /// Its whole seconds, as the server was given them.
    pub sent: u32,
    /// Whether `asked` is shown: not for "now" (`touch`), which stays in whole seconds as
    /// the times the server gives a write do, so that a file touched and a file written
    /// right after, within one second, do not show in the wrong order.
    pub shown: bool,
}

impl SetTime {
    /// The kept time `this`, to show instead of the time the server gives as `server`.
    pub fn instead_of(this: Option<SetTime>, server: Option<u32>) -> Option<SystemTime> {
        this.filter(|t| server == Some(t.sent)).map(|t| t.asked)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetTimes {
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

/// When the kernel last dropped an inode's page cache (an open answered without
/// `keep_cache`), and what the file was then: every page it has cached since was read from
/// the server after that moment (or from a copy fetched then), so the pages may be kept
/// until that moment plus the attribute TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageCacheMark {
    pub until: std::time::Instant,
    /// The change clock then (`MetaCache::now`).
    pub clock: u64,
    /// Size and mtime then, if known.
    pub attrs: Option<(Option<u64>, Option<u32>)>,
}

/// Where an inode currently is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// Relative path below the export root ("" for the root itself).
    Path(PathBuf),
    /// Unlinked while open, or unknown.
    Detached,
}

/// What removing a name did to its inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Detached {
    pub ino: Ino,
    /// Names of the inode the mount still knows.
    pub names_left: usize,
    /// Its link count before the removal, when known.
    pub nlink_before: Option<u32>,
}

#[derive(Debug)]
pub struct InodeTable {
    nodes: HashMap<Ino, Node>,
    by_name: HashMap<(Ino, OsString), Ino>,
    next_ino: Ino,
    /// Inodes with links the mount does not know by name whose attributes or data may be
    /// cached (by the kernel or by the mount) since they were last dropped: what a change
    /// through another name must drop (see [`InodeTable::take_shared_cached`]).
    shared_cached: HashSet<Ino>,
    /// Such inodes with kernel reads on their way, and how many ([`InodeTable::read_started`]):
    /// their pages are about to be cached, with data that may predate a change made while
    /// they are, so a change takes them whether noted or not.
    reading: HashMap<Ino, u32>,
}

impl Default for InodeTable {
    fn default() -> Self {
        Self::new()
    }
}

/// A directory's link count `n` (at least 2) after `delta` subdirectories came or went: never
/// below 2, its own `.` and its name.
pub fn subdir_count(n: u32, delta: i32) -> u32 {
    n.saturating_add_signed(delta).max(2)
}

impl InodeTable {
    pub fn new() -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT_INO,
            Node {
                names: Vec::new(),
                kind: FileKind::Dir,
                // The root is never forgotten.
                lookups: 1,
                nlink: None,
                changed: None,
                page_cache: None,
                set_times: SetTimes::default(),
                data_changes: 0,
            },
        );
        InodeTable {
            nodes,
            by_name: HashMap::new(),
            next_ino: ROOT_INO + 1,
            shared_cached: HashSet::new(),
            reading: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn contains(&self, ino: Ino) -> bool {
        self.nodes.contains_key(&ino)
    }

    pub fn kind(&self, ino: Ino) -> Option<FileKind> {
        self.nodes.get(&ino).map(|n| n.kind)
    }

    /// Every directory and name an inode is currently known under (the first is the one its
    /// path is built from).
    pub fn names_of(&self, ino: Ino) -> Vec<(Ino, OsString)> {
        match self.nodes.get(&ino) {
            Some(node) if ino != ROOT_INO => node.names.clone(),
            _ => Vec::new(),
        }
    }

    /// Whether `ino` lost every name (removed or replaced through the mount, or found
    /// replaced) while the kernel still references it.
    pub fn is_detached(&self, ino: Ino) -> bool {
        ino != ROOT_INO && self.nodes.get(&ino).is_some_and(|n| n.names.is_empty())
    }

    /// The mount changed the status of `ino` (chmod, chown, times, size, data, a name) at
    /// `when`.
    pub fn status_changed(&mut self, ino: Ino, when: SystemTime) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.changed = Some(node.changed.map_or(when, |t| t.max(when)));
        }
    }

    /// The mount changed the data of `ino` at `when`: its status, and its modification time
    /// (on the server: to the server's now), so a time set before no longer holds.
    pub fn data_changed(&mut self, ino: Ino, when: SystemTime) {
        self.status_changed(ino, when);
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.set_times.mtime = None;
            node.data_changes += 1;
        }
    }

    /// How many times the mount changed the data of `ino` (see [`InodeTable::times_set`]).
    pub fn data_changes(&self, ino: Ino) -> u64 {
        self.nodes.get(&ino).map_or(0, |n| n.data_changes)
    }

    /// The mount set the access and/or modification time of `ino` (see [`SetTime`]). The
    /// modification time is kept only if no data change came since `data_changes` was read
    /// (before the change was sent, and before the writes ahead of it were waited for): such
    /// a write may land after the change, and the server's now be the file's mtime then. Not
    /// for a directory, whose mtime the server moves with every name made or removed in it.
    pub fn times_set(&mut self, ino: Ino, data_changes: u64, set: SetTimes) {
        let Some(node) = self.nodes.get_mut(&ino) else {
            return;
        };
        let dir = node.kind == FileKind::Dir;
        let keep = |s: SetTime| (s.shown && !dir).then_some(s);
        if let Some(a) = set.atime {
            node.set_times.atime = keep(a);
        }
        if let Some(m) = set.mtime {
            let unwritten = node.data_changes == data_changes;
            node.set_times.mtime = keep(m).filter(|_| unwritten);
        }
    }

    /// Times set through the mount are no longer known to be the server's (a change that
    /// failed, a change through a name the mount cannot tell is the same file).
    pub fn forget_set_times(&mut self, ino: Ino) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.set_times = SetTimes::default();
        }
    }

    pub fn set_times(&self, ino: Ino) -> SetTimes {
        self.nodes
            .get(&ino)
            .map_or_else(SetTimes::default, |n| n.set_times)
    }

    /// When the mount last changed the status of `ino`, if it did while the kernel held it.
    pub fn last_status_change(&self, ino: Ino) -> Option<SystemTime> {
        self.nodes.get(&ino).and_then(|n| n.changed)
    }

    /// See [`PageCacheMark`].
    pub fn page_cache_mark(&self, ino: Ino) -> Option<PageCacheMark> {
        self.nodes.get(&ino).and_then(|n| n.page_cache)
    }

    pub fn set_page_cache_mark(&mut self, ino: Ino, mark: PageCacheMark) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.page_cache = Some(mark);
        }
    }

    /// Every inode's pages are as old as the TTL (tests run lifetimes out on demand).
    pub fn expire_page_cache_marks(&mut self, now: std::time::Instant) {
        for node in self.nodes.values_mut() {
            if let Some(m) = &mut node.page_cache {
                m.until = m.until.min(now);
            }
        }
    }

    /// The inode for `name` in `parent`, if the kernel currently knows one.
    pub fn child(&self, parent: Ino, name: &OsStr) -> Option<Ino> {
        self.by_name.get(&(parent, name.to_os_string())).copied()
    }

    /// The link count to show: the known one, else 0 for an inode without names (removed
    /// while open), else the number of names the mount knows (at least 1).
    pub fn nlink(&self, ino: Ino) -> Option<u32> {
        let node = self.nodes.get(&ino)?;
        if ino == ROOT_INO {
            return node.nlink;
        }
        if node.names.is_empty() {
            return Some(0);
        }
        Some(
            node.nlink
                .unwrap_or(0)
                .max(node.names.len().min(u32::MAX as usize) as u32),
        )
    }

    /// The link count the table knows of `ino` (from a listing, or kept by links and unlinks
    /// through the mount), without the fallbacks of [`InodeTable::nlink`].
    pub fn known_nlink(&self, ino: Ino) -> Option<u32> {
        self.nodes.get(&ino)?.nlink
    }

    /// The server told us the link count of `ino` (a listing's long name).
    pub fn set_nlink(&mut self, ino: Ino, nlink: u32) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.nlink = Some(nlink);
        }
    }

    /// A subdirectory of directory `ino` came (`+1`) or went (`-1`) through the mount: its
    /// link count, if known, follows (each subdirectory's `..` is a link to it, as on a local
    /// disk). Never below 2, its own `.` and its name. A count of 1 is left alone: that is
    /// what a server filesystem that does not count subdirectories (btrfs) shows for every
    /// directory. Returns the count now known, if any.
    pub fn subdirs_changed(&mut self, ino: Ino, delta: i32) -> Option<u32> {
        let n = self.nodes.get_mut(&ino).and_then(|n| n.nlink.as_mut())?;
        if *n >= 2 {
            *n = subdir_count(*n, delta);
        }
        Some(*n)
    }

    /// Whether `ino` has links the mount does not know by name (made on the server): its
    /// other names are other inodes here, whose caches the mount cannot keep coherent.
    pub fn has_unknown_links(&self, ino: Ino) -> bool {
        self.nodes.get(&ino).is_some_and(|n| {
            n.kind != FileKind::Dir && n.nlink.unwrap_or(1) as usize > n.names.len().max(1)
        })
    }

    /// Whether a change of `ino`'s data or attributes through the mount may show through
    /// other inodes: a regular file with links the mount does not know by name, or whose
    /// link count is unknown (never listed, and not made here).
    pub fn may_share_data(&self, ino: Ino) -> bool {
        self.nodes.get(&ino).is_some_and(|n| {
            n.kind == FileKind::File && n.nlink.is_none_or(|l| l as usize > n.names.len().max(1))
        })
    }

    /// `ino` has links the mount does not know by name, and its attributes or data are
    /// about to be cached: remember it, for the next change that may show through it.
    /// Returns whether it has such links.
    pub fn note_if_shared(&mut self, ino: Ino) -> bool {
        let shared = self.has_unknown_links(ino);
        if shared {
            self.shared_cached.insert(ino);
        }
        shared
    }

    /// A kernel read of `ino` is on its way: if it has links the mount does not know by name,
    /// it is counted until [`InodeTable::read_ended`]. Returns whether it was.
    pub fn read_started(&mut self, ino: Ino) -> bool {
        let shared = self.has_unknown_links(ino);
        if shared {
            *self.reading.entry(ino).or_default() += 1;
        }
        shared
    }

    /// A read counted by [`InodeTable::read_started`] has been answered (or failed).
    pub fn read_ended(&mut self, ino: Ino) {
        if let Some(n) = self.reading.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                self.reading.remove(&ino);
            }
        }
    }

    /// The inodes noted by [`InodeTable::note_if_shared`] since the last call, and those with
    /// reads on their way, other than `changed` (whose own caches follow its change as
    /// usual): a change through `changed` may show through any of them, so what is cached
    /// of them must go.
    pub fn take_shared_cached(&mut self, changed: Ino) -> Vec<Ino> {
        let kept = self.shared_cached.remove(&changed);
        let reading = self.reading.keys().filter(|&&r| r != changed);
        self.shared_cached.extend(reading);
        let taken = self.shared_cached.drain().collect();
        if kept {
            self.shared_cached.insert(changed);
        }
        taken
    }

    /// The path of `ino` relative to the export root.
    pub fn location(&self, ino: Ino) -> Location {
        let mut parts: Vec<&OsStr> = Vec::new();
        let mut cur = ino;
        // Bounded walk: a cycle would be a bug, but must not hang a FUSE request forever.
        for _ in 0..4096 {
            if cur == ROOT_INO {
                let mut path = PathBuf::new();
                for p in parts.iter().rev() {
                    path.push(p);
                }
                return Location::Path(path);
            }
            let Some((parent, name)) = self.nodes.get(&cur).and_then(|n| n.names.first()) else {
                return Location::Detached;
            };
            parts.push(name);
            cur = *parent;
        }
        Location::Detached
    }

    /// Record a lookup of `name` in `parent` that found an object of `kind`: returns its inode
    /// (existing or new) and counts one kernel reference.
    pub fn lookup(&mut self, parent: Ino, name: &OsStr, kind: FileKind) -> Ino {
        let key = (parent, name.to_os_string());
        if let Some(&ino) = self.by_name.get(&key) {
            let node = self
                .nodes
                .get_mut(&ino)
                .expect("by_name points at a live node");
            if node.kind != kind {
                // Replaced on the server by an object of another type: a new identity, so the
                // kernel does not keep treating a directory as the file it once was.
                self.detach_name(parent, name);
            } else {
                node.lookups += 1;
                return ino;
            }
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(
            ino,
            Node {
                names: vec![key.clone()],
                kind,
                lookups: 1,
                nlink: None,
                changed: None,
                page_cache: None,
                set_times: SetTimes::default(),
                data_changes: 0,
            },
        );
        self.by_name.insert(key, ino);
        ino
    }

    /// A number for an object the table does not keep (a special file, see `specials`):
    /// never one the table gives out, as for its own.
    pub fn new_ino(&mut self) -> Ino {
        let ino = self.next_ino;
        self.next_ino += 1;
        ino
    }

    /// A hard link of `ino` was made through the mount as `name` in `parent`: one more name
    /// of the same inode, one more kernel reference (the LINK reply is an entry) and one more
    /// link. Returns false if `ino` is unknown or has no name left.
    pub fn add_link(&mut self, ino: Ino, parent: Ino, name: &OsStr) -> bool {
        let key = (parent, name.to_os_string());
        match self.nodes.get(&ino) {
            Some(node) if ino != ROOT_INO && !node.names.is_empty() => {}
            _ => return false,
        }
        if self.by_name.get(&key) != Some(&ino) {
            // Whatever the kernel still had under that name is gone (the link succeeded).
            self.detach_name(parent, name);
        }
        let node = self.nodes.get_mut(&ino).expect("checked above");
        let before = node
            .nlink
            .unwrap_or(1)
            .max(node.names.len().min(u32::MAX as usize) as u32);
        if !node.names.contains(&key) {
            node.names.push(key.clone());
        }
        node.nlink = Some(before.saturating_add(1));
        node.lookups += 1;
        self.by_name.insert(key, ino);
        true
    }

    /// The kernel dropped `n` references.
    pub fn forget(&mut self, ino: Ino, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(n);
        }
        self.maybe_drop(ino);
    }

    fn maybe_drop(&mut self, ino: Ino) {
        let Some(node) = self.nodes.get(&ino) else {
            return;
        };
        if node.lookups > 0 {
            return;
        }
        for key in &node.names {
            if self.by_name.get(key) == Some(&ino) {
                self.by_name.remove(key);
            }
        }
        self.nodes.remove(&ino);
        self.shared_cached.remove(&ino);
        self.reading.remove(&ino);
    }

    /// `name` in `parent` was removed through the mount (or found missing): the inode, if
    /// any, loses that name (and a link); with no name left it loses its path but lives on
    /// while the kernel references it (open-then-unlink).
    pub fn detach_name(&mut self, parent: Ino, name: &OsStr) -> Option<Detached> {
        let key = (parent, name.to_os_string());
        let ino = self.by_name.remove(&key)?;
        let node = self.nodes.get_mut(&ino)?;
        let nlink_before = node
            .nlink
            .map(|n| n.max(node.names.len().min(u32::MAX as usize) as u32));
        node.names.retain(|k| *k != key);
        if let Some(n) = nlink_before {
            node.nlink = Some(n.saturating_sub(1));
        }
        let names_left = node.names.len();
        self.maybe_drop(ino);
        Some(Detached {
            ino,
            names_left,
            nlink_before,
        })
    }

    /// A rename through the mount: the object keeps its inode, whatever was at the target is
    /// detached (it was replaced). Renaming a name onto another name of the same inode changes
    /// nothing (as rename(2) does for two links of one file). Returns what the target lost.
    pub fn rename(
        &mut self,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
    ) -> Option<Detached> {
        let from = (parent, name.to_os_string());
        let to = (new_parent, new_name.to_os_string());
        if from == to {
            return None;
        }
        if let (Some(a), Some(b)) = (self.by_name.get(&from), self.by_name.get(&to)) {
            if a == b {
                return None;
            }
        }
        let replaced = self.detach_name(new_parent, new_name);
        if let Some(ino) = self.by_name.remove(&from) {
            if let Some(node) = self.nodes.get_mut(&ino) {
                for k in node.names.iter_mut() {
                    if *k == from {
                        *k = to.clone();
                    }
                }
            }
            self.by_name.insert(to, ino);
        }
        replaced
    }

    /// Whether `ancestor` is `ino` or one of its parents (used to refuse renaming a directory
    /// into itself, which the kernel normally catches first).
    pub fn is_ancestor(&self, ancestor: Ino, ino: Ino) -> bool {
        let mut cur = ino;
        for _ in 0..4096 {
            if cur == ancestor {
                return true;
            }
            if cur == ROOT_INO {
                return false;
            }
            match self.nodes.get(&cur).and_then(|n| n.names.first()) {
                Some((parent, _)) => cur = *parent,
                None => return false,
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    #[test]
    fn paths_follow_renames() {
        let mut t = InodeTable::new();
        let a = t.lookup(ROOT_INO, os("a"), FileKind::Dir);
        let f = t.lookup(a, os("f"), FileKind::File);
        assert_eq!(t.location(f), Location::Path("a/f".into()));
        let b = t.lookup(ROOT_INO, os("b"), FileKind::Dir);
        t.rename(a, os("f"), b, os("g"));
        assert_eq!(t.location(f), Location::Path("b/g".into()));
        t.rename(ROOT_INO, os("b"), ROOT_INO, os("c"));
        assert_eq!(t.location(f), Location::Path("c/g".into()));
        assert_eq!(t.location(ROOT_INO), Location::Path("".into()));
    }

    /// A directory's known link count follows its subdirectories, never below 2; an unknown
    /// count, or the 1 a server that does not count them shows, is left alone.
    #[test]
    fn directory_link_counts_follow_subdirectories() {
        let mut t = InodeTable::new();
        let d = t.lookup(ROOT_INO, os("d"), FileKind::Dir);
        t.subdirs_changed(d, 1);
        assert_eq!(t.nlink(d), Some(1), "unknown: one name");
        t.set_nlink(d, 3);
        t.subdirs_changed(d, 1);
        assert_eq!(t.nlink(d), Some(4));
        for _ in 0..4 {
            t.subdirs_changed(d, -1);
        }
        assert_eq!(t.nlink(d), Some(2), "never below . and its name");
        t.set_nlink(d, 1);
        t.subdirs_changed(d, 1);
        assert_eq!(t.nlink(d), Some(1), "a server that does not count");
    }

    #[test]
    fn unlinked_inode_lives_until_forgotten() {
        let mut t = InodeTable::new();
        let f = t.lookup(ROOT_INO, os("f"), FileKind::File);
        assert_eq!(t.detach_name(ROOT_INO, os("f")).map(|d| d.ino), Some(f));
        assert!(t.contains(f));
        assert_eq!(t.location(f), Location::Detached);
        assert_eq!(t.child(ROOT_INO, os("f")), None);
        // A new file of the same name is a new inode.
        let g = t.lookup(ROOT_INO, os("f"), FileKind::File);
        assert_ne!(f, g);
        t.forget(f, 1);
        assert!(!t.contains(f));
        assert_eq!(t.location(g), Location::Path("f".into()));
    }

    #[test]
    fn rename_over_detaches_target() {
        let mut t = InodeTable::new();
        let a = t.lookup(ROOT_INO, os("a"), FileKind::File);
        let b = t.lookup(ROOT_INO, os("b"), FileKind::File);
        t.rename(ROOT_INO, os("a"), ROOT_INO, os("b"));
        assert_eq!(t.child(ROOT_INO, os("b")), Some(a));
        assert_eq!(t.location(b), Location::Detached);
        assert_eq!(t.location(a), Location::Path("b".into()));
    }

    #[test]
    fn lookups_are_counted_and_type_change_is_new_identity() {
        let mut t = InodeTable::new();
        let a = t.lookup(ROOT_INO, os("a"), FileKind::File);
        assert_eq!(t.lookup(ROOT_INO, os("a"), FileKind::File), a);
        t.forget(a, 1);
        assert!(t.contains(a));
        let d = t.lookup(ROOT_INO, os("a"), FileKind::Dir);
        assert_ne!(a, d);
        t.forget(a, 1);
        assert!(!t.contains(a));
        assert!(t.is_ancestor(ROOT_INO, d));
    }

    #[test]
    fn hard_links_are_aliases_of_one_inode() {
        let mut t = InodeTable::new();
        let d = t.lookup(ROOT_INO, os("d"), FileKind::Dir);
        let f = t.lookup(ROOT_INO, os("f"), FileKind::File);
        assert_eq!(t.nlink(f), Some(1));
        assert!(t.add_link(f, d, os("h")));
        assert_eq!(t.nlink(f), Some(2));
        assert!(!t.has_unknown_links(f));
        // Either name finds the same inode, and counts a reference.
        assert_eq!(t.child(d, os("h")), Some(f));
        assert_eq!(t.lookup(d, os("h"), FileKind::File), f);
        assert_eq!(t.lookup(ROOT_INO, os("f"), FileKind::File), f);
        assert_eq!(t.location(f), Location::Path("f".into()));
        // The first name goes: the path switches to the other.
        let gone = t.detach_name(ROOT_INO, os("f")).unwrap();
        assert_eq!((gone.ino, gone.names_left), (f, 1));
        assert_eq!(t.location(f), Location::Path("d/h".into()));
        assert_eq!(t.nlink(f), Some(1));
        assert_eq!(t.child(ROOT_INO, os("f")), None);
        // A rename of the remaining name, then its removal: detached, link count 0.
        t.rename(d, os("h"), ROOT_INO, os("g"));
        assert_eq!(t.location(f), Location::Path("g".into()));
        let gone = t.detach_name(ROOT_INO, os("g")).unwrap();
        assert_eq!(gone.names_left, 0);
        assert_eq!(t.location(f), Location::Detached);
        assert_eq!(t.nlink(f), Some(0));
        // Three references (lookup, link, two lookups) less: gone.
        t.forget(f, 4);
        assert!(!t.contains(f));
    }

    #[test]
    fn forget_drops_every_name_and_rename_onto_an_alias_is_a_no_op() {
        let mut t = InodeTable::new();
        let a = t.lookup(ROOT_INO, os("a"), FileKind::File);
        assert!(t.add_link(a, ROOT_INO, os("b")));
        assert_eq!(t.rename(ROOT_INO, os("a"), ROOT_INO, os("b")), None);
        assert_eq!(t.child(ROOT_INO, os("a")), Some(a));
        assert_eq!(t.child(ROOT_INO, os("b")), Some(a));
        assert_eq!(t.nlink(a), Some(2));
        // Renaming one alias over another file: the file is replaced, the inode keeps both
        // of its names (one moved).
        let c = t.lookup(ROOT_INO, os("c"), FileKind::File);
        let gone = t.rename(ROOT_INO, os("b"), ROOT_INO, os("c")).unwrap();
        assert_eq!((gone.ino, gone.names_left), (c, 0));
        assert_eq!(t.child(ROOT_INO, os("c")), Some(a));
        assert_eq!(t.child(ROOT_INO, os("b")), None);
        assert_eq!(t.names_of(a).len(), 2);
        t.forget(a, 2);
        assert!(!t.contains(a));
        assert_eq!(t.child(ROOT_INO, os("a")), None);
        assert_eq!(t.child(ROOT_INO, os("c")), None);
        // A later lookup is a new inode.
        assert_ne!(t.lookup(ROOT_INO, os("a"), FileKind::File), a);
    }

    #[test]
    fn server_link_counts_beyond_the_known_names_are_unknown_links() {
        let mut t = InodeTable::new();
        let x = t.lookup(ROOT_INO, os("x"), FileKind::File);
        assert!(!t.has_unknown_links(x));
        t.set_nlink(x, 2);
        assert!(t.has_unknown_links(x));
        assert_eq!(t.nlink(x), Some(2));
        // A link through the mount: 3 links, 2 known names.
        assert!(t.add_link(x, ROOT_INO, os("y")));
        assert_eq!(t.nlink(x), Some(3));
        assert!(t.has_unknown_links(x));
        let d = t.lookup(ROOT_INO, os("d"), FileKind::Dir);
        t.set_nlink(d, 5);
        assert!(
            !t.has_unknown_links(d),
            "directories have subdirectory links"
        );
    }

    #[test]
    fn a_change_that_may_show_through_other_names_takes_the_shared_inodes_noted() {
        let mut t = InodeTable::new();
        let x = t.lookup(ROOT_INO, os("x"), FileKind::File);
        let y = t.lookup(ROOT_INO, os("y"), FileKind::File);
        let one = t.lookup(ROOT_INO, os("one"), FileKind::File);
        let d = t.lookup(ROOT_INO, os("d"), FileKind::Dir);
        assert!(t.may_share_data(x), "link count unknown");
        t.set_nlink(one, 1);
        assert!(!t.may_share_data(one));
        assert!(!t.may_share_data(d));
        t.set_nlink(x, 2);
        t.set_nlink(y, 2);
        assert!(t.may_share_data(x));
        assert!(!t.note_if_shared(one));
        assert!(t.note_if_shared(x) && t.note_if_shared(y));
        // The changed one keeps its note; the others are taken once.
        assert_eq!(t.take_shared_cached(x), vec![y]);
        assert_eq!(t.take_shared_cached(x), Vec::<Ino>::new());
        assert_eq!(t.take_shared_cached(one), vec![x]);
        // Forgotten: nothing left to drop.
        t.note_if_shared(y);
        t.forget(y, 1);
        assert_eq!(t.take_shared_cached(one), Vec::<Ino>::new());
        // A read on its way is taken by every change until it ends, noted or not.
        assert!(t.read_started(x) && t.read_started(x));
        assert!(!t.read_started(one));
        assert_eq!(t.take_shared_cached(one), vec![x]);
        assert_eq!(t.take_shared_cached(one), vec![x]);
        assert_eq!(t.take_shared_cached(x), Vec::<Ino>::new(), "x itself");
        t.note_if_shared(x);
        assert_eq!(t.take_shared_cached(one), vec![x], "taken once");
        t.read_ended(x);
        assert_eq!(
            t.take_shared_cached(one),
            vec![x],
            "one read still on its way"
        );
        t.read_ended(x);
        t.read_ended(one);
        assert_eq!(t.take_shared_cached(one), Vec::<Ino>::new());
    }
}
