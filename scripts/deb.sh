#!/usr/bin/env bash
# `just deb`: build the Debian package target/debian/awcp-mount_VERSION_ARCH.deb.
#
# Plain dpkg-deb (part of dpkg, on every Debian machine) rather than cargo-deb: the
# package is a dozen files, and a build tool compiled from crates.io would add minutes
# to every fresh machine for nothing the 150 lines below do not do.
#
# What the package installs:
#   /usr/bin/awcp-mount                         the program (debug info stripped)
#   /sbin/mount.fuse.awcp -> /usr/bin/awcp-mount the mount(8) helper: mount -t fuse.awcp, fstab
#   /etc/awcp/policy.toml                       conffile, from policy/default.toml
#   /lib/systemd/system/awcp-executor.service   the AWCP executor endpoint (not enabled)
#   /lib/systemd/system/awcp-mount@.service     ad-hoc mounts, one instance per workspace
#   /usr/share/doc/awcp-mount/examples/         the .mount unit example, both example policies
#   /usr/share/man/man8/awcp-mount.8.gz         man page, generated from the CLI definition
#   bash, zsh and fish completions, generated the same way
#   /var/lib/awcp/mounts                        the default policy's mount root (0755)
#
# Environment:
#   AWCP_MOUNT_BIN  package this binary instead of building target/release/awcp-mount
#                   (`just test` packages the debug build it already has)
#   DEB_OUT         output directory (default target/debian)
# Prints the path of the .deb on its last line.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$repo/scripts/lib.sh"

out=${DEB_OUT:-$repo/target/debian}
bin=${AWCP_MOUNT_BIN:-$repo/target/release/awcp-mount}

for tool in dpkg-deb dpkg gzip; do
    command -v "$tool" >/dev/null 2>&1 ||
        die "$tool is missing: this script builds a Debian package and needs dpkg (apt-get install -y dpkg)"
done

if [[ -z ${AWCP_MOUNT_BIN:-} ]]; then
    header "Building awcp-mount (cargo build --release)"
    (cd "$repo" && cargo build --release)
fi
[[ -x $bin ]] || die "$bin is missing or not executable"

version=$("$bin" --version | awk 'NR == 1 { print $2 }')
[[ $version =~ ^[0-9][0-9A-Za-z.+~-]*$ ]] || die "'$bin --version' gave no usable version ('$version')"
arch=$(dpkg --print-architecture)
deb=$out/awcp-mount_${version}_${arch}.deb

mkdir -p "$out"
# The staging tree is ours alone, made fresh under the output directory.
stage=$(mktemp -d "$out/stage.XXXXXXXX")
trap 'remove_unless_mounted "$stage"' EXIT

header "Staging the package tree in $stage"
umask 022
install -d "$stage/DEBIAN" "$stage/usr/bin" "$stage/sbin" "$stage/etc/awcp" \
    "$stage/lib/systemd/system" "$stage/usr/share/man/man8" \
    "$stage/usr/share/doc/awcp-mount/examples" \
    "$stage/usr/share/bash-completion/completions" "$stage/usr/share/zsh/vendor-completions" \
    "$stage/usr/share/fish/vendor_completions.d" "$stage/var/lib/awcp/mounts"

install -m 0755 "$bin" "$stage/usr/bin/awcp-mount"
# The release profile keeps line tables for backtraces in bench profiles; an installed binary
# does not need them (the package shrinks several times over).
if command -v strip >/dev/null 2>&1; then
    strip --strip-debug "$stage/usr/bin/awcp-mount"
fi
# Absolute target: on merged-/usr systems /sbin is itself a link to usr/sbin, and a relative
# target would resolve from there to the wrong place.
ln -s /usr/bin/awcp-mount "$stage/sbin/mount.fuse.awcp"

install -m 0644 "$repo/policy/default.toml" "$stage/etc/awcp/policy.toml"
install -m 0644 "$repo/packaging/systemd/awcp-executor.service" \
    "$repo/packaging/systemd/awcp-mount@.service" "$stage/lib/systemd/system/"
install -m 0644 "$repo/packaging/systemd/var-lib-awcp-mounts-workspace.mount" \
    "$repo/policy/default.toml" "$repo/policy/strict.toml" "$stage/usr/share/doc/awcp-mount/examples/"
install -m 0644 "$repo/README.md" "$stage/usr/share/doc/awcp-mount/README.md"
gzip -9n "$stage/usr/share/doc/awcp-mount/README.md"
cat >"$stage/usr/share/doc/awcp-mount/copyright" <<'EOF'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: awcp-mount

Files: *
Copyright: the awcp-mount developers
License: Apache-2.0
 On Debian systems, the full text of the Apache License, Version 2.0 can be
 found in /usr/share/common-licenses/Apache-2.0.
EOF

"$bin" generate man | gzip -9n >"$stage/usr/share/man/man8/awcp-mount.8.gz"
"$bin" generate bash >"$stage/usr/share/bash-completion/completions/awcp-mount"
"$bin" generate zsh >"$stage/usr/share/zsh/vendor-completions/_awcp-mount"
"$bin" generate fish >"$stage/usr/share/fish/vendor_completions.d/awcp-mount.fish"

# Runtime dependencies: the C library (at least the newest symbol version the binary uses),
# libgcc_s when linked, and fuse3 for fusermount3 (mounting as a user, and AutoUnmount).
depends="fuse3"
glibc=$(objdump -T "$stage/usr/bin/awcp-mount" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1 || true)
if [[ -n $glibc ]]; then
    depends="libc6 (>= $glibc), $depends"
else
    depends="libc6, $depends"
fi
if ldd "$stage/usr/bin/awcp-mount" 2>/dev/null | grep -q 'libgcc_s'; then
    depends="libgcc-s1, $depends"
fi
installed_kib=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)

cat >"$stage/DEBIAN/control" <<EOF
Package: awcp-mount
Version: $version
Architecture: $arch
Maintainer: awcp-mount developers <awcp-mount@localhost>
Installed-Size: $installed_kib
Depends: $depends
Suggests: openssh-client
Section: admin
Priority: optional
Description: policed FUSE mount of an AWCP delegated workspace over SSH/SFTP
 awcp-mount mounts a directory that another machine lends over SSH, as a
 local filesystem, for an AI agent (or any tool) to work in: the data plane
 of an AWCP executor. It speaks SFTP through its own SSH client (no ssh or
 sshfs program), takes sshfs's command line, and enforces the executor's
 policy on every operation: mount root and empty-directory checks, a byte
 and file quota (ENOSPC), symlink containment, read-only leases and lease
 expiry. It also serves the AWCP executor endpoint (awcp-mount serve).
EOF
echo /etc/awcp/policy.toml >"$stage/DEBIAN/conffiles"

cat >"$stage/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
# Make the units known to a running systemd; nothing is enabled or started: which workspaces
# to mount and whether to run the executor endpoint are the operator's choice.
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
fi
EOF
cat >"$stage/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    systemctl stop awcp-executor.service >/dev/null 2>&1 || true
fi
# Mounts keep running from the old binary; say so instead of unmounting an agent's work.
if [ "$1" = remove ] && grep -q ' - fuse\.awcp ' /proc/self/mountinfo 2>/dev/null; then
    echo "awcp-mount: fuse.awcp mounts are still live; unmount them with 'umount MOUNTPOINT'" >&2
fi
EOF
cat >"$stage/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = purge ]; then
    # dpkg has removed the conffile; the directory goes too once nothing else is in it.
    rmdir /etc/awcp 2>/dev/null || true
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
fi
EOF
chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm" "$stage/DEBIAN/postrm"

header "Building $deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
dpkg-deb --info "$deb" | sed -n 's/^ \(Package\|Version\|Architecture\|Depends\|Installed-Size\):/    \1:/p'
echo "$deb"
