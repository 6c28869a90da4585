# Developer entry points for awcp-mount. Run `just` for the list.
# Every recipe first runs scripts/ensure-deps.sh, which installs missing
# system packages when run as root and otherwise prints the command to run.

set shell := ["bash", "-euo", "pipefail", "-c"]
set positional-arguments

# List the recipes
default:
    @just --list

# Mount a sample workspace from a private loopback sshd, use it, unmount
demo:
    scripts/demo.sh

# Format check, clippy, every test (unit, integration, FUSE), then the package test
test:
    scripts/ensure-deps.sh --fuse
    cargo fmt --check
    cargo clippy --all-targets -- -D warnings
    cargo test --all-targets
    AWCP_MOUNT_BIN=target/debug/awcp-mount scripts/test-deb.sh

# Debian package: target/debian/awcp-mount_VERSION_ARCH.deb (release build)
deb:
    scripts/ensure-deps.sh
    scripts/deb.sh

# Release build: target/release/awcp-mount
build:
    scripts/ensure-deps.sh
    cargo build --release

# Format check and clippy only
check:
    scripts/ensure-deps.sh
    cargo fmt --check
    cargo clippy --all-targets -- -D warnings

# Only the FUSE tests, which mount for real (extra arguments go to cargo test)
fuse-test *args:
    scripts/ensure-deps.sh --fuse
    cargo test --test fuse "$@"

# Long runs CI does not make: more seeds of the model checks (fsx, namespace), and fsx under connection drops (AWCP_FSX_SEEDS, AWCP_KILL_MS)
soak:
    scripts/ensure-deps.sh --fuse
    AWCP_FSX_SEEDS="${AWCP_FSX_SEEDS:-10}" cargo test --release --test fuse fsx_random_operations_match_a_model
    AWCP_FSX_SEEDS="${AWCP_FSX_SEEDS:-10}" cargo test --release --test fuse namespace_operations_match_a_local_directory
    AWCP_FSX_SEEDS="${AWCP_FSX_SEEDS:-10}" cargo test --release --test fuse -- --ignored --nocapture fsx_under_connection_drops

# awcp-mount and sshfs side by side on one private sshd; writes bench/results/latest.md
bench:
    scripts/ensure-deps.sh --fuse
    scripts/bench.sh

# pjdfstest or fsx (built by you, not part of this repository) on awcp-mount and sshfs, as
# root: just conformance /path/to/pjdfstest, or /path/to/fsx (see docs/SEMANTICS.md)
conformance SUITE:
    scripts/ensure-deps.sh --fuse
    scripts/conformance.sh "{{SUITE}}"

# Unmount leftover awcp mounts (fstype fuse.awcp, nothing else; machine-wide unless DIR)
clean-mounts *dir:
    scripts/ensure-deps.sh
    scripts/clean-mounts.sh "$@"

# Man page and shell completions, generated from the CLI definition, into target/dist/
dist-files:
    scripts/ensure-deps.sh
    cargo build --release
    mkdir -p target/dist/completions
    target/release/awcp-mount generate man > target/dist/awcp-mount.8
    target/release/awcp-mount generate bash > target/dist/completions/awcp-mount.bash
    target/release/awcp-mount generate zsh > target/dist/completions/_awcp-mount
    target/release/awcp-mount generate fish > target/dist/completions/awcp-mount.fish
