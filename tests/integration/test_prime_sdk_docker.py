"""The unchanged PyPI ``prime-sandboxes`` SDK, pointed at sandboxd's Prime API
(sandboxd.adapters.prime) by PRIME_API_BASE_URL, against the real engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import prime_sandboxes
import pytest
from aiohttp import web

from sandboxd.adapters.prime import PRIME_SERVER, PrimeSettings, make_app
from sandboxd.client import AsyncClient
from tests.integration.conftest import poll

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]

MAPPED = "python:3.11-slim"  # an image name as Prime environments give it, served by the "it" pool
KEY = "prime-test-key"


@pytest.fixture
async def prime_app(client: AsyncClient, pool: str) -> web.Application:
    settings = PrimeSettings(image_pools={MAPPED: pool}, api_keys=frozenset({KEY}), lease_ttl=10.0)
    return make_app(client, settings)


@pytest.fixture
async def prime_url(
    prime_app: web.Application, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[str]:
    runner = web.AppRunner(prime_app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    # The SDK keeps its config and gateway tokens under ~/.prime.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PRIME_API_BASE_URL", url)
    monkeypatch.setenv("PRIME_API_KEY", KEY)
    monkeypatch.delenv("PRIME_TEAM_ID", raising=False)
    monkeypatch.delenv("PRIME_CONTEXT", raising=False)
    yield url
    await runner.cleanup()


async def test_sdk_lifecycle_commands_and_files(prime_url: str, tmp_path: Path) -> None:
    from prime_sandboxes import AsyncSandboxClient, CommandTimeoutError, CreateSandboxRequest

    sdk = AsyncSandboxClient()
    try:
        sb = await sdk.create(
            CreateSandboxRequest(
                name="env-1",
                docker_image=MAPPED,
                environment_vars={"TASK": "t1"},
                secrets={"TOKEN": "s3cret"},
                labels=["run-7", "grpo"],
            )
        )
        assert sb.status in ("PENDING", "RUNNING")
        await sdk.wait_for_creation(sb.id)
        got = await sdk.get(sb.id)
        assert got.status == "RUNNING" and got.environment_vars == {"TASK": "t1"}, "secrets are not echoed"

        r = await sdk.execute_command(
            sb.id,
            'echo "$TASK $TOKEN $EXTRA"; pwd; id -u; echo err >&2; exit 3',
            working_dir="/tmp",
            env={"EXTRA": "x"},
        )
        uid = (await sdk.execute_command(sb.id, "id -u")).stdout
        assert (r.stdout, r.stderr, r.exit_code) == (f"t1 s3cret x\n/tmp\n{uid}", "err\n", 3)
        assert uid != "1000\n" and int(uid) > 0, "the sandbox's own non-root uid"
        r = await sdk.execute_command(sb.id, "id -u; whoami", user="root")
        assert (r.stdout, r.exit_code) == ("0\nroot\n", 0)
        with pytest.raises(prime_sandboxes.APIError, match="does not exist"):
            await sdk.execute_command(sb.id, "true", user="agent")
        with pytest.raises(CommandTimeoutError):
            await sdk.execute_command(sb.id, "sleep 60 & sleep 61", timeout=1)
        r = await sdk.execute_command(sb.id, "ps -eo args= | grep -c '^sleep 6' || true")
        assert r.stdout.strip() == "0", "the timed-out command's tree, background child too, was killed"

        # upload_file's third argument is a local path; upload_bytes takes content.
        local = tmp_path / "solution.py"
        local.write_text("print(6 * 7)\n")
        up = await sdk.upload_file(sb.id, "/workspace/solution.py", str(local))
        assert up.success and up.size == local.stat().st_size
        await sdk.upload_bytes(sb.id, "/tmp/data.bin", b"\x00\xffbytes", "data.bin")
        r = await sdk.execute_command(sb.id, "python3 solution.py && od -An -tx1 /tmp/data.bin")
        assert r.stdout.split() == ["42", "00", "ff", "62", "79", "74", "65", "73"]
        await sdk.download_file(sb.id, "/tmp/data.bin", str(tmp_path / "out" / "data.bin"))
        assert (tmp_path / "out" / "data.bin").read_bytes() == b"\x00\xffbytes"
        assert (await sdk.read_file(sb.id, "/workspace/solution.py")).content == "print(6 * 7)\n"
        with pytest.raises(prime_sandboxes.SandboxFileNotFoundError):
            await sdk.read_file(sb.id, "/workspace/missing.txt")

        # Background jobs: the SDK builds them on execute_command and read_file.
        job = await sdk.run_background_job(sb.id, "echo started; sleep 1; echo done >&2; exit 4", timeout=60)
        assert (job.completed, job.exit_code, job.stdout, job.stderr) == (True, 4, "started\n", "done\n")

        listed = await sdk.list(labels=["grpo"], exclude_terminated=True)
        assert [s.id for s in listed.sandboxes] == [sb.id]
        statuses = await sdk.get_sandbox_statuses([sb.id])
        assert [s.status.value for s in statuses.statuses] == ["RUNNING"]
        await sdk.delete(sb.id)
        assert (await sdk.get(sb.id)).status == "TERMINATED"
        with pytest.raises(prime_sandboxes.SandboxNotRunningError):
            await sdk.execute_command(sb.id, "true")
        assert not (await sdk.list(labels=["grpo"], exclude_terminated=True)).sandboxes
    finally:
        await sdk.aclose()


async def test_images_map_to_pools_made_on_first_use(prime_url: str, client: AsyncClient, image: str) -> None:
    from prime_sandboxes import AsyncSandboxClient, CreateSandboxRequest, SandboxImagePullError

    sdk = AsyncSandboxClient()
    try:
        request = CreateSandboxRequest(
            name="sized", docker_image=image, cpu_cores=0.5, memory_gb=0.5, labels=["a"]
        )
        first, second = await asyncio.gather(sdk.create(request), sdk.create(request))
        await sdk.bulk_wait_for_creation([first.id, second.id])
        made = [
            p for p in await client.list_pools() if p.spec.image == image and p.spec.name.startswith("prime-")
        ]
        assert len(made) == 1, "one pool per image and size"
        assert made[0].spec.limits.memory_bytes == 512 << 20 and made[0].spec.limits.cpu_millis == 500
        r = await sdk.execute_command(first.id, "cat /sys/fs/cgroup/memory.max 2>/dev/null || echo unknown")
        assert r.stdout.strip() in (str(512 << 20), "unknown")
        deleted = await sdk.bulk_delete(labels=["a"])
        assert sorted(deleted.succeeded) == sorted([first.id, second.id])

        missing = await sdk.create(CreateSandboxRequest(name="nope", docker_image="sandboxd/no-such-image:1"))
        with pytest.raises(SandboxImagePullError):
            await sdk.wait_for_creation(missing.id)
    finally:
        await sdk.aclose()
        for p in await client.list_pools():
            if p.spec.name.startswith("prime-"):
                await client.delete_pool(p.spec.name, force=True)


async def test_refusals_are_explicit(prime_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from prime_sandboxes import APIError, AsyncSandboxClient, CreateSandboxRequest, UnauthorizedError

    sdk = AsyncSandboxClient()
    try:
        with pytest.raises(APIError, match="no network"):
            await sdk.create(
                CreateSandboxRequest(name="n", docker_image=MAPPED, network_allowlist=["pypi.org"])
            )
        with pytest.raises(APIError, match="404"):
            await sdk.get("sbx-unknown")
    finally:
        await sdk.aclose()
    monkeypatch.setenv("PRIME_API_KEY", "wrong")
    sdk = AsyncSandboxClient()
    try:
        with pytest.raises(UnauthorizedError):
            await sdk.list()
    finally:
        await sdk.aclose()


def _sync_session(run: str) -> tuple[str, int, str]:
    """The blocking SandboxClient, as prime-environments' synchronous code uses it."""
    from prime_sandboxes import APIClient, CreateSandboxRequest, SandboxClient

    sdk = SandboxClient(APIClient())
    sb = sdk.create(CreateSandboxRequest(name="sync", docker_image=MAPPED, labels=[run]))
    sdk.wait_for_creation(sb.id)
    r = sdk.execute_command(sb.id, "python3 -c 'print(sum(range(10)))'")
    sdk.delete(sb.id)
    return r.stdout, r.exit_code, sdk.get(sb.id).status


async def test_blocking_client(prime_url: str) -> None:
    stdout, code, status = await asyncio.to_thread(_sync_session, "sync-run")
    assert (stdout, code, status) == ("45\n", 0, "TERMINATED")


async def test_lifetime_ends_the_sandbox_and_its_lease(
    prime_url: str, prime_app: web.Application, client: AsyncClient, pool: str
) -> None:
    from prime_sandboxes import AsyncSandboxClient, CreateSandboxRequest

    sdk = AsyncSandboxClient()
    try:
        sb = await sdk.create(CreateSandboxRequest(name="short", docker_image=MAPPED, timeout_minutes=1))
        await sdk.wait_for_creation(sb.id)
        box = prime_app[PRIME_SERVER]._boxes[sb.id]
        box.ends_at = 0.0  # its minute is up
        await poll(lambda: box.status == "TIMEOUT", timeout=30, what="the lifetime to end the sandbox")
        leased = await client.list_sandboxes(pool, labels={"prime.sandbox": sb.id})
        assert not [s for s in leased if s.lease_id]
        assert (await sdk.get(sb.id)).status == "TIMEOUT"
    finally:
        await sdk.aclose()


async def test_uploads_cannot_touch_a_grader_root_put_there(prime_url: str) -> None:
    from prime_sandboxes import APIError, AsyncSandboxClient, CreateSandboxRequest

    sdk = AsyncSandboxClient()
    try:
        sb = await sdk.create(CreateSandboxRequest(name="graded", docker_image=MAPPED))
        await sdk.wait_for_creation(sb.id)
        grader = (
            "cd /workspace && mkdir tests && printf 'assert 1\\n' > tests/test.py"
            " && chmod 0755 tests && chmod 0644 tests/test.py"
        )
        made = await sdk.execute_command(sb.id, grader, user="root")
        assert made.exit_code == 0, made
        # Small (WriteFiles, from the host where it can) and large (a tar
        # through the sandbox): the same refusal.
        for data in (b"assert True\n", b"#" * (17 << 20)):
            for path in ("/workspace/tests/test.py", "/workspace/tests/conftest.py"):
                with pytest.raises(APIError, match="HTTP 403.*permission denied"):
                    await sdk.upload_bytes(sb.id, path, data, "f.py")
        shown = await sdk.execute_command(
            sb.id,
            "cd /workspace && stat -c '%u %a %s' tests/test.py && ls -A tests"
            " && find / -xdev -name '.sandboxd-put*' 2>/dev/null",
            user="root",
        )
        assert shown.stdout.split() == ["0", "644", "9", "test.py"], shown
        await sdk.delete(sb.id)
    finally:
        await sdk.aclose()
