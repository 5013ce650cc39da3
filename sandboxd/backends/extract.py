"""The extraction script every exec-capable backend (Docker, Kubernetes) runs
in a sandbox for put_tar, and what its exit statuses mean.

It runs as the transfer's user inside the sandbox, so the sandbox's kernel
decides what that user may change; the script only makes the outcome all or
nothing and typed, the same as a host-side write (sandboxd.backends.hostwrite)
answers for the same files:

- the archive is extracted into a fresh staging directory inside the
  destination; a check pass then refuses, before anything moves, a link in
  the way (exit LINK_EXIT), a directory where a file goes (exit
  IS_DIR_EXIT), and a place the user may not create or replace (exit
  DENIED_EXIT: no write and search on its directory, or a sticky directory
  and a file that is neither the user's nor in a directory of the user's);
- the commit pass moves each entry into place, first putting what it
  replaces aside (a hard link where allowed, else a rename) or a marker
  for a new name into a mirror tree in the staging directory; any failure
  (the kernel refusing after all, a full disk) walks that mirror and puts
  every entry back as it was;
- the staging directory is always removed, its read-only directories made
  writable first (a staged directory moves to its new parent only when it
  is writable, and gets its own mode back once there).
"""

from __future__ import annotations

from sandboxd.backends.shell import _LINK_WALK, LINK_EXIT, link_refusal
from sandboxd.errors import (
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    SandboxdError,
)

DENIED_EXIT = 13
"""The user may not create or replace a path (EACCES's number)."""
IS_DIR_EXIT = 21
"""A directory is where a file goes (EISDIR's number)."""
FULL_EXIT = 28
DIR_EXIT = 3

# $1: the destination, walked from / one level at a time, never through a
# link, each missing level made (exit DIR_EXIT when that fails, and removed
# again when the call fails). The staging directory is made in it: the
# caller names the deepest directory the archive's files share, so that
# staging needs no right the files themselves do not. Errors are
# kept in variables, not files: a scratch file in /tmp would be another
# user's after a write as root (or the reverse).
PUT_TAR = (
    _LINK_WALK
    + r"""
dest="$1"
me=$(id -u)
stage=
committing=
first_made=
where() { case $1 in /*) printf '%s' "$1" ;; *) printf '%s/%s' "${dest%/}" "${1#./}" ;; esac; }
denied() { printf 'denied:%s\n%s\n' "$(where "$1")" "$2" >&2; exit 13; }
# $1: a failed command's message, $2: the path, $3: what was being done to
# it, $4: the exit status when it is neither a refusal nor a full disk.
fail() {
  case "$1" in
    *"No space left on device"*|*"Disk quota exceeded"*|*"Wrote only"*) printf '%s\n' "$1" >&2; exit 28 ;;
    *"Permission denied"*|*"Operation not permitted"*|*"Read-only file system"*) denied "$2" "$3" ;;
  esac
  printf '%s\n' "$1" >&2
  exit "${4:-4}"
}
# $1: a mirror directory, $2: its place. Each marker names a new entry (it
# goes), each other file what an entry replaced (it comes back).
undo() {
  local b t bad=0
  for b in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    [ -e "$b" ] || [ -L "$b" ] || continue
    t="$2/${b##*/}"
    if [ -d "$b" ] && [ ! -L "$b" ]; then
      undo "$b" "$t" || bad=1
    elif [ -L "$b" ] && [ "$(readlink -- "$b")" = "$stage" ]; then
      rm -rf -- "$t" || bad=1
    else
      if [ -d "$t" ] && [ ! -L "$t" ]; then rm -rf -- "$t" || bad=1; fi
      mv -f -T -- "$b" "$t" || bad=1
    fi
  done
  return $bad
}
finish() {
  rc=$?
  # A refusal before tar read the archive still takes it all: the sender
  # then sees the exit status, not a broken pipe.
  [ $rc -eq 0 ] || cat >/dev/null 2>&1
  if [ -z "$stage" ]; then
    [ $rc -eq 0 ] || [ -z "$first_made" ] || rm -rf -- "$first_made"
    exit $rc
  fi
  if [ -n "$committing" ] && [ $rc -ne 0 ] && ! undo "$stage/o" .; then
    printf 'could not put everything back: what the upload replaced is kept in %s\n' "$(where "$stage")" >&2
    exit $rc
  fi
  chmod -R u+w -- "$stage" 2>/dev/null
  rm -rf -- "$stage"
  # The levels of $dest this call made go too when it failed.
  [ $rc -eq 0 ] || [ -z "$first_made" ] || rm -rf -- "$first_made"
  exit $rc
}
trap finish EXIT
cd / || exit 3
rest=${dest#/}
while [ -n "$rest" ]; do
  c=${rest%%/*}
  case $rest in */*) rest=${rest#*/} ;; *) rest= ;; esac
  here=$(pwd -P); here=${here%/}
  [ -L "$c" ] && refuse_link "$here/$c"
  if [ ! -d "$c" ]; then
    if err=$(mkdir -- "$c" 2>&1); then
      [ -n "$first_made" ] || first_made="$here/$c"
    else
      [ -d "$c" ] || fail "$err" "$here/$c" "creating the directory" 3
    fi
  fi
  if ! cd -P -- "$c" 2>/dev/null; then
    [ -x "$c" ] || denied "$here/$c" "entering the directory"
    printf 'cannot enter %s\n' "$here/$c" >&2
    exit 3
  fi
  pinned "$here/$c"
done
pinned "$dest"
made=$(mktemp -d ./.sandboxd-put.XXXXXX 2>&1) || fail "$made" "$dest" "creating a file in it"
stage=$made
err=$(mkdir -- "$stage/n" "$stage/o" 2>&1) || fail "$err" "$dest" "creating a file in it"
err=$(tar -x --no-same-owner -C "$stage/n" -f - 2>&1 >/dev/null) ||
  fail "$err" "$dest" "extracting the archive"
# $1: a staged directory, $2: its place (both relative to $dest).
check() {
  local e t
  for e in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    t="$2/${e##*/}"
    if [ -d "$e" ] && [ ! -L "$e" ]; then
      [ -L "$t" ] && refuse_link "$(where "$t")"
      if [ -d "$t" ]; then
        [ -x "$t" ] || denied "$t" "entering the directory"
        check "$e" "$t"
        continue
      fi
    elif [ -d "$t" ] && [ ! -L "$t" ]; then
      printf '%s is a directory: a file cannot take its place\n' "$(where "$t")" >&2
      exit 21
    fi
    if ! { [ -w "$2" ] && [ -x "$2" ]; }; then
      { [ -d "$e" ] && [ ! -L "$e" ]; } && denied "$t" "creating the directory"
      denied "$2" "creating a file in it"
    fi
    if [ -k "$2" ] && { [ -e "$t" ] || [ -L "$t" ]; } && [ ! -O "$2" ] &&
      [ "$(stat -c %u -- "$t")" != "$me" ]; then
      denied "$t" "replacing it: its directory is sticky and neither is the user's"
    fi
  done
}
# $1: a staged directory, $2: its place, $3: its mirror.
commit() {
  local e t b m
  for e in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    t="$2/${e##*/}"
    b="$3/${e##*/}"
    if [ -d "$e" ] && [ ! -L "$e" ] && [ -d "$t" ] && [ ! -L "$t" ]; then
      err=$(mkdir -- "$b" 2>&1) || fail "$err" "$dest" "staging"
      # Its entries leave it; it is removed with the staging directory.
      [ -w "$e" ] || chmod u+w -- "$e" || exit 4
      commit "$e" "$t" "$b"
      continue
    fi
    if [ -e "$t" ] || [ -L "$t" ]; then
      # A hard link keeps the old file in place until the rename replaces
      # it; a directory taking a file's place needs the name free.
      if { [ -d "$e" ] && [ ! -L "$e" ]; } || ! ln -P -- "$t" "$b" 2>/dev/null; then
        err=$(mv -f -T -- "$t" "$b" 2>&1) || fail "$err" "$t" "replacing it"
      fi
    else
      err=$(ln -s -- "$stage" "$b" 2>&1) || fail "$err" "$dest" "staging"
    fi
    m=
    if [ -d "$e" ] && [ ! -L "$e" ] && [ ! -w "$e" ]; then
      m=$(stat -c %a -- "$e") && chmod u+w -- "$e" || exit 4
    fi
    err=$(mv -f -T -- "$e" "$t" 2>&1) || fail "$err" "$t" "creating or replacing it"
    if [ -n "$m" ]; then
      err=$(chmod -- "$m" "$t" 2>&1) || fail "$err" "$t" "setting its mode"
    fi
  done
}
check "$stage/n" .
committing=1
commit "$stage/n" . "$stage/o"
committing=
"""
)


def put_tar_argv(dest: str) -> list[str]:
    """Extracts stdin under ``dest``."""
    return ["sh", "-c", PUT_TAR, "sandboxd-put", dest]


def put_refusal(code: int | None, dest: str, message: str) -> SandboxdError | None:
    """What PUT_TAR's exit status ``code`` (its stderr in ``message``)
    means; None for success. ``code`` None (no status) is the caller's."""
    if code == 0 or code is None:
        return None
    if code == FULL_EXIT:
        return ResourceExhausted(f"workspace is full (bytes or files): {message}")
    if code == DENIED_EXIT:
        lines = message.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("denied:"):
                why = lines[i + 1] if i + 1 < len(lines) else "refused"
                return PermissionDenied(f"{line[7:]}: permission denied ({why})")
        return PermissionDenied(f"permission denied under {dest}: {message}")
    if code == IS_DIR_EXIT:
        return FailedPrecondition(message)
    if code == DIR_EXIT:
        return InvalidArgument("path", f"cannot create directory {dest!r}: {message}")
    if code == LINK_EXIT:
        return InvalidArgument("path", f"refused to write under {dest}: {link_refusal(message)}")
    return InvalidArgument("tar", f"extraction failed: {message or f'exit {code}'}")
