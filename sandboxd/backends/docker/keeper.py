"""The keeper: what a gVisor sandbox runs instead of ``sleep infinity``.

gVisor's restore brings back the container's init tree only: it kills every
process whose lineage began with an engine exec (the sentry marks a task's
origin when it is created and a fork inherits it, whatever the task's parent
is later), so sessions, one-shot commands and whatever they forked,
daemonised or re-parented, are gone after a restore (measured with runsc
under Docker 20.10). So a gVisor sandbox's init process runs a shell that
reads lines from a FIFO (KEEP_VAR names it inside the sandbox) and starts
each one as a process of that tree: ``echo 'python3 server.py' >
"$SANDBOXD_KEEP"``. A live snapshot carries those, with all memory and the
tmpfs mounts.
"""

from __future__ import annotations

from sandboxd.backends.layout import WORKSPACE

KEEP_FIFO = "/tmp/.sandboxd-keep"
"""The keeper's FIFO inside a gVisor sandbox."""

# The FIFO is opened read-write, so the keeper never sees end-of-file between
# writers; each line runs in the workspace in a session of its own with its
# output discarded (a kept process writes its own files). Without a FIFO
# (a full /tmp) the sandbox still idles like any other.
KEEPER_COMMAND = [
    "bash",
    "-c",
    f'f={KEEP_FIFO}; rm -f "$f"; mkfifo -m 600 "$f" || exec sleep infinity; exec 3<>"$f"; '
    f'while IFS= read -r line <&3; do (cd {WORKSPACE} && exec setsid bash -c "$line" '
    "</dev/null >/dev/null 2>&1) & done",
]
