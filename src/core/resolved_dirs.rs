//! Which directories' server paths were last found to resolve inside the workspace, and when.
//!
//! SFTP v3 names files by path, and the server follows every symlink in a path. A directory
//! the kernel holds (a process's cwd, an open dirfd) keeps its path here; if someone on the
//! server swaps that directory for a symlink to outside the workspace, everything the mount
//! sends under that path lands outside. The kernel revalidates a name it walks through after
//! the entry TTL, and then sees the link, but not a directory a process already holds. So
//! the core asks the server to resolve (`REALPATH`) a directory before it sends paths under it,
//! at most once per attribute TTL per directory: this table remembers the answers.
//!
//! A directory learnt from the server to be a real directory (not a link) inside one that
//! resolved inside at time T counts as resolved at T too: it is inside as long as its parent
//! is, to the same TTL.

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many directories are remembered; the least recently checked are asked again.
const MAX_DIRS: usize = 16 * 1024;

pub struct ResolvedDirs {
    at: Mutex<lru::LruCache<PathBuf, Instant>>,
}

impl Default for ResolvedDirs {
    fn default() -> Self {
        ResolvedDirs {
            at: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(MAX_DIRS).expect("non-zero"),
            )),
        }
    }
}

impl ResolvedDirs {
    /// Whether `dir` resolved inside less than `ttl` ago.
    pub fn fresh(&self, dir: &Path, ttl: Duration) -> bool {
        let mut at = self.at.lock().unwrap();
        match at.get(dir) {
            Some(when) if when.elapsed() < ttl => true,
            Some(_) => {
                at.pop(dir);
                false
            }
            None => false,
        }
    }

    /// `dir` resolved inside, by a question sent at `when`.
    pub fn resolved(&self, dir: &Path, when: Instant) {
        let mut at = self.at.lock().unwrap();
        if at.peek(dir).is_none_or(|old| *old < when) {
            at.put(dir.to_path_buf(), when);
        }
    }

    /// `child` is a real directory in `parent`: it resolves inside as long as `parent` does.
    pub fn inherit(&self, parent: &Path, child: &Path) {
        let mut at = self.at.lock().unwrap();
        if let Some(when) = at.peek(parent).copied() {
            if at.peek(child).is_none_or(|old| *old < when) {
                at.put(child.to_path_buf(), when);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_expire_and_children_inherit_their_parents_time() {
        let dirs = ResolvedDirs::default();
        let ttl = Duration::from_secs(20);
        let (p, c) = (Path::new("/e/p"), Path::new("/e/p/c"));
        assert!(!dirs.fresh(p, ttl));
        dirs.inherit(p, c);
        assert!(!dirs.fresh(c, ttl), "nothing to inherit from");
        let long_ago = Instant::now() - Duration::from_secs(30);
        dirs.resolved(p, long_ago);
        assert!(!dirs.fresh(p, ttl), "older than the TTL");
        dirs.resolved(p, Instant::now());
        dirs.inherit(p, c);
        assert!(dirs.fresh(p, ttl) && dirs.fresh(c, ttl));
        // An older answer never overwrites a newer one.
        dirs.resolved(p, long_ago);
        assert!(dirs.fresh(p, ttl));
        assert!(!dirs.fresh(p, Duration::ZERO), "TTL 0: always ask");
    }
}
