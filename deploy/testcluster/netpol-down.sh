#!/usr/bin/env bash
# Stops the real node's kube-router (netpol-up.sh's, by pid file) and removes
# what it programmed, which it leaves behind on exit: the jumps from INPUT,
# FORWARD and OUTPUT, its chains (KUBE-ROUTER-*, KUBE-POD-FW-*, KUBE-NWPLCY-*)
# and its ipsets (KUBE-SRC-*, KUBE-DST-*). Only those names are touched:
# kube-router's own --cleanup-config would also flush every IPVS service of
# the host. Called by down.sh; idempotent.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=cluster.sh
source "$here/cluster.sh"
say() { echo "[netpol-down] $*" >&2; }

pidfile=$STATE/pids/kube-router
if [[ -f $pidfile ]]; then
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
        say "stopped kube-router"
    fi
    rm -f "$pidfile"
fi
command -v iptables >/dev/null || exit 0
ipt() { iptables -w 5 "$@"; }
for chain in INPUT FORWARD OUTPUT; do
    # Highest position first, so the others keep theirs.
    ipt -L "$chain" -n --line-numbers 2>/dev/null | awk -v t="KUBE-ROUTER-$chain" '$2 == t {print $1}' |
        sort -rn | while read -r n; do ipt -D "$chain" "$n"; done
done
chains=$(iptables-save -t filter 2>/dev/null | awk '/^:(KUBE-ROUTER-|KUBE-POD-FW-|KUBE-NWPLCY-)/ {print substr($1, 2)}')
# Flushed first: they jump to one another.
for c in $chains; do ipt -F "$c"; done
for c in $chains; do ipt -X "$c"; done
if command -v ipset >/dev/null; then
    for s in $(ipset list -n 2>/dev/null | grep -E '^(inet6:)?KUBE-(SRC|DST)-' || true); do
        ipset destroy "$s"
    done
fi
if [[ -n $chains ]]; then say "removed kube-router's chains and ipsets"; fi
