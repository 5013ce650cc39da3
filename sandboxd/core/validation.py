"""Input checks shared by every operation. Each failure names the field."""

from __future__ import annotations

import math
import posixpath
import re

from sandboxd.backends.base import WORKSPACE
from sandboxd.backends.shell import is_env_name
from sandboxd.errors import InvalidArgument

_POOL_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.\-/]{0,126}[A-Za-z0-9])?$")
_SESSION = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/:@]{0,254}$")
_ID = re.compile(r"^[a-z]{2}-[0-9a-f]{6,64}$")
MAX_PATH = 4096
MAX_LABELS = 64


def pool_name(field: str, name: str) -> str:
    if not name:
        raise InvalidArgument(field, "is required")
    if not _POOL_NAME.match(name):
        raise InvalidArgument(
            field, f"{name[:80]!r} is not a valid pool name (lowercase letters, digits and '-', at most 63)"
        )
    return name


def image_ref(field: str, image: str) -> str:
    if not image:
        raise InvalidArgument(field, "is required")
    if not _IMAGE.match(image):
        raise InvalidArgument(field, f"{image[:80]!r} is not a valid image reference")
    return image


def object_id(field: str, value: str, kind: str) -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    if not _ID.match(value):
        # Unknown ids are NOT_FOUND, malformed ones INVALID_ARGUMENT: say which.
        raise InvalidArgument(field, f"{value[:80]!r} is not a {kind} id")
    return value


def labels(field: str, values: dict[str, str]) -> dict[str, str]:
    if len(values) > MAX_LABELS:
        raise InvalidArgument(field, f"at most {MAX_LABELS} labels")
    for key, value in values.items():
        if not _LABEL_KEY.match(key):
            raise InvalidArgument(f"{field}[{key[:40]!r}]", "label keys are 1-128 of [A-Za-z0-9_.-/]")
        if len(value) > 256 or "\x00" in value:
            raise InvalidArgument(f"{field}[{key}]", "label values are at most 256 characters, no NUL")
    return dict(values)


def env(field: str, values: dict[str, str]) -> dict[str, str]:
    for key, value in values.items():
        if not is_env_name(key):
            raise InvalidArgument(f"{field}[{key[:40]!r}]", "is not a valid environment variable name")
        if key.startswith("SANDBOXD_"):
            raise InvalidArgument(f"{field}[{key}]", "names starting with SANDBOXD_ are reserved")
        if "\x00" in value or len(value) > 128 * 1024:
            raise InvalidArgument(f"{field}[{key}]", "values must be under 128 KiB with no NUL")
    return dict(values)


def non_negative(field: str, value: float, maximum: float | None = None) -> float:
    if math.isnan(value) or value < 0:
        raise InvalidArgument(field, f"must be >= 0, got {value}")
    if maximum is not None and value > maximum:
        raise InvalidArgument(field, f"must be <= {maximum:g}, got {value:g}")
    return value


def session_name(field: str, name: str) -> str:
    if name and not _SESSION.match(name):
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


def exec_cwd(field: str, cwd: str) -> str:
    if not cwd:
        return ""
    if "\x00" in cwd or len(cwd) > MAX_PATH:
        raise InvalidArgument(field, "must be at most 4096 bytes with no NUL")
    return posixpath.normpath(cwd if cwd.startswith("/") else f"{WORKSPACE}/{cwd}")


def argv(field: str, args: list[str]) -> tuple[str, ...]:
    if not args:
        raise InvalidArgument(field, "must not be empty")
    if not args[0]:
        raise InvalidArgument(f"{field}[0]", "program name must not be empty")
    for i, arg in enumerate(args):
        if "\x00" in arg:
            raise InvalidArgument(f"{field}[{i}]", "must not contain NUL")
    if sum(len(a) for a in args) > 1 << 20:
        raise InvalidArgument(field, "arguments total more than 1 MiB")
    return tuple(args)


def shell(field: str, command: str) -> str:
    if not command.strip():
        raise InvalidArgument(field, "must not be empty")
    if "\x00" in command or len(command) > 1 << 20:
        raise InvalidArgument(field, "must be at most 1 MiB with no NUL")
    return command
