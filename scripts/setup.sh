#!/usr/bin/env bash
# One-shot, idempotent set-up of a fresh Debian bookworm host (run as root):
# docker + debootstrap, the sandboxd package, and the default rollout image.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

say() { printf '[setup] %s\n' "$*"; }

if [[ $EUID -ne 0 ]]; then
    echo "[setup] must run as root (apt, dockerd, debootstrap)" >&2
    exit 1
fi

# Checked by command rather than by package so that an existing docker-ce
# install is accepted instead of conflicting with docker.io.
missing=()
command -v dockerd >/dev/null && command -v docker >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
else
    say "apt packages present"
fi

say "starting docker"
scripts/start-docker.sh

if [[ -f pyproject.toml ]]; then
    say "installing sandboxd (editable, with dev extras)"
    # Debian's python3 is marked externally managed (PEP 668); this host is
    # dedicated to sandboxd, so installing into it is intended.
    PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q -e '.[dev]'
    # The reference loop's PyTorch policy (~4 GB of wheels with CUDA; ~2 min the
    # first time, cached after). SANDBOXD_SKIP_TORCH=1 skips it: the loop then
    # uses its numpy implementation of the same policy.
    if [[ "${SANDBOXD_SKIP_TORCH:-0}" != 1 ]]; then
        PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q -e '.[loop]' \
            || say "torch did not install; the loop will use numpy"
    fi
else
    say "no pyproject.toml; skipping pip install"
fi

# An S3-compatible server for the snapshot store's tests: the Versity S3
# Gateway, built from the Go module proxy (about 2.5 min the first time on two
# cores; the binary is kept in GOPATH/bin and linked into /usr/local/bin).
VERSITYGW_VERSION=v1.8.0
gobin="$(command -v go >/dev/null && go env GOPATH || echo "$HOME/go")/bin"
if [[ -x "$gobin/versitygw" && "$(cat "$gobin/.versitygw-version" 2>/dev/null)" == "$VERSITYGW_VERSION" ]]; then
    say "versitygw ${VERSITYGW_VERSION} present"
elif command -v go >/dev/null; then
    say "building versitygw ${VERSITYGW_VERSION} (go install)"
    GOFLAGS=-buildvcs=false go install "github.com/versity/versitygw/cmd/versitygw@${VERSITYGW_VERSION}"
    echo "$VERSITYGW_VERSION" > "$gobin/.versitygw-version"
else
    echo "[setup] Go is needed to build versitygw (the S3 server the snapshot tests use)" >&2
    exit 1
fi
ln -sf "$gobin/versitygw" /usr/local/bin/versitygw

say "ensuring the default rollout image (first run: ~1 min of debootstrap)"
tag=$(PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python3 -m sandboxd.images.build)
say "ready: $tag"
