//! Small files read ahead of their `open`, a directory at a time.
//!
//! `grep -r`, `cp -r` and `git status` (when it rehashes) open the small files of a directory
//! one after another, and every one costs OPEN, then READ: two round trips in a row, per file,
//! which is most of their time on any real link (see docs/PERFORMANCE.md). Once a *second*
//! file of a directory is opened for reading, the next small regular files of the directory's
//! cached listing are fetched in the background (OPEN, READ, CLOSE; many at once), and an
//! open that finds its file fetched is answered from memory, without a round trip.
//!
//! Which files come next depends on the tool. `grep -r` and `cp -r` read a directory in the
//! order it is listed; `git status` rehashes in index order, which is by name. In a big
//! directory, fetching in the wrong order fills the window with files read much later, and
//! the opens in between all go to the server. So the next files are taken in the order the
//! last two opens in the directory followed: listing order if the second came right after
//! the first in the listing, name order (bytewise, as git sorts) after the last name if it
//! sorted after the first, listing order otherwise. A directory with one open so far gets
//! the order found in the directory read before it.
//!
//! While files are being read one after another (three opens for reading within
//! [`READING_WINDOW`], wherever they are), a tool is walking a tree: then the first open in a
//! directory, and the directory's `opendir`, are enough (trees of small directories, where a
//! second open would leave nothing to fetch). A lone `cat` or an editor opening one file
//! fetches nothing.
//!
//! What keeps this honest (checked by `Fs::open_prefetched` before a snapshot is used):
//! * a snapshot is used at most once and only while younger than the attribute TTL, the
//!   promise the attribute cache already makes: a change made on the server shows within it;
//! * nothing changed the file, or a name in its directory, through the mount since the fetch
//!   was planned (the change clock, `MetaCache::changed_since`), and no descriptor of the file
//!   was open when it was planned (so no write of ours can still be on its way);
//! * the read returned exactly the size in the listing (one byte more is asked for, so a file
//!   that grew is noticed), and that size and mtime are still what the kernel was told;
//! * a file the server would not open for us is not fetched, so its open fails as before.
//!
//! Memory: at most [`AHEAD_BYTES`] of snapshots not yet opened, mount-wide, each file at most
//! [`SMALL_FILE_MAX`]; at most [`AHEAD_PER_DIR`] files ahead per directory.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::num::NonZeroUsize;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use lru::LruCache;
use tokio::sync::OnceCell;

use super::inode::Ino;
use crate::remote::{Attrs, DirEntry, FileKind};

/// Largest file fetched ahead: one READ of OpenSSH's size fits it.
pub const SMALL_FILE_MAX: u64 = 128 * 1024;
/// Bytes of fetched-ahead files not yet opened, mount-wide.
pub const AHEAD_BYTES: u64 = 8 * 1024 * 1024;
/// Files fetched ahead and not yet opened, per directory.
pub const AHEAD_PER_DIR: usize = 32;
/// Files being fetched at once, mount-wide (each holds one server handle meanwhile).
pub const MAX_FILE_FETCHES: usize = 32;
/// Files fetched ahead in a directory a tool reading through a tree has not entered yet
/// (`Fs::first_files_ahead`): its first opens there, the rest when it opens the directory.
pub const FIRST_FILES_AHEAD: usize = 4;
/// Directories whose read pattern is remembered.
const MAX_DIRS: usize = 256;
/// Opens for reading this close together mean a tool is reading through files.
pub const READING_WINDOW: Duration = Duration::from_secs(2);
const READING_OPENS: usize = 3;
/// Names remembered per directory as already opened or fetched (a bigger directory stops
/// being read ahead past that many).
const MAX_HANDLED: usize = 4096;

/// A small file's content as the server had it when it was fetched.
#[derive(Debug)]
pub struct Snapshot {
    pub data: Bytes,
    /// The attributes from the listing the fetch was planned from (the data matched its size).
    pub attrs: Attrs,
    /// When the fetch was planned: the snapshot is as old as that.
    pub planned: Instant,
    /// The change clock then.
    pub since: u64,
    /// No data: an open answered without asking the server, because the kernel keeps its
    /// cached pages of the file (see `Fs::open_deferred`); the first read that reaches us
    /// opens the file on the server.
    pub deferred: bool,
}

/// A fetch ahead: empty until the fetch ends, then the snapshot or `None` if it failed. An
/// open that finds the fetch running waits for it instead of asking the server again.
pub type Slot = Arc<OnceCell<Option<Arc<Snapshot>>>>;

/// One file to fetch: the name in the directory, its listed attributes and where to put it.
pub struct Planned {
    pub name: OsString,
    pub attrs: Attrs,
    pub slot: Slot,
}

struct Pending {
    slot: Slot,
    bytes: u64,
    planned: Instant,
}

#[derive(Default)]
struct DirPattern {
    /// Files of the directory opened for reading.
    opens: u32,
    /// Names opened or fetched ahead already (never fetched again this round).
    handled: HashSet<OsString>,
    /// The two names opened last (the older first).
    last_two: [Option<OsString>; 2],
}

/// The order a tool reads a directory's files in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadOrder {
    /// As the server lists them (`grep -r`, `cp -r`).
    Listing,
    /// By name, bytewise (`git status`, which follows its index).
    ByName,
}

impl DirPattern {
    /// The order the last two opens followed, if they tell (both names are in the listing).
    fn order(&self, listing: &[DirEntry]) -> Option<ReadOrder> {
        let [Some(prev), Some(last)] = &self.last_two else {
            return None;
        };
        let at = |n: &OsString| listing.iter().position(|e| &e.name == n);
        let (p, l) = (at(prev)?, at(last)?);
        Some(if l == p + 1 {
            ReadOrder::Listing
        } else if last.as_bytes() > prev.as_bytes() {
            ReadOrder::ByName
        } else {
            ReadOrder::Listing
        })
    }
}

struct State {
    /// Fetches not yet taken by an open, by (directory, name), oldest first.
    pending: LruCache<(Ino, OsString), Pending>,
    bytes: u64,
    dirs: LruCache<Ino, DirPattern>,
    /// When the last few files were opened for reading (oldest first).
    recent_opens: std::collections::VecDeque<Instant>,
    /// [`READING_WINDOW`] (longer in tests, which must not depend on how fast they run).
    reading_window: Duration,
    /// The order found in the directory planned last, for one that does not tell yet.
    last_order: ReadOrder,
}

impl State {
    /// Fetches of `dir` no open has taken yet.
    fn ahead_in(&self, dir: Ino) -> usize {
        self.pending.iter().filter(|((d, _), _)| *d == dir).count()
    }

    fn reading_through(&self) -> bool {
        self.recent_opens.len() >= READING_OPENS
            && self.recent_opens[0].elapsed() < self.reading_window
    }
}

pub struct SmallFileAhead {
    state: Mutex<State>,
}

impl Default for SmallFileAhead {
    fn default() -> Self {
        Self::with_reading_window(READING_WINDOW)
    }
}

impl SmallFileAhead {
    fn with_reading_window(reading_window: Duration) -> Self {
        let cap = |n: usize| NonZeroUsize::new(n).expect("non-zero constant");
        SmallFileAhead {
            state: Mutex::new(State {
                pending: LruCache::new(cap(AHEAD_BYTES as usize / 1024)),
                bytes: 0,
                dirs: LruCache::new(cap(MAX_DIRS)),
                recent_opens: std::collections::VecDeque::with_capacity(READING_OPENS + 1),
                reading_window,
                last_order: ReadOrder::Listing,
            }),
        }
    }
}

impl SmallFileAhead {
    /// `name` in `dir` is being opened for reading. Returns its fetch, if one was made (taken
    /// out: a snapshot serves one open), and whether more of the directory should be fetched.
    pub fn opened(&self, dir: Ino, name: &OsStr) -> (Option<Slot>, bool) {
        let mut s = self.state.lock().unwrap();
        let slot = s.pending.pop(&(dir, name.to_os_string())).map(|p| {
            s.bytes -= p.bytes;
            p.slot
        });
        let pattern = s.dirs.get_or_insert_mut(dir, DirPattern::default);
        if pattern.handled.len() < MAX_HANDLED {
            pattern.handled.insert(name.to_os_string());
        }
        pattern.opens = pattern.opens.saturating_add(1);
        pattern.last_two.rotate_left(1);
        pattern.last_two[1] = Some(name.to_os_string());
        let second_here = pattern.opens >= 2;
        s.recent_opens.push_back(Instant::now());
        if s.recent_opens.len() > READING_OPENS {
            s.recent_opens.pop_front();
        }
        let ahead = s.ahead_in(dir);
        let more = (second_here || s.reading_through()) && ahead < AHEAD_PER_DIR / 2;
        (slot, more)
    }

    /// Tests make the window long, so that they do not depend on how fast they run.
    #[cfg(test)]
    pub fn set_reading_window(&self, window: Duration) {
        self.state.lock().unwrap().reading_window = window;
    }

    /// `dir` is being opened for listing: whether its small files should be fetched now
    /// (only while a tool is reading through files: the walk is about to read this one).
    pub fn listing(&self) -> bool {
        self.state.lock().unwrap().reading_through()
    }

    /// Choose the next files of `dir`'s `listing` to fetch: regular files of known size up
    /// to [`SMALL_FILE_MAX`] not handled yet, in the order the tool reads the directory (see
    /// the module doc), within the per-directory and mount-wide bounds.
    /// `skip` says which names must not be fetched (a descriptor of them is open). Fetches
    /// older than `ttl` that no open took are dropped first.
    pub fn plan(
        &self,
        dir: Ino,
        listing: &[DirEntry],
        ttl: Duration,
        skip: impl Fn(&OsStr) -> bool,
    ) -> Vec<Planned> {
        self.plan_up_to(dir, listing, ttl, AHEAD_PER_DIR, skip)
    }

    /// [`plan`](Self::plan), at most `max` files this time.
    pub fn plan_up_to(
        &self,
        dir: Ino,
        listing: &[DirEntry],
        ttl: Duration,
        max: usize,
        skip: impl Fn(&OsStr) -> bool,
    ) -> Vec<Planned> {
        let mut s = self.state.lock().unwrap();
        while let Some((_, p)) = s.pending.peek_lru() {
            if p.planned.elapsed() < ttl {
                break;
            }
            if let Some((_, p)) = s.pending.pop_lru() {
                s.bytes -= p.bytes;
            }
        }
        let mut ahead = s.ahead_in(dir);
        let planned = Instant::now();
        let mut out = Vec::new();
        let pattern = s.dirs.get_or_insert_mut(dir, DirPattern::default);
        let told = pattern.order(listing);
        let after = pattern.last_two[1].clone();
        let order = told.unwrap_or(s.last_order);
        if let Some(o) = told {
            s.last_order = o;
        }
        let by_name;
        let candidates: &[DirEntry] = match (order, after) {
            (ReadOrder::ByName, Some(after)) => {
                by_name = next_by_name(listing, &after, AHEAD_PER_DIR * 2);
                &by_name
            }
            _ => listing,
        };
        for e in candidates {
            if ahead >= AHEAD_PER_DIR || out.len() >= max {
                break;
            }
            let Some(size) = e.attrs.size else { continue };
            if e.attrs.file_type() != FileKind::File
                || size > SMALL_FILE_MAX
                || s.bytes + size > AHEAD_BYTES
            {
                continue;
            }
            let pattern = s.dirs.get_or_insert_mut(dir, DirPattern::default);
            if pattern.handled.len() >= MAX_HANDLED || pattern.handled.contains(&e.name) {
                continue;
            }
            if skip(&e.name) {
                continue;
            }
            pattern.handled.insert(e.name.clone());
            let slot: Slot = Arc::default();
            let key = (dir, e.name.clone());
            let pending = Pending {
                slot: slot.clone(),
                bytes: size,
                planned,
            };
            if let Some((_, evicted)) = s.pending.push(key, pending) {
                s.bytes -= evicted.bytes;
            }
            s.bytes += size;
            ahead += 1;
            out.push(Planned {
                name: e.name.clone(),
                attrs: e.attrs,
                slot,
            });
        }
        out
    }

    /// A fetch failed: forget it, so its bytes count no more (an open of the file goes to
    /// the server as usual).
    pub fn failed(&self, dir: Ino, name: &OsStr, slot: &Slot) {
        let mut s = self.state.lock().unwrap();
        let key = (dir, name.to_os_string());
        if s.pending
            .peek(&key)
            .is_some_and(|p| Arc::ptr_eq(&p.slot, slot))
        {
            if let Some(p) = s.pending.pop(&key) {
                s.bytes -= p.bytes;
            }
        }
    }

    /// Bytes of fetched files waiting for their open (for tests and status).
    pub fn bytes_waiting(&self) -> u64 {
        self.state.lock().unwrap().bytes
    }
}

/// The `n` entries of `listing` that come first by name after `after` (bytewise), in that
/// order: a selection, not a sort of the whole listing, which may be large.
fn next_by_name(listing: &[DirEntry], after: &OsStr, n: usize) -> Vec<DirEntry> {
    let mut later: Vec<&DirEntry> = listing
        .iter()
        .filter(|e| e.name.as_bytes() > after.as_bytes())
        .collect();
    let by_name = |a: &&DirEntry, b: &&DirEntry| a.name.as_bytes().cmp(b.name.as_bytes());
    if later.len() > n {
        later.select_nth_unstable_by(n, by_name);
        later.truncate(n);
    }
    later.sort_unstable_by(by_name);
    later.into_iter().cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, size: u64) -> DirEntry {
        DirEntry {
            name: name.into(),
            attrs: Attrs {
                size: Some(size),
                mode: Some(libc::S_IFREG | 0o644),
                mtime: Some(1),
                ..Attrs::default()
            },
            nlink: Some(1),
        }
    }

    const TTL: Duration = Duration::from_secs(20);

    #[test]
    fn a_second_open_in_a_directory_plans_the_small_files_not_yet_opened() {
        let ahead = SmallFileAhead::default();
        let mut listing: Vec<DirEntry> = (0..5).map(|i| file(&format!("f{i}"), 10)).collect();
        listing.push(file("big", SMALL_FILE_MAX + 1));
        let mut dir = file("sub", 0);
        dir.attrs.mode = Some(libc::S_IFDIR | 0o755);
        listing.push(dir);

        assert!(
            !ahead.opened(1, OsStr::new("f0")).1,
            "one open is no pattern"
        );
        let (slot, more) = ahead.opened(1, OsStr::new("f1"));
        assert!(slot.is_none() && more);
        let planned = ahead.plan(1, &listing, TTL, |n| n == "f3");
        let names: Vec<_> = planned.iter().map(|p| p.name.clone()).collect();
        assert_eq!(
            names,
            ["f2", "f4"],
            "not opened, not skipped, small, regular"
        );
        assert_eq!(ahead.bytes_waiting(), 20);
        // Planned once: a second plan finds only what was skipped.
        assert!(
            ahead.plan(1, &listing, TTL, |_| false).len() == 1,
            "only f3 is left"
        );

        let (slot, _) = ahead.opened(1, OsStr::new("f2"));
        assert!(slot.is_some(), "the open takes its fetch");
        assert!(
            ahead.opened(1, OsStr::new("f2")).0.is_none(),
            "a snapshot serves one open"
        );
    }

    #[test]
    fn opens_in_quick_succession_anywhere_make_a_first_open_or_a_listing_enough() {
        // "Quick" is an hour here: a stalled test thread must not make the opens look apart.
        let ahead = SmallFileAhead::with_reading_window(Duration::from_secs(3600));
        assert!(!ahead.listing(), "nothing read yet");
        assert!(!ahead.opened(1, OsStr::new("a")).1);
        assert!(!ahead.opened(2, OsStr::new("b")).1);
        assert!(
            ahead.opened(3, OsStr::new("c")).1,
            "third file read in a row"
        );
        assert!(ahead.listing());
        let listing = vec![file("x", 10), file("y", 10)];
        assert_eq!(ahead.plan(4, &listing, TTL, |_| false).len(), 2);
    }

    #[test]
    fn bounded_per_directory_and_in_bytes_and_expired_fetches_are_dropped() {
        let ahead = SmallFileAhead::default();
        let listing: Vec<DirEntry> = (0..100).map(|i| file(&format!("f{i}"), 1000)).collect();
        ahead.opened(7, OsStr::new("x"));
        ahead.opened(7, OsStr::new("y"));
        assert_eq!(ahead.plan(7, &listing, TTL, |_| false).len(), AHEAD_PER_DIR);
        assert_eq!(ahead.plan(7, &listing, TTL, |_| false).len(), 0);

        let big: Vec<DirEntry> = (0..100)
            .map(|i| file(&format!("g{i}"), SMALL_FILE_MAX))
            .collect();
        ahead.opened(8, OsStr::new("x"));
        ahead.opened(8, OsStr::new("y"));
        ahead.plan(8, &big, TTL, |_| false);
        assert!(ahead.bytes_waiting() <= AHEAD_BYTES);

        // A TTL of zero: everything waiting is too old to use and is dropped.
        ahead.plan(9, &[], Duration::ZERO, |_| false);
        assert_eq!(ahead.bytes_waiting(), 0);
    }

    fn names(planned: &[Planned]) -> Vec<String> {
        planned
            .iter()
            .map(|p| p.name.to_string_lossy().into_owned())
            .collect()
    }

    /// A listing in no particular order (as ext4 lists): n0..n9 shuffled.
    fn shuffled() -> Vec<DirEntry> {
        [7, 2, 9, 0, 5, 3, 8, 1, 6, 4]
            .iter()
            .map(|i| file(&format!("n{i}"), 10))
            .collect()
    }

    #[test]
    fn files_opened_by_name_are_fetched_next_by_name() {
        let ahead = SmallFileAhead::default();
        let listing = shuffled();
        ahead.opened(1, OsStr::new("n0"));
        ahead.opened(1, OsStr::new("n1"));
        assert_eq!(
            names(&ahead.plan(1, &listing, TTL, |_| false)),
            ["n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9"],
            "git status reads its index by name"
        );
    }

    #[test]
    fn files_opened_in_listing_order_are_fetched_in_listing_order() {
        let ahead = SmallFileAhead::default();
        let listing = shuffled();
        // n7 then n2: next to each other in the listing (and not ascending by name).
        ahead.opened(1, OsStr::new("n7"));
        ahead.opened(1, OsStr::new("n2"));
        assert_eq!(
            names(&ahead.plan(1, &listing, TTL, |_| false)),
            ["n9", "n0", "n5", "n3", "n8", "n1", "n6", "n4"],
            "grep -r reads in listing order"
        );
        // Two ascending names that are also neighbours in the listing: listing order.
        let ahead = SmallFileAhead::default();
        ahead.opened(2, OsStr::new("n5"));
        ahead.opened(2, OsStr::new("n3"));
        ahead.opened(2, OsStr::new("n8"));
        assert_eq!(
            names(&ahead.plan(2, &listing, TTL, |_| false)),
            ["n7", "n2", "n9", "n0", "n1", "n6", "n4"]
        );
    }

    #[test]
    fn a_directory_with_one_open_takes_the_order_of_the_one_before() {
        let ahead = SmallFileAhead::default();
        let listing = shuffled();
        ahead.opened(1, OsStr::new("n0"));
        ahead.opened(1, OsStr::new("n1"));
        ahead.plan(1, &listing, TTL, |_| false);
        // A tool reading through a tree opens the first file of the next directory.
        ahead.opened(2, OsStr::new("n3"));
        assert_eq!(
            names(&ahead.plan(2, &listing, TTL, |_| false)),
            ["n4", "n5", "n6", "n7", "n8", "n9"]
        );
    }

    #[test]
    fn by_name_takes_a_bounded_selection_of_a_big_listing() {
        let listing: Vec<DirEntry> = (0..10_000)
            .rev()
            .map(|i| file(&format!("f{i:05}"), 10))
            .collect();
        let next = next_by_name(&listing, OsStr::new("f04999"), 3);
        let got: Vec<_> = next.iter().map(|e| e.name.clone()).collect();
        assert_eq!(got, ["f05000", "f05001", "f05002"]);
        assert!(next_by_name(&listing, OsStr::new("f09999"), 3).is_empty());
    }

    #[test]
    fn a_failed_fetch_gives_its_bytes_back() {
        let ahead = SmallFileAhead::default();
        let listing = vec![file("a", 10), file("b", 10), file("c", 10)];
        ahead.opened(1, OsStr::new("a"));
        ahead.opened(1, OsStr::new("b"));
        let planned = ahead.plan(1, &listing, TTL, |_| false);
        assert_eq!(planned.len(), 1);
        ahead.failed(1, &planned[0].name, &planned[0].slot);
        assert_eq!(ahead.bytes_waiting(), 0);
        assert!(ahead.opened(1, OsStr::new("c")).0.is_none());
    }
}
