"""Files mapped shared and writable, told from inside the sandbox for a
workspace read through it (gVisor, Kubernetes, a remote engine): the
listing command ends with the matching lines of every /proc/<pid>/maps the
listing user may read (its own processes'), with their length, and the
capture reads those files again as the in-place path does
(sandboxd.backends.hostmaps). A root process's mappings are not readable
there: files only root maps through a sandbox stay as their stamps say."""

from __future__ import annotations

from sandboxd.backends.base import WORKSPACE
from sandboxd.backends.hostmaps import shared_writable

_END = b"MAPS"
_LENGTH = 8

# Run after a listing script: the status of the listing is kept (a session
# shell must not exit), and nothing it sets outlives the subshell.
MAPS_TRAILER = (
    "\n( __sbx_r=$?; export LC_ALL=C; "
    "__sbx_m=$(cat /proc/[0-9]*/maps 2>/dev/null | grep -E '^[^ ]+ .w.s ' | grep -F ' "
    + WORKSPACE
    + "/' | sort -u); "
    "printf '%s%08dMAPS' \"$__sbx_m\" \"${#__sbx_m}\"; exit $__sbx_r )\n"
)


def split_maps(raw: bytes) -> tuple[bytes, frozenset[str]]:
    """(the listing, the workspace files its trailer names mapped) from
    the output of a script ending in MAPS_TRAILER; one without the trailer
    (an adapter that emulates the listing) names none."""
    tail = len(_END) + _LENGTH
    if len(raw) < tail or not raw.endswith(_END) or not raw[-tail : -len(_END)].isdigit():
        return raw, frozenset()
    n = int(raw[-tail : -len(_END)])
    if n > len(raw) - tail:
        return raw, frozenset()
    return raw[: len(raw) - tail - n], frozenset(shared_writable(raw[len(raw) - tail - n : -tail]))
