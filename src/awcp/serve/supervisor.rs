//! One active delegation from START to its end: mount, run the task, watch the lease, the
//! task's timeout, cancel and `done` requests and the mount process, then tear down (stop the
//! task, unmount, remove the empty mount point) and only then report the outcome, so that
//! when the delegator sees `done` every write has reached its files.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use super::executor::{Control, Delegation, Executor};
use super::mounter::{self, HostKeys, MountChild, MountRequest};
use super::sandbox::Sandbox;
use super::store::Outcome;
use super::task::{self, RunningTask, TaskFiles};
use crate::awcp::protocol::{ErrorCode, SshfsHandle, TaskEvent};
use crate::policy::lease::format_rfc3339;

/// How long connecting and mounting may take.
const MOUNT_DEADLINE: Duration = Duration::from_secs(45);
/// Output quoted in events.
const EVENT_TAIL: usize = 2048;

fn err(code: ErrorCode, message: String, hint: Option<String>) -> Outcome {
    Outcome::Error {
        code,
        message,
        hint,
    }
}

/// A deadline that never comes (as far off as tokio lets a timer be, about 136 years).
const NEVER: Duration = Duration::from_secs(u32::MAX as u64);

/// `t + d`, saturating at [`NEVER`] from `t` rather than overflowing (which panics).
fn later(t: tokio::time::Instant, d: Duration) -> tokio::time::Instant {
    t + d.min(NEVER)
}

fn until(t: SystemTime) -> tokio::time::Instant {
    later(
        tokio::time::Instant::now(),
        t.duration_since(SystemTime::now()).unwrap_or_default(),
    )
}

pub async fn run(
    exec: Arc<Executor>,
    d: Arc<Delegation>,
    handle: SshfsHandle,
    expires: SystemTime,
    mut rx: mpsc::UnboundedReceiver<Control>,
) {
    let r = d.snapshot();
    let files = TaskFiles::new(&exec.store.task_dir(&d.id));
    let mut mount: Option<MountChild> = None;
    let mut task: Option<RunningTask> = None;
    let outcome = supervise(
        &exec, &d, &handle, expires, &mut rx, &files, &mut mount, &mut task,
    )
    .await;
    // Teardown, whatever happened: task first (it holds files open), then the mount.
    if let Some(t) = task.as_mut() {
        t.stop().await;
    }
    let mut outcome = outcome;
    if let Some(m) = mount.as_mut() {
        if let Err(lost) = mounter::unmount(m, &r.mount_point).await {
            // Not "done": the delegator must not take the workspace for complete.
            outcome = match outcome {
                Outcome::Done { summary, .. } => err(
                    ErrorCode::TransportError,
                    format!("{lost} (the task had finished: {summary})"),
                    Some("check the workspace for the task's last changes".into()),
                ),
                other => other,
            };
        }
    } else {
        let mp = r.mount_point.clone();
        let _ = tokio::task::spawn_blocking(move || mounter::detach_or_unmount(&mp)).await;
    }
    mounter::remove_mount_point(&r.mount_point);
    d.set_control(None);
    match &outcome {
        Outcome::Done { .. } => tracing::info!(id = %d.id, "delegation completed"),
        Outcome::Error { code, message, .. } => {
            tracing::warn!(id = %d.id, %code, "delegation failed: {message}")
        }
    }
    d.finish(outcome);
}

#[allow(clippy::too_many_arguments)]
async fn supervise(
    exec: &Arc<Executor>,
    d: &Arc<Delegation>,
    handle: &SshfsHandle,
    expires: SystemTime,
    rx: &mut mpsc::UnboundedReceiver<Control>,
    files: &TaskFiles,
    mount_slot: &mut Option<MountChild>,
    task_slot: &mut Option<RunningTask>,
) -> Outcome {
    let s = &exec.settings;
    let r = d.snapshot();
    let mp = r.mount_point.clone();
    if let Err(e) = files.create(&r) {
        return err(
            ErrorCode::SetupFailed,
            format!(
                "cannot create the task directory {}: {e}",
                files.dir.display()
            ),
            None,
        );
    }
    let expires_text = format_rfc3339(expires);
    let lease_end = later(until(expires), s.policy.grace);

    // 1. Mount, retrying once without the known_hosts check when the policy accepts unknown
    //    host keys and the file had no entry for this host.
    let mut host_keys = HostKeys::KnownHosts(s.serve.known_hosts.clone());
    loop {
        let req = MountRequest {
            binary: &s.binary,
            policy: &s.policy_path,
            handle,
            mount_point: &mp,
            access: r.access,
            expires_at: &expires_text,
            host_keys: host_keys.clone(),
            noexec: !s.task.allow_exec,
            log: &files.dir.join("mount.log"),
        };
        let mut child = match mounter::spawn(&req) {
            Ok(c) => c,
            Err(f) => return err(f.code, f.message, f.hint),
        };
        d.update(|rec| rec.mount_process = child.process);
        let waited = tokio::select! {
            w = mounter::wait_mounted(&mut child, &mp, MOUNT_DEADLINE) => w,
            c = rx.recv() => {
                *mount_slot = Some(child);
                return control_outcome(c, None);
            }
            _ = tokio::time::sleep_until(until(expires)) => {
                *mount_slot = Some(child);
                return err(ErrorCode::Expired, "the lease expired while mounting".into(), None);
            }
        };
        match waited {
            Ok(()) => {
                *mount_slot = Some(child);
                break;
            }
            Err(f)
                if f.unknown_host_key
                    && s.serve.accept_unknown_host_keys
                    && matches!(host_keys, HostKeys::KnownHosts(_)) =>
            {
                tracing::warn!(
                    id = %d.id,
                    host = %handle.endpoint.host,
                    "the delegator's host key is not in {}; accepting it (accept_unknown_host_keys = true): {}",
                    s.serve.known_hosts.display(),
                    f.message
                );
                host_keys = HostKeys::AcceptUnknown;
            }
            Err(f) => return err(f.code, f.message, f.hint),
        }
    }
    d.emit(TaskEvent::status(d.id.as_str(), "Task execution started"));

    // 2. The task, if the policy configures one; else the executor's agent drives the mount
    //    and reports with `awcp-mount done|cancel`.
    if let Some(command) = &s.task.command {
        let sandbox = match Sandbox::prepare(&s.task, &[&mp, &files.dir]) {
            Ok(sb) => sb,
            Err(e) => {
                return err(
                    ErrorCode::SetupFailed,
                    format!("cannot prepare the task's sandbox: {e}"),
                    None,
                )
            }
        };
        match task::spawn(&s.task, command, &d.snapshot(), files.clone(), sandbox) {
            Ok(t) => {
                d.update(|rec| rec.task_process = t.process);
                *task_slot = Some(t);
            }
            Err(e) => {
                return err(
                    ErrorCode::SetupFailed,
                    format!("cannot start the task command {:?}: {e}", command[0]),
                    None,
                )
            }
        }
    }
    let timeout = s.task.timeout_seconds.map(Duration::from_secs);
    let task_deadline = later(tokio::time::Instant::now(), timeout.unwrap_or(NEVER));

    // 3. Wait for whatever ends the delegation.
    let mount = mount_slot.as_mut().expect("mounted");
    tokio::select! {
        status = async {
            match task_slot.as_mut() {
                Some(t) => t.wait().await,
                None => std::future::pending().await,
            }
        } => {
            let t = task_slot.as_ref().expect("task");
            let tail = t.tail(EVENT_TAIL);
            match status {
                Ok(st) if st.success() => Outcome::Done {
                    summary: t.files.summary().unwrap_or_else(|| {
                        if tail.is_empty() { "The task command finished successfully.".into() } else { tail.clone() }
                    }),
                    highlights: t.files.highlights(),
                },
                Ok(st) if SystemTime::now() >= expires => err(
                    ErrorCode::Expired,
                    format!("the lease expired at {expires_text}; the workspace turned read-only and the task failed ({st}). Output (last lines):\n{tail}"),
                    Some("ask for a longer lease".into()),
                ),
                Ok(st) => {
                    let mut message = format!("the task command exited with {st}");
                    if let Some(sum) = t.files.summary() {
                        message.push_str(&format!("; its summary: {sum}"));
                    }
                    if !tail.is_empty() {
                        message.push_str(&format!(". Output (last lines):\n{tail}"));
                    }
                    err(ErrorCode::TaskFailed, message, task::hint_for(&tail, s.policy.max_bytes))
                }
                Err(e) => err(ErrorCode::TaskFailed, format!("cannot wait for the task command: {e}"), None),
            }
        }
        c = rx.recv() => control_outcome(c, task_slot.as_ref()),
        _ = tokio::time::sleep_until(lease_end) => err(
            ErrorCode::Expired,
            format!(
                "the lease expired at {expires_text}: the workspace turned read-only then, and {} s later the task was stopped and the workspace unmounted{}",
                s.policy.grace.as_secs(),
                tail_note(task_slot.as_ref()),
            ),
            Some("ask for a longer lease, or make the task finish sooner".into()),
        ),
        _ = tokio::time::sleep_until(task_deadline), if timeout.is_some() => err(
            ErrorCode::TaskFailed,
            format!("the task command did not finish within {} s ([task] timeout_seconds) and was stopped{}", timeout.unwrap_or_default().as_secs(), tail_note(task_slot.as_ref())),
            Some("give the task less to do, or raise the timeout".into()),
        ),
        st = mount.child.wait() => {
            if SystemTime::now() >= expires {
                err(
                    ErrorCode::Expired,
                    format!("the lease expired at {expires_text}; the workspace was unmounted after the grace period{}", tail_note(task_slot.as_ref())),
                    Some("ask for a longer lease".into()),
                )
            } else {
                let why = match st { Ok(s) => s.to_string(), Err(e) => e.to_string() };
                err(
                    ErrorCode::TransportError,
                    format!("the mount ended unexpectedly ({why}): {}", mount.stderr()),
                    Some("the connection to the delegator's SSH server was lost".into()),
                )
            }
        }
    }
}

fn tail_note(t: Option<&RunningTask>) -> String {
    match t.map(|t| t.tail(EVENT_TAIL)) {
        Some(tail) if !tail.is_empty() => format!(". Task output (last lines):\n{tail}"),
        _ => String::new(),
    }
}

fn control_outcome(c: Option<Control>, t: Option<&RunningTask>) -> Outcome {
    match c {
        Some(Control::Done {
            summary,
            highlights,
        }) => Outcome::Done {
            summary,
            highlights,
        },
        Some(Control::Cancel { code, message }) => {
            err(code, format!("{message}{}", tail_note(t)), None)
        }
        None => err(
            ErrorCode::Cancelled,
            "the executor is shutting down".into(),
            None,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deadlines saturate: a grace period, task timeout or lease end too far off to add used
    /// to panic the endpoint (`Instant + Duration` overflows); now it is a deadline that never
    /// comes. (The policy refuses such values too; this guards the arithmetic itself.)
    #[test]
    fn far_deadlines_saturate_instead_of_panicking() {
        let now = tokio::time::Instant::now();
        assert_eq!(later(now, Duration::MAX), now + NEVER);
        assert_eq!(
            later(now, Duration::from_secs(30)),
            now + Duration::from_secs(30)
        );
        let far = SystemTime::now() + Duration::from_secs(u64::from(u32::MAX) * 4);
        assert!(until(far) <= tokio::time::Instant::now() + NEVER);
        assert!(until(SystemTime::UNIX_EPOCH) <= tokio::time::Instant::now());
    }
}
