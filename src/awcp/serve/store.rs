//! What `serve` knows about each delegation, persisted so it survives a restart.
//!
//! One JSON file per delegation, `<state_dir>/delegations/<id>.json`, mode 0600 in a 0700
//! directory, replaced atomically (write + rename). Credentials are never part of it: the
//! START credential lives only in memory and in the pipe to the mount process.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::awcp::protocol::{
    Access, AssignmentState, DelegationId, ErrorCode, TaskEvent, TaskSpec,
};

/// A process we started, identified by PID *and* start time, so a PID reused by the system
/// after a restart is never signalled by mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRef {
    pub pid: i32,
    pub start_time: u64,
}

impl ProcRef {
    pub fn of(pid: i32) -> Option<ProcRef> {
        Some(ProcRef {
            pid,
            start_time: proc_start_time(pid)?,
        })
    }

    /// The same process is still alive.
    pub fn alive(&self) -> bool {
        proc_start_time(self.pid) == Some(self.start_time)
    }
}

/// Field 22 of /proc/PID/stat (start time in clock ticks since boot).
fn proc_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// How a delegation ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Outcome {
    Done {
        summary: String,
        highlights: Vec<String>,
    },
    Error {
        code: ErrorCode,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hint: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub id: DelegationId,
    pub state: AssignmentState,
    pub client: String,
    pub created_at: String,
    pub task: TaskSpec,
    pub requested_access: Access,
    pub access: Access,
    /// Granted TTL (the INVITE's, narrowed to `max_ttl_seconds`).
    pub ttl_seconds: u64,
    pub retention_ms: u64,
    pub mount_point: PathBuf,
    #[serde(default)]
    pub started_at: Option<String>,
    /// The lease end enforced: START's `expiresAt`, capped at START + granted TTL.
    #[serde(default)]
    pub expires_at: Option<String>,
    /// `user@host:port:export`, for status (never the credential).
    #[serde(default)]
    pub remote: Option<String>,
    #[serde(default)]
    pub mount_process: Option<ProcRef>,
    #[serde(default)]
    pub task_process: Option<ProcRef>,
    #[serde(default)]
    pub finished_at: Option<String>,
    #[serde(default)]
    pub outcome: Option<Outcome>,
    /// A2A binding: the host's A2A endpoint, where DONE/ERROR are sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_url: Option<String>,
    /// Everything sent (or to be sent) on the SSE stream, replayed to late subscribers.
    #[serde(default)]
    pub events: Vec<TaskEvent>,
}

/// Events kept per delegation: a long task's status events must not grow without bound.
pub const MAX_EVENTS: usize = 64;

impl Record {
    pub fn push_event(&mut self, e: TaskEvent) {
        if self.events.len() >= MAX_EVENTS && !e.is_terminal() {
            return;
        }
        self.events.push(e);
    }

    pub fn terminal_event(&self) -> Option<&TaskEvent> {
        self.events.iter().find(|e| e.is_terminal())
    }
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

fn private_dir(p: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(p)?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700))
}

impl Store {
    pub fn open(root: &Path) -> Result<Store, String> {
        for d in [
            root.to_path_buf(),
            root.join("delegations"),
            root.join("tasks"),
        ] {
            private_dir(&d).map_err(|e| format!("state directory {}: {e}", d.display()))?;
        }
        Ok(Store {
            root: root.to_path_buf(),
        })
    }

    fn file(&self, id: &DelegationId) -> PathBuf {
        id.path_in(&self.root.join("delegations"))
            .with_extension("json")
    }

    /// Per-delegation files of the task (task.json, summary, output log), outside the mount.
    pub fn task_dir(&self, id: &DelegationId) -> PathBuf {
        id.path_in(&self.root.join("tasks"))
    }

    pub fn save(&self, r: &Record) -> std::io::Result<()> {
        let path = self.file(&r.id);
        let tmp = path.with_extension("json.tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?)?;
        f.sync_data()?;
        std::fs::rename(&tmp, &path)
    }

    pub fn remove(&self, id: &DelegationId) {
        let _ = std::fs::remove_file(self.file(id));
        let dir = self.task_dir(id);
        // The task directory is ours alone (never a mount point): its files can go.
        if !crate::mountinfo::has_mounts_under(&dir).unwrap_or(true) {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// Every record on disk. Files that do not parse, or whose name is not a valid id, are
    /// reported and skipped (never deleted: an operator may want to look at them).
    pub fn load_all(&self) -> Vec<Record> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(self.root.join("delegations")) else {
            return out;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().and_then(|x| x.to_str()) != Some("json") {
                continue;
            }
            let parsed = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Record>(&b).map_err(|e| e.to_string()));
            match parsed {
                Ok(r) if Some(r.id.as_str()) == path.file_stem().and_then(|s| s.to_str()) => {
                    out.push(r)
                }
                Ok(_) => tracing::warn!(
                    "{}: id does not match the file name; ignored",
                    path.display()
                ),
                Err(e) => tracing::warn!(
                    "{}: unreadable delegation record ({e}); ignored",
                    path.display()
                ),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_files_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let id = DelegationId::parse("dlg_1").unwrap();
        let mut r = Record {
            id: id.clone(),
            state: AssignmentState::Pending,
            client: "127.0.0.1".into(),
            created_at: TaskEvent::now(),
            task: TaskSpec {
                description: "d".into(),
                prompt: "p".into(),
            },
            requested_access: Access::Rw,
            access: Access::Ro,
            ttl_seconds: 60,
            retention_ms: 1000,
            mount_point: "/m/dlg_1".into(),
            started_at: None,
            expires_at: None,
            remote: None,
            mount_process: ProcRef::of(std::process::id() as i32),
            task_process: None,
            finished_at: None,
            outcome: None,
            reply_url: None,
            events: vec![],
        };
        for i in 0..MAX_EVENTS + 5 {
            r.push_event(TaskEvent::status("dlg_1", &format!("{i}")));
        }
        r.push_event(TaskEvent::error(
            "dlg_1",
            ErrorCode::Cancelled,
            "c".into(),
            None,
        ));
        assert_eq!(
            r.events.len(),
            MAX_EVENTS + 1,
            "bounded, but the terminal event is kept"
        );
        store.save(&r).unwrap();
        std::fs::write(dir.path().join("delegations/garbage.json"), "{").unwrap();
        std::fs::write(
            dir.path().join("delegations/dlg_2.json"),
            serde_json::to_vec(&r).unwrap(),
        )
        .unwrap();
        assert_eq!(store.load_all(), vec![r.clone()]);
        assert!(r.mount_process.unwrap().alive());
        let mode = std::fs::metadata(dir.path().join("delegations/dlg_1.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        store.remove(&id);
        assert_eq!(store.load_all(), vec![]);
    }
}
