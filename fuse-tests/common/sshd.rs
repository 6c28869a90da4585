//! A private OpenSSH server for integration tests.
//!
//! [`TestSshd::start`] creates a temporary directory with a fresh ed25519 host key, user key,
//! a second (unauthorized) user key and a user CA, writes an `sshd_config` that listens on a
//! free port of 127.0.0.1 only, serves SFTP with `internal-sftp` and trusts the CA, and runs
//! `/usr/sbin/sshd -D` as a child process. Everything is removed (and the server killed, by
//! its PID) when the value is dropped, also when a test panics.
//!
//! Needs: Linux, root (sshd must be able to switch to the test user, which is the current
//! user), `/usr/sbin/sshd` and `ssh-keygen` (Debian package `openssh-server`).
//!
//! ```ignore
//! mod common;
//! let sshd = common::sshd::TestSshd::start();
//! let remote = SftpRemote::connect(sshd.sftp_config()).await?;
//! // files are in sshd.export_dir
//! ```

#![allow(dead_code)] // each test binary uses a different subset

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use awcp_mount::remote::sftp::{HostKeyPolicy, Identity, SshConfig};

use super::mount::run_ok;

const SSHD: &str = "/usr/sbin/sshd";

/// A running private sshd. Fields are read-only information for tests.
pub struct TestSshd {
    /// Owns every file below; deleted on drop.
    pub dir: tempfile::TempDir,
    /// TCP port on 127.0.0.1.
    pub port: u16,
    /// The login user (the current user, normally root).
    pub user: String,
    /// Private ed25519 key whose public half is in `authorized_keys`.
    pub key_path: PathBuf,
    /// Private ed25519 key the server does NOT accept (for authentication failure tests).
    pub wrong_key_path: PathBuf,
    /// The server's host public key, one line: `ssh-ed25519 AAAA... comment`.
    pub host_pubkey: String,
    /// A known_hosts file with the correct entry for `[127.0.0.1]:port`.
    pub known_hosts_path: PathBuf,
    /// Private key of a user CA the server trusts (`TrustedUserCAKeys`); sign with
    /// [`TestSshd::sign_user_cert`].
    pub ca_key_path: PathBuf,
    /// An empty directory for tests to work in (absolute path, as the server sees it too).
    pub export_dir: PathBuf,
    /// sshd's log (stderr, `LogLevel ERROR`).
    pub log_path: PathBuf,
    config_path: PathBuf,
    extra_config: String,
    child: Option<Child>,
}

fn keygen(path: &Path, comment: &str) {
    run_ok(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
            .arg(path),
    );
}

/// A free loopback port, never the same twice in this process: a test that stops its sshd
/// and restarts it later on the same port must not find another test's sshd there.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .expect("bind 127.0.0.1:0")
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

fn current_user() -> String {
    let uid = nix::unistd::getuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| "root".into())
}

impl TestSshd {
    /// Generate keys and config, start sshd and wait until it accepts connections.
    pub fn start() -> TestSshd {
        TestSshd::start_with_config("")
    }

    /// Like [`TestSshd::start`], with extra `sshd_config` lines placed *before* the defaults
    /// (for most keywords sshd uses the first value it reads, so these override them), e.g.
    /// `"ForceCommand /bin/false\n"`.
    pub fn start_with_config(extra: &str) -> TestSshd {
        let dir = tempfile::Builder::new()
            .prefix("awcp-sshd-")
            .tempdir()
            .expect("tempdir");
        let d = dir.path().to_path_buf();
        let host_key = d.join("host_ed25519");
        let key_path = d.join("id_ed25519");
        let wrong_key_path = d.join("wrong_ed25519");
        let ca_key_path = d.join("user_ca");
        keygen(&host_key, "test-host");
        keygen(&key_path, "test-user");
        keygen(&wrong_key_path, "not-authorized");
        keygen(&ca_key_path, "test-ca");
        fs::copy(key_path.with_extension("pub"), d.join("authorized_keys")).unwrap();
        let export_dir = d.join("export");
        fs::create_dir(&export_dir).unwrap();
        // sshd's privilege separation directory.
        fs::create_dir_all("/run/sshd").expect("mkdir /run/sshd");

        let host_pubkey = fs::read_to_string(host_key.with_extension("pub"))
            .unwrap()
            .trim()
            .to_string();
        let mut sshd = TestSshd {
            port: 0,
            user: current_user(),
            key_path,
            wrong_key_path,
            host_pubkey,
            known_hosts_path: d.join("known_hosts"),
            ca_key_path,
            export_dir,
            log_path: d.join("sshd.log"),
            config_path: d.join("sshd_config"),
            extra_config: extra.to_string(),
            child: None,
            dir,
        };
        // The port may be taken between probing and sshd binding it: retry a few times.
        for attempt in 0.. {
            sshd.port = free_port();
            sshd.write_config();
            match sshd.spawn() {
                Ok(()) => break,
                Err(e) if attempt < 5 => eprintln!("sshd start failed ({e}), retrying"),
                Err(e) => panic!("cannot start sshd: {e}"),
            }
        }
        fs::write(
            &sshd.known_hosts_path,
            format!("[127.0.0.1]:{} {}\n", sshd.port, sshd.host_pubkey),
        )
        .unwrap();
        sshd
    }

    fn write_config(&self) {
        let d = self.dir.path();
        let cfg = format!(
            "{extra}\
             Port {port}\n\
             ListenAddress 127.0.0.1\n\
             HostKey {hk}\n\
             PidFile {pid}\n\
             AuthorizedKeysFile {ak}\n\
             TrustedUserCAKeys {ca}.pub\n\
             UsePAM no\n\
             StrictModes no\n\
             PermitRootLogin yes\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             PubkeyAuthentication yes\n\
             Subsystem sftp internal-sftp\n\
             LogLevel ERROR\n",
            extra = self.extra_config,
            port = self.port,
            hk = d.join("host_ed25519").display(),
            pid = d.join("sshd.pid").display(),
            ak = d.join("authorized_keys").display(),
            ca = self.ca_key_path.display(),
        );
        fs::write(&self.config_path, cfg).unwrap();
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .unwrap();
        let mut child = Command::new(SSHD)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(&self.config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run {SSHD}: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Err(format!(
                    "sshd exited with {status}: {}",
                    fs::read_to_string(&self.log_path).unwrap_or_default()
                ));
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err("sshd did not accept connections within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// PID of the listening sshd.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("sshd not running").id()
    }

    /// Kill the per-connection sshd processes (children of our sshd), which drops every
    /// client connection while the server keeps listening. Returns how many were killed.
    pub fn kill_connections(&self) -> usize {
        kill_descendants(self.pid())
    }

    /// Open file descriptors of all SFTP server processes of this sshd (`internal-sftp`), to
    /// check that the client does not leak server handles. Each process also has a few fds of
    /// its own, so compare against a baseline.
    pub fn sftp_server_fds(&self) -> usize {
        self.sftp_server_pids()
            .into_iter()
            .map(|pid| {
                fs::read_dir(format!("/proc/{pid}/fd"))
                    .map(|d| d.count())
                    .unwrap_or(0)
            })
            .sum()
    }

    /// The SFTP server processes of this sshd (`internal-sftp`, one per SFTP channel).
    pub fn sftp_server_pids(&self) -> Vec<i32> {
        descendants(self.pid() as i32)
            .into_iter()
            .filter(|pid| {
                fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).contains("internal-sftp"))
                    .unwrap_or(false)
            })
            .collect()
    }

    /// Stop every SFTP server process of this sshd (SIGSTOP) until the guard is dropped
    /// (SIGCONT, also when the test panics): requests pile up unanswered, as over a slow
    /// link, whatever this machine's speed. The connection itself stays up. Only processes
    /// running now are stopped: a channel opened later (lanes, a reconnect) gets a running
    /// one. Keep the paused stretch short and free of anything that waits for an answer.
    pub fn pause_sftp_servers(&self) -> PausedSftp {
        let pids = self.sftp_server_pids();
        assert!(!pids.is_empty(), "no SFTP server process to pause");
        for &pid in &pids {
            signal(pid, nix::sys::signal::Signal::SIGSTOP);
        }
        PausedSftp(pids)
    }

    /// Stop sshd (and its connections). [`TestSshd::restart`] starts it again.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let children = descendants(child.id() as i32);
            let _ = child.kill();
            let _ = child.wait();
            for pid in children {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    /// Stop and start sshd on the same port with the same keys.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn().expect("restart sshd");
    }

    /// Stop, give the server a new host key, and start it again on the same port: a server
    /// reinstalled, or someone else answering at its address.
    pub fn restart_with_new_host_key(&mut self) {
        self.stop();
        let host_key = self.dir.path().join("host_ed25519");
        fs::remove_file(&host_key).unwrap();
        fs::remove_file(host_key.with_extension("pub")).unwrap();
        keygen(&host_key, "another-host");
        self.host_pubkey = fs::read_to_string(host_key.with_extension("pub"))
            .unwrap()
            .trim()
            .to_string();
        self.spawn().expect("restart sshd");
    }

    /// Sign `<key_path>.pub` with the test CA for `principal`, valid for `validity`
    /// (ssh-keygen `-V` syntax, e.g. `+1h`). Returns the certificate's path.
    pub fn sign_user_cert(&self, principal: &str, validity: &str) -> PathBuf {
        let pubkey = self.key_path.with_extension("pub");
        run_ok(
            Command::new("ssh-keygen")
                .arg("-q")
                .arg("-s")
                .arg(&self.ca_key_path)
                .args(["-I", "test-cert", "-n", principal, "-V", validity])
                .arg(&pubkey),
        );
        self.dir.path().join("id_ed25519-cert.pub")
    }

    /// A client config for this server: the authorized key, the correct known_hosts file,
    /// short timeouts, no reconnect.
    pub fn sftp_config(&self) -> SshConfig {
        let mut cfg = SshConfig::new(
            "127.0.0.1",
            self.user.clone(),
            Identity::KeyFile(self.key_path.clone()),
        );
        cfg.port = self.port;
        cfg.host_key_policy = HostKeyPolicy::KnownHostsFile(self.known_hosts_path.clone());
        cfg.connect_timeout = Duration::from_secs(15);
        cfg
    }

    /// The sshd log so far (for assertion messages).
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for TestSshd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// All descendants of `root`, parents before children.
/// SIGKILL every descendant of the sshd `root` (this harness's own: see
/// [`TestSshd::kill_connections`]); how many were killed.
pub fn kill_descendants(root: u32) -> usize {
    let mut killed = 0;
    for pid in descendants(root as i32) {
        if nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .is_ok()
        {
            killed += 1;
        }
    }
    killed
}

/// Whether a descendant of `root` runs the program `comm` (as /proc/PID/comm names it).
pub fn has_descendant_named(root: u32, comm: &str) -> bool {
    descendants(root as i32).into_iter().any(|pid| {
        fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == comm)
    })
}

fn descendants(root: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut queue = vec![root];
    while let Some(p) = queue.pop() {
        for c in child_pids(p) {
            out.push(c);
            queue.push(c);
        }
    }
    out
}

/// Direct children of `parent`, from /proc.
fn child_pids(parent: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Field 4 (ppid) follows the parenthesised command name, which may contain spaces.
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let ppid = after.split_whitespace().nth(1).and_then(|s| s.parse().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// SFTP server processes stopped by [`TestSshd::pause_sftp_servers`]; continued on drop
/// (so it must be bound to a name: `let _ = ...` would continue them at once).
#[must_use = "the SFTP servers are continued as soon as the guard is dropped"]
pub struct PausedSftp(Vec<i32>);

impl Drop for PausedSftp {
    fn drop(&mut self) {
        for &pid in &self.0 {
            signal(pid, nix::sys::signal::Signal::SIGCONT);
        }
    }
}
