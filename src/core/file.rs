//! Open files: the remote handle, reopen after a reconnect, and write-behind.
//!
//! Writes are acknowledged to the application as soon as they are queued for the server (as
//! sshfs does), which is what makes sequential writes fast on a high-latency link. A write
//! that fits in the file's [`EARLY_ANSWER_BYTES`] of queue (bytes taken from the application
//! but not yet sent) is answered right where it is queued, on the FUSE thread, without waiting
//! for the writer task to run; a larger one, or any write while the queue is full, is answered
//! once the writer has put it on the wire. What keeps that honest:
//! * one writer task **per file** (inode, not per descriptor) takes writes in the order the
//!   kernel sent them and puts them on the wire in that order. Consecutive writes through the
//!   same descriptor are pipelined; when the next write comes through another descriptor (which
//!   may live on another SFTP channel, served by another server process), the earlier writes
//!   are answered first. So overlapping writes are never reordered, whichever descriptors they
//!   come through;
//! * bytes queued and bytes in flight per file are each bounded by a semaphore, so memory does
//!   not grow with the file;
//! * every operation that must see the writes (read, getattr, truncate, flush, fsync, unmount)
//!   queues a barrier behind them or waits for the writes to be answered, whether they are
//!   still queued or on the wire;
//! * a failure is latched on the descriptor it was written through and reported, once each,
//!   to its writes, to the close of the thread that opened it, and to fsync ([`Told`]): an
//!   acknowledged write is on the server or its loss is reported, never silent. Until the
//!   writes are told, nothing more is sent and nothing is answered early: the next write waits
//!   for the writer, which reports the failure (so does any close).
//!
//! **Merging.** Writes of one descriptor that wait in the queue behind another, each starting
//! where the one before ends, go out as one WRITE of up to `max_write` bytes (`Merged`): a
//! log flushed line by line or `dd bs=512` would otherwise be held to one channel's requests
//! in flight (`MAX_REQUESTS_IN_FLIGHT`) per round trip. Nothing waits to be merged: only
//! what already queued while the writer was busy. The merged WRITE is one write for
//! everything above (order, failure latched and reported, sent again after a connection
//! loss).
//!
//! **Striping.** One SFTP channel moves at most its SSH flow-control window (OpenSSH: 2 MiB)
//! per round trip, so at 20 ms one handle cannot write faster than about 100 MiB/s; and it
//! keeps at most `MAX_REQUESTS_IN_FLIGHT` requests outstanding, so small writes at random
//! places (a database's pages, which nothing merges) go at most that many per round trip.
//! Once a descriptor's writes have been one contiguous run (each starting where the previous
//! one ended) for [`STRIPE_AFTER`] bytes, or a write that does not continue the one before
//! has [`SPREAD_AFTER`] more writes of the file waiting behind it, or [`SPREAD_AFTER_BYTES`],
//! the writer opens the file again on up to [`MAX_LANES`]` - 1` other channels ("lanes",
//! `Remote::open_alongside`, write only, never for `O_APPEND`) and from then on sends the
//! descriptor's writes over all of them: the file is dealt out in units of
//! [`STRIPE_UNIT`], in turn to the descriptor's own handle and to each lane (`Placement`).
//! The guarantees above still hold:
//! * ordering: before the first write goes on a lane, every earlier write is answered; from
//!   then on a byte always goes through the same handle, so two writes over the same bytes go
//!   through one channel to one server process, which does them in the order sent, and writes
//!   over different bytes may land in any order. An attribute change goes through the own
//!   handle after every lane's writes are answered, and a lane's write after it waits for its
//!   answer (so no write lands after a time change it preceded, or before one it followed).
//!   A write through another descriptor, or a barrier, waits for every answer first;
//! * errors: the answers of lane writes are latched on the descriptor like any other. A lane
//!   whose write cannot be sent for a connection error is dropped and the chunk goes through
//!   the descriptor's own handle (which is reopened after a reconnect); a chunk already in
//!   flight when the connection dropped is sent again, as on the primary handle (see
//!   *Connection loss* below). A lane that cannot be opened (mode changed since the create,
//!   handle limit, ...) just means no striping;
//! * memory: lanes share the file's [`WRITE_WINDOW`]. 16 MiB in flight keeps four 2 MiB
//!   channel windows full with as much again queued (4 x 2 MiB per round trip: 400 MiB/s at
//!   20 ms, 160 MiB/s at 50 ms, both above what one sshd and sftp-server write at loopback).
//!
//! Lanes are opened by path, like a reopen after a reconnect, through `Fs::open_by_name`: kept
//! only if no rename or unlink through the mount raced the open (see `names`). That may be
//! long after the descriptor was opened, and SFTP v3 has no inode numbers to tell that the
//! name still leads to its file if it was replaced on the server's side meanwhile: the lanes
//! are used only if FSTAT tells the same of each of them as of the descriptor's own handle
//! (size, owner, group, mode, mtime), asked while none of the file's writes is in flight
//! (`same_file_or_refused`).
//!
//! **Attributes behind the writes.** `chmod`, `utimens` and a `chown` that keeps owner and
//! group, of a file whose only descriptor created it (`O_EXCL`, so the server user owns it),
//! go through the same queue, behind the writes (and behind every lane's writes, so the mtime
//! they set is not moved by a write landing later): what `tar` and `cp -p` do to every file
//! they make costs no round trip of its own. They are reported like writes: a failure comes
//! back from the next write, `flush` or `fsync`.
//!
//! **Connection loss.** A write (or attribute change) on the wire when the connection drops
//! may or may not have been done by the server. It is kept until its answer ([`Lost`]) and,
//! if that is the loss, sent again on the new connection in the order first sent, before
//! anything else of the file goes there ([`catch_up`]): every answer is awaited first, as for
//! a switch of descriptor, so a later write over the same bytes still lands last and the file
//! ends as if the drop had not happened. The writer notices the loss before sending anything
//! new: the handle it would use is stale, or was reopened since its previous write, or a
//! lost write is already waiting; and the first loss to come back nudges it (and it looks
//! again every second while there is no connection), so the writes are sent again as soon as
//! there is a connection even if the file is not used again. Until
//! then they count as pending: reads and `getattr` wait for them. Through an `O_APPEND`
//! handle the server appends whatever the offset, so such a write is reported instead, as is
//! one lost again after [`MAX_LOSSES`] resends.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, OwnedRwLockWriteGuard, OwnedSemaphorePermit, RwLock, Semaphore};

use super::inode::Ino;
use super::Fs;
use crate::remote::{Attrs, OpenFlags, Remote, RemoteError, SetAttrs};

/// Bytes of writes in flight per file before the writer waits for answers.
pub const WRITE_WINDOW: u32 = 16 * 1024 * 1024;

/// Bytes of writes a file may have queued (answered early, not yet on the wire). The writer
/// task sends them in order; this bounds the memory they take while it is behind. 4 MiB is
/// four `dd bs=1M` writes, or a few hundred of the small writes `tar` and editors make.
pub const EARLY_ANSWER_BYTES: u32 = 4 * 1024 * 1024;

/// Bytes one descriptor writes contiguously before its writes are striped over lanes.
pub const STRIPE_AFTER: u64 = 4 * 1024 * 1024;

/// Bytes of one descriptor's contiguous run after which, and after every such many more, the
/// server is asked to write the file back to its disk ([`Remote::write_back_early`]), on a
/// channel of its own, while the writes go on. A long write is often ended by `fsync` (`dd
/// conv=fsync`, `sync FILE` after `cp`, git's packs, a database; a plain `sync(2)` never
/// reaches a FUSE mount): without this, the server
/// wrote all of it to its disk then, after the transfer (a 256 MiB file: 0.4 s on the test
/// machine's disk, a third of the `dd`); with it, the disk works while the data comes.
/// Small files never reach it. A long write closed without `fsync` turns it off for the
/// mount until an `fsync` of a file with a long write shows it is wanted again
/// (`write_back::EarlyWriteBack`).
pub const WRITE_BACK_EVERY: u64 = 32 * 1024 * 1024;

/// Most handles (the descriptor's own included) one descriptor's writes are spread over.
pub const MAX_LANES: usize = 4;

/// Jobs waiting in a file's write queue (writes of any descriptor, and attribute changes queued
/// behind them) behind a write that does not continue the same descriptor's write before it
/// (a database's pages, say), from which the descriptor's writes are spread over lanes, like a
/// long run's: as many requests as one channel keeps in flight at most
/// (`MAX_REQUESTS_IN_FLIGHT` of the SFTP remote; fewer on loopback, where the write budget
/// holds small writes to fewer). A queue that long means one channel is not keeping up; a
/// slow trickle of writes never queues up, and never opens lanes.
pub const SPREAD_AFTER: usize = 256;

/// The same in bytes waiting (of writes answered early, see [`EARLY_ANSWER_BYTES`]; the
/// deciding write's own not counted): what one channel moves per round trip, OpenSSH's 2 MiB
/// window. Bigger scattered writes fill the queue's bytes long before its count reaches
/// [`SPREAD_AFTER`].
pub const SPREAD_AFTER_BYTES: usize = 2 * 1024 * 1024;

/// Bytes of the file dealt to one handle before the next one's (rounded up to whole
/// `max_write` chunks). Turns of one chunk measured the same within noise (256 MiB `dd` at
/// 20 ms: 130 vs 134-138 MiB/s); whole MiBs mean fewer switches between channels.
pub const STRIPE_UNIT: usize = 1024 * 1024;

/// How a write that waits is answered: the bytes written, or a failure with the end of the
/// write that failed (which tells EFBIG from EIO).
pub(crate) type WriteAnswer = Result<u32, (RemoteError, u64)>;

pub(crate) enum WriteJob<R: Remote> {
    Data {
        file: Arc<OpenFile<R>>,
        offset: u64,
        data: Bytes,
        /// Where the write is answered; `None` if it was answered when queued (its failure is
        /// then latched only, and reported by the next write, flush or fsync).
        done: Option<oneshot::Sender<WriteAnswer>>,
        /// Its share of [`EARLY_ANSWER_BYTES`], given back once it is on the wire.
        early: Option<OwnedSemaphorePermit>,
    },
    /// Answered once every earlier write has been answered.
    Barrier { done: oneshot::Sender<()> },
    /// Answered once every earlier job is on the wire (answered or not).
    Sent { done: oneshot::Sender<()> },
    /// Send again what a lost connection took, once there is a connection (see `nudge`).
    CatchUp,
    /// Change attributes through `file`'s handle, after the writes before it.
    SetAttrs {
        file: Arc<OpenFile<R>>,
        attrs: SetAttrs,
    },
}

/// The ordered write queue of one file, shared by all its open descriptors.
pub struct WriteStream<R: Remote> {
    writer: Mutex<Option<mpsc::UnboundedSender<WriteJob<R>>>>,
    window: Arc<Semaphore>,
    /// Bytes of writes answered early and not yet on the wire ([`EARLY_ANSWER_BYTES`]).
    early: Arc<Semaphore>,
    /// Write jobs submitted but not yet taken by the writer task.
    queued: AtomicUsize,
    /// What a lost connection took with it while on the wire, to be sent again ([`catch_up`]).
    lost: Mutex<Vec<Lost<R>>>,
    /// [`catch_up`]s running: what they took from `lost` may be neither there nor in flight.
    catching_up: AtomicUsize,
    /// Write failures of the file through any of its descriptors, for fsync through another
    /// (see [`OpenFile::tell_file_failure`]).
    failures: Mutex<FileFailures>,
}

/// The file's side of the kernel's errseq: its latest write failure, how many there were,
/// and whether any fsync or close reported the latest yet.
#[derive(Debug, Default)]
struct FileFailures {
    last: Option<(RemoteError, u64)>,
    seq: u64,
    seen: bool,
}

impl<R: Remote> Default for WriteStream<R> {
    fn default() -> Self {
        WriteStream {
            writer: Mutex::new(None),
            window: Arc::new(Semaphore::new(WRITE_WINDOW as usize)),
            early: Arc::new(Semaphore::new(EARLY_ANSWER_BYTES as usize)),
            queued: AtomicUsize::new(0),
            lost: Mutex::new(Vec::new()),
            catching_up: AtomicUsize::new(0),
            failures: Mutex::new(FileFailures::default()),
        }
    }
}

impl<R: Remote> WriteStream<R> {
    /// Where a descriptor opened now starts in the file's failures: after every one so far,
    /// unless the latest was reported to nobody (then the new descriptor's fsync reports it,
    /// as errseq does for a file opened after a write-back error nobody has seen).
    fn failures_sample(&self) -> u64 {
        let f = self.failures.lock().unwrap();
        if f.seen {
            f.seq
        } else {
            f.seq.saturating_sub(1)
        }
    }

    fn latch(&self, err: RemoteError, end: u64) {
        let mut f = self.failures.lock().unwrap();
        f.seq += 1;
        f.last = Some((err, end));
        f.seen = false;
    }

    /// Whether writes are queued, in flight, or lost with a connection and not yet sent
    /// again (a read must wait for those too: the server may not have them).
    pub fn pending(&self) -> bool {
        self.queued.load(Ordering::Acquire) > 0
            || self.window.available_permits() < WRITE_WINDOW as usize
            || self.has_lost()
            || self.catching_up.load(Ordering::Acquire) > 0
    }

    /// Queue a job for the writer task, starting the task on first use.
    pub(crate) fn submit(self: &Arc<Self>, fs: &Arc<Fs<R>>, job: WriteJob<R>) -> bool {
        let mut writer = self.writer.lock().unwrap();
        if writer.is_none() {
            let (tx, rx) = mpsc::unbounded_channel();
            fs.runtime()
                .spawn(writer_loop(self.clone(), Arc::downgrade(fs), rx));
            *writer = Some(tx);
        }
        let is_data = !matches!(
            job,
            WriteJob::Barrier { .. } | WriteJob::Sent { .. } | WriteJob::CatchUp
        );
        if is_data {
            self.queued.fetch_add(1, Ordering::AcqRel);
        }
        let sent = writer.as_ref().unwrap().send(job).is_ok();
        if is_data && !sent {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        sent
    }

    /// Queue a barrier for the writer task if it runs (checked and sent under one lock: a
    /// barrier must never start a task, which, on a stream whose last descriptor has just
    /// stopped it, nothing would ever stop again). Whether it was queued.
    fn barrier_if_running(&self, done: oneshot::Sender<()>) -> bool {
        let writer = self.writer.lock().unwrap();
        writer
            .as_ref()
            .is_some_and(|tx| tx.send(WriteJob::Barrier { done }).is_ok())
    }

    /// No descriptor of the file is open any more: let the writer task end once it has
    /// written what is queued (a later open starts a new one).
    pub fn stop(&self) {
        self.writer.lock().unwrap().take();
    }

    /// Wait until every write put on the wire so far has been answered (`held`: bytes of the
    /// window the caller holds itself, for what it is about to send).
    async fn wait_all_answered(&self, held: u32) {
        drop(self.window.acquire_many(WRITE_WINDOW - held).await);
    }

    fn has_lost(&self) -> bool {
        !self.lost.lock().unwrap().is_empty()
    }

    /// Whether writes a lost connection took are waiting to be sent again, or being sent.
    pub(crate) fn has_lost_writes(&self) -> bool {
        self.has_lost() || self.catching_up.load(Ordering::Acquire) > 0
    }

    /// Have the writer task send again what was lost, if it runs.
    fn nudge(&self) {
        if let Some(tx) = self.writer.lock().unwrap().as_ref() {
            let _ = tx.send(WriteJob::CatchUp);
        }
    }

    /// Wait for the server's answer to `sent` in the background, keeping `permit` (bytes of
    /// the window) until it comes. A connection lost with it on the wire keeps it for
    /// [`catch_up`] to send again; any other failure is latched on its descriptor.
    fn answer_later(
        self: &Arc<Self>,
        fs: &Weak<Fs<R>>,
        ack: crate::remote::WriteAck,
        permit: OwnedSemaphorePermit,
        mut sent: Lost<R>,
    ) {
        let (stream, fs) = (self.clone(), fs.clone());
        tokio::spawn(async move {
            // Counted out only once a loss is in `lost` (sent again through the own handle,
            // not a lane): one who looks at the count, then at `lost`, sees one of them.
            let lane_write = std::mem::take(&mut sent.on_lane).then(|| sent.file.clone());
            let answer = ack.await;
            if answer.is_ok() {
                // Before the permit goes (and with it `pending`): whoever then finds nothing
                // pending finds the landing on the change clock instead.
                if let Some(fs) = fs.upgrade() {
                    fs.write_landed(sent.file.ino);
                }
            }
            if let Err(e) = answer {
                if sent.may_send_again(&e) {
                    tracing::debug!(
                        ino = sent.file.ino,
                        "on the wire when the connection was lost: {e}"
                    );
                    let first = {
                        let mut lost = stream.lost.lock().unwrap();
                        lost.push(sent);
                        lost.len() == 1
                    };
                    if first {
                        // Sent again as soon as there is a connection, not only when the
                        // file is next written, read or closed: it is acknowledged data.
                        stream.nudge();
                    }
                } else {
                    sent.failed(&fs, e);
                }
            }
            if let Some(file) = lane_write {
                file.lane_writes.fetch_sub(1, Ordering::AcqRel);
            }
            drop(permit);
        });
    }
}

/// How often one write may be lost with a connection and sent again before its loss is
/// reported instead (a connection that keeps dropping under it).
const MAX_LOSSES: u8 = 3;

/// A write or attribute change the writer puts on the wire, kept until its answer: if the
/// connection is lost before that, the server may or may not have done it.
struct Lost<R: Remote> {
    /// The order in which the writer first sent it.
    seq: u64,
    file: Arc<OpenFile<R>>,
    what: Resend,
    /// How many connections it was lost with so far.
    losses: u8,
    /// Sent through a lane, and counted in its descriptor's `lane_writes` until answered.
    on_lane: bool,
}

enum Resend {
    /// `data` at `at`.
    Chunk {
        at: u64,
        data: Bytes,
    },
    Attrs(SetAttrs),
}

impl<R: Remote> Lost<R> {
    /// The `seq`th request the writer puts on the wire, through `file`.
    fn new(seq: u64, file: &Arc<OpenFile<R>>, what: Resend) -> Self {
        Lost {
            seq,
            file: file.clone(),
            what,
            losses: 0,
            on_lane: false,
        }
    }

    /// Whether it is sent again after failing with `e`. Doing it twice leaves the file as
    /// doing it once, as long as nothing of the file sent later lands in between, which
    /// [`catch_up`] sees to; except data through an `O_APPEND` handle, where the server
    /// appends whatever the offset (the bytes would be there twice): that loss is reported.
    /// (An attribute change through such a handle is sent again: setting them twice is
    /// setting them once.)
    fn may_send_again(&self, e: &RemoteError) -> bool {
        let appends = self.file.flags.append && matches!(self.what, Resend::Chunk { .. });
        matches!(e, RemoteError::Disconnected(_) | RemoteError::StaleHandle)
            && !appends
            && self.losses < MAX_LOSSES
    }

    /// It failed for good: the descriptor's writes, its close and fsync will be told.
    fn failed(&self, fs: &Weak<Fs<R>>, e: RemoteError) {
        match &self.what {
            Resend::Chunk { at, data } => {
                tracing::debug!(ino = self.file.ino, "write failed: {e}");
                self.file.latch_write(e, at + data.len() as u64);
            }
            Resend::Attrs(_) => {
                tracing::debug!(ino = self.file.ino, "setattr behind writes failed: {e}");
                setattrs_failed(fs, &self.file);
                self.file.latch(e);
            }
        }
    }

    /// Its share of the write window.
    fn weight(&self) -> u32 {
        match &self.what {
            Resend::Chunk { data, .. } => data.len() as u32,
            Resend::Attrs(_) => 1,
        }
    }

    /// Put it on the wire through handle `h` of its descriptor.
    async fn send_on(
        &self,
        remote: &Arc<R>,
        h: R::Handle,
    ) -> Result<crate::remote::WriteAck, RemoteError> {
        match &self.what {
            Resend::Chunk { at, data } => remote.write_queued(&h, *at, data.clone()).await,
            Resend::Attrs(attrs) => remote.fsetstat_queued(&h, *attrs).await,
        }
    }
}

/// Wait until every write of the stream on the wire has been answered; then send again what a
/// lost connection took with it ([`Lost`]), in the order first sent, before anything else of
/// the file goes to the new connection (a later write of the same bytes must land after it),
/// and wait for those answers too. When the descriptor changes from one to the next, the
/// earlier ones are answered first, as in the writer loop (descriptors may be on different
/// channels). `held`: bytes of the window the caller holds (for what it sends next).
///
/// The connection may be lost again while they are sent. Only the first send after a wait
/// for every answer may reopen the handle; once something is on the wire, a send that finds
/// the handle stale or reopened, or anything lost again, means that what is on the wire may
/// be lost too and not known yet: the rest goes back, and it starts over from the earliest
/// once every answer is in. (Each is sent again at most [`MAX_LOSSES`] times.)
///
/// Without a connection (its reopen fails) they fail, and their writes, close and fsync are
/// told; unless `patient` (nobody waits: the writer was only nudged when the loss came back):
/// then they stay, for the next write, read or close of the file.
async fn catch_up<R: Remote>(
    stream: &Arc<WriteStream<R>>,
    fs: &Weak<Fs<R>>,
    remote: &Arc<R>,
    held: u32,
    patient: bool,
) {
    stream.catching_up.fetch_add(1, Ordering::AcqRel);
    let _done = CatchingUp(&stream.catching_up);
    loop {
        stream.wait_all_answered(held).await;
        let mut lost = std::mem::take(&mut *stream.lost.lock().unwrap());
        if lost.is_empty() {
            return;
        }
        lost.sort_by_key(|l| l.seq);
        let ino = lost[0].file.ino;
        tracing::info!(
            ino,
            "sending again {} write(s) a lost connection took on the wire",
            lost.len()
        );
        // The descriptor and handle version of what was sent since the last wait.
        let mut on_wire: Option<(Arc<OpenFile<R>>, u64)> = None;
        let mut first_of_pass = true;
        let mut rest = lost.into_iter();
        while let Some(mut l) = rest.next() {
            if on_wire
                .as_ref()
                .is_some_and(|(f, _)| !Arc::ptr_eq(f, &l.file))
            {
                stream.wait_all_answered(held).await;
                on_wire = None;
            }
            let Ok(permit) = stream.window.clone().acquire_many_owned(l.weight()).await else {
                return;
            };
            let sent = match &on_wire {
                // Lost again while the answers before a switch of descriptor came in: that one
                // goes first.
                None if !first_of_pass && stream.has_lost() => Resent::StartOver,
                None => match queue_on_handle(fs, &l.file, |h| l.send_on(remote, h)).await {
                    Ok((ack, version)) => Resent::Sent(ack, version),
                    Err(RemoteError::StaleHandle | RemoteError::Disconnected(_)) if patient => {
                        Resent::NoConnection
                    }
                    Err(e) => Resent::Failed(e),
                },
                Some((_, version)) => match l.file.versioned_handle().await {
                    Err(e) => Resent::Failed(e),
                    Ok((_, v)) if v != *version || stream.has_lost() => Resent::StartOver,
                    Ok((h, v)) => match l.send_on(remote, h).await {
                        Ok(ack) => Resent::Sent(ack, v),
                        Err(RemoteError::StaleHandle | RemoteError::Disconnected(_)) => {
                            Resent::StartOver
                        }
                        Err(e) => Resent::Failed(e),
                    },
                },
            };
            first_of_pass = false;
            match sent {
                Resent::Sent(ack, version) => {
                    l.losses += 1;
                    if let Some(fs) = fs.upgrade() {
                        fs.stats.writes_sent_again.fetch_add(1, Ordering::Relaxed);
                    }
                    on_wire = Some((l.file.clone(), version));
                    stream.answer_later(fs, ack, permit, l);
                }
                Resent::StartOver | Resent::NoConnection => {
                    let mut back = stream.lost.lock().unwrap();
                    back.push(l);
                    back.extend(rest);
                    if matches!(sent, Resent::NoConnection) {
                        return;
                    }
                    break;
                }
                Resent::Failed(e) => l.failed(fs, e),
            }
        }
        if let Some(fs) = fs.upgrade() {
            // Anything fetched meanwhile may predate them.
            fs.attrs_changed(ino, None);
        }
    }
}

/// What became of one write [`catch_up`] sends again.
enum Resent {
    /// On the wire, through the handle of this version.
    Sent(crate::remote::WriteAck, u64),
    /// The connection changed under the pass, or something was lost again: put the rest back
    /// and start over once every answer is in.
    StartOver,
    /// Patient, and there is no connection yet: put everything back for later.
    NoConnection,
    /// It failed for good.
    Failed(RemoteError),
}

/// How long a patient catch-up that found no connection waits before it looks again.
const LOST_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Counts a running [`catch_up`] out again, however it ends.
struct CatchingUp<'a>(&'a AtomicUsize);

impl Drop for CatchingUp<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The extra handles of a descriptor (see "Striping" in the module doc).
enum Lanes<H> {
    /// Not opened (yet, or again after a lost connection).
    Untried,
    Open(Vec<H>),
    /// Opening them failed, or the descriptor is closed: never striped.
    Refused,
}

/// A descriptor's handle (or why it has none) and how many times it was reopened.
type HandleSlot<R> = Arc<RwLock<(Result<<R as Remote>::Handle, RemoteError>, u64)>>;

/// The handle of a descriptor whose create was answered before its OPEN (see
/// [`OpenFile::pending`]): held until the outcome is known, then given it.
pub struct PendingHandle<R: Remote>(OwnedRwLockWriteGuard<(Result<R::Handle, RemoteError>, u64)>);

impl<R: Remote> PendingHandle<R> {
    /// The OPEN was answered: whatever waits for the handle gets `outcome`. A failure must
    /// not be a connection error (which would have the name opened again: see
    /// `OpenFile::handle`).
    pub fn opened(mut self, outcome: Result<R::Handle, RemoteError>) {
        debug_assert!(outcome
            .as_ref()
            .err()
            .is_none_or(|e| !e.is_connection_error()));
        self.0 .0 = outcome;
    }
}

pub struct OpenFile<R: Remote> {
    pub ino: Ino,
    pub flags: OpenFlags,
    /// The current remote handle and how many times it was reopened; replaced when the file
    /// is reopened after a reconnect. Write-locked while the OPEN of a create answered early
    /// is on its way (see `Fs::create_early`), so whatever needs the handle waits for it; an
    /// error if that OPEN failed: the descriptor never has a handle, and must never get one
    /// by reopening the name, which may be another's file.
    handle: HandleSlot<R>,
    /// Serializes reopens: two requests that both found the handle stale must not both open
    /// a new one (the second would leak a server handle).
    reopening: tokio::sync::Mutex<()>,
    pub stream: Arc<WriteStream<R>>,
    /// Write failures through this descriptor, and who has been told of them.
    failures: Mutex<Failures>,
    /// How many of the file's failures (through any descriptor) this one's fsync has been
    /// told of (see [`OpenFile::tell_file_failure`]).
    file_failures_told: AtomicU64,
    /// Highest byte offset written through this handle (for the size the kernel is shown
    /// while writes are still in flight).
    pub written_end: AtomicU64,
    /// The thread that opened the descriptor (the kernel's request pid; 0 if not known). A
    /// close by another one may be a child closing the copy it inherited (see `Fs::flush_from`).
    pub opener: u32,
    /// Extra handles on other channels for striped writes; used by the writer task, closed
    /// at release.
    lanes: Mutex<Lanes<R::Handle>>,
    /// Writes sent through the lanes and not answered yet.
    lane_writes: AtomicUsize,
    /// The file's attributes while this descriptor created it and may change its mode and
    /// times behind the writes (see the module doc); None otherwise.
    created: Mutex<Option<Attrs>>,
    /// The last mtime `created` held: the server's (or one set behind the writes), kept
    /// when a write makes the new one unknown (see [`OpenFile::attrs_while_writing`]).
    created_mtime: Mutex<Option<u32>>,
    /// A mode change was queued behind this descriptor's writes: until the queue is empty,
    /// whether the server took it is not known here, and `stat` asks the server (see
    /// [`OpenFile::attrs_while_writing`]).
    mode_changed_behind: AtomicBool,
    /// Something was written through this descriptor (see [`OpenFile::landed`]).
    written: AtomicBool,
    /// Times were queued behind this descriptor's writes: the mtime `created_mtime` keeps
    /// may be one set, which a later write moves to the server's clock.
    times_set_behind: AtomicBool,
    /// See [`OpenFile::setattrs_submitted`].
    setattrs_submitted: AtomicU64,
    /// The change clock when a close of this descriptor learnt the attributes its writes
    /// left (asked right behind them, see `Fs::attrs_behind_writes`); 0 if none did. Its
    /// release keeps them unless the file changed through the mount after that.
    pub attrs_settled_at: AtomicU64,
}

impl<R: Remote> OpenFile<R> {
    pub fn new(
        ino: Ino,
        flags: OpenFlags,
        handle: R::Handle,
        stream: Arc<WriteStream<R>>,
        opener: u32,
    ) -> Self {
        let slot = Arc::new(RwLock::new((Ok(handle), 0)));
        Self::with_slot(ino, flags, slot, stream, opener)
    }

    fn with_slot(
        ino: Ino,
        flags: OpenFlags,
        handle: HandleSlot<R>,
        stream: Arc<WriteStream<R>>,
        opener: u32,
    ) -> Self {
        let file_failures_told = AtomicU64::new(stream.failures_sample());
        OpenFile {
            ino,
            flags,
            handle,
            reopening: tokio::sync::Mutex::new(()),
            stream,
            failures: Mutex::new(Failures::default()),
            file_failures_told,
            written_end: AtomicU64::new(0),
            opener,
            lanes: Mutex::new(Lanes::Untried),
            lane_writes: AtomicUsize::new(0),
            created: Mutex::new(None),
            created_mtime: Mutex::new(None),
            mode_changed_behind: AtomicBool::new(false),
            written: AtomicBool::new(false),
            times_set_behind: AtomicBool::new(false),
            setattrs_submitted: AtomicU64::new(0),
            attrs_settled_at: AtomicU64::new(0),
        }
    }

    /// This descriptor created its file, which had `attrs` then.
    pub fn set_created(&self, attrs: Attrs) {
        self.update_created(Some(attrs));
    }

    /// The attributes the file has once everything queued lands, if this descriptor created
    /// it and nothing but writes and changes behind them happened since.
    pub fn created_attrs(&self) -> Option<Attrs> {
        *self.created.lock().unwrap()
    }

    /// The OPEN of a create answered early made the file, which had `attrs` then: what
    /// this descriptor knows of it gets the times, which were left to the server.
    /// Owner, group and mode are the server's too (what the mount expected, unless the server
    /// differs), but for a mode change queued behind since, which comes after.
    pub fn landed(&self, attrs: &Attrs) {
        let mut created = self.created.lock().unwrap();
        if let Some(known) = created.as_mut() {
            known.atime = known.atime.or(attrs.atime);
            // A write made meanwhile (queued behind the OPEN) moves the mtime again: it is
            // the server's to say once the writes are in.
            if !self.written.load(Ordering::Acquire) {
                known.mtime = known.mtime.or(attrs.mtime);
            }
            known.uid = attrs.uid.or(known.uid);
            known.gid = attrs.gid.or(known.gid);
            if !self.mode_changed_behind.load(Ordering::Acquire) {
                known.mode = attrs.mode.or(known.mode);
            }
            let mut last = self.created_mtime.lock().unwrap();
            *last = last.or(attrs.mtime);
        }
    }

    /// Why this descriptor has no handle and never will (its create, answered early, was
    /// refused); None while the OPEN is on its way, and for every other descriptor.
    pub fn never_opened(&self) -> Option<RemoteError> {
        let slot = self.handle.try_read().ok()?;
        slot.0.as_ref().err().cloned()
    }

    /// Keep the attributes known after a change written behind; None: no longer known.
    pub fn update_created(&self, attrs: Option<Attrs>) {
        let mut created = self.created.lock().unwrap();
        if let Some(m) = attrs.and_then(|a| a.mtime) {
            *self.created_mtime.lock().unwrap() = Some(m);
        }
        *created = attrs;
    }

    /// What `stat` shows of a file this descriptor created while its writes are on their
    /// way, without asking the server: it holds exactly what was written through it (it
    /// was made empty, and anything else that changed it since would have made
    /// `created_attrs` unknown), so the size is where its writes end. The mtime is the
    /// last one the server gave (or that was set behind the writes): the server moves it
    /// as each write lands, on its clock, and the mount shows what it says once the writes
    /// are in. None: not known here, ask the server.
    ///
    /// Times and a same-owner `chown` queued behind the writes are shown as asked, like the
    /// writes (the caller was told they were done; a refusal is reported at the next flush,
    /// and `stat` asks the server from then on): the kernel asks for the attributes before
    /// every `chown` (to clear set-id bits), and `tar` and `cp -p` set the times just
    /// before it, so waiting here cost them a round trip per file. A mode change still on
    /// its way is the server's to show when the kernel asks (a tool's own `stat` right after
    /// its `chmod` is answered by the kernel from what the `chmod` was answered with; if the
    /// server refuses it, the kernel is told to drop that: see `setattrs_failed`).
    pub fn attrs_while_writing(&self) -> Option<Attrs> {
        let mut attrs = self.created_attrs()?;
        let pending = self.writes_pending();
        if self.pending_failure().is_some()
            || (pending && self.mode_changed_behind.load(Ordering::Acquire))
        {
            return None;
        }
        if attrs.mtime.is_none() {
            if !pending {
                return None;
            }
            attrs.mtime = (*self.created_mtime.lock().unwrap())?.into();
        }
        let end = self.written_end.load(Ordering::Relaxed);
        attrs.size = Some(attrs.size.unwrap_or(0).max(end));
        Some(attrs)
    }

    /// Run `f` if this descriptor still knows its file's attributes (see `created_attrs`),
    /// holding them: a failure behind the writes cannot forget them meanwhile. Whether it ran.
    pub fn while_created(&self, f: impl FnOnce()) -> bool {
        let created = self.created.lock().unwrap();
        if created.is_some() {
            f();
        }
        created.is_some()
    }

    /// How many attribute changes were queued behind this descriptor's writes so far (see
    /// `Fs::release`, which must not close the handle before the last of them is answered).
    pub fn setattrs_submitted(&self) -> u64 {
        self.setattrs_submitted.load(Ordering::Acquire)
    }

    /// Queue an attribute change behind this file's writes. False if the file's write queue
    /// is closed. The caller holds the `files` lock, under which `Fs::release` looks whether
    /// one came while it waited (see [`OpenFile::setattrs_submitted`]). It is not waited
    /// for: everything that must come after it (writes, flush, fsync, a stat that drains, a
    /// change sent directly) goes through the same queue or drains it first, and its failure
    /// is latched like a write's.
    pub(crate) fn submit_setattrs(self: &Arc<Self>, fs: &Arc<Fs<R>>, attrs: SetAttrs) -> bool {
        self.setattrs_submitted.fetch_add(1, Ordering::AcqRel);
        if attrs.perm.is_some() {
            self.mode_changed_behind.store(true, Ordering::Release);
        }
        if attrs.atime_mtime.is_some() {
            self.times_set_behind.store(true, Ordering::Release);
        }
        let job = WriteJob::SetAttrs {
            file: self.clone(),
            attrs,
        };
        self.stream.submit(fs, job)
    }

    /// Whether a mode or times were ever queued behind this descriptor's writes (while
    /// writes are pending, they may still be on their way).
    pub fn changes_queued_behind(&self) -> bool {
        self.mode_changed_behind.load(Ordering::Acquire)
            || self.times_set_behind.load(Ordering::Acquire)
    }

    /// Whether this descriptor's writes may be striped over lanes.
    fn may_stripe(&self) -> bool {
        self.flags.write
            && !self.flags.append
            && !matches!(*self.lanes.lock().unwrap(), Lanes::Refused)
    }

    /// Its lanes, if they are open (none are opened here).
    fn open_lanes(&self) -> Option<Vec<R::Handle>> {
        match &*self.lanes.lock().unwrap() {
            Lanes::Open(v) => Some(v.clone()),
            _ => None,
        }
    }

    /// The descriptor is being closed: its lanes, to close, and never any again.
    pub fn take_lanes(&self) -> Vec<R::Handle> {
        match std::mem::replace(&mut *self.lanes.lock().unwrap(), Lanes::Refused) {
            Lanes::Open(v) => v,
            _ => Vec::new(),
        }
    }

    pub async fn handle(&self) -> Result<R::Handle, RemoteError> {
        self.handle.read().await.0.clone()
    }

    /// The handle with its reopen count, for [`OpenFile::reopen_with`].
    pub async fn versioned_handle(&self) -> Result<(R::Handle, u64), RemoteError> {
        let slot = self.handle.read().await;
        Ok((slot.0.clone()?, slot.1))
    }

    /// How many times the handle was reopened.
    pub async fn handle_version(&self) -> u64 {
        self.handle.read().await.1
    }

    /// A descriptor whose handle is not known yet: the OPEN of its create is on its way.
    /// Whatever asks for the handle waits until the guard returned is given the outcome
    /// ([`PendingHandle::opened`]).
    pub fn pending(
        ino: Ino,
        flags: OpenFlags,
        stream: Arc<WriteStream<R>>,
        opener: u32,
    ) -> (Self, PendingHandle<R>) {
        // Seen only if the guard is dropped without an outcome (a task cut short): a failure
        // of the create, never a connection error, which would have the name reopened.
        let abandoned = RemoteError::Status(
            crate::remote::Status::Failure,
            "the create of this file was abandoned".into(),
        );
        let slot = Arc::new(RwLock::new((Err(abandoned), 0)));
        let guard = slot.clone().try_write_owned().expect("a new lock is free");
        let file = Self::with_slot(ino, flags, slot, stream, opener);
        (file, PendingHandle(guard))
    }

    /// Replace a handle found stale at version `seen` by what `open` returns, unless another
    /// request already did: then its handle is returned and `open` is not called. The handle
    /// with its version.
    pub async fn reopen_with<F, Fut, E>(&self, seen: u64, open: F) -> Result<(R::Handle, u64), E>
    where
        E: From<RemoteError>,
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<R::Handle, E>>,
    {
        let _one_at_a_time = self.reopening.lock().await;
        {
            let current = self.handle.read().await;
            if current.1 != seen || current.0.is_err() {
                // Reopened by another request; or never opened (a create that failed), and
                // its name is not this descriptor's to open.
                let (handle, version) = (current.0.clone(), current.1);
                return handle.map(|h| (h, version)).map_err(E::from);
            }
        }
        let new = open().await?;
        let mut slot = self.handle.write().await;
        *slot = (Ok(new.clone()), seen + 1);
        Ok((new, seen + 1))
    }

    /// Latch a failure whose write end is not known (0: never taken for EFBIG).
    pub fn latch(&self, err: RemoteError) {
        self.latch_write(err, 0);
    }

    /// Latch the failure of a write that would have ended at byte `end`.
    pub fn latch_write(&self, err: RemoteError, end: u64) {
        self.stream.latch(err.clone(), end);
        let mut f = self.failures.lock().unwrap();
        f.seq += 1;
        f.last = Some((err, end));
        drop(f);
        // What the file holds is no longer what was written through it.
        self.update_created(None);
    }

    /// Whether `who` has a failure to be told of.
    pub fn failure_untold(&self, who: Told) -> bool {
        self.failures.lock().unwrap().untold(who)
    }

    /// A failure somebody has not been told of yet (nothing may be queued behind the writes
    /// then: it would be lost with them).
    pub fn pending_failure(&self) -> Option<RemoteError> {
        let f = self.failures.lock().unwrap();
        f.last.as_ref().map(|(e, _)| e.clone())
    }

    /// The failure `report` has not been told of yet, if any, with the end of its write; from
    /// now on, everyone in `told` has been told of every failure so far (an empty `told` only
    /// looks). A failure everyone has been told of is forgotten.
    pub fn tell(&self, report: Told, told: &[Told]) -> Option<(RemoteError, u64)> {
        let mut f = self.failures.lock().unwrap();
        let found = if f.untold(report) {
            f.last.clone()
        } else {
            None
        };
        let seq = f.seq;
        for &who in told {
            f.told[who as usize] = seq;
        }
        if f.told.iter().all(|&t| t == seq) {
            f.last = None;
        }
        found
    }

    /// The latest write failure of the file through *another* descriptor (or this one) that
    /// this descriptor's fsync has not been told of: fsync is of the file, and the kernel's
    /// errseq tells every open file of a write-back error once, whoever's write it was (an
    /// `msync` of a mapping whose pages went out through another descriptor's handle, `sync
    /// FILE` after the writer closed without looking at close's answer). From now on this
    /// descriptor has been told of all of them.
    pub fn tell_file_failure(&self) -> Option<(RemoteError, u64)> {
        let mut f = self.stream.failures.lock().unwrap();
        let told = self.file_failures_told.swap(f.seq, Ordering::AcqRel);
        if told >= f.seq {
            return None;
        }
        f.seen = true;
        f.last.clone()
    }

    /// A close reported the file's latest failure: a descriptor opened from now on does not
    /// report it again.
    pub fn file_failure_seen(&self) {
        self.stream.failures.lock().unwrap().seen = true;
    }

    /// Whether writes of this file (through any descriptor) are queued or in flight.
    pub fn writes_pending(&self) -> bool {
        self.stream.pending()
    }

    /// Whether every write of the file so far is on the wire through this descriptor's own
    /// handle: none waits in the writer task (a job leaves `queued` only once all its chunks
    /// were handed to the channel), none is on its way through a lane, none was lost with a
    /// connection. A request sent through the same handle now is then carried out after
    /// them: one handle lives on one SFTP channel, whose sftp-server process serves requests
    /// in the order they arrive, and the channel sends in the order requests are queued. A
    /// read or fstat need not wait for their answers to see them. The caller makes sure no
    /// other descriptor of the file has writes on the way (it may be on another channel).
    pub fn writes_ahead_on_own_handle(&self) -> bool {
        // In this order: the writer counts a lane write before the job leaves `queued`, and
        // an answer puts a lost lane write in `lost` before counting it out.
        self.stream.queued.load(Ordering::Acquire) == 0
            && self.lane_writes.load(Ordering::Acquire) == 0
            && !self.stream.has_lost_writes()
    }

    /// Queue a write through this descriptor. Returns `None` if the descriptor is being closed;
    /// otherwise where its answer will come, or `Some(None)` if it may be answered now: it
    /// fits in the queue ([`EARLY_ANSWER_BYTES`]) and no failure waits to be reported here.
    pub(crate) fn submit_write(
        self: &Arc<Self>,
        fs: &Arc<Fs<R>>,
        offset: u64,
        data: Bytes,
    ) -> Option<Option<oneshot::Receiver<WriteAnswer>>> {
        let mut created = self.created.lock().unwrap();
        // Under the same lock as `landed`, which must not take the OPEN's mtime after this.
        self.written.store(true, Ordering::Release);
        if let Some(a) = created.as_mut() {
            // The server sets the mtime as the write lands: no longer known here. One set
            // behind the writes is not even a lower bound of it (it may be years back): the
            // server is asked until the writes are in.
            if a.mtime.take().is_some() && self.times_set_behind.load(Ordering::Acquire) {
                *self.created_mtime.lock().unwrap() = None;
            }
        }
        drop(created);
        let end = offset + data.len() as u64;
        let early = match self.failure_untold(Told::Writes) {
            false => u32::try_from(data.len())
                .ok()
                .and_then(|n| self.stream.early.clone().try_acquire_many_owned(n).ok()),
            true => None,
        };
        let (done, answer) = match early {
            Some(_) => (None, None),
            None => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
        };
        let job = WriteJob::Data {
            file: self.clone(),
            offset,
            data,
            done,
            early,
        };
        if !self.stream.submit(fs, job) {
            return None;
        }
        // Counted here, in the kernel's order (a truncate after it lowers it again), so that
        // sizes shown while the write is queued include it.
        self.written_end.fetch_max(end, Ordering::Relaxed);
        Some(answer)
    }

    /// Wait until every write of the file queued so far (through any descriptor) has been
    /// answered: their failures are latched by then, for whoever [`OpenFile::tell`]s them.
    pub async fn settle(&self) {
        // Nothing queued, in flight or lost: every answer is in and its failure latched
        // (a job stays counted in `queued` until its chunks hold window permits, and an
        // answer latches its failure, or keeps the write to send again, before it lets go of
        // its permit). Then there is nothing to wait for, and no reason to send a barrier to
        // the writer task: that hand-off to the network thread and back was most of the cost
        // of a close, and of the close of every descriptor `mmap` duplicates.
        if !self.stream.pending() {
            return;
        }
        let (done, rx) = oneshot::channel();
        if self.stream.barrier_if_running(done) {
            let _ = rx.await;
        }
    }

    /// Wait until the file's writer task has put every write queued so far on the wire (a
    /// write answered early may still wait in its queue): from then on a request through the
    /// handle they went through is carried out after them (see
    /// [`OpenFile::writes_ahead_on_own_handle`]). Much sooner than their answers.
    pub async fn all_sent(self: &Arc<Self>, fs: &Arc<Fs<R>>) {
        if self.stream.queued.load(Ordering::Acquire) == 0 {
            return;
        }
        let (done, rx) = oneshot::channel();
        if self.stream.submit(fs, WriteJob::Sent { done }) {
            let _ = rx.await;
        }
    }
}

/// Who is told of a descriptor's write failures. Each is told of a failure once, as each open
/// file keeps its own cursor in the kernel's errseq: a close that reports it does not use it
/// up for fsync, and a child's close of its inherited copy does not use it up for the program
/// that opened the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Told {
    /// The descriptor's later writes, which are not sent while this is untold (they would be
    /// lost behind the failure). A write that waits for its answer reports it; so does a close
    /// by any thread.
    Writes = 0,
    /// The close(2) of the thread that opened the descriptor.
    Opener = 1,
    /// fsync(2).
    Fsync = 2,
}

/// A descriptor's write failures and who has been told of them.
#[derive(Debug, Default)]
struct Failures {
    /// The latest failure, while somebody has not been told of it, and where its write would
    /// have ended (whether that is past the largest file the server can hold decides EFBIG or
    /// EIO). The latest, as errseq keeps: one told of several failures at once hears of the
    /// latest.
    last: Option<(RemoteError, u64)>,
    /// Failures so far.
    seq: u64,
    /// The `seq` each of [`Told`] was last told of, by its number.
    told: [u64; 3],
}

impl Failures {
    fn untold(&self, who: Told) -> bool {
        self.told[who as usize] < self.seq
    }
}

/// Put one request on the wire through `file`'s handle (`queue` sends it on the handle it is
/// given), reopening a handle that belongs to a lost connection first; with the version of
/// the handle it went through. Only a request that was never sent is retried here: one that
/// was in flight when the connection dropped comes back from its answer as lost, for
/// [`catch_up`] to send again in order. `StaleHandle`: there is no connection (yet); another
/// error from the reopen (the file has no name any more, the server refuses to open it) is
/// the request's own failure, which waiting for a connection would not change.
async fn queue_on_handle<R, F, Fut>(
    fs: &Weak<Fs<R>>,
    file: &Arc<OpenFile<R>>,
    queue: F,
) -> Result<(crate::remote::WriteAck, u64), RemoteError>
where
    R: Remote,
    F: Fn(R::Handle) -> Fut,
    Fut: std::future::Future<Output = Result<crate::remote::WriteAck, RemoteError>>,
{
    let (handle, version) = file.versioned_handle().await?;
    match queue(handle).await {
        Err(RemoteError::StaleHandle | RemoteError::Disconnected(_)) => {
            let Some(fs) = fs.upgrade() else {
                return Err(RemoteError::StaleHandle);
            };
            match fs.reopen(file, version).await {
                Ok((h, v)) => queue(h).await.map(|ack| (ack, v)),
                Err(e) if e.is_connection_error() => Err(RemoteError::StaleHandle),
                Err(e) => Err(e),
            }
        }
        r => r.map(|ack| (ack, version)),
    }
}

/// Put `req` on the wire through its descriptor's own handle, in order with what a lost
/// connection took. `seen` is the handle version the descriptor's previous write went
/// through: if the handle was reopened since (by a read, say), or cannot be used (the
/// connection is lost), that write may have gone with the old connection, and it must land
/// before this one: [`catch_up`] first, then send through the (reopened) handle. The caller
/// holds `req`'s share of the window.
async fn send_in_order<R: Remote>(
    stream: &Arc<WriteStream<R>>,
    fs: &Weak<Fs<R>>,
    remote: &Arc<R>,
    seen: &mut u64,
    req: &Lost<R>,
) -> Result<crate::remote::WriteAck, RemoteError> {
    let (handle, version) = req.file.versioned_handle().await?;
    if version == *seen && !stream.has_lost() {
        match req.send_on(remote, handle).await {
            Err(RemoteError::StaleHandle | RemoteError::Disconnected(_)) => {}
            r => return r,
        }
    }
    catch_up(stream, fs, remote, req.weight(), false).await;
    match queue_on_handle(fs, &req.file, |h| req.send_on(remote, h)).await {
        Ok((ack, version)) => {
            *seen = version;
            Ok(ack)
        }
        Err(e) => {
            *seen = req.file.handle_version().await;
            Err(e)
        }
    }
}

/// The check every write passes before it is sent. After a failure the writes are not told of
/// yet, nothing is sent: it would land behind the loss. A write still waiting for its answer
/// (`done`) is refused with the failure (and later ones go again); one answered already is
/// reported by the close or fsync that follows, which have not been told either. A refused
/// write leaves the queue here. `Ok`: it may go, with its `done` back.
fn pass_failure_check<R: Remote>(
    stream: &WriteStream<R>,
    file: &OpenFile<R>,
    done: Option<oneshot::Sender<WriteAnswer>>,
) -> Result<Option<oneshot::Sender<WriteAnswer>>, ()> {
    let told: &[Told] = match done {
        Some(_) => &[Told::Writes],
        None => &[],
    };
    match file.tell(Told::Writes, told) {
        None => Ok(done),
        Some(failure) => {
            stream.queued.fetch_sub(1, Ordering::AcqRel);
            if let Some(done) = done {
                let _ = done.send(Err(failure));
            }
            Err(())
        }
    }
}

/// Writes of one descriptor, each continuing the one before, taken from the queue together to
/// go out as one WRITE of at most `max_write` bytes. Why: one SFTP channel keeps at most
/// `MAX_REQUESTS_IN_FLIGHT` requests outstanding, so at 20 ms a program writing 512 bytes at
/// a time (`dd bs=512`, a log flushed line by line) was held to that many writes per round
/// trip (64 then: 1.6 MB/s), where sshfs, which bounds nothing, was five to seven times
/// faster. Only writes already queued are merged (they were answered early, or wait for the
/// writer anyway), so a lone write is never held back to wait for company.
struct Merged {
    end: u64,
    data: Bytes,
    /// Where each merged write that waits is answered, with its length.
    answers: Vec<(oneshot::Sender<WriteAnswer>, u32)>,
    earlies: Vec<OwnedSemaphorePermit>,
    /// Queue jobs merged (each counted in `WriteStream::queued` until sent).
    jobs: u64,
}

impl Merged {
    fn new(
        offset: u64,
        data: Bytes,
        done: Option<oneshot::Sender<WriteAnswer>>,
        early: Option<OwnedSemaphorePermit>,
    ) -> Self {
        let len = data.len() as u32;
        Merged {
            end: offset + data.len() as u64,
            data,
            answers: done.map(|d| (d, len)).into_iter().collect(),
            earlies: early.into_iter().collect(),
            jobs: 1,
        }
    }

    /// Take the queued writes of `file` that continue this one, while the whole fits in one
    /// WRITE. The first job that cannot join is left in `carried`. Each passes
    /// [`pass_failure_check`] as the writer loop's first did; one refused ends the merge.
    fn absorb<R: Remote>(
        &mut self,
        stream: &WriteStream<R>,
        rx: &mut mpsc::UnboundedReceiver<WriteJob<R>>,
        carried: &mut Option<WriteJob<R>>,
        file: &Arc<OpenFile<R>>,
        max_write: usize,
    ) {
        // The writes merged after the first, copied into one buffer of their exact size at
        // the end (the merged WRITE is kept until its answer: no spare capacity).
        let mut parts: Vec<Bytes> = Vec::new();
        let mut total = self.data.len();
        while total < max_write {
            let Ok(job) = rx.try_recv() else { break };
            let (data, done, early) = match job {
                WriteJob::Data {
                    file: f,
                    offset,
                    data,
                    done,
                    early,
                } if Arc::ptr_eq(&f, file)
                    && offset == self.end
                    && total + data.len() <= max_write =>
                {
                    (data, done, early)
                }
                other => {
                    *carried = Some(other);
                    break;
                }
            };
            let Ok(done) = pass_failure_check(stream, file, done) else {
                break;
            };
            total += data.len();
            self.end += data.len() as u64;
            if let Some(done) = done {
                self.answers.push((done, data.len() as u32));
            }
            self.earlies.extend(early);
            self.jobs += 1;
            parts.push(data);
        }
        if !parts.is_empty() {
            let mut b = bytes::BytesMut::with_capacity(total);
            b.extend_from_slice(&self.data);
            for part in parts {
                b.extend_from_slice(&part);
            }
            self.data = b.freeze();
        }
    }
}

/// `earlier` and `later`, two attribute changes of one descriptor queued one after the other,
/// as one change, if the server gives the file the same attributes from it as from the two in
/// turn. Why: `tar` run by root sets the times, the owner and the mode of every file it
/// extracts (`futimens`, `fchown`, `fchmod`), each queued behind the file's writes (see
/// `Fs::setattr_behind`), and were three FSETSTATs: requests the server, sshd and this
/// process each handle. Only changes queued while the writer is busy with earlier ones are
/// merged (none is held back to wait for company).
///
/// OpenSSH's sftp-server applies one request's fields in a fixed order: size, mode, times,
/// owner, each whether the one before failed or not. Merged, the later request's fields win.
/// Of these, only a size (it moves the mtime and clears set-id bits) and an owner change next
/// to set-id bits (a chown clears them, so it matters whether it comes before or after the
/// chmod) depend on the order; neither is merged. Nor would a chown that gives the file to
/// someone else be (a chmod or utimes after it may then be refused, where before it was not):
/// `setattr_behind` queues only chowns to the owner and group the file has, of files with no
/// set-id bit, so that never reaches the queue.
pub(crate) fn merge_setattrs(earlier: &SetAttrs, later: &SetAttrs) -> Option<SetAttrs> {
    if earlier.size.is_some() || later.size.is_some() {
        return None;
    }
    let both = SetAttrs {
        size: None,
        uid_gid: later.uid_gid.or(earlier.uid_gid),
        perm: later.perm.or(earlier.perm),
        atime_mtime: later.atime_mtime.or(earlier.atime_mtime),
    };
    let set_id = both.perm.is_some_and(|p| p & 0o6000 != 0);
    (both.uid_gid.is_none() || !set_id).then_some(both)
}

/// Where each byte a descriptor writes goes while its lanes are in use: the file is cut into
/// units of `unit` bytes, dealt in turn to the descriptor's own handle and to each lane. A
/// byte always goes through the same handle, so two writes over the same bytes go through one
/// channel to one server process, which does them in the order sent, whatever is in flight on
/// the other handles (see "Striping" in the module doc).
struct Placement<H> {
    lanes: Vec<H>,
    unit: u64,
}

impl<H: Clone> Placement<H> {
    /// The handle for the bytes from `at` (`None`: the descriptor's own) and how many of them
    /// go through it: up to the end of their unit.
    fn place(&self, at: u64) -> (Option<H>, u64) {
        let unit = at / self.unit;
        let turn = (unit % (self.lanes.len() as u64 + 1)) as usize;
        let room = (unit + 1) * self.unit - at;
        (turn.checked_sub(1).map(|i| self.lanes[i].clone()), room)
    }
}

/// What the writer has in flight that a request through another handle could overtake.
#[derive(Default)]
struct Unsettled {
    /// Writes on lanes: an attribute change (through the descriptor's own handle) waits
    /// for them, so that no write lands after it and moves the mtime it set.
    on_lanes: bool,
    /// An attribute change through the descriptor's own handle: a write on a lane waits for
    /// it, for the same reason.
    attrs_on_own: bool,
}

/// The lanes of `file`, opened now if they never were (empty: do not stripe, for now or for
/// good). Failures are not errors of the file: it is just written through one handle.
async fn lanes_for<R: Remote>(
    fs: &Weak<Fs<R>>,
    remote: &Arc<R>,
    file: &Arc<OpenFile<R>>,
) -> Vec<R::Handle> {
    match &*file.lanes.lock().unwrap() {
        Lanes::Open(v) => return v.clone(),
        Lanes::Refused => return Vec::new(),
        Lanes::Untried => {}
    }
    let Some(fs) = fs.upgrade() else {
        return Vec::new();
    };
    let refuse = || *file.lanes.lock().unwrap() = Lanes::Refused;
    let Ok(primary) = file.handle().await else {
        refuse();
        return Vec::new();
    };
    let flags = OpenFlags {
        read: false,
        write: true,
        ..file.flags.for_reopen()
    };
    // By name, kept only if no rename or unlink through the mount can have put another file
    // under it meanwhile (see `Fs::open_by_name`).
    let opened = fs
        .open_by_name(
            file.ino,
            |path| {
                let (remote, primary) = (remote.clone(), primary.clone());
                async move {
                    remote
                        .open_alongside(&path, flags, &primary, MAX_LANES - 1)
                        .await
                }
            },
            |lanes| close_in_background(remote, lanes),
        )
        .await;
    match opened {
        Ok((lanes, _)) => {
            let mut slot = file.lanes.lock().unwrap();
            if !matches!(*slot, Lanes::Untried) {
                // Closed meanwhile: not these.
                drop(slot);
                close_in_background(remote, lanes);
                return Vec::new();
            }
            if lanes.is_empty() {
                *slot = Lanes::Refused;
            } else {
                tracing::debug!(ino = file.ino, lanes = lanes.len(), "striping writes");
                *slot = Lanes::Open(lanes.clone());
            }
            lanes
        }
        // Tried again on a later run, once the connection is back.
        Err(e) if e.is_connection_error() => Vec::new(),
        Err(e) => {
            tracing::debug!(ino = file.ino, "no extra lanes: {e}");
            refuse();
            Vec::new()
        }
    }
}

/// `lanes` if they are the file `file`'s own handle is open on, else none (closed, and the
/// descriptor never stripes). Lanes are opened by name, maybe long after the descriptor was
/// (when its writes first need them); had something else been put under the name meanwhile,
/// on the server's side, writes through them would go to that other file. SFTP v3 has no inode
/// numbers: this compares what FSTAT says of each (size, owner, group, mode, mtime), asked
/// while none of the file's writes is in flight. A file written by someone else at the same
/// time may differ between the answers: then it is not striped, which costs only speed.
async fn same_file_or_refused<R: Remote>(
    remote: &Arc<R>,
    file: &OpenFile<R>,
    lanes: Vec<R::Handle>,
) -> Vec<R::Handle> {
    if lanes.is_empty() {
        return lanes;
    }
    let Ok(own) = file.handle().await else {
        close_in_background(remote, lanes);
        return Vec::new();
    };
    let (own, others) = tokio::join!(
        remote.fstat(&own),
        futures_util::future::join_all(lanes.iter().map(|h| remote.fstat(h)))
    );
    let mut answers = std::iter::once(own).chain(others);
    let key = |a: Attrs| (a.size, a.uid, a.gid, a.mode, a.mtime);
    let mut first = None;
    // `Some(true)`: not the same file; `Some(false)`: not known (a lost connection: new
    // lanes are tried on a later run).
    let refused = answers.find_map(|a| match a {
        Ok(a) if *first.get_or_insert(key(a)) == key(a) => None,
        Ok(_) => Some(true),
        Err(e) => Some(!e.is_connection_error()),
    });
    let Some(for_good) = refused else {
        return lanes;
    };
    tracing::debug!(
        ino = file.ino,
        for_good,
        "extra lanes not known to be the same file"
    );
    // (`lanes` are the slot's own, cloned.)
    let then = match for_good {
        true => Lanes::Refused,
        false => Lanes::Untried,
    };
    give_up_lanes(remote, file, then);
    Vec::new()
}

/// Close handles in the background, in order (best effort: nobody can see an error of CLOSE,
/// nothing is in flight on them, and a handle of a lost connection is gone with it). The first
/// CLOSE is sent before this returns, not by a task that runs later: a tool that closes a
/// file and opens the next at once (`echo >> log` in a loop) then finds the channel it used
/// with no handle of its own left, and its next OPEN goes there too (see the SFTP remote's
/// channel choice).
pub(crate) fn close_in_background<R: Remote>(remote: &Arc<R>, handles: Vec<R::Handle>) {
    if handles.is_empty() {
        return;
    }
    let remote = remote.clone();
    let closing = async move {
        for h in handles {
            if let Err(e) = remote.close(&h).await {
                tracing::debug!("close: {e}");
            }
        }
    };
    crate::handoff::run_here_then_on(&tokio::runtime::Handle::current(), closing);
}

/// If `file`'s lanes are open, close them (in the background) and leave `then` in their
/// place; in any other state (closed with the descriptor, say) nothing changes.
fn give_up_lanes<R: Remote>(remote: &Arc<R>, file: &OpenFile<R>, then: Lanes<R::Handle>) {
    let mut slot = file.lanes.lock().unwrap();
    if let Lanes::Open(v) = &mut *slot {
        let v = std::mem::take(v);
        *slot = then;
        drop(slot);
        close_in_background(remote, v);
    }
}

/// A lane of `file` could not send for a connection error: all of them belong to the lost
/// connection. They are dropped; a later run opens new ones.
fn drop_lanes<R: Remote>(remote: &Arc<R>, file: &OpenFile<R>) {
    give_up_lanes(remote, file, Lanes::Untried);
}

/// An attribute change behind the writes failed: the attributes it was answered with (cached,
/// kept on the descriptor for the next change behind, and the times kept as set) are not the
/// file's.
fn setattrs_failed<R: Remote>(fs: &Weak<Fs<R>>, file: &OpenFile<R>) {
    file.update_created(None);
    if let Some(fs) = fs.upgrade() {
        fs.inodes.lock().unwrap().forget_set_times(file.ino);
        fs.attrs_changed(file.ino, None);
        // The kernel keeps what the change was answered with for the attribute TTL.
        fs.kernel_caches.invalidate(vec![file.ino]);
    }
}

/// Ask the server to write `ino` back to its disk (see [`WRITE_BACK_EVERY`]), not waiting,
/// unless the mount's writers showed it does not pay (`write_back::EarlyWriteBack`); a
/// failure is kept for the file's next `fsync`.
fn write_back_early<R: Remote>(fs: &Weak<Fs<R>>, remote: &Arc<R>, ino: Ino) {
    let Some(fs) = fs.upgrade() else {
        return;
    };
    // (A file with no name any more, a temporary file unlinked while open, is not written
    // back, so it does not count either way.)
    let Ok(path) = fs.path_of(ino) else {
        return;
    };
    if !fs.early_write_back.due(ino) {
        return;
    }
    let (fs, remote) = (Arc::downgrade(&fs), remote.clone());
    tokio::spawn(async move {
        if let Err(e) = remote.write_back_early(&path).await {
            if let Some(fs) = fs.upgrade() {
                fs.early_write_back.failed(ino, e);
            }
        }
    });
}

async fn writer_loop<R: Remote>(
    stream: Arc<WriteStream<R>>,
    fs: Weak<Fs<R>>,
    mut rx: mpsc::UnboundedReceiver<WriteJob<R>>,
) {
    let Some(remote) = fs.upgrade().map(|fs| fs.remote().clone()) else {
        return;
    };
    let max_write = remote.limits().max_write.max(4096) as usize;
    // Whole WRITEs per unit, so that a long run is cut into full ones.
    let unit = (STRIPE_UNIT.div_ceil(max_write).max(1) * max_write) as u64;
    // The descriptor the previous write went through (held weakly: its address cannot be
    // reused by another descriptor while it is compared with).
    let mut last: Option<Weak<OpenFile<R>>> = None;
    // The current run of `last`: where it continues and how many bytes it has so far.
    let mut run_end = 0u64;
    let mut run_len = 0u64;
    // The same run's length for early write-back: unlike `run_len`, not started again when
    // the lanes could not be opened.
    let mut written_back_run = 0u64;
    // While `last`'s lanes are in use: where each byte goes.
    let mut placement: Option<Placement<R::Handle>> = None;
    let mut unsettled = Unsettled::default();
    // The version of `last`'s handle its previous write went through (see `send_in_order`).
    let mut seen = 0u64;
    // Everything put on the wire is numbered, for the order of sending it again.
    let mut seq = 0u64;
    // A job taken from the queue while merging writes that could not join them.
    let mut carried: Option<WriteJob<R>> = None;
    while let Some(job) = match carried.take() {
        Some(job) => Some(job),
        None => rx.recv().await,
    } {
        match job {
            WriteJob::Data {
                file,
                offset,
                data,
                done,
                early,
            } => {
                let Ok(done) = pass_failure_check(&stream, &file, done) else {
                    continue;
                };
                // Small writes queued behind this one that continue it go out with it, as one
                // WRITE: see `Merged`. Behind the OPEN of a create answered early, those the
                // program makes while it is on its way too: the handle slot is held until
                // its answer (at once otherwise).
                let _ = file.handle_version().await;
                let mut merged = Merged::new(offset, data, done, early);
                merged.absorb(&stream, &mut rx, &mut carried, &file, max_write);
                let Merged {
                    data,
                    answers,
                    earlies,
                    jobs,
                    ..
                } = merged;
                let same = last
                    .as_ref()
                    .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&file)));
                if !same {
                    if last.is_some() {
                        // Another descriptor, maybe another channel: let the earlier writes
                        // land (on whatever lanes they went).
                        catch_up(&stream, &fs, &remote, 0, false).await;
                        unsettled = Unsettled::default();
                    }
                    last = Some(Arc::downgrade(&file));
                    seen = file.handle_version().await;
                    // Nothing of another descriptor is in flight: if this one has lanes,
                    // they take over where they left off.
                    placement = file.open_lanes().map(|lanes| Placement { lanes, unit });
                    run_len = 0;
                }
                let len = data.len() as u64;
                if !same || offset != run_end {
                    written_back_run = 0;
                }
                let new_run = run_len == 0 || offset != run_end;
                if new_run {
                    run_len = 0;
                }
                // Out of order, with more waiting behind it than one channel carries per round
                // trip (this job and those merged into it still count in `queued`, and
                // `earlies` holds the permits of their bytes answered early). Only a write
                // that does not continue the descriptor's own write before it: the first after
                // a switch of descriptors waited for every answer (above), and what queued
                // meanwhile says nothing of how this descriptor writes.
                let scattered = same && new_run && {
                    let waiting = stream.queued.load(Ordering::Acquire);
                    let waiting_bytes =
                        EARLY_ANSWER_BYTES as usize - stream.early.available_permits();
                    let own_bytes: usize = earlies.iter().map(|p| p.num_permits()).sum();
                    waiting.saturating_sub(jobs as usize) >= SPREAD_AFTER
                        || waiting_bytes.saturating_sub(own_bytes) >= SPREAD_AFTER_BYTES
                };
                if placement.is_none()
                    && (run_len >= STRIPE_AFTER || scattered)
                    && file.may_stripe()
                {
                    // Before a chunk goes on a lane, everything earlier must have landed: it
                    // could overlap, and went through the descriptor's own handle.
                    let ((), lanes) = tokio::join!(
                        catch_up(&stream, &fs, &remote, 0, false),
                        lanes_for(&fs, &remote, &file)
                    );
                    unsettled = Unsettled::default();
                    let lanes = same_file_or_refused(&remote, &file, lanes).await;
                    if lanes.is_empty() {
                        // None now (refused for good, or the connection failed: a later
                        // write may try again): start the run's count again.
                        run_len = 0;
                    } else {
                        placement = Some(Placement { lanes, unit });
                    }
                }
                let mut rest = data;
                let mut at = offset;
                let mut striped = 0u64;
                let mut send_failed = false;
                while !rest.is_empty() {
                    let (lane, room) = match &placement {
                        Some(p) => p.place(at),
                        None => (None, u64::MAX),
                    };
                    if lane.is_some() && unsettled.attrs_on_own {
                        catch_up(&stream, &fs, &remote, 0, false).await;
                        unsettled = Unsettled::default();
                    }
                    let n = rest
                        .len()
                        .min(max_write)
                        .min(room.min(u32::MAX as u64) as usize);
                    let chunk = rest.split_to(n);
                    let Ok(permit) = stream.window.clone().acquire_many_owned(n as u32).await
                    else {
                        break;
                    };
                    seq += 1;
                    let mut req = Lost::new(seq, &file, Resend::Chunk { at, data: chunk });
                    let sent = match lane {
                        Some(h) => {
                            // Counted before it may be on the wire (see `answer_later`).
                            file.lane_writes.fetch_add(1, Ordering::AcqRel);
                            req.on_lane = true;
                            match req.send_on(&remote, h).await {
                                Ok(ack) => {
                                    striped += n as u64;
                                    unsettled.on_lanes = true;
                                    Ok(ack)
                                }
                                Err(e) => {
                                    req.on_lane = false;
                                    file.lane_writes.fetch_sub(1, Ordering::AcqRel);
                                    match e {
                                        RemoteError::StaleHandle | RemoteError::Disconnected(_) => {
                                            // Never sent: the lanes went with the connection.
                                            // What they had on the wire may be lost, and
                                            // its answers may not all be in yet: every one
                                            // is awaited, and what was lost sent again,
                                            // before this goes through the descriptor's own
                                            // (reopened) handle. Then the lanes are closed,
                                            // with nothing on them.
                                            placement = None;
                                            catch_up(&stream, &fs, &remote, n as u32, false).await;
                                            unsettled = Unsettled::default();
                                            drop_lanes(&remote, &file);
                                            send_in_order(&stream, &fs, &remote, &mut seen, &req)
                                                .await
                                        }
                                        e => Err(e),
                                    }
                                }
                            }
                        }
                        None => send_in_order(&stream, &fs, &remote, &mut seen, &req).await,
                    };
                    match sent {
                        Ok(ack) => stream.answer_later(&fs, ack, permit, req),
                        Err(e) => {
                            req.failed(&fs, e);
                            send_failed = true;
                            break;
                        }
                    }
                    at += n as u64;
                }
                if striped > 0 {
                    if let Some(fs) = fs.upgrade() {
                        fs.stats.bytes_striped.fetch_add(striped, Ordering::Relaxed);
                    }
                }
                run_len += len;
                run_end = offset + len;
                written_back_run += len;
                drop(earlies);
                let every = WRITE_BACK_EVERY;
                if !send_failed && written_back_run / every > (written_back_run - len) / every {
                    write_back_early(&fs, &remote, file.ino);
                }
                if let Some(fs) = fs.upgrade() {
                    // Anything fetched while this write was on its way may predate it.
                    fs.attrs_changed(file.ino, None);
                    fs.stats.bytes_written.fetch_add(len, Ordering::Relaxed);
                    if jobs > 1 {
                        fs.stats
                            .writes_merged
                            .fetch_add(jobs - 1, Ordering::Relaxed);
                    }
                }
                stream.queued.fetch_sub(jobs as usize, Ordering::AcqRel);
                // A send refused at once (the reopen of a lost handle failed, say) is told to
                // the writes still waiting for their answer here, merged ones included, not
                // left for the next write, close or fsync.
                let failure = match send_failed && !answers.is_empty() {
                    true => file.tell(Told::Writes, &[Told::Writes]),
                    false => None,
                };
                for (done, n) in answers {
                    let _ = done.send(match &failure {
                        Some(f) => Err(f.clone()),
                        None => Ok(n),
                    });
                }
            }
            WriteJob::SetAttrs { file, mut attrs } => {
                // Changes of the same descriptor queued right behind it go out with it, as
                // one FSETSTAT: see `merge_setattrs`.
                let mut jobs = 1;
                while let Ok(job) = rx.try_recv() {
                    match job {
                        WriteJob::SetAttrs { file: f, attrs: a } if Arc::ptr_eq(&f, &file) => {
                            match merge_setattrs(&attrs, &a) {
                                Some(both) => {
                                    attrs = both;
                                    jobs += 1;
                                }
                                None => {
                                    carried = Some(WriteJob::SetAttrs { file: f, attrs: a });
                                    break;
                                }
                            }
                        }
                        other => {
                            carried = Some(other);
                            break;
                        }
                    }
                }
                if jobs > 1 {
                    if let Some(fs) = fs.upgrade() {
                        fs.stats
                            .setattrs_merged
                            .fetch_add(jobs - 1, Ordering::Relaxed);
                    }
                }
                let same = last
                    .as_ref()
                    .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&file)));
                if (last.is_some() && !same) || unsettled.on_lanes {
                    // Writes through another descriptor, or on lanes, could land after it
                    // (and move the mtime it sets): let them land first.
                    catch_up(&stream, &fs, &remote, 0, false).await;
                    unsettled = Unsettled::default();
                }
                if !same {
                    last = Some(Arc::downgrade(&file));
                    seen = file.handle_version().await;
                    placement = file.open_lanes().map(|lanes| Placement { lanes, unit });
                    run_len = 0;
                }
                // One unit of the window: "all answered" waits for this one too.
                if let Ok(permit) = stream.window.clone().acquire_many_owned(1).await {
                    // Never sent (the handle went with a lost connection): as a write, sent
                    // again through the reopened handle.
                    seq += 1;
                    let req = Lost::new(seq, &file, Resend::Attrs(attrs));
                    match send_in_order(&stream, &fs, &remote, &mut seen, &req).await {
                        Ok(ack) => {
                            unsettled.attrs_on_own = true;
                            stream.answer_later(&fs, ack, permit, req)
                        }
                        Err(e) => req.failed(&fs, e),
                    }
                }
                stream.queued.fetch_sub(jobs as usize, Ordering::AcqRel);
            }
            WriteJob::CatchUp => {
                catch_up(&stream, &fs, &remote, 0, true).await;
                unsettled = Unsettled::default();
                if stream.has_lost() {
                    // No connection yet (the reconnect goes on in the background): look again
                    // later, even if the file is not used again. Ends with the writer task.
                    let stream = stream.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(LOST_RETRY).await;
                        stream.nudge();
                    });
                }
            }
            WriteJob::Barrier { done } => {
                catch_up(&stream, &fs, &remote, 0, false).await;
                unsettled = Unsettled::default();
                let _ = done.send(());
            }
            WriteJob::Sent { done } => {
                let _ = done.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribute_changes_merge_only_where_the_server_s_order_gives_the_same_file() {
        let times = SetAttrs {
            atime_mtime: Some((5, 6)),
            ..Default::default()
        };
        let mode = SetAttrs {
            perm: Some(0o644),
            ..Default::default()
        };
        let owner = SetAttrs {
            uid_gid: Some((1, 2)),
            ..Default::default()
        };
        // tar's three, in its order: one change.
        let both = merge_setattrs(&times, &owner).unwrap();
        let all = merge_setattrs(&both, &mode).unwrap();
        let expected = SetAttrs {
            size: None,
            uid_gid: Some((1, 2)),
            perm: Some(0o644),
            atime_mtime: Some((5, 6)),
        };
        assert_eq!(all, expected);
        // The later one wins.
        let later = SetAttrs {
            atime_mtime: Some((7, 8)),
            ..Default::default()
        };
        assert_eq!(merge_setattrs(&times, &later), Some(later));
        let other_mode = SetAttrs {
            perm: Some(0o600),
            ..Default::default()
        };
        assert_eq!(merge_setattrs(&mode, &other_mode), Some(other_mode));
        let other_owner = SetAttrs {
            uid_gid: Some((3, 4)),
            ..Default::default()
        };
        assert_eq!(merge_setattrs(&owner, &other_owner), Some(other_owner));
        // A size moves the mtime and clears set-id bits: never merged, before or after.
        let size = SetAttrs {
            size: Some(0),
            ..Default::default()
        };
        assert_eq!(merge_setattrs(&size, &mode), None);
        assert_eq!(merge_setattrs(&times, &size), None);
        // A chown next to set-id bits: the server's order (chmod, then chown) would clear them.
        let setuid = SetAttrs {
            perm: Some(0o4755),
            ..Default::default()
        };
        assert_eq!(merge_setattrs(&owner, &setuid), None);
        assert!(merge_setattrs(&times, &setuid).is_some());
    }
}
