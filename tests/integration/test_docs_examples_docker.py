"""The examples a newcomer copies first run as written, against the real
server and engine: the README's thirty-line rollout and the first rollout of
the client guide. Only the server's address and the image are swapped in."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from sandboxd.app import App

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


def python_block(path: Path, after_heading: str) -> str:
    """The first ```python block below the heading."""
    text = path.read_text()
    start = text.index(after_heading)
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match, f"no python block under {after_heading!r} in {path.name}"
    return match[1]


async def run_example(code: str, app: App, image: str) -> None:
    assert code.count('"127.0.0.1:50051"') == 1
    assert code.rstrip().endswith("asyncio.run(main())")
    code = code.replace('"127.0.0.1:50051"', repr(app.address))
    code = re.sub(r'"sandboxd/rollout:[0-9a-f]+"', repr(image), code)
    code = code.rstrip().removesuffix("asyncio.run(main())")
    namespace: dict[str, object] = {}
    exec(compile(code, "example", "exec"), namespace)
    await namespace["main"]()  # type: ignore[operator]


async def test_readme_example_runs(app: App, image: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = python_block(ROOT / "README.md", "## A rollout in thirty lines")
    assert len(code.splitlines()) <= 30
    await run_example(code, app, image)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == str([1.0 if i == 6 else 0.0 for i in range(8)])
    assert out[1:] == [str(["/tmp", "1"])]


async def test_client_guide_example_runs(app: App, image: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = python_block(ROOT / "docs" / "training" / "client.md", "## A first rollout")
    await run_example(code, app, image)
    out = capsys.readouterr().out.splitlines()
    assert out == [str(["42\n"] * 8), "/tmp", "1", ""]


async def test_cost_and_lifecycle_example_runs(
    app: App, image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = python_block(ROOT / "docs" / "operating" / "cost-and-lifecycle.md", "## Example")
    await run_example(code, app, image)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("trainer idle $") and "/Mtok; waits on " in out[0]
    stages = [line.split()[0] for line in out[1:]]
    assert stages == ["slot_wait", "to_acquire", "acquire", "to_first_command", "rollout", "verifier",
                      "scoring", "queue_wait", "training"]  # fmt: skip
    assert all(line.endswith("n=6") for line in out[1:])


async def test_commands_guide_example_runs(app: App, image: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A fragment (no main): run as the body of a coroutine given a client and a pool "py"."""
    from sandboxd.client import AsyncClient

    code = python_block(ROOT / "docs" / "training" / "exec-and-sessions.md", "# Commands and sessions")
    body = "".join(f"    {line}\n" for line in code.splitlines())
    namespace: dict[str, object] = {}
    exec(compile(f"async def fragment(client):\n{body}", "example", "exec"), namespace)
    async with AsyncClient(app.address) as client:
        await client.create_pool("py", image, min_ready=1, max_size=2)
        await namespace["fragment"](client)  # type: ignore[operator]
        await client.delete_pool("py", force=True)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "EXITED 0 42"
    assert out[2:4] == ["/tmp", "1"]
    kinds = [line.split()[0] for line in out[5:]]
    # Output comes in chunks as it is written (how many is the kernel's and
    # the stream's business), then one result.
    assert kinds[-1] == "result" and set(kinds[:-1]) == {"stdout"}, out


async def test_snapshots_guide_example_runs(app: App, image: str, capsys: pytest.CaptureFixture[str]) -> None:
    from sandboxd.client import AsyncClient

    code = python_block(ROOT / "docs" / "training" / "snapshots.md", "# Snapshots and forks")
    body = "".join(f"    {line}\n" for line in code.splitlines())
    namespace: dict[str, object] = {"asyncio": asyncio}
    exec(compile(f"async def fragment(client):\n{body}", "example", "exec"), namespace)
    async with AsyncClient(app.address) as client:
        await client.create_pool("py", image, min_ready=1, max_size=6)
        await namespace["fragment"](client)  # type: ignore[operator]
        await client.delete_pool("py", force=True)
    assert capsys.readouterr().out.splitlines() == [str([["42", "3"]] * 4)]
