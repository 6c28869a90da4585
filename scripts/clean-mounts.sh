#!/usr/bin/env bash
# `just clean-mounts`: unmount every awcp-mount filesystem (type fuse.awcp in
# /proc/self/mountinfo) left behind, e.g. by a crashed test or demo. Mounts of
# any other type, sshfs included, are never touched.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$repo/scripts/lib.sh"

mapfile -t mounts < <(list_mounts fuse.awcp)
if ((${#mounts[@]} == 0)); then
    echo "No awcp mounts (fstype fuse.awcp) found."
    exit 0
fi

echo "awcp mounts found:"
printf '    %s\n' "${mounts[@]}"

failed=0
# Unmount the deepest first, in case one awcp mount sits inside another.
while IFS= read -r mp; do
    if run fusermount3 -u "$mp"; then
        :
    else
        warn "could not unmount $mp (busy? close whatever uses it, or: fusermount3 -uz '$mp')"
        failed=1
    fi
done < <(printf '%s\n' "${mounts[@]}" | sort -r)

exit "$failed"
