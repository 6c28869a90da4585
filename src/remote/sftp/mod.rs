//! [`SftpRemote`]: the [`Remote`] trait over SFTP v3, with our own codec on russh channels.
//!
//! One SSH connection carries `max_conns` SFTP channels, each served by its own sftp-server
//! process. OPENs and most path operations go to the least loaded channel (`Connection::pick`;
//! removals go to their directory's); operations on an open handle go to the channel that
//! opened it. Every channel pipelines: many tasks may have requests in flight
//! at once (bounded per channel, see [`channel`]). Each channel has its own SSH flow-control
//! window (OpenSSH: 2 MiB), so one channel moves at most that per round trip; `open_alongside`
//! opens a file again on another channel, which the core uses to spread one file's large
//! sequential write over several windows.
//!
//! Connection loss: without `reconnect`, every operation fails with
//! [`RemoteError::Disconnected`] from then on; [`SftpRemote::state`] lets the owner notice and
//! unmount. With `reconnect`, a background task reconnects with exponential backoff and bumps
//! the connection *generation*. Path operations issued meanwhile wait for it (bounded by the
//! `ReconnectPolicy::give_up_after`); handles from an older generation fail with
//! [`RemoteError::StaleHandle`] so the core can reopen them by path.

mod channel;
pub mod codec;
mod config;
mod connect;
mod forecast;
mod known_hosts;
mod pacing;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::{Duration, Instant};
use tracing::{debug, info, warn};

pub use config::{CertificateSource, HostKeyPolicy, Identity, ReconnectPolicy, SshConfig};
pub use connect::{ConnectError, ConnectErrorKind};

use self::channel::{DeathSignal, PendingReply, SftpChannel, StartError};
use self::codec::{Request, Response};
use self::connect::SshHandle;
use crate::remote::{
    Along, Attrs, DirEntry, FileKind, Limits, OpenFlags, Remote, RemoteError, RemoteResult,
    RenameMode, SetAttrs, StatVfs, Status, WriteAck,
};

/// Largest READ/WRITE payload we ever use: 255 KiB, so a WRITE packet with its header stays
/// under OpenSSH's 256 KiB packet limit.
pub const MAX_IO_SIZE: u32 = 255 * 1024;

/// An open file or directory on the server.
#[derive(Clone, PartialEq, Eq)]
pub struct SftpHandle {
    raw: Bytes,
    channel: usize,
    generation: u64,
}

impl SftpHandle {
    /// The server's handle bytes.
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    /// Index of the SFTP channel that opened it.
    pub fn channel(&self) -> usize {
        self.channel
    }

    /// The connection generation it was opened on.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl std::fmt::Debug for SftpHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SftpHandle(gen {} ch {} 0x",
            self.generation, self.channel
        )?;
        for b in self.raw.iter() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// The connection as the owner sees it ([`SftpRemote::state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnState {
    /// Operations go through on this generation.
    Connected { generation: u64 },
    /// The connection was lost and is being re-established; path operations wait.
    Reconnecting { attempt: u32, reason: String },
    /// The connection is lost and operations fail. `retrying`: reconnect attempts continue in
    /// the background (after `give_up_after`); `false` means this is final.
    Disconnected { reason: String, retrying: bool },
    /// [`SftpRemote::disconnect`] was called.
    Closed,
}

#[derive(Debug, Clone, Copy, Default)]
struct Extensions {
    posix_rename: bool,
    statvfs: bool,
    hardlink: bool,
    fsync: bool,
    lsetstat: bool,
    copy_data: bool,
    /// The server is OpenSSH's sftp-server (or behaves like it) and swaps SYMLINK arguments.
    symlink_swapped: bool,
}

/// One SSH connection with its SFTP channels.
struct Connection {
    generation: u64,
    ssh: Arc<SshHandle>,
    channels: Vec<SftpChannel>,
    death: DeathSignal,
    ext: Extensions,
    limits: Limits,
    /// Where `open_alongside` starts looking, turned by each call.
    rr: AtomicUsize,
    /// The channel [`Connection::pick`] chose last.
    last_picked: AtomicUsize,
    /// The channel for [`SftpRemote::write_back_early`]; locked by the one write-back on its
    /// way on this connection.
    write_back: tokio::sync::Mutex<WriteBackSlot>,
}

/// The channel early write-backs go on (see [`Connection::write_back_channel`]).
enum WriteBackSlot {
    /// Not opened yet, or the last one ended: opened at the next use.
    Closed,
    /// With its death signal, which fires when its sftp-server is gone.
    Open(SftpChannel, DeathSignal),
    /// It could not be opened (the server's `MaxSessions`, say), or left a write-back
    /// unanswered: not tried again on this connection.
    Refused,
}

impl Connection {
    async fn open(
        cfg: &SshConfig,
        generation: u64,
        first_key: &Arc<connect::FirstHostKey>,
    ) -> Result<Connection, ConnectError> {
        let ssh = Arc::new(connect::establish(cfg, first_key).await?);
        let death = DeathSignal::new();
        let n = cfg.max_conns.clamp(1, 10);
        let mut set = tokio::task::JoinSet::new();
        for i in 0..n {
            let ssh = ssh.clone();
            let death = death.clone();
            set.spawn(async move { (i, SftpChannel::open(&ssh, i, death).await) });
        }
        let open_all = async {
            let mut results = Vec::new();
            while let Some(r) = set.join_next().await {
                match r {
                    Ok(x) => results.push(x),
                    Err(e) => results.push((usize::MAX, Err(StartError::Ssh(e.to_string())))),
                }
            }
            results
        };
        let mut results = tokio::time::timeout(cfg.connect_timeout, open_all)
            .await
            .map_err(|_| {
                ConnectError::network(format!(
                    "starting SFTP on {} timed out after {:?}",
                    cfg.host_port(),
                    cfg.connect_timeout
                ))
            })?;
        results.sort_by_key(|(i, _)| *i);
        let mut channels = Vec::new();
        let mut first_err = None;
        for (i, r) in results {
            match r {
                Ok(ch) => channels.push(ch),
                Err(e) => {
                    debug!("SFTP channel {i} could not be started: {e:?}");
                    first_err.get_or_insert(e);
                }
            }
        }
        if channels.is_empty() {
            return Err(match first_err {
                Some(StartError::Sftp(m)) => {
                    ConnectError::sftp(format!("{}: {m}", cfg.host_port()))
                }
                Some(StartError::Ssh(m)) => {
                    ConnectError::network(format!("{}: {m}", cfg.host_port()))
                }
                None => ConnectError::sftp("no SFTP channel could be started"),
            });
        }

        let version = channels[0].version();
        let has = |n: &str| version.has_extension(n);
        let ext = Extensions {
            posix_rename: has(codec::EXT_POSIX_RENAME),
            statvfs: has(codec::EXT_STATVFS),
            hardlink: has(codec::EXT_HARDLINK),
            fsync: has(codec::EXT_FSYNC),
            lsetstat: has(codec::EXT_LSETSTAT),
            copy_data: has(codec::EXT_COPY_DATA),
            symlink_swapped: [
                codec::EXT_POSIX_RENAME,
                codec::EXT_STATVFS,
                codec::EXT_HARDLINK,
                codec::EXT_FSYNC,
                codec::EXT_LIMITS,
            ]
            .iter()
            .any(|e| has(e)),
        };

        let mut limits = Limits::default();
        if has(codec::EXT_LIMITS) {
            // Bounded like the channels' start: a server that never answers it must not
            // hold up the mount, nor a reconnect, forever.
            let asked = channels[0].request(&Request::Limits);
            match tokio::time::timeout(cfg.connect_timeout, asked).await {
                Ok(Ok(Response::ExtendedReply(data))) => match codec::decode_limits(data) {
                    Ok(l) => limits = limits_from_server(&l),
                    Err(e) => debug!("bad limits@openssh.com reply: {e}"),
                },
                Ok(Ok(other)) => debug!("limits@openssh.com answered {}", other.kind_name()),
                Ok(Err(e)) => debug!("limits@openssh.com failed: {e}"),
                Err(_) => {
                    return Err(ConnectError::network(format!(
                        "{}: the SFTP server did not answer limits@openssh.com within {:?} \
                         (a slow server or link: raise -o ConnectTimeout)",
                        cfg.host_port(),
                        cfg.connect_timeout
                    )))
                }
            }
        }
        debug!(
            generation,
            channels = channels.len(),
            ?limits,
            ?ext,
            "connected to {}",
            cfg.host_port()
        );
        Ok(Connection {
            generation,
            ssh,
            channels,
            death,
            ext,
            limits,
            rr: AtomicUsize::new(0),
            last_picked: AtomicUsize::new(0),
            write_back: tokio::sync::Mutex::new(WriteBackSlot::Closed),
        })
    }

    /// The channel early write-backs go on: one of their own, since its sftp-server does
    /// nothing else while it is in `fsync(2)`, and the others carry the file's writes (its
    /// lanes take every channel). Opened at the first one: a mount that never writes a long
    /// file never has the extra sftp-server. It has a death signal of its own: it carries
    /// nothing but hints, so its end (its sftp-server gone, sshd closing it while idle) must
    /// not end the connection; the next write-back opens another (a lost connection fails
    /// them all: the SSH session's end closes it). None if it cannot be opened within
    /// `timeout` (the server's `MaxSessions`, say): this connection writes nothing back early.
    async fn write_back_channel<'s>(
        &self,
        slot: &'s mut WriteBackSlot,
        timeout: Duration,
    ) -> Option<&'s SftpChannel> {
        if matches!(slot, WriteBackSlot::Open(_, death) if death.reason().is_some()) {
            debug!("the early write-back channel ended; opening another");
            *slot = WriteBackSlot::Closed;
        }
        if matches!(slot, WriteBackSlot::Closed) {
            let death = DeathSignal::new();
            let open = SftpChannel::open(&self.ssh, self.channels.len(), death.clone());
            *slot = match tokio::time::timeout(timeout, open).await {
                Ok(Ok(ch)) => WriteBackSlot::Open(ch, death),
                Ok(Err(e)) => {
                    debug!("no SFTP channel for early write-back: {e:?}");
                    WriteBackSlot::Refused
                }
                Err(_) => {
                    debug!("no SFTP channel for early write-back: timed out");
                    WriteBackSlot::Refused
                }
            };
        }
        match slot {
            WriteBackSlot::Open(ch, _) => Some(ch),
            _ => None,
        }
    }

    fn is_dead(&self) -> bool {
        self.death.reason().is_some()
    }

    fn dead_reason(&self) -> String {
        self.death
            .reason()
            .unwrap_or_else(|| "connection closed".into())
    }

    /// The channel for removals in directory `dir`: always the same one. sftp-server answers
    /// the requests of one channel in the order they came, so an RMDIR sent right behind the
    /// REMOVEs of its entries (unlinks answered early) finds the directory empty; on another
    /// channel it could overtake them.
    fn for_dir(&self, dir: &Path) -> &SftpChannel {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        dir.hash(&mut h);
        &self.channels[(h.finish() % self.channels.len() as u64) as usize]
    }

    /// The channel for a path operation: the least loaded; among equals, the one picked
    /// last. Why sticky rather than round-robin: a chain of requests each waiting for the one
    /// before (an append's open, write and close, then the next; a file's create, writes and
    /// close in untar) then stays with one sftp-server process, which is awake and has the
    /// file's state in its caches, instead of waking the next process in turn each time.
    /// Requests in flight at once still spread, as they load the channel picked last.
    /// Measured at RTT 0 (medians of 7-9 alternating rounds, docs/PERFORMANCE.md): untar,
    /// `git status` and shell appends 3-6 % faster, editor saves 2 % faster and 8 % slower in
    /// two rounds: all within this machine's noise.
    fn pick(&self) -> &SftpChannel {
        self.pick_by(false)
    }

    /// The channel for an OPEN or OPENDIR: as [`Connection::pick`], but among channels
    /// equally loaded now, the one with fewer handles open (see [`SftpChannel::handles`]), as
    /// the handle's reads or listing will go there too.
    fn pick_for_open(&self) -> &SftpChannel {
        self.pick_by(true)
    }

    fn pick_by(&self, opening: bool) -> &SftpChannel {
        let n = self.channels.len();
        let start = self.last_picked.load(Ordering::Relaxed) % n;
        let mut best = start;
        let mut best_load = (usize::MAX, usize::MAX);
        for k in 0..n {
            let i = (start + k) % n;
            let handles = if opening {
                self.channels[i].handles()
            } else {
                0
            };
            let load = (self.channels[i].load(), handles);
            if load < best_load {
                best = i;
                best_load = load;
                if load == (0, 0) {
                    break;
                }
            }
        }
        self.last_picked.store(best, Ordering::Relaxed);
        &self.channels[best]
    }
}

fn limits_from_server(l: &codec::ServerLimits) -> Limits {
    let cap = |v: u64| -> u32 {
        let mut m = u64::from(MAX_IO_SIZE);
        if v > 0 {
            m = m.min(v);
        }
        // Leave room for the WRITE header inside the packet limit.
        if l.max_packet_len > 1024 {
            m = m.min(l.max_packet_len - 1024);
        }
        m.max(1024) as u32
    };
    Limits {
        max_read: cap(l.max_read_len),
        max_write: cap(l.max_write_len),
        max_open_handles: if l.max_open_handles > 0 {
            l.max_open_handles
        } else {
            Limits::default().max_open_handles
        },
    }
}

struct Inner {
    cfg: SshConfig,
    current: RwLock<Arc<Connection>>,
    state: watch::Sender<ConnState>,
    next_generation: AtomicU64,
    first_key: Arc<connect::FirstHostKey>,
    limits: Limits,
    closed: AtomicBool,
}

impl Inner {
    fn current(&self) -> Arc<Connection> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn install(self: &Arc<Self>, conn: Connection) {
        let conn = Arc::new(conn);
        let generation = conn.generation;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = conn.clone();
        self.state.send_replace(ConnState::Connected { generation });
        spawn_monitor(self, &conn);
    }

    /// A live connection for a path operation, waiting (bounded) for a reconnect in progress.
    async fn conn(&self) -> RemoteResult<Arc<Connection>> {
        let policy = self.cfg.reconnect;
        let deadline = Instant::now() + policy.give_up_after + self.cfg.connect_timeout;
        let mut rx = self.state.subscribe();
        loop {
            let c = self.current();
            if !c.is_dead() && !self.closed.load(Ordering::Relaxed) {
                return Ok(c);
            }
            if !policy.enabled {
                return Err(RemoteError::Disconnected(c.dead_reason()));
            }
            match &*rx.borrow_and_update() {
                ConnState::Disconnected { reason, .. } => {
                    return Err(RemoteError::Disconnected(reason.clone()))
                }
                ConnState::Closed => {
                    return Err(RemoteError::Disconnected("closed by the client".into()))
                }
                ConnState::Connected { .. } | ConnState::Reconnecting { .. } => {}
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(RemoteError::Disconnected(c.dead_reason())),
                Err(_) => {
                    return Err(RemoteError::Disconnected(format!(
                        "still reconnecting after {:?}: {}",
                        policy.give_up_after,
                        c.dead_reason()
                    )))
                }
            }
        }
    }

    /// The connection a handle belongs to, if it is still that one and alive.
    fn conn_for(&self, h: &SftpHandle) -> RemoteResult<Arc<Connection>> {
        let c = self.current();
        if c.generation != h.generation {
            return Err(RemoteError::StaleHandle);
        }
        if c.is_dead() || self.closed.load(Ordering::Relaxed) {
            return Err(
                if self.cfg.reconnect.enabled && !self.closed.load(Ordering::Relaxed) {
                    RemoteError::StaleHandle
                } else {
                    RemoteError::Disconnected(c.dead_reason())
                },
            );
        }
        if h.channel >= c.channels.len() {
            return Err(RemoteError::StaleHandle);
        }
        Ok(c)
    }
}

fn spawn_monitor(inner: &Arc<Inner>, conn: &Arc<Connection>) {
    let weak = Arc::downgrade(inner);
    let mut death = conn.death.subscribe();
    let generation = conn.generation;
    tokio::spawn(async move {
        let reason = match death.wait_for(|r| r.is_some()).await {
            Ok(r) => r.clone().unwrap_or_default(),
            Err(_) => return,
        };
        let Some(inner) = weak.upgrade() else { return };
        if inner.closed.load(Ordering::Relaxed) {
            return;
        }
        let target = inner.cfg.host_port();
        if !inner.cfg.reconnect.enabled {
            warn!("connection to {target} lost: {reason}");
            inner.state.send_replace(ConnState::Disconnected {
                reason,
                retrying: false,
            });
            return;
        }
        warn!("connection to {target} lost (generation {generation}): {reason}; reconnecting");
        inner.state.send_replace(ConnState::Reconnecting {
            attempt: 0,
            reason: reason.clone(),
        });
        drop(inner);
        reconnect_loop(weak, reason).await;
    });
}

async fn reconnect_loop(weak: Weak<Inner>, reason: String) {
    let start = Instant::now();
    let mut attempt: u32 = 0;
    let mut gave_up = false;
    let mut delay = match weak.upgrade() {
        Some(i) => i.cfg.reconnect.initial_backoff,
        None => return,
    };
    loop {
        attempt += 1;
        let Some(inner) = weak.upgrade() else { return };
        if inner.closed.load(Ordering::Relaxed) {
            return;
        }
        let policy = inner.cfg.reconnect;
        if !gave_up && start.elapsed() >= policy.give_up_after {
            gave_up = true;
            warn!(
                "could not reconnect to {} for {:?}; operations fail until a later attempt \
                 succeeds",
                inner.cfg.host_port(),
                policy.give_up_after
            );
            inner.state.send_replace(ConnState::Disconnected {
                reason: format!(
                    "{reason} (reconnecting for {:?} failed)",
                    policy.give_up_after
                ),
                retrying: true,
            });
        } else if !gave_up {
            inner.state.send_replace(ConnState::Reconnecting {
                attempt,
                reason: reason.clone(),
            });
        }
        let generation = inner.next_generation.fetch_add(1, Ordering::Relaxed);
        match Connection::open(&inner.cfg, generation, &inner.first_key).await {
            Ok(conn) => {
                if inner.closed.load(Ordering::Relaxed) {
                    return;
                }
                info!(
                    "reconnected to {} (generation {generation}, attempt {attempt})",
                    inner.cfg.host_port()
                );
                inner.install(conn);
                return;
            }
            Err(e) if !e.is_transient() && e.kind() != ConnectErrorKind::Sftp => {
                warn!(
                    "reconnecting to {} failed for good: {e}",
                    inner.cfg.host_port()
                );
                inner.state.send_replace(ConnState::Disconnected {
                    reason: e.to_string(),
                    retrying: false,
                });
                return;
            }
            Err(e) => debug!(attempt, "reconnect attempt failed: {e}"),
        }
        drop(inner);
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(policy.max_backoff);
    }
}

/// The SFTP implementation of [`Remote`]. Cheap to clone (clones share the connection).
#[derive(Clone)]
pub struct SftpRemote {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SftpRemote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SftpRemote")
            .field("target", &self.inner.cfg.host_port())
            .field("state", &*self.inner.state.borrow())
            .finish()
    }
}

fn status_err(code: u32, message: String) -> RemoteError {
    RemoteError::Status(Status::from_code(code), message)
}

fn unexpected(op: &str, r: &Response) -> RemoteError {
    RemoteError::Protocol(format!("unexpected {} reply to {op}", r.kind_name()))
}

fn expect_ok(op: &str, r: Response) -> RemoteResult<()> {
    match r {
        Response::Status { code: 0, .. } => Ok(()),
        Response::Status { code, message } => Err(status_err(code, message)),
        other => Err(unexpected(op, &other)),
    }
}

fn expect_attrs(op: &str, r: Response) -> RemoteResult<Attrs> {
    match r {
        Response::Attrs(a) => Ok(a),
        Response::Status { code, message } => Err(status_err(code, message)),
        other => Err(unexpected(op, &other)),
    }
}

/// The attributes a request already sent (`sent`; its error if it could not be) is answered
/// with: an LSTAT or FSTAT sent behind another request on the same channel.
async fn attrs_answer(op: &str, sent: RemoteResult<PendingReply>) -> RemoteResult<Attrs> {
    expect_attrs(op, sent?.wait().await?)
}

/// `req`, answered with a status, and `stat` sent right behind it on channel `ch`, which
/// serves them in order, so the attributes show what `req` did: two requests, one round
/// trip. The outer error is `req`'s, the inner `stat`'s.
async fn status_then_attrs(
    ch: &SftpChannel,
    req: &Request<'_>,
    stat: &Request<'_>,
) -> RemoteResult<RemoteResult<Attrs>> {
    let done = ch.send(req).await?;
    let attrs = ch.send(stat).await;
    expect_ok(req.name(), done.wait().await?)?;
    Ok(attrs_answer(stat.name(), attrs).await)
}

fn expect_handle(op: &str, r: Response) -> RemoteResult<Bytes> {
    match r {
        // Copied out of the reply: a slice would keep the whole receive buffer it came in
        // (up to a packet of 512 KiB) alive for as long as the file is open.
        Response::Handle(h) => Ok(Bytes::copy_from_slice(&h)),
        Response::Status { code, message } => Err(status_err(code, message)),
        other => Err(unexpected(op, &other)),
    }
}

fn expect_one_name(op: &str, r: Response) -> RemoteResult<PathBuf> {
    match r {
        Response::Name(mut names) if !names.is_empty() => {
            let name = names.swap_remove(0).filename;
            // No path holds a NUL; the kernel would cut a link target there (`..\0x` read
            // as `..`), after containment had checked the whole.
            if name.as_bytes().contains(&0) {
                return Err(RemoteError::Protocol(format!(
                    "{op} answered a path with a NUL byte in it: {name:?}"
                )));
            }
            Ok(PathBuf::from(name))
        }
        Response::Status { code, message } => Err(status_err(code, message)),
        other => Err(unexpected(op, &other)),
    }
}

/// A REALPATH answer is an absolute path without `.` or `..` in it: the containment checks
/// compare it with the workspace's root by its components (`/ws/../etc` starts with `/ws`),
/// and an empty or relative one would start with anything. A server that answers otherwise
/// is broken or hostile.
fn canonical(op: &str, path: PathBuf) -> RemoteResult<PathBuf> {
    use std::path::Component;
    let ok = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    match ok {
        true => Ok(path),
        false => Err(RemoteError::Protocol(format!(
            "{op} answered {path:?}, not an absolute path without `.` or `..`"
        ))),
    }
}

fn expect_ext(op: &str, r: Response) -> RemoteResult<Bytes> {
    match r {
        Response::ExtendedReply(b) => Ok(b),
        Response::Status { code, message } => Err(status_err(code, message)),
        other => Err(unexpected(op, &other)),
    }
}

/// What an FSTAT and a READ of `len` bytes at offset 0, sent on the handle `forecast` right
/// behind an OPEN that got the handle `opened`, tell of the opened file: its attributes and
/// data (fewer bytes than `len`: the file ends there), each None if not sent, if they went
/// on another handle (which may be another file of ours: its bytes are not this file's), or
/// did not succeed.
fn along_of(
    forecast: &[u8],
    opened: &[u8],
    fstat: Option<RemoteResult<Response>>,
    read: Option<RemoteResult<Response>>,
    len: u32,
) -> Along {
    if forecast != opened {
        return Along::default();
    }
    Along {
        attrs: fstat.and_then(|r| r.and_then(|r| expect_attrs("FSTAT", r)).ok()),
        data: read.and_then(|r| r.and_then(|r| read_reply(r, len)).ok()),
    }
}

/// The data a READ of `len` bytes was answered with (empty at the end of the file).
fn read_reply(r: Response, len: u32) -> RemoteResult<Bytes> {
    match r {
        Response::Data(d) if d.len() <= len as usize => Ok(d),
        Response::Data(d) => Err(RemoteError::Protocol(format!(
            "server returned {} bytes for a {len}-byte READ",
            d.len()
        ))),
        Response::Status { code: 1, .. } => Ok(Bytes::new()),
        Response::Status { code, message } => Err(status_err(code, message)),
        other => Err(unexpected("READ", &other)),
    }
}

fn pflags(f: OpenFlags) -> u32 {
    let mut p = 0;
    if f.read {
        p |= codec::PFLAG_READ;
    }
    if f.write {
        p |= codec::PFLAG_WRITE;
    }
    if f.append {
        p |= codec::PFLAG_APPEND;
    }
    if f.create {
        p |= codec::PFLAG_CREAT;
    }
    if f.truncate {
        p |= codec::PFLAG_TRUNC;
    }
    if f.exclusive {
        p |= codec::PFLAG_EXCL;
    }
    p
}

fn perm_attrs(perm: u32) -> SetAttrs {
    SetAttrs {
        perm: Some(perm & 0o7777),
        ..Default::default()
    }
}

impl SftpRemote {
    /// Connect, authenticate and start `cfg.max_conns` SFTP channels.
    pub async fn connect(cfg: SshConfig) -> Result<SftpRemote, ConnectError> {
        let first_key = Arc::new(connect::FirstHostKey::default());
        let conn = Connection::open(&cfg, 1, &first_key).await?;
        let limits = conn.limits;
        let conn = Arc::new(conn);
        let inner = Arc::new(Inner {
            cfg,
            current: RwLock::new(conn.clone()),
            state: watch::Sender::new(ConnState::Connected { generation: 1 }),
            next_generation: AtomicU64::new(2),
            first_key,
            limits,
            closed: AtomicBool::new(false),
        });
        spawn_monitor(&inner, &conn);
        Ok(SftpRemote { inner })
    }

    /// Whether operations currently go through.
    pub fn is_connected(&self) -> bool {
        !self.inner.closed.load(Ordering::Relaxed) && !self.inner.current().is_dead()
    }

    /// Watch the connection state, e.g. to unmount when it becomes
    /// `Disconnected { retrying: false, .. }`.
    pub fn state(&self) -> watch::Receiver<ConnState> {
        self.inner.state.subscribe()
    }

    /// The generation of the current connection (1 at first, +1 per reconnect attempt).
    pub fn generation(&self) -> u64 {
        self.inner.current().generation
    }

    /// Number of SFTP channels of the current connection.
    pub fn channel_count(&self) -> usize {
        self.inner.current().channels.len()
    }

    /// Resolve `dir` on the server (`REALPATH`, relative paths are taken from the login
    /// directory) and check that it is a directory: the export root for a mount.
    pub async fn resolve_dir(&self, dir: &Path) -> Result<PathBuf, ConnectError> {
        let target = self.inner.cfg.host_port();
        let classify = |e: RemoteError, what: &str| match e.status() {
            Some(Status::NoSuchFile) => ConnectError::new(
                ConnectErrorKind::NoSuchRemoteDir,
                format!(
                    "remote directory {} does not exist on {target}",
                    dir.display()
                ),
            ),
            Some(Status::PermissionDenied) => ConnectError::new(
                ConnectErrorKind::NoSuchRemoteDir,
                format!(
                    "remote directory {} on {target} is not accessible (permission denied)",
                    dir.display()
                ),
            ),
            Some(_) => ConnectError::new(
                ConnectErrorKind::NoSuchRemoteDir,
                format!(
                    "cannot {what} remote directory {} on {target}: {e}",
                    dir.display()
                ),
            ),
            None => ConnectError::network(format!(
                "cannot {what} remote directory {} on {target}: {e}",
                dir.display()
            )),
        };
        let dir_arg = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let real = self
            .realpath(dir_arg)
            .await
            .map_err(|e| classify(e, "resolve"))?;
        let attrs = self.stat(&real).await.map_err(|e| classify(e, "stat"))?;
        if attrs.file_type() != FileKind::Dir {
            return Err(ConnectError::new(
                ConnectErrorKind::NoSuchRemoteDir,
                format!(
                    "remote path {} ({}) on {target} is not a directory",
                    dir.display(),
                    real.display()
                ),
            ));
        }
        Ok(real)
    }

    /// Close the connection. Operations fail with `Disconnected` afterwards.
    pub async fn disconnect(&self) {
        self.inner.closed.store(true, Ordering::Relaxed);
        self.inner.state.send_replace(ConnState::Closed);
        let c = self.inner.current();
        let _ = c
            .ssh
            .disconnect(russh::Disconnect::ByApplication, "", "en")
            .await;
    }

    async fn path_request(&self, req: &Request<'_>) -> RemoteResult<Response> {
        let c = self.inner.conn().await?;
        c.pick().request(req).await
    }

    /// A removal in directory `dir`, on that directory's channel (see `Connection::for_dir`).
    async fn removal_request(&self, dir: &Path, req: &Request<'_>) -> RemoteResult<Response> {
        let c = self.inner.conn().await?;
        c.for_dir(dir).request(req).await
    }

    /// For requests that may safely be repeated: retry once on a fresh connection.
    async fn idempotent_request(&self, req: &Request<'_>) -> RemoteResult<Response> {
        self.once_more(true, || self.path_request(req)).await
    }

    /// Run `attempt`, and once more on a fresh connection if the connection dropped under it
    /// and `repeatable`: doing it twice leaves the server as doing it once (a stat, setting
    /// absolute attributes, an open that does not insist on creating). Without this an
    /// operation that happened to be in flight at the drop would fail with EIO although
    /// `reconnect` was asked for; one that is not repeatable (a rename, an exclusive create,
    /// a write) is reported instead, as its outcome is unknown.
    async fn once_more<T, F, Fut>(&self, repeatable: bool, attempt: F) -> RemoteResult<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = RemoteResult<T>>,
    {
        let before = self.inner.current().generation;
        match attempt().await {
            // (StaleHandle: a handle it had just opened went with the connection.)
            Err(RemoteError::Disconnected(_) | RemoteError::StaleHandle)
                if repeatable
                    && self.inner.cfg.reconnect.enabled
                    && !self.inner.closed.load(Ordering::Relaxed) =>
            {
                self.await_connection_change(before).await;
                attempt().await
            }
            r => r,
        }
    }

    /// A request failed because its channel died. The connection may not be declared dead
    /// yet (the channel noticed first): wait, boundedly, until it is or has been replaced, so
    /// the retry does not go to the same dying connection.
    async fn await_connection_change(&self, generation: u64) {
        let mut rx = self.inner.state.subscribe();
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let c = self.inner.current();
            if c.generation != generation || c.is_dead() {
                return;
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return;
            }
        }
    }

    async fn handle_request(&self, h: &SftpHandle, req: &Request<'_>) -> RemoteResult<Response> {
        let c = self.inner.conn_for(h)?;
        c.channels[h.channel].request(req).await
    }

    async fn open_on(
        &self,
        c: &Connection,
        ch: usize,
        req: &Request<'_>,
    ) -> RemoteResult<SftpHandle> {
        let r = c.channels[ch].request(req).await?;
        let raw = expect_handle(req.name(), r)?;
        Ok(SftpHandle {
            raw,
            channel: ch,
            generation: c.generation,
        })
    }

    /// OPEN and LSTAT of what it opened, as one attempt of [`Remote::open_stat`].
    async fn open_stat_once(
        &self,
        path: &Path,
        flags: OpenFlags,
        perm: u32,
    ) -> RemoteResult<(SftpHandle, Attrs)> {
        let c = self.inner.conn().await?;
        let ch = Self::channel_index(&c, c.pick_for_open());
        let (handle, attrs) = self.open_lstat_on(&c, ch, path, flags, perm).await?;
        match attrs {
            Ok(a) => Ok((handle, a)),
            // The path was replaced in between (or is a link): ask the handle itself.
            Err(_) => match self.fstat(&handle).await {
                Ok(a) => Ok((handle, a)),
                Err(e) => {
                    let _ = self.close(&handle).await;
                    Err(e)
                }
            },
        }
    }

    /// OPEN and an LSTAT of the same path, sent together on channel `ch`: one channel serves
    /// its requests in order, so the LSTAT sees what the OPEN opened or created (barring a
    /// change on the server in between): two requests, one round trip. The handle, and the
    /// LSTAT's answer.
    async fn open_lstat_on(
        &self,
        c: &Connection,
        ch: usize,
        path: &Path,
        flags: OpenFlags,
        perm: u32,
    ) -> RemoteResult<(SftpHandle, RemoteResult<Attrs>)> {
        let open = open_request(path, flags, perm);
        let opened = c.channels[ch].send(&open).await?;
        let stat = c.channels[ch].send(&Request::Lstat { path }).await;
        let handle = SftpHandle {
            raw: expect_handle(open.name(), opened.wait().await?)?,
            channel: ch,
            generation: c.generation,
        };
        Ok((handle, attrs_answer("LSTAT", stat).await))
    }

    /// LSTAT, OPEN, fsync, CLOSE for [`SftpRemote::write_back_early`].
    async fn write_back_on(
        &self,
        c: &Connection,
        slot: &mut WriteBackSlot,
        path: &Path,
    ) -> RemoteResult<()> {
        let timeout = self.inner.cfg.connect_timeout;
        let Some(ch) = c.write_back_channel(slot, timeout).await else {
            return Ok(());
        };
        // Not there any more (renamed, removed), not a regular file, or the channel or the
        // connection gone: nothing to write back, nothing to report.
        let regular = match ch.request(&Request::Lstat { path }).await {
            Ok(r) => expect_attrs("LSTAT", r).is_ok_and(|a| a.file_type() == FileKind::File),
            Err(_) => false,
        };
        if !regular {
            return Ok(());
        }
        let open = open_request(path, OpenFlags::read_only(), 0);
        let opened = ch.request(&open).await;
        let Ok(raw) = opened.and_then(|r| expect_handle(open.name(), r)) else {
            return Ok(());
        };
        let synced = ch.request(&Request::Fsync { handle: &raw }).await;
        // (A failed CLOSE leaves a handle on a channel that holds nothing else.)
        let _ = ch.request(&Request::Close { handle: &raw }).await;
        match synced {
            Ok(r) => expect_ok(codec::EXT_FSYNC, r),
            Err(_) => Ok(()),
        }
    }

    fn channel_index(c: &Connection, ch: &SftpChannel) -> usize {
        c.channels
            .iter()
            .position(|x| std::ptr::eq(x, ch))
            .unwrap_or(0)
    }
}

impl Remote for SftpRemote {
    type Handle = SftpHandle;

    fn limits(&self) -> Limits {
        self.inner.limits
    }

    async fn lstat(&self, path: &Path) -> RemoteResult<Attrs> {
        let r = self.idempotent_request(&Request::Lstat { path }).await?;
        expect_attrs("LSTAT", r)
    }

    async fn stat(&self, path: &Path) -> RemoteResult<Attrs> {
        let r = self.idempotent_request(&Request::Stat { path }).await?;
        expect_attrs("STAT", r)
    }

    async fn fstat(&self, handle: &SftpHandle) -> RemoteResult<Attrs> {
        let r = self
            .handle_request(
                handle,
                &Request::Fstat {
                    handle: &handle.raw,
                },
            )
            .await?;
        expect_attrs("FSTAT", r)
    }

    async fn setstat(&self, path: &Path, attrs: SetAttrs) -> RemoteResult<()> {
        let r = self
            .idempotent_request(&Request::Setstat { path, attrs })
            .await?;
        expect_ok("SETSTAT", r)
    }

    async fn lsetstat(&self, path: &Path, attrs: SetAttrs) -> RemoteResult<()> {
        let r = self
            .once_more(true, || async {
                let c = self.inner.conn().await?;
                if !c.ext.lsetstat {
                    return Err(RemoteError::Unsupported(codec::EXT_LSETSTAT));
                }
                c.pick().request(&Request::Lsetstat { path, attrs }).await
            })
            .await?;
        expect_ok(codec::EXT_LSETSTAT, r)
    }

    async fn fsetstat(&self, handle: &SftpHandle, attrs: SetAttrs) -> RemoteResult<()> {
        let r = self
            .handle_request(
                handle,
                &Request::Fsetstat {
                    handle: &handle.raw,
                    attrs,
                },
            )
            .await?;
        expect_ok("FSETSTAT", r)
    }

    async fn setstat_lstat(
        &self,
        path: &Path,
        attrs: SetAttrs,
    ) -> RemoteResult<RemoteResult<Attrs>> {
        self.once_more(true, || async {
            let c = self.inner.conn().await?;
            let set = Request::Setstat { path, attrs };
            status_then_attrs(c.pick(), &set, &Request::Lstat { path }).await
        })
        .await
    }

    async fn fsetstat_fstat(
        &self,
        handle: &SftpHandle,
        attrs: SetAttrs,
    ) -> RemoteResult<RemoteResult<Attrs>> {
        let c = self.inner.conn_for(handle)?;
        let raw = &handle.raw;
        let set = Request::Fsetstat { handle: raw, attrs };
        status_then_attrs(
            &c.channels[handle.channel],
            &set,
            &Request::Fstat { handle: raw },
        )
        .await
    }

    async fn read_dir(&self, path: &Path) -> RemoteResult<Vec<DirEntry>> {
        let mut tried_again = false;
        loop {
            let c = self.inner.conn().await?;
            match read_dir_on(&c, path).await {
                Err(RemoteError::Disconnected(_))
                    if self.inner.cfg.reconnect.enabled && !tried_again =>
                {
                    tried_again = true;
                }
                r => return r,
            }
        }
    }

    async fn open(&self, path: &Path, flags: OpenFlags, perm: u32) -> RemoteResult<SftpHandle> {
        let req = open_request(path, flags, perm);
        self.once_more(!flags.exclusive, || async {
            let c = self.inner.conn().await?;
            let ch = Self::channel_index(&c, c.pick_for_open());
            self.open_on(&c, ch, &req).await
        })
        .await
    }

    async fn open_read(
        &self,
        path: &Path,
        len: u32,
        stat: bool,
    ) -> RemoteResult<(SftpHandle, Along)> {
        let req = open_request(path, OpenFlags::read_only(), 0);
        self.once_more(true, || async {
            let c = self.inner.conn().await?;
            let ch = Self::channel_index(&c, c.pick_for_open());
            let (opened, along) = c.channels[ch].open_and_read(&req, len, stat).await?;
            let raw = expect_handle(req.name(), opened.wait().await?)?;
            let mut got = Along::default();
            if let Some(along) = along {
                let fstat = match along.fstat {
                    Some(reply) => Some(reply.wait().await),
                    None => None,
                };
                let read = match along.read {
                    Some(reply) => Some(reply.wait().await),
                    None => None,
                };
                got = along_of(&along.handle, &raw, fstat, read, len);
            }
            Ok((
                SftpHandle {
                    raw,
                    channel: ch,
                    generation: c.generation,
                },
                got,
            ))
        })
        .await
    }

    /// On the `n` least loaded channels other than `beside`'s, of its connection.
    async fn open_alongside(
        &self,
        path: &Path,
        flags: OpenFlags,
        beside: &SftpHandle,
        n: usize,
    ) -> RemoteResult<Vec<SftpHandle>> {
        let c = self.inner.conn_for(beside)?;
        let count = c.channels.len();
        let start = c.rr.fetch_add(1, Ordering::Relaxed) % count;
        let mut others: Vec<usize> = (0..count)
            .map(|k| (start + k) % count)
            .filter(|&i| i != beside.channel)
            .collect();
        // Stable: round-robin order among equally loaded channels.
        others.sort_by_key(|&i| c.channels[i].load());
        others.truncate(n);
        let req = open_request(path, flags.for_reopen(), 0);
        let opens = others.iter().map(|&ch| self.open_on(&c, ch, &req));
        let results = futures_util::future::join_all(opens).await;
        let mut handles = Vec::with_capacity(results.len());
        let mut first_err = None;
        for r in results {
            match r {
                Ok(h) => handles.push(h),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            for h in &handles {
                let _ = self.close(h).await;
            }
            return Err(e);
        }
        Ok(handles)
    }

    async fn open_stat(
        &self,
        path: &Path,
        flags: OpenFlags,
        perm: u32,
    ) -> RemoteResult<(SftpHandle, Attrs)> {
        self.once_more(!flags.exclusive, || self.open_stat_once(path, flags, perm))
            .await
    }

    async fn read(&self, handle: &SftpHandle, offset: u64, len: u32) -> RemoteResult<Bytes> {
        let r = self
            .handle_request(
                handle,
                &Request::Read {
                    handle: &handle.raw,
                    offset,
                    len,
                },
            )
            .await?;
        read_reply(r, len)
    }

    async fn write(&self, handle: &SftpHandle, offset: u64, data: Bytes) -> RemoteResult<()> {
        self.write_queued(handle, offset, data).await?.await
    }

    async fn write_queued(
        &self,
        handle: &SftpHandle,
        offset: u64,
        data: Bytes,
    ) -> RemoteResult<WriteAck> {
        let c = self.inner.conn_for(handle)?;
        let ch = &c.channels[handle.channel];
        // Callers stay within max_write; split (in order) if one does not.
        let max = self.inner.limits.max_write.max(1) as usize;
        let mut replies = Vec::with_capacity(data.len() / max + 1);
        let mut done = 0usize;
        loop {
            let end = (done + max).min(data.len());
            let req = Request::Write {
                handle: &handle.raw,
                offset: offset + done as u64,
                data: data.slice(done..end),
            };
            replies.push(ch.send(&req).await?);
            done = end;
            if done >= data.len() {
                break;
            }
        }
        Ok(Box::pin(async move {
            let mut first_err = None;
            for reply in replies {
                if let Err(e) = reply.wait().await.and_then(|r| expect_ok("WRITE", r)) {
                    first_err.get_or_insert(e);
                }
            }
            first_err.map_or(Ok(()), Err)
        }))
    }

    async fn fsetstat_queued(
        &self,
        handle: &SftpHandle,
        attrs: SetAttrs,
    ) -> RemoteResult<WriteAck> {
        let c = self.inner.conn_for(handle)?;
        let req = Request::Fsetstat {
            handle: &handle.raw,
            attrs,
        };
        let reply = c.channels[handle.channel].send(&req).await?;
        Ok(Box::pin(async move {
            reply.wait().await.and_then(|r| expect_ok("FSETSTAT", r))
        }))
    }

    async fn fsync(&self, handle: &SftpHandle) -> RemoteResult<()> {
        let c = self.inner.conn_for(handle)?;
        if !c.ext.fsync {
            return Err(RemoteError::Unsupported(codec::EXT_FSYNC));
        }
        let r = c.channels[handle.channel]
            .request(&Request::Fsync {
                handle: &handle.raw,
            })
            .await?;
        expect_ok(codec::EXT_FSYNC, r)
    }

    /// LSTAT, OPEN (read-only), fsync@openssh.com and CLOSE of `path` on the connection's own
    /// write-back channel, one at a time per connection (a second call while one is on its
    /// way returns at once: the one on its way writes back what is there when it reaches the
    /// server, and the file's next turn comes soon enough). By path: a file put in its place
    /// on the server meanwhile is written back instead, which is harmless (nothing is read);
    /// anything but a regular file is left alone (opening a FIFO would block the channel's
    /// sftp-server for good).
    async fn write_back_early(&self, path: &Path) -> RemoteResult<()> {
        let c = self.inner.current();
        if !c.ext.fsync || c.is_dead() {
            return Ok(());
        }
        let Ok(mut slot) = c.write_back.try_lock() else {
            return Ok(());
        };
        // Bounded, generously (a long file on a slow disk takes its time): a server that
        // never answers (a FIFO put in the file's place between LSTAT and OPEN blocks its
        // sftp-server in open(2)) must not hold this connection for good. Its channel is
        // closed, and no other opened on this connection: the stuck sftp-server may hold its
        // session (the server's `MaxSessions`) until it ends, and a disk that slow is no
        // place for more fsyncs.
        let sequence = self.write_back_on(&c, &mut slot, path);
        match tokio::time::timeout(self.inner.cfg.write_back_timeout, sequence).await {
            Ok(result) => result,
            Err(_) => {
                debug!(
                    "early write-back of {} unanswered: no more on this connection",
                    path.display()
                );
                *slot = WriteBackSlot::Refused;
                Ok(())
            }
        }
    }

    /// OPEN and LSTAT together on `beside`'s channel (see `open_lstat_on`).
    async fn open_beside(
        &self,
        path: &Path,
        beside: &SftpHandle,
    ) -> RemoteResult<(SftpHandle, Attrs)> {
        let c = self.inner.conn_for(beside)?;
        let (handle, attrs) = self
            .open_lstat_on(&c, beside.channel, path, OpenFlags::read_only(), 0)
            .await?;
        match attrs {
            Ok(a) => Ok((handle, a)),
            Err(e) => {
                let _ = self.close(&handle).await;
                Err(e)
            }
        }
    }

    async fn copy_data(
        &self,
        from: &SftpHandle,
        from_offset: u64,
        len: u64,
        to: &SftpHandle,
        to_offset: u64,
    ) -> RemoteResult<()> {
        let c = self.inner.conn_for(to)?;
        if from.generation != to.generation {
            return Err(RemoteError::StaleHandle);
        }
        if !c.ext.copy_data {
            return Err(RemoteError::Unsupported(codec::EXT_COPY_DATA));
        }
        if from.channel != to.channel {
            return Err(RemoteError::Status(
                Status::Failure,
                "copy-data needs both handles on one channel".into(),
            ));
        }
        // OpenSSH's sftp-server takes each 64 KiB step off the length before it reads and
        // writes it, and answers OK whenever the length reached zero: a read or write that
        // fails in the last step (a full disk, the source ending early) is answered OK.
        // So the sizes of both files are asked right behind the copy, on the same channel
        // (answered after it, in the same round trip), and a copy they show short of its end
        // is a failure. (An overwrite inside the destination's old size cannot be checked
        // this way; it is also where a full disk cannot stop a write.)
        let ch = &c.channels[to.channel];
        let _busy = ch.copying();
        let copied = ch
            .send(&Request::CopyData {
                from: &from.raw,
                from_offset,
                len,
                to: &to.raw,
                to_offset,
            })
            .await?;
        let to_size = ch.send(&Request::Fstat { handle: &to.raw }).await?;
        let from_size = ch.send(&Request::Fstat { handle: &from.raw }).await?;
        expect_ok(codec::EXT_COPY_DATA, copied.wait().await?)?;
        for (pending, end, what) in [
            (to_size, to_offset + len, "destination"),
            (from_size, from_offset + len, "source"),
        ] {
            let size = expect_attrs("FSTAT", pending.wait().await?)?.size;
            if size.is_none_or(|s| s < end) {
                return Err(RemoteError::Status(
                    Status::Failure,
                    format!(
                        "copy-data answered OK, but the {what} has {size:?} bytes, short of {end}"
                    ),
                ));
            }
        }
        Ok(())
    }

    async fn close(&self, handle: &SftpHandle) -> RemoteResult<()> {
        match self
            .handle_request(
                handle,
                &Request::Close {
                    handle: &handle.raw,
                },
            )
            .await
        {
            Ok(r) => expect_ok("CLOSE", r),
            // The server dropped the handle together with the old connection.
            Err(RemoteError::StaleHandle) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn remove(&self, path: &Path) -> RemoteResult<()> {
        let dir = path.parent().unwrap_or(path);
        let r = self.removal_request(dir, &Request::Remove { path }).await?;
        expect_ok("REMOVE", r)
    }

    async fn mkdir(&self, path: &Path, perm: u32) -> RemoteResult<()> {
        let r = self
            .path_request(&Request::Mkdir {
                path,
                attrs: perm_attrs(perm),
            })
            .await?;
        expect_ok("MKDIR", r)
    }

    async fn mkdir_stat(&self, path: &Path, perm: u32) -> RemoteResult<Attrs> {
        // As in open_stat: the LSTAT queued behind the MKDIR on the same channel sees it.
        let c = self.inner.conn().await?;
        let ch = &c.channels[Self::channel_index(&c, c.pick())];
        let made = ch
            .send(&Request::Mkdir {
                path,
                attrs: perm_attrs(perm),
            })
            .await?;
        let stat = ch.send(&Request::Lstat { path }).await;
        expect_ok("MKDIR", made.wait().await?)?;
        match stat {
            Ok(pending) => match pending.wait().await.and_then(|r| expect_attrs("LSTAT", r)) {
                Ok(a) => Ok(a),
                Err(_) => self.lstat(path).await,
            },
            Err(_) => self.lstat(path).await,
        }
    }

    async fn rmdir(&self, path: &Path) -> RemoteResult<()> {
        let r = self.removal_request(path, &Request::Rmdir { path }).await?;
        expect_ok("RMDIR", r)
    }

    async fn rename(&self, from: &Path, to: &Path, mode: RenameMode) -> RemoteResult<()> {
        let c = self.inner.conn().await?;
        let req = match mode {
            RenameMode::Replace if !c.ext.posix_rename => {
                return Err(RemoteError::Unsupported(codec::EXT_POSIX_RENAME))
            }
            RenameMode::Replace => Request::PosixRename { from, to },
            RenameMode::NoReplace => Request::Rename { from, to },
        };
        let r = c.pick().request(&req).await?;
        expect_ok(req.name(), r)
    }

    async fn symlink(&self, target: &Path, link: &Path) -> RemoteResult<()> {
        let c = self.inner.conn().await?;
        // The draft says (linkpath, targetpath); OpenSSH reads (targetpath, linkpath).
        let req = if c.ext.symlink_swapped {
            Request::Symlink {
                first: target,
                second: link,
            }
        } else {
            Request::Symlink {
                first: link,
                second: target,
            }
        };
        let r = c.pick().request(&req).await?;
        expect_ok("SYMLINK", r)
    }

    async fn readlink(&self, path: &Path) -> RemoteResult<PathBuf> {
        let r = self.idempotent_request(&Request::Readlink { path }).await?;
        expect_one_name("READLINK", r)
    }

    async fn hardlink(&self, existing: &Path, new: &Path) -> RemoteResult<()> {
        let c = self.inner.conn().await?;
        if !c.ext.hardlink {
            return Err(RemoteError::Unsupported(codec::EXT_HARDLINK));
        }
        let r = c
            .pick()
            .request(&Request::Hardlink { existing, new })
            .await?;
        expect_ok(codec::EXT_HARDLINK, r)
    }

    async fn hardlink_stat(
        &self,
        existing: &Path,
        new: &Path,
    ) -> RemoteResult<RemoteResult<Attrs>> {
        let c = self.inner.conn().await?;
        if !c.ext.hardlink {
            return Err(RemoteError::Unsupported(codec::EXT_HARDLINK));
        }
        let link = Request::Hardlink { existing, new };
        status_then_attrs(c.pick(), &link, &Request::Lstat { path: new }).await
    }

    async fn statvfs(&self, path: &Path) -> RemoteResult<StatVfs> {
        let c = self.inner.conn().await?;
        if !c.ext.statvfs {
            return Err(RemoteError::Unsupported(codec::EXT_STATVFS));
        }
        let r = self.idempotent_request(&Request::Statvfs { path }).await?;
        let data = expect_ext(codec::EXT_STATVFS, r)?;
        codec::decode_statvfs(data).map_err(|e| RemoteError::Protocol(e.0))
    }

    async fn realpath(&self, path: &Path) -> RemoteResult<PathBuf> {
        let r = self.idempotent_request(&Request::Realpath { path }).await?;
        canonical("REALPATH", expect_one_name("REALPATH", r)?)
    }
}

/// SSH_FXP_OPEN for `flags`; the permission bits matter only when creating.
fn open_request(path: &Path, flags: OpenFlags, perm: u32) -> Request<'_> {
    let attrs = if flags.create {
        perm_attrs(perm)
    } else {
        SetAttrs::default()
    };
    Request::Open {
        path,
        pflags: pflags(flags),
        attrs,
    }
}

/// How many READDIRs a listing sends at once: a few for the first round, which is all most
/// directories need (OpenSSH answers 100 names per READDIR), doubling each round a directory
/// goes on, up to 32. Why: at a fixed 4, a 5,000-name directory took 13 round trips, and
/// `ls -l` of it at 20 ms took 0.44 s against 0.30 s for sshfs, which also keeps more
/// READDIRs in flight as a listing goes on (up to 32). Now 4 rounds. A READDIR past the end
/// costs the server one EOF reply.
#[derive(Debug)]
struct ReaddirBatch(usize);

impl ReaddirBatch {
    const FIRST: usize = 4;
    const MAX: usize = 32;

    fn next_size(&mut self) -> usize {
        let n = self.0;
        self.0 = (n * 2).min(Self::MAX);
        n
    }
}

impl Default for ReaddirBatch {
    fn default() -> Self {
        ReaddirBatch(Self::FIRST)
    }
}

async fn read_dir_on(c: &Connection, path: &Path) -> RemoteResult<Vec<DirEntry>> {
    // A channel answers in order, so several READDIRs on the handle can be in flight at
    // once: each gets the next batch of names, or EOF. With the CLOSE not waited for, a
    // listing costs two round trips instead of four or more, which is what makes `find`,
    // `ls -R` and `git status` bearable on a high-latency link.
    let ch = c.pick_for_open();
    let handle = expect_handle("OPENDIR", ch.request(&Request::Opendir { path }).await?)?;
    let mut listing = Listing::default();
    let mut batch = ReaddirBatch::default();
    let result = 'listing: loop {
        let n = batch.next_size();
        let mut pending = Vec::with_capacity(n);
        for _ in 0..n {
            match ch.send(&Request::Readdir { handle: &handle }).await {
                Ok(p) => pending.push(p),
                Err(e) => break 'listing Err(e),
            }
        }
        let mut done = None;
        for p in pending {
            // Past the end the rest of the round answers EOF (sftp-server answers a handle's
            // requests in order); names that come anyway are kept, whatever the server.
            match p.wait().await {
                Ok(Response::Name(names)) if !matches!(done, Some(Err(_))) => {
                    if let Err(e) = listing.take(names) {
                        warn!("listing {}: {e}", path.display());
                        done = Some(Err(e));
                    }
                }
                _ if done.is_some() => {}
                Ok(Response::Status { code: 1, .. }) => done = Some(Ok(())),
                Ok(Response::Status { code, message }) => {
                    done = Some(Err(status_err(code, message)))
                }
                Ok(other) => done = Some(Err(unexpected("READDIR", &other))),
                Err(e) => done = Some(Err(e)),
            }
        }
        if let Some(r) = done {
            break r;
        }
    };
    // Nobody needs the answer to CLOSE: queue it and go.
    if let Err(e) = ch.send(&Request::Close { handle: &handle }).await {
        debug!("closing directory {} failed: {e}", path.display());
    }
    result.map(|()| listing.entries)
}

/// The most a listing may bring: names plus NAME replies (so that empty replies count too).
/// A server that never answers EOF would otherwise grow the listing without end; past this
/// the listing fails with `EIO` (a real directory this large is listed by no SFTP client in
/// reasonable time either: at 100 bytes an entry it is 200 MiB).
const MAX_LISTING_ITEMS: usize = 1 << 21;

/// The entries of one listing as its NAME replies come, bounded by [`MAX_LISTING_ITEMS`].
struct Listing {
    entries: Vec<DirEntry>,
    items: usize,
    max_items: usize,
}

impl Default for Listing {
    fn default() -> Self {
        Listing {
            entries: Vec::new(),
            items: 0,
            max_items: MAX_LISTING_ITEMS,
        }
    }
}

/// The longest name a Linux directory entry may have (`NAME_MAX`).
const NAME_MAX: usize = 255;

impl Listing {
    /// Keep the entries of one NAME reply (`.`, `..`, and names no directory can hold are
    /// skipped); an error once the listing has grown past its bound.
    fn take(&mut self, names: Vec<codec::NameEntry>) -> RemoteResult<()> {
        self.items = self.items.saturating_add(names.len().max(1));
        if self.items > self.max_items {
            return Err(RemoteError::Protocol(format!(
                "the server sent more than {} names without ending the listing",
                self.max_items
            )));
        }
        for n in names {
            let name = n.filename.as_os_str();
            if name == OsStr::new(".") || name == OsStr::new("..") {
                continue;
            }
            // (Longer than NAME_MAX: no directory holds it, and a hostile server's
            // half-megabyte names must not be kept, up to the item bound, until the end.)
            let bytes = name.as_bytes();
            if bytes.is_empty() || bytes.contains(&b'/') || bytes.len() > NAME_MAX {
                debug!(len = bytes.len(), "skipping bad directory entry name");
                continue;
            }
            let nlink = n.nlink();
            self.entries.push(DirEntry {
                name: n.filename,
                attrs: n.attrs,
                nlink,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readdir_batches_double_from_four_up_to_thirty_two() {
        let mut b = ReaddirBatch::default();
        let sizes: Vec<_> = (0..6).map(|_| b.next_size()).collect();
        assert_eq!(sizes, [4, 8, 16, 32, 32, 32]);
    }

    fn name(n: &[u8]) -> codec::NameEntry {
        codec::NameEntry {
            filename: OsStr::from_bytes(n).to_os_string(),
            longname: Default::default(),
            attrs: Attrs::default(),
        }
    }

    #[test]
    fn a_path_with_a_nul_in_it_is_a_protocol_error() {
        let answer = |n: &[u8]| expect_one_name("READLINK", Response::Name(vec![name(n)]));
        assert_eq!(answer(b"../x").unwrap(), PathBuf::from("../x"));
        for bad in [&b"..\0"[..], b"..\0x", b"a\0/../.."] {
            assert!(
                matches!(answer(bad), Err(RemoteError::Protocol(_))),
                "{bad:?} must be refused"
            );
        }
    }

    #[test]
    fn a_realpath_answer_must_be_absolute_and_without_dot_dot() {
        let answer = |p: &str| canonical("REALPATH", PathBuf::from(p));
        assert_eq!(answer("/ws/d").unwrap(), PathBuf::from("/ws/d"));
        assert_eq!(answer("/").unwrap(), PathBuf::from("/"));
        for bad in ["", "ws/d", "/ws/../etc", "/ws/d/..", "..", "./x"] {
            assert!(
                matches!(answer(bad), Err(RemoteError::Protocol(_))),
                "{bad:?} must be refused"
            );
        }
    }

    #[test]
    fn a_listing_that_never_ends_is_cut_off() {
        let mut listing = Listing {
            max_items: 12,
            ..Default::default()
        };
        listing
            .take(vec![
                name(b"."),
                name(b".."),
                name(b"a"),
                name(b"b/c"),
                name(b""),
                name(&[b'x'; 256]),
                name(&[b'y'; 255]),
            ])
            .unwrap();
        let kept: Vec<_> = listing.entries.iter().map(|e| e.name.clone()).collect();
        let longest = OsStr::from_bytes(&[b'y'; 255]);
        assert_eq!(kept, [OsStr::new("a"), longest]);
        // Empty replies count too: a server answering NAME with no names forever.
        for _ in 0..5 {
            listing.take(Vec::new()).unwrap();
        }
        assert!(matches!(
            listing.take(vec![name(b"d")]),
            Err(RemoteError::Protocol(_))
        ));
    }

    #[test]
    fn a_read_along_counts_only_on_the_handle_the_open_got() {
        let data = || Some(Ok(Response::Data(Bytes::from_static(b"abc"))));
        let eof = || {
            Some(Ok(Response::Status {
                code: 1,
                message: String::new(),
            }))
        };
        let attrs = || {
            Some(Ok(Response::Attrs(Attrs {
                size: Some(3),
                ..Default::default()
            })))
        };
        let read = |forecast: &[u8], opened: &[u8], reply, len| {
            along_of(forecast, opened, None, reply, len).data
        };
        let h0 = 0u32.to_be_bytes();
        let h1 = 1u32.to_be_bytes();
        assert_eq!(read(&h0, &h0, data(), 8).as_deref(), Some(&b"abc"[..]));
        assert_eq!(read(&h0, &h0, eof(), 8).as_deref(), Some(&b""[..]));
        // Another handle: the bytes of whatever file that is, or nothing.
        assert_eq!(read(&h1, &h0, data(), 8), None);
        assert_eq!(read(&h1, &h0, eof(), 8), None);
        // More than asked for, or an error: read it the ordinary way.
        assert_eq!(read(&h0, &h0, data(), 2), None);
        let failure = || {
            Some(Ok(Response::Status {
                code: 4,
                message: "bad handle".into(),
            }))
        };
        assert_eq!(read(&h0, &h0, failure(), 8), None);
        let lost = || Some(Err(RemoteError::Disconnected("x".into())));
        assert_eq!(read(&h0, &h0, lost(), 8), None);
        // The attributes likewise: only of the handle the open got, only if they came.
        let size = |forecast: &[u8], fstat| along_of(forecast, &h0, fstat, data(), 8).attrs;
        assert_eq!(size(&h0, attrs()).and_then(|a| a.size), Some(3));
        assert!(size(&h1, attrs()).is_none());
        assert!(size(&h0, failure()).is_none());
        assert!(size(&h0, lost()).is_none());
        assert!(size(&h0, None).is_none());
        assert!(along_of(&h0, &h0, attrs(), None, 8).data.is_none());
    }

    #[test]
    fn limits_clamp() {
        let l = limits_from_server(&codec::ServerLimits {
            max_packet_len: 262144,
            max_read_len: 261120,
            max_write_len: 261120,
            max_open_handles: 1019,
        });
        assert_eq!(l.max_read, 255 * 1024);
        assert_eq!(l.max_write, 255 * 1024);
        assert_eq!(l.max_open_handles, 1019);
        let l = limits_from_server(&codec::ServerLimits {
            max_packet_len: 34000,
            max_read_len: 0,
            max_write_len: 100_000,
            max_open_handles: 0,
        });
        assert_eq!(l.max_read, 34000 - 1024);
        assert_eq!(l.max_write, 34000 - 1024);
        assert_eq!(l.max_open_handles, Limits::default().max_open_handles);
    }

    #[test]
    fn open_flags() {
        assert_eq!(pflags(OpenFlags::read_only()), codec::PFLAG_READ);
        let f = OpenFlags {
            write: true,
            create: true,
            exclusive: true,
            truncate: true,
            append: true,
            read: true,
        };
        assert_eq!(pflags(f), 0x3f);
    }
}
