"""Running commands in a leased sandbox, and what a run gives back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc.aio

from sandboxd.client.rpc import Connection, rpc_errors, translate
from sandboxd.v1 import exec_pb2

OUTCOMES = {
    v.number: v.name.removeprefix("EXEC_OUTCOME_")
    for v in exec_pb2.DESCRIPTOR.enum_types_by_name["ExecOutcome"].values
}
"""ExecOutcome number -> its name without the prefix (EXITED, TIMED_OUT, ...)."""


@dataclass(frozen=True)
class ExecResult:
    """How a command ended, with its output."""

    outcome: str
    """EXITED, TIMED_OUT, KILLED, OUTPUT_TRUNCATED, SANDBOX_LOST, OOM_KILLED, ..."""
    exit_code: int
    """The exit status when EXITED; -1 when the process did not exit by itself."""
    stdout: bytes
    """Standard output, up to the output cap."""
    stderr: bytes
    """Standard error, up to the output cap."""
    duration: float
    """Seconds the command ran."""
    output_truncated: bool = False
    """The output went past its cap and was cut."""
    detail: str = ""
    """Why a command did not exit by itself, in words (empty when EXITED)."""

    @property
    def ok(self) -> bool:
        """The command exited by itself with status 0."""
        return self.outcome == "EXITED" and self.exit_code == 0

    @property
    def text(self) -> str:
        """stdout decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode(errors="replace")

    @classmethod
    def from_proto(
        cls, r: exec_pb2.ExecResult, stdout: bytes | None = None, stderr: bytes | None = None
    ) -> ExecResult:
        """The result a response carries; ``stdout``/``stderr`` replace its output."""
        return cls(
            outcome=OUTCOMES.get(r.outcome, str(r.outcome)),
            exit_code=r.exit_code,
            stdout=r.stdout if stdout is None else stdout,
            stderr=r.stderr if stderr is None else stderr,
            duration=r.duration_seconds,
            output_truncated=r.output_truncated,
            detail=r.detail,
        )


def exec_request(
    sandbox_id: str,
    command: str | Sequence[str],
    *,
    cwd: str = "",
    env: Mapping[str, str] | None = None,
    timeout: float = 0.0,
    stdin: bytes | str = b"",
    output_limit: int = 0,
    session: str = "",
    user: str = "",
) -> exec_pb2.ExecRequest:
    """The request that runs ``command`` (a shell string, or an argv list) in a sandbox."""
    request = exec_pb2.ExecRequest(
        sandbox_id=sandbox_id,
        cwd=cwd,
        env=env or {},
        timeout_seconds=timeout,
        stdin=stdin.encode() if isinstance(stdin, str) else stdin,
        output_limit_bytes=output_limit,
        session=session,
        user=user,
    )
    if isinstance(command, str):
        request.shell = command
    else:
        request.argv.args.extend(command)
    return request


class ExecCalls(Connection):
    """The client's exec calls."""

    async def exec(self, sandbox_id: str, command: str | Sequence[str], **kwargs: Any) -> ExecResult:
        """Runs ``command`` (a shell string, or an argv list run without a
        shell). Keywords: cwd, env, timeout, stdin, output_limit, session,
        user ("" = the sandbox's user; "root" = uid 0 without capabilities)."""
        request = exec_request(sandbox_id, command, **kwargs)
        deadline = request.timeout_seconds + 30.0 if request.timeout_seconds else None
        try:  # rpc_errors() inline: this is the hot path
            response = await self.execs.Exec(request, timeout=deadline, metadata=self.metadata)
        except grpc.aio.AioRpcError as e:
            raise translate(e) from e
        return ExecResult.from_proto(response.result)

    async def exec_stream(
        self, sandbox_id: str, command: str | Sequence[str], **kwargs: Any
    ) -> AsyncIterator[tuple[str, Any]]:
        """Yields ("stdout", bytes), ("stderr", bytes) as output comes, then ("result", ExecResult)."""
        request = exec_request(sandbox_id, command, **kwargs)
        call = self.execs.ExecStream(request, metadata=self.metadata)
        try:
            with rpc_errors():
                async for event in call:
                    kind = event.WhichOneof("event")
                    if kind == "result":
                        yield "result", ExecResult.from_proto(event.result)
                    else:
                        yield kind, getattr(event, kind)
        finally:
            # Leaving early cancels the call; the server then kills the command.
            call.cancel()
