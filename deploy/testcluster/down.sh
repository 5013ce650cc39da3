#!/usr/bin/env bash
# Stops the test cluster's processes (only those up.sh and node-up.sh started,
# by pid file): the real node first (its containers, kube-router and its
# rules, kubelet, containerd), then kwok and the control plane. --purge also
# deletes its state (etcd data, certificates, kubeconfig, images of the
# node's containerd).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=cluster.sh
source "$here/cluster.sh"
SOCK=$STATE/containerd/containerd.sock
say() { echo "[kube-down] $*" >&2; }

stop() {
    local f=$STATE/pids/$1 pid
    [[ -f $f ]] || return 0
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$f"
    say "stopped $1"
}

if [[ -f $STATE/pids/kubelet ]] && kill -0 "$(cat "$STATE/pids/kubelet")" 2>/dev/null; then
    # Let the kubelet tear its Pods down (CNI teardown included) while it runs.
    k=("$KUBE_CACHE/bin/kubectl-$KUBE_VERSION" --kubeconfig "$STATE/admin.kubeconfig")
    "${k[@]}" delete pods -A --field-selector "spec.nodeName=${KUBE_REAL_NODE:-real-node-0}" \
        --wait=false >/dev/null 2>&1 || true
    for _ in $(seq 100); do
        [[ -z $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null) ]] && break
        sleep 0.2
    done
fi
"$here/netpol-down.sh"
stop kubelet
if [[ -S $SOCK ]] && [[ -f $STATE/pids/containerd ]]; then
    # The node's containers (and their shims) outlive containerd: remove them.
    for task in $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
        ctr --address "$SOCK" -n k8s.io tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
    done
    for _ in $(seq 50); do
        [[ -z $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null) ]] && break
        sleep 0.1
    done
    for task in $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
        ctr --address "$SOCK" -n k8s.io tasks delete -f "$task" >/dev/null 2>&1 || true
    done
    for c in $(ctr --address "$SOCK" -n k8s.io containers ls -q 2>/dev/null); do
        ctr --address "$SOCK" -n k8s.io containers rm "$c" >/dev/null 2>&1 || true
    done
fi
for name in containerd kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
    stop "$name"
done
# Volumes the kubelet mounted (tmpfs emptyDirs, projected volumes).
awk -v s="$STATE/" 'index($2, s) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
done
if [[ ${1:-} == --purge ]]; then
    rm -rf "$STATE"
    say "removed $STATE"
fi
