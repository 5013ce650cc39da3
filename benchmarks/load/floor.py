"""The floor: the same episodes with every command a plain process on the host.

No container, no RPC, no engine: a "sandbox" is a directory of its own, a
session is one long-lived ``bash`` per sandbox reading commands on stdin
(as a sandboxd session is a shell in the sandbox), a one-shot command a
fresh ``bash -c``, a file write a file written, a snapshot a tar of the
directory, the release its removal. Think times and concurrency are the
runner's, as for the other drivers; what is left is the cost of the work
itself on this host, which is the floor any sandboxing can only add to.
Commands name the sandbox's working directory as /workspace; here that
prefix is the sandbox's directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.load.episode import ExecOutcome

WORKDIR = "/workspace"


class _Shell:
    """A session: one ``bash`` reading commands, each followed by a marker line with its status."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr: Path) -> None:
        self.proc = proc
        self.stderr = stderr

    @classmethod
    async def start(cls, cwd: Path) -> _Shell:
        proc = await asyncio.create_subprocess_exec(
            "bash", "--noprofile", "--norc",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, cwd=cwd, start_new_session=True,
        )  # fmt: skip
        return cls(proc, cwd / ".session-stderr")

    async def run(self, command: str, timeout: float) -> ExecOutcome:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        marker = f"__floor_{secrets.token_hex(8)}__"
        # The command's stderr goes to a file, its stdout up to the marker is
        # read and dropped; its stdin is not the script's.
        script = f"{{ {command}\n}} </dev/null 2>{self.stderr}; printf '\\n{marker} %d\\n' $?\n"
        self.proc.stdin.write(script.encode())
        await self.proc.stdin.drain()

        async def until_marker() -> int:
            assert self.proc.stdout is not None
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    raise EOFError("the session's shell exited")
                if line.startswith(marker.encode()):
                    return int(line.split()[1])

        code = await asyncio.wait_for(until_marker(), timeout)
        stderr = b""
        if code:
            with contextlib.suppress(OSError):
                stderr = self.stderr.read_bytes()[-2000:]
        return ExecOutcome("EXITED", code, stderr)

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)


@dataclass
class FloorBox:
    path: Path
    shell: _Shell | None = None
    snapshots: list[Path] = field(default_factory=list)


class FloorDriver:
    name = "floor"

    def __init__(self, *, snapshots: bool = False, log: Any = None) -> None:
        self.snapshots = snapshots
        """Only when the sandboxd side takes snapshots too (same work in all drivers)."""
        self._root: Path | None = None
        self._boxes: set[int] = set()
        self._shells: list[_Shell] = []
        self.live = 0
        self._log = log or (lambda msg: None)

    @property
    def root(self) -> Path:
        assert self._root is not None, "setup() first"
        return self._root

    async def setup(self, warm_timeout: float) -> dict[str, Any]:
        self._root = Path(tempfile.mkdtemp(prefix="sandboxd-floor-"))
        return {"warmup_s": 0.0}

    async def teardown(self) -> dict[str, Any]:
        """Removes every directory; live shells and directories left are leaks."""
        alive = [s for s in self._shells if s.proc.returncode is None]
        for s in alive:
            s.kill()
        left = []
        if self._root is not None:
            left = [p.name for p in self._root.iterdir()]
            shutil.rmtree(self._root, ignore_errors=True)
        leftovers = [{"name": n, "status": "directory"} for n in left]
        leftovers += [{"name": str(s.proc.pid), "status": "shell"} for s in alive]
        return {"leaked": len(leftovers), "leftovers": leftovers}

    def _here(self, box: FloorBox, command: str) -> str:
        return command.replace(WORKDIR, str(box.path))

    # -- the Driver protocol ----------------------------------------------------

    async def acquire(self, n: int, labels: Mapping[str, str]) -> Sequence[object]:
        boxes = []
        for _ in range(n):
            path = self.root / f"sb-{secrets.token_hex(6)}"
            path.mkdir()
            boxes.append(FloorBox(path))
        self.live += n
        return boxes

    async def exec(self, box: object, command: str, *, session: bool, timeout: float) -> ExecOutcome:
        assert isinstance(box, FloorBox)
        command = self._here(box, command)
        if session:
            if box.shell is None or box.shell.proc.returncode is not None:
                box.shell = await _Shell.start(box.path)
                self._shells.append(box.shell)
            try:
                return await box.shell.run(command, timeout)
            except TimeoutError:
                box.shell.kill()
                box.shell = None
                return ExecOutcome("TIMED_OUT", -1)
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", command, cwd=box.path, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            _, stderr = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            return ExecOutcome("TIMED_OUT", -1)
        return ExecOutcome("EXITED", int(proc.returncode or 0), stderr or b"")

    async def write(self, box: object, files: Sequence[tuple[str, bytes]]) -> None:
        assert isinstance(box, FloorBox)
        for path, content in files:
            target = box.path / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)

    async def snapshot(self, box: object) -> None:
        assert isinstance(box, FloorBox)
        archive = self.root / f"{box.path.name}-{len(box.snapshots)}.tar"

        def pack() -> None:
            with tarfile.open(archive, "w") as tar:
                tar.add(box.path, arcname=".")

        await asyncio.to_thread(pack)
        box.snapshots.append(archive)

    async def release(self, boxes: Sequence[object]) -> None:
        for box in boxes:
            assert isinstance(box, FloorBox)
            if box.shell is not None:
                box.shell.kill()
                with contextlib.suppress(ProcessLookupError):
                    await box.shell.proc.wait()
                box.shell = None
            shutil.rmtree(box.path, ignore_errors=True)
            for archive in box.snapshots:
                archive.unlink(missing_ok=True)
        self.live -= len(boxes)

    def classify(self, error: BaseException) -> str:
        return f"floor:{type(error).__name__}"

    async def sample(self) -> dict[str, int]:
        return {"live": self.live, "demand": self.live}


__all__ = ["FloorDriver"]
