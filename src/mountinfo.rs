//! `/proc/self/mountinfo`: what is mounted where.
//!
//! Used before anything that could act through a live mount (refusing to mount over one,
//! checking before a recursive delete, `awcp-mount umount` and `status`).

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// `major:minor` of the mounted filesystem's device.
    pub device: String,
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
    pub options: String,
}

impl MountEntry {
    /// Mounted by awcp-mount (`fuse.awcp`).
    pub fn is_awcp(&self) -> bool {
        self.fstype == "fuse.awcp"
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(b: &[u8]) -> OsString {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    OsString::from_vec(out)
}

/// Parse mountinfo. Bytes, not text: a mount point's name need not be UTF-8 (any user can
/// make one with `fusermount3`), and one such name must not make every check fail.
pub fn parse(text: &[u8]) -> Vec<MountEntry> {
    let mut out = Vec::new();
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    for line in text.split(|&c| c == b'\n') {
        let fields: Vec<&[u8]> = line.split(|&c| c == b' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == b"-") else {
            continue;
        };
        if fields.len() < 6 || fields.len() < sep + 3 {
            continue;
        }
        out.push(MountEntry {
            device: lossy(fields[2]),
            mount_point: PathBuf::from(unescape(fields[4])),
            options: lossy(fields[5]),
            fstype: lossy(fields[sep + 1]),
            source: unescape(fields[sep + 2]).to_string_lossy().into_owned(),
        });
    }
    out
}

/// Everything mounted now, as this process sees it.
pub fn current() -> std::io::Result<Vec<MountEntry>> {
    Ok(parse(&std::fs::read("/proc/self/mountinfo")?))
}

/// The mount whose mount point is exactly `path` (the last one, if stacked).
pub fn mount_at(path: &Path) -> std::io::Result<Option<MountEntry>> {
    Ok(current()?.into_iter().rev().find(|m| m.mount_point == path))
}

/// Whether `path` is a mount point.
pub fn is_mount_point(path: &Path) -> std::io::Result<bool> {
    Ok(mount_at(path)?.is_some())
}

/// Whether anything is mounted at `path` or below it: a recursive delete of `path` would
/// reach into another filesystem.
pub fn has_mounts_under(path: &Path) -> std::io::Result<bool> {
    Ok(current()?.iter().any(|m| m.mount_point.starts_with(path)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn parses_fuse_lines_with_escapes() {
        let text = "36 35 98:0 /mnt1 /mnt\\040dir rw,noatime master:1 - fuse.awcp awcp@h:/x rw,user_id=0\n\
                    22 1 0:21 / /proc rw,nosuid - proc proc rw\n";
        let m = parse(text.as_bytes());
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point, PathBuf::from("/mnt dir"));
        assert!(m[0].is_awcp());
        assert_eq!(m[0].source, "awcp@h:/x");
        assert_eq!(m[0].device, "98:0");
        assert_eq!(m[1].fstype, "proc");
    }

    /// A mount point whose name is not UTF-8 is read as it is, and the other lines with it.
    #[test]
    fn a_mount_point_name_that_is_not_utf8_spoils_nothing() {
        let mut text = b"40 35 0:50 / /tmp/\xff\xfe rw - fuse.x x rw\n".to_vec();
        text.extend_from_slice(b"41 35 0:51 / /mnt/a\\0401 rw - fuse.awcp s rw\n");
        let m = parse(&text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point.as_os_str().as_bytes(), b"/tmp/\xff\xfe");
        assert_eq!(m[1].mount_point, PathBuf::from("/mnt/a 1"));
    }

    #[test]
    fn proc_is_a_mount_point_here() {
        assert!(is_mount_point(Path::new("/proc")).unwrap());
        assert!(has_mounts_under(Path::new("/")).unwrap());
    }
}
