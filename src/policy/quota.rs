//! The delegation's budget: net bytes added to the workspace and net entries created.
//!
//! Every growth is reserved *before* it is sent to the server, under one lock, so two writers
//! racing for the last bytes cannot both get them, and a write past the budget fails with
//! `ENOSPC` (or writes the part that fits and returns the short count, as a full disk does)
//! without anything below the budget being lost. Deleting and truncating down give space back.
//!
//! Growth is measured against the size of each file as the mount knows it: its size on the
//! server when first seen, then every write and truncate through the mount. The accounting
//! lives in the mount process, so it survives reconnects.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::core::inode::Ino;

#[derive(Debug, Default)]
struct State {
    max_bytes: Option<u64>,
    max_files: Option<u64>,
    /// Net bytes added since the mount (negative when more was deleted than written). Wide:
    /// a file may be as large as `i64::MAX` (a write at the largest offset, which the server
    /// then refuses) and a linked one is charged more than once, so an `i64` could overflow.
    bytes: i128,
    /// Net entries created since the mount.
    files: i64,
    /// Known size of every file the mount has seen and may still change.
    sizes: HashMap<Ino, u64>,
    /// Hard links made through the mount that are charged as copies: the inode's bytes count
    /// `1 + copies` times, also as it grows, and each removed name gives one copy back.
    copies: HashMap<Ino, u32>,
    /// Files whose last name was removed while the mount still knows them (open, or not
    /// yet forgotten by the kernel): how much of their size was given back with the name.
    /// Their data lives on on the server while a descriptor holds it, so what they grow by
    /// afterwards is charged, and given back when the mount forgets them (a `tmpfile()`
    /// under the mount: open, unlink, write). Never more than the size.
    given_back: HashMap<Ino, u64>,
    /// Bytes the workspace held at mount time, once measured (for `df`).
    base: Option<u64>,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverQuota;

#[derive(Debug, Default)]
pub struct Quota {
    state: Mutex<State>,
}

/// Current usage, for `df` and `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub bytes: i64,
    pub files: i64,
    pub max_bytes: Option<u64>,
    pub max_files: Option<u64>,
    pub base: Option<u64>,
}

impl Quota {
    pub fn new(max_bytes: Option<u64>, max_files: Option<u64>) -> Self {
        Quota {
            state: Mutex::new(State {
                max_bytes,
                max_files,
                ..Default::default()
            }),
        }
    }

    /// New limits (live policy reload). What is already used stays used.
    pub fn set_limits(&self, max_bytes: Option<u64>, max_files: Option<u64>) {
        let mut s = self.state.lock().unwrap();
        s.max_bytes = max_bytes;
        s.max_files = max_files;
    }

    pub fn is_limited(&self) -> bool {
        let s = self.state.lock().unwrap();
        s.max_bytes.is_some() || s.max_files.is_some()
    }

    pub fn usage(&self) -> Usage {
        let s = self.state.lock().unwrap();
        Usage {
            bytes: s.bytes.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
            files: s.files,
            max_bytes: s.max_bytes,
            max_files: s.max_files,
            base: s.base,
        }
    }

    pub fn set_base(&self, bytes: u64) {
        self.state.lock().unwrap().base = Some(bytes);
    }

    /// Whether the size of `ino` is known.
    pub fn knows(&self, ino: Ino) -> bool {
        self.state.lock().unwrap().sizes.contains_key(&ino)
    }

    /// The server says `ino` has `size` bytes. Used only for a file the mount has not
    /// tracked yet: after that, the mount's own writes are the truth (the server may lag
    /// behind writes still in flight).
    pub fn observe(&self, ino: Ino, size: u64) {
        self.state.lock().unwrap().sizes.entry(ino).or_insert(size);
    }

    /// The kernel forgot `ino` and no file of it is open: stop tracking it. (Its copies stay
    /// charged: each of its names, seen again as separate inodes, gives its size back when
    /// removed.)
    pub fn forget(&self, ino: Ino) {
        let mut s = self.state.lock().unwrap();
        let size = s.sizes.remove(&ino);
        s.copies.remove(&ino);
        // A removed file goes with its last descriptor: what it grew by since is freed.
        if let Some(given) = s.given_back.remove(&ino) {
            let size = size.unwrap_or(given);
            s.bytes -= i128::from(size.saturating_sub(given));
        }
    }

    /// What setting the size of `ino` to `size` changes: the bytes charged (weighted by its
    /// copies), and what a removed file's given-back part becomes. Of a removed file, only
    /// the part above what was given back is charged.
    fn size_change(s: &State, ino: Ino, size: u64) -> (i128, Option<u64>) {
        let old = s.sizes.get(&ino).copied().unwrap_or(0);
        let weight = i128::from(Self::weight(s, ino));
        match s.given_back.get(&ino) {
            None => ((i128::from(size) - i128::from(old)) * weight, None),
            Some(&given) => {
                let before = old.saturating_sub(given);
                let given = given.min(size);
                (
                    (i128::from(size - given) - i128::from(before)) * weight,
                    Some(given),
                )
            }
        }
    }

    /// Set the size of `ino`, with what [`Quota::size_change`] worked out.
    fn apply_size(s: &mut State, ino: Ino, size: u64, (delta, given): (i128, Option<u64>)) {
        s.bytes += delta;
        s.sizes.insert(ino, size);
        if let Some(given) = given {
            s.given_back.insert(ino, given);
        }
    }

    /// How many times the bytes of `ino` are charged.
    fn weight(s: &State, ino: Ino) -> u64 {
        1 + u64::from(s.copies.get(&ino).copied().unwrap_or(0))
    }

    /// Reserve the growth of writing `len` bytes at `offset` of `ino` (whose size must be
    /// known, see [`Quota::observe`]). Returns how many bytes may be written: `len`, fewer
    /// (the part that fits), or `OverQuota` when not one byte fits.
    pub fn reserve_write(&self, ino: Ino, offset: u64, len: u64) -> Result<u64, OverQuota> {
        let mut s = self.state.lock().unwrap();
        let size = s.sizes.get(&ino).copied().unwrap_or(0);
        let end = offset.saturating_add(len);
        if end <= size || len == 0 {
            return Ok(len);
        }
        let growth = end - size;
        // A file hard-linked through the mount grows once per charged copy.
        let weight = Self::weight(&s, ino);
        let allowed_growth = match s.max_bytes {
            None => growth,
            Some(max) => {
                let left = (i128::from(max) - s.bytes).max(0) as u128;
                growth.min((left / u128::from(weight)).min(u64::MAX.into()) as u64)
            }
        };
        // The bytes that fit are those up to size + allowed_growth.
        let new_end = size + allowed_growth;
        if new_end <= offset {
            return Err(OverQuota);
        }
        s.bytes += i128::from(allowed_growth) * i128::from(weight);
        s.sizes.insert(ino, new_end);
        Ok(new_end - offset)
    }

    /// `ino` is being truncated to `size`: reserve the growth or give back the shrink.
    pub fn resize(&self, ino: Ino, size: u64) -> Result<(), OverQuota> {
        let mut s = self.state.lock().unwrap();
        let change = Self::size_change(&s, ino, size);
        if let Some(max) = s.max_bytes.filter(|_| change.0 > 0) {
            if s.bytes + change.0 > i128::from(max) {
                return Err(OverQuota);
            }
        }
        Self::apply_size(&mut s, ino, size, change);
        Ok(())
    }

    /// A failed resize or write: undo the reservation.
    pub fn unreserve(&self, ino: Ino, old_size: u64) {
        let mut s = self.state.lock().unwrap();
        if s.sizes.contains_key(&ino) {
            let change = Self::size_change(&s, ino, old_size);
            Self::apply_size(&mut s, ino, old_size, change);
        }
    }

    pub fn size_of(&self, ino: Ino) -> Option<u64> {
        self.state.lock().unwrap().sizes.get(&ino).copied()
    }

    /// Reserve a hard link of `ino` (of `size` bytes) as `name`: one entry and one more copy
    /// of its bytes. SFTP v3 has no link counts, so the mount cannot always tell whether data
    /// outlives the removal of a name: a link is charged as a copy, and its bytes keep counting
    /// once per copy as the file grows.
    pub fn reserve_link(&self, ino: Ino, size: u64) -> Result<(), OverQuota> {
        let mut s = self.state.lock().unwrap();
        if let Some(max) = s.max_bytes {
            if s.bytes + i128::from(size) > i128::from(max) {
                return Err(OverQuota);
            }
        }
        if let Some(max) = s.max_files {
            if s.files + 1 > i64::try_from(max).unwrap_or(i64::MAX) {
                return Err(OverQuota);
            }
        }
        s.bytes += i128::from(size);
        s.files += 1;
        s.sizes.entry(ino).or_insert(size);
        *s.copies.entry(ino).or_insert(0) += 1;
        Ok(())
    }

    /// A link reserved with [`Quota::reserve_link`] was not made.
    pub fn unreserve_link(&self, ino: Ino, size: u64) {
        let mut s = self.state.lock().unwrap();
        s.bytes -= i128::from(size);
        s.files -= 1;
        if let Some(c) = s.copies.get_mut(&ino) {
            *c = c.saturating_sub(1);
        }
    }

    /// A name of the file `ino` (of `size` bytes) was removed (unlinked, or replaced by a
    /// rename). `data_lives_on`: the mount knows another name of it remains. A charged copy is
    /// given back first; else the bytes are given back only when the data went with the name.
    /// Returns the bytes given back.
    pub fn name_removed(&self, ino: Option<Ino>, size: u64, data_lives_on: bool) -> u64 {
        let mut s = self.state.lock().unwrap();
        s.files -= 1;
        let given_back = match ino {
            None if data_lives_on => 0,
            None => size,
            Some(ino) => match s.copies.get_mut(&ino) {
                Some(c) if *c > 0 => {
                    *c -= 1;
                    size
                }
                _ if data_lives_on => 0,
                _ => {
                    // Kept, with what was given back, until the mount forgets it: it may
                    // still be open, and grow.
                    s.copies.remove(&ino);
                    s.sizes.insert(ino, size);
                    s.given_back.insert(ino, size);
                    size
                }
            },
        };
        s.bytes -= i128::from(given_back);
        given_back
    }

    /// A removal [`name_removed`](Self::name_removed) gave `bytes` back for did not happen
    /// after all (the server refused an unlink answered early): charge the entry and the
    /// bytes again, past the limit if need be, since they are on the server.
    pub fn name_restored(&self, ino: Ino, bytes: u64) {
        let mut s = self.state.lock().unwrap();
        s.files += 1;
        // (Of what was given back, what the file still holds: it may have shrunk since.)
        let bytes = s
            .given_back
            .remove(&ino)
            .map_or(bytes, |given| given.min(bytes));
        s.bytes += i128::from(bytes);
    }

    /// Reserve one new entry (file, directory, link).
    pub fn reserve_entry(&self) -> Result<(), OverQuota> {
        let mut s = self.state.lock().unwrap();
        if let Some(max) = s.max_files {
            if s.files + 1 > i64::try_from(max).unwrap_or(i64::MAX) {
                return Err(OverQuota);
            }
        }
        s.files += 1;
        Ok(())
    }

    /// An entry was removed (or a reserved one was not created after all); `bytes` of
    /// content went with it.
    pub fn release_entry(&self, ino: Option<Ino>, bytes: u64) {
        let mut s = self.state.lock().unwrap();
        s.files -= 1;
        s.bytes -= i128::from(bytes);
        if let Some(ino) = ino {
            s.sizes.remove(&ino);
            s.given_back.remove(&ino);
        }
    }

    /// The new file `ino` starts empty.
    pub fn created(&self, ino: Ino) {
        let mut s = self.state.lock().unwrap();
        s.sizes.insert(ino, 0);
        s.given_back.remove(&ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file may grow to `i64::MAX` (a write at the largest offset, which the server then
    /// refuses) and a linked file is charged twice: the counter neither wraps nor panics
    /// (it did, in a debug build), and truncating the file back gives exactly that back.
    #[test]
    fn a_write_at_the_largest_offset_of_a_linked_file_is_counted_exactly() {
        const NEAR_MAX: u64 = (1 << 63) - 2;
        let q = Quota::new(None, None);
        q.created(1);
        q.created(2);
        assert_eq!(q.reserve_write(1, 0, 10), Ok(10));
        q.reserve_link(2, 0).unwrap();
        assert_eq!(q.reserve_write(2, NEAR_MAX, 1), Ok(1));
        assert_eq!(q.usage().bytes, i64::MAX, "shown saturated");
        q.resize(2, 0).unwrap();
        assert_eq!(q.usage().bytes, 10);
        // With a limit, such a write does not fit at all.
        let q = Quota::new(Some(1 << 40), None);
        q.created(1);
        assert_eq!(q.reserve_write(1, NEAR_MAX, 1), Err(OverQuota));
        assert_eq!(q.reserve_write(1, 0, 10), Ok(10));
        assert_eq!(q.usage().bytes, 10);
    }

    /// A removed file that is still open: given back with its name, charged for what it
    /// grows by, and for nothing more when its name comes back (an unlink the server refused).
    #[test]
    fn a_removed_file_is_charged_only_above_what_it_gave_back() {
        let q = Quota::new(Some(1_000), None);
        q.created(1);
        assert_eq!(q.reserve_write(1, 0, 100), Ok(100));
        assert_eq!(q.name_removed(Some(1), 100, false), 100);
        assert_eq!(q.usage().bytes, 0);
        assert_eq!(q.reserve_write(1, 0, 100), Ok(100), "rewritten: free");
        assert_eq!(q.usage().bytes, 0);
        assert_eq!(q.reserve_write(1, 100, 50), Ok(50));
        assert_eq!(q.usage().bytes, 50);
        // A write that failed gives its growth back, and no more.
        q.unreserve(1, 100);
        assert_eq!(q.usage().bytes, 0);
        q.resize(1, 40).unwrap();
        assert_eq!(q.usage().bytes, 0, "below what it gave back");
        q.resize(1, 70).unwrap();
        assert_eq!(q.usage().bytes, 30, "above the 40 it holds of that");
        // Over the budget: refused, nothing changed.
        assert_eq!(q.resize(1, 2_000), Err(OverQuota));
        assert_eq!((q.usage().bytes, q.size_of(1)), (30, Some(70)));
        // The name is back: charged for what it holds.
        q.name_restored(1, 100);
        assert_eq!(q.usage().bytes, 70);
        q.forget(1);
        assert_eq!(q.usage().bytes, 70, "a file with a name stays charged");
        // Removed again, then forgotten: its growth goes with it.
        q.created(2);
        assert_eq!(q.reserve_write(2, 0, 10), Ok(10));
        q.name_removed(Some(2), 10, false);
        assert_eq!(q.reserve_write(2, 10, 20), Ok(20));
        assert_eq!(q.usage().bytes, 90);
        q.forget(2);
        assert_eq!(q.usage().bytes, 70);
    }

    #[test]
    fn exact_limit_one_over_and_short_writes() {
        let q = Quota::new(Some(100), None);
        q.created(7);
        assert_eq!(q.reserve_write(7, 0, 100), Ok(100));
        assert_eq!(q.reserve_write(7, 100, 1), Err(OverQuota));
        // Overwriting inside the file costs nothing.
        assert_eq!(q.reserve_write(7, 10, 50), Ok(50));
        q.resize(7, 40).unwrap();
        assert_eq!(q.usage().bytes, 40);
        // 60 left: a 100-byte append writes 60.
        assert_eq!(q.reserve_write(7, 40, 100), Ok(60));
        assert_eq!(q.reserve_write(7, 100, 1), Err(OverQuota));
        q.release_entry(Some(7), 100);
        assert_eq!(q.usage().bytes, 0);
    }

    #[test]
    fn sparse_write_beyond_budget_is_refused() {
        let q = Quota::new(Some(100), None);
        q.created(1);
        assert_eq!(q.reserve_write(1, 1000, 10), Err(OverQuota));
        assert_eq!(q.usage().bytes, 0);
    }

    #[test]
    fn racing_writers_get_exactly_the_budget() {
        let q = std::sync::Arc::new(Quota::new(Some(10_000), None));
        for i in 0..8 {
            q.created(i);
        }
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let q = q.clone();
                std::thread::spawn(move || {
                    let mut got = 0;
                    for k in 0..1000 {
                        got += q.reserve_write(i, k * 7, 7).unwrap_or(0);
                    }
                    got
                })
            })
            .collect();
        let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(total, 10_000);
        assert_eq!(q.usage().bytes, 10_000);
    }

    #[test]
    fn hard_links_are_copies_that_grow_and_are_given_back_per_name() {
        let q = Quota::new(Some(10_000), Some(10));
        q.reserve_entry().unwrap();
        q.created(3);
        assert_eq!(q.reserve_write(3, 0, 1000), Ok(1000));
        q.reserve_link(3, 1000).unwrap();
        assert_eq!(q.usage().bytes, 2000);
        assert_eq!(q.usage().files, 2);
        // Growing a file with two charged names costs twice.
        assert_eq!(q.reserve_write(3, 1000, 500), Ok(500));
        assert_eq!(q.usage().bytes, 3000);
        q.resize(3, 1000).unwrap();
        assert_eq!(q.usage().bytes, 2000);
        // One name goes: a copy is given back, the size is still tracked.
        q.name_removed(Some(3), 1000, true);
        assert_eq!(q.usage().bytes, 1000);
        assert_eq!(q.size_of(3), Some(1000));
        assert_eq!(q.reserve_write(3, 1000, 10), Ok(10));
        assert_eq!(q.usage().bytes, 1010);
        // The last one: everything is given back.
        q.name_removed(Some(3), 1010, false);
        assert_eq!(
            q.usage(),
            Usage {
                bytes: 0,
                files: 0,
                max_bytes: Some(10_000),
                max_files: Some(10),
                base: None
            }
        );
        // A failed link takes nothing.
        q.created(4);
        q.reserve_link(4, 0).unwrap();
        q.unreserve_link(4, 0);
        assert_eq!(q.usage().files, 0);
        // A name of a file linked on the server (data lives on) gives back no bytes.
        q.reserve_write(4, 0, 100).unwrap();
        q.name_removed(Some(4), 100, true);
        assert_eq!(q.usage().bytes, 100);
    }

    #[test]
    fn entries() {
        let q = Quota::new(None, Some(2));
        q.reserve_entry().unwrap();
        q.reserve_entry().unwrap();
        assert_eq!(q.reserve_entry(), Err(OverQuota));
        q.release_entry(None, 0);
        q.reserve_entry().unwrap();
    }
}
