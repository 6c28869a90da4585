//! The part of the policy a running mount consults on every operation, changeable live.

use std::sync::RwLock;

use super::quota::Quota;
use super::{Policy, SymlinkMode};

/// Live policy state of one mount, shared by the filesystem core and the reload watcher.
#[derive(Debug)]
pub struct Enforcer {
    symlinks: RwLock<SymlinkMode>,
    pub quota: Quota,
}

impl Default for Enforcer {
    /// No restrictions: what a trusted local test wants. Mounts build theirs from a policy.
    fn default() -> Self {
        Enforcer {
            symlinks: RwLock::new(SymlinkMode::Allow),
            quota: Quota::default(),
        }
    }
}

impl Enforcer {
    pub fn from_policy(p: &Policy) -> Self {
        Enforcer {
            symlinks: RwLock::new(p.symlinks),
            quota: Quota::new(p.max_bytes, p.max_files),
        }
    }

    pub fn symlinks(&self) -> SymlinkMode {
        *self.symlinks.read().unwrap()
    }

    /// Take over the settings of a reloaded policy that apply live: quota limits and symlink
    /// mode. (Access mode and cache lifetimes are applied by their owners.)
    pub fn apply(&self, p: &Policy) {
        *self.symlinks.write().unwrap() = p.symlinks;
        self.quota.set_limits(p.max_bytes, p.max_files);
    }
}
