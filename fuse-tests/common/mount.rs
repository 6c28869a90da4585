//! A live `awcp-mount` FUSE mount for integration tests.
//!
//! [`TestMount`] runs the built binary against a [`TestSshd`] (its own, or one the test owns),
//! on a mount point in a temporary directory of its own (never inside the sshd's directory:
//! `TempDir`'s drop deletes recursively, and a recursive delete through a live mount would
//! delete the export). Daemon mode (the default, as sshfs) checks that the command exits 0 and
//! that the mount is in `/proc/self/mountinfo` as soon as it has; foreground mode (`-f`) keeps
//! the process as a child the test owns, for signal and exit-status tests.
//!
//! On drop (also when a test panics) the mount is unmounted (`awcp-mount umount`, falling back
//! to `umount -l`), the mount process is waited for (and killed by its PID if it hangs), and the
//! mount point is removed with `rmdir` only, and only after mountinfo shows nothing is mounted
//! there.
//!
//! Needs root, `/dev/fuse`, and what [`TestSshd`] needs.

#![allow(dead_code)] // each test binary uses a different subset

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::sshd::TestSshd;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_awcp-mount");

/// Mount options that turn off every metadata cache, so a change made on either side is
/// visible on the other at once.
pub const NO_CACHE: &str = "attr_timeout=0,entry_timeout=0,negative_timeout=0,dcache_timeout=0";

/// How long mounting (connect + handshake) may take before a test fails.
const MOUNT_DEADLINE: Duration = Duration::from_secs(30);
/// How long the mount process may take to exit after an unmount.
const EXIT_DEADLINE: Duration = Duration::from_secs(15);
/// How long a daemon-mode mount's pipes may stay open after the command has exited.
const PIPE_EOF_DEADLINE: Duration = Duration::from_secs(30);
/// How long a mount process that failed may take to exit.
const FAILED_EXIT_DEADLINE: Duration = Duration::from_secs(30);

// ------------------------------------------------------------------ mountinfo

/// Everything mounted now (the product's own mountinfo parser).
fn mounts() -> Vec<awcp_mount::mountinfo::MountEntry> {
    awcp_mount::mountinfo::current().expect("read /proc/self/mountinfo")
}

/// Filesystem types mounted at `path` (exactly; bottom of the stack first), from
/// `/proc/self/mountinfo`. `path` must be canonical.
pub fn fstypes_at(path: &Path) -> Vec<String> {
    mounts()
        .into_iter()
        .filter(|m| m.mount_point == path)
        .map(|m| m.fstype)
        .collect()
}

/// Something is mounted at `path`.
pub fn is_mounted(path: &Path) -> bool {
    !fstypes_at(path).is_empty()
}

/// The per-mount options (`ro`, `nosuid`, ...) of what is mounted at `path` (the top of the
/// stack), from `/proc/self/mountinfo`; None when nothing is mounted there. `path` must be
/// canonical.
pub fn mount_options_at(path: &Path) -> Option<Vec<String>> {
    mounts()
        .into_iter()
        .rfind(|m| m.mount_point == path)
        .map(|m| m.options.split(',').map(str::to_string).collect())
}

/// Mount points at `dir` or below it (canonical `dir`), in mountinfo order.
pub fn mount_points_under(dir: &Path) -> Vec<PathBuf> {
    // mountinfo holds canonical paths (a TMPDIR through a symlink would never match).
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    mounts()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|mp| mp.starts_with(&dir))
        .collect()
}

/// An awcp-mount filesystem (`fuse.awcp`) is mounted at `path`.
pub fn is_awcp_mounted(path: &Path) -> bool {
    fstypes_at(path).iter().any(|t| t == "fuse.awcp")
}

/// The `status` answer of the mount at `mnt` (through its control socket).
pub fn mount_status(mnt: &Path) -> serde_json::Value {
    awcp_mount::control::request(mnt, "status")
        .unwrap_or_else(|e| panic!("status of {}: {e}", mnt.display()))
}

/// A counter from the `status` of the mount at `mnt`.
pub fn status_counter(mnt: &Path, key: &str) -> u64 {
    let st = mount_status(mnt);
    st[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in status: {st}"))
}

/// Poll `cond` until it holds or `timeout` passes; returns whether it held.
pub fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ------------------------------------------------------------------ processes

/// The process exists and is not a zombie.
pub fn pid_alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// PIDs of live processes whose command line is exactly `argv`.
pub fn pids_with_cmdline(argv: &[OsString]) -> Vec<i32> {
    let want: Vec<u8> = argv.iter().fold(Vec::new(), |mut acc, a| {
        acc.extend_from_slice(a.as_bytes());
        acc.push(0);
        acc
    });
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").expect("read /proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid as u32 == std::process::id() {
            continue;
        }
        if fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want) && pid_alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// Run a command (stdin empty) that must succeed; returns its output. Panics, with its
/// stderr, if it cannot run or fails.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run a command to completion with a deadline (killing it, by PID, if it overruns); returns
/// the exit status, stdout and stderr. Panics if it cannot run or overruns.
pub fn run_with_deadline(cmd: &mut Command, timeout: Duration) -> (ExitStatus, String, String) {
    try_run_with_deadline(cmd, timeout).unwrap_or_else(|e| panic!("{e}"))
}

/// [`run_with_deadline`] without panicking (for use in `Drop`, which may run while a test
/// panics: a second panic would abort the whole test binary).
pub fn try_run_with_deadline(
    cmd: &mut Command,
    timeout: Duration,
) -> Result<(ExitStatus, String, String), String> {
    let out_dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let (o, e) = (out_dir.path().join("out"), out_dir.path().join("err"));
    let files = fs::File::create(&o).and_then(|a| Ok((a, fs::File::create(&e)?)));
    let (out_file, err_file) = files.map_err(|err| format!("output files: {err}"))?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out_file)
        .stderr(err_file)
        .spawn()
        .map_err(|err| format!("cannot run {cmd:?}: {err}"))?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(err) => return Err(format!("waiting for {cmd:?}: {err}")),
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{cmd:?} did not finish within {timeout:?}; stderr: {}",
                fs::read_to_string(&e).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok((
        status,
        fs::read_to_string(&o).unwrap_or_default(),
        fs::read_to_string(&e).unwrap_or_default(),
    ))
}

// ------------------------------------------------------------------ mount point

/// A mount point `<tmp>/awcp-mnt-XXXXXX/mnt`, in a directory of its own, with a policy file
/// `<tmp>/awcp-mnt-XXXXXX/policy.toml` whose mount root is that directory (the built-in policy
/// allows mounts only below `/var/lib/awcp/mounts`). Removed on drop with `rmdir` only, and
/// only when nothing is mounted there.
pub struct MountPoint {
    /// The parent directory (ours, not shared with anything).
    pub base: PathBuf,
    /// The (empty) mount point directory, canonical.
    pub path: PathBuf,
}

impl MountPoint {
    pub fn new() -> MountPoint {
        MountPoint::new_in(&std::env::temp_dir())
    }

    /// A mount point below `parent` (created if missing).
    pub fn new_in(parent: &Path) -> MountPoint {
        fs::create_dir_all(parent).expect("create the mount point's parent");
        let base = nix::unistd::mkdtemp(&parent.join("awcp-mnt-XXXXXX"))
            .expect("mkdtemp")
            .canonicalize()
            .unwrap();
        let path = base.join("mnt");
        fs::create_dir(&path).expect("mkdir mount point");
        fs::write(
            MountPoint::policy_path(&path),
            format!(
                "mount_root = {:?}\n",
                base.to_str().expect("UTF-8 temp dir")
            ),
        )
        .unwrap();
        MountPoint { base, path }
    }

    /// The policy file for the mount point `mnt` made by [`MountPoint::new`].
    pub fn policy_path(mnt: &Path) -> PathBuf {
        mnt.parent()
            .expect("mount point has a parent")
            .join("policy.toml")
    }
}

impl Default for MountPoint {
    fn default() -> Self {
        MountPoint::new()
    }
}

impl Drop for MountPoint {
    fn drop(&mut self) {
        if is_mounted(&self.path) {
            eprintln!(
                "warning: {} is still mounted; leaving it (and {}) in place",
                self.path.display(),
                self.base.display()
            );
            return;
        }
        // Never a recursive delete: the mount point must be empty, and the base holds only
        // files this harness wrote (logs) besides it.
        if self.path.exists() {
            if let Err(e) = fs::remove_dir(&self.path) {
                eprintln!("warning: rmdir {}: {e}", self.path.display());
            }
        }
        if let Ok(entries) = fs::read_dir(&self.base) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_file()) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        if let Err(e) = fs::remove_dir(&self.base) {
            eprintln!("warning: rmdir {}: {e}", self.base.display());
        }
    }
}

// ------------------------------------------------------------------ the mount

/// Why a mount attempt failed.
#[derive(Debug)]
pub struct MountFailure {
    /// Exit status (None: still running at the deadline, then killed).
    pub status: Option<ExitStatus>,
    pub stderr: String,
    /// Something was mounted at the mount point afterwards.
    pub left_mounted: bool,
    /// A mount process with our command line was still alive afterwards.
    pub process_left: bool,
}

/// `USER@127.0.0.1:DIR MNT -p PORT --policy POLICY` (the policy [`MountPoint`] wrote next to
/// `mnt`), without any key or known_hosts option.
pub fn base_args(sshd: &TestSshd, remote_dir: &Path, mnt: &Path) -> Vec<OsString> {
    let mut remote = OsString::from(format!("{}@127.0.0.1:", sshd.user));
    remote.push(remote_dir);
    vec![
        remote,
        mnt.into(),
        "-p".into(),
        sshd.port.to_string().into(),
        "--policy".into(),
        MountPoint::policy_path(mnt).into(),
    ]
}

/// `-o NAME=PATH` as two arguments.
pub fn opt_path(name: &str, path: &Path) -> [OsString; 2] {
    let mut o = OsString::from(format!("{name}="));
    o.push(path);
    ["-o".into(), o]
}

/// The usual command line for `sshd`: `USER@127.0.0.1:DIR MNT -p PORT -o IdentityFile=KEY
/// -o UserKnownHostsFile=KNOWN_HOSTS` followed by `-o OPT` for each of `opts`.
pub fn standard_args(
    sshd: &TestSshd,
    remote_dir: &Path,
    mnt: &Path,
    opts: &[&str],
) -> Vec<OsString> {
    let mut args = base_args(sshd, remote_dir, mnt);
    args.extend(opt_path("IdentityFile", &sshd.key_path));
    args.extend(opt_path("UserKnownHostsFile", &sshd.known_hosts_path));
    for o in opts {
        args.push("-o".into());
        args.push(o.into());
    }
    args
}

/// How [`TestMount::launch_with`] runs the binary.
#[derive(Debug, Clone, Copy, Default)]
pub struct Launch<'a> {
    /// `-f` mode: the process stays our child.
    pub foreground: bool,
    /// Working directory of the process.
    pub cwd: Option<&'a Path>,
    /// Daemon mode: give the process pipes for stdout and stderr, as a caller capturing its
    /// output does, and require both to be at EOF once the command has exited.
    pub pipes: bool,
    /// Make the mount point below this directory instead of the temporary directory.
    pub mount_parent: Option<&'a Path>,
}

/// A live mount. Dropping it unmounts and cleans up.
pub struct TestMount {
    /// The mount point (canonical).
    pub mnt: PathBuf,
    /// Where the export is on the server's disk (the remote directory that was mounted).
    pub export: PathBuf,
    /// The command line, without the program name.
    pub args: Vec<OsString>,
    mount_point: Option<MountPoint>,
    /// `-f` mode: the mount process, our child.
    child: Option<Child>,
    /// Daemon mode: the PID of the daemonized mount process (found by its command line).
    daemon_pid: Option<i32>,
    stderr_path: PathBuf,
    exit_status: Option<ExitStatus>,
    /// Processes that already had our command line before we ran it (another mount with the
    /// same arguments, e.g. the one a "busy mount point" test collides with): never ours.
    preexisting: Vec<i32>,
    /// An sshd started for this mount alone; dropped after the unmount.
    own_sshd: Option<TestSshd>,
}

impl TestMount {
    /// Start an sshd of its own and mount its export in daemon mode with extra `-o` options.
    pub fn start(opts: &[&str]) -> TestMount {
        let sshd = TestSshd::start();
        let mut m = TestMount::daemon(&sshd, opts);
        m.own_sshd = Some(sshd);
        m
    }

    /// The sshd this mount started (panics for a mount of a borrowed sshd).
    pub fn sshd(&self) -> &TestSshd {
        self.own_sshd
            .as_ref()
            .expect("this mount does not own its sshd")
    }

    /// Mount `sshd.export_dir` in daemon mode.
    pub fn daemon(sshd: &TestSshd, opts: &[&str]) -> TestMount {
        Self::daemon_dir(sshd, &sshd.export_dir, opts)
    }

    /// Mount the server directory `dir` in daemon mode.
    pub fn daemon_dir(sshd: &TestSshd, dir: &Path, opts: &[&str]) -> TestMount {
        Self::launch(false, dir, |mnt| standard_args(sshd, dir, mnt, opts))
            .unwrap_or_else(|f| panic!("mount failed: {f:?}\nsshd log:\n{}", sshd.log()))
    }

    /// Mount `sshd.export_dir` with `-f`, as a child process of the test.
    pub fn foreground(sshd: &TestSshd, opts: &[&str]) -> TestMount {
        let dir = &sshd.export_dir;
        Self::launch(true, dir, |mnt| {
            let mut a = standard_args(sshd, dir, mnt, opts);
            a.push("-f".into());
            a
        })
        .unwrap_or_else(|f| panic!("mount failed: {f:?}\nsshd log:\n{}", sshd.log()))
    }

    /// Run the binary with the arguments `args(mount_point)` builds. Daemon mode: the command
    /// must exit (0 for success) and the mount must then already be live. Foreground mode:
    /// waits (bounded) until the mount shows up or the process exits.
    pub fn launch(
        foreground: bool,
        export: &Path,
        args: impl FnOnce(&Path) -> Vec<OsString>,
    ) -> Result<TestMount, MountFailure> {
        let how = Launch {
            foreground,
            ..Default::default()
        };
        Self::launch_with(how, export, args)
    }

    /// [`TestMount::launch`] with more choices.
    pub fn launch_with(
        how: Launch,
        export: &Path,
        args: impl FnOnce(&Path) -> Vec<OsString>,
    ) -> Result<TestMount, MountFailure> {
        let foreground = how.foreground;
        let mp = match how.mount_parent {
            Some(parent) => MountPoint::new_in(parent),
            None => MountPoint::new(),
        };
        let mnt = mp.path.clone();
        let args = args(&mnt);
        let stderr_path = mp.base.join("stderr.log");
        let mut m = TestMount {
            mnt: mnt.clone(),
            export: export.to_path_buf(),
            args: args.clone(),
            mount_point: Some(mp),
            child: None,
            daemon_pid: None,
            stderr_path: stderr_path.clone(),
            exit_status: None,
            preexisting: Vec::new(),
            own_sshd: None,
        };
        m.preexisting = m.same_cmdline();
        let mut cmd = Command::new(BIN);
        if let Some(dir) = how.cwd {
            cmd.current_dir(dir);
        }
        cmd.args(&args).stdin(Stdio::null());
        let pipes = how.pipes && !foreground;
        if pipes {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        } else {
            cmd.stdout(Stdio::null())
                .stderr(fs::File::create(&stderr_path).unwrap());
        }
        let mut child = cmd.spawn().expect("spawn awcp-mount");
        // With pipes: read both to EOF in threads; EOF means every holder closed them.
        let (eof_tx, eof_rx) = std::sync::mpsc::channel::<(bool, Vec<u8>)>();
        if pipes {
            let out = child.stdout.take().unwrap();
            let err = child.stderr.take().unwrap();
            for (is_err, mut r) in [
                (false, Box::new(out) as Box<dyn std::io::Read + Send>),
                (true, Box::new(err)),
            ] {
                let tx = eof_tx.clone();
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let _ = r.read_to_end(&mut buf);
                    let _ = tx.send((is_err, buf));
                });
            }
        }
        let deadline = Instant::now() + MOUNT_DEADLINE;
        if foreground {
            loop {
                if is_awcp_mounted(&mnt) {
                    m.child = Some(child);
                    return Ok(m);
                }
                if let Some(status) = child.try_wait().unwrap() {
                    return Err(m.failure(Some(status), String::new()));
                }
                if Instant::now() > deadline {
                    m.child = Some(child);
                    return Err(m.failure(None, format!("not mounted within {MOUNT_DEADLINE:?}")));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                m.find_daemon();
                return Err(m.failure(None, format!("did not exit within {MOUNT_DEADLINE:?}")));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // Exit 0 means "the mount is live": no waiting here.
        let mounted = is_awcp_mounted(&mnt);
        m.find_daemon();
        if pipes {
            // The caller has its exit status; its pipes must be at EOF too (a daemon that
            // kept them would hang every caller that waits for EOF, as subprocess.run does).
            // Only a hang guard: EOF is there at once when they are closed.
            let mut stderr = Vec::new();
            for _ in 0..2 {
                match eof_rx.recv_timeout(PIPE_EOF_DEADLINE) {
                    Ok((is_err, bytes)) if is_err => stderr = bytes,
                    Ok(_) => {}
                    Err(_) => {
                        return Err(m.failure(
                            Some(status),
                            "the daemon kept the caller's stdout or stderr pipe open".into(),
                        ))
                    }
                }
            }
            fs::write(&stderr_path, stderr).unwrap();
        }
        if !status.success() || !mounted {
            return Err(m.failure(Some(status), String::new()));
        }
        assert!(
            m.daemon_pid.is_some(),
            "mounted, but no daemon process with our command line"
        );
        Ok(m)
    }

    /// Describe a failed mount. Gives a failing daemon a moment to finish exiting (it reports
    /// its error to the waiting parent just before it exits): a hang guard, over as soon as it
    /// has. A `-f` child we keep is not waited for (it is not reported as left).
    fn failure(&mut self, status: Option<ExitStatus>, note: String) -> MountFailure {
        let process_left = self.child.is_none()
            && !poll_until(FAILED_EXIT_DEADLINE, || self.same_cmdline_new().is_empty());
        let mut stderr = self.stderr();
        if !note.is_empty() {
            stderr = format!("{note}: {stderr}");
        }
        MountFailure {
            status,
            stderr,
            left_mounted: is_mounted(&self.mnt),
            process_left,
        }
    }

    /// Live processes running the binary with our arguments.
    pub fn same_cmdline(&self) -> Vec<i32> {
        let mut argv = vec![OsString::from(BIN)];
        argv.extend(self.args.iter().cloned());
        pids_with_cmdline(&argv)
    }

    /// Those of them that we started.
    fn same_cmdline_new(&self) -> Vec<i32> {
        let mut pids = self.same_cmdline();
        pids.retain(|p| !self.preexisting.contains(p));
        pids
    }

    fn find_daemon(&mut self) {
        let pids = self.same_cmdline_new();
        assert!(
            pids.len() <= 1,
            "several processes with our command line: {pids:?}"
        );
        self.daemon_pid = pids.first().copied();
    }

    /// A path inside the mount.
    pub fn p(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.mnt.join(rel)
    }

    /// The same path on the server's disk.
    pub fn e(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.export.join(rel)
    }

    /// PID of the mount process (the `-f` child or the daemon).
    pub fn pid(&self) -> i32 {
        match (&self.child, self.daemon_pid) {
            (Some(c), _) => c.id() as i32,
            (None, Some(p)) => p,
            _ => panic!("no mount process"),
        }
    }

    /// What the mount process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Send a signal to the mount process (which the test started).
    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid()), sig).expect("kill");
    }

    /// Wait (bounded) for the mount process to exit. Returns its exit status for a `-f` child,
    /// None for a daemon (not our child) or when it did not exit in time.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(s) = self.exit_status {
            return Some(s);
        }
        let deadline = Instant::now() + timeout;
        if let Some(child) = &mut self.child {
            loop {
                if let Some(s) = child.try_wait().unwrap() {
                    self.exit_status = Some(s);
                    self.child = None;
                    return Some(s);
                }
                if Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if let Some(pid) = self.daemon_pid {
            if poll_until(timeout, || !pid_alive(pid)) {
                self.daemon_pid = None;
            }
        }
        None
    }

    /// The mount process has exited.
    pub fn exited(&mut self) -> bool {
        self.wait_exit(Duration::ZERO);
        self.child.is_none() && self.daemon_pid.is_none()
    }

    /// Unmount with `awcp-mount umount`; falls back to `umount -l` if that fails. Returns the
    /// `awcp-mount umount` result.
    pub fn unmount(&mut self) -> Result<(), String> {
        if !is_mounted(&self.mnt) {
            return Ok(());
        }
        let result = try_run_with_deadline(
            Command::new(BIN).arg("umount").arg(&self.mnt),
            EXIT_DEADLINE,
        );
        let msg = match result {
            Ok((status, _, _)) if status.success() => return Ok(()),
            Ok((status, _, err)) => {
                format!("awcp-mount umount {}: {status}: {err}", self.mnt.display())
            }
            Err(e) => e,
        };
        self.detach();
        Err(msg)
    }

    /// `umount -l`, if an awcp mount is still there.
    fn detach(&self) {
        if is_awcp_mounted(&self.mnt) {
            eprintln!("detaching {} with umount -l", self.mnt.display());
            if let Err(e) = try_run_with_deadline(
                Command::new("umount").arg("-l").arg(&self.mnt),
                EXIT_DEADLINE,
            ) {
                eprintln!("warning: {e}");
            }
        }
    }

    fn teardown(&mut self) {
        if is_awcp_mounted(&self.mnt) {
            if let Err(e) = self.unmount() {
                eprintln!("warning: {e}");
            }
        }
        if self.wait_exit(EXIT_DEADLINE).is_none() && !self.exited() {
            eprintln!(
                "warning: mount process {} did not exit after unmount; killing it",
                self.pid()
            );
            // Only the process this harness started, by its PID.
            let _ = kill(Pid::from_raw(self.pid()), Signal::SIGKILL);
            if let Some(mut c) = self.child.take() {
                let _ = c.wait();
            }
            self.daemon_pid = None;
            // A killed FUSE daemon leaves a dead mount behind.
            self.detach();
        }
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        self.teardown();
        // MountPoint's drop checks mountinfo again before any rmdir.
        drop(self.mount_point.take());
    }
}

/// Like `OsStr::new` for raw bytes (non-UTF-8 names).
pub fn os(bytes: &[u8]) -> &OsStr {
    OsStr::from_bytes(bytes)
}
