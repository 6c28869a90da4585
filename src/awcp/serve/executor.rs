//! The executor's delegations and what each protocol message does to them.
//!
//! Every change of a delegation goes through [`Delegation::update`], which applies it under
//! the record's lock, persists the record, and wakes SSE subscribers when events were added.
//! State changes follow the assignment state machine (`pending -> active -> completed|error`);
//! the first terminal outcome wins, so a cancel racing the task's end cannot report twice.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};

use super::config::{ServeConfig, TaskConfig};
use super::store::{Outcome, Record, Store};
use crate::awcp::protocol::{
    Accept, AcceptTag, Access, AssignmentEvent, AssignmentState, DelegationId, ErrorCode,
    ErrorMessage, ExecutorConstraints, Invite, Message, Start, TaskEvent, TransportHandle, WorkDir,
    V1,
};
use crate::policy::lease::{format_rfc3339, parse_rfc3339};
use crate::policy::Policy;

/// Everything `serve` runs with.
pub struct Settings {
    pub policy: Policy,
    /// Absolute; passed to every mount process.
    pub policy_path: PathBuf,
    /// The policy's mount root, resolved (mountinfo shows resolved paths).
    pub mount_root: PathBuf,
    pub serve: ServeConfig,
    pub task: TaskConfig,
    /// This program, run for each mount.
    pub binary: PathBuf,
}

/// A message from the HTTP side to a running delegation's supervisor.
#[derive(Debug)]
pub enum Control {
    Cancel {
        code: ErrorCode,
        message: String,
    },
    Done {
        summary: String,
        highlights: Vec<String>,
    },
}

pub struct Delegation {
    pub id: DelegationId,
    record: Mutex<Record>,
    events: watch::Sender<usize>,
    control: Mutex<Option<mpsc::UnboundedSender<Control>>>,
    store: Store,
}

impl Delegation {
    pub fn new(record: Record, store: Store) -> Arc<Delegation> {
        let (events, _) = watch::channel(record.events.len());
        Arc::new(Delegation {
            id: record.id.clone(),
            record: Mutex::new(record),
            events,
            control: Mutex::new(None),
            store,
        })
    }

    pub fn snapshot(&self) -> Record {
        self.record.lock().unwrap().clone()
    }

    /// Read part of the record without copying it (a snapshot copies the prompt and every
    /// event: admission looks at every delegation on each INVITE).
    pub fn peek<T>(&self, f: impl FnOnce(&Record) -> T) -> T {
        f(&self.record.lock().unwrap())
    }

    /// Change the record, persist it, wake subscribers.
    pub fn update<T>(&self, f: impl FnOnce(&mut Record) -> T) -> T {
        let mut r = self.record.lock().unwrap();
        let out = f(&mut r);
        if let Err(e) = self.store.save(&r) {
            tracing::error!(id = %self.id, "cannot persist the delegation: {e}");
        }
        self.events.send_replace(r.events.len());
        out
    }

    pub fn emit(&self, e: TaskEvent) {
        self.update(|r| r.push_event(e));
    }

    /// Record the outcome, once: the terminal event, the final state. Returns false if the
    /// delegation had already ended.
    pub fn finish(&self, outcome: Outcome) -> bool {
        self.finish_when(outcome, |s| !s.is_terminal())
    }

    /// [`Delegation::finish`] only if it is still pending, checked in the same step: a START
    /// claiming it meanwhile wins, and its supervisor is told instead.
    pub fn finish_pending(&self, outcome: Outcome) -> bool {
        self.finish_when(outcome, |s| s == AssignmentState::Pending)
    }

    fn finish_when(&self, outcome: Outcome, when: impl FnOnce(AssignmentState) -> bool) -> bool {
        self.update(|r| {
            if r.state.is_terminal() || !when(r.state) {
                return false;
            }
            let ev = match &outcome {
                Outcome::Done { .. } => AssignmentEvent::TaskComplete,
                Outcome::Error {
                    code: ErrorCode::Cancelled,
                    ..
                } => AssignmentEvent::Cancel,
                Outcome::Error { .. } if r.state == AssignmentState::Pending => {
                    AssignmentEvent::Cancel
                }
                Outcome::Error { .. } => AssignmentEvent::TaskFail,
            };
            match r.state.on(ev) {
                Ok(s) => r.state = s,
                Err(e) => {
                    tracing::error!(id = %r.id, "{e}");
                    r.state = AssignmentState::Error;
                }
            }
            let id = r.id.as_str().to_string();
            r.push_event(match &outcome {
                Outcome::Done {
                    summary,
                    highlights,
                } => TaskEvent::done(&id, summary.clone(), highlights.clone()),
                Outcome::Error {
                    code,
                    message,
                    hint,
                } => TaskEvent::error(&id, code.clone(), message.clone(), hint.clone()),
            });
            r.finished_at = Some(TaskEvent::now());
            if let Some(url) = r.reply_url.clone() {
                send_to_host(url, r.id.as_str(), &outcome);
            }
            r.outcome = Some(outcome);
            true
        })
    }

    pub fn subscribe(&self) -> watch::Receiver<usize> {
        self.events.subscribe()
    }

    /// Events from index `from`, and whether the stream is complete after them.
    pub fn events_from(&self, from: usize) -> (Vec<TaskEvent>, bool) {
        let r = self.record.lock().unwrap();
        let batch: Vec<TaskEvent> = r.events.iter().skip(from).cloned().collect();
        (batch, r.terminal_event().is_some())
    }

    pub fn set_control(&self, tx: Option<mpsc::UnboundedSender<Control>>) {
        *self.control.lock().unwrap() = tx;
    }

    /// Hand a control message to the supervisor; false when none runs.
    pub fn send(&self, c: Control) -> bool {
        match self.control.lock().unwrap().as_ref() {
            Some(tx) => tx.send(c).is_ok(),
            None => false,
        }
    }
}

/// A2A binding: DONE or ERROR to the host's A2A endpoint, in the background.
fn send_to_host(url: String, id: &str, outcome: &Outcome) {
    let http = match outcome {
        Outcome::Done {
            summary,
            highlights,
        } => serde_json::json!({"version": "1", "type": "DONE", "delegationId": id,
            "finalSummary": summary, "highlights": highlights}),
        Outcome::Error {
            code,
            message,
            hint,
        } => serde_json::json!({"version": "1", "type": "ERROR", "delegationId": id,
            "code": code, "message": message, "hint": hint.clone().unwrap_or_default()}),
    };
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let id = id.to_string();
    rt.spawn(async move {
        match crate::awcp::a2a::send(&url, crate::awcp::a2a::to_spec(&http)).await {
            Ok(_) => tracing::info!(%id, "result sent to the host's A2A endpoint"),
            Err(e) => tracing::warn!(%id, "cannot send the result to the host: {e}"),
        }
    });
}

/// An HTTP-level refusal: status code and `{"error": ...}` (plus the protocol code when the
/// refusal is one).
#[derive(Debug, Clone)]
pub struct Refusal {
    pub status: u16,
    pub error: String,
    pub code: Option<ErrorCode>,
    pub hint: Option<String>,
}

impl Refusal {
    pub fn new(status: u16, error: impl Into<String>) -> Refusal {
        Refusal {
            status,
            error: error.into(),
            code: None,
            hint: None,
        }
    }

    pub fn not_found(id: &str) -> Refusal {
        Refusal::new(404, format!("Delegation not found: {id}"))
    }
}

pub struct Executor {
    pub settings: Settings,
    pub store: Store,
    delegations: Mutex<BTreeMap<DelegationId, Arc<Delegation>>>,
    /// Held through one INVITE's admission, so concurrent INVITEs cannot both take the last
    /// slot (or the same id).
    admission: Mutex<()>,
}

fn refuse(id: &str, code: ErrorCode, message: String, hint: &str) -> Message {
    Message::Error(ErrorMessage::new(id, code, message, Some(hint.to_string())))
}

/// The most finished delegations kept (see [`Executor::make_room_for_results`]).
pub const MAX_FINISHED_KEPT: usize = 256;

/// How long a finished delegation's result is kept: the INVITE's `retentionMs` if it asked
/// for less than the policy's `retention_seconds`, else that (saturating, never overflowing).
fn granted_retention_ms(asked: Option<u64>, retention_seconds: u64) -> u64 {
    let most = retention_seconds.saturating_mul(1000);
    asked.unwrap_or(most).min(most)
}

/// Constant-time comparison, so the token cannot be guessed byte by byte from timings.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

impl Executor {
    pub fn new(settings: Settings, store: Store, records: Vec<Record>) -> Arc<Executor> {
        let map = records
            .into_iter()
            .map(|r| (r.id.clone(), Delegation::new(r, store.clone())))
            .collect();
        Arc::new(Executor {
            settings,
            store,
            delegations: Mutex::new(map),
            admission: Mutex::new(()),
        })
    }

    pub fn get(&self, id: &DelegationId) -> Option<Arc<Delegation>> {
        self.delegations.lock().unwrap().get(id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Delegation>> {
        self.delegations.lock().unwrap().values().cloned().collect()
    }

    fn count(&self, state: AssignmentState) -> usize {
        self.all()
            .iter()
            .filter(|d| d.peek(|r| r.state) == state)
            .count()
    }

    /// INVITE: admission, then a fresh mount point, then ACCEPT (or an ERROR refusal).
    pub fn invite(&self, inv: Invite, client: IpAddr) -> Message {
        let _admission = self.admission.lock().unwrap();
        let s = &self.settings;
        let raw_id = inv.delegation_id.clone();
        let id = match DelegationId::parse(&raw_id) {
            Ok(id) => id,
            Err(e) => {
                return refuse(
                    &raw_id,
                    ErrorCode::Declined,
                    e,
                    "use an id of letters, digits, '_' and '-'",
                )
            }
        };
        if let Some(token) = &s.serve.token {
            let ok = inv
                .auth
                .as_ref()
                .is_some_and(|a| same_secret(&a.credential, token));
            if !ok {
                tracing::warn!(%client, id = %id, "INVITE refused: missing or wrong auth credential");
                return refuse(
                    &raw_id,
                    ErrorCode::AuthFailed,
                    "INVITE.auth is missing or its credential is not the one this executor expects"
                        .into(),
                    "send the executor's token in INVITE.auth.credential",
                );
            }
        }
        if let Some(t) = inv
            .requirements
            .as_ref()
            .and_then(|r| r.transport.as_deref())
        {
            if t != "sshfs" {
                return refuse(
                    &raw_id,
                    ErrorCode::DepMissing,
                    format!("transport '{t}' is not supported by this executor"),
                    "this executor mounts workspaces with transport 'sshfs' only",
                );
            }
        }
        if self.get(&id).is_some() {
            return refuse(
                &raw_id,
                ErrorCode::Declined,
                format!("delegation id {id} is already in use on this executor"),
                "use a fresh delegation id",
            );
        }
        let active = self.count(AssignmentState::Active);
        if active >= s.serve.max_concurrent {
            return refuse(
                &raw_id,
                ErrorCode::Declined,
                format!(
                    "Maximum concurrent delegations reached ({active} of {})",
                    s.serve.max_concurrent
                ),
                "Try again later when current tasks complete",
            );
        }
        self.make_room_for_results();
        let pending = self.count(AssignmentState::Pending);
        if pending >= s.serve.max_pending {
            return refuse(
                &raw_id,
                ErrorCode::Declined,
                format!(
                    "Maximum pending invitations reached ({pending} of {})",
                    s.serve.max_pending
                ),
                "Try again later, or START the invitations already accepted",
            );
        }
        // Narrow rather than refuse: lower TTL, rw -> ro.
        let ttl = inv.lease.ttl_seconds.min(s.serve.max_ttl_seconds);
        let access: Access = s.policy.grant(inv.lease.access_mode.into()).into();
        let mount_point = id.path_in(&s.mount_root);
        if let Err(m) = self.create_mount_point(&mount_point) {
            return refuse(
                &raw_id,
                ErrorCode::MountpointDenied,
                m,
                "the executor's mount root is misconfigured or holds a leftover of this id",
            );
        }
        let retention_ms = granted_retention_ms(inv.retention_ms, s.serve.retention_seconds);
        let record = Record {
            id: id.clone(),
            state: AssignmentState::Pending,
            client: client.to_string(),
            created_at: TaskEvent::now(),
            task: inv.task.clone(),
            requested_access: inv.lease.access_mode,
            access,
            ttl_seconds: ttl,
            retention_ms,
            mount_point: mount_point.clone(),
            started_at: None,
            expires_at: None,
            remote: None,
            mount_process: None,
            task_process: None,
            finished_at: None,
            outcome: None,
            reply_url: None,
            events: Vec::new(),
        };
        if let Err(e) = self.store.save(&record) {
            crate::awcp::serve::mounter::remove_mount_point(&mount_point);
            return refuse(
                &raw_id,
                ErrorCode::Declined,
                format!("cannot record the delegation: {e}"),
                "the executor's state directory is not writable",
            );
        }
        tracing::info!(id = %id, %client, %access, ttl, "INVITE accepted");
        self.delegations
            .lock()
            .unwrap()
            .insert(id.clone(), Delegation::new(record, self.store.clone()));
        Message::Accept(Accept {
            version: V1,
            kind: AcceptTag,
            delegation_id: raw_id,
            retention_ms: Some(retention_ms),
            executor_work_dir: WorkDir {
                path: mount_point.display().to_string(),
            },
            executor_constraints: Some(ExecutorConstraints {
                accepted_access_mode: Some(access),
                max_ttl_seconds: Some(ttl),
                sandbox_profile: Some(s.task.sandbox_profile()),
            }),
        })
    }

    /// `<mount_root>/<id>`: created fresh (it must not exist), mode 0700, then checked by the
    /// policy's own mount point rules, as the mount process will check it again.
    fn create_mount_point(&self, mp: &std::path::Path) -> Result<(), String> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(mp)
            .map_err(|e| format!("cannot create mount point {}: {e}", mp.display()))?;
        if let Err(d) = crate::policy::mountpoint::verdict(&self.settings.policy, mp) {
            let _ = std::fs::remove_dir(mp);
            return Err(format!("MOUNTPOINT_DENIED: {d}"));
        }
        Ok(())
    }

    /// Whether `peer` is the client that invited the delegation `r`, or this machine's
    /// operator (127.0.0.1 or ::1): who may see its events, result and status.
    pub fn may_see(r: &Record, peer: IpAddr) -> bool {
        let operator = match peer {
            IpAddr::V4(a) => a == std::net::Ipv4Addr::LOCALHOST,
            IpAddr::V6(a) => {
                a == std::net::Ipv6Addr::LOCALHOST
                    || a.to_ipv4_mapped() == Some(std::net::Ipv4Addr::LOCALHOST)
            }
        };
        operator || r.client == peer.to_string()
    }

    /// Whether `peer` may act on the delegation `r` (`what`: START, ERROR, cancel, ack): the
    /// client that invited it, or this machine's own operator (`awcp-mount cancel` talks to
    /// 127.0.0.1 or ::1). Another delegator allowed to use this executor must not start,
    /// cancel or end someone else's delegation (the reference executor let anyone).
    pub fn may_act(r: &Record, peer: IpAddr, what: &str) -> Result<(), Refusal> {
        if Self::may_see(r, peer) {
            return Ok(());
        }
        tracing::warn!(id = %r.id, %peer, client = %r.client, "{what} refused: not the inviting client");
        Err(Refusal::new(
            403,
            format!(
                "delegation {} was invited by {}; {what} from {peer} is refused",
                r.id, r.client
            ),
        ))
    }

    /// START: checks, then the supervisor takes over in the background.
    pub fn start(self: &Arc<Self>, start: Start, peer: IpAddr) -> Result<(), Refusal> {
        let id = DelegationId::parse(&start.delegation_id)
            .map_err(|e| Refusal::new(400, format!("delegationId: {e}")))?;
        let d = self
            .get(&id)
            .ok_or_else(|| Refusal::not_found(id.as_str()))?;
        let r = d.snapshot();
        Self::may_act(&r, peer, "START")?;
        let not_pending = |state: AssignmentState| {
            Refusal::new(
                409,
                format!(
                    "delegation {id} is {}, not pending: START is not valid now",
                    state.as_str()
                ),
            )
        };
        if r.state != AssignmentState::Pending {
            return Err(not_pending(r.state));
        }
        let fail = |code: ErrorCode, message: String, hint: &str| {
            // (Only while still pending: a START racing this one may have begun the task.)
            if d.finish_pending(Outcome::Error {
                code: code.clone(),
                message: message.clone(),
                hint: Some(hint.to_string()),
            }) {
                super::mounter::remove_mount_point(&r.mount_point);
            }
            Refusal {
                status: 400,
                error: message,
                code: Some(code),
                hint: Some(hint.to_string()),
            }
        };
        let handle = match start.transport_handle {
            TransportHandle::Sshfs(h) => h,
            other => {
                return Err(fail(
                    ErrorCode::DepMissing,
                    format!(
                        "transport '{}' is not supported by this executor",
                        other.transport()
                    ),
                    "this executor mounts workspaces with transport 'sshfs' only",
                ))
            }
        };
        let expires = parse_rfc3339(&start.lease.expires_at)
            .map_err(|e| Refusal::new(400, format!("lease.expiresAt: {e}")))?;
        let now = SystemTime::now();
        if expires <= now {
            return Err(fail(
                ErrorCode::StartExpired,
                format!(
                    "Lease expired before START message was received (expiresAt {})",
                    start.lease.expires_at
                ),
                "send START before the lease expires",
            ));
        }
        // The lease binds us to the narrower of START's expiry and the TTL we granted.
        let effective = expires.min(now + Duration::from_secs(r.ttl_seconds));
        // START may only narrow the access ACCEPT granted.
        let access = if start.lease.access_mode == Access::Ro {
            Access::Ro
        } else {
            r.access
        };
        // From here on, one START wins: the check of the state and its change are one step
        // (two STARTs at once both saw it pending; a START racing the reaper brought an
        // expired delegation back). `max_concurrent` holds for STARTs too, not only INVITEs.
        let _admission = self.admission.lock().unwrap();
        let active = self.count(AssignmentState::Active);
        if active >= self.settings.serve.max_concurrent {
            return Err(Refusal::new(
                409,
                format!(
                    "Maximum concurrent delegations reached ({active} of {}); the delegation stays pending",
                    self.settings.serve.max_concurrent
                ),
            ));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let claimed = d.update(|rec| {
            if rec.state != AssignmentState::Pending {
                return Err(not_pending(rec.state));
            }
            d.set_control(Some(tx));
            rec.state = rec
                .state
                .on(AssignmentEvent::ReceiveStart)
                .unwrap_or(AssignmentState::Active);
            rec.access = access;
            rec.started_at = Some(TaskEvent::now());
            rec.expires_at = Some(format_rfc3339(effective));
            rec.remote = Some(format!(
                "{}@{}:{}:{}",
                handle.endpoint.user,
                handle.endpoint.host,
                handle.endpoint.port,
                handle.export_locator
            ));
            Ok(())
        });
        drop(_admission);
        claimed?;
        tracing::info!(id = %id, expires = %format_rfc3339(effective), "START accepted");
        let exec = self.clone();
        use tracing::Instrument;
        let span = tracing::info_span!("delegation", id = %id);
        tokio::spawn(super::supervisor::run(exec, d, handle, effective, rx).instrument(span));
        Ok(())
    }

    /// ERROR from the delegator: abort that delegation.
    pub fn remote_error(&self, e: ErrorMessage, peer: IpAddr) -> Result<(), Refusal> {
        let id = DelegationId::parse(&e.delegation_id)
            .map_err(|x| Refusal::new(400, format!("delegationId: {x}")))?;
        if let Some(d) = self.get(&id) {
            Self::may_act(&d.snapshot(), peer, "ERROR")?;
        }
        let message = format!("cancelled by the delegator: {}: {}", e.code, e.message);
        self.cancel_with(&id, ErrorCode::Cancelled, message)
            .map(|_| ())
    }

    /// `POST /cancel/:id`. Ok(false): it had already ended.
    pub fn cancel(&self, id: &DelegationId, peer: IpAddr) -> Result<bool, Refusal> {
        if let Some(d) = self.get(id) {
            Self::may_act(&d.snapshot(), peer, "cancel")?;
        }
        self.cancel_with(id, ErrorCode::Cancelled, "Delegation cancelled".into())
    }

    fn cancel_with(
        &self,
        id: &DelegationId,
        code: ErrorCode,
        message: String,
    ) -> Result<bool, Refusal> {
        let d = self
            .get(id)
            .ok_or_else(|| Refusal::not_found(id.as_str()))?;
        let r = d.snapshot();
        let outcome = || Outcome::Error {
            code: code.clone(),
            message: message.clone(),
            hint: None,
        };
        // Pending, and still pending as it ends (a START may claim it in between: then it
        // is active, and its supervisor is told below).
        if r.state == AssignmentState::Pending && d.finish_pending(outcome()) {
            super::mounter::remove_mount_point(&r.mount_point);
            return Ok(true);
        }
        match d.snapshot().state {
            AssignmentState::Completed | AssignmentState::Error => Ok(false),
            AssignmentState::Pending => Ok(false),
            AssignmentState::Active => {
                if !d.send(Control::Cancel {
                    code: code.clone(),
                    message: message.clone(),
                }) {
                    // No supervisor (it just ended): record it directly.
                    d.finish(Outcome::Error {
                        code,
                        message,
                        hint: None,
                    });
                }
                Ok(true)
            }
        }
    }

    /// `awcp-mount done`: the executor's agent reports the result itself.
    pub fn done(
        &self,
        id: &DelegationId,
        summary: String,
        highlights: Vec<String>,
    ) -> Result<(), Refusal> {
        let d = self
            .get(id)
            .ok_or_else(|| Refusal::not_found(id.as_str()))?;
        match d.snapshot().state {
            AssignmentState::Active => {
                if d.send(Control::Done {
                    summary,
                    highlights,
                }) {
                    Ok(())
                } else {
                    Err(Refusal::new(
                        409,
                        format!("delegation {id} is ending already"),
                    ))
                }
            }
            s => Err(Refusal::new(
                409,
                format!("delegation {id} is {}, not active", s.as_str()),
            )),
        }
    }

    /// `POST /tasks/:id/ack`: forget a finished delegation and release what is left.
    pub fn ack(&self, id: &DelegationId, peer: IpAddr) -> Result<(), Refusal> {
        let Some(d) = self.get(id) else {
            return Ok(());
        };
        let r = d.snapshot();
        Self::may_act(&r, peer, "ack")?;
        if !r.state.is_terminal() {
            return Err(Refusal::new(
                409,
                format!("delegation {id} is {}; cancel it first", r.state.as_str()),
            ));
        }
        self.forget(&d);
        Ok(())
    }

    /// A2A binding: where this delegation's DONE/ERROR go.
    pub fn set_reply_url(&self, id: &str, url: &str) {
        if let Some(d) = DelegationId::parse(id).ok().and_then(|i| self.get(&i)) {
            d.update(|r| r.reply_url = Some(url.to_string()));
        }
    }

    pub fn forget(&self, d: &Arc<Delegation>) {
        let r = d.snapshot();
        super::mounter::remove_mount_point(&r.mount_point);
        self.store.remove(&d.id);
        self.delegations.lock().unwrap().remove(&d.id);
        tracing::info!(id = %d.id, "delegation released");
    }

    /// Keep at most [`MAX_FINISHED_KEPT`] finished delegations (their results and events,
    /// prompt included) in memory and in the state directory: past it, the oldest finished
    /// goes before its retention is over. Without a bound, INVITE-and-cancel in a loop would
    /// fill both for as long as the retention (7 days by default).
    fn make_room_for_results(&self) {
        let mut finished: Vec<(String, Arc<Delegation>)> = self
            .all()
            .into_iter()
            .filter_map(|d| {
                let finished = d.peek(|r| {
                    r.state
                        .is_terminal()
                        .then(|| r.finished_at.clone().unwrap_or_default())
                });
                finished.map(|at| (at, d))
            })
            .collect();
        if finished.len() < MAX_FINISHED_KEPT {
            return;
        }
        // RFC 3339 times in UTC sort as text.
        finished.sort_by(|a, b| a.0.cmp(&b.0));
        for (_, d) in finished.iter().take(finished.len() + 1 - MAX_FINISHED_KEPT) {
            tracing::info!(id = %d.id, "forgetting a finished delegation early: {MAX_FINISHED_KEPT} are kept at most");
            self.forget(d);
        }
    }

    /// Housekeeping: pending invitations whose lease would be over, finished results past
    /// their retention.
    pub fn reap(&self) {
        let now = SystemTime::now();
        for d in self.all() {
            let r = d.snapshot();
            let age = |t: &str| {
                parse_rfc3339(t)
                    .ok()
                    .and_then(|t| now.duration_since(t).ok())
                    .unwrap_or_default()
            };
            match r.state {
                // (Unless a START claimed it just now: `finish_pending` checks again.)
                AssignmentState::Pending
                    if age(&r.created_at) > Duration::from_secs(r.ttl_seconds)
                        && d.finish_pending(Outcome::Error {
                            code: ErrorCode::Expired,
                            message: format!(
                                "no START arrived within the lease TTL ({} s)",
                                r.ttl_seconds
                            ),
                            hint: Some("invite again".into()),
                        }) =>
                {
                    super::mounter::remove_mount_point(&r.mount_point);
                }
                AssignmentState::Completed | AssignmentState::Error
                    if r.finished_at.as_deref().map(age).unwrap_or_default()
                        > Duration::from_millis(r.retention_ms) =>
                {
                    self.forget(&d);
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The INVITE may ask for a shorter retention, never a longer one; a policy value whose
    /// milliseconds do not fit in 64 bits used to overflow (the policy refuses it now too).
    #[test]
    fn retention_is_the_shorter_and_never_overflows() {
        assert_eq!(granted_retention_ms(None, 604_800), 604_800_000);
        assert_eq!(granted_retention_ms(Some(5_000), 604_800), 5_000);
        assert_eq!(granted_retention_ms(Some(u64::MAX), 10), 10_000);
        assert_eq!(granted_retention_ms(None, u64::MAX), u64::MAX);
        assert_eq!(granted_retention_ms(Some(7), u64::MAX), 7);
    }
}
