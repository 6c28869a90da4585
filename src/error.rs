//! Errors that carry an errno and the context in which they happened.
//!
//! Every filesystem operation ends in either a value or an [`FsError`]. The FUSE adapter only
//! looks at [`FsError::errno`]; the context is for the log line, so a user reading
//! `awcp-mount -d` output can tell *why* an operation got `EACCES` and not just that it did.

use std::fmt;

/// An errno plus a human-readable explanation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsError {
    pub errno: i32,
    pub context: String,
}

impl FsError {
    pub fn new(errno: i32, context: impl Into<String>) -> Self {
        FsError {
            errno,
            context: context.into(),
        }
    }

    /// Whether this error is worth a warning in the log. Expected outcomes like `ENOENT` on a
    /// lookup are normal traffic (every `stat` of a missing file produces one) and stay at debug.
    pub fn is_noteworthy(&self) -> bool {
        !matches!(
            self.errno,
            libc::ENOENT
                | libc::EEXIST
                | libc::ENOTEMPTY
                | libc::ENOTDIR
                | libc::EISDIR
                | libc::EACCES
                | libc::EPERM
                | libc::EROFS
                | libc::ENOSPC
                | libc::EINVAL
                | libc::ENAMETOOLONG
                | libc::EXDEV
                | libc::ENODATA
                | libc::ENOSYS
                // A copy_file_range left to the kernel's read-and-write copy (core::copy).
                | libc::EOPNOTSUPP
        )
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = std::io::Error::from_raw_os_error(self.errno);
        write!(f, "{} ({})", self.context, name)
    }
}

impl std::error::Error for FsError {}

pub type FsResult<T> = Result<T, FsError>;

/// Shorthand constructor: `fserr!(ENOENT, "no {}", name)`.
#[macro_export]
macro_rules! fserr {
    ($errno:ident, $($arg:tt)*) => {
        $crate::error::FsError::new(libc::$errno, format!($($arg)*))
    };
}
