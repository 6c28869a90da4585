//! The mount(8) helper: `mount -t fuse.awcp SOURCE DIR -o OPTS`, `/etc/fstab` and systemd
//! `.mount` units.
//!
//! mount(8) runs `/sbin/mount.fuse.awcp SOURCE DIR [-sfnv] [-N NS] [-o OPTS] [-t TYPE]` (a
//! link to `awcp-mount`). This module turns that into an ordinary awcp-mount command line: the
//! options meant for mount(8) or systemd (`_netdev`, `nofail`, `noauto`, `user`, `x-systemd.*`,
//! `defaults`, ...) are dropped, everything else is passed on as `-o`. The result daemonizes
//! as usual, so mount(8) returns once the mount is live.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
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

/// The command line `awcp-mount` parses (argv[0] included): its own, or, when run by mount(8)
/// as `mount.fuse.awcp`, the one [`translate`] makes of mount(8)'s. The arguments stay
/// `OsString`s: a mount point (or any path) need not be UTF-8.
pub fn command_line(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    match args.first() {
        Some(argv0) if invoked_as_helper(argv0) => translate(&args),
        _ => Ok(args),
    }
}

/// Translate a helper command line (argv[0] included) into an awcp-mount command line.
pub fn translate(args: &[OsString]) -> Result<Vec<OsString>, String> {
    let usage = "usage: mount.fuse.awcp [USER@]HOST:[DIR] MOUNTPOINT [-sfnv] [-o OPTIONS]";
    let mut positional: Vec<OsString> = Vec::new();
    let mut options: Vec<String> = Vec::new();
    let mut it = args.iter().skip(1);
    // Options are text; a source or a mount point may be any bytes.
    let text = |a: &OsStr| {
        a.to_str().map(str::to_string).ok_or_else(|| {
            format!(
                "{}: an option that is not valid UTF-8; write options in UTF-8 (only the source and the mount point may be other bytes); {usage}",
                a.to_string_lossy()
            )
        })
    };
    while let Some(a) = it.next() {
        if a.as_bytes().first() != Some(&b'-') || a.len() == 1 {
            positional.push(a.clone());
            continue;
        }
        let a = text(a)?;
        match a.as_str() {
            "-o" => {
                let list = it
                    .next()
                    .ok_or_else(|| format!("-o needs a value; {usage}"))?;
                options.extend(
                    text(list)?
                        .split(',')
                        .filter(|o| !o.is_empty())
                        .map(str::to_string),
                );
            }
            // -t TYPE and -N NAMESPACE carry a value we do not need.
            "-t" | "-N" => {
                it.next();
            }
            s if s.starts_with("-o") => options.extend(
                s[2..]
                    .split(',')
                    .filter(|o| !o.is_empty())
                    .map(str::to_string),
            ),
            s => {
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
        }
    }
    let [source, dir] = positional.as_slice() else {
        return Err(usage.to_string());
    };
    let mut out = vec![OsString::from("awcp-mount"), source.clone(), dir.clone()];
    let kept: Vec<String> = options
        .into_iter()
        .filter(|o| !for_mount_itself(o))
        .collect();
    if !kept.is_empty() {
        out.push("-o".into());
        out.push(kept.join(",").into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(args: &[&str]) -> Result<Vec<String>, String> {
        let out = translate(&args.iter().map(OsString::from).collect::<Vec<_>>())?;
        Ok(out.into_iter().map(|a| a.into_string().unwrap()).collect())
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

    /// A mount point whose name is not UTF-8 (byte 0xff) reaches clap as it is, run as
    /// awcp-mount or by mount(8); it used to panic in `std::env::args()`. An option that is not
    /// UTF-8 is refused with a message, not a panic.
    #[test]
    fn arguments_need_not_be_utf8() {
        use std::os::unix::ffi::OsStringExt;
        let mp = OsString::from_vec(b"/var/lib/awcp/mounts/\xff".to_vec());
        let own: Vec<OsString> = vec!["awcp-mount".into(), "h:".into(), mp.clone()];
        assert_eq!(command_line(own.clone()).unwrap(), own);
        let helper: Vec<OsString> = vec![
            "/sbin/mount.fuse.awcp".into(),
            "h:".into(),
            mp.clone(),
            "-o".into(),
            "ro,_netdev".into(),
        ];
        let want: Vec<OsString> = vec![
            "awcp-mount".into(),
            "h:".into(),
            mp.clone(),
            "-o".into(),
            "ro".into(),
        ];
        assert_eq!(command_line(helper).unwrap(), want);
        let bad_option = vec![
            "mount.fuse.awcp".into(),
            "h:".into(),
            "/m".into(),
            "-o".into(),
            mp,
        ];
        let e = command_line(bad_option).unwrap_err();
        assert!(e.contains("not valid UTF-8"), "{e}");
    }
}
