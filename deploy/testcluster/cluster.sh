# What the test cluster's scripts share; sourced, after setting $here to
# their directory, by up.sh, node-up.sh, netpol-up.sh and the down scripts.
# shellcheck shell=bash
# shellcheck source=versions.sh
source "$here/versions.sh"
# Certificates, etcd data, logs and pid files of the processes started here.
STATE=${KUBE_STATE:-$KUBE_CACHE/cluster}
BIN=$KUBE_CACHE/bin
NODE=${KUBE_REAL_NODE:-real-node-0}
# Whether the process the pid file $STATE/pids/$1 names still runs.
alive() { [[ -f "$STATE/pids/$1" ]] && kill -0 "$(cat "$STATE/pids/$1")" 2>/dev/null; }
