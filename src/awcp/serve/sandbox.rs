//! The sandbox the task command runs in, which is what ACCEPT's `sandboxProfile` declares:
//!
//! * `allowNetwork: false`: the task gets a network namespace of its own (`unshare
//!   (CLONE_NEWNET)`), with no interface but a down loopback, so it can reach nothing.
//! * `cwdOnly: true`: Landlock (raw syscalls, ABI 1 to 3) lets it read and write the mount
//!   point and its own task directory, and only read and execute the system directories.
//!
//! Both are checked when `serve` starts ([`probe`]): a profile this machine cannot enforce is
//! a configuration error, never a promise silently broken.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::config::TaskConfig;

// Landlock ABI (include/uapi/linux/landlock.h).
const CREATE_RULESET_VERSION: u32 = 1;
const RULE_PATH_BENEATH: libc::c_int = 1;
const EXECUTE: u64 = 1 << 0;
const WRITE_FILE: u64 = 1 << 1;
const READ_FILE: u64 = 1 << 2;
const READ_DIR: u64 = 1 << 3;
const ALL_V1: u64 = (1 << 13) - 1;
const REFER: u64 = 1 << 13;
const TRUNCATE: u64 = 1 << 14;
/// The rights that make sense on a file (not a directory) rule.
const FILE_RIGHTS: u64 = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// System directories a task may read and execute from under `cwdOnly`.
const READ_ONLY: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/etc",
    "/opt",
    "/proc",
    "/sys",
    "/dev/urandom",
    "/dev/random",
];
/// Device files a task may also write.
const READ_WRITE_FILES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"];

/// The Landlock ABI version of the running kernel (0: none).
pub fn landlock_abi() -> i64 {
    // SAFETY: the documented probe call: no attribute, size 0, the VERSION flag.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    r.max(0)
}

/// Can this machine keep the profile `task` declares? Called once at start-up.
pub fn probe(task: &TaskConfig) -> Result<(), String> {
    if task.cwd_only && landlock_abi() < 1 {
        return Err(
            "[task] cwd_only = true needs Landlock, which this kernel does not provide \
             (CONFIG_SECURITY_LANDLOCK, lsm=landlock); set cwd_only = false to declare \
             cwdOnly: false instead"
                .into(),
        );
    }
    if !task.allow_network {
        // Try it in a throwaway child: the same call the task's pre_exec makes.
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("/bin/true");
        // SAFETY: unshare is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::unshare(libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        match cmd.status() {
            Ok(s) if s.success() => {}
            Ok(s) => return Err(format!("network namespace probe exited with {s}")),
            Err(e) => {
                return Err(format!(
                    "[task] allow_network = false needs a network namespace of its own for \
                     the task, which cannot be created here ({e}; run serve as root); set \
                     allow_network = true to declare allowNetwork: true instead"
                ))
            }
        }
    }
    Ok(())
}

/// A sandbox ready to be entered by the task between fork and exec.
pub struct Sandbox {
    no_network: bool,
    ruleset: Option<OwnedFd>,
}

impl Sandbox {
    /// Build the Landlock ruleset now, in the parent (opening paths allocates; the child
    /// after fork only makes async-signal-safe system calls). `writable` are the mount point
    /// (opened after it is mounted, so the rule is on the mounted root) and the task dir.
    pub fn prepare(task: &TaskConfig, writable: &[&Path]) -> Result<Sandbox, String> {
        let ruleset = if task.cwd_only {
            Some(build_ruleset(writable)?)
        } else {
            None
        };
        Ok(Sandbox {
            no_network: !task.allow_network,
            ruleset,
        })
    }

    /// Enter the sandbox. Runs in the child between fork and exec.
    ///
    /// # Safety
    /// Only async-signal-safe system calls; must be called from `pre_exec`.
    pub unsafe fn enter(&self) -> std::io::Result<()> {
        let err = std::io::Error::last_os_error;
        if self.no_network && libc::unshare(libc::CLONE_NEWNET) != 0 {
            return Err(err());
        }
        if let Some(fd) = &self.ruleset {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(err());
            }
            if libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32) != 0 {
                return Err(err());
            }
        }
        Ok(())
    }
}

fn build_ruleset(writable: &[&Path]) -> Result<OwnedFd, String> {
    let abi = landlock_abi();
    if abi < 1 {
        return Err("Landlock is not available".into());
    }
    // Without REFER (ABI 1) every rename across directories is refused; without TRUNCATE
    // (ABI < 3) truncation is not restricted at all. Handle what the kernel knows.
    let mut handled = ALL_V1;
    if abi >= 2 {
        handled |= REFER;
    }
    if abi >= 3 {
        handled |= TRUNCATE;
    }
    let attr = RulesetAttr {
        handled_access_fs: handled,
    };
    // SAFETY: attr is a valid landlock_ruleset_attr of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if fd < 0 {
        return Err(format!(
            "landlock_create_ruleset: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the kernel just returned this descriptor to us.
    let ruleset = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let read_only = READ_FILE | READ_DIR | EXECUTE;
    let mut rules: Vec<(PathBuf, u64, bool)> = Vec::new();
    for p in READ_ONLY {
        rules.push((PathBuf::from(p), read_only, false));
    }
    for p in READ_WRITE_FILES {
        rules.push((PathBuf::from(p), READ_FILE | WRITE_FILE, false));
    }
    for p in writable {
        rules.push((p.to_path_buf(), handled, true));
    }
    for (path, access, required) in rules {
        match add_rule(&ruleset, &path, access & handled) {
            Ok(()) => {}
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) if !required => tracing::debug!("landlock rule for {}: {e}", path.display()),
            Err(e) => return Err(format!("landlock rule for {}: {e}", path.display())),
        }
    }
    Ok(ruleset)
}

fn add_rule(ruleset: &OwnedFd, path: &Path, mut access: u64) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)?;
    if !f.metadata()?.is_dir() {
        access &= FILE_RIGHTS;
    }
    let attr = PathBeneathAttr {
        allowed_access: access,
        parent_fd: f.as_raw_fd(),
    };
    // SAFETY: attr is a valid, packed landlock_path_beneath_attr; both fds are open.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0u32,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

use std::os::unix::fs::OpenOptionsExt;
