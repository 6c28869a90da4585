#!/usr/bin/env bash
# `just clean-mounts [DIR]`: unmount awcp-mount filesystems (type fuse.awcp in
# /proc/self/mountinfo) left behind, e.g. by a crashed test or demo. Mounts of
# any other type, sshfs included, are never touched.
#
# Without DIR this covers every fuse.awcp mount on the machine, including ones
# another user or a test still running owns; give DIR (e.g.
# /var/lib/awcp/mounts) to unmount only the mounts at or below it.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$repo/scripts/lib.sh"

if (($# > 1)); then
    echo "usage: $0 [DIR]" >&2
    exit 2
fi
scope=""
if (($# == 1)); then
    [[ -d $1 ]] || die "$1 is not a directory"
    scope=$(cd "$1" && pwd -P)
fi

mounts=()
while IFS= read -r mp; do
    if [[ -z $scope || $mp == "$scope" || $mp == "$scope"/* ]]; then
        mounts+=("$mp")
    fi
done < <(list_mounts fuse.awcp)

if ((${#mounts[@]} == 0)); then
    echo "No awcp mounts (fstype fuse.awcp)${scope:+ at or below $scope} found."
    exit 0
fi

echo "awcp mounts found${scope:+ at or below $scope}:"
printf '    %s\n' "${mounts[@]}"

failed=0
# Unmount the deepest first, in case one awcp mount sits inside another.
while IFS= read -r mp; do
    if ! run fusermount3 -u "$mp"; then
        warn "could not unmount $mp (busy? close whatever uses it, or: fusermount3 -uz '$mp')"
        failed=1
    fi
done < <(printf '%s\n' "${mounts[@]}" | sort -r)

exit "$failed"
