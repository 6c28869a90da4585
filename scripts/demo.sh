#!/usr/bin/env bash
# `just demo`: mount a workspace served by a private loopback sshd with
# awcp-mount, use it, and take everything down again.
#
# What it does, step by step:
#   1. builds target/release/awcp-mount;
#   2. creates a throwaway directory holding a host key, a user key, a
#      known_hosts file, an sshd config and a small sample workspace;
#   3. starts its own sshd on a free port of 127.0.0.1 (nothing else on the
#      machine is touched, no traffic leaves the loopback interface);
#   4. mounts the workspace under the default policy's mount root
#      (/var/lib/awcp/mounts) in a fresh, empty, 0700 directory;
#   5. lists, reads and writes through the mount, and shows the write landed
#      on the "server" side;
#   6. unmounts, stops sshd and removes everything it created; an EXIT trap
#      does the same cleanup if any step fails.
#
# Environment:
#   AWCP_MOUNT_ROOT  mount root (default /var/lib/awcp/mounts)
#   AWCP_MOUNT_BIN   use this binary instead of building target/release/awcp-mount
#                    (anything taking sshfs's arguments works, sshfs included)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$repo/scripts/lib.sh"

mount_root=${AWCP_MOUNT_ROOT:-/var/lib/awcp/mounts}
bin=${AWCP_MOUNT_BIN:-$repo/target/release/awcp-mount}
user=$(id -un)

# State the cleanup trap looks at; each is set once the thing exists.
tmp=""
sshd_pid=""
mnt=""

cleanup() {
    local rc=$? i leftover=0
    set +e
    trap - EXIT INT TERM HUP

    if [[ -n $mnt ]] && is_mounted "$mnt"; then
        header "Cleaning up: unmounting $mnt"
        timeout 30 "$bin" umount "$mnt" 2>/dev/null || fusermount3 -u "$mnt" || fusermount3 -uz "$mnt"
        for ((i = 0; i < 50; i++)); do
            is_mounted "$mnt" || break
            sleep 0.1
        done
    fi
    if [[ -n $mnt && -d $mnt ]]; then
        if is_mounted "$mnt"; then
            warn "$mnt is still mounted; leaving it. Unmount it with: fusermount3 -u $mnt"
            leftover=1
        else
            rmdir -- "$mnt" || {
                warn "could not remove mount point $mnt"
                leftover=1
            }
        fi
    fi

    stop_pid "$sshd_pid"

    remove_unless_mounted "$tmp" || leftover=1

    if ((rc != 0)); then
        if ((leftover)); then
            printf '\nerror: the demo failed (exit status %d); see the warnings above for what is left.\n' "$rc" >&2
        else
            printf '\nerror: the demo failed (exit status %d); everything it started has been cleaned up.\n' "$rc" >&2
        fi
    elif ((leftover)); then
        rc=1
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

"$repo/scripts/ensure-deps.sh" --fuse

if [[ -z ${AWCP_MOUNT_BIN:-} ]]; then
    header "Building awcp-mount (cargo build --release)"
    (cd "$repo" && cargo build --release)
fi
[[ -x $bin ]] || die "$bin is missing or not executable"

# (Canonical: mountinfo, which the cleanup compares it with, holds canonical paths.)
tmp=$(realpath -- "$(mktemp -d "${TMPDIR:-/tmp}/awcp-demo.XXXXXXXX")")
chmod 0700 "$tmp"
mkdir "$tmp/ssh"

key=$tmp/ssh/id_ed25519
known_hosts=$tmp/ssh/known_hosts

header "Creating a sample workspace in $tmp/workspace (the exported directory)"
export_dir=$tmp/workspace
mkdir -p "$export_dir/src"
cat >"$export_dir/README.md" <<'EOF'
# Sample workspace

This directory was delegated to an executor. The executor sees it through
awcp-mount, a FUSE filesystem speaking SFTP to the delegator's sshd.
EOF
cat >"$export_dir/src/main.rs" <<'EOF'
fn main() {
    println!("{}", greeting::hello("executor"));
}
EOF
cat >"$export_dir/src/greeting.rs" <<'EOF'
pub fn hello(name: &str) -> String {
    format!("hello, {name}")
}
EOF
have_git=0
if command -v git >/dev/null 2>&1; then
    have_git=1
    git -C "$export_dir" init -q
    git -C "$export_dir" add -A
    git -C "$export_dir" -c user.name=awcp-demo -c user.email=awcp-demo@localhost \
        commit -q -m "Initial workspace"
fi
(cd "$export_dir" && find . -name .git -prune -o -type f -print | sort | sed 's|^\./|    |')

header "Creating a throwaway host key, user key and known_hosts in $tmp/ssh"
# Its own sshd on a free port of 127.0.0.1: nothing else on the machine is touched.
start_private_sshd "$tmp/ssh"
port=$sshd_port

header "Preparing the mount point under $mount_root"
if [[ ! -d $mount_root ]]; then
    if ! mkdir -p "$mount_root" 2>/dev/null; then
        die "cannot create $mount_root; create it with: sudo install -d -m 0755 -o $user $mount_root"
    fi
    chmod 0755 "$mount_root"
fi
# mktemp -d makes a fresh, empty directory with mode 0700.
mnt=$(mktemp -d "$mount_root/demo-XXXXXXXX") ||
    die "cannot create a directory in $mount_root (as root: install -d -m 0755 -o $user $mount_root)"
chmod 0700 "$mnt"
echo "    mount point: $mnt"

header "Mounting $user@127.0.0.1:$export_dir on $mnt"
# It daemonizes like sshfs: it exits 0 once the mount is live.
run_limited 120 "$bin" "$user@127.0.0.1:$export_dir" "$mnt" -p "$port" \
    -o "IdentityFile=$key,UserKnownHostsFile=$known_hosts" ||
    die "awcp-mount failed to mount (exit status $?; 124 means it timed out)"
is_mounted "$mnt" || die "awcp-mount exited 0 but $mnt is not in /proc/self/mountinfo"

header "Listing the mount"
run ls -la "$mnt"
run ls -la "$mnt/src"

header "Reading a file through the mount"
run cat "$mnt/README.md"
cmp "$mnt/src/main.rs" "$export_dir/src/main.rs" || die "src/main.rs differs between the mount and the export"

header "Writing a new file through the mount"
note="written by the executor through awcp-mount at $(date -u +%Y-%m-%dT%H:%M:%SZ)"
printf '%s\n' "$note" >"$mnt/EXECUTOR_NOTES.txt"
run mkdir "$mnt/out"
printf 'build output\n' >"$mnt/out/result.txt"
echo "    ... and reading it on the server side, in the exported directory:"
run cat "$export_dir/EXECUTOR_NOTES.txt"
[[ $(cat "$export_dir/EXECUTOR_NOTES.txt") == "$note" ]] || die "EXECUTOR_NOTES.txt did not arrive intact"
[[ $(cat "$export_dir/out/result.txt") == "build output" ]] || die "out/result.txt did not arrive intact"

header "Filesystem usage and mount table entry"
run df -h "$mnt"
if command -v findmnt >/dev/null 2>&1; then
    run findmnt --mountpoint "$mnt"
else
    mount | grep -F " $mnt " || die "$mnt is not in the mount table"
fi

if ((have_git)); then
    header "git status inside the mount"
    # Files on the mount may belong to another uid; tell git the repo is ours to use.
    run git -c safe.directory='*' -C "$mnt" status --short --branch
fi

header "Unmounting"
if ! run_limited 60 "$bin" umount "$mnt"; then
    warn "awcp-mount umount failed; falling back to fusermount3 -u"
    run fusermount3 -u "$mnt"
fi
for ((i = 0; i < 50; i++)); do
    is_mounted "$mnt" || break
    sleep 0.1
done
is_mounted "$mnt" && die "$mnt is still mounted after unmounting"
echo "    $mnt is no longer in /proc/self/mountinfo"
rmdir -- "$mnt"
mnt=""

header "Stopping sshd (PID $sshd_pid) and removing $tmp"
stop_pid "$sshd_pid"
sshd_pid=""
# The EXIT trap removes $tmp after checking nothing is mounted below it.

header "Demo finished: mounted, read, wrote, unmounted, cleaned up."
