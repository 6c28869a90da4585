//! `awcp-mount umount`: unmount one of our mounts, and nothing else.

use std::os::fd::{FromRawFd as _, OwnedFd};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{control, mountinfo};

/// How long `umount` waits, once the kernel has let go, for the mount process to send what
/// it still holds (the REMOVEs of unlinks it answered early, its last CLOSEs) and exit.
const EXIT_WAIT: Duration = Duration::from_secs(60);

/// Unmount the awcp-mount filesystem at `path`. Refuses paths where something else (or
/// nothing) is mounted, so a typo cannot unmount the wrong filesystem.
pub fn unmount(path: &Path, lazy: bool) -> Result<(), String> {
    let canonical = path
        .canonicalize()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let entry = mountinfo::mount_at(&canonical)
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?
        .ok_or_else(|| format!("{}: not mounted", canonical.display()))?;
    if !entry.is_awcp() {
        return Err(format!(
            "{}: mounted filesystem is {} ({}), not awcp-mount; refusing to unmount it",
            canonical.display(),
            entry.fstype,
            entry.source
        ));
    }
    // The mount process sends what it still holds when the kernel ends the session, then
    // exits: wait for that, so that what `umount` returns to sees the server as the mount
    // left it (unlinks answered early included). Not with --lazy, whose mount lives on
    // until its files are closed. A mount this user cannot ask (another user's, one that
    // does not answer) is unmounted without the wait.
    let process = if lazy {
        None
    } else {
        control::process_of(&canonical).and_then(pidfd_open)
    };
    unmount_now(&canonical, lazy)?;
    if let Some((pid, pidfd)) = process {
        if !wait_exit(&pidfd, EXIT_WAIT) {
            eprintln!(
                "awcp-mount: {} is unmounted; its process {pid} is still sending its last changes to the server",
                canonical.display()
            );
        }
    }
    Ok(())
}

/// Unmount `path`, or detach it lazily when busy (its open files keep working until they are
/// closed); through fusermount3 for a user who may not call umount2. The last error if
/// neither worked.
pub(crate) fn unmount_or_detach(path: &Path) -> Result<(), String> {
    unmount_now(path, false).or_else(|_| unmount_now(path, true))
}

/// The kernel's unmount (through fusermount3 for a user who may not call it).
pub(crate) fn unmount_now(canonical: &Path, lazy: bool) -> Result<(), String> {
    let flags = if lazy {
        nix::mount::MntFlags::MNT_DETACH
    } else {
        nix::mount::MntFlags::empty()
    };
    match nix::mount::umount2(canonical, flags) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => {
            // Not root: the setuid helper may unmount mounts this user made.
            let mut cmd = Command::new("fusermount3");
            cmd.arg("-u");
            if lazy {
                cmd.arg("-z");
            }
            let out = cmd
                .arg(canonical)
                .output()
                .map_err(|e| format!("cannot run fusermount3: {e} (install the fuse3 package)"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "fusermount3 -u {}: {}",
                    canonical.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        }
        Err(nix::errno::Errno::EBUSY) => Err(format!(
            "{}: busy (a process has a file open or its working directory there); close it, or use --lazy",
            canonical.display()
        )),
        Err(e) => Err(format!("umount {}: {e}", canonical.display())),
    }
}

/// A pidfd for `pid`: unlike the number, it cannot come to name another process.
fn pidfd_open(pid: i32) -> Option<(i32, OwnedFd)> {
    // SAFETY: pidfd_open(2) takes a PID and flags and returns a new descriptor, or -1.
    let no_flags: libc::c_long = 0;
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::c_long::from(pid), no_flags) };
    let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the descriptor was just returned to us and nothing else owns it.
    Some((pid, unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Wait until the process of `pidfd` has exited (its pidfd turns readable), at most
/// `limit`; whether it did.
fn wait_exit(pidfd: &OwnedFd, limit: Duration) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd as _;
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
        match poll(
            &mut [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)],
            timeout,
        ) {
            Ok(n) => return n > 0,
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return false,
        }
    }
}
