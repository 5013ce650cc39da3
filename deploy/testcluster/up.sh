#!/usr/bin/env bash
# Starts (or finds running) the test cluster: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and a kwok controller simulating
# $KWOK_NODES nodes, all on 127.0.0.1, with certificates made here by
# openssl. Idempotent: a second call while it runs returns at once. Prints
# the kubeconfig path as its last line:
#
#   export KUBECONFIG=$(deploy/testcluster/up.sh | tail -1)
#
# Binaries come from build.sh (cached by version). State (certs, etcd data,
# logs, pids) lives in $KUBE_STATE (default $KUBE_CACHE/cluster).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=cluster.sh
source "$here/cluster.sh"
KWOK_NODES=${KWOK_NODES:-4}
# Ports (loopback only); override when they clash with something else.
API_PORT=${KUBE_API_PORT:-16443}
ETCD_PORT=${KUBE_ETCD_PORT:-16379}
ETCD_PEER_PORT=$((ETCD_PORT + 1))
KCM_PORT=$((API_PORT + 14))
SCHED_PORT=$((API_PORT + 16))
KWOK_PORT=$((API_PORT + 37))
DEADLINE=${KUBE_UP_TIMEOUT:-120}

say() { printf '[kube-up] %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

"$here/build.sh" etcd kwok kube >&2

mkdir -p "$STATE"/{pki,logs,pids,etcd}
chmod 700 "$STATE"
PKI=$STATE/pki
KCFG=$STATE/admin.kubeconfig
kubectl() { "$BIN/kubectl-$KUBE_VERSION" --kubeconfig "$KCFG" "$@"; }

readyz() {
    curl -fsS --max-time 2 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
        "https://127.0.0.1:$API_PORT/readyz" >/dev/null 2>&1
}

# -- certificates (once) -----------------------------------------------------
certs() {
    [[ -f "$PKI/admin.crt" ]] && return
    say "generating certificates in $PKI"
    cd "$PKI"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout ca.key -out ca.crt \
        -subj "/CN=sandboxd-test-ca" 2>/dev/null
    issue() { # name subject [extensions]
        openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
        printf '%s\n' "${3:-extendedKeyUsage=clientAuth}" > "$1.ext"
        openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
            -out "$1.crt" -extfile "$1.ext" 2>/dev/null
        rm -f "$1.csr" "$1.ext"
    }
    issue apiserver "/CN=kube-apiserver" \
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth"
    issue admin "/O=system:masters/CN=admin"
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    cd - >/dev/null
}

kubeconfig() {
    [[ -f "$KCFG" ]] && grep -q "127.0.0.1:$API_PORT" "$KCFG" && return
    local tmp=$KCFG.tmp
    rm -f "$tmp"
    local k=("$BIN/kubectl-$KUBE_VERSION" --kubeconfig "$tmp")
    "${k[@]}" config set-cluster sandboxd-test --server "https://127.0.0.1:$API_PORT" \
        --certificate-authority "$PKI/ca.crt" --embed-certs >/dev/null
    "${k[@]}" config set-credentials admin --client-certificate "$PKI/admin.crt" \
        --client-key "$PKI/admin.key" --embed-certs >/dev/null
    "${k[@]}" config set-context sandboxd-test --cluster sandboxd-test --user admin >/dev/null
    "${k[@]}" config use-context sandboxd-test >/dev/null
    chmod 600 "$tmp"
    mv "$tmp" "$KCFG"
}

start() { # name args...
    local name=$1; shift
    if alive "$name"; then return; fi
    say "starting $name"
    setsid nohup "$@" >>"$STATE/logs/$name.log" 2>&1 < /dev/null &
    echo $! > "$STATE/pids/$name"
}

wait_for() { # description command...
    local what=$1; shift
    local end=$((SECONDS + DEADLINE))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < end)) || die "timed out after ${DEADLINE}s waiting for $what (logs: $STATE/logs)"
        sleep 0.5
    done
}

certs
kubeconfig

start etcd "$BIN/etcd-$ETCD_VERSION" --name sandboxd-test --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "sandboxd-test=http://127.0.0.1:$ETCD_PEER_PORT" \
    --listen-metrics-urls "" --unsafe-no-fsync --quota-backend-bytes $((4 << 30)) \
    --log-level warn
wait_for etcd curl -fsS --max-time 2 "http://127.0.0.1:$ETCD_PORT/health"

start kube-apiserver "$BIN/kube-apiserver-$KUBE_VERSION" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
    --cert-dir "$STATE/pki/serving" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range 10.96.0.0/16 \
    --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction \
    --kubelet-client-certificate "$PKI/admin.crt" --kubelet-client-key "$PKI/admin.key" \
    --kubelet-preferred-address-types InternalIP \
    --max-requests-inflight 800 --max-mutating-requests-inflight 400 \
    --profiling=false --v=1
wait_for kube-apiserver readyz

start kube-controller-manager "$BIN/kube-controller-manager-$KUBE_VERSION" \
    --kubeconfig "$KCFG" --authentication-kubeconfig "$KCFG" --authorization-kubeconfig "$KCFG" \
    --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
    --root-ca-file "$PKI/ca.crt" --service-account-private-key-file "$PKI/sa.key" \
    --use-service-account-credentials=false \
    --kube-api-qps 200 --kube-api-burst 400 --profiling=false --v=1

start kube-scheduler "$BIN/kube-scheduler-$KUBE_VERSION" \
    --kubeconfig "$KCFG" --authentication-kubeconfig "$KCFG" --authorization-kubeconfig "$KCFG" \
    --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false \
    --kube-api-qps 500 --kube-api-burst 1000 --profiling=false --v=1

# kwok also plays the nodes' kubelet API (exec, logs) on $KWOK_PORT. With
# KWOK_LOCAL_EXEC=1 (the default), exec into Pods of the namespace
# sandboxd-local-exec runs the command as a local process on this
# host (no container!): it proves the API server's exec stream end to end,
# not container isolation. On by default (test cluster only; one namespace).
kwok_config=$STATE/kwok.yaml
if [[ ${KWOK_LOCAL_EXEC:-1} == 1 ]]; then
    cat > "$kwok_config" <<YAML
apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterExec
metadata:
  name: local-exec
spec:
  selector:
    matchNamespaces: [${KWOK_LOCAL_EXEC_NAMESPACES:-sandboxd-local-exec}]
  execs:
  - local:
      workDir: /tmp
YAML
else
    : > "$kwok_config"
fi
start kwok "$BIN/kwok-$KWOK_VERSION" --kubeconfig "$KCFG" --config "$kwok_config" \
    --node-port "$KWOK_PORT" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --node-ip 127.0.0.1 --cidr 10.244.0.0/16 \
    --server-address "127.0.0.1:$KWOK_PORT" \
    --node-lease-duration-seconds 40 --v=INFO

# Simulated nodes: kwok keeps them Ready and runs their Pods' lifecycle.
have_nodes() { [[ $(kubectl get nodes -l type=kwok -o name 2>/dev/null | wc -l) -ge $KWOK_NODES ]]; }
if ! have_nodes; then
    say "creating $KWOK_NODES kwok nodes"
    for i in $(seq 0 $((KWOK_NODES - 1))); do
        cat <<YAML
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations:
    node.alpha.kubernetes.io/ttl: "0"
    kwok.x-k8s.io/node: fake
  labels:
    type: kwok
    kubernetes.io/hostname: kwok-node-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    node-role.kubernetes.io/agent: ""
status:
  allocatable: {cpu: "64", memory: 256Gi, pods: "1000", ephemeral-storage: 1Ti}
  capacity: {cpu: "64", memory: 256Gi, pods: "1000", ephemeral-storage: 1Ti}
  nodeInfo:
    architecture: amd64
    kubeletVersion: $KUBE_VERSION
    operatingSystem: linux
---
YAML
    done | kubectl apply -f - >&2
fi
nodes_ready() {
    [[ $(kubectl get nodes -l type=kwok \
        -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null |
        grep -c True) -ge $KWOK_NODES ]]
}
wait_for "kwok nodes Ready" nodes_ready
# The ServiceAccount admission plugin rejects Pods until the controller
# manager has made the namespace's default ServiceAccount.
wait_for "default ServiceAccount" kubectl get serviceaccount default -n default -o name
say "ready: $(kubectl version 2>/dev/null | tail -1), $KWOK_NODES kwok nodes"
echo "$KCFG"
