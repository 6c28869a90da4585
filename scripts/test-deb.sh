#!/usr/bin/env bash
# Package test, run by `just test` after the cargo tests: build the .deb, install it with
# dpkg, check what it installed (systemd-analyze verify on the units included), mount a
# workspace from a private loopback sshd through mount(8) and the installed helper (an
# `mount -t fuse.awcp` command line and an fstab line), write through it, unmount, then
# remove and purge the package and check nothing of it is left.
#
# It changes the machine (dpkg -i), so it runs only as root, and only where no awcp-mount
# package and no /etc/awcp are there already: it never replaces an operator's install or
# configuration. Otherwise it says why it is skipped and exits 0. An EXIT trap unmounts,
# stops sshd and purges the package even when a step fails.
#
# Environment:
#   AWCP_MOUNT_BIN  the binary to package (default: build the release binary)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$repo/scripts/lib.sh"

skip() {
    printf 'package test skipped: %s\n' "$*"
    echo "package: 0 passed, 0 failed, 1 skipped"
    exit 0
}
[[ $(id -u) -eq 0 ]] || skip "it installs a package, so it needs root (sudo $0)"
dpkg-query -W -f='${Status}' awcp-mount 2>/dev/null | grep -q 'installed' &&
    skip "an awcp-mount package is already installed here (dpkg -r awcp-mount first)"
[[ -e /etc/awcp ]] && skip "/etc/awcp exists: an operator's configuration is not replaced by a test"
[[ -e /dev/fuse ]] || die "/dev/fuse is missing: FUSE is not available on this machine"

# State the cleanup trap looks at; each is set once the thing exists.
tmp=""
sshd_pid=""
mnt=""
installed=0
mount_root_made=0

cleanup() {
    local rc=$? i
    set +e
    trap - EXIT INT TERM HUP
    if [[ -n $mnt ]] && is_mounted "$mnt"; then
        umount "$mnt" || umount -l "$mnt"
        for ((i = 0; i < 50; i++)); do
            is_mounted "$mnt" || break
            sleep 0.1
        done
    fi
    if [[ -n $mnt && -d $mnt ]] && ! is_mounted "$mnt"; then
        rmdir -- "$mnt"
    fi
    ((installed)) && dpkg -P awcp-mount >/dev/null 2>&1
    # The mount root came with the package. If it was there before, it stays: dpkg -P removes
    # an empty directory it owned, so put it back.
    if ((!mount_root_made)) && [[ ! -d /var/lib/awcp/mounts ]]; then
        install -d -m 0755 /var/lib/awcp/mounts
    fi
    stop_pid "$sshd_pid"
    remove_unless_mounted "$tmp" || { ((rc == 0)) && rc=1; }
    if ((rc == 0)); then
        echo "package: 1 passed, 0 failed"
    else
        printf '\nerror: the package test failed (exit status %d)\n' "$rc" >&2
        echo "package: 0 passed, 1 failed"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

fail() { die "package test: $*"; }

# (Canonical: mountinfo, which the cleanup compares it with, holds canonical paths.)
tmp=$(realpath -- "$(mktemp -d "${TMPDIR:-/tmp}/awcp-debtest.XXXXXXXX")")
chmod 0700 "$tmp"
mkdir "$tmp/ssh" "$tmp/export" "$tmp/deb"

deb=$(DEB_OUT=$tmp/deb "$repo/scripts/deb.sh" | tail -n1)
[[ -f $deb ]] || fail "scripts/deb.sh did not produce a package (last line: '$deb')"

header "Installing $deb"
[[ -d /var/lib/awcp/mounts ]] || mount_root_made=1
installed=1
run dpkg -i "$deb"
dpkg-query -W -f='${Status}\n' awcp-mount | grep -qx 'install ok installed' || fail "dpkg does not list awcp-mount as installed"

header "Checking the installed files"
for f in /usr/bin/awcp-mount /etc/awcp/policy.toml /lib/systemd/system/awcp-executor.service \
    /lib/systemd/system/awcp-mount@.service /usr/share/man/man8/awcp-mount.8.gz \
    /usr/share/bash-completion/completions/awcp-mount /usr/share/zsh/vendor-completions/_awcp-mount \
    /usr/share/fish/vendor_completions.d/awcp-mount.fish \
    /usr/share/doc/awcp-mount/examples/var-lib-awcp-mounts-workspace.mount; do
    [[ -f $f ]] || fail "$f was not installed"
done
[[ $(readlink /sbin/mount.fuse.awcp) == /usr/bin/awcp-mount ]] || fail "/sbin/mount.fuse.awcp is not a link to /usr/bin/awcp-mount"
[[ -d /var/lib/awcp/mounts ]] || fail "the mount root /var/lib/awcp/mounts was not created"
run /usr/bin/awcp-mount --version
run /usr/bin/awcp-mount check-policy /etc/awcp/policy.toml >/dev/null
zcat /usr/share/man/man8/awcp-mount.8.gz | grep -q '^\.TH' || fail "the man page is not a man page"
grep -q 'complete' /usr/share/bash-completion/completions/awcp-mount || fail "the bash completion is empty"

if command -v systemd-analyze >/dev/null 2>&1; then
    header "systemd-analyze verify on the installed units"
    # verify prints problems but exits 0 for some of them: any output is a failure.
    out=$(cd /lib/systemd/system && systemd-analyze verify awcp-executor.service awcp-mount@example.service \
        /usr/share/doc/awcp-mount/examples/var-lib-awcp-mounts-workspace.mount 2>&1) || fail "systemd-analyze verify failed: $out"
    [[ -z $out ]] || fail "systemd-analyze verify is not clean:"$'\n'"$out"
    echo "    clean"
else
    warn "systemd-analyze is not installed; the units were not verified (apt-get install -y systemd)"
fi

header "Mounting through mount(8) and the installed helper"
start_private_sshd "$tmp/ssh"
echo "hello from the delegator" >"$tmp/export/greeting.txt"
mnt=$(mktemp -d /var/lib/awcp/mounts/debtest-XXXXXXXX)
user=$(id -un)
opts="IdentityFile=$tmp/ssh/id_ed25519,UserKnownHostsFile=$tmp/ssh/known_hosts,Port=$sshd_port"
# _netdev and nofail are mount(8)'s own; the helper must drop them, as it must for fstab.
run_limited 60 mount -t fuse.awcp "$user@127.0.0.1:$tmp/export" "$mnt" -o "_netdev,nofail,$opts" ||
    fail "mount -t fuse.awcp failed"
grep -q " $mnt .* - fuse.awcp " /proc/self/mountinfo || fail "$mnt is not a fuse.awcp mount in mountinfo"
[[ $(cat "$mnt/greeting.txt") == "hello from the delegator" ]] || fail "reading through the mount gave the wrong data"
echo "written by the executor" >"$mnt/reply.txt"
run_limited 30 umount "$mnt" || fail "umount failed"
is_mounted "$mnt" && fail "$mnt is still mounted after umount"
[[ $(cat "$tmp/export/reply.txt") == "written by the executor" ]] || fail "the write did not reach the server"
echo "    mounted, read, wrote, unmounted"

header "Mounting from an fstab line (mount --fstab FILE MOUNTPOINT)"
printf '%s %s fuse.awcp noauto,_netdev,nofail,x-systemd.automount,ro,%s 0 0\n' \
    "$user@127.0.0.1:$tmp/export" "$mnt" "$opts" >"$tmp/fstab"
cat "$tmp/fstab"
run_limited 60 mount --fstab "$tmp/fstab" "$mnt" || fail "mounting the fstab line failed"
grep -q " $mnt ro,.* - fuse.awcp " /proc/self/mountinfo || fail "the fstab mount is not a read-only fuse.awcp mount"
[[ $(cat "$mnt/reply.txt") == "written by the executor" ]] || fail "reading through the fstab mount gave the wrong data"
if err=$( (echo nope >"$mnt/denied.txt") 2>&1); then fail "a write to the ro mount succeeded"; fi
[[ $err == *"Read-only file system"* ]] || fail "a write to the ro mount failed, but not with EROFS: $err"
[[ -e $tmp/export/denied.txt ]] && fail "a write to the ro mount reached the server"
run_limited 30 umount "$mnt" || fail "umount failed"
is_mounted "$mnt" && fail "$mnt is still mounted after umount"
rmdir -- "$mnt"
mnt=""
echo "    read-only fstab mount: read, write refused, unmounted"

header "Removing, then purging the package"
run dpkg -r awcp-mount
for f in /usr/bin/awcp-mount /sbin/mount.fuse.awcp /lib/systemd/system/awcp-executor.service \
    /usr/share/man/man8/awcp-mount.8.gz; do
    [[ -e $f || -L $f ]] && fail "$f is still there after dpkg -r"
done
[[ -f /etc/awcp/policy.toml ]] || fail "dpkg -r removed the conffile /etc/awcp/policy.toml (only purge may)"
run dpkg -P awcp-mount
installed=0
[[ -e /etc/awcp ]] && fail "/etc/awcp is still there after dpkg -P"
if ((mount_root_made)) && [[ -e /var/lib/awcp/mounts ]]; then
    fail "/var/lib/awcp/mounts is still there after dpkg -P although the package created it"
fi
dpkg-query -W awcp-mount >/dev/null 2>&1 && fail "dpkg still knows awcp-mount after purge"

header "Package test passed: built, installed, verified, mounted (mount -t and fstab), removed, purged"
