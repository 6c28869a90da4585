//! The `[serve]` and `[task]` tables of the policy file, typed.
//!
//! The policy parser keeps both tables raw for us; they are decoded here with
//! `deny_unknown_fields`, so a misspelt key is an error that names it (and the table), not a
//! setting silently left at its default.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::awcp::protocol::SandboxProfile;

pub const DEFAULT_STATE_DIR: &str = "/var/lib/awcp/serve";
/// Longest `[task] timeout_seconds`.
pub const MAX_TIMEOUT_SECONDS: u64 = 30 * 86_400;
/// Longest `[serve] retention_seconds`.
pub const MAX_RETENTION_SECONDS: u64 = 30 * 86_400;

/// A number of seconds that must be within `1..=max`; `fix` says what to write instead of a
/// value outside it (after "set 1 to MAX" for one too large, instead of it for 0).
fn seconds(n: u64, max: u64, zero_fix: &str, large_fix: &str) -> Result<u64, String> {
    let range = format!("1..={max} seconds ({} days)", max / 86_400);
    match n {
        0 => Err(format!("0 is outside {range}: {zero_fix}")),
        n if n > max => Err(format!("{n} is outside {range}: {large_fix}")),
        n => Ok(n),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServeFile {
    allowed_clients: Option<Vec<String>>,
    token: Option<String>,
    known_hosts: Option<PathBuf>,
    accept_unknown_host_keys: Option<bool>,
    max_concurrent: Option<usize>,
    max_pending: Option<usize>,
    max_ttl_seconds: Option<u64>,
    state_dir: Option<PathBuf>,
    max_body_bytes: Option<usize>,
    retention_seconds: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskFile {
    command: Option<Vec<String>>,
    environment: Option<BTreeMap<String, String>>,
    timeout_seconds: Option<u64>,
    allow_network: Option<bool>,
    cwd_only: Option<bool>,
    allow_exec: Option<bool>,
}

/// An address or CIDR block a delegator may connect from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .trim()
            .parse()
            .map_err(|_| format!("'{s}' is not an IP address or CIDR block"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|n| *n <= max)
                .ok_or_else(|| format!("'{s}': prefix length must be 0..={max}"))?,
        };
        Ok(Cidr { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4 client on a dual-stack socket shows up as ::ffff:a.b.c.d.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// `[serve]`: who may talk to the endpoint and how much it takes on.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub allowed_clients: Vec<Cidr>,
    /// Required in `INVITE.auth.credential` when set.
    pub token: Option<String>,
    /// Trusted delegator host keys (OpenSSH known_hosts format).
    pub known_hosts: PathBuf,
    /// Accept (and log) a host key the file does not know; a *changed* key is still refused.
    pub accept_unknown_host_keys: bool,
    pub max_concurrent: usize,
    pub max_pending: usize,
    pub max_ttl_seconds: u64,
    pub state_dir: PathBuf,
    pub max_body_bytes: usize,
    /// How long a finished delegation's result is kept when the delegator never acks it.
    pub retention_seconds: u64,
}

/// `[task]`: what runs in the mount point, and the sandbox it runs in.
#[derive(Debug, Clone)]
pub struct TaskConfig {
    pub command: Option<Vec<String>>,
    pub environment: BTreeMap<String, String>,
    pub timeout_seconds: Option<u64>,
    pub allow_network: bool,
    pub cwd_only: bool,
    pub allow_exec: bool,
}

impl TaskConfig {
    /// The profile declared in ACCEPT: exactly what is enforced.
    pub fn sandbox_profile(&self) -> SandboxProfile {
        SandboxProfile {
            cwd_only: Some(self.cwd_only),
            allow_network: Some(self.allow_network),
            allow_exec: Some(self.allow_exec),
        }
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    table: &toml::Table,
    name: &str,
    source: &str,
) -> Result<T, String> {
    // The path names the key also for type errors (`max_pending = "x"`).
    serde_path_to_error::deserialize(toml::Value::Table(table.clone())).map_err(
        |e: serde_path_to_error::Error<toml::de::Error>| {
            let path = e.path().to_string();
            let at = if path == "." {
                String::new()
            } else {
                format!("{path}: ")
            };
            format!("{source}: [{name}] {at}{}", e.inner().message().trim_end())
        },
    )
}

/// Decode both tables of the policy (`source` names the file in messages).
pub fn load(
    serve: &toml::Table,
    task: &toml::Table,
    source: &str,
) -> Result<(ServeConfig, TaskConfig), String> {
    let s: ServeFile = decode(serve, "serve", source)?;
    let t: TaskFile = decode(task, "task", source)?;
    let key = |k: &str, why: String| format!("{source}: [serve] {k}: {why}");
    let allowed_clients = match s.allowed_clients {
        None => vec![
            Cidr::parse("127.0.0.1/8").unwrap(),
            Cidr::parse("::1").unwrap(),
        ],
        Some(list) => list
            .iter()
            .map(|c| Cidr::parse(c).map_err(|e| key("allowed_clients", e)))
            .collect::<Result<_, _>>()?,
    };
    if let Some(tok) = &s.token {
        if tok.len() < 16 {
            return Err(key("token", "must be at least 16 characters".into()));
        }
    }
    let state_dir = s
        .state_dir
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
    if !state_dir.is_absolute() {
        return Err(key("state_dir", "must be an absolute path".into()));
    }
    let known_hosts = s
        .known_hosts
        .unwrap_or_else(|| state_dir.join("known_hosts"));
    if !known_hosts.is_absolute() {
        return Err(key("known_hosts", "must be an absolute path".into()));
    }
    let positive = |k: &str, v: Option<usize>, d: usize| match v {
        Some(0) => Err(key(k, "must be at least 1".into())),
        Some(n) => Ok(n),
        None => Ok(d),
    };
    let serve = ServeConfig {
        allowed_clients,
        token: s.token,
        known_hosts,
        accept_unknown_host_keys: s.accept_unknown_host_keys.unwrap_or(false),
        max_concurrent: positive("max_concurrent", s.max_concurrent, 4)?,
        max_pending: positive("max_pending", s.max_pending, 16)?,
        // Refused rather than cut to the longest lease AWCP allows: the operator would think
        // longer leases are granted.
        max_ttl_seconds: match s.max_ttl_seconds {
            Some(n) => {
                let max = crate::awcp::protocol::MAX_TTL_SECONDS;
                seconds(
                    n,
                    max,
                    "a lease must last at least a second; set more, or leave the key out for 3600",
                    &format!("that is longer than AWCP lets a lease last; set at most {max}"),
                )
                .map_err(|e| key("max_ttl_seconds", e))?
            }
            None => 3600,
        },
        state_dir,
        max_body_bytes: positive("max_body_bytes", s.max_body_bytes, 1024 * 1024)?,
        retention_seconds: match s.retention_seconds {
            Some(n) => seconds(
                n,
                MAX_RETENTION_SECONDS,
                "a finished delegation's result would be forgotten before its delegator could \
                 fetch it; set at least 1, or leave the key out for 604800 (7 days)",
                &format!("set at most {MAX_RETENTION_SECONDS}"),
            )
            .map_err(|e| key("retention_seconds", e))?,
            None => 7 * 86_400,
        },
    };
    if let Some(cmd) = &t.command {
        if cmd.is_empty() || cmd[0].is_empty() {
            return Err(format!("{source}: [task] command: must name a program"));
        }
    }
    for k in t.environment.iter().flatten().map(|(k, _)| k) {
        if k.is_empty() || k.contains('=') || k.contains('\0') || k.starts_with("AWCP_") {
            return Err(format!(
                "{source}: [task] environment: '{k}' is not a usable name (AWCP_* are set by serve)"
            ));
        }
    }
    let task = TaskConfig {
        command: t.command,
        environment: t.environment.unwrap_or_default(),
        timeout_seconds: t
            .timeout_seconds
            .map(|n| {
                seconds(
                    n,
                    MAX_TIMEOUT_SECONDS,
                    "leave the key out for no timeout",
                    &format!(
                        "set at most {MAX_TIMEOUT_SECONDS}, or leave the key out for no timeout"
                    ),
                )
                .map_err(|e| format!("{source}: [task] timeout_seconds: {e}"))
            })
            .transpose()?,
        allow_network: t.allow_network.unwrap_or(false),
        cwd_only: t.cwd_only.unwrap_or(true),
        allow_exec: t.allow_exec.unwrap_or(true),
    };
    Ok((serve, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables(text: &str) -> (toml::Table, toml::Table) {
        let t: toml::Table = toml::from_str(text).unwrap();
        let get = |k: &str| {
            t.get(k)
                .and_then(|v| v.as_table())
                .cloned()
                .unwrap_or_default()
        };
        (get("serve"), get("task"))
    }

    #[test]
    fn defaults_are_safe() {
        let (s, t) = tables("");
        let (s, t) = load(&s, &t, "p.toml").unwrap();
        assert!(s
            .allowed_clients
            .iter()
            .any(|c| c.contains("127.0.0.1".parse().unwrap())));
        assert!(!s
            .allowed_clients
            .iter()
            .any(|c| c.contains("10.0.0.1".parse().unwrap())));
        assert!(!s.accept_unknown_host_keys);
        assert!(t.cwd_only && !t.allow_network && t.command.is_none());
    }

    #[test]
    fn errors_name_the_key() {
        for (text, want) in [
            ("[serve]\nmax_concurent = 3\n", "max_concurent"),
            ("[task]\ncommandd = [\"x\"]\n", "commandd"),
            (
                "[serve]\nallowed_clients = [\"10.0.0.0/99\"]\n",
                "allowed_clients",
            ),
            ("[serve]\ntoken = \"short\"\n", "token"),
            ("[serve]\nmax_pending = 0\n", "max_pending"),
            ("[task]\ncommand = []\n", "command"),
            ("[serve]\nstate_dir = \"rel\"\n", "state_dir"),
            ("[serve]\nmax_ttl_seconds = \"x\"\n", "max_ttl_seconds"),
        ] {
            let (s, t) = tables(text);
            let e = load(&s, &t, "p.toml").unwrap_err();
            assert!(e.contains(want) && e.contains("p.toml"), "{text}: {e}");
        }
    }

    /// Durations are bounded when the file is read: a huge one overflowed `now + timeout` (or
    /// `retention * 1000`) and panicked the endpoint, 0 meant "no timeout" or "forget at once",
    /// and a `max_ttl_seconds` past AWCP's longest lease was silently cut to it. Each is
    /// refused with a message that says what to write instead.
    #[test]
    fn durations_out_of_range_are_refused() {
        for (text, want, fix) in [
            (
                "[task]\ntimeout_seconds = 0\n",
                "[task] timeout_seconds",
                "leave the key out for no timeout",
            ),
            (
                "[task]\ntimeout_seconds = 9223372036854775807\n",
                "[task] timeout_seconds",
                "set at most 2592000",
            ),
            (
                "[serve]\nretention_seconds = 0\n",
                "[serve] retention_seconds",
                "leave the key out for 604800",
            ),
            (
                "[serve]\nretention_seconds = 9223372036854775807\n",
                "[serve] retention_seconds",
                "set at most 2592000",
            ),
            (
                "[serve]\nmax_ttl_seconds = 0\n",
                "[serve] max_ttl_seconds",
                "leave the key out for 3600",
            ),
            (
                "[serve]\nmax_ttl_seconds = 2592001\n",
                "[serve] max_ttl_seconds",
                "set at most 2592000",
            ),
        ] {
            let (s, t) = tables(text);
            let e = load(&s, &t, "p.toml").unwrap_err();
            assert!(
                e.contains(want) && e.contains(fix) && e.contains("p.toml"),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn durations_at_their_bounds_are_kept() {
        let (s, t) = tables(
            "[serve]\nmax_ttl_seconds = 2592000\nretention_seconds = 2592000\n\
             [task]\ntimeout_seconds = 2592000\n",
        );
        let (s, t) = load(&s, &t, "p.toml").unwrap();
        assert_eq!(
            (s.max_ttl_seconds, s.retention_seconds, t.timeout_seconds),
            (2_592_000, 2_592_000, Some(2_592_000))
        );
        let (s, t) = tables("[task]\ntimeout_seconds = 1\n");
        let (s, t) = load(&s, &t, "p.toml").unwrap();
        assert_eq!(
            (s.max_ttl_seconds, s.retention_seconds, t.timeout_seconds),
            (3600, 604_800, Some(1))
        );
    }

    #[test]
    fn cidr_matching() {
        let c = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(c.contains("10.1.200.3".parse().unwrap()));
        assert!(!c.contains("10.2.0.1".parse().unwrap()));
        assert!(c.contains("::ffff:10.1.0.9".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        assert!(Cidr::parse("::1").unwrap().contains("::1".parse().unwrap()));
        assert!(Cidr::parse("nonsense").is_err());
    }
}
