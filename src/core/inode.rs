//! The inode table: stable inode numbers for a path-based remote.
//!
//! SFTP has no inode numbers, only paths. The kernel, however, wants a number per object that
//! stays the same across renames and while a file is open after being unlinked. So an inode here
//! is an identity `(parent inode, name)` that the table keeps up to date as the mount itself
//! renames and removes things, and the full remote path is derived by walking the parents.
//!
//! Lifetime follows the kernel's lookup count: an inode is created on the first lookup of a name
//! and dropped when the kernel forgets it. Inode numbers are never reused during a mount, so a
//! stale number held by the kernel can never address a different file.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::time::SystemTime;

use crate::remote::FileKind;

pub type Ino = u64;
pub const ROOT_INO: Ino = 1;

#[derive(Debug)]
struct Node {
    parent: Ino,
    name: OsString,
    kind: FileKind,
    /// How many lookups the kernel holds (it sends FORGET with the number it drops).
    lookups: u64,
    /// Removed (or replaced by a rename) while still referenced: it has no path any more, only
    /// open handles keep it useful.
    detached: bool,
    /// When the mount itself last changed the inode's status (attributes, data, names): the
    /// stand-in for a ctime, which SFTP v3 does not carry. Lives and dies with the inode.
    changed: Option<SystemTime>,
}

/// Where an inode currently is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// Relative path below the export root ("" for the root itself).
    Path(PathBuf),
    /// Unlinked while open, or unknown.
    Detached,
}

#[derive(Debug)]
pub struct InodeTable {
    nodes: HashMap<Ino, Node>,
    by_name: HashMap<(Ino, OsString), Ino>,
    next_ino: Ino,
}

impl Default for InodeTable {
    fn default() -> Self {
        Self::new()
    }
}

impl InodeTable {
    pub fn new() -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT_INO,
            Node {
                parent: ROOT_INO,
                name: OsString::new(),
                kind: FileKind::Dir,
                // The root is never forgotten.
                lookups: 1,
                detached: false,
                changed: None,
            },
        );
        InodeTable {
            nodes,
            by_name: HashMap::new(),
            next_ino: ROOT_INO + 1,
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

    /// Whether `ino` lost its name (removed or replaced through the mount, or found replaced)
    /// while the kernel still references it.
    pub fn is_detached(&self, ino: Ino) -> bool {
        self.nodes.get(&ino).is_some_and(|n| n.detached)
    }

    /// The mount changed the status of `ino` (chmod, chown, times, size, data, a name) at
    /// `when`.
    pub fn status_changed(&mut self, ino: Ino, when: SystemTime) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.changed = Some(node.changed.map_or(when, |t| t.max(when)));
        }
    }

    /// When the mount last changed the status of `ino`, if it did while the kernel held it.
    pub fn last_status_change(&self, ino: Ino) -> Option<SystemTime> {
        self.nodes.get(&ino).and_then(|n| n.changed)
    }

    /// The directory and name an inode is currently known under.
    pub fn name_of(&self, ino: Ino) -> Option<(Ino, OsString)> {
        let node = self.nodes.get(&ino)?;
        (!node.detached && ino != ROOT_INO).then(|| (node.parent, node.name.clone()))
    }

    /// The inode for `name` in `parent`, if the kernel currently knows one.
    pub fn child(&self, parent: Ino, name: &OsStr) -> Option<Ino> {
        self.by_name.get(&(parent, name.to_os_string())).copied()
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
            let Some(node) = self.nodes.get(&cur) else {
                return Location::Detached;
            };
            if node.detached {
                return Location::Detached;
            }
            parts.push(&node.name);
            cur = node.parent;
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
                node.detached = true;
                self.by_name.remove(&key);
                self.maybe_drop(ino);
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
                parent,
                name: key.1.clone(),
                kind,
                lookups: 1,
                detached: false,
                changed: None,
            },
        );
        self.by_name.insert(key, ino);
        ino
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
        if !node.detached {
            let key = (node.parent, node.name.clone());
            if self.by_name.get(&key) == Some(&ino) {
                self.by_name.remove(&key);
            }
        }
        self.nodes.remove(&ino);
    }

    /// `name` in `parent` was removed through the mount (or found missing): the inode, if
    /// any, loses its path but lives on while the kernel references it (open-then-unlink).
    pub fn detach_name(&mut self, parent: Ino, name: &OsStr) -> Option<Ino> {
        let ino = self.by_name.remove(&(parent, name.to_os_string()))?;
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.detached = true;
        }
        self.maybe_drop(ino);
        Some(ino)
    }

    /// A rename through the mount: the object keeps its inode, whatever was at the target is
    /// detached (it was replaced).
    pub fn rename(&mut self, parent: Ino, name: &OsStr, new_parent: Ino, new_name: &OsStr) {
        self.detach_name(new_parent, new_name);
        if let Some(ino) = self.by_name.remove(&(parent, name.to_os_string())) {
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.parent = new_parent;
                node.name = new_name.to_os_string();
            }
            self.by_name
                .insert((new_parent, new_name.to_os_string()), ino);
        }
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
            match self.nodes.get(&cur) {
                Some(n) if !n.detached => cur = n.parent,
                _ => return false,
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

    #[test]
    fn unlinked_inode_lives_until_forgotten() {
        let mut t = InodeTable::new();
        let f = t.lookup(ROOT_INO, os("f"), FileKind::File);
        assert_eq!(t.detach_name(ROOT_INO, os("f")), Some(f));
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
}
