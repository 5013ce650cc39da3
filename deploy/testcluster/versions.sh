# Versions of the test cluster's components; sourced by the scripts that build or run it.
# Binaries are cached under $KUBE_CACHE/bin/<name>-<version>.
KUBE_VERSION=v1.33.13          # kube-apiserver, controller-manager, scheduler, kubectl
ETCD_VERSION=v3.5.24
KWOK_VERSION=v0.7.0
HELM_VERSION=v3.18.6
# kube-router: the real node's NetworkPolicy firewall (iptables and ipsets).
# The newest version the Go module proxy serves here.
KUBE_ROUTER_VERSION=v2.1.0
# gVisor (runsc and its containerd shim): a pseudo-version of its `go` branch,
# which publishes no tags. scripts/setup.sh builds the same runsc for Docker.
GVISOR_VERSION=v0.0.0-20260701204157-69c2d17aea96
KUBE_CACHE=${KUBE_CACHE:-${HOME}/.cache/sandboxd/kube}
