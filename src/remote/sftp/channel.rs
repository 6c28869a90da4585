//! One SFTP session on one SSH session channel, with pipelining.
//!
//! Any number of tokio tasks call [`SftpChannel::request`] at once. Each request gets an id,
//! its encoded packet goes to a single writer task (so packets never interleave on the wire and
//! a cancelled caller can never leave half a packet behind), and a reader task reassembles
//! replies from the channel's data chunks and completes the waiting request by id.
//!
//! Bounds: russh's own send queue is unbounded, so every request first takes a slot from a
//! per-channel semaphore of [`MAX_REQUESTS_IN_FLIGHT`] and as many permits from a byte semaphore
//! as it moves payload ([`MAX_BYTES_IN_FLIGHT`]; READ and WRITE data count more when the link
//! is short, see [`pacing`]). Permits are released when the reply arrives (not when the caller
//! gives up), so the bound holds even for cancelled requests.
//!
//! When the channel or the connection dies, every pending request completes with
//! [`RemoteError::Disconnected`] and later requests fail fast the same way. There is no
//! request timeout: a dead peer is detected by SSH keepalives, which close the connection.
//! If a caller stops waiting for an OPEN/OPENDIR and its HANDLE arrives later, the reader
//! closes that handle on the server instead of leaking it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use russh::client::Msg;
use russh::{ChannelMsg, ChannelReadHalf, ChannelWriteHalf};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, trace};

use super::codec::{self, OutPacket, Request, Response, Version};
use super::forecast::{self, Change, HandleForecast};
use super::pacing::{self, MinRtt};
use crate::remote::{RemoteError, RemoteResult};

/// Requests one channel may have outstanding. OpenSSH's sftp-server reads requests as they
/// come and answers each in turn, so this only bounds our memory and the server's queue
/// (bytes are bounded apart, below). At 64, 5,000 random 4 KiB `pwrite`s (a database's
/// pages: no two continue each other, so none are merged) took 1.83 s at 20 ms against
/// 0.47-0.72 s for sshfs, which bounds nothing; 256 took 0.68 s. 1,024 was slower again
/// (1.3-1.7 s): 4 MiB of small WRITEs is twice the SSH window OpenSSH gives a channel, and
/// 480 was uneven (0.31-0.96 s). What goes further is more channels: a descriptor's scattered
/// writes are spread over extra lanes (`core::file::SPREAD_AFTER`). On loopback, small WRITEs
/// are held to 64 by the write budget (`pacing::MIN_WRITE_CHARGE`).
pub const MAX_REQUESTS_IN_FLIGHT: usize = 256;

/// Payload bytes (READ lengths + WRITE data) one channel may have outstanding.
pub const MAX_BYTES_IN_FLIGHT: usize = 8 * 1024 * 1024;

/// Signals the death of the connection that several channels share. The first reason wins.
#[derive(Debug, Clone)]
pub(crate) struct DeathSignal {
    tx: Arc<watch::Sender<Option<String>>>,
}

impl DeathSignal {
    pub(crate) fn new() -> DeathSignal {
        DeathSignal {
            tx: Arc::new(watch::Sender::new(None)),
        }
    }

    pub(crate) fn fire(&self, reason: &str) {
        self.tx.send_if_modified(|r| {
            if r.is_none() {
                *r = Some(reason.to_string());
                true
            } else {
                false
            }
        });
    }

    pub(crate) fn reason(&self) -> Option<String> {
        self.tx.borrow().clone()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<String>> {
        self.tx.subscribe()
    }
}

struct Pending {
    tx: oneshot::Sender<RemoteResult<Response>>,
    /// When the request was queued, for the channel's reply times ([`pacing::MinRtt`]).
    sent: Instant,
    /// Held until the reply arrives.
    _permits: Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)>,
    /// For a CLOSE: held until the reply arrives (see [`SftpChannel::load`]).
    _closing: Option<ClosingGuard>,
}

/// Whether CLOSEs on their way since `age` ago may still be taken for answered at once (see
/// [`SftpChannel::load`]): for a round trip (`min_rtt`, the channel's recent shortest) and
/// a millisecond.
fn closes_are_quick(age: Duration, min_rtt: Option<Duration>) -> bool {
    age <= min_rtt.unwrap_or_default() + Duration::from_millis(1)
}

/// A CLOSE on its way: the channel's `closing` count, until dropped.
struct ClosingGuard(Arc<Shared>);

impl ClosingGuard {
    /// A CLOSE is being sent: one handle fewer from now on, one more CLOSE on its way.
    fn new(shared: &Arc<Shared>) -> ClosingGuard {
        if shared.closing.fetch_add(1, Ordering::Relaxed) == 0 {
            shared
                .closing_since
                .store(shared.born.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
        shared.handle_closed();
        ClosingGuard(shared.clone())
    }
}

impl Drop for ClosingGuard {
    fn drop(&mut self) {
        self.0.closing.fetch_sub(1, Ordering::Relaxed);
    }
}

/// See [`SftpChannel::copying`].
pub(crate) struct CopyGuard(Arc<Shared>);

impl Drop for CopyGuard {
    fn drop(&mut self) {
        self.0.copies.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Shared {
    index: usize,
    /// `None` once the channel is dead: nothing can be registered any more.
    pending: Mutex<Option<HashMap<u32, Pending>>>,
    dead_reason: Mutex<Option<String>>,
    /// `true` once dead; lets the writer stop waiting on a window that will never open.
    dead_tx: watch::Sender<bool>,
    next_id: AtomicU32,
    req_sem: Arc<Semaphore>,
    byte_sem: Arc<Semaphore>,
    /// Recent minimum reply time, which sizes the write budget ([`pacing`]).
    min_rtt: MinRtt,
    death: DeathSignal,
    /// Server-side copies in progress (see [`SftpChannel::copying`]).
    copies: AtomicUsize,
    /// CLOSEs waiting for their answer (see [`SftpChannel::load`]).
    closing: AtomicUsize,
    /// When `closing` last rose from 0, in microseconds after `born`: CLOSEs have been on
    /// their way without a break since then.
    closing_since: AtomicU64,
    /// When the channel was set up.
    born: Instant,
    /// Handles the server process holds for us: OPENs and OPENDIRs answered with one, less
    /// the CLOSEs registered for sending (see [`SftpChannel::handles`]).
    handles: AtomicUsize,
    /// The server's handle table as our requests change it (see [`SftpChannel::open_and_read`]).
    /// Locked inside `pending`, never the other way round.
    forecast: Mutex<HandleForecast>,
}

impl Shared {
    fn reason(&self) -> String {
        self.dead_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| "SFTP channel closed".into())
    }

    fn is_dead(&self) -> bool {
        *self.dead_tx.borrow()
    }

    /// A CLOSE is on its way: one handle fewer (see [`SftpChannel::handles`]).
    fn handle_closed(&self) {
        let _ = self
            .handles
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    fn lock_forecast(&self) -> std::sync::MutexGuard<'_, HandleForecast> {
        self.forecast.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocate an id that is not in use (ids wrap after 2^32 requests).
    fn alloc_id(&self, pending: &HashMap<u32, Pending>) -> u32 {
        loop {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            if !pending.contains_key(&id) {
                return id;
            }
        }
    }

    /// Mark the channel dead and fail everything that is waiting.
    fn kill(&self, reason: String) {
        let drained = {
            let mut r = self.dead_reason.lock().unwrap_or_else(|e| e.into_inner());
            if r.is_none() {
                *r = Some(reason.clone());
            }
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
        };
        let reason = self.reason();
        if let Some(map) = drained {
            debug!(
                channel = self.index,
                pending = map.len(),
                "SFTP channel dead: {reason}"
            );
            for (_, p) in map {
                let _ = p.tx.send(Err(RemoteError::Disconnected(reason.clone())));
            }
        }
        self.dead_tx.send_replace(true);
        self.req_sem.close();
        self.byte_sem.close();
        self.death.fire(&reason);
    }
}

/// A live SFTP session on one SSH channel.
pub(crate) struct SftpChannel {
    shared: Arc<Shared>,
    writer: mpsc::UnboundedSender<OutPacket>,
    version: Version,
}

impl std::fmt::Debug for SftpChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SftpChannel")
            .field("index", &self.shared.index)
            .field("dead", &self.shared.is_dead())
            .finish()
    }
}

/// Why a channel could not be started.
#[derive(Debug)]
pub(crate) enum StartError {
    /// The SSH layer failed (connection lost, channel open refused).
    Ssh(String),
    /// The server refused the subsystem or spoke something we do not understand.
    Sftp(String),
}

impl SftpChannel {
    /// Open a session channel on `session`, start the `sftp` subsystem, do INIT/VERSION and
    /// spawn the reader and writer tasks.
    pub(crate) async fn open<H: russh::client::Handler>(
        session: &russh::client::Handle<H>,
        index: usize,
        death: DeathSignal,
    ) -> Result<SftpChannel, StartError> {
        let mut ch = session
            .channel_open_session()
            .await
            .map_err(|e| StartError::Ssh(format!("opening SSH channel failed: {e}")))?;
        ch.request_subsystem(true, "sftp")
            .await
            .map_err(|e| StartError::Ssh(format!("requesting the sftp subsystem failed: {e}")))?;
        loop {
            match ch.wait().await {
                Some(ChannelMsg::Success) => break,
                Some(ChannelMsg::Failure) => {
                    return Err(StartError::Sftp(
                        "the server refused to start the sftp subsystem (is `Subsystem sftp` \
                         enabled in the server's sshd_config?)"
                            .into(),
                    ))
                }
                Some(ChannelMsg::Close) | Some(ChannelMsg::Eof) | None => {
                    return Err(StartError::Sftp(
                        "the server closed the channel while starting the sftp subsystem".into(),
                    ))
                }
                Some(other) => trace!("ignoring {other:?} while waiting for subsystem"),
            }
        }

        // INIT / VERSION, before the reader task exists (VERSION carries no request id).
        let init = codec::encode_init();
        let init_sent = Instant::now();
        ch.data_bytes(init.head)
            .await
            .map_err(|e| StartError::Ssh(format!("sending SFTP INIT failed: {e}")))?;
        let mut buf = BytesMut::new();
        let version = loop {
            match codec::split_frame(&mut buf) {
                Ok(Some(frame)) => {
                    break codec::decode_version(frame)
                        .map_err(|e| StartError::Sftp(format!("bad SFTP VERSION reply: {e}")))?
                }
                Ok(None) => {}
                Err(e) => return Err(StartError::Sftp(format!("bad SFTP VERSION reply: {e}"))),
            }
            match ch.wait().await {
                Some(ChannelMsg::Data { data }) => buf.extend_from_slice(&data),
                Some(ChannelMsg::ExtendedData { data, .. }) => {
                    debug!(
                        "sftp-server stderr: {}",
                        String::from_utf8_lossy(&data).trim_end()
                    )
                }
                Some(ChannelMsg::Close) | Some(ChannelMsg::Eof) | None => {
                    return Err(StartError::Sftp(
                        "the server closed the SFTP channel before answering INIT \
                         (the remote shell may print text at login, or sftp is disabled)"
                            .into(),
                    ))
                }
                Some(_) => {}
            }
        };
        if version.version != codec::SFTP_VERSION {
            return Err(StartError::Sftp(format!(
                "the server speaks SFTP version {}, only version 3 is supported",
                version.version
            )));
        }
        debug!(
            channel = index,
            extensions = ?version.extensions.iter().map(|e| &e.0).collect::<Vec<_>>(),
            "SFTP session started"
        );

        // The INIT round trip is the first reply time (an upper bound: it includes starting
        // the session); the first replies to requests bring it down.
        let min_rtt = MinRtt::default();
        let now = Instant::now();
        min_rtt.sample(now, now.saturating_duration_since(init_sent));
        let (read, write) = ch.split();
        let (dead_tx, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            index,
            pending: Mutex::new(Some(HashMap::new())),
            dead_reason: Mutex::new(None),
            dead_tx,
            next_id: AtomicU32::new(1),
            req_sem: Arc::new(Semaphore::new(MAX_REQUESTS_IN_FLIGHT)),
            byte_sem: Arc::new(Semaphore::new(MAX_BYTES_IN_FLIGHT)),
            min_rtt,
            death,
            copies: AtomicUsize::new(0),
            closing: AtomicUsize::new(0),
            closing_since: AtomicU64::new(0),
            born: now,
            handles: AtomicUsize::new(0),
            forecast: Mutex::new(HandleForecast::default()),
        });
        let (wtx, wrx) = mpsc::unbounded_channel();
        tokio::spawn(writer_task(write, wrx, shared.clone()));
        tokio::spawn(reader_task(read, shared.clone(), wtx.downgrade(), buf));
        Ok(SftpChannel {
            shared,
            writer: wtx,
            version,
        })
    }

    pub(crate) fn version(&self) -> &Version {
        &self.version
    }

    /// Requests waiting for a reply (for picking the least loaded channel). A channel whose
    /// server process is making a copy counts as full: it answers nothing else until the
    /// copy is done.
    pub(crate) fn load(&self) -> usize {
        let mut waiting =
            MAX_REQUESTS_IN_FLIGHT.saturating_sub(self.shared.req_sem.available_permits());
        // A CLOSE of a released file is sent in the background and, on a local disk, answered
        // at once: a channel with only such CLOSEs on their way is as good as idle, and the
        // next file's OPEN goes best to the process that served the last one. Not once the
        // channel has had CLOSEs on their way without a break for longer than a round trip
        // and a millisecond: close(2) can be slow on the server (NFS writes a file's data back
        // at its close), and sftp-server answers in order, so an OPEN behind it would wait.
        let closing = self.shared.closing.load(Ordering::Relaxed);
        if closing > 0 {
            let since = Duration::from_micros(self.shared.closing_since.load(Ordering::Relaxed));
            let age = self.shared.born.elapsed().saturating_sub(since);
            if closes_are_quick(age, self.shared.min_rtt.get()) {
                waiting = waiting.saturating_sub(closing);
            }
        }
        waiting + self.shared.copies.load(Ordering::Relaxed) * MAX_REQUESTS_IN_FLIGHT
    }

    /// Files and directories open on this channel. Their reads and listings will come here
    /// (a handle belongs to its server process), so among channels equally loaded now, the
    /// one with fewer open is the better place for another OPEN: files opened one after
    /// another and then read at once still spread over the server processes.
    pub(crate) fn handles(&self) -> usize {
        self.shared.handles.load(Ordering::Relaxed)
    }

    /// Mark the channel busy with a server-side copy (`copy-data`) until the guard is dropped,
    /// so that new requests go to the other channels meanwhile (see [`SftpChannel::load`]).
    pub(crate) fn copying(&self) -> CopyGuard {
        self.shared.copies.fetch_add(1, Ordering::Relaxed);
        CopyGuard(self.shared.clone())
    }

    fn disconnected(&self) -> RemoteError {
        RemoteError::Disconnected(self.shared.reason())
    }

    /// Send `req` and wait for its reply. Cancel-safe: dropping the future never corrupts the
    /// stream, and the in-flight bounds stay held until the server answers.
    pub(crate) async fn request(&self, req: &Request<'_>) -> RemoteResult<Response> {
        self.send(req).await?.wait().await
    }

    /// Queue `req` for sending and return without waiting for the reply. Packets queued by
    /// successive calls go on the wire in call order. Waits only for the in-flight bounds.
    pub(crate) async fn send(&self, req: &Request<'_>) -> RemoteResult<PendingReply> {
        self.send_forecast(req).await.map(|(reply, _)| reply)
    }

    /// Send an OPEN (`open`, a read-only open of a file) and, when the handle it will get
    /// can be told in advance (see `forecast`), right behind it on that handle an FSTAT (with
    /// `stat`) and a READ of `len` bytes at offset 0: open, attributes and first read in one
    /// round trip. The replies, with the handle they were sent on, to be used only if the
    /// OPEN answers with that handle.
    pub(crate) async fn open_and_read(
        &self,
        open: &Request<'_>,
        len: u32,
        stat: bool,
    ) -> RemoteResult<(PendingReply, Option<ForecastReplies>)> {
        let (opened, forecast) = self.send_forecast(open).await?;
        let Some(handle) = forecast else {
            return Ok((opened, None));
        };
        // (A request that cannot be sent changes nothing: the open stands without it.)
        let fstat = match stat {
            true => self.send(&Request::Fstat { handle: &handle }).await.ok(),
            false => None,
        };
        let read = Request::Read {
            handle: &handle,
            offset: 0,
            len,
        };
        let read = self.send(&read).await.ok();
        Ok((
            opened,
            Some(ForecastReplies {
                handle,
                fstat,
                read,
            }),
        ))
    }

    /// [`send`](Self::send), and for an OPEN or OPENDIR the handle it will get if it
    /// succeeds, as forecast when it was queued (see `forecast`).
    async fn send_forecast(
        &self,
        req: &Request<'_>,
    ) -> RemoteResult<(PendingReply, Option<Bytes>)> {
        if self.shared.is_dead() {
            return Err(self.disconnected());
        }
        let req_permit = self
            .shared
            .req_sem
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| self.disconnected())?;
        let cost = request_cost(req, || self.shared.min_rtt.get()) as u32;
        let byte_permit = self
            .shared
            .byte_sem
            .clone()
            .acquire_many_owned(cost)
            .await
            .map_err(|_| self.disconnected())?;

        // From here to the end there is no await: the request is registered and queued
        // entirely, or not at all.
        let (tx, rx) = oneshot::channel();
        let change = change_of(req);
        let (id, forecast, queued) = {
            let mut guard = self
                .shared
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let Some(map) = guard.as_mut() else {
                drop(guard);
                return Err(self.disconnected());
            };
            let id = self.shared.alloc_id(map);
            map.insert(
                id,
                Pending {
                    tx,
                    sent: Instant::now(),
                    _permits: Some((req_permit, byte_permit)),
                    _closing: matches!(req, Request::Close { .. })
                        .then(|| ClosingGuard::new(&self.shared)),
                },
            );
            match change {
                // Queued for the wire under the same lock, so that the forecast sees the
                // handle-changing requests in the order the server will. (Only those: the
                // lock is taken for every request and every reply, and the others need no
                // order among themselves.)
                Some(c) => {
                    let packet = codec::encode_request(id, req);
                    let forecast = self.shared.lock_forecast().sent(id, c);
                    if self.writer.send(packet).is_err() {
                        drop(guard);
                        self.shared.kill("SFTP writer stopped".into());
                        return Err(self.disconnected());
                    }
                    (id, forecast, true)
                }
                None => (id, None, false),
            }
        };
        if !queued && self.writer.send(codec::encode_request(id, req)).is_err() {
            self.shared.kill("SFTP writer stopped".into());
            return Err(self.disconnected());
        }
        trace!(channel = self.shared.index, id, op = req.name(), "send");
        Ok((
            PendingReply {
                rx,
                shared: self.shared.clone(),
            },
            forecast,
        ))
    }
}

/// How `req` changes the server's handle table, if it does.
fn change_of(req: &Request<'_>) -> Option<Change> {
    match req {
        Request::Open { .. } | Request::Opendir { .. } => Some(Change::Open),
        Request::Close { handle } => forecast::index_of(handle).map(Change::Close),
        _ => None,
    }
}

/// Permits of the byte semaphore `req` takes on a channel whose recent minimum reply time
/// `min_rtt` gives: its payload, READ and WRITE data paced (see [`pacing`] for why neither
/// may pile up at the server). Only a READ or a WRITE asks for the reply time (it takes a
/// lock).
fn request_cost(req: &Request<'_>, min_rtt: impl FnOnce() -> Option<Duration>) -> usize {
    match req {
        Request::Write { data, .. } => {
            let budget = pacing::write_budget(min_rtt(), MAX_BYTES_IN_FLIGHT);
            pacing::write_cost(data.len(), budget, MAX_BYTES_IN_FLIGHT)
        }
        Request::Read { len, .. } => {
            let budget = pacing::read_budget(min_rtt(), MAX_BYTES_IN_FLIGHT);
            pacing::read_cost(*len as usize, budget, MAX_BYTES_IN_FLIGHT)
        }
        _ => req.data_cost().min(MAX_BYTES_IN_FLIGHT),
    }
}

/// Requests sent behind an OPEN on the handle it was forecast to get (see
/// [`SftpChannel::open_and_read`]); each None if it could not be sent.
pub(crate) struct ForecastReplies {
    pub(crate) handle: Bytes,
    pub(crate) fstat: Option<PendingReply>,
    pub(crate) read: Option<PendingReply>,
}

/// The reply to a request already queued by [`SftpChannel::send`].
pub(crate) struct PendingReply {
    rx: oneshot::Receiver<RemoteResult<Response>>,
    shared: Arc<Shared>,
}

impl PendingReply {
    pub(crate) async fn wait(self) -> RemoteResult<Response> {
        match self.rx.await {
            Ok(r) => r,
            Err(_) => Err(RemoteError::Disconnected(self.shared.reason())),
        }
    }
}

async fn writer_task(
    write: ChannelWriteHalf<Msg>,
    mut rx: mpsc::UnboundedReceiver<OutPacket>,
    shared: Arc<Shared>,
) {
    let mut dead = shared.dead_tx.subscribe();
    loop {
        let packet = tokio::select! {
            p = rx.recv() => p,
            _ = dead.wait_for(|d| *d) => return,
        };
        let Some(packet) = packet else {
            // The SftpChannel was dropped: end the SFTP session politely.
            let _ = write.eof().await;
            let _ = write.close().await;
            return;
        };
        let send = async {
            write.data_bytes(packet.head).await?;
            if let Some(tail) = packet.tail {
                write.data_bytes(tail).await?;
            }
            Ok::<(), russh::Error>(())
        };
        let res = tokio::select! {
            r = send => r,
            _ = dead.wait_for(|d| *d) => return,
        };
        if let Err(e) = res {
            shared.kill(format!("sending to the server failed: {e}"));
            return;
        }
    }
}

async fn reader_task(
    mut read: ChannelReadHalf,
    shared: Arc<Shared>,
    writer: mpsc::WeakUnboundedSender<OutPacket>,
    mut buf: BytesMut,
) {
    let mut exit_status: Option<u32> = None;
    let reason = 'outer: loop {
        match read.wait().await {
            Some(ChannelMsg::Data { data }) => {
                buf.extend_from_slice(&data);
                loop {
                    match codec::split_frame(&mut buf) {
                        Ok(Some(frame)) => {
                            if let Err(e) = dispatch(&shared, &writer, frame) {
                                break 'outer format!("protocol error: {e}");
                            }
                        }
                        Ok(None) => break,
                        Err(e) => break 'outer format!("protocol error: {e}"),
                    }
                }
            }
            Some(ChannelMsg::ExtendedData { data, .. }) => {
                debug!(
                    channel = shared.index,
                    "sftp-server stderr: {}",
                    String::from_utf8_lossy(&data).trim_end()
                );
            }
            Some(ChannelMsg::ExitStatus { exit_status: s }) => exit_status = Some(s),
            Some(ChannelMsg::Eof) | Some(ChannelMsg::Close) | None => {
                break match exit_status {
                    Some(s) => format!("the server's sftp-server exited (status {s})"),
                    None => "the SSH connection or SFTP channel was closed".into(),
                };
            }
            Some(_) => {}
        }
    };
    shared.kill(reason);
}

/// Complete the request a reply belongs to. An error means the stream is unusable.
fn dispatch(
    shared: &Shared,
    writer: &mpsc::WeakUnboundedSender<OutPacket>,
    frame: Bytes,
) -> Result<(), String> {
    let (id, result) = match codec::decode_response(frame) {
        Ok((id, r)) => (id, Ok(r)),
        Err((Some(id), e)) => (id, Err(RemoteError::Protocol(e.0))),
        Err((None, e)) => return Err(e.0),
    };
    let pending = shared
        .pending
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
        .and_then(|m| m.remove(&id));
    let Some(pending) = pending else {
        debug!(
            channel = shared.index,
            id, "reply for a request we did not send; ignored"
        );
        return Ok(());
    };
    let now = Instant::now();
    shared
        .min_rtt
        .sample(now, now.saturating_duration_since(pending.sent));
    trace!(channel = shared.index, id, "reply");
    let handle = match &result {
        Ok(Response::Handle(h)) => Some(&h[..]),
        _ => None,
    };
    if handle.is_some() {
        shared.handles.fetch_add(1, Ordering::Relaxed);
    }
    shared.lock_forecast().answered(id, handle);
    // The channel's load drops before the caller hears: a caller that sends its next request
    // at once (on another thread) must find the channel as idle as it is, or it would send
    // elsewhere (see `Connection::pick`).
    let Pending {
        tx,
        _permits,
        _closing,
        ..
    } = pending;
    // (The CLOSE count first: it never counts more than the permits held.)
    drop((_closing, _permits));
    if let Err(Ok(Response::Handle(handle))) = tx.send(result) {
        // The caller gave up on an OPEN/OPENDIR: do not leak the server's handle.
        close_orphan(shared, writer, handle);
    }
    Ok(())
}

fn close_orphan(shared: &Shared, writer: &mpsc::WeakUnboundedSender<OutPacket>, handle: Bytes) {
    let Some(writer) = writer.upgrade() else {
        return;
    };
    let mut guard = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
    let Some(map) = guard.as_mut() else { return };
    let id = shared.alloc_id(map);
    let (tx, _rx) = oneshot::channel();
    map.insert(
        id,
        Pending {
            tx,
            sent: Instant::now(),
            _permits: None,
            _closing: None,
        },
    );
    debug!(
        channel = shared.index,
        id, "closing a handle whose opener went away"
    );
    // (Not counted among the CLOSEs on their way: it holds no place among the requests
    // waiting either.)
    shared.handle_closed();
    let close = Request::Close { handle: &handle };
    if let Some(change) = change_of(&close) {
        let _ = shared.lock_forecast().sent(id, change);
    }
    let _ = writer.send(codec::encode_request(id, &close));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closes_count_as_load_once_slower_than_a_round_trip_and_a_millisecond() {
        let ms = Duration::from_millis;
        assert!(closes_are_quick(ms(0), None));
        assert!(closes_are_quick(ms(1), None));
        assert!(!closes_are_quick(ms(2), None));
        // On a 20 ms link a CLOSE is on its way for 20 ms at least.
        assert!(closes_are_quick(ms(20), Some(ms(20))));
        assert!(!closes_are_quick(ms(30), Some(ms(20))));
    }

    #[test]
    fn reads_and_writes_are_paced_on_a_short_link_only() {
        let data = Bytes::from(vec![0u8; 255 * 1024]);
        let write = Request::Write {
            handle: b"h",
            offset: 0,
            data: data.clone(),
        };
        let read = Request::Read {
            handle: b"h",
            offset: 0,
            len: 255 * 1024,
        };
        let loopback = || Some(Duration::from_micros(100));
        let long = || Some(Duration::from_millis(20));
        let never = || -> Option<Duration> { panic!("the reply time was asked for") };
        // Loopback: the write budget is the floor, so four 255 KiB WRITEs fill the channel.
        let w = request_cost(&write, loopback);
        assert_eq!(MAX_BYTES_IN_FLIGHT / w, 4, "cost {w}");
        // A long link: bytes are bytes.
        assert_eq!(request_cost(&write, long), data.len());
        // Loopback: the read budget is its floor, 3 MiB: twelve 255 KiB READs fill the channel.
        let r = request_cost(&read, loopback);
        assert_eq!(MAX_BYTES_IN_FLIGHT / r, 12, "cost {r}");
        // A long link, or nothing measured yet: bytes are bytes.
        assert_eq!(request_cost(&read, long), 255 * 1024);
        assert_eq!(request_cost(&read, || None), 255 * 1024);
        // Metadata moves no payload.
        assert_eq!(request_cost(&Request::Close { handle: b"h" }, never), 0);
    }
}
