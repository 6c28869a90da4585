#!/usr/bin/env bash
# `just bench`: awcp-mount against sshfs, same export, same private loopback sshd.
#
# What it does (docs/PERFORMANCE.md has the why and the latest numbers):
#   1. builds target/release/awcp-mount and the latency relay
#      (cargo build --release --example latency_relay, source bench/latency_relay.rs);
#   2. creates a throwaway directory with host/user keys, an sshd config, a policy whose
#      mount_root is that directory, and one export: a random file "big" and two data sets,
#      full/ (a copy of /usr/lib/python3.11: ~1,400 files, ~29 MB) and small/ (every 9th
#      file of it, ~155 files), each with "tree", the same tree as a git repository "repo",
#      and a tarball of the tree for the untar workload;
#   3. starts its own sshd on a free port of 127.0.0.1;
#   4. for each RTT (0 = straight to sshd; otherwise through the relay, which delays every
#      chunk by RTT/2 each way without limiting throughput), for each workload, for each
#      repetition, runs the workload once on awcp-mount and once on sshfs (the order flips
#      every repetition), each time on a fresh mount with the page cache dropped. RTT 0
#      uses the full set, BENCH_REPS times, and 2,000 random reads; with latency the tree
#      workloads are round-trip bound (time = round trips x RTT, little noise), so by default
#      they use the small set, BENCH_LATENCY_REPS (1) times, and 200 random reads: that keeps
#      the default run under 30 minutes on 2 cores; random writes are 5,000 at every RTT;
#   5. records wall time, the CPU time (utime+stime) and peak RSS (VmHWM) of the mount
#      process (sshfs: sshfs plus its ssh child), and prints a table of medians with the
#      ratio sshfs / awcp-mount; writes it with the machine and versions to
#      bench/results/latest.md (raw runs: bench/results/latest.csv).
# An EXIT trap unmounts whatever it mounted, stops sshd and the relay (by PID) and removes
# the directory (never through a live mount). Timings are reported, never asserted.
#
# Environment:
#   BENCH_REPS=3           repetitions per workload and program at RTT 0
#   BENCH_LATENCY_REPS=1   the same with latency (RTT > 0)
#   BENCH_RTTS="0 20 50"   round-trip times to inject, in ms (0: no relay); quick: "0 20"
#   BENCH_LATENCY_SET=small  data set used with latency: small or full (full: hours)
#   BENCH_WORKLOADS=...    subset, space-separated (default: all; see WORKLOADS below)
#   BENCH_PROGRAMS="awcp sshfs"
#   BENCH_QUICK=1          smoke run: 32 MiB big file, the small set everywhere, RTTs "0 20"
#   BENCH_BIG_MIB=256      size of the big file (MiB)
#   BENCH_SRC=/usr/lib/python3.11   source tree to copy (config-* directories are skipped)
#   BENCH_TIMEOUT=300      seconds one workload run may take before it is killed
#   BENCH_RESULTS=bench/results/latest.md
#   AWCP_MOUNT_BIN         use this binary instead of building target/release/awcp-mount
#   TMPDIR                 where the throwaway directory goes (needs ~1 GB free)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
self="$repo/scripts/bench.sh"

# ---------------------------------------------------------------------------------------
# Workloads. `bench.sh __workload NAME MNT` runs one (the timed part only); it is started
# under `timeout` as a child, with the BENCH_* paths below in the environment.
WORKLOADS="seq_read seq_write untar stat_tree ls_lR grep git_status_cold git_status_warm rm_rf cp_out cp_in cp_big_in rand_read rand_write par_read"

run_workload() {
    local wl=$1 m=$2 i pids=() rc=0
    case $wl in
    seq_read) dd if="$m/big" of=/dev/null bs=1M status=none ;;
    seq_write) dd if="$BENCH_EXPORT/big" of="$m/out" bs=1M conv=fsync status=none ;;
    untar) tar --no-same-owner -xf "$BENCH_TMP/$BENCH_SET.tar" -C "$m/untar" ;;
    stat_tree) find "$m/$BENCH_SET/tree" -type f -print0 | xargs -0 stat >/dev/null ;;
    ls_lR) ls -lR "$m/$BENCH_SET/tree" >/dev/null ;;
    grep)
        # Exit status 1 (nothing found) is the expected outcome.
        grep -r -- "$BENCH_MISSING_WORD" "$m/$BENCH_SET/tree" || [[ $? -eq 1 ]]
        ;;
    git_status_cold | git_status_warm)
        git -c safe.directory='*' -C "$m/$BENCH_SET/repo" status --porcelain
        ;;
    rm_rf) rm -rf -- "$m/rmtree" ;;
    cp_out) cp -r -- "$m/$BENCH_SET/tree" "$BENCH_TMP/cpout" ;;
    # Copies inside the mount: the tree, and the big file (with fsync, as seq_write).
    cp_in) cp -r -- "$m/$BENCH_SET/tree" "$m/cpin" ;;
    cp_big_in) cp -- "$m/big" "$m/big.copy" && sync -- "$m/big.copy" ;;
    rand_read)
        /usr/bin/python3 - "$m/big" "$BENCH_RAND_READS" <<'EOF'
import os, random, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
size = os.fstat(fd).st_size
rng = random.Random(4242)
for _ in range(int(sys.argv[2])):
    off = rng.randrange(0, size // 4096) * 4096
    if len(os.pread(fd, 4096, off)) != 4096:
        sys.exit("short read")
os.close(fd)
EOF
        ;;
    rand_write)
        # A database's page writes: 4 KiB at random pages of a 64 MiB file, no two
        # continuing each other (nothing merges), then close (which waits for them all).
        /usr/bin/python3 - "$m/pages" "$BENCH_RAND_WRITES" <<'EOF'
import os, random, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
pages = os.fstat(fd).st_size // 4096
rng = random.Random(4242)
page = os.urandom(4096)
for _ in range(int(sys.argv[2])):
    if os.pwrite(fd, page, rng.randrange(0, pages) * 4096) != 4096:
        sys.exit("short write")
os.close(fd)
EOF
        ;;
    par_read)
        # 8 readers at once, each on its own 1/8 slice of the big file.
        local slice=$((BENCH_BIG_MIB / 8))
        for ((i = 0; i < 8; i++)); do
            dd if="$m/big" of=/dev/null bs=1M skip=$((i * slice)) count=$slice status=none &
            pids+=($!)
        done
        for i in "${pids[@]}"; do wait "$i" || rc=1; done
        return $rc
        ;;
    *)
        echo "unknown workload $wl" >&2
        return 2
        ;;
    esac
}

if [[ ${1-} == __workload ]]; then
    run_workload "$2" "$3"
    exit
fi

# ---------------------------------------------------------------------------------------
# shellcheck source=scripts/lib.sh
. "$repo/scripts/lib.sh"

# The command as given, for the report (before anything below exports BENCH_* variables).
cmd=""
for v in BENCH_REPS BENCH_LATENCY_REPS BENCH_RTTS BENCH_LATENCY_SET BENCH_WORKLOADS BENCH_PROGRAMS \
    BENCH_QUICK BENCH_BIG_MIB BENCH_SRC BENCH_TIMEOUT BENCH_RESULTS AWCP_MOUNT_BIN; do
    [[ -n ${!v:-} ]] && cmd+="$v=$(printf '%q' "${!v}") "
done
cmd+="just bench"

quick=${BENCH_QUICK:-0}
[[ $quick == 1 ]] || quick=0
reps=${BENCH_REPS:-3}
lat_reps=${BENCH_LATENCY_REPS:-1}
rtts=${BENCH_RTTS:-$([[ $quick == 1 ]] && echo "0 20" || echo "0 20 50")}
lat_set=${BENCH_LATENCY_SET:-small}
big_mib=${BENCH_BIG_MIB:-$([[ $quick == 1 ]] && echo 32 || echo 256)}
src_dir=${BENCH_SRC:-/usr/lib/python3.11}
small_files=150 # the small set: about this many files, sampled evenly from the full list
run_timeout=${BENCH_TIMEOUT:-300}
results_md=${BENCH_RESULTS:-$repo/bench/results/latest.md}
results_csv=${results_md%.md}.csv
workloads=${BENCH_WORKLOADS:-$WORKLOADS}
programs=${BENCH_PROGRAMS:-awcp sshfs}
bin=${AWCP_MOUNT_BIN:-$repo/target/release/awcp-mount}
relay_bin=$repo/target/release/examples/latency_relay
user=$(id -un)
missing_word=zqxawcpbenchnotthere

[[ $reps =~ ^[1-9][0-9]*$ ]] || die "BENCH_REPS must be a positive integer (got '$reps')"
[[ $lat_reps =~ ^[1-9][0-9]*$ ]] || die "BENCH_LATENCY_REPS must be a positive integer (got '$lat_reps')"
[[ $lat_set == small || $lat_set == full ]] || die "BENCH_LATENCY_SET must be small or full"
((quick)) && lat_set=small
[[ $big_mib =~ ^[1-9][0-9]*$ && $((big_mib % 8)) -eq 0 ]] || die "BENCH_BIG_MIB must be a positive multiple of 8"
for r in $rtts; do [[ $r =~ ^[0-9]+$ ]] || die "BENCH_RTTS: '$r' is not a whole number of ms"; done
for w in $workloads; do [[ " $WORKLOADS " == *" $w "* ]] || die "unknown workload '$w' (known: $WORKLOADS)"; done
for p in $programs; do [[ $p == awcp || $p == sshfs ]] || die "BENCH_PROGRAMS: unknown program '$p'"; done
[[ -d $src_dir ]] || die "BENCH_SRC: $src_dir is not a directory"
[[ -x /usr/bin/python3 ]] || die "/usr/bin/python3 is needed (rand_read workload and the report)"

# State the cleanup trap looks at; each is set once the thing exists.
tmp=""
sshd_pid=""
relay_pid=""

# Unmount everything mounted at or below DIR (newest first), waiting for it to go.
unmount_below() {
    local dir=$1 mp i
    local -a mps=()
    while IFS= read -r mp; do
        [[ $mp == "$dir" || $mp == "$dir"/* ]] && mps=("$mp" "${mps[@]}")
    done < <(list_mounts "")
    for mp in "${mps[@]}"; do
        fusermount3 -u "$mp" 2>/dev/null || umount "$mp" 2>/dev/null ||
            fusermount3 -uz "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            is_mounted "$mp" || break
            sleep 0.1
        done
    done
}

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM HUP
    if [[ -n $tmp && -d $tmp/mnt ]]; then
        unmount_below "$tmp/mnt"
    fi
    stop_pid "$relay_pid"
    stop_pid "$sshd_pid"
    remove_unless_mounted "$tmp" || { ((rc == 0)) && rc=1; }
    ((rc == 0)) || printf '\nerror: the benchmark failed (exit status %d)\n' "$rc" >&2
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# Remove a directory of the bench's own, refusing if anything is mounted at or below it.
safe_rm() {
    local p
    for p in "$@"; do
        [[ -e $p ]] || continue
        [[ $p == "$tmp"/* ]] || die "refusing to remove $p: not under $tmp"
        has_mount_at_or_below "$p" && die "refusing to remove $p: something is mounted there"
        rm -rf -- "$p"
    done
}

can_drop_caches=1
drop_caches() {
    sync
    if ((can_drop_caches)); then
        echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || {
            warn "cannot write /proc/sys/vm/drop_caches (not root?): runs are not cold on the server side"
            can_drop_caches=0
        }
    fi
}

# CPU seconds (utime+stime) of the PIDs given, from /proc/PID/stat.
clk_tck=$(getconf CLK_TCK)
cpu_ticks() {
    local pid sum=0 line
    local -a f
    for pid in "$@"; do
        read -r line <"/proc/$pid/stat" 2>/dev/null || continue
        line=${line##*) } # comm may hold spaces; fields start after the last ')'
        read -ra f <<<"$line"
        sum=$((sum + f[11] + f[12]))
    done
    echo "$sum"
}
# Sum of VmHWM (KiB) of the PIDs given.
hwm_kib() {
    local pid sum=0 v
    for pid in "$@"; do
        v=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || continue
        sum=$((sum + ${v:-0}))
    done
    echo "$sum"
}
# PID of the process whose argv[0] ends in NAME and which has MNT as an argument.
find_mount_pid() {
    local name=$1 mnt=$2 d pid a
    local -a argv
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        [[ $pid == "$$" ]] && continue
        mapfile -d '' -t argv <"$d/cmdline" 2>/dev/null || continue
        ((${#argv[@]})) || continue
        [[ ${argv[0]##*/} == "$name" ]] || continue
        for a in "${argv[@]:1}"; do
            if [[ $a == "$mnt" ]]; then
                echo "$pid"
                return 0
            fi
        done
    done
    return 1
}
children_of() {
    local parent=$1 d line
    local -a f
    for d in /proc/[0-9]*; do
        read -r line <"$d/stat" 2>/dev/null || continue
        line=${line##*) }
        read -ra f <<<"$line"
        [[ ${f[1]} == "$parent" ]] && echo "${d#/proc/}"
    done
    return 0
}

# ---------------------------------------------------------------------------------------
"$repo/scripts/ensure-deps.sh" --fuse
command -v git >/dev/null || {
    [[ $(id -u) -eq 0 ]] || die "git is missing: apt-get install -y git"
    header "Installing git"
    DEBIAN_FRONTEND=noninteractive apt-get install -y git </dev/null
}

header "Building awcp-mount and the latency relay (release)"
if [[ -z ${AWCP_MOUNT_BIN:-} ]]; then
    (cd "$repo" && cargo build --release --bin awcp-mount --example latency_relay)
else
    (cd "$repo" && cargo build --release --example latency_relay)
fi
[[ -x $bin ]] || die "$bin is missing or not executable"
[[ -x $relay_bin ]] || die "$relay_bin is missing"
# What was built, recorded now: HEAD may move while the benchmark runs.
rev=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$repo" diff --quiet HEAD -- src Cargo.toml Cargo.lock 2>/dev/null || rev+=" with uncommitted changes"
[[ -n ${AWCP_MOUNT_BIN:-} ]] && rev="not built here ($AWCP_MOUNT_BIN)"

# (Canonical: mountinfo, which the cleanup compares it with, holds canonical paths.)
tmp=$(realpath -- "$(mktemp -d "${TMPDIR:-/tmp}/awcp-bench.XXXXXXXX")")
chmod 0700 "$tmp"
mkdir "$tmp/ssh" "$tmp/mnt" "$tmp/logs" "$tmp/bin"
# Run private copies, so a rebuild in the shared target directory during the run (other
# people compile here) cannot change the program halfway through.
cp "$bin" "$tmp/bin/awcp-mount"
cp "$relay_bin" "$tmp/bin/latency_relay"
bin=$tmp/bin/awcp-mount
relay_bin=$tmp/bin/latency_relay
export_dir=$tmp/export
mkdir "$export_dir"
key=$tmp/ssh/id_ed25519
known_hosts=$tmp/ssh/known_hosts
policy=$tmp/policy.toml
runs_csv=$tmp/runs.csv
echo "rtt_ms,workload,prog,rep,seconds,status,cpu_s,rss_kib,bytes,ops,scale" >"$runs_csv"

header "Keys, sshd config and policy in $tmp"
cat >"$policy" <<EOF
# Written by scripts/bench.sh: the default policy with the bench directory as mount root.
mount_root = "$tmp/mnt"
EOF
"$bin" check-policy "$policy" >/dev/null || die "awcp-mount rejects the bench policy $policy"

header "Preparing the export in $export_dir"
start_prep=$EPOCHREALTIME
echo "    big: $big_mib MiB of random data"
head -c "$((big_mib * 1024 * 1024))" /dev/urandom >"$export_dir/big"
# The source tree: regular files of $src_dir (symlinks resolved, dangling ones and the
# config-* directories, which hold a 25 MB static library, skipped). The small set takes
# every Nth file of that list, so it keeps the directory structure.
src_parent=$(dirname "$src_dir")
src_name=$(basename "$src_dir")
(cd "$src_parent" && find -L "$src_name" -name 'config-*' -prune -o -type f -print | LC_ALL=C sort) >"$tmp/full.list"
all_files=$(wc -l <"$tmp/full.list")
((all_files > 0)) || die "no files under $src_dir"
awk -v n=$(((all_files + small_files - 1) / small_files)) 'NR % n == 1' "$tmp/full.list" >"$tmp/small.list"
sets="small"
((quick)) || sets="full small"
declare -A set_files set_desc
for set in $sets; do
    tar -C "$src_parent" -chf "$tmp/$set.tar" -T "$tmp/$set.list"
    mkdir -p "$export_dir/$set/tree" "$export_dir/$set/repo"
    tar -xf "$tmp/$set.tar" -C "$export_dir/$set/tree"
    tar -xf "$tmp/$set.tar" -C "$export_dir/$set/repo"
    set_files[$set]=$(find "$export_dir/$set/tree" -type f | wc -l)
    set_desc[$set]="${set_files[$set]} files in $(find "$export_dir/$set/tree" -type d | wc -l) directories, $(du -sm "$export_dir/$set/tree" | cut -f1) MB"
    git_q() { git -c safe.directory='*' -c init.defaultBranch=main -c user.name=awcp-bench -c user.email=bench@localhost -C "$export_dir/$set/repo" "$@"; }
    git_q init -q
    git_q add -A
    git_q commit -q -m "benchmark tree"
    sleep 1.1 # past the racy-git window, so the refreshed index below is trusted
    git_q update-index -q --refresh
    git_q status --porcelain >/dev/null
    cp "$export_dir/$set/repo/.git/index" "$tmp/$set.git-index"
    set_desc[$set]+=" (repo: + $(find "$export_dir/$set/repo/.git" -type f | wc -l) files under .git)"
    echo "    $set set: ${set_desc[$set]}"
    grep -rq -- "$missing_word" "$export_dir/$set/tree" && die "the grep word $missing_word occurs in the tree"
done
awk -v a="$start_prep" -v b="$EPOCHREALTIME" 'BEGIN { printf "    prepared in %.0f s\n", b - a }'

# sshd on a free loopback port (keys and known_hosts in $tmp/ssh); many connections at once.
start_private_sshd "$tmp/ssh" "MaxStartups 100"
host_key=$(cut -d' ' -f1,2 "$tmp/ssh/host_ed25519.pub")

# Started relay for the current RTT (empty at RTT 0).
port=""
start_relay() {
    local rtt=$1 i
    rm -f "$tmp/relay.port"
    "$relay_bin" --upstream "127.0.0.1:$sshd_port" --rtt-ms "$rtt" --port-file "$tmp/relay.port" \
        >/dev/null 2>"$tmp/logs/relay-$rtt.log" &
    relay_pid=$!
    for ((i = 0; i < 100; i++)); do
        [[ -s $tmp/relay.port ]] && break
        kill -0 "$relay_pid" 2>/dev/null || break
        sleep 0.05
    done
    [[ -s $tmp/relay.port ]] || die "the latency relay did not start: $(cat "$tmp/logs/relay-$rtt.log")"
    port=$(<"$tmp/relay.port")
    printf '[127.0.0.1]:%s %s\n' "$port" "$host_key" >>"$known_hosts"
    echo "    latency relay (PID $relay_pid): 127.0.0.1:$port -> 127.0.0.1:$sshd_port, +$rtt ms round trip"
}

# --- mounting ----------------------------------------------------------------------------
# Same connection options for both: what AWCP executors pass to sshfs, plus our key and
# known_hosts. mnt_pids holds the PIDs whose CPU and RSS are charged to the mount.
common_opts="reconnect,ServerAliveInterval=15,follow_symlinks"
mnt_pids=()
do_mount() {
    local prog=$1 mnt=$2 pid i
    mnt_pids=()
    case $prog in
    awcp)
        timeout 120 "$bin" "$user@127.0.0.1:$export_dir" "$mnt" -p "$port" --policy "$policy" \
            -o "IdentityFile=$key,UserKnownHostsFile=$known_hosts,$common_opts" ||
            return 1
        pid=$(find_mount_pid awcp-mount "$mnt") || return 1
        mnt_pids=("$pid")
        ;;
    sshfs)
        timeout 120 sshfs "$user@127.0.0.1:$export_dir" "$mnt" -p "$port" -F /dev/null \
            -o "IdentityFile=$key,UserKnownHostsFile=$known_hosts,StrictHostKeyChecking=yes,BatchMode=yes,$common_opts" ||
            return 1
        pid=$(find_mount_pid sshfs "$mnt") || return 1
        mnt_pids=("$pid")
        for ((i = 0; i < 20; i++)); do
            mapfile -t kids < <(children_of "$pid")
            ((${#kids[@]})) && break
            sleep 0.05
        done
        mnt_pids+=("${kids[@]}")
        ;;
    esac
    is_mounted "$mnt"
}
do_unmount() {
    local prog=$1 mnt=$2 i pid
    if is_mounted "$mnt"; then
        if [[ $prog == awcp ]]; then
            timeout 60 "$bin" umount "$mnt" >/dev/null 2>&1 || fusermount3 -u "$mnt" 2>/dev/null || true
        else
            fusermount3 -u "$mnt" 2>/dev/null || true
        fi
        for ((i = 0; i < 100; i++)); do
            is_mounted "$mnt" || break
            sleep 0.1
        done
        if is_mounted "$mnt"; then
            warn "$mnt still mounted; lazy unmount"
            fusermount3 -uz "$mnt" 2>/dev/null || umount -l "$mnt"
        fi
    fi
    # Wait for the mount's processes to exit, so the next run has the CPU to itself.
    for pid in "${mnt_pids[@]}"; do
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            warn "mount process $pid still running 10 s after unmount; stopping it"
            stop_pid "$pid"
        fi
    done
    mnt_pids=()
}

# --- per-run state, set up on the server side while nothing is mounted -------------------
prepare() {
    local wl=$1
    case $wl in
    seq_write) rm -f -- "$export_dir/out" ;;
    untar)
        safe_rm "$export_dir/untar"
        mkdir "$export_dir/untar"
        ;;
    rm_rf)
        safe_rm "$export_dir/rmtree"
        mkdir "$export_dir/rmtree"
        tar -xf "$tmp/$BENCH_SET.tar" -C "$export_dir/rmtree"
        ;;
    git_status_*)
        # Every run starts from the index the "delegator" wrote, whose inode numbers are
        # the server's: git re-reads every file to check it, as an executor's first
        # `git status` on a delegated repository does.
        rm -f -- "$export_dir/$BENCH_SET/repo/.git/index.lock"
        cp "$tmp/$BENCH_SET.git-index" "$export_dir/$BENCH_SET/repo/.git/index"
        ;;
    cp_out) safe_rm "$tmp/cpout" ;;
    cp_in) safe_rm "$export_dir/cpin" ;;
    cp_big_in) rm -f -- "$export_dir/big.copy" ;;
    rand_write) head -c $((64 * 1024 * 1024)) "$export_dir/big" >"$export_dir/pages" ;;
    esac
}
# Local inputs, and the local programs a workload runs, read into the page cache after the
# drop: the drop is there for the server's files. Loading python3 and its modules from this
# machine's disk again takes 40-90 ms here (git takes less), the same for both programs and
# no part of the mount's work. (Libraries loaded with dlopen, the locale archive and config
# files are left cold: small, and the same for both.)
warm_local() {
    case $1 in
    seq_write)
        cat "$export_dir/big" >/dev/null
        warm_programs dd
        ;;
    untar)
        cat "$tmp/$BENCH_SET.tar" >/dev/null
        warm_programs tar
        ;;
    seq_read | par_read) warm_programs dd ;;
    stat_tree) warm_programs find xargs stat ;;
    ls_lR) warm_programs ls ;;
    grep) warm_programs grep ;;
    git_status_*) warm_programs git ;;
    rm_rf) warm_programs rm ;;
    cp_out | cp_in) warm_programs cp ;;
    cp_big_in) warm_programs cp sync ;;
    rand_read | rand_write)
        warm_programs /usr/bin/python3
        /usr/bin/python3 -c 'import os, random, sys'
        ;;
    esac
}
# Read each program (and `timeout`, which runs every workload) and the shared libraries it
# loads into the page cache.
warm_programs() {
    local p f
    for p in timeout "$@"; do
        f=$(command -v "$p") || continue
        f=$(readlink -f "$f")
        [[ -f $f ]] || continue # a shell builtin or function: nothing to read
        # shellcheck disable=SC2046 # one word per library path
        cat "$f" $(ldd "$f" 2>/dev/null | awk '$(NF-1) ~ /^\// { print $(NF-1) }') >/dev/null
    done
}
# "bytes,ops,scale" of a workload for the CSV: bytes moved (for MiB/s), operations (for
# ms per operation) and what it works on.
workload_size() {
    local files=${set_files[$BENCH_SET]}
    case $1 in
    seq_read | seq_write | par_read | cp_big_in) echo "$((big_mib * 1024 * 1024)),,$big_mib MiB" ;;
    rand_read) echo ",$BENCH_RAND_READS,$BENCH_RAND_READS x 4 KiB" ;;
    rand_write) echo ",$BENCH_RAND_WRITES,$BENCH_RAND_WRITES x 4 KiB" ;;
    *) echo ",,$files files" ;;
    esac
}

export BENCH_EXPORT=$export_dir BENCH_TMP=$tmp BENCH_BIG_MIB=$big_mib BENCH_MISSING_WORD=$missing_word
# 5,000 at every RTT: with latency they are bound by the writes in flight, not one by one.
export BENCH_RAND_WRITES=5000

# One timed run; sets m_secs, m_status (ok, fail, timeout), m_cpu (s) and m_hwm (KiB).
measure() {
    local rtt=$1 wl=$2 prog=$3 rep=$4 mnt=$tmp/mnt/$3 log out c0 c1 t0 t1 rc
    log=$tmp/logs/$rtt-$wl-$prog-$rep.log
    out=$tmp/logs/$rtt-$wl-$prog-$rep.out
    m_secs=0 m_status=fail m_cpu="" m_hwm=""
    prepare "$wl"
    mkdir -p "$mnt"
    if ! do_mount "$prog" "$mnt" 2>"$log"; then
        do_unmount "$prog" "$mnt"
        warn "mounting with $prog failed: $(tail -n 3 "$log")"
        return
    fi
    drop_caches
    warm_local "$wl"
    if [[ $wl == git_status_warm ]]; then
        timeout -k 10 "$run_timeout" "$self" __workload "$wl" "$mnt" >/dev/null 2>>"$log" || true
    fi
    c0=$(cpu_ticks "${mnt_pids[@]}")
    t0=$EPOCHREALTIME
    rc=0
    timeout -k 10 "$run_timeout" "$self" __workload "$wl" "$mnt" >"$out" 2>>"$log" || rc=$?
    t1=$EPOCHREALTIME
    c1=$(cpu_ticks "${mnt_pids[@]}")
    m_hwm=$(hwm_kib "${mnt_pids[@]}")
    do_unmount "$prog" "$mnt"
    case $rc in
    0) m_status=ok ;;
    124 | 137) m_status=timeout ;;
    *) m_status=fail ;;
    esac
    [[ $m_status == ok ]] ||
        warn "$wl on $prog (rtt $rtt ms, rep $rep) exited $rc: $(tail -n 3 "$log" | tr '\n' ' ')"
    if [[ $wl == git_status_* && -s $out ]]; then
        warn "git status on $prog reported changes in a clean repository: $(head -n 3 "$out" | tr '\n' ' ')"
    fi
    [[ $wl == cp_out ]] && safe_rm "$tmp/cpout"
    m_secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    m_cpu=$(awk -v a="$c0" -v b="$c1" -v t="$clk_tck" 'BEGIN { printf "%.2f", (b - a) / t }')
}

# Baseline: the big file over one plain SSH channel (OpenSSH client, same key and port),
# and `ssh host true` alone: the connection setup included in that time.
measure_ssh() {
    local remote_cmd=$1 t0 t1 rc=0
    drop_caches
    t0=$EPOCHREALTIME
    # shellcheck disable=SC2029 # $remote_cmd is meant to expand here
    timeout -k 10 "$run_timeout" ssh -F /dev/null -p "$port" -i "$key" -o IdentitiesOnly=yes \
        -o UserKnownHostsFile="$known_hosts" -o StrictHostKeyChecking=yes -o BatchMode=yes \
        "$user@127.0.0.1" "$remote_cmd" >/dev/null 2>"$tmp/logs/ssh.log" || rc=$?
    t1=$EPOCHREALTIME
    m_secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    case $rc in
    0) m_status=ok ;;
    124 | 137) m_status=timeout ;;
    *) m_status=fail ;;
    esac
}

drop_caches # once up front, so a missing permission is known (and reported) before the runs

# --- the runs ----------------------------------------------------------------------------
nprog=$(wc -w <<<"$programs")
nwl=$(wc -w <<<"$workloads")
total=0
for rtt in $rtts; do total=$((total + (nwl * nprog + 1) * (rtt == 0 ? reps : lat_reps))); done
n=0
bench_start=$EPOCHREALTIME
for rtt in $rtts; do
    relay_pid=""
    if ((rtt == 0)); then
        port=$sshd_port
        nreps=$reps
        BENCH_SET=full
        ((quick)) && BENCH_SET=small
        BENCH_RAND_READS=2000
    else
        nreps=$lat_reps
        BENCH_SET=$lat_set
        BENCH_RAND_READS=200
    fi
    export BENCH_SET BENCH_RAND_READS
    header "RTT $rtt ms: $BENCH_SET set, $nreps repetition(s)"
    ((rtt == 0)) || start_relay "$rtt"

    for ((rep = 1; rep <= nreps; rep++)); do
        n=$((n + 1))
        measure_ssh true
        echo "$rtt,ssh_true,ssh,$rep,$m_secs,$m_status,,,,," >>"$runs_csv"
        setup=$m_secs
        measure_ssh "cat $export_dir/big"
        echo "$rtt,ssh_cat,ssh,$rep,$m_secs,$m_status,,,$((big_mib * 1024 * 1024)),,$big_mib MiB" >>"$runs_csv"
        printf '  [%3d/%d] %-16s %-5s rep %d/%d: %8.2f s (ssh host true: %.2f s) %s\n' "$n" "$total" ssh_cat ssh \
            "$rep" "$nreps" "$m_secs" "$setup" "$([[ $m_status == ok ]] || echo "$m_status")"
    done

    for wl in $workloads; do
        for ((rep = 1; rep <= nreps; rep++)); do
            # Alternate which program goes first.
            order=$programs
            ((rep % 2 == 0)) && order=$(tr ' ' '\n' <<<"$programs" | tac | tr '\n' ' ')
            for prog in $order; do
                n=$((n + 1))
                measure "$rtt" "$wl" "$prog" "$rep"
                echo "$rtt,$wl,$prog,$rep,$m_secs,$m_status,$m_cpu,$m_hwm,$(workload_size "$wl")" >>"$runs_csv"
                printf '  [%3d/%d] %-16s %-5s rep %d/%d: %8.2f s  cpu %6s s  peak RSS %6s MiB %s\n' \
                    "$n" "$total" "$wl" "$prog" "$rep" "$nreps" "$m_secs" "${m_cpu:--}" \
                    "$(awk -v k="${m_hwm:-0}" 'BEGIN { printf "%.1f", k / 1024 }')" \
                    "$([[ $m_status == ok ]] || echo "$m_status")"
            done
        done
    done

    if [[ -n $relay_pid ]]; then
        stop_pid "$relay_pid"
        relay_pid=""
    fi
done
elapsed=$(awk -v a="$bench_start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')

# --- the report --------------------------------------------------------------------------

mem_gib=$(awk '/^MemTotal:/ { printf "%.1f", $2 / 1048576 }' /proc/meminfo)
cpu_model=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
{
    echo "# awcp-mount vs sshfs: benchmark results"
    echo
    echo "Generated by \`scripts/bench.sh\` on $(date -u +%Y-%m-%dT%H:%M:%SZ) in ${elapsed} s."
    echo "See docs/PERFORMANCE.md for what each workload does and how to read this."
    echo
    echo "- command: \`$cmd\` (just runs scripts/bench.sh)"
    echo "- machine: $(nproc) CPUs ($cpu_model), ${mem_gib} GiB RAM, kernel $(uname -r)"
    echo "- awcp-mount: $("$bin" --version 2>&1 | head -n1), release build of $rev (copied at the start of the run)"
    echo "- sshfs: $(sshfs --version 2>&1 | sed -n 's/^SSHFS version //p' | head -n1), $(sshfs --version 2>&1 | sed -n 's/^FUSE library version /libfuse /p' | head -n1); $(ssh -V 2>&1)"
    echo "- server: private OpenSSH sshd on 127.0.0.1, internal-sftp; both programs connect straight to it at RTT 0, through bench/latency_relay.rs otherwise"
    echo "- mount options (both): \`-o $common_opts\` + IdentityFile, UserKnownHostsFile, port; awcp-mount also \`--policy\` (default policy, mount_root = the bench directory)"
    echo "- data: big = $big_mib MiB random; trees from $src_dir:"
    for set in $sets; do echo "  - $set: ${set_desc[$set]}"; done
    echo "- RTT 0: $([[ $quick == 1 ]] && echo small || echo full) set, $reps repetition(s), 2000 random reads; RTT > 0: $lat_set set, $lat_reps repetition(s), 200 random reads"
    echo "- each repetition runs both programs, alternating which goes first; page cache dropped before every run: $([[ $can_drop_caches == 1 ]] && echo yes || echo NO)"
    echo
    /usr/bin/python3 "$repo/bench/report.py" "$runs_csv" "$rtts" "$workloads" "$run_timeout"
    echo "CPU and peak RSS are those of the mount process (awcp-mount; for sshfs, sshfs plus its ssh"
    echo "child) over the run; each run is a fresh mount, so the peak is per workload. sshd's own"
    echo "CPU is not counted for either. Ratios above 1 mean awcp-mount was faster."
} >"$tmp/report.md"

mkdir -p "$(dirname "$results_md")"
cp "$tmp/report.md" "$results_md"
cp "$runs_csv" "$results_csv"
header "Results (also in ${results_md#"$repo"/}, raw runs in ${results_csv#"$repo"/})"
cat "$results_md"
