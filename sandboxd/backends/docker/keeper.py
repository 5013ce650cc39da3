"""The keeper: what a gVisor sandbox runs instead of ``sleep infinity``, and
the kept shells it starts.

gVisor's restore brings back the container's init tree only: it kills every
process whose lineage began with an engine exec (the sentry marks a task's
origin when it is created and a fork inherits it, whatever the task's parent
is later), so a shell started by an exec, and whatever it forked, daemonised
or re-parented, is gone after a restore (measured with runsc under Docker
20.10). So a gVisor sandbox's init process runs a shell that reads lines
from a FIFO (KEEP_VAR names it inside the sandbox) and starts each one as a
process of that tree: ``echo 'python3 server.py' > "$SANDBOXD_KEEP"``.

Every shell of the control plane's in such a sandbox (sessions, and the idle
shells that fork one-shot commands) is kept too: RELAY, started by an exec,
has the keeper start the shell on FIFOs of the sandbox's own /tmp (a pipe of
the sentry's, which a checkpoint carries with what is buffered in it) and
pumps those to and from its stream. A restore kills the relay only; the
shell, its jobs and its state (cwd, variables, functions) go on, and a new
relay attaches to it by the shell's key (its session's name).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sandboxd.backends.layout import WORKSPACE
from sandboxd.backends.shell import SESSION_SHELL, ansi_c_quote, is_env_name

KEEP_FIFO = "/tmp/.sandboxd-keep"
"""The keeper's FIFO inside a gVisor sandbox."""

KEPT_VAR = "SANDBOXD_KEPT"
"""In a kept shell's environment (its key): what it and its children run is
carried by a live snapshot, whatever their tags say."""

RELAY_VAR = "SANDBOXD_RELAY"
"""In a relay's environment: its processes are the control plane's plumbing."""


def keeper_command(fifo: str = KEEP_FIFO, workspace: str = WORKSPACE) -> list[str]:
    """The container's command. The FIFO is opened read-write, so the keeper
    never sees end-of-file between writers; each line runs in ``workspace``
    in a subshell of its own with its output discarded (a kept process
    writes its own files), its own process group (job control: a ``kill 0``
    in it reaches neither the keeper nor the other kept processes). No
    program is started for it: each costs 15-20 ms under gVisor. The kept
    shells' directory is made first, with the FIFOs of the first one
    (FIRST_KEY), which starts before any line is read. Without a FIFO (a
    full /tmp) the sandbox still idles like any other (/tmp is a fresh
    tmpfs: nothing is in the way)."""
    first = _start(FIRST_KEY, SESSION_SHELL, workspace, {KEPT_VAR: FIRST_KEY}, announce=False)
    return [
        "bash",
        "-c",
        f's=${{0%/*}}/.sandboxd-shells; d=$s/{FIRST_KEY}; mkdir -m 700 "$s"; '
        'mkfifo -m 600 "$0" "$d.in" "$d.out" "$d.err" "$d.rc" || exec sleep infinity; '
        'exec 3<>"$0" 2>/dev/null; set -m; '
        f'(exec 3<&-; cd {workspace} && eval "$1") </dev/null >/dev/null 2>&1 & '
        f'while IFS= read -r line <&3; do (exec 3<&-; cd {workspace} && eval "$line") '
        "</dev/null >/dev/null 2>&1 & done",
        fifo,
        first,
    ]


FIRST_KEY = "r-0"
"""The idle shell the keeper starts with the sandbox, before any exec could:
the spare's (its health check) attaches to it."""


# Each kept shell has files .sandboxd-shells/<key>.* beside the keeper's
# FIFO: FIFOs in, out, err and rc (its exit status), pid, start.
#
# RELAY runs as the stream's process, with the shell's environment plus
# RELAY_VAR. $1: "new" or "attach"; $2: the shell's key; $3: START (below);
# the rest: the shell's command line (REAPER's), run in place where there is
# no keeper (or a bash too old for `wait -n PID`), as an engine exec's shell
# always was. On the way to a new shell only mkfifo and the pumps are
# programs started.
#
# "attach" finds a shell of that key alive (its pid's environment carries
# the key) and prints its pid, as REAPER would have; otherwise (and for
# "new", which first kills what a lost stream left under that key) it
# makes the FIFOs and has the keeper run START, whose shell then prints
# its pid through them. Then three pumps: stdout and stderr until the
# shell and whatever inherited them have closed them, stdin until the
# control plane closes it. The shell holds each FIFO read-write, so no
# relay's end (nor a restore killing the relay) ends or breaks it. Stdout
# ending first means the shell is gone: the relay exits with its status.
# Stdin ending first means the session is closed: the shell is told to
# exit, which it does once its command (if any) has ended, as a shell does
# at the end of its input; the relay waits for that, not for the jobs that
# hold its stdout.
RELAY = r"""
k=$SANDBOXD_KEEP; d=${k%/*}/.sandboxd-shells/$2; start=$3; mode=$1; shift 3
mine() {
  local e
  [ -n "$1" ] || return 1
  while IFS= read -r -d '' e; do
    [ "$e" = "SANDBOXD_KEPT=${d##*/}" ] && return 0
  done 2>/dev/null < "/proc/$1/environ"
  return 1
}
# A sandbox's first shell may start before its keeper has made the FIFO.
n=0
while [ -n "$k" ] && [ ! -p "$k" ] && [ $n -lt 100 ]; do sleep 0.02; n=$((n + 1)); done
p= new=
{ read -r p < "$d.pid"; } 2>/dev/null
# A shell the keeper is still starting (FIRST_KEY) records its pid soon.
while [ "$mode" = attach ] && [ -p "$d.out" ] && ! mine "$p" && [ $n -lt 100 ]; do
  sleep 0.02; n=$((n + 1)); { read -r p < "$d.pid"; } 2>/dev/null
done
if [ "$mode" = attach ] && [ -p "$d.out" ] && mine "$p"; then
  echo "$p"
elif [ -n "$k" ] && [ -p "$k" ] && [ -w "$k" ] && [ -d "${d%/*}" ] && [ "${BASH_VERSINFO[0]}" -ge 5 ] \
    && { [ "${BASH_VERSINFO[0]}" -gt 5 ] || [ "${BASH_VERSINFO[1]}" -ge 1 ]; }; then
  mine "$p" && kill -KILL "$p" 2>/dev/null
  [ ! -e "$d.out" ] || rm -f "$d".*
  if ! { mkfifo -m 600 "$d.in" "$d.out" "$d.err" "$d.rc" && printf '%s\n' "$start" > "$d.start"; } \
      2>/dev/null; then
    rm -f "$d".*; exec "$@"
  fi
  new=1
else
  exec "$@"
fi
# Each pump opens its FIFO itself (an open waits for the other end): they
# start while the keeper starts the shell.
exec 5<>"$d.rc" 6<&0 0</dev/null
cat <"$d.err" >&2 5<&- 6<&- & e=$!
cat <&6 >"$d.in" 5<&- & i=$!
cat <"$d.out" 5<&- 6<&- & o=$!
exec 6<&-
if [ -n "$new" ] && ! printf '. %s.start\n' "$d" > "$k"; then
  kill "$o" "$e" "$i" 2>/dev/null; rm -f "$d".*; exit 125
fi
wait -n "$o" "$i"
if kill -0 "$o" 2>/dev/null; then
  printf 'exit\n' 1<>"$d.in"
  c=
  read -r c <&5
  kill "$o" "$e" 2>/dev/null
  rm -f "$d".*
  exit "${c:-255}"
fi
wait "$e"
kill "$i" 2>/dev/null
c=
read -t 10 -r c <&5
rm -f "$d".*
exit "${c:-255}"
"""

# What the keeper sources for a new kept shell (<key>.start): the shell in a
# subshell on the FIFOs, printing its pid first (as REAPER would: the
# shell's children are found by tag and parentage, a subreaper would cost
# an interpreter's start), its pid recorded, its exit status written to rc
# (which this process holds read-write, so the write never blocks).
_START = """d=${{SANDBOXD_KEEP%/*}}/.sandboxd-shells/{key}
exec 5<>"$d.rc"
(
exec 0<>"$d.in" 1<>"$d.out" 2<>"$d.err" 5<&-
cd {cwd} || exit 1
{exports}
{announce}
exec {argv}
) &
echo $! > "$d.pid"
wait $!
echo $? >&5
"""


def relay_argv(
    key: str, argv: Sequence[str], *, in_place: Sequence[str], env: Mapping[str, str], cwd: str, attach: bool
) -> list[str]:
    """RELAY for the shell ``argv`` kept under ``key`` ([A-Za-z0-9-]),
    started in ``cwd`` with ``env`` added, or attached to where it runs
    already; ``in_place`` (whose first stdout line is its pid: REAPER's)
    where it cannot be kept."""
    exports = {name: value for name, value in env.items() if is_env_name(name)}
    exports[KEPT_VAR] = key
    return [
        "bash",
        "-c",
        RELAY,
        "sandboxd-relay",
        "attach" if attach else "new",
        key,
        _start(key, argv, cwd, exports),
        *in_place,
    ]


def _start(key: str, argv: Sequence[str], cwd: str, exports: Mapping[str, str], announce: bool = True) -> str:
    return _START.format(
        key=key,
        cwd=ansi_c_quote(cwd),
        exports="export " + " ".join(f"{name}={ansi_c_quote(value)}" for name, value in exports.items()),
        announce="echo $BASHPID" if announce else ":",
        argv=" ".join(ansi_c_quote(a) for a in argv),
    )


def session_key(name: str) -> str:
    """The key of a named session's kept shell: its name, in hex (found by
    it after a restore)."""
    return "s-" + name.encode().hex()


# After a restore: the idle shells of the image (keys "r-...") are killed
# (their jobs go on, as children of the keeper), and the named sessions'
# keys are printed, one per line, for their sessions to attach to.
AFTER_RESTORE = """
for f in "${SANDBOXD_KEEP%/*}"/.sandboxd-shells/r-*.pid; do
  [ -e "$f" ] || continue
  p=
  { read -r p < "$f"; } 2>/dev/null
  [ -n "$p" ] && kill -KILL "$p" 2>/dev/null
  rm -f "${f%.pid}".*
done
for f in "${SANDBOXD_KEEP%/*}"/.sandboxd-shells/s-*.out; do
  [ -p "$f" ] && f=${f##*/} && printf '%s\\n' "${f%.out}"
done
true
"""


def parse_session_keys(text: str) -> set[str]:
    """The session names AFTER_RESTORE printed."""
    names = set()
    for line in text.split():
        if line.startswith("s-"):
            try:
                names.add(bytes.fromhex(line[2:]).decode())
            except ValueError:
                continue
    return names


KEEPER_COMMAND = keeper_command()
