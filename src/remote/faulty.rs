//! A [`Remote`] wrapper that injects failures, for the core's failure tests.
//!
//! [`FaultyRemote`] forwards every call to the remote it wraps, after consulting a shared
//! [`FaultPlan`] that a test adjusts while the core runs (keep a clone of [`FaultyRemote::plan`]):
//!
//! * [`FaultPlan::fail_next`] / [`FaultPlan::fail_always`]: calls of one [`Op`] fail with a
//!   chosen error without reaching the remote; [`FaultPlan::fail_next_after_performing`]: the
//!   call happens on the remote but the error is returned (the reply was lost);
//! * [`FaultPlan::disconnect`] / [`FaultPlan::restore`]: the connection drops: every call fails
//!   with [`RemoteError::Disconnected`] until restored, and handles opened before the drop then
//!   answer [`RemoteError::StaleHandle`]. [`FaultPlan::disconnect_on_next`] and
//!   [`FaultPlan::disconnect_after_next`] drop it at a chosen call. A call in flight when the
//!   connection drops gets `Disconnected` (its reply is lost; it may have happened);
//! * [`FaultPlan::set_short_reads`]: reads return at most K bytes;
//! * [`FaultPlan::set_trunc_only_with_creat`]: an OPEN ignores TRUNC without CREAT, as SFTP v3
//!   allows a server to;
//! * [`FaultPlan::set_delay`] / [`FaultPlan::set_op_delay`]: each call waits first;
//!   [`FaultPlan::hold`]: calls of one [`Op`] wait until [`FaultPlan::release`], for tests
//!   that must know nothing got through meanwhile (no timing involved);
//! * [`FaultPlan::set_queue_delay`]: queued writes and attribute changes are answered at once
//!   and land later (in order), while the caller goes on, as over a link with latency;
//! * handles from `open_alongside` (extra lanes of a striped write) are marked: their writes
//!   count as [`Op::LaneWrite`], so they can be failed or delayed alone;
//! * [`FaultPlan::calls`]: how many calls of each [`Op`] the core made (whether they failed or
//!   not), e.g. to check that a cached getattr did not reach the remote.
//!
//! Like a server, the wrapper closes the handles of a dropped connection on the wrapped remote
//! (lazily: on the next call, or [`FaultyRemote::reap_stale_handles`]), so a wrapped
//! [`LocalRemote`](super::local::LocalRemote)'s open-handle count stays meaningful.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;

use super::{
    Attrs, DirEntry, Limits, OpenFlags, Remote, RemoteError, RemoteResult, RenameMode, SetAttrs,
    StatVfs, WriteAck,
};

/// One kind of remote operation: one method of [`Remote`] (`write_queued` counts as
/// [`Op::Write`], and a write on a handle from `open_alongside` as [`Op::LaneWrite`], so a test
/// can fail the writes of an extra lane alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Lstat,
    Stat,
    Fstat,
    Setstat,
    Lsetstat,
    Fsetstat,
    ReadDir,
    Open,
    /// `open_alongside`: an extra lane for a striped write.
    OpenAlongside,
    Read,
    Write,
    /// `write`/`write_queued` on a handle opened by `open_alongside`.
    LaneWrite,
    Fsync,
    /// `write_back_early`: a file's data flushed ahead of its `fsync`.
    WriteBackEarly,
    Close,
    Remove,
    Mkdir,
    Rmdir,
    Rename,
    Symlink,
    Readlink,
    Hardlink,
    Statvfs,
    Realpath,
    /// `open_beside`: the source of a server-side copy.
    OpenBeside,
    CopyData,
}

impl Op {
    pub const ALL: [Op; 26] = [
        Op::Lstat,
        Op::Stat,
        Op::Fstat,
        Op::Setstat,
        Op::Lsetstat,
        Op::Fsetstat,
        Op::ReadDir,
        Op::Open,
        Op::OpenAlongside,
        Op::Read,
        Op::Write,
        Op::LaneWrite,
        Op::Fsync,
        Op::WriteBackEarly,
        Op::Close,
        Op::Remove,
        Op::Mkdir,
        Op::Rmdir,
        Op::Rename,
        Op::Symlink,
        Op::Readlink,
        Op::Hardlink,
        Op::Statvfs,
        Op::Realpath,
        Op::OpenBeside,
        Op::CopyData,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Clone)]
enum Fault {
    Error(RemoteError),
    Disconnect,
}

#[derive(Debug, Clone)]
struct Injection {
    fault: Fault,
    /// Perform the call on the wrapped remote first, then fail (a lost reply).
    perform: bool,
    /// Calls left to fail; `None`: until cleared.
    remaining: Option<usize>,
}

#[derive(Debug, Default)]
struct PlanState {
    injections: HashMap<Op, VecDeque<Injection>>,
    disconnected: bool,
    /// Bumped at each disconnect: handles of an older generation are stale.
    generation: u64,
    short_reads: Option<u32>,
    trunc_only_with_creat: bool,
    delay: Option<Duration>,
    op_delays: HashMap<Op, Duration>,
    reply_delays: HashMap<Op, Duration>,
    /// Writes of these ops are answered at once and performed that much later.
    queue_delays: HashMap<Op, Duration>,
    /// Calls of these ops wait (before anything else is decided) until released.
    held: HashSet<Op>,
    /// Calls of these ops are performed, then their answer waits until released.
    held_replies: HashSet<Op>,
    /// How many calls of each op wait at a hold.
    waiting: HashMap<Op, usize>,
}

/// The faults a [`FaultyRemote`] injects. Shared (`Arc`) between the remote and the test, and
/// adjustable at any time through `&self`.
#[derive(Debug)]
pub struct FaultPlan {
    state: Mutex<PlanState>,
    calls: [AtomicU64; Op::ALL.len()],
    /// Wakes the calls waiting at a hold when one is released.
    released: tokio::sync::Notify,
}

impl Default for FaultPlan {
    fn default() -> Self {
        Self::new()
    }
}

/// What the plan decided for one call, before it reaches the wrapped remote.
struct Ticket {
    /// The connection generation the call was sent on.
    generation: u64,
    /// Fail after performing the call.
    after: Option<Fault>,
}

fn disconnected() -> RemoteError {
    RemoteError::Disconnected("simulated connection loss".to_owned())
}

/// Set `op`'s entry of a delay map, or remove it (`None`).
fn set_or_clear(map: &mut HashMap<Op, Duration>, op: Op, delay: Option<Duration>) {
    match delay {
        Some(d) => map.insert(op, d),
        None => map.remove(&op),
    };
}

impl FaultPlan {
    /// A plan that injects nothing.
    pub fn new() -> Self {
        FaultPlan {
            state: Mutex::new(PlanState::default()),
            calls: std::array::from_fn(|_| AtomicU64::new(0)),
            released: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PlanState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn inject(&self, op: Op, injection: Injection) {
        self.lock()
            .injections
            .entry(op)
            .or_default()
            .push_back(injection);
    }

    /// The next `n` calls of `op` fail with `err` without reaching the remote. Queued behind
    /// any injection already pending for `op`.
    pub fn fail_next(&self, op: Op, n: usize, err: RemoteError) {
        if n > 0 {
            self.inject(
                op,
                Injection {
                    fault: Fault::Error(err),
                    perform: false,
                    remaining: Some(n),
                },
            );
        }
    }

    /// The next `n` calls of `op` are performed on the remote, but the caller gets `err` (the
    /// reply was lost). A handle opened this way is closed again on the remote.
    pub fn fail_next_after_performing(&self, op: Op, n: usize, err: RemoteError) {
        if n > 0 {
            self.inject(
                op,
                Injection {
                    fault: Fault::Error(err),
                    perform: true,
                    remaining: Some(n),
                },
            );
        }
    }

    /// Every call of `op` fails with `err` until [`FaultPlan::clear_failures`] (injections
    /// queued after this one never fire meanwhile).
    pub fn fail_always(&self, op: Op, err: RemoteError) {
        self.inject(
            op,
            Injection {
                fault: Fault::Error(err),
                perform: false,
                remaining: None,
            },
        );
    }

    /// The next call of `op` drops the connection before reaching the server (as
    /// [`FaultPlan::disconnect`]) and fails with `Disconnected`.
    pub fn disconnect_on_next(&self, op: Op) {
        self.inject(
            op,
            Injection {
                fault: Fault::Disconnect,
                perform: false,
                remaining: Some(1),
            },
        );
    }

    /// The next call of `op` is performed on the server, then the connection drops before
    /// the reply: the caller gets `Disconnected`.
    pub fn disconnect_after_next(&self, op: Op) {
        self.inject(
            op,
            Injection {
                fault: Fault::Disconnect,
                perform: true,
                remaining: Some(1),
            },
        );
    }

    /// Forget the injections pending for `op`.
    pub fn clear_failures(&self, op: Op) {
        self.lock().injections.remove(&op);
    }

    /// Forget every pending injection, short-read limit, delay and hold (not the connection
    /// state nor the counts).
    pub fn clear_all(&self) {
        let mut s = self.lock();
        s.injections.clear();
        s.short_reads = None;
        s.trunc_only_with_creat = false;
        s.delay = None;
        s.op_delays.clear();
        s.reply_delays.clear();
        s.queue_delays.clear();
        s.held.clear();
        drop(s);
        self.released.notify_waiters();
    }

    /// Drop the connection: every call fails with [`RemoteError::Disconnected`] until
    /// [`FaultPlan::restore`], and the handles open now become stale for good. Dropping an
    /// already dropped connection does nothing.
    pub fn disconnect(&self) {
        Self::drop_connection(&mut self.lock());
    }

    fn drop_connection(s: &mut PlanState) {
        if !s.disconnected {
            s.disconnected = true;
            s.generation += 1;
        }
    }

    /// A new connection is up: calls go through again; handles opened before the drop answer
    /// [`RemoteError::StaleHandle`].
    pub fn restore(&self) {
        self.lock().disconnected = false;
    }

    pub fn is_disconnected(&self) -> bool {
        self.lock().disconnected
    }

    /// How many times the connection has dropped.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Reads return at most `max` bytes (`None`: as many as the remote gives).
    pub fn set_short_reads(&self, max: Option<u32>) {
        self.lock().short_reads = max;
    }

    /// An OPEN with TRUNC but not CREAT opens without truncating: SFTP v3 defines TRUNC only
    /// together with CREAT, and a server other than OpenSSH may ignore it alone.
    pub fn set_trunc_only_with_creat(&self, on: bool) {
        self.lock().trunc_only_with_creat = on;
    }

    /// Every call waits `delay` before going to the remote (an [`FaultPlan::set_op_delay`]
    /// takes precedence).
    pub fn set_delay(&self, delay: Option<Duration>) {
        self.lock().delay = delay;
    }

    /// Calls of `op` wait, counted but undecided, until [`FaultPlan::release`]`(op)`: a
    /// server that has not yet answered, for as long as the test needs.
    pub fn hold(&self, op: Op) {
        self.lock().held.insert(op);
    }

    /// Calls of `op` (by path or on a handle) are performed by the wrapped remote, then their answer waits until
    /// [`FaultPlan::release`]`(op)`: a server that did it, whose answer is still on its way.
    /// They count for [`FaultPlan::until_held`] as held calls do.
    pub fn hold_replies(&self, op: Op) {
        self.lock().held_replies.insert(op);
    }

    /// Let the calls of `op` held by [`FaultPlan::hold`] or [`FaultPlan::hold_replies`] go on
    /// (and later ones through).
    pub fn release(&self, op: Op) {
        let mut s = self.lock();
        s.held.remove(&op);
        s.held_replies.remove(&op);
        drop(s);
        self.released.notify_waiters();
    }

    /// How many calls of `op` are waiting at a hold right now.
    pub fn waiting_at_hold(&self, op: Op) -> usize {
        self.lock().waiting.get(&op).copied().unwrap_or(0)
    }

    /// Wait until `n` calls of `op` wait at its hold (they have reached the remote's door);
    /// panics after 30 s, a hang guard.
    pub async fn until_held(&self, op: Op, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.waiting_at_hold(op) < n {
            assert!(
                std::time::Instant::now() < deadline,
                "{n} calls of {op:?} never reached the hold"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn pass_hold(&self, op: Op) {
        self.pass_gate(op, false).await
    }

    async fn pass_reply_hold(&self, op: Op) {
        self.pass_gate(op, true).await
    }

    async fn pass_gate(&self, op: Op, reply: bool) {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            // Registered before the check, so a release in between is not missed.
            released.as_mut().enable();
            {
                let mut s = self.lock();
                let held = if reply { &s.held_replies } else { &s.held };
                if !held.contains(&op) {
                    return;
                }
                *s.waiting.entry(op).or_default() += 1;
            }
            released.await;
            let mut s = self.lock();
            if let Some(n) = s.waiting.get_mut(&op) {
                *n -= 1;
            }
        }
    }

    /// Calls of `op` wait `delay` before going to the remote.
    pub fn set_op_delay(&self, op: Op, delay: Option<Duration>) {
        set_or_clear(&mut self.lock().op_delays, op, delay);
    }

    /// Calls of `op` are performed at once, but their answer waits `delay`: a server that
    /// is slow to answer (what was asked may have happened before the caller learns it).
    pub fn set_op_reply_delay(&self, op: Op, delay: Option<Duration>) {
        set_or_clear(&mut self.lock().reply_delays, op, delay);
    }

    fn reply_delay_for(&self, op: Op) -> Option<Duration> {
        self.lock().reply_delays.get(&op).copied()
    }

    /// `write_queued` calls of `op` ([`Op::Write`] or [`Op::LaneWrite`]), or `fsetstat_queued`
    /// calls ([`Op::Fsetstat`]), return at once, and each reaches the wrapped remote `delay`
    /// later, in the order they were queued (over all handles and those ops): as over a link
    /// with latency, where the writer goes on meanwhile. With it on the descriptor's own
    /// handle's writes and attribute changes and not on lane writes, a lane's write lands
    /// before an earlier one through the own handle unless the core waits for its answer
    /// (and the other way round): what an ordering test needs.
    pub fn set_queue_delay(&self, op: Op, delay: Option<Duration>) {
        set_or_clear(&mut self.lock().queue_delays, op, delay);
    }

    fn queue_delay_for(&self, op: Op) -> Option<Duration> {
        self.lock().queue_delays.get(&op).copied()
    }

    /// Calls of `op` made so far (including those that failed, injected or not).
    pub fn calls(&self, op: Op) -> u64 {
        self.calls[op.index()].load(Ordering::SeqCst)
    }

    /// Calls of every kind made so far.
    pub fn total_calls(&self) -> u64 {
        Op::ALL.iter().map(|&op| self.calls(op)).sum()
    }

    /// The non-zero counts, by operation.
    pub fn call_counts(&self) -> HashMap<Op, u64> {
        Op::ALL
            .iter()
            .map(|&op| (op, self.calls(op)))
            .filter(|&(_, n)| n > 0)
            .collect()
    }

    pub fn reset_counts(&self) {
        for c in &self.calls {
            c.store(0, Ordering::SeqCst);
        }
    }

    fn count(&self, op: Op) {
        self.calls[op.index()].fetch_add(1, Ordering::SeqCst);
    }

    fn delay_for(&self, op: Op) -> Option<Duration> {
        let s = self.lock();
        s.op_delays.get(&op).copied().or(s.delay)
    }

    fn short_reads(&self) -> Option<u32> {
        self.lock().short_reads
    }

    /// Whether a handle opened in connection `generation` can still be used.
    fn is_live(&self, generation: u64) -> bool {
        let s = self.lock();
        !s.disconnected && s.generation == generation
    }

    /// Decide the fate of a call of `op` (on a handle of generation `handle_generation`).
    fn decide(&self, op: Op, handle_generation: Option<u64>) -> RemoteResult<Ticket> {
        let mut s = self.lock();
        if s.disconnected {
            return Err(disconnected());
        }
        if handle_generation.is_some_and(|g| g != s.generation) {
            return Err(RemoteError::StaleHandle);
        }
        let mut ticket = Ticket {
            generation: s.generation,
            after: None,
        };
        let Some(queue) = s.injections.get_mut(&op) else {
            return Ok(ticket);
        };
        let Some(front) = queue.front_mut() else {
            return Ok(ticket);
        };
        let injection = front.clone();
        if let Some(n) = &mut front.remaining {
            *n -= 1;
            if *n == 0 {
                queue.pop_front();
            }
        }
        if injection.perform {
            ticket.after = Some(injection.fault);
            return Ok(ticket);
        }
        match injection.fault {
            Fault::Error(e) => Err(e),
            Fault::Disconnect => {
                Self::drop_connection(&mut s);
                Err(disconnected())
            }
        }
    }

    /// After the call was performed: the error to report instead of its result, if any.
    fn verdict(&self, ticket: Ticket) -> RemoteResult<()> {
        let mut s = self.lock();
        match ticket.after {
            Some(Fault::Error(e)) => Err(e),
            Some(Fault::Disconnect) => {
                Self::drop_connection(&mut s);
                Err(disconnected())
            }
            // The connection dropped while the call was in flight: the reply is lost.
            None if s.generation != ticket.generation => Err(disconnected()),
            None => Ok(()),
        }
    }
}

/// A handle of a [`FaultyRemote`]: the wrapped remote's handle and the connection generation
/// it was opened on.
#[derive(Debug, Clone)]
pub struct FaultyHandle<H> {
    inner: H,
    generation: u64,
    /// Key in the wrapper's table of open handles.
    id: u64,
    /// Opened by `open_alongside`: its writes are [`Op::LaneWrite`]s.
    lane: bool,
}

impl<H> FaultyHandle<H> {
    /// The wrapped remote's handle.
    pub fn inner(&self) -> &H {
        &self.inner
    }

    /// The connection generation the handle was opened on.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether it was opened by `open_alongside` (an extra lane).
    pub fn is_lane(&self) -> bool {
        self.lane
    }

    fn write_op(&self) -> Op {
        if self.lane {
            Op::LaneWrite
        } else {
            Op::Write
        }
    }
}

/// Wraps a remote and injects the faults of its [`FaultPlan`].
pub struct FaultyRemote<R: Remote> {
    inner: Arc<R>,
    plan: Arc<FaultPlan>,
    /// Handles open on `inner`, by id, with their generation: closed on `inner` once their
    /// connection has dropped.
    open: Mutex<HashMap<u64, (u64, R::Handle)>>,
    next_id: AtomicU64,
    /// The generation up to which stale handles have been closed.
    reaped: AtomicU64,
    /// Done when the last write delayed by a queue delay has been performed.
    delayed_tail: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
    /// Those writes not performed yet, by handle.
    unperformed: Arc<Unperformed>,
}

/// Writes sent with a queue delay and not yet performed, by handle id. A read or fstat through
/// the same handle waits for them, as a server does: one SFTP channel is served in the order
/// its requests arrive, and a handle lives on one channel. (Across handles nothing is
/// ordered, as across channels.)
#[derive(Default)]
struct Unperformed {
    count: Mutex<HashMap<u64, usize>>,
    performed: tokio::sync::Notify,
}

impl Unperformed {
    fn sent(&self, id: u64) {
        *self
            .count
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(id)
            .or_default() += 1;
    }

    fn performed(&self, id: u64) {
        let mut count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = count.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                count.remove(&id);
            }
        }
        drop(count);
        self.performed.notify_waiters();
    }

    async fn none_before(&self, id: u64) {
        loop {
            let performed = self.performed.notified();
            tokio::pin!(performed);
            // Registered before the check, so a write performed in between is not missed.
            performed.as_mut().enable();
            if !self
                .count
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(&id)
            {
                return;
            }
            performed.await;
        }
    }
}

impl<R: Remote> FaultyRemote<R> {
    /// Wrap `inner` with a fresh plan that injects nothing.
    pub fn new(inner: R) -> Self {
        Self::with_plan(inner, Arc::new(FaultPlan::new()))
    }

    /// Wrap `inner`, following `plan` (which may be shared with other wrappers).
    pub fn with_plan(inner: R, plan: Arc<FaultPlan>) -> Self {
        let reaped = AtomicU64::new(plan.generation());
        FaultyRemote {
            inner: Arc::new(inner),
            plan,
            open: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            reaped,
            delayed_tail: Mutex::new(None),
            unperformed: Arc::default(),
        }
    }

    /// The plan; clone it to keep a control handle.
    pub fn plan(&self) -> &Arc<FaultPlan> {
        &self.plan
    }

    pub fn inner(&self) -> &R {
        &self.inner
    }

    fn open_table(&self) -> MutexGuard<'_, HashMap<u64, (u64, R::Handle)>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Close on the wrapped remote the handles of connections that have dropped, as the
    /// server does when a session ends. Done at the start of every call anyway.
    pub async fn reap_stale_handles(&self) {
        let generation = self.plan.generation();
        if self.reaped.fetch_max(generation, Ordering::SeqCst) >= generation {
            return;
        }
        let stale: Vec<R::Handle> = {
            let mut table = self.open_table();
            let ids: Vec<u64> = table
                .iter()
                .filter(|(_, (g, _))| *g < generation)
                .map(|(&id, _)| id)
                .collect();
            ids.into_iter()
                .filter_map(|id| table.remove(&id))
                .map(|(_, h)| h)
                .collect()
        };
        for handle in stale {
            let _ = self.inner.close(&handle).await;
        }
    }

    /// Everything before a call reaches the wrapped remote: count, reap, wait, decide.
    async fn enter(&self, op: Op, handle_generation: Option<u64>) -> RemoteResult<Ticket> {
        self.plan.count(op);
        self.plan.pass_hold(op).await;
        self.reap_stale_handles().await;
        if let Some(delay) = self.plan.delay_for(op) {
            tokio::time::sleep(delay).await;
        }
        self.plan.decide(op, handle_generation)
    }

    /// A call on a path: the wrapped remote's answer unless the plan says otherwise.
    ///
    /// `call` makes the wrapped remote's future only once the call may go ahead: an
    /// implementation is free to send its request when the future is made.
    async fn forward<T, F>(&self, op: Op, call: impl FnOnce() -> F) -> RemoteResult<T>
    where
        F: Future<Output = RemoteResult<T>>,
    {
        let ticket = self.enter(op, None).await?;
        let result = call().await;
        self.plan.pass_reply_hold(op).await;
        if let Some(delay) = self.plan.reply_delay_for(op) {
            tokio::time::sleep(delay).await;
        }
        self.plan.verdict(ticket)?;
        result
    }

    /// A queued call on a handle (see [`Remote::write_queued`]): the plan's verdict comes
    /// with the answer, so a failure injected "after performing" fails the ack.
    async fn forward_queued<F>(
        &self,
        op: Op,
        handle: &FaultyHandle<R::Handle>,
        call: impl FnOnce() -> F,
    ) -> RemoteResult<WriteAck>
    where
        F: Future<Output = RemoteResult<WriteAck>>,
    {
        let ticket = self.enter(op, Some(handle.generation)).await?;
        let ack = match call().await {
            Ok(ack) => ack,
            Err(e) => {
                self.plan.verdict(ticket)?;
                return Err(e);
            }
        };
        let plan = Arc::clone(&self.plan);
        Ok(Box::pin(async move {
            let result = ack.await;
            plan.pass_reply_hold(op).await;
            plan.verdict(ticket)?;
            result
        }))
    }

    /// Wait, as a server does, until the writes queued with a delay on `handle` before this
    /// request are performed; unless its connection is gone, where nothing is served and the
    /// request fails at once (a client finds the handle stale without asking).
    async fn after_writes_on(&self, handle: &FaultyHandle<R::Handle>) {
        if self.plan.is_live(handle.generation) {
            self.unperformed.none_before(handle.id).await;
        }
    }

    /// A queued call with a queue delay ([`FaultPlan::set_queue_delay`]): answered at once,
    /// performed by `perform` on the wrapped remote `delay` later, after every call delayed
    /// before it.
    async fn delayed<F>(
        &self,
        op: Op,
        handle: &FaultyHandle<R::Handle>,
        delay: Duration,
        perform: impl FnOnce(Arc<R>, R::Handle) -> F + Send + 'static,
    ) -> RemoteResult<WriteAck>
    where
        F: Future<Output = RemoteResult<()>> + Send + 'static,
    {
        let ticket = self.enter(op, Some(handle.generation)).await?;
        let (done, tail) = tokio::sync::oneshot::channel();
        let previous = self
            .delayed_tail
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(tail);
        let inner = Arc::clone(&self.inner);
        let id = handle.id;
        let h = handle.inner.clone();
        let plan = Arc::clone(&self.plan);
        let unperformed = Arc::clone(&self.unperformed);
        unperformed.sent(id);
        Ok(Box::pin(async move {
            tokio::time::sleep(delay).await;
            if let Some(previous) = previous {
                let _ = previous.await;
            }
            let result = perform(inner, h).await;
            unperformed.performed(id);
            let _ = done.send(());
            plan.verdict(ticket)?;
            result
        }))
    }

    /// A call on a handle: as [`Self::forward`], but a handle of a dropped connection is stale.
    async fn forward_handle<T, F>(
        &self,
        op: Op,
        handle: &FaultyHandle<R::Handle>,
        call: impl FnOnce() -> F,
    ) -> RemoteResult<T>
    where
        F: Future<Output = RemoteResult<T>>,
    {
        let ticket = self.enter(op, Some(handle.generation)).await?;
        let result = call().await;
        self.plan.pass_reply_hold(op).await;
        if let Some(delay) = self.plan.reply_delay_for(op) {
            tokio::time::sleep(delay).await;
        }
        self.plan.verdict(ticket)?;
        result
    }

    /// A handle the wrapped remote opened (`result`) under `ticket`, kept as a server keeps
    /// it: closed when the plan says the reply was lost (the handle is unreachable) or the
    /// connection dropped meanwhile.
    async fn adopt<X>(
        &self,
        ticket: Ticket,
        result: RemoteResult<(R::Handle, X)>,
    ) -> RemoteResult<(FaultyHandle<R::Handle>, X)> {
        let generation = ticket.generation;
        if let Err(e) = self.plan.verdict(ticket) {
            // The server opened it but the reply was lost: the handle is unreachable.
            if let Ok((handle, _)) = result {
                let _ = self.inner.close(&handle).await;
            }
            return Err(e);
        }
        let (inner, extra) = result?;
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        self.open_table().insert(id, (generation, inner.clone()));
        if self.plan.generation() != generation {
            // Dropped just now: close it unless the reaper already has.
            let entry = self.open_table().remove(&id);
            if let Some((_, handle)) = entry {
                let _ = self.inner.close(&handle).await;
            }
            return Err(disconnected());
        }
        let handle = FaultyHandle {
            inner,
            generation,
            id,
            lane: false,
        };
        Ok((handle, extra))
    }
}

impl<R: Remote> Remote for FaultyRemote<R> {
    type Handle = FaultyHandle<R::Handle>;

    fn limits(&self) -> Limits {
        self.inner.limits()
    }

    async fn lstat(&self, path: &Path) -> RemoteResult<Attrs> {
        self.forward(Op::Lstat, || self.inner.lstat(path)).await
    }

    async fn stat(&self, path: &Path) -> RemoteResult<Attrs> {
        self.forward(Op::Stat, || self.inner.stat(path)).await
    }

    async fn fstat(&self, handle: &Self::Handle) -> RemoteResult<Attrs> {
        self.after_writes_on(handle).await;
        self.forward_handle(Op::Fstat, handle, || self.inner.fstat(&handle.inner))
            .await
    }

    async fn setstat(&self, path: &Path, attrs: SetAttrs) -> RemoteResult<()> {
        self.forward(Op::Setstat, || self.inner.setstat(path, attrs))
            .await
    }

    async fn lsetstat(&self, path: &Path, attrs: SetAttrs) -> RemoteResult<()> {
        self.forward(Op::Lsetstat, || self.inner.lsetstat(path, attrs))
            .await
    }

    async fn fsetstat(&self, handle: &Self::Handle, attrs: SetAttrs) -> RemoteResult<()> {
        self.forward_handle(Op::Fsetstat, handle, || {
            self.inner.fsetstat(&handle.inner, attrs)
        })
        .await
    }

    async fn read_dir(&self, path: &Path) -> RemoteResult<Vec<DirEntry>> {
        self.forward(Op::ReadDir, || self.inner.read_dir(path))
            .await
    }

    async fn open(&self, path: &Path, flags: OpenFlags, perm: u32) -> RemoteResult<Self::Handle> {
        let ticket = self.enter(Op::Open, None).await?;
        let flags = OpenFlags {
            truncate: flags.truncate && (flags.create || !self.plan.lock().trunc_only_with_creat),
            ..flags
        };
        let result = self.inner.open(path, flags, perm).await;
        self.adopt(ticket, result.map(|h| (h, ())))
            .await
            .map(|(h, ())| h)
    }

    async fn open_beside(
        &self,
        path: &Path,
        beside: &Self::Handle,
    ) -> RemoteResult<(Self::Handle, Attrs)> {
        let ticket = self.enter(Op::OpenBeside, Some(beside.generation)).await?;
        let result = self.inner.open_beside(path, &beside.inner).await;
        self.adopt(ticket, result).await
    }

    async fn copy_data(
        &self,
        from: &Self::Handle,
        from_offset: u64,
        len: u64,
        to: &Self::Handle,
        to_offset: u64,
    ) -> RemoteResult<()> {
        if from.generation != to.generation {
            return Err(RemoteError::StaleHandle);
        }
        self.forward_handle(Op::CopyData, to, || {
            self.inner
                .copy_data(&from.inner, from_offset, len, &to.inner, to_offset)
        })
        .await
    }

    /// Forwarded; counted and faulted once per call as [`Op::OpenAlongside`]. The handles it
    /// returns are lanes: their writes are [`Op::LaneWrite`]s.
    async fn open_alongside(
        &self,
        path: &Path,
        flags: OpenFlags,
        beside: &Self::Handle,
        n: usize,
    ) -> RemoteResult<Vec<Self::Handle>> {
        let ticket = self
            .enter(Op::OpenAlongside, Some(beside.generation))
            .await?;
        let generation = ticket.generation;
        let result = self
            .inner
            .open_alongside(path, flags, &beside.inner, n)
            .await;
        if let Err(e) = self.plan.verdict(ticket) {
            // Opened, but the reply was lost: the handles are unreachable.
            for h in result.iter().flatten() {
                let _ = self.inner.close(h).await;
            }
            return Err(e);
        }
        let mut handles = Vec::new();
        for inner in result? {
            let id = self.next_id.fetch_add(1, Ordering::SeqCst);
            self.open_table().insert(id, (generation, inner.clone()));
            handles.push(FaultyHandle {
                inner,
                generation,
                id,
                lane: true,
            });
        }
        if self.plan.generation() != generation {
            for h in &handles {
                let entry = self.open_table().remove(&h.id);
                if let Some((_, handle)) = entry {
                    let _ = self.inner.close(&handle).await;
                }
            }
            return Err(disconnected());
        }
        Ok(handles)
    }

    async fn read(&self, handle: &Self::Handle, offset: u64, len: u32) -> RemoteResult<Bytes> {
        let len = match self.plan.short_reads() {
            Some(max) => len.min(max),
            None => len,
        };
        self.after_writes_on(handle).await;
        self.forward_handle(Op::Read, handle, || {
            self.inner.read(&handle.inner, offset, len)
        })
        .await
    }

    async fn write(&self, handle: &Self::Handle, offset: u64, data: Bytes) -> RemoteResult<()> {
        self.forward_handle(handle.write_op(), handle, || {
            self.inner.write(&handle.inner, offset, data)
        })
        .await
    }

    /// Forwarded to the wrapped remote's `write_queued` (so its pipelining is kept); counted
    /// and faulted as [`Op::Write`] ([`Op::LaneWrite`] on a lane). An injected failure, or a
    /// drop before the answer, shows in the returned acknowledgement.
    async fn write_queued(
        &self,
        handle: &Self::Handle,
        offset: u64,
        data: Bytes,
    ) -> RemoteResult<WriteAck> {
        let op = handle.write_op();
        if let Some(delay) = self.plan.queue_delay_for(op) {
            return self
                .delayed(op, handle, delay, move |inner, h| async move {
                    inner.write(&h, offset, data).await
                })
                .await;
        }
        self.forward_queued(op, handle, || {
            self.inner.write_queued(&handle.inner, offset, data)
        })
        .await
    }

    async fn fsetstat_queued(
        &self,
        handle: &Self::Handle,
        attrs: SetAttrs,
    ) -> RemoteResult<WriteAck> {
        if let Some(delay) = self.plan.queue_delay_for(Op::Fsetstat) {
            return self
                .delayed(Op::Fsetstat, handle, delay, move |inner, h| async move {
                    inner.fsetstat(&h, attrs).await
                })
                .await;
        }
        self.forward_queued(Op::Fsetstat, handle, || {
            self.inner.fsetstat_queued(&handle.inner, attrs)
        })
        .await
    }

    async fn fsync(&self, handle: &Self::Handle) -> RemoteResult<()> {
        self.after_writes_on(handle).await;
        self.forward_handle(Op::Fsync, handle, || self.inner.fsync(&handle.inner))
            .await
    }

    async fn write_back_early(&self, path: &Path) -> RemoteResult<()> {
        self.forward(Op::WriteBackEarly, || self.inner.write_back_early(path))
            .await
    }

    async fn close(&self, handle: &Self::Handle) -> RemoteResult<()> {
        // Not forwarded when the plan refuses it (the server never saw the CLOSE, the handle
        // stays open there); a stale handle was closed by the reaper.
        let ticket = self.enter(Op::Close, Some(handle.generation)).await?;
        self.open_table().remove(&handle.id);
        let result = self.inner.close(&handle.inner).await;
        self.plan.verdict(ticket)?;
        result
    }

    async fn remove(&self, path: &Path) -> RemoteResult<()> {
        self.forward(Op::Remove, || self.inner.remove(path)).await
    }

    async fn mkdir(&self, path: &Path, perm: u32) -> RemoteResult<()> {
        self.forward(Op::Mkdir, || self.inner.mkdir(path, perm))
            .await
    }

    async fn rmdir(&self, path: &Path) -> RemoteResult<()> {
        self.forward(Op::Rmdir, || self.inner.rmdir(path)).await
    }

    async fn rename(&self, from: &Path, to: &Path, mode: RenameMode) -> RemoteResult<()> {
        self.forward(Op::Rename, || self.inner.rename(from, to, mode))
            .await
    }

    async fn symlink(&self, target: &Path, link: &Path) -> RemoteResult<()> {
        self.forward(Op::Symlink, || self.inner.symlink(target, link))
            .await
    }

    async fn readlink(&self, path: &Path) -> RemoteResult<PathBuf> {
        self.forward(Op::Readlink, || self.inner.readlink(path))
            .await
    }

    async fn hardlink(&self, existing: &Path, new: &Path) -> RemoteResult<()> {
        self.forward(Op::Hardlink, || self.inner.hardlink(existing, new))
            .await
    }

    async fn statvfs(&self, path: &Path) -> RemoteResult<StatVfs> {
        self.forward(Op::Statvfs, || self.inner.statvfs(path)).await
    }

    async fn realpath(&self, path: &Path) -> RemoteResult<PathBuf> {
        self.forward(Op::Realpath, || self.inner.realpath(path))
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::remote::local::LocalRemote;
    use crate::remote::Status;

    fn setup() -> (tempfile::TempDir, FaultyRemote<LocalRemote>, Arc<FaultPlan>) {
        let dir = tempfile::tempdir().unwrap();
        let remote = FaultyRemote::new(LocalRemote::new());
        let plan = Arc::clone(remote.plan());
        (dir, remote, plan)
    }

    fn failure(msg: &str) -> RemoteError {
        RemoteError::Status(Status::Failure, msg.to_owned())
    }

    fn rw_create() -> OpenFlags {
        OpenFlags {
            read: true,
            write: true,
            create: true,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn passes_calls_through_and_counts_them() {
        let (dir, r, plan) = setup();
        let path = dir.path().join("f");
        let h = r.open(&path, rw_create(), 0o644).await.unwrap();
        assert_eq!(h.generation(), 0);
        r.write(&h, 0, Bytes::from_static(b"hello")).await.unwrap();
        assert_eq!(&r.read(&h, 0, 10).await.unwrap()[..], b"hello");
        assert_eq!(r.fstat(&h).await.unwrap().size, Some(5));
        r.close(&h).await.unwrap();
        assert_eq!(r.lstat(&path).await.unwrap().size, Some(5));
        assert_eq!(r.lstat(&path).await.unwrap().size, Some(5));
        // Errors of the wrapped remote come through unchanged, and count too.
        assert_eq!(
            r.stat(&dir.path().join("missing"))
                .await
                .unwrap_err()
                .status(),
            Some(Status::NoSuchFile)
        );
        assert_eq!(r.limits(), r.inner().limits());

        assert_eq!(plan.calls(Op::Lstat), 2);
        assert_eq!(plan.calls(Op::Stat), 1);
        assert_eq!(plan.calls(Op::Open), 1);
        assert_eq!(plan.calls(Op::Mkdir), 0);
        assert_eq!(plan.total_calls(), 8);
        assert_eq!(plan.call_counts().len(), 7);
        plan.reset_counts();
        assert_eq!(plan.total_calls(), 0);
        assert_eq!(r.inner().open_handles(), 0);
    }

    #[tokio::test]
    async fn fail_next_fails_n_calls_without_reaching_the_remote() {
        let (dir, r, plan) = setup();
        let sub = dir.path().join("sub");
        plan.fail_next(Op::Mkdir, 2, failure("injected"));
        plan.fail_next(Op::Mkdir, 1, RemoteError::Unsupported("x"));
        assert_eq!(r.mkdir(&sub, 0o755).await, Err(failure("injected")));
        assert_eq!(r.mkdir(&sub, 0o755).await, Err(failure("injected")));
        assert_eq!(
            r.mkdir(&sub, 0o755).await,
            Err(RemoteError::Unsupported("x"))
        );
        assert!(!sub.exists());
        // Other operations are unaffected.
        r.lstat(dir.path()).await.unwrap();
        r.mkdir(&sub, 0o755).await.unwrap();
        assert!(sub.is_dir());
        assert_eq!(plan.calls(Op::Mkdir), 4);
        // n = 0 injects nothing.
        plan.fail_next(Op::Rmdir, 0, failure("never"));
        r.rmdir(&sub).await.unwrap();
    }

    #[tokio::test]
    async fn fail_after_performing_loses_the_reply() {
        let (dir, r, plan) = setup();
        let sub = dir.path().join("sub");
        plan.fail_next_after_performing(Op::Mkdir, 1, RemoteError::Disconnected("lost".into()));
        assert!(r
            .mkdir(&sub, 0o755)
            .await
            .unwrap_err()
            .is_connection_error());
        assert!(sub.is_dir());
        // The retry sees the effect of the first attempt.
        assert_eq!(
            r.mkdir(&sub, 0o755).await.unwrap_err().status(),
            Some(Status::Failure)
        );

        // An open whose reply is lost leaves no handle open on the server.
        plan.fail_next_after_performing(Op::Open, 1, failure("lost"));
        let path = dir.path().join("f");
        assert!(r.open(&path, rw_create(), 0o644).await.is_err());
        assert!(path.exists());
        assert_eq!(r.inner().open_handles(), 0);
    }

    #[tokio::test]
    async fn fail_always_until_cleared() {
        let (dir, r, plan) = setup();
        plan.fail_always(Op::Statvfs, RemoteError::Unsupported("statvfs@openssh.com"));
        for _ in 0..3 {
            assert_eq!(
                r.statvfs(dir.path()).await,
                Err(RemoteError::Unsupported("statvfs@openssh.com"))
            );
        }
        plan.clear_failures(Op::Statvfs);
        r.statvfs(dir.path()).await.unwrap();

        plan.fail_always(Op::Lstat, failure("a"));
        plan.fail_next(Op::Stat, 5, failure("b"));
        plan.clear_all();
        r.lstat(dir.path()).await.unwrap();
        r.stat(dir.path()).await.unwrap();
    }

    #[tokio::test]
    async fn disconnect_then_restore_makes_old_handles_stale() {
        let (dir, r, plan) = setup();
        let path = dir.path().join("f");
        let old = r.open(&path, rw_create(), 0o644).await.unwrap();
        r.write(&old, 0, Bytes::from_static(b"before"))
            .await
            .unwrap();
        assert_eq!(r.inner().open_handles(), 1);

        plan.disconnect();
        assert!(plan.is_disconnected());
        assert_eq!(plan.generation(), 1);
        for result in [
            r.lstat(&path).await.map(drop),
            r.read(&old, 0, 1).await.map(drop),
            r.open(&path, OpenFlags::read_only(), 0).await.map(drop),
            r.close(&old).await,
        ] {
            assert!(
                matches!(result, Err(RemoteError::Disconnected(_))),
                "{result:?}"
            );
        }
        // The server closed the dropped session's handles.
        assert_eq!(r.inner().open_handles(), 0);

        plan.restore();
        assert!(!plan.is_disconnected());
        assert_eq!(r.read(&old, 0, 6).await, Err(RemoteError::StaleHandle));
        assert_eq!(
            r.write(&old, 0, Bytes::from_static(b"x")).await,
            Err(RemoteError::StaleHandle)
        );
        assert_eq!(r.fstat(&old).await, Err(RemoteError::StaleHandle));
        assert_eq!(r.fsync(&old).await, Err(RemoteError::StaleHandle));
        assert_eq!(r.close(&old).await, Err(RemoteError::StaleHandle));

        // Reopening by path works, on the new generation.
        let new = r.open(&path, rw_create().for_reopen(), 0).await.unwrap();
        assert_eq!(new.generation(), 1);
        assert_eq!(&r.read(&new, 0, 6).await.unwrap()[..], b"before");
        r.close(&new).await.unwrap();
        assert_eq!(r.inner().open_handles(), 0);
    }

    #[tokio::test]
    async fn stale_handles_are_reaped_on_request() {
        let (dir, r, plan) = setup();
        let h = r
            .open(&dir.path().join("f"), rw_create(), 0o644)
            .await
            .unwrap();
        plan.disconnect();
        plan.disconnect(); // idempotent
        plan.restore();
        assert_eq!(plan.generation(), 1);
        assert_eq!(r.inner().open_handles(), 1);
        r.reap_stale_handles().await;
        assert_eq!(r.inner().open_handles(), 0);
        assert!(h.inner().is_closed());
    }

    #[tokio::test]
    async fn disconnect_on_a_chosen_call() {
        let (dir, r, plan) = setup();
        let path = dir.path().join("f");
        let h = r.open(&path, rw_create(), 0o644).await.unwrap();
        r.write(&h, 0, Bytes::from_static(b"one")).await.unwrap();

        // The second write never reaches the server.
        plan.disconnect_on_next(Op::Write);
        assert!(matches!(
            r.write(&h, 3, Bytes::from_static(b"two")).await,
            Err(RemoteError::Disconnected(_))
        ));
        assert!(plan.is_disconnected());
        assert_eq!(std::fs::read(&path).unwrap(), b"one");
        plan.restore();

        // This one does, and then the connection drops before the answer.
        let h = r.open(&path, rw_create(), 0).await.unwrap();
        plan.disconnect_after_next(Op::Write);
        assert!(matches!(
            r.write(&h, 3, Bytes::from_static(b"two")).await,
            Err(RemoteError::Disconnected(_))
        ));
        assert!(plan.is_disconnected());
        assert_eq!(std::fs::read(&path).unwrap(), b"onetwo");
        plan.restore();
        assert_eq!(plan.generation(), 2);
        assert_eq!(r.fstat(&h).await, Err(RemoteError::StaleHandle));
        r.lstat(&path).await.unwrap();
        assert_eq!(r.inner().open_handles(), 0);
    }

    #[tokio::test]
    async fn a_call_in_flight_when_the_connection_drops_loses_its_reply() {
        // The inner wrapper's hold stands for a server that has the call and has not answered.
        let dir = tempfile::tempdir().unwrap();
        let slow = FaultyRemote::new(LocalRemote::new());
        let server = Arc::clone(slow.plan());
        server.hold(Op::Mkdir);
        let r = Arc::new(FaultyRemote::new(slow));
        let plan = Arc::clone(r.plan());
        let sub = dir.path().join("sub");
        let call = {
            let (r, sub) = (Arc::clone(&r), sub.clone());
            tokio::spawn(async move { r.mkdir(&sub, 0o755).await })
        };
        server.until_held(Op::Mkdir, 1).await;
        plan.disconnect();
        plan.restore();
        server.release(Op::Mkdir);
        assert!(matches!(
            call.await.unwrap(),
            Err(RemoteError::Disconnected(_))
        ));
        // It happened all the same.
        assert!(sub.is_dir());
    }

    #[tokio::test]
    async fn a_call_still_waiting_to_be_sent_goes_on_the_new_connection() {
        let (dir, r, plan) = setup();
        let r = Arc::new(r);
        plan.hold(Op::Mkdir);
        let sub = dir.path().join("sub");
        let call = {
            let (r, sub) = (Arc::clone(&r), sub.clone());
            tokio::spawn(async move { r.mkdir(&sub, 0o755).await })
        };
        plan.until_held(Op::Mkdir, 1).await;
        plan.disconnect();
        plan.restore();
        plan.release(Op::Mkdir);
        // The call was not yet sent when the connection dropped; it goes on the new one, sent
        // after the restore, so it succeeds.
        call.await.unwrap().unwrap();
        assert!(sub.is_dir());
    }

    #[tokio::test]
    async fn held_calls_wait_until_released() {
        let (dir, r, plan) = setup();
        let r = Arc::new(r);
        plan.hold(Op::Mkdir);
        let spawn_mkdir = |name: &str| {
            let (r, sub) = (Arc::clone(&r), dir.path().join(name));
            tokio::spawn(async move { r.mkdir(&sub, 0o755).await })
        };
        let (a, b) = (spawn_mkdir("a"), spawn_mkdir("b"));
        plan.until_held(Op::Mkdir, 2).await;
        // Other operations go through; the held ones have not reached the remote.
        r.lstat(dir.path()).await.unwrap();
        assert!(!dir.path().join("a").exists() && !dir.path().join("b").exists());
        assert_eq!(plan.calls(Op::Mkdir), 2);
        plan.release(Op::Mkdir);
        a.await.unwrap().unwrap();
        b.await.unwrap().unwrap();
        assert_eq!(plan.waiting_at_hold(Op::Mkdir), 0);
        // clear_all lets held calls go too.
        plan.hold(Op::Mkdir);
        let c = spawn_mkdir("c");
        plan.until_held(Op::Mkdir, 1).await;
        plan.clear_all();
        c.await.unwrap().unwrap();
        assert!(dir.path().join("c").is_dir());
    }

    #[tokio::test]
    async fn short_reads() {
        let (dir, r, plan) = setup();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let h = r.open(&path, OpenFlags::read_only(), 0).await.unwrap();
        plan.set_short_reads(Some(3));
        assert_eq!(&r.read(&h, 0, 10).await.unwrap()[..], b"012");
        assert_eq!(&r.read(&h, 8, 10).await.unwrap()[..], b"89");
        assert_eq!(&r.read(&h, 4, 2).await.unwrap()[..], b"45");
        plan.set_short_reads(None);
        assert_eq!(&r.read(&h, 0, 10).await.unwrap()[..], b"0123456789");
        r.close(&h).await.unwrap();
    }

    #[tokio::test]
    async fn delays_hold_back_their_op_only() {
        let (dir, r, plan) = setup();
        let r = Arc::new(r);
        // An hour: the delayed call cannot be done while the others below are, however slowly
        // this test runs.
        plan.set_op_delay(Op::Lstat, Some(Duration::from_secs(3600)));
        let slow = {
            let (r, path) = (Arc::clone(&r), dir.path().to_owned());
            tokio::spawn(async move { r.lstat(&path).await.map(drop) })
        };
        tokio::task::yield_now().await;
        // Calls of other ops go through meanwhile.
        r.stat(dir.path()).await.unwrap();
        r.realpath(dir.path()).await.unwrap();
        assert!(!slow.is_finished(), "the delayed call was not delayed");
        assert_eq!(plan.calls(Op::Lstat), 1);
        slow.abort();

        // A delay makes a call take at least that long; a global delay applies to every op,
        // and a per-op one takes precedence.
        plan.set_op_delay(Op::Lstat, Some(Duration::from_millis(100)));
        let start = Instant::now();
        r.lstat(dir.path()).await.unwrap();
        assert!(start.elapsed() >= Duration::from_millis(100));
        plan.set_op_delay(Op::Lstat, None);
        plan.set_delay(Some(Duration::from_millis(50)));
        let start = Instant::now();
        r.realpath(dir.path()).await.unwrap();
        assert!(start.elapsed() >= Duration::from_millis(50));
        // With an hour-long global delay, an op given a delay of its own (zero) goes through.
        plan.set_delay(Some(Duration::from_secs(3600)));
        plan.set_op_delay(Op::Lstat, Some(Duration::ZERO));
        r.lstat(dir.path()).await.unwrap();
        plan.set_delay(None);
    }

    #[tokio::test]
    async fn write_queued_is_faulted_as_a_write() {
        let (dir, r, plan) = setup();
        let path = dir.path().join("f");
        let h = r.open(&path, rw_create(), 0o644).await.unwrap();
        let ack = r
            .write_queued(&h, 0, Bytes::from_static(b"abc"))
            .await
            .unwrap();
        ack.await.unwrap();
        plan.fail_next_after_performing(Op::Write, 1, failure("lost"));
        let ack = r
            .write_queued(&h, 3, Bytes::from_static(b"def"))
            .await
            .unwrap();
        assert_eq!(ack.await, Err(failure("lost")));
        plan.fail_next(Op::Write, 1, failure("refused"));
        assert_eq!(
            r.write_queued(&h, 6, Bytes::from_static(b"ghi"))
                .await
                .err(),
            Some(failure("refused"))
        );
        assert_eq!(plan.calls(Op::Write), 3);
        assert_eq!(std::fs::read(&path).unwrap(), b"abcdef");
        r.close(&h).await.unwrap();
    }

    #[tokio::test]
    async fn the_plan_can_be_shared_between_wrappers() {
        let dir = tempfile::tempdir().unwrap();
        let plan = Arc::new(FaultPlan::new());
        let a = FaultyRemote::with_plan(LocalRemote::new(), Arc::clone(&plan));
        let b = FaultyRemote::with_plan(LocalRemote::new(), Arc::clone(&plan));
        plan.fail_next(Op::Lstat, 1, failure("once"));
        assert!(a.lstat(dir.path()).await.is_err());
        b.lstat(dir.path()).await.unwrap();
        assert_eq!(plan.calls(Op::Lstat), 2);
    }
}
