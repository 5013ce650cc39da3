#!/usr/bin/env bash
# The control-plane image (`sandboxd serve`) for the test cluster's real node,
# built without Docker or a registry (run after node-up.sh):
#   layer 1: the default sandbox image's rootfs tar (Debian bookworm with
#            python3.11; sandboxd.images.build), the same layer as the
#            sandbox image, so the node stores it once;
#   layer 2: the runtime dependencies of pyproject.toml, installed with
#            `pip install --target` as CPython 3.11 manylinux wheels, compiled;
#            cached as a tar by the hash of the dependency list;
#   layer 3: the sandboxd package and a `sandboxd` launcher, compiled.
# Imported into the node's containerd as sandboxd/sandboxd:<hash of all
# inputs>; the three latest are kept. A warm run hashes the sources and asks
# containerd (well under a second). Prints the image reference.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=versions.sh
source "$here/versions.sh"
STATE=${KUBE_STATE:-$KUBE_CACHE/cluster}
SOCK=$STATE/containerd/containerd.sock
CACHE=$KUBE_CACHE/control-plane
REPO=docker.io/sandboxd/sandboxd
# Fixed owners, modes and mtimes in the layer tars (nothing of this host).
TAR_FLAGS=(--sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 "--mode=u+rwX,go+rX,go-w")
say() { printf '[control-plane-image] %s\n' "$*" >&2; }
ctr_() { ctr --address "$SOCK" -n k8s.io "$@"; }
hash_() { sha256sum | cut -c1-12; }

cd "$root"
[[ -S $SOCK ]] || { say "no containerd at $SOCK: run deploy/testcluster/node-up.sh first"; exit 1; }
base_tag=$(python3 -m sandboxd.images.build --print-tag)
base=${SANDBOXD_CACHE_DIR:-$HOME/.cache/sandboxd/images}/${base_tag#*:}.tar
[[ -f $base ]] || { say "no $base: build the sandbox image first (python3 -m sandboxd.images.build)"; exit 1; }

deps=$(python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
# Wheels for the image's interpreter (CPython 3.11, glibc 2.36), whatever runs
# this script; pip does not widen --platform to older glibc tags itself.
PIP_TARGET=(--python-version 3.11 --implementation cp --abi cp311 --only-binary=:all:)
for glibc in $(seq 36 -1 17); do PIP_TARGET+=(--platform "manylinux_2_${glibc}_x86_64"); done
PIP_TARGET+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
deps_hash=$(printf '%s\n' "$deps" "${PIP_TARGET[*]}" "${TAR_FLAGS[*]}" "$(cat constraints.txt)" | hash_)
app_files=$(find sandboxd -type f \( -name '*.py' -o -name '*.pyi' -o -name py.typed \) | LC_ALL=C sort)
app_hash=$( { printf '%s\n' "$app_files"; xargs cat <<<"$app_files"; } | hash_)
tag=$(cat "$here/control-plane-image.sh" "$here/ociimage.py" | { cat; echo "$base_tag $deps_hash $app_hash"; } | hash_)
ref=$REPO:$tag
if ctr_ images ls -q | grep -qx "$ref"; then
    echo "$ref"
    exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock 9
if ctr_ images ls -q | grep -qx "$ref"; then
    echo "$ref"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
compile() {
    # Bytecode that is never checked against its source's mtime (the tars
    # fix every mtime); only a 3.11 interpreter writes what the image's reads.
    if python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
        python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash "$1" >/dev/null
    else
        say "not Python 3.11 here: the image compiles nothing ahead (slower start)"
    fi
}

deps_tar=$CACHE/deps-$deps_hash.tar
if [[ ! -f $deps_tar ]]; then
    say "installing the dependencies into a layer (deps-$deps_hash)"
    mkdir -p "$tmp/deps/opt/sandboxd/deps"
    # shellcheck disable=SC2086
    python3 -m pip install -q --no-compile --no-warn-script-location --no-warn-conflicts \
        --root-user-action=ignore --disable-pip-version-check -c constraints.txt \
        --target "$tmp/deps/opt/sandboxd/deps" "${PIP_TARGET[@]}" $deps >&2
    rm -rf "$tmp/deps/opt/sandboxd/deps/bin"
    compile "$tmp/deps/opt/sandboxd/deps"
    tar -C "$tmp/deps" "${TAR_FLAGS[@]}" -cf "$deps_tar.tmp" opt
    mv "$deps_tar.tmp" "$deps_tar"
    # Only the current dependency layer is kept.
    find "$CACHE" -name 'deps-*.tar' ! -name "deps-$deps_hash.tar" -delete
fi

say "building $ref"
mkdir -p "$tmp/app/opt/sandboxd/app" "$tmp/app/usr/local/bin"
tar -c -T - <<<"$app_files" | tar -C "$tmp/app/opt/sandboxd/app" -x
compile "$tmp/app/opt/sandboxd/app"
cat > "$tmp/app/usr/local/bin/sandboxd" <<'PY'
#!/usr/bin/python3
import sys

from sandboxd.cli import main

sys.exit(main())
PY
chmod 0755 "$tmp/app/usr/local/bin/sandboxd"
tar -C "$tmp/app" "${TAR_FLAGS[@]}" -cf "$tmp/app.tar" opt usr
python3 "$here/ociimage.py" "$base" "$ref" "$tmp/image.tar" --layer "$deps_tar" --layer "$tmp/app.tar" \
    --entrypoint /usr/local/bin/sandboxd --user 10001:10001 --workdir /tmp \
    --env LANG=C.UTF-8 --env HOME=/tmp --env PYTHONDONTWRITEBYTECODE=1 --env PYTHONUNBUFFERED=1 \
    --env PYTHONPATH=/opt/sandboxd/app:/opt/sandboxd/deps
ctr_ images import "$tmp/image.tar" >&2
# Each image's top snapshot is a full copy on the native snapshotter: keep the
# three latest (a concurrent run of another checkout may still start one).
echo "$ref" >> "$CACHE/imported"
tail -n 3 "$CACHE/imported" > "$CACHE/imported.tmp"
{ grep -vxF -f "$CACHE/imported.tmp" "$CACHE/imported" || true; } | sort -u | while read -r old; do
    ctr_ images rm "$old" >/dev/null 2>&1 || true
done
mv "$CACHE/imported.tmp" "$CACHE/imported"
echo "$ref"
