#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: installs what it needs
# (docker.io, the package, the default sandbox image), then lints, type-checks
# and runs every test tier against the real engine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
echo "[test] ruff"
python3 -m ruff check .
echo "[test] mypy"
python3 -m mypy
echo "[test] import layers"
lint-imports
echo "[test] pytest"
python3 -m pytest -q -p no:cacheprovider "$@"
