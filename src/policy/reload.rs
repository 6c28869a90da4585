//! Live reload: running mounts pick up an edited policy file without remounting.
//!
//! The directory holding the file is watched (editors replace files by renaming a new one over
//! them, which a watch on the file itself would miss). Each change is re-parsed; a file that
//! fails to parse is reported and the previous policy stays in force.
//!
//! Only events that can change the file count: inotify also reports every open and read
//! close, and the reload itself reads the file, so those would make it reload forever (every
//! 100 ms, once anything had read it). A file whose text did not change is not applied again.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
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
            if may_change_content(&ev.kind)
                && ev
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
            let mut applied: Option<String> = None;
            while rx.recv().is_ok() {
                // An editor's save is several events: let them settle, then read once.
                std::thread::sleep(Duration::from_millis(100));
                while rx.try_recv().is_ok() {}
                let text = std::fs::read_to_string(&file).map_err(|e| {
                    PolicyError(format!("cannot read policy {}: {e}", file.display()))
                });
                if let (Ok(t), Some(last)) = (&text, &applied) {
                    if t == last {
                        continue;
                    }
                }
                let loaded = text.and_then(|text| {
                    let mut p = Policy::parse(&text, &file)?;
                    retighten(&mut p)?;
                    Ok((p, text))
                });
                match loaded {
                    Ok((p, text)) => {
                        tracing::info!(file = %file.display(), "policy reloaded");
                        apply(p);
                        applied = Some(text);
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

/// Whether an event can have changed a file: not an open or a close after reading.
fn may_change_content(kind: &EventKind) -> bool {
    match kind {
        EventKind::Create(_) | EventKind::Remove(_) => true,
        EventKind::Modify(ModifyKind::Metadata(_)) => false,
        EventKind::Modify(_) => true,
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) | EventKind::Any | EventKind::Other => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    /// Reading the policy file (another mount starting, `check-policy`, the reload itself)
    /// does not reload it; an edit does, once. (Every read used to trigger a reload, whose own
    /// read triggered the next: ten reloads a second, forever.)
    #[test]
    fn reads_do_not_reload_the_policy_and_an_edit_does_once() {
        let dir = std::env::temp_dir().join(format!("awcp-reload-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("policy.toml");
        std::fs::write(&file, "mount_root = \"/tmp\"\n").unwrap();
        let reloads = Arc::new(AtomicUsize::new(0));
        let counted = reloads.clone();
        let watch = watch(
            &file,
            |_| Ok(()),
            move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
            },
        )
        .unwrap();
        for _ in 0..3 {
            std::fs::read_to_string(&file).unwrap();
        }
        // A reload comes 100 ms after the event that asks for it.
        std::thread::sleep(Duration::from_millis(500));
        let after_reads = reloads.load(Ordering::SeqCst);
        std::fs::write(&file, "mount_root = \"/tmp\"\n[quota]\nmax_bytes = 1000\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while reloads.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(500));
        let after_edit = reloads.load(Ordering::SeqCst);
        drop(watch);
        std::fs::remove_file(&file).unwrap();
        std::fs::remove_dir(&dir).unwrap();
        assert_eq!(after_reads, 0, "reloaded after reads alone");
        assert_eq!(after_edit, 1, "reloads after one edit");
    }
}
