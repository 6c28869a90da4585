//! sshfs-style daemon mode: the parent exits 0 only once the mount is live.
//!
//! The parent forks before any thread exists (tokio and fuser start threads, and forking a
//! threaded process is unsafe), then waits on a pipe. The child does the real work and writes
//! one line: `OK` once the kernel has mounted the filesystem, or `ERR <message>` when something
//! failed. If the child dies without a word, the parent says so. Either way the exit status of
//! the parent is what scripts (and AWCP executors) check.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};

use nix::unistd::{fork, setsid, ForkResult};

/// The child's end of the pipe: tells the waiting parent how the mount went.
pub struct Readiness {
    pipe: Option<File>,
}

impl Readiness {
    /// Foreground mode: nobody is waiting.
    pub fn none() -> Self {
        Readiness { pipe: None }
    }

    /// The mount is live: the parent exits 0. Standard streams are detached from the
    /// terminal from now on, as sshfs does.
    pub fn ready(&mut self) {
        if let Some(mut p) = self.pipe.take() {
            let _ = p.write_all(b"OK\n");
            detach_stdio();
        }
    }

    /// The mount failed: the parent prints `message` and exits 1.
    pub fn failed(&mut self, message: &str) {
        if let Some(mut p) = self.pipe.take() {
            let _ = p.write_all(format!("ERR {message}\n").as_bytes());
        }
    }

    pub fn is_daemon(&self) -> bool {
        self.pipe.is_some()
    }
}

fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..=2 {
            // SAFETY: dup2 onto the standard descriptors, which this process owns.
            unsafe {
                libc::dup2(null.as_raw_fd(), fd);
            }
        }
    }
}

/// Fork (the caller must have made its paths absolute: the child changes to "/"). In the
/// parent this never returns: it waits for the child's verdict and exits. In the
/// child it returns the [`Readiness`] to report through.
pub fn daemonize() -> std::io::Result<Readiness> {
    let (read_end, write_end): (OwnedFd, OwnedFd) = nix::unistd::pipe()?;
    // SAFETY: called before any thread is started (checked by the caller's structure: the
    // runtime and FUSE threads are created after this returns).
    match unsafe { fork() }? {
        ForkResult::Parent { .. } => {
            drop(write_end);
            let mut answer = String::new();
            let _ = File::from(read_end).read_to_string(&mut answer);
            let answer = answer.trim_end();
            if answer == "OK" {
                std::process::exit(0);
            }
            match answer.strip_prefix("ERR ") {
                Some(msg) => eprintln!("awcp-mount: {msg}"),
                None => eprintln!(
                    "awcp-mount: the mount process exited before the mount was ready \
                     (run with -f -d to see why)"
                ),
            }
            std::process::exit(1);
        }
        ForkResult::Child => {
            drop(read_end);
            let _ = setsid();
            // Like any daemon: do not keep the caller's directory (and its filesystem) busy.
            let _ = std::env::set_current_dir("/");
            Ok(Readiness {
                pipe: Some(File::from(write_end)),
            })
        }
    }
}
