"""Shell snippets the snapshot core runs inside a sandbox through the
ordinary exec path (one-shot or in a session): list the workspace with the
metadata change detection needs, capture a session's cwd and exported
environment, and re-apply them after a restore.

Each script starts with a marker comment line, so an adapter without a real
shell (the fake backend) can recognise and emulate it.
"""

from __future__ import annotations

from collections.abc import Mapping

from sandboxd.backends.base import WORKSPACE
from sandboxd.backends.shell import ansi_c_quote, tar_create

LIST_MARKER = "# sandboxd:list"
STATE_MARKER = "# sandboxd:session-state"
SESSION_STATE_MARKER = "# sandboxd:session-only"
RESTORE_MARKER = "# sandboxd:restore"
TAR_MARKER = "# sandboxd:tar"
DELTA_MARKER = "# sandboxd:delta"
STATE_DELTA_MARKER = "# sandboxd:state-delta"
RECORDS_MARKER = "# sandboxd:records"
OWNED_ROUND_MARKER = "# sandboxd:owned-round"
SUBLIST_MARKER = "# sandboxd:sublist"

# The listing starts with the sandbox's clock (NUL-terminated), then one
# record per entry below the workspace: "type mode size mtime ctime uid gid" NUL
# path NUL link-target NUL. ctime cannot be set from user space, so an entry
# whose (size, mtime, ctime) is unchanged since a listing is unchanged.
LIST_FORMAT = r"%y %m %s %T@ %C@ %U %G\0%P\0%l\0"

# A directory the listing user may not list is recorded, then "X" + its name
# (NUL-terminated) and not descended into: its owner (the sandbox user or
# root) lists it next (SUBLIST_SCRIPT), or the snapshot is refused naming it.
_DENIED = "\\( -type d ! \\( -readable -executable \\) -printf 'X{name}\\0' -prune \\)"


def _tolerant(find: str, also: str = "") -> str:
    """``find`` (a command line) in the workspace, with entries that vanish
    while it walks left out instead of failing the listing (the sandbox
    may be changing its files), and errors matching the extended regular
    expression ``also``; any other error still fails it."""
    ok = "No such file or directory" + (f"|{also}" if also else "")
    return (
        f'(cd {WORKSPACE} && e=/tmp/.sandboxd-find-$(id -u) && {find} 2>"$e"; rc=$?; '
        f"if [ $rc -ne 0 ] && grep -qvE '{ok}' \"$e\"; "
        'then cat "$e" >&2; exit $rc; fi)'
    )


_LIST = "printf '%s\\0' \"$(date +%s.%N)\"; " + _tolerant(
    f"find . -ignore_readdir_race -mindepth 1 -printf '{LIST_FORMAT}' , {_DENIED.format(name='%P')}"
)

# Outside the workspace (a tmpfs with the same clock), so snapshots never see it.
CUTOFF_FILE = "/tmp/.sandboxd-restored"

# Variables every session has that belong to the shell, not to the rollout.
SHELL_OWNED = ("PWD", "OLDPWD", "SHLVL", "_")

LIST_SCRIPT = f"{LIST_MARKER}\n{_LIST}\n"
# A session's cwd, its exported environment closed by an empty record, then
# the listing: one round trip through the (cheap) session instead of two.
_STATE = "printf '%s\\0' \"$PWD\"; env -0; printf '\\0'; "
STATE_SCRIPT = f"{STATE_MARKER}\n{_STATE}{_LIST}\n"
# Only the session's state, for a workspace the control plane lists itself.
SESSION_STATE_SCRIPT = f"{SESSION_STATE_MARKER}\n{_STATE}\n"


def delta_script(since: float, *, session: bool) -> str:
    """Like LIST_SCRIPT (or STATE_SCRIPT with ``session``), but in one walk:
    "R" + a full record for each entry whose ctime is after ``since``, "N" +
    the bare name (NUL-terminated) for every other. Whatever has no record
    has not changed since ``since``, and the names tell what was deleted, so
    what is parsed and compared follows the change, not the workspace."""
    marker = STATE_DELTA_MARKER if session else DELTA_MARKER
    body = "printf '%s\\0' \"$(date +%s.%N)\"; " + _tolerant(
        f"find . -ignore_readdir_race -mindepth 1 "
        f"\\( \\( -newerct '@{since:.9f}' -printf 'R{LIST_FORMAT}' \\) -o -printf 'N%P\\0' \\) "
        f", {_DENIED.format(name='%P')}"
    )
    return f"{marker}\n{_STATE if session else ''}{body}\n"


# LIST_SCRIPT's format for the paths named on stdin (NUL-separated, relative
# to the workspace): entries a delta listing names but has no record of
# (a directory moved in keeps its children's ctimes).
RECORDS_SCRIPT = (
    f"{RECORDS_MARKER}\nprintf '%s\\0' \"$(date +%s.%N)\"; "
    + _tolerant(f"find -files0-from - -maxdepth 0 -printf '{LIST_FORMAT.replace('%P', '%p')}'")
    + "\n"
)

# LIST_SCRIPT's format for what lies below the directories named on stdin
# (NUL-separated, relative to the workspace, as "./dir"), run by a user who
# may list them (another was denied them).
SUBLIST_SCRIPT = (
    f"{SUBLIST_MARKER}\nprintf '%s\\0' \"$(date +%s.%N)\"; "
    + _tolerant(
        f"find -files0-from - -ignore_readdir_race -mindepth 1 -printf '{LIST_FORMAT.replace('%P', '%p')}' "
        f", {_DENIED.format(name='%p')}",
        # A directory this user cannot reach either stays unlisted (refused later, named).
        also="Permission denied",
    )
    + "\n"
)

# A tar of the files named on stdin (NUL-separated, relative to the
# workspace), for small change sets read through a session: no exec start.
# A file appended to meanwhile is stored as tar first found it (tar_create).
TAR_SCRIPT = f"{TAR_MARKER}\n(cd {WORKSPACE} || exit 1\n{tar_create('--null --no-recursion -T -')})\n"

# In a subshell in the C locale: names are bytes (owned_round_script says
# why), and the session keeps its own locale.
_FIXUP = (
    "(export LC_ALL=C; while IFS= read -r -d '' __sbxd_m && IFS= read -r -d '' __sbxd_p; do "
    f'chmod "$__sbxd_m" -- "{WORKSPACE}/$__sbxd_p"; done)'
)


# The restore's *cutoff*: the ctime of a file touched after everything was
# written (NUL-terminated). The kernel stamps ctime on every change and user
# space cannot set it, so a restored file whose ctime is still below the
# cutoff is exactly what the restore wrote, and the next snapshot need not
# read it; no listing of the whole workspace is needed here. A file changed
# within the same clock tick has a ctime equal to the cutoff and is re-read.
_CUTOFF = f": > {CUTOFF_FILE} && find {CUTOFF_FILE} -maxdepth 0 -printf '%C@\\0'"


def owned_round_script(*, first: bool, extract: bool = True) -> str:
    """One round of a restore whose entries have several owners
    (sandboxd.core.snapshots.owners), run by the round's actor: stdin holds
    (mode, path) pairs, NUL-separated and closed by an empty record, then a
    tar extracted into the workspace (exit 28: it does not fit); then each
    mode is set, in order. ``first``: the round that opens the workspace's
    top to the other actor, printing its mode first (restore_script's
    ``top_mode`` sets it back). Without ``extract`` no tar follows (tar
    refuses an archive of no members)."""
    # Bytes, not characters: in a UTF-8 locale read takes a byte that
    # starts a character together with what follows it (the tar, a NUL).
    lines = [OWNED_ROUND_MARKER, "export LC_ALL=C"]
    if first:
        lines.append(f"find {WORKSPACE} -maxdepth 0 -printf '%m' && chmod 0777 {WORKSPACE} || exit 4")
    lines += [
        "__sbxd_m=(); __sbxd_p=()",
        "while IFS= read -r -d '' __sbxd_a && [ -n \"$__sbxd_a\" ]; do "
        'IFS= read -r -d \'\' __sbxd_b || exit 4; __sbxd_m+=("$__sbxd_a"); __sbxd_p+=("$__sbxd_b"); done',
    ]
    if extract:
        lines.append(
            f"__sbxd_e=$(tar -x --no-same-owner -C {WORKSPACE} -f - 2>&1 >/dev/null) || "
            "{ printf '%s\\n' \"$__sbxd_e\" >&2; "
            'case "$__sbxd_e" in *"No space left on device"*|*"Wrote only"*) exit 28;; esac; exit 4; }'
        )
    lines += [
        'for __sbxd_i in "${!__sbxd_m[@]}"; do '
        f'chmod "${{__sbxd_m[$__sbxd_i]}}" -- "{WORKSPACE}/${{__sbxd_p[$__sbxd_i]}}" || exit 4; done',
    ]
    return "\n".join(lines) + "\n"


def restore_script(
    *,
    fixups: bool,
    cwd: str = "",
    env: Mapping[str, str] | None = None,
    archive: str = "",
    top_mode: str = "",
) -> str:
    """Extracts ``archive`` (a tar readable in the sandbox; empty: the files
    are already there) into the workspace (exit 28: it does not fit),
    re-applies modes the extracting user's umask dropped (pairs of mode and
    path on stdin, NUL-separated), prints the restore's cutoff (taken before
    the environment changes, so it sees a fresh PATH), then sets the
    session's exported environment to exactly ``env`` (None: leave it) and
    changes to ``cwd`` (empty: stay). ``top_mode``: the workspace's own
    mode, set back after an owned_round_script opened it."""
    lines = [RESTORE_MARKER]
    if archive:
        lines.append(
            f"tar -x --no-same-owner --no-overwrite-dir -C {WORKSPACE} -f {ansi_c_quote(archive)} "
            "2>/tmp/.sandboxd-err || { cat /tmp/.sandboxd-err >&2; "
            'grep -qE "No space left on device|Wrote only" /tmp/.sandboxd-err && exit 28; exit 4; }'
        )
    if fixups:
        lines.append(_FIXUP)
    if top_mode:
        lines.append(f"chmod {int(top_mode, 8):o} -- {WORKSPACE}")
    lines.append(_CUTOFF)
    if env is not None:
        keep = "|".join(["SANDBOXD_*", *SHELL_OWNED, *env])
        lines.append(
            'for __sbxd_v in $(compgen -e); do case "$__sbxd_v" in '
            f'{keep}) ;; *) unset "$__sbxd_v";; esac; done; unset __sbxd_v'
        )
        if env:
            lines.append("export " + " ".join(f"{k}={ansi_c_quote(v)}" for k, v in env.items()))
    if cwd:
        lines.append(f"cd -- {ansi_c_quote(cwd)} 2>/dev/null || true")
    return "\n".join(lines) + "\n"
