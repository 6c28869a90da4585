//! One mount, start to end: policy, checks, connect, mount, serve until unmounted.
//!
//! The order matters for "nothing is left half-mounted": every check that can fail (policy,
//! options, keys, lease, mount point, the connection, the remote directory) happens before the
//! kernel mount, and a failure at any step leaves nothing behind (a mount point the checks
//! created is removed again).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::core::{Fs, FsConfig};
use crate::daemon::Readiness;
use crate::fuse::FuseAdapter;
use crate::kernel_mount::{self, KernelMountOptions};
use crate::options::{MountOptions, RemoteSpec};
use crate::policy::enforcer::Enforcer;
use crate::policy::mountpoint::{self, Checked};
use crate::policy::{AccessMode, Policy};
use crate::remote::sftp::{
    CertificateSource, HostKeyPolicy, Identity, ReconnectPolicy, SftpRemote, SshConfig,
};
use crate::remote::Remote;

/// Everything needed to mount, already parsed and validated.
#[derive(Debug, Clone)]
pub struct MountRequest {
    pub remote: RemoteSpec,
    pub mountpoint: PathBuf,
    pub options: MountOptions,
    /// `-p PORT` (wins over `-o Port=`, as in sshfs).
    pub port: Option<u16>,
    pub foreground: bool,
    /// Host keys pinned on the command line (`--host-key`), instead of known_hosts.
    pub pinned_host_keys: Vec<String>,
    /// A private key given in memory (control plane), used before any IdentityFile.
    pub key_in_memory: Option<String>,
    pub certificate_in_memory: Option<String>,
    /// `--policy FILE` (else the default file, else built-in defaults).
    pub policy_path: Option<PathBuf>,
    /// The lease's end (`--expires-at`).
    pub expires_at: Option<SystemTime>,
}

impl MountRequest {
    /// Make every local path absolute (relative to the current directory), before the
    /// daemon leaves it.
    pub fn absolutize(&mut self) {
        let Ok(cwd) = std::env::current_dir() else {
            return;
        };
        let abs = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = cwd.join(&*p);
            }
        };
        let o = &mut self.options;
        o.identity_files.iter_mut().for_each(abs);
        o.certificate_files.iter_mut().for_each(abs);
        if let Some(p) = o.user_known_hosts_file.as_mut() {
            abs(p);
        }
        if let Some(p) = self.policy_path.as_mut() {
            abs(p);
        }
        abs(&mut self.mountpoint);
    }
}

/// A failure to mount, with the message the user sees.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct MountError {
    pub kind: MountErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountErrorKind {
    Usage,
    Policy,
    /// AWCP `MOUNTPOINT_DENIED`.
    MountPointDenied,
    /// AWCP `START_EXPIRED`.
    Expired,
    Auth,
    HostKey,
    Network,
    RemoteDir,
    MountPoint,
    Kernel,
}

fn fail(kind: MountErrorKind, message: impl Into<String>) -> MountError {
    MountError {
        kind,
        message: message.into(),
    }
}

/// Parse a pinned host key: `ssh-ed25519 AAAA...`, just the base64, or a `.pub` file.
pub fn parse_host_key(text: &str) -> Result<russh::keys::PublicKey, String> {
    let owned;
    let mut text = text.trim();
    if !text.contains(' ') && Path::new(text).is_file() {
        owned = std::fs::read_to_string(text).map_err(|e| format!("cannot read {text}: {e}"))?;
        text = owned.trim();
    }
    let b64 = match text.split_whitespace().collect::<Vec<_>>().as_slice() {
        [b64] => *b64,
        [_alg, b64, ..] => *b64,
        _ => return Err("empty host key".into()),
    };
    russh::keys::parse_public_key_base64(b64)
        .map_err(|e| format!("'{text}' is not an OpenSSH public key: {e}"))
}

fn default_identity() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from)?;
    ["id_ed25519", "id_ecdsa", "id_rsa"]
        .iter()
        .map(|n| home.join(".ssh").join(n))
        .find(|p| p.is_file())
}

fn current_user() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "root".into())
}

/// Translate the command line into the SSH client's configuration.
pub fn ssh_config(req: &MountRequest) -> Result<SshConfig, MountError> {
    let o = &req.options;
    let identity = if let Some(k) = &req.key_in_memory {
        Identity::KeyInMemory(k.clone())
    } else if let Some(f) = o.identity_files.first() {
        Identity::KeyFile(f.clone())
    } else if let Some(f) = default_identity() {
        Identity::KeyFile(f)
    } else {
        return Err(fail(
            MountErrorKind::Auth,
            "no private key: pass -o IdentityFile=PATH (no ~/.ssh/id_ed25519, id_ecdsa or id_rsa found)",
        ));
    };
    let user = req
        .remote
        .user
        .clone()
        .or_else(|| o.user.clone())
        .unwrap_or_else(current_user);
    let mut cfg = SshConfig::new(req.remote.host.clone(), user, identity);
    cfg.port = req.port.or(o.port).unwrap_or(22);
    cfg.certificate = if let Some(c) = &req.certificate_in_memory {
        Some(CertificateSource::InMemory(c.clone()))
    } else {
        o.certificate_files
            .first()
            .cloned()
            .map(CertificateSource::File)
    };
    cfg.host_key_policy = if !req.pinned_host_keys.is_empty() {
        let keys = req
            .pinned_host_keys
            .iter()
            .map(|k| parse_host_key(k))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fail(MountErrorKind::Usage, format!("--host-key: {e}")))?;
        HostKeyPolicy::Pinned(keys)
    } else if o.strict_host_key_checking == Some(false) {
        HostKeyPolicy::AcceptAny
    } else if let Some(f) = &o.user_known_hosts_file {
        HostKeyPolicy::KnownHostsFile(f.clone())
    } else {
        HostKeyPolicy::default_known_hosts()
    };
    if o.server_alive_interval.is_some() {
        cfg.server_alive_interval = o.server_alive_interval.filter(|d| !d.is_zero());
    }
    if let Some(n) = o.server_alive_count_max {
        cfg.server_alive_count_max = n;
    }
    if let Some(t) = o.connect_timeout {
        cfg.connect_timeout = t;
    }
    if let Some(n) = o.max_conns {
        cfg.max_conns = n;
    }
    cfg.reconnect = ReconnectPolicy {
        enabled: o.reconnect,
        ..ReconnectPolicy::default()
    };
    Ok(cfg)
}

/// Resolve the remote directory to an absolute path and check it is a directory.
async fn resolve_root(remote: &SftpRemote, spec: &RemoteSpec) -> Result<PathBuf, MountError> {
    let dir = if spec.dir.is_empty() {
        "."
    } else {
        spec.dir.as_str()
    };
    remote
        .resolve_dir(Path::new(dir))
        .await
        .map_err(|e| fail(MountErrorKind::RemoteDir, e.to_string()))
}

fn fuse_config(req: &MountRequest, read_only: bool) -> fuser::Config {
    use fuser::MountOption as M;
    let o = &req.options;
    let mut c = fuser::Config::default();
    c.mount_options = vec![
        M::FSName(fsname(req)),
        // Always `fuse.awcp`, as the root path mounts it: `umount`, `status` and
        // `clean-mounts` know awcp-mount's mounts by that type (`-o subtype=` is ignored).
        M::Subtype("awcp".into()),
        M::NoDev,
        M::NoSuid,
        if read_only { M::RO } else { M::RW },
    ];
    if o.default_permissions {
        c.mount_options.push(M::DefaultPermissions);
    }
    for f in &o.kernel_flags {
        c.mount_options.push(match f.as_str() {
            "noexec" => M::NoExec,
            "noatime" | "nodiratime" => M::NoAtime,
            "sync" => M::Sync,
            // nodev and nosuid are always on.
            _ => continue,
        });
    }
    c.acl = if o.allow_other {
        fuser::SessionACL::All
    } else if o.allow_root {
        fuser::SessionACL::RootAndOwner
    } else {
        fuser::SessionACL::Owner
    };
    c.n_threads = Some(2);
    c.clone_fd = true;
    c
}

/// A mount that passed every local check, ready to connect.
#[derive(Debug)]
pub struct Prepared {
    pub req: MountRequest,
    pub policy: Policy,
    /// The policy file to watch for live reload, if there is one.
    pub policy_file: Option<PathBuf>,
    pub access: AccessMode,
    pub mountpoint: Checked,
    pub ssh: SshConfig,
}

/// Everything that can be checked without the network, in the foreground (so the messages
/// reach the terminal): policy, options, keys, lease, mount point.
pub fn prepare(req: MountRequest) -> Result<Prepared, MountError> {
    let mut policy =
        Policy::load(req.policy_path.as_deref()).map_err(|e| fail(MountErrorKind::Policy, e.0))?;
    policy
        .tighten(&req.options.tightening())
        .map_err(|e| fail(MountErrorKind::Policy, e.0))?;
    let policy_file = match &req.policy_path {
        Some(p) => Some(p.clone()),
        None => Some(PathBuf::from(crate::policy::DEFAULT_POLICY_PATH)).filter(|p| p.exists()),
    };
    let requested = if req.options.read_only {
        AccessMode::Ro
    } else {
        AccessMode::Rw
    };
    let access = policy.grant(requested);
    if access != requested {
        tracing::warn!("read-write access requested, but the policy ({}) allows only read-only: mounting read-only", policy.source);
    }
    if req.options.allow_other && !req.options.default_permissions {
        tracing::warn!(
            "allow_other without default_permissions: no permission is checked per local user, \
             every user of the mount acts as the server's account; add -o default_permissions \
             to have the kernel check each user's access"
        );
    }
    if let Some(t) = req.expires_at {
        if t <= SystemTime::now() {
            return Err(fail(
                MountErrorKind::Expired,
                format!(
                    "START_EXPIRED: the lease expired at {}; nothing was mounted",
                    crate::policy::lease::format_rfc3339(t)
                ),
            ));
        }
    }
    let ssh = ssh_config(&req)?;
    let mountpoint = mountpoint::check(&policy, &req.mountpoint)
        .map_err(|d| fail(MountErrorKind::MountPointDenied, d.to_string()))?;
    Ok(Prepared {
        req,
        policy,
        policy_file,
        access,
        mountpoint,
        ssh,
    })
}

/// Mount and serve until unmounted. Returns the process exit status.
pub fn run(prepared: Prepared, mut readiness: Readiness) -> i32 {
    let Prepared {
        req,
        policy,
        policy_file,
        access,
        mountpoint,
        ssh,
    } = prepared;
    let created = mountpoint.created.then(|| mountpoint.path.clone());
    let result = run_inner(
        &req,
        policy,
        policy_file,
        access,
        mountpoint,
        ssh,
        &mut readiness,
    );
    if let (Err(_), Some(dir)) = (&result, created) {
        // A mount point the checks created is removed again (rmdir: only if empty and
        // not mounted).
        let _ = std::fs::remove_dir(dir);
    }
    match result {
        Ok(()) => 0,
        Err(e) => {
            if readiness.is_daemon() {
                // The waiting parent prints it.
                readiness.failed(&e.message);
            } else {
                eprintln!("awcp-mount: {}", e.message);
            }
            1
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run_inner(
    req: &MountRequest,
    policy: Policy,
    policy_file: Option<PathBuf>,
    access: AccessMode,
    mut checked: Checked,
    ssh: SshConfig,
    readiness: &mut Readiness,
) -> Result<(), MountError> {
    for ignored in &req.options.ignored {
        tracing::debug!(option = %ignored, "option accepted and ignored (no effect on Linux)");
    }
    let mountpoint = checked.path.clone();
    let rt = io_runtime()
        .map_err(|e| fail(MountErrorKind::Kernel, format!("cannot start runtime: {e}")))?;

    let remote = rt.block_on(SftpRemote::connect(ssh)).map_err(|e| {
        use crate::remote::sftp::ConnectErrorKind as K;
        let kind = match e.kind() {
            K::Auth | K::Key => MountErrorKind::Auth,
            K::HostKeyUnknown | K::HostKeyChanged => MountErrorKind::HostKey,
            K::NoSuchRemoteDir => MountErrorKind::RemoteDir,
            K::Network | K::Sftp => MountErrorKind::Network,
        };
        fail(kind, e.to_string())
    })?;
    let remote = Arc::new(remote);
    let root = rt.block_on(resolve_root(&remote, &req.remote))?;
    let read_only = access == AccessMode::Ro;

    let idmap = if req.options.idmap_user {
        let a = rt.block_on(remote.stat(&root)).map_err(|e| {
            fail(
                MountErrorKind::RemoteDir,
                format!("stat of the remote directory: {e}"),
            )
        })?;
        Some((
            (a.uid.unwrap_or(0), a.gid.unwrap_or(0)),
            (
                nix::unistd::getuid().as_raw(),
                nix::unistd::getgid().as_raw(),
            ),
        ))
    } else {
        None
    };
    let enforcer = Arc::new(Enforcer::from_policy(&policy));
    let config = FsConfig {
        cache: policy.cache,
        read_only,
        follow_symlinks: req.options.follow_symlinks,
        idmap,
        shown_uid: req.options.shown_uid,
        shown_gid: req.options.shown_gid,
        shown_umask: req.options.shown_umask.unwrap_or(0),
        enforcer: enforcer.clone(),
        sync_unlink: req.options.sync_unlink,
        sync_create: req.options.sync_create,
        owners_from_callers: req.options.allow_other,
    };
    let fs = Arc::new(Fs::new(
        remote.clone(),
        root.clone(),
        config,
        rt.handle().clone(),
    ));
    // Everything that serves the mount is up before the kernel shows it: `status`,
    // `downgrade` and policy edits work from the first moment the mount is visible.
    let _guard = rt.enter();
    let info = MountInfo {
        remote: fsname(req),
        mountpoint: mountpoint.clone(),
        expires_at: req.expires_at,
        policy_source: policy.source.clone(),
    };
    let _control = crate::control::serve(&mountpoint, control_handlers(&fs, &remote, info))
        .map_err(|e| tracing::warn!("no control socket (status/downgrade unavailable): {e}"))
        .ok();
    if let Some(t) = req.expires_at {
        rt.spawn(enforce_lease(
            fs.clone(),
            mountpoint.clone(),
            t,
            policy.grace,
        ));
    }
    if root_has_quota_limit(&policy) {
        rt.spawn(measure_base_usage(
            remote.clone(),
            root.clone(),
            enforcer.clone(),
        ));
    }
    let _watch = match &policy_file {
        Some(file) => watch_policy(file, req, fs.clone(), mountpoint.clone()),
        None => None,
    };
    let adapter = FuseAdapter::new(fs.clone());
    let fuse_cfg = fuse_config(req, read_only);
    let mount_err = |e: std::io::Error| {
        fail(
            MountErrorKind::Kernel,
            format!("cannot mount on {}: {e}", mountpoint.display()),
        )
    };
    let (session, unmounter) = if nix::unistd::geteuid().is_root() {
        // On the directory the checks opened: a path swapped meanwhile cannot redirect us.
        let dev = kernel_mount::mount_on_fd(&checked.dir, &kernel_mount_options(req, read_only))
            .map_err(mount_err)?;
        match fuser::Session::from_fd(adapter, dev, fuse_cfg.acl, fuse_cfg.clone()) {
            Ok(s) => (s, Unmounter::Direct(mountpoint.clone())),
            Err(e) => {
                // Mounted but the kernel handshake failed: take the mount down again.
                let _ = nix::mount::umount2(&mountpoint, nix::mount::MntFlags::MNT_DETACH);
                return Err(mount_err(e));
            }
        }
    } else {
        let mut s = fuser::Session::new(adapter, &mountpoint, &fuse_cfg).map_err(mount_err)?;
        let u = s.unmount_callable();
        (s, Unmounter::Fuser(u))
    };
    checked.mounted();
    tracing::info!(remote = %root.display(), mountpoint = %mountpoint.display(), "mounted");
    let notifier = session.notifier();
    fs.kernel_caches().connect(Box::new(move |ino| {
        // ENOENT: the kernel no longer knows the inode, so it caches nothing of it.
        if let Err(e) = notifier.inval_inode(fuser::INodeNo(ino), 0, 0) {
            tracing::trace!(ino, "inval_inode: {e}");
        }
    }));
    let notifier = session.notifier();
    fs.kernel_caches()
        .connect_names(Box::new(move |parent, name| {
            if let Err(e) = notifier.inval_entry(fuser::INodeNo(parent), name) {
                tracing::trace!(parent, ?name, "inval_entry: {e}");
            }
        }));
    set_readahead(
        &mountpoint,
        req.options.max_readahead.unwrap_or(DEFAULT_READAHEAD),
    );
    let lost = watch_connection(&remote, &rt, mountpoint.clone());
    serve(session, unmounter, fs, &rt, mountpoint, readiness)?;
    if lost.load(std::sync::atomic::Ordering::Acquire) {
        return Err(fail(
            MountErrorKind::Network,
            "the connection to the server was lost for good; the mount was taken down (use -o reconnect to survive drops)",
        ));
    }
    Ok(())
}

/// Without `reconnect`, a lost connection ends the mount, as with sshfs: a mount whose every
/// operation fails would only confuse the tools using it. (With `reconnect`, the SFTP layer
/// keeps trying and operations fail with EIO meanwhile.)
fn watch_connection(
    remote: &SftpRemote,
    rt: &tokio::runtime::Runtime,
    mountpoint: PathBuf,
) -> Arc<std::sync::atomic::AtomicBool> {
    use crate::remote::sftp::ConnState;
    let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = lost.clone();
    let mut state = remote.state();
    rt.spawn(async move {
        loop {
            if state.changed().await.is_err() {
                return;
            }
            let final_loss = match &*state.borrow() {
                ConnState::Disconnected {
                    retrying: false,
                    reason,
                } => {
                    tracing::error!(
                        "connection lost: {reason}; unmounting {}",
                        mountpoint.display()
                    );
                    true
                }
                ConnState::Disconnected {
                    retrying: true,
                    reason,
                } => {
                    tracing::warn!("connection lost: {reason}; still trying to reconnect");
                    false
                }
                ConnState::Reconnecting { attempt, reason } => {
                    tracing::info!(attempt, "reconnecting: {reason}");
                    false
                }
                _ => false,
            };
            if final_loss {
                flag.store(true, std::sync::atomic::Ordering::Release);
                let mp = mountpoint.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    nix::mount::umount2(&mp, nix::mount::MntFlags::MNT_DETACH)
                })
                .await;
                return;
            }
        }
    });
    lost
}

/// Kernel readahead of a mount, in bytes. The kernel's default for FUSE (128 KiB) allows about
/// one 128 KiB read per round trip, which caps sequential reads at a few MB/s on a 20 ms link;
/// 8 MiB keeps enough 1 MiB reads in flight to fill such a link.
const DEFAULT_READAHEAD: u64 = 8 * 1024 * 1024;

/// Set the readahead of the mount at `mountpoint` (its BDI in sysfs; root only, best effort).
fn set_readahead(mountpoint: &Path, bytes: u64) {
    let Ok(Some(entry)) = crate::mountinfo::mount_at(mountpoint) else {
        return;
    };
    let knob = format!("/sys/class/bdi/{}/read_ahead_kb", entry.device);
    if let Err(e) = std::fs::write(&knob, format!("{}\n", bytes / 1024)) {
        tracing::debug!("cannot set readahead ({knob}): {e}");
    }
}

/// How to take our mount down when asked to by a signal.
enum Unmounter {
    /// We mounted it with mount(2).
    Direct(PathBuf),
    /// fuser mounted it through fusermount3.
    Fuser(fuser::SessionUnmounter),
}

impl Unmounter {
    fn unmount(self) -> std::io::Result<()> {
        match self {
            Unmounter::Direct(path) => {
                nix::mount::umount2(&path, nix::mount::MntFlags::empty()).map_err(Into::into)
            }
            Unmounter::Fuser(mut u) => u.unmount(),
        }
    }
}

fn kernel_mount_options(req: &MountRequest, read_only: bool) -> KernelMountOptions {
    let o = &req.options;
    KernelMountOptions {
        fsname: fsname(req),
        read_only,
        allow_other: o.allow_other || o.allow_root,
        default_permissions: o.default_permissions,
        noexec: o.kernel_flags.iter().any(|f| f == "noexec"),
        noatime: o
            .kernel_flags
            .iter()
            .any(|f| f == "noatime" || f == "nodiratime"),
        sync: o.kernel_flags.iter().any(|f| f == "sync"),
    }
}

fn fsname(req: &MountRequest) -> String {
    req.options.fsname.clone().unwrap_or_else(|| {
        let user = req
            .remote
            .user
            .as_deref()
            .map(|u| format!("{u}@"))
            .unwrap_or_default();
        format!("{user}{}:{}", req.remote.host, req.remote.dir)
    })
}

/// Serve requests until the filesystem is unmounted, by `umount`/`fusermount3 -u` (the kernel
/// ends the session) or by a signal (we unmount ourselves, after flushing writes).
fn serve<R: Remote>(
    session: fuser::Session<FuseAdapter<R>>,
    unmounter: Unmounter,
    fs: Arc<Fs<R>>,
    rt: &tokio::runtime::Runtime,
    mountpoint: PathBuf,
    readiness: &mut Readiness,
) -> Result<(), MountError> {
    let signals_fs = fs.clone();
    // Set once a signal asked us to stop, before we unmount.
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_requested = stopping.clone();
    rt.spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) else {
            tracing::warn!("cannot install signal handlers; unmount with `awcp-mount umount`");
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = hup.recv() => {}
        }
        tracing::info!("signal received: flushing and unmounting");
        stop_requested.store(true, std::sync::atomic::Ordering::SeqCst);
        let flushed = last_flush(&signals_fs, "before the unmount").await;
        let mp = mountpoint.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Err(e) = unmounter.unmount() {
                // Busy: detach lazily so the process can still exit cleanly.
                tracing::info!("unmount of {} failed ({e}); detaching lazily", mp.display());
                let _ = nix::mount::umount2(&mp, nix::mount::MntFlags::MNT_DETACH);
            }
        })
        .await;
        // The session normally ends as soon as the kernel lets go. A process still holding
        // a file open in a lazily detached mount keeps it alive; we were asked to stop, so
        // stop (everything written has been flushed above).
        tokio::time::sleep(Duration::from_secs(5)).await;
        tracing::warn!("FUSE session still open 5 s after unmount; exiting anyway");
        std::process::exit(if flushed { 0 } else { 1 });
    });
    readiness.ready();
    let result = match session.run() {
        // The kernel ends the session of a mount we detached ourselves (busy at SIGTERM) with
        // ENODEV, or sometimes ECONNABORTED, once its last file is closed; fuser takes only
        // the first for a clean end. Either way the connection is over, as we asked.
        Err(e)
            if e.raw_os_error() == Some(libc::ECONNABORTED)
                && stopping.load(std::sync::atomic::Ordering::SeqCst) =>
        {
            tracing::debug!("FUSE connection ended with ECONNABORTED after our unmount");
            Ok(())
        }
        other => other,
    };
    // Writes still queued when the kernel let go (umount with open files is refused, so
    // normally none) get a last chance.
    let flushed = rt.block_on(last_flush(&fs, "at the end of the mount"));
    result.map_err(|e| {
        fail(
            MountErrorKind::Kernel,
            format!("FUSE session ended with an error: {e}"),
        )
    })?;
    match flushed {
        true => Ok(()),
        false => Err(fail(
            MountErrorKind::Network,
            "unmounted, but changes made through the mount did not all reach the server \
             (see the log above); check the remote directory",
        )),
    }
}

/// What `status` reports about a mount besides live counters.
#[derive(Debug, Clone)]
struct MountInfo {
    remote: String,
    mountpoint: PathBuf,
    expires_at: Option<SystemTime>,
    policy_source: String,
}

/// How long a downgrade waits for operations that passed their read-only check before it.
const MUTATIONS_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long the flush before the process ends (a signal, the end of the FUSE session) waits
/// for a server that has stopped answering but whose connection lives on (its sftp-server
/// hangs on a dead disk, while sshd answers the keepalives): the mount must still go away,
/// and the process end, when asked to (systemd's stop timeout is 90 s).
const LAST_FLUSH_WAIT: Duration = Duration::from_secs(60);

/// The least time the lease's end gives the downgrade before the unmount, whatever the grace
/// period (`grace_seconds = 0` must not drop writes a healthy server takes in a moment, nor
/// cut short the write-back of pages dirtied through `mmap`, itself bounded by 10 s); a
/// longer grace period gives it all of it.
const LEASE_FLUSH_WAIT: Duration = Duration::from_secs(15);

/// Set when the lease's end gave up waiting for the server to take the writes still on their
/// way (one mount per process). The flushes at the process's end then wait only
/// [`ABANDONED_FLUSH_WAIT`]: the server had the whole grace period already, and a process
/// lingering another minute after its mount is gone holds up whoever waits for it.
static FLUSH_ABANDONED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The last flush's wait once [`FLUSH_ABANDONED`]: a chance for a server that came back.
const ABANDONED_FLUSH_WAIT: Duration = Duration::from_secs(2);

/// A last flush of everything acknowledged, bounded by [`LAST_FLUSH_WAIT`] (or
/// [`ABANDONED_FLUSH_WAIT`]); what it could not send is said in the log.
/// False if some could not be sent (the process then ends with an error: `serve` must not
/// report such a delegation done).
async fn last_flush<R: Remote>(fs: &Arc<Fs<R>>, when: &str) -> bool {
    let wait = if FLUSH_ABANDONED.load(std::sync::atomic::Ordering::SeqCst) {
        ABANDONED_FLUSH_WAIT
    } else {
        LAST_FLUSH_WAIT
    };
    match tokio::time::timeout(wait, fs.flush_all()).await {
        Ok(Ok(())) => return true,
        Ok(Err(e)) => tracing::warn!("some writes could not be flushed {when}: {e}"),
        Err(_) => tracing::error!(
            "the server did not take the writes still on their way within {wait:?} {when}: they are lost"
        ),
    }
    false
}

/// Turn the mount read-only now: every mutating operation gets EROFS from this moment, writes
/// already acknowledged are flushed to the server, and (as root) the kernel mount itself is
/// remounted `ro` so tools see it in /proc/mounts too.
pub async fn downgrade<R: Remote>(fs: &Arc<Fs<R>>, mountpoint: &Path) -> Result<(), String> {
    // One at a time (the lease's end and `awcp-mount downgrade` may meet): a second one
    // turning the mount read-only while the first has the mapped pages written back would
    // refuse those writes and lose the pages. (One mount per process.)
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one = ONE_AT_A_TIME.lock().await;
    let first = !fs.is_read_only() && fs.refuse_changes_but_page_writeback();
    if first {
        write_back_mapped_pages(fs, mountpoint).await;
    }
    fs.set_read_only();
    // What passed its read-only check just before lands first (a rename waiting for a
    // lookup, a truncate for the writes before it), so that nothing is changed on the server
    // after the downgrade but the writes flushed below.
    if !fs.mutations_settled(MUTATIONS_WAIT).await {
        tracing::warn!(
            "downgrade: operations started before it were still on their way after {MUTATIONS_WAIT:?}; going on"
        );
    }
    let flushed = fs.flush_all().await;
    if first {
        tracing::warn!(mountpoint = %mountpoint.display(), "mount downgraded to read-only");
    }
    if first && nix::unistd::geteuid().is_root() {
        let mp = mountpoint.to_path_buf();
        tokio::spawn(remount_read_only(mp));
    }
    flushed.map_err(|e| format!("downgraded, but some writes failed to flush: {e}"))
}

/// Have the kernel write back the pages that shared writable mappings dirtied in the files
/// open for writing: they are in its page cache only, and written back whenever it likes,
/// which after the downgrade would be refused (EROFS) and lose them. `syncfs` would start
/// that writeback but, on FUSE, not wait for it (the kernel does not let a FUSE server hold
/// up `sync`); `fsync` of a file does wait, so each such file is opened through the mount and
/// fsynced, while the kernel's writes of its pages are still accepted. Bounded, so that a
/// server that stopped answering cannot hold up the downgrade (the pages are then lost as
/// before, and `msync` says so).
/// A file whose name was removed cannot be opened again, and is left to its descriptors.
async fn write_back_mapped_pages<R: Remote>(fs: &Arc<Fs<R>>, mountpoint: &Path) {
    let files: Vec<PathBuf> = fs
        .paths_open_for_writing()
        .into_iter()
        .map(|rel| mountpoint.join(rel))
        .collect();
    if files.is_empty() {
        return;
    }
    let sync = tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::OpenOptionsExt;
        for path in files {
            let synced = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&path)
                .and_then(|f| f.sync_data());
            if let Err(e) = synced {
                tracing::debug!(path = %path.display(), "write-back before the downgrade: {e}");
            }
        }
    });
    if tokio::time::timeout(Duration::from_secs(10), sync)
        .await
        .is_err()
    {
        tracing::warn!("writing back mapped pages before the downgrade took over 10 s; going on");
    }
}

/// Make the kernel mount itself read-only, keeping its other per-mount flags (a bind
/// remount replaces them all). The kernel refuses while a file is open for writing (EBUSY);
/// the filesystem already answers EROFS to every change, so such writers close soon: retry
/// until it works or the mount is gone.
async fn remount_read_only(mountpoint: PathBuf) {
    use nix::mount::MsFlags;
    use nix::sys::statvfs::FsFlags;
    loop {
        let mp = mountpoint.clone();
        let result = tokio::task::spawn_blocking(move || {
            let current = nix::sys::statvfs::statvfs(&mp)?.flags();
            let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
            for (have, keep) in [
                (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
                (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
                (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
                (FsFlags::ST_SYNCHRONOUS, MsFlags::MS_SYNCHRONOUS),
                (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
                (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
                (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
            ] {
                if current.contains(have) {
                    flags |= keep;
                }
            }
            nix::mount::mount(None::<&str>, &mp, None::<&str>, flags, None::<&str>)
        })
        .await;
        match result {
            Ok(Ok(())) => return,
            Ok(Err(nix::errno::Errno::EBUSY)) => {
                tracing::debug!(
                    "kernel remount read-only: a file is still open for writing; retrying"
                );
            }
            other => {
                tracing::info!("kernel remount read-only not possible ({other:?}); the filesystem refuses writes itself");
                return;
            }
        }
        if !crate::mountinfo::is_mount_point(&mountpoint).unwrap_or(false) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Sleep until the wall clock reads `at`. Looked at again every 10 s: the timers run on the
/// monotonic clock, which stops while the machine is suspended, and a lease ends by the
/// wall clock (a laptop resumed after the lease's end must not keep a writable mount).
async fn until_wall_clock(at: SystemTime) {
    const LOOK_AGAIN: Duration = Duration::from_secs(10);
    while let Ok(left) = at.duration_since(SystemTime::now()) {
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(LOOK_AGAIN)).await;
    }
}

/// At the lease's end: read-only at once, unmounted after the grace period.
async fn enforce_lease<R: Remote>(
    fs: Arc<Fs<R>>,
    mountpoint: PathBuf,
    expires_at: SystemTime,
    grace: Duration,
) {
    until_wall_clock(expires_at).await;
    tracing::warn!(
        "the lease expired: the mount is read-only now and will be unmounted in {} s",
        grace.as_secs()
    );
    let expired = tokio::time::Instant::now();
    // Bounded: a server that stopped answering (its connection alive) must not keep the
    // mount past the grace period. (The mount is read-only once the downgrade has begun.)
    let flush_wait = grace.max(LEASE_FLUSH_WAIT);
    match tokio::time::timeout(flush_wait, downgrade(&fs, &mountpoint)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("{e}"),
        Err(_) => {
            // (In case the downgrade was cut short before it turned the mount read-only.)
            fs.set_read_only();
            FLUSH_ABANDONED.store(true, std::sync::atomic::Ordering::SeqCst);
            tracing::error!(
                "the lease expired: the server did not take the writes still on their way within {flush_wait:?}; unmounting without them"
            )
        }
    }
    // (The policy bounds the grace to a day; a sum that overflowed would be a grace that
    // never ends, not a panic.)
    match expired.checked_add(grace) {
        Some(end) => tokio::time::sleep_until(end).await,
        None => std::future::pending().await,
    }
    tracing::warn!(
        "lease grace period over: unmounting {}",
        mountpoint.display()
    );
    let _ = tokio::task::spawn_blocking(move || {
        // (Busy: detached; the files still open keep working read-only until closed.)
        if let Err(e) = crate::unmount::unmount_or_detach(&mountpoint) {
            tracing::error!("the lease is over, but the unmount failed: {e}");
        }
    })
    .await;
}

fn control_handlers(
    fs: &Arc<Fs<SftpRemote>>,
    remote: &Arc<SftpRemote>,
    info: MountInfo,
) -> crate::control::Handlers {
    let status_fs = fs.clone();
    let status_remote = remote.clone();
    let downgrade_fs = fs.clone();
    let mountpoint = info.mountpoint.clone();
    crate::control::Handlers {
        status: Box::new(move || {
            use std::sync::atomic::Ordering::Relaxed;
            let u = status_fs.enforcer().quota.usage();
            let stats = &status_fs.stats;
            serde_json::json!({
                "mountpoint": info.mountpoint.display().to_string(),
                "remote": info.remote,
                "pid": std::process::id(),
                "access": if status_fs.is_read_only() { "ro" } else { "rw" },
                "connection": format!("{:?}", *status_remote.state().borrow()),
                "expires_at": info.expires_at.map(crate::policy::lease::format_rfc3339),
                "policy": info.policy_source,
                "quota": {
                    "bytes_used": u.bytes, "bytes_max": u.max_bytes,
                    "files_used": u.files, "files_max": u.max_files,
                },
                "ops": stats.ops.load(Relaxed),
                "bytes_read": stats.bytes_read.load(Relaxed),
                "bytes_written": stats.bytes_written.load(Relaxed),
                "opens_fetched_ahead": stats.opens_fetched_ahead.load(Relaxed),
                "opens_read_along": stats.opens_read_along.load(Relaxed),
                "opens_deferred": stats.opens_deferred.load(Relaxed),
                "setattrs_stat_along": stats.setattrs_stat_along.load(Relaxed),
                "attrs_along_writes": stats.attrs_along_writes.load(Relaxed),
                "dirs_listed_ahead": stats.dirs_listed_ahead.load(Relaxed),
                "unlinks_behind": stats.unlinks_behind.load(Relaxed),
                "bytes_striped": stats.bytes_striped.load(Relaxed),
                "writes_merged": stats.writes_merged.load(Relaxed),
                "setattrs_merged": stats.setattrs_merged.load(Relaxed),
                "writes_sent_again": stats.writes_sent_again.load(Relaxed),
                "bytes_copied_on_server": stats.bytes_copied_on_server.load(Relaxed),
                "shared_drops": stats.shared_drops.load(Relaxed),
                "open_files": status_fs.open_file_count(),
            })
        }),
        downgrade: Box::new(move || {
            let fs = downgrade_fs.clone();
            let mp = mountpoint.clone();
            Box::pin(async move { downgrade(&fs, &mp).await })
        }),
    }
}

/// The runtime the network side of a mount runs on: one worker thread (unless
/// `TOKIO_WORKER_THREADS` says otherwise, for experiments). Requests are first polled on the
/// FUSE threads and russh decrypts a connection in one task, so a second worker had little to
/// do but cost wake-ups: tokio wakes a second worker to search whenever it wakes one for new
/// work. Measured at RTT 0 (fresh mounts, medians of 5): context switches per 4 KiB read
/// 4.96 -> 2.95, the mount's CPU per read 95 -> 81 us, untar of 1,392 files 1.47 -> 1.34 s,
/// sequential and parallel reads no slower (see docs/PERFORMANCE.md).
fn io_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        builder.worker_threads(1);
    }
    builder.enable_all().thread_name("awcp-io").build()
}

fn root_has_quota_limit(policy: &Policy) -> bool {
    policy.max_bytes.is_some()
}

/// How many bytes the workspace held at mount time, for `df` (total = that + the quota).
/// A bounded walk in the background: `df` shows the budget alone until it is done.
async fn measure_base_usage(remote: Arc<SftpRemote>, root: PathBuf, enforcer: Arc<Enforcer>) {
    const MAX_ENTRIES: usize = 1_000_000;
    let mut total = 0u64;
    let mut seen = 0usize;
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = remote.read_dir(&dir).await else {
            continue;
        };
        for e in entries {
            seen += 1;
            match e.attrs.file_type() {
                crate::remote::FileKind::Dir => dirs.push(dir.join(&e.name)),
                crate::remote::FileKind::File => {
                    total = total.saturating_add(e.attrs.size.unwrap_or(0))
                }
                _ => {}
            }
        }
        if seen > MAX_ENTRIES {
            tracing::info!("workspace too large to measure for df; showing the quota alone");
            return;
        }
    }
    enforcer.quota.set_base(total);
}

/// Follow edits of the policy file: quota, symlink mode and cache lifetimes apply at once;
/// access can only be tightened (a policy that no longer allows rw downgrades the mount).
fn watch_policy(
    file: &Path,
    req: &MountRequest,
    fs: Arc<Fs<SftpRemote>>,
    mountpoint: PathBuf,
) -> Option<crate::policy::reload::PolicyWatch> {
    let tightening = req.options.tightening();
    let rt = fs.runtime().clone();
    let watched = crate::policy::reload::watch(
        file,
        move |p| {
            p.restate(&tightening);
            Ok(())
        },
        move |p: Policy| {
            fs.enforcer().apply(&p);
            fs.set_cache_config(p.cache);
            if !p.allows(AccessMode::Rw) && !fs.is_read_only() {
                let fs = fs.clone();
                let mp = mountpoint.clone();
                rt.spawn(async move {
                    if let Err(e) = downgrade(&fs, &mp).await {
                        tracing::warn!("{e}");
                    }
                });
            }
        },
    );
    match watched {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!("the policy will not be reloaded live: {e}");
            None
        }
    }
}
