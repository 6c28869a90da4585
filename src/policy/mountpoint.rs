//! Where a mount may go: strictly inside the mount root, never on a sensitive system path,
//! only on an existing empty directory of the mounting user (or one created fresh), never on a
//! symlink or over another mount.
//!
//! The checks run on the fully resolved path, then the directory is opened (`O_PATH |
//! O_NOFOLLOW`) and the open directory is verified to be the one that was checked. The mount
//! is then made on that descriptor, so swapping the path for a symlink after the checks cannot
//! send the mount elsewhere.

use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use super::Policy;
use crate::kernel_mount::open_dir_nofollow;

/// Refused with the rule that refused it. Displays with the AWCP error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub rule: &'static str,
    pub detail: String,
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MOUNTPOINT_DENIED ({}): {}", self.rule, self.detail)
    }
}

impl std::error::Error for Denied {}

fn deny(rule: &'static str, detail: impl Into<String>) -> Denied {
    Denied {
        rule,
        detail: detail.into(),
    }
}

/// Paths that are refused themselves, even inside a mount root that contains them.
const SENSITIVE_EXACT: &[&str] = &[
    "/", "/home", "/root", "/var", "/run", "/tmp", "/mnt", "/media", "/srv", "/opt",
];
/// Paths refused together with everything below them.
const SENSITIVE_TREES: &[&str] = &[
    "/etc", "/usr", "/boot", "/proc", "/sys", "/dev", "/bin", "/sbin", "/lib", "/lib64",
];

/// Whether `path` (absolute, resolved) is a sensitive system location.
pub fn is_sensitive(path: &Path) -> bool {
    SENSITIVE_EXACT.iter().any(|s| path == Path::new(s))
        || SENSITIVE_TREES.iter().any(|s| path.starts_with(s))
}

/// A mount point that passed every check, held open.
#[derive(Debug)]
pub struct Checked {
    /// The resolved path.
    pub path: PathBuf,
    /// `O_PATH` descriptor of the directory: mount on this.
    pub dir: OwnedFd,
    /// The directory's lock (see `lock_against_other_mounts`), held until [`Checked::mounted`].
    lock: Option<OwnedFd>,
    /// We created the directory (remove it again if the mount fails).
    pub created: bool,
}

impl Checked {
    /// The mount is made: from now on another awcp-mount finds it in mountinfo. The lock
    /// goes, so that it does not outlive the mount in a process that a lazy unmount left
    /// running (a new mount there is then allowed, as without one).
    pub fn mounted(&mut self) {
        self.lock = None;
    }

    /// Undo what the check did, after a failed mount: remove the directory if we created it
    /// (only if it is still empty and not mounted: `rmdir` refuses anything else).
    pub fn abandon(self) {
        if self.created {
            let _ = std::fs::remove_dir(&self.path);
        }
    }
}

/// What `check` would do, without doing it (for `awcp-mount check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub path: PathBuf,
    pub would_create: bool,
}

fn resolve_root(policy: &Policy) -> Result<PathBuf, Denied> {
    policy.mount_root.canonicalize().map_err(|e| {
        deny(
            "mount-root",
            format!(
                "the mount root {} ({}) is not usable: {e}; create it (mode 0755, owned by root) or set mount_root in the policy",
                policy.mount_root.display(),
                policy.source
            ),
        )
    })
}

/// Run every rule on `requested` without changing anything.
pub fn verdict(policy: &Policy, requested: &Path) -> Result<Verdict, Denied> {
    let root = resolve_root(policy)?;
    let requested = if requested.is_absolute() {
        requested.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| {
                deny(
                    "path",
                    format!("cannot resolve {}: {e}", requested.display()),
                )
            })?
            .join(requested)
    };
    let (path, exists) = match std::fs::symlink_metadata(&requested) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(deny(
                "not-a-symlink",
                format!(
                    "{} is a symlink; mount on a real directory",
                    requested.display()
                ),
            ))
        }
        Ok(_) => (
            requested
                .canonicalize()
                .map_err(|e| deny("path", format!("{}: {e}", requested.display())))?,
            true,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let name = match requested.components().next_back() {
                Some(Component::Normal(n)) => n.to_os_string(),
                _ => {
                    return Err(deny(
                        "path",
                        format!("{} has no final name", requested.display()),
                    ))
                }
            };
            let parent = requested.parent().unwrap_or(Path::new("/"));
            let parent = parent.canonicalize().map_err(|e| {
                deny(
                    "exists",
                    format!("{}: parent directory: {e}", requested.display()),
                )
            })?;
            (parent.join(name), false)
        }
        Err(e) => return Err(deny("path", format!("{}: {e}", requested.display()))),
    };
    if path == root {
        return Err(deny(
            "inside-mount-root",
            format!(
                "{} is the mount root itself; mount on a directory inside it",
                path.display()
            ),
        ));
    }
    if !path.starts_with(&root) {
        return Err(deny(
            "inside-mount-root",
            format!(
                "{} is not inside the mount root {} (after resolving symlinks and ..)",
                path.display(),
                root.display()
            ),
        ));
    }
    if is_sensitive(&path) {
        return Err(deny(
            "sensitive-path",
            format!("{} is a sensitive system path", path.display()),
        ));
    }
    if !exists && !policy.create_mountpoint {
        return Err(deny(
            "exists",
            format!(
                "{} does not exist; create an empty directory there, or set create_mountpoint = true in the policy",
                path.display()
            ),
        ));
    }
    if exists {
        let meta = std::fs::metadata(&path)
            .map_err(|e| deny("path", format!("{}: {e}", path.display())))?;
        if !meta.is_dir() {
            return Err(deny(
                "directory",
                format!("{} is not a directory", path.display()),
            ));
        }
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != me {
            return Err(deny(
                "owner",
                format!(
                    "{} is owned by uid {}, not by the mounting user (uid {me})",
                    path.display(),
                    meta.uid()
                ),
            ));
        }
        if crate::mountinfo::is_mount_point(&path).unwrap_or(true) {
            return Err(deny(
                "not-mounted",
                format!(
                    "{} is already a mount point (unmount it first)",
                    path.display()
                ),
            ));
        }
        let mut entries = std::fs::read_dir(&path)
            .map_err(|e| deny("empty", format!("{}: {e}", path.display())))?;
        if entries.next().is_some() {
            return Err(deny(
                "empty",
                format!(
                    "{} is not empty; mounting would hide its files",
                    path.display()
                ),
            ));
        }
    }
    Ok(Verdict {
        path,
        would_create: !exists,
    })
}

/// Check `requested` and hold it open for mounting, creating it (mode 0700) if the policy
/// allows and it does not exist.
///
/// The path-level rules run first (for their messages); then the directory is opened without
/// following a final symlink and everything that decides whether mounting there is safe is
/// checked again *on the open directory*: that it is still the resolved path inside the root,
/// owned by us, empty and not a mount point. The mount is made on this descriptor, so a path
/// swapped or exchanged (`renameat2(RENAME_EXCHANGE)`) at any moment cannot redirect it.
pub fn check(policy: &Policy, requested: &Path) -> Result<Checked, Denied> {
    let v = verdict(policy, requested)?;
    if v.would_create {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&v.path)
            .map_err(|e| deny("exists", format!("cannot create {}: {e}", v.path.display())))?;
    }
    let result = check_open(&v.path);
    if result.is_err() && v.would_create {
        let _ = std::fs::remove_dir(&v.path);
    }
    result.map(|(dir, lock)| Checked {
        path: v.path.clone(),
        dir,
        lock: Some(lock),
        created: v.would_create,
    })
}

/// Take the directory's lock (`flock`, exclusive, without waiting) so that no other
/// awcp-mount gets through these checks on it at the same time: two that did would both find
/// it empty and unmounted, and stack their mounts on it. It is held until the mount is made
/// (then mountinfo shows it). Refused if another holds it; once it is ours, mountinfo must not show a mount there
/// (one finished by another just before).
fn lock_against_other_mounts(dir: &OwnedFd, path: &Path) -> Result<OwnedFd, Denied> {
    use std::os::fd::FromRawFd;
    // SAFETY: openat on the directory we hold (an O_PATH descriptor may be a dirfd); the
    // result is a new descriptor we own, or -1.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c".".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(deny("path", format!("{}: {e}", path.display())));
    }
    // SAFETY: fd was just opened and is owned by nothing else.
    let lock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            deny(
                "not-mounted",
                format!(
                    "another awcp-mount is mounting on {} right now, or has mounted there; wait for it, or pick another directory",
                    path.display()
                ),
            )
        } else {
            deny("path", format!("cannot lock {}: {e}", path.display()))
        });
    }
    if crate::mountinfo::is_mount_point(path).unwrap_or(true) {
        return Err(deny(
            "not-mounted",
            format!(
                "{} is already a mount point (unmount it first)",
                path.display()
            ),
        ));
    }
    Ok(lock)
}

fn check_open(path: &Path) -> Result<(OwnedFd, OwnedFd), Denied> {
    let dir = open_dir_nofollow(path).map_err(|e| {
        deny(
            "not-a-symlink",
            format!("cannot open {} as a directory: {e}", path.display()),
        )
    })?;
    let lock = lock_against_other_mounts(&dir, path)?;
    let changed = || {
        deny(
            "changed",
            format!(
                "{} changed while it was being checked; try again",
                path.display()
            ),
        )
    };
    let now_at =
        std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd())).unwrap_or_default();
    if now_at != path {
        return Err(changed());
    }
    let st = nix::sys::stat::fstat(&dir).map_err(|e| deny("path", format!("fstat: {e}")))?;
    let me = nix::unistd::geteuid().as_raw();
    if st.st_uid != me {
        return Err(deny(
            "owner",
            format!(
                "{} is owned by uid {}, not by the mounting user (uid {me})",
                path.display(),
                st.st_uid
            ),
        ));
    }
    if is_mount_root(&dir) {
        return Err(deny(
            "not-mounted",
            format!(
                "{} is already a mount point (unmount it first)",
                path.display()
            ),
        ));
    }
    // List the directory we hold, not the path.
    let listed = nix::dir::Dir::openat(
        &dir,
        ".",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| deny("empty", format!("{}: {e}", path.display())))?;
    let mut listed = listed;
    let has_entries = listed.iter().flatten().any(|e| {
        let n = e.file_name().to_bytes();
        n != b"." && n != b".."
    });
    if has_entries {
        return Err(deny(
            "empty",
            format!(
                "{} is not empty; mounting would hide its files",
                path.display()
            ),
        ));
    }
    Ok((dir, lock))
}

/// Whether the open directory is the root of a mount (`STATX_ATTR_MOUNT_ROOT`).
fn is_mount_root(dir: &OwnedFd) -> bool {
    // SAFETY: statx writes into the zeroed buffer we pass; the descriptor is open.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(
            dir.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_BASIC_STATS,
            &mut stx,
        )
    };
    rc == 0
        && stx.stx_attributes_mask & libc::STATX_ATTR_MOUNT_ROOT as u64 != 0
        && stx.stx_attributes & libc::STATX_ATTR_MOUNT_ROOT as u64 != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy_at(root: &Path, create: bool) -> Policy {
        Policy {
            mount_root: root.to_path_buf(),
            create_mountpoint: create,
            ..Policy::default()
        }
    }

    #[test]
    fn rules() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("mounts");
        std::fs::create_dir(&root).unwrap();
        let p = policy_at(&root, false);
        std::fs::create_dir(root.join("ok")).unwrap();
        assert!(check(&p, &root.join("ok")).is_ok());
        assert_eq!(verdict(&p, &root).unwrap_err().rule, "inside-mount-root");
        assert_eq!(
            verdict(&p, &t.path().join("elsewhere")).unwrap_err().rule,
            "inside-mount-root"
        );
        std::fs::create_dir(t.path().join("outside")).unwrap();
        assert_eq!(
            verdict(&p, &root.join("../outside")).unwrap_err().rule,
            "inside-mount-root"
        );
        std::os::unix::fs::symlink(t.path().join("outside"), root.join("link")).unwrap();
        assert_eq!(
            verdict(&p, &root.join("link")).unwrap_err().rule,
            "not-a-symlink"
        );
        std::os::unix::fs::symlink(t.path(), root.join("dirlink")).unwrap();
        assert_eq!(
            verdict(&p, &root.join("dirlink/outside")).unwrap_err().rule,
            "inside-mount-root"
        );
        std::fs::create_dir(root.join("full")).unwrap();
        std::fs::write(root.join("full/x"), b"x").unwrap();
        assert_eq!(verdict(&p, &root.join("full")).unwrap_err().rule, "empty");
        std::fs::write(root.join("file"), b"x").unwrap();
        assert_eq!(
            verdict(&p, &root.join("file")).unwrap_err().rule,
            "directory"
        );
        assert_eq!(
            verdict(&p, &root.join("missing")).unwrap_err().rule,
            "exists"
        );
        let pc = policy_at(&root, true);
        let c = check(&pc, &root.join("fresh")).unwrap();
        assert!(c.created);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(root.join("fresh"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        c.abandon();
        assert!(
            !root.join("fresh").exists(),
            "abandon removes what check created"
        );
    }

    #[test]
    fn sensitive_paths_even_inside_the_root() {
        let p = policy_at(Path::new("/"), false);
        assert_eq!(
            verdict(&p, Path::new("/etc")).unwrap_err().rule,
            "sensitive-path"
        );
        assert!(is_sensitive(Path::new("/usr/lib")));
        assert!(is_sensitive(Path::new("/var")));
        assert!(!is_sensitive(Path::new("/var/lib/awcp/mounts/x")));
        assert_eq!(
            verdict(&p, Path::new("/proc")).unwrap_err().rule,
            "sensitive-path"
        );
    }
}
