//! `awcp-mount serve`: the AWCP executor endpoint (HTTP + SSE, and the A2A binding).
//!
//! * [`config`]: the policy's `[serve]` and `[task]` tables.
//! * [`executor`]: delegations and what each message does to them (admission, state machine).
//! * [`supervisor`]: one active delegation: mount, task, lease, cancel, teardown.
//! * [`mounter`]: the mount, run as a child `awcp-mount -f` with the credential on fds 3/4.
//! * [`task`], [`sandbox`]: the configured task command, in a network namespace and Landlock.
//! * [`store`], [`recovery`]: persistence, and what a restart finds.
//! * [`http`]: the routes, SSE, access control, body limits.

pub mod config;
pub mod executor;
pub mod http;
pub mod mounter;
pub mod recovery;
pub mod sandbox;
pub mod store;
pub mod supervisor;
pub mod task;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use executor::{Control, Executor, Settings};

/// Run the endpoint until SIGTERM/SIGINT.
pub fn run(listen: &str, policy: Option<PathBuf>) -> Result<(), String> {
    let listen: SocketAddr = listen
        .parse()
        .map_err(|e| format!("--listen {listen}: {e} (expected ADDRESS:PORT)"))?;
    let policy_path = policy.unwrap_or_else(|| PathBuf::from(crate::policy::DEFAULT_POLICY_PATH));
    let policy_path =
        std::path::absolute(&policy_path).map_err(|e| format!("{}: {e}", policy_path.display()))?;
    // The mount processes read the same file: it must exist (no silent built-in defaults).
    let policy = crate::policy::Policy::load(Some(&policy_path)).map_err(|e| e.0)?;
    let (serve, task) = config::load(&policy.serve, &policy.task, &policy.source)?;
    sandbox::probe(&task)?;
    let mount_root = policy.mount_root.canonicalize().map_err(|e| {
        format!(
            "mount_root {}: {e} (create it, mode 0700)",
            policy.mount_root.display()
        )
    })?;
    let store = store::Store::open(&serve.state_dir)?;
    let binary =
        std::env::current_exe().map_err(|e| format!("cannot find this program's path: {e}"))?;
    if !listen.ip().is_loopback() {
        tracing::warn!(
            "listening on {listen}, not loopback: only [serve] allowed_clients may connect"
        );
    }
    let records = store.load_all();
    let settings = Settings {
        policy,
        policy_path,
        mount_root,
        serve,
        task,
        binary,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("awcp-serve")
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    rt.block_on(async move {
        let exec = Executor::new(settings, store, records);
        let e = exec.clone();
        tokio::task::spawn_blocking(move || recovery::recover(&e))
            .await
            .map_err(|e| format!("recovery: {e}"))?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        eprintln!("awcp-mount serve: executor URL http://{listen}/awcp");
        let reaper = exec.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                reaper.reap();
            }
        });
        let app = http::router(exec.clone())
            .into_make_service_with_connect_info::<SocketAddr>();
        let stopping = std::sync::Arc::new(tokio::sync::Notify::new());
        let (stop_exec, stop_note) = (exec.clone(), stopping.clone());
        let server = axum::serve(listener, app).with_graceful_shutdown(async move {
            shutdown_signal().await;
            // Active delegations end first, so their SSE streams close with a final event.
            shut_down(&stop_exec).await;
            stop_note.notify_one();
        });
        // Subscribers of pending delegations keep their streams open: do not wait for them
        // for long (those delegations survive the restart).
        tokio::select! {
            r = server => r.map_err(|e| format!("server: {e}"))?,
            _ = async { stopping.notified().await; tokio::time::sleep(Duration::from_secs(2)).await } => {}
        }
        Ok(())
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// A clean stop ends every active delegation (its credential dies with us): the task is
/// stopped, the workspace unmounted, the delegator told `CANCELLED`.
async fn shut_down(exec: &Executor) {
    let active: Vec<_> = exec
        .all()
        .into_iter()
        .filter(|d| {
            d.send(Control::Cancel {
                code: crate::awcp::protocol::ErrorCode::Cancelled,
                message: "the executor (awcp-mount serve) is shutting down".into(),
            })
        })
        .collect();
    // A teardown stops the task (up to 7 s), then waits up to 75 s for the mount process
    // to send its last changes (`mounter::unmount`): cut short, they would be lost, and
    // the delegation left without its final event. (The packaged unit's TimeoutStopSec
    // leaves room for it.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(85);
    while tokio::time::Instant::now() < deadline
        && active.iter().any(|d| !d.snapshot().state.is_terminal())
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
