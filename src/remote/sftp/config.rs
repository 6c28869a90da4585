//! How to reach the SSH server: address, identity, host-key policy, tuning and reconnects.

use std::path::PathBuf;
use std::time::Duration;

/// The private key to authenticate with.
#[derive(Clone)]
pub enum Identity {
    /// A private key file (OpenSSH, PEM or PuTTY format), like `ssh -i`.
    KeyFile(PathBuf),
    /// The text of a private key (OpenSSH PEM), e.g. handed over by a control plane.
    KeyInMemory(String),
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Identity::KeyFile(p) => f.debug_tuple("KeyFile").field(p).finish(),
            // Never print key material.
            Identity::KeyInMemory(_) => f.write_str("KeyInMemory(..)"),
        }
    }
}

/// An OpenSSH user certificate for the identity key (`ssh -o CertificateFile=`).
#[derive(Debug, Clone)]
pub enum CertificateSource {
    /// A `*-cert.pub` file.
    File(PathBuf),
    /// The certificate's text (`ssh-ed25519-cert-v01@openssh.com AAAA...`).
    InMemory(String),
}

/// How the server's host key is verified.
#[derive(Debug, Clone)]
pub enum HostKeyPolicy {
    /// Accept the key recorded for `[host]:port` (or `host` on port 22) in this
    /// `known_hosts` file; refuse unknown hosts and changed keys. Hashed host names,
    /// wildcard patterns and `@revoked` markers are understood.
    KnownHostsFile(PathBuf),
    /// Accept exactly these keys (compared by key data, comments do not matter).
    Pinned(Vec<russh::keys::PublicKey>),
    /// Accept any host key (`StrictHostKeyChecking=no`). Logs a warning once.
    AcceptAny,
}

impl HostKeyPolicy {
    /// `~/.ssh/known_hosts` (`$HOME` of the current user).
    pub fn default_known_hosts() -> HostKeyPolicy {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/root"));
        HostKeyPolicy::KnownHostsFile(home.join(".ssh").join("known_hosts"))
    }
}

impl Default for HostKeyPolicy {
    fn default() -> Self {
        HostKeyPolicy::default_known_hosts()
    }
}

/// What to do when the connection drops (sshfs `-o reconnect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectPolicy {
    /// Reconnect at all. Without it a lost connection makes every operation fail with
    /// `RemoteError::Disconnected` for good.
    pub enabled: bool,
    /// First delay between attempts; doubled after each failure...
    pub initial_backoff: Duration,
    /// ...up to this.
    pub max_backoff: Duration,
    /// After this long without success, operations stop waiting and fail with
    /// `Disconnected`; attempts continue in the background every `max_backoff` until one
    /// succeeds. Host-key and authentication failures stop reconnecting at once.
    pub give_up_after: Duration,
}

impl Default for ReconnectPolicy {
    fn default() -> Self {
        ReconnectPolicy {
            enabled: false,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            give_up_after: Duration::from_secs(60),
        }
    }
}

/// Everything needed to open the SSH connection and its SFTP channels.
#[derive(Clone)]
pub struct SshConfig {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub identity: Identity,
    /// Passphrase for an encrypted private key.
    pub key_passphrase: Option<String>,
    /// Authenticate with this OpenSSH certificate of the identity key.
    pub certificate: Option<CertificateSource>,
    pub host_key_policy: HostKeyPolicy,
    /// `ServerAliveInterval`: send a keepalive after this much silence from the server.
    /// Default 15 s, so a dead peer is noticed in about a minute rather than when TCP gives up.
    pub server_alive_interval: Option<Duration>,
    /// `ServerAliveCountMax`: unanswered keepalives before the connection is declared dead.
    pub server_alive_count_max: u32,
    /// SSH channel receive window per SFTP channel. The default 16 MiB keeps a fast link busy
    /// at high latency (russh's default of 2 MiB caps reads at 2 MiB per round trip).
    pub window_size: u32,
    /// Number of SFTP channels (each a separate sftp-server process on the server) on the one
    /// SSH connection. Default 4: server-side file I/O runs in parallel, the server's 2 MiB
    /// per-channel upload window is multiplied, and we stay well under OpenSSH's default
    /// `MaxSessions` of 10. Clamped to 1..=10.
    pub max_conns: usize,
    /// Bound on TCP connect + SSH handshake + authentication, and again on starting the SFTP
    /// channels.
    pub connect_timeout: Duration,
    /// Bound on one early write-back (LSTAT, OPEN, fsync, CLOSE on its own channel; see
    /// `SftpRemote::write_back_early`). Default 5 minutes: a long file on a slow disk takes
    /// its time, but a server that never answers must not hold the channel for good.
    pub write_back_timeout: Duration,
    pub reconnect: ReconnectPolicy,
}

impl std::fmt::Debug for SshConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("identity", &self.identity)
            .field(
                "key_passphrase",
                &self.key_passphrase.as_ref().map(|_| ".."),
            )
            .field("certificate", &self.certificate)
            .field("host_key_policy", &self.host_key_policy)
            .field("server_alive_interval", &self.server_alive_interval)
            .field("server_alive_count_max", &self.server_alive_count_max)
            .field("window_size", &self.window_size)
            .field("max_conns", &self.max_conns)
            .field("connect_timeout", &self.connect_timeout)
            .field("write_back_timeout", &self.write_back_timeout)
            .field("reconnect", &self.reconnect)
            .finish()
    }
}

impl SshConfig {
    /// A config with the defaults: port 22, `~/.ssh/known_hosts`, 15 s keepalive (3 misses),
    /// 16 MiB window, 4 channels, 30 s connect timeout, 5 min early write-back bound, no
    /// reconnect.
    pub fn new(host: impl Into<String>, user: impl Into<String>, identity: Identity) -> Self {
        SshConfig {
            host: host.into(),
            port: 22,
            user: user.into(),
            identity,
            key_passphrase: None,
            certificate: None,
            host_key_policy: HostKeyPolicy::default_known_hosts(),
            server_alive_interval: Some(Duration::from_secs(15)),
            server_alive_count_max: 3,
            window_size: 16 * 1024 * 1024,
            max_conns: 4,
            connect_timeout: Duration::from_secs(30),
            write_back_timeout: Duration::from_secs(300),
            reconnect: ReconnectPolicy::default(),
        }
    }

    /// `[host]:port`, or `host` on port 22, as OpenSSH writes it.
    pub fn host_port(&self) -> String {
        if self.port == 22 {
            self.host.clone()
        } else {
            format!("[{}]:{}", self.host, self.port)
        }
    }
}
