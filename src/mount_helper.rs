//! The mount(8) helper: `mount -t fuse.awcp SOURCE DIR -o OPTS`, `/etc/fstab` and systemd
//! `.mount` units.
//!
//! mount(8) runs `/sbin/mount.fuse.awcp SOURCE DIR [-sfnv] [-N NS] [-o OPTS] [-t TYPE]` (a
//! link to `awcp-mount`). This module turns that into an ordinary awcp-mount command line: the
//! options meant for mount(8) or systemd (`_netdev`, `nofail`, `noauto`, `user`, `x-systemd.*`,
//! `defaults`, ...) are dropped, everything else is passed on as `-o`. The result daemonizes
//! as usual, so mount(8) returns once the mount is live.

use std::ffi::OsStr;
use std::path::Path;

/// Names under which awcp-mount acts as a mount(8) helper.
pub fn invoked_as_helper(argv0: &OsStr) -> bool {
    Path::new(argv0)
        .file_name()
        .is_some_and(|n| n == "mount.fuse.awcp" || n == "mount.awcp")
}

/// Options mount(8), fstab or systemd understand themselves and a filesystem must ignore.
fn for_mount_itself(opt: &str) -> bool {
    matches!(
        opt,
        "_netdev"
            | "nofail"
            | "noauto"
            | "auto"
            | "user"
            | "users"
            | "nouser"
            | "owner"
            | "group"
            | "defaults"
            | "rw"
            | "loop"
    ) || opt.starts_with("x-")
        || opt.starts_with("comment=")
        || opt.starts_with("_")
}

/// Translate a helper command line (argv[0] included) into an awcp-mount command line.
pub fn translate(args: &[String]) -> Result<Vec<String>, String> {
    let usage = "usage: mount.fuse.awcp [USER@]HOST:[DIR] MOUNTPOINT [-sfnv] [-o OPTIONS]";
    let mut positional = Vec::new();
    let mut options: Vec<String> = Vec::new();
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => {
                let list = it
                    .next()
                    .ok_or_else(|| format!("-o needs a value; {usage}"))?;
                options.extend(
                    list.split(',')
                        .filter(|o| !o.is_empty())
                        .map(str::to_string),
                );
            }
            // -t TYPE and -N NAMESPACE carry a value we do not need.
            "-t" | "-N" => {
                it.next();
            }
            s if s.starts_with("-o") && s.len() > 2 => options.extend(
                s[2..]
                    .split(',')
                    .filter(|o| !o.is_empty())
                    .map(str::to_string),
            ),
            s if s.starts_with('-') && s.len() > 1 => {
                for flag in s[1..].chars() {
                    match flag {
                        // sloppy, fake, no-mtab: nothing to do for a FUSE filesystem.
                        // Verbose: not `-o debug`, which keeps the mount in the foreground,
                        // and mount(8) would then never return.
                        's' | 'f' | 'n' | 'v' => {}
                        other => return Err(format!("unknown flag -{other}; {usage}")),
                    }
                }
            }
            _ => positional.push(a.clone()),
        }
    }
    let [source, dir] = positional.as_slice() else {
        return Err(usage.to_string());
    };
    let mut out = vec!["awcp-mount".to_string(), source.clone(), dir.clone()];
    let kept: Vec<String> = options
        .into_iter()
        .filter(|o| !for_mount_itself(o))
        .collect();
    if !kept.is_empty() {
        out.push("-o".into());
        out.push(kept.join(","));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(args: &[&str]) -> Result<Vec<String>, String> {
        translate(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn fstab_line_becomes_a_mount_command() {
        let out = t(&[
            "/sbin/mount.fuse.awcp",
            "awcp@h:/srv/ws",
            "/var/lib/awcp/mounts/ws",
            "-o",
            "rw,_netdev,nofail,x-systemd.automount,IdentityFile=/etc/awcp/key,ro,noauto,user",
        ])
        .unwrap();
        assert_eq!(
            out,
            [
                "awcp-mount",
                "awcp@h:/srv/ws",
                "/var/lib/awcp/mounts/ws",
                "-o",
                "IdentityFile=/etc/awcp/key,ro"
            ]
        );
    }

    #[test]
    fn mount_flags_and_type() {
        let out = t(&[
            "mount.fuse.awcp",
            "h:",
            "/m",
            "-n",
            "-t",
            "fuse.awcp",
            "-sv",
            "-odefaults",
        ])
        .unwrap();
        // (-v is not -o debug: that would keep the mount in the foreground, and mount(8)
        // waiting for it.)
        assert_eq!(out, ["awcp-mount", "h:", "/m"]);
        assert!(t(&["mount.fuse.awcp", "h:"]).is_err());
        assert!(t(&["mount.fuse.awcp", "h:", "/m", "-z"]).is_err());
        assert!(invoked_as_helper(OsStr::new("/usr/sbin/mount.fuse.awcp")));
        assert!(!invoked_as_helper(OsStr::new("awcp-mount")));
    }
}
