"""A real example rollout workload: a server on the default backend, a pool
of the default image, and GRPO-style groups of rollouts that each write a
solution, run commands in a persistent session, compute a reward by running
tests, read files back, and release."""

from __future__ import annotations

import asyncio
import statistics
import time

from sandboxd.app import build_app
from sandboxd.client import AsyncClient, Sandbox
from sandboxd.settings import DockerBackendSettings, Settings

# Candidate "policy outputs" for the task: some right, some wrong, one broken.
CANDIDATES = [
    "def add(a, b):\n    return a + b\n",
    "def add(a, b):\n    return a - b\n",
    "def add(a, b):\n    return sum([a, b])\n",
    "def add(a, b)\n    return a + b\n",
]

TESTS = """\
from solution import add
cases = [(1, 2, 3), (-1, 1, 0), (10, 5, 15), (0, 0, 0)]
passed = sum(1 for a, b, want in cases if add(a, b) == want)
print(f"{passed}/{len(cases)}")
"""


async def rollout(sb: Sandbox, candidate: str) -> tuple[float, str]:
    """One rollout in ``sb``: the share of tests ``candidate`` passes (0 if it breaks), and why."""
    await sb.write_files({"task/solution.py": candidate, "task/test_add.py": TESTS})
    # A persistent session: cd and export carry over to the next command.
    await sb.exec("cd task && export PYTHONDONTWRITEBYTECODE=1", session="agent")
    listing = await sb.exec("pwd && ls", session="agent")
    result = await sb.exec("python3 test_add.py", session="agent", timeout=20)
    if result.outcome != "EXITED":
        return 0.0, f"{result.outcome} ({result.detail})"
    if result.exit_code != 0:
        return 0.0, "crashed: " + result.stderr.decode(errors="replace").strip().splitlines()[-1]
    passed, total = result.text.strip().split("/")
    echoed = (await sb.read_file("task/solution.py")).decode()
    assert echoed == candidate, "file round trip changed the content"
    assert listing.text.split()[0] == "/workspace/task"
    return int(passed) / int(total), f"{passed}/{total} tests"


async def run_example(settings: Settings, *, groups: int = 2, group_size: int = 4) -> int:
    """Runs the workload on a server of its own, always stopped at the end; returns the exit status."""
    from sandboxd.images.build import ensure_default_image

    image = ensure_default_image() if isinstance(settings.backend, DockerBackendSettings) else "fake"
    settings.server.port = settings.server.port if settings.server.port != 50051 else 0
    app = build_app(settings)
    await app.start()
    print(f"server up on {app.address} ({settings.backend.kind} backend), image {image}")
    exit_code = 0
    try:
        async with AsyncClient(app.address) as client:
            pool_name = "example"
            existing = {p.spec.name for p in await client.list_pools()}
            if pool_name not in existing:
                await client.create_pool(pool_name, image, min_ready=group_size, max_size=group_size * 2)
            for g in range(groups):
                t0 = time.perf_counter()
                async with client.acquire_group(
                    pool_name, n=group_size, labels={"run": "example", "group": str(g)}, timeout=120
                ) as group:
                    acquired = time.perf_counter() - t0
                    outcomes = await asyncio.gather(
                        *(rollout(sb, CANDIDATES[i % len(CANDIDATES)]) for i, sb in enumerate(group))
                    )
                    rewards = [r for r, _ in outcomes]
                    print(f"group {g}: acquired {len(group)} sandboxes in {acquired * 1000:.0f} ms")
                    for sb, (reward, why) in zip(group, outcomes, strict=True):
                        print(f"  {sb.id}: reward {reward:.2f}  ({why})")
                    spread = statistics.pstdev(rewards)
                    print(
                        f"  mean reward {statistics.mean(rewards):.2f}, std {spread:.2f}"
                        + ("  (no learning signal)" if spread == 0 else "")
                    )
                print(f"  released group {g} in {(time.perf_counter() - t0) * 1000:.0f} ms total")
            await client.delete_pool(pool_name, force=True)
            print("pool deleted; example finished")
    except Exception as e:  # show the user what failed, then clean up
        print(f"example failed: {type(e).__name__}: {e}")
        exit_code = 1
    finally:
        await app.stop(grace=5)
    return exit_code
