#!/usr/bin/env bash
# Tier B: one real node for the test cluster (run after up.sh): its own
# containerd (Debian's, separate root and socket from Docker's), runc, the
# bridge CNI (no masquerade, pod traffic stays on the host), a kubelet built
# like the other components, the pause image compiled from source and the
# sandbox image imported from the rootfs cache, all without a registry, and
# kube-router's firewall enforcing NetworkPolicy (netpol-up.sh).
# The node is tainted sandboxd.io/real-node=true:NoSchedule so only Pods that
# tolerate it land there. Two RuntimeClasses besides the default runc:
# sandboxd (runc with a file-limited workspace) and gvisor (gVisor's runsc).
# Idempotent: on a running node, a changed containerd configuration restarts
# containerd alone (Pods keep running). Prints the node name.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=cluster.sh
source "$here/cluster.sh"
KUBELET_PORT=${KUBELET_PORT:-16250}
CTRD=$STATE/containerd
SOCK=$CTRD/containerd.sock
PAUSE=registry.k8s.io/pause:3.10
# The kubelet refuses a loopback node IP: use an address of this machine's own
# interface (the API server reaches the kubelet there; nothing leaves the host).
NODE_IP=${KUBE_NODE_IP:-$(ip -4 -o addr show scope global | awk '{split($4, a, "/"); print a[1]; exit}')}
say() { printf '[node-up] %s\n' "$*" >&2; }
start() {
    local name=$1; shift
    alive "$name" && return
    say "starting $name"
    setsid nohup "$@" >>"$STATE/logs/$name.log" 2>&1 < /dev/null &
    echo $! > "$STATE/pids/$name"
}
ctr_() { ctr --address "$SOCK" -n k8s.io "$@"; }

"$here/build.sh" kubelet >&2
command -v containerd >/dev/null && command -v runc >/dev/null && [[ -x /usr/lib/cni/bridge ]] || {
    say "installing containerd runc containernetworking-plugins"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q containerd runc containernetworking-plugins >&2
}
mkdir -p "$CTRD" "$STATE/cni/net.d" "$STATE/kubelet" "$STATE/logs" "$STATE/pids"

# The sandboxd runtime handler: runc behind deploy/node/sandboxd-runc, which
# gives workspaces a tmpfs with nr_inodes (the kernel caps files per sandbox).
# The same program also wraps runsc and gVisor's shim for the gvisor handler.
wrapper_src=$(cd "$here/../node/sandboxd-runc" && pwd)
wrapper_files=$(find "$wrapper_src" -maxdepth 1 \( -name go.mod -o -name '*.go' ! -name '*_test.go' \) | sort)
# shellcheck disable=SC2086 # one path a line, no spaces
wrapper=$BIN/sandboxd-runc-$(cat $wrapper_files | sha256sum | cut -c1-12)
if [[ ! -x $wrapper ]]; then
    say "building $(basename "$wrapper")"
    (cd "$wrapper_src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$wrapper.tmp" .)
    mv "$wrapper.tmp" "$wrapper"
fi

# The gvisor runtime handler: gVisor's containerd shim and runsc, built from
# the module version scripts/setup.sh builds Docker's runsc from (static,
# CGO_ENABLED=0, as there), cached by version. The shim runs runsc through
# the wrapper above under the name sandboxd-runsc (which turns the Pod's
# process limit into RLIMIT_NPROC inside gVisor), with runsc.toml's options:
# systrap (no KVM needed), no network stack (commands come by exec; the Pod
# network is unused), the Pod's seccomp profile applied inside as well.
gvisor=$BIN/gvisor-$GVISOR_VERSION
if [[ ! -x $gvisor/runsc || ! -x $gvisor/containerd-shim-runsc-v1 ]]; then
    say "building gVisor's runsc and containerd shim $GVISOR_VERSION"
    rm -rf "$gvisor.tmp"
    mkdir -p "$gvisor.tmp/src"
    export CGO_ENABLED=0 GOFLAGS=-mod=mod
    GOBIN=$gvisor.tmp go install -ldflags "-s -w" "gvisor.dev/gvisor/runsc@$GVISOR_VERSION" >&2
    # The shim sets its own oom_score_adj to -999 and fails every Pod when
    # that is refused, as nested hosts without CAP_SYS_RESOURCE do (the
    # reason for restrict_oom_score_adj below): built from a copy of the
    # module with that one constant at 0, containerd's own score.
    go mod download "gvisor.dev/gvisor@$GVISOR_VERSION"
    cp -r "$(go env GOMODCACHE)/gvisor.dev/gvisor@$GVISOR_VERSION" "$gvisor.tmp/src/gvisor"
    chmod -R u+w "$gvisor.tmp/src/gvisor"
    manager=$gvisor.tmp/src/gvisor/pkg/shim/v1/manager.go
    grep -qx $'\toomScoreMax = -999' "$manager" || {
        say "gVisor's shim no longer sets oomScoreMax = -999 in pkg/shim/v1/manager.go: review this build"
        exit 1
    }
    sed -i 's/^\toomScoreMax = -999$/\toomScoreMax = 0/' "$manager"
    (cd "$gvisor.tmp/src/gvisor" && go build -trimpath -ldflags "-s -w" -o "$gvisor.tmp/shim" ./shim) >&2
    unset CGO_ENABLED GOFLAGS
    rm -rf "$gvisor.tmp/src"
    mv "$gvisor.tmp/shim" "$gvisor.tmp/containerd-shim-runsc-v1"
    rm -rf "$gvisor"
    mv "$gvisor.tmp" "$gvisor"
fi
mkdir -p "$CTRD/gvisor"
ln -sfn "$wrapper" "$CTRD/gvisor/sandboxd-runsc"
ln -sfn "$gvisor/runsc" "$CTRD/gvisor/runsc"
# containerd finds a shim by name on its PATH (containerd-shim-runsc-v1 for
# runtime_type io.containerd.runsc.v1): the wrapper again, which adapts
# gVisor's shim (gvisor-shim beside it) to containerd 1.6's start protocol.
ln -sfn "$wrapper" "$CTRD/gvisor/containerd-shim-runsc-v1"
ln -sfn "$gvisor/containerd-shim-runsc-v1" "$CTRD/gvisor/gvisor-shim"
cat > "$CTRD/runsc.toml" <<TOML
binary_name = "$CTRD/gvisor/sandboxd-runsc"
root = "$CTRD/state/runsc"
[runsc_config]
  platform = "systrap"
  network = "none"
  oci-seccomp = "true"
TOML

cat > "$STATE/cni/net.d/10-sandboxd.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "sandboxd-test", "plugins": [
  {"type": "bridge", "bridge": "sbxtest0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.89.0.0/24"}]]}},
  {"type": "loopback"}]}
JSON
cat > "$CTRD/config.toml" <<TOML
version = 2
root = "$CTRD/root"
state = "$CTRD/state"
[grpc]
  address = "$SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  # Nested hosts may refuse negative oom_score_adj (the pause container asks -998).
  restrict_oom_score_adj = true
  sandbox_image = "$PAUSE"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "${CONTAINERD_SNAPSHOTTER:-native}"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.sandboxd]
      runtime_type = "io.containerd.runc.v2"
      pod_annotations = ["sandboxd.io/*"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.sandboxd.options]
        BinaryName = "$wrapper"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      pod_annotations = ["sandboxd.io/*"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$CTRD/runsc.toml"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
TOML
shims_on_path() { tr '\0' '\n' <"/proc/$(cat "$STATE/pids/containerd")/environ" | grep -qx "PATH=$CTRD/gvisor:.*"; }
if alive containerd && ! { cmp -s "$CTRD/config.toml" "$CTRD/config.running.toml" && shims_on_path; }; then
    say "containerd configuration changed: restarting it (containers keep running)"
    kill "$(cat "$STATE/pids/containerd")"
    for _ in $(seq 100); do alive containerd || break; sleep 0.1; done
    rm -f "$SOCK"
fi
cp "$CTRD/config.toml" "$CTRD/config.running.toml"
start containerd env PATH="$CTRD/gvisor:$PATH" containerd --config "$CTRD/config.toml"
for _ in $(seq 100); do [[ -S $SOCK ]] && break; sleep 0.1; done

if ! ctr_ images ls -q | grep -qx "$PAUSE"; then
    say "building $PAUSE from k8s.io/kubernetes build/pause"
    src=$(go env GOMODCACHE)/k8s.io/kubernetes@$KUBE_VERSION/build/pause/linux/pause.c
    tmp=$(mktemp -d)
    mkdir -p "$tmp/root"
    gcc -Os -static -DVERSION=3.10 -o "$tmp/root/pause" "$src"
    tar -C "$tmp/root" -cf "$tmp/rootfs.tar" pause
    python3 "$here/ociimage.py" "$tmp/rootfs.tar" "$PAUSE" "$tmp/pause.oci.tar" --entrypoint /pause
    ctr_ images import "$tmp/pause.oci.tar" >&2
    rm -rf "$tmp"
fi
for rootfs in "$HOME"/.cache/sandboxd/images/*.tar; do
    [[ -f $rootfs ]] || continue
    tag=sandboxd/rollout:$(basename "$rootfs" .tar)
    ctr_ images ls -q | grep -qx "docker.io/$tag" && continue
    say "importing $tag"
    tmp=$(mktemp -d)
    python3 "$here/ociimage.py" "$rootfs" "docker.io/$tag" "$tmp/img.tar"
    ctr_ images import "$tmp/img.tar" >&2
    rm -rf "$tmp"
done

cat > "$STATE/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzPort: 0
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$SOCK
failSwapOn: false
failCgroupV1: false
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
enforceNodeAllocatable: []
cgroupsPerQOS: true
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
registerWithTaints: [{key: sandboxd.io/real-node, value: "true", effect: NoSchedule}]
localStorageCapacityIsolation: true
serializeImagePulls: false
YAML
start kubelet "$BIN/kubelet-$KUBE_VERSION" --config "$STATE/kubelet/config.yaml" \
    --kubeconfig "$STATE/admin.kubeconfig" --hostname-override "$NODE" --node-ip "$NODE_IP" \
    --root-dir "$STATE/kubelet/root" --cert-dir "$STATE/kubelet/pki" --v=1
k() { "$BIN/kubectl-$KUBE_VERSION" --kubeconfig "$STATE/admin.kubeconfig" "$@"; }
end=$((SECONDS + ${KUBE_UP_TIMEOUT:-120}))
until [[ $(k get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]; do
    ((SECONDS < end)) || { say "node $NODE not Ready (logs: $STATE/logs/kubelet.log)"; exit 1; }
    sleep 1
done
k apply -f "$here/../node/runtimeclass.yaml" -f "$here/../node/runtimeclass-gvisor.yaml" >&2
# NetworkPolicy enforcement (kube-router's firewall): the node is of use
# without it, so a failure is reported, not fatal.
"$here/netpol-up.sh" || say "node $NODE runs without NetworkPolicy enforcement (see above)"
say "node $NODE Ready"
echo "$NODE"
