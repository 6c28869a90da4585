# shellcheck shell=bash
# Helpers shared by the scripts in this directory. Source it; do not run it.

# Short section header, so a newcomer can follow what a script is doing.
header() { printf '\n==> %s\n' "$*"; }

# Print a command (quoted only where the shell needs it), then run it.
run() {
    show "$@"
    "$@"
}

# Like run, but give up after SECONDS (exit status 124), so that a hung
# command cannot hang the script.
run_limited() {
    local secs=$1
    shift
    show "$@"
    timeout --foreground "$secs" "$@"
}

show() {
    local arg
    printf '$'
    for arg in "$@"; do
        if [[ $arg =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
            printf ' %s' "$arg"
        else
            printf " %q" "$arg"
        fi
    done
    printf '\n'
}

warn() { printf 'warning: %s\n' "$*" >&2; }
die() {
    printf 'error: %s\n' "$*" >&2
    exit 1
}

# /proc/self/mountinfo escapes space, tab, newline and backslash in paths as
# \040, \011, \012 and \134; undo that.
unescape_mountinfo() { printf '%b' "$1"; }

# Print the mount point of every mount, one a line, unescaped; with an
# argument, only mounts whose filesystem type equals it (e.g. fuse.awcp).
# Mount points containing a newline are skipped: they cannot be printed
# one a line unambiguously, and nothing these scripts create has one.
list_mounts() {
    local want=${1-} line mp fstype
    while IFS= read -r line; do
        # Fields: id parent maj:min root mountpoint options [optional...] - fstype source super
        mp=${line#* * * * }
        mp=${mp%% *}
        fstype=${line#* - }
        fstype=${fstype%% *}
        [[ -z $want || $fstype == "$want" ]] || continue
        [[ $mp == *'\012'* ]] && continue
        unescape_mountinfo "$mp"
        printf '\n'
    done </proc/self/mountinfo
}

# True if PATH itself is a mount point.
is_mounted() {
    local path=$1 mp
    while IFS= read -r mp; do
        [[ $mp == "$path" ]] && return 0
    done < <(list_mounts "")
    return 1
}

# True if PATH or anything below it is a mount point. Check this before any
# recursive delete: `rm -rf` through a live mount would delete remote files.
has_mount_at_or_below() {
    local path=${1%/} mp
    while IFS= read -r mp; do
        [[ $mp == "$path" || $mp == "$path"/* ]] && return 0
    done < <(list_mounts "")
    return 1
}
