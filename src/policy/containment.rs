//! Symlink containment: no link may lead a tool outside the workspace.
//!
//! The danger is on the executor's side: the kernel follows a symlink's target *locally*, so a
//! link `-> /etc/passwd` or `-> ../../../etc/passwd` that a hostile delegator plants in the
//! workspace would make the agent's tools read or write the executor's own files (sshfs's
//! CVE-2026-47187). In `contain` mode a target is allowed only if, resolved from the link's own
//! directory, it stays inside the workspace:
//!
//! * absolute targets are refused;
//! * `.` and empty components (`./`, `//`) are ignored;
//! * `..` is allowed only as a leading run, and only as many as the link's directory is deep.
//!   A `..` after a name is refused: the name could be a symlink to a shallower directory, and
//!   then `name/..` climbs higher than it seems (`s -> .` plus `l -> s/../../../x` escapes
//!   although a purely lexical walk stays inside). A leading run of `..` walks up the
//!   directory the kernel reached the link through, which is exactly the lexical parent.
//!
//! * a NUL byte is refused: the kernel ends a link's target at its first NUL, so `..\0x`
//!   would be checked as one name and followed as `..`.
//!
//! Every hop of a chain is a link the kernel reads through the mount and so is checked on its
//! own; a target made only of names after the leading `..` can only go *down* from a checked
//! place.

use std::path::{Component, Path};

/// Why a target is refused (for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    Absolute,
    AboveRoot,
    DotDotAfterName,
    Empty,
    Nul,
}

impl std::fmt::Display for Escape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Escape::Absolute => "absolute target",
            Escape::AboveRoot => "target climbs above the workspace",
            Escape::DotDotAfterName => {
                "'..' after a name (could climb through a symlinked directory)"
            }
            Escape::Empty => "empty target",
            Escape::Nul => "NUL byte in the target (the kernel would cut it there)",
        })
    }
}

/// Whether a link at `link` (its path relative to the workspace root, including its own name)
/// with `target` stays inside the workspace.
pub fn check_target(link: &Path, target: &Path) -> Result<(), Escape> {
    if target.as_os_str().is_empty() {
        return Err(Escape::Empty);
    }
    if target.as_os_str().as_encoded_bytes().contains(&0) {
        return Err(Escape::Nul);
    }
    let depth = link
        .parent()
        .map(|p| {
            p.components()
                .filter(|c| matches!(c, Component::Normal(_)))
                .count()
        })
        .unwrap_or(0);
    let mut ups = 0usize;
    let mut seen_name = false;
    for c in target.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => return Err(Escape::Absolute),
            Component::CurDir => {}
            Component::ParentDir if seen_name => return Err(Escape::DotDotAfterName),
            Component::ParentDir => {
                ups += 1;
                if ups > depth {
                    return Err(Escape::AboveRoot);
                }
            }
            Component::Normal(_) => seen_name = true,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(link: &str, target: &str) -> bool {
        check_target(Path::new(link), Path::new(target)).is_ok()
    }

    #[test]
    fn escapes_are_refused() {
        for (link, target) in [
            ("l", "/etc/passwd"),
            ("l", "../../../etc/passwd"),
            ("a/l", "sub/../../etc/passwd"),
            ("l", ".."),
            ("a/b/l", "../../.."),
            ("l", "./../x"),
            ("l", ".//..//x"),
            ("a/l", "x/../y"),
            ("a/l", "//etc/passwd"),
            ("l", ""),
            // Checked as one name, but the kernel stops at the NUL and follows `..`.
            ("l", "..\0"),
            ("a/l", "../..\0x"),
            ("l", "x\0/../../.."),
        ] {
            assert!(!ok(link, target), "{link} -> {target} must be refused");
        }
    }

    #[test]
    fn links_that_stay_inside_work() {
        for (link, target) in [
            ("l", "file"),
            ("a/l", "../sibling/file"),
            ("a/b/l", "../../top"),
            ("a/l", "./x"),
            ("a/l", ".//x//y"),
            ("a/l", ".."),
            ("l", "."),
        ] {
            assert!(ok(link, target), "{link} -> {target} must be allowed");
        }
    }

    #[test]
    fn shallow_symlink_trick_is_refused() {
        // s -> "." is contained, but s/../../x from depth 2 would climb 3 levels in reality.
        assert!(ok("d1/d2/s", "."));
        assert!(!ok("d1/d2/l", "s/../../../x"));
    }
}
