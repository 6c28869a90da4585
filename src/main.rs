//! The `awcp-mount` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgAction, Parser, Subcommand};

use awcp_mount::daemon::{self, Readiness};
use awcp_mount::mount::{self, MountRequest};
use awcp_mount::options::{MountOptions, RemoteSpec};
use awcp_mount::policy::Policy;
use awcp_mount::unmount;

/// `println!` for the command's own output, which may go to a pipe that closes early
/// (`awcp-mount status | head -1`): see [`write_stdout`].
macro_rules! outln {
    ($($arg:tt)*) => { write_stdout(format!("{}\n", format_args!($($arg)*)).as_bytes()) };
}

const AFTER_HELP: &str = "\
Examples:
  Mount a workspace (daemonizes once the mount is live, like sshfs):
    awcp-mount awcp@10.0.0.5:/srv/ws /var/lib/awcp/mounts/ws -o IdentityFile=~/.ssh/awcp_key

  The command line AWCP executors run for sshfs works unchanged:
    awcp-mount awcp@127.0.0.1:/home/awcp/.awcp/environments/dlg_1/ /var/lib/awcp/mounts/dlg_1 \\
      -o IdentityFile=key -o CertificateFile=key-cert.pub -o Port=2232 \\
      -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o reconnect \\
      -o ServerAliveInterval=15 -o ServerAliveCountMax=3 -o noappledouble -o follow_symlinks

  Unmount:
    awcp-mount umount /var/lib/awcp/mounts/ws      (or: fusermount3 -u, umount, SIGTERM)

Options for -o (comma-separated, repeatable):
  SSH:    IdentityFile=PATH  CertificateFile=PATH  Port=N  User=NAME
          StrictHostKeyChecking=yes|no  UserKnownHostsFile=PATH  ConnectTimeout=SECS
          ServerAliveInterval=SECS  ServerAliveCountMax=N
  sshfs:  reconnect  follow_symlinks  max_conns=N (1-10, default 4)  idmap=user|none
          dir_cache=yes|no  dcache_timeout=SECS  dcache_max_size=N
          max_readahead=BYTES (default 8 MiB)  sync_unlink  sync_create
          cache=no  cache_timeout=SECS  cache_stat_timeout=SECS  cache_dir_timeout=SECS
  FUSE:   ro  allow_other  allow_root  default_permissions  entry_timeout=SECS
          attr_timeout=SECS  negative_timeout=SECS  fsname=NAME  uid=N  gid=N  umask=MODE
          noexec  noatime  sync
  Accepted and ignored: macOS-only options (noappledouble, volname=, ...), sshfs
  tuning options with no effect here (big_writes, kernel_cache, transform_symlinks, ...)
  and subtype=.
  Any other option is an error.

Logging: quiet by default; -d, or AWCP_MOUNT_LOG=debug (a tracing filter), for more.";

#[derive(Parser, Debug)]
#[command(
    name = "awcp-mount",
    version,
    about = "Mount a directory lent by an AWCP delegator, over SSH/SFTP, with the executor's policy enforced",
    long_about = "awcp-mount mounts [USER@]HOST:[DIR] on a local directory through its own FUSE \
filesystem and a built-in SSH/SFTP client (no ssh or sshfs programs needed). It takes the same \
command line as sshfs, so an AWCP executor can run it in place of sshfs.",
    after_help = AFTER_HELP,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    /// The remote directory: [USER@]HOST:[DIR] (DIR relative to the login directory; empty
    /// for the login directory itself)
    #[arg(value_name = "[USER@]HOST:[DIR]", required = true)]
    remote: Option<String>,

    /// The local directory to mount on (must exist and be empty)
    #[arg(value_name = "MOUNTPOINT", required = true)]
    mountpoint: Option<PathBuf>,

    /// SSH port (same as -o Port=PORT)
    #[arg(short = 'p', value_name = "PORT", value_parser = awcp_mount::options::parse_port)]
    port: Option<u16>,

    /// Stay in the foreground (do not daemonize)
    #[arg(short = 'f')]
    foreground: bool,

    /// Debug output (implies -f)
    #[arg(short = 'd')]
    debug: bool,

    /// Mount options, comma-separated; repeatable (see below)
    #[arg(short = 'o', value_name = "OPT[,OPT...]", action = ArgAction::Append)]
    options: Vec<String>,

    /// Accept only this server host key ("ssh-ed25519 AAAA...", or a .pub file); repeatable.
    /// Replaces the known_hosts check.
    #[arg(long = "host-key", value_name = "KEY")]
    host_keys: Vec<String>,

    /// Policy file (default /etc/awcp/policy.toml if it exists, else built-in safe defaults)
    #[arg(long = "policy", value_name = "FILE")]
    policy: Option<PathBuf>,

    /// The lease's end (RFC 3339, e.g. 2026-11-22T12:22:29Z): the mount turns read-only then,
    /// and is unmounted after the policy's grace period
    #[arg(long = "expires-at", value_name = "TIME")]
    expires_at: Option<String>,

    /// Read the private key (OpenSSH text) from this inherited file descriptor instead of a
    /// file, so it is never written to disk (used by `awcp-mount serve`)
    #[arg(long = "identity-fd", value_name = "FD")]
    identity_fd: Option<i32>,

    /// Read the OpenSSH user certificate from this inherited file descriptor
    #[arg(long = "certificate-fd", value_name = "FD")]
    certificate_fd: Option<i32>,

    /// Compression (accepted for sshfs compatibility; not used)
    #[arg(short = 'C', hide = true)]
    compression: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate a policy file and print the policy it yields
    CheckPolicy {
        /// The file (default /etc/awcp/policy.toml)
        file: Option<PathBuf>,
    },
    /// Say whether a mount at MOUNTPOINT would be allowed by the policy, and why not
    Check {
        mountpoint: PathBuf,
        #[arg(long = "policy", value_name = "FILE")]
        policy: Option<PathBuf>,
    },
    /// Turn a running mount read-only now (writes already made are flushed first)
    Downgrade { mountpoint: PathBuf },
    /// Write the man page or shell completions (for packaging)
    #[command(hide = true)]
    Generate {
        /// `man`, `bash`, `zsh` or `fish`
        what: String,
    },
    /// Show the running mounts (remote, access, quota, lease, traffic) and, when an
    /// `awcp-mount serve` answers, its delegations (state, mount point, access, quota, expiry)
    Status {
        /// Only this mount
        mountpoint: Option<PathBuf>,
        /// Machine-readable output
        #[arg(long)]
        json: bool,
        /// The executor URL of `awcp-mount serve`
        #[arg(long, value_name = "URL", default_value = awcp_mount::awcp::client::DEFAULT_EXECUTOR)]
        executor: String,
    },
    /// Run the AWCP executor endpoint (HTTP + SSE, and A2A) on ADDRESS:PORT; the executor URL
    /// is http://ADDRESS:PORT/awcp
    Serve {
        #[arg(long, value_name = "ADDRESS:PORT", default_value = "127.0.0.1:4101")]
        listen: String,
        /// Policy file, with its [serve] and [task] tables (default /etc/awcp/policy.toml)
        #[arg(long = "policy", value_name = "FILE")]
        policy: Option<PathBuf>,
    },
    /// Report a delegation as done (for an agent working in the mount without a [task]
    /// command): the delegation's workspace is unmounted and the delegator gets `done`
    Done {
        /// The delegation id
        id: String,
        /// What was done
        #[arg(long)]
        summary: String,
        /// A path worth looking at (repeatable)
        #[arg(long = "highlight", value_name = "PATH")]
        highlights: Vec<String>,
        #[arg(long, value_name = "URL", default_value = awcp_mount::awcp::client::DEFAULT_EXECUTOR)]
        executor: String,
        #[arg(long)]
        json: bool,
    },
    /// Cancel a delegation: its task is stopped, its workspace unmounted, the delegator gets
    /// `CANCELLED`
    Cancel {
        /// The delegation id
        id: String,
        #[arg(long, value_name = "URL", default_value = awcp_mount::awcp::client::DEFAULT_EXECUTOR)]
        executor: String,
        #[arg(long)]
        json: bool,
    },
    /// Unmount an awcp-mount mount point; waits (up to a minute) for its process to send everything to the server and exit
    #[command(alias = "unmount")]
    Umount {
        mountpoint: PathBuf,
        /// Detach now even if files are open (the filesystem goes away when they close)
        #[arg(short = 'l', long)]
        lazy: bool,
    },
}

fn main() -> ExitCode {
    // Run by mount(8) as /sbin/mount.fuse.awcp: same job, mount(8)'s argument convention.
    // `args_os`: a path given on the command line need not be UTF-8 (`args` would panic).
    let cli = match awcp_mount::mount_helper::command_line(std::env::args_os().collect()) {
        Ok(args) => Cli::parse_from(args),
        Err(e) => {
            eprintln!("mount.fuse.awcp: {e}");
            return ExitCode::from(1);
        }
    };
    // `-o debug` counts as `-d` (as for sshfs). The log is set up once, before anything logs;
    // a bad option list is reported by the mount itself.
    let debug_option = cli.command.is_none() && {
        let mut o = MountOptions::default();
        for list in &cli.options {
            let _ = o.apply_list(list);
        }
        o.debug
    };
    awcp_mount::logging::init(cli.debug || debug_option);
    match cli.command {
        Some(Command::Umount { mountpoint, lazy }) => exit(unmount::unmount(&mountpoint, lazy)),
        Some(Command::CheckPolicy { file }) => exit(check_policy(file)),
        Some(Command::Check { mountpoint, policy }) => exit(check_mountpoint(&mountpoint, policy)),
        Some(Command::Downgrade { mountpoint }) => exit(downgrade(&mountpoint)),
        Some(Command::Status {
            mountpoint,
            json,
            executor,
        }) => exit(status(mountpoint, json, &executor)),
        Some(Command::Serve { listen, policy }) => {
            exit(awcp_mount::awcp::serve::run(&listen, policy))
        }
        Some(Command::Done {
            id,
            summary,
            highlights,
            executor,
            json,
        }) => exit(
            awcp_mount::awcp::client::done(&executor, &id, &summary, &highlights).map(|v| {
                if json {
                    outln!("{v}");
                } else {
                    outln!("{id}: done reported; the workspace is being released");
                }
            }),
        ),
        Some(Command::Cancel { id, executor, json }) => {
            exit(awcp_mount::awcp::client::cancel(&executor, &id).map(|v| {
                if json {
                    outln!("{v}");
                } else if v["cancelled"] == true {
                    outln!("{id}: cancelled");
                } else {
                    outln!("{id}: had already ended; nothing to cancel");
                }
            }))
        }
        Some(Command::Generate { what }) => exit(generate(&what)),
        None => exit(mount_command(cli)),
    }
}

/// Write the command's output to stdout. A reader that went away ends the program the way
/// SIGPIPE ends `ls` (the shell sees status 141), instead of a panic from `println!`. SIGPIPE
/// itself stays ignored (Rust's default) for the rest of the program: the mount, and the
/// commands that talk to a mount's control socket or an executor over HTTP, must see EPIPE
/// as an error on that connection, not die of it.
fn write_stdout(bytes: &[u8]) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) else {
        return;
    };
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        // SAFETY: restoring a signal's default disposition and raising it; no handler runs.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::raise(libc::SIGPIPE);
        }
        std::process::exit(141);
    }
    eprintln!("awcp-mount: writing to standard output failed: {e}");
    std::process::exit(1);
}

fn exit(r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("awcp-mount: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn mount_command(cli: Cli) -> Result<(), String> {
    let (Some(remote), Some(mountpoint)) = (cli.remote, cli.mountpoint) else {
        return Err(
            "usage: awcp-mount [USER@]HOST:[DIR] MOUNTPOINT [-o OPT,...] (see --help)".into(),
        );
    };
    let remote: RemoteSpec = remote.parse()?;
    let mut options = MountOptions::default();
    for list in &cli.options {
        options.apply_list(list).map_err(|e| e.to_string())?;
    }
    let debug = cli.debug || options.debug;
    let req = MountRequest {
        remote,
        mountpoint,
        options,
        port: cli.port,
        foreground: cli.foreground || debug,
        pinned_host_keys: cli.host_keys,
        key_in_memory: cli
            .identity_fd
            .map(|fd| read_fd(fd, "--identity-fd"))
            .transpose()?,
        certificate_in_memory: cli
            .certificate_fd
            .map(|fd| read_fd(fd, "--certificate-fd"))
            .transpose()?,
        policy_path: cli.policy,
        expires_at: match &cli.expires_at {
            Some(t) => Some(
                awcp_mount::policy::lease::parse_rfc3339(t)
                    .map_err(|e| format!("--expires-at: {e}"))?,
            ),
            None => None,
        },
    };
    // The daemon works from "/" (so it never keeps the caller's directory busy): every path
    // it may read again later (on reconnect, on policy reload) must not be relative.
    let mut req = req;
    req.absolutize();
    // Every check that needs no network runs here, in the foreground, so its error reaches
    // the terminal directly.
    let foreground = req.foreground;
    let prepared = mount::prepare(req).map_err(|e| e.message)?;
    let readiness = if foreground {
        Readiness::none()
    } else {
        daemon::daemonize().map_err(|e| format!("cannot daemonize: {e}"))?
    };
    match mount::run(prepared, readiness) {
        0 => Ok(()),
        // run() has already reported the error.
        _ => std::process::exit(1),
    }
}

fn check_policy(file: Option<PathBuf>) -> Result<(), String> {
    let path = file.unwrap_or_else(|| PathBuf::from(awcp_mount::policy::DEFAULT_POLICY_PATH));
    let policy = Policy::load(Some(&path)).map_err(|e| e.0)?;
    // The executor's tables too, as `serve` reads them: a typo there would pass here and
    // stop the endpoint at its start.
    awcp_mount::awcp::serve::config::load(&policy.serve, &policy.task, &policy.source)?;
    write_stdout(policy.to_string().as_bytes());
    if !policy.serve.is_empty() || !policy.task.is_empty() {
        outln!("# [serve] and [task] (for `awcp-mount serve`): OK");
    }
    outln!("# {}: OK", path.display());
    // Valid as a file, but no mount can be made until the root exists (it may be a policy
    // prepared ahead of it): said, not refused.
    if !policy.mount_root.is_dir() {
        eprintln!(
            "warning: mount_root {} is not an existing directory: every mount will be refused until it is (create it: install -d -m 0755 {})",
            policy.mount_root.display(),
            policy.mount_root.display()
        );
    }
    Ok(())
}

fn check_mountpoint(mountpoint: &std::path::Path, policy: Option<PathBuf>) -> Result<(), String> {
    let policy = Policy::load(policy.as_deref()).map_err(|e| e.0)?;
    match awcp_mount::policy::mountpoint::verdict(&policy, mountpoint) {
        Ok(v) => {
            let how = if v.would_create {
                " (it would be created, mode 0700)"
            } else {
                ""
            };
            outln!(
                "allowed: {}{how} (policy: {})",
                v.path.display(),
                policy.source
            );
            Ok(())
        }
        Err(d) => Err(format!("{d} (policy: {})", policy.source)),
    }
}

fn downgrade(mountpoint: &std::path::Path) -> Result<(), String> {
    let mp = mountpoint
        .canonicalize()
        .map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let answer = awcp_mount::control::request(&mp, "downgrade")?;
    if answer["ok"].as_bool() == Some(true) {
        outln!("{}: read-only now", mp.display());
        Ok(())
    } else {
        Err(format!(
            "{}: {}",
            mp.display(),
            answer["error"].as_str().unwrap_or("downgrade failed")
        ))
    }
}

fn status(mountpoint: Option<PathBuf>, json: bool, executor: &str) -> Result<(), String> {
    let only = mountpoint.is_some();
    let mut all = match mountpoint {
        Some(mp) => {
            let mp = mp
                .canonicalize()
                .map_err(|e| format!("{}: {e}", mp.display()))?;
            vec![awcp_mount::control::request(&mp, "status")?]
        }
        None => awcp_mount::control::all_status(),
    };
    // Delegations of a running `serve`, merged with their mounts by mount point.
    let delegations = if only {
        Vec::new()
    } else {
        awcp_mount::awcp::client::status(executor)
            .map(|v| v["delegations"].as_array().cloned().unwrap_or_default())
            .unwrap_or_default()
    };
    for d in &delegations {
        let entry = serde_json::json!({
            "delegation": d["id"], "state": d["state"], "access_mode": d["accessMode"],
            "delegation_expires_at": d["expiresAt"], "remote_endpoint": d["remote"],
        });
        match all.iter_mut().find(|m| m["mountpoint"] == d["workPath"]) {
            Some(m) => {
                for (k, v) in entry.as_object().into_iter().flatten() {
                    m[k] = v.clone();
                }
            }
            None => {
                let mut e = entry;
                e["mountpoint"] = d["workPath"].clone();
                all.push(e);
            }
        }
    }
    if json {
        outln!("{}", serde_json::Value::Array(all));
        return Ok(());
    }
    if all.is_empty() {
        outln!("no awcp-mount mounts running");
    }
    for m in &all {
        let q = &m["quota"];
        let limit = |v: &serde_json::Value| {
            v.as_u64()
                .map_or("unlimited".to_string(), |n| n.to_string())
        };
        outln!("{}", m["mountpoint"].as_str().unwrap_or("?"));
        if let Some(id) = m["delegation"].as_str() {
            outln!(
                "  delegation  {id} ({}, {}, lease ends {})",
                m["state"].as_str().unwrap_or("?"),
                m["access_mode"].as_str().unwrap_or("?"),
                m["delegation_expires_at"].as_str().unwrap_or("-")
            );
        }
        if m["pid"].is_null() {
            // A delegation without a live mount (pending, or ended).
            continue;
        }
        outln!("  remote      {}", m["remote"].as_str().unwrap_or("?"));
        outln!("  access      {}", m["access"].as_str().unwrap_or("?"));
        outln!("  connection  {}", m["connection"].as_str().unwrap_or("?"));
        outln!(
            "  lease ends  {}",
            m["expires_at"].as_str().unwrap_or("never")
        );
        outln!(
            "  quota       {} of {} bytes, {} of {} files",
            q["bytes_used"],
            limit(&q["bytes_max"]),
            q["files_used"],
            limit(&q["files_max"])
        );
        outln!(
            "  traffic     {} operations, {} bytes read, {} bytes written, {} files open",
            m["ops"],
            m["bytes_read"],
            m["bytes_written"],
            m["open_files"]
        );
        outln!(
            "  ahead       {} small files opened from a read-ahead, {} read along with their open, {} reopened without the server, {} attribute changes answered with the attributes asked along, {} closes that learnt the attributes left by the writes, {} directories listed ahead of a walk, {} bytes written striped, {} small writes merged into the one before, {} attribute changes merged into the one before, {} unlinks answered early",
            m["opens_fetched_ahead"], m["opens_read_along"], m["opens_deferred"], m["setattrs_stat_along"], m["attrs_along_writes"], m["dirs_listed_ahead"], m["bytes_striped"], m["writes_merged"], m["setattrs_merged"], m["unlinks_behind"]
        );
        outln!(
            "  resent      {} writes on the wire at a connection loss, sent again",
            m["writes_sent_again"]
        );
        outln!(
            "  copied      {} bytes copied by the server (copy_file_range, cp)",
            m["bytes_copied_on_server"]
        );
        outln!(
            "  links       {} cached files dropped for a change through another name (hard links made on the server)",
            m["shared_drops"]
        );
        outln!("  pid         {}", m["pid"]);
    }
    Ok(())
}

/// Read a whole secret from an inherited descriptor (a pipe), then close it.
fn read_fd(fd: i32, flag: &str) -> Result<String, String> {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    if fd <= 2 {
        return Err(format!(
            "{flag} {fd}: must be an inherited descriptor above 2"
        ));
    }
    // SAFETY: only asks the kernel whether `fd` is open; nothing is read or closed.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    if nix::fcntl::fcntl(borrowed, nix::fcntl::FcntlArg::F_GETFD).is_err() {
        return Err(format!("{flag} {fd}: no such open file descriptor"));
    }
    // SAFETY: the descriptor was checked to be open and is owned by us from here on.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut text = String::new();
    f.read_to_string(&mut text)
        .map_err(|e| format!("{flag} {fd}: cannot read: {e}"))?;
    if text.trim().is_empty() {
        return Err(format!("{flag} {fd}: nothing was written to it"));
    }
    Ok(text)
}

/// The man page (awcp-mount.8) or a completion script, from the same definition as the
/// command line itself, so they cannot drift apart.
fn generate(what: &str) -> Result<(), String> {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    // Rendered in memory, then written: clap_complete panics on a write error.
    let mut out = Vec::new();
    let shell = match what {
        "man" => {
            let man = clap_mangen::Man::new(cmd).section("8");
            man.render(&mut out).map_err(|e| e.to_string())?;
            write_stdout(&out);
            return Ok(());
        }
        "bash" => clap_complete::Shell::Bash,
        "zsh" => clap_complete::Shell::Zsh,
        "fish" => clap_complete::Shell::Fish,
        other => return Err(format!("generate: '{other}' is not man, bash, zsh or fish")),
    };
    clap_complete::generate(shell, &mut cmd, "awcp-mount", &mut out);
    write_stdout(&out);
    Ok(())
}
