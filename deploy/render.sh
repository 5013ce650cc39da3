#!/usr/bin/env bash
# Renders charts/sandboxd into deploy/kustomize/sandboxd.yaml (the plain
# manifests behind `kubectl apply -k deploy/kustomize`), with the values in
# deploy/kustomize/values.yaml. Run after changing the chart; CI checks that
# the committed file matches (tests/kube/test_chart.py).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=testcluster/versions.sh
source "$here/testcluster/versions.sh"
helm=${HELM:-$KUBE_CACHE/bin/helm-$HELM_VERSION}
[[ -x $helm ]] || "$here/testcluster/build.sh" helm >&2
render() {
    echo "# Rendered from charts/sandboxd by deploy/render.sh; do not edit by hand."
    "$helm" template sandboxd "$here/../charts/sandboxd" --namespace sandboxd \
        -f "$here/kustomize/values.yaml"
}
if [[ ${1:-} == - ]]; then  # to stdout (CI compares it with the committed file)
    render
    exit
fi
render > "$here/kustomize/sandboxd.yaml"
echo "wrote $here/kustomize/sandboxd.yaml" >&2
