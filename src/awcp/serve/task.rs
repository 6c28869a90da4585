//! The task: the command of `[task] command`, run in the mount point, in the sandbox.
//!
//! It learns what to do from environment variables and a JSON file (`AWCP_TASK_FILE`); it
//! reports through its exit status, an optional summary file (`AWCP_SUMMARY_FILE`, plain
//! text) and highlights file (`AWCP_HIGHLIGHTS_FILE`, one path per line), and its output,
//! whose tail goes into the `done` or `error` event. It runs in a process group of its own so
//! that stopping it stops everything it started.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use super::config::TaskConfig;
use super::sandbox::Sandbox;
use super::store::{ProcRef, Record};

/// Output kept for the events (the whole output goes to `output.log`, bounded too).
const TAIL_BYTES: usize = 16 * 1024;
const LOG_BYTES: u64 = 4 * 1024 * 1024;
/// The prompt is also passed in the environment when it fits (Linux caps one variable at
/// 128 KiB); it is always in the task file.
const PROMPT_ENV_MAX: usize = 100 * 1024;

pub struct RunningTask {
    child: Child,
    /// The task's process group (its leader's pid): kept, since the child's id is gone once
    /// the leader has been waited for, and what it left running in the background must
    /// still be ended.
    group: Option<nix::unistd::Pid>,
    pub process: Option<ProcRef>,
    tail: Arc<Mutex<Vec<u8>>>,
    readers: Vec<tokio::task::JoinHandle<()>>,
    pub files: TaskFiles,
}

/// The task's own files, in its task directory (outside the delegator's workspace).
#[derive(Debug, Clone)]
pub struct TaskFiles {
    pub dir: PathBuf,
    pub task_json: PathBuf,
    pub summary: PathBuf,
    pub highlights: PathBuf,
    pub output: PathBuf,
    pub tmp: PathBuf,
}

impl TaskFiles {
    pub fn new(dir: &Path) -> TaskFiles {
        TaskFiles {
            dir: dir.to_path_buf(),
            task_json: dir.join("task.json"),
            summary: dir.join("summary.txt"),
            highlights: dir.join("highlights.txt"),
            output: dir.join("output.log"),
            tmp: dir.join("tmp"),
        }
    }

    pub fn create(&self, r: &Record) -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.tmp)?;
        let info = serde_json::json!({
            "delegationId": r.id.as_str(),
            "description": r.task.description,
            "prompt": r.task.prompt,
            "accessMode": r.access,
            "expiresAt": r.expires_at,
            "workspace": r.mount_point,
            "summaryFile": self.summary,
            "highlightsFile": self.highlights,
        });
        std::fs::write(&self.task_json, serde_json::to_vec_pretty(&info)?)
    }

    /// What the task wrote as its summary (bounded), if anything.
    pub fn summary(&self) -> Option<String> {
        let s = read_bounded(&self.summary, crate::awcp::protocol::MAX_TEXT)?;
        let s = s.trim().to_string();
        (!s.is_empty()).then_some(s)
    }

    pub fn highlights(&self) -> Vec<String> {
        read_bounded(&self.highlights, 64 * 1024)
            .map(|t| {
                t.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && l.len() <= crate::awcp::protocol::MAX_PATH_TEXT)
                    .take(256)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn read_bounded(p: &Path, max: usize) -> Option<String> {
    let mut f = std::fs::File::open(p).ok()?;
    let mut buf = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(&mut f, max as u64), &mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).replace('\0', ""))
}

/// Start the task.
pub fn spawn(
    cfg: &TaskConfig,
    command: &[String],
    r: &Record,
    files: TaskFiles,
    sandbox: Sandbox,
) -> std::io::Result<RunningTask> {
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..])
        .current_dir(&r.mount_point)
        .env_clear()
        .env(
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()),
        )
        .env("HOME", &files.dir)
        .env("TMPDIR", &files.tmp)
        .env("LANG", "C.UTF-8");
    for (k, v) in &cfg.environment {
        cmd.env(k, v);
    }
    cmd.env("AWCP_DELEGATION_ID", r.id.as_str())
        .env("AWCP_TASK_DESCRIPTION", &r.task.description)
        .env("AWCP_ACCESS_MODE", r.access.to_string())
        .env("AWCP_EXPIRES_AT", r.expires_at.clone().unwrap_or_default())
        .env("AWCP_WORKSPACE", &r.mount_point)
        .env("AWCP_TASK_DIR", &files.dir)
        .env("AWCP_TASK_FILE", &files.task_json)
        .env("AWCP_SUMMARY_FILE", &files.summary)
        .env("AWCP_HIGHLIGHTS_FILE", &files.highlights);
    if r.task.prompt.len() <= PROMPT_ENV_MAX {
        cmd.env("AWCP_TASK_PROMPT", &r.task.prompt);
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    // SAFETY: Sandbox::enter makes only async-signal-safe system calls.
    unsafe {
        cmd.pre_exec(move || sandbox.enter());
    }
    let mut child = cmd.spawn()?;
    let process = child.id().and_then(|p| ProcRef::of(p as i32));
    let group = child.id().map(|p| nix::unistd::Pid::from_raw(p as i32));
    let tail = Arc::new(Mutex::new(Vec::new()));
    let log = std::fs::File::create(&files.output).ok();
    let log = Arc::new(Mutex::new(log));
    let mut readers = Vec::new();
    let out: Vec<Box<dyn tokio::io::AsyncRead + Unpin + Send>> = vec![
        Box::new(child.stdout.take().expect("piped")),
        Box::new(child.stderr.take().expect("piped")),
    ];
    for mut r in out {
        let tail = tail.clone();
        let log = log.clone();
        readers.push(tokio::spawn(async move {
            let mut buf = [0u8; 8192];
            let mut written = 0u64;
            while let Ok(n) = r.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                {
                    let mut t = tail.lock().unwrap();
                    t.extend_from_slice(&buf[..n]);
                    let excess = t.len().saturating_sub(TAIL_BYTES);
                    t.drain(..excess);
                }
                if written < LOG_BYTES {
                    if let Some(f) = log.lock().unwrap().as_mut() {
                        let _ = std::io::Write::write_all(f, &buf[..n]);
                    }
                    written += n as u64;
                }
            }
        }));
    }
    Ok(RunningTask {
        child,
        group,
        process,
        tail,
        readers,
        files,
    })
}

impl RunningTask {
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let status = self.child.wait().await?;
        // Collect the last output; a grandchild still holding the pipes must not hang us.
        for r in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), r).await;
        }
        Ok(status)
    }

    /// Stop the task and everything it started: SIGTERM to its process group, SIGKILL after
    /// five seconds.
    pub async fn stop(&mut self) {
        use nix::sys::signal::{killpg, Signal};
        let Some(group) = self.group else {
            return;
        };
        // Also when the leader has ended by itself: what it started in the background (a
        // `make &`, a server) is still in its group, running in the mount.
        let _ = killpg(group, Signal::SIGTERM);
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = killpg(group, Signal::SIGKILL);
            let _ = self.child.wait().await;
        }
        // The rest of the group gets a moment to end on SIGTERM, then SIGKILL. (The group
        // is gone once its last member is: `killpg` with no signal says whether it is.)
        for _ in 0..20 {
            if killpg(group, None).is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = killpg(group, Signal::SIGKILL);
        for r in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(1), r).await;
        }
    }

    /// The last `max` bytes of the task's output, as text.
    pub fn tail(&self, max: usize) -> String {
        let t = self.tail.lock().unwrap();
        let start = t.len().saturating_sub(max);
        String::from_utf8_lossy(&t[start..]).trim().to_string()
    }
}

/// A hint for a failed task, from what its output says.
pub fn hint_for(tail: &str, quota: Option<u64>) -> Option<String> {
    if tail.contains("No space left on device") || tail.contains("Disk quota exceeded") {
        Some(match quota {
            Some(q) => format!(
                "the task ran out of space (ENOSPC): the executor's quota allows {q} bytes of growth ([quota] max_bytes); make the task write less"
            ),
            None => "the task ran out of space (ENOSPC) on the delegated workspace".into(),
        })
    } else if tail.contains("Read-only file system") {
        Some("the workspace was read-only (a read-only lease, or the lease had expired)".into())
    } else {
        Some("see the task's output above; the workspace keeps what the task wrote".into())
    }
}
