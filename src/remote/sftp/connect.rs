//! Opening the SSH connection: key loading, TCP, handshake with host-key verification and
//! public-key (or certificate) authentication. Every failure becomes a [`ConnectError`] whose
//! message tells a newcomer what went wrong and what to do.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use russh::client::{self, AuthResult};
use russh::keys::ssh_key::public::KeyData;
use russh::keys::PublicKeyOrCertificate;
use russh::keys::{Algorithm, Certificate, HashAlg, PrivateKey, PrivateKeyWithHashAlg, PublicKey};
use tracing::{debug, warn};

use super::config::{CertificateSource, HostKeyPolicy, Identity, SshConfig};
use super::known_hosts::{self, Verdict};

/// The category of a connection failure, for programs that react to it (the control plane
/// maps `Auth` to `AUTH_FAILED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnectErrorKind {
    /// TCP connect, SSH handshake or the connection failed (also: timeouts).
    Network,
    /// The server's host key is not in the known_hosts file.
    HostKeyUnknown,
    /// The host key differs from the one on record (or is revoked).
    HostKeyChanged,
    /// The server refused our key or certificate.
    Auth,
    /// The private key or certificate could not be read or parsed.
    Key,
    /// The server refused the sftp subsystem or spoke an SFTP we do not support.
    Sftp,
    /// The remote directory to mount does not exist or is not a directory.
    NoSuchRemoteDir,
}

/// Why [`super::SftpRemote::connect`] failed. `Display` is the full explanation.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ConnectError {
    kind: ConnectErrorKind,
    message: String,
}

impl ConnectError {
    pub fn new(kind: ConnectErrorKind, message: impl Into<String>) -> Self {
        ConnectError {
            kind,
            message: message.into(),
        }
    }

    pub fn kind(&self) -> ConnectErrorKind {
        self.kind
    }

    /// Whether trying again later may help (network trouble), as opposed to a problem that
    /// needs a human (keys, host keys, server configuration).
    pub fn is_transient(&self) -> bool {
        matches!(self.kind, ConnectErrorKind::Network)
    }

    pub(crate) fn network(msg: impl Into<String>) -> Self {
        ConnectError::new(ConnectErrorKind::Network, msg)
    }

    pub(crate) fn sftp(msg: impl Into<String>) -> Self {
        ConnectError::new(ConnectErrorKind::Sftp, msg)
    }

    fn key(msg: impl Into<String>) -> Self {
        ConnectError::new(ConnectErrorKind::Key, msg)
    }
}

/// The loaded identity and a description of it for messages.
struct LoadedIdentity {
    key: Arc<PrivateKey>,
    cert: Option<Certificate>,
    description: String,
}

fn fingerprint(key: &KeyData) -> String {
    format!("{} {}", key.algorithm(), key.fingerprint(HashAlg::Sha256))
}

fn load_identity(cfg: &SshConfig) -> Result<LoadedIdentity, ConnectError> {
    let (text, what) = match &cfg.identity {
        Identity::KeyFile(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ConnectError::key(format!(
                    "cannot read private key file {}: {e}",
                    path.display()
                ))
            })?;
            (text, format!("key file {}", path.display()))
        }
        Identity::KeyInMemory(text) => (text.clone(), "the in-memory private key".to_string()),
    };
    let key =
        russh::keys::decode_secret_key(&text, cfg.key_passphrase.as_deref()).map_err(|e| {
            let trimmed = text.trim_start();
            let hint = if matches!(e, russh::keys::Error::KeyIsEncrypted) {
                if cfg.key_passphrase.is_some() {
                    " (the passphrase is wrong)".to_string()
                } else {
                    " (it is protected by a passphrase; none was given)".to_string()
                }
            } else if trimmed.starts_with("ssh-") || trimmed.starts_with("ecdsa-") {
                " (this looks like a public key; give the private key file, without `.pub`)"
                    .to_string()
            } else {
                format!(" ({e}; expected an OpenSSH private key such as ssh-keygen writes)")
            };
            ConnectError::key(format!("cannot use {what}{hint}"))
        })?;
    let mut description = format!("{what} ({})", fingerprint(key.public_key().key_data()));

    let cert = match &cfg.certificate {
        None => None,
        Some(src) => {
            let (text, cwhat) = match src {
                CertificateSource::File(path) => (
                    std::fs::read_to_string(path).map_err(|e| {
                        ConnectError::key(format!(
                            "cannot read certificate file {}: {e}",
                            path.display()
                        ))
                    })?,
                    format!("certificate {}", path.display()),
                ),
                CertificateSource::InMemory(t) => (t.clone(), "the in-memory certificate".into()),
            };
            let cert = Certificate::from_openssh(text.trim()).map_err(|e| {
                ConnectError::key(format!(
                    "cannot parse {cwhat} ({e}; expected an OpenSSH certificate such as \
                     `ssh-keygen -s` writes to *-cert.pub)"
                ))
            })?;
            if cert.public_key() != key.public_key().key_data() {
                return Err(ConnectError::key(format!(
                    "{cwhat} certifies key {}, not the identity key {description}",
                    fingerprint(cert.public_key())
                )));
            }
            description = format!(
                "{description} with {cwhat} (id \"{}\", principals {:?})",
                cert.key_id(),
                cert.valid_principals()
            );
            Some(cert)
        }
    };
    Ok(LoadedIdentity {
        key: Arc::new(key),
        cert,
        description,
    })
}

/// Checks the server's host key; remembers why it refused so the caller gets a precise error.
pub(crate) struct HostKeyCheck {
    host: String,
    port: u16,
    policy: HostKeyPolicy,
    refusal: Mutex<Option<ConnectError>>,
    /// Shared across reconnects (see [`FirstHostKey`]).
    first_key: Arc<FirstHostKey>,
}

/// The host key the first connection of a mount accepted without checking it
/// (`StrictHostKeyChecking=no`): every later connection of the mount (a reconnect, after a
/// network drop or the server's restart) must offer the same one. Else anyone who can break
/// the connection could take its place for the rest of the mount, unchecked. (OpenSSH's `no`
/// writes the first key to `known_hosts` and warns of a changed one; a mount that reconnects
/// on its own has nobody to warn.)
pub(crate) type FirstHostKey = Mutex<Option<KeyData>>;

impl HostKeyCheck {
    fn verify(&self, offered: &KeyData) -> Result<(), ConnectError> {
        let name = known_hosts::lookup_name(&self.host, self.port);
        let fp = fingerprint(offered);
        match &self.policy {
            HostKeyPolicy::AcceptAny => {
                let mut first = self.first_key.lock().unwrap();
                match first.as_ref() {
                    None => {
                        warn!(
                            "not verifying the host key of {name} (StrictHostKeyChecking=no); \
                             it offered {fp}, which every reconnect of this mount must offer"
                        );
                        *first = Some(offered.clone());
                        Ok(())
                    }
                    Some(k) if k == offered => Ok(()),
                    Some(k) => Err(ConnectError::new(
                        ConnectErrorKind::HostKeyChanged,
                        format!(
                            "the host key of {name} ({fp}) is not the one it offered when this \
                             mount first connected ({}); refusing to reconnect (someone may be \
                             intercepting the connection; unmount and mount again to accept \
                             a new key)",
                            fingerprint(k)
                        ),
                    )),
                }
            }
            HostKeyPolicy::Pinned(keys) => {
                if keys.iter().any(|k| k.key_data() == offered) {
                    Ok(())
                } else {
                    Err(ConnectError::new(
                        ConnectErrorKind::HostKeyChanged,
                        format!(
                            "the host key of {name} ({fp}) is not the pinned key; refusing to \
                             connect (someone may be intercepting the connection, or the server \
                             was reinstalled and the pinned key must be updated)"
                        ),
                    ))
                }
            }
            HostKeyPolicy::KnownHostsFile(path) => {
                let file = path.display();
                let verdict =
                    known_hosts::check(path, &self.host, self.port, offered).map_err(|e| {
                        ConnectError::new(
                            ConnectErrorKind::HostKeyUnknown,
                            format!("cannot read known_hosts file {file}: {e}"),
                        )
                    })?;
                let line_to_add = PublicKey::new(offered.clone(), "")
                    .to_openssh()
                    .map(|k| format!("{name} {}", k.trim_end()))
                    .unwrap_or_default();
                match verdict {
                    Verdict::Known { line } => {
                        debug!("host key of {name} matches {file} line {line}");
                        Ok(())
                    }
                    Verdict::Unknown { file_exists } => Err(ConnectError::new(
                        ConnectErrorKind::HostKeyUnknown,
                        format!(
                            "the host key of {name} is not known: {file} {} (the server offered \
                             {fp}). If you trust this server, add this line to {file}:\n  \
                             {line_to_add}\n(or run `ssh -p {port} {user_host}` once and accept \
                             the key), or pass `-o StrictHostKeyChecking=no` to accept any key \
                             (a warning is logged).",
                            if file_exists {
                                "has no entry for it"
                            } else {
                                "does not exist"
                            },
                            port = self.port,
                            user_host = self.host,
                        ),
                    )),
                    Verdict::Changed { line } => Err(ConnectError::new(
                        ConnectErrorKind::HostKeyChanged,
                        format!(
                            "host key for {name} changed (known_hosts line {line} of {file}): the \
                             server now offers {fp}. Someone may be intercepting the connection, \
                             or the server was reinstalled. If you know the new key is right, \
                             remove the old entry with `ssh-keygen -R '{name}' -f {file}` and \
                             connect again."
                        ),
                    )),
                    Verdict::Revoked { line } => Err(ConnectError::new(
                        ConnectErrorKind::HostKeyChanged,
                        format!(
                            "the host key of {name} ({fp}) is marked @revoked in {file} line \
                             {line}; refusing to connect"
                        ),
                    )),
                }
            }
        }
    }

    /// Host key algorithms to prefer, so a server with several keys shows the one we know.
    fn preferred_algorithms(&self) -> Vec<Algorithm> {
        match &self.policy {
            // The kind of the key the first connection took, once there is one: a server
            // that has others too may offer another kind first, which would be refused.
            HostKeyPolicy::AcceptAny => self
                .first_key
                .lock()
                .unwrap()
                .as_ref()
                .map(|k| vec![k.algorithm()])
                .unwrap_or_default(),
            HostKeyPolicy::Pinned(keys) => keys.iter().map(|k| k.algorithm()).collect(),
            HostKeyPolicy::KnownHostsFile(p) => {
                known_hosts::known_algorithms(p, &self.host, self.port)
            }
        }
    }
}

/// The russh client handler: only the host-key check matters to us.
pub(crate) struct ClientHandler {
    check: Arc<HostKeyCheck>,
}

impl client::Handler for ClientHandler {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        server_public_key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let key = match server_public_key {
            PublicKeyOrCertificate::PublicKey { key, .. } => key.key_data(),
            // Host certificates are not requested; if one comes, judge its key like a plain one.
            PublicKeyOrCertificate::Certificate(c) => c.public_key(),
        };
        match self.check.verify(key) {
            Ok(()) => Ok(true),
            Err(e) => {
                debug!("refusing host key: {e}");
                *self.check.refusal.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                Ok(false)
            }
        }
    }
}

pub(crate) type SshHandle = client::Handle<ClientHandler>;

fn same_family(a: &Algorithm, b: &Algorithm) -> bool {
    match (a, b) {
        (Algorithm::Rsa { .. }, Algorithm::Rsa { .. }) => true,
        _ => a == b,
    }
}

fn hardware_aes() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

fn client_config(cfg: &SshConfig, prefer: &[Algorithm]) -> client::Config {
    let mut preferred = russh::Preferred::default();
    if !prefer.is_empty() {
        let default: Vec<Algorithm> = preferred.key.iter().cloned().collect();
        let (mut first, rest): (Vec<_>, Vec<_>) = default
            .into_iter()
            .partition(|a| prefer.iter().any(|p| same_family(a, p)));
        first.extend(rest);
        preferred.key = Cow::Owned(first);
    }
    if hardware_aes() {
        // With AES instructions, AES-GCM is ~1.4x faster than russh's default
        // chacha20-poly1305 (measured: 256 MiB loopback read 0.45 s vs 0.67 s).
        let mut ciphers = vec![russh::cipher::AES_256_GCM];
        ciphers.extend(
            preferred
                .cipher
                .iter()
                .filter(|c| **c != russh::cipher::AES_256_GCM)
                .cloned(),
        );
        preferred.cipher = Cow::Owned(ciphers);
    }
    client::Config {
        window_size: cfg.window_size,
        keepalive_interval: cfg.server_alive_interval,
        keepalive_max: cfg.server_alive_count_max as usize,
        nodelay: true,
        preferred,
        ..Default::default()
    }
}

/// How long data sent may stay unacknowledged by the server's machine before the connection
/// is declared dead: as long as the keepalives take to declare it (`ServerAliveInterval` ×
/// (`ServerAliveCountMax` + 1)). The keepalives alone cannot when the network goes silent
/// while much is being sent: russh's session task then waits in its flush to a full socket
/// buffer and no longer runs its keepalive timer, and the kernel retransmits for 15 minutes
/// or more before it gives up. A slow link that acknowledges (however little) is not cut.
/// None without keepalives (`ServerAliveInterval=0`: the user asked for no such check).
fn unacknowledged_limit(cfg: &SshConfig) -> Option<std::time::Duration> {
    let interval = cfg.server_alive_interval?;
    if interval.is_zero() || cfg.server_alive_count_max == 0 {
        return None;
    }
    Some(interval * (cfg.server_alive_count_max + 1))
}

/// Set `TCP_USER_TIMEOUT` (see [`unacknowledged_limit`]).
fn set_user_timeout(
    tcp: &tokio::net::TcpStream,
    limit: std::time::Duration,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let ms = u32::try_from(limit.as_millis()).unwrap_or(u32::MAX);
    // SAFETY: a valid socket descriptor, and a pointer to a u32 of the length given.
    let r = unsafe {
        libc::setsockopt(
            tcp.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (&ms as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    match r {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Open and authenticate one SSH connection. `first_key` is shared across reconnects.
pub(crate) async fn establish(
    cfg: &SshConfig,
    first_key: &Arc<FirstHostKey>,
) -> Result<SshHandle, ConnectError> {
    let identity = load_identity(cfg)?;
    let check = Arc::new(HostKeyCheck {
        host: cfg.host.clone(),
        port: cfg.port,
        policy: cfg.host_key_policy.clone(),
        refusal: Mutex::new(None),
        first_key: first_key.clone(),
    });
    let config = Arc::new(client_config(cfg, &check.preferred_algorithms()));
    let target = cfg.host_port();
    let work = async {
        let tcp = tokio::net::TcpStream::connect((cfg.host.as_str(), cfg.port))
            .await
            .map_err(|e| ConnectError::network(format!("cannot connect to {target}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        if let Some(t) = unacknowledged_limit(cfg) {
            if let Err(e) = set_user_timeout(&tcp, t) {
                debug!("TCP_USER_TIMEOUT: {e}");
            }
        }
        let handler = ClientHandler {
            check: check.clone(),
        };
        let mut handle = client::connect_stream(config, tcp, handler)
            .await
            .map_err(|e| {
                check
                    .refusal
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .unwrap_or_else(|| {
                        ConnectError::network(format!("SSH handshake with {target} failed: {e}"))
                    })
            })?;
        authenticate(&mut handle, cfg, identity, &target).await?;
        Ok(handle)
    };
    match tokio::time::timeout(cfg.connect_timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(ConnectError::network(format!(
            "connecting to {target} timed out after {:?}",
            cfg.connect_timeout
        ))),
    }
}

/// Whether the SSH session behind `handle` has ended. Its task closes the channel of
/// replies first and the one of commands as it drops, so the second gets a moment. (Only a
/// failure that names no method left asks: OpenSSH's refusals name them.)
async fn session_ended(handle: &SshHandle) -> bool {
    // Up to a second: the two close in one drop, but a loaded machine may stall between.
    for _ in 0..200 {
        if handle.is_closed() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    false
}

async fn authenticate(
    handle: &mut SshHandle,
    cfg: &SshConfig,
    id: LoadedIdentity,
    target: &str,
) -> Result<(), ConnectError> {
    let user = cfg.user.clone();
    let lost = |e: russh::Error| {
        ConnectError::network(format!(
            "the connection to {target} failed during authentication: {e}"
        ))
    };
    let result = match id.cert {
        Some(cert) => handle
            .authenticate_openssh_cert(user.clone(), id.key.clone(), cert)
            .await
            .map_err(lost)?,
        None => {
            let hash = if id.key.algorithm().is_rsa() {
                // Servers that do not announce server-sig-algs predate rsa-sha2: use ssh-rsa.
                handle
                    .best_supported_rsa_hash()
                    .await
                    .ok()
                    .flatten()
                    .flatten()
            } else {
                None
            };
            handle
                .authenticate_publickey(
                    user.clone(),
                    PrivateKeyWithHashAlg::new(id.key.clone(), hash),
                )
                .await
                .map_err(lost)?
        }
    };
    match result {
        AuthResult::Success => {
            debug!(
                "authenticated to {target} as {user} with {}",
                id.description
            );
            Ok(())
        }
        AuthResult::Failure {
            remaining_methods,
            partial_success,
        } if remaining_methods.is_empty() && !partial_success && session_ended(handle).await => {
            // russh answers "failure, no methods left" when the session ends before the
            // server's answer (its reply channel closed): a connection lost during
            // authentication, not a refusal. Taken for a refusal, it ended a reconnect for good.
            Err(ConnectError::network(format!(
                "the connection to {target} was closed during authentication"
            )))
        }
        AuthResult::Failure {
            remaining_methods,
            partial_success,
        } => {
            let methods: Vec<&str> = remaining_methods.iter().map(<&str>::from).collect();
            let more = if partial_success {
                " The key was accepted, but the server requires a further method, which this \
                 client does not support."
                    .to_string()
            } else if methods.is_empty() {
                String::new()
            } else {
                format!(" (the server would accept: {})", methods.join(", "))
            };
            Err(ConnectError::new(
                ConnectErrorKind::Auth,
                format!(
                    "{target} refused to authenticate user \"{user}\" with {}.{more} Check that \
                     the public key is in ~{user}/.ssh/authorized_keys on the server (or, for a \
                     certificate, that the server trusts its CA and the certificate is valid \
                     now and names \"{user}\" as a principal).",
                    id.description
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_unacknowledged_limit_is_as_long_as_the_keepalives_take() {
        let mut cfg = SshConfig::new("127.0.0.1", "u", Identity::KeyFile("k".into()));
        cfg.server_alive_interval = Some(Duration::from_secs(15));
        cfg.server_alive_count_max = 3;
        assert_eq!(unacknowledged_limit(&cfg), Some(Duration::from_secs(60)));
        cfg.server_alive_count_max = 0;
        assert_eq!(unacknowledged_limit(&cfg), None);
        cfg.server_alive_count_max = 3;
        cfg.server_alive_interval = None;
        assert_eq!(unacknowledged_limit(&cfg), None);
    }

    #[tokio::test]
    async fn the_socket_gets_the_unacknowledged_limit() {
        use std::os::fd::AsRawFd;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        set_user_timeout(&tcp, Duration::from_secs(60)).unwrap();
        let mut ms = 0u32;
        let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
        // SAFETY: a valid socket, and a u32 buffer of the length given.
        let r = unsafe {
            libc::getsockopt(
                tcp.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_USER_TIMEOUT,
                (&mut ms as *mut u32).cast(),
                &mut len,
            )
        };
        assert_eq!((r, ms), (0, 60_000));
    }
}
