#!/usr/bin/env bash
# Tier B's NetworkPolicy enforcement: kube-router's network-policy firewall
# alone (no routing, no service proxy) on the real node of node-up.sh, which
# calls this once the node is Ready. The bridge CNI enforces nothing itself;
# kube-router turns the NetworkPolicies that select this host's Pods into
# iptables chains and ipsets, so a packet a policy does not allow is rejected
# (TCP: connection refused) or dropped.
#
# Idempotent: a running kube-router is left as it is. Exits 0 once kube-router
# has programmed this host's filter table. Otherwise it says why and exits 1:
# the node stays up without enforcement and the tests that need it skip.
# netpol-down.sh (called by down.sh) stops it and removes its rules.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=cluster.sh
source "$here/cluster.sh"
# Loopback only. kube-router v2.1.0 binds its health port on every address,
# so that one is off (0); whether it works is read from the filter table.
METRICS_PORT=${KUBE_ROUTER_METRICS_PORT:-16482}
# up.sh's API server --service-cluster-ip-range: Pods may always reach Services.
SERVICE_RANGE=10.96.0.0/16
say() { printf '[netpol-up] %s\n' "$*" >&2; }
die() { say "NetworkPolicy not enforced on $NODE: $*"; exit 1; }
programmed() { iptables -w 5 -S INPUT 2>/dev/null | grep -q -- '-j KUBE-ROUTER-INPUT'; }

[[ -f $STATE/admin.kubeconfig ]] || die "no test cluster in $STATE (run up.sh and node-up.sh first)"
mkdir -p "$STATE/logs" "$STATE/pids"
if ! alive kube-router; then
    "$here/build.sh" kuberouter >&2 || die "kube-router $KUBE_ROUTER_VERSION did not build"
    missing=()
    command -v ipset >/dev/null || missing+=(ipset)
    command -v iptables-restore >/dev/null || missing+=(iptables)
    if ((${#missing[@]})); then
        say "installing ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2 ||
            die "could not install ${missing[*]}"
    fi
    why=$(iptables -w 5 -S INPUT 2>&1 >/dev/null) || die "iptables cannot read this host's filter table: $why"
    why=$(ipset list -n 2>&1 >/dev/null) || die "ipset cannot list this host's sets: $why"
    if [[ -n $(ss -Hltn "sport = :$METRICS_PORT") ]]; then
        die "port $METRICS_PORT is in use (set KUBE_ROUTER_METRICS_PORT to a free one)"
    fi
    # A kube-router that stopped left its rules: they would hold Pod addresses
    # the bridge hands out again to stale policies, and pass for this run's.
    "$here/netpol-down.sh"
    say "starting kube-router $KUBE_ROUTER_VERSION (firewall only)"
    setsid nohup "$BIN/kube-router-$KUBE_ROUTER_VERSION" --kubeconfig "$STATE/admin.kubeconfig" \
        --hostname-override "$NODE" --run-firewall=true --run-router=false --run-service-proxy=false \
        --service-cluster-ip-range "$SERVICE_RANGE" --health-port 0 \
        --metrics-addr 127.0.0.1 --metrics-port "$METRICS_PORT" --v=1 \
        >>"$STATE/logs/kube-router.log" 2>&1 </dev/null &
    echo $! >"$STATE/pids/kube-router"
fi
end=$((SECONDS + ${KUBE_UP_TIMEOUT:-120}))
until programmed; do
    alive kube-router || die "kube-router exited: $(tail -n 3 "$STATE/logs/kube-router.log" | tr '\n' ' ')"
    ((SECONDS < end)) || die "kube-router programmed no rules in time (log: $STATE/logs/kube-router.log)"
    sleep 0.5
done
say "kube-router enforcing NetworkPolicy on $NODE (metrics: 127.0.0.1:$METRICS_PORT)"
