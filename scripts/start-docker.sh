#!/usr/bin/env bash
# Make sure a docker daemon is reachable, starting one if needed. Idempotent.
#
# Rollout hosts are often containers or VMs without systemd, so dockerd is
# started by hand. --bridge=none and no iptables because such hosts usually
# cannot create bridges or touch netfilter, and sandboxes run with
# `--network none` anyway.
set -euo pipefail

# dockerd and friends live in sbin, which non-login root shells may lack.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

LOG=/var/log/sandboxd-dockerd.log
PIDFILE=/var/run/docker.pid
CONTAINERD_PIDFILE=/var/run/docker/containerd/containerd.pid
DEADLINE_S=60
# gVisor's runtime, when installed (scripts/setup.sh test builds it), is
# registered with dockerd as "runsc", the name sandboxd's settings default to.
RUNSC=/usr/local/bin/runsc
CRUN=/usr/bin/crun
DAEMON_JSON=/etc/docker/daemon.json

say() { printf '[start-docker] %s\n' "$*"; }
docker_ok() { command -v docker >/dev/null && timeout 10 docker info >/dev/null 2>&1; }
# kill -0 alone is not enough: it also succeeds on an unreaped zombie.
alive() {
    local state
    state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
    [[ -n $state && $state != Z ]]
}
# The pidfile may be stale and its pid reused by an unrelated process.
pidfile_dockerd() {
    local pid
    pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
    [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == dockerd ]] && alive "$pid" && echo "$pid"
}

# Writes the extra runtimes into daemon.json (merged with what is there; the
# flags dockerd is started with below do not overlap it).
#  - runsc (gVisor): systrap works without /dev/kvm; --network=none matches the
#    sandboxes' own; --oci-seccomp makes runsc apply Docker's seccomp profile,
#    which it ignores otherwise.
#  - crun: Debian's OCI runtime in C, offered beside runc.
#  - experimental: dockerd 20.10 serves `docker checkpoint` (gVisor live
#    snapshots) only in experimental mode. Unlike runtimes it is not reloaded
#    on SIGHUP: a daemon started without it keeps running without it.
write_runtime_config() {
    python3 - "$RUNSC" "$CRUN" "$DAEMON_JSON" <<'PY'
import json, os, sys
runsc, crun, path = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    with open(path) as fh:
        cfg = json.load(fh)
except FileNotFoundError:
    cfg = {}
before = json.dumps(cfg, sort_keys=True)
runtimes = cfg.setdefault("runtimes", {})
if os.access(runsc, os.X_OK):
    runtimes["runsc"] = {"path": runsc, "runtimeArgs": ["--platform=systrap", "--network=none", "--oci-seccomp"]}
if os.access(crun, os.X_OK):
    runtimes["crun"] = {"path": crun}
cfg["experimental"] = True
if json.dumps(cfg, sort_keys=True) != before:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as fh:
        json.dump(cfg, fh, indent=2)
    os.replace(path + ".tmp", path)
PY
}
runtimes_registered() {
    local have
    have=$(timeout 10 docker info --format '{{json .Runtimes}}' 2>/dev/null) || return 1
    [[ ! -x $RUNSC || $have == *'"runsc"'* ]] && [[ ! -x $CRUN || $have == *'"crun"'* ]]
}
# On a running daemon: dockerd reloads its runtimes on SIGHUP, without
# restarting (containers and other users' work are untouched).
register_runtimes() {
    [[ $EUID -eq 0 ]] || return 0
    [[ -x $RUNSC || -x $CRUN ]] || return 0
    write_runtime_config
    runtimes_registered && return 0
    local pid
    pid=$(pidfile_dockerd) || { say "dockerd's pid is unknown; runtimes are registered at its next start"; return 0; }
    say "registering runtimes with dockerd (SIGHUP)"
    kill -HUP "$pid"
    for _ in $(seq 20); do
        runtimes_registered && return 0
        sleep 0.5
    done
    say "dockerd did not pick up the runtimes; see $LOG"
}

if docker_ok; then
    register_runtimes
    exit 0
fi

if [[ $EUID -ne 0 ]]; then
    echo "[start-docker] docker is not reachable and starting it needs root" >&2
    exit 1
fi

# Serialise concurrent callers so that only one of them launches dockerd.
exec 9>/var/run/sandboxd-start-docker.lock
flock 9
if docker_ok; then
    register_runtimes
    exit 0
fi

if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
    say "installing docker.io"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io
    # On hosts with systemd the package starts the daemon itself.
    if docker_ok; then
        exit 0
    fi
fi

start_dockerd() {
    # A daemon that died uncleanly leaves pidfiles behind: dockerd refuses to
    # start over its own, and waits for a containerd that is not there if
    # containerd's names a dead (or zombie) pid.
    rm -f "$PIDFILE"
    if ctr_pid=$(cat "$CONTAINERD_PIDFILE" 2>/dev/null) && ! alive "$ctr_pid"; then
        rm -f "$CONTAINERD_PIDFILE"
    fi
    [[ $EUID -eq 0 ]] && write_runtime_config
    say "starting dockerd (log: $LOG)"
    # setsid + nohup + closed stdio so dockerd outlives this script and does
    # not hold open a pipe of whoever called us (e.g. `$(start-docker.sh)`);
    # closing fd 9 keeps it from holding the lock forever.
    setsid nohup dockerd --bridge=none --iptables=false --ip6tables=false \
        >>"$LOG" 2>&1 </dev/null 9>&- &
    running_pid=$!
    started=1
}

started=0
if running_pid=$(pidfile_dockerd); then
    # Another invocation (or a slow start, or a daemon still shutting down)
    # already runs one: wait for it, and start afresh if it goes away.
    say "dockerd already running (pid $running_pid), waiting for it"
else
    start_dockerd
fi

deadline=$((SECONDS + DEADLINE_S))
until docker_ok; do
    if ! alive "$running_pid" && ((started == 0)); then
        say "the dockerd we waited for exited; starting a new one"
        start_dockerd
        continue
    fi
    if ! alive "$running_pid"; then
        echo "[start-docker] dockerd exited; last lines of $LOG:" >&2
        tail -n 30 "$LOG" >&2 || true
        exit 1
    fi
    if ((SECONDS >= deadline)); then
        echo "[start-docker] docker not ready after ${DEADLINE_S}s; last lines of $LOG:" >&2
        tail -n 30 "$LOG" >&2 || true
        exit 1
    fi
    sleep 0.5
done
say "docker is ready"
