"""Pre-flight over the image cache: an image neither on the engine nor in
its registry, a registry that cannot be reached, and an image larger than
the cache's budget are reported before the run, without a pull."""

from __future__ import annotations

from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from tests.unit.conftest import MakeApp

REG = "registry.test:5000"
MB = 1 << 20
MISSING, TOO_LARGE = 1, 9


async def test_preflight_reports_missing_and_too_large_images(make_app: MakeApp) -> None:
    backend = FakeBackend(images={"local:1"})
    backend.registry.add(f"{REG}/task-1:v1", 40 * MB)
    backend.registry.add(f"{REG}/huge:v1", 900 * MB)
    app = await make_app(backend=backend, images__cache_bytes=500 * MB)
    async with AsyncClient(app.address) as client:
        ok = await client.preflight(image="local:1", images=[f"{REG}/task-1:v1"], concurrent=1)
        assert ok.ok, ok
        report = await client.preflight(
            image="local:1", images=[f"{REG}/task-1:v1", f"{REG}/gone:v1", f"{REG}/huge:v1"], concurrent=1
        )
        problems = {(p.kind, p.field): p.message for p in report.problems}
        assert set(problems) == {(MISSING, "image"), (TOO_LARGE, "images.cache_bytes")}, report
        assert "gone" in problems[(MISSING, "image")]
        assert "huge" in problems[(TOO_LARGE, "images.cache_bytes")]
        backend.registry.unreachable = True
        unreachable = await client.preflight(image="local:1", images=[f"{REG}/task-2:v1"], concurrent=1)
        [problem] = unreachable.problems
        assert problem.kind == MISSING and "cannot be reached" in problem.message
    # Nothing was pulled: pre-flight only asks.
    assert sum(backend.registry.pulls.values()) == 0
