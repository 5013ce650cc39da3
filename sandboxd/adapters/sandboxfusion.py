"""A SandboxFusion-compatible ``POST /run_code`` endpoint (aiohttp), so the
tools of verl and PipelineRL that speak SandboxFusion run unchanged against
sandboxd. Each request runs in a fresh warm sandbox that is released after.

    sandboxd run-code --target 127.0.0.1:50051 --pool default --port 8080
"""

from __future__ import annotations

import base64
import binascii
import posixpath
from typing import Any

from aiohttp import web

from sandboxd import errors
from sandboxd.client import AsyncClient

# language -> (file name, command). Only what the default image can run.
LANGUAGES: dict[str, tuple[str, str]] = {
    "python": ("main.py", "python3 main.py"),
    "python3": ("main.py", "python3 main.py"),
    "pytest": ("test_main.py", "python3 -m pytest -q test_main.py"),
    "bash": ("main.sh", "bash main.sh"),
}


def _bad(message: str) -> web.Response:
    return web.json_response({"status": "SandboxError", "message": message}, status=400)


def make_app(client: AsyncClient, pool: str, *, acquire_timeout: float = 120.0) -> web.Application:
    async def run_code(request: web.Request) -> web.Response:
        try:
            body: dict[str, Any] = await request.json()
        except ValueError:
            return _bad("request body is not JSON")
        code, language = body.get("code"), body.get("language", "python")
        if not isinstance(code, str):
            return _bad("'code' must be a string")
        if language not in LANGUAGES:
            return _bad(f"unsupported language {language!r}; supported: {', '.join(sorted(LANGUAGES))}")
        try:
            run_timeout = float(body.get("run_timeout") or 10)
        except (TypeError, ValueError):
            return _bad("'run_timeout' must be a number")
        files: dict[str, bytes] = {}
        for name, data in (body.get("files") or {}).items():
            if not isinstance(name, str) or not isinstance(data, str):
                return _bad("'files' maps names to base64 strings")
            try:
                files[name] = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                return _bad(f"file {name!r} is not valid base64")
        fetch = body.get("fetch_files") or []
        if not isinstance(fetch, list) or not all(isinstance(f, str) for f in fetch):
            return _bad("'fetch_files' must be a list of paths")
        stdin = body.get("stdin") or ""
        main, command = LANGUAGES[language]
        try:
            async with client.acquire(pool, timeout=acquire_timeout) as sb:
                await sb.write_files({**files, main: code})
                result = await sb.exec(command, timeout=run_timeout, stdin=stdin)
                fetched: dict[str, str] = {}
                wanted = [f for f in fetch if not posixpath.isabs(f) or f.startswith("/workspace/")]
                if wanted:
                    try:
                        got = await sb.read_files(wanted)
                        fetched = {k: base64.b64encode(v).decode() for k, v in got.items()}
                    except errors.NotFound:
                        for f in wanted:
                            try:
                                fetched[f] = base64.b64encode(await sb.read_file(f)).decode()
                            except errors.NotFound:
                                continue
        except errors.InvalidArgument as e:
            return _bad(e.message)
        except errors.SandboxdError as e:
            return web.json_response({"status": "SandboxError", "message": e.message}, status=500)
        if result.outcome == "TIMED_OUT":
            run_status = "TimeLimitExceeded"
        elif result.outcome in ("EXITED",):
            run_status = "Finished"
        else:
            run_status = "Error"
        return web.json_response(
            {
                "status": "Success" if run_status == "Finished" and result.exit_code == 0 else "Failed",
                "message": result.detail,
                "compile_result": None,
                "run_result": {
                    "status": run_status,
                    "execution_time": result.duration,
                    "return_code": result.exit_code if result.outcome == "EXITED" else None,
                    "stdout": result.stdout.decode(errors="replace"),
                    "stderr": result.stderr.decode(errors="replace"),
                },
                "files": fetched,
            }
        )

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/run_code", run_code)
    return app


async def serve(target: str, pool: str, host: str, port: int, token: str | None = None) -> None:
    import asyncio

    async with AsyncClient(target, token=token) as client:
        runner = web.AppRunner(make_app(client, pool))
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        print(f"SandboxFusion-compatible /run_code on http://{host}:{port} -> sandboxd {target} pool {pool}")
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
