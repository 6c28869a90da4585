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
//! When: a tool goes down two levels in a row, within [`DESCENT_GAP`]: it opens a directory a
//! readdirplus handed to the kernel, then one that directory's readdirplus handed out. That
//! is a recursive walk (`ls /mnt` then `ls /mnt/proj` typed by hand is not); the tree below
//! the directory the descent started from is listed. A directory listed by a walk is not the
//! root of another one within `dir_ttl` unless a name changed through the mount since, and no
//! walk starts within [`DESCENT_GAP`] of a name change (a tree being changed, by `cp -r` into
//! the mount or `rm -rf`, would drop what it lists by path at every change); at most
//! [`MAX_WALK_LISTINGS`] listings per walk, in flight within the mount-wide bound on listings
//! ahead (`MAX_DIR_LISTINGS_AHEAD`, shared with `prefetch_dir`). Only directories are entered,
//! never symlinks (AWCP resource links at the root are walked from the resource down). Off
//! when listings are not cached (`dir_ttl` 0).
//!
//! Consistency, the same as for a listing taken when the directory is opened:
//! * A directory the kernel has an inode for is listed as `prefetch_dir` lists it, into the
//!   listing cache, with its checks against changes made through the mount meanwhile.
//! * One it has not is listed by its server path into `MetaCache::dirs_ahead`, which its
//!   inode takes over when a lookup or readdirplus creates it (`Fs::remember`), or which a
//!   lookup joins while it is on its way; with the lifetime it had from when it was asked
//!   for, and `Fs::settle_listing`'s checks. The mount cannot tell which paths a name change
//!   through it affects (a renamed directory moves everything below it), so every name change
//!   drops all listings by path, and one on its way when a name changes is neither kept nor
//!   handed to a lookup that joined it. A walk stops at the first name change, and lists
//!   nothing by path while an unlink answered early is still on its way (the server may list
//!   the name still).
//! * Containment: a walk lists only names its listings showed as directories, below the
//!   directory it started from, and the listings only answer what a lookup or `opendir` there
//!   would have listed itself. Like every SFTP path, a path listed by name is resolved by the
//!   server: a directory the server swaps for a symlink between two listings is followed
//!   there, as it would be by the `opendir` it stands in for.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lru::LruCache;
use tokio::sync::OnceCell;

use super::cache::ListedAhead;
use super::inode::Ino;
use super::Fs;
use crate::remote::{DirEntry, FileKind, Remote};

/// Listings one walk may fetch ahead. Enough for a workspace's source tree; a walk of a larger
/// tree goes on as before past it (each subdirectory listed as the kernel is handed it).
pub(super) const MAX_WALK_LISTINGS: usize = 512;

/// Two steps down within this long are a tool walking the tree, not a person browsing it.
pub(super) const DESCENT_GAP: Duration = Duration::from_secs(1);

type InFlight = Arc<OnceCell<Option<ListedAhead>>>;

pub(super) struct WalkAhead {
    /// Directories a readdirplus handed to the kernel, and the directory that listed them.
    handed: Mutex<LruCache<Ino, Ino>>,
    /// Directories gone down into (opened after a readdirplus handed them out): where that
    /// descent started, and when.
    descents: Mutex<LruCache<Ino, (Ino, Instant)>>,
    /// Directories listed by a walk (or a walk's root), when, and the name-change count then:
    /// no second walk starts from them meanwhile.
    walked: Mutex<LruCache<PathBuf, (Instant, u64)>>,
    /// Listings by path on their way, which a lookup of the same directory joins.
    in_flight: Mutex<HashMap<PathBuf, InFlight>>,
    /// [`DESCENT_GAP`] (longer in tests, which must not depend on how fast they run).
    descent_gap: Mutex<Duration>,
}

impl WalkAhead {
    pub(super) fn new() -> Self {
        let cap = |n| std::num::NonZeroUsize::new(n).expect("non-zero");
        WalkAhead {
            handed: Mutex::new(LruCache::new(cap(4096))),
            descents: Mutex::new(LruCache::new(cap(1024))),
            walked: Mutex::new(LruCache::new(cap(4 * MAX_WALK_LISTINGS))),
            in_flight: Mutex::new(HashMap::new()),
            descent_gap: Mutex::new(DESCENT_GAP),
        }
    }

    #[cfg(test)]
    pub(super) fn set_descent_gap(&self, gap: Duration) {
        *self.descent_gap.lock().unwrap() = gap;
    }

    /// How many listings by path are on their way (tests: none is left behind).
    #[cfg(test)]
    pub(super) fn in_flight_count(&self) -> usize {
        self.in_flight.lock().unwrap().len()
    }

    /// How many hold the in-flight listing of `path` (tests: has a lookup joined it?).
    #[cfg(test)]
    pub(super) fn holders(&self, path: &Path) -> usize {
        self.in_flight
            .lock()
            .unwrap()
            .get(path)
            .map_or(0, Arc::strong_count)
    }

    /// Whether the listing of `path` is on its way (a lookup in it should wait for it).
    pub(super) fn listing_coming(&self, path: &Path) -> bool {
        self.in_flight.lock().unwrap().contains_key(path)
    }
}

/// Takes a listing's entry out of the in-flight map when its fetch ends, however it ends (a
/// task aborted at an await included), unless a newer fetch of the path took the entry over.
struct InFlightEntry<'a> {
    map: &'a Mutex<HashMap<PathBuf, InFlight>>,
    path: &'a Path,
    cell: InFlight,
}

impl Drop for InFlightEntry<'_> {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap();
        if map
            .get(self.path)
            .is_some_and(|c| Arc::ptr_eq(c, &self.cell))
        {
            map.remove(self.path);
        }
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

    /// `dir` is being opened. If a readdirplus handed it out, a tool is going down the tree;
    /// on its second step in a row, list the tree below where the descent started.
    pub(super) fn entering_dir(self: &Arc<Self>, dir: Ino) {
        let Some(parent) = self.walk.handed.lock().unwrap().pop(&dir) else {
            return;
        };
        let now = Instant::now();
        let gap = *self.walk.descent_gap.lock().unwrap();
        let second_step = self
            .walk
            .descents
            .lock()
            .unwrap()
            .peek(&parent)
            .filter(|(_, at)| now.duration_since(*at) < gap)
            .map(|(start, _)| *start);
        // A descent starts from the directory `dir` was listed in, unless it is listed there as
        // a symlink the mount follows (an AWCP resource link): a walk of that directory would
        // not go into it, so the descent starts from `dir` itself.
        let start = second_step.unwrap_or_else(|| {
            if self.listed_as_dir(parent, dir) {
                parent
            } else {
                dir
            }
        });
        self.walk.descents.lock().unwrap().put(dir, (start, now));
        let Some(root) = second_step else {
            return;
        };
        // A tree being changed through the mount (`cp -r` or `tar` into it, `rm -rf`) is not
        // walked ahead: every name change would drop what the walk listed by path.
        if self.cache_config().dir_ttl.is_zero()
            || self.cache.lock().unwrap().names_changed_within(gap)
        {
            return;
        }
        let Ok(root_path) = self.path_of(root) else {
            return;
        };
        if !self.claim_walk(&root_path) {
            return;
        }
        let fs = self.clone();
        self.rt
            .spawn(async move { fs.walk_ahead(root, root_path).await });
    }

    /// Whether the cached listing of `parent` shows `dir` as a directory (not a symlink).
    fn listed_as_dir(&self, parent: Ino, dir: Ino) -> bool {
        let name = self
            .inodes
            .lock()
            .unwrap()
            .names_of(dir)
            .into_iter()
            .find(|(p, _)| *p == parent)
            .map(|(_, n)| n);
        name.is_some_and(|n| {
            matches!(
                self.cache.lock().unwrap().lookup_in_dir(parent, &n),
                Some(Some(e)) if e.attrs.file_type() == FileKind::Dir
            )
        })
    }

    /// Whether a walk may start from `path`: not if a walk listed it (or started from it)
    /// within `dir_ttl` with no name changed through the mount since (that walk covered it).
    fn claim_walk(&self, path: &Path) -> bool {
        let names_now = self.cache.lock().unwrap().names_now();
        let ttl = self.cache_config().dir_ttl;
        let mut walked = self.walk.walked.lock().unwrap();
        if walked
            .peek(path)
            .is_some_and(|(at, names)| at.elapsed() < ttl && *names == names_now)
        {
            return false;
        }
        walked.put(path.to_path_buf(), (Instant::now(), names_now));
        true
    }

    /// List the tree below `root` (whose listing is cached), level by level, as many at once
    /// as the mount-wide bound allows.
    async fn walk_ahead(self: Arc<Self>, root: Ino, root_path: PathBuf) {
        let (names_since, listing) = {
            let mut cache = self.cache.lock().unwrap();
            (cache.names_now(), cache.get_dir(root))
        };
        let Some(listing) = listing else {
            return;
        };
        let mut queue = VecDeque::new();
        push_subdirs(&mut queue, &root_path, Some(root), &listing);
        let mut running = tokio::task::JoinSet::new();
        let mut budget = MAX_WALK_LISTINGS;
        loop {
            if self.cache.lock().unwrap().names_now() != names_since {
                tracing::debug!(root, "walk ahead stopped: a name changed through the mount");
                // What is on its way ends on its own (a joined lookup may be waiting for it).
                running.detach_all();
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
                    self.walk
                        .walked
                        .lock()
                        .unwrap()
                        .put(dir.path.clone(), (Instant::now(), names_since));
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
        if let Some(l) = self.cache.lock().unwrap().peek_dir_ahead(&dir.path) {
            return Some((None, l.listing));
        }
        self.list_by_path(&dir.path)
            .await
            .map(|l| (None, l.listing))
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
        let _entry = InFlightEntry {
            map: &self.walk.in_flight,
            path,
            cell: cell.clone(),
        };
        cell.get_or_init(|| self.fetch_by_path(path)).await.clone()
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
        let until = Instant::now() + self.cache_config().dir_ttl;
        let listing = match self.remote.read_dir(path).await {
            Ok(l) => Arc::new(super::valid_listing(path, l)),
            Err(e) => {
                tracing::debug!(path = %path.display(), "walk ahead: listing failed: {e}");
                return None;
            }
        };
        let listed = ListedAhead {
            listing,
            since,
            names_since,
            until,
        };
        self.cache
            .lock()
            .unwrap()
            .put_dir_ahead(path.to_path_buf(), listed.clone());
        self.stats
            .dirs_listed_ahead
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(listed)
    }

    /// The listing of `dir` (at `path`) from a walk: one on its way by path (joined), or one
    /// fetched ahead, taken over by the inode; with the change clock from before it was asked.
    pub(super) async fn listing_from_walk(
        &self,
        dir: Ino,
        path: &Path,
    ) -> Option<(Arc<Vec<DirEntry>>, u64)> {
        let coming = self.walk.in_flight.lock().unwrap().get(path).cloned();
        let listed = match coming {
            Some(cell) => {
                let listed = cell
                    .get_or_init(|| self.fetch_by_path(path))
                    .await
                    .clone()?;
                // Not if a name changed through the mount while it was on its way.
                self.cache
                    .lock()
                    .unwrap()
                    .still_good(&listed)
                    .then_some(listed)?
            }
            None => self.cache.lock().unwrap().take_dir_ahead(path)?,
        };
        Some(self.settle_ahead(dir, listed))
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
        if let Some(listed) = taken {
            self.settle_ahead(dir, listed);
        }
    }

    /// A listing by path taken over by the inode `dir`, as a listing taken for it would be.
    fn settle_ahead(&self, dir: Ino, listed: ListedAhead) -> (Arc<Vec<DirEntry>>, u64) {
        let listing = Arc::unwrap_or_clone(listed.listing);
        (
            self.settle_listing(dir, listing, listed.since, listed.until, true),
            listed.since,
        )
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
