//! A small `known_hosts` reader: plain and hashed (`|1|salt|hash`) host names, `*`/`?`
//! wildcards, `!` negation, comments and `@revoked` markers, with correct line numbers.
//!
//! (russh's helper splits only on single spaces, stops at the first key it cannot parse and
//! miscounts lines after comments, which would put the wrong line number in the "host key
//! changed" message.)

use std::path::Path;

use data_encoding::BASE64;
use hmac::{Hmac, KeyInit, Mac};
use russh::keys::ssh_key::public::KeyData;
use sha1::Sha1;

/// What the file says about the key a server offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A line for this host has exactly this key.
    Known { line: usize },
    /// The host has entries, none with this key. `line` is the first entry with the same key
    /// algorithm, or the first entry.
    Changed { line: usize },
    /// The key is marked `@revoked`.
    Revoked { line: usize },
    /// No entry for this host (or no file at all).
    Unknown { file_exists: bool },
}

/// The name to look up: `host` on port 22, `[host]:port` otherwise (OpenSSH's convention).
pub(crate) fn lookup_name(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

struct Entry {
    line: usize,
    revoked: bool,
    key: KeyData,
}

fn entries_for(text: &str, name: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let mut fields = l.split_ascii_whitespace();
        let mut first = fields.next().unwrap_or("");
        let mut revoked = false;
        if let Some(marker) = first.strip_prefix('@') {
            match marker {
                "revoked" => revoked = true,
                // Host certificates are not supported; such lines vouch for no plain key.
                _ => continue,
            }
            first = fields.next().unwrap_or("");
        }
        let (Some(_alg), Some(b64)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !revoked && !hosts_match(first, name) {
            continue;
        }
        match russh::keys::parse_public_key_base64(b64) {
            Ok(k) => out.push(Entry {
                line,
                revoked,
                key: k.key_data().clone(),
            }),
            Err(e) => tracing::debug!("known_hosts line {line}: unusable key ({e}), skipped"),
        }
    }
    out
}

/// Check the key `offered` for `host:port` against the file at `path`.
pub(crate) fn check(
    path: &Path,
    host: &str,
    port: u16,
    offered: &KeyData,
) -> std::io::Result<Verdict> {
    let text = match std::fs::read(path) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Verdict::Unknown { file_exists: false })
        }
        Err(e) => return Err(e),
    };
    Ok(check_text(&text, &lookup_name(host, port), offered))
}

pub(crate) fn check_text(text: &str, name: &str, offered: &KeyData) -> Verdict {
    let entries = entries_for(text, name);
    if let Some(e) = entries.iter().find(|e| e.revoked && &e.key == offered) {
        return Verdict::Revoked { line: e.line };
    }
    let plain: Vec<&Entry> = entries.iter().filter(|e| !e.revoked).collect();
    if let Some(e) = plain.iter().find(|e| &e.key == offered) {
        return Verdict::Known { line: e.line };
    }
    let alg = offered.algorithm();
    match plain
        .iter()
        .find(|e| e.key.algorithm() == alg)
        .or(plain.first())
    {
        Some(e) => Verdict::Changed { line: e.line },
        None => Verdict::Unknown { file_exists: true },
    }
}

/// Key algorithms the file has for this host, to be preferred in the key exchange (so a
/// server with several host keys presents the one we know).
pub(crate) fn known_algorithms(path: &Path, host: &str, port: u16) -> Vec<russh::keys::Algorithm> {
    let Ok(b) = std::fs::read(path) else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&b);
    entries_for(&text, &lookup_name(host, port))
        .into_iter()
        .filter(|e| !e.revoked)
        .map(|e| e.key.algorithm())
        .collect()
}

/// OpenSSH host list matching: comma-separated patterns, any negated match wins.
fn hosts_match(list: &str, name: &str) -> bool {
    if let Some(rest) = list.strip_prefix("|1|") {
        return hashed_match(rest, name);
    }
    let mut matched = false;
    for pat in list.split(',') {
        if let Some(neg) = pat.strip_prefix('!') {
            if glob(neg.as_bytes(), name.as_bytes()) {
                return false;
            }
        } else if glob(pat.as_bytes(), name.as_bytes()) {
            matched = true;
        }
    }
    matched
}

fn hashed_match(rest: &str, name: &str) -> bool {
    let mut parts = rest.splitn(2, '|');
    let (Some(salt), Some(hash)) = (parts.next(), parts.next()) else {
        return false;
    };
    let (Ok(salt), Ok(hash)) = (
        BASE64.decode(salt.as_bytes()),
        BASE64.decode(hash.as_bytes()),
    ) else {
        return false;
    };
    let Ok(mac) = <Hmac<Sha1> as KeyInit>::new_from_slice(&salt) else {
        return false;
    };
    mac.chain_update(name.as_bytes())
        .verify_slice(&hash)
        .is_ok()
}

/// `*` and `?` wildcards, case-insensitive like OpenSSH's host matching.
fn glob(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0usize, 0usize);
    let (mut star, mut mark) = (None::<usize>, 0usize);
    while i < s.len() {
        if p < pat.len() && (pat[p] == b'?' || pat[p].eq_ignore_ascii_case(&s[i])) {
            p += 1;
            i += 1;
        } else if p < pat.len() && pat[p] == b'*' {
            star = Some(p);
            mark = i;
            p += 1;
        } else if let Some(sp) = star {
            p = sp + 1;
            mark += 1;
            i = mark;
        } else {
            return false;
        }
    }
    while p < pat.len() && pat[p] == b'*' {
        p += 1;
    }
    p == pat.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIJdD7y3aLq454yWBdwLWbieU1ebz9/cu7/QEXn9OIeZJ";
    const K2: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIA6rWI3G1sz07DnfFlrouTcysQlj2P+jpNSOEWD9OJ3X";

    fn key(b64: &str) -> KeyData {
        russh::keys::parse_public_key_base64(b64)
            .unwrap()
            .key_data()
            .clone()
    }

    #[test]
    fn verdicts() {
        let text = format!(
            "# comment\n\n[10.0.0.1]:2222 ssh-ed25519 {K2}\n\
             [127.0.0.1]:2222,other\tssh-ed25519   {K1} c\n"
        );
        let n = lookup_name("127.0.0.1", 2222);
        assert_eq!(check_text(&text, &n, &key(K1)), Verdict::Known { line: 4 });
        assert_eq!(
            check_text(&text, &n, &key(K2)),
            Verdict::Changed { line: 4 }
        );
        assert_eq!(
            check_text(&text, &lookup_name("127.0.0.1", 22), &key(K1)),
            Verdict::Unknown { file_exists: true }
        );
        let rev = format!("{text}@revoked * ssh-ed25519 {K1}\n");
        assert_eq!(check_text(&rev, &n, &key(K1)), Verdict::Revoked { line: 5 });
    }

    #[test]
    fn patterns() {
        assert!(hosts_match(
            "*.example.com,!bad.example.com",
            "a.example.com"
        ));
        assert!(!hosts_match(
            "*.example.com,!bad.example.com",
            "bad.example.com"
        ));
        assert!(hosts_match("[127.0.0.?]:22*", "[127.0.0.1]:2222"));
        assert!(!hosts_match("host", "host2"));
        assert!(hosts_match("HOST", "host"));
    }

    #[test]
    fn hashed() {
        // The scheme `ssh-keygen -H` uses: HMAC-SHA1 of the name keyed with a random salt.
        let salt = [7u8; 20];
        let mac = <Hmac<Sha1> as KeyInit>::new_from_slice(&salt)
            .unwrap()
            .chain_update(b"[127.0.0.1]:2222")
            .finalize()
            .into_bytes();
        let entry = format!("|1|{}|{}", BASE64.encode(&salt), BASE64.encode(&mac));
        assert!(hosts_match(&entry, "[127.0.0.1]:2222"));
        assert!(!hosts_match(&entry, "[127.0.0.1]:2223"));
        assert!(!hosts_match("|1|garbage", "x"));
    }
}
