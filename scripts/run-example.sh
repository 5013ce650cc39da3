#!/usr/bin/env bash
# The main job on a fresh Debian machine: installs only what the example needs
# (setup.sh example: docker.io, debootstrap, the package without extras in a
# virtual environment of its own, .venv-example, so the system Python's
# packages stay as they were; the default image), starts the sandboxd server
# on the local Docker engine and runs an example rollout workload against it
# (groups of sandboxes, commands, files, rewards, release).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh example
exec .venv-example/bin/python -m sandboxd.cli --log-level WARNING example \
    --state-dir "${TMPDIR:-/tmp}/sandboxd-example" "$@"
