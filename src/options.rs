//! sshfs-compatible `-o` options, parsed into a typed [`MountOptions`].
//!
//! An AWCP executor that runs `sshfs` today must be able to run `awcp-mount` with the same
//! command line, so every option it passes is accepted: the ssh ones (`IdentityFile=`,
//! `Port=`, ...), the sshfs ones (`reconnect`, `follow_symlinks`, ...), the FUSE ones (`ro`,
//! `allow_other`, ...), and the macOS-only ones AWCP executors pass on every platform
//! (`noappledouble`, `volname=`, ...), which are ignored with a debug log. Anything else is an
//! error that names the option: silently ignoring a misspelt `ro` would be dangerous.

use std::path::PathBuf;
use std::time::Duration;

use crate::policy::{SymlinkMode, Tightening};

/// What `-o` options can set.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MountOptions {
    pub identity_files: Vec<PathBuf>,
    pub certificate_files: Vec<PathBuf>,
    pub port: Option<u16>,
    pub user: Option<String>,
    /// `StrictHostKeyChecking`: `Some(false)` for `no`/`off`.
    pub strict_host_key_checking: Option<bool>,
    pub user_known_hosts_file: Option<PathBuf>,
    pub server_alive_interval: Option<Duration>,
    pub server_alive_count_max: Option<u32>,
    pub connect_timeout: Option<Duration>,
    pub reconnect: bool,
    pub follow_symlinks: bool,
    /// `sync_unlink`: unlink waits for the server's answer (default: answered early when the
    /// mount can vouch for it; see SEMANTICS.md).
    pub sync_unlink: bool,
    /// `sync_create`: create waits for the server's OPEN (default: answered early in a
    /// directory made through the mount; see SEMANTICS.md).
    pub sync_create: bool,
    pub read_only: bool,
    pub allow_other: bool,
    pub allow_root: bool,
    pub default_permissions: bool,
    pub entry_timeout: Option<Duration>,
    pub attr_timeout: Option<Duration>,
    pub negative_timeout: Option<Duration>,
    pub dir_cache: Option<bool>,
    pub dcache_timeout: Option<Duration>,
    pub dcache_max_size: Option<usize>,
    pub max_conns: Option<usize>,
    /// Kernel readahead for the mount, in bytes (`max_readahead=`).
    pub max_readahead: Option<u64>,
    pub idmap_user: bool,
    /// `uid=`, `gid=`, `umask=`: the owner and permission bits shown (libfuse's options,
    /// which sshfs command lines use).
    pub shown_uid: Option<u32>,
    pub shown_gid: Option<u32>,
    pub shown_umask: Option<u32>,
    pub fsname: Option<String>,
    pub debug: bool,
    /// Policy settings restated on the command line (they may only tighten the policy).
    pub symlinks: Option<SymlinkMode>,
    pub max_bytes: Option<u64>,
    pub max_files: Option<u64>,
    pub mount_root: Option<PathBuf>,
    pub grace_seconds: Option<u64>,
    /// Kernel mount flags passed through (`nodev`, `nosuid`, `noexec`, `noatime`, ...).
    pub kernel_flags: Vec<String>,
    /// Options we accepted but do nothing with, for the debug log.
    pub ignored: Vec<String>,
}

/// Options that only mean something on macOS (macFUSE/osxfuse), which AWCP executors pass
/// regardless of platform. Accepted and ignored.
const MACOS_ONLY: &[&str] = &[
    "noappledouble",
    "noapplexattr",
    "volname",
    "local",
    "defer_permissions",
    "auto_xattr",
    "iosize",
    "jail_symlinks",
    "novncache",
    "noubc",
    "negative_vncache",
    "daemon_timeout",
    "nolocalcaches",
    "auto_cache",
];

/// Options of sshfs/ssh/FUSE that have no effect here but are harmless to accept.
const HARMLESS: &[&str] = &[
    "transform_symlinks",
    "big_writes",
    "large_read",
    // The page cache of a file is kept at open whenever the file is unchanged on the
    // server (KEEP_CACHE), which is what `kernel_cache` asks for, without its risk of
    // stale pages after a change on the server.
    "kernel_cache",
    "workaround",
    "sshfs_sync",
    "no_readahead",
    "sync_readdir",
    "delay_connect",
    "Compression",
    "Ciphers",
    "LogLevel",
    "BatchMode",
    "PasswordAuthentication",
    "PreferredAuthentications",
    "ForwardAgent",
    "ForwardX11",
    "IdentitiesOnly",
    "AddressFamily",
    "ssh_protocol",
    "hard_remove",
    "use_ino",
    "readdir_ino",
    "auto_unmount",
    "dirsync",
    "async",
    "rw",
    "dev",
    "suid",
    "exec",
    "atime",
    "nonempty",
    "max_read",
    "max_write",
    "blksize",
    "cache_link_timeout",
    "cache_max_size",
];

const KERNEL_FLAGS: &[&str] = &["nodev", "nosuid", "noexec", "noatime", "nodiratime", "sync"];

/// A path as ssh reads it in an option: `~/x` is in the home directory (of `$HOME`, as ssh
/// and sshfs expand it; the shell does not where `-oIdentityFile=~/...` is one word).
fn home_path(v: &str) -> PathBuf {
    match (v.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(v),
    }
}

/// A problem with one option, phrased for the person who typed it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("option '{option}': {problem}")]
pub struct OptionError {
    pub option: String,
    pub problem: String,
}

fn bad(option: &str, problem: impl Into<String>) -> OptionError {
    OptionError {
        option: option.to_string(),
        problem: problem.into(),
    }
}

fn parse_bool(opt: &str, v: &str) -> Result<bool, OptionError> {
    match v.to_ascii_lowercase().as_str() {
        "yes" | "true" | "on" | "1" => Ok(true),
        "no" | "false" | "off" | "0" => Ok(false),
        _ => Err(bad(opt, format!("'{v}' is not yes or no"))),
    }
}

fn parse_secs(opt: &str, v: &str) -> Result<Duration, OptionError> {
    let secs: f64 = v
        .parse()
        .map_err(|_| bad(opt, format!("'{v}' is not a number of seconds")))?;
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(bad(opt, format!("'{v}' is out of range")));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// An SSH port, as `-p PORT` and `-o Port=PORT` take it: 1 to 65535 (0 is refused, as an
/// AWCP START naming port 0 is).
pub fn parse_port(v: &str) -> Result<u16, String> {
    match v.parse::<u16>() {
        Ok(0) => Err(
            "0 is not a port: give the server's SSH port, 1 to 65535 (leave it out for 22)".into(),
        ),
        Ok(p) => Ok(p),
        Err(_) => Err(format!(
            "'{v}' is not a port: give the server's SSH port, 1 to 65535 (leave it out for 22)"
        )),
    }
}

fn parse_num<T: std::str::FromStr>(opt: &str, v: &str) -> Result<T, OptionError> {
    v.parse()
        .map_err(|_| bad(opt, format!("'{v}' is not a valid number")))
}

fn need<'a>(opt: &str, v: Option<&'a str>) -> Result<&'a str, OptionError> {
    match v {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(bad(
            opt,
            "needs a value, as in {opt}=VALUE".replace("{opt}", opt),
        )),
    }
}

impl MountOptions {
    /// Apply one `-o` argument, which may hold several comma-separated options.
    pub fn apply_list(&mut self, list: &str) -> Result<(), OptionError> {
        for opt in list.split(',').filter(|o| !o.is_empty()) {
            self.apply(opt)?;
        }
        Ok(())
    }

    /// Apply one option (`name` or `name=value`). ssh options are matched case-insensitively
    /// as ssh does; the others exactly.
    pub fn apply(&mut self, opt: &str) -> Result<(), OptionError> {
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt, None),
        };
        // ssh_config keywords are case-insensitive.
        match name.to_ascii_lowercase().as_str() {
            "identityfile" => {
                self.identity_files.push(home_path(need(name, value)?));
                return Ok(());
            }
            "certificatefile" => {
                self.certificate_files.push(home_path(need(name, value)?));
                return Ok(());
            }
            "port" => {
                self.port = Some(parse_port(need(name, value)?).map_err(|e| bad(name, e))?);
                return Ok(());
            }
            "user" => {
                self.user = Some(need(name, value)?.to_string());
                return Ok(());
            }
            "stricthostkeychecking" => {
                let v = need(name, value)?;
                self.strict_host_key_checking = Some(match v.to_ascii_lowercase().as_str() {
                    "no" | "off" => false,
                    // accept-new would write to known_hosts; we verify strictly instead.
                    "yes" | "ask" | "accept-new" => true,
                    _ => {
                        return Err(bad(
                            name,
                            format!("'{v}' is not yes, no, ask or accept-new"),
                        ))
                    }
                });
                return Ok(());
            }
            "userknownhostsfile" => {
                self.user_known_hosts_file = Some(home_path(need(name, value)?));
                return Ok(());
            }
            "serveraliveinterval" => {
                self.server_alive_interval = Some(parse_secs(name, need(name, value)?)?);
                return Ok(());
            }
            "serveralivecountmax" => {
                self.server_alive_count_max = Some(parse_num(name, need(name, value)?)?);
                return Ok(());
            }
            "connecttimeout" => {
                let t = parse_secs(name, need(name, value)?)?;
                // OpenSSH reads 0 as "no timeout", but a mount must not hang at its start
                // (and here 0 would fail every connection at once).
                if t < Duration::from_secs(1) {
                    return Err(bad(
                        name,
                        format!(
                            "must be at least 1 second, not '{}': give the seconds to wait for the server, as in {name}=30 (the default)",
                            value.unwrap_or_default()
                        ),
                    ));
                }
                self.connect_timeout = Some(t);
                return Ok(());
            }
            _ => {}
        }
        match (name, value) {
            ("reconnect", None) => self.reconnect = true,
            ("follow_symlinks", None) => self.follow_symlinks = true,
            ("sync_unlink", None) => self.sync_unlink = true,
            ("sync_create", None) => self.sync_create = true,
            ("ro", None) => self.read_only = true,
            ("allow_other", None) => self.allow_other = true,
            ("allow_root", None) => self.allow_root = true,
            ("default_permissions", None) => self.default_permissions = true,
            ("debug", None) => self.debug = true,
            ("entry_timeout", Some(v)) => self.entry_timeout = Some(parse_secs(name, v)?),
            ("attr_timeout", Some(v)) => self.attr_timeout = Some(parse_secs(name, v)?),
            ("negative_timeout", Some(v)) => self.negative_timeout = Some(parse_secs(name, v)?),
            ("dir_cache", Some(v)) => self.dir_cache = Some(parse_bool(name, v)?),
            ("dcache_timeout", Some(v)) => self.dcache_timeout = Some(parse_secs(name, v)?),
            ("dcache_max_size", Some(v)) => self.dcache_max_size = Some(parse_num(name, v)?),
            // sshfs's own cache switches, onto ours (a later option of ours still wins).
            ("cache", Some(v)) => {
                if !parse_bool(name, v)? {
                    let none = Some(Duration::ZERO);
                    (self.entry_timeout, self.attr_timeout) = (none, none);
                    (self.negative_timeout, self.dcache_timeout) = (none, none);
                    self.dir_cache = Some(false);
                }
            }
            ("cache_timeout", Some(v)) => {
                let t = Some(parse_secs(name, v)?);
                (self.entry_timeout, self.attr_timeout) = (t, t);
                (self.negative_timeout, self.dcache_timeout) = (t, t);
            }
            ("cache_stat_timeout", Some(v)) => self.attr_timeout = Some(parse_secs(name, v)?),
            ("cache_dir_timeout", Some(v)) => self.dcache_timeout = Some(parse_secs(name, v)?),
            ("max_readahead", Some(v)) => self.max_readahead = Some(parse_num(name, v)?),
            ("max_conns", Some(v)) => {
                let n: usize = parse_num(name, v)?;
                if !(1..=10).contains(&n) {
                    return Err(bad(
                        name,
                        "must be between 1 and 10 (OpenSSH's MaxSessions is 10)",
                    ));
                }
                self.max_conns = Some(n);
            }
            ("uid", Some(v)) => self.shown_uid = Some(parse_num(name, v)?),
            ("gid", Some(v)) => self.shown_gid = Some(parse_num(name, v)?),
            ("umask", Some(v)) => {
                self.shown_umask = Some(
                    u32::from_str_radix(v, 8)
                        .ok()
                        .filter(|m| *m <= 0o7777)
                        .ok_or_else(|| {
                            bad(name, format!("'{v}' is not an octal mode such as 022"))
                        })?,
                )
            }
            ("idmap", Some("user")) => self.idmap_user = true,
            ("idmap", Some("none")) => self.idmap_user = false,
            ("idmap", Some(v)) => {
                return Err(bad(
                    name,
                    format!("'{v}' is not supported (use user or none)"),
                ))
            }
            ("fsname", Some(v)) => self.fsname = Some(v.to_string()),
            ("symlinks", Some(v)) => {
                self.symlinks = Some(v.parse().map_err(|e: String| bad(name, e))?)
            }
            ("max_bytes", Some(v)) => self.max_bytes = Some(parse_num(name, v)?),
            ("max_files", Some(v)) => self.max_files = Some(parse_num(name, v)?),
            ("grace_seconds", Some(v)) => self.grace_seconds = Some(parse_num(name, v)?),
            ("mount_root", Some(v)) => {
                let p = PathBuf::from(v);
                if !p.is_absolute() {
                    return Err(bad(name, "must be an absolute path"));
                }
                self.mount_root = Some(p);
            }
            // sshfs's own containment switches: ours is the policy's `symlinks` mode.
            ("contain_symlinks", None) => {
                self.symlinks = Some(
                    self.symlinks
                        .unwrap_or(SymlinkMode::Contain)
                        .max(SymlinkMode::Contain),
                )
            }
            ("no_contain_symlinks", None) => {
                self.symlinks = Some(self.symlinks.unwrap_or(SymlinkMode::Allow))
            }
            // The type stays `fuse.awcp`, which `umount` and `status` know our mounts by.
            ("subtype", Some(_)) => self.ignored.push(opt.to_string()),
            _ if KERNEL_FLAGS.contains(&name) && value.is_none() => {
                self.kernel_flags.push(name.to_string())
            }
            // (ssh_config keywords among them are case-insensitive, as ssh has them.)
            _ if MACOS_ONLY.contains(&name)
                || HARMLESS.iter().any(|h| h.eq_ignore_ascii_case(name)) =>
            {
                self.ignored.push(opt.to_string())
            }
            (
                "reconnect"
                | "follow_symlinks"
                | "sync_unlink"
                | "sync_create"
                | "ro"
                | "allow_other"
                | "allow_root"
                | "default_permissions"
                | "debug",
                Some(_),
            ) => return Err(bad(name, "takes no value")),
            (
                "entry_timeout" | "attr_timeout" | "negative_timeout" | "dir_cache"
                | "dcache_timeout" | "dcache_max_size" | "max_readahead" | "max_conns" | "idmap"
                | "fsname" | "subtype" | "symlinks" | "max_bytes" | "max_files" | "grace_seconds"
                | "mount_root" | "cache" | "cache_timeout" | "cache_stat_timeout"
                | "cache_dir_timeout" | "uid" | "gid" | "umask",
                None,
            ) => return Err(bad(name, format!("needs a value, as in {name}=VALUE"))),
            _ => {
                return Err(bad(
                    name,
                    "unknown option (see `awcp-mount --help` for the list of supported options)",
                ))
            }
        }
        Ok(())
    }
}

impl MountOptions {
    /// The policy settings these options restate (each may only tighten the policy).
    pub fn tightening(&self) -> Tightening {
        Tightening {
            symlinks: self.symlinks,
            mount_root: self.mount_root.clone(),
            max_bytes: self.max_bytes,
            max_files: self.max_files,
            grace: self.grace_seconds.map(Duration::from_secs),
            attr_ttl: self.attr_timeout,
            entry_ttl: self.entry_timeout,
            negative_ttl: self.negative_timeout,
            dir_ttl: if self.dir_cache == Some(false) {
                Some(Duration::ZERO)
            } else {
                self.dcache_timeout
            },
            max_entries: self.dcache_max_size,
        }
    }
}

/// `[USER@]HOST:[DIR]`, as sshfs takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSpec {
    pub user: Option<String>,
    pub host: String,
    /// Empty means the login directory.
    pub dir: String,
}

impl std::str::FromStr for RemoteSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = "expected [USER@]HOST:[DIR], for example awcp@127.0.0.1:/srv/workspace";
        let (user, rest) = match s.split_once('@') {
            Some((u, r)) => (Some(u), r),
            None => (None, s),
        };
        let (host, dir) = if let Some(r) = rest.strip_prefix('[') {
            // [IPv6]:dir
            let (h, after) = r
                .split_once(']')
                .ok_or_else(|| format!("'{s}': unclosed '[' in host; {usage}"))?;
            let dir = after
                .strip_prefix(':')
                .ok_or_else(|| format!("'{s}': missing ':' after the host; {usage}"))?;
            (h, dir)
        } else {
            rest.split_once(':')
                .ok_or_else(|| format!("'{s}': missing ':' after the host; {usage}"))?
        };
        if host.is_empty() {
            return Err(format!("'{s}': empty host name; {usage}"));
        }
        if let Some(u) = user {
            validate_user(u).map_err(|e| format!("'{s}': {e}"))?;
        }
        if host.starts_with('-') || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("'{s}': '{host}' is not a valid host name"));
        }
        Ok(RemoteSpec {
            user: user.map(str::to_string),
            host: host.to_string(),
            dir: dir.to_string(),
        })
    }
}

/// A user name must not be readable as an option or contain anything a shell or ssh would
/// interpret; we never pass it to a program, but the same check protects logs and status.
pub fn validate_user(u: &str) -> Result<(), String> {
    if u.is_empty() {
        return Err("empty user name".into());
    }
    if u.starts_with('-') {
        return Err(format!("user name '{u}' starts with '-'"));
    }
    if u.len() > 64
        || !u
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '$'))
    {
        return Err(format!(
            "user name '{u}' may only contain letters, digits, '_', '-', '.' and a final '$'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn awcp_reference_command_line_is_accepted() {
        let mut o = MountOptions::default();
        for opt in [
            "IdentityFile=/tmp/k",
            "CertificateFile=/tmp/k-cert.pub",
            "Port=2232",
            "StrictHostKeyChecking=no",
            "UserKnownHostsFile=/dev/null",
            "reconnect",
            "ServerAliveInterval=15",
            "ServerAliveCountMax=3",
            "noappledouble",
            "follow_symlinks",
        ] {
            o.apply_list(opt).unwrap();
        }
        assert_eq!(o.port, Some(2232));
        assert_eq!(o.strict_host_key_checking, Some(false));
        assert!(o.reconnect && o.follow_symlinks);
        assert_eq!(o.server_alive_interval, Some(Duration::from_secs(15)));
        assert_eq!(o.ignored, vec!["noappledouble".to_string()]);
    }

    /// sshfs command lines as people write them: ssh keywords in any case, `~/` in paths
    /// (expanded as ssh does), and sshfs's cache switches mapped onto ours.
    #[test]
    fn sshfs_spellings_are_understood() {
        let mut o = MountOptions::default();
        o.apply_list("compression=yes,batchmode=yes,LOGLEVEL=ERROR")
            .unwrap();
        assert_eq!(o.ignored.len(), 3);
        let home = std::env::var_os("HOME").map(PathBuf::from);
        o.apply("IdentityFile=~/.ssh/k").unwrap();
        o.apply("UserKnownHostsFile=~/kh").unwrap();
        if let Some(home) = home {
            assert_eq!(o.identity_files, vec![home.join(".ssh/k")]);
            assert_eq!(o.user_known_hosts_file, Some(home.join("kh")));
        }
        o.apply("cache=no").unwrap();
        let zero = Some(Duration::ZERO);
        assert_eq!(
            (
                o.entry_timeout,
                o.attr_timeout,
                o.negative_timeout,
                o.dcache_timeout
            ),
            (zero, zero, zero, zero)
        );
        assert_eq!(o.dir_cache, Some(false));
        let mut o = MountOptions::default();
        o.apply_list("cache_timeout=5,cache_stat_timeout=2")
            .unwrap();
        let five = Some(Duration::from_secs(5));
        assert_eq!(o.attr_timeout, Some(Duration::from_secs(2)));
        assert_eq!((o.entry_timeout, o.dcache_timeout), (five, five));
        assert!(o.apply("cache=maybe").is_err());
        assert!(o.apply("cache_timeout").is_err());
        o.apply_list("uid=1000,gid=100,umask=027").unwrap();
        assert_eq!(
            (o.shown_uid, o.shown_gid, o.shown_umask),
            (Some(1000), Some(100), Some(0o027))
        );
        assert!(o.apply("umask=9").is_err());
        assert!(o.apply("uid=me").is_err());
        assert!(o.apply("gid").is_err());
    }

    #[test]
    fn unknown_and_malformed_options_are_named() {
        let mut o = MountOptions::default();
        let e = o.apply_list("ro,nosuchoption").unwrap_err();
        assert_eq!(e.option, "nosuchoption");
        assert!(o
            .apply("Port=abc")
            .unwrap_err()
            .to_string()
            .contains("Port"));
        assert!(o.apply("ro=1").is_err());
        assert!(o.apply("sync_unlink=yes").is_err());
        o.apply("sync_unlink").unwrap();
        assert!(o.sync_unlink);
        assert!(o.apply("sync_create=1").is_err());
        o.apply("sync_create").unwrap();
        assert!(o.sync_create);
        assert!(o.apply("attr_timeout").is_err());
        assert!(o.apply("max_conns=50").is_err());
    }

    /// `Port=0` and `-p 0` are refused, as START refuses port 0 (they used to reach the
    /// connect, which failed with a confusing error); `ConnectTimeout=0` is refused rather than
    /// becoming a zero timeout that fails every connect at once.
    #[test]
    fn port_0_and_connect_timeout_0_are_refused() {
        let mut o = MountOptions::default();
        let e = o.apply("Port=0").unwrap_err();
        assert_eq!(e.option, "Port");
        assert!(e.problem.contains("1 to 65535"), "{e}");
        assert!(parse_port("0").unwrap_err().contains("1 to 65535"));
        assert!(parse_port("65536").is_err());
        assert_eq!(parse_port("2232"), Ok(2232));
        assert_eq!(o.port, None);
        for v in ["0", "0.5"] {
            let e = o.apply(&format!("ConnectTimeout={v}")).unwrap_err();
            assert!(
                e.problem.contains("at least 1 second") && e.problem.contains("ConnectTimeout=30"),
                "{e}"
            );
        }
        assert_eq!(o.connect_timeout, None);
        o.apply("ConnectTimeout=1").unwrap();
        assert_eq!(o.connect_timeout, Some(Duration::from_secs(1)));
    }

    #[test]
    fn remote_specs() {
        let r: RemoteSpec = "awcp@127.0.0.1:/home/awcp/x/".parse().unwrap();
        assert_eq!(r.user.as_deref(), Some("awcp"));
        assert_eq!(r.host, "127.0.0.1");
        assert_eq!(r.dir, "/home/awcp/x/");
        let r: RemoteSpec = "host:".parse().unwrap();
        assert_eq!((r.user, r.dir.as_str()), (None, ""));
        let r: RemoteSpec = "u@[::1]:d".parse().unwrap();
        assert_eq!(r.host, "::1");
        assert!("nohost".parse::<RemoteSpec>().is_err());
        assert!("-oProxyCommand=x@h:".parse::<RemoteSpec>().is_err());
        assert!("a b@h:".parse::<RemoteSpec>().is_err());
    }
}
