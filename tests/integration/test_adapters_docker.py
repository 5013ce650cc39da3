"""The SandboxFusion-compatible /run_code endpoint against the real engine."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from sandboxd.adapters.sandboxfusion import ensure_pool, make_app
from sandboxd.client import AsyncClient

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]


@pytest.fixture
async def run_code_url(client: AsyncClient, image: str) -> AsyncIterator[str]:
    from sandboxd.images.build import ImageBuildError
    from sandboxd.images.codejudge import ensure_code_judge_image

    try:
        judge = ensure_code_judge_image(log=lambda _: None)
    except ImageBuildError as e:
        # Never a skip: SandboxFusion runs `python`, which only the code-judge image has.
        pytest.fail(f"the code-judge image does not build (scripts/setup.sh test builds it): {e}")
    await ensure_pool(client, "judge", judge, min_ready=1, max_size=4)
    runner = web.AppRunner(make_app(client, "judge"))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/run_code"
    await runner.cleanup()


async def test_run_code_is_sandboxfusion_compatible(run_code_url: str) -> None:
    async with aiohttp.ClientSession() as http:

        async def call(body: dict[str, object]) -> tuple[int, dict[str, object]]:
            async with http.post(run_code_url, json=body) as r:
                return r.status, await r.json()

        status, ok = await call(
            {
                "code": (
                    "import sys, helper\nprint(helper.X + int(sys.stdin.read()))\n"
                    "open('out.txt','w').write('done')"
                ),
                "language": "python",
                "stdin": "2",
                "files": {"helper.py": base64.b64encode(b"X = 40\n").decode()},
                "fetch_files": ["out.txt"],
            }
        )
        assert status == 200 and ok["status"] == "Success", ok
        run = ok["run_result"]
        assert isinstance(run, dict) and run["stdout"] == "42\n" and run["return_code"] == 0
        assert run["status"] == "Finished"
        assert ok["files"] == {"out.txt": base64.b64encode(b"done").decode()}

        _, failed = await call({"code": "raise SystemExit(3)", "language": "python"})
        assert failed["status"] == "Failed" and failed["run_result"]["return_code"] == 3  # type: ignore[index]

        _, slow = await call({"code": "sleep 30", "language": "bash", "run_timeout": 1})
        assert slow["run_result"]["status"] == "TimeLimitExceeded"  # type: ignore[index]

        status, bad = await call({"code": "x", "language": "cobol"})
        assert status == 422 and bad["detail"][0]["loc"] == ["body", "language"]  # type: ignore[index]
