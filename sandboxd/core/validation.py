"""Input checks shared by every operation. Each failure names the field."""

from __future__ import annotations

import math
import posixpath
import re
import unicodedata

from sandboxd.backends.base import ROOT_USER, WORKSPACE
from sandboxd.backends.shell import is_env_name
from sandboxd.errors import InvalidArgument

_POOL_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_LABEL_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.\-/]{0,126}[A-Za-z0-9])?")
_SESSION = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/:@]{0,254}")
_ID = re.compile(r"[a-z]{2}-[0-9a-f]{6,64}")
_REQUEST_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
MAX_PATH = 4096
MAX_LABELS = 64


def pool_name(field: str, name: str) -> str:
    """A DNS-label pool name: lowercase letters, digits and inner '-', 1-63 characters."""
    if not name:
        raise InvalidArgument(field, "is required")
    if not _POOL_NAME.fullmatch(name):
        raise InvalidArgument(
            field, f"{name[:80]!r} is not a valid pool name (lowercase letters, digits and '-', at most 63)"
        )
    return name


def image_ref(field: str, image: str) -> str:
    """A plausible image reference (at most 255 of [A-Za-z0-9_.-/:@]); whether it exists is not checked."""
    if not image:
        raise InvalidArgument(field, "is required")
    if not _IMAGE.fullmatch(image):
        raise InvalidArgument(field, f"{image[:80]!r} is not a valid image reference")
    return image


def object_id(field: str, value: str, kind: str) -> str:
    """A well-formed id (``xx-`` and hex), so that only well-formed unknown ids answer NOT_FOUND."""
    if not value:
        raise InvalidArgument(field, "is required")
    if not _ID.fullmatch(value):
        # Unknown ids are NOT_FOUND, malformed ones INVALID_ARGUMENT: say which.
        raise InvalidArgument(field, f"{value[:80]!r} is not a {kind} id")
    return value


def request_id(field: str, value: str) -> str:
    """A client-chosen request id: empty, or 1-64 of [A-Za-z0-9_.-]."""
    if value and not _REQUEST_ID.fullmatch(value):
        raise InvalidArgument(field, f"{value[:80]!r} is not a request id (1-64 of [A-Za-z0-9_.-])")
    return value


def labels(field: str, values: dict[str, str]) -> dict[str, str]:
    """A copy of at most 64 labels: keys 1-128 of [A-Za-z0-9_.-/], values at most 256 with no NUL."""
    if len(values) > MAX_LABELS:
        raise InvalidArgument(field, f"at most {MAX_LABELS} labels")
    for key, value in values.items():
        if not _LABEL_KEY.fullmatch(key):
            raise InvalidArgument(f"{field}[{key[:40]!r}]", "label keys are 1-128 of [A-Za-z0-9_.-/]")
        if len(value) > 256 or "\x00" in value:
            raise InvalidArgument(f"{field}[{key}]", "label values are at most 256 characters, no NUL")
    return dict(values)


RESERVED_LABELS = frozenset(
    {
        # Backends' bookkeeping on containers and pods (sandboxd.backends.*.LABEL_*).
        "sandboxd.managed",
        "sandboxd.instance",
        "sandboxd.pool",
        "sandboxd.sandbox",
        "sandboxd.user",
        "sandboxd.runtime",
        # Whether a gVisor sandbox runs the keeper (sandboxd.backends.docker.containers.LABEL_KEEPER).
        "sandboxd.keeper",
        # Whether a Docker sandbox's root is writable (sandboxd.backends.docker.containerspec.LABEL_ROOT).
        "sandboxd.root",
        "sandboxd.tenant",
        "sandboxd.build",
        # A sandbox's own image (sandboxd.backends.base.LABEL_IMAGE), read back on adoption.
        "sandboxd.image",
        # A sandbox's network rules (sandboxd.backends.docker.egress): forged, they would give it network.
        "sandboxd.network",
        # Whether a sandbox has the model route (sandboxd.backends.docker.egress.LABEL_MODEL).
        "sandboxd.model",
        # Lineage (sandboxd.core.snapshots.lineage) and parked rollouts.
        "sandboxd.snapshot",
        "sandboxd.run",
        "sandboxd.group",
    }
)
"""Label keys sandboxd sets itself and trusts when it reads them back (a
restored sandbox's parent snapshot, a container's pool and owner)."""
RESERVED_LABEL_PREFIX = "sandboxd.snapshot."


def settable_labels(field: str, values: dict[str, str]) -> dict[str, str]:
    """``labels``, for labels a user sets (a lease, a pool, a snapshot, a
    restore): none of sandboxd's own keys, which would forge a snapshot's
    parent or a sandbox's pool. Filters may name them."""
    checked = labels(field, values)
    for key in checked:
        if key in RESERVED_LABELS or key.startswith(RESERVED_LABEL_PREFIX):
            raise InvalidArgument(f"{field}[{key}]", "is a label sandboxd sets itself; choose another key")
    return checked


MAX_ENV_ENTRY = 128 << 10
"""Bytes of one ``NAME=value`` the kernel passes to a program (MAX_ARG_STRLEN, its NUL included)."""
MAX_ENV_TOTAL = 512 << 10
"""Bytes of all of an exec's or pool's variables together: with a command
of MAX_COMMAND they stay within the kernel's 2 MiB for a program's
arguments and environment (ARG_MAX under the default 8 MiB stack)."""


def env(field: str, values: dict[str, str]) -> dict[str, str]:
    """A copy of valid environment variables; SANDBOXD_* names are reserved,
    each ``NAME=value`` under 128 KiB, all of them at most 512 KiB (bytes)."""
    total = 0
    for key, value in values.items():
        if not is_env_name(key):
            raise InvalidArgument(f"{field}[{key[:40]!r}]", "is not a valid environment variable name")
        if key.startswith("SANDBOXD_"):
            raise InvalidArgument(f"{field}[{key}]", "names starting with SANDBOXD_ are reserved")
        size = len(key) + 1 + len(value.encode("utf-8", "surrogatepass"))
        if "\x00" in value or size >= MAX_ENV_ENTRY:
            raise InvalidArgument(f"{field}[{key}]", "NAME=value must be under 128 KiB with no NUL")
        total += size + 1
    if total > MAX_ENV_TOTAL:
        raise InvalidArgument(field, f"variables total {total} bytes, more than {MAX_ENV_TOTAL}")
    return dict(values)


def non_negative(field: str, value: float, maximum: float | None = None) -> float:
    """A finite number >= 0 (and <= ``maximum`` when given)."""
    if math.isnan(value) or value < 0:
        raise InvalidArgument(field, f"must be >= 0, got {value}")
    if maximum is not None and value > maximum:
        raise InvalidArgument(field, f"must be <= {maximum:g}, got {value:g}")
    if math.isinf(value):
        # An infinite timeout would hold a waiter (and its task) for ever.
        raise InvalidArgument(field, "must be finite")
    return value


def positive_count(field: str, value: int) -> int:
    """A count of things asked for: at least 1 (0 is not "one" here)."""
    if value < 1:
        raise InvalidArgument(field, f"must be >= 1, got {value}")
    return value


MAX_NAME = 128


def name_text(field: str, value: str, maximum: int = MAX_NAME) -> str:
    """A free-form name (a run, a demand source, a trajectory or prompt id):
    at most ``maximum`` characters with no control characters (NUL, newline,
    escape, ...), which would cut or forge it in logs, labels and stores."""
    if len(value) > maximum:
        raise InvalidArgument(field, f"at most {maximum} characters, got {len(value)}")
    for ch in value:
        if unicodedata.category(ch) in ("Cc", "Cs"):
            raise InvalidArgument(field, f"must not contain control characters, got {value[:80]!r}")
    return value


def session_name(field: str, name: str) -> str:
    """Empty (no session) or 1-64 of [A-Za-z0-9_.-]."""
    if name and not _SESSION.fullmatch(name):
        raise InvalidArgument(field, "session names are 1-64 of [A-Za-z0-9_.-]")
    return name


def workspace_path(field: str, path: str) -> str:
    """Absolute, normalised path inside the workspace; relative paths are
    taken from the workspace. Anything that resolves outside is refused."""
    if not path:
        raise InvalidArgument(field, "is required")
    if "\x00" in path or len(path) > MAX_PATH:
        raise InvalidArgument(field, "must be at most 4096 bytes with no NUL")
    full = posixpath.normpath(path if path.startswith("/") else f"{WORKSPACE}/{path}")
    if full != WORKSPACE and not full.startswith(WORKSPACE + "/"):
        raise InvalidArgument(field, f"{path[:200]!r} escapes the workspace {WORKSPACE}")
    return full


TMP = "/tmp"
FILE_ROOTS = (WORKSPACE, TMP)
"""Where the file API reaches: the workspace and /tmp (a tmpfs in every
sandbox, where frameworks such as slime put scripts and markers)."""


ANY_ROOT = "/"
"""The file root of every other path in a sandbox with a writable root."""


def file_path(field: str, path: str, anywhere: bool = False) -> str:
    """Like workspace_path, with /tmp as a second root: absolute, normalised,
    inside /workspace (relative paths are taken from it) or /tmp; with
    ``anywhere`` (a sandbox with a writable root) any absolute path. The
    check is on the normalised name; the backend then resolves it in the
    sandbox without following links (a link on the way is refused), so a
    link planted there cannot lead out of the root."""
    if not path:
        raise InvalidArgument(field, "is required")
    if "\x00" in path or len(path) > MAX_PATH:
        raise InvalidArgument(field, "must be at most 4096 bytes with no NUL")
    full = posixpath.normpath(path if path.startswith("/") else f"{WORKSPACE}/{path}")
    if anywhere:
        return "/" + full.lstrip("/")  # normpath keeps a leading "//"
    if any(full == root or full.startswith(root + "/") for root in FILE_ROOTS):
        return full
    where = f"files are reachable in {WORKSPACE} and {TMP}"
    raise InvalidArgument(field, f"{path[:200]!r} escapes the workspace {WORKSPACE} ({where})")


def file_root(path: str) -> str:
    """The file root a path from file_path lies in (ANY_ROOT: neither)."""
    for root in FILE_ROOTS:
        if path == root or path.startswith(root + "/"):
            return root
    return ANY_ROOT


def file_roots(anywhere: bool) -> tuple[str, ...]:
    """The file roots of a sandbox (``anywhere``: it has a writable root)."""
    return (*FILE_ROOTS, ANY_ROOT) if anywhere else FILE_ROOTS


def exec_user(field: str, user: str) -> str:
    """The empty user (the sandbox's own) or "root"; "0" is taken as "root"."""
    if user in ("", ROOT_USER):
        return user
    if user == "0":
        return ROOT_USER
    raise InvalidArgument(
        field,
        f"{user[:64]!r} is not a user here: '' runs as the sandbox's user, "
        "'root' as uid 0 without capabilities",
    )


def exec_cwd(field: str, cwd: str) -> str:
    """An exec's working directory: "" (the workspace, or a session's own), an
    absolute path (normalised; a command may `cd` anywhere it can read, so an
    absolute cwd confines nothing and is kept), or a path relative to
    /workspace that must stay beneath it: '../../etc' is refused, not run."""
    if not cwd:
        return ""
    if "\x00" in cwd or len(cwd) > MAX_PATH:
        raise InvalidArgument(field, "must be at most 4096 bytes with no NUL")
    if cwd.startswith("/"):
        # normpath keeps a leading "//" (POSIX leaves it implementation-defined).
        return "/" + posixpath.normpath(cwd).lstrip("/")
    full = posixpath.normpath(f"{WORKSPACE}/{cwd}")
    if full == WORKSPACE or full.startswith(WORKSPACE + "/"):
        return full
    raise InvalidArgument(
        field,
        f"{cwd[:200]!r} climbs out of {WORKSPACE} (relative paths are taken from it; "
        "give an absolute path to run elsewhere)",
    )


MAX_COMMAND = 1 << 20
"""Bytes of a shell command, or of an argument vector in all."""
MAX_ARG = (128 << 10) - 1
"""Bytes of one argument: the kernel refuses a longer string to exec
(MAX_ARG_STRLEN, 128 KiB with its NUL). A shell command is not one: it is
handed to bash in pieces."""


def argv(field: str, args: list[str]) -> tuple[str, ...]:
    """A non-empty argument vector with a program name, no NUL, each argument
    under 128 KiB and at most 1 MiB in all (bytes, as UTF-8)."""
    if not args:
        raise InvalidArgument(field, "must not be empty")
    if not args[0]:
        raise InvalidArgument(f"{field}[0]", "program name must not be empty")
    total = 0
    for i, arg in enumerate(args):
        if "\x00" in arg:
            raise InvalidArgument(f"{field}[{i}]", "must not contain NUL")
        size = len(arg.encode("utf-8", "surrogatepass"))
        if size > MAX_ARG:
            raise InvalidArgument(
                f"{field}[{i}]",
                f"{size} bytes; one argument is at most {MAX_ARG} (the kernel's limit); "
                "pass more on stdin, in a file or as a shell command",
            )
        total += size
    if total > MAX_COMMAND:
        raise InvalidArgument(field, f"arguments total {total} bytes, more than 1 MiB")
    return tuple(args)


def shell(field: str, command: str) -> str:
    """A shell command that is not blank, at most 1 MiB (bytes, as UTF-8) with no NUL; returned unchanged."""
    if not command.strip():
        raise InvalidArgument(field, "must not be empty")
    if "\x00" in command:
        raise InvalidArgument(field, "must not contain NUL")
    size = len(command.encode("utf-8", "surrogatepass"))
    if size > MAX_COMMAND:
        raise InvalidArgument(field, f"{size} bytes, more than the {MAX_COMMAND} (1 MiB) a command may have")
    return command
