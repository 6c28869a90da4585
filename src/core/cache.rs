//! Bounded, TTL'd metadata caches.
//!
//! Five LRU maps, each capped at `max_entries` so memory stays bounded however large the tree:
//! attributes by inode, negative lookups by (parent, name), whole directory listings by
//! directory inode (they answer lookups of names in a directory that was just listed, which is
//! what `ls -l`, `find` and `git status` do), listings fetched ahead of a walk by path, for
//! directories the kernel has no inode for yet (see `walk_ahead`), and symlink targets by
//! inode.
//!
//! Every change made through the mount invalidates the entries it affects *before* the
//! operation returns, so the mount's own changes are always visible through it at once. Changes
//! made on the server become visible when the entry's TTL runs out.

use std::ffi::{OsStr, OsString};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lru::LruCache;

use super::inode::Ino;
use crate::remote::{Attrs, DirEntry, FileKind, StatVfs};

/// Time-to-live settings (also what the kernel is told for its own caches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
    pub negative_ttl: Duration,
    /// How long a directory listing answers lookups (sshfs `dcache_timeout`).
    pub dir_ttl: Duration,
    pub max_entries: usize,
}

impl Default for CacheConfig {
    /// Attributes, names and listings live 20 s, as in sshfs's own cache: on a high-latency
    /// link, a second `git status` or the `stat`s after a `find` then cost nothing. Negative
    /// answers live 5 s, so a file created on the server shows up soon. The mount's own
    /// changes are visible at once whatever these are.
    fn default() -> Self {
        CacheConfig {
            attr_ttl: Duration::from_secs(20),
            entry_ttl: Duration::from_secs(20),
            negative_ttl: Duration::from_secs(5),
            dir_ttl: Duration::from_secs(20),
            max_entries: 65_536,
        }
    }
}

/// A listing fetched ahead of a walk by path (see `walk_ahead`).
#[derive(Debug, Clone)]
pub struct ListedAhead {
    pub listing: Arc<Vec<DirEntry>>,
    /// The change clock and the name-change count from before it was asked for.
    pub since: u64,
    pub names_since: u64,
    /// Asked for + `dir_ttl`: it answers no longer than a listing taken then would.
    pub until: Instant,
}

/// A cached attribute set with the link count when known.
#[derive(Debug, Clone, Copy)]
pub struct CachedAttrs {
    pub attrs: Attrs,
    pub nlink: Option<u32>,
}

pub struct MetaCache {
    config: CacheConfig,
    /// A logical clock of changes made through the mount, and when each inode last changed.
    /// An answer fetched from the server is cached only if its inode did not change while
    /// the request was on its way (else a lookup racing a write would cache the old size).
    clock: u64,
    changed: std::collections::HashMap<Ino, u64>,
    /// When writes of each inode were last answered by the server, on the same clock: an
    /// answer asked for before may predate them, although nothing is pending any more.
    landed: std::collections::HashMap<Ino, u64>,
    /// Unlinks answered early of a name of each inode: how many are on their way, and when
    /// the last one was carried out by the server, on the change clock. A listing the server
    /// answers meanwhile still counts the name in the file's link count.
    unlinks_pending: std::collections::HashMap<Ino, usize>,
    unlinked: std::collections::HashMap<Ino, u64>,
    /// Directory moves started or done through the mount, and those going on (see
    /// [`MetaCache::dir_moves`]).
    dirs_moved: u64,
    dir_moves_in_flight: usize,
    /// Counts the name changes made through the mount (a subset of the clock's changes): a
    /// listing fetched ahead by path is kept only if none came while it was on its way.
    names_clock: u64,
    /// When a name last changed through the mount.
    names_changed_at: Option<Instant>,
    attrs: LruCache<Ino, (CachedAttrs, Instant)>,
    negative: LruCache<(Ino, OsString), Instant>,
    dirs: LruCache<Ino, (Arc<Vec<DirEntry>>, Instant)>,
    /// Directories whose cached listing shows a file with links of which the listing cannot
    /// tell the names (see [`MetaCache::shared_data_changed`]), and whether a listing
    /// fetched ahead may show one.
    shared_dirs: std::collections::HashSet<Ino>,
    shared_ahead: bool,
    /// Listings fetched ahead of a walk, by server path, of directories without an inode yet,
    /// with the change clock from before each was asked for. The directory's inode takes its
    /// listing over when a lookup creates it (`Fs::adopt_listing_ahead`). The mount cannot tell which
    /// paths a name change through it affects (a renamed directory moves everything below
    /// it), so every name change drops them all: a walk ahead is for trees nobody changes.
    dirs_ahead: LruCache<PathBuf, ListedAhead>,
    /// Directories made through the mount whose cached listing is still the one kept since
    /// (empty at the mkdir, and changed by every name made or removed through the mount), and
    /// the owner and group they were made with (see [`MetaCache::made_dir_lacks`]).
    made_dirs: LruCache<Ino, (u32, u32)>,
    links: LruCache<Ino, (PathBuf, Instant)>,
    /// The server's `statvfs`, until when it is good, and the change clock when it was asked
    /// for (see [`MetaCache::get_statvfs`]).
    statvfs: Option<(StatVfs, Instant, u64)>,
}

fn cap(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n.max(1)).expect("max(1) is non-zero")
}

/// How many directory listings (and as many listings fetched ahead) to keep: listings are
/// big, so far fewer of them than single entries.
fn dir_cap(config: &CacheConfig) -> NonZeroUsize {
    cap((config.max_entries / 64).max(16))
}

/// A regular file whose link count (from a listing) says it has other names.
pub fn has_other_names(nlink: Option<u32>, attrs: &Attrs) -> bool {
    nlink.is_some_and(|n| n > 1) && attrs.file_type() == FileKind::File
}

fn multiply_linked(e: &DirEntry) -> bool {
    has_other_names(e.nlink, &e.attrs)
}

impl MetaCache {
    pub fn new(config: CacheConfig) -> Self {
        MetaCache {
            config,
            clock: 0,
            changed: std::collections::HashMap::new(),
            landed: std::collections::HashMap::new(),
            unlinks_pending: std::collections::HashMap::new(),
            unlinked: std::collections::HashMap::new(),
            dirs_moved: 0,
            dir_moves_in_flight: 0,
            names_clock: 0,
            names_changed_at: None,
            attrs: LruCache::new(cap(config.max_entries)),
            negative: LruCache::new(cap(config.max_entries)),
            dirs: LruCache::new(dir_cap(&config)),
            shared_dirs: std::collections::HashSet::new(),
            shared_ahead: false,
            dirs_ahead: LruCache::new(dir_cap(&config)),
            made_dirs: LruCache::new(dir_cap(&config)),
            links: LruCache::new(cap(config.max_entries / 4)),
            statvfs: None,
        }
    }

    pub fn config(&self) -> CacheConfig {
        self.config
    }

    /// New TTLs (live policy reload). Shrinking `max_entries` evicts at once.
    pub fn reconfigure(&mut self, config: CacheConfig) {
        self.config = config;
        self.attrs.resize(cap(config.max_entries));
        self.negative.resize(cap(config.max_entries));
        self.dirs.resize(dir_cap(&config));
        self.dirs_ahead.resize(dir_cap(&config));
        self.made_dirs.resize(dir_cap(&config));
        self.links.resize(cap(config.max_entries / 4));
    }

    pub fn len(&self) -> usize {
        self.attrs.len()
            + self.negative.len()
            + self.dirs.len()
            + self.dirs_ahead.len()
            + self.links.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Let every entry run out now, as if its TTL had passed: tests check what happens after
    /// a TTL without waiting on the clock (a stalled test thread then cannot fail them).
    #[cfg(test)]
    pub fn expire_all(&mut self) {
        let now = Instant::now();
        self.attrs
            .iter_mut()
            .for_each(|(_, (_, until))| *until = now);
        self.negative.iter_mut().for_each(|(_, until)| *until = now);
        self.dirs
            .iter_mut()
            .for_each(|(_, (_, until))| *until = now);
        self.dirs_ahead.iter_mut().for_each(|(_, l)| l.until = now);
        self.links
            .iter_mut()
            .for_each(|(_, (_, until))| *until = now);
        if let Some((_, until, _)) = &mut self.statvfs {
            *until = now;
        }
    }

    pub fn get_attrs(&mut self, ino: Ino) -> Option<CachedAttrs> {
        match self.attrs.get(&ino) {
            Some((a, until)) if *until > Instant::now() => Some(*a),
            Some(_) => {
                self.attrs.pop(&ino);
                None
            }
            None => None,
        }
    }

    /// How long the cached attributes of `ino` are still good (None: none cached). What the
    /// kernel is told to keep them for must not be longer: else each answer from the cache
    /// would start their lifetime again, and a change on the server show later than the TTL.
    pub fn attrs_left(&self, ino: Ino) -> Option<Duration> {
        self.attrs
            .peek(&ino)
            .map(|(_, until)| until.saturating_duration_since(Instant::now()))
    }

    /// The cached attributes of `ino` are good until `until` at most (they came from an
    /// answer older than now: a cached listing, or what a change derived from cached ones).
    pub fn cap_attrs(&mut self, ino: Ino, until: Instant) {
        if let Some((_, u)) = self.attrs.peek_mut(&ino) {
            *u = (*u).min(until);
        }
    }

    /// When the cached listing of `dir` was taken (None: none cached): its lifetime is the
    /// listing TTL from then.
    pub fn listing_taken(&self, dir: Ino) -> Option<Instant> {
        let (_, until) = self.dirs.peek(&dir)?;
        until.checked_sub(self.config.dir_ttl)
    }

    pub fn put_attrs(&mut self, ino: Ino, attrs: CachedAttrs) {
        if self.config.attr_ttl.is_zero() {
            return;
        }
        self.attrs
            .put(ino, (attrs, Instant::now() + self.config.attr_ttl));
    }

    /// The server's free space and file counts as last asked, for `statfs`: good for the
    /// attribute lifetime, and only while nothing changed through the mount (a write, create
    /// or remove moves them). `find`, `du`, `rm -rf` and `chmod -R` (gnulib's fts) each ask
    /// once per run, to decide how to walk, and would otherwise wait a round trip for it.
    pub fn get_statvfs(&self) -> Option<StatVfs> {
        match self.statvfs {
            Some((v, until, clock)) if until > Instant::now() && clock == self.clock => Some(v),
            _ => None,
        }
    }

    /// Keep a `statvfs` asked for when the change clock read `since`, unless something
    /// changed through the mount while it was on its way.
    pub fn put_statvfs(&mut self, v: StatVfs, since: u64) {
        if !self.config.attr_ttl.is_zero() && since == self.clock {
            self.statvfs = Some((v, Instant::now() + self.config.attr_ttl, since));
        }
    }

    /// The change clock now: pass it to [`MetaCache::changed_since`] after a fetch.
    pub fn now(&self) -> u64 {
        self.clock
    }

    /// `ino`, known under `names`, changed: its cached attributes are stale wherever they
    /// are (attribute cache, the listing entries of its names); `known`: the new ones.
    pub fn attrs_changed(&mut self, ino: Ino, names: &[(Ino, OsString)], known: Option<Attrs>) {
        self.touch(ino);
        // A directory's owner, group or set-gid bit may have changed: no longer the ones a
        // new file in it is given.
        self.made_dirs.pop(&ino);
        for (parent, name) in names {
            self.listing_update(*parent, name, known);
        }
        if let Some(attrs) = known {
            self.put_attrs(ino, CachedAttrs { attrs, nlink: None });
        }
    }

    /// `ino`'s data or attributes changed through the mount.
    pub fn touch(&mut self, ino: Ino) {
        self.clock += 1;
        self.changed.insert(ino, self.clock);
        self.attrs.pop(&ino);
    }

    /// A name in directory `dir` was added, removed or replaced through the mount: on the
    /// change clock that is a change of `dir` (a listing of it on its way may predate it, and
    /// so may a file fetched ahead by name from it).
    fn names_changed_in(&mut self, dir: Ino) {
        self.clock += 1;
        self.changed.insert(dir, self.clock);
        self.names_clock += 1;
        self.names_changed_at = Some(Instant::now());
        self.dirs_ahead.clear();
    }

    /// Whether a name changed through the mount within the last `within`.
    pub fn names_changed_within(&self, within: Duration) -> bool {
        self.names_changed_at.is_some_and(|t| t.elapsed() < within)
    }

    /// The count of name changes made through the mount so far (see `put_dir_ahead`).
    pub fn names_now(&self) -> u64 {
        self.names_clock
    }

    /// A directory is being moved through the mount: a listing on its way, of it or of one
    /// below it, may miss entries (see `Fs::list_dir`) until the move is done
    /// ([`MetaCache::dir_move_done`]).
    pub fn dir_move_started(&mut self) {
        self.dirs_moved += 1;
        self.dir_moves_in_flight += 1;
    }

    /// The move of [`MetaCache::dir_move_started`] is over (carried out and settled, or failed).
    pub fn dir_move_done(&mut self) {
        self.dirs_moved += 1;
        self.dir_moves_in_flight -= 1;
    }

    /// Counts the starts and ends of directory moves, and whether one is going on: a listing
    /// taken while the first stayed the same and the second was false cannot have crossed one.
    pub fn dir_moves(&self) -> (u64, bool) {
        (self.dirs_moved, self.dir_moves_in_flight > 0)
    }

    /// A write of `ino` was answered by the server (it changed the server's file, which the
    /// mount's caches already know as changed: nothing cached is dropped).
    pub fn write_landed(&mut self, ino: Ino) {
        self.clock += 1;
        self.landed.insert(ino, self.clock);
    }

    /// An unlink of a name of `ino` was answered early, its REMOVE is on its way.
    pub fn unlink_started(&mut self, ino: Ino) {
        *self.unlinks_pending.entry(ino).or_default() += 1;
    }

    /// The REMOVE of [`MetaCache::unlink_started`] was answered (carried out or refused).
    pub fn unlink_landed(&mut self, ino: Ino) {
        if let Some(n) = self.unlinks_pending.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                self.unlinks_pending.remove(&ino);
            }
        }
        self.clock += 1;
        self.unlinked.insert(ino, self.clock);
    }

    /// Whether a link count the server gave for `ino`, asked for when the clock read `since`,
    /// may still count a name the mount has unlinked: a REMOVE of one is on its way, or
    /// landed after `since`.
    pub fn link_count_suspect(&self, ino: Ino, since: u64) -> bool {
        self.unlinks_pending.contains_key(&ino)
            || self.unlinked.get(&ino).is_some_and(|&t| t > since)
    }

    /// Whether a write of `ino` was answered after the clock read `since`.
    pub fn landed_since(&self, ino: Ino, since: u64) -> bool {
        self.landed.get(&ino).is_some_and(|&t| t > since)
    }

    /// Whether `ino` changed after the clock read `since`.
    pub fn changed_since(&self, ino: Ino, since: u64) -> bool {
        self.changed.get(&ino).is_some_and(|&t| t > since)
    }

    /// The kernel forgot `ino`: nothing about it is needed any more.
    pub fn forget_inode(&mut self, ino: Ino) {
        self.forget_attrs(ino);
        self.changed.remove(&ino);
        self.landed.remove(&ino);
        self.unlinked.remove(&ino);
    }

    pub fn forget_attrs(&mut self, ino: Ino) {
        self.attrs.pop(&ino);
        self.links.pop(&ino);
    }

    pub fn is_negative(&mut self, parent: Ino, name: &OsStr) -> bool {
        let key = (parent, name.to_os_string());
        match self.negative.get(&key) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                self.negative.pop(&key);
                false
            }
            None => false,
        }
    }

    /// How much longer this cache answers that `name` is not in `parent`: what is left of its
    /// negative entry, or of a listing of `parent` that does not show it, at most the negative
    /// TTL ("no such file" answers are kept no longer than that, wherever they come from).
    /// An answer a listing gives is kept as a negative entry for as long: what drops the
    /// negative entries of a directory ([`MetaCache::listing_contradicted`]) then knows the
    /// kernel may be keeping that answer too (short of `max_entries`: an entry the LRU lets go
    /// is not reported, and the kernel keeps it for the rest of its TTL). None: it does not
    /// know, and would ask (always so with a negative TTL of 0).
    pub fn absent_for(&mut self, parent: Ino, name: &OsStr) -> Option<Duration> {
        let now = Instant::now();
        let key = (parent, name.to_os_string());
        if let Some(until) = self.negative.peek(&key).filter(|until| **until > now) {
            return Some((*until - now).min(self.config.negative_ttl)).filter(|d| !d.is_zero());
        }
        let until = match self.dirs.peek(&parent) {
            Some((listing, until)) if *until > now && !listing.iter().any(|e| e.name == name) => {
                (*until).min(now + self.config.negative_ttl)
            }
            _ => return None,
        };
        if until <= now {
            return None;
        }
        self.negative.put(key, until);
        Some(until - now)
    }

    pub fn put_negative(&mut self, parent: Ino, name: &OsStr) {
        if self.config.negative_ttl.is_zero() {
            return;
        }
        self.negative.put(
            (parent, name.to_os_string()),
            Instant::now() + self.config.negative_ttl,
        );
    }

    /// A name in `parent` changed in a way we cannot describe: forget what we knew of it and
    /// of the directory's listing.
    pub fn name_changed(&mut self, parent: Ino, name: &OsStr) {
        self.names_changed_in(parent);
        self.negative.pop(&(parent, name.to_os_string()));
        self.dirs.pop(&parent);
        self.attrs.pop(&parent);
    }

    /// The server contradicted what is cached of `dir`: it refused to remove the directory,
    /// or to rename one over it, as not empty, so names were added there on the server. What
    /// we knew of its names (its listing, names known to be absent) is dropped, so that the
    /// next look (`ls` after the failed `rm -rf`) asks the server, and a listing on its way
    /// from before is not trusted either.
    /// Returns the names whose negative entries were dropped.
    pub fn listing_contradicted(&mut self, dir: Ino) -> Vec<OsString> {
        self.names_changed_in(dir);
        self.dirs.pop(&dir);
        self.attrs.pop(&dir);
        let absent: Vec<_> = self
            .negative
            .iter()
            .filter(|((parent, _), _)| *parent == dir)
            .map(|(key, _)| key.clone())
            .collect();
        absent
            .into_iter()
            .map(|key| {
                self.negative.pop(&key);
                key.1
            })
            .collect()
    }

    /// `entry` was created in `parent` through the mount. A cached listing of `parent` stays
    /// valid with the entry added (so lookups of the next names created there, which the
    /// kernel makes before every create, need no round trip).
    pub fn name_added(&mut self, parent: Ino, entry: DirEntry) {
        self.names_changed_in(parent);
        self.negative.pop(&(parent, entry.name.clone()));
        self.attrs.pop(&parent);
        if let Some((listing, _)) = self.dirs.get_mut(&parent) {
            let listing = Arc::make_mut(listing);
            listing.retain(|e| e.name != entry.name);
            listing.push(entry);
        }
    }

    /// `name` was removed from `parent` through the mount.
    pub fn name_removed(&mut self, parent: Ino, name: &OsStr) -> Option<DirEntry> {
        self.names_changed_in(parent);
        self.negative.pop(&(parent, name.to_os_string()));
        self.attrs.pop(&parent);
        let (listing, _) = self.dirs.get_mut(&parent)?;
        let listing = Arc::make_mut(listing);
        let pos = listing.iter().position(|e| e.name == name)?;
        Some(listing.swap_remove(pos))
    }

    /// The fresh listing of `dir`, if one is cached.
    pub fn get_dir(&mut self, dir: Ino) -> Option<Arc<Vec<DirEntry>>> {
        match self.dirs.get(&dir) {
            Some((l, until)) if *until > Instant::now() => Some(l.clone()),
            Some(_) => {
                self.dirs.pop(&dir);
                None
            }
            None => None,
        }
    }

    /// `dir` was just made through the mount, owned by `owner` (its uid and gid), and its
    /// (empty) listing was kept with [`MetaCache::put_dir`].
    pub fn made_dir(&mut self, dir: Ino, owner: (u32, u32)) {
        self.made_dirs.put(dir, owner);
    }

    /// The owner a new file made in `dir` gets, if the mount can vouch that `dir` has no
    /// `name`: `dir` was made through the mount, and its listing is still the one kept since
    /// then, which every name made or removed through the mount changes, within the listing
    /// TTL; `name` is not in it. (A file made in it on the server's side within that time is
    /// what it cannot know of, as for any listing kept.) The server's account made `dir`, so
    /// it gets the same owner and group as a new file there: the account's group, or the
    /// group of `dir` if `dir` is set-gid, which `dir` then got from its own parent.
    pub fn made_dir_lacks(&mut self, dir: Ino, name: &OsStr) -> Option<(u32, u32)> {
        let owner = *self.made_dirs.get(&dir)?;
        let listing = self.get_dir(dir)?;
        (!listing.iter().any(|e| e.name == name)).then_some(owner)
    }

    /// [`MetaCache::put_dir_until`] for the full listing TTL. (The names it returns are not:
    /// the mount gives this way only the empty listing of a directory it just made.)
    pub fn put_dir(&mut self, dir: Ino, listing: Arc<Vec<DirEntry>>) {
        let until = Instant::now() + self.config.dir_ttl;
        self.put_dir_until(dir, listing, until);
    }

    /// Keep a listing fetched ahead by `path` for a directory without an inode (yet). Dropped
    /// if a name changed through the mount since it was asked for: it may predate that change.
    pub fn put_dir_ahead(&mut self, path: PathBuf, listed: ListedAhead) {
        if !self.config.dir_ttl.is_zero() && self.still_good(&listed) {
            self.shared_ahead |= listed.listing.iter().any(multiply_linked);
            self.dirs_ahead.put(path, listed);
        }
    }

    /// Whether a listing fetched ahead by path may still be used: no name changed through the
    /// mount since it was asked for, and it has not expired.
    pub fn still_good(&self, listed: &ListedAhead) -> bool {
        listed.names_since == self.names_clock && listed.until > Instant::now()
    }

    /// A listing fetched ahead by `path` that may still be used. Left in place: the inode
    /// made for the path takes it.
    pub fn peek_dir_ahead(&mut self, path: &Path) -> Option<ListedAhead> {
        match self.dirs_ahead.get(path) {
            Some(l) if l.until > Instant::now() => Some(l.clone()),
            Some(_) => {
                self.dirs_ahead.pop(path);
                None
            }
            None => None,
        }
    }

    /// Take the listing fetched ahead by `path`, if one that may still be used is there.
    pub fn take_dir_ahead(&mut self, path: &Path) -> Option<ListedAhead> {
        self.dirs_ahead
            .pop(path)
            .filter(|l| l.until > Instant::now())
    }

    pub fn has_dirs_ahead(&self) -> bool {
        !self.dirs_ahead.is_empty()
    }

    /// Cache `dir`'s listing until `until` (a listing fetched ahead keeps the lifetime it had
    /// from when it was asked for). Returns the names it shows that were known absent.
    pub fn put_dir_until(
        &mut self,
        dir: Ino,
        listing: Arc<Vec<DirEntry>>,
        until: Instant,
    ) -> Vec<OsString> {
        if self.config.dir_ttl.is_zero() || until <= Instant::now() {
            return Vec::new();
        }
        self.note_shared(dir, &listing);
        let shown = self.drop_negatives_listed(dir, &listing);
        // A listing in place of the one kept since the mkdir: made_dir says so again.
        self.made_dirs.pop(&dir);
        self.dirs.put(dir, (listing, until));
        shown
    }

    /// A listing newer than a negative entry of a name it shows answers for that name: the
    /// entry goes. Returns those names (the kernel may be keeping them as absent too).
    fn drop_negatives_listed(&mut self, dir: Ino, listing: &[DirEntry]) -> Vec<OsString> {
        if self.negative.is_empty() {
            return Vec::new();
        }
        listing
            .iter()
            .filter_map(|e| {
                self.negative
                    .pop(&(dir, e.name.clone()))
                    .map(|_| e.name.clone())
            })
            .collect()
    }

    fn note_shared(&mut self, dir: Ino, listing: &[DirEntry]) {
        if listing.iter().any(multiply_linked) {
            // Bounded like the listings: past that, act as if such a file had changed
            // (the entries noted so far ask the server again), which is always safe.
            if self.shared_dirs.len() >= 2 * dir_cap(&self.config).get() {
                self.shared_data_changed();
            }
            self.shared_dirs.insert(dir);
        }
    }

    /// A file that may have links made on the server changed through the mount: whatever a
    /// cached listing says of a file with links it cannot name may be that file's old
    /// attributes. Those entries' attributes become unknown (a lookup asks the server), the
    /// listings fetched ahead showing one go, and on the change clock their directories
    /// changed, so that a listing of them on its way, and a file fetched ahead by name from
    /// them, are not trusted either.
    pub fn shared_data_changed(&mut self) {
        let dirs: Vec<Ino> = self.shared_dirs.drain().collect();
        for dir in dirs {
            if let Some((listing, _)) = self.dirs.get_mut(&dir) {
                for e in Arc::make_mut(listing).iter_mut() {
                    if multiply_linked(e) {
                        e.attrs.size = None;
                    }
                }
            }
            self.clock += 1;
            self.changed.insert(dir, self.clock);
        }
        if std::mem::take(&mut self.shared_ahead) {
            let gone: Vec<PathBuf> = self
                .dirs_ahead
                .iter()
                .filter(|(_, l)| l.listing.iter().any(multiply_linked))
                .map(|(p, _)| p.clone())
                .collect();
            for p in gone {
                self.dirs_ahead.pop(&p);
            }
        }
    }

    /// Names changed in directory `name` of `parent` at `now` (this machine's clock, whole
    /// seconds): the server moved its mtime then, which a cached listing of `parent` shows
    /// (never backwards) until the server's own is asked for. Exact attributes would cost a
    /// round trip at each lookup of the directory answered from that listing, and a moved
    /// mtime is what matters to those who look (Python's import finder, make).
    pub fn listing_dir_touched(&mut self, parent: Ino, name: &OsStr, now: crate::remote::Seconds) {
        self.update_listed(parent, name, |e| {
            e.attrs.mtime = Some(e.attrs.mtime.map_or(now, |m| m.max(now)));
        });
    }

    /// The listing entry of `name` in `parent` now has these attributes, or (`None`) ones we
    /// do not know: the entry still says the name exists and its type, but a lookup must ask
    /// the server for the attributes. "Unknown" is marked by an absent size, which a listing
    /// from the server never has.
    pub fn listing_update(&mut self, parent: Ino, name: &OsStr, attrs: Option<Attrs>) {
        if let Some((listing, _)) = self.dirs.get_mut(&parent) {
            let listing = Arc::make_mut(listing);
            if let Some(e) = listing.iter_mut().find(|e| e.name == name) {
                match attrs {
                    Some(a) => e.attrs = a,
                    None => e.attrs.size = None,
                }
                if attrs.is_some() && multiply_linked(e) {
                    self.shared_dirs.insert(parent);
                }
            }
        }
    }

    /// The link count of the file named `name` in `parent` changed through the mount (a link
    /// or unlink of another of its names): a cached listing shows `known`, the inode table's
    /// count (none if unknown), never the one from before, which a lookup answered from the
    /// listing would take over.
    pub fn listing_nlink(&mut self, parent: Ino, name: &OsStr, known: Option<u32>) {
        self.update_listed(parent, name, |e| e.nlink = known);
    }

    /// A subdirectory of directory `name` of `parent` came (`delta` 1) or went (-1) through
    /// the mount: a cached listing of `parent` shows the link count `known` (the inode
    /// table's), else its own count moved by `delta`, never one from before (a lookup
    /// answered from the listing would take it over).
    pub fn listing_subdirs_changed(
        &mut self,
        parent: Ino,
        name: &OsStr,
        known: Option<u32>,
        delta: i32,
    ) {
        self.update_listed(parent, name, |e| {
            e.nlink = match (known, e.nlink) {
                (Some(n), _) => Some(n),
                (None, Some(n)) if n >= 2 => Some(super::inode::subdir_count(n, delta)),
                (None, listed) => listed,
            }
        });
    }

    /// The entry of `name` in the cached listing of `parent`, changed by `change` (the
    /// listing is copied only if that changes it: readdirs may be holding it).
    fn update_listed(&mut self, parent: Ino, name: &OsStr, change: impl FnOnce(&mut DirEntry)) {
        let Some((listing, _)) = self.dirs.get_mut(&parent) else {
            return;
        };
        let Some(pos) = listing.iter().position(|e| e.name == name) else {
            return;
        };
        let mut entry = listing[pos].clone();
        change(&mut entry);
        if listing[pos] != entry {
            Arc::make_mut(listing)[pos] = entry;
        }
    }

    /// Attributes of a regular file fetched from the server since its last change through
    /// the mount fill its listing entry if that entry's attributes are unknown (see
    /// [`MetaCache::listing_update`]), so that the next walk of the directory (`du`, `find`,
    /// `ls -l` within the listing's lifetime) is answered from the listing instead of asking
    /// the server again for every file it wrote. Only a regular file whose entry is one too:
    /// a symlink's entry is the link itself, whatever the fetch followed.
    pub fn listing_fill(&mut self, parent: Ino, name: &OsStr, attrs: Attrs) {
        if attrs.file_type() != FileKind::File {
            return;
        }
        if let Some((listing, _)) = self.dirs.get_mut(&parent) {
            let unknown = |e: &DirEntry| {
                e.name == name && e.attrs.size.is_none() && e.attrs.file_type() == FileKind::File
            };
            if listing.iter().any(unknown) {
                let listing = Arc::make_mut(listing);
                if let Some(e) = listing.iter_mut().find(|e| unknown(e)) {
                    e.attrs = attrs;
                    if multiply_linked(e) {
                        self.shared_dirs.insert(parent);
                    }
                }
            }
        }
    }

    /// Answer a lookup from a cached listing: `Some(Some(entry))` found, `Some(None)` the
    /// listing is fresh and the name is not in it, `None` no fresh listing.
    pub fn lookup_in_dir(&mut self, dir: Ino, name: &OsStr) -> Option<Option<DirEntry>> {
        let listing = self.get_dir(dir)?;
        Some(listing.iter().find(|e| e.name == name).cloned())
    }

    pub fn get_link(&mut self, ino: Ino) -> Option<PathBuf> {
        match self.links.get(&ino) {
            Some((t, until)) if *until > Instant::now() => Some(t.clone()),
            Some(_) => {
                self.links.pop(&ino);
                None
            }
            None => None,
        }
    }

    pub fn put_link(&mut self, ino: Ino, target: PathBuf) {
        if self.config.attr_ttl.is_zero() {
            return;
        }
        self.links
            .put(ino, (target, Instant::now() + self.config.attr_ttl));
    }

    /// Drop everything (e.g. after a reconnect, when the server may have changed under us).
    pub fn clear(&mut self) {
        self.statvfs = None;
        self.attrs.clear();
        self.negative.clear();
        self.dirs.clear();
        self.dirs_ahead.clear();
        self.made_dirs.clear();
        self.links.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(size: u64) -> CachedAttrs {
        CachedAttrs {
            attrs: Attrs {
                size: Some(size),
                ..Default::default()
            },
            nlink: None,
        }
    }

    /// A tree of a million entries walked through the caches (attributes, names that do
    /// not exist, listings, link targets): each cache keeps at most its bound, so memory
    /// depends on `max_entries`, not on the size of the tree.
    #[test]
    fn a_million_entry_walk_stays_within_the_bound() {
        let max = 4096;
        let mut c = MetaCache::new(CacheConfig {
            max_entries: max,
            ..CacheConfig::default()
        });
        let listing = Arc::new(vec![DirEntry {
            name: "f".into(),
            attrs: attrs(1).attrs,
            nlink: None,
        }]);
        for ino in 2..1_000_002u64 {
            c.touch(ino);
            c.put_attrs(ino, attrs(ino));
            c.put_negative(ino, OsStr::new("missing"));
            c.put_link(ino, PathBuf::from("target"));
            if ino % 64 == 0 {
                c.put_dir(ino, listing.clone());
            }
        }
        assert_eq!(c.attrs.len(), max, "attributes");
        assert_eq!(c.negative.len(), max, "negative lookups");
        assert_eq!(c.links.len(), max / 4, "link targets");
        assert_eq!(c.dirs.len(), max / 64, "listings");
        // The most recent entries are the ones kept.
        assert_eq!(c.get_attrs(1_000_001).unwrap().attrs.size, Some(1_000_001));
        assert!(c.get_attrs(2).is_none());
        // The change clock keeps one number per inode the kernel still holds (as the inode
        // table does); the kernel forgetting them empties it.
        for ino in 2..1_000_002u64 {
            c.forget_inode(ino);
        }
        assert!(c.changed.is_empty());
        assert!(c.len() <= 2 * max);
    }

    #[test]
    fn entries_expire() {
        let mut c = MetaCache::new(CacheConfig {
            attr_ttl: Duration::from_millis(0),
            ..Default::default()
        });
        c.put_attrs(5, attrs(1));
        assert!(c.get_attrs(5).is_none(), "zero TTL caches nothing");
        let mut c = MetaCache::new(CacheConfig::default());
        c.put_attrs(5, attrs(1));
        assert_eq!(c.get_attrs(5).unwrap().attrs.size, Some(1));
    }

    #[test]
    fn bounded_by_max_entries() {
        let mut c = MetaCache::new(CacheConfig {
            max_entries: 100,
            ..Default::default()
        });
        for i in 0..1_000_000u64 {
            c.put_attrs(i, attrs(i));
            c.put_negative(i, OsStr::new("x"));
        }
        assert!(c.len() <= 200);
    }

    #[test]
    fn name_change_invalidates_listing_and_negative() {
        let mut c = MetaCache::new(CacheConfig::default());
        c.put_negative(1, OsStr::new("a"));
        c.put_dir(1, Arc::new(vec![]));
        assert_eq!(c.lookup_in_dir(1, OsStr::new("a")), Some(None));
        c.name_changed(1, OsStr::new("a"));
        assert!(!c.is_negative(1, OsStr::new("a")));
        assert_eq!(c.lookup_in_dir(1, OsStr::new("a")), None);
    }

    /// What the kernel may keep of an absence: what is left of the cache's own answer, a
    /// listing's included, and never more than the negative TTL.
    #[test]
    fn absent_for_is_what_is_left_of_the_answer_at_most_the_negative_ttl() {
        // Long TTLs: no stall of the test thread can run them out.
        let config = CacheConfig {
            negative_ttl: Duration::from_secs(100),
            dir_ttl: Duration::from_secs(1000),
            ..CacheConfig::default()
        };
        let mut c = MetaCache::new(config);
        let at_most_negative_ttl =
            |d: Option<Duration>| d.is_some_and(|d| !d.is_zero() && d <= Duration::from_secs(100));
        assert_eq!(c.absent_for(1, OsStr::new("a")), None, "nothing known");
        c.put_negative(1, OsStr::new("a"));
        assert!(at_most_negative_ttl(c.absent_for(1, OsStr::new("a"))));
        assert_eq!(c.absent_for(2, OsStr::new("a")), None, "another directory");
        // A listing answers for the names it lacks, for at most the negative TTL.
        c.put_dir(
            2,
            Arc::new(vec![DirEntry {
                name: "f".into(),
                attrs: attrs(1).attrs,
                nlink: None,
            }]),
        );
        assert!(at_most_negative_ttl(c.absent_for(2, OsStr::new("a"))));
        assert_eq!(c.absent_for(2, OsStr::new("f")), None, "listed");
        // Expired answers give nothing.
        c.expire_all();
        assert_eq!(c.absent_for(1, OsStr::new("a")), None);
        assert_eq!(c.absent_for(2, OsStr::new("a")), None);
        // A negative TTL of 0: listings do not answer for absent names either.
        let mut c = MetaCache::new(CacheConfig {
            negative_ttl: Duration::ZERO,
            ..config
        });
        c.put_dir(2, Arc::new(vec![]));
        assert_eq!(c.absent_for(2, OsStr::new("a")), None);
    }
}
