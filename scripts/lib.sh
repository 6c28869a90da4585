# shellcheck shell=bash
# Helpers shared by the scripts in this directory. Source it; do not run it.

# Short section header, so a newcomer can follow what a script is doing.
header() { printf '\n==> %s\n' "$*"; }

# Print a command (quoted only where the shell needs it), then run it.
run() {
    show "$@"
    "$@"
}

# Like run, but give up after SECONDS (exit status 124), so that a hung
# command cannot hang the script.
run_limited() {
    local secs=$1
    shift
    show "$@"
    timeout --foreground "$secs" "$@"
}

show() {
    local arg
    printf '$'
    for arg in "$@"; do
        if [[ $arg =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
            printf ' %s' "$arg"
        else
            printf " %q" "$arg"
        fi
    done
    printf '\n'
}

warn() { printf 'warning: %s\n' "$*" >&2; }
die() {
    printf 'error: %s\n' "$*" >&2
    exit 1
}

# /proc/self/mountinfo escapes space, tab, newline and backslash in paths as
# \040, \011, \012 and \134; undo that.
unescape_mountinfo() {
    # The kernel escapes exactly these four, as backslash and three octal digits; the
    # backslash goes last, so that an escaped backslash followed by digits stays itself.
    # (Not printf %b: it reads "\0401", a space followed by 1, as one octal escape.)
    local s=$1
    s=${s//\\040/ }
    s=${s//\\011/$'\t'}
    s=${s//\\012/$'\n'}
    s=${s//\\134/\\}
    printf '%s' "$s"
}

# Print the mount point of every mount, one a line, unescaped; with an
# argument, only mounts whose filesystem type equals it (e.g. fuse.awcp).
# Mount points containing a newline are skipped: they cannot be printed
# one a line unambiguously, and nothing these scripts create has one.
list_mounts() {
    local want=${1-} line mp fstype
    while IFS= read -r line; do
        # Fields: id parent maj:min root mountpoint options [optional...] - fstype source super
        mp=${line#* * * * }
        mp=${mp%% *}
        fstype=${line#* - }
        fstype=${fstype%% *}
        [[ -z $want || $fstype == "$want" ]] || continue
        [[ $mp == *'\012'* ]] && continue
        unescape_mountinfo "$mp"
        printf '\n'
    done </proc/self/mountinfo
}

# True if PATH itself is a mount point.
is_mounted() {
    # mountinfo holds canonical paths: compare with this one's (a TMPDIR with a trailing
    # slash or a symlink in it would otherwise never match, and a live mount look gone).
    local path mp
    path=$(realpath -m -- "$1")
    while IFS= read -r mp; do
        [[ $mp == "$path" ]] && return 0
    done < <(list_mounts "")
    return 1
}

# True if PATH or anything below it is a mount point. Check this before any
# recursive delete: `rm -rf` through a live mount would delete remote files.
has_mount_at_or_below() {
    local path mp
    path=$(realpath -m -- "$1")
    path=${path%/}
    while IFS= read -r mp; do
        [[ $mp == "$path" || $mp == "$path"/* ]] && return 0
    done < <(list_mounts "")
    return 1
}

# A free TCP port on 127.0.0.1. The kernel picks it, but another program may
# take it before we bind it: callers retry.
free_port() {
    local p i
    if p=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null) &&
        [[ $p =~ ^[0-9]+$ ]]; then
        echo "$p"
        return
    fi
    # No python3: probe random high ports until one refuses a connection.
    for ((i = 0; i < 100; i++)); do
        p=$((20000 + RANDOM % 40000))
        if ! (: <"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    die "could not find a free TCP port on 127.0.0.1"
}

# Succeeds once something accepts connections on 127.0.0.1:$1.
port_open() { (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# End a process this script started, by its PID: SIGTERM, SIGKILL after 5 s.
stop_pid() {
    local pid=$1 i
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
    kill "$pid" 2>/dev/null
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null || true
}

# Start a private OpenSSH sshd on a free port of 127.0.0.1 that lets the current
# user in with a throwaway key and serves SFTP (internal-sftp). Nothing outside
# DIR (an existing directory of the caller's, mode 0700) is touched:
#   DIR/host_ed25519{,.pub}  the host key     DIR/id_ed25519{,.pub}  the user key
#   DIR/known_hosts          "[127.0.0.1]:PORT KEY", for UserKnownHostsFile=
#   DIR/sshd_config, DIR/sshd.log, DIR/sshd.pid
# Extra sshd_config lines may follow DIR. Sets sshd_pid and sshd_port; the
# caller's EXIT trap must `stop_pid "$sshd_pid"`.
start_private_sshd() {
    local dir=$1 attempt i
    shift
    ssh-keygen -q -t ed25519 -N '' -C awcp-test-host -f "$dir/host_ed25519"
    ssh-keygen -q -t ed25519 -N '' -C awcp-test-user -f "$dir/id_ed25519"
    cp "$dir/id_ed25519.pub" "$dir/authorized_keys"
    sshd_pid=""
    # It might lose a race for the port with some other program: try a few.
    for attempt in 1 2 3; do
        sshd_port=$(free_port)
        {
            cat <<SSHD
Port $sshd_port
ListenAddress 127.0.0.1
HostKey $dir/host_ed25519
PidFile $dir/sshd.pid
AuthorizedKeysFile $dir/authorized_keys
AllowUsers $(id -un)
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
X11Forwarding no
AllowTcpForwarding no
Subsystem sftp internal-sftp
LogLevel ERROR
SSHD
            [[ $(id -u) -eq 0 ]] && echo "PermitRootLogin yes"
            printf '%s\n' "$@"
        } >"$dir/sshd_config"
        header "Starting a private sshd on 127.0.0.1:$sshd_port"
        /usr/sbin/sshd -D -e -f "$dir/sshd_config" >"$dir/sshd.log" 2>&1 &
        sshd_pid=$!
        for ((i = 0; i < 100; i++)); do
            port_open "$sshd_port" && break
            kill -0 "$sshd_pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$sshd_pid" 2>/dev/null && port_open "$sshd_port"; then
            echo "    sshd is running as PID $sshd_pid"
            break
        fi
        warn "sshd did not come up on port $sshd_port (attempt $attempt of 3); its log:"
        sed 's/^/    /' "$dir/sshd.log" >&2
        stop_pid "$sshd_pid"
        sshd_pid=""
    done
    [[ -n $sshd_pid ]] || die "could not start sshd"
    # For a port other than 22 a known_hosts line reads "[host]:port keytype key".
    printf '[127.0.0.1]:%s %s\n' "$sshd_port" "$(cut -d' ' -f1,2 "$dir/host_ed25519.pub")" >"$dir/known_hosts"
}

# Remove a script's own temporary directory, unless something is mounted at or
# below it: a recursive delete would go through the mount and delete the other
# side's files. Returns 1, with a warning, when it had to leave the directory.
remove_unless_mounted() {
    local dir=$1
    [[ -n $dir && -d $dir ]] || return 0
    if has_mount_at_or_below "$dir"; then
        warn "something is still mounted under $dir; leaving it (unmount it, then rm -rf $dir)"
        return 1
    fi
    rm -rf -- "$dir"
}
