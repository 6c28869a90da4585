//! Start-up after a restart (or a crash): what the previous `serve` left behind.
//!
//! Pending invitations carry no credential yet and stay valid. Active delegations cannot go
//! on (their credential was only in memory, their task was our child): their task is stopped
//! (by PID *and* start time, so a reused PID is never hit), their mount, found through
//! mountinfo, is detached lazily, and their mount point removed once mountinfo shows it is no
//! longer mounted; the delegation then ends with an `error` event, which a delegator that
//! reconnects to the SSE stream receives.

use std::time::Duration;

use super::executor::Executor;
use super::mounter;
use super::store::{Outcome, ProcRef, Record};
use crate::awcp::protocol::{AssignmentState, ErrorCode};

fn stop(p: &ProcRef, group: bool) {
    if !p.alive() {
        return;
    }
    let pid = nix::unistd::Pid::from_raw(p.pid);
    let sig = nix::sys::signal::Signal::SIGKILL;
    if group {
        let _ = nix::sys::signal::killpg(pid, sig);
    } else {
        let _ = nix::sys::signal::kill(pid, sig);
    }
}

/// Take down what an interrupted delegation left. Blocking; run before serving.
fn clean_up(r: &Record) {
    if let Some(t) = &r.task_process {
        stop(t, true);
    }
    if mounter::is_mounted(&r.mount_point) {
        tracing::warn!(id = %r.id, "unmounting the leftover mount {}", r.mount_point.display());
        // (Through fusermount3 when serve runs as a user.)
        if let Err(e) = crate::unmount::unmount_now(&r.mount_point, true) {
            tracing::warn!(id = %r.id, "cannot unmount {}: {e}", r.mount_point.display());
        }
    }
    if let Some(m) = &r.mount_process {
        // After a lazy detach its FUSE session ends; give it a moment to exit by itself
        // (it flushes what it still holds), then make sure.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while m.alive() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop(m, false);
    }
    mounter::remove_mount_point(&r.mount_point);
}

pub fn recover(exec: &Executor) {
    for d in exec.all() {
        let r = d.snapshot();
        match r.state {
            AssignmentState::Pending => {
                if !r.mount_point.is_dir() {
                    d.finish(Outcome::Error {
                        code: ErrorCode::SetupFailed,
                        message: "the executor restarted and the mount point is gone".into(),
                        hint: Some("invite again".into()),
                    });
                }
            }
            AssignmentState::Active => {
                clean_up(&r);
                d.finish(Outcome::Error {
                    code: ErrorCode::TaskFailed,
                    message: "the executor (awcp-mount serve) restarted while this delegation was active: its task was stopped and the workspace unmounted".into(),
                    hint: Some("delegate again; what the task had written is in the workspace".into()),
                });
                tracing::warn!(id = %r.id, "interrupted by a restart; reported as failed");
            }
            AssignmentState::Completed | AssignmentState::Error => {
                // Idempotent: a crash may have come between the outcome and the teardown.
                if mounter::is_mounted(&r.mount_point) || r.mount_point.exists() {
                    clean_up(&r);
                }
            }
        }
    }
}
