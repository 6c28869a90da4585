//! FIFOs, unix sockets and device nodes made through the mount, kept by the mount process
//! itself.
//!
//! SFTP v3 cannot make special files (OpenSSH's sftp-server has no mknod), so over sshfs
//! `mkfifo` and `bind(2)` of a unix socket fail with `EPERM`, and a tool that puts a named
//! pipe or a socket in its working tree (a test suite, a language server, a shell script
//! with `mkfifo`, a dev server's control socket) fails. Neither object holds data of its
//! own, though: the kernel moves the bytes of a FIFO between local processes, and a unix
//! socket connects local processes only. A copy on the server could connect nothing here.
//! So the mount keeps them itself: a name in a directory, a type, permissions, an owner and
//! times, in memory, never sent to the server. Every process on this machine uses them as
//! on a local disk (the kernel does the piping and the connecting); the server never sees
//! them, and they are gone after the unmount.
//!
//! Device nodes (which only root may make) are kept the same way, with their numbers, so
//! that `stat`, `ls`, `rename` and `rm` of them work as on a local disk. The mount is always
//! `nodev`, so none can be opened as a device: keeping one gives nobody access to anything.
//! Unlike a FIFO, a device node means something the delegator might have wanted, and it
//! does not get it: the first one made is logged as a warning. An overlay's whiteout (a
//! character device 0/0, which any user may make) stays `EPERM`: kept only here, the name it
//! hides would come back after the unmount; refused, fuse-overlayfs makes whiteout files.
//!
//! They are kept by server path (absolute, as [`super::Fs`] builds them), not by parent
//! inode: the kernel may forget a directory's inode while a FIFO in it lives on, and the
//! directory then comes back under a new number. A directory renamed through the mount
//! takes them along ([`Specials::move_dir`]).

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use super::errno::Op;
use super::inode::Ino;
use super::{
    not_a_directory, to_seconds, Attr, Caller, DirItem, Entry, Fs, SetattrRequest, TimeSpec,
};
use crate::error::{FsError, FsResult};
use crate::remote::{Attrs, FileKind, Remote, RemoteError, SetAttrs, Status};

/// How many special files one mount keeps at most (each costs a few hundred bytes): past
/// this, mknod answers `ENOSPC`, so that a runaway tool cannot grow the mount without bound.
pub const MAX_SPECIALS: usize = 10_000;

/// What mknod(2) asks for: the type, and a device node's number (0 for the others).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    pub kind: FileKind,
    pub rdev: u32,
}

impl Node {
    /// The special file of mknod's `mode` and `rdev`, if its type is one the mount keeps.
    pub fn of_mode(mode: u32, rdev: u32) -> Option<Node> {
        let kind = match mode & libc::S_IFMT {
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            _ => return None,
        };
        let mut node = Node { kind, rdev };
        if !node.is_device() {
            node.rdev = 0;
        }
        Some(node)
    }

    pub fn is_device(&self) -> bool {
        matches!(self.kind, FileKind::CharDevice | FileKind::BlockDevice)
    }

    /// A character device 0/0 is an overlay filesystem's whiteout (a deleted name in an
    /// upper layer), which any user may make (Linux 5.8 and later).
    pub fn is_whiteout(&self) -> bool {
        self.kind == FileKind::CharDevice && self.rdev == 0
    }
}

#[derive(Debug)]
struct Special {
    kind: FileKind,
    perm: u16,
    uid: u32,
    gid: u32,
    /// A device node's number; 0 for FIFOs and sockets.
    rdev: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
    /// Its names (hard links made through the mount are more names).
    paths: Vec<PathBuf>,
    /// Lookups the kernel holds; the node lives while it has a name or a lookup.
    lookups: u64,
}

/// The mount's special files: see the module documentation.
#[derive(Debug, Default)]
pub struct Specials {
    nodes: HashMap<Ino, Special>,
    by_path: HashMap<PathBuf, Ino>,
    /// How many device nodes were made in this mount (the first is logged as a warning).
    devices_made: u64,
}

impl Specials {
    /// No special file exists (the common case: every hook returns at once).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.nodes.len() >= MAX_SPECIALS
    }

    pub fn contains(&self, ino: Ino) -> bool {
        self.nodes.contains_key(&ino)
    }

    /// The special file named `path`, if there is one.
    pub fn at(&self, path: &Path) -> Option<Ino> {
        self.by_path.get(path).copied()
    }

    /// Whether some special file has a name below directory `dir`.
    pub fn any_under(&self, dir: &Path) -> bool {
        self.by_path.keys().any(|p| p != dir && p.starts_with(dir))
    }

    /// The names directly in directory `dir`, with their inodes.
    pub fn in_dir(&self, dir: &Path) -> Vec<(OsString, Ino)> {
        let mut names: Vec<(OsString, Ino)> = self
            .by_path
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .filter_map(|(p, ino)| Some((p.file_name()?.to_os_string(), *ino)))
            .collect();
        // A stable order, so that a directory read in several batches lists each once.
        names.sort();
        names
    }

    /// A new special file `ino` named `path`, with one lookup (the kernel's, from mknod).
    pub fn make(&mut self, ino: Ino, path: PathBuf, node: Node, perm: u16, owner: (u32, u32)) {
        let now = SystemTime::now();
        if node.is_device() {
            self.devices_made += 1;
        }
        self.by_path.insert(path.clone(), ino);
        self.nodes.insert(
            ino,
            Special {
                kind: node.kind,
                rdev: node.rdev,
                perm,
                uid: owner.0,
                gid: owner.1,
                atime: now,
                mtime: now,
                ctime: now,
                paths: vec![path],
                lookups: 1,
            },
        );
    }

    pub fn attr(&self, ino: Ino) -> Option<Attr> {
        let s = self.nodes.get(&ino)?;
        Some(Attr {
            ino,
            size: 0,
            blocks: 0,
            atime: s.atime,
            mtime: s.mtime,
            ctime: s.ctime,
            kind: s.kind,
            perm: s.perm,
            nlink: s.paths.len().min(u32::MAX as usize) as u32,
            uid: s.uid,
            gid: s.gid,
            rdev: s.rdev,
        })
    }

    /// The kernel took a lookup of `ino` (a lookup, readdirplus or link answered with it).
    pub fn looked_up(&mut self, ino: Ino) -> Option<Attr> {
        self.nodes.get_mut(&ino)?.lookups += 1;
        self.attr(ino)
    }

    /// The kernel dropped `n` lookups of `ino`. Returns whether `ino` is a special file.
    pub fn forget(&mut self, ino: Ino, n: u64) -> bool {
        let Some(s) = self.nodes.get_mut(&ino) else {
            return false;
        };
        s.lookups = s.lookups.saturating_sub(n);
        self.maybe_drop(ino);
        true
    }

    fn maybe_drop(&mut self, ino: Ino) {
        if self
            .nodes
            .get(&ino)
            .is_some_and(|s| s.lookups == 0 && s.paths.is_empty())
        {
            self.nodes.remove(&ino);
        }
    }

    /// Remove the name `path`. Returns the inode it named.
    pub fn unlink(&mut self, path: &Path) -> Option<Ino> {
        let ino = self.by_path.remove(path)?;
        if let Some(s) = self.nodes.get_mut(&ino) {
            s.paths.retain(|p| p != path);
            s.ctime = SystemTime::now();
        }
        self.maybe_drop(ino);
        Some(ino)
    }

    /// Give `ino` one more name, `path` (free: the caller checked), and one more lookup
    /// (the kernel's, from link).
    pub fn link(&mut self, ino: Ino, path: PathBuf) -> Option<Attr> {
        let s = self.nodes.get_mut(&ino)?;
        s.paths.push(path.clone());
        s.ctime = SystemTime::now();
        self.by_path.insert(path, ino);
        self.looked_up(ino)
    }

    /// rename(2) of the special file named `from` to `to`, replacing the special file named
    /// `to` if there is one (the caller dealt with anything else there).
    pub fn rename(&mut self, from: &Path, to: &Path) {
        let Some(ino) = self.by_path.get(from).copied() else {
            return;
        };
        if self.by_path.get(to) == Some(&ino) {
            // Two names of one file: rename(2) does nothing.
            return;
        }
        self.unlink(to);
        self.move_name(from, to.to_path_buf());
        if let Some(s) = self.nodes.get_mut(&ino) {
            s.ctime = SystemTime::now();
        }
    }

    /// The name `old` becomes `new` (free), for the node it names.
    fn move_name(&mut self, old: &Path, new: PathBuf) {
        let Some(ino) = self.by_path.remove(old) else {
            return;
        };
        if let Some(s) = self.nodes.get_mut(&ino) {
            for p in s.paths.iter_mut().filter(|p| p.as_path() == old) {
                *p = new.clone();
            }
        }
        self.by_path.insert(new, ino);
    }

    /// Directory `from` was renamed to `to`: the special files below it go along.
    pub fn move_dir(&mut self, from: &Path, to: &Path) {
        if self.is_empty() {
            return;
        }
        let moved: Vec<(PathBuf, PathBuf)> = self
            .by_path
            .keys()
            .filter_map(|p| Some((p.clone(), to.join(p.strip_prefix(from).ok()?))))
            .filter(|(old, _)| old != from)
            .collect();
        for (old, new) in moved {
            self.move_name(&old, new);
        }
    }

    /// chmod, chown, utimes of `ino` (truncate is refused before: these have no data).
    pub fn set(&mut self, ino: Ino, req: &SetattrRequest) -> Option<Attr> {
        let s = self.nodes.get_mut(&ino)?;
        let now = SystemTime::now();
        if let Some(mode) = req.mode {
            s.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = req.uid {
            s.uid = uid;
        }
        if let Some(gid) = req.gid {
            s.gid = gid;
        }
        if let Some(t) = req.atime {
            s.atime = t.or(now);
        }
        if let Some(t) = req.mtime {
            s.mtime = t.or(now);
        }
        s.ctime = now;
        self.attr(ino)
    }
}

/// The file type bits of a special file's mode.
fn type_bits(kind: FileKind) -> u32 {
    match kind {
        FileKind::Socket => libc::S_IFSOCK,
        FileKind::CharDevice => libc::S_IFCHR,
        FileKind::BlockDevice => libc::S_IFBLK,
        _ => libc::S_IFIFO,
    }
}

/// The hooks of the filesystem operations. Each returns at once (one uncontended lock) while
/// the mount has no special file. Lock order: `inodes` before `specials` (a directory rename
/// moves both at once); nothing else holds either while taking the other.
impl<R: Remote> Fs<R> {
    fn has_specials(&self) -> bool {
        !self.specials.lock().unwrap().is_empty()
    }

    pub(super) fn special_attr(&self, ino: Ino) -> Option<Attr> {
        self.specials.lock().unwrap().attr(ino)
    }

    /// The special file named `path`, taking one kernel lookup of it if `lookup`.
    pub(super) fn special_at(&self, path: &Path, lookup: bool) -> Option<Attr> {
        let mut specials = self.specials.lock().unwrap();
        let ino = specials.at(path)?;
        match lookup {
            true => specials.looked_up(ino),
            false => specials.attr(ino),
        }
    }

    /// The special file `name` in `parent` (see [`Fs::special_at`]).
    pub(super) fn special_child(&self, parent: Ino, name: &OsStr, lookup: bool) -> Option<Attr> {
        if !self.has_specials() {
            return None;
        }
        self.special_at(&self.child_path(parent, name).ok()?, lookup)
    }

    /// The kernel dropped lookups of `ino`: returns whether it is a special file.
    pub(super) fn forget_special(&self, ino: Ino, n: u64) -> bool {
        self.specials.lock().unwrap().forget(ino, n)
    }

    /// mknod(2) of a special file `name` in `parent` with permissions `perm`. The name
    /// must be free on the server as well (a name made there after this hides behind the
    /// special file while it lives), and `parent` a directory there.
    pub(super) async fn make_special(
        &self,
        parent: Ino,
        name: &OsStr,
        node: Node,
        perm: u16,
        caller: Caller,
    ) -> FsResult<Entry> {
        let path = self.child_path(parent, name)?;
        let dir = self.path_of(parent)?;
        let dir_attrs = self.name_free_on_server(&path, &dir, Op::Create).await?;
        // In a set-group-ID directory, new names take the directory's group (as on Linux).
        let dir_attr = self.make_attr(parent, &dir_attrs, None);
        let gid = match u32::from(dir_attr.perm) & libc::S_ISGID {
            0 => caller.gid,
            _ => dir_attr.gid,
        };
        let ino = self.inodes.lock().unwrap().new_ino();
        let (attr, devices_made) = {
            let mut specials = self.specials.lock().unwrap();
            if specials.at(&path).is_some() {
                return Err(exists(&path));
            }
            if specials.is_full() {
                return Err(FsError::new(
                    libc::ENOSPC,
                    format!(
                        "{}: the mount already keeps {MAX_SPECIALS} special files (FIFOs, \
                         sockets, device nodes), its most; remove some",
                        path.display()
                    ),
                ));
            }
            specials.make(ino, path.clone(), node, perm, (caller.uid, gid));
            (specials.attr(ino), specials.devices_made)
        };
        if node.is_device() {
            // Unlike a FIFO's, a device node's meaning (its number) is something the
            // delegator might have wanted (a root filesystem unpacked into the workspace):
            // say so, loudly once, quietly after.
            let what = "device node kept by this mount only (the server cannot make one); it \
                        cannot be opened here (nodev) and is gone after the unmount";
            if devices_made == 1 {
                tracing::warn!("{}: {what}", path.display());
            } else {
                tracing::debug!("{}: {what}", path.display());
            }
        }
        self.names_changed_in(parent, Some(dir_attrs)).await;
        let attr = attr.expect("just made");
        Ok(self.entry(attr))
    }

    /// A special file came into or left directory `dir`: its mtime moves to now on the
    /// server, as a local disk's would (the server, which does not see the name, would not
    /// move it), and its ctime here. `known`: the directory's attributes, when just learnt
    /// (SFTP sets atime and mtime at once). Best effort, and whole seconds: the change itself
    /// is made; a server that refuses (it lets only a directory's owner set its times) leaves
    /// the old mtime.
    async fn names_changed_in(&self, dir: Ino, known: Option<Attrs>) {
        self.dir_names_changed(dir);
        let Ok(path) = self.path_of(dir) else { return };
        let known = match known {
            Some(a) => Some(a),
            None => self.remote.stat(&path).await.ok(),
        };
        let Some(attrs) = known else { return };
        let Some(atime) = attrs.atime else { return };
        let now = to_seconds(TimeSpec::Now);
        // Never backwards (this machine's clock may be behind the server's).
        let mtime = attrs.mtime.map_or(now, |m| m.max(now));
        let times = SetAttrs {
            atime_mtime: Some((atime, mtime)),
            ..SetAttrs::default()
        };
        match self.remote.setstat(&path, times).await {
            Ok(()) => self.attrs_changed(dir, None),
            Err(e) => tracing::debug!("{}: mtime not moved: {e}", path.display()),
        }
    }

    /// That `path` names nothing on the server (nor a special file here), and that its
    /// directory `dir` is one: the directory's attributes.
    async fn name_free_on_server(&self, path: &Path, dir: &Path, op: Op) -> FsResult<Attrs> {
        if self.special_at(path, false).is_some() {
            return Err(exists(path));
        }
        let (here, there) = futures_util::join!(self.remote.lstat(path), self.remote.stat(dir));
        match here {
            Ok(_) => return Err(exists(path)),
            Err(RemoteError::Status(Status::NoSuchFile, _)) => {}
            Err(e) => return Err(self.explain(op, e, path, None).await),
        }
        match there {
            Ok(a) if a.file_type() == FileKind::Dir => Ok(a),
            Ok(_) => Err(not_a_directory(dir)),
            Err(e) => Err(self.explain(Op::Lookup, e, dir, None).await),
        }
    }

    /// unlink(2) of `name` in `parent` if it is a special file: returns whether it was.
    pub(super) async fn unlink_special(&self, parent: Ino, name: &OsStr) -> FsResult<bool> {
        if !self.has_specials() {
            return Ok(false);
        }
        let path = self.child_path(parent, name)?;
        let gone = self.specials.lock().unwrap().unlink(&path).is_some();
        if gone {
            self.names_changed_in(parent, None).await;
        }
        Ok(gone)
    }

    /// Before rmdir(2) of `path`: a special file is not a directory, and a directory with
    /// special files in it is not empty (the server, which does not see them, would remove it).
    pub(super) fn rmdir_special_check(&self, path: &Path) -> FsResult<()> {
        let specials = self.specials.lock().unwrap();
        if specials.at(path).is_some() {
            return Err(not_a_directory(path));
        }
        if specials.any_under(path) {
            return Err(not_empty(path));
        }
        Ok(())
    }

    /// rename(2) where a special file is involved: `Some` with the outcome, or `None` when
    /// none is and the server does the rename (a directory replaced must not hold one).
    pub(super) async fn rename_special(
        self: &Arc<Self>,
        (parent, name): (Ino, &OsStr),
        (new_parent, new_name): (Ino, &OsStr),
        flags: u32,
    ) -> Option<FsResult<()>> {
        if !self.has_specials() {
            return None;
        }
        let paths = self
            .child_path(parent, name)
            .and_then(|from| Ok((from, self.child_path(new_parent, new_name)?)));
        let (from, to) = match paths {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        let (source, target, target_holds) = {
            let specials = self.specials.lock().unwrap();
            (
                specials.at(&from),
                specials.at(&to),
                specials.any_under(&to),
            )
        };
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        let outcome = match (source, target) {
            (None, None) if !target_holds => return None,
            (None, None) => {
                // Over a directory holding special files: a directory would replace it
                // (the server sees it empty), which rename(2) refuses; anything else the
                // server refuses as it should.
                let known = {
                    let inodes = self.inodes.lock().unwrap();
                    inodes.child(parent, name).and_then(|i| inodes.kind(i))
                };
                let kind = match known {
                    Some(k) => Some(k),
                    None => self.probe_kind(&from).await,
                };
                return (kind == Some(FileKind::Dir)).then(|| Err(not_empty(&to)));
            }
            (Some(s), Some(t)) if s == t => match noreplace {
                // Two names of one file: rename(2) does nothing.
                true => Err(exists(&to)),
                false => Ok(()),
            },
            (Some(_), Some(_)) if noreplace => Err(exists(&to)),
            (Some(_), Some(_)) => Ok(()),
            (Some(_), None) => {
                self.clear_server_target(new_parent, new_name, &to, noreplace)
                    .await
            }
            (None, Some(_)) if noreplace => Err(exists(&to)),
            (None, Some(_)) => {
                // A file of the server over a special file: the server renames it (to a
                // name it does not have), then the special file loses its name.
                match self.remote.lstat(&from).await {
                    Ok(a) if a.file_type() == FileKind::Dir => Err(not_a_directory(&to)),
                    Ok(_) => {
                        self.rename_on_server(parent, name, new_parent, new_name, flags)
                            .await
                    }
                    Err(e) => Err(self.explain(Op::Rename, e, &to, Some(&from)).await),
                }
            }
        };
        if outcome.is_ok() {
            {
                let mut specials = self.specials.lock().unwrap();
                match source {
                    Some(_) => specials.rename(&from, &to),
                    None => drop(specials.unlink(&to)),
                }
            }
            // (A file of the server moved: the server moved the directories' mtimes.)
            if source.is_some() {
                self.names_changed_in(parent, None).await;
                if new_parent != parent {
                    self.names_changed_in(new_parent, None).await;
                }
            }
        }
        Some(outcome)
    }

    /// A special file is renamed to `to` (`new_name` in `new_parent`): what the server has
    /// under that name is replaced as rename(2) would (a directory cannot be).
    async fn clear_server_target(
        self: &Arc<Self>,
        new_parent: Ino,
        new_name: &OsStr,
        to: &Path,
        noreplace: bool,
    ) -> FsResult<()> {
        // (An unlink answered early may still be removing the name.)
        self.removes_behind.all_settled().await;
        match self.remote.lstat(to).await {
            Ok(a) if a.file_type() == FileKind::Dir => Err(FsError::new(
                libc::EISDIR,
                format!("{}: is a directory", to.display()),
            )),
            Ok(_) if noreplace => Err(exists(to)),
            Ok(_) => self.unlink(new_parent, new_name).await,
            Err(RemoteError::Status(Status::NoSuchFile, _)) => Ok(()),
            Err(e) => Err(self.explain(Op::Rename, e, to, None).await),
        }
    }

    /// link(2) of `ino` as `new_name` in `new_parent`, if a special file is involved: `None`
    /// when none is.
    pub(super) async fn link_special(
        &self,
        ino: Ino,
        new_parent: Ino,
        new_name: &OsStr,
    ) -> Option<FsResult<Entry>> {
        if !self.has_specials() {
            return None;
        }
        let new = match self.child_path(new_parent, new_name) {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        let (is_special, taken) = {
            let specials = self.specials.lock().unwrap();
            (specials.contains(ino), specials.at(&new).is_some())
        };
        if taken {
            return Some(Err(exists(&new)));
        }
        if !is_special {
            return None;
        }
        let dir = match self.path_of(new_parent) {
            Ok(d) => d,
            Err(e) => return Some(Err(e)),
        };
        let dir_attrs = match self.name_free_on_server(&new, &dir, Op::Link).await {
            Ok(a) => a,
            Err(e) => return Some(Err(e)),
        };
        let attr = {
            let mut specials = self.specials.lock().unwrap();
            if specials.at(&new).is_some() {
                return Some(Err(exists(&new)));
            }
            specials.link(ino, new)
        };
        let Some(attr) = attr else {
            return Some(Err(FsError::new(
                libc::ENOENT,
                format!("special file {ino} was removed"),
            )));
        };
        self.names_changed_in(new_parent, Some(dir_attrs)).await;
        Some(Ok(self.entry(attr)))
    }

    /// chmod, chown, utimes of `ino` if it is a special file.
    pub(super) fn setattr_special(&self, ino: Ino, req: &SetattrRequest) -> Option<FsResult<Attr>> {
        let mut specials = self.specials.lock().unwrap();
        if !specials.contains(ino) {
            return None;
        }
        if req.size.is_some() {
            return Some(Err(FsError::new(
                libc::EINVAL,
                "truncate of a FIFO, socket or device node",
            )));
        }
        specials.set(ino, req).map(Ok)
    }

    /// A listing of directory `dir` as readdir hands it out, with the special files in it
    /// (after the server's names, which they hide if they share one).
    pub(super) fn with_specials(&self, dir: &Path, mut items: Vec<DirItem>) -> Vec<DirItem> {
        let here: Vec<(OsString, Attr)> = {
            let specials = self.specials.lock().unwrap();
            if specials.is_empty() {
                return items;
            }
            specials
                .in_dir(dir)
                .into_iter()
                .filter_map(|(name, ino)| Some((name, specials.attr(ino)?)))
                .collect()
        };
        if here.is_empty() {
            return items;
        }
        let shadowed: HashSet<&OsStr> = here.iter().map(|(name, _)| name.as_os_str()).collect();
        items.retain(|i| !shadowed.contains(i.name.as_os_str()));
        let listed_at = items.first().map_or(0, |i| i.listed_at);
        items.extend(here.into_iter().map(|(name, a)| DirItem {
            name,
            kind: a.kind,
            next_offset: 0,
            attrs: Some(Attrs {
                size: Some(0),
                uid: Some(a.uid),
                gid: Some(a.gid),
                mode: Some(type_bits(a.kind) | u32::from(a.perm)),
                atime: Some(to_seconds(TimeSpec::At(a.atime))),
                mtime: Some(to_seconds(TimeSpec::At(a.mtime))),
            }),
            nlink: Some(a.nlink),
            listed_at,
            taken: None,
            local: true,
        }));
        for (i, item) in items.iter_mut().enumerate() {
            item.next_offset = i as u64 + 1;
        }
        items
    }
}

fn exists(path: &Path) -> FsError {
    FsError::new(libc::EEXIST, format!("{}: exists", path.display()))
}

fn not_empty(path: &Path) -> FsError {
    FsError::new(
        libc::ENOTEMPTY,
        format!(
            "{}: not empty (FIFOs, sockets or device nodes made through the mount are in it)",
            path.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    fn node(kind: FileKind) -> Node {
        Node { kind, rdev: 0 }
    }

    #[test]
    fn names_follow_renames_links_and_unlinks() {
        let mut s = Specials::default();
        s.make(10, p("/x/d/f"), node(FileKind::Fifo), 0o644, (1, 2));
        s.make(11, p("/x/d/sub/s"), node(FileKind::Socket), 0o755, (1, 2));
        assert_eq!(s.in_dir(Path::new("/x/d")), vec![("f".into(), 10)]);
        assert!(s.any_under(Path::new("/x/d")) && s.any_under(Path::new("/x/d/sub")));
        assert!(!s.any_under(Path::new("/x/d/f")) && !s.any_under(Path::new("/x/dd")));

        // A hard link is a second name of the same node, counted in nlink.
        assert_eq!(s.link(10, p("/x/g")).unwrap().nlink, 2);
        assert_eq!(s.at(Path::new("/x/g")), Some(10));
        // Renaming one name over the other name of the same node does nothing.
        s.rename(Path::new("/x/g"), Path::new("/x/d/f"));
        assert_eq!(s.attr(10).unwrap().nlink, 2);

        // A directory rename carries what is below it, and only that.
        s.move_dir(Path::new("/x/d"), Path::new("/x/e"));
        assert_eq!(s.at(Path::new("/x/e/f")), Some(10));
        assert_eq!(s.at(Path::new("/x/e/sub/s")), Some(11));
        assert_eq!(s.at(Path::new("/x/g")), Some(10));
        assert_eq!(s.at(Path::new("/x/d/f")), None);

        // Renaming over another special file replaces it; it lives on while looked up.
        s.rename(Path::new("/x/e/sub/s"), Path::new("/x/g"));
        assert_eq!(s.at(Path::new("/x/g")), Some(11));
        assert_eq!(s.attr(10).unwrap().nlink, 1, "10 lost the name /x/g");
        assert_eq!(s.unlink(Path::new("/x/e/f")), Some(10));
        assert!(
            s.contains(10),
            "the kernel still holds it (from mknod and link)"
        );
        assert!(s.forget(10, 1));
        assert!(s.contains(10));
        assert!(s.forget(10, 1));
        assert!(!s.contains(10));
        assert!(!s.forget(10, 1), "no longer a special file");
        // A node forgotten by the kernel lives on while it has a name.
        assert!(s.forget(11, 1));
        assert_eq!(s.looked_up(11).unwrap().kind, FileKind::Socket);
    }

    #[test]
    fn attributes_change_as_asked() {
        let mut s = Specials::default();
        s.make(5, p("/f"), node(FileKind::Fifo), 0o600, (1000, 1000));
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(1_500_000_001);
        let a = s
            .set(
                5,
                &SetattrRequest {
                    mode: Some(libc::S_IFIFO | 0o4751),
                    uid: Some(7),
                    gid: None,
                    size: None,
                    atime: Some(TimeSpec::At(t)),
                    mtime: None,
                },
            )
            .unwrap();
        assert_eq!((a.perm, a.uid, a.gid, a.atime), (0o4751, 7, 1000, t));
        assert!(a.ctime > t && a.mtime > t);
    }
}
