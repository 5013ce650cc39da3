#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: installs what it needs
# (setup.sh test: docker.io, debootstrap, the package with its dev and loop
# extras, the versitygw S3 gateway, the default sandbox image), then lints,
# type-checks and runs every test tier against the real engine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh test
echo "[test] ruff"
python3 -m ruff check .
echo "[test] mypy"
python3 -m mypy
echo "[test] import layers"
lint-imports
if command -v go >/dev/null; then
    echo "[test] node runtime wrapper (go vet, go test)"
    (cd deploy/node/sandboxd-runc && test -z "$(gofmt -l .)" && go vet ./... && go test ./...)
fi
if [[ ${SANDBOXD_KUBE_TESTCLUSTER:-1} != 0 ]]; then
    # A real API server (etcd, kube-apiserver, controller-manager, scheduler,
    # kwok nodes) for tests/kube: built once from the Go module proxy and cached
    # by version under ~/.cache/sandboxd/kube (cold: 20-40 min on 2 cores),
    # started idempotently (warm: seconds). Without it tests/kube skip.
    echo "[test] kubernetes test cluster"
    if deploy/testcluster/build.sh >&2 && kubeconfig=$(deploy/testcluster/up.sh | tail -1); then
        export KUBECONFIG=$kubeconfig
        # Tier B: one real kubelet node (containerd, runc, bridge CNI) for the
        # tests that exec into real containers; they skip if it cannot start.
        if deploy/testcluster/node-up.sh >&2; then
            export SANDBOXD_KUBE_REAL_NODE=1
            # Its NetworkPolicy firewall (kube-router, which node-up.sh started;
            # this only confirms it): without it the tests of dropped packets skip.
            if deploy/testcluster/netpol-up.sh >&2; then
                export SANDBOXD_KUBE_NETPOL=1
            else
                echo "[test] NetworkPolicy not enforced on the real node: its tests will be skipped" >&2
            fi
        else
            echo "[test] real kubelet node unavailable: kube_node tests will be skipped" >&2
        fi
    else
        echo "[test] kubernetes test cluster unavailable: tests/kube will be skipped" >&2
    fi
fi
echo "[test] pytest"
python3 -m pytest -q -p no:cacheprovider "$@"
