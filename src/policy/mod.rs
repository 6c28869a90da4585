//! The executor's policy: where mounts may go, what the lease allows, quota, symlinks, caches.
//!
//! The operator writes it in a TOML file (default `/etc/awcp/policy.toml`; built-in safe
//! defaults when there is none). The command line may restate any setting, but only to
//! *tighten* it: a delegator can influence an executor's command line, so `-o symlinks=allow`,
//! another mount root or a bigger quota there must not override the operator. A loosening
//! attempt is refused with a message rather than silently ignored, so nobody believes they got
//! what they asked for.

pub mod containment;
pub mod enforcer;
pub mod lease;
pub mod mountpoint;
pub mod quota;
pub mod reload;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::core::cache::CacheConfig;

/// Where the policy is read from when `--policy` is not given.
pub const DEFAULT_POLICY_PATH: &str = "/etc/awcp/policy.toml";
pub const DEFAULT_MOUNT_ROOT: &str = "/var/lib/awcp/mounts";

/// Access to the lent workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum AccessMode {
    Ro,
    Rw,
}

impl fmt::Display for AccessMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AccessMode::Ro => "ro",
            AccessMode::Rw => "rw",
        })
    }
}

/// What happens to symlinks. Ordered from loosest to strictest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum SymlinkMode {
    /// Everything through: for servers you trust.
    Allow,
    /// Links that stay inside the workspace work; the others fail with EPERM.
    Contain,
    /// No symlink may be read or created.
    Deny,
}

impl fmt::Display for SymlinkMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SymlinkMode::Allow => "allow",
            SymlinkMode::Contain => "contain",
            SymlinkMode::Deny => "deny",
        })
    }
}

impl std::str::FromStr for SymlinkMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "allow" => Ok(SymlinkMode::Allow),
            "contain" => Ok(SymlinkMode::Contain),
            "deny" => Ok(SymlinkMode::Deny),
            _ => Err(format!("'{s}' is not allow, contain or deny")),
        }
    }
}

// The file as written. Every field optional: what is absent takes the built-in default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    mount_root: Option<toml::Spanned<PathBuf>>,
    create_mountpoint: Option<bool>,
    allowed_access_modes: Option<toml::Spanned<Vec<AccessMode>>>,
    symlinks: Option<SymlinkMode>,
    quota: Option<QuotaFile>,
    lease: Option<LeaseFile>,
    cache: Option<CacheFile>,
    /// Read by `awcp-mount serve` (the control plane); kept as-is here.
    serve: Option<toml::Table>,
    task: Option<toml::Table>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaFile {
    max_bytes: Option<u64>,
    max_files: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseFile {
    grace_seconds: Option<toml::Spanned<u64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheFile {
    attr_ttl: Option<toml::Spanned<f64>>,
    entry_ttl: Option<toml::Spanned<f64>>,
    negative_ttl: Option<toml::Spanned<f64>>,
    max_entries: Option<toml::Spanned<usize>>,
}

/// The policy in force: every setting resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Where it came from ("built-in defaults" or the file), for messages.
    pub source: String,
    pub mount_root: PathBuf,
    pub create_mountpoint: bool,
    pub allowed_access_modes: Vec<AccessMode>,
    pub symlinks: SymlinkMode,
    /// Net bytes a mount may add to the workspace (`None`: unlimited).
    pub max_bytes: Option<u64>,
    /// Net entries a mount may create (`None`: unlimited).
    pub max_files: Option<u64>,
    /// Seconds between a lease's expiry (mount turns read-only) and the unmount.
    pub grace: Duration,
    pub cache: CacheConfig,
    /// The `[serve]` and `[task]` tables, for the control plane.
    pub serve: toml::Table,
    pub task: toml::Table,
}

impl Default for Policy {
    /// The built-in safe defaults.
    fn default() -> Self {
        Policy {
            source: "built-in defaults".into(),
            mount_root: PathBuf::from(DEFAULT_MOUNT_ROOT),
            create_mountpoint: false,
            allowed_access_modes: vec![AccessMode::Ro, AccessMode::Rw],
            symlinks: SymlinkMode::Contain,
            max_bytes: None,
            max_files: None,
            grace: Duration::from_secs(30),
            cache: CacheConfig::default(),
            serve: toml::Table::new(),
            task: toml::Table::new(),
        }
    }
}

/// Longest `[lease] grace_seconds`: a day between a lease's expiry and the unmount.
pub const MAX_GRACE_SECONDS: u64 = 86_400;

/// A policy that cannot be used, with where and why.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

/// "FILE: line N: " for a value at byte `span` of the file's text.
fn at(file: &Path, text: &str, span: std::ops::Range<usize>) -> String {
    let line = text
        .get(..span.start)
        .map_or(1, |t| t.matches('\n').count() + 1);
    format!("{}: line {line}: ", file.display())
}

fn ttl(
    file: &Path,
    text: &str,
    key: &str,
    v: &Option<toml::Spanned<f64>>,
    default: Duration,
) -> Result<Duration, PolicyError> {
    match v {
        None => Ok(default),
        Some(s) if s.get_ref().is_finite() && (0.0..=86_400.0).contains(s.get_ref()) => {
            Ok(Duration::from_secs_f64(*s.get_ref()))
        }
        Some(s) => Err(PolicyError(format!(
            "{}[cache] {key} = {}: must be between 0 and 86400 seconds",
            at(file, text, s.span()),
            s.get_ref()
        ))),
    }
}

impl Policy {
    /// Parse policy text; `file` names it in messages.
    pub fn parse(text: &str, file: &Path) -> Result<Policy, PolicyError> {
        let f: PolicyFile = toml::from_str(text).map_err(|e| {
            // toml's message names the line, the column and the key.
            PolicyError(format!("{}: {}", file.display(), e.to_string().trim_end()))
        })?;
        let d = Policy::default();
        let mount_root = match f.mount_root {
            Some(r) if !r.get_ref().is_absolute() => {
                return Err(PolicyError(format!(
                    "{}mount_root = {:?}: must be an absolute path",
                    at(file, text, r.span()),
                    r.get_ref()
                )))
            }
            Some(r) => r.into_inner(),
            None => d.mount_root,
        };
        let modes = match f.allowed_access_modes {
            Some(m) if m.get_ref().is_empty() => {
                return Err(PolicyError(format!(
                    "{}allowed_access_modes is empty: allow at least [\"ro\"]",
                    at(file, text, m.span())
                )))
            }
            Some(m) => m.into_inner(),
            None => d.allowed_access_modes,
        };
        let q = f.quota.unwrap_or_default();
        let c = f.cache.unwrap_or_default();
        let dc = CacheConfig::default();
        let cache = CacheConfig {
            attr_ttl: ttl(file, text, "attr_ttl", &c.attr_ttl, dc.attr_ttl)?,
            entry_ttl: ttl(file, text, "entry_ttl", &c.entry_ttl, dc.entry_ttl)?,
            negative_ttl: ttl(file, text, "negative_ttl", &c.negative_ttl, dc.negative_ttl)?,
            dir_ttl: ttl(file, text, "entry_ttl", &c.entry_ttl, dc.dir_ttl)?,
            max_entries: match c.max_entries {
                Some(n) if *n.get_ref() == 0 => {
                    return Err(PolicyError(format!(
                        "{}[cache] max_entries = 0: must be at least 1",
                        at(file, text, n.span())
                    )))
                }
                Some(n) => n.into_inner(),
                None => dc.max_entries,
            },
        };
        Ok(Policy {
            source: file.display().to_string(),
            mount_root,
            create_mountpoint: f.create_mountpoint.unwrap_or(d.create_mountpoint),
            allowed_access_modes: modes,
            symlinks: f.symlinks.unwrap_or(d.symlinks),
            max_bytes: q.max_bytes,
            max_files: q.max_files,
            grace: match f.lease.and_then(|l| l.grace_seconds) {
                Some(g) if *g.get_ref() > MAX_GRACE_SECONDS => {
                    return Err(PolicyError(format!(
                        "{}[lease] grace_seconds = {}: must be between 0 and {MAX_GRACE_SECONDS} seconds (1 day)",
                        at(file, text, g.span()),
                        g.get_ref()
                    )))
                }
                Some(g) => Duration::from_secs(g.into_inner()),
                None => d.grace,
            },
            cache,
            serve: f.serve.unwrap_or_default(),
            task: f.task.unwrap_or_default(),
        })
    }

    /// Read the policy: `path` if given (it must exist), else the default file if it exists,
    /// else the built-in defaults.
    pub fn load(path: Option<&Path>) -> Result<Policy, PolicyError> {
        let (file, required) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_POLICY_PATH), false),
        };
        match std::fs::read_to_string(&file) {
            Ok(text) => Policy::parse(&text, &file),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                Ok(Policy::default())
            }
            Err(e) => Err(PolicyError(format!(
                "cannot read policy {}: {e}",
                file.display()
            ))),
        }
    }

    pub fn allows(&self, mode: AccessMode) -> bool {
        self.allowed_access_modes.contains(&mode)
    }

    /// The access a mount gets when `requested`: `rw` becomes `ro` when only `ro` is allowed.
    pub fn grant(&self, requested: AccessMode) -> AccessMode {
        if requested == AccessMode::Rw && !self.allows(AccessMode::Rw) {
            AccessMode::Ro
        } else {
            requested
        }
    }

    /// Apply command-line restatements of policy settings. Each may only tighten.
    pub fn tighten(&mut self, t: &Tightening) -> Result<(), PolicyError> {
        let loosen = |what: String| {
            PolicyError(format!(
                "{what} would loosen the policy in force ({}); the command line may only tighten it",
                self.source
            ))
        };
        if let Some(mode) = t.symlinks {
            if mode < self.symlinks {
                return Err(loosen(format!(
                    "-o symlinks={mode} (policy: symlinks = \"{}\")",
                    self.symlinks
                )));
            }
        }
        // Compared after resolving symlinks and "..": `root/../elsewhere` or a link inside the
        // root pointing out of it must not pass for "inside".
        let narrower_root = match &t.mount_root {
            Some(root) => {
                let resolved = root
                    .canonicalize()
                    .map_err(|e| PolicyError(format!("-o mount_root={}: {e}", root.display())))?;
                let policy_root = self
                    .mount_root
                    .canonicalize()
                    .unwrap_or(self.mount_root.clone());
                if !resolved.starts_with(&policy_root) {
                    return Err(loosen(format!(
                        "-o mount_root={} (resolves to {}; policy: mount_root = {})",
                        root.display(),
                        resolved.display(),
                        self.mount_root.display()
                    )));
                }
                Some(resolved)
            }
            None => None,
        };
        let tighter = |cli: Option<u64>,
                       policy: Option<u64>,
                       what: &str|
         -> Result<Option<u64>, PolicyError> {
            match (cli, policy) {
                (Some(c), Some(p)) if c > p => Err(loosen(format!("-o {what}={c} (policy: {p})"))),
                (Some(c), _) => Ok(Some(c)),
                (None, p) => Ok(p),
            }
        };
        self.max_bytes = tighter(t.max_bytes, self.max_bytes, "max_bytes")?;
        self.max_files = tighter(t.max_files, self.max_files, "max_files")?;
        if let Some(g) = t.grace {
            if g > self.grace {
                return Err(loosen(format!(
                    "-o grace_seconds={} (policy: {})",
                    g.as_secs(),
                    self.grace.as_secs()
                )));
            }
            self.grace = g;
        }
        if let Some(mode) = t.symlinks {
            self.symlinks = mode;
        }
        if let Some(root) = narrower_root {
            self.mount_root = root;
        }
        // Cache lifetimes bound how stale a view may be: a shorter one is always fine, a
        // longer one is capped at the policy's (not an error: sshfs command lines set these).
        t.cap_cache(&mut self.cache);
        Ok(())
    }
}

impl Policy {
    /// Apply command-line restatements to a policy reloaded while mounted: each setting keeps
    /// whichever of the two is stricter (the file may have become stricter than the command
    /// line, or looser; neither is an error any more, the mount exists). The mount root no
    /// longer matters.
    pub fn restate(&mut self, t: &Tightening) {
        if let Some(mode) = t.symlinks {
            self.symlinks = self.symlinks.max(mode);
        }
        let min = |cli: Option<u64>, file: Option<u64>| match (cli, file) {
            (Some(c), Some(f)) => Some(c.min(f)),
            (c, f) => c.or(f),
        };
        self.max_bytes = min(t.max_bytes, self.max_bytes);
        self.max_files = min(t.max_files, self.max_files);
        if let Some(g) = t.grace {
            self.grace = self.grace.min(g);
        }
        t.cap_cache(&mut self.cache);
    }
}

/// Policy settings restated on the command line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tightening {
    pub symlinks: Option<SymlinkMode>,
    pub mount_root: Option<PathBuf>,
    pub max_bytes: Option<u64>,
    pub max_files: Option<u64>,
    pub grace: Option<Duration>,
    pub attr_ttl: Option<Duration>,
    pub entry_ttl: Option<Duration>,
    pub negative_ttl: Option<Duration>,
    pub dir_ttl: Option<Duration>,
    pub max_entries: Option<usize>,
}

impl Tightening {
    /// Cache lifetimes and bounds restated on the command line: the shorter (smaller) of the
    /// two wins.
    fn cap_cache(&self, c: &mut CacheConfig) {
        for (cli, slot) in [
            (self.attr_ttl, &mut c.attr_ttl),
            (self.entry_ttl, &mut c.entry_ttl),
            (self.negative_ttl, &mut c.negative_ttl),
            (self.dir_ttl, &mut c.dir_ttl),
        ] {
            if let Some(v) = cli {
                *slot = v.min(*slot);
            }
        }
        if let Some(n) = self.max_entries {
            c.max_entries = n.min(c.max_entries).max(1);
        }
    }
}

impl fmt::Display for Policy {
    /// The effective policy, as `check-policy` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: Option<u64>| v.map_or("unlimited".to_string(), |n| n.to_string());
        writeln!(f, "# effective policy (from {})", self.source)?;
        writeln!(
            f,
            "mount_root = {:?}",
            self.mount_root.display().to_string()
        )?;
        writeln!(f, "create_mountpoint = {}", self.create_mountpoint)?;
        let modes: Vec<String> = self
            .allowed_access_modes
            .iter()
            .map(|m| format!("\"{m}\""))
            .collect();
        writeln!(f, "allowed_access_modes = [{}]", modes.join(", "))?;
        writeln!(f, "symlinks = \"{}\"", self.symlinks)?;
        writeln!(
            f,
            "[quota]\nmax_bytes = {}\nmax_files = {}",
            opt(self.max_bytes),
            opt(self.max_files)
        )?;
        writeln!(f, "[lease]\ngrace_seconds = {}", self.grace.as_secs())?;
        writeln!(
            f,
            "[cache]\nattr_ttl = {}\nentry_ttl = {}\nnegative_ttl = {}\nmax_entries = {}",
            self.cache.attr_ttl.as_secs_f64(),
            self.cache.entry_ttl.as_secs_f64(),
            self.cache.negative_ttl.as_secs_f64(),
            self.cache.max_entries
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Policy, PolicyError> {
        Policy::parse(text, Path::new("/etc/awcp/policy.toml"))
    }

    #[test]
    fn defaults_are_safe() {
        let p = parse("").unwrap();
        assert_eq!(p.mount_root, PathBuf::from(DEFAULT_MOUNT_ROOT));
        assert_eq!(p.symlinks, SymlinkMode::Contain);
        assert!(!p.create_mountpoint);
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_key_file_and_line() {
        let e = parse("mount_root = \"/m\"\nsymlnks = \"deny\"\n")
            .unwrap_err()
            .0;
        assert!(
            e.contains("/etc/awcp/policy.toml") && e.contains("line 2") && e.contains("symlnks"),
            "{e}"
        );
        let e = parse("[quota]\nmax_bytes = \"lots\"\n").unwrap_err().0;
        assert!(e.contains("line 2") && e.contains("max_bytes"), "{e}");
        let e = parse("symlinks = \"sometimes\"\n").unwrap_err().0;
        assert!(e.contains("line 1") && e.contains("sometimes"), "{e}");
        assert!(parse("mount_root = \"relative\"").is_err());
        assert!(parse("allowed_access_modes = []").is_err());
    }

    #[test]
    fn command_line_only_tightens() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("team")).unwrap();
        std::fs::create_dir(t.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(t.path().join("elsewhere"), root.join("link")).unwrap();
        let text = format!(
            "mount_root = {:?}\nsymlinks = \"contain\"\n[quota]\nmax_bytes = 1000\n",
            root.display().to_string()
        );
        let mut p = parse(&text).unwrap();
        let loosen = Tightening {
            symlinks: Some(SymlinkMode::Allow),
            ..Default::default()
        };
        assert!(p.clone().tighten(&loosen).unwrap_err().0.contains("loosen"));
        let bigger = Tightening {
            max_bytes: Some(2000),
            ..Default::default()
        };
        assert!(p.clone().tighten(&bigger).is_err());
        for escape in [
            t.path().join("elsewhere"),
            root.join("../elsewhere"),
            root.join("link"),
        ] {
            let elsewhere = Tightening {
                mount_root: Some(escape.clone()),
                ..Default::default()
            };
            assert!(
                p.clone().tighten(&elsewhere).is_err(),
                "{}",
                escape.display()
            );
        }
        let tighter = Tightening {
            symlinks: Some(SymlinkMode::Deny),
            max_bytes: Some(10),
            max_files: Some(3),
            mount_root: Some(root.join("team")),
            attr_ttl: Some(Duration::from_secs(60)),
            ..Default::default()
        };
        p.tighten(&tighter).unwrap();
        assert_eq!(p.symlinks, SymlinkMode::Deny);
        assert_eq!((p.max_bytes, p.max_files), (Some(10), Some(3)));
        assert_eq!(p.mount_root, root.join("team").canonicalize().unwrap());
        assert_eq!(
            p.cache.attr_ttl,
            CacheConfig::default().attr_ttl,
            "capped at the policy's"
        );
    }

    #[test]
    fn value_errors_name_the_line() {
        for (text, line) in [
            ("\nmount_root = \"relative\"\n", "line 2"),
            ("\n\nallowed_access_modes = []\n", "line 3"),
            ("[cache]\nattr_ttl = -1.0\n", "line 2"),
            ("[cache]\n\nmax_entries = 0\n", "line 3"),
            ("[lease]\ngrace_seconds = 86401\n", "line 2"),
        ] {
            let e = parse(text).unwrap_err().0;
            assert!(
                e.contains(line) && e.contains("policy.toml"),
                "{text:?}: {e}"
            );
        }
    }

    /// A grace period past a day is refused (a huge one overflowed `expiry + grace` and
    /// panicked the executor endpoint); 0 (unmount at expiry) and a day are fine.
    #[test]
    fn grace_seconds_is_bounded() {
        let e = parse("[lease]\ngrace_seconds = 9223372036854775807\n")
            .unwrap_err()
            .0;
        assert!(
            e.contains("grace_seconds") && e.contains("between 0 and 86400"),
            "{e}"
        );
        assert_eq!(
            parse("[lease]\ngrace_seconds = 0\n").unwrap().grace,
            Duration::ZERO
        );
        assert_eq!(
            parse("[lease]\ngrace_seconds = 86400\n").unwrap().grace,
            Duration::from_secs(86_400)
        );
    }

    #[test]
    fn reload_keeps_the_stricter_of_file_and_command_line() {
        let mut p = parse("symlinks = \"deny\"\n[quota]\nmax_bytes = 1000\n").unwrap();
        p.restate(&Tightening {
            symlinks: Some(SymlinkMode::Contain),
            max_bytes: Some(50_000),
            max_files: Some(7),
            ..Default::default()
        });
        assert_eq!(p.symlinks, SymlinkMode::Deny);
        assert_eq!((p.max_bytes, p.max_files), (Some(1000), Some(7)));
    }

    #[test]
    fn rw_is_downgraded_when_only_ro_is_allowed() {
        let p = parse("allowed_access_modes = [\"ro\"]").unwrap();
        assert_eq!(p.grant(AccessMode::Rw), AccessMode::Ro);
        assert_eq!(Policy::default().grant(AccessMode::Rw), AccessMode::Rw);
    }
}
