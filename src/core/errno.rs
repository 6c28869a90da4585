//! From SFTP's coarse status codes to the errno a local disk would return.
//!
//! OpenSSH reports EEXIST, ENOTEMPTY, EISDIR, ENOSPC, EXDEV, EROFS and more all as `FAILURE`,
//! and EINVAL and ENAMETOOLONG both as `BAD_MESSAGE`. Tools depend on the difference (`mkdir -p`
//! needs EEXIST, `rm -r` needs ENOTEMPTY vs EISDIR, `mv` needs EXDEV), so the core asks a
//! follow-up question (an lstat, a listing) when the answer is ambiguous; [`Inference`] holds
//! what those questions found, and [`infer`] turns it into an errno.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::error::FsError;
use crate::remote::{FileKind, RemoteError, Status};

/// Longest name a component may have, as on every Linux local filesystem.
pub const NAME_MAX: usize = 255;
/// Longest path the kernel hands to a filesystem.
pub const PATH_MAX: usize = 4096;

/// The operation that failed, so the same status can mean different errnos.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Lookup,
    Getattr,
    Setattr,
    Chown,
    Readlink,
    Mkdir,
    Unlink,
    Rmdir,
    Symlink,
    Rename,
    Link,
    Open,
    Create,
    Read,
    Write,
    Fsync,
    Close,
    Readdir,
    Statfs,
}

/// What a follow-up look at the server found.
#[derive(Debug, Clone, Copy, Default)]
pub struct Inference {
    /// Kind of the object the operation targeted (None: it does not exist).
    pub target: Option<FileKind>,
    /// Kind of the source of a rename or link.
    pub source: Option<FileKind>,
    /// The target is a directory with entries.
    pub target_not_empty: bool,
    /// The two directories of a rename/link are on different server filesystems.
    pub cross_device: bool,
    /// The server filesystem has no space left.
    pub no_space: bool,
    /// The server filesystem is mounted read-only.
    pub read_only_fs: bool,
}

/// Refuse names a local filesystem would refuse, before asking the server.
pub fn check_name(name: &OsStr) -> Result<(), FsError> {
    if name.len() > NAME_MAX {
        return Err(FsError::new(
            libc::ENAMETOOLONG,
            format!("name is {} bytes, the limit is {NAME_MAX}", name.len()),
        ));
    }
    if name.is_empty() || name.as_bytes().contains(&b'/') || name.as_bytes().contains(&0) {
        return Err(FsError::new(libc::EINVAL, "invalid file name"));
    }
    Ok(())
}

/// The errno for a failure that needs no follow-up question, or `None` when it does.
pub fn direct(err: &RemoteError, op: Op) -> Option<i32> {
    match err {
        RemoteError::Status(status, _) => match status {
            Status::NoSuchFile => Some(libc::ENOENT),
            Status::PermissionDenied => Some(match op {
                // chown and chmod of someone else's file are EPERM locally.
                Op::Chown | Op::Setattr => libc::EPERM,
                _ => libc::EACCES,
            }),
            Status::OpUnsupported => Some(libc::EOPNOTSUPP),
            Status::Eof => Some(libc::EIO),
            // sftp-server seeks before it writes: EINVAL there is an offset past the largest
            // file the server's filesystem can hold, which a local pwrite(2) reports as EFBIG.
            Status::BadMessage if op == Op::Write => Some(libc::EFBIG),
            Status::BadMessage => Some(libc::EINVAL),
            Status::Failure | Status::Other(_) => None,
            Status::NoConnection | Status::ConnectionLost => Some(libc::EIO),
        },
        RemoteError::Unsupported(_) => Some(libc::EOPNOTSUPP),
        RemoteError::Disconnected(_) | RemoteError::StaleHandle | RemoteError::Protocol(_) => {
            Some(libc::EIO)
        }
    }
}

/// Name length problems reported as `BAD_MESSAGE` or `FAILURE`.
pub fn path_too_long(path: &Path) -> bool {
    path.as_os_str().len() >= PATH_MAX || path.iter().any(|c| c.len() > NAME_MAX)
}

/// The errno for an ambiguous `FAILURE`, given what the follow-up found.
pub fn infer(op: Op, found: &Inference) -> i32 {
    if found.read_only_fs {
        return libc::EROFS;
    }
    match op {
        Op::Mkdir | Op::Symlink => {
            if found.target.is_some() {
                libc::EEXIST
            } else if found.no_space {
                libc::ENOSPC
            } else {
                libc::EIO
            }
        }
        Op::Create => match found.target {
            Some(FileKind::Dir) => libc::EISDIR,
            Some(_) => libc::EEXIST,
            None if found.no_space => libc::ENOSPC,
            None => libc::EIO,
        },
        Op::Open => match found.target {
            Some(FileKind::Dir) => libc::EISDIR,
            None => libc::ENOENT,
            _ if found.no_space => libc::ENOSPC,
            _ => libc::EIO,
        },
        Op::Unlink => match found.target {
            Some(FileKind::Dir) => libc::EISDIR,
            None => libc::ENOENT,
            _ => libc::EIO,
        },
        Op::Rmdir => match found.target {
            None => libc::ENOENT,
            Some(FileKind::Dir) if found.target_not_empty => libc::ENOTEMPTY,
            Some(FileKind::Dir) => libc::EBUSY,
            Some(_) => libc::ENOTDIR,
        },
        Op::Rename => {
            if found.source.is_none() {
                return libc::ENOENT;
            }
            if found.cross_device {
                return libc::EXDEV;
            }
            match (found.source, found.target) {
                (Some(FileKind::Dir), Some(FileKind::Dir)) if found.target_not_empty => {
                    libc::ENOTEMPTY
                }
                (Some(FileKind::Dir), Some(t)) if t != FileKind::Dir => libc::ENOTDIR,
                (Some(s), Some(FileKind::Dir)) if s != FileKind::Dir => libc::EISDIR,
                _ if found.no_space => libc::ENOSPC,
                _ => libc::EIO,
            }
        }
        Op::Link => {
            if found.source.is_none() {
                libc::ENOENT
            } else if found.target.is_some() {
                libc::EEXIST
            } else if found.source == Some(FileKind::Dir) {
                libc::EPERM
            } else if found.cross_device {
                libc::EXDEV
            } else if found.no_space {
                libc::ENOSPC
            } else {
                libc::EIO
            }
        }
        Op::Write | Op::Fsync | Op::Close | Op::Setattr => {
            if found.no_space {
                libc::ENOSPC
            } else {
                libc::EIO
            }
        }
        _ => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coarse_statuses_need_inference() {
        let fail = RemoteError::Status(Status::Failure, String::new());
        assert_eq!(direct(&fail, Op::Mkdir), None);
        let nf = RemoteError::Status(Status::NoSuchFile, String::new());
        assert_eq!(direct(&nf, Op::Lookup), Some(libc::ENOENT));
        let pd = RemoteError::Status(Status::PermissionDenied, String::new());
        assert_eq!(direct(&pd, Op::Open), Some(libc::EACCES));
        assert_eq!(direct(&pd, Op::Chown), Some(libc::EPERM));
    }

    #[test]
    fn inference_table() {
        let exists = Inference {
            target: Some(FileKind::File),
            ..Default::default()
        };
        assert_eq!(infer(Op::Mkdir, &exists), libc::EEXIST);
        assert_eq!(infer(Op::Create, &exists), libc::EEXIST);
        let full_dir = Inference {
            target: Some(FileKind::Dir),
            target_not_empty: true,
            ..Default::default()
        };
        assert_eq!(infer(Op::Rmdir, &full_dir), libc::ENOTEMPTY);
        assert_eq!(infer(Op::Unlink, &full_dir), libc::EISDIR);
        assert_eq!(infer(Op::Rmdir, &exists), libc::ENOTDIR);
        let dir_over_file = Inference {
            source: Some(FileKind::Dir),
            target: Some(FileKind::File),
            ..Default::default()
        };
        assert_eq!(infer(Op::Rename, &dir_over_file), libc::ENOTDIR);
        let file_over_dir = Inference {
            source: Some(FileKind::File),
            target: Some(FileKind::Dir),
            ..Default::default()
        };
        assert_eq!(infer(Op::Rename, &file_over_dir), libc::EISDIR);
        let xdev = Inference {
            source: Some(FileKind::File),
            cross_device: true,
            ..Default::default()
        };
        assert_eq!(infer(Op::Rename, &xdev), libc::EXDEV);
    }

    #[test]
    fn names_are_checked_locally() {
        assert_eq!(
            check_name(OsStr::new(&"x".repeat(256))).unwrap_err().errno,
            libc::ENAMETOOLONG
        );
        assert!(check_name(OsStr::new(&"x".repeat(255))).is_ok());
    }
}
