//! The HTTP routes of `serve` (section 2 of the wire notes), the SSE stream, the A2A binding's
//! endpoint and agent card, and the access control in front of all of them.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tracing::Instrument;

use super::executor::{Delegation, Executor, Refusal};
use super::store::Outcome;
use crate::awcp::protocol::{AssignmentState, DelegationId, ErrorCode, Message, TaskEvent};

type Exec = State<Arc<Executor>>;

pub fn router(exec: Arc<Executor>) -> Router {
    let max = exec.settings.serve.max_body_bytes;
    Router::new()
        .route("/awcp", post(message))
        .route("/awcp/", post(message))
        .route("/awcp/tasks/{id}/events", get(events))
        .route("/awcp/tasks/{id}/result", get(result))
        .route("/awcp/tasks/{id}/ack", post(ack))
        .route("/awcp/tasks/{id}/done", post(done))
        .route("/awcp/status", get(status))
        .route("/awcp/cancel/{id}", post(cancel))
        .route("/a2a", post(a2a))
        .route("/.well-known/agent.json", get(agent_card))
        .route("/.well-known/agent-card.json", get(agent_card))
        .fallback(|| async { reply(404, json!({"error": "no such route"})) })
        .layer(DefaultBodyLimit::max(max))
        .layer(middleware::from_fn_with_state(exec.clone(), bounded_body))
        .layer(middleware::from_fn_with_state(exec.clone(), guard))
        .with_state(exec)
}

fn reply(status: u16, body: Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(body)).into_response()
}

fn refusal(r: Refusal) -> Response {
    let mut body = json!({"error": r.error});
    if let Some(c) = r.code {
        body["code"] = json!(c);
    }
    if let Some(h) = r.hint {
        body["hint"] = json!(h);
    }
    reply(r.status, body)
}

/// Only listed client addresses get anything at all; a span per request.
async fn guard(
    State(exec): Exec,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
    next: Next,
) -> Response {
    let span =
        tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), %peer);
    let allowed = exec
        .settings
        .serve
        .allowed_clients
        .iter()
        .any(|c| c.contains(peer.ip()));
    if !allowed {
        span.in_scope(|| tracing::warn!("refused: client not in [serve] allowed_clients"));
        return reply(
            403,
            json!({"error": format!("client {} is not allowed to use this executor ([serve] allowed_clients)", peer.ip())}),
        );
    }
    async move {
        let resp = next.run(req).await;
        tracing::debug!(status = resp.status().as_u16(), "answered");
        resp
    }
    .instrument(span)
    .await
}

/// How much of a body over `[serve] max_body_bytes` is read (and thrown away) before the 413
/// goes out; past it the connection is closed.
const DRAIN_LIMIT: usize = 64 * 1024 * 1024;

/// How long a request's body may take to arrive.
const BODY_READ_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A body over the limit is read to its end (up to [`DRAIN_LIMIT`], keeping nothing past the
/// limit) before the 413 is answered. A server that answers and closes with unread data in
/// its socket makes the kernel reset the connection, and a client still sending then sees
/// "connection reset" instead of the 413 and its message (the lingering close of web
/// servers). A body within the limit goes on to the route as it came.
async fn bounded_body(State(exec): Exec, req: Request, next: Next) -> Response {
    use futures_util::StreamExt as _;
    let max = exec.settings.serve.max_body_bytes;
    let (parts, body) = req.into_parts();
    let mut chunks = body.into_data_stream();
    let mut kept = bytes::BytesMut::new();
    let mut total = 0usize;
    let read = async {
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| {
                reply(
                    400,
                    json!({"error": format!("cannot read the request body: {e}")}),
                )
            })?;
            total = total.saturating_add(chunk.len());
            if total <= max {
                kept.extend_from_slice(&chunk);
            } else if total > DRAIN_LIMIT {
                break;
            }
        }
        Ok(())
    };
    // A client that sends its body slowly, or never ends it, must not hold a connection
    // (and its buffers) for ever.
    match tokio::time::timeout(BODY_READ_WAIT, read).await {
        Ok(Ok(())) => {}
        Ok(Err(refused)) => return refused,
        // (Past the limit already: the 413 it would have got.)
        Err(_) if total > max => return too_large(max),
        Err(_) => {
            return reply(
                408,
                json!({"error": format!("the request body did not arrive within {BODY_READ_WAIT:?}; send it whole, at once")}),
            )
        }
    }
    if total > max {
        tracing::debug!(total, "request body over the limit");
        return too_large(max);
    }
    let req = Request::from_parts(parts, axum::body::Body::from(kept.freeze()));
    next.run(req).await
}

fn too_large(max: usize) -> Response {
    reply(
        413,
        json!({"error": format!("request body larger than {max} bytes ([serve] max_body_bytes)")}),
    )
}

fn body_error(rej: BytesRejection, max: usize) -> Response {
    if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
        too_large(max)
    } else {
        reply(
            400,
            json!({"error": format!("cannot read the request body: {rej}")}),
        )
    }
}

fn parse_id(id: &str) -> Result<DelegationId, Refusal> {
    DelegationId::parse(id).map_err(|e| Refusal::new(400, format!("delegation id: {e}")))
}

/// `POST /awcp`: INVITE -> ACCEPT|ERROR; START -> {"ok":true}; ERROR -> abort.
async fn message(
    State(exec): Exec,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let max = exec.settings.serve.max_body_bytes;
    let body = match body {
        Ok(b) => b,
        Err(rej) => return body_error(rej, max),
    };
    match handle_message(&exec, &body, peer) {
        Ok(v) => reply(200, v),
        Err(r) => refusal(r),
    }
}

/// The binding-independent part, shared with A2A: the message in, the answer out.
pub fn handle_message(
    exec: &Arc<Executor>,
    body: &[u8],
    peer: SocketAddr,
) -> Result<Value, Refusal> {
    let msg = Message::parse(body).map_err(|e| {
        tracing::info!("refused message: {e}");
        // A START whose credential cannot be used ends that delegation (AUTH_FAILED).
        if e.code == ErrorCode::AuthFailed {
            if let Some(id) = &e.delegation_id {
                exec.fail_pending(id, e.code.clone(), e.to_string(), peer.ip());
            }
        }
        Refusal {
            status: 400,
            error: e.to_string(),
            code: (e.code != ErrorCode::Declined).then_some(e.code.clone()),
            hint: None,
        }
    })?;
    tracing::info!(kind = msg.kind(), id = msg.delegation_id(), "message");
    match msg {
        Message::Invite(i) => {
            Ok(serde_json::to_value(exec.invite(i, peer.ip())).unwrap_or_default())
        }
        Message::Start(s) => exec.start(s, peer.ip()).map(|()| json!({"ok": true})),
        Message::Error(e) => exec
            .remote_error(e, peer.ip())
            .map(|()| json!({"ok": true})),
        Message::Accept(_) | Message::Done(_) => Err(Refusal::new(
            400,
            format!(
                "{} is sent by executors; this endpoint is an executor",
                msg.kind()
            ),
        )),
    }
}

fn sse_event(e: &TaskEvent) -> Event {
    Event::default().data(serde_json::to_string(e).unwrap_or_default())
}

/// `GET /awcp/tasks/:id/events`: everything buffered, then live events, ending after the
/// terminal one. An unknown id gets one `error` event with `NOT_FOUND`.
async fn events(
    State(exec): Exec,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
) -> Response {
    let keep = KeepAlive::new()
        .interval(Duration::from_secs(30))
        .text("keepalive");
    let d = DelegationId::parse(&id).ok().and_then(|i| exec.get(&i));
    if let Some(d) = &d {
        // A task's progress and output are its delegator's (and the operator's) only.
        if let Err(r) = Executor::may_act(&d.snapshot(), peer.ip(), "events") {
            return refusal(r);
        }
    }
    let Some(d) = d else {
        let e = TaskEvent::error(
            &id,
            ErrorCode::NotFound,
            "Delegation not found".into(),
            None,
        );
        let once = futures_util::stream::iter([Ok::<Event, Infallible>(sse_event(&e))]);
        return Sse::new(once).keep_alive(keep).into_response();
    };
    Sse::new(event_stream(d)).keep_alive(keep).into_response()
}

fn event_stream(d: Arc<Delegation>) -> impl futures_util::Stream<Item = Result<Event, Infallible>> {
    let rx = d.subscribe();
    let state = (d, rx, 0usize, VecDeque::<TaskEvent>::new(), false);
    futures_util::stream::unfold(
        state,
        |(d, mut rx, mut idx, mut queue, mut ended)| async move {
            loop {
                if let Some(ev) = queue.pop_front() {
                    let item = Ok(sse_event(&ev));
                    return Some((item, (d, rx, idx, queue, ended)));
                }
                if ended {
                    return None;
                }
                // Mark the current count seen *before* reading, so nothing added in between is
                // missed.
                rx.borrow_and_update();
                let (batch, _) = d.events_from(idx);
                idx += batch.len();
                for ev in batch {
                    let last = ev.is_terminal();
                    queue.push_back(ev);
                    if last {
                        ended = true;
                        break;
                    }
                }
                if queue.is_empty() && rx.changed().await.is_err() {
                    return None;
                }
            }
        },
    )
}

/// `GET /awcp/tasks/:id/result`.
async fn result(
    State(exec): Exec,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
) -> Response {
    let d = DelegationId::parse(&id).ok().and_then(|i| exec.get(&i));
    let Some(d) = d else {
        return reply(404, json!({"status": "not_found"}));
    };
    let r = d.snapshot();
    if let Err(refused) = Executor::may_act(&r, peer.ip(), "result") {
        return refusal(refused);
    }
    let mut v = match (&r.state, &r.outcome) {
        (
            _,
            Some(Outcome::Done {
                summary,
                highlights,
            }),
        ) => {
            json!({"status": "completed", "summary": summary, "highlights": highlights})
        }
        (
            _,
            Some(Outcome::Error {
                code,
                message,
                hint,
            }),
        ) => {
            let mut e = json!({"code": code, "message": message});
            if let Some(h) = hint {
                e["hint"] = json!(h);
            }
            json!({"status": "error", "error": e})
        }
        _ => json!({"status": "running"}),
    };
    if let Some(t) = &r.finished_at {
        v["completedAt"] = json!(t);
    }
    reply(200, v)
}

async fn ack(
    State(exec): Exec,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
) -> Response {
    let id = match parse_id(&id) {
        Ok(i) => i,
        Err(r) => return refusal(r),
    };
    match exec.ack(&id, peer.ip()) {
        Ok(()) => reply(200, json!({"ok": true})),
        Err(r) => refusal(r),
    }
}

async fn cancel(
    State(exec): Exec,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
) -> Response {
    let id = match parse_id(&id) {
        Ok(i) => i,
        Err(r) => return refusal(r),
    };
    match exec.cancel(&id, peer.ip()) {
        Ok(cancelled) => reply(200, json!({"ok": true, "cancelled": cancelled})),
        Err(r) => refusal(r),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DoneBody {
    summary: String,
    #[serde(default)]
    highlights: Vec<String>,
}

/// `POST /awcp/tasks/:id/done` (`awcp-mount done`): only from this machine, where the
/// executor's agent runs.
async fn done(
    State(exec): Exec,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if !peer.ip().is_loopback() {
        return reply(
            403,
            json!({"error": "done is accepted from this machine only"}),
        );
    }
    let id = match parse_id(&id) {
        Ok(i) => i,
        Err(r) => return refusal(r),
    };
    let body = match body {
        Ok(b) => b,
        Err(rej) => return body_error(rej, exec.settings.serve.max_body_bytes),
    };
    let b: DoneBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return reply(400, json!({"error": format!("body: {e}")})),
    };
    let bad = b.summary.len() > crate::awcp::protocol::MAX_TEXT
        || b.highlights.len() > 256
        || b.highlights
            .iter()
            .any(|h| h.len() > crate::awcp::protocol::MAX_PATH_TEXT);
    if bad {
        return reply(400, json!({"error": "summary or highlights too long"}));
    }
    match exec.done(&id, b.summary, b.highlights) {
        Ok(()) => reply(200, json!({"ok": true})),
        Err(r) => refusal(r),
    }
}

/// `GET /awcp/status`: the reference's counters and list, each delegation with its state,
/// mount point, access, lease and quota use. A delegator sees its own delegations only;
/// this machine's operator (127.0.0.1, ::1) sees all.
async fn status(State(exec): Exec, ConnectInfo(peer): ConnectInfo<SocketAddr>) -> Response {
    let all = exec.all();
    let records: Vec<_> = all
        .iter()
        .map(|d| d.snapshot())
        .filter(|r| Executor::may_see(r, peer.ip()))
        .collect();
    let count = |s: AssignmentState| records.iter().filter(|r| r.state == s).count();
    let mut list = Vec::new();
    for r in &records {
        let quota = if r.state == AssignmentState::Active {
            let mp = r.mount_point.clone();
            tokio::task::spawn_blocking(move || crate::control::request(&mp, "status").ok())
                .await
                .ok()
                .flatten()
                .map(|s| json!({"bytesUsed": s["quota"]["bytes_used"], "bytesMax": s["quota"]["bytes_max"], "filesUsed": s["quota"]["files_used"], "filesMax": s["quota"]["files_max"], "access": s["access"]}))
        } else {
            None
        };
        let mut v = json!({
            "id": r.id,
            "workPath": r.mount_point,
            "startedAt": r.started_at,
            "state": r.state,
            "accessMode": r.access,
            "createdAt": r.created_at,
            "expiresAt": r.expires_at,
            "remote": r.remote,
            "finishedAt": r.finished_at,
        });
        if let Some(q) = quota {
            v["quota"] = q;
        }
        if let Some(Outcome::Error { code, .. }) = &r.outcome {
            v["errorCode"] = json!(code);
        }
        list.push(v);
    }
    reply(
        200,
        json!({
            "pendingInvitations": count(AssignmentState::Pending),
            "activeDelegations": count(AssignmentState::Active),
            "completedDelegations": count(AssignmentState::Completed) + count(AssignmentState::Error),
            "delegations": list,
        }),
    )
}

/// `POST /a2a`: JSON-RPC `message/send` carrying an AWCP message in a data part.
async fn a2a(
    State(exec): Exec,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(rej) => return body_error(rej, exec.settings.serve.max_body_bytes),
    };
    reply(200, crate::awcp::a2a::handle(&exec, &body, peer))
}

async fn agent_card(headers: HeaderMap) -> Response {
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1:4101");
    reply(200, crate::awcp::a2a::agent_card(&format!("http://{host}")))
}

impl Executor {
    /// A pending delegation whose START carried an unusable credential ends with `code`.
    /// (Only from the client that invited it: anyone else's broken START is refused alone.)
    pub fn fail_pending(
        &self,
        id: &DelegationId,
        code: ErrorCode,
        message: String,
        peer: std::net::IpAddr,
    ) {
        if let Some(d) = self.get(id) {
            let r = d.snapshot();
            if Executor::may_act(&r, peer, "START").is_ok()
                && d.finish_pending(Outcome::Error {
                    code,
                    message,
                    hint: Some(
                        "send a valid OpenSSH private key and a certificate of that key".into(),
                    ),
                })
            {
                super::mounter::remove_mount_point(&r.mount_point);
            }
        }
    }
}
