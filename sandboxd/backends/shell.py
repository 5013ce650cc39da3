"""Shell snippets any exec-capable backend (Docker, Kubernetes) runs inside a
sandbox: quoting, the persistent-session protocol, process-tree kill and tar.

Process trees are found by an environment tag rather than by parent pid:
every process an exec starts inherits ``SANDBOXD_EXEC=<tag>`` (daemonised and
re-parented children too), and ``/proc/<pid>/environ`` shows the environment a
process was started with, so one scan finds the whole tree, even orphans.
"""

from __future__ import annotations

import re

EXEC_TAG_VAR = "SANDBOXD_EXEC"
SESSION_TAG_VAR = "SANDBOXD_SESSION"

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_env_name(name: str) -> bool:
    return bool(_ENV_NAME.match(name))


def ansi_c_quote(text: str) -> str:
    """Quotes text as a bash $'...' word: no fork needed to decode it and any
    byte but NUL survives."""
    out = ["$'"]
    for byte in text.encode("utf-8", "surrogateescape"):
        ch = chr(byte)
        if ch == "\\" or ch == "'":
            out.append("\\" + ch)
        elif 0x20 <= byte < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\x{byte:02x}")
    out.append("'")
    return "".join(out)


def printf_format(data: bytes) -> str:
    """A single-quoted printf format that prints exactly ``data``, NULs included."""
    out = ["'"]
    for byte in data:
        ch = chr(byte)
        if 0x20 <= byte < 0x7F and ch not in "\\%'":
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    out.append("'")
    return "".join(out)


# Kills every process carrying the tag, looping so that children forked while
# we scan are caught on the next pass (a fork bomb cannot outrun it for long).
KILL_BY_TAG = r"""
pat="$1"
i=0
while [ $i -lt 50 ]; do
  pids=$(grep -lxzF -- "$pat" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3)
  [ -z "$pids" ] && exit 0
  kill -KILL $pids 2>/dev/null
  i=$((i+1))
done
exit 1
"""


def kill_argv(tag_var: str, tag: str) -> list[str]:
    return ["sh", "-c", KILL_BY_TAG, "sandboxd-kill", f"{tag_var}={tag}"]


def session_command(
    command: str,
    *,
    tag: str,
    marker: str,
    cwd: str,
    env: dict[str, str],
    stdin: bytes,
) -> bytes:
    """One line for the session shell: runs ``command`` in the shell itself
    (so cd/export persist), with a per-command environment and stdin that do
    not leak into the session, then prints the marker and $? on stdout and
    the marker on stderr so both streams are known to be complete."""
    parts: list[str] = []
    if cwd:
        parts.append(f"cd -- {ansi_c_quote(cwd)} && ")
    assigns = " ".join(f"{k}={ansi_c_quote(v)}" for k, v in env.items())
    parts.append(f"{EXEC_TAG_VAR}={tag} {assigns} eval {ansi_c_quote(command)}")
    if stdin:
        parts.append(f" < <(printf {printf_format(stdin)})")
    else:
        parts.append(" < /dev/null")
    parts.append(f"; printf '%s %d\\n' {marker} $?; printf '%s\\n' {marker} >&2\n")
    return "".join(parts).encode()


# Extract a tar from stdin into $1 as the sandbox user; exit codes say why it failed.
PUT_TAR = r"""
dest="$1"
mkdir -p -- "$dest" 2>/tmp/.sandboxd-err || { cat /tmp/.sandboxd-err >&2; exit 3; }
tar -x --no-same-owner --no-overwrite-dir -C "$dest" -f - 2>/tmp/.sandboxd-err
rc=$?
if [ $rc -ne 0 ]; then
  cat /tmp/.sandboxd-err >&2
  if grep -qE "No space left on device|Wrote only" /tmp/.sandboxd-err; then exit 28; fi
  exit 4
fi
"""

# Tar up $2.. relative to $1, refusing to start when one is missing so the
# caller can name it.
GET_TAR = r"""
base="$1"; shift
cd -- "$base" 2>/dev/null || { printf 'missing:%s\n' "$base" >&2; exit 3; }
for p in "$@"; do
  if [ ! -e "$p" ] && [ ! -L "$p" ]; then printf 'missing:%s\n' "$p" >&2; exit 3; fi
done
exec tar -c -f - -- "$@"
"""


def put_tar_argv(dest: str) -> list[str]:
    """Extracts stdin under ``dest``."""
    return ["sh", "-c", PUT_TAR, "sandboxd-put", dest]


def get_tar_argv(base: str, paths: tuple[str, ...]) -> list[str]:
    return ["sh", "-c", GET_TAR, "sandboxd-get", base, *paths]
