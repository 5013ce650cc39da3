"""Shell snippets any exec-capable backend (Docker, Kubernetes) runs inside a
sandbox: quoting, the persistent-session protocol, process-tree kill and tar.

A command's processes are found whatever it does to its environment:

- by parentage: each exec stream's first process (a session's shell, a
  one-shot command) starts as a child subreaper (REAPER), so a process that
  detaches (``setsid``, a double fork) is re-parented to it instead of to the
  sandbox's PID 1 and stays its descendant;
- by an environment tag, as a first pass: every process an exec starts
  inherits ``SANDBOXD_EXEC=<tag>`` unless it clears it, and
  ``/proc/<pid>/environ`` shows the environment it was started with, so a
  scan also finds those whose subreaper died first.

TREE_KILL does both. Where the control plane sees the sandbox's cgroups
(Docker on the engine's host), each stream gets a cgroup of its own instead
(GATE), which nothing inside the sandbox can leave.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from sandboxd.backends.layout import WORKSPACE

EXEC_TAG_VAR = "SANDBOXD_EXEC"
SESSION_TAG_VAR = "SANDBOXD_SESSION"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_env_name(name: str) -> bool:
    """Whether ``name`` can be an environment variable's name in a shell."""
    # Whole-string match: `$` alone also matches before a trailing newline,
    # and "A\n" would split the shell line it is put on.
    return _ENV_NAME.fullmatch(name) is not None


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


STDIN_PIECE = 64 << 10
"""Bytes of a command's stdin per frame after its line (see session_command)."""


def stdin_frames(data: bytes) -> bytes:
    """``data`` as a session shell reads it after a command's line: pieces of
    at most STDIN_PIECE bytes, each sent as its length (8 digits) and a
    printf format that prints it exactly (only NUL, backslash and percent
    escaped: a shell variable holds any other byte), then "00000000"."""
    out: list[bytes] = []
    for i in range(0, len(data), STDIN_PIECE):
        piece = data[i : i + STDIN_PIECE].replace(b"\\", b"\\\\").replace(b"%", b"%%")
        piece = piece.replace(b"\x00", b"\\000")
        out.append(b"%08d" % len(piece) + piece)
    out.append(b"00000000")
    return b"".join(out)


# Reads the frames of stdin_frames into an array, from the shell's own
# input, before the command runs: the command's stdin is then a pipe the
# shell fills from memory, so nothing the command does (exit at once, read
# half) can leave bytes of it on the shell's input to be read as commands.
# Sent inline as one printf format on the line, stdin was copied over and
# over as eval expanded it (600 MiB of shell memory for 8 MiB of binary
# stdin): the sandbox ran out of memory and the command read nothing.
_READ_STDIN = (
    '__sbx_in=(); __sbx_k=0; while LC_ALL=C IFS= read -r -N 8 __sbx_n && [ "$__sbx_n" != 00000000 ]; do '
    'LC_ALL=C IFS= read -r -N "$((10#$__sbx_n))" "__sbx_in[__sbx_k]" && __sbx_k=$((__sbx_k + 1)); done; '
    "unset __sbx_n __sbx_k; "
)
_FEED_STDIN = ' < <(LC_ALL=C; for __sbx_c in "${__sbx_in[@]}"; do printf -- "$__sbx_c"; done 2>/dev/null)'


MAX_ARG = (128 << 10) - 1
"""Bytes of one argument the kernel passes to a program (MAX_ARG_STRLEN, its NUL aside)."""
_ARG_PIECE = 32_000
"""Characters per argument when a command is handed to bash in pieces (at most 4 bytes each)."""
_JOIN_ARGS = (
    '__sbx_c=; for __sbx_p; do __sbx_c+=$__sbx_p; done; set --; unset __sbx_p; eval "unset __sbx_c; $__sbx_c"'
)


SCRIPT_ON_STDIN = 64 << 10
"""Bytes past which a one-shot shell command on a stream of its own reaches
bash on its stdin, ahead of the command's own stdin: Kubernetes carries an
exec's arguments in the request's URL, which its API server caps."""
# bash reads exactly the script's bytes off a pipe (read -N takes no more
# than it is asked for), so what follows is the command's stdin untouched.
_READ_SCRIPT = 'LC_ALL=C IFS= read -r -N {n} __sbx_c || exit 126; eval "unset __sbx_c; $__sbx_c"'


def oneshot_argv(command: str) -> tuple[list[str], bytes]:
    """(argv, bytes to send before the command's stdin) that run ``command``
    as a process of its own: ``bash -c`` for a short one; a long one is read
    by bash from its stdin first."""
    script = command.encode("utf-8", "surrogateescape")
    if len(script) <= SCRIPT_ON_STDIN:
        return ["bash", "-c", command], b""
    return ["bash", "-c", _READ_SCRIPT.format(n=len(script))], script


def bash_argv(command: str) -> list[str]:
    """bash running ``command``: ``bash -c command`` where it fits in one
    argument; a longer one (the API takes 1 MiB) in pieces that bash joins
    and evaluates, as one string past MAX_ARG would fail the exec with
    "Argument list too long"."""
    if len(command) * 4 <= MAX_ARG or len(command.encode("utf-8", "surrogateescape")) <= MAX_ARG:
        return ["bash", "-c", command]
    pieces = [command[i : i + _ARG_PIECE] for i in range(0, len(command), _ARG_PIECE)]
    return ["bash", "-c", _JOIN_ARGS, "bash", *pieces]


@dataclass(frozen=True)
class Tree:
    """The processes one kill must end: those tagged ``tag_var=tag`` and
    everything below them, and the stream's first process (its root) and
    everything below it, or with ``keep_root`` only the root's children
    that started with the command."""

    tag_var: str
    tag: str
    keep_root: bool = False
    """Spare the root: it is the session shell the command ran in."""
    since: str = ""
    """With ``keep_root``: where the previous command ended, as the shell
    printed it: the sandbox's clock (/proc/uptime) and the last pid its pid
    namespace handed out. The root's children forked since are the
    command's (what it left behind is re-parented to the root); older ones
    are earlier commands'. "": the first command, so since the root started."""

    @property
    def pattern(self) -> str:
        """The ``NAME=value`` entry the tagged processes' environment holds."""
        return f"{self.tag_var}={self.tag}"


# Ends a Tree from inside the sandbox, with builtins but for one grep per
# round. Each round adds the tagged processes and every child of a process
# already found (and, keeping the root, the root's children forked since $4:
# started after its clock, or within the same tick with a pid above the one
# it names), and stops what it found: stopped processes cannot fork, so the
# set stops growing, and what a victim forked meanwhile is its child, found
# in the next round. Then one SIGKILL each. A zombie is already dead; a stat line
# is "pid (comm) state ppid ..." with field 22, the start time, in clock
# ticks (USER_HZ, 100 on every Linux architecture sandboxes run on).
TREE_KILL = r"""
pat=$1; root=$2; keep=$3; since=${4%% *}; after=${4##* }
ticks=-1
case $since in
  *[!0-9.]* | *.*.*) ;;
  [0-9]*.[0-9][0-9]) ticks=$(( ${since%.*} * 100 + 1${since#*.} - 100 )) ;;
esac
case $after in '' | *[!0-9]*) after=-1 ;; esac
case $root in '' | *[!0-9]*) root=0 ;; esac
if [ "$ticks" -lt 0 ] && [ "$keep" = 1 ] && [ "$root" -gt 0 ]; then
  { read -r line </proc/$root/stat; } 2>/dev/null && set -- ${line##*") "} && ticks=${20:--1}
  after=$root
fi
me=$$; victims=' '; rounds=0; new=
[ "$root" -gt 0 ] && [ "$keep" != 1 ] && { victims=" $root "; new=" $root"; }
while :; do
  for p in $(grep -lxzF -- "$pat" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do
    [ "$keep" = 1 ] && [ "$p" = "$root" ] && continue
    case $victims in *" $p "*) ;; *) victims="$victims$p "; new="$new $p" ;; esac
  done
  grew=1
  while [ -n "$grew" ]; do
    grew=
    for f in /proc/[0-9]*/stat; do
      p=${f#/proc/}; p=${p%/stat}
      case $victims in *" $p "*) continue ;; esac
      [ "$p" = "$me" ] && continue
      [ "$keep" = 1 ] && [ "$p" = "$root" ] && continue
      line=
      { read -r line <"$f"; } 2>/dev/null || continue
      set -- ${line##*") "}
      [ "$1" = Z ] && continue
      case $victims in
        *" $2 "*) ;;
        *)
          [ "$keep" = 1 ] && [ "$root" -gt 0 ] && [ "$2" = "$root" ] || continue
          [ "$ticks" -ge 0 ] || continue
          if [ "${20}" -gt "$ticks" ]; then :
          elif [ "${20}" = "$ticks" ] && [ "$after" -ge 0 ] && [ "$p" -gt "$after" ]; then :
          else continue
          fi ;;
      esac
      victims="$victims$p "; new="$new $p"; grew=1
    done
  done
  [ -n "$new" ] && kill -STOP $new 2>/dev/null
  rounds=$((rounds + 1))
  { [ -z "$new" ] || [ $rounds -ge 50 ]; } && break
  new=
done
[ "$victims" = ' ' ] || kill -KILL $victims 2>/dev/null
exit 0
"""


def tree_kill_argv(tree: Tree, root: int) -> list[str]:
    """TREE_KILL for ``tree`` in a stream whose first process is ``root``
    (its pid in the sandbox; 0 when unknown)."""
    keep = "1" if tree.keep_root else "0"
    return ["sh", "-c", TREE_KILL, "sandboxd-kill", tree.pattern, str(root), keep, tree.since]


# The wrapper every exec stream starts in where the control plane cannot see
# the sandbox's cgroups: prints its pid (the stream's root, which TREE_KILL
# needs), makes itself a child subreaper (PR_SET_CHILD_SUBREAPER = 36; it
# survives exec) and execs the command in place, so the pid is the
# command's. Subreaper through perl's syscall (about 3 ms; prctl's number per
# architecture), else python3's ctypes (about 11 ms), else none: then only
# the tag and the parentage at kill time find the tree.
_SUBREAPER_PERL = (
    'open(my $f, "<", "/proc/sys/kernel/arch"); my $m = <$f> // ""; chomp $m;'
    " my %nr = (x86_64 => 157, aarch64 => 167, riscv64 => 167);"
    " syscall($nr{$m}, 36, 1, 0, 0, 0) if $nr{$m};"
    ' exec { $ARGV[0] } @ARGV; print STDERR "$ARGV[0]: $!\\n"; exit 127;'
)
_SUBREAPER_PYTHON = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)\n"
    "try:\n"
    "    os.execvp(sys.argv[1], sys.argv[1:])\n"
    "except OSError as e:\n"
    "    sys.stderr.write(f'{sys.argv[1]}: {e.strerror}\\n')\n"
    "    sys.exit(127)\n"
)
REAPER = r"""
echo $$
perl=$1; python=$2
shift 2
command -v perl >/dev/null 2>&1 && exec perl -e "$perl" -- "$@"
command -v python3 >/dev/null 2>&1 && exec python3 -I -S -c "$python" "$@"
exec "$@"
"""


def reaper_argv(argv: list[str]) -> list[str]:
    """``argv`` as the root of a stream: REAPER first (its pid comes out as
    the first line of stdout)."""
    return ["sh", "-c", REAPER, "sh", _SUBREAPER_PERL, _SUBREAPER_PYTHON, *argv]


# Where the control plane moves the stream's first process into a cgroup of
# its own from outside (Docker on the engine's host): prints its pid and
# waits for a line on stdin (the go-ahead, once it has been moved), then
# execs the command in place. Named "sh" so that a command not found reads
# like any shell's complaint.
GATE = 'echo $$; read -r _ || exit 126; exec "$@"'


def gate_argv(argv: list[str]) -> list[str]:
    """``argv`` behind GATE (its pid is the first line of stdout)."""
    return ["sh", "-c", GATE, "sh", *argv]


# The first line a session shell reads. bash reports a job killed by a signal
# on its own stderr ("bash: line 3: 24 Killed  sleep 1000"), which is the
# command's stderr, and names the wrapper the job ran in: with the signal
# "trapped" it no longer does. SIGKILL cannot really be caught or ignored, so
# nothing the shell starts inherits anything from this. A foreground job
# still gets bash's short word ("Killed"), as in any script.
#
# Then the one function each command is sent through. bash reads a script
# from a pipe one byte per read(2) (it must not consume past the current
# line), so a command's line of a few hundred bytes costs as many system
# calls: about 30 us each under gVisor, where such a line took 6 ms. So a
# command comes as a short call with its length (session_frame), and the
# shell takes the line itself with one ``read -N`` (counting bytes: LC_ALL=C),
# then evaluates it at the top level, as if it had read it as a line: cd,
# export, declare and functions persist as before.
SESSION_SHELL = ("bash", "--noprofile", "--norc")
"""What a session's shell (and an idle one that forks one-shot commands) runs."""

SESSION_PRELUDE = b"trap '' KILL\n__sbx_next() { LC_ALL=C IFS= read -r -N \"$1\" __sbx_line; }\n"

# Signals whose death bash reports for a background job (SIGINT never is):
# a one-shot command forked by an idle shell runs as one, so with these
# trapped nothing about it is printed. Caught signals are reset to their
# defaults in every child, so the command sees none of it. Set once per
# shell (the variable says so): the builtin takes tens of microseconds.
ONESHOT_TRAPS = (
    '[ -n "${__sandboxd_traps-}" ] || { __sandboxd_traps=1; '
    "trap : HUP QUIT ILL TRAP ABRT BUS FPE USR1 SEGV USR2 PIPE ALRM TERM XCPU XFSZ VTALRM PROF SYS; }"
)


def session_frame(line: bytes) -> bytes:
    """What a session shell is sent for ``line`` (a session_command): the
    call that reads it in one go, then the line itself (see SESSION_PRELUDE).
    The line clears its own variable first: eval keeps its own copy."""
    payload = b"unset __sbx_line; " + line
    # Short names: the shell reads this call a byte per system call.
    return f'__sbx_next {len(payload)}&&eval "$__sbx_line"\n'.encode() + payload


def session_command(
    command: str,
    *,
    tag: str,
    marker: str,
    cwd: str,
    env: dict[str, str],
    stdin: bytes,
    clock: bool = False,
) -> bytes:
    """One line for the session shell: runs ``command`` in the shell itself
    (so cd/export persist), with a per-command environment and stdin that do
    not leak into the session, then prints the marker and $? on stdout and
    the marker on stderr so both streams are known to be complete. Its
    stdin follows the line (stdin_frames), which the line reads first. With
    ``clock``, the sandbox's clock (/proc/uptime) and last pid follow $?:
    the next command's Tree.since, as it starts after this one ended."""
    parts: list[str] = []
    if cwd:
        parts.append(f"cd -- {ansi_c_quote(cwd)} && ")
    assigns = " ".join(f"{k}={ansi_c_quote(v)}" for k, v in env.items())
    if stdin:
        parts.insert(0, _READ_STDIN)
        # The array goes before the command runs; its copy in the feeder stays.
        parts.append(f"{EXEC_TAG_VAR}={tag} {assigns} eval {ansi_c_quote('unset __sbx_in; ' + command)}")
        parts.append(_FEED_STDIN)
    else:
        parts.append(f"{EXEC_TAG_VAR}={tag} {assigns} eval {ansi_c_quote(command)}")
        parts.append(" < /dev/null")
    if clock:
        parts.append(
            "; __sandboxd_rc=$?; read -r __sandboxd_up _ 2>/dev/null </proc/uptime; "
            "read -r __sandboxd_pid 2>/dev/null </proc/sys/kernel/ns_last_pid; "
            f'printf \'%s %d %s %s\\n\' {marker} "$__sandboxd_rc" "$__sandboxd_up" "$__sandboxd_pid"; '
            "unset __sandboxd_rc __sandboxd_up __sandboxd_pid"
        )
    else:
        parts.append(f"; printf '%s %d\\n' {marker} $?")
    parts.append(f"; printf '%s\\n' {marker} >&2\n")
    return "".join(parts).encode()


# File transfers resolve their paths without following symbolic links: the
# sandbox owns its files and may have planted `ln -s / r`, and the file API
# promises nothing outside its roots is reached. Any link met as a path
# component (or as the directory itself) is refused with exit LINK_EXIT,
# printing "link:<path>", "target:<its target>" and "resolved:<where the
# chain ends>" (for the message only: never used as a path) on stderr.
#
# Each walk ends pinned: the script cds into the directory one step at a
# time and checks with `pwd -P` (the kernel's own name for where it now is)
# that it landed where it meant to, so a link swapped in between a check and
# the cd is caught, and what follows works relative to that directory. What
# stays is a race inside the pinned directory: a process of the sandbox that
# replaces one of its subdirectories by a link between a `test -L` here and
# tar's or mv's use of the name can redirect that one use. Only the
# sandbox's own processes can run that race, and as the sandbox's user they
# could read or write there anyway; against a transfer as root it can reach
# what root (without capabilities, read-only root filesystem) reaches and
# the sandbox's user does not (files.proto says so).
_LINK_WALK = r"""
refuse_link() {
  printf 'link:%s\n' "$1" >&2
  printf 'target:%s\n' "$(readlink -- "$1" 2>/dev/null)" >&2
  printf 'resolved:%s\n' "$(readlink -f -- "$1" 2>/dev/null)" >&2
  exit 5
}
first_link() {
  fl_p=; fl_rest=${1#/}
  while [ -n "$fl_rest" ]; do
    fl_p="$fl_p/${fl_rest%%/*}"
    case $fl_rest in */*) fl_rest=${fl_rest#*/} ;; *) fl_rest= ;; esac
    [ -L "$fl_p" ] && { printf '%s' "$fl_p"; return 0; }
  done
  return 1
}
pinned() {
  [ "$(pwd -P)" = "$1" ] && return 0
  pn_l=$(first_link "$1") && refuse_link "$pn_l"
  printf 'moved:%s\n' "$1" >&2
  exit 5
}
"""


def tar_create(args: str) -> str:
    """A shell line that writes ``tar -c -f - args`` to stdout. A file
    appended to while tar reads it is stored as tar first found it (the size
    it had, as ``cat`` would read it), and that warning alone is no failure
    (GNU tar exits 1 for it); any other (a file that shrank, padded with
    zeros by tar; one that vanished) still fails with tar's status. The
    warnings are kept in a variable, not a file: /tmp may be full."""
    return (
        f"{{ __sbx_e=$(tar -c -f - {args} 2>&1 >&3 3>&-); __sbx_r=$?; }} 3>&1; "
        '[ -n "$__sbx_e" ] && printf \'%s\\n\' "$__sbx_e" >&2; '
        "if [ $__sbx_r -eq 1 ] && ! printf '%s\\n' \"$__sbx_e\" | grep -qv 'file changed as we read it$'; "
        "then exit 0; fi; exit $__sbx_r\n"
    )


# Tar up $2.. relative to $1, refusing to start when one is missing (exit 3)
# so the caller can name it, or when the way to one passes a link (exit 5).
# tar itself stores a link it meets as a link and does not descend through it.
GET_TAR = (
    _LINK_WALK
    + r"""
base="$1"; shift
if ! cd -P -- "$base" 2>/dev/null; then
  l=$(first_link "$base") && refuse_link "$l"
  printf 'missing:%s\n' "$base" >&2
  exit 3
fi
pinned "$base"
for p in "$@"; do
  case /$p/ in */../*) printf 'missing:%s\n' "$p" >&2; exit 3 ;; esac
  q=.; rest=$p
  while :; do
    case $rest in */*) q="$q/${rest%%/*}"; rest=${rest#*/} ;; *) break ;; esac
    [ -L "$q" ] && refuse_link "$base/${q#./}"
  done
  if [ ! -e "$p" ] && [ ! -L "$p" ]; then printf 'missing:%s\n' "$p" >&2; exit 3; fi
done
"""
    + tar_create('-- "$@"')
)

LINK_EXIT = 5
"""Exit status of PUT_TAR (sandboxd.backends.extract) and GET_TAR when a link stands in the way."""


def link_refusal(message: str) -> str:
    """What a tar script's refusal (exit LINK_EXIT, its stderr in
    ``message``) means, naming the link and where it leads."""
    path = target = resolved = ""
    for line in message.splitlines():
        if line.startswith("link:"):
            path = line[5:]
        elif line.startswith("target:"):
            target = line[7:]
        elif line.startswith("resolved:"):
            resolved = line[9:]
        elif line.startswith("moved:") and not path:
            return f"{line[6:]} changed while it was being resolved (a link swapped in?); not followed"
    root = "/tmp" if path == "/tmp" or path.startswith("/tmp/") else WORKSPACE
    # Where the whole chain ends, as the sandbox saw it; else where the
    # first link points, read as text.
    resolved = resolved or posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if resolved == root or resolved.startswith(root + "/"):
        where = f"file paths do not follow links, even within {root}"
    else:
        where = f"it leads out of {root}, and file paths do not follow links"
    return f"{path} is a symbolic link to {target!r}: {where}"


def get_tar_argv(base: str, paths: tuple[str, ...]) -> list[str]:
    return ["sh", "-c", GET_TAR, "sandboxd-get", base, *paths]
