//! `awcp-mount umount`: unmount one of our mounts, and nothing else.

use std::path::Path;
use std::process::Command;

use crate::mountinfo;

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
    // The daemon flushes writes when the kernel ends the session; unmounting is enough.
    let flags = if lazy {
        nix::mount::MntFlags::MNT_DETACH
    } else {
        nix::mount::MntFlags::empty()
    };
    match nix::mount::umount2(&canonical, flags) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => {
            // Not root: the setuid helper may unmount mounts this user made.
            let mut cmd = Command::new("fusermount3");
            cmd.arg("-u");
            if lazy {
                cmd.arg("-z");
            }
            let out = cmd
                .arg(&canonical)
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
