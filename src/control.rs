//! A small control socket per mount, for `awcp-mount status` and `awcp-mount downgrade`.
//!
//! Each running mount listens on a Unix socket named after a hash of its mount point (a mount
//! point path can be longer than a socket path may be) in a directory only its user can use:
//! `/run/awcp-mount/` for root, else `$XDG_RUNTIME_DIR/awcp-mount/`. The protocol is one line
//! in (`status` or `downgrade`), one JSON line out.

use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// Where control sockets live for this user.
pub fn socket_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        PathBuf::from("/run/awcp-mount")
    } else if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(d).join("awcp-mount")
    } else {
        PathBuf::from(format!("/tmp/awcp-mount-{}", nix::unistd::geteuid()))
    }
}

/// FNV-1a: a stable, dependency-free name for a mount point's socket.
fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

pub fn socket_path(mountpoint: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    socket_dir().join(format!(
        "{:016x}.sock",
        fnv64(mountpoint.as_os_str().as_bytes())
    ))
}

pub type DowngradeFn =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// What the socket can do for its mount.
pub struct Handlers {
    pub status: Box<dyn Fn() -> serde_json::Value + Send + Sync>,
    pub downgrade: DowngradeFn,
}

/// Removes the socket file when the mount ends, if it is still this mount's.
pub struct ControlSocket {
    path: PathBuf,
    /// Device and inode of the socket file we bound: a mount made at the same mount point
    /// after ours may have replaced it, and its socket must outlive our exit.
    id: Option<(u64, u64)>,
}

fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        if self.id.is_some() && file_id(&self.path) == self.id {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// How long a new mount waits for the control socket of the mount that was at its mount point
/// before to go away: that process is still exiting when a mount is made again at once after
/// an unmount. After that, the new mount takes the name over (the old one was detached with
/// files open, and nobody can reach it by its mount point any more).
const PREDECESSOR_GRACE: Duration = Duration::from_secs(2);

/// Start serving the control socket of `mountpoint` on the current tokio runtime.
pub fn serve(mountpoint: &Path, handlers: Handlers) -> std::io::Result<ControlSocket> {
    let dir = socket_dir();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    let path = socket_path(mountpoint);
    let deadline = std::time::Instant::now() + PREDECESSOR_GRACE;
    while path.exists()
        && UnixStream::connect(&path).is_ok()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Left by a process that died (nobody answers on it), or by one still exiting.
    if path.exists() {
        let _ = std::fs::remove_file(&path);
    }
    let listener = tokio::net::UnixListener::bind(&path)?;
    let id = file_id(&path);
    let handlers = Arc::new(handlers);
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors (EMFILE), say: it lasts, and trying again at once
                    // would spin the mount's one network thread.
                    tracing::debug!("control socket: accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let handlers = handlers.clone();
            tokio::spawn(async move {
                let (r, mut w) = stream.into_split();
                let mut line = String::new();
                let mut r = tokio::io::BufReader::new(r);
                if r.read_line(&mut line).await.is_err() {
                    return;
                }
                let answer = match line.trim() {
                    "status" => (handlers.status)(),
                    "downgrade" => match (handlers.downgrade)().await {
                        Ok(()) => serde_json::json!({"ok": true}),
                        Err(e) => serde_json::json!({"ok": false, "error": e}),
                    },
                    other => {
                        serde_json::json!({"ok": false, "error": format!("unknown command '{other}'")})
                    }
                };
                let _ = w.write_all(format!("{answer}\n").as_bytes()).await;
            });
        }
    });
    Ok(ControlSocket { path, id })
}

/// Ask the mount at `mountpoint` (client side, blocking).
pub fn request(mountpoint: &Path, command: &str) -> Result<serde_json::Value, String> {
    request_at(&socket_path(mountpoint), command).map_err(|e| {
        format!(
            "{}: no awcp-mount process answers for this mount point ({e})",
            mountpoint.display()
        )
    })
}

pub fn request_at(socket: &Path, command: &str) -> std::io::Result<serde_json::Value> {
    request_within(socket, command, Duration::from_secs(30))
}

/// The PID of the process serving the mount at `mountpoint`, if it answers within a
/// moment (`umount` must not wait long on a mount process that is stuck).
pub fn process_of(mountpoint: &Path) -> Option<i32> {
    let status = request_within(&socket_path(mountpoint), "status", Duration::from_secs(2)).ok()?;
    i32::try_from(status["pid"].as_i64()?).ok()
}

fn request_within(
    socket: &Path,
    command: &str,
    timeout: Duration,
) -> std::io::Result<serde_json::Value> {
    // Only a directory of this user that nobody else may enter can hold our mounts' sockets.
    // The fallback under /tmp can be made first by another user; whatever listens there is
    // not ours to believe (a PID to wait on, a downgrade that did not happen).
    if let Some(dir) = socket.parent() {
        private_to_us(dir)?;
    }
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(format!("{command}\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// `dir` is a directory owned by this user with no access for anyone else.
fn private_to_us(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let md = std::fs::symlink_metadata(dir)?;
    if md.is_dir() && md.uid() == nix::unistd::geteuid().as_raw() && md.mode() & 0o077 == 0 {
        Ok(())
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a private directory of this user (owner {}, mode {:o}); not trusting the sockets in it",
                dir.display(),
                md.uid(),
                md.mode() & 0o7777
            ),
        ))
    }
}

/// Every mount of this user that answers, with its status.
pub fn all_status() -> Vec<serde_json::Value> {
    let Ok(entries) = std::fs::read_dir(socket_dir()) else {
        return Vec::new();
    };
    let mut out: Vec<serde_json::Value> = entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "sock"))
        .filter_map(|e| request_at(&e.path(), "status").ok())
        .collect();
    out.sort_by_key(|v| v["mountpoint"].as_str().map(str::to_string));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_private_directory_of_this_user_is_trusted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        private_to_us(dir.path()).unwrap();
        // Others may enter: whatever listens there may be anyone's.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = private_to_us(dir.path()).unwrap_err();
        assert!(e.to_string().contains("not a private directory"), "{e}");
        // And a request through it is refused before anything is asked.
        let e = request_at(&dir.path().join("x.sock"), "status").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        // A file is no directory.
        let file = dir.path().join("f");
        std::fs::write(&file, b"").unwrap();
        assert!(private_to_us(&file).is_err());
    }
}
