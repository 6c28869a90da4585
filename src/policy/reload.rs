//! Live reload: running mounts pick up an edited policy file without remounting.
//!
//! The directory holding the file is watched (editors replace files by renaming a new one over
//! them, which a watch on the file itself would miss). Each change is re-parsed; a file that
//! fails to parse is reported and the previous policy stays in force.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};

use super::{Policy, PolicyError};

/// Keeps the watch alive; dropping it stops watching.
pub struct PolicyWatch {
    _watcher: notify::RecommendedWatcher,
}

/// Call `apply` with every new valid version of the policy file at `path`, re-tightened with
/// whatever `retighten` applies (the command line's restatements). Runs on its own thread.
pub fn watch<F, T>(path: &Path, retighten: T, apply: F) -> Result<PolicyWatch, PolicyError>
where
    F: Fn(Policy) + Send + 'static,
    T: Fn(&mut Policy) -> Result<(), PolicyError> + Send + 'static,
{
    let file = path
        .canonicalize()
        .map_err(|e| PolicyError(format!("cannot watch {}: {e}", path.display())))?;
    let dir = file
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"));
    let (tx, rx) = mpsc::channel::<()>();
    let name = file.file_name().map(|n| n.to_os_string());
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = ev {
            if ev
                .paths
                .iter()
                .any(|p| p.file_name().map(|n| n.to_os_string()) == name)
            {
                let _ = tx.send(());
            }
        }
    })
    .map_err(|e| PolicyError(format!("cannot watch {}: {e}", dir.display())))?;
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(|e| PolicyError(format!("cannot watch {}: {e}", dir.display())))?;
    std::thread::Builder::new()
        .name("policy-reload".into())
        .spawn(move || {
            while rx.recv().is_ok() {
                // An editor's save is several events: let them settle, then read once.
                std::thread::sleep(Duration::from_millis(100));
                while rx.try_recv().is_ok() {}
                let loaded = std::fs::read_to_string(&file)
                    .map_err(|e| PolicyError(format!("cannot read policy {}: {e}", file.display())))
                    .and_then(|text| Policy::parse(&text, &file))
                    .and_then(|mut p| retighten(&mut p).map(|()| p));
                match loaded {
                    Ok(p) => {
                        tracing::info!(file = %file.display(), "policy reloaded");
                        apply(p);
                    }
                    Err(e) => {
                        tracing::warn!("policy not reloaded, the previous one stays in force: {e}")
                    }
                }
            }
        })
        .map_err(|e| PolicyError(format!("cannot start the policy watcher: {e}")))?;
    Ok(PolicyWatch { _watcher: watcher })
}
