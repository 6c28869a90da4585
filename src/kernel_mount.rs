//! The kernel mount itself, done here rather than by fuser when we are root.
//!
//! Why not fuser's own mount: its direct `mount(2)` path passes the type `"fuse"` and drops the
//! subtype, so our mounts would show up as plain `fuse` and `awcp-mount umount`, `status` and
//! operators' `findmnt -t fuse.awcp` could not tell them from anyone else's. Doing it here also
//! lets us mount on a directory we opened and checked (`/proc/self/fd/N`): if the path is
//! swapped for a symlink after the check, the mount still lands on the directory we checked.
//!
//! Without root we go through fuser and the setuid `fusermount3`, which names the type
//! `fuse.<subtype>` itself.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::mount::{mount, MsFlags};

/// The filesystem type our mounts carry, as seen in /proc/self/mountinfo.
pub const FSTYPE: &str = "fuse.awcp";

/// What to put on the mount.
#[derive(Debug, Clone)]
pub struct KernelMountOptions {
    pub fsname: String,
    pub read_only: bool,
    pub allow_other: bool,
    pub default_permissions: bool,
    pub noexec: bool,
    pub noatime: bool,
    pub sync: bool,
}

/// Open `/dev/fuse` and mount it on the directory open as `dir` (an `O_PATH` descriptor).
/// Returns the `/dev/fuse` descriptor for `fuser::Session::from_fd`.
pub fn mount_on_fd(dir: &OwnedFd, opts: &KernelMountOptions) -> io::Result<OwnedFd> {
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot open /dev/fuse: {e} (is the fuse module loaded?)"),
            )
        })?;
    let mut data = format!(
        "fd={},rootmode=40000,user_id={},group_id={}",
        dev.as_raw_fd(),
        nix::unistd::getuid(),
        nix::unistd::getgid()
    );
    if opts.allow_other {
        data.push_str(",allow_other");
    }
    if opts.default_permissions {
        data.push_str(",default_permissions");
    }
    let mut flags = MsFlags::MS_NODEV | MsFlags::MS_NOSUID;
    if opts.read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    if opts.noexec {
        flags |= MsFlags::MS_NOEXEC;
    }
    if opts.noatime {
        flags |= MsFlags::MS_NOATIME;
    }
    if opts.sync {
        flags |= MsFlags::MS_SYNCHRONOUS;
    }
    let target = format!("/proc/self/fd/{}", dir.as_raw_fd());
    mount(
        Some(opts.fsname.as_str()),
        Path::new(&target),
        Some(FSTYPE),
        flags,
        Some(data.as_str()),
    )
    .map_err(io::Error::from)?;
    Ok(OwnedFd::from(dev))
}

/// Open a directory for mounting on, without following a final symlink.
pub fn open_dir_nofollow(path: &Path) -> io::Result<OwnedFd> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    Ok(OwnedFd::from(f))
}
