//! One delegation's mount: the `awcp-mount` binary itself, run in the foreground as a child.
//!
//! Running our own binary (not calling the filesystem code in-process) keeps the control
//! plane apart from the filesystem: the mount is policed by the same code, with the same
//! policy file, as any mount made by hand, and a crash of one mount cannot take `serve` down.
//! The START credential reaches it through two pipes (fds 3 and 4), never through a file.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::{Child, Command};

use super::store::ProcRef;
use crate::awcp::protocol::{Access, ErrorCode, SshfsHandle};

/// How the delegator's host key is checked.
#[derive(Debug, Clone)]
pub enum HostKeys {
    /// Against `[serve] known_hosts`.
    KnownHosts(PathBuf),
    /// Any key (after the known_hosts file said it does not know this host, and the policy
    /// has `accept_unknown_host_keys = true`).
    AcceptUnknown,
}

pub struct MountRequest<'a> {
    pub binary: &'a Path,
    pub policy: &'a Path,
    pub handle: &'a SshfsHandle,
    pub mount_point: &'a Path,
    pub access: Access,
    pub expires_at: &'a str,
    pub host_keys: HostKeys,
    pub noexec: bool,
    /// Where the child's stderr goes (its error message, and later its lease warnings).
    pub log: &'a Path,
}

/// Why a mount failed, as the protocol reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub code: ErrorCode,
    pub message: String,
    pub hint: Option<String>,
    /// The known_hosts file has no entry for the host (retry allowed by policy).
    pub unknown_host_key: bool,
}

/// A running mount process.
pub struct MountChild {
    pub child: Child,
    pub process: Option<ProcRef>,
    log: PathBuf,
}

fn pipe_with(secret: &str) -> std::io::Result<OwnedFd> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // A key and certificate are a few KiB, far below a pipe's 64 KiB: this cannot block.
    let mut w = std::fs::File::from(w);
    std::io::Write::write_all(&mut w, secret.as_bytes())?;
    Ok(r)
}

/// Start the mount process. Returns at once; see [`wait_mounted`].
pub fn spawn(req: &MountRequest) -> Result<MountChild, Failure> {
    let setup = |what: &str, e: std::io::Error| Failure {
        code: ErrorCode::SetupFailed,
        message: format!("{what}: {e}"),
        hint: None,
        unknown_host_key: false,
    };
    let h = req.handle;
    let host = if h.endpoint.host.contains(':') {
        format!("[{}]", h.endpoint.host)
    } else {
        h.endpoint.host.clone()
    };
    let mut cmd = Command::new(req.binary);
    cmd.arg(format!("{}@{host}:{}", h.endpoint.user, h.export_locator))
        .arg(req.mount_point)
        .arg("-f")
        .arg("--policy")
        .arg(req.policy)
        .arg("--expires-at")
        .arg(req.expires_at)
        .arg("-p")
        .arg(h.endpoint.port.to_string())
        .args([
            "--identity-fd",
            "3",
            "--certificate-fd",
            "4",
            "-o",
            "reconnect",
        ]);
    if req.access == Access::Ro {
        cmd.args(["-o", "ro"]);
    }
    if req.noexec {
        cmd.args(["-o", "noexec"]);
    }
    match &req.host_keys {
        HostKeys::KnownHosts(f) => {
            let mut o = std::ffi::OsString::from("UserKnownHostsFile=");
            o.push(f);
            cmd.arg("-o").arg(o);
        }
        HostKeys::AcceptUnknown => {
            cmd.args(["-o", "StrictHostKeyChecking=no"]);
        }
    }
    let log = std::fs::File::create(req.log).map_err(|e| setup("mount log", e))?;
    let key = pipe_with(&h.credential.private_key).map_err(|e| setup("key pipe", e))?;
    let cert = pipe_with(&h.credential.certificate).map_err(|e| setup("certificate pipe", e))?;
    let (key_fd, cert_fd) = (key.as_raw_fd(), cert.as_raw_fd());
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .env_remove("AWCP_MOUNT_LOG")
        .kill_on_drop(false);
    // SAFETY: only dup/dup2 (async-signal-safe). The read ends are first moved above 10 so
    // that placing them at 3 and 4 cannot overwrite one with the other.
    unsafe {
        cmd.pre_exec(move || {
            let k = libc::fcntl(key_fd, libc::F_DUPFD, 10);
            let c = libc::fcntl(cert_fd, libc::F_DUPFD, 10);
            if k < 0 || c < 0 || libc::dup2(k, 3) < 0 || libc::dup2(c, 4) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(k);
            libc::close(c);
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| setup("cannot run awcp-mount", e))?;
    // Our copies of the read ends go now: the child holds the only ones.
    drop((key, cert));
    let process = child.id().and_then(|p| ProcRef::of(p as i32));
    Ok(MountChild {
        child,
        process,
        log: req.log.to_path_buf(),
    })
}

impl MountChild {
    /// What the process wrote to stderr (bounded).
    pub fn stderr(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(4096);
        let mut start = start;
        while !text.is_char_boundary(start) {
            start += 1;
        }
        text[start..].trim().to_string()
    }
}

/// Whether our filesystem is mounted at `mp` now.
pub fn is_mounted(mp: &Path) -> bool {
    matches!(crate::mountinfo::mount_at(mp), Ok(Some(m)) if m.is_awcp())
}

/// Poll until the mount is live, the process exits (its message says why), or `deadline`.
pub async fn wait_mounted(
    m: &mut MountChild,
    mp: &Path,
    deadline: Duration,
) -> Result<(), Failure> {
    let start = tokio::time::Instant::now();
    loop {
        if is_mounted(mp) {
            return Ok(());
        }
        if let Ok(Some(status)) = m.child.try_wait() {
            return Err(classify(&m.stderr(), &status.to_string()));
        }
        if start.elapsed() > deadline {
            let _ = m.child.start_kill();
            let _ = m.child.wait().await;
            return Err(Failure {
                code: ErrorCode::MountFailed,
                message: format!(
                    "the mount was not live after {} s: {}",
                    deadline.as_secs(),
                    m.stderr()
                ),
                hint: Some("check that the delegator's SSH endpoint is reachable".into()),
                unknown_host_key: false,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Map the mount process's error message to the protocol's code.
pub fn classify(stderr: &str, status: &str) -> Failure {
    let message = stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("awcp-mount: "))
        .map(str::to_string)
        .unwrap_or_else(|| {
            if stderr.is_empty() {
                format!("the mount process exited ({status}) without a message")
            } else {
                stderr.to_string()
            }
        });
    let has = |s: &str| message.contains(s);
    let (code, hint, unknown) = if has("START_EXPIRED") {
        (
            ErrorCode::StartExpired,
            Some("send START before the lease expires".to_string()),
            false,
        )
    } else if has("MOUNTPOINT_DENIED") {
        (
            ErrorCode::MountpointDenied,
            Some("the executor's policy refused its own mount point; check mount_root".into()),
            false,
        )
    } else if has("refused to authenticate")
        || has("in-memory private key")
        || has("in-memory certificate")
        || has("certifies key")
    {
        (
            ErrorCode::AuthFailed,
            Some("the SSH server refused the START credential: check that it trusts the certificate's CA (TrustedUserCAKeys), and that the certificate is valid now and names the user".into()),
            false,
        )
    } else if has("host key") {
        let unknown = has("is not known");
        (
            ErrorCode::MountFailed,
            Some(if unknown {
                "the delegator's SSH host key is not in the executor's [serve] known_hosts file; add it there (or set accept_unknown_host_keys = true)".into()
            } else {
                "the delegator's SSH host key does not match the one the executor trusts".into()
            }),
            unknown,
        )
    } else {
        (ErrorCode::MountFailed, None, false)
    };
    Failure {
        code,
        message,
        hint,
        unknown_host_key: unknown,
    }
}

/// How long the teardown waits for the mount process once its mount is gone: it sends what
/// it still holds (writes, unlinks answered early) for up to a minute (`LAST_FLUSH_WAIT`)
/// before it exits; killed earlier, it would lose them.
const EXIT_WAIT: Duration = Duration::from_secs(75);

/// Unmount and wait for the mount process to end. Never deletes anything. An error if the
/// process had to be killed: what it had not yet sent to the server is lost.
pub async fn unmount(m: &mut MountChild, mp: &Path) -> Result<(), String> {
    let path = mp.to_path_buf();
    let _ = tokio::task::spawn_blocking(move || detach_or_unmount(&path)).await;
    // And SIGTERM: a mount still being made (a cancel right after START) would mount after
    // the unmount above and serve on; one whose mount is gone flushes what it holds on
    // SIGTERM as it does at the end of its session, then exits.
    if let Some(pid) = m.child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let exited = tokio::time::timeout(EXIT_WAIT, m.child.wait()).await;
    // (A process ended between its mount and its signal handlers leaves a dead mount.)
    let path = mp.to_path_buf();
    let _ = tokio::task::spawn_blocking(move || detach_or_unmount(&path)).await;
    match exited {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(format!(
            "the mount process ended with {status} after the unmount: the last changes made \
             through the mount may not all have reached the server (its mount.log says which)"
        )),
        Ok(Err(e)) => Err(format!("cannot wait for the mount process: {e}")),
        Err(_) => {
            tracing::warn!(
                "mount process for {} did not exit {EXIT_WAIT:?} after the unmount; killing it",
                mp.display()
            );
            let _ = m.child.start_kill();
            let _ = m.child.wait().await;
            let path = mp.to_path_buf();
            let _ = tokio::task::spawn_blocking(move || detach_or_unmount(&path)).await;
            Err(format!(
                "the mount process did not finish sending the last changes to the server \
                 within {EXIT_WAIT:?} of the unmount and was killed: some of them may be lost"
            ))
        }
    }
}

/// `umount`, or a lazy detach when busy; only if our filesystem is mounted there. Through
/// `fusermount3` when this user may not unmount (`serve` run as a user, as SECURITY.md
/// advises: `umount2` then fails with EPERM for every mount).
pub fn detach_or_unmount(mp: &Path) {
    if !is_mounted(mp) {
        return;
    }
    if let Err(e) = crate::unmount::unmount_or_detach(mp) {
        tracing::warn!("cannot unmount {}: {e}", mp.display());
    }
}

/// Remove an (empty) mount point, only once mountinfo shows nothing is mounted on or under
/// it: `rmdir`, never a recursive delete, which through a live mount would delete the
/// delegator's files.
pub fn remove_mount_point(mp: &Path) {
    match crate::mountinfo::has_mounts_under(mp) {
        Ok(false) => match std::fs::remove_dir(mp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("cannot remove mount point {}: {e}", mp.display()),
        },
        Ok(true) => tracing::error!("{} is still mounted; leaving it in place", mp.display()),
        Err(e) => tracing::error!(
            "cannot read mountinfo ({e}); leaving {} in place",
            mp.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_errors_map_to_protocol_codes() {
        let c = |s: &str| classify(s, "exit status: 1");
        assert_eq!(
            c("awcp-mount: 127.0.0.1:22 refused to authenticate user \"u\" with ...").code,
            ErrorCode::AuthFailed
        );
        assert_eq!(
            c("awcp-mount: cannot use the in-memory private key (...)").code,
            ErrorCode::AuthFailed
        );
        assert_eq!(
            c("awcp-mount: MOUNTPOINT_DENIED (empty): ...").code,
            ErrorCode::MountpointDenied
        );
        assert_eq!(
            c("awcp-mount: START_EXPIRED: the lease expired at ...").code,
            ErrorCode::StartExpired
        );
        let h = c("WARN x\nawcp-mount: the host key of [h]:22 is not known: f has no entry for it");
        assert_eq!(h.code, ErrorCode::MountFailed);
        assert!(h.unknown_host_key && h.hint.unwrap().contains("known_hosts"));
        let changed = c("awcp-mount: host key for [h]:22 changed (known_hosts line 1 of f)");
        assert!(!changed.unknown_host_key);
        let other = c("awcp-mount: cannot connect to 127.0.0.1:1: Connection refused");
        assert_eq!(
            (other.code, other.message.as_str()),
            (
                ErrorCode::MountFailed,
                "cannot connect to 127.0.0.1:1: Connection refused"
            )
        );
        assert!(c("").message.contains("without a message"));
    }
}
