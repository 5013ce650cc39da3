#!/usr/bin/env bash
# Stops the test cluster's processes (only those up.sh started, by pid file).
# --purge also deletes its state (etcd data, certificates, kubeconfig).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.sh
source "$here/versions.sh"
STATE=${KUBE_STATE:-$KUBE_CACHE/cluster}
for name in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
    f=$STATE/pids/$name
    [[ -f $f ]] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$f"
    echo "[kube-down] stopped $name" >&2
done
if [[ ${1:-} == --purge ]]; then
    rm -rf "$STATE"
    echo "[kube-down] removed $STATE" >&2
fi
