#!/usr/bin/env bash
# The virtual environment the Harbor test runs Harbor in (.venv-harbor):
# Harbor needs Python 3.12 or later while sandboxd's own environment is the
# system's 3.11, so it gets an interpreter of its own, found on the machine
# (python3.13 / python3.12 on PATH, pyenv's), with harbor[e2b] and the e2b
# SDK at the pins below and every other package at scripts/harbor-constraints.txt.
#
#   harbor-venv.sh            make it (kept when present at the pins)
#   harbor-venv.sh --python   print the interpreter it is made from; exit 3 if none
#
# Without a Python 3.12 or later it makes nothing and says so (exit 0): the
# Harbor test then skips, naming why.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

HARBOR_VERSION=0.26.0
E2B_VERSION=2.63.0
VENV=.venv-harbor

say() { printf '[harbor-venv] %s\n' "$*" >&2; }

find_python() {
    local candidates=() c
    for c in python3.14 python3.13 python3.12 python3; do
        command -v "$c" >/dev/null && candidates+=("$(command -v "$c")")
    done
    for c in 3.14 3.13 3.12; do
        candidates+=("${PYENV_ROOT:-$HOME/.pyenv}/versions/$c".*/bin/python3)
    done
    for c in "${candidates[@]}"; do
        # A pyenv shim names a version that may not be installed: run it to know.
        if [[ -x $c ]] && "$c" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            echo "$c"
            return 0
        fi
    done
    return 3
}

if [[ ${1:-} == --python ]]; then
    find_python
    exit
fi

at_pins() {
    "$VENV/bin/python" - "$HARBOR_VERSION" "$E2B_VERSION" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit((version("harbor"), version("e2b")) != (sys.argv[1], sys.argv[2]))
EOF
}

if [[ -x $VENV/bin/python ]] && at_pins; then
    say "$VENV present (harbor $HARBOR_VERSION, e2b $E2B_VERSION)"
    exit 0
fi
if ! py=$(find_python); then
    say "no Python 3.12 or later on this machine: Harbor's test will skip"
    exit 0
fi
say "creating $VENV from $py (harbor $HARBOR_VERSION, e2b $E2B_VERSION)"
rm -rf "$VENV"
"$py" -m venv "$VENV"
PIP_ROOT_USER_ACTION=ignore "$VENV/bin/python" -m pip install -q -c scripts/harbor-constraints.txt \
    "harbor[e2b]==$HARBOR_VERSION" "e2b==$E2B_VERSION"
at_pins
