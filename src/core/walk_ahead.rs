//! Walking ahead: when a tool goes down a tree (`ls -R`, `find`, `grep -r`, `cp -r`, `du`,
//! `git status`'s search for untracked files), the listings of the whole subtree are fetched
//! in the background, many at once, so the walk finds them waiting.
//!
//! Why: a walk waits for the listing of every directory it enters (OPENDIR, then READDIR: two
//! round trips). Listing each subdirectory as a readdirplus hands it to the kernel
//! (`Fs::prefetch_dir`) hides that for the directories a walk comes back to later, but not on
//! the way down: a depth-first walk enters a directory's first subdirectory moments after the
//! listing that named it, so it still waited about once per directory with subdirectories (28
//! of the 62 directories of the bench's small tree, 2 round trips each). Walking ahead, the
//! subtree is listed in about as many waves as it is deep, while the walk reads.
//!
//! When: a tool opens a directory a readdirplus handed to the kernel, that is it went down
//! from the directory that listed it, the walk's root. One walk per root within `dir_ttl`
//! (none below a root walked already), at most [`MAX_WALK_LISTINGS`] listings each, in flight
//! within the mount-wide bound on listings ahead (`MAX_DIR_LISTINGS_AHEAD`, shared with
//! `prefetch_dir`). Only directories are entered, never symlinks. Off when listings are not
//! cached (`dir_ttl` 0).
//!
//! Consistency, the same as for a listing taken when the directory is opened:
//! * A directory the kernel has an inode for is listed as `prefetch_dir` lists it, into the
//!   listing cache, with its checks against changes made through the mount meanwhile.
//! * One it has not is listed by its server path into `MetaCache::dirs_ahead`, which its
//!   inode takes over when a lookup or readdirplus creates it (`Fs::remember`), or which a
//!   lookup joins while it is on its way; with the lifetime it had from when it was asked
//!   for, and `Fs::settle_listing`'s checks. The mount cannot tell which paths a name change
//!   through it affects (a renamed directory moves everything below it), so every name change
//!   drops all listings by path, and one on its way when a name changes is not kept. A walk
//!   stops at the first name change, and lists nothing by path while an unlink answered early
//!   is still on its way (the server may list the name still).

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use lru::LruCache;

use super::inode::{Ino, ROOT_INO};
use super::Fs;
use crate::remote::{DirEntry, FileKind, Remote};

/// Listings one walk may fetch ahead. Enough for a workspace's source tree; a walk of a larger
/// tree goes on as before past it (each subdirectory listed as the kernel is handed it).
pub(super) const MAX_WALK_LISTINGS: usize = 512;

/// A listing by path: the entries, the change clock from before it was asked for, and until
/// when it answers (asked + `dir_ttl`).
pub(super) type ListedAhead = (Arc<Vec<DirEntry>>, u64, Instant);

#[allow(clippy::type_complexity)]
pub(super) struct WalkAhead {
    /// Directories a readdirplus handed to the kernel, and the directory that listed them:
    /// opening one of them is the sign of a walk going down.
    handed: Mutex<LruCache<Ino, Ino>>,
    /// Roots walked lately, and when.
    walked: Mutex<LruCache<Ino, Instant>>,
    /// Listings by path on their way, which a lookup of the same directory joins.
    in_flight: Mutex<HashMap<PathBuf, Arc<tokio::sync::OnceCell<Option<ListedAhead>>>>>,
}

impl WalkAhead {
    pub(super) fn new() -> Self {
        let cap = |n| std::num::NonZeroUsize::new(n).expect("non-zero");
        WalkAhead {
            handed: Mutex::new(LruCache::new(cap(4096))),
            walked: Mutex::new(LruCache::new(cap(64))),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the listing of `path` is on its way (a lookup in it should wait for it).
    pub(super) fn listing_coming(&self, path: &Path) -> bool {
        self.in_flight.lock().unwrap().contains_key(path)
    }
}

/// A directory of the walk: its path on the server, and its name in a parent directory the
/// kernel knows (if it does), to find its inode when it has one.
struct WalkDir {
    path: PathBuf,
    parent: Option<Ino>,
    name: OsString,
}

impl<R: Remote> Fs<R> {
    /// A readdirplus of `parent` handed its subdirectory `dir` to the kernel.
    pub(super) fn handed_dir(&self, dir: Ino, parent: Ino) {
        self.walk.handed.lock().unwrap().put(dir, parent);
    }

    /// `dir` is being opened. If a readdirplus handed it to the kernel, a tool is going down
    /// the tree: list the rest of the tree below its parent ahead.
    pub(super) fn entering_dir(self: &Arc<Self>, dir: Ino) {
        let Some(root) = self.walk.handed.lock().unwrap().pop(&dir) else {
            return;
        };
        if self.cache_config().dir_ttl.is_zero() || !self.claim_walk(root) {
            return;
        }
        let fs = self.clone();
        self.rt.spawn(async move { fs.walk_ahead(root).await });
    }

    /// Claim `root` for a walk: false when it or a directory above it was walked within
    /// `dir_ttl` (its walk covered this one).
    fn claim_walk(&self, root: Ino) -> bool {
        let ttl = self.cache_config().dir_ttl;
        let mut line = vec![root];
        {
            let inodes = self.inodes.lock().unwrap();
            let mut ino = root;
            while ino != ROOT_INO && line.len() < 4096 {
                match inodes.names_of(ino).first() {
                    Some((parent, _)) => {
                        ino = *parent;
                        line.push(ino);
                    }
                    None => break,
                }
            }
        }
        let now = Instant::now();
        let mut walked = self.walk.walked.lock().unwrap();
        if line
            .iter()
            .any(|d| walked.peek(d).is_some_and(|t| now.duration_since(*t) < ttl))
        {
            return false;
        }
        walked.put(root, now);
        true
    }

    /// List the tree below `root` (whose listing is cached), level by level, as many at once
    /// as the mount-wide bound allows.
    async fn walk_ahead(self: Arc<Self>, root: Ino) {
        let (names_since, listing) = {
            let mut cache = self.cache.lock().unwrap();
            (cache.names_now(), cache.get_dir(root))
        };
        let (Some(listing), Ok(root_path)) = (listing, self.path_of(root)) else {
            return;
        };
        let mut queue = VecDeque::new();
        push_subdirs(&mut queue, &root_path, Some(root), &listing);
        let mut running = tokio::task::JoinSet::new();
        let mut budget = MAX_WALK_LISTINGS;
        loop {
            if self.cache.lock().unwrap().names_now() != names_since {
                tracing::debug!(root, "walk ahead stopped: a name changed through the mount");
                break;
            }
            if budget > 0 && !queue.is_empty() {
                let permit = match self.dir_listings_ahead.clone().try_acquire_owned() {
                    Ok(p) => Some(p),
                    // Every permit is taken, none by this walk: wait for one.
                    Err(_) if running.is_empty() => {
                        match self.dir_listings_ahead.clone().acquire_owned().await {
                            Ok(p) => Some(p),
                            Err(_) => break,
                        }
                    }
                    Err(_) => None,
                };
                if let Some(permit) = permit {
                    let dir = queue.pop_front().expect("not empty");
                    budget -= 1;
                    let fs = self.clone();
                    running.spawn(async move {
                        let _permit = permit;
                        let found = fs.list_walk_dir(&dir).await;
                        (dir, found)
                    });
                    continue;
                }
            }
            match running.join_next().await {
                None => break,
                Some(Ok((dir, Some((ino, listing))))) => {
                    push_subdirs(&mut queue, &dir.path, ino, &listing)
                }
                Some(_) => {}
            }
        }
    }

    /// The listing of one directory of a walk (and its inode, if the kernel has one): cached,
    /// else fetched into the listing cache (an inode) or by path.
    async fn list_walk_dir(
        self: &Arc<Self>,
        dir: &WalkDir,
    ) -> Option<(Option<Ino>, Arc<Vec<DirEntry>>)> {
        let ino = dir
            .parent
            .and_then(|p| self.inodes.lock().unwrap().child(p, &dir.name));
        if let Some(ino) = ino {
            if let Some(l) = self.cache.lock().unwrap().get_dir(ino) {
                return Some((Some(ino), l));
            }
            return self.list_dir_shared(ino).await.map(|(l, _)| (Some(ino), l));
        }
        if let Some((l, ..)) = self.cache.lock().unwrap().peek_dir_ahead(&dir.path) {
            return Some((None, l));
        }
        self.list_by_path(&dir.path).await.map(|(l, ..)| (None, l))
    }

    /// List `path` by its path, once however many ask at the same time.
    async fn list_by_path(&self, path: &Path) -> Option<ListedAhead> {
        let cell = self
            .walk
            .in_flight
            .lock()
            .unwrap()
            .entry(path.to_path_buf())
            .or_default()
            .clone();
        let listed = cell.get_or_init(|| self.fetch_by_path(path)).await.clone();
        self.walk.in_flight.lock().unwrap().remove(path);
        listed
    }

    /// Fetch the listing of `path` and keep it for the inode a lookup will make for it (see
    /// `MetaCache::put_dir_ahead` for when it is not kept).
    async fn fetch_by_path(&self, path: &Path) -> Option<ListedAhead> {
        if self.removes_behind.in_flight() > 0 {
            return None;
        }
        let (since, names_since) = {
            let cache = self.cache.lock().unwrap();
            (cache.now(), cache.names_now())
        };
        let asked = Instant::now();
        let listing = match self.remote.read_dir(path).await {
            Ok(l) => Arc::new(valid_listing(path, l)),
            Err(e) => {
                tracing::debug!(path = %path.display(), "walk ahead: listing failed: {e}");
                return None;
            }
        };
        let until = asked + self.cache_config().dir_ttl;
        self.cache.lock().unwrap().put_dir_ahead(
            path.to_path_buf(),
            listing.clone(),
            since,
            names_since,
            asked,
        );
        self.stats
            .dirs_listed_ahead
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some((listing, since, until))
    }

    /// The listing of `dir` (at `path`) from a walk: one on its way by path (joined), or one
    /// fetched ahead, taken over by the inode; with the change clock from before it was asked.
    pub(super) async fn listing_from_walk(
        &self,
        dir: Ino,
        path: &Path,
    ) -> Option<(Arc<Vec<DirEntry>>, u64)> {
        let coming = self.walk.in_flight.lock().unwrap().get(path).cloned();
        let (listing, since, until) = match coming {
            Some(cell) => cell
                .get_or_init(|| self.fetch_by_path(path))
                .await
                .clone()?,
            None => self.cache.lock().unwrap().take_dir_ahead(path)?,
        };
        Some((
            self.settle_listing(dir, (*listing).clone(), since, until),
            since,
        ))
    }

    /// A lookup made the inode `dir` of a directory: it takes over the listing a walk fetched
    /// ahead by its path, if there is one.
    pub(super) fn adopt_listing_ahead(&self, dir: Ino) {
        if !self.cache.lock().unwrap().has_dirs_ahead() {
            return;
        }
        let Ok(path) = self.path_of(dir) else {
            return;
        };
        let taken = {
            let mut cache = self.cache.lock().unwrap();
            let taken = cache.take_dir_ahead(&path);
            // (A listing of its own, taken since, is newer.)
            taken.filter(|_| cache.get_dir(dir).is_none())
        };
        if let Some((listing, since, until)) = taken {
            self.settle_listing(dir, (*listing).clone(), since, until);
        }
    }
}

/// Queue the subdirectories of a listing of `path` (whose inode is `ino`, if known).
fn push_subdirs(
    queue: &mut VecDeque<WalkDir>,
    path: &Path,
    ino: Option<Ino>,
    listing: &[DirEntry],
) {
    queue.extend(
        listing
            .iter()
            .filter(|e| e.attrs.file_type() == FileKind::Dir)
            .map(|e| WalkDir {
                path: path.join(&e.name),
                parent: ino,
                name: e.name.clone(),
            }),
    );
}

/// A server's listing without the names no listing may hold ("", ".", "..", names with a
/// slash or NUL): logged and hidden.
pub(super) fn valid_listing(path: &Path, listing: Vec<DirEntry>) -> Vec<DirEntry> {
    listing
        .into_iter()
        .filter(|e| {
            let ok = super::is_valid_listing_name(&e.name);
            if !ok {
                tracing::warn!(dir = %path.display(), name = ?e.name, "server sent an invalid name in a listing; hidden");
            }
            ok
        })
        .collect()
}
