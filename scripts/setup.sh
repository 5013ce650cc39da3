#!/usr/bin/env bash
# One-shot, idempotent set-up of a fresh Debian bookworm host (run as root).
#
#   setup.sh example   what `sandboxd example` needs: docker.io + debootstrap,
#                      a running dockerd, the sandboxd package (no extras) in
#                      a virtual environment of its own (.venv-example) and
#                      the default rollout image
#   setup.sh test      all of that, but into the system Python, plus the dev
#                      extras (linters, pytest, the documentation site's
#                      MkDocs), Debian's chromium and chromium-driver for the
#                      documentation's browser test, the reference loop's
#                      PyTorch extra, the versitygw S3 gateway the
#                      snapshot-store tests use and gVisor's runsc
#                      (registered with dockerd) for the gvisor runtime,
#                      and Harbor in a Python 3.12+ environment of its own
#                      (.venv-harbor, scripts/harbor-venv.sh)
#
# Without an argument it does the full `test` set-up.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

say() { printf '[setup] %s\n' "$*"; }

mode=${1:-test}
case "$mode" in
    example | test) ;;
    *)
        echo "[setup] usage: $0 [example|test]" >&2
        exit 2
        ;;
esac

if [[ $EUID -ne 0 ]]; then
    echo "[setup] must run as root (apt, dockerd, debootstrap)" >&2
    exit 1
fi

# Checked by command rather than by package so that an existing docker-ce
# install is accepted instead of conflicting with docker.io.
missing=()
command -v dockerd >/dev/null && command -v docker >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v crun >/dev/null || missing+=(crun)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
# Debian ships venv's pip bootstrap (ensurepip) apart from python3.
[[ $mode != example ]] || python3 -c 'import ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
else
    say "apt packages present"
fi

say "starting docker"
scripts/start-docker.sh

# The test set-up installs into the system Python: Debian's python3 is
# marked externally managed (PEP 668), but a test host is dedicated to
# sandboxd, and every test runs with that interpreter. The example installs
# into a virtual environment of its own instead: a newcomer's machine has
# packages of its own in the system Python (botocore, aws-sam-translator,
# ...) whose pins disagree with sandboxd's, and pip would print their
# conflicts as errors that are not the newcomer's. scripts/run-example.sh
# runs the example with this environment's interpreter.
EXAMPLE_VENV=.venv-example
py=python3
if [[ $mode == example ]]; then
    # Made anew when missing or broken (a venv without pip, or whose python
    # went away with an upgrade of the system's).
    if ! "$EXAMPLE_VENV/bin/python" -m pip --version >/dev/null 2>&1; then
        say "creating the virtual environment $EXAMPLE_VENV"
        rm -rf "$EXAMPLE_VENV"
        python3 -m venv "$EXAMPLE_VENV"
    fi
    py=$EXAMPLE_VENV/bin/python
fi
# Every install is held to constraints.txt's exact versions (why: its header).
pip_install() {
    PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore "$py" -m pip install -q -c constraints.txt "$@"
}

if [[ ! -f pyproject.toml ]]; then
    say "no pyproject.toml; skipping pip install"
elif [[ $mode == example ]]; then
    say "installing sandboxd (editable) into $EXAMPLE_VENV"
    pip_install -e .
else
    say "installing sandboxd (editable, with dev extras)"
    pip_install -e '.[dev]'
    # prime-sandboxes caps connectrpc below 0.12 while the e2b SDK needs 0.12
    # (pyproject.toml); it runs on 0.12, so it goes in without its pins.
    pip_install --no-deps prime-sandboxes
    # The reference loop's PyTorch policy (~4 GB of wheels with CUDA; ~2 min the
    # first time, cached after). SANDBOXD_SKIP_TORCH=1 skips it: the loop then
    # uses its numpy implementation of the same policy.
    if [[ "${SANDBOXD_SKIP_TORCH:-0}" != 1 ]]; then
        pip_install -e '.[loop]' || say "torch did not install; the loop will use numpy"
    fi
fi

if [[ $mode == test ]]; then
    # An S3-compatible server for the snapshot store's tests: the Versity S3
    # Gateway, built from the Go module proxy (about 2.5 min the first time on
    # two cores; the binary is kept in GOPATH/bin and linked into /usr/local/bin).
    VERSITYGW_VERSION=v1.8.0
    gobin="$(command -v go >/dev/null && go env GOPATH || echo "$HOME/go")/bin"
    if [[ -x "$gobin/versitygw" && "$(cat "$gobin/.versitygw-version" 2>/dev/null)" == "$VERSITYGW_VERSION" ]]; then
        say "versitygw ${VERSITYGW_VERSION} present"
    elif command -v go >/dev/null; then
        say "building versitygw ${VERSITYGW_VERSION} (go install)"
        GOFLAGS=-buildvcs=false go install "github.com/versity/versitygw/cmd/versitygw@${VERSITYGW_VERSION}"
        echo "$VERSITYGW_VERSION" >"$gobin/.versitygw-version"
    else
        echo "[setup] Go is needed to build versitygw (the S3 server the snapshot tests use)" >&2
        exit 1
    fi
    ln -sf "$gobin/versitygw" /usr/local/bin/versitygw

    # A real OCI registry for the image tests: Debian's docker-registry (the
    # distribution registry), started by the tests themselves on 127.0.0.1
    # and a free port, one of them behind basic auth (htpasswd -B, from
    # apache2-utils). The package's own service is not wanted.
    registry_missing=()
    command -v docker-registry >/dev/null || registry_missing+=(docker-registry)
    command -v htpasswd >/dev/null || registry_missing+=(apache2-utils)
    if ((${#registry_missing[@]})); then
        say "installing ${registry_missing[*]}"
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${registry_missing[@]}"
        if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
            systemctl disable --now docker-registry >/dev/null 2>&1 || true
        fi
    else
        say "docker-registry and htpasswd present"
    fi

    # A real browser for the documentation's test (tests/docs opens the built
    # site in it): Debian's chromium and its WebDriver, chromium-driver.
    # Where the distribution offers neither (an architecture without them)
    # the set-up goes on and that one test skips; offered, they must install.
    browser_missing=()
    command -v chromium >/dev/null || browser_missing+=(chromium)
    command -v chromedriver >/dev/null || browser_missing+=(chromium-driver)
    if ((${#browser_missing[@]})); then
        apt-get update -q
        if apt-cache show --no-all-versions "${browser_missing[@]}" >/dev/null 2>&1; then
            say "installing ${browser_missing[*]}"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${browser_missing[@]}"
        else
            say "no ${browser_missing[*]} for this distribution: the documentation's browser test will skip"
        fi
    else
        say "chromium and chromium-driver present"
    fi

    # gVisor's runsc, for the pools of runtime "gvisor" the integration
    # suites also run under: built the same way (about 2.5 min the first
    # time, an 80 MB binary kept in GOPATH/bin), static (CGO_ENABLED=0: a
    # dynamically linked runsc fails every sandbox when it re-executes itself)
    # and registered with dockerd as "runsc" by start-docker.sh. The version
    # is a pseudo-version of gVisor's `go` branch (it publishes no tags there),
    # kept with the test cluster's versions (its node runs gVisor's shim too).
    RUNSC_VERSION=$(source deploy/testcluster/versions.sh && echo "$GVISOR_VERSION")
    if [[ -x "$gobin/runsc" && "$(cat "$gobin/.runsc-version" 2>/dev/null)" == "$RUNSC_VERSION" ]]; then
        say "runsc ${RUNSC_VERSION} present"
    else
        say "building runsc ${RUNSC_VERSION} (go install)"
        CGO_ENABLED=0 GOFLAGS=-mod=mod go install -ldflags "-s -w" "gvisor.dev/gvisor/runsc@${RUNSC_VERSION}"
        echo "$RUNSC_VERSION" >"$gobin/.runsc-version"
    fi
    ln -sf "$gobin/runsc" /usr/local/bin/runsc
    scripts/start-docker.sh
fi

say "ensuring the default rollout image (first run: ~1 min of debootstrap)"
tag=$(PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$py" -m sandboxd.images.build)
if [[ $mode == test ]]; then
    # The image behind `sandboxd run-code` and its tests: the toolchains of
    # SandboxFusion's languages (first run: ~3 min and ~3 GB; then cached).
    # A failed build fails the set-up: the run-code tests need the image and
    # fail without it (they never fall back or skip).
    say "ensuring the code-judge image"
    if ! judge=$(PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python3 -m sandboxd.images.codejudge); then
        echo "[setup] the code-judge image did not build (see the log above)" >&2
        exit 1
    fi
    say "code-judge image: $judge"
    # BuildKit's Dockerfile frontend (syntax 1.4: heredocs, COPY --link) as a
    # local image, compiled from its Go module (about 1 min the first time);
    # the BuildKit tests build with it.
    say "ensuring the Dockerfile frontend image"
    if ! frontend=$(PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python3 -m sandboxd.images.dockerfile_frontend); then
        echo "[setup] the Dockerfile frontend image did not build (see the log above)" >&2
        exit 1
    fi
    say "Dockerfile frontend image: $frontend"
    # Harbor (the Harbor test runs its trials through sandboxd's E2B API)
    # needs Python 3.12 or later: a virtual environment of its own,
    # .venv-harbor, from one found on the machine (~2 min the first time;
    # kept while at its pins). Without such a Python the Harbor test skips.
    say "ensuring Harbor's environment (.venv-harbor)"
    scripts/harbor-venv.sh
fi
say "ready ($mode): $tag"
