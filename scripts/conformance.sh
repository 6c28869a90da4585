#!/usr/bin/env bash
# `just conformance PJDFSTEST_DIR`: run the pjdfstest POSIX suite on awcp-mount (and, to
# compare, on sshfs) against a private loopback sshd, the way docs/SEMANTICS.md reports it.
#
# pjdfstest is not part of this repository: build it first (https://github.com/pjd/pjdfstest:
# `autoreconf -ifs && ./configure && make pjdfstest`) and pass its directory, the one holding
# the `pjdfstest` binary and `tests/`.
#
# What it does:
#   1. builds target/release/awcp-mount;
#   2. creates a throwaway directory (mode 0711: the suite switches to uids 65533-65535,
#      which must reach the mount) with keys, an sshd config, a policy and an empty export;
#   3. starts its own sshd on a free port of 127.0.0.1; it must run as root, so that the
#      server account is root and chown can work at all;
#   4. for each program, mounts the export with -o allow_other,default_permissions (the
#      suite checks what other users may do) and runs `prove -r PJDFSTEST_DIR/tests` in a
#      directory of the mount, its log in ${CONFORMANCE_LOGS:-target/conformance}/PROGRAM.log;
#   5. prints, per program, the number of checks that failed, and unmounts; an EXIT trap
#      unmounts, stops sshd (by PID) and removes the directory (never through a live mount).
#
# Environment:
#   CONFORMANCE_PROGRAMS="awcp sshfs"   which to run
#   CONFORMANCE_LOGS=target/conformance where the prove logs go
#   AWCP_MOUNT_BIN                      use this binary instead of building one
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$repo/scripts/lib.sh"

suite=${1:-}
[[ -n $suite ]] || die "usage: just conformance PJDFSTEST_DIR (a built pjdfstest: its pjdfstest binary and tests/)"
suite=$(cd "$suite" 2>/dev/null && pwd) || die "$1 is not a directory"
[[ -x $suite/pjdfstest && -d $suite/tests ]] ||
    die "$suite has no built pjdfstest binary and tests/ directory; build it first (autoreconf -ifs && ./configure && make pjdfstest)"
[[ $(id -u) -eq 0 ]] || die "run it as root: the suite switches users, and the server account must be root"
command -v prove >/dev/null || die "prove (perl) is missing: apt-get install -y perl"
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
tmp=$(mktemp -d "${TMPDIR:-/tmp}/awcp-conformance.XXXXXX")
chmod 0711 "$tmp"
mkdir -p "$tmp/export" "$tmp/mnt" "$logs"
chmod 0755 "$tmp/export" "$tmp/mnt"
printf 'mount_root = "%s/mnt"\n' "$tmp" >"$tmp/policy.toml"
start_private_sshd "$tmp"
opts="allow_other,default_permissions,reconnect,follow_symlinks"
ssh_opts="IdentityFile=$tmp/id_ed25519,UserKnownHostsFile=$tmp/known_hosts"

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
    header "pjdfstest on $prog (prove -r $suite/tests; log: $logs/$prog.log)"
    (cd "$mnt/run-$prog" && timeout 3600 prove -r "$suite/tests" >"$logs/$prog.log" 2>&1) || true
    failed=$(grep -oE 'Tests: [0-9]+ Failed: [0-9]+' "$logs/$prog.log" | awk '{s += $4} END {print s + 0}')
    summary=$(grep -E '^Files=' "$logs/$prog.log" | cut -d, -f1-2)
    echo "    $prog: ${summary:-no summary (see the log)}; failed checks: $failed"
    fusermount3 -u "$mnt" || die "could not unmount $mnt"
done
