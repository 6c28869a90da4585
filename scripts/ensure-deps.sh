#!/usr/bin/env bash
# Make sure the system tools every `just` recipe relies on are present.
#
#   scripts/ensure-deps.sh          packages, sshd's run dir, cargo, rustfmt, clippy
#   scripts/ensure-deps.sh --fuse   the same, and also require /dev/fuse (and the
#                                   package test's systemd-analyze and mount)
#
# Debian packages: fuse3 (fusermount3), openssh-server (sshd, for the demo and
# the integration tests' private loopback server), openssh-client (ssh-keygen),
# sshfs (the reference the tests compare against); with --fuse also systemd
# (systemd-analyze, for the package test) and mount.
#
# As root, missing packages are installed with apt-get (`apt-get update` runs
# only when something is missing). Otherwise the exact command to run is
# printed and the script exits non-zero. Silent when nothing is missing.
set -euo pipefail

need_fuse=0
for arg in "$@"; do
    case $arg in
    --fuse) need_fuse=1 ;;
    *)
        echo "usage: $0 [--fuse]" >&2
        exit 2
        ;;
    esac
done

# /usr/sbin is often not on a non-root user's PATH; look there too.
have() { command -v "$1" >/dev/null 2>&1 || [[ -x /usr/sbin/$1 || -x /usr/bin/$1 ]]; }

missing=()
have sshd || missing+=(openssh-server)
{ have ssh-keygen && have ssh; } || missing+=(openssh-client)
have fusermount3 || missing+=(fuse3)
have sshfs || missing+=(sshfs)
# The package test (`just test`) checks the systemd units with systemd-analyze verify and
# mounts through mount(8).
if ((need_fuse)); then
    have systemd-analyze || missing+=(systemd)
    have mount || missing+=(mount)
fi

is_root=0
[[ $(id -u) -eq 0 ]] && is_root=1

if ((${#missing[@]})); then
    install_cmd="apt-get update && apt-get install -y ${missing[*]}"
    if ((is_root)); then
        echo "==> Installing missing packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update
        apt-get install -y "${missing[@]}" </dev/null
    else
        {
            echo "error: missing packages: ${missing[*]}"
            echo "Install them with:"
            echo "    sudo sh -c '$install_cmd'"
        } >&2
        exit 1
    fi
fi

# sshd refuses to start without its privilege-separation directory, which the
# package normally creates at boot (it lives on a tmpfs).
if [[ ! -d /run/sshd ]]; then
    if ((is_root)); then
        mkdir -p /run/sshd
        chmod 0755 /run/sshd
    else
        {
            echo "error: /run/sshd is missing (sshd needs it). Create it with:"
            echo "    sudo mkdir -p /run/sshd"
        } >&2
        exit 1
    fi
fi

if ! command -v cargo >/dev/null 2>&1; then
    {
        echo "error: cargo not found. Install a Rust toolchain (https://rustup.rs) and make"
        echo "sure ~/.cargo/bin is on PATH."
    } >&2
    exit 1
fi

# rustfmt and clippy are rustup components; add them if rustup manages the toolchain.
components=()
cargo fmt --version >/dev/null 2>&1 || components+=(rustfmt)
cargo clippy --version >/dev/null 2>&1 || components+=(clippy)
if ((${#components[@]})); then
    if command -v rustup >/dev/null 2>&1; then
        echo "==> Adding Rust components: ${components[*]}"
        rustup component add "${components[@]}"
    else
        echo "error: cargo subcommands missing: ${components[*]} (install them with your toolchain)" >&2
        exit 1
    fi
fi

if ((need_fuse)) && [[ ! -c /dev/fuse ]]; then
    {
        echo "error: /dev/fuse is missing, so nothing can be mounted."
        echo "On a normal machine: modprobe fuse. In a container: run it with"
        echo "    --device /dev/fuse --cap-add SYS_ADMIN"
    } >&2
    exit 1
fi
