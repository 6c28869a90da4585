#!/usr/bin/env bash
# `just conformance SUITE`: run an external file system test suite on awcp-mount (and, to
# compare, on sshfs) against a private loopback sshd, the way docs/SEMANTICS.md reports it.
# SUITE is either of:
#   - a built pjdfstest directory (the POSIX suite: https://github.com/pjd/pjdfstest,
#     `autoreconf -ifs && ./configure && make pjdfstest`; the directory holding the
#     `pjdfstest` binary and `tests/`);
#   - an fsx binary (the file system exerciser of xfstests, `ltp/fsx.c`: random reads,
#     writes, mmap reads and writes, truncates and copies on one file, every read checked
#     against what it must hold).
# Neither is part of this repository.
#
# What it does:
#   1. builds target/release/awcp-mount;
#   2. creates a throwaway directory (mode 0711: pjdfstest switches to uids 65533-65535,
#      which must reach the mount) with keys, an sshd config, a policy and an empty export;
#   3. starts its own sshd on a free port of 127.0.0.1; it must run as root, so that the
#      server account is root and chown can work at all;
#   4. for each program, mounts the export with -o allow_other,default_permissions (the
#      suite checks what other users may do) and runs the suite in a directory of the mount,
#      its log in ${CONFORMANCE_LOGS:-target/conformance}/PROGRAM.log (pjdfstest) or
#      PROGRAM-fsx.log (fsx, with fsx's own files in fsx-PROGRAM/):
#      - pjdfstest: `prove -r SUITE/tests`, then the number of checks that failed;
#      - fsx: a fixed set of seeded runs (plain, reopening with the page cache dropped,
#        fsync after every write, O_DIRECT, big file and big operations), each passing
#        only if fsx completes and the file the server holds then equals the file read
#        through the mount (`cmp`): nothing acknowledged may be lost on the way;
#   5. unmounts; an EXIT trap unmounts, stops sshd (by PID) and removes the directory
#      (never through a live mount). Exits non-zero if an fsx run failed.
#
# Environment:
#   CONFORMANCE_PROGRAMS="awcp sshfs"   which to run
#   CONFORMANCE_LOGS=target/conformance where the logs go
#   CONFORMANCE_FSX_OPS=20000           operations per fsx run (the plain one runs 5 times as many)
#   AWCP_MOUNT_BIN                      use this binary instead of building one
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$repo/scripts/lib.sh"

suite=${1:-}
usage="usage: just conformance SUITE (a built pjdfstest directory, or an fsx binary)"
[[ -n $suite ]] || die "$usage"
[[ -e $suite ]] || die "$suite does not exist; $usage"
if [[ -d $suite ]]; then
    kind=pjdfstest
    suite=$(cd "$suite" && pwd)
    [[ -x $suite/pjdfstest && -d $suite/tests ]] ||
        die "$suite has no built pjdfstest binary and tests/ directory; build it first (autoreconf -ifs && ./configure && make pjdfstest)"
    command -v prove >/dev/null || die "prove (perl) is missing: apt-get install -y perl"
else
    kind=fsx
    suite=$(cd "$(dirname "$suite")" && pwd)/$(basename "$suite")
    [[ -x $suite ]] || die "$suite is not executable; pass a built fsx binary (xfstests ltp/fsx.c) or a pjdfstest directory"
fi
[[ $(id -u) -eq 0 ]] || die "run it as root: the server account must be root (and pjdfstest switches users)"
fsx_ops=${CONFORMANCE_FSX_OPS:-20000}
[[ $fsx_ops =~ ^[1-9][0-9]*$ ]] || die "CONFORMANCE_FSX_OPS must be a positive number of operations, not '$fsx_ops'"
programs=${CONFORMANCE_PROGRAMS:-awcp sshfs}
for p in $programs; do [[ $p == awcp || $p == sshfs ]] || die "CONFORMANCE_PROGRAMS: unknown program '$p'"; done
logs=${CONFORMANCE_LOGS:-$repo/target/conformance}
bin=${AWCP_MOUNT_BIN:-$repo/target/release/awcp-mount}

tmp=""
sshd_pid=""
cleanup() {
    local rc=$? mp
    set +e
    trap - EXIT INT TERM HUP
    if [[ -n $tmp ]]; then
        while IFS= read -r mp; do
            [[ $mp == "$tmp"/* ]] && { fusermount3 -u "$mp" || fusermount3 -uz "$mp"; }
        done < <(list_mounts "")
    fi
    stop_pid "$sshd_pid"
    remove_unless_mounted "$tmp" || rc=1
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

if [[ -z ${AWCP_MOUNT_BIN:-} ]]; then
    header "Building awcp-mount (cargo build --release)"
    (cd "$repo" && cargo build --release --quiet)
fi
# (Canonical: mountinfo, which the cleanup compares it with, holds canonical paths.)
tmp=$(realpath -- "$(mktemp -d "${TMPDIR:-/tmp}/awcp-conformance.XXXXXX")")
chmod 0711 "$tmp"
mkdir -p "$tmp/export" "$tmp/mnt" "$logs"
chmod 0755 "$tmp/export" "$tmp/mnt"
printf 'mount_root = "%s/mnt"\n' "$tmp" >"$tmp/policy.toml"
start_private_sshd "$tmp"
opts="allow_other,default_permissions,reconnect,follow_symlinks"
ssh_opts="IdentityFile=$tmp/id_ed25519,UserKnownHostsFile=$tmp/known_hosts"

# pjdfstest in DIR; prints the number of checks that failed.
run_pjdfstest() {
    local prog=$1 dir=$2 failed summary
    header "pjdfstest on $prog (prove -r $suite/tests; log: $logs/$prog.log)"
    (cd "$dir" && timeout 3600 prove -r "$suite/tests" >"$logs/$prog.log" 2>&1) || true
    failed=$(grep -oE 'Tests: [0-9]+ Failed: [0-9]+' "$logs/$prog.log" | awk '{s += $4} END {print s + 0}')
    summary=$(grep -E '^Files=' "$logs/$prog.log" | cut -d, -f1-2)
    echo "    $prog: ${summary:-no summary (see the log)}; failed checks: $failed"
}

# The fsx runs, each on its own file in DIR (SERVER_DIR: the same directory on the server);
# fails if any did. fsx turns off by itself what the file system answers EOPNOTSUPP to
# (fallocate, clone, dedupe).
run_fsx() {
    local prog=$1 dir=$2 server_dir=$3 log=$logs/$prog-fsx.log fsx_dir=$logs/fsx-$prog
    local i name args rc t0 result bad=0
    local -a runs=(
        "plain:-S 1 -N $((fsx_ops * 5))"
        "reopen:-S 2 -N $fsx_ops -c 100"
        "fsync:-S 3 -N $fsx_ops -y"
        "direct:-S 4 -N $fsx_ops -Z -R -W -r 4096 -w 4096"
        "big:-S 5 -N $fsx_ops -l 4194304 -o 262144"
    )
    header "fsx on $prog ($suite; log: $log)"
    : >"$log"
    mkdir -p "$fsx_dir"
    for i in "${runs[@]}"; do
        name=${i%%:*} args=${i#*:}
        t0=$EPOCHREALTIME
        echo "== $name: fsx -q $args -P $fsx_dir $dir/$name" >>"$log"
        # shellcheck disable=SC2086 # args is a list of options
        timeout 1800 "$suite" -q $args -P "$fsx_dir" "$dir/$name" >>"$log" 2>&1 && rc=0 || rc=$?
        if ((rc != 0)); then
            result="FAILED (fsx exit $rc; its .fsxlog and .fsxgood are in $fsx_dir)"
        elif ! cmp -- "$dir/$name" "$server_dir/$name" >>"$log" 2>&1; then
            rc=1 result="FAILED: the server's file differs from the mount's"
        else
            result="ok, the server's file equals the mount's"
        fi
        ((rc == 0)) || bad=1
        awk -v p="$prog" -v n="$name" -v a="$args" -v r="$result" -v t0="$t0" -v t1="$EPOCHREALTIME" \
            'BEGIN { printf "    %s %-7s %-42s %6.1f s  %s\n", p, n, a, t1 - t0, r }' | tee -a "$log"
    done
    return $bad
}

fsx_failed=0
for prog in $programs; do
    mnt=$tmp/mnt/$prog
    mkdir -m 0755 "$mnt"
    header "Mounting with $prog (-o $opts)"
    case $prog in
    awcp) run_limited 120 "$bin" "root@127.0.0.1:$tmp/export" "$mnt" -p "$sshd_port" \
        --policy "$tmp/policy.toml" -o "$ssh_opts,$opts" ;;
    sshfs) run_limited 120 sshfs "root@127.0.0.1:$tmp/export" "$mnt" -p "$sshd_port" -F /dev/null \
        -o "$ssh_opts,StrictHostKeyChecking=yes,BatchMode=yes,$opts" ;;
    esac
    is_mounted "$mnt" || die "$prog did not mount $mnt"
    mkdir -m 0755 "$mnt/run-$prog"
    case $kind in
    pjdfstest) run_pjdfstest "$prog" "$mnt/run-$prog" ;;
    fsx) run_fsx "$prog" "$mnt/run-$prog" "$tmp/export/run-$prog" || fsx_failed=1 ;;
    esac
    fusermount3 -u "$mnt" || die "could not unmount $mnt"
done
exit "$fsx_failed"
