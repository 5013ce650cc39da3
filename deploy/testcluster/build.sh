#!/usr/bin/env bash
# Builds the test cluster's binaries from the Go module proxy (no release
# downloads, no container registry) and caches them by version under
# $KUBE_CACHE/bin. Idempotent: a binary already cached is not rebuilt, so a
# warm run returns at once. Cold on 2 cores: see deploy/README.md.
#
#   deploy/testcluster/build.sh [etcd] [kwok] [kube] [helm] [kubelet] [kuberouter]
#   (default: etcd kwok kube helm; node-up.sh builds the last two)
#
# Kubernetes components: `go install k8s.io/kubernetes/cmd/...@vX` fails
# because k8s.io/kubernetes' go.mod replaces its staging modules with local
# folders, so they are built in a throw-away wrapper module that requires
# k8s.io/kubernetes and pins every staging module to its published v0.Y.Z.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.sh
source "$here/versions.sh"
BIN=$KUBE_CACHE/bin
SRC=$KUBE_CACHE/src
mkdir -p "$BIN" "$SRC"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local
P=${GO_BUILD_P:-2}
say() { printf '[kube-build %(%H:%M:%S)T] %s\n' -1 "$*"; }
have() { [[ -x "$BIN/$1-$2" ]]; }

build_etcd() {
    have etcd "$ETCD_VERSION" && return
    say "etcd $ETCD_VERSION"
    local d=$SRC/etcd-$ETCD_VERSION
    rm -rf "$d" && mkdir -p "$d" && cd "$d"
    go mod init sandboxd.local/etcdwrap >/dev/null 2>&1
    cat > tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    go mod tidy
    go build -p "$P" -trimpath -ldflags "-s -w" -o "$BIN/etcd-$ETCD_VERSION.tmp" go.etcd.io/etcd/server/v3
    mv "$BIN/etcd-$ETCD_VERSION.tmp" "$BIN/etcd-$ETCD_VERSION"
}

build_kwok() {
    have kwok "$KWOK_VERSION" && return
    say "kwok $KWOK_VERSION"
    local d=$SRC/kwok-$KWOK_VERSION
    rm -rf "$d" && mkdir -p "$d" && GOBIN=$d go install -p "$P" -trimpath -ldflags "-s -w" \
        "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
    mv "$d/kwok" "$BIN/kwok-$KWOK_VERSION"
}

STAGING="api apiextensions-apiserver apimachinery apiserver cli-runtime client-go
cloud-provider cluster-bootstrap code-generator component-base component-helpers
controller-manager cri-api cri-client csi-translation-lib dynamic-resource-allocation
endpointslice externaljwt kms kube-aggregator kube-controller-manager kube-proxy
kube-scheduler kubectl kubelet metrics mount-utils pod-security-admission sample-apiserver"
KUBE_CMDS="kube-apiserver kube-controller-manager kube-scheduler kubectl"

build_kube() {
    local missing=() c
    for c in $KUBE_CMDS; do have "$c" "$KUBE_VERSION" || missing+=("$c"); done
    ((${#missing[@]})) || return 0
    say "kubernetes $KUBE_VERSION: ${missing[*]}"
    local d=$SRC/kube-$KUBE_VERSION staging_v=v0.${KUBE_VERSION#v1.}
    rm -rf "$d" && mkdir -p "$d" && cd "$d"
    go mod init sandboxd.local/kubewrap >/dev/null 2>&1
    {
        echo '//go:build tools'; echo; echo 'package tools'; echo; echo 'import ('
        for c in $KUBE_CMDS; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
        echo ')'
    } > tools.go
    local m
    for m in $STAGING; do go mod edit "-replace=k8s.io/$m=k8s.io/$m@$staging_v"; done
    go mod edit "-require=k8s.io/kubernetes@$KUBE_VERSION"
    go mod tidy
    local minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
    local ld="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
    ld+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
    ld+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION"
    ld+=" -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
    ld+=" -X k8s.io/component-base/version.gitTreeState=clean"
    for c in "${missing[@]}"; do
        say "  go build $c"
        go build -p "$P" -trimpath -ldflags "$ld" -o "$BIN/$c-$KUBE_VERSION.tmp" "k8s.io/kubernetes/cmd/$c"
        mv "$BIN/$c-$KUBE_VERSION.tmp" "$BIN/$c-$KUBE_VERSION"
    done
}

build_helm() {
    have helm "$HELM_VERSION" && return
    say "helm $HELM_VERSION"
    local d=$SRC/helm-$HELM_VERSION minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
    rm -rf "$d" && mkdir -p "$d"
    local ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
    ld+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
    GOBIN=$d go install -p "$P" -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
    mv "$d/helm" "$BIN/helm-$HELM_VERSION"
}

# Tier B (one real node): the kubelet, built like the other components.
build_kubelet() {
    KUBE_CMDS="kubelet" build_kube
}

# Tier B's NetworkPolicy firewall (netpol-up.sh): kube-router's go.mod has no
# replace directives, so `go install` builds it as published.
build_kuberouter() {
    have kube-router "$KUBE_ROUTER_VERSION" && return
    say "kube-router $KUBE_ROUTER_VERSION"
    local d=$SRC/kube-router-$KUBE_ROUTER_VERSION
    local ld="-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION"
    rm -rf "$d" && mkdir -p "$d" && GOBIN=$d go install -p "$P" -trimpath -ldflags "$ld" \
        "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"
    mv "$d/kube-router" "$BIN/kube-router-$KUBE_ROUTER_VERSION"
}

targets=("$@"); ((${#targets[@]})) || targets=(etcd kwok kube helm)
for t in "${targets[@]}"; do
    start=$SECONDS
    "build_$t"
    say "$t done in $((SECONDS - start)) s"
done
# Unversioned links so callers can put $BIN/current on PATH.
mkdir -p "$BIN/current"
for pair in "etcd $ETCD_VERSION" "kwok $KWOK_VERSION" "kube-apiserver $KUBE_VERSION" \
    "kube-controller-manager $KUBE_VERSION" "kube-scheduler $KUBE_VERSION" \
    "kubectl $KUBE_VERSION" "kubelet $KUBE_VERSION" "helm $HELM_VERSION" \
    "kube-router $KUBE_ROUTER_VERSION"; do
    set -- $pair
    [[ -x "$BIN/$1-$2" ]] && ln -sfn "../$1-$2" "$BIN/current/$1"
done
say "binaries in $BIN"
