//! The AWCP control plane end to end: a test delegator written here, behaving as the
//! reference delegator does, against a real `awcp-mount serve`, which mounts a private
//! OpenSSH sshd's export for real.
//!
//! The delegator: builds an export view (a `workspace` symlink to the real directory and
//! `.awcp/manifest.json`), POSTs INVITE, opens the SSE stream *before* START, mints an
//! ephemeral ed25519 key and an OpenSSH certificate signed by the throwaway CA the sshd trusts
//! (`TrustedUserCAKeys`), POSTs START, waits for `done` or `error`, and POSTs ack.
//!
//! The policy's task command runs the INVITE's prompt as a shell script (`eval
//! "$AWCP_TASK_PROMPT"`), so each test says what the executor's "agent" does.
//!
//! Cleanup: `serve` is stopped by its PID (SIGTERM, then SIGKILL), leftover mounts below the
//! test's directory are detached, and directories are deleted only when mountinfo shows
//! nothing mounted below them. Needs root, /dev/fuse, sshd, ssh-keygen.

mod common;

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use awcp_mount::policy::lease::format_rfc3339;
use common::mount::{is_awcp_mounted, mount_points_under, poll_until, run_ok, BIN};
use common::sshd::{free_port, TestSshd};
use serde_json::{json, Value};

const DEADLINE: Duration = Duration::from_secs(30);

// ------------------------------------------------------------------ the executor under test

/// A running `awcp-mount serve` with its own policy, mount root and state directory.
struct Serve {
    base: tempfile::TempDir,
    policy: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Serve {
    /// `extra` is appended to the policy; `[serve]`/`[task]` keys go in `serve_keys`/`task_keys`.
    fn start(sshd: Option<&TestSshd>, top: &str, serve_keys: &str, task_keys: &str) -> Serve {
        Serve::start_with_grace(sshd, top, serve_keys, task_keys, 2)
    }

    /// [`Serve::start`] with `[lease] grace_seconds = grace`.
    fn start_with_grace(
        sshd: Option<&TestSshd>,
        top: &str,
        serve_keys: &str,
        task_keys: &str,
        grace: u32,
    ) -> Serve {
        let base = tempfile::Builder::new()
            .prefix("awcp-serve-")
            .tempdir()
            .unwrap();
        let b = base.path();
        fs::create_dir(b.join("mounts")).unwrap();
        fs::set_permissions(b.join("mounts"), fs::Permissions::from_mode(0o700)).unwrap();
        let known = sshd
            .map(|s| {
                format!(
                    "known_hosts = {:?}\n",
                    s.known_hosts_path.display().to_string()
                )
            })
            .unwrap_or_default();
        let policy = b.join("policy.toml");
        fs::write(
            &policy,
            format!(
                "mount_root = {:?}\n{top}\n[lease]\ngrace_seconds = {grace}\n[serve]\nstate_dir = {:?}\nmax_body_bytes = 65536\n{known}{serve_keys}\n[task]\n{task_keys}\n",
                b.join("mounts").display().to_string(),
                b.join("state").display().to_string(),
            ),
        )
        .unwrap();
        let mut s = Serve {
            base,
            policy,
            port: free_port(),
            child: None,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.base.path().join("serve.log"))
            .unwrap();
        let child = Command::new(BIN)
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{}", self.port),
                "--policy",
            ])
            .arg(&self.policy)
            .env("AWCP_MOUNT_LOG", "awcp_mount=info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn serve");
        self.child = Some(child);
        let up = poll_until(DEADLINE, || {
            std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                || self.child.as_mut().unwrap().try_wait().unwrap().is_some()
        });
        assert!(
            up && self.child.as_mut().unwrap().try_wait().unwrap().is_none(),
            "serve did not start:\n{}",
            self.log()
        );
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/awcp", self.port)
    }

    fn mount_root(&self) -> PathBuf {
        self.base.path().join("mounts").canonicalize().unwrap()
    }

    fn log(&self) -> String {
        fs::read_to_string(self.base.path().join("serve.log")).unwrap_or_default()
    }

    /// The service's log and the logs of the mounts it made (`mount.log` in each task's
    /// directory, which keeps every warning of the mount: the context of an errno it gave),
    /// for a failure message.
    fn logs(&self) -> String {
        fn mount_logs(dir: &Path, out: &mut String) {
            for e in fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = e.path();
                match e.file_type() {
                    Ok(t) if t.is_dir() => mount_logs(&path, out),
                    Ok(_) if path.file_name() == Some(std::ffi::OsStr::new("mount.log")) => {
                        let text = fs::read_to_string(&path).unwrap_or_default();
                        let tail = &text[text.len().saturating_sub(8000)..];
                        out.push_str(&format!("\n--- {}:\n{tail}", path.display()));
                    }
                    _ => {}
                }
            }
        }
        let mut out = format!("--- serve.log:\n{}", self.log());
        mount_logs(self.base.path(), &mut out);
        out
    }

    /// SIGKILL: as a crash.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM (clean stop), SIGKILL if it hangs.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(30);
            while c.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    eprintln!("serve did not stop on SIGTERM; killing it");
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.stop();
        for mp in mount_points_under(self.base.path()) {
            eprintln!("detaching leftover mount {}", mp.display());
            let _ = Command::new("umount").arg("-l").arg(&mp).status();
        }
        if !mount_points_under(self.base.path()).is_empty() {
            eprintln!(
                "mounts left under {}; not deleting it",
                self.base.path().display()
            );
            std::mem::forget(std::mem::replace(
                &mut self.base,
                tempfile::tempdir().unwrap(),
            ));
        }
    }
}

// ------------------------------------------------------------------ the test delegator

/// One delegation as the delegator sees it: its export view and real workspace directory on
/// the sshd side.
struct Dlg {
    id: String,
    /// The real directory (what the task's writes must reach).
    work: PathBuf,
    /// The export view (the START's exportLocator).
    export: PathBuf,
}

fn delegation(sshd: &TestSshd, id: &str) -> Dlg {
    let work = sshd.export_dir.join(format!("src-{id}"));
    fs::create_dir_all(&work).unwrap();
    fs::write(work.join("README.md"), "hello from the delegator\n").unwrap();
    let export = sshd.export_dir.join(format!("env-{id}"));
    fs::create_dir_all(export.join(".awcp")).unwrap();
    symlink(&work, export.join("workspace")).unwrap();
    fs::write(
        export.join(".awcp/manifest.json"),
        json!({"delegationId": id, "resources": [{"name": "workspace", "type": "fs", "mode": "rw"}]}).to_string(),
    )
    .unwrap();
    Dlg {
        id: id.to_string(),
        work,
        export,
    }
}

fn invite(id: &str, ttl: u64, access: &str, prompt: &str) -> Value {
    json!({"version":"1","type":"INVITE","delegationId":id,
        "task":{"description":"test task","prompt":prompt},
        "lease":{"ttlSeconds":ttl,"accessMode":access},"retentionMs":604800000,
        "environment":{"resources":[{"name":"workspace","type":"fs","mode":access}]},
        "requirements":{"transport":"sshfs"}})
}

/// An ephemeral key and a certificate for `user` signed by the sshd's CA.
fn credential(sshd: &TestSshd, dir: &Path) -> (String, String) {
    let key = dir.join("dlg_key");
    let _ = fs::remove_file(&key);
    let _ = fs::remove_file(key.with_extension("pub"));
    let ok = |c: &mut Command| {
        assert!(
            c.stdin(Stdio::null()).output().unwrap().status.success(),
            "{c:?}"
        )
    };
    ok(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key));
    ok(Command::new("ssh-keygen")
        .args(["-q", "-s"])
        .arg(&sshd.ca_key_path)
        .args(["-I", "awcp-test", "-n", &sshd.user, "-V", "+1h"])
        .arg(key.with_extension("pub")));
    let cert = dir.join("dlg_key-cert.pub");
    (
        fs::read_to_string(&key).unwrap(),
        fs::read_to_string(cert).unwrap(),
    )
}

fn start_msg(
    sshd: &TestSshd,
    d: &Dlg,
    expires: SystemTime,
    access: &str,
    cred: &(String, String),
) -> Value {
    json!({"version":"1","type":"START","delegationId":d.id,
        "lease":{"expiresAt":format_rfc3339(expires),"accessMode":access},
        "transportHandle":{"transport":"sshfs",
            "endpoint":{"host":"127.0.0.1","port":sshd.port,"user":sshd.user},
            "exportLocator":format!("{}/", d.export.display()),
            "credential":{"privateKey":cred.0,"certificate":cred.1}}})
}

struct Client {
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
    url: String,
}

impl Client {
    fn new(url: String) -> Client {
        Client::from_address(url, None)
    }

    /// A client whose connections come from `local` (another loopback address: another
    /// delegator, as the executor sees it).
    fn from_address(url: String, local: Option<std::net::IpAddr>) -> Client {
        Client {
            rt: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap(),
            http: reqwest::Client::builder()
                .local_address(local)
                .build()
                .unwrap(),
            url,
        }
    }

    fn base(&self) -> String {
        self.url.trim_end_matches("/awcp").to_string()
    }

    /// (status, JSON body)
    fn req(&self, method: reqwest::Method, path: &str, body: Option<Vec<u8>>) -> (u16, Value) {
        let url = format!("{}{path}", self.base());
        let http = self.http.clone();
        self.rt.block_on(async move {
            let mut r = http.request(method, &url).timeout(DEADLINE);
            if let Some(b) = body {
                r = r.header("content-type", "application/json").body(b);
            }
            let resp = r.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap();
            (
                status,
                serde_json::from_str(&text).unwrap_or(Value::String(text)),
            )
        })
    }

    fn post(&self, msg: &Value) -> (u16, Value) {
        self.req(
            reqwest::Method::POST,
            "/awcp",
            Some(msg.to_string().into_bytes()),
        )
    }

    fn get(&self, path: &str) -> (u16, Value) {
        self.req(reqwest::Method::GET, path, None)
    }

    fn post_path(&self, path: &str) -> (u16, Value) {
        self.req(reqwest::Method::POST, path, None)
    }

    /// Open the SSE stream now; events arrive on the returned channel until the terminal one.
    /// `POST /awcp/cancel/ID`.
    fn cancel(&self, id: &str) -> (u16, Value) {
        self.post_path(&format!("/awcp/cancel/{id}"))
    }

    /// `GET /awcp/tasks/ID/result`.
    fn result(&self, id: &str) -> (u16, Value) {
        self.get(&format!("/awcp/tasks/{id}/result"))
    }

    fn subscribe(&self, id: &str) -> Events {
        let url = format!("{}/awcp/tasks/{id}/events", self.base());
        let (tx, rx) = std::sync::mpsc::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let http = self.http.clone();
        self.rt.spawn(async move {
            let mut resp = http
                .get(&url)
                .header("accept", "text/event-stream")
                .send()
                .await
                .expect("SSE");
            assert_eq!(resp.headers()["content-type"], "text/event-stream");
            let _ = ready_tx.send(());
            let mut buf = String::new();
            while let Ok(Some(chunk)) = resp.chunk().await {
                buf.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(i) = buf.find('\n') {
                    let line = buf[..i].to_string();
                    buf.drain(..=i);
                    if let Some(data) = line.strip_prefix("data: ") {
                        let ev: Value = serde_json::from_str(data).expect("event JSON");
                        let _ = tx.send(ev);
                    }
                }
            }
        });
        ready_rx
            .recv_timeout(DEADLINE)
            .expect("SSE stream did not open");
        Events { rx }
    }
}

struct Events {
    rx: std::sync::mpsc::Receiver<Value>,
}

impl Events {
    /// Every event up to and including the terminal one.
    fn until_end(&self, timeout: Duration) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = self
                .rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no terminal event within {timeout:?}; got {out:?}"));
            let end = ev["type"] == "done" || ev["type"] == "error";
            out.push(ev);
            if end {
                return out;
            }
        }
    }
}

/// INVITE, subscribe, START; returns the ACCEPT and the event stream.
fn delegate(
    c: &Client,
    sshd: &TestSshd,
    d: &Dlg,
    access: &str,
    ttl: u64,
    prompt: &str,
    key_dir: &Path,
) -> (Value, Events) {
    let (st, accept) = c.post(&invite(&d.id, ttl, access, prompt));
    assert_eq!(st, 200, "{accept}");
    assert_eq!(accept["type"], "ACCEPT", "{accept}");
    let events = c.subscribe(&d.id);
    let cred = credential(sshd, key_dir);
    let granted = accept["executorConstraints"]["acceptedAccessMode"]
        .as_str()
        .unwrap()
        .to_string();
    let expires = SystemTime::now() + Duration::from_secs(ttl);
    let (st, ok) = c.post(&start_msg(sshd, d, expires, &granted, &cred));
    assert_eq!((st, &ok), (200, &json!({"ok": true})));
    (accept, events)
}

fn task_policy() -> &'static str {
    "command = [\"/bin/sh\", \"-c\", \"eval \\\"$AWCP_TASK_PROMPT\\\"\"]\ntimeout_seconds = 60\n"
}

fn terminal(evs: &[Value]) -> &Value {
    evs.last().unwrap()
}

// ------------------------------------------------------------------ tests

/// The whole happy path, with the sandbox checked from inside the task.
#[test]
fn rw_delegation_writes_land_in_the_delegators_directory() {
    let sshd = TestSshd::start();
    let serve = Serve::start(Some(&sshd), "", "", task_policy());
    let c = Client::new(serve.url());
    let d = delegation(&sshd, "dlg_708a1b37395d4eeba716dd113309865a");
    let secret = serve.policy.display().to_string();
    let prompt = format!(
        "cd workspace && cat README.md > copy.txt && echo \"$AWCP_DELEGATION_ID $AWCP_ACCESS_MODE\" > env.txt \
         && (cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' > net.txt) \
         && (cat {secret} > /dev/null 2> landlock.txt; echo $? >> landlock.txt) \
         && echo 'copied the readme' > \"$AWCP_SUMMARY_FILE\" && echo workspace/copy.txt > \"$AWCP_HIGHLIGHTS_FILE\""
    );
    let (accept, events) = delegate(&c, &sshd, &d, "rw", 600, &prompt, serve.base.path());
    let mp = serve.mount_root().join(&d.id);
    assert_eq!(accept["executorWorkDir"]["path"], mp.display().to_string());
    assert_eq!(accept["executorConstraints"]["maxTtlSeconds"], 600);
    assert_eq!(
        accept["executorConstraints"]["sandboxProfile"],
        json!({"cwdOnly": true, "allowNetwork": false, "allowExec": true})
    );
    let evs = events.until_end(DEADLINE);
    assert_eq!(evs[0]["type"], "status", "{evs:?}");
    assert_eq!(evs[0]["status"], "running");
    let done = terminal(&evs);
    assert_eq!(done["type"], "done", "{evs:?}\n{}", serve.log());
    assert_eq!(done["summary"], "copied the readme");
    assert_eq!(done["highlights"], json!(["workspace/copy.txt"]));
    // The task's writes are in the delegator's real directory.
    assert_eq!(
        fs::read_to_string(d.work.join("copy.txt")).unwrap(),
        "hello from the delegator\n"
    );
    assert_eq!(
        fs::read_to_string(d.work.join("env.txt")).unwrap(),
        format!("{} rw\n", d.id)
    );
    // allowNetwork: false -> a namespace with nothing but lo.
    assert_eq!(
        fs::read_to_string(d.work.join("net.txt")).unwrap().trim(),
        "lo"
    );
    // cwdOnly: true -> the policy file next to the mount root cannot be read.
    let ll = fs::read_to_string(d.work.join("landlock.txt")).unwrap();
    assert!(
        ll.contains("Permission denied") && ll.trim_end().ends_with('1'),
        "{ll}"
    );
    // The workspace is unmounted before `done` is sent; the mount point is gone.
    assert!(!is_awcp_mounted(&mp) && !mp.exists());
    let (st, result) = c.result(&d.id);
    assert_eq!((st, result["status"].as_str()), (200, Some("completed")));
    // A subscriber arriving after the end gets the terminal event again.
    let late = c.subscribe(&d.id).until_end(DEADLINE);
    assert_eq!(late.last().unwrap()["type"], "done");
    assert_eq!(
        c.post_path(&format!("/awcp/tasks/{}/ack", d.id)),
        (200, json!({"ok": true}))
    );
    assert_eq!(c.result(&d.id).0, 404);
    assert!(!serve
        .base
        .path()
        .join("state/delegations")
        .join(format!("{}.json", d.id))
        .exists());
}

/// No task command: the executor's agent works in the mount and reports with the client
/// commands; `status` shows the delegation with its quota use.
#[test]
fn agent_reports_through_the_client_commands() {
    let sshd = TestSshd::start();
    let serve = Serve::start(Some(&sshd), "[quota]\nmax_bytes = 100000", "", "");
    let c = Client::new(serve.url());
    let d = delegation(&sshd, "dlg_agent");
    let (_, events) = delegate(
        &c,
        &sshd,
        &d,
        "rw",
        600,
        "edit the readme",
        serve.base.path(),
    );
    let mp = serve.mount_root().join(&d.id);
    assert!(
        poll_until(DEADLINE, || is_awcp_mounted(&mp)),
        "{}",
        serve.log()
    );
    fs::write(mp.join("workspace/agent.txt"), "12345").unwrap();
    assert_eq!(
        fs::read_to_string(d.work.join("agent.txt")).unwrap(),
        "12345"
    );
    let out = run_ok(Command::new(BIN).args(["status", "--json", "--executor", &serve.url()]));
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    let me = all
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["delegation"] == d.id.as_str())
        .unwrap_or_else(|| panic!("{all}"));
    assert_eq!(me["mountpoint"], mp.display().to_string());
    assert_eq!(
        (me["state"].as_str(), me["access_mode"].as_str()),
        (Some("active"), Some("rw"))
    );
    assert_eq!(me["quota"]["bytes_used"], 5);
    assert_eq!(me["quota"]["bytes_max"], 100000);
    assert!(me["delegation_expires_at"].is_string());
    let text = Command::new(BIN)
        .args(["status", "--executor", &serve.url()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("delegation  {} (active, rw", d.id))
            && text.contains("5 of 100000 bytes"),
        "{text}"
    );
    run_ok(Command::new(BIN).args([
        "done",
        &d.id,
        "--summary",
        "wrote agent.txt",
        "--highlight",
        "workspace/agent.txt",
        "--executor",
        &serve.url(),
    ]));
    let evs = events.until_end(DEADLINE);
    assert_eq!(terminal(&evs)["type"], "done", "{evs:?}");
    assert_eq!(terminal(&evs)["summary"], "wrote agent.txt");
    assert_eq!(terminal(&evs)["highlights"], json!(["workspace/agent.txt"]));
    assert!(!is_awcp_mounted(&mp));
    // cancel after the end: nothing to do, and said so.
    let out = Command::new(BIN)
        .args(["cancel", &d.id, "--json", "--executor", &serve.url()])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, json!({"ok": true, "cancelled": false}));
    let out = Command::new(BIN)
        .args(["cancel", "dlg_nope", "--executor", &serve.url()])
        .output()
        .unwrap();
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("Delegation not found: dlg_nope")
    );
}

/// An `ro` lease cannot write; the quota gives ENOSPC and the failed task reports it.
#[test]
fn ro_lease_cannot_write_and_quota_failures_are_reported() {
    let sshd = TestSshd::start();
    let serve = Serve::start(Some(&sshd), "[quota]\nmax_bytes = 10000", "", task_policy());
    let c = Client::new(serve.url());

    let ro = delegation(&sshd, "dlg_ro");
    let (accept, events) = delegate(
        &c,
        &sshd,
        &ro,
        "ro",
        600,
        "echo changed > workspace/README.md",
        serve.base.path(),
    );
    assert_eq!(accept["executorConstraints"]["acceptedAccessMode"], "ro");
    let evs = events.until_end(DEADLINE);
    let e = terminal(&evs);
    assert_eq!(
        (e["type"].as_str(), e["code"].as_str()),
        (Some("error"), Some("TASK_FAILED")),
        "{evs:?}"
    );
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("Read-only file system"),
        "{e}"
    );
    assert_eq!(
        fs::read_to_string(ro.work.join("README.md")).unwrap(),
        "hello from the delegator\n"
    );

    let q = delegation(&sshd, "dlg_quota");
    let (_, events) = delegate(
        &c,
        &sshd,
        &q,
        "rw",
        600,
        "head -c 20000 /dev/zero > workspace/big.bin",
        serve.base.path(),
    );
    let evs = events.until_end(DEADLINE);
    let e = terminal(&evs);
    assert_eq!(e["code"], "TASK_FAILED", "{evs:?}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("No space left on device"),
        "{e}"
    );
    assert!(
        e["hint"]
            .as_str()
            .unwrap()
            .contains("quota allows 10000 bytes"),
        "{e}"
    );
    let size = fs::metadata(q.work.join("big.bin"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(size <= 10000, "{size}");
}

/// At `expiresAt` the mount turns read-only; after the grace period the task is stopped, the
/// mount is gone and the delegator gets EXPIRED.
#[test]
fn lease_expiry_turns_read_only_and_ends_with_expired() {
    let sshd = TestSshd::start();
    // The grace period is the task's time, after the expiry, to try both writes and say so:
    // ample, so that slow process starts on a loaded machine do not cut it short.
    let serve = Serve::start_with_grace(Some(&sshd), "", "", task_policy(), 10);
    let c = Client::new(serve.url());
    let d = delegation(&sshd, "dlg_lease");
    // Both ways a write is refused: through a descriptor opened before the expiry (the
    // write(2) fails), and by a later open. `/bin/echo`, not the shell's: dash reports any
    // failed write of a builtin as "I/O error", whatever the errno (a run whose open came
    // just before the expiry and its write just after failed on that).
    let prompt = "cd workspace; echo before > a.txt; exec 3>> b.txt; \
                  while /bin/echo x >&3; do sleep 0.2; done; echo FD-REFUSED; \
                  while /bin/echo x >> b.txt; do sleep 0.2; done; echo WRITES-REFUSED; sleep 300";
    // A lease long enough for the mount and the task's first write even when setting them up
    // stalls for seconds; the end comes after it plus the grace period (10 s).
    let (_, events) = delegate(&c, &sshd, &d, "rw", 20, prompt, serve.base.path());
    let evs = events.until_end(Duration::from_secs(60));
    let e = terminal(&evs);
    assert_eq!(e["code"], "EXPIRED", "{evs:?}\n{}", serve.logs());
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("echo: write error: Read-only file system")
            && msg.contains("cannot create b.txt: Read-only file system")
            && msg.contains("FD-REFUSED")
            && msg.contains("WRITES-REFUSED"),
        "{msg}\n{}",
        serve.logs()
    );
    assert_eq!(
        fs::read_to_string(d.work.join("a.txt")).unwrap(),
        "before\n"
    );
    let mp = serve.mount_root().join(&d.id);
    assert!(!is_awcp_mounted(&mp) && !mp.exists());
}

/// Cancel while the task runs (and an ERROR from the delegator for a pending one): the task
/// stops, the workspace is unmounted, CANCELLED is reported, the service keeps working.
#[test]
fn cancel_mid_task_and_delegator_error() {
    let sshd = TestSshd::start();
    let mut serve = Serve::start(Some(&sshd), "", "", task_policy());
    let c = Client::new(serve.url());
    let d = delegation(&sshd, "dlg_cancel");
    let (_, events) = delegate(
        &c,
        &sshd,
        &d,
        "rw",
        600,
        "echo started > workspace/started.txt; sleep 300",
        serve.base.path(),
    );
    // Its content, not only the name: the file exists on the server from the open on, and
    // on a loaded machine the cancel can come before the shell's write.
    assert!(
        poll_until(DEADLINE, || fs::read_to_string(d.work.join("started.txt"))
            .is_ok_and(|t| t == "started\n")),
        "{}",
        serve.log()
    );
    assert_eq!(
        c.cancel(&d.id),
        (200, json!({"ok": true, "cancelled": true}))
    );
    let evs = events.until_end(DEADLINE);
    assert_eq!(terminal(&evs)["code"], "CANCELLED", "{evs:?}");
    let mp = serve.mount_root().join(&d.id);
    assert!(!is_awcp_mounted(&mp) && !mp.exists());
    assert_eq!(
        fs::read_to_string(d.work.join("started.txt")).unwrap(),
        "started\n"
    );
    assert_eq!(
        c.cancel(&d.id),
        (200, json!({"ok": true, "cancelled": false}))
    );
    let (st, v) = c.post_path("/awcp/cancel/dlg_unknown");
    assert_eq!(
        (st, v),
        (404, json!({"error": "Delegation not found: dlg_unknown"}))
    );

    // ERROR from the delegator for a pending delegation.
    let p = delegation(&sshd, "dlg_pending");
    assert_eq!(c.post(&invite(&p.id, 600, "rw", "x")).1["type"], "ACCEPT");
    let ev = c.subscribe(&p.id);
    let err = json!({"version":"1","type":"ERROR","delegationId":p.id,"code":"CANCELLED","message":"user gave up"});
    assert_eq!(c.post(&err), (200, json!({"ok": true})));
    let evs = ev.until_end(DEADLINE);
    assert_eq!(terminal(&evs)["code"], "CANCELLED");
    assert!(!serve.mount_root().join(&p.id).exists());
    assert_eq!(c.get("/awcp/status").0, 200);

    // A clean stop (SIGTERM) with a task running: it is cancelled, unmounted, reported.
    let s = delegation(&sshd, "dlg_shutdown");
    let (_, events) = delegate(
        &c,
        &sshd,
        &s,
        "rw",
        600,
        "echo started > workspace/started.txt; sleep 300",
        serve.base.path(),
    );
    assert!(
        poll_until(DEADLINE, || s.work.join("started.txt").exists()),
        "{}",
        serve.log()
    );
    let t0 = Instant::now();
    serve.stop();
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "stop took {:?}",
        t0.elapsed()
    );
    let evs = events.until_end(DEADLINE);
    let e = terminal(&evs);
    assert_eq!(e["code"], "CANCELLED", "{evs:?}");
    assert!(
        e["message"].as_str().unwrap().contains("shutting down"),
        "{e}"
    );
    assert!(mount_points_under(serve.base.path()).is_empty());
}

/// `serve` killed mid-delegation: the next `serve` finds the leftover mount, detaches it,
/// removes the mount point once it is no longer mounted, and reports the delegation failed
/// to a delegator that reconnects; the delegator's files are intact.
#[test]
fn restart_mid_delegation_cleans_up_and_reports() {
    let sshd = TestSshd::start();
    let mut serve = Serve::start(Some(&sshd), "", "", task_policy());
    let c = Client::new(serve.url());
    let d = delegation(&sshd, "dlg_restart");
    let (_, _events) = delegate(
        &c,
        &sshd,
        &d,
        "rw",
        600,
        "echo started > workspace/started.txt; sleep 300",
        serve.base.path(),
    );
    let mp = serve.mount_root().join(&d.id);
    assert!(
        poll_until(DEADLINE, || d.work.join("started.txt").exists()),
        "{}",
        serve.log()
    );
    serve.kill();
    assert!(is_awcp_mounted(&mp), "the mount outlives a crashed serve");
    serve.spawn();
    assert!(
        poll_until(DEADLINE, || !is_awcp_mounted(&mp) && !mp.exists()),
        "{}",
        serve.log()
    );
    let evs = c.subscribe(&d.id).until_end(DEADLINE);
    let e = terminal(&evs);
    assert_eq!(e["code"], "TASK_FAILED", "{evs:?}");
    assert!(e["message"].as_str().unwrap().contains("restarted"), "{e}");
    assert_eq!(c.result(&d.id).1["status"], "error");
    assert_eq!(
        fs::read_to_string(d.work.join("README.md")).unwrap(),
        "hello from the delegator\n"
    );
    assert_eq!(
        fs::read_to_string(d.work.join("started.txt")).unwrap(),
        "started\n"
    );
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Hostile and wrong inputs get precise errors and change nothing on disk.
#[test]
fn hostile_inputs_are_refused_precisely() {
    let sshd = TestSshd::start();
    let token = "a-token-of-sixteen-plus";
    let serve = Serve::start(
        Some(&sshd),
        "allowed_access_modes = [\"ro\"]",
        &format!("token = {token:?}\nmax_ttl_seconds = 900\n"),
        task_policy(),
    );
    let c = Client::new(serve.url());
    let auth = |mut v: Value| {
        v["auth"] = json!({"type": "bearer", "credential": token});
        v
    };
    let d = delegation(&sshd, "dlg_h");
    let before_export = listing(&sshd.export_dir);
    let before_base = listing(serve.base.path());

    let (st, v) = c.post(&auth(invite("../escape", 60, "rw", "x")));
    assert_eq!(st, 400);
    assert!(
        v["error"].as_str().unwrap().starts_with("delegationId:"),
        "{v}"
    );
    let (st, v) = c.req(
        reqwest::Method::POST,
        "/awcp",
        Some(b"{\"version\":\"1\",".to_vec()),
    );
    assert_eq!(st, 400);
    assert!(
        v["error"].as_str().unwrap().contains("not valid JSON"),
        "{v}"
    );
    let big = vec![b' '; 2 * 1024 * 1024];
    let (st, v) = c.req(reqwest::Method::POST, "/awcp", Some(big));
    assert_eq!(st, 413, "{v}");
    assert!(v["error"].as_str().unwrap().contains("65536"), "{v}");
    // The same from a client that sends all of a body far larger than the socket buffers
    // before reading: the server reads it to its end, so the 413 reaches the client (it used
    // to close with the body unread: the kernel reset the connection under the client's
    // writes, and reqwest above failed with "error sending request" now and then).
    {
        use std::io::{Read, Write};
        let addr = c.base().trim_start_matches("http://").to_string();
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        s.set_write_timeout(Some(DEADLINE)).unwrap();
        let body = vec![b' '; 32 * 1024 * 1024];
        write!(
            s,
            "POST /awcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .unwrap();
        s.write_all(&body)
            .expect("the server stopped reading the body before its end");
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(answer.contains("max_body_bytes"), "{answer}");
    }
    let keys = tempfile::tempdir().unwrap();
    let cred = credential(&sshd, keys.path());
    let (st, v) = c.post(&start_msg(
        &sshd,
        &d,
        SystemTime::now() + Duration::from_secs(60),
        "ro",
        &cred,
    ));
    assert_eq!(
        (st, v),
        (404, json!({"error": "Delegation not found: dlg_h"}))
    );
    let (st, v) = c.post(&invite("dlg_h", 60, "rw", "x"));
    assert_eq!(
        (st, v["type"].as_str(), v["code"].as_str()),
        (200, Some("ERROR"), Some("AUTH_FAILED")),
        "{v}"
    );
    let mut inv = auth(invite("dlg_h", 60, "rw", "x"));
    inv["requirements"]["transport"] = json!("archive");
    assert_eq!(c.post(&inv).1["code"], "DEP_MISSING");
    assert_eq!(
        listing(serve.base.path()),
        before_base,
        "refusals created nothing"
    );
    assert!(listing(&serve.mount_root()).is_empty());

    // Narrowing: TTL capped, rw downgraded (policy allows ro only).
    let (_, accept) = c.post(&auth(invite("dlg_h", 99999, "rw", "x")));
    assert_eq!(accept["type"], "ACCEPT", "{accept}");
    assert_eq!(accept["executorConstraints"]["maxTtlSeconds"], 900);
    assert_eq!(accept["executorConstraints"]["acceptedAccessMode"], "ro");
    let events = c.subscribe("dlg_h");
    // An option-like user: refused, naming the field; the delegation stays pending.
    let mut bad = start_msg(
        &sshd,
        &d,
        SystemTime::now() + Duration::from_secs(60),
        "ro",
        &cred,
    );
    bad["transportHandle"]["endpoint"]["user"] = json!("-oProxyCommand=touch /tmp/pwned");
    let (st, v) = c.post(&bad);
    assert_eq!(st, 400);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .starts_with("transportHandle.endpoint.user:"),
        "{v}"
    );
    assert_eq!(c.get("/awcp/status").1["pendingInvitations"], 1);
    // An expired START.
    let (st, v) = c.post(&start_msg(
        &sshd,
        &d,
        SystemTime::now() - Duration::from_secs(5),
        "ro",
        &cred,
    ));
    assert_eq!(
        (st, v["code"].as_str()),
        (400, Some("START_EXPIRED")),
        "{v}"
    );
    let evs = events.until_end(DEADLINE);
    assert_eq!(terminal(&evs)["code"], "START_EXPIRED");
    assert!(listing(&serve.mount_root()).is_empty());
    // A second START for the same id: wrong state.
    let (st, v) = c.post(&start_msg(
        &sshd,
        &d,
        SystemTime::now() + Duration::from_secs(60),
        "ro",
        &cred,
    ));
    assert_eq!(st, 409, "{v}");
    // Unknown id on the event stream: one NOT_FOUND error event.
    let evs = c.subscribe("dlg_nothing").until_end(DEADLINE);
    assert_eq!((evs.len(), evs[0]["code"].as_str()), (1, Some("NOT_FOUND")));
    assert_eq!(c.get("/awcp/tasks/..%2Fx/result").0, 404);
    // Nothing changed on the delegator's side, nothing is mounted, nothing escaped.
    assert_eq!(listing(&sshd.export_dir), before_export);
    assert_eq!(listing(&d.work), vec!["README.md".to_string()]);
    assert!(!Path::new("/tmp/pwned").exists());
    assert!(mount_points_under(serve.base.path()).is_empty());
    assert!(
        !serve.base.path().join("escape").exists()
            && !serve.mount_root().join("../escape").exists()
    );

    // The A2A binding: agent card and an INVITE in a data part, answered in kind.
    let (st, card) = c.get("/.well-known/agent.json");
    assert_eq!(st, 200);
    assert_eq!(
        card["capabilities"]["extensions"][0]["uri"],
        "https://awcp-protocol.org/v1"
    );
    let rpc = json!({"jsonrpc":"2.0","id":"7","method":"message/send","params":{"message":{"role":"agent","messageId":"m1",
        "parts":[{"kind":"data","data":{"awcp":{"version":"1","type":"INVITE","delegation_id":"dlg_a2a",
            "task":{"description":"d","prompt":"p"},"lease":{"ttl_seconds":60,"access_mode":"ro"},
            "workspace":{"export_name":"awcp/dlg_a2a"},"requirements":{"transport":"sshfs"},
            "auth":{"type":"bearer","credential":token}}}}]}}});
    let (st, v) = c.req(
        reqwest::Method::POST,
        "/a2a",
        Some(rpc.to_string().into_bytes()),
    );
    assert_eq!((st, &v["id"]), (200, &json!("7")), "{v}");
    let a = &v["result"]["parts"][0]["data"]["awcp"];
    assert_eq!(a["type"], "ACCEPT", "{v}");
    assert_eq!(
        a["remote_mount"]["mount_point"],
        serve.mount_root().join("dlg_a2a").display().to_string()
    );
    assert_eq!(a["remote_constraints"]["sandbox_profile"]["cwd_only"], true);
}

/// A delegation belongs to the client that invited it: another delegator allowed to use the
/// executor (here 127.0.0.3, the owner 127.0.0.2) can neither START, cancel, end nor ack it;
/// the owner can, and so can this machine's operator (127.0.0.1: `awcp-mount cancel`).
#[test]
fn only_the_inviting_client_may_act_on_a_delegation() {
    let sshd = TestSshd::start();
    let serve = Serve::start(Some(&sshd), "", "", task_policy());
    let addr = |a: &str| Some(a.parse::<std::net::IpAddr>().unwrap());
    let owner = Client::from_address(serve.url(), addr("127.0.0.2"));
    let other = Client::from_address(serve.url(), addr("127.0.0.3"));
    let operator = Client::new(serve.url());
    let d = delegation(&sshd, "dlg_owned");
    let (st, accept) = owner.post(&invite(&d.id, 600, "rw", "true"));
    assert_eq!(
        (st, accept["type"].as_str()),
        (200, Some("ACCEPT")),
        "{accept}"
    );
    let cred = credential(&sshd, serve.base.path());
    let start = start_msg(
        &sshd,
        &d,
        SystemTime::now() + Duration::from_secs(600),
        "rw",
        &cred,
    );
    let refused = |(st, v): (u16, Value), what: &str| {
        assert_eq!(st, 403, "{what}: {v}");
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("was invited by 127.0.0.2"),
            "{what}: {v}"
        );
    };
    refused(other.post(&start), "START");
    refused(other.cancel(&d.id), "cancel");
    refused(
        other.post(&json!({"version":"1","type":"ERROR","delegationId":d.id,
            "code":"CANCELLED","message":"not yours"})),
        "ERROR",
    );
    refused(other.post_path(&format!("/awcp/tasks/{}/ack", d.id)), "ack");
    // Nor see it: its events, its result, its line in the status.
    refused(other.result(&d.id), "result");
    refused(other.get(&format!("/awcp/tasks/{}/events", d.id)), "events");
    let listed = |c: &Client| {
        let (st, v) = c.get("/awcp/status");
        assert_eq!(st, 200, "{v}");
        v["delegations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["id"] == json!(d.id))
    };
    assert!(!listed(&other), "another client sees the delegation");
    assert!(
        listed(&owner) && listed(&operator),
        "its owner and the operator do not"
    );
    let (st, v) = owner.result(&d.id);
    assert_eq!(
        (st, &v["status"]),
        (200, &json!("running")),
        "untouched: {v}"
    );
    // The operator of this machine may cancel it; then its owner may ack it.
    let (st, v) = operator.cancel(&d.id);
    assert_eq!((st, &v["cancelled"]), (200, &json!(true)), "{v}");
    refused(other.post_path(&format!("/awcp/tasks/{}/ack", d.id)), "ack");
    assert_eq!(
        owner.post_path(&format!("/awcp/tasks/{}/ack", d.id)),
        (200, json!({"ok": true}))
    );
}

/// `max_concurrent` holds at START too: invitations accepted while nothing ran cannot all be
/// started at once. The START over the limit is refused and the delegation stays pending.
#[test]
fn max_concurrent_holds_at_start() {
    let sshd = TestSshd::start();
    let serve = Serve::start(Some(&sshd), "", "max_concurrent = 1\n", task_policy());
    let c = Client::new(serve.url());
    let a = delegation(&sshd, "dlg_first");
    let b = delegation(&sshd, "dlg_second");
    for d in [&a, &b] {
        let (st, v) = c.post(&invite(&d.id, 600, "rw", "sleep 60"));
        assert_eq!((st, v["type"].as_str()), (200, Some("ACCEPT")), "{v}");
    }
    let cred = credential(&sshd, serve.base.path());
    let expires = SystemTime::now() + Duration::from_secs(600);
    let events = c.subscribe(&a.id);
    assert_eq!(
        c.post(&start_msg(&sshd, &a, expires, "rw", &cred)),
        (200, json!({"ok": true}))
    );
    let (st, v) = c.post(&start_msg(&sshd, &b, expires, "rw", &cred));
    assert_eq!(st, 409, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("Maximum concurrent delegations reached"),
        "{v}"
    );
    let (st, v) = c.result(&b.id);
    assert_eq!(
        (st, &v["status"]),
        (200, &json!("running")),
        "still pending: {v}"
    );
    let (st, v) = c.cancel(&a.id);
    assert_eq!((st, &v["cancelled"]), (200, &json!(true)), "{v}");
    assert_eq!(terminal(&events.until_end(DEADLINE))["type"], "error");
    c.cancel(&b.id);
}

/// Finished delegations are kept for their retention, but not without bound: INVITE and
/// cancel in a loop leaves at most `MAX_FINISHED_KEPT` (256) records in memory and on disk,
/// the oldest going first.
#[test]
fn finished_delegations_kept_are_bounded() {
    let serve = Serve::start(None, "", "", "");
    let c = Client::new(serve.url());
    let n = 260;
    for i in 0..n {
        let id = format!("dlg_loop_{i}");
        let (st, v) = c.post(&invite(&id, 600, "rw", "x"));
        assert_eq!((st, v["type"].as_str()), (200, Some("ACCEPT")), "{v}");
        let (st, v) = c.cancel(&id);
        assert_eq!(st, 200, "{v}");
    }
    let kept = fs::read_dir(serve.base.path().join("state/delegations"))
        .unwrap()
        .count();
    assert_eq!(kept, 256, "records on disk");
    assert_eq!(
        c.get("/awcp/tasks/dlg_loop_0/result").0,
        404,
        "the oldest went"
    );
    let (st, v) = c.get(&format!("/awcp/tasks/dlg_loop_{}/result", n - 1));
    assert_eq!((st, &v["status"]), (200, &json!("error")), "{v}");
}

/// What a task leaves running in the background (a `sleep &`, a dev server) ends with the
/// task, also when the task itself ended first: it would keep the workspace busy, and run
/// on after the delegation as the executor's user.
#[test]
fn a_tasks_background_processes_end_with_it() {
    let sshd = TestSshd::start();
    let serve = Serve::start(Some(&sshd), "", "", task_policy());
    let c = Client::new(serve.url());
    let d = delegation(&sshd, "dlg_background");
    let prompt = "cd workspace && { sleep 300 >/dev/null 2>&1 & echo $! > bg.pid; } \
                  && echo started > \"$AWCP_SUMMARY_FILE\"";
    let (_, events) = delegate(&c, &sshd, &d, "rw", 600, prompt, serve.base.path());
    let evs = events.until_end(DEADLINE);
    assert_eq!(terminal(&evs)["type"], "done", "{evs:?}\n{}", serve.log());
    let pid = fs::read_to_string(d.work.join("bg.pid")).unwrap();
    let pid = pid.trim();
    // Gone, or a zombie nobody has reaped yet (a container's init may not).
    let state = fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(") ")
                .next()
                .map(|r| r.chars().next().unwrap_or('?'))
        });
    assert!(
        matches!(state, None | Some('Z') | Some('X')),
        "the task's background process {pid} still runs (state {state:?})"
    );
}

/// Only listed client addresses get in.
#[test]
fn clients_outside_allowed_clients_are_refused() {
    let serve = Serve::start(None, "", "allowed_clients = [\"10.0.0.0/8\"]\n", "");
    let c = Client::new(serve.url());
    let (st, v) = c.get("/awcp/status");
    assert_eq!(st, 403);
    assert!(
        v["error"].as_str().unwrap().contains("allowed_clients"),
        "{v}"
    );
}

/// A client that starts a body and never ends it gets 408 (after 30 s), not a connection
/// held for ever.
#[test]
fn a_body_that_never_ends_is_answered_408() {
    use std::io::{Read, Write};
    let serve = Serve::start(None, "", "", "");
    let c = Client::new(serve.url());
    let addr = c.base().trim_start_matches("http://").to_string();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "POST /awcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\nConnection: close\r\n\r\n{{\"version\""
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(answer.contains("did not arrive"), "{answer}");
}

/// A minimal host A2A endpoint: answers every POST with an empty JSON-RPC result and hands
/// the request bodies to the test.
fn host_a2a() -> (u16, std::sync::mpsc::Receiver<Value>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Bounded: a few requests at most, then the thread ends with the test.
        for stream in listener.incoming().take(4).flatten() {
            let _ = stream.set_read_timeout(Some(DEADLINE));
            let mut r = BufReader::new(stream);
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0u8; len];
            let _ = std::io::Read::read_exact(&mut r, &mut body);
            let answer = r#"{"jsonrpc":"2.0","id":"1","result":{"kind":"message","role":"agent","messageId":"h1","parts":[]}}"#;
            let mut s = r.into_inner();
            let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}", answer.len());
            if let Ok(v) = serde_json::from_slice(&body) {
                let _ = tx.send(v);
            }
        }
    });
    (port, rx)
}

/// The spec's A2A binding end to end: INVITE and START as `message/send` with snake_case
/// `awcp` data parts, and DONE sent back to the host's A2A endpoint by the executor.
#[test]
fn a2a_binding_delegation_reports_to_the_host() {
    let sshd = TestSshd::start();
    let serve = Serve::start(Some(&sshd), "", "", task_policy());
    let c = Client::new(serve.url());
    let d = delegation(&sshd, "dlg_a2a_e2e");
    let (host_port, host) = host_a2a();
    let rpc = |awcp: Value, meta: Value| {
        let body = json!({"jsonrpc":"2.0","id":"1","method":"message/send","params":{"message":{
            "role":"agent","messageId":"m","parts":[{"kind":"data","data":{"awcp":awcp}}]},"metadata":meta}});
        let (st, v) = c.req(
            reqwest::Method::POST,
            "/a2a",
            Some(body.to_string().into_bytes()),
        );
        assert_eq!(st, 200, "{v}");
        v["result"]["parts"][0]["data"]["awcp"].clone()
    };
    let accept = rpc(
        json!({"version":"1","type":"INVITE","delegation_id":d.id,"task":{"description":"d",
            "prompt":"echo via-a2a > workspace/a2a.txt && echo 'wrote a2a.txt' > \"$AWCP_SUMMARY_FILE\""},
            "lease":{"ttl_seconds":600,"access_mode":"rw"},"workspace":{"export_name":"awcp/x"},
            "requirements":{"transport":"sshfs"}}),
        json!({"awcp_reply_url": format!("http://127.0.0.1:{host_port}/a2a")}),
    );
    assert_eq!(accept["type"], "ACCEPT", "{accept}");
    assert_eq!(accept["remote_constraints"]["accepted_access_mode"], "rw");
    let keys = tempfile::tempdir().unwrap();
    let (key, cert) = credential(&sshd, keys.path());
    let expires = format_rfc3339(SystemTime::now() + Duration::from_secs(600));
    let ack = rpc(
        json!({"version":"1","type":"START","delegation_id":d.id,
            "lease":{"expires_at":expires,"access_mode":"rw"},
            "mount":{"transport":"sshfs","endpoint":{"host":"127.0.0.1","port":sshd.port,"user":sshd.user},
                "export_locator":format!("{}/", d.export.display()),
                "credential":{"private_key":key,"certificate":cert}}}),
        json!({}),
    );
    assert_eq!(ack["type"], "ACK", "{ack}");
    let sent = host
        .recv_timeout(DEADLINE)
        .unwrap_or_else(|_| panic!("no DONE at the host\n{}", serve.log()));
    assert_eq!(sent["method"], "message/send");
    let done = &sent["params"]["message"]["parts"][0]["data"]["awcp"];
    assert_eq!(done["type"], "DONE", "{sent}");
    assert_eq!(done["delegation_id"], d.id.as_str());
    assert_eq!(done["final_summary"], "wrote a2a.txt");
    assert_eq!(
        fs::read_to_string(d.work.join("a2a.txt")).unwrap(),
        "via-a2a\n"
    );
}

/// Mount failures carry their real cause: a certificate from a CA the server does not trust is
/// AUTH_FAILED; a delegator host key the executor does not know is MOUNT_FAILED naming
/// known_hosts, unless the policy accepts unknown keys (then the mount works).
#[test]
fn mount_failures_are_reported_precisely() {
    let sshd = TestSshd::start();
    let serve = Serve::start(Some(&sshd), "", "", task_policy());
    let c = Client::new(serve.url());
    let keys = tempfile::tempdir().unwrap();
    // A key certified by a CA of our own, which the sshd does not trust.
    let rogue_ca = keys.path().join("rogue_ca");
    let key = keys.path().join("k");
    for args in [
        vec![
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-f",
            rogue_ca.to_str().unwrap(),
        ],
        vec!["-q", "-t", "ed25519", "-N", "", "-f", key.to_str().unwrap()],
    ] {
        assert!(Command::new("ssh-keygen")
            .args(&args)
            .output()
            .unwrap()
            .status
            .success());
    }
    let pubkey = keys.path().join("k.pub");
    assert!(Command::new("ssh-keygen")
        .args([
            "-q",
            "-s",
            rogue_ca.to_str().unwrap(),
            "-I",
            "x",
            "-n",
            &sshd.user,
            "-V",
            "+1h",
            pubkey.to_str().unwrap()
        ])
        .output()
        .unwrap()
        .status
        .success());
    let cred = (
        fs::read_to_string(&key).unwrap(),
        fs::read_to_string(keys.path().join("k-cert.pub")).unwrap(),
    );
    let d = delegation(&sshd, "dlg_rogue");
    assert_eq!(
        c.post(&invite(&d.id, 600, "rw", "true")).1["type"],
        "ACCEPT"
    );
    let ev = c.subscribe(&d.id);
    let expires = SystemTime::now() + Duration::from_secs(600);
    assert_eq!(c.post(&start_msg(&sshd, &d, expires, "rw", &cred)).0, 200);
    let evs = ev.until_end(DEADLINE);
    let e = terminal(&evs);
    assert_eq!(e["code"], "AUTH_FAILED", "{evs:?}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("refused to authenticate"),
        "{e}"
    );
    assert!(!serve.mount_root().join(&d.id).exists());

    // Unknown host key: an empty known_hosts file.
    let empty = keys.path().join("empty_known_hosts");
    fs::write(&empty, "").unwrap();
    for (accept_unknown, want) in [(false, "error"), (true, "done")] {
        let serve = Serve::start(
            None,
            "",
            &format!(
                "known_hosts = {:?}\naccept_unknown_host_keys = {accept_unknown}\n",
                empty.display().to_string()
            ),
            task_policy(),
        );
        let c = Client::new(serve.url());
        let d = delegation(&sshd, &format!("dlg_hostkey_{accept_unknown}"));
        let (_, events) = delegate(
            &c,
            &sshd,
            &d,
            "rw",
            600,
            "echo ok > workspace/ok.txt",
            keys.path(),
        );
        let evs = events.until_end(DEADLINE);
        let e = terminal(&evs);
        assert_eq!(e["type"], want, "{evs:?}\n{}", serve.log());
        if !accept_unknown {
            assert_eq!(e["code"], "MOUNT_FAILED");
            assert!(e["hint"].as_str().unwrap().contains("known_hosts"), "{e}");
            assert!(!d.work.join("ok.txt").exists());
        } else {
            assert!(
                serve
                    .log()
                    .contains("accepting it (accept_unknown_host_keys = true)"),
                "{}",
                serve.log()
            );
            assert_eq!(fs::read_to_string(d.work.join("ok.txt")).unwrap(), "ok\n");
        }
    }
}
