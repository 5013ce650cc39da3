"""One-shot commands as subshells of a sandbox's idle shells."""

from __future__ import annotations

from dataclasses import replace

from sandboxd.backends.base import WORKSPACE, ExecSpec
from sandboxd.backends.shell import ONESHOT_TRAPS, ansi_c_quote, bash_argv

__all__ = ["in_subshell"]


def in_subshell(spec: ExecSpec) -> ExecSpec:
    """A one-shot exec as a subshell command: its own process, cwd and
    environment, nothing shared with the shell that forks it. The subshell
    execs, so the command's processes carry the exec tag in their environment
    (a bare fork would not). It runs as a background job the shell waits
    for, with the signals trapped: bash reports nothing about it then (a
    foreground job killed by a signal gets "bash: line 3: 24 Killed ( cd --
    ... )" on the command's stderr)."""
    body = (
        "exec " + " ".join(ansi_c_quote(a) for a in spec.argv)
        if spec.argv
        else "exec " + " ".join(ansi_c_quote(a) for a in bash_argv(spec.shell))
    )
    # <&0: a background job's stdin would be /dev/null, not the command's.
    command = (
        f"{ONESHOT_TRAPS}; ( cd -- {ansi_c_quote(spec.cwd or WORKSPACE)} || exit 127; {body} ) <&0 & wait $!"
    )
    return replace(spec, argv=(), shell=command, cwd="", session="")
